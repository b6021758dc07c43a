/* The coordinator's side of the lgreco loop (see lgreco.h). */
#include "lgreco.h"

#include "budgets_internal.h"

#include "strata/log.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Reads meta's error table: its shape and, when table is not NULL, its
 * values (rows x cols, with cols == want_cols when want_cols > 0). */
static void scan(const char *meta, size_t nlayers, size_t want_cols, double *table,
                 srv_lgreco_scan *out)
{
    memset(out, 0, sizeof(*out));
    json_t *root = meta != NULL ? json_loads(meta, JSON_REJECT_DUPLICATES, NULL) : NULL;
    const json_t *t = root != NULL ? json_object_get(root, "error_table") : NULL;
    out->present = t != NULL;
    if (t == NULL)
        goto out;
    if (!json_is_array(t) || json_array_size(t) != nlayers) {
        snprintf(out->bad, sizeof(out->bad),
                 "metadata.error_table: expected an array of %zu rows (one per layer)", nlayers);
        goto out;
    }
    for (size_t l = 0; l < nlayers; l++) {
        const json_t *row = json_array_get(t, l);
        size_t n = json_array_size(row);
        if (l == 0)
            out->cols = n;
        if (!json_is_array(row) || n == 0 || n != out->cols || (want_cols > 0 && n != want_cols)) {
            snprintf(out->bad, sizeof(out->bad),
                     "metadata.error_table[%zu]: expected an array of %zu numbers (one per "
                     "candidate)",
                     l, want_cols > 0 ? want_cols : out->cols);
            goto out;
        }
        for (size_t c = 0; c < n; c++) {
            const json_t *v = json_array_get(row, c);
            double x = json_is_number(v) ? json_number_value(v) : -1.0;
            if (!(x >= 0.0 && isfinite(x))) {
                snprintf(out->bad, sizeof(out->bad),
                         "metadata.error_table[%zu][%zu]: expected a finite number >= 0", l, c);
                goto out;
            }
            if (table != NULL)
                table[l * n + c] = x;
        }
    }
out:
    json_decref(root);
}

void srv__lgreco_scan(const char *meta, size_t nlayers, srv_lgreco_scan *out)
{
    scan(meta, nlayers, 0, NULL, out);
}

int srv__lgreco_check(const srv_lgreco_scan *s, size_t ncands, char *msg, size_t mlen)
{
    if (ncands == 0) {
        if (!s->present)
            return 0;
        snprintf(msg, mlen, "metadata.error_table: this round's task asks for no error table");
    } else if (!s->present) {
        snprintf(msg, mlen,
                 "metadata.error_table: missing (the task asks for %zu candidates per layer)",
                 ncands);
    } else if (s->bad[0] != '\0') {
        snprintf(msg, mlen, "%s", s->bad);
    } else if (s->cols != ncands) {
        snprintf(msg, mlen,
                 "metadata.error_table: rows of %zu numbers, expected %zu numbers (one per "
                 "candidate)",
                 s->cols, ncands);
    } else {
        return 0;
    }
    return STRATA_EPROTO;
}

/* Reads the error table of a stored update's metadata into table (nlayers x
 * ncands) with the checks of srv__lgreco_scan and srv__lgreco_check.
 * Returns 0, or STRATA_EPROTO with the reason in msg. */
static int read_table(size_t nlayers, size_t ncands, const char *meta, double *table, char *msg,
                      size_t mlen)
{
    srv_lgreco_scan s;
    scan(meta, nlayers, ncands, table, &s);
    return srv__lgreco_check(&s, ncands, msg, mlen);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Combines m tables (row-major m x cells in all, weights w) into out: with
 * one or two tables their weighted mean, with three or more the
 * coordinate-wise median, which no single table can move by much (a client
 * that lies about its errors cannot steer the allocation). col is scratch
 * (m). Non-finite results are left to the policy to refuse. */
static void combine(const double *all, const double *w, size_t m, size_t cells, double *col,
                    double *out)
{
    for (size_t k = 0; k < cells; k++) {
        if (m <= 2) {
            double s = 0.0, ws = 0.0;
            for (size_t i = 0; i < m; i++) {
                s += w[i] * all[i * cells + k];
                ws += w[i];
            }
            out[k] = s / ws;
            continue;
        }
        for (size_t i = 0; i < m; i++)
            col[i] = all[i * cells + k];
        qsort(col, m, sizeof(double), cmp_double);
        out[k] = m % 2 ? col[m / 2] : 0.5 * (col[m / 2 - 1] + col[m / 2]);
    }
}

int srv__lgreco_solve(srv_budgets *B, strata_store *s, const strata_payload_limits *lim, uint32_t r,
                      size_t ncands, const uint64_t *ids, const double *w, const int *kept,
                      size_t n, int *solved, strata_diag *d)
{
    *solved = 0;
    size_t nc = ncands, cells = B->c.nlayers * nc, m = 0;
    if (n > 0 && cells > SIZE_MAX / sizeof(double) / n)
        return strata_diag_set(d, STRATA_ENOMEM, "out of memory (the error tables)");
    double *all = calloc(n * cells + 1, sizeof(double)), *ws = calloc(n + 1, sizeof(double));
    double *col = calloc(n + 1, sizeof(double)), *table = calloc(cells + 1, sizeof(double));
    int rc = 0;
    if (all == NULL || ws == NULL || col == NULL || table == NULL) {
        rc = strata_diag_set(d, STRATA_ENOMEM, "out of memory (the error tables)");
        goto out;
    }
    for (size_t i = 0; i < n && rc == 0; i++) {
        if (!kept[i])
            continue;
        uint8_t *buf = NULL;
        size_t len = 0;
        strata_payload *p = NULL;
        char msg[256] = "";
        rc = strata_store_update_read(s, r, ids[i], &buf, &len, d);
        if (rc == 0 && (rc = strata_payload_decode(buf, len, lim, &p, d)) == 0 &&
            read_table(B->c.nlayers, nc, p->metadata_json, all + m * cells, msg, sizeof(msg)) < 0)
            rc = strata_diag_set(d, STRATA_EPROTO, "client %llu: %s", (unsigned long long)ids[i],
                                 msg);
        if (rc == 0)
            ws[m++] = w[i];
        strata_payload_free(p);
        free(buf);
    }
    if (rc < 0 || m == 0)
        goto out;
    combine(all, ws, m, cells, col, table);
    /* A table the policy cannot use (its errors overflowed) leaves the last
     * allocation in place: the round closes all the same. */
    strata_diag pd = {{0}};
    if (strata_policy_set_lgreco_table(B->policy, table, B->c.numel, B->c.nlayers, B->c.density,
                                       &pd) < 0) {
        strata_log_warn("round %u: lgreco keeps its allocation: the clients' tables give no "
                        "usable table (%s)",
                        r, pd.msg);
        goto out;
    }
    *solved = 1;
    strata_lgreco_report rep = strata_policy_lgreco_report(B->policy);
    strata_log_info("round %u: lgreco solved %zu tables: estimated %.0f bytes per update "
                    "(uniform %.0f), error %.4g within %.4g%s",
                    r, m, rep.bytes, rep.uniform_bytes, rep.chosen_error, rep.error_budget,
                    rep.fell_back ? " (uniform kept: nothing cheaper fits)" : "");
out:
    free(all);
    free(ws);
    free(col);
    free(table);
    return rc;
}

void srv__lgreco_summary(const srv_budgets *B, uint32_t next, strata_round_summary *s,
                         char (*specs)[64], char **ptrs)
{
    if (B->policy == NULL)
        return;
    strata_budget *b = calloc(B->c.nlayers + 1, sizeof(*b));
    if (b == NULL || strata_policy_budgets(B->policy, B->c.numel, B->c.nlayers, B->c.density, next,
                                           (uint32_t)B->c.rounds, b, NULL) < 0) {
        free(b);
        return;
    }
    for (size_t l = 0; l < B->c.nlayers; l++)
        ptrs[l] = strata_budget_format(&b[l], 1, specs[l], 64);
    free(b);
    strata_lgreco_report rep = strata_policy_lgreco_report(B->policy);
    s->has_lgreco = 1;
    s->lg_fell_back = rep.fell_back;
    s->lg_error_budget = rep.error_budget;
    s->lg_chosen_error = rep.chosen_error;
    s->lg_bytes = rep.bytes;
    s->lg_uniform_bytes = rep.uniform_bytes;
    s->lg_allocation = ptrs;
}

int srv__lgreco_restore(srv_budgets *B, strata_store *st, uint32_t next_round, strata_diag *d)
{
    if (B->policy == NULL || strata_policy_lgreco_every(B->policy) == 0)
        return 0;
    int rc = 0;
    for (uint32_t r = next_round; r-- > 0 && rc == 0;) {
        strata_store_round rd;
        memset(&rd, 0, sizeof(rd));
        int found = 0;
        if ((rc = strata_store_round_get(st, r, &rd, &found, d)) < 0)
            break;
        strata_round_summary s;
        int has = 0;
        if (found && rd.summary_json != NULL &&
            strata_round_summary_decode(rd.summary_json, strlen(rd.summary_json), NULL, &s, NULL) ==
                0) {
            has = s.has_lgreco && s.num_layers == B->c.nlayers;
            strata_budget *b = has ? calloc(B->c.nlayers + 1, sizeof(*b)) : NULL;
            for (size_t l = 0; b != NULL && l < B->c.nlayers; l++)
                strata_budget_parse(s.lg_allocation[l], 1, &b[l], NULL);
            if (b != NULL) {
                strata_lgreco_report rep = {.solved = 1,
                                            .fell_back = s.lg_fell_back,
                                            .error_budget = s.lg_error_budget,
                                            .chosen_error = s.lg_chosen_error,
                                            .bytes = s.lg_bytes,
                                            .uniform_bytes = s.lg_uniform_bytes};
                strata_diag pd = {{0}};
                if (strata_policy_restore_lgreco(B->policy, b, B->c.numel, B->c.nlayers,
                                                 B->c.density, &rep, &pd) == 0)
                    strata_log_info("lgreco: the allocation solved at round %u is back in use", r);
                else
                    strata_log_warn("lgreco: the allocation of round %u cannot be restored: %s", r,
                                    pd.msg);
            }
            free(b);
            strata_round_summary_cleanup(&s);
        }
        strata_store_round_cleanup(&rd);
        if (has)
            break;
    }
    return rc;
}
