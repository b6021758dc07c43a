/* Compressed layers: the common representation that compressors produce,
 * error feedback consumes and the payload codec (strata/payload.h) puts on
 * the wire. One strata_clayer describes one parameter tensor of an update.
 *
 * Which arrays are used depends on the compressor:
 *   NONE, FP16, BF16  values[numel]            (FP16/BF16: values already
 *                                               rounded to that precision)
 *   TOPK              indices[count] (strictly ascending) + values[count]
 *   RANDK             seed; indices regenerated from (seed, numel, count);
 *                     values[count]
 *   QSGD              scale = L2 norm; levels = s; qlevels[numel] in
 *                     [-s, s] (sign * level); value = scale * q / s
 *   SIGN              scale = mean |a|; signbits[(numel + 7) / 8], bit i set
 *                     means element i is negative; value = +-scale
 *   POWERSGD          rows x cols matrix view, rank r; values holds P
 *                     (rows * r) followed by Q (cols * r); dense = P Q^T
 * values_format says how values travel (FP32, or FP16/BF16 where the
 * compressor already rounded them so that decoding is exact). */
#ifndef STRATA_COMPRESS_H
#define STRATA_COMPRESS_H

#include "strata/error.h"
#include "strata/tensor.h"

#include <stddef.h>
#include <stdint.h>

typedef enum {
    STRATA_COMP_NONE = 0,
    STRATA_COMP_FP16 = 1,
    STRATA_COMP_BF16 = 2,
    STRATA_COMP_TOPK = 3,
    STRATA_COMP_RANDK = 4,
    STRATA_COMP_QSGD = 5,
    STRATA_COMP_SIGN = 6,
    STRATA_COMP_POWERSGD = 7
} strata_compressor_id;

#define STRATA_COMP_COUNT 8

typedef enum {
    STRATA_VALUES_FP32 = 0,
    STRATA_VALUES_FP16 = 1,
    STRATA_VALUES_BF16 = 2
} strata_values_format;

/* Largest tensor a compressed layer may describe (indices are 32-bit). */
#define STRATA_CLAYER_MAX_NUMEL ((uint64_t)UINT32_MAX)

typedef struct strata_clayer {
    uint32_t layer_index; /* position of the tensor in the model */
    strata_compressor_id comp;
    strata_values_format values_format;
    uint64_t numel; /* elements of the dense tensor */
    uint64_t count; /* TOPK/RANDK: kept elements; others: entries in values */
    uint32_t *indices; /* TOPK only, count entries, strictly ascending */
    float *values; /* see the table above */
    int8_t *qlevels; /* QSGD only, numel entries */
    uint8_t *signbits; /* SIGN only, (numel + 7) / 8 bytes */
    float scale; /* QSGD: L2 norm; SIGN: mean |a| */
    uint32_t levels; /* QSGD: s in [1, 127] */
    uint32_t rows, cols, rank; /* POWERSGD */
    uint64_t seed; /* RANDK */
} strata_clayer;

/* Per-layer compression budget, decided by a policy (strata/policy.h). */
typedef struct strata_budget {
    strata_compressor_id comp;
    double density; /* TOPK/RANDK: fraction kept, (0, 1] */
    uint32_t levels; /* QSGD */
    uint32_t rank; /* POWERSGD */
} strata_budget;

/* Returns the compressor's name ("topk"), or "?" for an unknown id. */
const char *strata_comp_name(strata_compressor_id id);

/* Parses a compressor name; returns STRATA_EINVAL for an unknown one. */
int strata_comp_from_name(const char *name, strata_compressor_id *out);

/* Frees the arrays of a compressed layer and zeroes it. Accepts NULL. */
void strata_clayer_cleanup(strata_clayer *c);

/* Frees an array of n compressed layers (each cleaned up) and the array. */
void strata_clayers_free(strata_clayer *c, size_t n);

#endif
