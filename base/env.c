/* The table of environment variables and the one parser of their numeric values. */
#define _GNU_SOURCE
#include "base/env.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "base/log.h"

const struct plait_env_var plait_env_table[] = {
    {"PLAIT_DEBUG", "NCCL_DEBUG", "",
     "Log level: WARN, INFO or TRACE (unset: errors only in plait_get_last_error). Whatever the level, a process that "
     "joins an unauthenticated bootstrap (no PLAIT_SECRET) says so once on stderr."},
    {"PLAIT_DEBUG_SUBSYS", "NCCL_DEBUG_SUBSYS", "INIT,BOOTSTRAP,TRANSPORT,ENV,GRAPH",
     "Comma-separated subsystems logged at INFO/TRACE: INIT, BOOTSTRAP, TRANSPORT (or NET), COLL, P2P, GROUP, "
     "STREAM, ENV, GRAPH (topology), TUNING (the tuner's choice for every call: algorithm, protocol, channels, "
     "chunk, predicted time and why), ALL; a leading ^ excludes."},
    {"PLAIT_DEBUG_FILE", "NCCL_DEBUG_FILE", "",
     "Append the log to this file instead of stderr; %h = host name, %p = pid. A symbolic link's target, a FIFO, a "
     "character device or /dev/stdout is written as such; one that cannot be opened (a FIFO nobody reads) gives one "
     "WARN on stderr, which then takes the log. Opened once and kept open across inits (a FIFO's reader sees one "
     "stream), reopened when the name changes or another file takes its place (a rotated log)."},
    {"PLAIT_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "",
     "Interfaces for bootstrap and socket traffic and the Socket net provider's devices: prefixes separated by "
     "commas, ^ to exclude, = for exact names (as NCCL parses them). Default: NCCL's order (ib, then anything but "
     "docker, lo and virbr, then docker, lo, virbr) for the root's address and the provider's devices; every other "
     "socket uses the local address its rank reaches the root (bootstrap) or its ring neighbour (data) from."},
    {"PLAIT_SOCKET_NTHREADS", "NCCL_SOCKET_NTHREADS", "auto",
     "The Socket net provider (transports/net/socket.c): helper threads per connection that move large messages "
     "(0..16; 0 = none: every message goes on the control socket, moved by the caller's thread). auto: 2 threads "
     "with 8 sockets each on AWS ENA NICs, 4 with 1 on Google gVNIC (NCCL's figures), else 2 with 1 when the process "
     "may run on 4 CPUs or more, none below."},
    {"PLAIT_NSOCKS_PERTHREAD", "NCCL_NSOCKS_PERTHREAD", "auto",
     "The Socket net provider: data sockets per helper thread (0..64; 0 = no data sockets). Threads x sockets is "
     "capped at 64 (NCCL's limit; over it, sockets per thread become 64 / threads, with one WARN). A message of at "
     "most 64 KiB goes whole on the control socket (one write, one read); a larger one in pieces of at least 64 KiB "
     "over the data sockets. auto: see PLAIT_SOCKET_NTHREADS."},
    {"PLAIT_COMM_ID", "NCCL_COMM_ID", "",
     "host:port of the bootstrap root. When set, plait_get_unique_id() makes no root; rank 0 starts it at init."},
    {"PLAIT_TIMEOUT", NULL, "120", "Deadline in seconds for setup waits (init, split, connection set-up)."},
    {"PLAIT_COLL_TIMEOUT", NULL, "600",
     "Deadline in seconds for one collective or group; 0 = none. A healthy rank may be late (checkpoint I/O)."},
    {"PLAIT_TRANSPORT", NULL, "auto",
     "auto: shared memory between processes of one host, in-process memory between threads of one process, the net "
     "transport (PLAIT_NET_PROVIDER: TCP) between hosts; socket: the net transport between every pair of distinct "
     "ranks."},
    {"PLAIT_NET_PROVIDER", NULL, "socket",
     "The net provider of the net transport, which joins every pair of ranks on different hosts (and every pair "
     "under PLAIT_TRANSPORT=socket): socket, TCP (transports/net/socket.c). Any other value is an error. The same on "
     "every rank."},
    {"PLAIT_RUNTIME_CONNECT", "NCCL_RUNTIME_CONNECT", "1",
     "1: a communicator connects its ring neighbours at init and every other peer (other algorithms' peers, "
     "point-to-point peers) when a call first needs it; 0: every connection at init. The same on every rank."},
    {"PLAIT_HOSTID", NULL, "",
     "Host identity used to group ranks into nodes. Default: host name plus network namespace, so namespaces act as "
     "separate hosts."},
    {"PLAIT_NCHANNELS", NULL, "2",
     "Channels a communicator connects (1..32): the most a collective uses; the tuner picks per call (docs/tuning.md)."},
    {"PLAIT_NSLOTS", NULL, "4", "FIFO depth: slots per connection and direction (2..64)."},
    {"PLAIT_BUFFSIZE", "NCCL_BUFFSIZE", "524288",
     "Bytes of FIFO per connection and direction; a slot is BUFFSIZE/NSLOTS (rounded down to 64 bytes)."},
    {"PLAIT_CHUNK_SIZE", NULL, "524288", "Bytes per ring step per rank-chunk (pipelined through the slots)."},
    {"PLAIT_SPIN_US", NULL, "auto",
     "Microseconds a waiting rank polls before yielding the core; auto = 20 when ranks on this host fit the cores, "
     "else 0 (yield at once)."},
    {"PLAIT_ALGO", "NCCL_ALGO", "",
     "Force an algorithm: one name for every collective (\"ring\"), or \"allreduce:ring;allgather:ring\". An unknown "
     "or unsupported name fails init with the list of valid ones; NCCL_ALGO's names that plait lacks (NVLS, "
     "CollnetDirect, ...) only WARN. Algorithms: ring; tree (broadcast, reduce: k-nomial; allreduce: double binary "
     "tree); recursive (allreduce, allgather, reducescatter); bruck (allgather, alltoall); pat (allgather, "
     "reducescatter); hier (allreduce, allgather, reducescatter: two levels by host); oneshot, twoshot (allreduce, up to "
     "32 ranks); pairwise (alltoall); linear (gather, scatter); dissemination (barrier). A forced algorithm runs on "
     "every channel with PLAIT_CHUNK_SIZE. Unset: the tuner chooses by the cost model (docs/algorithms.md, "
     "\"Selection\"), or by PLAIT_TUNE_FILE's rules."},
    {"PLAIT_PROTO", "NCCL_PROTO", "auto",
     "auto: collectives between 2..8 ranks (allreduce, reducescatter, allgather, alltoall, barrier; "
     "broadcast and reduce when every host has a core per rank) may take the small-message path where the "
     "tuner's model predicts it faster than the FIFO path: within one host (shared memory) up to 4 KiB per rank "
     "pair, data and flag pushed into each peer's cache line (plait's LL); with a net connection between some "
     "pair, up to 64 KiB per rank pair, one message per peer on connections of their own (docs/performance.md). "
     "The FIFO path (NCCL's Simple) carries everything else. Simple: the FIFO path only. NCCL_PROTO is read when PLAIT_PROTO is unset: a list that keeps Simple and not LL (\"Simple\", \"^LL\", "
     "\"^LL,LL128\") means Simple; \"LL,Simple\" (and \"^LL128\") means auto; what plait cannot do (LL128, LL for every "
     "size, a per-collective form) gives one WARN and means auto."},
    {"PLAIT_TUNE_FILE", NULL, "",
     "Tuning rules that override the cost model: lines \"collective size-range algorithm [protocol]\" (\"allreduce "
     "0-4K oneshot\", \"allgather 1M-inf ring simple\", \"broadcast * tree\"; sizes in bytes per rank as "
     "plait_algo_select counts them, K/M/G suffixes, lo <= bytes < hi; protocol simple or ll), # comments; the "
     "first matching line wins, a call no line matches is the model's. A file that cannot be read, is malformed or "
     "holds no rule fails init with the file, line and reason; every rank must load the same rules (init compares them). "
     "PLAIT_ALGO wins over it. NCCL has no equivalent (NCCL_TUNER_PLUGIN loads code, not rules)."},
    {"PLAIT_TUNE_CONSTANTS", NULL, "",
     "The cost model's constants (\"key = value\" lines as plait-tune --calibrate writes them: alpha.shm, "
     "gamma.cpu, handoff, ...); keys not in the file keep their defaults (docs/tuning.md). A malformed file fails "
     "init with the file, line and reason; every rank must load the same values (init compares them)."},
    {"PLAIT_TREE_RADIX", NULL, "2", "k of the k-nomial tree algorithms (2 = binomial), 2..16."},
    {"PLAIT_MAX_CTAS", "NCCL_MAX_CTAS", "",
     "Upper bound on channels (CTAs on a GPU), like the config's max_ctas (which wins): 0..64 as NCCL accepts; plait "
     "runs at most 32 channels. On a GPU it caps the CTAs of each kernel launch (a group of collectives over the cap "
     "is split into several launches; sends/receives of one group launch whole, over the cap if need be, with one "
     "INFO line). 0 (set explicitly): device collectives take no CTAs of their own where copy engines can serve "
     "(all-gather, broadcast: PLAIT_CE_COLL), one CTA otherwise; host collectives keep PLAIT_NCHANNELS. Every rank "
     "must use the same value."},
    {"PLAIT_MIN_CTAS", "NCCL_MIN_CTAS", "",
     "Lower bound on channels (CTAs on a GPU), like the config's min_ctas: 0..64; plait runs at most 32 channels. "
     "Also the fewest channels the tuner gives a call."},
    {"PLAIT_RANK", NULL, "", "plait_comm_init_from_env: this process's rank; looked for before the launchers' variables."},
    {"PLAIT_NRANKS", NULL, "", "plait_comm_init_from_env: number of ranks."},
    {"PLAIT_TOPO_FILE", NULL, "",
     "Load the machine's topology from this XML file (plait's format or NCCL's, docs/topology.md) instead of "
     "discovering it. A file that cannot be read or parsed fails init with the file, line and reason."},
    {"PLAIT_TOPO_DUMP_FILE", "NCCL_TOPO_DUMP_FILE", "",
     "Write the topology (plait's XML format) to this file, once per process, from a communicator's rank 0. A "
     "regular file is replaced whole (a temporary in its own directory renamed over it; its mode is kept), a symbolic "
     "link's target is written and the link kept; /dev/stdout, a FIFO or a character device is written directly (a "
     "FIFO nobody reads is an error at once). A failure is one WARN; init goes on."},
    {"PLAIT_SECRET", NULL, "",
     "Shared secret for the bootstrap's challenge-response (any string), used by plait_comm_init_from_env and by "
     "plait_get_unique_id under PLAIT_COMM_ID. Without it (or PLAIT_SECRET_FILE) such a bootstrap is "
     "unauthenticated and every process says so once on stderr, whatever PLAIT_DEBUG. (Ids from plait_get_unique_id without PLAIT_COMM_ID carry a random "
     "secret.)"},
    {"PLAIT_SECRET_FILE", NULL, "", "A file whose contents are the secret (first 4096 bytes)."},
    {"PLAIT_PORT_OFFSET", NULL, "1",
     "plait_comm_init_from_env under torchrun/MASTER_PORT: plait's root listens on MASTER_PORT + this offset, not on "
     "the TCPStore's port."},
    {"PLAIT_CMA", NULL, "auto",
     "Single-copy transfers between ranks of one host: a large step's sender publishes where its bytes are and the "
     "receiver reads them itself (process_vm_readv between processes, memcpy between threads of one process) "
     "instead of both copying through the FIFO. auto: between threads always; between processes when the probe at "
     "init finds that every rank can read every same-host peer's memory (ptrace permission: Yama, seccomp and "
     "containers may deny it) and PLAIT_CMA_MIN_BYTES is set; 0: off; 1: required between processes (init fails, "
     "saying why, when the probe fails) and used."},
    {"PLAIT_CMA_MIN_BYTES", NULL, "",
     "Smallest step (bytes, K/M suffixes) a sending rank publishes for single copy, to threads and processes alike; "
     "smaller steps go through the FIFO. Unset: 32K between threads; between processes none under PLAIT_CMA=auto "
     "(process_vm_readv was slower than the FIFO at every size measured, docs/performance.md) and 64K under "
     "PLAIT_CMA=1."},
    {"PLAIT_CUDA", NULL, "auto",
     "The CUDA backend. auto: load the CUDA driver (libcuda.so.1, with dlopen) when a communicator is set up or a "
     "buffer is classified; without a driver or device, one INFO line says \"no CUDA device (why)\" and host buffers "
     "use the CPU backend. 1: the same, but that line is a WARN. 0: off (no driver loaded; every buffer is host "
     "memory). Another value fails init."},
    {"PLAIT_CUDA_LIBRARY", NULL, "libcuda.so.1",
     "The CUDA driver library to dlopen. Tests point it at the CUDA test double (libplait_cuda_double.so, "
     "tests/cuda_double.c), which plait then reports as a double, not a GPU."},
    {"PLAIT_KB_EMU_THREADS", NULL, "1",
     "Tests only: threads per CTA when the CUDA test double runs the kernel's host emulation (1..64), so that the leader/worker split, the CTA barriers and per-thread LL polling of the kernel body run on a "
     "CPU. No effect on a GPU."},
    {"PLAIT_CE_COLL", NULL, "auto",
     "Copy-engine (SM-free) all-gather and broadcast between ranks of one host on device buffers that lie in memory "
     "windows (plait_comm_window_register, ncclCommWindowRegister): cudaMemcpyAsync into (all-gather) or from "
     "(broadcast) the peers' windows, ordered by stream memory operations, no kernel. 1: used whenever every rank is "
     "on this host and the buffers lie in windows (else the kernel runs, with one INFO line saying why); 0: never; "
     "auto: as 1 when the communicator may use no CTA (PLAIT_MAX_CTAS=0 or the config's max_ctas = 0), else never. "
     "Every rank must set the same value (window registration compares them)."},
    {"PLAIT_CUDA_SC_MIN_BYTES", NULL, "65536",
     "Single copy in the CUDA kernel: a device step of at least this many bytes (K/M/G suffixes) whose sent bytes "
     "are the sender's own unchanged buffer bytes inside a memory window (plait_comm_window_register) goes as one "
     "descriptor {window, offset, length}; the receiver's kernel reads them from its mapping of the sender's window "
     "(same device, peer access or CUDA IPC). 0: off. Ranks may differ: a receiver reads whatever arrives."},
    {"PLAIT_PERF_DEVICE", NULL, "0",
     "The perf tools (perf/*_perf), not the library: 1 puts the buffers in CUDA device memory (device 0, shared by "
     "every rank), as their -D 1 does; 0: host memory. nccl-tests always uses device memory."},
    /* NCCL's variables for features plait does not have (yet): read so that
     * scripts written for NCCL keep running, with one WARN where the setting is
     * ignored (see plait_settings_load). */
    {"NCCL_TOPO_FILE", NULL, "",
     "NCCL's topology XML (or plait's), used instead of discovery when PLAIT_TOPO_FILE is unset. As in NCCL, a "
     "file that cannot be read or parsed gives one WARN (with the file, line and reason) and the machine is "
     "discovered instead."},
    {"NCCL_IB_HCA", NULL, "",
     "HCAs for NCCL's InfiniBand transport. plait has no InfiniBand transport yet (TCP between hosts): one WARN, "
     "ignored."},
    {"NCCL_NET", NULL, "",
     "NCCL's network by name. \"Socket\" is what plait uses between hosts (TCP); any other name (IB, a plugin) gives "
     "one WARN and is ignored."},
    {"NCCL_P2P_DISABLE", NULL, "",
     "Disables NCCL's GPU peer-to-peer transport (CUDA IPC, NVLink). Accepted, no effect: plait's CUDA backend uses "
     "peer access and CUDA IPC between the devices of one host wherever they allow it, and this does not turn it off."},
    {"NCCL_SHM_DISABLE", NULL, "0",
     "1: ranks in different processes of one host talk over TCP instead of shared memory, as PLAIT_TRANSPORT=socket "
     "(which also covers threads of one process). PLAIT_TRANSPORT wins when set."},
    /* Launchers' own variables, read (never written) by plait_comm_init_from_env. */
    {"RANK", NULL, "", "torchrun: this process's rank (with WORLD_SIZE)."},
    {"WORLD_SIZE", NULL, "", "torchrun: number of ranks."},
    {"MASTER_ADDR", NULL, "", "torchrun (or any launcher without PLAIT_COMM_ID): host of rank 0."},
    {"MASTER_PORT", NULL, "", "torchrun: the TCPStore's port; plait's root uses MASTER_PORT + PLAIT_PORT_OFFSET."},
    {"OMPI_COMM_WORLD_RANK", NULL, "", "Open MPI: rank (with OMPI_COMM_WORLD_SIZE; address from PLAIT_COMM_ID or MASTER_ADDR)."},
    {"OMPI_COMM_WORLD_SIZE", NULL, "", "Open MPI: number of ranks."},
    {"SLURM_PROCID", NULL, "", "Slurm: rank (with SLURM_NTASKS; address from PLAIT_COMM_ID or MASTER_ADDR)."},
    {"SLURM_NTASKS", NULL, "", "Slurm: number of ranks."},
    {"PMI_RANK", NULL, "", "PMI (MPICH's Hydra): rank (with PMI_SIZE)."},
    {"PMI_SIZE", NULL, "", "PMI: number of ranks."},
};
const size_t plait_env_table_len = sizeof(plait_env_table) / sizeof(plait_env_table[0]);

const char *plait_env_get(const char *plait_name)
{
    const char *v = getenv(plait_name);
    if (v)
        return v;
    for (size_t i = 0; i < plait_env_table_len; i++)
        if (strcmp(plait_env_table[i].name, plait_name) == 0 && plait_env_table[i].nccl_name)
            return getenv(plait_env_table[i].nccl_name);
    return NULL;
}

const struct plait_env_number plait_env_numbers[] = {
    {"PLAIT_TIMEOUT", PLAIT_ENV_SECONDS, 0, 0, 1e9},
    {"PLAIT_COLL_TIMEOUT", PLAIT_ENV_SECONDS, 0, 0, 1e9},
    {"PLAIT_SOCKET_NTHREADS", PLAIT_ENV_INTEGER, 1, 0, 16},
    {"PLAIT_NSOCKS_PERTHREAD", PLAIT_ENV_INTEGER, 1, 0, 64},
    {"PLAIT_NCHANNELS", PLAIT_ENV_INTEGER, 0, 1, 32},
    {"PLAIT_NSLOTS", PLAIT_ENV_INTEGER, 0, 2, 64},
    {"PLAIT_BUFFSIZE", PLAIT_ENV_BYTES, 0, 4096, 1 << 30},
    {"PLAIT_CHUNK_SIZE", PLAIT_ENV_BYTES, 0, 64, 1 << 30},
    {"PLAIT_SPIN_US", PLAIT_ENV_INTEGER, 1, 0, 1000000},
    {"PLAIT_TREE_RADIX", PLAIT_ENV_INTEGER, 0, 2, 16},
    {"PLAIT_MAX_CTAS", PLAIT_ENV_INTEGER, 0, 0, 64},
    {"PLAIT_MIN_CTAS", PLAIT_ENV_INTEGER, 0, 0, 64},
    {"PLAIT_RANK", PLAIT_ENV_INTEGER, 0, 0, (1 << 30) - 1},
    {"PLAIT_NRANKS", PLAIT_ENV_INTEGER, 0, 1, 1 << 30},
    {"PLAIT_PORT_OFFSET", PLAIT_ENV_INTEGER, 0, 0, 65535},
    {"PLAIT_CMA", PLAIT_ENV_INTEGER, 1, 0, 1},
    {"PLAIT_RUNTIME_CONNECT", PLAIT_ENV_INTEGER, 0, 0, 1},
    {"PLAIT_CMA_MIN_BYTES", PLAIT_ENV_BYTES, 0, 0, 1099511627776.0},
    {"PLAIT_CUDA", PLAIT_ENV_INTEGER, 1, 0, 1},
    {"PLAIT_KB_EMU_THREADS", PLAIT_ENV_INTEGER, 0, 1, 64},
    {"PLAIT_CE_COLL", PLAIT_ENV_INTEGER, 1, 0, 1},
    {"PLAIT_CUDA_SC_MIN_BYTES", PLAIT_ENV_BYTES, 0, 0, 1099511627776.0},
    {"PLAIT_PERF_DEVICE", PLAIT_ENV_INTEGER, 0, 0, 1},
    {"NCCL_SHM_DISABLE", PLAIT_ENV_INTEGER, 0, 0, 1},
    {"RANK", PLAIT_ENV_INTEGER, 0, 0, (1 << 30) - 1},
    {"WORLD_SIZE", PLAIT_ENV_INTEGER, 0, 1, 1 << 30},
    {"MASTER_PORT", PLAIT_ENV_INTEGER, 0, 1, 65535},
    {"OMPI_COMM_WORLD_RANK", PLAIT_ENV_INTEGER, 0, 0, (1 << 30) - 1},
    {"OMPI_COMM_WORLD_SIZE", PLAIT_ENV_INTEGER, 0, 1, 1 << 30},
    {"SLURM_PROCID", PLAIT_ENV_INTEGER, 0, 0, (1 << 30) - 1},
    {"SLURM_NTASKS", PLAIT_ENV_INTEGER, 0, 1, 1 << 30},
    {"PMI_RANK", PLAIT_ENV_INTEGER, 0, 0, (1 << 30) - 1},
    {"PMI_SIZE", PLAIT_ENV_INTEGER, 0, 1, 1 << 30},
};
const size_t plait_env_numbers_len = sizeof(plait_env_numbers) / sizeof(plait_env_numbers[0]);

static void format_bound(const struct plait_env_number *spec, double v, char *buf, size_t len)
{
    static const char suffix[] = "GMK";
    if (spec->form == PLAIT_ENV_BYTES && v > 0)
        for (int i = 0; i < 3; i++) {
            const double unit = (double)(1ull << (10 * (3 - i)));
            if (v >= unit && v / unit == (double)(uint64_t)(v / unit)) {
                snprintf(buf, len, "%llu%c", (unsigned long long)(v / unit), suffix[i]);
                return;
            }
        }
    snprintf(buf, len, "%.15g", v);
}

void plait_env_number_range(const struct plait_env_number *spec, char *buf, size_t len)
{
    char lo[32], hi[32];
    format_bound(spec, spec->lo, lo, sizeof(lo));
    format_bound(spec, spec->hi, hi, sizeof(hi));
    snprintf(buf, len, "%s%s..%s", spec->has_auto ? "auto or " : "", lo, hi);
}

int plait_env_number_parse(const struct plait_env_number *spec, const char *text, bool is_nccl_spelling,
                           double *value_out, char *why, size_t why_len)
{
    static const char *const forms[] = {
        [PLAIT_ENV_INTEGER] = "a decimal integer (digits only: no sign, no 0x, no suffix)",
        [PLAIT_ENV_BYTES] = "a size in bytes (decimal digits, then optionally K, M or G: no sign, no 0x)",
        [PLAIT_ENV_SECONDS] = "a number of seconds (decimal digits with an optional fraction: no sign, no 0x, "
                              "no exponent)",
    };
    static const char *const nccl_forms[] = {
        [PLAIT_ENV_INTEGER] = "a decimal integer or 0x and hexadecimal digits (no sign, no suffix)",
        [PLAIT_ENV_BYTES] = "a size in bytes (decimal digits, then optionally K, M or G; or 0x and hexadecimal "
                            "digits, no suffix: no sign)",
        [PLAIT_ENV_SECONDS] = "a number of seconds (decimal digits with an optional fraction: no sign, no 0x, "
                              "no exponent)",
    };
    char range[96];
    if (spec->has_auto && strcasecmp(text, "auto") == 0) {
        *value_out = PLAIT_ENV_AUTO;
        return 0;
    }
    /* By hand, not strtol/strtod: those take blanks, signs, 0x, exponents,
     * "inf" and the locale's decimal point. The digits are summed exactly
     * (below 2^53) and divided once by the fraction's power of ten. */
    const char *p = text;
    double mant = 0, scale = 1, mult = 1;
    int digits = 0, is_huge = 0;
    /* NCCL reads its numeric variables with strtoll(..., 0), so an NCCL_
     * spelling may hold hexadecimal (NCCL_BUFFSIZE=0x400000): taken as
     * NCCL takes it, but as a whole integer only (no suffix, no sign).
     * NCCL's octal (a leading 0) is not: 010 is 10, as for every name. */
    const bool is_hex = is_nccl_spelling && spec->form != PLAIT_ENV_SECONDS && p[0] == '0' &&
                        (p[1] == 'x' || p[1] == 'X');
    if (is_hex) {
        for (p += 2; isxdigit((unsigned char)*p); p++, digits++) {
            mant = mant * 16 + (isdigit((unsigned char)*p) ? *p - '0' : tolower((unsigned char)*p) - 'a' + 10);
            is_huge |= mant > 1e15;
        }
    } else {
        for (; *p >= '0' && *p <= '9'; p++, digits++) {
            mant = mant * 10 + (*p - '0');
            is_huge |= mant > 1e15;
        }
        if (spec->form == PLAIT_ENV_SECONDS && *p == '.')
            for (p++; *p >= '0' && *p <= '9'; p++, digits++) {
                if (mant < 1e15) {
                    mant = mant * 10 + (*p - '0');
                    scale *= 10;
                }
            }
        if (spec->form == PLAIT_ENV_BYTES && digits > 0 && *p && strchr("KkMmGg", *p)) {
            mult = *p == 'K' || *p == 'k' ? 1024.0 : *p == 'M' || *p == 'm' ? 1048576.0 : 1073741824.0;
            p++;
        }
    }
    if (digits == 0 || *p != '\0') {
        snprintf(why, why_len, "is not %s%s", spec->has_auto ? "auto or " : "",
                 (is_nccl_spelling ? nccl_forms : forms)[spec->form]);
        return -1;
    }
    const double v = mant / scale * mult;
    if (is_huge || v < spec->lo || v > spec->hi) {
        plait_env_number_range(spec, range, sizeof(range));
        snprintf(why, why_len, "is out of range (%s)", range);
        return -1;
    }
    *value_out = v;
    return 0;
}

const struct plait_env_number *plait_env_number_find(const char *name)
{
    for (size_t i = 0; i < plait_env_numbers_len; i++)
        if (strcmp(plait_env_numbers[i].name, name) == 0)
            return &plait_env_numbers[i];
    return NULL;
}

plait_result_t plait_env_number(const char *name, double *value_out, int *is_set_out)
{
    const struct plait_env_number *spec = plait_env_number_find(name);
    const struct plait_env_var *var = NULL;
    for (size_t i = 0; i < plait_env_table_len && !var; i++)
        if (strcmp(plait_env_table[i].name, name) == 0)
            var = &plait_env_table[i];
    if (!spec || !var)
        return plait_error(PLAIT_ERR_INTERNAL, "plait_env_number: %s is not a numeric variable of the table", name);
    const char *v = plait_env_get(name);
    const char *read = getenv(name) || !var->nccl_name ? name : var->nccl_name;
    char why[256];
    if (is_set_out)
        *is_set_out = v && *v;
    if (!v || !*v) {
        if (!var->deflt[0])
            return PLAIT_SUCCESS;
        if (plait_env_number_parse(spec, var->deflt, false, value_out, why, sizeof(why)) != 0)
            return plait_error(PLAIT_ERR_INTERNAL, "%s: the default \"%s\" %s", name, var->deflt, why);
        return PLAIT_SUCCESS;
    }
    if (plait_env_number_parse(spec, v, strncmp(read, "NCCL_", 5) == 0, value_out, why, sizeof(why)) != 0)
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "%s=\"%s\" %s", read, v, why);
    return PLAIT_SUCCESS;
}
