-- The outbox keeps each message as the exact bytes the relay publishes, and
-- one index fewer.
--
-- payload was jsonb: PostgreSQL parsed every event's envelope into its
-- binary form when it was written and printed it back to text when the
-- relay claimed it, and the relay parsed that text into a tree and encoded
-- it again, for a message nobody queries while it waits. As json it is
-- stored as written (checked, not converted) and read as text; the relay
-- sends those bytes. The columns an operator reads stay readable, and
-- jsonb values still go in (jsonb → json is an assignment cast).
--
-- The rows were keyed twice: by id (the event id, a uuid) and, without a
-- constraint, by position, which the claim walks. The relay now deletes
-- and parks rows by position, so position is the key and the id index
-- goes: one entry fewer to write per event. An event id stays unique where
-- it is recorded (events.event_id); the relay's Nats-Msg-Id still carries it.
ALTER TABLE outbox ALTER COLUMN payload TYPE json USING payload::json;
ALTER TABLE outbox_parked ALTER COLUMN payload TYPE json USING payload::json;
ALTER TABLE outbox DROP CONSTRAINT outbox_pkey;
DROP INDEX outbox_position;
ALTER TABLE outbox ADD CONSTRAINT outbox_position PRIMARY KEY (position);

-- The claim looks up each row's older rows by order alone (its position is
-- compared in a filter: see store::outbox::CLAIM_SQL), so the order index
-- needs no position. With it, the position was in two indexes, and on the
-- statistics of a nearly empty outbox (a queue is often analyzed between
-- two bursts) the planner walked the whole order index to find a batch's
-- positions for the relay's delete: deletes of 300-800 ms, the relay
-- draining 9,000-14,000 events/s instead of 34,000 (deploy/bench/relay.sh).
DROP INDEX outbox_stream_position;
CREATE INDEX outbox_stream_position ON outbox (stream_id);
