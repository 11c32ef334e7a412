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

suite=mcp
. "$root/e2e/lib.sh"

binary="$(sandcall_binary "${1:-}")"
[ $# -gt 0 ] && shift
venv="$root/target/mcp-venv"
pinned_venv "$venv" "$here/requirements.lock"

export SANDCALL_BINARY="$binary"
export SANDCALL_RUNTIME_DIR="${SANDCALL_RUNTIME_DIR:-$root/target/runtimes}"
cd "$here"
# -p no:cacheprovider: nothing written into the source tree.
exec "$venv/bin/python" -m pytest -p no:cacheprovider -q "$@" tests
