#!/usr/bin/env bash
# Runs every test: installs what is missing, checks formatting, lints
# (clippy with warnings as errors, and the layer lines of deploy/lint.sh),
# then the whole workspace's unit and end-to-end tests against private
# PostgreSQL and NATS servers.
set -euo pipefail
cd "$(dirname "$0")/.."
. deploy/setup.sh
cargo fmt --all --check
cargo clippy --workspace --all-targets --locked -- -D warnings
bash deploy/lint.sh
# The end-to-end tests start the service binaries (outbox-relay) as real processes.
cargo build --workspace --bins --locked
cargo test --workspace --locked -- --test-threads 4
# deploy/compose.yaml, run for real on a private Docker engine with the
# binaries just built (SOLDONCE_SKIP_COMPOSE=1 skips it where dockerd cannot run).
bash deploy/test-compose.sh
