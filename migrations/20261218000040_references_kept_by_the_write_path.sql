-- The foreign keys on the rows an order writes as it goes are dropped
-- (issue 40). Each was checked row by row: inserting a row ran a query
-- that locked the row it names (`FOR KEY SHARE`). A placing group of a
-- hundred orders ran five such queries per order (the order's account
-- twice, its product twice, the order itself once); the lock on a row
-- the transaction had just inserted still wrote a WAL record, and two
-- groups locking one product's or one account's row at once made a
-- multixact of it. Checkout alone on one hot SKU placed about 11% more
-- orders a second without them (docs/benchmarks.md, "Foreign keys").
--
-- What they guarded still holds:
-- - the write path inserts an order with its lines and its reservation
--   in one statement, after reading the order's products and locking
--   their stock rows (`stock.sku` keeps its key to `products`), and the
--   account comes from the request's verified token;
-- - nothing deletes orders, products or accounts; the triggers below
--   refuse to delete an account or a product that orders name, with the
--   error a foreign key gave (23503);
-- - the full audit checks every reference these keys held
--   (`dangling_reference`).
ALTER TABLE order_lines
    DROP CONSTRAINT IF EXISTS order_lines_order_id_fkey,
    DROP CONSTRAINT IF EXISTS order_lines_sku_fkey;
ALTER TABLE orders DROP CONSTRAINT IF EXISTS orders_account_id_fkey;
ALTER TABLE idempotency_keys DROP CONSTRAINT IF EXISTS idempotency_keys_account_id_fkey;
ALTER TABLE stock_ledger DROP CONSTRAINT IF EXISTS stock_ledger_sku_fkey;
ALTER TABLE shipments DROP CONSTRAINT IF EXISTS shipments_order_id_fkey;

CREATE FUNCTION refuse_deleting_named_account() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM orders WHERE account_id = OLD.id)
       OR EXISTS (SELECT 1 FROM idempotency_keys WHERE account_id = OLD.id) THEN
        RAISE EXCEPTION 'account % has orders: accounts that orders name are never deleted', OLD.id
            USING ERRCODE = 'foreign_key_violation';
    END IF;
    RETURN OLD;
END $$;
CREATE TRIGGER accounts_named_by_orders BEFORE DELETE ON accounts
    FOR EACH ROW EXECUTE FUNCTION refuse_deleting_named_account();

CREATE FUNCTION refuse_deleting_named_product() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM order_lines WHERE sku = OLD.sku) THEN
        RAISE EXCEPTION 'product % is on orders: deactivate it (soldonce product deactivate) instead of deleting it', OLD.sku
            USING ERRCODE = 'foreign_key_violation';
    END IF;
    RETURN OLD;
END $$;
CREATE TRIGGER products_named_by_orders BEFORE DELETE ON products
    FOR EACH ROW EXECUTE FUNCTION refuse_deleting_named_product();
