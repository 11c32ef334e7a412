"""Evicted sessions' benchmark, `python3 bench/bench.py --evicted`: what a paused
programmatic session costs the server once it is evicted (its sandbox freed, only its
journal kept), against what it costs while it holds its sandbox, in one run.

1. Warm-up: SANDCALL_BENCH_EVICTED_WARMUP sessions (default 500) are started, each paused
   at its first tool call, and left to be evicted (`session_idle_evict_s` = 1), so that
   the allocator and the session store have reached their steady state.
2. The server's RSS and the session store's size are read; then N sessions
   (SANDCALL_BENCH_EVICTED, default 10,000) are started by 8 clients and left to be
   evicted; both are read again. Their growth per session is what an evicted session
   costs: the goal is none in memory beyond the journal.
3. The PSS of 20 sessions paused with their sandboxes (eviction off) is read the same way,
   as the baseline.
4. 20 of the evicted sessions are resumed: each completes by replay (checked), and the
   resume's latency is reported.

Rewrites the evicted section of docs/benchmarks.md and the "evicted" key of
bench/results.json.
"""
import datetime
import json
import os
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
TOOL = {"name": "inc", "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}}}
CODE = "x = inc(x=1)\nprint(x)\n"
CLIENTS = 8


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def metric(server, name):
    conn = server.conn()
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    conn.close()
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def start_sessions(b, server, n):
    """Starts `n` sessions paused at their first call, with CLIENTS clients; a start
    refused for capacity (every session place held until eviction frees some) waits and
    tries again. Returns the pauses."""
    pauses, lock, left = [], threading.Lock(), [n]

    def client():
        conn = server.conn()
        while True:
            with lock:
                if left[0] == 0:
                    return
                left[0] -= 1
            while True:
                conn.request("POST", "/v1/exec/programmatic",
                             json.dumps({"code": CODE, "tools": [TOOL], "timeout": 600000}),
                             {"Content-Type": "application/json"})
                resp = conn.getresponse()
                body = json.loads(resp.read())
                if resp.status == 200:
                    assert body["status"] == "tool_call_required", body
                    with lock:
                        pauses.append(body)
                    break
                if resp.status in (429, 503):
                    time.sleep(0.2)
                    continue
                raise RuntimeError(f"{resp.status} {body}")

    threads = [threading.Thread(target=client) for _ in range(CLIENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return pauses


def wait_dormant(server, n, limit=600):
    """Waits until the store counts `n` dormant sessions and the server keeps none of them
    in memory (`sandcall_sessions_in_memory`: it drops each once the store has it)."""
    start = time.time()
    while metric(server, "sandcall_sessions_dormant") < n or metric(server, "sandcall_sessions_in_memory") > 0:
        if time.time() - start > limit:
            raise SystemExit(f"only {metric(server, 'sandcall_sessions_dormant'):.0f} of {n} sessions evicted, "
                             f"{metric(server, 'sandcall_sessions_in_memory'):.0f} still in memory")
        time.sleep(0.5)
    time.sleep(2)


def store_bytes(server):
    path = os.path.join(server.dir, "data", "sessions.redb")
    return os.path.getsize(path) if os.path.exists(path) else 0


def main(args, b):
    n = int(os.environ.get("SANDCALL_BENCH_EVICTED", "10000"))
    warmup = int(os.environ.get("SANDCALL_BENCH_EVICTED_WARMUP", "500"))
    started = time.time()
    load_before = os.getloadavg()
    env = {
        "SANDCALL_SESSION_IDLE_EVICT_S": "1",
        "SANDCALL_SESSION_EXPIRY_S": "86400",
        "SANDCALL_TOOL_CALL_TIMEOUT_MS": "86400000",
        "SANDCALL_MAX_SESSIONS": "128",
        "SANDCALL_MAX_SESSIONS_PER_PRINCIPAL": str(n + warmup + 100),
        "SANDCALL_WARM_POOL_SIZE": "4",
        "SANDCALL_WARM_PRELOAD_POOL_SIZE": "0",
    }
    server = b.Server(args.binary, env)
    try:
        server.settle()
        start_sessions(b, server, warmup)
        wait_dormant(server, warmup)
        rss0, db0 = rss_kib(server.proc.pid), store_bytes(server)
        t = time.time()
        pauses = start_sessions(b, server, n)
        start_rate = n / (time.time() - t)
        wait_dormant(server, warmup + n)
        rss1, db1 = rss_kib(server.proc.pid), store_bytes(server)
        in_memory = metric(server, "sandcall_sessions_in_memory")
        # Resumes of evicted sessions: each completes by replay.
        conn = server.conn()
        replay_ms = []
        for p in pauses[:20]:
            call = p["tool_calls"][0]
            t = time.perf_counter()
            r = b.post(conn, "/v1/exec/programmatic", {
                "session_id": p["session_id"], "continuation_token": p["continuation_token"],
                "tool_results": [{"call_id": call["id"], "result": 2}]})
            replay_ms.append((time.perf_counter() - t) * 1000)
            assert r["status"] == "completed" and r["stdout"] == "2\n", r
    finally:
        server.stop()
    # The baseline: sessions paused with their sandboxes.
    live_env = dict(env, SANDCALL_SESSION_IDLE_EVICT_S="0")
    server = b.Server(args.binary, live_env)
    try:
        server.settle()
        live_mib = b.memory_per_paused_session(server, 20)
    finally:
        server.stop()
    evicted_kib = (rss1 - rss0) / n
    out = {
        "date": datetime.date.today().isoformat(),
        "seconds": round(time.time() - started),
        "sessions": n,
        "warmup": warmup,
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
        "rss_before_mib": rss0 / 1024,
        "rss_after_mib": rss1 / 1024,
        "rss_per_evicted_session_kib": evicted_kib,
        "journal_bytes_per_session": (db1 - db0) / n,
        "sessions_in_memory_after": in_memory,
        "live_paused_session_mib": live_mib,
        "evicted_over_live": evicted_kib / 1024 / live_mib if live_mib > 0 else None,
        "starts_per_second": start_rate,
        "replay_resume_ms": b.summary(replay_ms),
    }
    results = args.json
    full = json.load(open(results)) if os.path.exists(results) else {}
    full["evicted"] = out
    with open(results, "w") as f:
        json.dump(full, f, indent=1)
    write_section(b, out, args.out, b.EVICTED_MARK)
    text = open(args.out).read()
    print(text[text.find(b.EVICTED_MARK):])


def write_section(b, r, path, mark):
    la, lb = r["load_average_before"], r["load_average_after"]
    s = r["replay_resume_ms"]
    text = f"""{mark}

## Evicted sessions: what a paused session costs once its sandbox is freed

Generated by `python3 bench/bench.py --evicted --binary target/release/sandcall` (do not
edit by hand). Measured {r['date']} in {r['seconds']} s; load average (1, 5, 15 min)
{la[0]:.2f} {la[1]:.2f} {la[2]:.2f} before and {lb[0]:.2f} {lb[1]:.2f} {lb[2]:.2f} after.

{r['sessions']:,} programmatic sessions (after {r['warmup']} to warm up) were each paused
at their first tool call by 8 clients and evicted after `session_idle_evict_s` = 1; the
server's RSS and the embedded session store's file were read before and after. The
baseline is the PSS of a session paused with its sandbox, measured in the same run.

| measure | value |
|---|---|
| server RSS before / after {r['sessions']:,} evicted sessions | {r['rss_before_mib']:.1f} MiB / {r['rss_after_mib']:.1f} MiB |
| RSS per evicted session | {r['rss_per_evicted_session_kib']:.2f} KiB |
| sessions the server keeps in memory after their eviction (`sandcall_sessions_in_memory`) | {r.get('sessions_in_memory_after', 0):.0f} |
| session store (journal) per session | {r['journal_bytes_per_session']:.0f} bytes |
| a session paused with its sandbox (PSS) | {r['live_paused_session_mib']:.2f} MiB |
| evicted / live, per session | {r['evicted_over_live']:.5f} |
| sessions started and paused per second (8 clients) | {r['starts_per_second']:.0f} |
| resume of an evicted session (replay), p50 / p90 ms | {s['p50']:.0f} / {s['p90']:.0f} |
"""
    b.replace_section(path, mark, text)
