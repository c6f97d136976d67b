#!/bin/sh
# What the official nats:*-alpine image's entrypoint does: a command that
# starts with a flag (compose's `-js -sd /data …`) is nats-server's; anything
# else runs as given.
set -e
if [ "$#" -eq 0 ] || [ "${1#-}" != "$1" ]; then
  set -- nats-server "$@"
fi
exec "$@"
