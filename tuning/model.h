/* The cost model: how long a schedule takes on a machine (docs/tuning.md).
 *
 * The model replays the schedule the executor would run, step by step, over
 * the resources each step uses, as a discrete-event simulation:
 *
 *   - every (rank, channel) is a task running its generator's steps in order
 *     (the same generator, chunk and channel split the executor uses), each
 *     step split into pieces of at most one FIFO slot;
 *   - a piece of a sending step passes three stages: the sender's engine
 *     (copying it into the slot: bytes x send cost; 0 for engines that write
 *     straight over the link, the GPU), the wire (alpha of the link class +
 *     bytes x beta, holding the sender's out-port and, between hosts, the NIC
 *     the sender's local index uses), then on the receiver the NIC in-port and
 *     the receiver's engine (copy out: copy_beta; reduce: gamma per byte);
 *   - a resource (an engine, a port, a NIC, a host's cores) serves one piece
 *     at a time: pieces that share it queue, so channels or ranks sharing a
 *     NIC, a PCIe uplink or a socket link each get a share (contention);
 *   - a FIFO of nslots slots per connection and channel: a sender waits for
 *     credit (the receiver's engine finishing piece k - nslots);
 *   - each step costs step_overhead of the engine, each call call_overhead;
 *   - more ranks than cores on a host (CPU engines): engine work of a host's
 *     ranks runs on a pool of `cores` servers, and every time a rank had to
 *     wait for data or credit it pays `handoff` (the scheduler hands the core
 *     to another rank and back) before its engine runs again;
 *   - the small-message protocol on the CPU (plait's small-message path, one
 *     host) is not a schedule: one exchange with its own alpha and per-byte
 *     cost (ll_alpha, ll_beta, ll_call), modelled in closed form, with the
 *     hand-off per rank beyond the cores;
 *   - LL on GPU engines (NCCL's LL) is the call's algorithm replayed as above
 *     with LL's costs: each GPU link's alpha scaled by ll_alpha.gpu /
 *     alpha.nvlink (0.6 us NVLink, 1.0 us PCIe, 2.5 us network by default),
 *     every per-byte cost doubled (8-byte lines of 4 bytes of data and a
 *     flag), the kernel's copy/reduce at least ll_beta.gpu per byte,
 *     ll_call.gpu per call; up to ll_max_bytes (count x esize) per rank.
 *
 * Every resource is owned by one host and reserved only by that host's
 * ranks, in time order (ties broken by local index, then channel), so a
 * machine whose hosts are identical is symmetric under rotation by whole
 * hosts. The reduced replay uses that: it runs only the ranks of host 0 (one
 * representative per symmetry class, the local index), and reads what a rank
 * of another host would have sent, or consumed, at its step from the rank of
 * host 0 with the same local index at the same step, its peer rotated with it.
 * It gives the same times as the full replay when the schedule is invariant
 * under that rotation (ring, hier, bruck, pat, pairwise;
 * a test checks equality up to 64 nodes) and is what makes 512 nodes of 8
 * GPUs cost seconds. Algorithms that are not invariant (trees, whose root is
 * special) fall back to the full replay: plait_model_time says which it ran.
 *
 * Large counts: a schedule is periodic in its chunk iterations, so when a call
 * needs more than PLAIT_MODEL_MAX_ITERS iterations per channel the model
 * replays two shorter counts (k and 2k iterations) and extrapolates linearly;
 * the cost of a prediction is therefore bounded whatever the size (8 GiB
 * included).
 *
 * No global state; every function is thread-safe on distinct outputs. The
 * model is a pure function of its inputs: every rank that builds the same
 * machine and asks about the same call gets the same bits (the tuner relies on
 * it: every rank must choose the same algorithm). */
#ifndef PLAIT_MODEL_H
#define PLAIT_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "plait.h"
#include "algorithms/schedule.h"

/* The small-message path's limits (core/fastpath.c runs it, the model times
 * it): at most this many ranks, this many bytes per rank pair. */
#define PLAIT_FAST_MAX_RANKS 8
#define PLAIT_FAST_MAX_BYTES 4096
/* Over connections (between hosts): what one message per peer carries at most. */
#define PLAIT_FAST_MSG_MAX_BYTES 65536

/* Link classes, each with its own alpha and beta. */
enum plait_model_link {
    PLAIT_MLINK_INPROC = 0, /* threads of one process: heap FIFOs */
    PLAIT_MLINK_SHM,        /* processes of one host: shared-memory FIFOs */
    PLAIT_MLINK_TCP,        /* TCP (loopback or Ethernet): "socket" in names and files */
    PLAIT_MLINK_NVLINK,     /* GPU to GPU over NVLink / NVSwitch */
    PLAIT_MLINK_PCIE,       /* GPU to GPU over PCIe (P2P or through the host) */
    PLAIT_MLINK_NET,        /* an RDMA NIC between hosts (InfiniBand / RoCE) */
    PLAIT_MLINK_COUNT
};

/* What executes a rank's copies and reductions. */
enum plait_model_engine {
    PLAIT_MENGINE_CPU = 0, /* one executor thread on a core */
    PLAIT_MENGINE_GPU,     /* a kernel: writes straight over the link */
    PLAIT_MENGINE_COUNT
};

/* Protocols the model (and the tuner) choose between. */
enum plait_model_proto {
    PLAIT_MPROTO_SIMPLE = 0, /* the schedule through FIFO slots */
    PLAIT_MPROTO_LL,         /* CPU engines: the small-message path (one exchange, no schedule); GPU: NCCL's LL */
    PLAIT_MPROTO_COUNT
};

/* The constants table. Times in seconds, per-byte costs in seconds per byte.
 * plait_model_consts_default() fills documented defaults (docs/tuning.md says
 * where each comes from); a constants file (plait-tune --calibrate writes one,
 * PLAIT_TUNE_CONSTANTS loads it) overrides any subset. */
struct plait_model_consts {
    double alpha[PLAIT_MLINK_COUNT];      /* per piece on the wire (latency of one slot hand-over) */
    double beta[PLAIT_MLINK_COUNT];       /* per byte on the wire: 1 / the link's bandwidth, each way */
    double msg[PLAIT_MLINK_COUNT];        /* per piece, what each end's engine spends handing it to the link
                                           * or taking it from it (system calls over TCP; 0: none) */
    double send_beta[PLAIT_MENGINE_COUNT];/* per byte the sender's engine spends putting a piece in a slot */
    double copy_beta[PLAIT_MENGINE_COUNT];/* per byte of a local copy (slot -> buffer, buffer -> buffer) */
    double gamma[PLAIT_MENGINE_COUNT];    /* per byte of a reduction (two inputs, one output) */
    double step_overhead[PLAIT_MENGINE_COUNT]; /* per step (fetching and starting it) */
    double call_overhead[PLAIT_MENGINE_COUNT]; /* per call (validation, op, launch) */
    double handoff;                       /* per wait when a host has more ranks than cores */
    double ll_alpha[PLAIT_MENGINE_COUNT]; /* LL: per peer exchanged with */
    double ll_beta[PLAIT_MENGINE_COUNT];  /* LL: per byte pushed to or read from one peer */
    double ll_call[PLAIT_MENGINE_COUNT];  /* LL: per call */
    /* The memory regime. send_beta, copy_beta and gamma are the rates of data
     * in the caches; a call whose buffers on one host (every rank's input and
     * output) exceed cache_bytes streams the excess from memory, at
     * mem_factor times those costs: the engine costs are scaled by
     * (cache + (footprint - cache) x mem_factor) / footprint. */
    double cache_bytes;                   /* a host's last-level cache, bytes */
    /* Local COPY and REDUCE steps (between a rank's own buffers) run this many
     * times faster than copy_beta / gamma, which are the rates of data
     * another core just wrote into a slot (>= 1; 0 reads as 1). */
    double local_speedup[PLAIT_MENGINE_COUNT];
    double mem_factor[PLAIT_MENGINE_COUNT]; /* >= 1 (1: no difference) */
};

/* Names of the table's keys as a constants file writes them ("alpha.shm",
 * "gamma.cpu", "handoff", ...), for docs and error messages. */
const char *plait_model_link_name(int link);     /* "inproc", "shm", "socket", "nvlink", "pcie", "net" */
const char *plait_model_engine_name(int engine); /* "cpu", "gpu" */
const char *plait_model_proto_name(int proto);   /* "simple", "ll" */

void plait_model_consts_default(struct plait_model_consts *k);

/* Constants file: one "key = value" per line (value in seconds, or per byte
 * for beta/gamma keys; "1.5us", "2ns", "12GB/s" units accepted), '#' comments,
 * blank lines. Keys not in the file keep what *k holds. A malformed line, an
 * unknown key or a value out of range: PLAIT_ERR_INVALID_ARGUMENT with
 * "FILE:LINE: what" as the message; *k is unchanged then. */
plait_result_t plait_model_consts_load(const char *path, struct plait_model_consts *k);
plait_result_t plait_model_consts_parse(const char *text, size_t len, const char *name,
                                        struct plait_model_consts *k);
/* Writes every key (with a comment line per group). */
plait_result_t plait_model_consts_save(const char *path, const struct plait_model_consts *k, const char *comment);
/* A hash of the table's bits and of PLAIT_MODEL_VERSION: ranks compare it at
 * init, so that ranks running different models (another plait build) do not
 * decide differently in silence. Bump the version with any change to what
 * plait_model_time computes. */
#define PLAIT_MODEL_VERSION 2u
uint64_t plait_model_consts_hash(const struct plait_model_consts *k);

/* The machine a call runs on. Built by the tuner from a communicator or by
 * plait_model_machine_from_topo() for a simulated cluster. */
struct plait_model_machine {
    int nranks;
    int nhosts;
    int32_t *host_of;       /* [nranks] dense host index, ranks of a host in local order */
    int32_t *local_of;      /* [nranks] index among its host's ranks */
    int engine;             /* enum plait_model_engine (every rank) */
    int intra_link;         /* enum plait_model_link between ranks of one host */
    int inter_link;         /* ... between hosts */
    int cores_per_host;     /* cores a host's ranks share; 0 or >= ranks per host: no time-slicing */
    int nics_per_host;      /* NICs between hosts; local index j uses NIC j % nics (>= 1) */
    double intra_bw;        /* if > 0: bytes/s of an intra-host port, replacing 1/beta[intra_link] */
    double inter_bw;        /* if > 0: bytes/s of one NIC, replacing 1/beta[inter_link] */
    /* Per channel ring orders handed to the generators (struct
     * plait_sched_args' order/pos, [norder * nranks] each), NULL: rank order.
     * machine_from_topo sets them so that channel c leaves each host through
     * local index c's NIC, as NCCL's rings do. A call with more channels than
     * norder uses channel % norder's order. */
    int32_t *order;
    int32_t *pos;
    int norder;
    int ll_ok;              /* the LL protocol exists for this machine */
    uint64_t ll_max_bytes;  /* LL: the largest bytes per rank pair it takes */
    struct plait_model_consts k;
};

/* nranks ranks, nhosts hosts of nranks/nhosts consecutive ranks each (nhosts
 * must divide nranks), constants *k (NULL: the defaults). Free with
 * plait_model_machine_free(). */
plait_result_t plait_model_machine_uniform(struct plait_model_machine *m, int nranks, int nhosts, int engine,
                                           int intra_link, int inter_link, const struct plait_model_consts *k);

/* `nodes` copies of the host a topology XML describes (tests/fixtures/topo):
 * one rank per GPU (per core when it has no GPU, at most 64), NVLink or PCIe
 * between a host's GPUs at the graph's bandwidth, the graph's NIC count and
 * NIC bandwidth between hosts. */
struct plait_topo;
plait_result_t plait_model_machine_from_topo(struct plait_model_machine *m, const struct plait_topo *topo, int nodes,
                                             const struct plait_model_consts *k);

void plait_model_machine_free(struct plait_model_machine *m);

/* One call, as the executor would run it. */
struct plait_model_call {
    int coll;               /* enum plait_coll */
    uint64_t count;         /* the collective's count (per rank for allgather/reducescatter/alltoall) */
    int esize;              /* bytes per element */
    int root;
    int algo;               /* enum plait_algo_id (not AUTO) */
    int proto;              /* enum plait_model_proto */
    int nchannels;          /* >= 1 */
    uint64_t chunk_bytes;   /* bytes per step per rank-chunk (rounded as enqueue.c does) */
    uint64_t slot_bytes;    /* FIFO slot */
    uint32_t nslots;        /* FIFO depth */
    int radix;              /* k-nomial trees (0: 2) */
};

/* Fills a call with the executor's defaults (2 channels, 512 KiB chunk and
 * FIFO in 4 slots, radix 2) for (coll, count, esize, algo, proto). */
void plait_model_call_init(struct plait_model_call *c, int coll, uint64_t count, int esize, int algo, int proto);

enum plait_model_mode {
    PLAIT_MODEL_AUTO = 0, /* reduced when the algorithm is rotation-invariant and nhosts > 1, else full */
    PLAIT_MODEL_FULL,     /* every rank */
    PLAIT_MODEL_REDUCED   /* host 0's ranks only (PLAIT_ERR_INVALID_ARGUMENT when not invariant) */
};

#define PLAIT_MODEL_MAX_ITERS 8

struct plait_model_result {
    double time_s;          /* the call, from the first rank starting to the last finishing */
    double algbw;           /* bytes/s as nccl-tests computes it */
    double busbw;           /* algbw x nccl-tests' bus factor */
    int mode;               /* the replay that ran (FULL or REDUCED) */
    int extrapolated;       /* 1 when two shorter counts were replayed */
    uint64_t steps;         /* steps replayed */
    uint64_t pieces;        /* pieces replayed */
};

/* Predicts c on m. PLAIT_ERR_INVALID_ARGUMENT (message saying why) when the
 * algorithm does not support the collective on m->nranks ranks, the protocol
 * does not apply (LL on a machine without it or above ll_max_bytes), or the
 * call is malformed; PLAIT_ERR_SYSTEM when memory runs out. */
plait_result_t plait_model_time(const struct plait_model_machine *m, const struct plait_model_call *c, int mode,
                                struct plait_model_result *out);

/* nccl-tests' bytes and bus factor for a collective: what its tables divide
 * by time (algbw) and multiply by (busbw). */
uint64_t plait_model_coll_bytes(int coll, uint64_t count, int esize, int nranks);
double plait_model_bus_factor(int coll, int nranks);

#endif
