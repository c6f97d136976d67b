//! The journal: the books' entries as JSON lines in `<PSP_SIM_DATA_DIR>/ledger.jsonl`. Each
//! entry is written (one `write` of the whole line, no user-space buffer) before the change
//! it records is applied or answered, so killing the process cannot lose an answered change;
//! nothing is fsynced, so a machine crash can. Replayed at start: a last line cut short by a
//! crash mid-write is dropped with a warning, any other bad line stops the start.
//!
//! One process per directory: two simulators sharing one would interleave their entries.

use std::fs::{File, OpenOptions};
use std::io::{self, Read as _, Write as _};
use std::path::{Path, PathBuf};

use super::Entry;

/// The journal's file name inside the data directory.
pub const JOURNAL_FILE: &str = "ledger.jsonl";

/// Why the journal could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    /// The file could not be opened, read or repaired.
    #[error("could not open {}: {source}", path.display())]
    Open {
        /// The journal file.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// A line is not an entry, or does not fit the entries before it.
    #[error("{}:{line}: bad journal entry: {reason}", path.display())]
    Corrupt {
        /// The journal file.
        path: PathBuf,
        /// The line, counting from 1.
        line: usize,
        /// What is wrong with it.
        reason: String,
    },
    /// An entry could not be appended; the books did not change.
    #[error("could not write to {}: {source}", path.display())]
    Write {
        /// The journal file.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
}

/// Entries read from a journal, each with its line number (counting from 1).
pub type Numbered = Vec<(usize, Entry)>;

/// An open journal, appending.
#[derive(Debug)]
pub struct Journal {
    path: PathBuf,
    file: File,
    /// Bytes of whole lines in the file; a failed write is cut back to this.
    len: u64,
    /// A failed write could not be cut back, so the file may end mid-line: refuse to append.
    broken: bool,
}

impl Journal {
    /// Checks that a journal can be kept in `dir`, creating an empty one if there is none;
    /// an existing journal is left as it is.
    pub fn probe(dir: &Path) -> io::Result<()> {
        append_options().open(dir.join(JOURNAL_FILE)).map(drop)
    }

    /// Opens (or creates) the journal in `dir` and reads its entries, each with its line
    /// number. A last line without its newline was cut short: it is dropped from the file.
    pub fn open(dir: &Path) -> Result<(Self, Numbered), JournalError> {
        let path = dir.join(JOURNAL_FILE);
        let open_error = |source| JournalError::Open {
            path: path.clone(),
            source,
        };
        let mut file = append_options()
            .read(true)
            .open(&path)
            .map_err(open_error)?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes).map_err(open_error)?;
        let (entries, whole) = parse(&bytes).map_err(|(line, reason)| JournalError::Corrupt {
            path: path.clone(),
            line,
            reason,
        })?;
        if whole < bytes.len() {
            tracing::warn!(
                path = %path.display(),
                line = bytes[..whole].iter().filter(|b| **b == b'\n').count() + 1,
                dropped_bytes = bytes.len() - whole,
                "the journal's last line was cut short (stopped mid-write); dropping it"
            );
            file.set_len(whole as u64).map_err(open_error)?;
        }
        tracing::debug!(path = %path.display(), entries = entries.len(), "journal read");
        let journal = Self {
            path,
            file,
            len: whole as u64,
            broken: false,
        };
        Ok((journal, entries))
    }

    /// Appends one entry as one line, written through before this returns.
    pub fn append(&mut self, entry: &Entry) -> Result<(), JournalError> {
        let write_error = |source| JournalError::Write {
            path: self.path.clone(),
            source,
        };
        if self.broken {
            return Err(write_error(io::Error::other(
                "an earlier write failed and could not be undone; restart psp-sim",
            )));
        }
        let mut line = serde_json::to_vec(entry).map_err(|e| write_error(io::Error::other(e)))?;
        line.push(b'\n');
        let written = self.file.write_all(&line).and_then(|()| self.file.flush());
        match written {
            Ok(()) => {
                self.len += line.len() as u64;
                Ok(())
            }
            Err(source) => {
                // Cut off any part-written line, so the next entry starts a line of its own.
                if self.file.set_len(self.len).is_err() {
                    self.broken = true;
                }
                Err(JournalError::Write {
                    path: self.path.clone(),
                    source,
                })
            }
        }
    }

    /// The error for a line that parsed but does not fit the books.
    pub fn corrupt(&self, line: usize, reason: String) -> JournalError {
        JournalError::Corrupt {
            path: self.path.clone(),
            line,
            reason,
        }
    }
}

fn append_options() -> OpenOptions {
    let mut options = OpenOptions::new();
    options.create(true).append(true);
    options
}

/// The entries of whole lines (blank ones skipped) and how many bytes those lines take; the
/// error is a line number and what is wrong with that line.
fn parse(bytes: &[u8]) -> Result<(Numbered, usize), (usize, String)> {
    let mut entries = Vec::new();
    let mut whole = 0;
    for (index, line) in bytes.split_inclusive(|b| *b == b'\n').enumerate() {
        let Some(text) = line.strip_suffix(b"\n") else {
            break; // the last line, cut short
        };
        whole += line.len();
        if text.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let entry = serde_json::from_slice(text).map_err(|error| (index + 1, error.to_string()))?;
        entries.push((index + 1, entry));
    }
    Ok((entries, whole))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const SETTLED: &str =
        r#"{"entry":"payment_settled","payment_id":"pay_1","settled_at":"2026-01-01T00:00:00Z"}"#;

    #[test]
    fn whole_lines_are_entries_numbered_from_one_and_blank_lines_are_skipped() {
        let text = format!("{SETTLED}\n\n{SETTLED}\n");
        let (entries, whole) = parse(text.as_bytes()).unwrap();
        let lines: Vec<usize> = entries.iter().map(|(line, _)| *line).collect();
        assert_eq!(lines, [1, 3]);
        assert_eq!(whole, text.len());
    }

    #[test]
    fn a_last_line_without_its_newline_is_left_out() {
        let text = format!("{SETTLED}\n{{\"entry\":\"payment_se");
        let (entries, whole) = parse(text.as_bytes()).unwrap();
        assert_eq!(entries.len(), 1);
        assert_eq!(whole, SETTLED.len() + 1);
    }

    #[test]
    fn a_bad_whole_line_is_an_error_naming_it() {
        let text = format!("{SETTLED}\nnot json\n{SETTLED}\n");
        let (line, _) = parse(text.as_bytes()).unwrap_err();
        assert_eq!(line, 2);
    }

    #[test]
    fn opening_drops_a_cut_short_line_from_the_file_and_appends_after_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(JOURNAL_FILE);
        std::fs::write(&path, format!("{SETTLED}\n{{\"entry\":")).unwrap();

        let (mut journal, entries) = Journal::open(dir.path()).unwrap();
        assert_eq!(entries.len(), 1);
        let entry = entries[0].1.clone();
        journal.append(&entry).unwrap();

        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            format!("{SETTLED}\n{SETTLED}\n")
        );
    }

    #[test]
    fn a_corrupt_line_names_the_file_and_the_line() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(JOURNAL_FILE), "{}\n").unwrap();
        let error = Journal::open(dir.path()).unwrap_err().to_string();
        assert!(
            error.contains("ledger.jsonl:1: bad journal entry"),
            "{error}"
        );
    }
}
