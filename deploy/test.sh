#!/usr/bin/env bash
# Runs every test: installs what is missing, then the whole workspace's
# unit and end-to-end tests against private PostgreSQL and NATS servers.
set -euo pipefail
cd "$(dirname "$0")/.."
. deploy/setup.sh
# The end-to-end tests start the service binaries (outbox-relay) as real processes.
cargo build --workspace --bins --locked
cargo test --workspace --locked -- --test-threads 4
