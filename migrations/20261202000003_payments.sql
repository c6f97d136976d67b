-- soldonce schema, part 3: payments. A webhook's id is recorded in the same
-- transaction as its effect, so a repeat is a no-op.
CREATE TABLE webhook_receipts (
    webhook_id   text PRIMARY KEY,
    event_type   text NOT NULL,
    order_id     uuid,
    received_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX webhook_receipts_received ON webhook_receipts (received_at);
