/* Which transport joins each pair of ranks of a communicator, and which
 * connection classes a pair needs; the transports' collective setup and
 * teardown at init and destroy (core/comm.c). */
#include "core/comm.h"

#include <stdint.h>

#include "algorithms/algorithms.h"
#include "base/log.h"

/* Transports in set-up order. Every rank runs every transport's setup (each is
 * collective), even one it has no peer for. */
static const struct plait_transport *const transports[PLAIT_TP_COUNT] = {
    [PLAIT_TP_INPROC] = &plait_transport_inproc,
    [PLAIT_TP_SHM] = &plait_transport_shm,
    [PLAIT_TP_TCP] = &plait_transport_tcp,
};

int plait_pair_transport(const struct plait_comm *comm, int a, int b)
{
    if (a == b)
        return PLAIT_TP_INPROC;
    const struct plait_rank_info *ra = &comm->ranks[a], *rb = &comm->ranks[b];
    if (ra->host_index != rb->host_index || comm->set.transport_force == PLAIT_FORCE_TCP)
        return PLAIT_TP_TCP;
    if (ra->process_token == rb->process_token && ra->pid == rb->pid)
        return PLAIT_TP_INPROC;
    return PLAIT_TP_SHM;
}

int plait_conn_needed(const struct plait_comm *comm, int rank, int peer, int cls)
{
    if (cls == comm->ncls - 1)
        return 1;
    /* ring channels join the peers any algorithm of the table may use, and the
     * neighbours of the topology's ring orders */
    return plait_algo_connects(comm->nranks, comm->set.tree_radix, comm->set.algo, rank, peer) ||
           plait_comm_ring_neighbours(comm, rank, peer, cls);
}

plait_result_t plait_comm_transports_setup(struct plait_comm *comm)
{
    plait_result_t status;
    for (int p = 0; p < comm->nranks; p++)
        comm->tp_of[p] = (uint8_t)plait_pair_transport(comm, comm->rank, p);
    for (int t = 0; t < PLAIT_TP_COUNT; t++)
        if ((status = transports[t]->setup(comm)))
            return plait_error_context(status, "rank %d: %s transport", comm->rank, transports[t]->name);
    return PLAIT_SUCCESS;
}

void plait_comm_transports_teardown(struct plait_comm *comm)
{
    for (int t = PLAIT_TP_COUNT - 1; t >= 0; t--)
        transports[t]->teardown(comm);
}

const char *plait_comm_transport_name(const struct plait_comm *comm, int peer)
{
    return transports[comm->tp_of[peer]]->name;
}
