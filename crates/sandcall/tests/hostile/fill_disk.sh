# Attacks: host disk and memory through the writable directories.
# Expect: each tmpfs stops at its size limit with ENOSPC; the run goes on to report.
for dir in /mnt/data /tmp /dev/shm; do
    dd if=/dev/zero of="$dir/fill" bs=1M count=4096 2>/dev/null
    echo "$dir $(stat -c %s "$dir/fill")"
done
