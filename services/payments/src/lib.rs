//! payments: soldonce's side of the payment provider, shared by the
//! programs that talk to it (payment-worker, and the `soldonce reconcile`
//! command).
//!
//! - `psp/` — the PSP client: one stable idempotency key per action, only
//!   what is retryable retried, an unknown outcome resolved by asking by key;
//!   `psp/replies.rs` is what the provider answers
//! - `reconcile.rs` — the PSP's listing against soldonce's books: what it
//!   can repair it records, the rest it reports as findings
//! - `metric_help.rs` — what each metric it records means
//!
//! A library: it depends on `domain`, `store` and `platform`, never on a
//! service binary's crate.

mod metric_help;
pub use metric_help::METRICS;
pub mod psp;
pub mod reconcile;
