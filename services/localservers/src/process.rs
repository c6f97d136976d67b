//! Running a server under a watchdog shell: the shell starts the server,
//! then waits on its stdin, which is a pipe from this process. Whether this
//! process drops the handle or dies, the pipe closes and the shell stops the
//! server, so no server outlives its owner. A line written to the pipe names
//! another signal to stop it with (a crash instead of a clean stop).

use crate::Error;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

/// A running server under its watchdog.
pub(crate) struct Watched {
    child: Child,
    stdin: Option<ChildStdin>,
}

impl Watched {
    /// Starts `argv` (run as `user` when given) with its output appended to `log`.
    pub(crate) fn spawn(
        argv: &[String],
        user: Option<&str>,
        log: &Path,
        stop_signal: &str,
    ) -> Result<Self, Error> {
        let quoted: Vec<String> = argv.iter().map(|a| shell_quote(a)).collect();
        let script = format!(
            "{cmd} >>{log} 2>&1 </dev/null & pid=$!; read sig; kill -${{sig:-{sig}}} $pid 2>/dev/null; wait $pid",
            cmd = quoted.join(" "),
            log = shell_quote(&log.to_string_lossy()),
            sig = stop_signal,
        );
        let mut command = match user {
            Some(u) => {
                let mut c = Command::new("runuser");
                c.args(["-u", u, "--", "sh", "-c", &script]);
                c
            }
            None => {
                let mut c = Command::new("sh");
                c.args(["-c", &script]);
                c
            }
        };
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        let stdin = child.stdin.take();
        Ok(Watched { child, stdin })
    }

    /// Stops the server and waits for it to exit.
    pub(crate) fn stop(&mut self) {
        drop(self.stdin.take());
        let _ = self.child.wait();
    }

    /// Stops the server with `signal` (such as `KILL`) and waits for it to exit.
    pub(crate) fn stop_with(&mut self, signal: &str) {
        use std::io::Write;
        if let Some(mut stdin) = self.stdin.take() {
            let _ = writeln!(stdin, "{signal}");
        }
        let _ = self.child.wait();
    }
}

impl Drop for Watched {
    fn drop(&mut self) {
        self.stop();
    }
}

fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// Finds `binary` on PATH.
pub(crate) fn which(binary: &'static str, hint: &'static str) -> Result<PathBuf, Error> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|dir| dir.join(binary))
        .find(|p| p.is_file())
        .ok_or(Error::Missing { binary, hint })
}

/// How a server's start ended, as its log tells.
pub(crate) enum Started {
    Ready,
    /// Another process holds the port (picked as free, then taken first).
    PortTaken,
}

/// Waits on what this start adds to `log` (from `offset`): the log, not the
/// port, tells when a server is ready (a port taken by someone else would
/// accept connections for it), and that it gave up (its watchdog outlives
/// it). `taken` marks a taken port; `failed`, any other failure.
pub(crate) fn await_start(
    what: &str,
    log: &Path,
    offset: usize,
    within: Duration,
    ready: impl Fn(&str) -> bool,
    taken: &str,
    failed: &str,
) -> Result<Started, Error> {
    let deadline = Instant::now() + within;
    loop {
        let bytes = std::fs::read(log).unwrap_or_default();
        let text = String::from_utf8_lossy(bytes.get(offset..).unwrap_or_default());
        if text.contains(taken) {
            return Ok(Started::PortTaken);
        }
        if ready(&text) {
            return Ok(Started::Ready);
        }
        if text.contains(failed) || Instant::now() > deadline {
            let tail: Vec<&str> = text.lines().rev().take(5).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            return Err(Error::Failed {
                what: format!("starting {what}"),
                detail: if tail.is_empty() {
                    format!("not ready within {} s", within.as_secs())
                } else {
                    tail.join(" | ")
                },
            });
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Runs a command to completion, returning its stdout.
pub(crate) fn run(mut command: Command, what: &str) -> Result<String, Error> {
    let out = command.output()?;
    if !out.status.success() {
        return Err(Error::Failed {
            what: what.to_owned(),
            detail: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}
