/* The proxy thread (core/cuda/proxy.c) against the CUDA test double (suite
 * cuda_proxy): a fake "kernel side" (a test thread per rank) fills and drains
 * the pinned device FIFOs exactly as the kernel does (transports/transport.h's
 * protocol: data and size, then a release store of tail; head acquired before
 * a slot is reused), while the proxies move the slots over a real 2-rank
 * communicator over the net transport (PLAIT_TRANSPORT=socket between threads). Runs on the
 * double, not a GPU: device memory is host memory, so the test reads the
 * device addresses the proxy gives the kernel directly. */
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/comm.h"
#include "core/cuda/cu.h"
#include "core/cuda/cuda.h"
#include "core/cuda/kernel.h"
#include "tests/cuda_double.h"
#include "tests/harness.h"
#include "transports/net.h"

#define NR 2
#define SLOTS_PER_LAUNCH 37 /* more than the FIFO depth: credit must flow back */

static const struct plait_cu *setup_double(void)
{
    setenv("PLAIT_CUDA_LIBRARY", PLAIT_CUDA_DOUBLE_PATH, 1);
    setenv("PLAIT_TRANSPORT", "socket", 1);
    setenv("PLAIT_NSLOTS", "4", 1);
    setenv("PLAIT_BUFFSIZE", "4096", 1);
    setenv("PLAIT_NCHANNELS", "2", 1);
    printf("cuda_proxy: on the CUDA test double (not a GPU)\n");
    const struct plait_cu *cu = plait_cu_get();
    cr_assert(cu && cu->is_double, "the CUDA test double did not load from %s", PLAIT_CUDA_DOUBLE_PATH);
    return cu;
}

static void set_context(const struct plait_cu *cu)
{
    void *ctx = NULL;
    cr_assert_eq(cu->DevicePrimaryCtxRetain(&ctx, 0), 0);
    cr_assert_eq(cu->CtxSetCurrent(ctx), 0);
}

/* One rank: its communicator, its proxied connections (kernel-side images),
 * and the host-mapped words a kernel would get. */
struct rank {
    struct plait_comm *comm;
    int nconns;
    struct plait_dev_conn dc[8];
    uint64_t *status;     /* pinned: [0] completed launches, [1] error */
    uint32_t *abort_word; /* pinned */
    int launches;
    int fail;
    char msg[256];
};

static void proxy_all(const struct plait_cu *cu, struct rank *rk)
{
    struct plait_comm *c = rk->comm;
    /* The backend may already have proxied the connections at init (a
     * context was current): the test drives its own proxy instead. */
    plait_cuda_proxy_stop(c);
    void *p = NULL;
    cr_assert_eq(cu->MemHostAlloc(&p, 128, PLAIT_CU_MEMHOSTALLOC_PORTABLE | PLAIT_CU_MEMHOSTALLOC_DEVICEMAP), 0);
    memset(p, 0, 128);
    rk->status = p;
    rk->abort_word = (uint32_t *)((char *)p + 64);
    for (int i = 0; i < c->nranks * c->ncls; i++) {
        struct plait_conn *hc = c->conns[i];
        if (!hc || hc->peer == c->rank)
            continue;
        cr_assert_eq(hc->tp, &plait_transport_net, "connection %d is not a net one", i);
        cr_assert_lt(rk->nconns, 8);
        cr_assert_eq(plait_cuda_proxy_conn(c, hc, &rk->dc[rk->nconns]), PLAIT_SUCCESS, "%s", plait_get_last_error(NULL));
        struct plait_dev_conn *dc = &rk->dc[rk->nconns];
        cr_assert_eq(dc->scope, PLAIT_SCOPE_SYS);
        cr_assert_eq(dc->nslots, hc->nslots);
        cr_assert_eq(dc->slot_bytes, hc->slot_bytes);
        cr_assert_null(dc->tx.ll);
        rk->nconns++;
    }
    cr_assert_gt(rk->nconns, 0);
    plait_cuda_proxy_watch(c, rk->status, rk->abort_word, 0);
    cr_assert_eq(plait_cuda_proxy_start(c), PLAIT_SUCCESS, "%s", plait_get_last_error(NULL));
}

/* Pattern byte i of slot `seq` sent by `from` on connection `k`. */
static uint8_t pat(int from, int k, uint64_t seq, size_t i)
{
    return (uint8_t)(from * 131 + k * 17 + seq * 7 + i * 3);
}

/* Slot sizes vary (some partial, never 0). */
static uint32_t slot_size(const struct plait_dev_conn *dc, uint64_t seq)
{
    return (uint32_t)(1 + (seq * 389) % dc->slot_bytes);
}

/* A fake kernel launch: on every connection, send SLOTS_PER_LAUNCH slots and
 * receive as many, interleaved, as one CTA per connection would; then bump
 * status[0] with a release store (the last CTA's completion). */
static void *fake_kernel(void *arg)
{
    struct rank *rk = arg;
    const int me = rk->comm->rank;
    const double deadline = mr_now() + 30;
    int left = rk->nconns * 2;
    uint64_t sent_goal[8], recv_goal[8];
    for (int k = 0; k < rk->nconns; k++) {
        sent_goal[k] = rk->dc[k].tx_posted + SLOTS_PER_LAUNCH;
        recv_goal[k] = rk->dc[k].rx_consumed + SLOTS_PER_LAUNCH;
    }
    while (left > 0) {
        if (__atomic_load_n(rk->abort_word, __ATOMIC_ACQUIRE)) {
            snprintf(rk->msg, sizeof(rk->msg), "rank %d: aborted", me);
            rk->fail = 2;
            break;
        }
        if (mr_now() > deadline) {
            snprintf(rk->msg, sizeof(rk->msg), "rank %d: fake kernel timed out", me);
            rk->fail = 1;
            break;
        }
        left = 0;
        for (int k = 0; k < rk->nconns; k++) {
            struct plait_dev_conn *dc = &rk->dc[k];
            if (dc->tx_posted < sent_goal[k]) {
                left++;
                if (dc->tx_posted - __atomic_load_n(dc->tx.head, __ATOMIC_ACQUIRE) < dc->nslots) {
                    const uint64_t s = dc->tx_posted;
                    char *slot = dc->tx.slots + (s % dc->nslots) * dc->slot_bytes;
                    const uint32_t n = slot_size(dc, s);
                    for (uint32_t i = 0; i < n; i++)
                        slot[i] = (char)pat(me, k, s, i);
                    dc->tx.sizes[s % dc->nslots] = n;
                    dc->tx_posted++;
                    __atomic_store_n(dc->tx.tail, dc->tx_posted, __ATOMIC_RELEASE);
                }
            }
            if (dc->rx_consumed < recv_goal[k]) {
                left++;
                if (__atomic_load_n(dc->rx.tail, __ATOMIC_ACQUIRE) > dc->rx_consumed) {
                    const uint64_t s = dc->rx_consumed;
                    const char *slot = dc->rx.slots + (s % dc->nslots) * dc->slot_bytes;
                    const uint32_t n = dc->rx.sizes[s % dc->nslots];
                    if (n != slot_size(dc, s) && !rk->fail) {
                        snprintf(rk->msg, sizeof(rk->msg), "rank %d conn %d slot %lu: %u bytes, expected %u", me, k,
                                 (unsigned long)s, n, slot_size(dc, s));
                        rk->fail = 1;
                    }
                    /* The peer's connection k joins the same (class, pair). */
                    for (uint32_t i = 0; i < n && !rk->fail; i++)
                        if ((uint8_t)slot[i] != pat(1 - me, k, s, i)) {
                            snprintf(rk->msg, sizeof(rk->msg), "rank %d conn %d slot %lu byte %u: 0x%02x, expected "
                                     "0x%02x", me, k, (unsigned long)s, i, (uint8_t)slot[i], pat(1 - me, k, s, i));
                            rk->fail = 1;
                        }
                    dc->rx_consumed++;
                    __atomic_store_n(dc->rx.head, dc->rx_consumed, __ATOMIC_RELEASE);
                }
            }
        }
        sched_yield();
    }
    rk->launches++;
    __atomic_store_n(&rk->status[0], (uint64_t)rk->launches, __ATOMIC_RELEASE);
    return NULL;
}

static void init_ranks(const struct plait_cu *cu, struct rank *rk)
{
    plait_comm_t comms[NR];
    cr_assert_eq(plait_comm_init_all(comms, NR, NULL), PLAIT_SUCCESS, "%s", plait_get_last_error(NULL));
    set_context(cu);
    memset(rk, 0, sizeof(*rk) * NR);
    for (int r = 0; r < NR; r++) {
        rk[r].comm = comms[r];
        proxy_all(cu, &rk[r]);
    }
    cr_assert_eq(rk[0].nconns, rk[1].nconns);
}

static void run_launch(struct rank *rk)
{
    pthread_t th[NR];
    for (int r = 0; r < NR; r++) {
        plait_cuda_proxy_kick(rk[r].comm, (uint64_t)rk[r].launches + 1);
        pthread_create(&th[r], NULL, fake_kernel, &rk[r]);
    }
    for (int r = 0; r < NR; r++)
        pthread_join(th[r], NULL);
}

static void wait_idle(struct rank *rk)
{
    const double deadline = mr_now() + 10;
    while (plait_cuda_proxy_busy(rk->comm)) {
        cr_assert_lt(mr_now(), deadline, "rank %d: the proxy stays busy after its launches completed", rk->comm->rank);
        sched_yield();
    }
}

struct host_arg {
    struct plait_comm *comm;
    plait_result_t res;
    int bad;
};

static void *host_allreduce(void *p)
{
    struct host_arg *a = p;
    int32_t buf[5000];
    for (int i = 0; i < 5000; i++)
        buf[i] = i + a->comm->rank;
    a->res = plait_allreduce(buf, buf, 5000, PLAIT_INT32, PLAIT_SUM, a->comm, NULL);
    for (int i = 0; i < 5000 && !a->res; i++)
        if (buf[i] != 2 * i + 1)
            a->bad++;
    return NULL;
}

/* Slots of every size move both ways, in order and intact, over several
 * launches (the proxy sleeps between them and wakes at each kick); afterwards
 * the CPU executor uses the same socket connections again. */
Test(cuda_proxy, double_moves_slots, .timeout = 120)
{
    const struct plait_cu *cu = setup_double();
    struct rank rk[NR];
    init_ranks(cu, rk);
    for (int l = 0; l < 3; l++) {
        run_launch(rk);
        for (int r = 0; r < NR; r++)
            cr_assert_eq(rk[r].fail, 0, "launch %d: %s", l, rk[r].msg);
        for (int r = 0; r < NR; r++)
            wait_idle(&rk[r]);
        usleep(20000); /* long enough for the proxies to go to sleep */
    }
    for (int r = 0; r < NR; r++)
        for (int k = 0; k < rk[r].nconns; k++)
            cr_assert_eq(rk[r].dc[k].tx_posted, 3 * SLOTS_PER_LAUNCH);
    /* The host path after device traffic: the connections' counters are
     * consistent on both sides. */
    pthread_t th[NR];
    struct host_arg ha[NR];
    for (int r = 0; r < NR; r++) {
        ha[r] = (struct host_arg){.comm = rk[r].comm};
        pthread_create(&th[r], NULL, host_allreduce, &ha[r]);
    }
    for (int r = 0; r < NR; r++)
        pthread_join(th[r], NULL);
    for (int r = 0; r < NR; r++) {
        cr_assert_eq(ha[r].res, PLAIT_SUCCESS, "rank %d: host allreduce after proxied traffic: %s", r,
                     plait_get_last_error(NULL));
        cr_assert_eq(ha[r].bad, 0, "rank %d: %d wrong elements", r, ha[r].bad);
    }
    for (int r = 0; r < NR; r++) {
        plait_cuda_proxy_stop(rk[r].comm);
        cr_assert_null(rk[r].comm->cuda_proxy);
        plait_comm_destroy(rk[r].comm);
        cu->MemFreeHost(rk[r].status);
    }
}

/* A peer that goes away while this rank's launch waits for it: the proxy
 * raises the kernel's abort word and records an asynchronous error naming
 * the peer. */
Test(cuda_proxy, double_dead_peer_aborts_kernel, .timeout = 120)
{
    const struct plait_cu *cu = setup_double();
    struct rank rk[NR];
    init_ranks(cu, rk);
    /* Rank 1 leaves: its proxy stops and its sockets close. */
    plait_cuda_proxy_stop(rk[1].comm);
    plait_comm_destroy(rk[1].comm);
    pthread_t th;
    plait_cuda_proxy_kick(rk[0].comm, 1);
    const double t0 = mr_now();
    pthread_create(&th, NULL, fake_kernel, &rk[0]);
    pthread_join(th, NULL);
    cr_assert_eq(rk[0].fail, 2, "the fake kernel was not aborted: %s", rk[0].msg);
    cr_assert_lt(mr_now() - t0, 15.0);
    cr_assert_eq(__atomic_load_n(rk[0].abort_word, __ATOMIC_ACQUIRE), 1u);
    plait_result_t ae = PLAIT_SUCCESS;
    plait_comm_get_async_error(rk[0].comm, &ae);
    cr_assert_eq(ae, PLAIT_ERR_REMOTE, "async error %d", (int)ae);
    char msg[1024];
    plait_comm_async_msg(rk[0].comm, msg, sizeof(msg));
    printf("cuda_proxy: rank 0's asynchronous error: %s\n", msg);
    cr_assert(strstr(msg, "rank 1") != NULL, "the error does not name rank 1: %s", msg);
    wait_idle(&rk[0]);
    plait_cuda_proxy_stop(rk[0].comm);
    plait_comm_destroy(rk[0].comm);
    cu->MemFreeHost(rk[0].status);
    cu->MemFreeHost(rk[1].status);
}

/* Stopping a proxy that is polling (a launch that never completes: a graph
 * replayed by the user, PLAIT_PROXY_FOREVER) joins it promptly. */
Test(cuda_proxy, double_stop_while_polling, .timeout = 60)
{
    const struct plait_cu *cu = setup_double();
    struct rank rk[NR];
    init_ranks(cu, rk);
    for (int r = 0; r < NR; r++)
        plait_cuda_proxy_kick(rk[r].comm, PLAIT_PROXY_FOREVER);
    usleep(50000);
    for (int r = 0; r < NR; r++)
        cr_assert_eq(plait_cuda_proxy_busy(rk[r].comm), 1);
    const double t0 = mr_now();
    for (int r = 0; r < NR; r++) {
        plait_cuda_proxy_stop(rk[r].comm);
        cr_assert_eq(plait_cuda_proxy_busy(rk[r].comm), 0);
    }
    cr_assert_lt(mr_now() - t0, 2.0);
    for (int r = 0; r < NR; r++) {
        plait_comm_destroy(rk[r].comm);
        cu->MemFreeHost(rk[r].status);
    }
}

/* End to end: device all-reduces between two ranks whose connections are
 * sockets (PLAIT_TRANSPORT=socket), so every FIFO slot of the kernel (its
 * host emulation on the double) goes through the proxies; then host
 * all-reduces on the same connections. */
struct e2e_arg {
    const plait_unique_id_t *id;
    int rank;
    int fail;
    char msg[512];
};

static void *e2e_main(void *p)
{
    struct e2e_arg *a = p;
    const struct plait_cu *cu = plait_cu_get();
    plait_comm_t comm = NULL;
    plait_stream_t ps = NULL;
    void *stream = NULL, *ctx = NULL;
    plait_cudevptr buf = 0;
    const size_t count = 300000; /* 1.2 MB of int32: many slots per channel */
    int32_t *host = malloc(count * sizeof(int32_t));
    if (!host || cu->DevicePrimaryCtxRetain(&ctx, 0) || cu->CtxSetCurrent(ctx) ||
        plait_comm_init_rank(&comm, NR, *a->id, a->rank)) {
        snprintf(a->msg, sizeof(a->msg), "rank %d: setup: %s", a->rank, plait_get_last_error(NULL));
        a->fail = 1;
        free(host);
        return NULL;
    }
    if (!comm->cuda || !comm->cuda_proxy) {
        snprintf(a->msg, sizeof(a->msg), "rank %d: no device state (%p) or no proxy (%p)", a->rank, (void *)comm->cuda,
                 (void *)comm->cuda_proxy);
        a->fail = 1;
        goto out;
    }
    if (cu->MemAlloc(&buf, count * sizeof(int32_t)) ||
        cu->StreamCreateWithPriority(&stream, PLAIT_CU_STREAM_NON_BLOCKING, 0) || plait_stream_from_cuda(stream, &ps)) {
        snprintf(a->msg, sizeof(a->msg), "rank %d: allocation failed", a->rank);
        a->fail = 1;
        goto out;
    }
    for (int iter = 0; iter < 3 && !a->fail; iter++) {
        const size_t n = iter == 1 ? 1000 : count;
        for (size_t i = 0; i < n; i++)
            host[i] = (int32_t)(i * 3 + (size_t)a->rank * 7 + (size_t)iter);
        plait_result_t r = PLAIT_SUCCESS;
        if (cu->MemcpyHtoD(buf, host, n * sizeof(int32_t)) ||
            (r = plait_allreduce((void *)(uintptr_t)buf, (void *)(uintptr_t)buf, n, PLAIT_INT32, PLAIT_SUM, comm, ps)) ||
            cu->StreamSynchronize(stream) || cu->MemcpyDtoH(host, buf, n * sizeof(int32_t))) {
            snprintf(a->msg, sizeof(a->msg), "rank %d iter %d: device allreduce failed (%d): %s", a->rank, iter, (int)r,
                     plait_get_last_error(NULL));
            a->fail = 1;
            break;
        }
        for (size_t i = 0; i < n; i++)
            if (host[i] != (int32_t)(2 * (i * 3 + (size_t)iter) + 7)) {
                snprintf(a->msg, sizeof(a->msg), "rank %d iter %d: element %zu is %d", a->rank, iter, i, host[i]);
                a->fail = 1;
                break;
            }
    }
    /* The CPU path on the same socket connections afterwards. Before host
     * ops use them, plait_cuda_proxy_busy() must have returned 0 on the
     * issuing thread (it hands back slots the proxy fetched for the kernel
     * that belong to the host op). The executor is to call it itself
     * (core/cuda/cuda.h); calling it here as well is harmless. */
    const double deadline = mr_now() + 30;
    while (plait_cuda_proxy_busy(comm) && mr_now() < deadline)
        sched_yield();
    for (size_t i = 0; i < 5000 && !a->fail; i++)
        host[i] = (int32_t)(i + (size_t)a->rank);
    if (!a->fail && plait_allreduce(host, host, 5000, PLAIT_INT32, PLAIT_SUM, comm, NULL)) {
        snprintf(a->msg, sizeof(a->msg), "rank %d: host allreduce after device ones: %s", a->rank,
                 plait_get_last_error(NULL));
        a->fail = 1;
    }
    for (size_t i = 0; i < 5000 && !a->fail; i++)
        if (host[i] != (int32_t)(2 * i + 1)) {
            snprintf(a->msg, sizeof(a->msg), "rank %d: host element %zu is %d", a->rank, i, host[i]);
            a->fail = 1;
        }
out:
    if (ps)
        plait_stream_destroy(ps);
    if (stream)
        cu->StreamDestroy(stream);
    if (buf)
        cu->MemFree(buf);
    plait_comm_destroy(comm);
    free(host);
    return NULL;
}

Test(cuda_proxy, double_device_allreduce_over_sockets, .timeout = 120)
{
    setup_double();
    plait_unique_id_t id;
    cr_assert_eq(plait_get_unique_id(&id), PLAIT_SUCCESS, "%s", plait_get_last_error(NULL));
    struct e2e_arg args[NR];
    pthread_t th[NR];
    for (int r = 0; r < NR; r++) {
        args[r] = (struct e2e_arg){.id = &id, .rank = r};
        pthread_create(&th[r], NULL, e2e_main, &args[r]);
    }
    for (int r = 0; r < NR; r++)
        pthread_join(th[r], NULL);
    for (int r = 0; r < NR; r++)
        cr_expect_eq(args[r].fail, 0, "%s", args[r].msg);
}
