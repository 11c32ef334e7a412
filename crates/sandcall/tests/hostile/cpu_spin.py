# Attacks: the CPU. Spins forever without a system call the helper could notice.
# Expect: killed at the wall-clock deadline, within a few milliseconds of it.
while True:
    pass
