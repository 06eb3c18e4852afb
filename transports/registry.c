/* The transports a communicator may use, in set-up order, and the choice of
 * one per pair of ranks: the highest priority that can_join() gives. */
#include "transports/transport.h"
#include "transports/net.h"

const struct plait_transport *const plait_transports[] = {
    &plait_transport_inproc,
    &plait_transport_shm,
    &plait_transport_net,
};
const int plait_ntransports = (int)(sizeof(plait_transports) / sizeof(plait_transports[0]));

_Static_assert(sizeof(plait_transports) / sizeof(plait_transports[0]) <= PLAIT_TP_MAX, "PLAIT_TP_MAX is too small");

int plait_tp_choose(const struct plait_tp_env *env, int a, int b)
{
    int best = -1, best_prio = 0;
    for (int t = 0; t < plait_ntransports; t++) {
        const int prio = plait_transports[t]->can_join(env, a, b);
        if (prio > best_prio) {
            best = t;
            best_prio = prio;
        }
    }
    return best;
}
