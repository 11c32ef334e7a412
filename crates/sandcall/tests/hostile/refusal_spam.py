# Attacks: the CPU the helper and the server spend refusing tool calls, none of it
# charged to the run. Writes 20,000 calls of an undeclared tool straight to the tool
# socket and counts the refusals that come back within 2 s.
# Expect: refusals are rate-limited (a burst, then a steady trickle).
import json, os, socket, threading, time

sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
sock.connect("/run/sandcall/tools.sock")
calls = b"".join(b'{"op":"call","id":%d,"name":"no_such_tool","arguments":{}}\n' % i for i in range(20000))

def write():
    try:
        sock.sendall(calls)
    except OSError:
        pass

threading.Thread(target=write, daemon=True).start()
start = time.monotonic()
refused, buf = 0, b""
sock.settimeout(0.1)
while time.monotonic() - start < 2.0:
    try:
        chunk = sock.recv(1 << 16)
    except socket.timeout:
        continue
    if not chunk:
        break
    buf += chunk
    *lines, buf = buf.split(b"\n")
    refused += sum(1 for l in lines if json.loads(l).get("kind") == "refused")
print(json.dumps({"refused": refused, "elapsed": time.monotonic() - start}), flush=True)
os._exit(0)
