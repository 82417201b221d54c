#!/usr/bin/env sh
# Makes sure headless Chromium and its WebDriver (chromium, chromedriver) exist: the report's
# browser test renders the HTML report in them (tests/browser.py). Quiet and a no-op when installed.
set -eu

have_chromium() {
    command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1
}

have_chromium && exit 0

if [ "$(id -u)" -eq 0 ]; then
    as_root=""
elif command -v sudo >/dev/null 2>&1; then
    as_root="sudo"
else
    echo "chromium and chromedriver not found, and this user cannot install them." >&2
    echo "Install the Debian packages 'chromium' and 'chromium-driver'" >&2
    echo "(apt-get install chromium chromium-driver) as root, or put chromium and" >&2
    echo "chromedriver on PATH, then run 'make setup' again." >&2
    exit 1
fi

if ! command -v apt-get >/dev/null 2>&1; then
    echo "chromium and chromedriver not found and apt-get is not available:" >&2
    echo "install Chromium and a matching chromedriver on PATH and run 'make setup' again." >&2
    exit 1
fi

echo "Installing headless Chromium (Debian packages 'chromium', 'chromium-driver') for the tests..."
# sudo drops the environment: DEBIAN_FRONTEND goes through env(1).
apt_install() {
    $as_root env DEBIAN_FRONTEND=noninteractive \
        apt-get install -y -q --no-install-recommends chromium chromium-driver
}
if ! apt_install; then
    $as_root apt-get update -q
    apt_install
fi

if ! have_chromium; then
    echo "apt-get installed 'chromium' and 'chromium-driver' but chromium or chromedriver" >&2
    echo "is still not on PATH (expected /usr/bin/chromium and /usr/bin/chromedriver)." >&2
    exit 1
fi
