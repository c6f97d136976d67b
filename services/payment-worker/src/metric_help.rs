//! What each metric this crate records means (its `# HELP` line).

use platform::metric::Metric;

/// The payment worker's own metrics: PSP calls, money, refunds, reconciliation.
pub const METRICS: &[Metric] = &[
    Metric::counter(
        "soldonce_operator_refunds_total",
        "Refunds operators asked for, asked of the PSP, by outcome (refunded, voided: a cancelled order's authorization, postponed, refused).",
    ),
    Metric::gauge(
        "soldonce_operator_refunds_outstanding",
        "Operator refunds decided and not yet confirmed by the PSP, refused ones included.",
    ),
    Metric::gauge(
        "soldonce_operator_refunds_oldest_seconds",
        "Age of the oldest operator refund outstanding.",
    ),
    Metric::counter(
        "soldonce_captures_total",
        "Captures asked of the PSP (an authorized order shipped), by outcome (captured, postponed, refused).",
    ),
    Metric::gauge(
        "soldonce_captures_outstanding",
        "Captures decided and not yet confirmed by the PSP, refused ones included.",
    ),
    Metric::gauge(
        "soldonce_captures_oldest_seconds",
        "Age of the oldest capture outstanding, from its decision.",
    ),
    Metric::gauge(
        "soldonce_authorizations_oldest_seconds",
        "Age of the oldest authorization not yet captured (its order confirmed, not shipped); authorizations lapse, typically after 7 days.",
    ),
    Metric::counter(
        "soldonce_payments_captured_minor_total",
        "Money captured for shipped orders, in minor units of the currency, by currency (ISO 4217).",
    ),
    Metric::counter(
        "soldonce_payments_awaiting_action_total",
        "Charges answered requires_action (3-D Secure): the buyer must act before the order settles.",
    ),
    Metric::counter(
        "soldonce_psp_outcome_unknown_total",
        "Charges whose outcome could not be learnt for now (asked again by key, never charged anew).",
    ),
    Metric::counter(
        "soldonce_payments_authorized_minor_total",
        "Money authorized for confirmed orders, in minor units of the currency, by currency (ISO 4217).",
    ),
    Metric::counter(
        "soldonce_free_orders_confirmed_total",
        "Orders of price 0 confirmed without a PSP call.",
    ),
    Metric::counter(
        "soldonce_compensations_recorded_total",
        "Refunds decided (a payment that cannot settle its order), by reason and by who learnt of it.",
    ),
    Metric::counter(
        "soldonce_compensations_total",
        "Attempts to carry out a decided refund, by kind and outcome (refunded, postponed, refused).",
    ),
    Metric::gauge(
        "soldonce_compensations_outstanding",
        "Refunds decided and not yet confirmed by the PSP.",
    ),
    Metric::gauge(
        "soldonce_compensations_oldest_seconds",
        "Age of the oldest refund owed.",
    ),
];
