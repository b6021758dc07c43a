/* strata-sim: a study's outputs — each finished run's report.csv read back,
 * then study.csv (one row per run and round), the SVG plots (accuracy
 * against cumulative uplink and total bytes, one line per policy with a
 * band over the seeds; per-layer density heat maps of adaptive policies)
 * and report.md and report.html. */
#include "study.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

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

/* A CSV field's number, or NaN when it is empty (a value not known). */
static double field_number(const char *f)
{
    char *end = NULL;
    double v = strtod(f, &end);
    return end == f ? NAN : v;
}

int sim__study_read_report(const study *s, run *r)
{
    char path[PATH_MAX];
    snprintf(path, sizeof(path), "%s/runs/%s/report.csv", s->out, r->name);
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return STRATA_EIO;
    enum { MAXF = 4096 };
    char *line = malloc(MAX_CSV_LINE), **fld = malloc(MAXF * sizeof(char *));
    int rc = line && fld ? STRATA_OK : STRATA_ENOMEM;
    int c_acc = -1, c_loss = -1, c_up = -1, c_down = -1, c_d0 = -1, c_eval = -1;
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
            else if (strcmp(fld[i], "eval_samples") == 0)
                c_eval = (int)i;
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
        row->acc = field_number(fld[c_acc]);
        row->loss = field_number(fld[c_loss]);
        row->model_acc = !isnan(row->acc) ? row->acc
                         : r->nrows > 0   ? r->rows[r->nrows - 1].model_acc
                                          : NAN;
        row->up = atof(fld[c_up]);
        row->down = atof(fld[c_down]);
        row->eval = c_eval >= 0 && (size_t)c_eval < n ? atof(fld[c_eval]) : 0.0;
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
    fputs(",round,accuracy,loss,uplink_bytes,downlink_bytes,cum_uplink_bytes,cum_total_bytes,"
          "eval_samples\n",
          f);
    for (size_t i = 0; i < s->nruns; i++) {
        const run *r = &s->runs[i];
        double cu = 0, ct = 0;
        for (size_t j = 0; j < r->nrows; j++) {
            const round_row *w = &r->rows[j];
            char ta[32], tl[32];
            cu += w->up;
            ct += w->up + w->down;
            fputs(r->name, f);
            for (size_t k = 0; k < s->nkeys; k++)
                if (s->keys[k].axis) {
                    const char *v = s->keys[k].vals[r->pick[k]];
                    fprintf(f, ",%s", v ? v : "");
                }
            fprintf(f, ",%zu,%s,%s,%.0f,%.0f,%.0f,%.0f,%.0f\n", j,
                    sim_metric_text(w->acc, 6, "", ta, sizeof(ta)),
                    sim_metric_text(w->loss, 6, "", tl, sizeof(tl)), w->up, w->down, cu, ct,
                    w->eval);
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
        if (((int)k == s->k_density || (int)k == s->k_values) && sim__study_is_dense(s, r))
            continue;
        if (p->pick[k] != r->pick[k])
            return 0;
    }
    return 1;
}

/* The panel's name: its axis values but policy and seed (and, for a panel
 * of dense runs only, but density and values, which they ignore). */
static void panel_name(const study *s, const run *p, char *out, size_t cap, int pretty)
{
    size_t n = 0;
    const int dense = sim__study_is_dense(s, p);
    out[0] = '\0';
    for (size_t k = 0; k < s->nkeys; k++) {
        if (!s->keys[k].axis || (int)k == s->k_policy || (int)k == s->k_seed)
            continue;
        if (dense && ((int)k == s->k_density || (int)k == s->k_values))
            continue;
        const char *v = s->keys[k].vals[p->pick[k]];
        char frag[128];
        if (pretty)
            snprintf(frag, sizeof(frag), "%s %s", s->keys[k].name, v ? v : "on");
        else
            sim__study_fragment(frag, sizeof(frag), v);
        int w = snprintf(out + n, cap - n, "%s%s", n ? (pretty ? ", " : "_") : "", frag);
        if (w < 0 || (size_t)w >= cap - n)
            return;
        n += (size_t)w;
    }
    if (n == 0)
        snprintf(out, cap, pretty ? "all runs" : "all");
}

/* Mean and sample standard deviation of the values of v that are known
 * (not NaN); the mean is NaN when none is. Returns how many are known. */
static size_t mean_sd(const double *v, size_t n, double *mean, double *sd)
{
    double m = 0, q = 0;
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (!isnan(v[i])) {
            m += v[i];
            k++;
        }
    m = k ? m / (double)k : NAN;
    for (size_t i = 0; i < n; i++)
        if (!isnan(v[i]))
            q += (v[i] - m) * (v[i] - m);
    *mean = m;
    *sd = k > 1 ? sqrt(q / (double)(k - 1)) : 0;
    return k;
}

/* One policy's runs within a panel, summarised per round over the seeds. */
typedef struct policy_line {
    const char *policy;
    size_t nseeds, nrounds;
    const run *first; /* its first seed's run */
    double *xu, *xt, *y, *lo, *hi;
    double final_acc, final_sd, up, total;
    size_t final_known; /* seeds with a final accuracy (evaluated at least once) */
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
            acc[i] = mine[i]->rows[j].model_acc;
            su += cu[i];
            st += ct[i];
        }
        size_t known = mean_sd(acc, n, &m, &sd);
        l->xu[j] = su / (double)n;
        l->xt[j] = st / (double)n;
        l->y[j] = m;
        l->lo[j] = m - sd;
        l->hi[j] = m + sd;
        l->final_acc = m;
        l->final_sd = sd;
        l->final_known = known;
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
        char acc[128] = "none", acch[128] = "none";
        char some[64] = "";
        if (l->final_known < l->nseeds)
            snprintf(some, sizeof(some), " (%zu of %zu seeds)", l->final_known, l->nseeds);
        if (!isnan(l->final_acc)) {
            snprintf(acc, sizeof(acc), "%.4f ± %.4f%s", l->final_acc, l->final_sd, some);
            snprintf(acch, sizeof(acch), "%.4f &plusmn; %.4f%s", l->final_acc, l->final_sd, some);
        }
        fprintf(md, "| %s | %zu | %s | %.0f | %.0f | %s |\n", l->policy, l->nseeds, acc, l->up,
                l->total, ratio);
        fprintf(html,
                "<tr><td>%s</td><td>%zu</td><td>%s</td><td>%.0f</td>"
                "<td>%.0f</td><td>%s</td></tr>\n",
                l->policy, l->nseeds, acch, l->up, l->total, ratio);
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
        sim__study_fragment(frag, sizeof(frag), pol);
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

/* Whether run i belongs to a panel that another run opens: an earlier run of
 * the same kind (dense or compressed) with the same axes, or, for a dense
 * run, any compressed run that shares its other axes. So dense runs join the
 * compressed runs' panels, and make their own where none shares them (a grid
 * of dense runs only). */
static int in_other_panel(const study *s, size_t i)
{
    const run *r = &s->runs[i];
    const int dense = sim__study_is_dense(s, r);
    for (size_t j = 0; j < s->nruns; j++) {
        const int qdense = sim__study_is_dense(s, &s->runs[j]);
        int opens = qdense == dense ? j < i : dense && !qdense;
        if (opens && same_panel(s, &s->runs[j], r))
            return 1;
    }
    return 0;
}

int sim__study_write_outputs(study *s, size_t nfailed)
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
    size_t done = sim__study_done_count(s);
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
    for (size_t i = 0; i < s->nruns && rc == 0; i++)
        if (!in_other_panel(s, i))
            rc = write_panel(s, &s->runs[i], md, html);
    fputs("</body></html>\n", html);
    if (fclose(md) != 0 || fclose(html) != 0)
        rc = rc ? rc : STRATA_EIO;
    return rc;
}
