/* Coordinator load generator: many simulated clients against one
 * strata-server, driven from one event loop.
 *
 * Registers N clients (POST /v1/clients, at most --register-concurrency at a
 * time, with the enrolment secret when one is given), reads the model's
 * tensor shapes once (GET /v1/models/0), then runs the N clients at once from
 * one thread: libcurl's multi interface (curl_multi_socket_action) on one
 * epoll set. Each client has its own easy handle; every 64 clients share a
 * multi handle whose pool keeps their keep-alive connections (sized so that
 * curl never closes one; small pools keep curl's search for an idle
 * connection short). A transfer takes any idle connection of its pool and no
 * client has more than one transfer in flight, so the run opens about N
 * connections and keeps them ("connections opened"; an upload that found no
 * idle one, which happens while the pools fill, is counted as "on a new
 * connection").
 * For R rounds each client long-polls GET /v1/tasks/next (200: a task; 204:
 * none yet, asked again at once, or when the answer came within 0.5 s after
 * min(Retry-After, 1 s), 0.1 s without one; 410 "finished" and other answers
 * are counted as poll errors), then hands the task to a second thread, which builds a
 * synthetic update that matches it exactly (every layer with the task's
 * compressor, values format and budget: top-k keeps strata_comp_kept(density,
 * numel) random distinct indices in ascending order with small random finite
 * values, and so on for the other compressors; the header carries the task's
 * round and model version, the client's id and a sample count) and encodes it
 * with strata_payload_encode. The client then uploads it (POST
 * /v1/rounds/{r}/updates). No training, no model download.
 *
 * Modes:
 *  - closed (default): a client starts its upload as soon as its payload is
 *    built; with --prebuild, once every running client's payload for the
 *    round is built (or 10 s after the first one was), as in the open loop,
 *    so that the builder (the clients' compression, which would run on the
 *    clients' own machines) takes no CPU from the coordinator inside the
 *    round's upload window. An upload's latency is its acknowledged
 *    attempt's request start (the handle added to the multi) to the
 *    response.
 *  - open --rate R: each round's payloads are prebuilt: the round's schedule
 *    starts once every running client's payload for it is built (or 10 s
 *    after the first one was), and the k-th payload built is uploaded at
 *    k/R s after that (--arrivals even, the default) or at the k-th arrival
 *    of a Poisson process of rate R (--arrivals poisson), whatever the
 *    answers to earlier uploads. An upload's latency runs from its scheduled
 *    start to its acknowledgement, so time spent waiting to be sent counts
 *    (the loop's lag behind the schedule is reported as start_lag_p99_s).
 *
 * Failures: transport errors and 408/429/5xx are retried (Retry-After is
 * honoured up to 5 s), at most 3 attempts, each failed attempt counted as an
 * error. With --persist (for a coordinator that is killed and restarted during
 * the run) they are retried with capped exponential backoff and jitter until
 * --timeout and counted as "retried", not as errors; a 409 round_closed for
 * an upload of a round that closed meanwhile is counted as "late" and the
 * client goes on with the next round (registrations are never retried: start
 * killing after "clients registered" is printed). An answer with
 * "duplicate":true counts as a duplicate. SIGINT or SIGTERM ends the run early with a report: the
 * uploads not finished then are "abandoned", not errors.
 *
 * Measured: each upload's latency, each round's upload window (the first
 * upload start to the last acknowledgement of that round) and the uploads per
 * second over the union of the windows, latency p50/p99/p99.9/max, errors.
 * With --server-pid, the coordinator's CPU time (utime + stime of
 * /proc/PID/stat) from the first poll to the end of the run (task hand-out,
 * uploads and round closes) per acknowledged upload, and its peak RSS
 * (VmHWM of /proc/PID/status) at the end.
 *
 * Usage: bench_load --server URL [--clients N] [--rounds R] [--mode closed|open]
 *                   [--rate R] [--arrivals even|poisson] [--prebuild] [--persist]
 *                   [--server-pid PID] [--acks FILE] [--tokens FILE]
 *                   [--register-concurrency N] [--secret S] [--seed S]
 *                   [--timeout S] [--json]
 * Prints a per-round table and a summary; with --json the last line is one
 * JSON object. Exits 0 when every upload was acknowledged (or late, or
 * abandoned) without an error, 1 when there was an error, 2 on bad usage. */
#include "strata/checkpoint.h"
#include "strata/compress.h"
#include "strata/model.h"
#include "strata/parse.h"
#include "strata/payload.h"
#include "strata/task.h"
#include "strata/rng.h"
#include "strata/tensor.h"

#include <assert.h>
#include <curl/curl.h>
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#define MAX_RESPONSE ((size_t)1 << 28) /* the model download is the largest */
#define MAX_JSON ((size_t)1 << 20)
#define POLL_WAIT_S 30
#define UPLOAD_ATTEMPTS 3
#define SLOW_UPLOAD_S 5.0 /* such uploads are described on stderr (a few) */
#define BACKOFF_BASE_S 0.05
#define BACKOFF_CAP_S 1.0                /* --persist: the longest wait between attempts */
#define RETRY_AFTER_CAP_S 5.0            /* a Retry-After is honoured up to this */
#define OPEN_GRACE_S 10.0                /* open loop: the longest wait for a round's payloads */
#define MAX_HELD_BYTES ((size_t)4 << 30) /* built payloads not yet answered */
#define POLL_STARTS_PER_TICK 512         /* spreads the first connects */
#define FD_SLACK 128
#define EPOLL_BATCH 512
#define SHARD_CLIENTS 64
#define EV_BUILDER UINT64_MAX /* the epoll data of the builder's eventfd */
#define LOOP_MAX_WAIT_S 0.2

typedef enum { MODE_CLOSED, MODE_OPEN } load_mode;
typedef enum { ARRIVALS_EVEN, ARRIVALS_POISSON } arrivals;

typedef struct options {
    const char *server, *secret, *acks, *tokens;
    long clients, rounds, timeout_s, server_pid, reg_inflight;
    double rate;
    unsigned long long seed;
    load_mode mode;
    arrivals arr;
    int json, persist, prebuild;
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
    int done;     /* acknowledged with 200 */
    double sched; /* the latency's origin: see the modes above */
    double start; /* the first attempt's start (the round window's start) */
    double end;   /* the acknowledgement */
    size_t bytes;
} upload_rec;

typedef struct task {
    uint32_t round;
    uint64_t model_version;
    strata_budget *budgets; /* nlayers entries, owned */
} task;

typedef enum {
    C_NEW,         /* not registered */
    C_REGISTERING, /* transfer */
    C_IDLE,        /* registered; the upload phase has not started it */
    C_POLLING,     /* transfer */
    C_POLL_WAIT,   /* timer: poll again */
    C_BUILDING,    /* with the builder thread */
    C_SCHEDULED,   /* open loop: built, waiting for its round's schedule or slot */
    C_UPLOADING,   /* transfer */
    C_UPLOAD_WAIT, /* timer: upload again */
    C_DONE
} client_state;

typedef struct shard shard;

typedef struct client {
    uint32_t index;
    shard *sh; /* its multi handle (borrowed) */
    client_state st;
    uint64_t id;
    char token[80];
    CURL *h;
    struct curl_slist *hdr_get, *hdr_post;
    struct { /* the response body of the transfer in flight, capped */
        uint8_t *buf;
        size_t len, cap, max;
    } resp;
    long k;        /* index of the current round, 0 .. rounds - 1 */
    task t;        /* the current task */
    uint8_t *wire; /* the built payload (owned) */
    size_t len;    /* its size */
    int build_failed;
    strata_rng rng;   /* the builder thread's only */
    int attempt;      /* upload attempts of the current task */
    int poll_fails;   /* consecutive failed polls */
    double req_start; /* the transfer in flight started then */
    double sched;     /* open loop: the upload's scheduled start */
    double offset;    /* open loop: its slot's offset from the round's start */
    upload_rec *recs; /* rounds entries */
} client;

/* A pending timer of one client (each client has at most one). */
typedef struct timer {
    double at;
    uint32_t client;
} timer;

/* The open loop's schedule of one round. */
typedef struct round_plan {
    uint32_t round;
    size_t ready;               /* payloads built for it */
    double first_ready, origin; /* origin < 0: not started */
    double next_offset;         /* the next slot's offset from origin */
    uint32_t *pending;          /* clients built before origin */
    size_t npending, cap;
} round_plan;

typedef struct bench bench;

/* One multi handle and its connection pool, for SHARD_CLIENTS clients
 * (curl looks for an idle connection by walking its pool: small pools keep
 * that walk short). */
struct shard {
    bench *b;
    CURLM *multi;
    uint32_t index;
    double due; /* when curl wants socket_action(TIMEOUT); < 0: never */
};

/* The payload builder thread: jobs (client indices) in, built payloads out.
 * Everything here is under mu; a client in C_BUILDING is the builder's. */
typedef struct builder {
    pthread_t th;
    int started, stop;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    uint32_t *jobs, *done; /* a ring of cap jobs; dn built, emptied by the main thread */
    size_t cap, jhead, jn, dn;
    size_t held;      /* bytes of built payloads the main thread holds */
    int efd;          /* eventfd: written after each build */
    double busy_s;    /* CPU time spent building */
    uint64_t *bitmap; /* the thread's scratch for distinct index draws */
    size_t bitmap_words;
} builder;

struct bench {
    options o;
    char base[1024], url[1200];
    layer_info *layers;
    size_t nlayers;
    client *clients;
    shard *shards;
    size_t nshards;
    int ep;
    struct curl_slist *hdr_reg;
    timer *timers; /* a binary min-heap of ntimers entries (capacity: clients) */
    size_t ntimers;
    round_plan *plans;
    size_t nplans, capplans;
    builder bld;
    uint32_t *scratch; /* clients entries */
    strata_rng jitter;
    FILE *acks, *tokens;
    long registered, reg_next, reg_inflight, active, poll_next;
    int reg_failed;
    double deadline; /* CLOCK_MONOTONIC seconds after which the run stops */
    long err_upload_status, err_transport, err_poll, err_register, err_timeout, err_answer;
    atomic_long err_build;
    long duplicates, late, retried, reconnects, slow, connects;
    atomic_int logged;
    int interrupted;
};

/* Set by SIGINT/SIGTERM (the one global: a signal handler has no context). */
static volatile sig_atomic_t g_stop;

static const char SOCKET_ADDED = 1; /* curl_multi_assign marker: in the epoll set */

/* ---- small helpers -------------------------------------------------------- */

/* The calling thread's CPU time in seconds. */
static double thread_cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Logs the first few errors in full; later ones are only counted.
 * Thread-safe. */
static void log_error(bench *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void log_error(bench *b, const char *fmt, ...)
{
    if (atomic_fetch_add(&b->logged, 1) >= 10)
        return;
    va_list ap;
    va_start(ap, fmt);
    fputs("bench_load: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

static void on_signal(int sig)
{
    (void)sig;
    g_stop = 1;
}

static int transient_status(long st)
{
    return st == 408 || st == 429 || st >= 500;
}

/* The wait before attempt n + 1 after n failed ones: 0.1 s * n as before, or
 * with --persist a capped doubling with jitter; a Retry-After (curl's
 * reading of the last answer) lengthens it, up to RETRY_AFTER_CAP_S. */
static double retry_delay(bench *b, const client *cl, int n)
{
    double d = 0.1 * n;
    if (b->o.persist) {
        d = BACKOFF_BASE_S * pow(2.0, n < 20 ? n - 1 : 19);
        if (d > BACKOFF_CAP_S)
            d = BACKOFF_CAP_S;
        d *= 0.5 + 0.5 * strata_rng_uniform(&b->jitter);
    }
    curl_off_t ra = 0;
    if (curl_easy_getinfo(cl->h, CURLINFO_RETRY_AFTER, &ra) == CURLE_OK && (double)ra > d)
        d = (double)ra < RETRY_AFTER_CAP_S ? (double)ra : RETRY_AFTER_CAP_S;
    return d;
}

static const char *body_text(const client *cl)
{
    return cl->resp.buf != NULL ? (const char *)cl->resp.buf : "";
}

static size_t on_body(char *ptr, size_t size, size_t nmemb, void *ud)
{
    client *cl = ud;
    size_t n = size * nmemb;
    if (n > cl->resp.max - cl->resp.len)
        return 0; /* aborts the transfer */
    if (cl->resp.len + n + 1 > cl->resp.cap) {
        size_t cap = cl->resp.cap ? cl->resp.cap : 1024;
        while (cap < cl->resp.len + n + 1)
            cap *= 2;
        uint8_t *nb = realloc(cl->resp.buf, cap);
        if (nb == NULL)
            return 0;
        cl->resp.buf = nb;
        cl->resp.cap = cap;
    }
    memcpy(cl->resp.buf + cl->resp.len, ptr, n);
    cl->resp.len += n;
    cl->resp.buf[cl->resp.len] = '\0';
    return n;
}

/* ---- the coordinator's process ------------------------------------------- */

/* utime + stime of process pid in clock ticks. */
static int proc_cpu_ticks(long pid, unsigned long long *ticks)
{
    char path[64], buf[2048];
    snprintf(path, sizeof(path), "/proc/%ld/stat", pid);
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return -1;
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    const char *p = strrchr(buf, ')'); /* the name may hold spaces and parentheses */
    unsigned long long ut, st;
    if (p == NULL ||
        sscanf(p + 1, " %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut, &st) != 2)
        return -1;
    *ticks = ut + st;
    return 0;
}

/* VmHWM of process pid in bytes. */
static int proc_peak_rss(long pid, long long *bytes)
{
    char path[64], line[256];
    snprintf(path, sizeof(path), "/proc/%ld/status", pid);
    FILE *f = fopen(path, "r");
    int rc = -1;
    if (f == NULL)
        return -1;
    long long kb;
    while (rc < 0 && fgets(line, sizeof(line), f) != NULL)
        if (sscanf(line, "VmHWM: %lld kB", &kb) == 1) {
            *bytes = kb * 1024;
            rc = 0;
        }
    fclose(f);
    return rc;
}

/* ---- synthetic updates (the builder thread) ------------------------------- */

static int parse_task(const bench *b, const client *cl, task *t, char *why, size_t wlen)
{
    memset(t, 0, sizeof(*t));
    strata_task dt;
    strata_task_limits lim = {.max_layers = b->nlayers};
    strata_diag d;
    int rc = strata_task_decode((const char *)cl->resp.buf, cl->resp.len, &lim, &dt, &d);
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
/* A small random value, uniform in (-0.02, 0.02): as incompressible as an
 * update's float32 values, and a third of the cost of a normal draw (the
 * builder's time is the bench's own, taken from the coordinator's cores). */
static float synth_value(strata_rng *r, strata_values_format vf)
{
    float v = (float)((strata_rng_uniform(r) - 0.5) * 0.04);
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

/* k distinct random indices below n, ascending, into idx. A bitmap of n bits
 * in the builder's scratch (all zero between calls) marks the draws (the
 * ones left out when k > n / 2); one pass over its words lists them and
 * clears it. */
static int synth_indices(builder *q, strata_rng *r, uint64_t n, uint64_t k, uint32_t *idx)
{
    size_t words = (size_t)((n + 63) / 64);
    if (words > q->bitmap_words) {
        uint64_t *nb = realloc(q->bitmap, words * sizeof(uint64_t));
        if (nb == NULL)
            return -1;
        memset(nb + q->bitmap_words, 0, (words - q->bitmap_words) * sizeof(uint64_t));
        q->bitmap = nb;
        q->bitmap_words = words;
    }
    int invert = k > n / 2;
    uint64_t want = invert ? n - k : k;
    for (uint64_t got = 0; got < want;) {
        uint64_t i = strata_rng_below(r, n);
        uint64_t bit = (uint64_t)1 << (i & 63);
        if (!(q->bitmap[i >> 6] & bit)) {
            q->bitmap[i >> 6] |= bit;
            got++;
        }
    }
    uint64_t m = 0;
    for (size_t w = 0; w < words; w++) {
        uint64_t x = invert ? ~q->bitmap[w] : q->bitmap[w];
        if (w == words - 1 && n % 64)
            x &= ((uint64_t)1 << (n % 64)) - 1;
        q->bitmap[w] = 0;
        for (; x != 0 && m < k; x &= x - 1)
            idx[m++] = (uint32_t)((uint64_t)w * 64 + (uint64_t)__builtin_ctzll(x));
    }
    return m == k ? 0 : -1;
}

/* QSGD levels and SIGN bits: dense layers without values. */
static int synth_levels(strata_rng *r, uint64_t n, const strata_budget *bb, strata_clayer *out)
{
    out->values_format = STRATA_VALUES_FP32;
    if (bb->comp == STRATA_COMP_QSGD) {
        out->levels = bb->levels;
        out->scale = 1.0f + (float)strata_rng_uniform(r);
        out->qlevels = malloc((size_t)n ? (size_t)n : 1);
        if (out->qlevels == NULL)
            return -1;
        for (uint64_t i = 0; i < n; i++)
            out->qlevels[i] = (int8_t)((int64_t)strata_rng_below(r, 2 * (uint64_t)bb->levels + 1) -
                                       (int64_t)bb->levels);
        return 0;
    }
    out->scale = 0.01f;
    size_t nb = (size_t)((n + 7) / 8);
    out->signbits = malloc(nb ? nb : 1);
    if (out->signbits == NULL)
        return -1;
    for (size_t i = 0; i < nb; i++)
        out->signbits[i] = (uint8_t)strata_rng_u64(r);
    if (n % 8)
        out->signbits[nb - 1] &= (uint8_t)((1u << (n % 8)) - 1);
    return 0;
}

/* Fills one compressed layer for budget bb. Returns 0 or -1 (no memory or an
 * impossible budget), with why set. */
static int synth_layer(builder *q, strata_rng *r, const layer_info *li, size_t index,
                       const strata_budget *bb, strata_clayer *out, char *why, size_t wlen)
{
    strata_values_format vf = bb->values;
    memset(out, 0, sizeof(*out));
    out->layer_index = (uint32_t)index;
    out->numel = li->numel;
    out->comp = bb->comp;
    out->values_format = vf;
    uint64_t n = li->numel;
    uint32_t rows, cols, rank;
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
        out->indices = malloc((size_t)out->count * sizeof(uint32_t) + 1);
        if (out->indices != NULL && synth_indices(q, r, n, out->count, out->indices) < 0) {
            snprintf(why, wlen, "layer %zu: cannot draw %llu indices", index,
                     (unsigned long long)out->count);
            return -1;
        }
        break;
    case STRATA_COMP_QSGD:
    case STRATA_COMP_SIGN:
        if (synth_levels(r, n, bb, out) < 0)
            goto oom;
        return 0;
    case STRATA_COMP_POWERSGD:
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

/* Builds and encodes the update for cl's task into cl->wire. Builder thread. */
static int build_update(bench *b, client *cl, char *why, size_t wlen)
{
    strata_rng *r = &cl->rng;
    const task *t = &cl->t;
    cl->wire = NULL;
    cl->len = 0;
    strata_clayer *layers = calloc(b->nlayers ? b->nlayers : 1, sizeof(*layers));
    char *meta = NULL;
    int rc = -1;
    if (layers == NULL) {
        snprintf(why, wlen, "out of memory");
        return -1;
    }
    for (size_t i = 0; i < b->nlayers; i++)
        if (synth_layer(&b->bld, r, &b->layers[i], i, &t->budgets[i], &layers[i], why, wlen) < 0)
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
    int erc = strata_payload_encode(&p, 1, &cl->wire, &cl->len, &d);
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

static void *builder_main(void *arg)
{
    bench *b = arg;
    builder *q = &b->bld;
    pthread_mutex_lock(&q->mu);
    for (;;) {
        while (!q->stop && (q->jn == 0 || q->held > MAX_HELD_BYTES))
            pthread_cond_wait(&q->cv, &q->mu);
        if (q->stop)
            break;
        client *cl = &b->clients[q->jobs[q->jhead]];
        q->jhead = (q->jhead + 1) % q->cap;
        q->jn--;
        pthread_mutex_unlock(&q->mu);
        char why[512];
        double t0 = thread_cpu_s();
        cl->build_failed = build_update(b, cl, why, sizeof(why)) < 0;
        if (cl->build_failed)
            log_error(b, "client %llu: round %u: %s", (unsigned long long)cl->id, cl->t.round, why);
        pthread_mutex_lock(&q->mu);
        q->busy_s += thread_cpu_s() - t0;
        q->held += cl->len;
        q->done[q->dn++] = cl->index;
        pthread_mutex_unlock(&q->mu);
        uint64_t one = 1;
        if (write(q->efd, &one, sizeof(one)) < 0) {
            /* the counter cannot overflow here; the main loop polls anyway */
        }
        pthread_mutex_lock(&q->mu);
    }
    pthread_mutex_unlock(&q->mu);
    return NULL;
}

static int builder_start(bench *b)
{
    builder *q = &b->bld;
    if (pthread_create(&q->th, NULL, builder_main, b) != 0)
        return -1;
    q->started = 1;
    return 0;
}

static void builder_stop(bench *b)
{
    builder *q = &b->bld;
    if (q->started) {
        pthread_mutex_lock(&q->mu);
        q->stop = 1;
        pthread_cond_broadcast(&q->cv);
        pthread_mutex_unlock(&q->mu);
        pthread_join(q->th, NULL);
        q->started = 0;
    }
    free(q->jobs);
    free(q->done);
    free(q->bitmap);
}

static void builder_push(bench *b, client *cl)
{
    builder *q = &b->bld;
    pthread_mutex_lock(&q->mu);
    /* A client has at most one job: the ring of cap = clients entries has room. */
    q->jobs[(q->jhead + q->jn) % q->cap] = cl->index;
    q->jn++;
    pthread_cond_signal(&q->cv);
    pthread_mutex_unlock(&q->mu);
    cl->st = C_BUILDING;
}

/* Frees cl's payload and tells the builder the memory is back. */
static void release_wire(bench *b, client *cl)
{
    if (cl->wire == NULL)
        return;
    builder *q = &b->bld;
    pthread_mutex_lock(&q->mu);
    q->held -= cl->len;
    pthread_cond_signal(&q->cv);
    pthread_mutex_unlock(&q->mu);
    free(cl->wire);
    cl->wire = NULL;
    cl->len = 0;
}

/* ---- timers: a binary min-heap, one entry per waiting client -------------- */

static void timer_push(bench *b, client *cl, double at, client_state st)
{
    assert(b->ntimers < (size_t)b->o.clients);
    cl->st = st;
    size_t i = b->ntimers++;
    while (i > 0 && b->timers[(i - 1) / 2].at > at) {
        b->timers[i] = b->timers[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    b->timers[i] = (timer){at, cl->index};
}

static uint32_t timer_pop(bench *b)
{
    uint32_t top = b->timers[0].client;
    timer last = b->timers[--b->ntimers];
    size_t i = 0, n = b->ntimers;
    for (size_t c = 1; c < n; c = 2 * i + 1) {
        if (c + 1 < n && b->timers[c + 1].at < b->timers[c].at)
            c++;
        if (last.at <= b->timers[c].at)
            break;
        b->timers[i] = b->timers[c];
        i = c;
    }
    if (n > 0)
        b->timers[i] = last;
    return top;
}

/* ---- requests --------------------------------------------------------------- */

/* Starts one request on cl's handle: a GET when body is NULL, else a POST of
 * len bytes (borrowed until the transfer ends, copied for a registration). */
static int start_request(client *cl, const char *url, struct curl_slist *hdr, const void *body,
                         size_t len, long timeout_s, client_state st)
{
    CURL *h = cl->h;
    cl->resp.len = 0;
    if (cl->resp.buf != NULL)
        cl->resp.buf[0] = '\0';
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdr);
    curl_easy_setopt(h, CURLOPT_TIMEOUT, timeout_s);
    if (body == NULL) {
        curl_easy_setopt(h, CURLOPT_HTTPGET, 1L);
    } else {
        curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)len);
        curl_easy_setopt(h, st == C_REGISTERING ? CURLOPT_COPYPOSTFIELDS : CURLOPT_POSTFIELDS,
                         body);
    }
    cl->st = st;
    cl->req_start = now_s();
    return curl_multi_add_handle(cl->sh->multi, h) == CURLM_OK ? 0 : -1;
}

/* The client stops for good (its last round done, or it gave up). */
static void finish_client(bench *b, client *cl)
{
    release_wire(b, cl);
    free(cl->t.budgets);
    cl->t.budgets = NULL;
    cl->st = C_DONE;
    b->active--;
}

static void start_poll(bench *b, client *cl)
{
    snprintf(b->url, sizeof(b->url), "%s/v1/tasks/next?wait=%d", b->base, POLL_WAIT_S);
    if (start_request(cl, b->url, cl->hdr_get, NULL, 0, POLL_WAIT_S + 30, C_POLLING) < 0) {
        b->err_transport++;
        log_error(b, "client %llu: cannot start a poll", (unsigned long long)cl->id);
        finish_client(b, cl);
    }
}

static void start_upload(bench *b, client *cl)
{
    upload_rec *rec = &cl->recs[cl->k];
    double now = now_s();
    if (cl->attempt++ == 0) {
        rec->round = cl->t.round;
        rec->bytes = cl->len;
        rec->start = now;
    }
    /* Closed loop: the acknowledged attempt's start; open: the schedule. */
    rec->sched = b->o.mode == MODE_OPEN ? cl->sched : now;
    snprintf(b->url, sizeof(b->url), "%s/v1/rounds/%u/updates", b->base, cl->t.round);
    if (start_request(cl, b->url, cl->hdr_post, cl->wire, cl->len, 0, C_UPLOADING) < 0) {
        b->err_transport++;
        log_error(b, "client %llu: cannot start an upload", (unsigned long long)cl->id);
        finish_client(b, cl);
    }
}

static void start_register(bench *b, client *cl)
{
    json_t *req = json_object();
    char name[32];
    snprintf(name, sizeof(name), "load-%u", cl->index);
    json_object_set_new(req, "name", json_string(name));
    if (b->o.secret != NULL)
        json_object_set_new(req, "enrolment_secret", json_string(b->o.secret));
    char *text = json_dumps(req, JSON_COMPACT);
    json_decref(req);
    snprintf(b->url, sizeof(b->url), "%s/v1/clients", b->base);
    if (text == NULL ||
        start_request(cl, b->url, b->hdr_reg, text, strlen(text), 30, C_REGISTERING) < 0) {
        fprintf(stderr, "bench_load: cannot start registration %u\n", cl->index);
        b->err_register++;
        b->reg_failed = 1;
    } else {
        b->reg_inflight++;
    }
    free(text);
}

/* ---- the open loop's schedule ----------------------------------------------- */

static void schedule_upload(bench *b, client *cl, double at)
{
    cl->sched = at;
    timer_push(b, cl, at, C_SCHEDULED);
}

static round_plan *plan_for(bench *b, uint32_t round)
{
    for (size_t i = b->nplans; i-- > 0;)
        if (b->plans[i].round == round)
            return &b->plans[i];
    if (b->nplans == b->capplans) {
        size_t cap = b->capplans ? 2 * b->capplans : 16;
        round_plan *np = realloc(b->plans, cap * sizeof(*np));
        if (np == NULL)
            return NULL;
        b->plans = np;
        b->capplans = cap;
    }
    round_plan *p = &b->plans[b->nplans++];
    *p = (round_plan){.round = round, .origin = -1.0};
    return p;
}

static void plan_start(bench *b, round_plan *p, double now)
{
    p->origin = now;
    for (size_t i = 0; i < p->npending; i++) {
        client *cl = &b->clients[p->pending[i]];
        schedule_upload(b, cl, p->origin + cl->offset);
    }
    free(p->pending);
    p->pending = NULL;
    p->npending = p->cap = 0;
}

/* cl's payload is built: it takes the next slot of its round. */
static void plan_ready(bench *b, client *cl)
{
    double now = now_s();
    round_plan *p = plan_for(b, cl->t.round);
    if (p == NULL) {
        schedule_upload(b, cl, now); /* no memory for a plan: send now */
        return;
    }
    if (p->ready++ == 0)
        p->first_ready = now;
    cl->offset = p->next_offset;
    if (b->o.mode == MODE_OPEN) /* closed loop (--prebuild): every slot at the origin */
        p->next_offset += b->o.arr == ARRIVALS_POISSON
                              ? -log(1.0 - strata_rng_uniform(&b->jitter)) / b->o.rate
                              : 1.0 / b->o.rate;
    cl->st = C_SCHEDULED;
    if (p->origin >= 0) {
        schedule_upload(b, cl, p->origin + cl->offset);
        return;
    }
    if (p->npending == p->cap) {
        size_t cap = p->cap ? 2 * p->cap : 64;
        uint32_t *np = realloc(p->pending, cap * sizeof(uint32_t));
        if (np == NULL) {
            schedule_upload(b, cl, now);
            return;
        }
        p->pending = np;
        p->cap = cap;
    }
    p->pending[p->npending++] = cl->index;
}

/* Starts the schedule of each round whose payloads are all built, or whose
 * first payload was built OPEN_GRACE_S ago. */
static void check_plans(bench *b)
{
    double now = now_s();
    for (size_t i = 0; i < b->nplans; i++) {
        round_plan *p = &b->plans[i];
        if (p->origin < 0 && ((long)p->ready >= b->active || now >= p->first_ready + OPEN_GRACE_S))
            plan_start(b, p, now);
    }
}

/* ---- answers ---------------------------------------------------------------- */

static int client_headers(client *cl)
{
    char auth[128];
    snprintf(auth, sizeof(auth), "Authorization: Bearer %s", cl->token);
    cl->hdr_get = curl_slist_append(NULL, auth);
    cl->hdr_post = curl_slist_append(NULL, auth);
    if (cl->hdr_post != NULL)
        cl->hdr_post = curl_slist_append(cl->hdr_post, "Content-Type: application/octet-stream");
    if (cl->hdr_post != NULL)
        cl->hdr_post = curl_slist_append(cl->hdr_post, "Expect:");
    return cl->hdr_get != NULL && cl->hdr_post != NULL ? 0 : -1;
}

static void on_registered(bench *b, client *cl, CURLcode cc, long status)
{
    json_t *j = NULL;
    b->reg_inflight--;
    if (cc != CURLE_OK || status != 201) {
        fprintf(stderr, "bench_load: registering client %u: %s (HTTP %ld) %s\n", cl->index,
                curl_easy_strerror(cc), status, body_text(cl));
        goto bad;
    }
    j = json_loadb((const char *)cl->resp.buf, cl->resp.len, 0, NULL);
    json_t *cid = json_object_get(j, "client_id");
    const char *tok = json_string_value(json_object_get(j, "token"));
    if (!json_is_integer(cid) || tok == NULL || strlen(tok) >= sizeof(cl->token)) {
        fprintf(stderr, "bench_load: registration answer: %s\n", body_text(cl));
        goto bad;
    }
    cl->id = (uint64_t)json_integer_value(cid);
    snprintf(cl->token, sizeof(cl->token), "%s", tok);
    json_decref(j);
    if (client_headers(cl) < 0)
        goto bad;
    strata_rng_seed(&cl->rng, b->o.seed, cl->id);
    if (b->tokens != NULL)
        fprintf(b->tokens, "%llu %s\n", (unsigned long long)cl->id, cl->token);
    cl->st = C_IDLE;
    b->registered++;
    return;
bad:
    json_decref(j);
    b->err_register++;
    b->reg_failed = 1;
    cl->st = C_NEW;
}

static void on_polled(bench *b, client *cl, CURLcode cc, long status)
{
    char why[512];
    double now = now_s();
    if (cc == CURLE_OK && (status == 200 || status == 204))
        cl->poll_fails = 0;
    if (cc == CURLE_OK && status == 200) {
        if (parse_task(b, cl, &cl->t, why, sizeof(why)) < 0) {
            b->err_poll++;
            log_error(b, "client %llu: %s", (unsigned long long)cl->id, why);
            finish_client(b, cl);
            return;
        }
        cl->attempt = 0;
        builder_push(b, cl);
        return;
    }
    if (cc == CURLE_OK && status == 204) {
        /* The long poll ended without a task: ask again (not in a tight loop
         * when the server answered at once). */
        double wait = 0.0;
        curl_off_t ra = 0;
        if (now - cl->req_start < 0.5) {
            wait = 0.1;
            if (curl_easy_getinfo(cl->h, CURLINFO_RETRY_AFTER, &ra) == CURLE_OK && ra > 0)
                wait = ra < 1 ? (double)ra : 1.0;
        }
        timer_push(b, cl, now + wait, C_POLL_WAIT);
        return;
    }
    int transient = cc != CURLE_OK || transient_status(status);
    cl->poll_fails++;
    if (b->o.persist && transient) {
        b->retried++;
        timer_push(b, cl, now + retry_delay(b, cl, cl->poll_fails), C_POLL_WAIT);
        return;
    }
    if (cc != CURLE_OK) {
        b->err_transport++;
        log_error(b, "client %llu: poll: %s", (unsigned long long)cl->id, curl_easy_strerror(cc));
    } else {
        b->err_poll++;
        log_error(b, "client %llu: poll: HTTP %ld %s", (unsigned long long)cl->id, status,
                  body_text(cl));
    }
    if (!transient || (cc != CURLE_OK && cl->poll_fails >= UPLOAD_ATTEMPTS))
        finish_client(b, cl);
    else
        timer_push(b, cl, now + (cc != CURLE_OK ? 0.2 * cl->poll_fails : 0.5), C_POLL_WAIT);
}

/* The client's upload is over (acknowledged or late): the next round. */
static void next_round(bench *b, client *cl)
{
    release_wire(b, cl);
    free(cl->t.budgets);
    cl->t.budgets = NULL;
    if (++cl->k >= b->o.rounds)
        finish_client(b, cl);
    else
        start_poll(b, cl);
}

static void acknowledge(bench *b, client *cl)
{
    upload_rec *rec = &cl->recs[cl->k];
    json_t *j = cl->resp.buf ? json_loadb((const char *)cl->resp.buf, cl->resp.len, 0, NULL) : NULL;
    const char *receipt = json_string_value(json_object_get(j, "receipt"));
    json_t *dup = json_object_get(j, "duplicate");
    if (receipt == NULL || !json_is_boolean(dup)) {
        b->err_answer++;
        log_error(b, "client %llu: round %u: upload answered 200 without a receipt: %s",
                  (unsigned long long)cl->id, rec->round, body_text(cl));
        json_decref(j);
        finish_client(b, cl);
        return;
    }
    rec->done = 1;
    rec->end = now_s();
    if (json_is_true(dup))
        b->duplicates++;
    if (b->acks != NULL)
        fprintf(b->acks, "%u %llu %s %d\n", rec->round, (unsigned long long)cl->id, receipt,
                json_is_true(dup) ? 1 : 0);
    json_decref(j);
    next_round(b, cl);
}

/* Counts an upload attempt on a new connection, and describes a slow one. */
static void note_attempt(bench *b, client *cl, CURLcode cc, long status)
{
    long connects = 0;
    if (curl_easy_getinfo(cl->h, CURLINFO_NUM_CONNECTS, &connects) == CURLE_OK && connects > 0)
        b->reconnects++;
    double took = now_s() - cl->req_start;
    if (took <= SLOW_UPLOAD_S || ++b->slow > 5)
        return;
    curl_off_t sent = 0, first = 0;
    curl_easy_getinfo(cl->h, CURLINFO_PRETRANSFER_TIME_T, &sent);
    curl_easy_getinfo(cl->h, CURLINFO_STARTTRANSFER_TIME_T, &first);
    fprintf(stderr,
            "bench_load: client %llu: round %u: upload took %.1f s (%s, HTTP %ld, %ld new "
            "connection(s), request sent at %.3f s, first response byte at %.3f s)\n",
            (unsigned long long)cl->id, cl->t.round, took, curl_easy_strerror(cc), status, connects,
            (double)sent * 1e-6, (double)first * 1e-6);
}

static void on_uploaded(bench *b, client *cl, CURLcode cc, long status)
{
    note_attempt(b, cl, cc, status);
    if (cc == CURLE_OK && status == 200) {
        acknowledge(b, cl);
        return;
    }
    if (cc == CURLE_OK && status == 409 && b->o.persist &&
        strstr(body_text(cl), "\"round_closed\"") != NULL) {
        b->late++;
        next_round(b, cl);
        return;
    }
    int transient = cc != CURLE_OK || transient_status(status);
    double now = now_s();
    if (b->o.persist && transient) {
        b->retried++;
        timer_push(b, cl, now + retry_delay(b, cl, cl->attempt), C_UPLOAD_WAIT);
        return;
    }
    if (cc != CURLE_OK) {
        b->err_transport++;
        log_error(b, "client %llu: round %u: upload: %s", (unsigned long long)cl->id, cl->t.round,
                  curl_easy_strerror(cc));
    } else {
        b->err_upload_status++;
        log_error(b, "client %llu: round %u: upload: HTTP %ld %s", (unsigned long long)cl->id,
                  cl->t.round, status, body_text(cl));
    }
    if (!transient || cl->attempt >= UPLOAD_ATTEMPTS)
        finish_client(b, cl);
    else
        timer_push(b, cl, now + retry_delay(b, cl, cl->attempt), C_UPLOAD_WAIT);
}

/* ---- the event loop ----------------------------------------------------------- */

static int on_socket(CURL *e, curl_socket_t s, int what, void *userp, void *socketp)
{
    shard *sh = userp;
    int ep = sh->b->ep;
    (void)e;
    if (what == CURL_POLL_REMOVE) {
        epoll_ctl(ep, EPOLL_CTL_DEL, s, NULL);
        return 0;
    }
    struct epoll_event ev = {.events = (what & CURL_POLL_IN ? EPOLLIN : 0u) |
                                       (what & CURL_POLL_OUT ? EPOLLOUT : 0u),
                             .data.u64 = (uint64_t)sh->index << 32 | (uint32_t)s};
    int op = socketp == NULL ? EPOLL_CTL_ADD : EPOLL_CTL_MOD;
    if (epoll_ctl(ep, op, s, &ev) < 0 && (errno == EEXIST || errno == ENOENT))
        epoll_ctl(ep, op == EPOLL_CTL_ADD ? EPOLL_CTL_MOD : EPOLL_CTL_ADD, s, &ev);
    if (socketp == NULL)
        curl_multi_assign(sh->multi, s, (void *)&SOCKET_ADDED);
    return 0;
}

static int on_timer(CURLM *m, long ms, void *userp)
{
    shard *sh = userp;
    (void)m;
    sh->due = ms < 0 ? -1.0 : now_s() + 1e-3 * (double)ms;
    return 0;
}

/* Runs the shard's due curl timers; then reads the next due time back (curl
 * does not call on_timer when it is unchanged). */
static void shard_timeout(shard *sh)
{
    int running;
    long ms = -1;
    curl_multi_socket_action(sh->multi, CURL_SOCKET_TIMEOUT, 0, &running);
    if (curl_multi_timeout(sh->multi, &ms) == CURLM_OK)
        sh->due = ms < 0 ? -1.0 : now_s() + 1e-3 * (double)ms;
}

static void curl_timers(bench *b)
{
    double now = now_s();
    for (size_t i = 0; i < b->nshards; i++)
        if (b->shards[i].due >= 0 && b->shards[i].due <= now)
            shard_timeout(&b->shards[i]);
}

static int wait_ms(bench *b)
{
    double now = now_s(), due = now + LOOP_MAX_WAIT_S;
    for (size_t i = 0; i < b->nshards; i++)
        if (b->shards[i].due >= 0 && b->shards[i].due < due)
            due = b->shards[i].due;
    if (b->ntimers > 0 && b->timers[0].at < due)
        due = b->timers[0].at;
    return due <= now ? 0 : (int)ceil((due - now) * 1e3);
}

/* One finished transfer: its handle leaves the multi, the answer goes to
 * the client's state. */
static void transfer_done(bench *b, shard *sh, CURL *h, CURLcode cc)
{
    char *p = NULL;
    long status = 0, opened = 0;
    curl_easy_getinfo(h, CURLINFO_PRIVATE, &p);
    if (cc == CURLE_OK)
        curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
    if (curl_easy_getinfo(h, CURLINFO_NUM_CONNECTS, &opened) == CURLE_OK)
        b->connects += opened;
    curl_multi_remove_handle(sh->multi, h);
    client *cl = (client *)(void *)p;
    if (cl->st == C_REGISTERING)
        on_registered(b, cl, cc, status);
    else if (cl->st == C_POLLING)
        on_polled(b, cl, cc, status);
    else if (cl->st == C_UPLOADING)
        on_uploaded(b, cl, cc, status);
}

/* The shard's finished transfers, all read before any handle is removed
 * (curl_multi_remove_handle walks the messages still queued). */
static void drain_shard(bench *b, shard *sh)
{
    struct {
        CURL *h;
        CURLcode cc;
    } done[SHARD_CLIENTS];
    size_t n = 0;
    CURLMsg *m;
    int left;
    while (n < SHARD_CLIENTS && (m = curl_multi_info_read(sh->multi, &left)) != NULL)
        if (m->msg == CURLMSG_DONE) {
            done[n].h = m->easy_handle;
            done[n++].cc = m->data.result;
        }
    for (size_t i = 0; i < n; i++)
        transfer_done(b, sh, done[i].h, done[i].cc);
}

static void take_built(bench *b)
{
    builder *q = &b->bld;
    pthread_mutex_lock(&q->mu);
    size_t n = q->dn;
    memcpy(b->scratch, q->done, n * sizeof(uint32_t));
    q->dn = 0;
    pthread_mutex_unlock(&q->mu);
    for (size_t i = 0; i < n; i++) {
        client *cl = &b->clients[b->scratch[i]];
        if (cl->build_failed) {
            atomic_fetch_add(&b->err_build, 1);
            finish_client(b, cl);
        } else if (b->o.mode == MODE_OPEN || b->o.prebuild) {
            plan_ready(b, cl);
        } else {
            start_upload(b, cl);
        }
    }
}

static void fire_timers(bench *b)
{
    double now = now_s();
    while (b->ntimers > 0 && b->timers[0].at <= now) {
        client *cl = &b->clients[timer_pop(b)];
        if (cl->st == C_POLL_WAIT)
            start_poll(b, cl);
        else if (cl->st == C_SCHEDULED || cl->st == C_UPLOAD_WAIT)
            start_upload(b, cl);
    }
}

static void socket_event(bench *b, const struct epoll_event *ev)
{
    uint64_t v;
    if (ev->data.u64 == EV_BUILDER) {
        if (read(b->bld.efd, &v, sizeof(v)) < 0) {
            /* EAGAIN: an earlier turn drained it */
        }
        return;
    }
    shard *sh = &b->shards[ev->data.u64 >> 32];
    int running;
    int mask = (ev->events & EPOLLIN ? CURL_CSELECT_IN : 0) |
               (ev->events & EPOLLOUT ? CURL_CSELECT_OUT : 0) |
               (ev->events & (EPOLLERR | EPOLLHUP) ? CURL_CSELECT_ERR : 0);
    curl_multi_socket_action(sh->multi, (curl_socket_t)(uint32_t)ev->data.u64, mask, &running);
}

/* One turn: wait for sockets, the builder or the next timer, then act. */
static void loop_once(bench *b)
{
    struct epoll_event ev[EPOLL_BATCH];
    curl_timers(b);
    int n = epoll_wait(b->ep, ev, EPOLL_BATCH, wait_ms(b));
    for (int i = 0; i < n; i++)
        socket_event(b, &ev[i]);
    curl_timers(b);
    for (size_t i = 0; i < b->nshards; i++)
        drain_shard(b, &b->shards[i]);
    take_built(b);
    fire_timers(b);
    if (b->o.mode == MODE_OPEN || b->o.prebuild)
        check_plans(b);
}

/* ---- the phases ------------------------------------------------------------- */

static int run_registration(bench *b)
{
    while (b->registered < b->o.clients) {
        if (b->reg_failed)
            return -1;
        if (g_stop || now_s() >= b->deadline) {
            fprintf(stderr, "bench_load: %s during registration (%ld of %ld registered)\n",
                    g_stop ? "stopped" : "time limit", b->registered, b->o.clients);
            return -1;
        }
        while (b->reg_inflight < b->o.reg_inflight && b->reg_next < b->o.clients && !b->reg_failed)
            start_register(b, &b->clients[b->reg_next++]);
        loop_once(b);
    }
    return 0;
}

static const char *state_name(client_state st)
{
    static const char *const names[] = {"unregistered",   "registering", "idle",      "polling",
                                        "poll backoff",   "building",    "scheduled", "uploading",
                                        "upload backoff", "done"};
    return names[st];
}

/* The time limit: every client still running counts as an error. */
static void time_out(bench *b)
{
    for (long i = 0; i < b->o.clients; i++) {
        client *cl = &b->clients[i];
        if (cl->st == C_DONE)
            continue;
        b->err_timeout++;
        log_error(b, "client %llu: round index %ld not finished before the time limit (%s)",
                  (unsigned long long)cl->id, cl->k, state_name(cl->st));
    }
}

static void run_uploads(bench *b)
{
    b->active = b->o.clients;
    while (b->active > 0) {
        if (g_stop) {
            b->interrupted = 1;
            break;
        }
        if (now_s() >= b->deadline) {
            time_out(b);
            break;
        }
        for (int n = 0; n < POLL_STARTS_PER_TICK && b->poll_next < b->o.clients; n++)
            start_poll(b, &b->clients[b->poll_next++]);
        loop_once(b);
    }
}

static void sleep_s(double s)
{
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

/* GETs the current global model (version 0 at the start of a run) on a
 * handle of its own into tmp's response buffer (at most MAX_RESPONSE
 * bytes); with --persist, transient failures are retried until --timeout. */
static int fetch_model(bench *b, client *tmp)
{
    CURL *h = curl_easy_init();
    int rc = -1;
    if (h == NULL)
        return -1;
    snprintf(b->url, sizeof(b->url), "%s/v1/models/0", b->base);
    tmp->resp.max = MAX_RESPONSE;
    tmp->h = h; /* for retry_delay's Retry-After */
    for (int attempt = 1;; attempt++) {
        long status = 0;
        tmp->resp.len = 0;
        curl_easy_setopt(h, CURLOPT_URL, b->url);
        curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
        curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT, 10L);
        curl_easy_setopt(h, CURLOPT_TIMEOUT, 120L);
        curl_easy_setopt(h, CURLOPT_HTTPHEADER, b->clients[0].hdr_get);
        curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
        curl_easy_setopt(h, CURLOPT_WRITEDATA, tmp);
        CURLcode cc = curl_easy_perform(h);
        if (cc == CURLE_OK)
            curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
        if (cc == CURLE_OK && status == 200) {
            rc = 0;
            break;
        }
        int transient = cc != CURLE_OK || transient_status(status);
        if (!b->o.persist || !transient || now_s() >= b->deadline || g_stop) {
            fprintf(stderr, "bench_load: GET /v1/models/0: %s (HTTP %ld)\n", curl_easy_strerror(cc),
                    status);
            break;
        }
        sleep_s(retry_delay(b, tmp, attempt));
    }
    curl_easy_cleanup(h); /* its idle connection would only hold a server slot */
    return rc;
}

/* Reads the tensor names and shapes of the current global model. */
static int load_layers(bench *b)
{
    client tmp;
    memset(&tmp, 0, sizeof(tmp));
    int rc = -1;
    strata_model *m = NULL;
    strata_diag d = {{0}};
    if (fetch_model(b, &tmp) < 0)
        goto out;
    int drc = strata_checkpoint_decode(tmp.resp.buf, tmp.resp.len, &m, &d);
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
    free(tmp.resp.buf);
    return rc;
}

/* ---- report ------------------------------------------------------------------ */

typedef struct sample {
    uint32_t round;
    double lat, start, end, lag;
    size_t bytes;
} sample;

typedef struct round_stat {
    uint32_t round;
    size_t uploads;
    double first_start, last_end, bytes, p50, p99;
} round_stat;

/* The coordinator's figures (have: --server-pid was given and readable). */
typedef struct coord {
    int have_cpu, have_rss;
    double cpu_s;
    long long rss;
} coord;

typedef struct summary {
    sample *s;
    size_t n;
    double *lat, *lag; /* n entries each, ascending */
    round_stat *rs;
    size_t nrounds;
    double window, rate, bytes, wall, bench_cpu_s, build_s;
    long errors, expected, abandoned;
} summary;

static int cmp_sample(const void *a, const void *b)
{
    const sample *x = a, *y = b;
    if (x->round != y->round)
        return x->round < y->round ? -1 : 1;
    return x->lat < y->lat ? -1 : x->lat > y->lat;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static int cmp_window(const void *a, const void *b)
{
    const round_stat *x = a, *y = b;
    return cmp_double(&x->first_start, &y->first_start);
}

/* The nearest rank of percentile p among n values, as a 0-based index. */
static size_t rank_index(size_t n, double p)
{
    size_t rank = (size_t)ceil(p / 100.0 * (double)n);
    return rank < 1 ? 0 : rank > n ? n - 1 : rank - 1;
}

static double percentile(const double *v, size_t n, double p)
{
    return n ? v[rank_index(n, p)] : 0.0;
}

/* The acknowledged uploads, sorted by round and latency. */
static int collect(const bench *b, summary *sm)
{
    size_t n = 0, rounds = 0;
    for (long i = 0; i < b->o.clients; i++)
        for (long k = 0; k < b->o.rounds; k++)
            n += b->clients[i].recs[k].done != 0;
    sm->s = malloc((n ? n : 1) * sizeof(sample));
    sm->lat = malloc((n ? n : 1) * sizeof(double));
    sm->lag = malloc((n ? n : 1) * sizeof(double));
    if (sm->s == NULL || sm->lat == NULL || sm->lag == NULL)
        return -1;
    for (long i = 0; i < b->o.clients; i++)
        for (long k = 0; k < b->o.rounds; k++) {
            const upload_rec *u = &b->clients[i].recs[k];
            if (u->done)
                sm->s[sm->n++] = (sample){u->round, u->end - u->sched,   u->start,
                                          u->end,   u->start - u->sched, u->bytes};
        }
    qsort(sm->s, sm->n, sizeof(sample), cmp_sample);
    for (size_t i = 0; i < sm->n; i++) {
        sm->lat[i] = sm->s[i].lat;
        sm->lag[i] = sm->s[i].lag;
        sm->bytes += (double)sm->s[i].bytes;
        rounds += i == 0 || sm->s[i].round != sm->s[i - 1].round;
    }
    qsort(sm->lat, sm->n, sizeof(double), cmp_double);
    qsort(sm->lag, sm->n, sizeof(double), cmp_double);
    sm->rs = malloc((rounds ? rounds : 1) * sizeof(round_stat));
    return sm->rs != NULL ? 0 : -1;
}

/* Per round: uploads, window, mean bytes, latency p50/p99; then the union of
 * the windows and the rate over it. */
static void round_stats(summary *sm)
{
    for (size_t i = 0; i < sm->n;) {
        size_t j = i;
        round_stat *r = &sm->rs[sm->nrounds++];
        *r = (round_stat){sm->s[i].round, 0, sm->s[i].start, sm->s[i].end, 0, 0, 0};
        for (; j < sm->n && sm->s[j].round == r->round; j++) {
            r->first_start = fmin(r->first_start, sm->s[j].start);
            r->last_end = fmax(r->last_end, sm->s[j].end);
            r->bytes += (double)sm->s[j].bytes;
        }
        r->uploads = j - i;
        r->p50 = sm->s[i + rank_index(r->uploads, 50)].lat;
        r->p99 = sm->s[i + rank_index(r->uploads, 99)].lat;
        i = j;
    }
    round_stat *w = malloc((sm->nrounds ? sm->nrounds : 1) * sizeof(*w));
    if (w == NULL)
        return;
    memcpy(w, sm->rs, sm->nrounds * sizeof(*w));
    qsort(w, sm->nrounds, sizeof(*w), cmp_window);
    double lo = 0, hi = 0;
    for (size_t i = 0; i < sm->nrounds; i++) {
        if (i == 0 || w[i].first_start > hi) {
            sm->window += hi - lo;
            lo = w[i].first_start;
            hi = w[i].last_end;
        } else if (w[i].last_end > hi) {
            hi = w[i].last_end;
        }
    }
    sm->window += hi - lo;
    sm->rate = sm->window > 0 ? (double)sm->n / sm->window : 0.0;
    free(w);
}

static long error_count(const bench *b)
{
    return b->err_upload_status + b->err_transport + b->err_poll + b->err_register +
           b->err_timeout + b->err_answer + atomic_load(&b->err_build);
}

static void print_table(const bench *b, const summary *sm, const coord *cd)
{
    printf("%-6s %8s %10s %12s %9s %9s %12s\n", "round", "uploads", "window s", "uploads/s",
           "p50 ms", "p99 ms", "bytes/upload");
    for (size_t j = 0; j < sm->nrounds; j++) {
        const round_stat *r = &sm->rs[j];
        double w = r->last_end - r->first_start;
        printf("%-6u %8zu %10.3f %12.1f %9.1f %9.1f %12.0f\n", r->round, r->uploads, w,
               w > 0 ? (double)r->uploads / w : 0.0, r->p50 * 1e3, r->p99 * 1e3,
               r->bytes / (double)r->uploads);
    }
    printf("clients %ld, rounds %ld, %s loop%s", b->o.clients, b->o.rounds,
           b->o.mode == MODE_OPEN ? "open" : "closed", b->o.prebuild ? " (prebuilt)" : "");
    if (b->o.mode == MODE_OPEN)
        printf(" (offered %.0f/s, %s, start lag p99 %.1f ms)", b->o.rate,
               b->o.arr == ARRIVALS_POISSON ? "Poisson" : "evenly spaced",
               percentile(sm->lag, sm->n, 99) * 1e3);
    printf(": %zu of %ld uploads acknowledged, %.1f uploads/s over the upload windows (%.3f s), "
           "latency p50 %.1f ms, p99 %.1f ms, p99.9 %.1f ms, max %.1f ms, errors %ld (upload "
           "status %ld, transport %ld, poll %ld, build %ld, register %ld, timeout %ld, answer "
           "%ld), retried %ld, duplicates %ld, late %ld, abandoned %ld, connections opened %ld, "
           "uploads on a new connection %ld, uploads over %.0f s %ld",
           sm->n, sm->expected, sm->rate, sm->window, percentile(sm->lat, sm->n, 50) * 1e3,
           percentile(sm->lat, sm->n, 99) * 1e3, percentile(sm->lat, sm->n, 99.9) * 1e3,
           sm->n ? sm->lat[sm->n - 1] * 1e3 : 0.0, sm->errors, b->err_upload_status,
           b->err_transport, b->err_poll, atomic_load(&b->err_build), b->err_register,
           b->err_timeout, b->err_answer, b->retried, b->duplicates, b->late, sm->abandoned,
           b->connects, b->reconnects, SLOW_UPLOAD_S, b->slow);
    if (cd->have_cpu && sm->n > 0)
        printf(", coordinator CPU %.1f us/upload", cd->cpu_s * 1e6 / (double)sm->n);
    if (cd->have_rss)
        printf(", coordinator peak RSS %.1f MB", (double)cd->rss / 1048576.0);
    printf(", bench CPU %.1f s (builder %.1f s), wall %.1f s%s\n", sm->bench_cpu_s, sm->build_s,
           sm->wall, b->interrupted ? ", interrupted" : "");
}

static void jnum(json_t *o, const char *k, double v)
{
    json_object_set_new(o, k, isfinite(v) ? json_real(v) : json_null());
}

static void jint(json_t *o, const char *k, long long v)
{
    json_object_set_new(o, k, json_integer(v));
}

static json_t *json_rounds(const summary *sm)
{
    json_t *per = json_array();
    for (size_t j = 0; j < sm->nrounds; j++) {
        const round_stat *r = &sm->rs[j];
        double w = r->last_end - r->first_start;
        json_t *o = json_object();
        jint(o, "round", r->round);
        jint(o, "uploads", (long long)r->uploads);
        jnum(o, "window_s", w);
        jnum(o, "uploads_per_second", w > 0 ? (double)r->uploads / w : 0.0);
        jnum(o, "p50_s", r->p50);
        jnum(o, "p99_s", r->p99);
        jnum(o, "payload_bytes", r->bytes / (double)r->uploads);
        json_array_append_new(per, o);
    }
    return per;
}

static void print_json(const bench *b, const summary *sm, const coord *cd)
{
    json_t *j = json_object();
    double p50 = percentile(sm->lat, sm->n, 50), p99 = percentile(sm->lat, sm->n, 99);
    double pmax = sm->n ? sm->lat[sm->n - 1] : 0.0;
    json_object_set_new(j, "mode", json_string(b->o.mode == MODE_OPEN ? "open" : "closed"));
    json_object_set_new(j, "prebuilt", json_boolean(b->o.mode == MODE_OPEN || b->o.prebuild));
    jnum(j, "offered_rate", b->o.mode == MODE_OPEN ? b->o.rate : NAN);
    json_object_set_new(j, "arrivals",
                        b->o.mode != MODE_OPEN         ? json_null()
                        : b->o.arr == ARRIVALS_POISSON ? json_string("poisson")
                                                       : json_string("even"));
    jint(j, "clients", b->o.clients);
    jint(j, "rounds", b->o.rounds);
    jint(j, "uploads", (long long)sm->n);
    jint(j, "acknowledged", (long long)sm->n);
    jint(j, "expected_uploads", sm->expected);
    jnum(j, "uploads_per_second", sm->rate);
    jnum(j, "window_s", sm->window);
    jnum(j, "p50_s", p50);
    jnum(j, "p99_s", p99);
    jnum(j, "p999_s", percentile(sm->lat, sm->n, 99.9));
    jnum(j, "max_s", pmax);
    jnum(j, "latency_p50_ms", p50 * 1e3);
    jnum(j, "latency_p99_ms", p99 * 1e3);
    jnum(j, "latency_max_ms", pmax * 1e3);
    jnum(j, "start_lag_p99_s", b->o.mode == MODE_OPEN ? percentile(sm->lag, sm->n, 99) : NAN);
    jint(j, "errors", sm->errors);
    jint(j, "errors_upload_status", b->err_upload_status);
    jint(j, "errors_transport", b->err_transport);
    jint(j, "errors_poll", b->err_poll);
    jint(j, "errors_build", atomic_load(&b->err_build));
    jint(j, "errors_register", b->err_register);
    jint(j, "errors_timeout", b->err_timeout);
    jint(j, "errors_answer", b->err_answer);
    jint(j, "retried", b->retried);
    jint(j, "duplicates", b->duplicates);
    jint(j, "late", b->late);
    jint(j, "abandoned", sm->abandoned);
    json_object_set_new(j, "interrupted", json_boolean(b->interrupted));
    jint(j, "upload_reconnects", b->reconnects);
    jint(j, "connections_opened", b->connects);
    jint(j, "slow_uploads", b->slow);
    jnum(j, "payload_bytes", sm->n ? sm->bytes / (double)sm->n : 0.0);
    jnum(j, "coordinator_cpu_us_per_upload",
         cd->have_cpu && sm->n ? cd->cpu_s * 1e6 / (double)sm->n : NAN);
    jnum(j, "coordinator_cpu_s", cd->have_cpu ? cd->cpu_s : NAN);
    json_object_set_new(j, "coordinator_peak_rss_bytes",
                        cd->have_rss ? json_integer(cd->rss) : json_null());
    jnum(j, "bench_cpu_s", sm->bench_cpu_s);
    jnum(j, "builder_cpu_s", sm->build_s);
    jnum(j, "wall_s", sm->wall);
    json_object_set_new(j, "per_round", json_rounds(sm));
    char *text = json_dumps(j, JSON_COMPACT | JSON_PRESERVE_ORDER);
    if (text != NULL)
        printf("%s\n", text);
    free(text);
    json_decref(j);
}

static double own_cpu_s(void)
{
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) < 0)
        return 0.0;
    return (double)ru.ru_utime.tv_sec + 1e-6 * (double)ru.ru_utime.tv_usec +
           (double)ru.ru_stime.tv_sec + 1e-6 * (double)ru.ru_stime.tv_usec;
}

/* Prints the table, the summary and (--json) the JSON line. Returns the exit
 * code: 0 without an error, else 1. */
static int report(bench *b, double wall, const coord *cd)
{
    summary sm;
    memset(&sm, 0, sizeof(sm));
    int code = 1;
    if (collect(b, &sm) < 0)
        goto out;
    round_stats(&sm);
    sm.wall = wall;
    sm.bench_cpu_s = own_cpu_s();
    pthread_mutex_lock(&b->bld.mu);
    sm.build_s = b->bld.busy_s;
    pthread_mutex_unlock(&b->bld.mu);
    sm.expected = b->o.clients * b->o.rounds;
    sm.errors = error_count(b);
    long unfinished = sm.expected - (long)sm.n - b->late;
    if (b->interrupted)
        sm.abandoned = unfinished;
    else if (unfinished > 0 && sm.errors == 0)
        sm.errors = unfinished; /* a client stopped early without a counted error */
    print_table(b, &sm, cd);
    if (b->o.json)
        print_json(b, &sm, cd);
    code = sm.errors == 0 ? 0 : 1;
out:
    fflush(stdout);
    free(sm.s);
    free(sm.lat);
    free(sm.lag);
    free(sm.rs);
    return code;
}

/* ---- set-up ------------------------------------------------------------------ */

static int client_init(bench *b, client *cl, uint32_t i, long conns)
{
    cl->index = i;
    cl->resp.max = MAX_JSON;
    cl->recs = calloc((size_t)b->o.rounds, sizeof(upload_rec));
    cl->h = curl_easy_init();
    if (cl->recs == NULL || cl->h == NULL)
        return -1;
    CURL *h = cl->h;
    curl_easy_setopt(h, CURLOPT_PRIVATE, (void *)cl);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT, 10L);
    curl_easy_setopt(h, CURLOPT_LOW_SPEED_LIMIT, 1L);
    curl_easy_setopt(h, CURLOPT_LOW_SPEED_TIME, 60L);
    curl_easy_setopt(h, CURLOPT_HTTP_VERSION, (long)CURL_HTTP_VERSION_1_1);
    curl_easy_setopt(h, CURLOPT_MAXCONNECTS, conns);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, (void *)cl);
    return 0;
}

static FILE *open_record(const char *path, const char *mode)
{
    FILE *f = fopen(path, mode);
    if (f == NULL)
        fprintf(stderr, "bench_load: cannot open %s: %s\n", path, strerror(errno));
    else
        setvbuf(f, NULL, _IOLBF, 0); /* a line is on disk as soon as it is known */
    return f;
}

static int shard_init(bench *b, shard *sh, uint32_t index, long conns)
{
    sh->b = b;
    sh->index = index;
    sh->due = -1.0;
    sh->multi = curl_multi_init();
    if (sh->multi == NULL)
        return -1;
    curl_multi_setopt(sh->multi, CURLMOPT_SOCKETFUNCTION, on_socket);
    curl_multi_setopt(sh->multi, CURLMOPT_SOCKETDATA, (void *)sh);
    curl_multi_setopt(sh->multi, CURLMOPT_TIMERFUNCTION, on_timer);
    curl_multi_setopt(sh->multi, CURLMOPT_TIMERDATA, (void *)sh);
    curl_multi_setopt(sh->multi, CURLMOPT_MAXCONNECTS, conns);
    curl_multi_setopt(sh->multi, CURLMOPT_MAX_HOST_CONNECTIONS, conns);
    return 0;
}

static int setup(bench *b)
{
    size_t n = (size_t)b->o.clients;
    long conns = SHARD_CLIENTS + 16; /* a shard never has more transfers than clients */
    pthread_mutex_init(&b->bld.mu, NULL);
    pthread_cond_init(&b->bld.cv, NULL);
    b->nshards = (n + SHARD_CLIENTS - 1) / SHARD_CLIENTS;
    b->shards = calloc(b->nshards, sizeof(shard));
    b->clients = calloc(n, sizeof(client));
    b->timers = malloc(n * sizeof(timer));
    b->scratch = malloc(n * sizeof(uint32_t));
    b->bld.cap = n;
    b->bld.jobs = malloc(n * sizeof(uint32_t));
    b->bld.done = malloc(n * sizeof(uint32_t));
    b->bld.efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    b->ep = epoll_create1(EPOLL_CLOEXEC);
    b->hdr_reg = curl_slist_append(NULL, "Content-Type: application/json");
    if (b->hdr_reg != NULL)
        b->hdr_reg = curl_slist_append(b->hdr_reg, "Expect:");
    if (b->shards == NULL || b->clients == NULL || b->timers == NULL || b->scratch == NULL ||
        b->bld.jobs == NULL || b->bld.done == NULL || b->bld.efd < 0 || b->ep < 0 ||
        b->hdr_reg == NULL)
        return -1;
    if (b->o.acks != NULL && (b->acks = open_record(b->o.acks, "a")) == NULL)
        return -1;
    if (b->o.tokens != NULL && (b->tokens = open_record(b->o.tokens, "w")) == NULL)
        return -1;
    struct epoll_event ev = {.events = EPOLLIN, .data.u64 = EV_BUILDER};
    if (epoll_ctl(b->ep, EPOLL_CTL_ADD, b->bld.efd, &ev) < 0)
        return -1;
    strata_rng_seed(&b->jitter, b->o.seed, UINT64_MAX);
    for (size_t i = 0; i < b->nshards; i++)
        if (shard_init(b, &b->shards[i], (uint32_t)i, conns) < 0)
            return -1;
    for (size_t i = 0; i < n; i++) {
        b->clients[i].sh = &b->shards[i / SHARD_CLIENTS];
        if (client_init(b, &b->clients[i], (uint32_t)i, conns) < 0)
            return -1;
    }
    return 0;
}

static void teardown(bench *b)
{
    builder_stop(b);
    for (long i = 0; b->clients != NULL && i < b->o.clients; i++) {
        client *cl = &b->clients[i];
        if (cl->h != NULL) {
            if (cl->sh->multi != NULL)
                curl_multi_remove_handle(cl->sh->multi, cl->h);
            curl_easy_cleanup(cl->h);
        }
        curl_slist_free_all(cl->hdr_get);
        curl_slist_free_all(cl->hdr_post);
        free(cl->resp.buf);
        free(cl->recs);
        free(cl->wire);
        free(cl->t.budgets);
    }
    for (size_t i = 0; b->shards != NULL && i < b->nshards; i++)
        if (b->shards[i].multi != NULL)
            curl_multi_cleanup(b->shards[i].multi);
    for (size_t i = 0; i < b->nplans; i++)
        free(b->plans[i].pending);
    free(b->plans);
    curl_slist_free_all(b->hdr_reg);
    if (b->ep >= 0)
        close(b->ep);
    if (b->bld.efd >= 0)
        close(b->bld.efd);
    if (b->acks != NULL)
        fclose(b->acks);
    if (b->tokens != NULL)
        fclose(b->tokens);
    pthread_cond_destroy(&b->bld.cv);
    pthread_mutex_destroy(&b->bld.mu);
    free(b->shards);
    free(b->clients);
    free(b->timers);
    free(b->scratch);
    free(b->layers);
}

/* One descriptor per client connection, the registrations', two per multi
 * handle (curl's wake-up pair) and some slack. */
static int raise_fd_limit(const options *o)
{
    struct rlimit rl;
    long shards = (o->clients + SHARD_CLIENTS - 1) / SHARD_CLIENTS;
    rlim_t need = (rlim_t)(o->clients + o->reg_inflight + 2 * shards + FD_SLACK);
    if (getrlimit(RLIMIT_NOFILE, &rl) < 0)
        return -1;
    if (rl.rlim_cur >= need)
        return 0;
    rl.rlim_cur = rl.rlim_max == RLIM_INFINITY || rl.rlim_max >= need ? need : rl.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &rl) < 0 || rl.rlim_cur < need) {
        fprintf(stderr,
                "bench_load: %ld clients need %llu open files, the hard limit is %llu (raise "
                "ulimit -Hn)\n",
                o->clients, (unsigned long long)need, (unsigned long long)rl.rlim_max);
        return -1;
    }
    return 0;
}

/* ---- options ------------------------------------------------------------------ */

static const char USAGE[] =
    "usage: bench_load --server URL [options]\n"
    "  --clients N       simulated clients, each with its own connection (default 500)\n"
    "  --rounds R        rounds each client uploads in (default 3)\n"
    "  --mode M          closed: upload as soon as built (default); open: at --rate\n"
    "  --rate R          open loop: uploads started per second in each round\n"
    "  --arrivals A      open loop: even (default) or poisson start times\n"
    "  --prebuild        closed loop: a round's uploads start once all its payloads\n"
    "                    are built (as in the open loop), not each once it is built\n"
    "  --persist         retry transport errors and 5xx until --timeout; a 409\n"
    "                    round_closed counts as late (a coordinator killed and restarted)\n"
    "  --server-pid PID  report the coordinator's CPU per upload and peak RSS\n"
    "  --acks FILE       append 'round client_id receipt duplicate(0|1)' per upload\n"
    "                    answered 200\n"
    "  --tokens FILE     write 'client_id token' per registered client\n"
    "  --register-concurrency N  registrations in flight (default 64)\n"
    "  --secret S        the coordinator's enrolment secret\n"
    "  --seed S          seed of the synthetic updates (default 1)\n"
    "  --timeout S       give up after S seconds (default 900)\n"
    "  --json            print a JSON summary as the last line\n";

static const struct option OPTS[] = {
    {"server", required_argument, NULL, 'S'},
    {"clients", required_argument, NULL, 'n'},
    {"rounds", required_argument, NULL, 'r'},
    {"mode", required_argument, NULL, 'm'},
    {"rate", required_argument, NULL, 'R'},
    {"arrivals", required_argument, NULL, 'a'},
    {"persist", no_argument, NULL, 'p'},
    {"prebuild", no_argument, NULL, 'B'},
    {"server-pid", required_argument, NULL, 'P'},
    {"acks", required_argument, NULL, 'A'},
    {"tokens", required_argument, NULL, 'T'},
    {"register-concurrency", required_argument, NULL, 'c'},
    {"secret", required_argument, NULL, 'e'},
    {"seed", required_argument, NULL, 's'},
    {"timeout", required_argument, NULL, 't'},
    {"json", no_argument, NULL, 'j'},
    {"help", no_argument, NULL, 'h'},
    {NULL, 0, NULL, 0},
};

/* Applies option c with argument arg; -1 when the value is invalid. */
static int apply_option(options *o, int c, const char *arg)
{
    long v;
    switch (c) {
    case 'S':
        o->server = arg;
        return 0;
    case 'e':
        o->secret = arg;
        return 0;
    case 'A':
        o->acks = arg;
        return 0;
    case 'T':
        o->tokens = arg;
        return 0;
    case 'n':
        return strata_parse_long(arg, 1, 1000000, &o->clients) ? -1 : 0;
    case 'r':
        return strata_parse_long(arg, 1, 100000, &o->rounds) ? -1 : 0;
    case 't':
        return strata_parse_long(arg, 1, 86400, &o->timeout_s) ? -1 : 0;
    case 'P':
        return strata_parse_long(arg, 1, 1L << 30, &o->server_pid) ? -1 : 0;
    case 'c':
        return strata_parse_long(arg, 1, 4096, &o->reg_inflight) ? -1 : 0;
    case 'R':
        return strata_parse_double(arg, 1e-3, 1e7, &o->rate) ? -1 : 0;
    case 'm':
        if (strcmp(arg, "closed") != 0 && strcmp(arg, "open") != 0)
            return -1;
        o->mode = strcmp(arg, "open") == 0 ? MODE_OPEN : MODE_CLOSED;
        return 0;
    case 'a':
        if (strcmp(arg, "even") != 0 && strcmp(arg, "poisson") != 0)
            return -1;
        o->arr = strcmp(arg, "poisson") == 0 ? ARRIVALS_POISSON : ARRIVALS_EVEN;
        return 0;
    case 's':
        if (strata_parse_long(arg, 0, __LONG_MAX__, &v))
            return -1;
        o->seed = (unsigned long long)v;
        return 0;
    case 'p':
        o->persist = 1;
        return 0;
    case 'B':
        o->prebuild = 1;
        return 0;
    case 'j':
        o->json = 1;
        return 0;
    }
    return -1;
}

/* The rules between options; a message and -1 when one is broken. */
static int check_options(const options *o, int arr_given)
{
    const char *why = NULL;
    if (o->server == NULL ||
        (strncmp(o->server, "http://", 7) != 0 && strncmp(o->server, "https://", 8) != 0))
        why = "--server http://HOST:PORT is required";
    else if (o->mode == MODE_OPEN && o->rate <= 0)
        why = "--mode open needs --rate R";
    else if (o->mode == MODE_CLOSED && (o->rate > 0 || arr_given))
        why = "--rate and --arrivals need --mode open";
    else if (o->mode == MODE_OPEN && o->prebuild)
        why = "--prebuild is for the closed loop (the open loop always prebuilds)";
    else if (strlen(o->server) >= 1024)
        why = "--server: the URL is too long";
    if (why == NULL)
        return 0;
    fputs(USAGE, stderr);
    fprintf(stderr, "bench_load: %s\n", why);
    return -1;
}

static int parse_options(int argc, char **argv, options *o)
{
    *o = (options){.clients = 500, .rounds = 3, .timeout_s = 900, .seed = 1, .reg_inflight = 64};
    int c, li = 0, arr_given = 0;
    while ((c = getopt_long(argc, argv, "", OPTS, &li)) != -1) {
        if (c == 'h') {
            fputs(USAGE, stdout);
            exit(0);
        }
        if (c == '?' || c == ':') {
            fputs(USAGE, stderr);
            return 2;
        }
        arr_given |= c == 'a';
        if (apply_option(o, c, optarg) < 0) {
            fprintf(stderr, "bench_load: invalid value '%s' for --%s\n", optarg, OPTS[li].name);
            return 2;
        }
    }
    if (optind != argc) {
        fputs(USAGE, stderr);
        fprintf(stderr, "bench_load: unexpected argument '%s'\n", argv[optind]);
        return 2;
    }
    if (check_options(o, arr_given) < 0)
        return 2;
    if (o->server_pid > 0) {
        unsigned long long t;
        if (proc_cpu_ticks(o->server_pid, &t) < 0) {
            fprintf(stderr, "bench_load: --server-pid %ld: no such process\n", o->server_pid);
            return 2;
        }
    }
    return 0;
}

/* ---- main ---------------------------------------------------------------------- */

/* The coordinator's CPU from *t0 on and its peak RSS now. */
static void coordinator_end(const bench *b, int have_t0, unsigned long long t0, coord *cd)
{
    unsigned long long t1;
    memset(cd, 0, sizeof(*cd));
    if (b->o.server_pid <= 0)
        return;
    if (have_t0 && proc_cpu_ticks(b->o.server_pid, &t1) == 0) {
        cd->have_cpu = 1;
        cd->cpu_s = (double)(t1 - t0) / (double)sysconf(_SC_CLK_TCK);
    }
    cd->have_rss = proc_peak_rss(b->o.server_pid, &cd->rss) == 0;
}

static void on_signals(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
}

int main(int argc, char **argv)
{
    bench b;
    memset(&b, 0, sizeof(b));
    b.ep = b.bld.efd = -1;
    int rc = parse_options(argc, argv, &b.o);
    if (rc != 0)
        return rc;
    snprintf(b.base, sizeof(b.base), "%s", b.o.server);
    size_t bl = strlen(b.base);
    while (bl > 0 && b.base[bl - 1] == '/')
        b.base[--bl] = '\0';
    if (raise_fd_limit(&b.o) < 0)
        return 1;
    on_signals();
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != 0) {
        fprintf(stderr, "bench_load: curl_global_init failed\n");
        return 1;
    }
    strata_set_threads(1);
    int code = 1;
    double t0 = now_s();
    b.deadline = t0 + (double)b.o.timeout_s;
    if (setup(&b) < 0) {
        fprintf(stderr, "bench_load: cannot set up %ld clients\n", b.o.clients);
        goto out;
    }
    if (run_registration(&b) < 0 || load_layers(&b) < 0 || builder_start(&b) < 0)
        goto out;
    fprintf(stderr, "bench_load: %ld clients registered in %.1f s; model has %zu tensors\n",
            b.o.clients, now_s() - t0, b.nlayers);
    unsigned long long ticks0 = 0;
    int have_t0 = b.o.server_pid > 0 && proc_cpu_ticks(b.o.server_pid, &ticks0) == 0;
    double t1 = now_s();
    run_uploads(&b);
    double wall = now_s() - t1;
    coord cd;
    coordinator_end(&b, have_t0, ticks0, &cd);
    code = report(&b, wall, &cd);
out:
    teardown(&b);
    curl_global_cleanup();
    return code;
}
