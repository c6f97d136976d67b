-- A capture's later steps update the order's and the payment's rows in
-- place (heap-only tuple updates), so they write no index entries
-- (issue 40), as a shipment's warehouse steps do since migration 35.
--
-- PostgreSQL keeps an update on the row's page without a new entry in any
-- index (a HOT update) only when no column an index holds, or a partial
-- index's predicate reads, changes value, and the page has room.
--
-- orders: an order's money moves `authorized` → `decided` → `captured`.
-- `orders_authorized_since` held `updated_at`, which every update moves,
-- and read `capture`, which each of these steps moves: every update of an
-- order wrote a new entry in each of its indexes. The authorized orders
-- are now marked by `authorized`, a stored generated column that changes
-- only when an order's money becomes authorized and when it stops being so
-- (its capture decided, or the authorization voided), and the index holds `created_at`, which never changes: the capture's
-- recording (`decided` → `captured`) becomes a HOT update. The sweep for
-- missed captures takes the oldest order first, and
-- `soldonce_authorizations_oldest_seconds` reads the oldest authorized
-- order's age since it was placed: at most the payment window more than
-- its authorization's.
--
-- payments: the payment worker's claim of a due capture moved
-- `capture_next_attempt_at` (the lease), the key of
-- `payments_capture_due`. The lease is now `capture_leased_until`, which
-- no index holds, so a claim is a HOT update; a claimed capture keeps its
-- place in the index and the claim passes over the ones leased (at most
-- the captures in flight).
--
-- Both tables keep a fifth of each new page free (fillfactor 80), so that a
-- step finds room beside its row; pages written before keep their fill.
--
-- Adding a stored generated column rewrites `orders` under an exclusive
-- lock (see docs/reference.md, Upgrading). The fillfactor is set first, so
-- that the rewrite leaves the room too.
ALTER TABLE orders SET (fillfactor = 80);
ALTER TABLE orders
    ADD COLUMN authorized boolean NOT NULL GENERATED ALWAYS AS (coalesce(capture = 'authorized', false)) STORED;
DROP INDEX orders_authorized_since;
CREATE INDEX orders_authorized ON orders (created_at, id) WHERE authorized;

ALTER TABLE payments SET (fillfactor = 80);
ALTER TABLE payments ADD COLUMN capture_leased_until timestamptz;
