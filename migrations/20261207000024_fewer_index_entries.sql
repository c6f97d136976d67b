-- Fewer index entries per order (issue 40): every row an order writes
-- takes one entry in each index of its table, and B-tree leaf inserts were
-- the largest share of the WAL an order writes.
--
-- Nothing reads the stock ledger by SKU alone: the audit sums it whole and
-- reads it by id ranges and by order (stock_ledger_order).
DROP INDEX IF EXISTS stock_ledger_sku;

-- The purges' time columns of three append-only tables: rows arrive in
-- time order, so a BRIN index (a summary per range of pages) finds what is
-- old as well as a B-tree, and a row written into the newest range costs
-- it nothing.
DROP INDEX IF EXISTS inbox_processed;
CREATE INDEX inbox_processed ON inbox USING brin (processed_at);
DROP INDEX IF EXISTS idempotency_keys_created;
CREATE INDEX idempotency_keys_created ON idempotency_keys USING brin (created_at);
DROP INDEX IF EXISTS webhook_receipts_received;
CREATE INDEX webhook_receipts_received ON webhook_receipts USING brin (received_at);
