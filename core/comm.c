/* Communicators' lifecycle: creation (rank, all, split; core/init_env.c makes
 * one from the environment through plait_comm_init_internal), the node map,
 * finalize, destroy, abort, the asynchronous error and the small queries; the
 * result strings; the process identity and fork hooks. Which transport joins
 * each pair of ranks is core/comm_transport.c; dead peers are
 * core/comm_liveness.c; registrations core/comm_register.c; premultiplied-sum
 * operators core/premulsum.c. */
#define _GNU_SOURCE
#include "core/comm.h"

#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bootstrap/bootstrap.h"
#include "core/cuda/cu.h"
#include "core/cuda/cuda.h"
#include "base/handle.h"
#include "base/log.h"
#include "base/net.h"
#include "core/tuner_comm.h"
#include "base/util.h"

/* ------------------------------------------------------------ results, version */

static const char *const result_strings[PLAIT_NUM_RESULTS] = {
    [PLAIT_SUCCESS] = "no error",
    [PLAIT_ERR_UNHANDLED_CUDA] = "unhandled cuda error (run with PLAIT_DEBUG=INFO for details)",
    [PLAIT_ERR_SYSTEM] = "unhandled system error (run with PLAIT_DEBUG=INFO for details)",
    [PLAIT_ERR_INTERNAL] = "internal error - please report this issue to the plait developers",
    [PLAIT_ERR_INVALID_ARGUMENT] = "invalid argument (run with PLAIT_DEBUG=WARN for details)",
    [PLAIT_ERR_INVALID_USAGE] = "invalid usage (run with PLAIT_DEBUG=WARN for details)",
    [PLAIT_ERR_REMOTE] = "remote process exited or there was a network error",
    [PLAIT_IN_PROGRESS] = "operation in progress",
    [PLAIT_ERR_TIMEOUT] = "operation timed out",
};

const char *plait_get_error_string(plait_result_t result)
{
    if ((int)result < 0 || result >= PLAIT_NUM_RESULTS)
        return "unknown result code";
    return result_strings[result];
}

plait_result_t plait_get_version(int *version)
{
    if (!version)
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "plait_get_version: version is NULL");
    *version = PLAIT_VERSION_CODE;
    return PLAIT_SUCCESS;
}

const char *plait_get_last_error(plait_comm_t comm)
{
    /* Any pointer may be passed (the unwritten handle of a failed init). */
    if (plait_handle_live(PLAIT_HANDLE_COMM, comm) && plait_comm_is_live(comm)) {
        pthread_mutex_lock(&comm->async_lock);
        int has = comm->async_error != PLAIT_SUCCESS && comm->async_error != PLAIT_IN_PROGRESS;
        pthread_mutex_unlock(&comm->async_lock);
        if (has)
            return comm->async_msg;
    }
    return plait_last_error_get();
}

/* ------------------------------------------------------------ identity */

void plait_host_identity(char *buf, size_t len)
{
    char host[256] = "";
    gethostname(host, sizeof(host) - 1);
    struct stat sb;
    if (stat("/proc/self/ns/net", &sb) == 0)
        snprintf(buf, len, "%s/netns:%llu", host, (unsigned long long)sb.st_ino);
    else
        snprintf(buf, len, "%s", host);
}

static pthread_mutex_t token_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t grave_lock = PTHREAD_MUTEX_INITIALIZER;

/* The library's own locks are held across fork, so that a child never inherits
 * one locked by a thread it does not have. */
static void locks_prefork(void)
{
    pthread_mutex_lock(&token_lock);
    pthread_mutex_lock(&grave_lock);
}

static void locks_postfork(void)
{
    pthread_mutex_unlock(&grave_lock);
    pthread_mutex_unlock(&token_lock);
}

/* getpid() is a system call (glibc no longer caches it), too slow for the
 * check every call makes: the pid is cached, and forgotten in a child. */
static pid_t pid_cache;

static void locks_postfork_child(void)
{
    __atomic_store_n(&pid_cache, 0, __ATOMIC_RELAXED);
    locks_postfork();
}

static void register_atfork(void)
{
    pthread_atfork(locks_prefork, locks_postfork, locks_postfork_child);
}

static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;

void plait_fork_hooks(void)
{
    pthread_once(&atfork_once, register_atfork);
}

pid_t plait_self_pid(void)
{
    pid_t p = __atomic_load_n(&pid_cache, __ATOMIC_RELAXED);
    if (!p) {
        p = getpid();
        __atomic_store_n(&pid_cache, p, __ATOMIC_RELAXED);
    }
    return p;
}

uint64_t plait_process_token(void)
{
    /* Redrawn after fork (the pid changes), so a child is never taken for its
     * parent's threads. */
    static pid_t token_pid;
    static uint64_t token;
    pthread_mutex_t *lock = &token_lock;
    pthread_mutex_lock(lock);
    if (token_pid != getpid()) {
        plait_random_bytes(&token, sizeof(token));
        token_pid = getpid();
    }
    uint64_t t = token;
    pthread_mutex_unlock(lock);
    return t;
}

/* ------------------------------------------------------------ async state */

void plait_comm_set_async_error(struct plait_comm *comm, plait_result_t res, const char *msg)
{
    pthread_mutex_lock(&comm->async_lock);
    if (comm->async_error == PLAIT_SUCCESS || comm->async_error == PLAIT_IN_PROGRESS) {
        comm->async_error = res;
        snprintf(comm->async_msg, sizeof(comm->async_msg), "%s", msg ? msg : "");
    }
    pthread_mutex_unlock(&comm->async_lock);
}

void plait_comm_async_msg(struct plait_comm *comm, char *buf, size_t len)
{
    pthread_mutex_lock(&comm->async_lock);
    snprintf(buf, len, "%s", comm->async_msg);
    pthread_mutex_unlock(&comm->async_lock);
}

plait_result_t plait_comm_handle_error(struct plait_comm *comm, const char *fn)
{
    if (!comm)
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "%s: comm is NULL", fn);
    /* The registry first: nothing is read through a handle it does not hold. */
    if (!plait_handle_live(PLAIT_HANDLE_COMM, comm)) {
        if (plait_handle_live(PLAIT_HANDLE_COMM_ABORTED, comm))
            return plait_error(PLAIT_ERR_INVALID_ARGUMENT,
                               "%s: comm %p was aborted (plait_comm_abort frees the communicator)", fn, (void *)comm);
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT,
                           "%s: comm %p is not a live communicator (destroyed, or never made by plait_comm_init_*)",
                           fn, (void *)comm);
    }
    /* An abort on another thread flips the magic before it leaves the registry. */
    return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "%s: comm %p is being aborted (plait_comm_abort)", fn,
                       (void *)comm);
}

plait_result_t plait_comm_check(struct plait_comm *comm, const char *fn)
{
    plait_result_t status = plait_comm_check_handle(comm, fn);
    if (status)
        return status;
    if (__atomic_load_n(&comm->init_pending, __ATOMIC_ACQUIRE))
        return plait_error(PLAIT_ERR_INVALID_USAGE,
                           "%s: the communicator is still initializing (poll plait_comm_get_async_error)", fn);
    if (__atomic_load_n(&comm->in_error, __ATOMIC_ACQUIRE)) {
        char why[sizeof(comm->async_msg)];
        plait_comm_async_msg(comm, why, sizeof(why));
        return plait_error(PLAIT_ERR_INVALID_USAGE, "%s: the communicator is in error after: %s", fn, why);
    }
    if (comm->finalized)
        return plait_error(PLAIT_ERR_INVALID_USAGE, "%s: the communicator is finalized", fn);
    if (plait_aborted(&comm->abort_flag))
        return plait_error(PLAIT_ERR_INVALID_USAGE, "%s: the communicator was aborted", fn);
    if (comm->owner_pid != plait_self_pid())
        return plait_error(PLAIT_ERR_INVALID_USAGE,
                           "%s: the communicator belongs to process %d; a forked child cannot use it (only destroy it)",
                           fn, (int)comm->owner_pid);
    return PLAIT_SUCCESS;
}

/* ------------------------------------------------------------ init */

struct rank_card {
    struct plait_rank_info info;
    struct plait_settings set;
};

/* Releases everything the communicator holds except its own struct, which a
 * thread racing with plait_comm_abort may still read (its magic, flags and
 * counters) and so outlives the abort for a while (see graveyard_push), and
 * its tuner, which such a thread, past the validity check, may be asking for
 * a choice (freed with the struct). */
static void comm_release(struct plait_comm *comm)
{
    /* First: it waits for the device's last launch and stops the proxy,
     * which uses the TCP connections torn down below. */
    plait_cuda_comm_free(comm);
    plait_cuda_ce_free(comm); /* windows of a communicator without device state too (idempotent) */
    plait_comm_transports_teardown(comm);
    plait_comm_unwatch_peers(comm);
    plait_bootstrap_close(comm->bs);
    plait_comm_regs_free(comm);
    free(comm->pidfds);
    free(comm->peer_exited);
    free(comm->peer_ops);
    free(comm->conns);
    free(comm->tp_of);
    free(comm->ranks);
    free(comm->host_of);
    free(comm->ring_order);
    comm->ring_order = NULL;
    free(comm->ring_pos);
    comm->ring_pos = NULL;
    comm->host_of = NULL;
    free(__atomic_exchange_n(&comm->scratch_cache, NULL, __ATOMIC_ACQ_REL));
    comm->bs = NULL;
    comm->pidfds = NULL;
    comm->peer_exited = NULL;
    comm->peer_ops = NULL;
    comm->conns = NULL;
    comm->tp_of = NULL;
    comm->ranks = NULL;
}

static void comm_free(struct plait_comm *comm)
{
    if (!comm)
        return;
    if (comm->internal_stream && comm->owner_pid == getpid())
        plait_stream_destroy(comm->internal_stream);
    comm->internal_stream = NULL;
    plait_handle_remove(PLAIT_HANDLE_COMM, comm);
    comm_release(comm);
    plait_tuner_free(comm);
    pthread_mutex_destroy(&comm->async_lock);
    pthread_mutex_destroy(&comm->peers_lock);
    pthread_mutex_destroy(&comm->conn_lock);
    comm->magic = 0;
    plait_handle_retire(PLAIT_HANDLE_COMM, comm); /* its address is not given to the next communicator at once */
}

#define PLAIT_COMM_DEAD 0x646561642d636f6dull
#define GRAVE_SECONDS 30.0

static struct plait_comm *graveyard;

/* Keeps an aborted communicator's struct readable for GRAVE_SECONDS: a thread
 * that was entering a call when the abort came then finds a dead magic or a
 * raised abort flag, instead of freed memory. Older graves are freed here. */
static void graveyard_push(struct plait_comm *comm)
{
    double now = plait_now();
    __atomic_store_n(&comm->magic, PLAIT_COMM_DEAD, __ATOMIC_RELEASE);
    comm->dead_since = now;
    /* Calls on it now say "aborted" (if the registry has no room for that,
     * "not a live communicator"). */
    plait_handle_add(PLAIT_HANDLE_COMM_ABORTED, comm);
    plait_handle_remove(PLAIT_HANDLE_COMM, comm);
    /* The expired graves are freed after grave_lock is released: the
     * registry's lock is never taken under it. A fork takes the registry's
     * lock before grave_lock (its prepare handlers run in reverse order of
     * registration, and the registry's are registered after these), so
     * taking them the other way round here could deadlock a fork on
     * another thread. */
    struct plait_comm *expired = NULL;
    pthread_mutex_lock(&grave_lock);
    struct plait_comm **pp = &graveyard;
    while (*pp) {
        struct plait_comm *g = *pp;
        if (now - g->dead_since > GRAVE_SECONDS) {
            *pp = g->grave_next;
            g->grave_next = expired;
            expired = g;
        } else {
            pp = &g->grave_next;
        }
    }
    comm->grave_next = graveyard;
    graveyard = comm;
    pthread_mutex_unlock(&grave_lock);
    while (expired) {
        struct plait_comm *g = expired;
        expired = g->grave_next;
        plait_handle_remove(PLAIT_HANDLE_COMM_ABORTED, g);
        plait_tuner_free(g);
        pthread_mutex_destroy(&g->async_lock);
        pthread_mutex_destroy(&g->peers_lock);
        plait_handle_retire(PLAIT_HANDLE_COMM, g);
    }
}

static struct plait_comm *comm_alloc(int rank, int nranks, const plait_config_t *config)
{
    pthread_once(&atfork_once, register_atfork);
    struct plait_comm *comm = calloc(1, sizeof(*comm));
    if (!comm)
        return NULL;
    comm->magic = PLAIT_COMM_MAGIC;
    comm->rank = rank;
    comm->nranks = nranks;
    comm->dead_peer = -1;
    comm->dead_reporter = -1;
    comm->blocking = 1;
    comm->config_max_channels = 0;
    comm->my_ops = comm->local_ops;
    comm->owner_pid = getpid();
    if (plait_handle_add(PLAIT_HANDLE_COMM, comm) != 0) {
        free(comm);
        return NULL;
    }
    pthread_mutex_init(&comm->async_lock, NULL);
    pthread_mutex_init(&comm->peers_lock, NULL);
    pthread_mutex_init(&comm->conn_lock, NULL);
    if (config) {
        if (config->blocking != PLAIT_CONFIG_UNDEF_INT)
            comm->blocking = config->blocking != 0;
        if (config->max_ctas != PLAIT_CONFIG_UNDEF_INT && config->max_ctas > 0)
            comm->config_max_channels = config->max_ctas;
        else if (config->max_ctas == 0)
            comm->config_max_channels = -1; /* no CTA of their own for device collectives (core/cuda/launch.c) */
        if (config->min_ctas != PLAIT_CONFIG_UNDEF_INT && config->min_ctas > 0)
            comm->config_min_channels = config->min_ctas;
        if (config->name)
            snprintf(comm->name, sizeof(comm->name), "%s", config->name);
    }
    return comm;
}

static plait_result_t check_config(const plait_config_t *config, const char *fn)
{
    if (!config)
        return PLAIT_SUCCESS;
    if (config->magic != PLAIT_CONFIG_MAGIC)
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT,
                           "%s: config has magic 0x%x, not 0x%x: initialise it with PLAIT_CONFIG_INITIALIZER", fn,
                           config->magic, PLAIT_CONFIG_MAGIC);
    if (config->size < offsetof(plait_config_t, blocking) + sizeof(int) || config->size > 4096)
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "%s: config->size %zu is not a plait_config_t size", fn,
                           config->size);
    if (config->blocking != PLAIT_CONFIG_UNDEF_INT && config->blocking != 0 && config->blocking != 1)
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "%s: config->blocking is %d (0 or 1)", fn, config->blocking);
    return PLAIT_SUCCESS;
}

/* Copies only the fields a caller's (possibly older, smaller) config has. */
static void config_read(const plait_config_t *in, plait_config_t *out)
{
    plait_config_t def = PLAIT_CONFIG_INITIALIZER;
    *out = def;
    if (!in)
        return;
    size_t n = in->size < sizeof(*out) ? in->size : sizeof(*out);
    memcpy(out, in, n);
    out->size = sizeof(*out);
}

static plait_result_t comm_setup(struct plait_comm *comm, const plait_unique_id_t *id, int start_root)
{
    plait_result_t status;
    const int n = comm->nranks, me = comm->rank;
    struct rank_card *cards = NULL;

    if ((status = plait_settings_load(&comm->set)))
        return status;
    /* The config's channel bounds (max_ctas, min_ctas) win over the
     * environment's (PLAIT_MAX_CTAS, PLAIT_MIN_CTAS), in NCCL's order. */
    int lo = comm->config_min_channels > 0 ? comm->config_min_channels : comm->set.min_channels;
    int hi = comm->config_max_channels > 0   ? comm->config_max_channels
             : comm->config_max_channels < 0 ? 0
                                             : comm->set.max_channels;
    if (lo > 0 && comm->set.nchannels < lo)
        comm->set.nchannels = lo > 32 ? 32 : lo;
    if (hi > 0 && comm->set.nchannels > hi)
        comm->set.nchannels = hi;
    comm->nchannels = comm->set.nchannels;
    comm->ncls = comm->nchannels + 2; /* + the small-message class + point-to-point */
    /* The tuning files before the exchange: their hashes are agreed settings. */
    if ((status = plait_tuner_prepare(comm)))
        return status;

    struct plait_bootstrap_opts opts = {
        .timeout_s = comm->set.timeout_s,
        .abort_flag = &comm->abort_flag,
        .ifname_spec = comm->set.ifname,
        .start_root = start_root,
    };
    if ((status = plait_bootstrap_init(id, me, n, &opts, &comm->bs)))
        return plait_error_context(status, "rank %d of %d: bootstrap", me, n);

    cards = calloc((size_t)n, sizeof(*cards));
    comm->ranks = calloc((size_t)n, sizeof(*comm->ranks));
    comm->conns = calloc((size_t)n * (size_t)comm->ncls, sizeof(*comm->conns));
    comm->tp_of = calloc((size_t)n, 1);
    comm->pidfds = malloc(sizeof(int) * (size_t)n);
    comm->peer_exited = calloc((size_t)n, 1);
    comm->peer_ops = calloc((size_t)n, sizeof(*comm->peer_ops));
    comm->host_of = calloc((size_t)n * 2, sizeof(int32_t));
    if (!cards || !comm->ranks || !comm->conns || !comm->tp_of || !comm->pidfds || !comm->peer_exited ||
        !comm->peer_ops || !comm->host_of) {
        status = plait_error(PLAIT_ERR_SYSTEM, "init: out of memory for %d ranks", n);
        goto out;
    }
    for (int p = 0; p < n; p++)
        comm->pidfds[p] = -1;
    struct plait_rank_info *mine = &cards[me].info;
    snprintf(mine->hostid, sizeof(mine->hostid), "%s", comm->set.hostid);
    gethostname(mine->hostname, sizeof(mine->hostname) - 1);
    mine->process_token = plait_process_token();
    mine->pid = (int32_t)getpid();
    if ((status = plait_comm_topo_describe(comm, mine)))
        goto out;
    cards[me].set = comm->set;
    if ((status = plait_bootstrap_allgather(comm->bs, cards, sizeof(*cards))))
        goto out;

    /* Every setting that changes the schedule or the framing must agree. */
    for (int p = 0; p < n; p++) {
        char diff[128];
        const char *what = plait_settings_diff(&cards[0].set, &cards[p].set, diff, sizeof(diff));
        if (what) {
            status = plait_error(PLAIT_ERR_INVALID_USAGE,
                                 "init: rank %d (host %.64s) has a different %s than rank 0 (%s); every rank must use "
                                 "the same value",
                                 p, cards[p].info.hostname, what, diff);
            goto out;
        }
    }

    /* Node map: hosts numbered in order of first appearance. */
    comm->nhosts = 0;
    for (int p = 0; p < n; p++) {
        comm->ranks[p] = cards[p].info;
        comm->ranks[p].hostid[sizeof(comm->ranks[p].hostid) - 1] = '\0';
        comm->ranks[p].hostname[sizeof(comm->ranks[p].hostname) - 1] = '\0';
        int h = -1, local = 0;
        for (int q = 0; q < p; q++) {
            if (strcmp(comm->ranks[q].hostid, comm->ranks[p].hostid) == 0) {
                h = comm->ranks[q].host_index;
                local++;
            }
        }
        if (h < 0)
            h = comm->nhosts++;
        comm->ranks[p].host_index = h;
        comm->ranks[p].local_rank = local;
        comm->host_of[p] = h;
        comm->host_of[n + p] = local;
    }
    comm->host_index = comm->ranks[me].host_index;
    comm->local_rank = comm->ranks[me].local_rank;
    comm->nlocal = 0;
    for (int p = 0; p < n; p++)
        if (comm->ranks[p].host_index == comm->host_index)
            comm->nlocal++;
    if (comm->set.spin_us >= 0) {
        comm->spin_ns = comm->set.spin_us * 1000;
    } else {
        /* Polling a core that a peer on this host needs costs it a whole
         * scheduler tick: with more local ranks than cores, yield at once. */
        cpu_set_t cpus;
        int ncpu = sched_getaffinity(0, sizeof(cpus), &cpus) == 0 ? CPU_COUNT(&cpus) : 1;
        comm->spin_ns = comm->nlocal > ncpu ? 0 : 20000;
    }

    if ((status = plait_comm_topo_setup(comm)))
        goto out;

    if ((status = plait_comm_transports_setup(comm)))
        goto out;
    /* Device FIFOs beside the host connections, when this rank's thread has a
     * current CUDA context (collective: every rank agrees). */
    if ((status = plait_cuda_comm_setup(comm)))
        goto out;

    /* After the transports: the small-message boxes decide whether LL exists. */
    if ((status = plait_tuner_init(comm)))
        goto out;

    plait_comm_watch_peers(comm);

    if ((status = plait_bootstrap_barrier(comm->bs)))
        goto out;

    if (plait_log_level() >= PLAIT_LOG_INFO) {
        char line[512];
        size_t o = 0;
        for (int p = 0; p < n && o < sizeof(line) - 32; p++)
            o += (size_t)snprintf(line + o, sizeof(line) - o, "%s%d:%s", p ? " " : "", p,
                                  plait_comm_transport_name(comm, p));
        PLAIT_INFO(PLAIT_SUBSYS_INIT,
                   "plait %d.%d.%d: rank %d of %d%s%s on %s (host %d of %d, local rank %d of %d), %d channels, "
                   "transports %s",
                   PLAIT_MAJOR, PLAIT_MINOR, PLAIT_PATCH, me, n, comm->name[0] ? " of " : "", comm->name,
                   comm->ranks[me].hostname, comm->host_index, comm->nhosts, comm->local_rank, comm->nlocal,
                   comm->nchannels, line);
    }
out:
    free(cards);
    if (!status)
        comm->init_done = 1;
    return status;
}

struct init_job {
    struct plait_comm *comm;
    plait_unique_id_t id;
    int start_root;
    void *cu_ctx; /* the caller's current CUDA context, made current on the init thread */
};

static void *init_thread_main(void *arg)
{
    struct init_job *job = arg;
    struct plait_comm *comm = job->comm;
    if (job->cu_ctx)
        plait_cu_get()->CtxSetCurrent(job->cu_ctx);
    plait_result_t res = comm_setup(comm, &job->id, job->start_root);
    if (res) {
        /* the error first: a call must never see "not pending" on a
         * communicator whose setup failed */
        plait_comm_set_async_error(comm, res, plait_last_error_get());
        __atomic_store_n(&comm->in_error, 1, __ATOMIC_RELEASE);
        __atomic_store_n(&comm->init_pending, 0, __ATOMIC_RELEASE);
    } else {
        /* not pending before success is published: a caller that sees
         * PLAIT_SUCCESS from plait_comm_get_async_error may call at once */
        __atomic_store_n(&comm->init_pending, 0, __ATOMIC_RELEASE);
        pthread_mutex_lock(&comm->async_lock);
        if (comm->async_error == PLAIT_IN_PROGRESS)
            comm->async_error = PLAIT_SUCCESS;
        pthread_mutex_unlock(&comm->async_lock);
    }
    free(job);
    return NULL;
}

plait_result_t plait_comm_init_internal(plait_comm_t *comm_out, int nranks, const plait_unique_id_t *id, int rank,
                                        const plait_config_t *user_config, int start_root, const char *fn)
{
    plait_log_configure();
    if (!comm_out)
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "%s: comm_out is NULL", fn);
    if (nranks < 1)
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "%s: nranks is %d (must be >= 1)", fn, nranks);
    if (rank < 0 || rank >= nranks)
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "%s: rank %d is out of range [0, %d)", fn, rank, nranks);
    plait_result_t status = check_config(user_config, fn);
    if (status)
        return status;
    plait_config_t config;
    config_read(user_config, &config);
    struct plait_comm *comm = comm_alloc(rank, nranks, &config);
    if (!comm)
        return plait_error(PLAIT_ERR_SYSTEM, "%s: out of memory", fn);

    if (!comm->blocking) {
        /* Calls on the NULL stream of a non-blocking communicator run on this
         * stream; made now, so no call ever races to create it. */
        if (plait_stream_create_internal(comm, &comm->internal_stream) != PLAIT_SUCCESS) {
            comm_free(comm);
            return plait_error(PLAIT_ERR_SYSTEM, "%s: cannot start the communicator's stream", fn);
        }
        struct init_job *job = malloc(sizeof(*job));
        if (!job) {
            comm_free(comm);
            return plait_error(PLAIT_ERR_SYSTEM, "%s: out of memory", fn);
        }
        job->comm = comm;
        job->id = *id;
        job->start_root = start_root;
        /* The device is the caller's current one (as NCCL's), not the init
         * thread's (which has none). */
        job->cu_ctx = NULL;
        const struct plait_cu *cu = plait_cu_get();
        if (cu && cu->CtxGetCurrent(&job->cu_ctx) != PLAIT_CU_SUCCESS)
            job->cu_ctx = NULL;
        comm->async_error = PLAIT_IN_PROGRESS;
        comm->init_pending = 1;
        if (pthread_create(&comm->init_thread, NULL, init_thread_main, job) != 0) {
            free(job);
            comm_free(comm);
            return plait_error(PLAIT_ERR_SYSTEM, "%s: cannot start the init thread", fn);
        }
        comm->has_init_thread = 1;
        *comm_out = comm;
        return PLAIT_IN_PROGRESS;
    }
    status = comm_setup(comm, id, start_root);
    if (status) {
        comm_free(comm);
        return status;
    }
    *comm_out = comm;
    return PLAIT_SUCCESS;
}

/* With PLAIT_COMM_ID the id names a fixed address and rank 0 hosts the root
 * (plait_get_unique_id made no root). */
static int comm_id_starts_root(const plait_unique_id_t *id, int rank)
{
    const struct plait_uid *u = (const struct plait_uid *)id->internal;
    const char *fixed = plait_env_get("PLAIT_COMM_ID");
    if (!fixed || !*fixed || rank != 0 || u->magic != PLAIT_UID_MAGIC)
        return 0;
    union plait_sockaddr a;
    return plait_sock_parse_addr(fixed, &a) == PLAIT_SUCCESS && memcmp(&a, &u->root, sizeof(a)) == 0;
}

plait_result_t plait_comm_init_rank_config(plait_comm_t *comm_out, int nranks, plait_unique_id_t id, int rank,
                                           const plait_config_t *config)
{
    return plait_comm_init_internal(comm_out, nranks, &id, rank, config, comm_id_starts_root(&id, rank),
                                    "plait_comm_init_rank_config");
}

plait_result_t plait_comm_init_rank(plait_comm_t *comm_out, int nranks, plait_unique_id_t id, int rank)
{
    return plait_comm_init_internal(comm_out, nranks, &id, rank, NULL, comm_id_starts_root(&id, rank),
                                    "plait_comm_init_rank");
}

plait_result_t plait_get_unique_id(plait_unique_id_t *id)
{
    plait_log_configure();
    if (!id)
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "plait_get_unique_id: id is NULL");
    struct plait_settings set;
    plait_result_t status = plait_settings_load(&set);
    if (status)
        return status;
    const char *fixed = plait_env_get("PLAIT_COMM_ID");
    if (fixed && *fixed) {
        union plait_sockaddr a;
        if ((status = plait_sock_parse_addr(fixed, &a)))
            return plait_error_context(status, "PLAIT_COMM_ID");
        uint8_t secret[PLAIT_SECRET_BYTES];
        int has_secret = 0;
        if ((status = plait_secret_from_env(secret, &has_secret)))
            return status;
        if (!has_secret) {
            char where[320];
            snprintf(where, sizeof(where), "PLAIT_COMM_ID=%s", fixed);
            plait_bootstrap_warn_unauthenticated(where);
        }
        plait_bootstrap_uid_from_addr(&a, has_secret ? secret : NULL, id);
        return PLAIT_SUCCESS;
    }
    return plait_bootstrap_create_root(set.ifname, NULL, set.timeout_s, id);
}

/* ------------------------------------------------------------ init_all */

struct init_all_arg {
    plait_unique_id_t id;
    int nranks;
    int rank;
    int device; /* devlist[rank], -1: none (host only) */
    plait_comm_t comm;
    plait_result_t res;
    char msg[1024];
};

static void *init_all_thread(void *p)
{
    struct init_all_arg *a = p;
    if (a->device >= 0) {
        /* The device's primary context, current on this thread for the
         * init (retained for the process's life, as cudaSetDevice does). */
        const struct plait_cu *cu = plait_cu_get();
        void *ctx = NULL;
        int r = cu ? cu->DevicePrimaryCtxRetain(&ctx, a->device) : -1;
        if (!r)
            r = cu->CtxSetCurrent(ctx);
        if (r) {
            a->res = PLAIT_ERR_UNHANDLED_CUDA;
            snprintf(a->msg, sizeof(a->msg), "device %d: cannot make its primary context current (%s)", a->device,
                     cu ? "cuDevicePrimaryCtxRetain/cuCtxSetCurrent failed" : "no CUDA driver");
            return NULL;
        }
    }
    a->res = plait_comm_init_rank(&a->comm, a->nranks, a->id, a->rank);
    if (a->res)
        snprintf(a->msg, sizeof(a->msg), "%s", plait_last_error_get());
    return NULL;
}

plait_result_t plait_comm_init_all(plait_comm_t *comms_out, int ndev, const int *devlist)
{
    plait_log_configure();
    if (!comms_out)
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "plait_comm_init_all: comms_out is NULL");
    if (ndev < 1)
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "plait_comm_init_all: ndev is %d (must be >= 1)", ndev);
    plait_unique_id_t id;
    struct plait_settings set;
    plait_result_t status = plait_settings_load(&set);
    if (status)
        return status;
    /* An in-process root on loopback: these ranks never leave the process. */
    union plait_sockaddr lo;
    memset(&lo, 0, sizeof(lo));
    lo.sin.sin_family = AF_INET;
    lo.sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if ((status = plait_bootstrap_create_root("lo", &lo, set.timeout_s, &id)))
        return status;
    struct init_all_arg *args = calloc((size_t)ndev, sizeof(*args));
    pthread_t *threads = calloc((size_t)ndev, sizeof(*threads));
    if (!args || !threads) {
        free(args);
        free(threads);
        return plait_error(PLAIT_ERR_SYSTEM, "plait_comm_init_all: out of memory");
    }
    int started = 0;
    for (int r = 0; r < ndev; r++) {
        args[r].id = id;
        args[r].nranks = ndev;
        args[r].rank = r;
        args[r].device = devlist ? devlist[r] : -1;
        if (pthread_create(&threads[r], NULL, init_all_thread, &args[r]) != 0) {
            status = plait_error(PLAIT_ERR_SYSTEM, "plait_comm_init_all: cannot start thread %d", r);
            break;
        }
        started++;
    }
    for (int r = 0; r < started; r++)
        pthread_join(threads[r], NULL);
    if (!status)
        for (int r = 0; r < ndev; r++)
            if (args[r].res) {
                status = plait_error(args[r].res, "plait_comm_init_all: rank %d: %s", r, args[r].msg);
                break;
            }
    if (status) {
        for (int r = 0; r < started; r++)
            if (args[r].res == PLAIT_SUCCESS)
                plait_comm_destroy(args[r].comm);
    } else {
        for (int r = 0; r < ndev; r++)
            comms_out[r] = args[r].comm;
    }
    free(args);
    free(threads);
    return status;
}

/* ------------------------------------------------------------ split */

struct split_card {
    int32_t color;
    int32_t key;
    plait_unique_id_t id;
};

plait_result_t plait_comm_split(plait_comm_t comm, int color, int key, plait_comm_t *newcomm_out,
                                const plait_config_t *config)
{
    plait_result_t status = plait_comm_check(comm, "plait_comm_split");
    if (status)
        return status;
    if (!newcomm_out)
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "plait_comm_split: newcomm_out is NULL");
    if (color < PLAIT_SPLIT_NOCOLOR)
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "plait_comm_split: color %d is negative", color);
    if ((status = check_config(config, "plait_comm_split")))
        return status;
    const int n = comm->nranks, me = comm->rank;
    struct split_card *cards = calloc((size_t)n, sizeof(*cards));
    if (!cards)
        return plait_error(PLAIT_ERR_SYSTEM, "plait_comm_split: out of memory");
    cards[me].color = color;
    cards[me].key = key;
    /* Round 1: colors and keys. The lowest parent rank of each color hosts the
     * child's root; round 2 hands its id to the others. */
    if ((status = plait_bootstrap_allgather(comm->bs, cards, sizeof(*cards))))
        goto out;
    int leader = -1;
    for (int p = 0; p < n && color != PLAIT_SPLIT_NOCOLOR; p++)
        if (cards[p].color == color) {
            leader = p;
            break;
        }
    plait_result_t root_status = PLAIT_SUCCESS;
    if (leader == me)
        root_status = plait_bootstrap_create_root(comm->set.ifname, NULL, comm->set.timeout_s, &cards[me].id);
    if ((status = plait_bootstrap_allgather(comm->bs, cards, sizeof(*cards))))
        goto out;
    if (root_status) {
        status = root_status;
        goto out;
    }
    if (color == PLAIT_SPLIT_NOCOLOR) {
        *newcomm_out = NULL;
        goto out;
    }
    int newrank = 0, newn = 0;
    for (int p = 0; p < n; p++) {
        if (cards[p].color != color)
            continue;
        newn++;
        if (cards[p].key < key || (cards[p].key == key && p < me))
            newrank++;
    }
    plait_config_t cfg;
    if (config)
        config_read(config, &cfg);
    else {
        config_read(NULL, &cfg);
        cfg.blocking = comm->blocking;
        if (comm->config_max_channels > 0)
            cfg.max_ctas = comm->config_max_channels;
        else if (comm->config_max_channels < 0)
            cfg.max_ctas = 0;
        if (comm->config_min_channels > 0)
            cfg.min_ctas = comm->config_min_channels;
    }
    status = plait_comm_init_internal(newcomm_out, newn, &cards[leader].id, newrank, &cfg, 0, "plait_comm_split");
out:
    free(cards);
    return status;
}

/* ------------------------------------------------------------ finalize, destroy, abort */

static void wait_init(struct plait_comm *comm)
{
    if (comm->has_init_thread) {
        pthread_join(comm->init_thread, NULL);
        comm->has_init_thread = 0;
    }
}

plait_result_t plait_comm_finalize(plait_comm_t comm)
{
    plait_result_t hs = plait_comm_check_handle(comm, "plait_comm_finalize");
    if (hs)
        return hs;
    if (comm->owner_pid != getpid())
        return plait_error(PLAIT_ERR_INVALID_USAGE,
                           "plait_comm_finalize: the communicator belongs to process %d; a forked child can only "
                           "destroy it",
                           (int)comm->owner_pid);
    wait_init(comm);
    plait_result_t status = PLAIT_SUCCESS;
    if (comm->internal_stream)
        status = plait_stream_synchronize(comm->internal_stream);
    comm->finalized = 1;
    pthread_mutex_lock(&comm->async_lock);
    plait_result_t async = comm->async_error;
    char why[sizeof(comm->async_msg)];
    snprintf(why, sizeof(why), "%s", comm->async_msg);
    pthread_mutex_unlock(&comm->async_lock);
    if (!status && async != PLAIT_SUCCESS && async != PLAIT_IN_PROGRESS)
        status = plait_error(async, "%s", why);
    return status;
}

plait_result_t plait_comm_destroy(plait_comm_t comm)
{
    if (!comm)
        return PLAIT_SUCCESS;
    plait_result_t hs = plait_comm_check_handle(comm, "plait_comm_destroy");
    if (hs)
        return hs;
    /* Out of the registry first: of two destroys at once, only the one that
     * took it out goes on; calls on it from now on are refused. */
    if (!plait_handle_remove(PLAIT_HANDLE_COMM, comm))
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT,
                           "plait_comm_destroy: comm %p was destroyed or aborted by another thread meanwhile",
                           (void *)comm);
    if (comm->owner_pid == getpid()) {
        wait_init(comm);
        if (comm->internal_stream) {
            plait_stream_destroy(comm->internal_stream);
            comm->internal_stream = NULL;
        }
        /* Work queued on user streams still uses the communicator: it ends (or
         * fails at its deadline, or at once after an abort) before we free. */
        while (__atomic_load_n(&comm->inflight, __ATOMIC_ACQUIRE) > 0)
            usleep(500);
    }
    /* A forked child holds copies of its parent's communicators, without the
     * threads behind them: it frees its copies of memory and descriptors (which
     * the parent does not share) and never waits for, unlinks or announces
     * anything. */
    comm_free(comm);
    return PLAIT_SUCCESS;
}

plait_result_t plait_comm_abort(plait_comm_t comm)
{
    if (!comm)
        return PLAIT_SUCCESS;
    plait_result_t hs = plait_comm_check_handle(comm, "plait_comm_abort");
    if (hs)
        return hs;
    /* Sequentially consistent, paired with the executor's increment of busy
     * followed by its load of the flag: either the executor sees the flag and
     * touches nothing, or we see it busy and wait. Every wait polls the flag at
     * least every few milliseconds. */
    __atomic_store_n(&comm->abort_flag, 1, __ATOMIC_SEQ_CST);
    plait_cuda_comm_abort(comm); /* ends every kernel wait */
    /* In a forked child the counters are copies of the parent's, and the
     * threads they count do not exist here. */
    while (comm->owner_pid == getpid() &&
           (__atomic_load_n(&comm->busy, __ATOMIC_SEQ_CST) > 0 || __atomic_load_n(&comm->inflight, __ATOMIC_SEQ_CST) > 0))
        usleep(500);
    if (comm->owner_pid == getpid()) {
        wait_init(comm);
        if (comm->internal_stream) {
            plait_stream_destroy(comm->internal_stream);
            comm->internal_stream = NULL;
        }
    }
    comm_release(comm);
    graveyard_push(comm);
    return PLAIT_SUCCESS;
}

plait_result_t plait_comm_get_async_error(plait_comm_t comm, plait_result_t *async_error_out)
{
    plait_result_t hs = plait_comm_check_handle(comm, "plait_comm_get_async_error");
    if (hs)
        return hs;
    if (!async_error_out)
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "plait_comm_get_async_error: async_error_out is NULL");
    plait_cuda_poll_error(comm); /* a kernel's error becomes the async error */
    pthread_mutex_lock(&comm->async_lock);
    plait_result_t e = comm->async_error;
    pthread_mutex_unlock(&comm->async_lock);
    if (e == PLAIT_SUCCESS && comm->internal_stream && plait_stream_busy(comm->internal_stream))
        e = PLAIT_IN_PROGRESS;
    *async_error_out = e;
    return PLAIT_SUCCESS;
}

plait_result_t plait_comm_count(plait_comm_t comm, int *count_out)
{
    plait_result_t hs = plait_comm_check_handle(comm, "plait_comm_count");
    if (hs)
        return hs;
    if (!count_out)
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "plait_comm_count: count_out is NULL");
    *count_out = comm->nranks;
    return PLAIT_SUCCESS;
}

plait_result_t plait_comm_rank(plait_comm_t comm, int *rank_out)
{
    plait_result_t hs = plait_comm_check_handle(comm, "plait_comm_rank");
    if (hs)
        return hs;
    if (!rank_out)
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "plait_comm_rank: rank_out is NULL");
    *rank_out = comm->rank;
    return PLAIT_SUCCESS;
}
