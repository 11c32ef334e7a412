# Attacks: the warm runner's status channel (fd 3), whose messages the helper reads
# outside the run's cgroup. Writes 63 MiB there without a newline, just under the
# helper's old 64 MiB line cap, so an unbounded helper holds all of it.
# Expect: the helper drops the channel after a few KiB; its memory hardly grows.
import os, time

chunk = b"x" * (1 << 20)
written = 0
try:
    while written < 63 << 20:
        written += os.write(3, chunk)
except OSError as e:
    print("fd 3 closed:", type(e).__name__)
print("written", written, flush=True)
time.sleep(float(os.environ.get("HOLD", "1.5")))
