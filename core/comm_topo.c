/* The communicator's view of the machines: what each rank says of its device
 * and host at init, the per-host channel search, and the ring orders the
 * generators follow (args->order/pos).
 *
 * Every rank of a host searches the same graph with the same inputs, so they
 * find the same channels; the ranks of other hosts cannot see that graph, so
 * each rank publishes its place in each channel of its host (a second
 * allgather of a few integers) and every rank rebuilds the whole ring from
 * those places. A host whose ranks disagree (different graphs, say one of them
 * has PLAIT_TOPO_FILE set) keeps rank order, which every rank can tell from
 * the published hashes and places alike. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/comm.h"
#include "bootstrap/bootstrap.h"
#include "base/log.h"
#include "topology/topo.h"

plait_result_t plait_comm_topo_describe(struct plait_comm *comm, struct plait_rank_info *mine)
{
    const struct plait_topo *topo;
    plait_result_t r = plait_topo_get(&topo);
    if (r != PLAIT_SUCCESS)
        return r;
    comm->topo = topo;
    mine->numa = plait_topo_cpu_of_self(topo);
    mine->topo_hash = plait_topo_hash(topo);
    if (comm->rank == 0)
        plait_topo_dump_once(topo);
    return PLAIT_SUCCESS;
}

/* The graph node a local rank's device is: its NUMA node's cpu node (CPU
 * ranks; GPU ranks too, until the CUDA backend describes its device here). */
static int device_node(const struct plait_topo *topo, const struct plait_rank_info *info)
{
    int n = info->numa >= 0 ? plait_topo_nth(topo, PLAIT_TOPO_CPU, info->numa) : -1;
    return n >= 0 ? n : plait_topo_nth(topo, PLAIT_TOPO_CPU, 0);
}

/* Searches this host's channels and fills my place in each of the
 * communicator's channels (-1: no search, keep rank order). */
static void search_my_places(struct plait_comm *comm, const int *local_ranks, int nlocal, int32_t *place)
{
    const struct plait_topo *topo = comm->topo;
    const struct plait_topo_paths *paths;
    struct plait_topo_search *res = NULL;
    int devs[PLAIT_TOPO_MAX_LOCAL];

    for (int c = 0; c < PLAIT_MAX_CHANNELS_TOPO; c++)
        place[c] = -1;
    if (nlocal < 2 || nlocal > PLAIT_TOPO_MAX_LOCAL)
        return;
    for (int l = 0; l < nlocal; l++) {
        const struct plait_rank_info *info = &comm->ranks[local_ranks[l]];
        if (info->topo_hash != comm->ranks[comm->rank].topo_hash) {
            PLAIT_INFO(PLAIT_SUBSYS_GRAPH,
                       "topology: rank %d sees another graph of host %s than rank %d: rings keep rank order there",
                       local_ranks[l], info->hostname, comm->rank);
            return;
        }
        devs[l] = device_node(topo, info);
        if (devs[l] < 0)
            return;
    }
    if ((res = calloc(1, sizeof(*res))) == NULL)
        goto out;
    bool one_device = true;
    for (int l = 1; l < nlocal; l++)
        one_device = one_device && devs[l] == devs[0];
    if (one_device) {
        /* Every hop is on one device (CPU ranks on one NUMA node): any order is
         * as good, and rank order needs no search. */
        res->nchannels = 1;
        res->bw = PLAIT_TOPO_LOC_BW / nlocal; /* nlocal LOC hops share the device (docs/topology.md) */
        res->ch[0].n = nlocal;
        res->ch[0].worst = PLAIT_PATH_LOC;
        for (int l = 0; l < nlocal; l++)
            res->ch[0].order[l] = l;
    } else if (plait_topo_get_paths(&paths) != PLAIT_SUCCESS ||
               plait_topo_search_channels(topo, paths, devs, nlocal, comm->nhosts > 1, PLAIT_TOPO_RING, res) !=
                   PLAIT_SUCCESS ||
               res->nchannels < 1) {
        PLAIT_INFO(PLAIT_SUBSYS_GRAPH, "topology: channel search failed (%s): rings keep rank order",
                   plait_last_error_get());
        goto out;
    }
    for (int c = 0; c < comm->nchannels && c < PLAIT_MAX_CHANNELS_TOPO; c++) {
        const struct plait_topo_channel *ch = &res->ch[c % res->nchannels];
        for (int i = 0; i < ch->n; i++)
            if (ch->order[i] == comm->local_rank)
                place[c] = i;
    }
    if (comm->local_rank == 0 && plait_log_level() >= PLAIT_LOG_INFO) {
        char line[256];
        size_t o = 0;
        const struct plait_topo_channel *ch = &res->ch[0];
        for (int i = 0; i < ch->n && o < sizeof(line) - 16; i++)
            o += (size_t)snprintf(line + o, sizeof(line) - o, "%s%d", i ? " " : "", local_ranks[ch->order[i]]);
        PLAIT_INFO(PLAIT_SUBSYS_GRAPH, "topology: host %s: %d channel%s found, %.1f GB/s; ring 0 over ranks %s (worst %s)",
                   comm->ranks[comm->rank].hostname, res->nchannels, res->nchannels == 1 ? "" : "s", res->bw, line,
                   plait_topo_path_type_name(ch->worst));
    }
out:
    free(res);
}

plait_result_t plait_comm_topo_setup(struct plait_comm *comm)
{
    const int n = comm->nranks;
    int *local_ranks = malloc(sizeof(int) * (size_t)n);
    int32_t *places = calloc((size_t)n * PLAIT_MAX_CHANNELS_TOPO, sizeof(int32_t));
    int *host_ranks = malloc(sizeof(int) * (size_t)n);
    plait_result_t r = PLAIT_SUCCESS;
    if (!local_ranks || !places || !host_ranks) {
        r = plait_error(PLAIT_ERR_SYSTEM, "init: out of memory for the topology of %d ranks", n);
        goto out;
    }

    int nlocal = 0;
    for (int p = 0; p < n; p++)
        if (comm->ranks[p].host_index == comm->host_index)
            local_ranks[nlocal++] = p;
    if (comm->local_rank == 0 && plait_log_level() >= PLAIT_LOG_INFO) {
        char summary[512];
        plait_topo_summary(comm->topo, summary, sizeof(summary));
        PLAIT_INFO(PLAIT_SUBSYS_GRAPH, "topology: host %s (%d of %d): %d rank%s, %s [%s]",
                   comm->ranks[comm->rank].hostname, comm->host_index, comm->nhosts, nlocal, nlocal == 1 ? "" : "s",
                   summary, comm->topo->source);
    }
    search_my_places(comm, local_ranks, nlocal, places + (size_t)comm->rank * PLAIT_MAX_CHANNELS_TOPO);
    if (n == 1)
        goto out;
    if ((r = plait_bootstrap_allgather(comm->bs, places, PLAIT_MAX_CHANNELS_TOPO * sizeof(int32_t))) !=
        PLAIT_SUCCESS) {
        r = plait_error_context(r, "init: exchanging ring places");
        goto out;
    }

    /* Ring c: hosts in host order, each host's ranks by their place in c. A
     * host whose places are not a permutation of 0..k-1 keeps rank order. */
    const int nch = comm->nchannels;
    int32_t *order = malloc(sizeof(int32_t) * (size_t)nch * (size_t)n);
    int32_t *pos = malloc(sizeof(int32_t) * (size_t)nch * (size_t)n);
    if (!order || !pos) {
        free(order);
        free(pos);
        r = plait_error(PLAIT_ERR_SYSTEM, "init: out of memory for ring orders");
        goto out;
    }
    bool identity = true;
    for (int c = 0; c < nch; c++) {
        int at = 0;
        for (int h = 0; h < comm->nhosts; h++) {
            int k = 0;
            for (int p = 0; p < n; p++)
                if (comm->ranks[p].host_index == h)
                    host_ranks[k++] = p;
            bool ok = c < PLAIT_MAX_CHANNELS_TOPO;
            for (int i = 0; ok && i < k; i++) {
                int32_t pl = places[(size_t)host_ranks[i] * PLAIT_MAX_CHANNELS_TOPO + c];
                ok = pl >= 0 && pl < k;
                for (int j = 0; ok && j < i; j++)
                    ok = places[(size_t)host_ranks[j] * PLAIT_MAX_CHANNELS_TOPO + c] != pl;
            }
            for (int i = 0; i < k; i++) {
                int slot = ok ? places[(size_t)host_ranks[i] * PLAIT_MAX_CHANNELS_TOPO + c] : i;
                order[(size_t)c * n + at + slot] = host_ranks[i];
            }
            at += k;
        }
        for (int i = 0; i < n; i++) {
            pos[(size_t)c * n + order[(size_t)c * n + i]] = i;
            if (order[(size_t)c * n + i] != i)
                identity = false;
        }
    }
    if (identity) {
        /* Rank order: the generators' fast path (no order arrays) and the
         * table's ring peers already cover it. */
        free(order);
        free(pos);
    } else {
        comm->ring_order = order;
        comm->ring_pos = pos;
    }
out:
    free(local_ranks);
    free(places);
    free(host_ranks);
    return r;
}

bool plait_comm_ring_neighbours(const struct plait_comm *comm, int a, int b, int cls)
{
    const int n = comm->nranks;
    /* Channel c's ring runs on connection class c only. */
    if (comm->ring_pos == NULL || cls < 0 || cls >= comm->nchannels)
        return false;
    int d = comm->ring_pos[(size_t)cls * n + a] - comm->ring_pos[(size_t)cls * n + b];
    return d == 1 || d == -1 || d == n - 1 || d == 1 - n;
}
