#include "strata/buf.h"
#include "test_util.h"

#include <stdlib.h>
#include <string.h>

static void test_append_and_cap(void)
{
    strata_buf b;
    strata_buf_init(&b, 10);
    CU_ASSERT_PTR_NULL(b.data);
    CU_ASSERT_EQUAL(strata_buf_append(&b, "hello", 5), STRATA_OK);
    CU_ASSERT_EQUAL(strata_buf_append(&b, "world", 5), STRATA_OK);
    CU_ASSERT_EQUAL(b.len, 10);
    CU_ASSERT_STRING_EQUAL((char *)b.data, "helloworld");
    /* One byte past the cap fails and changes nothing. */
    CU_ASSERT_EQUAL(strata_buf_append(&b, "!", 1), STRATA_ETOOBIG);
    CU_ASSERT_EQUAL(b.len, 10);
    CU_ASSERT_STRING_EQUAL((char *)b.data, "helloworld");
    CU_ASSERT_EQUAL(strata_buf_append(&b, NULL, 0), STRATA_OK);
    CU_ASSERT_EQUAL(strata_buf_reserve(&b, SIZE_MAX), STRATA_ETOOBIG);
    strata_buf_reset(&b);
    CU_ASSERT_EQUAL(b.len, 0);
    CU_ASSERT_STRING_EQUAL((char *)b.data, "");
    strata_buf_cleanup(&b);
    CU_ASSERT_PTR_NULL(b.data);
    CU_ASSERT_EQUAL(b.max, 10);
}

static void test_appendf_grows(void)
{
    strata_buf b;
    strata_buf_init(&b, 100000);
    for (int i = 0; i < 1000; i++)
        CU_ASSERT_EQUAL_FATAL(strata_buf_appendf(&b, "%04d,", i), STRATA_OK);
    CU_ASSERT_EQUAL(b.len, 5000);
    CU_ASSERT(memcmp(b.data, "0000,0001,", 10) == 0);
    CU_ASSERT(memcmp(b.data + 4995, "0999,", 5) == 0);
    CU_ASSERT_EQUAL(b.data[b.len], '\0');
    /* A formatted string longer than the internal scratch space. */
    char big[600];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    CU_ASSERT_EQUAL(strata_buf_appendf(&b, "[%s]", big), STRATA_OK);
    CU_ASSERT_EQUAL(b.len, 5000 + 601);
    CU_ASSERT_EQUAL(b.data[b.len - 1], ']');
    size_t n = 0;
    uint8_t *p = strata_buf_take(&b, &n);
    CU_ASSERT_EQUAL(n, 5601);
    CU_ASSERT_PTR_NULL(b.data);
    CU_ASSERT_EQUAL(b.len, 0);
    free(p);
}

static void test_appendf_cap(void)
{
    strata_buf b;
    strata_buf_init(&b, 8);
    CU_ASSERT_EQUAL(strata_buf_appendf(&b, "%s", "1234"), STRATA_OK);
    CU_ASSERT_EQUAL(strata_buf_appendf(&b, "%s", "56789"), STRATA_ETOOBIG);
    CU_ASSERT_EQUAL(b.len, 4);
    CU_ASSERT_STRING_EQUAL((char *)b.data, "1234");
    CU_ASSERT_EQUAL(strata_buf_appendf(&b, "%d", 5678), STRATA_OK);
    CU_ASSERT_STRING_EQUAL((char *)b.data, "12345678");
    strata_buf_cleanup(&b);
}

static void test_array_grow(void)
{
    size_t cap = 0;
    int *a = strata_array_grow(NULL, &cap, 1, sizeof(int));
    CU_ASSERT_PTR_NOT_NULL_FATAL(a);
    CU_ASSERT_EQUAL(cap, 16);
    for (int i = 0; i < 16; i++)
        a[i] = i;
    CU_ASSERT_PTR_EQUAL(strata_array_grow(a, &cap, 16, sizeof(int)), a); /* fits */
    a = strata_array_grow(a, &cap, 17, sizeof(int));
    CU_ASSERT_PTR_NOT_NULL_FATAL(a);
    CU_ASSERT_EQUAL(cap, 32);
    CU_ASSERT_EQUAL(a[15], 15);
    a = strata_array_grow(a, &cap, 100, sizeof(int));
    CU_ASSERT_PTR_NOT_NULL_FATAL(a);
    CU_ASSERT_EQUAL(cap, 128);
    /* Overflow: NULL, and the array and its capacity unchanged. */
    CU_ASSERT_PTR_NULL(strata_array_grow(a, &cap, SIZE_MAX / 2, sizeof(int)));
    CU_ASSERT_PTR_NULL(strata_array_grow(a, &cap, SIZE_MAX, 1));
    CU_ASSERT_EQUAL(cap, 128);
    CU_ASSERT_EQUAL(a[15], 15);
    free(a);
}

int main(void)
{
    CU_TestInfo tests[] = {
        {"append up to the cap", test_append_and_cap},
        {"formatted appends grow", test_appendf_grows},
        {"formatted appends respect the cap", test_appendf_cap},
        {"typed arrays grow", test_array_grow},
        CU_TEST_INFO_NULL,
    };
    CU_SuiteInfo suites[] = {
        {"buf", NULL, NULL, NULL, NULL, tests},
        CU_SUITE_INFO_NULL,
    };
    return strata_test_run(suites);
}
