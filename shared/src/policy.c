/* Budget policies (docs/algorithm.md "Budget policies"): per-layer
 * densities for every round, with equal-volume calibration and the lgreco
 * dynamic programme. */
#include "policy_internal.h"
#include "strata/fileio.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_GROUPS STRATA__POLICY_MAX_GROUPS
#define MIN_WEIGHT 1e-9
#define MAX_WEIGHT 1e9
#define MAX_SPLIT ((uint64_t)1 << 53)
#define MAX_LGRECO_EVERY 1000000
#define BISECT_STEPS 256

typedef strata__pol_type pol_type;
typedef strata__cal_mode cal_mode;
#define POL_UNIFORM STRATA__POL_UNIFORM
#define POL_LAYER STRATA__POL_LAYER
#define POL_PHASE STRATA__POL_PHASE
#define POL_LEGACY STRATA__POL_LEGACY
#define POL_LEGACY_REF STRATA__POL_LEGACY_REF
#define POL_LGRECO STRATA__POL_LGRECO
#define CAL_ROUND STRATA__CAL_ROUND
#define CAL_RUN STRATA__CAL_RUN
#define CAL_NONE STRATA__CAL_NONE

static const char *const type_names[] = {"uniform", "legacy-layer", "legacy-phase",
                                         "legacy",  "legacy-ref",   "lgreco"};
static const char *const cal_names[] = {"round", "run", "none"};

/* ---- defaults ---- */

static const size_t default_splits[] = {10000, 100000, 1000000};
static const double default_cand[] = {0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0};
/* Default candidate value formats of lgreco's top-k candidates, and its
 * other candidate compressors (dense fp16, for small layers). */
static const char *const default_cvals[] = {"fp32", "fp16", "int8", "ternary"};
static const char *const default_extra[] = {"fp16"};
/* legacy-ref: the published LEGACY setting. */
#define REF_SPLIT 10000
#define REF_HIGH 0.01
#define REF_LOW 0.001

/* Default weights for n groups or phases: halving from one to the next,
 * the last getting 0.5 (n = 4: 4, 2, 1, 0.5; n = 3: 2, 1, 0.5); 1 if n == 1. */
static double default_weight(size_t i, size_t n)
{
    return n == 1 ? 1.0 : ldexp(1.0, (int)n - 2 - (int)i);
}

static void set_defaults(strata_policy *p, pol_type type)
{
    p->type = type;
    p->base = (strata_budget){.comp = STRATA_COMP_TOPK, .density = 1.0};
    p->values = STRATA_VALUES_FP32;
    p->dense_below = type == POL_LEGACY_REF ? 0 : 1000;
    p->cal_bytes = 0;
    p->absolute = type == POL_LEGACY_REF;
    /* Per-round calibration would cancel phase weights, so policies with
     * phases calibrate over the run; uniform and lgreco need none. */
    p->cal = type == POL_LAYER
                 ? CAL_ROUND
                 : (type == POL_UNIFORM || type == POL_LGRECO || type == POL_LEGACY_REF ? CAL_NONE
                                                                                        : CAL_RUN);
    p->nsplits = 0;
    p->nphases = 1;
    if (type == POL_LAYER || type == POL_LEGACY) {
        p->nsplits = sizeof(default_splits) / sizeof(default_splits[0]);
        memcpy(p->splits, default_splits, sizeof(default_splits));
    }
    if (type == POL_PHASE || type == POL_LEGACY)
        p->nphases = 3;
    p->ngroups = p->nsplits + 1;
    for (uint32_t ph = 0; ph < p->nphases; ph++)
        for (size_t g = 0; g < p->ngroups; g++)
            p->w[ph][g] = default_weight(ph, p->nphases) * default_weight(g, p->ngroups);
    if (type == POL_UNIFORM || type == POL_LGRECO)
        p->w[0][0] = 1.0;
    if (type == POL_LEGACY_REF) { /* first half 1% everywhere; then 1% / 0.1% */
        p->nsplits = 1;
        p->splits[0] = REF_SPLIT;
        p->ngroups = 2;
        p->nphases = 2;
        p->w[0][0] = p->w[0][1] = p->w[1][0] = REF_HIGH;
        p->w[1][1] = REF_LOW;
    }
    p->ncand = p->ncvals = p->nextra = 0;
    p->lgreco_every = 0;
    if (type == POL_LGRECO) {
        p->ncand = sizeof(default_cand) / sizeof(default_cand[0]);
        memcpy(p->cand, default_cand, sizeof(default_cand));
        for (size_t i = 0; i < sizeof(default_cvals) / sizeof(default_cvals[0]); i++)
            if (strata_values_format_parse(default_cvals[i], &p->cvals[p->ncvals]) == STRATA_OK)
                p->ncvals++;
        for (size_t i = 0; i < sizeof(default_extra) / sizeof(default_extra[0]); i++)
            if (strata_budget_parse(default_extra[i], 0, &p->extra[p->nextra], NULL) == STRATA_OK)
                p->nextra++;
        p->lgreco_every = 10;
    }
}

static int type_from_name(const char *name, pol_type *out)
{
    for (size_t i = 0; i < sizeof(type_names) / sizeof(type_names[0]); i++)
        if (strcmp(name, type_names[i]) == 0) {
            *out = (pol_type)i;
            return 1;
        }
    return 0;
}

/* ---- JSON configuration ---- */

enum {
    K_TYPE = 1 << 0,
    K_DENSE = 1 << 1,
    K_COMP = 1 << 2,
    K_SPLITS = 1 << 3,
    K_LW = 1 << 4,
    K_PHASES = 1 << 5,
    K_PW = 1 << 6,
    K_W = 1 << 7,
    K_CAL = 1 << 8,
    K_CAND = 1 << 9,
    K_EVERY = 1 << 10,
    K_CALU = 1 << 11,
    K_CVALS = 1 << 12,
    K_CCOMP = 1 << 13
};

static const struct {
    const char *name;
    unsigned bit;
} known_keys[] = {{"type", K_TYPE},
                  {"dense_below", K_DENSE},
                  {"compressor", K_COMP},
                  {"splits", K_SPLITS},
                  {"layer_weights", K_LW},
                  {"phases", K_PHASES},
                  {"phase_weights", K_PW},
                  {"weights", K_W},
                  {"calibration", K_CAL},
                  {"candidates", K_CAND},
                  {"lgreco_every", K_EVERY},
                  {"calibration_unit", K_CALU},
                  {"candidate_values", K_CVALS},
                  {"candidate_compressors", K_CCOMP}};

static unsigned allowed_keys(pol_type t)
{
    unsigned common = K_TYPE | K_DENSE | K_COMP;
    switch (t) {
    case POL_UNIFORM:
        return common;
    case POL_LAYER:
        return common | K_SPLITS | K_LW | K_CAL | K_CALU;
    case POL_PHASE:
        return common | K_PHASES | K_PW | K_CAL | K_CALU;
    case POL_LEGACY:
        return common | K_SPLITS | K_LW | K_PHASES | K_PW | K_W | K_CAL | K_CALU;
    case POL_LEGACY_REF:
        return common;
    case POL_LGRECO:
        return common | K_CAND | K_EVERY | K_CVALS | K_CCOMP;
    }
    return common;
}

static int get_uint(json_t *v, const char *key, uint64_t min, uint64_t max, uint64_t *out,
                    strata_diag *diag)
{
    if (!json_is_integer(v) || json_integer_value(v) < 0 || (uint64_t)json_integer_value(v) < min ||
        (uint64_t)json_integer_value(v) > max)
        return strata_diag_set(diag, STRATA_EINVAL, "%s: expected an integer in [%llu, %llu]", key,
                               (unsigned long long)min, (unsigned long long)max);
    *out = (uint64_t)json_integer_value(v);
    return STRATA_OK;
}

/* Reads an array of exactly `expect` weights (expect == 0: 1 to max) into
 * out; `what` explains the expected length in the message. */
static int get_weights(json_t *v, const char *key, size_t expect, size_t max, const char *what,
                       double *out, size_t *n, strata_diag *diag)
{
    if (!json_is_array(v))
        return strata_diag_set(diag, STRATA_EINVAL, "%s: expected an array of numbers", key);
    size_t len = json_array_size(v);
    if (expect != 0 && len != expect)
        return strata_diag_set(diag, STRATA_EINVAL, "%s: expected %zu numbers (%s), got %zu", key,
                               expect, what, len);
    if (len == 0 || len > max)
        return strata_diag_set(diag, STRATA_EINVAL, "%s: expected 1 to %zu numbers, got %zu", key,
                               max, len);
    for (size_t i = 0; i < len; i++) {
        json_t *e = json_array_get(v, i);
        double x = json_is_number(e) ? json_number_value(e) : -1.0;
        if (!(x >= MIN_WEIGHT && x <= MAX_WEIGHT))
            return strata_diag_set(diag, STRATA_EINVAL,
                                   "%s[%zu]: expected a positive number in [%g, %g]", key, i,
                                   MIN_WEIGHT, MAX_WEIGHT);
        out[i] = x;
    }
    if (n != NULL)
        *n = len;
    return STRATA_OK;
}

static int parse_splits(strata_policy *p, json_t *v, strata_diag *diag)
{
    size_t len = json_array_size(v);
    if (!json_is_array(v) || len == 0 || len > STRATA_POLICY_MAX_SPLITS)
        return strata_diag_set(diag, STRATA_EINVAL,
                               "splits: expected an array of 1 to %d ascending element counts",
                               STRATA_POLICY_MAX_SPLITS);
    for (size_t i = 0; i < len; i++) {
        json_t *e = json_array_get(v, i);
        if (!json_is_integer(e) || json_integer_value(e) < 1 ||
            (uint64_t)json_integer_value(e) > MAX_SPLIT ||
            (uint64_t)json_integer_value(e) > SIZE_MAX)
            return strata_diag_set(diag, STRATA_EINVAL,
                                   "splits[%zu]: expected a positive integer (an element count)",
                                   i);
        p->splits[i] = (size_t)json_integer_value(e);
        if (i > 0 && p->splits[i] <= p->splits[i - 1])
            return strata_diag_set(diag, STRATA_EINVAL,
                                   "splits[%zu]: %zu is not greater than splits[%zu] = %zu "
                                   "(thresholds must ascend)",
                                   i, p->splits[i], i - 1, p->splits[i - 1]);
    }
    p->nsplits = len;
    p->ngroups = len + 1;
    return STRATA_OK;
}

static int parse_candidates(strata_policy *p, json_t *v, strata_diag *diag)
{
    size_t len = json_array_size(v);
    if (!json_is_array(v) || len == 0 || len > STRATA_LGRECO_MAX_CAND)
        return strata_diag_set(diag, STRATA_EINVAL,
                               "candidates: expected an array of 1 to %d ascending densities "
                               "in (0, 1]",
                               STRATA_LGRECO_MAX_CAND);
    for (size_t i = 0; i < len; i++) {
        json_t *e = json_array_get(v, i);
        double x = json_is_number(e) ? json_number_value(e) : -1.0;
        if (!(x > 0.0 && x <= 1.0))
            return strata_diag_set(diag, STRATA_EINVAL,
                                   "candidates[%zu]: expected a density in (0, 1]", i);
        if (i > 0 && x <= p->cand[i - 1])
            return strata_diag_set(diag, STRATA_EINVAL,
                                   "candidates[%zu]: %g is not greater than candidates[%zu] = %g "
                                   "(candidates must ascend)",
                                   i, x, i - 1, p->cand[i - 1]);
        p->cand[i] = x;
    }
    p->ncand = len;
    return STRATA_OK;
}

/* "compressor": a specification without density; the density policies and
 * lgreco need a sparse one. */
static int parse_compressor(strata_policy *p, json_t *v, strata_diag *diag)
{
    strata_diag inner = {{0}};
    strata_budget b;
    if (!json_is_string(v))
        return strata_diag_set(diag, STRATA_EINVAL,
                               "compressor: expected a string such as \"topk\", \"randk\", "
                               "\"qsgd:4\", \"sign\", \"powersgd:2\" or \"fp16\"");
    if (strata_budget_parse(json_string_value(v), 0, &b, &inner) < 0)
        return strata_diag_set(diag, STRATA_EINVAL, "compressor: %s", inner.msg);
    if (b.values != STRATA_VALUES_FP32)
        return strata_diag_set(diag, STRATA_EINVAL,
                               "compressor: give the values format with --values (or "
                               "candidate_values for lgreco), not in the compressor");
    int sparse = b.comp == STRATA_COMP_TOPK || b.comp == STRATA_COMP_RANDK;
    if (p->type == POL_LGRECO && b.comp != STRATA_COMP_TOPK)
        return strata_diag_set(diag, STRATA_EINVAL,
                               "compressor: lgreco needs \"topk\" (its uniform reference is "
                               "top-k at the target density; other families go in "
                               "candidate_compressors)");
    if (p->type != POL_UNIFORM && !sparse)
        return strata_diag_set(diag, STRATA_EINVAL,
                               "compressor: policy %s sets densities, so it needs \"topk\" or "
                               "\"randk\"",
                               type_names[p->type]);
    p->base = b;
    return STRATA_OK;
}

static int parse_cvals(strata_policy *p, json_t *v, strata_diag *diag)
{
    size_t len = json_array_size(v);
    if (!json_is_array(v) || len == 0 || len > STRATA__LGRECO_MAX_VALUES)
        return strata_diag_set(diag, STRATA_EINVAL,
                               "candidate_values: expected an array of 1 to %d values formats",
                               STRATA__LGRECO_MAX_VALUES);
    for (size_t i = 0; i < len; i++) {
        const char *name = json_string_value(json_array_get(v, i));
        if (strata_values_format_parse(name, &p->cvals[i]) < 0)
            return strata_diag_set(diag, STRATA_EINVAL,
                                   "candidate_values[%zu]: expected a values format name (fp32, "
                                   "fp16, bf16, int8, ternary)",
                                   i);
        for (size_t j = 0; j < i; j++)
            if (p->cvals[j] == p->cvals[i])
                return strata_diag_set(diag, STRATA_EINVAL, "candidate_values[%zu]: repeated", i);
    }
    p->ncvals = len;
    return STRATA_OK;
}

static int parse_extra(strata_policy *p, json_t *v, strata_diag *diag)
{
    size_t len = json_array_size(v);
    if (!json_is_array(v) || len > STRATA__LGRECO_MAX_EXTRA)
        return strata_diag_set(diag, STRATA_EINVAL,
                               "candidate_compressors: expected an array of 0 to %d compressor "
                               "specifications",
                               STRATA__LGRECO_MAX_EXTRA);
    for (size_t i = 0; i < len; i++) {
        const char *spec = json_string_value(json_array_get(v, i));
        strata_diag inner = {{0}};
        if (spec == NULL)
            return strata_diag_set(diag, STRATA_EINVAL,
                                   "candidate_compressors[%zu]: expected a string", i);
        if (strata_budget_parse(spec, 1, &p->extra[i], &inner) < 0)
            return strata_diag_set(diag, STRATA_EINVAL, "candidate_compressors[%zu]: %s", i,
                                   inner.msg);
    }
    p->nextra = len;
    return STRATA_OK;
}

/* Parses the phase-related keys: "phases", "phase_weights", "weights". The
 * number of phases comes from "phases", else from the length of
 * "phase_weights" or "weights", else the default. */
static int parse_phases(strata_policy *p, json_t *root, strata_diag *diag)
{
    json_t *jp = json_object_get(root, "phases"), *jpw = json_object_get(root, "phase_weights");
    json_t *jw = json_object_get(root, "weights"), *jlw = json_object_get(root, "layer_weights");
    int rc;
    uint64_t P = p->nphases;
    if (jp != NULL) {
        if ((rc = get_uint(jp, "phases", 1, STRATA_POLICY_MAX_PHASES, &P, diag)) < 0)
            return rc;
    } else if (json_is_array(jpw)) {
        P = json_array_size(jpw);
    } else if (json_is_array(jw)) {
        P = json_array_size(jw);
    }
    if (P < 1 || P > STRATA_POLICY_MAX_PHASES)
        return strata_diag_set(diag, STRATA_EINVAL, "%s: expected 1 to %d phases, got %llu",
                               jpw != NULL ? "phase_weights" : "weights", STRATA_POLICY_MAX_PHASES,
                               (unsigned long long)P);
    p->nphases = (uint32_t)P;
    size_t G = p->ngroups;

    if (jw != NULL) { /* "legacy" only: the full matrix */
        if (jpw != NULL || jlw != NULL)
            return strata_diag_set(diag, STRATA_EINVAL,
                                   "weights: give either weights or layer_weights/phase_weights, "
                                   "not both");
        if (!json_is_array(jw))
            return strata_diag_set(diag, STRATA_EINVAL,
                                   "weights: expected an array of rows (one per phase), each an "
                                   "array of numbers (one per group of splits)");
        if (json_array_size(jw) != P)
            return strata_diag_set(diag, STRATA_EINVAL,
                                   "weights: expected %llu rows (one per phase), got %zu",
                                   (unsigned long long)P, json_array_size(jw));
        for (size_t ph = 0; ph < P; ph++) {
            char key[32];
            snprintf(key, sizeof(key), "weights[%zu]", ph);
            if ((rc = get_weights(json_array_get(jw, ph), key, G, MAX_GROUPS,
                                  "one per group of splits", p->w[ph], NULL, diag)) < 0)
                return rc;
        }
        return STRATA_OK;
    }

    double lw[MAX_GROUPS], pw[STRATA_POLICY_MAX_PHASES];
    for (size_t g = 0; g < G; g++)
        lw[g] = default_weight(g, G);
    for (size_t ph = 0; ph < P; ph++)
        pw[ph] = default_weight(ph, P);
    if (jlw != NULL && (rc = get_weights(jlw, "layer_weights", G, MAX_GROUPS,
                                         "one per group of splits", lw, NULL, diag)) < 0)
        return rc;
    if (jpw != NULL && (rc = get_weights(jpw, "phase_weights", (size_t)P, STRATA_POLICY_MAX_PHASES,
                                         "one per phase", pw, NULL, diag)) < 0)
        return rc;
    if (p->type == POL_LAYER)
        P = 1;
    if (p->type == POL_PHASE)
        G = 1;
    for (size_t ph = 0; ph < P; ph++)
        for (size_t g = 0; g < G; g++)
            p->w[ph][g] = (p->type == POL_LAYER ? 1.0 : pw[ph]) * (G == 1 ? 1.0 : lw[g]);
    return STRATA_OK;
}

static int parse_json(const char *text, size_t len, strata_policy *p, strata_diag *diag)
{
    if (len > STRATA_POLICY_MAX_JSON)
        return strata_diag_set(diag, STRATA_ETOOBIG, "policy JSON larger than %u bytes",
                               STRATA_POLICY_MAX_JSON);
    json_error_t jerr;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
    if (root == NULL)
        return strata_diag_set(diag, STRATA_EINVAL, "policy JSON, line %d column %d: %s", jerr.line,
                               jerr.column, jerr.text);
    int rc = STRATA_EINVAL;
    if (!json_is_object(root)) {
        rc = strata_diag_set(diag, STRATA_EINVAL, "policy: expected a JSON object");
        goto out;
    }
    json_t *jt = json_object_get(root, "type");
    pol_type type;
    if (!json_is_string(jt) || !type_from_name(json_string_value(jt), &type)) {
        rc = strata_diag_set(diag, STRATA_EINVAL,
                             "type: expected one of \"uniform\", \"legacy-layer\", "
                             "\"legacy-phase\", \"legacy\", \"legacy-ref\", \"lgreco\"");
        goto out;
    }
    set_defaults(p, type);
    unsigned allowed = allowed_keys(type);
    const char *key;
    json_t *val;
    json_object_foreach(root, key, val)
    {
        unsigned bit = 0;
        for (size_t i = 0; i < sizeof(known_keys) / sizeof(known_keys[0]); i++)
            if (strcmp(key, known_keys[i].name) == 0)
                bit = known_keys[i].bit;
        if (bit == 0) {
            rc = strata_diag_set(diag, STRATA_EINVAL,
                                 "%s: unknown key (known: type, dense_below, compressor, splits, "
                                 "layer_weights, phases, phase_weights, weights, calibration, "
                                 "calibration_unit, candidates, candidate_values, "
                                 "candidate_compressors, lgreco_every)",
                                 key);
            goto out;
        }
        if ((allowed & bit) == 0) {
            rc = strata_diag_set(diag, STRATA_EINVAL, "%s: does not apply to policy type \"%s\"",
                                 key, type_names[type]);
            goto out;
        }
    }

    uint64_t u = 0;
    if ((val = json_object_get(root, "dense_below")) != NULL) {
        if ((rc = get_uint(val, "dense_below", 0, SIZE_MAX > MAX_SPLIT ? MAX_SPLIT : SIZE_MAX, &u,
                           diag)) < 0)
            goto out;
        p->dense_below = (size_t)u;
    }
    if ((val = json_object_get(root, "compressor")) != NULL &&
        (rc = parse_compressor(p, val, diag)) < 0)
        goto out;
    if ((val = json_object_get(root, "splits")) != NULL && (rc = parse_splits(p, val, diag)) < 0)
        goto out;
    if (type == POL_LAYER || type == POL_PHASE || type == POL_LEGACY) {
        if ((rc = parse_phases(p, root, diag)) < 0)
            goto out;
        if (type == POL_LAYER)
            p->nphases = 1;
    }
    if ((val = json_object_get(root, "calibration")) != NULL) {
        const char *c = json_string_value(val);
        int found = -1;
        for (int i = 0; c != NULL && i < 3; i++)
            if (strcmp(c, cal_names[i]) == 0)
                found = i;
        if (found < 0) {
            rc = strata_diag_set(diag, STRATA_EINVAL,
                                 "calibration: expected \"round\", \"run\" or \"none\"");
            goto out;
        }
        if (type == POL_PHASE && found == CAL_ROUND) {
            rc = strata_diag_set(diag, STRATA_EINVAL,
                                 "calibration: \"round\" would make legacy-phase identical to "
                                 "uniform (all layers share one density per round); use \"run\" "
                                 "or \"none\"");
            goto out;
        }
        p->cal = (cal_mode)found;
    }
    if ((val = json_object_get(root, "candidates")) != NULL &&
        (rc = parse_candidates(p, val, diag)) < 0)
        goto out;
    if ((val = json_object_get(root, "calibration_unit")) != NULL) {
        const char *c = json_string_value(val);
        if (c == NULL || (strcmp(c, "elements") != 0 && strcmp(c, "bytes") != 0)) {
            rc = strata_diag_set(diag, STRATA_EINVAL,
                                 "calibration_unit: expected \"elements\" or \"bytes\"");
            goto out;
        }
        p->cal_bytes = strcmp(c, "bytes") == 0;
    }
    if ((val = json_object_get(root, "candidate_values")) != NULL &&
        (rc = parse_cvals(p, val, diag)) < 0)
        goto out;
    if ((val = json_object_get(root, "candidate_compressors")) != NULL &&
        (rc = parse_extra(p, val, diag)) < 0)
        goto out;
    if ((val = json_object_get(root, "lgreco_every")) != NULL) {
        if ((rc = get_uint(val, "lgreco_every", 1, MAX_LGRECO_EVERY, &u, diag)) < 0)
            goto out;
        p->lgreco_every = (uint32_t)u;
    }
    if (type == POL_LGRECO &&
        (p->ncand + 1) * (p->ncvals + 1) + p->nextra + 1 > STRATA_LGRECO_MAX_TABLE) {
        rc = strata_diag_set(diag, STRATA_EINVAL,
                             "candidates: %zu densities x %zu value formats and %zu compressors "
                             "may make more than %d candidates",
                             p->ncand, p->ncvals, p->nextra, STRATA_LGRECO_MAX_TABLE);
        goto out;
    }
    rc = STRATA_OK;
out:
    json_decref(root);
    return rc;
}

static int read_spec_file(const char *path, char **text, size_t *len, strata_diag *diag)
{
    uint8_t *buf = NULL;
    strata_diag rd;
    int rc = strata_file_read_all(path, STRATA_POLICY_MAX_JSON, &buf, len, &rd);
    *text = (char *)buf;
    if (rc == STRATA_ETOOBIG)
        return strata_diag_set(diag, STRATA_ETOOBIG, "policy file '%s': larger than %u bytes", path,
                               STRATA_POLICY_MAX_JSON);
    if (rc < 0)
        return strata_diag_set(diag, rc == STRATA_ENOMEM ? rc : STRATA_EIO, "policy file: %s",
                               rd.msg);
    return STRATA_OK;
}

int strata_policy_parse(const char *spec, strata_policy **out, strata_diag *diag)
{
    *out = NULL;
    if (spec == NULL)
        return strata_diag_set(diag, STRATA_EINVAL, "policy: no specification given");
    strata_policy *p = calloc(1, sizeof(*p));
    if (p == NULL)
        return STRATA_ENOMEM;
    const char *s = spec;
    while (*s == ' ' || *s == '\t' || *s == '\n' || *s == '\r')
        s++;
    pol_type type;
    strata_budget comp;
    int rc;
    if (type_from_name(spec, &type)) {
        set_defaults(p, type);
        rc = STRATA_OK;
    } else if (strata_budget_parse(spec, 0, &comp, NULL) == STRATA_OK &&
               comp.values == STRATA_VALUES_FP32) {
        set_defaults(p, POL_UNIFORM);
        p->base = comp;
        rc = STRATA_OK;
    } else if (*s == '{') {
        rc = parse_json(s, strlen(s), p, diag);
    } else if (spec[0] == '@') {
        char *text;
        size_t len;
        rc = read_spec_file(spec + 1, &text, &len, diag);
        if (rc == STRATA_OK) {
            rc = parse_json(text, len, p, diag);
            free(text);
            if (rc < 0 && diag != NULL) { /* prefix the file name */
                char msg[sizeof(diag->msg)];
                memcpy(msg, diag->msg, sizeof(msg));
                strata_diag_set(diag, rc, "%s: %s", spec + 1, msg);
            }
        }
    } else {
        rc = strata_diag_set(diag, STRATA_EINVAL,
                             "policy '%s': expected a policy name (uniform, legacy-layer, "
                             "legacy-phase, legacy, legacy-ref, lgreco), a compressor (topk, "
                             "randk, fp16, bf16, sign, qsgd:LEVELS, powersgd:RANK, none), JSON "
                             "text or @file.json",
                             spec);
    }
    if (rc < 0) {
        strata_policy_free(p);
        return rc;
    }
    *out = p;
    return STRATA_OK;
}

void strata_policy_free(strata_policy *p)
{
    if (p == NULL)
        return;
    free(p->lg_numel);
    free(p->lg_budget);
    free(p);
}

const char *strata_policy_name(const strata_policy *p)
{
    return type_names[p->type];
}

static json_t *real_array(const double *x, size_t n)
{
    json_t *a = json_array();
    for (size_t i = 0; a != NULL && i < n; i++)
        if (json_array_append_new(a, json_real(x[i])) < 0) {
            json_decref(a);
            return NULL;
        }
    return a;
}

char *strata_policy_json(const strata_policy *p)
{
    json_t *o = json_object(), *a;
    if (o == NULL)
        return NULL;
    int bad = json_object_set_new(o, "type", json_string(type_names[p->type]));
    bad |= json_object_set_new(o, "dense_below", json_integer((json_int_t)p->dense_below));
    char spec[64];
    bad |= json_object_set_new(o, "compressor",
                               json_string(strata_budget_format(&p->base, 0, spec, sizeof(spec))));
    if (p->type == POL_LAYER || p->type == POL_LEGACY) {
        bad |= json_object_set_new(o, "splits", a = json_array());
        for (size_t i = 0; a != NULL && i < p->nsplits; i++)
            bad |= json_array_append_new(a, json_integer((json_int_t)p->splits[i]));
    }
    if (p->type == POL_PHASE || p->type == POL_LEGACY)
        bad |= json_object_set_new(o, "phases", json_integer((json_int_t)p->nphases));
    if (p->type == POL_LAYER)
        bad |= json_object_set_new(o, "layer_weights", real_array(p->w[0], p->ngroups));
    if (p->type == POL_PHASE) {
        double pw[STRATA_POLICY_MAX_PHASES];
        for (uint32_t ph = 0; ph < p->nphases; ph++)
            pw[ph] = p->w[ph][0];
        bad |= json_object_set_new(o, "phase_weights", real_array(pw, p->nphases));
    }
    if (p->type == POL_LEGACY) {
        bad |= json_object_set_new(o, "weights", a = json_array());
        for (uint32_t ph = 0; a != NULL && ph < p->nphases; ph++)
            bad |= json_array_append_new(a, real_array(p->w[ph], p->ngroups));
    }
    if (p->type == POL_LAYER || p->type == POL_PHASE || p->type == POL_LEGACY) {
        bad |= json_object_set_new(o, "calibration", json_string(cal_names[p->cal]));
        bad |= json_object_set_new(o, "calibration_unit",
                                   json_string(p->cal_bytes ? "bytes" : "elements"));
    }
    if (p->type == POL_LGRECO) {
        bad |= json_object_set_new(o, "candidates", real_array(p->cand, p->ncand));
        bad |= json_object_set_new(o, "candidate_values", a = json_array());
        for (size_t i = 0; a != NULL && i < p->ncvals; i++)
            bad |= json_array_append_new(a, json_string(strata_values_format_name(p->cvals[i])));
        bad |= json_object_set_new(o, "candidate_compressors", a = json_array());
        for (size_t i = 0; a != NULL && i < p->nextra; i++)
            bad |= json_array_append_new(
                a, json_string(strata_budget_format(&p->extra[i], 1, spec, sizeof(spec))));
        bad |= json_object_set_new(o, "lgreco_every", json_integer(p->lgreco_every));
    }
    if (bad) {
        json_decref(o);
        return NULL;
    }
    /* 15 significant digits print 0.1 as 0.1; fall back to 17 (always exact)
     * when some weight does not survive the shorter form. */
    size_t flags = JSON_COMPACT | JSON_PRESERVE_ORDER;
    char *s = json_dumps(o, flags | JSON_REAL_PRECISION(15));
    json_t *back = s != NULL ? json_loads(s, 0, NULL) : NULL;
    if (s != NULL && !json_equal(o, back)) {
        free(s);
        s = json_dumps(o, flags | JSON_REAL_PRECISION(17));
    }
    json_decref(back);
    json_decref(o);
    return s;
}

uint32_t strata_policy_phases(const strata_policy *p)
{
    return p->nphases;
}

uint32_t strata_policy_phase(const strata_policy *p, uint32_t round, uint32_t total_rounds)
{
    if (total_rounds == 0)
        return 0;
    if (round >= total_rounds)
        return p->nphases - 1;
    return (uint32_t)((uint64_t)round * p->nphases / total_rounds);
}

uint32_t strata_policy_lgreco_every(const strata_policy *p)
{
    return p->type == POL_LGRECO ? p->lgreco_every : 0;
}

static int valid_d0(double d0)
{
    return d0 > 0.0 && d0 <= 1.0;
}

int strata_policy_set_values(strata_policy *p, strata_values_format vf, strata_diag *diag)
{
    if (p == NULL)
        return strata_diag_set(diag, STRATA_EINVAL, "policy: NULL argument");
    strata_budget b = p->base;
    b.values = vf;
    strata_diag inner = {{0}};
    if (strata_budget_check(&b, &inner) < 0)
        return strata_diag_set(diag, STRATA_EINVAL, "values %s: %s", strata_values_format_name(vf),
                               inner.msg);
    p->values = vf;
    return STRATA_OK;
}

/* ---- densities and calibration ---- */

size_t strata_policy_kept(const size_t *numel, const double *density, size_t nlayers)
{
    size_t total = 0;
    for (size_t l = 0; l < nlayers; l++)
        total += (size_t)strata_comp_kept(density[l], numel[l]);
    return total;
}

int strata__policy_is_dense(const strata_policy *p, size_t n)
{
    return n == 0 || n < p->dense_below;
}
#define is_dense strata__policy_is_dense

strata_budget strata__policy_dense_budget(const strata_policy *p)
{
    return strata_budget_whole(p->values);
}

strata_budget strata__policy_layer_budget(const strata_policy *p, double d)
{
    int sparse = p->base.comp == STRATA_COMP_TOPK || p->base.comp == STRATA_COMP_RANDK;
    if (sparse && d >= 1.0)
        return strata__policy_dense_budget(p);
    strata_budget b = p->base;
    b.density = sparse ? d : 1.0;
    b.values = p->values;
    return b;
}

static size_t group_of(const strata_policy *p, size_t n)
{
    size_t g = 0;
    while (g < p->nsplits && p->splits[g] <= n)
        g++;
    return g;
}

/* The one place a scaled weight becomes a density. */
static double scaled(double alpha, double w)
{
    double d = alpha * w;
    return d >= 1.0 ? 1.0 : d;
}

/* The volume of one layer of n elements at density d: kept elements, or
 * estimated payload bytes with "calibration_unit": "bytes". */
static double layer_volume(const strata_policy *p, size_t n, double d)
{
    if (!p->cal_bytes)
        return (double)strata_comp_kept(d, n);
    strata_budget b = strata__policy_layer_budget(p, d);
    return strata_budget_bytes(&b, n);
}

/* Volume of one round of phase ph at scale alpha (dense layers included). */
static double phase_kept(const strata_policy *p, const size_t *numel, size_t nlayers, uint32_t ph,
                         double alpha)
{
    double total = 0.0;
    for (size_t l = 0; l < nlayers; l++)
        total += layer_volume(
            p, numel[l],
            is_dense(p, numel[l]) ? 1.0 : scaled(alpha, p->w[ph][group_of(p, numel[l])]));
    return total;
}

/* Calibration target and kept-volume function: `rounds[ph]` rounds of each
 * phase are counted (round mode: one round of the current phase). */
typedef struct {
    const strata_policy *p;
    const size_t *numel;
    size_t nlayers;
    double rounds[STRATA_POLICY_MAX_PHASES];
} volume_fn;

static double volume(const volume_fn *v, double alpha)
{
    double total = 0.0;
    for (uint32_t ph = 0; ph < v->p->nphases; ph++)
        if (v->rounds[ph] > 0.0)
            total += v->rounds[ph] * phase_kept(v->p, v->numel, v->nlayers, ph, alpha);
    return total;
}

/* Finds alpha > 0 whose volume is as close as possible to target. volume()
 * is a non-decreasing step function of alpha (a product with a positive
 * weight, min(1, .) and floor are all monotone), from the all-minimal volume
 * near 0 to the all-dense volume at alpha = 1 / min weight, and target lies
 * between them, so bisection brackets the step that crosses the target;
 * the closer of its two sides wins. */
static double calibrate(const volume_fn *v, double target)
{
    double wmin = INFINITY;
    for (uint32_t ph = 0; ph < v->p->nphases; ph++)
        for (size_t g = 0; v->rounds[ph] > 0.0 && g < v->p->ngroups; g++)
            if (v->p->w[ph][g] < wmin)
                wmin = v->p->w[ph][g];
    double lo = 0.0, hi = 2.0 / wmin;
    double fhi = volume(v, hi);
    if (fhi <= target)
        return hi;
    for (int i = 0; i < BISECT_STEPS; i++) {
        double mid = lo + (hi - lo) / 2.0;
        if (mid <= lo || mid >= hi)
            break;
        double f = volume(v, mid);
        if (f >= target) {
            hi = mid;
            fhi = f;
        } else {
            lo = mid;
        }
    }
    if (lo > 0.0 && target - volume(v, lo) < fhi - target)
        return lo;
    return hi;
}

static int check_args(const strata_policy *p, const size_t *numel, size_t nlayers, double d0,
                      uint32_t round, uint32_t total_rounds, const void *out, strata_diag *diag)
{
    if (p == NULL || (nlayers > 0 && (numel == NULL || out == NULL)))
        return strata_diag_set(diag, STRATA_EINVAL, "policy: NULL argument");
    if (!valid_d0(d0))
        return strata_diag_set(diag, STRATA_EINVAL, "density: %g is not in (0, 1]", d0);
    if (total_rounds == 0 || round >= total_rounds)
        return strata_diag_set(diag, STRATA_EINVAL,
                               "round %u is outside a run of %u rounds (rounds count from 0)",
                               round, total_rounds);
    return STRATA_OK;
}

int strata_policy_densities(const strata_policy *p, const size_t *numel, size_t nlayers, double d0,
                            uint32_t round, uint32_t total_rounds, double *density,
                            strata_diag *diag)
{
    if (density != NULL)
        memset(density, 0, nlayers * sizeof(*density));
    int rc = check_args(p, numel, nlayers, d0, round, total_rounds, density, diag);
    if (rc < 0)
        return rc;

    if (p->type == POL_LGRECO && p->lg_ready) {
        if ((rc = strata__policy_lgreco_applies(p, numel, nlayers, d0, diag)) < 0)
            return rc;
        for (size_t l = 0; l < nlayers; l++) {
            const strata_budget *b = &p->lg_budget[l];
            density[l] =
                b->comp == STRATA_COMP_TOPK || b->comp == STRATA_COMP_RANDK ? b->density : 1.0;
        }
        return STRATA_OK;
    }

    uint32_t ph = strata_policy_phase(p, round, total_rounds);
    double alpha = p->absolute ? 1.0 : d0;
    int any = 0;
    for (size_t l = 0; l < nlayers; l++)
        any |= !is_dense(p, numel[l]);
    if (p->cal != CAL_NONE && any) {
        volume_fn v = {p, numel, nlayers, {0}};
        double uniform = 0.0;
        for (size_t l = 0; l < nlayers; l++)
            uniform += layer_volume(p, numel[l], is_dense(p, numel[l]) ? 1.0 : d0);
        double target = uniform;
        if (p->cal == CAL_ROUND) {
            v.rounds[ph] = 1.0;
        } else { /* rounds of phase q: [ceil(q T / P), ceil((q + 1) T / P)) */
            uint64_t P = p->nphases, T = total_rounds;
            for (uint64_t q = 0; q < P; q++)
                v.rounds[q] = (double)(((q + 1) * T + P - 1) / P - (q * T + P - 1) / P);
            target = uniform * (double)T;
        }
        alpha = calibrate(&v, target);
    }
    for (size_t l = 0; l < nlayers; l++)
        density[l] = is_dense(p, numel[l]) ? 1.0 : scaled(alpha, p->w[ph][group_of(p, numel[l])]);
    return STRATA_OK;
}

int strata_policy_budgets(const strata_policy *p, const size_t *numel, size_t nlayers, double d0,
                          uint32_t round, uint32_t total_rounds, strata_budget *out,
                          strata_diag *diag)
{
    if (out != NULL)
        memset(out, 0, nlayers * sizeof(*out));
    int rc = check_args(p, numel, nlayers, d0, round, total_rounds, out, diag);
    if (rc < 0 || nlayers == 0)
        return rc;
    if (nlayers > SIZE_MAX / sizeof(double))
        return STRATA_ENOMEM;
    double *d = malloc(nlayers * sizeof(double));
    if (d == NULL)
        return STRATA_ENOMEM;
    rc = strata_policy_densities(p, numel, nlayers, d0, round, total_rounds, d, diag);
    for (size_t l = 0; rc == STRATA_OK && l < nlayers; l++)
        out[l] = p->type == POL_LGRECO && p->lg_ready
                     ? p->lg_budget[l]
                     : (is_dense(p, numel[l]) ? strata__policy_dense_budget(p)
                                              : strata__policy_layer_budget(p, d[l]));
    free(d);
    return rc;
}
