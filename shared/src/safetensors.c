#if !defined(_GNU_SOURCE) && !defined(_XOPEN_SOURCE)
#define _XOPEN_SOURCE 700
#endif

#include "strata/safetensors.h"

#include "strata/buf.h"
#include "strata/fileio.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* The header key that holds string metadata instead of a tensor. */
static const char META_KEY[] = "__metadata__";

/* Tensor names are quoted in diagnostics up to this many bytes. */
#define NAME_QUOTE "%.64s"

static char *dup_str(const char *s)
{
    size_t n = strlen(s) + 1;
    char *p = malloc(n);
    if (p != NULL)
        memcpy(p, s, n);
    return p;
}

/* ------------------------------------------------------------------------ */
/* Metadata                                                                 */
/* ------------------------------------------------------------------------ */

void strata_metadata_init(strata_metadata *m)
{
    m->count = 0;
    m->cap = 0;
    m->items = NULL;
}

void strata_metadata_cleanup(strata_metadata *m)
{
    if (m == NULL)
        return;
    for (size_t i = 0; i < m->count; i++) {
        free(m->items[i].key);
        free(m->items[i].value);
    }
    free(m->items);
    strata_metadata_init(m);
}

static strata_metadata_entry *metadata_find(const strata_metadata *m, const char *key)
{
    for (size_t i = 0; i < m->count; i++)
        if (strcmp(m->items[i].key, key) == 0)
            return &m->items[i];
    return NULL;
}

int strata_metadata_set(strata_metadata *m, const char *key, const char *value)
{
    if (m == NULL || key == NULL || value == NULL)
        return STRATA_EINVAL;
    strata_metadata_entry *e = metadata_find(m, key);
    if (e != NULL) {
        char *v = dup_str(value);
        if (v == NULL)
            return STRATA_ENOMEM;
        free(e->value);
        e->value = v;
        return STRATA_OK;
    }
    if (m->count >= STRATA_METADATA_MAX_ENTRIES)
        return STRATA_ETOOBIG;
    strata_metadata_entry *items =
        strata_array_grow(m->items, &m->cap, m->count + 1, sizeof(*items));
    if (items == NULL)
        return STRATA_ENOMEM;
    m->items = items;
    char *k = dup_str(key);
    char *v = dup_str(value);
    if (k == NULL || v == NULL) {
        free(k);
        free(v);
        return STRATA_ENOMEM;
    }
    m->items[m->count].key = k;
    m->items[m->count].value = v;
    m->count++;
    return STRATA_OK;
}

const char *strata_metadata_get(const strata_metadata *m, const char *key)
{
    if (m == NULL || key == NULL)
        return NULL;
    const strata_metadata_entry *e = metadata_find(m, key);
    return e ? e->value : NULL;
}

/* ------------------------------------------------------------------------ */
/* Byte order and float conversions                                         */
/* ------------------------------------------------------------------------ */

static uint16_t load_u16le(const uint8_t *p)
{
    return (uint16_t)((uint16_t)p[0] | (uint16_t)((uint16_t)p[1] << 8));
}

static uint32_t load_u32le(const uint8_t *p)
{
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

static uint64_t load_u64le(const uint8_t *p)
{
    return (uint64_t)load_u32le(p) | ((uint64_t)load_u32le(p + 4) << 32);
}

static void store_u64le(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static float bits_to_float(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
}

/* IEEE 754 binary16 to binary32; exact for every input, NaN payloads kept. */
static float half_to_float(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x3ffu;
    if (exp == 0) {
        /* Zero or subnormal: mant * 2^-24, exact in binary32. */
        uint32_t mag;
        float f = (float)mant * 5.9604644775390625e-8f;
        memcpy(&mag, &f, sizeof(mag));
        return bits_to_float(sign | mag);
    }
    if (exp == 31)
        return bits_to_float(sign | 0x7f800000u | (mant << 13));
    return bits_to_float(sign | ((exp + 112u) << 23) | (mant << 13));
}

/* bfloat16 is the upper half of a binary32. */
static float bf16_to_float(uint16_t h)
{
    return bits_to_float((uint32_t)h << 16);
}

/* binary64 to binary32 with IEEE round-to-nearest; values beyond the float
 * range become infinities, as the IEEE conversion defines. */
static float f64_to_float(uint64_t u)
{
    double d;
    memcpy(&d, &u, sizeof(d));
    return (float)d;
}

/* ------------------------------------------------------------------------ */
/* Encoding                                                                 */
/* ------------------------------------------------------------------------ */

/* Returns 1 when s is well-formed UTF-8 (RFC 3629: no overlong forms, no
 * surrogates, nothing above U+10FFFF), else 0. */
static int utf8_valid(const char *s)
{
    const unsigned char *p = (const unsigned char *)s;
    while (*p != 0) {
        unsigned c = *p;
        size_t n;
        uint32_t cp, min;
        if (c < 0x80) {
            p++;
            continue;
        } else if ((c & 0xe0) == 0xc0) {
            n = 1;
            cp = c & 0x1f;
            min = 0x80;
        } else if ((c & 0xf0) == 0xe0) {
            n = 2;
            cp = c & 0x0f;
            min = 0x800;
        } else if ((c & 0xf8) == 0xf0) {
            n = 3;
            cp = c & 0x07;
            min = 0x10000;
        } else {
            return 0;
        }
        for (size_t i = 1; i <= n; i++) {
            if ((p[i] & 0xc0) != 0x80)
                return 0;
            cp = (cp << 6) | (p[i] & 0x3fu);
        }
        if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
            return 0;
        p += n + 1;
    }
    return 1;
}

/* Adds key -> value (a new reference, stolen even on failure) to obj. */
static int obj_put(json_t *obj, const char *key, json_t *value)
{
    if (value == NULL)
        return STRATA_ENOMEM;
    return json_object_set_new_nocheck(obj, key, value) == 0 ? STRATA_OK : STRATA_ENOMEM;
}

/* Appends value (a new reference, stolen even on failure) to arr. */
static int arr_put(json_t *arr, json_t *value)
{
    if (value == NULL)
        return STRATA_ENOMEM;
    return json_array_append_new(arr, value) == 0 ? STRATA_OK : STRATA_ENOMEM;
}

/* Builds the header object for t and meta; *data_bytes receives the size of
 * the data buffer. */
static int build_header(const strata_tensor_list *t, const strata_metadata *meta, json_t **out,
                        size_t *data_bytes)
{
    int rc = STRATA_OK;
    *out = NULL;
    *data_bytes = 0;
    json_t *root = json_object();
    if (root == NULL)
        return STRATA_ENOMEM;
    if (meta != NULL && meta->count > 0) {
        json_t *mo = json_object();
        rc = obj_put(root, META_KEY, mo);
        if (rc < 0)
            goto out;
        for (size_t i = 0; i < meta->count; i++) {
            const strata_metadata_entry *e = &meta->items[i];
            if (e->key == NULL || e->value == NULL || !utf8_valid(e->key) ||
                !utf8_valid(e->value)) {
                rc = STRATA_EINVAL;
                goto out;
            }
            rc = obj_put(mo, e->key, json_string_nocheck(e->value));
            if (rc < 0)
                goto out;
        }
    }
    uint64_t offset = 0;
    for (size_t i = 0; i < t->count; i++) {
        const strata_tensor *x = &t->items[i];
        size_t numel;
        if (x->name == NULL || x->name[0] == '\0' || strcmp(x->name, META_KEY) == 0 ||
            !utf8_valid(x->name) || json_object_get(root, x->name) != NULL || x->data == NULL ||
            strata_shape_numel(x->ndim, x->shape, &numel) < 0 || numel != x->numel) {
            rc = STRATA_EINVAL;
            goto out;
        }
        uint64_t bytes = (uint64_t)numel * sizeof(float);
        if (bytes > (uint64_t)LLONG_MAX - offset || bytes > (uint64_t)SIZE_MAX - offset) {
            rc = STRATA_ETOOBIG;
            goto out;
        }
        json_t *info = json_object();
        rc = obj_put(root, x->name, info);
        if (rc < 0)
            goto out;
        /* Each put hands its value to the container; later puts fill it in. */
        json_t *shape = json_array(), *offs = json_array();
        if ((rc = obj_put(info, "dtype", json_string_nocheck("F32"))) < 0) {
            json_decref(shape);
            json_decref(offs);
            goto out;
        }
        if ((rc = obj_put(info, "shape", shape)) < 0) {
            json_decref(offs);
            goto out;
        }
        if ((rc = obj_put(info, "data_offsets", offs)) < 0)
            goto out;
        for (int d = 0; d < x->ndim; d++)
            if ((rc = arr_put(shape, json_integer((json_int_t)x->shape[d]))) < 0)
                goto out;
        if ((rc = arr_put(offs, json_integer((json_int_t)offset))) < 0 ||
            (rc = arr_put(offs, json_integer((json_int_t)(offset + bytes)))) < 0)
            goto out;
        offset += bytes;
    }
    *out = root;
    *data_bytes = (size_t)offset;
    root = NULL;
out:
    json_decref(root);
    return rc;
}

/* Copies n floats to dst as little-endian binary32. */
static void store_floats_le(uint8_t *dst, const float *src, size_t n)
{
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    memcpy(dst, src, n * sizeof(float));
#else
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &src[i], sizeof(u));
        for (int b = 0; b < 4; b++)
            dst[4 * i + (size_t)b] = (uint8_t)(u >> (8 * b));
    }
#endif
}

int strata_safetensors_encode(const strata_tensor_list *t, const strata_metadata *meta,
                              uint8_t **buf, size_t *len)
{
    int rc;
    json_t *root = NULL;
    char *header = NULL;
    if (buf != NULL)
        *buf = NULL;
    if (len != NULL)
        *len = 0;
    if (t == NULL || buf == NULL || len == NULL || (t->count > 0 && t->items == NULL))
        return STRATA_EINVAL;

    size_t data_bytes;
    rc = build_header(t, meta, &root, &data_bytes);
    if (rc < 0)
        goto out;
    header = json_dumps(root, JSON_COMPACT);
    if (header == NULL) {
        rc = STRATA_ENOMEM;
        goto out;
    }
    size_t hlen = strlen(header);
    size_t padded = hlen + (8 - hlen % 8) % 8;
    if (padded > STRATA_SAFETENSORS_MAX_HEADER || data_bytes > SIZE_MAX - 8 - padded) {
        rc = STRATA_ETOOBIG;
        goto out;
    }
    size_t total = 8 + padded + data_bytes;
    uint8_t *b = malloc(total);
    if (b == NULL) {
        rc = STRATA_ENOMEM;
        goto out;
    }
    store_u64le(b, (uint64_t)padded);
    memcpy(b + 8, header, hlen);
    memset(b + 8 + hlen, ' ', padded - hlen);
    uint8_t *p = b + 8 + padded;
    for (size_t i = 0; i < t->count; i++) {
        store_floats_le(p, t->items[i].data, t->items[i].numel);
        p += t->items[i].numel * sizeof(float);
    }
    *buf = b;
    *len = total;
    rc = STRATA_OK;
out:
    free(header);
    json_decref(root);
    return rc;
}

/* ------------------------------------------------------------------------ */
/* Decoding                                                                 */
/* ------------------------------------------------------------------------ */

enum { DT_F32, DT_F16, DT_BF16, DT_F64 };

typedef struct dtype_desc {
    const char *name;
    int supported; /* 1 when Strata converts it to float32 */
    size_t size;   /* bytes per element, for supported dtypes */
} dtype_desc;

/* Every dtype the safetensors format defines; the first four are read. */
static const dtype_desc DTYPES[] = {
    [DT_F32] = {"F32", 1, 4},
    [DT_F16] = {"F16", 1, 2},
    [DT_BF16] = {"BF16", 1, 2},
    [DT_F64] = {"F64", 1, 8},
    {"BOOL", 0, 0},
    {"U8", 0, 0},
    {"I8", 0, 0},
    {"I16", 0, 0},
    {"U16", 0, 0},
    {"I32", 0, 0},
    {"U32", 0, 0},
    {"I64", 0, 0},
    {"U64", 0, 0},
    {"F8_E5M2", 0, 0},
    {"F8_E4M3", 0, 0},
    {"F8_E8M0", 0, 0},
    {"F4", 0, 0},
    {"F6_E2M3", 0, 0},
    {"F6_E3M2", 0, 0},
    {"C64", 0, 0},
};

/* One tensor entry of a parsed header. */
typedef struct tensor_info {
    const char *name; /* borrowed from the JSON header */
    int dtype;        /* index into DTYPES */
    int ndim;
    int64_t shape[STRATA_MAX_DIMS];
    size_t numel;
    uint64_t begin, end; /* relative to the data buffer */
    size_t index;        /* position in the header, for a total order */
} tensor_info;

static int parse_metadata(const json_t *v, strata_metadata *m, strata_diag *diag)
{
    if (!json_is_object(v))
        return strata_diag_set(diag, STRATA_EPROTO, "\"%s\" must be an object of strings",
                               META_KEY);
    const char *key;
    json_t *val;
    json_object_foreach((json_t *)v, key, val)
    {
        if (!json_is_string(val))
            return strata_diag_set(diag, STRATA_EPROTO,
                                   "\"%s\" entry \"" NAME_QUOTE "\" must be a string", META_KEY,
                                   key);
        int rc = strata_metadata_set(m, key, json_string_value(val));
        if (rc == STRATA_ETOOBIG)
            return strata_diag_set(diag, STRATA_EPROTO, "\"%s\" has more than %d entries", META_KEY,
                                   STRATA_METADATA_MAX_ENTRIES);
        if (rc < 0)
            return strata_diag_set(diag, rc, "\"%s\": %s", META_KEY, strata_strerror(rc));
    }
    return STRATA_OK;
}

/* Reads a non-negative JSON integer. */
static int get_u64(const json_t *v, uint64_t *out)
{
    if (!json_is_integer(v) || json_integer_value(v) < 0)
        return -1;
    *out = (uint64_t)json_integer_value(v);
    return 0;
}

static int parse_dtype(const char *name, const json_t *v, tensor_info *ti, strata_diag *diag)
{
    if (v == NULL)
        return strata_diag_set(diag, STRATA_EPROTO, "tensor '" NAME_QUOTE "': missing \"dtype\"",
                               name);
    if (!json_is_string(v))
        return strata_diag_set(diag, STRATA_EPROTO,
                               "tensor '" NAME_QUOTE "': \"dtype\" must be a string", name);
    const char *s = json_string_value(v);
    for (size_t i = 0; i < sizeof(DTYPES) / sizeof(DTYPES[0]); i++) {
        if (strcmp(s, DTYPES[i].name) != 0)
            continue;
        if (!DTYPES[i].supported)
            return strata_diag_set(diag, STRATA_EPROTO,
                                   "tensor '" NAME_QUOTE "': unsupported dtype \"%s\" "
                                   "(Strata reads F32, F16, BF16 and F64)",
                                   name, s);
        ti->dtype = (int)i;
        return STRATA_OK;
    }
    return strata_diag_set(diag, STRATA_EPROTO, "tensor '" NAME_QUOTE "': unknown dtype \"%.32s\"",
                           name, s);
}

static int parse_shape(const char *name, const json_t *v, tensor_info *ti, strata_diag *diag)
{
    if (v == NULL)
        return strata_diag_set(diag, STRATA_EPROTO, "tensor '" NAME_QUOTE "': missing \"shape\"",
                               name);
    if (!json_is_array(v))
        return strata_diag_set(diag, STRATA_EPROTO,
                               "tensor '" NAME_QUOTE "': \"shape\" must be an array", name);
    size_t nd = json_array_size(v);
    if (nd > STRATA_MAX_DIMS)
        return strata_diag_set(diag, STRATA_EPROTO,
                               "tensor '" NAME_QUOTE "': \"shape\" has %zu dimensions, "
                               "at most %d are supported",
                               name, nd, STRATA_MAX_DIMS);
    uint64_t numel = 1;
    for (size_t d = 0; d < nd; d++) {
        const json_t *e = json_array_get(v, d);
        if (!json_is_integer(e))
            return strata_diag_set(diag, STRATA_EPROTO,
                                   "tensor '" NAME_QUOTE "': \"shape\"[%zu] must be an integer",
                                   name, d);
        json_int_t dim = json_integer_value(e);
        if (dim < 0)
            return strata_diag_set(diag, STRATA_EPROTO,
                                   "tensor '" NAME_QUOTE "': \"shape\"[%zu] is negative", name, d);
        if (dim == 0)
            return strata_diag_set(diag, STRATA_EPROTO,
                                   "tensor '" NAME_QUOTE "': \"shape\"[%zu] is 0; tensors with "
                                   "a zero-size dimension are not supported",
                                   name, d);
        if ((uint64_t)dim > UINT64_MAX / numel)
            return strata_diag_set(diag, STRATA_EPROTO,
                                   "tensor '" NAME_QUOTE "': \"shape\" element count overflows",
                                   name);
        numel *= (uint64_t)dim;
        ti->shape[d] = (int64_t)dim;
    }
    if (numel > UINT64_MAX / DTYPES[ti->dtype].size || numel > SIZE_MAX / sizeof(float))
        return strata_diag_set(diag, STRATA_EPROTO,
                               "tensor '" NAME_QUOTE "': \"shape\" byte size overflows", name);
    ti->ndim = (int)nd;
    ti->numel = (size_t)numel;
    return STRATA_OK;
}

static int parse_offsets(const char *name, const json_t *v, tensor_info *ti, uint64_t data_len,
                         strata_diag *diag)
{
    if (v == NULL)
        return strata_diag_set(diag, STRATA_EPROTO,
                               "tensor '" NAME_QUOTE "': missing \"data_offsets\"", name);
    if (!json_is_array(v) || json_array_size(v) != 2)
        return strata_diag_set(diag, STRATA_EPROTO,
                               "tensor '" NAME_QUOTE "': \"data_offsets\" must be an array of "
                               "two integers [begin, end]",
                               name);
    uint64_t b, e;
    if (get_u64(json_array_get(v, 0), &b) < 0 || get_u64(json_array_get(v, 1), &e) < 0)
        return strata_diag_set(diag, STRATA_EPROTO,
                               "tensor '" NAME_QUOTE "': \"data_offsets\" must hold "
                               "non-negative integers",
                               name);
    if (b > e)
        return strata_diag_set(diag, STRATA_EPROTO,
                               "tensor '" NAME_QUOTE "': \"data_offsets\" begin %llu > end %llu",
                               name, (unsigned long long)b, (unsigned long long)e);
    if (e > data_len)
        return strata_diag_set(diag, STRATA_EPROTO,
                               "tensor '" NAME_QUOTE "': \"data_offsets\" [%llu, %llu] extend "
                               "past the %llu-byte data buffer (truncated file?)",
                               name, (unsigned long long)b, (unsigned long long)e,
                               (unsigned long long)data_len);
    uint64_t want = (uint64_t)ti->numel * DTYPES[ti->dtype].size;
    if (e - b != want)
        return strata_diag_set(diag, STRATA_EPROTO,
                               "tensor '" NAME_QUOTE "': \"shape\" and dtype %s need %llu bytes "
                               "but \"data_offsets\" span %llu",
                               name, DTYPES[ti->dtype].name, (unsigned long long)want,
                               (unsigned long long)(e - b));
    ti->begin = b;
    ti->end = e;
    return STRATA_OK;
}

static int parse_tensor(const char *name, const json_t *v, tensor_info *ti, uint64_t data_len,
                        strata_diag *diag)
{
    if (name[0] == '\0')
        return strata_diag_set(diag, STRATA_EPROTO, "a tensor has an empty name");
    if (strlen(name) >= STRATA_MAX_NAME)
        return strata_diag_set(diag, STRATA_EPROTO,
                               "tensor '" NAME_QUOTE "...': name longer than %d bytes", name,
                               STRATA_MAX_NAME - 1);
    if (!json_is_object(v))
        return strata_diag_set(diag, STRATA_EPROTO, "tensor '" NAME_QUOTE "': must be an object",
                               name);
    const char *key;
    json_t *val;
    json_object_foreach((json_t *)v, key, val)
    {
        if (strcmp(key, "dtype") != 0 && strcmp(key, "shape") != 0 &&
            strcmp(key, "data_offsets") != 0)
            return strata_diag_set(diag, STRATA_EPROTO,
                                   "tensor '" NAME_QUOTE "': unexpected field \"%.32s\"", name,
                                   key);
    }
    ti->name = name;
    int rc = parse_dtype(name, json_object_get(v, "dtype"), ti, diag);
    if (rc == 0)
        rc = parse_shape(name, json_object_get(v, "shape"), ti, diag);
    if (rc == 0)
        rc = parse_offsets(name, json_object_get(v, "data_offsets"), ti, data_len, diag);
    return rc;
}

static int cmp_offset(const void *a, const void *b)
{
    const tensor_info *x = a, *y = b;
    if (x->begin != y->begin)
        return x->begin < y->begin ? -1 : 1;
    return x->index < y->index ? -1 : (x->index > y->index);
}

/* Checks that the sorted ranges tile [0, data_len) exactly. */
static int check_coverage(const tensor_info *ti, size_t n, uint64_t data_len, strata_diag *diag)
{
    uint64_t expect = 0;
    for (size_t i = 0; i < n; i++) {
        if (ti[i].begin < expect)
            return strata_diag_set(diag, STRATA_EPROTO,
                                   "tensor '" NAME_QUOTE "': \"data_offsets\" [%llu, %llu] "
                                   "overlap tensor '" NAME_QUOTE "'",
                                   ti[i].name, (unsigned long long)ti[i].begin,
                                   (unsigned long long)ti[i].end, ti[i - 1].name);
        if (ti[i].begin > expect)
            return strata_diag_set(diag, STRATA_EPROTO,
                                   "data buffer bytes [%llu, %llu) before tensor '" NAME_QUOTE
                                   "' belong to no tensor (hole in \"data_offsets\")",
                                   (unsigned long long)expect, (unsigned long long)ti[i].begin,
                                   ti[i].name);
        expect = ti[i].end;
    }
    if (expect != data_len)
        return strata_diag_set(diag, STRATA_EPROTO,
                               "data buffer has %llu trailing bytes after the last tensor",
                               (unsigned long long)(data_len - expect));
    return STRATA_OK;
}

/* Converts ti->numel elements of the tensor's dtype at src to float32. */
static void convert(const tensor_info *ti, const uint8_t *src, float *dst)
{
    size_t n = ti->numel;
    switch (ti->dtype) {
    case DT_F32:
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
        memcpy(dst, src, n * sizeof(float));
#else
        for (size_t i = 0; i < n; i++)
            dst[i] = bits_to_float(load_u32le(src + 4 * i));
#endif
        break;
    case DT_F16:
        for (size_t i = 0; i < n; i++)
            dst[i] = half_to_float(load_u16le(src + 2 * i));
        break;
    case DT_BF16:
        for (size_t i = 0; i < n; i++)
            dst[i] = bf16_to_float(load_u16le(src + 2 * i));
        break;
    case DT_F64:
        for (size_t i = 0; i < n; i++)
            dst[i] = f64_to_float(load_u64le(src + 8 * i));
        break;
    }
}

/* Builds the tensor list from validated entries. The list is filled
 * directly rather than through strata_tensor_list_add, whose duplicate check
 * is quadratic in the tensor count; names are already unique because the
 * header was parsed with JSON_REJECT_DUPLICATES. */
static int build_list(const tensor_info *ti, size_t n, const uint8_t *data, strata_tensor_list *l)
{
    if (n == 0)
        return STRATA_OK;
    l->items = calloc(n, sizeof(*l->items));
    if (l->items == NULL)
        return STRATA_ENOMEM;
    l->cap = n;
    for (size_t i = 0; i < n; i++) {
        strata_tensor *t = &l->items[i];
        t->name = dup_str(ti[i].name);
        t->data = strata_alloc_floats(ti[i].numel);
        if (t->name == NULL || t->data == NULL) {
            free(t->name);
            strata_free_floats(t->data);
            t->name = NULL;
            t->data = NULL;
            return STRATA_ENOMEM;
        }
        t->ndim = ti[i].ndim;
        for (int d = 0; d < ti[i].ndim; d++)
            t->shape[d] = ti[i].shape[d];
        t->numel = ti[i].numel;
        l->count++;
        convert(&ti[i], data + ti[i].begin, t->data);
    }
    return STRATA_OK;
}

int strata_safetensors_decode(const uint8_t *buf, size_t len, strata_tensor_list *out,
                              strata_metadata *meta, strata_diag *diag)
{
    int rc;
    json_t *root = NULL;
    tensor_info *ti = NULL;
    strata_tensor_list list;
    strata_metadata md;
    strata_tensor_list_init(&list);
    strata_metadata_init(&md);
    if (diag != NULL)
        diag->msg[0] = '\0';
    if (out == NULL || (buf == NULL && len > 0))
        return strata_diag_set(diag, STRATA_EINVAL, "decode: NULL argument");

    if (len < 8) {
        rc = strata_diag_set(diag, STRATA_EPROTO,
                             "file is %zu bytes, shorter than the 8-byte header length", len);
        goto out;
    }
    uint64_t hlen = load_u64le(buf);
    if (hlen > (uint64_t)(len - 8)) {
        rc = strata_diag_set(diag, STRATA_EPROTO,
                             "header length %llu exceeds the %zu bytes that follow it",
                             (unsigned long long)hlen, len - 8);
        goto out;
    }
    if (hlen > STRATA_SAFETENSORS_MAX_HEADER) {
        rc = strata_diag_set(diag, STRATA_EPROTO, "header length %llu exceeds the %u-byte limit",
                             (unsigned long long)hlen, STRATA_SAFETENSORS_MAX_HEADER);
        goto out;
    }
    if (hlen == 0 || buf[8] != '{') {
        rc = strata_diag_set(diag, STRATA_EPROTO, "header does not start with '{'");
        goto out;
    }
    json_error_t jerr;
    root = json_loadb((const char *)buf + 8, (size_t)hlen, JSON_REJECT_DUPLICATES, &jerr);
    if (root == NULL) {
        rc = strata_diag_set(diag, STRATA_EPROTO,
                             "header is not valid JSON: %s (line %d, column %d)", jerr.text,
                             jerr.line, jerr.column);
        goto out;
    }
    if (!json_is_object(root)) {
        rc = strata_diag_set(diag, STRATA_EPROTO, "header is not a JSON object");
        goto out;
    }
    const uint8_t *data = buf + 8 + hlen;
    uint64_t data_len = (uint64_t)(len - 8 - (size_t)hlen);

    size_t n = json_object_size(root);
    if (n > 0) {
        ti = calloc(n, sizeof(*ti));
        if (ti == NULL) {
            rc = strata_diag_set(diag, STRATA_ENOMEM, "out of memory");
            goto out;
        }
    }
    size_t count = 0;
    const char *key;
    json_t *val;
    json_object_foreach(root, key, val)
    {
        if (strcmp(key, META_KEY) == 0) {
            rc = parse_metadata(val, &md, diag);
        } else {
            ti[count].index = count;
            rc = parse_tensor(key, val, &ti[count], data_len, diag);
            count++;
        }
        if (rc < 0)
            goto out;
    }
    if (count > 0)
        qsort(ti, count, sizeof(*ti), cmp_offset);
    rc = check_coverage(ti, count, data_len, diag);
    if (rc < 0)
        goto out;
    rc = build_list(ti, count, data, &list);
    if (rc < 0) {
        rc = strata_diag_set(diag, rc, "out of memory");
        goto out;
    }

    strata_tensor_list_cleanup(out);
    *out = list;
    strata_tensor_list_init(&list);
    if (meta != NULL) {
        strata_metadata_cleanup(meta);
        *meta = md;
        strata_metadata_init(&md);
    }
    rc = STRATA_OK;
out:
    strata_tensor_list_cleanup(&list);
    strata_metadata_cleanup(&md);
    free(ti);
    json_decref(root);
    return rc;
}

/* ------------------------------------------------------------------------ */
/* Files                                                                    */
/* ------------------------------------------------------------------------ */

int strata_safetensors_write(const char *path, const strata_tensor_list *t,
                             const strata_metadata *meta, strata_diag *diag)
{
    uint8_t *buf = NULL;
    size_t len = 0;
    if (diag != NULL)
        diag->msg[0] = '\0';
    if (path == NULL || path[0] == '\0' || t == NULL)
        return strata_diag_set(diag, STRATA_EINVAL, "write: NULL or empty argument");
    int rc = strata_safetensors_encode(t, meta, &buf, &len);
    if (rc < 0)
        rc = strata_diag_set(diag, rc, "%s: cannot encode tensors: %s", path, strata_strerror(rc));
    else
        rc = strata_file_write_atomic(path, buf, len, 0666, diag);
    free(buf);
    return rc;
}

int strata_safetensors_read(const char *path, size_t max_bytes, strata_tensor_list *out,
                            strata_metadata *meta, strata_diag *diag)
{
    int rc, fd = -1;
    uint8_t *buf = NULL;
    if (diag != NULL)
        diag->msg[0] = '\0';
    if (path == NULL || out == NULL)
        return strata_diag_set(diag, STRATA_EINVAL, "read: NULL argument");
    uint64_t limit = max_bytes ? (uint64_t)max_bytes : STRATA_SAFETENSORS_DEFAULT_MAX_BYTES;
    if (limit > SIZE_MAX)
        limit = SIZE_MAX;

    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        rc = strata_diag_set(diag, STRATA_EIO, "open %s: %s", path, strerror(errno));
        goto out;
    }
    struct stat st;
    if (fstat(fd, &st) < 0) {
        rc = strata_diag_set(diag, STRATA_EIO, "stat %s: %s", path, strerror(errno));
        goto out;
    }
    if (!S_ISREG(st.st_mode)) {
        rc = strata_diag_set(diag, STRATA_EIO, "%s is not a regular file", path);
        goto out;
    }
    if (st.st_size < 0 || (uint64_t)st.st_size > limit) {
        rc = strata_diag_set(diag, STRATA_ETOOBIG, "%s is %lld bytes, over the %llu-byte limit",
                             path, (long long)st.st_size, (unsigned long long)limit);
        goto out;
    }
    size_t size = (size_t)st.st_size, got = 0;
    buf = malloc(size ? size : 1);
    if (buf == NULL) {
        rc = strata_diag_set(diag, STRATA_ENOMEM, "out of memory reading %s", path);
        goto out;
    }
    while (got < size) {
        ssize_t r = read(fd, buf + got, size - got);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            rc = strata_diag_set(diag, STRATA_EIO, "read %s: %s", path, strerror(errno));
            goto out;
        }
        if (r == 0)
            break;
        got += (size_t)r;
    }
    rc = strata_safetensors_decode(buf, got, out, meta, diag);
out:
    if (fd >= 0)
        close(fd);
    free(buf);
    return rc;
}
