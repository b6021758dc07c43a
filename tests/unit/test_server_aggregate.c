/* Streaming FedAvg and server optimisers (server/core/aggregate.h). */
#include "aggregate.h"
#include "strata/compress.h"
#include "test_util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 33))
#include <malloc.h>
#define HAVE_MALLINFO2 1
#endif

/* ---- helpers ---- */

static uint64_t rng_state = 0x9E3779B97F4A7C15ULL;

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

/* A small CNN-like layout: two matrices, two vectors, one 3-D tensor. */
static void make_layout(strata_tensor_list *l)
{
    static const struct {
        const char *name;
        int ndim;
        int64_t shape[3];
    } t[] = {
        {"conv.weight", 3, {6, 4, 3}}, {"conv.bias", 1, {6}},       {"fc1.weight", 2, {16, 24}},
        {"fc1.bias", 1, {16}},         {"fc2.weight", 2, {10, 16}},
    };
    strata_tensor_list_init(l);
    for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++)
        CU_ASSERT_EQUAL_FATAL(strata_tensor_list_add(l, t[i].name, t[i].ndim, t[i].shape, NULL),
                              STRATA_OK);
}

typedef struct comp_spec {
    strata_compressor_id comp;
    strata_values_format vf;
    double density;
    uint32_t levels, rank;
} comp_spec;

/* Compresses fresh random data for every tensor of layout into a new array
 * of layers; specs[i % nspecs] (offset by `shift`) picks each compressor. */
static strata_clayer *make_update(const strata_tensor_list *layout, const comp_spec *specs,
                                  size_t nspecs, size_t shift)
{
    strata_clayer *layers = calloc(layout->count, sizeof(*layers));
    CU_ASSERT_PTR_NOT_NULL_FATAL(layers);
    for (size_t i = 0; i < layout->count; i++) {
        const strata_tensor *t = &layout->items[i];
        const comp_spec *s = &specs[(i + shift) % nspecs];
        float *a = malloc(t->numel * sizeof(float));
        CU_ASSERT_PTR_NOT_NULL_FATAL(a);
        for (size_t j = 0; j < t->numel; j++)
            a[j] = (float)(2.0 * uniform() - 1.0);
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

/* The mean of agg as a fresh list shaped like layout. */
static void agg_mean_list(const strata_agg *agg, const strata_tensor_list *layout,
                          strata_tensor_list *out)
{
    strata_tensor_list_init(out);
    CU_ASSERT_EQUAL_FATAL(strata_tensor_list_zeros_like(out, layout), STRATA_OK);
    strata_diag d = {{0}};
    int rc = strata_agg_mean(agg, out, &d);
    if (rc != STRATA_OK)
        fprintf(stderr, "mean: %s\n", strata_diag_msg(&d, rc));
    CU_ASSERT_EQUAL_FATAL(rc, STRATA_OK);
}

static int lists_identical(const strata_tensor_list *a, const strata_tensor_list *b)
{
    if (a->count != b->count)
        return 0;
    for (size_t i = 0; i < a->count; i++)
        if (a->items[i].numel != b->items[i].numel ||
            memcmp(a->items[i].data, b->items[i].data, a->items[i].numel * sizeof(float)) != 0)
            return 0;
    return 1;
}

/* ---- 1. the streaming mean equals the directly computed weighted mean ---- */

#define NCLIENTS 7

static void check_mean_case(const char *label, const comp_spec *specs, size_t nspecs)
{
    strata_tensor_list layout;
    make_layout(&layout);
    const size_t nl = layout.count;
    strata_clayer *upd[NCLIENTS];
    double w[NCLIENTS];
    for (int c = 0; c < NCLIENTS; c++) {
        upd[c] = make_update(&layout, specs, nspecs, (size_t)c);
        w[c] = 1.0 + floor(999.0 * uniform()); /* sample counts */
    }

    /* Reference: decode every update and average directly in double. */
    const size_t total = strata_tensor_list_numel(&layout);
    double *ref = calloc(total, sizeof(double));
    float *dense = malloc(total * sizeof(float));
    CU_ASSERT_PTR_NOT_NULL_FATAL(ref);
    CU_ASSERT_PTR_NOT_NULL_FATAL(dense);
    double wsum = 0.0;
    for (int c = 0; c < NCLIENTS; c++) {
        size_t off = 0;
        for (size_t i = 0; i < nl; i++) {
            CU_ASSERT_EQUAL_FATAL(strata_clayer_decode(&upd[c][i], dense + off, NULL), STRATA_OK);
            off += layout.items[i].numel;
        }
        for (size_t j = 0; j < total; j++)
            ref[j] += w[c] * (double)dense[j];
        wsum += w[c];
    }

    /* Streaming, in order, then in a shuffled order. */
    strata_agg *a1 = NULL, *a2 = NULL;
    CU_ASSERT_EQUAL_FATAL(strata_agg_new(&layout, &a1), STRATA_OK);
    CU_ASSERT_EQUAL_FATAL(strata_agg_new(&layout, &a2), STRATA_OK);
    int perm[NCLIENTS];
    for (int c = 0; c < NCLIENTS; c++)
        perm[c] = c;
    for (int c = NCLIENTS - 1; c > 0; c--) {
        int r = (int)(next_u64() % (uint64_t)(c + 1)), t = perm[c];
        perm[c] = perm[r];
        perm[r] = t;
    }
    for (int c = 0; c < NCLIENTS; c++) {
        strata_diag d = {{0}};
        int rc = strata_agg_add(a1, upd[c], nl, w[c], &d);
        if (rc != STRATA_OK)
            fprintf(stderr, "%s: add: %s\n", label, strata_diag_msg(&d, rc));
        CU_ASSERT_EQUAL(rc, STRATA_OK);
        CU_ASSERT_EQUAL(strata_agg_add(a2, upd[perm[c]], nl, w[perm[c]], NULL), STRATA_OK);
    }
    CU_ASSERT_EQUAL(strata_agg_count(a1), NCLIENTS);
    CU_ASSERT_DOUBLE_EQUAL(strata_agg_total_weight(a1), wsum, 1e-9);
    CU_ASSERT_EQUAL(strata_agg_total_weight(a1), strata_agg_total_weight(a2));

    strata_tensor_list m1, m2;
    agg_mean_list(a1, &layout, &m1);
    agg_mean_list(a2, &layout, &m2);
    double maxerr = 0.0, maxperm = 0.0;
    size_t off = 0;
    for (size_t i = 0; i < nl; i++) {
        for (size_t j = 0; j < layout.items[i].numel; j++) {
            double e = fabs((double)m1.items[i].data[j] - ref[off + j] / wsum);
            double p = fabs((double)m1.items[i].data[j] - (double)m2.items[i].data[j]);
            maxerr = e > maxerr ? e : maxerr;
            maxperm = p > maxperm ? p : maxperm;
        }
        off += layout.items[i].numel;
    }
    if (maxerr > 1e-6 || maxperm > 1e-12) {
        fprintf(stderr, "%s: max error %.3g vs direct mean, %.3g between orders\n", label, maxerr,
                maxperm);
        CU_FAIL("streaming mean differs from the direct weighted mean");
    }

    strata_tensor_list_cleanup(&m1);
    strata_tensor_list_cleanup(&m2);
    strata_agg_free(a1);
    strata_agg_free(a2);
    for (int c = 0; c < NCLIENTS; c++)
        strata_clayers_free(upd[c], nl);
    free(ref);
    free(dense);
    strata_tensor_list_cleanup(&layout);
}

static const comp_spec SPEC_NONE = {.comp = STRATA_COMP_NONE};
static const comp_spec SPEC_FP16 = {.comp = STRATA_COMP_FP16, .vf = STRATA_VALUES_FP16};
static const comp_spec SPEC_TOPK = {.comp = STRATA_COMP_TOPK, .density = 0.1};
static const comp_spec SPEC_RANDK = {.comp = STRATA_COMP_RANDK, .density = 0.2};
static const comp_spec SPEC_QSGD = {.comp = STRATA_COMP_QSGD, .levels = 8};
static const comp_spec SPEC_SIGN = {.comp = STRATA_COMP_SIGN};
static const comp_spec SPEC_PSGD = {.comp = STRATA_COMP_POWERSGD, .rank = 2};

static void test_mean_matches_direct(void)
{
    static const struct {
        const char *label;
        const comp_spec *spec;
    } cases[] = {
        {"none", &SPEC_NONE},     {"fp16", &SPEC_FP16}, {"topk", &SPEC_TOPK},
        {"randk", &SPEC_RANDK},   {"qsgd", &SPEC_QSGD}, {"sign", &SPEC_SIGN},
        {"powersgd", &SPEC_PSGD},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        check_mean_case(cases[i].label, cases[i].spec, 1);

    /* A mix: every client uses a different compressor on every layer,
     * including bf16-rounded sparse values and a bf16 dense layer. */
    const comp_spec mix[] = {
        SPEC_NONE,
        SPEC_TOPK,
        SPEC_RANDK,
        SPEC_QSGD,
        SPEC_SIGN,
        SPEC_PSGD,
        SPEC_FP16,
        {.comp = STRATA_COMP_TOPK, .vf = STRATA_VALUES_BF16, .density = 0.05},
        {.comp = STRATA_COMP_BF16, .vf = STRATA_VALUES_BF16},
        {.comp = STRATA_COMP_RANDK, .vf = STRATA_VALUES_FP16, .density = 1.0},
    };
    check_mean_case("mix", mix, sizeof(mix) / sizeof(mix[0]));
}

/* Sparse updates average with zeros where a client sent nothing. */
static void test_sparse_hand_computed(void)
{
    strata_tensor_list layout;
    int64_t s[1] = {4};
    strata_tensor_list_init(&layout);
    CU_ASSERT_EQUAL_FATAL(strata_tensor_list_add(&layout, "w", 1, s, NULL), STRATA_OK);
    uint32_t i1[2] = {0, 2}, i2[1] = {2};
    float v1[2] = {1.0f, 2.0f}, v2[1] = {-4.0f}, v3[4] = {0.5f, 0.5f, 0.5f, 0.5f};
    strata_clayer c1 = {
        .comp = STRATA_COMP_TOPK, .numel = 4, .count = 2, .indices = i1, .values = v1};
    strata_clayer c2 = {
        .comp = STRATA_COMP_TOPK, .numel = 4, .count = 1, .indices = i2, .values = v2};
    strata_clayer c3 = {.comp = STRATA_COMP_NONE, .numel = 4, .count = 4, .values = v3};
    strata_agg *agg = NULL;
    CU_ASSERT_EQUAL_FATAL(strata_agg_new(&layout, &agg), STRATA_OK);
    CU_ASSERT_EQUAL(strata_agg_add(agg, &c1, 1, 1.0, NULL), STRATA_OK);
    CU_ASSERT_EQUAL(strata_agg_add(agg, &c2, 1, 2.0, NULL), STRATA_OK);
    CU_ASSERT_EQUAL(strata_agg_add(agg, &c3, 1, 1.0, NULL), STRATA_OK);
    strata_tensor_list m;
    agg_mean_list(agg, &layout, &m);
    /* (1*[1,0,2,0] + 2*[0,0,-4,0] + 1*[.5,.5,.5,.5]) / 4 */
    const float want[4] = {0.375f, 0.125f, -1.375f, 0.125f};
    for (int j = 0; j < 4; j++)
        CU_ASSERT_EQUAL(m.items[0].data[j], want[j]);

    /* Reset forgets everything; the mean of nothing is a state error. */
    strata_agg_reset(agg);
    CU_ASSERT_EQUAL(strata_agg_count(agg), 0);
    CU_ASSERT_EQUAL(strata_agg_total_weight(agg), 0.0);
    strata_diag d = {{0}};
    CU_ASSERT_EQUAL(strata_agg_mean(agg, &m, &d), STRATA_ESTATE);
    CU_ASSERT(d.msg[0] != '\0');
    CU_ASSERT_EQUAL(strata_agg_add(agg, &c2, 1, 3.0, NULL), STRATA_OK);
    CU_ASSERT_EQUAL(strata_agg_mean(agg, &m, NULL), STRATA_OK);
    CU_ASSERT_EQUAL(m.items[0].data[2], -4.0f);
    CU_ASSERT_EQUAL(m.items[0].data[0], 0.0f);

    /* A mean output with another layout is refused. */
    strata_tensor_list other;
    strata_tensor_list_init(&other);
    int64_t s5[1] = {5};
    CU_ASSERT_EQUAL_FATAL(strata_tensor_list_add(&other, "w", 1, s5, NULL), STRATA_OK);
    d.msg[0] = '\0';
    CU_ASSERT_EQUAL(strata_agg_mean(agg, &other, &d), STRATA_EINVAL);
    CU_ASSERT(d.msg[0] != '\0');

    strata_tensor_list_cleanup(&other);
    strata_tensor_list_cleanup(&m);
    strata_agg_free(agg);
    strata_tensor_list_cleanup(&layout);
}

/* ---- 2. rejected updates change nothing ---- */

enum mutation {
    MUT_TOO_FEW_LAYERS,
    MUT_TOO_MANY_LAYERS,
    MUT_NUMEL,
    MUT_LAYER_INDEX,
    MUT_INDEX_RANGE,
    MUT_INDEX_ORDER,
    MUT_NAN_VALUE_DENSE,
    MUT_NAN_VALUE_SPARSE,
    MUT_INF_VALUE_RANDK,
    MUT_RANDK_COUNT,
    MUT_QSGD_LEVEL,
    MUT_FP16_UNREPRESENTABLE,
    MUT_WEIGHT_ZERO,
    MUT_WEIGHT_NEGATIVE,
    MUT_WEIGHT_NAN,
    MUT_WEIGHT_INF,
    MUT_COUNT
};

static void test_rejected_updates_change_nothing(void)
{
    strata_tensor_list layout;
    make_layout(&layout);
    const size_t nl = layout.count;
    /* Layer kinds: 0 TOPK, 1 NONE, 2 RANDK, 3 QSGD, 4 TOPK (fp16 values):
     * the faults below sit in later layers, after valid ones. */
    const comp_spec specs[] = {
        SPEC_TOPK,
        SPEC_NONE,
        SPEC_RANDK,
        SPEC_QSGD,
        {.comp = STRATA_COMP_TOPK, .vf = STRATA_VALUES_FP16, .density = 0.1},
    };
    strata_agg *agg = NULL;
    CU_ASSERT_EQUAL_FATAL(strata_agg_new(&layout, &agg), STRATA_OK);
    for (int c = 0; c < 3; c++) {
        strata_clayer *u = make_update(&layout, specs, 5, 0);
        CU_ASSERT_EQUAL(strata_agg_add(agg, u, nl, 10.0 + c, NULL), STRATA_OK);
        strata_clayers_free(u, nl);
    }
    strata_tensor_list before;
    agg_mean_list(agg, &layout, &before);
    const double wbefore = strata_agg_total_weight(agg);

    for (int m = 0; m < MUT_COUNT; m++) {
        strata_clayer *u = make_update(&layout, specs, 5, 0);
        size_t n = nl;
        double weight = 5.0;
        int want = STRATA_EPROTO;
        strata_clayer extra[6];
        uint32_t keep_u32 = 0;
        switch (m) {
        case MUT_TOO_FEW_LAYERS:
            n = nl - 1;
            break;
        case MUT_TOO_MANY_LAYERS:
            memcpy(extra, u, nl * sizeof(*u));
            extra[nl] = u[0];
            break;
        case MUT_NUMEL:
            u[1].numel += 1;
            break;
        case MUT_LAYER_INDEX:
            u[2].layer_index = 1;
            break;
        case MUT_INDEX_RANGE:
            u[4].indices[u[4].count - 1] = (uint32_t)u[4].numel;
            break;
        case MUT_INDEX_ORDER:
            keep_u32 = u[4].indices[0];
            u[4].indices[0] = u[4].indices[1];
            u[4].indices[1] = keep_u32;
            break;
        case MUT_NAN_VALUE_DENSE:
            u[1].values[3] = NAN;
            break;
        case MUT_NAN_VALUE_SPARSE:
            u[4].values[u[4].count - 1] = NAN;
            break;
        case MUT_INF_VALUE_RANDK:
            u[2].values[0] = INFINITY;
            break;
        case MUT_RANDK_COUNT:
            u[2].count = u[2].numel + 1;
            break;
        case MUT_QSGD_LEVEL:
            u[3].qlevels[7] = (int8_t)(u[3].levels + 1);
            break;
        case MUT_FP16_UNREPRESENTABLE:
            u[4].values[0] = 1.0f + 0x1p-20f;
            break;
        case MUT_WEIGHT_ZERO:
            weight = 0.0;
            want = STRATA_EINVAL;
            break;
        case MUT_WEIGHT_NEGATIVE:
            weight = -3.0;
            want = STRATA_EINVAL;
            break;
        case MUT_WEIGHT_NAN:
            weight = NAN;
            want = STRATA_EINVAL;
            break;
        case MUT_WEIGHT_INF:
            weight = INFINITY;
            want = STRATA_EINVAL;
            break;
        }
        strata_diag d = {{0}};
        int rc = m == MUT_TOO_MANY_LAYERS ? strata_agg_add(agg, extra, nl + 1, weight, &d)
                                          : strata_agg_add(agg, u, n, weight, &d);
        if (rc != want || d.msg[0] == '\0') {
            fprintf(stderr, "mutation %d: rc %d (want %d), message \"%s\"\n", m, rc, want, d.msg);
            CU_FAIL("a bad update was not rejected with a message");
        }
        CU_ASSERT_EQUAL(strata_agg_count(agg), 3);
        CU_ASSERT_EQUAL(strata_agg_total_weight(agg), wbefore);
        strata_tensor_list after;
        agg_mean_list(agg, &layout, &after);
        if (!lists_identical(&before, &after)) {
            fprintf(stderr, "mutation %d changed the accumulator\n", m);
            CU_FAIL("a rejected update changed the accumulator");
        }
        strata_tensor_list_cleanup(&after);
        strata_clayers_free(u, nl);
    }

    /* A valid update is still accepted afterwards. */
    strata_clayer *u = make_update(&layout, specs, 5, 0);
    CU_ASSERT_EQUAL(strata_agg_add(agg, u, nl, 1.0, NULL), STRATA_OK);
    CU_ASSERT_EQUAL(strata_agg_count(agg), 4);
    strata_clayers_free(u, nl);

    /* NULL arguments. */
    CU_ASSERT_EQUAL(strata_agg_add(NULL, NULL, 0, 1.0, NULL), STRATA_EINVAL);
    CU_ASSERT_EQUAL(strata_agg_add(agg, NULL, nl, 1.0, NULL), STRATA_EINVAL);
    strata_agg *none = (strata_agg *)&layout;
    CU_ASSERT_EQUAL(strata_agg_new(NULL, &none), STRATA_EINVAL);
    CU_ASSERT_PTR_NULL(none);

    strata_tensor_list_cleanup(&before);
    strata_agg_free(agg);
    strata_tensor_list_cleanup(&layout);
}

/* ---- 2b. update-norm clipping ---- */

/* Norms 5 (at the bound: unchanged), 10 (above: halved) and 1 (below). */
static void test_clip_hand_computed(void)
{
    strata_tensor_list layout;
    int64_t s[1] = {2};
    strata_tensor_list_init(&layout);
    CU_ASSERT_EQUAL_FATAL(strata_tensor_list_add(&layout, "w", 1, s, NULL), STRATA_OK);
    float v1[2] = {3, 4}, v2[2] = {6, 8}, v3[2] = {0, 1};
    strata_clayer c1 = {.comp = STRATA_COMP_NONE, .numel = 2, .count = 2, .values = v1};
    strata_clayer c2 = {.comp = STRATA_COMP_NONE, .numel = 2, .count = 2, .values = v2};
    strata_clayer c3 = {.comp = STRATA_COMP_NONE, .numel = 2, .count = 2, .values = v3};
    strata_agg *agg = NULL;
    CU_ASSERT_EQUAL_FATAL(strata_agg_new(&layout, &agg), STRATA_OK);
    double norm = -1.0;
    CU_ASSERT_EQUAL(strata_agg_add_clipped(agg, &c1, 1, 1.0, 5.0, &norm, NULL), STRATA_OK);
    CU_ASSERT_EQUAL(norm, 5.0);
    CU_ASSERT_EQUAL(strata_agg_add_clipped(agg, &c2, 1, 2.0, 5.0, &norm, NULL), STRATA_OK);
    CU_ASSERT_EQUAL(norm, 10.0); /* the norm before clipping */
    CU_ASSERT_EQUAL(strata_agg_add_clipped(agg, &c3, 1, 1.0, 5.0, &norm, NULL), STRATA_OK);
    CU_ASSERT_EQUAL(norm, 1.0);
    /* The clipped update keeps its weight 2: (1*[3,4] + 2*[3,4] + 1*[0,1]) / 4 */
    CU_ASSERT_EQUAL(strata_agg_total_weight(agg), 4.0);
    strata_tensor_list m;
    agg_mean_list(agg, &layout, &m);
    CU_ASSERT_EQUAL(m.items[0].data[0], 2.25f);
    CU_ASSERT_EQUAL(m.items[0].data[1], 3.25f);
    strata_tensor_list_cleanup(&m);

    /* Bad bounds are refused and change nothing; norm_out is zeroed. */
    const double bad[] = {-1.0, NAN, -INFINITY};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        strata_diag d = {{0}};
        norm = -1.0;
        CU_ASSERT_EQUAL(strata_agg_add_clipped(agg, &c2, 1, 1.0, bad[i], &norm, &d), STRATA_EINVAL);
        CU_ASSERT(d.msg[0] != '\0');
        CU_ASSERT_EQUAL(norm, 0.0);
    }
    /* A rejected update reports no norm and changes nothing. */
    strata_clayer wrong = c1;
    wrong.numel = 3;
    norm = -1.0;
    CU_ASSERT_EQUAL(strata_agg_add_clipped(agg, &wrong, 1, 1.0, 1.0, &norm, NULL), STRATA_EPROTO);
    CU_ASSERT_EQUAL(norm, 0.0);
    CU_ASSERT_EQUAL(strata_agg_count(agg), 3);
    CU_ASSERT_EQUAL(strata_agg_total_weight(agg), 4.0);
    agg_mean_list(agg, &layout, &m);
    CU_ASSERT_EQUAL(m.items[0].data[0], 2.25f);
    CU_ASSERT_EQUAL(m.items[0].data[1], 3.25f);
    strata_tensor_list_cleanup(&m);
    strata_agg_free(agg);
    strata_tensor_list_cleanup(&layout);
}

/* The norm spans every layer; a sparse layer is scaled through its kept
 * values. */
static void test_clip_sparse_across_layers(void)
{
    strata_tensor_list layout;
    int64_t sa[1] = {3}, sb[1] = {2};
    strata_tensor_list_init(&layout);
    CU_ASSERT_EQUAL_FATAL(strata_tensor_list_add(&layout, "a", 1, sa, NULL), STRATA_OK);
    CU_ASSERT_EQUAL_FATAL(strata_tensor_list_add(&layout, "b", 1, sb, NULL), STRATA_OK);
    uint32_t ia[1] = {2};
    float va[1] = {-3}, vb[2] = {0, 4};
    strata_clayer u[2] = {
        {.layer_index = 0,
         .comp = STRATA_COMP_TOPK,
         .numel = 3,
         .count = 1,
         .indices = ia,
         .values = va},
        {.layer_index = 1, .comp = STRATA_COMP_NONE, .numel = 2, .count = 2, .values = vb},
    };
    strata_agg *agg = NULL;
    CU_ASSERT_EQUAL_FATAL(strata_agg_new(&layout, &agg), STRATA_OK);
    double norm = 0.0;
    CU_ASSERT_EQUAL(strata_agg_add_clipped(agg, u, 2, 3.0, 1.0, &norm, NULL), STRATA_OK);
    CU_ASSERT_EQUAL(norm, 5.0);
    strata_tensor_list m;
    agg_mean_list(agg, &layout, &m);
    /* [0, 0, -3 | 0, 4] / 5 */
    CU_ASSERT_EQUAL(m.items[0].data[0], 0.0f);
    CU_ASSERT_EQUAL(m.items[0].data[2], (float)(-3.0 * 0.2));
    CU_ASSERT_EQUAL(m.items[1].data[0], 0.0f);
    CU_ASSERT_EQUAL(m.items[1].data[1], (float)(4.0 * 0.2));
    strata_tensor_list_cleanup(&m);
    strata_agg_free(agg);
    strata_tensor_list_cleanup(&layout);
}

/* strata_agg_add is the clipped path with clipping off; a bound no update
 * reaches (or +infinity) gives bit-identical means; the norm matches the
 * decoded update for every compressor. */
static void test_clip_off_is_plain_add(void)
{
    strata_tensor_list layout;
    make_layout(&layout);
    const size_t nl = layout.count, total = strata_tensor_list_numel(&layout);
    const comp_spec mix[] = {SPEC_NONE, SPEC_TOPK, SPEC_RANDK, SPEC_QSGD,
                             SPEC_SIGN, SPEC_PSGD, SPEC_FP16};
    const size_t nmix = sizeof(mix) / sizeof(mix[0]);
    strata_agg *plain = NULL, *off = NULL, *inf = NULL, *high = NULL;
    CU_ASSERT_EQUAL_FATAL(strata_agg_new(&layout, &plain), STRATA_OK);
    CU_ASSERT_EQUAL_FATAL(strata_agg_new(&layout, &off), STRATA_OK);
    CU_ASSERT_EQUAL_FATAL(strata_agg_new(&layout, &inf), STRATA_OK);
    CU_ASSERT_EQUAL_FATAL(strata_agg_new(&layout, &high), STRATA_OK);
    float *dense = malloc(total * sizeof(float));
    CU_ASSERT_PTR_NOT_NULL_FATAL(dense);
    for (size_t c = 0; c < 6; c++) {
        strata_clayer *u = make_update(&layout, mix, nmix, c);
        const double w = 1.0 + (double)c;
        double n1 = 0.0, n2 = 0.0, n3 = 0.0;
        CU_ASSERT_EQUAL(strata_agg_add(plain, u, nl, w, NULL), STRATA_OK);
        CU_ASSERT_EQUAL(strata_agg_add_clipped(off, u, nl, w, 0.0, &n1, NULL), STRATA_OK);
        CU_ASSERT_EQUAL(strata_agg_add_clipped(inf, u, nl, w, INFINITY, &n2, NULL), STRATA_OK);
        CU_ASSERT_EQUAL(strata_agg_add_clipped(high, u, nl, w, 1e6, &n3, NULL), STRATA_OK);
        CU_ASSERT(n1 == n2 && n2 == n3);
        double sq = 0.0;
        size_t o = 0;
        for (size_t i = 0; i < nl; i++) {
            CU_ASSERT_EQUAL_FATAL(strata_clayer_decode(&u[i], dense + o, NULL), STRATA_OK);
            o += layout.items[i].numel;
        }
        for (size_t j = 0; j < total; j++)
            sq += (double)dense[j] * (double)dense[j];
        CU_ASSERT(fabs(n1 - sqrt(sq)) <= 1e-12 * sqrt(sq));
        strata_clayers_free(u, nl);
    }
    strata_tensor_list m0, m1, m2, m3;
    agg_mean_list(plain, &layout, &m0);
    agg_mean_list(off, &layout, &m1);
    agg_mean_list(inf, &layout, &m2);
    agg_mean_list(high, &layout, &m3);
    CU_ASSERT(lists_identical(&m0, &m1));
    CU_ASSERT(lists_identical(&m0, &m2));
    CU_ASSERT(lists_identical(&m0, &m3));
    strata_tensor_list_cleanup(&m0);
    strata_tensor_list_cleanup(&m1);
    strata_tensor_list_cleanup(&m2);
    strata_tensor_list_cleanup(&m3);
    free(dense);
    strata_agg_free(plain);
    strata_agg_free(off);
    strata_agg_free(inf);
    strata_agg_free(high);
    strata_tensor_list_cleanup(&layout);
}

/* ---- 3. server optimisers against hand-computed steps ---- */

static void two_params(strata_tensor_list *l, float a, float b)
{
    int64_t s[1] = {2};
    float v[2] = {a, b};
    strata_tensor_list_init(l);
    CU_ASSERT_EQUAL_FATAL(strata_tensor_list_add(l, "w", 1, s, v), STRATA_OK);
}

/* Deltas of the three steps, per element. */
static const float DELTAS[3][2] = {{0.5f, -0.2f}, {0.3f, 0.01f}, {-0.4f, 0.0f}};

static void test_server_opt_hand_computed(void)
{
    static const struct {
        const char *name;
        double lr;
        double w[3][2]; /* w after steps 1, 2, 3 from w = [1, -0.5] */
    } cases[] = {
        /* w += 0.5 d */
        {"plain", 0.5, {{1.25, -0.6}, {1.4, -0.595}, {1.2, -0.595}}},
        /* v = 0.9 v + d: [0.5, -0.2], [0.75, -0.17], [0.275, -0.153]; w += 0.5 v */
        {"fedavgm", 0.5, {{1.25, -0.6}, {1.625, -0.685}, {1.7625, -0.7615}}},
        /* m = 0.9 m + 0.1 d: [0.05, -0.02], [0.075, -0.017], [0.0275, -0.0153];
         * v = 0.99 v + 0.01 d^2 from 1e-6: [0.00250099, 0.00040099],
         * [0.0033759801, 0.0003979801], [0.004942220299, 0.000394000299];
         * w += 0.1 m / (sqrt(v) + 0.001) */
        {"fedadam",
         0.1,
         {{1.0980201901209485, -0.5951260516755887},
          {1.2249169048716249, -0.6762738109728589},
          {1.2634858285328863, -0.7496570741816683}}},
        /* m as above; v -= 0.01 d^2 sign(v - d^2) from 1e-6: [0.002501, 0.000401],
         * [0.003401, 0.0004] (0.000401 > 1e-4: decreases), [0.005001, 0.0004]
         * (d = 0: unchanged); w += 0.1 m / (sqrt(v) + 0.001) */
        {"fedyogi",
         0.1,
         {{1.0980199980004, -0.5951249219725039},
          {1.224456968398841, -0.6760773029248848},
          {1.2628017302569627, -0.7489344457820276}}},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        strata_server_opt_config cfg;
        CU_ASSERT_EQUAL_FATAL(strata_server_opt_parse(cases[i].name, &cfg, NULL), STRATA_OK);
        CU_ASSERT_STRING_EQUAL(strata_server_opt_name(cfg.type), cases[i].name);
        /* The constants of the hand computation (the published ones, not
         * Strata's defaults). */
        cfg.lr = cases[i].lr;
        cfg.momentum = 0.9;
        cfg.beta1 = 0.9;
        cfg.tau = 1e-3;
        strata_tensor_list p;
        two_params(&p, 1.0f, -0.5f);
        strata_server_opt *o = NULL;
        CU_ASSERT_EQUAL_FATAL(strata_server_opt_new(&p, &cfg, &o, NULL), STRATA_OK);
        for (int s = 0; s < 3; s++) {
            strata_tensor_list d;
            two_params(&d, DELTAS[s][0], DELTAS[s][1]);
            CU_ASSERT_EQUAL(strata_server_opt_step(o, &p, &d, NULL), STRATA_OK);
            for (int j = 0; j < 2; j++)
                if (fabs((double)p.items[0].data[j] - cases[i].w[s][j]) > 2e-6) {
                    fprintf(stderr, "%s step %d elem %d: %.9f != %.9f\n", cases[i].name, s + 1, j,
                            (double)p.items[0].data[j], cases[i].w[s][j]);
                    CU_FAIL("server optimiser step differs from the hand-computed value");
                }
            strata_tensor_list_cleanup(&d);
        }
        CU_ASSERT_EQUAL(strata_server_opt_steps(o), 3);
        strata_server_opt_free(o);
        strata_tensor_list_cleanup(&p);
    }
}

/* --server-lr-final: the rate falls from lr to lr_final along a half cosine
 * over horizon steps, for every optimiser type, and stays there. */
static void test_server_opt_schedule(void)
{
    /* lr 3 to 1 over 5 steps: 3, 1 + 2 (1 + cos(pi/4)) / 2, 2, 1 + 2 (1 - cos(pi/4)) / 2, 1,
     * then 1. */
    const double c4 = cos(3.14159265358979323846 / 4.0);
    const double want[7] = {3.0, 2.0 + c4, 2.0, 2.0 - c4, 1.0, 1.0, 1.0};
    strata_server_opt_config cfg;
    strata_server_opt_config_init(&cfg, STRATA_SERVER_OPT_PLAIN);
    cfg.lr = 3.0;
    cfg.lr_final = 1.0;
    cfg.horizon = 5;
    strata_tensor_list p;
    two_params(&p, 1.0f, -0.5f);
    strata_server_opt *o = NULL;
    CU_ASSERT_EQUAL_FATAL(strata_server_opt_new(&p, &cfg, &o, NULL), STRATA_OK);
    double w0 = 1.0, w1 = -0.5;
    for (int s = 0; s < 7; s++) {
        CU_ASSERT_DOUBLE_EQUAL(strata_server_opt_lr(o), want[s], 1e-12);
        strata_tensor_list d;
        two_params(&d, 0.25f, -0.125f);
        CU_ASSERT_EQUAL(strata_server_opt_step(o, &p, &d, NULL), STRATA_OK);
        w0 += want[s] * 0.25;
        w1 -= want[s] * 0.125;
        CU_ASSERT_DOUBLE_EQUAL(p.items[0].data[0], w0, 1e-5);
        CU_ASSERT_DOUBLE_EQUAL(p.items[0].data[1], w1, 1e-5);
        strata_tensor_list_cleanup(&d);
    }
    strata_server_opt_free(o);

    /* A rising rate works the same way; a horizon of 1 is lr_final at once;
     * lr_final 0 keeps lr. */
    const struct {
        double lr, lr_final;
        uint64_t horizon;
        double first, second;
    } cases[] = {
        {0.5, 2.5, 3, 0.5, 1.5},
        {4.0, 2.0, 1, 2.0, 2.0},
        {4.0, 0.0, 0, 4.0, 4.0},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        strata_server_opt_config_init(&cfg, STRATA_SERVER_OPT_FEDAVGM);
        cfg.lr = cases[i].lr;
        cfg.lr_final = cases[i].lr_final;
        cfg.horizon = cases[i].horizon;
        CU_ASSERT_EQUAL_FATAL(strata_server_opt_new(&p, &cfg, &o, NULL), STRATA_OK);
        CU_ASSERT_DOUBLE_EQUAL(strata_server_opt_lr(o), cases[i].first, 1e-12);
        strata_tensor_list d;
        two_params(&d, 0.0f, 0.0f);
        CU_ASSERT_EQUAL(strata_server_opt_step(o, &p, &d, NULL), STRATA_OK);
        CU_ASSERT_DOUBLE_EQUAL(strata_server_opt_lr(o), cases[i].second, 1e-12);
        strata_tensor_list_cleanup(&d);
        strata_server_opt_free(o);
    }
    CU_ASSERT_EQUAL(strata_server_opt_lr(NULL), 0.0);
    strata_tensor_list_cleanup(&p);
}

static void test_server_opt_errors(void)
{
    strata_server_opt_config cfg;
    strata_diag d = {{0}};
    CU_ASSERT_EQUAL(strata_server_opt_parse("adam", &cfg, &d), STRATA_EINVAL);
    CU_ASSERT(d.msg[0] != '\0');
    CU_ASSERT_EQUAL(strata_server_opt_parse("fedyogi", &cfg, NULL), STRATA_OK);
    CU_ASSERT_EQUAL(cfg.type, STRATA_SERVER_OPT_FEDYOGI);
    CU_ASSERT_EQUAL(cfg.lr, 0.05);
    CU_ASSERT_EQUAL(cfg.beta1, 0.0);
    CU_ASSERT_EQUAL(cfg.beta2, 0.99);
    CU_ASSERT_EQUAL(cfg.tau, 0.01);
    CU_ASSERT_EQUAL(strata_server_opt_parse("fedavgm", &cfg, NULL), STRATA_OK);
    CU_ASSERT_EQUAL(cfg.lr, 1.0);
    CU_ASSERT_EQUAL(cfg.momentum, 0.5);
    CU_ASSERT_STRING_EQUAL(strata_server_opt_name((strata_server_opt_type)9), "?");

    strata_tensor_list p, bad;
    two_params(&p, 1.0f, 2.0f);
    int64_t s3[1] = {3};
    strata_tensor_list_init(&bad);
    CU_ASSERT_EQUAL_FATAL(strata_tensor_list_add(&bad, "w", 1, s3, NULL), STRATA_OK);
    static const struct {
        strata_server_opt_type type;
        double lr, momentum, beta1, beta2, tau, lr_final;
        uint64_t horizon;
    } cfgs[] = {
        {STRATA_SERVER_OPT_PLAIN, 0.0, 0.9, 0.9, 0.99, 1e-3, 0.0, 0},
        {STRATA_SERVER_OPT_PLAIN, NAN, 0.9, 0.9, 0.99, 1e-3, 0.0, 0},
        {STRATA_SERVER_OPT_FEDAVGM, 1.0, 1.0, 0.9, 0.99, 1e-3, 0.0, 0},
        {STRATA_SERVER_OPT_FEDAVGM, 1.0, -0.1, 0.9, 0.99, 1e-3, 0.0, 0},
        {STRATA_SERVER_OPT_FEDADAM, 1.0, 0.9, 1.0, 0.99, 1e-3, 0.0, 0},
        {STRATA_SERVER_OPT_FEDADAM, 1.0, 0.9, 0.9, 1.0, 1e-3, 0.0, 0},
        {STRATA_SERVER_OPT_FEDYOGI, 1.0, 0.9, 0.9, 0.99, 0.0, 0.0, 0},
        {STRATA_SERVER_OPT_FEDYOGI, 1.0, 0.9, 0.9, 0.99, INFINITY, 0.0, 0},
        {(strata_server_opt_type)7, 1.0, 0.9, 0.9, 0.99, 1e-3, 0.0, 0},
        {STRATA_SERVER_OPT_PLAIN, 1.0, 0.9, 0.9, 0.99, 1e-3, -0.5, 10},
        {STRATA_SERVER_OPT_PLAIN, 1.0, 0.9, 0.9, 0.99, 1e-3, NAN, 10},
        {STRATA_SERVER_OPT_PLAIN, 1.0, 0.9, 0.9, 0.99, 1e-3, 0.5, 0},
    };
    for (size_t i = 0; i < sizeof(cfgs) / sizeof(cfgs[0]); i++) {
        strata_server_opt_config c = {cfgs[i].type,     cfgs[i].lr,     cfgs[i].momentum,
                                      cfgs[i].beta1,    cfgs[i].beta2,  cfgs[i].tau,
                                      cfgs[i].lr_final, cfgs[i].horizon};
        strata_server_opt *o = NULL;
        d.msg[0] = '\0';
        CU_ASSERT_EQUAL(strata_server_opt_new(&p, &c, &o, &d), STRATA_EINVAL);
        CU_ASSERT_PTR_NULL(o);
        CU_ASSERT(d.msg[0] != '\0');
    }

    /* Layout mismatch and a non-finite delta leave params and state alone. */
    strata_server_opt *o = NULL;
    strata_server_opt_config_init(&cfg, STRATA_SERVER_OPT_FEDADAM);
    CU_ASSERT_EQUAL_FATAL(strata_server_opt_new(&p, &cfg, &o, NULL), STRATA_OK);
    d.msg[0] = '\0';
    CU_ASSERT_EQUAL(strata_server_opt_step(o, &p, &bad, &d), STRATA_EINVAL);
    CU_ASSERT(d.msg[0] != '\0');
    strata_tensor_list nan;
    two_params(&nan, 0.5f, NAN);
    CU_ASSERT_EQUAL(strata_server_opt_step(o, &p, &nan, NULL), STRATA_EINVAL);
    CU_ASSERT_EQUAL(p.items[0].data[0], 1.0f);
    CU_ASSERT_EQUAL(p.items[0].data[1], 2.0f);
    CU_ASSERT_EQUAL(strata_server_opt_steps(o), 0);
    strata_server_opt_free(o);
    strata_tensor_list_cleanup(&nan);
    strata_tensor_list_cleanup(&bad);
    strata_tensor_list_cleanup(&p);
}

/* ---- 4. saved state continues identically ---- */

static void random_list(strata_tensor_list *dst, const strata_tensor_list *layout, double scale)
{
    strata_tensor_list_init(dst);
    CU_ASSERT_EQUAL_FATAL(strata_tensor_list_zeros_like(dst, layout), STRATA_OK);
    for (size_t i = 0; i < dst->count; i++)
        for (size_t j = 0; j < dst->items[i].numel; j++)
            dst->items[i].data[j] = (float)(scale * (2.0 * uniform() - 1.0));
}

static void test_server_opt_save_load(void)
{
    char *dir = strata_test_tmpdir();
    CU_ASSERT_PTR_NOT_NULL_FATAL(dir);
    char path[600];
    snprintf(path, sizeof(path), "%s/server_opt.safetensors", dir);
    strata_tensor_list layout;
    make_layout(&layout);
    for (int t = STRATA_SERVER_OPT_PLAIN; t <= STRATA_SERVER_OPT_FEDYOGI; t++) {
        strata_server_opt_config cfg;
        strata_server_opt_config_init(&cfg, (strata_server_opt_type)t);
        cfg.lr = 0.05;
        cfg.lr_final = 0.01; /* the schedule's position is restored with the steps */
        cfg.horizon = 4;
        strata_tensor_list p1, p2, delta;
        random_list(&p1, &layout, 1.0);
        strata_server_opt *a = NULL, *b = NULL;
        CU_ASSERT_EQUAL_FATAL(strata_server_opt_new(&layout, &cfg, &a, NULL), STRATA_OK);
        for (int s = 0; s < 2; s++) {
            random_list(&delta, &layout, 0.1);
            CU_ASSERT_EQUAL(strata_server_opt_step(a, &p1, &delta, NULL), STRATA_OK);
            strata_tensor_list_cleanup(&delta);
        }
        strata_diag d = {{0}};
        int rc = strata_server_opt_save(a, path, &d);
        if (rc != STRATA_OK)
            fprintf(stderr, "save %s: %s\n", strata_server_opt_name(cfg.type),
                    strata_diag_msg(&d, rc));
        CU_ASSERT_EQUAL_FATAL(rc, STRATA_OK);
        rc = strata_server_opt_load(path, &layout, &cfg, &b, &d);
        if (rc != STRATA_OK)
            fprintf(stderr, "load %s: %s\n", strata_server_opt_name(cfg.type),
                    strata_diag_msg(&d, rc));
        CU_ASSERT_EQUAL_FATAL(rc, STRATA_OK);
        CU_ASSERT_EQUAL(strata_server_opt_steps(b), 2);
        CU_ASSERT_EQUAL(strata_server_opt_lr(b), strata_server_opt_lr(a));
        CU_ASSERT(strata_server_opt_lr(b) < cfg.lr && strata_server_opt_lr(b) > cfg.lr_final);
        CU_ASSERT_EQUAL(strata_server_opt_get_config(b)->type, cfg.type);

        /* Resumed with a longer run (--rounds 8 after 4): the two steps
         * taken place it on the longer schedule, above where it was. */
        strata_server_opt_config longer = cfg;
        longer.horizon = 8;
        strata_server_opt *l = NULL;
        CU_ASSERT_EQUAL_FATAL(strata_server_opt_load(path, &layout, &longer, &l, NULL), STRATA_OK);
        CU_ASSERT_EQUAL(strata_server_opt_steps(l), 2);
        const double want = 0.01 + (0.05 - 0.01) * (1.0 + cos(acos(-1.0) * 2.0 / 7.0)) / 2.0;
        CU_ASSERT_DOUBLE_EQUAL(strata_server_opt_lr(l), want, 1e-12);
        CU_ASSERT(strata_server_opt_lr(l) > strata_server_opt_lr(b));
        strata_server_opt_free(l);

        /* Two more steps on each: bit-identical parameters. */
        strata_tensor_list_init(&p2);
        CU_ASSERT_EQUAL_FATAL(strata_tensor_list_copy(&p2, &p1), STRATA_OK);
        for (int s = 0; s < 2; s++) {
            random_list(&delta, &layout, 0.1);
            CU_ASSERT_EQUAL(strata_server_opt_step(a, &p1, &delta, NULL), STRATA_OK);
            CU_ASSERT_EQUAL(strata_server_opt_step(b, &p2, &delta, NULL), STRATA_OK);
            strata_tensor_list_cleanup(&delta);
        }
        CU_ASSERT(lists_identical(&p1, &p2));
        CU_ASSERT_EQUAL(strata_server_opt_steps(b), 4);

        /* Another optimiser type or model is a clear error. */
        strata_server_opt_config other;
        strata_server_opt_config_init(&other, (strata_server_opt_type)((t + 1) % 4));
        strata_server_opt *c = NULL;
        d.msg[0] = '\0';
        CU_ASSERT_EQUAL(strata_server_opt_load(path, &layout, &other, &c, &d), STRATA_EINVAL);
        CU_ASSERT_PTR_NULL(c);
        CU_ASSERT(strstr(d.msg, strata_server_opt_name(cfg.type)) != NULL);
        if (t != STRATA_SERVER_OPT_PLAIN) {
            strata_tensor_list small;
            int64_t s2[1] = {2};
            strata_tensor_list_init(&small);
            CU_ASSERT_EQUAL_FATAL(strata_tensor_list_add(&small, "conv.weight", 1, s2, NULL),
                                  STRATA_OK);
            d.msg[0] = '\0';
            CU_ASSERT_EQUAL(strata_server_opt_load(path, &small, &cfg, &c, &d), STRATA_EINVAL);
            CU_ASSERT_PTR_NULL(c);
            CU_ASSERT(d.msg[0] != '\0');
            strata_tensor_list_cleanup(&small);
        }
        strata_server_opt_free(a);
        strata_server_opt_free(b);
        strata_tensor_list_cleanup(&p1);
        strata_tensor_list_cleanup(&p2);
    }
    /* A file that is not optimiser state. */
    strata_server_opt_config cfg;
    strata_server_opt_config_init(&cfg, STRATA_SERVER_OPT_PLAIN);
    strata_server_opt *c = NULL;
    snprintf(path, sizeof(path), "%s/missing.safetensors", dir);
    CU_ASSERT_EQUAL(strata_server_opt_load(path, &layout, &cfg, &c, NULL), STRATA_EIO);
    strata_tensor_list_cleanup(&layout);
    strata_test_rmtree(dir);
    free(dir);
}

/* A copy of the state steps exactly as the original; the original stays
 * as it was (the coordinator's close steps a copy until it is durable). */
static void test_server_opt_copy_state(void)
{
    strata_tensor_list layout;
    make_layout(&layout);
    for (int t = STRATA_SERVER_OPT_PLAIN; t <= STRATA_SERVER_OPT_FEDYOGI; t++) {
        strata_server_opt_config cfg;
        strata_server_opt_config_init(&cfg, (strata_server_opt_type)t);
        cfg.lr = 0.05;
        strata_server_opt *a = NULL, *b = NULL;
        CU_ASSERT_EQUAL_FATAL(strata_server_opt_new(&layout, &cfg, &a, NULL), STRATA_OK);
        CU_ASSERT_EQUAL_FATAL(strata_server_opt_new(&layout, &cfg, &b, NULL), STRATA_OK);
        strata_tensor_list p1, p2, p0, delta;
        random_list(&p1, &layout, 1.0);
        random_list(&delta, &layout, 0.1);
        CU_ASSERT_EQUAL(strata_server_opt_step(a, &p1, &delta, NULL), STRATA_OK);
        strata_tensor_list_cleanup(&delta);
        strata_tensor_list_init(&p2);
        strata_tensor_list_init(&p0);
        CU_ASSERT_EQUAL_FATAL(strata_tensor_list_copy(&p2, &p1), STRATA_OK);
        CU_ASSERT_EQUAL_FATAL(strata_tensor_list_copy(&p0, &p1), STRATA_OK);
        CU_ASSERT_EQUAL(strata_server_opt_copy_state(b, a, NULL), STRATA_OK);
        CU_ASSERT_EQUAL(strata_server_opt_steps(b), 1);
        /* b steps p2; a then steps p1 with the same delta: identical. */
        random_list(&delta, &layout, 0.1);
        CU_ASSERT_EQUAL(strata_server_opt_step(b, &p2, &delta, NULL), STRATA_OK);
        CU_ASSERT_EQUAL(strata_server_opt_steps(a), 1);
        CU_ASSERT(lists_identical(&p1, &p0));
        CU_ASSERT_EQUAL(strata_server_opt_step(a, &p1, &delta, NULL), STRATA_OK);
        CU_ASSERT(lists_identical(&p1, &p2));
        strata_tensor_list_cleanup(&delta);
        /* Another type or layout: refused, nothing copied. */
        strata_server_opt_config oc;
        strata_server_opt_config_init(&oc, (strata_server_opt_type)((t + 1) % 4));
        strata_server_opt *c = NULL;
        CU_ASSERT_EQUAL_FATAL(strata_server_opt_new(&layout, &oc, &c, NULL), STRATA_OK);
        strata_diag d = {{0}};
        CU_ASSERT_EQUAL(strata_server_opt_copy_state(c, a, &d), STRATA_EINVAL);
        CU_ASSERT_PTR_NOT_NULL(strstr(d.msg, strata_server_opt_name(cfg.type)));
        CU_ASSERT_EQUAL(strata_server_opt_steps(c), 0);
        strata_server_opt_free(c);
        strata_tensor_list small;
        int64_t s2[1] = {2};
        strata_tensor_list_init(&small);
        CU_ASSERT_EQUAL_FATAL(strata_tensor_list_add(&small, "w", 1, s2, NULL), STRATA_OK);
        CU_ASSERT_EQUAL_FATAL(strata_server_opt_new(&small, &cfg, &c, NULL), STRATA_OK);
        CU_ASSERT_EQUAL(strata_server_opt_copy_state(c, a, &d), STRATA_EINVAL);
        CU_ASSERT_EQUAL(strata_server_opt_steps(c), 0);
        CU_ASSERT_EQUAL(strata_server_opt_copy_state(NULL, a, NULL), STRATA_EINVAL);
        strata_server_opt_free(c);
        strata_tensor_list_cleanup(&small);
        strata_server_opt_free(a);
        strata_server_opt_free(b);
        strata_tensor_list_cleanup(&p0);
        strata_tensor_list_cleanup(&p1);
        strata_tensor_list_cleanup(&p2);
    }
    strata_tensor_list_cleanup(&layout);
}

/* ---- 5. memory does not grow with the number of updates ---- */

static void test_memory_constant(void)
{
    strata_tensor_list layout;
    int64_t s1[2] = {256, 200}, s2[1] = {256};
    strata_tensor_list_init(&layout);
    CU_ASSERT_EQUAL_FATAL(strata_tensor_list_add(&layout, "fc.weight", 2, s1, NULL), STRATA_OK);
    CU_ASSERT_EQUAL_FATAL(strata_tensor_list_add(&layout, "fc.bias", 1, s2, NULL), STRATA_OK);
    const size_t total = strata_tensor_list_numel(&layout);
    const comp_spec specs[] = {SPEC_TOPK, SPEC_NONE, SPEC_RANDK, SPEC_QSGD, SPEC_SIGN, SPEC_PSGD};
    enum { NUPD = 6 };
    strata_clayer *upd[NUPD];
    for (int k = 0; k < NUPD; k++)
        upd[k] = make_update(&layout, specs, NUPD, (size_t)k);

    strata_agg *agg = NULL;
    CU_ASSERT_EQUAL_FATAL(strata_agg_new(&layout, &agg), STRATA_OK);
    const size_t bytes0 = strata_agg_memory_bytes(agg);
    CU_ASSERT(bytes0 >= total * 12);
    CU_ASSERT(bytes0 <= total * 12 + 4096);
#ifdef HAVE_MALLINFO2
    /* Warm up once (PowerSGD and RANDK use transient buffers). */
    CU_ASSERT_EQUAL(strata_agg_add(agg, upd[0], 2, 1.0, NULL), STRATA_OK);
    const size_t heap0 = mallinfo2().uordblks;
#endif
    for (int k = 0; k < 200; k++)
        CU_ASSERT_EQUAL(strata_agg_add(agg, upd[k % NUPD], 2, 1.0 + k % 13, NULL), STRATA_OK);
#ifdef HAVE_MALLINFO2
    const size_t heap1 = mallinfo2().uordblks;
    if (heap1 > heap0 + 65536) {
        fprintf(stderr, "heap grew by %zu bytes over 200 updates\n", heap1 - heap0);
        CU_FAIL("the heap grows with the number of updates");
    }
#endif
    CU_ASSERT_EQUAL(strata_agg_memory_bytes(agg), bytes0);
    CU_ASSERT(strata_agg_count(agg) >= 200);

    strata_agg_free(agg);
    for (int k = 0; k < NUPD; k++)
        strata_clayers_free(upd[k], 2);
    strata_tensor_list_cleanup(&layout);
}

int main(void)
{
    CU_TestInfo agg_tests[] = {
        {"mean matches the direct weighted mean", test_mean_matches_direct},
        {"sparse updates, hand computed; reset", test_sparse_hand_computed},
        {"rejected updates change nothing", test_rejected_updates_change_nothing},
        {"memory does not grow with updates", test_memory_constant},
        {"clipping, hand computed; bad bounds", test_clip_hand_computed},
        {"clipping spans layers, sparse too", test_clip_sparse_across_layers},
        {"clipping off is the plain add", test_clip_off_is_plain_add},
        CU_TEST_INFO_NULL,
    };
    CU_TestInfo opt_tests[] = {
        {"hand-computed steps", test_server_opt_hand_computed},
        {"a falling rate (--server-lr-final)", test_server_opt_schedule},
        {"configuration and input errors", test_server_opt_errors},
        {"save and load continue identically", test_server_opt_save_load},
        {"a copied state steps identically", test_server_opt_copy_state},
        CU_TEST_INFO_NULL,
    };
    CU_SuiteInfo suites[] = {
        {"aggregate", NULL, NULL, NULL, NULL, agg_tests},
        {"server_opt", NULL, NULL, NULL, NULL, opt_tests},
        CU_SUITE_INFO_NULL,
    };
    return strata_test_run(suites);
}
