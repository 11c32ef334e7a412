#!/usr/bin/env python3
"""What the gvisor tier's platform costs per operation, whatever sandcall does with it:
one program times a system call, a read, a `stat`, a fork, a spawn of `/bin/true` and a
fresh interpreter's start, and measures the memory one more idle interpreter adds, once
on the host and once inside a gVisor sandbox started with the tier's own `runsc` flags
(the host's root read-only, nothing else), and prints both with their ratio.

  python3 bench/gvisor_costs.py [--runsc runsc] [--python /usr/bin/python3] [--json FILE]

Needs root (a memory cgroup of its own) and `runsc`. The times are wall times inside the
program, one operation after another on an otherwise quiet machine: they bound from
below what any design of the tier pays for a run, since every run needs at least a new
process and an interpreter.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

# The tier's flags (crates/engine/src/gvisor.rs, RUNSC_FLAGS).
RUNSC_FLAGS = ["--platform=systrap", "--network=none", "--file-access=shared", "--overlay2=none",
               "--ignore-cgroups"]

IDLE_ROW = "memory of one more idle interpreter (MiB)"

# Timed in the same interpreter on both sides: medians of microseconds per operation.
PROGRAM = r"""
import json, os, statistics, subprocess, sys, time

fd = os.open(sys.executable, os.O_RDONLY)

def per_op(fn, n, rounds=5):
    out = []
    for _ in range(rounds):
        t = time.perf_counter()
        for _ in range(n):
            fn()
        out.append((time.perf_counter() - t) / n * 1e6)
    return statistics.median(out)

def fork_exit():
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)

def run(*argv):
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)

print(json.dumps({
    "system call (getppid)": per_op(os.getppid, 20000),
    "read of 4 KiB from a file": per_op(lambda: os.pread(fd, 4096, 0), 5000),
    "stat of a runtime file": per_op(lambda: os.stat(sys.executable), 5000),
    "fork, exit, wait": per_op(fork_exit, 40),
    "spawn /bin/true (subprocess: vfork, exec, wait)": per_op(lambda: run("/bin/true"), 20),
    "a fresh python3 -c pass": per_op(lambda: run(sys.executable, "-c", "pass"), 6),
}))
"""

# Starts one idle interpreter, then ten more, and after each step prints how many wait
# and waits for a line: the caller reads the memory of the cgroup around it meanwhile.
IDLE = r"""
import subprocess, sys
procs = []
for total in (1, 11):
    while len(procs) < total:
        p = subprocess.Popen([sys.executable, "-c", "import sys; print(flush=True); sys.stdin.read()"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        p.stdout.readline()
        procs.append(p)
    print(len(procs), flush=True)
    sys.stdin.readline()
for p in procs:
    p.stdin.close()
    p.wait()
"""


class MemoryCgroup:
    """A memory cgroup of this script's own (v1 or v2), for the processes started in it."""

    def __init__(self):
        v1 = "/sys/fs/cgroup/memory"
        base = v1 if os.path.isdir(v1) else "/sys/fs/cgroup"
        self.usage = "memory.usage_in_bytes" if base == v1 else "memory.current"
        self.path = os.path.join(base, f"sandcall-gvisor-costs-{os.getpid()}")
        os.mkdir(self.path)

    def join(self):
        with open(os.path.join(self.path, "cgroup.procs"), "w") as f:
            f.write("0")

    def bytes(self):
        with open(os.path.join(self.path, self.usage)) as f:
            return int(f.read())

    def remove(self):
        """Removes the cgroup once its last process is gone (a sandbox's processes may
        still be exiting), or leaves it, saying so, after 10 s."""
        for _ in range(1000):
            try:
                os.rmdir(self.path)
                return
            except OSError:
                time.sleep(0.01)
        print(f"left {self.path}: its processes did not exit", file=sys.stderr)


def idle_interpreter_mib(argv, on_failure=None):
    """The memory one more idle interpreter adds, run by `argv` (`IDLE`) in a cgroup of
    its own: the cgroup's growth from one interpreter to eleven, over ten (MiB). If the
    measurement fails, `on_failure` is called once `argv`'s process is killed."""
    cgroup = MemoryCgroup()
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            preexec_fn=cgroup.join)
    try:
        seen = {}
        for line in proc.stdout:
            seen[int(line)] = cgroup.bytes()
            proc.stdin.write("\n")
            proc.stdin.flush()
        if proc.wait() != 0 or set(seen) != {1, 11}:
            raise RuntimeError(f"{argv[0]}: exit status {proc.returncode}, counts seen {sorted(seen)}")
        return (seen[11] - seen[1]) / 10 / 2**20
    except BaseException:
        proc.kill()
        proc.wait()
        if on_failure:
            on_failure()
        raise
    finally:
        cgroup.remove()


def host(python):
    out = json.loads(subprocess.run([python, "-c", PROGRAM], check=True, capture_output=True, text=True).stdout)
    out[IDLE_ROW] = idle_interpreter_mib([python, "-c", IDLE])
    return out


def in_gvisor(runsc, python):
    out = json.loads(gvisor_run(runsc, python, PROGRAM, capture_output=True, text=True).stdout)
    out[IDLE_ROW] = gvisor_run(runsc, python, IDLE)
    return out


def gvisor_run(runsc, python, program, **how):
    """Runs `python -c program` in a gVisor sandbox of its own; with `how`, to its end (the
    finished process), without, as `IDLE` in a cgroup of its own (the MiB it found)."""
    work = tempfile.mkdtemp(prefix="sandcall-gvisor-costs-", dir="/var/tmp")
    try:
        spec = {
            "ociVersion": "1.0.2",
            "process": {"args": [python, "-c", program], "cwd": "/", "env": ["PATH=/usr/bin:/bin"],
                        "user": {"uid": 0, "gid": 0}},
            "root": {"path": "/", "readonly": True},
            "mounts": [{"destination": "/proc", "type": "proc", "source": "proc"},
                       {"destination": "/tmp", "type": "tmpfs", "source": "tmpfs"}],
            "linux": {"namespaces": [{"type": t} for t in ("pid", "network", "ipc", "uts", "mount")]},
        }
        with open(os.path.join(work, "config.json"), "w") as f:
            json.dump(spec, f)
        state, name = os.path.join(work, "state"), f"gvisor-costs-{os.getpid()}"
        argv = [runsc, "--root", state, *RUNSC_FLAGS, "run", "--bundle", work, name]
        if how:
            return subprocess.run(argv, check=True, **how)

        def forget():
            subprocess.run([runsc, "--root", state, "delete", "--force", name], capture_output=True)

        return idle_interpreter_mib(argv, forget)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runsc", default=shutil.which("runsc") or "runsc")
    ap.add_argument("--python", default="/usr/bin/python3", help="the interpreter timed on both sides")
    ap.add_argument("--json")
    args = ap.parse_args()
    load = os.getloadavg()
    native, gvisor = host(args.python), in_gvisor(args.runsc, args.python)
    print(f"load average {load[0]:.2f} before, {os.getloadavg()[0]:.2f} after; {os.cpu_count()} cores\n")
    print("| operation | host (µs) | gVisor, systrap (µs) | gVisor / host |\n|---|---|---|---|")
    for name, us in native.items():
        if name != IDLE_ROW:
            print(f"| {name} | {us:,.1f} | {gvisor[name]:,.1f} | {gvisor[name] / us:.1f} x |")
    mib = native[IDLE_ROW], gvisor[IDLE_ROW]
    print(f"\n{IDLE_ROW}: host {mib[0]:.1f}, gVisor {mib[1]:.1f} ({mib[1] / mib[0]:.1f} x)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"host": native, "gvisor": gvisor, "load_before": load}, f, indent=2)


if __name__ == "__main__":
    sys.exit(main())
