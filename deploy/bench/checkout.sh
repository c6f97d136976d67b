#!/usr/bin/env bash
# Checkout benchmark: `soldonce load` against a release build, and, in the
# same run, pgbench driving checkout's own statements straight at
# PostgreSQL (the floor). Prints accepted orders/s, latencies and ratios.
#   bash deploy/bench/checkout.sh [seconds-per-phase]
set -euo pipefail
cd "$(dirname "$0")/../.."
. deploy/setup.sh
secs="${1:-20}"
cargo build --release --locked --workspace --bins >&2
bin="$CARGO_TARGET_DIR/release"
dir="$(mktemp -d "${TMPDIR:-/tmp}/soldonce-bench.XXXXXX")"
trap 'kill "$up" 2>/dev/null; wait "$up" 2>/dev/null; rm -rf "$dir"' EXIT
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$bin/soldonce" up --data-dir "$dir" --checkout-addr "127.0.0.1:$port" >"$dir/up.log" 2>&1 &
up=$!
for _ in $(seq 300); do [ -f "$dir/env" ] && break; sleep 0.2; done
[ -f "$dir/env" ] || { cat "$dir/up.log"; exit 1; }
. "$dir/env"
export RESERVATION_TTL=1h

psql -q "$DATABASE_URL" <<'SQL'
INSERT INTO accounts (id, name) VALUES ('00000000-0000-0000-0000-0000000000be', 'pgbench') ON CONFLICT DO NOTHING;
INSERT INTO products (sku, name, price_minor, currency)
  SELECT 'BENCH-' || i, 'bench product', 4990, 'BRL' FROM generate_series(0, 9999) i ON CONFLICT DO NOTHING;
INSERT INTO stock (sku, available) SELECT 'BENCH-' || i, 1000000000 FROM generate_series(0, 9999) i ON CONFLICT DO NOTHING;
INSERT INTO stock_ledger (sku, movement, d_available, d_reserved, d_sold, reason)
  SELECT 'BENCH-' || i, 'receive', 1000000000, 0, 0, 'benchmark' FROM generate_series(0, 9999) i;
SQL

results="$dir/results.txt"
load() { "$bin/soldonce" --json load --url "$CHECKOUT_URL" --token "$SOLDONCE_TOKEN" "$@"; }
pgb() {
  pgbench -n -M prepared -c 32 -j 2 -T "$secs" -D skus="$1" -f deploy/bench/checkout.pgbench.sql "$DATABASE_URL" 2>/dev/null \
    | sed -n 's/^tps = \([0-9.]*\).*/\1/p'
}
json() { python3 -c "import json,sys; d=json.load(sys.stdin); print(' '.join(str(d[k]) for k in sys.argv[1:]))" "$@"; }

echo "machine: $(nproc) cores, $(free -g | awk '/Mem:/{print $2}') GiB, $(uname -sr); $(postgres --version)" | tee "$results"
for case in "hot:BENCH-0:1" "10k:BENCH:10000"; do
  IFS=: read -r name sku count <<<"$case"
  reqs=$(( secs * 1500 ))
  closed=$(load --sku "$sku" --sku-count "$count" --connections 300 --requests "$reqs" \
    | json accepted_per_second p50_ms p99_ms p999_ms accepted orders_in_database)
  floor=$(pgb "$count")
  open=$(load --sku "$sku" --sku-count "$count" --rate 300 --duration "${secs}s" \
    | json accepted_per_second p50_ms p99_ms p999_ms accepted orders_in_database)
  read -r c_rate c_p50 c_p99 c_p999 c_acc c_db <<<"$closed"
  read -r o_rate o_p50 o_p99 o_p999 o_acc o_db <<<"$open"
  ratio=$(python3 -c "print(f'{float($c_rate)/float($floor):.2f}')")
  {
    echo "[$name] closed loop 300 conns: ${c_rate} accepted/s (p50 ${c_p50} ms, p99 ${c_p99} ms, p99.9 ${c_p999} ms; accepted ${c_acc}, in db ${c_db})"
    echo "[$name] pgbench same statements, 32 clients: ${floor} tx/s  → ratio ${ratio}"
    echo "[$name] open loop 300/s: ${o_rate} accepted/s (p50 ${o_p50} ms, p99 ${o_p99} ms, p99.9 ${o_p999} ms; accepted ${o_acc}, in db ${o_db})"
  } | tee -a "$results"
done
