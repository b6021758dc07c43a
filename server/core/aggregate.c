/* Streaming weighted FedAvg (see aggregate.h): one double-precision
 * accumulator per model element, updates validated whole before anything
 * is added, optional L2 clipping. */
#include "aggregate.h"
#include "layout.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- Streaming weighted FedAvg ---- */

struct strata_agg {
    strata__layout lay;
    double *acc;   /* lay.total sums of w * value */
    void *scratch; /* lay.total * 4 bytes: per layer float[numel] or uint32[count] */
    uint64_t count;
    double total_weight;
    size_t bytes; /* heap bytes owned, fixed at creation */
};

void strata_agg_free(strata_agg *agg)
{
    if (agg == NULL)
        return;
    strata__layout_cleanup(&agg->lay);
    free(agg->acc);
    free(agg->scratch);
    free(agg);
}

int strata_agg_new(const strata_tensor_list *layout_in, strata_agg **out)
{
    if (out != NULL)
        *out = NULL;
    if (layout_in == NULL || out == NULL)
        return STRATA_EINVAL;
    strata_agg *agg = calloc(1, sizeof(*agg));
    if (agg == NULL)
        return STRATA_ENOMEM;
    int rc = strata__layout_copy(&agg->lay, layout_in);
    if (rc < 0)
        goto fail;
    const size_t n = agg->lay.total;
    rc = STRATA_ETOOBIG;
    if (n > SIZE_MAX / sizeof(double))
        goto fail;
    rc = STRATA_ENOMEM;
    agg->acc = calloc(n, sizeof(double));
    agg->scratch = malloc(n * sizeof(float));
    if (agg->acc == NULL || agg->scratch == NULL)
        goto fail;
    agg->bytes = sizeof(*agg) + agg->lay.bytes + n * sizeof(double) + n * sizeof(float);
    *out = agg;
    return STRATA_OK;
fail:
    strata_agg_free(agg);
    return rc;
}

/* Checks the kept values of a sparse layer by the rules of
 * strata_clayer_decode (finite, representable in the values format): they
 * are decoded as a dense NONE layer of count elements into dst. */
static int check_sparse_values(const strata_clayer *c, float *dst, strata_diag *diag)
{
    if (c->count == 0)
        return STRATA_OK;
    strata_clayer view = {
        .layer_index = c->layer_index,
        .comp = STRATA_COMP_NONE,
        .values_format = strata_values_format_for(STRATA_COMP_NONE, c->values_format),
        .numel = c->count,
        .count = c->count,
        .values = c->values,
    };
    return strata_clayer_decode(&view, dst, diag);
}

int strata__agg_layer_prepare(size_t i, const char *name, size_t numel, const strata_clayer *c,
                              void *slot, strata_diag *diag)
{
    if (c->layer_index != i)
        return strata_diag_set(diag, STRATA_EPROTO, "layer %zu carries layer_index %" PRIu32, i,
                               c->layer_index);
    if (c->numel != (uint64_t)numel)
        return strata_diag_set(diag, STRATA_EPROTO,
                               "layer %zu (%s): %" PRIu64 " elements, the model has %zu", i, name,
                               c->numel, numel);
    strata_diag sub = {{0}};
    int rc = STRATA_OK;
    switch (c->comp) {
    case STRATA_COMP_TOPK:
        if (c->count > c->numel) {
            rc = strata_diag_set(&sub, STRATA_EPROTO, "topk: count %" PRIu64 " exceeds numel",
                                 c->count);
            break;
        }
        if (c->count > 0 && (c->indices == NULL || c->values == NULL)) {
            rc = strata_diag_set(&sub, STRATA_EPROTO, "topk: indices or values missing");
            break;
        }
        for (size_t j = 0; j < c->count && rc == STRATA_OK; j++) {
            if (c->indices[j] >= c->numel)
                rc = strata_diag_set(&sub, STRATA_EPROTO,
                                     "topk: index %" PRIu32 " at %zu is out of range",
                                     c->indices[j], j);
            else if (j > 0 && c->indices[j] <= c->indices[j - 1])
                rc = strata_diag_set(&sub, STRATA_EPROTO,
                                     "topk: index %" PRIu32 " at %zu is not above the previous",
                                     c->indices[j], j);
        }
        if (rc == STRATA_OK)
            rc = check_sparse_values(c, slot, &sub);
        break;
    case STRATA_COMP_RANDK:
        if (c->count > c->numel) {
            rc = strata_diag_set(&sub, STRATA_EPROTO, "randk: count %" PRIu64 " exceeds numel",
                                 c->count);
            break;
        }
        if (c->count > 0 && c->values == NULL) {
            rc = strata_diag_set(&sub, STRATA_EPROTO, "randk: values missing");
            break;
        }
        rc = check_sparse_values(c, slot, &sub);
        if (rc == STRATA_OK) {
            rc = strata_randk_indices(c->seed, c->numel, c->count, slot);
            if (rc < 0)
                strata_diag_set(&sub, rc, "randk: regenerating the indices failed");
        }
        break;
    default:
        rc = strata_clayer_decode(c, slot, &sub);
        break;
    }
    if (rc < 0)
        return strata_diag_set(diag, rc, "layer %zu (%s): %s", i, name, strata_diag_msg(&sub, rc));
    return STRATA_OK;
}

double strata__agg_layer_sqnorm(const strata_clayer *c, const void *slot, size_t numel)
{
    double sq = 0.0;
    if (c->comp == STRATA_COMP_TOPK || c->comp == STRATA_COMP_RANDK) {
        for (size_t j = 0; j < c->count; j++)
            sq += (double)c->values[j] * (double)c->values[j];
    } else {
        const float *v = slot;
        for (size_t j = 0; j < numel; j++)
            sq += (double)v[j] * (double)v[j];
    }
    return sq;
}

int strata__agg_clip_check(double max_norm, strata_diag *diag)
{
    if (!(max_norm >= 0.0))
        return strata_diag_set(diag, STRATA_EINVAL,
                               "clipping: max norm %g is not >= 0 (0 disables clipping)", max_norm);
    return STRATA_OK;
}

double strata__agg_clip_scale(double norm, double max_norm)
{
    return max_norm > 0.0 && norm > max_norm ? max_norm / norm : 1.0;
}

int strata_agg_add(strata_agg *agg, const strata_clayer *layers, size_t n, double weight,
                   strata_diag *diag)
{
    return strata_agg_add_clipped(agg, layers, n, weight, 0.0, NULL, diag);
}

int strata_agg_add_clipped(strata_agg *agg, const strata_clayer *layers, size_t n, double weight,
                           double max_norm, double *norm_out, strata_diag *diag)
{
    if (norm_out != NULL)
        *norm_out = 0.0;
    if (agg == NULL || (layers == NULL && n > 0))
        return strata_diag_set(diag, STRATA_EINVAL, "aggregate: NULL argument");
    if (!(weight > 0.0 && weight <= STRATA_AGG_MAX_WEIGHT))
        return strata_diag_set(diag, STRATA_EINVAL, "aggregate: weight %g is not in (0, %g]",
                               weight, STRATA_AGG_MAX_WEIGHT);
    int rc = strata__agg_clip_check(max_norm, diag);
    if (rc < 0)
        return rc;
    if (n != agg->lay.count)
        return strata_diag_set(diag, STRATA_EPROTO, "update has %zu layers, the model has %zu", n,
                               agg->lay.count);
    /* Pass 1: check every layer, decoding into the scratch; nothing changes. */
    float *scratch = agg->scratch;
    for (size_t i = 0; i < n; i++) {
        const strata__layout_entry *e = &agg->lay.items[i];
        rc = strata__agg_layer_prepare(i, e->name, e->numel, &layers[i], scratch + e->offset, diag);
        if (rc < 0)
            return rc;
    }
    /* The update's L2 norm over all layers, only when someone needs it. */
    double scale = 1.0;
    if (max_norm > 0.0 || norm_out != NULL) {
        double sq = 0.0;
        for (size_t i = 0; i < n; i++) {
            const strata__layout_entry *e = &agg->lay.items[i];
            sq += strata__agg_layer_sqnorm(&layers[i], scratch + e->offset, e->numel);
        }
        const double norm = sqrt(sq);
        scale = strata__agg_clip_scale(norm, max_norm);
        if (norm_out != NULL)
            *norm_out = norm;
    }
    /* Pass 2: accumulate; cannot fail. */
    const double ws = weight * scale;
    for (size_t i = 0; i < n; i++) {
        const strata__layout_entry *e = &agg->lay.items[i];
        const strata_clayer *c = &layers[i];
        double *acc = agg->acc + e->offset;
        const size_t k = (size_t)c->count;
        if (c->comp == STRATA_COMP_TOPK || c->comp == STRATA_COMP_RANDK) {
            const uint32_t *idx =
                c->comp == STRATA_COMP_TOPK ? c->indices : (const uint32_t *)(scratch + e->offset);
            for (size_t j = 0; j < k; j++)
                acc[idx[j]] += ws * (double)c->values[j];
        } else {
            const float *v = scratch + e->offset;
            for (size_t j = 0; j < e->numel; j++)
                acc[j] += ws * (double)v[j];
        }
    }
    agg->count++;
    agg->total_weight += weight;
    return STRATA_OK;
}

uint64_t strata_agg_count(const strata_agg *agg)
{
    return agg != NULL ? agg->count : 0;
}

double strata_agg_total_weight(const strata_agg *agg)
{
    return agg != NULL ? agg->total_weight : 0.0;
}

int strata_agg_mean(const strata_agg *agg, strata_tensor_list *delta_out, strata_diag *diag)
{
    if (agg == NULL || delta_out == NULL)
        return strata_diag_set(diag, STRATA_EINVAL, "aggregate mean: NULL argument");
    if (agg->count == 0)
        return strata_diag_set(diag, STRATA_ESTATE, "aggregate mean: no update was accepted");
    int rc = strata__layout_match(&agg->lay, delta_out, "mean output", diag);
    if (rc < 0)
        return rc;
    const double inv = 1.0 / agg->total_weight;
    for (size_t i = 0; i < agg->lay.count; i++) {
        const strata__layout_entry *e = &agg->lay.items[i];
        const double *acc = agg->acc + e->offset;
        float *out = delta_out->items[i].data;
        for (size_t j = 0; j < e->numel; j++)
            out[j] = (float)(acc[j] * inv);
    }
    return STRATA_OK;
}

void strata_agg_reset(strata_agg *agg)
{
    if (agg == NULL)
        return;
    memset(agg->acc, 0, agg->lay.total * sizeof(double));
    agg->count = 0;
    agg->total_weight = 0.0;
}

size_t strata_agg_memory_bytes(const strata_agg *agg)
{
    return agg != NULL ? agg->bytes : 0;
}
