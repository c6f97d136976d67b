#!/usr/bin/env bash
# Runs every test: installs what is missing, checks formatting, lints
# (clippy with warnings as errors, the API docs without a broken or
# private link, and the layer lines of scripts/lint.sh),
# checks the dependencies (cargo-machete, cargo-deny),
# then the whole workspace's unit and end-to-end tests against private
# PostgreSQL and NATS servers.
set -euo pipefail
cd "$(dirname "$0")/.."
. deploy/setup.sh
cargo fmt --all --check
cargo clippy --workspace --all-targets --locked -- -D warnings
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --locked
bash scripts/lint.sh
# Dependencies: none declared and unused; no crate with a RustSec advisory
# (deny.toml says which one is ignored and why) and none banned.
cargo machete
# The advisories come from the RustSec database on github.com: fetched when
# it can be, else the copy on disk; with neither, said plainly, bans only.
if cargo deny fetch db >/dev/null 2>&1 || compgen -G "$HOME/.cargo/advisory-dbs/*/crates" >/dev/null; then
  cargo deny --locked --offline check --hide-inclusion-graph advisories bans
else
  echo "test: the RustSec advisory database cannot be fetched (github.com unreachable) and no copy is on disk: cargo deny checks bans only" >&2
  cargo deny --locked check --hide-inclusion-graph bans
fi
# The end-to-end tests start the service binaries (outbox-relay) as real processes.
cargo build --workspace --bins --locked
# A failing test's message says what went wrong; a backtrace (when the
# environment asks for one) would push it out of a log's last lines.
RUST_BACKTRACE=0 cargo test --workspace --locked -- --test-threads 4
# deploy/compose.yaml, run for real on a private Docker engine with the
# binaries just built (SOLDONCE_SKIP_COMPOSE=1 skips it where dockerd cannot run).
bash deploy/test-compose.sh
