# Attacks: kernel file tables. Opens 100,000 files.
# Expect: RLIMIT_NOFILE stops it early with EMFILE.
import os
fds = []
error = None
for i in range(100_000):
    try:
        fds.append(os.open("/dev/null", os.O_RDONLY))
    except OSError as e:
        error = e.errno
        break
print(len(fds), error)
