//! What each metric this crate records means (its `# HELP` line).

use platform::metric::Metric;

/// The relay's own metrics.
pub const METRICS: &[Metric] = &[
    Metric::gauge(
        "soldonce_outbox_backlog",
        "Events waiting in the outbox to be published.",
    ),
    Metric::gauge(
        "soldonce_outbox_oldest_unpublished_seconds",
        "Age of the oldest outbox row (the events of one writing statement) waiting to be published.",
    ),
    Metric::histogram(
        "soldonce_outbox_commit_to_puback_seconds",
        "Time from an event's commit (or its transaction's start) to the stream's PubAck.",
    ),
    Metric::histogram(
        "soldonce_outbox_commit_to_claim_seconds",
        "Time from an event's commit (or its transaction's start) to the relay claiming its row.",
    ),
    Metric::counter(
        "soldonce_outbox_published_total",
        "Events published to the stream and acknowledged.",
    ),
    Metric::counter(
        "soldonce_outbox_duplicates_total",
        "Publishes the stream dropped as duplicates (already published).",
    ),
    Metric::counter(
        "soldonce_outbox_claims_total",
        "Claims (each a transaction locking outbox rows), by whether they found rows (found=rows) or nothing (found=none).",
    ),
    Metric::counter(
        "soldonce_outbox_looks_total",
        "Single-statement looks for outbox rows made before a claim when no notification came (a lane holding the wake-up, a poll), by whether they saw rows (found=rows, a claim follows) or nothing (found=none, no claim).",
    ),
    Metric::counter(
        "soldonce_outbox_publish_errors_total",
        "Relay passes that failed and are retried.",
    ),
    Metric::counter(
        "soldonce_outbox_parked_total",
        "Outbox rows that can never be published, set aside in outbox_parked, by reason.",
    ),
    Metric::gauge("soldonce_outbox_parked", "Rows in outbox_parked now."),
    Metric::counter(
        "soldonce_outbox_vacuums_total",
        "Vacuums of the outbox table the relay ran.",
    ),
    Metric::histogram(
        "soldonce_outbox_vacuum_seconds",
        "Duration of the relay's vacuums of the outbox table.",
    ),
    Metric::counter(
        "soldonce_stream_losses_detected_total",
        "Times the relay saw the stream go back (it lost acknowledged messages).",
    ),
];
