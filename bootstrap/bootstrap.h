/* Bootstrap: how the ranks of a communicator find each other at init.
 *
 * The unique id holds the root's address and a secret. Each rank listens on a
 * port of its own, connects to the root, proves it holds the secret, and sends its
 * rank and listening address; once every rank has registered, the root answers
 * each rank with its successor's address (only that: the root's traffic stays
 * O(nranks); a rank that wants every address allgathers them over the ring).
 * Then each rank connects to its successor (rank+1 mod n), authenticated the
 * same way, forming the setup ring that carries allgathers and barriers.
 * Setup traffic is small; every wait has the init deadline and polls the abort
 * flag. Nothing received is trusted: sizes and ranks are checked. Wire formats
 * are described at the top of bootstrap.c. */
#ifndef PLAIT_BOOTSTRAP_H
#define PLAIT_BOOTSTRAP_H

#include <stddef.h>
#include <stdint.h>
#include "plait.h"
#include "base/net.h"

/* The layout behind plait_unique_id_t (fits in its 128 bytes). */
struct plait_uid {
    uint32_t magic;       /* PLAIT_UID_MAGIC */
    uint32_t version;     /* PLAIT_UID_VERSION */
    union plait_sockaddr root;
    uint8_t secret[PLAIT_SECRET_BYTES];
    uint64_t nonce;       /* random: tells communicators made from different ids apart */
    uint32_t is_authenticated; /* 0 when the secret is a well-known default (env launch without PLAIT_SECRET) */
};
#define PLAIT_UID_MAGIC 0x706c7569u
#define PLAIT_UID_VERSION 1u

struct plait_bootstrap_opts {
    double timeout_s;          /* setup deadline in seconds (PLAIT_TIMEOUT); <= 0: none */
    const int *abort_flag;     /* polled by every wait; may be NULL */
    const char *ifname_spec;   /* PLAIT_SOCKET_IFNAME */
    int start_root;            /* this rank starts the root (the uid was made from an address, e.g. PLAIT_COMM_ID) */
};

struct plait_bootstrap;

/* Makes a unique id and starts its root: a background thread of this process,
 * listening on `fixed_addr` when non-NULL (PLAIT_COMM_ID) else on an ephemeral port
 * of the interface chosen by ifname_spec. The root serves one communicator, then
 * exits; it also exits when timeout_s (> 0) passes without a new rank
 * registering (counted from creation, then from each registration), telling the
 * ranks already there (their init fails with PLAIT_ERR_TIMEOUT). timeout_s <= 0:
 * it waits for ever. The secret is random; is_authenticated = 1.
 * Failures: PLAIT_ERR_INVALID_ARGUMENT (NULL id_out), PLAIT_ERR_SYSTEM (no
 * interface, bind/listen failed, no thread). Thread-safe. */
plait_result_t plait_bootstrap_create_root(const char *ifname_spec, const union plait_sockaddr *fixed_addr,
                                           double timeout_s, plait_unique_id_t *id_out);

/* Fills a uid (no root started) from an address and a secret (may be NULL:
 * unauthenticated, is_authenticated = 0, the secret is the SHA-256 of a fixed
 * public string). Used for PLAIT_COMM_ID and launchers. Deterministic: every rank
 * calling it with the same address and secret gets the same id (the nonce is
 * derived from both). */
void plait_bootstrap_uid_from_addr(const union plait_sockaddr *root, const uint8_t *secret,
                                   plait_unique_id_t *id_out);

/* Warns on stderr, whatever PLAIT_DEBUG, that this process joins (or serves)
 * a bootstrap without a secret, where anyone who can reach it can join or
 * disrupt the job; `where` names the bootstrap (e.g. "PLAIT_COMM_ID=h:p"). Only
 * the first call in a process prints; plait_bootstrap_init calls it for every
 * unauthenticated id. Thread-safe. */
void plait_bootstrap_warn_unauthenticated(const char *where);

/* Joins the communicator: rank of nranks, through the root named in id. When
 * opts->start_root and rank == 0, starts the root listening on id's address
 * first (other ranks retry their connection until it is up). Blocks until the
 * setup ring is up or the deadline passes. opts may be NULL (no deadline, no
 * abort flag, default interface). Without ifname_spec, a rank listens on the
 * local address of its connection to the root (the interface that routes to the
 * job). nranks == 1 opens no peer sockets (and no root at all with start_root).
 * The deadline and abort flag are kept for later allgathers and barriers (each
 * gets timeout_s of its own).
 * Failures: PLAIT_ERR_INVALID_ARGUMENT (NULL, rank/nranks out of range, not a
 * valid id); PLAIT_ERR_TIMEOUT (some rank never came; the root reports how many
 * did); PLAIT_ERR_REMOTE (authentication failed, a peer vanished, or "aborted");
 * PLAIT_ERR_INVALID_USAGE (ranks disagree on nranks; or two registrations claim
 * one rank, which fails every rank of the job at once, naming both addresses);
 * PLAIT_ERR_SYSTEM. *bs_out is written only on success. */
plait_result_t plait_bootstrap_init(const plait_unique_id_t *id, int rank, int nranks,
                                    const struct plait_bootstrap_opts *opts, struct plait_bootstrap **bs_out);

/* Every rank contributes `size` bytes at data + rank*size; on return data holds
 * every rank's contribution. Every rank must pass the same size (checked: a
 * mismatch, or ranks calling allgather and barrier out of step, fails with
 * PLAIT_ERR_INVALID_USAGE). After any failure the ring is unusable and later
 * calls fail; close the bootstrap. One thread at a time per bootstrap. */
plait_result_t plait_bootstrap_allgather(struct plait_bootstrap *bs, void *data, size_t size);

/* Returns when every rank has entered. */
plait_result_t plait_bootstrap_barrier(struct plait_bootstrap *bs);

/* The communicator's secret (PLAIT_SECRET_BYTES bytes, for authenticating data
 * connections; owned by bs) and whether it is a real one (0: the well-known
 * default of an unauthenticated launch). */
const uint8_t *plait_bootstrap_secret(const struct plait_bootstrap *bs);
int plait_bootstrap_is_authenticated(const struct plait_bootstrap *bs);

/* The setup ring's sockets (to successor and from predecessor), for liveness
 * checks: a dead neighbour closes them. -1 when nranks == 1. */
int plait_bootstrap_next_fd(const struct plait_bootstrap *bs);
int plait_bootstrap_prev_fd(const struct plait_bootstrap *bs);

/* Death notices on the setup ring (see bootstrap.c): once the communicator is
 * up, a rank whose operation failed because `culprit` died tells its ring
 * neighbours, which tell theirs when they fail in turn, so that every rank
 * names the first failed rank whatever transport showed it the failure.
 *
 * notify_death: sends the notice (the first call only; later ones do nothing).
 * Non-blocking; a neighbour that is gone is skipped. Call it before returning
 * the error, so that the notice precedes this rank's exit.
 * poll_notices: reads what notices have arrived, without blocking (not the
 * predecessor's connection while a ring allgather or barrier runs); returns 1
 * and the rank the first one named, and the neighbour it came from, else 0.
 * neighbour_died: whether `rank` is a ring neighbour whose connection has
 * ended (as seen by poll_notices) with no notice first: that process died, or
 * left without reporting a failure.
 * poll_notices and neighbour_died: one thread at a time per bootstrap
 * (plait_comm_check_peers holds the comm's peers_lock). notify_death: any
 * thread, including one inside a ring allgather or barrier; what goes to the
 * successor waits for the ring's lock (never blocking on it) and is sent
 * between two ring steps. */
void plait_bootstrap_notify_death(struct plait_bootstrap *bs, int culprit);
int plait_bootstrap_poll_notices(struct plait_bootstrap *bs, int *culprit_out, int *from_out);
int plait_bootstrap_neighbour_died(const struct plait_bootstrap *bs, int rank);

/* Closes sockets and frees. NULL is a no-op. */
void plait_bootstrap_close(struct plait_bootstrap *bs);

/* How many root threads of this process are still running (each exits once its
 * communicator has formed, or after timeout_s without a new rank arriving). For
 * tests and leak checks. Thread-safe. */
int plait_bootstrap_roots_running(void);

#endif
