-- Confirm a payment without touching its SKU's stock row (issue 40). A
-- SKU's buckets were one row, and a payment's confirmation moved its units
-- from reserved to sold on that row: the row every checkout of the SKU
-- moves too. On a hot SKU the payment worker's transaction waited behind
-- checkout's for the row (and checkout's behind the worker's), each
-- holding it until its commit's WAL flush.
--
-- Now a SKU is two rows:
--   stock       available, and held: the units its orders hold, reserved
--               or sold (what checkout and a release move);
--   stock_sold  sold (what a confirmation moves).
-- reserved = held - sold. The view stock_buckets reads the three buckets
-- as they were; the ledger is unchanged (a confirmation is still the
-- movement reserved -> sold). A move that changes both rows (a late
-- payment's reclaim, an operator's restock) locks the stock row first.
-- The database no longer refuses a confirmation or a release beyond the
-- reserved units by itself (held covers sold too); the order's state
-- machine allows each once per order, and the audit checks the buckets
-- against the ledger and the orders.
CREATE TABLE stock_sold (
    sku   text PRIMARY KEY REFERENCES stock (sku),
    sold  bigint NOT NULL DEFAULT 0 CHECK (sold >= 0)
);
INSERT INTO stock_sold (sku, sold) SELECT sku, sold FROM stock;

-- Every stock row has its sold row, whoever inserts it (the catalogue, a
-- benchmark's seed, an operator by hand).
CREATE FUNCTION stock_sold_row() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO stock_sold (sku) VALUES (NEW.sku) ON CONFLICT DO NOTHING;
    RETURN NULL;
END $$;
CREATE TRIGGER stock_sold_row AFTER INSERT ON stock
    FOR EACH ROW EXECUTE FUNCTION stock_sold_row();

ALTER TABLE stock RENAME COLUMN reserved TO held;
ALTER TABLE stock RENAME CONSTRAINT stock_reserved_check TO stock_held_check;
UPDATE stock SET held = held + sold WHERE sold <> 0;
ALTER TABLE stock DROP COLUMN sold;

CREATE VIEW stock_buckets AS
    SELECT s.sku, s.available, s.held - d.sold AS reserved, d.sold
      FROM stock s JOIN stock_sold d ON d.sku = s.sku;
