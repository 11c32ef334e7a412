// Attacks the memory limit (memory_limit_mb) from C: touches one more MiB at a time,
// forever. The cgroup's OOM killer must end it, and nothing else on the host.
#include <stdlib.h>
#include <string.h>

int main(void) {
    for (;;) {
        char *p = malloc(1 << 20);
        if (p) memset(p, 1, 1 << 20);
    }
}
