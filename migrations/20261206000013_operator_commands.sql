-- What the operator commands need (`soldonce product`, `soldonce
-- dead-letters`).
--
-- A product can be taken off sale without deleting it (its orders, ledger
-- and lines refer to it): checkout refuses a deactivated SKU with 422
-- `product-inactive`; orders already placed go on.
ALTER TABLE products ADD COLUMN active boolean NOT NULL DEFAULT true;

-- A dead letter that was redriven (its message delivered again to the
-- consumer that gave up on it, on `soldonce.redrive.<consumer>.…`) keeps its
-- row as history, stamped; only letters never redriven count as outstanding
-- (the audit, the console). A redriven message that fails again is a new
-- dead letter.
ALTER TABLE dead_letters ADD COLUMN redriven_at timestamptz;
CREATE INDEX dead_letters_outstanding ON dead_letters (consumer, id) WHERE redriven_at IS NULL;
