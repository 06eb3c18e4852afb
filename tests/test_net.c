/* base/net.c: addresses and interfaces, deadline-bounded connect/accept/IO with
 * an abort flag, and the challenge-response over a socket. All traffic stays on
 * loopback. */
#define _GNU_SOURCE
#include <criterion/criterion.h>

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "base/log.h"
#include "base/net.h"
#include "base/util.h"
#include "tests/net_util.h"

/* ---------------------------------------------------------------- helpers */

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

/* A connected TCP pair on loopback. */
static void tcp_pair(int *a, int *b)
{
    union plait_sockaddr addr = parse("127.0.0.1:0");
    int lfd;
    cr_assert_eq(plait_sock_listen(&addr, &lfd), PLAIT_SUCCESS);
    cr_assert_eq(plait_sock_connect(&addr, plait_deadline(2), NULL, a), PLAIT_SUCCESS);
    cr_assert_eq(plait_sock_accept(lfd, plait_deadline(2), NULL, b), PLAIT_SUCCESS);
    close(lfd);
}

static const uint8_t test_secret[PLAIT_SECRET_BYTES] = "0123456789abcdef0123456789abcde";

/* ---------------------------------------------------------------- addresses, interfaces */

Test(net, parse_and_print, .timeout = 10)
{
    char buf[PLAIT_SOCKADDR_STRLEN];
    static const char *roundtrip[] = {"127.0.0.1:80", "10.1.2.3:65535", "0.0.0.0:0", "[::1]:8080",
                                      "[fe80::1:2]:1"};
    for (size_t i = 0; i < sizeof(roundtrip) / sizeof(roundtrip[0]); i++) {
        union plait_sockaddr a = parse(roundtrip[i]);
        plait_sockaddr_str(&a, buf, sizeof(buf));
        cr_assert_str_eq(buf, roundtrip[i]);
    }
    union plait_sockaddr a = parse("127.0.0.1:1234");
    cr_assert_eq(a.sa.sa_family, AF_INET);
    cr_assert_eq(ntohs(a.sin.sin_port), 1234);
    a = parse("[::1]:9");
    cr_assert_eq(a.sa.sa_family, AF_INET6);
    cr_assert_eq(ntohs(a.sin6.sin6_port), 9);
    /* localhost comes from /etc/hosts; IPv4 is preferred when both exist. */
    a = parse("localhost:4242");
    plait_sockaddr_str(&a, buf, sizeof(buf));
    cr_assert(strcmp(buf, "127.0.0.1:4242") == 0 || strcmp(buf, "[::1]:4242") == 0, "localhost -> %s", buf);
    /* Truncation never overflows. */
    a = parse("[::1]:8080");
    plait_sockaddr_str(&a, buf, 5);
    cr_assert_eq(strlen(buf), 4);
}

Test(net, parse_malformed, .timeout = 10)
{
    static const char *bad[] = {"",          "127.0.0.1",   "127.0.0.1:",   ":80",      "1.2.3.4:65536",
                                "1.2.3.4:-1", "1.2.3.4:80x", "1.2.3.4:123456", "[::1:80", "[::1]80",
                                "::1:80",    "[]:80",       "[1.2.3.4]:80", "[::1]:",   "1.2.3.4: 80"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        union plait_sockaddr a;
        plait_last_error_clear();
        cr_assert_eq(plait_sock_parse_addr(bad[i], &a), PLAIT_ERR_INVALID_ARGUMENT, "\"%s\" accepted", bad[i]);
        cr_assert(strlen(plait_last_error_get()) > 0);
    }
    union plait_sockaddr a;
    cr_assert_eq(plait_sock_parse_addr(NULL, &a), PLAIT_ERR_INVALID_ARGUMENT);
}

Test(net, find_ifaddr, .timeout = 10)
{
    union plait_sockaddr a;
    char name[32], buf[PLAIT_SOCKADDR_STRLEN];

    cr_assert_eq(plait_sock_find_ifaddr("lo", &a, name, sizeof(name)), PLAIT_SUCCESS);
    cr_assert_str_eq(name, "lo");
    plait_sockaddr_str(&a, buf, sizeof(buf));
    cr_assert_str_eq(buf, "127.0.0.1:0"); /* IPv4 preferred over ::1 */
    cr_assert_eq(plait_sock_find_ifaddr("=lo", &a, name, sizeof(name)), PLAIT_SUCCESS);
    cr_assert_str_eq(name, "lo");
    cr_assert_eq(plait_sock_find_ifaddr("nonexistent9,lo", &a, name, sizeof(name)), PLAIT_SUCCESS);
    cr_assert_str_eq(name, "lo");
    /* As NCCL reads the list: an entry ends at ':' ("name:port"), empty
     * entries are skipped, and nothing is trimmed (" lo" names no interface). */
    cr_assert_eq(plait_sock_find_ifaddr("lo:1", &a, name, sizeof(name)), PLAIT_SUCCESS);
    cr_assert_str_eq(name, "lo");
    cr_assert_eq(plait_sock_find_ifaddr(",,=lo", &a, name, sizeof(name)), PLAIT_ERR_SYSTEM); /* "=" only leads */
    cr_assert_eq(plait_sock_find_ifaddr(",,lo,", &a, name, sizeof(name)), PLAIT_SUCCESS);
    cr_assert_eq(plait_sock_find_ifaddr(" lo", &a, name, sizeof(name)), PLAIT_ERR_SYSTEM);
    /* "=^lo" is the exact name "^lo" (NCCL reads '^' first, then '='). */
    cr_assert_eq(plait_sock_find_ifaddr("=^lo", &a, name, sizeof(name)), PLAIT_ERR_SYSTEM);
    /* A name longer than any interface's matches nothing; it must not vanish
     * from the list and leave "every interface". */
    cr_assert_eq(plait_sock_find_ifaddr("averyveryverylongname0", &a, name, sizeof(name)), PLAIT_ERR_SYSTEM);
    cr_assert_eq(plait_sock_find_ifaddr("=averyveryverylongname0", &a, name, sizeof(name)), PLAIT_ERR_SYSTEM);
    /* "=l" is an exact name, not a prefix of "lo". */
    plait_last_error_clear();
    cr_assert_eq(plait_sock_find_ifaddr("=l", &a, name, sizeof(name)), PLAIT_ERR_SYSTEM);
    cr_assert(strstr(plait_last_error_get(), "lo") != NULL, "the message lists interfaces: %s",
              plait_last_error_get());
    cr_assert_eq(plait_sock_find_ifaddr("nonexistent9", &a, name, sizeof(name)), PLAIT_ERR_SYSTEM);
    /* Excluding lo gives another interface, or an error on a loopback-only box. */
    plait_result_t r = plait_sock_find_ifaddr("^lo", &a, name, sizeof(name));
    cr_assert(r == PLAIT_ERR_SYSTEM || (r == PLAIT_SUCCESS && strcmp(name, "lo") != 0));
    r = plait_sock_find_ifaddr("^=lo", &a, name, sizeof(name));
    cr_assert(r == PLAIT_ERR_SYSTEM || (r == PLAIT_SUCCESS && strcmp(name, "lo") != 0));
    /* The default prefers a non-loopback interface when one is up. */
    cr_assert_eq(plait_sock_find_ifaddr(NULL, &a, name, sizeof(name)), PLAIT_SUCCESS);
    if (plait_sock_find_ifaddr("^lo", &a, buf, sizeof(buf)) == PLAIT_SUCCESS) {
        cr_assert_eq(plait_sock_find_ifaddr("", &a, name, sizeof(name)), PLAIT_SUCCESS);
        cr_assert_str_neq(name, "lo");
    }
}

/* NCCL_SOCKET_IFNAME's syntax as NCCL parses it, as pure functions. */
Test(net, ifname_spec_parse, .timeout = 10)
{
    struct plait_ifname_spec sp;

    plait_ifname_spec_parse(NULL, &sp);
    cr_assert(sp.count == 0 && !sp.is_exclude && !sp.is_exact);
    cr_assert(plait_ifname_spec_matches(&sp, "anything"));
    plait_ifname_spec_parse("eth,ib0", &sp);
    cr_assert(sp.count == 2 && !sp.is_exclude && !sp.is_exact);
    cr_assert_str_eq(sp.names[0], "eth");
    cr_assert_str_eq(sp.names[1], "ib0");
    cr_assert(plait_ifname_spec_matches(&sp, "eth0"));
    cr_assert(plait_ifname_spec_matches(&sp, "ib0"));
    cr_assert(plait_ifname_spec_matches(&sp, "ib01")); /* a prefix */
    cr_assert(!plait_ifname_spec_matches(&sp, "ib1"));
    cr_assert(!plait_ifname_spec_matches(&sp, "et"));
    plait_ifname_spec_parse("^docker,lo", &sp);
    cr_assert(sp.is_exclude && !sp.is_exact && sp.count == 2);
    cr_assert(!plait_ifname_spec_matches(&sp, "docker0"));
    cr_assert(!plait_ifname_spec_matches(&sp, "lo"));
    cr_assert(plait_ifname_spec_matches(&sp, "eth0"));
    plait_ifname_spec_parse("=eth0", &sp);
    cr_assert(!sp.is_exclude && sp.is_exact && sp.count == 1);
    cr_assert(plait_ifname_spec_matches(&sp, "eth0"));
    cr_assert(!plait_ifname_spec_matches(&sp, "eth01"));
    cr_assert(!plait_ifname_spec_matches(&sp, "eth"));
    plait_ifname_spec_parse("^=eth0,eth1", &sp);
    cr_assert(sp.is_exclude && sp.is_exact && sp.count == 2);
    cr_assert(!plait_ifname_spec_matches(&sp, "eth0"));
    cr_assert(plait_ifname_spec_matches(&sp, "eth01"));
    /* '=' then '^': the exact name "^eth0". */
    plait_ifname_spec_parse("=^eth0", &sp);
    cr_assert(!sp.is_exclude && sp.is_exact && sp.count == 1);
    cr_assert_str_eq(sp.names[0], "^eth0");
    cr_assert(!plait_ifname_spec_matches(&sp, "eth0"));
    /* ":port" ends an entry; empty entries are skipped; no trimming. */
    plait_ifname_spec_parse(",mlx5_0:1,,:2, eth0,", &sp);
    cr_assert_eq(sp.count, 2);
    cr_assert_str_eq(sp.names[0], "mlx5_0");
    cr_assert_str_eq(sp.names[1], " eth0");
    cr_assert(!plait_ifname_spec_matches(&sp, "eth0"));
    /* "^" alone, "=" alone: no entry, every name. */
    plait_ifname_spec_parse("^", &sp);
    cr_assert(sp.count == 0 && plait_ifname_spec_matches(&sp, "eth0"));
    /* A long entry is cut, never dropped: it still matches nothing. */
    char longname[200];
    memset(longname, 'e', sizeof(longname) - 1);
    longname[sizeof(longname) - 1] = '\0';
    plait_ifname_spec_parse(longname, &sp);
    cr_assert_eq(sp.count, 1);
    cr_assert_eq(strlen(sp.names[0]), PLAIT_IFNAME_PREFIX_BYTES - 1);
    cr_assert(!plait_ifname_spec_matches(&sp, "eth0"));
    /* At most PLAIT_IFNAME_SPEC_MAX entries count (NCCL's MAX_IFS). */
    char many[512] = "="; /* exact: "if1" would be a prefix of "if16" */
    for (int i = 0; i < PLAIT_IFNAME_SPEC_MAX + 4; i++)
        snprintf(many + strlen(many), sizeof(many) - strlen(many), "%sif%d", i ? "," : "", i);
    plait_ifname_spec_parse(many, &sp);
    cr_assert_eq(sp.count, PLAIT_IFNAME_SPEC_MAX);
    cr_assert(plait_ifname_spec_matches(&sp, "if15"));
    cr_assert(!plait_ifname_spec_matches(&sp, "if16"));
}

/* A made-up interface list for plait_sock_select_interfaces. */
struct fake_if {
    struct ifaddrs ifa;
    union plait_sockaddr addr;
    char name[IFNAMSIZ];
};

static void fake_add(struct fake_if *f, int *n, const char *name, const char *ip, unsigned flags)
{
    struct fake_if *e = &f[*n];
    memset(e, 0, sizeof(*e));
    snprintf(e->name, sizeof(e->name), "%s", name);
    char hp[80];
    snprintf(hp, sizeof(hp), strchr(ip, ':') ? "[%s]:0" : "%s:0", ip);
    e->addr = parse(hp);
    e->ifa.ifa_name = e->name;
    e->ifa.ifa_flags = flags;
    e->ifa.ifa_addr = &e->addr.sa;
    if (*n > 0)
        f[*n - 1].ifa.ifa_next = &e->ifa;
    (*n)++;
}

static const char *select_names(const struct fake_if *f, const char *spec, char *buf, size_t len)
{
    struct plait_netif out[PLAIT_NETIF_MAX];
    int n = plait_sock_select_interfaces(&f[0].ifa, spec, out, PLAIT_NETIF_MAX);
    buf[0] = '\0';
    for (int i = 0; i < n; i++) {
        char a[PLAIT_SOCKADDR_STRLEN];
        plait_sockaddr_str(&out[i].addr, a, sizeof(a));
        snprintf(buf + strlen(buf), len - strlen(buf), "%s%s=%s", i ? " " : "", out[i].name, a);
    }
    return buf;
}

Test(net, select_interfaces, .timeout = 10)
{
    const unsigned up = IFF_UP | IFF_RUNNING;
    struct fake_if f[16];
    char buf[512];
    int n = 0;

    fake_add(f, &n, "lo", "127.0.0.1", up | IFF_LOOPBACK);
    fake_add(f, &n, "lo", "::1", up | IFF_LOOPBACK);
    fake_add(f, &n, "docker0", "172.17.0.1", up);
    fake_add(f, &n, "eth0", "2001:db8::5", up); /* IPv6 first: its IPv4 still wins */
    fake_add(f, &n, "eth0", "10.0.0.5", up);
    fake_add(f, &n, "eth1", "fe80::1", up); /* link-local only: never */
    fake_add(f, &n, "eth2", "10.0.2.5", IFF_UP); /* no carrier */
    fake_add(f, &n, "virbr0", "192.168.122.1", up);
    fake_add(f, &n, "ens5", "10.0.3.5", up);

    /* Default: anything but docker/lo/virbr, in list order. */
    cr_assert_str_eq(select_names(f, NULL, buf, sizeof(buf)), "eth0=10.0.0.5:0 ens5=10.0.3.5:0");
    cr_assert_str_eq(select_names(f, "", buf, sizeof(buf)), "eth0=10.0.0.5:0 ens5=10.0.3.5:0");
    cr_assert_str_eq(select_names(f, "eth", buf, sizeof(buf)), "eth0=10.0.0.5:0");
    cr_assert_str_eq(select_names(f, "=eth0", buf, sizeof(buf)), "eth0=10.0.0.5:0");
    cr_assert_str_eq(select_names(f, "=eth", buf, sizeof(buf)), "");
    cr_assert_str_eq(select_names(f, "^eth,ens", buf, sizeof(buf)), "lo=127.0.0.1:0 docker0=172.17.0.1:0 "
                                                                     "virbr0=192.168.122.1:0");
    cr_assert_str_eq(select_names(f, "ens,lo", buf, sizeof(buf)), "lo=127.0.0.1:0 ens5=10.0.3.5:0");
    cr_assert_str_eq(select_names(f, "nothing", buf, sizeof(buf)), "");

    /* The default's later steps: IPoIB first; then docker, then lo, then virbr. */
    fake_add(f, &n, "ib0", "10.1.0.5", up);
    cr_assert_str_eq(select_names(f, NULL, buf, sizeof(buf)), "ib0=10.1.0.5:0");
    n = 0;
    fake_add(f, &n, "virbr0", "192.168.122.1", up);
    fake_add(f, &n, "lo", "127.0.0.1", up | IFF_LOOPBACK);
    fake_add(f, &n, "docker0", "172.17.0.1", up);
    cr_assert_str_eq(select_names(f, NULL, buf, sizeof(buf)), "docker0=172.17.0.1:0");
    n = 0;
    fake_add(f, &n, "virbr0", "192.168.122.1", up);
    fake_add(f, &n, "lo", "127.0.0.1", up | IFF_LOOPBACK);
    cr_assert_str_eq(select_names(f, NULL, buf, sizeof(buf)), "lo=127.0.0.1:0");
    n = 0;
    fake_add(f, &n, "virbr0", "192.168.122.1", up);
    fake_add(f, &n, "lo", "::1", up | IFF_LOOPBACK);
    cr_assert_str_eq(select_names(f, NULL, buf, sizeof(buf)), "virbr0=192.168.122.1:0");
    /* IPv6 only: a global address is used. */
    n = 0;
    fake_add(f, &n, "eth0", "fe80::2", up);
    fake_add(f, &n, "eth0", "2001:db8::7", up);
    cr_assert_str_eq(select_names(f, NULL, buf, sizeof(buf)), "eth0=[2001:db8::7]:0");
    /* A full output keeps the first max interfaces. */
    n = 0;
    for (int i = 0; i < 12; i++) {
        char nm[16], ip[32];
        snprintf(nm, sizeof(nm), "eth%d", i);
        snprintf(ip, sizeof(ip), "10.0.%d.1", i);
        fake_add(f, &n, nm, ip, up);
    }
    struct plait_netif out[3];
    cr_assert_eq(plait_sock_select_interfaces(&f[0].ifa, NULL, out, 3), 3);
    cr_assert_str_eq(out[2].name, "eth2");
    cr_assert_eq(plait_sock_select_interfaces(NULL, NULL, out, 3), 0);
}

/* ---------------------------------------------------------------- IO with deadlines */

Test(net, recv_timeout_and_eof, .timeout = 10)
{
    int a, b;
    char buf[16];
    tcp_pair(&a, &b);

    /* A silent peer: the deadline ends the wait. */
    double t0 = plait_now();
    cr_assert_eq(plait_sock_recv_all(a, buf, sizeof(buf), plait_deadline(0.3), NULL), PLAIT_ERR_TIMEOUT);
    double dt = plait_now() - t0;
    cr_assert(dt > 0.25 && dt < 1.5, "waited %.3f s", dt);

    /* Part of a message, then EOF. */
    cr_assert_eq(plait_sock_send_all(b, "hello", 5, plait_deadline(1), NULL), PLAIT_SUCCESS);
    close(b);
    cr_assert_eq(plait_sock_recv_all(a, buf, sizeof(buf), plait_deadline(2), NULL), PLAIT_ERR_REMOTE);
    cr_assert(strstr(plait_last_error_get(), "connection closed by 127.0.0.1:") != NULL, "%s",
              plait_last_error_get());

    /* Sending to a closed peer returns an error (no SIGPIPE kills us). */
    plait_result_t r = PLAIT_SUCCESS;
    static char big[1 << 16];
    for (int i = 0; i < 200 && r == PLAIT_SUCCESS; i++)
        r = plait_sock_send_all(a, big, sizeof(big), plait_deadline(2), NULL);
    cr_assert_eq(r, PLAIT_ERR_REMOTE, "%s", plait_last_error_get());
    close(a);
}

struct abort_after {
    int *flag;
    int ms;
};

static void *raise_after(void *p)
{
    struct abort_after *a = p;
    sleep_ms(a->ms);
    __atomic_store_n(a->flag, 1, __ATOMIC_RELEASE);
    return NULL;
}

Test(net, recv_abort, .timeout = 10)
{
    int a, b, flag = 0;
    char buf[4];
    pthread_t t;
    struct abort_after aa = {&flag, 200};
    tcp_pair(&a, &b);
    pthread_create(&t, NULL, raise_after, &aa);
    double t0 = plait_now();
    cr_assert_eq(plait_sock_recv_all(a, buf, sizeof(buf), 0, &flag), PLAIT_ERR_REMOTE);
    cr_assert(strstr(plait_last_error_get(), "abort") != NULL);
    cr_assert(plait_now() - t0 < 1.0);
    pthread_join(t, NULL);
    close(a);
    close(b);
}

struct sr_arg {
    int fd;
    size_t len;
    uint8_t *out, *in;
    plait_result_t r;
};

static void *sendrecv_thread(void *p)
{
    struct sr_arg *s = p;
    s->r = plait_sock_sendrecv(s->fd, s->out, s->len, s->fd, s->in, s->len, plait_deadline(10), NULL);
    return NULL;
}

/* Both ends send 8 MiB before reading anything: blocking sends would deadlock. */
Test(net, sendrecv_large_both_ways, .timeout = 20)
{
    const size_t len = 8u << 20;
    struct sr_arg x = {.len = len}, y = {.len = len};
    pthread_t t;
    tcp_pair(&x.fd, &y.fd);
    x.out = malloc(len);
    x.in = malloc(len);
    y.out = malloc(len);
    y.in = malloc(len);
    cr_assert(x.out && x.in && y.out && y.in);
    for (size_t i = 0; i < len; i++) {
        x.out[i] = (uint8_t)(i * 7);
        y.out[i] = (uint8_t)(i * 13 + 1);
    }
    pthread_create(&t, NULL, sendrecv_thread, &y);
    sendrecv_thread(&x);
    pthread_join(t, NULL);
    cr_assert_eq(x.r, PLAIT_SUCCESS);
    cr_assert_eq(y.r, PLAIT_SUCCESS);
    cr_assert(memcmp(x.in, y.out, len) == 0);
    cr_assert(memcmp(y.in, x.out, len) == 0);
    free(x.out);
    free(x.in);
    free(y.out);
    free(y.in);
    close(x.fd);
    close(y.fd);
}

Test(net, connect_refused_until_deadline, .timeout = 10)
{
    union plait_sockaddr a = free_loopback_port();
    int fd, flag = 0;
    double t0 = plait_now();
    cr_assert_eq(plait_sock_connect(&a, plait_deadline(0.5), NULL, &fd), PLAIT_ERR_TIMEOUT);
    double dt = plait_now() - t0;
    cr_assert(dt > 0.45 && dt < 1.5, "waited %.3f s", dt);
    cr_assert(strstr(plait_last_error_get(), "127.0.0.1") != NULL, "%s", plait_last_error_get());

    pthread_t t;
    struct abort_after aa = {&flag, 200};
    pthread_create(&t, NULL, raise_after, &aa);
    t0 = plait_now();
    cr_assert_eq(plait_sock_connect(&a, 0, &flag, &fd), PLAIT_ERR_REMOTE);
    cr_assert(plait_now() - t0 < 1.0);
    pthread_join(t, NULL);
}

Test(net, accept_timeout, .timeout = 10)
{
    union plait_sockaddr a = parse("127.0.0.1:0");
    int lfd, fd;
    cr_assert_eq(plait_sock_listen(&a, &lfd), PLAIT_SUCCESS);
    cr_assert_neq(ntohs(a.sin.sin_port), 0, "the bound port is written back");
    double t0 = plait_now();
    cr_assert_eq(plait_sock_accept(lfd, plait_deadline(0.3), NULL, &fd), PLAIT_ERR_TIMEOUT);
    cr_assert(plait_now() - t0 < 1.5);
    close(lfd);
}

/* ---------------------------------------------------------------- challenge-response */

struct auth_arg {
    int fd;
    const uint8_t *secret;
    plait_result_t r;
};

static void *auth_server_thread(void *p)
{
    struct auth_arg *a = p;
    a->r = plait_sock_auth_server(a->fd, a->secret, plait_deadline(5), NULL);
    if (a->r != PLAIT_SUCCESS)
        shutdown(a->fd, SHUT_RDWR); /* what a caller does: close on failure */
    return NULL;
}

static void run_auth(const uint8_t *server_secret, const uint8_t *client_secret, plait_result_t *rs,
                     plait_result_t *rc)
{
    int a, b;
    pthread_t t;
    tcp_pair(&a, &b);
    struct auth_arg s = {.fd = b, .secret = server_secret};
    pthread_create(&t, NULL, auth_server_thread, &s);
    *rc = plait_sock_auth_client(a, client_secret, plait_deadline(5), NULL);
    pthread_join(t, NULL);
    *rs = s.r;
    close(a);
    close(b);
}

Test(net, auth, .timeout = 10)
{
    uint8_t other[PLAIT_SECRET_BYTES];
    plait_result_t rs, rc;

    run_auth(test_secret, test_secret, &rs, &rc);
    cr_assert_eq(rs, PLAIT_SUCCESS);
    cr_assert_eq(rc, PLAIT_SUCCESS);

    memcpy(other, test_secret, sizeof(other));
    other[31] ^= 1;
    run_auth(test_secret, other, &rs, &rc);
    cr_assert_eq(rs, PLAIT_ERR_REMOTE);
    cr_assert_eq(rc, PLAIT_ERR_REMOTE);
    cr_assert(strstr(plait_last_error_get(), "authentication failed") != NULL, "%s", plait_last_error_get());
}

/* A server that does not speak the protocol, and a server that does not hold the secret. */
Test(net, auth_client_rejects_bad_servers, .timeout = 10)
{
    int a, b;
    uint8_t msg[PLAIT_AUTH_ANSWER_BYTES];

    tcp_pair(&a, &b);
    memset(msg, 'x', sizeof(msg));
    cr_assert_eq(plait_sock_send_all(b, msg, PLAIT_AUTH_CHALLENGE_BYTES, plait_deadline(1), NULL), PLAIT_SUCCESS);
    cr_assert_eq(plait_sock_auth_client(a, test_secret, plait_deadline(2), NULL), PLAIT_ERR_REMOTE);
    cr_assert(strstr(plait_last_error_get(), "protocol tag") != NULL, "%s", plait_last_error_get());
    close(a);
    close(b);

    /* Right tag, then a random proof. */
    tcp_pair(&a, &b);
    struct plait_auth st;
    uint8_t challenge[PLAIT_AUTH_CHALLENGE_BYTES];
    cr_assert_eq(plait_auth_server_challenge(&st, challenge), PLAIT_SUCCESS);
    cr_assert_eq(plait_sock_send_all(b, challenge, sizeof(challenge), plait_deadline(1), NULL), PLAIT_SUCCESS);
    cr_assert_eq(plait_random_bytes(msg, PLAIT_AUTH_PROOF_BYTES), PLAIT_SUCCESS);
    cr_assert_eq(plait_sock_send_all(b, msg, PLAIT_AUTH_PROOF_BYTES, plait_deadline(1), NULL), PLAIT_SUCCESS);
    cr_assert_eq(plait_sock_auth_client(a, test_secret, plait_deadline(2), NULL), PLAIT_ERR_REMOTE);
    cr_assert(strstr(plait_last_error_get(), "does not hold the secret") != NULL, "%s", plait_last_error_get());
    close(a);
    close(b);
}
