//! What each metric this crate records means (its `# HELP` line).

use platform::metric::Metric;

/// The PSP client's and reconciliation's metrics, exported by whichever
/// program runs them (payment-worker).
pub const METRICS: &[Metric] = &[
    Metric::histogram(
        "soldonce_psp_latency_seconds",
        "Duration of calls to the PSP.",
    ),
    Metric::counter(
        "soldonce_psp_timeouts_total",
        "Calls to the PSP that timed out (PSP_TIMEOUT).",
    ),
    Metric::counter(
        "soldonce_psp_retries_total",
        "Calls to the PSP retried, by action.",
    ),
    Metric::counter(
        "soldonce_psp_unknown_resolved_total",
        "Unknown outcomes resolved by asking the PSP by idempotency key.",
    ),
    Metric::counter(
        "soldonce_reconcile_runs_total",
        "Reconciliations with the PSP's payment listing.",
    ),
    Metric::counter(
        "soldonce_reconcile_payments_seen_total",
        "PSP payments reconciliation looked at.",
    ),
    Metric::counter(
        "soldonce_reconcile_repairs_total",
        "Repairs reconciliation made (refunds recorded).",
    ),
    Metric::gauge(
        "soldonce_reconcile_findings",
        "What the last reconciliation found and could not repair: a person must look.",
    ),
    Metric::gauge(
        "soldonce_reconcile_foreign_payments",
        "PSP payments the last reconciliation found that soldonce did not make (a shared account): left alone.",
    ),
    Metric::histogram(
        "soldonce_reconcile_seconds",
        "Duration of a reconciliation.",
    ),
];
