#!/usr/bin/env sh
# Makes sure PostgreSQL server binaries (initdb, pg_ctl, postgres) exist: the test suite starts a
# throw-away server on loopback (tests/postgres_server.py). Quiet and a no-op when installed.
set -eu

have_postgres() {
    for f in /usr/lib/postgresql/*/bin/pg_ctl; do
        [ -x "$f" ] && return 0
    done
    command -v pg_ctl >/dev/null 2>&1 && command -v initdb >/dev/null 2>&1
}

have_postgres && exit 0
sh "$(dirname "$0")/apt-install.sh" "the PostgreSQL server (initdb, pg_ctl)" postgresql

if ! have_postgres; then
    echo "apt-get installed 'postgresql' but no pg_ctl was found under /usr/lib/postgresql." >&2
    exit 1
fi
