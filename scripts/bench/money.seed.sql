-- Seeds confirmed, paid and shipped orders for scripts/bench/money.sh, exactly as
-- the services would have written them, so `soldonce audit` must find them clean:
--   psql -v from=1 -v to=100000 -v t0=<epoch s> -f money.seed.sql     orders from..to
--   psql -v journal=<dir>/ledger.jsonl -f money.seed.sql              psp-sim's journal of their payments
-- Order i is placed at t0 + i * 1.234567 s, paid 1.5 s later and confirmed at
-- 2.5 s + (i % 1000) ms; it has 1-3 lines of distinct SKUs out of 100.
\set ON_ERROR_STOP on
SET TIME ZONE 'UTC';

-- chrono's serde format for DateTime<Utc> (what `events.data` holds): no
-- fraction when it is zero, else 3 digits when whole milliseconds, else 6.
CREATE FUNCTION pg_temp.rfc3339(t timestamptz) RETURNS text LANGUAGE sql IMMUTABLE AS $$
  SELECT to_char(t AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS')
      || CASE WHEN us = 0 THEN '' WHEN us % 1000 = 0 THEN '.' || lpad((us / 1000)::text, 3, '0')
              ELSE '.' || lpad(us::text, 6, '0') END || 'Z'
  FROM (SELECT extract(microseconds FROM t)::bigint % 1000000 AS us) x
$$;

\if :{?journal}
-- One `payment_created` entry per attached payment (services/psp-sim/src/ledger/entry.rs),
-- oldest first, as psp-sim writes them when pay:<order_id> is charged.
\o :journal
SELECT json_build_object(
  'entry', 'payment_created',
  'payment', json_build_object('id', p.payment_id, 'status', 'succeeded', 'amount_minor', p.amount_minor,
      'currency', p.currency, 'reference', p.order_id::text, 'idempotency_key', 'pay:' || p.order_id,
      'failure_reason', NULL, 'created_at', pg_temp.rfc3339(o.created_at + interval '1.5 s'), 'refunds', '[]'::json),
  'request', json_build_object('amount_minor', p.amount_minor, 'currency', p.currency, 'reference', p.order_id::text),
  'outcome', 'succeeded')
FROM payments p JOIN orders o ON o.id = p.order_id
WHERE p.disposition = 'attached' ORDER BY o.created_at;
\o
\else
BEGIN;
INSERT INTO accounts (id, name) VALUES ('00000000-0000-0000-0000-00000000b0b0', 'money bench') ON CONFLICT DO NOTHING;
-- 100 SKUs, each received once (the first run only), so buckets = ledger sums.
WITH p AS (
  INSERT INTO products (sku, name, price_minor, currency)
  SELECT 'MONEY-' || lpad(k::text, 3, '0'), 'money bench product', 990 + 10 * k, 'BRL' FROM generate_series(0, 99) k
  ON CONFLICT DO NOTHING RETURNING sku),
s AS (INSERT INTO stock (sku, available) SELECT sku, 1000000000 FROM p)
INSERT INTO stock_ledger (sku, movement, d_available, d_reserved, d_sold, reason)
SELECT sku, 'receive', 1000000000, 0, 0, 'money benchmark' FROM p;

-- The batch: ids are UUIDv7-shaped (time first) like checkout's Uuid::now_v7().
CREATE TEMP TABLE b ON COMMIT DROP AS
SELECT i, (lpad(to_hex(floor(extract(epoch FROM created) * 1000)::bigint), 12, '0') || '7' || substr(h, 1, 3) || '8' || substr(h, 4, 15))::uuid AS id,
       created, created + interval '15 min' AS expires, created + interval '2.5 s' + (i % 1000) * interval '1 ms' AS confirmed,
       'pay_' || md5('money-pay-' || i) AS payment_id, md5('money-ship-' || i)::uuid AS shipment_id
FROM (SELECT i, to_timestamp(:t0) + i::bigint * 1234567 * interval '1 microsecond' AS created, md5('money-order-' || i) AS h
      FROM generate_series(:from, :to) i) g;
CREATE TEMP TABLE bl ON COMMIT DROP AS
SELECT b.id AS order_id, l.sku, 1 + (b.i + j) % 4 AS quantity, p.price_minor AS unit_price_minor, b.created, b.confirmed
FROM b, generate_series(0, b.i % 3) j, LATERAL (SELECT 'MONEY-' || lpad(((b.i * 7 + j * 31) % 100)::text, 3, '0') AS sku) l
JOIN products p ON p.sku = l.sku;
-- Lines sorted by SKU in byte order, as decide() sorts them and the projection reads them.
CREATE TEMP TABLE bo ON COMMIT DROP AS
SELECT b.*, t.total, t.lines FROM b JOIN (
  SELECT order_id, sum(quantity * unit_price_minor)::bigint AS total,
         jsonb_agg(jsonb_build_object('sku', sku, 'quantity', quantity, 'unit_price_minor', unit_price_minor) ORDER BY sku COLLATE "C") AS lines
  FROM bl GROUP BY order_id) t ON t.order_id = b.id;

INSERT INTO orders (id, account_id, state, currency, total_minor, shipping, payment_id, paid_minor, version, expires_at, created_at, updated_at, refunds)
SELECT id, '00000000-0000-0000-0000-00000000b0b0', 'confirmed', 'BRL', total, NULL, payment_id, total, 2, expires, created, confirmed, '[]' FROM bo;
INSERT INTO order_lines (order_id, sku, quantity, unit_price_minor) SELECT order_id, sku, quantity, unit_price_minor FROM bl;
INSERT INTO payments (payment_id, order_id, amount_minor, currency, disposition, learned_from, recorded_at)
SELECT payment_id, id, total, 'BRL', 'attached', 'worker', confirmed FROM bo;
INSERT INTO shipments (id, order_id, state, version, created_at, updated_at)
SELECT shipment_id, id, 'pending', 1, confirmed + interval '1 s', confirmed + interval '1 s' FROM bo;

-- Events in the order they happened: placed (v1) and confirmed (v2) per
-- order, and its shipment's created event; `data` is Event::data().
INSERT INTO events (event_id, stream_id, version, type, data, correlation_id, causation_id, source, recorded_at)
SELECT gen_random_uuid(), stream, version, type, data, id, gen_random_uuid(), source, at
FROM (
  SELECT id, id AS stream, 1 AS version, 'order.placed.v1' AS type, 'checkout' AS source, created AS at,
         jsonb_build_object('order_id', id, 'account_id', '00000000-0000-0000-0000-00000000b0b0', 'lines', lines, 'currency', 'BRL',
           'total_minor', total, 'shipping', NULL, 'expires_at', pg_temp.rfc3339(expires), 'at', pg_temp.rfc3339(created)) AS data
  FROM bo
  UNION ALL
  SELECT id, id, 2, 'order.confirmed.v1', 'payment-worker', confirmed,
         jsonb_build_object('payment_id', payment_id, 'amount_minor', total, 'reactivated', false, 'at', pg_temp.rfc3339(confirmed))
  FROM bo
  UNION ALL
  SELECT id, shipment_id, 1, 'shipment.created.v1', 'fulfillment', confirmed + interval '1 s',
         jsonb_build_object('shipment_id', shipment_id, 'order_id', id, 'state', 'pending', 'at', pg_temp.rfc3339(confirmed + interval '1 s'))
  FROM bo
) e ORDER BY at;

-- One `reserve` and one `confirm` ledger row per line, and the buckets moved to match.
INSERT INTO stock_ledger (sku, movement, d_available, d_reserved, d_sold, order_id, recorded_at)
SELECT sku, m.movement, m.da * quantity, m.dr * quantity, m.ds * quantity, order_id, CASE m.movement WHEN 'reserve' THEN created ELSE confirmed END
FROM bl, (VALUES ('reserve', -1, 1, 0), ('confirm', 0, -1, 1)) m(movement, da, dr, ds)
ORDER BY 7;
UPDATE stock s SET available = s.available - x.q, held = s.held + x.q
FROM (SELECT sku, sum(quantity)::bigint AS q FROM bl GROUP BY sku) x WHERE s.sku = x.sku;
UPDATE stock_sold s SET sold = s.sold + x.q
FROM (SELECT sku, sum(quantity)::bigint AS q FROM bl GROUP BY sku) x WHERE s.sku = x.sku;
COMMIT;
\endif
