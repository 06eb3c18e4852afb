/* Running a built tool from a Criterion test (test_topo_tool.c,
 * test_tune_tool.c): argv, a deadline, stdout and stderr captured. */
#ifndef PLAIT_TESTS_TOOL_RUN_H
#define PLAIT_TESTS_TOOL_RUN_H

#include <stdbool.h>

struct run {
    int status;     /* exit status, or 128 + signal */
    bool timed_out; /* killed at the deadline (the test has failed then) */
    double secs;    /* wall time */
    char cmd[1024]; /* the command line, for failure messages */
    char *out, *err;
};

/* The executable an environment variable names (set by tests/meson.build);
 * fails the test when it is unset or not executable. */
const char *tool_run_path(const char *envvar, const char *name);

/* Runs `tool` with `args` (NULL-terminated, without argv[0]; `name` stands
 * for the path in messages) and kills it, with every process it started,
 * after timeout_s; a tool still running then fails the test. Output goes to
 * files rather than pipes, so that a chatty tool cannot block on a full pipe
 * while the test waits. The tool dies with the test. */
struct run tool_run(const char *tool, const char *name, double timeout_s, const char *const *args);

void run_free(struct run *r);

/* Removes a test's scratch directory: its files, then itself (no
 * subdirectories expected). */
void tool_run_rmdir(const char *dir);

/* The rest of a file from its start, NUL-terminated (malloc'd). */
#include <stdio.h>
char *tool_run_read_all(FILE *f);

#endif
