#define _GNU_SOURCE
#include "harness.h"

#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
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

static int run_threads(int nranks, mr_fn fn, void *arg, char *msg, size_t msglen)
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
        plait_comm_destroy(comms[i]);
    }
out:
    free(comms);
    free(args);
    free(th);
    return failed;
}

static int run_procs(enum mr_mode mode, int nranks, mr_fn fn, void *arg, double timeout_s, char *msg,
                     size_t msglen)
{
    plait_unique_id_t id;
    plait_result_t r = plait_get_unique_id(&id);
    if (r != PLAIT_SUCCESS) {
        snprintf(msg, msglen, "plait_get_unique_id: %s: %s", plait_get_error_string(r), plait_get_last_error(NULL));
        return nranks;
    }
    char *shared = mmap(NULL, (size_t)nranks * MSG_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    pid_t *pids = calloc((size_t)nranks, sizeof(pid_t));
    for (int i = 0; i < nranks; i++) {
        pid_t pid = fork();
        if (pid == 0) {
            if (mode == MR_SOCKET)
                setenv("PLAIT_TRANSPORT", "socket", 1);
            char *m = shared + (size_t)i * MSG_BYTES;
            plait_comm_t comm;
            plait_result_t res = plait_comm_init_rank(&comm, nranks, id, i);
            if (res != PLAIT_SUCCESS) {
                snprintf(m, MSG_BYTES, "init: %s: %s", plait_get_error_string(res), plait_get_last_error(NULL));
                _exit(2);
            }
            int rc = fn(comm, i, nranks, arg, m, MSG_BYTES);
            plait_comm_destroy(comm);
            _exit(rc ? 1 : 0);
        }
        pids[i] = pid;
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
        return run_threads(nranks, fn, arg, msg, msglen);
    return run_procs(mode, nranks, fn, arg, timeout_s, msg, msglen);
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
