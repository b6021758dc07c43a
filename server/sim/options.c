/* strata-sim: its options — its own, and the coordinator and client
 * options it passes through (PASS for the coordinator's, then the clients'
 * residual settings, strata_ef_opt_rows: together they drive both the
 * command line and what reaches the coordinator and the clients); the usage
 * text; saving
 * a run's options to run.json and merging them back for --resume; checking
 * a study run's options. */
#include "sim.h"

#include "strata/fileio.h"
#include "strata/log.h"
#include "strata/ef.h"
#include "strata/opts.h"

#include <jansson.h>
#include <limits.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The options strata-sim passes through unchanged (as --kebab-key VALUE,
 * only when given): every setting that changes the learning. Those of PASS
 * go to the coordinator, which checks their values: a bad one stops it at
 * start with its own message, which strata-sim prints. After them come the
 * clients' residual settings (strata_ef_opt_rows), which go to every client
 * and are checked here first (check_client_opts), so a bad one stops
 * nothing that has started. */
typedef struct pass_opt {
    const char *key, *value, *help;
} pass_opt;
static const pass_opt PASS[] = {
    {"clients_per_round", "N", "clients sampled per round (default: all)"},
    {"fraction", "F", "or: this fraction of the clients per round, in (0, 1]"},
    {"min_updates", "N", "updates a round needs to move the model (1)"},
    {"over_select", "F", "select this fraction more clients and close without stragglers (0)"},
    {"straggler_rounds", "N", "rounds a client that missed a deadline sits out (2)"},
    {"local_epochs", "E", "client epochs per round (1)"},
    {"batch", "B", "client batch size (32)"},
    {"lr", "LR", "client learning rate (0.05)"},
    {"momentum", "X", "client SGD momentum (0)"},
    {"weight_decay", "X", "client weight decay (0)"},
    {"prox_mu", "X", "FedProx proximal term (0)"},
    {"max_steps", "N", "client step cap per round, 0 = none (0)"},
    {"server_opt", "NAME", "plain (default), fedavgm, fedadam or fedyogi"},
    {"server_lr", "X", "server learning rate (0: the optimiser's default)"},
    {"server_lr_final", "X",
     "move the server rate to X along a half cosine over\nthe run; 0 = constant (0)"},
    {"aggregator", "NAME", "fedavg (default), trimmed-mean or median"},
    {"trim_fraction", "F", "trimmed-mean: fraction cut at each end (0.1)"},
    {"clip_norm", "C", "scale every update to an L2 norm of at most C; 0 = off (0)"},
    {"screen_factor", "F", "quarantine updates above F times the median norm; 0 = off (10)"},
    {"downlink", "SPEC",
     "downlink compression: none (default) or a compressor\nspec (fp16, topk:D[:VALUES], ...)"},
    {"downlink_keep", "K",
     "deltas the coordinator keeps for lagging clients: the last K,\nor with 0 (default) all a "
     "chain smaller than the snapshot can use"},
    {"threads", "N", "the coordinator's evaluation threads (1)"},
    {"eval_samples", "N",
     "evaluate every round but the last on N test images\n(the last on all); 0 = all (0)"},
    {"http_threads", "N", "the coordinator's request threads (16)"},
};
#define NSERVER_PASS (sizeof(PASS) / sizeof(PASS[0]))
#define NPASS (NSERVER_PASS + STRATA_EF_NOPTS)
_Static_assert(NPASS == SIM_NPASS, "SIM_NPASS counts the pass-through options");

/* Largest run.json read back. */
#define RUN_JSON_MAX ((size_t)1 << 16)

#define OFF(f) offsetof(sim_opts, f)
/* strata-sim's own options; the table used (opts_table) appends the
 * pass-through options. */
static const strata_opt OWN[] = {
    {"clients", STRATA_OPT_INTEGER, OFF(clients), 1, 1000, "N", "edge clients (10)"},
    {"rounds", STRATA_OPT_INTEGER, OFF(rounds), 1, 100000, "R", "rounds (10)"},
    {"model", STRATA_OPT_STRING, OFF(model), 0, 0, "SPEC",
     "mlp (default), cnn, resnet or ARCH.json"},
    {"data", STRATA_OPT_STRING, OFF(data), 0, 0, "DIR", "data set directory; required"},
    {"partition", STRATA_OPT_STRING, OFF(partition), 0, 0, "SPEC",
     "iid (default), dirichlet:ALPHA or shards:S"},
    {"policy", STRATA_OPT_STRING, OFF(policy), 0, 0, "SPEC",
     "the coordinator's budget policy (uniform): a policy\nname, JSON, @file.json or a compressor "
     "(strata-server\n--help); none: dense FedAvg"},
    {"density", STRATA_OPT_STRING, OFF(density), 0, 0, "D", "target mean density (0.01)"},
    {"values", STRATA_OPT_STRING, OFF(values), 0, 0, "F",
     "values format of uploads: fp32 (default), fp16,\nbf16, int8 or ternary"},
    {"link_up", STRATA_OPT_STRING, OFF(link_up), 0, 0, "RATE",
     "cap each client's uplink at RATE (tc units: 1mbit,\n512kbit): every client runs in its own "
     "network\nnamespace behind a veth pair with tbf (needs root)"},
    {"link_down", STRATA_OPT_STRING, OFF(link_down), 0, 0, "RATE",
     "cap each client's downlink at RATE (as --link-up)"},
    {"target_accuracy", STRATA_OPT_DOUBLE, OFF(target_accuracy), 0, 1, "A",
     "report the time (sum of round durations) until the\ntest accuracy first reaches A"},
    {"round_deadline", STRATA_OPT_INTEGER, OFF(deadline), 1, 86400, "S",
     "round deadline in seconds (120)"},
    {"seed", STRATA_OPT_INTEGER, OFF(seed), 0, (double)LONG_MAX, "S", "seed (1)"},
    {"out", STRATA_OPT_STRING, OFF(out), 0, 0, "DIR", "where the run and its report go (out/sim)"},
    {"resume", STRATA_OPT_FLAG, OFF(resume), 0, 0, NULL,
     "continue the stopped run in --out with its saved options"},
    {"json", STRATA_OPT_FLAG, OFF(json), 0, 0, NULL, "end with a JSON summary line"},
    {"study", STRATA_OPT_STRING, OFF(study), 0, 0, "SPEC.json",
     "run the grid of runs SPEC.json describes into --out, skipping\n"
     "finished runs, then write study.csv, plots and report.md/.html"},
    {"report_from", STRATA_OPT_STRING, OFF(report_from), 0, 0, "DIR",
     "run nothing: write the report of the stopped coordinator\nwhose state directory is DIR"},
    {"data_shares", STRATA_OPT_INTEGER, OFF(data_shares), 0, 1000000, "N",
     "with --report-from: the coordinator's --data-shares\n(adds the clients table)"},
    {"log_format", STRATA_OPT_STRING, OFF(log_format_name), 0, 0, "text|json",
     "text (default) or one JSON object per log line"},
    {"log_level", STRATA_OPT_STRING, OFF(log_level_name), 0, 0, "debug|info|warn|error",
     "the least level logged (info)"},
};
#define NOWN (sizeof(OWN) / sizeof(OWN[0]))
#define NOPTS (NOWN + NPASS)

/* Options that the saved run.json does not hold: they describe this
 * invocation, not the run. */
static int per_invocation(const char *key)
{
    static const char *const KEYS[] = {"out",       "resume", "json",        "log_format",
                                       "log_level", "study",  "report_from", "data_shares"};
    for (size_t i = 0; i < sizeof(KEYS) / sizeof(KEYS[0]); i++)
        if (strcmp(key, KEYS[i]) == 0)
            return 1;
    return 0;
}

/* The only options that go with --study: the rest are the runs' (its
 * spec's) or describe a single run (--resume, --json, --report-from,
 * --data-shares). */
static int with_study(const char *key)
{
    static const char *const KEYS[] = {"study", "out", "log_format", "log_level"};
    for (size_t i = 0; i < sizeof(KEYS) / sizeof(KEYS[0]); i++)
        if (strcmp(key, KEYS[i]) == 0)
            return 1;
    return 0;
}

/* Options a resumed run cannot change: the shards and the clients'
 * identities depend on them. */
static int fixed_on_resume(const char *key)
{
    static const char *const KEYS[] = {"clients", "model", "data", "partition", "seed"};
    for (size_t i = 0; i < sizeof(KEYS) / sizeof(KEYS[0]); i++)
        if (strcmp(key, KEYS[i]) == 0)
            return 1;
    return 0;
}

/* The whole option table: OWN, then one string option per pass-through
 * option (PASS, then strata_ef_opt_rows), which keeps its value as given. */
static const strata_opt *opts_table(void)
{
    static strata_opt table[NOPTS];
    if (table[0].key == NULL) {
        memcpy(table, OWN, sizeof(OWN));
        for (size_t i = 0; i < NPASS; i++) {
            strata_opt *r = &table[NOWN + i];
            if (i < NSERVER_PASS)
                *r = (strata_opt){PASS[i].key, .value = PASS[i].value, .help = PASS[i].help};
            else
                *r = strata_ef_opt_rows[i - NSERVER_PASS];
            r->kind = STRATA_OPT_STRING;
            r->offset = OFF(pass) + i * sizeof(char *);
            r->min = r->max = 0;
        }
    }
    return table;
}

const char *sim_opts_pass_get(const sim_opts *o, const char *key)
{
    for (size_t i = 0; i < NPASS; i++)
        if (strcmp(sim_opts_pass_key(i), key) == 0)
            return o->pass[i];
    return NULL;
}

/* Writes the usage text to f. */
static void usage(FILE *f)
{
    strata_buf b;
    strata_buf_init(&b, 1 << 16);
    fputs("usage: strata-sim --clients N --rounds R --model mlp|cnn|resnet|ARCH.json --data DIR "
          "[options]\n",
          f);
    if (strata_opts_usage(OWN, NOWN, &b) == STRATA_OK)
        fputs((const char *)b.data, f);
    static const char *const heads[2] = {
        "Passed to the coordinator when given (see strata-server --help):\n",
        "Passed to every client when given (see strata-client --help):\n"};
    for (int client = 0; client < 2; client++) {
        strata_opt part[NPASS];
        size_t n = 0;
        for (size_t i = 0; i < NPASS; i++)
            if (sim_opts_pass_client(i) == client)
                part[n++] = opts_table()[NOWN + i];
        strata_buf_cleanup(&b);
        strata_buf_init(&b, 1 << 16);
        fputs(heads[client], f);
        if (strata_opts_usage(part, n, &b) == STRATA_OK)
            fputs((const char *)b.data, f);
    }
    fputs("Writes each client's share of the training set to --out (shards/I), starts\n"
          "strata-server on a free loopback port and N strata-client processes (one\n"
          "thread each, each loading only its share), follows the run through the\n"
          "coordinator's REST API, shows progress, and writes report.csv and report.md in\n"
          "--out (default out/sim). --policy none runs dense FedAvg. With --json the last\n"
          "line of output is a JSON summary. SIGINT or SIGTERM stops the run, writes the\n"
          "report of the finished rounds and exits 130; --resume continues it.\n",
          f);
    strata_buf_cleanup(&b);
}

/* Fills *o with the defaults (strings malloc'ed). */
static int sim_opts_init(sim_opts *o)
{
    *o = (sim_opts){.clients = 10,
                    .rounds = 10,
                    .seed = 1,
                    .deadline = 120,
                    .log_level = STRATA_LOG_INFO,
                    .log_format = STRATA_LOG_TEXT};
    static const struct {
        size_t off;
        const char *value;
    } defaults[] = {{OFF(model), "mlp"},    {OFF(partition), "iid"}, {OFF(policy), "uniform"},
                    {OFF(density), "0.01"}, {OFF(values), "fp32"},   {OFF(out), "out/sim"}};
    for (size_t i = 0; i < sizeof(defaults) / sizeof(defaults[0]); i++)
        if ((*(char **)((char *)o + defaults[i].off) = strdup(defaults[i].value)) == NULL)
            return STRATA_ENOMEM;
    return STRATA_OK;
}

/* The value of option t in o as text (buf holds numbers); NULL when a
 * string option is not set. */
static const char *opt_text(const strata_opt *t, const sim_opts *o, char *buf, size_t cap)
{
    const char *field = (const char *)o + t->offset;
    switch (t->kind) {
    case STRATA_OPT_STRING:
        return *(char *const *)field;
    case STRATA_OPT_INTEGER:
        snprintf(buf, cap, "%ld", *(const long *)field);
        return buf;
    case STRATA_OPT_DOUBLE:
        snprintf(buf, cap, "%.17g", *(const double *)field);
        return buf;
    case STRATA_OPT_FLAG:
        snprintf(buf, cap, "%d", *(const int *)field);
        return buf;
    }
    return NULL;
}

int sim_opts_save(const sim_opts *o, const char *path, strata_diag *d)
{
    const strata_opt *t = opts_table();
    json_t *j = json_object();
    int rc = j == NULL ? STRATA_ENOMEM : STRATA_OK;
    for (size_t i = 0; rc == 0 && i < NOPTS; i++) {
        const char *field = (const char *)o + t[i].offset;
        json_t *v = NULL;
        if (per_invocation(t[i].key))
            continue;
        if (t[i].kind == STRATA_OPT_STRING)
            v = *(char *const *)field != NULL ? json_string(*(char *const *)field) : NULL;
        else if (t[i].kind == STRATA_OPT_INTEGER)
            v = json_integer(*(const long *)field);
        else if (t[i].kind == STRATA_OPT_DOUBLE)
            v = json_real(*(const double *)field);
        else
            v = json_boolean(*(const int *)field);
        if (v != NULL && json_object_set_new(j, t[i].key, v) < 0)
            rc = STRATA_ENOMEM;
    }
    char *text = rc == 0 ? json_dumps(j, JSON_INDENT(2) | JSON_PRESERVE_ORDER) : NULL;
    if (rc == 0 && text == NULL)
        rc = STRATA_ENOMEM;
    if (rc == 0)
        rc = strata_file_write_atomic(path, text, strlen(text), 0644, d);
    else
        strata_diag_set(d, rc, "out of memory");
    free(text);
    json_decref(j);
    return rc;
}

/* Logs a usage error; returns SIM_EXIT_USAGE. */
static int usage_error(const strata_diag *d, int rc)
{
    strata_log_error("%s", strata_diag_msg(d, rc));
    return SIM_EXIT_USAGE;
}

/* With --resume: the options become those saved in OUT/run.json with the
 * command line's on top; the fixed ones may not change. o holds the
 * command line's. */
static int apply_saved(int argc, char **argv, sim_opts *o)
{
    const strata_opt *t = opts_table();
    char path[PATH_MAX];
    if (snprintf(path, sizeof(path), "%s/run.json", o->out) >= (int)sizeof(path)) {
        strata_log_error("--out: path too long");
        return SIM_EXIT_USAGE;
    }
    uint8_t *data = NULL;
    size_t len = 0;
    strata_diag d = {{0}};
    int rc = strata_file_read_all(path, RUN_JSON_MAX, &data, &len, &d);
    if (rc == STRATA_ESTATE) {
        strata_log_error("%s holds no run to resume (no run.json)", o->out);
        return SIM_EXIT_USAGE;
    }
    sim_opts saved;
    memset(&saved, 0, sizeof(saved));
    int help = 0, code = SIM_EXIT_USAGE;
    if (rc < 0 || (rc = sim_opts_init(&saved)) < 0 ||
        (rc = strata_opts_apply_json(t, NOPTS, (const char *)data, len, &saved, &d)) < 0) {
        strata_log_error("%s: %s", path, strata_diag_msg(&d, rc));
        goto out;
    }
    /* The saved options with the command line on top. */
    sim_opts merged;
    if ((rc = sim_opts_init(&merged)) < 0 ||
        (rc = strata_opts_apply_json(t, NOPTS, (const char *)data, len, &merged, &d)) < 0 ||
        (rc = strata_opts_parse_argv(t, NOPTS, argc, argv, &merged, &help, &d)) < 0) {
        strata_opts_cleanup(t, NOPTS, &merged);
        strata_log_error("%s", strata_diag_msg(&d, rc));
        goto out;
    }
    for (size_t i = 0; i < NOPTS; i++) {
        char b1[64], b2[64];
        const char *was = opt_text(&t[i], &saved, b1, sizeof(b1));
        const char *now = opt_text(&t[i], &merged, b2, sizeof(b2));
        if (fixed_on_resume(t[i].key) && was != NULL && now != NULL && strcmp(was, now) != 0) {
            strata_log_error("--resume: --%s cannot change (the run in %s has %s)", t[i].key,
                             o->out, was);
            strata_opts_cleanup(t, NOPTS, &merged);
            goto out;
        }
    }
    merged.log_level = o->log_level;
    merged.log_format = o->log_format;
    strata_opts_cleanup(t, NOPTS, o);
    *o = merged;
    code = SIM_EXIT_OK;
out:
    strata_opts_cleanup(t, NOPTS, &saved);
    free(data);
    return code;
}

/* Checks the client options o holds with the rows strata-client parses
 * them with (strata_ef_opt_rows): STRATA_EINVAL with diag naming the option
 * and the range otherwise. */
static int check_client_opts(const sim_opts *o, strata_diag *d)
{
    char *args[2 * STRATA_EF_NOPTS + 2];
    char flags[STRATA_EF_NOPTS][64];
    int n = 0;
    args[n++] = "strata-sim";
    for (size_t i = 0; i < STRATA_EF_NOPTS; i++) {
        if (o->pass[NSERVER_PASS + i] == NULL)
            continue;
        strata_opt_flag(strata_ef_opt_rows[i].key, flags[i], sizeof(flags[i]));
        args[n++] = flags[i];
        args[n++] = o->pass[NSERVER_PASS + i];
    }
    args[n] = NULL;
    strata_ef_opts v = STRATA_EF_OPTS_DEFAULT;
    int help = 0;
    int rc = strata_opts_parse_argv(strata_ef_opt_rows, STRATA_EF_NOPTS, n, args, &v, &help, d);
    return rc < 0 ? rc : STRATA_OK;
}

int sim_opts_parse(int argc, char **argv, sim_opts *o, int *help)
{
    const strata_opt *t = opts_table();
    *help = 0;
    if (sim_opts_init(o) < 0) {
        strata_log_error("out of memory");
        return SIM_EXIT_FAIL;
    }
    strata_diag d = {{0}};
    int rc = strata_opts_parse_argv(t, NOPTS, argc, argv, o, help, &d);
    if (rc >= 0 && *help) {
        usage(stdout);
        return SIM_EXIT_OK;
    }
    if (rc < 0 ||
        (o->log_format_name != NULL &&
         (rc = strata_log_parse_format(o->log_format_name, &o->log_format, &d)) < 0) ||
        (o->log_level_name != NULL &&
         (rc = strata_log_parse_level(o->log_level_name, &o->log_level, &d)) < 0))
        return usage_error(&d, rc);
    if (rc != argc) {
        usage(stderr);
        strata_log_error("unexpected argument '%s'", argv[rc]);
        return SIM_EXIT_USAGE;
    }
    if (o->study != NULL) { /* the spec holds the runs' options */
        for (int i = 1; i < argc; i++) {
            char k[64];
            if (strncmp(argv[i], "--", 2) != 0)
                continue;
            snprintf(k, sizeof(k), "%.*s", (int)strcspn(argv[i] + 2, "="), argv[i] + 2);
            for (char *c = k; *c; c++)
                if (*c == '-')
                    *c = '_';
            if (!with_study(k)) {
                if (strcmp(k, "resume") == 0)
                    strata_log_error("--study does not take --%s: a study resumes by itself "
                                     "(give the same command again)",
                                     argv[i] + 2);
                else if (per_invocation(k))
                    strata_log_error("--study does not take --%s (an option of a single run)",
                                     argv[i] + 2);
                else
                    strata_log_error("--study takes the runs' options from its spec, not --%s",
                                     argv[i] + 2);
                return SIM_EXIT_USAGE;
            }
        }
        return SIM_EXIT_OK;
    }
    if (o->resume && (rc = apply_saved(argc, argv, o)) != SIM_EXIT_OK)
        return rc;
    if (o->data == NULL && o->report_from == NULL) {
        usage(stderr);
        strata_log_error("--data is required");
        return SIM_EXIT_USAGE;
    }
    if (sim_opts_pass_get(o, "clients_per_round") != NULL &&
        sim_opts_pass_get(o, "fraction") != NULL) {
        strata_log_error("give either --clients-per-round or --fraction, not both");
        return SIM_EXIT_USAGE;
    }
    if ((rc = check_client_opts(o, &d)) < 0)
        return usage_error(&d, rc);
    if (sim_link_rate_check(o->link_up) < 0 || sim_link_rate_check(o->link_down) < 0) {
        strata_log_error("--link-up/--link-down: expected a rate such as 1mbit, 512kbit or "
                         "10.5mbit, got '%s'",
                         sim_link_rate_check(o->link_up) < 0 ? o->link_up : o->link_down);
        return SIM_EXIT_USAGE;
    }
    return SIM_EXIT_OK;
}

int sim_study_check(int argc, char **argv, strata_diag *d)
{
    const strata_opt *t = opts_table();
    char *args[2 * NOPTS + 2];
    if (argc < 0 || (size_t)argc > 2 * NOPTS)
        return strata_diag_set(d, STRATA_EINVAL, "too many options");
    args[0] = "strata-sim";
    for (int i = 0; i < argc; i++) {
        args[i + 1] = argv[i];
        if (strncmp(argv[i], "--", 2) == 0) {
            char k[64];
            snprintf(k, sizeof(k), "%s", argv[i] + 2);
            for (char *p = k; *p; p++)
                if (*p == '-')
                    *p = '_';
            if (per_invocation(k))
                return strata_diag_set(d, STRATA_EINVAL, "\"%s\" cannot be set in a study", k);
        }
    }
    args[argc + 1] = NULL;
    sim_opts o;
    int help = 0, rc = sim_opts_init(&o);
    if (rc == 0)
        rc = strata_opts_parse_argv(t, NOPTS, argc + 1, args, &o, &help, d);
    if (rc >= 0 && rc != argc + 1)
        rc = strata_diag_set(d, STRATA_EINVAL, "unexpected value '%s'", args[rc]);
    else if (rc >= 0 && o.data == NULL)
        rc = strata_diag_set(d, STRATA_EINVAL, "data is required");
    else if (rc >= 0 && sim_opts_pass_get(&o, "clients_per_round") != NULL &&
             sim_opts_pass_get(&o, "fraction"))
        rc = strata_diag_set(d, STRATA_EINVAL, "give either clients_per_round or fraction");
    else if (rc >= 0)
        rc = check_client_opts(&o, d);
    strata_opts_cleanup(t, NOPTS, &o);
    return rc < 0 ? rc : STRATA_OK;
}

void sim_opts_cleanup(sim_opts *o)
{
    strata_opts_cleanup(opts_table(), NOPTS, o);
}

const char *sim_opts_pass_key(size_t i)
{
    if (i < NSERVER_PASS)
        return PASS[i].key;
    return i < NPASS ? strata_ef_opt_rows[i - NSERVER_PASS].key : NULL;
}

int sim_opts_pass_client(size_t i)
{
    return i >= NSERVER_PASS && i < NPASS;
}
