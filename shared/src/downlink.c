/* The compressed downlink's shared parts (see strata/downlink.h): the
 * model digest, one compression step of x - x̂, applying a delta, the
 * delta's metadata and the chain framing. */
#include "strata/downlink.h"

#include "strata/ef.h"
#include "strata/hash.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHAIN_MAGIC "SDC1"

void strata_downlink_digest(const strata_tensor_list *m, char hex[STRATA_DIGEST_HEX_SIZE])
{
    strata_sha256_ctx c;
    strata_sha256_init(&c);
    for (size_t i = 0; i < m->count; i++) {
        const strata_tensor *t = &m->items[i];
        /* float32 little-endian: the byte order of every supported host. */
        strata_sha256_update(&c, t->data, t->numel * sizeof(float));
    }
    uint8_t h[STRATA_SHA256_LEN];
    strata_sha256_final(&c, h);
    for (size_t i = 0; i < STRATA_SHA256_LEN; i++)
        snprintf(hex + 2 * i, 3, "%02x", h[i]);
}

strata_budget strata_downlink_budget(const strata_budget *b, size_t numel)
{
    strata_budget out = *b;
    int lossy_shape = b->comp == STRATA_COMP_TOPK || b->comp == STRATA_COMP_RANDK ||
                      b->comp == STRATA_COMP_QSGD || b->comp == STRATA_COMP_SIGN ||
                      b->comp == STRATA_COMP_POWERSGD;
    if (lossy_shape && numel < STRATA_DOWNLINK_DENSE_BELOW)
        out = strata_budget_whole(STRATA_VALUES_BF16);
    return out;
}

int strata_downlink_step(strata_tensor_list *ref, const strata_tensor_list *target,
                         const strata_budget *b, uint64_t seed, strata_clayer **layers,
                         strata_diag *diag)
{
    *layers = NULL;
    if (!strata_tensor_list_same_layout(ref, target))
        return strata_diag_set(diag, STRATA_EINVAL, "downlink: the models' layouts differ");
    size_t n = ref->count;
    strata_tensor_list a;
    strata_tensor_list_init(&a);
    strata_ef *ef = NULL;
    strata_clayer *out = NULL;
    strata_budget *bl = calloc(n ? n : 1, sizeof(*bl));
    float **dec = calloc(n ? n : 1, sizeof(*dec));
    int rc = bl && dec ? strata_tensor_list_copy(&a, target) : STRATA_ENOMEM;
    for (size_t i = 0; rc == STRATA_OK && i < n; i++) {
        float *ai = a.items[i].data;
        const float *h = ref->items[i].data;
        for (size_t k = 0; k < a.items[i].numel; k++)
            ai[k] = ai[k] - h[k];
        bl[i] = strata_downlink_budget(b, a.items[i].numel);
    }
    /* The compressors exactly as the uplink runs them, through one
     * error-feedback step from a zero residual: the server's residual is
     * x - x̂ itself, carried from round to round by keeping both. */
    if (rc == STRATA_OK)
        rc = strata_ef_new(&a, 1.0, 0, &ef);
    if (rc == STRATA_OK)
        rc = strata_ef_step(ef, &a, bl, 1, seed, &out, diag);
    for (size_t i = 0; rc == STRATA_OK && i < n; i++) {
        if ((dec[i] = malloc(a.items[i].numel * sizeof(float))) == NULL)
            rc = STRATA_ENOMEM;
        else
            rc = strata_clayer_decode(&out[i], dec[i], diag);
    }
    /* Every layer decoded: x̂ moves all at once. */
    for (size_t i = 0; rc == STRATA_OK && i < n; i++) {
        float *h = ref->items[i].data;
        for (size_t k = 0; k < ref->items[i].numel; k++)
            h[k] = h[k] + dec[i][k];
    }
    for (size_t i = 0; dec != NULL && i < n; i++)
        free(dec[i]);
    free(dec);
    free(bl);
    strata_ef_free(ef);
    strata_tensor_list_cleanup(&a);
    if (rc < 0) {
        if (out != NULL)
            strata_clayers_free(out, n);
        return rc;
    }
    *layers = out;
    return STRATA_OK;
}

int strata_downlink_apply(strata_tensor_list *m, const strata_payload *p, strata_diag *diag)
{
    if (p->num_layers != m->count)
        return strata_diag_set(diag, STRATA_EPROTO, "delta: %zu layers for a model of %zu tensors",
                               p->num_layers, m->count);
    size_t n = m->count;
    float **dec = calloc(n ? n : 1, sizeof(*dec));
    int rc = dec ? STRATA_OK : STRATA_ENOMEM;
    for (size_t i = 0; rc == STRATA_OK && i < n; i++) {
        const strata_clayer *c = &p->layers[i];
        if (c->layer_index != i || c->numel != m->items[i].numel) {
            rc = strata_diag_set(diag, STRATA_EPROTO,
                                 "delta: layer %zu does not match tensor %s (%zu elements)", i,
                                 m->items[i].name, m->items[i].numel);
            break;
        }
        if ((dec[i] = malloc(m->items[i].numel * sizeof(float))) == NULL)
            rc = STRATA_ENOMEM;
        else if ((rc = strata_clayer_decode(c, dec[i], diag)) < 0)
            rc = STRATA_EPROTO;
    }
    for (size_t i = 0; rc == STRATA_OK && i < n; i++) {
        float *h = m->items[i].data;
        for (size_t k = 0; k < m->items[i].numel; k++)
            h[k] = h[k] + dec[i][k];
    }
    for (size_t i = 0; dec != NULL && i < n; i++)
        free(dec[i]);
    free(dec);
    return rc;
}

int strata_downlink_meta(uint64_t from, uint64_t to, const char *hex, char **out)
{
    *out = NULL;
    char buf[160];
    int n = snprintf(buf, sizeof(buf), "{\"from\":%llu,\"to\":%llu,\"digest\":\"%s\"}",
                     (unsigned long long)from, (unsigned long long)to, hex);
    if (n < 0 || (size_t)n >= sizeof(buf))
        return STRATA_EINVAL;
    *out = strdup(buf);
    return *out ? STRATA_OK : STRATA_ENOMEM;
}

static int is_hex_digest(const char *s)
{
    if (s == NULL || strlen(s) != STRATA_DIGEST_HEX_SIZE - 1)
        return 0;
    for (const char *c = s; *c; c++)
        if (!((*c >= '0' && *c <= '9') || (*c >= 'a' && *c <= 'f')))
            return 0;
    return 1;
}

int strata_downlink_meta_parse(const strata_payload *p, uint64_t *from, uint64_t *to,
                               char hex[STRATA_DIGEST_HEX_SIZE], strata_diag *diag)
{
    *from = *to = 0;
    hex[0] = '\0';
    if (p->metadata_json == NULL)
        return strata_diag_set(diag, STRATA_EPROTO, "delta: no metadata");
    json_t *j = json_loads(p->metadata_json, JSON_REJECT_DUPLICATES, NULL);
    json_t *f = json_object_get(j, "from"), *t = json_object_get(j, "to");
    const char *d = json_string_value(json_object_get(j, "digest"));
    int rc = STRATA_OK;
    if (!json_is_integer(f) || !json_is_integer(t) || json_integer_value(f) < 0 ||
        json_integer_value(t) <= json_integer_value(f) || !is_hex_digest(d))
        rc = strata_diag_set(diag, STRATA_EPROTO,
                             "delta: metadata needs from < to (integers) and a digest of 64 "
                             "lowercase hex digits");
    else {
        *from = (uint64_t)json_integer_value(f);
        *to = (uint64_t)json_integer_value(t);
        memcpy(hex, d, STRATA_DIGEST_HEX_SIZE);
    }
    json_decref(j);
    return rc;
}

int strata_downlink_meta_is_base(const strata_payload *p)
{
    if (p->metadata_json == NULL)
        return 0;
    json_t *j = json_loads(p->metadata_json, JSON_REJECT_DUPLICATES, NULL);
    int base = json_is_true(json_object_get(j, "base"));
    json_decref(j);
    return base;
}

/* A layer that carries nothing: TOPK keeping no element. */
static int layer_is_empty(const strata_clayer *c)
{
    return c->comp == STRATA_COMP_TOPK && c->count == 0;
}

int strata_downlink_apply_base(strata_tensor_list *m, const strata_payload *p, strata_diag *diag)
{
    if (p->num_layers != m->count)
        return strata_diag_set(diag, STRATA_EPROTO, "base: %zu layers for a model of %zu tensors",
                               p->num_layers, m->count);
    for (size_t i = 0; i < m->count; i++) {
        const strata_clayer *c = &p->layers[i];
        if (c->layer_index != i || c->numel != m->items[i].numel)
            return strata_diag_set(diag, STRATA_EPROTO,
                                   "base: layer %zu does not match tensor %s (%zu elements)", i,
                                   m->items[i].name, m->items[i].numel);
        if (layer_is_empty(c))
            continue;
        if (c->comp != STRATA_COMP_NONE || c->values_format != STRATA_VALUES_FP32 ||
            c->count != c->numel || c->values == NULL)
            return strata_diag_set(diag, STRATA_EPROTO,
                                   "base: layer %zu is neither float32 values nor empty", i);
        for (uint64_t k = 0; k < c->count; k++)
            if (!isfinite(c->values[k]))
                return strata_diag_set(diag, STRATA_EPROTO,
                                       "base: layer %zu: a value is not finite", i);
    }
    for (size_t i = 0; i < m->count; i++)
        if (!layer_is_empty(&p->layers[i]))
            memcpy(m->items[i].data, p->layers[i].values, m->items[i].numel * sizeof(float));
    return STRATA_OK;
}

/* The estimated bytes of decoded layer c (strata_clayer_cost_bytes with
 * the budget that made it); 0 for an empty layer. */
static double layer_cost(const strata_clayer *c)
{
    if (layer_is_empty(c))
        return 0.0;
    strata_budget b = {.comp = c->comp,
                       .density = 1.0,
                       .levels = c->levels,
                       .rank = c->rank,
                       .values = c->values_format};
    if (c->comp == STRATA_COMP_TOPK || c->comp == STRATA_COMP_RANDK)
        b.density = (double)c->count / (double)c->numel;
    int64_t shape[2] = {(int64_t)c->numel, 1};
    if (c->comp == STRATA_COMP_POWERSGD) {
        shape[0] = c->rows;
        shape[1] = c->cols;
    }
    double v = strata_clayer_cost_bytes(&b, c->values_format,
                                        c->comp == STRATA_COMP_POWERSGD ? 2 : 1, shape, c->numel);
    return v < 0.0 ? 4.0 * (double)c->numel : v;
}

static double base_cost(uint64_t numel)
{
    strata_budget b = strata_budget_whole(STRATA_VALUES_FP32);
    int64_t shape[1] = {(int64_t)numel};
    return strata_clayer_cost_bytes(&b, STRATA_VALUES_FP32, 1, shape, numel);
}

/* What a layer that carries nothing costs after zstd, in bytes (measured:
 * 3 to 7 depending on the layer count). */
#define EMPTY_LAYER_BYTES 5.0

/* Swaps the layers of the based tensors between a and b. */
static void swap_based(strata_clayer *a, strata_clayer *b, const uint8_t *based, size_t nt)
{
    for (size_t k = 0; k < nt; k++)
        if (based[k]) {
            strata_clayer keep = a[k];
            a[k] = b[k];
            b[k] = keep;
        }
}

/* Decodes delta i of a chain and checks it against target's layout and
 * the version the chain has reached (*at; the first delta sets *first). */
static int chain_part(const uint8_t *buf, size_t len, size_t i, const strata_tensor_list *target,
                      uint64_t *first, uint64_t *at, char hex[STRATA_DIGEST_HEX_SIZE],
                      strata_payload **out, strata_diag *diag)
{
    uint64_t pf = 0, pt = 0;
    int rc = strata_payload_decode(buf, len, NULL, out, diag);
    if (rc == STRATA_OK)
        rc = strata_downlink_meta_parse(*out, &pf, &pt, hex, diag);
    if (rc == STRATA_OK && i == 0)
        *first = pf;
    else if (rc == STRATA_OK && (pf != *at || pt != *at + 1))
        rc = strata_diag_set(diag, STRATA_EPROTO, "chain: delta %zu goes from %llu to %llu", i,
                             (unsigned long long)pf, (unsigned long long)pt);
    *at = pt;
    if (rc == STRATA_OK && (*out)->num_layers != target->count)
        rc = strata_diag_set(diag, STRATA_EPROTO, "chain: delta %zu has %zu layers, not %zu", i,
                             (*out)->num_layers, target->count);
    for (size_t k = 0; rc == STRATA_OK && k < target->count; k++) {
        const strata_clayer *c = &(*out)->layers[k];
        if (c->layer_index != k || c->numel != target->items[k].numel)
            rc = strata_diag_set(diag, STRATA_EPROTO,
                                 "chain: delta %zu, layer %zu does not match tensor %s", i, k,
                                 target->items[k].name);
    }
    if (rc < 0) {
        strata_payload_free(*out);
        *out = NULL;
    }
    return rc < 0 && rc != STRATA_ENOMEM ? STRATA_EPROTO : rc;
}

int strata_downlink_chain_compact(const uint8_t *const *parts, const size_t *lens, size_t n,
                                  const strata_tensor_list *target, const char *target_digest,
                                  int zstd_level, uint8_t **out, size_t *len, strata_diag *diag)
{
    *out = NULL;
    *len = 0;
    if (n == 0 || n >= STRATA_DOWNLINK_MAX_CHAIN)
        return strata_diag_set(diag, STRATA_EINVAL, "chain: %zu deltas to compact", n);
    size_t nt = target->count;
    double *cost = calloc(nt ? nt : 1, sizeof(*cost));
    uint8_t *based = calloc(nt ? nt : 1, 1);
    uint8_t **enc = calloc(n + 1, sizeof(*enc));
    size_t *el = calloc(n + 1, sizeof(*el));
    strata_clayer *bl = calloc(nt ? nt : 1, sizeof(*bl));
    char *meta = NULL;
    int rc = cost && based && enc && el && bl ? STRATA_OK : STRATA_ENOMEM;
    uint64_t first = 0, at = 0;
    uint32_t round = 0;
    char hex[STRATA_DIGEST_HEX_SIZE] = "", want[STRATA_DIGEST_HEX_SIZE];
    /* Pass 1, one delta at a time: what each tensor costs in the chain. */
    for (size_t i = 0; rc == STRATA_OK && i < n; i++) {
        strata_payload *p = NULL;
        rc = chain_part(parts[i], lens[i], i, target, &first, &at, hex, &p, diag);
        for (size_t k = 0; rc == STRATA_OK && k < nt; k++)
            cost[k] += layer_cost(&p->layers[k]);
        strata_payload_free(p);
    }
    if (rc == STRATA_OK) {
        if (target_digest != NULL)
            snprintf(want, sizeof(want), "%s", target_digest);
        else
            strata_downlink_digest(target, want);
        if (strcmp(want, hex) != 0)
            rc = strata_diag_set(diag, STRATA_EINVAL,
                                 "chain: the last delta's digest is not the target model's");
    }
    /* A tensor goes in the base when its layers, less the empty layers
     * they leave in each delta, are estimated to cost more than its
     * values; the base is kept only when the chain comes out smaller (the
     * estimates leave out the base's own header and metadata). */
    size_t nb = 0;
    for (size_t k = 0; rc == STRATA_OK && k < nt; k++) {
        uint64_t numel = target->items[k].numel;
        bl[k] = (strata_clayer){.layer_index = (uint32_t)k,
                                .comp = STRATA_COMP_TOPK,
                                .values_format = STRATA_VALUES_FP32,
                                .numel = numel};
        double g = cost[k] - (double)n * EMPTY_LAYER_BYTES - base_cost(numel);
        if (g > 0.0) {
            based[k] = 1;
            nb++;
        }
    }
    int make = rc == STRATA_OK && nb > 0;
    /* Pass 2: each delta without the based tensors, their layers swapped
     * for empty ones while it is encoded, then put back (the payload owns
     * them). */
    for (size_t i = 0; make && rc == STRATA_OK && i < n; i++) {
        strata_payload *p = NULL;
        rc = chain_part(parts[i], lens[i], i, target, &first, &at, hex, &p, diag);
        if (rc == STRATA_OK) {
            swap_based(p->layers, bl, based, nt);
            rc = strata_payload_encode(p, zstd_level, &enc[i], &el[i], diag);
            swap_based(p->layers, bl, based, nt);
            round = p->round;
        }
        strata_payload_free(p);
    }
    if (make && rc == STRATA_OK) {
        for (size_t k = 0; k < nt; k++)
            if (based[k]) {
                bl[k].comp = STRATA_COMP_NONE;
                bl[k].count = bl[k].numel;
                bl[k].values = target->items[k].data;
            }
        char buf[192];
        int m = snprintf(buf, sizeof(buf),
                         "{\"from\":%llu,\"to\":%llu,\"digest\":\"%s\",\"base\":true}",
                         (unsigned long long)first, (unsigned long long)at, want);
        if (m < 0 || (size_t)m >= sizeof(buf) || (meta = strdup(buf)) == NULL)
            rc = STRATA_ENOMEM;
        strata_payload b = {.round = round,
                            .model_version = at,
                            .num_layers = nt,
                            .layers = bl,
                            .metadata_json = meta};
        if (rc == STRATA_OK)
            rc = strata_payload_encode(&b, zstd_level, &enc[n], &el[n], diag);
    }
    if (make && rc == STRATA_OK) {
        size_t plain = 8, compact = 8;
        for (size_t i = 0; i < n; i++)
            plain += 4 + lens[i];
        for (size_t i = 0; i <= n; i++)
            compact += 4 + el[i];
        if (compact < plain)
            rc = strata_downlink_chain_encode((const uint8_t *const *)enc, el, n + 1, out, len);
    }
    for (size_t i = 0; enc != NULL && i <= n; i++)
        free(enc[i]);
    free(cost);
    free(based);
    free(enc);
    free(el);
    free(bl);
    free(meta);
    return rc;
}

static void put_u32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t get_u32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

int strata_downlink_chain_encode(const uint8_t *const *parts, const size_t *lens, size_t n,
                                 uint8_t **out, size_t *len)
{
    *out = NULL;
    *len = 0;
    if (n == 0 || n > STRATA_DOWNLINK_MAX_CHAIN)
        return STRATA_EINVAL;
    size_t total = 8;
    for (size_t i = 0; i < n; i++) {
        if (lens[i] > UINT32_MAX || total > SIZE_MAX - 4 - lens[i])
            return STRATA_EINVAL;
        total += 4 + lens[i];
    }
    uint8_t *b = malloc(total), *p = b;
    if (b == NULL)
        return STRATA_ENOMEM;
    memcpy(p, CHAIN_MAGIC, 4);
    put_u32(p + 4, (uint32_t)n);
    p += 8;
    for (size_t i = 0; i < n; i++) {
        put_u32(p, (uint32_t)lens[i]);
        memcpy(p + 4, parts[i], lens[i]);
        p += 4 + lens[i];
    }
    *out = b;
    *len = total;
    return STRATA_OK;
}

int strata_downlink_chain_split(const uint8_t *buf, size_t len, const uint8_t ***parts,
                                size_t **lens, size_t *n, strata_diag *diag)
{
    *parts = NULL;
    *lens = NULL;
    *n = 0;
    if (len < 8 || memcmp(buf, CHAIN_MAGIC, 4) != 0)
        return strata_diag_set(diag, STRATA_EPROTO, "chain: not a delta chain (magic)");
    uint32_t cnt = get_u32(buf + 4);
    if (cnt == 0 || cnt > STRATA_DOWNLINK_MAX_CHAIN)
        return strata_diag_set(diag, STRATA_EPROTO, "chain: %u deltas (1 to %u allowed)", cnt,
                               STRATA_DOWNLINK_MAX_CHAIN);
    const uint8_t **pp = calloc(cnt, sizeof(*pp));
    size_t *ll = calloc(cnt, sizeof(*ll));
    if (pp == NULL || ll == NULL) {
        free(pp);
        free(ll);
        return STRATA_ENOMEM;
    }
    size_t off = 8;
    for (uint32_t i = 0; i < cnt; i++) {
        if (len - off < 4 || len - off - 4 < get_u32(buf + off)) {
            free(pp);
            free(ll);
            return strata_diag_set(diag, STRATA_EPROTO, "chain: delta %u is truncated", i);
        }
        ll[i] = get_u32(buf + off);
        pp[i] = buf + off + 4;
        off += 4 + ll[i];
    }
    if (off != len) {
        free(pp);
        free(ll);
        return strata_diag_set(diag, STRATA_EPROTO, "chain: %zu bytes after the last delta",
                               len - off);
    }
    *parts = pp;
    *lens = ll;
    *n = cnt;
    return STRATA_OK;
}
