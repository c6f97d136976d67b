//! What each metric this crate records means (its `# HELP` line).

use platform::metric::Metric;

/// checkout's own metrics.
pub const METRICS: &[Metric] = &[
    Metric::counter(
        "soldonce_refunds_elsewhere_total",
        "refund.succeeded webhooks that completed no compensation, by outcome (held, recorded: a refund soldonce did not make; already_known; ours: an operator refund; not_attached).",
    ),
    Metric::counter(
        "soldonce_operator_cancels_total",
        "Orders operators cancelled through the admin API, by outcome (cancelled, already, refused).",
    ),
    Metric::counter(
        "soldonce_operator_refunds_decided_total",
        "Refunds operators asked for through the admin API and decided (a repeat with the same key counts once).",
    ),
    Metric::counter(
        "soldonce_checkout_requests_total",
        "Placement requests answered, by outcome (placed, out_of_stock, replayed, key_in_flight, key_mismatch, limit, invalid, unavailable, overloaded, error, head_too_large).",
    ),
    Metric::histogram(
        "soldonce_checkout_group_size",
        "Placements committed in one transaction (a coalesced group).",
    ),
    Metric::histogram(
        "soldonce_checkout_group_seconds",
        "Duration of a group's transaction.",
    ),
    Metric::histogram(
        "soldonce_checkout_queue_wait_seconds",
        "A placement's wait for a free lane.",
    ),
    Metric::counter(
        "soldonce_checkout_group_retries_total",
        "Group transactions run again, by reason (stale_stock; bisected: a placement failed in the database and the group was run again without it; isolated: no single culprit, one placement per transaction; deadlock).",
    ),
    Metric::counter(
        "soldonce_checkout_isolated_placements_total",
        "Placements that failed in the database on their own (a constraint, a trigger, a bad row): each answered with an error while the rest of its group committed.",
    ),
    Metric::gauge(
        "soldonce_checkout_queued_placements",
        "Placements waiting in the queue for a free lane.",
    ),
    Metric::counter(
        "soldonce_checkout_queue_deadline_total",
        "Placements answered 503 (overloaded) after waiting CHECKOUT_QUEUE_DEADLINE for a lane, nothing reserved.",
    ),
    Metric::counter(
        "soldonce_token_lookups_total",
        "Bearer token checks, by outcome (found, unknown, cached_unknown, malformed, limited; not_issued: refused from memory, never looked up).",
    ),
    Metric::gauge(
        "soldonce_token_set_size",
        "Issued token digests held in memory (revoked ones stay until a restart).",
    ),
    Metric::counter(
        "soldonce_token_set_reads_total",
        "Reads of issued tokens into memory, by outcome (ok, error): the full read at start, then one per batch of tokens not held.",
    ),
    Metric::counter(
        "soldonce_token_set_fallbacks_total",
        "Token checks the in-memory set could not answer (not read yet, or its read failed or was late), looked up within TOKEN_LOOKUP_RATE instead.",
    ),
    Metric::counter(
        "soldonce_rate_limited_total",
        "Requests refused with 429, by limit (account, token_lookup).",
    ),
    Metric::counter(
        "soldonce_limit_refusals_total",
        "Placements refused by a flash-sale or account limit, by limit (max_per_order, per_account, reserved_units).",
    ),
    Metric::counter(
        "soldonce_cancellations_total",
        "Orders cancelled by their buyer.",
    ),
    Metric::counter(
        "soldonce_webhooks_total",
        "PSP webhooks received, by outcome (confirmed, refund_decided, declined, applied, unknown_status, awaiting_action, duplicate, busy, dispute; mismatch: a status its type cannot carry, refused with 400).",
    ),
    Metric::counter(
        "soldonce_disputes_total",
        "Disputes (chargebacks) reported by the PSP, by outcome (held: recorded and the shipment held; recorded: the goods had left; already_known; foreign: a payment soldonce does not hold).",
    ),
    Metric::counter(
        "soldonce_webhooks_rejected_total",
        "PSP webhooks refused as not authentic (401), by reason.",
    ),
    Metric::counter(
        "soldonce_webhook_looks_total",
        "Looks whether a webhook's payment is recorded.",
    ),
    Metric::counter(
        "soldonce_webhook_look_statements_total",
        "Statements that answered those looks (under load many looks share one).",
    ),
];
