# Attacks: privilege through setuid-root binaries of the runtime.
# Expect: no_new_privs and nosuid mounts make them run as the sandbox user.
ls -l /usr/bin/su | cut -c1-10
su -c 'id -u' root </dev/null 2>&1 | tail -1
echo "euid=$(id -u)"
