#!/usr/bin/env sh
# Installs Debian packages for the test suite: as root, or through sudo; apt-get update only
# when the first try fails. Usage: apt-install.sh "what they are for" package...
# Called by the ensure-*.sh scripts once they have found their programs missing.
set -eu

purpose="$1"
shift

if [ "$(id -u)" -eq 0 ]; then
    as_root=""
elif command -v sudo >/dev/null 2>&1; then
    as_root="sudo"
else
    echo "$purpose: not found, and this user cannot install it." >&2
    echo "Install the Debian package(s) '$*' (apt-get install $*) as root," >&2
    echo "or put the programs on PATH, then run 'make setup' again." >&2
    exit 1
fi

if ! command -v apt-get >/dev/null 2>&1; then
    echo "$purpose: not found, and apt-get is not available: install it by other means" >&2
    echo "(Debian package(s) '$*') and run 'make setup' again." >&2
    exit 1
fi

echo "Installing $purpose (Debian package(s) '$*') for the test suite..."
# sudo drops the environment: DEBIAN_FRONTEND goes through env(1).
apt_install() {
    $as_root env DEBIAN_FRONTEND=noninteractive \
        apt-get install -y -q --no-install-recommends "$@"
}
if ! apt_install "$@"; then
    $as_root apt-get update -q
    apt_install "$@"
fi
