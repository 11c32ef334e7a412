// Attacks the pids limit (max_processes) from C: forks until the kernel refuses, each
// child sleeping forever, so nothing ends by itself. Prints what it managed as JSON,
// then waits: the run must end at its timeout with every child reclaimed.
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

int main(void) {
    int spawned = 0;
    const char *error = "none";
    while (spawned < 100000) {
        pid_t pid = fork();
        if (pid == 0) {
            for (;;) pause();
        }
        if (pid < 0) {
            error = errno == EAGAIN ? "EAGAIN" : strerror(errno);
            break;
        }
        spawned++;
    }
    printf("{\"spawned\": %d, \"error\": \"%s\"}\n", spawned, error);
    fflush(stdout);
    for (;;) pause();
}
