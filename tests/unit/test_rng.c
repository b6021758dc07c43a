#include "strata/rng.h"
#include "test_util.h"

static void test_mix64(void)
{
    /* The first output of splitmix64 from state 0 (the published reference
     * value), and the fixed point 0. */
    CU_ASSERT_EQUAL(strata_mix64(0x9e3779b97f4a7c15ULL), 0xe220a8397b1dcdafULL);
    CU_ASSERT_EQUAL(strata_mix64(0), 0);
    CU_ASSERT_NOT_EQUAL(strata_mix64(1), strata_mix64(2));
}

static void test_streams(void)
{
    strata_rng a, b, c;
    strata_rng_seed(&a, 42, 0);
    strata_rng_seed(&b, 42, 0);
    strata_rng_seed(&c, 42, 1);
    int same = 1, differ = 0;
    for (int i = 0; i < 100; i++) {
        uint64_t x = strata_rng_u64(&a), y = strata_rng_u64(&b), z = strata_rng_u64(&c);
        same &= x == y;
        differ += x != z;
    }
    CU_ASSERT_TRUE(same);
    CU_ASSERT(differ > 95);
    for (int i = 0; i < 1000; i++) {
        double u = strata_rng_uniform(&a);
        CU_ASSERT(u >= 0.0 && u < 1.0);
        CU_ASSERT(strata_rng_below(&a, 7) < 7);
    }
}

int main(void)
{
    CU_TestInfo tests[] = {
        {"splitmix64 finaliser", test_mix64},
        {"seeds and streams", test_streams},
        CU_TEST_INFO_NULL,
    };
    CU_SuiteInfo suites[] = {
        {"rng", NULL, NULL, NULL, NULL, tests},
        CU_SUITE_INFO_NULL,
    };
    return strata_test_run(suites);
}
