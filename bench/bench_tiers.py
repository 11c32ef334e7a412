"""bench.py --tiers: the gvisor isolation tier beside the namespace tier (docs/isolation.md).

Two servers of the same binary, one per tier, each with its warm pool, measured in
alternating blocks of the same run, so that every ratio compares the tiers under the
same load. Writes its section of docs/benchmarks.md (after TIERS_MARK) and prints it.
"""

import datetime
import json
import os
import statistics
import time

# A data snippet as a model writes one: a CSV, a pandas group, a bar chart to PNG.
SNIPPET = """import io
import pandas as pd
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
df = pd.read_csv(io.StringIO("city,sales\\nA,3\\nB,5\\nA,4\\nC,1\\n"))
g = df.groupby("city")["sales"].sum()
g.plot.bar()
plt.savefig("chart.png")
print(len(g))
"""

TIERS = ("namespace", "gvisor")


def latencies(b, server, code, expect, n, gap_ms, warm=None, refill_to=None):
    """One request at a time, `gap_ms` apart; the latencies of `n` runs (ms). Appends to
    `warm` whether each found a warm sandbox (the `sandcall-sandbox` header). With
    `refill_to` (the pool's settled size), each run waits until the pool is full again
    and has settled: a warm run with no rebuild beside it."""
    conn = server.conn()

    def once():
        conn.request("POST", "/v1/exec", json.dumps({"language": "python", "code": code}),
                     {"Content-Type": "application/json"})
        resp = conn.getresponse()
        r = json.loads(resp.read())
        assert resp.status == 200 and r["status"] == "ok" and r["stdout"] == expect, r
        time.sleep(gap_ms / 1000)
        return resp.getheader("sandcall-sandbox") == "warm"

    out = []
    for _ in range(2):
        once()
    for _ in range(n):
        if refill_to is not None:
            server.refill(refill_to)
        t = time.perf_counter()
        was_warm = once()
        out.append((time.perf_counter() - t) * 1000 - gap_ms)
        if warm is not None:
            warm.append(was_warm)
    return out


def idle_sandbox_mib(b, server):
    """PSS of the server's sandbox processes, per idle warm sandbox (the pool full)."""
    server.settle()
    idle = server.warm_idle()
    pss = b.pss_kib(b.descendants(server.proc.pid))
    return (pss / idle / 1024) if idle else 0.0, idle


def main(args, b):
    n, per_client, sessions, rounds = (20, 3, 20, 3) if args.quick else (60, 8, 50, 4)
    rested_runs = 6 if args.quick else 16
    gap = 50
    started = time.time()
    la_before = os.getloadavg()
    servers = {tier: b.Server(args.binary, {"SANDCALL_ISOLATION": tier}) for tier in TIERS}
    res = {t: {"print": [], "snippet": [], "runs_per_s": [], "print_warm": [], "snippet_warm": [],
               "print_rested": [], "snippet_rested": [], "rested_warm": []} for t in TIERS}
    try:
        for s in servers.values():
            s.settle()
        for tier in TIERS:
            res[tier]["idle_sandbox_mib"], res[tier]["warm_idle"] = idle_sandbox_mib(b, servers[tier])
        for _ in range(rounds):
            for tier in TIERS:
                s = servers[tier]
                res[tier]["print"] += latencies(b, s, "print(1)", "1\n", n // rounds or 1, gap, res[tier]["print_warm"])
                res[tier]["snippet"] += latencies(b, s, SNIPPET, "3\n", max(n // rounds // 2, 1), gap,
                                                  res[tier]["snippet_warm"])
                res[tier]["runs_per_s"].append(b.sandcall_throughput(s, "python", "print(1)", 8, per_client))
                s.settle()
                idle = res[tier]["warm_idle"]
                res[tier]["print_rested"] += latencies(b, s, "print(1)", "1\n", rested_runs // rounds or 1, gap,
                                                       res[tier]["rested_warm"], idle)
                res[tier]["snippet_rested"] += latencies(b, s, SNIPPET, "3\n", max(rested_runs // rounds // 2, 1), gap,
                                                         res[tier]["rested_warm"], idle)
        for tier in TIERS:
            res[tier]["paused_session_mib"] = b.memory_per_paused_session(servers[tier], sessions)
    finally:
        for s in servers.values():
            s.stop()
    out = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "seconds": round(time.time() - started),
        "cores": os.cpu_count(),
        "quick": args.quick,
        "load_before": la_before,
        "load_after": os.getloadavg(),
        "sessions": sessions,
    }
    for tier in TIERS:
        r = res[tier]
        out[tier] = {
            "print": b.summary(r["print"]),
            "snippet": b.summary(r["snippet"]),
            "runs_per_s": statistics.mean(r["runs_per_s"]),
            "paused_session_mib": r["paused_session_mib"],
            "idle_sandbox_mib": r["idle_sandbox_mib"],
            "warm_idle": r["warm_idle"],
            "print_warm_share": sum(r["print_warm"]) / max(len(r["print_warm"]), 1),
            "print_warm_only": b.summary([ms for ms, w in zip(r["print"], r["print_warm"]) if w] or [0.0]),
            "snippet_warm_share": sum(r["snippet_warm"]) / max(len(r["snippet_warm"]), 1),
            "snippet_warm_only": b.summary([ms for ms, w in zip(r["snippet"], r["snippet_warm"]) if w] or [0.0]),
            "print_rested": b.summary(r["print_rested"]),
            "snippet_rested": b.summary(r["snippet_rested"]),
            "rested_warm_share": sum(r["rested_warm"]) / max(len(r["rested_warm"]), 1),
        }
    out["gap"] = gap
    write_section(b, out, args.out, b.TIERS_MARK)
    text = open(args.out).read()
    print(text[text.find(b.TIERS_MARK):])


def write_section(b, r, path, mark):
    ns, gv = r["namespace"], r["gvisor"]
    la, lb = r["load_before"], r["load_after"]
    gap = r["gap"]

    def ratio(a, base):
        return a / base if base else float("inf")

    goals = [
        ("Python `print(1)` p50, one client, warm (ms)", gv["print"]["p50"], ns["print"]["p50"],
         ratio(gv["print"]["p50"], ns["print"]["p50"]), "<= 2 x", lambda x: x <= 2),
        ("runs/s, 8 clients", gv["runs_per_s"], ns["runs_per_s"],
         ratio(gv["runs_per_s"], ns["runs_per_s"]), ">= 0.5 x", lambda x: x >= 0.5),
        ("data snippet (CSV, pandas group, bar chart to PNG) p50, warm (ms)", gv["snippet"]["p50"],
         ns["snippet"]["p50"], ratio(gv["snippet"]["p50"], ns["snippet"]["p50"]), "<= 1.5 x", lambda x: x <= 1.5),
        ("memory per paused programmatic session (MiB, PSS)", gv["paused_session_mib"], ns["paused_session_mib"],
         ratio(gv["paused_session_mib"], ns["paused_session_mib"]), "<= 2 x", lambda x: x <= 2),
    ]
    rows = "".join(
        f"| {name} | {g:.1f} | {n:.1f} | {x:.2f} x | {target} | {'yes' if ok(x) else 'no'} |\n"
        for name, g, n, x, target, ok in goals
    )
    text = f"""{mark}

## The gvisor tier beside the namespace tier

Generated by `python3 bench/bench.py --tiers --binary target/release/sandcall` (do not
edit by hand). Measured {r['date']} in {r['seconds']} s on {r['cores']} cores
{'(quick sample) ' if r['quick'] else ''}with one server per tier, each with its warm pool,
measured in alternating blocks; load average (1, 5, 15 min) {la[0]:.2f} {la[1]:.2f} {la[2]:.2f}
before and {lb[0]:.2f} {lb[1]:.2f} {lb[2]:.2f} after.

| measure | gvisor | namespace | gvisor / namespace | goal | met |
|---|---|---|---|---|---|
{rows}
- `print(1)` p90 / p99: gvisor {gv['print']['p90']:.1f} / {gv['print']['p99']:.1f} ms, namespace
  {ns['print']['p90']:.1f} / {ns['print']['p99']:.1f} ms.
- Runs that found a warm sandbox, {gap} ms apart: `print(1)` gvisor {gv['print_warm_share']:.0%},
  namespace {ns['print_warm_share']:.0%}; the data snippet gvisor {gv['snippet_warm_share']:.0%},
  namespace {ns['snippet_warm_share']:.0%}. The rest started cold: the gvisor tier's pool
  refills more slowly than one client uses it up. `print(1)` p50 of the runs that found
  one: gvisor {gv['print_warm_only']['p50']:.1f} ms, namespace {ns['print_warm_only']['p50']:.1f} ms;
  the data snippet's: gvisor {gv['snippet_warm_only']['p50']:.1f} ms, namespace
  {ns['snippet_warm_only']['p50']:.1f} ms.
- Rested: each run only once the pool is full again and has settled, so that every
  run is warm with no rebuild beside it ({gv['rested_warm_share']:.0%} of the gvisor tier's found a
  warm sandbox, {ns['rested_warm_share']:.0%} of the namespace tier's). `print(1)` p50 gvisor
  {gv['print_rested']['p50']:.1f} ms, namespace {ns['print_rested']['p50']:.1f} ms
  ({ratio(gv['print_rested']['p50'], ns['print_rested']['p50']):.2f} x); the data snippet gvisor
  {gv['snippet_rested']['p50']:.1f} ms, namespace {ns['snippet_rested']['p50']:.1f} ms
  ({ratio(gv['snippet_rested']['p50'], ns['snippet_rested']['p50']):.2f} x).
- An idle warm sandbox (PSS of the server's sandbox processes over its {gv['warm_idle']} idle warm
  sandboxes): gvisor {gv['idle_sandbox_mib']:.1f} MiB each, namespace {ns['idle_sandbox_mib']:.1f} MiB each
  ({ns['warm_idle']} idle). A principal that runs nothing keeps nothing in either tier: a
  gVisor sandbox holds one run and ends with it.
"""
    b.replace_section(path, mark, text)
