#!/usr/bin/env bash
# The chaos suite over many seeds (default 1-200), as a nightly job: every
# seed's run keeps its folder, and a table of every run's summary is
# printed at the end (and written to chaos-summary.md), with the services
# that exited on their own and were started again. A failing seed's
# folder holds its request history, faults, logs and data.
#   bash scripts/chaos-nightly.sh [seeds] [load-seconds]
# e.g. bash scripts/chaos-nightly.sh 1-200 20
set -uo pipefail
cd "$(dirname "$0")/.."
. deploy/setup.sh >&2
seeds="${1:-1-200}"
secs="${2:-20}"
cargo build --workspace --bins --locked >&2
root="${TMPDIR:-/tmp}/soldonce-chaos"
before=$(date +%s)
CHAOS_SEEDS="$seeds" CHAOS_SECONDS="$secs" CHAOS_KEEP=1 \
  cargo test --locked -p soldonce-tests --test main \
  chaos::every_fault_at_random_moments -- --nocapture --test-threads 1 2>&1 | tee chaos-nightly.log
status=${PIPESTATUS[0]}
python3 - "$root" "$before" <<'PY' | tee chaos-summary.md
import json, os, sys
root, since = sys.argv[1], float(sys.argv[2])
rows = []
for d in sorted(os.listdir(root)) if os.path.isdir(root) else []:
    path = os.path.join(root, d)
    if os.path.getmtime(path) < since:
        continue
    s = os.path.join(path, "summary.json")
    if os.path.exists(s):
        j = json.load(open(s))
        ind = j.get("independent", {})
        exits = j.get("exited_on_their_own", {})
        rows.append((j["shape"], j["seed"], "pass", j["requests"], j["orders"].get("confirmed", 0),
                     sum(j["orders"].values()), j["psp_charges"], j["psp_refunded"],
                     ind.get("captured_minor", ""), ind.get("refunded_minor", ""),
                     ", ".join(f"{k} {v}" for k, v in sorted(exits.items())) or "none",
                     j["seconds"], d))
    else:
        rows.append(("?", d, "FAIL", "", "", "", "", "", "", "", "", "", d))
print("| shape | seed | result | requests | confirmed | orders | PSP charges | refunded | captured (minor) | refunded (minor) | exited on their own | seconds | folder |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
for r in rows:
    print("| " + " | ".join(str(x) for x in r) + " |")
fails = sum(1 for r in rows if r[2] == "FAIL")
print(f"\n{len(rows) - fails} passed, {fails} failed")
PY
exit "$status"
