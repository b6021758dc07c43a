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
 * compressor already rounded them so that decoding is exact). TOPK and RANDK
 * may also quantise their kept values:
 *   INT8              scale = per-layer step (a bfloat16-representable
 *                     float >= 0); qlevels[count] in [-127, 127]; the value
 *                     is scale * q (exact in float32), and values[count]
 *                     holds those products
 *   TERNARY           scale = mu, the per-layer magnitude (bfloat16-
 *                     representable, >= 0); values[count] is +mu or -mu
 *                     (+0 when mu is 0) */
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
    STRATA_VALUES_BF16 = 2,
    STRATA_VALUES_INT8 = 3,
    STRATA_VALUES_TERNARY = 4
} strata_values_format;

#define STRATA_VALUES_COUNT 5

/* 1 for the values formats that quantise kept values to a per-layer scale
 * (INT8, TERNARY); they apply to TOPK and RANDK layers only. */
#define STRATA_VALUES_QUANTISED(f) ((f) == STRATA_VALUES_INT8 || (f) == STRATA_VALUES_TERNARY)

/* Largest tensor a compressed layer may describe (indices are 32-bit). */
#define STRATA_CLAYER_MAX_NUMEL ((uint64_t)UINT32_MAX)

typedef struct strata_clayer {
    uint32_t layer_index; /* position of the tensor in the model */
    strata_compressor_id comp;
    strata_values_format values_format;
    uint64_t numel;            /* elements of the dense tensor */
    uint64_t count;            /* TOPK/RANDK: kept elements; others: entries in values */
    uint32_t *indices;         /* TOPK only, count entries, strictly ascending */
    float *values;             /* see the table above */
    int8_t *qlevels;           /* QSGD: numel entries; INT8 values: count entries */
    uint8_t *signbits;         /* SIGN only, (numel + 7) / 8 bytes */
    float scale;               /* QSGD: L2 norm; SIGN: mean |a|; INT8: step; TERNARY: mu */
    uint32_t levels;           /* QSGD: s in [1, 127] */
    uint32_t rows, cols, rank; /* POWERSGD */
    uint64_t seed;             /* RANDK */
} strata_clayer;

/* Per-layer compression budget, decided by a policy (strata/policy.h):
 * the compressor, its parameter and the format its float values travel in.
 * values applies to NONE, TOPK, RANDK and POWERSGD (the formats beyond BF16
 * to TOPK and RANDK only); for FP16, BF16, QSGD and SIGN it is FP32. */
typedef struct strata_budget {
    strata_compressor_id comp;
    double density;              /* TOPK/RANDK: fraction kept, (0, 1] */
    uint32_t levels;             /* QSGD */
    uint32_t rank;               /* POWERSGD */
    strata_values_format values; /* see above */
} strata_budget;

/* Returns the compressor's name ("topk"), or "?" for an unknown id. */
const char *strata_comp_name(strata_compressor_id id);

/* Returns a values format's name ("fp32", "fp16", "bf16", "int8",
 * "ternary"), or "?" for an
 * unknown value. These names are the only spelling of the formats on every
 * interface (command lines, configuration, the task JSON, diagnostics).
 * Static strings; thread-safe. */
const char *strata_values_format_name(strata_values_format f);

/* Parses a values format name ("fp32", "fp16", "bf16", "int8" or
 * "ternary", exactly, case
 * sensitive) into *out. *out is set to STRATA_VALUES_FP32 on entry. Returns
 * STRATA_EINVAL for NULL arguments or any other string. Thread-safe. */
int strata_values_format_parse(const char *name, strata_values_format *out);

/* Parses a compressor specification, the one text form of a budget on
 * every interface (--policy, the policy JSON, lgreco candidates):
 *   none | fp16 | bf16 | sign | qsgd:LEVELS | powersgd:RANK |
 *   topk[:DENSITY] | randk[:DENSITY]
 * each optionally followed by :VALUES (a strata_values_format_name) where
 * the compressor takes a values format (see strata_budget); "topk:0.01:int8",
 * "qsgd:4", "powersgd:2:fp16". With need_density the density of topk/randk
 * is required; otherwise it may be left out (density 1, set by a policy).
 * *out is zeroed on entry. Errors: STRATA_EINVAL (diag names the spec and
 * the expected forms) for anything else, including a budget that fails
 * strata_budget_check. Thread-safe. */
int strata_budget_parse(const char *spec, int need_density, strata_budget *out, strata_diag *diag);

/* Writes the specification of b (the inverse of strata_budget_parse; the
 * density only when with_density, in the shortest of 6 or 17 significant
 * digits that reads back exactly; ":fp32" left out) into buf (size bytes,
 * truncated if needed; 64 always suffice) and returns buf. */
char *strata_budget_format(const strata_budget *b, int with_density, char *buf, size_t size);

/* The estimated payload bytes of one layer of numel elements compressed
 * with b in its values format (layer header included): what the lgreco
 * policy and byte calibration compare candidates by.
 * strata_clayer_cost_bytes() for a vector of numel elements, except
 * POWERSGD, costed on a square view ((rows + cols) * rank values). 0 for an
 * invalid budget. */
double strata_budget_bytes(const strata_budget *b, uint64_t numel);
/* The values format a layer of compressor comp carries when vf is asked
 * for: vf itself, except that INT8 and TERNARY, which quantise sparse kept
 * values only, give FP32 for every compressor but TOPK and RANDK. Error
 * feedback (strata/ef.h) compresses by this rule; a coordinator checks
 * uploads by it. Pure, thread-safe. */
strata_values_format strata_values_format_for(strata_compressor_id comp, strata_values_format vf);

/* The budget that sends a whole tensor with values vf: NONE at density 1
 * in strata_values_format_for(NONE, vf), so fp32 for INT8 and TERNARY,
 * which quantise kept values only. The policies' small layers and the
 * downlink's (in bf16) use it. Pure, thread-safe. */
strata_budget strata_budget_whole(strata_values_format vf);

/* Parses a compressor name; returns STRATA_EINVAL for an unknown one. */
int strata_comp_from_name(const char *name, strata_compressor_id *out);

/* Frees the arrays of a compressed layer and zeroes it. Accepts NULL. */
void strata_clayer_cleanup(strata_clayer *c);

/* Frees an array of n compressed layers (each cleaned up) and the array. */
void strata_clayers_free(strata_clayer *c, size_t n);

/* ---- Half-precision conversions ----
 *
 * IEEE binary16 (fp16) and bfloat16 (bf16) conversions with round to
 * nearest, ties to even. Values beyond the target's range become infinity,
 * NaN stays a (quiet) NaN. The conversions back to float32 are exact. Pure
 * functions, thread-safe. */
uint16_t strata_f32_to_f16(float f);
float strata_f16_to_f32(uint16_t h);
uint16_t strata_f32_to_bf16(float f);
float strata_bf16_to_f32(uint16_t h);

/* ---- Compression ---- */

/* Number of elements a TOPK or RANDK layer keeps: max(1, floor(density *
 * numel)) computed in double precision, capped at numel. density must be in
 * (0, 1]; numel >= 1. Every module uses this one formula. */
uint64_t strata_comp_kept(double density, uint64_t numel);

/* Checks a budget: comp known; TOPK/RANDK density in (0, 1]; QSGD levels in
 * [1, 127]; POWERSGD rank >= 1; values a known format that the compressor
 * takes (see strata_budget). Returns STRATA_EINVAL (with diag) otherwise. */
int strata_budget_check(const strata_budget *b, strata_diag *diag);

/* The matrix view PowerSGD uses for a tensor: rows = shape[0], cols = numel /
 * rows, and the effective rank min(rank, rows, cols). Returns STRATA_EINVAL
 * for ndim < 2 (vectors are sent dense), a bad shape or rank 0; out-params
 * are zeroed on entry. */
int strata_powersgd_dims(int ndim, const int64_t *shape, uint32_t rank, uint32_t *rows,
                         uint32_t *cols, uint32_t *rank_eff);

/* Compresses the n floats at a (borrowed; a row-major tensor of the given
 * ndim and shape, which must have n elements, 1 <= n <=
 * STRATA_CLAYER_MAX_NUMEL) with budget b into out, which is zeroed on entry
 * and owns its arrays afterwards (free with strata_clayer_cleanup); the
 * caller sets out->layer_index. Per compressor:
 *   NONE/FP16/BF16  dense values (FP16/BF16 force that values format).
 *   TOPK            exact top-k by magnitude, k = strata_comp_kept(); ties
 *                   go to the lower index; indices strictly ascending.
 *   RANDK           k positions from strata_randk_indices(seed, n, k);
 *                   values are NOT rescaled by n/k (biased, the standard
 *                   choice with error feedback); out->seed = seed.
 *   QSGD            stochastic rounding to b->levels levels of |a|/||a||,
 *                   unbiased; random draws from a strata_rng seeded by seed.
 *   SIGN            scale = mean |a|, sign bits (zero counts as positive).
 *   POWERSGD        one power iteration of rank strata_powersgd_dims() on
 *                   the shape[0] x (n / shape[0]) view; Q starts from q_warm
 *                   (borrowed, cols * rank_eff floats; columns that are zero
 *                   or non-finite are redrawn) or, when q_warm is NULL, from
 *                   normal draws seeded by seed. ndim <= 1 falls back to
 *                   NONE. Uses cblas_sgemm (do not call from inside an
 *                   OpenMP parallel region).
 * vf is the values format for the float values of NONE, TOPK, RANDK and
 * POWERSGD: with FP16/BF16 the kept values are rounded (to nearest even,
 * saturating at the largest finite half value) before they are stored, so
 * strata_clayer_decode() reproduces exactly what error feedback subtracts.
 * INT8 and TERNARY apply to TOPK and RANDK only (STRATA_EINVAL for any
 * other compressor):
 *   INT8     scale = max |kept| / 127 rounded up to 8 significant bits;
 *            q = |a| / scale rounded stochastically (up with probability
 *            equal to the fraction, so E[scale * q] = a; draws from a
 *            strata_rng seeded by seed), capped at 127, with a's sign.
 *   TERNARY  mu = mean |kept|, capped at twice the smallest non-zero kept
 *            magnitude and truncated to 8 significant bits; each kept value
 *            becomes +mu or -mu (a's sign; zero counts as positive). The
 *            cap keeps |a| >= mu / 2 for every non-zero kept a, so for
 *            TOPK a - value is exact in float32 (given max |kept| < 2^16
 *            mu) and error feedback's identity holds bit for bit.
 * QSGD and SIGN carry no float values (values_format FP32).
 * Errors: STRATA_EINVAL for a bad argument or budget, a shape that does not
 * match n, or a non-finite input value (NaN or infinity); STRATA_ETOOBIG
 * when n > STRATA_CLAYER_MAX_NUMEL; STRATA_ENOMEM. Thread-safe for distinct
 * outputs; TOPK uses OpenMP threads for n >= STRATA_TOPK_PARALLEL_MIN. */
int strata_compress(const float *a, size_t n, int ndim, const int64_t *shape,
                    const strata_budget *b, strata_values_format vf, uint64_t seed,
                    const float *q_warm, strata_clayer *out, strata_diag *diag);

/* Writes the dense reconstruction of c (borrowed) into dense (c->numel
 * floats). c may come from an untrusted payload: its internal consistency is
 * checked first and dense is left untouched when it fails. Errors:
 * STRATA_EPROTO (with diag) for an unknown compressor or values format, numel
 * 0 or above STRATA_CLAYER_MAX_NUMEL, count not matching the compressor
 * (dense: numel; TOPK/RANDK: <= numel; QSGD/SIGN: 0; POWERSGD: (rows +
 * cols) * rank), a missing array, TOPK indices not strictly ascending or out
 * of range, QSGD levels outside [1, 127] or a quantised level beyond
 * +-levels, SIGN padding bits set, POWERSGD rows * cols != numel or rank
 * outside [1, min(rows, cols)], a NaN, infinite or negative scale, a NaN or
 * infinite value, a value not representable in the declared values format
 * (and, for FP16/BF16 layers, in that precision), an INT8 or TERNARY
 * layer whose compressor is not TOPK/RANDK, whose scale is not a finite,
 * non-negative bfloat16 value (INT8: with scale * 127 finite), whose
 * qlevels are missing, beyond +-127 or
 * not zero under a zero scale, or whose values are not exactly scale * q
 * (INT8) or +-scale (TERNARY; +0 when the scale is 0), a POWERSGD dimension
 * above INT_MAX or factors whose product could overflow float32; STRATA_EINVAL for NULL arguments;
 * STRATA_ENOMEM (RANDK index regeneration, POWERSGD). Thread-safe. */
int strata_clayer_decode(const strata_clayer *c, float *dense, strata_diag *diag);

/* The expected encoded size, in bytes, of one layer compressed with budget
 * b (borrowed) and values format vf as one block of a payload
 * (schemas/payload.md): the 60-byte block header, positions at the entropy
 * of the kept fraction (top-k: count * H(k / numel) / (k / numel) bits,
 * what the Rice-coded gaps reach within about 1%), and per-format value
 * bytes under a Gaussian model of the update (fp32 about 3.0, fp16 about
 * 1.4, bf16 about 1.0, int8 about 0.7, ternary 0.125 per kept value; RANDK
 * values, drawn from the whole distribution, cost more than TOPK's tails),
 * QSGD levels by their entropy or by what zstd spends per non-zero level
 * (measured), SIGN one bit per element, POWERSGD (rows + cols) * rank
 * values, dense layers numel values. The shape (borrowed, ndim entries, numel elements) gives
 * POWERSGD's matrix view; ndim < 2 sends POWERSGD dense. Used to compare
 * candidates of different families in one currency; within 10% of the
 * real size on Gaussian layers of 10^4 to 10^6 elements, except QSGD with
 * under 1% non-zero levels, whose zstd size varies by up to 30% from one
 * draw to the next (the estimate is the typical size). Returns a
 * negative value for an invalid budget, an unknown values format, a
 * quantised format with a compressor other than TOPK/RANDK, or numel 0.
 * Pure, thread-safe. */
double strata_clayer_cost_bytes(const strata_budget *b, strata_values_format vf, int ndim,
                                const int64_t *shape, uint64_t numel);

/* For a POWERSGD layer: the Q factor (cols * rank floats, row-major cols x
 * rank, borrowed from c->values after P), to be passed as q_warm next round.
 * NULL for any other layer. */
const float *strata_clayer_powersgd_q(const strata_clayer *c);

/* Tensors at least this large use OpenMP threads in top-k selection. */
#define STRATA_TOPK_PARALLEL_MIN ((size_t)1 << 20)

/* Exact top-k by magnitude: writes to idx_out (k entries) the positions of
 * the k largest |a[i]| among the n floats at a (borrowed), ties broken
 * toward the lower index, in strictly ascending order. Linear time on average
 * (sampled threshold, then radix selection on the magnitude bits); never a
 * full sort. Uses omp_get_max_threads() threads when n >=
 * STRATA_TOPK_PARALLEL_MIN; the result does not depend on the thread count.
 * Errors: STRATA_EINVAL for NULL pointers, k == 0, k > n, n > UINT32_MAX or
 * a NaN or infinite value in a (idx_out is then unspecified); STRATA_ENOMEM. */
int strata_topk_select(const float *a, size_t n, size_t k, uint32_t *idx_out);

/* The RANDK positions for (seed, numel, count): count distinct indices in
 * [0, numel), strictly ascending, written to idx_out. Deterministic on every
 * platform; the payload carries only the seed. Errors: STRATA_EINVAL for
 * count > numel, numel > STRATA_CLAYER_MAX_NUMEL or a NULL idx_out with
 * count > 0; STRATA_ENOMEM (a numel-bit scratch bitmap). Thread-safe. */
int strata_randk_indices(uint64_t seed, uint64_t numel, uint64_t count, uint32_t *idx_out);

/* The squared L2 error ||a - topk(a)||^2 of keeping k = strata_comp_kept(d,
 * n) elements, for each of the nd densities (each in (0, 1]), written to
 * sq_errors[nd]. One radix sort of |a| and prefix sums of squares (in
 * double) give all of them. Errors: STRATA_EINVAL for NULL pointers, n == 0,
 * a density outside (0, 1] or a non-finite value in a; STRATA_ENOMEM
 * (scratch of 8 n bytes). Thread-safe. */
int strata_topk_error_table(const float *a, size_t n, const double *densities, size_t nd,
                            double *sq_errors);

#endif
