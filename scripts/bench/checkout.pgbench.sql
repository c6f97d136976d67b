-- The floor for checkout's benchmark: the same statements checkout sends
-- for one accepted single-line order, in the same order, one round trip
-- each, straight at PostgreSQL. Run with -M prepared and
--   -D skus=1      (one hot SKU, BENCH-0)   or   -D skus=10000
-- against a database seeded by scripts/bench/checkout.sh.
\set n random(1, 9000000000000000000)
\set i random(0, :skus - 1)
SELECT sku, price_minor, currency FROM products WHERE sku = ANY(ARRAY[concat('BENCH-', :i::text)]);
BEGIN;
WITH l AS (SELECT pg_try_advisory_xact_lock(:n::bigint) AS got), i AS (INSERT INTO idempotency_keys (account_id, key, fingerprint, status, response_body, order_id) SELECT '00000000-0000-0000-0000-0000000000be', :n::text, sha256(:n::text::bytea), 202, NULL, md5(:n::text || 'o')::uuid FROM l WHERE got ON CONFLICT DO NOTHING RETURNING 1) SELECT (SELECT got FROM l), EXISTS (SELECT 1 FROM i);
WITH e AS (INSERT INTO events (event_id, stream_id, version, type, data, correlation_id, causation_id, source, recorded_at) VALUES (md5(:n::text || 'e')::uuid, md5(:n::text || 'o')::uuid, 1, 'order.placed.v1', jsonb_build_object('order_id', md5(:n::text || 'o')::uuid, 'account_id', '00000000-0000-0000-0000-0000000000be', 'lines', jsonb_build_array(jsonb_build_object('sku', concat('BENCH-', :i::text), 'quantity', 1, 'unit_price_minor', 4990)), 'currency', 'BRL', 'total_minor', 4990, 'shipping', null, 'expires_at', now(), 'at', now()), md5(:n::text || 'o')::uuid, md5(:n::text || 'c')::uuid, 'checkout', now()) RETURNING position, xmin) INSERT INTO outbox (position, positions, tx) SELECT position, ARRAY[position], xmin::text::bigint FROM e;
INSERT INTO orders (id, account_id, state, currency, total_minor, shipping, payment_id, paid_minor, version, expires_at, created_at, updated_at) VALUES (md5(:n::text || 'o')::uuid, '00000000-0000-0000-0000-0000000000be', 'payment_pending', 'BRL', 4990, null, null, null, 1, now() + interval '15 minutes', now(), now()) ON CONFLICT (id) DO UPDATE SET state = EXCLUDED.state, version = EXCLUDED.version, updated_at = EXCLUDED.updated_at WHERE orders.version = 0;
INSERT INTO order_lines (order_id, sku, quantity, unit_price_minor) SELECT md5(:n::text || 'o')::uuid, s, q, p FROM unnest(ARRAY[concat('BENCH-', :i::text)], ARRAY[1::bigint], ARRAY[4990::bigint]) AS l(s, q, p);
WITH m AS (UPDATE stock SET available = available + -1, held = held + 1 WHERE sku = concat('BENCH-', :i::text) AND available + -1 >= 0 AND held + 1 >= 0 RETURNING sku) INSERT INTO stock_ledger (sku, movement, d_available, d_reserved, d_sold, order_id) SELECT sku, 'reserve', -1, 1, 0, md5(:n::text || 'o')::uuid FROM m;
COMMIT;
