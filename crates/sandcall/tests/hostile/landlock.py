# Attacks: what the mounts allow but Landlock (the second layer) refuses. Writes to
# /proc/self/comm (the process's own name, writable by it through /proc) and signals
# pid 1 (the run's init, outside the program's Landlock domain). Also checks that what
# a program needs still works: writing /tmp, /dev/shm, /mnt/data and /dev/null, running
# a program written to /tmp, and signalling its own child.
# Expect (a kernel with Landlock ABI 6+): comm EACCES, kill EPERM, the rest ok.
import ctypes, errno, json, os, shutil, signal, subprocess

libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
out = {"abi": max(0, libc.syscall(ctypes.c_long(444), None, ctypes.c_long(0), ctypes.c_long(1)))}


def attempt(name, f):
    try:
        f()
        out[name] = "ok"
    except OSError as e:
        out[name] = errno.errorcode.get(e.errno, str(e.errno))


def write(path, data="x"):
    with open(path, "w") as f:
        f.write(data)


attempt("proc_comm", lambda: write("/proc/self/comm", "renamed"))
attempt("kill_init", lambda: os.kill(1, 0))
attempt("tmp", lambda: write("/tmp/landlock-probe"))
attempt("dev_shm", lambda: write("/dev/shm/landlock-probe"))
attempt("mnt_data", lambda: write("/mnt/data/landlock-probe"))
attempt("dev_null", lambda: write("/dev/null"))


def run_from_tmp():
    shutil.copy("/bin/true", "/tmp/true-copy")
    os.chmod("/tmp/true-copy", 0o755)
    subprocess.run(["/tmp/true-copy"], check=True)


attempt("exec_tmp", run_from_tmp)
# A child is in the same domain: signalling it is allowed.
child = subprocess.Popen(["sleep", "10"])
attempt("kill_child", lambda: os.kill(child.pid, signal.SIGKILL))
child.wait()
print(json.dumps(out))
