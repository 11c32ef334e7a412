# Attacks: collection of output files, through symbolic links. Points links at host
# secrets (/etc/passwd, /etc/shadow), at the server's own data directory, its signing key
# and its file store, at / and /etc, through /proc/self/root, by a relative path that
# climbs out, in a sub-folder, in a loop, and replaces a staged input with a link.
# Expect: no link is followed, on either side of the sandbox: only ok.txt is collected,
# every link is listed in files_skipped with reason "symlink", and nothing the server
# stores or returns holds a byte of what the links point at.
# $1: the server's data directory on the host.
cd /mnt/data || exit 1
data_dir="$1"
ln -s /etc/passwd passwd
ln -s /etc/shadow shadow
ln -s "$data_dir" data_dir
ln -s "$data_dir/token.key" token_key
ln -s "$data_dir/files" stored_files
ln -s ../../../../../../../../etc/passwd relative_passwd
ln -s /proc/self/root/etc/passwd proc_root_passwd
ln -s / root
ln -s /etc etc
ln -s self_loop self_loop
mkdir -p nested
ln -s /etc/passwd nested/passwd
rm -f input.csv && ln -s /etc/passwd input.csv
echo fine > ok.txt
echo done
