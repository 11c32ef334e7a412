# Attacks: the response and the client through output file names: invalid UTF-8 (not a
# JSON string), a newline and a carriage return (forged lines in logs and listings),
# a terminal escape sequence, a tab, and a folder whose own name is invalid UTF-8.
# Expect: none of them is collected; each is listed in files_skipped with reason
# "invalid_name" under a lossy rendering of its name. A valid non-ASCII name and a plain
# name are collected.
import os
os.chdir("/mnt/data")
for name in [b"bad\xffname.txt", b"new\nline.txt", b"carriage\rreturn.txt", b"escape\x1b[31m.txt", b"tab\tname.txt"]:
    with open(name, "wb") as f:
        f.write(b"x\n")
os.mkdir(b"dir\xfe")
with open(b"dir\xfe/inner.txt", "wb") as f:
    f.write(b"x\n")
with open(b"good.txt", "wb") as f:
    f.write(b"good\n")
with open("caf\u00e9 \u2713.txt".encode("utf-8"), "wb") as f:
    f.write(b"unicode\n")
print("made")
