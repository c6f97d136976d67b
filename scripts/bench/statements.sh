#!/usr/bin/env bash
# Where PostgreSQL's time goes per order: the whole saga at 300 orders/s (PSP
# latency 20 ms) on a private PostgreSQL with pg_stat_statements loaded, then
# the statements that took the most time, with calls and milliseconds per
# order, the statements that read the most blocks per call, and the CPU each
# program used per order. Time in a statement
# includes waiting for row locks and for a core, so read it beside the CPU.
#   bash scripts/bench/statements.sh [hot|10k] [seconds]
# or, for expiry: N orders placed over 10,000 SKUs with a 1 s reservation
# window and nobody paying, then one expiry process releasing them all (per
# order: per released order):
#   bash scripts/bench/statements.sh expiry [orders]
# BIN_DIR=… runs binaries already built (e.g. an older build); PG_SETTINGS="a=1 b=2"
# adds server settings (e.g. plan_cache_mode=force_generic_plan), to try one.
# RATE=N places N orders/s instead of 300.
# CLOSED=1 runs the saga's case as a closed loop at saturation (300
# connections, `seconds` × 1,000 orders) instead of 300 orders/s.
# Before the measured load, 2 s of the open loop warm the system up (its
# services' connections opened, their statements prepared, as on a store
# that has been taking orders); they are followed to their end, their
# placed → confirmed printed, the order tables emptied and WAL segments
# readied for reuse (a new cluster has none, and creating one stalls every
# commit), as `soldonce bench saga` does. WARM_UP=0 measures from a cold
# start instead; STALE=1 implies it.
# Besides the statements it prints the WAL an order wrote, by record type
# and by relation (table or index), an order's steps (order.placed →
# order.confirmed split where psp-sim took the charge), the bytes of an
# event's row by type,
# and the statements run on a kept generic plan (made once, on the tables as
# they were then: the ones to watch for a plan made on an empty table).
# STALE=1 analyzes every table just before the load, while the order's
# tables are empty, and turns autovacuum off: a statement kept prepared then
# keeps a plan made on empty tables, as on a new store in its first minute,
# and one that scans the grown tables shows in the blocks read per call.
# PERF=1 also samples every core with `perf record` during the load and
# prints the functions that used the most CPU (needs perf and the right to
# sample the whole machine: root, or kernel.perf_event_paranoid <= 0);
# PERF_DATA=file keeps the samples, for `perf report -i file`.
# WAITS=1 samples what PostgreSQL's busy backends wait for (pg_stat_activity,
# every 10 ms, one psql session) during the load: a core, the WAL's flush,
# a new WAL segment, a row lock (with the waiting statement).
set -euo pipefail
cd "$(dirname "$0")/../.."
. deploy/setup.sh >&2
case="${1:-10k}"
secs="${2:-15}"
rate="${RATE:-300}"
psp_latency_ms=20
[[ "$rate" =~ ^[1-9][0-9]*$ ]] || { echo "statements.sh: RATE must be a positive number of orders per second, not '$rate'" >&2; exit 2; }
case "$case" in
  hot) sku=BENCH-0 count=1 ;;
  10k) sku=BENCH count=10000 ;;
  expiry)
    expired="${2:-50000}"
    [[ "$expired" =~ ^[1-9][0-9]*$ ]] || { echo "statements.sh: the number of orders to expire must be a positive integer, not '$expired'" >&2; exit 2; } ;;
  *) echo "statements.sh: the case is hot, 10k or expiry, not '$case'" >&2; exit 2 ;;
esac
[ -n "${PERF:-}" ] && ! command -v perf >/dev/null && { echo "statements.sh: PERF=1 needs perf (Debian: linux-perf)" >&2; exit 2; }
. scripts/bench/lib.sh
release_bins

# PostgreSQL refuses to run as root: as root, the server runs as `postgres`.
as_pg=()
mkdir "$dir/pg"
if [ "$(id -u)" = 0 ]; then
  as_pg=(runuser -u postgres --)
  chmod 755 "$dir"
  chown postgres "$dir/pg"
fi
"${as_pg[@]}" initdb -D "$dir/pg" -U postgres -A trust >/dev/null
port=$(free_port)
# The settings `soldonce up` starts PostgreSQL with, plus the statistics.
"${as_pg[@]}" postgres -D "$dir/pg" -p "$port" -k "$dir/pg" -c listen_addresses=127.0.0.1 \
  -c max_connections=200 -c shared_buffers=256MB -c track_commit_timestamp=on \
  -c shared_preload_libraries=pg_stat_statements -c pg_stat_statements.track=all -c pg_stat_statements.track_planning=on \
  $(for setting in ${PG_SETTINGS:-}; do printf -- '-c %s ' "$setting"; done) >"$dir/pg.log" 2>&1 &
pg=$!
expiry=""
trap '[ -n "$expiry" ] && kill "$expiry" 2>/dev/null; [ -n "$up" ] && kill "$up" 2>/dev/null; kill "$pg" 2>/dev/null; wait; rm -rf "$dir"' EXIT
for _ in $(seq 150); do pg_isready -q -h 127.0.0.1 -p "$port" && break; sleep 0.2; done
export DATABASE_URL="postgres://postgres@127.0.0.1:$port/postgres"
# Each confirmed order's placement and its time to confirmation (the
# warm-up's figures and the slowest 1% read it).
placed_to_confirmed="SELECT p.recorded_at AS placed, f.recorded_at - p.recorded_at AS took FROM events p JOIN events f ON f.stream_id = p.stream_id AND f.type = 'order.confirmed.v1' WHERE p.type = 'order.placed.v1'"
sql "CREATE EXTENSION pg_stat_statements" >/dev/null
# Samples every core from now until perf_stop.
perf_data="${PERF_DATA:-$dir/perf.data}"
perf_start() {
  waits_start
  [ -n "${PERF:-}" ] || return 0
  perf record -a -F 997 -o "$perf_data" >/dev/null 2>&1 &
  perf_pid=$!
}
perf_stop() { [ -z "${PERF:-}" ] || { kill -INT "$perf_pid"; wait "$perf_pid" || true; }; waits_stop; }
# WAITS=1: what the busy backends wait for, sampled from pg_stat_activity
# every 10 ms (one psql session) from perf_start until perf_stop.
waits_start() {
  [ -n "${WAITS:-}" ] || return 0
  while :; do
    echo "SELECT coalesce(wait_event_type || ':' || wait_event, 'on a core'), CASE WHEN wait_event_type = 'Lock' THEN application_name || ': ' || left(regexp_replace(query, '\s+', ' ', 'g'), 80) ELSE '' END FROM pg_stat_activity WHERE state NOT IN ('idle', 'idle in transaction') AND backend_type = 'client backend' AND pid <> pg_backend_pid(); SELECT pg_sleep(0.01);"
  done | psql -qtA -F '|' "$DATABASE_URL" >"$dir/waits" 2>/dev/null &
  waits_pid=$!
}
waits_stop() {
  [ -n "${WAITS:-}" ] || return 0
  kill "$waits_pid" 2>/dev/null; wait "$waits_pid" 2>/dev/null || true
  echo "what PostgreSQL's busy backends waited for, samples every 10 ms during the load (WAITS=1):"
  awk -F'|' 'NF >= 1 && $1 != "" { n[$1]++ } END { for (k in n) printf "  %6d  %s\n", n[k], k }' "$dir/waits" | sort -rn | head -12
  echo "  row lock waits, by the waiting statement:"
  awk -F'|' '$2 != "" { n[$2]++ } END { for (k in n) printf "  %6d  %s\n", n[k], k }' "$dir/waits" | sort -rn | head -6
}
reset_statistics() {
  sql "SELECT pg_stat_statements_reset(), pg_stat_reset(), pg_stat_reset_shared('wal')" >/dev/null
  wal_start=$(sql "SELECT pg_current_wal_lsn()")
}
echo "machine: $(nproc) cores, $(uname -sr); $(postgres --version); binaries: $bin; settings: ${PG_SETTINGS:-defaults}"

if [ "$case" = expiry ]; then
  place_unpaid "$expired"
  while [ "$(sql 'SELECT count(*) FROM outbox')" != "0" ]; do sleep 0.2; done
  reset_statistics
  cpu_snap "$dir/cpu.before"
  pg_cpu_snap "$dir/pgcpu.before"
  perf_start
  t0=$(date +%s.%N)
  start_expiry
  wait_settled
  perf_stop
  orders=$(sql "SELECT count(*) FROM orders WHERE state = 'expired'")
  echo "case expiry: $orders orders released by one expiry process (EXPIRY_CONCURRENCY=${EXPIRY_CONCURRENCY:-2}, EXPIRY_BATCH_SIZE=${EXPIRY_BATCH_SIZE:-1000}) in $(python3 -c "import time; t=time.time()-$t0; print(f'{t:.1f}s: {$orders/t:.0f} releases/s')")"
  # Before expiry exits: its CPU, and its connections' backends, leave /proc with it.
  echo "CPU: $(cpu_per_order "$dir/cpu.before" "$orders")"
  echo "PostgreSQL's CPU by the service it served, ms per order: $(pg_cpu_per_order "$dir/pgcpu.before" "$orders")"
  kill "$expiry"; wait "$expiry" 2>/dev/null || true; expiry=""
else
  export PSP_FAULTS="{\"latency_ms\": $psp_latency_ms}" FULFILLMENT_STEP_DELAY=20ms
  start_system psp-sim,checkout,outbox-relay,payment-worker,fulfillment
  seed_bench_products
  if [ -z "${STALE:-}" ] && [ "${WARM_UP:-2}" != 0 ]; then
    load --sku "$sku" --sku-count "$count" --rate "$rate" --duration "${WARM_UP:-2}s" >/dev/null
    wait_settled; wait_delivered; wait_captured
    echo "warm-up (not counted below): $(sql "SELECT count(*) || ' orders at $rate/s, order.placed → order.confirmed p50 ' || round((extract(epoch FROM percentile_cont(0.5) WITHIN GROUP (ORDER BY took)) * 1000)::numeric, 1) || ' ms, p99 ' || round((extract(epoch FROM percentile_cont(0.99) WITHIN GROUP (ORDER BY took)) * 1000)::numeric, 1) || ' ms' FROM ($placed_to_confirmed) l")"
    # As `soldonce bench saga` empties them between its loops, and readies
    # WAL segments for reuse as a running database has them (store::bench).
    sql "TRUNCATE orders, order_lines, events, outbox, idempotency_keys, inbox, webhook_receipts, payments, shipments CASCADE" >/dev/null
    for _ in $(seq 0 5); do sql "SELECT pg_logical_emit_message(false, 'soldonce-bench', '')" >/dev/null; sql "SELECT pg_switch_wal()" >/dev/null; done
    sql "CHECKPOINT" >/dev/null
  fi
  # STALE=1: every plan made on empty tables, and kept (see the header).
  if [ -n "${STALE:-}" ]; then
    for statement in "ALTER SYSTEM SET autovacuum = off" "SELECT pg_reload_conf()" ANALYZE; do sql "$statement" >/dev/null; done
  fi
  reset_statistics
  cpu_snap "$dir/cpu.before"
  pg_cpu_snap "$dir/pgcpu.before"
  perf_start
  if [ -n "${CLOSED:-}" ]; then
    # At saturation: what an order costs when batches and groups are full.
    t0=$(date +%s.%N)
    load --sku "$sku" --sku-count "$count" --connections 300 --requests $(( secs * 1000 )) >/dev/null
    wait_settled
    settled=$(python3 -c "import time; print(f'{time.time()-$t0:.1f}')")
    perf_stop
    wait_delivered; wait_captured
    orders=$(sql "SELECT count(*) FROM orders")
    echo "case $case: closed loop, 300 connections; orders: $orders, all settled after ${settled}s, every confirmed one delivered, $captured"
  else
    load --sku "$sku" --sku-count "$count" --rate "$rate" --duration "${secs}s" >/dev/null
    perf_stop
    wait_settled; wait_delivered; wait_captured
    orders=$(sql "SELECT count(*) FROM orders")
    echo "case $case: $rate orders/s for ${secs}s; orders: $orders, every one settled and every confirmed one delivered, $captured"
  fi
  echo "CPU: $(cpu_per_order "$dir/cpu.before" "$orders")"
  echo "PostgreSQL's CPU by the service it served, ms per order: $(pg_cpu_per_order "$dir/pgcpu.before" "$orders")"
fi
echo "transactions per order: $(sql "SELECT round(xact_commit::numeric / $orders, 2) || ' committed, ' || round(xact_rollback::numeric / $orders, 2) || ' rolled back' FROM pg_stat_database WHERE datname = current_database()")"
# The worker's reply and the PSP's webhook race to confirm an order; the
# webhook learns it itself only when the worker has not, a few looks later.
[ "$case" = expiry ] || echo "orders confirmed, by who learned the payment first: $(sql "SELECT string_agg(source || ' ' || n, ', ' ORDER BY n DESC) FROM (SELECT source, count(*) AS n FROM events WHERE type = 'order.confirmed.v1' GROUP BY source) x")"
echo "WAL per order: $(sql "SELECT round(wal_records::numeric / $orders, 1) || ' records, ' || round(wal_fpi::numeric / $orders, 2) || ' full-page images, ' || round(wal_bytes / $orders / 1024, 1) || ' kB' FROM pg_stat_wal"); events per order: $(sql "SELECT round(count(*)::numeric / $orders, 2) FROM events")"
# The WAL written from the run's start to now, read back with pg_waldump
# from the private server's segments (pg_stat_wal above also counts what
# autovacuum and checkpoints wrote after the run): by record type, then by
# the relation each record changes (its first block reference, its
# full-page images with it), so the table or index the bytes are for shows.
wal_end=$(sql "SELECT pg_current_wal_insert_lsn()")
waldump="$(pg_config --bindir)/pg_waldump"
# pg_waldump may stop with an error at the last record, not yet flushed:
# what it read before is kept.
"$waldump" --stats=record -p "$dir/pg/pg_wal" -s "$wal_start" -e "$wal_end" >"$dir/wal.stats" 2>"$dir/wal.err" || true
"$waldump" -p "$dir/pg/pg_wal" -s "$wal_start" -e "$wal_end" >"$dir/wal.records" 2>>"$dir/wal.err" || true
if [ -s "$dir/wal.stats" ] && [ -s "$dir/wal.records" ]; then
  sql "SELECT relfilenode || ' ' || relname FROM pg_class WHERE relfilenode <> 0" >"$dir/relfilenodes"
  awk -v n="$orders" -v names="$dir/relfilenodes" -v total="$dir/wal.total" '
      BEGIN { while ((getline line < names) > 0) { split(line, f, " "); name[f[1]] = f[2] } }
      {
        match($0, /len \(rec\/tot\): *[0-9]+\/ *[0-9]+/); split(substr($0, RSTART, RLENGTH), l, "/"); tot = l[3] + 0
        rel = "(no relation: commits, running transactions, ...)"
        if (match($0, /rel [0-9]+\/[0-9]+\/[0-9]+/)) { split(substr($0, RSTART + 4, RLENGTH - 4), r, "/"); rel = (r[3] in name) ? name[r[3]] : "filenode " r[3] }
        split($0, d, "desc: "); split(d[2], w, " "); kind = w[1]
        bytes[rel] += tot; records[rel]++; all += tot; count++; kinds[rel, kind]++; seen[rel] = seen[rel] (index(seen[rel], " " kind " ") ? "" : " " kind " ")
      }
      END {
        printf "WAL per order from the run'"'"'s start to its end (pg_waldump): %.2f kB, %.1f records\n", all / n / 1024, count / n > total
        for (k in bytes) {
          split(seen[k], ks, " "); detail = ""
          for (i in ks) if (ks[i] != "" && kinds[k, ks[i]] / n >= 0.05) detail = detail (detail == "" ? "" : ", ") sprintf("%s %.1f", ks[i], kinds[k, ks[i]] / n)
          printf "  %7.0f B %5.1f records %4.1f%%  %s (%s)\n", bytes[k] / n, records[k] / n, 100 * bytes[k] / all, k, detail
        }
      }' "$dir/wal.records" | sort -rn >"$dir/wal.relations"
  cat "$dir/wal.total"
  echo "WAL records per order by type:"
  awk -v n="$orders" '$1 ~ /\// && $2 ~ /^[0-9]+$/ && $2 > 0 { printf "  %6.2f  %s\n", $2 / n, $1 }' "$dir/wal.stats" | sort -rn | head -15
  echo "WAL bytes per order by relation (a record counted with the first relation it changes, its full-page images with it):"
  head -30 "$dir/wal.relations"
else
  echo "WAL by record type and relation: pg_waldump could not read the segments: $(head -c 300 "$dir/wal.err")"
fi
echo "bytes of an event's row, by type (pg_column_size; the metadata's: its columns together, or its JSON object before they were columns):"
if [ "$(sql "SELECT count(*) FROM information_schema.columns WHERE table_name = 'events' AND column_name = 'metadata'")" = 1 ]; then
  meta="pg_column_size(metadata)"
else
  meta="pg_column_size(correlation_id) + pg_column_size(causation_id) + pg_column_size(source) + coalesce(pg_column_size(traceparent), 0) + coalesce(pg_column_size(tracestate), 0)"
fi
psql "$DATABASE_URL" -P pager=off -c "SELECT type, count(*) AS events, round(avg(pg_column_size(e.*))) AS row, round(avg(pg_column_size(data))) AS data, round(avg($meta)) AS metadata FROM events e GROUP BY type ORDER BY count(*) DESC, type"
echo "indexes of the tables written per order (an index is one more entry to write per row; idx_scan = 0: not read during the run):"
psql "$DATABASE_URL" -P pager=off -c "SELECT t.relname AS table, round((t.n_tup_ins + t.n_tup_upd - t.n_tup_hot_upd)::numeric / $orders, 2) AS index_writes_per_order, i.indexrelname AS index, i.idx_scan FROM pg_stat_user_tables t JOIN pg_stat_user_indexes i USING (relid) WHERE t.n_tup_ins + t.n_tup_upd > $orders / 10 ORDER BY t.relname, i.indexrelname"
echo "statements per order: $(sql "SELECT round(sum(calls)::numeric / $orders, 1) || ', ' || round(sum(total_exec_time)::numeric / $orders, 2) || ' ms in them' FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())")"
psql "$DATABASE_URL" -P pager=off -c "SELECT round((total_exec_time / $orders)::numeric, 3) AS ms_per_order, round(calls::numeric / $orders, 2) AS calls_per_order, round(mean_exec_time::numeric, 2) AS mean_ms, left(regexp_replace(query, '\s+', ' ', 'g'), 110) AS statement FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) ORDER BY total_exec_time DESC LIMIT 20"
echo "statements by shared blocks read per call (a plan that walks a whole table shows here; plans = calls means planned at every call):"
psql "$DATABASE_URL" -P pager=off -c "SELECT round(calls::numeric / $orders, 2) AS calls_per_order, plans, round(shared_blks_hit::numeric / calls, 1) AS blocks_per_call, round(rows::numeric / calls, 1) AS rows_per_call, round(mean_plan_time::numeric, 3) AS plan_ms, left(regexp_replace(query, '\s+', ' ', 'g'), 90) AS statement FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) AND calls >= $orders / 20 ORDER BY shared_blks_hit::numeric / calls DESC LIMIT 10"
echo "statements by calls per order (each a round trip, BEGIN and COMMIT included, except the triggers' own: the lines starting NEW., set_config and the wake bucket):"
psql "$DATABASE_URL" -P pager=off -c "SELECT round(calls::numeric / $orders, 2) AS calls_per_order, round(total_exec_time::numeric / $orders, 3) AS ms_per_order, round(rows::numeric / nullif(calls, 0), 1) AS rows_per_call, left(regexp_replace(query, '\s+', ' ', 'g'), 110) AS statement FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) AND toplevel AND calls > 0 ORDER BY calls DESC LIMIT 30"
echo "statements by planning time per order (plans = calls: a custom plan at every call, the generic one judged dearer):"
psql "$DATABASE_URL" -P pager=off -c "SELECT round(total_plan_time::numeric / $orders, 3) AS plan_ms_per_order, round(calls::numeric / $orders, 2) AS calls_per_order, plans, round(mean_plan_time::numeric, 3) AS plan_ms, left(regexp_replace(query, '\s+', ' ', 'g'), 90) AS statement FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) ORDER BY total_plan_time DESC LIMIT 8"
echo "rows read by scanning whole tables, per order (a growing table read whole at each call shows here; the outbox and the small tables are read so by design):"
psql "$DATABASE_URL" -P pager=off -c "SELECT relname AS table, seq_scan AS scans, round(seq_tup_read::numeric / $orders, 1) AS rows_scanned_per_order, n_live_tup AS rows_now FROM pg_stat_user_tables WHERE seq_tup_read > 0 ORDER BY seq_tup_read DESC LIMIT 10"
echo "statements run on a kept generic plan (calls - plans: calls not planned; such a plan was made once, on the tables as they were then, maybe before the run; statements inside functions and triggers included):"
psql "$DATABASE_URL" -P pager=off -c "SELECT round((calls - plans)::numeric / $orders, 2) AS unplanned_per_order, round(calls::numeric / $orders, 2) AS calls_per_order, plans, round(mean_plan_time::numeric, 3) AS plan_ms, round(shared_blks_hit::numeric / calls, 1) AS blocks_per_call, left(regexp_replace(query, '\s+', ' ', 'g'), 90) AS statement FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) AND calls > plans AND query !~* '^\\s*(BEGIN|COMMIT|ROLLBACK|SET|SHOW|LISTEN|SAVEPOINT|RELEASE)\\M' ORDER BY calls - plans DESC LIMIT 15"
echo "JIT: $(sql "SELECT coalesce(sum(jit_functions), 0) || ' functions compiled, ' || round(coalesce(sum(jit_generation_time + jit_inlining_time + jit_optimization_time + jit_emission_time), 0)::numeric / $orders, 3) || ' ms per order' FROM pg_stat_statements"); planning: $(sql "SELECT round(sum(total_plan_time)::numeric / $orders, 3) || ' ms per order' FROM pg_stat_statements")"
if [ -n "${PERF:-}" ]; then
  echo "CPU samples, by program (the thread's name: every service's runtime threads are tokio-rt-worker, told apart by their binary) and shared object:"
  perf report -i "$perf_data" --no-children --sort comm,dso --stdio --percent-limit 1 2>/dev/null | grep -v '^#' | grep -v '^$' | head -25
  echo "the functions with the most samples:"
  perf report -i "$perf_data" --no-children --sort dso,sym --stdio --percent-limit 0.4 2>/dev/null | grep -v '^#' | grep -v '^$' | head -60
fi
if [ "$case" != expiry ]; then
  # The PSP's side of each charge: psp-sim stamps a charge when it creates
  # it, after the injected latency and just before it answers, so the
  # charge was asked for $psp_latency_ms ms before its stamp.
  python3 - "$PSP_URL" >"$dir/psp.csv" <<'PY'
import json, sys, urllib.request
url, cursor = sys.argv[1], None
while True:
    page = json.load(urllib.request.urlopen(f"{url}/v1/payments?limit=1000" + (f"&cursor={cursor}" if cursor else "")))
    for p in page["data"]:
        print(f'{p["reference"]},{p["created_at"]}')
    if not page["has_more"] or not page["data"]:
        break
    cursor = page["next_cursor"]
PY
  sql "CREATE TABLE bench_psp_charges (order_id uuid, created_at timestamptz)" >/dev/null
  psql -q "$DATABASE_URL" -c "\\copy bench_psp_charges FROM '$dir/psp.csv' CSV"
  # Where an order's time goes: each of its events after the one before it
  # (its shipment's events with it), recorded times, p50 and p99; and
  # order.placed → order.confirmed split where the PSP took the charge.
  echo "an order's steps, each from the event before it (recorded times; the two steps through the PSP leave out its injected $psp_latency_ms ms), read after everything above:"
  psql "$DATABASE_URL" -P pager=off -c "WITH e AS (
    SELECT after || ' → ' || type AS step, gap FROM (
      SELECT type, recorded_at - lag(recorded_at) OVER (PARTITION BY o ORDER BY recorded_at, position) AS gap,
             lag(type) OVER (PARTITION BY o ORDER BY recorded_at, position) AS after
      FROM (SELECT *, CASE WHEN type LIKE 'shipment.%' THEN (data->>'order_id')::uuid ELSE stream_id END AS o FROM events) x) y
    WHERE after IS NOT NULL),
  psp AS (
    SELECT c.created_at - interval '$psp_latency_ms ms' - p.recorded_at AS asked, f.recorded_at - c.created_at AS answered
    FROM events p JOIN events f ON f.stream_id = p.stream_id AND f.type = 'order.confirmed.v1'
    JOIN bench_psp_charges c ON c.order_id = p.stream_id WHERE p.type = 'order.placed.v1'),
  steps AS (
    SELECT * FROM e
    UNION ALL SELECT 'order.placed.v1 → the PSP asked to charge', asked FROM psp
    UNION ALL SELECT 'the PSP answered → order.confirmed.v1', answered FROM psp)
    SELECT step, count(*) AS orders,
           round((extract(epoch FROM percentile_cont(0.5) WITHIN GROUP (ORDER BY gap)) * 1000)::numeric, 1) AS p50_ms,
           round((extract(epoch FROM percentile_cont(0.99) WITHIN GROUP (ORDER BY gap)) * 1000)::numeric, 1) AS p99_ms
    FROM steps GROUP BY step HAVING count(*) >= $orders / 100 ORDER BY min(gap) IS NULL, percentile_cont(0.5) WITHIN GROUP (ORDER BY gap) DESC"
fi
if [ "$case" != expiry ]; then
  # Whether the slowest orders came together (a stall) or spread over the
  # load (queueing): the slowest 1% by the second of the load they were
  # placed in.
  echo "the slowest 1% of orders (order.placed → order.confirmed), by the second of the load they were placed in (second 0 began $(sql "SELECT to_char(min(recorded_at), 'HH24:MI:SS.MS TZ') FROM events WHERE type = 'order.placed.v1'")):"
  psql "$DATABASE_URL" -P pager=off -c "WITH l AS ($placed_to_confirmed),
    slowest AS (SELECT * FROM l ORDER BY took DESC LIMIT (SELECT count(*) / 100 FROM l))
    SELECT floor(extract(epoch FROM placed - (SELECT min(placed) FROM l)))::int AS second, count(*) AS orders,
           round((extract(epoch FROM min(took)) * 1000)::numeric, 1) AS fastest_ms, round((extract(epoch FROM max(took)) * 1000)::numeric, 1) AS slowest_ms
    FROM slowest GROUP BY 1 ORDER BY 1"
fi
