# Attacks: the end of the run. Leaves a process behind, detached from the terminal.
# Expect: it dies with the run.
# $1: the sleep's duration, a marker the test looks for in the host's process list.
nohup sleep "${1:-1000.25}" >/dev/null 2>&1 &
setsid sleep "${1:-1000.25}" >/dev/null 2>&1 &
echo started
