/* The server optimisers (see aggregate.h): plain, FedAvgM, FedAdam and
 * FedYogi, their state (copyable, so that a close steps a copy), its file
 * and the learning-rate schedule. */
#include "aggregate.h"
#include "layout.h"

#include "strata/optim.h"
#include "strata/safetensors.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- Server optimisers ---- */

#define META_VERSION "strata.server_opt.version"
#define META_TYPE "strata.server_opt.type"
#define META_STEPS "strata.server_opt.steps"

static const char *const opt_names[] = {"plain", "fedavgm", "fedadam", "fedyogi"};
#define OPT_TYPES (sizeof(opt_names) / sizeof(opt_names[0]))

struct strata_server_opt {
    strata__layout lay;
    strata_server_opt_config cfg;
    strata_tensor_list state; /* [m.* for Adam/Yogi] then v.* (none for plain) */
    float **m, **v;           /* per layer, into state; NULL when unused */
    uint64_t steps;
};

const char *strata_server_opt_name(strata_server_opt_type type)
{
    return (unsigned)type < OPT_TYPES ? opt_names[type] : "?";
}

void strata_server_opt_config_init(strata_server_opt_config *cfg, strata_server_opt_type type)
{
    if (cfg == NULL)
        return;
    int adaptive = type == STRATA_SERVER_OPT_FEDADAM || type == STRATA_SERVER_OPT_FEDYOGI;
    cfg->type = type;
    cfg->lr = adaptive ? 0.05 : 1.0;
    cfg->momentum = 0.5;
    cfg->beta1 = 0.0;
    cfg->beta2 = 0.99;
    cfg->tau = 0.01;
    cfg->lr_final = 0.0;
    cfg->horizon = 0;
}

int strata_server_opt_parse(const char *name, strata_server_opt_config *cfg, strata_diag *diag)
{
    if (name == NULL || cfg == NULL)
        return strata_diag_set(diag, STRATA_EINVAL, "server optimiser: NULL argument");
    for (size_t i = 0; i < OPT_TYPES; i++)
        if (strcmp(name, opt_names[i]) == 0) {
            strata_server_opt_config_init(cfg, (strata_server_opt_type)i);
            return STRATA_OK;
        }
    return strata_diag_set(diag, STRATA_EINVAL,
                           "unknown server optimiser \"%s\" (plain, fedavgm, fedadam, fedyogi)",
                           name);
}

int strata_server_opt_check(const strata_server_opt_config *cfg, strata_diag *diag)
{
    if (cfg == NULL)
        return strata_diag_set(diag, STRATA_EINVAL, "server optimiser: NULL config");
    if ((unsigned)cfg->type >= OPT_TYPES)
        return strata_diag_set(diag, STRATA_EINVAL, "server optimiser: unknown type %d",
                               (int)cfg->type);
    if (!(isfinite(cfg->lr) && cfg->lr > 0.0))
        return strata_diag_set(diag, STRATA_EINVAL,
                               "server optimiser: lr %g must be finite and > 0", cfg->lr);
    if (!(isfinite(cfg->lr_final) && cfg->lr_final >= 0.0))
        return strata_diag_set(diag, STRATA_EINVAL,
                               "server optimiser: final lr %g must be finite and >= 0",
                               cfg->lr_final);
    if (cfg->lr_final > 0.0 && cfg->horizon < 1)
        return strata_diag_set(diag, STRATA_EINVAL,
                               "server optimiser: a final lr needs a horizon of at least 1 step");
    if (cfg->type == STRATA_SERVER_OPT_FEDAVGM && !(cfg->momentum >= 0.0 && cfg->momentum < 1.0))
        return strata_diag_set(diag, STRATA_EINVAL, "fedavgm: momentum %g not in [0, 1)",
                               cfg->momentum);
    if (cfg->type == STRATA_SERVER_OPT_FEDADAM || cfg->type == STRATA_SERVER_OPT_FEDYOGI) {
        const char *n = opt_names[cfg->type];
        if (!(cfg->beta1 >= 0.0 && cfg->beta1 < 1.0))
            return strata_diag_set(diag, STRATA_EINVAL, "%s: beta1 %g not in [0, 1)", n,
                                   cfg->beta1);
        if (!(cfg->beta2 >= 0.0 && cfg->beta2 < 1.0))
            return strata_diag_set(diag, STRATA_EINVAL, "%s: beta2 %g not in [0, 1)", n,
                                   cfg->beta2);
        if (!(isfinite(cfg->tau) && cfg->tau > 0.0))
            return strata_diag_set(diag, STRATA_EINVAL, "%s: tau %g must be finite and > 0", n,
                                   cfg->tau);
    }
    return STRATA_OK;
}

void strata_server_opt_free(strata_server_opt *opt)
{
    if (opt == NULL)
        return;
    strata__layout_cleanup(&opt->lay);
    strata_tensor_list_cleanup(&opt->state);
    free(opt->m);
    free(opt->v);
    free(opt);
}

/* Appends one state tensor "<prefix><name>" shaped like e, filled with init. */
static int add_state(strata_server_opt *opt, const char *prefix, const strata__layout_entry *e,
                     float init, float **slot, strata_diag *diag)
{
    char name[STRATA_MAX_NAME];
    int len = snprintf(name, sizeof(name), "%s%s", prefix, e->name);
    if (len < 0 || (size_t)len >= sizeof(name))
        return strata_diag_set(diag, STRATA_EINVAL,
                               "server optimiser: tensor name %s is too long for its state",
                               e->name);
    int rc = strata_tensor_list_add(&opt->state, name, e->ndim, e->shape, NULL);
    if (rc < 0)
        return strata_diag_set(diag, rc, "server optimiser: state tensor %s: %s", name,
                               strata_strerror(rc));
    float *d = opt->state.items[opt->state.count - 1].data;
    for (size_t j = 0; j < e->numel; j++)
        d[j] = init;
    *slot = d;
    return STRATA_OK;
}

int strata_server_opt_new(const strata_tensor_list *layout_in, const strata_server_opt_config *cfg,
                          strata_server_opt **out, strata_diag *diag)
{
    if (out != NULL)
        *out = NULL;
    if (layout_in == NULL || cfg == NULL || out == NULL)
        return strata_diag_set(diag, STRATA_EINVAL, "server optimiser: NULL argument");
    int rc = strata_server_opt_check(cfg, diag);
    if (rc < 0)
        return rc;
    strata_server_opt *opt = calloc(1, sizeof(*opt));
    if (opt == NULL)
        return strata_diag_set(diag, STRATA_ENOMEM, "server optimiser: out of memory");
    strata_tensor_list_init(&opt->state);
    opt->cfg = *cfg;
    rc = strata__layout_copy(&opt->lay, layout_in);
    if (rc < 0) {
        strata_diag_set(diag, rc, "server optimiser: bad model layout (%s)", strata_strerror(rc));
        goto fail;
    }
    const size_t nl = opt->lay.count;
    const int adaptive =
        cfg->type == STRATA_SERVER_OPT_FEDADAM || cfg->type == STRATA_SERVER_OPT_FEDYOGI;
    if (adaptive) {
        opt->m = calloc(nl, sizeof(float *));
        if (opt->m == NULL) {
            rc = strata_diag_set(diag, STRATA_ENOMEM, "server optimiser: out of memory");
            goto fail;
        }
        for (size_t i = 0; i < nl; i++) {
            rc = add_state(opt, "m.", &opt->lay.items[i], 0.0f, &opt->m[i], diag);
            if (rc < 0)
                goto fail;
        }
    }
    if (cfg->type != STRATA_SERVER_OPT_PLAIN) {
        opt->v = calloc(nl, sizeof(float *));
        if (opt->v == NULL) {
            rc = strata_diag_set(diag, STRATA_ENOMEM, "server optimiser: out of memory");
            goto fail;
        }
        const float v0 = adaptive ? (float)(cfg->tau * cfg->tau) : 0.0f;
        for (size_t i = 0; i < nl; i++) {
            rc = add_state(opt, "v.", &opt->lay.items[i], v0, &opt->v[i], diag);
            if (rc < 0)
                goto fail;
        }
    }
    *out = opt;
    return STRATA_OK;
fail:
    strata_server_opt_free(opt);
    return rc;
}

int strata_server_opt_copy_state(strata_server_opt *dst, const strata_server_opt *src,
                                 strata_diag *diag)
{
    if (dst == NULL || src == NULL)
        return strata_diag_set(diag, STRATA_EINVAL, "server optimiser copy: NULL argument");
    if (dst->cfg.type != src->cfg.type)
        return strata_diag_set(diag, STRATA_EINVAL, "server optimiser copy: %s into %s",
                               strata_server_opt_name(src->cfg.type),
                               strata_server_opt_name(dst->cfg.type));
    if (dst->lay.count != src->lay.count || dst->state.count != src->state.count)
        return strata_diag_set(diag, STRATA_EINVAL, "server optimiser copy: another layout");
    for (size_t i = 0; i < dst->lay.count; i++) {
        const strata__layout_entry *a = &dst->lay.items[i], *b = &src->lay.items[i];
        if (strcmp(a->name, b->name) != 0 || a->ndim != b->ndim || a->numel != b->numel ||
            memcmp(a->shape, b->shape, (size_t)a->ndim * sizeof(a->shape[0])) != 0)
            return strata_diag_set(diag, STRATA_EINVAL,
                                   "server optimiser copy: tensor %zu is %s, not %s", i, b->name,
                                   a->name);
    }
    strata_tensor_list_copy_values(&dst->state, &src->state);
    dst->steps = src->steps;
    return STRATA_OK;
}

static double sign_of(double x)
{
    return x > 0.0 ? 1.0 : (x < 0.0 ? -1.0 : 0.0);
}

int strata_server_opt_step(strata_server_opt *opt, strata_tensor_list *params,
                           const strata_tensor_list *delta, strata_diag *diag)
{
    if (opt == NULL || params == NULL || delta == NULL)
        return strata_diag_set(diag, STRATA_EINVAL, "server step: NULL argument");
    int rc = strata__layout_match(&opt->lay, params, "server step: params", diag);
    if (rc == STRATA_OK)
        rc = strata__layout_match(&opt->lay, delta, "server step: delta", diag);
    if (rc < 0)
        return rc;
    for (size_t i = 0; i < opt->lay.count; i++) {
        const float *d = delta->items[i].data;
        for (size_t j = 0; j < opt->lay.items[i].numel; j++)
            if (!isfinite(d[j]))
                return strata_diag_set(diag, STRATA_EINVAL,
                                       "server step: delta %s[%zu] is NaN or infinite",
                                       opt->lay.items[i].name, j);
    }
    const strata_server_opt_config *c = &opt->cfg;
    const double lr = strata_server_opt_lr(opt);
    for (size_t i = 0; i < opt->lay.count; i++) {
        const size_t n = opt->lay.items[i].numel;
        const float *d = delta->items[i].data;
        float *w = params->items[i].data;
        switch (c->type) {
        case STRATA_SERVER_OPT_PLAIN:
            for (size_t j = 0; j < n; j++)
                w[j] = (float)((double)w[j] + lr * (double)d[j]);
            break;
        case STRATA_SERVER_OPT_FEDAVGM: {
            float *v = opt->v[i];
            for (size_t j = 0; j < n; j++) {
                v[j] = (float)(c->momentum * (double)v[j] + (double)d[j]);
                w[j] = (float)((double)w[j] + lr * (double)v[j]);
            }
            break;
        }
        case STRATA_SERVER_OPT_FEDADAM:
        case STRATA_SERVER_OPT_FEDYOGI: {
            float *m = opt->m[i], *v = opt->v[i];
            const int yogi = c->type == STRATA_SERVER_OPT_FEDYOGI;
            for (size_t j = 0; j < n; j++) {
                const double dj = d[j], d2 = dj * dj, vj = v[j];
                m[j] = (float)(c->beta1 * (double)m[j] + (1.0 - c->beta1) * dj);
                if (yogi)
                    v[j] = (float)(vj - (1.0 - c->beta2) * d2 * sign_of(vj - d2));
                else
                    v[j] = (float)(c->beta2 * vj + (1.0 - c->beta2) * d2);
                w[j] = (float)((double)w[j] + lr * (double)m[j] / (sqrt((double)v[j]) + c->tau));
            }
            break;
        }
        }
    }
    opt->steps++;
    return STRATA_OK;
}

double strata_server_opt_lr(const strata_server_opt *opt)
{
    if (opt == NULL)
        return 0.0;
    const strata_server_opt_config *c = &opt->cfg;
    if (c->lr_final <= 0.0)
        return c->lr;
    /* strata_server_opt_check keeps horizon >= 1 here. */
    return strata_cosine_schedule(c->lr, c->lr_final, opt->steps, c->horizon - 1);
}

uint64_t strata_server_opt_steps(const strata_server_opt *opt)
{
    return opt != NULL ? opt->steps : 0;
}

const strata_server_opt_config *strata_server_opt_get_config(const strata_server_opt *opt)
{
    return opt != NULL ? &opt->cfg : NULL;
}

int strata_server_opt_save(const strata_server_opt *opt, const char *path, strata_diag *diag)
{
    if (opt == NULL || path == NULL)
        return strata_diag_set(diag, STRATA_EINVAL, "server optimiser save: NULL argument");
    strata_metadata meta;
    strata_metadata_init(&meta);
    char steps[32], lr[40], mom[40], b1[40], b2[40], tau[40], lr_final[40], horizon[32];
    snprintf(steps, sizeof(steps), "%" PRIu64, opt->steps);
    snprintf(lr, sizeof(lr), "%.17g", opt->cfg.lr);
    snprintf(mom, sizeof(mom), "%.17g", opt->cfg.momentum);
    snprintf(b1, sizeof(b1), "%.17g", opt->cfg.beta1);
    snprintf(b2, sizeof(b2), "%.17g", opt->cfg.beta2);
    snprintf(tau, sizeof(tau), "%.17g", opt->cfg.tau);
    snprintf(lr_final, sizeof(lr_final), "%.17g", opt->cfg.lr_final);
    snprintf(horizon, sizeof(horizon), "%" PRIu64, opt->cfg.horizon);
    const char *kv[][2] = {
        {META_VERSION, "1"},
        {META_TYPE, strata_server_opt_name(opt->cfg.type)},
        {META_STEPS, steps},
        {"strata.server_opt.lr", lr},
        {"strata.server_opt.momentum", mom},
        {"strata.server_opt.beta1", b1},
        {"strata.server_opt.beta2", b2},
        {"strata.server_opt.tau", tau},
        {"strata.server_opt.lr_final", lr_final},
        {"strata.server_opt.horizon", horizon},
    };
    int rc = STRATA_OK;
    for (size_t i = 0; i < sizeof(kv) / sizeof(kv[0]) && rc == STRATA_OK; i++)
        rc = strata_metadata_set(&meta, kv[i][0], kv[i][1]);
    if (rc == STRATA_OK)
        rc = strata_safetensors_write(path, &opt->state, &meta, diag);
    else
        strata_diag_set(diag, rc, "server optimiser save: building metadata failed");
    strata_metadata_cleanup(&meta);
    return rc;
}

/* Parses a decimal uint64 that fills the whole string. */
static int parse_u64(const char *s, uint64_t *out)
{
    if (s == NULL || *s < '0' || *s > '9')
        return -1;
    errno = 0;
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno != 0 || *end != '\0')
        return -1;
    *out = (uint64_t)v;
    return 0;
}

int strata_server_opt_load(const char *path, const strata_tensor_list *layout_in,
                           const strata_server_opt_config *cfg, strata_server_opt **out,
                           strata_diag *diag)
{
    if (out != NULL)
        *out = NULL;
    if (path == NULL || layout_in == NULL || cfg == NULL || out == NULL)
        return strata_diag_set(diag, STRATA_EINVAL, "server optimiser load: NULL argument");
    strata_tensor_list file;
    strata_metadata meta;
    strata_tensor_list_init(&file);
    strata_metadata_init(&meta);
    strata_server_opt *opt = NULL;
    int rc = strata_server_opt_new(layout_in, cfg, &opt, diag);
    if (rc < 0)
        goto out;
    rc = strata_safetensors_read(path, 0, &file, &meta, diag);
    if (rc < 0)
        goto out;

    rc = STRATA_EPROTO;
    const char *ver = strata_metadata_get(&meta, META_VERSION);
    const char *type = strata_metadata_get(&meta, META_TYPE);
    uint64_t steps = 0;
    if (ver == NULL || strcmp(ver, "1") != 0) {
        strata_diag_set(diag, rc, "%s: not a server optimiser file (%s is %s)", path, META_VERSION,
                        ver != NULL ? ver : "missing");
        goto out;
    }
    if (type == NULL) {
        strata_diag_set(diag, rc, "%s: %s is missing", path, META_TYPE);
        goto out;
    }
    if (parse_u64(strata_metadata_get(&meta, META_STEPS), &steps) < 0) {
        strata_diag_set(diag, rc, "%s: bad or missing %s", path, META_STEPS);
        goto out;
    }
    if (strcmp(type, strata_server_opt_name(cfg->type)) != 0) {
        rc = strata_diag_set(diag, STRATA_EINVAL,
                             "%s: holds %s optimiser state, the configuration asks for %s", path,
                             type, strata_server_opt_name(cfg->type));
        goto out;
    }
    rc = STRATA_EINVAL;
    if (file.count != opt->state.count) {
        strata_diag_set(diag, rc, "%s: %zu state tensors, %s on this model needs %zu", path,
                        file.count, type, opt->state.count);
        goto out;
    }
    for (size_t i = 0; i < file.count; i++) {
        const strata_tensor *f = &file.items[i], *s = &opt->state.items[i];
        int same = strcmp(f->name, s->name) == 0 && f->ndim == s->ndim;
        for (int d = 0; same && d < f->ndim; d++)
            same = f->shape[d] == s->shape[d];
        if (!same) {
            char fs[96], ss[96];
            strata_tensor_shape_str(f, fs, sizeof(fs));
            strata_tensor_shape_str(s, ss, sizeof(ss));
            strata_diag_set(diag, rc, "%s: state tensor %zu is %s %s, the model needs %s %s", path,
                            i, f->name, fs, s->name, ss);
            goto out;
        }
        const int second = strncmp(f->name, "v.", 2) == 0 && cfg->type != STRATA_SERVER_OPT_FEDAVGM;
        for (size_t j = 0; j < f->numel; j++)
            if (!isfinite(f->data[j]) || (second && f->data[j] < 0.0f)) {
                rc = strata_diag_set(diag, STRATA_EPROTO, "%s: %s[%zu] = %g is not valid state",
                                     path, f->name, j, (double)f->data[j]);
                goto out;
            }
    }
    strata_tensor_list_copy_values(&opt->state, &file);
    opt->steps = steps;
    *out = opt;
    opt = NULL;
    rc = STRATA_OK;
out:
    strata_server_opt_free(opt);
    strata_tensor_list_cleanup(&file);
    strata_metadata_cleanup(&meta);
    return rc;
}
