-- Disputes (chargebacks): the buyer's bank takes money back from a payment.
--
-- `orders.disputes` is the projection of the order's `order.disputed`
-- events: one object per dispute id, in recorded order.
ALTER TABLE orders ADD COLUMN disputes jsonb NOT NULL DEFAULT '[]';

-- A dispute that arrives before the order's shipment shipped holds it:
-- fulfillment never advances a held shipment (it stays pending or picked).
-- Recorded in the webhook's transaction, with the order's and the
-- shipment's rows locked; keyed by order, so there may be a hold before
-- the shipment exists. Released only by a person (`soldonce findings ack
-- ID --release`), never by acknowledging alone.
CREATE TABLE shipment_holds (
    order_id uuid PRIMARY KEY REFERENCES orders (id),
    dispute_id text NOT NULL,
    held_at timestamptz NOT NULL DEFAULT now(),
    released_at timestamptz,
    released_by text,
    CHECK ((released_at IS NULL) = (released_by IS NULL))
);

-- Things a person must look at (a dispute: answer it at the PSP). The audit
-- reports each one until it is acknowledged (`soldonce findings ack`).
CREATE TABLE findings (
    id bigserial PRIMARY KEY,
    kind text NOT NULL CHECK (kind IN ('dispute')),
    order_id uuid REFERENCES orders (id),
    -- What the finding is about, unique per kind (a dispute: its id).
    subject text NOT NULL,
    detail text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    acknowledged_at timestamptz,
    acknowledged_by text,
    note text,
    CONSTRAINT findings_once UNIQUE (kind, subject),
    CHECK ((acknowledged_at IS NULL) = (acknowledged_by IS NULL))
);
CREATE INDEX findings_open ON findings (id) WHERE acknowledged_at IS NULL;
