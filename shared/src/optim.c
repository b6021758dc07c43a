#include "strata/optim.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

struct strata_sgd {
    strata_sgd_config cfg;
    strata_tensor_list velocity;
    const strata_tensor_list *anchor;
    size_t steps;
};

int strata_sgd_new(const strata_tensor_list *params, const strata_sgd_config *cfg, strata_sgd **out,
                   strata_diag *diag)
{
    *out = NULL;
    if (!(cfg->lr > 0.0f) || !isfinite(cfg->lr))
        return strata_diag_set(diag, STRATA_EINVAL, "lr: must be a positive number");
    if (!(cfg->momentum >= 0.0f && cfg->momentum < 1.0f))
        return strata_diag_set(diag, STRATA_EINVAL, "momentum: must be in [0, 1)");
    if (!(cfg->weight_decay >= 0.0f) || !isfinite(cfg->weight_decay))
        return strata_diag_set(diag, STRATA_EINVAL, "weight_decay: must be >= 0");
    if (!(cfg->prox_mu >= 0.0f) || !isfinite(cfg->prox_mu))
        return strata_diag_set(diag, STRATA_EINVAL, "prox_mu: must be >= 0");
    if (cfg->nesterov && cfg->momentum == 0.0f)
        return strata_diag_set(diag, STRATA_EINVAL, "nesterov: needs momentum > 0");
    strata_sgd *o = calloc(1, sizeof(*o));
    if (o == NULL)
        return STRATA_ENOMEM;
    o->cfg = *cfg;
    strata_tensor_list_init(&o->velocity);
    if (cfg->momentum > 0.0f) {
        int rc = strata_tensor_list_zeros_like(&o->velocity, params);
        if (rc < 0) {
            free(o);
            return rc;
        }
    }
    *out = o;
    return STRATA_OK;
}

void strata_sgd_free(strata_sgd *o)
{
    if (o == NULL)
        return;
    strata_tensor_list_cleanup(&o->velocity);
    free(o);
}

int strata_sgd_set_anchor(strata_sgd *o, const strata_tensor_list *anchor)
{
    o->anchor = anchor;
    return STRATA_OK;
}

double strata_cosine_schedule(double from, double to, uint64_t t, uint64_t T)
{
    if (T == 0)
        return to;
    if (t > T)
        t = T;
    return to + (from - to) * 0.5 * (1.0 + cos(3.14159265358979323846 * (double)t / (double)T));
}

float strata_sgd_current_lr(const strata_sgd *o)
{
    if (o->cfg.decay_steps == 0)
        return o->cfg.lr;
    return (float)strata_cosine_schedule(o->cfg.lr, 0.0, o->steps, o->cfg.decay_steps);
}

void strata_sgd_reset(strata_sgd *o)
{
    o->steps = 0;
    for (size_t i = 0; i < o->velocity.count; i++)
        memset(o->velocity.items[i].data, 0, o->velocity.items[i].numel * sizeof(float));
}

int strata_sgd_step(strata_sgd *o, strata_tensor_list *params, const strata_tensor_list *grads)
{
    if (params->count != grads->count ||
        (o->velocity.count != 0 && o->velocity.count != params->count) ||
        (o->anchor != NULL && o->anchor->count != params->count))
        return STRATA_EINVAL;
    const float lr = strata_sgd_current_lr(o), mom = o->cfg.momentum, wd = o->cfg.weight_decay;
    const float mu = o->anchor ? o->cfg.prox_mu : 0.0f;
    const int nesterov = o->cfg.nesterov;
    for (size_t t = 0; t < params->count; t++) {
        float *w = params->items[t].data;
        const float *g = grads->items[t].data;
        float *v = mom > 0.0f ? o->velocity.items[t].data : NULL;
        const float *a = mu > 0.0f ? o->anchor->items[t].data : NULL;
        const size_t n = params->items[t].numel;
        if (grads->items[t].numel != n)
            return STRATA_EINVAL;
#pragma omp parallel for schedule(static) if (n > 65536)
        for (size_t i = 0; i < n; i++) {
            float d = g[i];
            if (wd != 0.0f)
                d += wd * w[i];
            if (a != NULL)
                d += mu * (w[i] - a[i]);
            if (v != NULL) {
                v[i] = mom * v[i] + d;
                d = nesterov ? d + mom * v[i] : v[i];
            }
            w[i] -= lr * d;
        }
    }
    o->steps++;
    return STRATA_OK;
}
