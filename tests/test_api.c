/* The public API through libplait.so: version, error strings, argument checks
 * (every bad argument is named and leaves the communicator usable), config
 * validation, and the exported symbol set. Links the shared library only. */
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <dlfcn.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>

#include "plait.h"

static plait_comm_t comm;

static void setup_one(void)
{
    cr_assert_eq(plait_comm_init_all(&comm, 1, NULL), PLAIT_SUCCESS, "%s", plait_get_last_error(NULL));
}

static void teardown_one(void)
{
    plait_comm_destroy(comm);
}

#define EXPECT_ERR(call, code, word)                                                                          \
    do {                                                                                                      \
        plait_result_t r_ = (call);                                                                           \
        cr_expect_eq(r_, code, "%s returned %d (%s), expected %d", #call, r_, plait_get_error_string(r_),    \
                     code);                                                                                   \
        cr_expect(strstr(plait_get_last_error(NULL), word) != NULL, "%s: message \"%s\" does not name \"%s\"", \
                  #call, plait_get_last_error(NULL), word);                                                   \
    } while (0)

Test(api, version)
{
    int v = 0;
    cr_assert_eq(plait_get_version(&v), PLAIT_SUCCESS);
    cr_assert_eq(v, PLAIT_VERSION_CODE);
    cr_assert_eq(plait_get_version(NULL), PLAIT_ERR_INVALID_ARGUMENT);
}

Test(api, result_values_match_nccl)
{
    cr_assert_eq(PLAIT_SUCCESS, 0);
    cr_assert_eq(PLAIT_ERR_UNHANDLED_CUDA, 1);
    cr_assert_eq(PLAIT_ERR_SYSTEM, 2);
    cr_assert_eq(PLAIT_ERR_INTERNAL, 3);
    cr_assert_eq(PLAIT_ERR_INVALID_ARGUMENT, 4);
    cr_assert_eq(PLAIT_ERR_INVALID_USAGE, 5);
    cr_assert_eq(PLAIT_ERR_REMOTE, 6);
    cr_assert_eq(PLAIT_IN_PROGRESS, 7);
    cr_assert_eq(PLAIT_ERR_TIMEOUT, 8);
    cr_assert_eq(PLAIT_FLOAT8_E5M2, 11);
    cr_assert_eq(PLAIT_BFLOAT16, 9);
    cr_assert_eq(PLAIT_AVG, 4);
    cr_assert_eq(sizeof(plait_unique_id_t), 128);
}

Test(api, error_strings)
{
    for (int r = 0; r < PLAIT_NUM_RESULTS; r++) {
        const char *s = plait_get_error_string((plait_result_t)r);
        cr_assert(s && *s, "no string for %d", r);
    }
    cr_assert_str_eq(plait_get_error_string((plait_result_t)99), "unknown result code");
    cr_assert_str_eq(plait_get_error_string((plait_result_t)-1), "unknown result code");
}

Test(api, bad_arguments_are_named, .init = setup_one, .fini = teardown_one)
{
    float x[4] = {1, 2, 3, 4}, y[4];
    EXPECT_ERR(plait_allreduce(x, y, 4, PLAIT_FLOAT32, PLAIT_SUM, NULL, NULL), PLAIT_ERR_INVALID_ARGUMENT, "comm");
    EXPECT_ERR(plait_allreduce(NULL, y, 4, PLAIT_FLOAT32, PLAIT_SUM, comm, NULL), PLAIT_ERR_INVALID_ARGUMENT,
               "sendbuff");
    EXPECT_ERR(plait_allreduce(x, NULL, 4, PLAIT_FLOAT32, PLAIT_SUM, comm, NULL), PLAIT_ERR_INVALID_ARGUMENT,
               "recvbuff");
    EXPECT_ERR(plait_allreduce(x, y, 4, (plait_datatype_t)12, PLAIT_SUM, comm, NULL), PLAIT_ERR_INVALID_ARGUMENT,
               "datatype");
    EXPECT_ERR(plait_allreduce(x, y, 4, (plait_datatype_t)-3, PLAIT_SUM, comm, NULL), PLAIT_ERR_INVALID_ARGUMENT,
               "datatype");
    EXPECT_ERR(plait_allreduce(x, y, 4, PLAIT_FLOAT32, (plait_redop_t)77, comm, NULL), PLAIT_ERR_INVALID_ARGUMENT,
               "op");
    EXPECT_ERR(plait_allreduce(x, y, SIZE_MAX / 2, PLAIT_FLOAT32, PLAIT_SUM, comm, NULL), PLAIT_ERR_INVALID_ARGUMENT,
               "overflow");
    EXPECT_ERR(plait_allgather(x, y, SIZE_MAX / 4, PLAIT_FLOAT64, comm, NULL), PLAIT_ERR_INVALID_ARGUMENT,
               "overflow");
    EXPECT_ERR(plait_broadcast(x, y, 4, PLAIT_FLOAT32, 1, comm, NULL), PLAIT_ERR_INVALID_ARGUMENT, "root");
    EXPECT_ERR(plait_reduce(x, y, 4, PLAIT_FLOAT32, PLAIT_SUM, -1, comm, NULL), PLAIT_ERR_INVALID_ARGUMENT, "root");
    EXPECT_ERR(plait_gather(x, y, 4, PLAIT_FLOAT32, 5, comm, NULL), PLAIT_ERR_INVALID_ARGUMENT, "root");
    EXPECT_ERR(plait_scatter(x, y, 4, PLAIT_FLOAT32, 2, comm, NULL), PLAIT_ERR_INVALID_ARGUMENT, "root");
    EXPECT_ERR(plait_send(x, 4, PLAIT_FLOAT32, 1, comm, NULL), PLAIT_ERR_INVALID_ARGUMENT, "peer");
    EXPECT_ERR(plait_recv(y, 4, PLAIT_FLOAT32, -1, comm, NULL), PLAIT_ERR_INVALID_ARGUMENT, "peer");
    EXPECT_ERR(plait_recv(NULL, 4, PLAIT_FLOAT32, 0, comm, NULL), PLAIT_ERR_INVALID_ARGUMENT, "recvbuff");
    EXPECT_ERR(plait_alltoall(x, x, 1, PLAIT_FLOAT32, comm, NULL), PLAIT_ERR_INVALID_ARGUMENT, "in-place");
    EXPECT_ERR(plait_comm_count(comm, NULL), PLAIT_ERR_INVALID_ARGUMENT, "count_out");
    EXPECT_ERR(plait_comm_rank(NULL, NULL), PLAIT_ERR_INVALID_ARGUMENT, "comm");

    /* nothing was started and the communicator still works */
    cr_assert_eq(plait_allreduce(x, y, 4, PLAIT_FLOAT32, PLAIT_SUM, comm, NULL), PLAIT_SUCCESS, "%s",
                 plait_get_last_error(comm));
    for (int i = 0; i < 4; i++)
        cr_assert_float_eq(y[i], x[i], 0);
    /* zero counts accept NULL buffers */
    cr_assert_eq(plait_allreduce(NULL, NULL, 0, PLAIT_FLOAT32, PLAIT_SUM, comm, NULL), PLAIT_SUCCESS);
    cr_assert_eq(plait_barrier(comm, NULL), PLAIT_SUCCESS);
}

Test(api, init_arguments)
{
    plait_unique_id_t id;
    memset(&id, 0, sizeof(id));
    plait_comm_t c;
    EXPECT_ERR(plait_comm_init_rank(NULL, 2, id, 0), PLAIT_ERR_INVALID_ARGUMENT, "comm_out");
    EXPECT_ERR(plait_comm_init_rank(&c, 0, id, 0), PLAIT_ERR_INVALID_ARGUMENT, "nranks");
    EXPECT_ERR(plait_comm_init_rank(&c, 2, id, 2), PLAIT_ERR_INVALID_ARGUMENT, "rank");
    EXPECT_ERR(plait_comm_init_all(NULL, 2, NULL), PLAIT_ERR_INVALID_ARGUMENT, "comms_out");
    EXPECT_ERR(plait_comm_init_all(&c, 0, NULL), PLAIT_ERR_INVALID_ARGUMENT, "ndev");
    plait_config_t cfg = PLAIT_CONFIG_INITIALIZER;
    cfg.magic = 0x1234;
    EXPECT_ERR(plait_comm_init_rank_config(&c, 1, id, 0, &cfg), PLAIT_ERR_INVALID_ARGUMENT, "magic");
    plait_config_t cfg2 = PLAIT_CONFIG_INITIALIZER;
    cfg2.blocking = 7;
    EXPECT_ERR(plait_comm_init_rank_config(&c, 1, id, 0, &cfg2), PLAIT_ERR_INVALID_ARGUMENT, "blocking");
    EXPECT_ERR(plait_get_unique_id(NULL), PLAIT_ERR_INVALID_ARGUMENT, "id");
}

Test(api, group_end_without_start)
{
    EXPECT_ERR(plait_group_end(), PLAIT_ERR_INVALID_USAGE, "plait_group_start");
    cr_assert_eq(plait_group_start(), PLAIT_SUCCESS);
    cr_assert_eq(plait_group_start(), PLAIT_SUCCESS);
    cr_assert_eq(plait_group_end(), PLAIT_SUCCESS);
    cr_assert_eq(plait_group_end(), PLAIT_SUCCESS);
}

Test(api, premulsum_and_registration, .init = setup_one, .fini = teardown_one)
{
    double s = 0.5;
    plait_redop_t op;
    EXPECT_ERR(plait_redop_create_premulsum(NULL, &s, PLAIT_FLOAT64, PLAIT_SCALAR_HOST_IMMEDIATE, comm),
               PLAIT_ERR_INVALID_ARGUMENT, "op_out");
    EXPECT_ERR(plait_redop_create_premulsum(&op, NULL, PLAIT_FLOAT64, PLAIT_SCALAR_HOST_IMMEDIATE, comm),
               PLAIT_ERR_INVALID_ARGUMENT, "scalar");
    EXPECT_ERR(plait_redop_create_premulsum(&op, &s, PLAIT_FLOAT64, (plait_scalar_residence_t)9, comm),
               PLAIT_ERR_INVALID_ARGUMENT, "residence");
    cr_assert_eq(plait_redop_create_premulsum(&op, &s, PLAIT_FLOAT64, PLAIT_SCALAR_HOST_IMMEDIATE, comm),
                 PLAIT_SUCCESS);
    double x[3] = {2, 4, 8}, y[3];
    cr_assert_eq(plait_allreduce(x, y, 3, PLAIT_FLOAT64, op, comm, NULL), PLAIT_SUCCESS);
    cr_assert_float_eq(y[2], 4.0, 0);
    EXPECT_ERR(plait_allreduce(x, y, 3, PLAIT_FLOAT32, op, comm, NULL), PLAIT_ERR_INVALID_ARGUMENT, "premulsum");
    cr_assert_eq(plait_redop_destroy(op, comm), PLAIT_SUCCESS);
    EXPECT_ERR(plait_redop_destroy(op, comm), PLAIT_ERR_INVALID_ARGUMENT, "op");
    EXPECT_ERR(plait_allreduce(x, y, 3, PLAIT_FLOAT64, op, comm, NULL), PLAIT_ERR_INVALID_ARGUMENT, "op");

    void *h = NULL;
    cr_assert_eq(plait_comm_register(comm, x, sizeof(x), &h), PLAIT_SUCCESS);
    cr_assert_eq(plait_comm_deregister(comm, h), PLAIT_SUCCESS);
    EXPECT_ERR(plait_comm_register(comm, NULL, 8, &h), PLAIT_ERR_INVALID_ARGUMENT, "buff");
    EXPECT_ERR(plait_comm_deregister(comm, x), PLAIT_ERR_INVALID_ARGUMENT, "handle");
}

Test(api, cuda_stream_is_refused_clearly)
{
    plait_stream_t s;
    EXPECT_ERR(plait_stream_from_cuda(NULL, &s), PLAIT_ERR_INVALID_USAGE, "CUDA");
}

Test(api, exports_only_the_public_api)
{
    void *h = dlopen("libplait.so.0", RTLD_NOW | RTLD_LOCAL);
    cr_assert(h, "dlopen: %s", dlerror());
    cr_assert(dlsym(h, "plait_allreduce"), "plait_allreduce is not exported");
    cr_assert(dlsym(h, "plait_group_end"), "plait_group_end is not exported");
    cr_assert_null(dlsym(h, "plait_error"), "internal plait_error is exported");
    cr_assert_null(dlsym(h, "plait_exec_run"), "internal plait_exec_run is exported");
    cr_assert_null(dlsym(h, "plait_reduce_apply"), "internal plait_reduce_apply is exported");
    dlclose(h);
}

Test(api, plait_algo_is_strict)
{
    plait_comm_t c[2];
    setenv("PLAIT_ALGO", "ring", 1);
    cr_assert_eq(plait_comm_init_all(c, 2, NULL), PLAIT_SUCCESS, "%s", plait_get_last_error(NULL));
    int x[2] = {1, 2}, y[2];
    cr_assert_eq(plait_group_start(), PLAIT_SUCCESS);
    plait_allreduce(&x[0], &y[0], 1, PLAIT_INT32, PLAIT_SUM, c[0], NULL);
    plait_allreduce(&x[1], &y[1], 1, PLAIT_INT32, PLAIT_SUM, c[1], NULL);
    cr_assert_eq(plait_group_end(), PLAIT_SUCCESS, "%s", plait_get_last_error(NULL));
    cr_assert(y[0] == 3 && y[1] == 3);
    plait_comm_destroy(c[0]);
    plait_comm_destroy(c[1]);

    setenv("PLAIT_ALGO", "allreduce:ring;allgather:tree-of-doom", 1);
    EXPECT_ERR(plait_comm_init_all(c, 2, NULL), PLAIT_ERR_INVALID_ARGUMENT, "tree-of-doom");
    cr_assert(strstr(plait_get_last_error(NULL), "valid algorithms: auto ring"), "%s", plait_get_last_error(NULL));
    setenv("PLAIT_ALGO", "alltoall:ring", 1);
    EXPECT_ERR(plait_comm_init_all(c, 2, NULL), PLAIT_ERR_INVALID_ARGUMENT, "collective");
}

Test(api, nccl_algo_names_plait_lacks_only_warn)
{
    unsetenv("PLAIT_ALGO");
    setenv("NCCL_ALGO", "NVLS,CollnetDirect", 1);
    plait_comm_t c;
    cr_assert_eq(plait_comm_init_all(&c, 1, NULL), PLAIT_SUCCESS, "%s", plait_get_last_error(NULL));
    int x = 5, y = 0;
    cr_assert_eq(plait_allreduce(&x, &y, 1, PLAIT_INT32, PLAIT_SUM, c, NULL), PLAIT_SUCCESS);
    cr_assert_eq(y, 5);
    plait_comm_destroy(c);
}
