/* plait_comm_init_from_env: a communicator from the launcher's environment
 * (plait's own variables, torchrun, Open MPI, Slurm). Rank 0 hosts the root at
 * a known address; the secret comes from PLAIT_SECRET or PLAIT_SECRET_FILE. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bootstrap/bootstrap.h"
#include "core/comm.h"
#include "base/log.h"
#include "base/net.h"

/* A launcher's integer (the one parser, base/env.c): 1 and *out when set, 0
 * when unset or empty, -1 when malformed or out of range (the last-error
 * string says which variable and why). */
static int env_int(const char *name, long *out)
{
    double v = 0;
    int is_set = 0;
    if (plait_env_number(name, &v, &is_set) != PLAIT_SUCCESS)
        return -1;
    if (is_set)
        *out = (long)v;
    return is_set;
}

/* The root's address: PLAIT_COMM_ID, else MASTER_ADDR and MASTER_PORT +
 * PLAIT_PORT_OFFSET (never the TCPStore's own port). */
static plait_result_t root_address(union plait_sockaddr *addr, char *desc, size_t desc_len)
{
    const char *id = plait_env_get("PLAIT_COMM_ID");
    if (id && *id) {
        snprintf(desc, desc_len, "PLAIT_COMM_ID=%s", id);
        return plait_sock_parse_addr(id, addr);
    }
    const char *host = getenv("MASTER_ADDR");
    long port = 0, offset = 1;
    const int has_port = env_int("MASTER_PORT", &port);
    if (has_port < 0)
        return plait_error_context(PLAIT_ERR_INVALID_ARGUMENT, "plait_comm_init_from_env");
    if (!host || !*host || has_port == 0)
        return plait_error(PLAIT_ERR_INVALID_USAGE,
                           "plait_comm_init_from_env: no root address: set PLAIT_COMM_ID=host:port, or MASTER_ADDR and "
                           "MASTER_PORT");
    if (env_int("PLAIT_PORT_OFFSET", &offset) < 0)
        return plait_error_context(PLAIT_ERR_INVALID_ARGUMENT, "plait_comm_init_from_env");
    if (port + offset > 65535)
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "plait_comm_init_from_env: MASTER_PORT %ld + PLAIT_PORT_OFFSET "
                                                       "%ld is not a port",
                           port, offset);
    char hp[320];
    if (strchr(host, ':'))
        snprintf(hp, sizeof(hp), "[%s]:%ld", host, port + offset);
    else
        snprintf(hp, sizeof(hp), "%s:%ld", host, port + offset);
    snprintf(desc, desc_len, "MASTER_ADDR:MASTER_PORT+%ld = %s", offset, hp);
    return plait_sock_parse_addr(hp, addr);
}

/* The secret as 32 bytes (a hash of what the user gave), or 0 when none. */
plait_result_t plait_secret_from_env(uint8_t secret[PLAIT_SECRET_BYTES], int *has_secret)
{
    *has_secret = 0;
    const char *s = getenv("PLAIT_SECRET");
    if (s && *s) {
        plait_sha256(s, strlen(s), secret);
        *has_secret = 1;
        return PLAIT_SUCCESS;
    }
    const char *path = getenv("PLAIT_SECRET_FILE");
    if (path && *path) {
        FILE *f = fopen(path, "rb");
        if (!f)
            return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "PLAIT_SECRET_FILE=%s cannot be read: %s", path,
                               strerror(errno));
        char buf[4096];
        size_t n = fread(buf, 1, sizeof(buf), f);
        fclose(f);
        while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\r'))
            n--;
        if (n == 0)
            return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "PLAIT_SECRET_FILE=%s is empty", path);
        plait_sha256(buf, n, secret);
        *has_secret = 1;
    }
    return PLAIT_SUCCESS;
}

plait_result_t plait_comm_init_from_env(plait_comm_t *comm_out, const plait_config_t *config)
{
    static const char fn[] = "plait_comm_init_from_env";
    plait_log_configure();
    if (!comm_out)
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "%s: comm_out is NULL", fn);
    static const struct {
        const char *launcher, *rank, *size;
    } launchers[] = {
        {"plait", "PLAIT_RANK", "PLAIT_NRANKS"},
        {"torchrun", "RANK", "WORLD_SIZE"},
        {"Open MPI", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"},
        {"Slurm", "SLURM_PROCID", "SLURM_NTASKS"},
        {"PMI", "PMI_RANK", "PMI_SIZE"},
    };
    long rank = -1, size = -1;
    const char *who = NULL;
    for (size_t i = 0; i < sizeof(launchers) / sizeof(launchers[0]); i++) {
        int a = env_int(launchers[i].rank, &rank);
        if (a < 0)
            return plait_error_context(PLAIT_ERR_INVALID_ARGUMENT, "%s: %s environment", fn, launchers[i].launcher);
        int b = env_int(launchers[i].size, &size);
        if (b < 0)
            return plait_error_context(PLAIT_ERR_INVALID_ARGUMENT, "%s: %s environment", fn, launchers[i].launcher);
        if (a == 0 && b == 0)
            continue;
        if (a != 1 || b != 1)
            return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "%s: %s environment is incomplete or malformed (%s=%s, %s=%s)",
                               fn, launchers[i].launcher, launchers[i].rank,
                               getenv(launchers[i].rank) ? getenv(launchers[i].rank) : "(unset)", launchers[i].size,
                               getenv(launchers[i].size) ? getenv(launchers[i].size) : "(unset)");
        who = launchers[i].launcher;
        break;
    }
    if (!who)
        return plait_error(PLAIT_ERR_INVALID_USAGE,
                           "%s: no launcher environment found (looked for PLAIT_RANK/PLAIT_NRANKS, RANK/WORLD_SIZE, "
                           "OMPI_COMM_WORLD_RANK/SIZE, SLURM_PROCID/SLURM_NTASKS, PMI_RANK/PMI_SIZE)",
                           fn);
    if (size < 1 || rank >= size)
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "%s: rank %ld of %ld from the %s environment is out of range",
                           fn, rank, size, who);
    union plait_sockaddr addr;
    char desc[400];
    plait_result_t status = root_address(&addr, desc, sizeof(desc));
    if (status)
        return status;
    uint8_t secret[PLAIT_SECRET_BYTES];
    int has_secret = 0;
    if ((status = plait_secret_from_env(secret, &has_secret)))
        return status;
    if (!has_secret) {
        char where[sizeof(desc) + sizeof(fn) + 2];
        snprintf(where, sizeof(where), "%s: %s", fn, desc);
        plait_bootstrap_warn_unauthenticated(where);
    }
    plait_unique_id_t id;
    plait_bootstrap_uid_from_addr(&addr, has_secret ? secret : NULL, &id);
    PLAIT_INFO(PLAIT_SUBSYS_INIT, "%s: rank %ld of %ld from %s, root %s", fn, rank, size, who, desc);
    /* The same path as plait_comm_init_rank_config, with rank 0 hosting the root. */
    return plait_comm_init_internal(comm_out, (int)size, &id, (int)rank, config, rank == 0, fn);
}
