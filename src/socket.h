/* TCP helpers: addresses, interface choice, deadline-bounded connect/accept/IO,
 * and the challenge-response that every plait connection starts with.
 *
 * Every blocking helper takes an absolute deadline (plait_deadline(); 0 = none)
 * and an abort flag (may be NULL) that it polls at least every 100 ms. Sockets
 * never raise SIGPIPE (MSG_NOSIGNAL). Errors set the last-error message (naming
 * the address) and return PLAIT_ERR_SYSTEM, PLAIT_ERR_REMOTE (peer closed or
 * reset), PLAIT_ERR_TIMEOUT, or PLAIT_ERR_REMOTE with "aborted" when the flag
 * was raised. */
#ifndef PLAIT_SOCKET_H
#define PLAIT_SOCKET_H

#include <netinet/in.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include "plait.h"

union plait_sockaddr {
    struct sockaddr sa;
    struct sockaddr_in sin;
    struct sockaddr_in6 sin6;
};

#define PLAIT_SECRET_BYTES 32

/* Enough for plait_sockaddr_str() of any address ("[v6%scope]:port"). */
#define PLAIT_SOCKADDR_STRLEN 72

/* Chooses the address to listen on. `ifname_spec` is PLAIT_SOCKET_IFNAME's syntax
 * (NCCL's): a comma-separated list of name prefixes, "^" before the list excludes,
 * "=" before the list means exact names; NULL or "" = first interface that is up
 * and not loopback, else loopback. Writes the address (port 0) and the interface
 * name. Returns PLAIT_ERR_SYSTEM with a message listing the interfaces seen when
 * none matches. */
plait_result_t plait_sock_find_ifaddr(const char *ifname_spec, union plait_sockaddr *addr_out, char *ifname_out,
                                      size_t ifname_len);

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

/* The same handshake in steps, for servers that drive many connections from one
 * poll loop (the bootstrap root must not let one silent peer stall the others).
 * Messages, all fixed-size:
 *   server -> client  challenge: "PLAITAU1" (8 bytes) || Ns (32 random bytes)
 *   client -> server  answer:    Nc (32 random bytes) || HMAC(secret, "c" || Ns || Nc)
 *   server -> client  proof:     HMAC(secret, "s" || Nc || Ns)
 * The step functions do no I/O and set no last-error message. */
#define PLAIT_AUTH_TAG_BYTES 8
#define PLAIT_AUTH_CHALLENGE_BYTES 40
#define PLAIT_AUTH_ANSWER_BYTES 64
#define PLAIT_AUTH_PROOF_BYTES 32

struct plait_auth {
    uint8_t server_nonce[32];
    uint8_t client_nonce[32];
};

/* Server: draws Ns and writes the challenge. PLAIT_ERR_SYSTEM if getrandom fails. */
plait_result_t plait_auth_server_challenge(struct plait_auth *st, uint8_t challenge_out[PLAIT_AUTH_CHALLENGE_BYTES]);
/* Server: checks the client's answer (constant time); on success writes the proof
 * and returns 1, else returns 0 (the caller closes the connection). */
int plait_auth_server_check(struct plait_auth *st, const uint8_t secret[PLAIT_SECRET_BYTES],
                            const uint8_t answer[PLAIT_AUTH_ANSWER_BYTES], uint8_t proof_out[PLAIT_AUTH_PROOF_BYTES]);
/* Client: checks the tag, draws Nc and writes the answer. Returns 0 when the tag
 * is wrong (the peer does not speak this protocol) or getrandom fails, else 1. */
int plait_auth_client_answer(struct plait_auth *st, const uint8_t secret[PLAIT_SECRET_BYTES],
                             const uint8_t challenge[PLAIT_AUTH_CHALLENGE_BYTES],
                             uint8_t answer_out[PLAIT_AUTH_ANSWER_BYTES]);
/* Client: checks the server's proof (constant time). Returns 1 when it is right. */
int plait_auth_client_check(const struct plait_auth *st, const uint8_t secret[PLAIT_SECRET_BYTES],
                            const uint8_t proof[PLAIT_AUTH_PROOF_BYTES]);

/* Cryptographically random bytes (getrandom). */
plait_result_t plait_random_bytes(void *buf, size_t len);

/* SHA-256 and HMAC-SHA-256 (FIPS 180-4, RFC 2104). */
void plait_sha256(const void *data, size_t len, uint8_t out[32]);
void plait_hmac_sha256(const uint8_t *key, size_t key_len, const void *data, size_t len, uint8_t out[32]);

#endif
