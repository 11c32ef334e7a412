#!/usr/bin/env bash
# Installs gVisor's `runsc` (the `gvisor` isolation tier, docs/isolation.md) from the
# distribution's backports suite, whose `runsc` is recent enough to have the `systrap`
# platform (plain bookworm's is not). The suite's apt source is derived from the source
# this machine's apt already uses for the distribution itself (same mirror, same
# signing key), so no host name is written here. Does nothing when `runsc` is on PATH
# already, or at the path given as the first argument.
set -euo pipefail

want="${1:-}"
if [ -n "$want" ] && [ -x "$want" ]; then exit 0; fi
if [ -z "$want" ] && command -v runsc >/dev/null; then exit 0; fi

. /etc/os-release
codename="${VERSION_CODENAME:?/etc/os-release names no VERSION_CODENAME}"
target="/etc/apt/sources.list.d/sandcall-${codename}-backports.sources"
if [ ! -f "$target" ]; then
    # The deb822 stanza (or one-line entry) that serves "$codename" itself: its URIs and
    # Signed-By serve the backports suite too.
    python3 - "$codename" "$target" <<'PY'
import glob, re, sys
codename, target = sys.argv[1], sys.argv[2]
found = None
for path in sorted(glob.glob("/etc/apt/sources.list.d/*.sources")):
    for stanza in re.split(r"\n\s*\n", open(path).read()):
        fields = {}
        for line in stanza.splitlines():
            if line.startswith("#") or ":" not in line or line[:1].isspace():
                continue
            key, value = line.split(":", 1)
            fields[key.strip().lower()] = value.strip()
        if fields.get("enabled", "yes").lower() == "no":
            continue
        if "deb" in fields.get("types", "").split() and codename in fields.get("suites", "").split():
            found = (fields["uris"], fields.get("components", "main"), fields.get("signed-by"))
            break
    if found:
        break
if not found:
    for path in ["/etc/apt/sources.list"] + sorted(glob.glob("/etc/apt/sources.list.d/*.list")):
        try:
            lines = open(path).read().splitlines()
        except FileNotFoundError:
            continue
        for line in lines:
            m = re.match(r"\s*deb\s+(\[[^]]*\]\s+)?(\S+)\s+(\S+)\s+(.*)", line)
            if m and m.group(3) == codename:
                opts = m.group(1) or ""
                signed = re.search(r"signed-by=(\S+?)\]?(\s|$)", opts)
                found = (m.group(2), m.group(4).strip(), signed.group(1) if signed else None)
                break
        if found:
            break
if not found:
    sys.exit(f"no apt source serves {codename}: cannot derive its backports suite")
uris, components, signed_by = found
with open(target, "w") as out:
    out.write("Types: deb\n")
    out.write(f"URIs: {uris}\n")
    out.write(f"Suites: {codename}-backports\n")
    out.write(f"Components: {components}\n")
    if signed_by:
        out.write(f"Signed-By: {signed_by}\n")
print(f"added {target}")
PY
fi
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq -t "${codename}-backports" runsc
runsc --version | head -1
