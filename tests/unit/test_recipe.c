#include "strata/recipe.h"
#include "test_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The built-in mlp initialised from seed, normalised (mean, sd). */
static strata_model *seeded(uint64_t seed, float mean, float sd)
{
    strata_model *m = NULL;
    CU_ASSERT_EQUAL_FATAL(strata_model_new("mlp", &m, NULL), STRATA_OK);
    strata_model_init_params(m, seed);
    CU_ASSERT_EQUAL_FATAL(strata_model_set_normalization(m, mean, sd), STRATA_OK);
    return m;
}

static int same_params(strata_model *a, strata_model *b)
{
    const strata_tensor_list *x = strata_model_params(a), *y = strata_model_params(b);
    if (x->count != y->count)
        return 0;
    for (size_t i = 0; i < x->count; i++)
        if (x->items[i].numel != y->items[i].numel ||
            memcmp(x->items[i].data, y->items[i].data, x->items[i].numel * sizeof(float)) != 0)
            return 0;
    return 1;
}

static void test_roundtrip_build(void)
{
    strata_model *m = seeded(7, 0.2860406f, 0.3530242f);
    strata_recipe r, back;
    CU_ASSERT_EQUAL_FATAL(strata_recipe_of(m, 7, &r, NULL), STRATA_OK);
    char *json = NULL;
    size_t len = 0;
    CU_ASSERT_EQUAL_FATAL(strata_recipe_encode(&r, &json, &len, NULL), STRATA_OK);
    CU_ASSERT_EQUAL(strlen(json), len);
    CU_ASSERT_PTR_NOT_NULL(strstr(json, "\"init_seed\":7,"));
    CU_ASSERT_EQUAL_FATAL(strata_recipe_decode(json, len, &back, NULL), STRATA_OK);
    CU_ASSERT_STRING_EQUAL(back.arch, r.arch);
    CU_ASSERT_EQUAL(back.seed, 7);
    CU_ASSERT(back.mean == r.mean && back.std == r.std); /* bit for bit through the JSON */
    CU_ASSERT_STRING_EQUAL(back.digest, r.digest);
    strata_model *b = NULL;
    CU_ASSERT_EQUAL_FATAL(strata_recipe_build(&back, STRATA_MODEL_MAX_PARAMS, &b, NULL), STRATA_OK);
    CU_ASSERT(same_params(m, b));
    float mb, sb;
    strata_model_get_normalization(b, &mb, &sb);
    CU_ASSERT(mb == 0.2860406f && sb == 0.3530242f);
    CU_ASSERT_STRING_EQUAL(strata_model_arch(b), strata_model_arch(m));
    strata_model_free(b);
    free(json);
    strata_recipe_cleanup(&back);
    strata_recipe_cleanup(&r);
    strata_model_free(m);
}

/* A recipe whose seed, digest or size limit does not fit is refused by the
 * build, and nothing is returned. */
static void test_build_refuses(void)
{
    strata_model *m = seeded(7, 0.0f, 1.0f);
    strata_recipe r;
    CU_ASSERT_EQUAL_FATAL(strata_recipe_of(m, 7, &r, NULL), STRATA_OK);
    strata_model *b = (strata_model *)&r; /* must come back NULL */
    strata_diag d = {{0}};
    r.seed = 8;
    CU_ASSERT_EQUAL(strata_recipe_build(&r, STRATA_MODEL_MAX_PARAMS, &b, &d), STRATA_EPROTO);
    CU_ASSERT_PTR_NULL(b);
    CU_ASSERT_PTR_NOT_NULL(strstr(d.msg, "digest"));
    r.seed = 7;
    r.digest[0] = r.digest[0] == 'a' ? 'b' : 'a';
    CU_ASSERT_EQUAL(strata_recipe_build(&r, STRATA_MODEL_MAX_PARAMS, &b, &d), STRATA_EPROTO);
    CU_ASSERT_PTR_NULL(b);
    strata_recipe_cleanup(&r);
    CU_ASSERT_EQUAL_FATAL(strata_recipe_of(m, 7, &r, NULL), STRATA_OK);
    CU_ASSERT_EQUAL(strata_recipe_build(&r, 1000, &b, &d), STRATA_EPROTO);
    CU_ASSERT_PTR_NULL(b);
    CU_ASSERT_PTR_NOT_NULL(strstr(d.msg, "above the limit"));
    CU_ASSERT_EQUAL(strata_recipe_build(&r, STRATA_MODEL_MAX_PARAMS, &b, &d), STRATA_OK);
    strata_model_free(b);
    strata_recipe_cleanup(&r);
    strata_model_free(m);
}

/* Hostile documents: each is refused with the field named, and out left
 * zeroed. */
static void test_decode_hostile(void)
{
    const char *D = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
    const char *A = "{\"input\":[1,28,28],\"layers\":[{\"type\":\"flatten\"}]}";
    static const struct {
        const char *arch, *seed, *std, *digest, *extra, *want;
        int rc;
    } cases[] = {
        {NULL, "1", "0.5", NULL, "", NULL, STRATA_OK},
        {NULL, "-1", "0.5", NULL, "", "init_seed", STRATA_EPROTO},
        {NULL, "9007199254740992", "0.5", NULL, "", "init_seed", STRATA_EPROTO},
        {NULL, "1.0", "0.5", NULL, "", "init_seed", STRATA_EPROTO},
        {NULL, "\"1\"", "0.5", NULL, "", "init_seed", STRATA_EPROTO},
        {NULL, "1", "0", NULL, "", "std", STRATA_EPROTO},
        {NULL, "1", "-2", NULL, "", "std", STRATA_EPROTO},
        {NULL, "1", "1e-300", NULL, "", "std", STRATA_EPROTO},
        {NULL, "1", "1e300", NULL, "", "std", STRATA_EPROTO},
        {NULL, "1", "0.5", "ABCDEF", "", "digest", STRATA_EPROTO},
        {NULL, "1", "0.5", "0123456789ABCDEF0123456789abcdef0123456789abcdef0123456789abcdef", "",
         "digest", STRATA_EPROTO},
        {"\"mlp\"", "1", "0.5", NULL, "", "architecture", STRATA_EPROTO},
        {"[1]", "1", "0.5", NULL, "", "architecture", STRATA_EPROTO},
        {NULL, "1", "0.5", NULL, ",\"extra\":1", "extra", STRATA_EPROTO},
        {NULL, "1", "0.5", NULL, ",\"init_seed\":2", "duplicate", STRATA_EPROTO},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char buf[1024];
        snprintf(buf, sizeof(buf),
                 "{\"architecture\":%s,\"init_seed\":%s,\"mean\":0.25,\"std\":%s,"
                 "\"digest\":\"%s\"%s}",
                 cases[i].arch ? cases[i].arch : A, cases[i].seed, cases[i].std,
                 cases[i].digest ? cases[i].digest : D, cases[i].extra);
        strata_recipe r;
        strata_diag d = {{0}};
        int rc = strata_recipe_decode(buf, strlen(buf), &r, &d);
        CU_ASSERT_EQUAL(rc, cases[i].rc);
        if (rc != cases[i].rc)
            fprintf(stderr, "case %zu: %d %s\n", i, rc, d.msg);
        if (cases[i].want != NULL) {
            CU_ASSERT_PTR_NULL(r.arch);
            CU_ASSERT_PTR_NOT_NULL(strstr(d.msg, cases[i].want));
        }
        strata_recipe_cleanup(&r);
    }
    /* Truncated, empty, not an object, trailing bytes, missing key. */
    const char *bad[] = {"", "{", "[]", "{\"init_seed\":1}", "{} x", "null"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        strata_recipe r;
        CU_ASSERT_EQUAL(strata_recipe_decode(bad[i], strlen(bad[i]), &r, NULL), STRATA_EPROTO);
        CU_ASSERT_PTR_NULL(r.arch);
    }
    /* Above the size limit: refused before parsing. */
    size_t big = STRATA_RECIPE_MAX_BYTES + 1;
    char *huge = malloc(big);
    CU_ASSERT_PTR_NOT_NULL_FATAL(huge);
    memset(huge, ' ', big);
    strata_recipe r;
    CU_ASSERT_EQUAL(strata_recipe_decode(huge, big, &r, NULL), STRATA_ETOOBIG);
    free(huge);
}

/* An architecture that decodes but does not build is refused by the build. */
static void test_build_bad_arch(void)
{
    const char *json = "{\"architecture\":{\"layers\":\"none\"},\"init_seed\":1,\"mean\":0,"
                       "\"std\":1,\"digest\":"
                       "\"0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef\"}";
    strata_recipe r;
    CU_ASSERT_EQUAL_FATAL(strata_recipe_decode(json, strlen(json), &r, NULL), STRATA_OK);
    strata_model *m = NULL;
    strata_diag d = {{0}};
    CU_ASSERT_EQUAL(strata_recipe_build(&r, STRATA_MODEL_MAX_PARAMS, &m, &d), STRATA_EPROTO);
    CU_ASSERT_PTR_NULL(m);
    CU_ASSERT_PTR_NOT_NULL(strstr(d.msg, "architecture"));
    strata_recipe_cleanup(&r);
}

int main(void)
{
    CU_TestInfo tests[] = {
        {"encode, decode and build give version 0 back", test_roundtrip_build},
        {"wrong seed, digest or size refused by the build", test_build_refuses},
        {"hostile documents refused", test_decode_hostile},
        {"architecture that does not build refused", test_build_bad_arch},
        CU_TEST_INFO_NULL,
    };
    CU_SuiteInfo suites[] = {
        {"recipe", NULL, NULL, NULL, NULL, tests},
        CU_SUITE_INFO_NULL,
    };
    return strata_test_run(suites);
}
