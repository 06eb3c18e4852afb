#define _GNU_SOURCE
#include "tests/harness.h"

#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/select.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MSG_BYTES 1024

const char *mr_mode_name(enum mr_mode mode)
{
    return mode == MR_THREADS ? "threads" : mode == MR_SHM ? "shm" : "socket";
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

struct thread_arg {
    plait_comm_t comm;
    int rank, nranks;
    mr_fn fn;
    void *arg;
    int result;
    char msg[MSG_BYTES];
};

static void *thread_main(void *p)
{
    struct thread_arg *a = p;
    a->result = a->fn(a->comm, a->rank, a->nranks, a->arg, a->msg, sizeof(a->msg));
    return NULL;
}

static int run_threads(int nranks, mr_fn fn, void *arg, char *msg, size_t msglen, int owned)
{
    plait_comm_t *comms = calloc((size_t)nranks, sizeof(*comms));
    struct thread_arg *args = calloc((size_t)nranks, sizeof(*args));
    pthread_t *th = calloc((size_t)nranks, sizeof(*th));
    int failed = 0;
    plait_result_t r = plait_comm_init_all(comms, nranks, NULL);
    if (r != PLAIT_SUCCESS) {
        snprintf(msg, msglen, "plait_comm_init_all(%d): %s: %s", nranks, plait_get_error_string(r),
                 plait_get_last_error(NULL));
        failed = nranks;
        goto out;
    }
    for (int i = 0; i < nranks; i++) {
        args[i] = (struct thread_arg){.comm = comms[i], .rank = i, .nranks = nranks, .fn = fn, .arg = arg};
        pthread_create(&th[i], NULL, thread_main, &args[i]);
    }
    for (int i = 0; i < nranks; i++)
        pthread_join(th[i], NULL);
    for (int i = 0; i < nranks; i++) {
        if (args[i].result) {
            if (!failed)
                snprintf(msg, msglen, "rank %d: %s", i, args[i].msg);
            failed++;
        }
        if (!owned)
            plait_comm_destroy(comms[i]);
    }
out:
    free(comms);
    free(args);
    free(th);
    return failed;
}

/* The unique id reaches forked ranks through a pipe, written after every fork:
 * plait_get_unique_id starts the root's thread, and forking while a thread may
 * hold an allocator lock (ASan's has no fork handler) would hang the child. */
static int id_pipe_open(int fds[2])
{
    return pipe(fds);
}

/* Parent, after the forks: makes the id and sends one copy per child (128-byte
 * writes are atomic on a pipe). Closes the write end in any case, so a child
 * waiting for an id that never comes reads EOF. */
static plait_result_t id_pipe_send(int fds[2], int nchildren, plait_unique_id_t *id_out)
{
    close(fds[0]);
    plait_result_t r = plait_get_unique_id(id_out);
    for (int i = 0; r == PLAIT_SUCCESS && i < nchildren; i++)
        if (write(fds[1], id_out, sizeof(*id_out)) != (ssize_t)sizeof(*id_out))
            r = PLAIT_ERR_SYSTEM;
    close(fds[1]);
    return r;
}

/* Child: reads its copy of the id; returns 0 on success. */
static int id_pipe_recv(int fds[2], plait_unique_id_t *id)
{
    close(fds[1]);
    size_t got = 0;
    while (got < sizeof(*id)) {
        ssize_t n = read(fds[0], (char *)id + got, sizeof(*id) - got);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return -1;
        got += (size_t)n;
    }
    close(fds[0]);
    return 0;
}

static int run_procs(enum mr_mode mode, int nranks, mr_fn fn, void *arg, double timeout_s, char *msg,
                     size_t msglen, int owned)
{
    plait_unique_id_t id;
    int idp[2];
    if (id_pipe_open(idp) != 0) {
        snprintf(msg, msglen, "pipe: %s", strerror(errno));
        return nranks;
    }
    char *shared = mmap(NULL, (size_t)nranks * MSG_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    pid_t *pids = calloc((size_t)nranks, sizeof(pid_t));
    for (int i = 0; i < nranks; i++) {
        pid_t pid = fork();
        if (pid == 0) {
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            if (mode == MR_SOCKET)
                setenv("PLAIT_TRANSPORT", "socket", 1);
            char *m = shared + (size_t)i * MSG_BYTES;
            if (id_pipe_recv(idp, &id) != 0) {
                snprintf(m, MSG_BYTES, "no unique id from the parent");
                _exit(2);
            }
            plait_comm_t comm;
            plait_result_t res = plait_comm_init_rank(&comm, nranks, id, i);
            if (res != PLAIT_SUCCESS) {
                snprintf(m, MSG_BYTES, "init: %s: %s", plait_get_error_string(res), plait_get_last_error(NULL));
                _exit(2);
            }
            int rc = fn(comm, i, nranks, arg, m, MSG_BYTES);
            if (!owned)
                plait_comm_destroy(comm);
            _exit(rc ? 1 : 0);
        }
        pids[i] = pid;
        if (pid > 0)
            mr_note_child(pid);
    }
    {
        plait_result_t r = id_pipe_send(idp, nranks, &id);
        if (r != PLAIT_SUCCESS)
            snprintf(msg, msglen, "plait_get_unique_id: %s: %s", plait_get_error_string(r),
                     plait_get_last_error(NULL));
    }
    int failed = 0, left = nranks;
    double deadline = now_s() + timeout_s;
    while (left > 0) {
        int status;
        pid_t p = waitpid(-1, &status, WNOHANG);
        if (p > 0) {
            for (int i = 0; i < nranks; i++) {
                if (pids[i] != p)
                    continue;
                pids[i] = 0;
                left--;
                int ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
                if (!ok) {
                    if (!failed) {
                        char *m = shared + (size_t)i * MSG_BYTES;
                        m[MSG_BYTES - 1] = '\0';
                        if (WIFSIGNALED(status))
                            snprintf(msg, msglen, "rank %d killed by signal %d", i, WTERMSIG(status));
                        else
                            snprintf(msg, msglen, "rank %d (exit %d): %s", i, WEXITSTATUS(status), m);
                    }
                    failed++;
                }
            }
            continue;
        }
        if (now_s() > deadline) {
            for (int i = 0; i < nranks; i++)
                if (pids[i] > 0) {
                    kill(pids[i], SIGKILL);
                    waitpid(pids[i], NULL, 0);
                    if (!failed)
                        snprintf(msg, msglen, "rank %d did not finish within %.0f s", i, timeout_s);
                    failed++;
                    left--;
                }
            break;
        }
        usleep(2000);
    }
    munmap(shared, (size_t)nranks * MSG_BYTES);
    free(pids);
    return failed;
}

int mr_run(enum mr_mode mode, int nranks, mr_fn fn, void *arg, double timeout_s, char *msg, size_t msglen)
{
    msg[0] = '\0';
    if (mode == MR_THREADS)
        return run_threads(nranks, fn, arg, msg, msglen, 0);
    return run_procs(mode, nranks, fn, arg, timeout_s, msg, msglen, 0);
}

int mr_run_owned(enum mr_mode mode, int nranks, mr_fn fn, void *arg, double timeout_s, char *msg, size_t msglen)
{
    msg[0] = '\0';
    if (mode == MR_THREADS)
        return run_threads(nranks, fn, arg, msg, msglen, 1);
    return run_procs(mode, nranks, fn, arg, timeout_s, msg, msglen, 1);
}

int mr_count_shm_leftovers(void)
{
    DIR *d = opendir("/dev/shm");
    if (!d)
        return 0;
    int n = 0;
    struct dirent *e;
    char prefix[64];
    snprintf(prefix, sizeof(prefix), "plait-");
    while ((e = readdir(d)))
        if (strncmp(e->d_name, prefix, strlen(prefix)) == 0)
            n++;
    closedir(d);
    return n;
}

/* ---------------------------------------------------------------- processes that make their own communicator */

double mr_now(void)
{
    return now_s();
}

void mr_sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

int mr_names_rank(const char *text, int r)
{
    char pat[32];
    int n = snprintf(pat, sizeof(pat), "rank %d", r);
    for (const char *p = strstr(text, pat); p; p = strstr(p + 1, pat))
        if (p[n] < '0' || p[n] > '9')
            return 1;
    return 0;
}

#define MAX_NOTED 4096
static pid_t noted_pids[MAX_NOTED];
static int n_noted;
static pthread_mutex_t noted_lock = PTHREAD_MUTEX_INITIALIZER;

void mr_note_child(pid_t pid)
{
    pthread_mutex_lock(&noted_lock);
    if (n_noted < MAX_NOTED)
        noted_pids[n_noted++] = pid;
    pthread_mutex_unlock(&noted_lock);
}

static int is_noted(pid_t pid)
{
    int found = pid == getpid();
    pthread_mutex_lock(&noted_lock);
    for (int i = 0; i < n_noted && !found; i++)
        found = noted_pids[i] == pid;
    pthread_mutex_unlock(&noted_lock);
    return found;
}

struct mr_procs {
    int nranks;
    pid_t *pids;     /* 0 once reaped */
    int *status;     /* wait status once reaped */
    int *killed_sig; /* signal sent by mr_procs_kill, 0 if none */
    char *msgs;      /* nranks * MSG_BYTES, shared */
    void *shared;
    size_t shared_bytes;
    int ready_rd;
    int ready_got;
};

struct mr_procs *mr_procs_start(int nranks, mr_child_fn fn, void *arg, size_t shared_bytes, unsigned flags, char *msg,
                                size_t msglen)
{
    msg[0] = '\0';
    struct mr_procs *p = calloc(1, sizeof(*p));
    if (!p) {
        snprintf(msg, msglen, "out of memory");
        return NULL;
    }
    p->nranks = nranks;
    p->pids = calloc((size_t)nranks, sizeof(pid_t));
    p->status = calloc((size_t)nranks, sizeof(int));
    p->killed_sig = calloc((size_t)nranks, sizeof(int));
    p->ready_rd = -1;
    p->shared_bytes = shared_bytes ? shared_bytes : 64;
    p->msgs = mmap(NULL, (size_t)nranks * MSG_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    p->shared = mmap(NULL, p->shared_bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (!p->pids || !p->status || !p->killed_sig || p->msgs == MAP_FAILED || p->shared == MAP_FAILED) {
        snprintf(msg, msglen, "out of memory");
        if (p->msgs == MAP_FAILED)
            p->msgs = NULL;
        if (p->shared == MAP_FAILED)
            p->shared = NULL;
        mr_procs_free(p);
        return NULL;
    }
    plait_unique_id_t id;
    memset(&id, 0, sizeof(id));
    const int wants_id = !(flags & MR_PROCS_NO_ID);
    int idp[2] = {-1, -1};
    if (wants_id && id_pipe_open(idp) != 0) {
        snprintf(msg, msglen, "pipe: %s", strerror(errno));
        mr_procs_free(p);
        return NULL;
    }
    int fds[2];
    if (pipe(fds) != 0) {
        snprintf(msg, msglen, "pipe: %s", strerror(errno));
        mr_procs_free(p);
        return NULL;
    }
    p->ready_rd = fds[0];
    const pid_t parent = getpid();
    for (int i = 0; i < nranks; i++) {
        pid_t pid = fork();
        if (pid == 0) {
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            if (getppid() != parent)
                _exit(3);
            close(fds[0]);
            if (wants_id && id_pipe_recv(idp, &id) != 0)
                _exit(3);
            struct mr_child c = {
                .rank = i,
                .nranks = nranks,
                .id = id,
                .msg = p->msgs + (size_t)i * MSG_BYTES,
                .msglen = MSG_BYTES,
                .shared = p->shared,
                .ready_fd = fds[1],
            };
            int rc = fn(&c, arg);
            _exit(rc ? 1 : 0);
        }
        if (pid < 0) {
            snprintf(msg, msglen, "fork: %s", strerror(errno));
            close(fds[1]);
            if (wants_id) {
                close(idp[0]);
                close(idp[1]);
            }
            mr_procs_free(p);
            return NULL;
        }
        p->pids[i] = pid;
        mr_note_child(pid);
    }
    close(fds[1]);
    if (wants_id) {
        plait_result_t r = id_pipe_send(idp, nranks, &id);
        if (r != PLAIT_SUCCESS)
            snprintf(msg, msglen, "plait_get_unique_id: %s: %s", plait_get_error_string(r),
                     plait_get_last_error(NULL));
    }
    return p;
}

void mr_child_ready(struct mr_child *c)
{
    char b = (char)c->rank;
    while (write(c->ready_fd, &b, 1) < 0 && errno == EINTR) {
    }
}

plait_comm_t mr_child_init(struct mr_child *c)
{
    plait_comm_t comm = NULL;
    plait_result_t r = plait_comm_init_rank(&comm, c->nranks, c->id, c->rank);
    if (r) {
        snprintf(c->msg, c->msglen, "init: %s: %s", plait_get_error_string(r), plait_get_last_error(NULL));
        return NULL;
    }
    return comm;
}

int mr_procs_wait_ready(struct mr_procs *p, int count, double timeout_s)
{
    double deadline = now_s() + timeout_s;
    while (p->ready_got < count) {
        double left = deadline - now_s();
        if (left <= 0)
            return -1;
        struct timeval tv = {(time_t)left, (suseconds_t)((left - (double)(time_t)left) * 1e6)};
        fd_set rd;
        FD_ZERO(&rd);
        FD_SET(p->ready_rd, &rd);
        int n = select(p->ready_rd + 1, &rd, NULL, NULL, &tv);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return -1;
        char buf[64];
        ssize_t got = read(p->ready_rd, buf, sizeof(buf));
        if (got == 0)
            return -1; /* every child has gone */
        if (got > 0)
            p->ready_got += (int)got;
    }
    return 0;
}

void *mr_procs_shared(struct mr_procs *p)
{
    return p->shared;
}

pid_t mr_procs_pid(const struct mr_procs *p, int rank)
{
    return p->pids[rank];
}

int mr_procs_kill(struct mr_procs *p, int rank, int sig)
{
    if (p->pids[rank] <= 0)
        return -1;
    p->killed_sig[rank] = sig;
    return kill(p->pids[rank], sig);
}

int mr_procs_join(struct mr_procs *p, double timeout_s, char *msg, size_t msglen)
{
    msg[0] = '\0';
    int failed = 0, left = 0;
    for (int i = 0; i < p->nranks; i++)
        left += p->pids[i] > 0;
    double deadline = now_s() + timeout_s;
    while (left > 0) {
        int reaped = 0;
        for (int i = 0; i < p->nranks; i++) {
            int status;
            if (p->pids[i] <= 0 || waitpid(p->pids[i], &status, WNOHANG) != p->pids[i])
                continue;
            reaped = 1;
            p->pids[i] = 0;
            p->status[i] = status;
            left--;
            int ok = (WIFEXITED(status) && WEXITSTATUS(status) == 0) ||
                     (WIFSIGNALED(status) && p->killed_sig[i] == SIGKILL && WTERMSIG(status) == SIGKILL);
            if (!ok) {
                if (!failed) {
                    char *m = p->msgs + (size_t)i * MSG_BYTES;
                    m[MSG_BYTES - 1] = '\0';
                    if (WIFSIGNALED(status))
                        snprintf(msg, msglen, "rank %d killed by signal %d: %s", i, WTERMSIG(status), m);
                    else
                        snprintf(msg, msglen, "rank %d (exit %d): %s", i, WEXITSTATUS(status), m);
                }
                failed++;
            }
        }
        if (reaped)
            continue;
        if (now_s() > deadline) {
            for (int i = 0; i < p->nranks; i++)
                if (p->pids[i] > 0) {
                    kill(p->pids[i], SIGKILL);
                    waitpid(p->pids[i], &p->status[i], 0);
                    p->pids[i] = 0;
                    if (!failed)
                        snprintf(msg, msglen, "rank %d did not finish within %.0f s: %s", i, timeout_s,
                                 p->msgs + (size_t)i * MSG_BYTES);
                    failed++;
                    left--;
                }
            break;
        }
        usleep(2000);
    }
    return failed;
}

int mr_procs_status(const struct mr_procs *p, int rank)
{
    return p->status[rank];
}

const char *mr_procs_msg(const struct mr_procs *p, int rank)
{
    char *m = p->msgs + (size_t)rank * MSG_BYTES;
    m[MSG_BYTES - 1] = '\0';
    return m;
}

void mr_procs_free(struct mr_procs *p)
{
    if (!p)
        return;
    for (int i = 0; p->pids && i < p->nranks; i++)
        if (p->pids[i] > 0) {
            kill(p->pids[i], SIGKILL);
            waitpid(p->pids[i], NULL, 0);
        }
    if (p->ready_rd >= 0)
        close(p->ready_rd);
    if (p->msgs)
        munmap(p->msgs, (size_t)p->nranks * MSG_BYTES);
    if (p->shared)
        munmap(p->shared, p->shared_bytes);
    free(p->pids);
    free(p->status);
    free(p->killed_sig);
    free(p);
}

/* ---------------------------------------------------------------- leak checks */

static int count_dir(const char *path)
{
    DIR *d = opendir(path);
    if (!d)
        return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (e->d_name[0] != '.')
            n++;
    closedir(d);
    return n;
}

int mr_count_fds(void)
{
    return count_dir("/proc/self/fd") - 1; /* the directory's own descriptor */
}

int mr_count_threads(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    if (!f)
        return -1;
    char line[256];
    int n = -1;
    while (fgets(line, sizeof(line), f))
        if (strncmp(line, "Threads:", 8) == 0) {
            n = atoi(line + 8);
            break;
        }
    fclose(f);
    return n;
}

int mr_settle_threads(int want, double timeout_s)
{
    double deadline = now_s() + timeout_s;
    int n = mr_count_threads();
    while (n > want && now_s() < deadline) {
        usleep(5000);
        n = mr_count_threads();
    }
    return n;
}

void mr_shm_snapshot(struct mr_shm_set *s)
{
    s->n = 0;
    s->names = NULL;
    DIR *d = opendir("/dev/shm");
    if (!d)
        return;
    int cap = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (strncmp(e->d_name, "plait-", 6) != 0)
            continue;
        if (s->n == cap) {
            cap = cap ? 2 * cap : 64;
            s->names = realloc(s->names, sizeof(*s->names) * (size_t)cap);
        }
        snprintf(s->names[s->n++], sizeof(s->names[0]), "%s", e->d_name);
    }
    closedir(d);
}

void mr_shm_set_free(struct mr_shm_set *s)
{
    free(s->names);
    s->names = NULL;
    s->n = 0;
}

int mr_shm_new_entries(const struct mr_shm_set *before, char *msg, size_t msglen)
{
    struct mr_shm_set now;
    mr_shm_snapshot(&now);
    int n = 0;
    size_t o = 0;
    if (msglen)
        msg[0] = '\0';
    for (int i = 0; i < now.n; i++) {
        int seen = 0;
        for (int j = 0; j < before->n && !seen; j++)
            seen = strcmp(now.names[i], before->names[j]) == 0;
        if (seen)
            continue;
        /* "plait-<pid>-...": count only ours; a name that does not parse counts. */
        char *end;
        long pid = strtol(now.names[i] + 6, &end, 10);
        if (end != now.names[i] + 6 && *end == '-' && !is_noted((pid_t)pid))
            continue;
        n++;
        if (o + 2 < msglen)
            o += (size_t)snprintf(msg + o, msglen - o, "%s/dev/shm/%s", n > 1 ? " " : "", now.names[i]);
        if (o >= msglen)
            o = msglen - 1;
    }
    mr_shm_set_free(&now);
    return n;
}
