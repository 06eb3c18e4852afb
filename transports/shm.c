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
#include <unistd.h>

#include "../src/bootstrap.h"
#include "../src/comm.h"
#include "../src/log.h"
#include "../src/socket.h"
#include "transport.h"

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
    size_t my_bytes = SEG_HEADER + (size_t)my_entries * l.entry_bytes;
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
        size_t bytes = SEG_HEADER + (size_t)entries * l.entry_bytes;
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

static plait_result_t shm_setup(struct plait_comm *comm)
{
    return setup_common(comm, PLAIT_TP_SHM);
}

static plait_result_t inproc_setup(struct plait_comm *comm)
{
    return setup_common(comm, PLAIT_TP_INPROC);
}

static void shm_teardown_any(struct plait_comm *comm, int tp_id)
{
    struct shm_state *st = comm->tp_state[tp_id];
    if (!st)
        return;
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
