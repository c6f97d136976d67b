#!/usr/bin/env bash
# Whole-saga benchmarks on a release build, every service running, PSP latency 20 ms:
#  1. per case (one hot SKU, 10,000 SKUs): an open loop at 300 orders/s —
#     202 → confirmed and 202 → delivered percentiles, and the stages in
#     between (relay commit → PubAck, PubAck → consumer, PSP call, consumer
#     batch) — then a closed loop at saturation: accepted and settled orders/s;
#  2. expiry releases/s for N expired orders, and the audit's time over them.
#   bash deploy/bench/saga.sh [seconds] [expired-orders]
# BIN_DIR=… runs binaries already built (e.g. an older build, for before/after);
# SKIP_E2E=1 runs only the expiry part, SKIP_EXPIRY=1 only the saga part,
# SKIP_CLOSED=1 only the open loops of the saga part. Before the saga, each
# case's closed loop runs with checkout alone (SKIP_ALONE=1 skips it), and the
# saga's closed loop is reported against it. PG_SETTINGS="a=1 b=2"
# tries server settings (set with ALTER SYSTEM once the system is up).
# CASES="10k" runs one of the saga's two cases (default "hot 10k").
set -euo pipefail
cd "$(dirname "$0")/../.."
. deploy/setup.sh >&2
secs="${1:-20}"
expired="${2:-100000}"
. deploy/bench/lib.sh
release_bins
# Empties the order tables between phases, once the services have nothing left to do
# (a TRUNCATE racing a service's transaction can deadlock: retried).
reset() {
  wait_settled; wait_delivered; wait_captured
  while [ "$(sql 'SELECT count(*) FROM outbox')" != "0" ]; do sleep 0.2; done
  for _ in 1 2 3 4 5 6 7 8 9 10; do
    sql "TRUNCATE orders, order_lines, events, outbox, idempotency_keys, inbox, webhook_receipts, payments, shipments CASCADE" >/dev/null 2>&1 && return
    sleep 0.5
  done
  echo "could not empty the order tables" >&2; exit 1
}
pct() { # pct SQL-yielding-ms: "p50 / p99 ms"
  sql "SELECT coalesce(round(percentile_cont(0.5) WITHIN GROUP (ORDER BY ms)::numeric, 1)::text, '-') || ' / ' || coalesce(round(percentile_cont(0.99) WITHIN GROUP (ORDER BY ms)::numeric, 1)::text, '-') || ' ms' FROM ($1) x"
}
export PAYMENT_WORKER_ADDR="127.0.0.1:$(free_port)" FULFILLMENT_ADDR="127.0.0.1:$(free_port)"
scrape_all() {
  { curl -s "$CHECKOUT_URL/metrics"; curl -s "http://$OUTBOX_RELAY_ADDR/metrics"; curl -s "http://$PAYMENT_WORKER_ADDR/metrics"; curl -s "http://$FULFILLMENT_ADDR/metrics"; } \
    | grep -E '^soldonce_((checkout_queue_wait|checkout_group|outbox_commit_to_(claim|puback)|consumer_wait|consumer_handle|consumer_transaction|psp_latency)_seconds_(bucket|count)|consumer_(batch|transaction)_size_(sum|count))' || true
}
# Mean messages per batch and per transaction of each consumer between two scrapes.
sizes() {
  python3 - "$1" "$2" <<'PY'
import re, sys, collections
def read(p):
    d = collections.defaultdict(float)
    for line in open(p):
        m = re.match(r'soldonce_consumer_(batch|transaction)_size_(sum|count)\{consumer="([^"]*)"\} (\S+)', line)
        if m: d[(m.group(3), m.group(1), m.group(2))] = float(m.group(4))
    return d
b, a = read(sys.argv[1]), read(sys.argv[2])
def mean(c, kind):
    n = a[(c, kind, 'count')] - b[(c, kind, 'count')]
    return f"{(a[(c, kind, 'sum')] - b[(c, kind, 'sum')]) / n:.1f}" if n > 0 else "-"
print('; '.join(f"{c} {mean(c, 'batch')} per batch, {mean(c, 'transaction')} per transaction" for c in sorted({k[0] for k in a})))
PY
}
# p50/p99 of each stage histogram between two scrapes, interpolated within buckets (as histogram_quantile does).
stages() {
  python3 - "$1" "$2" <<'PY'
import re, sys, collections
def read(p):
    d = collections.defaultdict(dict)
    for line in open(p):
        m = re.match(r'(\w+)_bucket\{(.*)\} (\S+)', line)
        if not m: continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2)))
        le = labels.pop('le')
        key = m.group(1) + ('{' + labels['consumer'] + '}' if 'consumer' in labels else '')
        d[key][float('inf') if le == '+Inf' else float(le)] = float(m.group(3))
    return d
b, a = read(sys.argv[1]), read(sys.argv[2])
out = []
for key in sorted(a):
    les = sorted(a[key])
    cum = [a[key][l] - b.get(key, {}).get(l, 0) for l in les]
    n = cum[-1]
    if n <= 0: continue
    qs = []
    for q in (0.5, 0.99):
        r = q * n; prev_le, prev_c = 0.0, 0.0
        for le, c in zip(les, cum):
            if c >= r:
                v = prev_le if le == float('inf') else prev_le + (le - prev_le) * ((r - prev_c) / max(c - prev_c, 1e-9))
                qs.append(f"{v*1000:.1f}"); break
            prev_le, prev_c = le, c
    name = key.replace('soldonce_', '').replace('_seconds', '')
    out.append(f"{name} p50 {qs[0]} / p99 {qs[1]} ms")
print('; '.join(out))
PY
}

echo "machine: $(nproc) cores, $(free -g | awk '/Mem:/{print $2}') GiB, $(uname -sr); $(postgres --version); binaries: $bin; settings: ${PG_SETTINGS:-defaults}" | tee "$results"
if [ -z "${SKIP_E2E:-}" ]; then
# The yardstick of "≥ 0.8 × what checkout accepts alone in the same run":
# per case, the same closed loop with checkout the only service running.
declare -A alone
if [ -z "${SKIP_CLOSED:-}" ] && [ -z "${SKIP_ALONE:-}" ]; then
  start_system checkout
  seed_bench_products
  for case in "hot:BENCH-0:1" "10k:BENCH:10000"; do
    IFS=: read -r name sku count <<<"$case"
    [[ " ${CASES:-hot 10k} " == *" $name "* ]] || continue
    sql "TRUNCATE orders, order_lines, events, outbox, idempotency_keys CASCADE" >/dev/null
    alone[$name]=$(load --sku "$sku" --sku-count "$count" --connections 300 --requests $(( secs * 1000 )) | json accepted_per_second)
    echo "[$name alone] checkout alone, 300 connections: $(printf '%.0f' "${alone[$name]}") orders accepted/s" | tee -a "$results"
  done
  kill "$up"; wait "$up" 2>/dev/null || true; up=""
  rm -rf "$dir/data"
  unset DATABASE_URL NATS_URL CHECKOUT_URL SOLDONCE_TOKEN
fi
# PSP_FAULTS, when set, replaces the 20 ms PSP (e.g. '{"latency_ms": 20, "drop_webhook_rate": 1}').
psp_20ms='{"latency_ms": 20}'
export PSP_FAULTS="${PSP_FAULTS:-$psp_20ms}" FULFILLMENT_STEP_DELAY=20ms
start_system psp-sim,checkout,outbox-relay,payment-worker,fulfillment
seed_bench_products
for case in "hot:BENCH-0:1" "10k:BENCH:10000"; do
  IFS=: read -r name sku count <<<"$case"
  [[ " ${CASES:-hot 10k} " == *" $name "* ]] || continue
  reset
  scrape_all >"$dir/s.before"; cpu_snap "$dir/cpu.before"
  open=$(load --sku "$sku" --sku-count "$count" --rate 300 --duration "${secs}s" | json accepted p99_ms)
  wait_settled; wait_delivered; wait_captured
  scrape_all >"$dir/s.after"
  # From each order's own events: later events (a capture) move orders.updated_at on.
  confirmed=$(pct "SELECT extract(epoch FROM e.recorded_at - o.created_at) * 1000 AS ms FROM orders o JOIN events e ON e.stream_id = o.id AND e.type = 'order.confirmed.v1' WHERE o.state = 'confirmed'")
  delivered=$(pct "SELECT extract(epoch FROM s.updated_at - o.created_at) * 1000 AS ms FROM orders o JOIN shipments s ON s.order_id = o.id WHERE s.state = 'delivered'")
  captured=$(pct "SELECT extract(epoch FROM e.recorded_at - o.created_at) * 1000 AS ms FROM orders o JOIN events e ON e.stream_id = o.id AND e.type = 'order.captured.v1'")
  echo "[$name open] 300 orders/s for ${secs}s (accepted, HTTP p99: $open): 202 → confirmed p50 / p99 = $confirmed; 202 → delivered = $delivered (warehouse steps of 20 ms); 202 → captured = ${captured:-none}" | tee -a "$results"
  echo "[$name open] stages: $(stages "$dir/s.before" "$dir/s.after")" | tee -a "$results"
  echo "[$name open] messages: $(sizes "$dir/s.before" "$dir/s.after")" | tee -a "$results"
  echo "[$name open] CPU: $(cpu_per_order "$dir/cpu.before" "$(sql 'SELECT count(*) FROM orders')")" | tee -a "$results"
  [ -n "${SKIP_CLOSED:-}" ] && continue
  reset
  t0=$(date +%s.%N); cpu_snap "$dir/cpu.before"
  load --sku "$sku" --sku-count "$count" --connections 300 --requests $(( secs * 1000 )) >"$dir/closed.json"
  closed=$(json accepted accepted_per_second <"$dir/closed.json")
  echo "[$name closed] answers by status: $(python3 -c "import json; print(json.load(open('$dir/closed.json'))['by_status'])")" | tee -a "$results"
  wait_settled
  read -r acc rate <<<"$closed"
  python3 -c "import time; t=time.time()-$t0; a='${alone[$name]:-}'; r=(f'; against checkout alone ({float(a):.0f}/s): accepted {float(\"$rate\")/float(a):.2f}×, settled {$acc/t/float(a):.2f}×' if a else ''); print(f'[$name closed] 300 connections: {$acc} orders accepted at {float(\"$rate\"):.0f}/s; all settled (charged and confirmed) after {t:.1f}s: {$acc/t:.0f} orders/s through the saga{r}')" | tee -a "$results"
  echo "[$name closed] CPU: $(cpu_per_order "$dir/cpu.before" "$acc")" | tee -a "$results"
done
echo "[webhooks] checkout's answers by outcome: $(curl -s "$CHECKOUT_URL/metrics" | grep -E '^soldonce_webhooks_total' | sed -E 's/.*outcome="([^"]*)".* ([0-9.e+]+)$/\1 \2/' | paste -sd, -)" | tee -a "$results"
kill "$up"; wait "$up" 2>/dev/null || true; up=""
unset DATABASE_URL NATS_URL CHECKOUT_URL SOLDONCE_TOKEN PSP_FAULTS FULFILLMENT_STEP_DELAY
fi

[ -n "${SKIP_EXPIRY:-}" ] && exit 0
# Expiry: N orders with a 1 s window and nobody paying, then one expiry process.
rm -rf "$dir/data"
place_unpaid "$expired"
cpu_snap "$dir/cpu.expiry"
t0=$(date +%s.%N)
start_expiry
exp=$expiry
wait_settled
# Counted in the database: a placement that found its SKU sold out placed nothing to release.
released=$(sql "SELECT count(*) FROM orders WHERE state = 'expired'")
python3 -c "import time; t=time.time()-$t0; print(f'[expiry] released {$released} expired orders in {t:.1f}s: {$released/t:.0f} releases/s (one expiry process)')" | tee -a "$results"
# Before expiry exits: its CPU, and its connections' backends, leave /proc with it.
echo "[expiry] CPU: $(cpu_per_order "$dir/cpu.expiry" "$released") (per released order)" | tee -a "$results"
kill "$exp"; wait "$exp" 2>/dev/null || true
audit=$("$bin/soldonce" --json audit --max-outbox-age 100000 | json clean seconds)
echo "[audit] over $(sql 'SELECT count(*) FROM orders') orders / $(sql 'SELECT count(*) FROM events') events: clean, seconds = $audit" | tee -a "$results"
while [ "$(sql 'SELECT count(*) FROM outbox')" != "0" ]; do sleep 0.5; done
replay=$("$bin/soldonce" --json replay | json events events_per_second seconds)
read -r r_events r_rate r_secs <<<"$replay"
echo "[replay] ${r_events} events from the stream, validated, folded and diffed in ${r_secs}s: ${r_rate} events/s" | tee -a "$results"
