"""Templates per principal, `python3 bench/bench.py --principals`: what `zygote`'s
template per principal costs (issue 25, finding 4).

One server (`zygote = true`, a warm Python pool of `warm_pool_size` plain sandboxes, no
preloaded set) with SANDCALL_BENCH_PRINCIPALS API keys (default 6; 3 with --quick). For
each principal in turn, one request at a time:

1. its first run, while it has no template: the answer's `sandcall-sandbox` kind, and
   its latency (a warm sandbox built the usual way, or cold when the pool is empty);
2. the time until its template is ready (runs polled until one is forked);
3. N runs once its template is ready (each forked for it), GAP_MS apart (an agent's
   loop, as bench.py's one-client figures): their latencies.

The PSS of the server and everything under it is read with no principal's template and
again with all of them alive (and the warm pool settled both times): the growth divided by
the principals is what a template costs. Rewrites the section of docs/benchmarks.md that
PRINCIPALS_MARK begins, and the "principals" key of bench/results.json.
"""
import datetime
import http.client
import json
import os
import time

FORKED = "import os\nprint(open('/proc/self/uid_map').read().split()[1] == '1000')"
GAP_MS = 50
PRINCIPALS_MARK = "<!-- bench.py --principals writes from here on -->"


def key(i):
    return f"bench-principal-key-{i:04d}"


def run(server, i, code=FORKED):
    """One run as principal `i`: (latency in ms, sandbox kind, stdout)."""
    conn = server.conn()
    body = json.dumps({"code": code})
    t = time.perf_counter()
    conn.request("POST", "/v1/exec", body, {"Content-Type": "application/json", "X-API-Key": key(i)})
    resp = conn.getresponse()
    data = json.loads(resp.read())
    ms = (time.perf_counter() - t) * 1000
    conn.close()
    if resp.status != 200:
        raise RuntimeError(f"principal {i}: {resp.status} {data}")
    return ms, resp.getheader("sandcall-sandbox", ""), data.get("stdout", "")


def settle_pool(server, size, limit=60):
    """Waits until the warm pool is full again (health needs a key when keys are set)."""
    start = time.time()
    while time.time() - start < limit:
        conn = server.conn()
        conn.request("GET", "/v1/health", headers={"X-API-Key": key(0)})
        idle = json.loads(conn.getresponse().read()).get("warm_idle", 0)
        conn.close()
        if idle >= size:
            break
        time.sleep(0.1)
    time.sleep(1)


def main(args, bench):
    principals = int(os.environ.get("SANDCALL_BENCH_PRINCIPALS", "3" if args.quick else "6"))
    ready_runs = 10 if args.quick else 40
    pool = 2
    keys = ",".join(f"p{i}:{key(i)}" for i in range(principals))
    server = bench.Server(args.binary, {
        "SANDCALL_ZYGOTE": "true",
        "SANDCALL_API_KEYS": keys,
        "SANDCALL_WARM_POOL_SIZE": str(pool),
        "SANDCALL_WARM_LANGUAGES": '["python"]',
        "SANDCALL_WARM_PRELOAD_POOL_SIZE": "0",
        "SANDCALL_ZYGOTE_TEMPLATES": str(principals + 1),
    })
    first, first_kinds, until_ready, ready = [], [], [], []
    try:
        settle_pool(server, pool)
        tree = lambda: [server.proc.pid] + bench.descendants(server.proc.pid)
        before = bench.pss_kib(tree())
        for i in range(principals):
            settle_pool(server, pool)
            ms, kind, out = run(server, i)
            assert out == "False\n", f"principal {i}'s first run was forked: {out!r}"
            first.append(ms)
            first_kinds.append(kind)
            t = time.perf_counter()
            while run(server, i)[2] != "True\n":
                time.sleep(0.02)
            until_ready.append((time.perf_counter() - t) * 1000)
            for _ in range(ready_runs):
                time.sleep(GAP_MS / 1000)
                ms, kind, out = run(server, i)
                assert out == "True\n" and kind == "warm", (kind, out)
                ready.append(ms)
        settle_pool(server, pool)
        after = bench.pss_kib(tree())
    finally:
        server.stop()
    res = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "binary": os.path.relpath(args.binary, bench.ROOT),
        "principals": principals,
        "warm_pool_size": pool,
        "gap_ms": GAP_MS,
        "first_run": bench.summary(first),
        "first_run_kinds": first_kinds,
        "template_ready_after_ms": bench.summary(until_ready),
        "ready_run": bench.summary(ready),
        "template_pss_mib": (after - before) / principals / 1024,
    }
    try:
        with open(args.json) as f:
            results = json.load(f)
    except (OSError, ValueError):
        results = {}
    results["principals"] = res
    with open(args.json, "w") as f:
        json.dump(results, f, indent=1)
    bench.replace_section(args.out, PRINCIPALS_MARK, markdown(res))
    print(markdown(res))


def markdown(r):
    f, u, w = r["first_run"], r["template_ready_after_ms"], r["ready_run"]
    kinds = ", ".join(sorted(set(r["first_run_kinds"])))
    return f"""{PRINCIPALS_MARK}
## Templates per principal

`python3 bench/bench.py --principals` ({r['date']}, `{r['binary']}`, {r['principals']}
principals one after another, one request at a time, a warm pool of
{r['warm_pool_size']} plain Python sandboxes, no preloaded set). With `zygote`, each
principal's Python runs are forked from a template of its own (finding 4 of issue 25);
a principal's first run does not wait for it.

| What | p50 ms | p90 ms | n |
|---|---|---|---|
| A principal's first run, no template yet ({kinds}) | {f['p50']:.1f} | {f['p90']:.1f} | {f['n']} |
| From then until its template forks its runs | {u['p50']:.0f} | {u['p90']:.0f} | {u['n']} |
| A run forked from its ready template, {r['gap_ms']} ms apart | {w['p50']:.1f} | {w['p90']:.1f} | {w['n']} |

Memory: each principal's template adds {r['template_pss_mib']:.1f} MiB of PSS (the
server and everything under it, with every principal's template alive, against none;
the pool settled both times): the template's helper, init and interpreter, and the one
sandbox it keeps forked ahead of the principal's next run. `zygote_templates` bounds the
total, and `zygote_template_idle_s` gives it back when a principal stops running code.
The first run takes a warm sandbox built the usual way (its own interpreter, so its own
randomness), or the cold path when the pool is empty; its template is ready an
interpreter's start later (the second row; a preloaded template imports the data stack
first, about a second of CPU more).{debug_note(r)}
"""


def debug_note(r):
    if "debug" not in r["binary"]:
        return ""
    return """

These figures come from a debug build on a machine shared with other builds: the
latencies are several times a release build's (the helper does the fork's work), and
their spread is the machine's; the memory and the order of the rows hold."""
