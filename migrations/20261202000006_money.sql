-- soldonce schema, part 6: money that reconciles with the PSP's books.
--
-- `payments` holds every payment soldonce has learned of, with its one
-- disposition: `attached` (it settles a confirmed order) or `refund` (it is
-- to be, or was, given back). The disposition is decided once, in the same
-- transaction as the fact that prompted it, before the PSP is called; the
-- primary key serialises two deciders, and a trigger keeps it final. A
-- `refund` row is a compensation: durable work the payment worker carries
-- out with the stable key `refund:<payment_id>` until the PSP confirms it.
CREATE TABLE payments (
    payment_id       text PRIMARY KEY CHECK (length(payment_id) BETWEEN 1 AND 255),
    order_id         uuid,
    amount_minor     bigint NOT NULL,
    currency         text NOT NULL CHECK (length(currency) BETWEEN 1 AND 16),
    disposition      text NOT NULL CHECK (disposition IN ('attached', 'refund')),
    reason           text,
    learned_from     text NOT NULL,
    refund_state     text CHECK (refund_state IN ('pending', 'succeeded', 'refused')),
    refund_id        text,
    attempts         integer NOT NULL DEFAULT 0,
    next_attempt_at  timestamptz,
    last_error       text,
    recorded_at      timestamptz NOT NULL DEFAULT now(),
    refunded_at      timestamptz,
    CONSTRAINT payments_refund_only_when_refunding CHECK ((disposition = 'refund') = (refund_state IS NOT NULL))
);
CREATE INDEX payments_order ON payments (order_id);
CREATE INDEX payments_compensation_due ON payments (next_attempt_at) WHERE refund_state = 'pending';

CREATE FUNCTION payments_disposition_is_final() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.disposition IS DISTINCT FROM OLD.disposition
       OR NEW.order_id IS DISTINCT FROM OLD.order_id
       OR NEW.amount_minor IS DISTINCT FROM OLD.amount_minor THEN
        RAISE EXCEPTION 'payment %: its disposition (%) is final', OLD.payment_id, OLD.disposition
            USING ERRCODE = 'integrity_constraint_violation', CONSTRAINT = 'payments_disposition_final';
    END IF;
    IF OLD.refund_state IN ('succeeded', 'refused') AND NEW.refund_state IS DISTINCT FROM OLD.refund_state THEN
        RAISE EXCEPTION 'payment %: its refund already ended (%)', OLD.payment_id, OLD.refund_state
            USING ERRCODE = 'integrity_constraint_violation', CONSTRAINT = 'payments_disposition_final';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER payments_disposition_final BEFORE UPDATE ON payments
    FOR EACH ROW EXECUTE FUNCTION payments_disposition_is_final();
CREATE FUNCTION payments_are_kept() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'payments are never deleted';
END $$;
CREATE TRIGGER payments_kept BEFORE DELETE ON payments
    FOR EACH ROW EXECUTE FUNCTION payments_are_kept();

-- A confirmed order's payment must be attached to it, checked at commit:
-- nothing confirms on a payment whose refund was decided.
CREATE FUNCTION orders_confirmed_on_attached_payment() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.state = 'confirmed' AND NOT EXISTS (
        SELECT 1 FROM payments p
        WHERE p.payment_id = NEW.payment_id AND p.order_id = NEW.id AND p.disposition = 'attached') THEN
        RAISE EXCEPTION 'order % is confirmed on payment %, which is not attached to it', NEW.id, NEW.payment_id
            USING ERRCODE = 'integrity_constraint_violation', CONSTRAINT = 'orders_confirmed_payment_attached';
    END IF;
    RETURN NULL;
END $$;

-- Orders confirmed before this table existed: their payments were attached.
INSERT INTO payments (payment_id, order_id, amount_minor, currency, disposition, learned_from)
SELECT payment_id, id, paid_minor, currency, 'attached', 'migration' FROM orders
WHERE state = 'confirmed' AND payment_id IS NOT NULL
ON CONFLICT DO NOTHING;
INSERT INTO payments (payment_id, order_id, amount_minor, currency, disposition, reason, learned_from, refund_state, refunded_at)
SELECT payment_id, id, paid_minor, currency, 'refund', 'units_gone', 'migration', 'succeeded', updated_at FROM orders
WHERE state = 'refunded' AND payment_id IS NOT NULL
ON CONFLICT DO NOTHING;

CREATE CONSTRAINT TRIGGER orders_confirmed_payment_attached AFTER INSERT OR UPDATE OF state, payment_id ON orders
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW WHEN (NEW.state = 'confirmed') EXECUTE FUNCTION orders_confirmed_on_attached_payment();

-- The orders projection records the refunds decided against its payments.
ALTER TABLE orders ADD COLUMN refunds jsonb NOT NULL DEFAULT '[]';
UPDATE orders SET refunds = jsonb_build_array(jsonb_build_object(
    'payment_id', payment_id, 'amount_minor', paid_minor, 'currency', currency, 'reason', 'units_gone', 'refunded', true))
WHERE state = 'refunded' AND payment_id IS NOT NULL;

-- Reconciliation against the PSP's books: where the periodic walk of the
-- PSP's payment listing has reached, and what its last run found.
CREATE TABLE reconcile_state (
    id             boolean PRIMARY KEY DEFAULT true CHECK (id),
    cursor_time    timestamptz,
    last_run_at    timestamptz,
    last_run_seconds double precision,
    payments_seen  bigint NOT NULL DEFAULT 0
);
CREATE TABLE reconcile_findings (
    id          bigserial PRIMARY KEY,
    kind        text NOT NULL,
    subject     text NOT NULL,
    detail      text NOT NULL,
    repaired    boolean NOT NULL,
    found_at    timestamptz NOT NULL DEFAULT now()
);
