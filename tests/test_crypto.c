/* base/crypto.c: SHA-256 and HMAC-SHA-256 against published vectors, random
 * bytes, and the challenge-response's step functions (no I/O). */
#define _GNU_SOURCE
#include <criterion/criterion.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/crypto.h"

static void hex(const uint8_t *p, size_t n, char *out)
{
    for (size_t i = 0; i < n; i++)
        sprintf(out + 2 * i, "%02x", p[i]);
}

static const uint8_t test_secret[PLAIT_SECRET_BYTES] = "0123456789abcdef0123456789abcde";

/* ---------------------------------------------------------------- SHA-256, HMAC */

static void check_sha(const void *data, size_t len, const char *expect)
{
    uint8_t d[32];
    char h[65];
    plait_sha256(data, len, d);
    hex(d, 32, h);
    cr_assert_str_eq(h, expect, "sha256 of %zu bytes", len);
}

Test(crypto, sha256_vectors, .timeout = 10)
{
    /* FIPS 180-4 examples (via NIST's SHA-256 example document). */
    check_sha("", 0, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    check_sha("abc", 3, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    const char *m448 = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
    check_sha(m448, strlen(m448), "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
    const char *m896 = "abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnopjklmnopqklmnopqrlmnopqrsmn"
                       "opqrstnopqrstu";
    check_sha(m896, strlen(m896), "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1");
    char *million = malloc(1000000);
    cr_assert(million);
    memset(million, 'a', 1000000);
    check_sha(million, 1000000, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
    /* Lengths around the padding boundaries. */
    static const struct {
        size_t n;
        const char *h;
    } a_runs[] = {
        {55, "9f4390f8d30c2dd92ec9f095b65e2b9ae9b0a925a5258e241c9f1e910f734318"},
        {56, "b35439a4ac6f0948b6d6f9e3c6af0f5f590ce20f1bde7090ef7970686ec6738a"},
        {63, "7d3e74a05d7db15bce4ad9ec0658ea98e3f06eeecf16b4c6fff2da457ddc2f34"},
        {64, "ffe054fe7ae0cb6dc65c3af9b61d5209f439851db43d0ba5997337df154668eb"},
        {65, "635361c48bb9eab14198e76ea8ab7f1a41685d6ad62aa9146d301d4f17eb0ae0"},
        {119, "31eba51c313a5c08226adf18d4a359cfdfd8d2e816b13f4af952f7ea6584dcfb"},
        {120, "2f3d335432c70b580af0e8e1b3674a7c020d683aa5f73aaaedfdc55af904c21c"},
        {1000, "41edece42d63e8d9bf515a9ba6932e1c20cbc9f5a5d134645adb5db1b9737ea3"},
    };
    for (size_t i = 0; i < sizeof(a_runs) / sizeof(a_runs[0]); i++)
        check_sha(million, a_runs[i].n, a_runs[i].h);
    free(million);
}

static void check_hmac(const uint8_t *key, size_t klen, const void *data, size_t dlen, const char *expect)
{
    uint8_t d[32];
    char h[65];
    plait_hmac_sha256(key, klen, data, dlen, d);
    hex(d, 32, h);
    cr_assert(strncmp(h, expect, strlen(expect)) == 0, "hmac: got %s, expected %s", h, expect);
}

Test(crypto, hmac_rfc4231, .timeout = 10)
{
    uint8_t k[131], d[50];

    memset(k, 0x0b, 20);
    check_hmac(k, 20, "Hi There", 8, "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
    check_hmac((const uint8_t *)"Jefe", 4, "what do ya want for nothing?", 28,
               "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
    memset(k, 0xaa, 20);
    memset(d, 0xdd, 50);
    check_hmac(k, 20, d, 50, "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe");
    for (int i = 0; i < 25; i++)
        k[i] = (uint8_t)(i + 1);
    memset(d, 0xcd, 50);
    check_hmac(k, 25, d, 50, "82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b");
    memset(k, 0x0c, 20);
    check_hmac(k, 20, "Test With Truncation", 20, "a3b6167473100ee06e0c796c2955552b"); /* truncated to 128 bits */
    memset(k, 0xaa, 131);
    const char *t6 = "Test Using Larger Than Block-Size Key - Hash Key First";
    check_hmac(k, 131, t6, strlen(t6), "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
    const char *t7 = "This is a test using a larger than block-size key and a larger than block-size data. The key "
                     "needs to be hashed before being used by the HMAC algorithm.";
    check_hmac(k, 131, t7, strlen(t7), "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2");
}

Test(crypto, random_bytes, .timeout = 10)
{
    uint8_t a[64], b[64], zero[64] = {0};
    cr_assert_eq(plait_random_bytes(a, sizeof(a)), PLAIT_SUCCESS);
    cr_assert_eq(plait_random_bytes(b, sizeof(b)), PLAIT_SUCCESS);
    cr_assert(memcmp(a, b, sizeof(a)) != 0);
    cr_assert(memcmp(a, zero, sizeof(a)) != 0);
}

/* ---------------------------------------------------------------- challenge-response steps */

/* The step functions: a replayed challenge nonce and a flipped MAC bit fail. */
Test(crypto, auth_steps, .timeout = 10)
{
    struct plait_auth s, c;
    uint8_t ch[PLAIT_AUTH_CHALLENGE_BYTES], ans[PLAIT_AUTH_ANSWER_BYTES], proof[PLAIT_AUTH_PROOF_BYTES];

    cr_assert_eq(plait_auth_server_challenge(&s, ch), PLAIT_SUCCESS);
    cr_assert(plait_auth_client_answer(&c, test_secret, ch, ans));
    ans[40] ^= 0x80;
    cr_assert_not(plait_auth_server_check(&s, test_secret, ans, proof));
    ans[40] ^= 0x80;
    cr_assert(plait_auth_server_check(&s, test_secret, ans, proof));
    cr_assert(plait_auth_client_check(&c, test_secret, proof));
    proof[0] ^= 1;
    cr_assert_not(plait_auth_client_check(&c, test_secret, proof));
    /* The secret itself never appears in a message. */
    cr_assert(memmem(ans, sizeof(ans), test_secret, 8) == NULL);
    /* A client answering with the server's own nonce is refused. */
    memcpy(ans, ch + PLAIT_AUTH_TAG_BYTES, 32);
    cr_assert_not(plait_auth_server_check(&s, test_secret, ans, proof));
}
