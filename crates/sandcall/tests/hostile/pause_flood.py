# Attacks the server's memory through one pause: writes N tool calls of ~1 MiB each
# straight to the tool socket (no runner in between), then one flush, so that every
# call the server accepts is handed out in a single pause. Once resumed, prints
# {"refused": how many replies were refusals, "limits": refusals by the limit their
# reason names, "other": a reason that names neither budget}.
import json
import socket
import sys

n = int(sys.argv[1])
size = int(sys.argv[2])
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect("/run/sandcall/tools.sock")
blob = "x" * size
for i in range(n):
    call = {"op": "call", "id": i, "name": "store", "arguments": {"blob": blob}}
    s.sendall((json.dumps(call) + "\n").encode())
s.sendall(b'{"op":"flush"}\n')
replies = s.makefile("rb")
refused = 0
limits = {}
other = None
for _ in range(n):
    reply = json.loads(replies.readline())
    if not reply["ok"]:
        refused += 1
        error = reply["error"]
        limit = next((l for l in ("max_pause_bytes", "max_session_tool_bytes") if l in error), None)
        if limit is None:
            other = other or error
        else:
            limits[limit] = limits.get(limit, 0) + 1
print(json.dumps({"refused": refused, "limits": limits, "other": other}))
