//! What each metric this crate records means (its `# HELP` line).

use platform::metric::Metric;

/// fulfillment's own metrics.
pub const METRICS: &[Metric] = &[
    Metric::counter(
        "soldonce_shipments_created_total",
        "Shipments created for confirmed orders.",
    ),
    Metric::counter(
        "soldonce_shipment_steps_total",
        "Steps shipments advanced through the warehouse.",
    ),
    Metric::counter(
        "soldonce_warehouse_looks_total",
        "Looks of the warehouse loop for due shipments (each a transaction): when the next one falls due, at most one a second when nothing is open.",
    ),
    Metric::counter(
        "soldonce_captures_decided_total",
        "Captures decided because an order confirmed on an authorization shipped.",
    ),
    Metric::gauge(
        "soldonce_findings_open",
        "Findings not acknowledged, by kind (dispute): each waits for a person (soldonce findings list).",
    ),
    Metric::gauge(
        "soldonce_shipments_held",
        "Shipments a dispute holds (not shipped until a person releases them).",
    ),
];
