-- Payments on a shared PSP account that soldonce did not make (not its
-- `pay:<order_id>` key, or for no order it holds): reconciliation lists
-- them here and never refunds them.
CREATE TABLE foreign_payments (
    payment_id      text PRIMARY KEY,
    reference       text,
    idempotency_key text,
    status          text NOT NULL,
    amount_minor    bigint NOT NULL,
    currency        text NOT NULL,
    first_seen_at   timestamptz NOT NULL DEFAULT now(),
    last_seen_at    timestamptz NOT NULL DEFAULT now()
);
