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

if [ "$(id -u)" -eq 0 ]; then
    as_root=""
elif command -v sudo >/dev/null 2>&1; then
    as_root="sudo"
else
    echo "PostgreSQL server binaries not found, and this user cannot install them." >&2
    echo "Install the Debian package 'postgresql' (apt-get install postgresql) as root," >&2
    echo "or put initdb and pg_ctl on PATH, then run 'make setup' again." >&2
    exit 1
fi

if ! command -v apt-get >/dev/null 2>&1; then
    echo "PostgreSQL server binaries not found and apt-get is not available:" >&2
    echo "install a PostgreSQL server (initdb, pg_ctl) and run 'make setup' again." >&2
    exit 1
fi

echo "Installing PostgreSQL server (Debian package 'postgresql') for the test suite..."
# sudo drops the environment: DEBIAN_FRONTEND goes through env(1).
apt_install() {
    $as_root env DEBIAN_FRONTEND=noninteractive \
        apt-get install -y -q --no-install-recommends postgresql
}
if ! apt_install; then
    $as_root apt-get update -q
    apt_install
fi

if ! have_postgres; then
    echo "apt-get installed 'postgresql' but no pg_ctl was found under /usr/lib/postgresql." >&2
    exit 1
fi
