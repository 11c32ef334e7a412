#!/usr/bin/env bash
# The MCP tests: a real MCP client (the official `mcp` Python package) against
# `sandcall mcp` over stdio and `/mcp` of `sandcall serve` over streamable HTTP, and a
# program that calls the tools of a small MCP server (FastMCP, stdio) that sandcall
# calls as an MCP client. Makes (once per lock file and Python version) a virtualenv in
# target/mcp-venv with requirements.lock, then runs tests/ with pytest.
#
#   e2e/mcp/run.sh [path/to/sandcall] [pytest options...]
#                                   (default: target/debug/sandcall; needs root)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"

binary="${1:-$root/target/debug/sandcall}"
[ $# -gt 0 ] && shift
if [ ! -x "$binary" ]; then
    echo "mcp: $binary is not an executable sandcall binary (build it first: cargo build)" >&2
    exit 2
fi
binary="$(cd "$(dirname "$binary")" && pwd)/$(basename "$binary")"

venv="$root/target/mcp-venv"
key="$( (cat "$here/requirements.lock"; python3 --version) | sha256sum | cut -c1-16)"
if [ "$(cat "$venv/.installed" 2>/dev/null)" != "$key" ]; then
    echo "mcp: making the test virtualenv in $venv" >&2
    rm -rf "$venv"
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check -r "$here/requirements.lock"
    echo "$key" >"$venv/.installed"
fi

export SANDCALL_BINARY="$binary"
export SANDCALL_RUNTIME_DIR="${SANDCALL_RUNTIME_DIR:-$root/target/runtimes}"
cd "$here"
# -p no:cacheprovider: nothing written into the source tree.
exec "$venv/bin/python" -m pytest -p no:cacheprovider -q "$@" tests
