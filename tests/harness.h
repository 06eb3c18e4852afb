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

/* ---------------------------------------------------------------- processes that make their own communicator
 *
 * For tests that control init themselves (configs, environment per rank, faults):
 * the parent draws one unique id and forks nranks children; each runs fn with its
 * rank and the id and exits with 0 when fn returns 0. The parent can wait for the
 * children to say they are ready (a pipe), kill one, read what they wrote in
 * memory shared with it, and reap them all with a deadline (those still running
 * then are killed). Children die with the parent (PR_SET_PDEATHSIG). */
#include <sys/types.h>

struct mr_child {
    int rank, nranks;
    plait_unique_id_t id; /* a fresh id shared by every rank of the run */
    char *msg;            /* the rank's report (shared with the parent), shown on failure */
    size_t msglen;
    void *shared;         /* shared_bytes of zeroed memory shared by every rank and the parent */
    int ready_fd;         /* write end of the readiness pipe (see mr_child_ready) */
};
typedef int (*mr_child_fn)(struct mr_child *c, void *arg);

struct mr_procs;

/* Forks the ranks. Returns NULL (and a reason in msg) when it cannot. Flags:
 * MR_PROCS_NO_ID: draw no unique id (the children make their own; c->id is
 * zeroed), so that no root thread waits in the parent for ranks that never come. */
#define MR_PROCS_NO_ID 1u
struct mr_procs *mr_procs_start(int nranks, mr_child_fn fn, void *arg, size_t shared_bytes, unsigned flags, char *msg,
                                size_t msglen);
/* Child side: tells the parent this rank is ready (one byte on the pipe). */
void mr_child_ready(struct mr_child *c);
/* Child side: the rank's communicator over c->id, or NULL with "init: why"
 * in c->msg. */
plait_comm_t mr_child_init(struct mr_child *c);
/* Parent side: waits until `count` readiness bytes arrived; 0 on success, -1 on
 * deadline or when every child has gone. */
int mr_procs_wait_ready(struct mr_procs *p, int count, double timeout_s);
void *mr_procs_shared(struct mr_procs *p);
pid_t mr_procs_pid(const struct mr_procs *p, int rank);
/* Sends sig to a rank; a rank killed this way by SIGKILL is not counted as failed by join. */
int mr_procs_kill(struct mr_procs *p, int rank, int sig);
/* Reaps every rank within timeout_s (killing the rest); returns the number of
 * ranks that failed (exit != 0, a signal not sent by mr_procs_kill, overran). */
int mr_procs_join(struct mr_procs *p, double timeout_s, char *msg, size_t msglen);
/* After join: the rank's wait status, and its report. */
int mr_procs_status(const struct mr_procs *p, int rank);
const char *mr_procs_msg(const struct mr_procs *p, int rank);
/* Kills and reaps what is left, frees. NULL is a no-op. */
void mr_procs_free(struct mr_procs *p);

/* Like mr_run, but fn owns the communicator: it must destroy (or abort) it. */
int mr_run_owned(enum mr_mode mode, int nranks, mr_fn fn, void *arg, double timeout_s, char *msg, size_t msglen);

/* ---------------------------------------------------------------- leak checks */

/* Open file descriptors and threads of the calling process (/proc/self). */
int mr_count_fds(void);
int mr_count_threads(void);
/* Polls until the thread count is at most `want` or the deadline; returns the last count. */
int mr_settle_threads(int want, double timeout_s);

/* The plait-* entries of /dev/shm at one moment. */
struct mr_shm_set {
    int n;
    char (*names)[256];
};
void mr_shm_snapshot(struct mr_shm_set *s);
void mr_shm_set_free(struct mr_shm_set *s);
/* Counts the plait-* entries now in /dev/shm that were not in `before` and were
 * made by this process or by one it forked through the harness (or announced
 * with mr_note_child), so that other test runs on the machine do not count; the
 * names go to msg. */
int mr_shm_new_entries(const struct mr_shm_set *before, char *msg, size_t msglen);
/* Records a pid forked by a test itself, for mr_shm_new_entries. */
void mr_note_child(pid_t pid);

/* Monotonic seconds (comparable between processes of one machine). */
double mr_now(void);
/* Sleeps ms milliseconds (whatever signals come). */
void mr_sleep_ms(int ms);
/* Whether text contains "rank <r>" not followed by another digit. */
int mr_names_rank(const char *text, int r);

#endif
