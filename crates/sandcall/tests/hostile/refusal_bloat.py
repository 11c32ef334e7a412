# Attacks: the server's memory, with tool calls it refuses. Each refusal's reason quotes
# what the program sent, and the server keeps it (the session's audit trail, the log):
#   big:  40 calls under names of 2 MB, 40 whose arguments are a 2 MB string instead of
#         an object, 40 of `count` whose integer `n` is a 1 MB string (under
#         max_tool_call_bytes, so the schema check quotes it);
#   fill: argv[2] calls of `count` with a 2 KB string `n`: each reason over 1 KiB.
# Writes them straight to the tool socket, 100 unanswered at most, and reads every answer.
# Expect: long names refused by the helper; every reason the program gets is short.
import json, os, socket, sys, threading

mode = sys.argv[1] if len(sys.argv) > 1 else "big"

def calls():
    if mode == "big":
        for i in range(40):
            name = "n" * 2_000_000 + str(i)
            yield ('{"op":"call","id":"name-%d","name":"%s","arguments":{}}\n' % (i, name)).encode()
        for i in range(40):
            text = "x" * 2_000_000
            yield ('{"op":"call","id":"text-%d","name":"count","arguments":"%s"}\n' % (i, text)).encode()
        for i in range(40):
            value = "y" * 1_000_000
            yield ('{"op":"call","id":"value-%d","name":"count","arguments":{"n":"%s"}}\n' % (i, value)).encode()
    else:
        value = "z" * 2000
        for i in range(int(sys.argv[2])):
            yield ('{"op":"call","id":"fill-%d","name":"count","arguments":{"n":"%s"}}\n' % (i, value)).encode()

sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
sock.connect("/run/sandcall/tools.sock")

replies, refused, longest, over_128, buf = 0, 0, 0, 0, b""
sock.settimeout(60)
# At most 100 calls unanswered, under the helper's bound on calls waiting for an answer;
# written on a thread, so that long answers are read while calls are written.
window = threading.Semaphore(100)
total = 120 if mode == "big" else int(sys.argv[2])

def write():
    try:
        for line in calls():
            window.acquire()
            sock.sendall(line)
    except OSError:
        pass

threading.Thread(target=write, daemon=True).start()
while replies < total:
    chunk = sock.recv(1 << 16)
    if not chunk:
        break
    buf += chunk
    *done, buf = buf.split(b"\n")
    for line in done:
        reply = json.loads(line)
        replies += 1
        window.release()
        refused += reply.get("kind") == "refused"
        error = reply.get("error") or ""
        longest = max(longest, len(error.encode()))
        over_128 += "over 128 characters" in error
print(json.dumps({"replies": replies, "refused": refused, "longest_error": longest, "over_128": over_128}), flush=True)
os._exit(0)
