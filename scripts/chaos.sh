#!/usr/bin/env bash
# Long chaos runs: every service, nats-server, PostgreSQL and psp-sim killed at
# seeded moments under load, then the promise checked (see the README's
# "Proof under fire"). Usage: bash scripts/chaos.sh [SEEDS]   e.g. 1-20 or 3,7
# CHAOS_SECONDS sets each run's load length; CHAOS_KEEP=1 keeps every folder;
# CHAOS_CLUSTER_SEEDS and CHAOS_FAILOVER_SEEDS pick the cluster and failover runs' seeds.
set -euo pipefail
cd "$(dirname "$0")/.."
. deploy/setup.sh
export CHAOS_SEEDS="${1:-${CHAOS_SEEDS:-1-20}}"
cargo build --workspace --bins --locked
exec cargo test -p soldonce-tests --test main --locked -- chaos:: --nocapture --test-threads 1
