//! What each metric this crate records means (its `# HELP` line).

use platform::metric::Metric;

/// expiry's own metrics: releases, purges and the periodic audit.
pub const METRICS: &[Metric] = &[
    Metric::counter(
        "soldonce_expirations_total",
        "Orders expired and their reservations released.",
    ),
    Metric::counter("soldonce_expiry_runs_total", "Passes of the expiry loop."),
    Metric::gauge(
        "soldonce_expiry_released_last_run",
        "Orders released by the last pass.",
    ),
    Metric::counter(
        "soldonce_expiry_set_aside_total",
        "Overdue orders that could not be released, set aside and left out of later batches.",
    ),
    Metric::gauge("soldonce_expiry_set_aside", "Overdue orders set aside now."),
    Metric::gauge(
        "soldonce_oldest_pending_reservation_seconds",
        "Age of the oldest reservation still waiting for payment.",
    ),
    Metric::counter(
        "soldonce_purged_rows_total",
        "Idempotency keys, inbox rows and webhook receipts purged past RETENTION.",
    ),
    Metric::gauge(
        "soldonce_audit_violations",
        "Violations the last periodic audit found (0: every invariant holds).",
    ),
    Metric::histogram(
        "soldonce_audit_seconds",
        "Duration of periodic audits, by kind (full, incremental).",
    ),
    Metric::counter(
        "soldonce_audit_runs_total",
        "Periodic audits run, by kind (full, incremental).",
    ),
];
