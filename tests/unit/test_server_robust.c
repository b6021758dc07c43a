/* Coordinate-wise trimmed mean and median (server/core/robust.h). */
#include "robust.h"
#include "aggregate.h"
#include "strata/compress.h"
#include "test_util.h"

#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- helpers ---- */

static uint64_t rng_state = 0x2545F4914F6CDD1DULL;

static uint64_t next_u64(void)
{
    uint64_t x = rng_state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return rng_state = x;
}

/* Uniform in [0, 1). */
static double uniform(void)
{
    return (double)(next_u64() >> 11) * (1.0 / 9007199254740992.0);
}

/* A layout of nt one-dimensional tensors "t0", "t1", ... of sizes[i]. */
static void make_vec_layout(strata_tensor_list *l, const int64_t *sizes, size_t nt)
{
    strata_tensor_list_init(l);
    for (size_t i = 0; i < nt; i++) {
        char name[32];
        snprintf(name, sizeof(name), "t%zu", i);
        CU_ASSERT_EQUAL_FATAL(strata_tensor_list_add(l, name, 1, &sizes[i], NULL), STRATA_OK);
    }
}

static strata_clayer dense_layer(uint32_t index, float *values, size_t n)
{
    strata_clayer c = {
        .layer_index = index, .comp = STRATA_COMP_NONE, .numel = n, .count = n, .values = values};
    return c;
}

static strata_clayer topk_layer(uint32_t index, size_t numel, uint32_t *idx, float *values,
                                size_t count)
{
    strata_clayer c = {.layer_index = index,
                       .comp = STRATA_COMP_TOPK,
                       .numel = numel,
                       .count = count,
                       .indices = idx,
                       .values = values};
    return c;
}

/* Fills every element of l with x. */
static void fill(strata_tensor_list *l, float x)
{
    for (size_t i = 0; i < l->count; i++)
        for (size_t j = 0; j < l->items[i].numel; j++)
            l->items[i].data[j] = x;
}

/* Runs strata_robust_aggregate into a fresh zero list shaped like layout. */
static int run(const strata_tensor_list *layout, const strata_robust_update *u, size_t n,
               strata_robust_method method, double trim, double clip, strata_tensor_list *out)
{
    strata_tensor_list_init(out);
    CU_ASSERT_EQUAL_FATAL(strata_tensor_list_zeros_like(out, layout), STRATA_OK);
    strata_diag d = {{0}};
    int rc = strata_robust_aggregate(layout, u, n, method, trim, clip, out, &d);
    if (rc != STRATA_OK)
        fprintf(stderr, "robust %s: %s\n", strata_robust_name(method), strata_diag_msg(&d, rc));
    return rc;
}

static void expect_values(const strata_tensor_list *got, size_t tensor, const double *want,
                          size_t n, const char *label)
{
    for (size_t j = 0; j < n; j++)
        if ((double)got->items[tensor].data[j] != (double)(float)want[j]) {
            fprintf(stderr, "%s: element %zu is %.9g, want %.9g\n", label, j,
                    (double)got->items[tensor].data[j], want[j]);
            CU_FAIL("robust aggregate differs from the hand-computed value");
        }
}

/* ---- 1. hand-computed cases ---- */

static void test_median_odd_even(void)
{
    int64_t sizes[2] = {4, 2};
    strata_tensor_list layout;
    make_vec_layout(&layout, sizes, 2);
    float a0[4] = {1, -2, 5, 0}, a1[2] = {10, 1};
    float b0[4] = {3, 7, -1, 0}, b1[2] = {-10, 2};
    float c0[4] = {2, 0, 4, 0}, c1[2] = {0, 3};
    float d0[4] = {-8, 1, 4, 9}, d1[2] = {5, 4};
    strata_clayer la[2] = {dense_layer(0, a0, 4), dense_layer(1, a1, 2)};
    strata_clayer lb[2] = {dense_layer(0, b0, 4), dense_layer(1, b1, 2)};
    strata_clayer lc[2] = {dense_layer(0, c0, 4), dense_layer(1, c1, 2)};
    strata_clayer ld[2] = {dense_layer(0, d0, 4), dense_layer(1, d1, 2)};
    strata_robust_update u[4] = {{la, 2}, {lb, 2}, {lc, 2}, {ld, 2}};
    strata_tensor_list out;

    /* Three updates: the middle value. */
    CU_ASSERT_EQUAL_FATAL(run(&layout, u, 3, STRATA_ROBUST_MEDIAN, 0.0, 0.0, &out), STRATA_OK);
    const double m3_0[4] = {2, 0, 4, 0}, m3_1[2] = {0, 2};
    expect_values(&out, 0, m3_0, 4, "median of 3, t0");
    expect_values(&out, 1, m3_1, 2, "median of 3, t1");
    strata_tensor_list_cleanup(&out);

    /* Four updates: the mean of the two middle values. */
    CU_ASSERT_EQUAL_FATAL(run(&layout, u, 4, STRATA_ROBUST_MEDIAN, 0.3, 0.0, &out), STRATA_OK);
    /* t0: {-8,1,2,3} -> 1.5; {-2,0,1,7} -> 0.5; {-1,4,4,5} -> 4; {0,0,0,9} -> 0
     * t1: {-10,0,5,10} -> 2.5; {1,2,3,4} -> 2.5 */
    const double m4_0[4] = {1.5, 0.5, 4, 0}, m4_1[2] = {2.5, 2.5};
    expect_values(&out, 0, m4_0, 4, "median of 4, t0");
    expect_values(&out, 1, m4_1, 2, "median of 4, t1");
    strata_tensor_list_cleanup(&out);

    /* A single update is its own median and trimmed mean. */
    CU_ASSERT_EQUAL_FATAL(run(&layout, &u[3], 1, STRATA_ROBUST_MEDIAN, 0.0, 0.0, &out), STRATA_OK);
    const double one0[4] = {-8, 1, 4, 9};
    expect_values(&out, 0, one0, 4, "median of 1");
    strata_tensor_list_cleanup(&out);
    CU_ASSERT_EQUAL_FATAL(run(&layout, &u[3], 1, STRATA_ROBUST_TRIMMED_MEAN, 0.49, 0.0, &out),
                          STRATA_OK);
    expect_values(&out, 0, one0, 4, "trimmed mean of 1");
    strata_tensor_list_cleanup(&out);
    strata_tensor_list_cleanup(&layout);
}

static void test_trimmed_mean(void)
{
    int64_t sizes[1] = {3};
    strata_tensor_list layout;
    make_vec_layout(&layout, sizes, 1);
    /* Columns: {1,2,3,4,100}, {-50,0,1,2,3}, {7,7,7,7,7} */
    float v[5][3] = {{1, 3, 7}, {100, -50, 7}, {3, 1, 7}, {2, 0, 7}, {4, 2, 7}};
    strata_clayer l[5];
    strata_robust_update u[5];
    for (int i = 0; i < 5; i++) {
        l[i] = dense_layer(0, v[i], 3);
        u[i] = (strata_robust_update){&l[i], 1};
    }
    static const struct {
        double trim;
        double want[3];
    } cases[] = {
        {0.0, {22.0, -8.8, 7}},    /* k = 0: the plain unweighted mean */
        {0.19, {22.0, -8.8, 7}},   /* floor(0.95) = 0 */
        {0.2, {3.0, 1.0, 7}},      /* k = 1: {2,3,4}, {0,1,2} */
        {0.3, {3.0, 1.0, 7}},      /* floor(1.5) = 1 */
        {0.4, {3.0, 1.0, 7}},      /* k = 2: the middle value */
        {0.4999, {3.0, 1.0, 7.0}}, /* still k = 2 */
    };
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        strata_tensor_list out;
        CU_ASSERT_EQUAL_FATAL(
            run(&layout, u, 5, STRATA_ROBUST_TRIMMED_MEAN, cases[c].trim, 0.0, &out), STRATA_OK);
        char label[64];
        snprintf(label, sizeof(label), "trimmed mean, trim %g", cases[c].trim);
        expect_values(&out, 0, cases[c].want, 3, label);
        strata_tensor_list_cleanup(&out);
    }
    /* Six updates, trim 0.25: k = 1, mean of the middle four. */
    float w[3] = {-1000, 1000, 6};
    strata_clayer l6[6];
    strata_robust_update u6[6];
    for (int i = 0; i < 6; i++) {
        l6[i] = i < 5 ? l[i] : dense_layer(0, w, 3);
        u6[i] = (strata_robust_update){&l6[i], 1};
    }
    strata_tensor_list out;
    CU_ASSERT_EQUAL_FATAL(run(&layout, u6, 6, STRATA_ROBUST_TRIMMED_MEAN, 0.25, 0.0, &out),
                          STRATA_OK);
    /* {-1000,1,2,3,4,100} -> 2.5; {-50,0,1,2,3,1000} -> 1.5; {6,7,7,7,7,7} -> 7 */
    const double want6[3] = {2.5, 1.5, 7};
    expect_values(&out, 0, want6, 3, "trimmed mean of 6");
    strata_tensor_list_cleanup(&out);
    strata_tensor_list_cleanup(&layout);
}

/* Norms 5 (at the bound), 2 (below) and 10 (above, halved) across two
 * tensors, one of them sparse. */
static void test_clipping(void)
{
    int64_t sizes[2] = {3, 1};
    strata_tensor_list layout;
    make_vec_layout(&layout, sizes, 2);
    uint32_t ia[1] = {1}, ic[2] = {0, 2};
    float va[1] = {3}, a1[1] = {4};       /* [0,3,0 | 4]: norm 5 */
    float b0[3] = {0, 2, 0}, b1[1] = {0}; /* [0,2,0 | 0]: norm 2 */
    float vc[2] = {6, 0}, c1[1] = {8};    /* [6,0,0 | 8]: norm 10 */
    strata_clayer la[2] = {topk_layer(0, 3, ia, va, 1), dense_layer(1, a1, 1)};
    strata_clayer lb[2] = {dense_layer(0, b0, 3), dense_layer(1, b1, 1)};
    strata_clayer lc[2] = {topk_layer(0, 3, ic, vc, 2), dense_layer(1, c1, 1)};
    strata_robust_update u[3] = {{la, 2}, {lb, 2}, {lc, 2}};

    double norms[3];
    CU_ASSERT_EQUAL_FATAL(strata_robust_norms(&layout, u, 3, norms, NULL), STRATA_OK);
    CU_ASSERT_EQUAL(norms[0], 5.0);
    CU_ASSERT_EQUAL(norms[1], 2.0);
    CU_ASSERT_EQUAL(norms[2], 10.0);

    strata_tensor_list out;
    /* Unclipped mean: ([0,3,0|4] + [0,2,0|0] + [6,0,0|8]) / 3 */
    CU_ASSERT_EQUAL_FATAL(run(&layout, u, 3, STRATA_ROBUST_TRIMMED_MEAN, 0.0, 0.0, &out),
                          STRATA_OK);
    const double raw0[3] = {2, 5.0 / 3.0, 0}, raw1[1] = {4};
    expect_values(&out, 0, raw0, 3, "unclipped mean t0");
    expect_values(&out, 1, raw1, 1, "unclipped mean t1");
    strata_tensor_list_cleanup(&out);
    /* Clipped at 5: the third becomes [3,0,0|4], the others stay. */
    CU_ASSERT_EQUAL_FATAL(run(&layout, u, 3, STRATA_ROBUST_TRIMMED_MEAN, 0.0, 5.0, &out),
                          STRATA_OK);
    const double clip0[3] = {1, 5.0 / 3.0, 0}, clip1[1] = {8.0 / 3.0};
    expect_values(&out, 0, clip0, 3, "clipped mean t0");
    expect_values(&out, 1, clip1, 1, "clipped mean t1");
    strata_tensor_list_cleanup(&out);
    /* Median, clipped at 2: scales 0.4, 1, 0.2: [0,1.2,0|1.6], [0,2,0|0],
     * [1.2,0,0|1.6] -> [0, 1.2, 0 | 1.6]. */
    CU_ASSERT_EQUAL_FATAL(run(&layout, u, 3, STRATA_ROBUST_MEDIAN, 0.0, 2.0, &out), STRATA_OK);
    const double med0[3] = {0, 3.0 * (2.0 / 5.0), 0}, med1[1] = {4.0 * (2.0 / 5.0)};
    expect_values(&out, 0, med0, 3, "clipped median t0");
    expect_values(&out, 1, med1, 1, "clipped median t1");
    strata_tensor_list_cleanup(&out);
    /* A bound above every norm changes nothing. */
    CU_ASSERT_EQUAL_FATAL(run(&layout, u, 3, STRATA_ROBUST_TRIMMED_MEAN, 0.0, 10.0, &out),
                          STRATA_OK);
    expect_values(&out, 0, raw0, 3, "clip at the largest norm");
    strata_tensor_list_cleanup(&out);
    strata_tensor_list_cleanup(&layout);
}

/* Missing coordinates of sparse updates count as 0; RANDK indices are
 * regenerated from the seed. */
static void test_sparse_dense_mixed(void)
{
    int64_t sizes[1] = {6};
    strata_tensor_list layout;
    make_vec_layout(&layout, sizes, 1);
    uint32_t ia[2] = {1, 4};
    float va[2] = {2, -1};
    float vb[6] = {1, 1, 1, 1, 1, 1};
    float vr[3] = {5, -5, 3};
    uint32_t ir[3];
    const uint64_t seed = 77;
    CU_ASSERT_EQUAL_FATAL(strata_randk_indices(seed, 6, 3, ir), STRATA_OK);
    float vd[6] = {-1, 4, 0.5f, 2, -3, 1};
    strata_clayer la = topk_layer(0, 6, ia, va, 2);
    strata_clayer lb = dense_layer(0, vb, 6);
    strata_clayer lr = {.layer_index = 0,
                        .comp = STRATA_COMP_RANDK,
                        .numel = 6,
                        .count = 3,
                        .values = vr,
                        .seed = seed};
    strata_clayer ld = dense_layer(0, vd, 6);
    strata_robust_update u[4] = {{&la, 1}, {&lb, 1}, {&lr, 1}, {&ld, 1}};

    /* The dense reference, by hand. */
    double dense[4][6] = {{0, 2, 0, 0, -1, 0}, {1, 1, 1, 1, 1, 1}, {0}, {-1, 4, 0.5, 2, -3, 1}};
    for (int j = 0; j < 3; j++)
        dense[2][ir[j]] = vr[j];
    double want_med[6], want_tm[6];
    for (int j = 0; j < 6; j++) {
        double c[4] = {dense[0][j], dense[1][j], dense[2][j], dense[3][j]};
        for (int a = 1; a < 4; a++) /* sort the column */
            for (int b = a; b > 0 && c[b - 1] > c[b]; b--) {
                double t = c[b];
                c[b] = c[b - 1];
                c[b - 1] = t;
            }
        want_med[j] = 0.5 * (c[1] + c[2]);
        want_tm[j] = 0.5 * (c[1] + c[2]); /* n = 4, trim 0.25: k = 1 */
    }
    strata_tensor_list out;
    CU_ASSERT_EQUAL_FATAL(run(&layout, u, 4, STRATA_ROBUST_MEDIAN, 0.0, 0.0, &out), STRATA_OK);
    expect_values(&out, 0, want_med, 6, "mixed median");
    strata_tensor_list_cleanup(&out);
    CU_ASSERT_EQUAL_FATAL(run(&layout, u, 4, STRATA_ROBUST_TRIMMED_MEAN, 0.25, 0.0, &out),
                          STRATA_OK);
    expect_values(&out, 0, want_tm, 6, "mixed trimmed mean");
    strata_tensor_list_cleanup(&out);
    /* Unweighted mean (trim 0) equals the average of the dense rows. */
    CU_ASSERT_EQUAL_FATAL(run(&layout, u, 4, STRATA_ROBUST_TRIMMED_MEAN, 0.0, 0.0, &out),
                          STRATA_OK);
    for (int j = 0; j < 6; j++) {
        double s = (dense[0][j] + dense[1][j] + dense[2][j] + dense[3][j]) / 4.0;
        CU_ASSERT_DOUBLE_EQUAL(out.items[0].data[j], s, 1e-6);
    }
    strata_tensor_list_cleanup(&out);
    strata_tensor_list_cleanup(&layout);
}

/* ---- 2. against a sort-based reference; order does not matter ---- */

typedef struct comp_spec {
    strata_compressor_id comp;
    strata_values_format vf;
    double density;
    uint32_t levels, rank;
} comp_spec;

static const comp_spec SPECS[] = {
    {.comp = STRATA_COMP_NONE},
    {.comp = STRATA_COMP_TOPK, .density = 0.3},
    {.comp = STRATA_COMP_RANDK, .density = 0.5},
    {.comp = STRATA_COMP_QSGD, .levels = 4},
    {.comp = STRATA_COMP_SIGN},
    {.comp = STRATA_COMP_POWERSGD, .rank = 2},
    {.comp = STRATA_COMP_FP16, .vf = STRATA_VALUES_FP16},
    {.comp = STRATA_COMP_TOPK, .vf = STRATA_VALUES_BF16, .density = 0.1},
};
#define NSPECS (sizeof(SPECS) / sizeof(SPECS[0]))

/* Compresses random data of the given scale for every tensor of layout;
 * the compressor of tensor i is SPECS[(i + shift) % NSPECS]. */
static strata_clayer *make_update(const strata_tensor_list *layout, size_t shift, double scale)
{
    strata_clayer *layers = calloc(layout->count, sizeof(*layers));
    CU_ASSERT_PTR_NOT_NULL_FATAL(layers);
    for (size_t i = 0; i < layout->count; i++) {
        const strata_tensor *t = &layout->items[i];
        const comp_spec *s = &SPECS[(i + shift) % NSPECS];
        float *a = malloc(t->numel * sizeof(float));
        CU_ASSERT_PTR_NOT_NULL_FATAL(a);
        for (size_t j = 0; j < t->numel; j++)
            a[j] = (float)(scale * (2.0 * uniform() - 1.0));
        strata_budget b = {
            .comp = s->comp, .density = s->density, .levels = s->levels, .rank = s->rank};
        strata_diag d = {{0}};
        int rc = strata_compress(a, t->numel, t->ndim, t->shape, &b, s->vf, next_u64(), NULL,
                                 &layers[i], &d);
        if (rc != STRATA_OK)
            fprintf(stderr, "compress: %s\n", strata_diag_msg(&d, rc));
        CU_ASSERT_EQUAL_FATAL(rc, STRATA_OK);
        layers[i].layer_index = (uint32_t)i;
        free(a);
    }
    return layers;
}

static int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The reference: decode densely, sort each column, take the statistic. */
static void reference(const strata_tensor_list *layout, const strata_robust_update *u, size_t n,
                      strata_robust_method method, double trim, double clip, double *out)
{
    const size_t total = strata_tensor_list_numel(layout);
    float *dense = malloc(n * total * sizeof(float));
    double *col = malloc(n * sizeof(double)), *scale = malloc(n * sizeof(double));
    CU_ASSERT_PTR_NOT_NULL_FATAL(dense);
    CU_ASSERT_PTR_NOT_NULL_FATAL(col);
    CU_ASSERT_PTR_NOT_NULL_FATAL(scale);
    for (size_t c = 0; c < n; c++) {
        size_t off = 0;
        double sq = 0.0;
        for (size_t i = 0; i < layout->count; i++) {
            float *row = dense + c * total + off;
            CU_ASSERT_EQUAL_FATAL(strata_clayer_decode(&u[c].layers[i], row, NULL), STRATA_OK);
            double layer_sq = 0.0; /* per layer, then summed: the same order */
            for (size_t j = 0; j < layout->items[i].numel; j++)
                layer_sq += (double)row[j] * (double)row[j];
            sq += layer_sq;
            off += layout->items[i].numel;
        }
        scale[c] = clip > 0.0 && sqrt(sq) > clip ? clip / sqrt(sq) : 1.0;
    }
    const size_t k = method == STRATA_ROBUST_TRIMMED_MEAN ? (size_t)floor(trim * (double)n) : 0;
    for (size_t j = 0; j < total; j++) {
        for (size_t c = 0; c < n; c++)
            col[c] = scale[c] * (double)dense[c * total + j];
        qsort(col, n, sizeof(double), cmp_double);
        if (method == STRATA_ROBUST_MEDIAN) {
            out[j] = n % 2 ? col[n / 2] : 0.5 * (col[n / 2 - 1] + col[n / 2]);
        } else {
            double s = 0.0;
            for (size_t c = k; c < n - k; c++)
                s += col[c];
            out[j] = s / (double)(n - 2 * k);
        }
    }
    free(dense);
    free(col);
    free(scale);
}

/* Compares out with the reference; the median must match exactly, the
 * trimmed mean up to the order of its sum. Returns the largest error. */
static double compare(const strata_tensor_list *out, const double *ref)
{
    double worst = 0.0;
    size_t off = 0;
    for (size_t i = 0; i < out->count; i++) {
        for (size_t j = 0; j < out->items[i].numel; j++) {
            const double e = fabs((double)out->items[i].data[j] - (double)(float)ref[off + j]);
            const double tol = 1e-6 * (1.0 + fabs(ref[off + j]));
            worst = e / tol > worst ? e / tol : worst;
        }
        off += out->items[i].numel;
    }
    return worst;
}

static void test_reference_and_permutation(void)
{
    static const struct {
        int64_t rows, cols; /* a matrix so that PowerSGD applies */
    } shapes[] = {{8, 12}, {5, 1}, {16, 16}, {3, 7}};
    strata_tensor_list layout;
    strata_tensor_list_init(&layout);
    for (size_t i = 0; i < sizeof(shapes) / sizeof(shapes[0]); i++) {
        char name[32];
        snprintf(name, sizeof(name), "m%zu", i);
        int64_t s[2] = {shapes[i].rows, shapes[i].cols};
        CU_ASSERT_EQUAL_FATAL(strata_tensor_list_add(&layout, name, 2, s, NULL), STRATA_OK);
    }
    const size_t nl = layout.count, total = strata_tensor_list_numel(&layout);
    /* 41 updates: above the insertion-sort cut-off, many ties (sparse zeros,
     * SIGN's +-scale), some large. */
    enum { N = 41 };
    strata_clayer *layers[N];
    strata_robust_update u[N], p[N];
    for (size_t c = 0; c < N; c++) {
        layers[c] = make_update(&layout, c, c % 10 == 3 ? 50.0 : 1.0);
        u[c] = (strata_robust_update){layers[c], nl};
        p[c] = u[c];
    }
    for (size_t c = N - 1; c > 0; c--) {
        size_t r = (size_t)(next_u64() % (c + 1));
        strata_robust_update t = p[c];
        p[c] = p[r];
        p[r] = t;
    }
    double *ref = malloc(total * sizeof(double));
    CU_ASSERT_PTR_NOT_NULL_FATAL(ref);
    static const struct {
        strata_robust_method method;
        double trim, clip;
        size_t n;
    } cases[] = {
        {STRATA_ROBUST_MEDIAN, 0.0, 0.0, N},       {STRATA_ROBUST_MEDIAN, 0.0, 0.0, N - 1},
        {STRATA_ROBUST_MEDIAN, 0.0, 3.0, N},       {STRATA_ROBUST_TRIMMED_MEAN, 0.1, 0.0, N},
        {STRATA_ROBUST_TRIMMED_MEAN, 0.0, 0.0, N}, {STRATA_ROBUST_TRIMMED_MEAN, 0.45, 2.0, N - 1},
        {STRATA_ROBUST_MEDIAN, 0.0, 0.0, 2},       {STRATA_ROBUST_TRIMMED_MEAN, 0.2, 0.0, 17},
    };
    for (size_t t = 0; t < sizeof(cases) / sizeof(cases[0]); t++) {
        strata_tensor_list a, b;
        CU_ASSERT_EQUAL_FATAL(
            run(&layout, u, cases[t].n, cases[t].method, cases[t].trim, cases[t].clip, &a),
            STRATA_OK);
        reference(&layout, u, cases[t].n, cases[t].method, cases[t].trim, cases[t].clip, ref);
        const double err = compare(&a, ref);
        if (err > (cases[t].method == STRATA_ROBUST_MEDIAN ? 0.0 : 1.0)) {
            fprintf(stderr, "case %zu (%s): error %.3g of the tolerance\n", t,
                    strata_robust_name(cases[t].method), err);
            CU_FAIL("robust aggregate differs from the sort-based reference");
        }
        /* Same updates, shuffled (for the full set). */
        if (cases[t].n == N) {
            CU_ASSERT_EQUAL_FATAL(
                run(&layout, p, N, cases[t].method, cases[t].trim, cases[t].clip, &b), STRATA_OK);
            const double perr = compare(&b, ref);
            if (perr > (cases[t].method == STRATA_ROBUST_MEDIAN ? 0.0 : 1.0)) {
                fprintf(stderr, "case %zu (%s) shuffled: error %.3g\n", t,
                        strata_robust_name(cases[t].method), perr);
                CU_FAIL("robust aggregate depends on the order of the updates");
            }
            strata_tensor_list_cleanup(&b);
        }
        strata_tensor_list_cleanup(&a);
    }
    /* The norms match the decoded updates and strata_agg_add_clipped. */
    double norms[N];
    CU_ASSERT_EQUAL_FATAL(strata_robust_norms(&layout, u, N, norms, NULL), STRATA_OK);
    strata_agg *agg = NULL;
    CU_ASSERT_EQUAL_FATAL(strata_agg_new(&layout, &agg), STRATA_OK);
    for (size_t c = 0; c < N; c++) {
        double n2 = -1.0;
        CU_ASSERT_EQUAL(strata_agg_add_clipped(agg, layers[c], nl, 1.0, 0.0, &n2, NULL), STRATA_OK);
        CU_ASSERT_EQUAL(n2, norms[c]);
    }
    strata_agg_free(agg);
    free(ref);
    for (size_t c = 0; c < N; c++)
        strata_clayers_free(layers[c], nl);
    strata_tensor_list_cleanup(&layout);
}

/* Columns that are sorted, reversed, constant or two-valued, for 200
 * updates: the selection's worst cases must still give exact answers. */
static void test_selection_patterns(void)
{
    enum { N = 200, M = 6 };
    int64_t sizes[1] = {M};
    strata_tensor_list layout;
    make_vec_layout(&layout, sizes, 1);
    float *v = malloc(N * M * sizeof(float));
    strata_clayer *l = malloc(N * sizeof(*l));
    strata_robust_update *u = malloc(N * sizeof(*u));
    CU_ASSERT_PTR_NOT_NULL_FATAL(v);
    CU_ASSERT_PTR_NOT_NULL_FATAL(l);
    CU_ASSERT_PTR_NOT_NULL_FATAL(u);
    for (int c = 0; c < N; c++) {
        float *r = v + c * M;
        r[0] = (float)c;                                  /* ascending */
        r[1] = (float)(N - c);                            /* descending */
        r[2] = 0.25f;                                     /* constant */
        r[3] = c % 2 ? 1.0f : -1.0f;                      /* two values */
        r[4] = (float)((c * 37) % N);                     /* a permutation */
        r[5] = c < N / 2 ? (float)(N / 2 - c) : (float)c; /* organ pipe */
        l[c] = dense_layer(0, r, M);
        u[c] = (strata_robust_update){&l[c], 1};
    }
    double ref[M];
    strata_tensor_list out;
    for (int m = 0; m < 2; m++) {
        const strata_robust_method method = m ? STRATA_ROBUST_TRIMMED_MEAN : STRATA_ROBUST_MEDIAN;
        CU_ASSERT_EQUAL_FATAL(run(&layout, u, N, method, 0.1, 0.0, &out), STRATA_OK);
        reference(&layout, u, N, method, 0.1, 0.0, ref);
        CU_ASSERT(compare(&out, ref) <= (m ? 1.0 : 0.0));
        strata_tensor_list_cleanup(&out);
    }
    free(v);
    free(l);
    free(u);
    strata_tensor_list_cleanup(&layout);
}

/* A layer large enough for the OpenMP path (and a partial last tile) gives
 * the same result on 1 and 3 threads, equal to the reference. */
static void test_threads_agree(void)
{
    int64_t sizes[2] = {4001, 7};
    strata_tensor_list layout;
    make_vec_layout(&layout, sizes, 2);
    const size_t total = strata_tensor_list_numel(&layout);
    enum { N = 24 };
    strata_clayer *layers[N];
    strata_robust_update u[N];
    for (size_t c = 0; c < N; c++) {
        layers[c] = make_update(&layout, c, 1.0);
        u[c] = (strata_robust_update){layers[c], layout.count};
    }
    double *ref = malloc(total * sizeof(double));
    CU_ASSERT_PTR_NOT_NULL_FATAL(ref);
    const int threads0 = omp_get_max_threads();
    for (int m = 0; m < 2; m++) {
        const strata_robust_method method = m ? STRATA_ROBUST_TRIMMED_MEAN : STRATA_ROBUST_MEDIAN;
        strata_tensor_list one, three;
        omp_set_num_threads(1);
        CU_ASSERT_EQUAL_FATAL(run(&layout, u, N, method, 0.2, 4.0, &one), STRATA_OK);
        omp_set_num_threads(3);
        CU_ASSERT_EQUAL_FATAL(run(&layout, u, N, method, 0.2, 4.0, &three), STRATA_OK);
        reference(&layout, u, N, method, 0.2, 4.0, ref);
        CU_ASSERT(compare(&one, ref) <= (m ? 1.0 : 0.0));
        for (size_t i = 0; i < layout.count; i++)
            CU_ASSERT_EQUAL(memcmp(one.items[i].data, three.items[i].data,
                                   layout.items[i].numel * sizeof(float)),
                            0);
        strata_tensor_list_cleanup(&one);
        strata_tensor_list_cleanup(&three);
    }
    omp_set_num_threads(threads0);
    free(ref);
    for (size_t c = 0; c < N; c++)
        strata_clayers_free(layers[c], layout.count);
    strata_tensor_list_cleanup(&layout);
}

/* ---- 3. errors change nothing ---- */

static void test_errors_leave_output(void)
{
    int64_t sizes[2] = {4, 2};
    strata_tensor_list layout;
    make_vec_layout(&layout, sizes, 2);
    float a0[4] = {1, 2, 3, 4}, a1[2] = {5, 6}, b0[4] = {0, 0, 1, 1}, b1[2] = {2, 2};
    float bad_nan[4] = {1, NAN, 0, 0};
    uint32_t bad_idx[2] = {3, 1};
    float tv[2] = {1, 1};
    strata_clayer la[2] = {dense_layer(0, a0, 4), dense_layer(1, a1, 2)};
    strata_clayer lb[2] = {dense_layer(0, b0, 4), dense_layer(1, b1, 2)};
    strata_clayer l_numel[2] = {dense_layer(0, a0, 3), dense_layer(1, a1, 2)};
    strata_clayer l_index[2] = {dense_layer(0, a0, 4), dense_layer(0, a1, 2)};
    strata_clayer l_nan[2] = {dense_layer(0, bad_nan, 4), dense_layer(1, a1, 2)};
    strata_clayer l_order[2] = {topk_layer(0, 4, bad_idx, tv, 2), dense_layer(1, a1, 2)};
    strata_robust_update good[2] = {{la, 2}, {lb, 2}};

    strata_tensor_list out, other;
    strata_tensor_list_init(&out);
    CU_ASSERT_EQUAL_FATAL(strata_tensor_list_zeros_like(&out, &layout), STRATA_OK);
    int64_t s3[1] = {3};
    strata_tensor_list_init(&other);
    CU_ASSERT_EQUAL_FATAL(strata_tensor_list_add(&other, "t0", 1, s3, NULL), STRATA_OK);
    CU_ASSERT_EQUAL_FATAL(strata_tensor_list_add(&other, "t1", 1, &sizes[1], NULL), STRATA_OK);

    const strata_robust_method TM = STRATA_ROBUST_TRIMMED_MEAN, MED = STRATA_ROBUST_MEDIAN;
    struct {
        const char *label;
        strata_clayer *second; /* replaces update 1's layers; NULL keeps them */
        size_t second_n;
        size_t n;
        int method;
        double trim, clip;
        int wrong_output;
        int want;
    } cases[] = {
        {"trim negative", NULL, 2, 2, TM, -0.1, 0.0, 0, STRATA_EINVAL},
        {"trim 0.5", NULL, 2, 2, TM, 0.5, 0.0, 0, STRATA_EINVAL},
        {"trim NaN", NULL, 2, 2, TM, NAN, 0.0, 0, STRATA_EINVAL},
        {"clip negative", NULL, 2, 2, MED, 0.0, -1.0, 0, STRATA_EINVAL},
        {"clip NaN", NULL, 2, 2, MED, 0.0, NAN, 0, STRATA_EINVAL},
        {"fedavg is not robust", NULL, 2, 2, STRATA_ROBUST_FEDAVG, 0.0, 0.0, 0, STRATA_EINVAL},
        {"unknown method", NULL, 2, 2, 9, 0.0, 0.0, 0, STRATA_EINVAL},
        {"no updates (median)", NULL, 2, 0, MED, 0.0, 0.0, 0, STRATA_EINVAL},
        {"no updates (trimmed)", NULL, 2, 0, TM, 0.2, 0.0, 0, STRATA_EINVAL},
        {"output layout", NULL, 2, 2, MED, 0.0, 0.0, 1, STRATA_EINVAL},
        {"too few layers", lb, 1, 2, MED, 0.0, 0.0, 0, STRATA_EPROTO},
        {"layer numel", l_numel, 2, 2, MED, 0.0, 0.0, 0, STRATA_EPROTO},
        {"layer index", l_index, 2, 2, TM, 0.0, 0.0, 0, STRATA_EPROTO},
        {"NaN value", l_nan, 2, 2, TM, 0.0, 0.0, 0, STRATA_EPROTO},
        {"NaN value, clipped", l_nan, 2, 2, TM, 0.0, 1.0, 0, STRATA_EPROTO},
        {"topk order", l_order, 2, 2, MED, 0.0, 0.0, 0, STRATA_EPROTO},
    };
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        strata_robust_update u[2] = {good[0], good[1]};
        if (cases[c].second != NULL)
            u[1] = (strata_robust_update){cases[c].second, cases[c].second_n};
        strata_tensor_list *dst = cases[c].wrong_output ? &other : &out;
        fill(dst, 42.0f);
        strata_diag d = {{0}};
        int rc =
            strata_robust_aggregate(&layout, u, cases[c].n, (strata_robust_method)cases[c].method,
                                    cases[c].trim, cases[c].clip, dst, &d);
        if (rc != cases[c].want || d.msg[0] == '\0') {
            fprintf(stderr, "%s: rc %d (want %d), message \"%s\"\n", cases[c].label, rc,
                    cases[c].want, d.msg);
            CU_FAIL("a bad input was not rejected with a message");
        }
        if (cases[c].want == STRATA_EPROTO && strstr(d.msg, "update 1") == NULL) {
            fprintf(stderr, "%s: message \"%s\" does not name update 1\n", cases[c].label, d.msg);
            CU_FAIL("the message does not name the update");
        }
        for (size_t i = 0; i < dst->count; i++)
            for (size_t j = 0; j < dst->items[i].numel; j++)
                if (dst->items[i].data[j] != 42.0f) {
                    fprintf(stderr, "%s: output changed\n", cases[c].label);
                    CU_FAIL("a failed aggregation changed its output");
                    i = dst->count;
                    break;
                }
    }
    /* NULL arguments. */
    CU_ASSERT_EQUAL(strata_robust_aggregate(NULL, good, 2, MED, 0.0, 0.0, &out, NULL),
                    STRATA_EINVAL);
    CU_ASSERT_EQUAL(strata_robust_aggregate(&layout, NULL, 2, MED, 0.0, 0.0, &out, NULL),
                    STRATA_EINVAL);
    CU_ASSERT_EQUAL(strata_robust_aggregate(&layout, good, 2, MED, 0.0, 0.0, NULL, NULL),
                    STRATA_EINVAL);
    double norms[2] = {7, 7};
    strata_robust_update bad[2] = {good[0], {l_nan, 2}};
    CU_ASSERT_EQUAL(strata_robust_norms(&layout, bad, 2, norms, NULL), STRATA_EPROTO);
    CU_ASSERT(norms[0] == 0.0 && norms[1] == 0.0);
    CU_ASSERT_EQUAL(strata_robust_norms(&layout, good, 2, NULL, NULL), STRATA_EINVAL);
    /* The inputs still work. */
    CU_ASSERT_EQUAL(strata_robust_aggregate(&layout, good, 2, MED, 0.0, 0.0, &out, NULL),
                    STRATA_OK);
    CU_ASSERT_EQUAL(out.items[0].data[0], 0.5f);
    CU_ASSERT_EQUAL(out.items[1].data[1], 4.0f);

    strata_tensor_list_cleanup(&other);
    strata_tensor_list_cleanup(&out);
    strata_tensor_list_cleanup(&layout);
}

static void test_parse_and_check(void)
{
    static const struct {
        const char *name;
        strata_robust_method m;
    } names[] = {{"fedavg", STRATA_ROBUST_FEDAVG},
                 {"trimmed-mean", STRATA_ROBUST_TRIMMED_MEAN},
                 {"median", STRATA_ROBUST_MEDIAN}};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        strata_robust_method m = (strata_robust_method)7;
        CU_ASSERT_EQUAL(strata_robust_parse(names[i].name, &m, NULL), STRATA_OK);
        CU_ASSERT_EQUAL(m, names[i].m);
        CU_ASSERT_STRING_EQUAL(strata_robust_name(m), names[i].name);
    }
    strata_robust_method m = STRATA_ROBUST_MEDIAN;
    strata_diag d = {{0}};
    CU_ASSERT_EQUAL(strata_robust_parse("trimmed_mean", &m, &d), STRATA_EINVAL);
    CU_ASSERT(strstr(d.msg, "trimmed-mean") != NULL);
    CU_ASSERT_EQUAL(m, STRATA_ROBUST_MEDIAN);
    CU_ASSERT_EQUAL(strata_robust_parse(NULL, &m, NULL), STRATA_EINVAL);
    CU_ASSERT_STRING_EQUAL(strata_robust_name((strata_robust_method)5), "?");
    CU_ASSERT_EQUAL(strata_robust_check(STRATA_ROBUST_FEDAVG, 0.0, 0.0, NULL), STRATA_OK);
    CU_ASSERT_EQUAL(strata_robust_check(STRATA_ROBUST_TRIMMED_MEAN, 0.1, 2.5, NULL), STRATA_OK);
    CU_ASSERT_EQUAL(strata_robust_check(STRATA_ROBUST_MEDIAN, 0.0, INFINITY, NULL), STRATA_OK);
    CU_ASSERT_EQUAL(strata_robust_check(STRATA_ROBUST_TRIMMED_MEAN, 0.5, 0.0, NULL), STRATA_EINVAL);
    CU_ASSERT_EQUAL(strata_robust_check(STRATA_ROBUST_MEDIAN, 0.0, -2.0, NULL), STRATA_EINVAL);
    CU_ASSERT_EQUAL(strata_robust_check((strata_robust_method)3, 0.0, 0.0, NULL), STRATA_EINVAL);
}

int main(void)
{
    CU_TestInfo hand[] = {
        {"median of odd and even counts", test_median_odd_even},
        {"trimmed mean", test_trimmed_mean},
        {"clipping at, below and above the bound", test_clipping},
        {"sparse and dense updates mixed", test_sparse_dense_mixed},
        CU_TEST_INFO_NULL,
    };
    CU_TestInfo ref[] = {
        {"matches a sort-based reference in any order", test_reference_and_permutation},
        {"selection worst cases", test_selection_patterns},
        {"one thread and three agree", test_threads_agree},
        CU_TEST_INFO_NULL,
    };
    CU_TestInfo errors[] = {
        {"errors leave the output unchanged", test_errors_leave_output},
        {"names and configuration checks", test_parse_and_check},
        CU_TEST_INFO_NULL,
    };
    CU_SuiteInfo suites[] = {
        {"robust: hand computed", NULL, NULL, NULL, NULL, hand},
        {"robust: reference", NULL, NULL, NULL, NULL, ref},
        {"robust: errors", NULL, NULL, NULL, NULL, errors},
        CU_SUITE_INFO_NULL,
    };
    return strata_test_run(suites);
}
