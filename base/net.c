/* TCP helpers: interface choice, addresses, deadline-bounded connect/accept/IO,
 * and the challenge-response (base/crypto.c) run over a connection. See net.h
 * for the contracts. */
#define _GNU_SOURCE
#include "base/net.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "base/log.h"
#include "base/util.h"

/* Longest single wait inside a helper, so the abort flag is seen within 100 ms. */
#define SOCK_SLICE_MS 100
/* Largest transfer handed to one send()/recv(); keeps every count far from the
 * ssize_t/int limits some kernels and libcs trip over near 2 GiB. */
#define SOCK_IO_MAX ((size_t)1 << 30)
/* The kernel silently caps this at net.core.somaxconn (4096 by default since 5.4). */
#define SOCK_BACKLOG 16384

/* ---------------------------------------------------------------- addresses */

static socklen_t sockaddr_len(const union plait_sockaddr *addr)
{
    switch (addr->sa.sa_family) {
    case AF_INET:
        return sizeof(struct sockaddr_in);
    case AF_INET6:
        return sizeof(struct sockaddr_in6);
    default:
        return 0;
    }
}

void plait_sockaddr_str(const union plait_sockaddr *addr, char *buf, size_t len)
{
    char host[INET6_ADDRSTRLEN];

    if (!buf || len == 0)
        return;
    if (!addr) {
        snprintf(buf, len, "<no address>");
        return;
    }
    switch (addr->sa.sa_family) {
    case AF_INET:
        if (!inet_ntop(AF_INET, &addr->sin.sin_addr, host, sizeof(host)))
            snprintf(host, sizeof(host), "?");
        snprintf(buf, len, "%s:%u", host, (unsigned)ntohs(addr->sin.sin_port));
        break;
    case AF_INET6:
        if (!inet_ntop(AF_INET6, &addr->sin6.sin6_addr, host, sizeof(host)))
            snprintf(host, sizeof(host), "?");
        if (addr->sin6.sin6_scope_id)
            snprintf(buf, len, "[%s%%%u]:%u", host, (unsigned)addr->sin6.sin6_scope_id,
                     (unsigned)ntohs(addr->sin6.sin6_port));
        else
            snprintf(buf, len, "[%s]:%u", host, (unsigned)ntohs(addr->sin6.sin6_port));
        break;
    default:
        snprintf(buf, len, "<address family %d>", (int)addr->sa.sa_family);
        break;
    }
}

/* The peer of a connected fd, for messages. After a reset the kernel may no
 * longer know it; callers that know the address add it as context. */
static void fd_peer_str(int fd, char *buf, size_t len)
{
    union plait_sockaddr peer;
    socklen_t plen = sizeof(peer);

    memset(&peer, 0, sizeof(peer));
    if (getpeername(fd, &peer.sa, &plen) != 0) {
        snprintf(buf, len, "<peer of fd %d>", fd);
        return;
    }
    plait_sockaddr_str(&peer, buf, len);
}

static void sockaddr_set_port(union plait_sockaddr *addr, uint16_t port)
{
    if (addr->sa.sa_family == AF_INET)
        addr->sin.sin_port = htons(port);
    else if (addr->sa.sa_family == AF_INET6)
        addr->sin6.sin6_port = htons(port);
}

/* Resolves `host` into *addr, IPv4 preferred. Numeric forms are tried first so
 * that an address never waits on DNS. */
static int resolve_host(const char *host, int family, union plait_sockaddr *addr)
{
    struct addrinfo hints, *res = NULL;
    int rc;

    memset(&hints, 0, sizeof(hints));
    hints.ai_family = family;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICHOST;
    rc = getaddrinfo(host, NULL, &hints, &res);
    if (rc != 0 && family == AF_UNSPEC) {
        hints.ai_flags = 0;
        rc = getaddrinfo(host, NULL, &hints, &res);
    }
    if (rc != 0)
        return rc;
    const struct addrinfo *pick = NULL;
    for (const struct addrinfo *ai = res; ai; ai = ai->ai_next) {
        if (ai->ai_family == AF_INET && ai->ai_addrlen <= sizeof(*addr)) {
            pick = ai;
            break;
        }
        if (!pick && ai->ai_family == AF_INET6 && ai->ai_addrlen <= sizeof(*addr))
            pick = ai;
    }
    if (!pick) {
        freeaddrinfo(res);
        return EAI_FAMILY;
    }
    memset(addr, 0, sizeof(*addr));
    memcpy(addr, pick->ai_addr, pick->ai_addrlen);
    freeaddrinfo(res);
    return 0;
}

plait_result_t plait_sock_parse_addr(const char *hostport, union plait_sockaddr *addr_out)
{
    char host[256];
    const char *port_str;
    size_t host_len;
    int family = AF_UNSPEC;

    if (!hostport || !addr_out)
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "plait_sock_parse_addr: NULL argument");
    if (hostport[0] == '[') {
        const char *close = strchr(hostport, ']');
        if (!close || close[1] != ':')
            return plait_error(PLAIT_ERR_INVALID_ARGUMENT,
                               "malformed address \"%s\": expected \"[ipv6]:port\"", hostport);
        host_len = (size_t)(close - hostport - 1);
        if (host_len == 0 || host_len >= sizeof(host))
            return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "malformed address \"%s\": bad IPv6 host", hostport);
        memcpy(host, hostport + 1, host_len);
        port_str = close + 2;
        family = AF_INET6;
    } else {
        const char *colon = strrchr(hostport, ':');
        if (!colon)
            return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "malformed address \"%s\": expected \"host:port\"",
                               hostport);
        host_len = (size_t)(colon - hostport);
        if (memchr(hostport, ':', host_len))
            return plait_error(PLAIT_ERR_INVALID_ARGUMENT,
                               "malformed address \"%s\": write IPv6 addresses as \"[addr]:port\"", hostport);
        if (host_len == 0 || host_len >= sizeof(host))
            return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "malformed address \"%s\": bad host", hostport);
        memcpy(host, hostport, host_len);
        port_str = colon + 1;
    }
    host[host_len] = '\0';

    size_t port_len = strlen(port_str);
    unsigned long port = 0;
    if (port_len == 0 || port_len > 5)
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "malformed address \"%s\": bad port", hostport);
    for (size_t i = 0; i < port_len; i++) {
        if (port_str[i] < '0' || port_str[i] > '9')
            return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "malformed address \"%s\": bad port", hostport);
        port = port * 10 + (unsigned long)(port_str[i] - '0');
    }
    if (port > 65535)
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "malformed address \"%s\": port out of range", hostport);

    union plait_sockaddr addr;
    int rc = resolve_host(host, family, &addr);
    if (rc != 0)
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "cannot resolve host \"%s\" of address \"%s\": %s", host,
                           hostport, gai_strerror(rc));
    sockaddr_set_port(&addr, (uint16_t)port);
    *addr_out = addr;
    return PLAIT_SUCCESS;
}

/* ---------------------------------------------------------------- interfaces */

/* NCCL_SOCKET_IFNAME as NCCL reads it: a leading "^" (exclude), then a
 * leading "=" (exact names), in that order only ("=^eth" is the exact name
 * "^eth"); then entries separated by commas, empty ones skipped; an entry
 * ends at its first ':' (NCCL's "name:port" form: the port is ignored for
 * interfaces); nothing is trimmed. An entry longer than the buffer is cut,
 * as NCCL's snprintf cuts it: it then matches no interface name, which is
 * what it would do uncut (a dropped entry would turn "matches nothing" into
 * "matches everything"). At most PLAIT_IFNAME_SPEC_MAX entries count. */
void plait_ifname_spec_parse(const char *s, struct plait_ifname_spec *spec)
{
    memset(spec, 0, sizeof(*spec));
    if (!s)
        return;
    if (*s == '^') {
        spec->is_exclude = 1;
        s++;
    }
    if (*s == '=') {
        spec->is_exact = 1;
        s++;
    }
    while (*s && spec->count < PLAIT_IFNAME_SPEC_MAX) {
        size_t n = strcspn(s, ",");
        size_t name_len = strcspn(s, ",:");
        if (name_len > 0) {
            size_t keep = name_len < PLAIT_IFNAME_PREFIX_BYTES - 1 ? name_len : PLAIT_IFNAME_PREFIX_BYTES - 1;
            memcpy(spec->names[spec->count], s, keep);
            spec->names[spec->count][keep] = '\0';
            spec->count++;
        }
        if (!s[n])
            break;
        s += n + 1;
    }
}

int plait_ifname_spec_matches(const struct plait_ifname_spec *spec, const char *name)
{
    int hit = 0;

    /* No entry (unset, "", "^", ","): every name, as NCCL's empty list. */
    if (spec->count == 0)
        return 1;
    for (int i = 0; i < spec->count && !hit; i++) {
        if (spec->is_exact)
            hit = strcmp(name, spec->names[i]) == 0;
        else
            hit = strncmp(name, spec->names[i], strlen(spec->names[i])) == 0;
    }
    return spec->is_exclude ? !hit : hit;
}

/* Whether this address of an interface may carry plait traffic: IPv4 or
 * IPv6, the interface up and running (NCCL's test: a link without carrier
 * moves nothing), not IPv6 loopback (NCCL skips it too), and not IPv6
 * link-local (unusable without a scope other hosts cannot know). */
static int ifaddr_usable(const struct ifaddrs *ifa)
{
    if (!ifa->ifa_addr || !ifa->ifa_name)
        return 0;
    if (ifa->ifa_addr->sa_family != AF_INET && ifa->ifa_addr->sa_family != AF_INET6)
        return 0;
    if ((ifa->ifa_flags & (IFF_UP | IFF_RUNNING)) != (IFF_UP | IFF_RUNNING))
        return 0;
    if (ifa->ifa_addr->sa_family == AF_INET6) {
        const struct in6_addr *a6 = &((const struct sockaddr_in6 *)(const void *)ifa->ifa_addr)->sin6_addr;
        if (IN6_IS_ADDR_LOOPBACK(a6) || IN6_IS_ADDR_LINKLOCAL(a6))
            return 0;
    }
    return 1;
}

/* The interfaces of `list` that `spec` selects, in the order of their first
 * address in the list, each once: its IPv4 address when it has one, else its
 * first usable IPv6 one. */
static int select_with_spec(const struct ifaddrs *list, const struct plait_ifname_spec *spec, struct plait_netif *out,
                            int max)
{
    int n = 0;

    for (const struct ifaddrs *ifa = list; ifa; ifa = ifa->ifa_next) {
        if (!ifaddr_usable(ifa) || !plait_ifname_spec_matches(spec, ifa->ifa_name))
            continue;
        int k = 0;
        while (k < n && strcmp(out[k].name, ifa->ifa_name) != 0)
            k++;
        if (k < n) {
            if (!(out[k].addr.sa.sa_family == AF_INET6 && ifa->ifa_addr->sa_family == AF_INET))
                continue;
        } else {
            if (n >= max)
                continue;
            n++;
        }
        memset(&out[k], 0, sizeof(out[k]));
        snprintf(out[k].name, sizeof(out[k].name), "%s", ifa->ifa_name);
        memcpy(&out[k].addr, ifa->ifa_addr,
               ifa->ifa_addr->sa_family == AF_INET ? sizeof(struct sockaddr_in) : sizeof(struct sockaddr_in6));
        sockaddr_set_port(&out[k].addr, 0);
    }
    return n;
}

int plait_sock_select_interfaces(const struct ifaddrs *list, const char *ifname_spec, struct plait_netif *out,
                                 int max)
{
    struct plait_ifname_spec spec;

    if (!out || max <= 0)
        return 0;
    if (ifname_spec && ifname_spec[0]) {
        plait_ifname_spec_parse(ifname_spec, &spec);
        return select_with_spec(list, &spec, out, max);
    }
    /* Unset: NCCL's order, the first step that finds anything wins: InfiniBand
     * (IPoIB) first, then anything but docker bridges, loopback and libvirt
     * bridges, then docker, then loopback, then libvirt. */
    static const char *const tiers[] = {"ib", "^docker,lo,virbr", "docker", "lo", "virbr"};
    for (size_t t = 0; t < sizeof(tiers) / sizeof(tiers[0]); t++) {
        plait_ifname_spec_parse(tiers[t], &spec);
        int n = select_with_spec(list, &spec, out, max);
        if (n > 0)
            return n;
    }
    return 0;
}

plait_result_t plait_sock_find_interfaces(const char *ifname_spec, struct plait_netif *out, int max, int *n_out)
{
    struct ifaddrs *ifas = NULL;

    if (!out || !n_out || max <= 0)
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "plait_sock_find_interfaces: NULL or empty output");
    if (getifaddrs(&ifas) != 0)
        return plait_error(PLAIT_ERR_SYSTEM, "getifaddrs: %s", strerror(errno));
    int n = plait_sock_select_interfaces(ifas, ifname_spec, out, max);
    if (n == 0) {
        char seen[512];
        size_t used = 0;
        seen[0] = '\0';
        for (const struct ifaddrs *ifa = ifas; ifa; ifa = ifa->ifa_next) {
            if (!ifa->ifa_addr || (ifa->ifa_addr->sa_family != AF_INET && ifa->ifa_addr->sa_family != AF_INET6))
                continue;
            /* List each name once (an interface appears once per address). */
            int dup = 0;
            for (const struct ifaddrs *o = ifas; o != ifa; o = o->ifa_next)
                if (o->ifa_addr && (o->ifa_addr->sa_family == AF_INET || o->ifa_addr->sa_family == AF_INET6) &&
                    strcmp(o->ifa_name, ifa->ifa_name) == 0)
                    dup = 1;
            if (dup || used >= sizeof(seen) - 1)
                continue;
            const unsigned up = ifa->ifa_flags & (IFF_UP | IFF_RUNNING);
            int k = snprintf(seen + used, sizeof(seen) - used, "%s%s%s", used ? " " : "", ifa->ifa_name,
                             up == (IFF_UP | IFF_RUNNING) ? ""
                             : (up & IFF_UP)             ? "(no carrier)"
                                                         : "(down)");
            if (k > 0)
                used += (size_t)k < sizeof(seen) - used ? (size_t)k : sizeof(seen) - used - 1;
        }
        freeifaddrs(ifas);
        return plait_error(PLAIT_ERR_SYSTEM,
                           "no usable network interface matches PLAIT_SOCKET_IFNAME=\"%s\" (interfaces with "
                           "addresses: %s)",
                           ifname_spec ? ifname_spec : "", seen[0] ? seen : "none");
    }
    freeifaddrs(ifas);
    *n_out = n;
    return PLAIT_SUCCESS;
}

plait_result_t plait_sock_find_ifaddr(const char *ifname_spec, union plait_sockaddr *addr_out, char *ifname_out,
                                      size_t ifname_len)
{
    struct plait_netif ifs[PLAIT_NETIF_MAX];
    int n = 0;

    if (!addr_out)
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "plait_sock_find_ifaddr: NULL addr_out");
    plait_result_t status = plait_sock_find_interfaces(ifname_spec, ifs, PLAIT_NETIF_MAX, &n);
    if (status != PLAIT_SUCCESS)
        return status;
    *addr_out = ifs[0].addr;
    if (ifname_out && ifname_len)
        snprintf(ifname_out, ifname_len, "%s", ifs[0].name);
    return PLAIT_SUCCESS;
}

/* ---------------------------------------------------------------- waiting */

/* The next wait: one slice, or less when the deadline is nearer. */
static int slice_ms(double deadline)
{
    if (deadline <= 0)
        return SOCK_SLICE_MS;
    double left_ms = (deadline - plait_now()) * 1e3;
    if (left_ms <= 0)
        return 0;
    return left_ms < SOCK_SLICE_MS ? (int)left_ms + 1 : SOCK_SLICE_MS;
}

static plait_result_t poll_slice(struct pollfd *pfds, nfds_t n, double deadline)
{
    if (poll(pfds, n, slice_ms(deadline)) < 0 && errno != EINTR)
        return plait_error(PLAIT_ERR_SYSTEM, "poll: %s", strerror(errno));
    return PLAIT_SUCCESS;
}

/* Checked between slices of every wait. `doing` completes "aborted while ..." */
static plait_result_t check_wait(double deadline, const int *abort_flag, int fd, const char *doing)
{
    char peer[PLAIT_SOCKADDR_STRLEN];

    if (plait_aborted(abort_flag)) {
        fd_peer_str(fd, peer, sizeof(peer));
        return plait_error(PLAIT_ERR_REMOTE, "aborted while %s %s", doing, peer);
    }
    if (plait_deadline_passed(deadline)) {
        fd_peer_str(fd, peer, sizeof(peer));
        return plait_error(PLAIT_ERR_TIMEOUT, "timed out while %s %s", doing, peer);
    }
    return PLAIT_SUCCESS;
}

plait_result_t plait_sock_errno_status(int err)
{
    switch (err) {
    case ECONNRESET:
    case EPIPE:
    case ETIMEDOUT:
    case EHOSTUNREACH:
    case ENETUNREACH:
    case ENETDOWN:
    case ENOTCONN:
    case ECONNABORTED:
    case ECONNREFUSED:
        return PLAIT_ERR_REMOTE;
    default:
        return PLAIT_ERR_SYSTEM;
    }
}

/* A failed send/recv: the peer's fault (REMOTE) or ours (SYSTEM). */
static plait_result_t io_error(int fd, const char *op, int err)
{
    char peer[PLAIT_SOCKADDR_STRLEN];

    fd_peer_str(fd, peer, sizeof(peer));
    if (plait_sock_errno_status(err) == PLAIT_ERR_REMOTE)
        return plait_error(PLAIT_ERR_REMOTE, "connection to %s lost during %s: %s", peer, op, strerror(err));
    return plait_error(PLAIT_ERR_SYSTEM, "%s on the connection to %s: %s", op, peer, strerror(err));
}

static plait_result_t eof_error(int fd, size_t done, size_t len)
{
    char peer[PLAIT_SOCKADDR_STRLEN];

    fd_peer_str(fd, peer, sizeof(peer));
    return plait_error(PLAIT_ERR_REMOTE, "connection closed by %s (%zu of %zu bytes received)", peer, done, len);
}

static plait_result_t set_blocking(int fd)
{
    int flags = fcntl(fd, F_GETFL);
    if (flags < 0 || fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) < 0)
        return plait_error(PLAIT_ERR_SYSTEM, "fcntl(O_NONBLOCK): %s", strerror(errno));
    return PLAIT_SUCCESS;
}

static void set_nodelay(int fd)
{
    int one = 1;
    /* A failure costs latency, not correctness. */
    (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

/* ---------------------------------------------------------------- listen, connect, accept */

plait_result_t plait_sock_listen(union plait_sockaddr *addr, int *fd_out)
{
    char name[PLAIT_SOCKADDR_STRLEN];
    plait_result_t status;
    socklen_t alen;
    int fd, one = 1;

    if (!addr || !fd_out)
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "plait_sock_listen: NULL argument");
    alen = sockaddr_len(addr);
    if (alen == 0)
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "plait_sock_listen: address family %d is not IPv4/IPv6",
                           (int)addr->sa.sa_family);
    plait_sockaddr_str(addr, name, sizeof(name));
    fd = socket(addr->sa.sa_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0)
        return plait_error(PLAIT_ERR_SYSTEM, "socket() for listening on %s: %s", name, strerror(errno));
    if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) != 0) {
        status = plait_error(PLAIT_ERR_SYSTEM, "setsockopt(SO_REUSEADDR) on %s: %s", name, strerror(errno));
        goto err_close;
    }
    if (bind(fd, &addr->sa, alen) != 0) {
        status = plait_error(PLAIT_ERR_SYSTEM, "bind to %s: %s", name, strerror(errno));
        goto err_close;
    }
    if (listen(fd, SOCK_BACKLOG) != 0) {
        status = plait_error(PLAIT_ERR_SYSTEM, "listen on %s: %s", name, strerror(errno));
        goto err_close;
    }
    union plait_sockaddr bound;
    socklen_t blen = sizeof(bound);
    memset(&bound, 0, sizeof(bound));
    if (getsockname(fd, &bound.sa, &blen) != 0) {
        status = plait_error(PLAIT_ERR_SYSTEM, "getsockname on %s: %s", name, strerror(errno));
        goto err_close;
    }
    sockaddr_set_port(addr, bound.sa.sa_family == AF_INET ? ntohs(bound.sin.sin_port) : ntohs(bound.sin6.sin6_port));
    *fd_out = fd;
    return PLAIT_SUCCESS;

err_close:
    close(fd);
    return status;
}

/* Errors after which the peer may simply not be listening yet (or a route is
 * coming up); anything else is reported at once. */
static int connect_error_is_retryable(int err)
{
    switch (err) {
    case ECONNREFUSED:
    case ECONNRESET:
    case ECONNABORTED:
    case ETIMEDOUT:
    case EHOSTUNREACH:
    case ENETUNREACH:
    case ENETDOWN:
    case EAGAIN:
    case EADDRNOTAVAIL:
    case EINTR:
        return 1;
    default:
        return 0;
    }
}

/* Connecting to a free port in the ephemeral range of this host can succeed with
 * TCP simultaneous open: the socket is connected to itself. That is never a peer. */
static int is_self_connection(int fd)
{
    union plait_sockaddr local, peer;
    socklen_t llen = sizeof(local), plen = sizeof(peer);

    memset(&local, 0, sizeof(local));
    memset(&peer, 0, sizeof(peer));
    if (getsockname(fd, &local.sa, &llen) != 0 || getpeername(fd, &peer.sa, &plen) != 0)
        return 0;
    return llen == plen && memcmp(&local, &peer, llen) == 0;
}

plait_result_t plait_sock_connect(const union plait_sockaddr *addr, double deadline, const int *abort_flag,
                                  int *fd_out)
{
    char name[PLAIT_SOCKADDR_STRLEN];
    int backoff_ms = 10, attempts = 0, last_err = 0;
    socklen_t alen;

    if (!addr || !fd_out)
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "plait_sock_connect: NULL argument");
    alen = sockaddr_len(addr);
    plait_sockaddr_str(addr, name, sizeof(name));
    if (alen == 0)
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "plait_sock_connect: bad address %s", name);

    for (;;) {
        if (plait_aborted(abort_flag))
            return plait_error(PLAIT_ERR_REMOTE, "aborted while connecting to %s", name);
        attempts++;
        int fd = socket(addr->sa.sa_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (fd < 0)
            return plait_error(PLAIT_ERR_SYSTEM, "socket() to connect to %s: %s", name, strerror(errno));
        int err = connect(fd, &addr->sa, alen) == 0 ? 0 : errno;
        if (err == EINPROGRESS || err == EINTR) {
            /* The handshake goes on in the kernel; wait for it in slices. */
            for (;;) {
                struct pollfd pfd = {.fd = fd, .events = POLLOUT};
                plait_result_t status = poll_slice(&pfd, 1, deadline);
                if (status != PLAIT_SUCCESS) {
                    close(fd);
                    return status;
                }
                if (pfd.revents) {
                    socklen_t elen = sizeof(err);
                    if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &elen) != 0)
                        err = errno;
                    break;
                }
                if (plait_aborted(abort_flag)) {
                    close(fd);
                    return plait_error(PLAIT_ERR_REMOTE, "aborted while connecting to %s", name);
                }
                if (plait_deadline_passed(deadline)) {
                    close(fd);
                    return plait_error(PLAIT_ERR_TIMEOUT, "timed out connecting to %s (%d attempts)", name,
                                       attempts);
                }
            }
        }
        if (err == 0 && is_self_connection(fd))
            err = ECONNREFUSED;
        if (err == 0) {
            plait_result_t status = set_blocking(fd);
            if (status != PLAIT_SUCCESS) {
                close(fd);
                return status;
            }
            set_nodelay(fd);
            *fd_out = fd;
            return PLAIT_SUCCESS;
        }
        close(fd);
        last_err = err;
        if (!connect_error_is_retryable(err))
            return plait_error(PLAIT_ERR_SYSTEM, "connect to %s: %s", name, strerror(err));

        /* The peer is not there yet: back off (10 ms doubling to 100 ms). */
        double wake = plait_now() + backoff_ms * 1e-3;
        if (deadline > 0 && wake > deadline)
            wake = deadline;
        while (plait_now() < wake) {
            if (plait_aborted(abort_flag))
                return plait_error(PLAIT_ERR_REMOTE, "aborted while connecting to %s", name);
            double left_ms = (wake - plait_now()) * 1e3;
            struct timespec ts = {0, (long)((left_ms < SOCK_SLICE_MS ? left_ms : SOCK_SLICE_MS) * 1e6)};
            nanosleep(&ts, NULL);
        }
        if (plait_deadline_passed(deadline))
            return plait_error(PLAIT_ERR_TIMEOUT, "timed out connecting to %s (%d attempts, last error: %s)", name,
                               attempts, strerror(last_err));
        backoff_ms = backoff_ms * 2 > SOCK_SLICE_MS ? SOCK_SLICE_MS : backoff_ms * 2;
    }
}

plait_result_t plait_sock_accept(int listen_fd, double deadline, const int *abort_flag, int *fd_out)
{
    if (!fd_out)
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "plait_sock_accept: NULL fd_out");
    for (;;) {
        /* Poll before accepting: the fd may be blocking if it was not made by
         * plait_sock_listen(), and a blocking accept() would ignore the deadline. */
        struct pollfd pfd = {.fd = listen_fd, .events = POLLIN};
        plait_result_t status = poll_slice(&pfd, 1, deadline);
        if (status != PLAIT_SUCCESS)
            return status;
        if (pfd.revents & POLLNVAL)
            return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "plait_sock_accept: fd %d is not open", listen_fd);
        if (pfd.revents) {
            int fd = accept4(listen_fd, NULL, NULL, SOCK_CLOEXEC);
            if (fd >= 0) {
                set_nodelay(fd);
                *fd_out = fd;
                return PLAIT_SUCCESS;
            }
            switch (errno) {
            case EAGAIN:
            case EINTR:
            case ECONNABORTED:
            case EPROTO:
            case ENETDOWN:
            case ENOPROTOOPT:
            case EHOSTDOWN:
            case ENONET:
            case EHOSTUNREACH:
            case EOPNOTSUPP:
            case ENETUNREACH:
                /* The pending connection went away, or a network error that
                 * accept(2) says to treat like EAGAIN. */
                break;
            default: {
                union plait_sockaddr local;
                socklen_t llen = sizeof(local);
                char name[PLAIT_SOCKADDR_STRLEN] = "?";
                memset(&local, 0, sizeof(local));
                if (getsockname(listen_fd, &local.sa, &llen) == 0)
                    plait_sockaddr_str(&local, name, sizeof(name));
                return plait_error(PLAIT_ERR_SYSTEM, "accept on %s: %s", name, strerror(errno));
            }
            }
        }
        if (plait_aborted(abort_flag))
            return plait_error(PLAIT_ERR_REMOTE, "aborted while accepting a connection");
        if (plait_deadline_passed(deadline))
            return plait_error(PLAIT_ERR_TIMEOUT, "timed out waiting for a connection");
    }
}

/* ---------------------------------------------------------------- send, receive */

/* All three loops try the system call first and poll only when it would block,
 * with MSG_DONTWAIT so that even a blocking fd never waits past a slice. */

plait_result_t plait_sock_send_all(int fd, const void *buf, size_t len, double deadline, const int *abort_flag)
{
    const char *p = buf;
    size_t done = 0;

    while (done < len) {
        if (plait_aborted(abort_flag))
            return check_wait(deadline, abort_flag, fd, "sending to");
        size_t n = len - done < SOCK_IO_MAX ? len - done : SOCK_IO_MAX;
        ssize_t rc = send(fd, p + done, n, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (rc > 0) {
            done += (size_t)rc;
            continue;
        }
        if (rc < 0 && errno == EINTR)
            continue;
        if (rc < 0 && errno != EAGAIN && errno != EWOULDBLOCK)
            return io_error(fd, "send", errno);
        struct pollfd pfd = {.fd = fd, .events = POLLOUT};
        plait_result_t status = poll_slice(&pfd, 1, deadline);
        if (status == PLAIT_SUCCESS && !pfd.revents)
            status = check_wait(deadline, abort_flag, fd, "sending to");
        if (status != PLAIT_SUCCESS)
            return status;
    }
    return PLAIT_SUCCESS;
}

plait_result_t plait_sock_recv_all(int fd, void *buf, size_t len, double deadline, const int *abort_flag)
{
    char *p = buf;
    size_t done = 0;

    while (done < len) {
        if (plait_aborted(abort_flag))
            return check_wait(deadline, abort_flag, fd, "receiving from");
        size_t n = len - done < SOCK_IO_MAX ? len - done : SOCK_IO_MAX;
        ssize_t rc = recv(fd, p + done, n, MSG_DONTWAIT);
        if (rc > 0) {
            done += (size_t)rc;
            continue;
        }
        if (rc == 0)
            return eof_error(fd, done, len);
        if (errno == EINTR)
            continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK)
            return io_error(fd, "recv", errno);
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        plait_result_t status = poll_slice(&pfd, 1, deadline);
        if (status == PLAIT_SUCCESS && !pfd.revents)
            status = check_wait(deadline, abort_flag, fd, "receiving from");
        if (status != PLAIT_SUCCESS)
            return status;
    }
    return PLAIT_SUCCESS;
}

plait_result_t plait_sock_sendrecv(int send_fd, const void *sbuf, size_t slen, int recv_fd, void *rbuf, size_t rlen,
                                   double deadline, const int *abort_flag)
{
    const char *sp = sbuf;
    char *rp = rbuf;
    size_t sdone = 0, rdone = 0;

    while (sdone < slen || rdone < rlen) {
        int progressed = 0;

        if (plait_aborted(abort_flag))
            return check_wait(deadline, abort_flag, rdone < rlen ? recv_fd : send_fd, "exchanging data with");
        if (sdone < slen) {
            size_t n = slen - sdone < SOCK_IO_MAX ? slen - sdone : SOCK_IO_MAX;
            ssize_t rc = send(send_fd, sp + sdone, n, MSG_NOSIGNAL | MSG_DONTWAIT);
            if (rc > 0) {
                sdone += (size_t)rc;
                progressed = 1;
            } else if (rc < 0 && errno == EINTR) {
                progressed = 1;
            } else if (rc < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
                return io_error(send_fd, "send", errno);
            }
        }
        if (rdone < rlen) {
            size_t n = rlen - rdone < SOCK_IO_MAX ? rlen - rdone : SOCK_IO_MAX;
            ssize_t rc = recv(recv_fd, rp + rdone, n, MSG_DONTWAIT);
            if (rc > 0) {
                rdone += (size_t)rc;
                progressed = 1;
            } else if (rc == 0) {
                return eof_error(recv_fd, rdone, rlen);
            } else if (errno == EINTR) {
                progressed = 1;
            } else if (errno != EAGAIN && errno != EWOULDBLOCK) {
                return io_error(recv_fd, "recv", errno);
            }
        }
        if (progressed)
            continue;

        struct pollfd pfds[2];
        nfds_t n = 0;
        if (sdone < slen)
            pfds[n++] = (struct pollfd){.fd = send_fd, .events = POLLOUT};
        if (rdone < rlen)
            pfds[n++] = (struct pollfd){.fd = recv_fd, .events = POLLIN};
        plait_result_t status = poll_slice(pfds, n, deadline);
        int is_ready = 0;
        for (nfds_t i = 0; i < n; i++)
            is_ready |= pfds[i].revents != 0;
        if (status == PLAIT_SUCCESS && !is_ready)
            status = check_wait(deadline, abort_flag, rdone < rlen ? recv_fd : send_fd, "exchanging data with");
        if (status != PLAIT_SUCCESS)
            return status;
    }
    return PLAIT_SUCCESS;
}

plait_result_t plait_sock_auth_server(int fd, const uint8_t secret[PLAIT_SECRET_BYTES], double deadline,
                                      const int *abort_flag)
{
    char peer[PLAIT_SOCKADDR_STRLEN];
    uint8_t msg[PLAIT_AUTH_ANSWER_BYTES];
    struct plait_auth st;
    plait_result_t status;

    /* Named now: after a failure the kernel may have forgotten the peer. */
    fd_peer_str(fd, peer, sizeof(peer));
    status = plait_auth_server_challenge(&st, msg);
    if (status != PLAIT_SUCCESS)
        return status;
    status = plait_sock_send_all(fd, msg, PLAIT_AUTH_CHALLENGE_BYTES, deadline, abort_flag);
    if (status == PLAIT_SUCCESS)
        status = plait_sock_recv_all(fd, msg, PLAIT_AUTH_ANSWER_BYTES, deadline, abort_flag);
    if (status != PLAIT_SUCCESS)
        return plait_error_context(status, "authentication failed from %s", peer);
    uint8_t proof[PLAIT_AUTH_PROOF_BYTES];
    if (!plait_auth_server_check(&st, secret, msg, proof))
        return plait_error(PLAIT_ERR_REMOTE,
                           "authentication failed from %s: wrong answer (a different secret, or not a plait peer)",
                           peer);
    status = plait_sock_send_all(fd, proof, sizeof(proof), deadline, abort_flag);
    if (status != PLAIT_SUCCESS)
        return plait_error_context(status, "authentication failed from %s", peer);
    return PLAIT_SUCCESS;
}

plait_result_t plait_sock_auth_client(int fd, const uint8_t secret[PLAIT_SECRET_BYTES], double deadline,
                                      const int *abort_flag)
{
    char peer[PLAIT_SOCKADDR_STRLEN];
    uint8_t msg[PLAIT_AUTH_CHALLENGE_BYTES], answer[PLAIT_AUTH_ANSWER_BYTES];
    struct plait_auth st;
    plait_result_t status;

    fd_peer_str(fd, peer, sizeof(peer));
    status = plait_sock_recv_all(fd, msg, PLAIT_AUTH_CHALLENGE_BYTES, deadline, abort_flag);
    if (status != PLAIT_SUCCESS)
        return plait_error_context(status, "authentication failed from %s: no challenge", peer);
    if (!plait_auth_client_answer(&st, secret, msg, answer))
        return plait_error(PLAIT_ERR_REMOTE, "authentication failed from %s: not a plait peer (bad protocol tag)",
                           peer);
    status = plait_sock_send_all(fd, answer, PLAIT_AUTH_ANSWER_BYTES, deadline, abort_flag);
    if (status != PLAIT_SUCCESS)
        return plait_error_context(status, "authentication failed from %s", peer);
    status = plait_sock_recv_all(fd, msg, PLAIT_AUTH_PROOF_BYTES, deadline, abort_flag);
    if (status == PLAIT_ERR_REMOTE)
        return plait_error_context(status, "authentication failed from %s: the peer refused our answer (a "
                                           "different secret?)", peer);
    if (status != PLAIT_SUCCESS)
        return plait_error_context(status, "authentication failed from %s", peer);
    if (!plait_auth_client_check(&st, secret, msg))
        return plait_error(PLAIT_ERR_REMOTE, "authentication failed from %s: the peer does not hold the secret", peer);
    return PLAIT_SUCCESS;
}
