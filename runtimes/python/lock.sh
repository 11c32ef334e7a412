#!/usr/bin/env bash
# Re-resolves requirements.in into requirements.lock with the sandbox's interpreter
# (Debian's python3), binary wheels only. Run it after changing requirements.in.
set -euo pipefail
cd "$(dirname "$0")"
python="${PYTHON:-/usr/bin/python3}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
"$python" -m venv "$tmp/venv"
"$tmp/venv/bin/python" -m pip install -q --disable-pip-version-check --only-binary :all: -r requirements.in
{
    sed -n '1,4p' requirements.lock
    "$tmp/venv/bin/python" -m pip freeze --all | grep -v '^pip==\|^setuptools=='
} > "$tmp/lock"
mv "$tmp/lock" requirements.lock
