/* Logging and the per-thread last-error string. */
#ifndef PLAIT_LOG_H
#define PLAIT_LOG_H

#include <stdarg.h>
#include "plait.h"

enum plait_log_level { PLAIT_LOG_NONE = 0, PLAIT_LOG_WARN = 1, PLAIT_LOG_INFO = 2, PLAIT_LOG_TRACE = 3 };

/* Subsystems, a bit each, selected by PLAIT_DEBUG_SUBSYS (names: INIT, BOOTSTRAP,
 * TRANSPORT, COLL, P2P, GROUP, STREAM, ENV, GRAPH, TUNING, ALL; a leading ^ excludes). */
enum plait_log_subsys {
    PLAIT_SUBSYS_INIT = 1u << 0,
    PLAIT_SUBSYS_BOOTSTRAP = 1u << 1,
    PLAIT_SUBSYS_TRANSPORT = 1u << 2,
    PLAIT_SUBSYS_COLL = 1u << 3,
    PLAIT_SUBSYS_P2P = 1u << 4,
    PLAIT_SUBSYS_GROUP = 1u << 5,
    PLAIT_SUBSYS_STREAM = 1u << 6,
    PLAIT_SUBSYS_ENV = 1u << 7,
    PLAIT_SUBSYS_GRAPH = 1u << 8, /* topology: discovery, paths, channel search */
    PLAIT_SUBSYS_TUNING = 1u << 9, /* the tuner's decision per call (tuning/tuner.c) */
    PLAIT_SUBSYS_ALL = 0xffffffffu
};

/* (Re)reads PLAIT_DEBUG, PLAIT_DEBUG_SUBSYS and PLAIT_DEBUG_FILE. Called once per
 * communicator init; cheap and thread-safe. */
void plait_log_configure(void);

/* Current level, for callers that want to avoid building expensive messages. */
int plait_log_level(void);

/* Whether a message of this level and subsystem would be written: callers
 * that build an expensive message ask first. */
int plait_log_enabled(int level, unsigned subsys);

/* Writes one line "host:pid:tid plait LEVEL [SUBSYS] message" to the log file
 * (stderr by default) when level and subsystem are enabled. */
void plait_log(int level, unsigned subsys, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Writes a WARN line to stderr whatever PLAIT_DEBUG says (and to the log file
 * too when PLAIT_DEBUG_FILE is in use): for the few warnings a user must see
 * even without logging, such as an unauthenticated bootstrap. Callers see to
 * it that such a line is not repeated. Thread-safe. */
void plait_log_always(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#define PLAIT_WARN(subsys, ...) plait_log(PLAIT_LOG_WARN, (subsys), __VA_ARGS__)
#define PLAIT_INFO(subsys, ...) plait_log(PLAIT_LOG_INFO, (subsys), __VA_ARGS__)
#define PLAIT_TRACE(subsys, ...) plait_log(PLAIT_LOG_TRACE, (subsys), __VA_ARGS__)

/* Sets the calling thread's last-error message (what plait_get_last_error
 * returns) and returns `result`, so error paths read
 *     return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "plait_allreduce: recvbuff is NULL");
 * The message is also logged at WARN under `subsys`-less "ERROR" when logging is on. */
plait_result_t plait_error(plait_result_t result, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The same without the WARN line: for failures the caller expects and acts
 * on (the cost model's "no reduced replay here", which falls back). */
plait_result_t plait_error_quiet(plait_result_t result, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Prepends "context: " to the calling thread's last-error message. Returns result. */
plait_result_t plait_error_context(plait_result_t result, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* The calling thread's last-error message ("" if none) and a way to clear it. */
const char *plait_last_error_get(void);
void plait_last_error_clear(void);

#endif
