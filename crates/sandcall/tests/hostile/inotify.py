# Attacks: the page cache shared with other tenants. inotify on the read-only /usr
# (e.g. /usr/lib/python3*/__pycache__) would show when another run imports a module.
# Calls inotify_init1, inotify_init (x86_64 has it) and inotify_add_watch by number and
# reports the errno each got (0 if it succeeded).
# Expect: every one refused with EPERM (1), like fanotify.
import ctypes, glob, json, os, platform, sys

if platform.machine() != "x86_64":
    sys.exit("this fixture knows x86_64 syscall numbers only")
libc = ctypes.CDLL(None, use_errno=True)
SYS_inotify_init, SYS_inotify_add_watch, SYS_inotify_init1 = 253, 254, 294
IN_ACCESS, IN_OPEN = 0x1, 0x20

def call(nr, *args):
    r = libc.syscall(nr, *args)
    return (0, r) if r >= 0 else (ctypes.get_errno(), r)

out = {}
errno, fd1 = call(SYS_inotify_init1, 0)
out["inotify_init1"] = errno
errno, fd0 = call(SYS_inotify_init)
out["inotify_init"] = errno
# With a real descriptor if one was given; otherwise -1, which is EBADF unless the
# filter refuses the call itself.
fd = fd1 if fd1 >= 0 else fd0
target = (glob.glob("/usr/lib/python3*/__pycache__") or ["/usr"])[0]
errno, _ = call(SYS_inotify_add_watch, ctypes.c_int(fd), target.encode(), IN_ACCESS | IN_OPEN)
out["inotify_add_watch"] = errno
print(json.dumps(out))
