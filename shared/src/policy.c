/* Budget policies (docs/algorithm.md "Budget policies"): per-layer
 * densities for every round, with equal-volume calibration and the lgreco
 * dynamic programme. */
#include "strata/policy.h"
#include "strata/fileio.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_GROUPS (STRATA_POLICY_MAX_SPLITS + 1)
#define MIN_WEIGHT 1e-9
#define MAX_WEIGHT 1e9
#define MAX_SPLIT ((uint64_t)1 << 53)
#define MAX_LGRECO_EVERY 1000000
#define BISECT_STEPS 256

typedef enum { POL_UNIFORM, POL_LAYER, POL_PHASE, POL_LEGACY, POL_LGRECO } pol_type;
typedef enum { CAL_ROUND, CAL_RUN, CAL_NONE } cal_mode;

static const char *const type_names[] = {"uniform", "legacy-layer", "legacy-phase", "legacy",
                                         "lgreco"};
static const char *const cal_names[] = {"round", "run", "none"};

struct strata_policy {
    pol_type type;
    strata_compressor_id comp; /* TOPK or RANDK */
    size_t dense_below;
    cal_mode cal;
    size_t nsplits;
    size_t splits[STRATA_POLICY_MAX_SPLITS];
    size_t ngroups; /* nsplits + 1 */
    uint32_t nphases;
    double w[STRATA_POLICY_MAX_PHASES][MAX_GROUPS]; /* w[phase][group] */
    size_t ncand;
    double cand[STRATA_LGRECO_MAX_CAND];
    uint32_t lgreco_every;
    /* lgreco allocation from the last table (lg_ready), for these layers */
    int lg_ready;
    double lg_d0;
    size_t lg_nlayers;
    size_t *lg_numel;
    double *lg_density;
};

/* ---- defaults ---- */

static const size_t default_splits[] = {10000, 100000, 1000000};
static const double default_cand[] = {0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0};

/* Default weights for n groups or phases: halving from one to the next,
 * the last getting 0.5 (n = 4: 4, 2, 1, 0.5; n = 3: 2, 1, 0.5); 1 if n == 1. */
static double default_weight(size_t i, size_t n)
{
    return n == 1 ? 1.0 : ldexp(1.0, (int)n - 2 - (int)i);
}

static void set_defaults(strata_policy *p, pol_type type)
{
    p->type = type;
    p->comp = STRATA_COMP_TOPK;
    p->dense_below = 1000;
    /* Per-round calibration would cancel phase weights, so policies with
     * phases calibrate over the run; uniform and lgreco need none. */
    p->cal = type == POL_LAYER ? CAL_ROUND
                               : (type == POL_UNIFORM || type == POL_LGRECO ? CAL_NONE : CAL_RUN);
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
    p->ncand = 0;
    p->lgreco_every = 0;
    if (type == POL_LGRECO) {
        p->ncand = sizeof(default_cand) / sizeof(default_cand[0]);
        memcpy(p->cand, default_cand, sizeof(default_cand));
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
    K_EVERY = 1 << 10
};

static const struct {
    const char *name;
    unsigned bit;
} known_keys[] = {{"type", K_TYPE},        {"dense_below", K_DENSE}, {"compressor", K_COMP},
                  {"splits", K_SPLITS},    {"layer_weights", K_LW},  {"phases", K_PHASES},
                  {"phase_weights", K_PW}, {"weights", K_W},         {"calibration", K_CAL},
                  {"candidates", K_CAND},  {"lgreco_every", K_EVERY}};

static unsigned allowed_keys(pol_type t)
{
    unsigned common = K_TYPE | K_DENSE | K_COMP;
    switch (t) {
    case POL_UNIFORM:
        return common;
    case POL_LAYER:
        return common | K_SPLITS | K_LW | K_CAL;
    case POL_PHASE:
        return common | K_PHASES | K_PW | K_CAL;
    case POL_LEGACY:
        return common | K_SPLITS | K_LW | K_PHASES | K_PW | K_W | K_CAL;
    case POL_LGRECO:
        return common | K_CAND | K_EVERY;
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
                             "\"legacy-phase\", \"legacy\", \"lgreco\"");
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
                                 "candidates, lgreco_every)",
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
    if ((val = json_object_get(root, "compressor")) != NULL) {
        const char *c = json_string_value(val);
        if (c != NULL && strcmp(c, "topk") == 0) {
            p->comp = STRATA_COMP_TOPK;
        } else if (c != NULL && strcmp(c, "randk") == 0 && type != POL_LGRECO) {
            p->comp = STRATA_COMP_RANDK;
        } else {
            rc = strata_diag_set(diag, STRATA_EINVAL, "%s",
                                 type == POL_LGRECO
                                     ? "compressor: lgreco needs \"topk\" (its error tables are "
                                       "top-k errors)"
                                     : "compressor: expected \"topk\" or \"randk\"");
            goto out;
        }
    }
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
    if ((val = json_object_get(root, "lgreco_every")) != NULL) {
        if ((rc = get_uint(val, "lgreco_every", 1, MAX_LGRECO_EVERY, &u, diag)) < 0)
            goto out;
        p->lgreco_every = (uint32_t)u;
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
    int rc;
    if (type_from_name(spec, &type)) {
        set_defaults(p, type);
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
                             "legacy-phase, legacy, lgreco), JSON text or @file.json",
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
    free(p->lg_density);
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
    bad |= json_object_set_new(o, "compressor",
                               json_string(p->comp == STRATA_COMP_RANDK ? "randk" : "topk"));
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
    if (p->type == POL_LAYER || p->type == POL_PHASE || p->type == POL_LEGACY)
        bad |= json_object_set_new(o, "calibration", json_string(cal_names[p->cal]));
    if (p->type == POL_LGRECO) {
        bad |= json_object_set_new(o, "candidates", real_array(p->cand, p->ncand));
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

size_t strata_policy_lgreco_candidates(const strata_policy *p, double d0, double *out)
{
    if (p->type != POL_LGRECO || !valid_d0(d0))
        return 0;
    size_t n = 0, i = 0;
    while (i < p->ncand && p->cand[i] < d0)
        out[n++] = p->cand[i++];
    out[n++] = d0;
    if (i < p->ncand && p->cand[i] == d0)
        i++;
    while (i < p->ncand)
        out[n++] = p->cand[i++];
    return n;
}

/* ---- densities and calibration ---- */

size_t strata_policy_kept(const size_t *numel, const double *density, size_t nlayers)
{
    size_t total = 0;
    for (size_t l = 0; l < nlayers; l++)
        total += (size_t)strata_comp_kept(density[l], numel[l]);
    return total;
}

static int is_dense(const strata_policy *p, size_t n)
{
    return n == 0 || n < p->dense_below;
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

/* Elements kept in one round of phase ph at scale alpha (dense layers
 * included). */
static double phase_kept(const strata_policy *p, const size_t *numel, size_t nlayers, uint32_t ph,
                         double alpha)
{
    size_t total = 0;
    for (size_t l = 0; l < nlayers; l++)
        total += is_dense(p, numel[l])
                     ? numel[l]
                     : (size_t)strata_comp_kept(scaled(alpha, p->w[ph][group_of(p, numel[l])]),
                                                numel[l]);
    return (double)total;
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
        int same = p->lg_nlayers == nlayers && p->lg_d0 == d0;
        for (size_t l = 0; same && l < nlayers; l++)
            same = p->lg_numel[l] == numel[l];
        if (!same)
            return strata_diag_set(diag, STRATA_ESTATE,
                                   "lgreco: the error table was solved for %zu layers at density "
                                   "%g, not for these %zu layers at %g",
                                   p->lg_nlayers, p->lg_d0, nlayers, d0);
        memcpy(density, p->lg_density, nlayers * sizeof(*density));
        return STRATA_OK;
    }

    uint32_t ph = strata_policy_phase(p, round, total_rounds);
    double alpha = d0;
    int any = 0;
    for (size_t l = 0; l < nlayers; l++)
        any |= !is_dense(p, numel[l]);
    if (p->cal != CAL_NONE && any) {
        volume_fn v = {p, numel, nlayers, {0}};
        double uniform = 0.0;
        for (size_t l = 0; l < nlayers; l++)
            uniform +=
                (double)(is_dense(p, numel[l]) ? numel[l] : (size_t)strata_comp_kept(d0, numel[l]));
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
    for (size_t l = 0; rc == STRATA_OK && l < nlayers; l++) {
        out[l].comp = d[l] >= 1.0 ? STRATA_COMP_NONE : p->comp;
        out[l].density = d[l];
    }
    free(d);
    return rc;
}

/* ---- lgreco ---- */

int strata_lgreco_uniform_error(const double *err, size_t nlayers, const double *cand, size_t ncand,
                                double d0, double *out, strata_diag *diag)
{
    *out = 0.0;
    size_t c0 = ncand;
    for (size_t c = 0; cand != NULL && c < ncand; c++)
        if (cand[c] == d0)
            c0 = c;
    if (c0 == ncand)
        return strata_diag_set(diag, STRATA_EINVAL, "lgreco: density %g is not a candidate", d0);
    if (nlayers > 0 && err == NULL)
        return strata_diag_set(diag, STRATA_EINVAL, "lgreco: NULL error table");
    double s = 0.0;
    for (size_t l = 0; l < nlayers; l++)
        s += err[l * ncand + c0];
    *out = s;
    return STRATA_OK;
}

int strata_lgreco_solve(const double *err, const size_t *numel, size_t nlayers, const double *cand,
                        size_t ncand, double budget, size_t *choice, strata_diag *diag)
{
    if (choice != NULL)
        memset(choice, 0, nlayers * sizeof(*choice));
    if (nlayers == 0)
        return STRATA_OK;
    if (err == NULL || numel == NULL || cand == NULL || choice == NULL)
        return strata_diag_set(diag, STRATA_EINVAL, "lgreco: NULL argument");
    if (ncand == 0 || ncand > 255)
        return strata_diag_set(diag, STRATA_EINVAL, "lgreco: %zu candidates (1 to 255 allowed)",
                               ncand);
    for (size_t c = 0; c < ncand; c++)
        if (!(cand[c] > 0.0 && cand[c] <= 1.0) || (c > 0 && cand[c] <= cand[c - 1]))
            return strata_diag_set(diag, STRATA_EINVAL,
                                   "lgreco: candidate %zu (%g) is not an ascending density in "
                                   "(0, 1]",
                                   c, cand[c]);
    if (!(budget >= 0.0 && isfinite(budget)))
        return strata_diag_set(diag, STRATA_EINVAL, "lgreco: budget %g is not a finite number >= 0",
                               budget);
    if (nlayers > SIZE_MAX / ncand)
        return STRATA_ENOMEM;
    for (size_t i = 0; i < nlayers * ncand; i++)
        if (!(err[i] >= 0.0 && isfinite(err[i])))
            return strata_diag_set(diag, STRATA_EINVAL,
                                   "lgreco: error of layer %zu at candidate %zu is %g (expected a "
                                   "finite number >= 0)",
                                   i / ncand, i % ncand, err[i]);

    const size_t Q = STRATA_LGRECO_RESOLUTION;
    const uint64_t INF = UINT64_MAX;
    int rc = STRATA_OK;
    uint32_t *units = NULL;
    uint64_t *kept = NULL, *prev = NULL, *cur = NULL;
    unsigned char *pick = NULL;
    if (nlayers > SIZE_MAX / (Q + 1) || nlayers * ncand > SIZE_MAX / sizeof(uint64_t))
        return STRATA_ENOMEM;
    units = malloc(nlayers * ncand * sizeof(*units));
    kept = malloc(nlayers * ncand * sizeof(*kept));
    prev = malloc((Q + 1) * sizeof(*prev));
    cur = malloc((Q + 1) * sizeof(*cur));
    pick = malloc(nlayers * (Q + 1));
    if (units == NULL || kept == NULL || prev == NULL || cur == NULL || pick == NULL) {
        rc = STRATA_ENOMEM;
        goto out;
    }
    /* Error in units of budget / Q, rounded up: floor(x) + 1 exceeds the
     * exact quotient even when x itself was rounded down. Zero stays zero. */
    for (size_t i = 0; i < nlayers * ncand; i++) {
        double x = budget > 0.0 ? err[i] / budget * (double)Q : INFINITY;
        units[i] = err[i] == 0.0 ? 0 : (x >= (double)Q ? (uint32_t)Q + 1 : (uint32_t)x + 1);
        kept[i] = strata_comp_kept(cand[i % ncand], numel[i / ncand]);
    }
    /* prev[q]: fewest kept elements over the layers so far with at most q
     * units of error. */
    for (size_t q = 0; q <= Q; q++)
        prev[q] = 0;
    for (size_t l = 0; l < nlayers; l++) {
        const uint32_t *u = units + l * ncand;
        const uint64_t *k = kept + l * ncand;
        unsigned char *pk = pick + l * (Q + 1);
        for (size_t q = 0; q <= Q; q++) {
            uint64_t best = INF;
            unsigned char bc = 0;
            for (size_t c = 0; c < ncand; c++) {
                if (u[c] > q || prev[q - u[c]] == INF)
                    continue;
                uint64_t v = prev[q - u[c]] + k[c];
                if (v < best) {
                    best = v;
                    bc = (unsigned char)c;
                }
            }
            cur[q] = best;
            pk[q] = bc;
        }
        uint64_t *t = prev;
        prev = cur;
        cur = t;
    }
    if (prev[Q] == INF) {
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
    free(kept);
    free(prev);
    free(cur);
    free(pick);
    return rc;
}

int strata_policy_set_lgreco_table(strata_policy *p, const double *err, const size_t *numel,
                                   size_t nlayers, double d0, strata_diag *diag)
{
    if (p == NULL || p->type != POL_LGRECO)
        return strata_diag_set(diag, STRATA_EINVAL, "lgreco table given to a policy of type %s",
                               p == NULL ? "(null)" : type_names[p->type]);
    double cand[STRATA_LGRECO_MAX_CAND + 1];
    size_t nc = strata_policy_lgreco_candidates(p, d0, cand);
    if (nc == 0)
        return strata_diag_set(diag, STRATA_EINVAL, "density: %g is not in (0, 1]", d0);
    if (nlayers > 0 && (err == NULL || numel == NULL))
        return strata_diag_set(diag, STRATA_EINVAL, "lgreco: NULL error table");
    if (nlayers > SIZE_MAX / nc / sizeof(double))
        return STRATA_ENOMEM;
    size_t c0 = 0;
    while (cand[c0] != d0)
        c0++;
    for (size_t l = 0; l < nlayers; l++)
        for (size_t c = 0; !is_dense(p, numel[l]) && c < nc; c++) {
            double e = err[l * nc + c];
            if (!(e >= 0.0 && isfinite(e)))
                return strata_diag_set(diag, STRATA_EINVAL,
                                       "lgreco table: error of layer %zu at density %g is %g "
                                       "(expected a finite number >= 0)",
                                       l, cand[c], e);
        }

    /* Solve over the compressible layers only. */
    int rc = STRATA_ENOMEM;
    size_t m = 0, *idx = malloc((nlayers + 1) * sizeof(size_t));
    size_t *sub_numel = malloc((nlayers + 1) * sizeof(size_t));
    size_t *choice = malloc((nlayers + 1) * sizeof(size_t));
    double *sub_err = malloc((nlayers * nc + 1) * sizeof(double));
    size_t *new_numel = malloc((nlayers + 1) * sizeof(size_t));
    double *new_density = malloc((nlayers + 1) * sizeof(double));
    if (idx == NULL || sub_numel == NULL || choice == NULL || sub_err == NULL ||
        new_numel == NULL || new_density == NULL)
        goto out;
    for (size_t l = 0; l < nlayers; l++) {
        new_numel[l] = numel[l];
        new_density[l] = 1.0;
        if (is_dense(p, numel[l]))
            continue;
        idx[m] = l;
        sub_numel[m] = numel[l];
        memcpy(sub_err + m * nc, err + l * nc, nc * sizeof(double));
        m++;
    }
    double budget;
    rc = strata_lgreco_uniform_error(sub_err, m, cand, nc, d0, &budget, diag);
    if (rc < 0)
        goto out;
    rc = strata_lgreco_solve(sub_err, sub_numel, m, cand, nc, budget, choice, diag);
    if (rc == STRATA_ENOMEM)
        goto out;
    /* Uniform meets the budget exactly; keep it unless the programme found
     * something no larger (rounding may make uniform itself infeasible for
     * the programme). */
    size_t k_dp = 0, k_uni = 0;
    for (size_t i = 0; i < m; i++) {
        k_dp += (size_t)strata_comp_kept(cand[choice[i]], sub_numel[i]);
        k_uni += (size_t)strata_comp_kept(d0, sub_numel[i]);
    }
    for (size_t i = 0; i < m; i++)
        new_density[idx[i]] = (rc == STRATA_OK && k_dp <= k_uni) ? cand[choice[i]] : d0;
    if (rc < 0 && diag != NULL) /* infeasible for the programme: uniform stands */
        diag->msg[0] = '\0';
    rc = STRATA_OK;
    free(p->lg_numel);
    free(p->lg_density);
    p->lg_numel = new_numel;
    p->lg_density = new_density;
    new_numel = NULL;
    new_density = NULL;
    p->lg_nlayers = nlayers;
    p->lg_d0 = d0;
    p->lg_ready = 1;
out:
    free(idx);
    free(sub_numel);
    free(choice);
    free(sub_err);
    free(new_numel);
    free(new_density);
    return rc;
}
