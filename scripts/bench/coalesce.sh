#!/usr/bin/env bash
# Coalesced reservations against the per-row limit, side by side in one run:
#   - the per-row limit: pgbench, 1 client, the bare conditional UPDATE of one row;
#   - pgbench's checkout-shaped transaction (checkout.pgbench.sql), 32 clients;
#   - checkout with CHECKOUT_COALESCE=off and =on, 300 connections, closed loop;
# for one hot SKU and for 10,000 SKUs, then an open loop at 300 orders/s on
# the hot SKU. For the coalesced runs it reports placements per transaction
# (from checkout's histogram), the time a request waits for a lane and the
# group transaction's time, and the CPU each of checkout, PostgreSQL and the
# load generator used.
#   bash scripts/bench/coalesce.sh [seconds-per-phase] [rounds]
# With rounds > 1 it ends with each figure's median over the rounds.
# BIN_DIR=… uses binaries already built (a release build) instead of building.
set -euo pipefail
cd "$(dirname "$0")/../.."
. deploy/setup.sh >&2
secs="${1:-15}"
rounds="${2:-1}"
. scripts/bench/lib.sh
release_bins
start_system checkout
seed_bench_products
on_url="$CHECKOUT_URL"
on_ops="${on_url#http://}"

# A second checkout over the same database, coalescing off.
off_port=$(free_port)
CHECKOUT_ADDR="127.0.0.1:$off_port" CHECKOUT_COALESCE=off RUST_LOG=warn "$bin/checkout" >"$dir/checkout-off.log" 2>&1 &
off_pid=$!
trap 'kill $off_pid 2>/dev/null; [ -n "$up" ] && kill "$up" 2>/dev/null; wait 2>/dev/null; rm -rf "$dir"' EXIT
off_url="http://127.0.0.1:$off_port"
for _ in $(seq 100); do curl -sf "$off_url/readyz" >/dev/null && break; sleep 0.2; done

on_pid=$(pgrep -f "$bin/checkout" | grep -v "^$off_pid\$" | head -1)
pg_cpu() { # CPU seconds (ticks) used so far by this run's PostgreSQL server and its backends
  local pm t=0
  pm=$(head -1 "$dir/data/postgres/data/postmaster.pid")
  for p in "$pm" $(pgrep -P "$pm"); do t=$(( t + $(proc_cpu "$p") )); done
  echo "$t"
}
proc_cpu() { awk '{print $14+$15}' "/proc/$1/stat" 2>/dev/null || echo 0; }
hz=$(getconf CLK_TCK)

cat >"$dir/rowlimit.sql" <<'SQL'
UPDATE stock SET available = available - 1 WHERE sku = 'BENCH-0' AND available >= 1;
SQL
rowlimit() {
  pgbench_tps -n -M prepared -c 1 -j 1 -T "$secs" -f "$dir/rowlimit.sql" "$DATABASE_URL"
}
scrape() { curl -s "http://$on_ops/metrics" | grep -E '^soldonce_checkout_(group_size|group_seconds|queue_wait_seconds)_(bucket|sum|count)' || true; }
# Placements per group (mean, and the share of groups in each size bucket) since the last scrape.
groups() {
  python3 - "$1" "$2" <<'PY'
import re, sys
def read(p):
    d = {}
    for line in open(p):
        m = re.match(r'(\w+?)(_bucket\{le="([^"]+)"\}|_sum|_count) (\S+)', line)
        if m: d[(m.group(1), m.group(3) or m.group(2))] = float(m.group(4))
    return d
b, a = read(sys.argv[1]), read(sys.argv[2])
def delta(k): return a.get(k, 0) - b.get(k, 0)
n = delta(("soldonce_checkout_group_size", "_count"))
if n == 0:
    print("no groups"); sys.exit()
mean = delta(("soldonce_checkout_group_size", "_sum")) / n
les = sorted((float('inf') if k[1] == '+Inf' else float(k[1]), k[1]) for k in a if k[0] == "soldonce_checkout_group_size" and not k[1].startswith('_'))
prev, parts = 0, []
for v, k in les:
    c = delta(("soldonce_checkout_group_size", k))
    if c - prev > 0: parts.append(f"<={k}: {100*(c-prev)/n:.0f}%")
    prev = c
tx = delta(("soldonce_checkout_group_seconds", "_sum")) / n * 1000
reqs = delta(("soldonce_checkout_queue_wait_seconds", "_count"))
wait = delta(("soldonce_checkout_queue_wait_seconds", "_sum")) / reqs * 1000 if reqs else 0
print(f"{int(n)} groups, mean {mean:.1f} placements/group ({', '.join(parts)}); group transaction mean {tx:.1f} ms; lane wait mean {wait:.1f} ms")
PY
}

echo "machine: $(nproc) cores, $(free -g | awk '/Mem:/{print $2}') GiB, $(uname -sr); $(postgres --version); fsync $(psql -qtA "$DATABASE_URL" -c 'SHOW fsync')" | tee "$results"
for round in $(seq "$rounds"); do
  limit=$(rowlimit)
  echo "[round $round] per-row limit (pgbench, 1 client, bare conditional UPDATE of one row): ${limit} tx/s" | tee -a "$results"
  for case in "hot:BENCH-0:1" "10k:BENCH:10000"; do
    IFS=: read -r name sku count <<<"$case"
    floor=$(pgb "$count")
    echo "[round $round][$name] pgbench checkout-shaped transaction, 32 clients: ${floor} tx/s" | tee -a "$results"
    for mode in off on; do
      url=$off_url; [ "$mode" = on ] && url=$on_url
      scrape >"$dir/m.before"
      c0=$(proc_cpu "$( [ "$mode" = on ] && echo "$on_pid" || echo "$off_pid")"); p0=$(pg_cpu)
      /usr/bin/time -f "%U %S" -o "$dir/load.time" "$bin/soldonce" --json load --url "$url" --sku "$sku" --sku-count "$count" \
        --connections 300 --requests $(( secs * 2000 )) --no-verify >"$dir/load.json"
      c1=$(proc_cpu "$( [ "$mode" = on ] && echo "$on_pid" || echo "$off_pid")"); p1=$(pg_cpu)
      scrape >"$dir/m.after"
      read -r rate p50 p99 acc secs_run <<<"$(json accepted_per_second p50_ms p99_ms accepted seconds <"$dir/load.json")"
      cpu=$(python3 -c "
u,s=open('$dir/load.time').read().split()[:2]
w=float('$secs_run'); hz=$hz
print(f'CPU cores busy: checkout {($c1-$c0)/hz/w:.2f}, postgres {($p1-$p0)/hz/w:.2f}, load generator {(float(u)+float(s))/w:.2f}')")
      ratio=$(python3 -c "print(f'{float($rate)/float($limit):.2f}× the per-row limit, {float($rate)/float($floor):.2f}× pgbench')")
      echo "[round $round][$name] checkout coalescing $mode, 300 connections: ${rate} orders/s (p50 ${p50} ms, p99 ${p99} ms; ${acc} accepted) = ${ratio}; ${cpu}" | tee -a "$results"
      [ "$mode" = on ] && echo "[round $round][$name]   groups: $(groups "$dir/m.before" "$dir/m.after")" | tee -a "$results"
    done
  done
  scrape >"$dir/m.before"
  open=$(load --sku BENCH-0 --rate 300 --duration "${secs}s" --no-verify | json accepted_per_second p50_ms p99_ms p999_ms)
  scrape >"$dir/m.after"
  read -r o_rate o_p50 o_p99 o_p999 <<<"$open"
  echo "[round $round][hot] open loop 300/s, coalescing on: ${o_rate} orders/s, p50 ${o_p50} ms, p99 ${o_p99} ms, p99.9 ${o_p999} ms; groups: $(groups "$dir/m.before" "$dir/m.after")" | tee -a "$results"
done
# With more than one round, the medians: judge a ratio on these (the
# per-row limit alone moves by half from one hour to the next here).
if [ "$rounds" -gt 1 ]; then
  python3 - "$results" <<'PY' | tee -a "$results"
import re, sys, statistics as st
limits, runs = [], {}
for line in open(sys.argv[1]):
    m = re.match(r'\[round \d+\] per-row limit .*: ([\d.]+) tx/s', line)
    if m:
        limits.append(float(m.group(1)))
        continue
    m = re.match(r'\[round \d+\]\[(\w+)\] checkout coalescing (on|off), 300 connections: ([\d.]+) orders/s \(p50 [\d.]+ ms, p99 ([\d.]+) ms.*= ([\d.]+)× the per-row limit, ([\d.]+)× pgbench', line)
    if m:
        runs.setdefault((m.group(1), m.group(2)), []).append([float(m.group(i)) for i in (3, 4, 5, 6)])
print(f"medians of {len(limits)} rounds: per-row limit {st.median(limits):,.0f} tx/s")
for (case, mode), rs in runs.items():
    rate, p99, per_row, per_pgbench = (st.median(r[i] for r in rs) for i in range(4))
    print(f"medians [{case}] checkout coalescing {mode}: {rate:,.0f} orders/s, p99 {p99:.1f} ms; {per_row:.2f}× the per-row limit, {per_pgbench:.2f}× pgbench (each ratio taken within its round)")
PY
fi
