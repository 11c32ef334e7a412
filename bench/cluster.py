#!/usr/bin/env python3
"""Resume latency across a two-node cluster over Redis (issue 13): a program that calls
one tool per pause, resumed at its 1st, 10th and 50th call,

  live       on the node that holds it (the paused process goes on),
  forwarded  sent to the other node, which forwards it to the owner,
  replayed   after eviction (the program runs again from its journal).

  python3 bench/cluster.py [--binary target/release/sandcall] [--runs 5] [--calls 1,10,50]

Starts its own redis-server (Debian's) on a free loopback port and two nodes; prints a
Markdown table of medians (ms) and writes it as JSON to bench/cluster-results.json.
Needs root (real sandboxes). Run it on a quiet machine: the figures are wall-clock times.
"""
import argparse
import http.client
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SECRET = "ab" * 32
EVICT_S = 1
TOOL = {
    "name": "get",
    "description": "gets",
    "parameters": {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]},
}


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class Redis:
    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="sandcall-bench-redis-")
        self.port = free_port()
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--dir", self.dir,
             "--save", "", "--appendonly", "yes", "--appendfsync", "everysec"],
            stdout=subprocess.DEVNULL)
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                time.sleep(0.05)
        raise SystemExit("redis-server did not start")

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=30)
        shutil.rmtree(self.dir, ignore_errors=True)


class Node:
    def __init__(self, binary, redis_url):
        self.dir = tempfile.mkdtemp(prefix="sandcall-bench-node-")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = dict(os.environ, SANDCALL_LOG="warn", SANDCALL_SESSION_STORE=redis_url, SANDCALL_NODE_URL=self.url,
                   SANDCALL_TOKEN_SECRET=SECRET, SANDCALL_SESSION_IDLE_EVICT_S=str(EVICT_S),
                   SANDCALL_MAX_TOOL_CALLS="200")
        self.proc = subprocess.Popen(
            [binary, "serve", "--listen", f"127.0.0.1:{self.port}", "--data-dir", os.path.join(self.dir, "data")],
            stdout=subprocess.PIPE, env=env, text=True)
        for line in self.proc.stdout:
            if re.match(r"sandcall listening on ", line):
                break
        else:
            raise SystemExit("sandcall did not start")

    def post(self, body):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
        conn.request("POST", "/v1/exec/programmatic", json.dumps(body), {"Content-Type": "application/json"})
        resp = conn.getresponse()
        data = json.loads(resp.read())
        how = resp.getheader("sandcall-resume")
        conn.close()
        if resp.status != 200:
            raise RuntimeError(f"{resp.status} {data}")
        return data, how

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=60)
        shutil.rmtree(self.dir, ignore_errors=True)


def resume_body(paused, value):
    call = paused["tool_calls"][0]
    return {"session_id": paused["session_id"], "continuation_token": paused["continuation_token"],
            "tool_results": [{"call_id": call["id"], "result": value, "is_error": False}]}


def at_call(node, k, calls):
    """A session paused at its k-th call (k-1 calls answered already)."""
    code = f"for i in range({calls}):\n    r = get(n=i)\nprint('done')\n"
    paused, _ = node.post({"language": "python", "code": code, "tools": [TOOL]})
    for i in range(k - 1):
        paused, _ = node.post(resume_body(paused, i))
    return paused


def measure(a, b, mode, k, calls):
    paused = at_call(a, k, calls)
    target = b if mode == "forwarded" else a
    if mode == "replayed":
        time.sleep(EVICT_S + 1.5)
    t = time.perf_counter()
    answer, how = target.post(resume_body(paused, k))
    ms = (time.perf_counter() - t) * 1000
    want = "replay" if mode == "replayed" else "live"
    if how != want:
        raise RuntimeError(f"{mode}: the resume was served {how}, not {want}")
    if answer["status"] not in ("tool_call_required", "completed"):
        raise RuntimeError(f"{mode}: {answer}")
    # Ended, so that the sessions measured do not pile up.
    conn = http.client.HTTPConnection("127.0.0.1", a.port, timeout=120)
    conn.request("POST", "/v1/exec/programmatic/cancel", json.dumps({"session_id": paused["session_id"]}),
                 {"Content-Type": "application/json"})
    conn.getresponse().read()
    conn.close()
    return ms


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--binary", default=os.path.join(ROOT, "target/release/sandcall"))
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--calls", default="1,10,50")
    args = ap.parse_args()
    points = [int(c) for c in args.calls.split(",")]
    calls = max(points) + 1
    redis = Redis()
    url = f"redis://127.0.0.1:{redis.port}/0"
    a, b = Node(args.binary, url), Node(args.binary, url)
    results = {}
    try:
        for k in points:
            for mode in ("live", "forwarded", "replayed"):
                ms = [measure(a, b, mode, k, calls) for _ in range(args.runs)]
                results[f"{mode}@{k}"] = {"median_ms": statistics.median(ms), "runs": ms}
    finally:
        a.stop()
        b.stop()
        redis.stop()
    print("| resume at call | live (same node) | forwarded | replayed after eviction |")
    print("| --- | --- | --- | --- |")
    for k in points:
        row = [f"{results[f'{m}@{k}']['median_ms']:.1f} ms" for m in ("live", "forwarded", "replayed")]
        print(f"| {k} | " + " | ".join(row) + " |")
    with open(os.path.join(ROOT, "bench", "cluster-results.json"), "w") as f:
        json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
