-- Authorize now, capture when the order ships (CAPTURE_AT=shipment).
--
-- `orders.capture` is where an order's payment money is: NULL when the PSP
-- took it at once (automatic capture, every order before this migration),
-- `authorized` (held), `decided` (the capture is owed), `captured`.
ALTER TABLE orders ADD COLUMN capture text
    CHECK (capture IN ('authorized', 'decided', 'captured'));
-- What fulfillment's sweep looks for: authorized orders whose goods left.
CREATE INDEX orders_capture_authorized ON orders (id) WHERE capture = 'authorized';

-- A compensation of an uncaptured authorization is a void, not a refund:
-- the PSP is asked to cancel it with the key `void:<payment_id>`.
ALTER TABLE payments ADD COLUMN refund_method text NOT NULL DEFAULT 'refund'
    CHECK (refund_method IN ('refund', 'void'));

-- A capture is durable work like a compensation: decided with the order's
-- `order.capture_decided` event, carried out by the payment worker with the
-- key `capture:<payment_id>` until the PSP confirms it.
ALTER TABLE payments
    ADD COLUMN capture_state text CHECK (capture_state IN ('pending', 'captured', 'refused')),
    ADD COLUMN capture_attempts integer NOT NULL DEFAULT 0,
    ADD COLUMN capture_next_attempt_at timestamptz,
    ADD COLUMN capture_error text,
    ADD COLUMN capture_decided_at timestamptz,
    ADD COLUMN captured_at timestamptz,
    ADD COLUMN captured_minor bigint,
    ADD CONSTRAINT payments_capture_only_when_attached
        CHECK (capture_state IS NULL OR disposition = 'attached');
CREATE INDEX payments_capture_due ON payments (capture_next_attempt_at) WHERE capture_state = 'pending';
