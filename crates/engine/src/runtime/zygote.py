# sandcall's Python template (the "zygote", ARCHITECTURE.md "Forked runs"). It runs in
# a sandbox of its own, built like any warm sandbox but without the seccomp filter: it
# has no capabilities and no_new_privs, and it never runs a line of user code. It starts
# the interpreter once, loads runner.py (its source is argv[1]), imports the preloads,
# then forks one run per request that arrives on its listening socket (fd 4), until
# the pool asks it to exit. Each principal has templates of its own (pool.rs), so the
# runs forked from one template share their randomness only with runs of the same
# principal:
#
#   template --fork--> C: on cgroup v2 born in the run's cgroup (clone3 with
#                         CLONE_INTO_CGROUP, into the cgroup the helper sends with its
#                         request for a fork); says hello with its credentials, so the
#                         helper learns its pid; waits for the run's request, which the
#                         helper sends once C is in the run's cgroup (it moves C there
#                         if it was not born there: cgroup v1, or no clone3); unshares
#                         user, pid, mount, net, IPC and UTS namespaces, maps uid/gid
#                         1000 to itself, forks G (born in the run's cgroup), exits
#              G (pid 1 of the run): fresh /proc, tmpfs on /tmp, /dev/shm, /mnt/data and
#                         /run/sandcall; unshares the cgroup namespace; says hello with
#                         its credentials, so the helper learns its pid; forks P; reaps
#              P (pid 2, the program): stdio, rlimits, no capabilities, no_new_privs,
#                         seccomp, fresh random state; waits until G releases it, then
#                         runner.py's main(), which reads its go on fd 3 as in a warm
#                         sandbox. The helper's one message "seal" (sent with the go,
#                         no answer awaited) makes G remount /run/sandcall read-only
#                         and only then release P.
#
# Every message from the helper is trusted (it is sandcall's own); nothing here reads
# anything a program controls.
import ctypes
import fcntl
import gc
import json
import os
import resource
import select
import signal
import socket
import struct
import sys
import time

_LIBC = ctypes.CDLL(None, use_errno=True)
# The same C library, called with the GIL held (clone3 below forks this process).
_LIBC_GIL = ctypes.PyDLL(None, use_errno=True)
_LIBC_GIL.syscall.restype = ctypes.c_long
_LIBC.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
_LIBC.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
_LIBC.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]

_CLONE_NEWNS = 0x00020000
_CLONE_NEWCGROUP = 0x02000000
_CLONE_NEWUTS = 0x04000000
_CLONE_NEWIPC = 0x08000000
_CLONE_NEWUSER = 0x10000000
_CLONE_NEWPID = 0x20000000
_CLONE_NEWNET = 0x40000000
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 1, 2, 4, 8
_MS_REMOUNT, _MS_BIND, _MS_REC, _MS_PRIVATE = 32, 4096, 16384, 1 << 18
_MNT_DETACH = 2
_PR_SET_DUMPABLE, _PR_CAPBSET_DROP, _PR_SET_SECCOMP = 4, 24, 22
_PR_SET_NO_NEW_PRIVS, _PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL = 38, 47, 4
_SECCOMP_MODE_FILTER = 2
_SANDBOX_ID = 1000
_LISTENER = 4
_SYS_CLONE3 = 435  # x86-64 and arm64 alike
_CLONE_INTO_CGROUP = 0x200000000
_ENOSYS, _E2BIG, _EINVAL = 38, 7, 22
# The same numbers on x86-64 and arm64.
_SYS_LANDLOCK_CREATE_RULESET, _SYS_LANDLOCK_ADD_RULE, _SYS_LANDLOCK_RESTRICT_SELF = 444, 445, 446
_LANDLOCK_RULE_PATH_BENEATH = 1
# Read once by the template (`main`), applied by every run it forks.
_LANDLOCK_PLAN = None


class _CloneArgs(ctypes.Structure):
    # struct clone_args as of Linux 5.7 (CLONE_ARGS_SIZE_VER2).
    _fields_ = [
        (name, ctypes.c_uint64)
        for name in (
            "flags",
            "pidfd",
            "child_tid",
            "parent_tid",
            "exit_signal",
            "stack",
            "stack_size",
            "tls",
            "set_tid",
            "set_tid_size",
            "cgroup",
        )
    ]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def _check(result, what):
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, "%s: %s" % (what, os.strerror(errno)))


def _mount(source, target, fstype, flags, data=None):
    _check(
        _LIBC.mount(
            source.encode() if source else None,
            target.encode(),
            fstype.encode() if fstype else None,
            flags,
            data.encode() if data else None,
        ),
        "mount " + target,
    )


def _tmpfs(target, options):
    # The template's own mount stays underneath, locked (it came from a more privileged
    # mount namespace) and empty; nothing of the run can reach it.
    _mount("tmpfs", target, "tmpfs", _MS_NOSUID | _MS_NODEV, options)


def _load_seccomp():
    """The run's seccomp filters, compiled by the helper (`Policy::to_bytes`): each one
    a native-endian u32 count of instructions, then 8 bytes per instruction. Kept in
    ctypes buffers for the template's life, so a run only installs them."""
    with open("/run/sandcall/seccomp.bpf", "rb") as f:
        data = f.read()
    filters = []
    at = 0
    while at < len(data):
        (count,) = struct.unpack_from("=I", data, at)
        at += 4
        buf = ctypes.create_string_buffer(data[at : at + 8 * count], 8 * count)
        at += 8 * count
        filters.append((count, buf))
    if not filters:
        raise RuntimeError("no seccomp filter")
    return filters


def _load_landlock():
    """The run's Landlock rules, planned by the helper (`landlock_layer::plan`) with the
    rights this kernel knows: `abi` 0 means it has no Landlock."""
    with open("/run/sandcall/landlock.json") as f:
        return json.load(f)


def _landlock_call(nr, what, *args):
    ctypes.set_errno(0)
    r = _LIBC.syscall(ctypes.c_long(nr), *args)
    if r < 0:
        errno = ctypes.get_errno()
        raise OSError(errno, "%s: %s" % (what, os.strerror(errno)))
    return r


def _apply_landlock(plan):
    """What `landlock_layer::apply` does for a cold run, here after the run's own mounts
    (a rule holds the mount it was opened on). No Landlock: nothing to do."""
    abi = plan["abi"]
    if abi == 0:
        return
    # struct landlock_ruleset_attr grew with the ABI: handled_access_fs, then
    # handled_access_net (ABI 4), then scoped (ABI 6). Networking is the network
    # namespace's business: no net right is handled.
    size = 24 if abi >= 6 else 16 if abi >= 4 else 8
    attr = ctypes.create_string_buffer(struct.pack("=QQQ", plan["fs"], 0, plan["scoped"])[:size], size)
    ruleset = _landlock_call(_SYS_LANDLOCK_CREATE_RULESET, "landlock_create_ruleset", attr, ctypes.c_size_t(size), ctypes.c_uint32(0))
    try:
        for path, access in plan["rules"]:
            try:
                fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except FileNotFoundError:
                continue
            try:
                # struct landlock_path_beneath_attr (packed): allowed_access, parent_fd.
                rule = ctypes.create_string_buffer(struct.pack("=Qi", access, fd), 12)
                _landlock_call(_SYS_LANDLOCK_ADD_RULE, "landlock_add_rule " + path, ctypes.c_long(ruleset), ctypes.c_long(_LANDLOCK_RULE_PATH_BENEATH), rule, ctypes.c_long(0))
            finally:
                os.close(fd)
        _landlock_call(_SYS_LANDLOCK_RESTRICT_SELF, "landlock_restrict_self", ctypes.c_long(ruleset), ctypes.c_long(0))
    finally:
        os.close(ruleset)


def _send_line(fd, obj):
    data = (json.dumps(obj) + "\n").encode()
    while data:
        data = data[os.write(fd, data) :]


def _run_init(request, fds, runner, filters):
    """G: pid 1 of the run's namespaces (see the top of this file). Never returns."""
    report, stdin_r, stdout_w, stderr_w, go = fds
    limits = request["limits"]
    try:
        # The program runs as the same uid: keep it from ptracing us or reading our
        # memory and descriptors through /proc/1 (we still hold the capabilities of
        # the run's user namespace, and no seccomp filter).
        _check(_LIBC.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0), "set_dumpable")
        # No parent-death signal: the parent, C, exits at once. The run ends when its
        # helper closes the report socket (below) or when the template's init dies.
        # Nothing of this namespace's mounts propagates anywhere.
        _mount(None, "/", None, _MS_REC | _MS_PRIVATE)
        # Our own /proc (we are pid 1 of the new pid namespace): it lists only the run.
        _mount("proc", "/proc", "proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC)
        _tmpfs("/tmp", "size=%d,mode=1777" % limits["tmp_bytes"])
        _tmpfs("/dev/shm", "size=%d,mode=1777" % limits["tmp_bytes"])
        _tmpfs("/mnt/data", "size=%d,mode=0755" % limits["workspace_bytes"])
        # The code directory: written by the helper, then sealed read-only before the go.
        _tmpfs("/run/sandcall", "size=%d,mode=0755" % (request["max_code_bytes"] + (1 << 20)))
        os.chdir("/mnt/data")
        # C was placed in the run's cgroup before it forked us: make it the root of our view.
        _check(_LIBC.unshare(_CLONE_NEWCGROUP), "unshare cgroup namespace")
        # The helper learns our pid (as it sees it) from these credentials.
        _hello(report)
    except BaseException as error:  # noqa: BLE001 - reported, then this process ends
        try:
            _send_line(report, {"init": "setup_failed", "message": str(error)})
        finally:
            os._exit(1)
    # The program waits on this pipe, before it reads its go, until we have sealed the
    # code directory: one message from the helper ("seal") does both, so no line of the
    # run's code runs while /run/sandcall is writable, and the helper does not wait for us.
    # (Above the program's fds 0 to 4, which it is moved to: C closed fds 3 and 4.)
    release_r, release_w = os.pipe2(os.O_CLOEXEC)
    for_program = fcntl.fcntl(release_r, fcntl.F_DUPFD_CLOEXEC, 5)
    os.close(release_r)
    release_r = for_program
    program = os.fork()
    if program == 0:
        os.close(release_w)
        _run_program(request, (stdin_r, stdout_w, stderr_w, go, release_r), runner, filters)
    for fd in (stdin_r, stdout_w, stderr_w, go, release_r):
        os.close(fd)
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    _send_line(report, {"init": "ready"})
    pending = b""
    # No timeout: SIGCHLD's wake-up fd and the report socket are all there is to wait
    # for. The children are looked at first, so a program that ended before the
    # handler was set is seen too.
    while True:
        try:
            while os.read(wake_r, 64):
                pass
        except BlockingIOError:
            pass
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                os._exit(0)
            if pid == 0:
                break
            if pid == program:
                if os.WIFSIGNALED(status):
                    _send_line(report, {"init": "signaled", "signal": os.WTERMSIG(status)})
                else:
                    _send_line(report, {"init": "exited", "code": os.WEXITSTATUS(status)})
                os._exit(0)
        ready, _, _ = select.select([report, wake_r], [], [])
        if report in ready:
            chunk = os.read(report, 64)
            if not chunk:
                # The helper is gone: so is the run (every process of this namespace).
                os._exit(1)
            pending += chunk
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                if line == b"seal" and release_w is not None:
                    try:
                        _mount(None, "/run/sandcall", None, _MS_BIND | _MS_REMOUNT | _MS_RDONLY | _MS_NOSUID | _MS_NODEV)
                    except OSError as error:
                        # The program never gets its release: it ends with the namespace.
                        _send_line(report, {"init": "setup_failed", "message": str(error)})
                        os._exit(1)
                    os.write(release_w, b"g")
                    os.close(release_w)
                    release_w = None


def _run_program(request, fds, runner, filters):
    """P: the program. The same steps, in the same order, as a cold run's program before
    its execve (ARCHITECTURE.md, steps 16 to 22); then the runner. Never returns."""
    try:
        os.setsid()
        for fd, to in zip(fds, (0, 1, 2, 3, 4)):
            os.dup2(fd, to)
        os.closerange(5, 1 << 20)
        signal.pthread_sigmask(signal.SIG_SETMASK, [])
        gc.enable()
        limits = request["limits"]
        cpu_s = max(1, -(-limits["cpu_time_ms"] // 1000)) + 1
        for res, value in (
            (resource.RLIMIT_NOFILE, limits["max_open_files"]),
            (resource.RLIMIT_FSIZE, limits["file_size_bytes"]),
            (resource.RLIMIT_NPROC, limits["max_processes"]),
            (resource.RLIMIT_CORE, 0),
            (resource.RLIMIT_CPU, cpu_s),
        ):
            resource.setrlimit(res, (value, value))
        hard = resource.getrlimit(resource.RLIMIT_DATA)[1]
        resource.setrlimit(resource.RLIMIT_DATA, (hard, hard))
        # Capabilities: bounding set first, while CAP_SETPCAP is still held.
        with open("/proc/sys/kernel/cap_last_cap", "rb") as f:
            last = int(f.read())
        for cap in range(last + 1):
            _check(_LIBC.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0), "drop bounding capability %d" % cap)
        _check(_LIBC.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0), "clear ambient capabilities")
        header = _CapHeader(0x20080522, 0)
        data = (_CapData * 2)()
        _check(_LIBC.syscall(126 if os.uname().machine == "x86_64" else 91, ctypes.byref(header), data), "capset")
        _check(_LIBC.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
        _apply_landlock(_LANDLOCK_PLAN)
        # seccomp last: from here on only the program's own calls happen.
        for count, buf in filters:
            prog = _SockFprog(count, ctypes.addressof(buf))
            _check(_LIBC.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.addressof(prog), 0, 0), "seccomp")
        _reseed()
        _rehearse(runner)
    except BaseException as error:  # noqa: BLE001
        try:
            os.write(2, ("sandcall: cannot start the program: %s\n" % error).encode())
        finally:
            os._exit(126)
    # Released by init once the code directory is read-only (`_run_init`); anything
    # else (init gone before it sealed) ends the program before any of the run's code.
    try:
        released = os.read(4, 1) == b"g"
        os.close(4)
    except OSError:
        released = False
    if not released:
        os._exit(126)
    try:
        runner["main"](True)
    except SystemExit as exit_request:
        code = exit_request.code
        os._exit(code if isinstance(code, int) else 1)
    os._exit(0)


def _rehearse(runner):
    """While the program waits for its go: the steps of a go once over (read the go's
    JSON, compile and run a line that prints, read a file), so that the pages they write
    (reference counts of the objects they use, the allocator's free lists) are copied
    from the template's now, not on the request path. Measured with perf on one
    `print(1)`: 88 page faults and 0.6 ms of CPU in the program after its go without
    this, 46 with it, against 5 faults and 0.4 ms for a built sandbox's program.
    Nothing of it is left for the program to see (runner.py, `_warm_paths`). Not the
    preloads' throwaway chart (`_warm_up`): drawn again in every program, it copied
    about 11 MiB of the template's pages into each preloaded sandbox."""
    json.loads('{"args": [], "tools": false}')
    runner["_warm_paths"]()
    sys.modules["types"].ModuleType("__main__")


def _reseed():
    """Every random source a program can read that the template's memory holds gets
    fresh state from the kernel: Python's `random` (also reseeded by its own fork hook)
    and numpy's global generator. Programmatic runs then seed both from their session's
    seed, as in any warm sandbox (runner.py, `_seed_generators`)."""
    import random

    random.seed()
    numpy_random = sys.modules.get("numpy.random")
    if numpy_random is not None:
        numpy_random.seed()


def _hello(report):
    """Says hello on the report socket with our credentials: the kernel translates our
    pid into the helper's pid namespace, so the helper learns who we are."""
    sock = socket.socket(fileno=report)
    creds = struct.pack("iII", os.getpid(), os.getuid(), os.getgid())
    sock.sendmsg([b"hello\n"], [(socket.SOL_SOCKET, socket.SCM_CREDENTIALS, creds)])
    sock.detach()


# False once this kernel has said it cannot clone into a cgroup: fork from then on.
_clone3_works = [True]


def _fork_into(cgroup):
    """Forks as os.fork() does, with the interpreter's fork hooks around it; the child
    born in the cgroup v2 directory `cgroup` (a descriptor) when there is one and the
    kernel can (clone3 with CLONE_INTO_CGROUP: Linux 5.7, and no seccomp profile that
    hides clone3). Where it cannot, or refuses (the cgroup is gone, or not ours to
    clone into), a plain fork: the helper then moves the child (Sandbox::fork_steps).
    Returns 0 in the child and the child's pid in the parent. The child's C library
    keeps its parent's cached thread id (clone3 has no wrapper to reset it), which
    only pthread_kill and raise use: C never calls them, and its own forks (G, then P)
    are made by os.fork(), which gives each the right one."""
    if cgroup is not None and _clone3_works[0]:
        args = _CloneArgs(flags=_CLONE_INTO_CGROUP, exit_signal=signal.SIGCHLD, cgroup=cgroup)
        ctypes.pythonapi.PyOS_BeforeFork()
        pid = _LIBC_GIL.syscall(ctypes.c_long(_SYS_CLONE3), ctypes.byref(args), ctypes.c_size_t(ctypes.sizeof(args)))
        errno = ctypes.get_errno()
        if pid == 0:
            ctypes.pythonapi.PyOS_AfterFork_Child()
            return 0
        ctypes.pythonapi.PyOS_AfterFork_Parent()
        if pid > 0:
            return pid
        if errno in (_ENOSYS, _E2BIG, _EINVAL):
            _clone3_works[0] = False
    return os.fork()


def _fork_run(conn, listener, runner, filters):
    """C: says hello, and once the helper has placed it in the run's cgroup, reads the
    run's request, makes the run's namespaces and forks its init. Never returns."""
    try:
        # First of all, before C writes anything more of its memory: every page it
        # copies from the template until it is in the run's cgroup is charged to the
        # template's, and init (G) would keep those copies for the run's whole life.
        _hello(conn.fileno())
        # The helper sends the request once it has moved us.
        message, fds, _, _ = socket.recv_fds(conn, 1 << 16, 5)
        request = json.loads(message)
        if len(fds) != 5:
            raise ValueError("expected 5 descriptors, got %d" % len(fds))
    except BaseException:  # noqa: BLE001 - the helper sees its socket close
        os._exit(1)
    os.close(conn.detach())
    listener.detach()
    # The template's listener and its channel to its own helper are not the run's.
    os.close(_LISTENER)
    os.close(3)
    try:
        _check(
            _LIBC.unshare(
                _CLONE_NEWUSER | _CLONE_NEWPID | _CLONE_NEWNS | _CLONE_NEWNET | _CLONE_NEWIPC | _CLONE_NEWUTS
            ),
            "unshare",
        )
        # uid and gid 1000 of the run's user namespace are ours (1000) in the template's:
        # the process maps only its own ids, which needs no privilege.
        for name, text in (
            ("uid_map", "%d %d 1\n" % (_SANDBOX_ID, _SANDBOX_ID)),
            ("setgroups", "deny"),
            ("gid_map", "%d %d 1\n" % (_SANDBOX_ID, _SANDBOX_ID)),
        ):
            with open("/proc/self/" + name, "w") as f:
                f.write(text)
        init = os.fork()
    except BaseException as error:  # noqa: BLE001
        try:
            _send_line(fds[0], {"init": "setup_failed", "message": str(error)})
        finally:
            os._exit(1)
    if init == 0:
        _run_init(request, fds, runner, filters)
    os._exit(0)


def main():
    runner = {"__name__": "sandcall_runner", "__builtins__": __builtins__}
    exec(compile(sys.argv[1], "<runner>", "exec", dont_inherit=True), runner)
    filters = _load_seccomp()
    global _LANDLOCK_PLAN
    _LANDLOCK_PLAN = _load_landlock()
    preload = "SANDCALL_PRELOAD" in os.environ
    runner["_warm_up"]()
    # What a run with tools imports at its go (runner.py, `main` and `_tools_api`):
    # imported here, those modules are the template's pages, shared by every run,
    # instead of several MiB each paused session allocates for itself. (A built warm
    # sandbox does not import them: there, each would pay for them.)
    import asyncio  # noqa: F401
    import selectors  # noqa: F401
    import threading  # noqa: F401
    import typing  # noqa: F401

    if not preload:
        os.write(3, b"ready\n")
    listener = socket.socket(fileno=_LISTENER)
    # Every object the template holds now is left alone by the cyclic collector from
    # here on: in the template, and in each run forked from it. A collection walks
    # every object it tracks and writes to each one's header, so without this a run's
    # first full collection (or the template's own, after some forks) copies nearly
    # the whole heap out of the pages the runs share with the template. The template
    # then collects nothing at all: its loop makes no cycles. The program turns the
    # collector back on (`_run_program`), as a cold run has it.
    gc.collect()
    gc.freeze()
    gc.disable()
    while True:
        # A request the template cannot serve (out of descriptors, processes or memory
        # for a moment) fails alone: its helper sees the connection close and builds
        # the sandbox the usual way. The template itself stays.
        try:
            conn, _ = listener.accept()
        except OSError:
            time.sleep(0.01)
            continue
        # The helper's request for a fork, with the run's cgroup on v2. The helper
        # sends it as soon as it connects: five seconds is a helper that is gone.
        cgroup = None
        try:
            conn.settimeout(5)
            message, fds, _, _ = socket.recv_fds(conn, 64, 1)
            conn.settimeout(None)
            for extra in fds[1:]:
                os.close(extra)
            cgroup = fds[0] if fds else None
            if message == b"exit\n":
                # The pool retires this template (its principal left it idle): the
                # runs forked from it live on, under the template's init.
                os._exit(0)
            if message != b"fork\n":
                raise ValueError("not a request for a fork")
            pid = _fork_into(cgroup)
        except (OSError, ValueError):
            if cgroup is not None:
                os.close(cgroup)
            conn.close()
            time.sleep(0.01)
            continue
        if cgroup is not None:
            os.close(cgroup)
        if pid == 0:
            _fork_run(conn, listener, runner, filters)
        conn.close()
        # C exits as soon as it has forked the run's init, which the template's own init
        # (pid 1 of the template's namespace) then reaps.
        os.waitpid(pid, 0)


main()
