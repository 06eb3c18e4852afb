/* How the net transport (transports/net.c) uses a provider's memory
 * registration: a strict double wraps the Socket provider (through
 * plait_net_provider_substitute) and checks every call as a verbs provider
 * would need it: every isend/irecv buffer lies inside a live registration
 * made on the same comm, deregistrations name live handles of their comm, and
 * no comm is closed while it still has registrations. A failing reg_mr fails
 * the communicator with a message saying what was registered. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "base/util.h"
#include "core/progress.h"
#include "tests/harness.h"
#include "transports/net.h"
#include "transports/net/provider.h"

#define MAX_REGS 4096

struct reg {
    void *comm;
    const char *data;
    size_t size;
    void *inner; /* the Socket provider's handle */
    int live;
};

static struct {
    pthread_mutex_t lock;
    struct reg regs[MAX_REGS];
    int nregs;
    int checked; /* isend/irecv buffers checked */
    int bad;
    char bad_msg[512];
    int fail_reg;    /* reg_mr fails */
    int fail_rx_reg; /* reg_mr fails for a large buffer on an accepted comm (the receive slots) */
    void *recv_comms[64];
    int nrecv_comms;
} D = {.lock = PTHREAD_MUTEX_INITIALIZER};

static void bad(const char *fmt, const void *a, const void *b)
{
    if (D.bad++ == 0)
        snprintf(D.bad_msg, sizeof(D.bad_msg), fmt, a, b);
}

/* The registration behind mh, checked against comm and [data, data + size);
 * NULL (and a complaint) when it is not one. Called with the lock held. */
static struct reg *covering(void *comm, void *mh, const void *data, size_t size)
{
    struct reg *r = mh;
    if (!r || r < D.regs || r >= D.regs + D.nregs) {
        bad("a buffer %p passed with handle %p, which reg_mr did not give", data, mh);
        return NULL;
    }
    if (!r->live || r->comm != comm) {
        bad("handle %p used on comm %p after its deregistration or on another comm", mh, comm);
        return NULL;
    }
    const char *p = data;
    if (p < r->data || p + size > r->data + r->size) {
        bad("buffer %p is outside the registration of handle %p", data, mh);
        return NULL;
    }
    D.checked++;
    return r;
}

static plait_result_t d_reg_mr(void *comm, void *data, size_t size, int type, void **mh)
{
    if (D.fail_reg)
        return plait_error(PLAIT_ERR_SYSTEM, "strict double: reg_mr refused (as out of pinnable memory)");
    if (__atomic_load_n(&D.fail_rx_reg, __ATOMIC_RELAXED) && size > 256) {
        pthread_mutex_lock(&D.lock);
        int is_recv = 0;
        for (int i = 0; i < D.nrecv_comms; i++)
            is_recv |= D.recv_comms[i] == comm;
        pthread_mutex_unlock(&D.lock);
        if (is_recv)
            return plait_error(PLAIT_ERR_SYSTEM, "strict double: reg_mr of receive memory refused");
    }
    void *inner = NULL;
    plait_result_t s = plait_net_socket.reg_mr(comm, data, size, type, &inner);
    if (s)
        return s;
    pthread_mutex_lock(&D.lock);
    if (D.nregs == MAX_REGS) {
        pthread_mutex_unlock(&D.lock);
        plait_net_socket.dereg_mr(comm, inner);
        return plait_error(PLAIT_ERR_SYSTEM, "strict double: too many registrations");
    }
    struct reg *r = &D.regs[D.nregs++];
    *r = (struct reg){comm, data, size, inner, 1};
    *mh = r;
    pthread_mutex_unlock(&D.lock);
    return PLAIT_SUCCESS;
}

static plait_result_t d_dereg_mr(void *comm, void *mh)
{
    pthread_mutex_lock(&D.lock);
    struct reg *r = covering(comm, mh, mh && (struct reg *)mh >= D.regs && (struct reg *)mh < D.regs + MAX_REGS
                                           ? ((struct reg *)mh)->data
                                           : NULL,
                             0);
    void *inner = r ? r->inner : NULL;
    if (r)
        r->live = 0;
    pthread_mutex_unlock(&D.lock);
    return r ? plait_net_socket.dereg_mr(comm, inner) : PLAIT_SUCCESS;
}

static plait_result_t d_isend(void *comm, const void *data, size_t size, int tag, void *mh, void **req)
{
    pthread_mutex_lock(&D.lock);
    struct reg *r = covering(comm, mh, data, size);
    void *inner = r ? r->inner : NULL;
    pthread_mutex_unlock(&D.lock);
    return plait_net_socket.isend(comm, data, size, tag, inner, req);
}

static plait_result_t d_irecv(void *comm, int n, void **data, const size_t *sizes, const int *tags, void **mhs,
                              void **req)
{
    void *inner[8] = {0};
    pthread_mutex_lock(&D.lock);
    for (int i = 0; i < n && i < 8; i++) {
        struct reg *r = mhs ? covering(comm, mhs[i], data[i], sizes[i]) : NULL;
        if (!mhs)
            bad("irecv of %p without handles (%p)", data[i], NULL);
        inner[i] = r ? r->inner : NULL;
    }
    pthread_mutex_unlock(&D.lock);
    return plait_net_socket.irecv(comm, n, data, sizes, tags, inner, req);
}

static void no_live_on(void *comm)
{
    pthread_mutex_lock(&D.lock);
    for (int i = 0; i < D.nregs; i++)
        if (D.regs[i].live && D.regs[i].comm == comm) {
            bad("comm %p closed with the registration of %p still live", comm, D.regs[i].data);
            D.regs[i].live = 0;
        }
    pthread_mutex_unlock(&D.lock);
}

static plait_result_t d_accept(void *listen_comm, void **recv_comm)
{
    plait_result_t s = plait_net_socket.accept(listen_comm, recv_comm);
    if (!s && *recv_comm) {
        pthread_mutex_lock(&D.lock);
        if (D.nrecv_comms < 64)
            D.recv_comms[D.nrecv_comms++] = *recv_comm;
        pthread_mutex_unlock(&D.lock);
    }
    return s;
}

static plait_result_t d_close_send(void *comm)
{
    no_live_on(comm);
    return plait_net_socket.close_send(comm);
}

static plait_result_t d_close_recv(void *comm)
{
    no_live_on(comm);
    pthread_mutex_lock(&D.lock);
    for (int i = 0; i < D.nrecv_comms; i++)
        if (D.recv_comms[i] == comm)
            D.recv_comms[i--] = D.recv_comms[--D.nrecv_comms];
    pthread_mutex_unlock(&D.lock);
    return plait_net_socket.close_recv(comm);
}

static struct plait_net_provider strict;

static void strict_on(void)
{
    strict = plait_net_socket;
    strict.reg_mr = d_reg_mr;
    strict.dereg_mr = d_dereg_mr;
    strict.isend = d_isend;
    strict.irecv = d_irecv;
    strict.close_send = d_close_send;
    strict.close_recv = d_close_recv;
    strict.accept = d_accept;
    plait_net_provider_substitute(&strict);
    setenv("PLAIT_NET_PROVIDER", "socket", 1);
    setenv("PLAIT_SOCKET_IFNAME", "lo", 1);
    setenv("PLAIT_COLL_TIMEOUT", "60", 1);
}

static void strict_off(void)
{
    plait_net_provider_substitute(NULL);
    unsetenv("PLAIT_NET_PROVIDER");
    unsetenv("PLAIT_SOCKET_IFNAME");
    unsetenv("PLAIT_COLL_TIMEOUT");
}

TestSuite(net_reg, .init = strict_on, .fini = strict_off);

/* Collectives small and large, point-to-point, then destroy: every use was
 * inside a live registration, and nothing is left registered. */
static int traffic_rank(plait_comm_t comm, int rank, int n, void *arg, char *msg, size_t len)
{
    (void)arg;
    const size_t big = ((size_t)1 << 20) + 3;
    float *a = malloc(big * sizeof(float)), *b = malloc(big * sizeof(float));
    if (!a || !b) {
        free(a);
        free(b);
        snprintf(msg, len, "rank %d: out of memory", rank);
        return 1;
    }
    for (size_t i = 0; i < big; i++)
        a[i] = (float)(rank + 1);
    int failed = 0;
    const size_t counts[] = {1, 1000, big};
    for (int k = 0; k < 3 && !failed; k++) {
        plait_result_t r = plait_allreduce(a, b, counts[k], PLAIT_FLOAT32, PLAIT_SUM, comm, NULL);
        const float want = (float)n * (n + 1) / 2;
        if (r || b[0] != want || b[counts[k] - 1] != want) {
            snprintf(msg, len, "rank %d: allreduce of %zu: %s (%g, want %g)", rank, counts[k],
                     r ? plait_get_last_error(comm) : "wrong sum", b[0], want);
            failed = 1;
        }
    }
    /* a ring of sends: point-to-point connections made on first use */
    if (!failed) {
        plait_group_start();
        plait_send(a, 4096, PLAIT_FLOAT32, (rank + 1) % n, comm, NULL);
        plait_recv(b, 4096, PLAIT_FLOAT32, (rank + n - 1) % n, comm, NULL);
        if (plait_group_end() || b[0] != (float)((rank + n - 1) % n + 1)) {
            snprintf(msg, len, "rank %d: the ring of sends: %s", rank, plait_get_last_error(comm));
            failed = 1;
        }
    }
    free(a);
    free(b);
    plait_comm_destroy(comm);
    pthread_mutex_lock(&D.lock);
    int live = 0;
    for (int i = 0; i < D.nregs; i++)
        live += D.regs[i].live;
    if (!failed && D.bad)
        snprintf(msg, len, "rank %d: %d misuses of the registrations, the first: %s", rank, D.bad, D.bad_msg);
    else if (!failed && (D.nregs == 0 || D.checked == 0))
        snprintf(msg, len, "rank %d: %d registrations, %d buffers checked: the double was not used", rank, D.nregs,
                 D.checked);
    else if (!failed && live)
        snprintf(msg, len, "rank %d: %d registrations still live after destroy", rank, live);
    const int res = failed || D.bad || D.nregs == 0 || D.checked == 0 || live;
    pthread_mutex_unlock(&D.lock);
    return res;
}

Test(net_reg, every_buffer_registered_and_released, .timeout = 180)
{
    char msg[4096] = "";
    const int failed = mr_run_owned(MR_SOCKET, 3, traffic_rank, NULL, 150, msg, sizeof(msg));
    cr_assert_eq(failed, 0, "%d failed: %s", failed, msg);
}

/* reg_mr refuses: init (which connects the ring neighbours) fails on every
 * rank, and the rank that hit it says what could not be registered (its
 * peer may see it leave first); nothing hangs. */
static int refused_child(struct mr_child *c, void *arg)
{
    (void)arg;
    int *says = c->shared;
    D.fail_reg = 1;
    plait_comm_t comm = mr_child_init(c);
    if (comm) {
        snprintf(c->msg, c->msglen, "rank %d: init succeeded with reg_mr refusing", c->rank);
        plait_comm_destroy(comm);
        return 1;
    }
    says[c->rank] = strstr(c->msg, "registering") && strstr(c->msg, "reg_mr refused");
    return 0;
}

Test(net_reg, refused_registration_fails_init_naming_it, .timeout = 120)
{
    setenv("PLAIT_TRANSPORT", "socket", 1);
    char msg[2048] = "";
    struct mr_procs *p = mr_procs_start(2, refused_child, NULL, 2 * sizeof(int), 0, msg, sizeof(msg));
    cr_assert_not_null(p, "%s", msg);
    const int failed = mr_procs_join(p, 90, msg, sizeof(msg));
    const int *says = mr_procs_shared(p);
    const int named = says[0] || says[1];
    char m0[600], m1[600];
    snprintf(m0, sizeof(m0), "%s", mr_procs_msg(p, 0));
    snprintf(m1, sizeof(m1), "%s", mr_procs_msg(p, 1));
    mr_procs_free(p);
    unsetenv("PLAIT_TRANSPORT");
    cr_assert_eq(failed, 0, "%d ranks failed: %s", failed, msg);
    cr_assert(named, "no rank says what could not be registered: rank 0: %s; rank 1: %s", m0, m1);
}

/* Rank 0's provider refuses to register the receive slots of the comm its
 * peer dialed: rank 0's init fails at once naming the peer and what was
 * refused, not after the connection deadline (PLAIT_TIMEOUT). */
static int rx_refused_child(struct mr_child *c, void *arg)
{
    (void)arg;
    double *took = c->shared;
    __atomic_store_n(&D.fail_rx_reg, c->rank == 0, __ATOMIC_RELAXED);
    const double t0 = plait_now();
    plait_comm_t comm = mr_child_init(c);
    took[c->rank] = plait_now() - t0;
    if (comm) {
        snprintf(c->msg, c->msglen, "rank %d: init succeeded with reg_mr refusing", c->rank);
        plait_comm_destroy(comm);
        return 1;
    }
    if (c->rank == 0 && !(strstr(c->msg, "receive slots") && strstr(c->msg, "reg_mr of receive memory refused") &&
                          strstr(c->msg, "rank 1")))
        return 1;
    return 0;
}

Test(net_reg, refused_receive_registration_fails_at_once, .timeout = 120)
{
    setenv("PLAIT_TRANSPORT", "socket", 1);
    setenv("PLAIT_TIMEOUT", "60", 1);
    char msg[2048] = "";
    struct mr_procs *p = mr_procs_start(2, rx_refused_child, NULL, 2 * sizeof(double), 0, msg, sizeof(msg));
    cr_assert_not_null(p, "%s", msg);
    const int failed = mr_procs_join(p, 100, msg, sizeof(msg));
    const double *took = mr_procs_shared(p);
    const double t0 = took[0];
    char m0[600];
    snprintf(m0, sizeof(m0), "%s", mr_procs_msg(p, 0));
    mr_procs_free(p);
    unsetenv("PLAIT_TRANSPORT");
    unsetenv("PLAIT_TIMEOUT");
    cr_assert_eq(failed, 0, "%d ranks failed: %s (rank 0: %s)", failed, msg, m0);
    cr_assert_lt(t0, 30.0, "rank 0's init took %.1f s (PLAIT_TIMEOUT=60): %s", t0, m0);
}

/* The same refusal on a connection made on first use, stepped by progress:
 * 4 ranks (ring 0-1-2-3); rank 2 sends to its non-neighbour rank 0 while rank
 * 0 is busy exchanging with rank 1, so rank 0 takes rank 2's hello in a
 * handshake that progress steps, with its receive registrations refused from
 * then on. Rank 0's receive from rank 2 then fails at once naming rank 2 and
 * what was refused, rather than waiting out PLAIT_COLL_TIMEOUT for a comm it
 * had closed (that handshake's error went nowhere) or for rank 2 to leave. */
static int rx_refused_later_child(struct mr_child *c, void *arg)
{
    (void)arg;
    double *took = c->shared;
    plait_comm_t comm = mr_child_init(c);
    if (!comm)
        return 1;
    int rc = 0;
    int32_t s[16] = {0}, r[16];
    if (c->rank == 0 || c->rank == 1) {
        const int peer = 1 - c->rank;
        for (int i = 0; i < 30000 && !rc; i++) {
            if (i == 1)
                __atomic_store_n(&D.fail_rx_reg, c->rank == 0, __ATOMIC_RELAXED);
            plait_group_start();
            plait_send(s, 16, PLAIT_INT32, peer, comm, NULL);
            plait_recv(r, 16, PLAIT_INT32, peer, comm, NULL);
            if (plait_group_end() != PLAIT_SUCCESS) {
                snprintf(c->msg, c->msglen, "rank %d: exchange %d failed: %s", c->rank, i, plait_last_error_get());
                rc = 1;
            }
        }
    }
    if (c->rank == 2) {
        plait_nap_ns(100 * 1000 * 1000ull);
        (void)plait_send(s, 16, PLAIT_INT32, 0, comm, NULL);
        /* alive a while: rank 0's error must not wait for this rank to go */
        plait_nap_ns(6ull * 1000 * 1000 * 1000);
    }
    if (c->rank == 0 && !rc) {
        const double t0 = plait_now();
        plait_result_t st = plait_recv(r, 16, PLAIT_INT32, 2, comm, NULL);
        took[0] = plait_now() - t0;
        const char *e = plait_last_error_get();
        snprintf(c->msg, c->msglen, "rank 0: %s after %.1f s: %s", plait_get_error_string(st), took[0], e);
        rc = !(st != PLAIT_SUCCESS && strstr(e, "receive slots") && strstr(e, "rank 2"));
    }
    plait_comm_destroy(comm);
    return rc;
}

Test(net_reg, refused_receive_registration_on_first_use_fails_at_once, .timeout = 150)
{
    setenv("PLAIT_TRANSPORT", "socket", 1);
    setenv("PLAIT_COLL_TIMEOUT", "60", 1);
    char msg[2048] = "";
    struct mr_procs *p = mr_procs_start(4, rx_refused_later_child, NULL, 4 * sizeof(double), 0, msg, sizeof(msg));
    cr_assert_not_null(p, "%s", msg);
    const int failed = mr_procs_join(p, 130, msg, sizeof(msg));
    const double t0 = ((const double *)mr_procs_shared(p))[0];
    char m0[700];
    snprintf(m0, sizeof(m0), "%s", mr_procs_msg(p, 0));
    mr_procs_free(p);
    unsetenv("PLAIT_TRANSPORT");
    cr_assert_eq(failed, 0, "%d ranks failed: %s (%s)", failed, msg, m0);
    cr_assert_lt(t0, 4.5, "rank 0's receive took %.1f s (rank 2 stays 6 s, PLAIT_COLL_TIMEOUT=60): %s", t0, m0);
}
