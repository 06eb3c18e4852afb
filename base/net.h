/* TCP helpers: addresses, interface choice, deadline-bounded connect/accept/IO,
 * and the challenge-response that every plait connection starts with.
 *
 * Every blocking helper takes an absolute deadline (plait_deadline(); 0 = none)
 * and an abort flag (may be NULL) that it polls at least every 100 ms. Sockets
 * never raise SIGPIPE (MSG_NOSIGNAL). Errors set the last-error message (naming
 * the address) and return PLAIT_ERR_SYSTEM, PLAIT_ERR_REMOTE (peer closed or
 * reset), PLAIT_ERR_TIMEOUT, or PLAIT_ERR_REMOTE with "aborted" when the flag
 * was raised. */
#ifndef PLAIT_NET_H
#define PLAIT_NET_H

#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include "plait.h"
#include "base/crypto.h"

union plait_sockaddr {
    struct sockaddr sa;
    struct sockaddr_in sin;
    struct sockaddr_in6 sin6;
};

/* Enough for plait_sockaddr_str() of any address ("[v6%scope]:port"). */
#define PLAIT_SOCKADDR_STRLEN 72

/* ---- Interfaces: PLAIT_SOCKET_IFNAME / NCCL_SOCKET_IFNAME, as NCCL parses them.
 *
 * Syntax: an optional "^" (exclude the listed names), then an optional "="
 * (exact names instead of prefixes), in that order; then entries separated by
 * commas. Empty entries are skipped, an entry ends at its first ':' (NCCL's
 * "name:port" form; the port means nothing for an interface), nothing is
 * trimmed, and at most PLAIT_IFNAME_SPEC_MAX entries count. No entry at all
 * ("", "^", ",") selects every interface. */
#define PLAIT_IFNAME_SPEC_MAX 16
#define PLAIT_IFNAME_PREFIX_BYTES 64
/* Most interfaces plait_sock_find_interfaces reports (NCCL's MAX_IFS). */
#define PLAIT_NETIF_MAX 16

struct plait_ifname_spec {
    int is_exclude; /* leading '^' */
    int is_exact;   /* '=' (after the '^' when both) */
    int count;
    char names[PLAIT_IFNAME_SPEC_MAX][PLAIT_IFNAME_PREFIX_BYTES];
};

/* An interface and the address plait uses on it (port 0). */
struct plait_netif {
    char name[IFNAMSIZ];
    union plait_sockaddr addr;
};

/* Pure functions, for the provider and the tests: parse a spec (NULL = no
 * entry), and whether an interface name passes it. */
void plait_ifname_spec_parse(const char *text, struct plait_ifname_spec *spec_out);
int plait_ifname_spec_matches(const struct plait_ifname_spec *spec, const char *ifname);

/* The interfaces of a getifaddrs() list that `ifname_spec` selects, written to
 * out[0..max-1] in the order of the list, each once with one address (its
 * IPv4 address when it has one, else its first global IPv6 one); returns how
 * many. Only addresses of interfaces up and running count; IPv6 loopback and
 * link-local addresses never do. NULL or "" means NCCL's default order, where
 * the first step that finds an interface wins: "ib" (IPoIB), then
 * "^docker,lo,virbr" (anything else), then "docker", then "lo", then "virbr".
 * A pure function of `list` (tests pass lists they build). */
int plait_sock_select_interfaces(const struct ifaddrs *list, const char *ifname_spec, struct plait_netif *out,
                                 int max);

/* The same on this machine's interfaces. *n_out >= 1 on success;
 * PLAIT_ERR_SYSTEM with a message listing the interfaces seen (and which are
 * down or without carrier) when none is selected. */
plait_result_t plait_sock_find_interfaces(const char *ifname_spec, struct plait_netif *out, int max, int *n_out);

/* Chooses the address to listen on: the first interface of
 * plait_sock_find_interfaces(ifname_spec). Writes the address (port 0) and
 * the interface name. Errors as plait_sock_find_interfaces. */
plait_result_t plait_sock_find_ifaddr(const char *ifname_spec, union plait_sockaddr *addr_out, char *ifname_out,
                                      size_t ifname_len);

/* Whether a socket call's errno is the peer's or the network's doing
 * (PLAIT_ERR_REMOTE: reset, refused, unreachable, timed out, ...) or this
 * process's (PLAIT_ERR_SYSTEM). */
plait_result_t plait_sock_errno_status(int err);

/* Parses "host:port", "ipv4:port" or "[ipv6]:port" (host names resolved with
 * getaddrinfo). PLAIT_ERR_INVALID_ARGUMENT with the text when malformed. */
plait_result_t plait_sock_parse_addr(const char *hostport, union plait_sockaddr *addr_out);

/* "1.2.3.4:5678" or "[::1]:5678" into buf. */
void plait_sockaddr_str(const union plait_sockaddr *addr, char *buf, size_t len);

/* Binds and listens on addr (its port may be 0 = any; the bound port is written
 * back into *addr). Backlog large enough for 1024 ranks. SO_REUSEADDR set. The
 * listening fd is non-blocking and close-on-exec (accepted fds are blocking). */
plait_result_t plait_sock_listen(union plait_sockaddr *addr, int *fd_out);

/* Connects to addr, retrying refused/unreachable attempts until the deadline
 * (the peer may not be listening yet; deadline 0: until aborted), backing off
 * from 10 to 100 ms. A TCP self-connection (possible when addr is a free local
 * port) counts as refused. The returned fd is blocking, TCP_NODELAY. */
plait_result_t plait_sock_connect(const union plait_sockaddr *addr, double deadline, const int *abort_flag,
                                  int *fd_out);

/* Accepts one connection on a listening fd before the deadline. */
plait_result_t plait_sock_accept(int listen_fd, double deadline, const int *abort_flag, int *fd_out);

/* Sends/receives exactly len bytes, looping over partial transfers and EINTR,
 * at most 1 GiB per system call. recv of EOF: PLAIT_ERR_REMOTE "connection closed". */
plait_result_t plait_sock_send_all(int fd, const void *buf, size_t len, double deadline, const int *abort_flag);
plait_result_t plait_sock_recv_all(int fd, void *buf, size_t len, double deadline, const int *abort_flag);

/* Sends slen bytes on send_fd while receiving rlen bytes on recv_fd, both at
 * once, so that two peers exchanging blocks larger than the socket buffers
 * cannot deadlock (each would otherwise block in send while the other does too).
 * The fds may be the same. Returns when both are complete; errors as above. */
plait_result_t plait_sock_sendrecv(int send_fd, const void *sbuf, size_t slen, int recv_fd, void *rbuf, size_t rlen,
                                   double deadline, const int *abort_flag);

/* Mutual challenge-response with HMAC-SHA-256 over fresh random nonces: each side
 * proves it holds `secret` without sending it. The server (accepting side) speaks
 * first and reads nothing but the fixed-size answers before the client is proven.
 * On failure returns PLAIT_ERR_REMOTE ("authentication failed from ADDR") and the
 * caller closes the fd. */
plait_result_t plait_sock_auth_server(int fd, const uint8_t secret[PLAIT_SECRET_BYTES], double deadline,
                                      const int *abort_flag);
plait_result_t plait_sock_auth_client(int fd, const uint8_t secret[PLAIT_SECRET_BYTES], double deadline,
                                      const int *abort_flag);

#endif
