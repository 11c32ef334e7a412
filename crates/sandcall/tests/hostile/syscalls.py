# Attacks: the kernel's attack surface. Calls each dangerous system call directly
# (x86_64 numbers) and reports the errno it got.
# Expect: every one is refused with EPERM, and the process holds no capability.
import ctypes, json, os, platform, signal, sys
if platform.machine() != "x86_64":
    sys.exit("this fixture knows x86_64 syscall numbers only")
libc = ctypes.CDLL(None, use_errno=True)
server_pid = int(sys.argv[1])
calls = {
    "ptrace": (101, 0, 0, 0, 0),            # PTRACE_TRACEME
    "mount": (165, b"none", b"/tmp", b"tmpfs", 0, 0),
    "unshare": (272, 0x10000000),           # CLONE_NEWUSER
    "setns": (308, 0, 0),
    "keyctl": (250, 0, 0, 0, 0),
    "bpf": (321, 0, 0, 0),
    "io_uring_setup": (425, 1, 0),
    "perf_event_open": (298, 0, 0, -1, -1, 0),
    "userfaultfd": (323, 0),
    "init_module": (175, 0, 0, b""),
    "settimeofday": (164, 0, 0),
    "clone_newuser": (56, 0x10000000 | 17, 0, 0, 0, 0),
    "socket_vsock": (41, 40, 1, 0),         # AF_VSOCK, SOCK_STREAM
}
out = {}
for name, (nr, *args) in calls.items():
    r = libc.syscall(nr, *[ctypes.c_char_p(a) if isinstance(a, bytes) else ctypes.c_long(a) for a in args])
    out[name] = 0 if r >= 0 else ctypes.get_errno()
def try_kill(pid):
    try:
        os.kill(pid, signal.SIGKILL)
        return "sent"
    except ProcessLookupError:
        return "no such process"
    except PermissionError:
        return "permission denied"
out["kill_server"] = try_kill(server_pid)
out["kill_minus_one"] = try_kill(-1)
# Capabilities, no_new_privs and the seccomp mode as the kernel reports them to the
# process itself (capget and prctl: /proc/self/status differs between kernels).
class CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]
class CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]
header, data = CapHeader(0x20080522, 0), (CapData * 2)()
assert libc.capget(ctypes.byref(header), data) == 0
def mask(lo, hi):
    return "%016x" % (lo | hi << 32)
def held(*option):
    bits = 0
    for cap in range(64):
        r = libc.prctl(*option, cap, *[0] * (4 - len(option)))
        if r < 0:
            break  # past the last capability, or (ambient) a kernel without the set
        bits |= (r == 1) << cap
    return "%016x" % bits
out["caps"] = [
    mask(data[0].effective, data[1].effective),
    mask(data[0].permitted, data[1].permitted),
    held(23),     # PR_CAPBSET_READ
    held(47, 1),  # PR_CAP_AMBIENT, PR_CAP_AMBIENT_IS_SET
]
out["no_new_privs"] = str(libc.prctl(39, 0, 0, 0, 0))  # PR_GET_NO_NEW_PRIVS
out["seccomp"] = str(libc.prctl(21, 0, 0, 0, 0))       # PR_GET_SECCOMP: 2 is filter mode
print(json.dumps(out))
