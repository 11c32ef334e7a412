#!/usr/bin/env python3
"""What the gvisor tier's platform costs per operation, whatever sandcall does with it:
one program times a system call, a read, a `stat`, a fork, a spawn of `/bin/true` and a
fresh interpreter's start, measures the memory one more idle interpreter adds, and runs
8 at once the least a run costs in a sandbox shared among runs (a fork of a warm
interpreter, new namespaces, a fork of the program), with the CPU each takes; once on the
host and once inside a gVisor sandbox started with the tier's own `runsc` flags (the
host's root read-only, nothing else), and prints both with their ratio.

  python3 bench/gvisor_costs.py [--runsc runsc] [--python /usr/bin/python3] [--json FILE]

Needs root (cgroups of its own, namespaces) and `runsc`. The times are wall times inside the
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
RUNSC_FLAGS = ["--platform=systrap", "--network=none", "--file-access=exclusive",
               "--file-access-mounts=shared", "--overlay2=none", "--ignore-cgroups"]

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


# 8 processes at once, each running `N` runs one after the other as a design that shares
# one sandbox among runs would, at the least: a warm interpreter forks a child, which
# takes new namespaces (mount, PID, network, IPC, UTS) and forks the program, which
# writes a line and exits. Prints the runs per second.
RUNS = r"""
import ctypes, os, sys, time
unshare = ctypes.CDLL(None, use_errno=True).unshare
NEW_NAMESPACES = 0x00020000 | 0x20000000 | 0x40000000 | 0x08000000 | 0x04000000
N, AT_ONCE = 15, 8
null = os.open("/dev/null", os.O_WRONLY)

def one():
    pid = os.fork()
    if pid == 0:
        if unshare(NEW_NAMESPACES) != 0:
            os._exit(3)
        program = os.fork()
        if program == 0:
            os.write(null, b"1\n")
            os._exit(0)
        os._exit(os.waitpid(program, 0)[1] and 4)
    if os.waitpid(pid, 0)[1] != 0:
        raise SystemExit("a run failed")

t = time.perf_counter()
workers = []
for _ in range(AT_ONCE):
    pid = os.fork()
    if pid == 0:
        try:
            for _ in range(N):
                one()
        except BaseException:
            os._exit(1)
        os._exit(0)
    workers.append(pid)
if any(os.waitpid(pid, 0)[1] for pid in workers):
    raise SystemExit("a worker failed")
print(N * AT_ONCE, N * AT_ONCE / (time.perf_counter() - t), flush=True)
"""

IDLE_ROW = "memory of one more idle interpreter (MiB)"
RUNS_ROW = "8 at once: fork, new namespaces, fork, exit (runs/s, CPU ms a run)"


class Cgroup:
    """A cgroup of this script's own (v1 or v2) for the processes started in it, with
    the `memory` controller (`bytes`) or the CPU's (`cpu_ms`)."""

    def __init__(self, controller):
        v1 = {"memory": "/sys/fs/cgroup/memory", "cpu": "/sys/fs/cgroup/cpuacct"}[controller]
        self.v1 = os.path.isdir(v1)
        base = v1 if self.v1 else "/sys/fs/cgroup"
        self.path = os.path.join(base, f"sandcall-gvisor-costs-{os.getpid()}")
        os.mkdir(self.path)

    def join(self):
        with open(os.path.join(self.path, "cgroup.procs"), "w") as f:
            f.write("0")

    def read(self, name):
        with open(os.path.join(self.path, name)) as f:
            return f.read()

    def bytes(self):
        return int(self.read("memory.usage_in_bytes" if self.v1 else "memory.current"))

    def cpu_ms(self):
        if self.v1:
            return int(self.read("cpuacct.usage")) / 1e6
        return next(int(line.split()[1]) for line in self.read("cpu.stat").splitlines()
                    if line.startswith("usage_usec")) / 1e3

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


def measured(controller, argv, on_failure, read):
    """Runs `argv`, in a cgroup of its own with `controller` unless that is None, and
    returns what `read` makes of its process and the cgroup. If that fails, `argv`'s
    process is killed and `on_failure` (if any) called."""
    cgroup = Cgroup(controller) if controller else None
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            preexec_fn=cgroup.join if cgroup else None)
    try:
        return read(proc, cgroup)
    except BaseException:
        proc.kill()
        proc.wait()
        if on_failure:
            on_failure()
        raise
    finally:
        if cgroup:
            cgroup.remove()


def finished(proc):
    if proc.wait() != 0:
        raise RuntimeError(f"{proc.args[0]}: exit status {proc.returncode}")


def idle_interpreter_mib(argv, on_failure=None):
    """The memory one more idle interpreter adds, run by `argv` (`IDLE`): the cgroup's
    growth from one interpreter to eleven, over ten (MiB)."""
    def read(proc, cgroup):
        seen = {}
        for line in proc.stdout:
            seen[int(line)] = cgroup.bytes()
            proc.stdin.write("\n")
            proc.stdin.flush()
        finished(proc)
        return (seen[11] - seen[1]) / 10 / 2**20

    return measured("memory", argv, on_failure, read)


def runs_at_once(argv, on_failure=None):
    """Runs per second and CPU per run (ms) of `argv` (`RUNS`), the CPU that of all its
    cgroup: in gVisor, gVisor's kernel, file proxy and start included."""
    def read(proc, cgroup):
        before = cgroup.cpu_ms()
        proc.stdin.close()
        runs, rate = proc.stdout.read().split()
        finished(proc)
        return [float(rate), (cgroup.cpu_ms() - before) / int(runs)]

    return measured("cpu", argv, on_failure, read)


def timings(argv, on_failure=None):
    """`PROGRAM`'s timings, run by `argv`."""
    def read(proc, cgroup):
        proc.stdin.close()
        out = json.loads(proc.stdout.read())
        finished(proc)
        return out

    return measured(None, argv, on_failure, read)


MEASURES = [(None, PROGRAM, timings), (IDLE_ROW, IDLE, idle_interpreter_mib), (RUNS_ROW, RUNS, runs_at_once)]


def host(python):
    return every_measure(lambda program, measure: measure([python, "-c", program]))


def in_gvisor(runsc, python):
    return every_measure(lambda program, measure: gvisor_run(runsc, python, program, measure))


def every_measure(run):
    """Each of `MEASURES`, its program run by `run(program, measure)`: `PROGRAM`'s rows,
    and one row each for the others."""
    out = {}
    for row, program, measure in MEASURES:
        found = run(program, measure)
        out.update(found if row is None else {row: found})
    return out


def gvisor_run(runsc, python, program, measure):
    """`measure` of `python -c program` in a gVisor sandbox of its own, started with the
    tier's flags, its process root inside with `CAP_SYS_ADMIN` (to make namespaces, as
    sandcall's helper does)."""
    work = tempfile.mkdtemp(prefix="sandcall-gvisor-costs-", dir="/var/tmp")
    try:
        caps = ["CAP_SYS_ADMIN"]
        spec = {
            "ociVersion": "1.0.2",
            "process": {"args": [python, "-c", program], "cwd": "/", "env": ["PATH=/usr/bin:/bin"],
                        "user": {"uid": 0, "gid": 0},
                        "capabilities": {k: caps for k in ("bounding", "effective", "permitted")}},
            "root": {"path": "/", "readonly": True},
            "mounts": [{"destination": "/proc", "type": "proc", "source": "proc"},
                       {"destination": "/tmp", "type": "tmpfs", "source": "tmpfs"}],
            "linux": {"namespaces": [{"type": t} for t in ("pid", "network", "ipc", "uts", "mount")]},
        }
        with open(os.path.join(work, "config.json"), "w") as f:
            json.dump(spec, f)
        state, name = os.path.join(work, "state"), f"gvisor-costs-{os.getpid()}"

        def forget():
            subprocess.run([runsc, "--root", state, "delete", "--force", name], capture_output=True)

        return measure([runsc, "--root", state, *RUNSC_FLAGS, "run", "--bundle", work, name], forget)
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
        if name not in (IDLE_ROW, RUNS_ROW):
            print(f"| {name} | {us:,.1f} | {gvisor[name]:,.1f} | {gvisor[name] / us:.1f} x |")
    mib = native[IDLE_ROW], gvisor[IDLE_ROW]
    print(f"\n{IDLE_ROW}: host {mib[0]:.1f}, gVisor {mib[1]:.1f} ({mib[1] / mib[0]:.1f} x)")
    (h_rate, h_cpu), (g_rate, g_cpu) = native[RUNS_ROW], gvisor[RUNS_ROW]
    print(f"{RUNS_ROW}: host {h_rate:,.0f} runs/s, {h_cpu:.2f} ms; gVisor {g_rate:,.1f} runs/s, {g_cpu:.2f} ms "
          f"(its start included)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"host": native, "gvisor": gvisor, "load_before": load}, f, indent=2)


if __name__ == "__main__":
    sys.exit(main())
