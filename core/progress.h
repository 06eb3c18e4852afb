/* Waiting for progress, and the bookkeeping around an operation.
 *
 * One waiting policy serves every loop that polls for something another rank,
 * the device or a thread must do (the executor, the small-message path, the
 * CUDA teardown and proxy): poll for spin_ns, then yield the core for
 * yield_ns, then sleep, in steps growing from sleep_min_ns to sleep_max_ns.
 * Every PLAIT_WAIT_CHECK_NS of waiting the loop is told that its checks are
 * due: the abort flag and dead peers (plait_comm_check_waiting, whose error
 * texts the callers return as they are), then the deadline, whose error each
 * caller words for what it waited for.
 *
 *     struct plait_waiter w;
 *     plait_waiter_init(&w, comm->spin_ns, comm->set.coll_timeout_s);
 *     while (!done()) {
 *         if (!plait_wait_idle(&w))
 *             continue;
 *         if ((res = plait_comm_check_waiting(comm)))
 *             return res;
 *         if (plait_wait_expired(&w))
 *             return plait_error(PLAIT_ERR_TIMEOUT, "...");
 *     }
 *
 * A poll that moved something calls plait_wait_moved: the next idle poll
 * starts the policy over (the deadline stays).
 *
 * The clock is read only once the loop has to wait; while a loop of cheap
 * polls (the small-message path: plait_waiter_cheap_polls) spins, only every
 * 64th poll: a wait that ends within a few polls (that path's common case)
 * costs no clock read, no atomic and no allocation. The deadline counts from
 * the first idle poll.
 *
 * The bookkeeping (plait_op_enter ... plait_op_leave) is the same for every
 * path that runs an operation on a communicator: see plait_op_enter. */
#ifndef PLAIT_CORE_PROGRESS_H
#define PLAIT_CORE_PROGRESS_H

#include <sched.h>
#include <stdint.h>

#include "base/util.h"
#include "core/comm.h"

#define PLAIT_WAIT_CHECK_NS 1000000ull   /* the checks are due this often while waiting */
#define PLAIT_WAIT_YIELD_NS 100000000ull /* a CPU wait yields this long before it sleeps (a late peer) */
#define PLAIT_WAIT_SLEEP_NS 200000ull    /* and then sleeps this long between polls */

struct plait_waiter {
    uint64_t idle_since;   /* when the polls stopped moving anything; 0 while they move */
    uint64_t last_check;   /* when the checks last ran (or the first idle poll); 0 before */
    uint64_t yield_ns;     /* after the spin, yield this long, then sleep */
    uint64_t sleep_min_ns; /* the first sleep */
    uint64_t sleep_max_ns; /* each further one doubles, up to this */
    uint64_t nap_ns;       /* the current sleep; 0 before the first */
    double timeout_s;      /* the deadline's distance from the first idle poll; <= 0: none */
    double deadline;       /* plait_deadline(timeout_s), set at the first idle poll; 0 = none */
    unsigned polls;        /* idle polls, for reading the clock less often while spinning */
    unsigned clock_mask;   /* while spinning, read the clock on polls where (polls & mask) == 0:
                            * 0 (every poll) unless plait_waiter_cheap_polls */
    int spin_ns;           /* poll (plait_cpu_relax) this long before yielding; 0 = never */
    int is_spinning;       /* the last clock read found the wait within spin_ns */
};

/* A CPU wait: spin for spin_ns (the communicator's spin_ns: 0 when ranks
 * outnumber cores), yield up to PLAIT_WAIT_YIELD_NS, then sleep
 * PLAIT_WAIT_SLEEP_NS between polls; timeout_s <= 0 means no deadline. */
static inline void plait_waiter_init(struct plait_waiter *w, int spin_ns, double timeout_s)
{
    w->idle_since = 0;
    w->last_check = 0;
    w->yield_ns = PLAIT_WAIT_YIELD_NS;
    w->sleep_min_ns = PLAIT_WAIT_SLEEP_NS;
    w->sleep_max_ns = PLAIT_WAIT_SLEEP_NS;
    w->nap_ns = 0;
    w->timeout_s = timeout_s;
    w->deadline = 0;
    w->polls = 0;
    w->clock_mask = 0;
    w->spin_ns = spin_ns > 0 ? spin_ns : 0;
    w->is_spinning = 0;
}

/* For a loop whose poll is a few loads (the small-message path): while
 * spinning, the clock is read on every 64th idle poll only. A costly poll (the
 * executor's pass over its tasks, the proxy's socket calls) keeps the default:
 * the clock on every poll, so the spin lasts spin_ns and no longer. */
static inline void plait_waiter_cheap_polls(struct plait_waiter *w)
{
    w->clock_mask = 63;
}

/* Changes the pause policy of an initialised waiter (a proxy thread, a
 * teardown poll): yield for yield_ns after the spin, then sleep from
 * sleep_min_ns doubling to sleep_max_ns. */
static inline void plait_waiter_pace(struct plait_waiter *w, int spin_ns, uint64_t yield_ns, uint64_t sleep_min_ns,
                                     uint64_t sleep_max_ns)
{
    w->spin_ns = spin_ns > 0 ? spin_ns : 0;
    w->yield_ns = yield_ns;
    w->sleep_min_ns = sleep_min_ns;
    w->sleep_max_ns = sleep_max_ns > sleep_min_ns ? sleep_max_ns : sleep_min_ns;
}

/* Sleeps ns nanoseconds (restarted after a signal). */
void plait_nap_ns(uint64_t ns);

/* The last poll moved something: the next idle one starts the spin over. */
static inline void plait_wait_moved(struct plait_waiter *w)
{
    w->idle_since = 0;
    w->nap_ns = 0;
}

/* The last poll moved nothing: pauses as the policy says. Returns 1 when the
 * checks are due (every PLAIT_WAIT_CHECK_NS of waiting), else 0. */
static inline int plait_wait_idle(struct plait_waiter *w)
{
    if (w->is_spinning && w->idle_since && (++w->polls & w->clock_mask) != 0) {
        plait_cpu_relax();
        return 0;
    }
    const uint64_t now = plait_now_ns();
    if (!w->idle_since) {
        w->idle_since = now;
        if (!w->last_check) {
            w->last_check = now;
            w->deadline = plait_deadline(w->timeout_s);
        }
    }
    const uint64_t idle = now - w->idle_since;
    w->is_spinning = idle < (uint64_t)w->spin_ns;
    if (w->is_spinning) {
        plait_cpu_relax();
    } else if (idle < (uint64_t)w->spin_ns + w->yield_ns) {
        sched_yield();
    } else {
        w->nap_ns = !w->nap_ns ? w->sleep_min_ns
                    : w->nap_ns * 2 > w->sleep_max_ns ? w->sleep_max_ns
                                                      : w->nap_ns * 2;
        plait_nap_ns(w->nap_ns);
    }
    if (now - w->last_check < PLAIT_WAIT_CHECK_NS)
        return 0;
    w->last_check = now;
    return 1;
}

/* Whether the deadline has passed (read when plait_wait_idle says the checks
 * are due, after the abort and peer checks). */
static inline int plait_wait_expired(const struct plait_waiter *w)
{
    return plait_deadline_passed(w->deadline);
}

/* Restarts the deadline: timeout_s from now. */
static inline void plait_wait_rearm(struct plait_waiter *w, double timeout_s)
{
    w->timeout_s = timeout_s;
    w->deadline = plait_deadline(timeout_s);
}

/* ---- the bookkeeping around an operation
 *
 *     if (plait_op_enter(comm)) { refuse; plait_op_leave(comm); }
 *     plait_op_issued(comm);
 *     ... run, waiting with a plait_waiter ...
 *     plait_op_completed(comm);          (success or failure: it returned)
 *     if (status) plait_comm_mark_failed(comm, status);
 *     plait_op_leave(comm);
 */

/* Raises comm->busy and then reads the abort flag, both sequentially
 * consistent, paired with plait_comm_abort (which stores the flag, then waits
 * for busy to fall): either the abort sees us busy and waits before it frees
 * anything, or we see its flag here before we touch the communicator's
 * resources. Returns 1 when the communicator was aborted (the caller refuses
 * the operation); busy is raised either way: plait_op_leave lowers it. */
static inline int plait_op_enter(struct plait_comm *comm)
{
    __atomic_add_fetch(&comm->busy, 1, __ATOMIC_SEQ_CST);
    return __atomic_load_n(&comm->abort_flag, __ATOMIC_SEQ_CST) != 0;
}

/* Lowers what plait_op_enter raised: from here an abort may free the
 * communicator's resources. */
static inline void plait_op_leave(struct plait_comm *comm)
{
    __atomic_sub_fetch(&comm->busy, 1, __ATOMIC_SEQ_CST);
}

/* Published for same-host peers (plait_comm_check_peers): issued > completed
 * while an operation runs, so a crash then is told apart from a clean exit. */
static inline void plait_op_issued(struct plait_comm *comm)
{
    __atomic_add_fetch(&comm->my_ops[PLAIT_OPS_ISSUED], 1, __ATOMIC_RELEASE);
}

/* Completed means returned, with or without an error: a rank that exits after
 * its operation failed (a timeout, say) is no crash, and the peers that still
 * need it find it gone by the waits that need it. */
static inline void plait_op_completed(struct plait_comm *comm)
{
    __atomic_add_fetch(&comm->my_ops[PLAIT_OPS_COMPLETED], 1, __ATOMIC_RELEASE);
}

/* An operation failed half-way: the state of the communicator's connections
 * (FIFOs, boxes, device rings) is unknown, so it refuses further work, as
 * NCCL's do after an error. Records status with the last-error text as the
 * communicator's asynchronous error. */
void plait_comm_mark_failed(struct plait_comm *comm, plait_result_t status);

/* The same with the given message instead of the last error's. */
void plait_comm_mark_failed_msg(struct plait_comm *comm, plait_result_t status, const char *msg);

#endif
