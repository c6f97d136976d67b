-- An operator cancels a confirmed order before its goods leave
-- (`soldonce order cancel`, checkout's admin API): its sold units go back
-- to available (ledger movement `restock`), its shipment is `cancelled`
-- (final), and its payment's money goes back as an operator refund under
-- the key `soldonce:cancel` — a void (`void`) of an uncaptured
-- authorization, whose order's `capture` is then `voided`.
--
-- Each check only widens: every row already passed the narrower one, so
-- the new ones are added NOT VALID (no scan of the ledger under a lock).
ALTER TABLE stock_ledger DROP CONSTRAINT stock_ledger_movement_check,
    ADD CONSTRAINT stock_ledger_movement_check
        CHECK (movement IN ('receive', 'adjust', 'reserve', 'confirm', 'release', 'restock')) NOT VALID;
ALTER TABLE shipments DROP CONSTRAINT shipments_state_check,
    ADD CONSTRAINT shipments_state_check
        CHECK (state IN ('pending', 'picked', 'shipped', 'delivered', 'cancelled')) NOT VALID;
ALTER TABLE orders DROP CONSTRAINT orders_capture_check,
    ADD CONSTRAINT orders_capture_check
        CHECK (capture IN ('authorized', 'decided', 'captured', 'voided')) NOT VALID;
ALTER TABLE operator_refunds ADD COLUMN void boolean NOT NULL DEFAULT false;
