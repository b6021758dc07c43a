/* strata-server configuration parsing (see config.h). */
#include "config.h"

#include "aggregate.h"
#include "robust.h"

#include "strata/fileio.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char srv_config_usage[] =
    "usage: strata-server --state-dir DIR --model mlp|cnn|ARCH.json --data DIR [options]\n"
    "\n"
    "The Strata federation coordinator: runs rounds of federated averaging over the\n"
    "REST API of schemas/api.md and prints 'strata-server: listening on\n"
    "http://HOST:PORT' once ready. SIGINT or SIGTERM stops it cleanly; a restart\n"
    "with the same --state-dir resumes the run.\n"
    "\n"
    "  --config FILE.json        a JSON object with any of the keys below in snake_case\n"
    "                            (\"clients_per_round\": 10); options given here override it\n"
    "  --state-dir DIR           durable state (SQLite, updates, checkpoints); required\n"
    "  --model SPEC              mlp, cnn or an architecture JSON file; required\n"
    "  --data DIR                data set directory; its test split is the held-out set; required\n"
    "  --host ADDR               IPv4 address to bind (127.0.0.1)\n"
    "  --port N                  TCP port, 0 picks a free one (0)\n"
    "  --rounds T                rounds to run (30)\n"
    "  --min-clients N           registered clients needed before a round opens (2)\n"
    "  --clients-per-round N     clients sampled per round (default: all registered)\n"
    "  --fraction F              or: this fraction of the registered clients, in (0, 1]\n"
    "  --round-deadline SECONDS  round deadline (60); a round closes when every selected\n"
    "                            client reported, or when the deadline passed and at least\n"
    "                            --min-updates arrived (otherwise it keeps waiting)\n"
    "  --min-updates N           updates needed to close a round at its deadline (1)\n"
    "  --policy SPEC             budget policy: uniform, legacy-layer, legacy-phase, legacy,\n"
    "                            lgreco, JSON, @file.json, or none (dense) (uniform)\n"
    "  --density D               target mean density, (0, 1] (0.01)\n"
    "  --values fp32|fp16|bf16   values format of uploads (fp32)\n"
    "  --local-epochs N          client epochs per round (1)\n"
    "  --batch N                 client batch size (32)\n"
    "  --lr X                    client learning rate (0.05)\n"
    "  --momentum X              client SGD momentum (0)\n"
    "  --weight-decay X          client weight decay (0)\n"
    "  --prox-mu X               FedProx proximal term (0)\n"
    "  --max-steps N             client step cap per round, 0 = none (0)\n"
    "  --server-opt NAME         plain, fedavgm, fedadam, fedyogi (plain)\n"
    "  --server-lr X             server learning rate (1)\n"
    "  --seed S                  seed of the initial model, sampling and task seeds (1)\n"
    "  --threads N               threads for evaluation (1)\n"
    "  --http-threads N          threads serving requests (16); uploads wait for the disk\n"
    "                            (fsync) in them, so more threads overlap more uploads\n"
    "  --aggregator NAME         fedavg, trimmed-mean or median (fedavg); the last two\n"
    "                            are coordinate-wise and ignore sample counts\n"
    "  --trim-fraction F         trimmed-mean: fraction cut at each end, [0, 0.5) (0.1)\n"
    "  --clip-norm C             scale every update to an L2 norm of at most C; 0 = off (0)\n"
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
    "  --upload-rate N           uploads per client per minute (30)\n"
    "  --help                    this text\n";

typedef enum { K_STR, K_INT, K_DBL } kind;

typedef struct opt_desc {
    const char *key;
    kind k;
    size_t off;
    double min, max;
} opt_desc;

#define OFF(f) offsetof(srv_config, f)
static const opt_desc OPTS[] = {
    {"state_dir", K_STR, OFF(state_dir), 0, 0},
    {"model", K_STR, OFF(model), 0, 0},
    {"data", K_STR, OFF(data), 0, 0},
    {"host", K_STR, OFF(host), 0, 0},
    {"port", K_INT, OFF(port), 0, 65535},
    {"rounds", K_INT, OFF(rounds), 1, 1000000},
    {"min_clients", K_INT, OFF(min_clients), 1, 1000000},
    {"clients_per_round", K_INT, OFF(clients_per_round), 1, 1000000},
    {"fraction", K_DBL, OFF(fraction), 1e-9, 1},
    {"round_deadline", K_DBL, OFF(round_deadline), 0.001, 86400.0 * 30},
    {"min_updates", K_INT, OFF(min_updates), 1, 1000000},
    {"policy", K_STR, OFF(policy), 0, 0},
    {"density", K_DBL, OFF(density), 1e-12, 1},
    {"values", K_STR, OFF(values), 0, 0},
    {"local_epochs", K_INT, OFF(local_epochs), 1, 1000},
    {"batch", K_INT, OFF(batch), 1, 1 << 20},
    {"lr", K_DBL, OFF(lr), 0, 1e6},
    {"momentum", K_DBL, OFF(momentum), 0, 0.999999},
    {"weight_decay", K_DBL, OFF(weight_decay), 0, 1e6},
    {"prox_mu", K_DBL, OFF(prox_mu), 0, 1e6},
    {"max_steps", K_INT, OFF(max_steps), 0, 1L << 40},
    {"server_opt", K_STR, OFF(server_opt), 0, 0},
    {"server_lr", K_DBL, OFF(server_lr), 1e-12, 1e6},
    {"seed", K_INT, OFF(seed), 0, 9007199254740991.0},
    {"threads", K_INT, OFF(threads), 1, 1024},
    {"http_threads", K_INT, OFF(http_threads), 1, 1024},
    {"aggregator", K_STR, OFF(aggregator), 0, 0},
    {"trim_fraction", K_DBL, OFF(trim_fraction), 0, 0.499999},
    {"clip_norm", K_DBL, OFF(clip_norm), 0, 1e30},
    {"enrolment_secret", K_STR, OFF(enrolment_secret), 0, 0},
    {"enrolment_secret_file", K_STR, OFF(enrolment_secret_file), 0, 0},
    {"admin_token_file", K_STR, OFF(admin_token_file), 0, 0},
    {"tls_cert", K_STR, OFF(tls_cert), 0, 0},
    {"tls_key", K_STR, OFF(tls_key), 0, 0},
    {"max_body_bytes", K_INT, OFF(max_body_bytes), 1024, (double)(1L << 40)},
    {"max_json_bytes", K_INT, OFF(max_json_bytes), 256, 1 << 24},
    {"max_json_depth", K_INT, OFF(max_json_depth), 2, 1000},
    {"max_connections", K_INT, OFF(max_connections), 4, 65536},
    {"connection_timeout", K_INT, OFF(connection_timeout), 1, 86400},
    {"request_timeout", K_INT, OFF(request_timeout), 1, 86400},
    {"max_clients", K_INT, OFF(max_clients), 1, 1000000},
    {"upload_rate", K_INT, OFF(upload_rate), 1, 1000000},
};
#define NOPTS (sizeof(OPTS) / sizeof(OPTS[0]))

void srv_config_init(srv_config *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
    cfg->host = strdup("127.0.0.1");
    cfg->policy = strdup("uniform");
    cfg->server_opt = strdup("plain");
    cfg->values = strdup("fp32");
    cfg->rounds = 30;
    cfg->min_clients = 2;
    cfg->round_deadline = 60;
    cfg->min_updates = 1;
    cfg->density = 0.01;
    cfg->local_epochs = 1;
    cfg->batch = 32;
    cfg->lr = 0.05;
    cfg->server_lr = 1;
    cfg->seed = 1;
    cfg->threads = 1;
    cfg->http_threads = 16;
    cfg->aggregator = strdup("fedavg");
    cfg->trim_fraction = 0.1;
    cfg->max_json_bytes = 65536;
    cfg->max_json_depth = 16;
    cfg->max_connections = 1024;
    cfg->connection_timeout = 30;
    cfg->request_timeout = 120;
    cfg->max_clients = 100000;
    cfg->upload_rate = 30;
}

void srv_config_cleanup(srv_config *cfg)
{
    for (size_t i = 0; i < NOPTS; i++)
        if (OPTS[i].k == K_STR) {
            char **p = (char **)((char *)cfg + OPTS[i].off);
            free(*p);
            *p = NULL;
        }
}

static const opt_desc *find_opt(const char *key)
{
    for (size_t i = 0; i < NOPTS; i++)
        if (strcmp(OPTS[i].key, key) == 0)
            return &OPTS[i];
    return NULL;
}

static int set_str(srv_config *cfg, const opt_desc *o, const char *v, strata_diag *d)
{
    if (o->k != K_STR)
        return strata_diag_set(d, STRATA_EINVAL, "%s: expected a string", o->key);
    char *s = strdup(v);
    if (s == NULL)
        return STRATA_ENOMEM;
    char **p = (char **)((char *)cfg + o->off);
    free(*p);
    *p = s;
    return 0;
}

static int set_num(srv_config *cfg, const opt_desc *o, double v, strata_diag *d)
{
    if (!isfinite(v) || v < o->min || v > o->max)
        return strata_diag_set(d, STRATA_EINVAL, "%s: %g is outside [%g, %g]", o->key, v, o->min,
                               o->max);
    if (o->k == K_INT) {
        if (v != floor(v))
            return strata_diag_set(d, STRATA_EINVAL, "%s: expected an integer, got %g", o->key, v);
        *(long *)((char *)cfg + o->off) = (long)v;
    } else {
        *(double *)((char *)cfg + o->off) = v;
    }
    return 0;
}

/* Sets a key from command-line text. */
static int set_text(srv_config *cfg, const opt_desc *o, const char *v, strata_diag *d)
{
    if (o->k == K_STR)
        return set_str(cfg, o, v, d);
    char *end = NULL;
    errno = 0;
    double x = strtod(v, &end);
    if (*v == '\0' || end == v || *end != '\0' || errno != 0)
        return strata_diag_set(d, STRATA_EINVAL, "%s: expected a number, got '%s'", o->key, v);
    return set_num(cfg, o, x, d);
}

static int load_file(srv_config *cfg, const char *path, strata_diag *d)
{
    json_error_t je;
    json_t *root = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
    if (root == NULL)
        return strata_diag_set(d, STRATA_EINVAL, "config %s: line %d: %s", path, je.line, je.text);
    int rc = 0;
    if (!json_is_object(root)) {
        rc = strata_diag_set(d, STRATA_EINVAL, "config %s: expected a JSON object", path);
        goto out;
    }
    const char *key;
    json_t *v;
    json_object_foreach(root, key, v)
    {
        const opt_desc *o = find_opt(key);
        if (o == NULL) {
            rc = strata_diag_set(d, STRATA_EINVAL, "config %s: unknown key \"%s\"", path, key);
            goto out;
        }
        if (o->k == K_STR) {
            if (!json_is_string(v)) {
                rc = strata_diag_set(d, STRATA_EINVAL, "config %s: %s: expected a string", path,
                                     key);
                goto out;
            }
            rc = set_str(cfg, o, json_string_value(v), d);
        } else {
            if (!json_is_number(v) || (o->k == K_INT && !json_is_integer(v))) {
                rc = strata_diag_set(d, STRATA_EINVAL, "config %s: %s: expected %s", path, key,
                                     o->k == K_INT ? "an integer" : "a number");
                goto out;
            }
            rc = set_num(cfg, o, json_number_value(v), d);
        }
        if (rc < 0)
            goto out;
    }
out:
    json_decref(root);
    return rc;
}

/* Resolves an argument "--kebab-key[=value]" to its descriptor. */
static const opt_desc *arg_opt(const char *arg, char *key, size_t keylen)
{
    size_t n = strcspn(arg + 2, "=");
    if (n + 1 > keylen)
        return NULL;
    for (size_t i = 0; i < n; i++)
        key[i] = arg[2 + i] == '-' ? '_' : arg[2 + i];
    key[n] = '\0';
    return find_opt(key);
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
    if (strcmp(cfg->values, "fp32") == 0)
        cfg->values_format = STRATA_VALUES_FP32;
    else if (strcmp(cfg->values, "fp16") == 0)
        cfg->values_format = STRATA_VALUES_FP16;
    else if (strcmp(cfg->values, "bf16") == 0)
        cfg->values_format = STRATA_VALUES_BF16;
    else
        return strata_diag_set(d, STRATA_EINVAL, "values: expected fp32, fp16 or bf16, got '%s'",
                               cfg->values);
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
    const char *file = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0)
            return 1;
        if (strcmp(argv[i], "--config") == 0) {
            if (i + 1 >= argc)
                return strata_diag_set(d, STRATA_EINVAL, "config: missing value");
            file = argv[++i];
        } else if (strncmp(argv[i], "--config=", 9) == 0) {
            file = argv[i] + 9;
        }
    }
    int rc;
    if (file != NULL && (rc = load_file(cfg, file, d)) < 0)
        return rc;
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        if (strncmp(arg, "--", 2) != 0)
            return strata_diag_set(d, STRATA_EINVAL, "unexpected argument '%s'", arg);
        char key[64];
        const char *eq = strchr(arg, '=');
        if (strcmp(arg, "--config") == 0) {
            i++;
            continue;
        }
        if (strncmp(arg, "--config=", 9) == 0)
            continue;
        const opt_desc *o = arg_opt(arg, key, sizeof(key));
        if (o == NULL)
            return strata_diag_set(d, STRATA_EINVAL, "unknown option '%s'", arg);
        const char *val;
        if (eq != NULL) {
            val = eq + 1;
        } else {
            if (i + 1 >= argc)
                return strata_diag_set(d, STRATA_EINVAL, "%s: missing value", o->key);
            val = argv[++i];
        }
        if ((rc = set_text(cfg, o, val, d)) < 0)
            return rc;
    }
    return check(cfg, d);
}

/* Keys left out of the public view: where files are, and credentials. */
static int is_private(const char *key)
{
    static const char *const keys[] = {"state_dir",        "data",     "enrolment_secret_file",
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
        const opt_desc *od = &OPTS[i];
        const char *p = (const char *)cfg + od->off;
        json_t *v;
        if (!full && is_private(od->key))
            continue;
        if (strcmp(od->key, "enrolment_secret") == 0)
            v = json_boolean(cfg->enrolment_secret != NULL);
        else if (od->k == K_STR)
            v = *(char *const *)p ? json_string(*(char *const *)p) : json_null();
        else if (od->k == K_INT)
            v = json_integer(*(const long *)p);
        else
            v = json_real(*(const double *)p);
        json_object_set_new(o, od->key, v);
    }
    char *s = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(o);
    return s;
}
