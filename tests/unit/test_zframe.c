#include "strata/zframe.h"
#include "test_util.h"

#include <stdlib.h>
#include <string.h>

static void test_round_trip_reused(void)
{
    strata_zctx *z = NULL;
    CU_ASSERT_EQUAL_FATAL(strata_zctx_new(&z), STRATA_OK);
    uint8_t in[5000];
    for (size_t i = 0; i < sizeof in; i++)
        in[i] = (uint8_t)(i % 7);
    for (int level = 1; level <= 3; level++) {
        uint8_t *f = NULL, *back = NULL;
        size_t fn = 0, bn = 0;
        CU_ASSERT_EQUAL_FATAL(strata_zframe_compress(z, in, sizeof in, level, &f, &fn, NULL),
                              STRATA_OK);
        CU_ASSERT(fn > 0 && fn < sizeof in / 4);
        CU_ASSERT_EQUAL_FATAL(
            strata_zframe_decompress(z, f, fn, sizeof in, sizeof in, &back, &bn, NULL), STRATA_OK);
        CU_ASSERT_EQUAL(bn, sizeof in);
        CU_ASSERT(memcmp(back, in, sizeof in) == 0);
        /* The same frame through a temporary context. */
        free(back);
        CU_ASSERT_EQUAL(strata_zframe_decompress(NULL, f, fn, 0, 1 << 20, &back, &bn, NULL),
                        STRATA_OK);
        CU_ASSERT_EQUAL(bn, sizeof in);
        free(back);
        free(f);
    }
    strata_zctx_free(z);
}

static void test_refusals(void)
{
    uint8_t *f = NULL, *back = (uint8_t *)"x";
    size_t fn = 0, bn = 9;
    strata_diag d;
    CU_ASSERT_EQUAL(strata_zframe_compress(NULL, "abc", 3, 0, &f, &fn, &d), STRATA_EINVAL);
    CU_ASSERT_EQUAL_FATAL(strata_zframe_compress(NULL, "hello hello", 11, 1, &f, &fn, NULL),
                          STRATA_OK);
    CU_ASSERT_EQUAL(strata_zframe_decompress(NULL, f, fn, 0, 10, &back, &bn, &d), STRATA_ETOOBIG);
    CU_ASSERT_PTR_NULL(back);
    CU_ASSERT_EQUAL(bn, 0);
    CU_ASSERT(strstr(d.msg, "above the limit of 10") != NULL);
    CU_ASSERT_EQUAL(strata_zframe_decompress(NULL, f, fn, 12, 100, &back, &bn, &d), STRATA_EPROTO);
    CU_ASSERT(strstr(d.msg, "below the 12-byte minimum") != NULL);
    CU_ASSERT_EQUAL(strata_zframe_decompress(NULL, f, fn - 1, 0, 100, &back, &bn, &d),
                    STRATA_EPROTO);
    uint8_t two[256];
    CU_ASSERT_FATAL(2 * fn <= sizeof two);
    memcpy(two, f, fn);
    memcpy(two + fn, f, fn);
    CU_ASSERT_EQUAL(strata_zframe_decompress(NULL, two, 2 * fn, 0, 100, &back, &bn, &d),
                    STRATA_EPROTO);
    CU_ASSERT(strstr(d.msg, "a second frame") != NULL);
    CU_ASSERT_EQUAL(
        strata_zframe_decompress(NULL, (const uint8_t *)"abcdef", 6, 0, 100, &back, &bn, &d),
        STRATA_EPROTO);
    CU_ASSERT(strstr(d.msg, "not a zstd frame") != NULL);
    CU_ASSERT_EQUAL(strata_zframe_decompress(NULL, f, 3, 0, 100, &back, &bn, &d), STRATA_EPROTO);
    free(f);
}

int main(void)
{
    CU_TestInfo tests[] = {
        {"round trip with a reused context", test_round_trip_reused},
        {"limits and malformed frames", test_refusals},
        CU_TEST_INFO_NULL,
    };
    CU_SuiteInfo suites[] = {
        {"zframe", NULL, NULL, NULL, NULL, tests},
        CU_SUITE_INFO_NULL,
    };
    return strata_test_run(suites);
}
