/* Compressors and the dense decoder of compressed layers (see
 * strata/compress.h). Top-k lives in topk.c, PowerSGD in powersgd.c. */
#include "compress_internal.h"
#include "strata/rng.h"

#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* RNG stream ids, one per compressor that draws random numbers. */
#define STREAM_RANDK 0x72616e646bULL /* "randk" */
#define STREAM_QSGD 0x71736764ULL    /* "qsgd" */
#define STREAM_INT8 0x696e7438ULL    /* "int8" */

static const char *const COMP_NAMES[STRATA_COMP_COUNT] = {"none",  "fp16", "bf16", "topk",
                                                          "randk", "qsgd", "sign", "powersgd"};

const char *strata_comp_name(strata_compressor_id id)
{
    if ((unsigned)id >= STRATA_COMP_COUNT)
        return "?";
    return COMP_NAMES[id];
}

static const char *const VALUES_NAMES[STRATA_VALUES_COUNT] = {"fp32", "fp16", "bf16", "int8",
                                                              "ternary"};

const char *strata_values_format_name(strata_values_format f)
{
    if ((unsigned)f >= STRATA_VALUES_COUNT)
        return "?";
    return VALUES_NAMES[f];
}

int strata_values_format_parse(const char *name, strata_values_format *out)
{
    if (out != NULL)
        *out = STRATA_VALUES_FP32;
    if (name == NULL || out == NULL)
        return STRATA_EINVAL;
    for (int i = 0; i < STRATA_VALUES_COUNT; i++)
        if (strcmp(name, VALUES_NAMES[i]) == 0) {
            *out = (strata_values_format)i;
            return STRATA_OK;
        }
    return STRATA_EINVAL;
}

strata_values_format strata_values_format_for(strata_compressor_id comp, strata_values_format vf)
{
    if (STRATA_VALUES_QUANTISED(vf) && comp != STRATA_COMP_TOPK && comp != STRATA_COMP_RANDK)
        return STRATA_VALUES_FP32;
    return vf;
}

strata_budget strata_budget_whole(strata_values_format vf)
{
    strata_budget b = {.comp = STRATA_COMP_NONE,
                       .density = 1.0,
                       .values = strata_values_format_for(STRATA_COMP_NONE, vf)};
    return b;
}

int strata_comp_from_name(const char *name, strata_compressor_id *out)
{
    if (out != NULL)
        *out = STRATA_COMP_NONE;
    if (name == NULL || out == NULL)
        return STRATA_EINVAL;
    for (int i = 0; i < STRATA_COMP_COUNT; i++)
        if (strcmp(name, COMP_NAMES[i]) == 0) {
            *out = (strata_compressor_id)i;
            return STRATA_OK;
        }
    return STRATA_EINVAL;
}

void strata_clayer_cleanup(strata_clayer *c)
{
    if (c == NULL)
        return;
    free(c->indices);
    free(c->values);
    free(c->qlevels);
    free(c->signbits);
    memset(c, 0, sizeof(*c));
}

void strata_clayers_free(strata_clayer *c, size_t n)
{
    if (c == NULL)
        return;
    for (size_t i = 0; i < n; i++)
        strata_clayer_cleanup(&c[i]);
    free(c);
}

/* ---- half precision ---- */

static uint32_t f2u(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof(u));
    return u;
}

static float u2f(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
}

uint16_t strata_f32_to_f16(float f)
{
    uint32_t x = f2u(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    uint32_t ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) /* NaN: keep the top payload bits, force quiet */
        return (uint16_t)(sign | 0x7e00u | ((ax >> 13) & 0x3ffu));
    if (ax >= 0x477ff000u) /* >= 65520 rounds to infinity */
        return (uint16_t)(sign | 0x7c00u);
    if (ax >= 0x38800000u) { /* normal half: rebias, round 13 bits away */
        uint32_t r = ax - ((uint32_t)(127 - 15) << 23);
        r = (r + 0x0fffu + ((r >> 13) & 1u)) >> 13;
        return (uint16_t)(sign | r);
    }
    if (ax < 0x33000000u) /* below 2^-25: rounds to zero (2^-25 ties to 0) */
        return sign;
    /* Subnormal half: round m * 2^(e - 150) to a multiple of 2^-24. */
    uint32_t e = ax >> 23, m = (ax & 0x7fffffu) | 0x800000u;
    unsigned s = 126 - e; /* 14..25 */
    uint32_t q = m >> s, rem = m & ((1u << s) - 1), half = 1u << (s - 1);
    if (rem > half || (rem == half && (q & 1u)))
        q++;
    return (uint16_t)(sign | q);
}

float strata_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
    if (exp == 0) {
        float v = (float)man * 0x1p-24f;
        return sign ? -v : v;
    }
    if (exp == 31)
        return u2f(sign | 0x7f800000u | (man << 13));
    return u2f(sign | ((exp + 112) << 23) | (man << 13));
}

uint16_t strata_f32_to_bf16(float f)
{
    uint32_t x = f2u(f);
    if ((x & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((x >> 16) | 0x40u);
    return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

float strata_bf16_to_f32(uint16_t h)
{
    return u2f((uint32_t)h << 16);
}

float strata__round_vf(float x, strata_values_format vf)
{
    uint16_t h;
    switch (vf) {
    case STRATA_VALUES_FP16:
        h = strata_f32_to_f16(x);
        if ((h & 0x7fffu) == 0x7c00u)
            h = (uint16_t)((h & 0x8000u) | 0x7bffu);
        return strata_f16_to_f32(h);
    case STRATA_VALUES_BF16:
        h = strata_f32_to_bf16(x);
        if ((h & 0x7fffu) == 0x7f80u)
            h = (uint16_t)((h & 0x8000u) | 0x7f7fu);
        return strata_bf16_to_f32(h);
    default:
        return x;
    }
}

/* ---- budgets and shapes ---- */

uint64_t strata_comp_kept(double density, uint64_t numel)
{
    if (numel == 0)
        return 0;
    if (!(density > 0.0))
        return 1;
    double k = floor(density * (double)numel);
    if (k >= (double)numel)
        return numel;
    return k < 1.0 ? 1 : (uint64_t)k;
}

/* The compressor-specific part of strata_budget_check. */
static int budget_param_check(const strata_budget *b, strata_diag *diag)
{
    switch (b->comp) {
    case STRATA_COMP_NONE:
    case STRATA_COMP_FP16:
    case STRATA_COMP_BF16:
    case STRATA_COMP_SIGN:
        return STRATA_OK;
    case STRATA_COMP_TOPK:
    case STRATA_COMP_RANDK:
        if (!(b->density > 0.0 && b->density <= 1.0))
            return strata_diag_set(diag, STRATA_EINVAL, "%s density %g is not in (0, 1]",
                                   strata_comp_name(b->comp), b->density);
        return STRATA_OK;
    case STRATA_COMP_QSGD:
        if (b->levels < 1 || b->levels > 127)
            return strata_diag_set(diag, STRATA_EINVAL, "qsgd levels %u is not in [1, 127]",
                                   b->levels);
        return STRATA_OK;
    case STRATA_COMP_POWERSGD:
        if (b->rank < 1)
            return strata_diag_set(diag, STRATA_EINVAL, "powersgd rank must be at least 1");
        return STRATA_OK;
    }
    return strata_diag_set(diag, STRATA_EINVAL, "unknown compressor id %d", (int)b->comp);
}

int strata_budget_check(const strata_budget *b, strata_diag *diag)
{
    if (b == NULL)
        return strata_diag_set(diag, STRATA_EINVAL, "budget is NULL");
    int rc = budget_param_check(b, diag);
    if (rc < 0)
        return rc;
    if ((unsigned)b->values >= STRATA_VALUES_COUNT)
        return strata_diag_set(diag, STRATA_EINVAL, "unknown values format %d", (int)b->values);
    int sparse = b->comp == STRATA_COMP_TOPK || b->comp == STRATA_COMP_RANDK;
    int floats = sparse || b->comp == STRATA_COMP_NONE || b->comp == STRATA_COMP_POWERSGD;
    if ((!floats && b->values != STRATA_VALUES_FP32) ||
        (!sparse && (unsigned)b->values > STRATA_VALUES_BF16))
        return strata_diag_set(diag, STRATA_EINVAL, "%s does not take values %s%s",
                               strata_comp_name(b->comp), strata_values_format_name(b->values),
                               floats ? " (only topk and randk do)" : " (its values are fixed)");
    return STRATA_OK;
}

int strata_powersgd_dims(int ndim, const int64_t *shape, uint32_t rank, uint32_t *rows,
                         uint32_t *cols, uint32_t *rank_eff)
{
    size_t numel;
    *rows = *cols = *rank_eff = 0;
    if (ndim < 2 || shape == NULL || rank == 0)
        return STRATA_EINVAL;
    int rc = strata_shape_numel(ndim, shape, &numel);
    if (rc < 0)
        return STRATA_EINVAL;
    if (numel > STRATA_CLAYER_MAX_NUMEL)
        return STRATA_EINVAL;
    uint64_t r = (uint64_t)shape[0], c = numel / r;
    *rows = (uint32_t)r;
    *cols = (uint32_t)c;
    uint64_t m = r < c ? r : c;
    *rank_eff = (uint32_t)(rank < m ? rank : m);
    return STRATA_OK;
}

/* ---- compressors ---- */

static int check_finite(const float *a, size_t n, strata_diag *diag)
{
    uint32_t worst = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t k = strata__mag_key(a[i]);
        worst = k > worst ? k : worst;
    }
    if (worst >= STRATA__KEY_NONFINITE)
        return strata_diag_set(diag, STRATA_EINVAL, "input contains a NaN or infinite value");
    return STRATA_OK;
}

static int compress_dense(const float *a, size_t n, strata_compressor_id comp,
                          strata_values_format vf, strata_clayer *out)
{
    if (comp == STRATA_COMP_FP16)
        vf = STRATA_VALUES_FP16;
    else if (comp == STRATA_COMP_BF16)
        vf = STRATA_VALUES_BF16;
    out->values = malloc(n * sizeof(float));
    if (out->values == NULL)
        return STRATA_ENOMEM;
    for (size_t i = 0; i < n; i++)
        out->values[i] = strata__round_vf(a[i], vf);
    out->comp = comp;
    out->values_format = vf;
    out->count = n;
    return STRATA_OK;
}

/* Largest 8-significant-bit (bfloat16-representable) float >= x > 0. */
static float round_up_bf16(float x)
{
    uint32_t u = f2u(x);
    if ((u & 0xffffu) != 0)
        u = (u | 0xffffu) + 1u;
    return u2f(u);
}

int strata__quantise_kept(strata_clayer *c, strata_values_format vf, uint64_t seed,
                          const uint32_t *idx, float *dst)
{
    const size_t k = (size_t)c->count;
    float *v = c->values;
    float scale = 0.0f;
    if (vf == STRATA_VALUES_INT8) {
        c->qlevels = malloc(k > 0 ? k : 1);
        if (c->qlevels == NULL)
            return STRATA_ENOMEM;
        float mx = 0.0f;
        for (size_t j = 0; j < k; j++)
            mx = fmaxf(mx, fabsf(v[j]));
        if (mx > 0.0f)
            scale = round_up_bf16(mx / 127.0f);
        while (!isfinite(scale * 127.0f)) /* only near FLT_MAX: q is capped */
            scale = u2f(f2u(scale) - 0x10000u);
        strata_rng r;
        strata_rng_seed(&r, seed, STREAM_INT8);
        for (size_t j = 0; j < k; j++) {
            int q = 0;
            if (scale > 0.0f) {
                double x = fabs((double)v[j]) / (double)scale, fl = floor(x);
                q = (int)fl;
                if (strata_rng_uniform(&r) < x - fl)
                    q++;
                if (q > 127)
                    q = 127;
            }
            c->qlevels[j] = (int8_t)(v[j] < 0.0f ? -q : q);
        }
        for (size_t j = 0; j < k; j++) {
            float raw = v[j];
            v[j] = scale * (float)c->qlevels[j]; /* 8 x 7 significant bits: exact */
            if (dst != NULL)
                dst[idx[j]] = raw - v[j];
        }
    } else {
        double sum = 0.0;
        float mn = INFINITY;
        for (size_t j = 0; j < k; j++) {
            float m = fabsf(v[j]);
            sum += (double)m;
            if (m > 0.0f)
                mn = fminf(mn, m);
        }
        if (k > 0 && sum > 0.0) {
            double mu = sum / (double)k;
            if (mu > 2.0 * (double)mn)
                mu = 2.0 * (double)mn;
            scale = u2f(f2u((float)mu) & 0xffff0000u); /* truncate to 8 bits */
        }
        for (size_t j = 0; j < k; j++) {
            float raw = v[j];
            v[j] = raw < 0.0f && scale > 0.0f ? -scale : scale;
            if (dst != NULL)
                dst[idx[j]] = raw - v[j];
        }
    }
    c->scale = scale;
    c->values_format = vf;
    return STRATA_OK;
}

int strata__clayer_topk(const strata__topk_in *in, size_t n, double density,
                        strata_values_format vf, uint64_t seed, strata_clayer *out)
{
    size_t k = (size_t)strata_comp_kept(density, n);
    out->indices = malloc(k * sizeof(uint32_t));
    out->values = malloc(k * sizeof(float));
    if (out->indices == NULL || out->values == NULL)
        return STRATA_ENOMEM;
    const int quant = STRATA_VALUES_QUANTISED(vf);
    int rc = strata__topk_run(in, n, k, quant ? STRATA_VALUES_FP32 : vf, out->indices, out->values);
    if (rc < 0)
        return rc;
    out->comp = STRATA_COMP_TOPK;
    out->values_format = quant ? STRATA_VALUES_FP32 : vf;
    out->count = k;
    if (quant)
        return strata__quantise_kept(out, vf, seed, out->indices,
                                     in->mode != STRATA__TOPK_SRC ? in->dst : NULL);
    return STRATA_OK;
}

static int compress_randk(const float *a, size_t n, double density, strata_values_format vf,
                          uint64_t seed, strata_clayer *out)
{
    size_t k = (size_t)strata_comp_kept(density, n);
    uint32_t *idx = malloc(k * sizeof(uint32_t));
    out->values = malloc(k * sizeof(float));
    int rc = STRATA_ENOMEM;
    if (idx == NULL || out->values == NULL)
        goto out;
    rc = strata_randk_indices(seed, n, k, idx);
    if (rc < 0)
        goto out;
    const int quant = STRATA_VALUES_QUANTISED(vf);
    for (size_t j = 0; j < k; j++)
        out->values[j] = quant ? a[idx[j]] : strata__round_vf(a[idx[j]], vf);
    out->comp = STRATA_COMP_RANDK;
    out->values_format = quant ? STRATA_VALUES_FP32 : vf;
    out->count = k;
    out->seed = seed;
    if (quant)
        rc = strata__quantise_kept(out, vf, seed, idx, NULL);
out:
    free(idx);
    return rc;
}

/* |q| <= levels, so the quotient is at most 1 in magnitude and the product
 * at most scale: finite for every finite scale (scale * q could overflow). */
static inline float qsgd_value(float scale, int q, uint32_t levels)
{
    return scale * ((float)q / (float)levels);
}

static int compress_qsgd(const float *a, size_t n, uint32_t levels, uint64_t seed,
                         strata_clayer *out, strata_diag *diag)
{
    double ss = 0.0;
    for (size_t i = 0; i < n; i++)
        ss += (double)a[i] * (double)a[i];
    float scale = (float)sqrt(ss);
    if (!isfinite(scale))
        return strata_diag_set(diag, STRATA_EINVAL, "qsgd: the L2 norm overflows float32");
    out->qlevels = malloc(n);
    if (out->qlevels == NULL)
        return STRATA_ENOMEM;
    strata_rng r;
    strata_rng_seed(&r, seed, STREAM_QSGD);
    const double s = (double)levels;
    for (size_t i = 0; i < n; i++) {
        int q = 0;
        if (scale > 0.0f) {
            double x = fabs((double)a[i]) / (double)scale * s;
            double fl = floor(x);
            q = (int)fl;
            if (strata_rng_uniform(&r) < x - fl)
                q++;
            if (q > (int)levels)
                q = (int)levels;
        }
        out->qlevels[i] = (int8_t)(a[i] < 0.0f ? -q : q);
    }
    out->comp = STRATA_COMP_QSGD;
    out->values_format = STRATA_VALUES_FP32;
    out->scale = scale;
    out->levels = levels;
    out->count = 0;
    return STRATA_OK;
}

static int compress_sign(const float *a, size_t n, strata_clayer *out)
{
    double sum = 0.0;
    for (size_t i = 0; i < n; i++)
        sum += fabs((double)a[i]);
    out->signbits = calloc((n + 7) / 8, 1);
    if (out->signbits == NULL)
        return STRATA_ENOMEM;
    for (size_t i = 0; i < n; i++)
        if (a[i] < 0.0f)
            out->signbits[i / 8] |= (uint8_t)(1u << (i % 8));
    out->comp = STRATA_COMP_SIGN;
    out->values_format = STRATA_VALUES_FP32;
    out->scale = (float)(sum / (double)n);
    out->count = 0;
    return STRATA_OK;
}

int strata_compress(const float *a, size_t n, int ndim, const int64_t *shape,
                    const strata_budget *b, strata_values_format vf, uint64_t seed,
                    const float *q_warm, strata_clayer *out, strata_diag *diag)
{
    if (out != NULL)
        memset(out, 0, sizeof(*out));
    if (a == NULL || b == NULL || out == NULL || (ndim > 0 && shape == NULL))
        return strata_diag_set(diag, STRATA_EINVAL, "compress: NULL argument");
    if ((unsigned)vf >= STRATA_VALUES_COUNT)
        return strata_diag_set(diag, STRATA_EINVAL, "compress: unknown values format %d", (int)vf);
    int rc = strata_budget_check(b, diag);
    if (rc < 0)
        return rc;
    if (STRATA_VALUES_QUANTISED(vf) && b->comp != STRATA_COMP_TOPK && b->comp != STRATA_COMP_RANDK)
        return strata_diag_set(diag, STRATA_EINVAL,
                               "compress: values format %s applies only to topk and randk, not %s",
                               strata_values_format_name(vf), strata_comp_name(b->comp));
    size_t numel;
    if (strata_shape_numel(ndim, shape, &numel) < 0 || numel != n)
        return strata_diag_set(diag, STRATA_EINVAL,
                               "compress: the shape does not describe %zu elements", n);
    if (n > STRATA_CLAYER_MAX_NUMEL)
        return strata_diag_set(diag, STRATA_ETOOBIG, "compress: %zu elements exceed the limit", n);
    if (b->comp != STRATA_COMP_TOPK) {
        rc = check_finite(a, n, diag);
        if (rc < 0)
            return rc;
    }
    out->numel = n;
    switch (b->comp) {
    case STRATA_COMP_TOPK: {
        strata__topk_in in = {STRATA__TOPK_SRC, a, NULL, 1.0f, NULL};
        rc = strata__clayer_topk(&in, n, b->density, vf, seed, out);
        if (rc == STRATA_EINVAL)
            strata_diag_set(diag, rc, "input contains a NaN or infinite value");
        break;
    }
    case STRATA_COMP_RANDK:
        rc = compress_randk(a, n, b->density, vf, seed, out);
        break;
    case STRATA_COMP_QSGD:
        rc = compress_qsgd(a, n, b->levels, seed, out, diag);
        break;
    case STRATA_COMP_SIGN:
        rc = compress_sign(a, n, out);
        break;
    case STRATA_COMP_POWERSGD:
        if (ndim >= 2) {
            uint32_t rows, cols, rank;
            strata_powersgd_dims(ndim, shape, b->rank, &rows, &cols, &rank);
            rc = strata__powersgd_compress(a, rows, cols, rank, vf, seed, q_warm, out, diag);
        } else {
            rc = compress_dense(a, n, STRATA_COMP_NONE, vf, out);
        }
        break;
    default:
        rc = compress_dense(a, n, b->comp, vf, out);
        break;
    }
    if (rc < 0) {
        strata_clayer_cleanup(out);
        if (rc == STRATA_ENOMEM)
            strata_diag_set(diag, rc, "compress: out of memory");
    }
    return rc;
}

/* ---- decoding ---- */

/* Values must be finite and exactly representable in the values format and,
 * for FP16/BF16 layers, in the compressor's precision (the payload codec
 * applies the same rule). */
static int check_values(const float *v, size_t n, const strata_clayer *c, strata_diag *diag)
{
    const int need16 = c->values_format == STRATA_VALUES_FP16 || c->comp == STRATA_COMP_FP16;
    const int needb16 = c->values_format == STRATA_VALUES_BF16 || c->comp == STRATA_COMP_BF16;
    for (size_t i = 0; i < n; i++) {
        if (strata__mag_key(v[i]) >= STRATA__KEY_NONFINITE)
            return strata_diag_set(diag, STRATA_EPROTO, "value %zu is NaN or infinite", i);
        if ((need16 && strata__round_vf(v[i], STRATA_VALUES_FP16) != v[i]) ||
            (needb16 && strata__round_vf(v[i], STRATA_VALUES_BF16) != v[i]))
            return strata_diag_set(diag, STRATA_EPROTO, "value %zu (%g) is not representable as %s",
                                   i, (double)v[i], need16 ? "fp16" : "bf16");
    }
    return STRATA_OK;
}

static int check_scale(float scale, strata_diag *diag)
{
    if (!isfinite(scale) || scale < 0.0f)
        return strata_diag_set(diag, STRATA_EPROTO, "scale %g is negative or not finite",
                               (double)scale);
    return STRATA_OK;
}

/* INT8 and TERNARY layers: the scale is a finite, non-negative bfloat16
 * value and every value is exactly what the quantised form decodes to. */
static int check_quantised(const strata_clayer *c, strata_diag *diag)
{
    const char *fmt = strata_values_format_name(c->values_format);
    int rc = check_scale(c->scale, diag);
    if (rc < 0)
        return rc;
    if ((f2u(c->scale) & 0xffffu) != 0)
        return strata_diag_set(diag, STRATA_EPROTO, "%s: scale %.9g is not a bfloat16 value", fmt,
                               (double)c->scale);
    if (c->values_format == STRATA_VALUES_INT8 && !isfinite(c->scale * 127.0f))
        return strata_diag_set(diag, STRATA_EPROTO, "int8: scale %.9g times 127 overflows float32",
                               (double)c->scale);
    if (c->values_format == STRATA_VALUES_INT8 && c->count > 0 && c->qlevels == NULL)
        return strata_diag_set(diag, STRATA_EPROTO, "int8: levels array missing");
    for (size_t j = 0; j < c->count; j++) {
        float want;
        if (c->values_format == STRATA_VALUES_INT8) {
            int q = c->qlevels[j];
            if (q < -127 || q > 127 || (c->scale == 0.0f && q != 0))
                return strata_diag_set(diag, STRATA_EPROTO,
                                       "int8: level %d at %zu is beyond +-127 or not 0 under a "
                                       "zero scale",
                                       q, j);
            want = c->scale * (float)q;
        } else {
            want = c->values[j] < 0.0f && c->scale > 0.0f ? -c->scale : c->scale;
        }
        if (f2u(c->values[j]) != f2u(want))
            return strata_diag_set(diag, STRATA_EPROTO,
                                   "%s: value %zu (%g) is not the quantised value %g", fmt, j,
                                   (double)c->values[j], (double)want);
    }
    return STRATA_OK;
}

/* Validates every field of c that decoding relies on. */
static int clayer_check(const strata_clayer *c, strata_diag *diag)
{
    if ((unsigned)c->comp >= STRATA_COMP_COUNT)
        return strata_diag_set(diag, STRATA_EPROTO, "unknown compressor id %d", (int)c->comp);
    if ((unsigned)c->values_format >= STRATA_VALUES_COUNT)
        return strata_diag_set(diag, STRATA_EPROTO, "unknown values format %d",
                               (int)c->values_format);
    if (STRATA_VALUES_QUANTISED(c->values_format) && c->comp != STRATA_COMP_TOPK &&
        c->comp != STRATA_COMP_RANDK)
        return strata_diag_set(diag, STRATA_EPROTO, "values format %s with compressor %s",
                               strata_values_format_name(c->values_format),
                               strata_comp_name(c->comp));
    if (c->numel == 0 || c->numel > STRATA_CLAYER_MAX_NUMEL)
        return strata_diag_set(diag, STRATA_EPROTO, "element count %llu is out of range",
                               (unsigned long long)c->numel);
    const size_t n = (size_t)c->numel;
    const char *name = strata_comp_name(c->comp);
    int rc;
    switch (c->comp) {
    case STRATA_COMP_NONE:
    case STRATA_COMP_FP16:
    case STRATA_COMP_BF16:
        if (c->count != c->numel)
            return strata_diag_set(diag, STRATA_EPROTO, "%s: count %llu != numel %llu", name,
                                   (unsigned long long)c->count, (unsigned long long)c->numel);
        if (c->values == NULL)
            return strata_diag_set(diag, STRATA_EPROTO, "%s: values missing", name);
        return check_values(c->values, n, c, diag);
    case STRATA_COMP_TOPK:
    case STRATA_COMP_RANDK:
        if (c->count > c->numel)
            return strata_diag_set(diag, STRATA_EPROTO, "%s: count %llu exceeds numel %llu", name,
                                   (unsigned long long)c->count, (unsigned long long)c->numel);
        if (c->count > 0 && c->values == NULL)
            return strata_diag_set(diag, STRATA_EPROTO, "%s: values missing", name);
        if (c->comp == STRATA_COMP_TOPK) {
            if (c->count > 0 && c->indices == NULL)
                return strata_diag_set(diag, STRATA_EPROTO, "topk: indices missing");
            for (size_t j = 0; j < c->count; j++) {
                if (c->indices[j] >= c->numel)
                    return strata_diag_set(diag, STRATA_EPROTO,
                                           "topk: index %u at %zu is out of range (numel %llu)",
                                           c->indices[j], j, (unsigned long long)c->numel);
                if (j > 0 && c->indices[j] <= c->indices[j - 1])
                    return strata_diag_set(diag, STRATA_EPROTO,
                                           "topk: index %u at %zu is not above the previous %u",
                                           c->indices[j], j, c->indices[j - 1]);
            }
        }
        if (STRATA_VALUES_QUANTISED(c->values_format))
            return check_quantised(c, diag);
        return check_values(c->values, (size_t)c->count, c, diag);
    case STRATA_COMP_QSGD:
        if (c->count != 0)
            return strata_diag_set(diag, STRATA_EPROTO, "qsgd: count must be 0");
        if (c->levels < 1 || c->levels > 127)
            return strata_diag_set(diag, STRATA_EPROTO, "qsgd: levels %u not in [1, 127]",
                                   c->levels);
        if (c->qlevels == NULL)
            return strata_diag_set(diag, STRATA_EPROTO, "qsgd: levels array missing");
        rc = check_scale(c->scale, diag);
        if (rc < 0)
            return rc;
        for (size_t i = 0; i < n; i++)
            if (c->qlevels[i] > (int)c->levels || c->qlevels[i] < -(int)c->levels)
                return strata_diag_set(diag, STRATA_EPROTO, "qsgd: level %d at %zu is beyond +-%u",
                                       c->qlevels[i], i, c->levels);
        return STRATA_OK;
    case STRATA_COMP_SIGN:
        if (c->count != 0)
            return strata_diag_set(diag, STRATA_EPROTO, "sign: count must be 0");
        if (c->signbits == NULL)
            return strata_diag_set(diag, STRATA_EPROTO, "sign: sign bits missing");
        rc = check_scale(c->scale, diag);
        if (rc < 0)
            return rc;
        if (n % 8 != 0 && (c->signbits[n / 8] >> (n % 8)) != 0)
            return strata_diag_set(diag, STRATA_EPROTO, "sign: padding bits are set");
        return STRATA_OK;
    case STRATA_COMP_POWERSGD: {
        uint64_t rows = c->rows, cols = c->cols, rank = c->rank;
        if (rows == 0 || cols == 0 || rows * cols != c->numel)
            return strata_diag_set(
                diag, STRATA_EPROTO, "powersgd: %llu x %llu does not match numel %llu",
                (unsigned long long)rows, (unsigned long long)cols, (unsigned long long)c->numel);
        if (rows > INT_MAX || cols > INT_MAX)
            return strata_diag_set(diag, STRATA_EPROTO, "powersgd: a dimension exceeds %d",
                                   INT_MAX);
        if (rank < 1 || rank > (rows < cols ? rows : cols))
            return strata_diag_set(
                diag, STRATA_EPROTO, "powersgd: rank %llu not in [1, min(%llu, %llu)]",
                (unsigned long long)rank, (unsigned long long)rows, (unsigned long long)cols);
        if (c->count != (rows + cols) * rank)
            return strata_diag_set(
                diag, STRATA_EPROTO, "powersgd: count %llu != (rows + cols) * rank = %llu",
                (unsigned long long)c->count, (unsigned long long)((rows + cols) * rank));
        if (c->values == NULL)
            return strata_diag_set(diag, STRATA_EPROTO, "powersgd: values missing");
        rc = check_values(c->values, (size_t)c->count, c, diag);
        if (rc < 0)
            return rc;
        /* |(P Q^T)_ij| <= rank * max|P| * max|Q|: refuse what could overflow. */
        float mp = 0.0f, mq = 0.0f;
        for (size_t i = 0; i < rows * rank; i++)
            mp = fmaxf(mp, fabsf(c->values[i]));
        for (size_t i = rows * rank; i < c->count; i++)
            mq = fmaxf(mq, fabsf(c->values[i]));
        if ((double)rank * (double)mp * (double)mq > 1e38)
            return strata_diag_set(diag, STRATA_EPROTO, "powersgd: factors overflow float32");
        return STRATA_OK;
    }
    }
    return strata_diag_set(diag, STRATA_EPROTO, "unknown compressor id %d", (int)c->comp);
}

int strata_clayer_decode(const strata_clayer *c, float *dense, strata_diag *diag)
{
    if (c == NULL || dense == NULL)
        return strata_diag_set(diag, STRATA_EINVAL, "decode: NULL argument");
    int rc = clayer_check(c, diag);
    if (rc < 0)
        return rc;
    const size_t n = (size_t)c->numel;
    switch (c->comp) {
    case STRATA_COMP_TOPK:
        memset(dense, 0, n * sizeof(float));
        for (size_t j = 0; j < c->count; j++)
            dense[c->indices[j]] = c->values[j];
        break;
    case STRATA_COMP_RANDK: {
        uint32_t *idx = malloc((size_t)c->count * sizeof(uint32_t) + 1);
        if (idx == NULL)
            return strata_diag_set(diag, STRATA_ENOMEM, "decode: out of memory");
        rc = strata_randk_indices(c->seed, c->numel, c->count, idx);
        if (rc < 0) {
            free(idx);
            return strata_diag_set(diag, rc, "decode: regenerating randk indices failed");
        }
        memset(dense, 0, n * sizeof(float));
        for (size_t j = 0; j < c->count; j++)
            dense[idx[j]] = c->values[j];
        free(idx);
        break;
    }
    case STRATA_COMP_QSGD:
        for (size_t i = 0; i < n; i++)
            dense[i] = qsgd_value(c->scale, c->qlevels[i], c->levels);
        break;
    case STRATA_COMP_SIGN:
        for (size_t i = 0; i < n; i++)
            dense[i] = ((c->signbits[i / 8] >> (i % 8)) & 1u) ? -c->scale : c->scale;
        break;
    case STRATA_COMP_POWERSGD:
        strata__powersgd_expand(c, dense);
        break;
    default:
        memcpy(dense, c->values, n * sizeof(float));
        break;
    }
    return STRATA_OK;
}

const float *strata_clayer_powersgd_q(const strata_clayer *c)
{
    if (c == NULL || c->comp != STRATA_COMP_POWERSGD || c->values == NULL)
        return NULL;
    return c->values + (size_t)c->rows * c->rank;
}

/* ---- random-k positions ---- */

int strata_randk_indices(uint64_t seed, uint64_t numel, uint64_t count, uint32_t *idx_out)
{
    if (count > numel || numel > STRATA_CLAYER_MAX_NUMEL || (count > 0 && idx_out == NULL))
        return STRATA_EINVAL;
    if (count == numel) {
        for (uint64_t i = 0; i < numel; i++)
            idx_out[i] = (uint32_t)i;
        return STRATA_OK;
    }
    if (count == 0)
        return STRATA_OK;
    /* Mark the positions drawn (or, above half, the positions left out) in a
     * bitmap, then read it in order: sorted without sorting. */
    const int invert = count > numel / 2;
    const uint64_t draw = invert ? numel - count : count;
    const size_t words = (size_t)((numel + 63) / 64);
    uint64_t *bits = calloc(words, sizeof(uint64_t));
    if (bits == NULL)
        return STRATA_ENOMEM;
    strata_rng r;
    strata_rng_seed(&r, seed, STREAM_RANDK);
    for (uint64_t got = 0; got < draw;) {
        uint64_t p = strata_rng_below(&r, numel);
        uint64_t bit = 1ULL << (p % 64);
        if ((bits[p / 64] & bit) == 0) {
            bits[p / 64] |= bit;
            got++;
        }
    }
    size_t m = 0;
    for (size_t w = 0; w < words; w++) {
        uint64_t word = invert ? ~bits[w] : bits[w];
        if (w == words - 1 && numel % 64 != 0)
            word &= (1ULL << (numel % 64)) - 1;
        while (word != 0) {
            idx_out[m++] = (uint32_t)(w * 64 + (size_t)__builtin_ctzll(word));
            word &= word - 1;
        }
    }
    free(bits);
    return STRATA_OK;
}

/* ---- top-k error table ---- */

/* LSD radix sort of 31-bit keys, ascending; the result ends in tmp. */
static void radix_sort31(uint32_t *keys, uint32_t *tmp, size_t n)
{
    static const unsigned shifts[3] = {0, 11, 22};
    static const uint32_t masks[3] = {0x7ff, 0x7ff, 0x1ff};
    size_t cnt[2048];
    uint32_t *from = keys, *to = tmp;
    for (int p = 0; p < 3; p++) {
        memset(cnt, 0, sizeof(cnt));
        for (size_t i = 0; i < n; i++)
            cnt[(from[i] >> shifts[p]) & masks[p]]++;
        size_t sum = 0;
        for (uint32_t b = 0; b <= masks[p]; b++) {
            size_t c = cnt[b];
            cnt[b] = sum;
            sum += c;
        }
        for (size_t i = 0; i < n; i++)
            to[cnt[(from[i] >> shifts[p]) & masks[p]]++] = from[i];
        uint32_t *t = from;
        from = to;
        to = t;
    }
}

typedef struct err_target {
    size_t drop; /* elements not kept */
    size_t slot;
} err_target;

static int cmp_target(const void *x, const void *y)
{
    const err_target *a = x, *b = y;
    return (a->drop > b->drop) - (a->drop < b->drop);
}

int strata_topk_error_table(const float *a, size_t n, const double *densities, size_t nd,
                            double *sq_errors)
{
    if (a == NULL || n == 0 || (nd > 0 && (densities == NULL || sq_errors == NULL)))
        return STRATA_EINVAL;
    if (n > SIZE_MAX / (2 * sizeof(uint32_t)) || nd > SIZE_MAX / sizeof(err_target))
        return STRATA_ETOOBIG;
    for (size_t i = 0; i < nd; i++) {
        if (!(densities[i] > 0.0 && densities[i] <= 1.0))
            return STRATA_EINVAL;
        sq_errors[i] = 0.0;
    }
    uint32_t *keys = malloc(2 * n * sizeof(uint32_t));
    err_target *t = malloc((nd + 1) * sizeof(err_target));
    int rc = STRATA_ENOMEM;
    if (keys == NULL || t == NULL)
        goto out;
    rc = STRATA_EINVAL;
    for (size_t i = 0; i < n; i++) {
        keys[i] = strata__mag_key(a[i]);
        if (keys[i] >= STRATA__KEY_NONFINITE)
            goto out;
    }
    radix_sort31(keys, keys + n, n);
    const uint32_t *sorted = keys + n; /* ascending magnitudes */
    for (size_t i = 0; i < nd; i++) {
        t[i].drop = n - (size_t)strata_comp_kept(densities[i], n);
        t[i].slot = i;
    }
    qsort(t, nd, sizeof(err_target), cmp_target);
    /* Prefix sums of squares over ascending magnitudes: the error of keeping
     * k is the sum over the n - k smallest. */
    double sum = 0.0;
    size_t next = 0;
    for (size_t j = 0; j <= n && next < nd; j++) {
        while (next < nd && t[next].drop == j)
            sq_errors[t[next++].slot] = sum;
        if (j < n) {
            double v = (double)u2f(sorted[j]);
            sum += v * v;
        }
    }
    rc = STRATA_OK;
out:
    free(t);
    free(keys);
    return rc;
}
