# Attacks: the collector and the store with 10,000 tiny files (each one a store entry, a
# disk inode and a line of the response if nothing caps them).
# Expect: exactly max_output_files (100) are collected, the first ones in sorted order;
# the rest are counted in files_skipped_total with reason "too_many_files", and
# files_skipped lists at most 100 of them.
cd /mnt/data || exit 1
for i in $(seq -w 0 9999); do
    printf '%s' "$i" > "f$i"
done
echo "created $(ls | wc -l)"
