#!/usr/bin/env python3
"""sandcall's benchmark: sandcall against what a user would otherwise pick, in one run on
one machine, reported as ratios so the figures hold on a noisy machine.

  python3 bench/bench.py [--quick] [--guard] [--no-zygote] [--binary target/release/sandcall]
  python3 bench/bench.py --runtimes [--no-zygote] [--binary target/release/sandcall]
  python3 bench/bench.py --guard-only [--no-zygote] [--min-throughput-ratio R]
  python3 bench/bench.py --evicted [--binary target/release/sandcall]
  python3 bench/bench.py --principals [--quick] [--binary target/release/sandcall]

Writes docs/benchmarks.md and bench/results.json. With --runtimes, measures only the
managed runtimes (a pandas + matplotlib snippet against a fresh process and a warm
Jupyter kernel, JavaScript against a fresh node) and rewrites only their section of both
files; it needs the runtimes installed (`sandcall runtime install`, SANDCALL_RUNTIME_DIR). With --guard, exits 1 when sandcall's
Python p50 is above 0.5 x the p50 of a fresh python3 process measured in the same run,
or its runs per second with 8 clients are below --min-throughput-ratio x those of fresh
python3 processes started by 8 clients, measured in alternating blocks of the same run.
Every sandcall server runs with `zygote = true` (warm Python sandboxes forked from a
template, the default), or with `zygote = false` under --no-zygote (each built whole).
Needs root (sandcall builds real sandboxes); bwrap and jupyter_client are optional
baselines and are reported as missing when absent.
"""
import argparse
import datetime
import http.client
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PYTHON = "/usr/bin/python3"


def percentile(values, p):
    ordered = sorted(values)
    k = (len(ordered) - 1) * p / 100
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def summary(ms):
    return {"p50": percentile(ms, 50), "p90": percentile(ms, 90), "p99": percentile(ms, 99), "n": len(ms)}


class Server:
    # Settings every server of this run gets (--zygote).
    common_env = {}

    def __init__(self, binary, extra_env=None):
        self.dir = tempfile.mkdtemp(prefix="sandcall-bench-")
        env = dict(os.environ, SANDCALL_LOG="warn", SANDCALL_MAX_SESSIONS="1024", SANDCALL_MAX_CONCURRENT_RUNS="16")
        env.update(Server.common_env)
        env.update(extra_env or {})
        self.proc = subprocess.Popen(
            [binary, "serve", "--listen", "127.0.0.1:0", "--data-dir", os.path.join(self.dir, "data")],
            stdout=subprocess.PIPE, env=env, text=True)
        for line in self.proc.stdout:
            m = re.match(r"sandcall listening on http://([\d.]+):(\d+)", line)
            if m:
                self.host, self.port = m.group(1), int(m.group(2))
                break
        else:
            raise SystemExit("sandcall did not start")

    def conn(self):
        return http.client.HTTPConnection(self.host, self.port, timeout=120)

    def settle(self, limit=60):
        """Waits until the warm pool has stopped growing (the same count for a second),
        so that measuring starts from the steady state and not from the start-up fill."""
        last, same, start = -1, 0, time.time()
        while same < 10 and time.time() - start < limit:
            idle = self.warm_idle()
            same = same + 1 if idle == last else 0
            last = idle
            time.sleep(0.1)

    def warm_idle(self):
        """The warm sandboxes waiting for a run (`warm_idle` of `GET /v1/health`)."""
        conn = self.conn()
        conn.request("GET", "/v1/health")
        idle = json.loads(conn.getresponse().read()).get("warm_idle", 0)
        conn.close()
        return idle

    def refill(self, idle, limit=60):
        """Waits (up to `limit` s) until `idle` warm sandboxes wait again, then settles."""
        start = time.time()
        while self.warm_idle() < idle and time.time() - start < limit:
            time.sleep(0.1)
        self.settle()

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=60)
        shutil.rmtree(self.dir, ignore_errors=True)


def post(conn, path, body):
    conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    data = json.loads(resp.read())
    if resp.status != 200:
        raise RuntimeError(f"{path}: {resp.status} {data}")
    return data


def timed(fn, n, warmup=3):
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t) * 1000)
    return out


def sandcall_exec(server, language, code, n, gap_ms):
    """One request at a time, `gap_ms` apart (an agent's loop: the model thinks between
    runs). Returns the latencies and how many runs had a warm sandbox."""
    conn = server.conn()
    warm = []

    def once():
        conn.request("POST", "/v1/exec", json.dumps({"language": language, "code": code}), {"Content-Type": "application/json"})
        resp = conn.getresponse()
        r = json.loads(resp.read())
        assert resp.status == 200 and r["status"] == "ok" and r["stdout"] == "1\n", r
        warm.append(resp.getheader("sandcall-sandbox") == "warm")
        time.sleep(gap_ms / 1000)

    out = []
    for _ in range(3):
        once()
    warm.clear()
    for _ in range(n):
        t = time.perf_counter()
        once()
        out.append((time.perf_counter() - t) * 1000 - gap_ms)
    return out, sum(warm)


def sandcall_throughput(server, language, code, clients, per_client):
    errors = []

    def worker():
        conn = server.conn()
        try:
            for _ in range(per_client):
                r = post(conn, "/v1/exec", {"language": language, "code": code})
                assert r["stdout"] == "1\n", r
        except Exception as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=worker) for _ in range(clients)]
    t = time.perf_counter()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    elapsed = time.perf_counter() - t
    if errors:
        raise RuntimeError(errors[0])
    return clients * per_client / elapsed


def fresh_python_throughput(clients, per_client):
    """Runs per second of plain `python3 -c 'print(1)'` processes, `clients` threads each
    starting `per_client` of them one after the other: what the machine does without
    sandcall."""
    def worker():
        for _ in range(per_client):
            subprocess.run([PYTHON, "-c", "print(1)"], check=True, stdout=subprocess.DEVNULL)

    threads = [threading.Thread(target=worker) for _ in range(clients)]
    t = time.perf_counter()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return clients * per_client / (time.perf_counter() - t)


def interleaved_throughput(server, clients, per_client, rounds):
    """sandcall's and fresh python3's runs per second, measured in alternating blocks so
    that both see the same load; each the mean over its blocks."""
    ours, theirs = [], []
    for _ in range(rounds):
        ours.append(sandcall_throughput(server, "python", "print(1)", clients, per_client))
        theirs.append(fresh_python_throughput(clients, per_client))
    return statistics.mean(ours), statistics.mean(theirs)


TOOL = {"name": "inc", "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}}}


def programmatic(server, calls):
    conn = server.conn()
    code = f"x = 0\nfor _ in range({calls}):\n    x = inc(x=x)\nprint(x)"
    t0 = time.perf_counter()
    r = post(conn, "/v1/exec/programmatic", {"code": code, "tools": [TOOL]})
    trips = []
    while r["status"] == "tool_call_required":
        call = r["tool_calls"][0]
        t = time.perf_counter()
        r = post(conn, "/v1/exec/programmatic", {
            "session_id": r["session_id"], "continuation_token": r["continuation_token"],
            "tool_results": [{"call_id": call["id"], "result": call["arguments"]["x"] + 1}]})
        trips.append((time.perf_counter() - t) * 1000)
    total = (time.perf_counter() - t0) * 1000
    assert r["status"] == "completed" and r["stdout"] == f"{calls}\n", r
    return total, trips


def descendants(pid):
    children = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
                children.setdefault(ppid, []).append(int(entry))
            except (OSError, ValueError, IndexError):
                pass
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        for c in children.get(p, []):
            out.append(c)
            todo.append(c)
    return out


# kcmp(2)'s number, by machine: it tells whether two processes share one address space.
KCMP_SYSCALL = {"x86_64": 312, "aarch64": 272}
KCMP_VM = 1


def one_per_address_space(pids):
    """`pids` less those that share an address space with one listed before them.

    PSS divides each page among the address spaces that map it, but two processes that
    share one (gVisor's systrap makes such pairs) each report the whole of it: summing
    both counts it twice. Processes kcmp(2) cannot compare are kept."""
    nr = KCMP_SYSCALL.get(os.uname().machine)
    if nr is None:
        return list(pids)
    import ctypes

    syscall = ctypes.CDLL(None, use_errno=True).syscall
    kept = []
    for pid in pids:
        if not any(syscall(nr, k, pid, KCMP_VM, 0, 0) == 0 for k in kept):
            kept.append(pid)
    return kept


def pss_kib(pids):
    """The PSS of `pids` (KiB), each address space counted once."""
    total = 0
    for pid in one_per_address_space(pids):
        try:
            with open(f"/proc/{pid}/smaps_rollup") as f:
                for line in f:
                    if line.startswith("Pss:"):
                        total += int(line.split()[1])
        except OSError:
            pass
    return total


def memory_per_paused_session(server, sessions):
    idle = server.warm_idle()
    before = pss_kib([server.proc.pid] + descendants(server.proc.pid))
    conn = server.conn()
    paused = []
    for _ in range(sessions):
        r = post(conn, "/v1/exec/programmatic", {"code": "inc(x=1)", "tools": [TOOL], "timeout": 600000})
        assert r["status"] == "tool_call_required", r
        paused.append(r["session_id"])
    # Each session took a warm sandbox, and the pool makes new ones: measured once the
    # pool is as full as it was before, or a tier whose sandboxes take long to make
    # would be counted short by the ones not yet made.
    server.refill(idle)
    after = pss_kib([server.proc.pid] + descendants(server.proc.pid))
    # A new connection: the server closes one left idle while the pool refilled.
    conn = server.conn()
    for sid in paused:
        post(conn, "/v1/exec/programmatic/cancel", {"session_id": sid})
    return (after - before) / sessions / 1024


def fresh_python(n):
    return timed(lambda: subprocess.run([PYTHON, "-c", "print(1)"], check=True, stdout=subprocess.DEVNULL), n)


def bwrap_python(n):
    bwrap = shutil.which("bwrap")
    if not bwrap:
        return None
    cmd = [bwrap, "--unshare-all", "--die-with-parent", "--ro-bind", "/usr", "/usr", "--symlink", "usr/lib", "/lib",
           "--symlink", "usr/lib64", "/lib64", "--symlink", "usr/bin", "/bin", "--proc", "/proc", "--dev", "/dev",
           "--tmpfs", "/tmp", PYTHON, "-c", "print(1)"]
    try:
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    except (subprocess.CalledProcessError, OSError):
        return None
    return timed(lambda: subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL), n)


def jupyter_kernel(n):
    try:
        from jupyter_client.manager import start_new_kernel
    except ImportError:
        return None
    km, kc = start_new_kernel(kernel_name="python3")
    try:
        def once():
            out = []
            kc.execute_interactive("print(1)", output_hook=lambda m: out.append(m), timeout=30)
        return timed(once, n)
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def guard_ratio(binary, rounds, per_round, gap):
    """sandcall's Python p50 over a fresh python3's p50, the two sampled in alternating
    blocks so that both see the same machine load; and sandcall's Python runs per second
    with 8 clients over fresh python3 processes' with 8 clients, sampled the same way."""
    server = Server(binary)
    try:
        server.settle()
        ours, theirs = [], []
        for _ in range(rounds):
            ours += sandcall_exec(server, "python", "print(1)", per_round, gap)[0]
            theirs += fresh_python(per_round)
        server.settle()
        runs_ours, runs_theirs = interleaved_throughput(server, 8, 10, 3)
    finally:
        server.stop()
    return percentile(ours, 50) / percentile(theirs, 50), runs_ours / runs_theirs


def guard(binary, gap, min_throughput):
    """The speed guard: prints both ratios and says whether both hold."""
    latency, throughput = guard_ratio(binary, rounds=8, per_round=10, gap=gap)
    print(f"guard: sandcall python p50 / fresh python3 p50 = {latency:.2f} (must be <= 0.50)")
    print(f"guard: sandcall python runs/s / fresh python3 runs/s, 8 clients = {throughput:.2f} "
          f"(must be >= {min_throughput:.2f})")
    return latency, throughput, latency <= 0.5 and throughput >= min_throughput


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="small samples (CI)")
    ap.add_argument("--guard", action="store_true", help="fail unless Python p50 <= 0.5 x fresh python3 p50")
    ap.add_argument("--guard-only", action="store_true", help="only the guard's measurement")
    ap.add_argument("--runtimes", action="store_true", help="only the managed runtimes' section")
    ap.add_argument("--evicted", action="store_true", help="only the evicted sessions' section")
    ap.add_argument("--tiers", action="store_true", help="only the isolation tiers' section (gvisor beside namespace)")
    ap.add_argument("--principals", action="store_true",
                    help="only the templates per principal section (zygote's cost per principal)")
    ap.add_argument("--no-zygote", dest="zygote", action="store_false",
                    help="servers run with zygote = false (the default is true)")
    ap.add_argument("--min-throughput-ratio", type=float, default=0.45,
                    help="the guard's floor for sandcall runs/s over fresh python3 runs/s, 8 clients each")
    ap.add_argument("--binary", default=os.path.join(ROOT, "target/release/sandcall"))
    ap.add_argument("--out", default=os.path.join(ROOT, "docs/benchmarks.md"))
    ap.add_argument("--json", default=os.path.join(ROOT, "bench/results.json"))
    args = ap.parse_args()
    n, clients, per_client, sessions = (40, 8, 10, 50) if args.quick else (300, 8, 60, 500)
    gap = 50
    Server.common_env["SANDCALL_ZYGOTE"] = "true" if args.zygote else "false"
    if args.guard_only:
        sys.exit(0 if guard(args.binary, gap, args.min_throughput_ratio)[2] else 1)
    if args.runtimes:
        import bench_runtimes  # noqa: E402 (beside this file)

        bench_runtimes.main(args, sys.modules[__name__])
        return
    if args.evicted:
        import bench_evicted  # noqa: E402 (beside this file)

        bench_evicted.main(args, sys.modules[__name__])
        return
    if args.principals:
        import bench_principals  # noqa: E402 (beside this file)

        bench_principals.main(args, sys.modules[__name__])
        return
    if args.tiers:
        import bench_tiers  # noqa: E402 (beside this file)

        bench_tiers.main(args, sys.modules[__name__])
        return

    server = Server(args.binary)
    try:
        res = {
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "cores": os.cpu_count(),
            "quick": args.quick,
            "gap_ms": gap,
            "zygote": args.zygote,
            "mem_total_mib": mem_total_mib(),
        }
        py, py_warm = sandcall_exec(server, "python", "print(1)", n, gap)
        sh, sh_warm = sandcall_exec(server, "bash", "echo 1", n, gap)
        back, back_warm = sandcall_exec(server, "python", "print(1)", n, 0)
        res.update({
            "sandcall_python": summary(py),
            "sandcall_python_warm_share": py_warm / n,
            "sandcall_bash": summary(sh),
            "sandcall_bash_warm_share": sh_warm / n,
            "sandcall_python_back_to_back": summary(back),
            "sandcall_python_back_to_back_warm_share": back_warm / n,
        })
        server.settle()
        ours, theirs = interleaved_throughput(server, clients, per_client // 3 or 1, 3)
        res["sandcall_python_runs_per_s"] = ours
        res["fresh_python3_runs_per_s"] = theirs
        total, trips = programmatic(server, 20)
        res["programmatic_20_calls_total_ms"] = total
        res["programmatic_round_trip"] = summary(trips)
        res["memory_per_paused_session_mib"] = memory_per_paused_session(server, sessions)
        res["paused_sessions_measured"] = sessions
    finally:
        server.stop()
    res["fresh_python3"] = summary(fresh_python(n))
    b = bwrap_python(n)
    res["bwrap_python3"] = summary(b) if b else None
    j = jupyter_kernel(n)
    res["jupyter_kernel"] = summary(j) if j else None

    os.makedirs(os.path.dirname(args.json), exist_ok=True)
    try:
        with open(args.json) as f:
            kept = json.load(f).get("runtimes")
    except (OSError, ValueError):
        kept = None
    if kept is not None:
        res["runtimes"] = kept  # written by --runtimes, kept across full runs
    with open(args.json, "w") as f:
        json.dump(res, f, indent=1)
    write_markdown(res, args.out)
    print(open(args.out).read())
    if args.guard:
        latency, throughput, ok = guard(args.binary, gap, args.min_throughput_ratio)
        res["guard_ratio"] = latency
        res["guard_throughput_ratio"] = throughput
        if not ok:
            sys.exit(1)


# Why the goals that are missed are missed, from measurements taken while building the
# warm path (strace of a warm helper, timestamps in the runner; 2 cores, cgroup v1).
MISSED = """
## Where the time goes, and what would close the gaps

Measured on one warm `print(1)` with `perf trace` and `strace -f -tt` on the server and
its helpers (release build, 2 cores, cgroup v1, one request at a time), on a machine that
other jobs loaded (load average 3 to 13): the figures are single samples and upper
bounds; the tables above are the quiet totals.

| step of a warm run | measured |
|---|---|
| server: request read to `Run` written to the helper (HTTP, JSON, authentication, admission, `Pool::take`, the run message) | 0.45 to 1.3 ms |
| helper: `Run` read to the go written (its own memory limit from /proc/self/status, the code written, the CPU counter read) | 23 system calls; 0.7 ms traced |
| program: go to `exit 0` on fd 3 (the runner reads the go, compiles and runs main.py, flushes) | 2.3 ms while the other core was busy; about 0.3 ms alone |
| helper: exit to `Finished` (kill, three cgroup counters, the empty working directory looked at, 340 bytes of JSON) | 27 system calls; 0.3 ms traced |
| server: `Finished` to the response written (parse, task hand-offs, outbox, JSON, HTTP) | 0.6 ms |
| after the answer: reaping, cgroup removal (on v1, `rmdir` of the memory cgroup waits about 6 ms for an RCU grace period), mounts | off the request path |
| the refill of the sandbox just taken: a helper's start (a fork of the helper launcher, where an exec of the binary took 1.4 ms of CPU), then the mounts, the cgroup and Python's start (about 15 ms of CPU) | on the other core, competing with the run |

- **What changed.** Refills no longer compete: a sandbox built ahead of requests (a
  refill, a template and its forks) waits at nice 19, lowered by the server as soon as
  its helper is spawned, and its helper raises itself and every thread of the run's
  cgroup back to nice 0 when the `Run` arrives, before the go. A run without output
  files no longer sends the server to a blocking thread to look for its outbox.
- **Python p50 and p99.** What is left is the server and the helper (about 1.5 to 2 ms
  of the steps above on a loaded machine) and the program's own 0.3 ms; with the refill
  at the lowest priority the slow tail of back-to-back runs should shrink to scheduling
  noise. Closing the rest: the server's request path (fewer task hand-offs, the `Run`
  message without the cold launch's argv and environment), and reading the helper's own
  memory figure before the `Run` arrives.
- **Bash p50 (goal 2 ms).** Bash cannot report its own end, so the helper waits for
  init's report of the exit and the end of the output pipes. The warm launcher used to
  exec a second bash for the program at the go: 1.8 ms of CPU and 145 page faults in the
  program after its go (`perf stat`), against 0.4 ms for Python's `print(1)`; that is
  why Bash was slower than Python. The waiting shell now sources the code itself, with
  a script's `$0` and arguments (`warm::warm_bash_runs_answer_as_cold_ones`): 0.2 ms
  and 3 faults; one client's p50, interleaved against the main branch's build in one
  run, 2.7 to 2.8 ms against 5.0 to 5.8. An EXIT trap reporting on fd 3 would
  be visible to the program (a trap of its own replaces it, `exec` in the script skips
  it, children inherit fd 3), so it was not done: it would change results.
- **Throughput with 8 clients.** Bounded by how fast warm sandboxes are rebuilt (a
  helper's start, the cgroup, the mounts, Python's start); the priority change orders
  that work behind the runs, it does not remove it. Forking from a template (`zygote`)
  removes the interpreter's start.
- **Memory per paused session.** A paused session holds a whole Python interpreter
  (about 9-10 MiB PSS with the tool machinery loaded) plus its helper and init. Forking
  sessions from a zygote shares most of those pages.
"""


# With --zygote: what the forked path changes in the costs above (ARCHITECTURE.md, "Forked
# runs"). Design facts, not measurements; the figures are the tables above.
ZYGOTE_NOTES = """
## What the forked path (`zygote`, the default) changes, and why each goal is missed

These figures were taken with `zygote = true`, the default: every warm Python sandbox is
forked from a template that has started the interpreter (and imported the preloads), and
a run that finds the pool empty gets one forked for it instead of the cold path. Every
sandbox's helper is forked from the helper launcher instead of exec'd (ARCHITECTURE.md).

- **Removed from each Python sandbox:** the interpreter's start (about 15 ms of CPU, a
  second with the data stack), the helper's exec (1.4 ms of CPU: the dynamic loader's
  52,506 relocations of a 200 MB binary; a forked helper also holds 0.3 MiB of PSS
  instead of 0.9) and the helper's staging mounts; its memory is the template's,
  copy-on-write, until the run writes.
- **Still paid per sandbox:** the run's cgroup, three forks of the template (C, which
  makes the run's namespaces; the run's init G; the program P), the run's namespaces and
  its tmpfs mounts, and the JSON round trips. A refill runs at nice 19; a fork a request
  waits for is raised to nice 0 at its hello.
- **The request path.** The helper writes the go and then `seal`, without waiting: the
  program waits for G's release (a pipe) before it reads its go, and G releases it once
  `/run/sandcall` is read-only (the round trip this replaced cost a wake of G before the
  go). The program goes once through a go's paths while it waits (`_rehearse`): 46 to 52
  copy-on-write faults after its go instead of 88. The warm Bash launcher runs the code
  in the waiting shell instead of exec'ing a second bash at the go (the program's CPU
  after its go: 1.8 ms before, 0.2 ms now).
- **Left-over cgroups.** Every stopped server used to leave its instance directory in
  each hierarchy (and a killed one its run cgroups): 12,000 of them on this machine made
  each run's `cpu.cfs_quota_us` write walk them all, 9% of all CPU under load. A
  stopped server now removes its subtree; with them gone, 8-client throughput went from
  90 to 130 runs/s in the same A/B.

### Where a run's CPU goes (`bench/cpu_profile.py`)

8 clients of `print(1)`, release build, `perf record -a -g` for 6 s on a quiet machine
(load average 1.0 before): 137 runs/s, 14.6 ms of CPU per run on 2 cores. By process:
the sandboxes' Python processes (C, G, P) 10.0 ms, the helpers 1.8 ms, the server 0.6 ms,
kernel threads (namespace and cgroup teardown) 0.7 ms, idle 1.3 ms. By kernel path
(overlapping): page faults 4.1 ms (copy-on-write 2.2), exits 1.9 ms (unmapping 1.7),
forks 1.1 ms (page tables 0.7), new namespaces 0.5 ms, the network namespace's creation
and teardown 0.7 ms, cgroup directories and limits 0.4 ms. On its own, one fork and exit
of a process of the template's size (19 MiB RSS) costs 1.0 ms of CPU, and 4.2 ms with
the data stack loaded (135 MiB).

### Why each goal is missed

- **Throughput, 3 x fresh `python3` (0.70 x).** The goal allows about a third of a
  fresh process's CPU per run (here 2 cores / 194 runs/s = 10.3 ms, so about 3.4 ms),
  isolation included. The three forked Python processes alone take 10 ms: their forks,
  exits and copy-on-write faults are kernel work in proportion to the interpreter's
  address space, and CPython writes reference counts into every object it touches, so
  each process copies the pages it runs through. The published design the goal quotes
  forks VM snapshots, which share page tables, and runs no per-sandbox cgroup,
  namespaces or helper. What would still help here: one fork fewer (the template
  cloning G into the new namespaces directly, without C: about 1 ms a run, measured
  as a fork and exit of the template), and a per-run helper that is not a process of
  its own.
- **One client's `print(1)` p50, 1.5 ms, and Bash `echo 1`, 2 ms.** A request's CPU is
  about 3.3 ms either way, forked or built (`perf stat -i` per process on one request:
  server 1.5 to 1.7 ms, helper 0.9 to 1.0 ms, program 0.5 to 0.6 ms, G 0.2 to 0.35 ms),
  more than the goal before any waiting: HTTP and JSON on both sides of the helper, the
  run's output read from its pipes, the cgroup's usage read for `cpu_time` and
  `memory_peak`, and the run's end, which the helper learns from init once the program
  has exited and been reaped.
- **Back-to-back p99, 5 ms.** With no gap between runs, each run's refill (a fork, its
  namespaces, mounts and cgroup: a few ms of CPU at nice 19) still takes one of the two
  cores while the next run starts; the tail is the runs that start while a refill holds
  a core.
- **Memory per paused session, 2 MiB, and 5,000 sessions.** What a paused forked session
  holds, measured per process: P about 3 MiB (the interpreter's per-process state
  written after the fork: reference counts, allocator pools, frames, the tool machinery
  and asyncio's loop), G about 1.6 MiB (a Python process too: its fork, mounts and
  select loop), the helper 0.3 MiB, and the server's share. A smaller G (not a Python
  process) is the next saving.
- **Data snippet vs the warm kernel, 1.0 x.** See the runtimes section below: the
  hand-over (staging the uploaded CSV, collecting `chart.png`, HTTP) that a kernel
  without isolation does not pay.
"""


# The runtimes' section of docs/benchmarks.md starts at this line; bench_runtimes.py writes
# it, and a full run keeps it.
RUNTIMES_MARK = "<!-- bench.py --runtimes writes from here on -->"
# The same for bench_evicted.py's section, after it.
EVICTED_MARK = "<!-- bench.py --evicted writes from here on -->"
# The same for bench_tiers.py's section, after that.
TIERS_MARK = "<!-- bench.py --tiers writes from here on -->"


def replace_section(path, mark, text):
    """Writes `text` (which begins with `mark`) as its section of the document at `path`:
    in place of the section that `mark` begins, up to the next one another run writes,
    or at the end."""
    doc = open(path).read() if os.path.exists(path) else "# Benchmarks\n"
    at = doc.find(mark)
    end = doc.find("\n<!-- bench.py", at + len(mark)) if at >= 0 else -1
    rest = doc[end:] if end >= 0 else ""
    doc = (doc[:at].rstrip("\n") if at >= 0 else doc.rstrip("\n")) + "\n\n" + text.rstrip("\n") + "\n" + rest
    with open(path, "w") as f:
        f.write(doc)


def kept_runtimes_section(path):
    try:
        text = open(path).read()
    except OSError:
        return ""
    at = text.find(RUNTIMES_MARK)
    return "" if at < 0 else "\n" + text[at:]


def mem_total_mib():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) / 1024
    return 0


def write_markdown(r, path):
    kept = kept_runtimes_section(path)
    def row(name, s, base=None):
        if s is None:
            return f"| {name} | not installed | | | |\n"
        ratio = f"{r['sandcall_python']['p50'] / s['p50']:.2f}" if base else ""
        return f"| {name} | {s['p50']:.1f} | {s['p90']:.1f} | {s['p99']:.1f} | {ratio} |\n"

    # The goals of issue 14 (speed and density).
    runs_ratio = r["sandcall_python_runs_per_s"] / r["fresh_python3_runs_per_s"]
    held = r["mem_total_mib"] / r["memory_per_paused_session_mib"] if r["memory_per_paused_session_mib"] > 0 else 0
    back = r["sandcall_python_back_to_back"]
    goals = [
        ("Python `print(1)` p50, one client", f"{r['sandcall_python']['p50']:.1f} ms", "<= 1.5 ms", r['sandcall_python']['p50'] <= 1.5),
        ("Python `print(1)` p99, one client, back to back", f"{back['p99']:.1f} ms", "<= 5 ms", back['p99'] <= 5),
        ("Python runs/s, 8 clients, / fresh python3 runs/s, 8 clients", f"{runs_ratio:.2f} x", ">= 3 x", runs_ratio >= 3),
        ("Bash `echo 1` p50", f"{r['sandcall_bash']['p50']:.1f} ms", "<= 2 ms", r['sandcall_bash']['p50'] <= 2),
        ("tool-call round trip p50", f"{r['programmatic_round_trip']['p50']:.2f} ms", "<= 1 ms", r['programmatic_round_trip']['p50'] <= 1),
        ("memory per paused session", f"{r['memory_per_paused_session_mib']:.1f} MiB", "<= 2 MiB", r['memory_per_paused_session_mib'] <= 2),
        ("paused sessions this machine holds (its memory / the above)", f"{held:.0f}", ">= 5,000", held >= 5000),
    ]
    with open(path, "w") as f:
        f.write("# Benchmarks\n\n")
        zygote = "" if r.get("zygote") else " --no-zygote"
        f.write(f"Generated by `python3 bench/bench.py{zygote}` (do not edit by hand). "
                f"Measured {r['date']} on a machine with {r['cores']} cores, over HTTP on loopback"
                f"{' (quick sample)' if r['quick'] else ''}. All figures come from one run, so the ratios "
                "compare like with like on a shared, noisy machine.\n\n")
        f.write("## One `print(1)` at a time (ms)\n\n| what | p50 | p90 | p99 | sandcall Python p50 / this p50 |\n|---|---|---|---|---|\n")
        f.write(row(f"sandcall, Python ({r['sandcall_python_warm_share']:.0%} warm)", r["sandcall_python"]))
        f.write(row(f"sandcall, Bash `echo 1` ({r['sandcall_bash_warm_share']:.0%} warm)", r["sandcall_bash"]))
        f.write(row(f"sandcall, Python back to back, no gap ({r['sandcall_python_back_to_back_warm_share']:.0%} warm)", r["sandcall_python_back_to_back"]))
        f.write(row("fresh `python3 -c` process (no isolation)", r["fresh_python3"], True))
        f.write(row("`bwrap --unshare-all` + python3", r["bwrap_python3"], True))
        f.write(row("warm Jupyter kernel, jupyter_client (no isolation)", r["jupyter_kernel"], True))
        f.write(f"\n## Throughput and tool calls\n\n- Python runs per second with 8 concurrent clients: "
                f"{r['sandcall_python_runs_per_s']:.0f}; fresh `python3 -c` processes, 8 clients, in alternating "
                f"blocks of the same run: {r['fresh_python3_runs_per_s']:.0f}\n- A program making 20 sequential tool calls: "
                f"{r['programmatic_20_calls_total_ms']:.0f} ms in all; round trip as the client sees it (resume sent "
                f"to next pause received): p50 {r['programmatic_round_trip']['p50']:.2f} ms, p99 "
                f"{r['programmatic_round_trip']['p99']:.2f} ms\n- Memory per paused session (PSS of the server and "
                f"every sandbox process, {r['paused_sessions_measured']} sessions paused at once): "
                f"{r['memory_per_paused_session_mib']:.1f} MiB\n")
        f.write("\n## Goals\n\n| goal | measured | target | met |\n|---|---|---|---|\n")
        for name, got, target, met in goals:
            f.write(f"| {name} | {got} | {target} | {'yes' if met else 'no'} |\n")
        f.write(ZYGOTE_NOTES if r.get("zygote") else MISSED)
        f.write(kept)


if __name__ == "__main__":
    main()
