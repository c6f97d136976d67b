-- One outbox row per statement that appends events, not one per event
-- (issue 40). The write path appends all of a batch's events in one
-- statement: a placing group, a payment worker's batch, fulfillment's
-- shipments. Each event cost the outbox a row, its key's index entry, the
-- claim's row lock and the delete; at 300 orders/s about 1.2 statements
-- append an order's six events.
--
-- A row's key stays `position`: the first position among its events, the
-- order the claim walks in. `positions` lists every event the row holds,
-- in position order (the statement's positions need not be contiguous:
-- other transactions take numbers from the same sequence meanwhile).
-- `tx` is the transaction id that wrote the events (their `xmin`, as
-- text, as a number: `xid` has no B-tree operators), indexed: the relay
-- holds an event back while the event before it in its stream waits in
-- another row, and finds that row by the earlier event's `xmin` and then
-- its position in `positions` (see store::outbox::CLAIM_SQL). The relay
-- deletes a row once every event in it is published or parked; one whose
-- events were published only in part is replaced by a row per event left.
--
-- Relays and writers of the release before this one must be stopped
-- before it is applied (see docs/reference.md, Upgrading): their rows
-- would have no `positions`. Rows waiting now become one-event rows.
ALTER TABLE outbox ADD COLUMN positions bigint[], ADD COLUMN tx bigint;
UPDATE outbox o
   SET positions = ARRAY[o.position], tx = e.xmin::text::bigint
  FROM events e
 WHERE e.position = o.position;
-- A row with no event was parked as `no_event` by migration 25 and could
-- not be written since; none is left, and none could be published.
DELETE FROM outbox WHERE positions IS NULL;
ALTER TABLE outbox ALTER COLUMN positions SET NOT NULL, ALTER COLUMN tx SET NOT NULL;
CREATE INDEX outbox_tx ON outbox (tx);
