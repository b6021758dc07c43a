/* Error feedback: the identities decode(C(a)) + e_new == a (sparsifiers,
 * bit for bit) and e_new == a - decode(C(a)) (quantisers), bounded
 * accumulated error with EF versus growth without, staleness decay and
 * drop, all-or-nothing steps, save/load. */
#include "strata/compress.h"
#include "strata/ef.h"
#include "strata/error.h"
#include "strata/rng.h"
#include "strata/safetensors.h"
#include "test_util.h"

#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static uint32_t bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* A small model: conv, matrix, bias, a scalar and one layer large enough
 * for the sampled top-k path. */
static void make_layout(strata_tensor_list *l, int big)
{
    strata_tensor_list_init(l);
    int64_t conv[4] = {8, 3, 3, 3}, fc[2] = {32, 24}, bias[1] = {100}, large[2] = {200, 250};
    CU_ASSERT_EQUAL_FATAL(strata_tensor_list_add(l, "conv.weight", 4, conv, NULL), STRATA_OK);
    CU_ASSERT_EQUAL_FATAL(strata_tensor_list_add(l, "fc.weight", 2, fc, NULL), STRATA_OK);
    CU_ASSERT_EQUAL_FATAL(strata_tensor_list_add(l, "fc.bias", 1, bias, NULL), STRATA_OK);
    CU_ASSERT_EQUAL_FATAL(strata_tensor_list_add(l, "gain", 0, NULL, NULL), STRATA_OK);
    if (big)
        CU_ASSERT_EQUAL_FATAL(strata_tensor_list_add(l, "big.weight", 2, large, NULL), STRATA_OK);
}

static void random_fill(strata_tensor_list *l, strata_rng *r, double scale)
{
    for (size_t t = 0; t < l->count; t++)
        for (size_t i = 0; i < l->items[t].numel; i++)
            l->items[t].data[i] = (float)(scale * strata_rng_normal(r));
}

static strata_budget *budgets_for(size_t n, strata_compressor_id comp)
{
    strata_budget *b = calloc(n, sizeof(strata_budget));
    for (size_t i = 0; i < n; i++)
        b[i] = (strata_budget){comp, 0.05, 8, 2, STRATA_VALUES_FP32};
    return b;
}

/* For every layer: a = (decay * e_old + d) + 0 (decay 1: e_old + d; drop:
 * d + 0), then the identity for the layer's compressor. Returns the number
 * of elements that broke it. */
static size_t check_identity(const strata_tensor_list *e_old, const strata_tensor_list *delta,
                             const strata_tensor_list *e_new, const strata_clayer *layers, int mode,
                             float decay)
{
    size_t bad = 0;
    for (size_t t = 0; t < delta->count; t++) {
        size_t n = delta->items[t].numel;
        float *dec = malloc(n * sizeof(float));
        CU_ASSERT_PTR_NOT_NULL_FATAL(dec);
        CU_ASSERT_EQUAL(layers[t].layer_index, t);
        CU_ASSERT_EQUAL(layers[t].numel, n);
        CU_ASSERT_EQUAL_FATAL(strata_clayer_decode(&layers[t], dec, NULL), STRATA_OK);
        const float *e = e_old->items[t].data, *d = delta->items[t].data,
                    *en = e_new->items[t].data;
        /* Bit for bit: sparsifiers, except randk with quantised values
         * (its kept values can be far below the layer's scale). */
        int sparse = layers[t].comp == STRATA_COMP_TOPK ||
                     (layers[t].comp == STRATA_COMP_RANDK &&
                      !STRATA_VALUES_QUANTISED(layers[t].values_format));
        for (size_t i = 0; i < n; i++) {
            float a = mode == 0   ? (e[i] + d[i]) + 0.0f
                      : mode == 1 ? (decay * e[i] + d[i]) + 0.0f
                                  : d[i] + 0.0f;
            if (sparse)
                bad += bits(dec[i] + en[i]) != bits(a);
            else
                bad += bits(en[i]) != bits(a - dec[i]);
        }
        free(dec);
    }
    return bad;
}

static void test_identity_all_compressors(void)
{
    static const struct {
        strata_compressor_id comp;
        strata_values_format vf;
    } cases[] = {
        {STRATA_COMP_TOPK, STRATA_VALUES_FP32},     {STRATA_COMP_TOPK, STRATA_VALUES_FP16},
        {STRATA_COMP_TOPK, STRATA_VALUES_BF16},     {STRATA_COMP_RANDK, STRATA_VALUES_FP32},
        {STRATA_COMP_RANDK, STRATA_VALUES_BF16},    {STRATA_COMP_NONE, STRATA_VALUES_FP32},
        {STRATA_COMP_NONE, STRATA_VALUES_FP16},     {STRATA_COMP_FP16, STRATA_VALUES_FP32},
        {STRATA_COMP_BF16, STRATA_VALUES_FP32},     {STRATA_COMP_QSGD, STRATA_VALUES_FP32},
        {STRATA_COMP_SIGN, STRATA_VALUES_FP32},     {STRATA_COMP_POWERSGD, STRATA_VALUES_FP32},
        {STRATA_COMP_POWERSGD, STRATA_VALUES_BF16}, {STRATA_COMP_TOPK, STRATA_VALUES_INT8},
        {STRATA_COMP_TOPK, STRATA_VALUES_TERNARY},  {STRATA_COMP_RANDK, STRATA_VALUES_INT8},
        {STRATA_COMP_RANDK, STRATA_VALUES_TERNARY}, {STRATA_COMP_RANDK, STRATA_VALUES_FP16},
        {STRATA_COMP_QSGD, STRATA_VALUES_INT8},     {STRATA_COMP_SIGN, STRATA_VALUES_TERNARY},
        {STRATA_COMP_POWERSGD, STRATA_VALUES_INT8}, {STRATA_COMP_NONE, STRATA_VALUES_TERNARY},
        {STRATA_COMP_FP16, STRATA_VALUES_INT8},     {STRATA_COMP_BF16, STRATA_VALUES_FP32},
    };
    strata_rng r;
    strata_rng_seed(&r, 1, 0);
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        strata_tensor_list layout, delta, old;
        make_layout(&layout, 1);
        strata_tensor_list_init(&delta);
        strata_tensor_list_init(&old);
        strata_tensor_list_copy(&delta, &layout);
        strata_ef *ef = NULL;
        CU_ASSERT_EQUAL_FATAL(strata_ef_new(&layout, 1.0, 0, &ef), STRATA_OK);
        strata_budget *b = budgets_for(layout.count, cases[c].comp);
        for (size_t l = 0; l < layout.count; l++) /* the format each compressor takes */
            b[l].values = strata_values_format_for(cases[c].comp, cases[c].vf);
        size_t bad = 0;
        for (uint32_t round = 1; round <= 4; round++) {
            random_fill(&delta, &r, round == 2 ? 1e-3 : 1.0);
            delta.items[2].data[3] = -0.0f; /* negative zero is canonicalised */
            CU_ASSERT_EQUAL_FATAL(strata_tensor_list_copy(&old, strata_ef_residuals(ef)),
                                  STRATA_OK);
            strata_clayer *layers = NULL;
            strata_diag d = {{0}};
            int rc = strata_ef_step(ef, &delta, b, round, 99, &layers, &d);
            if (rc != STRATA_OK)
                fprintf(stderr, "case %zu round %u: %s\n", c, round, d.msg);
            CU_ASSERT_EQUAL_FATAL(rc, STRATA_OK);
            bad += check_identity(&old, &delta, strata_ef_residuals(ef), layers, 0, 1.0f);
            /* Layers that carry float values use the format asked for, or
             * fp32 where int8/ternary do not apply. */
            for (size_t t = 0; t < layout.count; t++)
                if (layers[t].comp == STRATA_COMP_NONE || layers[t].comp == STRATA_COMP_TOPK ||
                    layers[t].comp == STRATA_COMP_RANDK || layers[t].comp == STRATA_COMP_POWERSGD)
                    CU_ASSERT_EQUAL(layers[t].values_format,
                                    strata_values_format_for(layers[t].comp, cases[c].vf));
            /* Top-k keeps exactly k and nothing dropped beats anything kept. */
            for (size_t t = 0; t < layout.count && cases[c].comp == STRATA_COMP_TOPK; t++) {
                size_t n = layout.items[t].numel;
                CU_ASSERT_EQUAL(layers[t].count, strata_comp_kept(0.05, n));
                float *a = malloc(n * sizeof(float));
                for (size_t i = 0; i < n; i++)
                    a[i] = old.items[t].data[i] + delta.items[t].data[i];
                float kmin = INFINITY, dmax = 0.0f;
                char *kept = calloc(n, 1);
                for (size_t j = 0; j < layers[t].count; j++)
                    kept[layers[t].indices[j]] = 1;
                for (size_t i = 0; i < n; i++) {
                    if (kept[i])
                        kmin = fminf(kmin, fabsf(a[i]));
                    else
                        dmax = fmaxf(dmax, fabsf(a[i]));
                }
                CU_ASSERT(kmin >= dmax);
                free(kept);
                free(a);
            }
            if (cases[c].comp == STRATA_COMP_POWERSGD) {
                CU_ASSERT_EQUAL(layers[1].comp, STRATA_COMP_POWERSGD);
                CU_ASSERT_EQUAL(layers[2].comp, STRATA_COMP_NONE); /* vector: dense */
            }
            strata_clayers_free(layers, layout.count);
        }
        if (bad != 0)
            fprintf(stderr, "identity case %zu (%s): %zu elements differ\n", c,
                    strata_comp_name(cases[c].comp), bad);
        CU_ASSERT_EQUAL(bad, 0);
        free(b);
        strata_ef_free(ef);
        strata_tensor_list_cleanup(&old);
        strata_tensor_list_cleanup(&delta);
        strata_tensor_list_cleanup(&layout);
    }
}

/* Top-k with int8 and ternary values on large layers (the sampled top-k
 * path), Gaussian and heavy-tailed (a normal over the square root of a
 * uniform: the kept magnitudes spread over decades, so ternary's cap on mu
 * is what keeps its residual exact), densities 1% and 10%, over several
 * rounds: ternary keeps decode + e_new == a bit for bit; int8 keeps e_new
 * == a - decode always, and bit for bit on the Gaussian. */
static void test_identity_quantised_topk(void)
{
    enum { N = 200000 };
    static const strata_values_format vfs[] = {STRATA_VALUES_INT8, STRATA_VALUES_TERNARY};
    static const double dens[] = {0.01, 0.1};
    strata_rng r;
    strata_rng_seed(&r, 77, 0);
    for (int heavy = 0; heavy < 2; heavy++)
        for (size_t v = 0; v < 2; v++)
            for (size_t di = 0; di < 2; di++) {
                strata_tensor_list layout, delta, old;
                strata_tensor_list_init(&layout);
                strata_tensor_list_init(&old);
                strata_tensor_list_init(&delta);
                int64_t shape[1] = {N};
                CU_ASSERT_EQUAL_FATAL(strata_tensor_list_add(&layout, "w", 1, shape, NULL),
                                      STRATA_OK);
                strata_tensor_list_copy(&delta, &layout);
                strata_ef *ef = NULL;
                CU_ASSERT_EQUAL_FATAL(strata_ef_new(&layout, 1.0, 0, &ef), STRATA_OK);
                strata_budget b = {STRATA_COMP_TOPK, dens[di], 0, 0, vfs[v]};
                size_t exact_bad = 0, quant_bad = 0;
                for (uint32_t round = 1; round <= 3; round++) {
                    float *d = delta.items[0].data;
                    for (size_t i = 0; i < N; i++) {
                        double z = strata_rng_normal(&r);
                        if (heavy)
                            z /= sqrt(strata_rng_uniform(&r) + 1e-12);
                        d[i] = (float)z;
                    }
                    strata_tensor_list_copy(&old, strata_ef_residuals(ef));
                    strata_clayer *layers = NULL;
                    CU_ASSERT_EQUAL_FATAL(
                        strata_ef_step(ef, &delta, &b, round, round, &layers, NULL), STRATA_OK);
                    CU_ASSERT_EQUAL(layers[0].values_format, vfs[v]);
                    float *dec = malloc(N * sizeof(float));
                    CU_ASSERT_EQUAL_FATAL(strata_clayer_decode(&layers[0], dec, NULL), STRATA_OK);
                    const float *e = old.items[0].data,
                                *en = strata_ef_residuals(ef)->items[0].data;
                    for (size_t i = 0; i < N; i++) {
                        float a = (e[i] + d[i]) + 0.0f;
                        exact_bad += bits(dec[i] + en[i]) != bits(a);
                        quant_bad += bits(en[i]) != bits(a - dec[i]);
                    }
                    free(dec);
                    strata_clayers_free(layers, 1);
                }
                if (exact_bad != 0)
                    printf("\n    %s top-k %g%%, %s: %zu elements not bit-exact ",
                           strata_values_format_name(vfs[v]), 100 * dens[di],
                           heavy ? "heavy-tailed" : "Gaussian", exact_bad);
                CU_ASSERT_EQUAL(quant_bad, 0);
                if (vfs[v] == STRATA_VALUES_TERNARY || !heavy)
                    CU_ASSERT_EQUAL(exact_bad, 0);
                strata_ef_free(ef);
                strata_tensor_list_cleanup(&old);
                strata_tensor_list_cleanup(&delta);
                strata_tensor_list_cleanup(&layout);
            }
}

static double norm(const double *x, size_t n)
{
    double s = 0.0;
    for (size_t i = 0; i < n; i++)
        s += x[i] * x[i];
    return sqrt(s);
}

/* 400 rounds of d_t = g + 0.5 noise, top-k 1%. With EF the gap between the
 * sums of inputs and of transmitted updates equals ||e|| and stops growing;
 * without EF it grows linearly. */
static void test_tracking(void)
{
    enum { N = 10000, ROUNDS = 400 };
    strata_tensor_list layout, delta;
    strata_tensor_list_init(&layout);
    strata_tensor_list_init(&delta);
    int64_t shape[1] = {N};
    CU_ASSERT_EQUAL_FATAL(strata_tensor_list_add(&layout, "w", 1, shape, NULL), STRATA_OK);
    strata_tensor_list_copy(&delta, &layout);
    strata_ef *ef = NULL;
    CU_ASSERT_EQUAL_FATAL(strata_ef_new(&layout, 1.0, 0, &ef), STRATA_OK);
    double *sum_in = calloc(N, sizeof(double)), *tx_ef = calloc(N, sizeof(double));
    double *tx_no = calloc(N, sizeof(double)), *gap = malloc(N * sizeof(double));
    float *g = malloc(N * sizeof(float)), *dec = malloc(N * sizeof(float));
    strata_rng r;
    strata_rng_seed(&r, 8, 0);
    for (int i = 0; i < N; i++)
        g[i] = (float)strata_rng_normal(&r);
    strata_budget b = {STRATA_COMP_TOPK, 0.01, 0, 0, STRATA_VALUES_FP32};
    double dnorm = 0.0, ef_max_early = 0.0, ef_max_late = 0.0, no_200 = 0.0, no_400 = 0.0;
    double inv_err = 0.0;
    for (uint32_t round = 1; round <= ROUNDS; round++) {
        float *d = delta.items[0].data;
        for (int i = 0; i < N; i++)
            d[i] = g[i] + 0.5f * (float)strata_rng_normal(&r);
        if (round == 1) {
            for (int i = 0; i < N; i++)
                dnorm += (double)d[i] * d[i];
            dnorm = sqrt(dnorm);
        }
        strata_clayer *layers = NULL, plain;
        CU_ASSERT_EQUAL_FATAL(strata_ef_step(ef, &delta, &b, round, 1, &layers, NULL), STRATA_OK);
        CU_ASSERT_EQUAL_FATAL(strata_clayer_decode(&layers[0], dec, NULL), STRATA_OK);
        for (int i = 0; i < N; i++) {
            sum_in[i] += d[i];
            tx_ef[i] += dec[i];
        }
        strata_clayers_free(layers, 1);
        CU_ASSERT_EQUAL_FATAL(
            strata_compress(d, N, 1, shape, &b, STRATA_VALUES_FP32, 1, NULL, &plain, NULL),
            STRATA_OK);
        CU_ASSERT_EQUAL_FATAL(strata_clayer_decode(&plain, dec, NULL), STRATA_OK);
        for (int i = 0; i < N; i++)
            tx_no[i] += dec[i];
        strata_clayer_cleanup(&plain);

        for (int i = 0; i < N; i++)
            gap[i] = sum_in[i] - tx_ef[i];
        double ge = norm(gap, N), en;
        CU_ASSERT_EQUAL(strata_ef_residual_norms(ef, &en, 1), STRATA_OK);
        inv_err = fmax(inv_err, fabs(ge - en) / (en + 1e-9));
        if (round > 100 && round <= 200)
            ef_max_early = fmax(ef_max_early, ge);
        if (round > 200)
            ef_max_late = fmax(ef_max_late, ge);
        if (round == 200 || round == 400) {
            for (int i = 0; i < N; i++)
                gap[i] = sum_in[i] - tx_no[i];
            *(round == 200 ? &no_200 : &no_400) = norm(gap, N);
        }
    }
    fprintf(stderr,
            "\n  |delta| %.1f; EF gap max rounds 101-200 %.1f, 201-400 %.1f; no EF gap "
            "@200 %.1f @400 %.1f; | gap - |e| | / |e| <= %.2g\n",
            dnorm, ef_max_early, ef_max_late, no_200, no_400, inv_err);
    CU_ASSERT(inv_err < 1e-4);
    CU_ASSERT(ef_max_late < 100.0 * dnorm);
    CU_ASSERT(ef_max_late < 1.25 * ef_max_early);
    CU_ASSERT(no_400 > 1.8 * no_200);
    CU_ASSERT(no_400 > 4.0 * ef_max_late);
    free(dec);
    free(g);
    free(gap);
    free(tx_no);
    free(tx_ef);
    free(sum_in);
    strata_ef_free(ef);
    strata_tensor_list_cleanup(&delta);
    strata_tensor_list_cleanup(&layout);
}

/* One step and its identity check with the expected decay. */
static void step_and_check(strata_ef *ef, strata_tensor_list *delta, uint32_t round, int mode,
                           float decay, strata_rng *r)
{
    strata_tensor_list old;
    strata_tensor_list_init(&old);
    random_fill(delta, r, 1.0);
    CU_ASSERT_EQUAL_FATAL(strata_tensor_list_copy(&old, strata_ef_residuals(ef)), STRATA_OK);
    strata_budget *b = budgets_for(delta->count, STRATA_COMP_TOPK);
    strata_clayer *layers = NULL;
    CU_ASSERT_EQUAL_FATAL(strata_ef_step(ef, delta, b, round, 3, &layers, NULL), STRATA_OK);
    CU_ASSERT_EQUAL(check_identity(&old, delta, strata_ef_residuals(ef), layers, mode, decay), 0);
    /* The check has teeth: the same layers do not fit another decay. */
    if (mode != 0)
        CU_ASSERT(check_identity(&old, delta, strata_ef_residuals(ef), layers, 0, 1.0f) > 0);
    uint32_t last;
    CU_ASSERT_EQUAL(strata_ef_last_round(ef, &last), STRATA_OK);
    CU_ASSERT_EQUAL(last, round);
    strata_clayers_free(layers, delta->count);
    free(b);
    strata_tensor_list_cleanup(&old);
}

static void test_staleness(void)
{
    strata_tensor_list layout, delta;
    make_layout(&layout, 1);
    strata_tensor_list_init(&delta);
    strata_tensor_list_copy(&delta, &layout);
    strata_rng r;
    strata_rng_seed(&r, 12, 0);
    strata_ef *ef = NULL;
    CU_ASSERT_EQUAL_FATAL(strata_ef_new(&layout, 0.5, 3, &ef), STRATA_OK);
    uint32_t last = 7;
    CU_ASSERT_EQUAL(strata_ef_last_round(ef, &last), STRATA_ESTATE);
    CU_ASSERT_EQUAL(last, 0);
    step_and_check(ef, &delta, 10, 0, 1.0f, &r);   /* first step: plain sum */
    step_and_check(ef, &delta, 11, 0, 1.0f, &r);   /* consecutive */
    step_and_check(ef, &delta, 13, 1, 0.5f, &r);   /* missed 1 */
    step_and_check(ef, &delta, 17, 1, 0.125f, &r); /* missed 3 = max: decayed */
    step_and_check(ef, &delta, 22, 2, 0.0f, &r);   /* missed 4 > 3: dropped */

    /* Rounds must move forward; a refused step changes nothing. */
    strata_tensor_list before;
    strata_tensor_list_init(&before);
    strata_tensor_list_copy(&before, strata_ef_residuals(ef));
    strata_budget *b = budgets_for(layout.count, STRATA_COMP_TOPK);
    strata_clayer dummy;
    strata_clayer *layers = &dummy; /* must be reset to NULL */
    CU_ASSERT_EQUAL(strata_ef_step(ef, &delta, b, 22, 1, &layers, NULL), STRATA_ESTATE);
    CU_ASSERT_PTR_NULL(layers);
    CU_ASSERT_EQUAL(strata_ef_step(ef, &delta, b, 5, 1, &layers, NULL), STRATA_ESTATE);
    const strata_tensor_list *now = strata_ef_residuals(ef);
    for (size_t t = 0; t < layout.count; t++)
        CU_ASSERT_EQUAL(
            memcmp(now->items[t].data, before.items[t].data, now->items[t].numel * sizeof(float)),
            0);
    CU_ASSERT_EQUAL(strata_ef_last_round(ef, &last), STRATA_OK);
    CU_ASSERT_EQUAL(last, 22);
    strata_ef_free(ef);

    /* max_staleness 0 never drops: 100 missed rounds decay by 0.5^100. */
    CU_ASSERT_EQUAL_FATAL(strata_ef_new(&layout, 0.5, 0, &ef), STRATA_OK);
    step_and_check(ef, &delta, 1, 0, 1.0f, &r);
    step_and_check(ef, &delta, 102, 1, (float)pow(0.5, 100), &r);
    strata_ef_free(ef);
    /* beta 1 keeps stale residuals unchanged. */
    CU_ASSERT_EQUAL_FATAL(strata_ef_new(&layout, 1.0, 0, &ef), STRATA_OK);
    step_and_check(ef, &delta, 1, 0, 1.0f, &r);
    step_and_check(ef, &delta, 50, 0, 1.0f, &r);
    strata_ef_free(ef);

    CU_ASSERT_EQUAL(strata_ef_new(&layout, 0.0, 0, &ef), STRATA_EINVAL);
    CU_ASSERT_EQUAL(strata_ef_new(&layout, 1.5, 0, &ef), STRATA_EINVAL);
    CU_ASSERT_EQUAL(strata_ef_new(&layout, NAN, 0, &ef), STRATA_EINVAL);
    CU_ASSERT_PTR_NULL(ef);
    free(b);
    strata_tensor_list_cleanup(&before);
    strata_tensor_list_cleanup(&delta);
    strata_tensor_list_cleanup(&layout);
}

/* A failing step (NaN in the update, bad budget, wrong layout) leaves the
 * residuals and round untouched. */
static void test_step_atomic(void)
{
    strata_tensor_list layout, delta, before;
    make_layout(&layout, 1);
    strata_tensor_list_init(&delta);
    strata_tensor_list_init(&before);
    strata_tensor_list_copy(&delta, &layout);
    strata_rng r;
    strata_rng_seed(&r, 13, 0);
    strata_ef *ef = NULL;
    CU_ASSERT_EQUAL_FATAL(strata_ef_new(&layout, 1.0, 0, &ef), STRATA_OK);
    strata_budget *b = budgets_for(layout.count, STRATA_COMP_TOPK);
    b[1].comp = STRATA_COMP_QSGD;
    strata_clayer *layers = NULL;
    random_fill(&delta, &r, 1.0);
    CU_ASSERT_EQUAL_FATAL(strata_ef_step(ef, &delta, b, 1, 1, &layers, NULL), STRATA_OK);
    strata_clayers_free(layers, layout.count);
    strata_tensor_list_copy(&before, strata_ef_residuals(ef));

    static const struct {
        size_t tensor, pos;
        float v;
    } poison[] = {{4, 49999, NAN}, {4, 7, INFINITY}, {1, 3, NAN}, {3, 0, -INFINITY}};
    for (size_t p = 0; p < sizeof(poison) / sizeof(poison[0]); p++) {
        random_fill(&delta, &r, 1.0);
        float saved = delta.items[poison[p].tensor].data[poison[p].pos];
        delta.items[poison[p].tensor].data[poison[p].pos] = poison[p].v;
        strata_diag d = {{0}};
        CU_ASSERT_EQUAL(strata_ef_step(ef, &delta, b, 2, 1, &layers, &d), STRATA_EINVAL);
        CU_ASSERT_PTR_NULL(layers);
        CU_ASSERT_PTR_NOT_NULL(strstr(d.msg, layout.items[poison[p].tensor].name));
        delta.items[poison[p].tensor].data[poison[p].pos] = saved;
    }
    strata_diag d = {{0}};
    b[2].density = 0.0;
    CU_ASSERT_EQUAL(strata_ef_step(ef, &delta, b, 2, 1, &layers, &d), STRATA_EINVAL);
    CU_ASSERT_PTR_NOT_NULL(strstr(d.msg, "fc.bias"));
    b[2].density = 0.05;
    b[2].values = (strata_values_format)7;
    CU_ASSERT_EQUAL(strata_ef_step(ef, &delta, b, 2, 1, &layers, &d), STRATA_EINVAL);
    b[2].values = STRATA_VALUES_FP32;
    strata_tensor_list small;
    make_layout(&small, 0);
    CU_ASSERT_EQUAL(strata_ef_step(ef, &small, b, 2, 1, &layers, &d), STRATA_EINVAL);
    strata_tensor_list_cleanup(&small);

    const strata_tensor_list *now = strata_ef_residuals(ef);
    for (size_t t = 0; t < layout.count; t++)
        CU_ASSERT_EQUAL(
            memcmp(now->items[t].data, before.items[t].data, now->items[t].numel * sizeof(float)),
            0);
    uint32_t last;
    CU_ASSERT_EQUAL(strata_ef_last_round(ef, &last), STRATA_OK);
    CU_ASSERT_EQUAL(last, 1);
    /* And the same round still works afterwards. */
    CU_ASSERT_EQUAL(strata_ef_step(ef, &delta, b, 2, 1, &layers, NULL), STRATA_OK);
    strata_clayers_free(layers, layout.count);
    free(b);
    strata_ef_free(ef);
    strata_tensor_list_cleanup(&before);
    strata_tensor_list_cleanup(&delta);
    strata_tensor_list_cleanup(&layout);
}

static void test_norms(void)
{
    strata_tensor_list layout, delta;
    make_layout(&layout, 0);
    strata_tensor_list_init(&delta);
    strata_tensor_list_copy(&delta, &layout);
    strata_rng r;
    strata_rng_seed(&r, 14, 0);
    strata_ef *ef = NULL;
    CU_ASSERT_EQUAL_FATAL(strata_ef_new(&layout, 1.0, 0, &ef), STRATA_OK);
    strata_budget *b = budgets_for(layout.count, STRATA_COMP_SIGN);
    strata_clayer *layers = NULL;
    random_fill(&delta, &r, 1.0);
    CU_ASSERT_EQUAL_FATAL(strata_ef_step(ef, &delta, b, 1, 1, &layers, NULL), STRATA_OK);
    double norms[4];
    CU_ASSERT_EQUAL(strata_ef_residual_norms(ef, norms, 4), STRATA_OK);
    CU_ASSERT_EQUAL(strata_ef_residual_norms(ef, norms, 3), STRATA_EINVAL);
    const strata_tensor_list *e = strata_ef_residuals(ef);
    for (size_t t = 0; t < 4; t++) {
        double s = 0.0;
        for (size_t i = 0; i < e->items[t].numel; i++)
            s += (double)e->items[t].data[i] * e->items[t].data[i];
        CU_ASSERT_DOUBLE_EQUAL(norms[t], sqrt(s), 1e-12 * (1.0 + sqrt(s)));
        if (t < 3)
            CU_ASSERT(norms[t] > 0.0);
    }
    CU_ASSERT_EQUAL(norms[3], 0.0); /* sign on one element reproduces it exactly */
    strata_clayers_free(layers, layout.count);
    free(b);
    strata_ef_free(ef);
    strata_tensor_list_cleanup(&delta);
    strata_tensor_list_cleanup(&layout);
}

/* PowerSGD layers are warm-started from the previous step's Q. */
static void test_powersgd_warm_start(void)
{
    strata_tensor_list layout, delta, old;
    make_layout(&layout, 0);
    strata_tensor_list_init(&delta);
    strata_tensor_list_init(&old);
    strata_tensor_list_copy(&delta, &layout);
    strata_rng r;
    strata_rng_seed(&r, 15, 0);
    strata_ef *ef = NULL;
    CU_ASSERT_EQUAL_FATAL(strata_ef_new(&layout, 1.0, 0, &ef), STRATA_OK);
    strata_budget *b = budgets_for(layout.count, STRATA_COMP_POWERSGD);
    strata_clayer *l1 = NULL, *l2 = NULL;
    random_fill(&delta, &r, 1.0);
    CU_ASSERT_EQUAL_FATAL(strata_ef_step(ef, &delta, b, 1, 1, &l1, NULL), STRATA_OK);
    strata_tensor_list_copy(&old, strata_ef_residuals(ef));
    random_fill(&delta, &r, 1.0);
    CU_ASSERT_EQUAL_FATAL(strata_ef_step(ef, &delta, b, 2, 1, &l2, NULL), STRATA_OK);
    for (size_t t = 0; t < 2; t++) { /* conv (4-D) and fc (2-D) */
        const strata_tensor *d = &delta.items[t];
        float *a = malloc(d->numel * sizeof(float));
        for (size_t i = 0; i < d->numel; i++)
            a[i] = (old.items[t].data[i] + d->data[i]) + 0.0f;
        strata_clayer want;
        CU_ASSERT_EQUAL_FATAL(strata_compress(a, d->numel, d->ndim, d->shape, &b[t],
                                              STRATA_VALUES_FP32, 12345,
                                              strata_clayer_powersgd_q(&l1[t]), &want, NULL),
                              STRATA_OK);
        CU_ASSERT_EQUAL(want.count, l2[t].count);
        CU_ASSERT_EQUAL(memcmp(want.values, l2[t].values, want.count * sizeof(float)), 0);
        strata_clayer_cleanup(&want);
        free(a);
    }
    strata_clayers_free(l1, layout.count);
    strata_clayers_free(l2, layout.count);
    free(b);
    strata_ef_free(ef);
    strata_tensor_list_cleanup(&old);
    strata_tensor_list_cleanup(&delta);
    strata_tensor_list_cleanup(&layout);
}

/* Top-k EF on a layer above the OpenMP threshold: 1 and 2 threads agree. */
static void test_threads(void)
{
    strata_tensor_list layout, delta;
    strata_tensor_list_init(&layout);
    strata_tensor_list_init(&delta);
    int64_t shape[1] = {(1 << 20) + 5};
    CU_ASSERT_EQUAL_FATAL(strata_tensor_list_add(&layout, "w", 1, shape, NULL), STRATA_OK);
    strata_tensor_list_copy(&delta, &layout);
    strata_ef *ef[2] = {NULL, NULL};
    strata_clayer *out[2] = {NULL, NULL};
    strata_budget b = {STRATA_COMP_TOPK, 0.01, 0, 0, STRATA_VALUES_FP16};
    strata_rng r;
    strata_rng_seed(&r, 16, 0);
    int saved = omp_get_max_threads();
    for (uint32_t round = 1; round <= 2; round++) {
        random_fill(&delta, &r, 1.0);
        for (int t = 0; t < 2; t++) {
            if (round == 1)
                CU_ASSERT_EQUAL_FATAL(strata_ef_new(&layout, 0.9, 0, &ef[t]), STRATA_OK);
            omp_set_num_threads(t + 1);
            CU_ASSERT_EQUAL_FATAL(strata_ef_step(ef[t], &delta, &b, round * 2, 1, &out[t], NULL),
                                  STRATA_OK);
        }
        CU_ASSERT_EQUAL(out[0][0].count, out[1][0].count);
        CU_ASSERT_EQUAL(
            memcmp(out[0][0].indices, out[1][0].indices, out[0][0].count * sizeof(uint32_t)), 0);
        CU_ASSERT_EQUAL(memcmp(out[0][0].values, out[1][0].values, out[0][0].count * sizeof(float)),
                        0);
        CU_ASSERT_EQUAL(memcmp(strata_ef_residuals(ef[0])->items[0].data,
                               strata_ef_residuals(ef[1])->items[0].data,
                               (size_t)shape[0] * sizeof(float)),
                        0);
        for (int t = 0; t < 2; t++)
            strata_clayers_free(out[t], 1);
    }
    omp_set_num_threads(saved);
    strata_ef_free(ef[0]);
    strata_ef_free(ef[1]);
    strata_tensor_list_cleanup(&delta);
    strata_tensor_list_cleanup(&layout);
}

static int same_residuals(const strata_ef *x, const strata_ef *y)
{
    const strata_tensor_list *a = strata_ef_residuals(x), *b = strata_ef_residuals(y);
    if (!strata_tensor_list_same_layout(a, b))
        return 0;
    for (size_t t = 0; t < a->count; t++)
        if (memcmp(a->items[t].data, b->items[t].data, a->items[t].numel * sizeof(float)) != 0)
            return 0;
    return 1;
}

static void test_save_load(void)
{
    char *dir = strata_test_tmpdir();
    CU_ASSERT_PTR_NOT_NULL_FATAL(dir);
    char path[600], other[600];
    snprintf(path, sizeof(path), "%s/ef.safetensors", dir);
    snprintf(other, sizeof(other), "%s/other.safetensors", dir);
    strata_tensor_list layout, delta;
    make_layout(&layout, 0);
    strata_tensor_list_init(&delta);
    strata_tensor_list_copy(&delta, &layout);
    strata_rng r;
    strata_rng_seed(&r, 17, 0);
    strata_ef *ef = NULL, *back = NULL;
    strata_diag d = {{0}};
    CU_ASSERT_EQUAL_FATAL(strata_ef_new(&layout, 0.7, 5, &ef), STRATA_OK);

    /* Before any step: the round is "none". */
    CU_ASSERT_EQUAL_FATAL(strata_ef_save(ef, path, &d), STRATA_OK);
    CU_ASSERT_EQUAL_FATAL(strata_ef_load(path, &layout, &back, &d), STRATA_OK);
    uint32_t last;
    CU_ASSERT_EQUAL(strata_ef_last_round(back, &last), STRATA_ESTATE);
    /* The settings saved are the ones loaded; new ones replace them (and
     * are saved with the residuals); a bad beta changes nothing. */
    int changed = -1;
    CU_ASSERT_EQUAL(strata_ef_configure(back, 0.7, 5, &changed), STRATA_OK);
    CU_ASSERT_EQUAL(changed, 0);
    CU_ASSERT_EQUAL(strata_ef_configure(back, 0.5, 2, &changed), STRATA_OK);
    CU_ASSERT_EQUAL(changed, 1);
    CU_ASSERT_EQUAL(strata_ef_configure(back, 0.0, 2, &changed), STRATA_EINVAL);
    CU_ASSERT_EQUAL(strata_ef_configure(NULL, 0.5, 2, &changed), STRATA_EINVAL);
    CU_ASSERT_EQUAL_FATAL(strata_ef_save(back, other, &d), STRATA_OK);
    strata_ef_free(back);
    back = NULL;
    CU_ASSERT_EQUAL_FATAL(strata_ef_load(other, &layout, &back, &d), STRATA_OK);
    CU_ASSERT_EQUAL(strata_ef_configure(back, 0.5, 2, &changed), STRATA_OK);
    CU_ASSERT_EQUAL(changed, 0);
    strata_ef_free(back);
    back = NULL;

    strata_budget *b = budgets_for(layout.count, STRATA_COMP_TOPK);
    for (uint32_t round = 1; round <= 3; round++) {
        strata_clayer *layers = NULL;
        random_fill(&delta, &r, 1.0);
        CU_ASSERT_EQUAL_FATAL(strata_ef_step(ef, &delta, b, round, 1, &layers, NULL), STRATA_OK);
        strata_clayers_free(layers, layout.count);
    }
    CU_ASSERT_EQUAL_FATAL(strata_ef_save(ef, path, &d), STRATA_OK);
    CU_ASSERT_EQUAL_FATAL(strata_ef_load(path, &layout, &back, &d), STRATA_OK);
    CU_ASSERT(same_residuals(ef, back));
    CU_ASSERT_EQUAL(strata_ef_last_round(back, &last), STRATA_OK);
    CU_ASSERT_EQUAL(last, 3);
    /* beta and max_staleness survive: the same stale step gives the same
     * result (missed 2: decay 0.49), and missed 6 > 5 drops in both. */
    static const uint32_t next_rounds[2] = {6, 13};
    for (int s = 0; s < 2; s++) {
        strata_clayer *l1 = NULL, *l2 = NULL;
        random_fill(&delta, &r, 1.0);
        CU_ASSERT_EQUAL_FATAL(strata_ef_step(ef, &delta, b, next_rounds[s], 1, &l1, NULL),
                              STRATA_OK);
        CU_ASSERT_EQUAL_FATAL(strata_ef_step(back, &delta, b, next_rounds[s], 1, &l2, NULL),
                              STRATA_OK);
        CU_ASSERT(same_residuals(ef, back));
        CU_ASSERT_EQUAL(memcmp(l1[0].values, l2[0].values, l1[0].count * sizeof(float)), 0);
        strata_clayers_free(l1, layout.count);
        strata_clayers_free(l2, layout.count);
    }
    strata_ef_free(back);
    back = NULL;

    /* Layout mismatches are refused with a message naming the tensor. */
    static const struct {
        const char *name;
        int ndim;
        int64_t shape[4];
        int drop_last, swap;
    } wrong[] = {
        {"fc.weight", 2, {24, 32}, 0, 0}, /* transposed */
        {"fc.w", 2, {32, 24}, 0, 0},      /* renamed */
        {"fc.weight", 1, {768}, 0, 0},    /* flattened */
        {NULL, 0, {0}, 1, 0},             /* a tensor missing */
        {NULL, 0, {0}, 0, 1},             /* order changed */
    };
    for (size_t w = 0; w < sizeof(wrong) / sizeof(wrong[0]); w++) {
        strata_tensor_list l2;
        strata_tensor_list_init(&l2);
        size_t count = wrong[w].drop_last ? layout.count - 1 : layout.count;
        for (size_t t = 0; t < count; t++) {
            size_t src = wrong[w].swap && t < 2 ? 1 - t : t;
            const strata_tensor *x = &layout.items[src];
            if (src == 1 && wrong[w].name != NULL)
                strata_tensor_list_add(&l2, wrong[w].name, wrong[w].ndim, wrong[w].shape, NULL);
            else
                strata_tensor_list_add(&l2, x->name, x->ndim, x->shape, NULL);
        }
        d.msg[0] = '\0';
        CU_ASSERT_EQUAL(strata_ef_load(path, &l2, &back, &d), STRATA_EINVAL);
        CU_ASSERT_PTR_NULL(back);
        CU_ASSERT(d.msg[0] != '\0');
        if (!wrong[w].drop_last)
            CU_ASSERT_PTR_NOT_NULL(strstr(d.msg, "weight"));
        strata_tensor_list_cleanup(&l2);
    }
    /* A plain tensor file (no error-feedback metadata) and non-finite
     * residuals are malformed; a missing file is an I/O error. */
    strata_tensor_list plain;
    strata_tensor_list_init(&plain);
    strata_tensor_list_copy(&plain, &layout);
    CU_ASSERT_EQUAL(strata_safetensors_write(other, &plain, NULL, NULL), STRATA_OK);
    CU_ASSERT_EQUAL(strata_ef_load(other, &layout, &back, &d), STRATA_EPROTO);
    strata_metadata meta;
    strata_metadata_init(&meta);
    strata_metadata_set(&meta, "strata.ef.version", "1");
    strata_metadata_set(&meta, "strata.ef.last_round", "4");
    strata_metadata_set(&meta, "strata.ef.beta", "0.5");
    strata_metadata_set(&meta, "strata.ef.max_staleness", "0");
    CU_ASSERT_EQUAL(strata_safetensors_write(other, &plain, &meta, NULL), STRATA_OK);
    CU_ASSERT_EQUAL(strata_ef_load(other, &layout, &back, &d), STRATA_OK);
    strata_ef_free(back);
    back = NULL;
    strata_metadata_set(&meta, "strata.ef.beta", "2");
    CU_ASSERT_EQUAL(strata_safetensors_write(other, &plain, &meta, NULL), STRATA_OK);
    CU_ASSERT_EQUAL(strata_ef_load(other, &layout, &back, &d), STRATA_EPROTO);
    strata_metadata_set(&meta, "strata.ef.beta", "0.5");
    strata_metadata_set(&meta, "strata.ef.last_round", "-1");
    CU_ASSERT_EQUAL(strata_safetensors_write(other, &plain, &meta, NULL), STRATA_OK);
    CU_ASSERT_EQUAL(strata_ef_load(other, &layout, &back, &d), STRATA_EPROTO);
    strata_metadata_set(&meta, "strata.ef.last_round", "4");
    plain.items[1].data[5] = NAN;
    CU_ASSERT_EQUAL(strata_safetensors_write(other, &plain, &meta, NULL), STRATA_OK);
    CU_ASSERT_EQUAL(strata_ef_load(other, &layout, &back, &d), STRATA_EPROTO);
    CU_ASSERT_PTR_NULL(back);
    snprintf(other, sizeof(other), "%s/missing.safetensors", dir);
    CU_ASSERT_EQUAL(strata_ef_load(other, &layout, &back, &d), STRATA_EIO);
    strata_metadata_cleanup(&meta);
    strata_tensor_list_cleanup(&plain);

    free(b);
    strata_ef_free(ef);
    strata_tensor_list_cleanup(&delta);
    strata_tensor_list_cleanup(&layout);
    strata_test_rmtree(dir);
    free(dir);
}

/* The lgreco error table: each entry is the squared error the step with
 * that candidate leaves (the new residual's squared norm, for a step from
 * the same state), for every family and values format; computing it moves
 * nothing; bad candidates and a stale round are refused. */
static void test_error_table(void)
{
    static const strata_budget cand[] = {
        {STRATA_COMP_TOPK, 0.01, 0, 0, STRATA_VALUES_FP32},
        {STRATA_COMP_TOPK, 0.1, 0, 0, STRATA_VALUES_INT8},
        {STRATA_COMP_TOPK, 0.1, 0, 0, STRATA_VALUES_TERNARY},
        {STRATA_COMP_RANDK, 0.05, 0, 0, STRATA_VALUES_FP16},
        {STRATA_COMP_QSGD, 1.0, 4, 0, STRATA_VALUES_FP32},
        {STRATA_COMP_SIGN, 1.0, 0, 0, STRATA_VALUES_FP32},
        {STRATA_COMP_POWERSGD, 1.0, 0, 2, STRATA_VALUES_FP32},
        {STRATA_COMP_FP16, 1.0, 0, 0, STRATA_VALUES_FP32},
        {STRATA_COMP_NONE, 1.0, 0, 0, STRATA_VALUES_FP32},
    };
    const size_t C = sizeof(cand) / sizeof(cand[0]);
    strata_tensor_list layout, delta;
    make_layout(&layout, 1);
    strata_tensor_list_init(&delta);
    strata_tensor_list_copy(&delta, &layout);
    strata_rng r;
    strata_rng_seed(&r, 5, 0);
    strata_ef *ef = NULL;
    CU_ASSERT_EQUAL_FATAL(strata_ef_new(&layout, 0.5, 0, &ef), STRATA_OK);
    /* a first step leaves a residual, and round 3 then misses round 2 (decay) */
    strata_budget *b = budgets_for(layout.count, STRATA_COMP_TOPK);
    strata_clayer *layers = NULL;
    random_fill(&delta, &r, 1.0);
    CU_ASSERT_EQUAL_FATAL(strata_ef_step(ef, &delta, b, 1, 7, &layers, NULL), STRATA_OK);
    strata_clayers_free(layers, layout.count);
    random_fill(&delta, &r, 1.0);
    const size_t L = layout.count;
    double *err = calloc(L * C, sizeof(double));
    CU_ASSERT_EQUAL_FATAL(strata_ef_error_table(ef, &delta, 3, 11, cand, C, err, NULL), STRATA_OK);
    /* a real step with candidate c leaves exactly err[.][c] as its residual */
    for (size_t c = 0; c < C; c++) {
        char path[] = "/tmp/strata-ef-table-XXXXXX";
        int fd = mkstemp(path);
        CU_ASSERT_FATAL(fd >= 0);
        close(fd);
        CU_ASSERT_EQUAL_FATAL(strata_ef_save(ef, path, NULL), STRATA_OK);
        strata_ef *copy = NULL;
        CU_ASSERT_EQUAL_FATAL(strata_ef_load(path, &layout, &copy, NULL), STRATA_OK);
        unlink(path);
        strata_budget one[8];
        for (size_t l = 0; l < L; l++)
            one[l] = cand[c];
        CU_ASSERT_EQUAL_FATAL(strata_ef_step(copy, &delta, one, 3, 11, &layers, NULL), STRATA_OK);
        strata_clayers_free(layers, L);
        double norms[8];
        CU_ASSERT_EQUAL_FATAL(strata_ef_residual_norms(copy, norms, L), STRATA_OK);
        for (size_t l = 0; l < L; l++) {
            double want = norms[l] * norms[l], got = err[l * C + c];
            if (cand[c].comp == STRATA_COMP_POWERSGD) /* the copy starts without warm Q */
                continue;
            if (fabs(got - want) > 1e-6 * (want + 1e-12))
                fprintf(stderr, "\ncandidate %zu layer %zu: table %.9g, step %.9g\n", c, l, got,
                        want);
            CU_ASSERT(fabs(got - want) <= 1e-6 * (want + 1e-12));
        }
        strata_ef_free(copy);
    }
    /* dense fp32 leaves nothing; top-k at 1% leaves more than at 10% int8 */
    CU_ASSERT_EQUAL(err[4 * C + 8], 0.0);
    CU_ASSERT(err[4 * C + 0] > err[4 * C + 1]);
    /* nothing moved: the step of round 3 still works, and a round not after
     * the last step or a bad candidate is refused */
    uint32_t last = 0;
    CU_ASSERT_EQUAL(strata_ef_last_round(ef, &last), STRATA_OK);
    CU_ASSERT_EQUAL(last, 1);
    CU_ASSERT_EQUAL(strata_ef_error_table(ef, &delta, 1, 11, cand, C, err, NULL), STRATA_ESTATE);
    strata_budget badc = {STRATA_COMP_SIGN, 1.0, 0, 0, STRATA_VALUES_INT8};
    strata_diag d = {{0}};
    CU_ASSERT_EQUAL(strata_ef_error_table(ef, &delta, 3, 11, &badc, 1, err, &d), STRATA_EINVAL);
    CU_ASSERT_PTR_NOT_NULL(strstr(d.msg, "candidate 0"));
    free(err);
    free(b);
    strata_ef_free(ef);
    strata_tensor_list_cleanup(&delta);
    strata_tensor_list_cleanup(&layout);
}

int main(void)
{
    CU_TestInfo tests[] = {
        {"identity for every compressor", test_identity_all_compressors},
        {"lgreco error table equals each candidate's residual", test_error_table},
        {"identity: top-k int8 and ternary, Gaussian and heavy-tailed",
         test_identity_quantised_topk},
        {"EF tracks the input sum, no EF drifts", test_tracking},
        {"staleness decay and drop", test_staleness},
        {"failed steps change nothing", test_step_atomic},
        {"residual norms", test_norms},
        {"powersgd warm start", test_powersgd_warm_start},
        {"1 and 2 threads agree", test_threads},
        {"save/load round trip, layout mismatch", test_save_load},
        CU_TEST_INFO_NULL,
    };
    CU_SuiteInfo suites[] = {
        {"ef", NULL, NULL, NULL, NULL, tests},
        CU_SUITE_INFO_NULL,
    };
    return strata_test_run(suites);
}
