-- An event's metadata is kept as typed columns instead of a JSON object
-- (issue 40). The object spelled out its keys and its two ids as 36
-- characters of text each: 138 to 213 bytes of an event's 400 to 608, the
-- largest part of an order's WAL after the data itself. As columns the ids
-- are 16 bytes each, the keys are gone, and an absent trace context costs
-- nothing: about 100 bytes less per event, 0.8 kB per order. Nothing reads
-- inside the metadata but to build the published envelope and its trace
-- headers, which come out the same.
--
-- `e.metadata` (qualified with the table or its alias) still reads as the
-- JSON object it was, through the function below, for the queries
-- operators keep.
--
-- Rows written by hand with metadata that says less (no ids, `{}`, not an
-- object: the relay used to park them as `unreadable`) take the event's
-- stream as their correlation id, the event itself as their cause and
-- `unknown` as their source. Those parked as `unreadable` can then be
-- requeued (`soldonce outbox requeue`).
--
-- This rewrites `events` once, under an exclusive lock: writers wait until
-- it is done, about 15 s per million events on a 2-core machine (531 MB
-- of events and indexes became 415 MB). See
-- docs/reference.md, Upgrading.
ALTER TABLE events
    ADD COLUMN correlation_id uuid,
    ADD COLUMN causation_id uuid,
    ADD COLUMN source text,
    ADD COLUMN traceparent text,
    ADD COLUMN tracestate text;

-- One rewrite computes them all from the old column and drops it.
ALTER TABLE events
    ALTER COLUMN correlation_id TYPE uuid USING
        CASE WHEN json_typeof(metadata) = 'object'
                  AND (metadata->>'correlation_id') ~* '^[0-9a-f]{8}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{12}$'
             THEN (metadata->>'correlation_id')::uuid ELSE stream_id END,
    ALTER COLUMN causation_id TYPE uuid USING
        CASE WHEN json_typeof(metadata) = 'object'
                  AND (metadata->>'causation_id') ~* '^[0-9a-f]{8}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{12}$'
             THEN (metadata->>'causation_id')::uuid ELSE event_id END,
    ALTER COLUMN source TYPE text USING
        CASE WHEN json_typeof(metadata) = 'object' AND json_typeof(metadata->'source') = 'string'
             THEN metadata->>'source' ELSE 'unknown' END,
    ALTER COLUMN traceparent TYPE text USING
        CASE WHEN json_typeof(metadata) = 'object' AND json_typeof(metadata->'traceparent') = 'string'
             THEN metadata->>'traceparent' END,
    ALTER COLUMN tracestate TYPE text USING
        CASE WHEN json_typeof(metadata) = 'object' AND json_typeof(metadata->'tracestate') = 'string'
             THEN metadata->>'tracestate' END,
    DROP COLUMN metadata;

ALTER TABLE events
    ALTER COLUMN correlation_id SET NOT NULL,
    ALTER COLUMN causation_id SET NOT NULL,
    ALTER COLUMN source SET NOT NULL;

-- The metadata as the JSON object it was stored as: `e.metadata`.
CREATE FUNCTION metadata(e events) RETURNS json LANGUAGE sql IMMUTABLE AS $$
    SELECT json_strip_nulls(json_build_object(
        'correlation_id', e.correlation_id, 'causation_id', e.causation_id, 'source', e.source,
        'traceparent', e.traceparent, 'tracestate', e.tracestate))
$$;
