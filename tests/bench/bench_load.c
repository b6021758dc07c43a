/* Coordinator load generator: many lightweight synthetic clients against one
 * strata-server.
 *
 * Registers N clients (POST /v1/clients, with the enrolment secret when one
 * is given), reads the model's tensor shapes once (GET /v1/models/0), then
 * runs N client threads at once. Each thread owns one reused curl easy
 * handle (one keep-alive connection) and, for R rounds: long-polls
 * GET /v1/tasks/next, builds a synthetic update that matches the task
 * exactly (every layer with the task's compressor, values format and budget:
 * top-k keeps strata_comp_kept(density, numel) random distinct indices in
 * ascending order with small random finite values, and so on for the other
 * compressors; the header carries the task's round and model version, the
 * client's id and a sample count), encodes it with strata_payload_encode and
 * uploads it (POST /v1/rounds/{r}/updates). No training, no model download.
 *
 * Measured: each upload's latency (curl_easy_perform of the POST: request
 * sent to response received), each round's upload window (the first upload
 * start to the last acknowledgement of that round) and the uploads per
 * second over it, p50/p99/max latency over all uploads, and errors: any
 * upload answered with a status other than 200, any transport error, any
 * unexpected answer to a poll, any update the bench could not build. The
 * bench does not hide failures: a failed upload is counted and retried (at
 * most 3 attempts, transport errors and 408/429/5xx only), so that a
 * transient failure does not stall the round until its deadline.
 *
 * Usage: bench_load --server URL [--clients N] [--rounds R] [--secret S]
 *                   [--seed S] [--timeout S] [--json]
 * Prints a per-round table and a summary; with --json the last line is one
 * JSON object. Exits 0 when every upload was acknowledged without an error,
 * 1 when there was an error, 2 on bad usage. */
#include "strata/checkpoint.h"
#include "strata/compress.h"
#include "strata/model.h"
#include "strata/parse.h"
#include "strata/payload.h"
#include "strata/task.h"
#include "strata/rng.h"
#include "strata/tensor.h"

#include <curl/curl.h>
#include <getopt.h>
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_RESPONSE ((size_t)1 << 28) /* the model download is the largest */
#define MAX_JSON ((size_t)1 << 20)
#define POLL_WAIT_S 30
#define UPLOAD_ATTEMPTS 3
#define THREAD_STACK ((size_t)512 << 10)
#define SLOW_UPLOAD_S 5.0 /* such uploads are described on stderr (a few) */

typedef struct options {
    const char *server, *secret;
    long clients, rounds, timeout_s;
    unsigned long long seed;
    int json;
} options;

/* One tensor of the model, in model order. */
typedef struct layer_info {
    char name[STRATA_MAX_NAME];
    uint64_t numel;
    int ndim;
    int64_t shape[STRATA_MAX_DIMS];
} layer_info;

/* One upload as measured (a slot per (client, round index)). */
typedef struct upload_rec {
    uint32_t round;
    int done;          /* acknowledged with 200 */
    double start, end; /* CLOCK_MONOTONIC seconds of the acknowledged attempt */
    size_t bytes;
} upload_rec;

typedef struct bench bench;

typedef struct client {
    bench *b;
    size_t index;
    uint64_t id;
    char token[80];
    pthread_t thread;
    int started;
    upload_rec *recs; /* rounds entries */
    uint64_t *bitmap; /* scratch for distinct index draws */
    size_t bitmap_words;
} client;

struct bench {
    options o;
    char base[1024];
    layer_info *layers;
    size_t nlayers;
    client *clients;
    double deadline; /* CLOCK_MONOTONIC seconds after which threads give up */
    atomic_long err_upload_status, err_transport, err_poll, err_build, duplicates;
    atomic_long reconnects; /* uploads that needed a new connection */
    atomic_long slow;       /* uploads that took more than SLOW_UPLOAD_S */
    atomic_int slow_logged;
    atomic_int first_error_logged;
};

/* ---- small helpers -------------------------------------------------------- */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void sleep_s(double s)
{
    if (s <= 0)
        return;
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

/* Logs the first few errors in full; later ones are only counted. */
static void log_error(bench *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void log_error(bench *b, const char *fmt, ...)
{
    if (atomic_fetch_add(&b->first_error_logged, 1) >= 10)
        return;
    va_list ap;
    va_start(ap, fmt);
    fputs("bench_load: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

/* ---- HTTP ----------------------------------------------------------------- */

typedef struct sink {
    uint8_t *buf;
    size_t len, cap, max;
} sink;

static size_t on_body(char *ptr, size_t size, size_t nmemb, void *ud)
{
    sink *s = ud;
    size_t n = size * nmemb;
    if (n > s->max - s->len)
        return 0; /* aborts the transfer */
    if (s->len + n + 1 > s->cap) {
        size_t cap = s->cap ? s->cap : 4096;
        while (cap < s->len + n + 1)
            cap *= 2;
        uint8_t *nb = realloc(s->buf, cap);
        if (nb == NULL)
            return 0;
        s->buf = nb;
        s->cap = cap;
    }
    memcpy(s->buf + s->len, ptr, n);
    s->len += n;
    s->buf[s->len] = '\0';
    return n;
}

/* One request on the reused handle c. body may be NULL (GET). The response
 * body lands in *resp (reset first; its buffer is reused); *status is the
 * HTTP status. Returns the CURLcode. timeout_s bounds the whole request (0:
 * none, a low-speed limit applies instead). */
static CURLcode http_do(CURL *c, const char *url, const char *token, const char *ctype,
                        const uint8_t *body, size_t len, long timeout_s, sink *resp, long *status)
{
    char auth[128], ct[128];
    struct curl_slist *hdr = NULL;
    if (token != NULL) {
        snprintf(auth, sizeof(auth), "Authorization: Bearer %s", token);
        hdr = curl_slist_append(hdr, auth);
    }
    if (ctype != NULL) {
        snprintf(ct, sizeof(ct), "Content-Type: %s", ctype);
        hdr = curl_slist_append(hdr, ct);
    }
    hdr = curl_slist_append(hdr, "Expect:");
    resp->len = 0;
    if (resp->buf != NULL)
        resp->buf[0] = '\0';
    *status = 0;
    curl_easy_reset(c); /* keeps the connection */
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT, 10L);
    curl_easy_setopt(c, CURLOPT_LOW_SPEED_LIMIT, 1L);
    curl_easy_setopt(c, CURLOPT_LOW_SPEED_TIME, 60L);
    if (timeout_s > 0)
        curl_easy_setopt(c, CURLOPT_TIMEOUT, timeout_s);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, hdr);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, resp);
    if (body != NULL) {
        curl_easy_setopt(c, CURLOPT_POST, 1L);
        curl_easy_setopt(c, CURLOPT_POSTFIELDS, (const char *)body);
        curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)len);
    } else {
        curl_easy_setopt(c, CURLOPT_HTTPGET, 1L);
    }
    CURLcode cc = curl_easy_perform(c);
    if (cc == CURLE_OK)
        curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, status);
    curl_slist_free_all(hdr);
    return cc;
}

static const char *body_text(const sink *s)
{
    return s->buf != NULL ? (const char *)s->buf : "";
}

/* ---- set-up: registration and model shapes ------------------------------- */

static int register_clients(bench *b, CURL *c)
{
    char url[1200];
    snprintf(url, sizeof(url), "%s/v1/clients", b->base);
    sink s = {.max = MAX_JSON};
    int rc = 0;
    for (long i = 0; i < b->o.clients && rc == 0; i++) {
        json_t *req = json_object();
        char name[32];
        snprintf(name, sizeof(name), "load-%ld", i);
        json_object_set_new(req, "name", json_string(name));
        if (b->o.secret != NULL)
            json_object_set_new(req, "enrolment_secret", json_string(b->o.secret));
        char *text = json_dumps(req, JSON_COMPACT);
        json_decref(req);
        long status;
        CURLcode cc = text ? http_do(c, url, NULL, "application/json", (const uint8_t *)text,
                                     strlen(text), 30, &s, &status)
                           : CURLE_OUT_OF_MEMORY;
        free(text);
        if (cc != CURLE_OK || status != 201) {
            fprintf(stderr, "bench_load: registering client %ld: %s (HTTP %ld) %s\n", i,
                    curl_easy_strerror(cc), status, body_text(&s));
            rc = -1;
            break;
        }
        json_t *j = json_loadb((const char *)s.buf, s.len, 0, NULL);
        json_t *cid = json_object_get(j, "client_id");
        const char *tok = json_string_value(json_object_get(j, "token"));
        client *cl = &b->clients[i];
        if (!json_is_integer(cid) || tok == NULL || strlen(tok) >= sizeof(cl->token)) {
            fprintf(stderr, "bench_load: registration answer: %s\n", body_text(&s));
            rc = -1;
        } else {
            cl->id = (uint64_t)json_integer_value(cid);
            snprintf(cl->token, sizeof(cl->token), "%s", tok);
        }
        json_decref(j);
    }
    free(s.buf);
    return rc;
}

/* Reads the tensor names and shapes of the current global model (version 0
 * at the start of a run). */
static int load_layers(bench *b, CURL *c)
{
    char url[1200];
    snprintf(url, sizeof(url), "%s/v1/models/0", b->base);
    sink s = {.max = MAX_RESPONSE};
    long status;
    CURLcode cc = http_do(c, url, b->clients[0].token, NULL, NULL, 0, 120, &s, &status);
    int rc = -1;
    strata_model *m = NULL;
    strata_diag d = {{0}};
    if (cc != CURLE_OK || status != 200) {
        fprintf(stderr, "bench_load: GET /v1/models/0: %s (HTTP %ld)\n", curl_easy_strerror(cc),
                status);
        goto out;
    }
    int drc = strata_checkpoint_decode(s.buf, s.len, &m, &d);
    if (drc < 0) {
        fprintf(stderr, "bench_load: model 0: %s\n", strata_diag_msg(&d, drc));
        goto out;
    }
    strata_tensor_list *p = strata_model_params(m);
    b->layers = calloc(p->count ? p->count : 1, sizeof(*b->layers));
    if (b->layers == NULL)
        goto out;
    b->nlayers = p->count;
    for (size_t i = 0; i < p->count; i++) {
        const strata_tensor *t = &p->items[i];
        layer_info *l = &b->layers[i];
        snprintf(l->name, sizeof(l->name), "%s", t->name);
        l->numel = t->numel;
        l->ndim = t->ndim;
        memcpy(l->shape, t->shape, sizeof(l->shape));
    }
    rc = 0;
out:
    strata_model_free(m);
    free(s.buf);
    return rc;
}

/* ---- synthetic updates ---------------------------------------------------- */

typedef struct task {
    uint32_t round;
    uint64_t model_version;
    strata_budget *budgets; /* nlayers entries */
} task;

static int parse_task(const bench *b, const sink *s, task *t, char *why, size_t wlen)
{
    memset(t, 0, sizeof(*t));
    strata_task dt;
    strata_task_limits lim = {.max_layers = b->nlayers};
    strata_diag d;
    int rc = strata_task_decode((const char *)s->buf, s->len, &lim, &dt, &d);
    if (rc < 0) {
        snprintf(why, wlen, "task: %.400s", d.msg);
        return -1;
    }
    if (dt.num_layers != b->nlayers) {
        snprintf(why, wlen, "task has %zu budgets for %zu tensors", dt.num_layers, b->nlayers);
        rc = -1;
    }
    for (size_t i = 0; rc == 0 && i < b->nlayers; i++)
        if (strcmp(dt.layer_names[i], b->layers[i].name) != 0) {
            snprintf(why, wlen, "budget %zu is for \"%s\", the model's tensor %zu is \"%s\"", i,
                     dt.layer_names[i], i, b->layers[i].name);
            rc = -1;
        }
    if (rc == 0) {
        t->round = dt.round;
        t->model_version = dt.model_version;
        t->budgets = dt.budgets; /* taken */
        dt.budgets = NULL;
    }
    strata_task_cleanup(&dt);
    return rc;
}

/* A small finite value, exactly representable in the values format vf. */
static float synth_value(strata_rng *r, strata_values_format vf)
{
    float v = (float)(strata_rng_normal(r) * 0.01);
    if (vf == STRATA_VALUES_FP16)
        v = strata_f16_to_f32(strata_f32_to_f16(v));
    else if (vf == STRATA_VALUES_BF16)
        v = strata_bf16_to_f32(strata_f32_to_bf16(v));
    return v;
}

static float *synth_values(strata_rng *r, size_t n, strata_values_format vf)
{
    float *v = strata_alloc_floats(n ? n : 1);
    if (v != NULL)
        for (size_t i = 0; i < n; i++)
            v[i] = synth_value(r, vf);
    return v;
}

/* k distinct random indices below n, ascending, into idx (a bitmap of n bits
 * in the client's scratch marks the draws; then one scan lists them). */
static int synth_indices(client *cl, strata_rng *r, uint64_t n, uint64_t k, uint32_t *idx)
{
    size_t words = (size_t)((n + 63) / 64);
    if (words > cl->bitmap_words) {
        uint64_t *nb = realloc(cl->bitmap, words * sizeof(uint64_t));
        if (nb == NULL)
            return -1;
        cl->bitmap = nb;
        cl->bitmap_words = words;
    }
    memset(cl->bitmap, 0, words * sizeof(uint64_t));
    int invert = k > n / 2; /* mark the ones left out instead */
    uint64_t want = invert ? n - k : k;
    for (uint64_t got = 0; got < want;) {
        uint64_t i = strata_rng_below(r, n);
        uint64_t bit = (uint64_t)1 << (i & 63);
        if (!(cl->bitmap[i >> 6] & bit)) {
            cl->bitmap[i >> 6] |= bit;
            got++;
        }
    }
    uint64_t m = 0;
    for (uint64_t i = 0; i < n; i++) {
        int marked = (cl->bitmap[i >> 6] >> (i & 63)) & 1;
        if (marked != invert)
            idx[m++] = (uint32_t)i;
    }
    return m == k ? 0 : -1;
}

/* Fills one compressed layer for budget bb. Returns 0 or -1 (no memory or an
 * impossible budget), with why set. */
static int synth_layer(client *cl, strata_rng *r, const layer_info *li, size_t index,
                       const strata_budget *bb, strata_values_format vf, strata_clayer *out,
                       char *why, size_t wlen)
{
    memset(out, 0, sizeof(*out));
    out->layer_index = (uint32_t)index;
    out->numel = li->numel;
    out->comp = bb->comp;
    out->values_format = vf;
    uint64_t n = li->numel;
    switch (bb->comp) {
    case STRATA_COMP_NONE:
    case STRATA_COMP_FP16:
    case STRATA_COMP_BF16:
        if (bb->comp == STRATA_COMP_FP16)
            out->values_format = STRATA_VALUES_FP16;
        else if (bb->comp == STRATA_COMP_BF16)
            out->values_format = STRATA_VALUES_BF16;
        out->count = n;
        out->values = synth_values(r, (size_t)n, out->values_format);
        break;
    case STRATA_COMP_TOPK:
    case STRATA_COMP_RANDK:
        out->count = strata_comp_kept(bb->density, n);
        out->values = synth_values(r, (size_t)out->count, vf);
        if (bb->comp == STRATA_COMP_RANDK) {
            out->seed = strata_rng_u64(r);
            break;
        }
        out->indices = malloc((size_t)out->count * sizeof(uint32_t));
        if (out->indices != NULL && synth_indices(cl, r, n, out->count, out->indices) < 0) {
            snprintf(why, wlen, "layer %zu: cannot draw %llu indices", index,
                     (unsigned long long)out->count);
            return -1;
        }
        break;
    case STRATA_COMP_QSGD:
        out->values_format = STRATA_VALUES_FP32;
        out->levels = bb->levels;
        out->scale = 1.0f + (float)strata_rng_uniform(r);
        out->qlevels = malloc((size_t)n);
        if (out->qlevels != NULL)
            for (uint64_t i = 0; i < n; i++)
                out->qlevels[i] =
                    (int8_t)((int64_t)strata_rng_below(r, 2 * (uint64_t)bb->levels + 1) -
                             (int64_t)bb->levels);
        if (out->qlevels == NULL)
            goto oom;
        return 0;
    case STRATA_COMP_SIGN: {
        out->values_format = STRATA_VALUES_FP32;
        out->scale = 0.01f;
        size_t nb = (size_t)((n + 7) / 8);
        out->signbits = malloc(nb);
        if (out->signbits == NULL)
            goto oom;
        for (size_t i = 0; i < nb; i++)
            out->signbits[i] = (uint8_t)strata_rng_u64(r);
        if (n % 8)
            out->signbits[nb - 1] &= (uint8_t)((1u << (n % 8)) - 1);
        return 0;
    }
    case STRATA_COMP_POWERSGD: {
        uint32_t rows, cols, rank;
        if (strata_powersgd_dims(li->ndim, li->shape, bb->rank, &rows, &cols, &rank) < 0) {
            /* Vectors travel dense, as the real client sends them. */
            out->comp = STRATA_COMP_NONE;
            out->count = n;
            out->values = synth_values(r, (size_t)n, vf);
            break;
        }
        out->rows = rows;
        out->cols = cols;
        out->rank = rank;
        out->count = ((uint64_t)rows + cols) * rank;
        out->values = synth_values(r, (size_t)out->count, vf);
        break;
    }
    default:
        snprintf(why, wlen, "layer %zu: compressor %d not supported", index, (int)bb->comp);
        return -1;
    }
    if (out->values == NULL || (bb->comp == STRATA_COMP_TOPK && out->indices == NULL))
        goto oom;
    return 0;
oom:
    snprintf(why, wlen, "out of memory");
    return -1;
}

/* Builds and encodes the update for task t into *wire. */
static int build_update(client *cl, strata_rng *r, const task *t, uint8_t **wire, size_t *len,
                        char *why, size_t wlen)
{
    bench *b = cl->b;
    *wire = NULL;
    *len = 0;
    strata_clayer *layers = calloc(b->nlayers ? b->nlayers : 1, sizeof(*layers));
    char *meta = NULL;
    int rc = -1;
    if (layers == NULL) {
        snprintf(why, wlen, "out of memory");
        return -1;
    }
    for (size_t i = 0; i < b->nlayers; i++)
        if (synth_layer(cl, r, &b->layers[i], i, &t->budgets[i], t->budgets[i].values, &layers[i],
                        why, wlen) < 0)
            goto out;
    /* Compact metadata like the real client's (loss, residual norms). */
    json_t *norms = json_array();
    for (size_t i = 0; i < b->nlayers; i++)
        json_array_append_new(norms, json_real(0.01 * strata_rng_uniform(r)));
    json_t *mj = json_pack("{s:f,s:o}", "train_loss", 0.3 + 0.5 * strata_rng_uniform(r),
                           "residual_norms", norms);
    meta = mj ? json_dumps(mj, JSON_COMPACT) : NULL;
    json_decref(mj);
    strata_payload p = {.round = t->round,
                        .model_version = t->model_version,
                        .client_id = cl->id,
                        .sample_count = 60 + cl->index % 120,
                        .num_layers = b->nlayers,
                        .layers = layers,
                        .metadata_json = meta};
    strata_diag d = {{0}};
    int erc = strata_payload_encode(&p, 1, wire, len, &d);
    if (erc < 0) {
        snprintf(why, wlen, "encode: %s", strata_diag_msg(&d, erc));
        goto out;
    }
    rc = 0;
out:
    free(meta);
    strata_clayers_free(layers, b->nlayers);
    return rc;
}

/* ---- the client threads --------------------------------------------------- */

static int transient_status(long st)
{
    return st == 408 || st == 429 || st >= 500;
}

/* Waits for a task; 0 with *t filled, -1 when the run must stop for this
 * client (counted). */
static int next_task(client *cl, CURL *c, sink *s, task *t)
{
    bench *b = cl->b;
    char url[1200], why[512];
    snprintf(url, sizeof(url), "%s/v1/tasks/next?wait=%d", b->base, POLL_WAIT_S);
    int transport_failures = 0;
    while (now_s() < b->deadline) {
        long status;
        double t0 = now_s();
        CURLcode cc = http_do(c, url, cl->token, NULL, NULL, 0, POLL_WAIT_S + 30, s, &status);
        if (cc != CURLE_OK) {
            atomic_fetch_add(&b->err_transport, 1);
            log_error(b, "client %llu: poll: %s", (unsigned long long)cl->id,
                      curl_easy_strerror(cc));
            if (++transport_failures >= UPLOAD_ATTEMPTS)
                return -1;
            sleep_s(0.2 * transport_failures);
            continue;
        }
        if (status == 200) {
            if (parse_task(b, s, t, why, sizeof(why)) < 0) {
                atomic_fetch_add(&b->err_poll, 1);
                log_error(b, "client %llu: %s", (unsigned long long)cl->id, why);
                return -1;
            }
            return 0;
        }
        if (status == 204) {
            /* The long poll ended without a task: ask again (not in a tight
             * loop when the server answered at once). */
            if (now_s() - t0 < 0.5)
                sleep_s(0.1);
            continue;
        }
        atomic_fetch_add(&b->err_poll, 1);
        log_error(b, "client %llu: poll: HTTP %ld %s", (unsigned long long)cl->id, status,
                  body_text(s));
        if (!transient_status(status))
            return -1;
        sleep_s(0.5);
    }
    atomic_fetch_add(&b->err_poll, 1);
    log_error(b, "client %llu: no task before the time limit", (unsigned long long)cl->id);
    return -1;
}

static void *client_main(void *arg)
{
    client *cl = arg;
    bench *b = cl->b;
    CURL *c = curl_easy_init();
    sink s = {.max = MAX_JSON};
    strata_rng rng;
    strata_rng_seed(&rng, b->o.seed, cl->id);
    if (c == NULL) {
        atomic_fetch_add(&b->err_build, 1);
        return NULL;
    }
    for (long k = 0; k < b->o.rounds; k++) {
        task t;
        if (next_task(cl, c, &s, &t) < 0)
            break;
        uint8_t *wire = NULL;
        size_t len = 0;
        char why[512], url[1200];
        if (build_update(cl, &rng, &t, &wire, &len, why, sizeof(why)) < 0) {
            atomic_fetch_add(&b->err_build, 1);
            log_error(b, "client %llu: round %u: %s", (unsigned long long)cl->id, t.round, why);
            free(t.budgets);
            break;
        }
        snprintf(url, sizeof(url), "%s/v1/rounds/%u/updates", b->base, t.round);
        upload_rec *rec = &cl->recs[k];
        rec->round = t.round;
        rec->bytes = len;
        for (int attempt = 1; attempt <= UPLOAD_ATTEMPTS; attempt++) {
            long status;
            double t0 = now_s();
            CURLcode cc =
                http_do(c, url, cl->token, "application/octet-stream", wire, len, 0, &s, &status);
            double t1 = now_s();
            long connects = 0;
            if (curl_easy_getinfo(c, CURLINFO_NUM_CONNECTS, &connects) == CURLE_OK && connects > 0)
                atomic_fetch_add(&b->reconnects, 1);
            if (t1 - t0 > SLOW_UPLOAD_S) {
                /* Where the time went, as curl saw it. */
                curl_off_t sent = 0, first = 0;
                curl_easy_getinfo(c, CURLINFO_PRETRANSFER_TIME_T, &sent);
                curl_easy_getinfo(c, CURLINFO_STARTTRANSFER_TIME_T, &first);
                atomic_fetch_add(&b->slow, 1);
                if (atomic_fetch_add(&b->slow_logged, 1) < 5)
                    fprintf(stderr,
                            "bench_load: client %llu: round %u: upload took %.1f s (%s, HTTP %ld, "
                            "%ld new connection(s), request sent at %.3f s, first response "
                            "byte at %.3f s of the last attempt)\n",
                            (unsigned long long)cl->id, t.round, t1 - t0, curl_easy_strerror(cc),
                            status, connects, (double)sent * 1e-6, (double)first * 1e-6);
            }
            if (cc == CURLE_OK && status == 200) {
                rec->done = 1;
                rec->start = t0;
                rec->end = t1;
                if (strstr(body_text(&s), "\"duplicate\":true") != NULL)
                    atomic_fetch_add(&b->duplicates, 1);
                break;
            }
            if (cc != CURLE_OK) {
                atomic_fetch_add(&b->err_transport, 1);
                log_error(b, "client %llu: round %u: upload: %s", (unsigned long long)cl->id,
                          t.round, curl_easy_strerror(cc));
            } else {
                atomic_fetch_add(&b->err_upload_status, 1);
                log_error(b, "client %llu: round %u: upload: HTTP %ld %s",
                          (unsigned long long)cl->id, t.round, status, body_text(&s));
                if (!transient_status(status))
                    break;
            }
            sleep_s(0.1 * attempt);
        }
        free(wire);
        free(t.budgets);
        if (!rec->done)
            break;
    }
    free(s.buf);
    curl_easy_cleanup(c);
    return NULL;
}

/* ---- report ---------------------------------------------------------------- */

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Nearest-rank percentile of n sorted values. */
static double percentile(const double *v, size_t n, double p)
{
    if (n == 0)
        return 0.0;
    size_t rank = (size_t)ceil(p / 100.0 * (double)n);
    if (rank < 1)
        rank = 1;
    return v[rank - 1];
}

typedef struct round_stat {
    uint32_t round;
    size_t uploads;
    double first_start, last_end;
    double bytes;
} round_stat;

static int report(bench *b, double wall)
{
    size_t nrec = (size_t)b->o.clients * (size_t)b->o.rounds, nlat = 0;
    double *lat = malloc((nrec ? nrec : 1) * sizeof(double));
    round_stat *rs = calloc((size_t)b->o.rounds + 1, sizeof(*rs));
    size_t nrounds = 0;
    if (lat == NULL || rs == NULL) {
        free(lat);
        free(rs);
        return 1;
    }
    for (long i = 0; i < b->o.clients; i++)
        for (long k = 0; k < b->o.rounds; k++) {
            const upload_rec *u = &b->clients[i].recs[k];
            if (!u->done)
                continue;
            lat[nlat++] = u->end - u->start;
            size_t j = 0;
            while (j < nrounds && rs[j].round != u->round)
                j++;
            if (j == nrounds) {
                if (nrounds == (size_t)b->o.rounds)
                    continue; /* more distinct rounds than asked: cannot happen */
                rs[nrounds++] = (round_stat){u->round, 0, u->start, u->end, 0};
            }
            rs[j].uploads++;
            rs[j].bytes += (double)u->bytes;
            if (u->start < rs[j].first_start)
                rs[j].first_start = u->start;
            if (u->end > rs[j].last_end)
                rs[j].last_end = u->end;
        }
    qsort(lat, nlat, sizeof(double), cmp_double);
    long errors = atomic_load(&b->err_upload_status) + atomic_load(&b->err_transport) +
                  atomic_load(&b->err_poll) + atomic_load(&b->err_build);
    size_t expected = nrec;
    if (nlat != expected && errors == 0)
        errors = (long)(expected - nlat); /* a client stopped early without a counted error */
    double total_window = 0.0, bytes = 0.0;
    printf("%-6s %8s %10s %12s %12s\n", "round", "uploads", "window s", "uploads/s",
           "bytes/upload");
    double *rates = calloc(nrounds ? nrounds : 1, sizeof(double));
    for (size_t j = 0; j < nrounds; j++) {
        double w = rs[j].last_end - rs[j].first_start;
        double rate = w > 0 ? (double)rs[j].uploads / w : 0.0;
        if (rates != NULL)
            rates[j] = rate;
        total_window += w;
        bytes += rs[j].bytes;
        printf("%-6u %8zu %10.3f %12.1f %12.0f\n", rs[j].round, rs[j].uploads, w, rate,
               rs[j].uploads ? rs[j].bytes / (double)rs[j].uploads : 0.0);
    }
    double overall = total_window > 0 ? (double)nlat / total_window : 0.0;
    double p50 = percentile(lat, nlat, 50) * 1e3, p99 = percentile(lat, nlat, 99) * 1e3;
    double pmax = nlat ? lat[nlat - 1] * 1e3 : 0.0;
    printf(
        "clients %ld, rounds %ld: %zu of %zu uploads acknowledged, %.1f uploads/s over the "
        "upload windows (%.3f s), latency p50 %.1f ms, p99 %.1f ms, max %.1f ms, errors %ld "
        "(upload status %ld, transport %ld, poll %ld, build %ld), duplicates %ld, uploads on a new "
        "connection %ld, uploads over %.0f s %ld, wall %.1f s\n",
        b->o.clients, b->o.rounds, nlat, expected, overall, total_window, p50, p99, pmax, errors,
        atomic_load(&b->err_upload_status), atomic_load(&b->err_transport),
        atomic_load(&b->err_poll), atomic_load(&b->err_build), atomic_load(&b->duplicates),
        atomic_load(&b->reconnects), SLOW_UPLOAD_S, atomic_load(&b->slow), wall);
    if (b->o.json) {
        json_t *per = json_array();
        for (size_t j = 0; j < nrounds; j++) {
            double w = rs[j].last_end - rs[j].first_start;
            json_array_append_new(per,
                                  json_pack("{s:I,s:I,s:f,s:f}", "round", (json_int_t)rs[j].round,
                                            "uploads", (json_int_t)rs[j].uploads, "window_s", w,
                                            "uploads_per_second", rates ? rates[j] : 0.0));
        }
        json_t *j = json_pack(
            "{s:I,s:I,s:I,s:I,s:f,s:f,s:f,s:f,s:f,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:f,s:f,s:o}",
            "clients", (json_int_t)b->o.clients, "rounds", (json_int_t)b->o.rounds, "uploads",
            (json_int_t)nlat, "expected_uploads", (json_int_t)expected, "uploads_per_second",
            overall, "window_s", total_window, "latency_p50_ms", p50, "latency_p99_ms", p99,
            "latency_max_ms", pmax, "errors", (json_int_t)errors, "errors_upload_status",
            (json_int_t)atomic_load(&b->err_upload_status), "errors_transport",
            (json_int_t)atomic_load(&b->err_transport), "errors_poll",
            (json_int_t)atomic_load(&b->err_poll), "errors_build",
            (json_int_t)atomic_load(&b->err_build), "duplicates",
            (json_int_t)atomic_load(&b->duplicates), "upload_reconnects",
            (json_int_t)atomic_load(&b->reconnects), "slow_uploads",
            (json_int_t)atomic_load(&b->slow), "mean_upload_bytes",
            nlat ? bytes / (double)nlat : 0.0, "wall_s", wall, "per_round", per);
        char *text = j ? json_dumps(j, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
        if (text != NULL)
            printf("%s\n", text);
        free(text);
        json_decref(j);
    }
    fflush(stdout);
    free(rates);
    free(lat);
    free(rs);
    return errors == 0 && nlat == expected ? 0 : 1;
}

/* ---- main ------------------------------------------------------------------ */

static const char USAGE[] = "usage: bench_load --server URL [options]\n"
                            "  --clients N    concurrent synthetic clients (default 500)\n"
                            "  --rounds R     rounds each client uploads in (default 3)\n"
                            "  --secret S     the coordinator's enrolment secret\n"
                            "  --seed S       seed of the synthetic updates (default 1)\n"
                            "  --timeout S    give up after S seconds (default 900)\n"
                            "  --json         print a JSON summary as the last line\n";

static int parse_options(int argc, char **argv, options *o)
{
    static const struct option opts[] = {
        {"server", required_argument, NULL, 'S'},
        {"clients", required_argument, NULL, 'n'},
        {"rounds", required_argument, NULL, 'r'},
        {"secret", required_argument, NULL, 'e'},
        {"seed", required_argument, NULL, 's'},
        {"timeout", required_argument, NULL, 't'},
        {"json", no_argument, NULL, 'j'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    *o = (options){.clients = 500, .rounds = 3, .timeout_s = 900, .seed = 1};
    int c, li = 0;
    long v;
    while ((c = getopt_long(argc, argv, "", opts, &li)) != -1) {
        switch (c) {
        case 'S':
            o->server = optarg;
            break;
        case 'e':
            o->secret = optarg;
            break;
        case 'n':
            if (strata_parse_long(optarg, 1, 100000, &o->clients))
                goto bad;
            break;
        case 'r':
            if (strata_parse_long(optarg, 1, 100000, &o->rounds))
                goto bad;
            break;
        case 't':
            if (strata_parse_long(optarg, 1, 86400, &o->timeout_s))
                goto bad;
            break;
        case 's':
            if (strata_parse_long(optarg, 0, __LONG_MAX__, &v))
                goto bad;
            o->seed = (unsigned long long)v;
            break;
        case 'j':
            o->json = 1;
            break;
        case 'h':
            fputs(USAGE, stdout);
            exit(0);
        default:
            fputs(USAGE, stderr);
            return 2;
        }
    }
    if (optind != argc || o->server == NULL ||
        (strncmp(o->server, "http://", 7) != 0 && strncmp(o->server, "https://", 8) != 0)) {
        fputs(USAGE, stderr);
        fprintf(stderr, "bench_load: --server http://HOST:PORT is required\n");
        return 2;
    }
    return 0;
bad:
    fprintf(stderr, "bench_load: invalid value '%s' for --%s\n", optarg, opts[li].name);
    return 2;
}

int main(int argc, char **argv)
{
    bench b;
    memset(&b, 0, sizeof(b));
    int rc = parse_options(argc, argv, &b.o);
    if (rc != 0)
        return rc;
    snprintf(b.base, sizeof(b.base), "%s", b.o.server);
    size_t bl = strlen(b.base);
    while (bl > 0 && b.base[bl - 1] == '/')
        b.base[--bl] = '\0';
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != 0) {
        fprintf(stderr, "bench_load: curl_global_init failed\n");
        return 1;
    }
    strata_set_threads(1);
    int code = 1;
    CURL *c = curl_easy_init();
    b.clients = calloc((size_t)b.o.clients, sizeof(client));
    if (c == NULL || b.clients == NULL)
        goto out;
    for (long i = 0; i < b.o.clients; i++) {
        b.clients[i].b = &b;
        b.clients[i].index = (size_t)i;
        b.clients[i].recs = calloc((size_t)b.o.rounds, sizeof(upload_rec));
        if (b.clients[i].recs == NULL)
            goto out;
    }
    double t0 = now_s();
    b.deadline = t0 + (double)b.o.timeout_s;
    if (register_clients(&b, c) < 0 || load_layers(&b, c) < 0)
        goto out;
    fprintf(stderr, "bench_load: %ld clients registered in %.1f s; model has %zu tensors\n",
            b.o.clients, now_s() - t0, b.nlayers);
    curl_easy_cleanup(c); /* its idle connection would only hold a server slot */
    c = NULL;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, THREAD_STACK);
    double t1 = now_s();
    long started = 0;
    for (long i = 0; i < b.o.clients; i++) {
        if (pthread_create(&b.clients[i].thread, &attr, client_main, &b.clients[i]) != 0) {
            fprintf(stderr, "bench_load: cannot start client thread %ld\n", i);
            atomic_fetch_add(&b.err_build, 1);
            break;
        }
        b.clients[i].started = 1;
        started++;
    }
    pthread_attr_destroy(&attr);
    for (long i = 0; i < b.o.clients; i++)
        if (b.clients[i].started)
            pthread_join(b.clients[i].thread, NULL);
    code = report(&b, now_s() - t1);
out:
    if (c != NULL)
        curl_easy_cleanup(c);
    if (b.clients != NULL)
        for (long i = 0; i < b.o.clients; i++) {
            free(b.clients[i].recs);
            free(b.clients[i].bitmap);
        }
    free(b.clients);
    free(b.layers);
    curl_global_cleanup();
    return code;
}
