/* Model distribution (see models.h and srv_engine_model in engine.h): the
 * current version served from memory, raw or as one zstd frame encoded once
 * per version with a reused context; older versions read back from their
 * checkpoint files and encoded on request; chains of deltas from the delta
 * files, compacted with a base where that is smaller. */
#include "models.h"

#include "engine_internal.h"

#include "strata/checkpoint.h"
#include "strata/downlink.h"
#include "strata/fileio.h"
#include "strata/log.h"
#include "strata/safetensors.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define ZSTD_LEVEL 3

/* Largest checkpoint file read back for an older version. */
#define OLD_MODEL_MAX ((size_t)1 << 31)

int srv__models_init(srv_engine *e)
{
    pthread_mutex_init(&e->old_mu, NULL);
    pthread_mutex_init(&e->chain_mu, NULL);
    strata_tensor_list_init(&e->chain_xhat);
    e->chain_digest[0] = '\0';
    int rc = strata_zctx_new(&e->zctx);
    return rc < 0 ? rc : strata_zctx_new(&e->old_zctx);
}

void srv__model_blob_cleanup(srv_model_blob *b)
{
    free(b->raw);
    free(b->zst);
    memset(b, 0, sizeof(*b));
}

int srv__model_encode(srv_engine *e, srv_model_blob *out, strata_diag *d)
{
    memset(out, 0, sizeof(*out));
    strata_metadata meta;
    strata_metadata_init(&meta);
    strata_model *m = srv__served_model(e);
    int rc = strata_checkpoint_metadata(m, &meta);
    if (rc == 0)
        rc = strata_safetensors_encode(strata_model_params(m), &meta, &out->raw, &out->raw_len);
    strata_metadata_cleanup(&meta);
    if (rc == 0)
        rc = strata_zframe_compress(e->zctx, out->raw, out->raw_len, ZSTD_LEVEL, &out->zst,
                                    &out->zst_len, d);
    if (rc < 0)
        srv__model_blob_cleanup(out);
    return rc;
}

void srv__model_install(srv_engine *e, srv_model_blob *b)
{
    srv__model_blob_cleanup(&e->cache);
    e->cache = *b;
    memset(b, 0, sizeof(*b));
}

void srv__models_cleanup(srv_engine *e)
{
    srv__model_blob_cleanup(&e->cache);
    strata_zctx_free(e->zctx);
    strata_zctx_free(e->old_zctx);
    e->zctx = e->old_zctx = NULL;
    pthread_mutex_destroy(&e->old_mu);
    strata_tensor_list_cleanup(&e->chain_xhat);
    pthread_mutex_destroy(&e->chain_mu);
}

/* An older version: its checkpoint file, compressed when asked. No lock. */
static int read_old(srv_engine *e, uint64_t version, int want_zstd, uint8_t **out, size_t *len)
{
    *out = NULL;
    *len = 0;
    char path[4096];
    int rc = strata_store_checkpoint_path(e->store, version, path, sizeof(path), NULL);
    uint8_t *buf = NULL;
    size_t n = 0;
    if (rc == 0)
        rc = strata_file_read_all(path, OLD_MODEL_MAX, &buf, &n, NULL);
    if (rc == 0 && want_zstd) {
        uint8_t *z = NULL;
        size_t zl = 0;
        pthread_mutex_lock(&e->old_mu);
        rc = strata_zframe_compress(e->old_zctx, buf, n, ZSTD_LEVEL, &z, &zl, NULL);
        pthread_mutex_unlock(&e->old_mu);
        free(buf);
        buf = z;
        n = zl;
    }
    if (rc < 0) {
        free(buf);
        return rc;
    }
    *out = buf;
    *len = n;
    return 0;
}

void srv_engine_model(srv_engine *e, uint64_t version, int want_zstd, const char *inm,
                      srv_result *r)
{
    char etag[32];
    snprintf(etag, sizeof(etag), "\"m%llu\"", (unsigned long long)version);
    pthread_mutex_lock(&e->mu);
    uint64_t cur = e->version;
    if (version > cur) {
        pthread_mutex_unlock(&e->mu);
        srv_result_error(r, SRV_E_NOT_FOUND, "no model version %llu (latest is %llu)",
                         (unsigned long long)version, (unsigned long long)cur);
        return;
    }
    if (inm != NULL && (strcmp(inm, etag) == 0 || strcmp(inm, "*") == 0)) {
        pthread_mutex_unlock(&e->mu);
        srv_result_take(r, SRV_NOT_MODIFIED, SRV_MEDIA_BINARY, NULL, 0);
        snprintf(r->etag, sizeof(r->etag), "%s", etag);
        return;
    }
    uint8_t *buf = NULL;
    size_t len = 0;
    int rc = 0;
    if (version == cur) {
        len = want_zstd ? e->cache.zst_len : e->cache.raw_len;
        buf = malloc(len ? len : 1);
        if (buf != NULL)
            memcpy(buf, want_zstd ? e->cache.zst : e->cache.raw, len);
        rc = buf ? 0 : STRATA_ENOMEM;
        pthread_mutex_unlock(&e->mu);
    } else {
        pthread_mutex_unlock(&e->mu);
        rc = read_old(e, version, want_zstd, &buf, &len);
        if (rc == STRATA_EIO || rc == STRATA_ESTATE) {
            srv_result_error(r, SRV_E_NOT_FOUND, "model version %llu is not kept",
                             (unsigned long long)version);
            return;
        }
    }
    if (rc < 0) {
        free(buf);
        srv_result_internal(r, strata_strerror(rc));
        return;
    }
    srv_result_take(r, SRV_OK, SRV_MEDIA_BINARY, buf, len);
    r->downlink = 1;
    r->zstd = want_zstd;
    snprintf(r->etag, sizeof(r->etag), "%s", etag);
}

void srv_engine_model_init(srv_engine *e, srv_result *r)
{
    if (e->recipe == NULL) {
        srv_result_error(r, SRV_E_NOT_FOUND,
                         e->xhat == NULL ? "this coordinator publishes no deltas (--downlink "
                                           "none): download /v1/models/0"
                                         : "version 0 is not the seeded initialisation (see the "
                                           "coordinator's log): download a snapshot");
        return;
    }
    pthread_mutex_lock(&e->mu);
    uint64_t cur = e->version;
    pthread_mutex_unlock(&e->mu);
    char path[4096];
    struct stat st;
    if (cur > 0 && (strata_store_path(strata_store_dir(e->store), STRATA_STORE_FILE_DELTA, 1, 0,
                                      path, sizeof(path), NULL) < 0 ||
                    stat(path, &st) != 0)) {
        srv_result_error(r, SRV_E_NOT_FOUND,
                         "the deltas from version 0 are no longer kept: download /v1/models/%llu",
                         (unsigned long long)cur);
        return;
    }
    uint8_t *buf = malloc(e->recipe_len);
    if (buf == NULL) {
        srv_result_internal(r, strata_strerror(STRATA_ENOMEM));
        return;
    }
    memcpy(buf, e->recipe, e->recipe_len);
    srv_result_take(r, SRV_OK, SRV_MEDIA_JSON, buf, e->recipe_len);
    r->downlink = 1;
}

/* Largest delta file read back. */
#define DELTA_MAX ((size_t)1 << 31)

/* The chain of n deltas (parts, lens) that ends at version `to`, compacted
 * with a base where that is smaller (strata_downlink_chain_compact), with
 * x̂ of `to` from its checkpoint (written before the version is published,
 * never removed), kept with its digest for the next request of the same
 * version. to_digest is x̂'s digest when the caller knows it (`to` is the
 * served version), else NULL and it is computed; a given digest is not
 * checked against the checkpoint, so a checkpoint damaged on disk gives
 * clients a base whose digest check fails and sends them to the snapshot,
 * which comes from memory. NULL in *out when the plain chain is to be
 * served: compaction gains nothing or failed (logged: the plain chain is
 * still a correct answer, so no failure here fails the request). */
static void chain_compact(srv_engine *e, uint64_t to, const char *to_digest, uint8_t *const *parts,
                          const size_t *lens, size_t n, uint8_t **out, size_t *len)
{
    strata_diag d = {{0}};
    int rc = 0;
    pthread_mutex_lock(&e->chain_mu);
    if (e->chain_digest[0] == '\0' || e->chain_version != to) {
        char path[4096];
        strata_tensor_list_cleanup(&e->chain_xhat);
        strata_tensor_list_init(&e->chain_xhat);
        e->chain_digest[0] = '\0';
        rc = strata_store_checkpoint_path(e->store, to, path, sizeof(path), &d);
        if (rc == 0)
            rc = strata_safetensors_read(path, OLD_MODEL_MAX, &e->chain_xhat, NULL, &d);
        if (rc == 0) {
            if (to_digest != NULL)
                memcpy(e->chain_digest, to_digest, sizeof(e->chain_digest));
            else
                strata_downlink_digest(&e->chain_xhat, e->chain_digest);
            e->chain_version = to;
        }
    }
    if (rc == 0)
        rc = strata_downlink_chain_compact((const uint8_t *const *)parts, lens, n, &e->chain_xhat,
                                           e->chain_digest, ZSTD_LEVEL, out, len, &d);
    pthread_mutex_unlock(&e->chain_mu);
    if (rc < 0)
        strata_log_warn("model %llu: the chain of %zu deltas is served without a base: %s",
                        (unsigned long long)to, n, strata_diag_msg(&d, rc));
}

void srv_engine_model_delta(srv_engine *e, uint64_t to, uint64_t from, const char *inm,
                            srv_result *r)
{
    char etag[48];
    snprintf(etag, sizeof(etag), "\"d%llu-%llu\"", (unsigned long long)from,
             (unsigned long long)to);
    pthread_mutex_lock(&e->mu);
    uint64_t cur = e->version;
    size_t snapshot = e->cache.zst_len;
    int on = e->xhat != NULL;
    char cur_digest[STRATA_DIGEST_HEX_SIZE];
    memcpy(cur_digest, e->digest, sizeof(cur_digest));
    pthread_mutex_unlock(&e->mu);
    if (!on) {
        srv_result_error(r, SRV_E_NOT_FOUND,
                         "this coordinator publishes no deltas (--downlink none): download "
                         "/v1/models/%llu",
                         (unsigned long long)to);
        return;
    }
    if (to > cur) {
        srv_result_error(r, SRV_E_NOT_FOUND, "no model version %llu (latest is %llu)",
                         (unsigned long long)to, (unsigned long long)cur);
        return;
    }
    if (to - from > STRATA_DOWNLINK_MAX_CHAIN ||
        (e->cfg->downlink_keep > 0 && to - from > (uint64_t)e->cfg->downlink_keep)) {
        srv_result_error(r, SRV_E_NOT_FOUND,
                         "the deltas from version %llu are not kept or too many for one "
                         "chain: download /v1/models/%llu",
                         (unsigned long long)from, (unsigned long long)to);
        return;
    }
    if (inm != NULL && strcmp(inm, etag) == 0) {
        srv_result_take(r, SRV_NOT_MODIFIED, SRV_MEDIA_BINARY, NULL, 0);
        snprintf(r->etag, sizeof(r->etag), "%s", etag);
        return;
    }
    size_t n = (size_t)(to - from), total = 8;
    uint8_t **parts = calloc(n, sizeof(*parts));
    size_t *lens = calloc(n, sizeof(*lens));
    int rc = parts && lens ? 0 : STRATA_ENOMEM, missing = 0;
    /* Reading stops as soon as the chain is no smaller than the snapshot. */
    for (size_t i = 0; rc == 0 && i < n && total < snapshot; i++) {
        char path[4096];
        rc = strata_store_path(strata_store_dir(e->store), STRATA_STORE_FILE_DELTA, from + 1 + i, 0,
                               path, sizeof(path), NULL);
        if (rc == 0)
            rc = strata_file_read_all(path, DELTA_MAX, &parts[i], &lens[i], NULL);
        if (rc == STRATA_ESTATE || rc == STRATA_EIO) {
            missing = 1;
            rc = 0;
            break;
        }
        total += 4 + lens[i];
    }
    uint8_t *chain = NULL;
    size_t len = 0;
    int plain = rc == 0 && !missing && total < snapshot;
    if (plain && n >= 2 && n < STRATA_DOWNLINK_MAX_CHAIN)
        chain_compact(e, to, to == cur ? cur_digest : NULL, parts, lens, n, &chain, &len);
    if (rc == 0 && plain && chain == NULL)
        rc = strata_downlink_chain_encode((const uint8_t *const *)parts, lens, n, &chain, &len);
    for (size_t i = 0; parts != NULL && i < n; i++)
        free(parts[i]);
    free(parts);
    free(lens);
    if (rc < 0) {
        free(chain);
        srv_result_internal(r, strata_strerror(rc));
        return;
    }
    if (!plain) {
        srv_result_error(r, SRV_E_NOT_FOUND,
                         missing ? "a delta between versions %llu and %llu is not kept: "
                                   "download /v1/models/%llu"
                                 : "the deltas from version %llu to %llu are not smaller than "
                                   "the snapshot: download /v1/models/%llu",
                         (unsigned long long)from, (unsigned long long)to, (unsigned long long)to);
        return;
    }
    srv_result_take(r, SRV_OK, SRV_MEDIA_BINARY, chain, len);
    r->downlink = 1;
    snprintf(r->etag, sizeof(r->etag), "%s", etag);
}
