#!/usr/bin/env bash
# Installs gVisor's `runsc` (the `gvisor` isolation tier, docs/isolation.md) from the
# distribution's backports suite, whose `runsc` is recent enough to have the `systrap`
# platform (plain bookworm's is not), through runtimes/backports.sh. Does nothing
# when `runsc` is on PATH already, or at the path given as the first argument.
set -euo pipefail

want="${1:-}"
if [ -n "$want" ] && [ -x "$want" ]; then exit 0; fi
if [ -z "$want" ] && command -v runsc >/dev/null; then exit 0; fi

"$(dirname "$0")/../backports.sh" runsc
runsc --version | head -1
