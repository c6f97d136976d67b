#!/usr/bin/env bash
# Two release builds side by side through the whole saga: `saga.sh` (every
# service, PSP latency 20 ms; per case an open loop at 300 orders/s, then a
# closed loop at saturation) on a fresh system per build, the builds
# alternated for ROUNDS rounds, then the median of each figure per build and
# the ratio after/before. On a shared machine one round can differ from the
# next by 10% or more, all programs alike: a change is only seen in medians
# of rounds taken in turn.
#   bash deploy/bench/saga-compare.sh BEFORE_BIN_DIR AFTER_BIN_DIR [seconds] [rounds]
# A bin dir holds one build's checkout, outbox-relay, payment-worker,
# fulfillment, psp-sim and soldonce (`cargo build --release`, copied aside).
# CASES and PG_SETTINGS pass through to saga.sh; BEFORE_ENV / AFTER_ENV
# ("NAME=value …") set variables for one side only, e.g. to compare one build
# with itself under two settings: BEFORE_ENV="RUST_LOG=warn".
set -euo pipefail
cd "$(dirname "$0")/../.."
[ $# -ge 2 ] || { echo "usage: saga-compare.sh BEFORE_BIN_DIR AFTER_BIN_DIR [seconds] [rounds]" >&2; exit 2; }
before="$1" after="$2" secs="${3:-15}" rounds="${4:-3}"
for d in "$before" "$after"; do
  for b in checkout outbox-relay payment-worker fulfillment psp-sim soldonce; do
    [ -x "$d/$b" ] || { echo "saga-compare.sh: $d has no $b (a bin dir holds one release build's binaries)" >&2; exit 2; }
  done
done
[[ "$secs" =~ ^[1-9][0-9]*$ && "$rounds" =~ ^[1-9][0-9]*$ ]] || { echo "saga-compare.sh: seconds and rounds are positive whole numbers" >&2; exit 2; }
out="$(mktemp -d "${TMPDIR:-/tmp}/soldonce-saga-compare.XXXXXX")"
trap 'rm -rf "$out"' EXIT
echo "machine: $(nproc) cores, $(free -g | awk '/Mem:/{print $2}') GiB, $(uname -sr); before: $before ${BEFORE_ENV:-}; after: $after ${AFTER_ENV:-}"
for r in $(seq "$rounds"); do
  for side in before after; do
    if [ "$side" = before ]; then d="$before" extra="${BEFORE_ENV:-}"; else d="$after" extra="${AFTER_ENV:-}"; fi
    # shellcheck disable=SC2086 # word splitting of "NAME=value …" is the point
    env $extra SKIP_EXPIRY=1 SKIP_ALONE=1 BIN_DIR="$d" bash deploy/bench/saga.sh "$secs" >"$out/$side.$r" 2>"$out/$side.$r.err" \
      || { echo "saga-compare.sh: round $r ($side) failed:" >&2; tail -n 20 "$out/$side.$r.err" >&2; exit 1; }
    echo "round $r $side: $(grep -E '^\[(hot|10k) closed\] 300' "$out/$side.$r" | sed -E 's/^\[([a-z0-9]+) closed\].* ([0-9]+) orders\/s through the saga.*/\1 settled \2\/s/' | paste -sd, -)"
  done
done
python3 - "$out" "$rounds" <<'PY'
import re, statistics, sys, collections
out, rounds = sys.argv[1], int(sys.argv[2])
# (case, figure) -> side -> values, one per round
fig = collections.defaultdict(lambda: collections.defaultdict(list))
order = []
def add(case, name, side, value):
    if (case, name) not in order: order.append((case, name))
    fig[(case, name)][side].append(value)
for side in ("before", "after"):
    for r in range(1, rounds + 1):
        for line in open(f"{out}/{side}.{r}"):
            m = re.match(r"\[(\w+) (open|closed)\] (.*)", line)
            if not m: continue
            case, loop, text = m.groups()
            if loop == "open" and "202 → confirmed" in text:
                c = re.search(r"202 → confirmed p50 / p99 = ([\d.]+) / ([\d.]+) ms; 202 → delivered = [\d.]+ / ([\d.]+) ms", text)
                if c:
                    add(case, "open: 202 → confirmed p99 (ms)", side, float(c.group(2)))
                    add(case, "open: 202 → delivered p99 (ms)", side, float(c.group(3)))
                c = re.search(r"202 → captured = [\d.]+ / ([\d.]+) ms", text)
                if c:
                    add(case, "open: 202 → captured p99 (ms)", side, float(c.group(1)))
            elif loop == "open" and text.startswith("stages:"):
                c = re.search(r"outbox_commit_to_puback p50 [\d.]+ / p99 ([\d.]+) ms", text)
                if c: add(case, "open: commit → PubAck p99 (ms)", side, float(c.group(1)))
            elif loop == "closed" and " orders accepted at " in text:
                c = re.search(r"accepted at (\d+)/s; .* ([\d]+) orders/s through the saga", text)
                if c:
                    add(case, "closed: accepted orders/s", side, float(c.group(1)))
                    add(case, "closed: settled orders/s", side, float(c.group(2)))
            elif text.startswith("CPU:"):
                c = re.search(r"CPU: ([\d.]+) ms per order in all \(([^)]*)\)", text)
                if c:
                    add(case, f"{loop}: CPU per order, all programs (ms)", side, float(c.group(1)))
                    for prog, v in re.findall(r"([\w-]+) ([\d.]+)", c.group(2)):
                        if prog in ("postgres", "checkout", "payment-worker", "outbox-relay", "fulfillment", "nats-server", "psp-sim"):
                            add(case, f"{loop}: CPU per order, {prog} (ms)", side, float(v))
print(f"medians of {rounds} round(s), the builds alternated:")
for key in order:
    b, a = fig[key]["before"], fig[key]["after"]
    if not b or not a: continue
    mb, ma = statistics.median(b), statistics.median(a)
    ratio = f"{ma / mb:.2f}" if mb else "-"
    vals = lambda xs: ", ".join(f"{x:g}" for x in xs)
    print(f"  {key[0]:>3} {key[1]:<42} before {mb:8.2f} ({vals(b)})  after {ma:8.2f} ({vals(a)})  after/before {ratio}")
PY
