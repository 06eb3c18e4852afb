/* A communicator's settings, read from the environment through the table and
 * parser of base/env.c, and the comparison of the agreed ones across ranks. */
#define _GNU_SOURCE
#include "core/settings.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "algorithms/algorithms.h"
#include "base/env.h"
#include "base/log.h"
#include "core/comm.h"

/* plait_env_number for a variable with a default or auto: an int. */
static plait_result_t env_int(const char *name, int *out)
{
    double v = 0;
    plait_result_t r = plait_env_number(name, &v, NULL);
    if (r == PLAIT_SUCCESS)
        *out = (int)v;
    return r;
}

/* Reads PLAIT_PROTO (auto, simple; strict) or else NCCL_PROTO (NCCL's lists:
 * "Simple", "LL,Simple", "^LL,LL128"; lenient): whether the small-message
 * path ("LL") may run. */
static plait_result_t parse_proto(int *out)
{
    *out = PLAIT_PROTO_AUTO;
    const char *v = getenv("PLAIT_PROTO");
    if (v && *v) {
        if (strcasecmp(v, "auto") == 0)
            return PLAIT_SUCCESS;
        if (strcasecmp(v, "simple") == 0) {
            *out = PLAIT_PROTO_SIMPLE;
            return PLAIT_SUCCESS;
        }
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "PLAIT_PROTO=\"%s\" is unknown (valid: auto, simple)", v);
    }
    v = getenv("NCCL_PROTO");
    if (!v || !*v)
        return PLAIT_SUCCESS;
    if (strchr(v, ':') || strchr(v, ';')) {
        static int warned;
        if (!__atomic_exchange_n(&warned, 1, __ATOMIC_RELAXED))
            PLAIT_WARN(PLAIT_SUBSYS_ENV, "NCCL_PROTO=%s: per-collective forms are not read by plait; using auto", v);
        return PLAIT_SUCCESS;
    }
    const int exclude = v[0] == '^';
    int ll = 0, simple = 0; /* other names (LL128): plait has none of them */
    char buf[256];
    snprintf(buf, sizeof(buf), "%s", v + exclude);
    char *save = NULL;
    for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        if (strcasecmp(tok, "LL") == 0)
            ll = 1;
        else if (strcasecmp(tok, "Simple") == 0)
            simple = 1;
    }
    if (exclude ? ll : (simple && !ll)) {
        *out = PLAIT_PROTO_SIMPLE;
    } else if (exclude ? simple : !simple) {
        /* What plait cannot do: LL128 alone, LL for every size, no Simple. */
        static int warned;
        if (!__atomic_exchange_n(&warned, 1, __ATOMIC_RELAXED))
            PLAIT_WARN(PLAIT_SUBSYS_ENV,
                   "NCCL_PROTO=%s: plait has LL (up to 4 KiB per rank pair on one host) and Simple, no LL128; using "
                   "auto",
                   v);
    }
    return PLAIT_SUCCESS;
}

/* NCCL's variables for features plait lacks: one WARN per process for each
 * that is set to something plait cannot honour. */
static void warn_nccl_only_settings(void)
{
    static int warned;
    if (__atomic_exchange_n(&warned, 1, __ATOMIC_RELAXED))
        return;
    const char *v;
    if ((v = getenv("NCCL_IB_HCA")) && *v)
        PLAIT_WARN(PLAIT_SUBSYS_ENV, "NCCL_IB_HCA=%s is ignored: plait has no InfiniBand transport yet (TCP between hosts)",
                   v);
    if ((v = getenv("NCCL_NET")) && *v && strcasecmp(v, "Socket") != 0)
        PLAIT_WARN(PLAIT_SUBSYS_ENV, "NCCL_NET=%s is ignored: plait uses TCP sockets between hosts", v);
}

plait_result_t plait_settings_load(struct plait_settings *s)
{
    memset(s, 0, sizeof(*s));
    double v = 0;
    int is_set = 0, n = 0;
    plait_result_t res;
    if ((res = env_int("PLAIT_NCHANNELS", &s->nchannels)))
        return res;
    if ((res = env_int("PLAIT_NSLOTS", &n)))
        return res;
    s->nslots = (uint32_t)n;
    if ((res = plait_env_number("PLAIT_BUFFSIZE", &v, NULL)))
        return res;
    s->slot_bytes = (uint64_t)v / s->nslots / 64 * 64;
    if (s->slot_bytes < 64)
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "PLAIT_BUFFSIZE=%.0f is too small for %u slots", v, s->nslots);
    if ((res = plait_env_number("PLAIT_CHUNK_SIZE", &v, NULL)))
        return res;
    s->chunk_bytes = (uint64_t)v / 16 * 16;
    if ((res = plait_env_number("PLAIT_TIMEOUT", &s->timeout_s, NULL)))
        return res;
    if ((res = plait_env_number("PLAIT_COLL_TIMEOUT", &s->coll_timeout_s, NULL)))
        return res;
    if ((res = env_int("PLAIT_SPIN_US", &s->spin_us))) /* auto: -1 */
        return res;
    if ((res = env_int("PLAIT_TREE_RADIX", &s->tree_radix)))
        return res;
    if ((res = plait_env_number("PLAIT_MAX_CTAS", &v, &s->is_max_channels_set)))
        return res;
    s->max_channels = s->is_max_channels_set ? (int)v : 0;
    v = 0;
    if ((res = plait_env_number("PLAIT_MIN_CTAS", &v, NULL)))
        return res;
    s->min_channels = (int)v;
    /* Read where they are used (src/cuda/, the test double's emulation), but
     * checked here, so that a bad value fails init at its start as every
     * other one does. */
    if ((res = plait_env_number("PLAIT_CUDA", &v, NULL)) || (res = plait_env_number("PLAIT_CE_COLL", &v, NULL)) ||
        (res = plait_env_number("PLAIT_KB_EMU_THREADS", &v, NULL)))
        return res;
    if ((res = plait_env_number("PLAIT_CUDA_SC_MIN_BYTES", &v, NULL)))
        return res;
    s->cuda_sc_min_bytes = (uint64_t)v;
    const char *tp = plait_env_get("PLAIT_TRANSPORT");
    if (!tp || !*tp || strcasecmp(tp, "auto") == 0)
        s->transport_force = PLAIT_FORCE_NONE;
    else if (strcasecmp(tp, "socket") == 0)
        s->transport_force = PLAIT_FORCE_TCP;
    else
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "PLAIT_TRANSPORT=\"%s\" is unknown (valid: auto, socket)", tp);
    /* NCCL_SHM_DISABLE=1 asks for no shared memory between processes: TCP, as
     * PLAIT_TRANSPORT=socket, which wins when set at all. */
    v = 0;
    if ((res = plait_env_number("NCCL_SHM_DISABLE", &v, NULL)))
        return res;
    if (!tp && v != 0)
        s->transport_force = PLAIT_FORCE_TCP;
    if ((res = plait_env_number("PLAIT_RUNTIME_CONNECT", &v, NULL)))
        return res;
    s->runtime_connect = v != 0;
    warn_nccl_only_settings();
    if ((res = parse_proto(&s->proto)))
        return res;
    /* PLAIT_ALGO is strict (a wrong name fails init); NCCL_ALGO, written for
     * NCCL, may name algorithms plait does not have: a WARN, then plait chooses. */
    const char *algo = getenv("PLAIT_ALGO");
    if (algo)
        res = plait_algo_parse(algo, 1, "PLAIT_ALGO", s->algo);
    else
        res = plait_algo_parse(getenv("NCCL_ALGO"), 0, "NCCL_ALGO", s->algo);
    if (res)
        return res;
    const char *np = plait_env_get("PLAIT_NET_PROVIDER");
    /* The net provider between hosts: unset or empty is the default, socket
     * (net layer II adds more). */
    if (np && *np && strcasecmp(np, "socket") != 0)
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT,
                           "PLAIT_NET_PROVIDER=\"%s\" is unknown (valid: socket, the default when unset)", np);
    snprintf(s->net_provider, sizeof(s->net_provider), "%s", "socket");
    const char *ifn = plait_env_get("PLAIT_SOCKET_IFNAME");
    snprintf(s->ifname, sizeof(s->ifname), "%s", ifn ? ifn : "");
    if ((res = plait_env_number("PLAIT_CMA", &v, NULL)))
        return res;
    s->cma = v == PLAIT_ENV_AUTO ? PLAIT_CMA_AUTO : v == 0 ? PLAIT_CMA_OFF : PLAIT_CMA_REQUIRE;
    /* Unset, the measured defaults (docs/performance.md, "Single-copy (CMA)"):
     * direct reads between threads pay from about 32 KiB; process_vm_readv
     * did not beat the FIFO at any size, so auto does not use it. */
    if ((res = plait_env_number("PLAIT_CMA_MIN_BYTES", &v, &is_set)))
        return res;
    if (is_set) {
        s->cma_min_bytes = s->cma_local_min_bytes = (uint64_t)v;
    } else {
        s->cma_local_min_bytes = 32 * 1024;
        s->cma_min_bytes = s->cma == PLAIT_CMA_REQUIRE ? 64 * 1024 : UINT64_MAX;
    }
    const char *hid = plait_env_get("PLAIT_HOSTID");
    if (hid && *hid)
        snprintf(s->hostid, sizeof(s->hostid), "%s", hid);
    else
        plait_host_identity(s->hostid, sizeof(s->hostid));
    return PLAIT_SUCCESS;
}

const char *plait_settings_diff(const struct plait_settings *a, const struct plait_settings *b, char *buf,
                                size_t len)
{
    if (a->nchannels != b->nchannels) {
        snprintf(buf, len, "%d vs %d", a->nchannels, b->nchannels);
        return "channel count (PLAIT_NCHANNELS, clamped by PLAIT_MIN_CTAS/PLAIT_MAX_CTAS or the config's min_ctas/max_ctas)";
    }
    if (a->nslots != b->nslots) {
        snprintf(buf, len, "%u vs %u", a->nslots, b->nslots);
        return "PLAIT_NSLOTS";
    }
    if (a->slot_bytes != b->slot_bytes) {
        snprintf(buf, len, "slot %llu vs %llu bytes", (unsigned long long)a->slot_bytes,
                 (unsigned long long)b->slot_bytes);
        return "PLAIT_BUFFSIZE";
    }
    if (a->chunk_bytes != b->chunk_bytes) {
        snprintf(buf, len, "%llu vs %llu", (unsigned long long)a->chunk_bytes, (unsigned long long)b->chunk_bytes);
        return "PLAIT_CHUNK_SIZE";
    }
    if (a->tree_radix != b->tree_radix) {
        snprintf(buf, len, "%d vs %d", a->tree_radix, b->tree_radix);
        return "PLAIT_TREE_RADIX";
    }
    if (memcmp(a->algo, b->algo, sizeof(a->algo)) != 0) {
        snprintf(buf, len, "forced algorithms differ");
        return "PLAIT_ALGO (or NCCL_ALGO)";
    }
    if (a->proto != b->proto) {
        snprintf(buf, len, "%s vs %s", a->proto ? "Simple" : "auto", b->proto ? "Simple" : "auto");
        return "PLAIT_PROTO (or NCCL_PROTO)";
    }
    if (a->tune_file_hash != b->tune_file_hash) {
        snprintf(buf, len, "rules hash %016llx vs %016llx", (unsigned long long)a->tune_file_hash,
                 (unsigned long long)b->tune_file_hash);
        return "PLAIT_TUNE_FILE";
    }
    if (a->tune_consts_hash != b->tune_consts_hash) {
        snprintf(buf, len, "constants hash %016llx vs %016llx", (unsigned long long)a->tune_consts_hash,
                 (unsigned long long)b->tune_consts_hash);
        return "PLAIT_TUNE_CONSTANTS";
    }
    if (a->cma != b->cma) {
        /* b comes from another rank's card: index only with checked values */
        static const char *const names[] = {"auto", "0", "1", "?"};
        snprintf(buf, len, "%s vs %s", names[a->cma >= 0 && a->cma < 3 ? a->cma : 3],
                 names[b->cma >= 0 && b->cma < 3 ? b->cma : 3]);
        return "PLAIT_CMA";
    }
    if (strncmp(a->net_provider, b->net_provider, sizeof(a->net_provider)) != 0) {
        snprintf(buf, len, "\"%.31s\" vs \"%.31s\"", a->net_provider, b->net_provider);
        return "PLAIT_NET_PROVIDER";
    }
    if (a->runtime_connect != b->runtime_connect) {
        snprintf(buf, len, "%d vs %d", a->runtime_connect != 0, b->runtime_connect != 0);
        return "PLAIT_RUNTIME_CONNECT (or NCCL_RUNTIME_CONNECT)";
    }
    if (a->transport_force != b->transport_force) {
        snprintf(buf, len, "%s vs %s", a->transport_force ? "socket" : "auto", b->transport_force ? "socket" : "auto");
        return "PLAIT_TRANSPORT (or NCCL_SHM_DISABLE)";
    }
    return NULL;
}
