/* One rank of a multi-host test (tests/multihost/run.sh): joins the job from
 * the launcher environment (PLAIT_COMM_ID, PLAIT_RANK, PLAIT_NRANKS), runs a
 * matrix of collectives chosen on the command line and checks every result
 * with tests/coll_check.c, or (--loop) runs one large allreduce over and over
 * until it fails, for the fault scenarios. It prints one verdict line on
 * stdout:
 *
 *   mh: rank R of N: PASS: <calls> calls, <wrong> wrong, <seconds> s
 *   mh: rank R of N: FAIL: <the first wrong result or error>
 *   mh: rank R of N: ERROR at <unix time>: <result name>: <plait_get_last_error>
 *
 * Public API only (plait.h); the checker is the one test_collectives uses.
 * Every wait is bounded: each call by PLAIT_COLL_TIMEOUT, the whole program by
 * --deadline (SIGALRM), and the rank dies with the driver (PR_SET_PDEATHSIG). */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

#include "plait.h"
#include "tests/coll_check.h"

enum mh_coll { MH_ALLREDUCE, MH_REDUCE, MH_REDUCESCATTER, MH_BROADCAST, MH_ALLGATHER, MH_ALLTOALL, MH_GATHER,
               MH_SCATTER, MH_SENDRECV, MH_NCOLLS };
static const char *const coll_names[MH_NCOLLS] = {"allreduce", "reduce", "reducescatter", "broadcast", "allgather",
                                                  "alltoall",  "gather", "scatter",       "sendrecv"};

#define MAX_COUNTS 16
#define COUNT_BIG ((size_t)-1) /* "big" on the command line: big_bytes of the type, plus 3 elements (odd) */

struct options {
    unsigned colls, types, ops; /* bit masks */
    size_t counts[MAX_COUNTS];
    int ncounts;
    size_t big_bytes;
    int inplace_from, inplace_to;
    double loop_s;      /* > 0: the fault mode */
    double linger_s;    /* the fault mode: seconds between the error and plait_comm_destroy */
    size_t loop_floats; /* elements of the fault mode's allreduce */
    unsigned deadline_s;
};

static int rank = -1, nranks = -1;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void usage(void)
{
    fprintf(stderr,
            "usage: mh_rank [--colls LIST|all] [--types LIST|all] [--ops LIST|all] [--counts LIST] [--big-bytes N]\n"
            "               [--inplace 0|1|both] [--loop SECONDS [--loop-floats N] [--linger SECONDS]]\n"
            "               [--deadline SECONDS]\n"
            "  LIST: comma-separated names; counts are element counts or 'big' (--big-bytes of the type + 3)\n");
    exit(2);
}

static int find_name(const char *name, int n, const char *(*name_of)(int))
{
    for (int i = 0; i < n; i++)
        if (strcmp(name, name_of(i)) == 0)
            return i;
    return -1;
}

static const char *coll_name_of(int i)
{
    return coll_names[i];
}

/* A comma-separated list of names (or "all") as a bit mask. */
static unsigned parse_mask(const char *arg, int n, const char *(*name_of)(int), const char *what)
{
    if (strcmp(arg, "all") == 0)
        return n >= 32 ? ~0u : (1u << n) - 1;
    unsigned mask = 0;
    char *copy = strdup(arg), *save = NULL;
    for (char *tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        int i = find_name(tok, n, name_of);
        if (i < 0) {
            fprintf(stderr, "mh_rank: unknown %s '%s'\n", what, tok);
            exit(2);
        }
        mask |= 1u << i;
    }
    free(copy);
    return mask;
}

static void parse_counts(const char *arg, struct options *o)
{
    char *copy = strdup(arg), *save = NULL;
    o->ncounts = 0;
    for (char *tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        if (o->ncounts == MAX_COUNTS)
            usage();
        if (strcmp(tok, "big") == 0) {
            o->counts[o->ncounts++] = COUNT_BIG;
            continue;
        }
        char *end;
        errno = 0;
        unsigned long long v = strtoull(tok, &end, 10);
        if (errno || *end || end == tok)
            usage();
        o->counts[o->ncounts++] = (size_t)v;
    }
    free(copy);
}

static void parse(int argc, char **argv, struct options *o)
{
    *o = (struct options){.colls = (1u << MH_NCOLLS) - 1, .types = 1u << PLAIT_FLOAT32, .ops = 1u << PLAIT_SUM,
                          .counts = {0, 1, 7, COUNT_BIG}, .ncounts = 4, .big_bytes = (size_t)1 << 20,
                          .inplace_from = 0, .inplace_to = 1, .loop_floats = (size_t)4 << 20, .deadline_s = 600};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (i + 1 >= argc)
            usage();
        const char *v = argv[++i];
        if (strcmp(a, "--colls") == 0)
            o->colls = parse_mask(v, MH_NCOLLS, coll_name_of, "collective");
        else if (strcmp(a, "--types") == 0)
            o->types = parse_mask(v, PLAIT_NUM_TYPES, cc_type_name, "type");
        else if (strcmp(a, "--ops") == 0)
            o->ops = parse_mask(v, CC_NUM_OPS, cc_op_name, "op");
        else if (strcmp(a, "--counts") == 0)
            parse_counts(v, o);
        else if (strcmp(a, "--big-bytes") == 0)
            o->big_bytes = strtoull(v, NULL, 10);
        else if (strcmp(a, "--inplace") == 0) {
            o->inplace_from = strcmp(v, "1") == 0;
            o->inplace_to = strcmp(v, "0") != 0;
        } else if (strcmp(a, "--loop") == 0)
            o->loop_s = strtod(v, NULL);
        else if (strcmp(a, "--linger") == 0)
            o->linger_s = strtod(v, NULL);
        else if (strcmp(a, "--loop-floats") == 0)
            o->loop_floats = strtoull(v, NULL, 10);
        else if (strcmp(a, "--deadline") == 0)
            o->deadline_s = (unsigned)strtoul(v, NULL, 10);
        else
            usage();
    }
    if (!o->colls || !o->types || !o->ops || o->big_bytes < 8 || o->loop_floats == 0 || o->deadline_s == 0 ||
        o->linger_s < 0 || o->linger_s >= o->deadline_s)
        usage();
}

static size_t count_of(size_t count, int dtype, const struct options *o)
{
    return count == COUNT_BIG ? o->big_bytes / cc_size(dtype) + 3 : count;
}

static int is_reduction(int coll)
{
    return coll == MH_ALLREDUCE || coll == MH_REDUCE || coll == MH_REDUCESCATTER;
}

static int has_inplace(int coll)
{
    return coll <= MH_ALLGATHER;
}

#define CALL(call)                                                                                                \
    do {                                                                                                          \
        plait_result_t r_ = (call);                                                                               \
        if (r_ != PLAIT_SUCCESS) {                                                                                \
            snprintf(msg, len, "%s %s count %zu inplace %d root %d: %s failed: %s: %s", coll_names[coll],          \
                     cc_type_name(dtype), count, inplace, root, #call, plait_get_error_string(r_),                \
                     plait_get_last_error(comm));                                                                 \
            *failed = 1;                                                                                          \
            return 1;                                                                                             \
        }                                                                                                         \
    } while (0)

/* One combination: returns the number of wrong elements, or 1 with *failed
 * set when a call failed (the communicator is then unusable). */
static size_t run_one(plait_comm_t comm, int coll, int dtype, int op, int inplace, size_t count, int root,
                      char *sbuf, char *rbuf, int *failed, char *msg, size_t len)
{
    const int n = nranks, me = rank;
    const size_t bytes = count * cc_size(dtype);
    size_t bad = 0;
    struct cc_expect e;
    plait_redop_t pop = (plait_redop_t)op;
    if (is_reduction(coll)) {
        cc_expect_init(&e, dtype, op, n);
        if (op == CC_PREMUL) {
            uint64_t scalar = 0;
            cc_premul_scalar(dtype, &scalar);
            CALL(plait_redop_create_premulsum(&pop, &scalar, (plait_datatype_t)dtype, PLAIT_SCALAR_HOST_IMMEDIATE,
                                              comm));
        }
    }
    const plait_datatype_t t = (plait_datatype_t)dtype;
    memset(rbuf, 0xcd, bytes * (size_t)n);
    switch (coll) {
    case MH_ALLREDUCE:
    case MH_REDUCE: {
        cc_fill(sbuf, count, dtype, op, me, 0);
        char *out = inplace ? sbuf : rbuf;
        if (coll == MH_ALLREDUCE)
            CALL(plait_allreduce(sbuf, out, count, t, pop, comm, NULL));
        else
            CALL(plait_reduce(sbuf, out, count, t, pop, root, comm, NULL));
        if (coll == MH_ALLREDUCE || me == root)
            bad = cc_check(&e, out, count, 0, msg, len);
        break;
    }
    case MH_REDUCESCATTER: {
        cc_fill(sbuf, count * (size_t)n, dtype, op, me, 0);
        char *out = inplace ? sbuf + (size_t)me * bytes : rbuf;
        CALL(plait_reducescatter(sbuf, out, count, t, pop, comm, NULL));
        bad = cc_check(&e, out, count, (size_t)me * count, msg, len);
        break;
    }
    case MH_BROADCAST: {
        char *in = inplace ? rbuf : sbuf;
        if (me == root)
            cc_fill_bytes(in, bytes, root, 0);
        CALL(plait_broadcast(in, rbuf, count, t, root, comm, NULL));
        bad = cc_check_bytes(rbuf, bytes, root, 0, msg, len);
        break;
    }
    case MH_ALLGATHER: {
        char *in = inplace ? rbuf + (size_t)me * bytes : sbuf;
        cc_fill_bytes(in, bytes, me, 0);
        CALL(plait_allgather(in, rbuf, count, t, comm, NULL));
        for (int q = 0; q < n; q++)
            bad += cc_check_bytes(rbuf + (size_t)q * bytes, bytes, q, 0, msg, len);
        break;
    }
    case MH_ALLTOALL:
        cc_fill_bytes(sbuf, bytes * (size_t)n, me, 0);
        CALL(plait_alltoall(sbuf, rbuf, count, t, comm, NULL));
        for (int q = 0; q < n; q++)
            bad += cc_check_bytes(rbuf + (size_t)q * bytes, bytes, q, (size_t)me * bytes, msg, len);
        break;
    case MH_GATHER:
        cc_fill_bytes(sbuf, bytes, me, 0);
        CALL(plait_gather(sbuf, rbuf, count, t, root, comm, NULL));
        if (me == root)
            for (int q = 0; q < n; q++)
                bad += cc_check_bytes(rbuf + (size_t)q * bytes, bytes, q, 0, msg, len);
        break;
    case MH_SCATTER:
        if (me == root)
            cc_fill_bytes(sbuf, bytes * (size_t)n, root, 0);
        CALL(plait_scatter(sbuf, rbuf, count, t, root, comm, NULL));
        bad = cc_check_bytes(rbuf, bytes, root, (size_t)me * bytes, msg, len);
        break;
    case MH_SENDRECV: {
        /* In one group: a ring exchange, a message to the rank `root` steps
         * ahead (every distance comes round as the root rotates, so pairs on
         * one host and across hosts both talk), and a message to self. */
        const int next = (me + 1) % n, prev = (me + n - 1) % n;
        const int d = root, far_to = (me + d) % n, far_from = (me + n - d) % n;
        cc_fill_bytes(sbuf, bytes, me, 0);
        CALL(plait_group_start());
        CALL(plait_send(sbuf, count, t, next, comm, NULL));
        CALL(plait_recv(rbuf, count, t, prev, comm, NULL));
        CALL(plait_send(sbuf, count, t, far_to, comm, NULL));
        CALL(plait_recv(rbuf + bytes, count, t, far_from, comm, NULL));
        CALL(plait_send(sbuf, count, t, me, comm, NULL));
        CALL(plait_recv(rbuf + 2 * bytes, count, t, me, comm, NULL));
        CALL(plait_group_end());
        bad = cc_check_bytes(rbuf, bytes, prev, 0, msg, len) + cc_check_bytes(rbuf + bytes, bytes, far_from, 0, msg, len) +
              cc_check_bytes(rbuf + 2 * bytes, bytes, me, 0, msg, len);
        break;
    }
    }
    if (is_reduction(coll) && op == CC_PREMUL)
        CALL(plait_redop_destroy(pop, comm));
    if (bad && msg[0] && !strstr(msg, "count"))
        snprintf(msg + strlen(msg), len - strlen(msg), " [%s count %zu inplace %d root %d]", coll_names[coll], count,
                 inplace, root);
    return bad;
}

static int run_matrix(plait_comm_t comm, const struct options *o)
{
    size_t maxbytes = 0;
    for (int c = 0; c < o->ncounts; c++)
        for (int t = 0; t < PLAIT_NUM_TYPES; t++)
            if (o->types & (1u << t)) {
                size_t b = count_of(o->counts[c], t, o) * cc_size(t);
                if (b > maxbytes)
                    maxbytes = b;
            }
    const size_t cap = (maxbytes + 64) * (size_t)(nranks + 3);
    char *sbuf = malloc(cap), *rbuf = malloc(cap);
    if (!sbuf || !rbuf) {
        printf("mh: rank %d of %d: FAIL: out of memory (%zu bytes)\n", rank, nranks, 2 * cap);
        return 1;
    }
    const double t0 = now_s();
    size_t calls = 0, total_bad = 0;
    char first[1024] = "";
    int failed = 0, iter = 0;
    for (int ci = 0; ci < o->ncounts && !failed; ci++) {
        /* A barrier between counts: the calls after it must still match up. */
        plait_result_t br = plait_barrier(comm, NULL);
        if (br != PLAIT_SUCCESS) {
            snprintf(first, sizeof(first), "plait_barrier before count %zu: %s: %s", o->counts[ci],
                     plait_get_error_string(br), plait_get_last_error(comm));
            failed = 1;
            break;
        }
        for (int coll = 0; coll < MH_NCOLLS && !failed; coll++) {
            if (!(o->colls & (1u << coll)))
                continue;
            for (int dtype = 0; dtype < PLAIT_NUM_TYPES && !failed; dtype++) {
                if (!(o->types & (1u << dtype)))
                    continue;
                for (int op = 0; op < (is_reduction(coll) ? CC_NUM_OPS : 1) && !failed; op++) {
                    if (is_reduction(coll) && !(o->ops & (1u << op)))
                        continue;
                    for (int inplace = o->inplace_from; inplace <= o->inplace_to && !failed; inplace++) {
                        if (inplace && !has_inplace(coll))
                            continue;
                        const int root = iter++ % nranks;
                        char one[1024] = "";
                        size_t bad = run_one(comm, coll, dtype, op, inplace, count_of(o->counts[ci], dtype, o), root,
                                             sbuf, rbuf, &failed, one, sizeof(one));
                        calls++;
                        if (bad && !total_bad)
                            snprintf(first, sizeof(first), "%s (%zu wrong)", one, bad);
                        total_bad += bad;
                    }
                }
            }
        }
    }
    free(sbuf);
    free(rbuf);
    if (failed || total_bad)
        printf("mh: rank %d of %d: FAIL: %s\n", rank, nranks, first);
    else
        printf("mh: rank %d of %d: PASS: %zu calls, 0 wrong, %.2f s\n", rank, nranks, calls, now_s() - t0);
    fflush(stdout);
    return failed || total_bad;
}

/* The fault mode: one large float allreduce after another until a call fails
 * (the driver kills a peer or takes a link down meanwhile) or loop_s pass.
 * "looping" tells the driver the first call went through. After the error the
 * rank waits linger_s before it destroys the communicator (closing its
 * connections), so that a peer still waiting reports what it sees itself, not
 * this rank's departure. Exit status: 3 when a call failed (what the scenario
 * wants), 1 when none did. */
static int run_loop(plait_comm_t comm, const struct options *o)
{
    float *buf = calloc(o->loop_floats, sizeof(float));
    if (!buf) {
        printf("mh: rank %d of %d: FAIL: out of memory\n", rank, nranks);
        return 1;
    }
    const double t0 = now_s();
    long calls = 0;
    plait_result_t r;
    do {
        r = plait_allreduce(buf, buf, o->loop_floats, PLAIT_FLOAT32, PLAIT_SUM, comm, NULL);
        if (r == PLAIT_SUCCESS && calls++ == 0) {
            printf("mh: rank %d of %d: looping\n", rank, nranks);
            fflush(stdout);
        }
    } while (r == PLAIT_SUCCESS && now_s() - t0 < o->loop_s);
    free(buf);
    if (r == PLAIT_SUCCESS) {
        printf("mh: rank %d of %d: FAIL: %ld allreduces in %.1f s and none failed\n", rank, nranks, calls, o->loop_s);
        return 1;
    }
    printf("mh: rank %d of %d: ERROR at %.3f: %s: %s\n", rank, nranks, now_s(), plait_get_error_string(r),
           plait_get_last_error(comm));
    fflush(stdout);
    if (o->linger_s > 0) {
        struct timespec ts = {(time_t)o->linger_s, (long)((o->linger_s - (double)(time_t)o->linger_s) * 1e9)};
        nanosleep(&ts, NULL);
    }
    return 3;
}

int main(int argc, char **argv)
{
    struct options o;
    parse(argc, argv, &o);
    /* Die with the driver, even if it is killed with SIGKILL (it then cannot
     * clean up; its next run removes what is left). */
    const char *driver = getenv("MH_DRIVER_PID");
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (driver && getppid() != (pid_t)atoi(driver))
        return 1;
    alarm(o.deadline_s);
    plait_comm_t comm = NULL;
    const char *r = getenv("PLAIT_RANK"), *n = getenv("PLAIT_NRANKS");
    rank = r ? atoi(r) : -1;
    nranks = n ? atoi(n) : -1;
    plait_result_t res = plait_comm_init_from_env(&comm, NULL);
    if (res != PLAIT_SUCCESS) {
        printf("mh: rank %d of %d: FAIL: init: %s: %s\n", rank, nranks, plait_get_error_string(res),
               plait_get_last_error(NULL));
        return 1;
    }
    if (plait_comm_rank(comm, &rank) || plait_comm_count(comm, &nranks))
        return 1;
    int status = o.loop_s > 0 ? run_loop(comm, &o) : run_matrix(comm, &o);
    const double t0 = now_s();
    res = plait_comm_destroy(comm);
    if (res != PLAIT_SUCCESS && status == 0) {
        printf("mh: rank %d of %d: FAIL: destroy: %s: %s\n", rank, nranks, plait_get_error_string(res),
               plait_get_last_error(NULL));
        status = 1;
    }
    if (now_s() - t0 > 5)
        fprintf(stderr, "mh: rank %d of %d: plait_comm_destroy took %.1f s\n", rank, nranks, now_s() - t0);
    return status;
}
