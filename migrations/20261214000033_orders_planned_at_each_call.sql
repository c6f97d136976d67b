-- The orders of a key set, planned at each call in one round trip
-- (issue 40), as migration 32 did for the other look-ups by key set.
--
-- `SELECT … FROM orders o WHERE o.id = ANY($1)`, prepared, could keep a
-- generic plan made while `orders` was nearly empty, and that plan read
-- every order at each call once the table had grown: 20,000 rows read to
-- load three orders in `payments::batch`'s test, until autovacuum analyzed
-- the table again. Here the statement is run with `EXECUTE … USING`, which
-- plans it at each call with the ids given; the call itself stays prepared.
--
-- `lock` is 'none' (a plain read, in no particular order), 'wait' (locked
-- for update in id order, waiting for another writer) or 'nowait' (the
-- same, failing with lock_not_available, SQLSTATE 55P03, when another
-- writer holds one). The columns are those of `orders` that
-- `store::orders::row::select_orders!` reads, then the order's lines as
-- JSON: a column added to that list needs a new version of this function.
CREATE FUNCTION orders_by_id(ids uuid[], lock text)
RETURNS TABLE (id uuid, account_id uuid, state text, currency text, total_minor bigint,
               shipping jsonb, payment_id text, paid_minor bigint, version integer,
               expires_at timestamptz, created_at timestamptz, updated_at timestamptz,
               refunds jsonb, capture text, operator_refunds jsonb, next_action jsonb,
               disputes jsonb, lines jsonb)
LANGUAGE plpgsql AS $$
DECLARE
    locking text := CASE lock
        WHEN 'none' THEN ''
        WHEN 'wait' THEN ' ORDER BY o.id FOR UPDATE OF o'
        WHEN 'nowait' THEN ' ORDER BY o.id FOR UPDATE OF o NOWAIT'
    END;
BEGIN
    IF locking IS NULL THEN
        RAISE EXCEPTION 'orders_by_id: lock is none, wait or nowait, not %', coalesce(lock, 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN QUERY EXECUTE
        'SELECT o.id, o.account_id, o.state, o.currency, o.total_minor, o.shipping, o.payment_id, '
        'o.paid_minor, o.version, o.expires_at, o.created_at, o.updated_at, o.refunds, o.capture, '
        'o.operator_refunds, o.next_action, o.disputes, '
        '(SELECT coalesce(jsonb_agg(jsonb_build_object(''sku'', l.sku, ''quantity'', l.quantity, '
        '''unit_price_minor'', l.unit_price_minor) ORDER BY l.sku COLLATE "C"), ''[]'') '
        'FROM order_lines l WHERE l.order_id = o.id) '
        'FROM orders o WHERE o.id = ANY($1)' || locking
        USING ids;
END $$;
