#!/usr/bin/env bash
# Whole-saga benchmarks on a release build:
#  1. end-to-end latency from the 202 to `confirmed` at 300 orders/s with a
#     20 ms PSP, and the most orders/s the saga settles;
#  2. expiry releases/s for N expired orders, and the audit's time over them.
#   bash deploy/bench/saga.sh [seconds] [expired-orders]
set -euo pipefail
cd "$(dirname "$0")/../.."
. deploy/setup.sh
secs="${1:-20}"
expired="${2:-100000}"
cargo build --release --locked --workspace --bins >&2
bin="$CARGO_TARGET_DIR/release"
. deploy/bench/lib.sh
sql() { psql -qtA "$DATABASE_URL" -c "$1"; }
wait_settled() { while [ "$(sql "SELECT count(*) FROM orders WHERE state = 'payment_pending'")" != "0" ]; do sleep 0.2; done; }

echo "machine: $(nproc) cores, $(free -g | awk '/Mem:/{print $2}') GiB, $(uname -sr); $(postgres --version)" | tee "$results"
if [ -z "${SKIP_E2E:-}" ]; then
export PSP_FAULTS='{"latency_ms": 20}'
start_system psp-sim,checkout,outbox-relay,payment-worker
seed_bench_products
open=$(load --sku BENCH --sku-count 10000 --rate 300 --duration "${secs}s" | json accepted p99_ms)
wait_settled
e2e=$(sql "SELECT round(percentile_cont(0.5) WITHIN GROUP (ORDER BY ms)::numeric, 1) || ' ms / ' || round(percentile_cont(0.99) WITHIN GROUP (ORDER BY ms)::numeric, 1) || ' ms' FROM (SELECT extract(epoch FROM updated_at - created_at) * 1000 AS ms FROM orders WHERE state = 'confirmed') x")
echo "[e2e] 300 orders/s for ${secs}s, PSP latency 20 ms: 202 → confirmed p50 / p99 = $e2e (accepted/HTTP p99: $open)" | tee -a "$results"
sql "TRUNCATE orders, order_lines, events, outbox, idempotency_keys, inbox, webhook_receipts CASCADE" >/dev/null
t0=$(date +%s.%N)
closed=$(load --sku BENCH --sku-count 10000 --connections 300 --requests $(( secs * 600 )) | json accepted accepted_per_second)
wait_settled
read -r acc rate <<<"$closed"
python3 -c "import time; t=time.time()-$t0; print(f'[saga max] {$acc} orders placed at {float(\"$rate\"):.0f}/s, all settled (paid) after {t:.1f}s: {$acc/t:.0f} orders/s through the whole saga')" | tee -a "$results"
kill "$up"; wait "$up" 2>/dev/null || true; up=""
unset DATABASE_URL NATS_URL CHECKOUT_URL SOLDONCE_TOKEN
fi

# Expiry: N orders with a 1 s window and nobody paying, then one expiry process.
rm -rf "$dir/data"
export RESERVATION_TTL=1s
start_system checkout,outbox-relay
seed_bench_products
load --sku BENCH --sku-count 10000 --connections 200 --requests "$expired" --no-verify >/dev/null
sleep 1.1
t0=$(date +%s.%N)
EXPIRY_ADDR="127.0.0.1:$(free_port)" AUDIT_INTERVAL=0 "$bin/expiry" 2>"$dir/expiry.log" &
exp=$!
wait_settled
python3 -c "import time; t=time.time()-$t0; print(f'[expiry] released {$expired} expired orders in {t:.1f}s: {$expired/t:.0f} releases/s (one expiry process)')" | tee -a "$results"
kill "$exp"; wait "$exp" 2>/dev/null || true
audit=$("$bin/soldonce" --json audit --max-outbox-age 100000 | json clean seconds)
echo "[audit] over $(sql 'SELECT count(*) FROM orders') orders / $(sql 'SELECT count(*) FROM events') events: clean, seconds = $audit" | tee -a "$results"
while [ "$(sql 'SELECT count(*) FROM outbox')" != "0" ]; do sleep 0.5; done
replay=$("$bin/soldonce" --json replay | json events events_per_second seconds)
read -r r_events r_rate r_secs <<<"$replay"
echo "[replay] ${r_events} events from the stream, validated, folded and diffed in ${r_secs}s: ${r_rate} events/s" | tee -a "$results"
