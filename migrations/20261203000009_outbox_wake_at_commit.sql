-- Decide the relay's wake-up when a transaction commits, not when it
-- inserts its outbox rows. The statement trigger ran at INSERT time: a
-- transaction that wrote its outbox rows and then waited (on a hot stock
-- row, say, which the write path takes last) claimed the 5 ms bucket, and
-- its notification left only at its commit, tens of milliseconds later;
-- transactions of the same bucket that committed meanwhile sent none, and
-- their rows waited for that late notification or the relay's poll.
-- A deferred constraint trigger runs just before commit, after every wait,
-- so the transaction that claims a bucket is one about to commit. It runs
-- once per row: a transaction-local setting makes every row after its
-- transaction's first return at once.
CREATE FUNCTION outbox_wake() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    bucket bigint;
BEGIN
    IF current_setting('soldonce.outbox_woken', true) = 'on' THEN
        RETURN NULL;
    END IF;
    PERFORM set_config('soldonce.outbox_woken', 'on', true);
    bucket := floor(extract(epoch FROM clock_timestamp()) * 200);
    IF (SELECT last_value FROM outbox_wake_bucket) < bucket THEN
        PERFORM setval('outbox_wake_bucket', bucket);
        PERFORM pg_notify('soldonce_outbox', '');
    END IF;
    RETURN NULL;
END $$;

DROP TRIGGER outbox_notify ON outbox;
DROP FUNCTION outbox_notify();
CREATE CONSTRAINT TRIGGER outbox_wake AFTER INSERT ON outbox
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW EXECUTE FUNCTION outbox_wake();
