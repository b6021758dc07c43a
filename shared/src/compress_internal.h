/* Internal interfaces shared by compress.c, topk.c, powersgd.c and ef.c.
 * Not installed; not part of the public API. */
#ifndef STRATA_COMPRESS_INTERNAL_H
#define STRATA_COMPRESS_INTERNAL_H

#include "strata/compress.h"

#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* Magnitude key of a float: its bit pattern without the sign. For finite
 * values and infinities the keys order exactly like |x|; keys at or above
 * STRATA__KEY_NONFINITE are infinities (equal) and NaNs (above). */
#define STRATA__KEY_NONFINITE 0x7f800000u

static inline uint32_t strata__mag_key(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof(u));
    return u & 0x7fffffffu;
}

/* Rounds x to the values format vf (nearest even), saturating to the largest
 * finite half value instead of overflowing to infinity. FP32 returns x. */
float strata__round_vf(float x, strata_values_format vf);

/* How the top-k pass obtains a[i] (see strata__topk_run). */
typedef enum {
    STRATA__TOPK_SRC = 0,   /* a = src, nothing written */
    STRATA__TOPK_ADD = 1,   /* a = (e + src) + 0, written to dst */
    STRATA__TOPK_SCALE = 2, /* a = (decay * e + src) + 0, written to dst */
    STRATA__TOPK_COPY = 3   /* a = src + 0, written to dst */
} strata__topk_mode;

/* Inputs of one top-k run. In the writing modes a is stored into dst and,
 * after selection, each kept position of dst becomes a - value (0 for FP32),
 * which makes dst the error-feedback residual. Adding +0 turns a negative
 * zero into +0 so that decode + residual == a holds bit for bit. */
typedef struct strata__topk_in {
    strata__topk_mode mode;
    const float *src; /* borrowed, n floats */
    const float *e;   /* borrowed, n floats; ADD and SCALE only */
    float decay;      /* SCALE only */
    float *dst;       /* borrowed, n floats; NULL in SRC mode */
} strata__topk_in;

/* Selects the k largest |a| (ties to the lower index) of the n elements
 * described by in, writing the ascending positions to idx[k] and, when
 * values is non-NULL, the kept values rounded to vf to values[k]. In the
 * writing modes values must be non-NULL. Errors: STRATA_EINVAL for a NaN or
 * infinite a, STRATA_ENOMEM (dst is then unspecified). */
int strata__topk_run(const strata__topk_in *in, size_t n, size_t k, strata_values_format vf,
                     uint32_t *idx, float *values);

/* Fills out as a TOPK layer (k = strata_comp_kept(density, n)) from the
 * top-k run described by in. With a quantised vf (INT8, TERNARY) the run
 * keeps float32 values, which strata__quantise_kept() then quantises (seed
 * drives INT8's stochastic rounding); in the writing modes each kept slot of
 * in->dst becomes a - value. Errors as strata__topk_run. */
int strata__clayer_topk(const strata__topk_in *in, size_t n, double density,
                        strata_values_format vf, uint64_t seed, strata_clayer *out);

/* Quantises the c->count float32 kept values in c->values (TOPK or RANDK,
 * c->values_format still FP32) to vf (INT8 or TERNARY) as strata_compress
 * describes: sets c->scale, c->values_format, c->values (to the decoded
 * values) and, for INT8, c->qlevels (new array). When dst is non-NULL, the
 * slot dst[idx[j]] of each kept value j becomes raw - value (idx: the kept
 * positions, borrowed). Errors: STRATA_ENOMEM (c unchanged but values). */
int strata__quantise_kept(strata_clayer *c, strata_values_format vf, uint64_t seed,
                          const uint32_t *idx, float *dst);

/* PowerSGD compression of a rows x cols row-major matrix (see
 * strata_compress). Fills out->values, count, rows, cols, rank. */
int strata__powersgd_compress(const float *a, uint32_t rows, uint32_t cols, uint32_t rank,
                              strata_values_format vf, uint64_t seed, const float *q_warm,
                              strata_clayer *out, strata_diag *diag);

/* Writes P Q^T of a consistent POWERSGD layer into dense. */
void strata__powersgd_expand(const strata_clayer *c, float *dense);

#endif
