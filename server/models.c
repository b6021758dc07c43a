/* Model distribution (see models.h and srv_engine_model in engine.h): the
 * current version served from memory, raw or as one zstd frame encoded once
 * per version with a reused context; older versions read back from their
 * checkpoint files and encoded on request. */
#include "models.h"

#include "engine_internal.h"

#include "strata/checkpoint.h"
#include "strata/fileio.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ZSTD_LEVEL 3

/* Largest checkpoint file read back for an older version. */
#define OLD_MODEL_MAX ((size_t)1 << 31)

int srv__models_init(srv_engine *e)
{
    pthread_mutex_init(&e->old_mu, NULL);
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
    int rc = strata_checkpoint_metadata(e->model, &meta);
    if (rc == 0)
        rc = strata_safetensors_encode(strata_model_params(e->model), &meta, &out->raw,
                                       &out->raw_len);
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
        if (buf != NULL) {
            memcpy(buf, want_zstd ? e->cache.zst : e->cache.raw, len);
            e->downlink += len;
        }
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
        if (rc == 0) {
            pthread_mutex_lock(&e->mu);
            e->downlink += len;
            pthread_mutex_unlock(&e->mu);
        }
    }
    if (rc < 0) {
        free(buf);
        srv_result_internal(r, strata_strerror(rc));
        return;
    }
    srv_result_take(r, SRV_OK, SRV_MEDIA_BINARY, buf, len);
    r->zstd = want_zstd;
    snprintf(r->etag, sizeof(r->etag), "%s", etag);
}
