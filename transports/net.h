/* The net transport (transports/net.c): FIFO slots between hosts through a
 * net provider (transports/net/provider.h), chosen by PLAIT_NET_PROVIDER
 * (default: socket). The only transport between hosts.
 * docs/architecture.md, section 4, "The net transport". */
#ifndef PLAIT_TRANSPORTS_NET_H
#define PLAIT_TRANSPORTS_NET_H

#include "transports/transport.h"

extern const struct plait_transport plait_transport_net; /* "net" */

/* The socket under a net connection (tests write on it what a hostile peer
 * would; diagnostics): the control socket of its send comm (send != 0) or of
 * its recv comm, -1 for another transport's connection, one not made yet, or
 * a provider other than Socket. */
int plait_net_conn_fd(const struct plait_conn *conn, int send);

#endif
