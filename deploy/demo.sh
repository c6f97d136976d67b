#!/usr/bin/env bash
# Brings soldonce up on this machine and shows it working: installs what is
# missing, builds the release binaries, starts private PostgreSQL and NATS,
# migrates, seeds, starts the services and runs a 300-buyer flash sale for
# one T-shirt. Pass `--keep` to leave the system running afterwards.
set -euo pipefail
cd "$(dirname "$0")/.."
. deploy/setup.sh
cargo build --release --locked --workspace --bins
soldonce="$CARGO_TARGET_DIR/release/soldonce"
if [ "${1:-}" = "--keep" ]; then
  shift
  exec "$soldonce" up "$@"
fi
exec "$soldonce" up --demo "$@"
