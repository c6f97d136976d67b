-- soldonce schema, part 2: what the bus needs. The relay is woken by a
-- notification when outbox rows commit; consumers dedupe through the inbox
-- and park messages they can never handle as dead letters.

CREATE INDEX outbox_stream_position ON outbox (stream_id, position);

CREATE FUNCTION outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('soldonce_outbox', '');
    RETURN NULL;
END $$;
CREATE TRIGGER outbox_notify AFTER INSERT ON outbox
    FOR EACH STATEMENT EXECUTE FUNCTION outbox_notify();

-- One row per (consumer, event) handled, written in the same transaction as
-- the handler's effect: a redelivered event finds its row and is skipped.
CREATE TABLE inbox (
    consumer      text NOT NULL,
    event_id      uuid NOT NULL,
    processed_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, event_id)
);
CREATE INDEX inbox_processed ON inbox (processed_at);

CREATE TABLE dead_letters (
    id            bigserial PRIMARY KEY,
    consumer      text NOT NULL,
    stream_seq    bigint,
    subject       text NOT NULL,
    payload       bytea NOT NULL,
    reason        text NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now()
);
