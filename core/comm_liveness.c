/* Dead peers: a same-host process's exit (its pidfd), the operation counters
 * same-host ranks publish, and the deaths announced on the bootstrap ring;
 * which rank failed first, for the error of a wait that cannot complete. */
#define _GNU_SOURCE
#include "core/comm.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "bootstrap/bootstrap.h"
#include "base/log.h"
#include "base/util.h"

const char *plait_peer_str(const struct plait_comm *comm, int peer, char *buf, size_t len)
{
    if (comm->ranks && peer >= 0 && peer < comm->nranks)
        snprintf(buf, len, "rank %d (host %s, pid %d)", peer, comm->ranks[peer].hostname, comm->ranks[peer].pid);
    else
        snprintf(buf, len, "rank %d", peer);
    return buf;
}

void plait_comm_watch_peers(struct plait_comm *comm)
{
    /* Same host, other process: watch its pid for an exit. */
    const int n = comm->nranks, me = comm->rank;
    for (int p = 0; p < n; p++) {
        const struct plait_rank_info *rp = &comm->ranks[p], *rm = &comm->ranks[me];
        if (p == me || rp->host_index != comm->host_index ||
            (rp->pid == rm->pid && rp->process_token == rm->process_token))
            continue;
        int fd = (int)syscall(SYS_pidfd_open, (pid_t)comm->ranks[p].pid, 0);
        if (fd < 0)
            PLAIT_INFO(PLAIT_SUBSYS_INIT, "rank %d: cannot watch rank %d's process (pid %d): %s", me, p,
                       comm->ranks[p].pid, strerror(errno));
        comm->pidfds[p] = fd;
    }
}

void plait_comm_unwatch_peers(struct plait_comm *comm)
{
    if (comm->pidfds)
        for (int p = 0; p < comm->nranks; p++)
            if (comm->pidfds[p] >= 0)
                close(comm->pidfds[p]);
}

static void check_peers_locked(struct plait_comm *comm);

/* dead_peer and dead_reporter, with the peer state check_peers keeps, are
 * written and read under peers_lock only: the CUDA proxy thread checks peers
 * while the issuing thread builds its error. What the hot waits read
 * (conn->peer_gone, peer_exited) is atomic besides. */
plait_result_t plait_comm_check_waiting(struct plait_comm *comm)
{
    if (plait_aborted(&comm->abort_flag))
        return plait_error(PLAIT_ERR_REMOTE, "communicator aborted (plait_comm_abort)");
    pthread_mutex_lock(&comm->peers_lock);
    check_peers_locked(comm);
    const int dead = comm->dead_peer, reporter = comm->dead_reporter;
    pthread_mutex_unlock(&comm->peers_lock);
    if (dead < 0)
        return PLAIT_SUCCESS;
    char who[160], by[48] = "";
    if (reporter >= 0)
        snprintf(by, sizeof(by), " (as rank %d found)", reporter);
    plait_result_t res = plait_error(PLAIT_ERR_REMOTE,
                                     "%s died in the middle of an operation%s; the communicator is broken",
                                     plait_peer_str(comm, dead, who, sizeof(who)), by);
    plait_comm_publish_death(comm, dead);
    return res;
}

void plait_comm_check_peers(struct plait_comm *comm)
{
    /* The issuing thread (the CPU executor) and, while a device launch is in
     * flight, the CUDA proxy thread (core/cuda/proxy.c) both check. */
    pthread_mutex_lock(&comm->peers_lock);
    check_peers_locked(comm);
    pthread_mutex_unlock(&comm->peers_lock);
}

static void check_peers_locked(struct plait_comm *comm)
{
    for (int p = 0; p < comm->nranks; p++) {
        if (!comm->pidfds || comm->pidfds[p] < 0)
            continue;
        struct pollfd pfd = {.fd = comm->pidfds[p], .events = POLLIN};
        if (poll(&pfd, 1, 0) <= 0 || !(pfd.revents & (POLLIN | POLLHUP | POLLERR)))
            continue;
        /* Kept after the pidfd goes: a wait that needs this peer (a FIFO slot,
         * a small-message box) then fails at once. */
        if (comm->peer_exited)
            __atomic_store_n(&comm->peer_exited[p], 1, __ATOMIC_SEQ_CST);
        /* The process is gone: what it left in our FIFOs is still read; waiting
         * for more becomes an error. */
        for (int c = 0; c < comm->ncls; c++) {
            /* seq_cst: see plait_comm_conn_get's making of a connection */
            struct plait_conn *conn = __atomic_load_n(&comm->conns[p * comm->ncls + c], __ATOMIC_SEQ_CST);
            /* A TCP peer's last data may still sit in our kernel buffer:
             * its EOF, read in order after that data, is what ends it. */
            if (conn && !conn->needs_progress)
                __atomic_store_n(&conn->peer_gone, 1, __ATOMIC_RELEASE);
        }
        const uint64_t *ops = comm->peer_ops ? comm->peer_ops[p] : NULL;
        if (ops && __atomic_load_n(&ops[PLAIT_OPS_ISSUED], __ATOMIC_ACQUIRE) >
                       __atomic_load_n(&ops[PLAIT_OPS_COMPLETED], __ATOMIC_ACQUIRE) &&
            comm->dead_peer < 0) {
            comm->dead_peer = p;
            comm->dead_reporter = -1;
            char who[160];
            PLAIT_WARN(PLAIT_SUBSYS_INIT, "rank %d: %s died during an operation", comm->rank,
                       plait_peer_str(comm, p, who, sizeof(who)));
        }
        close(comm->pidfds[p]);
        comm->pidfds[p] = -1;
    }
    /* A rank that failed because another died says so in its header (it may
     * itself exit next: the death it saw is the one to report, not its own). */
    for (int p = 0; p < comm->nranks && comm->peer_ops; p++) {
        const uint64_t *ops = comm->peer_ops[p];
        if (!ops)
            continue;
        uint64_t culprit = __atomic_load_n(&ops[PLAIT_OPS_CULPRIT], __ATOMIC_ACQUIRE);
        if (culprit == 0 || culprit > (uint64_t)comm->nranks || (int)culprit - 1 == comm->rank)
            continue;
        /* take the first report; and when the rank we saw die had itself seen
         * another die first, that other one is the cause */
        if (comm->dead_peer < 0 || (comm->dead_peer == p && comm->dead_reporter < 0)) {
            comm->dead_peer = (int)culprit - 1;
            comm->dead_reporter = p;
        }
    }
    /* Every rank, on any host: a notice on the bootstrap ring that a rank
     * failed because another died. */
    int culprit = -1, from = -1;
    if (plait_bootstrap_poll_notices(comm->bs, &culprit, &from) && culprit != comm->rank &&
        (comm->dead_peer < 0 || (comm->dead_peer == from && comm->dead_reporter < 0))) {
        comm->dead_peer = culprit;
        comm->dead_reporter = from;
    }
}

void plait_comm_publish_death(struct plait_comm *comm, int peer)
{
    if (peer < 0 || peer >= comm->nranks || peer == comm->rank)
        return;
    if (comm->my_ops != comm->local_ops) {
        uint64_t none = 0;
        __atomic_compare_exchange_n(&comm->my_ops[PLAIT_OPS_CULPRIT], &none, (uint64_t)peer + 1, 0, __ATOMIC_RELEASE,
                                    __ATOMIC_RELAXED);
    }
    plait_bootstrap_notify_death(comm->bs, peer);
}

/* Who failed first, when `peer` is gone: *reporter_out is the rank that said
 * so, or -1 when this rank's own evidence decided. */
static int blame(struct plait_comm *comm, int peer, int *reporter_out)
{
    *reporter_out = -1;
    const double until = plait_deadline(PLAIT_BLAME_GRACE_S);
    for (;;) {
        pthread_mutex_lock(&comm->peers_lock);
        check_peers_locked(comm);
        const int dead = comm->dead_peer, reporter = comm->dead_reporter;
        /* A same-host peer whose header we read: check_peers has taken any
         * death it reported. A neighbour on the ring whose connection ended
         * with no notice: it died itself. */
        const int died = (comm->peer_exited && __atomic_load_n(&comm->peer_exited[peer], __ATOMIC_ACQUIRE) &&
                          comm->peer_ops && comm->peer_ops[peer]) ||
                         plait_bootstrap_neighbour_died(comm->bs, peer);
        pthread_mutex_unlock(&comm->peers_lock);
        if (dead >= 0 && dead != comm->rank) {
            if (dead != peer)
                *reporter_out = reporter;
            return dead;
        }
        if (died || plait_deadline_passed(until))
            return peer;
        usleep(1000);
    }
}

plait_result_t plait_comm_peer_gone(struct plait_comm *comm, int peer, const char *what)
{
    int reporter = -1;
    const int culprit = blame(comm, peer, &reporter);
    /* Before anything else (this rank may exit after returning the error):
     * the ranks waiting on us must learn who really died. */
    plait_comm_publish_death(comm, culprit);
    char who[160], dead[160], by[48] = "";
    plait_peer_str(comm, peer, who, sizeof(who));
    if (culprit == peer)
        return plait_error(PLAIT_ERR_REMOTE, "%s is gone (%s)", who, what);
    if (reporter >= 0)
        snprintf(by, sizeof(by), " (as rank %d found)", reporter);
    return plait_error(PLAIT_ERR_REMOTE, "%s died%s; %s is gone with it (%s)",
                       plait_peer_str(comm, culprit, dead, sizeof(dead)), by, who, what);
}
