//! Private PostgreSQL and NATS JetStream servers, started from the binaries
//! on PATH into a directory of their own on a free port. Tests use them (and
//! can kill and restart them); `soldonce up` uses them for a local run. A
//! server is stopped when its handle is dropped or, should this process
//! die, when the pipe to its watchdog closes. This crate must never touch
//! the machine's shared services.
//!
//! Layout:
//! - `postgres.rs` — a private PostgreSQL (initdb, start, crash-stop)
//! - `nats.rs` — a private nats-server with JetStream
//! - `process.rs` — child processes and their watchdog

mod nats;
mod postgres;
mod process;

pub use nats::Nats;
pub use postgres::{PgOptions, Postgres};

/// Why a server could not be started.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{binary} was not found on PATH: {hint}")]
    Missing {
        binary: &'static str,
        hint: &'static str,
    },
    #[error("{0}")]
    TooOld(String),
    #[error("{what} failed: {detail}")]
    Failed { what: String, detail: String },
    #[error("io error: {0}")]
    Io(#[from] std::io::Error),
}

/// A port that was free a moment ago on 127.0.0.1.
pub fn free_port() -> Result<u16, Error> {
    let l = std::net::TcpListener::bind(("127.0.0.1", 0))?;
    Ok(l.local_addr()?.port())
}
