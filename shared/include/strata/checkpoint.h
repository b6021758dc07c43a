/* Model checkpoints: safetensors files whose __metadata__ carries the
 * architecture ("strata.architecture", compact JSON) and the input
 * preprocessing ("strata.input_normalization" = "mean,std", applied after
 * scaling pixels to [0,1]; "0,1" when none), so that any tool can rebuild
 * and evaluate the model the same way. */
#ifndef STRATA_CHECKPOINT_H
#define STRATA_CHECKPOINT_H

#include "strata/error.h"
#include "strata/model.h"
#include "strata/safetensors.h"

#define STRATA_META_ARCH "strata.architecture"
#define STRATA_META_NORM "strata.input_normalization"

/* Fills meta (initialised by the caller) with the model's architecture and
 * normalisation entries. */
int strata_checkpoint_metadata(const strata_model *m, strata_metadata *meta);

/* Writes the model's parameters and metadata to path (temp-then-rename). */
int strata_checkpoint_save(strata_model *m, const char *path, strata_diag *diag);

/* Builds a model from a checkpoint file: the architecture comes from the
 * metadata, the tensors must match it exactly (names, shapes, order). */
int strata_checkpoint_load(const char *path, strata_model **out, strata_diag *diag);

/* Same from an in-memory safetensors buffer (borrowed). */
int strata_checkpoint_decode(const uint8_t *buf, size_t len, strata_model **out, strata_diag *diag);

/* Parses "mean,std" (std > 0). */
int strata_parse_normalization(const char *s, float *mean, float *std);

#endif
