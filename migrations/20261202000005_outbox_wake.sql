-- NOTIFY serialises the commits of every transaction that sends one (it
-- holds a database-wide lock until after commit), which capped checkout at
-- one commit per WAL flush. Wake the relay at most once per 5 ms bucket
-- instead: a sequence (non-transactional, no lock held to commit) remembers
-- the last bucket that notified. A row whose transaction skipped the
-- notification is picked up by the next one or by the relay's short poll.
CREATE SEQUENCE outbox_wake_bucket;

CREATE OR REPLACE FUNCTION outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    bucket bigint := floor(extract(epoch FROM clock_timestamp()) * 200);
BEGIN
    IF (SELECT last_value FROM outbox_wake_bucket) < bucket THEN
        PERFORM setval('outbox_wake_bucket', bucket);
        PERFORM pg_notify('soldonce_outbox', '');
    END IF;
    RETURN NULL;
END $$;
