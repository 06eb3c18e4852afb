/* The socket transport's checks on what it reads (transports/tcp.c), each met
 * by a fake peer on a real loopback connection of a two-rank communicator over
 * TCP (PLAIT_TRANSPORT=socket; the ranks are threads of this process):
 *
 *   frames (data plane): rank 1's communicator stays idle and the test, as the
 *   fake peer, writes bytes on rank 1's end of each of its connections to rank
 *   0; rank 0's next allreduce must fail at once with an error naming rank 1
 *   and what was wrong (bad magic, a length of 0, a length over the slot size,
 *   a connection closed in the middle of a header or of a payload), and a
 *   malformed connection keeps failing on every later progress call;
 *
 *   hellos (set-up): the linker wraps plait_sock_send_all (tests/meson.build)
 *   so that the hello rank 0 sends after the handshake is forged (not a hello,
 *   a rank that is not below the acceptor, a class out of range, a second hello
 *   for a class already connected); rank 1 must drop the connection and fail
 *   its init at its deadline with an error naming where the connection came
 *   from and what was wrong with its hello.
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
#include "base/net.h"
#include "core/comm.h"
#include "tests/harness.h"
#include "transports/transport.h"

#define FRAME_MAGIC 0x504c5431u /* transports/tcp.c's TCP_MAGIC ("PLT1") */
#define HELLO_MAGIC 0x504c4843u /* transports/tcp.c's HELLO_MAGIC */
#define COUNT 1024              /* doubles per allreduce: over the socket connections */

static void socket_env(void)
{
    setenv("PLAIT_TRANSPORT", "socket", 1);
    setenv("PLAIT_TIMEOUT", "3", 1);
    setenv("PLAIT_COLL_TIMEOUT", "5", 1);
    /* The tests below read and forge frames on every class's connection
     * right after init: every connection is made then (connections made on
     * first use have tests of their own, in test_connect). */
    setenv("PLAIT_RUNTIME_CONNECT", "0", 1);
}

TestSuite(tcp, .init = socket_env);

/* ---------------------------------------------------------------- the forged hello */

/* The hello of transports/tcp.c. */
struct hello {
    uint32_t magic;
    int32_t rank;
    int32_t cls;
    uint32_t pad;
};

enum forge { FORGE_NONE, FORGE_MAGIC, FORGE_RANK_NOT_BELOW, FORGE_RANK_NEGATIVE, FORGE_CLASS, FORGE_DUPLICATE };

static enum forge forge_kind; /* set before the ranks start, read by the wrapper */
static int hellos_sent;
static int32_t first_cls;

plait_result_t __real_plait_sock_send_all(int fd, const void *buf, size_t len, double deadline, const int *abort_flag);

/* Every plait_sock_send_all of the library comes here (-Wl,--wrap). A hello of
 * rank 0's (the only rank that connects when there are two) is forged as
 * forge_kind says; everything else passes unchanged. */
plait_result_t __wrap_plait_sock_send_all(int fd, const void *buf, size_t len, double deadline, const int *abort_flag)
{
    struct hello h;
    enum forge kind = __atomic_load_n(&forge_kind, __ATOMIC_ACQUIRE);
    if (kind == FORGE_NONE || len != sizeof(h))
        return __real_plait_sock_send_all(fd, buf, len, deadline, abort_flag);
    memcpy(&h, buf, sizeof(h));
    if (h.magic != HELLO_MAGIC)
        return __real_plait_sock_send_all(fd, buf, len, deadline, abort_flag);
    int n = __atomic_fetch_add(&hellos_sent, 1, __ATOMIC_ACQ_REL);
    switch (kind) {
    case FORGE_MAGIC:
        h.magic = 0x12345678u;
        break;
    case FORGE_RANK_NOT_BELOW:
        h.rank = 1;
        break;
    case FORGE_RANK_NEGATIVE:
        h.rank = -1;
        break;
    case FORGE_CLASS:
        h.cls = 1000;
        break;
    case FORGE_DUPLICATE:
        /* The first hello is right; the second claims the first one's class. */
        if (n == 0)
            first_cls = h.cls;
        else
            h.cls = first_cls;
        break;
    case FORGE_NONE:
        break;
    }
    return __real_plait_sock_send_all(fd, &h, sizeof(h), deadline, abort_flag);
}

/* ---------------------------------------------------------------- two ranks as threads */

struct rank {
    plait_unique_id_t id;
    int rank;
    plait_comm_t comm;
    plait_result_t result;
    char err[1024];
    double took;
};

static void *init_rank(void *p)
{
    struct rank *r = p;
    double t0 = mr_now();
    r->result = plait_comm_init_rank(&r->comm, 2, r->id, r->rank);
    r->took = mr_now() - t0;
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

/* Two ranks over TCP that have done one good allreduce. */
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
    for (int c = 0; c < r[0].comm->ncls; c++) {
        struct plait_conn *conn = r[0].comm->conns[1 * r[0].comm->ncls + c];
        cr_assert(conn && conn->tp == &plait_transport_tcp, "rank 0's class %d to rank 1 is no socket", c);
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

/* ---------------------------------------------------------------- malformed frames */

/* KEEP_OPEN: the peer is alive and sent bytes that are no frame: it must not
 * be called gone. CLOSE_AFTER: its side of the connection closes after them, which
 * the executor reports as the peer gone, with the transport's detail. */
enum after { KEEP_OPEN, CLOSE_AFTER };

/* The fake peer writes `bytes` on rank 1's end of every connection to rank 0
 * (then shuts its sending side when `after` says so); rank 0's allreduce must
 * fail within 3 s with PLAIT_ERR_REMOTE, naming rank 1 and `expect`. Returns
 * with rank 0's error in err. */
static void frame_case(const void *bytes, size_t len, enum after after, const char *expect, char *err, size_t errlen)
{
    struct rank r[2];
    pair_up(r);
    struct plait_comm *c1 = r[1].comm;
    int written = 0;
    for (int c = 0; c < c1->ncls; c++) {
        int fd = plait_tcp_conn_fd(c1->conns[0 * c1->ncls + c]);
        cr_assert_geq(fd, 0, "rank 1's class %d to rank 0 has no socket", c);
        cr_assert_eq(send(fd, bytes, len, MSG_NOSIGNAL), (ssize_t)len);
        if (after == CLOSE_AFTER)
            cr_assert_eq(shutdown(fd, SHUT_WR), 0);
        written++;
    }
    cr_assert_gt(written, 0);

    double buf[2 * COUNT] = {0};
    double t0 = mr_now();
    plait_result_t res = plait_allreduce(buf, buf + COUNT, COUNT, PLAIT_FLOAT64, PLAIT_SUM, r[0].comm, NULL);
    double took = mr_now() - t0;
    snprintf(err, errlen, "%s", res ? plait_get_last_error(r[0].comm) : "");
    cr_log_info("rank 0: %s after %.3f s: %s", plait_get_error_string(res), took, err);
    cr_expect_eq(res, PLAIT_ERR_REMOTE, "rank 0's allreduce returned %s, expected PLAIT_ERR_REMOTE: %s",
                 plait_get_error_string(res), err);
    cr_expect(mr_names_rank(err, 1), "rank 0's error does not name rank 1: %s", err);
    cr_expect(strstr(err, expect) != NULL, "rank 0's error does not say \"%s\": %s", expect, err);
    if (after == KEEP_OPEN)
        cr_expect(strstr(err, "gone") == NULL, "rank 0's error calls the live rank 1 gone: %s", err);
    cr_expect_lt(took, 3.0, "rank 0's allreduce returned after %.2f s (limit 3 s)", took);
    pair_free(r);
}

/* A malformed connection stays dead: every later progress call on it returns
 * the same error, and nothing more is read from it. */
static void frame_case_sticky(const uint32_t hdr[2], const char *expect)
{
    struct rank r[2];
    pair_up(r);
    struct plait_comm *c0 = r[0].comm, *c1 = r[1].comm;
    struct plait_conn *conn = c0->conns[1 * c0->ncls + 0];
    int fd = plait_tcp_conn_fd(c1->conns[0 * c1->ncls + 0]);
    cr_assert_geq(fd, 0);
    /* The bad header, then a good frame behind it that must not be taken. */
    uint32_t bytes[2 + 2 + 4] = {hdr[0], hdr[1], FRAME_MAGIC, 16, 1, 2, 3, 4};
    cr_assert_eq(send(fd, bytes, sizeof(bytes), MSG_NOSIGNAL), (ssize_t)sizeof(bytes));
    uint64_t tail = __atomic_load_n(conn->rx_tail, __ATOMIC_ACQUIRE);
    plait_result_t res = PLAIT_SUCCESS;
    struct plait_conn *failed = NULL;
    double end = mr_now() + 3;
    while (res == PLAIT_SUCCESS && mr_now() < end)
        res = conn->tp->progress(conn->ctx, conn, &failed);
    cr_assert_eq(res, PLAIT_ERR_REMOTE, "the bad header was not refused within 3 s");
    char first[1024];
    snprintf(first, sizeof(first), "%s", plait_last_error_get());
    cr_expect(strstr(first, expect) && strstr(first, "malformed message") && mr_names_rank(first, 1), "%s", first);
    for (int i = 0; i < 3; i++) {
        cr_expect_eq(conn->tp->progress(conn->ctx, conn, &failed), PLAIT_ERR_REMOTE, "progress call %d after the bad header", i + 2);
        cr_expect_str_eq(plait_last_error_get(), first);
    }
    cr_expect_eq(__atomic_load_n(conn->rx_tail, __ATOMIC_ACQUIRE), tail, "a frame was taken after the bad header");
    pair_free(r);
}

Test(tcp, frame_bad_magic, .timeout = 30)
{
    const uint32_t hdr[2] = {0xdeadbeefu, 16};
    char err[1024];
    frame_case(hdr, sizeof(hdr), KEEP_OPEN, "malformed message", err, sizeof(err));
    cr_expect(strstr(err, "bad magic 0xdeadbeef") != NULL, "%s", err);
}

Test(tcp, frame_length_zero, .timeout = 30)
{
    const uint32_t hdr[2] = {FRAME_MAGIC, 0};
    char err[1024];
    frame_case(hdr, sizeof(hdr), KEEP_OPEN, "malformed message", err, sizeof(err));
    cr_expect(strstr(err, "a frame of length 0") != NULL, "%s", err);
}

/* One byte over the slot size (the communicator's own), so that an off-by-one
 * in the check shows too. */
Test(tcp, frame_over_slot_size, .timeout = 30)
{
    struct rank r[2];
    pair_up(r);
    size_t slot = r[0].comm->conns[1 * r[0].comm->ncls]->slot_bytes;
    pair_free(r);
    const uint32_t hdr[2] = {FRAME_MAGIC, (uint32_t)slot + 1};
    char err[1024], expect[128];
    frame_case(hdr, sizeof(hdr), KEEP_OPEN, "malformed message", err, sizeof(err));
    snprintf(expect, sizeof(expect), "a frame of %zu bytes, larger than a slot (%zu bytes)", slot + 1, slot);
    cr_expect(strstr(err, expect) != NULL, "rank 0's error does not say \"%s\": %s", expect, err);
}

Test(tcp, frame_huge_length, .timeout = 30)
{
    const uint32_t hdr[2] = {FRAME_MAGIC, 0xffffffffu};
    char err[1024];
    frame_case(hdr, sizeof(hdr), KEEP_OPEN, "a frame of 4294967295 bytes, larger than a slot", err, sizeof(err));
}

/* A good header and half of its payload, then the peer's side closes. */
Test(tcp, closed_mid_payload, .timeout = 30)
{
    const uint32_t bytes[2 + 2] = {FRAME_MAGIC, 16, 1, 2};
    char err[1024];
    frame_case(bytes, sizeof(bytes), CLOSE_AFTER, "connection closed in the middle of a message", err, sizeof(err));
}

/* Three bytes of a header, then the peer's side closes. */
Test(tcp, closed_mid_header, .timeout = 30)
{
    const uint32_t hdr[2] = {FRAME_MAGIC, 16};
    char err[1024];
    frame_case(hdr, 3, CLOSE_AFTER, "connection closed in the middle of a message", err, sizeof(err));
}

Test(tcp, malformed_stays_dead_bad_magic, .timeout = 30)
{
    const uint32_t hdr[2] = {0x0badf00du, 16};
    frame_case_sticky(hdr, "bad magic 0x0badf00d");
}

Test(tcp, malformed_stays_dead_length_zero, .timeout = 30)
{
    const uint32_t hdr[2] = {FRAME_MAGIC, 0};
    frame_case_sticky(hdr, "a frame of length 0");
}

/* ---------------------------------------------------------------- bad hellos at set-up */

/* Rank 0's hello is forged as `kind` says: rank 1 must drop the connection and
 * fail at its deadline (PLAIT_TIMEOUT=3), naming the address the connection came
 * from and `expect`; nobody hangs or crashes. */
static void hello_case(enum forge kind, const char *expect)
{
    plait_unique_id_t id;
    cr_assert_eq(plait_get_unique_id(&id), PLAIT_SUCCESS, "%s", plait_get_last_error(NULL));
    struct rank r[2];
    for (int i = 0; i < 2; i++)
        r[i] = (struct rank){.id = id, .rank = i};
    __atomic_store_n(&hellos_sent, 0, __ATOMIC_RELEASE);
    __atomic_store_n(&forge_kind, kind, __ATOMIC_RELEASE);
    run_both(r, init_rank);
    __atomic_store_n(&forge_kind, FORGE_NONE, __ATOMIC_RELEASE);
    cr_log_info("rank 0: %s after %.2f s: %s", plait_get_error_string(r[0].result), r[0].took, r[0].err);
    cr_log_info("rank 1: %s after %.2f s: %s", plait_get_error_string(r[1].result), r[1].took, r[1].err);
    cr_expect_gt(__atomic_load_n(&hellos_sent, __ATOMIC_ACQUIRE), 0, "rank 0 sent no hello");
    cr_expect_neq(r[1].result, PLAIT_SUCCESS, "rank 1 took a connection with a forged hello");
    cr_expect(strstr(r[1].err, ", and dropped ") != NULL, "rank 1's error does not count the dropped connection: %s",
              r[1].err);
    cr_expect(strstr(r[1].err, "the last, from ") != NULL && strstr(r[1].err, "an unknown address") == NULL,
              "rank 1's error does not say where the connection came from: %s", r[1].err);
    cr_expect(strstr(r[1].err, expect) != NULL, "rank 1's error does not say \"%s\": %s", expect, r[1].err);
    cr_expect_lt(r[1].took, 10.0, "rank 1's init took %.2f s (deadline 3 s)", r[1].took);
    cr_expect_lt(r[0].took, 15.0, "rank 0's init took %.2f s", r[0].took);
    pair_free(r);
}

Test(tcp, hello_bad_magic, .timeout = 40)
{
    hello_case(FORGE_MAGIC, "not a hello (magic 0x12345678");
}

Test(tcp, hello_rank_not_below, .timeout = 40)
{
    hello_case(FORGE_RANK_NOT_BELOW, "a hello from rank 1, not another rank of the 2 of the communicator");
}

Test(tcp, hello_rank_negative, .timeout = 40)
{
    hello_case(FORGE_RANK_NEGATIVE, "a hello from rank -1, not another rank of the 2 of the communicator");
}

Test(tcp, hello_class_out_of_range, .timeout = 40)
{
    hello_case(FORGE_CLASS, "a hello from rank 0 for connection class 1000 of");
}

Test(tcp, hello_second_for_a_class, .timeout = 40)
{
    hello_case(FORGE_DUPLICATE, "a second hello from rank 0 for connection class");
}
