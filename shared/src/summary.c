/* The round summary JSON codec (strata/summary.h): the only place that
 * knows the summary's keys, including the quarantined updates and the
 * failure of a round.
 *
 * Encoding builds the object with jansson in the documented key order and
 * serialises it compactly in insertion order; decoding checks size and depth
 * before jansson runs, then each key group in that order. */
#include "strata/summary.h"

#include "json_strict.h"
#include "strata/compress.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <float.h>
#include <stdlib.h>
#include <string.h>

#define MAX_I64 INT64_MAX
#define COUNT(a) (sizeof(a) / sizeof((a)[0]))

static const char *const KEYS[] = {
    "round", "state", "model_version", "selected", "participants", "accuracy", "loss",
    "eval_samples", "uplink_bytes", "downlink_bytes", "dense_uplink_bytes", "duration_ms",
    "densities", "compressors", "lgreco", "quarantined", "failed", "stopped", "recovered",
    /* Derived from the stats (written with them, checked and ignored
     * when read): dense downlink = dense uplink (one float32 model
     * per participant), totals and the ratios dense / actual. */
    "dense_downlink_bytes", "total_bytes", "dense_total_bytes", "uplink_ratio", "downlink_ratio",
    "total_ratio"};

/* The derived traffic keys (see KEYS): counts, then ratios. */
static const char *const DERIVED_COUNTS[] = {"dense_downlink_bytes", "total_bytes",
                                             "dense_total_bytes"};
static const char *const DERIVED_RATIOS[] = {"uplink_ratio", "downlink_ratio", "total_ratio"};
static const char *const LGRECO_KEYS[] = {"fell_back", "error_budget",  "chosen_error",
                                          "bytes",     "uniform_bytes", "allocation"};

/* The keys of one quarantined entry, all required. */
static const char *const QUARANTINE_KEYS[] = {"client_id", "reason", "norm"};

static const char *const REASONS[] = {
    [STRATA_QUARANTINE_NORM] = "norm", [STRATA_QUARANTINE_NON_FINITE] = "non_finite"};

static const char *const FAILURES[] = {[STRATA_ROUND_FAILED_NONE] = "",
                                       [STRATA_ROUND_FAILED_AGGREGATE] = "aggregate_not_finite",
                                       [STRATA_ROUND_FAILED_MODEL] = "model_not_finite",
                                       [STRATA_ROUND_FAILED_LOSS] = "loss_not_finite",
                                       [STRATA_ROUND_FAILED_TOO_FEW] = "too_few_updates"};

/* The stats group: present together or not at all. */
static const char *const STATS_KEYS[] = {
    "accuracy", "loss", "uplink_bytes", "downlink_bytes", "dense_uplink_bytes", "duration_ms"};

typedef strata__json_limits limits;

static const char *state_name(strata_round_state s)
{
    return s == STRATA_ROUND_OPEN ? "open" : "closed";
}

const char *strata_quarantine_reason_name(strata_quarantine_reason r)
{
    return (unsigned)r < COUNT(REASONS) ? REASONS[r] : "?";
}

const char *strata_round_failure_name(strata_round_failure f)
{
    return (unsigned)f < COUNT(FAILURES) ? FAILURES[f] : "?";
}

/* ------------------------------------------------------------------------ */
/* Encoding                                                                 */
/* ------------------------------------------------------------------------ */

static int check_summary(const strata_round_summary *s, strata_diag *diag)
{
    if (s->state != STRATA_ROUND_OPEN && s->state != STRATA_ROUND_CLOSED)
        return strata_diag_set(diag, STRATA_EINVAL, "state: unknown value %d", (int)s->state);
    if (s->selected < 1)
        return strata_diag_set(diag, STRATA_EINVAL, "selected: must be at least 1");
    const struct {
        const char *name;
        uint64_t v;
        int used;
    } ints[] = {{"model_version", s->model_version, 1},
                {"selected", s->selected, 1},
                {"participants", s->participants, 1},
                {"uplink_bytes", s->uplink_bytes, s->has_stats},
                {"downlink_bytes", s->downlink_bytes, s->has_stats},
                {"dense_uplink_bytes", s->dense_uplink_bytes, s->has_stats},
                {"duration_ms", s->duration_ms, s->has_stats},
                {"eval_samples", s->eval_samples, s->has_stats}};
    for (size_t i = 0; i < COUNT(ints); i++)
        if (ints[i].used && ints[i].v > (uint64_t)MAX_I64)
            return strata_diag_set(diag, STRATA_EINVAL, "%s: %" PRIu64 " above 2^63 - 1",
                                   ints[i].name, ints[i].v);
    if (!s->has_stats && s->eval_samples > 0)
        return strata_diag_set(diag, STRATA_EINVAL, "eval_samples: without the round statistics");
    if ((unsigned)s->failed >= COUNT(FAILURES))
        return strata_diag_set(diag, STRATA_EINVAL, "failed: unknown value %d", (int)s->failed);
    if (s->num_quarantined > 0 && s->quarantined == NULL)
        return strata_diag_set(diag, STRATA_EINVAL, "quarantined: NULL array for %zu entries",
                               s->num_quarantined);
    if (s->num_quarantined > s->participants)
        return strata_diag_set(diag, STRATA_EINVAL,
                               "quarantined: %zu entries, more than the %" PRIu64 " participants",
                               s->num_quarantined, s->participants);
    for (size_t i = 0; i < s->num_quarantined; i++) {
        const strata_round_quarantine *q = &s->quarantined[i];
        if (q->client_id < 1 || q->client_id > (uint64_t)MAX_I64)
            return strata_diag_set(
                diag, STRATA_EINVAL,
                "quarantined[%zu].client_id: %" PRIu64 " is not in [1, 2^63 - 1]", i, q->client_id);
        if (i > 0 && q->client_id <= s->quarantined[i - 1].client_id)
            return strata_diag_set(diag, STRATA_EINVAL,
                                   "quarantined[%zu].client_id: %" PRIu64
                                   " does not ascend (after %" PRIu64 ")",
                                   i, q->client_id, s->quarantined[i - 1].client_id);
        if ((unsigned)q->reason >= COUNT(REASONS))
            return strata_diag_set(diag, STRATA_EINVAL, "quarantined[%zu].reason: unknown value %d",
                                   i, (int)q->reason);
        if (q->norm < 0)
            return strata_diag_set(diag, STRATA_EINVAL, "quarantined[%zu].norm: %.17g is negative",
                                   i, q->norm);
    }
    if (s->has_lgreco && !s->has_densities)
        return strata_diag_set(diag, STRATA_EINVAL, "lgreco: needs the densities");
    if (s->has_lgreco) {
        const double x[] = {s->lg_error_budget, s->lg_chosen_error, s->lg_bytes,
                            s->lg_uniform_bytes};
        for (size_t i = 0; i < COUNT(x); i++)
            if (!(x[i] >= 0.0 && isfinite(x[i])))
                return strata_diag_set(diag, STRATA_EINVAL,
                                       "lgreco: %s is %g (expected a finite number >= 0)",
                                       LGRECO_KEYS[i + 1], x[i]);
    }
    if (!s->has_densities)
        return STRATA_OK;
    if ((s->has_lgreco && s->num_layers > 0 && s->lg_allocation == NULL))
        return strata_diag_set(diag, STRATA_EINVAL, "lgreco.allocation: NULL array");
    for (size_t i = 0; i < s->num_layers; i++) {
        strata_budget b;
        strata_diag bd = {{0}};
        if ((s->compressors != NULL && strata_budget_parse(s->compressors[i], 1, &b, &bd) < 0) ||
            (s->has_lgreco && strata_budget_parse(s->lg_allocation[i], 1, &b, &bd) < 0))
            return strata_diag_set(diag, STRATA_EINVAL, "layer %zu: %s", i, bd.msg);
    }
    if (s->num_layers > 0 && (s->layer_names == NULL || s->densities == NULL))
        return strata_diag_set(diag, STRATA_EINVAL, "densities: NULL arrays for %zu layers",
                               s->num_layers);
    for (size_t i = 0; i < s->num_layers; i++) {
        const char *name = s->layer_names[i];
        char what[48];
        snprintf(what, sizeof(what), "densities: layer %zu", i);
        int rc = strata__json_check_name(name, name != NULL ? strlen(name) : 0,
                                         STRATA_SUMMARY_DEFAULT_MAX_NAME_BYTES, STRATA_EINVAL, what,
                                         diag);
        if (rc < 0)
            return rc;
        double d = s->densities[i];
        if (!(d > 0.0 && d <= 1.0))
            return strata_diag_set(diag, STRATA_EINVAL,
                                   "densities: layer %zu: %.17g is not in (0, 1]", i, d);
    }
    return STRATA_OK;
}

/* A finite double as a JSON real, anything else as null. */
static json_t *real_or_null(double x)
{
    return isfinite(x) ? json_real(x) : json_null();
}

/* Sets key on o to v (stolen); returns -1 when v is NULL or setting fails. */
static int put(json_t *o, const char *key, json_t *v)
{
    return v != NULL ? json_object_set_new(o, key, v) : -1;
}

static int put_int(json_t *o, const char *key, uint64_t v)
{
    return put(o, key, json_integer((json_int_t)v));
}

/* Builds the quarantined array (entries checked by check_summary). */
static json_t *quarantined_json(const strata_round_summary *s)
{
    json_t *a = json_array();
    for (size_t i = 0; a != NULL && i < s->num_quarantined; i++) {
        const strata_round_quarantine *q = &s->quarantined[i];
        json_t *o = json_object();
        int bad = o == NULL || put_int(o, "client_id", q->client_id) < 0 ||
                  put(o, "reason", json_string(REASONS[q->reason])) < 0 ||
                  put(o, "norm", real_or_null(q->norm)) < 0;
        if (bad)
            json_decref(o);
        /* json_array_append_new takes o even when it fails. */
        if (bad || json_array_append_new(a, o) < 0) {
            json_decref(a);
            a = NULL;
        }
    }
    return a;
}

/* Builds the densities object (specs NULL) or a per-layer object of
 * budget specifications; *dup is set when two layers share a name. */
static json_t *densities_json(const strata_round_summary *s, char *const *specs, int *dup)
{
    json_t *o = json_object();
    for (size_t i = 0; o != NULL && i < s->num_layers; i++) {
        if (json_object_get(o, s->layer_names[i]) != NULL) {
            *dup = 1;
            json_decref(o);
            return NULL;
        }
        json_t *v = specs != NULL ? json_string(specs[i]) : json_real(s->densities[i]);
        if (put(o, s->layer_names[i], v) < 0) {
            json_decref(o);
            o = NULL;
        }
    }
    return o;
}

int strata_round_summary_encode(const strata_round_summary *s, char **json_out, size_t *len_out,
                                strata_diag *diag)
{
    if (json_out != NULL)
        *json_out = NULL;
    if (len_out != NULL)
        *len_out = 0;
    if (diag != NULL)
        diag->msg[0] = '\0';
    if (s == NULL || json_out == NULL || len_out == NULL)
        return strata_diag_set(diag, STRATA_EINVAL, "round summary encode: NULL argument");
    int rc = check_summary(s, diag);
    if (rc < 0)
        return rc;
    json_t *o = json_object();
    int bad = o == NULL || put_int(o, "round", s->round) < 0 ||
              put(o, "state", json_string(state_name(s->state))) < 0 ||
              put_int(o, "model_version", s->model_version) < 0 ||
              put_int(o, "selected", s->selected) < 0 ||
              put_int(o, "participants", s->participants) < 0;
    if (!bad && s->has_stats)
        bad = put(o, "accuracy", real_or_null(s->accuracy)) < 0 ||
              put(o, "loss", real_or_null(s->loss)) < 0 ||
              (s->eval_samples > 0 && put_int(o, "eval_samples", s->eval_samples) < 0) ||
              put_int(o, "uplink_bytes", s->uplink_bytes) < 0 ||
              put_int(o, "downlink_bytes", s->downlink_bytes) < 0 ||
              put_int(o, "dense_uplink_bytes", s->dense_uplink_bytes) < 0 ||
              put_int(o, "duration_ms", s->duration_ms) < 0;
    if (!bad && s->has_stats) {
        double up = (double)s->uplink_bytes, down = (double)s->downlink_bytes,
               dense = (double)s->dense_uplink_bytes;
        /* Counts that would pass 2^63 - 1 are left out. */
        uint64_t total = s->uplink_bytes + s->downlink_bytes;
        int total_ok = total <= (uint64_t)MAX_I64 && total >= s->uplink_bytes;
        int dense_ok = s->dense_uplink_bytes <= (uint64_t)MAX_I64 / 2;
        bad =
            put_int(o, "dense_downlink_bytes", s->dense_uplink_bytes) < 0 ||
            (total_ok && put_int(o, "total_bytes", total) < 0) ||
            (dense_ok && put_int(o, "dense_total_bytes", 2 * s->dense_uplink_bytes) < 0) ||
            put(o, "uplink_ratio", real_or_null(up > 0 ? dense / up : NAN)) < 0 ||
            put(o, "downlink_ratio", real_or_null(down > 0 ? dense / down : NAN)) < 0 ||
            put(o, "total_ratio", real_or_null(up + down > 0 ? 2 * dense / (up + down) : NAN)) < 0;
    }
    int dup = 0;
    if (!bad && s->has_densities)
        bad = put(o, "densities", densities_json(s, NULL, &dup)) < 0;
    if (!bad && s->has_densities && s->compressors != NULL)
        bad = put(o, "compressors", densities_json(s, s->compressors, &dup)) < 0;
    if (!bad && s->has_lgreco) {
        json_t *l = json_pack("{s:b,s:f,s:f,s:f,s:f}", "fell_back", s->lg_fell_back, "error_budget",
                              s->lg_error_budget, "chosen_error", s->lg_chosen_error, "bytes",
                              s->lg_bytes, "uniform_bytes", s->lg_uniform_bytes);
        bad = l == NULL || put(l, "allocation", densities_json(s, s->lg_allocation, &dup)) < 0 ||
              put(o, "lgreco", l) < 0;
    }
    if (!bad && s->num_quarantined > 0)
        bad = put(o, "quarantined", quarantined_json(s)) < 0;
    if (!bad && s->failed != STRATA_ROUND_FAILED_NONE)
        bad = put(o, "failed", json_string(FAILURES[s->failed])) < 0;
    if (!bad && s->stopped)
        bad = put(o, "stopped", json_true()) < 0;
    if (!bad && s->recovered)
        bad = put(o, "recovered", json_true()) < 0;
    rc = bad ? STRATA_ENOMEM : strata__json_dump(o, json_out, len_out);
    json_decref(o);
    if (dup)
        return strata_diag_set(diag, STRATA_EINVAL, "densities: a layer name appears twice");
    if (rc < 0)
        return strata_diag_set(diag, rc,
                               "round summary encode: out of memory (or a layer name that is "
                               "not UTF-8)");
    return STRATA_OK;
}

/* ------------------------------------------------------------------------ */
/* Decoding                                                                 */
/* ------------------------------------------------------------------------ */

static int get_count(const json_t *o, const char *key, int64_t min, uint64_t *out,
                     strata_diag *diag)
{
    int64_t v = 0;
    int rc = strata__json_int(o, key, min, MAX_I64, "summary", &v, diag);
    *out = (uint64_t)v;
    return rc;
}

/* A number, or null for NaN. */
static int get_metric(const json_t *o, const char *key, double *out, strata_diag *diag)
{
    *out = 0.0;
    const json_t *v = json_object_get(o, key);
    if (json_is_null(v)) {
        *out = NAN;
        return STRATA_OK;
    }
    return strata__json_number(o, key, -HUGE_VAL, 0, HUGE_VAL, 0, "summary", out, diag);
}

static int get_flag(const json_t *o, const char *key, int *out, strata_diag *diag)
{
    *out = 0;
    const json_t *v = json_object_get(o, key);
    if (v == NULL)
        return STRATA_OK;
    if (!json_is_boolean(v))
        return strata_diag_set(diag, STRATA_EPROTO, "summary.%s: expected true or false", key);
    *out = json_is_true(v);
    return STRATA_OK;
}

static int get_stats(const json_t *o, strata_round_summary *s, strata_diag *diag)
{
    s->accuracy = s->loss = NAN; /* unknown until the statistics say otherwise */
    size_t present = 0;
    for (size_t i = 0; i < COUNT(STATS_KEYS); i++)
        present += json_object_get(o, STATS_KEYS[i]) != NULL;
    if (present == 0)
        return json_object_get(o, "eval_samples") == NULL
                   ? STRATA_OK
                   : strata_diag_set(diag, STRATA_EPROTO,
                                     "summary.eval_samples: without the round statistics");
    for (size_t i = 0; i < COUNT(STATS_KEYS); i++)
        if (json_object_get(o, STATS_KEYS[i]) == NULL)
            return strata_diag_set(diag, STRATA_EPROTO,
                                   "summary.%s: missing (the round statistics come together)",
                                   STATS_KEYS[i]);
    s->has_stats = 1;
    int rc;
    if ((rc = get_metric(o, "accuracy", &s->accuracy, diag)) < 0 ||
        (rc = get_metric(o, "loss", &s->loss, diag)) < 0 ||
        (rc = get_count(o, "uplink_bytes", 0, &s->uplink_bytes, diag)) < 0 ||
        (rc = get_count(o, "downlink_bytes", 0, &s->downlink_bytes, diag)) < 0 ||
        (rc = get_count(o, "dense_uplink_bytes", 0, &s->dense_uplink_bytes, diag)) < 0 ||
        (rc = get_count(o, "duration_ms", 0, &s->duration_ms, diag)) < 0)
        return rc;
    if (json_object_get(o, "eval_samples") != NULL &&
        (rc = get_count(o, "eval_samples", 1, &s->eval_samples, diag)) < 0)
        return rc;
    for (size_t i = 0; i < COUNT(DERIVED_COUNTS); i++) {
        uint64_t ignored;
        if (json_object_get(o, DERIVED_COUNTS[i]) != NULL &&
            (rc = get_count(o, DERIVED_COUNTS[i], 0, &ignored, diag)) < 0)
            return rc;
    }
    for (size_t i = 0; i < COUNT(DERIVED_RATIOS); i++) {
        double ignored;
        if (json_object_get(o, DERIVED_RATIOS[i]) != NULL &&
            (rc = get_metric(o, DERIVED_RATIOS[i], &ignored, diag)) < 0)
            return rc;
    }
    return STRATA_OK;
}

static int get_densities(const json_t *o, const limits *lim, strata_round_summary *s,
                         strata_diag *diag)
{
    const json_t *d = json_object_get(o, "densities");
    if (d == NULL)
        return STRATA_OK;
    if (!json_is_object(d))
        return strata_diag_set(diag, STRATA_EPROTO, "summary.densities: expected an object");
    s->has_densities = 1;
    size_t n = json_object_size(d);
    if (n > lim->max_layers)
        return strata_diag_set(diag, STRATA_ETOOBIG,
                               "summary.densities: %zu entries, above the limit of %zu layers", n,
                               lim->max_layers);
    if (n == 0)
        return STRATA_OK;
    s->layer_names = calloc(n, sizeof(*s->layer_names));
    s->densities = calloc(n, sizeof(*s->densities));
    if (s->layer_names == NULL || s->densities == NULL)
        return strata_diag_set(diag, STRATA_ENOMEM, "summary: out of memory (%zu layers)", n);
    s->num_layers = n;
    size_t i = 0;
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)d, key, v)
    {
        char what[48];
        snprintf(what, sizeof(what), "summary.densities key %zu", i);
        int rc = strata__json_check_name(key, strlen(key), lim->max_name_bytes, STRATA_EPROTO, what,
                                         diag);
        if (rc == 0 && (rc = strata__json_strdup(key, &s->layer_names[i])) < 0)
            strata_diag_set(diag, rc, "summary: out of memory");
        if (rc < 0)
            return rc;
        char q[STRATA__JSON_QUOTE_SIZE];
        strata__json_quote(key, strlen(key), q);
        if (!json_is_number(v))
            return strata_diag_set(diag, STRATA_EPROTO, "summary.densities.%s: expected a number",
                                   q);
        double x = json_number_value(v);
        if (!(x > 0.0 && x <= 1.0))
            return strata_diag_set(diag, STRATA_EPROTO,
                                   "summary.densities.%s: %.17g is not in (0, 1]", q, x);
        s->densities[i++] = x;
    }
    return STRATA_OK;
}

/* A per-layer object of budget specifications ("compressors", the lgreco
 * allocation) over exactly the layers of "densities", in their order, into
 * a new array *out. */
static int get_specs(const json_t *o, const char *where, const strata_round_summary *s, char ***out,
                     strata_diag *diag)
{
    if (!json_is_object(o))
        return strata_diag_set(diag, STRATA_EPROTO, "summary.%s: expected an object", where);
    if (!s->has_densities || json_object_size(o) != s->num_layers)
        return strata_diag_set(diag, STRATA_EPROTO,
                               "summary.%s: expected the %zu layers of \"densities\"", where,
                               s->num_layers);
    *out = calloc(s->num_layers + 1, sizeof(char *));
    if (*out == NULL)
        return strata_diag_set(diag, STRATA_ENOMEM, "summary: out of memory");
    size_t i = 0;
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)o, key, v)
    {
        if (strcmp(key, s->layer_names[i]) != 0)
            return strata_diag_set(diag, STRATA_EPROTO,
                                   "summary.%s: key %zu is not layer %zu of \"densities\"", where,
                                   i, i);
        strata_budget b;
        strata_diag bd = {{0}};
        if (!json_is_string(v) || strata_budget_parse(json_string_value(v), 1, &b, &bd) < 0)
            return strata_diag_set(diag, STRATA_EPROTO, "summary.%s: layer %zu: %s", where, i,
                                   bd.msg[0] ? bd.msg : "expected a compressor specification");
        if (strata__json_strdup(json_string_value(v), &(*out)[i]) < 0)
            return strata_diag_set(diag, STRATA_ENOMEM, "summary: out of memory");
        i++;
    }
    return STRATA_OK;
}

static int get_lgreco(const json_t *o, strata_round_summary *s, strata_diag *diag)
{
    const json_t *c = json_object_get(o, "compressors");
    int rc;
    if (c != NULL && (rc = get_specs(c, "compressors", s, &s->compressors, diag)) < 0)
        return rc;
    const json_t *l = json_object_get(o, "lgreco");
    if (l == NULL)
        return STRATA_OK;
    if (!json_is_object(l))
        return strata_diag_set(diag, STRATA_EPROTO, "summary.lgreco: expected an object");
    s->has_lgreco = 1;
    const char *where = "summary.lgreco";
    if ((rc = strata__json_known_keys(l, LGRECO_KEYS, COUNT(LGRECO_KEYS), where, diag)) < 0)
        return rc;
    const json_t *fb = json_object_get(l, "fell_back");
    if (!json_is_boolean(fb))
        return strata_diag_set(diag, STRATA_EPROTO, "%s.fell_back: expected a boolean", where);
    s->lg_fell_back = json_is_true(fb);
    double *x[] = {&s->lg_error_budget, &s->lg_chosen_error, &s->lg_bytes, &s->lg_uniform_bytes};
    for (size_t i = 0; i < COUNT(x); i++)
        if ((rc = strata__json_number(l, LGRECO_KEYS[i + 1], 0.0, 0, DBL_MAX, 0, where, x[i],
                                      diag)) < 0)
            return rc;
    const json_t *a = json_object_get(l, "allocation");
    if (a == NULL)
        return strata_diag_set(diag, STRATA_EPROTO, "%s.allocation: missing", where);
    return get_specs(a, "lgreco.allocation", s, &s->lg_allocation, diag);
}

/* The "quarantined" array: at most participants entries (read before). */
static int get_quarantined(const json_t *o, strata_round_summary *s, strata_diag *diag)
{
    const json_t *a = json_object_get(o, "quarantined");
    if (a == NULL)
        return STRATA_OK;
    if (!json_is_array(a))
        return strata_diag_set(diag, STRATA_EPROTO, "summary.quarantined: expected an array");
    size_t n = json_array_size(a);
    if (n > s->participants)
        return strata_diag_set(diag, STRATA_EPROTO,
                               "summary.quarantined: %zu entries, more than the %" PRIu64
                               " participants",
                               n, s->participants);
    if (n == 0)
        return STRATA_OK;
    s->quarantined = calloc(n, sizeof(*s->quarantined));
    if (s->quarantined == NULL)
        return strata_diag_set(diag, STRATA_ENOMEM, "summary: out of memory (%zu quarantined)", n);
    s->num_quarantined = n;
    for (size_t i = 0; i < n; i++) {
        const json_t *e = json_array_get(a, i);
        strata_round_quarantine *q = &s->quarantined[i];
        char where[48];
        snprintf(where, sizeof(where), "summary.quarantined[%zu]", i);
        if (!json_is_object(e))
            return strata_diag_set(diag, STRATA_EPROTO, "%s: expected an object", where);
        int64_t id = 0;
        int rc;
        if ((rc = strata__json_known_keys(e, QUARANTINE_KEYS, COUNT(QUARANTINE_KEYS), where,
                                          diag)) < 0 ||
            (rc = strata__json_int(e, "client_id", 1, MAX_I64, where, &id, diag)) < 0)
            return rc;
        q->client_id = (uint64_t)id;
        if (i > 0 && q->client_id <= s->quarantined[i - 1].client_id)
            return strata_diag_set(diag, STRATA_EPROTO,
                                   "%s.client_id: %" PRIu64 " does not ascend (after %" PRIu64 ")",
                                   where, q->client_id, s->quarantined[i - 1].client_id);
        const char *r = json_string_value(json_object_get(e, "reason"));
        size_t k = 0;
        while (r != NULL && k < COUNT(REASONS) && strcmp(r, REASONS[k]) != 0)
            k++;
        if (r == NULL || k == COUNT(REASONS))
            return strata_diag_set(diag, STRATA_EPROTO,
                                   "%s.reason: expected \"norm\" or \"non_finite\"", where);
        q->reason = (strata_quarantine_reason)k;
        const json_t *nv = json_object_get(e, "norm");
        if (nv == NULL)
            return strata_diag_set(diag, STRATA_EPROTO, "%s.norm: missing", where);
        if (json_is_null(nv))
            q->norm = NAN;
        else if ((rc = strata__json_number(e, "norm", 0.0, 0, HUGE_VAL, 0, where, &q->norm, diag)) <
                 0)
            return rc;
    }
    return STRATA_OK;
}

/* The "failed" name, when present. */
static int get_failed(const json_t *o, strata_round_summary *s, strata_diag *diag)
{
    const json_t *v = json_object_get(o, "failed");
    if (v == NULL)
        return STRATA_OK;
    const char *f = json_string_value(v);
    for (size_t k = 1; f != NULL && k < COUNT(FAILURES); k++)
        if (strcmp(f, FAILURES[k]) == 0) {
            s->failed = (strata_round_failure)k;
            return STRATA_OK;
        }
    return strata_diag_set(diag, STRATA_EPROTO,
                           "summary.failed: expected \"aggregate_not_finite\", "
                           "\"model_not_finite\", \"loss_not_finite\" or \"too_few_updates\"");
}

static int get_summary(const json_t *o, const limits *lim, void *out, strata_diag *diag)
{
    strata_round_summary *s = out;
    int64_t round = 0;
    int rc;
    if ((rc = strata__json_known_keys(o, KEYS, COUNT(KEYS), "summary", diag)) < 0 ||
        (rc = strata__json_int(o, "round", 0, UINT32_MAX, "summary", &round, diag)) < 0)
        return rc;
    s->round = (uint32_t)round;
    const json_t *st = json_object_get(o, "state");
    if (st == NULL)
        return strata_diag_set(diag, STRATA_EPROTO, "summary.state: missing");
    const char *sv = json_string_value(st);
    if (sv != NULL && strcmp(sv, "open") == 0)
        s->state = STRATA_ROUND_OPEN;
    else if (sv != NULL && strcmp(sv, "closed") == 0)
        s->state = STRATA_ROUND_CLOSED;
    else
        return strata_diag_set(diag, STRATA_EPROTO,
                               "summary.state: expected \"open\" or \"closed\"");
    if ((rc = get_count(o, "model_version", 0, &s->model_version, diag)) < 0 ||
        (rc = get_count(o, "selected", 1, &s->selected, diag)) < 0 ||
        (rc = get_count(o, "participants", 0, &s->participants, diag)) < 0 ||
        (rc = get_stats(o, s, diag)) < 0 || (rc = get_densities(o, lim, s, diag)) < 0 ||
        (rc = get_lgreco(o, s, diag)) < 0 || (rc = get_quarantined(o, s, diag)) < 0 ||
        (rc = get_failed(o, s, diag)) < 0 || (rc = get_flag(o, "stopped", &s->stopped, diag)) < 0 ||
        (rc = get_flag(o, "recovered", &s->recovered, diag)) < 0)
        return rc;
    return STRATA_OK;
}

static void summary_cleanup_v(void *p)
{
    strata_round_summary_cleanup(p);
}

static const strata__json_codec CODEC = {"summary",
                                         STRATA_SUMMARY_MAX_DEPTH,
                                         {STRATA_SUMMARY_DEFAULT_MAX_BYTES,
                                          STRATA_SUMMARY_DEFAULT_MAX_LAYERS,
                                          STRATA_SUMMARY_DEFAULT_MAX_NAME_BYTES},
                                         sizeof(strata_round_summary),
                                         get_summary,
                                         summary_cleanup_v};

int strata_round_summary_decode(const char *json, size_t len, const strata_summary_limits *lim,
                                strata_round_summary *out, strata_diag *diag)
{
    strata__json_limits l = {0};
    if (lim != NULL)
        l = (strata__json_limits){lim->max_bytes, lim->max_layers, lim->max_name_bytes};
    return strata__json_decode(&CODEC, json, len, &l, out, diag);
}

void strata_round_summary_cleanup(strata_round_summary *s)
{
    if (s == NULL)
        return;
    if (s->compressors != NULL)
        strata__json_free_names(s->compressors, s->num_layers);
    if (s->lg_allocation != NULL)
        strata__json_free_names(s->lg_allocation, s->num_layers);
    strata__json_free_names(s->layer_names, s->num_layers);
    free(s->densities);
    free(s->quarantined);
    memset(s, 0, sizeof(*s));
}
