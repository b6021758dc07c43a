#include "strata/model.h"
#include "test_util.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Internal helpers of shared/src/model.c (model_internal.h): the kernel
 * choice, so that every check runs on oneDNN and on the reference kernels. */
void strata__model_set_reference(strata_model *m, int on);
const char *strata__model_kernels(const strata_model *m);

static strata_model *build(const char *json)
{
    strata_model *m = NULL;
    strata_diag d = {{0}};
    int rc = strata_model_from_json(json, strlen(json), &m, &d);
    if (rc != STRATA_OK)
        fprintf(stderr, "build failed: %s\n", d.msg);
    return m;
}

/* ---- parameter counts and names ---- */

static void test_builtin_counts(void)
{
    static const struct {
        const char *name;
        size_t params;
        size_t tensors;
        const char *first;
    } cases[] = {{"mlp", 199210, 6, "fc1.weight"},
                 {"cnn", 1663370, 8, "conv1.weight"},
                 {"resnet", 701178, 62, "conv1.weight"}};
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        strata_model *m = NULL;
        CU_ASSERT_EQUAL_FATAL(strata_model_new(cases[i].name, &m, NULL), STRATA_OK);
        strata_tensor_list *p = strata_model_params(m);
        CU_ASSERT_EQUAL(strata_tensor_list_numel(p), cases[i].params);
        CU_ASSERT_EQUAL(p->count, cases[i].tensors);
        CU_ASSERT_STRING_EQUAL(p->items[0].name, cases[i].first);
        CU_ASSERT_EQUAL(strata_model_input_dim(m), 784);
        CU_ASSERT_EQUAL(strata_model_output_dim(m), 10);
        strata_model_free(m);
    }
    strata_model *m = NULL;
    CU_ASSERT_EQUAL_FATAL(strata_model_new("cnn", &m, NULL), STRATA_OK);
    strata_tensor *w = strata_tensor_list_find(strata_model_params(m), "conv2.weight");
    CU_ASSERT_PTR_NOT_NULL_FATAL(w);
    CU_ASSERT(w->ndim == 4 && w->shape[0] == 64 && w->shape[1] == 32 && w->shape[2] == 5);
    w = strata_tensor_list_find(strata_model_params(m), "fc1.weight");
    CU_ASSERT_PTR_NOT_NULL_FATAL(w);
    CU_ASSERT(w->ndim == 2 && w->shape[0] == 512 && w->shape[1] == 3136);
    strata_model_free(m);
}

/* resnet: torchvision's names and shapes, and the many small tensors the
 * layer-wise budgets are about. */
static void test_resnet_names(void)
{
    strata_model *m = NULL;
    CU_ASSERT_EQUAL_FATAL(strata_model_new("resnet", &m, NULL), STRATA_OK);
    strata_tensor_list *p = strata_model_params(m);
    static const struct {
        const char *name;
        int ndim;
        int64_t shape[4];
    } want[] = {{"conv1.weight", 4, {16, 1, 3, 3}},
                {"bn1.weight", 1, {16}},
                {"layer1.0.conv1.weight", 4, {16, 16, 3, 3}},
                {"layer1.1.bn2.bias", 1, {16}},
                {"layer2.0.conv1.weight", 4, {32, 16, 3, 3}},
                {"layer2.0.downsample.0.weight", 4, {32, 16, 1, 1}},
                {"layer2.0.downsample.1.weight", 1, {32}},
                {"layer3.0.downsample.1.bias", 1, {64}},
                {"layer4.1.conv2.weight", 4, {128, 128, 3, 3}},
                {"fc.weight", 2, {10, 128}},
                {"fc.bias", 1, {10}}};
    for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
        strata_tensor *t = strata_tensor_list_find(p, want[i].name);
        CU_ASSERT_PTR_NOT_NULL_FATAL(t);
        CU_ASSERT_EQUAL(t->ndim, want[i].ndim);
        for (int d = 0; d < want[i].ndim; d++)
            CU_ASSERT_EQUAL(t->shape[d], want[i].shape[d]);
    }
    CU_ASSERT_STRING_EQUAL(p->items[p->count - 1].name, "fc.bias");
    size_t small = 0;
    for (size_t i = 0; i < p->count; i++)
        small += p->items[i].numel < 1000;
    /* 20 GroupNorms' weights and biases, fc.bias, conv1.weight (144) and
     * layer2.0.downsample.0.weight (512) */
    CU_ASSERT_EQUAL(small, 43);
    strata_model_init_params(m, 3);
    strata_tensor *g = strata_tensor_list_find(p, "layer3.1.bn1.weight");
    strata_tensor *b = strata_tensor_list_find(p, "layer3.1.bn1.bias");
    CU_ASSERT(g->data[0] == 1.0f && g->data[63] == 1.0f && b->data[0] == 0.0f);
    strata_model_free(m);
}

static void test_arch_errors(void)
{
    static const struct {
        const char *json;
        const char *expect;
    } cases[] = {
        {"[1,2]", "expected a JSON object"},
        {"{\"input\":[4],\"layers\":[]}", "layers"},
        {"{\"input\":[0],\"layers\":[{\"type\":\"relu\"}]}", "input[0]"},
        {"{\"input\":[4],\"layers\":[{\"type\":\"lstm\"}]}", "layers[0].type"},
        {"{\"input\":[4],\"layers\":[{\"type\":\"linear\",\"out_features\":3}]}", "layers[0].name"},
        {"{\"input\":[4],\"layers\":[{\"type\":\"linear\",\"name\":\"a\"}]}",
         "layers[0].out_features"},
        {"{\"input\":[4],\"layers\":[{\"type\":\"linear\",\"name\":\"a\",\"out_features\":-3}]}",
         "layers[0].out_features"},
        {"{\"input\":[1,8,8],\"layers\":[{\"type\":\"linear\",\"name\":\"a\",\"out_features\":3}]}",
         "flatten"},
        {"{\"input\":[4],\"layers\":[{\"type\":\"relu\"},{\"type\":\"conv2d\",\"name\":\"c\","
         "\"out_channels\":2,\"kernel_size\":3}]}",
         "layers[1]"},
        {"{\"input\":[1,4,4],\"layers\":[{\"type\":\"conv2d\",\"name\":\"c\",\"out_channels\":2,"
         "\"kernel_size\":7}]}",
         "layers[0].kernel_size"},
        {"{\"input\":[1,4,4],\"layers\":[{\"type\":\"conv2d\",\"name\":\"c\",\"out_channels\":2,"
         "\"kernal_size\":3}]}",
         "kernal_size"},
        {"{\"input\":[4],\"layers\":[{\"type\":\"linear\",\"name\":\"a\",\"out_features\":3},"
         "{\"type\":\"linear\",\"name\":\"a\",\"out_features\":3}]}",
         "layers[1].name: 'a' is already used by layers[0]"},
        /* A name equal to an earlier id would make references ambiguous. */
        {"{\"input\":[4],\"layers\":[{\"type\":\"relu\",\"id\":\"a\"},{\"type\":\"linear\","
         "\"name\":\"a\",\"out_features\":3}]}",
         "layers[1].name: 'a' is already used by layers[0]"},
        /* 0.99999999 is 1 in float32: every element dropped, a scale of 1/0. */
        {"{\"input\":[4],\"layers\":[{\"type\":\"dropout\",\"p\":0.99999999}]}", "layers[0].p"},
        {"{\"input\":[4],\"layers\":[{\"type\":\"dropout\",\"p\":1.5}]}", "layers[0].p"},
        {"{\"input\":[4],\"layers\":[{\"type\":\"relu\"},{\"type\":\"add\",\"with\":\"x\"}]}",
         "layers[1].with: no earlier layer"},
        {"{\"input\":[4],\"layers\":[{\"type\":\"relu\",\"id\":\"a\"},{\"type\":\"relu\","
         "\"id\":\"a\"}]}",
         "layers[1].id: 'a' is already used"},
        {"{\"input\":[4],\"layers\":[{\"type\":\"relu\",\"id\":\"a\"},{\"type\":\"linear\","
         "\"name\":\"f\",\"out_features\":3},{\"type\":\"add\",\"with\":\"a\"}]}",
         "layers[2].with: adds a 4x1x1 output to a 3x1x1 input"},
        {"{\"input\":[4],\"layers\":[{\"type\":\"relu\",\"id\":\"a\"},{\"type\":\"relu\"},"
         "{\"type\":\"relu\",\"input\":\"a\"}]}",
         "layers[1]: its output is never used"},
        {"{\"input\":[4],\"layers\":[{\"type\":\"relu\",\"input\":\"relu\"}]}",
         "layers[0].input: no earlier layer"},
        {"{\"input\":[6,2,2],\"layers\":[{\"type\":\"groupnorm\",\"name\":\"g\","
         "\"num_groups\":4}]}",
         "layers[0].num_groups: 4 does not divide the 6 channels"},
        {"{\"input\":[6,2,2],\"layers\":[{\"type\":\"groupnorm\",\"name\":\"g\","
         "\"num_groups\":3,\"eps\":0}]}",
         "layers[0].eps"},
        /* 1e-46 is 0 in float32: a group of equal values would divide by 0. */
        {"{\"input\":[6,2,2],\"layers\":[{\"type\":\"groupnorm\",\"name\":\"g\","
         "\"num_groups\":3,\"eps\":1e-46}]}",
         "layers[0].eps"},
        {"{\"input\":[6],\"layers\":[{\"type\":\"global_avgpool2d\"}]}",
         "global_avgpool2d needs an image input"},
        {"{\"input\":[1,3,3],\"layers\":[{\"type\":\"avgpool2d\",\"kernel_size\":4}]}",
         "layers[0].kernel_size"},
        {"{\"input\":[4],\"layers\":[{\"type\":\"relu\"}],\"extra\":1}", "extra"},
        {"{\"input\":[4],\"input\":[4],\"layers\":[{\"type\":\"relu\"}]}", "line"},
        {"{\"input\":[4], \"layers\":[", "line 1"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        strata_model *m = (strata_model *)0x1;
        strata_diag d = {{0}};
        int rc = strata_model_from_json(cases[i].json, strlen(cases[i].json), &m, &d);
        CU_ASSERT_EQUAL(rc, STRATA_EINVAL);
        CU_ASSERT_PTR_NULL(m);
        if (strstr(d.msg, cases[i].expect) == NULL) {
            fprintf(stderr, "case %zu: message '%s' lacks '%s'\n", i, d.msg, cases[i].expect);
            CU_FAIL("error message does not name the field");
        }
        /* Counting refuses what building refuses, with the same message. */
        size_t n = 1;
        strata_diag dc = {{0}};
        rc = strata_model_count_params(cases[i].json, strlen(cases[i].json), &n, &dc);
        CU_ASSERT_EQUAL(rc, STRATA_EINVAL);
        CU_ASSERT_EQUAL(n, 0);
        if (strcmp(dc.msg, d.msg) != 0) {
            fprintf(stderr, "case %zu: counting says '%s', building '%s'\n", i, dc.msg, d.msg);
            CU_FAIL("counting and building disagree");
        }
    }
    strata_diag d = {{0}};
    strata_model *m = NULL;
    CU_ASSERT_EQUAL(strata_model_new("/nonexistent/arch.json", &m, &d), STRATA_EINVAL);
    CU_ASSERT_PTR_NOT_NULL(strstr(d.msg, "/nonexistent/arch.json"));
}

static void test_count_and_limits(void)
{
    size_t n = 0;
    const char *cnn = strata_model_builtin_json("cnn");
    CU_ASSERT_EQUAL(strata_model_count_params(cnn, strlen(cnn), &n, NULL), STRATA_OK);
    CU_ASSERT_EQUAL(n, 1663370);
    /* 2^20 x 2^9 weights are 2^29 parameters: above the limit, refused before
     * anything is allocated. */
    const char *huge = "{\"input\":[512],\"layers\":[{\"type\":\"linear\",\"name\":\"a\","
                       "\"out_features\":1048576}]}";
    strata_diag d = {{0}};
    CU_ASSERT_EQUAL(strata_model_count_params(huge, strlen(huge), &n, &d), STRATA_ETOOBIG);
    CU_ASSERT_PTR_NOT_NULL(strstr(d.msg, "parameters"));
    strata_model *m = NULL;
    CU_ASSERT_EQUAL(strata_model_from_json(huge, strlen(huge), &m, &d), STRATA_ETOOBIG);
    CU_ASSERT_PTR_NULL(m);

    /* 2^24 values per sample in a batch of 128: 2^31 floats per activation,
     * one more than an int (a BLAS dimension) holds; refused before anything
     * is allocated or any input read. */
    const char *wide = "{\"input\":[1,4096,4096],\"layers\":[{\"type\":\"conv2d\",\"name\":"
                       "\"c\",\"out_channels\":1,\"kernel_size\":1}]}";
    CU_ASSERT_EQUAL_FATAL(strata_model_from_json(wide, strlen(wide), &m, &d), STRATA_OK);
    strata__model_set_reference(m, 1);
    const float *out;
    CU_ASSERT_EQUAL(strata_model_forward(m, (const float *)wide, 128, 0, NULL, &out),
                    STRATA_ETOOBIG);
    strata_model_free(m);
    m = NULL;

    /* A forward pass that fails leaves no pass to run backward on. */
    CU_ASSERT_EQUAL_FATAL(strata_model_new("mlp", &m, NULL), STRATA_OK);
    float x[784] = {0};
    uint8_t y[1] = {0};
    const float *logits;
    CU_ASSERT_EQUAL(strata_model_forward(m, x, 1, 0, NULL, &logits), STRATA_OK);
    CU_ASSERT_EQUAL(strata_model_forward(m, x, ((size_t)1 << 20) + 1, 0, NULL, &logits),
                    STRATA_ETOOBIG);
    CU_ASSERT_EQUAL(strata_model_backward(m, y, NULL, NULL), STRATA_ESTATE);
    CU_ASSERT_EQUAL(strata_model_forward(m, x, 1, 0, NULL, &logits), STRATA_OK);
    CU_ASSERT_EQUAL(strata_model_backward(m, y, NULL, NULL), STRATA_OK);
    strata_model_free(m);
}

/* ---- finite-difference gradient checks ---- */

enum input_kind { IN_GAUSS, IN_AWAY_FROM_ZERO, IN_DISTINCT };

static void fill_input(float *x, size_t n, enum input_kind kind, strata_rng *r)
{
    for (size_t i = 0; i < n; i++) {
        double v = strata_rng_normal(r);
        if (kind == IN_AWAY_FROM_ZERO)
            v = (v >= 0 ? 0.1 : -0.1) + v;
        x[i] = (float)v;
    }
    if (kind == IN_DISTINCT) { /* a shuffled ladder with gaps of 0.05 */
        size_t *idx = malloc(n * sizeof(size_t));
        for (size_t i = 0; i < n; i++)
            idx[i] = i;
        strata_rng_shuffle(r, idx, n);
        for (size_t i = 0; i < n; i++)
            x[idx[i]] = (float)(0.05 * (double)i - 0.025 * (double)n);
        free(idx);
    }
}

/* L = sum(R * logits), or the mean cross-entropy when labels != NULL. */
static double eval_loss(strata_model *m, const float *x, size_t B, const float *R,
                        const uint8_t *labels)
{
    strata_rng r;
    strata_rng_seed(&r, 99, 0); /* same dropout mask on every call */
    const float *y;
    CU_ASSERT_EQUAL_FATAL(strata_model_forward(m, x, B, 1, &r, &y), STRATA_OK);
    if (labels != NULL) {
        double loss;
        strata_model_loss(m, labels, &loss, NULL);
        return loss;
    }
    double s = 0.0;
    for (size_t i = 0; i < B * strata_model_output_dim(m); i++)
        s += (double)R[i] * (double)y[i];
    return s;
}

static double rel_err(const double *a, const double *b, size_t n)
{
    double num = 0, da = 0, db = 0;
    for (size_t i = 0; i < n; i++) {
        num += (a[i] - b[i]) * (a[i] - b[i]);
        da += a[i] * a[i];
        db += b[i] * b[i];
    }
    double den = sqrt(da > db ? da : db);
    return den > 0 ? sqrt(num) / den : sqrt(num);
}

static double gradcheck(const char *json, size_t B, enum input_kind kind, int use_ce, int reference)
{
    strata_model *m = build(json);
    CU_ASSERT_PTR_NOT_NULL_FATAL(m);
    strata__model_set_reference(m, reference);
    strata_model_init_params(m, 7);
    strata_model_set_input_grad(m, 1);
    strata_rng r;
    strata_rng_seed(&r, 1234, 0);
    size_t nin = B * strata_model_input_dim(m), nout = B * strata_model_output_dim(m);
    float *x = calloc(nin, sizeof(float)), *R = calloc(nout, sizeof(float));
    uint8_t *labels = use_ce ? calloc(B, 1) : NULL;
    fill_input(x, nin, kind, &r);
    for (size_t i = 0; i < nout; i++)
        R[i] = (float)strata_rng_normal(&r);
    for (size_t b = 0; use_ce && b < B; b++)
        labels[b] = (uint8_t)strata_rng_below(&r, strata_model_output_dim(m));

    eval_loss(m, x, B, R, labels);
    int spatial = strstr(json, "conv2d") != NULL || strstr(json, "pool2d") != NULL ||
                  strstr(json, "linear") != NULL;
    CU_ASSERT_STRING_EQUAL(strata__model_kernels(m),
                           !reference && spatial ? "onednn" : "reference");
    int brc =
        use_ce ? strata_model_backward(m, labels, NULL, NULL) : strata_model_backward_from(m, R);
    CU_ASSERT_EQUAL(brc, STRATA_OK);

    strata_tensor_list *P = strata_model_params(m), *G = strata_model_grads(m);
    size_t total = strata_tensor_list_numel(P) + nin;
    double *ana = calloc(total, sizeof(double)), *num = calloc(total, sizeof(double));
    size_t k = 0;
    for (size_t t = 0; t < G->count; t++)
        for (size_t i = 0; i < G->items[t].numel; i++)
            ana[k++] = G->items[t].data[i];
    const float *dx = strata_model_input_grad(m);
    for (size_t i = 0; i < nin; i++)
        ana[k++] = dx[i];

    const float eps = 1e-2f;
    k = 0;
    for (size_t t = 0; t < P->count; t++)
        for (size_t i = 0; i < P->items[t].numel; i++) {
            float *w = &P->items[t].data[i], old = *w;
            *w = old + eps;
            double lp = eval_loss(m, x, B, R, labels);
            *w = old - eps;
            double lm = eval_loss(m, x, B, R, labels);
            *w = old;
            num[k++] = (lp - lm) / (2.0 * (double)eps);
        }
    for (size_t i = 0; i < nin; i++) {
        float old = x[i];
        x[i] = old + eps;
        double lp = eval_loss(m, x, B, R, labels);
        x[i] = old - eps;
        double lm = eval_loss(m, x, B, R, labels);
        x[i] = old;
        num[k++] = (lp - lm) / (2.0 * (double)eps);
    }
    /* The worst relative error over the tensors (each parameter tensor and
     * the input), so that a small wrong tensor cannot hide behind a large
     * right one. */
    double e = 0.0;
    size_t off = 0;
    for (size_t t = 0; t <= P->count; t++) {
        size_t len = t < P->count ? P->items[t].numel : nin;
        double et = rel_err(ana + off, num + off, len);
        if (et > e)
            e = et;
        off += len;
    }
    free(ana);
    free(num);
    free(x);
    free(R);
    free(labels);
    strata_model_free(m);
    return e;
}

static void check_grad(const char *what, const char *json, size_t B, enum input_kind kind,
                       int use_ce)
{
    for (int reference = 0; reference <= 1; reference++) {
        double e = gradcheck(json, B, kind, use_ce, reference);
        printf("\n    %s (%s): worst per-tensor relative error %.2e ", what,
               reference ? "reference" : "oneDNN", e);
        CU_ASSERT(e < 1e-3);
    }
}

static void test_grad_linear(void)
{
    check_grad("linear",
               "{\"input\":[9],\"layers\":[{\"type\":\"linear\",\"name\":\"fc\","
               "\"out_features\":6}]}",
               3, IN_GAUSS, 0);
}

static void test_grad_linear_nobias(void)
{
    check_grad("linear without bias",
               "{\"input\":[5],\"layers\":[{\"type\":\"linear\","
               "\"name\":\"fc\",\"out_features\":4,\"bias\":false}]}",
               2, IN_GAUSS, 0);
}

static void test_grad_conv(void)
{
    check_grad("conv2d k3 s1 p0",
               "{\"input\":[2,6,5],\"layers\":[{\"type\":\"conv2d\","
               "\"name\":\"c\",\"out_channels\":3,\"kernel_size\":3}]}",
               2, IN_GAUSS, 0);
}

static void test_grad_conv_stride_pad(void)
{
    check_grad("conv2d k3 s2 p1",
               "{\"input\":[2,7,7],\"layers\":[{\"type\":\"conv2d\","
               "\"name\":\"c\",\"out_channels\":3,\"kernel_size\":3,\"stride\":2,"
               "\"padding\":1}]}",
               2, IN_GAUSS, 0);
    check_grad("conv2d k5 s2 p2",
               "{\"input\":[1,9,8],\"layers\":[{\"type\":\"conv2d\","
               "\"name\":\"c\",\"out_channels\":2,\"kernel_size\":5,\"stride\":2,"
               "\"padding\":2}]}",
               3, IN_GAUSS, 0);
}

static void test_grad_maxpool(void)
{
    check_grad("maxpool2d k2",
               "{\"input\":[2,6,6],\"layers\":[{\"type\":\"maxpool2d\","
               "\"kernel_size\":2}]}",
               2, IN_DISTINCT, 0);
    check_grad("maxpool2d k3 s2",
               "{\"input\":[1,7,7],\"layers\":[{\"type\":\"maxpool2d\","
               "\"kernel_size\":3,\"stride\":2}]}",
               2, IN_DISTINCT, 0);
}

static void test_grad_relu(void)
{
    check_grad("relu", "{\"input\":[20],\"layers\":[{\"type\":\"relu\"}]}", 3, IN_AWAY_FROM_ZERO,
               0);
}

static void test_grad_flatten(void)
{
    check_grad("flatten", "{\"input\":[2,3,3],\"layers\":[{\"type\":\"flatten\"}]}", 2, IN_GAUSS,
               0);
}

static void test_grad_dropout(void)
{
    check_grad("dropout", "{\"input\":[30],\"layers\":[{\"type\":\"dropout\",\"p\":0.3}]}", 2,
               IN_GAUSS, 0);
}

static void test_grad_softmax_xent(void)
{
    check_grad("softmax cross-entropy",
               "{\"input\":[7],\"layers\":[{\"type\":\"linear\","
               "\"name\":\"fc\",\"out_features\":5}]}",
               4, IN_GAUSS, 1);
}

static void test_grad_small_cnn(void)
{
    /* Smooth layers only: a pooling kink crossed by the perturbation would
     * make the finite difference itself wrong. */
    check_grad("conv-linear stack with cross-entropy",
               "{\"input\":[1,8,8],\"layers\":[{\"type\":\"conv2d\",\"name\":\"c\","
               "\"out_channels\":2,\"kernel_size\":3,\"padding\":1},{\"type\":\"flatten\"},{"
               "\"type\":\"linear\",\"name\":\"fc\","
               "\"out_features\":3}]}",
               2, IN_GAUSS, 1);
}

static void test_grad_blocked(void)
{
    /* 16 channels: oneDNN keeps these images in its blocked layout, so the
     * reorders at the flatten and the blocked convolution kernels are
     * checked too. */
    check_grad("blocked conv-conv-linear stack with cross-entropy",
               "{\"input\":[1,8,8],\"layers\":[{\"type\":\"conv2d\",\"name\":\"c1\","
               "\"out_channels\":16,\"kernel_size\":3,\"padding\":1},{\"type\":\"conv2d\","
               "\"name\":\"c2\",\"out_channels\":16,\"kernel_size\":3,\"stride\":2,"
               "\"padding\":1},{\"type\":\"flatten\"},{\"type\":\"linear\",\"name\":\"fc\","
               "\"out_features\":3}]}",
               2, IN_GAUSS, 1);
}

static void test_grad_avgpool(void)
{
    check_grad("avgpool2d k2",
               "{\"input\":[2,6,6],\"layers\":[{\"type\":\"avgpool2d\",\"kernel_size\":2}]}", 2,
               IN_GAUSS, 0);
    check_grad("avgpool2d k3 s2 (overlapping)",
               "{\"input\":[1,7,8],\"layers\":[{\"type\":\"avgpool2d\","
               "\"kernel_size\":3,\"stride\":2}]}",
               2, IN_GAUSS, 0);
    check_grad("global_avgpool2d",
               "{\"input\":[3,5,4],\"layers\":[{\"type\":\"global_avgpool2d\"}]}", 2, IN_GAUSS, 0);
    check_grad("global_avgpool2d on blocked images",
               "{\"input\":[1,5,5],\"layers\":[{\"type\":\"conv2d\",\"name\":\"c\","
               "\"out_channels\":16,\"kernel_size\":3,\"padding\":1},{\"type\":"
               "\"global_avgpool2d\"},{\"type\":\"flatten\"},{\"type\":\"linear\","
               "\"name\":\"fc\",\"out_features\":3}]}",
               2, IN_GAUSS, 1);
}

static void test_grad_groupnorm(void)
{
    check_grad("groupnorm, 2 groups of 2 channels",
               "{\"input\":[4,3,3],\"layers\":[{\"type\":\"groupnorm\",\"name\":\"g\","
               "\"num_groups\":2}]}",
               3, IN_GAUSS, 0);
    check_grad("groupnorm on a flat input, eps 0.1",
               "{\"input\":[6],\"layers\":[{\"type\":\"groupnorm\",\"name\":\"g\","
               "\"num_groups\":1,\"eps\":0.1}]}",
               3, IN_GAUSS, 0);
    /* After a 16-channel convolution the oneDNN plan keeps the image blocked,
     * so the blocked layout of GroupNorm is checked too. */
    check_grad("groupnorm on blocked images",
               "{\"input\":[1,4,4],\"layers\":[{\"type\":\"conv2d\",\"name\":\"c\","
               "\"out_channels\":16,\"kernel_size\":3,\"padding\":1,\"bias\":false},"
               "{\"type\":\"groupnorm\",\"name\":\"g\",\"num_groups\":4},{\"type\":"
               "\"flatten\"},{\"type\":\"linear\",\"name\":\"fc\",\"out_features\":3}]}",
               2, IN_GAUSS, 1);
}

/* A small residual network on 16- and 32-channel images (blocked on the
 * oneDNN path): an identity shortcut, a projection shortcut read through
 * "input", and one output (d.conv1) read by three layers: both adds and
 * the layer after it. */
static const char RESIDUAL_JSON[] =
    "{\"input\":[1,6,6],\"layers\":["
    "{\"type\":\"conv2d\",\"name\":\"stem\",\"out_channels\":16,\"kernel_size\":3,"
    "\"padding\":1,\"bias\":false,\"id\":\"x\"},"
    "{\"type\":\"conv2d\",\"name\":\"b.conv1\",\"out_channels\":16,\"kernel_size\":3,"
    "\"padding\":1},"
    "{\"type\":\"groupnorm\",\"name\":\"b.bn1\",\"num_groups\":4},"
    "{\"type\":\"add\",\"with\":\"x\",\"id\":\"y\"},"
    "{\"type\":\"conv2d\",\"name\":\"d.conv1\",\"out_channels\":32,\"kernel_size\":3,"
    "\"stride\":2,\"padding\":1},"
    "{\"type\":\"conv2d\",\"name\":\"d.down\",\"input\":\"y\",\"out_channels\":32,"
    "\"kernel_size\":1,\"stride\":2},"
    "{\"type\":\"add\",\"with\":\"d.conv1\"},"
    "{\"type\":\"add\",\"with\":\"d.conv1\"},"
    "{\"type\":\"global_avgpool2d\"},{\"type\":\"flatten\"},"
    "{\"type\":\"linear\",\"name\":\"fc\",\"out_features\":3}]}";

static void test_grad_residual(void)
{
    /* x + x + x on plain images: one output read three times. */
    check_grad("residual add, plain (x + x)",
               "{\"input\":[2,3,3],\"layers\":[{\"type\":\"conv2d\",\"name\":\"c\","
               "\"out_channels\":2,\"kernel_size\":3,\"padding\":1},{\"type\":\"add\","
               "\"with\":\"c\"},{\"type\":\"add\",\"with\":\"c\"}]}",
               2, IN_GAUSS, 0);
    check_grad("residual network, blocked", RESIDUAL_JSON, 2, IN_GAUSS, 1);
}

/* ---- oneDNN against the reference kernels ---- */

static double max_rel(const float *a, const float *b, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (d > num)
            num = d;
        if (fabs((double)b[i]) > den)
            den = fabs((double)b[i]);
    }
    return den > 0 ? num / den : num;
}

/* One training step on both kernel sets: same logits, loss, parameter and
 * input gradients within float32 tolerance. */
static void compare_kernels(const char *what, const char *json, size_t B, int use_ce)
{
    strata_model *m[2];
    for (int k = 0; k < 2; k++) {
        m[k] = build(json);
        CU_ASSERT_PTR_NOT_NULL_FATAL(m[k]);
        strata_model_init_params(m[k], 21);
        strata__model_set_reference(m[k], k);
        strata_model_set_input_grad(m[k], 1);
    }
    size_t nin = B * strata_model_input_dim(m[0]), nout = B * strata_model_output_dim(m[0]);
    float *x = calloc(nin, sizeof(float)), *R = calloc(nout, sizeof(float));
    uint8_t *labels = calloc(B, 1);
    strata_rng r;
    strata_rng_seed(&r, 77, 0);
    for (size_t i = 0; i < nin; i++)
        x[i] = (float)strata_rng_uniform(&r);
    for (size_t i = 0; i < nout; i++)
        R[i] = (float)strata_rng_normal(&r);
    for (size_t b = 0; b < B; b++)
        labels[b] = (uint8_t)strata_rng_below(&r, strata_model_output_dim(m[0]));
    const float *y[2];
    double loss[2] = {0, 0};
    for (int k = 0; k < 2; k++) {
        strata_rng dr;
        strata_rng_seed(&dr, 5, 0); /* the same dropout masks */
        CU_ASSERT_EQUAL_FATAL(strata_model_forward(m[k], x, B, 1, &dr, &y[k]), STRATA_OK);
        int rc = use_ce ? strata_model_backward(m[k], labels, &loss[k], NULL)
                        : strata_model_backward_from(m[k], R);
        CU_ASSERT_EQUAL(rc, STRATA_OK);
    }
    CU_ASSERT_STRING_EQUAL(strata__model_kernels(m[0]), "onednn");
    CU_ASSERT_STRING_EQUAL(strata__model_kernels(m[1]), "reference");
    double worst = max_rel(y[0], y[1], nout);
    CU_ASSERT(fabs(loss[0] - loss[1]) < 1e-5);
    strata_tensor_list *g0 = strata_model_grads(m[0]), *g1 = strata_model_grads(m[1]);
    for (size_t t = 0; t < g0->count; t++) {
        double e = max_rel(g0->items[t].data, g1->items[t].data, g0->items[t].numel);
        if (e > worst)
            worst = e;
    }
    double e = max_rel(strata_model_input_grad(m[0]), strata_model_input_grad(m[1]), nin);
    if (e > worst)
        worst = e;
    printf("\n    %s, batch %zu: worst relative difference %.2e ", what, B, worst);
    CU_ASSERT(worst < 1e-4);
    free(x);
    free(R);
    free(labels);
    strata_model_free(m[0]);
    strata_model_free(m[1]);
}

static void test_onednn_matches_reference(void)
{
    const char *cnn = strata_model_builtin_json("cnn");
    compare_kernels("cnn", cnn, 8, 1);
    compare_kernels("cnn", cnn, 3, 1);
    compare_kernels("mlp", strata_model_builtin_json("mlp"), 8, 1);
    /* Stride, padding, overlapping and uneven pooling, dropout on blocked
     * images, 3 input channels. */
    compare_kernels("strided stack",
                    "{\"input\":[3,11,9],\"layers\":[{\"type\":\"conv2d\",\"name\":\"c1\","
                    "\"out_channels\":16,\"kernel_size\":3,\"stride\":2,\"padding\":1},"
                    "{\"type\":\"relu\"},{\"type\":\"maxpool2d\",\"kernel_size\":2,"
                    "\"stride\":1},{\"type\":\"conv2d\",\"name\":\"c2\",\"out_channels\":32,"
                    "\"kernel_size\":3,\"padding\":1,\"bias\":false},{\"type\":\"dropout\","
                    "\"p\":0.3},{\"type\":\"maxpool2d\",\"kernel_size\":3,\"stride\":2},"
                    "{\"type\":\"flatten\"},{\"type\":\"linear\",\"name\":\"fc\","
                    "\"out_features\":5}]}",
                    4, 1);
    compare_kernels("residual network", RESIDUAL_JSON, 3, 1);
    compare_kernels("resnet", strata_model_builtin_json("resnet"), 4, 1);
    compare_kernels("avgpool",
                    "{\"input\":[1,9,9],\"layers\":[{\"type\":\"conv2d\",\"name\":\"c\","
                    "\"out_channels\":16,\"kernel_size\":3},{\"type\":\"avgpool2d\","
                    "\"kernel_size\":3,\"stride\":2},{\"type\":\"groupnorm\",\"name\":"
                    "\"g\",\"num_groups\":2},{\"type\":\"flatten\"},{\"type\":\"linear\","
                    "\"name\":\"fc\",\"out_features\":4}]}",
                    2, 1);
    /* Image outputs: the logits stay plain. */
    compare_kernels("image output",
                    "{\"input\":[2,6,6],\"layers\":[{\"type\":\"conv2d\",\"name\":\"c\","
                    "\"out_channels\":16,\"kernel_size\":3,\"padding\":1},{\"type\":\"relu\"}]}",
                    2, 0);
}

/* ---- forward correctness against direct formulas ---- */

static void test_conv_forward_direct(void)
{
    const char *json = "{\"input\":[2,7,6],\"layers\":[{\"type\":\"conv2d\",\"name\":\"c\","
                       "\"out_channels\":3,\"kernel_size\":3,\"stride\":2,\"padding\":1}]}";
    strata_model *m = build(json);
    CU_ASSERT_PTR_NOT_NULL_FATAL(m);
    strata_model_init_params(m, 3);
    const int C = 2, H = 7, W = 6, OC = 3, K = 3, S = 2, PD = 1, OH = 4, OW = 3, B = 2;
    float x[2 * 2 * 7 * 6];
    strata_rng r;
    strata_rng_seed(&r, 5, 0);
    for (size_t i = 0; i < sizeof(x) / sizeof(x[0]); i++)
        x[i] = (float)strata_rng_normal(&r);
    const float *y;
    CU_ASSERT_EQUAL_FATAL(strata_model_forward(m, x, B, 0, NULL, &y), STRATA_OK);
    CU_ASSERT_EQUAL(strata_model_output_dim(m), (size_t)OC * OH * OW);
    const float *w = strata_model_params(m)->items[0].data,
                *bias = strata_model_params(m)->items[1].data;
    double maxdiff = 0;
    for (int b = 0; b < B; b++)
        for (int o = 0; o < OC; o++)
            for (int oh = 0; oh < OH; oh++)
                for (int ow = 0; ow < OW; ow++) {
                    double s = bias[o];
                    for (int c = 0; c < C; c++)
                        for (int i = 0; i < K; i++)
                            for (int j = 0; j < K; j++) {
                                int ih = oh * S - PD + i, iw = ow * S - PD + j;
                                if (ih < 0 || ih >= H || iw < 0 || iw >= W)
                                    continue;
                                s += (double)w[((o * C + c) * K + i) * K + j] *
                                     x[((b * C + c) * H + ih) * W + iw];
                            }
                    double got = y[((b * OC + o) * OH + oh) * OW + ow];
                    if (fabs(got - s) > maxdiff)
                        maxdiff = fabs(got - s);
                }
    CU_ASSERT(maxdiff < 1e-5);
    strata_model_free(m);
}

static void test_forward_deterministic(void)
{
    strata_model *m = NULL;
    CU_ASSERT_EQUAL_FATAL(strata_model_new("cnn", &m, NULL), STRATA_OK);
    strata_model_init_params(m, 11);
    float *x = calloc(5 * 784, sizeof(float));
    for (int i = 0; i < 5 * 784; i++)
        x[i] = (float)((i * 37) % 255) / 255.0f;
    uint8_t labels[5] = {0, 3, 9, 1, 4};
    const float *y;
    float first[50];
    double l1, l2;
    CU_ASSERT_EQUAL(strata_model_forward(m, x, 5, 1, NULL, &y), STRATA_OK);
    memcpy(first, y, sizeof(first));
    CU_ASSERT_EQUAL(strata_model_backward(m, labels, &l1, NULL), STRATA_OK);
    CU_ASSERT(l1 > 1.5 && l1 < 3.5); /* about ln(10) at initialisation */
    CU_ASSERT_EQUAL(strata_model_forward(m, x, 5, 1, NULL, &y), STRATA_OK);
    CU_ASSERT_EQUAL(memcmp(first, y, sizeof(first)), 0);
    CU_ASSERT_EQUAL(strata_model_backward(m, labels, &l2, NULL), STRATA_OK);
    CU_ASSERT_EQUAL(l1, l2);
    uint8_t bad[5] = {0, 10, 0, 0, 0};
    CU_ASSERT_EQUAL(strata_model_backward(m, bad, NULL, NULL), STRATA_EINVAL);
    free(x);
    strata_model_free(m);
}

/* A resnet (seed 5) on the given kernels, with the input gradient on. */
static strata_model *seeded_resnet(int reference)
{
    strata_model *m = NULL;
    CU_ASSERT_EQUAL(strata_model_new("resnet", &m, NULL), STRATA_OK);
    if (m == NULL)
        return NULL;
    strata__model_set_reference(m, reference);
    strata_model_init_params(m, 5);
    strata_model_set_input_grad(m, 1);
    return m;
}

/* Gradients of a batch of n samples of x from a fresh seeded_resnet. */
static void fresh_grads(int reference, const float *x, const uint8_t *labels, size_t n,
                        strata_tensor_list *g, float *dx)
{
    strata_model *f = seeded_resnet(reference);
    CU_ASSERT_PTR_NOT_NULL_FATAL(f);
    const float *y;
    CU_ASSERT_EQUAL(strata_model_forward(f, x, n, 0, NULL, &y), STRATA_OK);
    CU_ASSERT_EQUAL(strata_model_backward(f, labels, NULL, NULL), STRATA_OK);
    CU_ASSERT_EQUAL(strata_tensor_list_copy(g, strata_model_grads(f)), STRATA_OK);
    memcpy(dx, strata_model_input_grad(f), n * 784 * sizeof(float));
    strata_model_free(f);
}

static void expect_grads(strata_model *m, const strata_tensor_list *g, const float *dx, size_t n)
{
    strata_tensor_list *h = strata_model_grads(m);
    CU_ASSERT_EQUAL_FATAL(h->count, g->count);
    for (size_t t = 0; t < g->count; t++)
        for (size_t i = 0; i < g->items[t].numel; i++)
            CU_ASSERT_DOUBLE_EQUAL(h->items[t].data[i], g->items[t].data[i],
                                   1e-6 + 1e-4 * fabs(g->items[t].data[i]));
    const float *d = strata_model_input_grad(m);
    CU_ASSERT_PTR_NOT_NULL_FATAL(d);
    for (size_t i = 0; i < n * 784; i++)
        CU_ASSERT_DOUBLE_EQUAL(d[i], dx[i], 1e-6 + 1e-4 * fabs(dx[i]));
}

/* A model that only runs forward makes no gradient buffers; a backward pass
 * makes them for its batch, a larger one regrows them, and a forward pass
 * that grows the activation buffers drops them. Through every step the
 * gradients (residual adds included) match a fresh model's, on both kernel
 * sets. */
static void test_grad_buffers_on_backward(void)
{
    float *x = calloc(9 * 784, sizeof(float)), *dx = calloc(5 * 784, sizeof(float));
    CU_ASSERT_PTR_NOT_NULL_FATAL(x);
    CU_ASSERT_PTR_NOT_NULL_FATAL(dx);
    for (int i = 0; i < 9 * 784; i++)
        x[i] = (float)((i * 53) % 251) / 251.0f;
    uint8_t labels[9] = {2, 7, 1, 0, 9, 4, 4, 3, 8};
    for (int reference = 0; reference <= 1; reference++) {
        strata_tensor_list g;
        strata_tensor_list_init(&g);
        fresh_grads(reference, x, labels, 5, &g, dx);
        strata_model *m = seeded_resnet(reference);
        CU_ASSERT_PTR_NOT_NULL_FATAL(m);
        const float *y;
        CU_ASSERT_EQUAL(strata_model_forward(m, x, 7, 0, NULL, &y), STRATA_OK);
        CU_ASSERT_PTR_NULL(strata_model_input_grad(m));
        CU_ASSERT_EQUAL(strata_model_forward(m, x, 3, 0, NULL, &y), STRATA_OK);
        CU_ASSERT_EQUAL(strata_model_backward(m, labels, NULL, NULL), STRATA_OK);
        CU_ASSERT_PTR_NOT_NULL(strata_model_input_grad(m));
        /* 5 fits the activation buffers (7) but not the gradients (3). */
        CU_ASSERT_EQUAL(strata_model_forward(m, x, 5, 0, NULL, &y), STRATA_OK);
        CU_ASSERT_EQUAL(strata_model_backward(m, labels, NULL, NULL), STRATA_OK);
        expect_grads(m, &g, dx, 5);
        /* 9 regrows the activation buffers and drops the gradients. */
        CU_ASSERT_EQUAL(strata_model_forward(m, x, 9, 0, NULL, &y), STRATA_OK);
        CU_ASSERT_PTR_NULL(strata_model_input_grad(m));
        CU_ASSERT_EQUAL(strata_model_backward(m, labels, NULL, NULL), STRATA_OK);
        CU_ASSERT_EQUAL(strata_model_forward(m, x, 5, 0, NULL, &y), STRATA_OK);
        CU_ASSERT_EQUAL(strata_model_backward(m, labels, NULL, NULL), STRATA_OK);
        expect_grads(m, &g, dx, 5);
        strata_model_free(m);
        strata_tensor_list_cleanup(&g);
    }
    free(x);
    free(dx);
}

int main(void)
{
    strata_set_threads(0);
    CU_TestInfo arch_tests[] = {
        {"built-in parameter counts", test_builtin_counts},
        {"resnet names and shapes", test_resnet_names},
        {"architecture errors name the field", test_arch_errors},
        {"parameter count, limits, failed forward", test_count_and_limits},
        CU_TEST_INFO_NULL,
    };
    CU_TestInfo grad_tests[] = {
        {"linear", test_grad_linear},
        {"linear without bias", test_grad_linear_nobias},
        {"conv2d", test_grad_conv},
        {"conv2d stride 2 + padding", test_grad_conv_stride_pad},
        {"maxpool2d", test_grad_maxpool},
        {"relu", test_grad_relu},
        {"flatten", test_grad_flatten},
        {"dropout", test_grad_dropout},
        {"softmax cross-entropy", test_grad_softmax_xent},
        {"small cnn stack", test_grad_small_cnn},
        {"avgpool2d, global_avgpool2d", test_grad_avgpool},
        {"groupnorm", test_grad_groupnorm},
        {"residual add", test_grad_residual},
        {"blocked (16-channel) stack", test_grad_blocked},
        CU_TEST_INFO_NULL,
    };
    CU_TestInfo fwd_tests[] = {
        {"conv2d matches direct convolution", test_conv_forward_direct},
        {"forward/backward deterministic", test_forward_deterministic},
        {"gradient buffers made by a backward pass that needs them", test_grad_buffers_on_backward},
        {"oneDNN matches the reference kernels", test_onednn_matches_reference},
        CU_TEST_INFO_NULL,
    };
    CU_SuiteInfo suites[] = {
        {"architecture", NULL, NULL, NULL, NULL, arch_tests},
        {"gradcheck", NULL, NULL, NULL, NULL, grad_tests},
        {"forward", NULL, NULL, NULL, NULL, fwd_tests},
        CU_SUITE_INFO_NULL,
    };
    return strata_test_run(suites);
}
