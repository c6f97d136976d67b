#!/usr/bin/env bash
# Two release builds side by side in one run: checkout's accepted orders/s
# (closed loop, 300 connections) on one hot SKU and over 10,000 SKUs, and one
# expiry process's releases/s, alternating the builds for ROUNDS rounds on
# fresh systems, then the median of each figure and the ratio after/before.
#   bash scripts/bench/compare-checkout-expiry.sh BEFORE_BIN_DIR AFTER_BIN_DIR [seconds-per-phase] [rounds]
# A bin dir holds checkout, outbox-relay, expiry and soldonce of one build,
# e.g. `git worktree add /tmp/before <rev>` built with `cargo build --release`.
set -euo pipefail
cd "$(dirname "$0")/../.."
. deploy/setup.sh
before="$1" after="$2" secs="${3:-10}" rounds="${4:-3}"
bin="$before"
. scripts/bench/lib.sh
export RESERVATION_TTL=1s
closed() { load --sku "$1" --sku-count "$2" --connections 300 --requests $(( secs * 1500 )) --no-verify | json accepted_per_second; }

# one BIN_DIR: prints "hot 10k expiry" for one fresh system.
one() {
  bin="$1"
  rm -rf "$dir/data"
  start_system checkout,outbox-relay
  seed_bench_products
  local hot tenk n t0 rate
  hot=$(closed BENCH-0 1)
  tenk=$(closed BENCH 10000)
  load --sku BENCH --sku-count 10000 --connections 200 --requests $(( secs * 500 )) --no-verify >/dev/null
  sleep 1.1
  n=$(sql "SELECT count(*) FROM orders WHERE state = 'payment_pending'")
  t0=$(date +%s.%N)
  EXPIRY_ADDR="127.0.0.1:$(free_port)" AUDIT_INTERVAL=0 "$bin/expiry" 2>"$dir/expiry.log" &
  local exp=$!
  while [ "$(sql "SELECT count(*) FROM orders WHERE state = 'payment_pending'")" != "0" ]; do sleep 0.1; done
  rate=$(python3 -c "import time; print(f'{$n/(time.time()-$t0):.0f}')")
  kill "$exp"; wait "$exp" 2>/dev/null || true
  kill "$up"; wait "$up" 2>/dev/null || true; up=""
  unset DATABASE_URL NATS_URL CHECKOUT_URL SOLDONCE_TOKEN
  echo "$hot $tenk $rate"
}

echo "machine: $(nproc) cores, $(free -g | awk '/Mem:/{print $2}') GiB, $(uname -sr); $(postgres --version)" | tee "$results"
for r in $(seq "$rounds"); do
  for side in before after; do
    eval "d=\$$side"
    line=$(one "$d")
    echo "round $r $side: hot $(cut -d' ' -f1 <<<"$line")/s, 10k $(cut -d' ' -f2 <<<"$line")/s, expiry $(cut -d' ' -f3 <<<"$line") releases/s" | tee -a "$results"
    echo "$side $line" >>"$dir/rows"
  done
done
python3 - "$dir/rows" <<'PY' | tee -a "$results"
import statistics, sys
rows = [l.split() for l in open(sys.argv[1])]
med = {s: [statistics.median(float(r[i]) for r in rows if r[0] == s) for i in (1, 2, 3)] for s in ("before", "after")}
for i, name in enumerate(("checkout hot SKU accepted/s", "checkout 10k SKUs accepted/s", "expiry releases/s")):
    b, a = med["before"][i], med["after"][i]
    print(f"median {name}: before {b:.0f}, after {a:.0f}, after/before {a/b:.2f}")
PY
