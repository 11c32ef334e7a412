#!/usr/bin/env bash
# Prints the apt source this machine already uses for its distribution's own suite, as
# shell assignments for `eval`, so that scripts that need another suite of the same
# distribution (gVisor's backports) or the distribution itself (the container image's
# debootstrap base) reach the same mirror with the same signing key, and no host name is
# written in the repository:
#
#   source="$(runtimes/apt-source.sh [CODENAME])" && eval "$source"
#   # APT_URIS="http://... [http://...]"  APT_URI (the first)  APT_COMPONENTS  APT_SIGNED_BY
#
# CODENAME defaults to VERSION_CODENAME of /etc/os-release. Reads deb822 files
# (/etc/apt/sources.list.d/*.sources) first, then one-line entries (sources.list, *.list).
# Fails, saying so, when no enabled source serves CODENAME.
set -euo pipefail

codename="${1:-}"
if [ -z "$codename" ]; then
    . /etc/os-release
    codename="${VERSION_CODENAME:?/etc/os-release names no VERSION_CODENAME}"
fi
python3 - "$codename" <<'PY'
import glob, re, shlex, sys
codename = sys.argv[1]

def from_deb822():
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
                return fields["uris"], fields.get("components", "main"), fields.get("signed-by", "")
    return None

def from_one_line():
    for path in ["/etc/apt/sources.list"] + sorted(glob.glob("/etc/apt/sources.list.d/*.list")):
        try:
            lines = open(path).read().splitlines()
        except FileNotFoundError:
            continue
        for line in lines:
            m = re.match(r"\s*deb\s+(\[[^]]*\]\s+)?(\S+)\s+(\S+)\s+(.*)", line)
            if m and m.group(3) == codename:
                signed = re.search(r"signed-by=(\S+?)\]?(\s|$)", m.group(1) or "")
                return m.group(2), m.group(4).strip(), signed.group(1) if signed else ""
    return None

found = from_deb822() or from_one_line()
if not found:
    sys.exit(f"apt-source: no enabled apt source serves {codename}")
uris, components, signed_by = found
for name, value in [("APT_URIS", uris), ("APT_URI", uris.split()[0]),
                    ("APT_COMPONENTS", components), ("APT_SIGNED_BY", signed_by)]:
    print(f"{name}={shlex.quote(value)}")
PY
