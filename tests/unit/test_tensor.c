#include "strata/error.h"
#include "strata/parse.h"
#include "strata/rng.h"
#include "strata/tensor.h"
#include "test_util.h"

#include <math.h>
#include <string.h>

static void test_list_add_find(void)
{
    strata_tensor_list l;
    strata_tensor_list_init(&l);
    int64_t s1[2] = {3, 4}, s2[1] = {5};
    float v[5] = {1, 2, 3, 4, 5};
    CU_ASSERT_EQUAL(strata_tensor_list_add(&l, "a.weight", 2, s1, NULL), STRATA_OK);
    CU_ASSERT_EQUAL(strata_tensor_list_add(&l, "a.bias", 1, s2, v), STRATA_OK);
    CU_ASSERT_EQUAL(strata_tensor_list_add(&l, "a.bias", 1, s2, v), STRATA_EINVAL);
    CU_ASSERT_EQUAL(strata_tensor_list_add(&l, "", 1, s2, v), STRATA_EINVAL);
    int64_t bad[1] = {0};
    CU_ASSERT_EQUAL(strata_tensor_list_add(&l, "z", 1, bad, NULL), STRATA_EINVAL);
    CU_ASSERT_EQUAL(l.count, 2);
    CU_ASSERT_EQUAL(strata_tensor_list_numel(&l), 17);
    strata_tensor *b = strata_tensor_list_find(&l, "a.bias");
    CU_ASSERT_PTR_NOT_NULL_FATAL(b);
    CU_ASSERT_EQUAL(b->data[4], 5.0f);
    CU_ASSERT_EQUAL(strata_tensor_list_find(&l, "a.weight")->data[11], 0.0f);
    CU_ASSERT_PTR_NULL(strata_tensor_list_find(&l, "nope"));

    strata_tensor_list c;
    strata_tensor_list_init(&c);
    CU_ASSERT_EQUAL(strata_tensor_list_copy(&c, &l), STRATA_OK);
    CU_ASSERT(strata_tensor_list_same_layout(&c, &l));
    int64_t s34[2] = {3, 4}, s43[2] = {4, 3};
    CU_ASSERT_TRUE(strata_tensor_has_layout(&c.items[0], "a.weight", 2, s34));
    CU_ASSERT_FALSE(strata_tensor_has_layout(&c.items[0], "a.weight", 2, s43));
    CU_ASSERT_FALSE(strata_tensor_has_layout(&c.items[0], "a.bias", 2, s34));
    CU_ASSERT_FALSE(strata_tensor_has_layout(&c.items[0], "a.weight", 1, s34));
    CU_ASSERT_FALSE(strata_tensor_has_layout(&c.items[0], NULL, 2, s34));
    c.items[1].shape[0] = 6;
    CU_ASSERT_FALSE(strata_tensor_list_same_layout(&c, &l));
    c.items[1].shape[0] = 5;
    CU_ASSERT_EQUAL(memcmp(c.items[1].data, v, sizeof(v)), 0);
    char buf[64];
    strata_tensor_shape_str(&c.items[0], buf, sizeof(buf));
    CU_ASSERT_STRING_EQUAL(buf, "[3, 4]");

    /* Values into a list of the same layout, every tensor, in place. */
    strata_tensor_list z;
    strata_tensor_list_init(&z);
    CU_ASSERT_EQUAL_FATAL(strata_tensor_list_zeros_like(&z, &l), STRATA_OK);
    l.items[0].data[11] = -2.5f;
    float *keep = z.items[1].data;
    strata_tensor_list_copy_values(&z, &l);
    CU_ASSERT_PTR_EQUAL(z.items[1].data, keep);
    CU_ASSERT_EQUAL(z.items[0].data[11], -2.5f);
    CU_ASSERT_EQUAL(memcmp(z.items[1].data, v, sizeof(v)), 0);
    strata_tensor_list_cleanup(&z);
    strata_tensor_list_cleanup(&c);
    strata_tensor_list_cleanup(&l);
}

static void test_shape_overflow(void)
{
    int64_t huge[4] = {1LL << 40, 1LL << 40, 2, 2};
    size_t n;
    CU_ASSERT_EQUAL(strata_shape_numel(4, huge, &n), STRATA_ETOOBIG);
    CU_ASSERT_EQUAL(strata_shape_numel(5, huge, &n), STRATA_EINVAL);
}

static void test_rng_reproducible_and_moments(void)
{
    strata_rng a, b;
    strata_rng_seed(&a, 42, 0);
    strata_rng_seed(&b, 42, 0);
    for (int i = 0; i < 100; i++)
        CU_ASSERT_EQUAL(strata_rng_u64(&a), strata_rng_u64(&b));
    strata_rng_seed(&b, 42, 1);
    CU_ASSERT_NOT_EQUAL(strata_rng_u64(&a), strata_rng_u64(&b));
    double sum = 0, sum2 = 0, gsum = 0;
    const int n = 200000;
    for (int i = 0; i < n; i++) {
        double x = strata_rng_normal(&a);
        sum += x;
        sum2 += x * x;
        gsum += strata_rng_gamma(&a, 0.5);
    }
    CU_ASSERT(fabs(sum / n) < 0.01);
    CU_ASSERT(fabs(sum2 / n - 1.0) < 0.02);
    CU_ASSERT(fabs(gsum / n - 0.5) < 0.01);
}

static void test_parse_numbers(void)
{
    static const struct {
        const char *text;
        int ok;
        long value;
    } longs[] = {{"0", 1, 0},    {"42", 1, 42}, {"-3", 0, 0}, {"101", 0, 0},
                 {"", 0, 0},     {"7x", 0, 0},  {" 7", 1, 7}, {"99999999999999999999", 0, 0},
                 {"100", 1, 100}};
    for (size_t i = 0; i < sizeof(longs) / sizeof(longs[0]); i++) {
        long v = -1;
        int rc = strata_parse_long(longs[i].text, 0, 100, &v);
        CU_ASSERT_EQUAL(rc == STRATA_OK, longs[i].ok);
        CU_ASSERT_EQUAL(v, longs[i].ok ? longs[i].value : -1);
    }
    double d = -1;
    CU_ASSERT_EQUAL(strata_parse_double("0.25", 0, 1, &d), STRATA_OK);
    CU_ASSERT_EQUAL(d, 0.25);
    static const char *const bad[] = {"", "1.5", "-0.1", "nan", "inf", "0.5x", "1e999"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        CU_ASSERT_EQUAL(strata_parse_double(bad[i], 0, 1, &d), STRATA_EINVAL);
    CU_ASSERT_EQUAL(d, 0.25);
}

int main(void)
{
    CU_TestInfo tensor_tests[] = {
        {"list add/find/copy", test_list_add_find},
        {"shape overflow", test_shape_overflow},
        {"strict number parsing", test_parse_numbers},
        CU_TEST_INFO_NULL,
    };
    CU_TestInfo rng_tests[] = {
        {"reproducible, moments", test_rng_reproducible_and_moments},
        CU_TEST_INFO_NULL,
    };
    CU_SuiteInfo suites[] = {
        {"tensor", NULL, NULL, NULL, NULL, tensor_tests},
        {"rng", NULL, NULL, NULL, NULL, rng_tests},
        CU_SUITE_INFO_NULL,
    };
    return strata_test_run(suites);
}
