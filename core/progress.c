/* The out-of-line parts of core/progress.h: the sleep of a wait, and marking
 * a communicator failed. */
#include "core/progress.h"

#include <errno.h>
#include <time.h>

#include "base/log.h"

void plait_nap_ns(uint64_t ns)
{
    struct timespec ts = {(time_t)(ns / 1000000000u), (long)(ns % 1000000000u)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

void plait_comm_mark_failed_msg(struct plait_comm *comm, plait_result_t status, const char *msg)
{
    plait_comm_set_async_error(comm, status, msg);
    /* Release: the asynchronous error above is set before a thread that
     * acquires in_error reads it. */
    __atomic_store_n(&comm->in_error, 1, __ATOMIC_RELEASE);
}

void plait_comm_mark_failed(struct plait_comm *comm, plait_result_t status)
{
    plait_comm_mark_failed_msg(comm, status, plait_last_error_get());
}
