/* Device collectives compared with the CPU backend (cuda_compare.h). */
#define _GNU_SOURCE
#include "tests/cuda_compare.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tests/coll_check.h"
#include "core/cuda/cu.h"
#include "plait.h"

#define CX_MSG 200

/* Ring where it exists, else the collective's one schedule: every rank and both
 * backends then run the same steps. */
const char *const cx_default_algo = "ring;alltoall:pairwise;gather:linear;scatter:linear";

static const char *const coll_names[CX_NUM_COLLS] = {
    "allreduce", "broadcast", "reduce", "allgather", "reducescatter", "alltoall", "gather", "scatter", "sendrecv",
};

const char *cx_coll_name(int coll)
{
    return coll >= 0 && coll < CX_NUM_COLLS ? coll_names[coll] : "?";
}

static int is_reduction(int coll)
{
    return coll == CX_ALLREDUCE || coll == CX_REDUCE || coll == CX_REDUCESCATTER;
}

static int has_inplace(int coll)
{
    return coll <= CX_REDUCESCATTER;
}

void cx_config_default(struct cx_config *cfg, int nranks, size_t big)
{
    memset(cfg, 0, sizeof(*cfg));
    cfg->nranks = nranks;
    cfg->colls = CX_ALL_COLLS;
    cfg->types = CX_ALL_TYPES;
    cfg->ops = CX_ALL_OPS;
    cfg->placements = 3;
    cfg->counts[cfg->ncounts++] = 0;
    cfg->counts[cfg->ncounts++] = 1;
    cfg->counts[cfg->ncounts++] = 1001;
    if (big)
        cfg->counts[cfg->ncounts++] = big;
    cfg->timeout_s = 300;
    cfg->label = "gpu";
}

void cx_set_env(const struct cx_config *cfg)
{
    char v[32];
    setenv("PLAIT_ALGO", cfg->algo ? cfg->algo : cx_default_algo, 1);
    setenv("PLAIT_PROTO", cfg->proto ? cfg->proto : "simple", 1);
    snprintf(v, sizeof(v), "%d", cfg->nchannels > 0 ? cfg->nchannels : 2);
    setenv("PLAIT_NCHANNELS", v, 1);
    setenv("PLAIT_MIN_CTAS", v, 1);
    setenv("PLAIT_MAX_CTAS", v, 1);
    snprintf(v, sizeof(v), "%ld", cfg->chunk_bytes > 0 ? cfg->chunk_bytes : 131072L);
    setenv("PLAIT_CHUNK_SIZE", v, 1);
    /* A hung collective fails the case instead of the whole run. */
    if (!getenv("PLAIT_COLL_TIMEOUT"))
        setenv("PLAIT_COLL_TIMEOUT", "60", 1);
    /* The tuner's choices must not depend on a tuning file of the machine. */
    unsetenv("PLAIT_TUNE_FILE");
    unsetenv("PLAIT_CE_COLL");
}

/* ------------------------------------------------------------------ cases */

struct cx_case {
    int coll, dtype, op, is_inplace;
    size_t count;
};

/* Writes the config's cases in order into out[0..cap) (out may be NULL);
 * returns how many there are. */
static long enumerate(const struct cx_config *cfg, struct cx_case *out, long cap)
{
    long k = 0;
    for (int c = 0; c < CX_NUM_COLLS; c++) {
        if (!(cfg->colls & (1u << c)))
            continue;
        for (int t = 0; t < PLAIT_NUM_TYPES; t++) {
            if (!(cfg->types & (1u << t)))
                continue;
            for (int op = 0; op < CC_NUM_OPS; op++) {
                if (is_reduction(c) ? !(cfg->ops & (1u << op)) : op > 0)
                    continue;
                for (int ip = 0; ip < 2; ip++) {
                    if (!(cfg->placements & (1u << ip)) || (ip && !has_inplace(c)))
                        continue;
                    for (int i = 0; i < cfg->ncounts; i++) {
                        if (out && k < cap)
                            out[k] = (struct cx_case){c, t, is_reduction(c) ? op : -1, ip, cfg->counts[i]};
                        k++;
                    }
                }
            }
        }
    }
    return k;
}

static size_t send_elems(int coll, size_t count, int n)
{
    return (coll == CX_REDUCESCATTER || coll == CX_ALLTOALL || coll == CX_SCATTER) ? count * (size_t)n : count;
}

static size_t recv_elems(int coll, size_t count, int n)
{
    return (coll == CX_ALLGATHER || coll == CX_ALLTOALL || coll == CX_GATHER) ? count * (size_t)n : count;
}

static int root_of(const struct cx_case *c, int n)
{
    return (int)((c->count + (size_t)c->dtype) % (size_t)n);
}

/* ------------------------------------------------------------------ one rank */

struct cx_result {
    int status; /* 0: not run, 1: pass, 2: fail */
    char msg[CX_MSG];
};

struct cx_shared {
    const struct cx_config *cfg;
    const struct cx_case *cases;
    long ncases;
    struct cx_result *results; /* [case * nranks + rank] */
    char (*fatal)[CX_MSG];     /* [rank]: why the rank stopped early */
    size_t max_bytes;          /* largest buffer of any case */
};

struct cx_rank {
    const struct cx_shared *sh;
    const struct plait_cu *cu;
    int rank, n;
    plait_comm_t comm;
    void *cs;
    plait_stream_t ps;
    plait_cudevptr dA, dB;
    unsigned char *hA, *hB, *imgA, *imgB, *out;
};

static int fatal(struct cx_rank *r, const char *what, plait_result_t res)
{
    snprintf(r->sh->fatal[r->rank], CX_MSG, "rank %d: %s: %s: %s", r->rank, what, plait_get_error_string(res),
             plait_get_last_error(r->comm));
    return -1;
}

static int cu_fatal(struct cx_rank *r, const char *what, int res)
{
    char buf[96];
    snprintf(r->sh->fatal[r->rank], CX_MSG, "rank %d: %s failed: %s", r->rank, what,
             plait_cu_strerror(res, buf, sizeof(buf)));
    return -1;
}

static plait_result_t issue(const struct cx_case *c, int rank, int n, const void *s, void *d, plait_redop_t op,
                            plait_comm_t comm, plait_stream_t st)
{
    const int root = root_of(c, n);
    plait_result_t res;
    switch (c->coll) {
    case CX_ALLREDUCE: return plait_allreduce(s, d, c->count, c->dtype, op, comm, st);
    case CX_BROADCAST: return plait_broadcast(s, d, c->count, c->dtype, root, comm, st);
    case CX_REDUCE: return plait_reduce(s, d, c->count, c->dtype, op, root, comm, st);
    case CX_ALLGATHER: return plait_allgather(s, d, c->count, c->dtype, comm, st);
    case CX_REDUCESCATTER: return plait_reducescatter(s, d, c->count, c->dtype, op, comm, st);
    case CX_ALLTOALL: return plait_alltoall(s, d, c->count, c->dtype, comm, st);
    case CX_GATHER: return plait_gather(s, d, c->count, c->dtype, root, comm, st);
    case CX_SCATTER: return plait_scatter(s, d, c->count, c->dtype, root, comm, st);
    default:
        /* A ring exchange in one group (to itself with one rank). */
        if ((res = plait_group_start()))
            return res;
        plait_result_t r1 = plait_send(s, c->count, c->dtype, (rank + 1) % n, comm, st);
        plait_result_t r2 = plait_recv(d, c->count, c->dtype, (rank + n - 1) % n, comm, st);
        res = plait_group_end();
        return r1 ? r1 : r2 ? r2 : res;
    }
}

/* Where the input goes and which part of buffer B holds a defined result. */
static void layout(const struct cx_case *c, int rank, int n, size_t *soff, size_t *roff, size_t *cmp_off,
                   size_t *cmp_len)
{
    const size_t cnt = c->count, re = recv_elems(c->coll, cnt, n);
    *soff = *roff = 0;
    if (c->is_inplace && c->coll == CX_ALLGATHER)
        *soff = (size_t)rank * cnt;
    if (c->is_inplace && c->coll == CX_REDUCESCATTER)
        *roff = (size_t)rank * cnt;
    *cmp_off = *roff;
    *cmp_len = re;
    const int root = root_of(c, n);
    if ((c->coll == CX_REDUCE || c->coll == CX_GATHER) && rank != root)
        *cmp_len = 0;
}

static void fill_input(const struct cx_case *c, int rank, int n, unsigned char *dst)
{
    const size_t es = cc_size(c->dtype), se = send_elems(c->coll, c->count, n);
    if (is_reduction(c->coll)) {
        cc_fill(dst, se, c->dtype, c->op, rank, 0);
    } else if (c->coll == CX_BROADCAST || c->coll == CX_SCATTER) {
        if (rank == root_of(c, n))
            cc_fill_bytes(dst, se * es, rank, 0);
    } else {
        cc_fill_bytes(dst, se * es, rank, 0);
    }
}

/* Each rank its own premulsum scalar (NCCL's semantics: sum over ranks of
 * scalar_r * input_r): coll_check's scalar on even ranks, 1 on odd ones, so
 * that a backend applying one rank's scalar to every contribution differs. */
static void premul_scalar(int dtype, int rank, uint64_t *out)
{
    static const uint64_t one[PLAIT_NUM_TYPES] = {
        [PLAIT_INT8] = 1, [PLAIT_UINT8] = 1, [PLAIT_INT32] = 1, [PLAIT_UINT32] = 1, [PLAIT_INT64] = 1,
        [PLAIT_UINT64] = 1, [PLAIT_FLOAT16] = 0x3c00, [PLAIT_FLOAT32] = 0x3f800000u,
        [PLAIT_FLOAT64] = 0x3ff0000000000000ull, [PLAIT_BFLOAT16] = 0x3f80, [PLAIT_FLOAT8_E4M3] = 0x38,
        [PLAIT_FLOAT8_E5M2] = 0x3c,
    };
    *out = 0;
    if (rank % 2 == 0)
        cc_premul_scalar(dtype, out);
    else
        *out = one[dtype]; /* little-endian: the element's bytes come first */
}

static void describe(const struct cx_case *c, int n, char *buf, size_t len)
{
    snprintf(buf, len, "%s %s %s %s count %zu nranks %d", coll_names[c->coll], cc_type_name(c->dtype),
             c->op >= 0 ? cc_op_name(c->op) : "none", c->is_inplace ? "in-place" : "out-of-place", c->count, n);
}

/* Runs one case on this rank; writes the verdict. Returns -1 when the rank
 * cannot go on (its communicator is broken). */
static int run_case(struct cx_rank *r, const struct cx_case *c, struct cx_result *res)
{
    const struct plait_cu *cu = r->cu;
    const int n = r->n, rank = r->rank;
    const size_t es = cc_size(c->dtype);
    const size_t se = send_elems(c->coll, c->count, n), re = recv_elems(c->coll, c->count, n);
    const size_t bsz = (se > re ? se : re) * es;
    size_t soff, roff, cmp_off, cmp_len;
    plait_redop_t op = c->op >= 0 ? (plait_redop_t)c->op : PLAIT_SUM;
    plait_result_t pr;
    int cr;

    layout(c, rank, n, &soff, &roff, &cmp_off, &cmp_len);
    memset(r->imgA, 0x5a, se * es + 8);
    memset(r->imgB, 0xcd, bsz + 8);
    fill_input(c, rank, n, c->is_inplace ? r->imgB + soff * es : r->imgA);
    memcpy(r->hA, r->imgA, se * es + 8);
    memcpy(r->hB, r->imgB, bsz + 8);
    if ((cr = cu->MemcpyHtoD(r->dA, r->imgA, se * es + 8)) || (cr = cu->MemcpyHtoD(r->dB, r->imgB, bsz + 8)))
        return cu_fatal(r, "cuMemcpyHtoD", cr);
    if (c->op == CC_PREMUL) {
        uint64_t scalar = 0;
        premul_scalar(c->dtype, rank, &scalar);
        if ((pr = plait_redop_create_premulsum(&op, &scalar, c->dtype, PLAIT_SCALAR_HOST_IMMEDIATE, r->comm)))
            return fatal(r, "plait_redop_create_premulsum", pr);
    }
    char *dsend = (char *)(uintptr_t)(c->is_inplace ? r->dB + soff * es : r->dA);
    char *drecv = (char *)(uintptr_t)(r->dB + roff * es);
    unsigned char *hsend = c->is_inplace ? r->hB + soff * es : r->hA;
    unsigned char *hrecv = r->hB + roff * es;

    pr = issue(c, rank, n, dsend, drecv, op, r->comm, r->ps);
    if (pr) {
        res->status = 2;
        snprintf(res->msg, CX_MSG, "rank %d: device call: %s: %s", rank, plait_get_error_string(pr),
                 plait_get_last_error(r->comm));
        return -1; /* the ranks no longer make the same calls */
    }
    if ((cr = cu->StreamSynchronize(r->cs)))
        return cu_fatal(r, "cuStreamSynchronize", cr);
    plait_result_t async = PLAIT_SUCCESS;
    plait_comm_get_async_error(r->comm, &async);
    if (async != PLAIT_SUCCESS && async != PLAIT_IN_PROGRESS) {
        res->status = 2;
        snprintf(res->msg, CX_MSG, "rank %d: device run: %s: %s", rank, plait_get_error_string(async),
                 plait_get_last_error(r->comm));
        return -1;
    }
    pr = issue(c, rank, n, hsend, hrecv, op, r->comm, NULL);
    if (pr) {
        res->status = 2;
        snprintf(res->msg, CX_MSG, "rank %d: host call: %s: %s", rank, plait_get_error_string(pr),
                 plait_get_last_error(r->comm));
        return -1;
    }
    if (c->op == CC_PREMUL && (pr = plait_redop_destroy(op, r->comm)))
        return fatal(r, "plait_redop_destroy", pr);
    if ((cr = cu->MemcpyDtoH(r->out, r->dB, bsz + 8)))
        return cu_fatal(r, "cuMemcpyDtoH", cr);

    res->status = 1;
    const unsigned char *got = r->out + cmp_off * es, *want = r->hB + cmp_off * es;
    if (cmp_len && memcmp(got, want, cmp_len * es) != 0) {
        size_t i = 0;
        while (i < cmp_len && memcmp(got + i * es, want + i * es, es) == 0)
            i++;
        uint64_t g = 0, w = 0;
        memcpy(&g, got + i * es, es);
        memcpy(&w, want + i * es, es);
        res->status = 2;
        snprintf(res->msg, CX_MSG, "rank %d: element %zu: device 0x%llx, CPU backend 0x%llx", rank, cmp_off + i,
                 (unsigned long long)g, (unsigned long long)w);
    }
    /* Equal to the CPU backend is not enough when both run the same wrong
     * step: reductions are also checked against tests/coll_check.c's
     * independent reference (premulsum is not: every rank has its own scalar). */
    if (res->status == 1 && cmp_len && is_reduction(c->coll) && c->op != CC_PREMUL) {
        struct cc_expect e;
        char why[160] = "";
        cc_expect_init(&e, c->dtype, c->op, n);
        const size_t base = c->coll == CX_REDUCESCATTER ? (size_t)rank * c->count : 0;
        if (cc_check(&e, got, cmp_len, base, why, sizeof(why))) {
            res->status = 2;
            snprintf(res->msg, CX_MSG, "rank %d: both backends differ from the reference: %s", rank, why);
        }
    }
    /* Nothing past the buffer's end may be written (the guard bytes). */
    if (res->status == 1 && memcmp(r->out + bsz, r->hB + bsz, 8) != 0) {
        res->status = 2;
        snprintf(res->msg, CX_MSG, "rank %d: wrote past the end of its %zu-byte buffer", rank, bsz);
    }
    return 0;
}

static int rank_main(const struct cx_shared *sh, int rank, plait_unique_id_t id)
{
    const struct cx_config *cfg = sh->cfg;
    struct cx_rank r;
    void *ctx = NULL;
    int cr, status = -1;

    memset(&r, 0, sizeof(r));
    r.sh = sh;
    r.rank = rank;
    r.n = cfg->nranks;
    r.cu = plait_cu_get();
    if (!r.cu || r.cu->ndevices <= cfg->device) {
        snprintf(sh->fatal[rank], CX_MSG, "rank %d: no CUDA device %d", rank, cfg->device);
        return -1;
    }
    const struct plait_cu *cu = r.cu;
    if ((cr = cu->DevicePrimaryCtxRetain(&ctx, cfg->device)))
        return cu_fatal(&r, "cuDevicePrimaryCtxRetain", cr);
    if ((cr = cu->CtxSetCurrent(ctx))) {
        cu_fatal(&r, "cuCtxSetCurrent", cr);
        goto out_ctx;
    }
    plait_result_t pr = plait_comm_init_rank(&r.comm, r.n, id, rank);
    if (pr) {
        fatal(&r, "plait_comm_init_rank", pr);
        goto out_ctx;
    }
    if ((cr = cu->StreamCreateWithPriority(&r.cs, PLAIT_CU_STREAM_NON_BLOCKING, 0))) {
        cu_fatal(&r, "cuStreamCreateWithPriority", cr);
        goto out_comm;
    }
    if ((pr = plait_stream_from_cuda(r.cs, &r.ps))) {
        fatal(&r, "plait_stream_from_cuda", pr);
        goto out_stream;
    }
    const size_t bytes = sh->max_bytes + 64;
    if ((cr = cu->MemAlloc(&r.dA, bytes)) || (cr = cu->MemAlloc(&r.dB, bytes))) {
        cu_fatal(&r, "cuMemAlloc", cr);
        goto out_mem;
    }
    r.hA = malloc(bytes);
    r.hB = malloc(bytes);
    r.imgA = malloc(bytes);
    r.imgB = malloc(bytes);
    r.out = malloc(bytes);
    if (!r.hA || !r.hB || !r.imgA || !r.imgB || !r.out) {
        snprintf(sh->fatal[rank], CX_MSG, "rank %d: out of memory (5 x %zu bytes)", rank, bytes);
        goto out_mem;
    }
    status = 0;
    for (long k = 0; k < sh->ncases; k++) {
        if (run_case(&r, &sh->cases[k], &sh->results[k * r.n + rank])) {
            status = -1;
            break;
        }
    }
out_mem:
    free(r.hA);
    free(r.hB);
    free(r.imgA);
    free(r.imgB);
    free(r.out);
    if (r.dA)
        cu->MemFree(r.dA);
    if (r.dB)
        cu->MemFree(r.dB);
    if (r.ps)
        plait_stream_destroy(r.ps);
out_stream:
    cu->StreamDestroy(r.cs);
out_comm:
    if (status)
        plait_comm_abort(r.comm);
    else
        plait_comm_destroy(r.comm);
out_ctx:
    cu->DevicePrimaryCtxRelease(cfg->device);
    return status;
}

/* ------------------------------------------------------------------ launchers */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

struct cx_thread {
    const struct cx_shared *sh;
    int rank;
    plait_unique_id_t id;
    pthread_mutex_t *lock;
    pthread_cond_t *cond;
    int *done;
};

static void *thread_main(void *p)
{
    struct cx_thread *t = p;
    rank_main(t->sh, t->rank, t->id);
    pthread_mutex_lock(t->lock);
    (*t->done)++;
    pthread_cond_broadcast(t->cond);
    pthread_mutex_unlock(t->lock);
    return NULL;
}

static int run_threads(const struct cx_shared *sh, FILE *out)
{
    const int n = sh->cfg->nranks;
    pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
    pthread_cond_t cond = PTHREAD_COND_INITIALIZER;
    int done = 0;
    plait_unique_id_t id;
    struct cx_thread *t = calloc((size_t)n, sizeof(*t));
    pthread_t *tid = calloc((size_t)n, sizeof(*tid));

    if (!t || !tid || plait_get_unique_id(&id)) {
        fprintf(out, "cuda_compare: setup failed: %s\n", plait_get_last_error(NULL));
        free(t);
        free(tid);
        return -1;
    }
    for (int r = 0; r < n; r++) {
        t[r] = (struct cx_thread){sh, r, id, &lock, &cond, &done};
        if (pthread_create(&tid[r], NULL, thread_main, &t[r])) {
            fprintf(out, "cuda_compare: pthread_create failed; exiting\n");
            fflush(out);
            _exit(2); /* the ranks already started would wait for this one */
        }
    }
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_sec += (time_t)sh->cfg->timeout_s;
    pthread_mutex_lock(&lock);
    while (done < n) {
        if (pthread_cond_timedwait(&cond, &lock, &dl) == ETIMEDOUT && done < n) {
            pthread_mutex_unlock(&lock);
            fprintf(out, "cuda_compare: %d rank thread(s) still running after %.0f s\n", n - done, sh->cfg->timeout_s);
            for (int r = 0; r < n; r++)
                if (!sh->fatal[r][0])
                    snprintf(sh->fatal[r], CX_MSG, "rank %d: overran the run's %.0f s", r, sh->cfg->timeout_s);
            /* The threads cannot be stopped (one may be inside a driver call):
             * the caller reports what finished, then the process exits. */
            return 1;
        }
    }
    pthread_mutex_unlock(&lock);
    for (int r = 0; r < n; r++)
        pthread_join(tid[r], NULL);
    free(t);
    free(tid);
    return 0;
}

/* Forks the ranks before anything here touches CUDA (a CUDA context does not
 * survive fork), then makes the id and hands it over through a pipe. */
static int run_procs(const struct cx_shared *sh, FILE *out)
{
    const int n = sh->cfg->nranks;
    int fds[2];
    pid_t *pids = calloc((size_t)n, sizeof(*pids));
    int status = 0;

    if (!pids || pipe(fds)) {
        fprintf(out, "cuda_compare: pipe: %s\n", strerror(errno));
        free(pids);
        return -1;
    }
    fflush(out);
    fflush(stdout);
    fflush(stderr);
    const pid_t parent = getpid();
    for (int r = 0; r < n; r++) {
        pid_t pid = fork();
        if (pid < 0) {
            fprintf(out, "cuda_compare: fork: %s\n", strerror(errno));
            status = -1;
            break;
        }
        if (pid == 0) {
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            if (getppid() != parent)
                _exit(2);
            close(fds[1]);
            plait_unique_id_t id;
            size_t got = 0;
            while (got < sizeof(id)) {
                ssize_t k = read(fds[0], (char *)&id + got, sizeof(id) - got);
                if (k < 0 && errno == EINTR)
                    continue;
                if (k <= 0)
                    _exit(2);
                got += (size_t)k;
            }
            int st = rank_main(sh, r, id);
            fflush(stdout);
            fflush(stderr);
            _exit(st ? 1 : 0);
        }
        pids[r] = pid;
    }
    close(fds[0]);
    plait_unique_id_t id;
    if (status == 0 && plait_get_unique_id(&id)) {
        fprintf(out, "cuda_compare: plait_get_unique_id: %s\n", plait_get_last_error(NULL));
        status = -1;
    }
    for (int r = 0; status == 0 && r < n; r++)
        if (pids[r] > 0 && write(fds[1], &id, sizeof(id)) != (ssize_t)sizeof(id))
            status = -1;
    close(fds[1]);

    const double deadline = now_s() + sh->cfg->timeout_s;
    int left = 0;
    for (int r = 0; r < n; r++)
        left += pids[r] > 0;
    while (left > 0) {
        int st;
        pid_t p = waitpid(-1, &st, WNOHANG);
        if (p > 0) {
            for (int r = 0; r < n; r++) {
                if (pids[r] != p)
                    continue;
                pids[r] = 0;
                left--;
                if (!WIFEXITED(st) || WEXITSTATUS(st) > 1) {
                    if (!sh->fatal[r][0])
                        snprintf(sh->fatal[r], CX_MSG, "rank %d: process ended with status 0x%x", r, st);
                }
            }
            continue;
        }
        if (p < 0 && errno != EINTR)
            break;
        if (now_s() > deadline) {
            for (int r = 0; r < n; r++) {
                if (pids[r] > 0) {
                    kill(pids[r], SIGKILL);
                    waitpid(pids[r], NULL, 0);
                    snprintf(sh->fatal[r], CX_MSG, "rank %d: still running after %.0f s: killed", r,
                             sh->cfg->timeout_s);
                    pids[r] = 0;
                }
            }
            break;
        }
        struct timespec ts = {0, 20 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    free(pids);
    return status;
}

int cx_run_cases(const struct cx_config *cfg, FILE *out, long *passed, long *failed)
{
    const int n = cfg->nranks;
    const long ncases = enumerate(cfg, NULL, 0);
    struct cx_case *cases = calloc((size_t)(ncases > 0 ? ncases : 1), sizeof(*cases));
    const size_t res_bytes = (size_t)ncases * (size_t)n * sizeof(struct cx_result) + (size_t)n * CX_MSG;
    int status = 0;

    if (!cases) {
        fprintf(out, "cuda_compare: out of memory\n");
        return 2;
    }
    enumerate(cfg, cases, ncases);
    /* Shared with forked ranks: they write their verdicts here. */
    void *mem = mmap(NULL, res_bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (mem == MAP_FAILED) {
        fprintf(out, "cuda_compare: mmap %zu bytes: %s\n", res_bytes, strerror(errno));
        free(cases);
        return 2;
    }
    struct cx_shared sh = {cfg, cases, ncases, mem, (char (*)[CX_MSG])((char *)mem + (size_t)ncases * n *
                                                                        sizeof(struct cx_result)), 0};
    for (long k = 0; k < ncases; k++) {
        size_t se = send_elems(cases[k].coll, cases[k].count, n), re = recv_elems(cases[k].coll, cases[k].count, n);
        size_t b = (se > re ? se : re) * cc_size(cases[k].dtype);
        if (b > sh.max_bytes)
            sh.max_bytes = b;
    }
    cx_set_env(cfg);
    const double t0 = now_s();
    int launched = cfg->use_procs ? run_procs(&sh, out) : run_threads(&sh, out);
    const char *label = cfg->label ? cfg->label : "gpu";
    const char *how = cfg->use_procs ? "processes" : "threads";

    long pass = 0, fail = 0, notrun = 0;
    for (long k = 0; k < ncases; k++) {
        char what[160];
        describe(&cases[k], n, what, sizeof(what));
        int st = 1;
        const char *why = "";
        for (int r = 0; r < n; r++) {
            const struct cx_result *res = &sh.results[k * n + r];
            if (res->status == 0 && st == 1)
                st = 0;
            if (res->status == 2) {
                st = 2;
                why = res->msg;
                break;
            }
        }
        if (st == 1) {
            pass++;
            if (cfg->print_passes)
                fprintf(out, "PASS %s %s (%s)\n", label, what, how);
        } else if (st == 2) {
            fail++;
            fprintf(out, "FAIL %s %s (%s): %s\n", label, what, how, why);
        } else {
            notrun++;
        }
    }
    for (int r = 0; r < n; r++) {
        if (sh.fatal[r][0]) {
            fprintf(out, "FAIL %s %d ranks (%s): %s\n", label, n, how, sh.fatal[r]);
            status = 2;
        }
    }
    if (notrun) {
        fprintf(out, "FAIL %s %d ranks (%s): %ld case(s) not run (a rank stopped early)\n", label, n, how, notrun);
        fail += notrun;
        status = 2;
    }
    if (launched)
        status = 2;
    fprintf(out, "# %s, %d ranks as %s: %ld cases, %ld passed, %ld failed, %.1f s\n", label, n, how, ncases, pass,
            fail, now_s() - t0);
    fflush(out);
    if (launched == 1) {
        /* Rank threads overran and are still running: nothing can be freed. */
        fprintf(out, "%ld passed, %ld failed\n", *passed + pass, *failed + fail);
        fflush(out);
        fflush(stdout);
        _exit(2);
    }
    *passed += pass;
    *failed += fail;
    munmap(mem, res_bytes);
    free(cases);
    if (status)
        return status;
    return fail ? 1 : 0;
}

int cx_probe(char *why, size_t len)
{
    int fds[2];
    char buf[160] = "";
    if (pipe(fds)) {
        snprintf(why ? why : buf, why ? len : sizeof(buf), "pipe: %s", strerror(errno));
        return 0;
    }
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        close(fds[0]);
        const struct plait_cu *cu = plait_cu_get();
        char msg[160];
        char tag = 'N';
        if (!cu)
            snprintf(msg, sizeof(msg), "no CUDA driver (libcuda.so.1 not loadable, or cuInit failed)");
        else if (cu->is_double)
            tag = snprintf(msg, sizeof(msg), "the CUDA library is the test double %s, not a GPU", cu->path) > 0 ? 'D' : 'N';
        else if (cu->ndevices <= 0)
            snprintf(msg, sizeof(msg), "the CUDA driver reports no device");
        else
            tag = snprintf(msg, sizeof(msg), "%d CUDA device(s), driver %d", cu->ndevices, cu->driver_version) > 0 ? 'Y' : 'N';
        msg[sizeof(msg) - 1] = '\0';
        if (write(fds[1], &tag, 1) != 1 || write(fds[1], msg, strlen(msg) + 1) < 0)
            _exit(2);
        _exit(0);
    }
    close(fds[1]);
    if (pid < 0) {
        close(fds[0]);
        snprintf(why ? why : buf, why ? len : sizeof(buf), "fork: %s", strerror(errno));
        return 0;
    }
    char got[170] = "";
    size_t have = 0;
    const double deadline = now_s() + 60; /* cuInit of a sick driver may hang */
    while (have < sizeof(got) - 1) {
        int left_ms = (int)((deadline - now_s()) * 1000);
        struct pollfd pfd = {fds[0], POLLIN, 0};
        if (left_ms <= 0)
            break;
        int pk = poll(&pfd, 1, left_ms);
        if (pk < 0 && errno == EINTR)
            continue;
        if (pk <= 0)
            break;
        ssize_t k = read(fds[0], got + have, sizeof(got) - 1 - have);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            break;
        have += (size_t)k;
    }
    close(fds[0]);
    kill(pid, SIGKILL); /* it has written everything, or overran */
    waitpid(pid, NULL, 0);
    got[have] = '\0';
    if (why)
        snprintf(why, len, "%s", have > 1 ? got + 1 : "the probe process failed or overran 60 s");
    if (have == 0)
        return CX_PROBE_NONE;
    return got[0] == 'Y' ? CX_PROBE_GPU : got[0] == 'D' ? CX_PROBE_DOUBLE : CX_PROBE_NONE;
}
