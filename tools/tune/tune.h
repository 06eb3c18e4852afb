/* plait-tune's private header: the command line, the helpers its modes share
 * (tools/tune/common.c) and the modes (calibrate.c, explain.c, simulate.c;
 * main.c parses the command line and runs one). docs/tuning.md. */
#ifndef PLAIT_TOOLS_TUNE_H
#define PLAIT_TOOLS_TUNE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "algorithms/algorithms.h"
#include "tuning/model.h"
#include "tuning/tuner.h"

#define EXIT_USAGE 2
#define DEFAULT_CONSTANTS_FILE "plait-tune-constants.txt"
#define ESIZE 4 /* float, the perf programs' default type */

enum mode { MODE_NONE = 0, MODE_CALIBRATE, MODE_EXPLAIN, MODE_SIMULATE, MODE_LIST_ALGOS };

struct tune_args {
    int mode;
    /* --calibrate */
    const char *out;
    bool is_quick;
    bool is_netns;                   /* the socket link across two network namespaces (netns.c) */
    /* --explain / --simulate */
    const char *constants;
    const char *topo_file;
    int coll;                        /* --explain: one collective */
    bool colls[PLAIT_COLL_COUNT];    /* --simulate: the set */
    bool has_colls;
    int ranks;
    bool has_ranks;
    int nodes;
    bool has_nodes;
    int link;                        /* PLAIT_MLINK_SHM, _INPROC, _TCP */
    bool has_link;
    int channels;                    /* 0: the default */
    uint64_t from, to, size;
    bool has_from, has_to, has_size;
    int step;
    bool has_step;
    bool is_tsv;
    int max_full_ranks;
    int full_budget_s;               /* --simulate: seconds a full replay above max_full_ranks may take */
};

/* The modes; each returns the exit status. */
int tune_calibrate(const struct tune_args *a);
int tune_explain(const struct tune_args *a);
int tune_simulate(const struct tune_args *a);

/* One message on stderr ("plait-tune: ..."); each returns its exit status.
 * tune_usage_error: a usage error (2) with a hint at --help; tune_failure: a
 * failure (1); tune_bad_input: a file or value named on the command line that
 * cannot be used (2, without the hint). */
int tune_usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
int tune_failure(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
int tune_bad_input(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* "8 KiB", "1 GiB": b in the largest unit that divides it; returns buf. */
const char *tune_human_size(uint64_t b, char *buf, size_t len);
/* CLOCK_MONOTONIC in seconds. */
double tune_now_s(void);
/* The median of v[0..n) (sorts v); NAN when n <= 0. */
double tune_median(double *v, int n);

/* The constants: path (--constants), else PLAIT_TUNE_CONSTANTS, else the
 * defaults; *origin says which. 0, or the exit status of a bad file. */
int tune_load_constants(const char *path, struct plait_model_consts *k, const char **origin);
/* Whether coll's count is per rank (allgather, reducescatter, alltoall,
 * gather, scatter). */
bool tune_is_per_rank(int coll);
/* Bytes the tuner counts for a call of nccl-tests size `size` (-b). */
uint64_t tune_tuner_bytes(int coll, uint64_t size, int nranks);
/* What a call may use, as a communicator with the environment's settings
 * would allow it; channels 0: the settings' PLAIT_NCHANNELS. 0 or exit status. */
int tune_space(int coll, int nranks, int channels, struct plait_tune_space *sp);

/* The machine --explain and --simulate model: --topo x --nodes, else this
 * host with --ranks over --link; d->text describes it. 0 or exit status. */
struct tune_machine_desc {
    char text[256];
};
int tune_build_machine(const struct tune_args *a, const struct plait_model_consts *k, struct plait_model_machine *m,
                       struct tune_machine_desc *d);

/* --calibrate --netns (tools/tune/netns.c): two network namespaces joined by
 * a veth, A = TUNE_NETNS_PREFIX<pid>a at TUNE_NETNS_SUBNET.1/30 and B = ...b at
 * .2/30, each named after its veth end (MTU the default), with loopback up.
 * Their names are removed once they are open: fd[] alone holds them, and they
 * (and the veth) vanish when this process and its children are gone. */
#define TUNE_NETNS_PREFIX "plcal"
#define TUNE_NETNS_SUBNET "10.201.0"

struct tune_netns {
    bool is_on;
    char name[2][32];     /* the namespaces and their veth ends */
    char addr[2][16];     /* their addresses */
    int fd[2];            /* the namespaces (setns(fd, CLONE_NEWNET)); -1: none */
    char ifname_env[48];  /* "PLAIT_SOCKET_IFNAME=<prefix><pid>": both veth ends */
};

/* Creates them (root only): 0, or -1 with the reason in why (nothing left). */
int tune_netns_create(struct tune_netns *n, char *why, size_t whylen);
/* Lets them go (closes fd[]); safe to call twice, and after a failed create. */
void tune_netns_destroy(struct tune_netns *n);

#endif
