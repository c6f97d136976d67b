-- soldonce schema, part 4: one shipment per confirmed order, advanced through
-- a simulated warehouse; its events live in its own stream in `events`.
CREATE TABLE shipments (
    id          uuid PRIMARY KEY,
    order_id    uuid NOT NULL UNIQUE REFERENCES orders (id),
    state       text NOT NULL CHECK (state IN ('pending', 'picked', 'shipped', 'delivered')),
    version     integer NOT NULL,
    created_at  timestamptz NOT NULL,
    updated_at  timestamptz NOT NULL
);
CREATE INDEX shipments_open ON shipments (updated_at) WHERE state <> 'delivered';
