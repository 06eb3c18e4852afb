/* Buffer registrations (plait_comm_register/deregister): each communicator
 * keeps a list of the ranges registered on it, freed with it. */
#include "core/comm.h"

#include <stdint.h>
#include <stdlib.h>

#include "base/handle.h"
#include "base/log.h"

struct plait_reg {
    uint64_t magic;
    struct plait_comm *comm;
    void *buff;
    size_t size;
    struct plait_reg *next;
};
#define PLAIT_REG_MAGIC 0x706c6169726567ull

plait_result_t plait_comm_register(plait_comm_t comm, void *buff, size_t size, void **handle_out)
{
    plait_result_t hs = plait_comm_check_handle(comm, "plait_comm_register");
    if (hs)
        return hs;
    if (!handle_out)
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "plait_comm_register: handle_out is NULL");
    if (!buff && size > 0)
        return plait_error(PLAIT_ERR_INVALID_ARGUMENT, "plait_comm_register: buff is NULL with size %zu", size);
    /* Host buffers need no pinning for the staging path; the handle records the
     * range for the single-copy paths that use it. */
    struct plait_reg *reg = malloc(sizeof(*reg));
    if (!reg)
        return plait_error(PLAIT_ERR_SYSTEM, "plait_comm_register: out of memory");
    reg->magic = PLAIT_REG_MAGIC;
    reg->comm = comm;
    reg->buff = buff;
    reg->size = size;
    reg->next = comm->regs;
    comm->regs = reg;
    *handle_out = reg;
    return PLAIT_SUCCESS;
}

void plait_comm_regs_free(struct plait_comm *comm)
{
    while (comm->regs) {
        struct plait_reg *r = comm->regs;
        comm->regs = r->next;
        r->magic = 0;
        free(r);
    }
}

plait_result_t plait_comm_deregister(plait_comm_t comm, void *handle)
{
    plait_result_t hs = plait_comm_check_handle(comm, "plait_comm_deregister");
    if (hs)
        return hs;
    /* The communicator's list is the registry of its registrations: a handle
     * is looked for there before anything is read through it. */
    for (struct plait_reg **pp = &comm->regs; *pp; pp = &(*pp)->next)
        if (*pp == handle) {
            struct plait_reg *reg = *pp;
            *pp = reg->next;
            reg->magic = 0;
            plait_handle_retire(PLAIT_RETIRE_OTHER, reg);
            return PLAIT_SUCCESS;
        }
    return plait_error(PLAIT_ERR_INVALID_ARGUMENT,
                       "plait_comm_deregister: handle %p is not a live registration of this comm (not returned by "
                       "plait_comm_register on it, or deregistered already)",
                       handle);
}
