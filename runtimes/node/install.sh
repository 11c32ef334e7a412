#!/usr/bin/env bash
# Installs the pinned npm packages of sandcall's Node languages (package-lock.json here:
# sucrase, the TypeScript transpiler) with `npm ci` into DEST (default target/runtimes-node
# of the checkout), and prints the path to give `typescript_transpiler`. Does nothing when
# DEST already holds this lock file's install. Needs node and npm.
#
#   runtimes/node/install.sh [DEST]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
dest="${1:-$root/target/runtimes-node}"

for tool in node npm; do
    if ! command -v "$tool" >/dev/null; then
        echo "runtimes/node: '$tool' is not installed (apt-get install nodejs npm)" >&2
        exit 1
    fi
done
key="$(cat "$here/package-lock.json" "$here/package.json" | sha256sum | cut -c1-16)"
if [ ! -f "$dest/.installed-$key" ]; then
    echo "runtimes/node: installing the pinned packages (npm ci) into $dest" >&2
    rm -rf "$dest"
    mkdir -p "$dest"
    cp "$here/package.json" "$here/package-lock.json" "$dest/"
    # --ignore-scripts: none of these packages needs an install script.
    if ! (cd "$dest" && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error >&2); then
        echo "runtimes/node: npm ci failed" >&2
        rm -rf "$dest"
        exit 1
    fi
    touch "$dest/.installed-$key"
fi
echo "$dest/node_modules/sucrase"
