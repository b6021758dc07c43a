#include "strata/downlink.h"
#include "strata/hash.h"
#include "strata/rng.h"
#include "test_util.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* A model layout of a 40x60 matrix (compressed) and a 10-element bias
 * (dense), filled with seeded values. */
static void make(strata_tensor_list *l, uint64_t seed, float scale)
{
    strata_tensor_list_init(l);
    int64_t w[2] = {40, 60}, b[1] = {10};
    CU_ASSERT_EQUAL_FATAL(strata_tensor_list_add(l, "fc.weight", 2, w, NULL), STRATA_OK);
    CU_ASSERT_EQUAL_FATAL(strata_tensor_list_add(l, "fc.bias", 1, b, NULL), STRATA_OK);
    strata_rng r;
    strata_rng_seed(&r, seed, 1);
    for (size_t i = 0; i < l->count; i++)
        for (size_t k = 0; k < l->items[i].numel; k++)
            l->items[i].data[k] = scale * (float)(strata_rng_uniform(&r) - 0.5);
}

/* What the coordinator publishes for version v: the delta payload of
 * layers (freed here) with x̂'s digest hex, encoded at zstd level into
 * *wire (free()). */
static void publish(const strata_tensor_list *xs, strata_clayer *layers, uint32_t v, int level,
                    char hex[STRATA_DIGEST_HEX_SIZE], uint8_t **wire, size_t *len)
{
    char *meta = NULL;
    strata_downlink_digest(xs, hex);
    CU_ASSERT_EQUAL_FATAL(strata_downlink_meta(v - 1, v, hex, &meta), STRATA_OK);
    strata_payload p = {.round = v - 1,
                        .model_version = v,
                        .num_layers = 2,
                        .layers = layers,
                        .metadata_json = meta};
    CU_ASSERT_EQUAL_FATAL(strata_payload_encode(&p, level, wire, len, NULL), STRATA_OK);
    strata_clayers_free(layers, 2);
    free(meta);
}

static void test_digest(void)
{
    strata_tensor_list m;
    make(&m, 1, 1.0f);
    char a[STRATA_DIGEST_HEX_SIZE], b[STRATA_DIGEST_HEX_SIZE];
    strata_downlink_digest(&m, a);
    CU_ASSERT_EQUAL(strlen(a), 64);
    /* The SHA-256 of the values' bytes in model order, nothing else. */
    size_t n0 = m.items[0].numel * 4, n1 = m.items[1].numel * 4;
    uint8_t *all = malloc(n0 + n1), h[STRATA_SHA256_LEN];
    memcpy(all, m.items[0].data, n0);
    memcpy(all + n0, m.items[1].data, n1);
    strata_sha256(all, n0 + n1, h);
    for (size_t i = 0; i < STRATA_SHA256_LEN; i++)
        snprintf(b + 2 * i, 3, "%02x", h[i]);
    CU_ASSERT_STRING_EQUAL(a, b);
    m.items[1].data[3] += 1.0f;
    strata_downlink_digest(&m, b);
    CU_ASSERT(strcmp(a, b) != 0);
    free(all);
    strata_tensor_list_cleanup(&m);
}

/* Server and client agree bit for bit over several rounds: the client
 * applies the encoded and decoded deltas to its copy of x̂; what top-k
 * leaves out stays in x - x̂ and is sent later. */
static void test_step_apply_agree(void)
{
    static const char *const specs[] = {"topk:0.05", "topk:0.02:int8", "topk:0.02:ternary",
                                        "fp16",      "qsgd:8",         "powersgd:2"};
    for (size_t s = 0; s < sizeof(specs) / sizeof(specs[0]); s++) {
        strata_budget b;
        CU_ASSERT_EQUAL_FATAL(strata_budget_parse(specs[s], 1, &b, NULL), STRATA_OK);
        strata_tensor_list x, xs, xc;
        make(&x, 7, 1.0f);
        strata_tensor_list_init(&xs);
        strata_tensor_list_init(&xc);
        CU_ASSERT_EQUAL_FATAL(strata_tensor_list_copy(&xs, &x), STRATA_OK);
        CU_ASSERT_EQUAL_FATAL(strata_tensor_list_copy(&xc, &x), STRATA_OK);
        double first = 0, last = 0;
        for (uint32_t v = 1; v <= 6; v++) {
            strata_tensor_list step;
            make(&step, 100 + v, 0.1f);
            for (size_t i = 0; i < x.count; i++)
                for (size_t k = 0; k < x.items[i].numel; k++)
                    x.items[i].data[k] += step.items[i].data[k];
            strata_tensor_list_cleanup(&step);
            float sent[10]; /* the bias's x - x̂ this step sends */
            for (size_t k = 0; k < 10; k++)
                sent[k] = x.items[1].data[k] - xs.items[1].data[k];
            strata_clayer *layers = NULL;
            CU_ASSERT_EQUAL_FATAL(strata_downlink_step(&xs, &x, &b, v, &layers, NULL), STRATA_OK);
            /* The bias goes whole with 16-bit values, also under int8 and
             * ternary: what stays behind is one rounding of what was sent
             * (bf16 keeps 8 significant bits, fp16 11), not a sum of
             * roundings. */
            for (size_t k = 0; k < 10; k++)
                CU_ASSERT(fabsf(x.items[1].data[k] - xs.items[1].data[k]) <=
                          fabsf(sent[k]) / 256.0f + 1e-6f);
            if (b.comp != STRATA_COMP_FP16) { /* 10 elements: dense bf16 */
                CU_ASSERT_EQUAL(layers[1].comp, STRATA_COMP_NONE);
                CU_ASSERT_EQUAL(layers[1].values_format, STRATA_VALUES_BF16);
            }
            char hex[STRATA_DIGEST_HEX_SIZE];
            uint8_t *wire = NULL;
            size_t len = 0;
            publish(&xs, layers, v, 1, hex, &wire, &len);
            strata_payload *q = NULL;
            CU_ASSERT_EQUAL_FATAL(strata_payload_decode(wire, len, NULL, &q, NULL), STRATA_OK);
            uint64_t from = 0, to = 0;
            char got[STRATA_DIGEST_HEX_SIZE], mine[STRATA_DIGEST_HEX_SIZE];
            CU_ASSERT_EQUAL(strata_downlink_meta_parse(q, &from, &to, got, NULL), STRATA_OK);
            CU_ASSERT(from == v - 1 && to == v);
            CU_ASSERT_EQUAL(strata_downlink_apply(&xc, q, NULL), STRATA_OK);
            strata_downlink_digest(&xc, mine);
            CU_ASSERT_STRING_EQUAL(mine, got);
            CU_ASSERT_STRING_EQUAL(mine, hex);
            strata_payload_free(q);
            free(wire);
            double e = 0;
            for (size_t k = 0; k < x.items[0].numel; k++) {
                double dd = x.items[0].data[k] - xs.items[0].data[k];
                e += dd * dd;
            }
            if (v == 1)
                first = e;
            last = e;
        }
        /* Error feedback: the residual stays bounded (no blow-up). */
        CU_ASSERT(last < 20 * first + 1e-9);
        strata_tensor_list_cleanup(&x);
        strata_tensor_list_cleanup(&xs);
        strata_tensor_list_cleanup(&xc);
    }
}

static void test_apply_refuses_mismatch(void)
{
    strata_tensor_list x, xs, other;
    make(&x, 1, 1.0f);
    make(&xs, 2, 1.0f);
    strata_tensor_list_init(&other);
    int64_t w[2] = {40, 61};
    CU_ASSERT_EQUAL_FATAL(strata_tensor_list_add(&other, "fc.weight", 2, w, NULL), STRATA_OK);
    strata_budget b;
    CU_ASSERT_EQUAL_FATAL(strata_budget_parse("topk:0.1", 1, &b, NULL), STRATA_OK);
    strata_clayer *layers = NULL;
    CU_ASSERT_EQUAL(strata_downlink_step(&other, &x, &b, 1, &layers, NULL), STRATA_EINVAL);
    CU_ASSERT_PTR_NULL(layers);
    CU_ASSERT_EQUAL_FATAL(strata_downlink_step(&xs, &x, &b, 1, &layers, NULL), STRATA_OK);
    strata_payload p = {.num_layers = 2, .layers = layers};
    char before[STRATA_DIGEST_HEX_SIZE], after[STRATA_DIGEST_HEX_SIZE];
    strata_downlink_digest(&other, before);
    strata_diag d;
    CU_ASSERT_EQUAL(strata_downlink_apply(&other, &p, &d), STRATA_EPROTO);
    strata_downlink_digest(&other, after);
    CU_ASSERT_STRING_EQUAL(before, after); /* unchanged */
    strata_payload nometa = {.num_layers = 2, .layers = layers};
    uint64_t f, t;
    CU_ASSERT_EQUAL(strata_downlink_meta_parse(&nometa, &f, &t, after, &d), STRATA_EPROTO);
    char bad[] = "{\"from\":3,\"to\":3,\"digest\":\"00\"}";
    nometa.metadata_json = bad;
    CU_ASSERT_EQUAL(strata_downlink_meta_parse(&nometa, &f, &t, after, &d), STRATA_EPROTO);
    strata_clayers_free(layers, 2);
    strata_tensor_list_cleanup(&x);
    strata_tensor_list_cleanup(&xs);
    strata_tensor_list_cleanup(&other);
}

static void test_chain(void)
{
    const uint8_t a[] = {1, 2, 3}, b[] = {9};
    const uint8_t *parts[] = {a, b};
    size_t lens[] = {3, 1};
    uint8_t *buf = NULL;
    size_t len = 0;
    CU_ASSERT_EQUAL_FATAL(strata_downlink_chain_encode(parts, lens, 2, &buf, &len), STRATA_OK);
    CU_ASSERT_EQUAL(len, 8 + 4 + 3 + 4 + 1);
    const uint8_t **pp = NULL;
    size_t *ll = NULL, n = 0;
    CU_ASSERT_EQUAL_FATAL(strata_downlink_chain_split(buf, len, &pp, &ll, &n, NULL), STRATA_OK);
    CU_ASSERT_EQUAL(n, 2);
    CU_ASSERT(ll[0] == 3 && memcmp(pp[0], a, 3) == 0 && ll[1] == 1 && pp[1][0] == 9);
    free(pp);
    free(ll);
    strata_diag d;
    /* Truncated, trailing bytes, bad magic, zero count. */
    CU_ASSERT_EQUAL(strata_downlink_chain_split(buf, len - 1, &pp, &ll, &n, &d), STRATA_EPROTO);
    CU_ASSERT_PTR_NULL(pp);
    uint8_t *more = malloc(len + 1);
    memcpy(more, buf, len);
    more[len] = 0;
    CU_ASSERT_EQUAL(strata_downlink_chain_split(more, len + 1, &pp, &ll, &n, &d), STRATA_EPROTO);
    more[0] = 'X';
    CU_ASSERT_EQUAL(strata_downlink_chain_split(more, len, &pp, &ll, &n, &d), STRATA_EPROTO);
    memcpy(more, "SDC1\0\0\0\0", 8);
    CU_ASSERT_EQUAL(strata_downlink_chain_split(more, 8, &pp, &ll, &n, &d), STRATA_EPROTO);
    free(more);
    free(buf);
    CU_ASSERT_EQUAL(strata_downlink_chain_encode(parts, lens, 0, &buf, &len), STRATA_EINVAL);
    CU_ASSERT_PTR_NULL(buf);
}

/* n deltas of x̂ (topk:0.02:ternary, so the bias goes whole in bf16) as
 * encoded payloads wire[1..n], from xs (moved to x̂ of version n). */
static void make_deltas(strata_tensor_list *x, strata_tensor_list *xs, uint32_t n, uint8_t **wire,
                        size_t *lens)
{
    strata_budget b;
    CU_ASSERT_EQUAL_FATAL(strata_budget_parse("topk:0.02:ternary", 1, &b, NULL), STRATA_OK);
    for (uint32_t v = 1; v <= n; v++) {
        strata_tensor_list step;
        make(&step, 200 + v, 0.1f);
        for (size_t i = 0; i < x->count; i++)
            for (size_t k = 0; k < x->items[i].numel; k++)
                x->items[i].data[k] += step.items[i].data[k];
        strata_tensor_list_cleanup(&step);
        strata_clayer *layers = NULL;
        CU_ASSERT_EQUAL_FATAL(strata_downlink_step(xs, x, &b, v, &layers, NULL), STRATA_OK);
        char hex[STRATA_DIGEST_HEX_SIZE];
        publish(xs, layers, v, 3, hex, &wire[v], &lens[v]);
    }
}

/* What a client does with a chain: every delta in order, then the base if
 * the chain ends with one; returns the digest reached. */
static int client_apply(strata_tensor_list *m, const uint8_t *buf, size_t len, int *based,
                        char out[STRATA_DIGEST_HEX_SIZE])
{
    const uint8_t **pp = NULL;
    size_t *ll = NULL, n = 0;
    int rc = strata_downlink_chain_split(buf, len, &pp, &ll, &n, NULL);
    *based = 0;
    for (size_t i = 0; rc == STRATA_OK && i < n; i++) {
        strata_payload *q = NULL;
        rc = strata_payload_decode(pp[i], ll[i], NULL, &q, NULL);
        if (rc == STRATA_OK && strata_downlink_meta_is_base(q)) {
            *based = i + 1 == n;
            rc = strata_downlink_apply_base(m, q, NULL);
        } else if (rc == STRATA_OK) {
            rc = strata_downlink_apply(m, q, NULL);
        }
        strata_payload_free(q);
    }
    free(pp);
    free(ll);
    strata_downlink_digest(m, out);
    return rc;
}

/* A chain whose bias would cost more as 24 bf16 deltas than as its float32
 * values once: the compacted chain leaves the bias out of every delta,
 * sets it with a base at the end, is smaller, and reaches x̂ bit for bit;
 * the weight, cheaper as deltas, stays in them. */
static void test_chain_compact(void)
{
    strata_tensor_list x, xs, x0, xc;
    make(&x, 7, 1.0f);
    strata_tensor_list_init(&xs);
    strata_tensor_list_init(&x0);
    strata_tensor_list_init(&xc);
    CU_ASSERT_EQUAL_FATAL(strata_tensor_list_copy(&xs, &x), STRATA_OK);
    CU_ASSERT_EQUAL_FATAL(strata_tensor_list_copy(&x0, &x), STRATA_OK);
    enum { N = 24 };
    uint8_t *wire[N + 1] = {0};
    size_t lens[N + 1] = {0};
    make_deltas(&x, &xs, N, wire, lens);
    char want[STRATA_DIGEST_HEX_SIZE], got[STRATA_DIGEST_HEX_SIZE];
    strata_downlink_digest(&xs, want);

    uint8_t *plain = NULL, *comp = NULL;
    size_t plain_len = 0, comp_len = 0;
    const uint8_t *const *parts = (const uint8_t *const *)&wire[1];
    CU_ASSERT_EQUAL_FATAL(strata_downlink_chain_encode(parts, &lens[1], N, &plain, &plain_len),
                          STRATA_OK);
    CU_ASSERT_EQUAL_FATAL(
        strata_downlink_chain_compact(parts, &lens[1], N, &xs, NULL, 3, &comp, &comp_len, NULL),
        STRATA_OK);
    CU_ASSERT_PTR_NOT_NULL_FATAL(comp);
    CU_ASSERT(comp_len < plain_len);
    /* The same with x̂'s digest given; a digest that is not x̂'s refused. */
    uint8_t *again = NULL;
    size_t again_len = 0;
    CU_ASSERT_EQUAL(
        strata_downlink_chain_compact(parts, &lens[1], N, &xs, want, 3, &again, &again_len, NULL),
        STRATA_OK);
    CU_ASSERT(again != NULL && again_len == comp_len && memcmp(again, comp, comp_len) == 0);
    free(again);
    char other[STRATA_DIGEST_HEX_SIZE];
    memset(other, '0', STRATA_DIGEST_HEX_SIZE - 1);
    other[STRATA_DIGEST_HEX_SIZE - 1] = '\0';
    CU_ASSERT_EQUAL(
        strata_downlink_chain_compact(parts, &lens[1], N, &xs, other, 3, &again, &again_len, NULL),
        STRATA_EINVAL);

    /* The client reaches x̂ of version N from version 0 either way. */
    int based = 0;
    CU_ASSERT_EQUAL_FATAL(strata_tensor_list_copy(&xc, &x0), STRATA_OK);
    CU_ASSERT_EQUAL(client_apply(&xc, plain, plain_len, &based, got), STRATA_OK);
    CU_ASSERT_STRING_EQUAL(got, want);
    CU_ASSERT_FALSE(based);
    strata_tensor_list_cleanup(&xc);
    CU_ASSERT_EQUAL_FATAL(strata_tensor_list_copy(&xc, &x0), STRATA_OK);
    CU_ASSERT_EQUAL(client_apply(&xc, comp, comp_len, &based, got), STRATA_OK);
    CU_ASSERT_STRING_EQUAL(got, want);
    CU_ASSERT_TRUE(based);

    /* What it holds: N deltas without the bias, then a base of the bias
     * alone with x̂'s own values. */
    const uint8_t **pp = NULL;
    size_t *ll = NULL, n = 0;
    CU_ASSERT_EQUAL_FATAL(strata_downlink_chain_split(comp, comp_len, &pp, &ll, &n, NULL),
                          STRATA_OK);
    CU_ASSERT_EQUAL_FATAL(n, N + 1);
    strata_payload *first = NULL, *base = NULL, *orig = NULL;
    CU_ASSERT_EQUAL_FATAL(strata_payload_decode(pp[0], ll[0], NULL, &first, NULL), STRATA_OK);
    CU_ASSERT_EQUAL_FATAL(strata_payload_decode(wire[1], lens[1], NULL, &orig, NULL), STRATA_OK);
    CU_ASSERT_STRING_EQUAL(first->metadata_json, orig->metadata_json); /* as published */
    CU_ASSERT_EQUAL(first->layers[0].count, orig->layers[0].count);
    CU_ASSERT_EQUAL(memcmp(first->layers[0].indices, orig->layers[0].indices,
                           orig->layers[0].count * sizeof(uint32_t)),
                    0);
    strata_payload_free(orig);
    CU_ASSERT_EQUAL_FATAL(strata_payload_decode(pp[N], ll[N], NULL, &base, NULL), STRATA_OK);
    CU_ASSERT_FALSE(strata_downlink_meta_is_base(first));
    CU_ASSERT_EQUAL(first->layers[0].comp, STRATA_COMP_TOPK);
    CU_ASSERT(first->layers[0].count > 0);
    CU_ASSERT(first->layers[1].comp == STRATA_COMP_TOPK && first->layers[1].count == 0);
    CU_ASSERT_TRUE(strata_downlink_meta_is_base(base));
    uint64_t bf = 9, bt = 9;
    CU_ASSERT_EQUAL(strata_downlink_meta_parse(base, &bf, &bt, got, NULL), STRATA_OK);
    CU_ASSERT(bf == 0 && bt == N);
    CU_ASSERT_STRING_EQUAL(got, want);
    CU_ASSERT(base->layers[0].comp == STRATA_COMP_TOPK && base->layers[0].count == 0);
    CU_ASSERT_EQUAL(base->layers[1].comp, STRATA_COMP_NONE);
    CU_ASSERT_EQUAL(memcmp(base->layers[1].values, xs.items[1].data, 10 * sizeof(float)), 0);

    /* A base refused changes nothing, not even the layers before the bad
     * one: layer 0 now carries valid values, layer 1 is a bf16 layer, a
     * layer too short, a value that is not finite. */
    strata_tensor_list_cleanup(&xc);
    CU_ASSERT_EQUAL_FATAL(strata_tensor_list_copy(&xc, &x0), STRATA_OK);
    char before[STRATA_DIGEST_HEX_SIZE];
    strata_downlink_digest(&xc, before);
    strata_diag d;
    float *ones = malloc(2400 * sizeof(float));
    CU_ASSERT_PTR_NOT_NULL_FATAL(ones);
    for (size_t k = 0; k < 2400; k++)
        ones[k] = 1.0f;
    base->layers[0].comp = STRATA_COMP_NONE;
    base->layers[0].count = 2400;
    base->layers[0].values = ones; /* freed with the payload */
    base->layers[1].values_format = STRATA_VALUES_BF16;
    CU_ASSERT_EQUAL(strata_downlink_apply_base(&xc, base, &d), STRATA_EPROTO);
    base->layers[1].values_format = STRATA_VALUES_FP32;
    base->layers[1].numel = 9;
    CU_ASSERT_EQUAL(strata_downlink_apply_base(&xc, base, &d), STRATA_EPROTO);
    base->layers[1].numel = 10;
    base->layers[1].values[2] = NAN;
    CU_ASSERT_EQUAL(strata_downlink_apply_base(&xc, base, &d), STRATA_EPROTO);
    strata_downlink_digest(&xc, got);
    CU_ASSERT_STRING_EQUAL(got, before);
    strata_payload_free(first);
    strata_payload_free(base);
    free(pp);
    free(ll);

    /* One delta, or two: the bias is cheaper as it is, nothing to compact
     * (what it would save does not pay for a base). */
    uint8_t *one = NULL;
    size_t one_len = 7;
    CU_ASSERT_EQUAL(strata_downlink_chain_compact(parts + N - 1, &lens[N], 1, &xs, NULL, 3, &one,
                                                  &one_len, NULL),
                    STRATA_OK);
    CU_ASSERT_PTR_NULL(one);
    CU_ASSERT_EQUAL(one_len, 0);
    CU_ASSERT_EQUAL(strata_downlink_chain_compact(parts + N - 2, &lens[N - 1], 2, &xs, NULL, 3,
                                                  &one, &one_len, NULL),
                    STRATA_OK);
    CU_ASSERT_PTR_NULL(one);

    /* Refused: a target that is not the last delta's model, deltas that do
     * not follow each other, a part that is not a payload. */
    xs.items[1].data[0] += 1.0f;
    CU_ASSERT_EQUAL(
        strata_downlink_chain_compact(parts, &lens[1], N, &xs, NULL, 3, &one, &one_len, &d),
        STRATA_EINVAL);
    xs.items[1].data[0] -= 1.0f;
    const uint8_t *gap[] = {wire[1], wire[3]};
    size_t gap_lens[] = {lens[1], lens[3]};
    CU_ASSERT_EQUAL(
        strata_downlink_chain_compact(gap, gap_lens, 2, &xs, NULL, 3, &one, &one_len, &d),
        STRATA_EPROTO);
    const uint8_t junk[] = {1, 2, 3, 4};
    const uint8_t *bad[] = {wire[1], junk};
    size_t bad_lens[] = {lens[1], sizeof(junk)};
    CU_ASSERT_EQUAL(
        strata_downlink_chain_compact(bad, bad_lens, 2, &xs, NULL, 3, &one, &one_len, &d),
        STRATA_EPROTO);

    for (size_t v = 1; v <= N; v++)
        free(wire[v]);
    free(plain);
    free(comp);
    strata_tensor_list_cleanup(&x);
    strata_tensor_list_cleanup(&xs);
    strata_tensor_list_cleanup(&x0);
    strata_tensor_list_cleanup(&xc);
}

int main(void)
{
    CU_TestInfo tests[] = {
        {"digest is the SHA-256 of the values", test_digest},
        {"server step and client apply agree bit for bit", test_step_apply_agree},
        {"mismatched layouts and metadata refused", test_apply_refuses_mismatch},
        {"chain framing", test_chain},
        {"a chain compacted with a base reaches the same model", test_chain_compact},
        CU_TEST_INFO_NULL,
    };
    CU_SuiteInfo suites[] = {
        {"downlink", NULL, NULL, NULL, NULL, tests},
        CU_SUITE_INFO_NULL,
    };
    return strata_test_run(suites);
}
