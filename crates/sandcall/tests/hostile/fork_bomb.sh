# Attacks: the process table. Every copy forks two more until something stops it, and
# the program keeps starting new ones, so the run lasts until its timeout.
# Expect: the pids cgroup caps the run (fork fails), the timeout ends it, and every
# process of it dies; the host never notices.
bomb() { bomb | bomb & }
while :; do bomb; done
