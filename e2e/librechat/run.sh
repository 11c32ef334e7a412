#!/usr/bin/env bash
# LibreChat's own client (@librechat/agents, pinned in package-lock.json) against a real
# sandcall: installs the pinned packages (npm ci, cached under target/ by the lock file's
# hash), makes an Ed25519 key pair, starts three servers on free loopback ports, runs the
# node:test suite in test/, and stops the servers whatever happens.
#
#   e2e/librechat/run.sh path/to/sandcall [node --test options...]
#   e2e/librechat/run.sh --image IMAGE [node --test options...]
#
# With --image, each server is a container of IMAGE (deploy/Dockerfile) started with
# podman and exactly the rights in deploy/container.args, its port published on
# loopback (.ci/container runs it so, with podman's configuration in its environment).
#
# The servers:
#   - "jwt":  CODEAPI_JWT_PUBLIC_KEY + CODEAPI_JWT_KID, as a LibreChat deployment with JWT
#             on configures it; the tests mint their tokens with the private key.
#   - "open": SANDCALL_ALLOW_UNAUTHENTICATED=true and no credentials, for LibreChat with
#             JWT off (it sends no auth header at all), and no compiled languages'
#             toolchains (toolchain_path at nothing), for the refusal the client tells
#             the model not to retry.
#   - "stateful": as "jwt", with execution_profile = "stateful" (LibreChat's stateful
#             sessions: a conversation's runs share their files).
# Exits non-zero if any test fails, the install fails, or node/npm are missing.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"

if [ $# -lt 1 ]; then
    echo "usage: $0 path/to/sandcall | --image IMAGE [node --test options...]" >&2
    exit 2
fi
image=""
if [ "$1" = --image ]; then
    image="${2:?usage: $0 --image IMAGE [node --test options...]}"
    shift 2
    mapfile -t rights < <(grep -v -e '^#' -e '^[[:space:]]*$' "$root/deploy/container.args")
else
    if [ ! -f "$1" ] || [ ! -x "$1" ]; then
        echo "e2e: $1 is not an executable sandcall binary (build it first: cargo build --release)" >&2
        exit 2
    fi
    binary="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"
    shift
fi

for tool in node npm curl; do
    if ! command -v "$tool" >/dev/null; then
        echo "e2e: '$tool' is not installed; the LibreChat end-to-end suite needs Node.js 20 or later with npm, and curl (e.g. apt-get install nodejs npm curl)" >&2
        exit 1
    fi
done
node_major="$(node -p 'process.versions.node.split(".")[0]')"
if [ "$node_major" -lt 20 ]; then
    echo "e2e: Node.js $(node --version) is too old; the suite needs 20 or later" >&2
    exit 1
fi

# The pinned packages, installed once per lock file (with package.json, so that npm ci
# checks the two agree, and the Node major version) into target/e2e-librechat/<key>/, and
# linked as e2e/librechat/node_modules.
key="$( (cat "$here/package-lock.json" "$here/package.json"; echo "node$node_major") | sha256sum | cut -c1-16)"
cache_root="$root/target/e2e-librechat"
cache="$cache_root/$key"
if [ ! -f "$cache/.installed" ]; then
    echo "e2e: installing the pinned packages (npm ci) into $cache" >&2
    rm -rf "$cache"
    mkdir -p "$cache"
    cp "$here/package.json" "$here/package-lock.json" "$cache/"
    # --ignore-scripts: no install script is needed, and some would phone home.
    if ! (cd "$cache" && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error); then
        echo "e2e: npm ci failed; the suite cannot run" >&2
        rm -rf "$cache"
        exit 1
    fi
    touch "$cache/.installed"
    # Older installs (another lock file) are ~0.5 GiB each: keep only this one.
    find "$cache_root" -mindepth 1 -maxdepth 1 -type d ! -name "$key" -exec rm -rf {} +
fi
if [ -e "$here/node_modules" ] && [ ! -L "$here/node_modules" ]; then
    echo "e2e: $here/node_modules is a directory; remove it (the suite links the cached install there)" >&2
    exit 1
fi
ln -sfn "$cache/node_modules" "$here/node_modules"

work="$(mktemp -d)"
pids=()
containers=()
stop_servers() {
    for container in "${containers[@]}"; do
        podman logs "$container" >"$work/${container##*-}/server.log" 2>&1 || true
        podman rm -f -t 5 -v "$container" >/dev/null 2>&1 || true
    done
    for pid in "${pids[@]}"; do
        kill -TERM "$pid" 2>/dev/null || true
    done
    for pid in "${pids[@]}"; do
        wait "$pid" 2>/dev/null || true
    done
}
trap 'stop_servers; rm -rf "$work"' EXIT
trap 'exit 130' INT TERM

node "$here/lib/jwt.mjs" "$work"
kid="lc-codeapi-2026-05"

free_port() {
    node -e 'const s = require("net").createServer(); s.listen(0, "127.0.0.1", () => { console.log(s.address().port); s.close(); });'
}

# start_container NAME PORT [VAR=value...]: one container of $image, the port published
# on loopback, its log copied to the server's log when it stops. Each has a data directory
# of its own name: the path names the server's cgroup on the host's shared cgroup tree.
start_container() {
    local name="$1" port="$2" var env=()
    shift 2
    for var in "$@"; do
        env+=(-e "$var")
    done
    local container="sandcall-e2e-$$-$name"
    containers+=("$container")
    podman run -d --name "$container" "${rights[@]}" --network slirp4netns -p "127.0.0.1:$port:3112" \
        -e SANDCALL_LOG="${SANDCALL_LOG:-warn}" -e SANDCALL_DATA_DIR="/var/lib/sandcall/$name" "${env[@]}" "$image" >/dev/null 2>"$work/$name/podman.log"
    for _ in $(seq 300); do
        if curl -sf "http://127.0.0.1:$port/v1/health" >/dev/null 2>&1; then
            return 0
        fi
        if [ "$(podman inspect --format '{{.State.Running}}' "$container" 2>/dev/null)" != true ]; then
            break
        fi
        sleep 0.1
    done
    echo "e2e: the $name container did not answer GET /v1/health; its log:" >&2
    cat "$work/$name/podman.log" >&2
    podman logs "$container" >&2 || true
    exit 1
}

# start NAME PORT [VAR=value...]: one server with its own data dir and log.
start() {
    local name="$1" port="$2"
    shift 2
    mkdir -p "$work/$name"
    if [ -n "$image" ]; then
        start_container "$name" "$port" "$@"
        return
    fi
    env SANDCALL_LISTEN="127.0.0.1:$port" \
        SANDCALL_DATA_DIR="$work/$name/data" \
        SANDCALL_LOG="${SANDCALL_LOG:-warn}" \
        "$@" "$binary" serve >"$work/$name/server.log" 2>&1 &
    pids+=($!)
    local pid=$!
    for _ in $(seq 300); do
        if curl -sf "http://127.0.0.1:$port/v1/health" >/dev/null 2>&1; then
            return 0
        fi
        if ! kill -0 "$pid" 2>/dev/null; then
            break
        fi
        sleep 0.1
    done
    echo "e2e: the $name server did not answer GET /v1/health; its log:" >&2
    cat "$work/$name/server.log" >&2
    exit 1
}

jwt_port="$(free_port)"
start jwt "$jwt_port" \
    CODEAPI_JWT_PUBLIC_KEY="$(cat "$work/public.pem")" \
    CODEAPI_JWT_KID="$kid"
open_port="$(free_port)"
start open "$open_port" SANDCALL_ALLOW_UNAUTHENTICATED=true SANDCALL_TOOLCHAIN_PATH='["/nonexistent"]'
stateful_port="$(free_port)"
start stateful "$stateful_port" \
    CODEAPI_JWT_PUBLIC_KEY="$(cat "$work/public.pem")" \
    CODEAPI_JWT_KID="$kid" \
    SANDCALL_EXECUTION_PROFILE=stateful

status=0
(
    cd "$here"
    export LIBRECHAT_CODE_BASEURL="http://127.0.0.1:$jwt_port/v1"
    export E2E_OPEN_BASEURL="http://127.0.0.1:$open_port/v1"
    export E2E_STATEFUL_BASEURL="http://127.0.0.1:$stateful_port/v1"
    export E2E_JWT_PRIVATE_KEY_FILE="$work/private.pem"
    export E2E_JWT_KID="$kid"
    node --test --test-concurrency=1 --test-reporter=spec "$@" test/*.test.mjs
) || status=$?

for container in "${containers[@]}"; do
    podman logs "$container" >"$work/${container##*-}/server.log" 2>&1 || true
done
for name in jwt open stateful; do
    if grep -q "panicked" "$work/$name/server.log"; then
        echo "e2e: the $name server's log holds a panic:" >&2
        grep -m5 "panicked" "$work/$name/server.log" >&2
        status=1
    fi
done
if [ "$status" -ne 0 ] && [ -n "${E2E_SHOW_LOGS:-}" ]; then
    for name in jwt open stateful; do
        echo "--- $name server log ---" >&2
        cat "$work/$name/server.log" >&2
    done
fi
exit "$status"
