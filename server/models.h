/* Model distribution's internals (models.c): the encoded current version
 * (safetensors, and the same as one zstd frame) and its replacement when a
 * round closes. Its public call, srv_engine_model, is declared in engine.h.
 *
 * models.c owns: the cache, older versions read back from their
 * checkpoints, ETags ("m<version>", quoted). It may call the store
 * (checkpoint paths), libstrata (checkpoint metadata, safetensors, zframe,
 * fileio) and result.h. It is the server's only zstd user (through
 * strata/zframe.h). */
#ifndef STRATA_SERVER_MODELS_H
#define STRATA_SERVER_MODELS_H

#include "engine.h"

#include <stddef.h>
#include <stdint.h>

/* One encoded model version: raw safetensors and one zstd frame of it. */
typedef struct srv_model_blob {
    uint8_t *raw, *zst;
    size_t raw_len, zst_len;
} srv_model_blob;

/* Creates the encoders. Start-up. Errors: STRATA_ENOMEM. */
int srv__models_init(srv_engine *e);

/* Encodes e's model (with its checkpoint metadata) into *out (zeroed on
 * entry; free with srv__model_blob_cleanup). Reads the model without the
 * lock: only the round thread and start-up may call it. Errors: the
 * encoders', STRATA_ENOMEM. */
int srv__model_encode(srv_engine *e, srv_model_blob *out, strata_diag *d);

/* Makes *b (taken; zeroed) the cache of the current version. Lock held
 * (or start-up). */
void srv__model_install(srv_engine *e, srv_model_blob *b);

/* Frees a blob's buffers and zeroes it. */
void srv__model_blob_cleanup(srv_model_blob *b);

/* Frees the cache and the encoders. */
void srv__models_cleanup(srv_engine *e);

#endif
