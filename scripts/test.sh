#!/usr/bin/env bash
# Install what the tests need (into .venv) and run them. Works on a fresh machine with only
# Python 3.11, pip and apt: `./scripts/test.sh` (extra arguments go to pytest).
set -euo pipefail
cd "$(dirname "$0")/.."

python=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$python" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip
# torch is pinned to the CPU build (2.13.0) by the trace extra; the app's dependencies to the
# versions the Docker image installs (requirements/app.lock, written by scripts/lock.sh).
.venv/bin/python -m pip install --quiet --constraint requirements/app.lock -e '.[app,dev,trace]'

# Debian's package for a test that needs a program, when it can be installed; without it, the
# test skips with a reason.
install_for_test() {  # program, test
    if command -v "$1" >/dev/null 2>&1 || [ -x "/usr/sbin/$1" ]; then
        return
    fi
    if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
        apt-get update -qq >/dev/null && \
            DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$1" >/dev/null || \
            echo "$1 could not be installed: the $2 test will skip" >&2
    else
        echo "$1 missing and apt-get unavailable: the $2 test will skip" >&2
    fi
}
# The browser test drives Debian's Chromium through Playwright (no browser download).
install_for_test chromium browser
# The link-length test sends the app's longest link through the shipped nginx config
# (deploy/nginx/).
install_for_test nginx proxy

.venv/bin/ruff check vram ui pages app.py tests benchmarks
.venv/bin/mypy
exec .venv/bin/python -m pytest "$@"
