# Shared by the pytest suites' scripts (e2e/mcp/run.sh, sdk/python/run-tests.sh); sourced,
# not run. Each function prefixes its messages with the suite's name, $suite.

# The sandcall binary to test, as an absolute path: $1, else target/debug/sandcall of
# this checkout ($root). Exits 2 when it is missing.
sandcall_binary() {
    local binary="${1:-$root/target/debug/sandcall}"
    if [ ! -x "$binary" ]; then
        echo "$suite: $binary is not an executable sandcall binary (build it first: cargo build)" >&2
        exit 2
    fi
    echo "$(cd "$(dirname "$binary")" && pwd)/$(basename "$binary")"
}

# Makes the virtualenv $1 with the pinned lock file $2, once per lock file and Python
# version (a key in $1/.installed says which it holds).
pinned_venv() {
    local venv="$1" lock="$2" key
    key="$( (cat "$lock"; python3 --version) | sha256sum | cut -c1-16)"
    if [ "$(cat "$venv/.installed" 2>/dev/null)" != "$key" ]; then
        echo "$suite: making the test virtualenv in $venv" >&2
        rm -rf "$venv"
        python3 -m venv "$venv"
        "$venv/bin/pip" install --quiet --disable-pip-version-check -r "$lock"
        echo "$key" >"$venv/.installed"
    fi
}
