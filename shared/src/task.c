/* The task JSON codec (strata/task.h).
 *
 * The field ranges live once in the constants below: the encoder checks the
 * struct against them (check_task), the decoder checks each JSON value
 * against them as it reads it. Encoding builds the object with jansson and
 * serialises it compactly in insertion order. */
#include "strata/task.h"

#include "json_strict.h"

#include <float.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_I32 ((int64_t)INT32_MAX)
#define MAX_I64 INT64_MAX
#define MAX_SEED ((int64_t)((UINT64_C(1) << 53) - 1))
#define MAX_RATE ((double)FLT_MAX) /* lr, weight_decay, prox_mu */

static const char *const TASK_KEYS[] = {
    "round", "total_rounds", "model_version", "deadline_unix_ms", "budgets", "error_candidates",
    "train", "seed",         "model_digest",  "downlink"};
static const char *const BUDGET_KEYS[] = {"layer",  "compressor", "density",
                                          "levels", "rank",       "values"};
/* A candidate is a budget without its layer. */
#define CAND_KEYS (BUDGET_KEYS + 1)
#define CAND_NKEYS (COUNT(BUDGET_KEYS) - 1)
static const char *const TRAIN_KEYS[] = {"epochs",       "batch",   "lr",       "momentum",
                                         "weight_decay", "prox_mu", "max_steps"};

#define COUNT(a) (sizeof(a) / sizeof((a)[0]))

typedef strata__json_limits limits;

/* ------------------------------------------------------------------------ */
/* Encoding                                                                 */
/* ------------------------------------------------------------------------ */

static int in_range(double x, double lo, int lo_open, double hi, int hi_open)
{
    return (lo_open ? x > lo : x >= lo) && (hi_open ? x < hi : x <= hi);
}

/* Checks budget b (`where`: "budgets[3]") against the ranges of
 * strata/task.h. */
static int check_budget(const strata_budget *b, const char *where, strata_diag *diag)
{
    if ((unsigned)b->comp >= STRATA_COMP_COUNT)
        return strata_diag_set(diag, STRATA_EINVAL, "%s.compressor: unknown id %d", where,
                               (int)b->comp);
    if (!in_range(b->density, 0.0, 1, 1.0, 0))
        return strata_diag_set(diag, STRATA_EINVAL, "%s.density: %.17g is not in (0, 1]", where,
                               b->density);
    if (b->levels > (uint32_t)MAX_I32 || b->rank > (uint32_t)MAX_I32)
        return strata_diag_set(diag, STRATA_EINVAL,
                               "%s: levels %" PRIu32 " or rank %" PRIu32 " above 2^31 - 1", where,
                               b->levels, b->rank);
    strata_diag inner = {{0}};
    if (strata_budget_check(b, &inner) < 0)
        return strata_diag_set(diag, STRATA_EINVAL, "%s: %s", where, inner.msg);
    return STRATA_OK;
}

static int check_task(const strata_task *t, strata_diag *diag)
{
    size_t dl = strnlen(t->model_digest, sizeof(t->model_digest));
    int dok = dl == 0 || dl == 64;
    for (size_t i = 0; dok && i < dl; i++)
        dok = (t->model_digest[i] >= '0' && t->model_digest[i] <= '9') ||
              (t->model_digest[i] >= 'a' && t->model_digest[i] <= 'f');
    if (!dok)
        return strata_diag_set(diag, STRATA_EINVAL,
                               "model_digest: expected \"\" or 64 lowercase hex digits");
    if (t->total_rounds < 1)
        return strata_diag_set(diag, STRATA_EINVAL, "total_rounds: must be at least 1");
    if (t->model_version > (uint64_t)MAX_I64)
        return strata_diag_set(diag, STRATA_EINVAL, "model_version: %" PRIu64 " above 2^63 - 1",
                               t->model_version);
    if (t->deadline_unix_ms < 0)
        return strata_diag_set(diag, STRATA_EINVAL, "deadline_unix_ms: %" PRId64 " is negative",
                               t->deadline_unix_ms);
    if (t->num_layers > 0 && (t->layer_names == NULL || t->budgets == NULL))
        return strata_diag_set(diag, STRATA_EINVAL, "budgets: NULL arrays for %zu layers",
                               t->num_layers);
    if (t->num_candidates > STRATA_TASK_MAX_CANDIDATES ||
        (t->num_candidates > 0 && t->candidates == NULL))
        return strata_diag_set(diag, STRATA_EINVAL,
                               "error_candidates: %zu entries (at most %u, and not NULL)",
                               t->num_candidates, STRATA_TASK_MAX_CANDIDATES);
    char where[48];
    for (size_t i = 0; i < t->num_layers; i++) {
        const char *name = t->layer_names[i];
        snprintf(where, sizeof(where), "budgets[%zu].layer", i);
        int rc =
            strata__json_check_name(name, name != NULL ? strlen(name) : 0,
                                    STRATA_TASK_DEFAULT_MAX_NAME_BYTES, STRATA_EINVAL, where, diag);
        snprintf(where, sizeof(where), "budgets[%zu]", i);
        if (rc < 0 || (rc = check_budget(&t->budgets[i], where, diag)) < 0)
            return rc;
    }
    for (size_t i = 0; i < t->num_candidates; i++) {
        snprintf(where, sizeof(where), "error_candidates[%zu]", i);
        int rc = check_budget(&t->candidates[i], where, diag);
        if (rc < 0)
            return rc;
    }
    const strata_task_train *tr = &t->train;
    if (tr->epochs < 1 || tr->epochs > (uint32_t)MAX_I32)
        return strata_diag_set(diag, STRATA_EINVAL,
                               "train.epochs: %" PRIu32 " is not in [1, %" PRId64 "]", tr->epochs,
                               MAX_I32);
    if (tr->batch < 1 || tr->batch > (uint32_t)MAX_I32)
        return strata_diag_set(diag, STRATA_EINVAL,
                               "train.batch: %" PRIu32 " is not in [1, %" PRId64 "]", tr->batch,
                               MAX_I32);
    const struct {
        const char *name;
        double v;
        double hi;
        int hi_open;
    } reals[] = {{"lr", tr->lr, MAX_RATE, 0},
                 {"momentum", tr->momentum, 1.0, 1},
                 {"weight_decay", tr->weight_decay, MAX_RATE, 0},
                 {"prox_mu", tr->prox_mu, MAX_RATE, 0}};
    for (size_t i = 0; i < COUNT(reals); i++)
        if (!in_range(reals[i].v, 0.0, 0, reals[i].hi, reals[i].hi_open))
            return strata_diag_set(diag, STRATA_EINVAL, "train.%s: %.17g is not in [0, %.17g%c",
                                   reals[i].name, reals[i].v, reals[i].hi,
                                   reals[i].hi_open ? ')' : ']');
    if (tr->max_steps > (uint64_t)MAX_I64)
        return strata_diag_set(diag, STRATA_EINVAL, "train.max_steps: %" PRIu64 " above 2^63 - 1",
                               tr->max_steps);
    if (t->seed > (uint64_t)MAX_SEED)
        return strata_diag_set(diag, STRATA_EINVAL, "seed: %" PRIu64 " above 2^53 - 1", t->seed);
    return STRATA_OK;
}

/* The budgets (names given) or the candidates (names NULL) as a JSON
 * array. */
static json_t *budgets_json(const strata_budget *bs, char *const *names, size_t n)
{
    json_t *arr = json_array();
    for (size_t i = 0; arr != NULL && i < n; i++) {
        const strata_budget *b = &bs[i];
        const char *comp = strata_comp_name(b->comp), *vf = strata_values_format_name(b->values);
        json_t *o = names != NULL ? json_pack("{s:s,s:s,s:f,s:i,s:i,s:s}", "layer", names[i],
                                              "compressor", comp, "density", b->density, "levels",
                                              (int)b->levels, "rank", (int)b->rank, "values", vf)
                                  : json_pack("{s:s,s:f,s:i,s:i,s:s}", "compressor", comp,
                                              "density", b->density, "levels", (int)b->levels,
                                              "rank", (int)b->rank, "values", vf);
        if (json_array_append_new(arr, o) < 0) {
            json_decref(arr);
            arr = NULL;
        }
    }
    return arr;
}

int strata_task_encode(const strata_task *t, char **json_out, size_t *len_out, strata_diag *diag)
{
    if (json_out != NULL)
        *json_out = NULL;
    if (len_out != NULL)
        *len_out = 0;
    if (diag != NULL)
        diag->msg[0] = '\0';
    if (t == NULL || json_out == NULL || len_out == NULL)
        return strata_diag_set(diag, STRATA_EINVAL, "task encode: NULL argument");
    int rc = check_task(t, diag);
    if (rc < 0)
        return rc;
    const strata_task_train *tr = &t->train;
    /* "o" steals the budgets array, also when json_pack fails. */
    json_t *j = json_pack(
        "{s:I,s:I,s:I,s:I,s:o,s:o,s:{s:I,s:I,s:f,s:f,s:f,s:f,s:I},s:I}", "round",
        (json_int_t)t->round, "total_rounds", (json_int_t)t->total_rounds, "model_version",
        (json_int_t)t->model_version, "deadline_unix_ms", (json_int_t)t->deadline_unix_ms,
        "budgets", budgets_json(t->budgets, t->layer_names, t->num_layers), "error_candidates",
        budgets_json(t->candidates, NULL, t->num_candidates), "train", "epochs",
        (json_int_t)tr->epochs, "batch", (json_int_t)tr->batch, "lr", tr->lr, "momentum",
        tr->momentum, "weight_decay", tr->weight_decay, "prox_mu", tr->prox_mu, "max_steps",
        (json_int_t)tr->max_steps, "seed", (json_int_t)t->seed);
    if (j != NULL && t->model_digest[0] != '\0' &&
        json_object_set_new(j, "model_digest", json_string(t->model_digest)) < 0) {
        json_decref(j);
        j = NULL;
    }
    if (j != NULL && t->downlink && json_object_set_new(j, "downlink", json_true()) < 0) {
        json_decref(j);
        j = NULL;
    }
    rc = j != NULL ? strata__json_dump(j, json_out, len_out) : STRATA_ENOMEM;
    json_decref(j);
    if (rc < 0)
        return strata_diag_set(diag, rc, "task encode: out of memory");
    return STRATA_OK;
}

/* ------------------------------------------------------------------------ */
/* Decoding                                                                 */
/* ------------------------------------------------------------------------ */

/* Reads the budget fields (all but "layer") of the object v into b; where
 * is its path for messages ("budgets[3]"). */
static int get_budget_fields(const json_t *v, const char *where, strata_budget *b,
                             strata_diag *diag)
{
    const json_t *cv = json_object_get(v, "compressor");
    if (cv == NULL)
        return strata_diag_set(diag, STRATA_EPROTO, "%s.compressor: missing", where);
    if (!json_is_string(cv))
        return strata_diag_set(diag, STRATA_EPROTO, "%s.compressor: expected a string", where);
    char q[STRATA__JSON_QUOTE_SIZE];
    if (strata_comp_from_name(json_string_value(cv), &b->comp) < 0) {
        strata__json_quote(json_string_value(cv), json_string_length(cv), q);
        return strata_diag_set(diag, STRATA_EPROTO, "%s.compressor: unknown compressor \"%s\"",
                               where, q);
    }
    int64_t levels = 0, rank = 0;
    int rc;
    if ((rc = strata__json_number(v, "density", 0.0, 1, 1.0, 0, where, &b->density, diag)) < 0 ||
        (rc = strata__json_int(v, "levels", 0, MAX_I32, where, &levels, diag)) < 0 ||
        (rc = strata__json_int(v, "rank", 0, MAX_I32, where, &rank, diag)) < 0)
        return rc;
    b->levels = (uint32_t)levels;
    b->rank = (uint32_t)rank;
    const json_t *vv = json_object_get(v, "values");
    if (vv == NULL)
        return strata_diag_set(diag, STRATA_EPROTO, "%s.values: missing", where);
    if (!json_is_string(vv))
        return strata_diag_set(diag, STRATA_EPROTO, "%s.values: expected a string", where);
    if (strata_values_format_parse(json_string_value(vv), &b->values) < 0) {
        strata__json_quote(json_string_value(vv), json_string_length(vv), q);
        return strata_diag_set(diag, STRATA_EPROTO, "%s.values: unknown values format \"%s\"",
                               where, q);
    }
    strata_diag inner = {{0}};
    if (strata_budget_check(b, &inner) < 0)
        return strata_diag_set(diag, STRATA_EPROTO, "%s: %s", where, inner.msg);
    return STRATA_OK;
}

/* Reads budget i from the array element v into t (whose arrays are
 * allocated). */
static int get_budget(const json_t *v, size_t i, const limits *lim, strata_task *t,
                      strata_diag *diag)
{
    char where[48];
    snprintf(where, sizeof(where), "budgets[%zu]", i);
    if (!json_is_object(v))
        return strata_diag_set(diag, STRATA_EPROTO, "%s: expected an object", where);
    int rc = strata__json_known_keys(v, BUDGET_KEYS, COUNT(BUDGET_KEYS), where, diag);
    if (rc < 0)
        return rc;
    char what[80];
    snprintf(what, sizeof(what), "%s.layer", where);
    const json_t *lv = json_object_get(v, "layer");
    if (lv == NULL)
        return strata_diag_set(diag, STRATA_EPROTO, "%s: missing", what);
    const char *name = NULL;
    if ((rc = strata__json_name(lv, lim->max_name_bytes, what, &name, diag)) < 0 ||
        (rc = get_budget_fields(v, where, &t->budgets[i], diag)) < 0)
        return rc;
    if ((rc = strata__json_strdup(name, &t->layer_names[i])) < 0)
        return strata_diag_set(diag, rc, "task: out of memory");
    return STRATA_OK;
}

static int get_budgets(const json_t *root, const limits *lim, strata_task *t, strata_diag *diag)
{
    const json_t *arr = json_object_get(root, "budgets");
    if (arr == NULL)
        return strata_diag_set(diag, STRATA_EPROTO, "task.budgets: missing");
    if (!json_is_array(arr))
        return strata_diag_set(diag, STRATA_EPROTO, "task.budgets: expected an array");
    size_t n = json_array_size(arr);
    if (n > lim->max_layers)
        return strata_diag_set(diag, STRATA_ETOOBIG,
                               "task.budgets: %zu entries, above the limit of %zu layers", n,
                               lim->max_layers);
    if (n == 0)
        return STRATA_OK;
    t->layer_names = calloc(n, sizeof(*t->layer_names));
    t->budgets = calloc(n, sizeof(*t->budgets));
    if (t->layer_names == NULL || t->budgets == NULL)
        return strata_diag_set(diag, STRATA_ENOMEM, "task: out of memory (%zu layers)", n);
    t->num_layers = n;
    for (size_t i = 0; i < n; i++) {
        int rc = get_budget(json_array_get(arr, i), i, lim, t, diag);
        if (rc < 0)
            return rc;
    }
    return STRATA_OK;
}

static int get_candidates(const json_t *root, strata_task *t, strata_diag *diag)
{
    const json_t *arr = json_object_get(root, "error_candidates");
    if (arr == NULL)
        return strata_diag_set(diag, STRATA_EPROTO, "task.error_candidates: missing");
    if (!json_is_array(arr))
        return strata_diag_set(diag, STRATA_EPROTO, "task.error_candidates: expected an array");
    size_t n = json_array_size(arr);
    if (n > STRATA_TASK_MAX_CANDIDATES)
        return strata_diag_set(diag, STRATA_ETOOBIG,
                               "task.error_candidates: %zu entries, above the limit of %u", n,
                               STRATA_TASK_MAX_CANDIDATES);
    if (n == 0)
        return STRATA_OK;
    t->candidates = calloc(n, sizeof(*t->candidates));
    if (t->candidates == NULL)
        return strata_diag_set(diag, STRATA_ENOMEM, "task: out of memory (%zu candidates)", n);
    t->num_candidates = n;
    for (size_t i = 0; i < n; i++) {
        char where[48];
        snprintf(where, sizeof(where), "error_candidates[%zu]", i);
        const json_t *v = json_array_get(arr, i);
        if (!json_is_object(v))
            return strata_diag_set(diag, STRATA_EPROTO, "%s: expected an object", where);
        int rc = strata__json_known_keys(v, CAND_KEYS, CAND_NKEYS, where, diag);
        if (rc < 0 || (rc = get_budget_fields(v, where, &t->candidates[i], diag)) < 0)
            return rc;
    }
    return STRATA_OK;
}

static int get_train(const json_t *root, strata_task_train *tr, strata_diag *diag)
{
    const json_t *v = json_object_get(root, "train");
    if (v == NULL)
        return strata_diag_set(diag, STRATA_EPROTO, "task.train: missing");
    if (!json_is_object(v))
        return strata_diag_set(diag, STRATA_EPROTO, "task.train: expected an object");
    const char *where = "train";
    int64_t epochs = 0, batch = 0, steps = 0;
    int rc;
    if ((rc = strata__json_known_keys(v, TRAIN_KEYS, COUNT(TRAIN_KEYS), where, diag)) < 0 ||
        (rc = strata__json_int(v, "epochs", 1, MAX_I32, where, &epochs, diag)) < 0 ||
        (rc = strata__json_int(v, "batch", 1, MAX_I32, where, &batch, diag)) < 0 ||
        (rc = strata__json_number(v, "lr", 0.0, 0, MAX_RATE, 0, where, &tr->lr, diag)) < 0 ||
        (rc = strata__json_number(v, "momentum", 0.0, 0, 1.0, 1, where, &tr->momentum, diag)) < 0 ||
        (rc = strata__json_number(v, "weight_decay", 0.0, 0, MAX_RATE, 0, where, &tr->weight_decay,
                                  diag)) < 0 ||
        (rc = strata__json_number(v, "prox_mu", 0.0, 0, MAX_RATE, 0, where, &tr->prox_mu, diag)) <
            0 ||
        (rc = strata__json_int(v, "max_steps", 0, MAX_I64, where, &steps, diag)) < 0)
        return rc;
    tr->epochs = (uint32_t)epochs;
    tr->batch = (uint32_t)batch;
    tr->max_steps = (uint64_t)steps;
    return STRATA_OK;
}

static int get_task(const json_t *root, const limits *lim, void *out, strata_diag *diag)
{
    strata_task *t = out;
    const char *where = "task";
    int64_t round = 0, total = 0, version = 0, deadline = 0, seed = 0;
    int rc;
    if ((rc = strata__json_known_keys(root, TASK_KEYS, COUNT(TASK_KEYS), where, diag)) < 0 ||
        (rc = strata__json_int(root, "round", 0, UINT32_MAX, where, &round, diag)) < 0 ||
        (rc = strata__json_int(root, "total_rounds", 1, UINT32_MAX, where, &total, diag)) < 0 ||
        (rc = strata__json_int(root, "model_version", 0, MAX_I64, where, &version, diag)) < 0 ||
        (rc = strata__json_int(root, "deadline_unix_ms", 0, MAX_I64, where, &deadline, diag)) < 0)
        return rc;
    t->round = (uint32_t)round;
    t->total_rounds = (uint32_t)total;
    t->model_version = (uint64_t)version;
    t->deadline_unix_ms = deadline;
    if ((rc = get_budgets(root, lim, t, diag)) < 0 || (rc = get_candidates(root, t, diag)) < 0 ||
        (rc = get_train(root, &t->train, diag)) < 0 ||
        (rc = strata__json_int(root, "seed", 0, MAX_SEED, where, &seed, diag)) < 0)
        return rc;
    t->seed = (uint64_t)seed;
    const json_t *dg = json_object_get(root, "model_digest");
    if (dg != NULL) {
        const char *s = json_string_value(dg);
        int ok = s != NULL && json_string_length(dg) == 64;
        for (size_t i = 0; ok && i < 64; i++)
            ok = (s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f');
        if (!ok)
            return strata_diag_set(diag, STRATA_EPROTO,
                                   "task.model_digest: expected 64 lowercase hex digits");
        memcpy(t->model_digest, s, 65);
    }
    const json_t *dl = json_object_get(root, "downlink");
    if (dl != NULL && !json_is_boolean(dl))
        return strata_diag_set(diag, STRATA_EPROTO, "task.downlink: expected true or false");
    t->downlink = json_is_true(dl);
    return STRATA_OK;
}

static void task_cleanup_v(void *p)
{
    strata_task_cleanup(p);
}

static const strata__json_codec CODEC = {"task",
                                         STRATA_TASK_MAX_DEPTH,
                                         {STRATA_TASK_DEFAULT_MAX_BYTES,
                                          STRATA_TASK_DEFAULT_MAX_LAYERS,
                                          STRATA_TASK_DEFAULT_MAX_NAME_BYTES},
                                         sizeof(strata_task),
                                         get_task,
                                         task_cleanup_v};

int strata_task_decode(const char *json, size_t len, const strata_task_limits *lim,
                       strata_task *out, strata_diag *diag)
{
    strata__json_limits l = {0};
    if (lim != NULL)
        l = (strata__json_limits){lim->max_bytes, lim->max_layers, lim->max_name_bytes};
    return strata__json_decode(&CODEC, json, len, &l, out, diag);
}

void strata_task_cleanup(strata_task *t)
{
    if (t == NULL)
        return;
    strata__json_free_names(t->layer_names, t->num_layers);
    free(t->budgets);
    free(t->candidates);
    memset(t, 0, sizeof(*t));
}
