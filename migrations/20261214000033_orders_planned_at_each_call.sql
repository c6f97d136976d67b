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
-- `order_rows` is an order as the store reads it: the row's columns, then
-- its lines as JSON. Every read of orders selects from it
-- (`store::orders::row::select_orders!`), so the column list lives here
-- alone; PostgreSQL inlines the view, so the plans are the ones the same
-- query on `orders` would get, and `FOR UPDATE OF o` locks the order's row.
CREATE VIEW order_rows AS
SELECT o.id, o.account_id, o.state, o.currency, o.total_minor, o.shipping, o.payment_id,
       o.paid_minor, o.version, o.expires_at, o.created_at, o.updated_at, o.refunds, o.capture,
       o.operator_refunds, o.next_action, o.disputes,
       (SELECT coalesce(jsonb_agg(jsonb_build_object('sku', l.sku, 'quantity', l.quantity,
                                                     'unit_price_minor', l.unit_price_minor)
                                  ORDER BY l.sku COLLATE "C"), '[]')
          FROM order_lines l WHERE l.order_id = o.id) AS lines
FROM orders o;

-- `lock` is 'none' (a plain read, in no particular order), 'wait' (locked
-- for update in id order, waiting for another writer) or 'nowait' (the
-- same, failing with lock_not_available, SQLSTATE 55P03, when another
-- writer holds one).
CREATE FUNCTION orders_by_id(ids uuid[], lock text) RETURNS SETOF order_rows
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
    RETURN QUERY EXECUTE 'SELECT * FROM order_rows o WHERE o.id = ANY($1)' || locking USING ids;
END $$;

-- A page of account `account`'s orders, newest first (ties by id), after
-- the order (`after_at`, `after_id`) when that is not NULL, at most `lim`
-- rows: the buyer's list of orders, planned at each call like the reads
-- above (a plan kept from a nearly empty `orders` would read and sort the
-- whole table at each page).
CREATE FUNCTION orders_of_account(account uuid, after_at timestamptz, after_id uuid, lim bigint)
RETURNS SETOF order_rows LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN QUERY EXECUTE
        'SELECT * FROM order_rows o WHERE o.account_id = $1 '
        'AND ($2::timestamptz IS NULL OR (o.created_at, o.id) < ($2, $3)) '
        'ORDER BY o.created_at DESC, o.id DESC LIMIT $4'
        USING account, after_at, after_id, lim;
END $$;
