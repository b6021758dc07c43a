/* strata-server's round engine (see engine.h).
 *
 * Rounds and model versions advance together: round R trains model version R
 * and its close produces version R + 1. A round opens once at least
 * min_clients are registered; it closes when every selected client reported,
 * or when its deadline passed and at least min_updates were accepted. A round
 * whose deadline passes with fewer updates keeps waiting (the deadline is
 * effectively extended until min_updates arrive); late uploads for a closed
 * round get 409.
 *
 * Crash consistency: the new checkpoint is recorded before the round is
 * closed in the store. On start, an open round whose model version is older
 * than the latest checkpoint was already aggregated: it is closed (with a
 * summary marked "recovered") instead of being replayed. Otherwise the open
 * round's acknowledged updates are replayed into the aggregator in the order
 * they were accepted. */
#include "engine.h"

#include "aggregate.h"
#include "request.h"
#include "robust.h"
#include "store.h"

#include "strata/checkpoint.h"
#include "strata/data.h"
#include "strata/fileio.h"
#include "strata/model.h"
#include "strata/payload.h"
#include "strata/policy.h"
#include "strata/rng.h"
#include "strata/train.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <zstd.h>

#define TICK_MS 100

/* Error codes of refused requests, each counted in
 * strata_requests_rejected_total{reason="..."}. */
#define REQ_CODES(X)                                                                               \
    X(bad_request)                                                                                 \
    X(bad_payload)                                                                                 \
    X(too_large)                                                                                   \
    X(unauthorized)                                                                                \
    X(bad_secret)                                                                                  \
    X(forbidden)                                                                                   \
    X(not_found)                                                                                   \
    X(method_not_allowed)                                                                          \
    X(unsupported_media_type)                                                                      \
    X(invalid_update)                                                                              \
    X(not_selected)                                                                                \
    X(round_closed)                                                                                \
    X(round_not_open)                                                                              \
    X(rate_limited)                                                                                \
    X(too_many_clients)                                                                            \
    X(finished)                                                                                    \
    X(round_closing)                                                                               \
    X(request_timeout)                                                                             \
    X(other)

enum {
    C_ROUNDS,
    C_ACCEPTED,
    C_BYTES_RX,
    C_BYTES_TX,
    C_REJ_BAD_PAYLOAD,
    C_REJ_TOO_LARGE,
    C_REJ_INVALID,
    C_REJ_NOT_SELECTED,
    C_REJ_ROUND_CLOSED,
    C_REJ_ROUND_NOT_OPEN,
    C_REJ_UNAUTHORIZED,
    C_REJ_FORBIDDEN,
    C_REJ_RATE_LIMITED,
    C_REJ_MEDIA_TYPE,
#define X(c) C_REQ_##c,
    REQ_CODES(X)
#undef X
        C_N
};
#define C_REQ_FIRST C_REQ_bad_request
static const char *const CTR_NAMES[C_N] = {
    "rounds_completed_total",
    "updates_accepted_total",
    "bytes_received_total",
    "bytes_sent_total",
    "updates_rejected_total{reason=\"bad_payload\"}",
    "updates_rejected_total{reason=\"too_large\"}",
    "updates_rejected_total{reason=\"invalid_update\"}",
    "updates_rejected_total{reason=\"not_selected\"}",
    "updates_rejected_total{reason=\"round_closed\"}",
    "updates_rejected_total{reason=\"round_not_open\"}",
    "updates_rejected_total{reason=\"unauthorized\"}",
    "updates_rejected_total{reason=\"forbidden\"}",
    "updates_rejected_total{reason=\"rate_limited\"}",
    "updates_rejected_total{reason=\"unsupported_media_type\"}",
#define X(c) "requests_rejected_total{reason=\"" #c "\"}",
    REQ_CODES(X)
#undef X
};

/* Persistent federation controls (admin pause and stop), kept as counters. */
#define CONTROL_PAUSED "control_paused"
#define CONTROL_STOPPED "control_stopped"

typedef struct tok_entry {
    uint8_t hash[STRATA_STORE_HASH_LEN];
    uint64_t id;
} tok_entry;

/* An upload whose payload file is prepared, waiting for a group commit. */
typedef struct pending_upload {
    strata_store_pending *pend;
    const strata_payload *p;
    uint32_t round;
    uint64_t client_id;
    size_t len;
    ptrdiff_t k; /* index among the selected clients */
    int done;    /* decided */
    int taken;   /* committed in a batch (else: the caller goes on alone) */
    int rc;      /* the batch's result for it */
    strata_store_receipt rec;
    strata_store_verdict v;
    char msg[256]; /* the error, when rc < 0 */
    struct pending_upload *next;
} pending_upload;

typedef struct waiter {
    void *conn;
    int64_t deadline_ms;
} waiter;

struct srv_engine {
    const srv_config *cfg;
    pthread_mutex_t mu;
    pthread_cond_t cv; /* wakes the round thread */
    pthread_t thread;
    int started, stopping;
    srv_waiter_fn suspend, resume;

    strata_store *store;
    strata_store *wstore; /* second connection: group commits, outside the lock */
    strata_dataset test;
    strata_model *model;   /* touched only by the round thread (and start-up) */
    strata_policy *policy; /* NULL for --policy none */
    strata_agg *agg;
    strata_server_opt *opt;
    size_t nlayers, total_params, max_body;
    size_t *numel;
    char **names;
    strata_payload_limits limits;
    srv_json_limits jlim;
    strata_robust_method method;

    /* Registered clients, ascending ids, with each one's upload-rate bucket
     * (tokens, refilled at upload_rate per minute up to upload_rate). */
    uint64_t *clients;
    double *tokens;
    int64_t *refilled_ms;
    size_t nclients, capclients;
    /* The same clients by token hash (ascending), so that authenticating a
     * request needs no database lookup. */
    tok_entry *toks;

    /* Admin controls (persisted) and the admin token's hash. */
    int paused, stopped;
    int stopping_round; /* an admin stop waits for the group commit in flight */
    uint8_t admin_hash[STRATA_STORE_HASH_LEN];

    /* Round state. */
    uint32_t next_round; /* the open round, or the next to open */
    uint64_t version;    /* current global model version */
    int open, closing, finished;
    uint64_t *selected; /* ascending */
    size_t nselected;
    uint8_t *reported; /* per selected client */
    size_t nreported;
    strata_budget *budgets;
    char *task_json;
    int64_t opened_ms, deadline_ms;
    uint64_t uplink, downlink;

    /* Model cache of the current version. */
    uint8_t *raw, *zst;
    size_t raw_len, zst_len;

    /* Last round. */
    double last_acc, last_loss, last_agg_s, last_round_s;
    int have_last;

    _Atomic int64_t ctr[C_N], pending[C_N];

    waiter *waiters;
    size_t nwaiters, capwaiters;

    /* Group commit: prepared uploads queue here; one uploader at a time
     * (committing) commits all queued ones in one transaction. */
    pending_upload *queue, *queue_tail;
    int committing;
    pthread_cond_t commit_cv;
};

int64_t srv_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static double mono_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---- responses ---------------------------------------------------------- */

void srv_resp_cleanup(srv_resp *r)
{
    free(r->body);
    memset(r, 0, sizeof(*r));
}

static void resp_json(srv_resp *r, unsigned status, json_t *j)
{
    free(r->body);
    r->body = NULL;
    r->len = 0;
    r->status = status;
    r->ctype = "application/json";
    r->code = NULL;
    char *s = j ? json_dumps(j, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    json_decref(j);
    if (s == NULL) {
        r->status = 500;
        s = strdup("{\"error\":{\"code\":\"internal\",\"message\":\"out of memory\"}}");
    }
    r->body = (uint8_t *)s;
    r->len = s ? strlen(s) : 0;
}

void srv_resp_error(srv_resp *r, unsigned status, const char *code, const char *fmt, ...)
{
    char msg[600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    /* Messages may quote what a client sent: keep them printable ASCII (and
     * so valid UTF-8 for jansson). */
    for (char *c = msg; *c != '\0'; c++)
        if (*c < 0x20 || *c > 0x7e)
            *c = '?';
    resp_json(r, status, json_pack("{s:{s:s,s:s}}", "error", "code", code, "message", msg));
    r->code = code;
}

/* A 500: the detail (paths, SQLite's words) goes to the log, not to the
 * client. */
static void resp_internal(srv_resp *r, const char *detail)
{
    fprintf(stderr, "strata-server: internal error: %s\n", detail);
    srv_resp_error(r, 500, "internal", "internal error; the coordinator's log has the details");
}

static void resp_text(srv_resp *r, unsigned status, const char *ctype, char *text)
{
    free(r->body);
    r->status = status;
    r->ctype = ctype;
    r->body = (uint8_t *)text;
    r->len = text ? strlen(text) : 0;
}

/* ---- counters ------------------------------------------------------------ */

static void ctr_add(srv_engine *e, int c, int64_t d)
{
    atomic_fetch_add(&e->ctr[c], d);
    atomic_fetch_add(&e->pending[c], d);
}

/* Writes pending counter deltas to the store. Lock held. Rounds completed
 * and updates accepted are not kept here: they are counted from the rounds
 * and updates the store holds at start-up (count_from_store), so that they
 * are exact after any crash. */
static void ctr_flush(srv_engine *e)
{
    strata_store_counter deltas[C_N];
    size_t n = 0;
    int64_t taken[C_N];
    for (int c = 0; c < C_N; c++) {
        taken[c] = c == C_ROUNDS || c == C_ACCEPTED ? 0 : atomic_exchange(&e->pending[c], 0);
        if (taken[c] != 0) {
            snprintf(deltas[n].name, sizeof(deltas[n].name), "%s", CTR_NAMES[c]);
            deltas[n++].value = taken[c];
        }
    }
    strata_diag d = {{0}};
    if (n > 0 && strata_store_counter_add_many(e->store, deltas, n, &d) < 0) {
        fprintf(stderr, "strata-server: saving counters: %s\n", d.msg);
        for (int c = 0; c < C_N; c++)
            atomic_fetch_add(&e->pending[c], taken[c]);
    }
}

void srv_engine_count_bytes(srv_engine *e, uint64_t in, uint64_t out)
{
    if (in)
        ctr_add(e, C_BYTES_RX, (int64_t)in);
    if (out)
        ctr_add(e, C_BYTES_TX, (int64_t)out);
}

void srv_engine_count_reject(srv_engine *e, const char *reason)
{
    for (int c = C_REJ_BAD_PAYLOAD; c < C_REQ_FIRST; c++)
        if (strstr(CTR_NAMES[c], reason) != NULL) {
            ctr_add(e, c, 1);
            return;
        }
}

void srv_engine_count_error(srv_engine *e, const char *code)
{
    char want[64];
    snprintf(want, sizeof(want), "{reason=\"%s\"}", code ? code : "other");
    for (int c = C_REQ_FIRST; c < C_N; c++)
        if (strstr(CTR_NAMES[c], want) != NULL) {
            ctr_add(e, c, 1);
            return;
        }
    ctr_add(e, C_REQ_other, 1);
}

/* ---- helpers -------------------------------------------------------------- */

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static ptrdiff_t find_u64(const uint64_t *v, size_t n, uint64_t x)
{
    const uint64_t *p = bsearch(&x, v, n, sizeof(*v), cmp_u64);
    return p ? p - v : -1;
}

static int cmp_tok(const void *a, const void *b)
{
    return memcmp(a, b, STRATA_STORE_HASH_LEN);
}

/* Adds a registered client (ids arrive ascending) and its token hash. */
static int add_client(srv_engine *e, uint64_t id, const uint8_t hash[STRATA_STORE_HASH_LEN])
{
    if (e->nclients == e->capclients) {
        size_t cap = e->capclients ? e->capclients * 2 : 64;
        uint64_t *p = realloc(e->clients, cap * sizeof(*p));
        if (p != NULL)
            e->clients = p;
        double *t = realloc(e->tokens, cap * sizeof(*t));
        if (t != NULL)
            e->tokens = t;
        int64_t *m = realloc(e->refilled_ms, cap * sizeof(*m));
        if (m != NULL)
            e->refilled_ms = m;
        tok_entry *k = realloc(e->toks, cap * sizeof(*k));
        if (k != NULL)
            e->toks = k;
        if (p == NULL || t == NULL || m == NULL || k == NULL)
            return STRATA_ENOMEM;
        e->capclients = cap;
    }
    size_t at = 0, hi = e->nclients; /* insertion point by hash */
    while (at < hi) {
        size_t mid = at + (hi - at) / 2;
        if (memcmp(e->toks[mid].hash, hash, STRATA_STORE_HASH_LEN) < 0)
            at = mid + 1;
        else
            hi = mid;
    }
    memmove(&e->toks[at + 1], &e->toks[at], (e->nclients - at) * sizeof(*e->toks));
    memcpy(e->toks[at].hash, hash, STRATA_STORE_HASH_LEN);
    e->toks[at].id = id;
    e->tokens[e->nclients] = (double)e->cfg->upload_rate;
    e->refilled_ms[e->nclients] = srv_now_ms();
    e->clients[e->nclients++] = id; /* ids grow, the array stays sorted */
    return 0;
}

static uint64_t mix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

static int zstd_encode(const uint8_t *in, size_t len, uint8_t **out, size_t *olen)
{
    *out = NULL;
    *olen = 0;
    size_t cap = ZSTD_compressBound(len);
    uint8_t *buf = malloc(cap ? cap : 1);
    if (buf == NULL)
        return STRATA_ENOMEM;
    size_t n = ZSTD_compress(buf, cap, in, len, 3);
    if (ZSTD_isError(n)) {
        free(buf);
        return STRATA_EIO;
    }
    *out = buf;
    *olen = n;
    return 0;
}

static int read_whole(const char *path, size_t max, uint8_t **out, size_t *len)
{
    *out = NULL;
    *len = 0;
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return STRATA_EIO;
    uint8_t *buf = NULL;
    size_t n = 0, cap = 0;
    int rc = 0;
    for (;;) {
        if (n == cap) {
            cap = cap ? cap * 2 : 1 << 16;
            if (cap > max + 1) {
                rc = STRATA_ETOOBIG;
                break;
            }
            uint8_t *p = realloc(buf, cap);
            if (p == NULL) {
                rc = STRATA_ENOMEM;
                break;
            }
            buf = p;
        }
        size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (got == 0) {
            if (ferror(f))
                rc = STRATA_EIO;
            break;
        }
    }
    fclose(f);
    if (rc < 0) {
        free(buf);
        return rc;
    }
    *out = buf;
    *len = n;
    return 0;
}

/* Encodes the current model into the cache (safetensors + zstd). */
static int build_cache(srv_engine *e, uint8_t **raw, size_t *raw_len, uint8_t **zst,
                       size_t *zst_len)
{
    strata_metadata meta;
    strata_metadata_init(&meta);
    int rc = strata_checkpoint_metadata(e->model, &meta);
    if (rc == 0)
        rc = strata_safetensors_encode(strata_model_params(e->model), &meta, raw, raw_len);
    strata_metadata_cleanup(&meta);
    if (rc == 0 && (rc = zstd_encode(*raw, *raw_len, zst, zst_len)) < 0) {
        free(*raw);
        *raw = NULL;
    }
    return rc;
}

static json_t *budgets_json(const srv_engine *e, const strata_budget *b)
{
    json_t *arr = json_array();
    for (size_t i = 0; i < e->nlayers; i++)
        json_array_append_new(arr,
                              json_pack("{s:s,s:s,s:f,s:i,s:i}", "layer", e->names[i], "compressor",
                                        strata_comp_name(b[i].comp), "density", b[i].density,
                                        "levels", (int)b[i].levels, "rank", (int)b[i].rank));
    return arr;
}

static json_t *densities_json(const srv_engine *e)
{
    json_t *o = json_object();
    for (size_t i = 0; e->budgets && i < e->nlayers; i++)
        json_object_set_new(o, e->names[i], json_real(e->budgets[i].density));
    return o;
}

static int budgets_from_task(srv_engine *e, const char *task_json, strata_budget *b)
{
    json_t *t = json_loads(task_json, 0, NULL);
    json_t *arr = json_object_get(t, "budgets");
    int rc = STRATA_EPROTO;
    if (json_array_size(arr) != e->nlayers)
        goto out;
    for (size_t i = 0; i < e->nlayers; i++) {
        json_t *bj = json_array_get(arr, i);
        strata_compressor_id id;
        if (strata_comp_from_name(json_string_value(json_object_get(bj, "compressor")), &id) < 0)
            goto out;
        b[i].comp = id;
        b[i].density = json_number_value(json_object_get(bj, "density"));
        b[i].levels = (uint32_t)json_integer_value(json_object_get(bj, "levels"));
        b[i].rank = (uint32_t)json_integer_value(json_object_get(bj, "rank"));
    }
    rc = 0;
out:
    json_decref(t);
    return rc;
}

/* Wakes every parked connection. Lock held. */
static void wake_all(srv_engine *e)
{
    for (size_t i = 0; i < e->nwaiters; i++)
        e->resume(e->waiters[i].conn);
    e->nwaiters = 0;
}

static void wake_expired(srv_engine *e, int64_t now)
{
    size_t j = 0;
    for (size_t i = 0; i < e->nwaiters; i++) {
        if (e->waiters[i].deadline_ms <= now)
            e->resume(e->waiters[i].conn);
        else
            e->waiters[j++] = e->waiters[i];
    }
    e->nwaiters = j;
}

/* ---- rounds --------------------------------------------------------------- */

static void reset_round(srv_engine *e)
{
    free(e->selected);
    free(e->reported);
    free(e->budgets);
    free(e->task_json);
    e->selected = NULL;
    e->reported = NULL;
    e->budgets = NULL;
    e->task_json = NULL;
    e->nselected = e->nreported = 0;
    e->open = 0;
    e->uplink = e->downlink = 0;
    strata_agg_reset(e->agg);
}

/* Opens round e->next_round. Lock held. */
static int open_round(srv_engine *e, strata_diag *d)
{
    const srv_config *c = e->cfg;
    uint32_t r = e->next_round;
    size_t n = e->nclients, k = n;
    if (c->clients_per_round > 0)
        k = (size_t)c->clients_per_round < n ? (size_t)c->clients_per_round : n;
    else if (c->fraction > 0) {
        k = (size_t)ceil(c->fraction * (double)n);
        k = k < 1 ? 1 : k > n ? n : k;
    }
    int rc = STRATA_ENOMEM;
    uint64_t *sel = malloc(n * sizeof(*sel));
    strata_budget *b = calloc(e->nlayers, sizeof(*b));
    uint8_t *rep = calloc(k, 1);
    json_t *task = NULL;
    char *tj = NULL;
    if (sel == NULL || b == NULL || rep == NULL)
        goto fail;
    memcpy(sel, e->clients, n * sizeof(*sel));
    strata_rng rng;
    strata_rng_seed(&rng, (uint64_t)c->seed, 0x5e1ec7ULL + r);
    for (size_t i = 0; i < k; i++) {
        size_t j = i + (size_t)strata_rng_below(&rng, n - i);
        uint64_t t = sel[i];
        sel[i] = sel[j];
        sel[j] = t;
    }
    qsort(sel, k, sizeof(*sel), cmp_u64);
    if (e->policy == NULL) {
        for (size_t i = 0; i < e->nlayers; i++) {
            b[i].comp = STRATA_COMP_NONE;
            b[i].density = 1.0;
        }
    } else if ((rc = strata_policy_budgets(e->policy, e->numel, e->nlayers, c->density, r,
                                           (uint32_t)c->rounds, b, d)) < 0) {
        goto fail;
    }
    int64_t now = srv_now_ms();
    int64_t deadline = now + (int64_t)(c->round_deadline * 1000.0);
    uint64_t seed = mix64((uint64_t)c->seed ^ mix64(r)) & ((1ULL << 53) - 1);
    task = json_pack("{s:I,s:I,s:I,s:I,s:s,s:o,s:{s:I,s:I,s:f,s:f,s:f,s:f,s:I},s:I}", "round",
                     (json_int_t)r, "total_rounds", (json_int_t)c->rounds, "model_version",
                     (json_int_t)e->version, "deadline_unix_ms", (json_int_t)deadline, "values",
                     strata_values_name(c->values_format), "budgets", budgets_json(e, b), "train",
                     "epochs", (json_int_t)c->local_epochs, "batch", (json_int_t)c->batch, "lr",
                     c->lr, "momentum", c->momentum, "weight_decay", c->weight_decay, "prox_mu",
                     c->prox_mu, "max_steps", (json_int_t)c->max_steps, "seed", (json_int_t)seed);
    tj = task ? json_dumps(task, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    if (tj == NULL) {
        rc = STRATA_ENOMEM;
        goto fail;
    }
    if ((rc = strata_store_round_open(e->store, r, e->version, sel, k, deadline, tj, d)) < 0)
        goto fail;
    reset_round(e);
    e->selected = sel;
    e->nselected = k;
    e->reported = rep;
    e->budgets = b;
    e->task_json = tj;
    e->opened_ms = now;
    e->deadline_ms = deadline;
    e->open = 1;
    json_decref(task);
    return 0;
fail:
    json_decref(task);
    free(tj);
    free(sel);
    free(b);
    free(rep);
    return rc;
}

static int ready_to_close(const srv_engine *e, int64_t now)
{
    /* Not while a group commit is in flight: its updates are acknowledged
     * only after they are aggregated. */
    if (!e->open || e->closing || e->committing || e->nreported == 0)
        return 0;
    if (e->nreported == e->nselected)
        return 1;
    return now >= e->deadline_ms && e->nreported >= (size_t)e->cfg->min_updates;
}

static char *summary_text(const srv_engine *e, uint32_t r, uint64_t version, const char *state,
                          double acc, double loss, int64_t duration_ms)
{
    json_t *s = json_pack("{s:I,s:s,s:I,s:I,s:I,s:f,s:f,s:I,s:I,s:I,s:I,s:o}", "round",
                          (json_int_t)r, "state", state, "model_version", (json_int_t)version,
                          "selected", (json_int_t)e->nselected, "participants",
                          (json_int_t)e->nreported, "accuracy", acc, "loss", loss, "uplink_bytes",
                          (json_int_t)e->uplink, "downlink_bytes", (json_int_t)e->downlink,
                          "dense_uplink_bytes", (json_int_t)(e->nreported * e->total_params * 4),
                          "duration_ms", (json_int_t)duration_ms, "densities", densities_json(e));
    char *t = s ? json_dumps(s, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    json_decref(s);
    return t;
}

/* Closes the open round: aggregate, server step, checkpoint, evaluation,
 * store. Called by the round thread with the lock held; drops it while
 * saving and evaluating (uploads for the round get 409 meanwhile). */
/* The round's coordinate-wise robust aggregate (trimmed mean or median) of
 * its accepted updates, read back from the store, into delta. Called
 * without the lock while the round is closing: it uses the second store
 * connection, which group commits leave alone then. */
static int robust_mean(srv_engine *e, strata_tensor_list *delta, strata_diag *d)
{
    strata_store_update *ups = NULL;
    size_t n = 0;
    int rc = strata_store_update_list(e->wstore, e->next_round, &ups, &n, d);
    strata_payload **ps = rc == 0 ? calloc(n ? n : 1, sizeof(*ps)) : NULL;
    strata_robust_update *ru = rc == 0 ? calloc(n ? n : 1, sizeof(*ru)) : NULL;
    if (rc == 0 && (ps == NULL || ru == NULL))
        rc = STRATA_ENOMEM;
    for (size_t i = 0; rc == 0 && i < n; i++) {
        uint8_t *buf = NULL;
        size_t len = 0;
        rc = strata_store_update_read(e->wstore, e->next_round, ups[i].client_id, &buf, &len, d);
        if (rc == 0)
            rc = strata_payload_decode(buf, len, &e->limits, &ps[i], d);
        free(buf);
        if (rc == 0) {
            ru[i].layers = ps[i]->layers;
            ru[i].n_layers = ps[i]->num_layers;
        }
    }
    if (rc == 0)
        rc = strata_robust_aggregate(strata_model_params(e->model), ru, n, e->method,
                                     e->cfg->trim_fraction, e->cfg->clip_norm, delta, d);
    for (size_t i = 0; ps != NULL && i < n; i++)
        strata_payload_free(ps[i]);
    free(ps);
    free(ru);
    strata_store_update_list_free(ups, n);
    return rc;
}

static void close_round(srv_engine *e)
{
    strata_diag d = {{0}};
    uint32_t r = e->next_round;
    uint64_t v = e->version + 1;
    strata_tensor_list *params = strata_model_params(e->model);
    strata_tensor_list delta;
    strata_tensor_list_init(&delta);
    double t0 = mono_s();
    int rc = strata_tensor_list_zeros_like(&delta, params);
    /* From here no update of this round can be accepted (closing; no group
     * commit is in flight, see ready_to_close), so the round's stored
     * updates are final: the robust rules read them without the lock. */
    e->closing = 1;
    if (rc == 0 && e->method == STRATA_ROBUST_FEDAVG) {
        rc = strata_agg_mean(e->agg, &delta, &d);
    } else if (rc == 0) {
        pthread_mutex_unlock(&e->mu);
        rc = robust_mean(e, &delta, &d);
        pthread_mutex_lock(&e->mu);
    }
    if (rc == 0)
        rc = strata_server_opt_step(e->opt, params, &delta, &d);
    strata_tensor_list_cleanup(&delta);
    if (rc < 0) {
        /* Retrying cannot help (the same updates give the same failure):
         * stop serving rounds, loudly, instead of looping. */
        fprintf(stderr, "strata-server: round %u: aggregation failed: %s; no further rounds\n", r,
                strata_diag_msg(&d, rc));
        e->closing = 0;
        e->open = 0;
        e->finished = 1;
        wake_all(e);
        return;
    }
    double agg_s = mono_s() - t0;
    pthread_mutex_unlock(&e->mu);

    char path[4096], opath[4200];
    uint8_t *raw = NULL, *zst = NULL;
    size_t raw_len = 0, zst_len = 0;
    strata_train_stats st = {0};
    rc = strata_store_checkpoint_path(e->store, v, path, sizeof(path), &d);
    if (rc == 0)
        rc = strata_checkpoint_save(e->model, path, &d);
    if (rc == 0) {
        snprintf(opath, sizeof(opath), "%s/checkpoints/server-opt-%llu.safetensors",
                 strata_store_dir(e->store), (unsigned long long)v);
        rc = strata_server_opt_save(e->opt, opath, &d);
    }
    if (rc == 0)
        rc = strata_evaluate(e->model, &e->test, NULL, 0, 256, &st);
    if (rc == 0)
        rc = build_cache(e, &raw, &raw_len, &zst, &zst_len);

    pthread_mutex_lock(&e->mu);
    if (rc == 0)
        rc = strata_store_checkpoint_record(e->store, v, &d);
    int64_t dur = srv_now_ms() - e->opened_ms;
    char *sum = NULL;
    if (rc == 0) {
        sum = summary_text(e, r, e->version, "closed", st.accuracy, st.loss, dur);
        rc = sum ? strata_store_round_close(e->store, r, sum, &d) : STRATA_ENOMEM;
    }
    free(sum);
    if (rc < 0) {
        /* The model in memory moved on but nothing durable says so: stop
         * serving rounds rather than diverge from the state directory. */
        fprintf(stderr, "strata-server: round %u: closing failed: %s; no further rounds\n", r,
                strata_diag_msg(&d, rc));
        free(raw);
        free(zst);
        e->closing = 0;
        e->open = 0;
        e->finished = 1;
        wake_all(e);
        return;
    }
    free(e->raw);
    free(e->zst);
    e->raw = raw;
    e->raw_len = raw_len;
    e->zst = zst;
    e->zst_len = zst_len;
    e->version = v;
    e->last_acc = st.accuracy;
    e->last_loss = st.loss;
    e->last_agg_s = agg_s;
    e->last_round_s = (double)dur / 1000.0;
    e->have_last = 1;
    ctr_add(e, C_ROUNDS, 1);
    ctr_flush(e);
    printf("round %u/%ld: %zu updates, accuracy %.4f, loss %.4f, uplink %llu bytes, %lld ms\n", r,
           e->cfg->rounds, e->nreported, st.accuracy, st.loss, (unsigned long long)e->uplink,
           (long long)dur);
    fflush(stdout);
    reset_round(e);
    e->closing = 0;
    e->next_round = r + 1;
    if (e->next_round >= (uint32_t)e->cfg->rounds) {
        e->finished = 1;
        printf("strata-server: finished %ld rounds\n", e->cfg->rounds);
        fflush(stdout);
    }
    wake_all(e);
}

static void *round_thread(void *arg)
{
    srv_engine *e = arg;
    pthread_mutex_lock(&e->mu);
    while (!e->stopping) {
        int64_t now = srv_now_ms();
        if (!e->finished && !e->paused && !e->open && e->nclients >= (size_t)e->cfg->min_clients) {
            strata_diag d = {{0}};
            int rc = open_round(e, &d);
            if (rc < 0)
                fprintf(stderr, "strata-server: opening round %u: %s\n", e->next_round,
                        strata_diag_msg(&d, rc));
            else
                wake_all(e);
        }
        if (ready_to_close(e, now))
            close_round(e);
        wake_expired(e, srv_now_ms());
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += TICK_MS * 1000000L;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        if (!e->stopping)
            pthread_cond_timedwait(&e->cv, &e->mu, &ts);
    }
    pthread_mutex_unlock(&e->mu);
    return NULL;
}

/* Closes the open round without aggregating it (admin stop). Lock held. */
static int abandon_round(srv_engine *e, strata_diag *d)
{
    if (!e->open)
        return 0;
    json_t *j =
        json_pack("{s:I,s:s,s:I,s:I,s:I,s:b}", "round", (json_int_t)e->next_round, "state",
                  "closed", "model_version", (json_int_t)e->version, "selected",
                  (json_int_t)e->nselected, "participants", (json_int_t)e->nreported, "stopped", 1);
    char *t = j ? json_dumps(j, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    json_decref(j);
    int rc = t ? strata_store_round_close(e->store, e->next_round, t, d) : STRATA_ENOMEM;
    free(t);
    if (rc == 0) {
        reset_round(e);
        e->next_round++;
    }
    return rc;
}

/* ---- tokens ------------------------------------------------------------- */

#define TOKEN_MAX 256

/* The federation's state for /v1/status. Lock held. */
static const char *state_name(const srv_engine *e)
{
    return e->stopped    ? "stopped"
           : e->finished ? "finished"
           : e->paused   ? "paused"
           : e->open     ? "running"
                         : "waiting";
}

/* 1 when tok is 1 to TOKEN_MAX printable characters without spaces. */
static int bearer_token_ok(const char *tok)
{
    size_t n = strlen(tok);
    if (n == 0 || n > TOKEN_MAX)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (tok[i] <= 0x20 || tok[i] >= 0x7f)
            return 0;
    return 1;
}

/* The token of an "Authorization: Bearer TOKEN" value, or NULL. */
static const char *bearer(const char *h)
{
    if (h == NULL || strncasecmp(h, "Bearer ", 7) != 0)
        return NULL;
    return bearer_token_ok(h + 7) ? h + 7 : NULL;
}

static int hash_equal(const uint8_t *a, const uint8_t *b)
{
    unsigned diff = 0;
    for (int i = 0; i < STRATA_STORE_HASH_LEN; i++)
        diff |= (unsigned)(a[i] ^ b[i]);
    return diff == 0;
}

/* ---- start-up ------------------------------------------------------------- */

/* Sets the rounds-completed and updates-accepted counters from the store:
 * every acknowledged update has its row, every aggregated round its closed
 * record (a round an operator stopped is closed but was not aggregated). */
static int count_from_store(srv_engine *e, strata_diag *d)
{
    int64_t rounds = 0, accepted = 0;
    uint32_t from = 0;
    for (;;) {
        strata_store_round *rs = NULL;
        size_t n = 0;
        int rc = strata_store_round_list(e->store, from, 1000, &rs, &n, d);
        if (rc < 0)
            return rc;
        for (size_t i = 0; i < n; i++) {
            accepted += (int64_t)rs[i].n_updates;
            if (rs[i].state == STRATA_STORE_ROUND_CLOSED &&
                (rs[i].summary_json == NULL ||
                 strstr(rs[i].summary_json, "\"stopped\":true") == NULL))
                rounds++;
            from = rs[i].round + 1;
        }
        strata_store_round_list_free(rs, n);
        if (n < 1000)
            break;
    }
    e->ctr[C_ROUNDS] = rounds;
    e->ctr[C_ACCEPTED] = accepted;
    return 0;
}

static int load_clients(srv_engine *e, strata_diag *d)
{
    uint64_t count = 0;
    int rc = strata_store_client_count(e->store, &count, d);
    /* Ids are assigned ascending from 1 and never deleted; allow gaps. */
    for (uint64_t id = 1, misses = 0; rc == 0 && e->nclients < count && misses < 100000; id++) {
        strata_store_client cl;
        int found = 0;
        rc = strata_store_client_get(e->store, id, &cl, &found, d);
        if (rc == 0 && found)
            rc = add_client(e, id, cl.token_hash);
        else
            misses++;
    }
    return rc;
}

/* Replays the acknowledged updates of the open round. */
static int replay_updates(srv_engine *e, strata_diag *d)
{
    strata_store_update *ups = NULL;
    size_t n = 0;
    int rc = strata_store_update_list(e->store, e->next_round, &ups, &n, d);
    for (size_t i = 0; rc == 0 && i < n; i++) {
        uint8_t *buf = NULL;
        size_t len = 0;
        strata_payload *p = NULL;
        rc = strata_store_update_read(e->store, e->next_round, ups[i].client_id, &buf, &len, d);
        if (rc == 0)
            rc = strata_payload_decode(buf, len, &e->limits, &p, d);
        if (rc == 0)
            rc = strata_agg_add_clipped(e->agg, p->layers, p->num_layers,
                                        (double)ups[i].receipt.samples, e->cfg->clip_norm, NULL, d);
        ptrdiff_t k = find_u64(e->selected, e->nselected, ups[i].client_id);
        if (rc == 0 && k >= 0 && !e->reported[k]) {
            e->reported[k] = 1;
            e->nreported++;
            e->uplink += len;
        }
        strata_payload_free(p);
        free(buf);
    }
    strata_store_update_list_free(ups, n);
    return rc;
}

static int resume_state(srv_engine *e, strata_diag *d)
{
    uint32_t last = 0;
    int found = 0;
    int rc = strata_store_last_round(e->store, &last, &found, d);
    if (rc < 0 || !found)
        return rc;
    strata_store_round rd;
    memset(&rd, 0, sizeof(rd));
    int f2 = 0;
    if ((rc = strata_store_round_get(e->store, last, &rd, &f2, d)) < 0)
        return rc;
    e->next_round = last + 1;
    if (rd.state == STRATA_STORE_ROUND_OPEN) {
        if (rd.model_version < e->version) {
            /* Aggregated and checkpointed before the crash: just close it. */
            json_t *s = json_pack("{s:I,s:s,s:I,s:I,s:I,s:b}", "round", (json_int_t)last, "state",
                                  "closed", "model_version", (json_int_t)rd.model_version,
                                  "selected", (json_int_t)rd.n_selected, "participants",
                                  (json_int_t)rd.n_updates, "recovered", 1);
            char *t = json_dumps(s, JSON_COMPACT | JSON_PRESERVE_ORDER);
            json_decref(s);
            rc = t ? strata_store_round_close(e->store, last, t, d) : STRATA_ENOMEM;
            free(t);
        } else {
            e->next_round = last;
            e->selected = rd.selected;
            rd.selected = NULL;
            e->nselected = rd.n_selected;
            e->task_json = rd.task_json;
            rd.task_json = NULL;
            e->opened_ms = rd.opened_unix_ms;
            e->deadline_ms = rd.deadline_unix_ms;
            e->reported = calloc(e->nselected ? e->nselected : 1, 1);
            e->budgets = calloc(e->nlayers, sizeof(*e->budgets));
            if (e->reported == NULL || e->budgets == NULL || e->task_json == NULL)
                rc = STRATA_ENOMEM;
            if (rc == 0 && budgets_from_task(e, e->task_json, e->budgets) < 0)
                rc = strata_diag_set(d, STRATA_EPROTO, "round %u: unreadable task", last);
            e->open = 1;
            if (rc == 0)
                rc = replay_updates(e, d);
        }
    }
    strata_store_round_cleanup(&rd);
    return rc;
}

/* Reads the admin token file (cfg admin_token_file, default
 * STATE_DIR/admin.token), creating it with a random token (mode 0600) when
 * it does not exist, and keeps the token's hash. */
static int load_admin_token(srv_engine *e, strata_diag *d)
{
    char path[4200];
    if (e->cfg->admin_token_file != NULL)
        snprintf(path, sizeof(path), "%s", e->cfg->admin_token_file);
    else
        snprintf(path, sizeof(path), "%s/admin.token", strata_store_dir(e->store));
    char tok[TOKEN_MAX + 2];
    size_t n = 0;
    int rc = strata_file_read_line(path, tok, sizeof(tok), &n, d);
    if (rc == STRATA_ESTATE) { /* first start: make one */
        if ((rc = strata_random_token(tok, d)) < 0)
            return rc;
        tok[STRATA_TOKEN_HEX] = '\n';
        if ((rc = strata_file_write_atomic(path, tok, STRATA_TOKEN_HEX + 1, 0600, d)) < 0)
            return rc;
        fprintf(stderr, "strata-server: new admin token in %s\n", path);
        rc = strata_file_read_line(path, tok, sizeof(tok), &n, d);
    }
    if (rc < 0 && rc != STRATA_ETOOBIG)
        return rc; /* diag names the file and the error */
    if (rc < 0 || n < 16 || bearer_token_ok(tok) == 0)
        return strata_diag_set(d, STRATA_EINVAL,
                               "admin_token_file: %s: the first line must be a token of 16 to %d "
                               "printable characters without spaces",
                               path, TOKEN_MAX);
    strata_store_sha256(tok, n, e->admin_hash);
    return 0;
}

int srv_engine_open(const srv_config *cfg, srv_engine **out, strata_diag *d)
{
    *out = NULL;
    srv_engine *e = calloc(1, sizeof(*e));
    if (e == NULL)
        return STRATA_ENOMEM;
    e->cfg = cfg;
    e->jlim.max_bytes = (size_t)cfg->max_json_bytes;
    e->jlim.max_depth = (size_t)cfg->max_json_depth;
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->cv, NULL);
    pthread_cond_init(&e->commit_cv, NULL);
    strata_dataset_init(&e->test);
    int rc;
    strata_set_threads((int)cfg->threads);
    if (strcmp(cfg->policy, "none") != 0 &&
        (rc = strata_policy_parse(cfg->policy, &e->policy, d)) < 0)
        goto fail;
    if ((rc = strata_robust_parse(cfg->aggregator, &e->method, d)) < 0 ||
        (rc = strata_robust_check(e->method, cfg->trim_fraction, cfg->clip_norm, d)) < 0)
        goto fail;
    if ((rc = strata_store_open(cfg->state_dir, &e->store, d)) < 0 ||
        (rc = strata_store_open_secondary(e->store, &e->wstore, d)) < 0)
        goto fail;
    if ((rc = strata_data_load_dir(cfg->data, "test", 0, &e->test, d)) < 0)
        goto fail;
    uint64_t latest = 0;
    int have = 0;
    if ((rc = strata_store_latest_model_version(e->store, &latest, &have, d)) < 0)
        goto fail;
    char path[4096];
    if (have) {
        if ((rc = strata_store_checkpoint_path(e->store, latest, path, sizeof(path), d)) < 0 ||
            (rc = strata_checkpoint_load(path, &e->model, d)) < 0)
            goto fail;
        strata_model *spec = NULL;
        if ((rc = strata_model_new(cfg->model, &spec, d)) < 0)
            goto fail;
        int same = strcmp(strata_model_arch(spec), strata_model_arch(e->model)) == 0;
        strata_model_free(spec);
        if (!same) {
            rc = strata_diag_set(d, STRATA_EINVAL,
                                 "model: the state directory holds a different architecture");
            goto fail;
        }
        e->version = latest;
    } else {
        if ((rc = strata_model_new(cfg->model, &e->model, d)) < 0)
            goto fail;
        strata_model_init_params(e->model, (uint64_t)cfg->seed);
        double mean = 0, sd = 1;
        if ((rc = strata_dataset_stats(&e->test, &mean, &sd)) < 0 ||
            (rc = strata_model_set_normalization(e->model, (float)mean,
                                                 sd > 0 ? (float)sd : 1.0f)) < 0)
            goto fail;
        if ((rc = strata_store_checkpoint_path(e->store, 0, path, sizeof(path), d)) < 0 ||
            (rc = strata_checkpoint_save(e->model, path, d)) < 0 ||
            (rc = strata_store_checkpoint_record(e->store, 0, d)) < 0)
            goto fail;
    }
    if (strata_model_input_dim(e->model) != e->test.dim) {
        rc =
            strata_diag_set(d, STRATA_EINVAL, "model: input size %zu does not match the data (%zu)",
                            strata_model_input_dim(e->model), e->test.dim);
        goto fail;
    }
    const strata_tensor_list *params = strata_model_params(e->model);
    e->nlayers = params->count;
    e->numel = calloc(e->nlayers, sizeof(*e->numel));
    e->names = calloc(e->nlayers, sizeof(*e->names));
    if (e->numel == NULL || e->names == NULL) {
        rc = STRATA_ENOMEM;
        goto fail;
    }
    size_t maxl = 0;
    for (size_t i = 0; i < e->nlayers; i++) {
        e->numel[i] = params->items[i].numel;
        e->names[i] = params->items[i].name; /* borrowed from the model */
        e->total_params += e->numel[i];
        maxl = e->numel[i] > maxl ? e->numel[i] : maxl;
    }
    /* A dense fp32 layer is 4 bytes an element; TOPK at most 5 + 4. */
    uint64_t bound = (uint64_t)e->total_params * 9 + (uint64_t)e->nlayers * 128 + (2u << 20);
    e->limits.max_decoded_bytes = bound;
    e->limits.max_layers = (uint32_t)e->nlayers;
    e->limits.max_layer_numel = maxl;
    e->limits.max_total_numel = e->total_params;
    e->max_body = cfg->max_body_bytes > 0 ? (size_t)cfg->max_body_bytes : (size_t)bound;
    if ((rc = strata_agg_new(params, &e->agg)) < 0)
        goto fail;
    strata_server_opt_config oc;
    if ((rc = strata_server_opt_parse(cfg->server_opt, &oc, d)) < 0)
        goto fail;
    oc.lr = cfg->server_lr;
    char opath[4200];
    snprintf(opath, sizeof(opath), "%s/checkpoints/server-opt-%llu.safetensors",
             strata_store_dir(e->store), (unsigned long long)e->version);
    FILE *of = e->version > 0 ? fopen(opath, "rb") : NULL;
    if (of != NULL) {
        fclose(of);
        rc = strata_server_opt_load(opath, params, &oc, &e->opt, d);
    } else {
        rc = strata_server_opt_new(params, &oc, &e->opt, d);
    }
    if (rc < 0)
        goto fail;
    for (int c = 0; c < C_N; c++) {
        int64_t v = 0;
        if ((rc = strata_store_counter_get(e->store, CTR_NAMES[c], &v, d)) < 0)
            goto fail;
        e->ctr[c] = v;
    }
    if ((rc = load_clients(e, d)) < 0 || (rc = resume_state(e, d)) < 0 ||
        (rc = count_from_store(e, d)) < 0)
        goto fail;
    if ((rc = build_cache(e, &e->raw, &e->raw_len, &e->zst, &e->zst_len)) < 0)
        goto fail;
    int64_t paused = 0, stopped = 0;
    if ((rc = strata_store_counter_get(e->store, CONTROL_PAUSED, &paused, d)) < 0 ||
        (rc = strata_store_counter_get(e->store, CONTROL_STOPPED, &stopped, d)) < 0 ||
        (rc = load_admin_token(e, d)) < 0)
        goto fail;
    e->paused = paused != 0;
    e->stopped = stopped != 0;
    if (e->stopped && (rc = abandon_round(e, d)) < 0)
        goto fail;
    e->finished = e->stopped || (!e->open && e->next_round >= (uint32_t)cfg->rounds);
    *out = e;
    return 0;
fail:
    srv_engine_free(e);
    return rc;
}

void srv_engine_set_waiters(srv_engine *e, srv_waiter_fn suspend, srv_waiter_fn resume)
{
    e->suspend = suspend;
    e->resume = resume;
}

int srv_engine_start(srv_engine *e)
{
    if (pthread_create(&e->thread, NULL, round_thread, e) != 0)
        return STRATA_ENOMEM;
    e->started = 1;
    return 0;
}

void srv_engine_stop(srv_engine *e)
{
    pthread_mutex_lock(&e->mu);
    e->stopping = 1;
    pthread_cond_broadcast(&e->cv);
    wake_all(e);
    pthread_mutex_unlock(&e->mu);
    if (e->started)
        pthread_join(e->thread, NULL);
    e->started = 0;
}

void srv_engine_free(srv_engine *e)
{
    if (e == NULL)
        return;
    if (e->store != NULL)
        ctr_flush(e);
    reset_round(e);
    strata_store_close(e->wstore);
    strata_store_close(e->store);
    strata_dataset_cleanup(&e->test);
    strata_model_free(e->model);
    strata_policy_free(e->policy);
    strata_agg_free(e->agg);
    strata_server_opt_free(e->opt);
    free(e->numel);
    free(e->names);
    free(e->clients);
    free(e->tokens);
    free(e->refilled_ms);
    free(e->toks);
    free(e->raw);
    free(e->zst);
    free(e->waiters);
    pthread_mutex_destroy(&e->mu);
    pthread_cond_destroy(&e->cv);
    pthread_cond_destroy(&e->commit_cv);
    free(e);
}

size_t srv_engine_max_body(const srv_engine *e)
{
    return e->max_body;
}

/* ---- requests ------------------------------------------------------------- */

/* Looks a bearer token up among the clients: 1 and the id when found, 0
 * when not. */
static int client_of_token(srv_engine *e, const char *tok, uint64_t *client_id)
{
    uint8_t hash[STRATA_STORE_HASH_LEN];
    strata_store_sha256(tok, strlen(tok), hash);
    pthread_mutex_lock(&e->mu);
    const tok_entry *k = bsearch(hash, e->toks, e->nclients, sizeof(*e->toks), cmp_tok);
    *client_id = k ? k->id : 0;
    pthread_mutex_unlock(&e->mu);
    return k != NULL;
}

int srv_engine_auth(srv_engine *e, const char *h, uint64_t *client_id, srv_resp *r)
{
    *client_id = 0;
    const char *tok = bearer(h);
    if (tok == NULL) {
        srv_resp_error(r, 401, "unauthorized", "missing or malformed bearer token");
        return -1;
    }
    if (!client_of_token(e, tok, client_id)) {
        srv_resp_error(r, 401, "unauthorized", "unknown token");
        return -1;
    }
    return 0;
}

int srv_engine_admin_auth(srv_engine *e, const char *h, srv_resp *r)
{
    const char *tok = bearer(h);
    if (tok == NULL) {
        srv_resp_error(r, 401, "unauthorized", "missing or malformed admin bearer token");
        return -1;
    }
    uint8_t hash[STRATA_STORE_HASH_LEN];
    strata_store_sha256(tok, strlen(tok), hash);
    if (hash_equal(hash, e->admin_hash))
        return 0;
    uint64_t id = 0;
    if (client_of_token(e, tok, &id))
        srv_resp_error(r, 403, "forbidden", "client %llu's token cannot use admin endpoints",
                       (unsigned long long)id);
    else
        srv_resp_error(r, 401, "unauthorized", "unknown admin token");
    return -1;
}

int srv_engine_rate_take(srv_engine *e, uint64_t client_id, srv_resp *r)
{
    double per_ms = (double)e->cfg->upload_rate / 60000.0, cap = (double)e->cfg->upload_rate;
    pthread_mutex_lock(&e->mu);
    ptrdiff_t k = find_u64(e->clients, e->nclients, client_id);
    int ok = 1;
    double wait_ms = 0;
    if (k >= 0) {
        int64_t now = srv_now_ms();
        double t = e->tokens[k] + (double)(now - e->refilled_ms[k]) * per_ms;
        t = t > cap ? cap : t;
        e->refilled_ms[k] = now;
        ok = t >= 1.0;
        e->tokens[k] = ok ? t - 1.0 : t;
        wait_ms = ok ? 0 : (1.0 - t) / per_ms;
    }
    pthread_mutex_unlock(&e->mu);
    if (ok)
        return 0;
    ctr_add(e, C_REJ_RATE_LIMITED, 1);
    srv_resp_error(r, 429, "rate_limited", "more than %ld uploads in a minute from this client",
                   e->cfg->upload_rate);
    r->retry_after = (int)ceil(wait_ms / 1000.0);
    if (r->retry_after < 1)
        r->retry_after = 1;
    return -1;
}

/* Sets a persistent control counter to value. Lock held. */
static int control_set(srv_engine *e, const char *name, int *field, int value, strata_diag *d)
{
    if (*field == value)
        return 0;
    int rc = strata_store_counter_add(e->store, name, value - *field, d);
    if (rc == 0)
        *field = value;
    return rc;
}

void srv_engine_admin(srv_engine *e, const char *action, const uint8_t *body, size_t len,
                      srv_resp *r)
{
    strata_diag d = {{0}};
    srv_admin_req rq;
    int rc = srv_request_admin(body, len, &e->jlim, &rq, &d);
    if (rc < 0) {
        if (rc == STRATA_ETOOBIG)
            srv_resp_error(r, 413, "too_large", "%s", strata_diag_msg(&d, rc));
        else
            srv_resp_error(r, 400, "bad_request", "%s", strata_diag_msg(&d, rc));
        return;
    }
    const char *reason = rq.has_reason ? rq.reason : NULL;
    pthread_mutex_lock(&e->mu);
    if (strcmp(action, "pause") == 0) {
        rc = control_set(e, CONTROL_PAUSED, &e->paused, 1, &d);
    } else if (strcmp(action, "resume") == 0) {
        rc = control_set(e, CONTROL_PAUSED, &e->paused, 0, &d);
    } else if (strcmp(action, "stop") == 0) {
        if (!e->stopped && e->closing) {
            pthread_mutex_unlock(&e->mu);
            srv_resp_error(r, 409, "round_closing", "a round is being aggregated; try again");
            r->retry_after = 1;
            return;
        }
        e->stopping_round = 1; /* no new batch starts */
        while (e->committing)
            pthread_cond_wait(&e->commit_cv, &e->mu);
        e->stopping_round = 0;
        int was = e->stopped;
        rc = control_set(e, CONTROL_STOPPED, &e->stopped, 1, &d);
        if (rc == 0 && (rc = abandon_round(e, &d)) < 0) {
            strata_diag ud = {{0}}; /* undo: a failed stop changes nothing */
            control_set(e, CONTROL_STOPPED, &e->stopped, was, &ud);
        }
        if (rc == 0)
            e->finished = 1;
    } else {
        pthread_mutex_unlock(&e->mu);
        srv_resp_error(r, 404, "not_found", "no admin action '%s'", action);
        return;
    }
    if (rc == 0) {
        fprintf(stderr, "strata-server: admin %s%s%s\n", action, reason ? ": " : "",
                reason ? reason : "");
        pthread_cond_broadcast(&e->cv);
        wake_all(e);
    }
    const char *state = state_name(e);
    pthread_mutex_unlock(&e->mu);
    if (rc < 0)
        resp_internal(r, strata_diag_msg(&d, rc));
    else
        resp_json(r, 200, json_pack("{s:s}", "state", state));
}

void srv_engine_admin_config(srv_engine *e, srv_resp *r)
{
    char *cj = srv_config_json(e->cfg, 1);
    json_t *cfg = cj ? json_loads(cj, 0, NULL) : NULL;
    free(cj);
    if (cfg == NULL) {
        srv_resp_error(r, 500, "internal", "out of memory");
        return;
    }
    resp_json(r, 200, json_pack("{s:o}", "config", cfg));
}

size_t srv_engine_max_json(const srv_engine *e)
{
    return (size_t)e->cfg->max_json_bytes;
}

void srv_engine_register(srv_engine *e, const uint8_t *body, size_t len, srv_resp *r)
{
    srv_register_req rq;
    strata_diag pd = {{0}};
    int prc = srv_request_register(body, len, &e->jlim, &rq, &pd);
    if (prc == STRATA_ETOOBIG) {
        srv_resp_error(r, 413, "too_large", "%s", strata_diag_msg(&pd, prc));
        return;
    }
    if (prc < 0) {
        srv_resp_error(r, 400, "bad_request", "%s", strata_diag_msg(&pd, prc));
        return;
    }
    if (!srv_secret_equal(rq.secret, e->cfg->enrolment_secret)) {
        srv_resp_error(r, 401, "bad_secret", "wrong enrolment_secret");
        return;
    }
    const char *name = rq.has_name ? rq.name : NULL;
    uint8_t hash[STRATA_STORE_HASH_LEN];
    char tok[STRATA_TOKEN_HEX + 1];
    strata_diag td = {{0}};
    if (strata_random_token(tok, &td) < 0) {
        resp_internal(r, strata_diag_msg(&td, STRATA_EIO));
        return;
    }
    strata_store_sha256(tok, 64, hash);
    uint64_t id = 0;
    strata_diag d = {{0}};
    pthread_mutex_lock(&e->mu);
    int rc = 0;
    if (e->nclients >= (size_t)e->cfg->max_clients) {
        pthread_mutex_unlock(&e->mu);
        srv_resp_error(r, 429, "too_many_clients", "the federation is full (%ld clients)",
                       e->cfg->max_clients);
        return;
    }
    rc = strata_store_client_add(e->store, hash, name, &id, &d);
    if (rc == 0)
        rc = add_client(e, id, hash);
    pthread_cond_broadcast(&e->cv);
    pthread_mutex_unlock(&e->mu);
    if (rc < 0)
        resp_internal(r, strata_diag_msg(&d, rc));
    else
        resp_json(r, 201, json_pack("{s:I,s:s}", "client_id", (json_int_t)id, "token", tok));
}

int srv_engine_task(srv_engine *e, uint64_t client_id, int64_t deadline_ms, void *conn, srv_resp *r)
{
    pthread_mutex_lock(&e->mu);
    if (e->finished) {
        int stopped = e->stopped;
        pthread_mutex_unlock(&e->mu);
        if (stopped)
            srv_resp_error(r, 410, "finished", "the federation was stopped by its operator");
        else
            srv_resp_error(r, 410, "finished", "the federation has completed all %ld rounds",
                           e->cfg->rounds);
        return 0;
    }
    ptrdiff_t k = e->open && !e->closing ? find_u64(e->selected, e->nselected, client_id) : -1;
    if (k >= 0 && !e->reported[k]) {
        char *t = strdup(e->task_json);
        pthread_mutex_unlock(&e->mu);
        resp_text(r, t ? 200 : 500, "application/json", t);
        return 0;
    }
    if (!e->stopping && conn != NULL && srv_now_ms() < deadline_ms) {
        if (e->nwaiters == e->capwaiters) {
            size_t cap = e->capwaiters ? e->capwaiters * 2 : 16;
            waiter *w = realloc(e->waiters, cap * sizeof(*w));
            if (w == NULL)
                goto no_task;
            e->waiters = w;
            e->capwaiters = cap;
        }
        e->waiters[e->nwaiters].conn = conn;
        e->waiters[e->nwaiters++].deadline_ms = deadline_ms;
        e->suspend(conn);
        pthread_mutex_unlock(&e->mu);
        return 1;
    }
no_task:
    pthread_mutex_unlock(&e->mu);
    resp_text(r, 204, "text/plain", NULL);
    r->retry_after = 1;
    return 0;
}

void srv_engine_waiter_gone(srv_engine *e, void *conn)
{
    pthread_mutex_lock(&e->mu);
    for (size_t i = 0; i < e->nwaiters; i++)
        if (e->waiters[i].conn == conn) {
            e->waiters[i] = e->waiters[--e->nwaiters];
            break;
        }
    pthread_mutex_unlock(&e->mu);
}

void srv_engine_model(srv_engine *e, uint64_t version, int want_zstd, const char *inm, srv_resp *r)
{
    char etag[32];
    snprintf(etag, sizeof(etag), "\"m%llu\"", (unsigned long long)version);
    pthread_mutex_lock(&e->mu);
    uint64_t cur = e->version;
    if (version > cur) {
        pthread_mutex_unlock(&e->mu);
        srv_resp_error(r, 404, "not_found", "no model version %llu (latest is %llu)",
                       (unsigned long long)version, (unsigned long long)cur);
        return;
    }
    if (inm != NULL && (strcmp(inm, etag) == 0 || strcmp(inm, "*") == 0)) {
        pthread_mutex_unlock(&e->mu);
        resp_text(r, 304, "application/octet-stream", NULL);
        snprintf(r->etag, sizeof(r->etag), "%s", etag);
        return;
    }
    uint8_t *buf = NULL;
    size_t len = 0;
    int rc = 0;
    if (version == cur) {
        len = want_zstd ? e->zst_len : e->raw_len;
        buf = malloc(len ? len : 1);
        if (buf != NULL)
            memcpy(buf, want_zstd ? e->zst : e->raw, len);
        rc = buf ? 0 : STRATA_ENOMEM;
        if (buf != NULL)
            e->downlink += len;
        pthread_mutex_unlock(&e->mu);
    } else {
        pthread_mutex_unlock(&e->mu);
        char path[4096];
        rc = strata_store_checkpoint_path(e->store, version, path, sizeof(path), NULL);
        if (rc == 0)
            rc = read_whole(path, (size_t)1 << 31, &buf, &len);
        if (rc == 0 && want_zstd) {
            uint8_t *z = NULL;
            size_t zl = 0;
            rc = zstd_encode(buf, len, &z, &zl);
            free(buf);
            buf = z;
            len = zl;
        }
        if (rc == STRATA_EIO) {
            srv_resp_error(r, 404, "not_found", "model version %llu is not kept",
                           (unsigned long long)version);
            return;
        }
        if (rc == 0) {
            pthread_mutex_lock(&e->mu);
            e->downlink += len;
            pthread_mutex_unlock(&e->mu);
        }
    }
    if (rc < 0) {
        free(buf);
        resp_internal(r, strata_strerror(rc));
        return;
    }
    free(r->body);
    r->status = 200;
    r->body = buf;
    r->len = len;
    r->ctype = "application/octet-stream";
    r->zstd = want_zstd;
    snprintf(r->etag, sizeof(r->etag), "%s", etag);
}

/* Checks a decoded update against the open round's task. Lock held. */
static int validate(const srv_engine *e, const strata_payload *p, uint32_t round, char *msg,
                    size_t mlen)
{
    if (p->round != round) {
        snprintf(msg, mlen, "header round %u does not match the URL's round %u", p->round, round);
        return -1;
    }
    if (p->model_version != e->version) {
        snprintf(msg, mlen, "header model_version %llu, the round's model is version %llu",
                 (unsigned long long)p->model_version, (unsigned long long)e->version);
        return -1;
    }
    if (p->sample_count == 0 || (double)p->sample_count > STRATA_AGG_MAX_WEIGHT) {
        snprintf(msg, mlen, "sample_count %llu: expected 1 to 1e12",
                 (unsigned long long)p->sample_count);
        return -1;
    }
    if (p->num_layers != e->nlayers) {
        snprintf(msg, mlen, "%zu layers, the model has %zu", p->num_layers, e->nlayers);
        return -1;
    }
    for (size_t i = 0; i < e->nlayers; i++) {
        const strata_clayer *l = &p->layers[i];
        const strata_budget *b = &e->budgets[i];
        const char *nm = e->names[i];
        if (l->layer_index != i) {
            snprintf(msg, mlen, "layer %zu (%s) is missing", i, nm);
            return -1;
        }
        if (l->numel != e->numel[i]) {
            snprintf(msg, mlen, "layer %zu (%s): %llu elements, expected %zu", i, nm,
                     (unsigned long long)l->numel, e->numel[i]);
            return -1;
        }
        if (l->comp != b->comp) {
            snprintf(msg, mlen, "layer %zu (%s): compressor %s, the task says %s", i, nm,
                     strata_comp_name(l->comp), strata_comp_name(b->comp));
            return -1;
        }
        int uses_vf = l->comp == STRATA_COMP_NONE || l->comp == STRATA_COMP_TOPK ||
                      l->comp == STRATA_COMP_RANDK || l->comp == STRATA_COMP_POWERSGD;
        if (uses_vf && l->values_format != e->cfg->values_format) {
            snprintf(msg, mlen, "layer %zu (%s): values %s, the task says %s", i, nm,
                     strata_values_name(l->values_format),
                     strata_values_name(e->cfg->values_format));
            return -1;
        }
        if ((l->comp == STRATA_COMP_TOPK || l->comp == STRATA_COMP_RANDK) &&
            l->count != strata_comp_kept(b->density, l->numel)) {
            snprintf(msg, mlen,
                     "layer %zu (%s): %llu kept elements, the budget (density %g) is %llu", i, nm,
                     (unsigned long long)l->count, b->density,
                     (unsigned long long)strata_comp_kept(b->density, l->numel));
            return -1;
        }
        if ((l->comp == STRATA_COMP_QSGD && l->levels != b->levels) ||
            (l->comp == STRATA_COMP_POWERSGD && l->rank != b->rank)) {
            snprintf(msg, mlen, "layer %zu (%s): levels/rank differ from the budget", i, nm);
            return -1;
        }
    }
    return 0;
}

static void receipt_resp(srv_resp *r, uint32_t round, const strata_store_receipt *rc)
{
    resp_json(r, 200,
              json_pack("{s:I,s:s,s:b}", "round", (json_int_t)round, "receipt", rc->id, "duplicate",
                        rc->duplicate ? 1 : 0));
}

/* Answers a store refusal. */
static void verdict_resp(srv_engine *e, srv_resp *r, uint32_t round, strata_store_verdict v)
{
    if (v == STRATA_STORE_REJECT_NOT_SELECTED) {
        ctr_add(e, C_REJ_NOT_SELECTED, 1);
        srv_resp_error(r, 403, "not_selected", "this client was not selected for round %u", round);
    } else if (v == STRATA_STORE_REJECT_ROUND_CLOSED) {
        ctr_add(e, C_REJ_ROUND_CLOSED, 1);
        srv_resp_error(r, 409, "round_closed", "round %u is closed", round);
    } else {
        ctr_add(e, C_REJ_ROUND_NOT_OPEN, 1);
        srv_resp_error(r, 409, "round_not_open", "round %u has not opened", round);
    }
}

#define BATCH_MAX 256

/* Queues u and returns once it is decided (lock held on entry and exit).
 * The first waiting uploader that finds no commit in flight becomes the
 * committer: it takes the queued uploads that are still acceptable (the
 * open round, not closing, client selected and not yet reported), commits
 * them in one transaction on the second store connection with the lock
 * released (so that more uploads queue meanwhile), then, under the lock,
 * aggregates the accepted ones. The round cannot start closing while a
 * batch is in flight (ready_to_close), so every acknowledged update is
 * aggregated. An upload no longer acceptable is handed back untaken. */
static void group_commit(srv_engine *e, pending_upload *u)
{
    u->next = NULL;
    if (e->queue_tail != NULL)
        e->queue_tail->next = u;
    else
        e->queue = u;
    e->queue_tail = u;
    while (!u->done) {
        if (e->committing) {
            pthread_cond_wait(&e->commit_cv, &e->mu);
            continue;
        }
        e->committing = 1;
        pending_upload *batch[BATCH_MAX];
        strata_store_pending *pp[BATCH_MAX];
        size_t n = 0;
        while (e->queue != NULL && n < BATCH_MAX) {
            pending_upload *q = e->queue;
            e->queue = q->next;
            if (e->queue == NULL)
                e->queue_tail = NULL;
            q->k = e->open && q->round == e->next_round && !e->closing && !e->stopping_round
                       ? find_u64(e->selected, e->nselected, q->client_id)
                       : -1;
            if (q->k < 0 || e->reported[q->k]) {
                q->done = 1; /* untaken: its uploader answers alone */
                continue;
            }
            pp[n] = q->pend;
            batch[n++] = q;
        }
        if (n > 0) {
            strata_store_receipt recs[BATCH_MAX];
            strata_store_verdict vs[BATCH_MAX];
            int results[BATCH_MAX];
            strata_diag d = {{0}};
            pthread_mutex_unlock(&e->mu);
            int rc = strata_store_update_commit_many(e->wstore, pp, n, recs, vs, results, &d);
            pthread_mutex_lock(&e->mu);
            for (size_t i = 0; i < n; i++) {
                pending_upload *q = batch[i];
                q->pend = NULL; /* the commit took it */
                q->taken = 1;
                q->rc = results[i];
                q->rec = recs[i];
                q->v = vs[i];
                if (rc < 0)
                    snprintf(q->msg, sizeof(q->msg), "%s", strata_diag_msg(&d, rc));
                if (q->rc == 0 && !q->rec.duplicate && !e->reported[q->k]) {
                    strata_diag ad = {{0}};
                    if (strata_agg_add_clipped(e->agg, q->p->layers, q->p->num_layers,
                                               (double)q->p->sample_count, e->cfg->clip_norm, NULL,
                                               &ad) < 0) /* validated: unreachable */
                        fprintf(stderr,
                                "strata-server: round %u: stored update not aggregated: %s\n",
                                q->round, strata_diag_msg(&ad, STRATA_EPROTO));
                    e->reported[q->k] = 1;
                    e->nreported++;
                    e->uplink += q->len;
                    ctr_add(e, C_ACCEPTED, 1);
                }
                q->done = 1;
            }
        }
        e->committing = 0;
        pthread_cond_broadcast(&e->commit_cv);
        pthread_cond_broadcast(&e->cv);
    }
}

void srv_engine_upload(srv_engine *e, uint64_t cid, uint32_t round, const uint8_t *body, size_t len,
                       srv_resp *r)
{
    strata_diag d = {{0}};
    strata_payload *p = NULL;
    strata_store_receipt rec;
    strata_store_verdict v = STRATA_STORE_ACCEPTED;
    int rc = len > 0 ? strata_payload_decode(body, len, &e->limits, &p, &d) : STRATA_EPROTO;
    if (rc == STRATA_ETOOBIG) {
        /* The decoder's limits are the model's sizes: a well-formed payload
         * that is larger than the model does not match it. */
        ctr_add(e, C_REJ_INVALID, 1);
        srv_resp_error(r, 422, "invalid_update", "larger than the model: %s",
                       strata_diag_msg(&d, rc));
        return;
    }
    if (rc < 0) {
        ctr_add(e, C_REJ_BAD_PAYLOAD, 1);
        srv_resp_error(r, 400, "bad_payload", "%s",
                       len == 0 ? "empty body" : strata_diag_msg(&d, rc));
        return;
    }
    if (p->client_id != cid) {
        ctr_add(e, C_REJ_FORBIDDEN, 1);
        srv_resp_error(r, 403, "forbidden",
                       "the payload is for client %llu; this token belongs to client %llu",
                       (unsigned long long)p->client_id, (unsigned long long)cid);
        strata_payload_free(p);
        return;
    }
    /* The slow half of the durable write (the payload file, written and
     * fsync'ed) runs before the lock when the upload looks acceptable, so
     * uploads overlap their fsyncs; the commit under the lock decides. When
     * it is not needed after all, or fails here, it is discarded and the
     * checks below answer as they would without it. */
    strata_store_pending *pend = NULL;
    pthread_mutex_lock(&e->mu);
    ptrdiff_t k = e->open && round == e->next_round && !e->closing
                      ? find_u64(e->selected, e->nselected, cid)
                      : -1;
    char msg[512];
    int candidate = k >= 0 && !e->reported[k] && validate(e, p, round, msg, sizeof(msg)) == 0;
    pthread_mutex_unlock(&e->mu);
    if (candidate && strata_store_update_prepare(e->store, round, cid, body, len, p->sample_count,
                                                 &pend, &d) < 0)
        pend = NULL;
    pthread_mutex_lock(&e->mu);
    if (pend != NULL) {
        pending_upload u = {.pend = pend, .p = p, .round = round, .client_id = cid, .len = len};
        group_commit(e, &u);
        pend = u.pend; /* NULL when taken */
        if (u.taken) {
            if (u.rc == STRATA_ESTATE)
                verdict_resp(e, r, round, u.v);
            else if (u.rc < 0)
                resp_internal(r, u.msg);
            else
                receipt_resp(r, round, &u.rec);
            pthread_mutex_unlock(&e->mu);
            strata_payload_free(p);
            return;
        }
    }
    /* Alone from here (no prepared file, or not taken by a batch): never
     * beside a group commit, so the store's order stays the aggregation's. */
    while (e->committing)
        pthread_cond_wait(&e->commit_cv, &e->mu);
    k = e->open && round == e->next_round ? find_u64(e->selected, e->nselected, cid) : -1;
    if (e->open && round == e->next_round && !e->closing && (k < 0 || !e->reported[k])) {
        if (k < 0) {
            verdict_resp(e, r, round, STRATA_STORE_REJECT_NOT_SELECTED);
        } else if (validate(e, p, round, msg, sizeof(msg)) < 0) {
            ctr_add(e, C_REJ_INVALID, 1);
            srv_resp_error(r, 422, "invalid_update", "%s", msg);
        } else if ((rc = pend != NULL
                             ? strata_store_update_commit(e->store, pend, &rec, &v, &d)
                             : strata_store_update_put(e->store, round, cid, body, len,
                                                       p->sample_count, &rec, &v, &d)) < 0) {
            pend = NULL; /* the commit took it */
            if (rc == STRATA_ESTATE)
                verdict_resp(e, r, round, v);
            else
                resp_internal(r, strata_diag_msg(&d, rc));
        } else {
            pend = NULL;
            if (!rec.duplicate) {
                rc = strata_agg_add_clipped(e->agg, p->layers, p->num_layers,
                                            (double)p->sample_count, e->cfg->clip_norm, NULL, &d);
                if (rc < 0) /* validate() and the decoder make this unreachable */
                    fprintf(stderr, "strata-server: round %u: stored update not aggregated: %s\n",
                            round, strata_diag_msg(&d, rc));
                e->reported[k] = 1;
                e->nreported++;
                e->uplink += len;
                ctr_add(e, C_ACCEPTED, 1);
                pthread_cond_broadcast(&e->cv);
            }
            receipt_resp(r, round, &rec);
        }
    } else if (e->closing && round == e->next_round && (k < 0 || !e->reported[k])) {
        verdict_resp(e, r, round,
                     k < 0 ? STRATA_STORE_REJECT_NOT_SELECTED : STRATA_STORE_REJECT_ROUND_CLOSED);
    } else if (!e->open && round >= e->next_round) {
        verdict_resp(e, r, round, STRATA_STORE_REJECT_UNKNOWN_ROUND);
    } else {
        /* A closed round (or a repeat for the open one): the store answers
         * duplicates with the original receipt and refuses the rest. */
        rc =
            strata_store_update_put(e->store, round, cid, body, len, p->sample_count, &rec, &v, &d);
        if (rc == STRATA_ESTATE)
            verdict_resp(e, r, round, v);
        else if (rc < 0)
            resp_internal(r, strata_diag_msg(&d, rc));
        else
            receipt_resp(r, round, &rec);
    }
    pthread_mutex_unlock(&e->mu);
    strata_store_pending_free(pend);
    strata_payload_free(p);
}

/* The summary of a round record; lock held (reads the open round). */
static json_t *round_json(srv_engine *e, const strata_store_round *rd)
{
    if (rd->state == STRATA_STORE_ROUND_CLOSED && rd->summary_json != NULL) {
        json_t *j = json_loads(rd->summary_json, 0, NULL);
        if (j != NULL)
            return j;
    }
    int cur = e->open && rd->round == e->next_round;
    json_t *j = json_pack(
        "{s:I,s:s,s:I,s:I,s:I,s:n,s:n,s:I,s:I,s:I,s:I}", "round", (json_int_t)rd->round, "state",
        rd->state == STRATA_STORE_ROUND_OPEN ? "open" : "closed", "model_version",
        (json_int_t)rd->model_version, "selected", (json_int_t)rd->n_selected, "participants",
        (json_int_t)rd->n_updates, "accuracy", "loss", "uplink_bytes",
        (json_int_t)(cur ? e->uplink : 0), "downlink_bytes", (json_int_t)(cur ? e->downlink : 0),
        "dense_uplink_bytes", (json_int_t)(rd->n_updates * e->total_params * 4), "duration_ms",
        (json_int_t)(srv_now_ms() - rd->opened_unix_ms));
    if (j != NULL && cur)
        json_object_set_new(j, "densities", densities_json(e));
    return j;
}

void srv_engine_rounds(srv_engine *e, uint32_t from, size_t limit, srv_resp *r)
{
    strata_store_round *rs = NULL;
    size_t n = 0;
    strata_diag d = {{0}};
    pthread_mutex_lock(&e->mu);
    int rc = strata_store_round_list(e->store, from, limit, &rs, &n, &d);
    json_t *arr = json_array();
    for (size_t i = 0; rc == 0 && i < n; i++)
        json_array_append_new(arr, round_json(e, &rs[i]));
    pthread_mutex_unlock(&e->mu);
    strata_store_round_list_free(rs, n);
    if (rc < 0) {
        json_decref(arr);
        resp_internal(r, strata_diag_msg(&d, rc));
        return;
    }
    resp_json(r, 200, json_pack("{s:o}", "rounds", arr));
}

void srv_engine_round(srv_engine *e, uint32_t round, srv_resp *r)
{
    strata_store_round rd;
    memset(&rd, 0, sizeof(rd));
    int found = 0;
    strata_diag d = {{0}};
    pthread_mutex_lock(&e->mu);
    int rc = strata_store_round_get(e->store, round, &rd, &found, &d);
    json_t *j = rc == 0 && found ? round_json(e, &rd) : NULL;
    pthread_mutex_unlock(&e->mu);
    strata_store_round_cleanup(&rd);
    if (rc < 0)
        resp_internal(r, strata_diag_msg(&d, rc));
    else if (!found)
        srv_resp_error(r, 404, "not_found", "no round %u", round);
    else
        resp_json(r, 200, j);
}

void srv_engine_status(srv_engine *e, srv_resp *r)
{
    char *cj = srv_config_json(e->cfg, 0);
    json_t *cfg = cj ? json_loads(cj, 0, NULL) : NULL;
    free(cj);
    pthread_mutex_lock(&e->mu);
    const char *state = state_name(e);
    json_t *j = json_pack("{s:s,s:I,s:I,s:I,s:I,s:o}", "state", state, "round",
                          (json_int_t)e->next_round, "total_rounds", (json_int_t)e->cfg->rounds,
                          "model_version", (json_int_t)e->version, "registered_clients",
                          (json_int_t)e->nclients, "config", cfg ? cfg : json_object());
    pthread_mutex_unlock(&e->mu);
    resp_json(r, 200, j);
}

void srv_engine_metrics(srv_engine *e, srv_resp *r)
{
    size_t cap = 16384, n = 0;
    char *b = malloc(cap);
    if (b == NULL) {
        srv_resp_error(r, 500, "internal", "out of memory");
        return;
    }
    pthread_mutex_lock(&e->mu);
#define OUT(...) n += (size_t)snprintf(b + n, n < cap ? cap - n : 0, __VA_ARGS__)
    static const char *const help[][2] = {
        {"rounds_completed_total", "Rounds closed."},
        {"updates_accepted_total", "Updates accepted."},
        {"bytes_received_total", "Request body bytes received."},
        {"bytes_sent_total", "Response body bytes sent."},
        {"updates_rejected_total", "Updates refused, by reason."},
        {"requests_rejected_total", "Requests answered with an error, by error code."}};
    char prev[64] = "";
    for (int c = 0; c < C_N; c++) {
        char base[64];
        snprintf(base, sizeof(base), "%s", CTR_NAMES[c]);
        base[strcspn(base, "{")] = '\0';
        if (strcmp(base, prev) != 0) {
            const char *h = "";
            for (size_t i = 0; i < sizeof(help) / sizeof(help[0]); i++)
                if (strcmp(help[i][0], base) == 0)
                    h = help[i][1];
            OUT("# HELP strata_%s %s\n# TYPE strata_%s counter\n", base, h, base);
            snprintf(prev, sizeof(prev), "%s", base);
        }
        OUT("strata_%s %lld\n", CTR_NAMES[c], (long long)atomic_load(&e->ctr[c]));
    }
    OUT("# HELP strata_paused 1 while an operator has paused the federation.\n"
        "# TYPE strata_paused gauge\nstrata_paused %d\n",
        e->paused);
    OUT("# HELP strata_aggregation_seconds Server aggregation time of the last round.\n"
        "# TYPE strata_aggregation_seconds gauge\nstrata_aggregation_seconds %.6f\n",
        e->last_agg_s);
    OUT("# HELP strata_round_duration_seconds Duration of the last round.\n"
        "# TYPE strata_round_duration_seconds gauge\nstrata_round_duration_seconds %.3f\n",
        e->last_round_s);
    OUT("# HELP strata_accuracy Test accuracy of the last evaluation.\n"
        "# TYPE strata_accuracy gauge\nstrata_accuracy %.6f\n",
        e->last_acc);
    OUT("# HELP strata_loss Test loss of the last evaluation.\n"
        "# TYPE strata_loss gauge\nstrata_loss %.6f\n",
        e->last_loss);
    OUT("# HELP strata_registered_clients Registered clients.\n"
        "# TYPE strata_registered_clients gauge\nstrata_registered_clients %zu\n",
        e->nclients);
    OUT("# HELP strata_round Current (open or next) round.\n"
        "# TYPE strata_round gauge\nstrata_round %u\n",
        e->next_round);
    OUT("# HELP strata_model_version Current global model version.\n"
        "# TYPE strata_model_version gauge\nstrata_model_version %llu\n",
        (unsigned long long)e->version);
#undef OUT
    pthread_mutex_unlock(&e->mu);
    if (n >= cap) {
        free(b);
        srv_resp_error(r, 500, "internal", "metrics text too long");
        return;
    }
    resp_text(r, 200, "text/plain; version=0.0.4; charset=utf-8", b);
}
