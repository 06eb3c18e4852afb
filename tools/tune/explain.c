/* plait-tune --explain: every candidate (algorithm, protocol) the tuner weighs
 * for one collective, per size, its predicted time and busbw, and the one it
 * picks (--tsv: rows for perf/model_check). */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "algorithms/algorithms.h"
#include "core/settings.h"
#include "plait.h"
#include "tools/tune/tune.h"
#include "tuning/model.h"
#include "tuning/tuner.h"

int tune_explain(const struct tune_args *a)
{
    struct plait_model_consts k;
    const char *origin;
    int rc = tune_load_constants(a->constants, &k, &origin);
    if (rc)
        return rc;
    struct plait_model_machine m;
    memset(&m, 0, sizeof(m));
    struct tune_machine_desc d;
    if ((rc = tune_build_machine(a, &k, &m, &d)))
        return rc;
    if (a->topo_file && a->has_ranks && a->ranks != m.nranks) {
        const int have = m.nranks;
        plait_model_machine_free(&m);
        return tune_usage_error("--ranks %d: %d %s of %s have %d ranks", a->ranks, a->nodes,
                           a->nodes == 1 ? "node" : "nodes", a->topo_file, have);
    }
    const int n = m.nranks;
    struct plait_tune_space sp;
    /* A recorded host brings its own rings (one per channel, as NCCL's):
     * they bound the channels, as in --simulate. */
    int channels = a->channels;
    if (channels == 0 && a->topo_file) {
        struct plait_settings set;
        channels = plait_settings_load(&set) == PLAIT_SUCCESS ? set.nchannels : 2;
        if (m.norder > channels)
            channels = m.norder;
    }
    if ((rc = tune_space(a->coll, n, channels, &sp))) {
        plait_model_machine_free(&m);
        return rc;
    }
    const char *conv = tune_is_per_rank(a->coll)
                           ? (a->coll == PLAIT_COLL_ALLGATHER || a->coll == PLAIT_COLL_GATHER
                                  ? "size = the whole output (per-rank bytes x ranks); the tuner counts size / ranks"
                              : a->coll == PLAIT_COLL_ALLTOALL
                                  ? "size = the whole buffer of a rank; the tuner counts size / ranks"
                                  : "size = the whole input (per-rank bytes x ranks); the tuner counts size / ranks")
                           : "size = the whole buffer (the tuner counts the same)";
    if (a->is_tsv) {
        printf("# plait-tune --explain --coll %s: %s; constants: %s\n", plait_coll_name(a->coll), d.text, origin);
        printf("# %s; float elements\n", conv);
        printf("# size\talgo\tproto\tchannels\tchunk\ttime_us\tbusbw\tchosen\n");
    } else {
        printf("%s on %s\n", plait_coll_name(a->coll), d.text);
        printf("constants: %s\n", origin);
        printf("%s; float elements; busbw as nccl-tests (GB/s); * = the tuner's pick\n", conv);
        printf("channels up to %d, chunk up to %llu B, FIFO %u x %llu B\n\n", sp.max_channels,
               (unsigned long long)sp.max_chunk_bytes, sp.nslots, (unsigned long long)sp.slot_bytes);
        printf("  %10s  %-13s %-6s %3s %9s %13s %11s\n", "size", "algorithm", "proto", "ch", "chunk", "time_us",
               "busbw_GB/s");
    }
    struct plait_tune_candidate cands[PLAIT_ALGO_COUNT * PLAIT_MPROTO_COUNT];
    int status = 0;
    for (uint64_t size = a->from; size <= a->to;) {
        char hs[32];
        uint64_t bytes = tune_tuner_bytes(a->coll, size, n);
        if (bytes == 0) {
            if (!a->is_tsv)
                printf("  %10s  (fewer than one element per rank: skipped)\n", tune_human_size(size, hs, sizeof(hs)));
        } else {
            int nc = 0, best = -1;
            plait_result_t res = plait_tune_candidates(&m, &sp, a->coll, bytes, ESIZE, cands,
                                                       (int)(sizeof(cands) / sizeof(cands[0])), &nc, &best);
            if (res != PLAIT_SUCCESS) {
                tune_failure("size %llu: %s", (unsigned long long)size, plait_get_last_error(NULL));
                status = 1;
                break;
            }
            if (nc == 0 && !a->is_tsv)
                printf("  %10s  (no candidate applies)\n", tune_human_size(size, hs, sizeof(hs)));
            /* The pick is what a communicator's tuner takes for this size (its
             * bucket's decision), which may differ from the fastest row here
             * when the size is not its bucket's lower edge. */
            int pick_algo = -1, pick_proto = -1;
            if (nc > 0 && plait_tune_pick(&m, &sp, a->coll, bytes, &pick_algo, &pick_proto) == PLAIT_SUCCESS) {
                best = -1;
                for (int i = 0; i < nc && best < 0; i++)
                    if (cands[i].choice.proto == pick_proto &&
                        (pick_proto == PLAIT_MPROTO_LL || cands[i].choice.algo == pick_algo))
                        best = i;
            }
            for (int i = 0; i < nc; i++) {
                const struct plait_tune_choice *c = &cands[i].choice;
                const struct plait_model_result *r = &cands[i].result;
                if (a->is_tsv) {
                    printf("%llu\t%s\t%s\t%d\t%u\t%.3f\t%.4f\t%d\n", (unsigned long long)size,
                           c->proto == PLAIT_MPROTO_LL ? "ll" : plait_algorithms[c->algo].name,
                           plait_model_proto_name(c->proto),
                           c->nchannels, c->chunk_bytes, r->time_s * 1e6, r->busbw / 1e9, i == best);
                } else {
                    printf("%c %10s  %-13s %-6s %3d %9u %13.2f %11.3f\n", i == best ? '*' : ' ',
                           i == 0 ? tune_human_size(size, hs, sizeof(hs)) : "",
                           c->proto == PLAIT_MPROTO_LL ? "ll" : plait_algorithms[c->algo].name,
                           plait_model_proto_name(c->proto), c->nchannels, c->chunk_bytes, r->time_s * 1e6,
                           r->busbw / 1e9);
                }
            }
        }
        if (size > a->to / (uint64_t)a->step)
            break;
        size *= (uint64_t)a->step;
    }
    plait_model_machine_free(&m);
    return status;
}
