//! The consumer side of the contract: what a consumer runtime needs from
//! wherever its handlers' effects are stored. A delivered event is handled
//! at most once per consumer because its inbox row `(consumer, event id)`
//! is written in the same transaction as the handler's effect; a message
//! that can never be handled is kept as a dead letter. Only the shape lives
//! here (no IO): `store` implements it over PostgreSQL, `bus` drives it.

use std::future::Future;
use uuid::Uuid;

/// A message a consumer can never handle, kept for an operator to read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetter {
    /// The consumer that gave up on it.
    pub consumer: String,
    /// Where the message sits in the stream.
    pub stream_seq: u64,
    /// The subject it travelled on.
    pub subject: String,
    /// The message exactly as delivered (it may not even be JSON).
    pub payload: Vec<u8>,
    /// Why it can never be handled.
    pub reason: String,
}

/// Inbox dedupe and dead letters, as a consumer runtime uses them.
pub trait Inbox: Send + Sync + 'static {
    /// The transaction a handler's effect commits in, the inbox row with it.
    type Tx: Send;
    /// Why the inbox could not be read or written (always worth a retry).
    type Error: std::error::Error + Send + Sync + 'static;

    /// Which of `event_ids` `consumer` has already committed the effect
    /// of: a cheap check before the handler's work (the inbox rows in
    /// [`Inbox::begin`] are what make it exact).
    fn seen(
        &self,
        consumer: &str,
        event_ids: &[Uuid],
    ) -> impl Future<Output = Result<Vec<bool>, Self::Error>> + Send;

    /// Begins one transaction for the effects of `event_ids`, their inbox
    /// rows already written; says which are fresh (`false`: another
    /// delivery of that event committed first, so it must have no effect).
    fn begin(
        &self,
        consumer: &str,
        event_ids: &[Uuid],
    ) -> impl Future<Output = Result<(Self::Tx, Vec<bool>), Self::Error>> + Send;

    /// Commits a transaction [`Inbox::begin`] opened.
    fn commit(&self, tx: Self::Tx) -> impl Future<Output = Result<(), Self::Error>> + Send;

    /// Keeps a message that can never be handled; only once this succeeds
    /// may the message be dropped from the stream.
    fn dead_letter(
        &self,
        letter: &DeadLetter,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send;
}
