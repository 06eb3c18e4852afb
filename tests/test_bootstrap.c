/* The bootstrap: communicators formed by threads and by processes, including
 * faults (wrong secret, garbage, silent peers, missing ranks, abort). All
 * traffic stays on loopback. The TCP helpers and the crypto under it have their
 * own tests (test_net.c, test_crypto.c). */
#define _GNU_SOURCE
#include <criterion/criterion.h>

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bootstrap/bootstrap.h"
#include "base/log.h"
#include "base/net.h"
#include "base/util.h"
#include "tests/net_util.h"

#define LO "lo"

/* ---------------------------------------------------------------- helpers */

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

/* Every root thread this test started must be gone by the end of it. */
static void expect_roots_gone(double within_s)
{
    double end = plait_now() + within_s;
    while (plait_bootstrap_roots_running() > 0 && plait_now() < end)
        sleep_ms(10);
    cr_assert_eq(plait_bootstrap_roots_running(), 0, "a bootstrap root thread is still running");
}

static union plait_sockaddr uid_root(const plait_unique_id_t *id)
{
    struct plait_uid u;
    memcpy(&u, id->internal, sizeof(u));
    return u.root;
}

static const uint8_t test_secret[PLAIT_SECRET_BYTES] = "0123456789abcdef0123456789abcde";

/* ---------------------------------------------------------------- communicators of threads */

struct rank_ctx {
    plait_unique_id_t id;
    int rank;
    int nranks;
    struct plait_bootstrap_opts opts;
    size_t block; /* allgather bytes per rank; 0: init and close only */
    int rounds;
    int delay_ms;
    plait_result_t result;
    plait_result_t later_result; /* of a call after the first failure */
    char err[1024];
    double elapsed;
};

static uint8_t pattern(int rank, size_t i, int round)
{
    return (uint8_t)(rank * 131 + (int)i * 7 + round * 29 + (int)(i >> 9));
}

/* Init, allgathers and barriers as one rank; returns the first failure. Used by
 * threads and by forked processes, so it asserts nothing itself. */
static plait_result_t rank_run(struct rank_ctx *c)
{
    struct plait_bootstrap *bs = NULL;
    plait_result_t r;

    if (c->delay_ms)
        sleep_ms(c->delay_ms);
    double t0 = plait_now();
    r = plait_bootstrap_init(&c->id, c->rank, c->nranks, &c->opts, &bs);
    for (int round = 0; r == PLAIT_SUCCESS && round < c->rounds; round++) {
        if (c->block) {
            uint8_t *buf = malloc(c->block * (size_t)c->nranks);
            if (!buf)
                return PLAIT_ERR_SYSTEM;
            memset(buf, 0xee, c->block * (size_t)c->nranks);
            for (size_t i = 0; i < c->block; i++)
                buf[(size_t)c->rank * c->block + i] = pattern(c->rank, i, round);
            r = plait_bootstrap_allgather(bs, buf, c->block);
            for (int p = 0; r == PLAIT_SUCCESS && p < c->nranks; p++)
                for (size_t i = 0; i < c->block; i++)
                    if (buf[(size_t)p * c->block + i] != pattern(p, i, round)) {
                        r = plait_error(PLAIT_ERR_INTERNAL, "rank %d: wrong byte %zu of rank %d's block", c->rank,
                                        i, p);
                        break;
                    }
            free(buf);
        }
        if (r == PLAIT_SUCCESS)
            r = plait_bootstrap_barrier(bs);
    }
    if (r == PLAIT_SUCCESS) {
        int has_fds = plait_bootstrap_next_fd(bs) >= 0 && plait_bootstrap_prev_fd(bs) >= 0;
        if (c->nranks > 1 ? !has_fds : plait_bootstrap_next_fd(bs) != -1)
            r = plait_error(PLAIT_ERR_INTERNAL, "rank %d: unexpected ring fds", c->rank);
        if (memcmp(plait_bootstrap_secret(bs), ((const struct plait_uid *)(const void *)c->id.internal)->secret,
                   PLAIT_SECRET_BYTES) != 0)
            r = plait_error(PLAIT_ERR_INTERNAL, "rank %d: wrong secret", c->rank);
    }
    plait_bootstrap_close(bs);
    c->elapsed = plait_now() - t0;
    c->result = r;
    snprintf(c->err, sizeof(c->err), "%s", r == PLAIT_SUCCESS ? "" : plait_last_error_get());
    return r;
}

static void *rank_thread(void *p)
{
    rank_run(p);
    return NULL;
}

static struct rank_ctx *make_ranks(const plait_unique_id_t *id, int n, double timeout_s, size_t block, int rounds)
{
    struct rank_ctx *c = calloc((size_t)n, sizeof(*c));
    cr_assert(c);
    for (int i = 0; i < n; i++) {
        c[i].id = *id;
        c[i].rank = i;
        c[i].nranks = n;
        c[i].opts.timeout_s = timeout_s;
        c[i].opts.ifname_spec = LO;
        c[i].block = block;
        c[i].rounds = rounds;
    }
    return c;
}

static void run_threads(struct rank_ctx *c, int n)
{
    pthread_t *t = calloc((size_t)n, sizeof(*t));
    cr_assert(t);
    for (int i = 0; i < n; i++)
        cr_assert_eq(pthread_create(&t[i], NULL, rank_thread, &c[i]), 0);
    for (int i = 0; i < n; i++)
        pthread_join(t[i], NULL);
    free(t);
}

static void expect_all_ok(const struct rank_ctx *c, int n)
{
    for (int i = 0; i < n; i++)
        cr_assert_eq(c[i].result, PLAIT_SUCCESS, "rank %d: %s", c[i].rank, c[i].err);
}

static void threads_case(int n, size_t block, int rounds)
{
    plait_unique_id_t id;
    cr_assert_eq(plait_bootstrap_create_root(LO, NULL, 10, &id), PLAIT_SUCCESS, "%s", plait_last_error_get());
    struct rank_ctx *c = make_ranks(&id, n, 10, block, rounds);
    run_threads(c, n);
    expect_all_ok(c, n);
    free(c);
    expect_roots_gone(2);
}

Test(bootstrap, threads_1, .timeout = 10)
{
    threads_case(1, 64, 2);
}

Test(bootstrap, threads_2, .timeout = 10)
{
    threads_case(2, 1000, 3);
}

/* 4 MiB blocks: far beyond the socket buffers, so sends must overlap receives. */
Test(bootstrap, threads_3_large_blocks, .timeout = 20)
{
    threads_case(3, 4u << 20, 1);
}

Test(bootstrap, threads_5, .timeout = 10)
{
    threads_case(5, 4097, 3);
}

Test(bootstrap, threads_8, .timeout = 15)
{
    threads_case(8, 65536, 2);
}

/* Ranks arrive in reverse order, spread out in time. */
Test(bootstrap, threads_out_of_order, .timeout = 10)
{
    plait_unique_id_t id;
    cr_assert_eq(plait_bootstrap_create_root(LO, NULL, 10, &id), PLAIT_SUCCESS);
    struct rank_ctx *c = make_ranks(&id, 4, 10, 16, 1);
    for (int i = 0; i < 4; i++)
        c[i].delay_ms = (3 - i) * 60;
    run_threads(c, 4);
    expect_all_ok(c, 4);
    free(c);
    expect_roots_gone(2);
}

/* ---------------------------------------------------------------- communicators of processes */

/* Forks one process per rank and waits for all of them (killing any left at the
 * deadline). Returns how many exited 0. */
static int run_processes(struct rank_ctx *c, int n, double within_s)
{
    pid_t *pids = calloc((size_t)n, sizeof(*pids));
    int ok = 0, left = n;
    cr_assert(pids);
    for (int i = 0; i < n; i++) {
        pids[i] = fork();
        cr_assert_geq(pids[i], 0);
        if (pids[i] == 0) {
            plait_result_t r = rank_run(&c[i]);
            if (r != PLAIT_SUCCESS)
                fprintf(stderr, "rank %d failed: %s\n", c[i].rank, c[i].err);
            _exit(r == PLAIT_SUCCESS ? 0 : 10 + (int)r);
        }
    }
    double end = plait_now() + within_s;
    while (left > 0 && plait_now() < end) {
        for (int i = 0; i < n; i++) {
            int st;
            if (pids[i] > 0 && waitpid(pids[i], &st, WNOHANG) == pids[i]) {
                if (WIFEXITED(st) && WEXITSTATUS(st) == 0)
                    ok++;
                else
                    fprintf(stderr, "rank %d: exit status %#x\n", i, st);
                pids[i] = 0;
                left--;
            }
        }
        sleep_ms(5);
    }
    for (int i = 0; i < n; i++)
        if (pids[i] > 0) {
            kill(pids[i], SIGKILL);
            waitpid(pids[i], NULL, 0);
        }
    free(pids);
    return ok;
}

Test(bootstrap, processes_5, .timeout = 20)
{
    plait_unique_id_t id;
    cr_assert_eq(plait_bootstrap_create_root(LO, NULL, 10, &id), PLAIT_SUCCESS);
    struct rank_ctx *c = make_ranks(&id, 5, 10, 3000, 2);
    cr_assert_eq(run_processes(c, 5, 15), 5);
    free(c);
    expect_roots_gone(2);
}

/* PLAIT_COMM_ID style: no root beforehand; rank 0 starts it inside init, and
 * the processes are single-threaded when forked. Unauthenticated id. */
Test(bootstrap, processes_4_start_root, .timeout = 20)
{
    plait_unique_id_t id;
    union plait_sockaddr root = free_loopback_port();
    plait_bootstrap_uid_from_addr(&root, NULL, &id);
    struct rank_ctx *c = make_ranks(&id, 4, 10, 100, 2);
    for (int i = 0; i < 4; i++)
        c[i].opts.start_root = 1;
    c[0].delay_ms = 200; /* the others must retry until the root is up */
    cr_assert_eq(run_processes(c, 4, 15), 4);
    free(c);
}

/* ---------------------------------------------------------------- start_root, ids */

Test(bootstrap, start_root_fixed_address, .timeout = 15)
{
    plait_unique_id_t id, id2;
    union plait_sockaddr root = free_loopback_port();
    uint8_t secret[PLAIT_SECRET_BYTES];

    cr_assert_eq(plait_random_bytes(secret, sizeof(secret)), PLAIT_SUCCESS);
    plait_bootstrap_uid_from_addr(&root, secret, &id);
    plait_bootstrap_uid_from_addr(&root, secret, &id2);
    cr_assert(memcmp(&id, &id2, sizeof(id)) == 0, "uids from the same address and secret are identical");

    struct rank_ctx *c = make_ranks(&id, 4, 10, 512, 2);
    for (int i = 0; i < 4; i++) {
        c[i].opts.start_root = 1;
        c[i].opts.ifname_spec = NULL; /* listen where the root connection goes: loopback */
    }
    c[0].delay_ms = 250;
    run_threads(c, 4);
    expect_all_ok(c, 4);
    free(c);
    expect_roots_gone(2);

    /* One rank with start_root: no root, no sockets. */
    c = make_ranks(&id, 1, 10, 8, 1);
    c[0].opts.start_root = 1;
    run_threads(c, 1);
    expect_all_ok(c, 1);
    cr_assert_eq(plait_bootstrap_roots_running(), 0);
    free(c);
}

Test(bootstrap, unauthenticated_uid, .timeout = 10)
{
    plait_unique_id_t a, b;
    union plait_sockaddr root = parse("127.0.0.1:29500");
    plait_bootstrap_uid_from_addr(&root, NULL, &a);
    plait_bootstrap_uid_from_addr(&root, NULL, &b);
    cr_assert(memcmp(&a, &b, sizeof(a)) == 0);
    const struct plait_uid *u = (const void *)a.internal;
    cr_assert_eq(u->is_authenticated, 0);
    cr_assert_eq(u->magic, PLAIT_UID_MAGIC);
    uint8_t zero[PLAIT_SECRET_BYTES] = {0};
    cr_assert(memcmp(u->secret, zero, sizeof(zero)) != 0);

    plait_unique_id_t r;
    cr_assert_eq(plait_bootstrap_create_root(LO, NULL, 0.3, &r), PLAIT_SUCCESS);
    const struct plait_uid *ur = (const void *)r.internal;
    cr_assert_eq(ur->is_authenticated, 1);
    cr_assert_neq(ur->nonce, 0);
    expect_roots_gone(3); /* nobody came: the root gives up on its own */
}

Test(bootstrap, invalid_arguments, .timeout = 10)
{
    plait_unique_id_t id;
    struct plait_bootstrap *bs = NULL;
    struct plait_bootstrap_opts opts = {.timeout_s = 1, .ifname_spec = LO};
    union plait_sockaddr root = parse("127.0.0.1:1");

    plait_bootstrap_uid_from_addr(&root, test_secret, &id);
    cr_assert_eq(plait_bootstrap_init(&id, 2, 2, &opts, &bs), PLAIT_ERR_INVALID_ARGUMENT);
    cr_assert_eq(plait_bootstrap_init(&id, -1, 2, &opts, &bs), PLAIT_ERR_INVALID_ARGUMENT);
    cr_assert_eq(plait_bootstrap_init(&id, 0, 0, &opts, &bs), PLAIT_ERR_INVALID_ARGUMENT);
    cr_assert_eq(plait_bootstrap_init(NULL, 0, 1, &opts, &bs), PLAIT_ERR_INVALID_ARGUMENT);
    cr_assert_eq(plait_bootstrap_init(&id, 0, 1, &opts, NULL), PLAIT_ERR_INVALID_ARGUMENT);
    plait_unique_id_t junk;
    memset(&junk, 0x5a, sizeof(junk));
    cr_assert_eq(plait_bootstrap_init(&junk, 0, 1, &opts, &bs), PLAIT_ERR_INVALID_ARGUMENT);
    cr_assert(bs == NULL);
    cr_assert_eq(plait_bootstrap_allgather(NULL, NULL, 0), PLAIT_ERR_INVALID_ARGUMENT);
    cr_assert_eq(plait_bootstrap_barrier(NULL), PLAIT_ERR_INVALID_ARGUMENT);
    plait_bootstrap_close(NULL);
}

/* ---------------------------------------------------------------- faults */

/* Log WARNs to a file so a test can check that rejected peers are named. */
static void log_to_file(char *path, size_t len)
{
    snprintf(path, len, "/tmp/plait_test_bootstrap_%d.log", (int)getpid());
    unlink(path);
    setenv("PLAIT_DEBUG", "WARN", 1);
    setenv("PLAIT_DEBUG_FILE", path, 1);
    plait_log_configure();
}

static char *read_file(const char *path)
{
    FILE *f = fopen(path, "r");
    static char buf[1 << 16];
    size_t n = f ? fread(buf, 1, sizeof(buf) - 1, f) : 0;
    buf[n] = '\0';
    if (f)
        fclose(f);
    return buf;
}

Test(bootstrap, wrong_secret_refused, .timeout = 15)
{
    plait_unique_id_t id, bad;
    cr_assert_eq(plait_bootstrap_create_root(LO, NULL, 10, &id), PLAIT_SUCCESS);
    bad = id;
    ((struct plait_uid *)(void *)bad.internal)->secret[0] ^= 0xff;

    /* An impostor holding the wrong secret claims rank 1 first. */
    struct rank_ctx *imp = make_ranks(&bad, 3, 3, 8, 1);
    imp[1].rank = 1;
    rank_run(&imp[1]);
    cr_assert_eq(imp[1].result, PLAIT_ERR_REMOTE, "%s", imp[1].err);
    cr_assert(strstr(imp[1].err, "authentication failed") != NULL, "%s", imp[1].err);

    /* A raw client with the wrong secret, connected while the ranks arrive. */
    union plait_sockaddr root = uid_root(&id);
    int fd;
    cr_assert_eq(plait_sock_connect(&root, plait_deadline(2), NULL, &fd), PLAIT_SUCCESS);

    struct rank_ctx *c = make_ranks(&id, 3, 10, 256, 2);
    cr_assert_eq(plait_sock_auth_client(fd, ((struct plait_uid *)(void *)bad.internal)->secret, plait_deadline(2),
                                        NULL),
                 PLAIT_ERR_REMOTE);
    close(fd);
    run_threads(c, 3);
    expect_all_ok(c, 3);
    free(c);
    free(imp);
    expect_roots_gone(2);
}

Test(bootstrap, garbage_and_silent_peers, .timeout = 15)
{
    char logpath[128];
    plait_unique_id_t id;
    log_to_file(logpath, sizeof(logpath));
    cr_assert_eq(plait_bootstrap_create_root(LO, NULL, 10, &id), PLAIT_SUCCESS);
    union plait_sockaddr root = uid_root(&id);

    /* 4 KiB of random bytes, connection kept open. */
    int garbage, empty, silent, authed;
    uint8_t junk[4096];
    cr_assert_eq(plait_random_bytes(junk, sizeof(junk)), PLAIT_SUCCESS);
    cr_assert_eq(plait_sock_connect(&root, plait_deadline(2), NULL, &garbage), PLAIT_SUCCESS);
    plait_sock_send_all(garbage, junk, sizeof(junk), plait_deadline(2), NULL); /* may fail once dropped */
    /* Connects, sends nothing, closes. */
    cr_assert_eq(plait_sock_connect(&root, plait_deadline(2), NULL, &empty), PLAIT_SUCCESS);
    close(empty);
    /* Connects and stays silent through the whole formation: must not stall it. */
    cr_assert_eq(plait_sock_connect(&root, plait_deadline(2), NULL, &silent), PLAIT_SUCCESS);
    /* Holds the secret but sends a garbage hello: told so and dropped. */
    cr_assert_eq(plait_sock_connect(&root, plait_deadline(2), NULL, &authed), PLAIT_SUCCESS);
    cr_assert_eq(plait_sock_auth_client(authed, ((struct plait_uid *)(void *)id.internal)->secret,
                                        plait_deadline(2), NULL),
                 PLAIT_SUCCESS);
    cr_assert_eq(plait_sock_send_all(authed, junk, 48, plait_deadline(2), NULL), PLAIT_SUCCESS);
    uint8_t reply[64];
    cr_assert_eq(plait_sock_recv_all(authed, reply, 40, plait_deadline(2), NULL), PLAIT_SUCCESS);
    cr_assert_eq(plait_sock_recv_all(authed, reply, 1, plait_deadline(2), NULL), PLAIT_ERR_REMOTE, "then closed");
    close(authed);

    double t0 = plait_now();
    struct rank_ctx *c = make_ranks(&id, 3, 10, 100, 2);
    run_threads(c, 3);
    expect_all_ok(c, 3);
    cr_assert(plait_now() - t0 < 5, "formation stalled for %.1f s", plait_now() - t0);
    free(c);
    close(garbage);
    close(silent);
    expect_roots_gone(2);

    const char *log = read_file(logpath);
    unlink(logpath);
    cr_assert(strstr(log, "dropped connection from 127.0.0.1:") != NULL, "log: %s", log);
    cr_assert(strstr(log, "rejected registration from 127.0.0.1:") != NULL, "log: %s", log);
}

/* A wrong nranks is turned away and the job forms without it; a rank registered
 * twice fails the whole job at once (the root cannot tell which is real),
 * including the rank registered first and ranks that come later. */
Test(bootstrap, duplicate_and_mismatched_ranks, .timeout = 15)
{
    plait_unique_id_t id;
    cr_assert_eq(plait_bootstrap_create_root(LO, NULL, 3, &id), PLAIT_SUCCESS);
    struct rank_ctx *c = make_ranks(&id, 3, 10, 64, 1);
    pthread_t t1;
    cr_assert_eq(pthread_create(&t1, NULL, rank_thread, &c[1]), 0);
    sleep_ms(300); /* rank 1 has registered */

    struct rank_ctx *mis = make_ranks(&id, 4, 5, 0, 0);
    rank_run(&mis[2]);
    cr_assert_eq(mis[2].result, PLAIT_ERR_INVALID_USAGE, "%s", mis[2].err);
    cr_assert(strstr(mis[2].err, "nranks") != NULL, "%s", mis[2].err);

    struct rank_ctx *dup = make_ranks(&id, 3, 5, 0, 0);
    rank_run(&dup[1]);
    cr_assert_eq(dup[1].result, PLAIT_ERR_INVALID_USAGE, "%s", dup[1].err);
    cr_assert(strstr(dup[1].err, "registered twice") != NULL, "%s", dup[1].err);
    cr_assert(dup[1].elapsed < 2);
    pthread_join(t1, NULL);
    cr_assert_eq(c[1].result, PLAIT_ERR_INVALID_USAGE, "the first registration fails too: %s", c[1].err);
    cr_assert(strstr(c[1].err, "registered twice") != NULL, "%s", c[1].err);

    run_threads(c, 1); /* rank 0, after the failure: told at once */
    cr_assert_eq(c[0].result, PLAIT_ERR_INVALID_USAGE, "%s", c[0].err);
    cr_assert(strstr(c[0].err, "registered twice") != NULL, "%s", c[0].err);
    cr_assert(c[0].elapsed < 2, "rank 0 took %.2f s", c[0].elapsed);
    free(c);
    free(dup);
    free(mis);
    expect_roots_gone(6);
}

Test(bootstrap, missing_rank_times_out, .timeout = 15)
{
    plait_unique_id_t id;
    cr_assert_eq(plait_bootstrap_create_root(LO, NULL, 2, &id), PLAIT_SUCCESS);
    struct rank_ctx *c = make_ranks(&id, 4, 2, 8, 1);
    run_threads(c, 3); /* rank 3 never comes */
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(c[i].result, PLAIT_ERR_TIMEOUT, "rank %d: %s", i, c[i].err);
        cr_assert(c[i].elapsed > 1.0 && c[i].elapsed < 3.5, "rank %d took %.2f s", i, c[i].elapsed);
    }
    free(c);
    expect_roots_gone(3);
}

struct abort_run {
    struct rank_ctx *c;
    double raised_at;
};

Test(bootstrap, abort_during_init, .timeout = 15)
{
    plait_unique_id_t id;
    int flag = 0;
    cr_assert_eq(plait_bootstrap_create_root(LO, NULL, 1, &id), PLAIT_SUCCESS);
    struct rank_ctx *c = make_ranks(&id, 2, 0, 8, 1); /* no deadline: only the flag ends the wait */
    c[0].opts.abort_flag = &flag;
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, rank_thread, &c[0]), 0);
    sleep_ms(300);
    double raised = plait_now();
    __atomic_store_n(&flag, 1, __ATOMIC_RELEASE);
    pthread_join(t, NULL);
    double late = plait_now() - raised;
    cr_assert_eq(c[0].result, PLAIT_ERR_REMOTE, "%s", c[0].err);
    cr_assert(strstr(c[0].err, "abort") != NULL, "%s", c[0].err);
    cr_assert(late < 0.5, "init returned %.3f s after the flag", late);
    free(c);
    expect_roots_gone(3);
}

/* Rank 0 waits in a barrier its peer never enters; the flag frees it. */
static void *init_then_barrier(void *p)
{
    struct rank_ctx *c = p;
    struct plait_bootstrap *bs = NULL;
    c->result = plait_bootstrap_init(&c->id, c->rank, c->nranks, &c->opts, &bs);
    if (c->result == PLAIT_SUCCESS && c->rank == 0)
        c->result = plait_bootstrap_barrier(bs);
    else if (c->result == PLAIT_SUCCESS)
        sleep_ms(1500); /* alive but not in the barrier */
    snprintf(c->err, sizeof(c->err), "%s", plait_last_error_get());
    plait_bootstrap_close(bs);
    return NULL;
}

Test(bootstrap, abort_during_barrier, .timeout = 15)
{
    plait_unique_id_t id;
    int flag = 0;
    cr_assert_eq(plait_bootstrap_create_root(LO, NULL, 10, &id), PLAIT_SUCCESS);
    struct rank_ctx *c = make_ranks(&id, 2, 0, 0, 0);
    c[0].opts.abort_flag = &flag;
    pthread_t t[2];
    for (int i = 0; i < 2; i++)
        cr_assert_eq(pthread_create(&t[i], NULL, init_then_barrier, &c[i]), 0);
    sleep_ms(500);
    double raised = plait_now();
    __atomic_store_n(&flag, 1, __ATOMIC_RELEASE);
    pthread_join(t[0], NULL);
    double late = plait_now() - raised;
    pthread_join(t[1], NULL);
    cr_assert_eq(c[0].result, PLAIT_ERR_REMOTE, "%s", c[0].err);
    cr_assert(strstr(c[0].err, "abort") != NULL, "%s", c[0].err);
    cr_assert(late < 0.5, "barrier returned %.3f s after the flag", late);
    cr_assert_eq(c[1].result, PLAIT_SUCCESS, "%s", c[1].err);
    free(c);
    expect_roots_gone(2);
}

/* Ranks passing different sizes fail with a message, not by misreading bytes;
 * a dead neighbour is an error, not a hang. */
static void *init_allgather_size(void *p)
{
    struct rank_ctx *c = p;
    struct plait_bootstrap *bs = NULL;
    uint8_t buf[64] = {0};
    c->result = plait_bootstrap_init(&c->id, c->rank, c->nranks, &c->opts, &bs);
    if (c->result == PLAIT_SUCCESS)
        c->result = plait_bootstrap_allgather(bs, buf, c->block);
    snprintf(c->err, sizeof(c->err), "%s", plait_last_error_get());
    if (c->result != PLAIT_SUCCESS && bs)
        c->later_result = plait_bootstrap_barrier(bs);
    plait_bootstrap_close(bs);
    return NULL;
}

Test(bootstrap, allgather_size_mismatch, .timeout = 15)
{
    plait_unique_id_t id;
    cr_assert_eq(plait_bootstrap_create_root(LO, NULL, 10, &id), PLAIT_SUCCESS);
    struct rank_ctx *c = make_ranks(&id, 2, 5, 8, 1);
    c[1].block = 16;
    pthread_t t[2];
    for (int i = 0; i < 2; i++)
        cr_assert_eq(pthread_create(&t[i], NULL, init_allgather_size, &c[i]), 0);
    for (int i = 0; i < 2; i++)
        pthread_join(t[i], NULL);
    for (int i = 0; i < 2; i++) {
        cr_assert_eq(c[i].result, PLAIT_ERR_INVALID_USAGE, "rank %d: %s", i, c[i].err);
        cr_assert(strstr(c[i].err, "disagree") != NULL, "%s", c[i].err);
        cr_assert_eq(c[i].later_result, PLAIT_ERR_INVALID_USAGE, "the ring is marked broken");
    }
    free(c);
    expect_roots_gone(2);
}

/* Rank 0 started the root itself and is aborted: the root stops with it (not at
 * some timeout, and without one: never), and tells the ranks already there. */
Test(bootstrap, aborted_start_root_stops_root, .timeout = 15)
{
    plait_unique_id_t id;
    int flag = 0;
    union plait_sockaddr root = free_loopback_port();
    plait_bootstrap_uid_from_addr(&root, test_secret, &id);
    struct rank_ctx *c = make_ranks(&id, 3, 0, 8, 1); /* no deadlines at all */
    for (int i = 0; i < 3; i++)
        c[i].opts.start_root = 1;
    c[0].opts.abort_flag = &flag;
    pthread_t t[2];
    for (int i = 0; i < 2; i++)
        cr_assert_eq(pthread_create(&t[i], NULL, rank_thread, &c[i]), 0);
    sleep_ms(300);
    __atomic_store_n(&flag, 1, __ATOMIC_RELEASE);
    double raised = plait_now();
    for (int i = 0; i < 2; i++)
        pthread_join(t[i], NULL);
    cr_assert(plait_now() - raised < 1.0, "ranks returned %.2f s after the flag", plait_now() - raised);
    cr_assert_eq(c[0].result, PLAIT_ERR_REMOTE, "%s", c[0].err);
    cr_assert(strstr(c[0].err, "abort") != NULL, "%s", c[0].err);
    cr_assert_eq(c[1].result, PLAIT_ERR_REMOTE, "%s", c[1].err);
    cr_assert(strstr(c[1].err, "stopped") != NULL, "%s", c[1].err);
    free(c);
    expect_roots_gone(0.5);
}

/* The same over IPv6 loopback, with ranks listening where their root connection goes. */
Test(bootstrap, threads_ipv6, .timeout = 10)
{
    plait_unique_id_t id;
    union plait_sockaddr any6 = parse("[::1]:0");
    int fd = -1;
    if (plait_sock_listen(&any6, &fd) != PLAIT_SUCCESS)
        cr_skip_test("no IPv6 loopback here");
    close(fd);
    cr_assert_eq(plait_bootstrap_create_root(NULL, &any6, 10, &id), PLAIT_SUCCESS, "%s", plait_last_error_get());
    union plait_sockaddr r = uid_root(&id);
    cr_assert_eq(r.sa.sa_family, AF_INET6);
    struct rank_ctx *c = make_ranks(&id, 3, 10, 777, 2);
    for (int i = 0; i < 3; i++)
        c[i].opts.ifname_spec = NULL;
    run_threads(c, 3);
    expect_all_ok(c, 3);
    free(c);
    expect_roots_gone(2);
}

/* A death notice sent from another thread while this rank's ring allgather
 * is in the middle of a step (its block is half sent: the successor reads
 * late) goes between two steps, never inside the step's bytes: the
 * successor fails naming the dead rank, and never misreads the ring. */
struct notice_mid_ctx {
    struct rank_ctx rc;
    struct plait_bootstrap *bs;
    int in_allgather; /* rank 0: set just before its allgather */
};

#define NOTICE_MID_BLOCK (24u << 20) /* more than loopback's socket buffers hold */

static void *notice_mid_rank(void *p)
{
    struct notice_mid_ctx *m = p;
    struct rank_ctx *c = &m->rc;
    c->result = plait_bootstrap_init(&c->id, c->rank, c->nranks, &c->opts, &m->bs);
    if (c->result != PLAIT_SUCCESS) {
        snprintf(c->err, sizeof(c->err), "%s", plait_last_error_get());
        __atomic_store_n(&m->in_allgather, -1, __ATOMIC_RELEASE);
        return NULL;
    }
    uint8_t *buf = malloc(NOTICE_MID_BLOCK * (size_t)c->nranks);
    if (!buf) {
        c->result = PLAIT_ERR_SYSTEM;
        return NULL;
    }
    for (size_t i = 0; i < NOTICE_MID_BLOCK; i++)
        buf[(size_t)c->rank * NOTICE_MID_BLOCK + i] = pattern(c->rank, i, 0);
    if (c->rank == 1)
        sleep_ms(400); /* rank 0's block waits, half sent, for this rank to read it */
    __atomic_store_n(&m->in_allgather, 1, __ATOMIC_RELEASE);
    c->result = plait_bootstrap_allgather(m->bs, buf, NOTICE_MID_BLOCK);
    for (int p = 0; c->result == PLAIT_SUCCESS && p < c->nranks; p++)
        for (size_t i = 0; i < NOTICE_MID_BLOCK; i++)
            if (buf[(size_t)p * NOTICE_MID_BLOCK + i] != pattern(p, i, 0)) {
                c->result = plait_error(PLAIT_ERR_INTERNAL, "rank %d: wrong byte %zu of rank %d's block", c->rank,
                                        i, p);
                break;
            }
    snprintf(c->err, sizeof(c->err), "%s", c->result == PLAIT_SUCCESS ? "" : plait_last_error_get());
    free(buf);
    return NULL;
}

Test(bootstrap, notice_from_another_thread_mid_step, .timeout = 40)
{
    plait_unique_id_t id;
    cr_assert_eq(plait_bootstrap_create_root(LO, NULL, 10, &id), PLAIT_SUCCESS, "%s", plait_last_error_get());
    enum { N = 3 };
    struct rank_ctx *base = make_ranks(&id, N, 10, 0, 0);
    struct notice_mid_ctx m[N];
    memset(m, 0, sizeof(m));
    pthread_t t[N];
    for (int i = 0; i < N; i++) {
        m[i].rc = base[i];
        cr_assert_eq(pthread_create(&t[i], NULL, notice_mid_rank, &m[i]), 0);
    }
    /* Rank 0's other thread: rank 2 died, it says, while rank 0's step is
     * under way. */
    double until = plait_deadline(20);
    while (__atomic_load_n(&m[0].in_allgather, __ATOMIC_ACQUIRE) == 0 && !plait_deadline_passed(until))
        sleep_ms(1);
    if (__atomic_load_n(&m[0].in_allgather, __ATOMIC_ACQUIRE) == 1) {
        sleep_ms(150);
        plait_bootstrap_notify_death(m[0].bs, 2);
    }
    for (int i = 0; i < N; i++)
        pthread_join(t[i], NULL);
    /* Rank 1, the notifier's successor: the right data (the notice came
     * after its walk) or an error naming rank 2, never a misread ring; and
     * the notice is not lost (a send into the half-full socket once dropped
     * it). */
    cr_assert(m[1].rc.result == PLAIT_SUCCESS ||
                  (m[1].rc.result == PLAIT_ERR_REMOTE && strstr(m[1].rc.err, "rank 2 died") != NULL),
              "rank 1: %d: %s", (int)m[1].rc.result, m[1].rc.err);
    if (m[1].rc.result == PLAIT_SUCCESS) {
        int culprit = -1, from = -1, heard = 0;
        until = plait_deadline(5);
        while (!(heard = plait_bootstrap_poll_notices(m[1].bs, &culprit, &from)) && !plait_deadline_passed(until))
            sleep_ms(5);
        cr_assert(heard && culprit == 2 && from == 0,
                  "rank 1 finished its allgather and never heard rank 0's notice that rank 2 died (heard %d: %d from %d)",
                  heard, culprit, from);
    }
    cr_assert_eq(m[0].rc.result == PLAIT_SUCCESS, m[1].rc.result == PLAIT_SUCCESS, "rank 0: %s; rank 1: %s",
                 m[0].rc.err, m[1].rc.err);
    cr_log_info("rank 0: %s; rank 1: %s", m[0].rc.result ? m[0].rc.err : "ok", m[1].rc.result ? m[1].rc.err : "ok");
    for (int i = 0; i < N; i++)
        plait_bootstrap_close(m[i].bs);
    free(base);
    expect_roots_gone(2);
}
