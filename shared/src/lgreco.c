/* The lgreco policy's allocation (docs/algorithm.md "lgreco"): candidates,
 * the error-constrained dynamic programme over estimated payload bytes,
 * and the allocation a solve leaves in the policy. */
#include "policy_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static int same_budget(const strata_budget *a, const strata_budget *b)
{
    return a->comp == b->comp && a->density == b->density && a->levels == b->levels &&
           a->rank == b->rank && a->values == b->values;
}

/* Appends b to out[*n] unless it is there already or fails the check. */
static void add_candidate(strata_budget *out, size_t *n, strata_budget b)
{
    if (*n >= STRATA_LGRECO_MAX_TABLE || strata_budget_check(&b, NULL) < 0)
        return;
    for (size_t i = 0; i < *n; i++)
        if (same_budget(&out[i], &b))
            return;
    out[(*n)++] = b;
}

size_t strata_policy_lgreco_candidates(const strata_policy *p, double d0, strata_budget *out)
{
    if (p == NULL || p->type != STRATA__POL_LGRECO || !(d0 > 0.0 && d0 <= 1.0))
        return 0;
    double dens[STRATA_LGRECO_MAX_CAND + 1];
    size_t nd = 0, i = 0;
    while (i < p->ncand && p->cand[i] < d0)
        dens[nd++] = p->cand[i++];
    dens[nd++] = d0;
    if (i < p->ncand && p->cand[i] == d0)
        i++;
    while (i < p->ncand)
        dens[nd++] = p->cand[i++];
    strata_values_format vals[STRATA__LGRECO_MAX_VALUES + 1];
    size_t nv = 0;
    vals[nv++] = p->values;
    for (size_t v = 0; v < p->ncvals; v++)
        if (p->cvals[v] != p->values)
            vals[nv++] = p->cvals[v];
    size_t n = 0;
    for (size_t d = 0; d < nd; d++)
        for (size_t v = 0; v < nv; v++)
            add_candidate(
                out, &n,
                (strata_budget){.comp = p->base.comp, .density = dens[d], .values = vals[v]});
    for (size_t e = 0; e < p->nextra; e++)
        add_candidate(out, &n, p->extra[e]);
    add_candidate(out, &n, strata__policy_dense_budget(p));
    return n;
}

int strata__policy_lgreco_applies(const strata_policy *p, const size_t *numel, size_t nlayers,
                                  double d0, strata_diag *diag)
{
    int same = p->lg_nlayers == nlayers && p->lg_d0 == d0;
    for (size_t l = 0; same && l < nlayers; l++)
        same = p->lg_numel[l] == numel[l];
    if (!same)
        return strata_diag_set(diag, STRATA_ESTATE,
                               "lgreco: the error table was solved for %zu layers at density %g, "
                               "not for these %zu layers at %g",
                               p->lg_nlayers, p->lg_d0, nlayers, d0);
    return STRATA_OK;
}

strata_lgreco_report strata_policy_lgreco_report(const strata_policy *p)
{
    strata_lgreco_report r = {0};
    if (p != NULL && p->type == STRATA__POL_LGRECO && p->lg_ready)
        r = p->lg_report;
    return r;
}

int strata_lgreco_solve(const double *err, const double *cost, size_t nlayers, size_t ncand,
                        double budget, size_t *choice, strata_diag *diag)
{
    if (choice != NULL)
        memset(choice, 0, nlayers * sizeof(*choice));
    if (nlayers == 0)
        return STRATA_OK;
    if (err == NULL || cost == NULL || choice == NULL)
        return strata_diag_set(diag, STRATA_EINVAL, "lgreco: NULL argument");
    if (ncand == 0 || ncand > STRATA_LGRECO_MAX_TABLE)
        return strata_diag_set(diag, STRATA_EINVAL, "lgreco: %zu candidates (1 to %d allowed)",
                               ncand, STRATA_LGRECO_MAX_TABLE);
    if (!(budget >= 0.0 && isfinite(budget)))
        return strata_diag_set(diag, STRATA_EINVAL, "lgreco: budget %g is not a finite number >= 0",
                               budget);
    if (nlayers > SIZE_MAX / ncand)
        return STRATA_ENOMEM;
    for (size_t i = 0; i < nlayers * ncand; i++)
        if (!(err[i] >= 0.0 && isfinite(err[i])) || !(cost[i] >= 0.0 && isfinite(cost[i])))
            return strata_diag_set(diag, STRATA_EINVAL,
                                   "lgreco: layer %zu, candidate %zu: error %g, cost %g (expected "
                                   "finite numbers >= 0)",
                                   i / ncand, i % ncand, err[i], cost[i]);

    const size_t Q = STRATA_LGRECO_RESOLUTION;
    int rc = STRATA_OK;
    uint32_t *units = NULL;
    double *prev = NULL, *cur = NULL;
    unsigned char *pick = NULL;
    if (nlayers > SIZE_MAX / (Q + 1) || nlayers * ncand > SIZE_MAX / sizeof(double))
        return STRATA_ENOMEM;
    units = malloc(nlayers * ncand * sizeof(*units));
    prev = malloc((Q + 1) * sizeof(*prev));
    cur = malloc((Q + 1) * sizeof(*cur));
    pick = malloc(nlayers * (Q + 1));
    if (units == NULL || prev == NULL || cur == NULL || pick == NULL) {
        rc = STRATA_ENOMEM;
        goto out;
    }
    /* Error in units of budget / Q, rounded up: floor(x) + 1 exceeds the
     * exact quotient even when x itself was rounded down. Zero stays zero. */
    for (size_t i = 0; i < nlayers * ncand; i++) {
        double x = budget > 0.0 ? err[i] / budget * (double)Q : INFINITY;
        units[i] = err[i] == 0.0 ? 0 : (x >= (double)Q ? (uint32_t)Q + 1 : (uint32_t)x + 1);
    }
    /* prev[q]: least cost over the layers so far with at most q units of
     * error (INFINITY: impossible). */
    for (size_t q = 0; q <= Q; q++)
        prev[q] = 0.0;
    for (size_t l = 0; l < nlayers; l++) {
        const uint32_t *u = units + l * ncand;
        const double *k = cost + l * ncand;
        unsigned char *pk = pick + l * (Q + 1);
        for (size_t q = 0; q <= Q; q++) {
            double best = INFINITY;
            unsigned char bc = 0;
            for (size_t c = 0; c < ncand; c++) {
                if (u[c] > q || prev[q - u[c]] == INFINITY)
                    continue;
                double v = prev[q - u[c]] + k[c];
                if (v < best) {
                    best = v;
                    bc = (unsigned char)c;
                }
            }
            cur[q] = best;
            pk[q] = bc;
        }
        double *t = prev;
        prev = cur;
        cur = t;
    }
    if (prev[Q] == INFINITY) {
        double least = 0.0;
        for (size_t l = 0; l < nlayers; l++) {
            double m = INFINITY;
            for (size_t c = 0; c < ncand; c++)
                m = fmin(m, err[l * ncand + c]);
            least += m;
        }
        rc = strata_diag_set(diag, STRATA_EINVAL,
                             "lgreco: no choice of candidates keeps the total error within the "
                             "budget %g (the smallest total error is %g)",
                             budget, least);
        goto out;
    }
    size_t q = Q;
    for (size_t l = nlayers; l-- > 0;) {
        size_t c = pick[l * (Q + 1) + q];
        choice[l] = c;
        q -= units[l * ncand + c];
    }
out:
    free(units);
    free(prev);
    free(cur);
    free(pick);
    return rc;
}

/* Installs an allocation (budgets of nlayers layers, taken) and its report. */
static int install(strata_policy *p, strata_budget *alloc, const size_t *numel, size_t nlayers,
                   double d0, const strata_lgreco_report *rep)
{
    size_t *nn = malloc((nlayers + 1) * sizeof(size_t));
    if (nn == NULL) {
        free(alloc);
        return STRATA_ENOMEM;
    }
    if (nlayers > 0)
        memcpy(nn, numel, nlayers * sizeof(size_t));
    free(p->lg_numel);
    free(p->lg_budget);
    p->lg_numel = nn;
    p->lg_budget = alloc;
    p->lg_nlayers = nlayers;
    p->lg_d0 = d0;
    p->lg_report = *rep;
    p->lg_report.solved = 1;
    p->lg_ready = 1;
    return STRATA_OK;
}

int strata_policy_set_lgreco_table(strata_policy *p, const double *err, const size_t *numel,
                                   size_t nlayers, double d0, strata_diag *diag)
{
    if (p == NULL || p->type != STRATA__POL_LGRECO)
        return strata_diag_set(diag, STRATA_EINVAL, "lgreco table given to a policy of type %s",
                               p == NULL ? "(null)" : strata_policy_name(p));
    strata_budget cand[STRATA_LGRECO_MAX_TABLE];
    size_t nc = strata_policy_lgreco_candidates(p, d0, cand);
    if (nc == 0)
        return strata_diag_set(diag, STRATA_EINVAL, "density: %g is not in (0, 1]", d0);
    if (nlayers > 0 && (err == NULL || numel == NULL))
        return strata_diag_set(diag, STRATA_EINVAL, "lgreco: NULL error table");
    if (nlayers > SIZE_MAX / nc / sizeof(double))
        return STRATA_ENOMEM;
    for (size_t i = 0; i < nlayers * nc; i++)
        if (!(err[i] >= 0.0 && isfinite(err[i])))
            return strata_diag_set(diag, STRATA_EINVAL,
                                   "lgreco table: error of layer %zu at candidate %zu is %g "
                                   "(expected a finite number >= 0)",
                                   i / nc, i % nc, err[i]);

    /* The uniform allocation, by candidate index per layer. */
    strata_budget dense = strata__policy_dense_budget(p);
    strata_budget uni = strata__policy_layer_budget(p, d0);
    size_t iu = nc, id = nc;
    for (size_t c = 0; c < nc; c++) {
        if (iu == nc && cand[c].comp == uni.comp && cand[c].density == uni.density &&
            cand[c].values == uni.values && cand[c].levels == uni.levels)
            iu = c;
        if (id == nc && cand[c].comp == dense.comp && cand[c].density == dense.density &&
            cand[c].values == dense.values)
            id = c;
    }
    int rc = STRATA_ENOMEM;
    double *cost = calloc(nlayers * nc + 1, sizeof(double));
    size_t *choice = malloc((nlayers + 1) * sizeof(size_t));
    strata_budget *alloc = malloc((nlayers + 1) * sizeof(strata_budget));
    if (cost == NULL || choice == NULL || alloc == NULL)
        goto out;
    strata_lgreco_report rep = {0};
    for (size_t l = 0; l < nlayers; l++) {
        size_t u = strata__policy_is_dense(p, numel[l]) || uni.comp == STRATA_COMP_NONE ? id : iu;
        rep.error_budget += err[l * nc + u];
        rep.uniform_bytes += strata_budget_bytes(&cand[u], numel[l]);
        for (size_t c = 0; c < nc; c++)
            cost[l * nc + c] = strata_budget_bytes(&cand[c], numel[l]);
    }
    strata_diag sd = {{0}};
    rc = strata_lgreco_solve(err, cost, nlayers, nc, rep.error_budget, choice, &sd);
    if (rc == STRATA_ENOMEM)
        goto out;
    double bytes = 0.0, e = 0.0;
    for (size_t l = 0; rc == STRATA_OK && l < nlayers; l++) {
        bytes += cost[l * nc + choice[l]];
        e += err[l * nc + choice[l]];
    }
    /* Uniform meets the budget exactly; keep it unless the programme found
     * something no more expensive (rounding may make uniform itself
     * infeasible for the programme). */
    rep.fell_back = rc < 0 || bytes > rep.uniform_bytes;
    for (size_t l = 0; l < nlayers; l++) {
        size_t u = strata__policy_is_dense(p, numel[l]) || uni.comp == STRATA_COMP_NONE ? id : iu;
        alloc[l] = cand[rep.fell_back ? u : choice[l]];
    }
    rep.bytes = rep.fell_back ? rep.uniform_bytes : bytes;
    rep.chosen_error = rep.fell_back ? rep.error_budget : e;
    rc = install(p, alloc, numel, nlayers, d0, &rep);
    alloc = NULL;
out:
    free(cost);
    free(choice);
    free(alloc);
    return rc;
}

int strata_policy_restore_lgreco(strata_policy *p, const strata_budget *alloc, const size_t *numel,
                                 size_t nlayers, double d0, const strata_lgreco_report *rep,
                                 strata_diag *diag)
{
    if (p == NULL || p->type != STRATA__POL_LGRECO)
        return strata_diag_set(diag, STRATA_EINVAL,
                               "lgreco allocation given to a policy of type %s",
                               p == NULL ? "(null)" : strata_policy_name(p));
    if (!(d0 > 0.0 && d0 <= 1.0))
        return strata_diag_set(diag, STRATA_EINVAL, "density: %g is not in (0, 1]", d0);
    if (nlayers > 0 && (alloc == NULL || numel == NULL || rep == NULL))
        return strata_diag_set(diag, STRATA_EINVAL, "lgreco: NULL allocation");
    for (size_t l = 0; l < nlayers; l++) {
        strata_diag bd = {{0}};
        if (strata_budget_check(&alloc[l], &bd) < 0)
            return strata_diag_set(diag, STRATA_EINVAL, "lgreco allocation, layer %zu: %s", l,
                                   bd.msg);
    }
    strata_budget *copy = malloc((nlayers + 1) * sizeof(strata_budget));
    if (copy == NULL)
        return STRATA_ENOMEM;
    if (nlayers > 0)
        memcpy(copy, alloc, nlayers * sizeof(strata_budget));
    strata_lgreco_report r = rep != NULL ? *rep : (strata_lgreco_report){0};
    return install(p, copy, numel, nlayers, d0, &r);
}
