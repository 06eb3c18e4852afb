/* Address helpers the socket-level tests share (test_net, test_bootstrap):
 * Criterion asserts inside, so only for Criterion test files. */
#ifndef PLAIT_TESTS_NET_UTIL_H
#define PLAIT_TESTS_NET_UTIL_H

#include <criterion/criterion.h>
#include <unistd.h>

#include "base/log.h"
#include "base/net.h"

/* "host:port" as an address, or the test fails naming it. */
static inline union plait_sockaddr parse(const char *s)
{
    union plait_sockaddr a;
    cr_assert_eq(plait_sock_parse_addr(s, &a), PLAIT_SUCCESS, "parse %s: %s", s, plait_last_error_get());
    return a;
}

/* A free loopback port: bind port 0, read it, close. */
static inline union plait_sockaddr free_loopback_port(void)
{
    union plait_sockaddr a = parse("127.0.0.1:0");
    int fd;
    cr_assert_eq(plait_sock_listen(&a, &fd), PLAIT_SUCCESS);
    close(fd);
    return a;
}

#endif
