//! What each metric this crate records means (its `# HELP` line).

use platform::metric::Metric;

/// The metrics the store records, in every service on PostgreSQL.
pub const METRICS: &[Metric] = &[
    Metric::counter(
        "soldonce_postgres_failovers_total",
        "Times the pool moved to a newly promoted PostgreSQL primary.",
    ),
    Metric::counter(
        "soldonce_replication_unconfirmed_total",
        "Commits not confirmed on the synchronous standbys within 2 s, by call site.",
    ),
    Metric::histogram(
        "soldonce_replication_wait_seconds",
        "Waits for a commit to be confirmed on the synchronous standbys, by call site.",
    ),
    Metric::gauge(
        "soldonce_clock_offset_seconds",
        "The database's clock minus this host's; soldonce keeps time by the database's.",
    ),
];
