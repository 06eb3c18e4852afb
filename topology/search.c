/* Channel search (docs/topology.md, "Channel search"): the rings or tree
 * chains over a host's local ranks, and how many of them, that give the most
 * bandwidth.
 *
 * The model. A channel is an order of the ranks; its hops (rank to next rank,
 * and with multi_host NIC -> first and last -> NIC) follow best paths, whose
 * links plait_topo_router_route gives. A set of k channels loads each link
 * direction with the number of hops crossing it; its per-channel rate B is the
 * largest with B * load <= bw everywhere, B * uses <= speed/8 on every NIC
 * direction and B * (LOC hops of all channels on the device) <=
 * PLAIT_TOPO_LOC_BW on every device; its bandwidth is k * B. A channel with
 * no hop at all (one rank, no network) counts as one LOC hop on its device:
 * otherwise nothing would bound it.
 *
 * The search, in two parts:
 *  1. Candidate orders. With n <= EXHAUSTIVE_MAX ranks every directed ring
 *     ((n-1)! of them, rank 0 first) is scored as one channel; above that,
 *     rings are built greedily (from each rank, go to the rank of best path:
 *     NVLink first, then the fewest PCIe bridges, ties in PCIe tree order, which
 *     keeps devices under one switch next to each other), improved by 2-opt,
 *     and taken in both directions. Rings are ranked by their one-channel rate,
 *     then worst hop type, then the sum of hop types and of route hops. For
 *     chains and multi-host rings, where the first and last rank matter (they
 *     pick the NICs), every rotation of the best rings is a candidate.
 *  2. The set. Channels are added one at a time, each the candidate that gives
 *     the set the most bandwidth, its NICs the nearest to its entry and exit
 *     ranks and, among equally near ones, the least used (which spreads
 *     channels over NICs); the best prefix of up to PLAIT_TOPO_MAX_CHANNELS
 *     channels wins, fewest channels among equals. Two tie-break rules are run
 *     and the better result kept: candidate rank (which keeps rotations of one
 *     ring together: one channel per NIC on a DGX) and the least increase of
 *     the sum of squared link utilisations (which balances loads: the six
 *     directed rings of a 4-GPU NVLink mesh).
 * Everything is deterministic: fixed enumeration orders, strict comparisons,
 * ties to the lowest index.
 *
 * Cost: part 1 is O((n-1)! * n * R) for small n (R = links per route; 40320
 * rings at n = 9), O(n^3 * R) above; part 2 is O(MAX_CHANNELS * P * n * R)
 * with P <= POOL_WORK / n candidates. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "base/log.h"
#include "topology/paths_internal.h"
#include "topology/topo.h"

#define EXHAUSTIVE_MAX 9
#define POOL_MAX 8192
#define POOL_WORK 65536 /* candidates * ranks, so that part 2 stays under ~10^8 steps */
#define TWO_OPT_RINGS 2
#define TWO_OPT_PASSES 3
#define REL_EPS 1e-9

struct hop {
    int off, len; /* its directed links: ctx.rl[off .. off + len) */
    unsigned char type;
    bool is_loc, is_dis;
};

struct nic_opt {
    int nic;     /* node index */
    int idx;     /* NIC index */
    double cap;  /* speed / 8, 0 when unknown (no limit) */
    struct hop in, out; /* NIC -> device, device -> NIC */
};

struct ctx {
    const struct plait_topo *topo;
    const struct plait_topo_paths *paths;
    const int *devs;
    int n;
    bool multi, closed; /* closed: the ring's last -> first hop exists (single-host ring) */
    struct hop *pair;   /* n * n, by positions */
    int *rl;
    int nrl, cap_rl;
    struct nic_opt *opts; /* per position: opts[opt_start[i] .. opt_start[i + 1]) */
    int *opt_start;
    int ndl;         /* directed links: 2 * nlinks */
    int *delta, *touched;
    int ntouched;
    int *loc_mark;   /* per node: stamp of the last channel evaluation that listed it */
    int *loc_cnt;    /* per node: its LOC hops in the channel being evaluated */
    int loc_stamp;
    int loc_dev[PLAIT_TOPO_MAX_LOCAL + 1]; /* the devices with a LOC hop in that channel */
    int nloc;
};

struct quality {
    double b;
    int worst, sumtype, sumhops;
};

struct setstate {
    int *load;              /* per directed link */
    int *loc_uses;          /* per node: LOC hops of the set's channels on it */
    int *uses_in, *uses_out; /* per NIC index */
    double b;               /* per-channel rate of the set, INFINITY when empty */
    int k;
};

struct eval {
    double b, phi;
    int worst, sumhops, opt_in, opt_out; /* option indices into ctx.opts, -1 none */
};

/* a > b beyond rounding: totals like 8 * (450 / 8) must compare equal to 450. */
static bool rel_gt(double a, double b) { return a > b * (1 + REL_EPS) && a - b > 1e-12; }

/* A stable merge sort of ints with a context, since qsort has none and search
 * runs from several threads at once. */
typedef int (*cmp_fn)(const void *ctx, int a, int b);
static void merge_sort(int *a, int *tmp, int n, cmp_fn cmp, const void *ctx)
{
    for (int w = 1; w < n; w *= 2) {
        for (int lo = 0; lo < n; lo += 2 * w) {
            int mid = lo + w < n ? lo + w : n, hi = lo + 2 * w < n ? lo + 2 * w : n;
            int i = lo, j = mid, k = lo;
            while (i < mid && j < hi)
                tmp[k++] = cmp(ctx, a[j], a[i]) < 0 ? a[j++] : a[i++];
            while (i < mid)
                tmp[k++] = a[i++];
            while (j < hi)
                tmp[k++] = a[j++];
        }
        memcpy(a, tmp, (size_t)n * sizeof(int));
    }
}

static plait_result_t store_route(struct ctx *c, const struct plait_topo_router *r, int dst, struct hop *h)
{
    int len = plait_topo_router_route(r, dst, NULL, 0);
    if (len < 0) {
        *h = (struct hop){.off = 0, .len = 0, .type = PLAIT_PATH_DIS, .is_dis = true};
        return PLAIT_SUCCESS;
    }
    if (c->nrl + len > c->cap_rl) {
        int cap = (c->cap_rl + len) * 2;
        int *nr = realloc(c->rl, (size_t)cap * sizeof(int));
        if (nr == NULL)
            return plait_error(PLAIT_ERR_SYSTEM, "plait_topo_search_channels: out of memory");
        c->rl = nr;
        c->cap_rl = cap;
    }
    plait_topo_router_route(r, dst, c->rl + c->nrl, len);
    *h = (struct hop){.off = c->nrl, .len = len, .type = PLAIT_PATH_NVL, .is_loc = len == 0};
    c->nrl += len;
    return PLAIT_SUCCESS;
}

static double nic_speed_cap(const struct plait_topo_node *nic)
{
    return nic->nic.speed > 0 ? nic->nic.speed / 8.0 : 0;
}

static double capped(double bw, double cap) { return cap > 0 && cap < bw ? cap : bw; }

/* The NICs nearest to node `dev` (best path type, then bandwidth capped at the
 * NIC speed), into list[] (at most max); returns how many. The one
 * plait_topo_affinity names comes first for a GPU, then the others by index. */
static int nearest_nics(const struct ctx *c, int dev, int *list, int max)
{
    const struct plait_topo *topo = c->topo;
    int best = -1, cnt = 0;
    for (int x = 0; x < topo->nnodes; x++) {
        if (topo->nodes[x].type != PLAIT_TOPO_NIC)
            continue;
        const struct plait_topo_path *p = plait_topo_path(c->paths, dev, x);
        if (p->type == PLAIT_PATH_DIS)
            continue;
        if (best >= 0) {
            const struct plait_topo_path *q = plait_topo_path(c->paths, dev, best);
            double bp = capped(p->bw, nic_speed_cap(&topo->nodes[x]));
            double bq = capped(q->bw, nic_speed_cap(&topo->nodes[best]));
            if (p->type > q->type || (p->type == q->type && bp < bq))
                continue;
            if (p->type < q->type || bp > bq)
                cnt = 0;
        }
        best = x;
        if (cnt < max)
            list[cnt] = x;
        cnt++;
    }
    if (cnt > max)
        cnt = max;
    if (topo->nodes[dev].type == PLAIT_TOPO_GPU && cnt > 1) {
        struct plait_topo_affinity a;
        if (plait_topo_affinity(topo, c->paths, dev, &a) == PLAIT_SUCCESS)
            for (int i = 1; i < cnt; i++)
                if (list[i] == a.nic) {
                    memmove(list + 1, list, (size_t)i * sizeof(int));
                    list[0] = a.nic;
                    break;
                }
    }
    return cnt;
}

static plait_result_t build_routes(struct ctx *c)
{
    const struct plait_topo *topo = c->topo;
    int n = c->n;
    struct plait_topo_router *r;
    plait_result_t st = plait_topo_router_create(topo, &r);
    if (st != PLAIT_SUCCESS)
        return st;
    int nnic = topo->counts[PLAIT_TOPO_NIC];
    int *list = malloc(((size_t)nnic + 1) * sizeof(int));
    c->pair = calloc((size_t)n * n, sizeof(struct hop));
    c->opt_start = calloc((size_t)n + 1, sizeof(int));
    c->opts = malloc(((size_t)n * (size_t)nnic + 1) * sizeof(struct nic_opt));
    if (list == NULL || c->pair == NULL || c->opt_start == NULL || c->opts == NULL) {
        st = plait_error(PLAIT_ERR_SYSTEM, "plait_topo_search_channels: out of memory");
        goto out;
    }
    for (int i = 0; i < n; i++) {
        int same = -1;
        for (int j = 0; j < i && same < 0; j++)
            if (c->devs[j] == c->devs[i])
                same = j;
        if (same >= 0) {
            /* Another rank on the same device: its routes are that one's (the
             * column is filled as each row is computed, from device nodes). */
            memcpy(&c->pair[(size_t)i * n], &c->pair[(size_t)same * n], (size_t)n * sizeof(struct hop));
        } else {
            if ((st = plait_topo_router_run(r, c->devs[i], NULL)) != PLAIT_SUCCESS)
                goto out;
            for (int j = 0; j < n; j++) {
                struct hop *h = &c->pair[(size_t)i * n + j];
                if ((st = store_route(c, r, c->devs[j], h)) != PLAIT_SUCCESS)
                    goto out;
                h->type = (unsigned char)plait_topo_path(c->paths, c->devs[i], c->devs[j])->type;
                if (h->is_loc)
                    h->type = PLAIT_PATH_LOC;
            }
        }
        c->opt_start[i + 1] = c->opt_start[i];
        if (!c->multi)
            continue;
        int cnt = nearest_nics(c, c->devs[i], list, nnic);
        if (cnt > 0 && (st = plait_topo_router_run(r, c->devs[i], NULL)) != PLAIT_SUCCESS)
            goto out;
        for (int k = 0; k < cnt; k++) {
            struct nic_opt *o = &c->opts[c->opt_start[i] + k];
            o->nic = list[k];
            o->idx = topo->nodes[list[k]].index;
            o->cap = nic_speed_cap(&topo->nodes[list[k]]);
            if ((st = store_route(c, r, list[k], &o->out)) != PLAIT_SUCCESS)
                goto out;
        }
        for (int k = 0; k < cnt; k++) {
            struct nic_opt *o = &c->opts[c->opt_start[i] + k];
            if ((st = plait_topo_router_run(r, list[k], NULL)) != PLAIT_SUCCESS ||
                (st = store_route(c, r, c->devs[i], &o->in)) != PLAIT_SUCCESS)
                goto out;
        }
        c->opt_start[i + 1] += cnt;
    }
out:
    free(list);
    plait_topo_router_free(r);
    return st;
}

static void add_hop(struct ctx *c, const struct hop *h)
{
    for (int i = 0; i < h->len; i++) {
        int d = c->rl[h->off + i];
        if (c->delta[d]++ == 0)
            c->touched[c->ntouched++] = d;
    }
}

/* Counts a LOC hop on `dev` in the channel being evaluated. */
static void note_loc(struct ctx *c, int dev)
{
    if (c->loc_mark[dev] != c->loc_stamp) {
        c->loc_mark[dev] = c->loc_stamp;
        c->loc_cnt[dev] = 0;
        c->loc_dev[c->nloc++] = dev;
    }
    c->loc_cnt[dev]++;
}

static double link_bw(const struct ctx *c, int d) { return c->topo->links[d / 2].bw; }

/* The least-used option of position `pos` in one direction. */
static int pick_opt(const struct ctx *c, const struct setstate *s, int pos, bool in)
{
    int best = -1;
    for (int o = c->opt_start[pos]; o < c->opt_start[pos + 1]; o++) {
        if (best < 0) {
            best = o;
            continue;
        }
        int uo = s ? (in ? s->uses_in : s->uses_out)[c->opts[o].idx] : 0;
        int ub = s ? (in ? s->uses_in : s->uses_out)[c->opts[best].idx] : 0;
        if (uo < ub)
            best = o;
    }
    return best;
}

/* The set `s` (NULL: empty) with the channel `order` added: its per-channel
 * rate and tie-break figures in *e. With `apply`, s takes the channel. */
static void eval_channel(struct ctx *c, struct setstate *s, const unsigned char *order, bool closed, bool multi,
                         bool apply, struct eval *e)
{
    int n = c->n, nh = closed ? n : n - 1;
    bool is_dis = false;
    c->nloc = 0;
    c->loc_stamp++;
    *e = (struct eval){.b = s ? s->b : INFINITY, .phi = 0, .worst = PLAIT_PATH_LOC, .sumhops = 0, .opt_in = -1,
                       .opt_out = -1};
    c->ntouched = 0;
    for (int h = 0; h < nh; h++) {
        const struct hop *hp = &c->pair[(size_t)order[h] * n + order[(h + 1) % n]];
        if (hp->is_loc)
            note_loc(c, c->devs[order[h]]);
        is_dis |= hp->is_dis;
        if (hp->type > e->worst)
            e->worst = hp->type;
        e->sumhops += hp->len;
        add_hop(c, hp);
    }
    if (multi) {
        e->opt_in = pick_opt(c, s, order[0], true);
        e->opt_out = pick_opt(c, s, order[n - 1], false);
        if (e->opt_in >= 0) {
            is_dis |= c->opts[e->opt_in].in.is_dis;
            add_hop(c, &c->opts[e->opt_in].in);
        }
        if (e->opt_out >= 0) {
            is_dis |= c->opts[e->opt_out].out.is_dis;
            add_hop(c, &c->opts[e->opt_out].out);
        }
    }
    /* A channel with no hop at all (one rank, no network) moves data only
     * within its device: the LOC figure bounds it too. */
    if (nh == 0 && e->opt_in < 0 && e->opt_out < 0)
        note_loc(c, c->devs[order[0]]);
    for (int t = 0; t < c->ntouched; t++) {
        int d = c->touched[t];
        double cap = link_bw(c, d);
        int old = s ? s->load[d] : 0, nl = old + c->delta[d];
        if (cap / nl < e->b)
            e->b = cap / nl;
        e->phi += ((double)nl * nl - (double)old * old) / (cap * cap);
        if (apply)
            s->load[d] = nl;
        c->delta[d] = 0;
    }
    for (int dir = 0; dir < 2; dir++) {
        int o = dir == 0 ? e->opt_in : e->opt_out;
        if (o < 0)
            continue;
        int *uses = s ? (dir == 0 ? s->uses_in : s->uses_out) : NULL;
        int u = (uses ? uses[c->opts[o].idx] : 0) + 1;
        double cap = c->opts[o].cap;
        if (cap > 0) {
            if (cap / u < e->b)
                e->b = cap / u;
            e->phi += (2.0 * u - 1) / (cap * cap);
        }
        if (apply)
            uses[c->opts[o].idx] = u;
    }
    for (int i = 0; i < c->nloc; i++) {
        int dev = c->loc_dev[i], old = s ? s->loc_uses[dev] : 0, u = old + c->loc_cnt[dev];
        if (PLAIT_TOPO_LOC_BW / u < e->b)
            e->b = PLAIT_TOPO_LOC_BW / u;
        e->phi += ((double)u * u - (double)old * old) / (PLAIT_TOPO_LOC_BW * PLAIT_TOPO_LOC_BW);
        if (apply)
            s->loc_uses[dev] = u;
    }
    if (is_dis)
        e->b = 0;
    if (apply) {
        s->b = e->b;
        s->k++;
    }
}

static struct quality ring_quality(struct ctx *c, const unsigned char *ring)
{
    struct eval e;
    eval_channel(c, NULL, ring, true, false, false, &e);
    struct quality q = {.b = e.b, .worst = e.worst, .sumtype = 0, .sumhops = e.sumhops};
    for (int h = 0; h < c->n; h++)
        q.sumtype += c->pair[(size_t)ring[h] * c->n + ring[(h + 1) % c->n]].type;
    return q;
}

static bool quality_better(const struct quality *a, const struct quality *b)
{
    if (rel_gt(a->b, b->b) || rel_gt(b->b, a->b))
        return a->b > b->b;
    if (a->worst != b->worst)
        return a->worst < b->worst;
    if (a->sumtype != b->sumtype)
        return a->sumtype < b->sumtype;
    return a->sumhops < b->sumhops;
}

/* ---- candidate rings ---- */

struct rings {
    int n, count, cap;
    unsigned char *r; /* count * n */
    struct quality *q;
    int *rank;        /* indices sorted best first */
};

static plait_result_t rings_add(struct rings *rs, const unsigned char *ring)
{
    if (rs->count == rs->cap) {
        int cap = rs->cap ? rs->cap * 2 : 64;
        unsigned char *nr = realloc(rs->r, (size_t)cap * rs->n);
        if (nr == NULL)
            return plait_error(PLAIT_ERR_SYSTEM, "plait_topo_search_channels: out of memory");
        rs->r = nr;
        rs->cap = cap;
    }
    memcpy(rs->r + (size_t)rs->count * rs->n, ring, (size_t)rs->n);
    rs->count++;
    return PLAIT_SUCCESS;
}

static bool next_permutation(unsigned char *a, int n)
{
    int i = n - 2;
    while (i >= 0 && a[i] >= a[i + 1])
        i--;
    if (i < 0)
        return false;
    int j = n - 1;
    while (a[j] <= a[i])
        j--;
    unsigned char t = a[i];
    a[i] = a[j];
    a[j] = t;
    for (int l = i + 1, r = n - 1; l < r; l++, r--) {
        t = a[l];
        a[l] = a[r];
        a[r] = t;
    }
    return true;
}

/* PCIe tree order of the positions: NUMA node, bus id, node index, position. */
static int tree_cmp(const void *ctx, int a, int b)
{
    const struct ctx *c = ctx;
    const struct plait_topo_node *x = &c->topo->nodes[c->devs[a]], *y = &c->topo->nodes[c->devs[b]];
    if (x->numa != y->numa)
        return x->numa < y->numa ? -1 : 1;
    if (x->busid != y->busid)
        return x->busid < y->busid ? -1 : 1;
    if (c->devs[a] != c->devs[b])
        return c->devs[a] < c->devs[b] ? -1 : 1;
    return a < b ? -1 : a > b;
}

/* Rotated so that position 0 comes first: one form per ring, to drop repeats. */
static void canonical(unsigned char *ring, int n)
{
    unsigned char tmp[PLAIT_TOPO_MAX_LOCAL];
    int z = 0;
    while (ring[z] != 0)
        z++;
    for (int i = 0; i < n; i++)
        tmp[i] = ring[(z + i) % n];
    memcpy(ring, tmp, (size_t)n);
}

static void two_opt(struct ctx *c, unsigned char *ring)
{
    int n = c->n;
    struct quality q = ring_quality(c, ring);
    for (int pass = 0; pass < TWO_OPT_PASSES; pass++) {
        bool improved = false;
        for (int i = 1; i < n - 1; i++)
            for (int j = i + 1; j < n; j++) {
                for (int l = i, r = j; l < r; l++, r--) {
                    unsigned char t = ring[l];
                    ring[l] = ring[r];
                    ring[r] = t;
                }
                struct quality nq = ring_quality(c, ring);
                if (quality_better(&nq, &q)) {
                    q = nq;
                    improved = true;
                } else {
                    for (int l = i, r = j; l < r; l++, r--) {
                        unsigned char t = ring[l];
                        ring[l] = ring[r];
                        ring[r] = t;
                    }
                }
            }
        if (!improved)
            break;
    }
}

static int rank_cmp(const void *ctx, int a, int b)
{
    const struct rings *rs = ctx;
    if (quality_better(&rs->q[a], &rs->q[b]))
        return -1;
    if (quality_better(&rs->q[b], &rs->q[a]))
        return 1;
    return a < b ? -1 : a > b;
}

static plait_result_t score_and_rank(struct ctx *c, struct rings *rs)
{
    rs->q = malloc(((size_t)rs->count + 1) * sizeof(*rs->q));
    rs->rank = malloc(((size_t)rs->count + 1) * sizeof(int));
    int *tmp = malloc(((size_t)rs->count + 1) * sizeof(int));
    if (rs->q == NULL || rs->rank == NULL || tmp == NULL) {
        free(tmp);
        return plait_error(PLAIT_ERR_SYSTEM, "plait_topo_search_channels: out of memory");
    }
    for (int i = 0; i < rs->count; i++) {
        rs->q[i] = ring_quality(c, rs->r + (size_t)i * rs->n);
        rs->rank[i] = i;
    }
    merge_sort(rs->rank, tmp, rs->count, rank_cmp, rs);
    free(tmp);
    return PLAIT_SUCCESS;
}

static plait_result_t heuristic_rings(struct ctx *c, struct rings *rs)
{
    int n = c->n;
    unsigned char ring[PLAIT_TOPO_MAX_LOCAL];
    int tree[PLAIT_TOPO_MAX_LOCAL], tmp[PLAIT_TOPO_MAX_LOCAL];
    bool used[PLAIT_TOPO_MAX_LOCAL];
    plait_result_t st;
    for (int i = 0; i < n; i++)
        tree[i] = i;
    merge_sort(tree, tmp, n, tree_cmp, c);
    for (int i = 0; i < n; i++)
        ring[i] = (unsigned char)tree[i];
    canonical(ring, n);
    if ((st = rings_add(rs, ring)) != PLAIT_SUCCESS)
        return st;
    /* Nearest neighbour from every start: the best path next (type, bandwidth,
     * hops), ties in tree order. */
    for (int s = 0; s < n; s++) {
        memset(used, 0, sizeof(used));
        ring[0] = (unsigned char)tree[s];
        used[tree[s]] = true;
        for (int k = 1; k < n; k++) {
            int cur = ring[k - 1], best = -1;
            for (int t = 0; t < n; t++) {
                int j = tree[(s + t) % n];
                if (used[j])
                    continue;
                if (best >= 0) {
                    const struct plait_topo_path *p = plait_topo_path(c->paths, c->devs[cur], c->devs[j]);
                    const struct plait_topo_path *q = plait_topo_path(c->paths, c->devs[cur], c->devs[best]);
                    if (!(p->type != q->type ? p->type < q->type : p->bw != q->bw ? p->bw > q->bw : p->hops < q->hops))
                        continue;
                }
                best = j;
            }
            ring[k] = (unsigned char)best;
            used[best] = true;
        }
        canonical(ring, n);
        if ((st = rings_add(rs, ring)) != PLAIT_SUCCESS)
            return st;
    }
    if ((st = score_and_rank(c, rs)) != PLAIT_SUCCESS)
        return st;
    /* Improve the best few, then add every ring reversed. */
    int base = rs->count;
    for (int i = 0; i < TWO_OPT_RINGS && i < base; i++) {
        memcpy(ring, rs->r + (size_t)rs->rank[i] * n, (size_t)n);
        two_opt(c, ring);
        canonical(ring, n);
        if ((st = rings_add(rs, ring)) != PLAIT_SUCCESS)
            return st;
    }
    base = rs->count;
    for (int i = 0; i < base; i++) {
        for (int k = 0; k < n; k++)
            ring[k] = rs->r[(size_t)i * n + (n - k) % n];
        if ((st = rings_add(rs, ring)) != PLAIT_SUCCESS)
            return st;
    }
    /* Drop repeats (keeping the first), then rank again. */
    int kept = 0;
    for (int i = 0; i < rs->count; i++) {
        bool dup = false;
        for (int j = 0; j < kept && !dup; j++)
            dup = memcmp(rs->r + (size_t)i * n, rs->r + (size_t)j * n, (size_t)n) == 0;
        if (!dup)
            memmove(rs->r + (size_t)kept++ * n, rs->r + (size_t)i * n, (size_t)n);
    }
    rs->count = kept;
    free(rs->q);
    free(rs->rank);
    rs->q = NULL;
    rs->rank = NULL;
    return score_and_rank(c, rs);
}

static plait_result_t all_rings(struct ctx *c, struct rings *rs)
{
    unsigned char ring[PLAIT_TOPO_MAX_LOCAL];
    plait_result_t st;
    for (int i = 0; i < c->n; i++)
        ring[i] = (unsigned char)i;
    do {
        if ((st = rings_add(rs, ring)) != PLAIT_SUCCESS)
            return st;
    } while (c->n > 1 && next_permutation(ring + 1, c->n - 1));
    return score_and_rank(c, rs);
}

/* ---- the set of channels ---- */

struct cand {
    int ring, rot;
};

struct result {
    int k;
    double total, b;
    unsigned char orders[PLAIT_TOPO_MAX_CHANNELS][PLAIT_TOPO_MAX_LOCAL];
    int nic_in[PLAIT_TOPO_MAX_CHANNELS], nic_out[PLAIT_TOPO_MAX_CHANNELS];
    int worst[PLAIT_TOPO_MAX_CHANNELS];
};

static void cand_order(const struct ctx *c, const struct rings *rs, const struct cand *cd, unsigned char *order)
{
    const unsigned char *r = rs->r + (size_t)cd->ring * c->n;
    for (int i = 0; i < c->n; i++)
        order[i] = r[(cd->rot + i) % c->n];
}

static bool eval_better(const struct eval *a, const struct eval *b, int k, bool balance)
{
    double ta = (k + 1) * a->b, tb = (k + 1) * b->b;
    if (rel_gt(ta, tb) || rel_gt(tb, ta))
        return ta > tb;
    if (a->worst != b->worst)
        return a->worst < b->worst;
    if (!balance)
        return false; /* the candidate ranked first stays */
    if (rel_gt(a->phi, b->phi) || rel_gt(b->phi, a->phi))
        return a->phi < b->phi;
    return a->sumhops < b->sumhops;
}

static plait_result_t greedy(struct ctx *c, const struct rings *rs, const struct cand *pool, int npool, bool balance,
                             struct result *res)
{
    const struct plait_topo *topo = c->topo;
    int nnic = topo->counts[PLAIT_TOPO_NIC];
    struct setstate s = {.b = INFINITY, .k = 0};
    s.load = calloc((size_t)c->ndl + 1, sizeof(int));
    s.loc_uses = calloc((size_t)topo->nnodes + 1, sizeof(int));
    s.uses_in = calloc((size_t)nnic + 1, sizeof(int));
    s.uses_out = calloc((size_t)nnic + 1, sizeof(int));
    plait_result_t st = PLAIT_SUCCESS;
    if (s.load == NULL || s.loc_uses == NULL || s.uses_in == NULL || s.uses_out == NULL) {
        st = plait_error(PLAIT_ERR_SYSTEM, "plait_topo_search_channels: out of memory");
        goto out;
    }
    struct result cur;
    memset(res, 0, sizeof(*res));
    unsigned char order[PLAIT_TOPO_MAX_LOCAL];
    for (int step = 0; step < PLAIT_TOPO_MAX_CHANNELS; step++) {
        int best = -1;
        struct eval be = {0}, e;
        for (int i = 0; i < npool; i++) {
            cand_order(c, rs, &pool[i], order);
            eval_channel(c, &s, order, c->closed, c->multi, false, &e);
            if (!(e.b > 0))
                continue;
            if (best < 0 || eval_better(&e, &be, step, balance)) {
                best = i;
                be = e;
            }
        }
        if (best < 0)
            break;
        cand_order(c, rs, &pool[best], order);
        eval_channel(c, &s, order, c->closed, c->multi, true, &e);
        memcpy(cur.orders[step], order, (size_t)c->n);
        cur.nic_in[step] = e.opt_in >= 0 ? c->opts[e.opt_in].nic : -1;
        cur.nic_out[step] = e.opt_out >= 0 ? c->opts[e.opt_out].nic : -1;
        cur.worst[step] = e.worst;
        double total = s.k * s.b;
        if (res->k == 0 || rel_gt(total, res->total)) {
            memcpy(res->orders, cur.orders, sizeof(cur.orders[0]) * (size_t)(step + 1));
            memcpy(res->nic_in, cur.nic_in, sizeof(int) * (size_t)(step + 1));
            memcpy(res->nic_out, cur.nic_out, sizeof(int) * (size_t)(step + 1));
            memcpy(res->worst, cur.worst, sizeof(int) * (size_t)(step + 1));
            res->k = s.k;
            res->b = s.b;
            res->total = total;
        }
    }
out:
    free(s.load);
    free(s.loc_uses);
    free(s.uses_in);
    free(s.uses_out);
    return st;
}

static plait_result_t check_args(const struct plait_topo *topo, const struct plait_topo_paths *paths,
                                 const int *devs, int ndevs, enum plait_topo_pattern pattern,
                                 const struct plait_topo_search *out)
{
    const char *fn = "plait_topo_search_channels";
    if (topo == NULL || paths == NULL || devs == NULL || out == NULL)
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "%s: graph, paths, devs or out is NULL", fn);
    if (paths->n != topo->nnodes)
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "%s: paths of %d nodes for a graph of %d", fn, paths->n,
                           topo->nnodes);
    if (ndevs <= 0 || ndevs > PLAIT_TOPO_MAX_LOCAL)
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "%s: ndevs %d is not in 1..%d", fn, ndevs,
                           PLAIT_TOPO_MAX_LOCAL);
    if (pattern != PLAIT_TOPO_RING && pattern != PLAIT_TOPO_TREE)
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "%s: pattern %d is neither ring nor tree", fn, (int)pattern);
    for (int i = 0; i < ndevs; i++) {
        if (devs[i] < 0 || devs[i] >= topo->nnodes)
            return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "%s: devs[%d] = %d is not a node (graph of %d)", fn, i,
                               devs[i], topo->nnodes);
        const struct plait_topo_node *nd = &topo->nodes[devs[i]];
        if (nd->type != PLAIT_TOPO_GPU && nd->type != PLAIT_TOPO_CPU)
            return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "%s: devs[%d] = %d (%s) is a %s node, not a gpu or cpu",
                               fn, i, devs[i], nd->name, plait_topo_node_type_name(nd->type));
    }
    return PLAIT_SUCCESS;
}

plait_result_t plait_topo_search_channels(const struct plait_topo *topo, const struct plait_topo_paths *paths,
                                          const int *devs, int ndevs, bool multi_host,
                                          enum plait_topo_pattern pattern, struct plait_topo_search *out)
{
    plait_result_t st = check_args(topo, paths, devs, ndevs, pattern, out);
    if (st != PLAIT_SUCCESS)
        return st;
    struct ctx c = {.topo = topo, .paths = paths, .devs = devs, .n = ndevs, .multi = multi_host,
                    .closed = pattern == PLAIT_TOPO_RING && !multi_host, .ndl = 2 * topo->nlinks};
    struct rings rs = {.n = ndevs};
    struct cand *pool = NULL;
    struct result *res = calloc(2, sizeof(struct result));
    c.delta = calloc((size_t)c.ndl + 1, sizeof(int));
    c.touched = malloc(((size_t)c.ndl + 1) * sizeof(int));
    c.loc_mark = calloc((size_t)topo->nnodes + 1, sizeof(int));
    c.loc_cnt = calloc((size_t)topo->nnodes + 1, sizeof(int));
    if (res == NULL || c.delta == NULL || c.touched == NULL || c.loc_mark == NULL || c.loc_cnt == NULL) {
        st = plait_error(PLAIT_ERR_SYSTEM, "plait_topo_search_channels: out of memory");
        goto out;
    }
    if ((st = build_routes(&c)) != PLAIT_SUCCESS)
        goto out;
    st = ndevs <= EXHAUSTIVE_MAX ? all_rings(&c, &rs) : heuristic_rings(&c, &rs);
    if (st != PLAIT_SUCCESS)
        goto out;

    /* A closed ring is the same channel from any rank; otherwise the first and
     * last rank matter and every rotation is a candidate. */
    int rots = c.closed ? 1 : ndevs;
    int npool = POOL_WORK / ndevs;
    if (npool > POOL_MAX)
        npool = POOL_MAX;
    int nrings = npool / rots;
    if (nrings < 1)
        nrings = 1;
    if (nrings > rs.count)
        nrings = rs.count;
    npool = nrings * rots;
    pool = malloc((size_t)npool * sizeof(*pool));
    if (pool == NULL) {
        st = plait_error(PLAIT_ERR_SYSTEM, "plait_topo_search_channels: out of memory");
        goto out;
    }
    for (int i = 0; i < nrings; i++)
        for (int r = 0; r < rots; r++)
            pool[i * rots + r] = (struct cand){.ring = rs.rank[i], .rot = r};
    for (int strategy = 0; strategy < 2; strategy++)
        if ((st = greedy(&c, &rs, pool, npool, strategy == 1, &res[strategy])) != PLAIT_SUCCESS)
            goto out;
    const struct result *win = &res[0];
    if (res[1].k > 0 && (win->k == 0 || rel_gt(res[1].total, win->total) ||
                         (!rel_gt(win->total, res[1].total) && res[1].k < win->k)))
        win = &res[1];

    memset(out, 0, sizeof(*out));
    out->pattern = pattern;
    if (win->k == 0) {
        /* Some hop is unreachable in every order (devices the graph does not
         * connect): one channel in the given order, with no bandwidth, so that
         * a caller still has an order to run on. */
        out->nchannels = 1;
        out->ch[0].n = ndevs;
        for (int i = 0; i < ndevs; i++)
            out->ch[0].order[i] = i;
        out->ch[0].nic_in = out->ch[0].nic_out = -1;
        out->ch[0].bw = 0;
        out->ch[0].worst = PLAIT_PATH_DIS;
        out->bw = 0;
        goto out;
    }
    out->nchannels = win->k;
    out->bw = win->k * win->b;
    for (int k = 0; k < win->k; k++) {
        struct plait_topo_channel *ch = &out->ch[k];
        ch->n = ndevs;
        for (int i = 0; i < ndevs; i++)
            ch->order[i] = win->orders[k][i];
        ch->nic_in = win->nic_in[k];
        ch->nic_out = win->nic_out[k];
        ch->bw = win->b;
        ch->worst = (enum plait_topo_path_type)win->worst[k];
    }
out:
    free(pool);
    free(rs.r);
    free(rs.q);
    free(rs.rank);
    free(res);
    free(c.pair);
    free(c.rl);
    free(c.opts);
    free(c.opt_start);
    free(c.delta);
    free(c.touched);
    free(c.loc_mark);
    free(c.loc_cnt);
    return st;
}
