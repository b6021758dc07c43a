/* Tests for strata/hash.h: SHA-256 against the FIPS 180-2 / NIST example
 * vectors, one-shot and streaming, and the independence of the digest from
 * how the message is split into updates. */
#include "strata/hash.h"
#include "test_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void to_hex(const uint8_t *h, char out[2 * STRATA_SHA256_LEN + 1])
{
    for (int i = 0; i < STRATA_SHA256_LEN; i++)
        snprintf(out + 2 * i, 3, "%02x", h[i]);
}

/* One NIST example: message and expected digest. */
typedef struct {
    const char *in;
    const char *hex;
} vector;

static const vector VECTORS[] = {
    {"", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"},
    {"abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"},
    {"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq",
     "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"},
};

static void test_vectors(void)
{
    char got[2 * STRATA_SHA256_LEN + 1];
    uint8_t h[STRATA_SHA256_LEN];
    for (size_t i = 0; i < sizeof(VECTORS) / sizeof(VECTORS[0]); i++) {
        strata_sha256(VECTORS[i].in, strlen(VECTORS[i].in), h);
        to_hex(h, got);
        CU_ASSERT_STRING_EQUAL(got, VECTORS[i].hex);
    }
    /* NULL with length 0 is the empty message. */
    strata_sha256(NULL, 0, h);
    to_hex(h, got);
    CU_ASSERT_STRING_EQUAL(got, VECTORS[0].hex);
}

static void test_million_a(void)
{
    static const char want[] = "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0";
    char got[2 * STRATA_SHA256_LEN + 1];
    uint8_t h[STRATA_SHA256_LEN];
    char *a = malloc(1000000);
    CU_ASSERT_PTR_NOT_NULL_FATAL(a);
    memset(a, 'a', 1000000);
    strata_sha256(a, 1000000, h); /* many blocks in one call */
    to_hex(h, got);
    CU_ASSERT_STRING_EQUAL(got, want);
    /* The same message in uneven pieces that straddle block boundaries. */
    strata_sha256_ctx c;
    strata_sha256_init(&c);
    for (size_t off = 0, step = 1; off < 1000000; off += step, step = step % 97 + 13) {
        size_t n = off + step > 1000000 ? 1000000 - off : step;
        strata_sha256_update(&c, a + off, n);
    }
    strata_sha256_final(&c, h);
    to_hex(h, got);
    CU_ASSERT_STRING_EQUAL(got, want);
    free(a);
}

/* Every split of the 448-bit message into two updates (with an empty update
 * between) gives the one-shot digest; so do byte-by-byte updates. */
static void test_split_at_every_offset(void)
{
    const char *msg = VECTORS[2].in;
    size_t n = strlen(msg);
    uint8_t want[STRATA_SHA256_LEN], h[STRATA_SHA256_LEN];
    strata_sha256(msg, n, want);
    for (size_t cut = 0; cut <= n; cut++) {
        strata_sha256_ctx c;
        strata_sha256_init(&c);
        strata_sha256_update(&c, msg, cut);
        strata_sha256_update(&c, NULL, 0);
        strata_sha256_update(&c, msg + cut, n - cut);
        strata_sha256_final(&c, h);
        CU_ASSERT_EQUAL(memcmp(h, want, sizeof(h)), 0);
    }
    strata_sha256_ctx c;
    strata_sha256_init(&c);
    for (size_t i = 0; i < n; i++)
        strata_sha256_update(&c, msg + i, 1);
    strata_sha256_final(&c, h);
    CU_ASSERT_EQUAL(memcmp(h, want, sizeof(h)), 0);
    /* A context can be started again after final. */
    strata_sha256_init(&c);
    strata_sha256_update(&c, "abc", 3);
    strata_sha256_final(&c, h);
    char got[2 * STRATA_SHA256_LEN + 1];
    to_hex(h, got);
    CU_ASSERT_STRING_EQUAL(got, VECTORS[1].hex);
}

/* Lengths around the padding boundary (55, 56, 63, 64, 65 bytes) must differ
 * from each other and be stable between one-shot and streaming. */
static void test_padding_boundaries(void)
{
    static const size_t lens[] = {55, 56, 57, 63, 64, 65, 119, 120, 128};
    uint8_t buf[128], digests[9][STRATA_SHA256_LEN];
    memset(buf, 'x', sizeof(buf));
    for (size_t i = 0; i < 9; i++) {
        strata_sha256(buf, lens[i], digests[i]);
        strata_sha256_ctx c;
        uint8_t h[STRATA_SHA256_LEN];
        strata_sha256_init(&c);
        strata_sha256_update(&c, buf, lens[i] / 2);
        strata_sha256_update(&c, buf + lens[i] / 2, lens[i] - lens[i] / 2);
        strata_sha256_final(&c, h);
        CU_ASSERT_EQUAL(memcmp(h, digests[i], sizeof(h)), 0);
        for (size_t j = 0; j < i; j++)
            CU_ASSERT_NOT_EQUAL(memcmp(digests[i], digests[j], STRATA_SHA256_LEN), 0);
    }
}

int main(void)
{
    CU_TestInfo tests[] = {
        {"NIST vectors", test_vectors},
        {"one million 'a'", test_million_a},
        {"split at every offset", test_split_at_every_offset},
        {"padding boundaries", test_padding_boundaries},
        CU_TEST_INFO_NULL,
    };
    CU_SuiteInfo suites[] = {
        {"hash", NULL, NULL, NULL, NULL, tests},
        CU_SUITE_INFO_NULL,
    };
    return strata_test_run(suites);
}
