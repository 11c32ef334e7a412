# Attacks: time-of-check to time-of-use in collection. A detached background process
# swaps, atomically and without pause (renameat2 RENAME_EXCHANGE), a directory of decoys
# with a symbolic link to /etc, and a decoy file with a link to /etc/passwd, for as long
# as it lives. A collector that checks a path and then opens it by name can be sent to
# /etc when the swap lands in between.
# Expect: whatever the collector sees, every file it collects is a decoy ("decoy\n"),
# nothing from /etc is read, and the swapper dies with the run.
import ctypes, os, time
os.chdir("/mnt/data")
libc = ctypes.CDLL(None, use_errno=True)
AT_FDCWD, RENAME_EXCHANGE = -100, 2

def exchange(a, b):
    try:
        return libc.renameat2(AT_FDCWD, a, AT_FDCWD, b, RENAME_EXCHANGE) == 0
    except AttributeError:
        # No renameat2 in this libc: swap through a third name (not atomic, still racy).
        try:
            os.rename(a, b"tmp_swap")
            os.rename(b, a)
            os.rename(b"tmp_swap", b)
            return True
        except OSError:
            return False

os.mkdir("out")
for name in ("passwd", "group", "hostname"):
    with open(os.path.join("out", name), "w") as f:
        f.write("decoy\n")
os.symlink("/etc", "swap")
with open("file_swap", "w") as f:
    f.write("decoy\n")
os.symlink("/etc/passwd", "file_link")
print("exchange works:", exchange(b"out", b"swap") and exchange(b"out", b"swap"), flush=True)
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        while True:
            exchange(b"out", b"swap")
            exchange(b"file_swap", b"file_link")
    os._exit(0)
time.sleep(1)
print("leaving the swapper running")
