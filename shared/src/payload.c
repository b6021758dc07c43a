/* The payload codec (strata/payload.h); the format is schemas/payload.md.
 *
 * Encoding validates the payload with the same rules the decoder applies,
 * computes the exact body size, writes the body in one pass and compresses
 * it into one zstd frame (strata/zframe.h). Decoding checks the frame (one frame, content
 * size declared and within the limit) before allocating the body, verifies
 * the CRC32C, then parses the body with explicit bounds checks; every array
 * is allocated only after the bytes that fill it are known to be present. */
#include "strata/payload.h"
#include "strata/zframe.h"

#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define HEADER_BYTES 44u                  /* magic .. layer count */
#define BLOCK_BYTES 60u                   /* fixed part of a layer block */
#define MIN_BODY (HEADER_BYTES + 4u + 4u) /* header, metadata length, CRC */
#define MAX_RICE_POS 31u                  /* Rice parameter of positions */
#define MAX_RICE_INT8 7u                  /* Rice parameter of int8 magnitudes */
#define DEFAULT_LEVEL 1
#define MAX_LEVEL STRATA_ZFRAME_MAX_LEVEL
#define QSGD_MAX_LEVELS 127u

static const uint8_t MAGIC[4] = {'S', 'T', 'R', 'P'};

static const char *comp_name(unsigned id)
{
    return strata_comp_name((strata_compressor_id)id);
}

static const char *format_name(unsigned f)
{
    return strata_values_format_name((strata_values_format)f);
}

/* Float values travel as an exponent and a sign-and-mantissa field of this
 * many bits (mantissa, then the sign above it). */
static unsigned field_bits(strata_values_format f)
{
    return f == STRATA_VALUES_FP32 ? 24u : f == STRATA_VALUES_FP16 ? 11u : 8u;
}

static uint64_t bits_to_bytes(uint64_t bits)
{
    return bits / 8 + (bits % 8 != 0);
}

/* Bytes of n float values in format f (FP32, FP16, BF16) whose exponent
 * offsets take `planes` bit planes. */
static uint64_t float_bytes(uint64_t n, unsigned planes, strata_values_format f)
{
    if (n == 0)
        return 0;
    return 2 + planes * bits_to_bytes(n) + bits_to_bytes(n * field_bits(f));
}

/* Number of bits of v (0 for 0). */
static unsigned bit_length(unsigned v)
{
    unsigned n = 0;
    for (; v != 0; v >>= 1)
        n++;
    return n;
}

/* ------------------------------------------------------------------------ */
/* Little-endian integers                                                   */
/* ------------------------------------------------------------------------ */

static uint16_t get_u16(const uint8_t *p)
{
    return (uint16_t)(p[0] | (p[1] << 8));
}

static uint32_t get_u32(const uint8_t *p)
{
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

static uint64_t get_u64(const uint8_t *p)
{
    return (uint64_t)get_u32(p) | ((uint64_t)get_u32(p + 4) << 32);
}

static uint8_t *put_u16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
    return p + 2;
}

static uint8_t *put_u32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
    return p + 4;
}

static uint8_t *put_u64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
    return p + 8;
}

/* Bit streams: bits are taken least significant first from each byte, bytes
 * in order; a stream ends at a byte boundary and its padding bits are 0. */
typedef struct bitwr {
    uint8_t *p;
    uint64_t acc;
    unsigned n;
} bitwr;

static void bw_put(bitwr *w, uint32_t v, unsigned nbits)
{
    w->acc |= (uint64_t)v << w->n;
    w->n += nbits;
    while (w->n >= 8) {
        *w->p++ = (uint8_t)w->acc;
        w->acc >>= 8;
        w->n -= 8;
    }
}

/* q one bits, then a zero bit. */
static void bw_unary(bitwr *w, uint64_t q)
{
    for (; q >= 32; q -= 32)
        bw_put(w, 0xFFFFFFFFu, 32);
    bw_put(w, (uint32_t)((1ull << q) - 1), (unsigned)q + 1);
}

static void bw_rice(bitwr *w, uint32_t g, unsigned r)
{
    bw_unary(w, g >> r);
    if (r > 0)
        bw_put(w, g & (uint32_t)((1ull << r) - 1), r);
}

static uint8_t *bw_end(bitwr *w)
{
    if (w->n > 0)
        *w->p++ = (uint8_t)w->acc;
    w->acc = 0;
    w->n = 0;
    return w->p;
}

typedef struct bitrd {
    const uint8_t *p;
    uint64_t nbits, pos;
} bitrd;

/* The stream's bits from r->pos on, least significant first: at least 57
 * of them when the stream has that many (bits past its end read as 0). One
 * unaligned 8-byte load away from the end. */
static uint64_t br_peek(const bitrd *r)
{
    uint64_t byte = r->pos >> 3, nbytes = (r->nbits + 7) >> 3, w = 0;
    if (byte + 8 <= nbytes) {
        memcpy(&w, r->p + byte, 8);
#if __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
        w = __builtin_bswap64(w);
#endif
    } else {
        for (uint64_t i = 0; byte + i < nbytes; i++)
            w |= (uint64_t)r->p[byte + i] << (8 * i);
    }
    return w >> (r->pos & 7);
}

static int br_bits(bitrd *r, unsigned k, uint32_t *out)
{
    if (k > r->nbits - r->pos)
        return -1;
    *out = k == 0 ? 0u : (uint32_t)(br_peek(r) & ((UINT64_C(1) << k) - 1));
    r->pos += k;
    return 0;
}

/* Reads a unary count (ones up to a zero). Returns -1 past the stream's
 * end, -2 when the count exceeds limit. */
static int br_unary(bitrd *r, uint64_t limit, uint64_t *out)
{
    uint64_t q = 0;
    while (r->pos < r->nbits) {
        uint64_t avail = r->nbits - r->pos;
        if (avail > 56)
            avail = 56;
        uint64_t zeros = ~br_peek(r) & ((UINT64_C(1) << avail) - 1);
        if (zeros == 0) {
            q += avail;
            r->pos += avail;
        } else {
            unsigned t = (unsigned)__builtin_ctzll(zeros);
            q += t;
            r->pos += t + 1;
            if (q > limit)
                return -2;
            *out = q;
            return 0;
        }
        if (q > limit)
            return -2;
    }
    return -1;
}

/* 1 when the padding bits after r->pos up to the byte boundary are 0. */
static int br_padding_zero(const bitrd *r)
{
    unsigned off = (unsigned)(r->pos & 7);
    return off == 0 || (r->p[r->pos >> 3] >> off) == 0;
}

/* Bits of the n values g[] Rice-coded with parameter r. */
static uint64_t rice_bits(const uint32_t *g, uint64_t n, unsigned r)
{
    uint64_t sum = n * (r + 1);
    for (uint64_t i = 0; i < n; i++)
        sum += g[i] >> r;
    return sum;
}

/* The Rice parameter in [0, rmax] that codes the n values g[] in the
 * fewest bits (the smallest on ties), and that bit count. The length is a
 * convex function of r (each step up saves sum(ceil((g >> r) / 2)) bits,
 * which shrinks with r, and costs n), so a walk from the parameter that
 * suits the mean gap finds the minimum in a few passes. */
static unsigned rice_best(const uint32_t *g, uint64_t n, unsigned rmax, uint64_t *bits)
{
    uint64_t total = 0;
    for (uint64_t i = 0; i < n; i++)
        total += g[i];
    unsigned r = 0;
    while (r < rmax && (total >> (r + 1)) >= (n > 0 ? n : 1))
        r++;
    uint64_t cur = rice_bits(g, n, r);
    while (r > 0) {
        uint64_t down = rice_bits(g, n, r - 1);
        if (down > cur)
            break;
        r--;
        cur = down;
    }
    while (r < rmax) {
        uint64_t up = rice_bits(g, n, r + 1);
        if (up >= cur)
            break;
        r++;
        cur = up;
    }
    *bits = cur;
    return r;
}

/* Gaps between ascending positions: g[0] = idx[0], g[i] = idx[i] -
 * idx[i-1] - 1. */
static void position_gaps(const uint32_t *idx, uint64_t n, uint32_t *g)
{
    for (uint64_t i = 0; i < n; i++)
        g[i] = i == 0 ? idx[0] : idx[i] - idx[i - 1] - 1;
}

/* ------------------------------------------------------------------------ */
/* Float formats                                                            */
/* ------------------------------------------------------------------------ */

static uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof(u));
    return u;
}

static float bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
}

/* Encodes one value as the values format's 16-bit pattern; the value must
 * have passed check_values for that format, so the conversion is exact. */
static uint16_t to_half(float v, strata_values_format f)
{
    return f == STRATA_VALUES_BF16 ? strata_f32_to_bf16(v) : strata_f32_to_f16(v);
}

static float from_half(uint16_t h, strata_values_format f)
{
    return f == STRATA_VALUES_BF16 ? strata_bf16_to_f32(h) : strata_f16_to_f32(h);
}

/* The exponent field and the sign-and-mantissa field of v in format f (v
 * exactly representable in f). */
static unsigned float_exponent(float v, strata_values_format f)
{
    if (f == STRATA_VALUES_FP16)
        return (to_half(v, f) >> 10) & 0x1Fu;
    return (f32_bits(v) >> 23) & 0xFFu;
}

static uint32_t float_field(float v, strata_values_format f)
{
    uint32_t x = f32_bits(v);
    if (f == STRATA_VALUES_FP32)
        return (x & 0x7FFFFFu) | ((x >> 31) << 23);
    if (f == STRATA_VALUES_FP16) {
        uint16_t h = to_half(v, f);
        return (h & 0x3FFu) | ((uint32_t)(h >> 15) << 10);
    }
    return ((x >> 16) & 0x7Fu) | ((x >> 31) << 7);
}

/* 1 when finite float32 bits x are exactly representable in binary16. */
static int fp16_exact(uint32_t x)
{
    return f32_bits(strata_f16_to_f32(strata_f32_to_f16(bits_f32(x)))) == x;
}

/* ------------------------------------------------------------------------ */
/* Validation shared by the encoder and the decoder                         */
/* ------------------------------------------------------------------------ */

enum { USES_SCALE = 1, USES_LEVELS = 2, USES_DIMS = 4, USES_SEED = 8 };

static unsigned used_fields(const strata_clayer *c)
{
    if (STRATA_VALUES_QUANTISED(c->values_format))
        return USES_SCALE | (c->comp == STRATA_COMP_RANDK ? USES_SEED : 0);
    switch (c->comp) {
    case STRATA_COMP_QSGD:
        return USES_SCALE | USES_LEVELS;
    case STRATA_COMP_SIGN:
        return USES_SCALE;
    case STRATA_COMP_POWERSGD:
        return USES_DIMS;
    case STRATA_COMP_RANDK:
        return USES_SEED;
    default:
        return 0;
    }
}

/* Number of float values a layer carries. */
static uint64_t value_count(const strata_clayer *c)
{
    return (c->comp == STRATA_COMP_QSGD || c->comp == STRATA_COMP_SIGN) ? 0 : c->count;
}

static uint64_t sign_bytes(uint64_t numel)
{
    return numel / 8 + (numel % 8 != 0);
}

/* Checks every field of c that does not depend on its arrays. err is the
 * code to return (EINVAL when encoding, EPROTO when decoding); where names
 * the layer in messages. */
static int check_params(const strata_clayer *c, int err, strata_diag *diag, const char *where)
{
    if ((unsigned)c->comp >= STRATA_COMP_COUNT)
        return strata_diag_set(diag, err, "%s: unknown compressor id %u", where, (unsigned)c->comp);
    if ((unsigned)c->values_format >= STRATA_VALUES_COUNT)
        return strata_diag_set(diag, err, "%s: unknown values format %u", where,
                               (unsigned)c->values_format);
    const int quant = STRATA_VALUES_QUANTISED(c->values_format);
    if (quant && c->comp != STRATA_COMP_TOPK && c->comp != STRATA_COMP_RANDK)
        return strata_diag_set(diag, err, "%s: values format %s applies only to topk and randk",
                               where, format_name(c->values_format));
    if (c->numel == 0 || c->numel > STRATA_CLAYER_MAX_NUMEL)
        return strata_diag_set(diag, err, "%s: numel %" PRIu64 " outside [1, %" PRIu64 "]", where,
                               c->numel, STRATA_CLAYER_MAX_NUMEL);
    switch (c->comp) {
    case STRATA_COMP_NONE:
    case STRATA_COMP_FP16:
    case STRATA_COMP_BF16:
        if (c->count != c->numel)
            return strata_diag_set(diag, err,
                                   "%s: count %" PRIu64 " differs from numel %" PRIu64
                                   " (a dense layer carries every element)",
                                   where, c->count, c->numel);
        break;
    case STRATA_COMP_TOPK:
    case STRATA_COMP_RANDK:
        if (c->count > c->numel)
            return strata_diag_set(
                diag, err, "%s: count %" PRIu64 " exceeds the tensor's %" PRIu64 " elements", where,
                c->count, c->numel);
        if (quant && (!isfinite(c->scale) || c->scale < 0.0f || (f32_bits(c->scale) & 0xFFFFu)))
            return strata_diag_set(diag, err,
                                   "%s: %s scale %.9g is not a finite bfloat16 value >= 0", where,
                                   format_name(c->values_format), (double)c->scale);
        if (c->values_format == STRATA_VALUES_INT8 && !isfinite(c->scale * 127.0f))
            return strata_diag_set(diag, err, "%s: int8 scale %.9g times 127 overflows float32",
                                   where, (double)c->scale);
        break;
    case STRATA_COMP_QSGD:
    case STRATA_COMP_SIGN:
        if (c->count != 0)
            return strata_diag_set(diag, err,
                                   "%s: count %" PRIu64 " must be 0 (the layer carries no values)",
                                   where, c->count);
        if (!isfinite(c->scale) || c->scale < 0.0f)
            return strata_diag_set(diag, err, "%s: scale %g is not a finite value >= 0", where,
                                   (double)c->scale);
        if (c->comp == STRATA_COMP_QSGD && (c->levels < 1 || c->levels > QSGD_MAX_LEVELS))
            return strata_diag_set(diag, err, "%s: levels %" PRIu32 " outside [1, 127]", where,
                                   c->levels);
        break;
    case STRATA_COMP_POWERSGD: {
        if (c->rows == 0 || c->cols == 0 || (uint64_t)c->rows * c->cols != c->numel)
            return strata_diag_set(
                diag, err, "%s: rows %" PRIu32 " x cols %" PRIu32 " does not match numel %" PRIu64,
                where, c->rows, c->cols, c->numel);
        uint32_t lim = c->rows < c->cols ? c->rows : c->cols;
        if (c->rank < 1 || c->rank > lim)
            return strata_diag_set(
                diag, err, "%s: rank %" PRIu32 " outside [1, min(rows, cols) = %" PRIu32 "]", where,
                c->rank, lim);
        /* rows * cols < 2^32 keeps min(rows, cols) < 2^16: no overflow. */
        uint64_t want = ((uint64_t)c->rows + c->cols) * c->rank;
        if (c->count != want)
            return strata_diag_set(
                diag, err, "%s: count %" PRIu64 " differs from (rows + cols) * rank = %" PRIu64,
                where, c->count, want);
        break;
    }
    }
    return STRATA_OK;
}

/* Checks n float values: finite, and exactly representable in fp16/bf16
 * where the values format or the compressor requires it. */
static int check_values(const float *v, uint64_t n, const strata_clayer *c, int err,
                        strata_diag *diag, const char *where)
{
    int need16 = c->values_format == STRATA_VALUES_FP16 || c->comp == STRATA_COMP_FP16;
    int needb16 = c->values_format == STRATA_VALUES_BF16 || c->comp == STRATA_COMP_BF16;
    for (uint64_t i = 0; i < n; i++) {
        uint32_t x = f32_bits(v[i]);
        if ((x & 0x7F800000u) == 0x7F800000u)
            return strata_diag_set(diag, err, "%s: value %" PRIu64 " is %s", where, i,
                                   (x & 0x7FFFFFu) ? "NaN" : "infinite");
        if (need16 && !fp16_exact(x))
            return strata_diag_set(
                diag, err, "%s: value %" PRIu64 " (%.9g) is not exactly representable in fp16",
                where, i, (double)v[i]);
        if (needb16 && (x & 0xFFFFu) != 0)
            return strata_diag_set(
                diag, err, "%s: value %" PRIu64 " (%.9g) is not exactly representable in bf16",
                where, i, (double)v[i]);
    }
    return STRATA_OK;
}

/* INT8 and TERNARY kept values: qlevels within +-127 (0 under a zero
 * scale) and every value exactly scale * q (INT8) or +-scale (TERNARY, +0
 * when the scale is 0). The scale was checked by check_params. */
static int check_quantised(const strata_clayer *c, int err, strata_diag *diag, const char *where)
{
    const int int8 = c->values_format == STRATA_VALUES_INT8;
    if (c->count > 0 && (c->values == NULL || (int8 && c->qlevels == NULL)))
        return strata_diag_set(diag, err, "%s: %s is NULL", where,
                               c->values == NULL ? "values" : "qlevels");
    for (uint64_t j = 0; j < c->count; j++) {
        float want;
        if (int8) {
            int q = c->qlevels[j];
            if (q < -127 || q > 127)
                return strata_diag_set(
                    diag, err, "%s: int8 level %d at entry %" PRIu64 " beyond +-127", where, q, j);
            if (q != 0 && c->scale == 0.0f)
                return strata_diag_set(diag, err,
                                       "%s: int8 level %d at entry %" PRIu64
                                       " under a zero scale (must be 0)",
                                       where, q, j);
            want = c->scale * (float)q;
        } else {
            want = c->values[j] < 0.0f && c->scale > 0.0f ? -c->scale : c->scale;
        }
        if (f32_bits(c->values[j]) != f32_bits(want))
            return strata_diag_set(
                diag, err, "%s: value %" PRIu64 " (%.9g) is not the %s value %.9g", where, j,
                (double)c->values[j], format_name(c->values_format), (double)want);
    }
    return STRATA_OK;
}

static int check_qlevels(const int8_t *q, uint64_t n, uint32_t levels, int err, strata_diag *diag,
                         const char *where)
{
    for (uint64_t i = 0; i < n; i++) {
        int v = q[i];
        if (v > (int)levels || v < -(int)levels)
            return strata_diag_set(diag, err,
                                   "%s: qlevel %d at element %" PRIu64 " beyond +-%" PRIu32, where,
                                   v, i, levels);
    }
    return STRATA_OK;
}

/* Checks a metadata JSON text of n bytes: no NUL, a JSON object, no
 * duplicate keys. */
static int check_metadata(const char *s, size_t n, int err, strata_diag *diag)
{
    const char *nul = memchr(s, '\0', n);
    if (nul != NULL)
        return strata_diag_set(diag, err, "metadata: NUL byte at offset %zu", (size_t)(nul - s));
    json_error_t je;
    json_t *j = json_loadb(s, n, JSON_REJECT_DUPLICATES, &je);
    if (j == NULL)
        return strata_diag_set(diag, err, "metadata: invalid JSON at byte %d: %s", je.position,
                               je.text);
    int is_obj = json_is_object(j);
    json_decref(j);
    if (!is_obj)
        return strata_diag_set(diag, err, "metadata: JSON value is not an object");
    return STRATA_OK;
}

/* ------------------------------------------------------------------------ */
/* Encoding                                                                 */
/* ------------------------------------------------------------------------ */

/* How one layer's data is laid out: computed once by encode_check_layer,
 * used by put_layer. */
typedef struct layer_plan {
    uint64_t data_len;
    unsigned r_pos;  /* Rice parameter of the TOPK positions */
    unsigned r_val;  /* INT8: Rice parameter of the magnitudes */
    unsigned base;   /* INT8: smallest magnitude; floats: smallest exponent */
    unsigned planes; /* floats: bit planes of the exponent offsets */
    uint32_t *gaps;  /* scratch: count entries (positions, then magnitudes) */
} layer_plan;

/* Bytes of the kept values of a TOPK/RANDK layer (any format), or of the
 * float values of the other compressors; fills the INT8 fields of pl. */
static uint64_t plan_values(const strata_clayer *c, uint64_t nv, layer_plan *pl)
{
    if (c->values_format == STRATA_VALUES_TERNARY)
        return bits_to_bytes(nv);
    if (c->values_format != STRATA_VALUES_INT8) {
        unsigned lo = 255, hi = 0;
        for (uint64_t j = 0; j < nv; j++) {
            unsigned e = float_exponent(c->values[j], c->values_format);
            lo = e < lo ? e : lo;
            hi = e > hi ? e : hi;
        }
        pl->base = lo;
        pl->planes = nv > 0 ? bit_length(hi - lo) : 0;
        return float_bytes(nv, pl->planes, c->values_format);
    }
    if (nv == 0)
        return 0;
    unsigned base = 127;
    for (uint64_t j = 0; j < nv; j++) {
        unsigned m = (unsigned)abs(c->qlevels[j]);
        base = m < base ? m : base;
    }
    for (uint64_t j = 0; j < nv; j++)
        pl->gaps[j] = (uint32_t)abs(c->qlevels[j]) - base;
    uint64_t bits;
    pl->r_val = rice_best(pl->gaps, nv, MAX_RICE_INT8, &bits);
    pl->base = base;
    return 2 + bits_to_bytes(bits + nv);
}

/* Validates layer c (the i-th of the payload) for encoding and computes the
 * byte length of its encoded data. */
static int encode_check_layer(const strata_clayer *c, size_t i, layer_plan *pl, strata_diag *diag)
{
    char where[96];
    snprintf(where, sizeof(where), "layers[%zu] (layer %" PRIu32 ", %s)", i, c->layer_index,
             comp_name((unsigned)c->comp));
    int rc = check_params(c, STRATA_EINVAL, diag, where);
    if (rc < 0)
        return rc;
    uint64_t nv = value_count(c);
    if (nv > 0 && c->values == NULL)
        return strata_diag_set(diag, STRATA_EINVAL, "%s: values is NULL", where);
    if (STRATA_VALUES_QUANTISED(c->values_format))
        rc = check_quantised(c, STRATA_EINVAL, diag, where);
    else
        rc = check_values(c->values, nv, c, STRATA_EINVAL, diag, where);
    if (rc < 0)
        return rc;
    uint64_t len = 0;
    if ((c->comp == STRATA_COMP_TOPK || c->values_format == STRATA_VALUES_INT8) && c->count > 0) {
        pl->gaps = malloc((size_t)c->count * sizeof(uint32_t));
        if (pl->gaps == NULL)
            return strata_diag_set(diag, STRATA_ENOMEM, "out of memory");
    }
    switch (c->comp) {
    case STRATA_COMP_TOPK:
        if (c->count > 0 && c->indices == NULL)
            return strata_diag_set(diag, STRATA_EINVAL, "%s: indices is NULL", where);
        for (uint64_t k = 0; k < c->count; k++) {
            uint32_t idx = c->indices[k];
            if (idx >= c->numel)
                return strata_diag_set(diag, STRATA_EINVAL,
                                       "%s: index %" PRIu32 " at entry %" PRIu64
                                       " out of range for %" PRIu64 " elements",
                                       where, idx, k, c->numel);
            if (k > 0 && idx <= c->indices[k - 1])
                return strata_diag_set(diag, STRATA_EINVAL,
                                       "%s: index %" PRIu32 " at entry %" PRIu64
                                       " not above the previous index %" PRIu32,
                                       where, idx, k, c->indices[k - 1]);
        }
        if (c->count > 0) {
            uint64_t bits;
            position_gaps(c->indices, c->count, pl->gaps);
            pl->r_pos = rice_best(pl->gaps, c->count, MAX_RICE_POS, &bits);
            len = 1 + bits_to_bytes(bits);
        }
        len += plan_values(c, nv, pl);
        break;
    case STRATA_COMP_QSGD:
        if (c->qlevels == NULL)
            return strata_diag_set(diag, STRATA_EINVAL, "%s: qlevels is NULL", where);
        rc = check_qlevels(c->qlevels, c->numel, c->levels, STRATA_EINVAL, diag, where);
        if (rc < 0)
            return rc;
        len = c->numel;
        break;
    case STRATA_COMP_SIGN:
        if (c->signbits == NULL)
            return strata_diag_set(diag, STRATA_EINVAL, "%s: signbits is NULL", where);
        len = sign_bytes(c->numel);
        break;
    default:
        len = plan_values(c, nv, pl);
        break;
    }
    pl->data_len = len;
    return STRATA_OK;
}

/* Writes n float values (FP32, FP16, BF16) as planned: the smallest
 * exponent, the number of bit planes, the planes of the exponent offsets,
 * then the sign-and-mantissa fields as one bit stream. */
static uint8_t *put_floats(uint8_t *w, const float *v, uint64_t n, strata_values_format f,
                           const layer_plan *pl)
{
    if (n == 0)
        return w;
    *w++ = (uint8_t)pl->base;
    *w++ = (uint8_t)pl->planes;
    const uint64_t pb = bits_to_bytes(n);
    if (pl->planes > 0) {
        memset(w, 0, (size_t)(pl->planes * pb));
        for (uint64_t i = 0; i < n; i++) {
            unsigned off = float_exponent(v[i], f) - pl->base;
            for (unsigned j = 0; j < pl->planes; j++)
                w[j * pb + i / 8] |= (uint8_t)(((off >> j) & 1u) << (i % 8));
        }
        w += pl->planes * pb;
    }
    if (f == STRATA_VALUES_FP32) {
        for (uint64_t i = 0; i < n; i++) {
            uint32_t x = float_field(v[i], f);
            w[0] = (uint8_t)x;
            w[1] = (uint8_t)(x >> 8);
            w[2] = (uint8_t)(x >> 16);
            w += 3;
        }
        return w;
    }
    if (f == STRATA_VALUES_BF16) {
        for (uint64_t i = 0; i < n; i++)
            *w++ = (uint8_t)float_field(v[i], f);
        return w;
    }
    bitwr b = {w, 0, 0};
    for (uint64_t i = 0; i < n; i++)
        bw_put(&b, float_field(v[i], f), field_bits(f));
    return bw_end(&b);
}

/* Writes the kept or float values of c as planned. */
static uint8_t *put_values(uint8_t *w, const strata_clayer *c, uint64_t nv, const layer_plan *pl)
{
    if (c->values_format == STRATA_VALUES_TERNARY) {
        bitwr b = {w, 0, 0};
        for (uint64_t j = 0; j < nv; j++)
            bw_put(&b, c->values[j] < 0.0f, 1);
        return bw_end(&b);
    }
    if (c->values_format != STRATA_VALUES_INT8)
        return put_floats(w, c->values, nv, c->values_format, pl);
    if (nv == 0)
        return w;
    *w++ = (uint8_t)pl->base;
    *w++ = (uint8_t)pl->r_val;
    bitwr b = {w, 0, 0};
    for (uint64_t j = 0; j < nv; j++) {
        int q = c->qlevels[j];
        bw_put(&b, q < 0, 1);
        bw_rice(&b, (uint32_t)abs(q) - pl->base, pl->r_val);
    }
    return bw_end(&b);
}

static uint8_t *put_layer(uint8_t *w, const strata_clayer *c, layer_plan *pl)
{
    unsigned used = used_fields(c);
    w = put_u32(w, c->layer_index);
    *w++ = (uint8_t)c->comp;
    *w++ = (uint8_t)c->values_format;
    w = put_u16(w, 0);
    w = put_u64(w, c->numel);
    w = put_u64(w, c->count);
    w = put_u32(w, (used & USES_SCALE) ? f32_bits(c->scale) : 0);
    w = put_u32(w, (used & USES_LEVELS) ? c->levels : 0);
    w = put_u32(w, (used & USES_DIMS) ? c->rows : 0);
    w = put_u32(w, (used & USES_DIMS) ? c->cols : 0);
    w = put_u32(w, (used & USES_DIMS) ? c->rank : 0);
    w = put_u64(w, (used & USES_SEED) ? c->seed : 0);
    w = put_u64(w, pl->data_len);
    switch (c->comp) {
    case STRATA_COMP_TOPK:
        if (c->count > 0) {
            position_gaps(c->indices, c->count, pl->gaps);
            *w++ = (uint8_t)pl->r_pos;
            bitwr b = {w, 0, 0};
            for (uint64_t k = 0; k < c->count; k++)
                bw_rice(&b, pl->gaps[k], pl->r_pos);
            w = bw_end(&b);
        }
        break;
    case STRATA_COMP_QSGD:
        memcpy(w, c->qlevels, c->numel);
        return w + c->numel;
    case STRATA_COMP_SIGN: {
        uint64_t nb = sign_bytes(c->numel);
        memcpy(w, c->signbits, nb);
        if (c->numel % 8 != 0)
            w[nb - 1] &= (uint8_t)((1u << (c->numel % 8)) - 1);
        return w + nb;
    }
    default:
        break;
    }
    return put_values(w, c, value_count(c), pl);
}

/* Adds b to *a unless the sum would overflow size_t. */
static int add_size(size_t *a, uint64_t b)
{
    if (b > SIZE_MAX - *a)
        return 0;
    *a += (size_t)b;
    return 1;
}

int strata_payload_encode(const strata_payload *p, int zstd_level, uint8_t **out, size_t *len,
                          strata_diag *diag)
{
    if (out != NULL)
        *out = NULL;
    if (len != NULL)
        *len = 0;
    if (diag != NULL)
        diag->msg[0] = '\0';
    if (p == NULL || out == NULL || len == NULL)
        return strata_diag_set(diag, STRATA_EINVAL, "payload encode: NULL argument");
    if (zstd_level == 0)
        zstd_level = DEFAULT_LEVEL;
    if (zstd_level < 1 || zstd_level > MAX_LEVEL)
        return strata_diag_set(diag, STRATA_EINVAL, "zstd level %d outside [1, %d]", zstd_level,
                               MAX_LEVEL);
    if (p->num_layers > 0 && p->layers == NULL)
        return strata_diag_set(diag, STRATA_EINVAL, "layers is NULL for %zu layers", p->num_layers);
    if ((uint64_t)p->num_layers > UINT32_MAX)
        return strata_diag_set(diag, STRATA_EINVAL, "%zu layers do not fit the format",
                               p->num_layers);

    layer_plan *plan = NULL;
    uint8_t *body = NULL;
    int rc = STRATA_OK;
    size_t body_len = HEADER_BYTES + 4 + 4, meta_len = 0;

    if (p->num_layers > 0) {
        plan = calloc(p->num_layers, sizeof(*plan));
        if (plan == NULL)
            return strata_diag_set(diag, STRATA_ENOMEM, "out of memory");
    }
    for (size_t i = 0; i < p->num_layers; i++) {
        const strata_clayer *c = &p->layers[i];
        if (i > 0 && c->layer_index <= p->layers[i - 1].layer_index) {
            rc = strata_diag_set(diag, STRATA_EINVAL,
                                 "layers[%zu]: layer index %" PRIu32
                                 " not above the previous layer's %" PRIu32,
                                 i, c->layer_index, p->layers[i - 1].layer_index);
            goto out;
        }
        rc = encode_check_layer(c, i, &plan[i], diag);
        if (rc < 0)
            goto out;
        if (!add_size(&body_len, BLOCK_BYTES) || !add_size(&body_len, plan[i].data_len)) {
            rc = strata_diag_set(diag, STRATA_ETOOBIG, "payload body does not fit in memory");
            goto out;
        }
    }
    if (p->metadata_json != NULL) {
        meta_len = strlen(p->metadata_json);
        if (meta_len > UINT32_MAX) {
            rc = strata_diag_set(diag, STRATA_EINVAL, "metadata: %zu bytes do not fit the format",
                                 meta_len);
            goto out;
        }
        rc = check_metadata(p->metadata_json, meta_len, STRATA_EINVAL, diag);
        if (rc < 0)
            goto out;
        if (!add_size(&body_len, meta_len)) {
            rc = strata_diag_set(diag, STRATA_ETOOBIG, "payload body does not fit in memory");
            goto out;
        }
    }

    body = malloc(body_len);
    if (body == NULL) {
        rc = strata_diag_set(diag, STRATA_ENOMEM, "out of memory (%zu-byte body)", body_len);
        goto out;
    }
    uint8_t *w = body;
    memcpy(w, MAGIC, sizeof(MAGIC));
    w += sizeof(MAGIC);
    w = put_u16(w, STRATA_PAYLOAD_VERSION);
    w = put_u16(w, 0);
    w = put_u32(w, p->round);
    w = put_u32(w, p->flags);
    w = put_u64(w, p->model_version);
    w = put_u64(w, p->client_id);
    w = put_u64(w, p->sample_count);
    w = put_u32(w, (uint32_t)p->num_layers);
    for (size_t i = 0; i < p->num_layers; i++)
        w = put_layer(w, &p->layers[i], &plan[i]);
    w = put_u32(w, (uint32_t)meta_len);
    if (meta_len > 0) {
        memcpy(w, p->metadata_json, meta_len);
        w += meta_len;
    }
    w = put_u32(w, strata_crc32c(0, body, (size_t)(w - body)));
    if ((size_t)(w - body) != body_len) {
        rc = strata_diag_set(diag, STRATA_EINVAL, "internal error: body size mismatch");
        goto out;
    }

    rc = strata_zframe_compress(NULL, body, body_len, zstd_level, out, len, diag);

out:
    free(body);
    if (plan != NULL)
        for (size_t i = 0; i < p->num_layers; i++)
            free(plan[i].gaps);
    free(plan);
    return rc;
}

/* ------------------------------------------------------------------------ */
/* Decoding                                                                 */
/* ------------------------------------------------------------------------ */

void strata_payload_free(strata_payload *p)
{
    if (p == NULL)
        return;
    strata_clayers_free(p->layers, p->num_layers);
    free(p->metadata_json);
    free(p);
}

typedef struct limits {
    uint64_t max_decoded_bytes;
    uint32_t max_layers;
    uint64_t max_layer_numel;
    size_t max_metadata_bytes;
    uint64_t max_total_numel;
} limits;

static limits resolve_limits(const strata_payload_limits *in)
{
    limits l = {STRATA_PAYLOAD_DEFAULT_MAX_DECODED_BYTES, STRATA_PAYLOAD_DEFAULT_MAX_LAYERS,
                STRATA_PAYLOAD_DEFAULT_MAX_LAYER_NUMEL, STRATA_PAYLOAD_DEFAULT_MAX_METADATA_BYTES,
                STRATA_PAYLOAD_DEFAULT_MAX_TOTAL_NUMEL};
    if (in != NULL) {
        if (in->max_decoded_bytes != 0)
            l.max_decoded_bytes = in->max_decoded_bytes;
        if (in->max_layers != 0)
            l.max_layers = in->max_layers;
        if (in->max_layer_numel != 0)
            l.max_layer_numel = in->max_layer_numel;
        if (in->max_metadata_bytes != 0)
            l.max_metadata_bytes = in->max_metadata_bytes;
        if (in->max_total_numel != 0)
            l.max_total_numel = in->max_total_numel;
    }
    return l;
}

/* Checks that buf is exactly one zstd frame with a declared content size
 * within the limit, and decompresses it into a new buffer. */
static int unframe(strata_zctx *z, const uint8_t *buf, size_t len, const limits *lim,
                   uint8_t **body, size_t *body_len, strata_diag *diag)
{
    size_t max =
        lim->max_decoded_bytes < SIZE_MAX - 1 ? (size_t)lim->max_decoded_bytes : SIZE_MAX - 1;
    return strata_zframe_decompress(z, buf, len, MIN_BODY, max, body, body_len, diag);
}

/* A new float array for n values: 64-byte aligned like strata_alloc_floats,
 * not zero-filled (every element is written). n was checked against the
 * body size, so the size cannot overflow. */
static float *new_floats(uint64_t n)
{
    size_t bytes = ((size_t)n * sizeof(float) + 63) & ~(size_t)63;
    return aligned_alloc(64, bytes > 0 ? bytes : 64);
}

/* Decodes the Rice-coded positions of a TOPK layer (count > 0) from src[0
 * .. n): the parameter byte, then the stream. *used receives the bytes they
 * take. */
static int get_positions(const uint8_t *src, uint64_t n, strata_clayer *c, uint64_t *used,
                         strata_diag *diag, const char *where)
{
    if (n < 1)
        return strata_diag_set(diag, STRATA_EPROTO, "%s: the positions' Rice parameter is missing",
                               where);
    unsigned r = src[0];
    if (r > MAX_RICE_POS)
        return strata_diag_set(diag, STRATA_EPROTO, "%s: positions' Rice parameter %u above %u",
                               where, r, MAX_RICE_POS);
    c->indices = malloc((size_t)c->count * sizeof(uint32_t));
    if (c->indices == NULL)
        return strata_diag_set(diag, STRATA_ENOMEM, "out of memory");
    bitrd b = {src + 1, (n - 1) * 8, 0};
    uint64_t next = 0; /* smallest position the next index may take */
    for (uint64_t k = 0; k < c->count; k++) {
        if (next >= c->numel)
            return strata_diag_set(diag, STRATA_EPROTO,
                                   "%s: index entry %" PRIu64 " has no room below %" PRIu64
                                   " elements",
                                   where, k, c->numel);
        uint64_t room = c->numel - 1 - next, q = 0;
        uint32_t low = 0;
        int st = br_unary(&b, room >> r, &q);
        if (st == -2)
            return strata_diag_set(diag, STRATA_EPROTO,
                                   "%s: index entry %" PRIu64 " out of range for %" PRIu64
                                   " elements",
                                   where, k, c->numel);
        if (st < 0 || br_bits(&b, r, &low) < 0)
            return strata_diag_set(diag, STRATA_EPROTO,
                                   "%s: index entry %" PRIu64 ": the positions stream is truncated",
                                   where, k);
        uint64_t g = (q << r) | low;
        if (g > room)
            return strata_diag_set(diag, STRATA_EPROTO,
                                   "%s: index %" PRIu64 " out of range for %" PRIu64
                                   " elements (entry %" PRIu64 ")",
                                   where, next + g, c->numel, k);
        c->indices[k] = (uint32_t)(next + g);
        next += g + 1;
    }
    if (!br_padding_zero(&b))
        return strata_diag_set(diag, STRATA_EPROTO, "%s: padding bits after the positions are set",
                               where);
    /* Canonical: the parameter must be the one that codes the gaps in the
     * fewest bits (the decoded indices are overwritten by their gaps and
     * restored). */
    uint32_t *g = malloc((size_t)c->count * sizeof(uint32_t));
    if (g == NULL)
        return strata_diag_set(diag, STRATA_ENOMEM, "out of memory");
    position_gaps(c->indices, c->count, g);
    uint64_t bits;
    unsigned best = rice_best(g, c->count, MAX_RICE_POS, &bits);
    free(g);
    if (best != r)
        return strata_diag_set(diag, STRATA_EPROTO,
                               "%s: positions' Rice parameter %u is not the shortest (%u)", where,
                               r, best);
    *used = 1 + bits_to_bytes(b.pos);
    return STRATA_OK;
}

/* Decodes n float values of format f (FP32, FP16, BF16) from exactly len
 * bytes at src into a new array. */
static int get_floats(const uint8_t *src, uint64_t len, uint64_t n, strata_values_format f,
                      float **out, strata_diag *diag, const char *where)
{
    const char *fname = format_name(f);
    if (n == 0)
        return len == 0 ? STRATA_OK
                        : strata_diag_set(diag, STRATA_EPROTO,
                                          "%s: %" PRIu64 " data bytes for no values", where, len);
    const unsigned emax = f == STRATA_VALUES_FP16 ? 31u : 255u;
    unsigned base = len >= 2 ? src[0] : 0, planes = len >= 2 ? src[1] : 0;
    if (len < 2 || base > emax || planes > bit_length(emax))
        return strata_diag_set(diag, STRATA_EPROTO,
                               "%s: %s values: missing, or exponent base %u above %u, or %u bit "
                               "planes above %u",
                               where, fname, base, emax, planes, bit_length(emax));
    uint64_t want = float_bytes(n, planes, f); /* n < 2^33: no overflow */
    if (len != want)
        return strata_diag_set(diag, STRATA_EPROTO,
                               "%s: %" PRIu64 " bytes for %" PRIu64
                               " %s values with %u exponent planes, which take %" PRIu64,
                               where, len, n, fname, planes, want);
    const uint64_t pb = bits_to_bytes(n);
    for (unsigned j = 0; j < planes; j++)
        if (n % 8 != 0 && (src[2 + j * pb + pb - 1] >> (n % 8)) != 0)
            return strata_diag_set(diag, STRATA_EPROTO,
                                   "%s: padding bits after exponent plane %u are set", where, j);
    float *v = new_floats(n);
    if (v == NULL)
        return strata_diag_set(diag, STRATA_ENOMEM, "out of memory");
    *out = v;
    const unsigned fb = field_bits(f);
    const uint8_t *planes_at = src + 2, *fields = src + 2 + planes * pb;
    bitrd b = {fields, bits_to_bytes(n * fb) * 8, 0};
    unsigned lo = 255, hi = 0;
    for (uint64_t i = 0; i < n; i++) {
        uint32_t off = 0, field = 0;
        for (unsigned j = 0; j < planes; j++)
            off |= (uint32_t)((planes_at[j * pb + i / 8] >> (i % 8)) & 1u) << j;
        lo = off < lo ? off : lo;
        hi = off > hi ? off : hi;
        uint32_t e = base + off;
        if (e > emax)
            return strata_diag_set(diag, STRATA_EPROTO,
                                   "%s: %s exponent %u of value %" PRIu64 " above %u", where, fname,
                                   (unsigned)e, i, emax);
        /* In range: the length was checked. fp32 and bf16 fields are whole
         * bytes. */
        if (fb == 24)
            field = (uint32_t)fields[3 * i] | ((uint32_t)fields[3 * i + 1] << 8) |
                    ((uint32_t)fields[3 * i + 2] << 16);
        else if (fb == 8)
            field = fields[i];
        else
            br_bits(&b, fb, &field);
        if (f == STRATA_VALUES_FP32)
            v[i] = bits_f32(((field >> 23) << 31) | (e << 23) | (field & 0x7FFFFFu));
        else if (f == STRATA_VALUES_FP16)
            v[i] = from_half((uint16_t)(((field >> 10) << 15) | (e << 10) | (field & 0x3FFu)), f);
        else
            v[i] = bits_f32(((field >> 7) << 31) | (e << 23) | ((field & 0x7Fu) << 16));
    }
    if (lo != 0 || bit_length(hi) != planes)
        return strata_diag_set(
            diag, STRATA_EPROTO,
            "%s: exponent base %u is not the smallest exponent, or %u bit planes "
            "are not what the largest offset %u needs",
            where, base, planes, hi);
    if (fb == 11 && !br_padding_zero(&b))
        return strata_diag_set(diag, STRATA_EPROTO, "%s: padding bits after the values are set",
                               where);
    return STRATA_OK;
}

/* Decodes the n INT8 kept values from exactly len bytes at src. */
static int get_int8(const uint8_t *src, uint64_t len, uint64_t n, strata_clayer *c,
                    strata_diag *diag, const char *where)
{
    c->values = new_floats(n);
    c->qlevels = malloc(n > 0 ? (size_t)n : 1);
    if (c->values == NULL || c->qlevels == NULL)
        return strata_diag_set(diag, STRATA_ENOMEM, "out of memory");
    if (n == 0)
        return len == 0 ? STRATA_OK
                        : strata_diag_set(diag, STRATA_EPROTO,
                                          "%s: %" PRIu64 " data bytes for no values", where, len);
    if (len < 2)
        return strata_diag_set(diag, STRATA_EPROTO, "%s: int8 values truncated", where);
    unsigned base = src[0], r = src[1];
    if (base > 127 || r > MAX_RICE_INT8)
        return strata_diag_set(diag, STRATA_EPROTO,
                               "%s: int8 base %u above 127 or Rice parameter %u above %u", where,
                               base, r, MAX_RICE_INT8);
    bitrd b = {src + 2, (len - 2) * 8, 0};
    uint32_t *g = malloc((size_t)n * sizeof(uint32_t));
    if (g == NULL)
        return strata_diag_set(diag, STRATA_ENOMEM, "out of memory");
    int rc = STRATA_OK;
    unsigned seen_base = 0;
    for (uint64_t j = 0; j < n && rc == STRATA_OK; j++) {
        uint32_t neg = 0, low = 0;
        uint64_t q;
        int st = br_bits(&b, 1, &neg);
        if (st == 0)
            st = br_unary(&b, (127 - base) >> r, &q);
        if (st == 0)
            st = br_bits(&b, r, &low);
        if (st < 0) {
            rc = strata_diag_set(diag, STRATA_EPROTO, "%s: int8 value %" PRIu64 ": %s", where, j,
                                 st == -2 ? "magnitude above 127" : "the stream is truncated");
            break;
        }
        uint64_t m = base + ((q << r) | low);
        if (m > 127)
            rc = strata_diag_set(diag, STRATA_EPROTO,
                                 "%s: int8 value %" PRIu64 ": magnitude %" PRIu64 " above 127",
                                 where, j, m);
        else if (m == 0 && neg)
            rc = strata_diag_set(diag, STRATA_EPROTO, "%s: int8 value %" PRIu64 " is -0", where, j);
        else if (m != 0 && c->scale == 0.0f)
            rc =
                strata_diag_set(diag, STRATA_EPROTO,
                                "%s: int8 value %" PRIu64 " is not 0 under a zero scale", where, j);
        g[j] = (uint32_t)(m - base);
        seen_base |= m == base;
        c->qlevels[j] = (int8_t)(neg ? -(int)m : (int)m);
        c->values[j] = c->scale * (float)c->qlevels[j];
    }
    if (rc == STRATA_OK && !seen_base)
        rc = strata_diag_set(diag, STRATA_EPROTO, "%s: int8 base %u is not the smallest magnitude",
                             where, base);
    if (rc == STRATA_OK && (!br_padding_zero(&b) || bits_to_bytes(b.pos) != len - 2))
        rc = strata_diag_set(diag, STRATA_EPROTO,
                             "%s: int8 values: padding bits set or bytes left over", where);
    if (rc == STRATA_OK) {
        uint64_t bits;
        unsigned best = rice_best(g, n, MAX_RICE_INT8, &bits);
        if (best != r)
            rc = strata_diag_set(diag, STRATA_EPROTO,
                                 "%s: int8 Rice parameter %u is not the shortest (%u)", where, r,
                                 best);
    }
    free(g);
    return rc;
}

/* Decodes the n TERNARY kept values from exactly len bytes at src. */
static int get_ternary(const uint8_t *src, uint64_t len, uint64_t n, strata_clayer *c,
                       strata_diag *diag, const char *where)
{
    if (len != bits_to_bytes(n))
        return strata_diag_set(diag, STRATA_EPROTO,
                               "%s: %" PRIu64 " bytes of ternary signs, %" PRIu64 " expected",
                               where, len, bits_to_bytes(n));
    c->values = new_floats(n);
    if (c->values == NULL)
        return strata_diag_set(diag, STRATA_ENOMEM, "out of memory");
    for (uint64_t j = 0; j < n; j++) {
        int neg = (src[j / 8] >> (j % 8)) & 1;
        if (neg && c->scale == 0.0f)
            return strata_diag_set(diag, STRATA_EPROTO,
                                   "%s: ternary value %" PRIu64 " negative under a zero magnitude",
                                   where, j);
        c->values[j] = neg ? -c->scale : c->scale;
    }
    if (n % 8 != 0 && (src[n / 8] >> (n % 8)) != 0)
        return strata_diag_set(diag, STRATA_EPROTO, "%s: padding bits after the signs are set",
                               where);
    return STRATA_OK;
}

/* Parses the layer block at body[*pos .. end) into c. */
static int get_layer(const uint8_t *body, size_t end, size_t *pos, size_t block, int has_prev,
                     uint32_t prev_index, const limits *lim, strata_clayer *c, strata_diag *diag)
{
    size_t at = *pos;
    if (end - at < BLOCK_BYTES)
        return strata_diag_set(diag, STRATA_EPROTO,
                               "layer block %zu at body byte %zu: truncated (the block header "
                               "needs %u bytes, %zu left before the metadata length)",
                               block, at, BLOCK_BYTES, end - at);
    const uint8_t *h = body + at;
    c->layer_index = get_u32(h);
    unsigned comp = h[4], fmt = h[5];
    c->comp = (strata_compressor_id)comp;
    c->values_format = (strata_values_format)fmt;
    c->numel = get_u64(h + 8);
    c->count = get_u64(h + 16);
    uint32_t scale_bits = get_u32(h + 24);
    c->scale = bits_f32(scale_bits);
    c->levels = get_u32(h + 28);
    c->rows = get_u32(h + 32);
    c->cols = get_u32(h + 36);
    c->rank = get_u32(h + 40);
    c->seed = get_u64(h + 44);
    uint64_t data_len = get_u64(h + 52);

    char where[96];
    snprintf(where, sizeof(where), "layer %" PRIu32 " (%s, block %zu)", c->layer_index,
             comp_name(comp), block);
    if (has_prev && c->layer_index <= prev_index)
        return strata_diag_set(
            diag, STRATA_EPROTO, "%s: %s layer index (previous block has %" PRIu32 ")", where,
            c->layer_index == prev_index ? "duplicate" : "out-of-order", prev_index);
    if (get_u16(h + 6) != 0)
        return strata_diag_set(diag, STRATA_EPROTO, "%s: reserved block field is %u, must be 0",
                               where, (unsigned)get_u16(h + 6));
    int rc = check_params(c, STRATA_EPROTO, diag, where);
    if (rc < 0)
        return rc;
    if (c->numel > lim->max_layer_numel)
        return strata_diag_set(diag, STRATA_ETOOBIG,
                               "%s: numel %" PRIu64 " above the limit of %" PRIu64, where, c->numel,
                               lim->max_layer_numel);
    unsigned used = used_fields(c);
    const char *stray = NULL;
    if (!(used & USES_SCALE) && scale_bits != 0)
        stray = "scale";
    else if (!(used & USES_LEVELS) && c->levels != 0)
        stray = "levels";
    else if (!(used & USES_DIMS) && (c->rows | c->cols | c->rank) != 0)
        stray = "rows/cols/rank";
    else if (!(used & USES_SEED) && c->seed != 0)
        stray = "seed";
    if (stray != NULL)
        return strata_diag_set(diag, STRATA_EPROTO, "%s: field %s must be 0 for this compressor",
                               where, stray);

    at += BLOCK_BYTES;
    if (data_len > end - at)
        return strata_diag_set(diag, STRATA_EPROTO,
                               "%s: truncated: data length %" PRIu64 " exceeds the %zu bytes left",
                               where, data_len, end - at);
    const uint8_t *d = body + at;
    uint64_t nv = value_count(c);
    /* Every kept element takes at least one bit: this bounds what the
     * arrays below may cost before anything is allocated. */
    if ((c->comp == STRATA_COMP_TOPK || c->comp == STRATA_COMP_RANDK) && c->count > 8 * data_len)
        return strata_diag_set(diag, STRATA_EPROTO,
                               "%s: data length %" PRIu64 " cannot hold %" PRIu64 " kept elements",
                               where, data_len, c->count);
    uint64_t off = 0;
    if (c->comp == STRATA_COMP_TOPK && c->count > 0) {
        rc = get_positions(d, data_len, c, &off, diag, where);
        if (rc < 0)
            return rc;
    }
    uint64_t rest = data_len - off;
    if (c->comp == STRATA_COMP_QSGD || c->comp == STRATA_COMP_SIGN) {
        uint64_t want = c->comp == STRATA_COMP_QSGD ? c->numel : sign_bytes(c->numel);
        if (data_len != want)
            return strata_diag_set(diag, STRATA_EPROTO,
                                   "%s: data length %" PRIu64 " differs from the %" PRIu64
                                   " bytes the layer needs",
                                   where, data_len, want);
    } else if (c->values_format == STRATA_VALUES_INT8) {
        rc = get_int8(d + off, rest, nv, c, diag, where);
        if (rc < 0)
            return rc;
    } else if (c->values_format == STRATA_VALUES_TERNARY) {
        rc = get_ternary(d + off, rest, nv, c, diag, where);
        if (rc < 0)
            return rc;
    } else {
        rc = get_floats(d + off, rest, nv, c->values_format, &c->values, diag, where);
        if (rc < 0)
            return rc;
        if (nv > 0) {
            rc = check_values(c->values, nv, c, STRATA_EPROTO, diag, where);
            if (rc < 0)
                return rc;
        }
    }
    if (c->comp == STRATA_COMP_QSGD) {
        c->qlevels = malloc((size_t)c->numel);
        if (c->qlevels == NULL)
            return strata_diag_set(diag, STRATA_ENOMEM, "out of memory");
        memcpy(c->qlevels, d, (size_t)c->numel);
        rc = check_qlevels(c->qlevels, c->numel, c->levels, STRATA_EPROTO, diag, where);
        if (rc < 0)
            return rc;
    } else if (c->comp == STRATA_COMP_SIGN) {
        size_t nb = (size_t)sign_bytes(c->numel);
        if (c->numel % 8 != 0 && (d[nb - 1] >> (c->numel % 8)) != 0)
            return strata_diag_set(diag, STRATA_EPROTO,
                                   "%s: padding bits after element %" PRIu64 " are not zero", where,
                                   c->numel - 1);
        c->signbits = malloc(nb);
        if (c->signbits == NULL)
            return strata_diag_set(diag, STRATA_ENOMEM, "out of memory");
        memcpy(c->signbits, d, nb);
    }
    *pos = at + (size_t)data_len;
    return STRATA_OK;
}

/* Parses a body whose CRC has been verified. */
static int parse_body(const uint8_t *body, size_t body_len, const limits *lim, strata_payload *p,
                      strata_diag *diag)
{
    size_t end = body_len - 4; /* the CRC */
    if (memcmp(body, MAGIC, sizeof(MAGIC)) != 0)
        return strata_diag_set(diag, STRATA_EPROTO,
                               "bad magic %02x %02x %02x %02x (expected \"STRP\")", body[0],
                               body[1], body[2], body[3]);
    unsigned version = get_u16(body + 4);
    if (version != STRATA_PAYLOAD_VERSION)
        return strata_diag_set(diag, STRATA_EPROTO,
                               "unsupported format version %u (this decoder reads %d)", version,
                               STRATA_PAYLOAD_VERSION);
    if (get_u16(body + 6) != 0)
        return strata_diag_set(diag, STRATA_EPROTO, "reserved header field is %u, must be 0",
                               (unsigned)get_u16(body + 6));
    p->round = get_u32(body + 8);
    p->flags = get_u32(body + 12);
    p->model_version = get_u64(body + 16);
    p->client_id = get_u64(body + 24);
    p->sample_count = get_u64(body + 32);
    uint32_t nlayers = get_u32(body + 40);
    size_t pos = HEADER_BYTES;
    if (nlayers > lim->max_layers)
        return strata_diag_set(diag, STRATA_ETOOBIG,
                               "layer count %" PRIu32 " above the limit of %" PRIu32, nlayers,
                               lim->max_layers);
    /* end - pos >= 4 holds: the body is at least MIN_BODY bytes. */
    if ((uint64_t)nlayers * BLOCK_BYTES > end - pos - 4)
        return strata_diag_set(diag, STRATA_EPROTO,
                               "layer count %" PRIu32 " needs at least %" PRIu64
                               " bytes of layer blocks, the body has %zu",
                               nlayers, (uint64_t)nlayers * BLOCK_BYTES, end - pos - 4);
    if (nlayers > 0) {
        p->layers = calloc(nlayers, sizeof(*p->layers));
        if (p->layers == NULL)
            return strata_diag_set(diag, STRATA_ENOMEM, "out of memory");
        p->num_layers = nlayers;
    }
    uint64_t total = 0;
    for (uint32_t i = 0; i < nlayers; i++) {
        int rc = get_layer(body, end, &pos, i, i > 0, i > 0 ? p->layers[i - 1].layer_index : 0, lim,
                           &p->layers[i], diag);
        if (rc < 0)
            return rc;
        total += p->layers[i].numel; /* each numel < 2^32, at most 2^32 layers */
        if (total > lim->max_total_numel)
            return strata_diag_set(diag, STRATA_ETOOBIG,
                                   "layer %" PRIu32 ": the layers describe more than %" PRIu64
                                   " dense elements in total",
                                   i, lim->max_total_numel);
    }

    if (end - pos < 4)
        return strata_diag_set(
            diag, STRATA_EPROTO,
            "truncated at body byte %zu: the metadata length needs 4 bytes, %zu left", pos,
            end - pos);
    uint32_t mlen = get_u32(body + pos);
    pos += 4;
    if (mlen > lim->max_metadata_bytes)
        return strata_diag_set(diag, STRATA_ETOOBIG,
                               "metadata length %" PRIu32 " above the limit of %zu", mlen,
                               lim->max_metadata_bytes);
    if (mlen > end - pos)
        return strata_diag_set(diag, STRATA_EPROTO,
                               "truncated: metadata length %" PRIu32 " exceeds the %zu bytes left",
                               mlen, end - pos);
    if (mlen > 0) {
        const char *m = (const char *)(body + pos);
        int rc = check_metadata(m, mlen, STRATA_EPROTO, diag);
        if (rc < 0)
            return rc;
        p->metadata_json = malloc((size_t)mlen + 1);
        if (p->metadata_json == NULL)
            return strata_diag_set(diag, STRATA_ENOMEM, "out of memory");
        memcpy(p->metadata_json, m, mlen);
        p->metadata_json[mlen] = '\0';
        pos += mlen;
    }
    if (pos != end)
        return strata_diag_set(diag, STRATA_EPROTO,
                               "%zu unexpected bytes between the metadata and the checksum",
                               end - pos);
    return STRATA_OK;
}

int strata_payload_decode(const uint8_t *buf, size_t len, const strata_payload_limits *lim,
                          strata_payload **out, strata_diag *diag)
{
    return strata_payload_decode_z(NULL, buf, len, lim, out, diag);
}

int strata_payload_decode_z(strata_zctx *z, const uint8_t *buf, size_t len,
                            const strata_payload_limits *lim, strata_payload **out,
                            strata_diag *diag)
{
    if (out != NULL)
        *out = NULL;
    if (diag != NULL)
        diag->msg[0] = '\0';
    if (out == NULL || (buf == NULL && len > 0))
        return strata_diag_set(diag, STRATA_EINVAL, "payload decode: NULL argument");
    limits l = resolve_limits(lim);
    uint8_t *body = NULL;
    size_t body_len = 0;
    int rc = unframe(z, buf, len, &l, &body, &body_len, diag);
    if (rc < 0)
        return rc;

    strata_payload *p = NULL;
    uint32_t stored = get_u32(body + body_len - 4);
    uint32_t computed = strata_crc32c(0, body, body_len - 4);
    if (stored != computed) {
        rc = strata_diag_set(diag, STRATA_EPROTO,
                             "checksum mismatch: body stores CRC32C %08" PRIx32
                             ", its bytes give %08" PRIx32,
                             stored, computed);
        goto out;
    }
    p = calloc(1, sizeof(*p));
    if (p == NULL) {
        rc = strata_diag_set(diag, STRATA_ENOMEM, "out of memory");
        goto out;
    }
    rc = parse_body(body, body_len, &l, p, diag);
    if (rc < 0)
        goto out;
    *out = p;
    p = NULL;
out:
    strata_payload_free(p);
    free(body);
    return rc;
}
