# Attacks: the end of the run. Leaves a process behind, detached from the terminal.
# Expect: it dies with the run.
nohup sleep 1000.25 >/dev/null 2>&1 &
setsid sleep 1000.25 >/dev/null 2>&1 &
echo started
