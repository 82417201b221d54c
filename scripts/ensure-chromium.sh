#!/usr/bin/env sh
# Makes sure headless Chromium and its WebDriver (chromium, chromedriver) exist: the report's
# browser test renders the HTML report in them (tests/browser.py). Quiet and a no-op when installed.
set -eu

have_chromium() {
    command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1
}

have_chromium && exit 0
sh "$(dirname "$0")/apt-install.sh" "headless Chromium and chromedriver" chromium chromium-driver

if ! have_chromium; then
    echo "apt-get installed 'chromium' and 'chromium-driver' but chromium or chromedriver" >&2
    echo "is still not on PATH (expected /usr/bin/chromium and /usr/bin/chromedriver)." >&2
    exit 1
fi
