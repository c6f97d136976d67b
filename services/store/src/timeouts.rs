//! How long each service's statements may wait for a lock and run, set
//! on every connection it opens (server settings, as `PGOPTIONS` would).
//!
//! Without them a statement blocked on a row that a stuck connection holds
//! (a backend whose client hung mid-transaction, a forgotten `psql`
//! session) waits for ever: a buyer's request until its client gives up, a
//! consumer's recorder while its messages are redelivered again and again.
//! With them the statement fails, the transaction rolls back, and the
//! caller does what it does with any passing failure: checkout answers
//! `503` with `Retry-After` (the client retries with the same key), a
//! consumer retries the message later and dead-letters it after its
//! bounded attempts, expiry tries again next run. A transaction left idle
//! is ended by the server, so its locks are freed.
//!
//! The figures sit far above what any statement takes under load (the
//! longest, a placement group's write, takes milliseconds), so they only
//! end waits that would otherwise never end. Expiry has no statement limit:
//! it runs the periodic audit, whose statements read whole tables.

/// A buyer waits on checkout's statements.
pub const CHECKOUT: &[(&str, &str)] = &[
    ("lock_timeout", "5s"),
    ("statement_timeout", "15s"),
    ("idle_in_transaction_session_timeout", "60s"),
];

/// The relay, the payment worker and fulfillment: messages wait on them.
pub const WORKER: &[(&str, &str)] = &[
    ("lock_timeout", "10s"),
    ("statement_timeout", "30s"),
    ("idle_in_transaction_session_timeout", "60s"),
];

/// Expiry: its audit reads whole tables, so only locks and idle transactions are bounded.
pub const EXPIRY: &[(&str, &str)] = &[
    ("lock_timeout", "10s"),
    ("idle_in_transaction_session_timeout", "60s"),
];

/// Whether a database error's SQLSTATE is one of these limits ending a
/// statement: `lock_not_available` (55P03, `lock_timeout`) or
/// `query_canceled` (57014, `statement_timeout`).
pub fn timed_out(code: Option<&str>) -> bool {
    matches!(code, Some("55P03" | "57014"))
}
