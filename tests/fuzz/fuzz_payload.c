/* libFuzzer target for strata_payload_decode.
 *
 * Each input is tried twice:
 *   1. as wire bytes (a zstd frame), exactly as a server receives them;
 *   2. when it does not start with the zstd magic and holds at least 4
 *      bytes, as a payload *body*: its last 4 bytes are replaced by the
 *      CRC32C of the rest and it is compressed with zstd, so that mutations
 *      reach the parser behind the checksum instead of dying there.
 * Every decode must either fail with STRATA_EPROTO or STRATA_ETOOBIG, a
 * message and a NULL payload, or succeed with a payload that encodes again,
 * decodes again to the same payload, and re-encodes to the very body that
 * was decoded (the encoding is canonical). Anything else aborts. */
#include "strata/payload.h"

#include <stdint.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <zstd.h>

static void check(int cond)
{
    if (!cond)
        abort();
}

static int same_layer(const strata_clayer *a, const strata_clayer *b)
{
    uint32_t sa, sb;
    memcpy(&sa, &a->scale, 4);
    memcpy(&sb, &b->scale, 4);
    if (a->layer_index != b->layer_index || a->comp != b->comp ||
        a->values_format != b->values_format || a->numel != b->numel || a->count != b->count ||
        sa != sb || a->levels != b->levels || a->rows != b->rows || a->cols != b->cols ||
        a->rank != b->rank || a->seed != b->seed)
        return 0;
    int dense_free = a->comp == STRATA_COMP_QSGD || a->comp == STRATA_COMP_SIGN;
    size_t nv = dense_free ? 0 : (size_t)a->count;
    if (nv > 0 && memcmp(a->values, b->values, nv * sizeof(float)) != 0)
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

static int same_payload(const strata_payload *a, const strata_payload *b)
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
        if (!same_layer(&a->layers[i], &b->layers[i]))
            return 0;
    return 1;
}

/* Returns the decompressed body of a frame the codec accepted (malloc'ed). */
static uint8_t *body_of(const uint8_t *wire, size_t len, size_t *body_len)
{
    unsigned long long n = ZSTD_getFrameContentSize(wire, len);
    check(n != ZSTD_CONTENTSIZE_ERROR && n != ZSTD_CONTENTSIZE_UNKNOWN);
    uint8_t *b = malloc((size_t)n);
    check(b != NULL);
    check(ZSTD_decompress(b, (size_t)n, wire, len) == n);
    *body_len = (size_t)n;
    return b;
}

static void run(const uint8_t *wire, size_t len)
{
    static const strata_payload_limits lim = {.max_decoded_bytes = (uint64_t)8 << 20};
    strata_payload *p = (strata_payload *)&p;
    strata_diag diag;
    int rc = strata_payload_decode(wire, len, &lim, &p, &diag);
    if (rc < 0) {
        check(p == NULL && diag.msg[0] != '\0' && (rc == STRATA_EPROTO || rc == STRATA_ETOOBIG));
        return;
    }
    check(rc == STRATA_OK && p != NULL);

    uint8_t *again = NULL;
    size_t again_len = 0;
    check(strata_payload_encode(p, 1, &again, &again_len, NULL) == STRATA_OK);
    strata_payload *q = NULL;
    check(strata_payload_decode(again, again_len, &lim, &q, NULL) == STRATA_OK);
    check(same_payload(p, q));

    size_t b1, b2;
    uint8_t *body1 = body_of(wire, len, &b1), *body2 = body_of(again, again_len, &b2);
    check(b1 == b2 && memcmp(body1, body2, b1) == 0);

    /* Every accepted layer decodes to finite dense values. */
    for (size_t i = 0; i < p->num_layers; i++) {
        const strata_clayer *c = &p->layers[i];
        if (c->numel > ((uint64_t)1 << 20))
            continue;
        float *dense = malloc((size_t)c->numel * sizeof(float));
        check(dense != NULL);
        if (strata_clayer_decode(c, dense, NULL) == STRATA_OK)
            for (uint64_t j = 0; j < c->numel; j++)
                check(isfinite(dense[j]));
        free(dense);
    }

    free(body1);
    free(body2);
    free(again);
    strata_payload_free(q);
    strata_payload_free(p);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    run(data, size);

    static const uint8_t zstd_magic[4] = {0x28, 0xB5, 0x2F, 0xFD};
    if (size < 4 || memcmp(data, zstd_magic, 4) == 0)
        return 0;
    uint8_t *body = malloc(size);
    size_t bound = ZSTD_compressBound(size);
    uint8_t *wire = malloc(bound);
    check(body != NULL && wire != NULL);
    memcpy(body, data, size);
    uint32_t crc = strata_crc32c(0, body, size - 4);
    for (int i = 0; i < 4; i++)
        body[size - 4 + i] = (uint8_t)(crc >> (8 * i));
    size_t n = ZSTD_compress(wire, bound, body, size, 1);
    check(!ZSTD_isError(n));
    run(wire, n);
    free(wire);
    free(body);
    return 0;
}
