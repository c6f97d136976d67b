//! One command for operators: deployment files that match the binaries,
//! clear configuration errors and a reference table that matches them,
//! described metrics and logs that name their service, graceful shutdown,
//! readiness that names the dependency that is down, the local run with its
//! demo, and the flash-sale bench.

mod alerts;
mod bench;
mod catalog;
mod compose;
mod console;
mod failover;
mod lifecycle;
mod pool;
mod psp_books;
mod readiness;
mod reference;
mod signals;
mod tls;
mod trace;
mod upgrade;
