/* Model distribution (models.c): the published model version (its number,
 * its digest, and its bytes encoded once: safetensors and the same as one
 * zstd frame), older versions read back from their checkpoints, chains of
 * downlink deltas (compacted with a base where that is smaller), version
 * 0's recipe, and the ETags ("m<version>", "d<from>-<to>", quoted).
 *
 * models.c owns all of it in its own structure (srv_models). The engine
 * lock guards the published version; the answers to model requests copy
 * what they need under it and read files without it. A close publishes a
 * new version (srv__models_publish); nothing here calls back into the
 * rounds. It is the server's only zstd user (through strata/zframe.h).
 *
 * May call: the store (checkpoint and delta paths), libstrata (checkpoint
 * metadata, safetensors, zframe, downlink chains, fileio, log) and
 * result.h. */
#ifndef STRATA_SERVER_MODELS_H
#define STRATA_SERVER_MODELS_H

#include "result.h"
#include "store.h"

#include "strata/downlink.h"
#include "strata/model.h"

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

typedef struct srv_models srv_models;

/* One encoded model version: raw safetensors and one zstd frame of it. */
typedef struct srv_model_blob {
    uint8_t *raw, *zst;
    size_t raw_len, zst_len;
} srv_model_blob;

/* Makes the (empty) distribution of the state directory of store: deltas
 * says whether the coordinator publishes downlink deltas (--downlink),
 * keep is --downlink-keep. store and mu are borrowed. Errors:
 * STRATA_ENOMEM. */
int srv__models_new(strata_store *store, pthread_mutex_t *mu, int deltas, long keep,
                    srv_models **out);

/* Frees M. Accepts NULL. */
void srv__models_free(srv_models *M);

/* Encodes m (the served model, with its checkpoint metadata) into *out
 * (zeroed on entry; free with srv__model_blob_cleanup). Uses the encoder
 * of the published version: only the round thread and start-up may call
 * it. Errors: the encoders', STRATA_ENOMEM. */
int srv__models_encode(srv_models *M, strata_model *m, srv_model_blob *out, strata_diag *d);

/* Publishes version (b taken and zeroed; digest is the served model's):
 * requests get it from now on. Lock held (or start-up). */
void srv__models_publish(srv_models *M, uint64_t version, srv_model_blob *b,
                         const char digest[STRATA_DIGEST_HEX_SIZE]);

/* The published version, its digest (copied into out) and the size of its
 * zstd snapshot. Lock held, or the round thread (the only writer). */
uint64_t srv__models_version(const srv_models *M);
void srv__models_digest(const srv_models *M, char out[STRATA_DIGEST_HEX_SIZE]);
size_t srv__models_snapshot_bytes(const srv_models *M);

/* A follower's: publishes the recorded version `version` from its
 * checkpoint, as the leader's close published it (a version not newer than
 * the published one changes nothing). Reads the store and the file without
 * the lock and takes it to publish; one call at a time (a follower has no
 * round thread, the only other user of the encoder). Errors: STRATA_ESTATE (no such
 * checkpoint), the store's, the checkpoint reader's, the encoders'. */
int srv__models_follow(srv_models *M, uint64_t version, strata_diag *d);

/* Makes M a follower's: a request for one of the two versions after the
 * published one first looks for it in the store (srv__models_follow), as
 * the leader may have published it a moment ago. Start-up. */
void srv__models_set_follower(srv_models *M);

/* Makes recipe (len bytes, taken) version 0's recipe, served by
 * srv__models_init. Start-up. */
void srv__models_set_recipe(srv_models *M, char *recipe, size_t len);

/* Frees a blob's buffers and zeroes it. */
void srv__model_blob_cleanup(srv_model_blob *b);

/* srv_engine_model, srv_engine_model_delta and srv_engine_model_init
 * (engine.h says what each answers). Each takes the lock to read the
 * published version and reads files without it. */
void srv__models_get(srv_models *M, uint64_t version, int want_zstd, const char *if_none_match,
                     srv_result *r);
void srv__models_delta(srv_models *M, uint64_t to, uint64_t from, const char *if_none_match,
                       srv_result *r);
void srv__models_init(srv_models *M, srv_result *r);

#endif
