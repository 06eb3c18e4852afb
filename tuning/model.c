/* The cost model (model.h, docs/tuning.md): constants, machines, and the
 * discrete-event replay of a schedule over a machine's resources.
 *
 * The replay. Each simulated (rank, channel) is a task running the generator's
 * steps in order, each step in pieces of at most one FIFO slot, exactly as
 * core/exec.c cuts them. A piece takes three stages, each an event:
 *
 *   TASK      the task's engine does the piece's local work (copying out of the
 *             arrived slot, reducing, copying into the send slot) once the
 *             piece has arrived (receiving kinds) and the FIFO towards the peer
 *             has credit (sending kinds); exec.c holds the received slot until
 *             the send slot is there, so a forwarding piece needs both at once;
 *   WIRE_OUT  the sender's side of the wire: its out-port (between ranks of a
 *             host) or its NIC (between hosts) for bytes x beta;
 *   WIRE_IN   the receiver's side, alpha later: its in-port or NIC for bytes x
 *             beta; the piece has arrived when that ends.
 *
 * A resource is a "free at" time: a reservation made at time t of duration d
 * starts at max(t, free) and moves free to its end. Reservations are made by
 * events in time order, so pieces that share a resource queue in the order
 * they became ready. A FIFO connection (receiver, sender, channel) keeps the
 * arrival times of the pieces in flight and the times its receiver finished
 * consuming the last nslots pieces: piece k may be sent once piece k - nslots
 * was consumed (credit).
 *
 * The event order is (time, local index, channel, event type, host, insertion
 * order). The host comes after the local index so that the order in which one
 * host's events are processed does not depend on how many hosts there are:
 * that is what makes the reduced replay (host 0 alone) reserve every resource
 * of host 0 in the same order as the full replay does.
 *
 * The reduced replay simulates host 0's ranks only. A piece a host-0 rank s
 * sends to a rank d on host h is, rotated by -h hosts, the piece the rank
 * (-h mod H, local(s)) sends to (0, local(d)): the model files it under that
 * connection, at host 0's receiver, and the receiver consumes it from there
 * when its own step names that rotated sender as recv_peer. Credit is read
 * from the same connection, so both ends of every mirrored connection live on
 * host 0. */
#include "tuning/model.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "algorithms/algorithms.h"
#include "base/file.h"
#include "base/log.h"
#include "topology/topo.h"

/* ------------------------------------------------------------------ names */

static const char *const link_names[PLAIT_MLINK_COUNT] = {"inproc", "shm", "socket", "nvlink", "pcie", "net"};
static const char *const engine_names[PLAIT_MENGINE_COUNT] = {"cpu", "gpu"};
static const char *const proto_names[PLAIT_MPROTO_COUNT] = {"simple", "ll"};

const char *plait_model_link_name(int link)
{
    return link >= 0 && link < PLAIT_MLINK_COUNT ? link_names[link] : "invalid";
}

const char *plait_model_engine_name(int engine)
{
    return engine >= 0 && engine < PLAIT_MENGINE_COUNT ? engine_names[engine] : "invalid";
}

const char *plait_model_proto_name(int proto)
{
    return proto >= 0 && proto < PLAIT_MPROTO_COUNT ? proto_names[proto] : "invalid";
}

/* -------------------------------------------------------------- constants */

#define US 1e-6
#define NS 1e-9
#define GBPS(x) (1.0 / ((x) * 1e9)) /* seconds per byte of a rate in GB/s */

void plait_model_consts_default(struct plait_model_consts *k)
{
    memset(k, 0, sizeof(*k));
    /* Wires. alpha is the latency of one slot hand-over, beta 1 / the rate of
     * one port each way. */
    /* The CPU constants below are what `plait-tune --calibrate` found on the
     * 2-core EPYC VM plait is developed on (docs/tuning.md, 2026-11-30),
     * rounded: a quiet modern x86 server core is in the same range. Run the
     * calibration on your machine and point PLAIT_TUNE_CONSTANTS at it.
     *
     * Threads of one process: a slot's flag moves between two cores' caches
     * (a flag ping-pong: 0.06 us one way; 0.27 when the vCPUs sit far apart). */
    k->alpha[PLAIT_MLINK_INPROC] = 0.06 * US;
    /* Processes of one host: the same through a shared mapping, plus the
     * polling loop of another process. */
    k->alpha[PLAIT_MLINK_SHM] = 0.06 * US;
    /* The copies of both ends are the engines' (send_beta, copy_beta, fitted
     * on plait's own collectives, which include the lines' trip between
     * cores); the port only keeps pieces in order: well above a core's rate. */
    k->beta[PLAIT_MLINK_INPROC] = GBPS(100.0);
    k->beta[PLAIT_MLINK_SHM] = GBPS(100.0);
    /* TCP on loopback: a 8-byte ping-pong through plait is ~6 us one way;
     * a 16 MiB exchange moves ~2.1 GB/s (the kernel's two copies). */
    k->alpha[PLAIT_MLINK_TCP] = 6.0 * US;
    k->beta[PLAIT_MLINK_TCP] = GBPS(2.1);
    /* Each FIFO slot over TCP also costs both ends' cores: the sender's
     * system call (which runs the receiving stack too on one machine), the
     * receiver's polls and read, the net transport's slot bookkeeping, paid
     * in turn by the rank's one thread. Fitted across two namespaces
     * (docs/performance.md, section 6): a 4 KiB allreduce on the FIFO path
     * takes ~18 us on one channel and ~31 us on two (two slots each way
     * instead of one), 32 KiB ~22 us on one and ~113 us on four: ~4 us per
     * slot and end, which is why few channels win across hosts below ~1 MiB.
     * It comes on top of alpha (a one-slot ping-pong, which has its ends'
     * calls in it): the fit takes the FIFO path's one-slot exchange as that
     * much dearer than the small-message path's, as measured (13-15 against
     * 8-9 us at 8 B), not as a split of alpha. The small-message path's one
     * write and read per peer are in alpha. */
    k->msg[PLAIT_MLINK_TCP] = 4.0 * US;
    /* GPU links: NCCL's public tuning model (src/graph/tuning.cc) charges a
     * Simple-protocol ring step 3.4 us on NVLink, ~5.7 us on PCIe and ~14 us
     * over the network (its hwLat tables); a step there is one slot, a piece
     * here. Rates: NVLink 4 on an H100 is 18 links x 25 GB/s = 450 GB/s each
     * way; PCIe gen5 x16 is 63 GB/s raw, ~50 GB/s for P2P after protocol
     * overhead; an NDR NIC is 400 Gb/s = 50 GB/s. */
    k->alpha[PLAIT_MLINK_NVLINK] = 3.4 * US;
    k->beta[PLAIT_MLINK_NVLINK] = GBPS(450.0);
    k->alpha[PLAIT_MLINK_PCIE] = 5.7 * US;
    k->beta[PLAIT_MLINK_PCIE] = GBPS(50.0);
    k->alpha[PLAIT_MLINK_NET] = 14.0 * US;
    k->beta[PLAIT_MLINK_NET] = GBPS(50.0);

    /* CPU engine, data in the caches (a 1 MiB ring allgather and
     * reducescatter on 2 processes, refined over a grid of collectives):
     * copies into and out of slots ~55 GB/s, a float sum ~34 GB/s per output
     * byte. Beyond the cache mem_factor applies (~12 GB/s for a copy). */
    k->send_beta[PLAIT_MENGINE_CPU] = GBPS(55.0);
    k->copy_beta[PLAIT_MENGINE_CPU] = GBPS(55.0);
    k->gamma[PLAIT_MENGINE_CPU] = GBPS(34.0);
    /* A step: the generator call and the task's bookkeeping, a few hundred
     * instructions (0.05 us). A call: argument checks, the op and its tasks,
     * the executor's first pass (0.1 us; the refinement puts most of a small
     * call's time in its steps and hand-overs). */
    k->step_overhead[PLAIT_MENGINE_CPU] = 0.05 * US;
    k->call_overhead[PLAIT_MENGINE_CPU] = 0.1 * US;
    /* GPU engine: the kernel's threads write straight over NVLink/PCIe into the
     * peer's slot, so sending costs no extra pass (send_beta 0). Copies and
     * reductions stream HBM (~3 TB/s on an H100): a copy reads and writes each
     * byte (1.5 TB/s per byte copied), a reduction reads two and writes one
     * (1 TB/s). */
    k->send_beta[PLAIT_MENGINE_GPU] = 0.0;
    k->copy_beta[PLAIT_MENGINE_GPU] = GBPS(1500.0);
    k->gamma[PLAIT_MENGINE_GPU] = GBPS(1000.0);
    /* A step of the kernel's loop: fetch the step, wait on the flags, fence:
     * ~0.1 us. A call: a kernel launch plus NCCL's fixed cost, NCCL's Simple
     * base latency (8.4 us in tuning.cc). */
    k->step_overhead[PLAIT_MENGINE_GPU] = 0.1 * US;
    k->call_overhead[PLAIT_MENGINE_GPU] = 8.4 * US;
    /* More ranks than cores: a rank that waited yields its core to the rank
     * sharing it; getting it back is a sched_yield round, ~0.6 us (fitted on
     * 3 and 4 processes on 2 cores). */
    k->handoff = 0.6 * US;

    /* LL on the CPU (fastpath.c): per peer, one cache line hand-off each way
     * (the flag latency) and the tag check; per byte, the push into the
     * peer's box and the read of it (18 GB/s for both, from 2-rank allreduces
     * of 8 B and 4 KiB); per call, the checks and the sequence numbers. */
    k->ll_alpha[PLAIT_MENGINE_CPU] = 0.06 * US;
    k->ll_beta[PLAIT_MENGINE_CPU] = GBPS(18.0);
    k->ll_call[PLAIT_MENGINE_CPU] = 0.07 * US;
    /* LL on the GPU: NCCL's LL base latency (~4.4 us, kernel launch
     * included), ~0.6 us per NVLink hop, and LL's half-rate payload (8 bytes
     * of flag per 8 of data): NCCL caps LL near 88 GB/s on one node; 80. */
    k->ll_alpha[PLAIT_MENGINE_GPU] = 0.6 * US;
    k->ll_beta[PLAIT_MENGINE_GPU] = GBPS(80.0);
    k->ll_call[PLAIT_MENGINE_GPU] = 4.4 * US;

    /* Memory regime: a server's last-level cache is tens of MiB (32 MiB on
     * the 2-core VM plait is developed on, one EPYC CCD); past it the engine
     * costs grow by mem_factor (4.5 refined over the calibration grid on
     * that VM: a 64 MiB ring allgather runs at ~12 GB/s per copy). A GPU's copy and reduction rates above are HBM rates
     * already: factor 1. */
    k->cache_bytes = 32.0 * 1024 * 1024;
    k->mem_factor[PLAIT_MENGINE_CPU] = 4.5;
    k->mem_factor[PLAIT_MENGINE_GPU] = 1.0;
    /* copy_beta and gamma are rates of data another core just wrote (cache
     * lines moving between cores); a rank's copies between its own buffers
     * run from its own cache, about twice as fast on the development VM
     * (one-shot allreduce, calibrated). A GPU's are HBM either way. */
    k->local_speedup[PLAIT_MENGINE_CPU] = 1.9;
    k->local_speedup[PLAIT_MENGINE_GPU] = 1.0;
}

/* The keys of a constants file: a group name and the array it indexes (by
 * link or by engine), or a scalar. */
enum key_index { KEY_BY_LINK, KEY_BY_ENGINE, KEY_SCALAR };
/* What a key's value is (struct key_group's is_per_byte): seconds (0),
 * seconds per byte (1, a rate accepted), bytes, or a plain factor. */
enum { VALUE_SECONDS = 0, VALUE_PER_BYTE = 1, VALUE_BYTES = 2, VALUE_FACTOR = 3 };

struct key_group {
    const char *name;
    size_t offset;   /* of the group's first double in struct plait_model_consts */
    int index;       /* enum key_index */
    int is_per_byte; /* VALUE_SECONDS, VALUE_PER_BYTE (a rate accepted), VALUE_BYTES or VALUE_FACTOR */
    const char *doc;
};

static const struct key_group key_groups[] = {
    {"alpha", offsetof(struct plait_model_consts, alpha), KEY_BY_LINK, 0, "per piece on the wire"},
    {"beta", offsetof(struct plait_model_consts, beta), KEY_BY_LINK, 1, "per byte on the wire (1 / bandwidth)"},
    {"msg", offsetof(struct plait_model_consts, msg), KEY_BY_LINK, 0,
     "per piece, each end's engine handing it to the link or taking it from it"},
    {"send_beta", offsetof(struct plait_model_consts, send_beta), KEY_BY_ENGINE, 1,
     "per byte the sender's engine spends putting a piece in a slot"},
    {"copy_beta", offsetof(struct plait_model_consts, copy_beta), KEY_BY_ENGINE, 1, "per byte of a local copy"},
    {"gamma", offsetof(struct plait_model_consts, gamma), KEY_BY_ENGINE, 1, "per byte of a reduction"},
    {"step_overhead", offsetof(struct plait_model_consts, step_overhead), KEY_BY_ENGINE, 0, "per step"},
    {"call_overhead", offsetof(struct plait_model_consts, call_overhead), KEY_BY_ENGINE, 0, "per call"},
    {"handoff", offsetof(struct plait_model_consts, handoff), KEY_SCALAR, 0,
     "per wait when a host has more ranks than cores"},
    {"ll_alpha", offsetof(struct plait_model_consts, ll_alpha), KEY_BY_ENGINE, 0, "LL: per peer"},
    {"ll_beta", offsetof(struct plait_model_consts, ll_beta), KEY_BY_ENGINE, 1, "LL: per byte per peer"},
    {"ll_call", offsetof(struct plait_model_consts, ll_call), KEY_BY_ENGINE, 0, "LL: per call"},
    {"cache_bytes", offsetof(struct plait_model_consts, cache_bytes), KEY_SCALAR, VALUE_BYTES,
     "a host's last-level cache (bytes; K, M, G suffixes: powers of 1024)"},
    {"local_speedup", offsetof(struct plait_model_consts, local_speedup), KEY_BY_ENGINE, VALUE_FACTOR,
     "local COPY/REDUCE steps run this many times faster than copy_beta/gamma (>= 1)"},
    {"mem_factor", offsetof(struct plait_model_consts, mem_factor), KEY_BY_ENGINE, VALUE_FACTOR,
     "engine per-byte costs of data beyond the cache, as a multiple of the cached rates (>= 1)"},
};
#define NGROUPS (sizeof(key_groups) / sizeof(key_groups[0]))

static int group_width(const struct key_group *g)
{
    return g->index == KEY_BY_LINK ? PLAIT_MLINK_COUNT : g->index == KEY_BY_ENGINE ? PLAIT_MENGINE_COUNT : 1;
}

static const char *group_member_name(const struct key_group *g, int i)
{
    return g->index == KEY_BY_LINK ? plait_model_link_name(i) : plait_model_engine_name(i);
}

static double *group_slot(const struct key_group *g, struct plait_model_consts *k, int i)
{
    return (double *)((char *)k + g->offset) + i;
}

/* The double a key names, or NULL; *g_out its group. */
static double *key_lookup(struct plait_model_consts *k, const char *key, const struct key_group **g_out)
{
    for (size_t gi = 0; gi < NGROUPS; gi++) {
        const struct key_group *g = &key_groups[gi];
        const size_t len = strlen(g->name);
        if (strncmp(key, g->name, len) != 0)
            continue;
        if (g->index == KEY_SCALAR) {
            if (key[len] != '\0')
                continue;
            *g_out = g;
            return group_slot(g, k, 0);
        }
        if (key[len] != '.')
            continue;
        for (int i = 0; i < group_width(g); i++) {
            if (strcmp(key + len + 1, group_member_name(g, i)) == 0) {
                *g_out = g;
                return group_slot(g, k, i);
            }
        }
    }
    return NULL;
}

/* Longest line a constants file may hold (a key, a value and a comment fit in
 * a fraction of it). */
#define CONSTS_MAX_LINE 512
/* Largest constants file load() reads. */
#define CONSTS_MAX_FILE (1u << 20)

/* Parses a value with its optional unit into seconds (or seconds per byte).
 * Returns NULL on success, else what is wrong. */
static const char *parse_value(const char *s, int is_per_byte, double *out)
{
    char *end = NULL;
    errno = 0;
    const double v = strtod(s, &end);
    if (end == s)
        return "the value is not a number";
    if (errno == ERANGE && fabs(v) > 1.0)
        return "the value is out of range";
    if (!isfinite(v))
        return "the value is not finite";
    if (v < 0)
        return "the value is negative";
    while (*end == ' ' || *end == '\t')
        end++;
    if (is_per_byte == VALUE_BYTES || is_per_byte == VALUE_FACTOR) {
        static const struct {
            const char *unit;
            double scale;
        } sizes[] = {{"", 1.0}, {"B", 1.0}, {"K", 1024.0}, {"KiB", 1024.0}, {"M", 1048576.0},
                     {"MiB", 1048576.0}, {"G", 1073741824.0}, {"GiB", 1073741824.0}};
        const size_t nunits = is_per_byte == VALUE_FACTOR ? 1 : sizeof(sizes) / sizeof(sizes[0]);
        for (size_t i = 0; i < nunits; i++) {
            if (strcmp(end, sizes[i].unit) != 0)
                continue;
            *out = v * sizes[i].scale + 0.0;
            if (is_per_byte == VALUE_FACTOR && (*out < 1.0 || *out > 1e3))
                return "a factor must be from 1 to 1000";
            if (*out > 1e15)
                return "the value is out of range (more than 10^15 bytes)";
            return NULL;
        }
        return is_per_byte == VALUE_FACTOR ? "a factor takes no unit"
                                           : "unknown unit (B, K/KiB, M/MiB, G/GiB for a byte count)";
    }
    static const struct {
        const char *unit;
        double scale;  /* seconds per unit, or bytes/s per unit for rates */
        int is_rate;
    } units[] = {
        {"", 1.0, 0},     {"s", 1.0, 0},    {"ms", 1e-3, 0},  {"us", 1e-6, 0}, {"ns", 1e-9, 0},
        {"GB/s", 1e9, 1}, {"MB/s", 1e6, 1}, {"KB/s", 1e3, 1}, {"B/s", 1.0, 1},
    };
    for (size_t i = 0; i < sizeof(units) / sizeof(units[0]); i++) {
        if (strcmp(end, units[i].unit) != 0)
            continue;
        if (units[i].is_rate) {
            if (!is_per_byte)
                return "a rate is only accepted for a per-byte key (beta, send_beta, copy_beta, gamma, ll_beta)";
            if (v == 0)
                return "a rate of 0 would take forever";
            *out = 1.0 / (v * units[i].scale);
        } else {
            *out = v * units[i].scale;
        }
        if (!isfinite(*out))
            return "the value is out of range";
        if (*out > 1e6)
            return "the value is out of range (more than 10^6 s)";
        *out = *out + 0.0; /* -0 reads as 0 */
        return NULL;
    }
    return "unknown unit (s, ms, us, ns, or GB/s, MB/s, KB/s, B/s for per-byte keys)";
}

static char *trim(char *s)
{
    while (*s == ' ' || *s == '\t' || *s == '\r')
        s++;
    size_t n = strlen(s);
    while (n > 0 && (s[n - 1] == ' ' || s[n - 1] == '\t' || s[n - 1] == '\r'))
        s[--n] = '\0';
    return s;
}

plait_result_t plait_model_consts_parse(const char *text, size_t len, const char *name,
                                        struct plait_model_consts *k)
{
    if (!k || (!text && len > 0))
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "plait_model_consts_parse: NULL argument");
    if (!name)
        name = "<constants>";
    struct plait_model_consts tmp = *k;
    char line[CONSTS_MAX_LINE + 1];
    size_t pos = 0;
    for (long lineno = 1; pos < len; lineno++) {
        size_t n = 0;
        while (pos < len && text[pos] != '\n') {
            if (text[pos] == '\0')
                return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "%s:%ld: a NUL byte in the text", name, lineno);
            if (n == CONSTS_MAX_LINE)
                return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "%s:%ld: line longer than %d characters", name,
                                   lineno, CONSTS_MAX_LINE);
            line[n++] = text[pos++];
        }
        line[n] = '\0';
        pos++; /* the newline */
        char *hash = strchr(line, '#');
        if (hash)
            *hash = '\0';
        char *body = trim(line);
        if (*body == '\0')
            continue;
        char *eq = strchr(body, '=');
        if (!eq)
            return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "%s:%ld: expected \"key = value\"", name, lineno);
        *eq = '\0';
        char *key = trim(body);
        char *val = trim(eq + 1);
        const struct key_group *g = NULL;
        double *slot = key_lookup(&tmp, key, &g);
        if (!slot)
            return plait_error(PLAIT_ERR_INVALID_ARGUMENT,
                               "%s:%ld: unknown key \"%.64s\" (keys are group.member: alpha.shm, beta.net, "
                               "gamma.cpu, ...; see plait_model_consts_save's output)",
                               name, lineno, key);
        if (*val == '\0')
            return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "%s:%ld: %s has no value", name, lineno, key);
        double v = 0;
        const char *why = parse_value(val, g->is_per_byte, &v);
        if (why)
            return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "%s:%ld: %s = \"%.64s\": %s", name, lineno, key, val, why);
        *slot = v;
    }
    *k = tmp;
    return PLAIT_SUCCESS;
}

plait_result_t plait_model_consts_load(const char *path, struct plait_model_consts *k)
{
    if (!path || !k)
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "plait_model_consts_load: NULL argument");
    FILE *f = fopen(path, "rb");
    if (!f)
        return plait_error(PLAIT_ERR_SYSTEM, "%s: cannot open: %s", path, strerror(errno));
    plait_result_t status = PLAIT_SUCCESS;
    char *buf = malloc(CONSTS_MAX_FILE + 1);
    if (!buf) {
        status = plait_error(PLAIT_ERR_SYSTEM, "%s: out of memory", path);
        goto err_close;
    }
    const size_t n = fread(buf, 1, CONSTS_MAX_FILE + 1, f);
    if (ferror(f)) {
        status = plait_error(PLAIT_ERR_SYSTEM, "%s: cannot read: %s", path, strerror(errno));
        goto err_free;
    }
    if (n > CONSTS_MAX_FILE) {
        status = plait_error(PLAIT_ERR_INVALID_ARGUMENT, "%s: larger than %u bytes", path, CONSTS_MAX_FILE);
        goto err_free;
    }
    status = plait_model_consts_parse(buf, n, path, k);
err_free:
    free(buf);
err_close:
    fclose(f);
    return status;
}

plait_result_t plait_model_consts_save(const char *path, const struct plait_model_consts *k, const char *comment)
{
    if (!path || !k)
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "plait_model_consts_save: NULL argument");
    /* Composed in memory, then written as a whole (base/file.h): a file being
     * replaced is never seen half-written by a rank that loads it. */
    char *text = NULL;
    size_t text_len = 0;
    FILE *f = open_memstream(&text, &text_len);
    if (!f)
        return plait_error(PLAIT_ERR_SYSTEM, "%s: cannot compose the constants: %s", path, strerror(errno));
    struct plait_model_consts copy = *k;
    fprintf(f, "# plait cost-model constants (seconds; seconds per byte for beta, gamma and per-byte keys)\n");
    if (comment) {
        /* One comment line per line of the caller's text, so that no newline
         * in it can start a line the parser would read as a key. */
        fputs("# ", f);
        for (const char *p = comment; *p; p++) {
            fputc(*p == '\r' ? ' ' : *p, f);
            if (*p == '\n')
                fputs("# ", f);
        }
        fputc('\n', f);
    }
    for (size_t gi = 0; gi < NGROUPS; gi++) {
        const struct key_group *g = &key_groups[gi];
        fprintf(f, "\n# %s: %s\n", g->name, g->doc);
        for (int i = 0; i < group_width(g); i++) {
            if (g->index == KEY_SCALAR)
                fprintf(f, "%s = %.17g\n", g->name, *group_slot(g, &copy, i));
            else
                fprintf(f, "%s.%s = %.17g\n", g->name, group_member_name(g, i), *group_slot(g, &copy, i));
        }
    }
    const int werr = ferror(f);
    if (fclose(f) != 0 || werr) {
        free(text);
        return plait_error(PLAIT_ERR_SYSTEM, "%s: cannot compose the constants: %s", path, strerror(errno));
    }
    char why[PATH_MAX + 256];
    const int r = plait_file_write(path, text, text_len, why, sizeof(why));
    free(text);
    if (r != 0)
        return plait_error(PLAIT_ERR_SYSTEM, "%s", why);
    return PLAIT_SUCCESS;
}

uint64_t plait_model_consts_hash(const struct plait_model_consts *k)
{
    /* FNV-1a over every value's bits in key order (not over the struct's
     * bytes: no padding or layout enters the hash). */
    uint64_t h = 0xcbf29ce484222325ull ^ PLAIT_MODEL_VERSION;
    struct plait_model_consts copy = *k;
    for (size_t gi = 0; gi < NGROUPS; gi++) {
        for (int i = 0; i < group_width(&key_groups[gi]); i++) {
            double v = *group_slot(&key_groups[gi], &copy, i) + 0.0;
            uint64_t bits;
            memcpy(&bits, &v, sizeof(bits));
            for (int b = 0; b < 8; b++) {
                h ^= (bits >> (8 * b)) & 0xff;
                h *= 0x100000001b3ull;
            }
        }
    }
    return h;
}

/* --------------------------------------------------------------- machines */

/* Most ranks a model machine holds (the event keys pack a rank index in 20 bits). */
#define MODEL_MAX_RANKS (1 << 20)
/* Most channels a call may use (10 bits of the event keys). */
#define MODEL_MAX_CHANNELS 1024
/* Most FIFO slots per connection. */
#define MODEL_MAX_SLOTS 1024
/* LL on the GPU: NCCL's LL carries up to about this much per rank pair before
 * LL128/Simple win. */
#define MODEL_GPU_LL_MAX_BYTES (64u << 10)
/* The CPU's LL (fastpath.h: PLAIT_FAST_MAX_BYTES, PLAIT_FAST_MAX_RANKS). */
#define MODEL_CPU_LL_MAX_BYTES 4096u
#define MODEL_CPU_LL_MAX_RANKS 8
/* AUTO: a call the reduced replay can only interpolate is replayed in full
 * up to this many ranks (a few hundred thousand steps at most). */
#define MODEL_FULL_FALLBACK_RANKS 256
/* Cores of a GPU-less graph that become ranks (model.h). */
#define MODEL_MAX_CPU_RANKS 64

static int cpu_ll_ok(int nranks, int nhosts, int intra_link)
{
    return nhosts == 1 && nranks >= 2 && nranks <= MODEL_CPU_LL_MAX_RANKS &&
           (intra_link == PLAIT_MLINK_SHM || intra_link == PLAIT_MLINK_INPROC);
}

/* Allocates host_of/local_of for nhosts hosts of per_host consecutive ranks
 * and sets the constants (*k, NULL: the defaults). */
static plait_result_t machine_alloc(struct plait_model_machine *m, int nhosts, int per_host,
                                    const struct plait_model_consts *k)
{
    memset(m, 0, sizeof(*m));
    const int n = nhosts * per_host;
    m->host_of = malloc(sizeof(int32_t) * (size_t)n);
    m->local_of = malloc(sizeof(int32_t) * (size_t)n);
    if (!m->host_of || !m->local_of) {
        free(m->host_of);
        free(m->local_of);
        memset(m, 0, sizeof(*m));
        return plait_error(PLAIT_ERR_SYSTEM, "model machine: out of memory for %d ranks", n);
    }
    for (int r = 0; r < n; r++) {
        m->host_of[r] = r / per_host;
        m->local_of[r] = r % per_host;
    }
    m->nranks = n;
    m->nhosts = nhosts;
    m->nics_per_host = 1;
    if (k)
        m->k = *k;
    else
        plait_model_consts_default(&m->k);
    return PLAIT_SUCCESS;
}

plait_result_t plait_model_machine_uniform(struct plait_model_machine *m, int nranks, int nhosts, int engine,
                                           int intra_link, int inter_link, const struct plait_model_consts *k)
{
    if (!m)
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "plait_model_machine_uniform: NULL machine");
    if (nranks < 1 || nranks > MODEL_MAX_RANKS || nhosts < 1 || nhosts > nranks || nranks % nhosts != 0)
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT,
                           "plait_model_machine_uniform: %d ranks on %d hosts (need 1..%d ranks, hosts dividing them)",
                           nranks, nhosts, MODEL_MAX_RANKS);
    if (engine < 0 || engine >= PLAIT_MENGINE_COUNT || intra_link < 0 || intra_link >= PLAIT_MLINK_COUNT ||
        inter_link < 0 || inter_link >= PLAIT_MLINK_COUNT)
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT,
                           "plait_model_machine_uniform: engine %d, links %d/%d out of range", engine, intra_link,
                           inter_link);
    struct plait_model_machine tmp;
    plait_result_t r = machine_alloc(&tmp, nhosts, nranks / nhosts, k);
    if (r)
        return r;
    tmp.engine = engine;
    tmp.intra_link = intra_link;
    tmp.inter_link = inter_link;
    if (engine == PLAIT_MENGINE_GPU) {
        tmp.ll_ok = 1;
        tmp.ll_max_bytes = MODEL_GPU_LL_MAX_BYTES;
    } else {
        tmp.ll_ok = cpu_ll_ok(nranks, nhosts, intra_link);
        tmp.ll_max_bytes = MODEL_CPU_LL_MAX_BYTES;
    }
    *m = tmp;
    return PLAIT_SUCCESS;
}

/* Sum of the bandwidth (GB/s) of the links of `type` touching node v. */
static double node_link_bw(const struct plait_topo *topo, int v, enum plait_topo_link_type type)
{
    double bw = 0;
    for (int i = 0; i < topo->nlinks; i++) {
        const struct plait_topo_link *l = &topo->links[i];
        if (l->type == type && (l->a == v || l->b == v) && isfinite(l->bw) && l->bw > 0)
            bw += l->bw;
    }
    return bw;
}

plait_result_t plait_model_machine_from_topo(struct plait_model_machine *m, const struct plait_topo *topo, int nodes,
                                             const struct plait_model_consts *k)
{
    if (!m || !topo)
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "plait_model_machine_from_topo: NULL argument");
    if (nodes < 1 || topo->nnodes < 0 || topo->nnodes > PLAIT_TOPO_MAX_NODES || (topo->nnodes > 0 && !topo->nodes) ||
        topo->nlinks < 0 || (topo->nlinks > 0 && !topo->links))
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "plait_model_machine_from_topo: %d nodes of a graph of %d",
                           nodes, topo->nnodes);
    int ngpu = 0, nnic = 0, ncores = 0;
    double nvl_bw = -1, pci_bw = -1, nic_bw = -1; /* the smallest per GPU / NIC, GB/s */
    int all_nvl = 1;
    for (int v = 0; v < topo->nnodes; v++) {
        const struct plait_topo_node *nd = &topo->nodes[v];
        if (nd->type == PLAIT_TOPO_GPU) {
            ngpu++;
            const double nb = node_link_bw(topo, v, PLAIT_LINK_NVL);
            const double pb = node_link_bw(topo, v, PLAIT_LINK_PCI);
            if (nb <= 0)
                all_nvl = 0;
            else if (nvl_bw < 0 || nb < nvl_bw)
                nvl_bw = nb;
            if (pb > 0 && (pci_bw < 0 || pb < pci_bw))
                pci_bw = pb;
        } else if (nd->type == PLAIT_TOPO_NIC && !nd->nic.is_virtual) {
            nnic++;
            const double b = isfinite(nd->nic.speed) && nd->nic.speed > 0 ? nd->nic.speed / 8.0 : 0;
            if (b > 0 && (nic_bw < 0 || b < nic_bw))
                nic_bw = b;
        } else if (nd->type == PLAIT_TOPO_CPU && nd->cpu.ncores > 0 && nd->cpu.ncores < 1 << 20) {
            ncores += nd->cpu.ncores;
        }
    }
    const int per_host = ngpu > 0 ? ngpu : ncores > MODEL_MAX_CPU_RANKS ? MODEL_MAX_CPU_RANKS : ncores > 0 ? ncores : 1;
    if ((long)per_host * nodes > MODEL_MAX_RANKS)
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "plait_model_machine_from_topo: %d nodes of %d ranks is more than %d",
                           nodes, per_host, MODEL_MAX_RANKS);
    struct plait_model_machine tmp;
    plait_result_t r = machine_alloc(&tmp, nodes, per_host, k);
    if (r)
        return r;
    tmp.nics_per_host = nnic > 0 ? nnic : 1;
    tmp.inter_bw = nic_bw > 0 ? nic_bw * 1e9 : 0;
    tmp.inter_link = ngpu > 0 ? PLAIT_MLINK_NET : PLAIT_MLINK_TCP;
    if (ngpu > 0) {
        tmp.engine = PLAIT_MENGINE_GPU;
        tmp.intra_link = all_nvl ? PLAIT_MLINK_NVLINK : PLAIT_MLINK_PCIE;
        tmp.intra_bw = all_nvl ? nvl_bw * 1e9 : pci_bw > 0 ? pci_bw * 1e9 : 0;
        tmp.ll_ok = 1;
        tmp.ll_max_bytes = MODEL_GPU_LL_MAX_BYTES;
        /* NCCL-like rings: channel c enters a host at local index c + 1 and
         * leaves it from local index c, so that each channel crosses between
         * hosts on a different NIC (local index j uses NIC j % nics). */
        const int n = tmp.nranks, L = per_host;
        tmp.norder = L;
        tmp.order = malloc(sizeof(int32_t) * (size_t)n * (size_t)L);
        tmp.pos = malloc(sizeof(int32_t) * (size_t)n * (size_t)L);
        if (!tmp.order || !tmp.pos) {
            plait_model_machine_free(&tmp);
            return plait_error(PLAIT_ERR_SYSTEM, "plait_model_machine_from_topo: out of memory");
        }
        for (int c = 0; c < L; c++) {
            for (int h = 0; h < nodes; h++) {
                for (int i = 0; i < L; i++) {
                    const int rank = h * L + (c + 1 + i) % L;
                    tmp.order[(size_t)c * n + (size_t)h * L + i] = rank;
                    tmp.pos[(size_t)c * n + rank] = h * L + i;
                }
            }
        }
    } else {
        tmp.engine = PLAIT_MENGINE_CPU;
        tmp.intra_link = PLAIT_MLINK_SHM;
        tmp.cores_per_host = ncores;
        tmp.ll_ok = cpu_ll_ok(tmp.nranks, nodes, tmp.intra_link);
        tmp.ll_max_bytes = MODEL_CPU_LL_MAX_BYTES;
    }
    *m = tmp;
    return PLAIT_SUCCESS;
}

void plait_model_machine_free(struct plait_model_machine *m)
{
    if (!m)
        return;
    free(m->host_of);
    free(m->local_of);
    free(m->order);
    free(m->pos);
    m->host_of = m->local_of = m->order = m->pos = NULL;
    m->norder = 0;
    m->nranks = 0;
}

void plait_model_call_init(struct plait_model_call *c, int coll, uint64_t count, int esize, int algo, int proto)
{
    memset(c, 0, sizeof(*c));
    c->coll = coll;
    c->count = count;
    c->esize = esize;
    c->root = 0;
    c->algo = algo;
    c->proto = proto;
    c->nchannels = 2;
    c->chunk_bytes = 512u << 10;
    c->slot_bytes = 128u << 10;
    c->nslots = 4;
    c->radix = 2;
}

/* ------------------------------------------------------------ nccl-tests */

uint64_t plait_model_coll_bytes(int coll, uint64_t count, int esize, int nranks)
{
    const uint64_t b = count * (uint64_t)(esize > 0 ? esize : 0);
    switch (coll) {
    case PLAIT_COLL_ALLGATHER:
    case PLAIT_COLL_REDUCESCATTER:
    case PLAIT_COLL_ALLTOALL:
    case PLAIT_COLL_GATHER:
    case PLAIT_COLL_SCATTER:
        /* nccl-tests' size: the larger of a rank's input and output, nranks blocks */
        return b * (uint64_t)(nranks > 0 ? nranks : 0);
    case PLAIT_COLL_BARRIER:
        return 0;
    default:
        return b;
    }
}

double plait_model_bus_factor(int coll, int nranks)
{
    if (nranks < 1)
        return 0;
    switch (coll) {
    case PLAIT_COLL_ALLREDUCE:
        return 2.0 * (nranks - 1) / nranks;
    case PLAIT_COLL_ALLGATHER:
    case PLAIT_COLL_REDUCESCATTER:
    case PLAIT_COLL_ALLTOALL:
    case PLAIT_COLL_GATHER:
    case PLAIT_COLL_SCATTER:
        return (double)(nranks - 1) / nranks;
    default:
        return 1.0;
    }
}

/* ------------------------------------------------------------- the replay */

enum ev_type { EV_WIRE_IN = 0, EV_WIRE_OUT = 1, EV_TASK = 2 };

struct event {
    double t;
    uint64_t sub; /* local << 32 | channel << 22 | type << 20 | host (see ev_sub) */
    uint64_t seq; /* insertion order: the last tie-break */
    int32_t type;
    int32_t id;   /* the task (EV_TASK) or the connection (EV_WIRE_*) */
    uint64_t bytes;
};

struct conn {
    int32_t recv_rank, send_rank; /* the key: receiver (simulated) and sender (rotated in reduced mode) */
    int32_t ch;
    int32_t recv_task, send_task; /* tasks to wake (the sender's representative in reduced mode) */
    int32_t is_inter;
    int32_t out_host, in_host;    /* simulated hosts owning the out and in resources */
    int32_t send_local, recv_local;
    int32_t send_sidx, recv_sidx;
    uint64_t sent, arrived, consumed;
    int recv_waiting, send_waiting;
    double *arr;  /* [nslots] arrival time of piece k at k % nslots */
    double *cons; /* [nslots] time piece k was consumed at k % nslots */
};

struct task {
    int32_t rank, sidx, ch, local, host; /* host: the simulated host (0 in reduced mode) */
    uint64_t idx;
    struct plait_step st;
    int has_step, charged, done;
    uint64_t npieces, spiece, rpiece;
    int32_t cin, cout;
    double busy; /* the end of its last engine work */
};

struct sim {
    const struct plait_model_machine *m;
    const struct plait_model_call *c;
    plait_step_fn gen;
    struct plait_sched_args args;
    int32_t *order_buf, *pos_buf; /* order/pos widened to nchannels (NULL when the machine's suffice) */
    int reduced, nranks, nch, H, L;
    int nsim;          /* ranks simulated */
    int32_t *rank_at;  /* [H * L] reduced: the rank at (host, local) */
    uint32_t ns;       /* FIFO slots */
    uint64_t piece_elems;
    /* resources */
    int per_channel_engine;
    double *engine; /* [nsim] or [nsim * nch] */
    double *port_out, *port_in; /* [nsim] */
    int nics, nsimhosts;
    double *nic_out, *nic_in; /* [nsimhosts * nics] */
    int sliced, cores;
    int max_local;       /* ranks on the fullest host (time-slicing: which cores are shared) */
    double *core_free;   /* [nsimhosts * cores] */
    int *waited;         /* [nsim] the rank idled waiting: it pays handoff at its next engine work */
    double alpha_intra, beta_intra, alpha_inter, beta_inter;
    double msg_intra, msg_inter; /* k->msg of the intra- and inter-host links */
    const struct plait_model_consts *k;
    int eng;
    struct task *tasks;
    int ntasks;
    /* connections: open-addressed table of indices into conns */
    struct conn *conns;
    size_t nconns, cap_conns;
    int32_t *table;
    size_t table_cap;
    double *rings; /* 2 * nslots per connection, grown with conns */
    /* events */
    struct event *heap;
    size_t nheap, cap_heap;
    uint64_t seq;
    uint64_t steps, pieces;
    plait_result_t status;
    int is_asymmetric; /* the reduced replay met a step that is not rotation-invariant */
};

static int sim_index(const struct sim *s, int rank)
{
    return s->reduced ? s->m->local_of[rank] : rank;
}

static int sim_host(const struct sim *s, int rank)
{
    return s->reduced ? 0 : s->m->host_of[rank];
}

static int ev_less(const struct event *a, const struct event *b)
{
    if (a->t != b->t)
        return a->t < b->t;
    if (a->sub != b->sub)
        return a->sub < b->sub;
    return a->seq < b->seq;
}

static void ev_push(struct sim *s, double t, int type, int32_t id, int local, int ch, int host, uint64_t bytes)
{
    if (s->status)
        return;
    if (s->nheap == s->cap_heap) {
        const size_t cap = s->cap_heap ? s->cap_heap * 2 : 1024;
        struct event *h = realloc(s->heap, cap * sizeof(*h));
        if (!h) {
            s->status = plait_error(PLAIT_ERR_SYSTEM, "plait_model_time: out of memory for events");
            return;
        }
        s->heap = h;
        s->cap_heap = cap;
    }
    struct event e = {.t = t,
                      .sub = (uint64_t)local << 32 | (uint64_t)ch << 22 | (uint64_t)type << 20 | (uint64_t)host,
                      .seq = s->seq++,
                      .type = type,
                      .id = id,
                      .bytes = bytes};
    size_t i = s->nheap++;
    while (i > 0) {
        const size_t p = (i - 1) / 2;
        if (!ev_less(&e, &s->heap[p]))
            break;
        s->heap[i] = s->heap[p];
        i = p;
    }
    s->heap[i] = e;
}

static struct event ev_pop(struct sim *s)
{
    struct event top = s->heap[0];
    const struct event last = s->heap[--s->nheap];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= s->nheap)
            break;
        if (c + 1 < s->nheap && ev_less(&s->heap[c + 1], &s->heap[c]))
            c++;
        if (!ev_less(&s->heap[c], &last))
            break;
        s->heap[i] = s->heap[c];
        i = c;
    }
    if (s->nheap > 0)
        s->heap[i] = last;
    return top;
}

static void wake_task(struct sim *s, int32_t ti, double t)
{
    const struct task *tk = &s->tasks[ti];
    ev_push(s, t, EV_TASK, ti, tk->local, tk->ch, tk->host, 0);
}

static uint64_t conn_hash(uint64_t key)
{
    key ^= key >> 33;
    key *= 0xff51afd7ed558ccdull;
    key ^= key >> 33;
    return key;
}

/* The connection (receiver, sender, channel), created on first use; -1 when
 * out of memory (s->status set). recv_rank is a simulated rank. */
static int32_t conn_get(struct sim *s, int recv_rank, int send_rank, int ch)
{
    const uint64_t key = ((uint64_t)recv_rank * (uint64_t)s->nranks + (uint64_t)send_rank) * (uint64_t)s->nch + (uint64_t)ch;
    if (s->table_cap) {
        size_t i = conn_hash(key) & (s->table_cap - 1);
        for (; s->table[i] >= 0; i = (i + 1) & (s->table_cap - 1)) {
            const struct conn *c = &s->conns[s->table[i]];
            if (c->recv_rank == recv_rank && c->send_rank == send_rank && c->ch == ch)
                return s->table[i];
        }
    }
    /* New: keep the table at most half full. */
    if ((s->nconns + 1) * 2 > s->table_cap) {
        const size_t cap = s->table_cap ? s->table_cap * 2 : 256;
        int32_t *t = malloc(cap * sizeof(*t));
        if (!t)
            goto err_oom;
        memset(t, 0xff, cap * sizeof(*t));
        for (size_t j = 0; j < s->nconns; j++) {
            const struct conn *c = &s->conns[j];
            const uint64_t kj = ((uint64_t)c->recv_rank * (uint64_t)s->nranks + (uint64_t)c->send_rank) * (uint64_t)s->nch +
                                (uint64_t)c->ch;
            size_t i = conn_hash(kj) & (cap - 1);
            while (t[i] >= 0)
                i = (i + 1) & (cap - 1);
            t[i] = (int32_t)j;
        }
        free(s->table);
        s->table = t;
        s->table_cap = cap;
    }
    if (s->nconns == s->cap_conns) {
        const size_t cap = s->cap_conns ? s->cap_conns * 2 : 64;
        struct conn *c = realloc(s->conns, cap * sizeof(*c));
        if (!c)
            goto err_oom;
        s->conns = c;
        double *r = realloc(s->rings, cap * 2 * s->ns * sizeof(*r));
        if (!r)
            goto err_oom;
        s->rings = r;
        s->cap_conns = cap;
        for (size_t j = 0; j < s->nconns; j++) { /* the rings moved */
            s->conns[j].arr = s->rings + j * 2 * s->ns;
            s->conns[j].cons = s->conns[j].arr + s->ns;
        }
    }
    const int32_t ci = (int32_t)s->nconns++;
    struct conn *c = &s->conns[ci];
    memset(c, 0, sizeof(*c));
    c->recv_rank = recv_rank;
    c->send_rank = send_rank;
    c->ch = ch;
    c->recv_sidx = sim_index(s, recv_rank);
    c->send_sidx = sim_index(s, send_rank);
    c->recv_task = c->recv_sidx * s->nch + ch;
    c->send_task = c->send_sidx * s->nch + ch;
    c->is_inter = s->m->host_of[recv_rank] != s->m->host_of[send_rank];
    c->send_local = s->m->local_of[send_rank];
    c->recv_local = s->m->local_of[recv_rank];
    /* Reduced: every real sender and receiver is on host 0. */
    c->out_host = sim_host(s, send_rank);
    c->in_host = sim_host(s, recv_rank);
    c->arr = s->rings + (size_t)ci * 2 * s->ns;
    c->cons = c->arr + s->ns;
    size_t i = conn_hash(key) & (s->table_cap - 1);
    while (s->table[i] >= 0)
        i = (i + 1) & (s->table_cap - 1);
    s->table[i] = ci;
    return ci;
err_oom:
    s->status = plait_error(PLAIT_ERR_SYSTEM, "plait_model_time: out of memory for connections");
    return -1;
}

/* The rank of `r` moved by `d` hosts (reduced mode's symmetry). */
static int rotate(const struct sim *s, int r, int d)
{
    const int h = ((s->m->host_of[r] + d) % s->H + s->H) % s->H;
    return s->rank_at[h * s->L + s->m->local_of[r]];
}

/* The connection a simulated rank sends on towards `dst`: in reduced mode,
 * rotated so that its receiver is on host 0. */
static int32_t conn_out(struct sim *s, int self, int dst, int ch)
{
    if (!s->reduced)
        return conn_get(s, dst, self, ch);
    const int d = -s->m->host_of[dst];
    return conn_get(s, rotate(s, dst, d), rotate(s, self, d), ch);
}

/* When piece `c->consumed` has arrived (negative: not yet). */
static double arrival_time(const struct conn *c, uint32_t ns)
{
    return c->arrived > c->consumed ? c->arr[c->consumed % ns] : -1.0;
}

/* When the next piece to send has credit (negative: not yet known). */
static double credit_time(const struct conn *c, uint32_t ns)
{
    if (c->sent < ns)
        return 0.0;
    return c->consumed > c->sent - ns ? c->cons[(c->sent - ns) % ns] : -1.0;
}

/* Reserves the rank's engine (and, time-sliced, a core of its host) for `dur`
 * from `now`; returns the end. */
static double engine_reserve(struct sim *s, struct task *t, double now, double dur)
{
    double *eng = &s->engine[s->per_channel_engine ? t->sidx * s->nch + t->ch : t->sidx];
    double start = now > *eng ? now : *eng;
    if (s->sliced) {
        /* A rank that idled gave its core away: getting it back costs a
         * hand-off when another rank shares the core. Ranks stay on their core (local index modulo the cores):
         * a waiting executor yields but stays runnable, so the kernel's load
         * balance sees every rank busy and moves none, and a core's ranks
         * share it (3 ranks on 2 cores: one core runs two of them). */
        const int c = t->local % s->cores;
        if (s->waited[t->sidx]) {
            /* A rank alone on its core polls on (sched_yield has no one
             * to run): no hand-off. */
            if (c + s->cores < s->max_local)
                dur += s->k->handoff;
            s->waited[t->sidx] = 0;
        }
        double *core = s->core_free + (size_t)t->host * s->cores + (size_t)c;
        if (*core > start)
            start = *core;
        *core = start + dur;
    }
    *eng = start + dur;
    return start + dur;
}

/* The task waits for data or credit: time-sliced, the executor thread finds
 * nothing to do, yields its core to another rank, and pays a hand-off to get
 * one back before its next engine work. (Counted on every wait, not only when
 * the rank's engine is idle: an engine that looks busy may only be queued
 * behind another rank's core, which is a wait too.) */
static void task_blocks(struct sim *s, const struct task *t)
{
    if (s->sliced)
        s->waited[t->sidx] = 1;
}

static double recv_cost(const struct sim *s, int kind)
{
    const int e = s->eng;
    switch (kind) {
    case PLAIT_STEP_RECV_REDUCE_SEND:
    case PLAIT_STEP_RECV_REDUCE_COPY:
    case PLAIT_STEP_RECV_REDUCE_COPY_SEND:
    case PLAIT_STEP_SENDRECV_REDUCE:
        return s->k->gamma[e]; /* reduce the arrived piece with src */
    default:
        return s->k->copy_beta[e]; /* copy it out of the slot */
    }
}

static double send_cost(const struct sim *s, int kind)
{
    /* RECV_REDUCE_SEND reduces straight into the send slot: no extra pass.
     * RECV_COPY_SEND and RECV_REDUCE_COPY_SEND write dst, then copy into the
     * slot; SEND and the send halves copy src into the slot. */
    return kind == PLAIT_STEP_RECV_REDUCE_SEND ? 0.0 : s->k->send_beta[s->eng];
}

static uint64_t piece_bytes(const struct sim *s, const struct task *t, uint64_t k)
{
    const uint64_t off = k * s->piece_elems;
    const uint64_t n = t->st.count - off < s->piece_elems ? t->st.count - off : s->piece_elems;
    return n * (uint64_t)s->c->esize;
}

static void piece_sent(struct sim *s, struct task *t, double end, uint64_t bytes)
{
    struct conn *c = &s->conns[t->cout];
    c->sent++;
    ev_push(s, end, EV_WIRE_OUT, t->cout, c->send_local, c->ch, c->out_host, bytes);
    s->pieces++;
}

static void piece_consumed(struct sim *s, struct task *t, double end)
{
    struct conn *c = &s->conns[t->cin];
    c->cons[c->consumed % s->ns] = end;
    c->consumed++;
    if (c->send_waiting) {
        c->send_waiting = 0;
        wake_task(s, c->send_task, end);
    }
}

static int peer_ok(const struct sim *s, const struct task *t, int peer)
{
    return peer >= 0 && peer < s->nranks && peer != t->rank;
}


static void task_push_self(struct sim *s, struct task *t, double at)
{
    wake_task(s, (int32_t)(t - s->tasks), at);
}

static plait_result_t bad_step(struct sim *s, const struct task *t, const char *what)
{
    return plait_error(PLAIT_ERR_INTERNAL,
                       "plait_model_time: %s step %llu of rank %d channel %d (kind %d, peers %d/%d): %s",
                       plait_algorithms[s->c->algo].name, (unsigned long long)t->idx, t->rank, t->ch, t->st.kind,
                       t->st.send_peer, t->st.recv_peer, what);
}

/* Hosts whose schedule the reduced replay compares with host 0's, step by
 * step: the next one, the last one and the middle one (every host would cost
 * what the full replay does). */
static int check_hosts(const struct sim *s, int out[3])
{
    int n = 0;
    const int cand[3] = {1, s->H - 1, s->H / 2};
    for (int i = 0; i < 3; i++) {
        int dup = cand[i] <= 0 || cand[i] >= s->H;
        for (int j = 0; j < n && !dup; j++)
            dup = out[j] == cand[i];
        if (!dup)
            out[n++] = cand[i];
    }
    return n;
}

/* Whether step t->idx of the task's rank is, rotated by whole hosts, the same
 * step on the ranks of the checked hosts (same kind and count, peers rotated
 * with it). A schedule whose step sizes depend on the rank's place (a ring
 * allreduce whose chunks are not all equal) is not: the reduced replay then
 * stops (s->is_asymmetric) rather than read another host's messages wrong. */
static int step_symmetric(struct sim *s, struct task *t, int has)
{
    int hosts[3];
    const int nh = check_hosts(s, hosts);
    for (int i = 0; i < nh; i++) {
        struct plait_step o;
        s->args.rank = rotate(s, t->rank, hosts[i]);
        const int other = s->gen(&s->args, t->ch, t->idx, &o);
        int same = other == has;
        if (same && has) {
            const int kind = t->st.kind;
            /* A local step (COPY, REDUCE) may cut the same bytes at another
             * point on another host (Bruck's copy-out in one iteration: slots
             * [1, n-r) and [n-r, n)): its kind must match, its count not. */
            same = o.kind == kind &&
                   (o.count == t->st.count || kind == PLAIT_STEP_COPY || kind == PLAIT_STEP_REDUCE);
            if (same && t->st.count > 0 && plait_step_recvs(kind))
                same = t->st.recv_peer >= 0 && t->st.recv_peer < s->nranks &&
                       o.recv_peer == rotate(s, t->st.recv_peer, hosts[i]);
            if (same && t->st.count > 0 && plait_step_sends(kind))
                same = t->st.send_peer >= 0 && t->st.send_peer < s->nranks &&
                       o.send_peer == rotate(s, t->st.send_peer, hosts[i]);
        }
        if (!same) {
            s->is_asymmetric = 1;
            s->status = plait_error_quiet(PLAIT_ERR_INVALID_ARGUMENT,
                                    "plait_model_time: %s is not invariant under rotation by hosts for this call "
                                    "(step %llu of rank %d channel %d differs on host %d): no reduced replay",
                                    plait_algorithms[s->c->algo].name, (unsigned long long)t->idx, t->rank, t->ch,
                                    hosts[i]);
            return 0;
        }
    }
    s->args.rank = t->rank;
    return 1;
}

/* Fetches the task's next step and the connections it uses; 0 when the
 * schedule is over (or on error, s->status set). */
static int task_fetch(struct sim *s, struct task *t)
{
    s->args.rank = t->rank;
    const int has = s->gen(&s->args, t->ch, t->idx, &t->st);
    if (s->reduced && !step_symmetric(s, t, has))
        return 0;
    if (!has)
        return 0;
    s->steps++;
    const int kind = t->st.kind;
    if (kind >= PLAIT_STEP_KINDS) {
        s->status = bad_step(s, t, "unknown step kind");
        return 0;
    }
    t->has_step = 1;
    t->charged = 0;
    t->spiece = t->rpiece = 0;
    t->npieces = (t->st.count + s->piece_elems - 1) / s->piece_elems;
    t->cin = t->cout = -1;
    if (t->st.count == 0 || kind == PLAIT_STEP_COPY || kind == PLAIT_STEP_REDUCE)
        return 1;
    if (plait_step_recvs(kind)) {
        if (!peer_ok(s, t, t->st.recv_peer)) {
            s->status = bad_step(s, t, "receives from a rank out of range or from itself");
            return 0;
        }
        t->cin = conn_get(s, t->rank, t->st.recv_peer, t->ch);
    }
    if (plait_step_sends(kind)) {
        if (!peer_ok(s, t, t->st.send_peer)) {
            s->status = bad_step(s, t, "sends to a rank out of range or to itself");
            return 0;
        }
        t->cout = conn_out(s, t->rank, t->st.send_peer, t->ch);
    }
    return s->status == PLAIT_SUCCESS;
}

static void step_done(struct task *t)
{
    t->has_step = 0;
    t->idx++;
}

/* A SENDRECV step: the halves move independently, the send half first when
 * both can (exec.c's order). Returns 1 when a piece was done, 0 when the task
 * must wait (an event or a wake is arranged). */
/* What an end's engine spends per piece on a connection's link (k->msg):
 * the sender's system call that hands a slot to TCP, the receiver's that
 * takes it; a polled slot in shared memory costs nothing of the kind. */
static double conn_msg(const struct sim *s, const struct conn *c)
{
    return c->is_inter ? s->msg_inter : s->msg_intra;
}

static int task_sendrecv(struct sim *s, struct task *t, double now)
{
    struct conn *co = &s->conns[t->cout], *ci = &s->conns[t->cin];
    const int send_left = t->spiece < t->npieces, recv_left = t->rpiece < t->npieces;
    const double ts = send_left ? credit_time(co, s->ns) : -1.0;
    const double tr = recv_left ? arrival_time(ci, s->ns) : -1.0;
    const int do_send = send_left && ts >= 0 && ts <= now;
    const int do_recv = !do_send && recv_left && tr >= 0 && tr <= now;
    if (!do_send && !do_recv) {
        double next = -1.0;
        if (send_left && ts < 0)
            co->send_waiting = 1;
        else if (send_left)
            next = ts;
        if (recv_left && tr < 0)
            ci->recv_waiting = 1;
        else if (recv_left && (next < 0 || tr < next))
            next = tr;
        task_blocks(s, t);
        if (next >= 0)
            task_push_self(s, t, next);
        return 0;
    }
    const uint64_t bytes = piece_bytes(s, t, do_send ? t->spiece : t->rpiece);
    const double per_byte = do_send ? s->k->send_beta[s->eng] : recv_cost(s, t->st.kind);
    const double dur = (t->charged ? 0.0 : s->k->step_overhead[s->eng]) + (double)bytes * per_byte +
                       conn_msg(s, do_send ? co : ci);
    t->charged = 1;
    const double end = engine_reserve(s, t, now, dur);
    if (do_send) {
        piece_sent(s, t, end, bytes);
        t->spiece++;
    } else {
        piece_consumed(s, t, end);
        t->rpiece++;
    }
    t->busy = end;
    if (t->spiece == t->npieces && t->rpiece == t->npieces)
        step_done(t);
    return 1;
}

/* A piece of the other moving kinds: it needs the arrived piece (receiving
 * kinds) and the credit (sending kinds) at once, as exec.c holds the received
 * slot until it has a send slot. Returns like task_sendrecv. */
static int task_piece(struct sim *s, struct task *t, double now)
{
    const int kind = t->st.kind;
    const int rx = plait_step_recvs(kind), tx = plait_step_sends(kind);
    struct conn *ci = rx ? &s->conns[t->cin] : NULL, *co = tx ? &s->conns[t->cout] : NULL;
    const double tr = rx ? arrival_time(ci, s->ns) : 0.0;
    const double ts = tx ? credit_time(co, s->ns) : 0.0;
    if (tr < 0 || ts < 0) {
        if (tr < 0)
            ci->recv_waiting = 1;
        if (ts < 0)
            co->send_waiting = 1;
        task_blocks(s, t);
        return 0;
    }
    const double ready = tr > ts ? tr : ts;
    if (ready > now) {
        task_blocks(s, t);
        task_push_self(s, t, ready);
        return 0;
    }
    const uint64_t bytes = piece_bytes(s, t, t->spiece);
    const double per_byte = (rx ? recv_cost(s, kind) : 0.0) + (tx ? send_cost(s, kind) : 0.0);
    const double dur = (t->charged ? 0.0 : s->k->step_overhead[s->eng]) + (double)bytes * per_byte +
                       (rx ? conn_msg(s, ci) : 0.0) + (tx ? conn_msg(s, co) : 0.0);
    t->charged = 1;
    const double end = engine_reserve(s, t, now, dur);
    if (rx)
        piece_consumed(s, t, end);
    if (tx)
        piece_sent(s, t, end, bytes);
    t->spiece++;
    t->busy = end;
    if (t->spiece == t->npieces)
        step_done(t);
    return 1;
}

/* Runs a task at `now` until it has to wait. */
static void task_run(struct sim *s, struct task *t, double now)
{
    while (!t->done && s->status == PLAIT_SUCCESS) {
        if (t->busy > now) {
            task_push_self(s, t, t->busy);
            return;
        }
        if (!t->has_step && !task_fetch(s, t)) {
            if (s->status == PLAIT_SUCCESS)
                t->done = 1;
            return;
        }
        const int kind = t->st.kind;
        if (kind == PLAIT_STEP_COPY || kind == PLAIT_STEP_REDUCE || t->st.count == 0) {
            /* Local, whole; or nothing to move (exec.c moves no piece for a
             * step of count 0): the step's overhead and its pass over the data. */
            const double speedup = s->k->local_speedup[s->eng] > 1.0 ? s->k->local_speedup[s->eng] : 1.0;
            const double per_byte =
                (kind == PLAIT_STEP_REDUCE ? s->k->gamma[s->eng] : s->k->copy_beta[s->eng]) / speedup;
            const uint64_t bytes = t->st.count * (uint64_t)s->c->esize;
            const double dur = s->k->step_overhead[s->eng] + (kind == PLAIT_STEP_COPY || kind == PLAIT_STEP_REDUCE
                                                                   ? (double)bytes * per_byte
                                                                   : 0.0);
            t->busy = engine_reserve(s, t, now, dur);
            step_done(t);
            continue;
        }
        const int moved = plait_step_is_sendrecv(kind) ? task_sendrecv(s, t, now) : task_piece(s, t, now);
        if (!moved)
            return;
    }
}

static void wire_out(struct sim *s, const struct event *e)
{
    const struct conn *c = &s->conns[e->id];
    double *res = c->is_inter ? &s->nic_out[(size_t)c->out_host * s->nics + c->send_local % s->nics]
                              : &s->port_out[c->send_sidx];
    const double beta = c->is_inter ? s->beta_inter : s->beta_intra;
    const double alpha = c->is_inter ? s->alpha_inter : s->alpha_intra;
    const double start = e->t > *res ? e->t : *res;
    *res = start + (double)e->bytes * beta;
    /* The head of the piece reaches the receiver's side alpha after it
     * started leaving (cut-through: the two ports overlap). */
    ev_push(s, start + alpha, EV_WIRE_IN, e->id, c->recv_local, c->ch, c->in_host, e->bytes);
}

static void wire_in(struct sim *s, const struct event *e)
{
    struct conn *c = &s->conns[e->id];
    double *res = c->is_inter ? &s->nic_in[(size_t)c->in_host * s->nics + c->recv_local % s->nics]
                              : &s->port_in[c->recv_sidx];
    const double beta = c->is_inter ? s->beta_inter : s->beta_intra;
    const double start = e->t > *res ? e->t : *res;
    const double end = start + (double)e->bytes * beta;
    *res = end;
    c->arr[c->arrived % s->ns] = end;
    c->arrived++;
    if (c->recv_waiting) {
        c->recv_waiting = 0;
        wake_task(s, c->recv_task, end);
    }
}

static void sim_free(struct sim *s)
{
    free(s->order_buf);
    free(s->pos_buf);
    free(s->rank_at);
    free(s->engine);
    free(s->port_out);
    free(s->port_in);
    free(s->nic_out);
    free(s->nic_in);
    free(s->core_free);
    free(s->waited);
    free(s->tasks);
    free(s->conns);
    free(s->table);
    free(s->rings);
    free(s->heap);
    memset(s, 0, sizeof(*s));
}

static double *zeros(size_t n, int *oom)
{
    double *p = calloc(n ? n : 1, sizeof(double));
    if (!p)
        *oom = 1;
    return p;
}

/* Whether the machine is the same seen from every host: every host has L
 * ranks with local indices 0..L-1, and every ring order maps to itself when
 * rotated by one host. Fills s->rank_at. Returns 0 when it is not (or out of
 * memory: s->status set). */
static int sim_symmetric(struct sim *s)
{
    const struct plait_model_machine *m = s->m;
    const int n = s->nranks, H = m->nhosts;
    if (n % H != 0)
        return 0;
    const int L = n / H;
    s->H = H;
    s->L = L;
    s->rank_at = malloc(sizeof(int32_t) * (size_t)n);
    if (!s->rank_at) {
        s->status = plait_error(PLAIT_ERR_SYSTEM, "plait_model_time: out of memory");
        return 0;
    }
    for (int i = 0; i < n; i++)
        s->rank_at[i] = -1;
    for (int r = 0; r < n; r++) {
        const int h = m->host_of[r], j = m->local_of[r];
        if (j >= L || s->rank_at[h * L + j] >= 0)
            return 0;
        s->rank_at[h * L + j] = r;
    }
    if (s->args.order) {
        for (int c = 0; c < s->nch; c++)
            for (int r = 0; r < n; r++)
                if (s->args.pos[(size_t)c * n + rotate(s, r, 1)] != (s->args.pos[(size_t)c * n + r] + L) % n)
                    return 0;
    }
    return 1;
}

/* Whether an algorithm's schedule of a collective is invariant under rotation
 * by whole hosts: the same relative schedule on every rank (rings, columns of
 * hosts, distances rank +- d) and no root. Recursive halving/doubling pairs
 * ranks by XOR, which a rotation does not preserve; trees have a root. The
 * replay still checks it step by step (step_symmetric). */
static int algo_rotation_invariant(int algo, int coll)
{
    if (coll != PLAIT_COLL_ALLREDUCE && coll != PLAIT_COLL_ALLGATHER && coll != PLAIT_COLL_REDUCESCATTER &&
        coll != PLAIT_COLL_ALLTOALL)
        return 0;
    return algo == PLAIT_ALGO_RING || algo == PLAIT_ALGO_HIER || algo == PLAIT_ALGO_BRUCK || algo == PLAIT_ALGO_PAT ||
           algo == PLAIT_ALGO_PAIRWISE;
}

/* Sets up a replay of c (with `count`) on m; reduced: host 0's ranks only. */
static plait_result_t sim_init(struct sim *s, const struct plait_model_machine *m, const struct plait_model_call *c,
                               int reduced)
{
    memset(s, 0, sizeof(*s));
    s->m = m;
    s->c = c;
    s->k = &m->k;
    s->eng = m->engine;
    s->gen = plait_algorithms[c->algo].step;
    s->nranks = m->nranks;
    s->nch = c->nchannels;
    s->ns = c->nslots;
    s->piece_elems = c->slot_bytes / (uint64_t)c->esize;
    struct plait_sched_args *a = &s->args;
    a->coll = c->coll;
    a->nranks = m->nranks;
    a->root = c->root;
    a->count = c->count;
    a->nchannels = c->nchannels;
    a->align_elems = 16 / (uint64_t)c->esize;
    a->radix = c->radix;
    a->nhosts = m->nhosts;
    a->host_of = m->host_of;
    a->local_of = m->local_of;
    /* enqueue.c's sched_args(): a chunk of at most half the FIFO, in whole
     * 16-byte units, at least one. */
    uint64_t chunk_bytes = c->chunk_bytes;
    const uint64_t half_fifo = (uint64_t)(c->nslots / 2) * c->slot_bytes;
    if (chunk_bytes > half_fifo)
        chunk_bytes = half_fifo;
    uint64_t chunk = chunk_bytes / (uint64_t)c->esize / a->align_elems * a->align_elems;
    a->chunk_elems = chunk > a->align_elems ? chunk : a->align_elems;
    const size_t n = (size_t)m->nranks;
    if (m->order && m->pos && m->norder >= 1) {
        if (m->norder >= c->nchannels) {
            a->order = m->order;
            a->pos = m->pos;
        } else {
            /* More channels than orders: channel c uses order c % norder. */
            s->order_buf = malloc(sizeof(int32_t) * n * (size_t)c->nchannels);
            s->pos_buf = malloc(sizeof(int32_t) * n * (size_t)c->nchannels);
            if (!s->order_buf || !s->pos_buf) {
                sim_free(s);
                return plait_error(PLAIT_ERR_SYSTEM, "plait_model_time: out of memory");
            }
            for (int ch = 0; ch < c->nchannels; ch++) {
                memcpy(s->order_buf + ch * n, m->order + (size_t)(ch % m->norder) * n, sizeof(int32_t) * n);
                memcpy(s->pos_buf + ch * n, m->pos + (size_t)(ch % m->norder) * n, sizeof(int32_t) * n);
            }
            a->order = s->order_buf;
            a->pos = s->pos_buf;
        }
    }
    if (reduced && !sim_symmetric(s)) {
        plait_result_t r = s->status;
        sim_free(s);
        return r ? r
                 : plait_error_quiet(PLAIT_ERR_INVALID_ARGUMENT,
                               "plait_model_time: the reduced replay needs hosts of equal size and ring orders "
                               "invariant under rotation by whole hosts");
    }
    s->reduced = reduced;
    s->nsim = reduced ? s->L : m->nranks;
    s->nsimhosts = reduced ? 1 : m->nhosts;
    s->nics = m->nics_per_host >= 1 ? m->nics_per_host : 1;
    s->per_channel_engine = m->engine == PLAIT_MENGINE_GPU;
    s->alpha_intra = m->k.alpha[m->intra_link];
    s->beta_intra = m->intra_bw > 0 ? 1.0 / m->intra_bw : m->k.beta[m->intra_link];
    s->alpha_inter = m->k.alpha[m->inter_link];
    s->msg_intra = m->k.msg[m->intra_link];
    s->msg_inter = m->k.msg[m->inter_link];
    s->beta_inter = m->inter_bw > 0 ? 1.0 / m->inter_bw : m->k.beta[m->inter_link];
    /* Time-slicing: CPU engines on a host with more ranks than cores. The
     * largest host decides (uniform machines: every host). */
    int max_local = 0;
    for (size_t r = 0; r < n; r++)
        if (m->local_of[r] + 1 > max_local)
            max_local = m->local_of[r] + 1;
    s->cores = m->cores_per_host;
    s->sliced = m->engine == PLAIT_MENGINE_CPU && s->cores > 0 && max_local > s->cores;
    s->max_local = max_local;
    int oom = 0;
    const size_t nsim = (size_t)s->nsim, nch = (size_t)s->nch;
    s->engine = zeros(s->per_channel_engine ? nsim * nch : nsim, &oom);
    s->port_out = zeros(nsim, &oom);
    s->port_in = zeros(nsim, &oom);
    s->nic_out = zeros((size_t)s->nsimhosts * (size_t)s->nics, &oom);
    s->nic_in = zeros((size_t)s->nsimhosts * (size_t)s->nics, &oom);
    s->core_free = s->sliced ? zeros((size_t)s->nsimhosts * (size_t)s->cores, &oom) : NULL;
    s->waited = calloc(nsim, sizeof(int));
    s->ntasks = (int)(nsim * nch);
    s->tasks = calloc(nsim * nch, sizeof(struct task));
    if (oom || !s->waited || !s->tasks) {
        sim_free(s);
        return plait_error(PLAIT_ERR_SYSTEM, "plait_model_time: out of memory for %zu tasks", nsim * nch);
    }
    for (size_t i = 0; i < nsim; i++) {
        const int rank = reduced ? s->rank_at[i] : (int)i;
        for (size_t ch = 0; ch < nch; ch++) {
            struct task *t = &s->tasks[i * nch + ch];
            t->rank = rank;
            t->sidx = (int32_t)i;
            t->ch = (int32_t)ch;
            t->local = m->local_of[rank];
            t->host = sim_host(s, rank);
            t->cin = t->cout = -1;
        }
    }
    return PLAIT_SUCCESS;
}

/* Runs the replay; *time_out the last task's end. */
static plait_result_t sim_run(struct sim *s, double *time_out)
{
    /* Every rank starts after its call overhead. */
    const double t0 = s->k->call_overhead[s->eng];
    for (int i = 0; i < s->ntasks; i++)
        wake_task(s, i, t0);
    while (s->nheap > 0 && s->status == PLAIT_SUCCESS) {
        const struct event e = ev_pop(s);
        if (e.type == EV_TASK)
            task_run(s, &s->tasks[e.id], e.t);
        else if (e.type == EV_WIRE_OUT)
            wire_out(s, &e);
        else
            wire_in(s, &e);
    }
    if (s->status)
        return s->status;
    double end = t0;
    for (int i = 0; i < s->ntasks; i++) {
        const struct task *t = &s->tasks[i];
        if (!t->done)
            return plait_error(PLAIT_ERR_INTERNAL,
                               "plait_model_time: %s deadlocks in the replay: rank %d channel %d waits at step %llu",
                               plait_algorithms[s->c->algo].name, t->rank, t->ch, (unsigned long long)t->idx);
        if (t->busy > end)
            end = t->busy;
    }
    *time_out = end;
    return PLAIT_SUCCESS;
}

/* One replay of c as it is. *is_asymmetric: the reduced replay stopped on a
 * step that is not rotation-invariant. */
static plait_result_t replay(const struct plait_model_machine *m, const struct plait_model_call *c, int reduced,
                             double *time_out, struct plait_model_result *res, int *is_asymmetric)
{
    struct sim s;
    plait_result_t r = sim_init(&s, m, c, reduced);
    if (r)
        return r;
    r = sim_run(&s, time_out);
    res->steps += s.steps;
    res->pieces += s.pieces;
    *is_asymmetric = s.is_asymmetric;
    sim_free(&s);
    return r;
}

/* enqueue.c's chunk in elements for a call. */
static uint64_t call_chunk_elems(const struct plait_model_call *c)
{
    const uint64_t align = 16 / (uint64_t)c->esize;
    uint64_t chunk_bytes = c->chunk_bytes;
    const uint64_t half_fifo = (uint64_t)(c->nslots / 2) * c->slot_bytes;
    if (chunk_bytes > half_fifo)
        chunk_bytes = half_fifo;
    const uint64_t chunk = chunk_bytes / (uint64_t)c->esize / align * align;
    return chunk > align ? chunk : align;
}

/* The time of c, replayed whole when a channel has at most
 * PLAIT_MODEL_MAX_ITERS chunk iterations, else extrapolated from two shorter
 * replays. */
static plait_result_t predict(const struct plait_model_machine *m, const struct plait_model_call *c, int reduced,
                              double *time_out, struct plait_model_result *res, int *is_asymmetric)
{
    /* A channel walks its range in units of chunk_elems (of every rank's
     * share for allreduce, whose ring iteration covers nranks chunks). */
    const uint64_t align = 16 / (uint64_t)c->esize;
    /* The double binary tree's iteration is a chunk of each tree's half
     * (dbtree.c), one-shot's a chunk (direct.c): with the ring's nranks
     * chunks a tree allreduce of 1 GiB on 4096 ranks was never extrapolated
     * (50M steps, a minute). */
    const uint64_t unit = call_chunk_elems(c) * (c->coll != PLAIT_COLL_ALLREDUCE ? 1
                                                 : c->algo == PLAIT_ALGO_TREE    ? 2
                                                 : c->algo == PLAIT_ALGO_ONESHOT ? 1
                                                                                 : (uint64_t)m->nranks);
    const uint64_t per_ch =
        ((c->count + (uint64_t)c->nchannels - 1) / (uint64_t)c->nchannels + align - 1) / align * align;
    if ((per_ch + unit - 1) / unit <= PLAIT_MODEL_MAX_ITERS)
        return replay(m, c, reduced, time_out, res, is_asymmetric);
    /* Periodic in whole iterations: replay k and 2k of them and extend the
     * line through both to the call's count. */
    const uint64_t kit = PLAIT_MODEL_MAX_ITERS / 2;
    struct plait_model_call c1 = *c, c2 = *c;
    c1.count = kit * unit * (uint64_t)c->nchannels;
    c2.count = 2 * kit * unit * (uint64_t)c->nchannels;
    double t1 = 0, t2 = 0;
    plait_result_t r = replay(m, &c1, reduced, &t1, res, is_asymmetric);
    if (r == PLAIT_SUCCESS)
        r = replay(m, &c2, reduced, &t2, res, is_asymmetric);
    if (r == PLAIT_SUCCESS) {
        *time_out = t1 + (t2 - t1) * ((double)(c->count - c1.count) / (double)(c2.count - c1.count));
        res->extrapolated = 1;
    }
    return r;
}

/* The reduced replay of c. An allreduce whose count does not split into
 * equal chunks on every rank (a ring's last chunk is short on some ranks
 * only) is not rotation-invariant; it is interpolated between the two
 * nearest counts that do (multiples of nchannels x nranks x 16 bytes), which
 * differ from it by less than one such multiple. */
static plait_result_t predict_reduced(const struct plait_model_machine *m, const struct plait_model_call *c,
                                      double *time_out, struct plait_model_result *res, int *is_asymmetric,
                                      int *is_interpolated)
{
    *is_interpolated = 0;
    plait_result_t r = predict(m, c, 1, time_out, res, is_asymmetric);
    if (!*is_asymmetric || c->coll != PLAIT_COLL_ALLREDUCE)
        return r;
    const uint64_t g = (uint64_t)c->nchannels * (uint64_t)m->nranks * (16 / (uint64_t)c->esize);
    if (c->count % g == 0)
        return r;
    *is_interpolated = 1;
    plait_last_error_clear();
    struct plait_model_call lo = *c, hi = *c;
    /* Below g: from g and 2g (a count of 0 moves nothing, no alpha). */
    lo.count = c->count < g ? g : c->count / g * g;
    hi.count = lo.count + g;
    double t_lo = 0, t_hi = 0;
    struct plait_model_result tmp = *res;
    r = predict(m, &lo, 1, &t_lo, &tmp, is_asymmetric);
    if (r == PLAIT_SUCCESS)
        r = predict(m, &hi, 1, &t_hi, &tmp, is_asymmetric);
    if (r)
        return r;
    *res = tmp;
    /* Signed: below g, count - lo.count is negative (as unsigned it wrapped
     * to ~2^64 and gave times of 10^13 us for tiny calls on many ranks). */
    *time_out = t_lo + (t_hi - t_lo) * (((double)c->count - (double)lo.count) / (double)g);
    return PLAIT_SUCCESS;
}

/* ------------------------------------------------------------------- LL */

static int ll_supports(int coll)
{
    switch (coll) {
    case PLAIT_COLL_ALLREDUCE:
    case PLAIT_COLL_REDUCESCATTER:
    case PLAIT_COLL_ALLGATHER:
    case PLAIT_COLL_ALLTOALL:
    case PLAIT_COLL_BROADCAST:
    case PLAIT_COLL_REDUCE:
    case PLAIT_COLL_BARRIER:
        return 1;
    default:
        return 0;
    }
}

/* Ranks of the most crowded host beyond its cores (0 when not time-sliced). */
static int ranks_beyond_cores(const struct plait_model_machine *m)
{
    if (m->engine != PLAIT_MENGINE_CPU || m->cores_per_host <= 0)
        return 0;
    int max_local = 0;
    for (int r = 0; r < m->nranks; r++)
        if (m->local_of[r] + 1 > max_local)
            max_local = m->local_of[r] + 1;
    return max_local > m->cores_per_host ? max_local - m->cores_per_host : 0;
}

static plait_result_t ll_time(const struct plait_model_machine *m, const struct plait_model_call *c, double *time_out)
{
    const uint64_t pair_bytes = c->count * (uint64_t)c->esize; /* what each rank pushes to each peer */
    if (!m->ll_ok)
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "plait_model_time: no LL protocol on this machine");
    if (!ll_supports(c->coll))
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "plait_model_time: LL does not run %s", plait_coll_name(c->coll));
    if (pair_bytes > m->ll_max_bytes)
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT,
                           "plait_model_time: LL takes at most %llu bytes per rank pair, not %llu",
                           (unsigned long long)m->ll_max_bytes, (unsigned long long)pair_bytes);
    const int beyond = ranks_beyond_cores(m);
    /* fastpath.c's fits_cores rule: time-sliced, broadcast and reduce keep
     * the FIFO path (the root runs ahead there). */
    if (beyond > 0 && (c->coll == PLAIT_COLL_BROADCAST || c->coll == PLAIT_COLL_REDUCE))
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT,
                           "plait_model_time: LL broadcast/reduce needs a core per rank on the host");
    const int e = m->engine;
    /* ll_call: the call's fixed cost; per peer: ll_alpha (one box's tag
     * published and one peer's box acquired) plus ll_beta per byte (pushed
     * into the peer's box and read from the peer's box into the result);
     * time-sliced: every call waits for every rank to be scheduled, one
     * hand-off per rank beyond the cores. */
    double t = m->k.ll_call[e];
    if (m->nranks > 1)
        t += (double)(m->nranks - 1) * (m->k.ll_alpha[e] + (double)pair_bytes * m->k.ll_beta[e]);
    t += (double)beyond * m->k.handoff;
    /* Across hosts (fastpath.c, over connections): the messages to the
     * other hosts' ranks (every rank's, over TCP on one host) leave at once,
     * one network latency in all (alpha: it has the ends' calls in it), and the
     * bytes of every rank of a host share its NICs one after another: the
     * busiest host's messages (each rank's to every rank elsewhere; what
     * comes in is the same count), spread over its NICs. */
    const int intra_tcp = m->intra_link == PLAIT_MLINK_TCP; /* PLAIT_TRANSPORT=socket: one host over TCP too */
    if (m->nhosts > 1 || intra_tcp) {
        int most_remote = 0;
        for (int h = 0; h < m->nhosts; h++) {
            int remote = 0;
            for (int r = 0; r < m->nranks; r++)
                if (m->host_of[r] == h)
                    for (int q = 0; q < m->nranks; q++)
                        remote += q != r && (m->host_of[q] != h || intra_tcp);
            if (remote > most_remote)
                most_remote = remote;
        }
        const int link = m->nhosts > 1 ? m->inter_link : m->intra_link;
        const int nics = m->nhosts > 1 && m->nics_per_host >= 1 ? m->nics_per_host : 1;
        const double bw = m->nhosts > 1 ? m->inter_bw : m->intra_bw;
        const double beta = bw > 0 ? 1.0 / bw : m->k.beta[link];
        t += m->k.alpha[link] + (double)most_remote / nics * ((double)(pair_bytes + 8) * beta);
    }
    *time_out = t;
    return PLAIT_SUCCESS;
}

/* LL on GPU machines. NCCL's LL is not a direct exchange: it runs the ring
 * (or tree) schedule with 8-byte lines of 4 bytes of data and a 4-byte flag,
 * each line polled by the receiver, so a hop costs no fence or flag round
 * trip (the Simple protocol's alpha) and every byte moves twice over the wire
 * and through the kernel. The model replays the call's algorithm as the
 * simple protocol on a machine whose constants say that:
 *
 *   - alpha of each GPU link (nvlink, pcie, net) scaled by ll_alpha.gpu /
 *     alpha.nvlink: with the defaults 0.6 us on NVLink, 1.0 us on PCIe and
 *     2.5 us over the network, NCCL's LL ring latencies (tuning.cc: 0.6, 1.0,
 *     2.7 us) (ll_alpha.gpu itself when alpha.nvlink is 0);
 *   - every per-byte cost doubled (the wire's beta or the machine's link
 *     rates, copy_beta, gamma, send_beta): half of Simple's bandwidth;
 *   - the kernel's copy out and reduction at least ll_beta.gpu per byte (a
 *     (rank, channel) polls and unpacks 8-byte lines: NCCL's LL runs near
 *     80-90 GB/s per channel, not at HBM rates);
 *   - ll_call.gpu as the call's overhead (NCCL's LL base latency);
 *
 * and ll_max_bytes (count x element size, ll_time checks it) as the limit
 * per rank. */
static plait_result_t ll_gpu_replay(const struct plait_model_machine *m, const struct plait_model_call *c, int mode,
                                    struct plait_model_result *out)
{
    struct plait_model_machine lm = *m; /* shares the rank arrays: not freed */
    struct plait_model_consts *k = &lm.k;
    const int e = PLAIT_MENGINE_GPU;
    const double nvl = m->k.alpha[PLAIT_MLINK_NVLINK];
    static const int gpu_links[] = {PLAIT_MLINK_NVLINK, PLAIT_MLINK_PCIE, PLAIT_MLINK_NET};
    for (size_t i = 0; i < sizeof(gpu_links) / sizeof(gpu_links[0]); i++) {
        const int l = gpu_links[i];
        k->alpha[l] = nvl > 0 ? m->k.alpha[l] * (m->k.ll_alpha[e] / nvl) : m->k.ll_alpha[e];
    }
    for (int l = 0; l < PLAIT_MLINK_COUNT; l++)
        k->beta[l] = 2.0 * m->k.beta[l];
    lm.intra_bw = m->intra_bw > 0 ? m->intra_bw / 2.0 : 0;
    lm.inter_bw = m->inter_bw > 0 ? m->inter_bw / 2.0 : 0;
    k->send_beta[e] = 2.0 * m->k.send_beta[e];
    k->copy_beta[e] = fmax(2.0 * m->k.copy_beta[e], m->k.ll_beta[e]);
    k->gamma[e] = fmax(2.0 * m->k.gamma[e], m->k.ll_beta[e]);
    k->call_overhead[e] = m->k.ll_call[e];
    struct plait_model_call lc = *c;
    lc.proto = PLAIT_MPROTO_SIMPLE;
    if (lc.coll == PLAIT_COLL_BARRIER && lc.count == 0)
        lc.count = 1; /* a barrier's LL flag is one line: the schedule of count 0 moves nothing */
    return plait_model_time(&lm, &lc, mode, out);
}

/* ------------------------------------------------------------------ time */

static plait_result_t check_machine(const struct plait_model_machine *m)
{
    if (m->nranks < 1 || m->nranks > MODEL_MAX_RANKS || m->nhosts < 1 || m->nhosts > m->nranks || !m->host_of ||
        !m->local_of)
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "plait_model_time: a machine of %d ranks on %d hosts",
                           m->nranks, m->nhosts);
    if (m->engine < 0 || m->engine >= PLAIT_MENGINE_COUNT || m->intra_link < 0 || m->intra_link >= PLAIT_MLINK_COUNT ||
        m->inter_link < 0 || m->inter_link >= PLAIT_MLINK_COUNT)
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "plait_model_time: engine or link class out of range");
    for (int r = 0; r < m->nranks; r++)
        if (m->host_of[r] < 0 || m->host_of[r] >= m->nhosts || m->local_of[r] < 0 || m->local_of[r] >= m->nranks)
            return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "plait_model_time: rank %d has host %d local %d", r,
                               m->host_of[r], m->local_of[r]);
    if (m->order && m->pos) {
        if (m->norder < 1)
            return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "plait_model_time: ring orders with norder %d", m->norder);
        for (long i = 0; i < (long)m->norder * m->nranks; i++) {
            const int32_t o = m->order[i];
            if (o < 0 || o >= m->nranks || m->pos[(i / m->nranks) * m->nranks + o] != i % m->nranks)
                return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "plait_model_time: ring order %ld is not a permutation",
                                   i / m->nranks);
        }
    }
    return PLAIT_SUCCESS;
}

static plait_result_t check_call(const struct plait_model_machine *m, const struct plait_model_call *c)
{
    if (c->coll < 0 || c->coll >= PLAIT_COLL_COUNT)
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "plait_model_time: collective %d out of range", c->coll);
    if (c->algo <= PLAIT_ALGO_AUTO || c->algo >= PLAIT_ALGO_COUNT)
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "plait_model_time: algorithm %d is not a concrete one", c->algo);
    if (c->proto < 0 || c->proto >= PLAIT_MPROTO_COUNT)
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "plait_model_time: protocol %d out of range", c->proto);
    if (c->esize != 1 && c->esize != 2 && c->esize != 4 && c->esize != 8 && c->esize != 16)
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "plait_model_time: element size %d (1, 2, 4, 8 or 16)",
                           c->esize);
    if (c->count > (UINT64_C(1) << 56) / (uint64_t)c->esize)
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "plait_model_time: count %llu is too large",
                           (unsigned long long)c->count);
    if (c->nchannels < 1 || c->nchannels > MODEL_MAX_CHANNELS)
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "plait_model_time: %d channels (1..%d)", c->nchannels,
                           MODEL_MAX_CHANNELS);
    if (c->nslots < 1 || c->nslots > MODEL_MAX_SLOTS || c->slot_bytes < (uint64_t)c->esize ||
        c->slot_bytes > (UINT64_C(1) << 40) || c->chunk_bytes < 1)
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT,
                           "plait_model_time: FIFO of %u slots of %llu bytes, chunk of %llu bytes", c->nslots,
                           (unsigned long long)c->slot_bytes, (unsigned long long)c->chunk_bytes);
    if (c->root < 0 || c->root >= m->nranks)
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "plait_model_time: root %d of %d ranks", c->root, m->nranks);
    if (c->radix < 0 || c->radix > 64)
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "plait_model_time: radix %d", c->radix);
    return PLAIT_SUCCESS;
}

/* The bytes a call touches on one host: every rank's input and output. */
static double call_footprint(const struct plait_model_machine *m, const struct plait_model_call *c)
{
    const double e = (double)c->count * (double)c->esize, n = (double)m->nranks;
    double in = e, out = e;
    if (c->coll == PLAIT_COLL_ALLGATHER)
        out = e * n;
    else if (c->coll == PLAIT_COLL_REDUCESCATTER)
        in = e * n;
    else if (c->coll == PLAIT_COLL_ALLTOALL)
        in = out = e * n;
    const double per_host = ceil(n / (double)(m->nhosts > 0 ? m->nhosts : 1));
    return per_host * (in + out);
}

/* The machine whose engine costs fit the call's memory regime (model.h,
 * cache_bytes and mem_factor): m itself when the call fits the cache, else
 * *tmp, a shallow copy with send_beta, copy_beta and gamma scaled. */
static const struct plait_model_machine *memory_regime(const struct plait_model_machine *m,
                                                       const struct plait_model_call *c,
                                                       struct plait_model_machine *tmp)
{
    const double fp = call_footprint(m, c), cache = m->k.cache_bytes, mf = m->k.mem_factor[m->engine];
    if (!(mf > 1.0) || fp <= cache)
        return m;
    const double f = (cache + (fp - cache) * mf) / fp;
    *tmp = *m;
    tmp->k.send_beta[m->engine] *= f;
    tmp->k.copy_beta[m->engine] *= f;
    tmp->k.gamma[m->engine] *= f;
    return tmp;
}

plait_result_t plait_model_time(const struct plait_model_machine *m, const struct plait_model_call *c, int mode,
                                struct plait_model_result *out)
{
    if (!m || !c || !out)
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "plait_model_time: NULL argument");
    if (mode < PLAIT_MODEL_AUTO || mode > PLAIT_MODEL_REDUCED)
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "plait_model_time: mode %d out of range", mode);
    plait_result_t r = check_machine(m);
    if (r)
        return r;
    if ((r = check_call(m, c)))
        return r;
    struct plait_model_machine scaled;
    m = memory_regime(m, c, &scaled);
    struct plait_model_result res;
    memset(&res, 0, sizeof(res));
    res.mode = PLAIT_MODEL_FULL;
    if (c->proto == PLAIT_MPROTO_LL) {
        if ((r = ll_time(m, c, &res.time_s)))
            return r;
        /* GPU: NCCL's LL runs the algorithm's schedule (ll_time above only
         * checked that LL takes the call). */
        if (m->engine == PLAIT_MENGINE_GPU)
            return ll_gpu_replay(m, c, mode, out);
    } else {
        const struct plait_algorithm *al = &plait_algorithms[c->algo];
        if (!al->step || !al->supports(c->coll, m->nranks))
            return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "plait_model_time: %s does not run %s on %d ranks",
                               al->name, plait_coll_name(c->coll), m->nranks);
        const int invariant = algo_rotation_invariant(c->algo, c->coll);
        if (mode == PLAIT_MODEL_REDUCED && !invariant)
            return plait_error(PLAIT_ERR_INVALID_ARGUMENT,
                               "plait_model_time: %s %s is not invariant under rotation by hosts: no reduced replay",
                               al->name, plait_coll_name(c->coll));
        int reduced = mode == PLAIT_MODEL_REDUCED || (mode == PLAIT_MODEL_AUTO && invariant && m->nhosts > 1);
        if (reduced && mode == PLAIT_MODEL_AUTO) {
            /* AUTO falls back to the full replay on an asymmetric machine. */
            struct sim probe;
            if (sim_init(&probe, m, c, 1) == PLAIT_SUCCESS) {
                sim_free(&probe);
            } else {
                plait_last_error_clear();
                reduced = 0;
            }
        }
        int is_asymmetric = 0, is_interpolated = 0;
        if (reduced) {
            r = predict_reduced(m, c, &res.time_s, &res, &is_asymmetric, &is_interpolated);
            /* Interpolated counts are close but not exact: AUTO prefers the
             * full replay wherever it is cheap. */
            if (mode == PLAIT_MODEL_AUTO &&
                ((r && is_asymmetric) || (is_interpolated && m->nranks <= MODEL_FULL_FALLBACK_RANKS))) {
                plait_last_error_clear();
                memset(&res, 0, sizeof(res));
                reduced = 0;
            }
        }
        if (!reduced)
            r = predict(m, c, 0, &res.time_s, &res, &is_asymmetric);
        res.mode = reduced ? PLAIT_MODEL_REDUCED : PLAIT_MODEL_FULL;
        if (r)
            return r;
    }
    const double bytes = (double)plait_model_coll_bytes(c->coll, c->count, c->esize, m->nranks);
    res.algbw = res.time_s > 0 ? bytes / res.time_s : 0.0;
    res.busbw = res.algbw * plait_model_bus_factor(c->coll, m->nranks);
    *out = res;
    return PLAIT_SUCCESS;
}
