/* Shared-memory transports: "shm" between processes of one host (POSIX shared
 * memory) and "inproc" between threads of one process (heap memory).
 *
 * Each rank owns one segment holding, for every peer and class it is connected
 * with, the receive FIFO from that peer (tail, slot sizes, slots) and the credit
 * counter (head) of its own sends to that peer. The layout is a pure function of
 * what every rank knows, so a peer finds its entries without asking. Every
 * counter sits on its own 64-byte line: tail is written only by the sender, head
 * only by the receiver.
 *
 * A process segment is sized with posix_fallocate (a full /dev/shm is an error,
 * not a SIGBUS later) and unlinked as soon as every peer has mapped it. An
 * in-process segment is reference-counted, since a peer thread may still write
 * credits into it after its owner has destroyed its communicator. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include "bootstrap/bootstrap.h"
#include "core/comm.h"
#include "core/fastpath.h"
#include "base/log.h"
#include "base/net.h"
#include "transports/transport.h"

#define LINE 64
/* The segment starts with one line of its owner's operation counters (issued,
 * completed), read by peers to tell a crash mid-operation from a clean exit. */
#define SEG_HEADER LINE

struct seg_layout {
    size_t entry_bytes;
    size_t sizes_bytes;
};

struct inproc_seg {
    int refs;
    size_t bytes;
    char *mem;
};

/* Per communicator: the segments of every peer (NULL where not connected). */
struct shm_state {
    int tp_id;
    char **base;             /* per rank: mapped segment, or NULL */
    size_t *bytes;           /* per rank: mapping size */
    struct inproc_seg **segs;/* inproc: per rank */
    struct plait_conn *conn_mem;
    int nconns;
    pid_t owner_pid;
    char *sc_bounce;         /* single copy: the connections' bounce buffer, or NULL */
};

static struct seg_layout layout_of(const struct plait_comm *comm)
{
    struct seg_layout l;
    l.sizes_bytes = ((size_t)comm->set.nslots * sizeof(uint32_t) + LINE - 1) / LINE * LINE;
    l.entry_bytes = 2 * LINE + l.sizes_bytes + (size_t)comm->set.nslots * comm->set.slot_bytes;
    return l;
}

/* Index of the entry (peer, cls) in `owner`'s segment, or -1; *count_out = entries. */
static int entry_index(const struct plait_comm *comm, int tp_id, int owner, int peer, int cls, int *count_out)
{
    int idx = 0, found = -1;
    for (int p = 0; p < comm->nranks; p++) {
        if (plait_pair_transport(comm, owner, p) != tp_id)
            continue;
        for (int c = 0; c < comm->ncls; c++) {
            if (!plait_conn_needed(comm, owner, p, c))
                continue;
            if (p == peer && c == cls)
                found = idx;
            idx++;
        }
    }
    if (count_out)
        *count_out = idx;
    return found;
}

struct entry_ptrs {
    uint64_t *tail;
    uint32_t *sizes;
    uint64_t *head;
    char *slots;
};

static struct entry_ptrs entry_at(char *base, const struct seg_layout *l, int idx)
{
    struct entry_ptrs e;
    char *p = base + SEG_HEADER + (size_t)idx * l->entry_bytes;
    e.tail = (uint64_t *)p;
    e.sizes = (uint32_t *)(p + LINE);
    e.head = (uint64_t *)(p + LINE + l->sizes_bytes);
    e.slots = p + 2 * LINE + l->sizes_bytes;
    return e;
}

static plait_result_t no_progress(struct plait_conn *conn)
{
    (void)conn;
    return PLAIT_SUCCESS;
}

static int always_flushed(const struct plait_conn *conn)
{
    (void)conn;
    return 1;
}

static void shm_free_state(struct plait_comm *comm, struct shm_state *st)
{
    for (int r = 0; r < comm->nranks; r++) {
        if (st->tp_id == PLAIT_TP_SHM) {
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
    free(st->base);
    free(st->bytes);
    free(st->segs);
    free(st->conn_mem);
    free(st->sc_bounce);
    free(st);
}

/* Creates, names and maps this rank's process segment. */
static plait_result_t create_process_segment(struct plait_comm *comm, size_t bytes, char *name, size_t name_len,
                                             char **base_out)
{
    uint64_t rnd;
    plait_random_bytes(&rnd, sizeof(rnd));
    snprintf(name, name_len, "/plait-%d-%016llx-%d", (int)getpid(), (unsigned long long)rnd, comm->rank);
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
};

static plait_result_t setup_common(struct plait_comm *comm, int tp_id)
{
    const int n = comm->nranks, me = comm->rank;
    int any = 0;
    for (int p = 0; p < n; p++)
        if (plait_pair_transport(comm, me, p) == tp_id)
            any = 1;
    /* Every rank takes part in the exchange even if it has no peer of this
     * kind: the allgather is collective. */
    struct shm_state *st = calloc(1, sizeof(*st));
    struct seg_card *cards = calloc((size_t)n, sizeof(*cards));
    plait_result_t status = PLAIT_SUCCESS;
    if (!st || !cards) {
        free(st);
        free(cards);
        return plait_error(PLAIT_ERR_SYSTEM, "shm: out of memory");
    }
    st->tp_id = tp_id;
    st->owner_pid = getpid();
    st->base = calloc((size_t)n, sizeof(char *));
    st->bytes = calloc((size_t)n, sizeof(size_t));
    st->segs = calloc((size_t)n, sizeof(struct inproc_seg *));
    if (!st->base || !st->bytes || !st->segs) {
        status = plait_error(PLAIT_ERR_SYSTEM, "shm: out of memory");
        goto err_free;
    }
    const struct seg_layout l = layout_of(comm);
    int my_entries = 0;
    entry_index(comm, tp_id, me, -1, -1, &my_entries);
    /* The small-message boxes (core/fastpath.c) follow the FIFO entries. */
    const size_t fast_bytes = plait_fast_region_bytes(comm, tp_id);
    size_t my_bytes = SEG_HEADER + (size_t)my_entries * l.entry_bytes + fast_bytes;
    char my_name[120] = "";
    if (any && my_entries > 0) {
        if (tp_id == PLAIT_TP_SHM) {
            status = create_process_segment(comm, my_bytes, my_name, sizeof(my_name), &st->base[me]);
            if (status)
                goto err_exchange;
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
                goto err_exchange;
            }
        }
        st->bytes[me] = my_bytes;
    }
err_exchange:;
    /* A failed rank still joins the allgather, with an empty card, so nobody
     * waits for it; the others fail when they find the card empty. */
    plait_result_t ag = plait_bootstrap_allgather(comm->bs, cards, sizeof(*cards));
    if (status)
        goto err_free;
    if (ag) {
        status = ag;
        goto err_free;
    }
    for (int p = 0; p < n; p++) {
        if (p == me || plait_pair_transport(comm, me, p) != tp_id)
            continue;
        int entries = 0;
        entry_index(comm, tp_id, p, -1, -1, &entries);
        size_t bytes = SEG_HEADER + (size_t)entries * l.entry_bytes + fast_bytes;
        char who[160];
        plait_peer_str(comm, p, who, sizeof(who));
        if (tp_id == PLAIT_TP_SHM) {
            cards[p].name[sizeof(cards[p].name) - 1] = '\0';
            if (strncmp(cards[p].name, "/plait-", 7) != 0) {
                status = plait_error(PLAIT_ERR_REMOTE, "shm: %s did not create its segment", who);
                break;
            }
            status = map_process_segment(cards[p].name, bytes, who, &st->base[p]);
            if (status)
                break;
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
        st->bytes[p] = bytes;
    }
    /* Everyone has mapped every segment once this barrier passes: unlink ours so
     * nothing is left in /dev/shm whatever happens to the processes later. */
    {
        plait_result_t b = plait_bootstrap_barrier(comm->bs);
        if (my_name[0])
            shm_unlink(my_name);
        if (!status && b)
            status = b;
    }
    if (status)
        goto err_free;

    /* Wire the connections. */
    st->conn_mem = calloc((size_t)(my_entries > 0 ? my_entries : 1), sizeof(struct plait_conn));
    if (!st->conn_mem) {
        status = plait_error(PLAIT_ERR_SYSTEM, "shm: out of memory");
        goto err_free;
    }
    const struct plait_transport *tp = tp_id == PLAIT_TP_SHM ? &plait_transport_shm : &plait_transport_inproc;
    for (int p = 0; p < n; p++) {
        if (plait_pair_transport(comm, me, p) != tp_id)
            continue;
        for (int c = 0; c < comm->ncls; c++) {
            if (!plait_conn_needed(comm, me, p, c))
                continue;
            int mine = entry_index(comm, tp_id, me, p, c, NULL);
            int theirs = entry_index(comm, tp_id, p, me, c, NULL);
            struct entry_ptrs m = entry_at(st->base[me], &l, mine);
            struct entry_ptrs t = entry_at(st->base[p], &l, theirs);
            struct plait_conn *conn = &st->conn_mem[st->nconns++];
            conn->tp = tp;
            conn->peer = p;
            conn->cls = c;
            conn->needs_progress = 0;
            conn->nslots = comm->set.nslots;
            conn->slot_bytes = comm->set.slot_bytes;
            conn->tx_slots = t.slots;
            conn->tx_sizes = t.sizes;
            conn->tx_tail = t.tail;
            conn->tx_head = m.head;
            conn->rx_slots = m.slots;
            conn->rx_sizes = m.sizes;
            conn->rx_tail = m.tail;
            conn->rx_head = t.head;
            comm->conns[p * comm->ncls + c] = conn;
        }
    }
    comm->tp_state[tp_id] = st;
    if (fast_bytes) {
        size_t *off = calloc((size_t)n, sizeof(*off));
        if (off) {
            for (int p = 0; p < n; p++) {
                int entries = 0;
                entry_index(comm, tp_id, p, -1, -1, &entries);
                off[p] = SEG_HEADER + (size_t)entries * l.entry_bytes;
            }
            plait_fast_attach(comm, tp_id, st->base, off);
            free(off);
        }
    }
    for (int p = 0; p < n; p++)
        if (st->base[p]) {
            if (p == me)
                comm->my_ops = (uint64_t *)st->base[p];
            else
                comm->peer_ops[p] = (const uint64_t *)st->base[p];
        }
    free(cards);
    if (my_entries > 0)
        PLAIT_INFO(PLAIT_SUBSYS_TRANSPORT, "%s: rank %d segment of %zu bytes, %d connections", tp->name, me, my_bytes,
                   st->nconns);
    return PLAIT_SUCCESS;

err_free:
    free(cards);
    shm_free_state(comm, st);
    return status;
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
static int sc_any_shm_pair(const struct plait_comm *comm)
{
    int *first = malloc(sizeof(int) * (size_t)(comm->nhosts > 0 ? comm->nhosts : 1));
    if (!first)
        return -1;
    for (int h = 0; h < comm->nhosts; h++)
        first[h] = -1;
    int found = 0;
    for (int r = 0; r < comm->nranks && !found; r++) {
        const int h = comm->ranks[r].host_index;
        if (h < 0 || h >= comm->nhosts)
            continue;
        if (first[h] < 0)
            first[h] = r;
        else
            found = plait_pair_transport(comm, first[h], r) == PLAIT_TP_SHM;
    }
    free(first);
    return found;
}

/* Probes process_vm_readv (collective); *verdicts_out: one per rank, for the
 * caller to free. */
static plait_result_t sc_probe(struct plait_comm *comm, struct sc_verdict **verdicts_out)
{
    const int n = comm->nranks, me = comm->rank;
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
    plait_result_t status = plait_bootstrap_allgather(comm->bs, cards, sizeof(*cards));
    if (status)
        goto out;
    v[me].peer = -1;
    for (int p = 0; p < n && !v[me].err; p++) {
        if (p == me || plait_pair_transport(comm, me, p) != PLAIT_TP_SHM)
            continue;
        uint64_t got = 0;
        struct iovec local = {&got, sizeof(got)};
        struct iovec remote = {(void *)(uintptr_t)cards[p].addr, sizeof(got)};
        ssize_t k = process_vm_readv((pid_t)comm->ranks[p].pid, &local, 1, &remote, 1, 0);
        int err = k < 0 ? errno : k != (ssize_t)sizeof(got) ? SC_ERR_SHORT : got != cards[p].value ? SC_ERR_VALUE : 0;
        if (err) {
            v[me].err = err;
            v[me].peer = p;
        }
    }
    status = plait_bootstrap_allgather(comm->bs, v, sizeof(*v));
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

/* Turns single copy on for the connections of tp_id where PLAIT_CMA and (for
 * shm) the probe allow it. Collective for shm. */
static plait_result_t sc_setup(struct plait_comm *comm, int tp_id)
{
    struct shm_state *st = comm->tp_state[tp_id];
    if (comm->set.cma == PLAIT_CMA_OFF || !st)
        return PLAIT_SUCCESS;
    if (tp_id == PLAIT_TP_INPROC) {
        for (int i = 0; i < st->nconns; i++)
            st->conn_mem[i].sc_mode = PLAIT_SC_LOCAL;
        return PLAIT_SUCCESS;
    }
    const int any = sc_any_shm_pair(comm);
    if (any < 0)
        return plait_error(PLAIT_ERR_SYSTEM, "shm: out of memory");
    if (!any)
        return PLAIT_SUCCESS; /* the same on every rank: nobody probes */
    struct sc_verdict *v = NULL;
    plait_result_t status = sc_probe(comm, &v);
    if (status)
        return status;
    int bad = -1;
    for (int r = 0; r < comm->nranks && bad < 0; r++)
        if (v[r].err)
            bad = r;
    if (bad >= 0) {
        /* Every rank has the same verdicts, so every rank says the same. */
        char who[160], whom[160], why[256];
        const int peer = v[bad].peer;
        plait_peer_str(comm, bad, who, sizeof(who));
        if (peer >= 0 && peer < comm->nranks)
            plait_peer_str(comm, peer, whom, sizeof(whom));
        else
            snprintf(whom, sizeof(whom), "a peer");
        sc_err_str(v[bad].err, why, sizeof(why));
        free(v);
        if (comm->set.cma == PLAIT_CMA_REQUIRE)
            return plait_error(PLAIT_ERR_SYSTEM,
                               "shm: PLAIT_CMA=1 requires single copy, but %s cannot read the memory of %s with "
                               "process_vm_readv: %s",
                               who, whom, why);
        if (st->nconns > 0)
            PLAIT_INFO(PLAIT_SUBSYS_TRANSPORT,
                       "shm: rank %d: single copy (CMA) off, the FIFO path carries everything: %s cannot read the "
                       "memory of %s with process_vm_readv: %s",
                       comm->rank, who, whom, why);
        return PLAIT_SUCCESS;
    }
    free(v);
    if (st->nconns == 0)
        return PLAIT_SUCCESS;
    /* One bounce buffer per communicator: a reducing step reads a piece of a
     * peer's bytes into it and reduces from there while it is in cache. */
    if (posix_memalign((void **)&st->sc_bounce, 64, comm->set.slot_bytes))
        return plait_error(PLAIT_ERR_SYSTEM, "shm: cannot allocate %llu bytes for single copy",
                           (unsigned long long)comm->set.slot_bytes);
    for (int i = 0; i < st->nconns; i++) {
        struct plait_conn *c = &st->conn_mem[i];
        c->sc_mode = PLAIT_SC_CMA;
        c->sc_pid = comm->ranks[c->peer].pid;
        c->sc_bounce = st->sc_bounce;
    }
    if (comm->set.cma_min_bytes == UINT64_MAX)
        PLAIT_INFO(PLAIT_SUBSYS_TRANSPORT,
                   "shm: rank %d: single copy (CMA, process_vm_readv) allowed on %d connections but not used: "
                   "PLAIT_CMA_MIN_BYTES is unset",
                   comm->rank, st->nconns);
    else
        PLAIT_INFO(PLAIT_SUBSYS_TRANSPORT,
                   "shm: rank %d: single copy (CMA, process_vm_readv) on for %d connections, steps of %llu bytes or "
                   "more",
                   comm->rank, st->nconns, (unsigned long long)comm->set.cma_min_bytes);
    return PLAIT_SUCCESS;
}

static plait_result_t shm_setup(struct plait_comm *comm)
{
    plait_result_t status = setup_common(comm, PLAIT_TP_SHM);
    return status ? status : sc_setup(comm, PLAIT_TP_SHM);
}

static plait_result_t inproc_setup(struct plait_comm *comm)
{
    plait_result_t status = setup_common(comm, PLAIT_TP_INPROC);
    return status ? status : sc_setup(comm, PLAIT_TP_INPROC);
}

static void shm_teardown_any(struct plait_comm *comm, int tp_id)
{
    struct shm_state *st = comm->tp_state[tp_id];
    if (!st)
        return;
    plait_fast_detach(comm, tp_id);
    for (int p = 0; p < comm->nranks; p++)
        if (st->base[p]) {
            if (p == comm->rank)
                comm->my_ops = comm->local_ops;
            else
                comm->peer_ops[p] = NULL;
        }
    comm->tp_state[tp_id] = NULL;
    shm_free_state(comm, st);
}

static void shm_teardown(struct plait_comm *comm)
{
    shm_teardown_any(comm, PLAIT_TP_SHM);
}

static void inproc_teardown(struct plait_comm *comm)
{
    shm_teardown_any(comm, PLAIT_TP_INPROC);
}

const struct plait_transport plait_transport_shm = {
    .name = "shm",
    .setup = shm_setup,
    .progress = no_progress,
    .is_flushed = always_flushed,
    .teardown = shm_teardown,
};

const struct plait_transport plait_transport_inproc = {
    .name = "inproc",
    .setup = inproc_setup,
    .progress = no_progress,
    .is_flushed = always_flushed,
    .teardown = inproc_teardown,
};
