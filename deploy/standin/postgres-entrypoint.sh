#!/bin/sh
# The part of the official postgres image's entrypoint compose relies on:
# on first start, a cluster owned by POSTGRES_USER with POSTGRES_PASSWORD
# and a database POSTGRES_DB, reachable over TCP with a password; then the
# server in the foreground, as the postgres user.
set -eu
: "${POSTGRES_USER:=postgres}" "${POSTGRES_DB:=$POSTGRES_USER}"
if [ "${1:-postgres}" = postgres ]; then
  mkdir -p "$PGDATA" && chown -R postgres:postgres "$PGDATA" && chmod 700 "$PGDATA"
  if [ ! -s "$PGDATA/PG_VERSION" ]; then
    pwfile=$(mktemp) && printf '%s' "${POSTGRES_PASSWORD:?POSTGRES_PASSWORD is required}" >"$pwfile" && chown postgres "$pwfile"
    runuser -u postgres -- initdb -D "$PGDATA" -U "$POSTGRES_USER" --pwfile="$pwfile" --auth-local=trust --auth-host=scram-sha-256 -E UTF8 --locale=C.UTF-8 >/dev/null
    rm -f "$pwfile"
    echo "host all all all scram-sha-256" >>"$PGDATA/pg_hba.conf"
    runuser -u postgres -- pg_ctl -D "$PGDATA" -o "-c listen_addresses='' -c unix_socket_directories=/var/run/postgresql" -w start >/dev/null
    if [ "$POSTGRES_DB" != postgres ]; then
      runuser -u postgres -- psql -h /var/run/postgresql -U "$POSTGRES_USER" -d postgres -q -c "CREATE DATABASE \"$POSTGRES_DB\""
    fi
    runuser -u postgres -- pg_ctl -D "$PGDATA" -m fast -w stop >/dev/null
  fi
  shift || true
  exec runuser -u postgres -- postgres -D "$PGDATA" -c listen_addresses='*' -c unix_socket_directories=/var/run/postgresql "$@"
fi
exec "$@"
