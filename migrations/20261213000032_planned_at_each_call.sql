-- The look-ups by a set of keys, each planned at every call in one round
-- trip (issue 40).
--
-- Each of these statements must be planned at each call on the tables as
-- they are then. Prepared, PostgreSQL keeps the generic plan it settles on
-- after five calls, made on that moment's statistics: on a new system (or
-- in a benchmark's first seconds) nearly empty tables, and the plan kept
-- then read the whole grown table at each call until autovacuum analyzed
-- it again (see `store::payments::LOCK_KNOWN_SQL` and
-- `store::inbox::SEEN_SQL`).
--
-- So they used to run unprepared, which costs a second round trip at each
-- call: the driver sends the statement and waits for its description,
-- then binds and runs it. Inside a function whose `plan_cache_mode` is
-- `force_custom_plan`, the call itself is prepared once, runs in one round
-- trip, and its statement is still planned at every call with the values
-- given. PL/pgSQL parses the statement once per connection; the plan is
-- made at each call, as it was unprepared.
--
-- Each function returns what the statement it replaces returned, in the
-- same order, and takes the same locks in the same order.

-- The payments already recorded among `$1`, locked in payment id order
-- (after the orders, on every path: see `store::payments`).
CREATE FUNCTION payments_recorded_locking(text[]) RETURNS SETOF text
LANGUAGE plpgsql SET plan_cache_mode = force_custom_plan AS $$
BEGIN
    RETURN QUERY SELECT p.payment_id FROM payments p
        WHERE p.payment_id = ANY($1) ORDER BY p.payment_id FOR UPDATE;
END $$;

-- The payments already recorded among `$1`: a plain read, no lock.
CREATE FUNCTION payments_recorded(text[]) RETURNS SETOF text
LANGUAGE plpgsql STABLE SET plan_cache_mode = force_custom_plan AS $$
BEGIN
    RETURN QUERY SELECT p.payment_id FROM payments p WHERE p.payment_id = ANY($1);
END $$;

-- Which of the event ids `$2` the consumer `$1` has committed the effect
-- of: one probe of the inbox's key per id (`OFFSET 0` keeps each probe a
-- subquery of its own).
CREATE FUNCTION inbox_seen(text, uuid[]) RETURNS SETOF uuid
LANGUAGE plpgsql STABLE SET plan_cache_mode = force_custom_plan AS $$
BEGIN
    RETURN QUERY SELECT k.id FROM unnest($2) AS k(id)
        WHERE EXISTS (SELECT 1 FROM inbox i WHERE i.consumer = $1 AND i.event_id = k.id OFFSET 0);
END $$;

-- The stored responses of idempotency keys (`$1` accounts, `$2` keys,
-- pairwise), each with its 1-based position; a key whose body is not
-- stored comes with its order's first event.
CREATE FUNCTION idempotency_keys_stored(uuid[], text[])
RETURNS TABLE (i bigint, fingerprint bytea, status smallint, response_body jsonb,
               order_id uuid, type text, data json)
LANGUAGE plpgsql STABLE SET plan_cache_mode = force_custom_plan AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY SELECT t.i, k.fingerprint, k.status, k.response_body, k.order_id, e.type, e.data
        FROM unnest($1, $2) WITH ORDINALITY AS t(a, k, i)
        JOIN idempotency_keys k ON k.account_id = t.a AND k.key = t.k
        LEFT JOIN events e ON k.response_body IS NULL AND e.stream_id = k.order_id AND e.version = 1;
END $$;

-- The orders `$1`, share-locked in id order, then their shipments, locked
-- in order id order: one row per order (`shipment` false), then one per
-- shipment. The `UNION ALL` runs its branches one after the other, and
-- each materialized scan locks its rows in its own `ORDER BY`.
CREATE FUNCTION shipments_locking(uuid[])
RETURNS TABLE (shipment boolean, id uuid, order_id uuid, state text, version integer,
               updated_at timestamptz)
LANGUAGE plpgsql SET plan_cache_mode = force_custom_plan AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH o AS MATERIALIZED (SELECT id, state FROM orders WHERE id = ANY($1) ORDER BY id FOR SHARE),
         s AS MATERIALIZED (SELECT id, order_id, state, version, updated_at FROM shipments
                            WHERE order_id = ANY($1) ORDER BY order_id FOR UPDATE)
    SELECT false, o.id, o.id, o.state, NULL::integer, NULL::timestamptz FROM o
    UNION ALL
    SELECT true, s.id, s.order_id, s.state, s.version, s.updated_at FROM s;
END $$;
