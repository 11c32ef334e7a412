# Attacks: collection of output files, through hard links: one file under three names
# (the store would hold it three times, and a later write through one name would show
# through the others), and links to files outside the working directory.
# Expect: the file is collected once, under its first name in sorted order (a.txt); the
# other names are listed in files_skipped with reason "hard_link". Links to files
# outside the working directory cannot be made (another file system, or absent).
cd /mnt/data || exit 1
echo shared > a.txt
ln a.txt b.txt
mkdir sub
ln a.txt sub/c.txt
echo solo > solo.txt
ln /etc/shadow shadow 2>/dev/null
echo "shadow=$?"
ln /etc/passwd passwd 2>/dev/null
echo "passwd=$?"
