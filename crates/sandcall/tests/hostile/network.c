// Attacks the network isolation from C: a TCP connection to a public address and a DNS
// lookup. Prints each outcome as JSON; the sandbox's network namespace has only a down
// loopback, so each must fail.
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

int main(void) {
    const char *connect_result = "connected";
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons(80)};
    inet_pton(AF_INET, "1.1.1.1", &addr.sin_addr);
    if (fd < 0 || connect(fd, (struct sockaddr *)&addr, sizeof addr) != 0) connect_result = strerror(errno);
    const char *dns = "resolved";
    struct addrinfo *res = NULL;
    int rc = getaddrinfo("example.com", "80", NULL, &res);
    if (rc != 0) dns = gai_strerror(rc);
    printf("{\"connect\": \"%s\", \"dns\": \"%s\"}\n", connect_result, dns);
    return 0;
}
