#include "strata/compress.h"
#include "strata/error.h"
#include "strata/payload.h"
#include "strata/rng.h"
#include "strata/tensor.h"
#include "test_util.h"

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zstd.h>

/* The portable CRC32C of shared/src/crc32c.c (internal helper). */
uint32_t strata__crc32c_sw(uint32_t crc, const void *data, size_t len);

/* Reports the failing case of a table-driven test next to CUnit's line;
 * cond is evaluated once. */
#define CASE_ASSERT(cond, what)                                                                    \
    do {                                                                                           \
        int case_ok_ = (cond) ? 1 : 0;                                                             \
        CU_assertImplementation(case_ok_, __LINE__, #cond, __FILE__, "", CU_FALSE);                \
        if (!case_ok_)                                                                             \
            fprintf(stderr, "\n  case '%s': %s failed\n", (what), #cond);                          \
    } while (0)

/* ------------------------------------------------------------------------ */
/* Reference float helpers (independent of the codec's own)                 */
/* ------------------------------------------------------------------------ */

static uint32_t fbits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof(u));
    return u;
}

static float bitsf(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
}

/* Rounds v to `bits` significant bits (11 for fp16, 8 for bf16), nearest
 * even, assuming the result is a normal number of the target format. */
static float round_sig(float v, int bits)
{
    if (v == 0.0f)
        return v;
    int e;
    double m = frexp((double)v, &e);
    return (float)ldexp(nearbyint(ldexp(m, bits)), e - bits);
}

static float round_f16(float v)
{
    if (fabsf(v) < 0x1p-14f) /* binary16 subnormal range: multiples of 2^-24 */
        return (float)ldexp(nearbyint(ldexp((double)v, 24)), -24);
    return round_sig(v, 11);
}

static float round_bf16(float v)
{
    return round_sig(v, 8);
}

/* binary16 bit pattern to float, from the definition. */
static float half_value(uint16_t h)
{
    unsigned sign = h >> 15, exp = (h >> 10) & 31, mant = h & 1023;
    double v = exp == 0 ? ldexp((double)mant, -24) : ldexp((double)(1024 + mant), (int)exp - 25);
    return (float)(sign ? -v : v);
}

/* ------------------------------------------------------------------------ */
/* Layers built by hand                                                     */
/* ------------------------------------------------------------------------ */

typedef struct layer_spec {
    const char *name;
    strata_compressor_id comp;
    strata_values_format fmt;
    uint64_t numel;
    uint64_t count;
    uint32_t levels, rows, cols, rank;
} layer_spec;

/* A finite value suited to the layer: Gaussian, rounded so that it is exact
 * in every 16-bit format the layer requires; a few special values first. */
static float make_value(const layer_spec *s, uint64_t i, strata_rng *rng)
{
    int need16 = s->fmt == STRATA_VALUES_FP16 || s->comp == STRATA_COMP_FP16;
    int needb16 = s->fmt == STRATA_VALUES_BF16 || s->comp == STRATA_COMP_BF16;
    if (need16 && needb16) {
        static const float both[] = {-0.0f, 1.0f, -0.375f, 96.0f, 0x1p-14f, -65280.0f};
        if (i < sizeof(both) / sizeof(both[0]))
            return both[i];
        return ldexpf((float)((int)strata_rng_below(rng, 255) - 127), -4);
    }
    if (need16) {
        static const float f16[] = {-0.0f, 0x1p-24f, -0x3p-24f, 65504.0f, -0x1.ff8p-15f};
        if (i < sizeof(f16) / sizeof(f16[0]))
            return f16[i];
        return round_f16((float)strata_rng_normal(rng));
    }
    if (needb16) {
        static const float b16[] = {-0.0f, 0x1p-133f, 0x1.fep127f, -0x1p-126f};
        if (i < sizeof(b16) / sizeof(b16[0]))
            return b16[i];
        return round_bf16((float)strata_rng_normal(rng));
    }
    static const float f32[] = {-0.0f, 0x1p-149f, FLT_MAX, -FLT_MIN, 0.1f};
    if (i < sizeof(f32) / sizeof(f32[0]))
        return f32[i];
    return (float)strata_rng_normal(rng);
}

/* Fills c from s with random contents (unused fields zero). */
static void make_layer(const layer_spec *s, uint32_t index, uint64_t seed, strata_clayer *c)
{
    strata_rng rng;
    strata_rng_seed(&rng, seed, index);
    memset(c, 0, sizeof(*c));
    c->layer_index = index;
    c->comp = s->comp;
    c->values_format = s->fmt;
    c->numel = s->numel;
    c->count = s->count;
    uint64_t nv = c->count;
    switch (s->comp) {
    case STRATA_COMP_TOPK: {
        c->indices = malloc((size_t)c->count * sizeof(uint32_t) + 1);
        CU_ASSERT_PTR_NOT_NULL_FATAL(c->indices);
        if (c->numel > 1000000) {
            /* Sparse picks over a huge range, both ends included. */
            for (uint64_t k = 0; k < c->count; k++)
                c->indices[k] =
                    (uint32_t)(k == c->count - 1 ? c->numel - 1
                                                 : k * (c->numel / c->count) + (k % 3) * 127);
        } else {
            /* Selection sampling: each index kept with probability need/left. */
            uint64_t need = c->count;
            for (uint64_t i = 0, k = 0; i < c->numel && need > 0; i++)
                if (strata_rng_below(&rng, c->numel - i) < need) {
                    c->indices[k++] = (uint32_t)i;
                    need--;
                }
        }
        break;
    }
    case STRATA_COMP_RANDK:
        c->seed = strata_rng_u64(&rng);
        break;
    case STRATA_COMP_QSGD:
        nv = 0;
        c->levels = s->levels;
        c->scale = (float)fabs(strata_rng_normal(&rng)) + 0.5f;
        c->qlevels = malloc((size_t)c->numel);
        CU_ASSERT_PTR_NOT_NULL_FATAL(c->qlevels);
        for (uint64_t i = 0; i < c->numel; i++)
            c->qlevels[i] =
                (int8_t)((int)strata_rng_below(&rng, 2 * s->levels + 1) - (int)s->levels);
        c->qlevels[0] = (int8_t)s->levels;
        c->qlevels[c->numel - 1] = (int8_t) - (int)s->levels;
        break;
    case STRATA_COMP_SIGN: {
        nv = 0;
        c->scale = (float)fabs(strata_rng_normal(&rng));
        size_t nb = (size_t)((c->numel + 7) / 8);
        c->signbits = calloc(nb, 1);
        CU_ASSERT_PTR_NOT_NULL_FATAL(c->signbits);
        for (uint64_t i = 0; i < c->numel; i++)
            if (strata_rng_u64(&rng) & 1)
                c->signbits[i / 8] |= (uint8_t)(1u << (i % 8));
        break;
    }
    case STRATA_COMP_POWERSGD:
        c->rows = s->rows;
        c->cols = s->cols;
        c->rank = s->rank;
        break;
    default:
        break;
    }
    if (nv > 0) {
        c->values = strata_alloc_floats((size_t)nv);
        CU_ASSERT_PTR_NOT_NULL_FATAL(c->values);
        for (uint64_t i = 0; i < nv; i++)
            c->values[i] = make_value(s, i, &rng);
    }
    /* Quantised kept values: a bfloat16 scale (levels: 1 for scale 0), int8
     * levels (extremes first) or ternary signs. */
    if (STRATA_VALUES_QUANTISED(s->fmt)) {
        c->scale = s->levels == 1 ? 0.0f : round_bf16((float)fabs(strata_rng_normal(&rng)) + 0.01f);
        if (s->fmt == STRATA_VALUES_INT8) {
            c->qlevels = malloc((size_t)nv + 1);
            CU_ASSERT_PTR_NOT_NULL_FATAL(c->qlevels);
        }
        for (uint64_t i = 0; i < nv; i++) {
            if (s->fmt == STRATA_VALUES_INT8) {
                static const int8_t ext[] = {127, -127, 0, 1, -1};
                int q = s->rows > 0       ? (int)s->rows - 1 /* all equal */
                        : i < sizeof(ext) ? ext[i]
                                          : (int)strata_rng_below(&rng, 255) - 127;
                if (c->scale == 0.0f)
                    q = 0;
                c->qlevels[i] = (int8_t)q;
                c->values[i] = c->scale * (float)q;
            } else {
                int neg = c->scale > 0.0f && (strata_rng_u64(&rng) & 1);
                c->values[i] = neg ? -c->scale : c->scale;
            }
        }
    }
}

static void release_layer(strata_clayer *c)
{
    free(c->indices);
    strata_free_floats(c->values);
    free(c->qlevels);
    free(c->signbits);
    memset(c, 0, sizeof(*c));
}

/* Returns 1 when a and b describe the same layer, every field and every
 * used array byte equal. */
static int layers_equal(const strata_clayer *a, const strata_clayer *b)
{
    if (a->layer_index != b->layer_index || a->comp != b->comp ||
        a->values_format != b->values_format || a->numel != b->numel || a->count != b->count ||
        fbits(a->scale) != fbits(b->scale) || a->levels != b->levels || a->rows != b->rows ||
        a->cols != b->cols || a->rank != b->rank || a->seed != b->seed)
        return 0;
    uint64_t nv = (a->comp == STRATA_COMP_QSGD || a->comp == STRATA_COMP_SIGN) ? 0 : a->count;
    if (nv > 0 && memcmp(a->values, b->values, (size_t)nv * sizeof(float)) != 0)
        return 0;
    if (a->comp == STRATA_COMP_TOPK && a->count > 0 &&
        memcmp(a->indices, b->indices, (size_t)a->count * sizeof(uint32_t)) != 0)
        return 0;
    if (a->comp == STRATA_COMP_QSGD && memcmp(a->qlevels, b->qlevels, (size_t)a->numel) != 0)
        return 0;
    if (a->values_format == STRATA_VALUES_INT8 && a->count > 0 &&
        memcmp(a->qlevels, b->qlevels, (size_t)a->count) != 0)
        return 0;
    if (a->comp == STRATA_COMP_SIGN &&
        memcmp(a->signbits, b->signbits, (size_t)(a->numel + 7) / 8) != 0)
        return 0;
    return 1;
}

static int payloads_equal(const strata_payload *a, const strata_payload *b)
{
    if (a->round != b->round || a->model_version != b->model_version ||
        a->client_id != b->client_id || a->sample_count != b->sample_count ||
        a->flags != b->flags || a->num_layers != b->num_layers)
        return 0;
    if ((a->metadata_json == NULL) != (b->metadata_json == NULL))
        return 0;
    if (a->metadata_json != NULL && strcmp(a->metadata_json, b->metadata_json) != 0)
        return 0;
    for (size_t i = 0; i < a->num_layers; i++)
        if (!layers_equal(&a->layers[i], &b->layers[i]))
            return 0;
    return 1;
}

/* Decompresses a wire payload (test-side, with plain zstd). */
static uint8_t *unzstd(const uint8_t *wire, size_t len, size_t *body_len)
{
    unsigned long long n = ZSTD_getFrameContentSize(wire, len);
    CU_ASSERT_FATAL(n != ZSTD_CONTENTSIZE_ERROR && n != ZSTD_CONTENTSIZE_UNKNOWN);
    uint8_t *b = malloc((size_t)n + 1);
    CU_ASSERT_PTR_NOT_NULL_FATAL(b);
    size_t got = ZSTD_decompress(b, (size_t)n, wire, len);
    CU_ASSERT_FATAL(!ZSTD_isError(got) && got == n);
    *body_len = (size_t)n;
    return b;
}

/* Compresses a body as one zstd frame (test-side). */
static uint8_t *zstd_wrap(const uint8_t *body, size_t n, size_t *len)
{
    size_t bound = ZSTD_compressBound(n);
    uint8_t *w = malloc(bound);
    CU_ASSERT_PTR_NOT_NULL_FATAL(w);
    size_t r = ZSTD_compress(w, bound, body, n, 1);
    CU_ASSERT_FATAL(!ZSTD_isError(r));
    *len = r;
    return w;
}

/* Rewrites the last 4 bytes of a body with the CRC32C of the rest. */
static void fix_crc(uint8_t *body, size_t n)
{
    uint32_t c = strata_crc32c(0, body, n - 4);
    for (int i = 0; i < 4; i++)
        body[n - 4 + i] = (uint8_t)(c >> (8 * i));
}

/* Decodes wire bytes that must succeed; returns the payload. The total-size
 * limit is lifted: some cases describe tensors of 2^32 - 1 elements. */
static strata_payload *decode_ok(const uint8_t *wire, size_t len, const char *what)
{
    static const strata_payload_limits wide = {.max_total_numel = UINT64_MAX};
    strata_payload *p = NULL;
    strata_diag diag = {{0}};
    int rc = strata_payload_decode(wire, len, &wide, &p, &diag);
    CASE_ASSERT(rc == STRATA_OK, what);
    if (rc != STRATA_OK)
        fprintf(stderr, "  decode failed: %s\n", diag.msg);
    return p;
}

/* Decodes bytes that must be rejected with want and a message holding
 * expect; the output must stay NULL. */
static void expect_reject(const char *what, const uint8_t *wire, size_t len,
                          const strata_payload_limits *lim, int want, const char *expect)
{
    strata_payload *p = (strata_payload *)&p; /* sentinel: must become NULL */
    strata_diag diag = {{0}};
    int rc = strata_payload_decode(wire, len, lim, &p, &diag);
    CASE_ASSERT(rc == want, what);
    CASE_ASSERT(p == NULL, what);
    CASE_ASSERT(diag.msg[0] != '\0', what);
    if (expect != NULL)
        CASE_ASSERT(strstr(diag.msg, expect) != NULL, what);
    if (rc != want || (expect != NULL && strstr(diag.msg, expect) == NULL))
        fprintf(stderr, "  rc %d, diag was: %s\n", rc, diag.msg);
    if (rc == STRATA_OK)
        strata_payload_free(p);
}

/* ------------------------------------------------------------------------ */
/* CRC32C                                                                   */
/* ------------------------------------------------------------------------ */

static uint32_t crc32c_bitwise(const uint8_t *p, size_t n)
{
    uint32_t c = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++) {
        c ^= p[i];
        for (int k = 0; k < 8; k++)
            c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1u)));
    }
    return ~c;
}

static void test_crc32c(void)
{
    /* RFC 3720 appendix B.4 vectors and the classic check value. */
    uint8_t buf[32];
    memset(buf, 0, sizeof(buf));
    CU_ASSERT_EQUAL(strata_crc32c(0, buf, 32), 0x8A9136AAu);
    memset(buf, 0xFF, sizeof(buf));
    CU_ASSERT_EQUAL(strata_crc32c(0, buf, 32), 0x62A8AB43u);
    for (int i = 0; i < 32; i++)
        buf[i] = (uint8_t)i;
    CU_ASSERT_EQUAL(strata_crc32c(0, buf, 32), 0x46DD794Eu);
    for (int i = 0; i < 32; i++)
        buf[i] = (uint8_t)(31 - i);
    CU_ASSERT_EQUAL(strata_crc32c(0, buf, 32), 0x113FDB5Cu);
    CU_ASSERT_EQUAL(strata_crc32c(0, "123456789", 9), 0xE3069283u);
    CU_ASSERT_EQUAL(strata__crc32c_sw(0, "123456789", 9), 0xE3069283u);
    CU_ASSERT_EQUAL(strata_crc32c(0, NULL, 0), 0u);

    /* Every length and alignment up to 300 bytes, both paths, and chaining. */
    strata_rng rng;
    strata_rng_seed(&rng, 99, 0);
    uint8_t data[320];
    for (size_t i = 0; i < sizeof(data); i++)
        data[i] = (uint8_t)strata_rng_u64(&rng);
    int bad = 0;
    for (size_t off = 0; off < 8; off++)
        for (size_t n = 0; n <= 300; n++) {
            uint32_t want = crc32c_bitwise(data + off, n);
            size_t cut = n / 3;
            bad += strata_crc32c(0, data + off, n) != want;
            bad += strata__crc32c_sw(0, data + off, n) != want;
            bad +=
                strata_crc32c(strata_crc32c(0, data + off, cut), data + off + cut, n - cut) != want;
        }
    CU_ASSERT_EQUAL(bad, 0);
}

/* ------------------------------------------------------------------------ */
/* Round trips                                                              */
/* ------------------------------------------------------------------------ */

static const layer_spec ROUND_TRIP[] = {
    {"none fp32 n=1", STRATA_COMP_NONE, STRATA_VALUES_FP32, 1, 1, 0, 0, 0, 0},
    {"none fp32", STRATA_COMP_NONE, STRATA_VALUES_FP32, 777, 777, 0, 0, 0, 0},
    {"none fp16", STRATA_COMP_NONE, STRATA_VALUES_FP16, 300, 300, 0, 0, 0, 0},
    {"none bf16", STRATA_COMP_NONE, STRATA_VALUES_BF16, 300, 300, 0, 0, 0, 0},
    {"fp16 as fp16", STRATA_COMP_FP16, STRATA_VALUES_FP16, 513, 513, 0, 0, 0, 0},
    {"fp16 as fp32", STRATA_COMP_FP16, STRATA_VALUES_FP32, 64, 64, 0, 0, 0, 0},
    {"fp16 as bf16", STRATA_COMP_FP16, STRATA_VALUES_BF16, 64, 64, 0, 0, 0, 0},
    {"bf16 as bf16", STRATA_COMP_BF16, STRATA_VALUES_BF16, 513, 513, 0, 0, 0, 0},
    {"bf16 as fp32", STRATA_COMP_BF16, STRATA_VALUES_FP32, 64, 64, 0, 0, 0, 0},
    {"bf16 as fp16", STRATA_COMP_BF16, STRATA_VALUES_FP16, 64, 64, 0, 0, 0, 0},
    {"topk fp32", STRATA_COMP_TOPK, STRATA_VALUES_FP32, 5000, 50, 0, 0, 0, 0},
    {"topk fp16", STRATA_COMP_TOPK, STRATA_VALUES_FP16, 5000, 50, 0, 0, 0, 0},
    {"topk bf16", STRATA_COMP_TOPK, STRATA_VALUES_BF16, 5000, 50, 0, 0, 0, 0},
    {"topk k=0", STRATA_COMP_TOPK, STRATA_VALUES_FP32, 100, 0, 0, 0, 0, 0},
    {"topk k=n", STRATA_COMP_TOPK, STRATA_VALUES_FP32, 100, 100, 0, 0, 0, 0},
    {"topk n=1", STRATA_COMP_TOPK, STRATA_VALUES_FP32, 1, 1, 0, 0, 0, 0},
    {"topk n=2^32-1", STRATA_COMP_TOPK, STRATA_VALUES_FP32, 4294967295u, 7, 0, 0, 0, 0},
    {"randk fp32", STRATA_COMP_RANDK, STRATA_VALUES_FP32, 1000, 10, 0, 0, 0, 0},
    {"randk fp16", STRATA_COMP_RANDK, STRATA_VALUES_FP16, 1000, 10, 0, 0, 0, 0},
    {"randk bf16", STRATA_COMP_RANDK, STRATA_VALUES_BF16, 1000, 10, 0, 0, 0, 0},
    {"randk k=0", STRATA_COMP_RANDK, STRATA_VALUES_FP32, 1000, 0, 0, 0, 0, 0},
    {"qsgd s=1", STRATA_COMP_QSGD, STRATA_VALUES_FP32, 1000, 0, 1, 0, 0, 0},
    {"qsgd s=127", STRATA_COMP_QSGD, STRATA_VALUES_FP32, 1000, 0, 127, 0, 0, 0},
    {"qsgd n=1 fp16", STRATA_COMP_QSGD, STRATA_VALUES_FP16, 1, 0, 8, 0, 0, 0},
    {"sign n=1", STRATA_COMP_SIGN, STRATA_VALUES_FP32, 1, 0, 0, 0, 0, 0},
    {"sign n=8", STRATA_COMP_SIGN, STRATA_VALUES_FP32, 8, 0, 0, 0, 0, 0},
    {"sign n=9", STRATA_COMP_SIGN, STRATA_VALUES_FP32, 9, 0, 0, 0, 0, 0},
    {"sign n=1001", STRATA_COMP_SIGN, STRATA_VALUES_BF16, 1001, 0, 0, 0, 0, 0},
    {"powersgd r=1", STRATA_COMP_POWERSGD, STRATA_VALUES_FP32, 600, 50, 0, 20, 30, 1},
    {"powersgd r=4 fp16", STRATA_COMP_POWERSGD, STRATA_VALUES_FP16, 600, 200, 0, 20, 30, 4},
    {"powersgd r=min bf16", STRATA_COMP_POWERSGD, STRATA_VALUES_BF16, 600, 1000, 0, 20, 30, 20},
    {"powersgd 1xN", STRATA_COMP_POWERSGD, STRATA_VALUES_FP32, 50, 51, 0, 1, 50, 1},
    /* int8/ternary: levels 1 means scale 0; rows r > 0 means every level r - 1. */
    {"topk int8", STRATA_COMP_TOPK, STRATA_VALUES_INT8, 5000, 300, 0, 0, 0, 0},
    {"topk int8 k=0", STRATA_COMP_TOPK, STRATA_VALUES_INT8, 100, 0, 0, 0, 0, 0},
    {"topk int8 k=1", STRATA_COMP_TOPK, STRATA_VALUES_INT8, 100, 1, 0, 0, 0, 0},
    {"topk int8 scale 0", STRATA_COMP_TOPK, STRATA_VALUES_INT8, 100, 30, 1, 0, 0, 0},
    {"topk int8 all 127", STRATA_COMP_TOPK, STRATA_VALUES_INT8, 100, 30, 0, 128, 0, 0},
    {"topk ternary", STRATA_COMP_TOPK, STRATA_VALUES_TERNARY, 5000, 301, 0, 0, 0, 0},
    {"topk ternary scale 0", STRATA_COMP_TOPK, STRATA_VALUES_TERNARY, 100, 9, 1, 0, 0, 0},
    {"randk int8", STRATA_COMP_RANDK, STRATA_VALUES_INT8, 1000, 100, 0, 0, 0, 0},
    {"randk ternary", STRATA_COMP_RANDK, STRATA_VALUES_TERNARY, 1000, 17, 0, 0, 0, 0},
};
#define N_ROUND_TRIP (sizeof(ROUND_TRIP) / sizeof(ROUND_TRIP[0]))

/* Encodes p, decodes it back, checks equality and that re-encoding the
 * decoded payload gives the same body (canonical encoding). */
static void check_round_trip(const strata_payload *p, int level, const char *what)
{
    uint8_t *wire = NULL, *wire2 = NULL;
    size_t len = 0, len2 = 0;
    strata_diag diag = {{0}};
    int rc = strata_payload_encode(p, level, &wire, &len, &diag);
    CASE_ASSERT(rc == STRATA_OK, what);
    if (rc != STRATA_OK) {
        fprintf(stderr, "  encode failed: %s\n", diag.msg);
        return;
    }
    strata_payload *q = decode_ok(wire, len, what);
    if (q != NULL) {
        CASE_ASSERT(payloads_equal(p, q), what);
        CASE_ASSERT(strata_payload_encode(q, 3, &wire2, &len2, NULL) == STRATA_OK, what);
        size_t b1, b2;
        uint8_t *body1 = unzstd(wire, len, &b1), *body2 = unzstd(wire2, len2, &b2);
        CASE_ASSERT(b1 == b2 && memcmp(body1, body2, b1) == 0, what);
        free(body1);
        free(body2);
    }
    strata_payload_free(q);
    free(wire);
    free(wire2);
}

static void test_roundtrip_each(void)
{
    for (size_t i = 0; i < N_ROUND_TRIP; i++) {
        strata_clayer c;
        make_layer(&ROUND_TRIP[i], (uint32_t)(i * 3), 1000 + i, &c);
        strata_payload p = {.round = (uint32_t)i,
                            .model_version = 5,
                            .client_id = 17,
                            .sample_count = 600,
                            .flags = 0,
                            .num_layers = 1,
                            .layers = &c,
                            .metadata_json = NULL};
        check_round_trip(&p, 0, ROUND_TRIP[i].name);
        release_layer(&c);
    }
}

static void test_roundtrip_all_layers(void)
{
    strata_clayer layers[N_ROUND_TRIP];
    for (size_t i = 0; i < N_ROUND_TRIP; i++)
        make_layer(&ROUND_TRIP[i], (uint32_t)(2 * i + 1), 7, &layers[i]);
    char meta[] = "{\"train_loss\":0.4127,\"residual_norms\":[0.013,0.002],"
                  "\"lgreco\":{\"3\":[[0.01,0.52]]},\"note\":\"\xc3\xbc \\\" \\\\\"}";
    strata_payload p = {.round = UINT32_MAX,
                        .model_version = UINT64_MAX,
                        .client_id = 0x0123456789ABCDEFull,
                        .sample_count = 1,
                        .flags = 0xA5A5A5A5u,
                        .num_layers = N_ROUND_TRIP,
                        .layers = layers,
                        .metadata_json = meta};
    static const int levels[] = {0, 1, 3, 19};
    for (size_t k = 0; k < sizeof(levels) / sizeof(levels[0]); k++) {
        char what[32];
        snprintf(what, sizeof(what), "all layers, level %d", levels[k]);
        check_round_trip(&p, levels[k], what);
    }
    for (size_t i = 0; i < N_ROUND_TRIP; i++)
        release_layer(&layers[i]);
}

static void test_roundtrip_empty(void)
{
    strata_payload p = {0};
    check_round_trip(&p, 0, "no layers, no metadata");
    p.metadata_json = "{}";
    check_round_trip(&p, 0, "no layers, {}");
    char spaced[] = " { \"a\" : [ 1 , 2 ] }\n";
    p.metadata_json = spaced;
    check_round_trip(&p, 0, "metadata with whitespace kept verbatim");
    uint8_t *wire = NULL;
    size_t len = 0;
    CU_ASSERT_EQUAL_FATAL(strata_payload_encode(&p, 0, &wire, &len, NULL), STRATA_OK);
    strata_payload *q = decode_ok(wire, len, "verbatim");
    CU_ASSERT_PTR_NOT_NULL_FATAL(q);
    CU_ASSERT_STRING_EQUAL(q->metadata_json, spaced);
    CU_ASSERT_EQUAL(q->num_layers, 0);
    CU_ASSERT_PTR_NULL(q->layers);
    strata_payload_free(q);
    free(wire);
}

/* Unused fields are written as zero and SIGN padding bits are cleared. */
static void test_encode_normalises(void)
{
    static const layer_spec ts = {"t", STRATA_COMP_TOPK, STRATA_VALUES_FP32, 100, 3, 0, 0, 0, 0};
    static const layer_spec ss = {"s", STRATA_COMP_SIGN, STRATA_VALUES_FP32, 10, 0, 0, 0, 0, 0};
    strata_clayer c[2];
    make_layer(&ts, 0, 1, &c[0]);
    make_layer(&ss, 1, 1, &c[1]);
    c[0].seed = 99;
    c[0].scale = 1.5f;
    c[0].levels = 3;
    c[0].rows = 1;
    c[1].signbits[1] |= 0xF0;
    c[1].seed = 4;
    strata_payload p = {.num_layers = 2, .layers = c};
    uint8_t *wire = NULL;
    size_t len = 0;
    CU_ASSERT_EQUAL_FATAL(strata_payload_encode(&p, 0, &wire, &len, NULL), STRATA_OK);
    strata_payload *q = decode_ok(wire, len, "normalised");
    CU_ASSERT_PTR_NOT_NULL_FATAL(q);
    CU_ASSERT_EQUAL(q->layers[0].seed, 0);
    CU_ASSERT_EQUAL(fbits(q->layers[0].scale), 0);
    CU_ASSERT_EQUAL(q->layers[0].levels, 0);
    CU_ASSERT_EQUAL(q->layers[0].rows, 0);
    CU_ASSERT_EQUAL(memcmp(q->layers[0].indices, c[0].indices, 3 * sizeof(uint32_t)), 0);
    CU_ASSERT_EQUAL(q->layers[1].signbits[1], c[1].signbits[1] & 0x03);
    CU_ASSERT_EQUAL(q->layers[1].seed, 0);
    CU_ASSERT_EQUAL(fbits(q->layers[1].scale), fbits(c[1].scale));
    strata_payload_free(q);
    free(wire);
    release_layer(&c[0]);
    release_layer(&c[1]);
}

/* ------------------------------------------------------------------------ */
/* Independent body builder (follows schemas/payload.md)                     */
/* ------------------------------------------------------------------------ */

typedef struct tblock {
    uint32_t index;
    uint8_t comp, fmt;
    uint16_t reserved;
    uint64_t numel, count;
    uint32_t scale, levels, rows, cols, rank;
    uint64_t seed;
    int has_len; /* write data_len instead of dlen */
    uint64_t data_len;
    uint8_t data[256];
    size_t dlen;
    size_t pos_end; /* TOPK: where the positions end in data */
} tblock;

typedef struct tbody {
    uint8_t magic[4];
    uint16_t version, reserved;
    uint32_t round, flags;
    uint64_t model_version, client_id, sample_count;
    int has_count; /* write layer_count instead of nblk */
    uint32_t layer_count;
    tblock blk[4];
    size_t nblk;
    int has_meta_len; /* write meta_len instead of meta_bytes */
    uint32_t meta_len;
    char meta[128];
    size_t meta_bytes;
    uint8_t extra[8]; /* between metadata and CRC */
    size_t nextra;
    uint32_t crc_xor;
} tbody;

typedef struct bbuf {
    uint8_t b[2048];
    size_t n;
} bbuf;

static void bb_bytes(bbuf *o, const void *p, size_t n)
{
    CU_ASSERT_FATAL(o->n + n <= sizeof(o->b));
    memcpy(o->b + o->n, p, n);
    o->n += n;
}

static void bb_le(bbuf *o, uint64_t v, int width)
{
    uint8_t t[8];
    for (int i = 0; i < width; i++)
        t[i] = (uint8_t)(v >> (8 * i));
    bb_bytes(o, t, (size_t)width);
}

static void blk_put(tblock *b, const void *p, size_t n)
{
    CU_ASSERT_FATAL(b->dlen + n <= sizeof(b->data));
    memcpy(b->data + b->dlen, p, n);
    b->dlen += n;
}

/* A bit stream appended to a block's data from a fresh byte, least
 * significant bit first. */
typedef struct tbits {
    tblock *b;
    size_t start;
    uint64_t n;
} tbits;

static void tb_begin(tbits *w, tblock *b)
{
    w->b = b;
    w->start = b->dlen;
    w->n = 0;
}

static void tb_bit(tbits *w, unsigned bit)
{
    size_t at = w->start + (size_t)(w->n / 8);
    if (w->n % 8 == 0) {
        CU_ASSERT_FATAL(at < sizeof(w->b->data));
        w->b->data[at] = 0;
        w->b->dlen = at + 1;
    }
    if (bit & 1u)
        w->b->data[at] |= (uint8_t)(1u << (w->n % 8));
    w->n++;
}

static void tb_val(tbits *w, uint64_t v, unsigned nbits)
{
    for (unsigned i = 0; i < nbits; i++)
        tb_bit(w, (unsigned)(v >> i) & 1u);
}

static void tb_rice(tbits *w, uint64_t g, unsigned r)
{
    for (uint64_t q = g >> r; q > 0; q--)
        tb_bit(w, 1);
    tb_bit(w, 0);
    tb_val(w, g, r);
}

/* The Rice parameter in [0, rmax] giving the fewest bits, smallest on ties. */
static unsigned ref_rice(const uint64_t *g, size_t n, unsigned rmax)
{
    unsigned best = 0;
    uint64_t best_bits = UINT64_MAX;
    for (unsigned r = 0; r <= rmax; r++) {
        uint64_t bits = 0;
        for (size_t i = 0; i < n; i++)
            bits += (g[i] >> r) + 1 + r;
        if (bits < best_bits) {
            best_bits = bits;
            best = r;
        }
    }
    return best;
}

/* Appends n float values given as exponents e[] and sign-and-mantissa
 * fields f[] of fbits bits: the smallest exponent, the bit planes of the
 * offsets from it, then the fields. */
static void blk_floats(tblock *b, const unsigned *e, const uint32_t *f, size_t n, unsigned fbits)
{
    if (n == 0)
        return;
    unsigned lo = 255, hi = 0, planes = 0;
    for (size_t i = 0; i < n; i++) {
        lo = e[i] < lo ? e[i] : lo;
        hi = e[i] > hi ? e[i] : hi;
    }
    while ((hi - lo) >> planes)
        planes++;
    uint8_t hdr[2] = {(uint8_t)lo, (uint8_t)planes};
    blk_put(b, hdr, 2);
    for (unsigned j = 0; j < planes; j++) {
        tbits w;
        tb_begin(&w, b);
        for (size_t i = 0; i < n; i++)
            tb_bit(&w, ((e[i] - lo) >> j) & 1u);
    }
    tbits w;
    tb_begin(&w, b);
    for (size_t i = 0; i < n; i++)
        tb_val(&w, f[i], fbits);
}

/* Appends n float32 values. */
static void blk_f32(tblock *b, const float *v, size_t n)
{
    unsigned e[64];
    uint32_t f[64];
    CU_ASSERT_FATAL(n <= 64);
    for (size_t i = 0; i < n; i++) {
        uint32_t x = fbits(v[i]);
        e[i] = (x >> 23) & 0xFF;
        f[i] = (x & 0x7FFFFFu) | ((x >> 31) << 23);
    }
    blk_floats(b, e, f, n, 24);
}

/* Appends n fp16 or bf16 patterns. */
static void blk_u16(tblock *b, uint8_t fmt, const uint16_t *h, size_t n)
{
    const int f16 = fmt == STRATA_VALUES_FP16;
    unsigned e[64];
    uint32_t f[64];
    CU_ASSERT_FATAL(n <= 64);
    for (size_t i = 0; i < n; i++) {
        e[i] = f16 ? (h[i] >> 10) & 0x1Fu : (h[i] >> 7) & 0xFFu;
        f[i] = f16 ? (h[i] & 0x3FFu) | ((uint32_t)(h[i] >> 15) << 10)
                   : (h[i] & 0x7Fu) | ((uint32_t)(h[i] >> 15) << 7);
    }
    blk_floats(b, e, f, n, f16 ? 11 : 8);
}

/* TOPK positions from raw gaps (first = the first index, then index[i] -
 * index[i-1] - 1) with Rice parameter r (-1: the shortest). */
static void blk_positions(tblock *b, const uint64_t *gaps, size_t n, int r)
{
    if (n == 0)
        return;
    uint8_t rb = (uint8_t)(r < 0 ? ref_rice(gaps, n, 31) : (unsigned)r);
    blk_put(b, &rb, 1);
    tbits w;
    tb_begin(&w, b);
    for (size_t i = 0; i < n; i++)
        tb_rice(&w, gaps[i], rb);
    b->pos_end = b->dlen;
}

/* A TOPK fp32 block from raw gaps. */
static void blk_topk(tblock *b, uint64_t numel, const uint64_t *gaps, const float *vals, size_t n)
{
    b->comp = STRATA_COMP_TOPK;
    b->fmt = STRATA_VALUES_FP32;
    b->numel = numel;
    b->count = n;
    b->dlen = 0;
    blk_positions(b, gaps, n, -1);
    blk_f32(b, vals, n);
}

/* INT8 kept values: base (-1: the smallest magnitude), Rice parameter r
 * (-1: the shortest), then sign bit and Rice-coded magnitude - base. */
static void blk_int8(tblock *b, const int *q, size_t n, int base, int r)
{
    if (n == 0)
        return;
    uint64_t off[16];
    CU_ASSERT_FATAL(n <= 16);
    int mn = 127;
    for (size_t j = 0; j < n; j++)
        mn = abs(q[j]) < mn ? abs(q[j]) : mn;
    if (base < 0)
        base = mn;
    for (size_t j = 0; j < n; j++)
        off[j] = (uint64_t)(abs(q[j]) - base);
    uint8_t hdr[2] = {(uint8_t)base, (uint8_t)(r < 0 ? ref_rice(off, n, 7) : (unsigned)r)};
    blk_put(b, hdr, 2);
    tbits w;
    tb_begin(&w, b);
    for (size_t j = 0; j < n; j++) {
        tb_bit(&w, q[j] < 0);
        tb_rice(&w, off[j], hdr[1]);
    }
}

static void body_build(const tbody *t, bbuf *o)
{
    o->n = 0;
    bb_bytes(o, t->magic, 4);
    bb_le(o, t->version, 2);
    bb_le(o, t->reserved, 2);
    bb_le(o, t->round, 4);
    bb_le(o, t->flags, 4);
    bb_le(o, t->model_version, 8);
    bb_le(o, t->client_id, 8);
    bb_le(o, t->sample_count, 8);
    bb_le(o, t->has_count ? t->layer_count : t->nblk, 4);
    for (size_t i = 0; i < t->nblk; i++) {
        const tblock *b = &t->blk[i];
        bb_le(o, b->index, 4);
        bb_le(o, b->comp, 1);
        bb_le(o, b->fmt, 1);
        bb_le(o, b->reserved, 2);
        bb_le(o, b->numel, 8);
        bb_le(o, b->count, 8);
        bb_le(o, b->scale, 4);
        bb_le(o, b->levels, 4);
        bb_le(o, b->rows, 4);
        bb_le(o, b->cols, 4);
        bb_le(o, b->rank, 4);
        bb_le(o, b->seed, 8);
        bb_le(o, b->has_len ? b->data_len : b->dlen, 8);
        bb_bytes(o, b->data, b->dlen);
    }
    bb_le(o, t->has_meta_len ? t->meta_len : t->meta_bytes, 4);
    bb_bytes(o, t->meta, t->meta_bytes);
    bb_bytes(o, t->extra, t->nextra);
    bb_le(o, strata_crc32c(0, o->b, o->n) ^ t->crc_xor, 4);
}

static const char DEFAULT_META[] = "{\"train_loss\":0.5}";

/* Three layers: topk (1000 elements, indices 5, 300, 999), qsgd (5
 * elements, levels 4), sign (11 elements); metadata. */
static void body_default(tbody *t)
{
    memset(t, 0, sizeof(*t));
    memcpy(t->magic, "STRP", 4);
    t->version = 2;
    t->round = 7;
    t->flags = 5;
    t->model_version = 3;
    t->client_id = 42;
    t->sample_count = 100;
    t->nblk = 3;
    static const uint64_t gaps[] = {5, 294, 698};
    static const float vals[] = {1.0f, -2.0f, 0.5f};
    t->blk[0].index = 0;
    blk_topk(&t->blk[0], 1000, gaps, vals, 3);
    static const int8_t q[] = {-4, 0, 1, 4, -1};
    tblock *b = &t->blk[1];
    b->index = 2;
    b->comp = STRATA_COMP_QSGD;
    b->numel = 5;
    b->scale = fbits(2.5f);
    b->levels = 4;
    blk_put(b, q, 5);
    static const uint8_t bits[] = {0xA5, 0x03};
    b = &t->blk[2];
    b->index = 5;
    b->comp = STRATA_COMP_SIGN;
    b->numel = 11;
    b->scale = fbits(0.25f);
    blk_put(b, bits, 2);
    memcpy(t->meta, DEFAULT_META, sizeof(DEFAULT_META) - 1);
    t->meta_bytes = sizeof(DEFAULT_META) - 1;
}

/* The same payload as body_default, built through the API. */
static void payload_default(strata_payload *p, strata_clayer c[3])
{
    static uint32_t idx[] = {5, 300, 999};
    static float vals[] = {1.0f, -2.0f, 0.5f};
    static int8_t q[] = {-4, 0, 1, 4, -1};
    static uint8_t bits[] = {0xA5, 0x03};
    static char meta[sizeof(DEFAULT_META)];
    memcpy(meta, DEFAULT_META, sizeof(DEFAULT_META));
    memset(c, 0, 3 * sizeof(*c));
    c[0] = (strata_clayer){.layer_index = 0,
                           .comp = STRATA_COMP_TOPK,
                           .numel = 1000,
                           .count = 3,
                           .indices = idx,
                           .values = vals};
    c[1] = (strata_clayer){.layer_index = 2,
                           .comp = STRATA_COMP_QSGD,
                           .numel = 5,
                           .qlevels = q,
                           .scale = 2.5f,
                           .levels = 4};
    c[2] = (strata_clayer){
        .layer_index = 5, .comp = STRATA_COMP_SIGN, .numel = 11, .signbits = bits, .scale = 0.25f};
    *p = (strata_payload){.round = 7,
                          .flags = 5,
                          .model_version = 3,
                          .client_id = 42,
                          .sample_count = 100,
                          .num_layers = 3,
                          .layers = c,
                          .metadata_json = meta};
}

/* The hand-built body and the encoder's body are the same bytes, and the
 * worked example of schemas/payload.md §4 is what the encoder writes. */
static void test_independent_writer(void)
{
    tbody t;
    bbuf o;
    body_default(&t);
    body_build(&t, &o);
    strata_payload p;
    strata_clayer c[3];
    payload_default(&p, c);
    uint8_t *wire = NULL;
    size_t len = 0, blen = 0;
    CU_ASSERT_EQUAL_FATAL(strata_payload_encode(&p, 0, &wire, &len, NULL), STRATA_OK);
    uint8_t *body = unzstd(wire, len, &blen);
    CU_ASSERT_EQUAL(blen, o.n);
    CU_ASSERT(blen == o.n && memcmp(body, o.b, blen) == 0);
    free(body);
    free(wire);

    size_t zlen;
    uint8_t *z = zstd_wrap(o.b, o.n, &zlen);
    strata_payload *q = decode_ok(z, zlen, "hand-built default body");
    CU_ASSERT(q != NULL && payloads_equal(&p, q));
    strata_payload_free(q);
    free(z);

    /* schemas/payload.md §4. */
    static const uint8_t example[] = {
        0x53, 0x54, 0x52, 0x50, 0x02, 0x00, 0x00, 0x00, /* "STRP", version 2, reserved */
        0x07, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, /* round 7, flags 0 */
        0x03, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, /* model_version 3 */
        0x2a, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, /* client_id 42 */
        0x64, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, /* sample_count 100 */
        0x01, 0x00, 0x00, 0x00,                         /* layer_count 1 */
        0x02, 0x00, 0x00, 0x00, 0x03, 0x00, 0x00, 0x00, /* layer 2, topk, fp32 */
        0xe8, 0x03, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, /* numel 1000 */
        0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, /* count 2 */
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, /* scale, levels */
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, /* rows, cols */
        0x00, 0x00, 0x00, 0x00,                         /* rank */
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, /* seed */
        0x0d, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, /* data_len 13 */
        0x06, 0x8a, 0x67, 0x02,                         /* Rice r = 6; gaps 5, 294 */
        0x7f, 0x01, 0x02,                               /* exponents 127 + {0, 1} */
        0x00, 0x00, 0x00, 0x00, 0x00, 0x80,             /* sign+mantissa fields */
        0x00, 0x00, 0x00, 0x00,                         /* metadata_len 0 */
        0x9c, 0x33, 0xa4, 0xf6,                         /* CRC32C 0xF6A4339C */
    };
    static uint32_t ex_idx[] = {5, 300};
    static float ex_vals[] = {1.0f, -2.0f};
    strata_clayer ex = {.layer_index = 2,
                        .comp = STRATA_COMP_TOPK,
                        .numel = 1000,
                        .count = 2,
                        .indices = ex_idx,
                        .values = ex_vals};
    strata_payload ep = {.round = 7,
                         .model_version = 3,
                         .client_id = 42,
                         .sample_count = 100,
                         .num_layers = 1,
                         .layers = &ex};
    CU_ASSERT_EQUAL_FATAL(strata_payload_encode(&ep, 0, &wire, &len, NULL), STRATA_OK);
    body = unzstd(wire, len, &blen);
    CU_ASSERT_EQUAL(blen, sizeof(example));
    CU_ASSERT(blen == sizeof(example) && memcmp(body, example, blen) == 0);
    if (blen == sizeof(example) && memcmp(body, example, blen) != 0)
        fprintf(stderr, "\n  example CRC is %02x %02x %02x %02x\n", body[blen - 4], body[blen - 3],
                body[blen - 2], body[blen - 1]);
    free(body);
    free(wire);
}

/* ------------------------------------------------------------------------ */
/* Malformed bodies (table)                                                 */
/* ------------------------------------------------------------------------ */

typedef struct bad_body {
    const char *name;
    void (*tweak)(tbody *t);
    strata_payload_limits lim;
    int rc;
    const char *expect;
} bad_body;

static const float V3[] = {1.0f, -2.0f, 0.5f};

static void t_magic(tbody *t)
{
    memcpy(t->magic, "STRQ", 4);
}
static void t_version(tbody *t)
{
    t->version = 1;
}
static void t_reserved(tbody *t)
{
    t->reserved = 1;
}
static void t_count_more(tbody *t)
{
    t->has_count = 1;
    t->layer_count = 4;
}
static void t_count_less(tbody *t)
{
    t->has_count = 1;
    t->layer_count = 2;
}
static void t_count_huge(tbody *t)
{
    t->has_count = 1;
    t->layer_count = 60000;
}
static void t_count_above_default(tbody *t)
{
    t->has_count = 1;
    t->layer_count = 1000000;
}
static void t_count_block_truncated(tbody *t)
{
    /* A data-heavy first block lets 4 x 60 bytes pass the up-front check;
     * the fourth block header then runs into the metadata. */
    uint64_t g[20];
    float v[20];
    for (int i = 0; i < 20; i++) {
        g[i] = 1;
        v[i] = (float)i;
    }
    blk_topk(&t->blk[0], 1000, g, v, 20);
    t->has_count = 1;
    t->layer_count = 4;
}
static void t_dup_index(tbody *t)
{
    t->blk[1].index = 0;
}
static void t_order(tbody *t)
{
    t->blk[2].index = 1;
}
static void t_comp(tbody *t)
{
    t->blk[0].comp = 8;
}
static void t_fmt(tbody *t)
{
    t->blk[0].fmt = 5;
}
static void t_blk_reserved(tbody *t)
{
    t->blk[1].reserved = 0x100;
}
static void t_numel0(tbody *t)
{
    t->blk[2].numel = 0;
}
static void t_numel_huge(tbody *t)
{
    t->blk[0].numel = (uint64_t)1 << 32;
}
static void t_count_above(tbody *t)
{
    t->blk[0].count = 1001;
}
static void t_none_count(tbody *t)
{
    tblock *b = &t->blk[0];
    b->comp = STRATA_COMP_NONE;
    b->numel = 4;
    b->dlen = 0;
    blk_f32(b, V3, 3);
}
static void t_index_range(tbody *t)
{
    static const uint64_t g[] = {5, 294, 900};
    blk_topk(&t->blk[0], 1000, g, V3, 3);
}
static void t_index_range_low(tbody *t)
{
    /* 301 + 699 = 1000: beyond the last element only by the low bits. */
    static const uint64_t g[] = {5, 294, 699};
    blk_topk(&t->blk[0], 1000, g, V3, 3);
}
static void t_first_range(tbody *t)
{
    static const uint64_t g[] = {1000};
    blk_topk(&t->blk[0], 1000, g, V3, 1);
}
static void t_no_room(tbody *t)
{
    static const uint64_t g[] = {999, 0};
    blk_topk(&t->blk[0], 1000, g, V3, 2);
}
static void rice_block(tbody *t, int r)
{
    static const uint64_t g[] = {5, 294, 698};
    tblock *b = &t->blk[0];
    b->dlen = 0;
    blk_positions(b, g, 3, r);
    blk_f32(b, V3, 3);
}
static void t_rice_big(tbody *t)
{
    rice_block(t, 32);
}
static void t_rice_not_best(tbody *t)
{
    rice_block(t, 3);
}
static void t_pos_padding(tbody *t)
{
    tblock *b = &t->blk[0];
    CU_ASSERT_FATAL(b->pos_end >= 2 && b->data[b->pos_end - 1] < 0x80);
    b->data[b->pos_end - 1] |= 0x80;
}
static void t_pos_truncated(tbody *t)
{
    /* Ones to the end of the data: the last unary never ends. */
    tblock *b = &t->blk[0];
    b->count = 1;
    b->dlen = 0;
    static const uint8_t d[] = {0x00, 0xFF, 0xFF};
    blk_put(b, d, sizeof(d));
}
static void t_count_bits(tbody *t)
{
    t->blk[0].count = 900;
}
static void t_topk_short(tbody *t)
{
    t->blk[0].has_len = 1;
    t->blk[0].data_len = 10; /* positions + 10 value bytes; 12 needed */
    t->blk[0].dlen = 10;
}
static void t_nan(tbody *t)
{
    static const uint64_t g[] = {5, 294, 698};
    const float v[] = {1.0f, NAN, 0.5f};
    blk_topk(&t->blk[0], 1000, g, v, 3);
}
static void t_inf(tbody *t)
{
    static const uint64_t g[] = {5, 294, 698};
    const float v[] = {1.0f, -2.0f, -INFINITY};
    blk_topk(&t->blk[0], 1000, g, v, 3);
}
static void half_block(tbody *t, uint8_t comp, uint8_t fmt, uint16_t bad)
{
    tblock *b = &t->blk[2];
    const uint16_t h[] = {0x3C00, 0x0001, bad};
    memset(b, 0, sizeof(*b));
    b->index = 5;
    b->comp = comp;
    b->fmt = fmt;
    b->numel = 3;
    b->count = 3;
    blk_u16(b, fmt, h, 3);
}
static void t_fp16_exponent(tbody *t)
{
    half_block(t, STRATA_COMP_FP16, STRATA_VALUES_FP16, 0x3C00);
    t->blk[2].data[0] = 20; /* base 20 + offset 15 */
}
static void t_exponent_base(tbody *t)
{
    half_block(t, STRATA_COMP_FP16, STRATA_VALUES_FP16, 0x3C00);
    t->blk[2].data[2] |= 0x02; /* value 1's offset becomes 1: none is 0 */
}
static void t_exponent_plane_padding(tbody *t)
{
    half_block(t, STRATA_COMP_FP16, STRATA_VALUES_FP16, 0x3C00);
    t->blk[2].data[2] |= 0x80;
}
static void t_half_padding(tbody *t)
{
    half_block(t, STRATA_COMP_FP16, STRATA_VALUES_FP16, 0x3C00);
    t->blk[2].data[t->blk[2].dlen - 1] |= 0x80; /* 33 bits: 7 padding bits */
}
/* A TOPK block of three kept elements (indices 5, 300, 999) with
 * quantised values: INT8 levels q (base, r: -1 for the canonical ones) or,
 * with q NULL, TERNARY signs neg. */
static void quant_block(tbody *t, const int *q, int base, int r, uint8_t neg, uint32_t scale)
{
    static const uint64_t g[] = {5, 294, 698};
    tblock *b = &t->blk[0];
    b->fmt = q != NULL ? STRATA_VALUES_INT8 : STRATA_VALUES_TERNARY;
    b->scale = scale;
    b->dlen = 0;
    blk_positions(b, g, 3, -1);
    if (q != NULL)
        blk_int8(b, q, 3, base, r);
    else
        blk_put(b, &neg, 1);
}
static const int Q3[] = {90, -127, 101};
static void t_int8_ok(tbody *t)
{
    quant_block(t, Q3, -1, -1, 0, fbits(0.5f));
}
static void t_ternary_ok(tbody *t)
{
    quant_block(t, NULL, 0, 0, 0x02, fbits(1.5f));
}
static void t_int8_scale_nan(tbody *t)
{
    quant_block(t, Q3, -1, -1, 0, 0x7FC00000u);
}
static void t_int8_scale_not_bf16(tbody *t)
{
    quant_block(t, Q3, -1, -1, 0, fbits(0.5f) | 1u);
}
static void t_int8_scale_neg(tbody *t)
{
    quant_block(t, Q3, -1, -1, 0, fbits(-0.5f));
}
static void t_int8_scale_overflow(tbody *t)
{
    quant_block(t, Q3, -1, -1, 0, 0x7CC10000u); /* 8.0e36: 127 times it is infinite */
}
static void t_int8_big(tbody *t)
{
    static const int q[] = {90, -120, 101};
    quant_block(t, q, -1, -1, 0, fbits(0.5f));
    /* The largest offset (30) grows by 2^r * 16 through extra unary ones:
     * rebuild with base 90 and a magnitude of 200 instead. */
    tblock *b = &t->blk[0];
    b->dlen = b->pos_end;
    static const int q2[] = {90, -200, 101};
    blk_int8(b, q2, 3, 90, 0);
}
static void t_int8_minus_zero(tbody *t)
{
    static const int q[] = {0, 3, 4};
    quant_block(t, q, -1, -1, 0, fbits(0.5f));
    t->blk[0].data[t->blk[0].pos_end + 2] |= 1; /* sign bit of the first value */
}
static void t_int8_base(tbody *t)
{
    quant_block(t, Q3, 80, -1, 0, fbits(0.5f));
}
static void t_int8_rice(tbody *t)
{
    quant_block(t, Q3, -1, 0, 0, fbits(0.5f));
}
static void t_int8_rice_big(tbody *t)
{
    quant_block(t, Q3, -1, 8, 0, fbits(0.5f));
}
static void t_int8_zero_scale(tbody *t)
{
    quant_block(t, Q3, -1, -1, 0, 0);
}
static void t_int8_on_qsgd(tbody *t)
{
    t->blk[1].fmt = STRATA_VALUES_INT8;
}
static void t_ternary_on_sign(tbody *t)
{
    t->blk[2].fmt = STRATA_VALUES_TERNARY;
}
static void t_ternary_inf(tbody *t)
{
    quant_block(t, NULL, 0, 0, 0x02, 0x7F800000u);
}
static void t_ternary_zero_neg(tbody *t)
{
    quant_block(t, NULL, 0, 0, 0x02, 0);
}
static void t_ternary_padding(tbody *t)
{
    quant_block(t, NULL, 0, 0, 0x0A, fbits(1.5f));
}
static void t_ternary_len(tbody *t)
{
    quant_block(t, NULL, 0, 0, 0x02, fbits(1.5f));
    uint8_t z = 0;
    blk_put(&t->blk[0], &z, 1);
}
static void t_fp16_nan(tbody *t)
{
    half_block(t, STRATA_COMP_NONE, STRATA_VALUES_FP16, 0x7E00);
}
static void t_fp16_inf(tbody *t)
{
    half_block(t, STRATA_COMP_FP16, STRATA_VALUES_FP16, 0xFC00);
}
static void t_bf16_inf(tbody *t)
{
    half_block(t, STRATA_COMP_BF16, STRATA_VALUES_BF16, 0x7F80);
}
static void t_fp16_ok(tbody *t)
{
    half_block(t, STRATA_COMP_FP16, STRATA_VALUES_FP16, 0x7BFF);
}
static void t_fp16_not_exact(tbody *t)
{
    tblock *b = &t->blk[2];
    const float v[] = {1.0f, 0.1f};
    memset(b, 0, sizeof(*b));
    b->index = 5;
    b->comp = STRATA_COMP_FP16;
    b->numel = 2;
    b->count = 2;
    blk_f32(b, v, 2);
}
static void t_bf16_not_exact(tbody *t)
{
    t_fp16_not_exact(t);
    t->blk[2].comp = STRATA_COMP_BF16;
}
static void t_scale_nan(tbody *t)
{
    t->blk[1].scale = 0x7FC00000u;
}
static void t_scale_inf(tbody *t)
{
    t->blk[2].scale = 0x7F800000u;
}
static void t_scale_neg(tbody *t)
{
    t->blk[1].scale = fbits(-1.0f);
}
static void t_qlevel(tbody *t)
{
    t->blk[1].data[3] = 5;
}
static void t_qlevel_min(tbody *t)
{
    t->blk[1].data[0] = 0x80;
}
static void t_levels0(tbody *t)
{
    t->blk[1].levels = 0;
}
static void t_levels128(tbody *t)
{
    t->blk[1].levels = 128;
}
static void t_qsgd_count(tbody *t)
{
    t->blk[1].count = 3;
}
static void t_qsgd_len(tbody *t)
{
    t->blk[1].dlen = 4;
}
static void t_sign_padding(tbody *t)
{
    t->blk[2].data[1] = 0x0B;
}
static void t_sign_count(tbody *t)
{
    t->blk[2].count = 11;
}
static void pgsd_block(tbody *t, uint32_t rows, uint32_t cols, uint32_t rank, uint64_t numel,
                       uint64_t count)
{
    tblock *b = &t->blk[2];
    memset(b, 0, sizeof(*b));
    b->index = 5;
    b->comp = STRATA_COMP_POWERSGD;
    b->numel = numel;
    b->count = count;
    b->rows = rows;
    b->cols = cols;
    b->rank = rank;
    float v[16];
    for (int i = 0; i < 16; i++)
        v[i] = (float)i - 7.5f;
    blk_f32(b, v, count <= 16 ? (size_t)count : 16);
}
static void t_pgsd_ok(tbody *t)
{
    pgsd_block(t, 2, 3, 2, 6, 10);
}
static void t_pgsd_dims(tbody *t)
{
    pgsd_block(t, 2, 3, 1, 7, 5);
}
static void t_pgsd_rank(tbody *t)
{
    pgsd_block(t, 2, 3, 3, 6, 15);
}
static void t_pgsd_rank0(tbody *t)
{
    pgsd_block(t, 2, 3, 0, 6, 0);
}
static void t_pgsd_count(tbody *t)
{
    pgsd_block(t, 2, 3, 2, 6, 9);
}
static void t_randk_ok(tbody *t)
{
    tblock *b = &t->blk[0];
    b->comp = STRATA_COMP_RANDK;
    b->seed = 0xDEADBEEFull;
    b->dlen = 0;
    blk_f32(b, V3, 3);
}
static void t_stray_seed(tbody *t)
{
    t->blk[0].seed = 1;
}
static void t_stray_scale(tbody *t)
{
    t->blk[0].scale = 0x80000000u; /* -0.0: any bit set is refused */
}
static void t_stray_levels(tbody *t)
{
    t->blk[2].levels = 2;
}
static void t_stray_dims(tbody *t)
{
    t->blk[1].cols = 1;
}
static void t_data_len(tbody *t)
{
    t->blk[2].has_len = 1;
    t->blk[2].data_len = 1000;
}
static void t_data_len_huge(tbody *t)
{
    t->blk[0].has_len = 1;
    t->blk[0].data_len = UINT64_MAX;
}
static void set_meta(tbody *t, const char *m, size_t n)
{
    memcpy(t->meta, m, n);
    t->meta_bytes = n;
}
static void t_meta_json(tbody *t)
{
    set_meta(t, "{\"a\":", 5);
}
static void t_meta_array(tbody *t)
{
    set_meta(t, "[1,2]", 5);
}
static void t_meta_dup(tbody *t)
{
    set_meta(t, "{\"a\":1,\"a\":2}", 13);
}
static void t_meta_nul(tbody *t)
{
    set_meta(t, "{\"a\":\0}", 7);
}
static void t_meta_esc_nul(tbody *t)
{
    set_meta(t, "{\"a\":\"\\u0000\"}", 14);
}
static void t_meta_trailing(tbody *t)
{
    set_meta(t, "{\"a\":1} x", 9);
}
static void t_meta_utf8(tbody *t)
{
    set_meta(t, "{\"a\":\"\xff\"}", 8);
}
static void t_meta_len(tbody *t)
{
    t->has_meta_len = 1;
    t->meta_len = 1000;
}
static void t_meta_short(tbody *t)
{
    t->has_meta_len = 1;
    t->meta_len = 5;
}
static void t_extra(tbody *t)
{
    t->nextra = 3;
}
static void t_crc(tbody *t)
{
    t->crc_xor = 1;
}
static void t_no_meta(tbody *t)
{
    t->meta_bytes = 0;
}

static const bad_body BAD_BODIES[] = {
    {"control: valid", NULL, {0}, STRATA_OK, NULL},
    {"control: no metadata", t_no_meta, {0}, STRATA_OK, NULL},
    {"control: randk", t_randk_ok, {0}, STRATA_OK, NULL},
    {"control: fp16 65504", t_fp16_ok, {0}, STRATA_OK, NULL},
    {"control: powersgd", t_pgsd_ok, {0}, STRATA_OK, NULL},
    {"bad magic", t_magic, {0}, STRATA_EPROTO, "bad magic"},
    {"version 2",
     t_version,
     {0},
     STRATA_EPROTO,
     "unsupported format version 1 (this decoder reads 2)"},
    {"header reserved", t_reserved, {0}, STRATA_EPROTO, "reserved header field is 1"},
    {"layer count too high",
     t_count_more,
     {0},
     STRATA_EPROTO,
     "layer count 4 needs at least 240 bytes"},
    {"layer count too high, data-heavy",
     t_count_block_truncated,
     {0},
     STRATA_EPROTO,
     "layer block 3 at body byte 323: truncated"},
    {"layer count too low", t_count_less, {0}, STRATA_EPROTO, "metadata"},
    {"layer count huge", t_count_huge, {0}, STRATA_EPROTO, "layer count 60000 needs"},
    {"layer count above default limit",
     t_count_above_default,
     {0},
     STRATA_ETOOBIG,
     "layer count 1000000 above the limit of 65536"},
    {"layer count above limit",
     NULL,
     {.max_layers = 2},
     STRATA_ETOOBIG,
     "layer count 3 above the limit of 2"},
    {"duplicate layer index", t_dup_index, {0}, STRATA_EPROTO, "duplicate layer index"},
    {"layers out of order", t_order, {0}, STRATA_EPROTO, "out-of-order layer index"},
    {"unknown compressor", t_comp, {0}, STRATA_EPROTO, "unknown compressor id 8"},
    {"unknown values format", t_fmt, {0}, STRATA_EPROTO, "unknown values format 5"},
    {"block reserved", t_blk_reserved, {0}, STRATA_EPROTO, "reserved block field is 256"},
    {"numel 0", t_numel0, {0}, STRATA_EPROTO, "numel 0 outside"},
    {"numel 2^32", t_numel_huge, {0}, STRATA_EPROTO, "numel 4294967296 outside"},
    {"numel above limit",
     NULL,
     {.max_layer_numel = 999},
     STRATA_ETOOBIG,
     "layer 0 (topk, block 0): numel 1000 above the limit of 999"},
    {"topk count above numel",
     t_count_above,
     {0},
     STRATA_EPROTO,
     "count 1001 exceeds the tensor's 1000 elements"},
    {"dense count != numel", t_none_count, {0}, STRATA_EPROTO, "count 3 differs from numel 4"},
    {"index out of range",
     t_index_range,
     {0},
     STRATA_EPROTO,
     "layer 0 (topk, block 0): index entry 2 out of range for 1000 elements"},
    {"first index out of range",
     t_first_range,
     {0},
     STRATA_EPROTO,
     "index 1000 out of range for 1000 elements (entry 0)"},
    {"index out of range by the low bits",
     t_index_range_low,
     {0},
     STRATA_EPROTO,
     "index 1000 out of range for 1000 elements (entry 2)"},
    {"no room for the next index", t_no_room, {0}, STRATA_EPROTO, "entry 1 has no room"},
    {"Rice parameter 32", t_rice_big, {0}, STRATA_EPROTO, "Rice parameter 32 above 31"},
    {"Rice parameter not the shortest",
     t_rice_not_best,
     {0},
     STRATA_EPROTO,
     "Rice parameter 3 is not the shortest"},
    {"positions padding", t_pos_padding, {0}, STRATA_EPROTO, "padding bits after the positions"},
    {"positions truncated", t_pos_truncated, {0}, STRATA_EPROTO, "positions stream is truncated"},
    {"count beyond the data's bits",
     t_count_bits,
     {0},
     STRATA_EPROTO,
     "cannot hold 900 kept elements"},
    {"topk data too short",
     t_topk_short,
     {0},
     STRATA_EPROTO,
     "3 fp32 values with 2 exponent planes, which take 13"},
    {"fp16 exponent 35",
     t_fp16_exponent,
     {0},
     STRATA_EPROTO,
     "fp16 exponent 35 of value 0 above 31"},
    {"exponent base not the smallest",
     t_exponent_base,
     {0},
     STRATA_EPROTO,
     "exponent base 0 is not the smallest exponent"},
    {"exponent plane padding",
     t_exponent_plane_padding,
     {0},
     STRATA_EPROTO,
     "padding bits after exponent plane 0"},
    {"fp16 padding", t_half_padding, {0}, STRATA_EPROTO, "padding bits after the values"},
    {"control: int8", t_int8_ok, {0}, STRATA_OK, NULL},
    {"control: ternary", t_ternary_ok, {0}, STRATA_OK, NULL},
    {"int8 scale NaN", t_int8_scale_nan, {0}, STRATA_EPROTO, "not a finite bfloat16 value"},
    {"int8 scale not bf16", t_int8_scale_not_bf16, {0}, STRATA_EPROTO, "not a finite bfloat16"},
    {"int8 scale negative", t_int8_scale_neg, {0}, STRATA_EPROTO, "int8 scale -0.5 is not"},
    {"int8 scale times 127 overflows",
     t_int8_scale_overflow,
     {0},
     STRATA_EPROTO,
     "times 127 overflows float32"},
    {"int8 magnitude 200", t_int8_big, {0}, STRATA_EPROTO, "magnitude above 127"},
    {"int8 -0", t_int8_minus_zero, {0}, STRATA_EPROTO, "int8 value 0 is -0"},
    {"int8 base not the smallest",
     t_int8_base,
     {0},
     STRATA_EPROTO,
     "base 80 is not the smallest magnitude"},
    {"int8 Rice parameter not the shortest",
     t_int8_rice,
     {0},
     STRATA_EPROTO,
     "int8 Rice parameter 0 is not the shortest"},
    {"int8 Rice parameter 8", t_int8_rice_big, {0}, STRATA_EPROTO, "Rice parameter 8 above 7"},
    {"int8 levels under a zero scale", t_int8_zero_scale, {0}, STRATA_EPROTO, "under a zero scale"},
    {"int8 on qsgd", t_int8_on_qsgd, {0}, STRATA_EPROTO, "int8 applies only to topk and randk"},
    {"ternary on sign",
     t_ternary_on_sign,
     {0},
     STRATA_EPROTO,
     "ternary applies only to topk and randk"},
    {"ternary magnitude infinite", t_ternary_inf, {0}, STRATA_EPROTO, "ternary scale inf"},
    {"ternary negative under zero",
     t_ternary_zero_neg,
     {0},
     STRATA_EPROTO,
     "negative under a zero magnitude"},
    {"ternary padding", t_ternary_padding, {0}, STRATA_EPROTO, "padding bits after the signs"},
    {"ternary extra byte", t_ternary_len, {0}, STRATA_EPROTO, "2 bytes of ternary signs"},
    {"NaN value", t_nan, {0}, STRATA_EPROTO, "layer 0 (topk, block 0): value 1 is NaN"},
    {"infinite value", t_inf, {0}, STRATA_EPROTO, "value 2 is infinite"},
    {"fp16 NaN", t_fp16_nan, {0}, STRATA_EPROTO, "value 2 is NaN"},
    {"fp16 -Inf", t_fp16_inf, {0}, STRATA_EPROTO, "value 2 is infinite"},
    {"bf16 Inf", t_bf16_inf, {0}, STRATA_EPROTO, "value 2 is infinite"},
    {"fp16 comp, inexact fp32",
     t_fp16_not_exact,
     {0},
     STRATA_EPROTO,
     "value 1 (0.100000001) is not exactly representable in fp16"},
    {"bf16 comp, inexact fp32",
     t_bf16_not_exact,
     {0},
     STRATA_EPROTO,
     "not exactly representable in bf16"},
    {"NaN scale", t_scale_nan, {0}, STRATA_EPROTO, "(qsgd, block 1): scale nan"},
    {"infinite scale", t_scale_inf, {0}, STRATA_EPROTO, "(sign, block 2): scale inf"},
    {"negative scale", t_scale_neg, {0}, STRATA_EPROTO, "scale -1 is not a finite value >= 0"},
    {"qlevel beyond levels", t_qlevel, {0}, STRATA_EPROTO, "qlevel 5 at element 3 beyond +-4"},
    {"qlevel -128", t_qlevel_min, {0}, STRATA_EPROTO, "qlevel -128 at element 0"},
    {"levels 0", t_levels0, {0}, STRATA_EPROTO, "levels 0 outside [1, 127]"},
    {"levels 128", t_levels128, {0}, STRATA_EPROTO, "levels 128 outside [1, 127]"},
    {"qsgd count",
     t_qsgd_count,
     {0},
     STRATA_EPROTO,
     "layer 2 (qsgd, block 1): count 3 must be 0 (the layer carries no values)"},
    {"sign count = numel",
     t_sign_count,
     {0},
     STRATA_EPROTO,
     "layer 5 (sign, block 2): count 11 must be 0"},
    {"qsgd data length", t_qsgd_len, {0}, STRATA_EPROTO, "data length 4 differs from the 5"},
    {"sign padding bits", t_sign_padding, {0}, STRATA_EPROTO, "padding bits after element 10"},
    {"powersgd rows*cols",
     t_pgsd_dims,
     {0},
     STRATA_EPROTO,
     "rows 2 x cols 3 does not match numel 7"},
    {"powersgd rank > min", t_pgsd_rank, {0}, STRATA_EPROTO, "rank 3 outside [1, min(rows, cols)"},
    {"powersgd rank 0", t_pgsd_rank0, {0}, STRATA_EPROTO, "rank 0 outside"},
    {"powersgd count",
     t_pgsd_count,
     {0},
     STRATA_EPROTO,
     "count 9 differs from (rows + cols) * rank = 10"},
    {"stray seed", t_stray_seed, {0}, STRATA_EPROTO, "field seed must be 0"},
    {"stray scale", t_stray_scale, {0}, STRATA_EPROTO, "field scale must be 0"},
    {"stray levels", t_stray_levels, {0}, STRATA_EPROTO, "field levels must be 0"},
    {"stray dims", t_stray_dims, {0}, STRATA_EPROTO, "field rows/cols/rank must be 0"},
    {"data length past the body",
     t_data_len,
     {0},
     STRATA_EPROTO,
     "truncated: data length 1000 exceeds"},
    {"data length 2^64-1", t_data_len_huge, {0}, STRATA_EPROTO, "data length 18446744073709551615"},
    {"metadata invalid JSON", t_meta_json, {0}, STRATA_EPROTO, "metadata: invalid JSON"},
    {"metadata array", t_meta_array, {0}, STRATA_EPROTO, "metadata: JSON value is not an object"},
    {"metadata duplicate key", t_meta_dup, {0}, STRATA_EPROTO, "duplicate"},
    {"metadata NUL byte", t_meta_nul, {0}, STRATA_EPROTO, "metadata: NUL byte at offset 5"},
    {"metadata \\u0000", t_meta_esc_nul, {0}, STRATA_EPROTO, "metadata: invalid JSON"},
    {"metadata trailing text", t_meta_trailing, {0}, STRATA_EPROTO, "metadata: invalid JSON"},
    {"metadata bad UTF-8", t_meta_utf8, {0}, STRATA_EPROTO, "metadata: invalid JSON"},
    {"metadata length past the body",
     t_meta_len,
     {0},
     STRATA_EPROTO,
     "metadata length 1000 exceeds"},
    {"metadata shorter than stored", t_meta_short, {0}, STRATA_EPROTO, "metadata"},
    {"metadata above limit",
     NULL,
     {.max_metadata_bytes = 10},
     STRATA_ETOOBIG,
     "metadata length 18 above the limit of 10"},
    {"bytes before the CRC",
     t_extra,
     {0},
     STRATA_EPROTO,
     "3 unexpected bytes between the metadata and the checksum"},
    {"wrong CRC", t_crc, {0}, STRATA_EPROTO, "checksum mismatch"},
    {"body above max_decoded_bytes",
     NULL,
     {.max_decoded_bytes = 100},
     STRATA_ETOOBIG,
     "above the limit of 100"},
};

static void test_malformed_bodies(void)
{
    for (size_t i = 0; i < sizeof(BAD_BODIES) / sizeof(BAD_BODIES[0]); i++) {
        const bad_body *c = &BAD_BODIES[i];
        tbody t;
        bbuf o;
        body_default(&t);
        if (c->tweak != NULL)
            c->tweak(&t);
        body_build(&t, &o);
        size_t len;
        uint8_t *wire = zstd_wrap(o.b, o.n, &len);
        if (c->rc == STRATA_OK) {
            strata_payload *p = NULL;
            strata_diag diag = {{0}};
            int rc = strata_payload_decode(wire, len, &c->lim, &p, &diag);
            CASE_ASSERT(rc == STRATA_OK && p != NULL, c->name);
            if (rc != STRATA_OK)
                fprintf(stderr, "  diag: %s\n", diag.msg);
            strata_payload_free(p);
        } else {
            expect_reject(c->name, wire, len, &c->lim, c->rc, c->expect);
        }
        free(wire);
    }
}

/* ------------------------------------------------------------------------ */
/* Malformed frames                                                         */
/* ------------------------------------------------------------------------ */

/* A zstd frame built by hand: single-segment header with an 8-byte content
 * size of `declared`, then one raw last block holding body. */
static size_t raw_frame(uint8_t *out, const uint8_t *body, size_t n, uint64_t declared)
{
    static const uint8_t magic[4] = {0x28, 0xB5, 0x2F, 0xFD};
    size_t k = 0;
    memcpy(out, magic, 4);
    k = 4;
    out[k++] = 0xE0; /* FCS field 8 bytes, single segment */
    for (int i = 0; i < 8; i++)
        out[k++] = (uint8_t)(declared >> (8 * i));
    uint32_t bh = 1u | (0u << 1) | ((uint32_t)n << 3); /* last, raw, size */
    out[k++] = (uint8_t)bh;
    out[k++] = (uint8_t)(bh >> 8);
    out[k++] = (uint8_t)(bh >> 16);
    memcpy(out + k, body, n);
    return k + n;
}

static void test_malformed_frames(void)
{
    tbody t;
    bbuf o;
    body_default(&t);
    body_build(&t, &o);
    size_t len;
    uint8_t *wire = zstd_wrap(o.b, o.n, &len);
    uint8_t *buf = malloc(2 * len + 2 * sizeof(o.b) + 64);
    CU_ASSERT_PTR_NOT_NULL_FATAL(buf);

    expect_reject("empty input", buf, 0, NULL, STRATA_EPROTO, "too short for a zstd frame");
    expect_reject("NULL, 0", NULL, 0, NULL, STRATA_EPROTO, "too short");
    expect_reject("plain body, not zstd", o.b, o.n, NULL, STRATA_EPROTO,
                  "not a zstd frame (first bytes 53 54 52 50)");

    /* Hand-built raw frame decodes; the same with lies in its header fails. */
    size_t n = raw_frame(buf, o.b, o.n, o.n);
    strata_payload *p = decode_ok(buf, n, "raw-block frame");
    strata_payload_free(p);
    n = raw_frame(buf, o.b, o.n, (uint64_t)1 << 40);
    expect_reject("declares 2^40 bytes", buf, n, NULL, STRATA_ETOOBIG,
                  "zstd frame declares 1099511627776 decoded bytes, above the limit of "
                  "1073741824");
    n = raw_frame(buf, o.b, o.n, UINT64_MAX - 5);
    expect_reject("declares 2^64-6 bytes", buf, n, NULL, STRATA_ETOOBIG, "above the limit");
    n = raw_frame(buf, o.b, o.n, STRATA_PAYLOAD_DEFAULT_MAX_DECODED_BYTES + 1);
    expect_reject("declares limit + 1", buf, n, NULL, STRATA_ETOOBIG, "above the limit");
    n = raw_frame(buf, o.b, o.n, o.n + 1);
    expect_reject("declares one byte more", buf, n, NULL, STRATA_EPROTO, "zstd");
    n = raw_frame(buf, o.b, o.n, 10);
    expect_reject("declares 10 bytes", buf, n, NULL, STRATA_EPROTO, "below the 52-byte minimum");
    /* Header only: the huge size is refused before the missing blocks matter. */
    n = raw_frame(buf, o.b, 0, (uint64_t)1 << 50);
    expect_reject("enormous, header only", buf, 13, NULL, STRATA_ETOOBIG, "above the limit");

    /* A valid frame that omits the content size field. */
    ZSTD_CCtx *cctx = ZSTD_createCCtx();
    CU_ASSERT_PTR_NOT_NULL_FATAL(cctx);
    CU_ASSERT(!ZSTD_isError(ZSTD_CCtx_setParameter(cctx, ZSTD_c_contentSizeFlag, 0)));
    n = ZSTD_compress2(cctx, buf, 2 * len + 2 * sizeof(o.b), o.b, o.n);
    CU_ASSERT_FATAL(!ZSTD_isError(n));
    ZSTD_freeCCtx(cctx);
    CU_ASSERT_EQUAL(ZSTD_getFrameContentSize(buf, n), ZSTD_CONTENTSIZE_UNKNOWN);
    expect_reject("no content size", buf, n, NULL, STRATA_EPROTO,
                  "does not declare its content size");

    /* The optional zstd content checksum is accepted, and verified. */
    cctx = ZSTD_createCCtx();
    CU_ASSERT_PTR_NOT_NULL_FATAL(cctx);
    CU_ASSERT(!ZSTD_isError(ZSTD_CCtx_setParameter(cctx, ZSTD_c_checksumFlag, 1)));
    n = ZSTD_compress2(cctx, buf, 2 * len + 2 * sizeof(o.b), o.b, o.n);
    CU_ASSERT_FATAL(!ZSTD_isError(n));
    ZSTD_freeCCtx(cctx);
    p = decode_ok(buf, n, "zstd checksum present");
    strata_payload_free(p);
    buf[n - 1] ^= 0x01;
    expect_reject("zstd checksum wrong", buf, n, NULL, STRATA_EPROTO, "zstd decompression failed");

    memcpy(buf, wire, len);
    memcpy(buf + len, wire, len);
    expect_reject("two frames", buf, 2 * len, NULL, STRATA_EPROTO,
                  "after the zstd frame (a second frame");
    memcpy(buf + len, "junk", 4);
    expect_reject("trailing garbage", buf, len + 4, NULL, STRATA_EPROTO,
                  "4 bytes after the zstd frame (trailing garbage)");
    buf[len] = 0;
    expect_reject("one trailing zero", buf, len + 1, NULL, STRATA_EPROTO,
                  "1 bytes after the zstd frame");
    expect_reject("truncated frame", wire, len - 1, NULL, STRATA_EPROTO,
                  "zstd frame is truncated or corrupt");
    static const uint8_t skippable[] = {0x50, 0x2A, 0x4D, 0x18, 0x00, 0x00, 0x00, 0x00};
    memcpy(buf, skippable, sizeof(skippable));
    memcpy(buf + sizeof(skippable), wire, len);
    expect_reject("skippable frame first", buf, sizeof(skippable) + len, NULL, STRATA_EPROTO,
                  "skippable");
    free(buf);
    free(wire);
}

/* ------------------------------------------------------------------------ */
/* Exhaustive corruption                                                    */
/* ------------------------------------------------------------------------ */

/* Decodes arbitrary bytes: an error must come with a message and a NULL
 * payload; a success must be a payload that encodes to the same body.
 * Returns 1 on success, 0 on a (clean) error, -1 on a contract violation. */
static int decode_any(const uint8_t *b, size_t n, const uint8_t *expect_body, size_t expect_len)
{
    strata_payload *p = (strata_payload *)&p;
    strata_diag diag = {{0}};
    int rc = strata_payload_decode(b, n, NULL, &p, &diag);
    if (rc < 0)
        return (p == NULL && diag.msg[0] != '\0' && (rc == STRATA_EPROTO || rc == STRATA_ETOOBIG))
                   ? 0
                   : -1;
    int ok = p != NULL;
    uint8_t *wire = NULL;
    size_t wl = 0;
    if (ok)
        ok = strata_payload_encode(p, 1, &wire, &wl, NULL) == STRATA_OK;
    if (ok && expect_body != NULL) {
        size_t bl;
        uint8_t *body = unzstd(wire, wl, &bl);
        ok = bl == expect_len && memcmp(body, expect_body, bl) == 0;
        free(body);
    }
    free(wire);
    strata_payload_free(p);
    return ok ? 1 : -1;
}

static void test_every_wire_flip_and_truncation(void)
{
    tbody t;
    bbuf o;
    body_default(&t);
    body_build(&t, &o);
    size_t len;
    uint8_t *wire = zstd_wrap(o.b, o.n, &len);
    uint8_t *m = malloc(len);
    CU_ASSERT_PTR_NOT_NULL_FATAL(m);
    int bad = 0, accepted = 0, tried = 0;
    for (size_t i = 0; i < len; i++)
        for (int k = 0; k <= 8; k++) {
            memcpy(m, wire, len);
            m[i] ^= k == 8 ? 0xFF : (uint8_t)(1u << k);
            /* A frame that survives must carry the original body: the CRC
             * lets through only flips that zstd itself ignores (unused
             * header bits, equivalent entropy-table choices). */
            int r = decode_any(m, len, o.b, o.n);
            bad += r < 0;
            accepted += r > 0;
            tried++;
        }
    CU_ASSERT_EQUAL(bad, 0);
    CU_ASSERT(accepted < tried / 20);
    for (size_t n = 0; n < len; n++)
        bad += decode_any(wire, n, NULL, 0) != 0;
    CU_ASSERT_EQUAL(bad, 0);
    printf("\n    wire: %zu bytes, %d flips, %d accepted ", len, tried, accepted);
    free(m);
    free(wire);
}

/* Flips and truncations applied to the body, with the CRC fixed up and the
 * result recompressed: this reaches every check behind the checksum. */
static void test_every_body_flip_and_truncation(void)
{
    tbody t;
    bbuf o;
    body_default(&t);
    body_build(&t, &o);
    uint8_t m[sizeof(o.b)];
    int bad = 0, accepted = 0, tried = 0;
    for (size_t i = 0; i + 4 < o.n; i++)
        for (int k = 0; k <= 8; k++) {
            memcpy(m, o.b, o.n);
            m[i] ^= k == 8 ? 0xFF : (uint8_t)(1u << k);
            fix_crc(m, o.n);
            size_t len;
            uint8_t *wire = zstd_wrap(m, o.n, &len);
            /* A surviving flip must be canonical: it re-encodes to itself. */
            int r = decode_any(wire, len, m, o.n);
            if (r < 0)
                fprintf(stderr, "\n  body flip at byte %zu (k=%d) broke the contract\n", i, k);
            bad += r < 0;
            accepted += r > 0;
            tried++;
            free(wire);
        }
    CU_ASSERT_EQUAL(bad, 0);
    /* Header fields, values, scales, qlevels within range and sign bits
     * can change without breaking validity, but far from everything. */
    CU_ASSERT(accepted > 0 && accepted < tried / 2);
    for (size_t n = 4; n < o.n; n++) {
        memcpy(m, o.b, n);
        fix_crc(m, n);
        size_t len;
        uint8_t *wire = zstd_wrap(m, n, &len);
        int r = decode_any(wire, len, NULL, 0);
        if (r != 0)
            fprintf(stderr, "\n  body truncated to %zu bytes: result %d\n", n, r);
        bad += r != 0;
        free(wire);
    }
    CU_ASSERT_EQUAL(bad, 0);
    printf("\n    body: %zu bytes, %d flips, %d accepted ", o.n, tried, accepted);
}

static void test_random_bytes(void)
{
    strata_rng rng;
    strata_rng_seed(&rng, 2024, 0);
    uint8_t b[600];
    int bad = 0, accepted = 0;
    for (int iter = 0; iter < 3000; iter++) {
        size_t n = (size_t)strata_rng_below(&rng, sizeof(b));
        for (size_t i = 0; i < n; i++)
            b[i] = (uint8_t)strata_rng_u64(&rng);
        int mode = iter % 3;
        if (mode == 1 && n >= 4) {
            /* zstd magic, random rest */
            b[0] = 0x28, b[1] = 0xB5, b[2] = 0x2F, b[3] = 0xFD;
            int r = decode_any(b, n, NULL, 0);
            bad += r < 0;
            accepted += r > 0;
        } else if (mode == 2 && n >= 52) {
            /* valid header start and CRC, random layers: through zstd */
            memcpy(b, "STRP\x01\x00\x00\x00", 8);
            b[40] = (uint8_t)strata_rng_below(&rng, 4);
            b[41] = b[42] = b[43] = 0;
            fix_crc(b, n);
            size_t len;
            uint8_t *wire = zstd_wrap(b, n, &len);
            int r = decode_any(wire, len, NULL, 0);
            bad += r < 0;
            accepted += r > 0;
            free(wire);
        } else {
            int r = decode_any(b, n, NULL, 0);
            bad += r < 0;
            accepted += r > 0;
        }
    }
    CU_ASSERT_EQUAL(bad, 0);
    printf("\n    random inputs accepted: %d ", accepted);
}

/* ------------------------------------------------------------------------ */
/* Encoder rejects (table)                                                  */
/* ------------------------------------------------------------------------ */

typedef struct bad_layer {
    const char *name;
    void (*tweak)(strata_payload *p, strata_clayer *c);
    const char *expect;
} bad_layer;

static void e_unsorted(strata_payload *p, strata_clayer *c)
{
    (void)p;
    c[0].indices[1] = 3;
}
static void e_repeated(strata_payload *p, strata_clayer *c)
{
    (void)p;
    c[0].indices[1] = 5;
}
static void e_range(strata_payload *p, strata_clayer *c)
{
    (void)p;
    c[0].indices[2] = 1000;
}
static void e_count(strata_payload *p, strata_clayer *c)
{
    (void)p;
    c[0].count = 1001;
}
static void e_nan(strata_payload *p, strata_clayer *c)
{
    (void)p;
    c[0].values[2] = NAN;
}
static void e_inf(strata_payload *p, strata_clayer *c)
{
    (void)p;
    c[0].values[0] = INFINITY;
}
static void e_fp16(strata_payload *p, strata_clayer *c)
{
    (void)p;
    c[0].values_format = STRATA_VALUES_FP16;
    c[0].values[0] = 0.1f;
}
static void e_fp16_range(strata_payload *p, strata_clayer *c)
{
    (void)p;
    c[0].comp = STRATA_COMP_RANDK;
    c[0].values_format = STRATA_VALUES_FP16;
    c[0].values[0] = 65536.0f;
    c[0].values[1] = 1.0f;
    c[0].values[2] = 0.5f;
}
static void e_bf16(strata_payload *p, strata_clayer *c)
{
    (void)p;
    c[0].values_format = STRATA_VALUES_BF16;
    c[0].values[1] = 1.1f;
}
static void e_qlevel(strata_payload *p, strata_clayer *c)
{
    (void)p;
    c[1].qlevels[2] = -5;
}
static void e_levels(strata_payload *p, strata_clayer *c)
{
    (void)p;
    c[1].levels = 128;
}
static void e_scale(strata_payload *p, strata_clayer *c)
{
    (void)p;
    c[2].scale = -0.5f;
}
static void e_comp(strata_payload *p, strata_clayer *c)
{
    (void)p;
    c[2].comp = (strata_compressor_id)9;
}
static void e_fmt(strata_payload *p, strata_clayer *c)
{
    (void)p;
    c[2].values_format = (strata_values_format)7;
}
static void e_numel0(strata_payload *p, strata_clayer *c)
{
    (void)p;
    c[2].numel = 0;
}
static void e_numel_big(strata_payload *p, strata_clayer *c)
{
    (void)p;
    c[0].numel = (uint64_t)1 << 32;
}
static void e_pgsd(strata_payload *p, strata_clayer *c)
{
    (void)p;
    static float v[5];
    c[2] = (strata_clayer){.layer_index = 5,
                           .comp = STRATA_COMP_POWERSGD,
                           .numel = 6,
                           .count = 5,
                           .rows = 2,
                           .cols = 3,
                           .rank = 3,
                           .values = v};
}
static void e_no_values(strata_payload *p, strata_clayer *c)
{
    (void)p;
    c[0].values = NULL;
}
static void e_no_indices(strata_payload *p, strata_clayer *c)
{
    (void)p;
    c[0].indices = NULL;
}
static void e_no_qlevels(strata_payload *p, strata_clayer *c)
{
    (void)p;
    c[1].qlevels = NULL;
}
static void e_no_signbits(strata_payload *p, strata_clayer *c)
{
    (void)p;
    c[2].signbits = NULL;
}
static void e_order(strata_payload *p, strata_clayer *c)
{
    (void)p;
    c[2].layer_index = 2;
}
static void e_no_layers(strata_payload *p, strata_clayer *c)
{
    (void)c;
    p->layers = NULL;
}
static void e_meta(strata_payload *p, strata_clayer *c)
{
    (void)c;
    p->metadata_json = "{\"a\":1,\"a\":2}";
}
static void e_meta_array(strata_payload *p, strata_clayer *c)
{
    (void)c;
    p->metadata_json = "[]";
}
static void e_meta_empty(strata_payload *p, strata_clayer *c)
{
    (void)c;
    p->metadata_json = "";
}

static const bad_layer BAD_LAYERS[] = {
    {"unsorted indices", e_unsorted, "layers[0] (layer 0, topk): index 3 at entry 1 not above"},
    {"repeated index", e_repeated, "index 5 at entry 1 not above the previous index 5"},
    {"index out of range", e_range, "index 1000 at entry 2 out of range for 1000 elements"},
    {"count above numel", e_count, "count 1001 exceeds"},
    {"NaN value", e_nan, "value 2 is NaN"},
    {"infinite value", e_inf, "value 0 is infinite"},
    {"fp16 inexact", e_fp16, "value 0 (0.100000001) is not exactly representable in fp16"},
    {"fp16 overflow", e_fp16_range, "value 0 (65536) is not exactly representable in fp16"},
    {"bf16 inexact", e_bf16, "not exactly representable in bf16"},
    {"qlevel beyond levels", e_qlevel, "layers[1] (layer 2, qsgd): qlevel -5 at element 2"},
    {"levels 128", e_levels, "levels 128 outside"},
    {"negative scale", e_scale, "scale -0.5"},
    {"unknown compressor", e_comp, "unknown compressor id 9"},
    {"unknown values format", e_fmt, "unknown values format 7"},
    {"numel 0", e_numel0, "numel 0 outside"},
    {"numel 2^32", e_numel_big, "numel 4294967296 outside"},
    {"powersgd rank", e_pgsd, "rank 3 outside"},
    {"NULL values", e_no_values, "values is NULL"},
    {"NULL indices", e_no_indices, "indices is NULL"},
    {"NULL qlevels", e_no_qlevels, "qlevels is NULL"},
    {"NULL signbits", e_no_signbits, "signbits is NULL"},
    {"layers out of order", e_order, "layers[2]: layer index 2 not above"},
    {"NULL layer array", e_no_layers, "layers is NULL"},
    {"duplicate metadata key", e_meta, "metadata: invalid JSON"},
    {"metadata array", e_meta_array, "not an object"},
    {"metadata empty string", e_meta_empty, "metadata: invalid JSON"},
};

static void test_encode_rejects(void)
{
    for (size_t i = 0; i < sizeof(BAD_LAYERS) / sizeof(BAD_LAYERS[0]); i++) {
        strata_payload p;
        strata_clayer c[3];
        payload_default(&p, c);
        /* Private copies of the static arrays, so tweaks stay local. */
        uint32_t idx[3];
        float vals[3];
        int8_t q[5];
        memcpy(idx, c[0].indices, sizeof(idx));
        memcpy(vals, c[0].values, sizeof(vals));
        memcpy(q, c[1].qlevels, sizeof(q));
        c[0].indices = idx;
        c[0].values = vals;
        c[1].qlevels = q;
        BAD_LAYERS[i].tweak(&p, c);
        uint8_t *wire = (uint8_t *)&wire;
        size_t len = 99;
        strata_diag diag = {{0}};
        int rc = strata_payload_encode(&p, 0, &wire, &len, &diag);
        CASE_ASSERT(rc == STRATA_EINVAL, BAD_LAYERS[i].name);
        CASE_ASSERT(wire == NULL && len == 0, BAD_LAYERS[i].name);
        CASE_ASSERT(strstr(diag.msg, BAD_LAYERS[i].expect) != NULL, BAD_LAYERS[i].name);
        if (strstr(diag.msg, BAD_LAYERS[i].expect) == NULL)
            fprintf(stderr, "  diag was: %s\n", diag.msg);
        if (rc == STRATA_OK)
            free(wire);
    }
}

static void test_null_arguments(void)
{
    strata_payload p;
    strata_clayer c[3];
    payload_default(&p, c);
    uint8_t *wire = NULL;
    size_t len = 0;
    strata_diag diag = {{0}};
    CU_ASSERT_EQUAL(strata_payload_encode(NULL, 0, &wire, &len, &diag), STRATA_EINVAL);
    CU_ASSERT_PTR_NOT_NULL(strstr(diag.msg, "NULL"));
    CU_ASSERT_EQUAL(strata_payload_encode(&p, 0, NULL, &len, NULL), STRATA_EINVAL);
    CU_ASSERT_EQUAL(strata_payload_encode(&p, 0, &wire, NULL, NULL), STRATA_EINVAL);
    CU_ASSERT_EQUAL(strata_payload_encode(&p, 20, &wire, &len, &diag), STRATA_EINVAL);
    CU_ASSERT_PTR_NOT_NULL(strstr(diag.msg, "zstd level 20"));
    CU_ASSERT_EQUAL(strata_payload_encode(&p, -1, &wire, &len, NULL), STRATA_EINVAL);
    CU_ASSERT_PTR_NULL(wire);
    CU_ASSERT_EQUAL_FATAL(strata_payload_encode(&p, 0, &wire, &len, NULL), STRATA_OK);
    CU_ASSERT_EQUAL(strata_payload_decode(wire, len, NULL, NULL, &diag), STRATA_EINVAL);
    strata_payload *q = NULL;
    CU_ASSERT_EQUAL(strata_payload_decode(NULL, len, NULL, &q, &diag), STRATA_EINVAL);
    CU_ASSERT_EQUAL(strata_payload_decode(wire, len, NULL, &q, NULL), STRATA_OK);
    strata_payload_free(q);
    strata_payload_free(NULL);
    free(wire);
}

/* Metadata nested 100,000 deep is refused by both sides without
 * exhausting the stack; a large body of many layers is fine. */
static void test_deep_metadata_and_many_layers(void)
{
    const size_t depth = 100000;
    char *meta = malloc(depth + 8);
    CU_ASSERT_PTR_NOT_NULL_FATAL(meta);
    memcpy(meta, "{\"a\":", 5);
    memset(meta + 5, '[', depth);
    meta[5 + depth] = '\0';
    strata_payload p = {.metadata_json = meta};
    uint8_t *wire = NULL;
    size_t len = 0;
    strata_diag diag = {{0}};
    CU_ASSERT_EQUAL(strata_payload_encode(&p, 0, &wire, &len, &diag), STRATA_EINVAL);
    CU_ASSERT_PTR_NOT_NULL(strstr(diag.msg, "metadata: invalid JSON"));

    /* The same text in a hand-made body: header, metadata, CRC. */
    size_t mlen = strlen(meta), n = 44 + 4 + mlen + 4;
    uint8_t *body = calloc(1, n);
    CU_ASSERT_PTR_NOT_NULL_FATAL(body);
    memcpy(body, "STRP\x02\x00\x00\x00", 8);
    for (int i = 0; i < 4; i++)
        body[44 + i] = (uint8_t)(mlen >> (8 * i));
    memcpy(body + 48, meta, mlen);
    fix_crc(body, n);
    uint8_t *z = zstd_wrap(body, n, &len);
    expect_reject("deep metadata", z, len, NULL, STRATA_EPROTO, "metadata: invalid JSON");
    free(z);
    free(body);
    free(meta);

    /* 5000 layers, alternating empty top-k and one-element dense. */
    const size_t nl = 5000;
    strata_clayer *c = calloc(nl, sizeof(*c));
    float one = 1.0f;
    CU_ASSERT_PTR_NOT_NULL_FATAL(c);
    for (size_t i = 0; i < nl; i++) {
        c[i].layer_index = (uint32_t)(2 * i);
        c[i].comp = i % 2 ? STRATA_COMP_NONE : STRATA_COMP_TOPK;
        c[i].numel = i % 2 ? 1 : 1000 + i;
        c[i].count = i % 2;
        c[i].values = &one;
    }
    strata_payload many = {.num_layers = nl, .layers = c};
    check_round_trip(&many, 0, "5000 layers");
    CU_ASSERT_EQUAL_FATAL(strata_payload_encode(&many, 0, &wire, &len, NULL), STRATA_OK);
    strata_payload_limits lim = {.max_layers = 4999};
    expect_reject("5000 layers, limit 4999", wire, len, &lim, STRATA_ETOOBIG,
                  "layer count 5000 above the limit of 4999");
    free(wire);
    free(c);
}

/* Limits at, and one below, the payload's actual sizes. */
static void test_limits(void)
{
    strata_payload p;
    strata_clayer c[3];
    payload_default(&p, c);
    uint8_t *wire = NULL;
    size_t len = 0, blen = 0;
    CU_ASSERT_EQUAL_FATAL(strata_payload_encode(&p, 0, &wire, &len, NULL), STRATA_OK);
    free(unzstd(wire, len, &blen));
    struct {
        const char *name;
        strata_payload_limits at, below;
        const char *expect;
    } cases[] = {
        {"decoded bytes",
         {.max_decoded_bytes = blen},
         {.max_decoded_bytes = blen - 1},
         "decoded bytes, above the limit"},
        {"layers", {.max_layers = 3}, {.max_layers = 2}, "layer count 3 above the limit of 2"},
        {"numel", {.max_layer_numel = 1000}, {.max_layer_numel = 999}, "numel 1000 above"},
        {"metadata",
         {.max_metadata_bytes = 18},
         {.max_metadata_bytes = 17},
         "metadata length 18 above the limit of 17"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        strata_payload *q = NULL;
        CASE_ASSERT(strata_payload_decode(wire, len, &cases[i].at, &q, NULL) == STRATA_OK,
                    cases[i].name);
        CASE_ASSERT(q != NULL && payloads_equal(&p, q), cases[i].name);
        strata_payload_free(q);
        expect_reject(cases[i].name, wire, len, &cases[i].below, STRATA_ETOOBIG, cases[i].expect);
    }
    free(wire);
}

/* ------------------------------------------------------------------------ */
/* Size                                                                     */
/* ------------------------------------------------------------------------ */

/* 1% of a 1,000,000-element Gaussian tensor (seed 1234), top-k by
 * magnitude through strata_compress, encoded at zstd level 1: bytes per
 * kept element (the whole frame over the 10,000 kept) at most 4.3 with fp32
 * values, 2.6 with fp16, 2.3 with bf16, 1.9 with int8 and 1.3 with ternary,
 * at scales 1, 0.01 and 300. The data are deterministic, so this is a size
 * check. */
static void test_size_topk_1m(void)
{
    const size_t n = 1000000, k = 10000;
    float *x = strata_alloc_floats(n);
    CU_ASSERT_FATAL(x != NULL);
    strata_rng rng;
    strata_rng_seed(&rng, 1234, 0);
    for (size_t i = 0; i < n; i++)
        x[i] = (float)strata_rng_normal(&rng);
    static const struct {
        strata_values_format vf;
        double max;
    } cases[] = {{STRATA_VALUES_FP32, 4.3},
                 {STRATA_VALUES_FP16, 2.6},
                 {STRATA_VALUES_BF16, 2.3},
                 {STRATA_VALUES_INT8, 1.9},
                 {STRATA_VALUES_TERNARY, 1.3}};
    for (int sc = 0; sc < 3; sc++) {
        /* The scale moves the threshold within a binade, which changes what the
         * exponents cost: 1, then 0.01 and 300 (same data, rescaled). */
        if (sc > 0)
            for (size_t i = 0; i < n; i++)
                x[i] *= sc == 1 ? 0.01f : 30000.0f;
        printf("\n    bytes per kept element (scale %g):", sc == 0 ? 1.0 : sc == 1 ? 0.01 : 300.0);
        for (size_t f = 0; f < sizeof(cases) / sizeof(cases[0]); f++) {
            strata_budget b = {STRATA_COMP_TOPK, 0.01, 0, 0, cases[f].vf};
            strata_clayer c;
            int64_t shape[1] = {(int64_t)n};
            CU_ASSERT_EQUAL_FATAL(
                strata_compress(x, n, 1, shape, &b, cases[f].vf, 7, NULL, &c, NULL), STRATA_OK);
            CU_ASSERT_EQUAL(c.count, k);
            strata_payload p = {.num_layers = 1, .layers = &c};
            uint8_t *wire = NULL;
            size_t len = 0;
            CU_ASSERT_EQUAL_FATAL(strata_payload_encode(&p, 1, &wire, &len, NULL), STRATA_OK);
            double per = (double)len / (double)k;
            strata_payload *q = decode_ok(wire, len, "1M top-k");
            CU_ASSERT(q != NULL && payloads_equal(&p, q));
            printf(" %s %.3f", strata_values_format_name(cases[f].vf), per);
            CASE_ASSERT(per <= cases[f].max, strata_values_format_name(cases[f].vf));
            strata_payload_free(q);
            free(wire);
            strata_clayer_cleanup(&c);
        }
    }
    printf(" ");
    strata_free_floats(x);
}

/* The reference helpers agree with the definition of binary16. */
static void test_reference_rounding(void)
{
    CU_ASSERT_EQUAL(round_f16(1.0f + 0x1p-11f), 1.0f); /* tie to even */
    CU_ASSERT_EQUAL(round_f16(1.0f + 0x3p-11f), 1.0f + 0x1p-9f);
    CU_ASSERT_EQUAL(round_bf16(1.0f + 0x1p-8f), 1.0f);
    CU_ASSERT_EQUAL(half_value(0x3C00), 1.0f);
    CU_ASSERT_EQUAL(half_value(0x7BFF), 65504.0f);
    CU_ASSERT_EQUAL(half_value(0x0001), 0x1p-24f);
    CU_ASSERT_EQUAL(bitsf(0x3F800000u), 1.0f);
    /* Every finite binary16 value travels exactly through an fp16 layer. */
    static const layer_spec s = {"all", STRATA_COMP_NONE, STRATA_VALUES_FP16, 63488, 63488, 0, 0, 0,
                                 0};
    strata_clayer c;
    memset(&c, 0, sizeof(c));
    c.comp = s.comp;
    c.values_format = s.fmt;
    c.numel = c.count = s.numel;
    c.values = strata_alloc_floats(s.numel);
    CU_ASSERT_PTR_NOT_NULL_FATAL(c.values);
    size_t k = 0;
    for (uint32_t h = 0; h < 65536; h++)
        if (((h >> 10) & 31) != 31)
            c.values[k++] = half_value((uint16_t)h);
    CU_ASSERT_EQUAL_FATAL(k, s.numel);
    /* 0x8000 (negative zero) sits after the 31744 patterns below 0x7C00. */
    CU_ASSERT(signbit(c.values[31744]) && c.values[31744] == 0.0f);
    strata_payload p = {.num_layers = 1, .layers = &c};
    check_round_trip(&p, 1, "every finite fp16");
    strata_free_floats(c.values);
}

/* A few bytes may describe a huge sparse tensor: the default limit on the
 * total dense size refuses what would cost gigabytes to decode densely. */
static void test_total_numel_limit(void)
{
    uint32_t idx[1] = {7};
    float val[1] = {1.5f};
    strata_clayer l = {.comp = STRATA_COMP_TOPK,
                       .numel = ((uint64_t)1 << 28) + 1,
                       .count = 1,
                       .indices = idx,
                       .values = val};
    strata_payload p = {.num_layers = 1, .layers = &l};
    uint8_t *wire = NULL;
    size_t len = 0;
    CU_ASSERT_EQUAL_FATAL(strata_payload_encode(&p, 1, &wire, &len, NULL), STRATA_OK);
    CU_ASSERT(len < 200);
    expect_reject("2^28 + 1 dense elements", wire, len, NULL, STRATA_ETOOBIG, "dense elements");
    strata_payload_limits lim = {.max_total_numel = ((uint64_t)1 << 28) + 1};
    strata_payload *q = NULL;
    CU_ASSERT_EQUAL(strata_payload_decode(wire, len, &lim, &q, NULL), STRATA_OK);
    strata_payload_free(q);
    free(wire);
}

int main(void)
{
    CU_TestInfo crc_tests[] = {
        {"CRC32C vectors, both paths, chaining", test_crc32c},
        CU_TEST_INFO_NULL,
    };
    CU_TestInfo roundtrip_tests[] = {
        {"each compressor and values format", test_roundtrip_each},
        {"all layers in one payload, levels 0/1/3/19", test_roundtrip_all_layers},
        {"no layers, metadata verbatim", test_roundtrip_empty},
        {"unused fields and padding zeroed", test_encode_normalises},
        {"every finite fp16 value", test_reference_rounding},
        {"independent writer, worked example", test_independent_writer},
        CU_TEST_INFO_NULL,
    };
    CU_TestInfo encode_tests[] = {
        {"invalid payloads (table)", test_encode_rejects},
        {"NULL arguments and levels", test_null_arguments},
        CU_TEST_INFO_NULL,
    };
    CU_TestInfo malformed_tests[] = {
        {"hand-built bodies (table)", test_malformed_bodies},
        {"zstd frames", test_malformed_frames},
        {"limits", test_limits},
        {"total dense size limit", test_total_numel_limit},
        {"deep metadata, many layers", test_deep_metadata_and_many_layers},
        {"every wire flip and truncation", test_every_wire_flip_and_truncation},
        {"every body flip and truncation", test_every_body_flip_and_truncation},
        {"random bytes", test_random_bytes},
        CU_TEST_INFO_NULL,
    };
    CU_TestInfo size_tests[] = {
        {"1M Gaussian, 1% top-k: fp32 <= 4.3, fp16 <= 2.6, int8 <= 1.9, ternary <= 1.3 B",
         test_size_topk_1m},
        CU_TEST_INFO_NULL,
    };
    CU_SuiteInfo suites[] = {
        {"payload.crc32c", NULL, NULL, NULL, NULL, crc_tests},
        {"payload.roundtrip", NULL, NULL, NULL, NULL, roundtrip_tests},
        {"payload.encode", NULL, NULL, NULL, NULL, encode_tests},
        {"payload.malformed", NULL, NULL, NULL, NULL, malformed_tests},
        {"payload.size", NULL, NULL, NULL, NULL, size_tests},
        CU_SUITE_INFO_NULL,
    };
    return strata_test_run(suites);
}
