# Attacks: collection of output files, through device nodes: tries to create character
# and block devices in the working directory (a collector reading /dev/zero never ends,
# /dev/mem or a disk would leak the host), to hard-link an existing one in, and links to
# /dev/zero, /dev/urandom and /dev/mem.
# Expect: every mknod of a device is refused (no CAP_MKNOD) and the hard link fails
# (another file system); the symlinks are skipped with reason "symlink"; only ok.txt is
# collected and the response comes back promptly.
import json, os, stat
os.chdir("/mnt/data")
results = {}
for name, kind, major, minor in [
    ("char_null", stat.S_IFCHR, 1, 3),
    ("char_zero", stat.S_IFCHR, 1, 5),
    ("char_mem", stat.S_IFCHR, 1, 1),
    ("block_sda", stat.S_IFBLK, 8, 0),
]:
    try:
        os.mknod(name, kind | 0o666, os.makedev(major, minor))
        results[name] = "created"
    except OSError as e:
        results[name] = e.errno
try:
    os.link("/dev/null", "null_hard")
    results["null_hard"] = "created"
except OSError as e:
    results["null_hard"] = e.errno
for name, target in [("zero_link", "/dev/zero"), ("urandom_link", "/dev/urandom"), ("mem_link", "/dev/mem")]:
    os.symlink(target, name)
with open("ok.txt", "w") as f:
    f.write("fine\n")
print(json.dumps(results))
