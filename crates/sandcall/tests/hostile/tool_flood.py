# Attacks: the helper's buffers for the tool socket, which live outside the run's
# cgroup. Opens as many tool connections as the helper accepts (64) and sends 2 MiB
# without a newline on each, then holds them all open: an unbounded helper holds
# 64 x 2 MiB for this one run.
# Expect: the helper's memory grows by a small bounded amount (reading pauses or the
# connections are closed); the run ends at its timeout.
import socket, sys, time

chunk = b"x" * (2 << 20)
conns, sent = [], 0
for _ in range(64):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect("/run/sandcall/tools.sock")
    except OSError:
        break
    s.setblocking(False)
    conns.append([s, 0])
# Round-robin, non-blocking: a connection whose reading the helper paused must not
# stop the others from sending.
deadline = time.monotonic() + float(sys.argv[1] if len(sys.argv) > 1 else 3)
while time.monotonic() < deadline and any(c[1] < len(chunk) for c in conns if c[0]):
    progress = False
    for c in conns:
        if c[0] is None or c[1] >= len(chunk):
            continue
        try:
            n = c[0].send(chunk[c[1]:c[1] + (256 << 10)])
            c[1] += n
            sent += n
            progress = True
        except BlockingIOError:
            pass
        except OSError:
            c[0] = None
    if not progress:
        time.sleep(0.005)
print(len(conns), sent, flush=True)
time.sleep(1000)
