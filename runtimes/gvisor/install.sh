#!/usr/bin/env bash
# Installs gVisor's `runsc` (the `gvisor` isolation tier, docs/isolation.md) from the
# distribution's backports suite, whose `runsc` is recent enough to have the `systrap`
# platform (plain bookworm's is not). The suite's apt source is derived from the source
# this machine's apt already uses for the distribution itself (same mirror, same
# signing key; runtimes/apt-source.sh), so no host name is written here. Does nothing
# when `runsc` is on PATH already, or at the path given as the first argument.
set -euo pipefail

want="${1:-}"
if [ -n "$want" ] && [ -x "$want" ]; then exit 0; fi
if [ -z "$want" ] && command -v runsc >/dev/null; then exit 0; fi

. /etc/os-release
codename="${VERSION_CODENAME:?/etc/os-release names no VERSION_CODENAME}"
target="/etc/apt/sources.list.d/sandcall-${codename}-backports.sources"
if [ ! -f "$target" ]; then
    # The source that serves "$codename" itself (runtimes/apt-source.sh): its URIs and
    # Signed-By serve the backports suite too.
    source="$("$(dirname "$0")/../apt-source.sh" "$codename")"
    eval "$source"
    {
        echo "Types: deb"
        echo "URIs: $APT_URIS"
        echo "Suites: ${codename}-backports"
        echo "Components: $APT_COMPONENTS"
        if [ -n "$APT_SIGNED_BY" ]; then
            echo "Signed-By: $APT_SIGNED_BY"
        fi
    } >"$target"
    echo "added $target"
fi
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq -t "${codename}-backports" runsc
runsc --version | head -1
