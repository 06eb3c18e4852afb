/* Init/destroy cycles for valgrind: N cycles (argv[1], default 100) of a
 * 3-rank in-process communicator (plait_comm_init_all) that runs an allreduce,
 * a split and a barrier. Run under `valgrind --leak-check=full`: memory still
 * held after the cycles is a leak. Not a Criterion test: Criterion's forked
 * workers would hide the process valgrind watches. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "plait.h"

#define R 3

struct arg {
    plait_comm_t comm;
    int rank;
    int failed;
};

static void *rank_main(void *p)
{
    struct arg *a = p;
    int x = a->rank + 1, y = 0;
    if (plait_allreduce(&x, &y, 1, PLAIT_INT32, PLAIT_SUM, a->comm, NULL) != PLAIT_SUCCESS || y != 6)
        a->failed = 1;
    plait_comm_t child = NULL;
    if (plait_comm_split(a->comm, a->rank % 2, 0, &child, NULL) != PLAIT_SUCCESS || !child ||
        plait_barrier(child, NULL) != PLAIT_SUCCESS)
        a->failed = 1;
    plait_comm_destroy(child);
    return NULL;
}

int main(int argc, char **argv)
{
    int cycles = argc > 1 ? atoi(argv[1]) : 100;
    for (int c = 0; c < cycles; c++) {
        plait_comm_t comms[R];
        if (plait_comm_init_all(comms, R, NULL) != PLAIT_SUCCESS) {
            fprintf(stderr, "cycle %d: init failed: %s\n", c, plait_get_last_error(NULL));
            return 1;
        }
        pthread_t th[R];
        struct arg args[R];
        for (int r = 0; r < R; r++) {
            args[r] = (struct arg){comms[r], r, 0};
            pthread_create(&th[r], NULL, rank_main, &args[r]);
        }
        for (int r = 0; r < R; r++) {
            pthread_join(th[r], NULL);
            if (args[r].failed) {
                fprintf(stderr, "cycle %d: rank %d failed: %s\n", c, r, plait_get_last_error(NULL));
                return 1;
            }
        }
        for (int r = 0; r < R; r++)
            plait_comm_destroy(comms[r]);
    }
    printf("%d cycles ok\n", cycles);
    return 0;
}
