/* plait_comm_init_from_env under plait's own variables, torchrun's, Open MPI's
 * and Slurm's, with and without a secret. Ranks are forked processes that set
 * the launcher's variables as the launcher would. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "plait.h"

/* A free TCP port on 127.0.0.1 (bound, read, released). */
static int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    bind(fd, (struct sockaddr *)&a, sizeof(a));
    socklen_t len = sizeof(a);
    getsockname(fd, (struct sockaddr *)&a, &len);
    close(fd);
    return ntohs(a.sin_port);
}

enum launcher { L_PLAIT, L_TORCHRUN, L_OMPI, L_SLURM };

struct job {
    enum launcher launcher;
    int nranks;
    int port;
    const char *secret[8]; /* per rank; NULL = none */
};

static void set_env(const struct job *j, int rank)
{
    char v[64], addr[64];
    snprintf(addr, sizeof(addr), "127.0.0.1:%d", j->port);
    setenv("PLAIT_TIMEOUT", "5", 1);
    switch (j->launcher) {
    case L_PLAIT:
        snprintf(v, sizeof(v), "%d", rank);
        setenv("PLAIT_RANK", v, 1);
        snprintf(v, sizeof(v), "%d", j->nranks);
        setenv("PLAIT_NRANKS", v, 1);
        setenv("PLAIT_COMM_ID", addr, 1);
        break;
    case L_TORCHRUN:
        snprintf(v, sizeof(v), "%d", rank);
        setenv("RANK", v, 1);
        setenv("LOCAL_RANK", v, 1);
        snprintf(v, sizeof(v), "%d", j->nranks);
        setenv("WORLD_SIZE", v, 1);
        setenv("MASTER_ADDR", "127.0.0.1", 1);
        snprintf(v, sizeof(v), "%d", j->port - 1); /* plait listens on MASTER_PORT + 1 */
        setenv("MASTER_PORT", v, 1);
        break;
    case L_OMPI:
        snprintf(v, sizeof(v), "%d", rank);
        setenv("OMPI_COMM_WORLD_RANK", v, 1);
        snprintf(v, sizeof(v), "%d", j->nranks);
        setenv("OMPI_COMM_WORLD_SIZE", v, 1);
        setenv("PLAIT_COMM_ID", addr, 1);
        break;
    case L_SLURM:
        snprintf(v, sizeof(v), "%d", rank);
        setenv("SLURM_PROCID", v, 1);
        snprintf(v, sizeof(v), "%d", j->nranks);
        setenv("SLURM_NTASKS", v, 1);
        setenv("PLAIT_COMM_ID", addr, 1);
        break;
    }
    if (j->secret[rank])
        setenv("PLAIT_SECRET", j->secret[rank], 1);
}

/* Forks the ranks; each inits from the environment and runs one allreduce.
 * Returns the number of ranks whose init or allreduce failed; codes[r] gets
 * rank r's init result. */
static int run_job(const struct job *j, int *codes)
{
    pid_t pids[8];
    int pipes[8][2];
    for (int r = 0; r < j->nranks; r++) {
        pipe(pipes[r]);
        pids[r] = fork();
        if (pids[r] == 0) {
            close(pipes[r][0]);
            set_env(j, r);
            plait_comm_t comm;
            int code = plait_comm_init_from_env(&comm, NULL);
            if (code == PLAIT_SUCCESS) {
                int x = r + 1, y = 0;
                if (plait_allreduce(&x, &y, 1, PLAIT_INT32, PLAIT_SUM, comm, NULL) != PLAIT_SUCCESS ||
                    y != j->nranks * (j->nranks + 1) / 2)
                    code = 100;
                plait_comm_destroy(comm);
            }
            write(pipes[r][1], &code, sizeof(code));
            _exit(0);
        }
        close(pipes[r][1]);
    }
    int failed = 0;
    for (int r = 0; r < j->nranks; r++) {
        int code = -1;
        if (read(pipes[r][0], &code, sizeof(code)) != sizeof(code))
            code = -1;
        close(pipes[r][0]);
        waitpid(pids[r], NULL, 0);
        codes[r] = code;
        failed += code != PLAIT_SUCCESS;
    }
    return failed;
}

static void expect_job_ok(enum launcher l, int nranks, const char *secret)
{
    struct job j = {.launcher = l, .nranks = nranks, .port = free_port()};
    for (int r = 0; r < nranks; r++)
        j.secret[r] = secret;
    int codes[8];
    int failed = run_job(&j, codes);
    cr_assert_eq(failed, 0, "launcher %d: %d ranks failed (rank 0 code %d, rank 1 code %d)", l, failed, codes[0],
                 codes[1]);
}

Test(init_env, plait_variables, .timeout = 60)
{
    expect_job_ok(L_PLAIT, 3, "s3cr3t");
}

Test(init_env, torchrun_variables_use_master_port_plus_one, .timeout = 60)
{
    expect_job_ok(L_TORCHRUN, 3, "s3cr3t");
}

Test(init_env, open_mpi_variables, .timeout = 60)
{
    expect_job_ok(L_OMPI, 2, "s3cr3t");
}

Test(init_env, slurm_variables_unauthenticated, .timeout = 60)
{
    expect_job_ok(L_SLURM, 2, NULL);
}

Test(init_env, a_rank_with_another_secret_is_refused, .timeout = 60)
{
    struct job j = {.launcher = L_PLAIT, .nranks = 2, .port = free_port()};
    j.secret[0] = "right";
    j.secret[1] = "wrong";
    int codes[8];
    int failed = run_job(&j, codes);
    cr_assert_eq(failed, 2, "both ranks must fail (codes %d %d)", codes[0], codes[1]);
    cr_assert_neq(codes[0], PLAIT_SUCCESS);
    cr_assert_neq(codes[1], PLAIT_SUCCESS);
}

Test(init_env, no_launcher_environment)
{
    unsetenv("PLAIT_RANK");
    unsetenv("RANK");
    unsetenv("OMPI_COMM_WORLD_RANK");
    unsetenv("SLURM_PROCID");
    unsetenv("PMI_RANK");
    unsetenv("PLAIT_NRANKS");
    unsetenv("WORLD_SIZE");
    unsetenv("OMPI_COMM_WORLD_SIZE");
    unsetenv("SLURM_NTASKS");
    unsetenv("PMI_SIZE");
    plait_comm_t c;
    cr_assert_eq(plait_comm_init_from_env(&c, NULL), PLAIT_ERR_INVALID_USAGE);
    cr_assert(strstr(plait_get_last_error(NULL), "WORLD_SIZE"), "%s", plait_get_last_error(NULL));
    setenv("PLAIT_RANK", "x", 1);
    setenv("PLAIT_NRANKS", "2", 1);
    cr_assert_eq(plait_comm_init_from_env(&c, NULL), PLAIT_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(plait_get_last_error(NULL), "PLAIT_RANK"), "%s", plait_get_last_error(NULL));
}

Test(init_env, unauthenticated_bootstrap_warns, .timeout = 60)
{
    char path[] = "/tmp/plait-launch-log-XXXXXX";
    int fd = mkstemp(path);
    close(fd);
    setenv("PLAIT_DEBUG", "WARN", 1);
    setenv("PLAIT_DEBUG_FILE", path, 1);
    expect_job_ok(L_PLAIT, 2, NULL);
    FILE *f = fopen(path, "r");
    char buf[8192] = "";
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    buf[n] = '\0';
    fclose(f);
    unlink(path);
    cr_assert(strstr(buf, "unauthenticated"), "no WARN about the unauthenticated bootstrap in: %s", buf);
}

/* Without PLAIT_DEBUG the warning still reaches stderr, once per process, even
 * when the process meets the unauthenticated bootstrap twice (plait_get_unique_id
 * under PLAIT_COMM_ID, then the launch). */
Test(init_env, unauthenticated_warning_once_without_debug, .timeout = 60)
{
    struct job j = {.launcher = L_PLAIT, .nranks = 2, .port = free_port()};
    char paths[2][64];
    pid_t pids[2];
    int codes[2];
    int pipes[2][2];
    for (int r = 0; r < 2; r++) {
        snprintf(paths[r], sizeof(paths[r]), "/tmp/plait-launch-stderr-%d-%d", (int)getpid(), r);
        cr_assert_eq(pipe(pipes[r]), 0);
        pids[r] = fork();
        cr_assert_geq(pids[r], 0);
        if (pids[r] == 0) {
            close(pipes[r][0]);
            FILE *err = freopen(paths[r], "w", stderr);
            unsetenv("PLAIT_DEBUG");
            unsetenv("NCCL_DEBUG");
            unsetenv("PLAIT_DEBUG_FILE");
            set_env(&j, r);
            plait_unique_id_t id;
            int code = -2;
            if (err)
                code = plait_get_unique_id(&id);
            plait_comm_t comm;
            if (code == PLAIT_SUCCESS)
                code = plait_comm_init_from_env(&comm, NULL);
            if (code == PLAIT_SUCCESS)
                plait_comm_destroy(comm);
            write(pipes[r][1], &code, sizeof(code));
            _exit(0);
        }
        close(pipes[r][1]);
    }
    for (int r = 0; r < 2; r++) {
        if (read(pipes[r][0], &codes[r], sizeof(codes[r])) != sizeof(codes[r]))
            codes[r] = -1;
        close(pipes[r][0]);
        waitpid(pids[r], NULL, 0);
    }
    for (int r = 0; r < 2; r++) {
        FILE *f = fopen(paths[r], "r");
        char buf[8192] = "";
        size_t n = f ? fread(buf, 1, sizeof(buf) - 1, f) : 0;
        buf[n] = '\0';
        if (f)
            fclose(f);
        unlink(paths[r]);
        cr_assert_eq(codes[r], PLAIT_SUCCESS, "rank %d: code %d; stderr: %s", r, codes[r], buf);
        int count = 0;
        for (const char *p = strstr(buf, "unauthenticated"); p; p = strstr(p + 1, "unauthenticated"))
            count++;
        cr_assert_eq(count, 1, "rank %d: the warning appears %d times on stderr (expected once): %s", r, count, buf);
    }
}
