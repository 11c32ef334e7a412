// Attacks the read-only root from C: tries to create a file in each directory outside
// the run's scratch space (the toolchains' own among them), and in /tmp, which is the
// run's own. Prints each outcome as JSON: only /tmp may succeed.
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

int main(void) {
    const char *paths[] = {"/usr/bin/sandcall-x", "/usr/lib/sandcall-x", "/etc/sandcall-x",
                           "/etc/alternatives/sandcall-x", "/run/sandcall/sandcall-x", "/sandcall-x",
                           "/proc/sandcall-x", "/tmp/sandcall-x"};
    printf("{");
    for (unsigned i = 0; i < sizeof paths / sizeof *paths; i++) {
        int fd = open(paths[i], O_WRONLY | O_CREAT | O_EXCL, 0644);
        printf("%s\"%s\": \"%s\"", i ? ", " : "", paths[i], fd >= 0 ? "written" : strerror(errno));
        if (fd >= 0) close(fd);
    }
    printf("}\n");
    return 0;
}
