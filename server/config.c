/* strata-server configuration parsing (see config.h). */
#include "config.h"

#include "aggregate.h"
#include "robust.h"

#include "strata/fileio.h"
#include "strata/log.h"
#include "strata/opts.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char srv_config_usage[] =
    "usage: strata-server --state-dir DIR --model mlp|cnn|resnet|ARCH.json --data DIR [options]\n"
    "       strata-server migrate --state-dir DIR --database URL\n"
    "\n"
    "The Strata federation coordinator: runs rounds of federated averaging over the\n"
    "REST API of schemas/api.md and prints 'strata-server: listening on\n"
    "http://HOST:PORT' once ready. SIGINT or SIGTERM stops it cleanly; a restart\n"
    "with the same --state-dir resumes the run.\n"
    "\n"
    "migrate copies the SQLite store of a stopped coordinator's --state-dir into the\n"
    "empty store of a PostgreSQL --database and checks every payload; the run then\n"
    "continues with both options given (the checkpoints stay in --state-dir).\n"
    "\n"
    "  --config FILE.json        a JSON object with any of the keys below in snake_case\n"
    "                            (\"clients_per_round\": 10); options given here override it\n"
    "  --state-dir DIR           durable state (SQLite, updates, checkpoints); required\n"
    "  --database URL            keep the whole store (clients, rounds, updates,\n"
    "                            counters, checkpoint files) in this PostgreSQL database\n"
    "                            (a libpq URI or connection string) instead of SQLite in\n"
    "                            --state-dir, which is then a cache (none: SQLite)\n"
    "  --lease SECONDS           with --database: a coordinator leads the store while\n"
    "                            its lease runs; another one started on the same\n"
    "                            database waits as a standby (not listening) and takes\n"
    "                            over when the leader's process ends, or this long after\n"
    "                            its last renewal (10)\n"
    "  --coordinator-name NAME   this coordinator's name as a leader (HOST:PID)\n"
    "  --model SPEC              mlp, cnn, resnet or an architecture JSON file; required\n"
    "  --data DIR                data set directory; its test split is the held-out set; required\n"
    "  --host ADDR               IPv4 address to bind (127.0.0.1)\n"
    "  --port N                  TCP port, 0 picks a free one (0)\n"
    "  --rounds T                rounds to run (30)\n"
    "  --min-clients N           registered clients needed before a round opens (2)\n"
    "  --clients-per-round N     clients sampled per round (default: all registered)\n"
    "  --fraction F              or: this fraction of the registered clients, in (0, 1]\n"
    "  --round-deadline SECONDS  round deadline (60); a round closes when every selected\n"
    "                            client answered (an update, or a skip), or at the deadline;\n"
    "                            with fewer than --min-updates updates then, it closes as\n"
    "                            failed (the model unchanged) and the next round opens\n"
    "  --min-updates N           updates a round needs to move the model (1)\n"
    "  --over-select F           select this fraction more clients than the round needs\n"
    "                            and close it once max(--min-updates, the clients it\n"
    "                            needs) updates arrived, without waiting for stragglers (0)\n"
    "  --straggler-rounds N      a selected client that missed a deadline is not selected\n"
    "                            for the next N rounds while others can be (2)\n"
    "  --policy SPEC             budget policy: uniform, legacy-layer, legacy-phase, legacy,\n"
    "                            legacy-ref, lgreco, JSON, @file.json, a compressor (topk,\n"
    "                            randk, fp16, bf16, sign, qsgd:L, powersgd:R: uniform with\n"
    "                            it), or none (dense) (uniform)\n"
    "  --density D               target mean density, (0, 1] (0.01)\n"
    "  --values F                values format of uploads: fp32, fp16, bf16, int8 or\n"
    "                            ternary (the last two for topk and randk) (fp32)\n"
    "  --downlink SPEC           downlink compression: none (every client downloads the\n"
    "                            whole model, default) or a compressor spec as for\n"
    "                            --policy (fp16, bf16, topk:D[:VALUES], qsgd:L, ...):\n"
    "                            each round's change is published once as a delta with\n"
    "                            server-side error feedback (docs/algorithm.md)\n"
    "  --downlink-keep K         deltas kept for clients that fell behind: the last K,\n"
    "                            or with 0 (default) every delta that a chain smaller\n"
    "                            than the snapshot can still use\n"
    "  --local-epochs N          client epochs per round (1)\n"
    "  --batch N                 client batch size (32)\n"
    "  --lr X                    client learning rate (0.05)\n"
    "  --momentum X              client SGD momentum (0)\n"
    "  --weight-decay X          client weight decay (0)\n"
    "  --prox-mu X               FedProx proximal term (0)\n"
    "  --max-steps N             client step cap per round, 0 = none (0)\n"
    "  --server-opt NAME         plain, fedavgm, fedadam, fedyogi (plain)\n"
    "  --server-lr X             server learning rate (0: the optimiser's default: 1 for\n"
    "                            plain and fedavgm, 0.05 for fedadam and fedyogi)\n"
    "  --server-lr-final X       move the server rate from --server-lr to X along a half\n"
    "                            cosine over the --rounds server steps; 0 keeps it\n"
    "                            constant (0)\n"
    "  --seed S                  seed of the initial model, sampling and task seeds (1)\n"
    "  --threads N               threads for evaluation (1)\n"
    "  --eval-samples N          evaluate every round but the last on N test images spread\n"
    "                            evenly over the test set (the last on all); 0 = all (0)\n"
    "  --http-threads N          threads serving requests (4); an upload waiting for its\n"
    "                            group commit suspends its connection, not a thread\n"
    "  --aggregator NAME         fedavg, trimmed-mean or median (fedavg); the last two\n"
    "                            are coordinate-wise and ignore sample counts\n"
    "  --trim-fraction F         trimmed-mean: fraction cut at each end, [0, 0.5) (0.1)\n"
    "  --clip-norm C             scale every update to an L2 norm of at most C; 0 = off (0)\n"
    "  --screen-factor F         at close, with at least 3 updates, quarantine (keep stored,\n"
    "                            leave out of the aggregate) every update whose L2 norm is\n"
    "                            above F times the round's median norm; 0 = off, else >= 1\n"
    "                            (10); any aggregator\n"
    "\n"
    "Security (schemas/api.md, docs/operations.md):\n"
    "  --enrolment-secret S      secret a client must present to register; required\n"
    "  --enrolment-secret-file F or: read it from file F (first line)\n"
    "  --admin-token-file F      admin bearer token file; created with a random token\n"
    "                            when missing (default STATE_DIR/admin.token)\n"
    "  --tls-cert FILE           serve HTTPS with this PEM certificate (chain)\n"
    "  --tls-key FILE            and this PEM private key\n"
    "\n"
    "Limits (each refusal is a JSON error counted in /metrics):\n"
    "  --max-body-bytes N        largest update upload (default: from the model size)\n"
    "  --max-json-bytes N        largest JSON request body (65536)\n"
    "  --max-json-depth N        deepest JSON nesting (16)\n"
    "  --max-connections N       concurrent connections (1024)\n"
    "  --connection-timeout S    idle seconds before a connection is closed (30)\n"
    "  --request-timeout S       seconds to receive one whole request (120)\n"
    "  --max-clients N           registered clients (100000)\n"
    "  --data-shares N           give the first N clients data shares 0..N-1 at\n"
    "                            registration and refuse more (0: off, default)\n"
    "  --upload-rate N           uploads per client per minute (30)\n"
    "  --enrolment-rate N        wrong enrolment secrets per address per minute (10)\n"
    "\n"
    "Logging:\n"
    "  --log-format text|json    text lines (default), or one JSON object a line\n"
    "  --log-level L             debug, info (default), warn or error\n"
    "  --help                    this text\n";

/* The options: the keys of the JSON file and, in kebab-case, the command
 * line. Their descriptions are in srv_config_usage above (kept by hand for
 * its sections; a unit test checks that it names every key). */
#define OFF(f) offsetof(srv_config, f)
static const strata_opt OPTS[] = {
    {"state_dir", STRATA_OPT_STRING, OFF(state_dir), 0, 0, "DIR", NULL},
    {"database", STRATA_OPT_STRING, OFF(database), 0, 0, "URL", NULL},
    {"coordinator_name", STRATA_OPT_STRING, OFF(coordinator_name), 0, 0, "NAME", NULL},
    {"lease", STRATA_OPT_DOUBLE, OFF(lease), 1.0, 3600.0, "SECONDS", NULL},
    {"model", STRATA_OPT_STRING, OFF(model), 0, 0, "mlp|cnn|resnet|ARCH.json", NULL},
    {"data", STRATA_OPT_STRING, OFF(data), 0, 0, "DIR", NULL},
    {"host", STRATA_OPT_STRING, OFF(host), 0, 0, "ADDR", NULL},
    {"port", STRATA_OPT_INTEGER, OFF(port), 0, 65535, "N", NULL},
    {"rounds", STRATA_OPT_INTEGER, OFF(rounds), 1, 1000000, "T", NULL},
    {"min_clients", STRATA_OPT_INTEGER, OFF(min_clients), 1, 1000000, "N", NULL},
    {"clients_per_round", STRATA_OPT_INTEGER, OFF(clients_per_round), 1, 1000000, "N", NULL},
    {"fraction", STRATA_OPT_DOUBLE, OFF(fraction), 1e-9, 1, "F", NULL},
    {"round_deadline", STRATA_OPT_DOUBLE, OFF(round_deadline), 0.001, 86400.0 * 30, "SECONDS",
     NULL},
    {"min_updates", STRATA_OPT_INTEGER, OFF(min_updates), 1, 1000000, "N", NULL},
    {"over_select", STRATA_OPT_DOUBLE, OFF(over_select), 0, 10, "F", NULL},
    {"straggler_rounds", STRATA_OPT_INTEGER, OFF(straggler_rounds), 0, 1000000, "N", NULL},
    {"policy", STRATA_OPT_STRING, OFF(policy), 0, 0, "SPEC", NULL},
    {"density", STRATA_OPT_DOUBLE, OFF(density), 1e-12, 1, "D", NULL},
    {"values", STRATA_OPT_STRING, OFF(values), 0, 0, "F", NULL},
    {"downlink", STRATA_OPT_STRING, OFF(downlink), 0, 0, "SPEC", NULL},
    {"downlink_keep", STRATA_OPT_INTEGER, OFF(downlink_keep), 0, 4096, "K", NULL},
    {"local_epochs", STRATA_OPT_INTEGER, OFF(local_epochs), 1, 1000, "N", NULL},
    {"batch", STRATA_OPT_INTEGER, OFF(batch), 1, 1 << 20, "N", NULL},
    {"lr", STRATA_OPT_DOUBLE, OFF(lr), 0, 1e6, "X", NULL},
    {"momentum", STRATA_OPT_DOUBLE, OFF(momentum), 0, 0.999999, "X", NULL},
    {"weight_decay", STRATA_OPT_DOUBLE, OFF(weight_decay), 0, 1e6, "X", NULL},
    {"prox_mu", STRATA_OPT_DOUBLE, OFF(prox_mu), 0, 1e6, "X", NULL},
    {"max_steps", STRATA_OPT_INTEGER, OFF(max_steps), 0, 1L << 40, "N", NULL},
    {"server_opt", STRATA_OPT_STRING, OFF(server_opt), 0, 0, "NAME", NULL},
    {"server_lr", STRATA_OPT_DOUBLE, OFF(server_lr), 0, 1e6, "X", NULL},
    {"server_lr_final", STRATA_OPT_DOUBLE, OFF(server_lr_final), 0, 1e6, "X", NULL},
    {"seed", STRATA_OPT_INTEGER, OFF(seed), 0, 9007199254740991.0, "S", NULL},
    {"threads", STRATA_OPT_INTEGER, OFF(threads), 1, 1024, "N", NULL},
    {"eval_samples", STRATA_OPT_INTEGER, OFF(eval_samples), 0, 1e9, "N", NULL},
    {"http_threads", STRATA_OPT_INTEGER, OFF(http_threads), 1, 1024, "N", NULL},
    {"aggregator", STRATA_OPT_STRING, OFF(aggregator), 0, 0, "NAME", NULL},
    {"trim_fraction", STRATA_OPT_DOUBLE, OFF(trim_fraction), 0, 0.499999, "F", NULL},
    {"clip_norm", STRATA_OPT_DOUBLE, OFF(clip_norm), 0, 1e30, "C", NULL},
    {"screen_factor", STRATA_OPT_DOUBLE, OFF(screen_factor), 0, 1e9, "F", NULL},
    {"enrolment_secret", STRATA_OPT_STRING, OFF(enrolment_secret), 0, 0, "S", NULL},
    {"enrolment_secret_file", STRATA_OPT_STRING, OFF(enrolment_secret_file), 0, 0, "F", NULL},
    {"admin_token_file", STRATA_OPT_STRING, OFF(admin_token_file), 0, 0, "F", NULL},
    {"tls_cert", STRATA_OPT_STRING, OFF(tls_cert), 0, 0, "FILE", NULL},
    {"tls_key", STRATA_OPT_STRING, OFF(tls_key), 0, 0, "FILE", NULL},
    {"max_body_bytes", STRATA_OPT_INTEGER, OFF(max_body_bytes), 1024, (double)(1L << 40), "N",
     NULL},
    {"max_json_bytes", STRATA_OPT_INTEGER, OFF(max_json_bytes), 256, 1 << 24, "N", NULL},
    {"max_json_depth", STRATA_OPT_INTEGER, OFF(max_json_depth), 2, 1000, "N", NULL},
    {"max_connections", STRATA_OPT_INTEGER, OFF(max_connections), 4, 65536, "N", NULL},
    {"connection_timeout", STRATA_OPT_INTEGER, OFF(connection_timeout), 1, 86400, "S", NULL},
    {"request_timeout", STRATA_OPT_INTEGER, OFF(request_timeout), 1, 86400, "S", NULL},
    {"max_clients", STRATA_OPT_INTEGER, OFF(max_clients), 1, 1000000, "N", NULL},
    {"data_shares", STRATA_OPT_INTEGER, OFF(data_shares), 0, 1000000, "N", NULL},
    {"upload_rate", STRATA_OPT_INTEGER, OFF(upload_rate), 1, 1000000, "N", NULL},
    {"enrolment_rate", STRATA_OPT_INTEGER, OFF(enrolment_rate), 1, 1000000, "N", NULL},
    {"log_format", STRATA_OPT_STRING, OFF(log_format), 0, 0, "text|json", NULL},
    {"log_level", STRATA_OPT_STRING, OFF(log_level), 0, 0, "debug|info|warn|error", NULL},
};
#define NOPTS (sizeof(OPTS) / sizeof(OPTS[0]))

void srv_config_init(srv_config *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
    cfg->host = strdup("127.0.0.1");
    cfg->policy = strdup("uniform");
    cfg->server_opt = strdup("plain");
    cfg->values = strdup("fp32");
    cfg->downlink = strdup("none");
    cfg->downlink_keep = 0;
    cfg->rounds = 30;
    cfg->min_clients = 2;
    cfg->round_deadline = 60;
    cfg->lease = 10;
    cfg->min_updates = 1;
    cfg->straggler_rounds = 2;
    cfg->density = 0.01;
    cfg->local_epochs = 1;
    cfg->batch = 32;
    cfg->lr = 0.05;
    cfg->server_lr = 0; /* the optimiser's default */
    cfg->seed = 1;
    cfg->threads = 1;
    cfg->http_threads = 4;
    cfg->aggregator = strdup("fedavg");
    cfg->trim_fraction = 0.1;
    cfg->screen_factor = 10;
    cfg->max_json_bytes = 65536;
    cfg->max_json_depth = 16;
    cfg->max_connections = 1024;
    cfg->connection_timeout = 30;
    cfg->request_timeout = 120;
    cfg->max_clients = 100000;
    cfg->upload_rate = 30;
    cfg->enrolment_rate = 10;
    cfg->log_format = strdup("text");
    cfg->log_level = strdup("info");
}

void srv_config_cleanup(srv_config *cfg)
{
    strata_opts_cleanup(OPTS, NOPTS, cfg);
}

/* Applies the JSON config file at path; messages start with its path. */
static int load_file(srv_config *cfg, const char *path, strata_diag *d)
{
    uint8_t *data = NULL;
    size_t len = 0;
    int rc = strata_file_read_all(path, STRATA_OPTS_JSON_MAX, &data, &len, d);
    if (rc == STRATA_ESTATE || rc == STRATA_ETOOBIG)
        rc = strata_diag_set(d, STRATA_EINVAL, "config %s: %s", path,
                             rc == STRATA_ESTATE ? "no such file" : "too large");
    if (rc == STRATA_OK)
        rc = strata_opts_apply_json(OPTS, NOPTS, (const char *)data, len, cfg, d);
    if (rc < 0 && d != NULL && strncmp(d->msg, "config: ", 8) == 0) {
        strata_diag inner = *d;
        strata_diag_set(d, rc, "config %s: %s", path, inner.msg + 8);
    }
    free(data);
    return rc;
}

/* Reads the first line of path (at most 256 bytes of printable ASCII) as
 * the enrolment secret. */
static int read_secret_file(srv_config *cfg, strata_diag *d)
{
    char line[SRV_SECRET_MAX + 2];
    size_t n = 0;
    int rc = strata_file_read_line(cfg->enrolment_secret_file, line, sizeof(line), &n, d);
    int ok = rc == 0 && n > 0;
    for (size_t i = 0; ok && i < n; i++)
        ok = line[i] >= 0x20 && line[i] < 0x7f;
    if (!ok)
        return strata_diag_set(d, rc == STRATA_ESTATE ? STRATA_EIO : STRATA_EINVAL,
                               "enrolment_secret_file: %s: %s", cfg->enrolment_secret_file,
                               rc == STRATA_ESTATE || rc == STRATA_EIO
                                   ? "cannot be read"
                                   : "the first line must be 1 to 256 printable ASCII characters");
    char *s = strdup(line);
    if (s == NULL)
        return STRATA_ENOMEM;
    free(cfg->enrolment_secret);
    cfg->enrolment_secret = s;
    return 0;
}

static int check(srv_config *cfg, strata_diag *d)
{
    if (cfg->state_dir == NULL || cfg->model == NULL || cfg->data == NULL)
        return strata_diag_set(d, STRATA_EINVAL, "%s: required",
                               cfg->state_dir == NULL ? "state_dir"
                               : cfg->model == NULL   ? "model"
                                                      : "data");
    if (cfg->clients_per_round > 0 && cfg->fraction > 0)
        return strata_diag_set(d, STRATA_EINVAL,
                               "clients_per_round: give either clients_per_round or fraction");
    if (strata_values_format_parse(cfg->values, &cfg->values_format) < 0)
        return strata_diag_set(d, STRATA_EINVAL,
                               "values: expected fp32, fp16, bf16, int8 or ternary, got '%s'",
                               cfg->values);
    cfg->downlink_on = strcmp(cfg->downlink, "none") != 0;
    if (cfg->downlink_on) {
        strata_diag bd = {{0}};
        if (strata_budget_parse(cfg->downlink, 1, &cfg->downlink_budget, &bd) < 0)
            return strata_diag_set(d, STRATA_EINVAL, "downlink: %s", bd.msg);
    }
    if (strata_log_parse_format(cfg->log_format, &cfg->log_format_value, NULL) < 0)
        return strata_diag_set(d, STRATA_EINVAL, "log_format: expected text or json, got '%s'",
                               cfg->log_format);
    if (strata_log_parse_level(cfg->log_level, &cfg->log_level_value, NULL) < 0)
        return strata_diag_set(d, STRATA_EINVAL,
                               "log_level: expected debug, info, warn or error, got '%s'",
                               cfg->log_level);
    strata_server_opt_config oc;
    if (strata_server_opt_parse(cfg->server_opt, &oc, NULL) < 0)
        return strata_diag_set(d, STRATA_EINVAL,
                               "server_opt: expected plain, fedavgm, fedadam or fedyogi, got '%s'",
                               cfg->server_opt);
    strata_robust_method method;
    if (strata_robust_parse(cfg->aggregator, &method, NULL) < 0)
        return strata_diag_set(d, STRATA_EINVAL,
                               "aggregator: expected fedavg, trimmed-mean or median, got '%s'",
                               cfg->aggregator);
    if (cfg->screen_factor > 0 && cfg->screen_factor < 1)
        return strata_diag_set(d, STRATA_EINVAL,
                               "screen_factor: %g would quarantine updates below the median norm; "
                               "give 0 (off) or at least 1",
                               cfg->screen_factor);
    if ((cfg->tls_cert == NULL) != (cfg->tls_key == NULL))
        return strata_diag_set(d, STRATA_EINVAL, "%s: required with %s",
                               cfg->tls_cert ? "tls_key" : "tls_cert",
                               cfg->tls_cert ? "tls_cert" : "tls_key");
    if (cfg->enrolment_secret != NULL && cfg->enrolment_secret_file != NULL)
        return strata_diag_set(d, STRATA_EINVAL,
                               "enrolment_secret: give either enrolment_secret or "
                               "enrolment_secret_file");
    if (cfg->enrolment_secret_file != NULL) {
        int rc = read_secret_file(cfg, d);
        if (rc < 0)
            return rc;
    }
    if (cfg->enrolment_secret == NULL)
        return strata_diag_set(d, STRATA_EINVAL,
                               "enrolment_secret: required (or enrolment_secret_file): clients "
                               "present it to register");
    size_t n = strlen(cfg->enrolment_secret);
    if (n == 0 || n > SRV_SECRET_MAX)
        return strata_diag_set(d, STRATA_EINVAL, "enrolment_secret: 1 to %d characters",
                               SRV_SECRET_MAX);
    return 0;
}

int srv_config_parse(srv_config *cfg, int argc, char **argv, strata_diag *d)
{
    /* --help wins wherever it is; --config is read first, whatever its place,
     * and is not a key of the file itself. */
    const char *file = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0)
            return 1;
        if (strcmp(argv[i], "--config") == 0) {
            if (i + 1 >= argc)
                return strata_diag_set(d, STRATA_EINVAL, "--config: missing value");
            file = argv[++i];
        } else if (strncmp(argv[i], "--config=", 9) == 0) {
            file = argv[i] + 9;
        }
    }
    int rc;
    if (file != NULL && (rc = load_file(cfg, file, d)) < 0)
        return rc;
    char **rest = malloc(((size_t)argc + 1) * sizeof(*rest));
    if (rest == NULL)
        return STRATA_ENOMEM;
    int n = 0;
    for (int i = 0; i < argc; i++) {
        if (i > 0 && strcmp(argv[i], "--config") == 0)
            i++;
        else if (i == 0 || strncmp(argv[i], "--config=", 9) != 0)
            rest[n++] = argv[i];
    }
    rest[n] = NULL;
    int help = 0;
    rc = strata_opts_parse_argv(OPTS, NOPTS, n, rest, cfg, &help, d);
    if (rc >= 0 && rc < n)
        rc = strata_diag_set(d, STRATA_EINVAL, "unexpected argument '%s'", rest[rc]);
    free(rest);
    if (rc < 0)
        return rc;
    return check(cfg, d);
}

int srv_config_usage_check(strata_diag *d)
{
    for (size_t i = 0; i < NOPTS; i++) {
        char want[80];
        int w = snprintf(want, sizeof(want), "  --%s ", OPTS[i].key);
        for (int j = 4; j < w; j++)
            if (want[j] == '_')
                want[j] = '-';
        if (strstr(srv_config_usage, want) == NULL)
            return strata_diag_set(d, STRATA_EINVAL, "the usage text does not describe --%s",
                                   OPTS[i].key);
    }
    return STRATA_OK;
}

/* Keys left out of the public view: where files are, and credentials. */
static int is_private(const char *key)
{
    static const char *const keys[] = {
        "state_dir",        "database", "data",   "enrolment_secret_file",
        "admin_token_file", "tls_cert", "tls_key"};
    for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++)
        if (strcmp(key, keys[i]) == 0)
            return 1;
    return 0;
}

char *srv_config_json(const srv_config *cfg, int full)
{
    json_t *o = json_object();
    if (o == NULL)
        return NULL;
    for (size_t i = 0; i < NOPTS; i++) {
        const strata_opt *od = &OPTS[i];
        const char *p = (const char *)cfg + od->offset;
        json_t *v;
        if (!full && is_private(od->key))
            continue;
        if (strcmp(od->key, "enrolment_secret") == 0)
            v = json_boolean(cfg->enrolment_secret != NULL);
        else if (od->kind == STRATA_OPT_STRING)
            v = *(char *const *)p ? json_string(*(char *const *)p) : json_null();
        else if (od->kind == STRATA_OPT_INTEGER)
            v = *(const long *)p == 0 && od->min > 0 ? json_null() : json_integer(*(const long *)p);
        else
            v = *(const double *)p == 0 && od->min > 0 ? json_null()
                                                       : json_real(*(const double *)p);
        json_object_set_new(o, od->key, v);
    }
    char *s = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(o);
    return s;
}
