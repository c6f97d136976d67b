#!/usr/bin/env bash
# Money-check benchmarks on a release build: how long `soldonce audit` and
# `soldonce reconcile` take, and how much memory they peak at, on large books.
#  1. audit wall time and peak RSS at SMALL and at LARGE confirmed orders;
#  2. reconcile wall time and peak RSS with psp-sim holding SMALL succeeded
#     payments, each the one an order in the database is confirmed on.
#   bash scripts/bench/money.sh [small=100000] [large=1000000]   (large 0: skip)
#   BIN=<dir with soldonce and psp-sim> bash scripts/bench/money.sh   (skips the build)
# Orders are seeded straight into PostgreSQL (scripts/bench/money.seed.sql) as
# the services write them: events, projection, lines, attached payment,
# shipment, ledger rows. Both commands must report clean (exit 0); anything
# else is printed with its first violations and fails the run.
set -euo pipefail
cd "$(dirname "$0")/../.."
. deploy/setup.sh
small="${1:-100000}"
large="${2:-1000000}"
if [ -z "${BIN:-}" ]; then
  cargo build --release --locked -p soldonce-cli -p psp-sim >&2
fi
bin="${BIN:-$CARGO_TARGET_DIR/release}"
. scripts/bench/lib.sh
# lib.sh's trap stops `soldonce up`; ours also stops the psp-sim we start.
psp=""
trap '[ -n "$psp" ] && kill "$psp" 2>/dev/null; [ -n "$psp" ] && wait "$psp" 2>/dev/null
      [ -n "$up" ] && kill "$up" 2>/dev/null; [ -n "$up" ] && wait "$up" 2>/dev/null; rm -rf "$dir"' EXIT
# GNU time gives peak RSS (%M, KiB) of the command itself, not of PostgreSQL.
if [ ! -x /usr/bin/time ]; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq time >/dev/null
fi

# A private PostgreSQL (and NATS) on free 127.0.0.1 ports, as the other benches
# do; `up` wants at least one service, and psp-sim is cheap and sits idle.
start_system psp-sim
sql() { psql -qtA -v ON_ERROR_STOP=1 "$DATABASE_URL" "$@"; }
"$bin/soldonce" migrate >/dev/null

echo "machine: $(nproc) cores, $(free -g | awk '/Mem:/{print $2}') GiB, $(uname -sr); PostgreSQL $(sql -c 'SHOW server_version')" | tee "$results"
echo "| what | scale | wall s | peak RSS MB | client CPU s | result |" | tee -a "$results"
echo "|---|---|---|---|---|---|" | tee -a "$results"

# Orders are placed 1.234567 s apart from midnight 30 days ago, fixed for the
# whole run so the second seeding continues the first one's timeline.
t0=$(( $(date +%s) / 86400 * 86400 - 30 * 86400 ))
seeded=0
# seed_to N: adds orders seeded+1..N in 100,000-order transactions, then
# VACUUM (FREEZE, ANALYZE) so the timed reads pay no hint-bit writes and have
# statistics, as on an autovacuumed production database. Sets took (s).
seed_to() {
  local n="$1" start; start=$(date +%s.%N)
  while [ "$seeded" -lt "$n" ]; do
    local to=$(( seeded + 100000 < n ? seeded + 100000 : n ))
    sql -v from=$(( seeded + 1 )) -v to="$to" -v t0="$t0" -f scripts/bench/money.seed.sql
    seeded=$to
  done
  sql -c 'VACUUM (FREEZE, ANALYZE)'
  took=$(python3 -c "import time; print(f'{time.time()-$start:.1f}')")
}

# timed CMD...: runs CMD under GNU time; sets rc, secs, mb, cpu (the command's
# own user+sys seconds: the rest of the wall time is mostly waiting on
# PostgreSQL or the PSP); output in $dir/out.json.
timed() {
  rc=0
  /usr/bin/time -f '%e %M %U %S' -o "$dir/time" "$@" >"$dir/out.json" 2>"$dir/err" || rc=$?
  read -r secs kb user sys < <(tail -n 1 "$dir/time")  # time prepends a line when the exit code is not 0
  mb=$(( kb / 1024 ))
  cpu=$(python3 -c "print(f'{$user+$sys:.2f}')")
}

# report WHAT SCALE: one table row; when not clean (or not run), the first 10
# violations or findings verbatim, and remembers the failure.
failed=0
report() {
  local verdict
  verdict=$(python3 - "$dir/out.json" "$rc" <<'PY'
import json, sys
try:
    d = json.load(open(sys.argv[1]))
except Exception:
    print(f"NO REPORT (exit {sys.argv[2]})"); sys.exit()
r = d["report"]
items = [f"{v['check']} {v['subject']}: {v['detail']}" for v in r["violations"]] if "violations" in r \
    else [f"{'REPAIRED' if f['repaired'] else 'FINDING'} {f['kind']} {f['subject']}: {f['detail']}" for f in r["findings"]]
facts = f"{r['orders']} orders, {r['events']} events, {r['payments']} payments" if "events" in r \
    else f"{r['payments_seen']} payments ({r['succeeded']} succeeded), {r['confirmed_orders_checked']} confirmed orders, {r['repaired']} repaired"
print(("clean: " if d["clean"] and sys.argv[2] == "0" else f"NOT CLEAN (exit {sys.argv[2]}, {len(items)} listed): ") + facts)
for line in items[:10]:
    print("    " + line)
PY
)
  echo "| $1 | $2 | $secs | $mb | $cpu | ${verdict%%$'\n'*} |" | tee -a "$results"
  case "$verdict" in clean:*) ;; *) failed=1 ;; esac
  { tail -n +2 <<<"$verdict"; [ "$rc" = 0 ] || head -n 5 "$dir/err" | sed 's/^/    /'; } | tee -a "$results"
}

audit_at() {
  seed_to "$1"
  echo "| seed (SQL + VACUUM) | to $1 orders | $took | - | - | - |" | tee -a "$results"
  timed "$bin/soldonce" --json audit
  report "soldonce audit" "$1 orders"
}

audit_at "$small"

# Reconcile: psp-sim's books are its journal, replayed at start; writing the
# journal of the seeded payments is far faster than charging them over HTTP.
mkdir -p "$dir/psp"
sql -v journal="$dir/psp/ledger.jsonl" -f scripts/bench/money.seed.sql
psp_addr="127.0.0.1:$(free_port)"
start=$(date +%s.%N)
PSP_SIM_ADDR="$psp_addr" PSP_SIM_DATA_DIR="$dir/psp" "$bin/psp-sim" >"$dir/psp.log" 2>&1 &
psp=$!
until curl -fs "http://$psp_addr/healthz" >/dev/null; do
  kill -0 "$psp" 2>/dev/null || { cat "$dir/psp.log"; exit 1; }
  sleep 0.1
done
replay=$(python3 -c "import time; print(f'{time.time()-$start:.1f}')")
echo "| psp-sim start (journal replay) | $(wc -l <"$dir/psp/ledger.jsonl") payments | $replay | $(( $(awk '/VmHWM/{print $2}' "/proc/$psp/status") / 1024 )) | - | - |" | tee -a "$results"
PSP_URL="http://$psp_addr" timed "$bin/soldonce" --json reconcile
report "soldonce reconcile" "$small PSP payments"
kill "$psp"; wait "$psp" 2>/dev/null || true; psp=""

# The larger audit continues the same books (it also reads the findings of
# the reconciliation above, which must have left none unrepaired).
if [ "$large" -gt "$small" ]; then
  audit_at "$large"
fi
exit "$failed"
