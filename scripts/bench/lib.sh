# Shared pieces of the development benchmark scripts in scripts/bench (sourced).
# The saga, relay and expiry benches are `soldonce bench saga|compare|relay|expiry`.
dir="$(mktemp -d "${TMPDIR:-/tmp}/soldonce-bench.XXXXXX")"
results="$dir/results.txt"
up=""
trap '[ -n "$up" ] && kill "$up" 2>/dev/null; [ -n "$up" ] && wait "$up" 2>/dev/null; rm -rf "$dir"' EXIT
# release_bins: `bin` is $BIN_DIR when given (binaries already built, e.g. an
# earlier revision's for before/after figures), else a fresh release build.
release_bins() {
  if [ -z "${BIN_DIR:-}" ]; then
    cargo build --release --locked --workspace --bins >&2
    BIN_DIR="$CARGO_TARGET_DIR/release"
  fi
  bin="$BIN_DIR"
}
sql() { psql -qtA "$DATABASE_URL" -c "$1"; }
# Until no order waits for its payment / every confirmed order is delivered.
wait_settled() { while [ "$(sql "SELECT count(*) FROM orders WHERE state = 'payment_pending'")" != "0" ]; do sleep 0.2; done; }
wait_delivered() { while [ "$(sql "SELECT count(*) FROM orders o LEFT JOIN shipments s ON s.order_id = o.id WHERE o.state = 'confirmed' AND s.state IS DISTINCT FROM 'delivered'")" != "0" ]; do sleep 0.2; done; }
# wait_captured: until every delivered order's capture is recorded (capture
# at shipment), at most 60 s; sets $captured to what the run's report says
# of them, so figures taken with captures still outstanding say so.
wait_captured() {
  local left
  for _ in $(seq 300); do
    left=$(sql "SELECT count(*) FROM orders WHERE state = 'confirmed' AND capture IS DISTINCT FROM 'captured' AND capture IS NOT NULL")
    [ "$left" = "0" ] && { captured="every capture recorded"; return 0; }
    sleep 0.2
  done
  captured="$left captures NOT recorded after 60 s (the figures below leave them out)"
  echo "wait_captured: $captured" >&2
}
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
# Benchmarks drive one account far past the default per-account rate limit.
export ACCOUNT_RATE_LIMIT=0
export OUTBOX_RELAY_ADDR="127.0.0.1:$(free_port)"

# start_system SERVICES: soldonce up with only those services, env sourced.
start_system() {
  "$bin/soldonce" up --data-dir "$dir/data" --checkout-addr "127.0.0.1:$(free_port)" --only "$1" >"$dir/up.log" 2>&1 &
  up=$!
  for _ in $(seq 300); do [ -f "$dir/data/env" ] && break; sleep 0.2; done
  [ -f "$dir/data/env" ] || { cat "$dir/up.log"; exit 1; }
  . "$dir/data/env"
  # PG_SETTINGS="name=value …": server settings to try, set on the running
  # server (ALTER SYSTEM and a reload; every backend reads them at its next command).
  if [ -n "${PG_SETTINGS:-}" ]; then
    for setting in $PG_SETTINGS; do sql "ALTER SYSTEM SET ${setting%%=*} = '${setting#*=}'" >/dev/null; done
    sql "SELECT pg_reload_conf()" >/dev/null
  fi
}

seed_bench_products() {
  psql -q "$DATABASE_URL" <<'SQL'
INSERT INTO accounts (id, name) VALUES ('00000000-0000-0000-0000-0000000000be', 'pgbench') ON CONFLICT DO NOTHING;
INSERT INTO products (sku, name, price_minor, currency)
  SELECT 'BENCH-' || i, 'bench product', 4990, 'BRL' FROM generate_series(0, 9999) i ON CONFLICT DO NOTHING;
INSERT INTO stock (sku, available) SELECT 'BENCH-' || i, 1000000000 FROM generate_series(0, 9999) i ON CONFLICT DO NOTHING;
INSERT INTO stock_ledger (sku, movement, d_available, d_reserved, d_sold, reason)
  SELECT 'BENCH-' || i, 'receive', 1000000000, 0, 0, 'benchmark' FROM generate_series(0, 9999) i;
SQL
}

# place_unpaid N: checkout and the relay with a 1 s reservation window, N
# orders over 10,000 SKUs that nobody pays, and once all their windows have
# passed, returns.
place_unpaid() {
  export RESERVATION_TTL=1s
  start_system checkout,outbox-relay
  seed_bench_products
  load --sku BENCH --sku-count 10000 --connections 200 --requests "$1" --no-verify >/dev/null
  while [ "$(sql "SELECT count(*) FROM orders WHERE expires_at > now()")" != "0" ]; do sleep 0.1; done
}
# start_expiry: one expiry process in the background (pid in `expiry`), audit off.
start_expiry() {
  EXPIRY_ADDR="127.0.0.1:$(free_port)" AUDIT_INTERVAL=0 "$bin/expiry" 2>"$dir/expiry.log" &
  expiry=$!
}

load() { "$bin/soldonce" --json load --url "$CHECKOUT_URL" "$@"; }
json() { python3 -c "import json,sys; d=json.load(sys.stdin); print(' '.join(str(d[k]) for k in sys.argv[1:]))" "$@"; }
# pgbench ARGS…: its transactions per second. Its chatter goes aside; if
# it fails (a client aborted: the schema moved under a script), its errors
# are shown and the bench stops, instead of a figure missing.
pgbench_tps() {
  local out
  if ! out=$(pgbench "$@" 2>"$dir/pgbench.err"); then
    echo "pgbench failed:" >&2
    cat "$dir/pgbench.err" >&2
    return 1
  fi
  sed -n 's/^tps = \([0-9.]*\).*/\1/p' <<<"$out"
}
pgb() {
  pgbench_tps -n -M prepared -c 32 -j 2 -T "$secs" -D skus="$1" -f scripts/bench/checkout.pgbench.sql "$DATABASE_URL"
}

# CPU seconds each program used (summed over its processes, from /proc), to a file.
cpu_snap() {
  python3 - "$1" <<'PY'
import json, os, sys, time
use, tick = {'@wall': time.time()}, os.sysconf('SC_CLK_TCK')
for pid in filter(str.isdigit, os.listdir('/proc')):
    try:
        stat = open(f'/proc/{pid}/stat').read()
    except OSError:
        continue
    name, rest = stat[stat.index('(') + 1:stat.rindex(')')], stat[stat.rindex(')') + 2:].split()
    name = name.split('/')[0]  # the kernel's workers (kworker/u8:1-…) as one
    use[name] = use.get(name, 0) + (int(rest[11]) + int(rest[12])) / tick
# Every core's busy time (user, nice, system, irq, softirq, steal): unlike
# the processes' sum, it keeps what processes that exited meanwhile used.
jiffies = open('/proc/stat').readline().split()[1:]
use['@machine'] = sum(int(jiffies[i]) for i in (0, 1, 2, 5, 6, 7)) / tick
json.dump(use, open(sys.argv[1], 'w'))
PY
}
# CPU milliseconds per order between a snapshot and now, machine-wide and by program.
cpu_per_order() {
  cpu_snap "$dir/cpu.now"
  python3 - "$1" "$dir/cpu.now" "$2" <<'PY'
import json, os, sys
b, a, n = json.load(open(sys.argv[1])), json.load(open(sys.argv[2])), float(sys.argv[3])
wall = a.pop('@wall') - b.pop('@wall')
machine = a.pop('@machine', 0) - b.pop('@machine', 0)
used = sorted(((a[k] - b.get(k, 0), k) for k in a), reverse=True)
total = sum(u for u, _ in used if u > 0)
top = ', '.join(f"{k} {u * 1000 / n:.2f}" for u, k in used[:8] if u > 0)
print(f"{total * 1000 / n:.2f} ms per order in all ({top}); the {os.cpu_count()} cores were {100 * machine / (wall * os.cpu_count()):.0f}% busy over {wall:.1f}s (every process, /proc/stat)")
PY
}

# CPU seconds of each process of the private PostgreSQL server, with what
# it served: a connection's application_name (soldonce-checkout, …: each
# service names its connections) or the process's backend type (walwriter,
# autovacuum worker, …), to a file.
pg_cpu_snap() {
  sql "SELECT pid, CASE WHEN backend_type = 'client backend' THEN coalesce(nullif(application_name, ''), 'unnamed client') ELSE backend_type END FROM pg_stat_activity WHERE pid <> pg_backend_pid()" >"$1.pids"
  python3 - "$1" <<'PY'
import json, os, sys
tick, use = os.sysconf('SC_CLK_TCK'), {}
for line in open(sys.argv[1] + '.pids'):
    pid, _, name = line.rstrip('\n').partition('|')
    try:
        stat = open(f'/proc/{pid}/stat').read()
    except OSError:
        continue
    rest = stat[stat.rindex(')') + 2:].split()
    use[pid] = [name, (int(rest[11]) + int(rest[12])) / tick]
json.dump(use, open(sys.argv[1], 'w'))
PY
}
# PostgreSQL's CPU milliseconds per order between a pg_cpu_snap and now, by
# what each process served (a process that ended meanwhile, such as an
# autovacuum worker, is not counted: the total may fall short of the
# postgres figure of cpu_per_order).
pg_cpu_per_order() {
  pg_cpu_snap "$dir/pgcpu.now"
  python3 - "$1" "$dir/pgcpu.now" "$2" <<'PY'
import json, sys
b, a, n = json.load(open(sys.argv[1])), json.load(open(sys.argv[2])), float(sys.argv[3])
by = {}
for pid, (name, cpu) in a.items():
    by[name] = by.get(name, 0) + cpu - (b[pid][1] if pid in b else 0)
total = sum(by.values()) or 1
print(', '.join(f"{k} {v * 1000 / n:.2f} ({100 * v / total:.0f}%)" for k, v in sorted(by.items(), key=lambda kv: -kv[1]) if v > 0))
PY
}

# The relay's commit-to-PubAck histogram, as counts per bucket at the last scrape.
relay_scrape() { curl -s "http://$OUTBOX_RELAY_ADDR/metrics" | grep '^soldonce_outbox_commit_to_puback_seconds_bucket'; }
reset_relay_metrics() { relay_scrape >"$dir/lag.before" || true; }
# p50/p99 bucket bounds of the lag observed since reset_relay_metrics.
relay_lag() {
  relay_scrape >"$dir/lag.after" || true
  python3 - "$dir/lag.before" "$dir/lag.after" <<'PY'
import re, sys
def read(p):
    d = {}
    for line in open(p):
        m = re.search(r'le="([^"]+)"\} (\S+)', line)
        if m: d[m.group(1)] = float(m.group(2))
    return d
b, a = read(sys.argv[1]), read(sys.argv[2])
les = sorted((float('inf') if k == '+Inf' else float(k), k) for k in a)
tot = a.get('+Inf', 0) - b.get('+Inf', 0)
out = []
for q in (0.5, 0.99):
    for v, k in les:
        if a[k] - b.get(k, 0) >= q * tot:
            out.append(f"p{int(q*100)} <= {v*1000:g} ms"); break
print(f"{', '.join(out)} over {int(tot)} events")
PY
}

# relay_throughput N: commits N events with their outbox rows at once and times the relay draining them.
relay_throughput() {
  local n="$1"
  psql -q "$DATABASE_URL" -c "WITH e AS (INSERT INTO events (event_id, stream_id, version, type, data, correlation_id, causation_id, source) SELECT gen_random_uuid(), gen_random_uuid(), 1, 'bench.event.v1', jsonb_build_object('i', i, 'pad', repeat('x', 400)), gen_random_uuid(), gen_random_uuid(), 'bench' FROM generate_series(1, $n) i RETURNING position, xmin) INSERT INTO outbox (position, positions, tx) SELECT position, ARRAY[position], xmin::text::bigint FROM e" >/dev/null
  local start; start=$(date +%s.%N)
  while [ "$(psql -qtA "$DATABASE_URL" -c 'SELECT count(*) FROM outbox')" != "0" ]; do sleep 0.2; done
  python3 -c "import time; t=time.time()-$start; print(f'relay drained {$n} events in {t:.1f}s: {$n/t:.0f} events/s')"
}
