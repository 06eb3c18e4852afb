/* A hostile peer on an established connection of the net transport
 * (transports/net.c over the Socket provider, transports/net/socket.c), met at
 * the communicator level: a two-rank communicator over the network
 * (PLAIT_TRANSPORT=socket; the ranks are threads of this process, on
 * loopback) does one good allreduce; rank 1's communicator then stays idle and
 * the test, as the fake peer, writes bytes on the control socket of rank 1's
 * send comm of each of its connections to rank 0 (plait_net_conn_fd). Rank 0's
 * next allreduce must fail at once with PLAIT_ERR_REMOTE, an error naming
 * rank 1 and what was wrong (a header with a bad magic or a wrong message
 * number, a message of 0 bytes or over the slot size, a huge size), without
 * calling the live rank 1 gone; a peer whose side closes in the middle of a
 * header or of a payload is named too; and a malformed connection keeps
 * failing on every later progress call, taking nothing behind the bad bytes.
 *
 * (The hello at set-up, strangers on the listen socket and the deadline
 * error naming what was dropped: test_net_transport's hello_checked and
 * stranger_dropped; the provider's own frame checks: test_net_socket.)
 *
 * Every wait is bounded: PLAIT_TIMEOUT=3, PLAIT_COLL_TIMEOUT=5 and the tests'
 * Criterion timeouts. */
#define _GNU_SOURCE
#include <criterion/criterion.h>

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/log.h"
#include "core/comm.h"
#include "tests/harness.h"
#include "transports/net.h"
#include "transports/net/socket_wire.h"
#include "transports/transport.h"

#define COUNT 1024 /* doubles per allreduce */

static void net_env(void)
{
    setenv("PLAIT_TRANSPORT", "socket", 1);
    setenv("PLAIT_SOCKET_IFNAME", "lo", 1);
    /* one data socket per connection: the test knows which sizes go inline */
    setenv("PLAIT_SOCKET_NTHREADS", "1", 1);
    setenv("PLAIT_NSOCKS_PERTHREAD", "1", 1);
    setenv("PLAIT_TIMEOUT", "3", 1);
    setenv("PLAIT_COLL_TIMEOUT", "5", 1);
    /* every connection is made at init: the tests write on each right after */
    setenv("PLAIT_RUNTIME_CONNECT", "0", 1);
}

TestSuite(net_hostile, .init = net_env);

/* ---------------------------------------------------------------- two ranks as threads */

struct rank {
    plait_unique_id_t id;
    int rank;
    plait_comm_t comm;
    plait_result_t result;
    char err[1024];
};

static void *init_rank(void *p)
{
    struct rank *r = p;
    r->result = plait_comm_init_rank(&r->comm, 2, r->id, r->rank);
    snprintf(r->err, sizeof(r->err), "%s", r->result ? plait_get_last_error(NULL) : "");
    return NULL;
}

static void *good_allreduce(void *p)
{
    struct rank *r = p;
    double buf[2 * COUNT] = {0};
    r->result = plait_allreduce(buf, buf + COUNT, COUNT, PLAIT_FLOAT64, PLAIT_SUM, r->comm, NULL);
    snprintf(r->err, sizeof(r->err), "%s", r->result ? plait_get_last_error(r->comm) : "");
    return NULL;
}

static void run_both(struct rank *r, void *(*fn)(void *))
{
    pthread_t t[2];
    for (int i = 0; i < 2; i++)
        cr_assert_eq(pthread_create(&t[i], NULL, fn, &r[i]), 0);
    for (int i = 0; i < 2; i++)
        pthread_join(t[i], NULL);
}

/* Two ranks over the net transport that have done one good allreduce. */
static void pair_up(struct rank *r)
{
    plait_unique_id_t id;
    cr_assert_eq(plait_get_unique_id(&id), PLAIT_SUCCESS, "%s", plait_get_last_error(NULL));
    for (int i = 0; i < 2; i++)
        r[i] = (struct rank){.id = id, .rank = i};
    run_both(r, init_rank);
    for (int i = 0; i < 2; i++)
        cr_assert_eq(r[i].result, PLAIT_SUCCESS, "rank %d: init: %s", i, r[i].err);
    cr_assert_eq(r[0].comm->ncls, r[1].comm->ncls);
    for (int i = 0; i < 2; i++)
        for (int c = 0; c < r[i].comm->ncls; c++) {
            struct plait_conn *conn = r[i].comm->conns[(1 - i) * r[i].comm->ncls + c];
            cr_assert(conn && conn->tp == &plait_transport_net, "rank %d's class %d connection is not net's", i, c);
            cr_assert_geq(plait_net_conn_fd(conn, 1), 0, "rank %d's class %d has no send socket", i, c);
            cr_assert_geq(plait_net_conn_fd(conn, 0), 0, "rank %d's class %d has no receive socket", i, c);
        }
    run_both(r, good_allreduce);
    for (int i = 0; i < 2; i++)
        cr_assert_eq(r[i].result, PLAIT_SUCCESS, "rank %d: the good allreduce: %s", i, r[i].err);
}

static void pair_free(struct rank *r)
{
    for (int i = 0; i < 2; i++)
        if (r[i].comm)
            plait_comm_abort(r[i].comm);
}

/* The message number rank 1's send comm of `conn` uses next: its hello was
 * message 0, then one message per committed slot (all sent: rank 0 took them). */
static uint32_t next_seq(const struct plait_conn *conn)
{
    return (uint32_t)(1 + conn->tx_posted);
}

/* ---------------------------------------------------------------- malformed frames */

/* What the fake peer writes on a connection: a message header for the
 * message number due + seq_delta, then tail. */
struct forged {
    uint32_t magic;   /* 0: the right one */
    int seq_delta;
    uint64_t size;
    int32_t tag;
    size_t cut;       /* write only this many bytes (0: all) */
    const char *tail; /* written after the header (may be NULL) */
    size_t tail_len;
};

static size_t forge_bytes(const struct forged *f, uint32_t seq, uint8_t *out)
{
    sock_msg_encode(out, seq + (uint32_t)f->seq_delta, f->size, f->tag,
                    sock_msg_is_inline(f->size, 1) ? SOCK_MSG_INLINE : 0);
    if (f->magic)
        sock_put_u32(out, f->magic);
    size_t n = SOCK_MSG_BYTES;
    if (f->tail) {
        memcpy(out + n, f->tail, f->tail_len);
        n += f->tail_len;
    }
    return f->cut ? f->cut : n;
}

/* KEEP_OPEN: the peer is alive and sent bytes that are no message: it must
 * not be called gone. CLOSE_AFTER: its side closes after them (shutdown), which
 * the executor reports as the peer gone. */
enum after { KEEP_OPEN, CLOSE_AFTER };

/* The fake peer writes `f` on rank 1's send socket of every connection to
 * rank 0 (then shuts its sending side when `after` says so); rank 0's
 * allreduce must fail within 3 s with PLAIT_ERR_REMOTE, naming rank 1 and
 * `expect` (NULL: nothing more). Returns rank 0's error in err. */
static void frame_case(const struct forged *f, enum after after, const char *expect, char *err, size_t errlen)
{
    struct rank r[2];
    pair_up(r);
    struct plait_comm *c1 = r[1].comm;
    int written = 0;
    for (int c = 0; c < c1->ncls; c++) {
        const struct plait_conn *conn = c1->conns[0 * c1->ncls + c];
        const int fd = plait_net_conn_fd(conn, 1);
        cr_assert_geq(fd, 0, "rank 1's class %d to rank 0 has no socket", c);
        uint8_t bytes[256];
        const size_t len = forge_bytes(f, next_seq(conn), bytes);
        cr_assert_eq(send(fd, bytes, len, MSG_NOSIGNAL), (ssize_t)len);
        if (after == CLOSE_AFTER)
            cr_assert_eq(shutdown(fd, SHUT_WR), 0);
        written++;
    }
    cr_assert_gt(written, 0);

    double buf[2 * COUNT] = {0};
    const double t0 = mr_now();
    plait_result_t res = plait_allreduce(buf, buf + COUNT, COUNT, PLAIT_FLOAT64, PLAIT_SUM, r[0].comm, NULL);
    const double took = mr_now() - t0;
    snprintf(err, errlen, "%s", res ? plait_get_last_error(r[0].comm) : "");
    cr_log_info("rank 0: %s after %.3f s: %s", plait_get_error_string(res), took, err);
    cr_expect_eq(res, PLAIT_ERR_REMOTE, "rank 0's allreduce returned %s, expected PLAIT_ERR_REMOTE: %s",
                 plait_get_error_string(res), err);
    cr_expect(mr_names_rank(err, 1), "rank 0's error does not name rank 1: %s", err);
    if (expect)
        cr_expect(strstr(err, expect) != NULL, "rank 0's error does not say \"%s\": %s", expect, err);
    if (after == KEEP_OPEN) {
        cr_expect(strstr(err, "malformed message") != NULL, "rank 0's error does not say malformed: %s", err);
        cr_expect(strstr(err, "gone") == NULL, "rank 0's error calls the live rank 1 gone: %s", err);
    }
    cr_expect_lt(took, 3.0, "rank 0's allreduce returned after %.2f s (limit 3 s)", took);
    pair_free(r);
}

Test(net_hostile, frame_bad_magic, .timeout = 30)
{
    const struct forged f = {.magic = 0xdeadbeefu, .size = 16};
    char err[1024];
    frame_case(&f, KEEP_OPEN, "bad magic 0xdeadbeef", err, sizeof(err));
}

Test(net_hostile, frame_wrong_message_number, .timeout = 30)
{
    const struct forged f = {.seq_delta = 7, .size = 16};
    char err[1024];
    frame_case(&f, KEEP_OPEN, "where", err, sizeof(err));
    cr_expect(strstr(err, "lost or repeated") != NULL, "%s", err);
}

Test(net_hostile, frame_length_zero, .timeout = 30)
{
    const struct forged f = {.size = 0};
    char err[1024];
    frame_case(&f, KEEP_OPEN, "a message of 0 bytes", err, sizeof(err));
}

/* One byte over the slot size (the communicator's own), so that an off-by-one
 * in the check shows too. */
Test(net_hostile, frame_over_slot_size, .timeout = 30)
{
    struct rank r[2];
    pair_up(r);
    const size_t slot = r[0].comm->conns[1 * r[0].comm->ncls]->slot_bytes;
    pair_free(r);
    const struct forged f = {.size = slot + 1};
    char err[1024], expect[160];
    frame_case(&f, KEEP_OPEN, "truncated", err, sizeof(err));
    snprintf(expect, sizeof(expect), "is %zu bytes, more than the %zu bytes posted", slot + 1, slot);
    cr_expect(strstr(err, expect) != NULL, "rank 0's error does not say \"%s\": %s", expect, err);
}

Test(net_hostile, frame_huge_length, .timeout = 30)
{
    const struct forged f = {.size = UINT64_MAX};
    char err[1024];
    frame_case(&f, KEEP_OPEN, "of 18446744073709551615 bytes (more than", err, sizeof(err));
}

/* Bytes that are no header at all (what a confused program would write). */
Test(net_hostile, frame_text, .timeout = 30)
{
    static const char junk[] = "GET / HTTP/1.0\r\nHost: x\r\n\r\n";
    char err[1024];
    struct rank r[2];
    pair_up(r);
    struct plait_comm *c1 = r[1].comm;
    for (int c = 0; c < c1->ncls; c++) {
        const int fd = plait_net_conn_fd(c1->conns[0 * c1->ncls + c], 1);
        cr_assert_eq(send(fd, junk, sizeof(junk) - 1, MSG_NOSIGNAL), (ssize_t)(sizeof(junk) - 1));
    }
    double buf[2 * COUNT] = {0};
    plait_result_t res = plait_allreduce(buf, buf + COUNT, COUNT, PLAIT_FLOAT64, PLAIT_SUM, r[0].comm, NULL);
    snprintf(err, sizeof(err), "%s", res ? plait_get_last_error(r[0].comm) : "");
    cr_expect_eq(res, PLAIT_ERR_REMOTE, "%s: %s", plait_get_error_string(res), err);
    cr_expect(mr_names_rank(err, 1) && strstr(err, "malformed message") && strstr(err, "bad magic 0x20544547"),
              "%s", err);
    cr_expect(strstr(err, "gone") == NULL, "%s", err);
    pair_free(r);
}

/* A good header and part of its payload, then the peer's side closes. */
Test(net_hostile, closed_mid_payload, .timeout = 30)
{
    const struct forged f = {.size = 16, .tail = "12345678", .tail_len = 8};
    char err[1024];
    frame_case(&f, CLOSE_AFTER, "is gone", err, sizeof(err));
}

/* Ten bytes of a header, then the peer's side closes. */
Test(net_hostile, closed_mid_header, .timeout = 30)
{
    const struct forged f = {.size = 16, .cut = 10};
    char err[1024];
    frame_case(&f, CLOSE_AFTER, "is gone", err, sizeof(err));
}

/* A malformed connection stays dead: every later progress call on it returns
 * the same error, and nothing more is taken from it (a good message behind
 * the bad header). */
static void frame_case_sticky(const struct forged *bad, const char *expect)
{
    struct rank r[2];
    pair_up(r);
    struct plait_comm *c0 = r[0].comm, *c1 = r[1].comm;
    struct plait_conn *conn = c0->conns[1 * c0->ncls + 0];
    const struct plait_conn *peer = c1->conns[0 * c1->ncls + 0];
    const int fd = plait_net_conn_fd(peer, 1);
    cr_assert_geq(fd, 0);
    uint8_t bytes[256];
    const uint32_t seq = next_seq(peer);
    size_t n = forge_bytes(bad, seq, bytes);
    const struct forged good = {.size = 16, .tail = "0123456789abcdef", .tail_len = 16};
    n += forge_bytes(&good, seq + 1, bytes + n);
    cr_assert_eq(send(fd, bytes, n, MSG_NOSIGNAL), (ssize_t)n);
    const uint64_t tail = __atomic_load_n(conn->rx_tail, __ATOMIC_ACQUIRE);
    plait_result_t res = PLAIT_SUCCESS;
    struct plait_conn *failed = NULL;
    const double end = mr_now() + 3;
    while (res == PLAIT_SUCCESS && mr_now() < end)
        res = conn->tp->progress(conn->ctx, conn, &failed);
    cr_assert_eq(res, PLAIT_ERR_REMOTE, "the bad header was not refused within 3 s (%s)", plait_get_error_string(res));
    cr_expect_eq(failed, conn);
    char first[1024];
    snprintf(first, sizeof(first), "%s", plait_last_error_get());
    cr_expect(strstr(first, expect) && strstr(first, "malformed message") && mr_names_rank(first, 1), "%s", first);
    cr_expect(!plait_conn_peer_gone(conn), "the live rank 1 is marked gone");
    for (int i = 0; i < 3; i++) {
        cr_expect_eq(conn->tp->progress(conn->ctx, conn, &failed), PLAIT_ERR_REMOTE, "progress call %d after the bad "
                                                                                   "header", i + 2);
        cr_expect_str_eq(plait_last_error_get(), first);
    }
    cr_expect_eq(__atomic_load_n(conn->rx_tail, __ATOMIC_ACQUIRE), tail, "a message was taken after the bad header");
    pair_free(r);
}

Test(net_hostile, malformed_stays_dead_bad_magic, .timeout = 30)
{
    const struct forged f = {.magic = 0x0badf00du, .size = 16};
    frame_case_sticky(&f, "bad magic 0x0badf00d");
}

Test(net_hostile, malformed_stays_dead_length_zero, .timeout = 30)
{
    const struct forged f = {.size = 0};
    frame_case_sticky(&f, "a message of 0 bytes");
}
