/* Shared-memory transports: "shm" between processes of one host (POSIX shared
 * memory) and "inproc" between threads of one process (heap memory).
 *
 * Connections are made on first use (or at init, for the ones the core makes
 * then), one object per connection holding both directions: for each end,
 * the receive FIFO from the other end (tail, slot sizes, slots) and the
 * credit counter (head) of its own sends to it. Every counter sits on its own
 * 64-byte line: tail is written only by the sender, head only by the receiver.
 *
 * The object has a name both ends compute alike (from the communicator's
 * secret, a word rank 0 drew at init, the pair and the class), so neither has
 * to tell the other anything: the first end to come creates it (O_EXCL) and
 * may use it at once (its sends wait there for the peer); the second maps it,
 * says so in the object's first line and unlinks the name, so nothing is
 * left in /dev/shm once both ends have it. At destroy, an end that never got
 * the object, or whose peer has it, unlinks the name too; the first end
 * keeps it only while it holds sends its peer has not come for and the peer
 * process lives, so that those sends still arrive (as they would once the
 * peer had mapped it). A process killed between creating an object and its
 * peer mapping it leaves the name behind. Between threads the name is a key in a
 * process-wide registry and the object is reference-counted (a peer thread
 * may still write credits after its owner has destroyed its communicator).
 *
 * At init each rank also makes a segment of its own for the core's region
 * (env->region_bytes: its operation counters and the small-message boxes,
 * region() below) when the transport joins it to another rank; the segments'
 * names are allgathered, every peer maps them, and each owner unlinks its own
 * after a barrier. A process segment is sized with posix_fallocate (a full
 * /dev/shm is an error, not a SIGBUS later).
 *
 * This file includes nothing of the core: what it knows of the communicator
 * is its struct plait_tp_env. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include "base/crypto.h"
#include "base/log.h"
#include "base/util.h"
#include "transports/transport.h"

#define LINE 64

struct inproc_seg {
    int refs;
    size_t bytes;
    char *mem;
};

/* A connection object between threads of this process: listed in the
 * registry under its key until the second end takes it. */
struct inproc_pair {
    struct inproc_pair *next;
    uint8_t key[32];
    int refs;
    int listed;  /* in the registry: the second end has not taken it */
    int abandoned; /* the second end's communicator is gone without taking it: free at the last put */
    char *mem;
};

static pthread_mutex_t registry_lock = PTHREAD_MUTEX_INITIALIZER;
static struct inproc_pair *registry;

int plait_inproc_objects_listed(void)
{
    int n = 0;
    pthread_mutex_lock(&registry_lock);
    for (const struct inproc_pair *ip = registry; ip; ip = ip->next)
        n++;
    pthread_mutex_unlock(&registry_lock);
    return n;
}

/* This rank's end of one connection. */
struct pair {
    struct plait_conn conn;
    int ready;
    int first;               /* this end made the object */
    char *mem;               /* the object (shm: this process's mapping) */
    size_t bytes;
    struct inproc_pair *ip;  /* inproc: the shared object */
    uint8_t key[32];         /* what names the object */
    char name[96];           /* shm: its name */
};

/* Per communicator. */
struct shm_state {
    const struct plait_tp_env *env;
    const struct plait_transport *tp;
    int is_shm;              /* processes (shm), else threads (inproc) */
    int npeers;              /* other ranks this transport joins this rank to */
    size_t region_bytes;     /* the core's region, rounded up to a line (0: none) */
    uint64_t comm_key;       /* rank 0's random word: tells this communicator's objects from others' */
    char **base;             /* per rank: its region segment, mapped (NULL where none) */
    size_t *bytes;           /* per rank: mapping size */
    struct inproc_seg **segs;/* inproc: per rank */
    struct pair **pairs;     /* [peer * ncls + cls]: this rank's ends, made on first use */
    pid_t owner_pid;
    char *sc_bounce;         /* single copy: the connections' bounce buffer, or NULL */
    int sc_mode;             /* single copy for the connections: enum plait_sc_mode (from the probe) */
};

/* Whether this state's transport joins a and b. */
static int joins(const struct shm_state *st, int a, int b)
{
    const int t = plait_tp_choose(st->env, a, b);
    return t >= 0 && plait_transports[t] == st->tp;
}

/* One end's part of a connection object: the receive FIFO from the other end
 * and the credit of its own sends to it. */
struct entry_ptrs {
    uint64_t *tail;
    uint32_t *sizes;
    uint64_t *head;
    char *slots;
};

static size_t sizes_bytes(const struct plait_tp_env *env)
{
    return ((size_t)env->nslots * sizeof(uint32_t) + LINE - 1) / LINE * LINE;
}

static size_t entry_bytes(const struct plait_tp_env *env)
{
    return 2 * LINE + sizes_bytes(env) + (size_t)env->nslots * env->slot_bytes;
}

/* An object: one line (the second end's "I have it" word), then one entry per
 * end, the lower rank's first (one for a rank's own connection). */
#define OBJ_HEADER LINE

static struct entry_ptrs entry_at(const struct plait_tp_env *env, char *obj, int idx)
{
    struct entry_ptrs e;
    char *p = obj + OBJ_HEADER + (size_t)idx * entry_bytes(env);
    e.tail = (uint64_t *)p;
    e.sizes = (uint32_t *)(p + LINE);
    e.head = (uint64_t *)(p + LINE + sizes_bytes(env));
    e.slots = p + 2 * LINE + sizes_bytes(env);
    return e;
}

/* keep: the other end has not taken it and it holds sends for it: it stays
 * listed (with no reference) for that end to take. */
static void inproc_pair_put(struct inproc_pair *ip, int keep)
{
    if (!ip)
        return;
    pthread_mutex_lock(&registry_lock);
    if (--ip->refs == 0 && !(keep && ip->listed && !ip->abandoned)) {
        if (ip->listed)
            for (struct inproc_pair **pp = &registry; *pp; pp = &(*pp)->next)
                if (*pp == ip) {
                    *pp = ip->next;
                    break;
                }
        free(ip->mem);
        free(ip);
    }
    pthread_mutex_unlock(&registry_lock);
}

static void pair_free(struct shm_state *st, struct pair *p)
{
    if (!p)
        return;
    /* Sends the peer has not come for: it will find them there, unless it
     * is gone (then they are moot). */
    const int peer = p->conn.peer;
    const int pending = p->ready && p->first && peer != st->env->rank && p->conn.tx_posted > 0 &&
                        (st->is_shm ? !__atomic_load_n((uint64_t *)p->mem, __ATOMIC_ACQUIRE) &&
                                          !(kill((pid_t)st->env->ranks[peer].pid, 0) != 0 && errno == ESRCH)
                                    : 1 /* inproc_pair_put keeps it only while listed */);
    if (st->is_shm) {
        if (p->mem)
            munmap(p->mem, p->bytes);
        /* ENOENT when the second end has unlinked it already */
        if (!pending)
            shm_unlink(p->name);
    } else {
        inproc_pair_put(p->ip, pending);
    }
    free(p);
}

static void pair_name(const struct shm_state *st, int peer, int cls, uint8_t key[32], char *name, size_t len);

static void shm_free_state(struct shm_state *st)
{
    const struct plait_tp_env *env = st->env;
    for (int i = 0; st->pairs && i < env->nranks * env->ncls; i++)
        pair_free(st, st->pairs[i]);
    /* The objects peers made for connections this end never asked for (a
     * send nobody received): gone with the last end's communicator. */
    for (int peer = 0; st->pairs && peer < env->nranks; peer++) {
        if (peer == env->rank || !joins(st, env->rank, peer))
            continue;
        for (int c = 0; c < env->ncls; c++) {
            if (st->pairs[peer * env->ncls + c])
                continue;
            uint8_t key[32];
            char name[96];
            pair_name(st, peer, c, key, name, sizeof(name));
            if (st->is_shm) {
                shm_unlink(name);
                continue;
            }
            pthread_mutex_lock(&registry_lock);
            for (struct inproc_pair **pp = &registry; *pp; pp = &(*pp)->next) {
                struct inproc_pair *ip = *pp;
                if (memcmp(ip->key, key, sizeof(key)) != 0)
                    continue;
                if (ip->refs == 0) { /* its first end kept it for us: nobody else will take it */
                    *pp = ip->next;
                    free(ip->mem);
                    free(ip);
                } else {
                    ip->abandoned = 1; /* its first end frees it */
                }
                break;
            }
            pthread_mutex_unlock(&registry_lock);
        }
    }
    for (int r = 0; r < env->nranks; r++) {
        if (st->is_shm) {
            if (st->base && st->base[r])
                munmap(st->base[r], st->bytes[r]);
        } else if (st->segs && st->segs[r]) {
            struct inproc_seg *seg = st->segs[r];
            if (__atomic_sub_fetch(&seg->refs, 1, __ATOMIC_ACQ_REL) == 0) {
                free(seg->mem);
                free(seg);
            }
        }
    }
    free(st->pairs);
    free(st->base);
    free(st->bytes);
    free(st->segs);
    free(st->sc_bounce);
    free(st);
}

/* Creates, names and maps this rank's process segment. */
static plait_result_t create_process_segment(const struct plait_tp_env *env, size_t bytes, char *name,
                                             size_t name_len, char **base_out)
{
    uint64_t rnd;
    plait_random_bytes(&rnd, sizeof(rnd));
    snprintf(name, name_len, "/plait-%d-%016llx-%d", (int)getpid(), (unsigned long long)rnd, env->rank);
    int fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0)
        return plait_error(PLAIT_ERR_SYSTEM, "shm: shm_open(%s) failed: %s", name, strerror(errno));
    plait_result_t status = PLAIT_SUCCESS;
    int err = posix_fallocate(fd, 0, (off_t)bytes);
    if (err) {
        status = plait_error(PLAIT_ERR_SYSTEM, "shm: cannot reserve %zu bytes in /dev/shm for %s: %s", bytes, name,
                             strerror(err));
        goto err_unlink;
    }
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        status = plait_error(PLAIT_ERR_SYSTEM, "shm: mmap of %zu bytes failed: %s", bytes, strerror(errno));
        goto err_unlink;
    }
    close(fd);
    *base_out = p;
    return PLAIT_SUCCESS;
err_unlink:
    shm_unlink(name);
    close(fd);
    return status;
}

static plait_result_t map_process_segment(const char *name, size_t bytes, const char *peer, char **base_out)
{
    int fd = shm_open(name, O_RDWR, 0600);
    if (fd < 0)
        return plait_error(PLAIT_ERR_SYSTEM, "shm: cannot open %s's segment %s: %s", peer, name, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0 || (size_t)sb.st_size < bytes) {
        close(fd);
        return plait_error(PLAIT_ERR_REMOTE, "shm: %s's segment %s is smaller than its layout (%zu bytes)", peer,
                           name, bytes);
    }
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED)
        return plait_error(PLAIT_ERR_SYSTEM, "shm: mmap of %s's segment failed: %s", peer, strerror(errno));
    *base_out = p;
    return PLAIT_SUCCESS;
}

struct seg_card {
    char name[120];
    uint64_t inproc_ptr;
    uint64_t comm_key;
};

/* Makes this rank's region segment and maps its peers' (collective); learns
 * the communicator's key. */
static plait_result_t setup_segments(struct shm_state *st)
{
    const struct plait_tp_env *env = st->env;
    const int n = env->nranks, me = env->rank;
    for (int p = 0; p < n; p++)
        if (p != me && joins(st, me, p))
            st->npeers++;
    /* Every rank takes part in the exchange even if it has no peer of this
     * kind: the allgather is collective. */
    struct seg_card *cards = calloc((size_t)n, sizeof(*cards));
    if (!cards)
        return plait_error(PLAIT_ERR_SYSTEM, "%s: out of memory", st->tp->name);
    plait_result_t status = PLAIT_SUCCESS;
    if (me == 0)
        status = plait_random_bytes(&cards[0].comm_key, sizeof(cards[0].comm_key));
    const size_t my_bytes = st->region_bytes;
    char my_name[120] = "";
    if (!status && st->npeers > 0 && my_bytes > 0) {
        if (st->is_shm) {
            status = create_process_segment(env, my_bytes, my_name, sizeof(my_name), &st->base[me]);
            if (status)
                goto exchange;
            snprintf(cards[me].name, sizeof(cards[me].name), "%s", my_name);
        } else {
            struct inproc_seg *seg = calloc(1, sizeof(*seg));
            char *mem = NULL;
            if (seg && posix_memalign((void **)&mem, 4096, my_bytes) == 0) {
                memset(mem, 0, my_bytes);
                seg->mem = mem;
                seg->bytes = my_bytes;
                seg->refs = 1;
                st->segs[me] = seg;
                st->base[me] = mem;
                cards[me].inproc_ptr = (uint64_t)(uintptr_t)seg;
            } else {
                free(seg);
                status = plait_error(PLAIT_ERR_SYSTEM, "inproc: cannot allocate %zu bytes", my_bytes);
                goto exchange;
            }
        }
        st->bytes[me] = my_bytes;
    }
exchange:;
    /* A failed rank still joins the allgather, with an empty card, so nobody
     * waits for it; the others fail when they find the card empty. */
    plait_result_t ag = env->allgather(env->core, cards, sizeof(*cards));
    if (!status)
        status = ag;
    st->comm_key = cards[0].comm_key;
    for (int p = 0; p < n && !status && my_bytes > 0; p++) {
        if (p == me || !joins(st, me, p))
            continue;
        char who[160];
        env->peer_str(env->core, p, who, sizeof(who));
        if (st->is_shm) {
            cards[p].name[sizeof(cards[p].name) - 1] = '\0';
            if (strncmp(cards[p].name, "/plait-", 7) != 0) {
                status = plait_error(PLAIT_ERR_REMOTE, "shm: %s did not create its segment", who);
                break;
            }
            status = map_process_segment(cards[p].name, my_bytes, who, &st->base[p]);
        } else {
            struct inproc_seg *seg = (struct inproc_seg *)(uintptr_t)cards[p].inproc_ptr;
            if (!seg) {
                status = plait_error(PLAIT_ERR_REMOTE, "inproc: %s did not create its segment", who);
                break;
            }
            __atomic_add_fetch(&seg->refs, 1, __ATOMIC_ACQ_REL);
            st->segs[p] = seg;
            st->base[p] = seg->mem;
        }
        if (!status)
            st->bytes[p] = my_bytes;
    }
    /* Everyone has mapped every segment once this barrier passes: unlink ours so
     * nothing is left in /dev/shm whatever happens to the processes later. A
     * rank that failed above still joins it (only a failed allgather skips it:
     * the ring is broken then). */
    if (!ag) {
        plait_result_t b = env->barrier(env->core);
        if (!status)
            status = b;
    }
    if (my_name[0])
        shm_unlink(my_name);
    free(cards);
    if (status)
        return status;
    if (st->npeers > 0 && my_bytes > 0)
        PLAIT_INFO(PLAIT_SUBSYS_TRANSPORT, "%s: rank %d region segment of %zu bytes, %d peers", st->tp->name, me,
                   my_bytes, st->npeers);
    return PLAIT_SUCCESS;
}

/* ---------------------------------------------------------------- single copy
 *
 * Whether a rank may read a same-host peer's memory with process_vm_readv
 * (CMA) depends on ptrace permission, which Yama's ptrace_scope, a seccomp
 * filter or a container's policy may deny, and on both sides sharing a PID
 * namespace. So it is probed once, at init: every rank publishes the address
 * and value of a random 64-bit word of its own, reads every shm peer's word,
 * and the verdicts are allgathered. Single copy is used on the communicator's
 * shm connections only when every read of every rank worked: each end of a
 * connection then knows its peer can read its descriptors. Threads of one
 * process (inproc) read each other's memory directly and need no probe. */

struct sc_card {
    uint64_t addr; /* of a random word in this process */
    uint64_t value;
};

struct sc_verdict {
    int32_t err;  /* 0, an errno, or SC_ERR_VALUE / SC_ERR_SHORT */
    int32_t peer; /* the first peer this rank could not read */
};

#define SC_ERR_VALUE (-1) /* read another value: the pid is another process (PID namespaces) */
#define SC_ERR_SHORT (-2) /* read fewer bytes than asked */

static const char *sc_err_str(int err, char *buf, size_t len)
{
    if (err == SC_ERR_VALUE)
        snprintf(buf, len, "it read another value than the peer published (different PID namespaces?)");
    else if (err == SC_ERR_SHORT)
        snprintf(buf, len, "short read");
    else if (err == EPERM || err == EACCES)
        snprintf(buf, len, "%s (ptrace permission, denied by Yama's ptrace_scope, a seccomp filter or a container's "
                           "policy)", strerror(err));
    else if (err == ENOSYS)
        snprintf(buf, len, "%s (a kernel without CONFIG_CROSS_MEMORY_ATTACH, or a seccomp filter)", strerror(err));
    else if (err == ESRCH)
        snprintf(buf, len, "%s (different PID namespaces?)", strerror(err));
    else
        snprintf(buf, len, "%s", strerror(err));
    return buf;
}

/* Whether some pair of ranks is joined by shm: the same answer on every rank
 * (a pure function of the node map). A host has such a pair exactly when one
 * of its ranks is in another process than the host's first rank. */
static int sc_any_shm_pair(const struct shm_state *st)
{
    const struct plait_tp_env *env = st->env;
    int nhosts = 0;
    for (int r = 0; r < env->nranks; r++)
        if (env->ranks[r].host >= nhosts)
            nhosts = env->ranks[r].host + 1;
    int *first = malloc(sizeof(int) * (size_t)(nhosts > 0 ? nhosts : 1));
    if (!first)
        return -1;
    for (int h = 0; h < nhosts; h++)
        first[h] = -1;
    int found = 0;
    for (int r = 0; r < env->nranks && !found; r++) {
        const int h = env->ranks[r].host;
        if (h < 0)
            continue;
        if (first[h] < 0)
            first[h] = r;
        else
            found = joins(st, first[h], r);
    }
    free(first);
    return found;
}

/* Probes process_vm_readv (collective); *verdicts_out: one per rank, for the
 * caller to free. */
static plait_result_t sc_probe(const struct shm_state *st, struct sc_verdict **verdicts_out)
{
    const struct plait_tp_env *env = st->env;
    const int n = env->nranks, me = env->rank;
    /* Peers read this word while they probe, that is until every rank has
     * reached the second allgather; volatile keeps it in memory till then. */
    volatile uint64_t magic = 0;
    uint64_t value = 0;
    plait_random_bytes(&value, sizeof(value));
    value |= 1; /* never 0, which an unwritten word would read as */
    magic = value;
    struct sc_card *cards = calloc((size_t)n, sizeof(*cards));
    struct sc_verdict *v = calloc((size_t)n, sizeof(*v));
    if (!cards || !v) {
        free(cards);
        free(v);
        return plait_error(PLAIT_ERR_SYSTEM, "shm: out of memory");
    }
    cards[me].addr = (uint64_t)(uintptr_t)&magic;
    cards[me].value = value;
    plait_result_t status = env->allgather(env->core, cards, sizeof(*cards));
    if (status)
        goto out;
    v[me].peer = -1;
    for (int p = 0; p < n && !v[me].err; p++) {
        if (p == me || !joins(st, me, p))
            continue;
        uint64_t got = 0;
        struct iovec local = {&got, sizeof(got)};
        struct iovec remote = {(void *)(uintptr_t)cards[p].addr, sizeof(got)};
        ssize_t k = process_vm_readv((pid_t)env->ranks[p].pid, &local, 1, &remote, 1, 0);
        int err = k < 0 ? errno : k != (ssize_t)sizeof(got) ? SC_ERR_SHORT : got != cards[p].value ? SC_ERR_VALUE : 0;
        if (err) {
            v[me].err = err;
            v[me].peer = p;
        }
    }
    status = env->allgather(env->core, v, sizeof(*v));
    (void)magic;
out:
    free(cards);
    if (status) {
        free(v);
        return status;
    }
    *verdicts_out = v;
    return PLAIT_SUCCESS;
}

/* Decides single copy for the connections (st->sc_mode) where PLAIT_CMA and
 * (for shm) the probe allow it. Collective for shm. */
static plait_result_t sc_setup(struct shm_state *st)
{
    const struct plait_tp_env *env = st->env;
    if (env->cma == PLAIT_TP_CMA_OFF)
        return PLAIT_SUCCESS;
    if (!st->is_shm) {
        st->sc_mode = PLAIT_SC_LOCAL;
        return PLAIT_SUCCESS;
    }
    const int any = sc_any_shm_pair(st);
    if (any < 0)
        return plait_error(PLAIT_ERR_SYSTEM, "shm: out of memory");
    if (!any)
        return PLAIT_SUCCESS; /* the same on every rank: nobody probes */
    struct sc_verdict *v = NULL;
    plait_result_t status = sc_probe(st, &v);
    if (status)
        return status;
    int bad = -1;
    for (int r = 0; r < env->nranks && bad < 0; r++)
        if (v[r].err)
            bad = r;
    if (bad >= 0) {
        /* Every rank has the same verdicts, so every rank says the same. */
        char who[160], whom[160], why[256];
        const int peer = v[bad].peer;
        env->peer_str(env->core, bad, who, sizeof(who));
        if (peer >= 0 && peer < env->nranks)
            env->peer_str(env->core, peer, whom, sizeof(whom));
        else
            snprintf(whom, sizeof(whom), "a peer");
        sc_err_str(v[bad].err, why, sizeof(why));
        free(v);
        if (env->cma == PLAIT_TP_CMA_REQUIRE)
            return plait_error(PLAIT_ERR_SYSTEM,
                               "shm: PLAIT_CMA=1 requires single copy, but %s cannot read the memory of %s with "
                               "process_vm_readv: %s",
                               who, whom, why);
        if (st->npeers > 0)
            PLAIT_INFO(PLAIT_SUBSYS_TRANSPORT,
                       "shm: rank %d: single copy (CMA) off, the FIFO path carries everything: %s cannot read the "
                       "memory of %s with process_vm_readv: %s",
                       env->rank, who, whom, why);
        return PLAIT_SUCCESS;
    }
    free(v);
    if (st->npeers == 0)
        return PLAIT_SUCCESS;
    /* One bounce buffer per communicator: a reducing step reads a piece of a
     * peer's bytes into it and reduces from there while it is in cache. */
    if (posix_memalign((void **)&st->sc_bounce, 64, env->slot_bytes))
        return plait_error(PLAIT_ERR_SYSTEM, "shm: cannot allocate %llu bytes for single copy",
                           (unsigned long long)env->slot_bytes);
    st->sc_mode = PLAIT_SC_READ;
    if (env->cma_min_bytes == UINT64_MAX)
        PLAIT_INFO(PLAIT_SUBSYS_TRANSPORT,
                   "shm: rank %d: single copy (CMA, process_vm_readv) allowed with %d peers but not used: "
                   "PLAIT_CMA_MIN_BYTES is unset",
                   env->rank, st->npeers);
    else
        PLAIT_INFO(PLAIT_SUBSYS_TRANSPORT,
                   "shm: rank %d: single copy (CMA, process_vm_readv) on with %d peers, steps of %llu bytes or "
                   "more",
                   env->rank, st->npeers, (unsigned long long)env->cma_min_bytes);
    return PLAIT_SUCCESS;
}

/* ---------------------------------------------------------------- the ops */

static int same_process(const struct plait_tp_env *env, int a, int b)
{
    return env->ranks[a].process_token == env->ranks[b].process_token && env->ranks[a].pid == env->ranks[b].pid;
}

static int inproc_can_join(const struct plait_tp_env *env, int a, int b)
{
    if (a == b)
        return 100; /* a rank's own point-to-point connection, whatever else is forced */
    return !env->force_net && same_process(env, a, b) ? 30 : 0;
}

static int shm_can_join(const struct plait_tp_env *env, int a, int b)
{
    return a != b && !env->force_net && env->ranks[a].host == env->ranks[b].host && !same_process(env, a, b) ? 20
                                                                                                           : 0;
}

static void query_common(const struct plait_tp_env *env, struct plait_tp_info *info, int is_shm)
{
    memset(info, 0, sizeof(*info));
    info->link = is_shm ? PLAIT_LC_SHM : PLAIT_LC_LOCAL;
    info->sc = env->cma == PLAIT_TP_CMA_OFF ? PLAIT_SC_NONE : is_shm ? PLAIT_SC_READ : PLAIT_SC_LOCAL;
    info->region = 1;
    info->host_mem_shared = 1;
}

static void shm_query(const struct plait_tp_env *env, int a, int b, struct plait_tp_info *info)
{
    (void)a;
    (void)b;
    query_common(env, info, 1);
}

static void inproc_query(const struct plait_tp_env *env, int a, int b, struct plait_tp_info *info)
{
    (void)a;
    (void)b;
    query_common(env, info, 0);
}

static plait_result_t init_common(const struct plait_tp_env *env, const struct plait_transport *tp, int is_shm,
                                  void **ctx)
{
    *ctx = NULL;
    struct shm_state *st = calloc(1, sizeof(*st));
    if (!st)
        return plait_error(PLAIT_ERR_SYSTEM, "%s: out of memory", tp->name);
    st->env = env;
    st->tp = tp;
    st->is_shm = is_shm;
    st->region_bytes = (env->region_bytes + LINE - 1) / LINE * LINE;
    st->owner_pid = getpid();
    const int n = env->nranks;
    st->base = calloc((size_t)n, sizeof(char *));
    st->bytes = calloc((size_t)n, sizeof(size_t));
    st->segs = calloc((size_t)n, sizeof(struct inproc_seg *));
    st->pairs = calloc((size_t)n * (size_t)env->ncls, sizeof(struct pair *));
    if (!st->base || !st->bytes || !st->segs || !st->pairs) {
        shm_free_state(st);
        return plait_error(PLAIT_ERR_SYSTEM, "%s: out of memory", tp->name);
    }
    /* Both steps are collective: a rank that fails the first does not run
     * the second, and neither do the others (the first's allgathered cards
     * or barrier fail them too). */
    plait_result_t status = setup_segments(st);
    if (!status)
        status = sc_setup(st);
    if (status) {
        shm_free_state(st);
        return status;
    }
    *ctx = st;
    return PLAIT_SUCCESS;
}

static plait_result_t shm_init(const struct plait_tp_env *env, void **ctx)
{
    return init_common(env, &plait_transport_shm, 1, ctx);
}

static plait_result_t inproc_init(const struct plait_tp_env *env, void **ctx)
{
    return init_common(env, &plait_transport_inproc, 0, ctx);
}

/* The key of the object of (a, b, cls), the same on both ends. */
static void pair_key(const struct shm_state *st, int a, int b, int cls, uint8_t key[32])
{
    const struct plait_tp_env *env = st->env;
    const int lo = a < b ? a : b, hi = a < b ? b : a;
    struct {
        char tag[8];
        uint64_t comm_key;
        int32_t lo, hi, cls, pid_lo, pid_hi, pad;
    } in;
    memset(&in, 0, sizeof(in));
    memcpy(in.tag, "plaitpr1", 8);
    in.comm_key = st->comm_key;
    in.lo = lo;
    in.hi = hi;
    in.cls = cls;
    in.pid_lo = env->ranks[lo].pid;
    in.pid_hi = env->ranks[hi].pid;
    plait_hmac_sha256(env->secret, 32, &in, sizeof(in), key);
}

/* The key and (shm) the name of the object of (this rank, peer, cls). */
static void pair_name(const struct shm_state *st, int peer, int cls, uint8_t key[32], char *name, size_t len)
{
    const struct plait_tp_env *env = st->env;
    const int me = env->rank;
    pair_key(st, me, peer, cls, key);
    char hex[25];
    for (int i = 0; i < 12; i++)
        snprintf(hex + 2 * i, 3, "%02x", key[i]);
    snprintf(name, len, "/plait-%d-%s", (int)env->ranks[me < peer ? me : peer].pid, hex);
}

/* Makes (or finds) the object of (peer, cls): 1 when this end has it, 0 when
 * the peer is still making it (call again), or an error. */
static plait_result_t pair_get(struct shm_state *st, struct pair *p, int peer)
{
    const struct plait_tp_env *env = st->env;
    const int me = env->rank;
    if (!st->is_shm) {
        pthread_mutex_lock(&registry_lock);
        struct inproc_pair **pp = &registry;
        while (*pp && memcmp((*pp)->key, p->key, sizeof(p->key)) != 0)
            pp = &(*pp)->next;
        struct inproc_pair *ip = *pp;
        if (ip) {
            *pp = ip->next; /* the second end: nobody else looks for it */
            ip->next = NULL;
            ip->listed = 0;
            ip->refs++;
        } else if ((ip = calloc(1, sizeof(*ip))) != NULL &&
                   posix_memalign((void **)&ip->mem, 4096, p->bytes) == 0) {
            memset(ip->mem, 0, p->bytes);
            memcpy(ip->key, p->key, sizeof(p->key));
            ip->refs = 1;
            ip->listed = 1;
            ip->next = registry;
            registry = ip;
            p->first = 1;
        } else {
            free(ip);
            ip = NULL;
        }
        pthread_mutex_unlock(&registry_lock);
        if (!ip)
            return plait_error(PLAIT_ERR_SYSTEM, "inproc: cannot allocate %zu bytes for a connection", p->bytes);
        p->ip = ip;
        p->mem = ip->mem;
        return PLAIT_SUCCESS;
    }
    char who[160];
    int fd = shm_open(p->name, O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd >= 0) {
        /* the first end: size it, map it, use it */
        int err = posix_fallocate(fd, 0, (off_t)p->bytes);
        void *mem = err ? MAP_FAILED : mmap(NULL, p->bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (!err && mem == MAP_FAILED)
            err = errno;
        close(fd);
        if (err) {
            shm_unlink(p->name);
            return plait_error(PLAIT_ERR_SYSTEM, "shm: cannot make the %zu-byte connection with %s in /dev/shm: %s",
                               p->bytes, env->peer_str(env->core, peer, who, sizeof(who)), strerror(err));
        }
        p->mem = mem;
        p->first = 1;
        return PLAIT_SUCCESS;
    }
    if (errno != EEXIST)
        return plait_error(PLAIT_ERR_SYSTEM, "shm: shm_open(%s) for the connection with %s failed: %s", p->name,
                           env->peer_str(env->core, peer, who, sizeof(who)), strerror(errno));
    fd = shm_open(p->name, O_RDWR, 0600);
    if (fd < 0)
        return errno == ENOENT ? PLAIT_IN_PROGRESS
                               : plait_error(PLAIT_ERR_SYSTEM, "shm: cannot open the connection %s with %s: %s",
                                             p->name, env->peer_str(env->core, peer, who, sizeof(who)),
                                             strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0 || sb.st_uid != geteuid()) {
        close(fd);
        return plait_error(PLAIT_ERR_SYSTEM, "shm: the connection object %s with %s is not this user's", p->name,
                           env->peer_str(env->core, peer, who, sizeof(who)));
    }
    if ((size_t)sb.st_size < p->bytes) {
        close(fd); /* the peer is still sizing it */
        return PLAIT_IN_PROGRESS;
    }
    void *mem = mmap(NULL, p->bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (mem == MAP_FAILED)
        return plait_error(PLAIT_ERR_SYSTEM, "shm: mmap of the connection with %s failed: %s",
                           env->peer_str(env->core, peer, who, sizeof(who)), strerror(errno));
    p->mem = mem;
    /* both ends have it: nothing is left in /dev/shm whatever happens next */
    __atomic_store_n((uint64_t *)mem, 1, __ATOMIC_RELEASE);
    shm_unlink(p->name);
    (void)me;
    return PLAIT_SUCCESS;
}

/* Nothing to send the peer: both ends find the object by its name. */
static plait_result_t shm_connect(void *ctx, int peer, int cls, unsigned flags, void *blob)
{
    (void)ctx;
    (void)peer;
    (void)cls;
    (void)flags;
    (void)blob;
    return PLAIT_SUCCESS;
}

static plait_result_t shm_accept(void *ctx, int peer, int cls, const void *peer_blob, double deadline,
                                 struct plait_conn **out)
{
    (void)peer_blob;
    struct shm_state *st = ctx;
    if (!st || peer < 0 || peer >= st->env->nranks || cls < 0 || cls >= st->env->ncls || !joins(st, st->env->rank, peer))
        return plait_error(PLAIT_ERR_INTERNAL, "%s: rank %d cannot join rank %d on class %d",
                           st ? st->tp->name : "shm", st ? st->env->rank : -1, peer, cls);
    const struct plait_tp_env *env = st->env;
    const int me = env->rank;
    struct pair **slot = &st->pairs[peer * env->ncls + cls];
    struct pair *p = *slot;
    if (!p) {
        if (!(p = calloc(1, sizeof(*p))))
            return plait_error(PLAIT_ERR_SYSTEM, "%s: out of memory", st->tp->name);
        p->bytes = OBJ_HEADER + (size_t)(peer == me ? 1 : 2) * entry_bytes(env);
        pair_name(st, peer, cls, p->key, p->name, sizeof(p->name));
        *slot = p;
    }
    if (!p->ready) {
        plait_result_t status = pair_get(st, p, peer);
        if (status == PLAIT_IN_PROGRESS && deadline > 0 && plait_deadline_passed(deadline)) {
            char who[160];
            return plait_error(PLAIT_ERR_TIMEOUT, "%s: the connection object %s with %s was not ready by the deadline "
                               "(PLAIT_TIMEOUT=%g s)", st->tp->name, p->name,
                               env->peer_str(env->core, peer, who, sizeof(who)), env->timeout_s);
        }
        if (status)
            return status; /* PLAIT_IN_PROGRESS: call again */
        /* entry 0 is the lower rank's, entry 1 the higher's (one for a rank's own) */
        const int mi = peer == me ? 0 : me < peer ? 0 : 1, ti = peer == me ? 0 : 1 - mi;
        struct entry_ptrs m = entry_at(env, p->mem, mi);
        struct entry_ptrs t = entry_at(env, p->mem, ti);
        struct plait_conn *conn = &p->conn;
        memset(conn, 0, sizeof(*conn));
        conn->tp = st->tp;
        conn->ctx = st;
        conn->peer = peer;
        conn->cls = cls;
        conn->needs_progress = 0;
        conn->nslots = env->nslots;
        conn->slot_bytes = env->slot_bytes;
        conn->tx_slots = t.slots;
        conn->tx_sizes = t.sizes;
        conn->tx_tail = t.tail;
        conn->tx_head = m.head;
        conn->rx_slots = m.slots;
        conn->rx_sizes = m.sizes;
        conn->rx_tail = m.tail;
        conn->rx_head = t.head;
        conn->sc_mode = st->sc_mode;
        if (st->sc_mode == PLAIT_SC_READ) {
            conn->sc_pid = env->ranks[peer].pid;
            conn->sc_bounce = st->sc_bounce;
        }
        p->ready = 1;
    }
    *out = &p->conn;
    return PLAIT_SUCCESS;
}

static char *shm_region(void *ctx, int owner)
{
    struct shm_state *st = ctx;
    if (!st || owner < 0 || owner >= st->env->nranks || !st->region_bytes)
        return NULL;
    return st->base[owner];
}

static int shm_remote_read(const struct plait_conn *conn, void *dst, uint64_t addr, size_t len, size_t *done_out)
{
    size_t done = 0;
    int err = 0;
    while (done < len) {
        struct iovec local = {(char *)dst + done, len - done};
        struct iovec remote = {(void *)(uintptr_t)(addr + done), len - done};
        ssize_t r = process_vm_readv((pid_t)conn->sc_pid, &local, 1, &remote, 1, 0);
        if (r > 0) {
            done += (size_t)r;
            continue;
        }
        if (r < 0 && errno == EINTR)
            continue;
        err = r < 0 ? errno : EIO; /* no progress */
        break;
    }
    *done_out = done;
    return err;
}

static int inproc_remote_read(const struct plait_conn *conn, void *dst, uint64_t addr, size_t len, size_t *done_out)
{
    (void)conn;
    /* memmove: a rank sending to itself may name one buffer twice */
    memmove(dst, (const void *)(uintptr_t)addr, len);
    *done_out = len;
    return 0;
}

static void shm_fini(void *ctx)
{
    if (ctx)
        shm_free_state(ctx);
}

const struct plait_transport plait_transport_shm = {
    .size = sizeof(struct plait_transport),
    .version = PLAIT_TRANSPORT_VERSION,
    .name = "shm",
    .can_join = shm_can_join,
    .query = shm_query,
    .init = shm_init,
    .connect = shm_connect,
    .accept = shm_accept,
    .region = shm_region,
    .remote_read = shm_remote_read,
    .fini = shm_fini,
};

const struct plait_transport plait_transport_inproc = {
    .size = sizeof(struct plait_transport),
    .version = PLAIT_TRANSPORT_VERSION,
    .name = "inproc",
    .can_join = inproc_can_join,
    .query = inproc_query,
    .init = inproc_init,
    .connect = shm_connect,
    .accept = shm_accept,
    .region = shm_region,
    .remote_read = inproc_remote_read,
    .fini = shm_fini,
};
