/* Model distribution (see models.h): the published version served from
 * memory, raw or as one zstd frame encoded once per version with a reused
 * context; older versions read back from their checkpoint files and
 * encoded on request; chains of deltas from the delta files, compacted with
 * a base where that is smaller. This file alone touches struct
 * srv_models. */
#include "models.h"

#include "strata/checkpoint.h"
#include "strata/downlink.h"
#include "strata/fileio.h"
#include "strata/log.h"
#include "strata/safetensors.h"
#include "strata/zframe.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define ZSTD_LEVEL 3

/* Largest checkpoint file read back for an older version. */
#define OLD_MODEL_MAX ((size_t)1 << 31)

struct srv_models {
    strata_store *store;  /* borrowed; only its paths are used */
    strata_store *fstore; /* own connection: fetching files, under fetch_mu */
    pthread_mutex_t fetch_mu;
    pthread_mutex_t *mu;                 /* the engine lock: guards the published version */
    int deltas;                          /* --downlink: deltas are published */
    long keep;                           /* --downlink-keep */
    uint64_t version;                    /* the published version */
    char digest[STRATA_DIGEST_HEX_SIZE]; /* the served model's digest */
    srv_model_blob cache;                /* version `version`, raw and zstd */
    strata_zctx *zctx;                   /* the cache's encoder: start-up and the round thread */
    strata_zctx *old_zctx;               /* older versions' encoder, under old_mu */
    pthread_mutex_t old_mu;              /* guards old_zctx only */
    /* x̂ of the version chain bases were last made for, and its digest,
     * read from its checkpoint by the first chain request for that
     * version; under chain_mu, which also makes one compaction at a time. */
    pthread_mutex_t chain_mu;
    strata_tensor_list chain_xhat;
    uint64_t chain_version;
    char chain_digest[STRATA_DIGEST_HEX_SIZE];
    /* Version 0's recipe (strata/recipe.h, GET /v1/models/0/init): set at
     * start-up when version 0 is the seeded initialisation, else NULL;
     * never changed afterwards (read without the lock). */
    char *recipe;
    size_t recipe_len;
    /* A follower's (srv__models_set_follower): it publishes the leader's
     * versions from their checkpoints, one at a time (follow_mu). */
    int follower;
    pthread_mutex_t follow_mu;
};

int srv__models_new(strata_store *store, pthread_mutex_t *mu, int deltas, long keep,
                    srv_models **out)
{
    *out = NULL;
    srv_models *M = calloc(1, sizeof(*M));
    if (M == NULL)
        return STRATA_ENOMEM;
    M->store = store;
    M->mu = mu;
    M->deltas = deltas;
    M->keep = keep;
    pthread_mutex_init(&M->old_mu, NULL);
    pthread_mutex_init(&M->chain_mu, NULL);
    pthread_mutex_init(&M->fetch_mu, NULL);
    pthread_mutex_init(&M->follow_mu, NULL);
    strata_tensor_list_init(&M->chain_xhat);
    int rc = strata_store_open_secondary(store, &M->fstore, NULL);
    if (rc == 0)
        rc = strata_zctx_new(&M->zctx);
    if (rc == 0)
        rc = strata_zctx_new(&M->old_zctx);
    if (rc < 0) {
        srv__models_free(M);
        return rc;
    }
    *out = M;
    return 0;
}

void srv__model_blob_cleanup(srv_model_blob *b)
{
    free(b->raw);
    free(b->zst);
    memset(b, 0, sizeof(*b));
}

int srv__models_encode(srv_models *M, strata_model *m, srv_model_blob *out, strata_diag *d)
{
    memset(out, 0, sizeof(*out));
    strata_metadata meta;
    strata_metadata_init(&meta);
    int rc = strata_checkpoint_metadata(m, &meta);
    if (rc == 0)
        rc = strata_safetensors_encode(strata_model_params(m), &meta, &out->raw, &out->raw_len);
    strata_metadata_cleanup(&meta);
    if (rc == 0)
        rc = strata_zframe_compress(M->zctx, out->raw, out->raw_len, ZSTD_LEVEL, &out->zst,
                                    &out->zst_len, d);
    if (rc < 0)
        srv__model_blob_cleanup(out);
    return rc;
}

void srv__models_publish(srv_models *M, uint64_t version, srv_model_blob *b,
                         const char digest[STRATA_DIGEST_HEX_SIZE])
{
    srv__model_blob_cleanup(&M->cache);
    M->cache = *b;
    memset(b, 0, sizeof(*b));
    M->version = version;
    memcpy(M->digest, digest, sizeof(M->digest));
}

uint64_t srv__models_version(const srv_models *M)
{
    return M->version;
}

void srv__models_digest(const srv_models *M, char out[STRATA_DIGEST_HEX_SIZE])
{
    memcpy(out, M->digest, STRATA_DIGEST_HEX_SIZE);
}

size_t srv__models_snapshot_bytes(const srv_models *M)
{
    return M->cache.zst_len;
}

void srv__models_set_recipe(srv_models *M, char *recipe, size_t len)
{
    free(M->recipe);
    M->recipe = recipe;
    M->recipe_len = len;
}

void srv__models_free(srv_models *M)
{
    if (M == NULL)
        return;
    srv__model_blob_cleanup(&M->cache);
    strata_store_close(M->fstore);
    pthread_mutex_destroy(&M->fetch_mu);
    pthread_mutex_destroy(&M->follow_mu);
    strata_zctx_free(M->zctx);
    strata_zctx_free(M->old_zctx);
    pthread_mutex_destroy(&M->old_mu);
    strata_tensor_list_cleanup(&M->chain_xhat);
    pthread_mutex_destroy(&M->chain_mu);
    free(M->recipe);
    free(M);
}

/* Makes sure file kind of version v is in the state directory as the
 * store keeps it (with PostgreSQL the directory is a cache; see
 * strata_store_file_fetch): 1 when it is, 0 when the store has none, < 0 on
 * a failure. Any thread; one fetch at a time. */
static int fetch(srv_models *M, strata_store_file kind, uint64_t v)
{
    int found = 0;
    pthread_mutex_lock(&M->fetch_mu);
    int rc = strata_store_file_fetch(M->fstore, kind, v, &found, NULL);
    pthread_mutex_unlock(&M->fetch_mu);
    return rc < 0 ? rc : found;
}

/* An older version: its checkpoint file, compressed when asked. No lock. */
static int read_old(srv_models *M, uint64_t version, int want_zstd, uint8_t **out, size_t *len)
{
    *out = NULL;
    *len = 0;
    char path[4096];
    int rc = strata_store_checkpoint_path(M->store, version, path, sizeof(path), NULL);
    uint8_t *buf = NULL;
    size_t n = 0;
    if (rc == 0 && (rc = fetch(M, STRATA_STORE_FILE_CHECKPOINT, version)) == 0)
        rc = STRATA_ESTATE; /* no such version */
    if (rc == 1)
        rc = strata_file_read_all(path, OLD_MODEL_MAX, &buf, &n, NULL);
    if (rc == 0 && want_zstd) {
        uint8_t *z = NULL;
        size_t zl = 0;
        pthread_mutex_lock(&M->old_mu);
        rc = strata_zframe_compress(M->old_zctx, buf, n, ZSTD_LEVEL, &z, &zl, NULL);
        pthread_mutex_unlock(&M->old_mu);
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

void srv__models_set_follower(srv_models *M)
{
    M->follower = 1;
}

/* A follower asked for a version just above the one it publishes: the
 * leader may have published it a moment ago (the notification is on its
 * way). Only the next two are looked for, so that requests for far
 * versions cost the store nothing. No lock on entry. */
static void catch_up(srv_models *M, uint64_t version)
{
    if (!M->follower)
        return;
    pthread_mutex_lock(M->mu);
    uint64_t cur = M->version;
    pthread_mutex_unlock(M->mu);
    if (version > cur && version - cur <= 2)
        srv__models_follow(M, version, NULL);
}

static int follow_locked(srv_models *M, uint64_t version, strata_diag *d);

int srv__models_follow(srv_models *M, uint64_t version, strata_diag *d)
{
    pthread_mutex_lock(&M->follow_mu);
    int rc = follow_locked(M, version, d);
    pthread_mutex_unlock(&M->follow_mu);
    return rc;
}

/* srv__models_follow, follow_mu held. */
static int follow_locked(srv_models *M, uint64_t version, strata_diag *d)
{
    pthread_mutex_lock(M->mu);
    int newer = version > M->version;
    pthread_mutex_unlock(M->mu);
    if (!newer)
        return STRATA_OK;
    char path[4096];
    int rc = strata_store_checkpoint_path(M->store, version, path, sizeof(path), d);
    if (rc == 0 && (rc = fetch(M, STRATA_STORE_FILE_CHECKPOINT, version)) == 0)
        rc = strata_diag_set(d, STRATA_ESTATE, "model version %llu has no checkpoint",
                             (unsigned long long)version);
    strata_model *m = NULL;
    if (rc == 1)
        rc = strata_checkpoint_load(path, &m, d);
    srv_model_blob blob;
    memset(&blob, 0, sizeof(blob));
    if (rc == 0)
        rc = srv__models_encode(M, m, &blob, d);
    if (rc == 0) {
        char digest[STRATA_DIGEST_HEX_SIZE];
        strata_downlink_digest(strata_model_params(m), digest);
        pthread_mutex_lock(M->mu);
        if (version > M->version)
            srv__models_publish(M, version, &blob, digest);
        pthread_mutex_unlock(M->mu);
    }
    srv__model_blob_cleanup(&blob);
    strata_model_free(m);
    return rc < 0 ? rc : STRATA_OK;
}

void srv__models_get(srv_models *M, uint64_t version, int want_zstd, const char *inm, srv_result *r)
{
    char etag[32];
    snprintf(etag, sizeof(etag), "\"m%llu\"", (unsigned long long)version);
    catch_up(M, version);
    pthread_mutex_lock(M->mu);
    uint64_t cur = M->version;
    if (version > cur) {
        pthread_mutex_unlock(M->mu);
        srv_result_error(r, SRV_E_NOT_FOUND, "no model version %llu (latest is %llu)",
                         (unsigned long long)version, (unsigned long long)cur);
        return;
    }
    if (inm != NULL && (strcmp(inm, etag) == 0 || strcmp(inm, "*") == 0)) {
        pthread_mutex_unlock(M->mu);
        srv_result_take(r, SRV_NOT_MODIFIED, SRV_MEDIA_BINARY, NULL, 0);
        snprintf(r->etag, sizeof(r->etag), "%s", etag);
        return;
    }
    uint8_t *buf = NULL;
    size_t len = 0;
    int rc = 0;
    if (version == cur) {
        len = want_zstd ? M->cache.zst_len : M->cache.raw_len;
        buf = malloc(len ? len : 1);
        if (buf != NULL)
            memcpy(buf, want_zstd ? M->cache.zst : M->cache.raw, len);
        rc = buf ? 0 : STRATA_ENOMEM;
        pthread_mutex_unlock(M->mu);
    } else {
        pthread_mutex_unlock(M->mu);
        rc = read_old(M, version, want_zstd, &buf, &len);
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

void srv__models_init(srv_models *M, srv_result *r)
{
    if (M->recipe == NULL) {
        srv_result_error(r, SRV_E_NOT_FOUND,
                         !M->deltas ? "this coordinator publishes no deltas (--downlink "
                                      "none): download /v1/models/0"
                                    : "version 0 is not the seeded initialisation (see the "
                                      "coordinator's log): download a snapshot");
        return;
    }
    pthread_mutex_lock(M->mu);
    uint64_t cur = M->version;
    pthread_mutex_unlock(M->mu);
    char path[4096];
    struct stat st;
    if (cur > 0 && (fetch(M, STRATA_STORE_FILE_DELTA, 1) != 1 ||
                    strata_store_path(strata_store_dir(M->store), STRATA_STORE_FILE_DELTA, 1, 0,
                                      path, sizeof(path), NULL) < 0 ||
                    stat(path, &st) != 0)) {
        srv_result_error(r, SRV_E_NOT_FOUND,
                         "the deltas from version 0 are no longer kept: download /v1/models/%llu",
                         (unsigned long long)cur);
        return;
    }
    uint8_t *buf = malloc(M->recipe_len);
    if (buf == NULL) {
        srv_result_internal(r, strata_strerror(STRATA_ENOMEM));
        return;
    }
    memcpy(buf, M->recipe, M->recipe_len);
    srv_result_take(r, SRV_OK, SRV_MEDIA_JSON, buf, M->recipe_len);
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
static void chain_compact(srv_models *M, uint64_t to, const char *to_digest, uint8_t *const *parts,
                          const size_t *lens, size_t n, uint8_t **out, size_t *len)
{
    strata_diag d = {{0}};
    int rc = 0;
    pthread_mutex_lock(&M->chain_mu);
    if (M->chain_digest[0] == '\0' || M->chain_version != to) {
        char path[4096];
        strata_tensor_list_cleanup(&M->chain_xhat);
        strata_tensor_list_init(&M->chain_xhat);
        M->chain_digest[0] = '\0';
        rc = strata_store_checkpoint_path(M->store, to, path, sizeof(path), &d);
        if (rc == 0 && fetch(M, STRATA_STORE_FILE_CHECKPOINT, to) != 1)
            rc = strata_diag_set(&d, STRATA_ESTATE, "no checkpoint of version %llu",
                                 (unsigned long long)to);
        if (rc == 0)
            rc = strata_safetensors_read(path, OLD_MODEL_MAX, &M->chain_xhat, NULL, &d);
        if (rc == 0) {
            if (to_digest != NULL)
                memcpy(M->chain_digest, to_digest, sizeof(M->chain_digest));
            else
                strata_downlink_digest(&M->chain_xhat, M->chain_digest);
            M->chain_version = to;
        }
    }
    if (rc == 0)
        rc = strata_downlink_chain_compact((const uint8_t *const *)parts, lens, n, &M->chain_xhat,
                                           M->chain_digest, ZSTD_LEVEL, out, len, &d);
    pthread_mutex_unlock(&M->chain_mu);
    if (rc < 0)
        strata_log_warn("model %llu: the chain of %zu deltas is served without a base: %s",
                        (unsigned long long)to, n, strata_diag_msg(&d, rc));
}

void srv__models_delta(srv_models *M, uint64_t to, uint64_t from, const char *inm, srv_result *r)
{
    char etag[48];
    snprintf(etag, sizeof(etag), "\"d%llu-%llu\"", (unsigned long long)from,
             (unsigned long long)to);
    catch_up(M, to);
    pthread_mutex_lock(M->mu);
    uint64_t cur = M->version;
    size_t snapshot = M->cache.zst_len;
    int on = M->deltas;
    char cur_digest[STRATA_DIGEST_HEX_SIZE];
    memcpy(cur_digest, M->digest, sizeof(cur_digest));
    pthread_mutex_unlock(M->mu);
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
    if (to - from > STRATA_DOWNLINK_MAX_CHAIN || (M->keep > 0 && to - from > (uint64_t)M->keep)) {
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
        rc = strata_store_path(strata_store_dir(M->store), STRATA_STORE_FILE_DELTA, from + 1 + i, 0,
                               path, sizeof(path), NULL);
        int have = rc == 0 ? fetch(M, STRATA_STORE_FILE_DELTA, from + 1 + i) : 0;
        if (rc == 0 && have != 1)
            rc = have < 0 ? STRATA_EIO : STRATA_ESTATE; /* not kept: the snapshot instead */
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
        chain_compact(M, to, to == cur ? cur_digest : NULL, parts, lens, n, &chain, &len);
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
