/* gpu_dead_peer: a peer process dies while this rank's device kernel waits
 * for it (perf/gpu_check.sh, on a real GPU).
 *
 * Two ranks as processes on device 0 (CUDA IPC between them; with --socket
 * over sockets, through the proxy thread's connections). Both run one
 * allreduce of --count floats on device buffers and check it; then rank 0
 * launches a second one that rank 1 never joins, and rank 1 is killed
 * (SIGKILL) 300 ms later, while rank 0's kernel waits for its data. Rank 0
 * must learn of it through the proxy's watch of its peers (core/cuda/proxy.c:
 * the kernel's abort word) within 5 s with PLAIT_COLL_TIMEOUT at 60 s: its
 * stream ends, the asynchronous error is PLAIT_ERR_REMOTE and names rank 1;
 * then its next call is refused and plait_comm_destroy takes under 5 s (the
 * teardown's waits, core/cuda/conn.c). Prints one PASS or FAIL line.
 *
 * usage: gpu_dead_peer [--socket] [--count N] [--allow-double]
 * Exit 0 PASS, 1 FAIL, 77 no GPU (or only the test double without
 * --allow-double). */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "plait.h"
#include "core/cuda/cu.h"

struct board {
    int first_done[2];
    int launched; /* rank 0's second call is queued */
    int done;
    int ok;
    double took, destroy_took;
    char msg[1024];
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int wait_flag(const int *flag, double seconds)
{
    const double give_up = now_s() + seconds;
    while (!__atomic_load_n(flag, __ATOMIC_ACQUIRE)) {
        if (now_s() > give_up)
            return -1;
        usleep(2000);
    }
    return 0;
}

#define FAIL(...)                                                                                                  \
    do {                                                                                                           \
        snprintf(b->msg, sizeof(b->msg), __VA_ARGS__);                                                             \
        return 1;                                                                                                  \
    } while (0)

static int rank_main(int rank, plait_unique_id_t id, size_t count, struct board *b)
{
    const struct plait_cu *cu = plait_cu_get();
    void *ctx = NULL, *s = NULL;
    if (!cu || cu->ndevices < 1 || cu->DevicePrimaryCtxRetain(&ctx, 0) || cu->CtxSetCurrent(ctx))
        FAIL("rank %d: no CUDA context on device 0", rank);
    plait_comm_t comm = NULL;
    if (plait_comm_init_rank(&comm, 2, id, rank))
        FAIL("rank %d: plait_comm_init_rank: %s", rank, plait_get_last_error(NULL));
    plait_stream_t ps;
    if (cu->StreamCreateWithPriority(&s, PLAIT_CU_STREAM_NON_BLOCKING, 0) || plait_stream_from_cuda(s, &ps))
        FAIL("rank %d: stream: %s", rank, plait_get_last_error(NULL));
    const size_t bytes = count * sizeof(float);
    plait_cudevptr d = 0;
    float *h = malloc(bytes);
    if (!h || cu->MemAlloc(&d, bytes))
        FAIL("rank %d: %zu bytes of device memory", rank, bytes);
    for (size_t i = 0; i < count; i++)
        h[i] = 1.0f;
    float *buf = (float *)(uintptr_t)d;
    if (cu->MemcpyHtoD(d, h, bytes) || plait_allreduce(buf, buf, count, PLAIT_FLOAT32, PLAIT_SUM, comm, ps) ||
        cu->StreamSynchronize(s) || cu->MemcpyDtoH(h, d, bytes))
        FAIL("rank %d: the first allreduce: %s", rank, plait_get_last_error(comm));
    plait_result_t ae = PLAIT_SUCCESS;
    plait_comm_get_async_error(comm, &ae);
    if (ae != PLAIT_SUCCESS || h[0] != 2.0f || h[count - 1] != 2.0f)
        FAIL("rank %d: the first allreduce: async error %d, elements %g .. %g (expected 2)", rank, (int)ae,
             (double)h[0], (double)h[count - 1]);
    __atomic_store_n(&b->first_done[rank], 1, __ATOMIC_RELEASE);
    if (rank == 1) {
        pause(); /* killed by the parent here */
        return 0;
    }
    if (wait_flag(&b->first_done[1], 60))
        FAIL("rank 1 did not finish the first allreduce within 60 s");
    const double t0 = now_s();
    plait_result_t r = plait_allreduce(buf, buf, count, PLAIT_FLOAT32, PLAIT_SUM, comm, ps);
    __atomic_store_n(&b->launched, 1, __ATOMIC_RELEASE);
    int sync = -1;
    if (r == PLAIT_SUCCESS) {
        sync = cu->StreamSynchronize(s);
        const double give_up = now_s() + 30;
        do {
            plait_comm_get_async_error(comm, &ae);
            if (ae != PLAIT_SUCCESS && ae != PLAIT_IN_PROGRESS)
                break;
            usleep(1000);
        } while (now_s() < give_up);
    } else {
        ae = r;
    }
    b->took = now_s() - t0;
    char text[800];
    snprintf(text, sizeof(text), "%s", plait_get_last_error(comm));
    plait_result_t next = plait_allreduce(buf, buf, count, PLAIT_FLOAT32, PLAIT_SUM, comm, ps);
    const double d0 = now_s();
    plait_comm_destroy(comm);
    b->destroy_took = now_s() - d0;
    plait_stream_destroy(ps);
    cu->StreamDestroy(s);
    cu->MemFree(d);
    free(h);
    cu->DevicePrimaryCtxRelease(0);
    b->ok = ae == PLAIT_ERR_REMOTE && b->took < 5.0 && strstr(text, "rank 1") != NULL && next != PLAIT_SUCCESS &&
            b->destroy_took < 5.0;
    snprintf(b->msg, sizeof(b->msg),
             "call %d, stream sync %d, async error %s after %.3f s (limit 5 s): \"%s\"; next call %s; destroy %.3f s",
             (int)r, sync, plait_get_error_string(ae), b->took, text, plait_get_error_string(next), b->destroy_took);
    return b->ok ? 0 : 1;
}

int main(int argc, char **argv)
{
    size_t count = 1u << 20;
    int allow_double = 0, is_socket = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--count") == 0 && i + 1 < argc)
            count = (size_t)strtoull(argv[++i], NULL, 0);
        else if (strcmp(argv[i], "--allow-double") == 0)
            allow_double = 1;
        else if (strcmp(argv[i], "--socket") == 0)
            is_socket = 1;
        else {
            fprintf(stderr, "usage: %s [--socket] [--count N] [--allow-double]\n", argv[0]);
            return 2;
        }
    }
    if (count < 1)
        count = 1;
    setenv("PLAIT_COLL_TIMEOUT", "60", 1);
    if (is_socket)
        setenv("PLAIT_TRANSPORT", "socket", 1);
    const char *how = is_socket ? "sockets (the proxy's connections)" : "CUDA IPC (the proxy watches)";
    struct board *b = mmap(NULL, sizeof(*b), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (b == MAP_FAILED)
        return 1;
    memset(b, 0, sizeof(*b));
    /* The ranks fork before this process touches CUDA (a context does not
     * survive fork): the probe runs in a child too. */
    fflush(stdout);
    pid_t probe = fork();
    if (probe == 0) {
        const struct plait_cu *cu = plait_cu_get();
        _exit(!cu || cu->ndevices < 1 ? 77 : cu->is_double && !allow_double ? 78 : 0);
    }
    int st = 0;
    if (probe < 0 || waitpid(probe, &st, 0) != probe || !WIFEXITED(st)) {
        printf("gpu_dead_peer: FAIL: the probe did not run\n");
        return 1;
    }
    if (WEXITSTATUS(st) == 77 || WEXITSTATUS(st) == 78) {
        printf("gpu_dead_peer: SKIP: %s\n", WEXITSTATUS(st) == 77 ? "no CUDA device" : "the CUDA test double");
        return 77;
    }
    int fds[2];
    if (pipe(fds))
        return 1;
    const pid_t parent = getpid();
    pid_t pids[2] = {0, 0};
    for (int r = 0; r < 2; r++) {
        pids[r] = fork();
        if (pids[r] == 0) {
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            if (getppid() != parent)
                _exit(2);
            close(fds[1]);
            plait_unique_id_t id;
            if (read(fds[0], &id, sizeof(id)) != (ssize_t)sizeof(id))
                _exit(2);
            int rc = rank_main(r, id, count, b);
            __atomic_store_n(&b->done, 1, __ATOMIC_RELEASE);
            fflush(stdout);
            _exit(rc);
        }
    }
    close(fds[0]);
    plait_unique_id_t id;
    int ok = pids[0] > 0 && pids[1] > 0 && plait_get_unique_id(&id) == PLAIT_SUCCESS;
    for (int r = 0; ok && r < 2; r++)
        ok = write(fds[1], &id, sizeof(id)) == (ssize_t)sizeof(id);
    close(fds[1]);
    if (ok && wait_flag(&b->launched, 90) == 0) {
        usleep(300 * 1000); /* rank 0's kernel now waits for rank 1's data */
        kill(pids[1], SIGKILL);
        wait_flag(&b->done, 60);
    }
    for (int r = 0; r < 2; r++)
        if (pids[r] > 0) {
            kill(pids[r], SIGKILL);
            waitpid(pids[r], NULL, 0);
        }
    if (!b->launched && !b->msg[0])
        snprintf(b->msg, sizeof(b->msg), "rank 0 never launched its second allreduce");
    printf("gpu_dead_peer: %s: rank 1 killed mid-kernel over %s, %zu floats: %s\n", b->ok ? "PASS" : "FAIL", how,
           count, b->msg);
    return b->ok ? 0 : 1;
}
