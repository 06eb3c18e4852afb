/* Random bytes, SHA-256, HMAC-SHA-256, and the challenge-response handshake
 * that authenticates every plait connection with a shared secret. */
#ifndef PLAIT_CRYPTO_H
#define PLAIT_CRYPTO_H

#include <stddef.h>
#include <stdint.h>
#include "plait.h"

#define PLAIT_SECRET_BYTES 32

/* The same handshake in steps, for servers that drive many connections from one
 * poll loop (the bootstrap root must not let one silent peer stall the others).
 * Messages, all fixed-size:
 *   server -> client  challenge: "PLAITAU1" (8 bytes) || Ns (32 random bytes)
 *   client -> server  answer:    Nc (32 random bytes) || HMAC(secret, "c" || Ns || Nc)
 *   server -> client  proof:     HMAC(secret, "s" || Nc || Ns)
 * The step functions do no I/O and set no last-error message. */
#define PLAIT_AUTH_TAG_BYTES 8
#define PLAIT_AUTH_CHALLENGE_BYTES 40
#define PLAIT_AUTH_ANSWER_BYTES 64
#define PLAIT_AUTH_PROOF_BYTES 32

struct plait_auth {
    uint8_t server_nonce[32];
    uint8_t client_nonce[32];
};

/* Server: draws Ns and writes the challenge. PLAIT_ERR_SYSTEM if getrandom fails. */
plait_result_t plait_auth_server_challenge(struct plait_auth *st, uint8_t challenge_out[PLAIT_AUTH_CHALLENGE_BYTES]);
/* Server: checks the client's answer (constant time); on success writes the proof
 * and returns 1, else returns 0 (the caller closes the connection). */
int plait_auth_server_check(struct plait_auth *st, const uint8_t secret[PLAIT_SECRET_BYTES],
                            const uint8_t answer[PLAIT_AUTH_ANSWER_BYTES], uint8_t proof_out[PLAIT_AUTH_PROOF_BYTES]);
/* Client: checks the tag, draws Nc and writes the answer. Returns 0 when the tag
 * is wrong (the peer does not speak this protocol) or getrandom fails, else 1. */
int plait_auth_client_answer(struct plait_auth *st, const uint8_t secret[PLAIT_SECRET_BYTES],
                             const uint8_t challenge[PLAIT_AUTH_CHALLENGE_BYTES],
                             uint8_t answer_out[PLAIT_AUTH_ANSWER_BYTES]);
/* Client: checks the server's proof (constant time). Returns 1 when it is right. */
int plait_auth_client_check(const struct plait_auth *st, const uint8_t secret[PLAIT_SECRET_BYTES],
                            const uint8_t proof[PLAIT_AUTH_PROOF_BYTES]);

/* Cryptographically random bytes (getrandom). */
plait_result_t plait_random_bytes(void *buf, size_t len);

/* SHA-256 and HMAC-SHA-256 (FIPS 180-4, RFC 2104). */
void plait_sha256(const void *data, size_t len, uint8_t out[32]);
void plait_hmac_sha256(const uint8_t *key, size_t key_len, const void *data, size_t len, uint8_t out[32]);

#endif
