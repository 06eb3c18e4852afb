/* Multi-rank test harness: runs a function on N ranks as threads of this process
 * (plait_comm_init_all), as forked processes over shared memory, or as forked
 * processes over TCP (PLAIT_TRANSPORT=socket). Every wait has a deadline; ranks
 * that overrun it are killed and the test fails. Public API only. */
#ifndef PLAIT_TEST_HARNESS_H
#define PLAIT_TEST_HARNESS_H

#include <stddef.h>
#include "plait.h"

enum mr_mode { MR_THREADS = 0, MR_SHM = 1, MR_SOCKET = 2 };

/* Returns 0 when the rank passed; writes a reason into msg otherwise. */
typedef int (*mr_fn)(plait_comm_t comm, int rank, int nranks, void *arg, char *msg, size_t msglen);

/* Runs fn on nranks ranks in `mode`. Returns the number of ranks that failed
 * (killed, timed out, init failed or fn != 0); the first reasons go to msg. */
int mr_run(enum mr_mode mode, int nranks, mr_fn fn, void *arg, double timeout_s, char *msg, size_t msglen);

const char *mr_mode_name(enum mr_mode mode);

/* Checks the /dev/shm entries named plait-* of this process family. */
int mr_count_shm_leftovers(void);

#endif
