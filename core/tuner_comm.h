/* The communicator's tuner (core/tuner_comm.c): set up at init, asked once
 * per call by the planning stage. */
#ifndef PLAIT_TUNER_COMM_H
#define PLAIT_TUNER_COMM_H

#include <stdint.h>
#include "plait.h"
#include "tuning/tuner.h"

struct plait_comm;
/* At init, before the settings are exchanged: allocates comm->tuner, loads
 * PLAIT_TUNE_CONSTANTS and PLAIT_TUNE_FILE and puts their hashes in comm->set
 * (agreed settings: tune_consts_hash, tune_file_hash), so that ranks with
 * different files fail init naming the variable. A file that cannot be read
 * or is malformed: its error, "PLAIT_TUNE_FILE=path:LINE: what" (or
 * PLAIT_TUNE_CONSTANTS=...). comm->tuner is freed by plait_tuner_free either
 * way. */
plait_result_t plait_tuner_prepare(struct plait_comm *comm);

/* At init, once settings are agreed and transports are connected: builds the
 * communicator's machine from what every rank knows alike (node map,
 * transports, cores, the small-message boxes) with the constants and rules
 * plait_tuner_prepare loaded (it runs it first when it has not run). */
plait_result_t plait_tuner_init(struct plait_comm *comm);
void plait_tuner_free(struct plait_comm *comm);

/* The choice for a call: forced (PLAIT_ALGO / PLAIT_PROTO), else the tuning
 * file, else the cached or newly modelled choice for (coll, bucket); at
 * least PLAIT_MIN_CTAS / minCTAs channels and at most comm->nchannels.
 * PLAIT_MPROTO_LL (the small-message path, the tuning file's "ll") only where
 * that path exists for the call (a host call: core/fastpath.c). Logs the decision at INFO under
 * PLAIT_DEBUG_SUBSYS=TUNING. Fails (PLAIT_ERR_SYSTEM, nothing cached) only
 * when the model runs out of memory: another rank may have decided by the
 * model, so this one must not guess. Collectives the model does not cover
 * take the default rule (plait_algo_select). */
plait_result_t plait_tuner_choose(struct plait_comm *comm, int coll, uint64_t bytes, int esize,
                                  struct plait_tune_choice *out);

#endif
