#!/usr/bin/env bash
# Rewrite requirements/app.lock: pyproject.toml's core dependencies and `app`
# extra (what the app image installs; no dev or trace extras, no torch) resolved in a fresh venv, then frozen.
# Afterwards run ./scripts/test.sh, which installs with the new pins, before committing.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$python" -m venv "$tmp/venv"
"$python" -c "import tomllib; p = tomllib.load(open('pyproject.toml', 'rb'))['project']; print(*p['dependencies'], *p['optional-dependencies']['app'], sep='\n')" >"$tmp/requirements.txt"
"$tmp/venv/bin/python" -m pip install --quiet -r "$tmp/requirements.txt"
"$tmp/venv/bin/python" -m pip check
{
    echo "# Every package the app image installs, pinned: the closure of pyproject.toml's core"
    echo "# dependencies and app extra (no dev or trace extras, no torch), frozen from a fresh venv by"
    echo "# scripts/lock.sh on Python $("$python" -c 'import platform; print(platform.python_version())')."
    echo "# Constraints for the Dockerfile and scripts/test.sh: the image and CI get the same versions."
    "$tmp/venv/bin/python" -m pip freeze
} >requirements/app.lock
echo "wrote requirements/app.lock ($(grep -vc '^#' requirements/app.lock) packages)"
