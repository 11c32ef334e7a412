# Attacks: the collector's liveness. Leaves named pipes (one replacing a staged input,
# one in a sub-folder) and a Unix socket in the working directory: a collector that opens
# a fifo to read it blocks forever, since no writer will ever come.
# Expect: none is opened; each is listed in files_skipped with reason
# "not_regular_file"; ok.txt is collected; the response comes back promptly.
import os, socket
os.chdir("/mnt/data")
os.mkfifo("pipe")
os.mkdir("sub")
os.mkfifo("sub/pipe")
os.remove("input.txt")
os.mkfifo("input.txt")
try:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind("sock")
    s.listen(1)
    print("socket made")
except OSError as e:
    print("socket refused", e.errno)
with open("ok.txt", "w") as f:
    f.write("fine\n")
