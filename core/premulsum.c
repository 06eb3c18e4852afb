/* Premultiplied-sum operators (plait_redop_create_premulsum, plait_redop_destroy):
 * a communicator's table of custom ops, each a scalar that multiplies every
 * input before the sum (read at enqueue, core/enqueue.c). */
#include "core/comm.h"

#include <string.h>

#include "base/log.h"
#include "core/reduce.h"

plait_result_t plait_redop_create_premulsum(plait_redop_t *op_out, void *scalar, plait_datatype_t datatype,
                                            plait_scalar_residence_t residence, plait_comm_t comm)
{
    plait_result_t status = plait_comm_check(comm, "plait_redop_create_premulsum");
    if (status)
        return status;
    if (!op_out)
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "plait_redop_create_premulsum: op_out is NULL");
    if (!scalar)
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "plait_redop_create_premulsum: scalar is NULL");
    if ((int)datatype < 0 || datatype >= PLAIT_NUM_TYPES)
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "plait_redop_create_premulsum: datatype %d is invalid",
                           (int)datatype);
    if (residence != PLAIT_SCALAR_DEVICE && residence != PLAIT_SCALAR_HOST_IMMEDIATE)
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "plait_redop_create_premulsum: residence %d is invalid",
                           (int)residence);
    for (int i = 0; i < PLAIT_MAX_PREMUL_OPS; i++) {
        struct plait_premul_op *p = &comm->premul[i];
        if (p->in_use)
            continue;
        p->in_use = 1;
        p->dtype = datatype;
        p->residence = residence;
        p->scalar_bits = 0;
        memcpy(&p->scalar_bits, scalar, plait_dtype_size(datatype));
        p->scalar_ptr = scalar;
        *op_out = (plait_redop_t)(PLAIT_NUM_OPS + i);
        return PLAIT_SUCCESS;
    }
    return plait_error(PLAIT_ERR_INVALID_USAGE, "plait_redop_create_premulsum: all %d custom ops are in use",
                       PLAIT_MAX_PREMUL_OPS);
}

plait_result_t plait_redop_destroy(plait_redop_t op, plait_comm_t comm)
{
    plait_result_t hs = plait_comm_check_handle(comm, "plait_redop_destroy");
    if (hs)
        return hs;
    int i = (int)op - PLAIT_NUM_OPS;
    if (i < 0 || i >= PLAIT_MAX_PREMUL_OPS || !comm->premul[i].in_use)
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "plait_redop_destroy: op %d was not created on this comm",
                           (int)op);
    comm->premul[i].in_use = 0;
    return PLAIT_SUCCESS;
}
