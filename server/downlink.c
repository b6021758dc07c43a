/* The compressed downlink on the coordinator (docs/algorithm.md,
 * "Downlink"; strata/downlink.h): the model clients hold (x̂) beside the
 * server's model x, one delta payload per closed round with the server's
 * residual x - x̂ carried to the next, the files that make both durable
 * with the checkpoint, and the digest of the served model.
 *
 * Files (state directory, checkpoints/): model-V.safetensors is x̂ of
 * version V (what GET /v1/models/V serves and what the evaluation
 * measures), server-model-V.safetensors is x at version V,
 * delta-V.bin the payload that turns x̂ of V - 1 into x̂ of V; the last
 * downlink_keep deltas are kept; with 0, every delta that a chain smaller
 * than the snapshot can still use (srv__downlink_prune). Version 0's recipe
 * (strata/recipe.h) is checked once at start-up against checkpoint 0. All
 * are written before the store records the close, so a restarted
 * coordinator serves the same bytes. This file alone touches struct
 * srv_downlink. */
#include "downlink.h"

#include "strata/checkpoint.h"
#include "strata/fileio.h"
#include "strata/log.h"
#include "strata/payload.h"
#include "strata/recipe.h"
#include "strata/safetensors.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Largest server-model file read back at start-up. */
#define SERVER_MODEL_MAX ((size_t)1 << 31)

struct srv_downlink {
    srv_downlink_config c;
    strata_model *x;                  /* the server's model (borrowed) */
    strata_model *xhat;               /* with --downlink: what the clients hold; else NULL */
    strata_tensor_list xhat_rollback; /* x̂ before a close's step */
    uint8_t *wire;                    /* the delta of the close in progress, or NULL */
    size_t wire_len;
};

strata_model *srv__downlink_served(const srv_downlink *dl)
{
    return dl->xhat != NULL ? dl->xhat : dl->x;
}

strata_model *srv__downlink_xhat(const srv_downlink *dl)
{
    return dl->xhat;
}

/* With --downlink: x̂ from the checkpoint of version, x from its file. */
static int load(srv_downlink *dl, uint64_t version, strata_diag *d)
{
    char path[4096];
    int rc, found = 0;
    if ((rc = strata_store_file_fetch(dl->c.store, STRATA_STORE_FILE_CHECKPOINT, version, &found,
                                      d)) < 0 ||
        (rc = strata_store_file_fetch(dl->c.store, STRATA_STORE_FILE_SERVER_MODEL, version, &found,
                                      d)) < 0 ||
        (rc = strata_store_checkpoint_path(dl->c.store, version, path, sizeof(path), d)) < 0 ||
        (rc = strata_checkpoint_load(path, &dl->xhat, d)) < 0)
        return rc;
    rc = strata_store_path(strata_store_dir(dl->c.store), STRATA_STORE_FILE_SERVER_MODEL, version,
                           0, path, sizeof(path), d);
    struct stat st;
    if (rc == 0 && stat(path, &st) == 0) {
        strata_tensor_list x;
        strata_tensor_list_init(&x);
        rc = strata_safetensors_read(path, SERVER_MODEL_MAX, &x, NULL, d);
        if (rc == 0 && !strata_tensor_list_same_layout(&x, strata_model_params(dl->x)))
            rc = strata_diag_set(d, STRATA_EINVAL, "%s: not this model's layout", path);
        if (rc == 0)
            strata_tensor_list_copy_values(strata_model_params(dl->x), &x);
        strata_tensor_list_cleanup(&x);
    }
    if (rc == 0)
        rc = strata_tensor_list_copy(&dl->xhat_rollback, strata_model_params(dl->xhat));
    return rc;
}

int srv__downlink_new(const srv_downlink_config *c, strata_model *x, uint64_t version,
                      srv_downlink **out, strata_diag *d)
{
    *out = NULL;
    srv_downlink *dl = calloc(1, sizeof(*dl));
    if (dl == NULL)
        return STRATA_ENOMEM;
    dl->c = *c;
    dl->x = x;
    strata_tensor_list_init(&dl->xhat_rollback);
    int rc = c->on ? load(dl, version, d) : 0;
    if (rc < 0) {
        srv__downlink_free(dl);
        return rc;
    }
    *out = dl;
    return 0;
}

void srv__downlink_free(srv_downlink *dl)
{
    if (dl == NULL)
        return;
    strata_model_free(dl->xhat);
    strata_tensor_list_cleanup(&dl->xhat_rollback);
    free(dl->wire);
    free(dl);
}

/* Writes x (the server's model) of version v to its file, atomically. */
static int write_x(srv_downlink *dl, uint64_t v, strata_diag *d)
{
    char path[4096];
    int rc = strata_store_path(strata_store_dir(dl->c.store), STRATA_STORE_FILE_SERVER_MODEL, v, 0,
                               path, sizeof(path), d);
    if (rc == 0)
        rc = strata_checkpoint_save(dl->x, path, d);
    return rc;
}

int srv__downlink_step(srv_downlink *dl, uint32_t r, uint64_t v,
                       char digest[STRATA_DIGEST_HEX_SIZE], strata_diag *d)
{
    if (dl->xhat == NULL) {
        strata_downlink_digest(strata_model_params(dl->x), digest);
        return 0;
    }
    strata_tensor_list *xh = strata_model_params(dl->xhat);
    const strata_tensor_list *x = strata_model_params(dl->x);
    strata_tensor_list_copy_values(&dl->xhat_rollback, xh);
    free(dl->wire);
    dl->wire = NULL;
    dl->wire_len = 0;
    strata_clayer *layers = NULL;
    char *meta = NULL;
    uint64_t seed = (uint64_t)dl->c.seed * 0x9e3779b97f4a7c15ull ^ v;
    int rc = strata_downlink_step(xh, x, dl->c.budget, seed, &layers, d);
    if (rc < 0)
        return rc;
    strata_downlink_digest(xh, digest);
    if ((rc = strata_downlink_meta(v - 1, v, digest, &meta)) == 0) {
        strata_payload p = {.round = r,
                            .model_version = v,
                            .num_layers = xh->count,
                            .layers = layers,
                            .metadata_json = meta};
        rc = strata_payload_encode(&p, 3, &dl->wire, &dl->wire_len, d);
    }
    strata_clayers_free(layers, xh->count);
    free(meta);
    if (rc < 0)
        srv__downlink_rollback(dl);
    return rc;
}

int srv__downlink_write(srv_downlink *dl, uint32_t r, uint64_t v, double xhat_acc, double x_acc,
                        strata_diag *d)
{
    if (dl->xhat == NULL)
        return 0;
    char path[4096];
    int rc = strata_store_path(strata_store_dir(dl->c.store), STRATA_STORE_FILE_DELTA, v, 0, path,
                               sizeof(path), d);
    if (rc == 0)
        rc = strata_file_write_atomic(path, dl->wire, dl->wire_len, 0644, d);
    if (rc == 0)
        rc = write_x(dl, v, d);
    if (rc == 0) {
        char digest[STRATA_DIGEST_HEX_SIZE];
        strata_downlink_digest(strata_model_params(dl->xhat), digest);
        strata_log_info("round %u: downlink delta %zu bytes (%s), model %llu digest %s; served "
                        "model x̂ accuracy %.4f, server model x accuracy %.4f",
                        r, dl->wire_len, dl->c.name, (unsigned long long)v, digest, xhat_acc,
                        x_acc);
    }
    return rc;
}

void srv__downlink_rollback(srv_downlink *dl)
{
    if (dl->xhat != NULL)
        strata_tensor_list_copy_values(strata_model_params(dl->xhat), &dl->xhat_rollback);
    free(dl->wire);
    dl->wire = NULL;
    dl->wire_len = 0;
}

void srv__downlink_prune(srv_downlink *dl, uint64_t v, size_t snapshot)
{
    free(dl->wire);
    dl->wire = NULL;
    dl->wire_len = 0;
    if (dl->xhat == NULL)
        return;
    char path[4096];
    /* x of the version before: start-up reads x of the latest only. */
    if (v > 0)
        strata_store_file_remove(dl->c.store, STRATA_STORE_FILE_SERVER_MODEL, v - 1, NULL);
    if (dl->c.keep > 0) {
        if (v > (uint64_t)dl->c.keep)
            strata_store_file_remove(dl->c.store, STRATA_STORE_FILE_DELTA, v - (uint64_t)dl->c.keep,
                                     NULL);
        return;
    }
    /* --downlink-keep 0: a delta is kept while some chain ending at v that
     * holds it is smaller than the snapshot (and within the chain limit);
     * the first one that is not, and every older one, can never be served
     * again (chains only grow). */
    uint64_t snap = snapshot, sum = 8, w = v;
    struct stat st;
    for (; w >= 1 && v - w < STRATA_DOWNLINK_MAX_CHAIN; w--) {
        if (strata_store_path(strata_store_dir(dl->c.store), STRATA_STORE_FILE_DELTA, w, 0, path,
                              sizeof(path), NULL) < 0 ||
            stat(path, &st) != 0)
            return; /* already pruned from here down */
        sum += 4 + (uint64_t)st.st_size;
        if (sum >= snap)
            break;
    }
    for (; w >= 1; w--) {
        if (strata_store_path(strata_store_dir(dl->c.store), STRATA_STORE_FILE_DELTA, w, 0, path,
                              sizeof(path), NULL) < 0 ||
            stat(path, &st) != 0 ||
            strata_store_file_remove(dl->c.store, STRATA_STORE_FILE_DELTA, w, NULL) < 0)
            return;
    }
}

/* Why version 0 has no recipe, or "" when it has one: checkpoint 0 (x̂ of
 * version 0) against the seeded model, then the deltas from version 0. */
static int recipe_check(srv_downlink *dl, const strata_model *seeded, uint64_t version, char *why,
                        size_t cap, strata_diag *d)
{
    char path[4096];
    strata_model *m0 = NULL;
    strata_diag ld = {{0}};
    int found = 0;
    int rc = strata_store_file_fetch(dl->c.store, STRATA_STORE_FILE_CHECKPOINT, 0, &found, &ld);
    if (rc == 0)
        rc = strata_store_checkpoint_path(dl->c.store, 0, path, sizeof(path), &ld);
    if (rc == 0)
        rc = strata_checkpoint_load(path, &m0, &ld);
    if (rc == STRATA_ENOMEM)
        return strata_diag_set(d, rc, "version 0: out of memory");
    if (rc < 0) {
        snprintf(why, cap, "version 0 cannot be read (%s)", strata_diag_msg(&ld, rc));
        return 0;
    }
    float m_a, s_a, m_b, s_b;
    strata_model_get_normalization(m0, &m_a, &s_a);
    strata_model_get_normalization(seeded, &m_b, &s_b);
    char h0[STRATA_DIGEST_HEX_SIZE], hs[STRATA_DIGEST_HEX_SIZE];
    strata_downlink_digest(strata_model_params(m0), h0);
    strata_downlink_digest(strata_model_params((strata_model *)seeded), hs);
    if (strcmp(strata_model_arch(m0), strata_model_arch(seeded)) != 0)
        snprintf(why, cap, "version 0 has another architecture than --model");
    else if (memcmp(&m_a, &m_b, sizeof(m_a)) != 0 || memcmp(&s_a, &s_b, sizeof(s_a)) != 0)
        snprintf(why, cap, "version 0 has another normalisation than the test split's");
    else if (strcmp(h0, hs) != 0)
        snprintf(why, cap,
                 "version 0 (digest %.16s...) is not the initialisation from --seed "
                 "%ld (%.16s...)",
                 h0, dl->c.seed, hs);
    strata_model_free(m0);
    struct stat st;
    if (why[0] == '\0' && version > 0 &&
        (strata_store_file_fetch(dl->c.store, STRATA_STORE_FILE_DELTA, 1, &found, NULL) < 0 ||
         strata_store_path(strata_store_dir(dl->c.store), STRATA_STORE_FILE_DELTA, 1, 0, path,
                           sizeof(path), NULL) < 0 ||
         stat(path, &st) != 0))
        snprintf(why, cap, "the delta from version 0 to 1 is not kept");
    return 0;
}

int srv__downlink_recipe(srv_downlink *dl, const strata_model *seeded, uint64_t version,
                         char **recipe, size_t *recipe_len, strata_diag *d)
{
    *recipe = NULL;
    *recipe_len = 0;
    if (dl->xhat == NULL)
        return 0;
    strata_model *back = NULL;
    strata_recipe rec, dec;
    memset(&rec, 0, sizeof(rec));
    memset(&dec, 0, sizeof(dec));
    char why[512] = "";
    char *json = NULL;
    size_t len = 0;
    int rc = recipe_check(dl, seeded, version, why, sizeof(why), d);
    /* The published recipe must rebuild version 0 through the same decoder
     * and builder a client runs. */
    strata_diag bd = {{0}};
    if (rc == 0 && why[0] == '\0') {
        int brc = strata_recipe_of(seeded, (uint64_t)dl->c.seed, &rec, &bd);
        if (brc == 0)
            brc = strata_recipe_encode(&rec, &json, &len, &bd);
        if (brc == 0)
            brc = strata_recipe_decode(json, len, &dec, &bd);
        if (brc == 0)
            brc = strata_recipe_build(&dec, SIZE_MAX, &back, &bd);
        if (brc == STRATA_ENOMEM) {
            rc = strata_diag_set(d, brc, "version 0's recipe: out of memory");
            goto out;
        }
        if (brc < 0)
            snprintf(why, sizeof(why), "its recipe cannot be made or does not rebuild it (%s)",
                     strata_diag_msg(&bd, brc));
    }
    if (rc == 0 && why[0] == '\0') {
        *recipe = json;
        *recipe_len = len;
        json = NULL;
        strata_log_info("version 0 is the initialisation from --seed %ld (digest %.16s...): "
                        "clients without a model build it (GET /v1/models/0/init)",
                        dl->c.seed, rec.digest);
    } else if (rc == 0) {
        strata_log_info("no recipe for version 0: %s; clients without a model download a "
                        "snapshot",
                        why);
    }
out:
    free(json);
    strata_recipe_cleanup(&rec);
    strata_recipe_cleanup(&dec);
    strata_model_free(back);
    return rc;
}
