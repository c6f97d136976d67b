//! A build's service binaries: a directory holding checkout, outbox-relay,
//! payment-worker, fulfillment, psp-sim and expiry, and the build's own
//! `soldonce`, which migrates the bench's database to that build's schema
//! (`cargo build --release`'s target directory, or a copy of it set aside
//! for a before/after comparison). A directory missing one is bad input,
//! said in one line before anything starts.

use crate::CliError;
use anyhow::Context;
use serde::Serialize;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// The service binaries a bin dir must hold.
pub const SERVICES: [&str; 6] = [
    "checkout",
    "outbox-relay",
    "payment-worker",
    "fulfillment",
    "psp-sim",
    "expiry",
];

/// The build's CLI: its `soldonce migrate` gives the database the schema
/// its services were built for (a comparison across a migration runs each
/// build on its own schema).
pub const MIGRATOR: &str = "soldonce";

/// A checked directory of one build's service binaries.
#[derive(Debug, Clone, Serialize)]
pub struct BinDir {
    pub path: PathBuf,
    /// When its checkout binary was last written (which build it is, roughly).
    pub built: Option<String>,
}

impl BinDir {
    /// The directory this `soldonce` is in (`cargo build` puts the services beside it).
    pub fn beside_soldonce() -> Result<BinDir, CliError> {
        let exe = std::env::current_exe().context("locating the soldonce binary")?;
        let dir = exe.parent().context("the soldonce binary's directory")?;
        BinDir::check("--bin-dir", dir)
    }

    /// `dir`, if it holds every service binary; else a usage error naming
    /// `flag`, the directory and the first binary missing.
    pub fn check(flag: &str, dir: &Path) -> Result<BinDir, CliError> {
        if !dir.is_dir() {
            return Err(CliError::Usage(format!(
                "{flag} {}: no such directory",
                dir.display()
            )));
        }
        for name in SERVICES.into_iter().chain([MIGRATOR]) {
            let binary = dir.join(name);
            let executable = std::fs::metadata(&binary)
                .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0);
            if !executable {
                return Err(CliError::Usage(format!(
                    "{flag} {}: no {name} there (a bin dir holds one build's {} and its {MIGRATOR})",
                    dir.display(),
                    SERVICES.join(", ")
                )));
            }
        }
        let path = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
        let built = std::fs::metadata(path.join("checkout"))
            .and_then(|m| m.modified())
            .ok()
            .map(|t| {
                chrono::DateTime::<chrono::Utc>::from(t)
                    .format("%Y-%m-%d %H:%M UTC")
                    .to_string()
            });
        Ok(BinDir { path, built })
    }

    /// The path of one of its binaries.
    pub fn binary(&self, name: &str) -> PathBuf {
        self.path.join(name)
    }

    /// One line for a report.
    pub fn describe(&self) -> String {
        match &self.built {
            Some(t) => format!("{} (checkout built {t})", self.path.display()),
            None => self.path.display().to_string(),
        }
    }
}
