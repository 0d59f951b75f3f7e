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

# The browser test drives Debian's Chromium through Playwright (no browser download).
if ! command -v chromium >/dev/null 2>&1; then
    if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
        apt-get update -qq >/dev/null && \
            DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null || \
            echo "chromium could not be installed: the browser test will skip" >&2
    else
        echo "chromium missing and apt-get unavailable: the browser test will skip" >&2
    fi
fi

# The link-length test sends the app's longest link through the shipped nginx config
# (deploy/nginx/), with Debian's nginx; it skips with a reason when nginx cannot be installed.
if ! command -v nginx >/dev/null 2>&1 && [ ! -x /usr/sbin/nginx ]; then
    if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
        apt-get update -qq >/dev/null && \
            DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nginx >/dev/null || \
            echo "nginx could not be installed: the proxy test will skip" >&2
    else
        echo "nginx missing and apt-get unavailable: the proxy test will skip" >&2
    fi
fi

.venv/bin/ruff check vram ui pages app.py tests benchmarks
.venv/bin/mypy
exec .venv/bin/python -m pytest "$@"
