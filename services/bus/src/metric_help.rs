//! What each metric this crate records means (its `# HELP` line).

use platform::metric::Metric;

/// The metrics of every consumer, and of the stream's repair.
pub const METRICS: &[Metric] = &[
    Metric::counter(
        "soldonce_consumer_handled_total",
        "Messages a consumer handled and acknowledged, by consumer.",
    ),
    Metric::counter(
        "soldonce_consumer_duplicates_total",
        "Messages a consumer had handled before (found in its inbox), acknowledged and skipped, by consumer.",
    ),
    Metric::counter(
        "soldonce_dead_letters_total",
        "Messages that can never be handled, set aside as dead letters, by consumer.",
    ),
    Metric::counter(
        "soldonce_dead_letters_redriven_total",
        "Dead letters sent again to the consumer that gave up on them (soldonce dead-letters redrive, in its own process).",
    ),
    Metric::counter(
        "soldonce_consumer_batches_split_total",
        "Batches whose transaction failed and whose messages were retried one by one, by consumer.",
    ),
    Metric::gauge(
        "soldonce_consumer_pending",
        "Messages not yet delivered to the consumer (its lag, read from JetStream every 5 s), by consumer.",
    ),
    Metric::gauge(
        "soldonce_consumer_ack_pending",
        "Messages delivered and not yet acknowledged, by consumer.",
    ),
    Metric::histogram(
        "soldonce_consumer_wait_seconds",
        "Time from the stream's PubAck to the handler's start, first deliveries, by consumer.",
    ),
    Metric::histogram(
        "soldonce_consumer_handle_seconds",
        "Time from a message's batch start to its commit, by consumer.",
    ),
    Metric::histogram(
        "soldonce_consumer_transaction_seconds",
        "One recorder's transaction, begin to commit, by consumer.",
    ),
    Metric::histogram(
        "soldonce_consumer_batch_size",
        "Messages per batch taken from the stream, by consumer.",
    ),
    Metric::histogram(
        "soldonce_consumer_transaction_size",
        "Messages recorded per transaction, by consumer.",
    ),
    Metric::counter(
        "soldonce_stream_republished_total",
        "Events put back on the stream from the events table after the stream lost them.",
    ),
];
