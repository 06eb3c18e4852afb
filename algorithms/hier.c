/* Hierarchical (node-aware, two-level) allreduce, reducescatter and allgather.
 *
 * The node map (args->nhosts, host_of, local_of) puts rank r on host h(r) with
 * local index j(r); L(h) ranks live on host h, H hosts in all. Ranks exchange
 * inside a host along an intra-host ring in local-index order, and across
 * hosts along "column" rings: column c is the ring, in host order, of the
 * ranks with local index c, one per host.
 *
 * Irregular maps. A column needs a rank on every host, so there are P columns,
 * P <= the smallest host: P = max(1, n - (H-1) * Lmax), the smallest host size
 * that n, H and the largest host Lmax allow. It is exact when every host but
 * at most one is full (a partial last host, as with N consecutive ranks per
 * node), smaller otherwise (then more ranks idle across hosts). Ranks with
 * j >= P ("extras") are in no column: in allreduce they only work inside their
 * host (the data is split in P parts, so they own none); in reducescatter and
 * allgather, whose blocks belong to ranks, extra (h, i) is served by its host's
 * column member (h, i mod P), which carries its block across hosts (at most
 * M = ceil(Lmax / P) blocks per member and host). One host: everything is the
 * intra-host ring (P = n); one rank per host: the column ring.
 *
 * Allreduce. An iteration covers P * H * chunk elements: P parts (part c for
 * column c) of H cells each (cell (c, t) at most chunk_elems, laid out t-major
 * so that one t is contiguous). Per iteration, on rank (h, j):
 *   1. intra-host reduce-scatter, one ring per t (L steps each): cell (c, t)
 *      ends on local c, summed over the host (PRE on each input; POST when
 *      H = 1); ring blocks of extras are empty (count 0);
 *   2. column j (j < P, H > 1): ring allreduce over the hosts of part j's H
 *      cells (2H-1 steps): cell (j, t) is finished on host t (POST) and copied
 *      to the others; a rank alone on its host reads its input (PRE) directly;
 *   3. intra-host allgather, one ring per t (L steps each).
 * Each element is finished once (phase 2, or phase 1 when H = 1) and copied,
 * so every rank gets the same bits: the sum over hosts, in column-ring order,
 * of the host sums, in intra-ring order. A short last iteration leaves out the
 * rings (of t, or of a column) whose cells are all empty.
 *
 *   6 ranks on 2 hosts (L = 3, P = 3), one t; S0 = x0+x1+x2, S1 = x3+x4+x5
 *            host 0                  host 1
 *        r0    r1    r2          r3    r4    r5          local index 0 1 2
 *   1.  r0 -> r1 -> r2 -> r0     r3 -> r4 -> r5 -> r3    ring reduce-scatter
 *       S0.0  S0.1  S0.2         S1.0  S1.1  S1.2        (Sh.c: part c of Sh)
 *   2.  r0 <-----------------------> r3                  column 0: part 0
 *             r1 <-----------------------> r4            column 1: part 1
 *                   r2 <-----------------------> r5      column 2: part 2
 *       T.0   T.1   T.2          T.0   T.1   T.2         (T = S0 + S1)
 *   3.  r0 -> r1 -> r2 -> r0     r3 -> r4 -> r5 -> r3    ring allgather: T
 *
 * Reducescatter (the mirror of the allgather below). An iteration covers
 * chunk_elems of every block. Column c "owns" the blocks of ranks (h', c + m*P)
 * for every host h' and m < M. 1. intra-host ring reduce-scatter, one ring per
 * (h', m) (L steps each): member c gets its host's sum of those blocks, in
 * SCRATCH (H*M slots of up to a chunk per channel); 2. column ring
 * reduce-scatter over hosts, one ring per m (H steps each): the member on host
 * h' finishes block (h', c + m*P) (POST), into its output for m = 0 and SCRATCH
 * otherwise; 3. each member SENDs its extras their finished block.
 *
 * Allgather: across hosts first, then inside. 0. each extra SENDs its input to
 * its member, which RECVs it into place in its output (and COPYs its own);
 * 1. column ring allgather over hosts, one ring per m (H steps each): every
 * member of column c has the blocks of column c from every host; 2. intra-host
 * ring allgather, one ring per (h', m) (L steps each): the columns spread
 * inside each host. Each block crosses between hosts H-1 times, as in a flat
 * ring, but its path has H-1 + L-1 hops instead of n-1.
 * In both, rings whose blocks are all missing (m*P >= L(h')) are left out
 * where the host sizes are known.
 *
 * Every ring moves at most a chunk per step and sends before it receives only
 * at its first step, as the flat ring does, so chunk <= half the FIFO keeps it
 * deadlock-free; rings follow each other in the same order on both ends of
 * every connection.
 *
 * Peers: the map is not known at init (peers() does not receive it), and a
 * host ring or a column can join any two ranks, so hier lists every rank;
 * those connections are made only when hier is forced (PLAIT_ALGO).
 *
 * Cost of a step. The host sizes are found in O(1) for one host or one rank
 * per host, in O(H) when hosts are consecutive blocks with a last host of any
 * size (proved from the map, see sizes_from_blocks), and by one O(n) pass
 * otherwise; a rank is found by (host, local index) in O(1) when hosts are
 * consecutive blocks or dealt round-robin, by an O(n) scan otherwise. */
#include "algorithms/algorithms.h"

struct hier_map {
    int n, H;
    int h, j; /* this rank's host and local index */
    int L;    /* ranks on this host */
    int Lmax; /* ranks on the largest host */
    int P;    /* columns */
    int M;    /* blocks per member and host: ceil(Lmax / P) */
    int blk;  /* ranks per block when hosts sit in consecutive blocks (a hint) */
    int last; /* ranks on host H-1 when every host's size is known (else 0) */
    const int32_t *host_of, *local_of;
};

static int is_at(const struct hier_map *m, long g, int hh, int i)
{
    return g >= 0 && g < m->n && m->host_of[g] == hh && m->local_of[g] == i;
}

/* Host sizes without a pass over the map, when it is H-1 blocks of B ranks and
 * a last host of R (any R): the last rank is its host's last, so host H-1 has
 * exactly R ranks; each other host has at least B (its local B-1 is where the
 * blocks put it); and (H-1)*B + R = n leaves no room for more. O(H). */
static int sizes_from_blocks(struct hier_map *m)
{
    const int n = m->n, H = m->H;
    const int R = m->local_of[n - 1] + 1;
    if (m->host_of[n - 1] != H - 1 || (n - R) % (H - 1) != 0)
        return 0;
    const int B = (n - R) / (H - 1);
    if (B < 1)
        return 0;
    for (int hh = 0; hh < H - 1; hh++)
        if (!is_at(m, (long)hh * B + B - 1, hh, B - 1))
            return 0;
    m->L = m->h == H - 1 ? R : B;
    m->Lmax = B > R ? B : R;
    m->blk = B;
    m->last = R;
    return 1;
}

static void map_init(const struct plait_sched_args *a, struct hier_map *m)
{
    const int n = a->nranks;
    m->n = n;
    if (!a->host_of || !a->local_of || a->nhosts <= 1) {
        m->H = 1;
        m->h = 0;
        m->j = a->rank;
        m->L = m->Lmax = m->P = m->blk = m->last = n;
        m->M = 1;
        m->host_of = m->local_of = NULL;
        return;
    }
    m->host_of = a->host_of;
    m->local_of = a->local_of;
    m->H = a->nhosts;
    m->h = a->host_of[a->rank];
    m->j = a->local_of[a->rank];
    m->last = 0;
    if (m->H == n) { /* n hosts for n ranks: one each */
        m->L = m->Lmax = m->blk = m->last = 1;
    } else if (!sizes_from_blocks(m)) {
        int32_t lmax = 0, cnt = 0;
        for (int r = 0; r < n; r++) {
            lmax = a->local_of[r] > lmax ? a->local_of[r] : lmax;
            cnt += a->host_of[r] == m->h;
        }
        m->L = cnt;
        m->Lmax = m->blk = lmax + 1;
    }
    const long p = (long)n - (long)(m->H - 1) * m->Lmax;
    m->P = p > 1 ? (int)p : 1;
    m->M = (m->Lmax + m->P - 1) / m->P;
}

/* The rank with local index i on host hh, or -1 when that host has fewer ranks. */
static int rank_at(const struct hier_map *m, int rank, int hh, int i)
{
    if (!m->host_of)
        return hh == 0 && i >= 0 && i < m->n ? i : -1;
    if (hh < 0 || hh >= m->H || i < 0 || i >= m->Lmax || (hh == m->h && i >= m->L))
        return -1;
    if (m->last && i >= (hh == m->H - 1 ? m->last : m->blk))
        return -1;
    /* hosts in consecutive blocks (this one, or all of blk ranks), or dealt round-robin */
    const long hints[3] = {hh == m->h ? (long)rank - m->j + i : -1, (long)hh * m->blk + i, (long)i * m->H + hh};
    for (int k = 0; k < 3; k++)
        if (is_at(m, hints[k], hh, i))
            return (int)hints[k];
    /* the last rank is the last of its host: that host has no higher index */
    if (m->host_of[m->n - 1] == hh && m->local_of[m->n - 1] < i)
        return -1;
    for (int g = 0; g < m->n; g++)
        if (m->host_of[g] == hh && m->local_of[g] == i)
            return g;
    return -1;
}

static void put(struct plait_step *st, int kind, int src_buf, uint64_t src_off, int dst_buf, uint64_t dst_off,
                uint64_t count, unsigned flags, int send_peer, int recv_peer)
{
    st->kind = (uint8_t)kind;
    st->src_buf = (uint8_t)src_buf;
    st->dst_buf = (uint8_t)dst_buf;
    st->flags = (uint8_t)flags;
    st->send_peer = send_peer;
    st->recv_peer = recv_peer;
    st->src_off = src_off;
    st->dst_off = dst_off;
    st->count = count;
}

/* Kinds of step q of a ring of R >= 2 ranks: reduce-scatter (q < R; the block
 * is p-q-1), allgather without the own copy (q < R; the block is p-q) and
 * allreduce (q < 2R-1; the chunk is p-q-1). */
static int rs_kind(uint64_t q, uint64_t R)
{
    return q == 0 ? PLAIT_STEP_SEND : q < R - 1 ? PLAIT_STEP_RECV_REDUCE_SEND : PLAIT_STEP_RECV_REDUCE_COPY;
}

static int ag_kind(uint64_t q, uint64_t R)
{
    return q == 0 ? PLAIT_STEP_SEND : q < R - 1 ? PLAIT_STEP_RECV_COPY_SEND : PLAIT_STEP_RECV;
}

static int ar_kind(uint64_t q, uint64_t R)
{
    if (q == 0)
        return PLAIT_STEP_SEND;
    if (q < R - 1)
        return PLAIT_STEP_RECV_REDUCE_SEND;
    if (q == R - 1)
        return PLAIT_STEP_RECV_REDUCE_COPY_SEND;
    return q < 2 * R - 2 ? PLAIT_STEP_RECV_COPY_SEND : PLAIT_STEP_RECV;
}

/* Neighbours on this host's ring and on this rank's column ring. */
static int intra_next(const struct hier_map *m, int rank)
{
    return rank_at(m, rank, m->h, (m->j + 1) % m->L);
}

static int intra_prev(const struct hier_map *m, int rank)
{
    return rank_at(m, rank, m->h, (m->j + m->L - 1) % m->L);
}

static int inter_next(const struct hier_map *m, int rank)
{
    return rank_at(m, rank, (m->h + 1) % m->H, m->j);
}

static int inter_prev(const struct hier_map *m, int rank)
{
    return rank_at(m, rank, (m->h + m->H - 1) % m->H, m->j);
}

/* ------------------------------------------------------------------ allreduce */

/* An allreduce iteration of len elements: P*H cells of cs, cell (c, t) at
 * (t*P + c)*cs, clipped to len. */
struct ar_iter {
    uint64_t base, len, cs, P;
    uint64_t T;     /* rings per intra-host phase: the t whose cells are not all empty */
    int has_column; /* whether this rank's column ring runs */
};

static uint64_t cell_lo(const struct ar_iter *it, uint64_t c, uint64_t t)
{
    return plait_umin((t * it->P + c) * it->cs, it->len);
}

static uint64_t cell_n(const struct ar_iter *it, uint64_t c, uint64_t t)
{
    return c < it->P ? plait_umin((t * it->P + c + 1) * it->cs, it->len) - cell_lo(it, c, t) : 0;
}

static void ar_iter_init(const struct plait_sched_args *a, const struct hier_map *m, uint64_t base, uint64_t len,
                         struct ar_iter *it)
{
    const uint64_t P = (uint64_t)m->P, H = (uint64_t)m->H, j = (uint64_t)m->j;
    it->base = base;
    it->len = len;
    it->P = P;
    it->cs = plait_round_up((len + P * H - 1) / (P * H), a->align_elems);
    /* a short last iteration leaves the high cells empty: the rings of t with
     * no data, and column rings with no data, are left out (every rank of a
     * ring computes the same) */
    const uint64_t span = P * it->cs;
    it->T = plait_umin(H, (len + span - 1) / span);
    it->has_column = j < P && H > 1 && j * it->cs < len;
}

static uint64_t ar_steps(const struct hier_map *m, const struct ar_iter *it)
{
    const uint64_t L = (uint64_t)m->L, H = (uint64_t)m->H;
    return (L > 1 ? 2 * it->T * L : 0) + (it->has_column ? 2 * H - 1 : 0);
}

static int allreduce_step(const struct plait_sched_args *a, const struct hier_map *m, int channel, uint64_t idx,
                          struct plait_step *out)
{
    const uint64_t H = (uint64_t)m->H, L = (uint64_t)m->L, j = (uint64_t)m->j, h = (uint64_t)m->h;
    uint64_t lo, hi;
    plait_sched_channel_range(a->count, a->nchannels, channel, a->align_elems, &lo, &hi);
    const uint64_t per_iter = (uint64_t)m->P * H * a->chunk_elems;
    /* every iteration but the last is full and has the same steps */
    const uint64_t nfull = (hi - lo) / per_iter;
    struct ar_iter it;
    ar_iter_init(a, m, lo, per_iter, &it);
    const uint64_t spi_full = ar_steps(m, &it);
    uint64_t s;
    if (idx < nfull * spi_full) {
        ar_iter_init(a, m, lo + idx / spi_full * per_iter, per_iter, &it);
        s = idx % spi_full;
    } else {
        const uint64_t base = lo + nfull * per_iter;
        if (base >= hi)
            return 0;
        ar_iter_init(a, m, base, hi - base, &it);
        s = idx - nfull * spi_full;
        if (s >= ar_steps(m, &it))
            return 0;
    }
    const uint64_t n1 = L > 1 ? it.T * L : 0;            /* phases 1 and 3 */
    const uint64_t n2 = it.has_column ? 2 * H - 1 : 0; /* phase 2 */
    if (s < n1 || s >= n1 + n2) { /* inside the host: one ring per t */
        const int is_rs = s < n1;
        if (!is_rs)
            s -= n1 + n2;
        const uint64_t t = s / L, q = s % L;
        const uint64_t b = is_rs ? (j + 2 * L - q - 1) % L : (j + L - q) % L;
        const uint64_t off = it.base + cell_lo(&it, b, t), cnt = cell_n(&it, b, t);
        const int next = intra_next(m, a->rank), prev = intra_prev(m, a->rank);
        if (is_rs)
            put(out, rs_kind(q, L), PLAIT_BUF_INPUT, off, PLAIT_BUF_OUTPUT, off, cnt,
                PLAIT_STEP_PRE | (q == L - 1 && H == 1 ? PLAIT_STEP_POST : 0), next, prev);
        else
            put(out, ag_kind(q, L), PLAIT_BUF_OUTPUT, off, PLAIT_BUF_OUTPUT, off, cnt, 0, next, prev);
        return 1;
    }
    /* across hosts: ring allreduce of part j (its cells t = 0..H-1) */
    const uint64_t q = s - n1, t = (h + 2 * H - q - 1) % H;
    const uint64_t off = it.base + cell_lo(&it, j, t), cnt = cell_n(&it, j, t);
    /* alone on its host, a rank has not copied its input: it reads it with PRE */
    const int src = L > 1 ? PLAIT_BUF_OUTPUT : PLAIT_BUF_INPUT;
    const unsigned pre = L > 1 ? 0 : PLAIT_STEP_PRE;
    const unsigned flags = q < H - 1 ? pre : q == H - 1 ? pre | PLAIT_STEP_POST : 0;
    put(out, ar_kind(q, H), src, off, PLAIT_BUF_OUTPUT, off, cnt, flags, inter_next(m, a->rank),
        inter_prev(m, a->rank));
    return 1;
}

/* ------------------------------------------------------------------ reducescatter, allgather */

/* Extras of member j on this host: locals j + P, j + 2P, ... below L. */
static uint64_t extras_of(const struct hier_map *m)
{
    return m->j < m->P ? (uint64_t)((m->L - m->j + m->P - 1) / m->P - 1) : 0;
}

/* The intra-host rings of a reducescatter or allgather iteration: one per
 * (host hh, m) whose column blocks (hh, b + m*P), b < P, are not all missing,
 * i.e. m*P < L(hh). Where the host sizes are known (hosts in blocks, or one
 * rank each) that is ceil(L(hh)/P) rings per host; otherwise M for every host
 * but this one (all ranks of the ring are on this host, so they agree). The
 * counts have one form: `co` rings per host but host `sp`, which has `cs`. */
struct subrings {
    uint64_t sp, co, cs;
};

static void subrings_init(const struct hier_map *m, struct subrings *sr)
{
    const uint64_t P = (uint64_t)m->P, M = (uint64_t)m->M;
    if (m->last) {
        sr->sp = (uint64_t)m->H - 1;
        sr->co = plait_umin(M, ((uint64_t)m->blk + P - 1) / P);
        sr->cs = plait_umin(M, ((uint64_t)m->last + P - 1) / P);
    } else {
        sr->sp = (uint64_t)m->h;
        sr->co = M;
        sr->cs = plait_umin(M, ((uint64_t)m->L + P - 1) / P);
    }
}

static uint64_t subrings_count(const struct hier_map *m, const struct subrings *sr)
{
    return ((uint64_t)m->H - 1) * sr->co + sr->cs;
}

/* The e-th ring: its host and m. */
static void subring_at(const struct subrings *sr, uint64_t e, uint64_t *hh, uint64_t *mm)
{
    const uint64_t before = sr->sp * sr->co;
    if (e < before) {
        *hh = e / sr->co;
        *mm = e % sr->co;
    } else if (e < before + sr->cs) {
        *hh = sr->sp;
        *mm = e - before;
    } else {
        *hh = sr->sp + 1 + (e - before - sr->cs) / sr->co;
        *mm = (e - before - sr->cs) % sr->co;
    }
}

/* Column rings of member j: one per m with j + m*P < Lmax (some host has it). */
static uint64_t column_rings(const struct hier_map *m)
{
    return (uint64_t)((m->Lmax - m->j + m->P - 1) / m->P);
}

static int reducescatter_step(const struct plait_sched_args *a, const struct hier_map *m, int channel, uint64_t idx,
                              struct plait_step *out)
{
    const uint64_t P = (uint64_t)m->P, H = (uint64_t)m->H, L = (uint64_t)m->L, M = (uint64_t)m->M;
    const uint64_t j = (uint64_t)m->j, h = (uint64_t)m->h;
    const int is_member = j < P;
    struct subrings sr;
    subrings_init(m, &sr);
    uint64_t lo, hi;
    plait_sched_channel_range(a->count, a->nchannels, channel, a->align_elems, &lo, &hi);
    const uint64_t n1 = L > 1 ? subrings_count(m, &sr) * L : 0;
    const uint64_t n2 = is_member && H > 1 ? column_rings(m) * H : 0;
    const uint64_t n3 = H > 1 ? (is_member ? extras_of(m) : 1) : 0;
    const uint64_t spi = n1 + n2 + n3;
    const uint64_t iter = idx / spi;
    uint64_t s = idx % spi;
    const uint64_t base = lo + iter * a->chunk_elems;
    if (base >= hi)
        return 0;
    const uint64_t len = plait_umin(a->chunk_elems, hi - base);
    /* SCRATCH: slot (hh, m) of each channel holds the host sum of block (hh, j + m*P) */
    const uint64_t slot = plait_sched_chunk_slot(a), sbase = (uint64_t)channel * H * M * slot;
    const uint64_t cnt_of = a->count;
    if (s < n1) { /* inside the host: one ring per (host hh, m) */
        uint64_t hh, mm;
        subring_at(&sr, s / L, &hh, &mm);
        const uint64_t q = s % L, b = (j + 2 * L - q - 1) % L;
        const int target = b < P ? rank_at(m, a->rank, (int)hh, (int)(b + mm * P)) : -1;
        const uint64_t src = target >= 0 ? (uint64_t)target * cnt_of + base : 0;
        const uint64_t cnt = target >= 0 ? len : 0;
        const int last = q == L - 1;
        const int dst_buf = H == 1 ? PLAIT_BUF_OUTPUT : PLAIT_BUF_SCRATCH;
        const uint64_t dst = H == 1 ? base : sbase + (hh * M + mm) * slot;
        put(out, rs_kind(q, L), PLAIT_BUF_INPUT, src, dst_buf, last ? dst : 0, cnt,
            PLAIT_STEP_PRE | (last && H == 1 ? PLAIT_STEP_POST : 0), intra_next(m, a->rank), intra_prev(m, a->rank));
        return 1;
    }
    s -= n1;
    if (s < n2) { /* across hosts: one column ring per m */
        const uint64_t mm = s / H, q = s % H, u = (h + 2 * H - q - 1) % H;
        const int target = rank_at(m, a->rank, (int)u, (int)(j + mm * P));
        const uint64_t cnt = target >= 0 ? len : 0;
        int src_buf = PLAIT_BUF_SCRATCH;
        uint64_t src = sbase + (u * M + mm) * slot;
        unsigned flags = 0;
        if (L == 1) { /* no host sum: its own input, with PRE */
            src_buf = PLAIT_BUF_INPUT;
            src = target >= 0 ? (uint64_t)target * cnt_of + base : 0;
            flags = PLAIT_STEP_PRE;
        }
        int dst_buf = PLAIT_BUF_OUTPUT;
        uint64_t dst = 0;
        if (q == H - 1) { /* block (h, j + m*P) is finished here */
            flags |= PLAIT_STEP_POST;
            dst_buf = mm == 0 ? PLAIT_BUF_OUTPUT : PLAIT_BUF_SCRATCH;
            dst = mm == 0 ? base : sbase + (h * M + mm) * slot;
        }
        put(out, rs_kind(q, H), src_buf, src, dst_buf, dst, cnt, flags, inter_next(m, a->rank),
            inter_prev(m, a->rank));
        return 1;
    }
    s -= n2;
    if (is_member) { /* hand the extras their finished blocks */
        const uint64_t mm = s + 1;
        const int target = rank_at(m, a->rank, (int)h, (int)(j + mm * P));
        put(out, PLAIT_STEP_SEND, PLAIT_BUF_SCRATCH, sbase + (h * M + mm) * slot, PLAIT_BUF_OUTPUT, 0, len, 0,
            target, -1);
        return 1;
    }
    put(out, PLAIT_STEP_RECV, PLAIT_BUF_INPUT, 0, PLAIT_BUF_OUTPUT, base, len, 0, -1,
        rank_at(m, a->rank, (int)h, (int)(j % P)));
    return 1;
}

static int allgather_step(const struct plait_sched_args *a, const struct hier_map *m, int channel, uint64_t idx,
                          struct plait_step *out)
{
    const uint64_t P = (uint64_t)m->P, H = (uint64_t)m->H, L = (uint64_t)m->L;
    const uint64_t j = (uint64_t)m->j, h = (uint64_t)m->h;
    const int is_member = j < P;
    struct subrings sr;
    subrings_init(m, &sr);
    uint64_t lo, hi;
    plait_sched_channel_range(a->count, a->nchannels, channel, a->align_elems, &lo, &hi);
    const uint64_t n0 = is_member ? 1 + extras_of(m) : 1;
    const uint64_t n1 = is_member && H > 1 ? column_rings(m) * H : 0;
    const uint64_t n2 = L > 1 ? subrings_count(m, &sr) * L : 0;
    const uint64_t spi = n0 + n1 + n2;
    const uint64_t iter = idx / spi;
    uint64_t s = idx % spi;
    const uint64_t base = lo + iter * a->chunk_elems;
    if (base >= hi)
        return 0;
    const uint64_t len = plait_umin(a->chunk_elems, hi - base);
    const uint64_t cnt_of = a->count;
    if (s < n0) { /* extras to their member */
        if (!is_member) {
            put(out, PLAIT_STEP_SEND, PLAIT_BUF_INPUT, base, PLAIT_BUF_OUTPUT, 0, len, 0,
                rank_at(m, a->rank, (int)h, (int)(j % P)), -1);
        } else if (s == 0) {
            put(out, PLAIT_STEP_COPY, PLAIT_BUF_INPUT, base, PLAIT_BUF_OUTPUT, (uint64_t)a->rank * cnt_of + base, len,
                0, -1, -1);
        } else {
            const int target = rank_at(m, a->rank, (int)h, (int)(j + s * P));
            put(out, PLAIT_STEP_RECV, PLAIT_BUF_INPUT, 0, PLAIT_BUF_OUTPUT, (uint64_t)target * cnt_of + base, len, 0,
                -1, target);
        }
        return 1;
    }
    s -= n0;
    if (s < n1) { /* across hosts: one column ring per m */
        const uint64_t mm = s / H, q = s % H, u = (h + H - q) % H;
        const int target = rank_at(m, a->rank, (int)u, (int)(j + mm * P));
        const uint64_t off = target >= 0 ? (uint64_t)target * cnt_of + base : 0;
        put(out, ag_kind(q, H), PLAIT_BUF_OUTPUT, off, PLAIT_BUF_OUTPUT, off, target >= 0 ? len : 0, 0,
            inter_next(m, a->rank), inter_prev(m, a->rank));
        return 1;
    }
    s -= n1;
    /* inside the host: one ring per (host hh, m) */
    uint64_t hh, mm;
    subring_at(&sr, s / L, &hh, &mm);
    const uint64_t q = s % L, b = (j + L - q) % L;
    const int target = b < P ? rank_at(m, a->rank, (int)hh, (int)(b + mm * P)) : -1;
    const uint64_t off = target >= 0 ? (uint64_t)target * cnt_of + base : 0;
    put(out, ag_kind(q, L), PLAIT_BUF_OUTPUT, off, PLAIT_BUF_OUTPUT, off, target >= 0 ? len : 0, 0,
        intra_next(m, a->rank), intra_prev(m, a->rank));
    return 1;
}

/* ------------------------------------------------------------------ the table entry */

int plait_hier_supports(int coll, int nranks)
{
    (void)nranks;
    return coll == PLAIT_COLL_ALLREDUCE || coll == PLAIT_COLL_REDUCESCATTER || coll == PLAIT_COLL_ALLGATHER;
}

int plait_hier_step(const struct plait_sched_args *a, int channel, uint64_t idx, struct plait_step *out)
{
    if (a->nranks == 1)
        return plait_sched_single_rank(a, channel, idx, out);
    struct hier_map m;
    map_init(a, &m);
    switch (a->coll) {
    case PLAIT_COLL_ALLREDUCE:
        return allreduce_step(a, &m, channel, idx, out);
    case PLAIT_COLL_REDUCESCATTER:
        return reducescatter_step(a, &m, channel, idx, out);
    case PLAIT_COLL_ALLGATHER:
        return allgather_step(a, &m, channel, idx, out);
    default:
        return 0;
    }
}

int plait_hier_peers(int nranks, int rank, int radix, int *out, int max)
{
    (void)radix;
    return plait_peers_all(nranks, rank, out, max);
}

uint64_t plait_hier_scratch(const struct plait_sched_args *a)
{
    if (a->coll != PLAIT_COLL_REDUCESCATTER || a->nranks <= 1)
        return 0;
    struct hier_map m;
    map_init(a, &m);
    if (m.H <= 1)
        return 0;
    return (uint64_t)a->nchannels * (uint64_t)m.H * (uint64_t)m.M * plait_sched_chunk_slot(a);
}
