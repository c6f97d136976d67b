#!/usr/bin/env bash
# The relay's drain after autovacuum analyzed the outbox nearly empty (the
# state a queue table is often analyzed in, between two bursts): 8,000 rows
# written, all but 20 relayed, VACUUM ANALYZE (keeping the file's pages, as
# the relay's own vacuum does), then N rows committed at once and one relay
# started; reports events/s until the outbox is empty, or what it managed in
# 120 s.
#   bash deploy/bench/relay.sh [rows] [rounds]
# BIN_DIR=… runs binaries already built; BIN_DIRS="dir1 dir2" alternates
# several builds in one run (before/after). LEFT=0 leaves no row before the
# vacuum (then the planner counts any backlog as one row).
set -euo pipefail
cd "$(dirname "$0")/../.."
. deploy/setup.sh >&2
n="${1:-50000}"
rounds="${2:-2}"
. deploy/bench/lib.sh
if [ -z "${BIN_DIRS:-}" ]; then release_bins; BIN_DIRS="$bin"; fi
bin="${BIN_DIRS%% *}"
echo "machine: $(nproc) cores, $(free -g | awk '/Mem:/{print $2}') GiB, $(uname -sr); $(postgres --version)" | tee "$results"
start_system checkout
rows() {
  sql "INSERT INTO outbox (id, stream_id, subject, payload) SELECT gen_random_uuid(), gen_random_uuid(), 'soldonce.bench.relay.x', jsonb_build_object('pad', repeat('x', 600)) FROM generate_series(1, $1)" >/dev/null
}
for round in $(seq "$rounds"); do
  for b in $BIN_DIRS; do
    sql "DELETE FROM outbox" >/dev/null
    rows 8000
    sql "DELETE FROM outbox WHERE position % (8000 / greatest(${LEFT:-20}, 1)) <> 0 OR ${LEFT:-20} = 0" >/dev/null
    sql "VACUUM (ANALYZE, TRUNCATE false) outbox" >/dev/null
    rows "$n"
    total=$(sql "SELECT count(*) FROM outbox")
    t0=$(date +%s.%N)
    OUTBOX_RELAY_ADDR="127.0.0.1:$(free_port)" RUST_LOG=error "$b/outbox-relay" 2>/dev/null &
    relay=$!
    while :; do
      left=$(sql "SELECT count(*) FROM outbox")
      now=$(date +%s.%N)
      [ "$left" = 0 ] && break
      python3 -c "import sys; sys.exit(0 if $now - $t0 < 120 else 1)" || break
      sleep 0.2
    done
    kill "$relay"; wait "$relay" 2>/dev/null || true
    python3 -c "t = $now - $t0; d = $total - $left; print(f'[round $round] $b: {d} of $total rows relayed in {t:.1f}s: {d / t:.0f} events/s')" | tee -a "$results"
  done
done
