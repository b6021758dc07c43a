/* strata-sim: the report — report.csv and report.md in the output
 * directory, and the closing summary (a log line, and the --json line on
 * standard output) — built from the round records in the coordinator's
 * store. */
#include "sim.h"

#include "store.h"
#include "strata/log.h"

#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* How many test images the accuracies stand on: the last evaluated round's
 * count and, with --eval-samples, the earlier rounds' (rounds not
 * evaluated, eval_samples 0, are left out). */
static void note_eval_samples(FILE *fm, const strata_round_summary *list, size_t nr)
{
    const strata_round_summary *last = NULL;
    for (size_t i = nr; i-- > 0 && last == NULL;)
        if (list[i].eval_samples > 0)
            last = &list[i];
    if (last == NULL)
        return;
    uint64_t sub = 0;
    for (size_t i = 0; i < nr; i++)
        if (list[i].eval_samples > 0 && list[i].eval_samples != last->eval_samples)
            sub = list[i].eval_samples;
    fprintf(fm, "\nAccuracy and loss of round %u are on %llu test images", last->round,
            (unsigned long long)last->eval_samples);
    if (sub > 0)
        fprintf(fm,
                ", those of earlier rounds on %llu (--eval-samples: every round but the last; "
                "column eval_samples of report.csv)",
                (unsigned long long)sub);
    fprintf(fm, ".\n");
}

/* Decodes the summaries of the store's closed rounds into *out (*n of
 * them); a record whose summary does not decode is left out, with a
 * warning. */
static int read_summaries(const char *state_dir, strata_round_summary **out, size_t *n)
{
    *out = NULL;
    *n = 0;
    strata_store *s = NULL;
    strata_diag d = {{0}};
    strata_store_round *list = NULL;
    size_t nr = 0;
    int rc = strata_store_open(state_dir, &s, &d);
    if (rc == 0)
        rc = strata_store_round_list(s, 0, 1000000, &list, &nr, &d);
    if (rc < 0) {
        strata_log_error("cannot read the coordinator's records: %s", strata_diag_msg(&d, rc));
        goto out;
    }
    if (nr > 0 && (*out = calloc(nr, sizeof(strata_round_summary))) == NULL) {
        strata_log_error("out of memory");
        rc = STRATA_ENOMEM;
        goto out;
    }
    for (size_t i = 0; i < nr; i++) {
        if (list[i].summary_json == NULL)
            continue;
        strata_round_summary *sm = &(*out)[*n];
        int src = strata_round_summary_decode(list[i].summary_json, strlen(list[i].summary_json),
                                              NULL, sm, &d);
        if (src < 0) {
            strata_log_warn("round %u: %s", list[i].round, strata_diag_msg(&d, src));
            continue;
        }
        (*n)++;
    }
out:
    strata_store_round_list_free(list, nr);
    strata_store_close(s);
    return rc;
}

/* The lgreco solves of the run: per solve, the error budget, the chosen
 * error, the estimated bytes per update against uniform's, and the
 * allocation the next rounds used. */
static void report_lgreco(FILE *fm, const strata_round_summary *list, size_t nr)
{
    int any = 0;
    for (size_t i = 0; i < nr; i++) {
        const strata_round_summary *s = &list[i];
        if (!s->has_lgreco)
            continue;
        if (!any)
            fprintf(fm, "\nlgreco solves (error of the chosen allocation within uniform's; "
                        "estimated payload bytes per update):\n\n| round | error | error budget "
                        "| bytes | uniform bytes | allocation |\n|---|---|---|---|---|---|\n");
        any = 1;
        fprintf(fm, "| %u | %.4g | %.4g | %.0f | %.0f | ", s->round, s->lg_chosen_error,
                s->lg_error_budget, s->lg_bytes, s->lg_uniform_bytes);
        for (size_t k = 0; k < s->num_layers; k++)
            fprintf(fm, "%s%s %s", k ? "," : "", s->layer_names[k], s->lg_allocation[k]);
        fprintf(fm, "%s |\n", s->lg_fell_back ? " (uniform kept)" : "");
    }
}

int sim_report_check(const char *state_dir)
{
    char db[PATH_MAX];
    struct stat st;
    strata_diag d = {{0}};
    if (strata_store_path(state_dir, STRATA_STORE_FILE_DB, 0, 0, db, sizeof(db), &d) < 0 ||
        stat(db, &st) != 0) {
        strata_log_error("%s holds no coordinator state (no database)", state_dir);
        return STRATA_ESTATE;
    }
    strata_store *s = NULL;
    int rc = strata_store_open(state_dir, &s, &d);
    strata_store_close(s);
    if (rc < 0)
        strata_log_error("%s: %s (has the coordinator stopped?)", state_dir,
                         strata_diag_msg(&d, rc));
    return rc;
}

/* Appends the clients table to the report fm: every registered client by
 * id, its data share (its place in the order of registration, which is how
 * the coordinator assigns --data-shares) and its accepted updates over
 * rounds [0, nrounds). */
static int write_clients(FILE *fm, const char *state_dir, long data_shares, uint32_t nrounds)
{
    strata_store *s = NULL;
    strata_diag d = {{0}};
    uint64_t count = 0;
    int rc = strata_store_open(state_dir, &s, &d);
    if (rc == 0)
        rc = strata_store_client_count(s, &count, &d);
    uint64_t *ids = NULL, *accepted = NULL;
    size_t n = 0;
    if (rc == 0 && count > 0 && count < 1000000 &&
        ((ids = calloc(count, sizeof(*ids))) == NULL ||
         (accepted = calloc(count, sizeof(*accepted))) == NULL))
        rc = strata_diag_set(&d, STRATA_ENOMEM, "out of memory");
    /* Ids ascend from 1 and are never reused. */
    for (uint64_t id = 1; rc == 0 && ids != NULL && n < count && id < count + 100000; id++) {
        strata_store_client cl;
        int found = 0;
        if ((rc = strata_store_client_get(s, id, &cl, &found, &d)) == 0 && found)
            ids[n++] = id;
    }
    for (uint32_t r = 0; rc == 0 && r < nrounds; r++) {
        strata_store_update *u = NULL;
        size_t nu = 0;
        rc = strata_store_update_list(s, r, &u, &nu, &d);
        for (size_t i = 0; rc == 0 && i < nu; i++)
            for (size_t k = 0; k < n; k++)
                accepted[k] += ids[k] == u[i].client_id;
        strata_store_update_list_free(u, nu);
    }
    if (rc == 0) {
        fprintf(fm,
                "\nClients (data shares of %ld, in the order of registration):\n\n"
                "| client | data share | accepted updates |\n|---|---|---|\n",
                data_shares);
        for (size_t k = 0; k < n; k++) {
            if ((long)k < data_shares)
                fprintf(fm, "| %llu | %zu | %llu |\n", (unsigned long long)ids[k], k,
                        (unsigned long long)accepted[k]);
            else
                fprintf(fm, "| %llu | none | %llu |\n", (unsigned long long)ids[k],
                        (unsigned long long)accepted[k]);
        }
    } else {
        strata_log_error("cannot read the coordinator's clients: %s", strata_diag_msg(&d, rc));
    }
    free(ids);
    free(accepted);
    strata_store_close(s);
    return rc;
}

int sim_report_write(const char *state_dir, const char *out_dir, const sim_run_info *o, int json)
{
    strata_round_summary *list = NULL;
    size_t nr = 0;
    int rc = read_summaries(state_dir, &list, &nr);
    if (rc < 0)
        return rc;
    char csv[PATH_MAX], md[PATH_MAX];
    snprintf(csv, sizeof(csv), "%s/report.csv", out_dir);
    snprintf(md, sizeof(md), "%s/report.md", out_dir);
    FILE *fc = fopen(csv, "w"), *fm = fopen(md, "w");
    if (fc == NULL || fm == NULL) {
        strata_log_error("cannot write the report in %s", out_dir);
        rc = STRATA_EIO;
    } else {
        fprintf(fc, "round,participants,accuracy,loss,uplink_bytes,downlink_bytes,"
                    "dense_uplink_bytes,compression_ratio,total_bytes,dense_total_bytes,"
                    "downlink_ratio,total_ratio,eval_samples");
        /* One density column per layer, named after the first summary that
         * has densities. */
        for (size_t i = 0; i < nr; i++)
            if (list[i].has_densities) {
                for (size_t k = 0; k < list[i].num_layers; k++)
                    fprintf(fc, ",density:%s", list[i].layer_names[k]);
                break;
            }
        fputc('\n', fc);
        fprintf(fm,
                "# strata-sim report\n\n%ld clients (%s per round), %ld rounds, model %s, "
                "partition %s, policy %s, density %s, values %s, downlink %s, seed %ld%s%s%s%s\n\n"
                "Bytes are HTTP bodies actually sent: uplink the accepted update payloads, "
                "downlink the model snapshots and delta chains served. Dense FedAvg would send "
                "every participant's update and model as float32 (4 bytes a parameter each "
                "way).\n\n"
                "| round | participants | accuracy | loss | uplink bytes | downlink bytes | "
                "uplink compression | downlink compression | total compression |\n"
                "|---|---|---|---|---|---|---|---|---|\n",
                o->clients, o->sampling, o->rounds, o->model, o->partition, o->policy, o->density,
                o->values, o->downlink ? o->downlink : "none", o->seed,
                o->given && *o->given ? "; coordinator options " : "", o->given ? o->given : "",
                o->client_given && *o->client_given ? "; client options " : "",
                o->client_given ? o->client_given : "");
    }
    /* acc: the model's last evaluation (a round without one left the model
     * as it was); NaN while no round was evaluated. */
    double up = 0, down = 0, dense = 0, acc = NAN, elapsed = 0, to_target = -1;
    long target_round = -1;
    size_t unevaluated = 0;
    const strata_round_summary *last = NULL;
    for (size_t i = 0; fc && fm && i < nr; i++) {
        const strata_round_summary *s = &list[i];
        double u = (double)s->uplink_bytes, dn = (double)s->downlink_bytes;
        double de = (double)s->dense_uplink_bytes;
        long parts = (long)s->participants;
        char ca[32], cl[32], ma[32], ml[32];
        if (isnan(s->accuracy))
            unevaluated++;
        else
            acc = s->accuracy;
        up += u;
        down += dn;
        dense += de;
        elapsed += (double)s->duration_ms / 1000.0;
        if (o->target_accuracy > 0 && to_target < 0 && !isnan(acc) && acc >= o->target_accuracy) {
            to_target = elapsed;
            target_round = (long)s->round;
        }
        fprintf(fc, "%u,%ld,%s,%s,%.0f,%.0f,%.0f,%.2f,%.0f,%.0f,%.2f,%.2f,%llu", s->round, parts,
                sim_metric_text(s->accuracy, 6, "", ca, sizeof(ca)),
                sim_metric_text(s->loss, 6, "", cl, sizeof(cl)), u, dn, de, u > 0 ? de / u : 0.0,
                u + dn, 2 * de, dn > 0 ? de / dn : 0.0, u + dn > 0 ? 2 * de / (u + dn) : 0.0,
                (unsigned long long)s->eval_samples);
        for (size_t k = 0; k < s->num_layers; k++)
            fprintf(fc, ",%.6f", s->densities[k]);
        fputc('\n', fc);
        fprintf(fm, "| %u | %ld | %s | %s | %.0f | %.0f | %.1fx | %.1fx | %.1fx |\n", s->round,
                parts, sim_metric_text(s->accuracy, 4, "–", ma, sizeof(ma)),
                sim_metric_text(s->loss, 4, "–", ml, sizeof(ml)), u, dn, u > 0 ? de / u : 0.0,
                dn > 0 ? de / dn : 0.0, u + dn > 0 ? 2 * de / (u + dn) : 0.0);
        last = s;
    }
    if (fm != NULL)
        note_eval_samples(fm, list, nr);
    if (fm != NULL && unevaluated > 0)
        fprintf(fm,
                "\n%zu round%s (–) had no evaluation (a round that closed without a new "
                "model, was stopped, or was closed again after a coordinator crash); the "
                "final accuracy is that of the last round evaluated.\n",
                unevaluated, unevaluated == 1 ? "" : "s");
    if (fm != NULL && last != NULL && last->has_densities) {
        fprintf(fm, "\nPer-layer budgets of the last round (every round's densities are in "
                    "report.csv):\n\n| tensor | density | compressor |\n|---|---|---|\n");
        for (size_t k = 0; k < last->num_layers; k++)
            fprintf(fm, "| %s | %.6f | %s |\n", last->layer_names[k], last->densities[k],
                    last->compressors != NULL ? last->compressors[k] : "");
    }
    if (fm != NULL && o->data_shares > 0 && nr > 0 &&
        write_clients(fm, state_dir, o->data_shares, list[nr - 1].round + 1) < 0 && rc == 0)
        rc = STRATA_EIO;
    if (fm != NULL)
        report_lgreco(fm, list, nr);
    char fa[64];
    sim_metric_text(acc, 4, "none (no round was evaluated)", fa, sizeof(fa));
    if (fm != NULL)
        fprintf(fm,
                "\nTotal: uplink %.0f bytes (dense updates would be %.0f, %.1fx more), "
                "downlink %.0f bytes (dense models would be %.0f, %.1fx more), total %.0f bytes "
                "(dense FedAvg would move %.0f, %.1fx more), final accuracy %s.\n",
                up, dense, up > 0 ? dense / up : 0.0, down, dense, down > 0 ? dense / down : 0.0,
                up + down, 2 * dense, up + down > 0 ? 2 * dense / (up + down) : 0.0, fa);
    if (fm != NULL && (o->link_up != NULL || o->link_down != NULL))
        fprintf(fm,
                "\nEvery client behind its own link (network namespace, veth pair, tbf): "
                "uplink %s, downlink %s.\n",
                o->link_up ? o->link_up : "uncapped", o->link_down ? o->link_down : "uncapped");
    if (fm != NULL) {
        fprintf(fm, "\nTime in rounds (the sum of the rounds' durations, open to close): %.1f s.",
                elapsed);
        if (o->target_accuracy > 0 && to_target >= 0)
            fprintf(fm, " Test accuracy %.4f first reached after %.1f s (round %ld).",
                    o->target_accuracy, to_target, target_round);
        else if (o->target_accuracy > 0)
            fprintf(fm, " Test accuracy %.4f was not reached.", o->target_accuracy);
        fputc('\n', fm);
    }
    int bad_close = fc != NULL && fclose(fc) != 0;
    bad_close |= fm != NULL && fclose(fm) != 0;
    if (bad_close && rc == 0) {
        strata_log_error("cannot write the report in %s", out_dir);
        rc = STRATA_EIO;
    }
    strata_log_info("%zu rounds, final accuracy %s, uplink %.0f bytes (%.1fx less than dense), "
                    "total %.0f bytes up and down (%.1fx less than dense FedAvg), report in %s",
                    nr, fa, up, up > 0 ? dense / up : 0.0, up + down,
                    up + down > 0 ? 2 * dense / (up + down) : 0.0, md);
    if (json) {
        json_t *sum = json_pack("{s:o,s:I,s:I,s:f,s:f,s:f,s:f,s:f,s:s}", "final_accuracy",
                                isnan(acc) ? json_null() : json_real(acc), "rounds", (json_int_t)nr,
                                "clients", (json_int_t)o->clients, "uplink_bytes", up,
                                "downlink_bytes", down, "dense_uplink_bytes", dense, "total_bytes",
                                up + down, "dense_total_bytes", 2 * dense, "report", md);
        if (sum != NULL)
            json_object_set_new(sum, "time_s", json_real(elapsed));
        if (sum != NULL && o->target_accuracy > 0)
            json_object_set_new(sum, "time_to_target_s",
                                to_target >= 0 ? json_real(to_target) : json_null());
        char *text = sum ? json_dumps(sum, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
        if (text != NULL)
            puts(text);
        else
            strata_log_error("out of memory");
        free(text);
        json_decref(sum);
    }
    sim_summary_list_free(list, nr);
    return rc;
}
