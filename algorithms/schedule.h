/* Schedules: what an algorithm emits (docs/architecture.md, section 3).
 *
 * For each rank and channel an algorithm is an ordered list of steps over element
 * ranges of the user's buffers. A step is computed, never stored: a generator maps
 * (collective, nranks, rank, channel, step index) to a step, so a schedule costs
 * no memory whatever the rank count. The executor splits each step into pieces of
 * at most one FIFO slot; both ends of a connection compute the same pieces, so
 * nothing about sizes crosses the wire.
 *
 * This header is kept in the common subset of C and CUDA C++ (no _Atomic, no
 * designated initialisers out of order): the GPU kernel will interpret the same
 * steps. */
#ifndef PLAIT_SCHED_H
#define PLAIT_SCHED_H

#include <stdint.h>

enum plait_coll {
    PLAIT_COLL_ALLREDUCE = 0,
    PLAIT_COLL_BROADCAST,
    PLAIT_COLL_REDUCE,
    PLAIT_COLL_ALLGATHER,
    PLAIT_COLL_REDUCESCATTER,
    PLAIT_COLL_ALLTOALL,
    PLAIT_COLL_GATHER,
    PLAIT_COLL_SCATTER,
    PLAIT_COLL_SEND,
    PLAIT_COLL_RECV,
    PLAIT_COLL_BARRIER,
    PLAIT_COLL_COUNT
};

enum plait_step_kind {
    PLAIT_STEP_SEND = 0,           /* src -> send_peer */
    PLAIT_STEP_RECV,               /* recv_peer -> dst */
    PLAIT_STEP_RECV_REDUCE_SEND,   /* src OP recv -> send_peer */
    PLAIT_STEP_RECV_REDUCE_COPY,   /* src OP recv -> dst */
    PLAIT_STEP_RECV_REDUCE_COPY_SEND, /* src OP recv -> dst and send_peer */
    PLAIT_STEP_RECV_COPY_SEND,     /* recv -> dst and send_peer */
    PLAIT_STEP_COPY,               /* src -> dst, locally */
    /* src -> send_peer and, independently, recv_peer -> dst: both halves move
     * `count` elements, each piece of a half as soon as that half can (a credit
     * for the send, a filled slot for the receive); the step ends when both
     * have. The data sent does not depend on the data received (exchanges:
     * Bruck, recursive doubling). */
    PLAIT_STEP_SENDRECV,
    /* Local, whole: dst = post(pre(src) OP dst) (accumulates src into dst;
     * the reduce_local of the literature). */
    PLAIT_STEP_REDUCE,
    /* Like SENDRECV, but the receive half reduces what arrives into dst:
     * dst = post(dst OP recv). The send half sends src unchanged. Only the POST
     * flag is allowed (PRE: apply it with a COPY first). Recursive halving. */
    PLAIT_STEP_SENDRECV_REDUCE,
    PLAIT_STEP_KINDS
};

/* What each kind does, for the executor and the verifier alike: whether it
 * receives from recv_peer, sends to send_peer, reads src, writes dst. */
static inline int plait_step_is_sendrecv(int kind)
{
    return kind == PLAIT_STEP_SENDRECV || kind == PLAIT_STEP_SENDRECV_REDUCE;
}

static inline int plait_step_recvs(int kind)
{
    return kind != PLAIT_STEP_SEND && kind != PLAIT_STEP_COPY && kind != PLAIT_STEP_REDUCE;
}

static inline int plait_step_sends(int kind)
{
    return kind == PLAIT_STEP_SEND || kind == PLAIT_STEP_RECV_REDUCE_SEND || kind == PLAIT_STEP_RECV_COPY_SEND ||
           kind == PLAIT_STEP_RECV_REDUCE_COPY_SEND || plait_step_is_sendrecv(kind);
}

static inline int plait_step_reads_src(int kind)
{
    return kind == PLAIT_STEP_SEND || kind == PLAIT_STEP_RECV_REDUCE_SEND || kind == PLAIT_STEP_RECV_REDUCE_COPY ||
           kind == PLAIT_STEP_RECV_REDUCE_COPY_SEND || kind == PLAIT_STEP_COPY || kind == PLAIT_STEP_REDUCE ||
           plait_step_is_sendrecv(kind);
}

static inline int plait_step_writes_dst(int kind)
{
    return kind == PLAIT_STEP_RECV || kind == PLAIT_STEP_RECV_REDUCE_COPY || kind == PLAIT_STEP_RECV_REDUCE_COPY_SEND ||
           kind == PLAIT_STEP_RECV_COPY_SEND || kind == PLAIT_STEP_COPY || kind == PLAIT_STEP_REDUCE ||
           plait_step_is_sendrecv(kind);
}

/* Buffers a step reads or writes. SCRATCH is a per-operation buffer of the
 * executor's, of the size the algorithm's scratch() function asks for (in
 * elements, per rank, for all channels together); its content is undefined until
 * a step writes it. */
enum plait_buf { PLAIT_BUF_INPUT = 0, PLAIT_BUF_OUTPUT = 1, PLAIT_BUF_SCRATCH = 2 };

/* Step flags: how the reduction treats the data (see reduce.h). */
#define PLAIT_STEP_PRE 1u  /* src is this rank's own contribution: apply the pre-op */
#define PLAIT_STEP_POST 2u /* the result is final: apply the post-op */

struct plait_step {
    uint8_t kind;     /* enum plait_step_kind */
    uint8_t src_buf;  /* enum plait_buf */
    uint8_t dst_buf;  /* enum plait_buf */
    uint8_t flags;    /* PLAIT_STEP_PRE | PLAIT_STEP_POST */
    int32_t send_peer;
    int32_t recv_peer;
    uint64_t src_off; /* elements */
    uint64_t dst_off; /* elements */
    uint64_t count;   /* elements; may be 0 (both ends then move nothing) */
};

/* Everything a generator needs; identical on every rank except `rank`. */
struct plait_sched_args {
    int coll;              /* enum plait_coll */
    int nranks;
    int rank;
    int root;              /* broadcast/reduce/gather/scatter; peer for send/recv */
    uint64_t count;        /* the collective's count argument (per rank for allgather/reducescatter/alltoall) */
    int nchannels;         /* channels the data is split over */
    uint64_t chunk_elems;  /* elements per step per rank-chunk (a multiple of align_elems) */
    uint64_t align_elems;  /* elements in 16 bytes (chunk boundaries are 16-byte aligned) */
    int radix;             /* tree radix for k-nomial trees (0 or 2: binomial) */
    /* The node map: host index (0..nhosts-1, dense, in order of first rank) and
     * index among its host's ranks, per rank. NULL: every rank on one host. */
    int nhosts;
    const int32_t *host_of;
    const int32_t *local_of;
    /* Per channel, the ring order: order[channel * nranks + i] is the i-th rank
     * of the ring and pos[channel * nranks + r] the place of rank r in it. NULL:
     * the identity (until topology search supplies orders). */
    const int32_t *order;
    const int32_t *pos;
};

/* The place of `rank` in channel's ring order, and the rank at place i. */
static inline int plait_sched_pos(const struct plait_sched_args *a, int channel, int rank)
{
    return a->pos ? a->pos[(long)channel * a->nranks + rank] : rank;
}

static inline int plait_sched_at(const struct plait_sched_args *a, int channel, int i)
{
    return a->order ? a->order[(long)channel * a->nranks + i] : i;
}

/* Elements of SCRATCH an algorithm needs on args->rank (for every channel). */
typedef uint64_t (*plait_scratch_fn)(const struct plait_sched_args *args);

/* Step `idx` of `channel` on args->rank. Returns 1 and fills *out when that step
 * exists, 0 when the channel's schedule has fewer steps. */
typedef int (*plait_step_fn)(const struct plait_sched_args *args, int channel, uint64_t idx,
                             struct plait_step *out);

static inline uint64_t plait_umin(uint64_t a, uint64_t b)
{
    return a < b ? a : b;
}

/* x rounded up to a multiple of a (a >= 1). */
static inline uint64_t plait_round_up(uint64_t x, uint64_t a)
{
    return (x + a - 1) / a * a;
}

/* The element range [*lo, *hi) of `total` elements that `channel` handles:
 * contiguous, 16-byte aligned boundaries, possibly empty. */
static inline void plait_sched_channel_range(uint64_t total, int nchannels, int channel, uint64_t align,
                                             uint64_t *lo, uint64_t *hi)
{
    uint64_t per = (total + (uint64_t)nchannels - 1) / (uint64_t)nchannels;
    per = (per + align - 1) / align * align;
    uint64_t l = per * (uint64_t)channel;
    uint64_t h = l + per;
    if (l > total)
        l = total;
    if (h > total)
        h = total;
    *lo = l;
    *hi = h;
}

/* The largest range any channel handles (channel 0's), and the most of it one
 * chunk covers: the per-channel size of a chunk-sized SCRATCH slot. */
static inline uint64_t plait_sched_max_channel_range(const struct plait_sched_args *a)
{
    uint64_t lo, hi;
    plait_sched_channel_range(a->count, a->nchannels, 0, a->align_elems, &lo, &hi);
    return hi - lo;
}

static inline uint64_t plait_sched_chunk_slot(const struct plait_sched_args *a)
{
    return plait_umin(a->chunk_elems, plait_sched_max_channel_range(a));
}

/* The chunk iteration of a step: a channel walks its range in chunks of
 * chunk_elems, `steps` steps per chunk. For step idx, fills the chunk's first
 * element *base, its length *len and the step's index within it *s; returns 0
 * when idx is past the channel's last chunk (or the range is empty). */
static inline int plait_sched_chunk_iter(const struct plait_sched_args *a, int channel, uint64_t idx, uint64_t steps,
                                         uint64_t *base, uint64_t *len, uint64_t *s)
{
    uint64_t lo, hi;
    plait_sched_channel_range(a->count, a->nchannels, channel, a->align_elems, &lo, &hi);
    const uint64_t iter = idx / steps;
    if (lo >= hi || iter >= (hi - lo + a->chunk_elems - 1) / a->chunk_elems)
        return 0;
    *s = idx % steps;
    *base = lo + iter * a->chunk_elems;
    *len = hi - *base < a->chunk_elems ? hi - *base : a->chunk_elems;
    return 1;
}

/* Every collective on one rank: one COPY per channel of its range, with PRE|POST
 * for the reductions (avg and premulsum still apply). Returns like a generator. */
static inline int plait_sched_single_rank(const struct plait_sched_args *a, int channel, uint64_t idx,
                                          struct plait_step *out)
{
    uint64_t lo, hi;
    if (idx > 0)
        return 0;
    plait_sched_channel_range(a->count, a->nchannels, channel, a->align_elems, &lo, &hi);
    out->kind = PLAIT_STEP_COPY;
    out->src_buf = PLAIT_BUF_INPUT;
    out->dst_buf = PLAIT_BUF_OUTPUT;
    out->flags = a->coll == PLAIT_COLL_ALLREDUCE || a->coll == PLAIT_COLL_REDUCE ||
                         a->coll == PLAIT_COLL_REDUCESCATTER
                     ? (uint8_t)(PLAIT_STEP_PRE | PLAIT_STEP_POST)
                     : 0;
    out->send_peer = -1;
    out->recv_peer = -1;
    out->src_off = lo;
    out->dst_off = lo;
    out->count = hi - lo;
    return 1;
}

/* Adds rank +- d (mod nranks) to a peer list of *cnt entries (at most max),
 * skipping rank itself and peers already listed. For the algorithms' peers(). */
static inline void plait_peers_add_distance(int nranks, int rank, long d, int *out, int *cnt, int max)
{
    const int cand[2] = {(int)((rank + d) % nranks), (int)((rank - d % nranks + nranks) % nranks)};
    for (int c = 0; c < 2; c++) {
        int dup = cand[c] == rank;
        for (int i = 0; i < *cnt && !dup; i++)
            dup = out[i] == cand[c];
        if (!dup && *cnt < max)
            out[(*cnt)++] = cand[c];
    }
}

/* Every other rank, nearest (rank+1) first: the peers of the all-pairs
 * algorithms. O(n), no duplicate scan. */
static inline int plait_peers_all(int nranks, int rank, int *out, int max)
{
    int cnt = 0;
    for (int d = 1; d < nranks && cnt < max; d++)
        out[cnt++] = (rank + d) % nranks;
    return cnt;
}

/* rank +- 2^i (mod nranks): the peers of binomial trees, Bruck, PAT and the
 * dissemination barrier. */
static inline int plait_peers_pow2(int nranks, int rank, int *out, int max)
{
    int cnt = 0;
    for (long d = 1; d < nranks; d *= 2)
        plait_peers_add_distance(nranks, rank, d, out, &cnt, max);
    return cnt;
}

/* Ring generators (algorithms/ring.c): allreduce, broadcast, reduce, allgather,
 * reducescatter. Each channel's ring follows args->order (the identity when
 * NULL); the table's ring peers are rank +- 1, which is right for the identity
 * only: whoever supplies other orders must also connect the order's
 * neighbours (plait_algo_connects does not see the orders). */
int plait_ring_step(const struct plait_sched_args *args, int channel, uint64_t idx, struct plait_step *out);

/* k-nomial tree broadcast (algorithms/tree.c). */
int plait_knomial_step(const struct plait_sched_args *args, int channel, uint64_t idx, struct plait_step *out);

/* Bruck allgather (algorithms/bruck.c) and its peers (rank +- 2^k). */
int plait_bruck_step(const struct plait_sched_args *args, int channel, uint64_t idx, struct plait_step *out);
int plait_bruck_peers(int nranks, int rank, int radix, int *out, int max);

/* The ranks `rank` exchanges with in any k-nomial tree over nranks ranks, for
 * any root; writes at most max of them and returns how many. */
int plait_knomial_peers(int nranks, int rank, int radix, int *out, int max);

#endif
