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
#define MAX_VARINT_BYTES 5u
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

static size_t format_width(strata_values_format f)
{
    return f == STRATA_VALUES_FP32 ? 4 : 2;
}

/* ------------------------------------------------------------------------ */
/* Little-endian integers and varints                                       */
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

static size_t varint_size(uint32_t v)
{
    size_t n = 1;
    while (v >= 0x80) {
        v >>= 7;
        n++;
    }
    return n;
}

static uint8_t *put_varint(uint8_t *p, uint32_t v)
{
    while (v >= 0x80) {
        *p++ = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    *p++ = (uint8_t)v;
    return p;
}

typedef enum {
    VARINT_OK = 0,
    VARINT_TRUNCATED,
    VARINT_TOO_LONG,
    VARINT_OVERFLOW,
    VARINT_NOT_MINIMAL
} varint_status;

static const char *varint_problem(varint_status s)
{
    switch (s) {
    case VARINT_TRUNCATED:
        return "varint truncated at the end of the index bytes";
    case VARINT_TOO_LONG:
        return "varint longer than 5 bytes";
    case VARINT_OVERFLOW:
        return "varint overflows 32 bits";
    case VARINT_NOT_MINIMAL:
        return "varint not minimally encoded (ends in a zero byte)";
    default:
        return "varint ok";
    }
}

/* Reads one LEB128 varint of at most 32 bits from p[*pos .. n). */
static varint_status get_varint(const uint8_t *p, size_t n, size_t *pos, uint32_t *out)
{
    uint64_t v = 0;
    for (unsigned i = 0; i < MAX_VARINT_BYTES; i++) {
        if (*pos >= n)
            return VARINT_TRUNCATED;
        uint8_t b = p[(*pos)++];
        v |= (uint64_t)(b & 0x7F) << (7 * i);
        if ((b & 0x80) == 0) {
            if (i > 0 && b == 0)
                return VARINT_NOT_MINIMAL;
            if (v > UINT32_MAX)
                return VARINT_OVERFLOW;
            *out = (uint32_t)v;
            return VARINT_OK;
        }
    }
    return VARINT_TOO_LONG;
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

/* 1 when finite float32 bits x are exactly representable in binary16. */
static int fp16_exact(uint32_t x)
{
    return f32_bits(strata_f16_to_f32(strata_f32_to_f16(bits_f32(x)))) == x;
}

/* ------------------------------------------------------------------------ */
/* Validation shared by the encoder and the decoder                         */
/* ------------------------------------------------------------------------ */

enum { USES_SCALE = 1, USES_LEVELS = 2, USES_DIMS = 4, USES_SEED = 8 };

static unsigned used_fields(strata_compressor_id comp)
{
    switch (comp) {
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

/* Validates layer c (the i-th of the payload) for encoding and computes the
 * byte length of its encoded data. */
static int encode_check_layer(const strata_clayer *c, size_t i, uint64_t *data_len,
                              strata_diag *diag)
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
    rc = check_values(c->values, nv, c, STRATA_EINVAL, diag, where);
    if (rc < 0)
        return rc;
    uint64_t len = nv * format_width(c->values_format);
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
            len += varint_size(k == 0 ? idx : idx - c->indices[k - 1]);
        }
        break;
    case STRATA_COMP_QSGD:
        if (c->qlevels == NULL)
            return strata_diag_set(diag, STRATA_EINVAL, "%s: qlevels is NULL", where);
        rc = check_qlevels(c->qlevels, c->numel, c->levels, STRATA_EINVAL, diag, where);
        if (rc < 0)
            return rc;
        len += c->numel;
        break;
    case STRATA_COMP_SIGN:
        if (c->signbits == NULL)
            return strata_diag_set(diag, STRATA_EINVAL, "%s: signbits is NULL", where);
        len += sign_bytes(c->numel);
        break;
    default:
        break;
    }
    *data_len = len;
    return STRATA_OK;
}

/* Writes n values byte-shuffled: all byte 0s, then all byte 1s, ... */
static uint8_t *put_values(uint8_t *w, const float *v, uint64_t n, strata_values_format f)
{
    if (f == STRATA_VALUES_FP32) {
        for (uint64_t i = 0; i < n; i++) {
            uint32_t x = f32_bits(v[i]);
            w[i] = (uint8_t)x;
            w[n + i] = (uint8_t)(x >> 8);
            w[2 * n + i] = (uint8_t)(x >> 16);
            w[3 * n + i] = (uint8_t)(x >> 24);
        }
        return w + 4 * n;
    }
    for (uint64_t i = 0; i < n; i++) {
        uint16_t h = to_half(v[i], f);
        w[i] = (uint8_t)h;
        w[n + i] = (uint8_t)(h >> 8);
    }
    return w + 2 * n;
}

static uint8_t *put_layer(uint8_t *w, const strata_clayer *c, uint64_t data_len)
{
    unsigned used = used_fields(c->comp);
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
    w = put_u64(w, data_len);
    switch (c->comp) {
    case STRATA_COMP_TOPK:
        for (uint64_t k = 0; k < c->count; k++)
            w = put_varint(w, k == 0 ? c->indices[0] : c->indices[k] - c->indices[k - 1]);
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
    return put_values(w, c->values, value_count(c), c->values_format);
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

    uint64_t *data_len = NULL;
    uint8_t *body = NULL;
    int rc = STRATA_OK;
    size_t body_len = HEADER_BYTES + 4 + 4, meta_len = 0;

    if (p->num_layers > 0) {
        data_len = calloc(p->num_layers, sizeof(*data_len));
        if (data_len == NULL)
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
        rc = encode_check_layer(c, i, &data_len[i], diag);
        if (rc < 0)
            goto out;
        if (!add_size(&body_len, BLOCK_BYTES) || !add_size(&body_len, data_len[i])) {
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
        w = put_layer(w, &p->layers[i], data_len[i]);
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
    free(data_len);
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
static int unframe(const uint8_t *buf, size_t len, const limits *lim, uint8_t **body,
                   size_t *body_len, strata_diag *diag)
{
    size_t max =
        lim->max_decoded_bytes < SIZE_MAX - 1 ? (size_t)lim->max_decoded_bytes : SIZE_MAX - 1;
    return strata_zframe_decompress(NULL, buf, len, MIN_BODY, max, body, body_len, diag);
}

/* Reads n byte-shuffled values of format f into a new float array: 64-byte
 * aligned like strata_alloc_floats, but not zero-filled first, since every
 * element is written. n is bounded by the body size, so the size cannot
 * overflow. */
static int get_values(const uint8_t *src, uint64_t n, strata_values_format f, float **out)
{
    size_t bytes = ((size_t)n * sizeof(float) + 63) & ~(size_t)63;
    float *v = aligned_alloc(64, bytes);
    if (v == NULL)
        return STRATA_ENOMEM;
    if (f == STRATA_VALUES_FP32) {
        for (uint64_t i = 0; i < n; i++)
            v[i] = bits_f32((uint32_t)src[i] | ((uint32_t)src[n + i] << 8) |
                            ((uint32_t)src[2 * n + i] << 16) | ((uint32_t)src[3 * n + i] << 24));
    } else {
        for (uint64_t i = 0; i < n; i++)
            v[i] = from_half((uint16_t)(src[i] | (src[n + i] << 8)), f);
    }
    *out = v;
    return STRATA_OK;
}

/* Decodes the count varint-coded TOPK indices in src[0 .. n). */
static int get_indices(const uint8_t *src, size_t n, strata_clayer *c, strata_diag *diag,
                       const char *where)
{
    if (c->count == 0)
        return STRATA_OK;
    c->indices = malloc((size_t)c->count * sizeof(uint32_t));
    if (c->indices == NULL)
        return strata_diag_set(diag, STRATA_ENOMEM, "out of memory");
    size_t pos = 0;
    uint64_t idx = 0;
    for (uint64_t k = 0; k < c->count; k++) {
        uint32_t v;
        size_t at = pos;
        varint_status s = get_varint(src, n, &pos, &v);
        if (s != VARINT_OK)
            return strata_diag_set(diag, STRATA_EPROTO,
                                   "%s: index entry %" PRIu64 ": %s (data byte %zu)", where, k,
                                   varint_problem(s), at);
        if (k == 0) {
            idx = v;
        } else if (v == 0) {
            return strata_diag_set(diag, STRATA_EPROTO,
                                   "%s: index %" PRIu64 " repeated at entry %" PRIu64
                                   " (gap 0; indices must be strictly ascending)",
                                   where, idx, k);
        } else {
            idx += v;
        }
        if (idx >= c->numel)
            return strata_diag_set(diag, STRATA_EPROTO,
                                   "%s: index %" PRIu64 " out of range for %" PRIu64
                                   " elements (entry %" PRIu64 ")",
                                   where, idx, c->numel, k);
        c->indices[k] = (uint32_t)idx;
    }
    if (pos != n)
        return strata_diag_set(diag, STRATA_EPROTO,
                               "%s: %zu bytes left over in the index stream after %" PRIu64
                               " indices",
                               where, n - pos, c->count);
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
    unsigned used = used_fields(c->comp);
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
    uint64_t vbytes = nv * format_width(c->values_format); /* nv <= 2^33: no overflow */
    uint64_t want = vbytes;
    if (c->comp == STRATA_COMP_QSGD)
        want = c->numel;
    else if (c->comp == STRATA_COMP_SIGN)
        want = sign_bytes(c->numel);
    if (c->comp == STRATA_COMP_TOPK) {
        /* Every index takes 1 to 5 varint bytes before the values. */
        if (data_len < vbytes + c->count || data_len - vbytes > MAX_VARINT_BYTES * c->count)
            return strata_diag_set(diag, STRATA_EPROTO,
                                   "%s: data length %" PRIu64 " cannot hold %" PRIu64
                                   " varint indices and %" PRIu64 " bytes of %s values",
                                   where, data_len, c->count, vbytes,
                                   format_name(c->values_format));
        rc = get_indices(d, (size_t)(data_len - vbytes), c, diag, where);
        if (rc < 0)
            return rc;
    } else if (data_len != want) {
        return strata_diag_set(diag, STRATA_EPROTO,
                               "%s: data length %" PRIu64 " differs from the %" PRIu64
                               " bytes the layer needs",
                               where, data_len, want);
    }

    if (nv > 0) {
        if (get_values(d + (data_len - vbytes), nv, c->values_format, &c->values) < 0)
            return strata_diag_set(diag, STRATA_ENOMEM, "out of memory");
        rc = check_values(c->values, nv, c, STRATA_EPROTO, diag, where);
        if (rc < 0)
            return rc;
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
    if (out != NULL)
        *out = NULL;
    if (diag != NULL)
        diag->msg[0] = '\0';
    if (out == NULL || (buf == NULL && len > 0))
        return strata_diag_set(diag, STRATA_EINVAL, "payload decode: NULL argument");
    limits l = resolve_limits(lim);
    uint8_t *body = NULL;
    size_t body_len = 0;
    int rc = unframe(buf, len, &l, &body, &body_len, diag);
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
