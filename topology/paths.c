/* Path classification (docs/topology.md, "Paths"): the best path between every
 * ordered pair of nodes, and the NIC nearest each GPU.
 *
 * The search. A route's figures combine along it with max (its type is the
 * worst link class) and min (its bandwidth is the narrowest link), and the
 * adjustments (NVB, P2C, PXN) depend on the route's shape, not only on its
 * figures. Ranking routes lexicographically by (type, -bw, hops) therefore has
 * no optimal substructure: a prefix of lower type but lower bandwidth can be
 * the one whose extension wins once a worse link equalises the types, and the
 * same holds for (bw, hops) once a narrower link equalises the bandwidths. So
 * the search from one source keeps, at each (node, shape state), every label
 * (type, bw, nvlinks, hops) that no other label there dominates, where L1
 * dominates L2 when type1 <= type2, bw1 >= bw2, nvlinks1 >= nvlinks2 and
 * hops1 <= hops2 (a Pareto front, as in multi-criteria label-setting); so
 * that ties come out the same from both ends, L1's passed GPU must also have
 * an index no higher than L2's.
 *
 * Why that is exact. For a fixed shape state every continuation applies the
 * same operations to a label: type max= c, bw min= b, nvlinks min= n, hops
 * += 1, and at the end a final type that is a non-decreasing function of the
 * type (max(t, NVB), or PXN/P2C when t is at most a threshold, else t or no
 * route).
 * All of these are monotone, so if L1 dominates L2 at (v, s), then L1 plus any
 * continuation is at least as good as L2 plus the same continuation in the
 * final order (type, then bw, then hops, then nvlinks, then the lower via):
 * dropping dominated
 * labels never loses the best route. The shape state holds everything else the
 * rules look at (which links the route began with, whether it passed its one
 * intermediate GPU), so that continuations really are the same for two labels
 * at one (v, s). Labels are created in breadth-first order (every link is one
 * hop), so a label reaches the queue with the fewest hops any non-dominated
 * route to it has, and comparing a new label only with the other figures of
 * the earlier ones is the full dominance test.
 *
 * Walks that repeat a node are not excluded by the states, but they never win:
 * cutting the loop out leaves a route whose links are a subset (type no worse,
 * bandwidth no lower, strictly fewer hops) of the same shape, so no worse in
 * the final order either (the adjustments that lower a type, PXN and P2C, end
 * at a NIC or begin at a GPU's C2C link, which a loop cannot cut). A loop
 * through the passed GPU would need a node on both of its sides: for NVB,
 * cutting it leaves a plain NVLink route (better); for PXN the NVLink side
 * passes nvs nodes and the other side pci nodes and the GPU's CPU, so only a
 * CPU with NVLink to GPUs and C2C to that GPU could, which no machine has. The
 * source and the passed GPU are never re-entered, which keeps `via` honest.
 *
 * Complexity, per source: with S = 11 states, T = 12 types, W distinct link
 * bandwidths, K distinct NVLink lane counts and G GPUs, a (node, state) holds
 * at most F = T * W * (K + 1) * (G + 1) labels (no two with the same (type,
 * bw, nvlinks, via), since a later equal one is dominated), each expanded
 * once over its node's links, and each new label is compared with the labels
 * at its target. So a search is O(S * F * E * F) in
 * the worst case, polynomial, and in real graphs the fronts hold one or two
 * labels: O(E) per source, O(N * E) for the matrix (a GB200 NVL72 rack, ~300
 * nodes: some 10 ms in a debug build). */
#include "topology/paths_internal.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "base/log.h"

/* What a route has been so far, beyond its figures. The patterns the spec
 * adjusts are recognised from either end, so that a path and its reverse get
 * the same type (the matrix is symmetric, as nvidia-smi's is). A route passes
 * a GPU only in the two shapes the spec allows: GPU -NVLink- GPU -NVLink- GPU
 * (NVB) and GPU -NVLink- GPU -(PIX, PXB or P2C)- NIC (PXN), either way round. */
enum route_state {
    ST_GEN = 0, /* no GPU passed, no pattern in progress */
    ST_NVL,     /* from a GPU, NVLink links only so far (NVB or PXN may follow) */
    ST_C2C,     /* from a GPU, one C2C link to its CPU */
    ST_P2C,     /* from a GPU, C2C to its CPU and then PCIe links only: P2C */
    ST_PCI,     /* PCIe links only so far (reverse P2C; from a NIC, reverse PXN may follow) */
    ST_RP2C,    /* PCIe only, then C2C from a CPU into a GPU: P2C read from its other end */
    ST_VNVL,    /* GPU, NVLink only, the passed GPU, NVLink only since: NVB at a GPU */
    ST_VPCI,    /* GPU, NVLink only, the passed GPU, PCIe of type PIX/PXB since: PXN at a NIC */
    ST_VC2C,    /* GPU, NVLink only, the passed GPU, its C2C link: at its CPU */
    ST_VP2C,    /* ... the passed GPU, C2C, PCIe since (a P2C route from it): PXN at a NIC */
    ST_RVIA,    /* NIC, PIX/PXB or reverse P2C to the passed GPU, NVLink only since: PXN at a GPU */
    ST_COUNT
};

static bool passed_gpu(int s) { return s >= ST_VNVL; }

struct label {
    double bw;
    int node, pred, link, hops, nvl, via;
    int next; /* the next label at the same (node, state), -1 at the end */
    unsigned char state, type;
};

struct plait_topo_router {
    const struct plait_topo *topo;
    int n;
    int *adj_start;            /* links of node v: adj[adj_start[v] .. adj_start[v + 1]) in link order */
    int *adj;
    unsigned char *link_class; /* the path type of each link (the table in the spec) */
    int *head;                 /* first label at (node, state), n * ST_COUNT */
    int *best;                 /* the chosen label per node after a run, -1 none */
    struct label *labels;
    int nlabels, cap_labels;
    int src;
};

static bool is_pci_kind(const struct plait_topo_node *nd, enum plait_topo_pci_kind kind)
{
    return nd->type == PLAIT_TOPO_PCI && nd->pci.kind == kind;
}

static enum plait_topo_path_type link_class(const struct plait_topo *topo, const struct plait_topo_link *l)
{
    const struct plait_topo_node *x = &topo->nodes[l->a], *y = &topo->nodes[l->b];
    switch (l->type) {
    case PLAIT_LINK_NVL: return PLAIT_PATH_NVL;
    case PLAIT_LINK_C2C: return PLAIT_PATH_C2C;
    case PLAIT_LINK_SYS: return PLAIT_PATH_SYS;
    case PLAIT_LINK_NET: return PLAIT_PATH_NET;
    case PLAIT_LINK_PCI:
    default:
        /* A host bridge below a device matches two rows of the table (pci node
         * and device; host bridge at one end): the worse one, PHB, is what
         * crossing a host bridge means. */
        if (x->type == PLAIT_TOPO_CPU || y->type == PLAIT_TOPO_CPU || is_pci_kind(x, PLAIT_PCI_HOST_BRIDGE) ||
            is_pci_kind(y, PLAIT_PCI_HOST_BRIDGE))
            return PLAIT_PATH_PHB;
        if (x->type == PLAIT_TOPO_PCI && y->type == PLAIT_TOPO_PCI)
            return PLAIT_PATH_PXB;
        return PLAIT_PATH_PIX; /* a switch and a device (or, oddly, two devices) */
    }
}

plait_result_t plait_topo_router_create(const struct plait_topo *topo, struct plait_topo_router **router_out)
{
    if (topo == NULL || router_out == NULL)
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "topology paths: graph or output is NULL");
    int n = topo->nnodes, m = topo->nlinks;
    if (n < 0 || m < 0 || n > PLAIT_TOPO_MAX_NODES || m > PLAIT_TOPO_MAX_LINKS)
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "topology paths: %d nodes and %d links out of range", n, m);
    for (int i = 0; i < m; i++) {
        const struct plait_topo_link *l = &topo->links[i];
        if (l->a < 0 || l->b < 0 || l->a >= n || l->b >= n || l->a == l->b)
            return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "topology paths: link %d joins node %d and node %d", i,
                               l->a, l->b);
    }
    struct plait_topo_router *r = calloc(1, sizeof(*r));
    if (r == NULL)
        return plait_error(PLAIT_ERR_SYSTEM, "topology paths: out of memory");
    r->topo = topo;
    r->n = n;
    r->adj_start = calloc((size_t)n + 1, sizeof(int));
    r->adj = malloc(((size_t)m * 2 + 1) * sizeof(int));
    r->link_class = malloc((size_t)m + 1);
    r->head = malloc(((size_t)n * ST_COUNT + 1) * sizeof(int));
    r->best = malloc(((size_t)n + 1) * sizeof(int));
    r->cap_labels = 4 * n + 16;
    r->labels = malloc((size_t)r->cap_labels * sizeof(struct label));
    if (r->adj_start == NULL || r->adj == NULL || r->link_class == NULL || r->head == NULL || r->best == NULL ||
        r->labels == NULL) {
        plait_topo_router_free(r);
        return plait_error(PLAIT_ERR_SYSTEM, "topology paths: out of memory");
    }
    /* Adjacency in link order, so that ties between equally good routes are
     * broken the same way on every run and every host. */
    for (int i = 0; i < m; i++) {
        r->adj_start[topo->links[i].a + 1]++;
        r->adj_start[topo->links[i].b + 1]++;
        r->link_class[i] = (unsigned char)link_class(topo, &topo->links[i]);
    }
    for (int v = 0; v < n; v++)
        r->adj_start[v + 1] += r->adj_start[v];
    int *fill = r->best; /* scratch until the first run */
    for (int v = 0; v < n; v++)
        fill[v] = r->adj_start[v];
    for (int i = 0; i < m; i++) {
        r->adj[fill[topo->links[i].a]++] = i;
        r->adj[fill[topo->links[i].b]++] = i;
    }
    r->src = -1;
    *router_out = r;
    return PLAIT_SUCCESS;
}

void plait_topo_router_free(struct plait_topo_router *r)
{
    if (r == NULL)
        return;
    free(r->adj_start);
    free(r->adj);
    free(r->link_class);
    free(r->head);
    free(r->best);
    free(r->labels);
    free(r);
}

static bool may_pass(enum plait_topo_node_type t)
{
    return t == PLAIT_TOPO_PCI || t == PLAIT_TOPO_CPU || t == PLAIT_TOPO_NVS;
}

static int start_state(enum plait_topo_node_type src, enum plait_topo_link_type lt)
{
    if (src == PLAIT_TOPO_GPU && lt == PLAIT_LINK_NVL)
        return ST_NVL;
    if (src == PLAIT_TOPO_GPU && lt == PLAIT_LINK_C2C)
        return ST_C2C;
    if (lt == PLAIT_LINK_PCI)
        return ST_PCI;
    return ST_GEN;
}

/* The state after crossing a link of type lt out of a pci/cpu/nvs node, or -1
 * when the route may not go that way. */
static int next_state(int s, enum plait_topo_link_type lt)
{
    switch (s) {
    case ST_GEN: return ST_GEN;
    case ST_NVL: return lt == PLAIT_LINK_NVL ? ST_NVL : ST_GEN;
    case ST_C2C:
    case ST_P2C: return lt == PLAIT_LINK_PCI ? ST_P2C : ST_GEN;
    case ST_PCI: return lt == PLAIT_LINK_PCI ? ST_PCI : lt == PLAIT_LINK_C2C ? ST_RP2C : ST_GEN;
    case ST_VNVL: return lt == PLAIT_LINK_NVL ? ST_VNVL : -1;
    case ST_VPCI: return lt == PLAIT_LINK_PCI ? ST_VPCI : -1;
    case ST_VC2C:
    case ST_VP2C: return lt == PLAIT_LINK_PCI ? ST_VP2C : -1;
    case ST_RVIA: return lt == PLAIT_LINK_NVL ? ST_RVIA : -1;
    default: return -1; /* ST_RP2C is only ever at a GPU */
    }
}

/* The state after passing the GPU the label `at` stands at, leaving over a
 * link of type lt, or -1 when that GPU may not be passed that way. */
static int pass_state(const struct label *at, enum plait_topo_node_type src, enum plait_topo_link_type lt)
{
    switch (at->state) {
    case ST_NVL: /* from a GPU over NVLink only */
        return lt == PLAIT_LINK_NVL ? ST_VNVL : lt == PLAIT_LINK_PCI ? ST_VPCI : lt == PLAIT_LINK_C2C ? ST_VC2C : -1;
    case ST_PCI: /* from a NIC: PXN the other way needs the NIC's part PIX or PXB */
        return src == PLAIT_TOPO_NIC && at->type <= PLAIT_PATH_PXB && lt == PLAIT_LINK_NVL ? ST_RVIA : -1;
    case ST_RP2C: /* from a NIC: PCIe, the GPU's CPU, its C2C link: the P2C route of PXN over C2C */
        return src == PLAIT_TOPO_NIC && lt == PLAIT_LINK_NVL ? ST_RVIA : -1;
    default: return -1;
    }
}

static int max_type(int a, int b) { return a > b ? a : b; }

/* The final type of a label at its node, or -1 when its route may not end
 * there. Each case is a non-decreasing function of lb->type, as the
 * dominance rule needs. */
static int final_type(const struct label *lb, enum plait_topo_node_type at)
{
    switch (lb->state) {
    case ST_P2C:
    case ST_RP2C: return lb->type <= PLAIT_PATH_PHB ? PLAIT_PATH_P2C : lb->type;
    case ST_VNVL: return at == PLAIT_TOPO_GPU ? max_type(lb->type, PLAIT_PATH_NVB) : -1;
    case ST_VPCI: return at == PLAIT_TOPO_NIC && lb->type <= PLAIT_PATH_PXB ? PLAIT_PATH_PXN : -1;
    case ST_VC2C: return -1;
    case ST_VP2C: return at == PLAIT_TOPO_NIC ? PLAIT_PATH_PXN : -1;
    case ST_RVIA: return at == PLAIT_TOPO_GPU ? PLAIT_PATH_PXN : -1;
    default: return lb->type;
    }
}

/* Whether a label in a passed state at a node of type t can still end well:
 * only the nodes its shape passes or ends at (keeps the fronts small). */
static bool worth_keeping(int state, int type, enum plait_topo_node_type t)
{
    switch (state) {
    case ST_VNVL:
    case ST_RVIA: return t == PLAIT_TOPO_GPU || t == PLAIT_TOPO_NVS || t == PLAIT_TOPO_CPU;
    case ST_VPCI: return type <= PLAIT_PATH_PXB && (t == PLAIT_TOPO_PCI || t == PLAIT_TOPO_NIC);
    case ST_VC2C: return t == PLAIT_TOPO_CPU;
    case ST_VP2C: return t == PLAIT_TOPO_PCI || t == PLAIT_TOPO_NIC;
    default: return true;
    }
}

static plait_result_t push_label(struct plait_topo_router *r, const struct label *lb)
{
    int key = lb->node * ST_COUNT + lb->state;
    for (int i = r->head[key]; i >= 0; i = r->labels[i].next) {
        const struct label *e = &r->labels[i];
        /* Dominated: no worse in every figure (e has no more hops: breadth-
         * first) and naming a via GPU no higher (so that ties pick the same
         * via from both ends). */
        if (e->type <= lb->type && e->bw >= lb->bw && e->nvl >= lb->nvl && e->via <= lb->via)
            return PLAIT_SUCCESS;
    }
    if (r->nlabels == r->cap_labels) {
        if (r->cap_labels > INT_MAX / 4)
            return plait_error(PLAIT_ERR_SYSTEM, "topology paths: too many labels");
        int cap = r->cap_labels * 2;
        struct label *nl = realloc(r->labels, (size_t)cap * sizeof(*nl));
        if (nl == NULL)
            return plait_error(PLAIT_ERR_SYSTEM, "topology paths: out of memory");
        r->labels = nl;
        r->cap_labels = cap;
    }
    struct label *dst = &r->labels[r->nlabels];
    *dst = *lb;
    dst->next = r->head[key];
    r->head[key] = r->nlabels++;
    return PLAIT_SUCCESS;
}

static plait_result_t expand(struct plait_topo_router *r, int idx)
{
    const struct plait_topo *topo = r->topo;
    struct label cur = r->labels[idx]; /* copied: push_label may move the array */
    int v = cur.node;
    enum plait_topo_node_type vt = topo->nodes[v].type;
    enum plait_topo_node_type st = topo->nodes[r->src].type;
    if (v != r->src && !may_pass(vt) && vt != PLAIT_TOPO_GPU)
        return PLAIT_SUCCESS; /* NICs are never passed */
    if (v != r->src && vt == PLAIT_TOPO_GPU && (cur.state != ST_NVL && cur.state != ST_PCI && cur.state != ST_RP2C))
        return PLAIT_SUCCESS; /* a GPU is passed only in the NVB and PXN shapes */
    for (int a = r->adj_start[v]; a < r->adj_start[v + 1]; a++) {
        int li = r->adj[a];
        const struct plait_topo_link *l = &topo->links[li];
        int w = l->a == v ? l->b : l->a;
        if (w == r->src || w == cur.via)
            continue; /* never useful: cutting the loop out is better */
        int state, via = cur.via;
        if (v == r->src) {
            state = start_state(st, l->type);
        } else if (vt == PLAIT_TOPO_GPU) {
            state = pass_state(&cur, st, l->type);
            via = v;
        } else {
            state = next_state(cur.state, l->type);
        }
        int type = max_type(r->link_class[li], cur.type);
        if (state < 0 || !worth_keeping(state, type, topo->nodes[w].type))
            continue;
        struct label nl = {
            .bw = cur.bw < l->bw ? cur.bw : l->bw,
            .node = w,
            .pred = idx,
            .link = li,
            .hops = cur.hops + 1,
            .nvl = l->type == PLAIT_LINK_NVL && l->lanes < cur.nvl ? l->lanes : cur.nvl,
            .via = via,
            .next = -1,
            .state = (unsigned char)state,
            .type = (unsigned char)type,
        };
        plait_result_t rc = push_label(r, &nl);
        if (rc != PLAIT_SUCCESS)
            return rc;
    }
    return PLAIT_SUCCESS;
}

/* Is label a better final route than label b (both admissible, types given)? */
static bool better(int ta, const struct label *a, int tb, const struct label *b)
{
    if (ta != tb)
        return ta < tb;
    if (a->bw != b->bw)
        return a->bw > b->bw;
    if (a->hops != b->hops)
        return a->hops < b->hops;
    if (a->nvl != b->nvl)
        return a->nvl > b->nvl;
    return a->via < b->via;
}

plait_result_t plait_topo_router_run(struct plait_topo_router *r, int src, struct plait_topo_path *row)
{
    const struct plait_topo *topo = r->topo;
    if (src < 0 || src >= r->n)
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "topology paths: source node %d out of range", src);
    for (int i = 0; i < r->n * ST_COUNT; i++)
        r->head[i] = -1;
    for (int v = 0; v < r->n; v++)
        r->best[v] = -1;
    r->nlabels = 0;
    r->src = src;
    /* The seed: LOC at the source, figures neutral for max/min. */
    r->labels[r->nlabels++] = (struct label){.bw = INFINITY, .node = src, .pred = -1, .link = -1, .hops = 0,
                                             .nvl = INT_MAX, .via = -1, .next = -1, .state = ST_GEN,
                                             .type = PLAIT_PATH_LOC};
    for (int i = 0; i < r->nlabels; i++) {
        plait_result_t st = expand(r, i);
        if (st != PLAIT_SUCCESS)
            return st;
    }
    int best_type[PLAIT_TOPO_MAX_NODES];
    for (int i = 1; i < r->nlabels; i++) {
        const struct label *lb = &r->labels[i];
        int ft = final_type(lb, topo->nodes[lb->node].type);
        if (ft < 0)
            continue;
        int b = r->best[lb->node];
        if (b < 0 || better(ft, lb, best_type[lb->node], &r->labels[b])) {
            r->best[lb->node] = i;
            best_type[lb->node] = ft;
        }
    }
    if (row == NULL)
        return PLAIT_SUCCESS;
    for (int w = 0; w < r->n; w++) {
        struct plait_topo_path *p = &row[w];
        if (w == src) {
            *p = (struct plait_topo_path){.type = PLAIT_PATH_LOC, .bw = PLAIT_TOPO_LOC_BW, .hops = 0, .nvlinks = 0,
                                          .via = -1};
            continue;
        }
        int b = r->best[w];
        if (b < 0) {
            *p = (struct plait_topo_path){.type = PLAIT_PATH_DIS, .bw = 0, .hops = 0, .nvlinks = 0, .via = -1};
            continue;
        }
        const struct label *lb = &r->labels[b];
        bool has_via = passed_gpu(lb->state);
        *p = (struct plait_topo_path){.type = (enum plait_topo_path_type)best_type[w], .bw = lb->bw,
                                      .hops = lb->hops, .nvlinks = lb->nvl == INT_MAX ? 0 : lb->nvl,
                                      .via = has_via ? lb->via : -1};
    }
    return PLAIT_SUCCESS;
}

int plait_topo_router_route(const struct plait_topo_router *r, int dst, int *dlinks, int max)
{
    if (r->src < 0 || dst < 0 || dst >= r->n)
        return -1;
    if (dst == r->src)
        return 0;
    int b = r->best[dst];
    if (b < 0)
        return -1;
    int len = r->labels[b].hops;
    /* Walk back from dst; the label at position k of the route (from src) has k hops. */
    for (int i = b; r->labels[i].pred >= 0; i = r->labels[i].pred) {
        const struct label *lb = &r->labels[i];
        int k = lb->hops - 1;
        if (k < max) {
            const struct plait_topo_link *l = &r->topo->links[lb->link];
            dlinks[k] = 2 * lb->link + (l->b == lb->node ? 0 : 1);
        }
    }
    return len;
}

plait_result_t plait_topo_paths_compute(const struct plait_topo *topo, struct plait_topo_paths **paths_out)
{
    if (topo == NULL || paths_out == NULL)
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "plait_topo_paths_compute: graph or output is NULL");
    struct plait_topo_router *r;
    plait_result_t st = plait_topo_router_create(topo, &r);
    if (st != PLAIT_SUCCESS)
        return st;
    struct plait_topo_paths *paths = calloc(1, sizeof(*paths));
    size_t n = (size_t)topo->nnodes;
    if (paths == NULL || (paths->p = malloc((n * n + 1) * sizeof(struct plait_topo_path))) == NULL) {
        st = plait_error(PLAIT_ERR_SYSTEM, "plait_topo_paths_compute: out of memory for %zu x %zu paths", n, n);
        goto err_free_paths;
    }
    paths->n = topo->nnodes;
    for (int s = 0; s < topo->nnodes; s++) {
        st = plait_topo_router_run(r, s, paths->p + (size_t)s * n);
        if (st != PLAIT_SUCCESS)
            goto err_free_paths;
    }
    plait_topo_router_free(r);
    *paths_out = paths;
    return PLAIT_SUCCESS;

err_free_paths:
    plait_topo_paths_free(paths);
    plait_topo_router_free(r);
    return st;
}

void plait_topo_paths_free(struct plait_topo_paths *paths)
{
    if (paths == NULL)
        return;
    free(paths->p);
    free(paths);
}

void plait_topo_path_label(const struct plait_topo_path *path, char *buf, size_t len)
{
    if (buf == NULL || len == 0)
        return;
    if (path == NULL) {
        snprintf(buf, len, "?");
        return;
    }
    if (path->type == PLAIT_PATH_LOC)
        snprintf(buf, len, "X");
    else if (path->type == PLAIT_PATH_NVL)
        snprintf(buf, len, "NV%d", path->nvlinks);
    else
        snprintf(buf, len, "%s", plait_topo_path_type_name(path->type));
}

/* ---- NIC affinity ---- */

static double nic_cap(const struct plait_topo_node *nic, double bw)
{
    double s = nic->nic.speed / 8.0;
    return s > 0 && s < bw ? s : bw;
}

/* The nearest NIC to node `dev` given how many GPUs already chose each NIC
 * (chosen[] by NIC index, may be NULL), or -1. */
static int nearest_nic(const struct plait_topo *topo, const struct plait_topo_paths *paths, int dev,
                       const int *chosen)
{
    int best = -1;
    for (int x = 0; x < topo->nnodes; x++) {
        const struct plait_topo_node *nx = &topo->nodes[x];
        if (nx->type != PLAIT_TOPO_NIC)
            continue;
        const struct plait_topo_path *p = plait_topo_path(paths, dev, x);
        if (p->type == PLAIT_PATH_DIS)
            continue;
        if (best < 0) {
            best = x;
            continue;
        }
        const struct plait_topo_path *q = plait_topo_path(paths, dev, best);
        double bp = nic_cap(nx, p->bw), bq = nic_cap(&topo->nodes[best], q->bw);
        int cp = chosen ? chosen[nx->index] : 0, cq = chosen ? chosen[topo->nodes[best].index] : 0;
        if (p->type != q->type ? p->type < q->type
            : bp != bq         ? bp > bq
            : cp != cq         ? cp < cq
                               : nx->index < topo->nodes[best].index)
            best = x;
    }
    return best;
}

plait_result_t plait_topo_affinity(const struct plait_topo *topo, const struct plait_topo_paths *paths, int gpu,
                                   struct plait_topo_affinity *out)
{
    if (topo == NULL || paths == NULL || out == NULL)
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "plait_topo_affinity: graph, paths or output is NULL");
    if (paths->n != topo->nnodes)
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "plait_topo_affinity: paths of %d nodes for a graph of %d",
                           paths->n, topo->nnodes);
    if (gpu < 0 || gpu >= topo->nnodes || topo->nodes[gpu].type != PLAIT_TOPO_GPU)
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "plait_topo_affinity: node %d is not a GPU", gpu);
    int nnics = topo->counts[PLAIT_TOPO_NIC];
    int *chosen = calloc((size_t)nnics + 1, sizeof(int));
    if (chosen == NULL)
        return plait_error(PLAIT_ERR_SYSTEM, "plait_topo_affinity: out of memory");
    /* "The NIC fewest other GPUs have as their nearest" is circular as worded;
     * it is made a rule by deciding the GPUs in index order, each seeing the
     * choices of the GPUs before it. */
    int nic = -1;
    for (int g = 0; g < topo->nnodes; g++) {
        const struct plait_topo_node *ng = &topo->nodes[g];
        if (ng->type != PLAIT_TOPO_GPU || ng->index > topo->nodes[gpu].index)
            continue;
        int x = nearest_nic(topo, paths, g, chosen);
        if (g == gpu) {
            nic = x;
            break;
        }
        if (x >= 0 && topo->nodes[x].index < nnics)
            chosen[topo->nodes[x].index]++;
    }
    free(chosen);
    struct plait_topo_affinity a = {.gpu = gpu, .nic = nic, .type = PLAIT_PATH_DIS, .bw = 0, .has_gdr = false,
                                    .cpu = -1};
    if (nic >= 0) {
        const struct plait_topo_path *p = plait_topo_path(paths, gpu, nic);
        a.type = p->type;
        a.bw = nic_cap(&topo->nodes[nic], p->bw);
        a.has_gdr = topo->nodes[nic].nic.has_gdr && (p->type == PLAIT_PATH_PIX || p->type == PLAIT_PATH_PXB ||
                                                     p->type == PLAIT_PATH_PXN || p->type == PLAIT_PATH_P2C);
    }
    if (topo->nodes[gpu].numa >= 0)
        a.cpu = plait_topo_nth(topo, PLAIT_TOPO_CPU, topo->nodes[gpu].numa);
    *out = a;
    return PLAIT_SUCCESS;
}
