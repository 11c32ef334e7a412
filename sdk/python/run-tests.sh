#!/usr/bin/env bash
# The Python SDK's pytest suite against a real server: makes (once per pinned lock file and
# Python version) a virtualenv in target/sdk-venv with requirements-test.lock, installs the
# SDK from this folder into it (every run, so the tests use the code as it is now), and
# checks its types with mypy, and runs tests/, whose fixture starts the given sandcall binary on a free loopback port.
#
#   sdk/python/run-tests.sh [path/to/sandcall] [pytest options...]
#                                    (default: target/debug/sandcall; needs root)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"

binary="${1:-$root/target/debug/sandcall}"
[ $# -gt 0 ] && shift
if [ ! -x "$binary" ]; then
    echo "sdk: $binary is not an executable sandcall binary (build it first: cargo build)" >&2
    exit 2
fi
binary="$(cd "$(dirname "$binary")" && pwd)/$(basename "$binary")"

venv="$root/target/sdk-venv"
key="$( (cat "$here/requirements-test.lock"; python3 --version) | sha256sum | cut -c1-16)"
if [ "$(cat "$venv/.installed" 2>/dev/null)" != "$key" ]; then
    echo "sdk: making the test virtualenv in $venv" >&2
    rm -rf "$venv"
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check -r "$here/requirements-test.lock"
    echo "$key" >"$venv/.installed"
fi
# flit_core, the build backend, is in the lock: no build environment is fetched.
"$venv/bin/pip" install --quiet --disable-pip-version-check --no-build-isolation --no-deps \
    --force-reinstall "$here"

# The SDK ships py.typed: its annotations must hold.
"$venv/bin/python" -m mypy --strict --cache-dir "$venv/mypy-cache" "$here/src/sandcall"

export SANDCALL_BINARY="$binary"
export SANDCALL_RUNTIME_DIR="${SANDCALL_RUNTIME_DIR:-$root/target/runtimes}"
cd "$here"
# -p no:cacheprovider: nothing written into the source tree.
exec "$venv/bin/python" -m pytest -p no:cacheprovider -q "$@" tests
