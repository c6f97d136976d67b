-- Outbox rows the relay can never publish (larger than the server's
-- max_payload, a subject no stream takes, a message JetStream refuses for
-- itself) are moved here, in the transaction that claimed them, with a
-- short reason (`too_large`, `bad_subject`, `rejected`), so they never hold
-- up the rows behind them. Nothing reads this table but people and the
-- audit: see the README's runbook ("Parked outbox rows") for what to do.
CREATE TABLE outbox_parked (
    id           uuid PRIMARY KEY,
    position     bigint NOT NULL,
    stream_id    uuid NOT NULL,
    subject      text NOT NULL,
    payload      jsonb NOT NULL,
    headers      jsonb NOT NULL DEFAULT '{}',
    created_at   timestamptz NOT NULL,
    reason       text NOT NULL,
    parked_at    timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX outbox_parked_stream ON outbox_parked (stream_id, position);
