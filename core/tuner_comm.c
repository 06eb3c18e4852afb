/* The communicator's tuner: the model machine built from what every rank of
 * a communicator holds alike, and the per-call choice, cached per (collective,
 * size bucket). The search itself is tuning/tuner.c's, a pure function of the
 * machine; this file is its one caller inside the core. */
#define _GNU_SOURCE
#include "core/tuner_comm.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "core/comm.h"
#include "core/fastpath.h"
#include "core/progress.h"
#include "topology/topo.h"
#include "transports/transport.h"

/* The model's link for a pair's link class (its transport's query), -1 for
 * a class the model has no link for. The net's is the socket link: TCP is
 * the one net provider, and its figures are the calibrated socket
 * constants. */
static int model_link(int link_class)
{
    switch (link_class) {
    case PLAIT_LC_LOCAL: return PLAIT_MLINK_INPROC;
    case PLAIT_LC_SHM: return PLAIT_MLINK_SHM;
    case PLAIT_LC_NET: return PLAIT_MLINK_TCP;
    default: return -1;
    }
}

/* The slowest link class between two ranks of one host (net over shm over
 * local) and between hosts, from what every rank knows (a pair's transport
 * is a pure, symmetric function of it), so every rank finds the same. The
 * classes are ordered by speed: the larger, the slower. */
static void pair_links(const struct plait_comm *comm, int *intra, int *inter)
{
    int worst_in = PLAIT_LC_NONE, worst_out = PLAIT_LC_NONE;
    for (int a = 0; a < comm->nranks; a++)
        for (int b = a + 1; b < comm->nranks; b++) {
            struct plait_tp_info info;
            plait_comm_pair_info(comm, a, b, &info);
            int *w = comm->host_of[a] == comm->host_of[b] ? &worst_in : &worst_out;
            if (info.link > *w)
                *w = info.link;
        }
    /* One rank per host: no intra-host traffic; the kind of this process.
     * One host: no traffic between hosts; the network's. */
    if (worst_in == PLAIT_LC_NONE)
        worst_in = comm->set.transport_force == PLAIT_FORCE_TCP ? PLAIT_LC_NET : PLAIT_LC_SHM;
    if (worst_out == PLAIT_LC_NONE)
        worst_out = PLAIT_LC_NET;
    *intra = worst_in;
    *inter = worst_out;
}

/* ------------------------------------------------------------ the communicator's tuner */

/* A cache entry, 64 bits so that one atomic load or store reads or publishes
 * it whole (two threads filling the same entry compute the same bits):
 *   bit 0      valid
 *   bit 1      the small-message path is the best (for calls of the bucket it can carry)
 *   bit 2      the default rule (the model did not apply)
 *   bits 3-7   algorithm of the best schedule
 *   bits 8-15  its channels
 *   bits 16-21 its chunk: slot_bytes << n, 63 = max_chunk_bytes
 *   bits 32-63 the schedule's predicted time (float) */
#define E_VALID 1ull
#define E_SMALL 2ull
#define E_DEFAULT 4ull
#define E_CHUNK_MAX 63u

struct plait_tuner {
    struct plait_model_machine m;
    int has_machine;
    struct plait_tune_space sp;
    struct plait_tune_rules rules;
    char rules_path[512];
    char consts_path[512];
    struct plait_model_consts k;
    uint8_t small_for[PLAIT_COLL_COUNT]; /* the small-message path exists for this collective */
    uint64_t cache[PLAIT_COLL_COUNT][PLAIT_TUNE_BUCKETS];      /* the model's best */
    uint64_t rule_cache[PLAIT_COLL_COUNT][PLAIT_TUNE_BUCKETS]; /* the best of one algorithm (file rules) */
};

/* "path:LINE: what" becomes "VAR=path:LINE: what" (the message is copied
 * first: plait_error writes the buffer it would read). */
static plait_result_t rewrap(plait_result_t s, const char *var)
{
    char msg[1024];
    snprintf(msg, sizeof(msg), "%s", plait_last_error_get());
    return plait_error(s, "%s=%s", var, msg);
}

plait_result_t plait_tuner_prepare(struct plait_comm *comm)
{
    struct plait_tuner *t = calloc(1, sizeof(*t));
    if (!t)
        return plait_error(PLAIT_ERR_SYSTEM, "init: out of memory for the tuner");
    comm->tuner = t;
    plait_model_consts_default(&t->k);
    const char *cpath = plait_env_get("PLAIT_TUNE_CONSTANTS");
    plait_result_t s;
    if (cpath && *cpath) {
        snprintf(t->consts_path, sizeof(t->consts_path), "%s", cpath);
        if ((s = plait_model_consts_load(cpath, &t->k)))
            return rewrap(s, "PLAIT_TUNE_CONSTANTS");
    }
    comm->set.tune_consts_hash = plait_model_consts_hash(&t->k);
    const char *rpath = plait_env_get("PLAIT_TUNE_FILE");
    if (rpath && *rpath) {
        snprintf(t->rules_path, sizeof(t->rules_path), "%s", rpath);
        if ((s = plait_tune_rules_load(rpath, &t->rules)))
            return rewrap(s, "PLAIT_TUNE_FILE");
        comm->set.tune_file_hash = t->rules.hash;
    }
    return PLAIT_SUCCESS;
}

/* The network's figures: a constants file (PLAIT_TUNE_CONSTANTS, from
 * plait-tune --calibrate) wins; without one, what the net transport's
 * provider says of the link between hosts (its query: agreed by every rank)
 * replaces the built-in socket constants (a provider that says nothing, 0,
 * leaves them). */
static void net_figures(const struct plait_comm *comm, struct plait_tuner *t)
{
    if (t->consts_path[0])
        return;
    for (int a = 0; a < comm->nranks; a++)
        for (int b = a + 1; b < comm->nranks; b++) {
            if (comm->host_of[a] == comm->host_of[b])
                continue;
            struct plait_tp_info info;
            plait_comm_pair_info(comm, a, b, &info);
            if (info.link != PLAIT_LC_NET || (info.bw_GBps <= 0 && info.lat_us <= 0))
                return;
            if (info.bw_GBps > 0)
                t->k.beta[PLAIT_MLINK_TCP] = 1.0 / (info.bw_GBps * 1e9);
            if (info.lat_us > 0)
                t->k.alpha[PLAIT_MLINK_TCP] = info.lat_us * 1e-6;
            PLAIT_INFO(PLAIT_SUBSYS_TUNING,
                       "rank %d: the model's link between hosts from the net provider: %.3g GB/s, %.3g us",
                       comm->rank, info.bw_GBps, info.lat_us);
            return;
        }
}


plait_result_t plait_tuner_init(struct plait_comm *comm)
{
    struct plait_tuner *t = comm->tuner;
    if (!t) {
        plait_result_t s = plait_tuner_prepare(comm);
        if (s)
            return s;
        t = comm->tuner;
    }
    const int n = comm->nranks;
    /* Cores every rank counts alike: the graph's, when every rank saw the
     * same graph (as fastpath.c decides broadcast and reduce). */
    int same_graph = comm->topo != NULL;
    for (int r = 0; r < n && same_graph; r++)
        same_graph = comm->ranks[r].topo_hash == comm->ranks[0].topo_hash;
    const int cores = same_graph ? plait_tune_topo_cores(comm->topo) : 0;

    struct plait_model_machine *m = &t->m;
    /* Hosts of equal rank counts: the uniform machine's shape, then the node
     * map itself (hosts need not hold consecutive ranks). */
    const int shape_hosts = comm->nhosts >= 1 && n % comm->nhosts == 0 ? comm->nhosts : 1;
    int intra_class, inter_class;
    pair_links(comm, &intra_class, &inter_class);
    net_figures(comm, t);
    const int intra = model_link(intra_class), inter = model_link(inter_class);
    if (intra < 0 || inter < 0)
        return plait_error(PLAIT_ERR_INTERNAL, "rank %d: the tuner's model has no link for link class %d", comm->rank,
                           intra < 0 ? intra_class : inter_class);
    plait_result_t s = plait_model_machine_uniform(m, n, shape_hosts, PLAIT_MENGINE_CPU, intra, inter, &t->k);
    /* Every rank must decide alike: a rank that could not build its machine
     * (out of memory) would choose by another rule than its peers, so init
     * fails instead. */
    if (s)
        return plait_error(PLAIT_ERR_SYSTEM, "rank %d: the tuner's model machine: %s", comm->rank,
                           plait_last_error_get());
    {
        t->has_machine = 1;
        m->nhosts = comm->nhosts;
        memcpy(m->host_of, comm->host_of, sizeof(int32_t) * (size_t)n);
        memcpy(m->local_of, comm->host_of + n, sizeof(int32_t) * (size_t)n);
        m->inter_link = inter;
        m->nics_per_host = 1;
        m->cores_per_host = cores;
        m->ll_ok = comm->fast != NULL && comm->set.proto != PLAIT_PROTO_SIMPLE;
        m->ll_max_bytes = plait_fast_max_bytes(comm);
        if (comm->ring_order && comm->ring_pos) {
            const size_t sz = sizeof(int32_t) * (size_t)comm->nchannels * (size_t)n;
            int32_t *order = malloc(sz), *pos = malloc(sz);
            if (!order || !pos) {
                free(order);
                free(pos);
                return plait_error(PLAIT_ERR_SYSTEM, "rank %d: the tuner's ring orders: out of memory", comm->rank);
            }
            memcpy(order, comm->ring_order, sz);
            memcpy(pos, comm->ring_pos, sz);
            m->order = order;
            m->pos = pos;
            m->norder = comm->nchannels;
        }
    }
    for (int c = 0; c < PLAIT_COLL_COUNT; c++)
        t->small_for[c] =
            comm->fast && plait_tune_ll_coll(c) && plait_fast_eligible(comm, c, c == PLAIT_COLL_BARRIER ? 0 : 1);

    struct plait_tune_space *sp = &t->sp;
    memset(sp, 0, sizeof(*sp));
    /* Every algorithm: channels connect every pair of ranks (the default
     * rule's pairwise alltoall and linear gather/scatter are all-pairs, see
     * plait_algo_connects), so whatever the tuner picks has its peers. */
    for (int a = 1; a < PLAIT_ALGO_COUNT; a++)
        sp->allowed[a] = n < 2 || plait_algo_connects(n, comm->set.tree_radix, comm->set.algo, 0, n - 1);
    sp->max_channels = comm->nchannels;
    sp->slot_bytes = comm->set.slot_bytes;
    sp->nslots = comm->set.nslots;
    const uint64_t half = (uint64_t)(comm->set.nslots / 2) * comm->set.slot_bytes;
    sp->max_chunk_bytes = comm->set.chunk_bytes < half ? comm->set.chunk_bytes : half;
    sp->radix = comm->set.tree_radix;

    if (comm->local_rank == 0 && t->has_machine)
        PLAIT_INFO(PLAIT_SUBSYS_TUNING,
                   "rank %d: tuner: %d ranks on %d hosts, intra %s, inter %s, %d cores per host%s, small-message path "
                   "%s, up to %d channels, chunks %llu..%llu B%s%s",
                   comm->rank, n, comm->nhosts, plait_model_link_name(m->intra_link),
                   plait_model_link_name(m->inter_link), cores, cores ? "" : " (unknown)", m->ll_ok ? "on" : "off",
                   sp->max_channels, (unsigned long long)sp->slot_bytes, (unsigned long long)sp->max_chunk_bytes,
                   t->rules.n ? ", rules from " : "", t->rules.n ? t->rules_path : "");
    return PLAIT_SUCCESS;
}

void plait_tuner_free(struct plait_comm *comm)
{
    struct plait_tuner *t = comm->tuner;
    if (!t)
        return;
    comm->tuner = NULL;
    if (t->has_machine)
        plait_model_machine_free(&t->m);
    plait_tune_rules_free(&t->rules);
    free(t);
}

static uint64_t chunk_of(const struct plait_tune_space *sp, unsigned code)
{
    return code == E_CHUNK_MAX ? sp->max_chunk_bytes : sp->slot_bytes << code;
}

static unsigned chunk_code(const struct plait_tune_space *sp, uint64_t chunk)
{
    if (chunk == sp->max_chunk_bytes || sp->slot_bytes == 0)
        return E_CHUNK_MAX;
    for (unsigned i = 0; i < E_CHUNK_MAX; i++)
        if ((sp->slot_bytes << i) == chunk)
            return i;
    return E_CHUNK_MAX;
}

static uint64_t pack(int small, int dflt, int algo, int nch, unsigned chunk, float t)
{
    uint32_t tb;
    memcpy(&tb, &t, sizeof(tb));
    return E_VALID | (small ? E_SMALL : 0) | (dflt ? E_DEFAULT : 0) | ((uint64_t)(algo & 31) << 3) |
           ((uint64_t)(nch & 255) << 8) | ((uint64_t)(chunk & 63) << 16) | ((uint64_t)tb << 32);
}

static float unpack_time(uint64_t e)
{
    const uint32_t tb = (uint32_t)(e >> 32);
    float f;
    memcpy(&f, &tb, sizeof(f));
    return f;
}

/* The default rule's entry (no model, or the model did not apply). */
static uint64_t default_entry(const struct plait_comm *comm, int coll, uint64_t bytes)
{
    const struct plait_algorithm *a = plait_algo_select(coll, bytes, comm->nranks, comm->nhosts, comm->set.algo);
    return pack(0, 1, a->id, comm->nchannels, E_CHUNK_MAX, 0.0f);
}

/* Models the bucket (the model's best over every algorithm, only = AUTO; or
 * one algorithm's best configuration) and packs the answer. */
static uint64_t fill_entry(const struct plait_comm *comm, const struct plait_tuner *t, int coll, int b, int only)
{
    const uint64_t rep = plait_tune_bucket_lo(b);
    if (!t->has_machine || !plait_coll_is_scheduled(coll))
        return default_entry(comm, coll, rep);
    struct plait_model_machine m = t->m;
    m.ll_ok = m.ll_ok && t->small_for[coll];
    struct plait_tune_bucket_answer ans;
    plait_result_t s = plait_tune_model_bucket(&m, &t->sp, coll, b, only, &ans);
    /* Out of memory is this rank's alone: its peers may decide by the model,
     * so no answer (not even the default rule's) is cached; the call fails. */
    if (s == PLAIT_ERR_SYSTEM)
        return 0;
    if (s)
        return only == PLAIT_ALGO_AUTO ? default_entry(comm, coll, rep)
                                       : pack(0, 1, only, comm->nchannels, E_CHUNK_MAX, 0.0f);
    /* The best schedule too, for the sizes of the bucket above the small-message limit. */
    if (ans.sbest < 0) {
        const uint64_t d = default_entry(comm, coll, rep);
        return ans.ll ? d | E_SMALL : d;
    }
    const struct plait_tune_choice *c = &ans.cand[ans.sbest].choice;
    return pack(ans.ll, 0, c->algo, c->nchannels, chunk_code(&t->sp, c->chunk_bytes), (float)c->predicted_s);
}

/* fill_entry for a call: the model runs for milliseconds, so the
 * communicator is held busy meanwhile (as plait_exec_run holds it): an abort
 * from another thread waits for the model, then the caller sees its flag
 * (core/plan.c) before it touches anything the abort released. The tuner itself
 * lives as long as the communicator's struct (plait_tuner_free). */
static uint64_t fill_locked(struct plait_comm *comm, const struct plait_tuner *t, int coll, int b, int only)
{
    (void)plait_op_enter(comm); /* the flag is read by the planner once the tuner returns */
    const uint64_t e = fill_entry(comm, t, coll, b, only);
    plait_op_leave(comm);
    return e;
}


static void log_choice(const struct plait_comm *comm, int coll, uint64_t bytes, int esize,
                       const struct plait_tune_choice *c)
{
    const struct plait_tuner *t = comm->tuner;
    double pred = c->predicted_s;
    if (c->proto == PLAIT_MPROTO_LL && t && t->has_machine && pred == 0 && esize > 0) {
        /* the small-message path's time is not cached (closed form: cheap); only logged */
        const double ll_s = plait_tune_ll_time(&t->m, coll, bytes / (uint64_t)esize, esize);
        if (ll_s > 0)
            pred = ll_s;
    }
    char chunk[32];
    if (c->chunk_bytes >= 1024 && c->chunk_bytes % 1024 == 0)
        snprintf(chunk, sizeof(chunk), "%u KiB", c->chunk_bytes / 1024);
    else
        snprintf(chunk, sizeof(chunk), "%u B", c->chunk_bytes);
    if (c->proto == PLAIT_MPROTO_LL)
        PLAIT_INFO(PLAIT_SUBSYS_TUNING, "%s %llu B: ll (small-message path), predicted %.1f us (%s)",
                   plait_coll_name(coll), (unsigned long long)bytes, pred * 1e6, plait_tune_source_name(c->source));
    else
        PLAIT_INFO(PLAIT_SUBSYS_TUNING, "%s %llu B: %s simple %d ch %s chunk, predicted %.1f us (%s)",
                   plait_coll_name(coll), (unsigned long long)bytes, plait_algorithms[c->algo].name, c->nchannels,
                   chunk, pred * 1e6, plait_tune_source_name(c->source));
}

static void set_choice(struct plait_tune_choice *out, int algo, int proto, int nch, uint64_t chunk, int source,
                       double pred)
{
    out->algo = (uint8_t)algo;
    out->proto = (uint8_t)proto;
    out->nchannels = (uint8_t)(nch < 1 ? 1 : nch > 255 ? 255 : nch);
    out->source = (uint8_t)source;
    out->chunk_bytes = (uint32_t)(chunk > UINT32_MAX ? UINT32_MAX : chunk);
    out->predicted_s = pred;
}

/* Whether this call can go on the small-message path: the collective's
 * eligibility (plait_fast_eligible, asked once per collective at init) and the
 * call's size. The planner (core/plan.c) trusts a PLAIT_MPROTO_LL choice
 * because it is made only here. */
static int small_here(const struct plait_comm *comm, const struct plait_tuner *t, int coll, uint64_t bytes)
{
    if (!t || !t->small_for[coll] || comm->set.proto == PLAIT_PROTO_SIMPLE)
        return 0;
    return coll == PLAIT_COLL_BARRIER || (bytes > 0 && bytes <= plait_fast_max_bytes(comm));
}

/* 0, or PLAIT_ERR_SYSTEM when the model ran out of memory (nothing cached). */
static plait_result_t choose(struct plait_comm *comm, int coll, uint64_t bytes, struct plait_tune_choice *out)
{
    struct plait_tuner *t = comm->tuner;
    const uint64_t max_chunk = t ? t->sp.max_chunk_bytes : comm->set.chunk_bytes;
    if (coll < 0 || coll >= PLAIT_COLL_COUNT || !plait_coll_is_scheduled(coll)) {
        set_choice(out, PLAIT_ALGO_RING, PLAIT_MPROTO_SIMPLE, comm->nchannels, max_chunk, PLAIT_TUNE_SRC_DEFAULT, 0);
        return PLAIT_SUCCESS;
    }
    /* PLAIT_ALGO: as before the tuner, all channels and the configured chunk. */
    const int forced = comm->set.algo[coll];
    if (forced != PLAIT_ALGO_AUTO && plait_algorithms[forced].supports(coll, comm->nranks)) {
        set_choice(out, forced, PLAIT_MPROTO_SIMPLE, comm->nchannels, max_chunk, PLAIT_TUNE_SRC_FORCED, 0);
        return PLAIT_SUCCESS;
    }
    if (!t) {
        const uint64_t e = default_entry(comm, coll, bytes);
        set_choice(out, (int)((e >> 3) & 31), PLAIT_MPROTO_SIMPLE, comm->nchannels, max_chunk,
                   PLAIT_TUNE_SRC_DEFAULT, 0);
        return PLAIT_SUCCESS;
    }
    const int b = plait_tune_bucket(bytes);
    const struct plait_tune_rule *rule = t->rules.n ? plait_tune_rules_match(&t->rules, coll, bytes, comm->nranks) : NULL;
    if (rule) {
        if (rule->proto == PLAIT_MPROTO_LL && small_here(comm, t, coll, bytes)) {
            set_choice(out, PLAIT_ALGO_AUTO, PLAIT_MPROTO_LL, 1, 0, PLAIT_TUNE_SRC_FILE, 0);
            return PLAIT_SUCCESS;
        }
        /* The algorithm's best channels and chunk, cached per bucket with its
         * algorithm: a bucket that two rules split recomputes, the answer is
         * the same function of (algorithm, bucket). */
        uint64_t e = __atomic_load_n(&t->rule_cache[coll][b], __ATOMIC_ACQUIRE);
        if (!(e & E_VALID) || (int)((e >> 3) & 31) != rule->algo) {
            e = fill_locked(comm, t, coll, b, rule->algo);
            if (!(e & E_VALID))
                return PLAIT_ERR_SYSTEM;
            __atomic_store_n(&t->rule_cache[coll][b], e, __ATOMIC_RELEASE);
        }
        set_choice(out, rule->algo, PLAIT_MPROTO_SIMPLE, (int)((e >> 8) & 255),
                   chunk_of(&t->sp, (unsigned)((e >> 16) & 63)), PLAIT_TUNE_SRC_FILE, unpack_time(e));
        return PLAIT_SUCCESS;
    }
    /* The entry is published whole by one release store; a thread that finds
     * it empty computes the same bits (the model is pure) and stores them too. */
    uint64_t e = __atomic_load_n(&t->cache[coll][b], __ATOMIC_ACQUIRE);
    if (!(e & E_VALID)) {
        e = fill_locked(comm, t, coll, b, PLAIT_ALGO_AUTO);
        if (!(e & E_VALID))
            return PLAIT_ERR_SYSTEM;
        __atomic_store_n(&t->cache[coll][b], e, __ATOMIC_RELEASE);
    }
    const int dflt = (e & E_DEFAULT) != 0;
    /* Without a model, the small-message path wherever it exists (what plait
     * did before the tuner); with one, where the model put it first. Sizes of
     * the bucket above its limit take the bucket's best schedule. */
    const int want_small = dflt ? 1 : (e & E_SMALL) != 0;
    if (want_small && small_here(comm, t, coll, bytes)) {
        set_choice(out, PLAIT_ALGO_AUTO, PLAIT_MPROTO_LL, 1, 0, dflt ? PLAIT_TUNE_SRC_DEFAULT : PLAIT_TUNE_SRC_MODEL,
                   0);
        return PLAIT_SUCCESS;
    }
    int algo = (int)((e >> 3) & 31);
    if (dflt) /* the default rule is per size, not per bucket */
        algo = plait_algo_select(coll, bytes, comm->nranks, comm->nhosts, comm->set.algo)->id;
    set_choice(out, algo, PLAIT_MPROTO_SIMPLE, (int)((e >> 8) & 255), chunk_of(&t->sp, (unsigned)((e >> 16) & 63)),
               dflt ? PLAIT_TUNE_SRC_DEFAULT : PLAIT_TUNE_SRC_MODEL, unpack_time(e));
    return PLAIT_SUCCESS;
}

plait_result_t plait_tuner_choose(struct plait_comm *comm, int coll, uint64_t bytes, int esize,
                                  struct plait_tune_choice *out)
{
    if (choose(comm, coll, bytes, out))
        return plait_error(PLAIT_ERR_SYSTEM, "rank %d: the tuner ran out of memory modelling %s of %llu B",
                           comm->rank, plait_coll_name(coll), (unsigned long long)bytes);
    if (out->nchannels > comm->nchannels)
        out->nchannels = (uint8_t)comm->nchannels;
    /* PLAIT_MIN_CTAS / the config's minCTAs: a lower bound per call too. */
    const int min_ch = comm->config_min_channels > 0 ? comm->config_min_channels : comm->set.min_channels;
    if (out->proto == PLAIT_MPROTO_SIMPLE && min_ch > 0 && out->nchannels < min_ch)
        out->nchannels = (uint8_t)(min_ch < comm->nchannels ? min_ch : comm->nchannels);
    if (plait_log_enabled(PLAIT_LOG_INFO, PLAIT_SUBSYS_TUNING))
        log_choice(comm, coll, bytes, esize, out);
    return PLAIT_SUCCESS;
}
