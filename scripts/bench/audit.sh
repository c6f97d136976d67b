#!/usr/bin/env bash
# The hot SKU's drop while audits run back to back, against no audit: a
# history of H orders over 10,000 SKUs (default 200,000) with one recorded
# full audit, then per round closed-loop drops of one SKU (300
# connections), modes alternated: none, `soldonce audit` (full pass) in a
# loop, `soldonce audit --incremental --pace 0.25` in a loop (as expiry's
# periodic audit runs, AUDIT_PACE), and the same unpaced (`--pace 1`). Prints
# accepted orders/s per mode and round, the medians, each mode's ratio to
# no audit, and how many audits ran with their median duration.
#   bash scripts/bench/audit.sh [history] [seconds-per-drop] [rounds]
# BIN_DIR=… runs binaries already built.
set -euo pipefail
cd "$(dirname "$0")/../.."
. deploy/setup.sh >&2
history="${1:-200000}"
secs="${2:-15}"
rounds="${3:-3}"
. scripts/bench/lib.sh
release_bins
echo "machine: $(nproc) cores, $(free -g | awk '/Mem:/{print $2}') GiB, $(uname -sr); $(postgres --version)" | tee "$results"
start_system checkout,outbox-relay
seed_bench_products
load --sku BENCH --sku-count 10000 --connections 200 --requests "$history" --no-verify >/dev/null
# The incremental audit starts from a recorded run.
"$bin/soldonce" audit >/dev/null || true

# audits MODE: runs the audit back to back until killed, one duration per line.
audits() {
  local flag=""
  [ "$1" = incremental ] && flag="--incremental --pace 0.25"
  [ "$1" = unpaced ] && flag="--incremental --pace 1"
  while true; do
    "$bin/soldonce" --json audit $flag 2>/dev/null | python3 -c 'import json,sys; print(json.load(sys.stdin)["seconds"])' 2>/dev/null || true
  done
}
for round in $(seq "$rounds"); do
  for mode in none full incremental unpaced; do
    auditor=""
    if [ "$mode" != none ]; then
      audits "$mode" >"$dir/audits.$mode.$round" &
      auditor=$!
    fi
    rate=$(load --sku BENCH-0 --sku-count 1 --connections 300 --requests $(( secs * 6000 )) --no-verify | json accepted_per_second)
    if [ -n "$auditor" ]; then
      kill "$auditor" 2>/dev/null; wait "$auditor" 2>/dev/null || true
      pkill -f "soldonce --json audit" 2>/dev/null || true
    fi
    echo "$mode $round $rate" | tee -a "$dir/rates"
  done
done
python3 - "$dir" "$rounds" <<'PY' | tee -a "$results"
import statistics, sys, glob
d, rounds = sys.argv[1], int(sys.argv[2])
rates = {}
for line in open(f"{d}/rates"):
    mode, _, rate = line.split()
    rates.setdefault(mode, []).append(float(rate))
base = statistics.median(rates["none"])
for mode in ("none", "full", "incremental", "unpaced"):
    med = statistics.median(rates[mode])
    runs = [float(x) for f in glob.glob(f"{d}/audits.{mode}.*") for x in open(f).read().split()]
    audits = f"; {len(runs)} audits, median {statistics.median(runs):.2f} s" if runs else ""
    print(f"{mode}: median {med:,.0f} accepted/s (rounds {', '.join(f'{r:,.0f}' for r in rates[mode])}), {med / base:.2f}x no audit{audits}")
PY
