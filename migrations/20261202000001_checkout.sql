-- soldonce schema, part 1: accounts, catalogue, stock with its ledger, the
-- event store with the orders projection, the outbox and idempotency keys.

CREATE TABLE accounts (
    id          uuid PRIMARY KEY,
    name        text NOT NULL CHECK (length(name) BETWEEN 1 AND 200),
    created_at  timestamptz NOT NULL DEFAULT now()
);

-- Tokens are stored as SHA-256 digests; the clear token is shown once.
CREATE TABLE api_tokens (
    token_sha256 bytea PRIMARY KEY CHECK (length(token_sha256) = 32),
    account_id   uuid NOT NULL REFERENCES accounts (id),
    created_at   timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE products (
    sku          text PRIMARY KEY CHECK (sku ~ '^[A-Za-z0-9._-]{1,64}$'),
    name         text NOT NULL CHECK (length(name) BETWEEN 1 AND 200),
    price_minor  bigint NOT NULL CHECK (price_minor >= 0),
    currency     text NOT NULL CHECK (currency ~ '^[A-Z]{3}$'),
    created_at   timestamptz NOT NULL DEFAULT now()
);

-- Three buckets; every movement also appends a stock_ledger row in the same
-- transaction, so available + reserved + sold = sum of the ledger.
CREATE TABLE stock (
    sku        text PRIMARY KEY REFERENCES products (sku),
    available  bigint NOT NULL DEFAULT 0 CHECK (available >= 0),
    reserved   bigint NOT NULL DEFAULT 0 CHECK (reserved >= 0),
    sold       bigint NOT NULL DEFAULT 0 CHECK (sold >= 0)
);

CREATE TABLE stock_ledger (
    id           bigserial PRIMARY KEY,
    sku          text NOT NULL REFERENCES products (sku),
    movement     text NOT NULL CHECK (movement IN ('receive', 'adjust', 'reserve', 'confirm', 'release')),
    d_available  bigint NOT NULL,
    d_reserved   bigint NOT NULL,
    d_sold       bigint NOT NULL,
    order_id     uuid,
    reason       text,
    recorded_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX stock_ledger_sku ON stock_ledger (sku);
CREATE INDEX stock_ledger_order ON stock_ledger (order_id) WHERE order_id IS NOT NULL;

-- Append-only event store. (stream_id, version) is the optimistic
-- concurrency fence: two writers of one order cannot both append version n.
CREATE TABLE events (
    position     bigserial PRIMARY KEY,
    event_id     uuid NOT NULL UNIQUE,
    stream_id    uuid NOT NULL,
    version      integer NOT NULL CHECK (version >= 1),
    type         text NOT NULL,
    data         jsonb NOT NULL,
    metadata     jsonb NOT NULL DEFAULT '{}',
    recorded_at  timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT events_stream_version UNIQUE (stream_id, version)
);

CREATE FUNCTION events_are_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'events are append-only';
END $$;
CREATE TRIGGER events_append_only BEFORE UPDATE OR DELETE ON events
    FOR EACH ROW EXECUTE FUNCTION events_are_append_only();

-- The orders projection: exactly the fold of each order's events.
CREATE TABLE orders (
    id            uuid PRIMARY KEY,
    account_id    uuid NOT NULL REFERENCES accounts (id),
    state         text NOT NULL CHECK (state IN ('payment_pending', 'confirmed', 'payment_failed', 'cancelled', 'expired', 'refunded')),
    currency      text NOT NULL,
    total_minor   bigint NOT NULL CHECK (total_minor >= 0),
    shipping      jsonb,
    payment_id    text,
    paid_minor    bigint,
    version       integer NOT NULL,
    expires_at    timestamptz NOT NULL,
    created_at    timestamptz NOT NULL,
    updated_at    timestamptz NOT NULL
);
CREATE INDEX orders_account ON orders (account_id, created_at);
CREATE INDEX orders_pending_expiry ON orders (expires_at) WHERE state = 'payment_pending';

CREATE TABLE order_lines (
    order_id          uuid NOT NULL REFERENCES orders (id),
    sku               text NOT NULL REFERENCES products (sku),
    quantity          bigint NOT NULL CHECK (quantity > 0),
    unit_price_minor  bigint NOT NULL CHECK (unit_price_minor >= 0),
    PRIMARY KEY (order_id, sku)
);
CREATE INDEX order_lines_sku ON order_lines (sku);

-- Rows waiting to be published; the id is the event id and the Nats-Msg-Id.
CREATE TABLE outbox (
    id           uuid PRIMARY KEY,
    position     bigserial NOT NULL,
    stream_id    uuid NOT NULL,
    subject      text NOT NULL,
    payload      jsonb NOT NULL,
    headers      jsonb NOT NULL DEFAULT '{}',
    created_at   timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX outbox_position ON outbox (position);

-- Idempotency keys, scoped per account. The stored response is replayed for
-- a retry with the same request fingerprint.
CREATE TABLE idempotency_keys (
    account_id     uuid NOT NULL REFERENCES accounts (id),
    key            text NOT NULL,
    fingerprint    bytea NOT NULL,
    status         smallint NOT NULL,
    response_body  jsonb NOT NULL,
    order_id       uuid,
    created_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (account_id, key)
);
CREATE INDEX idempotency_keys_created ON idempotency_keys (created_at);
