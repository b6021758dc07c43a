#include "strata/policy.h"
#include "strata/rng.h"
#include "test_util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define N(a) (sizeof(a) / sizeof((a)[0]))

/* ---- layer lists ---- */

/* The FedAvg CNN (strata built-in "cnn"): conv1 5x5x1->32, conv2 5x5x32->64,
 * fc1 3136->512, fc2 512->10. */
static const struct {
    const char *name;
    size_t numel;
} cnn[] = {{"conv1.weight", 800},   {"conv1.bias", 32}, {"conv2.weight", 51200}, {"conv2.bias", 64},
           {"fc1.weight", 1605632}, {"fc1.bias", 512},  {"fc2.weight", 5120},    {"fc2.bias", 10}};
enum { CNN_C1W, CNN_C1B, CNN_C2W, CNN_C2B, CNN_F1W, CNN_F1B, CNN_F2W, CNN_F2B };

/* ResNet-18 for 32x32 inputs and 10 classes (3x3 stem, no max-pool; the
 * torchvision layout otherwise): conv weights, batch-norm weight and bias,
 * the fc layer; running statistics are buffers, not parameters. 62 tensors,
 * 11,173,962 parameters (torchvision's ImageNet resnet18, 7x7 stem and 1000
 * classes, has the same 62 tensors and 11,689,512). */
/* clang-format off */
static const struct {
    const char *name;
    size_t shape[4]; /* unused trailing dimensions are 0 */
} resnet18_shapes[] = {
    {"conv1.weight", {64, 3, 3, 3}},
    {"bn1.weight", {64}},
    {"bn1.bias", {64}},
    {"layer1.0.conv1.weight", {64, 64, 3, 3}},
    {"layer1.0.bn1.weight", {64}},
    {"layer1.0.bn1.bias", {64}},
    {"layer1.0.conv2.weight", {64, 64, 3, 3}},
    {"layer1.0.bn2.weight", {64}},
    {"layer1.0.bn2.bias", {64}},
    {"layer1.1.conv1.weight", {64, 64, 3, 3}},
    {"layer1.1.bn1.weight", {64}},
    {"layer1.1.bn1.bias", {64}},
    {"layer1.1.conv2.weight", {64, 64, 3, 3}},
    {"layer1.1.bn2.weight", {64}},
    {"layer1.1.bn2.bias", {64}},
    {"layer2.0.conv1.weight", {128, 64, 3, 3}},
    {"layer2.0.bn1.weight", {128}},
    {"layer2.0.bn1.bias", {128}},
    {"layer2.0.conv2.weight", {128, 128, 3, 3}},
    {"layer2.0.bn2.weight", {128}},
    {"layer2.0.bn2.bias", {128}},
    {"layer2.0.downsample.0.weight", {128, 64, 1, 1}},
    {"layer2.0.downsample.1.weight", {128}},
    {"layer2.0.downsample.1.bias", {128}},
    {"layer2.1.conv1.weight", {128, 128, 3, 3}},
    {"layer2.1.bn1.weight", {128}},
    {"layer2.1.bn1.bias", {128}},
    {"layer2.1.conv2.weight", {128, 128, 3, 3}},
    {"layer2.1.bn2.weight", {128}},
    {"layer2.1.bn2.bias", {128}},
    {"layer3.0.conv1.weight", {256, 128, 3, 3}},
    {"layer3.0.bn1.weight", {256}},
    {"layer3.0.bn1.bias", {256}},
    {"layer3.0.conv2.weight", {256, 256, 3, 3}},
    {"layer3.0.bn2.weight", {256}},
    {"layer3.0.bn2.bias", {256}},
    {"layer3.0.downsample.0.weight", {256, 128, 1, 1}},
    {"layer3.0.downsample.1.weight", {256}},
    {"layer3.0.downsample.1.bias", {256}},
    {"layer3.1.conv1.weight", {256, 256, 3, 3}},
    {"layer3.1.bn1.weight", {256}},
    {"layer3.1.bn1.bias", {256}},
    {"layer3.1.conv2.weight", {256, 256, 3, 3}},
    {"layer3.1.bn2.weight", {256}},
    {"layer3.1.bn2.bias", {256}},
    {"layer4.0.conv1.weight", {512, 256, 3, 3}},
    {"layer4.0.bn1.weight", {512}},
    {"layer4.0.bn1.bias", {512}},
    {"layer4.0.conv2.weight", {512, 512, 3, 3}},
    {"layer4.0.bn2.weight", {512}},
    {"layer4.0.bn2.bias", {512}},
    {"layer4.0.downsample.0.weight", {512, 256, 1, 1}},
    {"layer4.0.downsample.1.weight", {512}},
    {"layer4.0.downsample.1.bias", {512}},
    {"layer4.1.conv1.weight", {512, 512, 3, 3}},
    {"layer4.1.bn1.weight", {512}},
    {"layer4.1.bn1.bias", {512}},
    {"layer4.1.conv2.weight", {512, 512, 3, 3}},
    {"layer4.1.bn2.weight", {512}},
    {"layer4.1.bn2.bias", {512}},
    {"fc.weight", {10, 512}},
    {"fc.bias", {10}},
};
/* clang-format on */

static size_t resnet18[N(resnet18_shapes)];

static void fill_resnet18(void)
{
    for (size_t i = 0; i < N(resnet18_shapes); i++) {
        resnet18[i] = 1;
        for (int k = 0; k < 4 && resnet18_shapes[i].shape[k] != 0; k++)
            resnet18[i] *= resnet18_shapes[i].shape[k];
    }
}

static size_t cnn_numel[N(cnn)];

static int suite_init(void)
{
    for (size_t i = 0; i < N(cnn); i++)
        cnn_numel[i] = cnn[i].numel;
    fill_resnet18();
    return 0;
}

static strata_policy *parse_ok(const char *spec)
{
    strata_policy *p = NULL;
    strata_diag d = {{0}};
    int rc = strata_policy_parse(spec, &p, &d);
    if (rc != STRATA_OK)
        fprintf(stderr, "parse '%s' failed: %s\n", spec, d.msg);
    CU_ASSERT_EQUAL(rc, STRATA_OK);
    return p;
}

static size_t sum(const size_t *x, size_t n)
{
    size_t s = 0;
    for (size_t i = 0; i < n; i++)
        s += x[i];
    return s;
}

/* Elements the uniform policy keeps per round (dense_below = 1000). */
static size_t uniform_kept(const size_t *numel, size_t n, double d0)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        k += numel[i] < 1000 ? numel[i] : (size_t)strata_comp_kept(d0, numel[i]);
    return k;
}

/* ---- parsing, defaults, JSON round trip ---- */

static void test_names_and_roundtrip(void)
{
    static const struct {
        const char *spec;
        const char *name;
        uint32_t phases;
        const char *json;
    } cases[] = {
        {"uniform", "uniform", 1,
         "{\"type\":\"uniform\",\"dense_below\":1000,\"compressor\":\"topk\"}"},
        {"legacy-layer", "legacy-layer", 1,
         "{\"type\":\"legacy-layer\",\"dense_below\":1000,\"compressor\":\"topk\",\"splits\":"
         "[10000,100000,1000000],\"layer_weights\":[4.0,2.0,1.0,0.5],\"calibration\":\"round\","
         "\"calibration_unit\":\"elements\"}"},
        {"legacy-phase", "legacy-phase", 3,
         "{\"type\":\"legacy-phase\",\"dense_below\":1000,\"compressor\":\"topk\",\"phases\":3,"
         "\"phase_weights\":[2.0,1.0,0.5],\"calibration\":\"run\",\"calibration_unit\":"
         "\"elements\"}"},
        {"legacy", "legacy", 3,
         "{\"type\":\"legacy\",\"dense_below\":1000,\"compressor\":\"topk\",\"splits\":[10000,"
         "100000,1000000],\"phases\":3,\"weights\":[[8.0,4.0,2.0,1.0],[4.0,2.0,1.0,0.5],[2.0,1.0,"
         "0.5,0.25]],\"calibration\":\"run\",\"calibration_unit\":\"elements\"}"},
        {"lgreco", "lgreco", 1,
         "{\"type\":\"lgreco\",\"dense_below\":1000,\"compressor\":\"topk\",\"candidates\":[0.001,"
         "0.002,0.005,0.01,0.02,0.05,0.1,0.2,0.5,1.0],\"candidate_values\":[\"fp32\",\"fp16\","
         "\"int8\",\"ternary\"],\"candidate_compressors\":[\"fp16\"],\"lgreco_every\":10}"},
        {"legacy-ref", "legacy-ref", 2,
         "{\"type\":\"legacy-ref\",\"dense_below\":0,\"compressor\":\"topk\"}"},
        {"qsgd:4", "uniform", 1,
         "{\"type\":\"uniform\",\"dense_below\":1000,\"compressor\":\"qsgd:4\"}"},
        {"  {\"type\": \"legacy-layer\", \"splits\": [500], \"compressor\": \"randk\"}",
         "legacy-layer", 1,
         "{\"type\":\"legacy-layer\",\"dense_below\":1000,\"compressor\":\"randk\",\"splits\":[500]"
         ","
         "\"layer_weights\":[1.0,0.5],\"calibration\":\"round\",\"calibration_unit\":"
         "\"elements\"}"},
        {"{\"type\":\"legacy\",\"phases\":2,\"layer_weights\":[1,1,1,3]}", "legacy", 2,
         "{\"type\":\"legacy\",\"dense_below\":1000,\"compressor\":\"topk\",\"splits\":[10000,"
         "100000,1000000],\"phases\":2,\"weights\":[[1.0,1.0,1.0,3.0],[0.5,0.5,0.5,1.5]],"
         "\"calibration\":\"run\",\"calibration_unit\":\"elements\"}"},
        {"{\"type\":\"legacy-phase\",\"phase_weights\":[3,2,1,1],\"dense_below\":0}",
         "legacy-phase", 4,
         "{\"type\":\"legacy-phase\",\"dense_below\":0,\"compressor\":\"topk\",\"phases\":4,"
         "\"phase_weights\":[3.0,2.0,1.0,1.0],\"calibration\":\"run\",\"calibration_unit\":"
         "\"elements\"}"},
    };
    for (size_t i = 0; i < N(cases); i++) {
        strata_policy *p = parse_ok(cases[i].spec);
        CU_ASSERT_PTR_NOT_NULL_FATAL(p);
        CU_ASSERT_STRING_EQUAL(strata_policy_name(p), cases[i].name);
        CU_ASSERT_EQUAL(strata_policy_phases(p), cases[i].phases);
        char *j = strata_policy_json(p);
        CU_ASSERT_PTR_NOT_NULL_FATAL(j);
        if (strcmp(j, cases[i].json) != 0)
            fprintf(stderr, "case %zu: got %s\n", i, j);
        CU_ASSERT_STRING_EQUAL(j, cases[i].json);
        strata_policy *q = parse_ok(j); /* the effective config parses back */
        char *j2 = q ? strata_policy_json(q) : NULL;
        CU_ASSERT(j2 != NULL && strcmp(j, j2) == 0);
        free(j2);
        free(j);
        strata_policy_free(q);
        strata_policy_free(p);
    }

    /* @file */
    char *dir = strata_test_tmpdir();
    CU_ASSERT_PTR_NOT_NULL_FATAL(dir);
    char path[600], spec[610];
    snprintf(path, sizeof(path), "%s/pol.json", dir);
    snprintf(spec, sizeof(spec), "@%s", path);
    FILE *f = fopen(path, "w");
    CU_ASSERT_PTR_NOT_NULL_FATAL(f);
    fputs("{\"type\": \"legacy-layer\", \"layer_weights\": [4, 2, 1, 0.1]}\n", f);
    fclose(f);
    strata_policy *p = parse_ok(spec);
    CU_ASSERT_PTR_NOT_NULL(p);
    strata_policy_free(p);
    f = fopen(path, "w");
    fputs("{\"type\": \"legacy-layer\", \"layer_weights\": [4, 2, 1]}\n", f);
    fclose(f);
    strata_diag d = {{0}};
    CU_ASSERT_EQUAL(strata_policy_parse(spec, &p, &d), STRATA_EINVAL);
    CU_ASSERT_PTR_NOT_NULL(strstr(d.msg, path)); /* names the file and the key */
    CU_ASSERT_PTR_NOT_NULL(strstr(d.msg, "layer_weights: expected 4 numbers"));
    strata_test_rmtree(dir);
    free(dir);
    p = (strata_policy *)0x1;
    CU_ASSERT_EQUAL(strata_policy_parse("@/nonexistent/pol.json", &p, &d), STRATA_EIO);
    CU_ASSERT_PTR_NULL(p);
    CU_ASSERT_PTR_NOT_NULL(strstr(d.msg, "/nonexistent/pol.json"));
}

/* ---- configuration errors name the key ---- */

static void test_config_errors(void)
{
    static const struct {
        const char *spec;
        const char *expect;
    } cases[] = {
        {"{\"type\":\"legacy-layer\",\"layer_weights\":[1,2,3]}",
         "layer_weights: expected 4 numbers (one per group of splits), got 3"},
        {"{\"type\":\"legacy-layer\",\"splits\":[10],\"layer_weights\":[1,2,3]}",
         "layer_weights: expected 2 numbers"},
        {"{\"type\":\"legacy-layer\",\"layer_weights\":[1,0,1,1]}", "layer_weights[1]"},
        {"{\"type\":\"legacy-layer\",\"layer_weights\":[-1,1,1,1]}", "layer_weights[0]"},
        {"{\"type\":\"legacy-layer\",\"layer_weights\":[1,\"2\",1,1]}", "layer_weights[1]"},
        {"{\"type\":\"legacy-layer\",\"layer_weights\":4}", "layer_weights: expected an array"},
        {"{\"type\":\"legacy-layer\",\"splits\":[100,10]}", "splits[1]"},
        {"{\"type\":\"legacy-layer\",\"splits\":[100,100]}", "splits[1]"},
        {"{\"type\":\"legacy-layer\",\"splits\":[1.5]}", "splits[0]"},
        {"{\"type\":\"legacy-layer\",\"splits\":[0]}", "splits[0]"},
        {"{\"type\":\"legacy-layer\",\"splits\":[]}", "splits"},
        {"{\"type\":\"legacy-layer\",\"splits\":\"10,100\"}", "splits"},
        {"{\"type\":\"legacy-layer\",\"phases\":3}", "phases: does not apply"},
        {"{\"type\":\"uniform\",\"splits\":[10]}", "splits: does not apply"},
        {"{\"type\":\"uniform\",\"calibration\":\"run\"}", "calibration: does not apply"},
        {"{\"type\":\"legacy-phase\",\"weights\":[[1]]}", "weights: does not apply"},
        {"{\"type\":\"lgreco\",\"layer_weights\":[1]}", "layer_weights: does not apply"},
        {"{\"type\":\"uniform\",\"bogus\":1}", "bogus: unknown key"},
        {"{\"type\":\"legacy-phase\",\"phases\":0}", "phases"},
        {"{\"type\":\"legacy-phase\",\"phases\":\"3\"}", "phases"},
        {"{\"type\":\"legacy-phase\",\"phases\":1000}", "phases"},
        {"{\"type\":\"legacy-phase\",\"phases\":3,\"phase_weights\":[2,1]}",
         "phase_weights: expected 3 numbers (one per phase), got 2"},
        {"{\"type\":\"legacy-phase\",\"phase_weights\":[]}", "phase_weights"},
        {"{\"type\":\"legacy-phase\",\"calibration\":\"round\"}", "calibration"},
        {"{\"type\":\"legacy-layer\",\"calibration\":\"daily\"}", "calibration"},
        {"{\"type\":\"legacy-layer\",\"calibration\":1}", "calibration"},
        {"{\"type\":\"legacy\",\"phases\":3,\"weights\":[[1,1,1,1],[1,1,1,1]]}",
         "weights: expected 3 rows (one per phase), got 2"},
        {"{\"type\":\"legacy\",\"weights\":[[1,1,1,1],[1,1,1],[1,1,1,1]]}",
         "weights[1]: expected 4 numbers (one per group of splits), got 3"},
        {"{\"type\":\"legacy\",\"weights\":[[1,1,0,1]]}", "weights[0][2]"},
        {"{\"type\":\"legacy\",\"weights\":[[1,1,1,1]],\"layer_weights\":[1,1,1,1]}",
         "weights: give either"},
        {"{\"type\":\"legacy\",\"weights\":7}", "weights"},
        {"{\"type\":\"uniform\",\"compressor\":\"qsgd\"}", "compressor"},
        {"{\"type\":\"lgreco\",\"compressor\":\"randk\"}", "compressor"},
        {"{\"type\":\"lgreco\",\"candidates\":[0.1,0.01]}", "candidates[1]"},
        {"{\"type\":\"lgreco\",\"candidates\":[0.1,1.5]}", "candidates[1]"},
        {"{\"type\":\"lgreco\",\"candidates\":[0]}", "candidates[0]"},
        {"{\"type\":\"lgreco\",\"candidates\":[]}", "candidates"},
        {"{\"type\":\"lgreco\",\"lgreco_every\":0}", "lgreco_every"},
        {"{\"type\":\"lgreco\",\"lgreco_every\":2.5}", "lgreco_every"},
        {"{\"type\":\"uniform\",\"dense_below\":-1}", "dense_below"},
        {"{\"type\":\"uniform\",\"dense_below\":1.5}", "dense_below"},
        {"{\"dense_below\":10}", "type"},
        {"{\"type\":\"lgrekko\"}", "type"},
        {"{\"type\":7}", "type"},
        {"{\"type\":\"uniform\",\"type\":\"uniform\"}", "line 1"},
        {"{\"type\":\"uniform\"", "line 1"},
        {"[1,2]", "policy"},
        {"bogus", "policy 'bogus'"},
        {"", "policy ''"},
    };
    for (size_t i = 0; i < N(cases); i++) {
        strata_policy *p = (strata_policy *)0x1;
        strata_diag d = {{0}};
        int rc = strata_policy_parse(cases[i].spec, &p, &d);
        CU_ASSERT_EQUAL(rc, STRATA_EINVAL);
        CU_ASSERT_PTR_NULL(p);
        if (strstr(d.msg, cases[i].expect) == NULL) {
            fprintf(stderr, "case %zu: message '%s' lacks '%s'\n", i, d.msg, cases[i].expect);
            CU_FAIL("error message does not name the key");
        }
        strata_policy_free(p);
    }
}

static void test_call_errors(void)
{
    strata_policy *p = parse_ok("legacy");
    CU_ASSERT_PTR_NOT_NULL_FATAL(p);
    static const struct {
        double d0;
        uint32_t round, total;
        const char *expect;
    } cases[] = {{0.0, 0, 10, "density"}, {-0.1, 0, 10, "density"}, {1.5, 0, 10, "density"},
                 {NAN, 0, 10, "density"}, {0.1, 10, 10, "round"},   {0.1, 0, 0, "round"}};
    double dens[N(cnn)];
    strata_budget b[N(cnn)];
    for (size_t i = 0; i < N(cases); i++) {
        strata_diag d = {{0}};
        CU_ASSERT_EQUAL(strata_policy_densities(p, cnn_numel, N(cnn), cases[i].d0, cases[i].round,
                                                cases[i].total, dens, &d),
                        STRATA_EINVAL);
        CU_ASSERT_PTR_NOT_NULL(strstr(d.msg, cases[i].expect));
        CU_ASSERT_EQUAL(strata_policy_budgets(p, cnn_numel, N(cnn), cases[i].d0, cases[i].round,
                                              cases[i].total, b, NULL),
                        STRATA_EINVAL);
    }
    strata_diag d = {{0}};
    double err[8] = {0};
    CU_ASSERT_EQUAL(strata_policy_set_lgreco_table(p, err, cnn_numel, 1, 0.01, &d), STRATA_EINVAL);
    CU_ASSERT_PTR_NOT_NULL(strstr(d.msg, "legacy"));
    CU_ASSERT_EQUAL(strata_policy_lgreco_every(p), 0);
    strata_budget cb[STRATA_LGRECO_MAX_TABLE];
    CU_ASSERT_EQUAL(strata_policy_lgreco_candidates(p, 0.01, cb), 0);
    CU_ASSERT_EQUAL(strata_policy_densities(p, NULL, 0, 0.01, 0, 1, NULL, NULL), STRATA_OK);
    strata_policy_free(p);
    strata_policy_free(NULL);
}

/* ---- kept-element rule and budgets ---- */

static void test_kept_and_budgets(void)
{
    /* the kept rule the policies count with (shared with the compressors) */
    static const struct {
        size_t n;
        double d;
        size_t k;
    } cases[] = {{10, 0.05, 1},    {10, 0.99, 9},          {10, 1.0, 10},
                 {1000, 0.001, 1}, {1000, 0.0019, 1},      {1000, 0.002, 2},
                 {1, 1e-9, 1},     {1605632, 0.01, 16056}, {51200, 0.1, 5120}};
    for (size_t i = 0; i < N(cases); i++) {
        CU_ASSERT_EQUAL(strata_comp_kept(cases[i].d, cases[i].n), cases[i].k);
        CU_ASSERT_EQUAL(strata_policy_kept(&cases[i].n, &cases[i].d, 1), cases[i].k);
    }
    const size_t two[] = {0, 50};
    const double half[] = {0.5, 0.5};
    CU_ASSERT_EQUAL(strata_policy_kept(two, half, 2), 25);

    strata_policy *p = parse_ok("{\"type\":\"legacy-layer\",\"compressor\":\"randk\"}");
    CU_ASSERT_PTR_NOT_NULL_FATAL(p);
    strata_budget b[N(cnn)];
    double dens[N(cnn)];
    CU_ASSERT_EQUAL_FATAL(strata_policy_budgets(p, cnn_numel, N(cnn), 0.01, 3, 10, b, NULL),
                          STRATA_OK);
    CU_ASSERT_EQUAL_FATAL(strata_policy_densities(p, cnn_numel, N(cnn), 0.01, 3, 10, dens, NULL),
                          STRATA_OK);
    for (size_t i = 0; i < N(cnn); i++) {
        CU_ASSERT_EQUAL(b[i].density, dens[i]);
        CU_ASSERT_EQUAL(b[i].comp, cnn[i].numel < 1000 ? STRATA_COMP_NONE : STRATA_COMP_RANDK);
        CU_ASSERT_EQUAL(b[i].density == 1.0, cnn[i].numel < 1000);
    }
    strata_policy_free(p);

    /* dense_below = 0 compresses everything; d0 = 1 sends everything */
    p = parse_ok("{\"type\":\"uniform\",\"dense_below\":0}");
    CU_ASSERT_EQUAL_FATAL(strata_policy_budgets(p, cnn_numel, N(cnn), 0.5, 0, 1, b, NULL),
                          STRATA_OK);
    for (size_t i = 0; i < N(cnn); i++)
        CU_ASSERT(b[i].comp == STRATA_COMP_TOPK && b[i].density == 0.5);
    CU_ASSERT_EQUAL_FATAL(strata_policy_budgets(p, cnn_numel, N(cnn), 1.0, 0, 1, b, NULL),
                          STRATA_OK);
    for (size_t i = 0; i < N(cnn); i++)
        CU_ASSERT(b[i].comp == STRATA_COMP_NONE && b[i].density == 1.0);
    strata_policy_free(p);
}

/* ---- 1. legacy-layer: small groups get higher densities ---- */

static void test_legacy_layer(void)
{
    static const double d0s[] = {0.001, 0.01, 0.1};
    strata_policy *p = parse_ok("legacy-layer");
    strata_policy *none = parse_ok("{\"type\":\"legacy-layer\",\"calibration\":\"none\"}");
    CU_ASSERT_PTR_NOT_NULL_FATAL(p);
    CU_ASSERT_PTR_NOT_NULL_FATAL(none);
    for (size_t i = 0; i < N(d0s); i++) {
        double d[N(cnn)];
        CU_ASSERT_EQUAL_FATAL(strata_policy_densities(p, cnn_numel, N(cnn), d0s[i], 0, 1, d, NULL),
                              STRATA_OK);
        /* below dense_below: sent whole */
        static const int dense[] = {CNN_C1W, CNN_C1B, CNN_C2B, CNN_F1B, CNN_F2B};
        for (size_t j = 0; j < N(dense); j++)
            CU_ASSERT_EQUAL(d[dense[j]], 1.0);
        /* groups: fc2.weight (5120) 0, conv2.weight (51200) 1, fc1.weight (1.6M) 3 */
        CU_ASSERT(d[CNN_F2W] > d[CNN_C2W]);
        CU_ASSERT(d[CNN_C2W] > d[CNN_F1W]);
        CU_ASSERT(d[CNN_F1W] < d0s[i]); /* the big layer pays for the small ones */
        CU_ASSERT_DOUBLE_EQUAL(d[CNN_F2W] / d[CNN_C2W], 2.0, 1e-12); /* weights 4 : 2 : 0.5 */
        CU_ASSERT_DOUBLE_EQUAL(d[CNN_C2W] / d[CNN_F1W], 4.0, 1e-12);
        size_t k = strata_policy_kept(cnn_numel, d, N(cnn)),
               u = uniform_kept(cnn_numel, N(cnn), d0s[i]);
        CU_ASSERT(fabs((double)k / (double)u - 1.0) <= 0.005);

        /* without calibration: min(1, d0 * W) */
        CU_ASSERT_EQUAL_FATAL(
            strata_policy_densities(none, cnn_numel, N(cnn), d0s[i], 0, 1, d, NULL), STRATA_OK);
        CU_ASSERT_EQUAL(d[CNN_F2W], fmin(1.0, 4.0 * d0s[i]));
        CU_ASSERT_EQUAL(d[CNN_C2W], 2.0 * d0s[i]);
        CU_ASSERT_EQUAL(d[CNN_F1W], 0.5 * d0s[i]);
    }
    /* group boundaries: a layer of exactly a threshold belongs to the group above */
    static const size_t sizes[] = {9999, 10000, 99999, 100000, 999999, 1000000, 999, 1000};
    static const double expect[] = {4, 2, 2, 1, 1, 0.5, -1, 4};
    double d[N(sizes)];
    CU_ASSERT_EQUAL_FATAL(strata_policy_densities(none, sizes, N(sizes), 0.01, 0, 1, d, NULL),
                          STRATA_OK);
    for (size_t i = 0; i < N(sizes); i++)
        CU_ASSERT_EQUAL(d[i], expect[i] < 0 ? 1.0 : expect[i] * 0.01);
    strata_policy_free(p);
    strata_policy_free(none);
}

/* ---- 2. legacy-phase: equal phases with the given weights ---- */

static void test_legacy_phase(void)
{
    static const struct {
        const char *spec;
        uint32_t total;
        uint32_t starts[4]; /* first round of each phase; UINT32_MAX: phase has no round */
        double w[4];
    } cases[] = {
        {"{\"type\":\"legacy-phase\",\"calibration\":\"none\"}", 30, {0, 10, 20}, {2, 1, 0.5}},
        {"legacy-phase", 30, {0, 10, 20}, {2, 1, 0.5}},
        {"legacy-phase", 10, {0, 4, 7}, {2, 1, 0.5}},
        {"{\"type\":\"legacy-phase\",\"phase_weights\":[3,1]}", 7, {0, 4}, {3, 1}},
        {"{\"type\":\"legacy-phase\",\"phase_weights\":[4,3,2,1]}",
         100,
         {0, 25, 50, 75},
         {4, 3, 2, 1}},
        {"{\"type\":\"legacy-phase\",\"phases\":3}", 2, {0, 1, UINT32_MAX}, {2, 1, 0.5}},
    };
    for (size_t i = 0; i < N(cases); i++) {
        strata_policy *p = parse_ok(cases[i].spec);
        CU_ASSERT_PTR_NOT_NULL_FATAL(p);
        uint32_t P = strata_policy_phases(p), T = cases[i].total;
        double *d = malloc((size_t)T * N(cnn) * sizeof(double));
        double phase_d[4] = {0};
        for (uint32_t r = 0; r < T; r++) {
            uint32_t ph = strata_policy_phase(p, r, T), expect = 0;
            for (uint32_t q = 0; q < P; q++)
                if (cases[i].starts[q] != UINT32_MAX && r >= cases[i].starts[q])
                    expect = q;
            CU_ASSERT_EQUAL(ph, expect);
            double *dr = d + (size_t)r * N(cnn);
            CU_ASSERT_EQUAL_FATAL(
                strata_policy_densities(p, cnn_numel, N(cnn), 0.01, r, T, dr, NULL), STRATA_OK);
            /* a pure phase policy gives every compressible layer one density */
            CU_ASSERT_EQUAL(dr[CNN_C2W], dr[CNN_F1W]);
            CU_ASSERT_EQUAL(dr[CNN_F2W], dr[CNN_F1W]);
            CU_ASSERT_EQUAL(dr[CNN_F2B], 1.0);
            if (r == cases[i].starts[ph])
                phase_d[ph] = dr[CNN_F1W];
            CU_ASSERT_EQUAL(dr[CNN_F1W], phase_d[ph]); /* constant within a phase */
        }
        for (uint32_t q = 0; q + 1 < P; q++) {
            if (cases[i].starts[q + 1] == UINT32_MAX || phase_d[q] >= 1.0)
                continue;
            CU_ASSERT_DOUBLE_EQUAL(phase_d[q] / phase_d[q + 1], cases[i].w[q] / cases[i].w[q + 1],
                                   1e-12);
        }
        CU_ASSERT(phase_d[0] > phase_d[1]); /* less compression early */
        free(d);
        strata_policy_free(p);
    }
}

/* ---- 3. equal-volume calibration ---- */

static void check_volume(const char *model, const size_t *numel, size_t n, const char *spec,
                         double *worst)
{
    static const double d0s[] = {0.001, 0.01, 0.1};
    const uint32_t T = 30;
    strata_policy *p = parse_ok(spec);
    CU_ASSERT_PTR_NOT_NULL_FATAL(p);
    int per_round = strstr(spec, "\"round\"") != NULL || strcmp(spec, "legacy-layer") == 0;
    double *d = malloc(n * sizeof(double));
    for (size_t i = 0; i < N(d0s); i++) {
        size_t u = uniform_kept(numel, n, d0s[i]);
        double run_total = 0.0, round_worst = 0.0;
        for (uint32_t r = 0; r < T; r++) {
            CU_ASSERT_EQUAL_FATAL(strata_policy_densities(p, numel, n, d0s[i], r, T, d, NULL),
                                  STRATA_OK);
            size_t k = strata_policy_kept(numel, d, n);
            run_total += (double)k;
            double dev = (double)k / (double)u - 1.0; /* signed, the largest in size */
            if (fabs(dev) > fabs(round_worst))
                round_worst = dev;
        }
        double ratio = per_round ? 1.0 + round_worst : run_total / ((double)T * (double)u);
        double dev = fabs(ratio - 1.0);
        printf("  %-8s d0=%-5g uniform %8zu, kept/uniform %s %.6f: %s\n", model, d0s[i], u,
               per_round ? "worst round" : "over the run", ratio, spec);
        CU_ASSERT(dev <= 0.005);
        *worst = fmax(*worst, dev);
    }
    free(d);
    strata_policy_free(p);
}

static void test_calibration(void)
{
    size_t total = sum(resnet18, N(resnet18));
    CU_ASSERT_EQUAL(N(resnet18), 62);
    CU_ASSERT_EQUAL(total, 11173962);
    CU_ASSERT_EQUAL(sum(cnn_numel, N(cnn)), 1663370);
    static const char *const specs[] = {
        "legacy",
        "{\"type\":\"legacy\",\"calibration\":\"round\"}",
        "{\"type\":\"legacy\",\"weights\":[[1,3,2,0.1],[5,1,1,1],[0.2,0.4,8,1]]}",
        ("{\"type\":\"legacy\",\"weights\":[[1,3,2,0.1],[5,1,1,1],[0.2,0.4,8,1]],"
         "\"calibration\":\"round\"}"),
        "legacy-layer",
        "legacy-phase",
        "{\"type\":\"legacy-phase\",\"phase_weights\":[8,1]}",
    };
    double worst = 0.0;
    printf("\n");
    for (size_t i = 0; i < N(specs); i++) {
        check_volume("cnn", cnn_numel, N(cnn), specs[i], &worst);
        check_volume("resnet18", resnet18, N(resnet18), specs[i], &worst);
    }
    printf("  worst relative deviation from uniform's volume: %.3g\n", worst);

    /* extremes: d0 = 1 sends everything; a tiny d0 keeps one element per
     * compressible layer, like uniform, with valid (positive) densities */
    static const char *const extremes[] = {"legacy", "legacy-layer", "legacy-phase"};
    for (size_t i = 0; i < N(extremes); i++) {
        strata_policy *p = parse_ok(extremes[i]);
        CU_ASSERT_PTR_NOT_NULL_FATAL(p);
        double d[N(resnet18)];
        CU_ASSERT_EQUAL(strata_policy_densities(p, resnet18, N(resnet18), 1.0, 3, 30, d, NULL),
                        STRATA_OK);
        for (size_t l = 0; l < N(resnet18); l++)
            CU_ASSERT_EQUAL(d[l], 1.0);
        CU_ASSERT_EQUAL(strata_policy_densities(p, resnet18, N(resnet18), 1e-7, 3, 30, d, NULL),
                        STRATA_OK);
        for (size_t l = 0; l < N(resnet18); l++)
            CU_ASSERT(d[l] > 0.0 && d[l] <= 1.0);
        CU_ASSERT_EQUAL(strata_policy_kept(resnet18, d, N(resnet18)),
                        uniform_kept(resnet18, N(resnet18), 1e-7));
        strata_policy_free(p);
    }

    /* "run" spends differently per phase: more early, less late */
    strata_policy *p = parse_ok("legacy");
    double a[N(cnn)], b[N(cnn)];
    CU_ASSERT_EQUAL(strata_policy_densities(p, cnn_numel, N(cnn), 0.01, 0, 30, a, NULL), STRATA_OK);
    CU_ASSERT_EQUAL(strata_policy_densities(p, cnn_numel, N(cnn), 0.01, 29, 30, b, NULL),
                    STRATA_OK);
    CU_ASSERT(strata_policy_kept(cnn_numel, a, N(cnn)) > strata_policy_kept(cnn_numel, b, N(cnn)));
    strata_policy_free(p);
}

/* legacy-ref, compressor policies, values formats, byte calibration and
 * the compressor specifications. */
static void test_presets_and_compressors(void)
{
    /* legacy-ref: 1% everywhere in the first half, then 1% / 0.1% split at
     * 10,000 elements; d0 is ignored, every layer is compressed */
    strata_policy *p = parse_ok("legacy-ref");
    CU_ASSERT_PTR_NOT_NULL_FATAL(p);
    double d[N(cnn)];
    for (uint32_t r = 0; r < 10; r++) {
        CU_ASSERT_EQUAL_FATAL(strata_policy_densities(p, cnn_numel, N(cnn), 0.3, r, 10, d, NULL),
                              STRATA_OK);
        for (size_t l = 0; l < N(cnn); l++)
            CU_ASSERT_EQUAL(d[l], r < 5 || cnn_numel[l] < 10000 ? 0.01 : 0.001);
    }
    strata_policy_free(p);

    /* a compressor as the policy: uniform with it; small layers dense */
    p = parse_ok("qsgd:4");
    CU_ASSERT_PTR_NOT_NULL_FATAL(p);
    strata_budget b[N(cnn)];
    CU_ASSERT_EQUAL_FATAL(strata_policy_budgets(p, cnn_numel, N(cnn), 0.01, 0, 5, b, NULL),
                          STRATA_OK);
    for (size_t l = 0; l < N(cnn); l++) {
        CU_ASSERT_EQUAL(b[l].comp, cnn_numel[l] < 1000 ? STRATA_COMP_NONE : STRATA_COMP_QSGD);
        CU_ASSERT_EQUAL(b[l].levels, cnn_numel[l] < 1000 ? 0u : 4u);
    }
    strata_diag dg = {{0}};
    CU_ASSERT_EQUAL(strata_policy_set_values(p, STRATA_VALUES_FP16, &dg), STRATA_EINVAL);
    CU_ASSERT_PTR_NOT_NULL(strstr(dg.msg, "qsgd"));
    strata_policy_free(p);
    p = parse_ok("powersgd:2");
    CU_ASSERT_PTR_NOT_NULL_FATAL(p);
    CU_ASSERT_EQUAL(strata_policy_set_values(p, STRATA_VALUES_BF16, NULL), STRATA_OK);
    CU_ASSERT_EQUAL_FATAL(strata_policy_budgets(p, cnn_numel, N(cnn), 0.01, 0, 5, b, NULL),
                          STRATA_OK);
    CU_ASSERT(b[CNN_F1W].comp == STRATA_COMP_POWERSGD && b[CNN_F1W].rank == 2 &&
              b[CNN_F1W].values == STRATA_VALUES_BF16);
    strata_policy_free(p);
    /* values reach every budget; dense layers keep a dense format */
    p = parse_ok("uniform");
    CU_ASSERT_EQUAL(strata_policy_set_values(p, STRATA_VALUES_FP16, NULL), STRATA_OK);
    CU_ASSERT_EQUAL_FATAL(strata_policy_budgets(p, cnn_numel, N(cnn), 0.01, 0, 5, b, NULL),
                          STRATA_OK);
    for (size_t l = 0; l < N(cnn); l++)
        CU_ASSERT_EQUAL(b[l].values, STRATA_VALUES_FP16);
    strata_policy_free(p);
    /* policies that set densities need a sparsifier */
    strata_policy *bad = NULL;
    CU_ASSERT_EQUAL(strata_policy_parse("{\"type\":\"legacy\",\"compressor\":\"sign\"}", &bad, &dg),
                    STRATA_EINVAL);
    CU_ASSERT_PTR_NOT_NULL(strstr(dg.msg, "compressor"));
    CU_ASSERT_EQUAL(strata_policy_parse(
                        "{\"type\":\"lgreco\",\"candidate_compressors\":[\"qsgd\"]}", &bad, &dg),
                    STRATA_EINVAL);
    CU_ASSERT_PTR_NOT_NULL(strstr(dg.msg, "candidate_compressors[0]"));
    CU_ASSERT_EQUAL(
        strata_policy_parse("{\"type\":\"legacy\",\"calibration_unit\":\"kb\"}", &bad, &dg),
        STRATA_EINVAL);
    CU_ASSERT_PTR_NOT_NULL(strstr(dg.msg, "calibration_unit"));
    CU_ASSERT_PTR_NULL(bad);

    /* byte calibration: a round of legacy-layer spends uniform's estimated
     * bytes (within one step), not uniform's elements */
    p = parse_ok("{\"type\":\"legacy-layer\",\"calibration_unit\":\"bytes\"}");
    CU_ASSERT_PTR_NOT_NULL_FATAL(p);
    strata_budget ub[N(resnet18)], lb[N(resnet18)];
    strata_policy *u = parse_ok("uniform");
    CU_ASSERT_EQUAL_FATAL(strata_policy_budgets(p, resnet18, N(resnet18), 0.01, 0, 5, lb, NULL),
                          STRATA_OK);
    CU_ASSERT_EQUAL_FATAL(strata_policy_budgets(u, resnet18, N(resnet18), 0.01, 0, 5, ub, NULL),
                          STRATA_OK);
    double bl = 0.0, bu = 0.0, step = 0.0;
    for (size_t l = 0; l < N(resnet18); l++) {
        bl += strata_budget_bytes(&lb[l], resnet18[l]);
        bu += strata_budget_bytes(&ub[l], resnet18[l]);
        step = fmax(step, 8.0); /* one kept element: value and position */
    }
    printf("\n  legacy-layer, byte calibration: %.0f bytes vs uniform %.0f", bl, bu);
    CU_ASSERT(fabs(bl - bu) <= 0.001 * bu + step);
    strata_policy_free(p);
    strata_policy_free(u);

    /* compressor specifications round-trip */
    static const char *const specs[] = {"topk:0.01",    "topk:0.0123456789:int8",
                                        "randk:1:bf16", "qsgd:4",
                                        "sign",         "powersgd:2:fp16",
                                        "fp16",         "bf16",
                                        "none",         "none:fp16"};
    for (size_t i = 0; i < N(specs); i++) {
        strata_budget x;
        char buf[64];
        CU_ASSERT_EQUAL_FATAL(strata_budget_parse(specs[i], 1, &x, &dg), STRATA_OK);
        CU_ASSERT_STRING_EQUAL(strata_budget_format(&x, 1, buf, sizeof(buf)), specs[i]);
    }
    static const char *const bad_specs[] = {
        "topk",      "topk:0",     "topk:1.5", "qsgd", "qsgd:200",        "sign:fp16",
        "fp16:int8", "powersgd:0", "qsgd:4:x", "nope", "topk:0.1:int8:x", ""};
    for (size_t i = 0; i < N(bad_specs); i++) {
        strata_budget x;
        CU_ASSERT_EQUAL(strata_budget_parse(bad_specs[i], 1, &x, &dg), STRATA_EINVAL);
    }
}

/* ---- 4. lgreco ---- */

static void random_instance(strata_rng *r, size_t L, size_t C, size_t *numel, double *cand,
                            double *err)
{
    for (size_t l = 0; l < L; l++)
        numel[l] = 1 + (size_t)strata_rng_below(r, 200000);
    double x = 0.0;
    for (size_t c = 0; c < C; c++) { /* ascending, distinct, in (0, 1] */
        x += (1.0 - x) * (0.05 + 0.6 * strata_rng_uniform(r));
        cand[c] = c + 1 == C && strata_rng_below(r, 2) ? 1.0 : x;
    }
    for (size_t l = 0; l < L; l++) {
        double scale = exp(4.0 * strata_rng_normal(r)), decay = 0.5 + 4.0 * strata_rng_uniform(r);
        for (size_t c = 0; c < C; c++) /* mostly decreasing, with noise */
            err[l * C + c] = cand[c] >= 1.0 ? 0.0
                                            : scale * pow(1.0 - cand[c], decay) *
                                                  (0.8 + 0.4 * strata_rng_uniform(r));
    }
}

/* Smallest kept count over all choices whose error is at most budget; 0 when none. Also the
 * error range of all choices. */
static uint64_t brute(const double *err, const size_t *numel, size_t L, const double *cand,
                      size_t C, double budget);

/* The cost table of kept elements the programme minimises here. */
static void kept_cost(const size_t *numel, size_t L, const double *cand, size_t C, double *cost)
{
    for (size_t l = 0; l < L; l++)
        for (size_t c = 0; c < C; c++)
            cost[l * C + c] = (double)strata_comp_kept(cand[c], numel[l]);
}

static uint64_t brute(const double *err, const size_t *numel, size_t L, const double *cand,
                      size_t C, double budget)
{
    size_t combos = 1;
    for (size_t l = 0; l < L; l++)
        combos *= C;
    uint64_t best = 0;
    for (size_t m = 0; m < combos; m++) {
        size_t x = m;
        double e = 0.0;
        uint64_t k = 0;
        for (size_t l = 0; l < L; l++, x /= C) {
            e += err[l * C + x % C];
            k += strata_comp_kept(cand[x % C], numel[l]);
        }
        if (e <= budget && (best == 0 || k < best))
            best = k;
    }
    return best;
}

static void test_lgreco_bruteforce(void)
{
    strata_rng r;
    strata_rng_seed(&r, 2024, 3);
    const double Q = STRATA_LGRECO_RESOLUTION;
    int exact = 0, instances = 0, infeasible = 0;
    for (int it = 0; it < 400; it++) {
        size_t L = 1 + (size_t)strata_rng_below(&r, 4), C = 1 + (size_t)strata_rng_below(&r, 4);
        if (it % 2 == 0)
            L = C = 4;
        size_t numel[4], choice[4];
        double cand[4], err[16];
        random_instance(&r, L, C, numel, cand, err);
        double lo = 0.0, hi = 0.0;
        for (size_t l = 0; l < L; l++) {
            double mn = INFINITY, mx = 0.0;
            for (size_t c = 0; c < C; c++) {
                mn = fmin(mn, err[l * C + c]);
                mx = fmax(mx, err[l * C + c]);
            }
            lo += mn;
            hi += mx;
        }
        /* budgets from a bit below the least achievable error to above the largest */
        double budget = lo * 0.9 + (hi * 1.05 - lo * 0.9) * strata_rng_uniform(&r);
        uint64_t bf = brute(err, numel, L, cand, C, budget);
        uint64_t bf_tight = brute(err, numel, L, cand, C, budget * (1.0 - (double)L / Q));
        strata_diag d = {{0}};
        double cost[16];
        kept_cost(numel, L, cand, C, cost);
        int rc = strata_lgreco_solve(err, cost, L, C, budget, choice, &d);
        instances++;
        if (bf == 0) { /* infeasible: the programme must say so */
            CU_ASSERT_EQUAL(rc, STRATA_EINVAL);
            CU_ASSERT_PTR_NOT_NULL(strstr(d.msg, "budget"));
            infeasible++;
            continue;
        }
        if (bf_tight != 0) /* feasible with room to spare: must be solved */
            CU_ASSERT_EQUAL_FATAL(rc, STRATA_OK);
        if (rc != STRATA_OK)
            continue;
        double e = 0.0;
        uint64_t k = 0;
        for (size_t l = 0; l < L; l++) {
            CU_ASSERT_FATAL(choice[l] < C);
            e += err[l * C + choice[l]];
            k += strata_comp_kept(cand[choice[l]], numel[l]);
        }
        CU_ASSERT(e <= budget); /* never over budget */
        CU_ASSERT(k >= bf);     /* cannot beat the optimum */
        if (bf_tight != 0)
            CU_ASSERT(k <= bf_tight); /* loses at most L units of rounding */
        if (bf == bf_tight) {
            exact++;
            if (k != bf)
                fprintf(stderr, "lgreco instance %d: dp %llu, brute force %llu\n", it,
                        (unsigned long long)k, (unsigned long long)bf);
            CU_ASSERT_EQUAL(k, bf);
        }
    }
    printf("\n  lgreco: %d instances, %d infeasible, %d compared exactly with brute force\n",
           instances, infeasible, exact);
    CU_ASSERT(infeasible > 10);
    CU_ASSERT(exact >= (instances - infeasible) * 9 / 10);

    /* A hand-made case: the big layer tolerates error cheaply, the small
     * one does not. Candidates 0.01, 0.1; uniform at 0.1 costs error 2. */
    const size_t numel[] = {1000000, 10000};
    const double cand[] = {0.01, 0.1};
    const double err[] = {1.5, 1.0, 9.0, 1.0};
    size_t choice[2];
    double cost[4];
    kept_cost(numel, 2, cand, 2, cost);
    CU_ASSERT_EQUAL(strata_lgreco_solve(err, cost, 2, 2, 2.6, choice, NULL), STRATA_OK);
    CU_ASSERT(choice[0] == 0 && choice[1] == 1);
    CU_ASSERT_EQUAL(strata_lgreco_solve(err, cost, 2, 2, 1.9, choice, NULL), STRATA_EINVAL);
    /* bad arguments */
    const double bad_err[] = {1.0, NAN, 1.0, 1.0};
    const double bad_cost[] = {1.0, 1.0, -1.0, 1.0};
    CU_ASSERT_EQUAL(strata_lgreco_solve(bad_err, cost, 2, 2, 3.0, choice, NULL), STRATA_EINVAL);
    CU_ASSERT_EQUAL(strata_lgreco_solve(err, bad_cost, 2, 2, 3.0, choice, NULL), STRATA_EINVAL);
    CU_ASSERT_EQUAL(strata_lgreco_solve(err, cost, 2, 2, -1.0, choice, NULL), STRATA_EINVAL);
    CU_ASSERT_EQUAL(strata_lgreco_solve(err, cost, 2, 0, 3.0, choice, NULL), STRATA_EINVAL);
    /* a zero budget is met only by zero-error choices */
    const double zerr[] = {1.0, 0.0, 2.0, 0.0};
    CU_ASSERT_EQUAL(strata_lgreco_solve(zerr, cost, 2, 2, 0.0, choice, NULL), STRATA_OK);
    CU_ASSERT(choice[0] == 1 && choice[1] == 1);
}

/* Synthetic error of candidate b on layer l: the top-k curve s (1 - d)^a
 * of a heavy-tailed update, plus a quantisation error that grows as the
 * value format narrows; dense candidates lose only their rounding. */
static double synth_error(size_t l, size_t numel, const strata_budget *b)
{
    double s = (double)numel * (1.0 + (double)(l % 3)), a = 2.0 + 20.0 * (double)(l % 4);
    static const double q[] = {0.0, 1e-4, 1e-3, 2e-2, 0.2}; /* fp32 ... ternary */
    double d = b->comp == STRATA_COMP_TOPK ? b->density : 1.0;
    double kept_energy = s * (1.0 - pow(1.0 - d, a));
    return s * pow(1.0 - d, a) + q[b->values] * kept_energy;
}

static void lgreco_table(const size_t *numel, size_t L, const strata_budget *cand, size_t C,
                         double *err)
{
    for (size_t l = 0; l < L; l++)
        for (size_t c = 0; c < C; c++)
            err[l * C + c] = synth_error(l, numel[l], &cand[c]);
}

static int same(const strata_budget *a, const strata_budget *b)
{
    return a->comp == b->comp && a->density == b->density && a->values == b->values &&
           a->levels == b->levels && a->rank == b->rank;
}

/* lgreco on ResNet-18 with the synthetic table at target d0 and values
 * format vf: within the uniform error, no more bytes than uniform,
 * candidates only. */
static void check_lgreco_resnet(double d0, strata_values_format vf)
{
    const size_t L = N(resnet18);
    strata_policy *p = parse_ok("lgreco");
    CU_ASSERT_PTR_NOT_NULL_FATAL(p);
    CU_ASSERT_EQUAL_FATAL(strata_policy_set_values(p, vf, NULL), STRATA_OK);
    static strata_budget cand[STRATA_LGRECO_MAX_TABLE];
    static double err[N(resnet18) * STRATA_LGRECO_MAX_TABLE];
    strata_budget b[N(resnet18)], uni[N(resnet18)];
    /* before any table: uniform */
    CU_ASSERT_EQUAL_FATAL(strata_policy_budgets(p, resnet18, L, d0, 0, 50, uni, NULL), STRATA_OK);
    /* Small layers whole: uncompressed, in float32 when vf is int8 or ternary. */
    const strata_values_format small_vf = STRATA_VALUES_QUANTISED(vf) ? STRATA_VALUES_FP32 : vf;
    for (size_t l = 0; l < L; l++)
        CU_ASSERT(resnet18[l] >= 1000 ? uni[l].comp == STRATA_COMP_TOPK && uni[l].density == d0
                                      : uni[l].comp == STRATA_COMP_NONE && uni[l].density == 1.0 &&
                                            uni[l].values == small_vf);

    size_t C = strata_policy_lgreco_candidates(p, d0, cand);
    CU_ASSERT_FATAL(C > 0 && C <= STRATA_LGRECO_MAX_TABLE);
    lgreco_table(resnet18, L, cand, C, err);
    strata_diag dg = {{0}};
    CU_ASSERT_EQUAL_FATAL(strata_policy_set_lgreco_table(p, err, resnet18, L, d0, &dg), STRATA_OK);
    CU_ASSERT_EQUAL_FATAL(strata_policy_budgets(p, resnet18, L, d0, 10, 50, b, NULL), STRATA_OK);
    double e = 0.0, eu = 0.0, bytes = 0.0, ubytes = 0.0;
    int differs = 0, quantised = 0;
    for (size_t l = 0; l < L; l++) {
        size_t c = 0, cu = 0;
        while (c < C && !same(&cand[c], &b[l]))
            c++;
        while (cu < C && !same(&cand[cu], &uni[l]))
            cu++;
        CU_ASSERT_FATAL(c < C && cu < C); /* both are candidates */
        e += err[l * C + c];
        eu += err[l * C + cu];
        bytes += strata_budget_bytes(&b[l], resnet18[l]);
        ubytes += strata_budget_bytes(&uni[l], resnet18[l]);
        differs |= c != cu;
        quantised |= b[l].values != STRATA_VALUES_FP32;
    }
    strata_lgreco_report rep = strata_policy_lgreco_report(p);
    printf("\n  lgreco resnet18 d0=%g: %.0f bytes vs uniform %.0f (%.3f), error %.4g vs %.4g", d0,
           bytes, ubytes, bytes / ubytes, e, eu);
    CU_ASSERT(rep.solved && !rep.fell_back);
    CU_ASSERT(fabs(rep.bytes - bytes) <= 1e-6 * bytes);
    CU_ASSERT(fabs(rep.error_budget - eu) <= 1e-9 * eu);
    CU_ASSERT(e <= eu * (1.0 + 1e-12));
    CU_ASSERT(bytes < ubytes);
    CU_ASSERT(differs);   /* the synthetic layers differ enough to matter */
    CU_ASSERT(quantised); /* narrower value formats pay on this table */

    /* restoring the allocation gives the same budgets */
    strata_policy *p2 = parse_ok("lgreco");
    strata_budget b2[N(resnet18)];
    CU_ASSERT_EQUAL_FATAL(strata_policy_restore_lgreco(p2, b, resnet18, L, d0, &rep, NULL),
                          STRATA_OK);
    CU_ASSERT_EQUAL_FATAL(strata_policy_budgets(p2, resnet18, L, d0, 3, 50, b2, NULL), STRATA_OK);
    for (size_t l = 0; l < L; l++)
        CU_ASSERT(same(&b[l], &b2[l]));
    strata_policy_free(p2);

    /* other layers or another density: the table does not apply */
    double d[N(resnet18)];
    CU_ASSERT_EQUAL(strata_policy_densities(p, cnn_numel, N(cnn), d0, 0, 50, d, &dg),
                    STRATA_ESTATE);
    CU_ASSERT_PTR_NOT_NULL(strstr(dg.msg, "lgreco"));
    CU_ASSERT_EQUAL(strata_policy_densities(p, resnet18, L, 0.5, 0, 50, d, NULL), STRATA_ESTATE);
    strata_policy_free(p);
}

static void test_lgreco_policy(void)
{
    strata_policy *p = parse_ok("lgreco");
    CU_ASSERT_PTR_NOT_NULL_FATAL(p);
    CU_ASSERT_EQUAL(strata_policy_lgreco_every(p), 10);
    static strata_budget cand[STRATA_LGRECO_MAX_TABLE];
    /* 10 densities x 4 formats, dense fp16, dense fp32 */
    CU_ASSERT_EQUAL(strata_policy_lgreco_candidates(p, 0.01, cand), 42);
    CU_ASSERT_EQUAL(strata_policy_lgreco_candidates(p, 0.03, cand), 46); /* d0 inserted */
    CU_ASSERT(cand[20].density == 0.03 && cand[20].comp == STRATA_COMP_TOPK &&
              cand[20].values == STRATA_VALUES_FP32);
    CU_ASSERT(cand[44].comp == STRATA_COMP_FP16 && cand[45].comp == STRATA_COMP_NONE);
    CU_ASSERT_EQUAL(strata_policy_lgreco_candidates(p, 0.0, cand), 0);
    CU_ASSERT_EQUAL(strata_policy_lgreco_report(p).solved, 0);

    check_lgreco_resnet(0.01, STRATA_VALUES_FP32);
    check_lgreco_resnet(0.03, STRATA_VALUES_FP32);
    /* Quantised values: small layers still go whole in float32, and that
     * is the uniform reference lgreco measures them against. */
    check_lgreco_resnet(0.01, STRATA_VALUES_TERNARY);
    check_lgreco_resnet(0.01, STRATA_VALUES_INT8);
    printf("\n");
    /* a bad table is rejected and leaves the allocation alone */
    size_t C = strata_policy_lgreco_candidates(p, 0.01, cand);
    double err[N(cnn) * 42];
    lgreco_table(cnn_numel, N(cnn), cand, C, err);
    err[CNN_F1W * C + 2] = -1.0;
    strata_diag dg = {{0}};
    CU_ASSERT_EQUAL(strata_policy_set_lgreco_table(p, err, cnn_numel, N(cnn), 0.01, &dg),
                    STRATA_EINVAL);
    CU_ASSERT_PTR_NOT_NULL(strstr(dg.msg, "layer 4"));
    double d[N(resnet18)];
    CU_ASSERT_EQUAL(strata_policy_densities(p, resnet18, N(resnet18), 0.03, 0, 50, d, NULL),
                    STRATA_OK); /* still uniform */
    CU_ASSERT_EQUAL(d[N(resnet18) - 2], 0.03);
    err[CNN_F1W * C + 2] = NAN;
    CU_ASSERT_EQUAL(strata_policy_set_lgreco_table(p, err, cnn_numel, N(cnn), 0.01, NULL),
                    STRATA_EINVAL);
    /* equal errors everywhere: the cheapest candidates win, never above uniform's bytes */
    for (size_t i = 0; i < N(cnn) * C; i++)
        err[i] = 1.0;
    CU_ASSERT_EQUAL(strata_policy_set_lgreco_table(p, err, cnn_numel, N(cnn), 0.01, NULL),
                    STRATA_OK);
    strata_lgreco_report rep = strata_policy_lgreco_report(p);
    CU_ASSERT(rep.bytes <= rep.uniform_bytes);
    strata_policy_free(p);
}

int main(void)
{
    CU_TestInfo tests[] = {
        {"names, defaults, JSON round trip", test_names_and_roundtrip},
        {"config errors name the key", test_config_errors},
        {"call errors", test_call_errors},
        {"kept rule and budgets", test_kept_and_budgets},
        {"legacy-layer favours small groups", test_legacy_layer},
        {"legacy-phase splits rounds into equal phases", test_legacy_phase},
        {"calibration keeps uniform's volume", test_calibration},
        {"legacy-ref, compressors, values, byte calibration", test_presets_and_compressors},
        {"lgreco programme vs brute force", test_lgreco_bruteforce},
        {"lgreco policy", test_lgreco_policy},
        CU_TEST_INFO_NULL};
    CU_SuiteInfo suites[] = {{"policy", suite_init, NULL, NULL, NULL, tests}, CU_SUITE_INFO_NULL};
    return strata_test_run(suites);
}
