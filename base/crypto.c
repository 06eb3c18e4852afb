/* Random bytes, SHA-256, HMAC-SHA-256 and the steps of the challenge-response
 * every plait connection starts with (no I/O here: base/net.c runs it over a
 * socket). See crypto.h for the contracts. */
#define _GNU_SOURCE
#include "base/crypto.h"

#include <errno.h>
#include <string.h>
#include <sys/random.h>

#include "base/log.h"

/* ---------------------------------------------------------------- random */

plait_result_t plait_random_bytes(void *buf, size_t len)
{
    uint8_t *p = buf;
    size_t done = 0;

    while (done < len) {
        ssize_t rc = getrandom(p + done, len - done, 0);
        if (rc < 0) {
            if (errno == EINTR)
                continue;
            return plait_error(PLAIT_ERR_SYSTEM, "getrandom: %s", strerror(errno));
        }
        done += (size_t)rc;
    }
    return PLAIT_SUCCESS;
}

/* ---------------------------------------------------------------- SHA-256 (FIPS 180-4) */

struct sha256_ctx {
    uint32_t h[8];
    uint64_t total; /* bytes hashed so far */
    uint8_t block[64];
    size_t fill;    /* bytes waiting in block */
};

static const uint32_t sha256_k[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
};

static inline uint32_t rotr32(uint32_t x, unsigned n)
{
    return (x >> n) | (x << (32 - n));
}

static void sha256_compress(uint32_t h[8], const uint8_t b[64])
{
    uint32_t w[64];

    for (int t = 0; t < 16; t++)
        w[t] = (uint32_t)b[4 * t] << 24 | (uint32_t)b[4 * t + 1] << 16 | (uint32_t)b[4 * t + 2] << 8 |
               (uint32_t)b[4 * t + 3];
    for (int t = 16; t < 64; t++) {
        uint32_t s0 = rotr32(w[t - 15], 7) ^ rotr32(w[t - 15], 18) ^ (w[t - 15] >> 3);
        uint32_t s1 = rotr32(w[t - 2], 17) ^ rotr32(w[t - 2], 19) ^ (w[t - 2] >> 10);
        w[t] = w[t - 16] + s0 + w[t - 7] + s1;
    }
    uint32_t a = h[0], bb = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], hh = h[7];
    for (int t = 0; t < 64; t++) {
        uint32_t t1 = hh + (rotr32(e, 6) ^ rotr32(e, 11) ^ rotr32(e, 25)) + ((e & f) ^ (~e & g)) + sha256_k[t] + w[t];
        uint32_t t2 = (rotr32(a, 2) ^ rotr32(a, 13) ^ rotr32(a, 22)) + ((a & bb) ^ (a & c) ^ (bb & c));
        hh = g;
        g = f;
        f = e;
        e = d + t1;
        d = c;
        c = bb;
        bb = a;
        a = t1 + t2;
    }
    h[0] += a;
    h[1] += bb;
    h[2] += c;
    h[3] += d;
    h[4] += e;
    h[5] += f;
    h[6] += g;
    h[7] += hh;
}

static void sha256_init(struct sha256_ctx *c)
{
    static const uint32_t iv[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                   0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    memcpy(c->h, iv, sizeof(iv));
    c->total = 0;
    c->fill = 0;
}

static void sha256_update(struct sha256_ctx *c, const void *data, size_t len)
{
    const uint8_t *p = data;

    c->total += len;
    if (c->fill) {
        size_t n = 64 - c->fill < len ? 64 - c->fill : len;
        memcpy(c->block + c->fill, p, n);
        c->fill += n;
        p += n;
        len -= n;
        if (c->fill < 64)
            return;
        sha256_compress(c->h, c->block);
        c->fill = 0;
    }
    while (len >= 64) {
        sha256_compress(c->h, p);
        p += 64;
        len -= 64;
    }
    if (len) {
        memcpy(c->block, p, len);
        c->fill = len;
    }
}

static void sha256_final(struct sha256_ctx *c, uint8_t out[32])
{
    uint64_t bits = c->total * 8;
    uint8_t pad[72];
    /* 0x80, zeros up to 56 mod 64, then the length in bits, big-endian. */
    size_t padlen = (c->fill < 56 ? 56 - c->fill : 120 - c->fill);

    memset(pad, 0, sizeof(pad));
    pad[0] = 0x80;
    for (int i = 0; i < 8; i++)
        pad[padlen + (size_t)i] = (uint8_t)(bits >> (56 - 8 * i));
    sha256_update(c, pad, padlen + 8);
    for (int i = 0; i < 8; i++) {
        out[4 * i] = (uint8_t)(c->h[i] >> 24);
        out[4 * i + 1] = (uint8_t)(c->h[i] >> 16);
        out[4 * i + 2] = (uint8_t)(c->h[i] >> 8);
        out[4 * i + 3] = (uint8_t)c->h[i];
    }
    explicit_bzero(c, sizeof(*c));
}

void plait_sha256(const void *data, size_t len, uint8_t out[32])
{
    struct sha256_ctx c;
    sha256_init(&c);
    sha256_update(&c, data, len);
    sha256_final(&c, out);
}

/* ---------------------------------------------------------------- HMAC-SHA-256 (RFC 2104) */

struct hmac_ctx {
    struct sha256_ctx inner, outer;
};

static void hmac_init(struct hmac_ctx *c, const uint8_t *key, size_t key_len)
{
    uint8_t k[64], pad[64];

    memset(k, 0, sizeof(k));
    if (key_len > 64)
        plait_sha256(key, key_len, k);
    else if (key_len)
        memcpy(k, key, key_len);
    for (int i = 0; i < 64; i++)
        pad[i] = k[i] ^ 0x36;
    sha256_init(&c->inner);
    sha256_update(&c->inner, pad, 64);
    for (int i = 0; i < 64; i++)
        pad[i] = k[i] ^ 0x5c;
    sha256_init(&c->outer);
    sha256_update(&c->outer, pad, 64);
    explicit_bzero(k, sizeof(k));
    explicit_bzero(pad, sizeof(pad));
}

static void hmac_final(struct hmac_ctx *c, uint8_t out[32])
{
    uint8_t inner[32];
    sha256_final(&c->inner, inner);
    sha256_update(&c->outer, inner, sizeof(inner));
    sha256_final(&c->outer, out);
    explicit_bzero(inner, sizeof(inner));
}

void plait_hmac_sha256(const uint8_t *key, size_t key_len, const void *data, size_t len, uint8_t out[32])
{
    struct hmac_ctx c;
    hmac_init(&c, key, key_len);
    sha256_update(&c.inner, data, len);
    hmac_final(&c, out);
}

/* ---------------------------------------------------------------- challenge-response */

static const uint8_t auth_tag[PLAIT_AUTH_TAG_BYTES] = {'P', 'L', 'A', 'I', 'T', 'A', 'U', '1'};

/* HMAC(secret, role || first || second): role "c" for the client's answer, "s"
 * for the server's proof. The distinct roles (and nonce orders) mean neither side
 * can be made to compute what it would have to receive, so one side's messages
 * cannot be reflected back at it. */
static void auth_mac(const uint8_t secret[PLAIT_SECRET_BYTES], char role, const uint8_t first[32],
                     const uint8_t second[32], uint8_t out[32])
{
    struct hmac_ctx c;
    uint8_t r = (uint8_t)role;
    hmac_init(&c, secret, PLAIT_SECRET_BYTES);
    sha256_update(&c.inner, &r, 1);
    sha256_update(&c.inner, first, 32);
    sha256_update(&c.inner, second, 32);
    hmac_final(&c, out);
}

/* Compares without an early exit, so the time taken says nothing about how many
 * leading bytes of a forged MAC were right. */
static int equal_ct(const uint8_t *a, const uint8_t *b, size_t n)
{
    volatile uint8_t diff = 0;
    for (size_t i = 0; i < n; i++)
        diff |= a[i] ^ b[i];
    return diff == 0;
}

plait_result_t plait_auth_server_challenge(struct plait_auth *st, uint8_t challenge_out[PLAIT_AUTH_CHALLENGE_BYTES])
{
    plait_result_t status = plait_random_bytes(st->server_nonce, sizeof(st->server_nonce));
    if (status != PLAIT_SUCCESS)
        return status;
    memset(st->client_nonce, 0, sizeof(st->client_nonce));
    memcpy(challenge_out, auth_tag, PLAIT_AUTH_TAG_BYTES);
    memcpy(challenge_out + PLAIT_AUTH_TAG_BYTES, st->server_nonce, 32);
    return PLAIT_SUCCESS;
}

int plait_auth_server_check(struct plait_auth *st, const uint8_t secret[PLAIT_SECRET_BYTES],
                            const uint8_t answer[PLAIT_AUTH_ANSWER_BYTES], uint8_t proof_out[PLAIT_AUTH_PROOF_BYTES])
{
    uint8_t expect[32];

    memcpy(st->client_nonce, answer, 32);
    /* A client that echoes our nonce is replaying our own challenge at us. */
    if (equal_ct(st->client_nonce, st->server_nonce, 32))
        return 0;
    auth_mac(secret, 'c', st->server_nonce, st->client_nonce, expect);
    int is_ok = equal_ct(expect, answer + 32, 32);
    explicit_bzero(expect, sizeof(expect));
    if (!is_ok)
        return 0;
    auth_mac(secret, 's', st->client_nonce, st->server_nonce, proof_out);
    return 1;
}

int plait_auth_client_answer(struct plait_auth *st, const uint8_t secret[PLAIT_SECRET_BYTES],
                             const uint8_t challenge[PLAIT_AUTH_CHALLENGE_BYTES],
                             uint8_t answer_out[PLAIT_AUTH_ANSWER_BYTES])
{
    if (memcmp(challenge, auth_tag, PLAIT_AUTH_TAG_BYTES) != 0)
        return 0;
    memcpy(st->server_nonce, challenge + PLAIT_AUTH_TAG_BYTES, 32);
    if (plait_random_bytes(st->client_nonce, sizeof(st->client_nonce)) != PLAIT_SUCCESS)
        return 0;
    memcpy(answer_out, st->client_nonce, 32);
    auth_mac(secret, 'c', st->server_nonce, st->client_nonce, answer_out + 32);
    return 1;
}

int plait_auth_client_check(const struct plait_auth *st, const uint8_t secret[PLAIT_SECRET_BYTES],
                            const uint8_t proof[PLAIT_AUTH_PROOF_BYTES])
{
    uint8_t expect[32];
    auth_mac(secret, 's', st->client_nonce, st->server_nonce, expect);
    int is_ok = equal_ct(expect, proof, 32);
    explicit_bzero(expect, sizeof(expect));
    return is_ok;
}
