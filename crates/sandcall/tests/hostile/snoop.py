# Attacks: confidentiality of the host. Looks for host secrets, the server's config and
# data directory, its environment, and other processes.
# Expect: none of it exists inside the sandbox; /proc lists only this run's processes.
import json, os, sys
config_path, data_dir, secret = sys.argv[1], sys.argv[2], sys.argv[3]
found = {}
for path in ["/etc/shadow", "/root", "/home", config_path, data_dir, "/sys/fs/cgroup", "/var/lib"]:
    found[path] = os.path.exists(path)
leaked = [k for k, v in os.environ.items() if secret in v or k.startswith("SANDCALL")]
pids = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
environ_hits = []
for pid in pids:
    try:
        if secret.encode() in open(f"/proc/{pid}/environ", "rb").read():
            environ_hits.append(pid)
    except OSError:
        pass
# The other processes whose command line shows the server's (its `serve`, config or
# data directory) or the secret (this one's has them: they are its arguments); each
# command line's start, to say who is there. (A forked run's init and program have the
# template's command line, tens of KiB of its source.)
cmdline_hits = []
cmdlines = []
for pid in pids:
    try:
        cmdline = open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode()
    except OSError:
        continue
    if pid != os.getpid() and any(word in cmdline for word in ("serve", secret, config_path, data_dir)):
        cmdline_hits.append(pid)
    cmdlines.append(cmdline[:200])
print(json.dumps({"exists": found, "env_leaks": leaked, "pids": pids, "environ_hits": environ_hits,
                  "cmdline_hits": cmdline_hits, "cmdlines": cmdlines}))
