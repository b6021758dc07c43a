/* One round of the client: model download, training, error feedback,
 * encoding, staging and upload, and the settling of a staged upload after a
 * restart (see round.h). The state directory's files are state.c's. */
#include "round.h"

#include "session.h"

#include "strata/clock.h"
#include "strata/checkpoint.h"
#include "strata/downlink.h"
#include "strata/safetensors.h"
#include "strata/ef.h"
#include "strata/log.h"
#include "strata/payload.h"
#include "strata/recipe.h"
#include "strata/train.h"

#include <jansson.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Fetches the snapshot of model `version` (GET /v1/models/{v}), using the
 * state directory's cached copy when its ETag still matches (use_cache);
 * *downloaded is the body's size (0 for a cache hit), *cached 1 for a cache
 * hit. */
static int fetch_snapshot(const strata_client_round_ctx *c, uint64_t version, int use_cache,
                          strata_model **m, size_t *downloaded, int *cached)
{
    *m = NULL;
    *downloaded = 0;
    *cached = 0;
    char url[64], etag[128] = "";
    if (use_cache)
        strata_client_state_model_etag(c->state, etag, sizeof(etag));
    snprintf(url, sizeof(url), "/v1/models/%llu", (unsigned long long)version);
    strata_http_response r;
    strata_diag d = {{0}};
    int rc = strata_http_request_retry(c->http, "GET", url, NULL, NULL, 0, etag[0] ? etag : NULL, 1,
                                       STRATA_CLIENT_MAX_BODY, 0, 30.0, &r, &d);
    if (rc < 0) {
        strata_log_error("model %llu: %s", (unsigned long long)version, strata_diag_msg(&d, rc));
        return rc;
    }
    if (r.status == 200) {
        *downloaded = r.len;
        rc = strata_checkpoint_decode(r.body, r.len, m, &d);
        strata_diag cd = {{0}};
        int crc;
        if (rc == STRATA_OK &&
            (crc = strata_client_state_save_model(c->state, r.body, r.len, r.etag, &cd)) < 0)
            strata_log_warn("cannot cache the model in %s: %s", strata_client_state_dir(c->state),
                            strata_diag_msg(&cd, crc));
    } else if (r.status == 304) {
        *cached = 1;
        rc = strata_client_state_load_model(c->state, m, &d);
    } else {
        strata_log_error("model %llu: HTTP %ld: %s", (unsigned long long)version, r.status,
                         (char *)r.body);
        rc = STRATA_EPROTO;
    }
    if (rc < 0 && (r.status == 200 || r.status == 304))
        strata_log_error("model %llu: %s", (unsigned long long)version, strata_diag_msg(&d, rc));
    strata_http_response_cleanup(&r);
    return rc;
}

/* Caches m as model `version` (ETag "m<version>", as the coordinator
 * names it). */
static void cache_model(const strata_client_round_ctx *c, strata_model *m, uint64_t version)
{
    strata_metadata meta;
    strata_metadata_init(&meta);
    uint8_t *buf = NULL;
    size_t len = 0;
    strata_diag d = {{0}};
    int rc = strata_checkpoint_metadata(m, &meta);
    if (rc == 0)
        rc = strata_safetensors_encode(strata_model_params(m), &meta, &buf, &len);
    char etag[64];
    snprintf(etag, sizeof(etag), "\"m%llu\"", (unsigned long long)version);
    if (rc == 0)
        rc = strata_client_state_save_model(c->state, buf, len, etag, &d);
    if (rc < 0)
        strata_log_warn("cannot cache model %llu in %s: %s", (unsigned long long)version,
                        strata_client_state_dir(c->state), strata_diag_msg(&d, rc));
    strata_metadata_cleanup(&meta);
    free(buf);
}

/* Writes m's digest to got and compares it with the coordinator's, hex,
 * for version v. */
static int check_digest(strata_model *m, uint64_t v, const char *hex,
                        char got[STRATA_DIGEST_HEX_SIZE], strata_diag *d)
{
    strata_downlink_digest(strata_model_params(m), got);
    if (strcmp(got, hex) != 0)
        return strata_diag_set(d, STRATA_EPROTO,
                               "the model rebuilt for version %llu has digest %.16s..., the "
                               "coordinator's is %.16s...",
                               (unsigned long long)v, got, hex);
    return STRATA_OK;
}

/* Brings the cached model of version `from` to t's version with the chain
 * of deltas (GET /v1/models/{v}/delta?from=u), checking every step's digest
 * (for a chain that ends with a base, the digest after the base) and the
 * task's. Returns STRATA_OK with *m, or an error after which the
 * caller takes a snapshot (the reason is logged). */
static int fetch_deltas(const strata_client_round_ctx *c, const strata_task *t, uint64_t from,
                        strata_model **m, size_t *downloaded)
{
    *m = NULL;
    *downloaded = 0;
    uint64_t v = t->model_version;
    char url[96];
    snprintf(url, sizeof(url), "/v1/models/%llu/delta?from=%llu", (unsigned long long)v,
             (unsigned long long)from);
    strata_http_response r;
    strata_diag d = {{0}};
    int rc = strata_http_request_retry(c->http, "GET", url, NULL, NULL, 0, NULL, 0,
                                       STRATA_CLIENT_MAX_BODY, 0, 30.0, &r, &d);
    if (rc < 0) {
        strata_log_warn("model %llu: deltas from %llu: %s", (unsigned long long)v,
                        (unsigned long long)from, strata_diag_msg(&d, rc));
        return rc;
    }
    if (r.status != 200) {
        strata_log_info("model %llu: no deltas from version %llu (HTTP %ld): taking the "
                        "snapshot",
                        (unsigned long long)v, (unsigned long long)from, r.status);
        strata_http_response_cleanup(&r);
        return STRATA_ESTATE;
    }
    *downloaded = r.len;
    const uint8_t **parts = NULL;
    size_t *lens = NULL, n = 0;
    uint64_t at = from;
    char hex[STRATA_DIGEST_HEX_SIZE] = "", got[STRATA_DIGEST_HEX_SIZE] = "";
    strata_payload *last = NULL, *base = NULL;
    rc = strata_client_state_load_model(c->state, m, &d);
    if (rc == 0)
        rc = strata_downlink_chain_split(r.body, r.len, &parts, &lens, &n, &d);
    /* A chain of two deltas or more may end with a base that sets the
     * tensors its deltas leave out; the deltas then reach no version's
     * digest until the base. A base anywhere else is refused. */
    if (rc == 0)
        rc = strata_payload_decode(parts[n - 1], lens[n - 1], NULL, &last, &d);
    if (rc == 0 && n >= 3 && strata_downlink_meta_is_base(last)) {
        base = last;
        last = NULL;
    }
    size_t nd = base != NULL ? n - 1 : n;
    for (size_t i = 0; rc == 0 && i < nd; i++) {
        strata_payload *p = NULL;
        uint64_t pf = 0, pt = 0;
        if (i == n - 1) {
            p = last;
            last = NULL;
        } else {
            rc = strata_payload_decode(parts[i], lens[i], NULL, &p, &d);
        }
        if (rc == 0 && strata_downlink_meta_is_base(p))
            rc = strata_diag_set(&d, STRATA_EPROTO,
                                 "entry %zu of %zu is a base, which only ends a chain of two "
                                 "deltas or more",
                                 i + 1, n);
        if (rc == 0)
            rc = strata_downlink_meta_parse(p, &pf, &pt, hex, &d);
        if (rc == 0 && (pf != at || pt != at + 1))
            rc = strata_diag_set(
                &d, STRATA_EPROTO, "delta %zu goes from %llu to %llu, not from %llu", i,
                (unsigned long long)pf, (unsigned long long)pt, (unsigned long long)at);
        if (rc == 0)
            rc = strata_downlink_apply(strata_model_params(*m), p, &d);
        strata_payload_free(p);
        if (rc == 0 && base == NULL)
            rc = check_digest(*m, pt, hex, got, &d);
        at = pt;
    }
    strata_payload_free(last);
    if (rc == 0 && base != NULL) {
        uint64_t bf = 0, bt = 0;
        char want[STRATA_DIGEST_HEX_SIZE];
        memcpy(want, hex, sizeof(want)); /* the last delta's */
        rc = strata_downlink_meta_parse(base, &bf, &bt, hex, &d);
        if (rc == 0 && (bf != from || bt != at || strcmp(hex, want) != 0))
            rc = strata_diag_set(&d, STRATA_EPROTO,
                                 "the base (versions %llu to %llu) does not end the deltas "
                                 "from %llu to %llu with their digest",
                                 (unsigned long long)bf, (unsigned long long)bt,
                                 (unsigned long long)from, (unsigned long long)at);
        if (rc == 0)
            rc = strata_downlink_apply_base(strata_model_params(*m), base, &d);
        if (rc == 0)
            rc = check_digest(*m, bt, hex, got, &d);
    }
    int base_used = base != NULL;
    strata_payload_free(base);
    if (rc == 0 && at != v)
        rc = strata_diag_set(&d, STRATA_EPROTO, "the deltas end at version %llu, not %llu",
                             (unsigned long long)at, (unsigned long long)v);
    if (rc == 0 && t->model_digest[0] != '\0' && strcmp(got, t->model_digest) != 0)
        rc = strata_diag_set(&d, STRATA_EPROTO,
                             "the rebuilt model's digest differs from the task's");
    free(parts);
    free(lens);
    strata_http_response_cleanup(&r);
    if (rc < 0) {
        strata_log_warn("model %llu: deltas from version %llu failed: %s; resynchronising from a "
                        "snapshot",
                        (unsigned long long)v, (unsigned long long)from, strata_diag_msg(&d, rc));
        strata_model_free(*m);
        *m = NULL;
        return rc;
    }
    cache_model(c, *m, v);
    strata_log_info("model %llu: %zu deltas%s from version %llu, %zu bytes, digest %s matches",
                    (unsigned long long)v, nd, base_used ? " and a base" : "",
                    (unsigned long long)from, *downloaded, got);
    return STRATA_OK;
}

/* For a client that holds no model: builds version 0 from the
 * coordinator's recipe (GET /v1/models/0/init), checks it against version
 * 0's digest, and brings it to t's version with the chain of deltas from
 * version 0. Returns STRATA_OK with *m, or an error after which the caller
 * takes a snapshot (the reason is logged). *downloaded counts the recipe
 * and the chain. */
static int fetch_from_recipe(const strata_client_round_ctx *c, const strata_task *t,
                             strata_model **m, size_t *downloaded)
{
    *m = NULL;
    *downloaded = 0;
    uint64_t v = t->model_version;
    strata_http_response r;
    strata_diag d = {{0}};
    int rc = strata_http_request_retry(c->http, "GET", "/v1/models/0/init", NULL, NULL, 0, NULL, 0,
                                       STRATA_RECIPE_MAX_BYTES, 0, 30.0, &r, &d);
    if (rc < 0) {
        strata_log_warn("model 0: recipe: %s; taking the snapshot", strata_diag_msg(&d, rc));
        return rc;
    }
    if (r.status != 200) {
        strata_log_info("model 0: no recipe (HTTP %ld): taking the snapshot", r.status);
        strata_http_response_cleanup(&r);
        return STRATA_ESTATE;
    }
    *downloaded = r.len;
    strata_recipe rec;
    strata_model *m0 = NULL;
    rc = strata_recipe_decode((const char *)r.body, r.len, &rec, &d);
    strata_http_response_cleanup(&r);
    if (rc == 0)
        rc = strata_recipe_build(&rec, STRATA_CLIENT_MAX_BODY / sizeof(float), &m0, &d);
    if (rc == 0 && v == 0 && t->model_digest[0] != '\0' && strcmp(rec.digest, t->model_digest) != 0)
        rc = strata_diag_set(&d, STRATA_EPROTO, "the recipe's digest is not the task's");
    if (rc < 0) {
        strata_log_warn("model 0 from its recipe failed: %s; taking the snapshot",
                        strata_diag_msg(&d, rc));
        strata_recipe_cleanup(&rec);
        return rc;
    }
    strata_log_info("model 0: built from its recipe (%zu bytes, init seed %llu), digest %s "
                    "matches",
                    *downloaded, (unsigned long long)rec.seed, rec.digest);
    strata_recipe_cleanup(&rec);
    cache_model(c, m0, 0);
    if (v == 0) {
        *m = m0;
        return STRATA_OK;
    }
    strata_model_free(m0);
    size_t got = 0;
    rc = fetch_deltas(c, t, 0, m, &got);
    *downloaded += got;
    return rc;
}

/* Gets the model of task t: deltas from the cached version when the
 * coordinator publishes them, version 0 built from its recipe and the
 * deltas from there when the client holds no model, else (or when they
 * fail) the snapshot; the result is checked against the task's digest,
 * and a cached copy that does not match is replaced by a fresh snapshot
 * (logged). *downloaded is the bytes received. */
static int fetch_model(const strata_client_round_ctx *c, const strata_task *t, strata_model **m,
                       size_t *downloaded)
{
    *m = NULL;
    *downloaded = 0;
    uint64_t v = t->model_version;
    char etag[128];
    unsigned long long u = 0;
    strata_client_state_model_etag(c->state, etag, sizeof(etag));
    size_t got = 0;
    int have = sscanf(etag, "\"m%llu\"", &u) == 1;
    if (t->downlink && have && u < v && fetch_deltas(c, t, u, m, &got) == STRATA_OK) {
        *downloaded = got;
        return STRATA_OK;
    }
    *downloaded += got;
    got = 0;
    if (t->downlink && !have && fetch_from_recipe(c, t, m, &got) == STRATA_OK) {
        *downloaded += got;
        return STRATA_OK;
    }
    *downloaded += got;
    int cached = 0;
    int rc = fetch_snapshot(c, v, 1, m, &got, &cached);
    *downloaded += got;
    if (rc < 0 || t->model_digest[0] == '\0')
        return rc;
    char hex[STRATA_DIGEST_HEX_SIZE];
    strata_downlink_digest(strata_model_params(*m), hex);
    if (strcmp(hex, t->model_digest) == 0) {
        strata_log_info("model %llu: %s, %zu bytes, digest %s matches", (unsigned long long)v,
                        cached ? "cached copy" : "snapshot", *downloaded, hex);
        return STRATA_OK;
    }
    strata_model_free(*m);
    *m = NULL;
    if (!cached) {
        strata_log_error("model %llu: the snapshot's digest %.16s... is not the task's %.16s...",
                         (unsigned long long)v, hex, t->model_digest);
        return STRATA_EPROTO;
    }
    strata_log_warn("model %llu: the cached copy's digest %.16s... is not the task's %.16s...; "
                    "resynchronising from a snapshot",
                    (unsigned long long)v, hex, t->model_digest);
    rc = fetch_snapshot(c, v, 0, m, &got, &cached);
    *downloaded += got;
    if (rc == 0) {
        strata_downlink_digest(strata_model_params(*m), hex);
        if (strcmp(hex, t->model_digest) != 0) {
            strata_log_error("model %llu: the snapshot's digest is not the task's",
                             (unsigned long long)v);
            strata_model_free(*m);
            *m = NULL;
            rc = STRATA_EPROTO;
        } else {
            strata_log_info("model %llu: snapshot, %zu bytes, digest %s matches",
                            (unsigned long long)v, got, hex);
        }
    }
    return rc;
}

typedef struct progress_ctx {
    const strata_client_round_ctx *c;
    uint32_t round;
} progress_ctx;

static int on_progress(void *ud, size_t done, size_t total)
{
    progress_ctx *p = ud;
    int stop = p->c->stop != NULL && *p->c->stop != 0;
    if (!p->c->progress || total == 0)
        return stop;
    int width = 30, filled = (int)((double)done / (double)total * width);
    char bar[40];
    for (int i = 0; i < width; i++)
        bar[i] = i < filled ? '#' : '.';
    bar[width] = '\0';
    /* A terminal progress bar, redrawn in place: not a log line. */
    fprintf(stderr, "\rround %u [%s] %5.1f%%", p->round, bar, 100.0 * (double)done / (double)total);
    if (done >= total)
        fputs("\r\033[K", stderr);
    return stop; /* SIGINT/SIGTERM abandon the step after this batch */
}

static int stopped(const strata_client_round_ctx *c)
{
    return c->stop != NULL && *c->stop != 0;
}

/* Uploads the staged payload of `round` (wire, or the staged file when wire
 * is NULL) and settles the stage: on 200 the receipt is recorded and the
 * pending residual becomes current (ACKED); on a refusal (any status left
 * after the retries of transient ones) the stage is dropped and the
 * previous residual stays (REFUSED). A transport failure keeps the stage
 * for the next start (error). */
static int upload_staged(const strata_client_round_ctx *c, uint32_t round, const uint8_t *wire,
                         size_t wire_len, strata_client_upload *result)
{
    *result = STRATA_CLIENT_ACKED;
    uint8_t *file = NULL;
    strata_diag d = {{0}};
    int rc;
    if (wire == NULL) {
        if ((rc = strata_client_state_staged_payload(c->state, &file, &wire_len, &d)) < 0) {
            strata_log_warn("staged upload of round %u is unreadable (%s); dropping it", round,
                            strata_diag_msg(&d, rc));
            if ((rc = strata_client_state_settle(c->state, round, NULL, &d)) < 0)
                strata_log_warn("round %u: %s", round, strata_diag_msg(&d, rc));
            *result = STRATA_CLIENT_REFUSED;
            return STRATA_OK;
        }
        wire = file;
    }
    char url[64];
    snprintf(url, sizeof(url), "/v1/rounds/%u/updates", round);
    strata_http_response r;
    rc = strata_http_request_retry(c->http, "POST", url, "application/octet-stream", wire, wire_len,
                                   NULL, 0, STRATA_CLIENT_MAX_JSON, 0, 30.0, &r, &d);
    free(file);
    if (rc < 0) {
        strata_log_error("round %u: upload failed: %s (kept for the next start)", round,
                         strata_diag_msg(&d, rc));
        return rc;
    }
    if (r.status == 200) {
        json_t *j = json_loadb((const char *)r.body, r.len, 0, NULL);
        const char *receipt = json_string_value(json_object_get(j, "receipt"));
        int src = strata_client_state_settle(c->state, round, receipt ? receipt : "?", &d);
        if (src < 0)
            strata_log_warn("round %u: %s", round, strata_diag_msg(&d, src));
        strata_log_info("round %u: receipt %s%s", round, receipt ? receipt : "?",
                        json_is_true(json_object_get(j, "duplicate")) ? " (already held)" : "");
        json_decref(j);
    } else {
        /* A refusal (transient statuses were retried above) is final for this
         * update: drop the stage and keep the previous residuals. */
        strata_log_warn("round %u: update refused (HTTP %ld): %s; dropping it", round, r.status,
                        (char *)r.body);
        int src = strata_client_state_settle(c->state, round, NULL, &d);
        if (src < 0)
            strata_log_warn("round %u: %s", round, strata_diag_msg(&d, src));
        *result = STRATA_CLIENT_REFUSED;
    }
    strata_http_response_cleanup(&r);
    return STRATA_OK;
}

int strata_client_round_settle(const strata_client_round_ctx *c, int *settled,
                               strata_client_upload *result)
{
    *settled = 0;
    *result = STRATA_CLIENT_ACKED;
    uint32_t round;
    int staged;
    int rc = strata_client_state_staged(c->state, &staged, &round);
    if (rc < 0 || !staged)
        return rc;
    strata_log_info("re-sending the staged update of round %u", round);
    *settled = 1;
    return upload_staged(c, round, NULL, 0, result);
}

/* The residuals for this round's step: the saved ones, or fresh ones when
 * there are none or they belong to another run. */
static int residuals_for(const strata_client_round_ctx *c, const strata_task *t,
                         const strata_tensor_list *delta, strata_ef **ef)
{
    strata_diag d = {{0}};
    int rc = strata_client_state_load_residuals(c->state, delta, ef, &d);
    if (rc < 0) {
        strata_log_error("%s", strata_diag_msg(&d, rc));
        return rc;
    }
    uint32_t last;
    if (*ef != NULL && strata_ef_last_round(*ef, &last) == STRATA_OK && last >= t->round) {
        /* Residuals are installed only after an acknowledged upload, so a
         * coordinator asking again for a round we already hold belongs to
         * another run: those residuals mean nothing to it. */
        strata_log_warn("round %u: the residuals are from round %u of another run; starting "
                        "afresh",
                        t->round, last);
        strata_ef_free(*ef);
        *ef = NULL;
    }
    if (*ef == NULL)
        return strata_ef_new(delta, c->ef_beta, c->ef_max_staleness, ef);
    /* The options given now win over the settings saved with the
     * residuals. */
    int changed = 0;
    rc = strata_ef_configure(*ef, c->ef_beta, c->ef_max_staleness, &changed);
    if (rc == STRATA_OK && changed)
        strata_log_info("residuals: staleness settings now --ef-beta %g --ef-max-staleness %u "
                        "(the saved ones differed)",
                        c->ef_beta, c->ef_max_staleness);
    return rc;
}

/* 1 when the training loss and every element of delta are finite. */
static int update_finite(const strata_tensor_list *delta, double loss)
{
    if (!isfinite(loss))
        return 0;
    for (size_t i = 0; i < delta->count; i++)
        for (size_t k = 0; k < delta->items[i].numel; k++)
            if (!isfinite(delta->items[i].data[k]))
                return 0;
    return 1;
}

/* Round t has no usable update (training diverged): the residuals start
 * afresh, and the coordinator is told that this client cannot contribute,
 * so that the round need not wait for it. A refusal of the skip (the round
 * closed meanwhile) is logged, not an error. */
static int skip_round(const strata_client_round_ctx *c, uint32_t round,
                      strata_client_upload *result)
{
    *result = STRATA_CLIENT_SKIPPED;
    strata_diag d = {{0}};
    int rc = strata_client_state_reset_residuals(c->state, &d);
    if (rc < 0)
        strata_log_warn("round %u: %s", round, strata_diag_msg(&d, rc));
    char url[64];
    snprintf(url, sizeof(url), "/v1/rounds/%u/skip", round);
    static const char body[] = "{\"reason\":\"the local update is not finite\"}";
    strata_http_response r;
    rc = strata_http_request_retry(c->http, "POST", url, "application/json", (const uint8_t *)body,
                                   sizeof(body) - 1, NULL, 0, STRATA_CLIENT_MAX_JSON, 0, 30.0, &r,
                                   &d);
    if (rc < 0) {
        strata_log_error("round %u: telling the coordinator failed: %s", round,
                         strata_diag_msg(&d, rc));
        return rc;
    }
    if (r.status != 200)
        strata_log_warn("round %u: the coordinator did not take the skip (HTTP %ld): %s", round,
                        r.status, r.body ? (char *)r.body : "");
    strata_http_response_cleanup(&r);
    return STRATA_OK;
}

/* The payload's metadata: the training loss, the residual norms and, when
 * the task asked for one, the error table (n rows of ncand errors). */
static int metadata_json(const strata_ef *ef, size_t n, double loss, const double *table,
                         size_t ncand, char **out)
{
    *out = NULL;
    double *norms = calloc(n ? n : 1, sizeof(double));
    json_t *nj = json_array(), *mj = NULL;
    int rc = STRATA_ENOMEM;
    if (norms == NULL || nj == NULL)
        goto out;
    if (strata_ef_residual_norms(ef, norms, n) == STRATA_OK)
        for (size_t i = 0; i < n; i++)
            json_array_append_new(nj, json_real(norms[i]));
    mj = json_pack("{s:f,s:O}", "train_loss", loss, "residual_norms", nj);
    if (mj != NULL && ncand > 0) {
        json_t *tj = json_array();
        for (size_t l = 0; tj != NULL && l < n; l++) {
            json_t *row = json_array();
            for (size_t c = 0; row != NULL && c < ncand; c++)
                json_array_append_new(row, json_real(table[l * ncand + c]));
            json_array_append_new(tj, row);
        }
        if (tj == NULL || json_object_set_new(mj, "error_table", tj) < 0)
            goto out;
    }
    *out = mj ? json_dumps(mj, JSON_COMPACT) : NULL;
    if (*out != NULL)
        rc = STRATA_OK;
out:
    json_decref(mj);
    json_decref(nj);
    free(norms);
    return rc;
}

int strata_client_round_run(const strata_client_round_ctx *c, const strata_task *t,
                            strata_client_upload *result)
{
    *result = STRATA_CLIENT_ACKED;
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
    double *table = NULL;
    int rc;
    strata_diag d = {{0}};
    int64_t t0 = strata_clock_mono_ms();

    if ((rc = fetch_model(c, t, &m, &downloaded)) < 0)
        goto out;
    strata_tensor_list *params = strata_model_params(m);
    if (t->num_layers != params->count) {
        strata_log_error("round %u: task has %zu budgets for %zu tensors", t->round, t->num_layers,
                         params->count);
        rc = STRATA_EPROTO;
        goto out;
    }
    if ((rc = strata_tensor_list_copy(&global, params)) < 0)
        goto out;
    strata_sgd_config cfg = {.lr = (float)t->train.lr,
                             .momentum = (float)t->train.momentum,
                             .weight_decay = (float)t->train.weight_decay,
                             .prox_mu = (float)t->train.prox_mu};
    if ((rc = strata_sgd_new(params, &cfg, &opt, &d)) < 0) {
        strata_log_error("round %u: training settings: %s", t->round, strata_diag_msg(&d, rc));
        goto out;
    }
    if (cfg.prox_mu > 0.0f)
        strata_sgd_set_anchor(opt, &global);
    strata_rng rng;
    strata_rng_seed(&rng, t->seed, c->client_index + 1);
    progress_ctx pc = {c, t->round};
    strata_train_stats st = {0};
    double loss = 0.0;
    for (uint32_t e = 0; e < t->train.epochs && !stopped(c); e++) {
        rc = strata_train_epoch(m, opt, c->data, c->mine, c->nmine, (size_t)t->train.batch,
                                (size_t)t->train.max_steps, &rng, on_progress, &pc, &st);
        if (rc < 0) {
            strata_log_error("round %u: training failed: %s", t->round, strata_strerror(rc));
            goto out;
        }
        loss = st.loss;
    }
    if (stopped(c)) {
        rc = STRATA_ESTATE;
        goto out;
    }
    /* delta = w_local - w_global */
    if ((rc = strata_tensor_list_copy(&delta, params)) < 0)
        goto out;
    for (size_t i = 0; i < delta.count; i++)
        for (size_t k = 0; k < delta.items[i].numel; k++)
            delta.items[i].data[k] -= global.items[i].data[k];
    if (!update_finite(&delta, loss)) {
        strata_log_warn("round %u: the local update is not finite (training diverged; a lower "
                        "learning rate may help): skipping the round, residuals start afresh",
                        t->round);
        rc = skip_round(c, t->round, result);
        goto out;
    }

    if ((rc = residuals_for(c, t, &delta, &ef)) < 0)
        goto out;
    uint64_t seed = t->seed ^ (uint64_t)c->id->client_id;
    if (t->num_candidates > 0) { /* before the step, which moves the residuals on */
        table = malloc(delta.count * t->num_candidates * sizeof(double) + 1);
        if (table == NULL) {
            rc = STRATA_ENOMEM;
            goto out;
        }
        if ((rc = strata_ef_error_table(ef, &delta, t->round, seed, t->candidates,
                                        t->num_candidates, table, &d)) < 0) {
            strata_log_error("round %u: error table failed: %s", t->round, strata_diag_msg(&d, rc));
            goto out;
        }
    }
    if ((rc = strata_ef_step(ef, &delta, t->budgets, t->round, seed, &layers, &d)) < 0) {
        strata_log_error("round %u: compression failed: %s", t->round, strata_diag_msg(&d, rc));
        goto out;
    }
    if ((rc = metadata_json(ef, delta.count, loss, table, t->num_candidates, &meta)) < 0)
        goto out;
    strata_payload p = {.round = t->round,
                        .model_version = t->model_version,
                        .client_id = (uint64_t)c->id->client_id,
                        .sample_count = c->nmine,
                        .num_layers = delta.count,
                        .layers = layers,
                        .metadata_json = meta};
    if ((rc = strata_payload_encode(&p, 1, &wire, &wire_len, &d)) < 0) {
        strata_log_error("round %u: encoding failed: %s", t->round, strata_diag_msg(&d, rc));
        goto out;
    }
    /* Stage, then upload: a client killed at any point re-sends the staged
     * payload at its next start (state.h). */
    if ((rc = strata_client_state_stage(c->state, ef, t->round, wire, wire_len, &d)) < 0) {
        strata_log_error("round %u: cannot stage the upload in %s: %s", t->round,
                         strata_client_state_dir(c->state), strata_diag_msg(&d, rc));
        goto out;
    }
    if ((rc = upload_staged(c, t->round, wire, wire_len, result)) < 0)
        goto out;
    if (*result == STRATA_CLIENT_ACKED)
        strata_log_info("round %u: %zu samples, loss %.4f, uploaded %zu bytes (model %zu bytes) "
                        "in %.1f s",
                        t->round, c->nmine, loss, wire_len, downloaded,
                        (double)(strata_clock_mono_ms() - t0) / 1000.0);
out:
    free(table);
    free(meta);
    free(wire);
    if (layers)
        strata_clayers_free(layers, delta.count);
    strata_ef_free(ef);
    strata_sgd_free(opt);
    strata_tensor_list_cleanup(&global);
    strata_tensor_list_cleanup(&delta);
    strata_model_free(m);
#ifdef __GLIBC__
    /* The round's buffers (resnet's activations and gradients are about
     * 150 MB at batch 32) go back to the system, so that a client waiting
     * for its next selection stays small: glibc keeps freed memory otherwise. */
    malloc_trim(0);
#endif
    return rc;
}
