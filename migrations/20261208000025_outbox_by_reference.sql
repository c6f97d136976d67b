-- Each event is written once (issue 40). An outbox row was a full copy of
-- its event: the CloudEvent envelope as the relay would publish it (the
-- event's data again, its metadata, its subject and trace headers), about
-- 40% of the bytes an order wrote. Now a row says only which event waits
-- (its position in `events`) and which order it belongs to (so one order's
-- events still leave in order); the relay reads the event by that
-- position, a probe of the events' primary key, and builds the message
-- itself, as a stream repair always has (store::stream_copy).
--
-- Parked rows keep the whole message as the relay built it: what was
-- refused, for an operator to read.
--
-- A waiting row that names no event at its position (only a row written by
-- hand, or a benchmark's filler, could) has nothing to be built from: it is
-- set aside in outbox_parked with the reason `no_event`, its message as it
-- was stored, so nothing waiting is silently dropped.
INSERT INTO outbox_parked (id, position, stream_id, subject, payload, headers, created_at, reason)
SELECT o.id, o.position, o.stream_id, o.subject, o.payload, o.headers, o.created_at, 'no_event'
  FROM outbox o
 WHERE NOT EXISTS (SELECT 1 FROM events e WHERE e.position = o.position AND e.event_id = o.id)
ON CONFLICT (id) DO UPDATE SET position = EXCLUDED.position, stream_id = EXCLUDED.stream_id,
    subject = EXCLUDED.subject, payload = EXCLUDED.payload, headers = EXCLUDED.headers,
    created_at = EXCLUDED.created_at, reason = EXCLUDED.reason, parked_at = now();
DELETE FROM outbox o
 WHERE NOT EXISTS (SELECT 1 FROM events e WHERE e.position = o.position AND e.event_id = o.id);

-- Every row takes its event's position: no default to take another.
ALTER TABLE outbox ALTER COLUMN position DROP DEFAULT;
ALTER TABLE outbox DROP COLUMN id, DROP COLUMN subject, DROP COLUMN payload, DROP COLUMN headers;
