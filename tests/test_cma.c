/* Single copy (docs/performance.md, "Single-copy (CMA)"): a large step's sender
 * publishes a descriptor of its bytes and the receiver reads them itself, with
 * process_vm_readv between processes and memcpy between threads.
 *
 *   - large collectives and point-to-point (odd counts, in and out of place, 2
 *     and 3 ranks, processes and threads) give, bit for bit, what the FIFO path
 *     gives (PLAIT_CMA=0), and what the reference says;
 *   - the descriptor path is really taken (the connections' descriptor
 *     counters, read through the private headers), and not with PLAIT_CMA=0;
 *   - a probe that fails for real (one rank installs a seccomp filter that
 *     denies process_vm_readv with EPERM before init) turns single copy off on
 *     every rank, which still gives right results, and says why at INFO; with
 *     PLAIT_CMA=1 init fails on every rank, naming the reason;
 *   - writes over published bytes wait for the reader (algorithms whose last
 *     COPY overwrites what they sent: Bruck, recursive doubling, PAT);
 *   - a peer that dies with a descriptor published is reported, not waited for;
 *   - a sender whose operation fails withdraws its descriptors: the receiver
 *     fails instead of reading bytes the user has since changed;
 *   - a descriptor with a bad address or length is an error naming the peer. */
#define _GNU_SOURCE
#include <criterion/criterion.h>

#include <errno.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tests/coll_check.h"
#include "core/comm.h" /* the connections' descriptor counters */
#include "tests/harness.h"

/* ---------------------------------------------------------------- helpers */

static void deadlines(void)
{
    setenv("PLAIT_TIMEOUT", "30", 1);
    setenv("PLAIT_COLL_TIMEOUT", "30", 1);
    unsetenv("PLAIT_CMA");
    unsetenv("PLAIT_CMA_MIN_BYTES");
    unsetenv("PLAIT_DEBUG");
    unsetenv("PLAIT_DEBUG_FILE");
    unsetenv("PLAIT_ALGO");
}

TestSuite(cma, .init = deadlines);

/* Descriptors this rank has sent and read, on connections of one transport
 * (NULL: every transport). */
static uint64_t descs(plait_comm_t comm, const struct plait_transport *tp)
{
    uint64_t n = 0;
    for (int i = 0; i < comm->nranks * comm->ncls; i++) {
        const struct plait_conn *c = comm->conns[i];
        if (c && (!tp || c->tp == tp))
            n += c->sc_tx_descs + c->sc_rx_descs;
    }
    return n;
}

static uint64_t fnv(const void *p, size_t n)
{
    const unsigned char *b = p;
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

/* ---------------------------------------------------------------- the same bits as the FIFO path */

enum kind { K_ALLREDUCE, K_REDUCE, K_REDUCESCATTER, K_BROADCAST, K_ALLGATHER, K_ALLTOALL, K_SENDRECV };
static const char *const kind_names[] = {"allreduce", "reduce",   "reducescatter", "broadcast",
                                         "allgather", "alltoall", "sendrecv"};

struct case_def {
    int kind, dtype, op, inplace;
};

/* Odd counts: pieces and steps end off any power of two. */
#define COUNT 100003
static const struct case_def cases[] = {
    {K_ALLREDUCE, PLAIT_FLOAT32, PLAIT_SUM, 0},    {K_ALLREDUCE, PLAIT_FLOAT32, PLAIT_SUM, 1},
    {K_ALLREDUCE, PLAIT_BFLOAT16, PLAIT_AVG, 0},   {K_ALLREDUCE, PLAIT_INT8, PLAIT_MAX, 1},
    {K_REDUCE, PLAIT_INT32, PLAIT_SUM, 0},         {K_REDUCE, PLAIT_INT32, PLAIT_SUM, 1},
    {K_REDUCESCATTER, PLAIT_FLOAT32, PLAIT_SUM, 0}, {K_REDUCESCATTER, PLAIT_UINT64, PLAIT_PROD, 1},
    {K_BROADCAST, PLAIT_UINT8, 0, 0},              {K_BROADCAST, PLAIT_UINT8, 0, 1},
    {K_ALLGATHER, PLAIT_FLOAT32, 0, 0},            {K_ALLGATHER, PLAIT_FLOAT16, 0, 1},
    {K_ALLTOALL, PLAIT_FLOAT32, 0, 0},             {K_SENDRECV, PLAIT_FLOAT32, 0, 0},
};
#define NCASES ((int)(sizeof(cases) / sizeof(cases[0])))
#define MAXR 4

/* Shared with forked ranks (mapped before the fork): per run (0: PLAIT_CMA=0,
 * 1: on), case and rank, the hash of the output and the descriptors moved. */
struct board {
    uint64_t hash[2][NCASES][MAXR];
    uint64_t descs[2][NCASES][MAXR];
    int run;
};
static struct board *board;

static int is_reduction(int k)
{
    return k == K_ALLREDUCE || k == K_REDUCE || k == K_REDUCESCATTER;
}

#define CHECK(call)                                                                                                \
    do {                                                                                                           \
        plait_result_t r_ = (call);                                                                                \
        if (r_ != PLAIT_SUCCESS) {                                                                                 \
            snprintf(msg, len, "%s %s inplace %d: %s: %s: %s", kind_names[cd->kind], cc_type_name(cd->dtype),      \
                     cd->inplace, #call, plait_get_error_string(r_), plait_get_last_error(comm));                  \
            return 1;                                                                                              \
        }                                                                                                          \
    } while (0)

/* Runs one case; fills the hash of what this rank must check. */
static int run_case(plait_comm_t comm, int rank, int n, const struct case_def *cd, int root, char *sbuf, char *rbuf,
                    uint64_t *hash_out, char *msg, size_t len)
{
    const size_t count = COUNT, es = cc_size(cd->dtype), bytes = count * es;
    struct cc_expect e;
    size_t bad = 0;
    char one[256] = "";
    if (is_reduction(cd->kind))
        cc_expect_init(&e, cd->dtype, cd->op, n);
    memset(rbuf, 0xcd, bytes * (size_t)(n + 1));
    const char *out = rbuf;
    size_t out_bytes = bytes;
    switch (cd->kind) {
    case K_ALLREDUCE:
    case K_REDUCE: {
        cc_fill(sbuf, count, cd->dtype, cd->op, rank, 0);
        char *o = cd->inplace ? sbuf : rbuf;
        if (cd->kind == K_ALLREDUCE)
            CHECK(plait_allreduce(sbuf, o, count, cd->dtype, cd->op, comm, NULL));
        else
            CHECK(plait_reduce(sbuf, o, count, cd->dtype, cd->op, root, comm, NULL));
        out = o;
        if (cd->kind == K_ALLREDUCE || rank == root)
            bad = cc_check(&e, o, count, 0, one, sizeof(one));
        else
            out_bytes = 0;
        break;
    }
    case K_REDUCESCATTER: {
        cc_fill(sbuf, count * (size_t)n, cd->dtype, cd->op, rank, 0);
        char *o = cd->inplace ? sbuf + (size_t)rank * bytes : rbuf;
        CHECK(plait_reducescatter(sbuf, o, count, cd->dtype, cd->op, comm, NULL));
        out = o;
        bad = cc_check(&e, o, count, (size_t)rank * count, one, sizeof(one));
        break;
    }
    case K_BROADCAST: {
        char *in = cd->inplace ? rbuf : sbuf;
        if (rank == root)
            cc_fill_bytes(in, bytes, root, 0);
        CHECK(plait_broadcast(in, rbuf, count, cd->dtype, root, comm, NULL));
        bad = cc_check_bytes(rbuf, bytes, root, 0, one, sizeof(one));
        break;
    }
    case K_ALLGATHER: {
        char *in = cd->inplace ? rbuf + (size_t)rank * bytes : sbuf;
        cc_fill_bytes(in, bytes, rank, 0);
        CHECK(plait_allgather(in, rbuf, count, cd->dtype, comm, NULL));
        for (int q = 0; q < n; q++)
            bad += cc_check_bytes(rbuf + (size_t)q * bytes, bytes, q, 0, one, sizeof(one));
        out_bytes = bytes * (size_t)n;
        break;
    }
    case K_ALLTOALL:
        cc_fill_bytes(sbuf, bytes * (size_t)n, rank, 0);
        CHECK(plait_alltoall(sbuf, rbuf, count, cd->dtype, comm, NULL));
        for (int q = 0; q < n; q++)
            bad += cc_check_bytes(rbuf + (size_t)q * bytes, bytes, q, (size_t)rank * bytes, one, sizeof(one));
        out_bytes = bytes * (size_t)n;
        break;
    case K_SENDRECV: {
        /* a ring exchange and a message to self, in one group */
        const int next = (rank + 1) % n, prev = (rank + n - 1) % n;
        cc_fill_bytes(sbuf, bytes, rank, 0);
        CHECK(plait_group_start());
        CHECK(plait_send(sbuf, count, cd->dtype, next, comm, NULL));
        CHECK(plait_recv(rbuf, count, cd->dtype, prev, comm, NULL));
        CHECK(plait_send(sbuf, count, cd->dtype, rank, comm, NULL));
        CHECK(plait_recv(rbuf + bytes, count, cd->dtype, rank, comm, NULL));
        CHECK(plait_group_end());
        bad = cc_check_bytes(rbuf, bytes, prev, 0, one, sizeof(one)) +
              cc_check_bytes(rbuf + bytes, bytes, rank, 0, one, sizeof(one));
        out_bytes = 2 * bytes;
        break;
    }
    }
    if (bad) {
        snprintf(msg, len, "%s %s inplace %d root %d: %zu wrong: %s", kind_names[cd->kind], cc_type_name(cd->dtype),
                 cd->inplace, root, bad, one);
        return 1;
    }
    *hash_out = fnv(out, out_bytes);
    return 0;
}

static int matrix_rank(plait_comm_t comm, int rank, int n, void *arg, char *msg, size_t len)
{
    (void)arg;
    const size_t cap = (size_t)COUNT * 8 * (size_t)(n + 1) + 64;
    char *sbuf = malloc(cap), *rbuf = malloc(cap);
    if (!sbuf || !rbuf) {
        free(sbuf);
        free(rbuf);
        snprintf(msg, len, "out of memory");
        return 1;
    }
    const struct plait_transport *tp = n > 1 && plait_transports[comm->tp_of[(rank + 1) % n]] == &plait_transport_shm
                                           ? &plait_transport_shm
                                           : &plait_transport_inproc;
    int rc = 0;
    for (int i = 0; i < NCASES && !rc; i++) {
        const uint64_t before = descs(comm, tp);
        rc = run_case(comm, rank, n, &cases[i], (i + 1) % n, sbuf, rbuf, &board->hash[board->run][i][rank], msg, len);
        board->descs[board->run][i][rank] = descs(comm, tp) - before;
    }
    free(sbuf);
    free(rbuf);
    return rc;
}

/* Runs every case with PLAIT_CMA=0, then with single copy on, and compares. */
static void same_bits(enum mr_mode mode, int nranks, const char *algo)
{
    if (algo)
        setenv("PLAIT_ALGO", algo, 1);
    else
        unsetenv("PLAIT_ALGO");
    board = mmap(NULL, sizeof(*board), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    cr_assert_neq(board, MAP_FAILED);
    memset(board, 0, sizeof(*board));
    char msg[1024];
    /* Below every step of these sizes, so that every kind of step that may
     * publish a descriptor does. */
    setenv("PLAIT_CMA_MIN_BYTES", "4096", 1);
    for (int run = 0; run < 2; run++) {
        board->run = run;
        setenv("PLAIT_CMA", run ? "1" : "0", 1);
        int failed = mr_run(mode, nranks, matrix_rank, NULL, 60, msg, sizeof(msg));
        cr_assert_eq(failed, 0, "%s, %d ranks, PLAIT_CMA=%d: %d rank(s) failed: %s", mr_mode_name(mode), nranks, run,
                     failed, msg);
    }
    for (int i = 0; i < NCASES; i++) {
        uint64_t on = 0, off = 0;
        for (int r = 0; r < nranks; r++) {
            cr_expect_eq(board->hash[0][i][r], board->hash[1][i][r],
                         "%s %s inplace %d: rank %d's output differs between PLAIT_CMA=0 and single copy",
                         kind_names[cases[i].kind], cc_type_name(cases[i].dtype), cases[i].inplace, r);
            off += board->descs[0][i][r];
            on += board->descs[1][i][r];
        }
        cr_expect_eq(off, 0, "%s: %llu descriptors with PLAIT_CMA=0", kind_names[cases[i].kind],
                     (unsigned long long)off);
        cr_expect_gt(on, 0, "%s %s inplace %d: no descriptor crossed a %s connection: single copy was not used",
                     kind_names[cases[i].kind], cc_type_name(cases[i].dtype), cases[i].inplace,
                     mode == MR_THREADS ? "inproc" : "shm");
    }
    munmap(board, sizeof(*board));
}

Test(cma, same_bits_shm_2, .timeout = 120)
{
    same_bits(MR_SHM, 2, NULL);
}

Test(cma, same_bits_shm_3, .timeout = 120)
{
    same_bits(MR_SHM, 3, NULL);
}

Test(cma, same_bits_threads_2, .timeout = 120)
{
    same_bits(MR_THREADS, 2, NULL);
}

Test(cma, same_bits_threads_3, .timeout = 120)
{
    same_bits(MR_THREADS, 3, NULL);
}

/* Algorithms whose later steps write bytes that an earlier step of the same
 * task published (the final COPY of Bruck and recursive doubling, PAT's and
 * recursive halving's): the write must wait until the peer has read them. */
#define OVERWRITING "allreduce:recursive;allgather:bruck;reducescatter:pat;alltoall:bruck"

Test(cma, same_bits_overwriting_algorithms_shm_3, .timeout = 120)
{
    same_bits(MR_SHM, 3, OVERWRITING);
}

Test(cma, same_bits_overwriting_algorithms_threads_2, .timeout = 120)
{
    same_bits(MR_THREADS, 2, OVERWRITING);
}

/* The defaults (PLAIT_CMA_MIN_BYTES unset): a 1 KiB message never goes as a
 * descriptor; a 1 MiB one does between threads, not between processes under
 * PLAIT_CMA=auto (measured slower there), and does under PLAIT_CMA=1. */
struct default_arg {
    int want_large; /* whether the 1 MiB message must cross as a descriptor */
};

static int default_rank(plait_comm_t comm, int rank, int n, void *arg, char *msg, size_t len)
{
    const struct default_arg *a = arg;
    static const size_t sizes[2] = {1024, 1 << 20};
    const struct plait_transport *tp = plait_transports[comm->tp_of[(rank + 1) % n]] == &plait_transport_shm ? &plait_transport_shm
                                                                                  : &plait_transport_inproc;
    for (int i = 0; i < 2; i++) {
        const size_t bytes = sizes[i];
        char *s = malloc(bytes), *r = malloc(bytes);
        cc_fill_bytes(s, bytes, rank, 0);
        const uint64_t before = descs(comm, tp);
        plait_result_t res = plait_group_start();
        if (!res)
            res = plait_send(s, bytes, PLAIT_UINT8, (rank + 1) % n, comm, NULL);
        if (!res)
            res = plait_recv(r, bytes, PLAIT_UINT8, (rank + n - 1) % n, comm, NULL);
        plait_result_t end = plait_group_end();
        const uint64_t moved = descs(comm, tp) - before;
        char one[256] = "";
        const size_t bad = res || end ? 0 : cc_check_bytes(r, bytes, (rank + n - 1) % n, 0, one, sizeof(one));
        free(s);
        free(r);
        if (res || end) {
            snprintf(msg, len, "%zu bytes: %s", bytes, plait_get_last_error(comm));
            return 1;
        }
        if (bad) {
            snprintf(msg, len, "%zu bytes: %zu wrong: %s", bytes, bad, one);
            return 1;
        }
        if ((moved > 0) != (i == 1 && a->want_large)) {
            snprintf(msg, len, "%zu bytes moved %llu descriptors over %s with the default PLAIT_CMA_MIN_BYTES", bytes,
                     (unsigned long long)moved, tp->name);
            return 1;
        }
    }
    return 0;
}

static void defaults(enum mr_mode mode, const char *cma, int want_large)
{
    char msg[1024];
    struct default_arg a = {want_large};
    setenv("PLAIT_CMA", cma, 1);
    int failed = mr_run(mode, 2, default_rank, &a, 30, msg, sizeof(msg));
    cr_assert_eq(failed, 0, "%s, PLAIT_CMA=%s: %d rank(s) failed: %s", mr_mode_name(mode), cma, failed, msg);
}

Test(cma, defaults_shm_auto, .timeout = 60)
{
    defaults(MR_SHM, "auto", 0);
}

Test(cma, defaults_shm_required, .timeout = 60)
{
    defaults(MR_SHM, "1", 1);
}

Test(cma, defaults_threads_auto, .timeout = 60)
{
    defaults(MR_THREADS, "auto", 1);
}

/* ---------------------------------------------------------------- a probe that fails for real */

#if defined(__x86_64__)
#define SC_AUDIT_ARCH AUDIT_ARCH_X86_64
#elif defined(__aarch64__)
#define SC_AUDIT_ARCH AUDIT_ARCH_AARCH64
#endif

/* Denies process_vm_readv with EPERM in this process from now on, as a
 * container's seccomp profile may; returns 0 when it is in force. */
static int deny_process_vm_readv(char *msg, size_t len)
{
#ifdef SC_AUDIT_ARCH
    struct sock_filter f[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SC_AUDIT_ARCH, 1, 0),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_process_vm_readv, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (EPERM & SECCOMP_RET_DATA)),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    struct sock_fprog prog = {(unsigned short)(sizeof(f) / sizeof(f[0])), f};
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 || prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) != 0) {
        snprintf(msg, len, "cannot install the seccomp filter: %s", strerror(errno));
        return -1;
    }
    /* The filter must really bite: reading our own memory now fails. */
    uint64_t word = 42, got = 0;
    struct iovec l = {&got, sizeof(got)}, r = {&word, sizeof(word)};
    if (process_vm_readv(getpid(), &l, 1, &r, 1, 0) != -1 || errno != EPERM) {
        snprintf(msg, len, "process_vm_readv still works under the seccomp filter");
        return -1;
    }
    return 0;
#else
    snprintf(msg, len, "no seccomp architecture constant for this machine");
    return -1;
#endif
}

#define DENIED_RANK 1
#define FB_NRANKS 3

struct fb_report {
    int init_result;
    int checked; /* 1 once the rank ran its collectives */
    char err[512];
    char log[1024];
};

/* Each rank: the denied one installs the filter, all init (PLAIT_CMA from the
 * test), and when init works run large collectives over what must be the FIFO
 * path. */
static int fallback_child(struct mr_child *c, void *arg)
{
    const char *cma = arg;
    struct fb_report *rep = (struct fb_report *)c->shared + c->rank;
    char logpath[128];
    snprintf(logpath, sizeof(logpath), "/tmp/plait-test-cma-%d.log", (int)getpid());
    setenv("PLAIT_CMA", cma, 1);
    setenv("PLAIT_CMA_MIN_BYTES", "4096", 1);
    setenv("PLAIT_DEBUG", "INFO", 1);
    setenv("PLAIT_DEBUG_SUBSYS", "TRANSPORT", 1);
    setenv("PLAIT_DEBUG_FILE", logpath, 1);
    if (c->rank == DENIED_RANK && deny_process_vm_readv(c->msg, c->msglen))
        return 1;
    plait_comm_t comm = NULL;
    plait_result_t res = plait_comm_init_rank(&comm, c->nranks, c->id, c->rank);
    rep->init_result = (int)res;
    snprintf(rep->err, sizeof(rep->err), "%s", res ? plait_get_last_error(NULL) : "");
    /* The INFO line that says whether single copy is on, and why not. */
    FILE *f = fopen(logpath, "r");
    if (f) {
        char line[1024];
        while (fgets(line, sizeof(line), f))
            if (strstr(line, "single copy"))
                snprintf(rep->log, sizeof(rep->log), "%s", line);
        fclose(f);
        unlink(logpath);
    }
    if (res)
        return 0; /* the parent judges */
    const int n = c->nranks, rank = c->rank;
    const size_t count = COUNT;
    float *s = malloc(count * sizeof(float) * (size_t)n), *r = malloc(count * sizeof(float) * (size_t)n);
    int rc = 0;
    struct cc_expect e;
    cc_expect_init(&e, PLAIT_FLOAT32, PLAIT_SUM, n);
    cc_fill(s, count, PLAIT_FLOAT32, PLAIT_SUM, rank, 0);
    if ((res = plait_allreduce(s, r, count, PLAIT_FLOAT32, PLAIT_SUM, comm, NULL)) ||
        cc_check(&e, r, count, 0, c->msg, c->msglen)) {
        if (res)
            snprintf(c->msg, c->msglen, "allreduce: %s", plait_get_last_error(comm));
        rc = 1;
    }
    cc_fill_bytes(s, count * sizeof(float), rank, 0);
    if (!rc && (res = plait_allgather(s, r, count, PLAIT_FLOAT32, comm, NULL))) {
        snprintf(c->msg, c->msglen, "allgather: %s", plait_get_last_error(comm));
        rc = 1;
    }
    for (int q = 0; !rc && q < n; q++)
        if (cc_check_bytes((char *)r + (size_t)q * count * sizeof(float), count * sizeof(float), q, 0, c->msg,
                           c->msglen))
            rc = 1;
    if (!rc && descs(comm, &plait_transport_shm) != 0) {
        snprintf(c->msg, c->msglen, "%llu descriptors crossed shm connections although the probe failed",
                 (unsigned long long)descs(comm, &plait_transport_shm));
        rc = 1;
    }
    rep->checked = !rc;
    free(s);
    free(r);
    plait_comm_destroy(comm);
    return rc;
}

static void run_fallback(const char *cma, struct fb_report *out)
{
    char msg[1024];
    struct mr_procs *p = mr_procs_start(FB_NRANKS, fallback_child, (void *)cma,
                                        FB_NRANKS * sizeof(struct fb_report), 0, msg, sizeof(msg));
    cr_assert_not_null(p, "%s", msg);
    int failed = mr_procs_join(p, 60, msg, sizeof(msg));
    memcpy(out, mr_procs_shared(p), FB_NRANKS * sizeof(struct fb_report));
    mr_procs_free(p);
    cr_assert_eq(failed, 0, "PLAIT_CMA=%s: %d rank(s) failed: %s", cma, failed, msg);
}

Test(cma, seccomp_denied_falls_back, .timeout = 90)
{
    struct fb_report rep[FB_NRANKS];
    run_fallback("auto", rep);
    for (int r = 0; r < FB_NRANKS; r++) {
        cr_expect_eq(rep[r].init_result, PLAIT_SUCCESS, "rank %d: init failed: %s", r, rep[r].err);
        cr_expect(rep[r].checked, "rank %d did not check its results", r);
        cr_expect(strstr(rep[r].log, "single copy (CMA) off") && strstr(rep[r].log, strerror(EPERM)),
                  "rank %d's INFO line does not say that single copy is off and why: \"%s\"", r, rep[r].log);
    }
}

Test(cma, seccomp_denied_required_fails_init, .timeout = 90)
{
    struct fb_report rep[FB_NRANKS];
    run_fallback("1", rep);
    char who[32];
    snprintf(who, sizeof(who), "rank %d ", DENIED_RANK);
    for (int r = 0; r < FB_NRANKS; r++) {
        cr_expect_neq(rep[r].init_result, PLAIT_SUCCESS, "rank %d: init succeeded with PLAIT_CMA=1", r);
        cr_expect(strstr(rep[r].err, "PLAIT_CMA=1") && strstr(rep[r].err, "process_vm_readv") &&
                      strstr(rep[r].err, who) && strstr(rep[r].err, strerror(EPERM)),
                  "rank %d's error does not name PLAIT_CMA=1, process_vm_readv, %sand the reason: \"%s\"", r, who,
                  rep[r].err);
    }
}

/* ---------------------------------------------------------------- a peer gone with a descriptor out */

struct gone_board {
    int go;        /* set by the parent once rank 1 is dead */
    int result;    /* rank 0's plait_recv */
    char err[512];
};

/* The descriptor at the head of comm's point-to-point FIFO from `peer`, if one
 * has arrived (read through the private headers). */
static int desc_arrived(plait_comm_t comm, int peer)
{
    struct plait_conn *c = comm->conns[peer * comm->ncls + comm->ncls - 1];
    if (__atomic_load_n(c->rx_tail, __ATOMIC_ACQUIRE) <= c->rx_consumed)
        return 0;
    return (c->rx_sizes[c->rx_consumed % c->nslots] & PLAIT_SLOT_DESC) != 0;
}

static int gone_child(struct mr_child *c, void *arg)
{
    (void)arg;
    struct gone_board *b = c->shared;
    setenv("PLAIT_CMA", "1", 1);
    /* The point-to-point connection is read and written below through the
     * private headers: made at init, not on first use. */
    setenv("PLAIT_RUNTIME_CONNECT", "0", 1);
    plait_comm_t comm = mr_child_init(c);
    if (!comm)
        return 1;
    const size_t count = 1 << 18;
    float *buf = calloc(count, sizeof(float));
    if (c->rank == 1) {
        /* Blocks until rank 0 has read it, which it never will: the parent
         * kills this rank with the descriptor published. */
        plait_group_start();
        plait_send(buf, count, PLAIT_FLOAT32, 0, comm, NULL);
        plait_group_end();
        snprintf(c->msg, c->msglen, "plait_send returned: %s", plait_get_last_error(comm));
        return 1;
    }
    const double deadline = mr_now() + 20;
    while (!desc_arrived(comm, 1) && mr_now() < deadline)
        usleep(1000);
    if (!desc_arrived(comm, 1)) {
        snprintf(c->msg, c->msglen, "no descriptor from rank 1 within 20 s");
        return 1;
    }
    mr_child_ready(c);
    while (!__atomic_load_n(&b->go, __ATOMIC_ACQUIRE) && mr_now() < deadline + 20)
        usleep(1000);
    b->result = (int)plait_recv(buf, count, PLAIT_FLOAT32, 1, comm, NULL);
    snprintf(b->err, sizeof(b->err), "%s", plait_get_last_error(comm));
    free(buf);
    plait_comm_destroy(comm);
    return 0;
}

Test(cma, peer_dead_before_its_descriptor_is_read, .timeout = 90)
{
    char msg[1024];
    struct mr_procs *p = mr_procs_start(2, gone_child, NULL, sizeof(struct gone_board), 0, msg, sizeof(msg));
    cr_assert_not_null(p, "%s", msg);
    struct gone_board *b = mr_procs_shared(p);
    if (mr_procs_wait_ready(p, 1, 30) != 0) {
        int failed = mr_procs_join(p, 5, msg, sizeof(msg));
        mr_procs_free(p);
        cr_assert_fail("rank 0 never saw rank 1's descriptor (%d failed: %s)", failed, msg);
    }
    const pid_t victim = mr_procs_pid(p, 1);
    mr_procs_kill(p, 1, SIGKILL);
    /* Dead, not yet reaped (the join reaps it): its memory is gone. */
    siginfo_t si;
    cr_assert_eq(waitid(P_PID, (id_t)victim, &si, WEXITED | WNOWAIT), 0, "waitid: %s", strerror(errno));
    __atomic_store_n(&b->go, 1, __ATOMIC_RELEASE);
    int failed = mr_procs_join(p, 30, msg, sizeof(msg));
    struct gone_board got = *b;
    mr_procs_free(p);
    cr_assert_eq(failed, 0, "%d rank(s) failed: %s", failed, msg);
    cr_expect_eq(got.result, PLAIT_ERR_REMOTE, "plait_recv returned %s: %s",
                 plait_get_error_string((plait_result_t)got.result), got.err);
    cr_expect(strstr(got.err, "rank 1 ") && strstr(got.err, "gone") && strstr(got.err, "single copy"),
              "the error does not say that rank 1 is gone during a single-copy read: \"%s\"", got.err);
}

/* ---------------------------------------------------------------- a sender that gives up */

/* Rank 1 sends 1 MiB that rank 0 receives only after rank 1's send has timed
 * out and rank 1 has overwritten its buffer, as a user may once the call has
 * returned: rank 0 must fail, not read the new bytes (or freed memory). */
struct withdraw_board {
    int sent;   /* rank 1's send has returned and its buffer is overwritten */
    int done;   /* rank 0's receive has returned */
    int send_result;
    int recv_result;
    char err[512];
};
static struct withdraw_board *wb;

static int withdraw_rank(plait_comm_t comm, int rank, int n, void *arg, char *msg, size_t len)
{
    (void)n;
    (void)arg;
    const size_t count = 1 << 18;
    float *buf = malloc(count * sizeof(float));
    for (size_t i = 0; i < count; i++)
        buf[i] = 1.0f;
    const double deadline = mr_now() + 20;
    int rc = 0;
    if (rank == 1) {
        /* In a group: a send issued alone keeps the FIFO's buffering (no
         * descriptor, see exchange_without_group). */
        plait_group_start();
        plait_send(buf, count, PLAIT_FLOAT32, 0, comm, NULL);
        wb->send_result = (int)plait_group_end();
        memset(buf, 0xee, count * sizeof(float));
        __atomic_store_n(&wb->sent, 1, __ATOMIC_RELEASE);
        while (!__atomic_load_n(&wb->done, __ATOMIC_ACQUIRE) && mr_now() < deadline)
            usleep(1000);
    } else {
        while (!__atomic_load_n(&wb->sent, __ATOMIC_ACQUIRE) && mr_now() < deadline)
            usleep(1000);
        wb->recv_result = (int)plait_recv(buf, count, PLAIT_FLOAT32, 1, comm, NULL);
        snprintf(wb->err, sizeof(wb->err), "%s", plait_get_last_error(comm));
        if (wb->recv_result == PLAIT_SUCCESS && buf[0] != 1.0f) {
            snprintf(msg, len, "rank 0 received the overwritten bytes (0x%08x) without an error",
                     *(const unsigned *)buf);
            rc = 1;
        }
        __atomic_store_n(&wb->done, 1, __ATOMIC_RELEASE);
    }
    free(buf);
    return rc;
}

static void withdraw(enum mr_mode mode)
{
    wb = mmap(NULL, sizeof(*wb), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    cr_assert_neq(wb, MAP_FAILED);
    memset(wb, 0, sizeof(*wb));
    setenv("PLAIT_CMA", "1", 1);
    setenv("PLAIT_COLL_TIMEOUT", "1", 1);
    char msg[1024];
    int failed = mr_run(mode, 2, withdraw_rank, NULL, 40, msg, sizeof(msg));
    struct withdraw_board got = *wb;
    munmap(wb, sizeof(*wb));
    cr_assert_eq(failed, 0, "%s: %d rank(s) failed: %s", mr_mode_name(mode), failed, msg);
    cr_expect_eq(got.send_result, PLAIT_ERR_TIMEOUT, "rank 1's send returned %s",
                 plait_get_error_string((plait_result_t)got.send_result));
    cr_expect_eq(got.recv_result, PLAIT_ERR_REMOTE, "rank 0's receive returned %s: %s",
                 plait_get_error_string((plait_result_t)got.recv_result), got.err);
    cr_expect(strstr(got.err, "rank 1 ") && strstr(got.err, "withdrew"),
              "the error does not say that rank 1 withdrew its bytes: \"%s\"", got.err);
}

Test(cma, sender_gives_up_shm, .timeout = 60)
{
    withdraw(MR_SHM);
}

Test(cma, sender_gives_up_threads, .timeout = 60)
{
    withdraw(MR_THREADS);
}

/* ---------------------------------------------------------------- descriptors that lie */

struct lie_board {
    int done;
    int result;
    char err[512];
};

/* Rank 1 writes a descriptor by hand into its point-to-point FIFO to rank 0;
 * rank 0 receives 4096 floats from it. */
static int lie_child(struct mr_child *c, void *arg)
{
    const struct plait_sc_desc *lie = arg;
    struct lie_board *b = c->shared;
    setenv("PLAIT_CMA", "1", 1);
    /* The point-to-point connection is read and written below through the
     * private headers: made at init, not on first use. */
    setenv("PLAIT_RUNTIME_CONNECT", "0", 1);
    plait_comm_t comm = mr_child_init(c);
    if (!comm)
        return 1;
    float buf[4096];
    if (c->rank == 1) {
        struct plait_conn *conn = comm->conns[0 * comm->ncls + comm->ncls - 1];
        void *slot = plait_conn_send_slot(conn);
        memcpy(slot, lie, sizeof(*lie));
        plait_conn_send_commit(conn, PLAIT_SLOT_DESC | (uint32_t)sizeof(*lie));
        const double deadline = mr_now() + 30;
        while (!__atomic_load_n(&b->done, __ATOMIC_ACQUIRE) && mr_now() < deadline)
            usleep(1000);
    } else {
        b->result = (int)plait_recv(buf, 4096, PLAIT_FLOAT32, 1, comm, NULL);
        snprintf(b->err, sizeof(b->err), "%s", plait_get_last_error(comm));
        __atomic_store_n(&b->done, 1, __ATOMIC_RELEASE);
    }
    plait_comm_destroy(comm);
    return 0;
}

static struct lie_board run_lie(struct plait_sc_desc lie)
{
    char msg[1024];
    struct mr_procs *p = mr_procs_start(2, lie_child, &lie, sizeof(struct lie_board), 0, msg, sizeof(msg));
    cr_assert_not_null(p, "%s", msg);
    int failed = mr_procs_join(p, 40, msg, sizeof(msg));
    struct lie_board got = *(struct lie_board *)mr_procs_shared(p);
    mr_procs_free(p);
    cr_assert_eq(failed, 0, "%d rank(s) failed: %s", failed, msg);
    return got;
}

Test(cma, descriptor_with_a_bad_address, .timeout = 60)
{
    struct lie_board b = run_lie((struct plait_sc_desc){0x1000, 4096 * sizeof(float), 0});
    cr_expect_eq(b.result, PLAIT_ERR_REMOTE, "plait_recv returned %s: %s",
                 plait_get_error_string((plait_result_t)b.result), b.err);
    cr_expect(strstr(b.err, "rank 1 ") && strstr(b.err, strerror(EFAULT)),
              "the error does not name rank 1 and EFAULT: \"%s\"", b.err);
}

Test(cma, descriptor_with_a_wrong_length, .timeout = 60)
{
    static float somewhere[8192];
    struct lie_board b = run_lie((struct plait_sc_desc){(uint64_t)(uintptr_t)somewhere, sizeof(somewhere), 0});
    cr_expect_eq(b.result, PLAIT_ERR_INVALID_USAGE, "plait_recv returned %s: %s",
                 plait_get_error_string((plait_result_t)b.result), b.err);
    cr_expect(strstr(b.err, "rank 1 ") && strstr(b.err, "mismatched"),
              "the error does not name rank 1 and a mismatch: \"%s\"", b.err);
}

/* ---------------------------------------------------------------- point-to-point outside groups */

/* Both ranks send 256 KiB and then receive, each call on its own: a descriptor
 * would make each send wait for a receive the peer has not issued yet. Such a
 * send keeps the FIFO's buffering (up to PLAIT_BUFFSIZE), as before single
 * copy; in a group the same exchange uses descriptors. */
static int exchange_rank(plait_comm_t comm, int rank, int n, void *arg, char *msg, size_t len)
{
    (void)n;
    (void)arg;
    const size_t count = 64 * 1024;
    const int peer = 1 - rank;
    float *out = malloc(count * sizeof(float)), *in = malloc(count * sizeof(float));
    if (!out || !in) {
        free(out);
        free(in);
        snprintf(msg, len, "out of memory");
        return 1;
    }
    for (size_t i = 0; i < count; i++)
        out[i] = (float)(rank * 1000 + (int)(i % 997));
    plait_result_t r = plait_send(out, count, PLAIT_FLOAT32, peer, comm, NULL);
    if (r == PLAIT_SUCCESS)
        r = plait_recv(in, count, PLAIT_FLOAT32, peer, comm, NULL);
    int bad = r != PLAIT_SUCCESS;
    for (size_t i = 0; i < count && !bad; i++)
        bad = in[i] != (float)(peer * 1000 + (int)(i % 997));
    if (!bad) { /* the same exchange in a group */
        plait_group_start();
        plait_send(out, count, PLAIT_FLOAT32, peer, comm, NULL);
        plait_recv(in, count, PLAIT_FLOAT32, peer, comm, NULL);
        r = plait_group_end();
        bad = r != PLAIT_SUCCESS;
        for (size_t i = 0; i < count && !bad; i++)
            bad = in[i] != (float)(peer * 1000 + (int)(i % 997));
    }
    free(out);
    free(in);
    if (bad) {
        snprintf(msg, len, "rank %d: exchange failed: %s", rank, r ? plait_get_last_error(comm) : "wrong data");
        return 1;
    }
    return 0;
}

Test(cma, exchange_without_group_threads, .timeout = 60)
{
    setenv("PLAIT_COLL_TIMEOUT", "10", 1);
    char msg[1024];
    int failed = mr_run(MR_THREADS, 2, exchange_rank, NULL, 40, msg, sizeof(msg));
    cr_assert_eq(failed, 0, "%s", msg);
}

Test(cma, exchange_without_group_shm_cma_on, .timeout = 60)
{
    setenv("PLAIT_COLL_TIMEOUT", "10", 1);
    setenv("PLAIT_CMA", "1", 1);
    char msg[1024];
    int failed = mr_run(MR_SHM, 2, exchange_rank, NULL, 40, msg, sizeof(msg));
    unsetenv("PLAIT_CMA");
    cr_assert_eq(failed, 0, "%s", msg);
}
