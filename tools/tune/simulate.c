/* plait-tune --simulate: every collective and algorithm predicted on N copies
 * of a recorded host (tests/fixtures/topo), up to thousands of ranks; the
 * algorithms that need the full replay are bounded by a child process's
 * deadline above --max-full-ranks. */
#define _GNU_SOURCE
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/select.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "algorithms/algorithms.h"
#include "core/settings.h"
#include "plait.h"
#include "tools/tune/tune.h"
#include "tuning/model.h"
#include "tuning/tuner.h"

/* ---------------------------------------------------------------- --simulate */

/* What a child sends back for one point (full_point). */
struct point_msg {
    plait_result_t status;
    struct plait_model_result res;
    char why[256];
};

/* One point of an algorithm that needs the full replay above --max-full-ranks:
 * the most channels and the largest chunk (the tuner's first guess for a
 * large call), replayed in a child process that is killed after budget_s.
 * The cost of a full replay grows with ranks x pieces (1 GiB recursive
 * allgather on 4096 ranks: 33M pieces, half a minute), which no rank count
 * predicts well; a deadline does. Returns 0 with *out, 1 when the model
 * declined or failed (why), 2 when the deadline passed. */
static int full_point(const struct plait_model_machine *m, const struct plait_tune_space *sp, int coll,
                      uint64_t count, int algo, int budget_s, struct plait_model_call *call,
                      struct plait_model_result *out, char *why, size_t whylen)
{
    plait_model_call_init(call, coll, count, ESIZE, algo, PLAIT_MPROTO_SIMPLE);
    call->slot_bytes = sp->slot_bytes;
    call->nslots = sp->nslots;
    call->radix = sp->radix;
    call->nchannels = sp->max_channels > 0 ? sp->max_channels : 1;
    call->chunk_bytes = sp->max_chunk_bytes;
    int fds[2];
    if (pipe(fds) != 0) {
        snprintf(why, whylen, "pipe: %s", strerror(errno));
        return 1;
    }
    fflush(stdout);
    const pid_t pid = fork();
    if (pid < 0) {
        close(fds[0]);
        close(fds[1]);
        snprintf(why, whylen, "fork: %s", strerror(errno));
        return 1;
    }
    if (pid == 0) {
        close(fds[0]);
        struct point_msg msg;
        memset(&msg, 0, sizeof(msg));
        msg.status = plait_model_time(m, call, PLAIT_MODEL_AUTO, &msg.res);
        if (msg.status != PLAIT_SUCCESS)
            snprintf(msg.why, sizeof(msg.why), "%s", plait_get_last_error(NULL));
        const char *p = (const char *)&msg;
        size_t left = sizeof(msg);
        while (left > 0) {
            const ssize_t w = write(fds[1], p, left);
            if (w <= 0)
                _exit(1);
            p += w;
            left -= (size_t)w;
        }
        _exit(0);
    }
    close(fds[1]);
    struct point_msg msg;
    size_t got = 0;
    const double deadline = tune_now_s() + budget_s;
    int rc = 2;
    for (;;) {
        const double left = deadline - tune_now_s();
        if (left <= 0)
            break;
        struct timeval tv = {.tv_sec = (time_t)left, .tv_usec = (suseconds_t)((left - (double)(time_t)left) * 1e6)};
        fd_set rd;
        FD_ZERO(&rd);
        FD_SET(fds[0], &rd);
        const int sel = select(fds[0] + 1, &rd, NULL, NULL, &tv);
        if (sel < 0 && errno == EINTR)
            continue;
        if (sel <= 0)
            break;
        const ssize_t r = read(fds[0], (char *)&msg + got, sizeof(msg) - got);
        if (r <= 0) {
            snprintf(why, whylen, "the replay's process ended without an answer");
            rc = 1;
            break;
        }
        got += (size_t)r;
        if (got == sizeof(msg)) {
            rc = msg.status == PLAIT_SUCCESS ? 0 : 1;
            if (rc == 0)
                *out = msg.res;
            else
                snprintf(why, whylen, "%s", msg.why);
            break;
        }
    }
    close(fds[0]);
    if (rc == 2)
        kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    return rc;
}

int tune_simulate(const struct tune_args *a)
{
    struct plait_model_consts k;
    const char *origin;
    int rc = tune_load_constants(a->constants, &k, &origin);
    if (rc)
        return rc;
    struct plait_model_machine m;
    memset(&m, 0, sizeof(m));
    struct tune_machine_desc d;
    double t0 = tune_now_s();
    if ((rc = tune_build_machine(a, &k, &m, &d)))
        return rc;
    const double build_s = tune_now_s() - t0;
    const int n = m.nranks;
    char hs[32];
    printf("simulate: %s\n", d.text);
    printf("size %s per call (nccl-tests -b: whole buffer; allgather output / reducescatter input = per-rank x "
           "ranks); constants: %s\n",
           tune_human_size(a->size, hs, sizeof(hs)), origin);
    printf("machine built in %.1f ms; algorithms that need the full replay: searched up to %d ranks "
           "(--max-full-ranks), above it one point within %d s (--full-budget)\n\n",
           build_s * 1e3, a->max_full_ranks, a->full_budget_s);
    printf("%-14s %-13s %-6s %3s %9s %14s %11s  %-8s %10s\n", "collective", "algorithm", "proto", "ch", "chunk",
           "time_us", "busbw_GB/s", "replay", "model_ms");

    const int order[] = {PLAIT_COLL_ALLREDUCE, PLAIT_COLL_ALLGATHER, PLAIT_COLL_REDUCESCATTER, PLAIT_COLL_BROADCAST,
                         PLAIT_COLL_ALLTOALL,  PLAIT_COLL_REDUCE,    PLAIT_COLL_GATHER,        PLAIT_COLL_SCATTER};
    int status = 0;
    double total_s = 0;
    for (size_t oi = 0; oi < sizeof(order) / sizeof(order[0]); oi++) {
        const int coll = order[oi];
        if (!a->colls[coll])
            continue;
        struct plait_tune_space sp;
        int channels = a->channels;
        if (channels == 0) {
            struct plait_settings set;
            channels = plait_settings_load(&set) == PLAIT_SUCCESS ? set.nchannels : 2;
            if (m.norder > channels)
                channels = m.norder;
        }
        if ((rc = tune_space(coll, n, channels, &sp))) {
            status = rc;
            break;
        }
        uint64_t bytes = tune_tuner_bytes(coll, a->size, n);
        if (bytes == 0) {
            printf("%-14s (%s is less than one element per rank on %d ranks: skipped)\n", plait_coll_name(coll),
                   tune_human_size(a->size, hs, sizeof(hs)), n);
            continue;
        }
        double best_t = INFINITY;
        const char *best_name = NULL;
        int shown = 0;
        /* algo 0: the small-message protocol alone (no schedule allowed); it is
         * listed once, not beside every algorithm. */
        for (int algo = 0; algo < PLAIT_ALGO_COUNT; algo++) {
            if (algo > 0 && !sp.allowed[algo])
                continue;
            shown += algo > 0;
            /* Whether the reduced replay applies: ask for it on a small call
             * (cheap either way). Algorithms that need the full replay cost
             * time in proportion to the ranks; above the cutoff they are
             * skipped with the reason rather than left to run for minutes. */
            struct plait_model_call probe;
            struct plait_model_result pr;
            plait_model_call_init(&probe, coll, (uint64_t)n * 64, ESIZE, algo, PLAIT_MPROTO_SIMPLE);
            probe.nchannels = 1;
            bool is_reduced = algo > 0 && m.nhosts > 1 &&
                              plait_model_time(&m, &probe, PLAIT_MODEL_REDUCED, &pr) == PLAIT_SUCCESS;
            if (algo > 0 && !is_reduced && n > a->max_full_ranks) {
                /* Not rotation-invariant: every rank is replayed. One point,
                 * within the budget, instead of the tuner's search. */
                if (a->full_budget_s == 0) {
                    printf("%-14s %-13s skipped: needs the full replay of %d ranks (not rotation-invariant), above "
                           "--max-full-ranks %d (--full-budget 0)\n",
                           plait_coll_name(coll), plait_algorithms[algo].name, n, a->max_full_ranks);
                    continue;
                }
                struct plait_model_call pc;
                struct plait_model_result r;
                memset(&r, 0, sizeof(r));
                char why[256] = "";
                const double s0 = tune_now_s();
                const int prc = full_point(&m, &sp, coll, bytes / ESIZE, algo, a->full_budget_s, &pc, &r, why,
                                           sizeof(why));
                const double took = tune_now_s() - s0;
                total_s += took;
                if (prc == 2) {
                    printf("%-14s %-13s skipped: the full replay of %d ranks (not rotation-invariant) took more than "
                           "%d s (--full-budget)\n",
                           plait_coll_name(coll), plait_algorithms[algo].name, n, a->full_budget_s);
                    continue;
                }
                if (prc == 1) {
                    printf("%-14s %-13s no prediction: %s\n", plait_coll_name(coll), plait_algorithms[algo].name, why);
                    continue;
                }
                printf("%-14s %-13s %-6s %3d %9llu %14.1f %11.2f  %-8s %10.1f\n", plait_coll_name(coll),
                       plait_algorithms[algo].name, "simple", pc.nchannels, (unsigned long long)pc.chunk_bytes,
                       r.time_s * 1e6, r.busbw / 1e9, r.extrapolated ? "full+1pt" : "full 1pt", took * 1e3);
                if (r.time_s < best_t) {
                    best_t = r.time_s;
                    best_name = plait_algorithms[algo].name;
                }
                continue;
            }
            struct plait_tune_space one = sp;
            memset(one.allowed, 0, sizeof(one.allowed));
            if (algo > 0)
                one.allowed[algo] = 1;
            struct plait_tune_candidate cands[PLAIT_MPROTO_COUNT * 2];
            int nc = 0, best = -1;
            double s0 = tune_now_s();
            plait_result_t res = plait_tune_candidates(&m, &one, coll, bytes, ESIZE, cands,
                                                       (int)(sizeof(cands) / sizeof(cands[0])), &nc, &best);
            double took = tune_now_s() - s0;
            total_s += took;
            if (res != PLAIT_SUCCESS) {
                printf("%-14s %-13s model failed: %s\n", plait_coll_name(coll), plait_algorithms[algo].name,
                       plait_get_last_error(NULL));
                status = 1;
                continue;
            }
            if (nc == 0 && algo == 0)
                continue;
            if (nc == 0) {
                printf("%-14s %-13s no prediction (the model declines this call)\n", plait_coll_name(coll),
                       plait_algorithms[algo].name);
                continue;
            }
            for (int i = 0; i < nc; i++) {
                const struct plait_tune_choice *c = &cands[i].choice;
                const struct plait_model_result *r = &cands[i].result;
                if ((c->proto == PLAIT_MPROTO_LL) != (algo == 0))
                    continue;
                const char *name = c->proto == PLAIT_MPROTO_LL ? "ll" : plait_algorithms[c->algo].name;
                printf("%-14s %-13s %-6s %3d %9u %14.1f %11.2f  %-8s %10.1f\n", plait_coll_name(coll), name,
                       plait_model_proto_name(c->proto), c->nchannels, c->chunk_bytes, r->time_s * 1e6, r->busbw / 1e9,
                       r->mode == PLAIT_MODEL_REDUCED ? (r->extrapolated ? "reduced+" : "reduced")
                                                      : (r->extrapolated ? "full+" : "full"),
                       took * 1e3);
                if (r->time_s < best_t) {
                    best_t = r->time_s;
                    best_name = name;
                }
            }
        }
        if (shown == 0)
            printf("%-14s no algorithm implements it on %d ranks\n", plait_coll_name(coll), n);
        else if (best_name)
            printf("%-14s fastest: %s (%.1f us)\n", plait_coll_name(coll), best_name, best_t * 1e6);
        printf("\n");
    }
    printf("model time in all: %.2f s (replay: reduced = host 0's ranks only, full = every rank; + = two shorter "
           "counts extrapolated; 1pt = one point, the most channels and the largest chunk, not searched)\n",
           total_s);
    plait_model_machine_free(&m);
    return status;
}
