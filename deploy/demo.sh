#!/usr/bin/env bash
# Brings soldonce up on this machine and shows it working: installs what is
# missing to run it, builds the release binaries, starts private PostgreSQL
# and NATS, migrates, seeds, starts the services and runs a 300-buyer flash
# sale for one T-shirt. Pass `--keep` to leave the system running afterwards.
set -euo pipefail
cd "$(dirname "$0")/.."
# Only what building and running needs (PostgreSQL, NATS, a C linker): the
# test command's tools (Spin, promtool, Chromium, faketime) are not installed.
SOLDONCE_SETUP=run . deploy/setup.sh
cargo build --release --locked --workspace --bins
soldonce="$CARGO_TARGET_DIR/release/soldonce"
if [ "${1:-}" = "--keep" ]; then
  shift
  exec "$soldonce" up "$@"
fi
exec "$soldonce" up --demo "$@"
