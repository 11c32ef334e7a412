# Attacks: host memory. Allocates and touches memory without end.
# Expect: the memory cgroup's OOM killer ends the run (oom_killed, SIGKILL), no swap.
chunks = []
while True:
    chunks.append(bytearray(64 << 20))
    for i in range(0, len(chunks[-1]), 4096):
        chunks[-1][i] = 1
