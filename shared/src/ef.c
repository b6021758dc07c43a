/* Per-layer error feedback with staleness decay (see strata/ef.h). */
#include "strata/ef.h"

#include "compress_internal.h"
#include "strata/rng.h"
#include "strata/safetensors.h"

#include <errno.h>
#include <float.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const strata_opt strata_ef_opt_rows[] = {
    {"ef_beta", STRATA_OPT_DOUBLE, offsetof(strata_ef_opts, beta), DBL_TRUE_MIN, 1, "B",
     "scale the residual by B per missed round, (0, 1] (default 1)"},
    {"ef_max_staleness", STRATA_OPT_INTEGER, offsetof(strata_ef_opts, max_staleness), 0,
     STRATA_EF_MAX_STALENESS_MAX, "N",
     "drop the residual after N missed rounds (default 0: never)"},
};

#define META_VERSION "strata.ef.version"
#define META_ROUND "strata.ef.last_round"
#define META_BETA "strata.ef.beta"
#define META_STALE "strata.ef.max_staleness"

/* PowerSGD warm start of one layer: Q is cols x rank. */
typedef struct ef_q {
    float *q;
    uint32_t cols, rank;
} ef_q;

struct strata_ef {
    strata_tensor_list res;  /* residuals */
    strata_tensor_list next; /* scratch: a step's new residuals until commit */
    ef_q *q;                 /* res.count entries */
    double beta;
    uint32_t max_staleness;
    int has_round;
    uint32_t last_round;
};

int strata_ef_configure(strata_ef *ef, double beta, uint32_t max_staleness, int *changed)
{
    if (changed != NULL)
        *changed = 0;
    if (ef == NULL || !(beta > 0.0 && beta <= 1.0))
        return STRATA_EINVAL;
    if (changed != NULL)
        *changed = ef->beta != beta || ef->max_staleness != max_staleness;
    ef->beta = beta;
    ef->max_staleness = max_staleness;
    return STRATA_OK;
}

void strata_ef_free(strata_ef *ef)
{
    if (ef == NULL)
        return;
    if (ef->q != NULL)
        for (size_t i = 0; i < ef->res.count; i++)
            free(ef->q[i].q);
    free(ef->q);
    strata_tensor_list_cleanup(&ef->res);
    strata_tensor_list_cleanup(&ef->next);
    free(ef);
}

int strata_ef_new(const strata_tensor_list *layout, double beta, uint32_t max_staleness,
                  strata_ef **out)
{
    if (out != NULL)
        *out = NULL;
    if (layout == NULL || out == NULL || !(beta > 0.0 && beta <= 1.0))
        return STRATA_EINVAL;
    strata_ef *ef = calloc(1, sizeof(*ef));
    if (ef == NULL)
        return STRATA_ENOMEM;
    strata_tensor_list_init(&ef->res);
    strata_tensor_list_init(&ef->next);
    ef->beta = beta;
    ef->max_staleness = max_staleness;
    int rc = strata_tensor_list_zeros_like(&ef->res, layout);
    if (rc == STRATA_OK)
        rc = strata_tensor_list_zeros_like(&ef->next, layout);
    if (rc == STRATA_OK && layout->count > 0) {
        ef->q = calloc(layout->count, sizeof(ef_q));
        if (ef->q == NULL)
            rc = STRATA_ENOMEM;
    }
    if (rc < 0) {
        strata_ef_free(ef);
        return rc;
    }
    *out = ef;
    return STRATA_OK;
}

static uint64_t layer_seed(uint64_t seed, size_t layer)
{
    return strata_mix64(seed + 0x9e3779b97f4a7c15ULL * ((uint64_t)layer + 1));
}

/* The staleness decay of a step for round (see the file comment) and the
 * matching way of forming a. STRATA_ESTATE when round is not after the last
 * step's. */
static int step_decay(const strata_ef *ef, uint32_t round, float *decay, strata__topk_mode *mode,
                      strata_diag *diag)
{
    if (ef->has_round && round <= ef->last_round)
        return strata_diag_set(diag, STRATA_ESTATE,
                               "ef step: round %u is not after the last round %u", round,
                               ef->last_round);
    uint32_t missed = ef->has_round ? round - ef->last_round - 1 : 0;
    int drop = ef->max_staleness > 0 && missed > ef->max_staleness;
    *decay = drop ? 0.0f : (float)pow(ef->beta, (double)missed);
    *mode = *decay == 0.0f   ? STRATA__TOPK_COPY
            : *decay == 1.0f ? STRATA__TOPK_ADD
                             : STRATA__TOPK_SCALE;
    return STRATA_OK;
}

/* Makes an unbiased quantiser's output a contraction before error feedback
 * sees it: QSGD with s levels on n elements has variance E||C(a) - a||^2 <=
 * w ||a||^2 with w = min(n / s^2, sqrt(n) / s), which is above ||a||^2 for
 * any large layer, and feeding that error back makes the residual grow
 * without bound. Sending C(a) / (1 + w) instead (the scale of the QSGD
 * layer, so the wire format is unchanged) leaves an expected error of
 * ||a||^2 w / (1 + w) < ||a||^2, and error feedback carries the rest. */
static void ef_contract(strata_clayer *c)
{
    if (c->comp != STRATA_COMP_QSGD || c->levels == 0)
        return;
    double n = (double)c->numel, s = (double)c->levels;
    double w = fmin(n / (s * s), sqrt(n) / s);
    c->scale = (float)((double)c->scale / (1.0 + w));
}

/* Compresses one layer: a into nx, C(a) into c, nx becomes e_new. A new
 * PowerSGD Q (owned by the caller) goes to *q_new. */
static int step_layer(const strata_ef *ef, size_t l, const strata_tensor *d, const strata_budget *b,
                      strata_values_format vf, strata__topk_mode mode, float decay, uint64_t seed,
                      strata_clayer *c, float **q_new, strata_diag *diag)
{
    const strata_tensor *e = &ef->res.items[l];
    float *nx = ef->next.items[l].data;
    const size_t n = d->numel;
    int rc;
    if (n > STRATA_CLAYER_MAX_NUMEL)
        return strata_diag_set(diag, STRATA_ETOOBIG, "tensor %s: %zu elements exceed the limit",
                               d->name, n);
    c->numel = n;
    if (b->comp == STRATA_COMP_TOPK) {
        strata__topk_in in = {mode, d->data, e->data, decay, nx};
        rc = strata__clayer_topk(&in, n, b->density, vf, seed, c);
        if (rc == STRATA_EINVAL)
            return strata_diag_set(diag, rc, "tensor %s: the update has a NaN or infinite value",
                                   d->name);
        return rc;
    }
    const float *src = d->data, *ev = e->data;
    switch (mode) {
    case STRATA__TOPK_ADD:
        for (size_t i = 0; i < n; i++)
            nx[i] = (ev[i] + src[i]) + 0.0f;
        break;
    case STRATA__TOPK_SCALE:
        for (size_t i = 0; i < n; i++)
            nx[i] = (decay * ev[i] + src[i]) + 0.0f;
        break;
    default:
        for (size_t i = 0; i < n; i++)
            nx[i] = src[i] + 0.0f;
        break;
    }
    vf = strata_values_format_for(b->comp, vf);
    const ef_q *wq = &ef->q[l];
    const float *q_warm = NULL;
    if (b->comp == STRATA_COMP_POWERSGD && wq->q != NULL) {
        uint32_t rows, cols, rank;
        if (strata_powersgd_dims(d->ndim, d->shape, b->rank, &rows, &cols, &rank) == STRATA_OK &&
            cols == wq->cols && rank == wq->rank)
            q_warm = wq->q;
    }
    strata_diag cd = {{0}};
    rc = strata_compress(nx, n, d->ndim, d->shape, b, vf, seed, q_warm, c, &cd);
    if (rc < 0)
        return strata_diag_set(diag, rc, "tensor %s: %s", d->name, strata_diag_msg(&cd, rc));
    ef_contract(c);
    float *dec = malloc(n * sizeof(float));
    if (dec == NULL)
        return STRATA_ENOMEM;
    rc = strata_clayer_decode(c, dec, diag);
    if (rc == STRATA_OK) {
        for (size_t i = 0; i < n; i++)
            nx[i] = nx[i] - dec[i];
        if (c->comp == STRATA_COMP_POWERSGD) {
            size_t qn = (size_t)c->cols * c->rank;
            *q_new = malloc(qn * sizeof(float));
            if (*q_new == NULL)
                rc = STRATA_ENOMEM;
            else
                memcpy(*q_new, strata_clayer_powersgd_q(c), qn * sizeof(float));
        }
    }
    free(dec);
    return rc;
}

int strata_ef_step(strata_ef *ef, const strata_tensor_list *delta, const strata_budget *budgets,
                   uint32_t round, uint64_t seed, strata_clayer **out_layers, strata_diag *diag)
{
    if (out_layers != NULL)
        *out_layers = NULL;
    if (ef == NULL || delta == NULL || (delta->count > 0 && budgets == NULL) || out_layers == NULL)
        return strata_diag_set(diag, STRATA_EINVAL, "ef step: NULL argument");
    if (!strata_tensor_list_same_layout(delta, &ef->res))
        return strata_diag_set(diag, STRATA_EINVAL,
                               "ef step: the update's tensors do not match the residuals");
    for (size_t l = 0; l < delta->count; l++) {
        strata_diag bd = {{0}};
        int rc = strata_budget_check(&budgets[l], &bd);
        if (rc < 0)
            return strata_diag_set(diag, rc, "tensor %s: %s", delta->items[l].name, bd.msg);
    }
    float decay = 1.0f;
    strata__topk_mode mode = STRATA__TOPK_ADD;
    int rc0 = step_decay(ef, round, &decay, &mode, diag);
    if (rc0 < 0)
        return rc0;

    const size_t count = delta->count;
    strata_clayer *layers = calloc(count > 0 ? count : 1, sizeof(strata_clayer));
    float **q_new = calloc(count > 0 ? count : 1, sizeof(float *));
    int rc = STRATA_ENOMEM;
    if (layers == NULL || q_new == NULL) {
        strata_diag_set(diag, rc, "ef step: out of memory");
        goto out;
    }
    for (size_t l = 0; l < count; l++) {
        rc = step_layer(ef, l, &delta->items[l], &budgets[l], budgets[l].values, mode, decay,
                        layer_seed(seed, l), &layers[l], &q_new[l], diag);
        if (rc < 0) {
            if (rc == STRATA_ENOMEM)
                strata_diag_set(diag, rc, "tensor %s: out of memory", delta->items[l].name);
            goto out;
        }
        layers[l].layer_index = (uint32_t)l;
    }
    /* Commit: swap in the new residuals and warm-start factors. */
    for (size_t l = 0; l < count; l++) {
        float *t = ef->res.items[l].data;
        ef->res.items[l].data = ef->next.items[l].data;
        ef->next.items[l].data = t;
        if (q_new[l] != NULL) {
            free(ef->q[l].q);
            ef->q[l].q = q_new[l];
            ef->q[l].cols = layers[l].cols;
            ef->q[l].rank = layers[l].rank;
            q_new[l] = NULL;
        }
    }
    ef->has_round = 1;
    ef->last_round = round;
    *out_layers = layers;
    layers = NULL;
    rc = STRATA_OK;
out:
    if (q_new != NULL)
        for (size_t l = 0; l < count; l++)
            free(q_new[l]);
    free(q_new);
    strata_clayers_free(layers, count);
    return rc;
}

/* Squared errors of the ncand candidates on the n floats of a, one tensor
 * of the layout (ndim, shape), to err[0..ncand). dec is scratch (n). */
static int table_layer(const strata_ef *ef, size_t l, const float *a, size_t n, int ndim,
                       const int64_t *shape, uint64_t seed, const strata_budget *cand, size_t ncand,
                       float *dec, double *err, strata_diag *diag)
{
    for (size_t c = 0; c < ncand; c++) {
        const float *q_warm = NULL;
        const ef_q *wq = &ef->q[l];
        if (cand[c].comp == STRATA_COMP_POWERSGD && wq->q != NULL) {
            uint32_t rows, cols, rank;
            if (strata_powersgd_dims(ndim, shape, cand[c].rank, &rows, &cols, &rank) == STRATA_OK &&
                cols == wq->cols && rank == wq->rank)
                q_warm = wq->q;
        }
        strata_clayer cl;
        strata_diag cd = {{0}};
        int rc =
            strata_compress(a, n, ndim, shape, &cand[c], cand[c].values, seed, q_warm, &cl, &cd);
        if (rc == STRATA_OK) {
            ef_contract(&cl);
            rc = strata_clayer_decode(&cl, dec, &cd);
        }
        strata_clayer_cleanup(&cl);
        if (rc < 0)
            return strata_diag_set(diag, rc, "candidate %zu: %s", c, strata_diag_msg(&cd, rc));
        double s = 0.0;
        for (size_t i = 0; i < n; i++) {
            double d = (double)a[i] - (double)dec[i];
            s += d * d;
        }
        err[c] = s;
    }
    return STRATA_OK;
}

int strata_ef_error_table(strata_ef *ef, const strata_tensor_list *delta, uint32_t round,
                          uint64_t seed, const strata_budget *cand, size_t ncand, double *err,
                          strata_diag *diag)
{
    if (ef == NULL || delta == NULL || (ncand > 0 && cand == NULL) ||
        (delta->count > 0 && ncand > 0 && err == NULL))
        return strata_diag_set(diag, STRATA_EINVAL, "error table: NULL argument");
    if (!strata_tensor_list_same_layout(delta, &ef->res))
        return strata_diag_set(diag, STRATA_EINVAL,
                               "error table: the update's tensors do not match the residuals");
    for (size_t c = 0; c < ncand; c++) {
        strata_diag bd = {{0}};
        int rc = strata_budget_check(&cand[c], &bd);
        if (rc < 0)
            return strata_diag_set(diag, rc, "error table: candidate %zu: %s", c, bd.msg);
    }
    float decay = 1.0f;
    strata__topk_mode mode = STRATA__TOPK_ADD;
    int rc = step_decay(ef, round, &decay, &mode, diag);
    if (rc < 0 || ncand == 0)
        return rc;
    float *dec = NULL;
    for (size_t l = 0; l < delta->count; l++) {
        const strata_tensor *d = &delta->items[l];
        const float *ev = ef->res.items[l].data, *src = d->data;
        float *a = ef->next.items[l].data; /* scratch until the next step */
        const size_t n = d->numel;
        for (size_t i = 0; i < n; i++)
            a[i] = mode == STRATA__TOPK_COPY  ? src[i] + 0.0f
                   : mode == STRATA__TOPK_ADD ? (ev[i] + src[i]) + 0.0f
                                              : (decay * ev[i] + src[i]) + 0.0f;
        float *grown = realloc(dec, (n > 0 ? n : 1) * sizeof(float));
        if (grown == NULL) {
            rc = strata_diag_set(diag, STRATA_ENOMEM, "error table: out of memory");
            break;
        }
        dec = grown;
        strata_diag ld = {{0}};
        rc = table_layer(ef, l, a, n, d->ndim, d->shape, layer_seed(seed, l), cand, ncand, dec,
                         err + l * ncand, &ld);
        if (rc < 0) {
            strata_diag_set(diag, rc, "tensor %s: %s", d->name, strata_diag_msg(&ld, rc));
            break;
        }
    }
    free(dec);
    return rc;
}

const strata_tensor_list *strata_ef_residuals(const strata_ef *ef)
{
    return ef != NULL ? &ef->res : NULL;
}

int strata_ef_residual_norms(const strata_ef *ef, double *norms, size_t n)
{
    if (ef == NULL || n != ef->res.count || (n > 0 && norms == NULL))
        return STRATA_EINVAL;
    for (size_t l = 0; l < n; l++) {
        const strata_tensor *t = &ef->res.items[l];
        double s = 0.0;
        for (size_t i = 0; i < t->numel; i++)
            s += (double)t->data[i] * (double)t->data[i];
        norms[l] = sqrt(s);
    }
    return STRATA_OK;
}

int strata_ef_last_round(const strata_ef *ef, uint32_t *round)
{
    if (round != NULL)
        *round = 0;
    if (ef == NULL || round == NULL)
        return STRATA_EINVAL;
    if (!ef->has_round)
        return STRATA_ESTATE;
    *round = ef->last_round;
    return STRATA_OK;
}

int strata_ef_save(const strata_ef *ef, const char *path, strata_diag *diag)
{
    if (ef == NULL || path == NULL)
        return strata_diag_set(diag, STRATA_EINVAL, "ef save: NULL argument");
    strata_metadata meta;
    strata_metadata_init(&meta);
    char round[32], beta[40], stale[32];
    if (ef->has_round)
        snprintf(round, sizeof(round), "%" PRIu32, ef->last_round);
    else
        snprintf(round, sizeof(round), "none");
    snprintf(beta, sizeof(beta), "%.17g", ef->beta);
    snprintf(stale, sizeof(stale), "%" PRIu32, ef->max_staleness);
    int rc = strata_metadata_set(&meta, META_VERSION, "1");
    if (rc == STRATA_OK)
        rc = strata_metadata_set(&meta, META_ROUND, round);
    if (rc == STRATA_OK)
        rc = strata_metadata_set(&meta, META_BETA, beta);
    if (rc == STRATA_OK)
        rc = strata_metadata_set(&meta, META_STALE, stale);
    if (rc == STRATA_OK)
        rc = strata_safetensors_write(path, &ef->res, &meta, diag);
    else
        strata_diag_set(diag, rc, "ef save: building metadata failed");
    strata_metadata_cleanup(&meta);
    return rc;
}

/* Parses a decimal uint32 that fills the whole string. */
static int parse_u32(const char *s, uint32_t *out)
{
    if (s == NULL || *s < '0' || *s > '9')
        return -1;
    errno = 0;
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno != 0 || *end != '\0' || v > UINT32_MAX)
        return -1;
    *out = (uint32_t)v;
    return 0;
}

int strata_ef_load(const char *path, const strata_tensor_list *layout, strata_ef **out,
                   strata_diag *diag)
{
    if (out != NULL)
        *out = NULL;
    if (path == NULL || layout == NULL || out == NULL)
        return strata_diag_set(diag, STRATA_EINVAL, "ef load: NULL argument");
    strata_tensor_list file;
    strata_metadata meta;
    strata_tensor_list_init(&file);
    strata_metadata_init(&meta);
    strata_ef *ef = NULL;
    int rc = strata_safetensors_read(path, 0, &file, &meta, diag);
    if (rc < 0)
        goto out;

    rc = STRATA_EPROTO;
    const char *ver = strata_metadata_get(&meta, META_VERSION);
    const char *rs = strata_metadata_get(&meta, META_ROUND);
    const char *bs = strata_metadata_get(&meta, META_BETA);
    const char *ss = strata_metadata_get(&meta, META_STALE);
    if (ver == NULL || strcmp(ver, "1") != 0) {
        strata_diag_set(diag, rc, "%s: not an error-feedback file (%s is %s)", path, META_VERSION,
                        ver != NULL ? ver : "missing");
        goto out;
    }
    uint32_t round = 0, stale = 0;
    int has_round = rs != NULL && strcmp(rs, "none") != 0;
    if (rs == NULL || (has_round && parse_u32(rs, &round) < 0)) {
        strata_diag_set(diag, rc, "%s: bad or missing %s", path, META_ROUND);
        goto out;
    }
    if (parse_u32(ss, &stale) < 0) {
        strata_diag_set(diag, rc, "%s: bad or missing %s", path, META_STALE);
        goto out;
    }
    char *end = NULL;
    double beta = bs != NULL ? strtod(bs, &end) : 0.0;
    if (bs == NULL || end == bs || *end != '\0' || !(beta > 0.0 && beta <= 1.0)) {
        strata_diag_set(diag, rc, "%s: bad or missing %s", path, META_BETA);
        goto out;
    }

    rc = STRATA_EINVAL;
    if (file.count != layout->count) {
        strata_diag_set(diag, rc, "%s: %zu residual tensors, the model has %zu", path, file.count,
                        layout->count);
        goto out;
    }
    for (size_t i = 0; i < file.count; i++) {
        const strata_tensor *f = &file.items[i], *m = &layout->items[i];
        int same = strcmp(f->name, m->name) == 0 && f->ndim == m->ndim;
        for (int d = 0; same && d < f->ndim; d++)
            same = f->shape[d] == m->shape[d];
        if (!same) {
            char fs[96], ms[96];
            strata_tensor_shape_str(f, fs, sizeof(fs));
            strata_tensor_shape_str(m, ms, sizeof(ms));
            strata_diag_set(diag, rc, "%s: tensor %zu is %s %s, the model has %s %s", path, i,
                            f->name, fs, m->name, ms);
            goto out;
        }
        for (size_t j = 0; j < f->numel; j++)
            if (!isfinite(f->data[j])) {
                rc = strata_diag_set(diag, STRATA_EPROTO, "%s: residual %s[%zu] is not finite",
                                     path, f->name, j);
                goto out;
            }
    }
    rc = strata_ef_new(layout, beta, stale, &ef);
    if (rc < 0) {
        strata_diag_set(diag, rc, "ef load: %s", strata_strerror(rc));
        goto out;
    }
    strata_tensor_list_copy_values(&ef->res, &file);
    ef->has_round = has_round;
    ef->last_round = round;
    *out = ef;
    ef = NULL;
    rc = STRATA_OK;
out:
    strata_ef_free(ef);
    strata_metadata_cleanup(&meta);
    strata_tensor_list_cleanup(&file);
    return rc;
}
