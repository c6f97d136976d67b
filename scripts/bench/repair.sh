#!/usr/bin/env bash
# The time to repair a stream that lost N events (default 100,000): N
# order.placed events recorded in PostgreSQL as published (no outbox row),
# an empty stream, then `soldonce stream check` (compare: headers only) and
# `soldonce stream repair` (republish, in order), each timed, and a second
# check that must find nothing missing. Rounds repeat it on a fresh stream.
#   bash scripts/bench/repair.sh [events] [rounds]
# BIN_DIR=… runs binaries already built.
set -euo pipefail
cd "$(dirname "$0")/../.."
. deploy/setup.sh >&2
n="${1:-100000}"
rounds="${2:-3}"
. scripts/bench/lib.sh
release_bins
echo "machine: $(nproc) cores, $(free -g | awk '/Mem:/{print $2}') GiB, $(uname -sr); $(postgres --version)" | tee "$results"
start_system checkout
sql "INSERT INTO events (event_id, stream_id, version, type, data, correlation_id, causation_id, source, recorded_at)
     SELECT gen_random_uuid(), o, 1, 'order.placed.v1',
            jsonb_build_object('order_id', o, 'account_id', '00000000-0000-0000-0000-0000000000be',
                               'lines', jsonb_build_array(jsonb_build_object('sku', 'BENCH-1', 'quantity', 1, 'unit_price_minor', 4990)),
                               'currency', 'BRL', 'total_minor', 4990, 'shipping', null, 'expires_at', now(), 'at', now()),
            o, gen_random_uuid(), 'checkout', now()
     FROM (SELECT gen_random_uuid() AS o FROM generate_series(1, $n)) g" >/dev/null
timed() { # timed CMD…: prints the JSON report line with "wall" added
  local t0 t1; t0=$(date +%s.%N)
  "$@" >"$dir/out.json" || true
  t1=$(date +%s.%N)
  python3 -c "import json; d=json.load(open('$dir/out.json')); d['wall']=$t1-$t0; print(json.dumps(d))"
}
# Deletes the stream through JetStream's API (a raw NATS client: no tool needed).
delete_stream() {
  python3 - "$NATS_URL" <<'PY'
import socket, sys, urllib.parse
u = urllib.parse.urlparse(sys.argv[1].split(',')[0])
s = socket.create_connection((u.hostname, u.port or 4222), timeout=10)
s.recv(4096)
s.sendall(b'CONNECT {"verbose":false,"headers":true}\r\nSUB _INBOX.bench 1\r\n'
          b'PUB $JS.API.STREAM.DELETE.SOLDONCE _INBOX.bench 0\r\n\r\n')
reply = b''
while b'MSG _INBOX.bench' not in reply:
    chunk = s.recv(4096)
    if not chunk:
        break
    reply += chunk
PY
}
for round in $(seq "$rounds"); do
  # No stream at all: `repair` creates it as the services would and republishes every event.
  delete_stream
  repair=$(timed "$bin/soldonce" --json stream repair)
  check=$(timed "$bin/soldonce" --json stream check)
  python3 - "$round" "$repair" "$check" <<'PY' | tee -a "$results"
import json, sys
r, p, c = sys.argv[1], *map(json.loads, sys.argv[2:])
print(f"[round {r}] repair: {p['missing']} of {p['expected']} missing, {p['republished']} republished in {p['wall']:.2f}s "
      f"({p['republished'] / p['wall']:.0f} events/s); check after: {c['missing']} missing, "
      f"{c['scanned']} messages compared in {c['wall']:.2f}s")
PY
done
