#!/usr/bin/env bash
# Installs packages from the distribution's backports suite, adding that suite's apt
# source first when it is missing. The source is derived from the one this machine's apt
# already uses for the distribution itself (runtimes/apt-source.sh: same mirror, same
# signing key), so no host name is written here. Used for gVisor's `runsc` (plain
# bookworm's lacks the systrap platform) and for QEMU in CI's cgroup v2 machine (a
# machine that already has backports' qemu-utils cannot take plain bookworm's QEMU).
#
#   runtimes/backports.sh PACKAGE...
set -euo pipefail
[ "$#" -gt 0 ] || { echo "usage: $0 PACKAGE..." >&2; exit 2; }

. /etc/os-release
codename="${VERSION_CODENAME:?/etc/os-release names no VERSION_CODENAME}"
target="/etc/apt/sources.list.d/sandcall-${codename}-backports.sources"
if [ ! -f "$target" ]; then
    source="$("$(dirname "$0")/apt-source.sh" "$codename")"
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
    echo "added $target" >&2
fi
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends -t "${codename}-backports" "$@"
