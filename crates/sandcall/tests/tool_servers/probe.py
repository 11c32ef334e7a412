"""A tool server (an MCP server over stdio, the standard library only) that reports what
it sees, for the tests of hostile/tool_servers.rs. It runs on the host as a server of
`mcp_servers`, never inside a sandbox. What it attacks: a tool server that is handed
sandcall's environment (API keys, token secret, cloud credentials), and one process
serving every principal (its state a channel between tenants).

Its one tool, `whoami`, answers its pid, how many calls this process has answered, and
its whole environment; with `sleep` it first creates the file PROBE_BUSY names (so the
test knows the process is busy) and waits that many seconds."""

import json
import os
import sys
import time

CALLS = 0


def answer(request_id, result):
    sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": request_id, "result": result}) + "\n")
    sys.stdout.flush()


TOOL = {
    "name": "whoami",
    "description": "This process's pid, calls answered and environment.",
    "inputSchema": {"type": "object", "properties": {"sleep": {"type": "number"}}},
}

for line in sys.stdin:
    message = json.loads(line)
    method, request_id = message.get("method"), message.get("id")
    if request_id is None:
        continue  # a notification (initialized, cancelled)
    if method == "initialize":
        answer(
            request_id,
            {
                "protocolVersion": message["params"]["protocolVersion"],
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "probe", "version": "1"},
            },
        )
    elif method == "tools/list":
        answer(request_id, {"tools": [TOOL]})
    elif method == "tools/call":
        sleep = float(message["params"].get("arguments", {}).get("sleep", 0))
        if sleep:
            open(os.environ["PROBE_BUSY"], "w").close()
            time.sleep(sleep)
        CALLS += 1
        report = {"pid": os.getpid(), "calls": CALLS, "env": dict(os.environ)}
        answer(request_id, {"content": [{"type": "text", "text": json.dumps(report)}]})
    else:
        sys.stdout.write(
            json.dumps({"jsonrpc": "2.0", "id": request_id, "error": {"code": -32601, "message": method}}) + "\n"
        )
        sys.stdout.flush()
