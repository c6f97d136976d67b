-- A stock movement's order takes no B-tree entry (issue 40). Two movements
-- an order (its reservation, then its confirmation or release) each wrote
-- an entry in `stock_ledger_order`: about 150 bytes of WAL per order, for
-- an index only the audit reads (an order's movements, checked against
-- its events).
--
-- Order ids are UUIDv7 (`checkout` draws them as it places the order), so
-- they rise with time, and an order's movements are written soon after it
-- is placed: a BRIN index finds them by the few ranges of pages whose
-- summary holds the id, as `events_event_id` finds an event (see the
-- `event_ids_by_range` migration). A movement written long after its
-- order (an operator's cancel of an old order) widens its range's summary,
-- so that range is read by more look-ups; the audit reads a batch of
-- orders at once, and a range is 128 pages. Each range is summarized as
-- soon as it is full (`autosummarize`).
DROP INDEX IF EXISTS stock_ledger_order;
CREATE INDEX stock_ledger_order ON stock_ledger USING brin (order_id) WITH (autosummarize = on);
