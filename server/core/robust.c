/* Coordinate-wise trimmed mean and median (see robust.h). */
#include "robust.h"

#include "aggregate.h"

#include <inttypes.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static const char *const method_names[] = {"fedavg", "trimmed-mean", "median"};
#define METHOD_COUNT (sizeof(method_names) / sizeof(method_names[0]))

/* Coordinates x updates below which a layer is reduced on one thread. */
#define PARALLEL_MIN_WORK ((size_t)1 << 16)

/* Coordinates gathered together from the rows of the scratch matrix. */
#define TILE ((size_t)32)

/* Ranges at most this long are finished by insertion sort. */
#define SELECT_SMALL 16

const char *strata_robust_name(strata_robust_method method)
{
    return (unsigned)method < METHOD_COUNT ? method_names[method] : "?";
}

int strata_robust_parse(const char *name, strata_robust_method *out, strata_diag *diag)
{
    if (name == NULL || out == NULL)
        return strata_diag_set(diag, STRATA_EINVAL, "aggregation rule: NULL argument");
    for (size_t i = 0; i < METHOD_COUNT; i++)
        if (strcmp(name, method_names[i]) == 0) {
            *out = (strata_robust_method)i;
            return STRATA_OK;
        }
    return strata_diag_set(diag, STRATA_EINVAL,
                           "unknown aggregation rule \"%s\" (fedavg, trimmed-mean, median)", name);
}

int strata_robust_check(strata_robust_method method, double trim_fraction, double clip_norm,
                        strata_diag *diag)
{
    if ((unsigned)method >= METHOD_COUNT)
        return strata_diag_set(diag, STRATA_EINVAL, "aggregation rule: unknown method %d",
                               (int)method);
    if (!(trim_fraction >= 0.0 && trim_fraction < 0.5))
        return strata_diag_set(diag, STRATA_EINVAL,
                               "trimmed mean: trim fraction %g is not in [0, 0.5)", trim_fraction);
    return strata__agg_clip_check(clip_norm, diag);
}

/* Checks the model layout (non-empty, every tensor named, 1 to
 * STRATA_CLAYER_MAX_NUMEL elements) and returns its largest tensor and its
 * total element count. */
static int layout_scan(const strata_tensor_list *layout, size_t *max_numel, size_t *total,
                       strata_diag *diag)
{
    *max_numel = 0;
    *total = 0;
    if (layout->count == 0 || layout->items == NULL)
        return strata_diag_set(diag, STRATA_EINVAL, "robust aggregation: empty model layout");
    for (size_t i = 0; i < layout->count; i++) {
        const strata_tensor *t = &layout->items[i];
        if (t->name == NULL || t->numel == 0 || (uint64_t)t->numel > STRATA_CLAYER_MAX_NUMEL)
            return strata_diag_set(diag, STRATA_EINVAL,
                                   "robust aggregation: layout tensor %zu is unnamed, empty or "
                                   "above %" PRIu64 " elements",
                                   i, STRATA_CLAYER_MAX_NUMEL);
        if (*total > SIZE_MAX - t->numel)
            return strata_diag_set(diag, STRATA_ETOOBIG, "robust aggregation: model too large");
        *total += t->numel;
        if (t->numel > *max_numel)
            *max_numel = t->numel;
    }
    return STRATA_OK;
}

/* Checks that every update has one layer per layout tensor. */
static int check_layer_counts(const strata_robust_update *updates, size_t n_updates, size_t nl,
                              strata_diag *diag)
{
    for (size_t u = 0; u < n_updates; u++) {
        if (updates[u].layers == NULL && updates[u].n_layers > 0)
            return strata_diag_set(diag, STRATA_EINVAL, "update %zu: NULL layers", u);
        if (updates[u].n_layers != nl)
            return strata_diag_set(diag, STRATA_EPROTO,
                                   "update %zu has %zu layers, the model has %zu", u,
                                   updates[u].n_layers, nl);
    }
    return STRATA_OK;
}

/* strata__agg_layer_prepare for layer i of update u, with the update named
 * in the message. */
static int prepare(const strata_tensor_list *layout, const strata_robust_update *up, size_t u,
                   size_t i, void *slot, strata_diag *diag)
{
    strata_diag sub = {{0}};
    const strata_tensor *t = &layout->items[i];
    int rc = strata__agg_layer_prepare(i, t->name, t->numel, &up->layers[i], slot, &sub);
    if (rc < 0)
        return strata_diag_set(diag, rc, "update %zu: %s", u, strata_diag_msg(&sub, rc));
    return STRATA_OK;
}

/* The L2 norm of every update into norms[n_updates]; slot holds max_numel
 * floats. Layer counts must have been checked. */
static int compute_norms(const strata_tensor_list *layout, const strata_robust_update *updates,
                         size_t n_updates, float *slot, double *norms, strata_diag *diag)
{
    for (size_t u = 0; u < n_updates; u++) {
        double sq = 0.0;
        for (size_t i = 0; i < layout->count; i++) {
            int rc = prepare(layout, &updates[u], u, i, slot, diag);
            if (rc < 0)
                return rc;
            sq += strata__agg_layer_sqnorm(&updates[u].layers[i], slot, layout->items[i].numel);
        }
        norms[u] = sqrt(sq);
    }
    return STRATA_OK;
}

int strata_robust_norms(const strata_tensor_list *layout, const strata_robust_update *updates,
                        size_t n_updates, double *norms_out, strata_diag *diag)
{
    if (norms_out != NULL)
        for (size_t u = 0; u < n_updates; u++)
            norms_out[u] = 0.0;
    if (layout == NULL || norms_out == NULL || (updates == NULL && n_updates > 0))
        return strata_diag_set(diag, STRATA_EINVAL, "update norms: NULL argument");
    size_t max_numel = 0, total = 0;
    int rc = layout_scan(layout, &max_numel, &total, diag);
    if (rc == STRATA_OK)
        rc = check_layer_counts(updates, n_updates, layout->count, diag);
    if (rc < 0)
        return rc;
    float *slot = malloc(max_numel * sizeof(float));
    if (slot == NULL)
        return strata_diag_set(diag, STRATA_ENOMEM, "update norms: out of memory");
    rc = compute_norms(layout, updates, n_updates, slot, norms_out, diag);
    if (rc < 0)
        for (size_t u = 0; u < n_updates; u++)
            norms_out[u] = 0.0;
    free(slot);
    return rc;
}

/* Decodes layer i of update u densely into row (the layer's numel floats):
 * the coordinates a sparse layer did not send become 0. idx holds max_numel
 * uint32 for RANDK index regeneration. */
static int decode_row(const strata_tensor_list *layout, const strata_robust_update *up, size_t u,
                      size_t i, float *row, uint32_t *idx, strata_diag *diag)
{
    const strata_clayer *c = &up->layers[i];
    const int randk = c->comp == STRATA_COMP_RANDK;
    int rc = prepare(layout, up, u, i, randk ? (void *)idx : (void *)row, diag);
    if (rc < 0)
        return rc;
    if (c->comp == STRATA_COMP_TOPK || randk) {
        const uint32_t *ix = randk ? idx : c->indices;
        memset(row, 0, layout->items[i].numel * sizeof(float));
        for (size_t j = 0; j < c->count; j++)
            row[ix[j]] = c->values[j];
    }
    return STRATA_OK;
}

/* ---- Order statistics ---- */

static int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void insertion_sort(double *v, size_t n)
{
    for (size_t i = 1; i < n; i++) {
        const double x = v[i];
        size_t j = i;
        for (; j > 0 && v[j - 1] > x; j--)
            v[j] = v[j - 1];
        v[j] = x;
    }
}

static double median3(double a, double b, double c)
{
    if (a > b) {
        const double t = a;
        a = b;
        b = t;
    }
    return c <= a ? a : (c >= b ? b : c);
}

/* Rearranges the n finite values at v so that v[k] holds the value of rank
 * k (0-based), no value before it is larger and none after it smaller.
 * Quickselect with a median-of-three pivot and a three-way partition (runs
 * of equal values, such as the zeros of sparse updates, cost one pass);
 * after about 2 log2(n) rounds without finishing, the remaining range is
 * sorted, which bounds the worst case at O(n log n). */
static void select_rank(double *v, size_t n, size_t k)
{
    size_t lo = 0, hi = n;
    int budget = 8;
    for (size_t m = n; m > 1; m >>= 1)
        budget += 2;
    while (hi - lo > SELECT_SMALL) {
        if (budget-- == 0) {
            qsort(v + lo, hi - lo, sizeof(double), cmp_double);
            return;
        }
        const double p = median3(v[lo], v[lo + (hi - lo) / 2], v[hi - 1]);
        size_t lt = lo, i = lo, gt = hi;
        while (i < gt) {
            const double x = v[i];
            if (x < p) {
                v[i++] = v[lt];
                v[lt++] = x;
            } else if (x > p) {
                v[i] = v[--gt];
                v[gt] = x;
            } else {
                i++;
            }
        }
        if (k < lt)
            hi = lt;
        else if (k >= gt)
            lo = gt;
        else
            return; /* v[lt..gt) all equal p */
    }
    insertion_sort(v + lo, hi - lo);
}

/* The trimmed mean (k dropped at each end) or the median of the n values at
 * v, which are reordered. */
static double reduce(double *v, size_t n, strata_robust_method method, size_t k)
{
    if (method == STRATA_ROBUST_MEDIAN) {
        const size_t h = n / 2;
        select_rank(v, n, h);
        if (n % 2 == 1)
            return v[h];
        double below = v[0];
        for (size_t j = 1; j < h; j++)
            below = v[j] > below ? v[j] : below;
        return 0.5 * (below + v[h]);
    }
    if (k > 0) {
        select_rank(v, n, k);                     /* ranks < k now before v[k] */
        select_rank(v + k, n - k, n - 1 - 2 * k); /* ranks > n-1-k after v[n-1-k] */
    }
    double sum = 0.0;
    for (size_t j = k; j < n - k; j++)
        sum += v[j];
    return sum / (double)(n - 2 * k);
}

/* Reduces one layer: rows holds n_updates rows of numel floats; scale[u]
 * multiplies row u. Coordinates go in tiles of TILE: each thread copies a
 * tile's columns, scaled, into its part of bufs (TILE * n_updates doubles
 * per thread, nthreads parts), reading every row sequentially, then reduces
 * each column there. */
static void reduce_layer(const float *rows, size_t numel, size_t n_updates, const double *scale,
                         strata_robust_method method, size_t k, double *bufs, int nthreads,
                         float *out)
{
    const int parallel = nthreads > 1 && numel * n_updates >= PARALLEL_MIN_WORK;
#pragma omp parallel num_threads(nthreads) if (parallel)
    {
        double *tile = bufs + (size_t)omp_get_thread_num() * TILE * n_updates;
#pragma omp for schedule(static)
        for (size_t j0 = 0; j0 < numel; j0 += TILE) {
            const size_t w = numel - j0 < TILE ? numel - j0 : TILE;
            for (size_t u = 0; u < n_updates; u++) {
                const float *r = rows + u * numel + j0;
                for (size_t b = 0; b < w; b++)
                    tile[b * n_updates + u] = scale[u] * (double)r[b];
            }
            for (size_t b = 0; b < w; b++)
                out[j0 + b] = (float)reduce(tile + b * n_updates, n_updates, method, k);
        }
    }
}

/* Checks that out has layout's names, shapes and order, and data. */
static int check_output(const strata_tensor_list *layout, const strata_tensor_list *out,
                        strata_diag *diag)
{
    if (out->count != layout->count)
        return strata_diag_set(diag, STRATA_EINVAL,
                               "robust aggregation: the output has %zu tensors, the model %zu",
                               out->count, layout->count);
    for (size_t i = 0; i < layout->count; i++) {
        const strata_tensor *t = &out->items[i], *e = &layout->items[i];
        if (!strata_tensor_has_layout(t, e->name, e->ndim, e->shape) || t->numel != e->numel ||
            t->data == NULL)
            return strata_diag_set(diag, STRATA_EINVAL,
                                   "robust aggregation: output tensor %zu (%s) does not match the "
                                   "model's %s",
                                   i, t->name != NULL ? t->name : "?", e->name);
    }
    return STRATA_OK;
}

int strata_robust_aggregate(const strata_tensor_list *layout, const strata_robust_update *updates,
                            size_t n_updates, strata_robust_method method, double trim_fraction,
                            double clip_norm, strata_tensor_list *delta_out, strata_diag *diag)
{
    if (layout == NULL || delta_out == NULL || (updates == NULL && n_updates > 0))
        return strata_diag_set(diag, STRATA_EINVAL, "robust aggregation: NULL argument");
    int rc = strata_robust_check(method, trim_fraction, clip_norm, diag);
    if (rc < 0)
        return rc;
    if (method == STRATA_ROBUST_FEDAVG)
        return strata_diag_set(diag, STRATA_EINVAL,
                               "robust aggregation: fedavg is streamed by strata_agg, not here");
    size_t max_numel = 0, total = 0;
    rc = layout_scan(layout, &max_numel, &total, diag);
    if (rc < 0)
        return rc;
    rc = check_output(layout, delta_out, diag);
    if (rc < 0)
        return rc;
    const size_t k =
        method == STRATA_ROBUST_TRIMMED_MEAN ? (size_t)floor(trim_fraction * (double)n_updates) : 0;
    if (n_updates == 0)
        return strata_diag_set(diag, STRATA_EINVAL, "%s: no updates to aggregate",
                               strata_robust_name(method));
    if (2 * k >= n_updates)
        return strata_diag_set(diag, STRATA_EINVAL,
                               "%s: trimming %zu of %zu updates at each end leaves none",
                               strata_robust_name(method), k, n_updates);
    rc = check_layer_counts(updates, n_updates, layout->count, diag);
    if (rc < 0)
        return rc;

    const int nthreads = omp_get_max_threads() > 0 ? omp_get_max_threads() : 1;
    if (n_updates > SIZE_MAX / sizeof(float) / max_numel ||
        n_updates > SIZE_MAX / sizeof(double) / TILE / (size_t)nthreads ||
        total > SIZE_MAX / sizeof(float))
        return strata_diag_set(diag, STRATA_ETOOBIG,
                               "robust aggregation: %zu updates of up to %zu elements do not fit "
                               "in memory",
                               n_updates, max_numel);
    float *rows = malloc(n_updates * max_numel * sizeof(float));
    uint32_t *idx = malloc(max_numel * sizeof(uint32_t));
    double *bufs = malloc((size_t)nthreads * TILE * n_updates * sizeof(double));
    double *scale = malloc(n_updates * sizeof(double));
    float *stage = malloc(total * sizeof(float));
    if (rows == NULL || idx == NULL || bufs == NULL || scale == NULL || stage == NULL) {
        rc = strata_diag_set(diag, STRATA_ENOMEM, "robust aggregation: out of memory");
        goto out;
    }
    /* Clipping needs every norm before any coordinate is reduced. */
    for (size_t u = 0; u < n_updates; u++)
        scale[u] = 1.0;
    if (clip_norm > 0.0) {
        rc = compute_norms(layout, updates, n_updates, rows, scale, diag);
        if (rc < 0)
            goto out;
        for (size_t u = 0; u < n_updates; u++)
            scale[u] = strata__agg_clip_scale(scale[u], clip_norm);
    }
    size_t off = 0;
    for (size_t i = 0; i < layout->count; i++) {
        const size_t numel = layout->items[i].numel;
        for (size_t u = 0; u < n_updates; u++) {
            rc = decode_row(layout, &updates[u], u, i, rows + u * numel, idx, diag);
            if (rc < 0)
                goto out;
        }
        reduce_layer(rows, numel, n_updates, scale, method, k, bufs, nthreads, stage + off);
        off += numel;
    }
    off = 0;
    for (size_t i = 0; i < layout->count; i++) {
        memcpy(delta_out->items[i].data, stage + off, layout->items[i].numel * sizeof(float));
        off += layout->items[i].numel;
    }
    rc = STRATA_OK;
out:
    free(rows);
    free(idx);
    free(bufs);
    free(scale);
    free(stage);
    return rc;
}
