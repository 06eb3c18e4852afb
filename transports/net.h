/* The net transport (transports/net.c): FIFO slots between hosts through a
 * net provider (transports/net/provider.h), chosen by PLAIT_NET_PROVIDER.
 * docs/architecture.md, section 4, "The net transport". */
#ifndef PLAIT_TRANSPORTS_NET_H
#define PLAIT_TRANSPORTS_NET_H

#include "transports/transport.h"

extern const struct plait_transport plait_transport_net; /* "net" */

#endif
