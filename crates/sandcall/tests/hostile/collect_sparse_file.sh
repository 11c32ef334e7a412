# Attacks: the collector's time, memory and disk with a sparse file that claims 2 GiB
# but holds no data (it costs the sandbox nothing, and reading or copying it costs the
# host 2 GiB).
# Expect: the file is never read: it is listed in files_skipped with reason "too_large"
# (over max_file_bytes), small.txt is collected, and the response is quick. With the
# file size limit at its default (256 MiB) truncate fails instead and nothing is made.
cd /mnt/data || exit 1
truncate -s 2G big.bin
echo "truncate=$?"
stat -c 'size=%s blocks=%b' big.bin 2>/dev/null || echo "size=none"
echo small > small.txt
