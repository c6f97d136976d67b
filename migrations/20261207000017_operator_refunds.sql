-- Refunds an operator asks for (`soldonce order refund`, checkout's admin
-- API): part or all of what a confirmed order's payment took, once per key.
-- Decided with the order's `order.operator_refund_decided` event, carried
-- out by the payment worker with `Idempotency-Key: refund:<payment_id>:<key>`
-- until the PSP confirms it (`order.operator_refunded`).
ALTER TABLE orders ADD COLUMN operator_refunds jsonb NOT NULL DEFAULT '[]';

CREATE TABLE operator_refunds (
    order_id         uuid NOT NULL,
    key              text NOT NULL CHECK (length(key) BETWEEN 1 AND 128),
    payment_id       text NOT NULL,
    amount_minor     bigint NOT NULL CHECK (amount_minor > 0),
    currency         text NOT NULL,
    requested_by     text NOT NULL,
    state            text NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'succeeded', 'refused')),
    refund_id        text,
    attempts         integer NOT NULL DEFAULT 0,
    next_attempt_at  timestamptz,
    last_error       text,
    requested_at     timestamptz NOT NULL DEFAULT now(),
    refunded_at      timestamptz,
    PRIMARY KEY (order_id, key)
);
CREATE INDEX operator_refunds_due ON operator_refunds (next_attempt_at) WHERE state = 'pending';
