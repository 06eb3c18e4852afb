/* The net transport (transports/net.c): FIFO slots between hosts through a
 * net provider (transports/net/provider.h), chosen by PLAIT_NET_PROVIDER
 * (default: socket). The only transport between hosts.
 * docs/architecture.md, section 4, "The net transport". */
#ifndef PLAIT_TRANSPORTS_NET_H
#define PLAIT_TRANSPORTS_NET_H

#include "transports/transport.h"

extern const struct plait_transport plait_transport_net; /* "net" */

/* Tests only: communicators made after this call use p where their
 * PLAIT_NET_PROVIDER names the Socket provider (NULL: the real one again).
 * A test double wraps the Socket provider to check how the transport uses
 * the interface (tests/test_net_reg.c: registrations). */
struct plait_net_provider;
void plait_net_provider_substitute(const struct plait_net_provider *p);

/* The socket under a net connection (tests write on it what a hostile peer
 * would; diagnostics): the control socket of its send comm (send != 0) or of
 * its recv comm, -1 for another transport's connection, one not made yet, or
 * a provider other than Socket. */
int plait_net_conn_fd(const struct plait_conn *conn, int send);

#endif
