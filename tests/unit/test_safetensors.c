#include "strata/error.h"
#include "strata/rng.h"
#include "strata/safetensors.h"
#include "strata/tensor.h"
#include "test_util.h"

#include <dirent.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Reports the failing case of a table-driven test next to CUnit's line. */
#define CASE_ASSERT(cond, what)                                                                    \
    do {                                                                                           \
        CU_ASSERT(cond);                                                                           \
        if (!(cond))                                                                               \
            fprintf(stderr, "\n  case '%s': %s failed\n", (what), #cond);                          \
    } while (0)

/* ------------------------------------------------------------------------ */
/* Helpers                                                                  */
/* ------------------------------------------------------------------------ */

static void put_u64le(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t get_u64le(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

static uint32_t float_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof(u));
    return u;
}

/* Builds "<u64 len><header><data>"; data may be NULL (zero bytes). */
static uint8_t *make_file(const char *header, size_t hlen, const uint8_t *data, size_t dlen,
                          size_t *len)
{
    *len = 8 + hlen + dlen;
    uint8_t *b = calloc(1, *len);
    CU_ASSERT_PTR_NOT_NULL_FATAL(b);
    put_u64le(b, hlen);
    memcpy(b + 8, header, hlen);
    if (data != NULL)
        memcpy(b + 8 + hlen, data, dlen);
    return b;
}

/* A list and metadata with known contents, to show decode leaves them alone
 * on error. */
static void sentinel_init(strata_tensor_list *l, strata_metadata *m)
{
    static const float v[2] = {1.5f, -2.5f};
    static const int64_t shape[1] = {2};
    strata_tensor_list_init(l);
    strata_metadata_init(m);
    CU_ASSERT_EQUAL_FATAL(strata_tensor_list_add(l, "sentinel", 1, shape, v), STRATA_OK);
    CU_ASSERT_EQUAL_FATAL(strata_metadata_set(m, "sentinel.key", "sentinel.value"), STRATA_OK);
}

static int sentinel_intact(const strata_tensor_list *l, const strata_metadata *m)
{
    return l->count == 1 && strcmp(l->items[0].name, "sentinel") == 0 && l->items[0].ndim == 1 &&
           l->items[0].shape[0] == 2 && l->items[0].data[0] == 1.5f &&
           l->items[0].data[1] == -2.5f && m->count == 1 &&
           strcmp(m->items[0].key, "sentinel.key") == 0 &&
           strcmp(m->items[0].value, "sentinel.value") == 0;
}

/* Decodes bytes that must be rejected with want; checks the diagnostic holds
 * expect (when non-NULL) and the outputs are unchanged. */
static void expect_reject(const char *what, const uint8_t *b, size_t len, int want,
                          const char *expect)
{
    strata_tensor_list l;
    strata_metadata m;
    strata_diag diag = {{0}};
    sentinel_init(&l, &m);
    int rc = strata_safetensors_decode(b, len, &l, &m, &diag);
    CASE_ASSERT(rc == want, what);
    CASE_ASSERT(diag.msg[0] != '\0', what);
    if (expect != NULL) {
        CASE_ASSERT(strstr(diag.msg, expect) != NULL, what);
        if (strstr(diag.msg, expect) == NULL)
            fprintf(stderr, "  diag was: %s\n", diag.msg);
    }
    CASE_ASSERT(sentinel_intact(&l, &m), what);
    strata_tensor_list_cleanup(&l);
    strata_metadata_cleanup(&m);
}

/* Fills a list with the given shapes and random bit patterns (NaNs,
 * infinities and subnormals included, to prove the copy is bit-exact). */
typedef struct shape_spec {
    const char *name;
    int ndim;
    int64_t shape[STRATA_MAX_DIMS];
} shape_spec;

static void fill_list(strata_tensor_list *l, const shape_spec *specs, size_t n, uint64_t seed)
{
    strata_rng rng;
    strata_rng_seed(&rng, seed, 0);
    strata_tensor_list_init(l);
    for (size_t i = 0; i < n; i++) {
        CU_ASSERT_EQUAL_FATAL(
            strata_tensor_list_add(l, specs[i].name, specs[i].ndim, specs[i].shape, NULL),
            STRATA_OK);
        strata_tensor *t = &l->items[l->count - 1];
        for (size_t k = 0; k < t->numel; k++) {
            uint32_t u = (uint32_t)strata_rng_u64(&rng);
            memcpy(&t->data[k], &u, sizeof(u));
        }
    }
}

/* Asserts that a and b hold the same tensors bit for bit, in the same order. */
static void assert_lists_equal(const strata_tensor_list *a, const strata_tensor_list *b)
{
    CU_ASSERT_EQUAL_FATAL(a->count, b->count);
    for (size_t i = 0; i < a->count; i++) {
        const strata_tensor *x = &a->items[i], *y = &b->items[i];
        CU_ASSERT_STRING_EQUAL(x->name, y->name);
        CU_ASSERT_EQUAL_FATAL(x->ndim, y->ndim);
        for (int d = 0; d < x->ndim; d++)
            CU_ASSERT_EQUAL(x->shape[d], y->shape[d]);
        CU_ASSERT_EQUAL_FATAL(x->numel, y->numel);
        CU_ASSERT_EQUAL(memcmp(x->data, y->data, x->numel * sizeof(float)), 0);
    }
}

static void assert_meta_equal(const strata_metadata *a, const strata_metadata *b)
{
    CU_ASSERT_EQUAL_FATAL(a->count, b->count);
    for (size_t i = 0; i < a->count; i++) {
        CU_ASSERT_STRING_EQUAL(a->items[i].key, b->items[i].key);
        CU_ASSERT_STRING_EQUAL(a->items[i].value, b->items[i].value);
    }
}

/* Checks the invariants strata_tensor_list_add would have established. */
static int list_is_valid(const strata_tensor_list *l)
{
    for (size_t i = 0; i < l->count; i++) {
        const strata_tensor *t = &l->items[i];
        size_t numel;
        if (t->name == NULL || t->name[0] == '\0' || strlen(t->name) >= STRATA_MAX_NAME ||
            t->data == NULL || strata_shape_numel(t->ndim, t->shape, &numel) < 0 ||
            numel != t->numel)
            return 0;
        for (size_t j = 0; j < i; j++)
            if (strcmp(l->items[j].name, t->name) == 0)
                return 0;
    }
    return 1;
}

static const shape_spec ROUND_TRIP_SHAPES[] = {
    {"conv1.weight", 4, {8, 1, 5, 5}},
    {"conv1.bias", 1, {8}},
    {"one", 1, {1}},
    {"fc.weight", 2, {10, 7}},
    {"fc.bias", 2, {1, 1}},
    {"cube", 3, {2, 3, 4}},
    {"ones4", 4, {1, 1, 1, 1}},
    {"mixed4", 4, {2, 1, 3, 2}},
    {"scalar", 0, {0}},
    {"\xc3\xbcnicode.\xe2\x82\xac", 1, {3}},
    {"we\"ird\\name/\ttab", 1, {2}},
};

static void fill_meta(strata_metadata *m)
{
    strata_metadata_init(m);
    CU_ASSERT_EQUAL_FATAL(strata_metadata_set(m, "format", "pt"), STRATA_OK);
    CU_ASSERT_EQUAL_FATAL(strata_metadata_set(m, "strata.round", "17"), STRATA_OK);
    CU_ASSERT_EQUAL_FATAL(strata_metadata_set(m, "note", "quote \" back \\ nl \n \xc3\xbc"),
                          STRATA_OK);
    CU_ASSERT_EQUAL_FATAL(strata_metadata_set(m, "empty", ""), STRATA_OK);
}

/* ------------------------------------------------------------------------ */
/* Metadata                                                                 */
/* ------------------------------------------------------------------------ */

static void test_metadata_basics(void)
{
    strata_metadata m;
    strata_metadata_init(&m);
    CU_ASSERT_PTR_NULL(strata_metadata_get(&m, "a"));
    CU_ASSERT_EQUAL(strata_metadata_set(&m, "a", "1"), STRATA_OK);
    CU_ASSERT_EQUAL(strata_metadata_set(&m, "b", "2"), STRATA_OK);
    CU_ASSERT_EQUAL(strata_metadata_set(&m, "a", "3"), STRATA_OK);
    CU_ASSERT_EQUAL(m.count, 2);
    CU_ASSERT_STRING_EQUAL(m.items[0].key, "a");
    CU_ASSERT_STRING_EQUAL(m.items[0].value, "3");
    CU_ASSERT_STRING_EQUAL(m.items[1].key, "b");
    CU_ASSERT_STRING_EQUAL(strata_metadata_get(&m, "b"), "2");
    CU_ASSERT_PTR_NULL(strata_metadata_get(&m, "c"));
    CU_ASSERT_PTR_NULL(strata_metadata_get(NULL, "a"));
    CU_ASSERT_EQUAL(strata_metadata_set(&m, NULL, "x"), STRATA_EINVAL);
    CU_ASSERT_EQUAL(strata_metadata_set(&m, "x", NULL), STRATA_EINVAL);
    CU_ASSERT_EQUAL(strata_metadata_set(NULL, "x", "y"), STRATA_EINVAL);
    CU_ASSERT_EQUAL(m.count, 2);
    strata_metadata_cleanup(&m);
    CU_ASSERT_EQUAL(m.count, 0);
    CU_ASSERT_PTR_NULL(m.items);
    strata_metadata_cleanup(NULL);
}

static void test_metadata_cap(void)
{
    strata_metadata m;
    strata_metadata_init(&m);
    char key[32];
    int ok = 1;
    for (int i = 0; i < STRATA_METADATA_MAX_ENTRIES; i++) {
        snprintf(key, sizeof(key), "k%d", i);
        ok &= strata_metadata_set(&m, key, "v") == STRATA_OK;
    }
    CU_ASSERT(ok);
    CU_ASSERT_EQUAL(m.count, STRATA_METADATA_MAX_ENTRIES);
    CU_ASSERT_EQUAL(strata_metadata_set(&m, "one.more", "v"), STRATA_ETOOBIG);
    CU_ASSERT_EQUAL(m.count, STRATA_METADATA_MAX_ENTRIES);
    /* Replacing an existing key still works at the cap. */
    CU_ASSERT_EQUAL(strata_metadata_set(&m, "k7", "new"), STRATA_OK);
    CU_ASSERT_STRING_EQUAL(strata_metadata_get(&m, "k7"), "new");
    strata_metadata_cleanup(&m);
}

/* ------------------------------------------------------------------------ */
/* Round trips                                                              */
/* ------------------------------------------------------------------------ */

static void test_roundtrip_buffer(void)
{
    strata_tensor_list src, dst;
    strata_metadata meta, got;
    size_t n = sizeof(ROUND_TRIP_SHAPES) / sizeof(ROUND_TRIP_SHAPES[0]);
    fill_list(&src, ROUND_TRIP_SHAPES, n, 1);
    fill_meta(&meta);
    uint8_t *buf;
    size_t len;
    CU_ASSERT_EQUAL_FATAL(strata_safetensors_encode(&src, &meta, &buf, &len), STRATA_OK);
    uint64_t hlen = get_u64le(buf);
    CU_ASSERT_EQUAL(hlen % 8, 0);
    CU_ASSERT_EQUAL(buf[8], '{');
    CU_ASSERT_EQUAL(len, 8 + hlen + strata_tensor_list_numel(&src) * sizeof(float));

    strata_diag diag;
    sentinel_init(&dst, &got);
    CU_ASSERT_EQUAL(strata_safetensors_decode(buf, len, &dst, &got, &diag), STRATA_OK);
    assert_lists_equal(&src, &dst);
    assert_meta_equal(&meta, &got);
    CU_ASSERT(list_is_valid(&dst));
    CU_ASSERT_EQUAL(dst.items[8].ndim, 0);
    CU_ASSERT_EQUAL(dst.items[8].numel, 1);

    /* meta NULL on decode: ignored, tensors still replaced. */
    strata_tensor_list dst2;
    strata_tensor_list_init(&dst2);
    CU_ASSERT_EQUAL(strata_safetensors_decode(buf, len, &dst2, NULL, NULL), STRATA_OK);
    assert_lists_equal(&src, &dst2);
    free(buf);

    /* meta NULL on encode: no __metadata__ in the header, decoded as empty. */
    CU_ASSERT_EQUAL_FATAL(strata_safetensors_encode(&src, NULL, &buf, &len), STRATA_OK);
    hlen = get_u64le(buf);
    char *header = calloc(1, hlen + 1);
    CU_ASSERT_PTR_NOT_NULL_FATAL(header);
    memcpy(header, buf + 8, hlen);
    CU_ASSERT_PTR_NULL(strstr(header, "__metadata__"));
    free(header);
    CU_ASSERT_EQUAL(strata_safetensors_decode(buf, len, &dst, &got, &diag), STRATA_OK);
    CU_ASSERT_EQUAL(got.count, 0);
    assert_lists_equal(&src, &dst);
    free(buf);

    strata_tensor_list_cleanup(&src);
    strata_tensor_list_cleanup(&dst);
    strata_tensor_list_cleanup(&dst2);
    strata_metadata_cleanup(&meta);
    strata_metadata_cleanup(&got);
}

static void test_roundtrip_empty(void)
{
    strata_tensor_list src, dst;
    strata_metadata meta, got;
    strata_tensor_list_init(&src);
    strata_metadata_init(&meta);
    uint8_t *buf;
    size_t len;
    CU_ASSERT_EQUAL_FATAL(strata_safetensors_encode(&src, &meta, &buf, &len), STRATA_OK);
    CU_ASSERT_EQUAL(len, 16);
    CU_ASSERT_EQUAL(memcmp(buf + 8, "{}      ", 8), 0);
    sentinel_init(&dst, &got);
    CU_ASSERT_EQUAL(strata_safetensors_decode(buf, len, &dst, &got, NULL), STRATA_OK);
    CU_ASSERT_EQUAL(dst.count, 0);
    CU_ASSERT_EQUAL(got.count, 0);
    free(buf);
    strata_tensor_list_cleanup(&dst);
    strata_metadata_cleanup(&got);
}

/* Number of entries of a directory, . and .. excluded. */
static int count_entries(const char *dir)
{
    DIR *d = opendir(dir);
    int n = 0;
    if (d == NULL)
        return -1;
    for (struct dirent *e; (e = readdir(d)) != NULL;)
        if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0)
            n++;
    closedir(d);
    return n;
}

static void test_roundtrip_file(void)
{
    strata_tensor_list src, src2, dst;
    strata_metadata meta, got;
    size_t n = sizeof(ROUND_TRIP_SHAPES) / sizeof(ROUND_TRIP_SHAPES[0]);
    fill_list(&src, ROUND_TRIP_SHAPES, n, 2);
    fill_list(&src2, ROUND_TRIP_SHAPES + 3, 3, 3);
    fill_meta(&meta);
    char *dir = strata_test_tmpdir();
    CU_ASSERT_PTR_NOT_NULL_FATAL(dir);
    char path[600], tmp[640], nodir[640];
    snprintf(path, sizeof(path), "%s/model.safetensors", dir);
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    snprintf(nodir, sizeof(nodir), "%s/missing/model.safetensors", dir);
    strata_diag diag;

    CU_ASSERT_EQUAL(strata_safetensors_write(path, &src, &meta, &diag), STRATA_OK);
    CU_ASSERT_NOT_EQUAL(access(path, F_OK), -1);
    CU_ASSERT_EQUAL(access(tmp, F_OK), -1);
    CU_ASSERT_EQUAL(count_entries(dir), 1); /* no temporary file left behind */
    sentinel_init(&dst, &got);
    CU_ASSERT_EQUAL(strata_safetensors_read(path, 0, &dst, &got, &diag), STRATA_OK);
    assert_lists_equal(&src, &dst);
    assert_meta_equal(&meta, &got);

    /* The file holds exactly what encode produces. */
    uint8_t *buf;
    size_t len;
    CU_ASSERT_EQUAL_FATAL(strata_safetensors_encode(&src, &meta, &buf, &len), STRATA_OK);
    FILE *f = fopen(path, "rb");
    CU_ASSERT_PTR_NOT_NULL_FATAL(f);
    uint8_t *disk = malloc(len + 1);
    CU_ASSERT_PTR_NOT_NULL_FATAL(disk);
    CU_ASSERT_EQUAL(fread(disk, 1, len + 1, f), len);
    fclose(f);
    CU_ASSERT_EQUAL(memcmp(disk, buf, len), 0);
    free(disk);

    /* Size limit: len bytes pass, len - 1 is refused, outputs untouched. */
    CU_ASSERT_EQUAL(strata_safetensors_read(path, len, &dst, &got, &diag), STRATA_OK);
    strata_tensor_list_cleanup(&dst);
    strata_metadata_cleanup(&got);
    sentinel_init(&dst, &got);
    CU_ASSERT_EQUAL(strata_safetensors_read(path, len - 1, &dst, &got, &diag), STRATA_ETOOBIG);
    CU_ASSERT(diag.msg[0] != '\0');
    CU_ASSERT(sentinel_intact(&dst, &got));
    free(buf);

    /* Overwriting replaces the whole file; no metadata this time. */
    CU_ASSERT_EQUAL(strata_safetensors_write(path, &src2, NULL, &diag), STRATA_OK);
    CU_ASSERT_EQUAL(access(tmp, F_OK), -1);
    CU_ASSERT_EQUAL(strata_safetensors_read(path, 0, &dst, &got, &diag), STRATA_OK);
    assert_lists_equal(&src2, &dst);
    CU_ASSERT_EQUAL(got.count, 0);

    /* Missing file and missing directory: EIO with a message, nothing left. */
    strata_tensor_list_cleanup(&dst);
    strata_metadata_cleanup(&got);
    sentinel_init(&dst, &got);
    CU_ASSERT_EQUAL(strata_safetensors_read(nodir, 0, &dst, &got, &diag), STRATA_EIO);
    CU_ASSERT(strstr(diag.msg, "missing") != NULL);
    CU_ASSERT(sentinel_intact(&dst, &got));
    CU_ASSERT_EQUAL(strata_safetensors_write(nodir, &src, &meta, &diag), STRATA_EIO);
    CU_ASSERT(diag.msg[0] != '\0');
    CU_ASSERT_EQUAL(strata_safetensors_read(dir, 0, &dst, &got, &diag), STRATA_EIO);
    CU_ASSERT(sentinel_intact(&dst, &got));

    strata_test_rmtree(dir);
    free(dir);
    strata_tensor_list_cleanup(&src);
    strata_tensor_list_cleanup(&src2);
    strata_tensor_list_cleanup(&dst);
    strata_metadata_cleanup(&meta);
    strata_metadata_cleanup(&got);
}

static void test_encode_rejects(void)
{
    static const int64_t shape[1] = {1};
    static const float one = 1.0f;
    uint8_t *buf = (uint8_t *)&buf;
    size_t len = 99;
    strata_tensor_list l;
    strata_metadata m;

    strata_tensor_list_init(&l);
    CU_ASSERT_EQUAL(strata_tensor_list_add(&l, "__metadata__", 1, shape, &one), STRATA_OK);
    CU_ASSERT_EQUAL(strata_safetensors_encode(&l, NULL, &buf, &len), STRATA_EINVAL);
    CU_ASSERT_PTR_NULL(buf);
    CU_ASSERT_EQUAL(len, 0);
    strata_tensor_list_cleanup(&l);

    CU_ASSERT_EQUAL(strata_tensor_list_add(&l, "bad\xff", 1, shape, &one), STRATA_OK);
    CU_ASSERT_EQUAL(strata_safetensors_encode(&l, NULL, &buf, &len), STRATA_EINVAL);
    strata_tensor_list_cleanup(&l);

    CU_ASSERT_EQUAL(strata_tensor_list_add(&l, "ok", 1, shape, &one), STRATA_OK);
    strata_metadata_init(&m);
    CU_ASSERT_EQUAL(strata_metadata_set(&m, "k", "\xc3("), STRATA_OK);
    CU_ASSERT_EQUAL(strata_safetensors_encode(&l, &m, &buf, &len), STRATA_EINVAL);
    CU_ASSERT_EQUAL(strata_safetensors_encode(NULL, &m, &buf, &len), STRATA_EINVAL);
    CU_ASSERT_EQUAL(strata_safetensors_encode(&l, NULL, NULL, &len), STRATA_EINVAL);
    strata_metadata_cleanup(&m);
    strata_tensor_list_cleanup(&l);
}

/* ------------------------------------------------------------------------ */
/* An independent reader, written from the format description only          */
/* ------------------------------------------------------------------------ */

typedef struct ir_tensor {
    char name[160];
    char dtype[16];
    int ndim;
    unsigned long long shape[8];
    int noffs;
    unsigned long long offs[4];
} ir_tensor;

typedef struct ir_meta {
    char key[64];
    char value[128];
} ir_meta;

typedef struct ir_file {
    const char *p, *end;
    size_t ntensors, nmeta;
    ir_tensor tensors[32];
    ir_meta meta[16];
} ir_file;

static void ir_ws(ir_file *s)
{
    while (s->p < s->end && (*s->p == ' ' || *s->p == '\n' || *s->p == '\t' || *s->p == '\r'))
        s->p++;
}

static int ir_eat(ir_file *s, char c)
{
    ir_ws(s);
    if (s->p < s->end && *s->p == c) {
        s->p++;
        return 1;
    }
    return 0;
}

/* A JSON string with the escapes \" \\ \/ \n \t (all this test writes). */
static int ir_string(ir_file *s, char *dst, size_t cap)
{
    size_t n = 0;
    if (!ir_eat(s, '"'))
        return 0;
    while (s->p < s->end && *s->p != '"') {
        char c = *s->p++;
        if (c == '\\') {
            if (s->p == s->end)
                return 0;
            c = *s->p++;
            c = c == 'n' ? '\n' : c == 't' ? '\t' : c;
            if (c != '"' && c != '\\' && c != '/' && c != '\n' && c != '\t')
                return 0;
        }
        if (n + 1 >= cap)
            return 0;
        dst[n++] = c;
    }
    dst[n] = '\0';
    return ir_eat(s, '"');
}

static int ir_uint_array(ir_file *s, unsigned long long *v, int max, int *n)
{
    *n = 0;
    if (!ir_eat(s, '['))
        return 0;
    if (ir_eat(s, ']'))
        return 1;
    do {
        ir_ws(s);
        if (*n >= max || s->p == s->end || *s->p < '0' || *s->p > '9')
            return 0;
        unsigned long long x = 0;
        while (s->p < s->end && *s->p >= '0' && *s->p <= '9')
            x = x * 10 + (unsigned long long)(*s->p++ - '0');
        v[(*n)++] = x;
    } while (ir_eat(s, ','));
    return ir_eat(s, ']');
}

static int ir_tensor_entry(ir_file *s, ir_tensor *t)
{
    char field[32];
    if (!ir_eat(s, '{'))
        return 0;
    do {
        if (!ir_string(s, field, sizeof(field)) || !ir_eat(s, ':'))
            return 0;
        int ok;
        if (strcmp(field, "dtype") == 0)
            ok = ir_string(s, t->dtype, sizeof(t->dtype));
        else if (strcmp(field, "shape") == 0)
            ok = ir_uint_array(s, t->shape, 8, &t->ndim);
        else if (strcmp(field, "data_offsets") == 0)
            ok = ir_uint_array(s, t->offs, 4, &t->noffs);
        else
            ok = 0;
        if (!ok)
            return 0;
    } while (ir_eat(s, ','));
    return ir_eat(s, '}');
}

static int ir_meta_entries(ir_file *s)
{
    if (!ir_eat(s, '{'))
        return 0;
    if (ir_eat(s, '}'))
        return 1;
    do {
        if (s->nmeta >= 16)
            return 0;
        ir_meta *m = &s->meta[s->nmeta++];
        if (!ir_string(s, m->key, sizeof(m->key)) || !ir_eat(s, ':') ||
            !ir_string(s, m->value, sizeof(m->value)))
            return 0;
    } while (ir_eat(s, ','));
    return ir_eat(s, '}');
}

/* Parses the whole header [p, end); returns 1 when it is well formed. */
static int ir_parse(ir_file *s)
{
    char key[160];
    if (!ir_eat(s, '{'))
        return 0;
    if (!ir_eat(s, '}')) {
        do {
            if (!ir_string(s, key, sizeof(key)) || !ir_eat(s, ':'))
                return 0;
            if (strcmp(key, "__metadata__") == 0) {
                if (!ir_meta_entries(s))
                    return 0;
                continue;
            }
            if (s->ntensors >= 32)
                return 0;
            ir_tensor *t = &s->tensors[s->ntensors++];
            memcpy(t->name, key, sizeof(key));
            if (!ir_tensor_entry(s, t))
                return 0;
        } while (ir_eat(s, ','));
        if (!ir_eat(s, '}'))
            return 0;
    }
    while (s->p < s->end && *s->p == ' ')
        s->p++;
    return s->p == s->end;
}

static const shape_spec INDEPENDENT_SHAPES[] = {
    {"layer0.weight", 2, {4, 3}}, {"layer0.bias", 1, {4}},      {"s", 0, {0}},
    {"t4", 4, {2, 1, 2, 3}},      {"odd/name-1", 3, {1, 5, 1}},
};

static void test_independent_reader(void)
{
    strata_tensor_list src;
    strata_metadata meta;
    size_t n = sizeof(INDEPENDENT_SHAPES) / sizeof(INDEPENDENT_SHAPES[0]);
    fill_list(&src, INDEPENDENT_SHAPES, n, 4);
    strata_metadata_init(&meta);
    CU_ASSERT_EQUAL_FATAL(strata_metadata_set(&meta, "format", "pt"), STRATA_OK);
    CU_ASSERT_EQUAL_FATAL(strata_metadata_set(&meta, "path", "a/b \"c\""), STRATA_OK);
    char *dir = strata_test_tmpdir();
    CU_ASSERT_PTR_NOT_NULL_FATAL(dir);
    char path[600];
    snprintf(path, sizeof(path), "%s/indep.safetensors", dir);
    CU_ASSERT_EQUAL_FATAL(strata_safetensors_write(path, &src, &meta, NULL), STRATA_OK);

    FILE *f = fopen(path, "rb");
    CU_ASSERT_PTR_NOT_NULL_FATAL(f);
    static uint8_t file[1 << 16];
    size_t len = fread(file, 1, sizeof(file), f);
    fclose(f);
    CU_ASSERT_FATAL(len >= 8 && len < sizeof(file));

    uint64_t hlen = get_u64le(file);
    CU_ASSERT_FATAL(hlen <= len - 8);
    CU_ASSERT_EQUAL(hlen % 8, 0);
    static ir_file s;
    memset(&s, 0, sizeof(s));
    s.p = (const char *)file + 8;
    s.end = s.p + hlen;
    CU_ASSERT_FATAL(ir_parse(&s));

    CU_ASSERT_EQUAL_FATAL(s.nmeta, 2);
    CU_ASSERT_STRING_EQUAL(s.meta[0].key, "format");
    CU_ASSERT_STRING_EQUAL(s.meta[0].value, "pt");
    CU_ASSERT_STRING_EQUAL(s.meta[1].key, "path");
    CU_ASSERT_STRING_EQUAL(s.meta[1].value, "a/b \"c\"");

    CU_ASSERT_EQUAL_FATAL(s.ntensors, n);
    const uint8_t *data = file + 8 + hlen;
    size_t data_len = len - 8 - hlen, expect_begin = 0;
    for (size_t i = 0; i < n; i++) {
        const ir_tensor *t = &s.tensors[i];
        const strata_tensor *x = &src.items[i];
        CU_ASSERT_STRING_EQUAL(t->name, x->name);
        CU_ASSERT_STRING_EQUAL(t->dtype, "F32");
        CU_ASSERT_EQUAL_FATAL(t->ndim, x->ndim);
        for (int d = 0; d < t->ndim; d++)
            CU_ASSERT_EQUAL(t->shape[d], (unsigned long long)x->shape[d]);
        CU_ASSERT_EQUAL_FATAL(t->noffs, 2);
        CU_ASSERT_EQUAL(t->offs[0], expect_begin);
        CU_ASSERT_EQUAL_FATAL(t->offs[1], expect_begin + 4 * x->numel);
        CU_ASSERT_FATAL(t->offs[1] <= data_len);
        for (size_t k = 0; k < x->numel; k++) {
            const uint8_t *b = data + t->offs[0] + 4 * k;
            uint32_t le =
                (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
            CU_ASSERT_EQUAL(le, float_bits(x->data[k]));
        }
        expect_begin = t->offs[1];
    }
    CU_ASSERT_EQUAL(expect_begin, data_len);

    strata_test_rmtree(dir);
    free(dir);
    strata_tensor_list_cleanup(&src);
    strata_metadata_cleanup(&meta);
}

/* ------------------------------------------------------------------------ */
/* Malformed input                                                          */
/* ------------------------------------------------------------------------ */

#define F32_1 "{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}"

typedef struct bad_header {
    const char *what;
    const char *header; /* the JSON header; data_len zero bytes follow */
    size_t data_len;
    const char *expect; /* a substring of the diagnostic */
} bad_header;

static const bad_header BAD_HEADERS[] = {
    {"not JSON", "{\"w\":", 0, "not valid JSON"},
    {"empty header", "", 0, "does not start with '{'"},
    {"array header", "[]", 0, "does not start with '{'"},
    {"string header", "\"w\"", 0, "does not start with '{'"},
    {"leading space", " {}", 0, "does not start with '{'"},
    {"trailing garbage", "{} x", 0, "not valid JSON"},
    {"two objects", "{}{}", 0, "not valid JSON"},
    {"duplicate tensor", "{\"w\":" F32_1 ",\"w\":" F32_1 "}", 4, "duplicate"},
    {"duplicate metadata", "{\"__metadata__\":{},\"__metadata__\":{}}", 0, "duplicate"},
    {"duplicate metadata key", "{\"__metadata__\":{\"k\":\"a\",\"k\":\"b\"}}", 0, "duplicate"},
    {"invalid UTF-8", "{\"w\xff\":" F32_1 "}", 4, "not valid JSON"},
    {"escaped NUL in name", "{\"a\\u0000b\":" F32_1 "}", 4, "not valid JSON"},
    {"integer too big",
     "{\"w\":{\"dtype\":\"F32\",\"shape\":[100000000000000000000],"
     "\"data_offsets\":[0,4]}}",
     4, "not valid JSON"},
    {"tensor not object", "{\"w\":1}", 0, "'w': must be an object"},
    {"tensor is array", "{\"w\":[]}", 0, "'w': must be an object"},
    {"empty name", "{\"\":" F32_1 "}", 4, "empty name"},
    {"unexpected field", "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4],\"x\":1}}",
     4, "'w': unexpected field \"x\""},
    {"missing dtype", "{\"w\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
     "'w': missing \"dtype\""},
    {"dtype number", "{\"w\":{\"dtype\":4,\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
     "'w': \"dtype\" must be a string"},
    {"dtype null", "{\"w\":{\"dtype\":null,\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
     "'w': \"dtype\" must be a string"},
    {"unknown dtype", "{\"w\":{\"dtype\":\"F33\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
     "'w': unknown dtype \"F33\""},
    {"lower-case dtype", "{\"w\":{\"dtype\":\"f32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
     "unknown dtype"},
    {"unsupported I64", "{\"w\":{\"dtype\":\"I64\",\"shape\":[1],\"data_offsets\":[0,8]}}", 8,
     "'w': unsupported dtype \"I64\""},
    {"unsupported BOOL", "{\"w\":{\"dtype\":\"BOOL\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1,
     "unsupported dtype \"BOOL\""},
    {"unsupported U8", "{\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1,
     "unsupported dtype \"U8\""},
    {"missing shape", "{\"w\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", 4,
     "'w': missing \"shape\""},
    {"shape not array", "{\"w\":{\"dtype\":\"F32\",\"shape\":4,\"data_offsets\":[0,4]}}", 4,
     "'w': \"shape\" must be an array"},
    {"shape real", "{\"w\":{\"dtype\":\"F32\",\"shape\":[1.0],\"data_offsets\":[0,4]}}", 4,
     "'w': \"shape\"[0] must be an integer"},
    {"shape string", "{\"w\":{\"dtype\":\"F32\",\"shape\":[\"1\"],\"data_offsets\":[0,4]}}", 4,
     "\"shape\"[0] must be an integer"},
    {"shape negative", "{\"w\":{\"dtype\":\"F32\",\"shape\":[1,-1],\"data_offsets\":[0,4]}}", 4,
     "'w': \"shape\"[1] is negative"},
    {"shape zero", "{\"w\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]}}", 0,
     "'w': \"shape\"[0] is 0"},
    {"shape 5 dims", "{\"w\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1],\"data_offsets\":[0,4]}}", 4,
     "'w': \"shape\" has 5 dimensions"},
    {"shape count overflow",
     "{\"w\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,4294967296],"
     "\"data_offsets\":[0,4]}}",
     4, "'w': \"shape\" element count overflows"},
    {"shape byte overflow",
     "{\"w\":{\"dtype\":\"F64\",\"shape\":[4611686018427387904],\"data_offsets\":[0,4]}}", 4,
     "'w': \"shape\" byte size overflows"},
    {"shape wraps to small",
     "{\"w\":{\"dtype\":\"F32\",\"shape\":[4611686018427387905],\"data_offsets\":[0,4]}}", 4,
     "'w': \"shape\" byte size overflows"},
    {"missing offsets", "{\"w\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4,
     "'w': missing \"data_offsets\""},
    {"offsets not array", "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":0}}", 4,
     "'w': \"data_offsets\" must be an array"},
    {"offsets one", "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4]}}", 4,
     "'w': \"data_offsets\" must be an array"},
    {"offsets three", "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4,4]}}", 4,
     "'w': \"data_offsets\" must be an array"},
    {"offsets strings", "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[\"0\",\"4\"]}}",
     4, "'w': \"data_offsets\" must hold non-negative integers"},
    {"offsets real", "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0.0,4.0]}}", 4,
     "non-negative integers"},
    {"offsets negative", "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[-4,0]}}", 4,
     "non-negative integers"},
    {"begin > end", "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,0]}}", 4,
     "'w': \"data_offsets\" begin 4 > end 0"},
    {"end out of range", "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[400,404]}}", 4,
     "'w': \"data_offsets\" [400, 404] extend past the 4-byte data buffer"},
    {"truncated data", "{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 7,
     "'w': \"data_offsets\" [0, 8] extend past the 7-byte"},
    {"size mismatch", "{\"w\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8,
     "'w': \"shape\" and dtype F32 need 12 bytes but \"data_offsets\" span 8"},
    {"size mismatch F16", "{\"w\":{\"dtype\":\"F16\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8,
     "dtype F16 need 4 bytes"},
    {"overlap",
     "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
     "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
     12, "'b': \"data_offsets\" [4, 12] overlap tensor 'a'"},
    {"same range",
     "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
     "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}",
     8, "overlap tensor 'a'"},
    {"hole",
     "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
     "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}",
     12, "bytes [4, 8) before tensor 'b' belong to no tensor"},
    {"hole at start", "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8,
     "bytes [0, 4) before tensor 'w'"},
    {"trailing bytes", "{\"w\":" F32_1 "}", 8, "4 trailing bytes"},
    {"data without tensors", "{}", 4, "4 trailing bytes"},
    {"metadata array", "{\"__metadata__\":[]}", 0, "\"__metadata__\" must be an object"},
    {"metadata string", "{\"__metadata__\":\"x\"}", 0, "\"__metadata__\" must be an object"},
    {"metadata number value", "{\"__metadata__\":{\"k\":1}}", 0,
     "\"__metadata__\" entry \"k\" must be a string"},
    {"metadata object value", "{\"__metadata__\":{\"k\":{}}}", 0, "entry \"k\" must be a string"},
    {"metadata null value", "{\"__metadata__\":{\"k\":null}}", 0, "entry \"k\" must be a string"},
};

static void test_malformed_headers(void)
{
    size_t n = sizeof(BAD_HEADERS) / sizeof(BAD_HEADERS[0]);
    static const uint8_t zeros[64];
    for (size_t i = 0; i < n; i++) {
        const bad_header *c = &BAD_HEADERS[i];
        CU_ASSERT_FATAL(c->data_len <= sizeof(zeros));
        size_t len;
        uint8_t *b = make_file(c->header, strlen(c->header), zeros, c->data_len, &len);
        expect_reject(c->what, b, len, STRATA_EPROTO, c->expect);
        free(b);
    }
}

typedef struct bad_raw {
    const char *what;
    uint64_t hlen;    /* written as the first 8 bytes, when len >= 8 */
    size_t len;       /* total bytes */
    const char *tail; /* bytes after the length field (NUL-padded to len) */
    size_t tail_len;
    const char *expect;
} bad_raw;

static const bad_raw BAD_RAW[] = {
    {"empty file", 0, 0, NULL, 0, "0 bytes, shorter than"},
    {"7 bytes", 0, 7, NULL, 0, "7 bytes, shorter than"},
    {"length beyond file", 100, 18, "{}", 2, "header length 100 exceeds the 10 bytes"},
    {"length off by one", 3, 10, "{}", 2, "header length 3 exceeds the 2 bytes"},
    {"length UINT64_MAX", UINT64_MAX, 16, "{}      ", 8, "exceeds"},
    {"length 2^63", (uint64_t)1 << 63, 16, "{}      ", 8, "exceeds"},
    {"zero length", 0, 8, NULL, 0, "does not start with '{'"},
    {"NUL in header", 4, 12, "{\0\"}", 4, "not valid JSON"},
};

static void test_malformed_raw(void)
{
    size_t n = sizeof(BAD_RAW) / sizeof(BAD_RAW[0]);
    for (size_t i = 0; i < n; i++) {
        const bad_raw *c = &BAD_RAW[i];
        uint8_t *b = calloc(1, c->len + 1);
        CU_ASSERT_PTR_NOT_NULL_FATAL(b);
        if (c->len >= 8)
            put_u64le(b, c->hlen);
        if (c->tail != NULL)
            memcpy(b + 8, c->tail, c->tail_len);
        expect_reject(c->what, b, c->len, STRATA_EPROTO, c->expect);
        free(b);
    }

    /* A raw NUL byte inside a tensor name. */
    static const char nul_name[] = "{\"a\0\":" F32_1 "}";
    static const uint8_t zeros[4];
    size_t len;
    uint8_t *b = make_file(nul_name, sizeof(nul_name) - 1, zeros, 4, &len);
    expect_reject("NUL in name", b, len, STRATA_EPROTO, "not valid JSON");
    free(b);
}

static void test_malformed_long_name(void)
{
    char header[512];
    char name[STRATA_MAX_NAME + 1];
    memset(name, 'n', sizeof(name) - 1);
    name[STRATA_MAX_NAME] = '\0';
    snprintf(header, sizeof(header), "{\"%s\":" F32_1 "}", name);
    static const uint8_t zeros[4];
    size_t len;
    uint8_t *b = make_file(header, strlen(header), zeros, 4, &len);
    expect_reject("long name", b, len, STRATA_EPROTO, "name longer than 127 bytes");
    free(b);

    /* 127 bytes is the longest accepted name. */
    name[STRATA_MAX_NAME - 1] = '\0';
    snprintf(header, sizeof(header), "{\"%s\":" F32_1 "}", name);
    b = make_file(header, strlen(header), zeros, 4, &len);
    strata_tensor_list l;
    strata_tensor_list_init(&l);
    CU_ASSERT_EQUAL(strata_safetensors_decode(b, len, &l, NULL, NULL), STRATA_OK);
    CU_ASSERT_EQUAL(l.count, 1);
    strata_tensor_list_cleanup(&l);
    free(b);
}

/* Limits that need big inputs: a header length over the cap (the bytes
 * exist but are never parsed) and too many metadata entries. */
static void test_malformed_limits(void)
{
    size_t len = 8 + (size_t)STRATA_SAFETENSORS_MAX_HEADER + 1;
    uint8_t *b = calloc(1, len);
    CU_ASSERT_PTR_NOT_NULL_FATAL(b);
    put_u64le(b, (uint64_t)STRATA_SAFETENSORS_MAX_HEADER + 1);
    b[8] = '{';
    expect_reject("header over the cap", b, len, STRATA_EPROTO, "100000000-byte limit");
    free(b);

    size_t cap = 64 + 16 * (STRATA_METADATA_MAX_ENTRIES + 1);
    char *header = malloc(cap);
    CU_ASSERT_PTR_NOT_NULL_FATAL(header);
    size_t off = (size_t)snprintf(header, cap, "{\"__metadata__\":{");
    for (int i = 0; i <= STRATA_METADATA_MAX_ENTRIES; i++)
        off += (size_t)snprintf(header + off, cap - off, "%s\"k%d\":\"v\"", i ? "," : "", i);
    off += (size_t)snprintf(header + off, cap - off, "}}");
    CU_ASSERT_FATAL(off < cap);
    b = make_file(header, off, NULL, 0, &len);
    expect_reject("too many metadata entries", b, len, STRATA_EPROTO, "more than 4096 entries");
    free(b);
    free(header);
}

static void test_null_arguments(void)
{
    strata_tensor_list l;
    strata_diag diag;
    strata_tensor_list_init(&l);
    CU_ASSERT_EQUAL(strata_safetensors_decode(NULL, 4, &l, NULL, &diag), STRATA_EINVAL);
    CU_ASSERT_EQUAL(strata_safetensors_decode((const uint8_t *)"x", 1, NULL, NULL, &diag),
                    STRATA_EINVAL);
    CU_ASSERT_EQUAL(strata_safetensors_decode(NULL, 0, &l, NULL, &diag), STRATA_EPROTO);
    CU_ASSERT_EQUAL(strata_safetensors_write(NULL, &l, NULL, &diag), STRATA_EINVAL);
    CU_ASSERT_EQUAL(strata_safetensors_read(NULL, 0, &l, NULL, &diag), STRATA_EINVAL);
}

/* A small valid file: two tensors and metadata. */
static uint8_t *small_file(size_t *len, strata_tensor_list *src)
{
    static const shape_spec specs[] = {{"w", 2, {2, 2}}, {"b", 1, {2}}};
    fill_list(src, specs, 2, 5);
    strata_metadata m;
    strata_metadata_init(&m);
    CU_ASSERT_EQUAL_FATAL(strata_metadata_set(&m, "k", "v"), STRATA_OK);
    uint8_t *buf;
    CU_ASSERT_EQUAL_FATAL(strata_safetensors_encode(src, &m, &buf, len), STRATA_OK);
    strata_metadata_cleanup(&m);
    return buf;
}

static void test_every_truncation(void)
{
    strata_tensor_list src;
    size_t len;
    uint8_t *buf = small_file(&len, &src);
    size_t rejected = 0, intact = 0, with_msg = 0;
    for (size_t cut = 0; cut < len; cut++) {
        /* A fresh copy so ASan sees any read past the cut. */
        uint8_t *b = malloc(cut ? cut : 1);
        CU_ASSERT_PTR_NOT_NULL_FATAL(b);
        memcpy(b, buf, cut);
        strata_tensor_list l;
        strata_metadata m;
        strata_diag diag = {{0}};
        sentinel_init(&l, &m);
        int rc = strata_safetensors_decode(b, cut, &l, &m, &diag);
        rejected += rc == STRATA_EPROTO;
        with_msg += diag.msg[0] != '\0';
        intact += sentinel_intact(&l, &m);
        strata_tensor_list_cleanup(&l);
        strata_metadata_cleanup(&m);
        free(b);
    }
    CU_ASSERT_EQUAL(rejected, len);
    CU_ASSERT_EQUAL(with_msg, len);
    CU_ASSERT_EQUAL(intact, len);
    free(buf);
    strata_tensor_list_cleanup(&src);
}

/* Every bit flip and a set of byte substitutions over the length field and
 * the header: each must be rejected or decode to a valid list that encodes
 * and decodes again to the same tensors. */
static void test_every_header_byte_flip(void)
{
    static const uint8_t subst[] = {'"', '{', '}', '[', ']',  ',',  ':',  '0', '9',
                                    '-', ' ', '.', 'e', '\\', 0x00, 0x7f, 0xff};
    strata_tensor_list src;
    size_t len;
    uint8_t *buf = small_file(&len, &src);
    size_t hend = 8 + (size_t)get_u64le(buf);
    size_t tried = 0, accepted = 0, accepted_ok = 0, rejected_ok = 0;
    uint8_t *b = malloc(len);
    CU_ASSERT_PTR_NOT_NULL_FATAL(b);
    for (size_t pos = 0; pos < hend; pos++) {
        for (size_t v = 0; v < 8 + sizeof(subst); v++) {
            memcpy(b, buf, len);
            uint8_t nb = v < 8 ? (uint8_t)(buf[pos] ^ (1u << v)) : subst[v - 8];
            if (nb == buf[pos])
                continue;
            b[pos] = nb;
            tried++;
            strata_tensor_list l;
            strata_metadata m;
            strata_diag diag = {{0}};
            sentinel_init(&l, &m);
            int rc = strata_safetensors_decode(b, len, &l, &m, &diag);
            if (rc < 0) {
                rejected_ok += diag.msg[0] != '\0' && sentinel_intact(&l, &m);
            } else {
                accepted++;
                uint8_t *re;
                size_t relen;
                strata_tensor_list again;
                strata_tensor_list_init(&again);
                int ok = list_is_valid(&l) &&
                         strata_safetensors_encode(&l, &m, &re, &relen) == STRATA_OK;
                if (ok) {
                    ok = strata_safetensors_decode(re, relen, &again, NULL, NULL) == STRATA_OK &&
                         strata_tensor_list_same_layout(&l, &again);
                    for (size_t i = 0; ok && i < l.count; i++)
                        ok = memcmp(l.items[i].data, again.items[i].data,
                                    l.items[i].numel * sizeof(float)) == 0;
                    free(re);
                }
                accepted_ok += ok;
                strata_tensor_list_cleanup(&again);
            }
            strata_tensor_list_cleanup(&l);
            strata_metadata_cleanup(&m);
        }
    }
    CU_ASSERT(tried > 1000);
    CU_ASSERT(accepted > 0); /* e.g. a changed letter in a name */
    CU_ASSERT(accepted < tried / 2);
    CU_ASSERT_EQUAL(accepted_ok, accepted);
    CU_ASSERT_EQUAL(rejected_ok, tried - accepted);
    free(b);
    free(buf);
    strata_tensor_list_cleanup(&src);
}

/* ------------------------------------------------------------------------ */
/* Dtype conversion                                                         */
/* ------------------------------------------------------------------------ */

typedef struct half_case {
    uint16_t in;
    uint32_t out; /* binary32 bits */
} half_case;

static const half_case F16_CASES[] = {
    {0x0000, 0x00000000}, /* +0 */
    {0x8000, 0x80000000}, /* -0 */
    {0x3c00, 0x3f800000}, /* 1 */
    {0xc000, 0xc0000000}, /* -2 */
    {0x3800, 0x3f000000}, /* 0.5 */
    {0x7bff, 0x477fe000}, /* 65504, largest finite */
    {0x0001, 0x33800000}, /* 2^-24, smallest subnormal */
    {0x8001, 0xb3800000}, /* -2^-24 */
    {0x03ff, 0x387fc000}, /* largest subnormal */
    {0x0400, 0x38800000}, /* 2^-14, smallest normal */
    {0x3555, 0x3eaaa000}, /* 0.333251953125 */
    {0x7c00, 0x7f800000}, /* +inf */
    {0xfc00, 0xff800000}, /* -inf */
    {0x7e00, 0x7fc00000}, /* quiet NaN */
    {0x7c01, 0x7f802000}, /* signalling NaN payload kept */
};

static const half_case BF16_CASES[] = {
    {0x3f80, 0x3f800000}, {0xc049, 0xc0490000}, {0x0001, 0x00010000}, {0x8000, 0x80000000},
    {0x7f80, 0x7f800000}, {0xff80, 0xff800000}, {0xffc1, 0xffc10000}, {0x7f7f, 0x7f7f0000},
};

typedef struct f64_case {
    double in;
    uint32_t out;
} f64_case;

static const f64_case F64_CASES[] = {
    {1.0, 0x3f800000},
    {-2.5, 0xc0200000},
    {3.141592653589793, 0x40490fdb},
    {1e-50, 0x00000000},          /* underflows to +0 */
    {-1e-50, 0x80000000},         /* to -0 */
    {1e300, 0x7f800000},          /* overflows to +inf */
    {-1e300, 0xff800000},         /* to -inf */
    {0x1p-149, 0x00000001},       /* smallest subnormal */
    {0x1.fffffep127, 0x7f7fffff}, /* FLT_MAX */
    {0x1.000001p0, 0x3f800000},   /* 1 + 2^-24: tie, to even */
    {0x1.000003p0, 0x3f800002},   /* 1 + 3 * 2^-24: tie, to even */
    {65504.0, 0x477fe000},
};

/* Builds a file with an F16, a BF16 and an F64 tensor, listed in the header
 * in an order different from their data offsets. */
static void test_dtype_conversion(void)
{
    size_t nh = sizeof(F16_CASES) / sizeof(F16_CASES[0]);
    size_t nb = sizeof(BF16_CASES) / sizeof(BF16_CASES[0]);
    size_t nd = sizeof(F64_CASES) / sizeof(F64_CASES[0]);
    uint8_t data[1024];
    size_t off = 0;
    for (size_t i = 0; i < nd; i++) {
        uint64_t u;
        memcpy(&u, &F64_CASES[i].in, sizeof(u));
        put_u64le(data + off, u);
        off += 8;
    }
    size_t f16_begin = off;
    for (size_t i = 0; i < nh; i++) {
        data[off++] = (uint8_t)F16_CASES[i].in;
        data[off++] = (uint8_t)(F16_CASES[i].in >> 8);
    }
    size_t bf16_begin = off;
    for (size_t i = 0; i < nb; i++) {
        data[off++] = (uint8_t)BF16_CASES[i].in;
        data[off++] = (uint8_t)(BF16_CASES[i].in >> 8);
    }
    char header[512];
    snprintf(header, sizeof(header),
             "{\"__metadata__\":{\"format\":\"pt\"},"
             "\"half\":{\"dtype\":\"F16\",\"shape\":[%zu],\"data_offsets\":[%zu,%zu]},"
             "\"brain\":{\"dtype\":\"BF16\",\"shape\":[%zu,1],\"data_offsets\":[%zu,%zu]},"
             "\"double\":{\"shape\":[1,%zu],\"data_offsets\":[0,%zu],\"dtype\":\"F64\"}}",
             nh, f16_begin, bf16_begin, nb, bf16_begin, off, nd, f16_begin);
    size_t len;
    uint8_t *b = make_file(header, strlen(header), data, off, &len);
    strata_tensor_list l;
    strata_metadata m;
    strata_diag diag;
    strata_tensor_list_init(&l);
    strata_metadata_init(&m);
    int rc = strata_safetensors_decode(b, len, &l, &m, &diag);
    if (rc != STRATA_OK)
        fprintf(stderr, "\n  decode: %s\n", diag.msg);
    CU_ASSERT_EQUAL_FATAL(rc, STRATA_OK);
    CU_ASSERT_EQUAL_FATAL(l.count, 3);
    CU_ASSERT_STRING_EQUAL(strata_metadata_get(&m, "format"), "pt");

    /* Ordered by data offset: double, half, brain. */
    CU_ASSERT_STRING_EQUAL(l.items[0].name, "double");
    CU_ASSERT_STRING_EQUAL(l.items[1].name, "half");
    CU_ASSERT_STRING_EQUAL(l.items[2].name, "brain");
    CU_ASSERT_EQUAL(l.items[0].ndim, 2);
    CU_ASSERT_EQUAL(l.items[0].shape[1], (int64_t)nd);
    CU_ASSERT_EQUAL(l.items[2].shape[0], (int64_t)nb);

    for (size_t i = 0; i < nd; i++) {
        CASE_ASSERT(float_bits(l.items[0].data[i]) == F64_CASES[i].out, "F64");
        if (float_bits(l.items[0].data[i]) != F64_CASES[i].out)
            fprintf(stderr, "  F64 %.17g -> %08x\n", F64_CASES[i].in,
                    float_bits(l.items[0].data[i]));
    }
    for (size_t i = 0; i < nh; i++)
        CASE_ASSERT(float_bits(l.items[1].data[i]) == F16_CASES[i].out, "F16");
    for (size_t i = 0; i < nb; i++)
        CASE_ASSERT(float_bits(l.items[2].data[i]) == BF16_CASES[i].out, "BF16");

    /* A NaN double stays NaN. */
    free(b);
    double nan_in = NAN;
    uint64_t u;
    memcpy(&u, &nan_in, sizeof(u));
    put_u64le(data, u);
    const char *h1 = "{\"n\":{\"dtype\":\"F64\",\"shape\":[],\"data_offsets\":[0,8]}}";
    b = make_file(h1, strlen(h1), data, 8, &len);
    CU_ASSERT_EQUAL_FATAL(strata_safetensors_decode(b, len, &l, &m, &diag), STRATA_OK);
    CU_ASSERT_EQUAL_FATAL(l.count, 1);
    CU_ASSERT_EQUAL(l.items[0].ndim, 0);
    CU_ASSERT(isnan(l.items[0].data[0]));
    CU_ASSERT_EQUAL(m.count, 0);
    free(b);
    strata_tensor_list_cleanup(&l);
    strata_metadata_cleanup(&m);
}

/* Every one of the 65536 binary16 values against a reference computed with
 * ldexp from the format's definition. */
static void test_f16_exhaustive(void)
{
    size_t n = 65536, dlen = 2 * n;
    uint8_t *data = malloc(dlen);
    CU_ASSERT_PTR_NOT_NULL_FATAL(data);
    for (size_t i = 0; i < n; i++) {
        data[2 * i] = (uint8_t)i;
        data[2 * i + 1] = (uint8_t)(i >> 8);
    }
    char header[128];
    snprintf(header, sizeof(header),
             "{\"all\":{\"dtype\":\"F16\",\"shape\":[256,256],\"data_offsets\":[0,%zu]}}", dlen);
    size_t len;
    uint8_t *b = make_file(header, strlen(header), data, dlen, &len);
    strata_tensor_list l;
    strata_tensor_list_init(&l);
    CU_ASSERT_EQUAL_FATAL(strata_safetensors_decode(b, len, &l, NULL, NULL), STRATA_OK);
    size_t good = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned sign = (unsigned)(i >> 15), exp = (unsigned)(i >> 10) & 31, mant = i & 1023;
        float got = l.items[0].data[i];
        int ok;
        if (exp == 31 && mant != 0) {
            ok = isnan(got) && (float_bits(got) >> 31) == sign &&
                 ((float_bits(got) >> 13) & 1023) == mant;
        } else {
            double ref = exp == 31  ? INFINITY
                         : exp == 0 ? ldexp((double)mant, -24)
                                    : ldexp((double)(1024 + mant), (int)exp - 25);
            if (sign)
                ref = -ref;
            ok = (double)got == ref && !signbit(got) == !signbit(ref);
        }
        good += ok;
    }
    CU_ASSERT_EQUAL(good, n);
    strata_tensor_list_cleanup(&l);
    free(b);
    free(data);
}

int main(void)
{
    CU_TestInfo metadata_tests[] = {
        {"set/get/replace/order", test_metadata_basics},
        {"entry cap", test_metadata_cap},
        CU_TEST_INFO_NULL,
    };
    CU_TestInfo roundtrip_tests[] = {
        {"buffer, bit-exact", test_roundtrip_buffer},    {"empty list", test_roundtrip_empty},
        {"file write/read", test_roundtrip_file},        {"encode rejects", test_encode_rejects},
        {"independent reader", test_independent_reader}, CU_TEST_INFO_NULL,
    };
    CU_TestInfo malformed_tests[] = {
        {"bad headers (table)", test_malformed_headers},
        {"bad bytes (table)", test_malformed_raw},
        {"long name", test_malformed_long_name},
        {"size limits", test_malformed_limits},
        {"NULL arguments", test_null_arguments},
        {"every truncation", test_every_truncation},
        {"every header byte flip", test_every_header_byte_flip},
        CU_TEST_INFO_NULL,
    };
    CU_TestInfo dtype_tests[] = {
        {"F16/BF16/F64 conversion", test_dtype_conversion},
        {"F16 exhaustive", test_f16_exhaustive},
        CU_TEST_INFO_NULL,
    };
    CU_SuiteInfo suites[] = {
        {"safetensors.metadata", NULL, NULL, NULL, NULL, metadata_tests},
        {"safetensors.roundtrip", NULL, NULL, NULL, NULL, roundtrip_tests},
        {"safetensors.malformed", NULL, NULL, NULL, NULL, malformed_tests},
        {"safetensors.dtype", NULL, NULL, NULL, NULL, dtype_tests},
        CU_SUITE_INFO_NULL,
    };
    return strata_test_run(suites);
}
