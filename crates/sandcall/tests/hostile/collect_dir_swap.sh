# Attacks: collection, by swapping a directory for a symbolic link as the very last act
# of the run: out/ is filled with decoys named like files of /etc, then renamed away,
# and out becomes a link to /etc. A collector that listed out/ earlier, or follows
# links, would read /etc/passwd and /etc/hostname of the host.
# Expect: the decoys are collected under their new folder; out is skipped as "symlink";
# nothing from /etc is collected.
cd /mnt/data || exit 1
mkdir out
echo decoy > out/passwd
echo decoy > out/hostname
echo "swapping"
mv out moved && ln -s /etc out
