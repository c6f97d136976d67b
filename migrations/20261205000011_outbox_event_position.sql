-- An outbox row carries its event's position (events.position), so the
-- relay can stamp every message with it (the `Soldonce-Position` header)
-- and anyone can tell which events the stream holds: the stream is a copy
-- that a broker's power loss can roll back, and PostgreSQL's `events` is
-- the authority it is repaired from (bus::repair).
--
-- Rows written by the write path take their event's position. A row
-- written without one (an operator's requeue, a benchmark's filler) takes
-- the next value of the events' own sequence, so it can never take a
-- position an event holds. Rows waiting now are renumbered the same way;
-- each order's rows keep their order, since an order's events take
-- increasing positions.
ALTER TABLE outbox ALTER COLUMN position DROP DEFAULT;
DROP SEQUENCE IF EXISTS outbox_position_seq;
ALTER TABLE outbox ALTER COLUMN position SET DEFAULT nextval('events_position_seq');

UPDATE outbox SET position = -position;
UPDATE outbox o
   SET position = coalesce((SELECT e.position FROM events e WHERE e.event_id = o.id),
                           nextval('events_position_seq'));
UPDATE outbox_parked p
   SET position = coalesce((SELECT e.position FROM events e WHERE e.event_id = p.id),
                           nextval('events_position_seq'));
