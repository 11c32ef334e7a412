#!/usr/bin/env python3
"""Where the CPU of a run goes: 8 clients send `print(1)` (or Bash `echo 1`) to a release
server while `perf record -a -g` samples the whole machine; the samples are then split by
process (the sandboxes' Python processes, the per-sandbox helpers, the server, kernel
threads) and by kernel path (fork, exit, copy-on-write faults, namespaces, cgroups, the
dynamic loader), and each share is turned into milliseconds of CPU per run.

  python3 bench/cpu_profile.py [--no-zygote] [--bash] [--gvisor] [--seconds 6] [--binary target/release/sandcall]

With --gvisor the server is in the gvisor tier, and gVisor's processes (all named `exe`)
are split by the code a sample was in: gVisor's own (the `runsc` binary: its kernel, the
Sentry, and its file proxy), the host kernel working for them (systrap's signals and
context switches, their memory), and the program's and helper's code that gVisor runs.

Needs root and `perf`. Prints a table and, with --json, writes the figures. The split is
of samples, so it holds on a shared machine as long as nothing else runs: the script
prints the machine's load average before and after, and the share of samples in
processes that are neither sandcall's nor the kernel's.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench  # noqa: E402 (beside this file)

# Kernel paths, by the function a sample's call chain passes through (perf's "children"
# view: a sample counts for every function on its stack, so these overlap where one
# calls another; each is read on its own).
PATHS = [
    ("fork: copying the parent's page tables", "copy_page_range"),
    ("fork, whole", "kernel_clone"),
    ("exit: unmapping the address space", "exit_mmap"),
    ("exit, whole", "do_exit"),
    ("copy-on-write faults", "do_wp_page"),
    ("page faults, all", "exc_page_fault"),
    ("execve", "bprm_execve"),
    ("dynamic loader (the helper's relocations)", "_dl_sysdep_start"),
    ("unshare (new namespaces)", "__x64_sys_unshare"),
    ("network namespace: creation", "copy_net_ns"),
    ("network namespace: teardown (kworker)", "cleanup_net"),
    ("mount and umount", "__x64_sys_mount"),
    ("cgroup directories: mkdir", "cgroup_mkdir"),
    ("cgroup directories: rmdir", "cgroup_rmdir"),
    ("cgroup CPU quota write", "tg_set_bandwidth"),
    ("idle", "pv_native_safe_halt"),
]


def perf_report(data, *args):
    out = subprocess.run(["perf", "report", "-i", data, "-q", "-g", "none", *args],
                         capture_output=True, text=True, check=True).stdout
    rows = []
    for line in out.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0].endswith("%"):
            rows.append((parts, line))
    return rows


# gVisor's processes (`runsc`'s sandbox, file proxy and systrap stubs, all named `exe`),
# by the object a sample's code was in.
GVISOR_CODE = [
    ("gVisor's processes: gVisor's own code (its kernel, file proxy)", lambda dso: dso == "runsc"),
    ("gVisor's processes: the host kernel working for them (systrap, memory)",
     lambda dso: dso.startswith("[kernel")),
    ("gVisor's processes: the helper's code (`sandcall`)", lambda dso: dso == "sandcall"),
    ("gVisor's processes: the program's code (Python, libc)",
     lambda dso: dso.startswith(("python", "ld-linux", "lib"))),
]


def gvisor_shares(data):
    """Shares of the samples of processes named `exe` (gVisor's), by `GVISOR_CODE`; what
    matches none (systrap's stub code, unnamed mappings) is counted as such."""
    shares = {name: 0.0 for name, _ in GVISOR_CODE}
    rest = "gVisor's processes: anything else (systrap's stub code, unnamed mappings)"
    shares[rest] = 0.0
    for parts, _ in perf_report(data, "--no-children", "--sort", "comm,dso", "--comms", "exe"):
        share, dso = float(parts[0][:-1]), parts[-1]
        name = next((name for name, match in GVISOR_CODE if match(dso)), rest)
        shares[name] += share
    return shares


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--no-zygote", dest="zygote", action="store_false")
    ap.add_argument("--bash", action="store_true", help="Bash `echo 1` instead of Python `print(1)`")
    ap.add_argument("--gvisor", action="store_true", help="the gvisor tier (its processes split by code)")
    ap.add_argument("--seconds", type=float, default=6.0, help="how long perf samples")
    ap.add_argument("--binary", default=os.path.join(bench.ROOT, "target/release/sandcall"))
    ap.add_argument("--json")
    args = ap.parse_args()
    load_before = os.getloadavg()
    env = {"SANDCALL_ZYGOTE": "true" if args.zygote else "false"}
    if args.gvisor:
        env["SANDCALL_ISOLATION"] = "gvisor"
    server = bench.Server(args.binary, env)
    body = {"language": "bash", "code": "echo 1"} if args.bash else {"code": "print(1)"}
    done = [0]
    stop = threading.Event()

    def client():
        conn = server.conn()
        while not stop.is_set():
            r = bench.post(conn, "/v1/exec", body)
            assert r["stdout"] == "1\n", r
            done[0] += 1

    data = os.path.join(tempfile.mkdtemp(prefix="sandcall-perf-"), "perf.data")
    try:
        server.settle()
        threads = [threading.Thread(target=client) for _ in range(8)]
        for t in threads:
            t.start()
        time.sleep(2)  # past the start: the pool is being drained and refilled
        before = done[0]
        subprocess.run(["perf", "record", "-a", "-g", "-q", "-o", data, "--", "sleep", str(args.seconds)],
                       check=True, capture_output=True)
        runs = done[0] - before
        stop.set()
        for t in threads:
            t.join()
    finally:
        server.stop()
    cpus = os.cpu_count()
    cpu_ms = args.seconds * 1000 * cpus
    per_run = cpu_ms / max(runs, 1)
    by_comm = {parts[1]: float(parts[0][:-1]) for parts, _ in perf_report(data, "--no-children", "--sort", "comm")}
    groups = {
        # (this script's client threads are named python3 too: a fraction of a ms a run)
        "the sandboxes' Python processes (template forks: C, init, program)": ["python3"],
        "the per-sandbox helpers (`sandcall sandbox-helper`)": ["sandcall"],
        "`runsc` commands (each run's `runsc run`, which starts its gVisor sandbox and waits)": ["runsc"],
        "the server (tokio workers)": ["tokio-rt-worker", "tokio-runtime-w"],
        "Bash processes": ["bash"],
        "idle": ["swapper"],
    }
    shares = {}
    for name, comms in groups.items():
        shares[name] = sum(by_comm.pop(c, 0.0) for c in comms)
    if args.gvisor:
        by_comm.pop("exe", None)
        shares.update(gvisor_shares(data))
    kernel = sum(v for c, v in by_comm.items() if c.startswith(("kworker", "ksoftirq", "rcu", "migration")))
    shares["kernel threads (namespace and cgroup teardown, RCU)"] = kernel
    shares["anything else on the machine"] = sum(by_comm.values()) - kernel
    children = {}
    for parts, _ in perf_report(data, "--children", "--sort", "sym"):
        # "12.34%  1.23%  [k] symbol"
        if len(parts) >= 4:
            children[parts[-1]] = children.get(parts[-1], 0.0) + float(parts[0][:-1])
    paths = [(name, children.get(sym, 0.0)) for name, sym in PATHS]
    shutil.rmtree(os.path.dirname(data), ignore_errors=True)
    load_after = os.getloadavg()
    result = {
        "zygote": args.zygote,
        "tier": "gvisor" if args.gvisor else "namespace",
        "language": "bash" if args.bash else "python",
        "runs": runs,
        "seconds": args.seconds,
        "runs_per_s": runs / args.seconds,
        "cpu_ms_per_run": per_run,
        "by_process": {k: {"share": v, "ms_per_run": v / 100 * per_run} for k, v in shares.items()},
        "by_kernel_path": {k: {"share": v, "ms_per_run": v / 100 * per_run} for k, v in paths},
        "load_average_before": load_before,
        "load_average_after": load_after,
    }
    print(f"{runs} runs in {args.seconds:.0f} s under perf ({result['runs_per_s']:.1f}/s, {result['tier']} tier, "
          f"zygote {'on' if args.zygote else 'off'}): {per_run:.1f} ms of CPU per run ({cpus} CPUs)")
    print(f"load average before {load_before[0]:.2f}, after {load_after[0]:.2f}")
    print("\n| where | share of samples | ms of CPU per run |\n|---|---|---|")
    for k, v in result["by_process"].items():
        print(f"| {k} | {v['share']:.1f}% | {v['ms_per_run']:.2f} |")
    print("\n| kernel path (overlapping) | share of samples | ms of CPU per run |\n|---|---|---|")
    for k, v in result["by_kernel_path"].items():
        print(f"| {k} | {v['share']:.1f}% | {v['ms_per_run']:.2f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
