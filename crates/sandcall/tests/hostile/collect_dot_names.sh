# Attacks: path handling of output names. Makes files whose names hold dots ("...",
# "a..b", "b..", a folder "..dir", "sub/..."), and tries to write past the working
# directory with "../" paths.
# Expect: the dotted names are ordinary names: collected under exactly those names, with
# their contents. Writes that climb out of /mnt/data fail or land in the sandbox's own
# private, read-only or throwaway file systems; nothing appears on the host.
# $1: a marker for the names of the escape attempts.
cd /mnt/data || exit 1
marker="$1"
echo three > '...'
echo ab > 'a..b'
echo tail > 'b..'
mkdir '..dir' && echo inside > '..dir/file'
mkdir sub && echo deep > 'sub/...'
( echo escaped > "../escape-$marker" ) 2>/dev/null; echo "parent=$?"
( echo escaped > "/mnt/data/../../escape-$marker" ) 2>/dev/null; echo "root=$?"
( echo escaped > "sub/../../escape-$marker" ) 2>/dev/null; echo "sub=$?"
