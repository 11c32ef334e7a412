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

suite=sdk
. "$root/e2e/lib.sh"

binary="$(sandcall_binary "${1:-}")"
[ $# -gt 0 ] && shift
venv="$root/target/sdk-venv"
pinned_venv "$venv" "$here/requirements-test.lock"
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
