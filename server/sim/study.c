/* strata-sim: studies — the spec (one JSON object of strata-sim options,
 * a list of values making an option an axis), the grid of runs it
 * describes (models × partitions × policies × densities × value formats ×
 * seeds, or any other options), each run checked before any starts, then
 * run one after the other, finished ones skipped and a stopped one
 * resumed. The outputs are study_report.c's. */
#include "study.h"

#include "strata/clock.h"
#include "strata/fileio.h"
#include "strata/log.h"
#include "strata/opts.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define MAX_SPEC_BYTES ((size_t)1 << 20)

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

void sim__study_fragment(char *out, size_t cap, const char *value)
{
    size_t n = 0;
    for (const char *p = value ? value : "on"; *p && n + 1 < cap; p++)
        out[n++] = (*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') ||
                           (*p >= '0' && *p <= '9') || *p == '.' || *p == '+' || *p == '-'
                       ? *p
                       : '-';
    out[n] = '\0';
}

int sim__study_is_dense(const study *s, const run *r)
{
    return s->k_policy >= 0 && s->keys[s->k_policy].vals[r->pick[s->k_policy]] != NULL &&
           strcmp(s->keys[s->k_policy].vals[r->pick[s->k_policy]], "none") == 0;
}

size_t sim__study_done_count(const study *s)
{
    size_t n = 0;
    for (size_t i = 0; i < s->nruns; i++)
        n += s->runs[i].done != 0;
    return n;
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
        sim__study_fragment(frag, sizeof(frag), s->keys[k].vals[r->pick[k]]);
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
        if (sim__study_is_dense(s, &r)) {
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

/* Options a dense FedAvg run goes without: it is the reference, dense both
 * ways. */
static int dense_ignores(const char *key)
{
    return strcmp(key, "density") == 0 || strcmp(key, "values") == 0 ||
           strcmp(key, "downlink") == 0 || strcmp(key, "downlink_keep") == 0;
}

/* The options of run r as a command line (no executable); strings
 * borrowed from s, flags without a value. */
static int run_args(const study *s, const run *r, char **argv, int cap)
{
    int n = 0;
    static char flags[MAX_KEYS][96];
    const int dense = sim__study_is_dense(s, r);
    for (size_t k = 0; k < s->nkeys; k++) {
        const char *v = s->keys[k].vals[r->pick[k]];
        if (v == NULL || n + 2 > cap || (dense && dense_ignores(s->keys[k].name)))
            continue;
        strata_opt_flag(s->keys[k].name, flags[k], sizeof(flags[k]));
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

/* After run i (r) exited 0: reads its report (here, once) and logs its
 * final accuracy and bytes, and the time the runs still to go would take
 * at mean_s each. Returns 0, or -1 (logged) when the report cannot be read
 * or has no rounds. */
static int run_finished(study *s, run *r, size_t i, double mean_s)
{
    size_t left = 0;
    for (size_t k = i + 1; k < s->nruns; k++)
        left += !s->runs[k].done;
    if (sim__study_read_report(s, r) < 0 || r->nrows == 0) {
        strata_log_error("run %s: its report.csv %s; see %s/runs/%s.log", r->name,
                         r->nrows == 0 ? "has no rounds" : "cannot be read", s->out, r->name);
        return -1;
    }
    double up = 0, total = 0;
    for (size_t k = 0; k < r->nrows; k++) {
        up += r->rows[k].up;
        total += r->rows[k].up + r->rows[k].down;
    }
    char acc[32];
    strata_log_info("run %zu/%zu: %s finished: accuracy %s, %.2f MB up, %.2f MB in all; "
                    "%zu run%s to go, about %.0f min",
                    i + 1, s->nruns, r->name,
                    sim_metric_text(r->rows[r->nrows - 1].model_acc, 4, "none", acc, sizeof(acc)),
                    up / 1e6, total / 1e6, left, left == 1 ? "" : "s",
                    (double)left * mean_s / 60.0);
    return 0;
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

int sim_study_run(const char *spec_path, const char *out, const char *self,
                  sim_study_check_fn check, volatile sig_atomic_t *stop)
{
    study s;
    memset(&s, 0, sizeof(s));
    s.out = out;
    strata_diag d = {{0}};
    int code = 2, rc = load_spec(&s, spec_path, &d);
    /* The grid needs to know which keys are the policy, density and values
     * (dense runs collapse onto one per seed). */
    s.k_policy = find_key(&s, "policy");
    s.k_seed = find_key(&s, "seed");
    s.k_density = find_key(&s, "density");
    s.k_values = find_key(&s, "values");
    if (rc == 0)
        rc = build_grid(&s, &d);
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
    size_t nfailed = 0, skipped = 0, timed = 0;
    double busy_s = 0;
    code = 0;
    /* Runs finished by an earlier invocation (study.done) are skipped. */
    char marker[PATH_MAX];
    for (size_t i = 0; i < s.nruns; i++) {
        snprintf(marker, sizeof(marker), "%s/runs/%s/study.done", out, s.runs[i].name);
        if (exists(marker)) {
            s.runs[i].done = 1;
            skipped++;
        }
    }
    for (size_t i = 0; i < s.nruns && !*stop; i++) {
        run *r = &s.runs[i];
        if (r->done)
            continue;
        snprintf(marker, sizeof(marker), "%s/runs/%s/study.done", out, r->name);
        strata_log_info("run %zu/%zu: %s", i + 1, s.nruns, r->name);
        double t0 = strata_clock_mono_s();
        int ec = run_one(&s, r, self, stop);
        if (ec == 0) {
            busy_s += strata_clock_mono_s() - t0;
            timed++;
            if (run_finished(&s, r, i, busy_s / (double)timed) < 0)
                nfailed++;
            else
                r->done = strata_file_write_atomic(marker, "done\n", 5, 0644, &d) == 0;
        } else if (ec != 130) {
            nfailed++;
            strata_log_error("run %s failed (exit %d); see %s/runs/%s.log", r->name, ec, out,
                             r->name);
        }
    }
    for (size_t i = 0; i < s.nruns; i++)
        if (s.runs[i].done && s.runs[i].rows == NULL &&
            sim__study_read_report(&s, &s.runs[i]) < 0) {
            strata_log_warn("run %s: its report.csv cannot be read", s.runs[i].name);
            s.runs[i].done = 0;
        }
    if (sim__study_write_outputs(&s, nfailed) < 0) {
        strata_log_error("cannot write the study's report in %s", out);
        code = 1;
    }
    strata_log_info("%zu of %zu run%s finished (%zu before), %zu failed; report in %s/report.md",
                    sim__study_done_count(&s), s.nruns, s.nruns == 1 ? "" : "s", skipped, nfailed,
                    out);
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
