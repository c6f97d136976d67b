#!/usr/bin/env bash
# Checkout benchmark (and the relay's lag under it): `soldonce load` against
# a release build of checkout + outbox-relay, and, in the same run, pgbench
# driving checkout's own statements straight at PostgreSQL (the floor).
#   bash scripts/bench/checkout.sh [seconds-per-phase]
# BIN_DIR=… uses binaries already built instead of building.
set -euo pipefail
cd "$(dirname "$0")/../.."
. deploy/setup.sh
secs="${1:-20}"
. scripts/bench/lib.sh
release_bins
start_system checkout,outbox-relay
seed_bench_products

echo "machine: $(nproc) cores, $(free -g | awk '/Mem:/{print $2}') GiB, $(uname -sr); $(postgres --version)" | tee "$results"
for case in "hot:BENCH-0:1" "10k:BENCH:10000"; do
  IFS=: read -r name sku count <<<"$case"
  closed=$(load --sku "$sku" --sku-count "$count" --connections 300 --requests $(( secs * 1500 )) \
    | json accepted_per_second p50_ms p99_ms p999_ms accepted orders_in_database)
  floor=$(pgb "$count")
  # Let the relay publish pgbench's rows first, so the lag below is the open loop's own.
  while [ "$(psql -qtA "$DATABASE_URL" -c 'SELECT count(*) FROM outbox')" != "0" ]; do sleep 0.2; done
  reset_relay_metrics
  open=$(load --sku "$sku" --sku-count "$count" --rate 300 --duration "${secs}s" \
    | json accepted_per_second p50_ms p99_ms p999_ms accepted orders_in_database)
  lag=$(relay_lag)
  read -r c_rate c_p50 c_p99 c_p999 c_acc c_db <<<"$closed"
  read -r o_rate o_p50 o_p99 o_p999 o_acc o_db <<<"$open"
  ratio=$(python3 -c "print(f'{float($c_rate)/float($floor):.2f}')")
  {
    echo "[$name] closed loop 300 conns: ${c_rate} accepted/s (p50 ${c_p50} ms, p99 ${c_p99} ms, p99.9 ${c_p999} ms; accepted ${c_acc}, in db ${c_db})"
    echo "[$name] pgbench same statements, 32 clients: ${floor} tx/s  → ratio ${ratio}"
    echo "[$name] open loop 300/s: ${o_rate} accepted/s (p50 ${o_p50} ms, p99 ${o_p99} ms, p99.9 ${o_p999} ms; accepted ${o_acc}, in db ${o_db})"
    echo "[$name] relay commit-to-PubAck lag during the open loop: ${lag}"
  } | tee -a "$results"
done
relay_throughput 100000 | tee -a "$results"
