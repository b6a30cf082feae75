#!/usr/bin/env bash
# Prints the PostgreSQL URL the tests should use, or nothing (and why, on stderr) when no
# server can be had. Used by `make test`, `make test-fast` and `make test-long`, as .ci/run
# does it: an HPO_TEST_POSTGRES_URL already set is kept; else the local server
# (127.0.0.1:5432, trust auth, user postgres, database `test`) is found, or started with
# pg_ctlcluster, and its database `test` created if missing.
set -u
if [ -n "${HPO_TEST_POSTGRES_URL:-}" ]; then
    echo "$HPO_TEST_POSTGRES_URL"
    exit 0
fi
host=127.0.0.1 port=5432 user=postgres db=test
if ! command -v pg_isready >/dev/null 2>&1; then
    echo "no PostgreSQL client tools (pg_isready) on this machine" >&2
    exit 0
fi
if ! pg_isready -q -h "$host" -p "$port" 2>/dev/null; then
    version=$(ls /etc/postgresql 2>/dev/null | sort -V | tail -n 1)
    if command -v pg_ctlcluster >/dev/null 2>&1 && [ -n "$version" ]; then
        pg_ctlcluster --skip-systemctl-redirect "$version" main start >/dev/null 2>&1 || true
        for _ in 1 2 3 4 5 6 7 8 9 10; do
            pg_isready -q -h "$host" -p "$port" 2>/dev/null && break
            sleep 1
        done
    fi
fi
if ! pg_isready -q -h "$host" -p "$port" 2>/dev/null; then
    echo "no PostgreSQL server at $host:$port (and none could be started with pg_ctlcluster)" >&2
    exit 0
fi
if command -v psql >/dev/null 2>&1 \
        && ! psql -q -h "$host" -p "$port" -U "$user" -d "$db" -Atc "SELECT 1" >/dev/null 2>&1; then
    createdb -h "$host" -p "$port" -U "$user" "$db" >/dev/null 2>&1 || {
        echo "PostgreSQL at $host:$port: cannot connect as $user to database $db, nor create it" >&2
        exit 0
    }
fi
echo "postgresql+psycopg://$user@$host:$port/$db"
