//! The consumer runtime: a durable pull consumer with explicit acks,
//! bounded redelivery with backoff, inbox dedupe `(consumer, event id)` in
//! the same transaction as the handler's effect, and dead letters (a record
//! plus a metric) for what can never be handled — an invalid envelope, an
//! unknown type or version, or a message out of deliveries.
//!
//! Messages are taken in batches: whatever the pull has buffered, up to
//! `batch_size`. A handler [`Handler::prepare_all`]s the messages of a
//! batch at once (its calls out, e.g. to the PSP, concurrent), and each
//! message goes on to be recorded as soon as it is prepared. The messages
//! prepared by every batch in hand meet at the consumer's recorders
//! (`recorders` of them, each one transaction at a time): a recorder takes
//! everything waiting, up to `batch_size`, and [`Handler::record`]s it in
//! one transaction with its inbox rows. So a message waits for its own
//! preparation and at most the transaction before it, never for the
//! slowest call of its batch, and however many batches are in hand, the
//! consumer has at most `recorders` transactions open: under load they grow
//! instead of multiplying (a hot SKU's row is moved once per transaction).
//! A message is never recorded ahead of an earlier message of its batch
//! about the same subject (its order): it waits until that one is
//! committed. Acks follow the commit. If a transaction fails, each of its
//! messages is recorded again on its own, so a message that fails alone is
//! retried (or dead-lettered) alone and never poisons the others. Where the
//! inbox and the dead letters are kept is the [`Inbox`](events::Inbox)'s business, never
//! this module's. Two stages of the saga's latency budget are measured
//! here, per consumer: `soldonce_consumer_wait_seconds` (the stream's
//! PubAck to the handler's start, first deliveries only) and
//! `soldonce_consumer_handle_seconds` (a message's batch start to its
//! commit), of which `soldonce_consumer_transaction_seconds` is the
//! recorder's transaction (begin to commit); a transaction's size is
//! `soldonce_consumer_transaction_size`.
//!
//! Its parts:
//! - `handler.rs` — what a consuming service implements, and its spec
//! - `pull.rs` — the durable consumer, the pull and its batches, the lag
//! - `record.rs` — preparing a batch and recording it in transactions
//! - `settle.rs` — acking, retrying or dead-lettering each message

mod handler;
mod pull;
mod record;
mod settle;

pub use handler::{message_span, Batching, ConsumerSpec, Delivery, HandleError, Handler, Tx};
pub use pull::{ensure_consumer, run};
