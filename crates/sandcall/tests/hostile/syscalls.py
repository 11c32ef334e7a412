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
status = open("/proc/self/status").read()
out["caps"] = [l.split()[1] for l in status.splitlines() if l.startswith(("CapEff", "CapPrm", "CapBnd", "CapAmb"))]
out["no_new_privs"] = [l.split()[1] for l in status.splitlines() if l.startswith("NoNewPrivs")][0]
out["seccomp"] = [l.split()[1] for l in status.splitlines() if l.startswith("Seccomp:")][0]
print(json.dumps(out))
