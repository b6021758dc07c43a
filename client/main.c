/* strata-client: the edge client. Registers with the coordinator, polls for
 * tasks, downloads the global model (ETag-cached), trains on its share of
 * the data, applies error feedback and the task's compression budgets, and
 * uploads the payload with retries. Its state directory keeps its identity,
 * token, residuals, cached model and receipts, so a restarted client
 * continues where it stopped. The protocol is schemas/api.md. */
#include "transport.h"

#include "strata/checkpoint.h"
#include "strata/parse.h"
#include "strata/compress.h"
#include "strata/data.h"
#include "strata/fileio.h"
#include "strata/ef.h"
#include "strata/partition.h"
#include "strata/payload.h"
#include "strata/safetensors.h"
#include "strata/train.h"

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <jansson.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define MAX_JSON_BODY ((size_t)1 << 20)
#define MAX_MODEL_BODY ((size_t)1 << 31)

static volatile sig_atomic_t g_stop;

static void on_signal(int sig)
{
    (void)sig;
    g_stop = 1;
}

typedef struct options {
    const char *server, *state_dir, *data, *partition, *name, *secret, *secret_file, *ca_cert;
    char secret_buf[257];
    long num_clients, client_index, threads, max_rounds, poll_wait;
    unsigned long long seed;
    double ef_beta;
    long ef_max_staleness;
} options;

static void logf_(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void logf_(const char *fmt, ...)
{
    char ts[32];
    time_t now = time(NULL);
    struct tm tm;
    strftime(ts, sizeof(ts), "%H:%M:%S", localtime_r(&now, &tm));
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "%s strata-client: ", ts);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

static const char USAGE[] =
    "usage: strata-client --server URL --state-dir DIR --data DIR [options]\n"
    "  --partition SPEC       iid (default), dirichlet:ALPHA or shards:S\n"
    "  --num-clients N        clients the training set is split over (default 1)\n"
    "  --client-index I       this client's share, 0..N-1 (default 0)\n"
    "  --seed S               partition seed, the same for every client (default 1)\n"
    "  --threads T            training threads (default 1)\n"
    "  --name NAME            name sent at registration\n"
    "  --enrolment-secret S   the federation's enrolment secret (needed to register)\n"
    "  --enrolment-secret-file F  or: read it from the first line of file F\n"
    "  --ca-cert FILE         CA certificate (PEM) to trust for https\n"
    "  --max-rounds N         stop after N uploaded updates (default: until finished)\n"
    "  --poll-wait S          long-poll wait for tasks in seconds (default 10)\n"
    "  --ef-beta B            residual decay per missed round, (0, 1] (default 1)\n"
    "  --ef-max-staleness N   drop the residual after N missed rounds (default 0: never)\n"
    "Exits 0 when the federation has finished, 130 when interrupted.\n";

static int parse_options(int argc, char **argv, options *o)
{
    static const struct option opts[] = {
        {"server", required_argument, NULL, 'S'},
        {"state-dir", required_argument, NULL, 'd'},
        {"data", required_argument, NULL, 'D'},
        {"partition", required_argument, NULL, 'p'},
        {"num-clients", required_argument, NULL, 'n'},
        {"client-index", required_argument, NULL, 'i'},
        {"seed", required_argument, NULL, 's'},
        {"threads", required_argument, NULL, 't'},
        {"name", required_argument, NULL, 'N'},
        {"enrolment-secret", required_argument, NULL, 'e'},
        {"enrolment-secret-file", required_argument, NULL, 'E'},
        {"ca-cert", required_argument, NULL, 'c'},
        {"max-rounds", required_argument, NULL, 'r'},
        {"poll-wait", required_argument, NULL, 'w'},
        {"ef-beta", required_argument, NULL, 'b'},
        {"ef-max-staleness", required_argument, NULL, 'm'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    *o = (options){.partition = "iid",
                   .num_clients = 1,
                   .threads = 1,
                   .poll_wait = 10,
                   .seed = 1,
                   .ef_beta = 1.0};
    int c, li = 0;
    long v;
    while ((c = getopt_long(argc, argv, "", opts, &li)) != -1) {
        switch (c) {
        case 'S':
            o->server = optarg;
            break;
        case 'd':
            o->state_dir = optarg;
            break;
        case 'D':
            o->data = optarg;
            break;
        case 'p':
            o->partition = optarg;
            break;
        case 'N':
            o->name = optarg;
            break;
        case 'e':
            o->secret = optarg;
            break;
        case 'E':
            o->secret_file = optarg;
            break;
        case 'c':
            o->ca_cert = optarg;
            break;
        case 'n':
            if (strata_parse_long(optarg, 1, 1000000, &o->num_clients))
                goto bad;
            break;
        case 'i':
            if (strata_parse_long(optarg, 0, 999999, &o->client_index))
                goto bad;
            break;
        case 's':
            if (strata_parse_long(optarg, 0, __LONG_MAX__, &v))
                goto bad;
            o->seed = (unsigned long long)v;
            break;
        case 't':
            if (strata_parse_long(optarg, 1, 1024, &o->threads))
                goto bad;
            break;
        case 'r':
            if (strata_parse_long(optarg, 0, 1000000000, &o->max_rounds))
                goto bad;
            break;
        case 'w':
            if (strata_parse_long(optarg, 0, 30, &o->poll_wait))
                goto bad;
            break;
        case 'm':
            if (strata_parse_long(optarg, 0, 1000000000, &o->ef_max_staleness))
                goto bad;
            break;
        case 'b': {
            char *end;
            o->ef_beta = strtod(optarg, &end);
            if (end == optarg || *end || !(o->ef_beta > 0.0 && o->ef_beta <= 1.0))
                goto bad;
            break;
        }
        case 'h':
            fputs(USAGE, stdout);
            exit(0);
        default:
            fputs(USAGE, stderr);
            return 2;
        }
    }
    if (optind != argc || !o->server || !o->state_dir || !o->data) {
        fputs(USAGE, stderr);
        fprintf(stderr, "strata-client: --server, --state-dir and --data are required\n");
        return 2;
    }
    if (o->client_index >= o->num_clients) {
        fprintf(stderr, "strata-client: --client-index must be below --num-clients\n");
        return 2;
    }
    if (o->secret_file != NULL) {
        strata_diag d = {{0}};
        size_t n = 0;
        int rc =
            strata_file_read_line(o->secret_file, o->secret_buf, sizeof(o->secret_buf), &n, &d);
        if (o->secret != NULL || rc < 0 || n == 0) {
            fprintf(stderr, "strata-client: --enrolment-secret-file: %s\n",
                    o->secret ? "give either it or --enrolment-secret"
                    : rc < 0  ? strata_diag_msg(&d, rc)
                              : "no secret on its first line");
            return 2;
        }
        o->secret = o->secret_buf;
    }
    return 0;
bad:
    fprintf(stderr, "strata-client: invalid value '%s' for --%s\n", optarg, opts[li].name);
    return 2;
}

/* ---- state directory ---- */

static void state_path(const options *o, const char *name, char *buf, size_t len)
{
    snprintf(buf, len, "%s/%s", o->state_dir, name);
}

/* Writes a file of the state directory atomically; 0 on success. */
static int write_atomic(const char *path, const void *data, size_t len, mode_t mode)
{
    return strata_file_write_atomic(path, data, len, (unsigned)mode, NULL) == STRATA_OK ? 0 : -1;
}

/* Reads a whole regular file of at most max bytes (allocating its size). */
static int read_small(const char *path, size_t max, uint8_t **out, size_t *len)
{
    *out = NULL;
    *len = 0;
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return -1;
    struct stat st;
    if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode) || (uint64_t)st.st_size > max) {
        fclose(f);
        return -1;
    }
    size_t size = (size_t)st.st_size;
    uint8_t *buf = malloc(size + 1);
    size_t n = buf ? fread(buf, 1, size + 1, f) : 0;
    fclose(f);
    if (buf == NULL || n != size) {
        free(buf);
        return -1;
    }
    buf[n] = '\0';
    *out = buf;
    *len = n;
    return 0;
}

/* Removes the files of the state directory that belong to one federation
 * (all but the identity): used when the coordinator no longer knows us. */
static void forget_federation(const options *o)
{
    static const char *const names[] = {"residual.safetensors", "residual.pending.safetensors",
                                        "pending.bin",          "pending.json",
                                        "model.safetensors",    "model.etag"};
    char path[4096], old[4200];
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        snprintf(path, sizeof(path), "%s/%s", o->state_dir, names[i]);
        unlink(path);
    }
    snprintf(path, sizeof(path), "%s/receipts.log", o->state_dir);
    snprintf(old, sizeof(old), "%s.old", path);
    rename(path, old);
}

typedef struct identity {
    long long client_id;
    char token[80];
} identity;

static int load_identity(const options *o, identity *id)
{
    char path[4096];
    state_path(o, "identity.json", path, sizeof(path));
    uint8_t *buf;
    size_t len;
    if (read_small(path, 4096, &buf, &len) != 0)
        return -1;
    json_t *j = json_loadb((const char *)buf, len, 0, NULL);
    free(buf);
    const char *tok = json_string_value(json_object_get(j, "token"));
    json_t *cid = json_object_get(j, "client_id");
    int ok = tok && strlen(tok) < sizeof(id->token) && json_is_integer(cid);
    if (ok) {
        id->client_id = json_integer_value(cid);
        snprintf(id->token, sizeof(id->token), "%s", tok);
    }
    json_decref(j);
    return ok ? 0 : -1;
}

static int register_client(const options *o, strata_http *h, identity *id)
{
    json_t *req = json_object();
    if (o->name)
        json_object_set_new(req, "name", json_string(o->name));
    if (o->secret)
        json_object_set_new(req, "enrolment_secret", json_string(o->secret));
    char *body = json_dumps(req, JSON_COMPACT);
    json_decref(req);
    strata_http_response r;
    strata_diag d = {{0}};
    int rc = strata_http_request_retry(h, "POST", "/v1/clients", "application/json",
                                       (const uint8_t *)body, strlen(body), NULL, 0, MAX_JSON_BODY,
                                       0, 30.0, &r, &d);
    free(body);
    if (rc < 0) {
        logf_("registration failed: %s", strata_diag_msg(&d, rc));
        return -1;
    }
    json_t *j = r.status == 201 ? json_loadb((const char *)r.body, r.len, 0, NULL) : NULL;
    const char *tok = json_string_value(json_object_get(j, "token"));
    json_t *cid = json_object_get(j, "client_id");
    int ok = tok && strlen(tok) < sizeof(id->token) && json_is_integer(cid);
    if (!ok) {
        logf_("registration refused (HTTP %ld): %s", r.status, r.body ? (char *)r.body : "");
    } else {
        id->client_id = json_integer_value(cid);
        snprintf(id->token, sizeof(id->token), "%s", tok);
        char path[4096];
        state_path(o, "identity.json", path, sizeof(path));
        json_t *save = json_pack("{s:I,s:s,s:s}", "client_id", (json_int_t)id->client_id, "token",
                                 id->token, "server", o->server);
        char *text = json_dumps(save, JSON_COMPACT);
        json_decref(save);
        if (write_atomic(path, text, strlen(text), 0600) != 0) {
            logf_("cannot save %s: %s", path, strerror(errno));
            ok = 0;
        }
        free(text);
    }
    json_decref(j);
    strata_http_response_cleanup(&r);
    return ok ? 0 : -1;
}

/* ---- one round ---- */

typedef struct task {
    uint32_t round, total_rounds;
    uint64_t model_version, seed;
    strata_values_format vf;
    strata_budget *budgets;
    size_t nbudgets;
    strata_sgd_config sgd;
    long epochs, batch, max_steps;
} task;

static int parse_task(const uint8_t *body, size_t len, task *t, strata_diag *d)
{
    memset(t, 0, sizeof(*t));
    json_error_t je;
    json_t *j = json_loadb((const char *)body, len, JSON_REJECT_DUPLICATES, &je);
    if (!json_is_object(j)) {
        json_decref(j);
        return strata_diag_set(d, STRATA_EPROTO, "task is not a JSON object");
    }
    int rc = STRATA_EPROTO;
    json_t *round = json_object_get(j, "round"), *mv = json_object_get(j, "model_version");
    json_t *budgets = json_object_get(j, "budgets"), *train = json_object_get(j, "train");
    const char *values = json_string_value(json_object_get(j, "values"));
    if (!json_is_integer(round) || !json_is_integer(mv) || !json_is_array(budgets) ||
        !json_is_object(train)) {
        strata_diag_set(d, rc, "task lacks round, model_version, budgets or train");
        goto out;
    }
    t->round = (uint32_t)json_integer_value(round);
    t->model_version = (uint64_t)json_integer_value(mv);
    t->total_rounds = (uint32_t)json_integer_value(json_object_get(j, "total_rounds"));
    t->seed = (uint64_t)json_integer_value(json_object_get(j, "seed"));
    t->vf = STRATA_VALUES_FP32;
    if (values && strcmp(values, "fp16") == 0)
        t->vf = STRATA_VALUES_FP16;
    else if (values && strcmp(values, "bf16") == 0)
        t->vf = STRATA_VALUES_BF16;
    t->nbudgets = json_array_size(budgets);
    t->budgets = calloc(t->nbudgets ? t->nbudgets : 1, sizeof(strata_budget));
    if (t->budgets == NULL) {
        rc = STRATA_ENOMEM;
        goto out;
    }
    for (size_t i = 0; i < t->nbudgets; i++) {
        json_t *b = json_array_get(budgets, i);
        const char *comp = json_string_value(json_object_get(b, "compressor"));
        strata_budget *bb = &t->budgets[i];
        if (comp == NULL || strata_comp_from_name(comp, &bb->comp) < 0) {
            strata_diag_set(d, rc, "task budget %zu: unknown compressor", i);
            goto out;
        }
        bb->density = json_number_value(json_object_get(b, "density"));
        bb->levels = (uint32_t)json_integer_value(json_object_get(b, "levels"));
        bb->rank = (uint32_t)json_integer_value(json_object_get(b, "rank"));
        if (bb->density <= 0.0)
            bb->density = 1.0;
        if (strata_budget_check(bb, d) < 0)
            goto out;
    }
    t->sgd.lr = (float)json_number_value(json_object_get(train, "lr"));
    t->sgd.momentum = (float)json_number_value(json_object_get(train, "momentum"));
    t->sgd.weight_decay = (float)json_number_value(json_object_get(train, "weight_decay"));
    t->sgd.prox_mu = (float)json_number_value(json_object_get(train, "prox_mu"));
    t->epochs = (long)json_integer_value(json_object_get(train, "epochs"));
    t->batch = (long)json_integer_value(json_object_get(train, "batch"));
    t->max_steps = (long)json_integer_value(json_object_get(train, "max_steps"));
    if (t->epochs < 1 || t->batch < 1 || t->max_steps < 0) {
        strata_diag_set(d, rc, "task train settings: epochs and batch must be >= 1");
        goto out;
    }
    rc = STRATA_OK;
out:
    json_decref(j);
    if (rc < 0) {
        free(t->budgets);
        t->budgets = NULL;
    }
    return rc;
}

/* Fetches model `version`, using the state directory's cached copy when its
 * ETag still matches. */
static int fetch_model(const options *o, strata_http *h, uint64_t version, strata_model **m,
                       size_t *downloaded)
{
    char path[4096], etag_path[4096], url[64], etag[128] = "";
    state_path(o, "model.safetensors", path, sizeof(path));
    state_path(o, "model.etag", etag_path, sizeof(etag_path));
    uint8_t *e;
    size_t elen;
    if (read_small(etag_path, sizeof(etag) - 1, &e, &elen) == 0) {
        memcpy(etag, e, elen);
        etag[elen] = '\0';
        free(e);
    }
    snprintf(url, sizeof(url), "/v1/models/%llu", (unsigned long long)version);
    strata_http_response r;
    strata_diag d = {{0}};
    *downloaded = 0;
    int rc = strata_http_request_retry(h, "GET", url, NULL, NULL, 0, etag, 1, MAX_MODEL_BODY, 0,
                                       30.0, &r, &d);
    if (rc < 0) {
        logf_("model %llu: %s", (unsigned long long)version, strata_diag_msg(&d, rc));
        return rc;
    }
    if (r.status == 200) {
        *downloaded = r.len;
        rc = strata_checkpoint_decode(r.body, r.len, m, &d);
        if (rc == STRATA_OK && (write_atomic(path, r.body, r.len, 0644) != 0 ||
                                write_atomic(etag_path, r.etag, strlen(r.etag), 0644) != 0))
            logf_("warning: cannot cache the model in %s", o->state_dir);
    } else if (r.status == 304) {
        rc = strata_checkpoint_load(path, m, &d);
    } else {
        logf_("model %llu: HTTP %ld: %s", (unsigned long long)version, r.status, (char *)r.body);
        rc = STRATA_EPROTO;
    }
    if (rc < 0 && r.status != 0)
        logf_("model %llu: %s", (unsigned long long)version, strata_diag_msg(&d, rc));
    strata_http_response_cleanup(&r);
    return rc;
}

typedef struct progress_ctx {
    int tty;
    uint32_t round;
} progress_ctx;

static int on_progress(void *ud, size_t done, size_t total)
{
    progress_ctx *p = ud;
    if (!p->tty || total == 0)
        return g_stop != 0;
    int width = 30, filled = (int)((double)done / (double)total * width);
    char bar[40];
    for (int i = 0; i < width; i++)
        bar[i] = i < filled ? '#' : '.';
    bar[width] = '\0';
    fprintf(stderr, "\rround %u [%s] %5.1f%%", p->round, bar, 100.0 * (double)done / (double)total);
    if (done >= total)
        fputs("\r\033[K", stderr);
    return g_stop != 0; /* SIGINT/SIGTERM abandon the step after this batch */
}

/* Appends "ROUND RECEIPT" to receipts.log unless its last line already
 * records that round. */
static void record_receipt(const options *o, uint32_t round, const char *receipt)
{
    char lpath[4096], line[256];
    state_path(o, "receipts.log", lpath, sizeof(lpath));
    uint8_t *old;
    size_t len;
    if (read_small(lpath, (size_t)1 << 24, &old, &len) == 0) {
        const char *last = (const char *)old;
        for (size_t i = 0; i + 1 < len; i++)
            if (old[i] == '\n')
                last = (const char *)old + i + 1;
        unsigned long r;
        int dup = sscanf(last, "%lu", &r) == 1 && r == round;
        free(old);
        if (dup)
            return;
    }
    int fd = open(lpath, O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd < 0) {
        logf_("warning: cannot record the receipt: %s", strerror(errno));
        return;
    }
    int n = snprintf(line, sizeof(line), "%u %s\n", round, receipt);
    if (write(fd, line, (size_t)n) != n || fsync(fd) != 0)
        logf_("warning: cannot record the receipt");
    close(fd);
}

/* Uploads the staged payload of `round` (wire, or pending.bin when wire is
 * NULL) and settles the stage: on 200 the receipt is recorded and the
 * pending residual becomes current (returns 0); on a refusal (any status
 * left after the retries of transient ones) the stage is dropped and the
 * previous residual stays (returns 1). A transport failure keeps the stage
 * for the next start (returns < 0). */
static int upload_pending(const options *o, strata_http *h, uint32_t round, const uint8_t *wire,
                          size_t wire_len)
{
    char ppath[4096], rpath[4096], bpath[4096], jpath[4096], url[64];
    state_path(o, "residual.pending.safetensors", ppath, sizeof(ppath));
    state_path(o, "residual.safetensors", rpath, sizeof(rpath));
    state_path(o, "pending.bin", bpath, sizeof(bpath));
    state_path(o, "pending.json", jpath, sizeof(jpath));
    uint8_t *file = NULL;
    if (wire == NULL) {
        if (read_small(bpath, MAX_MODEL_BODY, &file, &wire_len) != 0) {
            logf_("staged upload of round %u is unreadable; dropping it", round);
            unlink(jpath);
            unlink(bpath);
            unlink(ppath);
            return 1;
        }
        wire = file;
    }
    snprintf(url, sizeof(url), "/v1/rounds/%u/updates", round);
    strata_http_response r;
    strata_diag d = {{0}};
    int rc = strata_http_request_retry(h, "POST", url, "application/octet-stream", wire, wire_len,
                                       NULL, 0, MAX_JSON_BODY, 0, 30.0, &r, &d);
    free(file);
    if (rc < 0) {
        logf_("round %u: upload failed: %s (kept for the next start)", round,
              strata_diag_msg(&d, rc));
        return rc;
    }
    if (r.status == 200) {
        json_t *j = json_loadb((const char *)r.body, r.len, 0, NULL);
        const char *receipt = json_string_value(json_object_get(j, "receipt"));
        record_receipt(o, round, receipt ? receipt : "?");
        if (rename(ppath, rpath) != 0 && errno != ENOENT)
            logf_("round %u: cannot install the new residuals: %s", round, strerror(errno));
        logf_("round %u: receipt %s%s", round, receipt ? receipt : "?",
              json_is_true(json_object_get(j, "duplicate")) ? " (already held)" : "");
        json_decref(j);
    } else {
        /* A refusal (transient statuses were retried above) is final for this
         * update: drop the stage and keep the previous residuals. */
        logf_("round %u: update refused (HTTP %ld): %s; dropping it", round, r.status,
              (char *)r.body);
        unlink(ppath);
        rc = 1;
    }
    strata_http_response_cleanup(&r);
    unlink(jpath);
    unlink(bpath);
    return rc;
}

/* At start-up: settles an upload staged by a previous run. */
static int settle_pending(const options *o, strata_http *h)
{
    char jpath[4096];
    state_path(o, "pending.json", jpath, sizeof(jpath));
    uint8_t *buf;
    size_t len;
    if (read_small(jpath, 4096, &buf, &len) != 0)
        return STRATA_OK;
    json_t *j = json_loadb((const char *)buf, len, 0, NULL);
    free(buf);
    json_t *r = json_object_get(j, "round");
    int rc = STRATA_OK;
    if (json_is_integer(r)) {
        uint32_t round = (uint32_t)json_integer_value(r);
        logf_("re-sending the staged update of round %u", round);
        rc = upload_pending(o, h, round, NULL, 0);
    } else {
        unlink(jpath);
    }
    json_decref(j);
    return rc;
}

/* Trains, compresses and uploads one task. Returns 0 when the coordinator
 * acknowledged the update, 1 when it refused it (the update is dropped), <0
 * on a failure. */
static int run_task(const options *o, strata_http *h, const identity *id, const task *t,
                    const strata_dataset *ds, const size_t *mine, size_t nmine)
{
    strata_model *m = NULL;
    strata_sgd *opt = NULL;
    strata_ef *ef = NULL;
    strata_clayer *layers = NULL;
    strata_tensor_list global, delta;
    strata_tensor_list_init(&global);
    strata_tensor_list_init(&delta);
    uint8_t *wire = NULL;
    size_t wire_len = 0, downloaded = 0;
    char *meta = NULL;
    int rc;
    strata_diag d = {{0}};
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);

    if ((rc = fetch_model(o, h, t->model_version, &m, &downloaded)) < 0)
        goto out;
    strata_tensor_list *params = strata_model_params(m);
    if (t->nbudgets != params->count) {
        logf_("round %u: task has %zu budgets for %zu tensors", t->round, t->nbudgets,
              params->count);
        rc = STRATA_EPROTO;
        goto out;
    }
    if ((rc = strata_tensor_list_copy(&global, params)) < 0)
        goto out;
    strata_sgd_config cfg = t->sgd;
    if ((rc = strata_sgd_new(params, &cfg, &opt, &d)) < 0) {
        logf_("round %u: training settings: %s", t->round, strata_diag_msg(&d, rc));
        goto out;
    }
    if (cfg.prox_mu > 0.0f)
        strata_sgd_set_anchor(opt, &global);
    strata_rng rng;
    strata_rng_seed(&rng, t->seed, (uint64_t)o->client_index + 1);
    progress_ctx pc = {isatty(STDERR_FILENO), t->round};
    strata_train_stats st = {0};
    double loss = 0.0;
    for (long e = 0; e < t->epochs && !g_stop; e++) {
        rc = strata_train_epoch(m, opt, ds, mine, nmine, (size_t)t->batch, (size_t)t->max_steps,
                                &rng, on_progress, &pc, &st);
        if (rc < 0) {
            logf_("round %u: training failed: %s", t->round, strata_strerror(rc));
            goto out;
        }
        loss = st.loss;
    }
    if (g_stop) {
        rc = STRATA_ESTATE;
        goto out;
    }
    /* delta = w_local - w_global */
    if ((rc = strata_tensor_list_copy(&delta, params)) < 0)
        goto out;
    for (size_t i = 0; i < delta.count; i++)
        for (size_t k = 0; k < delta.items[i].numel; k++)
            delta.items[i].data[k] -= global.items[i].data[k];

    char rpath[4096];
    state_path(o, "residual.safetensors", rpath, sizeof(rpath));
    if (access(rpath, F_OK) == 0)
        rc = strata_ef_load(rpath, &delta, &ef, &d);
    else
        rc = strata_ef_new(&delta, o->ef_beta, (uint32_t)o->ef_max_staleness, &ef);
    if (rc < 0) {
        logf_("residuals %s: %s", rpath, strata_diag_msg(&d, rc));
        goto out;
    }
    uint32_t last;
    if (strata_ef_last_round(ef, &last) == STRATA_OK && last >= t->round) {
        /* Residuals are installed only after an acknowledged upload, so a
         * coordinator asking again for a round we already hold belongs to
         * another run: those residuals mean nothing to it. */
        logf_("round %u: the residuals are from round %u of another run; starting afresh", t->round,
              last);
        strata_ef_free(ef);
        ef = NULL;
        if ((rc = strata_ef_new(&delta, o->ef_beta, (uint32_t)o->ef_max_staleness, &ef)) < 0)
            goto out;
    }
    if ((rc = strata_ef_step(ef, &delta, t->budgets, t->vf, t->round,
                             t->seed ^ (uint64_t)id->client_id, &layers, &d)) < 0) {
        logf_("round %u: compression failed: %s", t->round, strata_diag_msg(&d, rc));
        goto out;
    }
    double *norms = calloc(delta.count ? delta.count : 1, sizeof(double));
    json_t *nj = json_array();
    if (norms && strata_ef_residual_norms(ef, norms, delta.count) == 0)
        for (size_t i = 0; i < delta.count; i++)
            json_array_append_new(nj, json_real(norms[i]));
    free(norms);
    json_t *mj = json_pack("{s:f,s:o}", "train_loss", loss, "residual_norms", nj);
    meta = json_dumps(mj, JSON_COMPACT);
    json_decref(mj);
    strata_payload p = {.round = t->round,
                        .model_version = t->model_version,
                        .client_id = (uint64_t)id->client_id,
                        .sample_count = nmine,
                        .num_layers = delta.count,
                        .layers = layers,
                        .metadata_json = meta};
    if ((rc = strata_payload_encode(&p, 1, &wire, &wire_len, &d)) < 0) {
        logf_("round %u: encoding failed: %s", t->round, strata_diag_msg(&d, rc));
        goto out;
    }
    /* Stage the upload: the new residual and the payload are saved as
     * "pending" first (pending.json, written last, marks the stage complete),
     * then uploaded. A client killed at any point re-sends the pending payload
     * at its next start, so an update the coordinator acknowledged is never
     * lost and its residual never applied twice. */
    char ppath[4096], bpath[4096], jpath[4096], pj[64];
    state_path(o, "residual.pending.safetensors", ppath, sizeof(ppath));
    state_path(o, "pending.bin", bpath, sizeof(bpath));
    state_path(o, "pending.json", jpath, sizeof(jpath));
    int pjlen = snprintf(pj, sizeof(pj), "{\"round\":%u}", t->round);
    if ((rc = strata_ef_save(ef, ppath, &d)) < 0 ||
        write_atomic(bpath, wire, wire_len, 0600) != 0 ||
        write_atomic(jpath, pj, (size_t)pjlen, 0600) != 0) {
        logf_("round %u: cannot stage the upload in %s: %s", t->round, o->state_dir,
              rc < 0 ? strata_diag_msg(&d, rc) : strerror(errno));
        rc = rc < 0 ? rc : STRATA_EIO;
        goto out;
    }
    rc = upload_pending(o, h, t->round, wire, wire_len);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double secs = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
    if (rc == 0)
        logf_("round %u: %zu samples, loss %.4f, uploaded %zu bytes (model %zu bytes) in %.1f s",
              t->round, nmine, loss, wire_len, downloaded, secs);
out:
    free(meta);
    free(wire);
    if (layers)
        strata_clayers_free(layers, delta.count);
    strata_ef_free(ef);
    strata_sgd_free(opt);
    strata_tensor_list_cleanup(&global);
    strata_tensor_list_cleanup(&delta);
    strata_model_free(m);
    return rc;
}

int main(int argc, char **argv)
{
    options o;
    int rc = parse_options(argc, argv, &o);
    if (rc != 0)
        return rc;
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    if (mkdir(o.state_dir, 0700) != 0 && errno != EEXIST) {
        fprintf(stderr, "strata-client: cannot create %s: %s\n", o.state_dir, strerror(errno));
        return 1;
    }
    strata_set_threads((int)o.threads);
    strata_dataset ds;
    strata_dataset_init(&ds);
    strata_partition *part = NULL;
    strata_http *h = NULL;
    strata_diag d = {{0}};
    int code = 1;
    if ((rc = strata_data_load_dir(o.data, "train", 0, &ds, &d)) < 0) {
        fprintf(stderr, "strata-client: %s\n", strata_diag_msg(&d, rc));
        goto out;
    }
    if ((rc = strata_partition_new(ds.y, ds.n, ds.num_classes, o.partition, (size_t)o.num_clients,
                                   o.seed, &part, &d)) < 0) {
        fprintf(stderr, "strata-client: --partition: %s\n", strata_diag_msg(&d, rc));
        code = 2;
        goto out;
    }
    const size_t *mine = part->indices[o.client_index];
    size_t nmine = part->counts[o.client_index];
    if ((rc = strata_http_new(o.server, o.ca_cert, &g_stop, &h, &d)) < 0) {
        fprintf(stderr, "strata-client: %s\n", strata_diag_msg(&d, rc));
        code = 2;
        goto out;
    }
    identity id;
    if (load_identity(&o, &id) == 0) {
        logf_("resuming as client %lld", id.client_id);
    } else if (register_client(&o, h, &id) == 0) {
        logf_("registered as client %lld", id.client_id);
    } else {
        goto out;
    }
    strata_http_set_token(h, id.token);
    if (settle_pending(&o, h) < 0)
        goto out;
    logf_("%zu training samples (share %ld of %ld, partition %s)", nmine, o.client_index,
          o.num_clients, o.partition);
    long uploaded = 0;
    int reregistered = 0;
    char path[64];
    snprintf(path, sizeof(path), "/v1/tasks/next?wait=%ld", o.poll_wait);
    while (!g_stop && (o.max_rounds == 0 || uploaded < o.max_rounds)) {
        strata_http_response r;
        rc = strata_http_request_retry(h, "GET", path, NULL, NULL, 0, NULL, 0, MAX_JSON_BODY, 0,
                                       30.0, &r, &d);
        if (rc < 0) {
            if (!g_stop)
                logf_("polling failed: %s", strata_diag_msg(&d, rc));
            break;
        }
        if (r.status == 410) {
            logf_("the federation has finished");
            strata_http_response_cleanup(&r);
            code = 0;
            goto out;
        }
        if (r.status == 204) {
            double wait = r.retry_after >= 0 ? r.retry_after : 1.0;
            strata_http_response_cleanup(&r);
            strata_http_sleep(h, wait);
            continue;
        }
        if (r.status == 401 && !reregistered) {
            /* The coordinator does not know this token (its state was reset):
             * register again, once. */
            logf_("the coordinator refused the saved token (its state was reset?); registering "
                  "again and starting afresh");
            strata_http_response_cleanup(&r);
            strata_http_set_token(h, NULL);
            forget_federation(&o);
            if (register_client(&o, h, &id) != 0)
                goto out;
            strata_http_set_token(h, id.token);
            reregistered = 1;
            continue;
        }
        if (r.status != 200) {
            logf_("task request refused (HTTP %ld): %s", r.status, (char *)r.body);
            strata_http_response_cleanup(&r);
            goto out;
        }
        reregistered = 0;
        task t;
        rc = parse_task(r.body, r.len, &t, &d);
        strata_http_response_cleanup(&r);
        if (rc < 0) {
            logf_("bad task: %s", strata_diag_msg(&d, rc));
            goto out;
        }
        rc = run_task(&o, h, &id, &t, &ds, mine, nmine);
        free(t.budgets);
        if (rc < 0 && !g_stop)
            goto out;
        if (rc == 0)
            uploaded++; /* acknowledged; 1 means refused and dropped */
    }
    code = 0;
out:
    if (g_stop)
        code = 130; /* interrupted: state is saved, a restart continues */
    strata_http_free(h);
    strata_partition_free(part);
    strata_dataset_cleanup(&ds);
    return code;
}
