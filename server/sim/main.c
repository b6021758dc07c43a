/* strata-sim: runs a whole federation on this machine — a coordinator on a
 * free loopback port and N edge-client processes, each on its own shard of
 * a real data set. This file owns the options (its own and those passed
 * through to the coordinator), the processes and the run's outcome: it
 * learns the coordinator's address from its start-up line, writes the
 * shards (shard.c), follows the run through the REST API (follow.c), and
 * has the report written from the coordinator's store (report.c), also
 * after SIGINT or SIGTERM; the output directory is outdir.c's. */
#include "sim.h"

#include "strata/clock.h"
#include "strata/fileio.h"
#include "strata/log.h"
#include "strata/opts.h"
#include "strata/stop.h"

#include <errno.h>
#include <jansson.h>
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

/* Set once SIGINT or SIGTERM arrives (strata_stop_install). */
static volatile sig_atomic_t *g_stop;

/* The coordinator options strata-sim passes through unchanged (as
 * --kebab-key VALUE, only when given): every setting that changes the
 * learning. The coordinator checks the values; a bad one stops it at start
 * with its own message, which strata-sim prints. */
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
    {"aggregator", "NAME", "fedavg (default), trimmed-mean or median"},
    {"trim_fraction", "F", "trimmed-mean: fraction cut at each end (0.1)"},
    {"clip_norm", "C", "scale every update to an L2 norm of at most C; 0 = off (0)"},
    {"screen_factor", "F", "quarantine updates above F times the median norm; 0 = off (10)"},
    {"threads", "N", "the coordinator's evaluation threads (1)"},
    {"http_threads", "N", "the coordinator's request threads (16)"},
};
#define NPASS (sizeof(PASS) / sizeof(PASS[0]))

typedef struct sim_opts {
    long clients, rounds, seed, deadline;
    char *model, *data, *partition, *policy, *density, *values, *out, *study;
    char *pass[NPASS]; /* PASS[i]'s value, NULL when not given */
    int json, resume;
    char *log_format_name, *log_level_name;
    strata_log_level log_level;
    strata_log_format log_format;
} sim_opts;

/* Exit codes. */
enum { SIM_EXIT_OK = 0, SIM_EXIT_FAIL = 1, SIM_EXIT_USAGE = 2, SIM_EXIT_INTERRUPTED = 130 };

/* How long the coordinator may take to print its address. */
#define START_TIMEOUT_MS 120000
/* How often the run's progress is polled. */
#define POLL_INTERVAL_MS 500
/* How long stopped children may take to exit before they are killed. */
#define STOP_TIMEOUT_MS 30000
/* How long one client may take to register before the next starts. */
#define REGISTER_TIMEOUT_MS 60000
/* Largest run.json read back. */
#define RUN_JSON_MAX ((size_t)1 << 16)

#define OFF(f) offsetof(sim_opts, f)
/* strata-sim's own options; the table used (opts_table) appends PASS. */
static const strata_opt OWN[] = {
    {"clients", STRATA_OPT_INTEGER, OFF(clients), 1, 1000, "N", "edge clients (10)"},
    {"rounds", STRATA_OPT_INTEGER, OFF(rounds), 1, 100000, "R", "rounds (10)"},
    {"model", STRATA_OPT_STRING, OFF(model), 0, 0, "SPEC", "mlp (default), cnn or ARCH.json"},
    {"data", STRATA_OPT_STRING, OFF(data), 0, 0, "DIR", "data set directory; required"},
    {"partition", STRATA_OPT_STRING, OFF(partition), 0, 0, "SPEC",
     "iid (default), dirichlet:ALPHA or shards:S"},
    {"policy", STRATA_OPT_STRING, OFF(policy), 0, 0, "SPEC",
     "the coordinator's budget policy (uniform); none: dense FedAvg"},
    {"density", STRATA_OPT_STRING, OFF(density), 0, 0, "D", "target mean density (0.01)"},
    {"values", STRATA_OPT_STRING, OFF(values), 0, 0, "fp32|fp16|bf16",
     "values format of uploads (fp32)"},
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
    static const char *const KEYS[] = {"out", "resume", "json", "log_format", "log_level", "study"};
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

/* The whole option table: OWN, then one string option per PASS entry. */
static const strata_opt *opts_table(void)
{
    static strata_opt table[NOPTS];
    if (table[0].key == NULL) {
        memcpy(table, OWN, sizeof(OWN));
        for (size_t i = 0; i < NPASS; i++)
            table[NOWN + i] =
                (strata_opt){PASS[i].key,   STRATA_OPT_STRING, OFF(pass) + i * sizeof(char *), 0, 0,
                             PASS[i].value, PASS[i].help};
    }
    return table;
}

/* The value given for PASS entry key, or NULL. */
static const char *pass_get(const sim_opts *o, const char *key)
{
    for (size_t i = 0; i < NPASS; i++)
        if (strcmp(PASS[i].key, key) == 0)
            return o->pass[i];
    return NULL;
}

/* Writes the usage text to f. */
static void usage(FILE *f)
{
    strata_buf b;
    strata_buf_init(&b, 1 << 16);
    fputs("usage: strata-sim --clients N --rounds R --model mlp|cnn|ARCH.json --data DIR "
          "[options]\n",
          f);
    if (strata_opts_usage(OWN, NOWN, &b) == STRATA_OK)
        fputs((const char *)b.data, f);
    strata_buf_cleanup(&b);
    strata_buf_init(&b, 1 << 16);
    fputs("Passed to the coordinator when given (see strata-server --help):\n", f);
    if (strata_opts_usage(opts_table() + NOWN, NPASS, &b) == STRATA_OK)
        fputs((const char *)b.data, f);
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

/* Writes the run's options (those not per_invocation) to path as one JSON
 * object that strata_opts_apply_json reads back. */
static int save_options(const sim_opts *o, const char *path, strata_diag *d)
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

/* Parses the command line into *o (strata_opts_cleanup frees it, also after
 * an error). Returns SIM_EXIT_OK (with *help set when --help was answered)
 * or SIM_EXIT_USAGE. */
static int parse(int argc, char **argv, sim_opts *o, int *help)
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
            if (!per_invocation(k) || strcmp(k, "resume") == 0) {
                strata_log_error("--study takes the runs' options from its spec, not --%s%s",
                                 argv[i] + 2,
                                 strcmp(k, "resume") == 0
                                     ? " (a study resumes by itself: give the same command again)"
                                     : "");
                return SIM_EXIT_USAGE;
            }
        }
        return SIM_EXIT_OK;
    }
    if (o->resume && (rc = apply_saved(argc, argv, o)) != SIM_EXIT_OK)
        return rc;
    if (o->data == NULL) {
        usage(stderr);
        strata_log_error("--data is required");
        return SIM_EXIT_USAGE;
    }
    if (pass_get(o, "clients_per_round") != NULL && pass_get(o, "fraction") != NULL) {
        strata_log_error("give either --clients-per-round or --fraction, not both");
        return SIM_EXIT_USAGE;
    }
    return SIM_EXIT_OK;
}

/* Checks one study run's options (sim_study_check_fn): what parse would
 * accept, without the options that belong to an invocation. */
static int study_check(int argc, char **argv, strata_diag *d)
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
    else if (rc >= 0 && pass_get(&o, "clients_per_round") != NULL && pass_get(&o, "fraction"))
        rc = strata_diag_set(d, STRATA_EINVAL, "give either clients_per_round or fraction");
    strata_opts_cleanup(t, NOPTS, &o);
    return rc < 0 ? rc : STRATA_OK;
}

/* A growing argument vector; every string is a malloc'ed copy. */
typedef struct argv_list {
    char *v[160];
    size_t n;
} argv_list;

static int argv_add(argv_list *a, const char *s)
{
    if (a->n + 2 > sizeof(a->v) / sizeof(a->v[0]) || (a->v[a->n] = strdup(s)) == NULL)
        return STRATA_ENOMEM;
    a->v[++a->n] = NULL;
    return STRATA_OK;
}

/* Adds "--kebab-key" and value. */
static int argv_add_opt(argv_list *a, const char *key, const char *value)
{
    char flag[96];
    snprintf(flag, sizeof(flag), "--%s", key);
    for (char *p = flag; *p; p++)
        if (*p == '_')
            *p = '-';
    return argv_add(a, flag) < 0 ? STRATA_ENOMEM : argv_add(a, value);
}

static void argv_cleanup(argv_list *a)
{
    for (size_t i = 0; i < a->n; i++)
        free(a->v[i]);
    a->n = 0;
}

/* Starts argv[0] with stdout to out_fd (or the log), stderr to the log
 * file (appended to by every writer, so a resumed run keeps the earlier
 * lines). Returns the child's pid, or -1. */
static pid_t spawn(char *const argv[], const char *log, int out_fd)
{
    pid_t pid = fork();
    if (pid != 0)
        return pid;
    int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) {
        dup2(fd, STDERR_FILENO);
        dup2(out_fd >= 0 ? out_fd : fd, STDOUT_FILENO);
    }
    setenv("OMP_NUM_THREADS", "1", 1);
    setenv("OMP_WAIT_POLICY", "passive", 1);
    execv(argv[0], argv);
    strata_log_error("cannot run %s: %s", argv[0], strerror(errno));
    _exit(127);
}

/* The coordinator's standard output: its start-up line, then whatever it
 * prints, which is copied to its log. */
typedef struct server_out {
    int fd;     /* read end of the pipe (non-blocking) */
    int log_fd; /* server.log, opened for appending; -1 when not open */
    char buf[8192];
    size_t len;
} server_out;

/* Reads what the pipe holds (waiting up to wait_ms) and copies it to the
 * log. Returns the number of bytes read, 0 at end of file or when nothing
 * came. */
static size_t server_out_read(server_out *so, int wait_ms)
{
    struct pollfd pf = {so->fd, POLLIN, 0};
    if (poll(&pf, 1, wait_ms) <= 0)
        return 0;
    size_t room = sizeof(so->buf) - 1 - so->len;
    ssize_t k = read(so->fd, so->buf + so->len, room);
    if (k <= 0)
        return 0;
    if (so->log_fd >= 0 && write(so->log_fd, so->buf + so->len, (size_t)k) < 0)
        strata_log_debug("copying the coordinator's output: %s", strerror(errno));
    so->len += (size_t)k;
    return (size_t)k;
}

/* Looks for the start-up line "strata-server: listening on URL" among the
 * complete lines read so far (see docs/operations.md); copies URL into url
 * and returns 1 when it is there. Lines before it are dropped. */
static int server_out_listening(server_out *so, char *url, size_t cap)
{
    static const char MARK[] = "listening on ";
    char *nl;
    while ((nl = memchr(so->buf, '\n', so->len)) != NULL) {
        *nl = '\0';
        const char *p = strstr(so->buf, MARK);
        int found = p != NULL;
        if (found) {
            snprintf(url, cap, "%s", p + strlen(MARK));
            url[strcspn(url, "\r")] = '\0';
        }
        so->len -= (size_t)(nl + 1 - so->buf);
        memmove(so->buf, nl + 1, so->len);
        if (found)
            return 1;
    }
    if (so->len == sizeof(so->buf) - 1)
        so->len = 0; /* an overlong line: drop it */
    return 0;
}

/* The child processes of the run. */
typedef struct procs {
    pid_t server; /* -1 once it has exited */
    pid_t *clients;
    long nclients, done, failed;
} procs;

/* Reaps the children that have exited; returns 1 when the server is one. */
static int procs_reap(procs *p)
{
    int status, server_exited = 0;
    pid_t pid;
    while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
        if (pid == p->server) {
            p->server = -1;
            server_exited = 1;
            continue;
        }
        for (long i = 0; i < p->nclients; i++)
            if (p->clients[i] == pid) {
                p->clients[i] = 0;
                p->done++;
                if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
                    p->failed++;
            }
    }
    return server_exited;
}

/* Waits up to STOP_TIMEOUT_MS for *pid to exit, then kills it; sets *pid
 * to 0. */
static void wait_or_kill(pid_t *pid, strata_deadline until)
{
    while (*pid > 0) {
        pid_t r = waitpid(*pid, NULL, WNOHANG);
        if (r == *pid || (r < 0 && errno != EINTR)) {
            *pid = 0;
        } else if (strata_deadline_expired(until)) {
            kill(*pid, SIGKILL);
            waitpid(*pid, NULL, 0);
            *pid = 0;
        } else {
            usleep(20000);
        }
    }
}

/* Ends every child that still runs (SIGTERM; SIGKILL after
 * STOP_TIMEOUT_MS) and waits for it: the clients first, all at once, then
 * the coordinator, which saves its state as it stops. */
static void procs_stop(procs *p)
{
    for (long i = 0; p->clients != NULL && i < p->nclients; i++)
        if (p->clients[i] > 0)
            kill(p->clients[i], SIGTERM);
    strata_deadline until = strata_deadline_in(STOP_TIMEOUT_MS);
    for (long i = 0; p->clients != NULL && i < p->nclients; i++)
        wait_or_kill(&p->clients[i], until);
    if (p->server > 0) {
        kill(p->server, SIGTERM);
        wait_or_kill(&p->server, strata_deadline_in(STOP_TIMEOUT_MS));
        p->server = -1;
    }
}

/* Waits until client i (state directory cdir) has registered: its
 * identity.json exists (the client's state-directory protocol). Clients
 * register one after the other, so client I gets the same coordinator id in
 * every run and a seeded run samples the same shares. Gives up after
 * REGISTER_TIMEOUT_MS or when the client exits (the run then reports it).
 * Errors: STRATA_ESTATE when the coordinator exited or a stop arrived. */
static int wait_registered(procs *p, long i, const char *cdir)
{
    char id[PATH_MAX];
    if (snprintf(id, sizeof(id), "%s/identity.json", cdir) >= (int)sizeof(id))
        return STRATA_EINVAL;
    strata_deadline until = strata_deadline_in(REGISTER_TIMEOUT_MS);
    while (access(id, F_OK) != 0) {
        if (*g_stop)
            return STRATA_ESTATE;
        if (procs_reap(p)) {
            strata_log_error("the coordinator exited while clients registered");
            return STRATA_ESTATE;
        }
        if (p->clients[i] == 0)
            return STRATA_OK; /* exited: counted as failed */
        if (strata_deadline_expired(until)) {
            strata_log_warn("client %ld has not registered after %d s; going on", i,
                            REGISTER_TIMEOUT_MS / 1000);
            return STRATA_OK;
        }
        usleep(5000);
    }
    return STRATA_OK;
}

/* Starts the N clients against the coordinator at url, each on its shard
 * (shards/I, --partition none), one after the other as each registers. */
static int start_clients(const sim_opts *o, procs *p, const char *client_bin, const char *url,
                         const sim_out *od)
{
    char s_clients[32], s_seed[32];
    snprintf(s_clients, sizeof(s_clients), "%ld", o->clients);
    snprintf(s_seed, sizeof(s_seed), "%ld", o->seed);
    const char *clients_dir = od->path[SIM_OUT_CLIENTS];
    for (long i = 0; i < o->clients; i++) {
        char cdir[PATH_MAX], clog[PATH_MAX], shard[PATH_MAX], idx[32];
        if (snprintf(cdir, sizeof(cdir), "%s/%ld", clients_dir, i) >= (int)sizeof(cdir) ||
            snprintf(clog, sizeof(clog), "%s/%ld.log", clients_dir, i) >= (int)sizeof(clog) ||
            snprintf(shard, sizeof(shard), "%s/%ld", od->path[SIM_OUT_SHARDS], i) >=
                (int)sizeof(shard)) {
            strata_log_error("path too long: %s", clients_dir);
            return STRATA_EINVAL;
        }
        snprintf(idx, sizeof(idx), "%ld", i);
        char *cargv[] = {(char *)client_bin,
                         "--server",
                         (char *)url,
                         "--state-dir",
                         cdir,
                         "--data",
                         shard,
                         "--partition",
                         "none",
                         "--num-clients",
                         s_clients,
                         "--client-index",
                         idx,
                         "--seed",
                         s_seed,
                         "--threads",
                         "1",
                         "--enrolment-secret-file",
                         (char *)od->path[SIM_OUT_SECRET],
                         NULL};
        if ((p->clients[i] = spawn(cargv, clog, -1)) < 0) {
            p->clients[i] = 0;
            strata_log_error("cannot start a client: %s", strerror(errno));
            return STRATA_EIO;
        }
        int rc = wait_registered(p, i, cdir);
        if (rc < 0)
            return rc;
    }
    return STRATA_OK;
}

/* Shows one closed round: a status line on a terminal, a log line
 * otherwise. */
static void show_round(void *ud, const strata_round_summary *s, uint32_t total)
{
    int *tty = ud;
    char line[256];
    snprintf(line, sizeof(line),
             "round %u/%u: %llu updates, accuracy %.4f, loss %.4f, uplink %llu bytes, %llu ms",
             s->round, total, (unsigned long long)s->participants, sim_summary_metric(s->accuracy),
             sim_summary_metric(s->loss), (unsigned long long)s->uplink_bytes,
             (unsigned long long)s->duration_ms);
    if (*tty) {
        fprintf(stderr, "\r\033[K%s", line);
        fflush(stderr);
    } else {
        strata_log_info("%s", line);
    }
}

/* Following the run: how progress is shown and what was saved. */
typedef struct follow_ui {
    int tty;                 /* progress as a status line on a terminal */
    int failing;             /* the last poll failed (reported once) */
    int config_saved;        /* coordinator.json is written */
    const char *config_path; /* OUT/coordinator.json (borrowed) */
} follow_ui;

/* One poll of the run's progress; a coordinator that does not answer is
 * reported once until it answers again. The first settings seen are saved
 * to coordinator.json. */
static void poll_progress(sim_follow *f, follow_ui *ui)
{
    strata_diag d = {{0}};
    int rc = sim_follow_poll(f, show_round, &ui->tty, &d);
    if (rc < 0 && rc != STRATA_ESTATE && !ui->failing)
        strata_log_warn("following the run: %s", strata_diag_msg(&d, rc));
    ui->failing = rc < 0;
    const char *cfg = sim_follow_config(f);
    if (!ui->config_saved && cfg != NULL) {
        ui->config_saved = 1;
        if ((rc = strata_file_write_atomic(ui->config_path, cfg, strlen(cfg), 0644, &d)) < 0)
            strata_log_warn("%s", strata_diag_msg(&d, rc));
    }
}

/* How a run ended. */
typedef enum {
    RUN_DONE = 0,     /* every round finished */
    RUN_FAILED,       /* it ran, then failed: the output stays */
    RUN_START_FAILED, /* it never ran: what this start created goes */
    RUN_INTERRUPTED   /* SIGINT or SIGTERM */
} run_end;

/* Logs why the coordinator did not start, with its own error line. */
static void start_failure(const char *log, const char *what)
{
    char line[1024];
    if (sim_out_error_line(log, line, sizeof(line)))
        strata_log_error("the coordinator %s: %s", what, line);
    else
        strata_log_error("the coordinator %s (no output)", what);
}

/* The run itself: waits for the coordinator's address, saves the options,
 * writes the shards, starts the clients and follows the rounds until every
 * client has exited. */
static run_end run(const sim_opts *o, procs *p, server_out *so, const char *client_bin,
                   const sim_out *od)
{
    const char *log = od->path[SIM_OUT_SERVER_LOG];
    char url[256] = "";
    strata_deadline start = strata_deadline_in(START_TIMEOUT_MS);
    while (!*g_stop && !server_out_listening(so, url, sizeof(url))) {
        server_out_read(so, 200);
        if (procs_reap(p)) {
            start_failure(log, "did not start");
            return RUN_START_FAILED;
        }
        if (strata_deadline_expired(start)) {
            start_failure(log, "did not start in time");
            return RUN_START_FAILED;
        }
    }
    if (*g_stop)
        return od->holds_run ? RUN_INTERRUPTED : RUN_START_FAILED;
    strata_diag d = {{0}};
    int rc;
    if ((rc = save_options(o, od->path[SIM_OUT_RUN_JSON], &d)) < 0) {
        strata_log_error("%s", strata_diag_msg(&d, rc));
        return RUN_START_FAILED;
    }
    strata_log_info("coordinator at %s; writing the shards of %ld clients (%s)", url, o->clients,
                    o->partition);
    if ((rc = sim_shards_write(o->data, o->partition, o->clients, o->seed, od->path[SIM_OUT_SHARDS],
                               &d)) < 0) {
        strata_log_error("%s", strata_diag_msg(&d, rc));
        return od->holds_run ? RUN_FAILED : RUN_START_FAILED;
    }
    sim_follow *f = NULL;
    if ((rc = sim_follow_new(url, g_stop, &f, &d)) < 0) {
        strata_log_error("%s", strata_diag_msg(&d, rc));
        return RUN_FAILED;
    }
    run_end end = RUN_FAILED;
    follow_ui ui = {.tty = isatty(STDERR_FILENO), .config_path = od->path[SIM_OUT_COORD_JSON]};
    if (start_clients(o, p, client_bin, url, od) < 0) {
        if (*g_stop)
            end = RUN_INTERRUPTED;
        goto out;
    }
    int64_t next_poll = 0;
    while (!*g_stop && p->done < p->nclients) {
        server_out_read(so, 200);
        so->len = 0; /* after the start-up line the output is only logged */
        if (strata_clock_mono_ms() >= next_poll) {
            poll_progress(f, &ui);
            next_poll = strata_clock_mono_ms() + POLL_INTERVAL_MS;
        }
        if (procs_reap(p)) {
            if (ui.tty)
                fputc('\n', stderr);
            strata_log_error("the coordinator exited early; see %s", log);
            goto out;
        }
    }
    if (*g_stop) {
        if (ui.tty)
            fputc('\n', stderr);
        end = RUN_INTERRUPTED;
        goto out;
    }
    /* Every client has exited: the rounds closed since the last poll. */
    poll_progress(f, &ui);
    if (ui.tty)
        fputc('\n', stderr);
    const sim_progress *pr = sim_follow_progress(f);
    long total = pr->polled ? (long)pr->total_rounds : o->rounds;
    if (p->failed > 0 || (long)pr->completed < total) {
        strata_log_error("%ld of %ld clients failed and %u of %ld rounds finished (the "
                         "coordinator's state: %s); see the logs in %s",
                         p->failed, p->nclients, pr->completed, total,
                         pr->polled ? sim_run_state_name(pr->state) : "unknown", o->out);
        goto out;
    }
    end = RUN_DONE;
out:
    sim_follow_free(f);
    return end;
}

/* Finds strata-server and strata-client beside this executable. */
static int find_binaries(char *server_bin, char *client_bin, size_t cap)
{
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    if (n <= 0)
        return STRATA_EIO;
    self[n] = '\0';
    const char *dir = dirname(self);
    if (snprintf(server_bin, cap, "%s/strata-server", dir) >= (int)cap ||
        snprintf(client_bin, cap, "%s/strata-client", dir) >= (int)cap)
        return STRATA_EINVAL;
    return STRATA_OK;
}

/* The coordinator's command line: the run's settings, then every PASS
 * option given. */
static int server_argv(const sim_opts *o, const char *server_bin, const sim_out *od, argv_list *a)
{
    char s_clients[32], s_rounds[32], s_seed[32], s_deadline[32];
    snprintf(s_clients, sizeof(s_clients), "%ld", o->clients);
    snprintf(s_rounds, sizeof(s_rounds), "%ld", o->rounds);
    snprintf(s_seed, sizeof(s_seed), "%ld", o->seed);
    snprintf(s_deadline, sizeof(s_deadline), "%ld", o->deadline);
    const char *fixed[][2] = {{"state_dir", od->path[SIM_OUT_STATE]},
                              {"model", o->model},
                              {"data", o->data},
                              {"host", "127.0.0.1"},
                              {"port", "0"},
                              {"rounds", s_rounds},
                              {"min_clients", s_clients},
                              {"round_deadline", s_deadline},
                              {"policy", o->policy},
                              {"density", o->density},
                              {"values", o->values},
                              {"seed", s_seed},
                              {"enrolment_secret_file", od->path[SIM_OUT_SECRET]}};
    int rc = argv_add(a, server_bin);
    for (size_t i = 0; rc == 0 && i < sizeof(fixed) / sizeof(fixed[0]); i++)
        rc = argv_add_opt(a, fixed[i][0], fixed[i][1]);
    for (size_t i = 0; rc == 0 && i < NPASS; i++)
        if (o->pass[i] != NULL)
            rc = argv_add_opt(a, PASS[i].key, o->pass[i]);
    return rc;
}

/* Writes the report of the rounds the store holds; returns the exit code
 * for a run that ended with end. */
static int finish(const sim_opts *o, const sim_out *od, run_end end)
{
    char sampling[64] = "all";
    const char *cpr = pass_get(o, "clients_per_round"), *fr = pass_get(o, "fraction");
    if (cpr != NULL)
        snprintf(sampling, sizeof(sampling), "%s", cpr);
    else if (fr != NULL)
        snprintf(sampling, sizeof(sampling), "fraction %s", fr);
    sim_run_info info = {.clients = o->clients,
                         .rounds = o->rounds,
                         .seed = o->seed,
                         .model = o->model,
                         .partition = o->partition,
                         .policy = o->policy,
                         .density = o->density,
                         .values = o->values,
                         .sampling = sampling};
    int rc = sim_report_write(od->path[SIM_OUT_STATE], o->out, &info, o->json);
    if (end == RUN_INTERRUPTED) {
        strata_log_warn("interrupted; the report covers the finished rounds. Continue with: "
                        "strata-sim --out %s --resume",
                        o->out);
        return SIM_EXIT_INTERRUPTED;
    }
    return rc < 0 || end != RUN_DONE ? SIM_EXIT_FAIL : SIM_EXIT_OK;
}

/* Runs the federation the options describe; returns the exit code. */
static int sim_main(const sim_opts *o)
{
    int rc;
    g_stop = strata_stop_install();
    char server_bin[PATH_MAX], client_bin[PATH_MAX];
    if (find_binaries(server_bin, client_bin, sizeof(server_bin)) < 0) {
        strata_log_error("cannot find strata-server and strata-client beside strata-sim");
        return SIM_EXIT_FAIL;
    }
    sim_out od;
    strata_diag d = {{0}};
    if ((rc = sim_out_open(o->out, &od, &d)) < 0)
        return usage_error(&d, rc);
    if (od.holds_run && !o->resume) {
        strata_log_error("%s already holds a run; continue it with --resume, or choose another "
                         "--out",
                         o->out);
        return SIM_EXIT_USAGE;
    }
    if (!od.holds_run && o->resume) {
        strata_log_error("%s holds no run to resume", o->out);
        return SIM_EXIT_USAGE;
    }
    if ((rc = sim_out_create(o->out, &od, &d)) < 0) {
        strata_log_error("%s", strata_diag_msg(&d, rc));
        sim_out_discard(&od);
        return SIM_EXIT_FAIL;
    }
    /* A fresh enrolment secret for a new federation, in a file only this
     * user can read (not on any command line); a resumed one keeps its. */
    char secret[STRATA_TOKEN_HEX + 1];
    if (!od.existed[SIM_OUT_SECRET] &&
        ((rc = strata_random_token(secret, &d)) < 0 ||
         (rc = strata_file_write_atomic(od.path[SIM_OUT_SECRET], secret, STRATA_TOKEN_HEX, 0600,
                                        &d)) < 0)) {
        strata_log_error("%s", strata_diag_msg(&d, rc));
        sim_out_discard(&od);
        return SIM_EXIT_FAIL;
    }
    argv_list sargv = {.n = 0};
    procs p = {.server = -1, .nclients = o->clients};
    server_out so = {.fd = -1, .log_fd = -1};
    int pfd[2] = {-1, -1};
    run_end end = RUN_START_FAILED;
    if (server_argv(o, server_bin, &od, &sargv) < 0 ||
        (p.clients = calloc((size_t)o->clients, sizeof(pid_t))) == NULL || pipe(pfd) != 0) {
        strata_log_error("cannot start the coordinator: %s", strerror(errno));
        goto stop;
    }
    fcntl(pfd[0], F_SETFD, FD_CLOEXEC);
    fcntl(pfd[1], F_SETFD, FD_CLOEXEC);
    p.server = spawn(sargv.v, od.path[SIM_OUT_SERVER_LOG], pfd[1]);
    close(pfd[1]);
    so.fd = pfd[0];
    fcntl(so.fd, F_SETFL, fcntl(so.fd, F_GETFL) | O_NONBLOCK);
    if (p.server < 0) {
        strata_log_error("cannot start the coordinator: %s", strerror(errno));
        goto stop;
    }
    so.log_fd = open(od.path[SIM_OUT_SERVER_LOG], O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    end = run(o, &p, &so, client_bin, &od);
stop:
    procs_stop(&p);
    while (so.fd >= 0 && server_out_read(&so, 0) > 0)
        so.len = 0;
    if (so.fd >= 0)
        close(so.fd);
    if (so.log_fd >= 0)
        close(so.log_fd);
    free(p.clients);
    argv_cleanup(&sargv);
    if (end == RUN_START_FAILED) {
        if (!od.holds_run)
            sim_out_discard(&od);
        return *g_stop ? SIM_EXIT_INTERRUPTED : SIM_EXIT_FAIL;
    }
    return finish(o, &od, end);
}

/* Runs the study --study names into --out; returns the exit code. */
static int study_main(const sim_opts *o)
{
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    if (n <= 0) {
        strata_log_error("cannot find its own executable");
        return SIM_EXIT_FAIL;
    }
    self[n] = '\0';
    return sim_study_run(o->study, o->out, self, study_check, strata_stop_install());
}

int main(int argc, char **argv)
{
    strata_log_setup("strata-sim", STRATA_LOG_INFO, STRATA_LOG_TEXT);
    sim_opts o;
    int help = 0, rc = parse(argc, argv, &o, &help);
    if (rc == SIM_EXIT_OK && !help) {
        strata_log_setup("strata-sim", o.log_level, o.log_format);
        rc = o.study != NULL ? study_main(&o) : sim_main(&o);
    }
    strata_opts_cleanup(opts_table(), NOPTS, &o);
    return rc;
}
