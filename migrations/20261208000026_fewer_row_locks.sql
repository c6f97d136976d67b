-- Fewer row locks per order (issue 40). A foreign key check takes a
-- FOR KEY SHARE lock on the row it points at. PostgreSQL records that lock
-- in the row itself (a WAL record, a dirtied page) and, while several
-- transactions hold it at once, in a MultiXact. Every order took five such
-- locks on rows that every order shares: its SKU's product (for its order
-- line and for each of its stock ledger rows) and its buyer's account (for
-- the order and for its idempotency key). In a flash sale, that is the same
-- two rows for every buyer.
--
-- Nothing deletes a product or an account: a product is deactivated, an
-- account's token revoked. The write path writes ledger rows and order
-- lines only for SKUs whose stock row it moves in the same statement
-- (stock.sku keeps its key to products), and orders and idempotency keys
-- only for the account it authenticated. So these append-only tables keep
-- their references a cheaper way: what they point at can be neither deleted
-- nor renamed. That is checked once per delete, not once per row written.
ALTER TABLE stock_ledger DROP CONSTRAINT stock_ledger_sku_fkey;
ALTER TABLE order_lines DROP CONSTRAINT order_lines_sku_fkey;
ALTER TABLE orders DROP CONSTRAINT orders_account_id_fkey;
ALTER TABLE idempotency_keys DROP CONSTRAINT idempotency_keys_account_id_fkey;

CREATE FUNCTION referenced_rows_stay() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION '%: orders and their history refer to its rows, which are never deleted nor re-keyed (deactivate a product, revoke an account''s token)', TG_TABLE_NAME
        USING ERRCODE = 'foreign_key_violation';
END $$;
CREATE TRIGGER products_stay BEFORE DELETE OR UPDATE OF sku ON products
    FOR EACH ROW EXECUTE FUNCTION referenced_rows_stay();
CREATE TRIGGER products_stay_whole BEFORE TRUNCATE ON products
    FOR EACH STATEMENT EXECUTE FUNCTION referenced_rows_stay();
CREATE TRIGGER accounts_stay BEFORE DELETE OR UPDATE OF id ON accounts
    FOR EACH ROW EXECUTE FUNCTION referenced_rows_stay();
CREATE TRIGGER accounts_stay_whole BEFORE TRUNCATE ON accounts
    FOR EACH STATEMENT EXECUTE FUNCTION referenced_rows_stay();
