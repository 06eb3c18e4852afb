/* A dead peer seen by two threads at once, for ThreadSanitizer (suite tsan;
 * Criterion's runner does not start under TSan): a thread that checks the
 * peers without pause, as the CUDA proxy's watcher does
 * (plait_comm_check_peers), while the main thread waits in a collective for
 * the peer and then builds the error naming it (plait_comm_peer_gone). The
 * two ranks are processes over shared memory: rank 1 exits while rank 0
 * waits for its data. Exits non-zero on a wrong result; TSan makes it 66 on a
 * race (the per-connection peer_gone flag and dead_peer / dead_reporter,
 * written by whichever thread saw the death first). */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "core/comm.h"
#include "plait.h"

#define COUNT (256 * 1024) /* 1 MiB of floats: the pipelined path, not the small-message one */

static int stop;

static void *watcher(void *p)
{
    struct plait_comm *comm = p;
    while (!__atomic_load_n(&stop, __ATOMIC_ACQUIRE))
        plait_comm_check_peers(comm);
    return NULL;
}

static int child(plait_unique_id_t id)
{
    /* Over shared memory, with no timeout longer than the test's. */
    plait_comm_t comm;
    if (plait_comm_init_rank(&comm, 2, id, 1) != PLAIT_SUCCESS) {
        fprintf(stderr, "rank 1: init: %s\n", plait_get_last_error(NULL));
        return 1;
    }
    float x = 1.0f, y = 0.0f;
    if (plait_allreduce(&x, &y, 1, PLAIT_FLOAT32, PLAIT_SUM, comm, NULL) != PLAIT_SUCCESS || y != 2.0f) {
        fprintf(stderr, "rank 1: allreduce: %s\n", plait_get_last_error(NULL));
        return 1;
    }
    /* Rank 0 is in its next collective by now; this rank never joins it. */
    usleep(300 * 1000);
    return 0; /* _exit: no destroy, as a crash */
}

/* One round over `id`: rank 1 is the child `pid`. Returns 0 when rank 0's
 * collective failed naming rank 1. */
static int round_run(plait_unique_id_t id, pid_t pid)
{
    int failed = 0;
    plait_comm_t comm;
    if (plait_comm_init_rank(&comm, 2, id, 0) != PLAIT_SUCCESS) {
        fprintf(stderr, "rank 0: init: %s\n", plait_get_last_error(NULL));
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        return 1;
    }
    float x = 1.0f, y = 0.0f;
    if (plait_allreduce(&x, &y, 1, PLAIT_FLOAT32, PLAIT_SUM, comm, NULL) != PLAIT_SUCCESS || y != 2.0f) {
        fprintf(stderr, "rank 0: first allreduce: %s\n", plait_get_last_error(NULL));
        failed = 1;
    }
    __atomic_store_n(&stop, 0, __ATOMIC_RELEASE);
    pthread_t w;
    pthread_create(&w, NULL, watcher, comm);
    float *a = calloc(COUNT, sizeof(float)), *b = calloc(COUNT, sizeof(float));
    plait_result_t r = plait_allreduce(a, b, COUNT, PLAIT_FLOAT32, PLAIT_SUM, comm, NULL);
    const char *msg = plait_get_last_error(NULL);
    if (r != PLAIT_ERR_REMOTE || !strstr(msg, "rank 1")) {
        fprintf(stderr, "rank 0: the allreduce with rank 1 gone returned %d: %s\n", (int)r, msg);
        failed = 1;
    } else {
        printf("rank 0: %s\n", msg);
    }
    __atomic_store_n(&stop, 1, __ATOMIC_RELEASE);
    pthread_join(w, NULL);
    plait_comm_destroy(comm);
    free(a);
    free(b);
    int status = 0;
    if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        fprintf(stderr, "rank 1 failed (status %#x)\n", status);
        failed = 1;
    }
    return failed;
}

/* Which thread sees the death first is up to timing: several rounds. Each
 * rank 1 is this program run again (fork and exec: no threads cross a fork). */
#define ROUNDS 8

int main(int argc, char **argv)
{
    setenv("PLAIT_TRANSPORT", "auto", 1); /* shared memory: the two ranks share a host */
    setenv("PLAIT_TIMEOUT", "60", 1);
    setenv("PLAIT_COLL_TIMEOUT", "60", 1);
    plait_unique_id_t id;
    if (argc == 3 && strcmp(argv[1], "--rank1") == 0) {
        if (strlen(argv[2]) != 2 * sizeof(id))
            return 2;
        for (size_t i = 0; i < sizeof(id); i++) {
            unsigned v;
            if (sscanf(argv[2] + 2 * i, "%2x", &v) != 1)
                return 2;
            ((unsigned char *)&id)[i] = (unsigned char)v;
        }
        alarm(120);
        return child(id);
    }
    alarm(240); /* no hang past this, whatever breaks */
    int failed = 0;
    for (int round = 0; round < ROUNDS && !failed; round++) {
        if (plait_get_unique_id(&id) != PLAIT_SUCCESS) {
            fprintf(stderr, "unique id: %s\n", plait_get_last_error(NULL));
            return 1;
        }
        char hex[2 * sizeof(id) + 1];
        for (size_t i = 0; i < sizeof(id); i++)
            snprintf(hex + 2 * i, 3, "%02x", ((const unsigned char *)&id)[i]);
        pid_t pid = fork();
        if (pid < 0)
            return 1;
        if (pid == 0) {
            execl("/proc/self/exe", argv[0], "--rank1", hex, (char *)NULL);
            _exit(127);
        }
        failed |= round_run(id, pid);
    }
    return failed;
}
