/* strata-sim: studies — a grid of strata-sim runs described by one JSON
 * file (models × partitions × policies × densities × value formats × seeds,
 * or any other options), run one after the other and resumable, then one
 * CSV of every run and round, SVG plots (accuracy against cumulative uplink
 * and total bytes, one line per policy with a band over the seeds; a
 * per-layer density heat map for adaptive policies) and a report in
 * Markdown and HTML. */
#include "sim.h"

#include "strata/fileio.h"
#include "strata/log.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define MAX_SPEC_BYTES ((size_t)1 << 20)
#define MAX_KEYS 48
#define MAX_VALUES 64
#define MAX_RUNS 4096
#define MAX_ARGS (2 * MAX_KEYS + 8)
#define MAX_CSV_LINE ((size_t)1 << 20)

/* One key of the spec: a fixed value (n == 1, !axis) or an axis. */
typedef struct key {
    char *name;
    char *vals[MAX_VALUES];
    size_t n;
    int axis;
} key;

/* One round of a finished run, from its report.csv. */
typedef struct round_row {
    double acc, loss, up, down;
} round_row;

/* One run of the grid. */
typedef struct run {
    size_t pick[MAX_KEYS]; /* value index per key */
    char name[512];
    int done;
    round_row *rows;
    size_t nrows;
    char **layers; /* density column names, nlayers of them */
    size_t nlayers;
    double *dens; /* nrows * nlayers */
} run;

typedef struct study {
    key keys[MAX_KEYS];
    size_t nkeys;
    run *runs;
    size_t nruns;
    int k_policy, k_seed, k_density, k_values; /* key indices or -1 */
    const char *out;
} study;

static void study_free(study *s)
{
    for (size_t k = 0; k < s->nkeys; k++) {
        free(s->keys[k].name);
        for (size_t i = 0; i < s->keys[k].n; i++)
            free(s->keys[k].vals[i]);
    }
    for (size_t r = 0; r < s->nruns; r++) {
        free(s->runs[r].rows);
        for (size_t l = 0; l < s->runs[r].nlayers; l++)
            free(s->runs[r].layers[l]);
        free(s->runs[r].layers);
        free(s->runs[r].dens);
    }
    free(s->runs);
}

/* A JSON scalar as the command line spells it; NULL for other types or a
 * false boolean (*omit set). */
static char *scalar_text(const json_t *v, int *omit)
{
    char buf[64];
    *omit = 0;
    if (json_is_string(v))
        return strdup(json_string_value(v));
    if (json_is_integer(v)) {
        snprintf(buf, sizeof(buf), "%lld", (long long)json_integer_value(v));
        return strdup(buf);
    }
    if (json_is_real(v)) {
        snprintf(buf, sizeof(buf), "%.15g", json_real_value(v));
        return strdup(buf);
    }
    if (json_is_true(v))
        return strdup("");
    if (json_is_false(v)) {
        *omit = 1;
        return strdup("");
    }
    return NULL;
}

static int find_key(const study *s, const char *name)
{
    for (size_t k = 0; k < s->nkeys; k++)
        if (strcmp(s->keys[k].name, name) == 0)
            return (int)k;
    return -1;
}

/* Reads the spec into s->keys. */
static int load_spec(study *s, const char *path, strata_diag *d)
{
    uint8_t *data = NULL;
    size_t len = 0;
    int rc = strata_file_read_all(path, MAX_SPEC_BYTES, &data, &len, d);
    if (rc < 0)
        return strata_diag_set(d, STRATA_EINVAL, "--study %s: %s", path,
                               rc == STRATA_ESTATE ? "no such file" : strata_diag_msg(d, rc));
    json_error_t e;
    json_t *j = json_loadb((const char *)data, len, JSON_REJECT_DUPLICATES, &e);
    free(data);
    if (j == NULL || !json_is_object(j)) {
        rc = strata_diag_set(d, STRATA_EINVAL, "--study %s: %s", path,
                             j == NULL ? e.text : "not a JSON object");
        goto out;
    }
    const char *name;
    json_t *v;
    json_object_foreach(j, name, v)
    {
        if (s->nkeys == MAX_KEYS) {
            rc = strata_diag_set(d, STRATA_EINVAL, "--study: more than %d keys", MAX_KEYS);
            goto out;
        }
        key *k = &s->keys[s->nkeys++];
        if ((k->name = strdup(name)) == NULL) {
            rc = strata_diag_set(d, STRATA_ENOMEM, "out of memory");
            goto out;
        }
        k->axis = json_is_array(v);
        size_t n = k->axis ? json_array_size(v) : 1;
        if (n == 0 || n > MAX_VALUES) {
            rc = strata_diag_set(d, STRATA_EINVAL, "--study: \"%s\": 1 to %d values", name,
                                 MAX_VALUES);
            goto out;
        }
        for (size_t i = 0; i < n; i++) {
            int omit;
            char *t = scalar_text(k->axis ? json_array_get(v, i) : v, &omit);
            if (t == NULL) {
                rc = strata_diag_set(d, STRATA_EINVAL,
                                     "--study: \"%s\": expected a string, number or boolean, "
                                     "or a list of them",
                                     name);
                goto out;
            }
            if (omit) { /* false: the flag is not given */
                free(t);
                t = NULL;
            }
            k->vals[k->n++] = t;
        }
    }
    if (find_key(s, "data") < 0)
        rc = strata_diag_set(d, STRATA_EINVAL, "--study: \"data\" is required");
out:
    json_decref(j);
    return rc;
}

/* Copies value into out as a file-name fragment: [A-Za-z0-9.+-] kept,
 * anything else '-'. */
static void fragment(char *out, size_t cap, const char *value)
{
    size_t n = 0;
    for (const char *p = value ? value : "on"; *p && n + 1 < cap; p++)
        out[n++] = (*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') ||
                           (*p >= '0' && *p <= '9') || *p == '.' || *p == '+' || *p == '-'
                       ? *p
                       : '-';
    out[n] = '\0';
}

/* A dense run (policy none) ignores density and value format: they are
 * pinned to their first value so that it runs once. */
static int is_dense(const study *s, const run *r)
{
    return s->k_policy >= 0 && s->keys[s->k_policy].vals[r->pick[s->k_policy]] != NULL &&
           strcmp(s->keys[s->k_policy].vals[r->pick[s->k_policy]], "none") == 0;
}

/* Names a run after its axis values, joined by '_'. */
static void run_name(const study *s, const run *r, char *out, size_t cap)
{
    size_t n = 0;
    out[0] = '\0';
    for (size_t k = 0; k < s->nkeys; k++) {
        if (!s->keys[k].axis)
            continue;
        char frag[128];
        fragment(frag, sizeof(frag), s->keys[k].vals[r->pick[k]]);
        int w = snprintf(out + n, cap - n, "%s%s", n ? "_" : "", frag);
        if (w < 0 || (size_t)w >= cap - n)
            return;
        n += (size_t)w;
    }
    if (n == 0)
        snprintf(out, cap, "run");
}

/* Enumerates the grid into s->runs (dense runs once). */
static int build_grid(study *s, strata_diag *d)
{
    size_t total = 1;
    for (size_t k = 0; k < s->nkeys; k++) {
        total *= s->keys[k].n;
        if (total > MAX_RUNS)
            return strata_diag_set(d, STRATA_EINVAL, "--study: more than %d runs", MAX_RUNS);
    }
    if ((s->runs = calloc(total, sizeof(run))) == NULL)
        return strata_diag_set(d, STRATA_ENOMEM, "out of memory");
    for (size_t i = 0; i < total; i++) {
        run r;
        memset(&r, 0, sizeof(r));
        size_t rest = i;
        for (size_t k = s->nkeys; k-- > 0;) { /* the first key varies slowest */
            r.pick[k] = rest % s->keys[k].n;
            rest /= s->keys[k].n;
        }
        if (is_dense(s, &r)) {
            if (s->k_density >= 0)
                r.pick[s->k_density] = 0;
            if (s->k_values >= 0)
                r.pick[s->k_values] = 0;
        }
        run_name(s, &r, r.name, sizeof(r.name));
        int dup = 0;
        for (size_t j = 0; j < s->nruns && !dup; j++)
            if (strcmp(s->runs[j].name, r.name) == 0)
                dup = memcmp(s->runs[j].pick, r.pick, sizeof(r.pick)) == 0 ? 1 : 2;
        if (dup == 2)
            return strata_diag_set(d, STRATA_EINVAL,
                                   "--study: two runs would both be named %s; make the values "
                                   "differ in letters or digits",
                                   r.name);
        if (!dup)
            s->runs[s->nruns++] = r;
    }
    return STRATA_OK;
}

/* The options of run r as a command line (no executable); strings
 * borrowed from s, flags without a value. */
static int run_args(const study *s, const run *r, char **argv, int cap)
{
    int n = 0;
    static char flags[MAX_KEYS][96];
    for (size_t k = 0; k < s->nkeys; k++) {
        const char *v = s->keys[k].vals[r->pick[k]];
        if (v == NULL || n + 2 > cap)
            continue;
        snprintf(flags[k], sizeof(flags[k]), "--%s", s->keys[k].name);
        for (char *p = flags[k]; *p; p++)
            if (*p == '_')
                *p = '-';
        argv[n++] = flags[k];
        if (*v != '\0')
            argv[n++] = (char *)v;
    }
    argv[n] = NULL;
    return n;
}

static int exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

/* Runs r (resuming it when stopped before); returns its exit code, or 130
 * when stop was raised. */
static int run_one(const study *s, const run *r, const char *self, volatile sig_atomic_t *stop)
{
    char dir[PATH_MAX], log[PATH_MAX], runjson[PATH_MAX];
    if (snprintf(dir, sizeof(dir), "%s/runs/%s", s->out, r->name) >= (int)sizeof(dir) ||
        snprintf(log, sizeof(log), "%s/runs/%s.log", s->out, r->name) >= (int)sizeof(log) ||
        snprintf(runjson, sizeof(runjson), "%s/run.json", dir) >= (int)sizeof(runjson)) {
        strata_log_error("path too long: %s/runs/%s", s->out, r->name);
        return 1;
    }
    char *argv[MAX_ARGS + 8];
    int n = 0;
    argv[n++] = (char *)self;
    n += run_args(s, r, argv + n, MAX_ARGS);
    argv[n++] = "--out";
    argv[n++] = dir;
    argv[n++] = "--json";
    if (exists(runjson))
        argv[n++] = "--resume";
    argv[n] = NULL;
    pid_t pid = fork();
    if (pid < 0)
        return 1;
    if (pid == 0) {
        int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0644);
        if (fd >= 0) {
            dup2(fd, STDOUT_FILENO);
            dup2(fd, STDERR_FILENO);
        }
        execv(self, argv);
        _exit(127);
    }
    int status = 0, signalled = 0;
    for (;;) {
        pid_t w = waitpid(pid, &status, WNOHANG);
        if (w == pid)
            break;
        if (w < 0 && errno != EINTR)
            return 1;
        if (*stop && !signalled) {
            kill(pid, SIGTERM); /* it writes its report and can be resumed */
            signalled = 1;
        }
        usleep(100000);
    }
    if (*stop)
        return 130;
    int ec = WIFEXITED(status) ? WEXITSTATUS(status) : 1;
    return ec == 130 ? 1 : ec;
}

/* Creates path and its missing parents. */
static int mkdirs(const char *path)
{
    char buf[PATH_MAX];
    if (snprintf(buf, sizeof(buf), "%s", path) >= (int)sizeof(buf))
        return STRATA_EINVAL;
    for (char *p = buf + 1; *p; p++)
        if (*p == '/') {
            *p = '\0';
            if (mkdir(buf, 0755) != 0 && errno != EEXIST)
                return STRATA_EIO;
            *p = '/';
        }
    return mkdir(buf, 0755) == 0 || errno == EEXIST ? STRATA_OK : STRATA_EIO;
}

/* ---- reading the runs' reports ------------------------------------------ */

/* Splits line at commas in place; returns the number of fields (at most
 * cap). */
static size_t split(char *line, char **f, size_t cap)
{
    size_t n = 0;
    line[strcspn(line, "\r\n")] = '\0';
    for (char *p = line; n < cap;) {
        f[n++] = p;
        char *c = strchr(p, ',');
        if (c == NULL)
            break;
        *c = '\0';
        p = c + 1;
    }
    return n;
}

/* Reads out/runs/NAME/report.csv into r. */
static int read_report(const study *s, run *r)
{
    char path[PATH_MAX];
    snprintf(path, sizeof(path), "%s/runs/%s/report.csv", s->out, r->name);
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return STRATA_EIO;
    enum { MAXF = 4096 };
    char *line = malloc(MAX_CSV_LINE), **fld = malloc(MAXF * sizeof(char *));
    int rc = line && fld ? STRATA_OK : STRATA_ENOMEM;
    int c_acc = -1, c_loss = -1, c_up = -1, c_down = -1, c_d0 = -1;
    size_t cap = 0;
    if (rc == 0 && fgets(line, (int)MAX_CSV_LINE, f) != NULL) {
        size_t n = split(line, fld, MAXF);
        for (size_t i = 0; i < n; i++) {
            if (strcmp(fld[i], "accuracy") == 0)
                c_acc = (int)i;
            else if (strcmp(fld[i], "loss") == 0)
                c_loss = (int)i;
            else if (strcmp(fld[i], "uplink_bytes") == 0)
                c_up = (int)i;
            else if (strcmp(fld[i], "downlink_bytes") == 0)
                c_down = (int)i;
            else if (strncmp(fld[i], "density:", 8) == 0) {
                if (c_d0 < 0)
                    c_d0 = (int)i;
                char **nl = realloc(r->layers, (r->nlayers + 1) * sizeof(char *));
                if (nl == NULL || (nl[r->nlayers] = strdup(fld[i] + 8)) == NULL) {
                    r->layers = nl ? nl : r->layers;
                    rc = STRATA_ENOMEM;
                    break;
                }
                r->layers = nl;
                r->nlayers++;
            }
        }
    }
    if (c_acc < 0 || c_loss < 0 || c_up < 0 || c_down < 0)
        rc = rc ? rc : STRATA_EPROTO;
    while (rc == 0 && fgets(line, (int)MAX_CSV_LINE, f) != NULL) {
        size_t n = split(line, fld, MAXF);
        if (n <= (size_t)c_down || n <= (size_t)c_up)
            continue;
        if (r->nrows == cap) {
            cap = cap ? 2 * cap : 64;
            round_row *nr = realloc(r->rows, cap * sizeof(round_row));
            double *nd = r->nlayers ? realloc(r->dens, cap * r->nlayers * sizeof(double)) : NULL;
            if (nr != NULL)
                r->rows = nr;
            if (nd != NULL)
                r->dens = nd;
            if (nr == NULL || (r->nlayers && nd == NULL)) {
                rc = STRATA_ENOMEM;
                break;
            }
        }
        round_row *row = &r->rows[r->nrows];
        row->acc = atof(fld[c_acc]);
        row->loss = atof(fld[c_loss]);
        row->up = atof(fld[c_up]);
        row->down = atof(fld[c_down]);
        for (size_t l = 0; l < r->nlayers; l++)
            r->dens[r->nrows * r->nlayers + l] =
                c_d0 >= 0 && (size_t)c_d0 + l < n ? atof(fld[(size_t)c_d0 + l]) : 0.0;
        r->nrows++;
    }
    free(line);
    free(fld);
    fclose(f);
    return rc;
}

/* ---- the study's outputs ------------------------------------------------ */

/* Writes out/study.csv: one row per finished run and round. */
static int write_csv(const study *s)
{
    char path[PATH_MAX];
    snprintf(path, sizeof(path), "%s/study.csv", s->out);
    FILE *f = fopen(path, "w");
    if (f == NULL)
        return STRATA_EIO;
    fputs("run", f);
    for (size_t k = 0; k < s->nkeys; k++)
        if (s->keys[k].axis)
            fprintf(f, ",%s", s->keys[k].name);
    fputs(",round,accuracy,loss,uplink_bytes,downlink_bytes,cum_uplink_bytes,cum_total_bytes\n", f);
    for (size_t i = 0; i < s->nruns; i++) {
        const run *r = &s->runs[i];
        double cu = 0, ct = 0;
        for (size_t j = 0; j < r->nrows; j++) {
            const round_row *w = &r->rows[j];
            cu += w->up;
            ct += w->up + w->down;
            fputs(r->name, f);
            for (size_t k = 0; k < s->nkeys; k++)
                if (s->keys[k].axis) {
                    const char *v = s->keys[k].vals[r->pick[k]];
                    fprintf(f, ",%s", v ? v : "");
                }
            fprintf(f, ",%zu,%.6f,%.6f,%.0f,%.0f,%.0f,%.0f\n", j, w->acc, w->loss, w->up, w->down,
                    cu, ct);
        }
    }
    return fclose(f) == 0 ? STRATA_OK : STRATA_EIO;
}

/* Whether run r belongs to the panel of run p: the same values on every
 * axis but policy and seed (a dense run joins every density and format). */
static int same_panel(const study *s, const run *p, const run *r)
{
    for (size_t k = 0; k < s->nkeys; k++) {
        if (!s->keys[k].axis || (int)k == s->k_policy || (int)k == s->k_seed)
            continue;
        if (((int)k == s->k_density || (int)k == s->k_values) && is_dense(s, r))
            continue;
        if (p->pick[k] != r->pick[k])
            return 0;
    }
    return 1;
}

/* The panel's name: its axis values but policy and seed. */
static void panel_name(const study *s, const run *p, char *out, size_t cap, int pretty)
{
    size_t n = 0;
    out[0] = '\0';
    for (size_t k = 0; k < s->nkeys; k++) {
        if (!s->keys[k].axis || (int)k == s->k_policy || (int)k == s->k_seed)
            continue;
        const char *v = s->keys[k].vals[p->pick[k]];
        char frag[128];
        if (pretty)
            snprintf(frag, sizeof(frag), "%s %s", s->keys[k].name, v ? v : "on");
        else
            fragment(frag, sizeof(frag), v);
        int w = snprintf(out + n, cap - n, "%s%s", n ? (pretty ? ", " : "_") : "", frag);
        if (w < 0 || (size_t)w >= cap - n)
            return;
        n += (size_t)w;
    }
    if (n == 0)
        snprintf(out, cap, pretty ? "all runs" : "all");
}

/* Mean and standard deviation (over the n values of v). */
static void mean_sd(const double *v, size_t n, double *mean, double *sd)
{
    double m = 0, q = 0;
    for (size_t i = 0; i < n; i++)
        m += v[i];
    m = n ? m / (double)n : 0;
    for (size_t i = 0; i < n; i++)
        q += (v[i] - m) * (v[i] - m);
    *mean = m;
    *sd = n > 1 ? sqrt(q / (double)(n - 1)) : 0;
}

/* One policy's runs within a panel, summarised per round over the seeds. */
typedef struct policy_line {
    const char *policy;
    size_t nseeds, nrounds;
    const run *first; /* its first seed's run */
    double *xu, *xt, *y, *lo, *hi;
    double final_acc, final_sd, up, total;
} policy_line;

static void line_free(policy_line *l)
{
    free(l->xu);
    free(l->xt);
    free(l->y);
    free(l->lo);
    free(l->hi);
}

/* Builds the line of policy value pv within the panel of p. */
static int build_line(const study *s, const run *p, size_t pv, policy_line *l)
{
    memset(l, 0, sizeof(*l));
    l->policy = s->k_policy >= 0 ? s->keys[s->k_policy].vals[pv] : "run";
    const run *mine[MAX_VALUES * MAX_VALUES];
    size_t n = 0, rounds = SIZE_MAX;
    for (size_t i = 0; i < s->nruns && n < sizeof(mine) / sizeof(mine[0]); i++) {
        const run *r = &s->runs[i];
        if (!r->done || r->nrows == 0 || !same_panel(s, p, r) ||
            (s->k_policy >= 0 && r->pick[s->k_policy] != pv))
            continue;
        mine[n++] = r;
        rounds = r->nrows < rounds ? r->nrows : rounds;
    }
    if (n == 0)
        return STRATA_OK;
    l->nseeds = n;
    l->nrounds = rounds;
    l->first = mine[0];
    l->xu = calloc(rounds, sizeof(double));
    l->xt = calloc(rounds, sizeof(double));
    l->y = calloc(rounds, sizeof(double));
    l->lo = calloc(rounds, sizeof(double));
    l->hi = calloc(rounds, sizeof(double));
    double *cu = calloc(n, sizeof(double)), *ct = calloc(n, sizeof(double));
    double *acc = calloc(n, sizeof(double));
    int rc = l->xu && l->xt && l->y && l->lo && l->hi && cu && ct && acc ? 0 : STRATA_ENOMEM;
    for (size_t j = 0; rc == 0 && j < rounds; j++) {
        double su = 0, st = 0, m, sd;
        for (size_t i = 0; i < n; i++) {
            cu[i] += mine[i]->rows[j].up;
            ct[i] += mine[i]->rows[j].up + mine[i]->rows[j].down;
            acc[i] = mine[i]->rows[j].acc;
            su += cu[i];
            st += ct[i];
        }
        mean_sd(acc, n, &m, &sd);
        l->xu[j] = su / (double)n;
        l->xt[j] = st / (double)n;
        l->y[j] = m;
        l->lo[j] = m - sd;
        l->hi[j] = m + sd;
        l->final_acc = m;
        l->final_sd = sd;
        l->up = l->xu[j];
        l->total = l->xt[j];
    }
    free(cu);
    free(ct);
    free(acc);
    return rc;
}

/* Writes one panel's plots and its part of the reports. */
static int write_panel(const study *s, const run *p, FILE *md, FILE *html)
{
    char name[512], title[512], path[PATH_MAX];
    panel_name(s, p, name, sizeof(name), 0);
    panel_name(s, p, title, sizeof(title), 1);
    size_t npol = s->k_policy >= 0 ? s->keys[s->k_policy].n : 1;
    policy_line lines[MAX_VALUES];
    sim_plot_line pu[MAX_VALUES], pt[MAX_VALUES];
    size_t nl = 0;
    int rc = 0;
    for (size_t v = 0; v < npol && rc == 0; v++) {
        rc = build_line(s, p, v, &lines[nl]);
        if (rc == 0 && lines[nl].nseeds > 0)
            nl++;
        else
            line_free(&lines[nl]);
    }
    if (rc < 0 || nl == 0)
        goto out;
    double dense_total = 0;
    for (size_t i = 0; i < nl; i++) {
        pu[i] = (sim_plot_line){lines[i].policy, lines[i].xu, lines[i].y,
                                lines[i].lo,     lines[i].hi, lines[i].nrounds};
        pt[i] = pu[i];
        pt[i].x = lines[i].xt;
        if (strcmp(lines[i].policy, "none") == 0)
            dense_total = lines[i].total;
    }
    fprintf(md,
            "\n## %s\n\n| policy | seeds | final accuracy | uplink bytes | total bytes |"
            " total vs dense |\n|---|---|---|---|---|---|\n",
            title);
    fprintf(html,
            "<h2>%s</h2>\n<table border=\"1\" cellpadding=\"4\"><tr><th>policy</th>"
            "<th>seeds</th><th>final accuracy</th><th>uplink bytes</th><th>total bytes</th>"
            "<th>total vs dense</th></tr>\n",
            title);
    for (size_t i = 0; i < nl; i++) {
        const policy_line *l = &lines[i];
        char ratio[32] = "";
        if (strcmp(l->policy, "none") == 0)
            snprintf(ratio, sizeof(ratio), "reference");
        else if (dense_total > 0 && l->total > 0)
            snprintf(ratio, sizeof(ratio), "%.1fx fewer", dense_total / l->total);
        fprintf(md, "| %s | %zu | %.4f ± %.4f | %.0f | %.0f | %s |\n", l->policy, l->nseeds,
                l->final_acc, l->final_sd, l->up, l->total, ratio);
        fprintf(html,
                "<tr><td>%s</td><td>%zu</td><td>%.4f &plusmn; %.4f</td><td>%.0f</td>"
                "<td>%.0f</td><td>%s</td></tr>\n",
                l->policy, l->nseeds, l->final_acc, l->final_sd, l->up, l->total, ratio);
    }
    fputs("</table>\n", html);
    static const char *const KIND[2] = {"uplink", "total"};
    for (int k = 0; k < 2; k++) {
        char file[600], t[600];
        snprintf(file, sizeof(file), "plots/%s-%s.svg", name, KIND[k]);
        snprintf(t, sizeof(t), "%s: accuracy vs cumulative %s bytes", title, KIND[k]);
        snprintf(path, sizeof(path), "%s/%s", s->out, file);
        if (sim_plot_lines(path, t,
                           k ? "cumulative uplink + downlink bytes (log)"
                             : "cumulative uplink bytes (log)",
                           "test accuracy (mean ± sd over seeds)", k ? pt : pu, nl) == 0) {
            fprintf(md, "\n![%s](%s)\n", t, file);
            fprintf(html, "<p><img src=\"%s\" alt=\"%s\"></p>\n", file, t);
        }
    }
    /* Heat maps of the adaptive policies' per-layer densities (first seed). */
    for (size_t i = 0; i < nl; i++) {
        const run *r = lines[i].first;
        const char *pol = lines[i].policy;
        if (r->nlayers == 0 || strcmp(pol, "none") == 0 || strcmp(pol, "uniform") == 0)
            continue;
        double *v = malloc(r->nlayers * r->nrows * sizeof(double));
        if (v == NULL)
            continue;
        for (size_t l = 0; l < r->nlayers; l++)
            for (size_t j = 0; j < r->nrows; j++)
                v[l * r->nrows + j] = r->dens[j * r->nlayers + l];
        char file[700], t[1400], frag[128];
        fragment(frag, sizeof(frag), pol);
        snprintf(file, sizeof(file), "plots/%s-%s-density.svg", name, frag);
        snprintf(t, sizeof(t), "%s, %s: per-layer density by round (%s)", title, pol, r->name);
        snprintf(path, sizeof(path), "%s/%s", s->out, file);
        if (sim_plot_heatmap(path, t, (const char *const *)r->layers, r->nlayers, r->nrows, v) ==
            0) {
            fprintf(md, "\n![%s](%s)\n", t, file);
            fprintf(html, "<p><img src=\"%s\" alt=\"%s\"></p>\n", file, t);
        }
        free(v);
    }
out:
    for (size_t i = 0; i < nl; i++)
        line_free(&lines[i]);
    return rc;
}

/* Writes study.csv, the plots, report.md and report.html. */
static int write_outputs(study *s, size_t nfailed)
{
    char path[PATH_MAX];
    snprintf(path, sizeof(path), "%s/plots", s->out);
    if (mkdir(path, 0755) != 0 && errno != EEXIST)
        return STRATA_EIO;
    int rc = write_csv(s);
    char md_path[PATH_MAX], html_path[PATH_MAX];
    snprintf(md_path, sizeof(md_path), "%s/report.md", s->out);
    snprintf(html_path, sizeof(html_path), "%s/report.html", s->out);
    FILE *md = fopen(md_path, "w"), *html = fopen(html_path, "w");
    if (md == NULL || html == NULL) {
        if (md)
            fclose(md);
        if (html)
            fclose(html);
        return STRATA_EIO;
    }
    size_t done = 0;
    for (size_t i = 0; i < s->nruns; i++)
        done += s->runs[i].done;
    fprintf(md,
            "# strata-sim study\n\n%zu of %zu runs finished%s; every run and round in "
            "[study.csv](study.csv). Lines are the mean over seeds, bands one standard "
            "deviation.\n",
            done, s->nruns, nfailed ? " (see the failed runs' logs in runs/)" : "");
    fprintf(html,
            "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>strata-sim study"
            "</title></head><body>\n<h1>strata-sim study</h1>\n<p>%zu of %zu runs finished; "
            "every run and round in <a href=\"study.csv\">study.csv</a>. Lines are the mean "
            "over seeds, bands one standard deviation.</p>\n",
            done, s->nruns);
    /* One panel per distinct combination, in grid order. */
    for (size_t i = 0; i < s->nruns && rc == 0; i++) {
        if (is_dense(s, &s->runs[i]) && s->nruns > 1)
            continue; /* dense runs join the other panels */
        int seen = 0;
        for (size_t j = 0; j < i && !seen; j++)
            seen = !is_dense(s, &s->runs[j]) && same_panel(s, &s->runs[j], &s->runs[i]);
        if (!seen)
            rc = write_panel(s, &s->runs[i], md, html);
    }
    fputs("</body></html>\n", html);
    if (fclose(md) != 0 || fclose(html) != 0)
        rc = rc ? rc : STRATA_EIO;
    return rc;
}

int sim_study_run(const char *spec_path, const char *out, const char *self,
                  sim_study_check_fn check, volatile sig_atomic_t *stop)
{
    study s;
    memset(&s, 0, sizeof(s));
    s.out = out;
    strata_diag d = {{0}};
    int code = 2, rc = load_spec(&s, spec_path, &d);
    if (rc == 0)
        rc = build_grid(&s, &d);
    s.k_policy = find_key(&s, "policy");
    s.k_seed = find_key(&s, "seed");
    s.k_density = find_key(&s, "density");
    s.k_values = find_key(&s, "values");
    for (size_t i = 0; rc == 0 && i < s.nruns; i++) {
        char *argv[MAX_ARGS + 1];
        int n = run_args(&s, &s.runs[i], argv, MAX_ARGS);
        strata_diag cd = {{0}};
        if ((rc = check(n, argv, &cd)) < 0)
            rc = strata_diag_set(&d, rc, "--study, run %s: %s", s.runs[i].name,
                                 strata_diag_msg(&cd, rc));
    }
    char runs[PATH_MAX];
    snprintf(runs, sizeof(runs), "%s/runs", out);
    if (rc == 0 && (mkdirs(runs) < 0))
        rc = strata_diag_set(&d, STRATA_EIO, "cannot create %s: %s", runs, strerror(errno));
    if (rc < 0) {
        strata_log_error("%s", strata_diag_msg(&d, rc));
        goto out;
    }
    size_t nfailed = 0, skipped = 0;
    code = 0;
    for (size_t i = 0; i < s.nruns && !*stop; i++) {
        run *r = &s.runs[i];
        char marker[PATH_MAX];
        snprintf(marker, sizeof(marker), "%s/runs/%s/study.done", out, r->name);
        if (exists(marker)) {
            r->done = 1;
            skipped++;
            continue;
        }
        strata_log_info("run %zu/%zu: %s", i + 1, s.nruns, r->name);
        int ec = run_one(&s, r, self, stop);
        if (ec == 0) {
            r->done = strata_file_write_atomic(marker, "done\n", 5, 0644, &d) == 0;
        } else if (ec != 130) {
            nfailed++;
            strata_log_error("run %s failed (exit %d); see %s/runs/%s.log", r->name, ec, out,
                             r->name);
        }
    }
    for (size_t i = 0; i < s.nruns; i++)
        if (s.runs[i].done && read_report(&s, &s.runs[i]) < 0) {
            strata_log_warn("run %s: its report.csv cannot be read", s.runs[i].name);
            s.runs[i].done = 0;
        }
    if (write_outputs(&s, nfailed) < 0) {
        strata_log_error("cannot write the study's report in %s", out);
        code = 1;
    }
    strata_log_info("%zu runs (%zu finished before), %zu failed; report in %s/report.md", s.nruns,
                    skipped, nfailed, out);
    if (*stop) {
        strata_log_warn("interrupted; run the same command again to continue the study");
        code = 130;
    } else if (nfailed > 0) {
        code = 1;
    }
out:
    study_free(&s);
    return code;
}
