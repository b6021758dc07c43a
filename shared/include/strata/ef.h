/* Per-layer error feedback (docs/algorithm.md "Compressors and error feedback").
 *
 * A strata_ef holds one float32 residual e per tensor of a model layout.
 * Each round the client calls strata_ef_step() with its update delta: for
 * every layer it forms
 *     a = decay * e + delta        (decay = beta^missed, see below)
 * compresses a with that layer's budget, and keeps e_new = a - decode(C(a)).
 * For TOPK and RANDK, e_new is a with the kept positions replaced by the
 * rounding error of the kept value (exactly 0 for float32 values), so
 * decode(C(a)) + e_new == a bit for bit. For the other compressors e_new is
 * a - decode(C(a)) computed element by element in float32. a is computed as
 * (decay * e + delta) + 0.0f in float32 (the + 0 turns -0 into +0; with
 * decay 1 the product is skipped), which is the value these identities refer
 * to. With INT8 or TERNARY values, e_new keeps a - value at the kept
 * positions (computed in float32; for TOPK ternary this is exact, so the
 * identity above holds bit for bit, see strata_compress); those formats
 * apply to TOPK and RANDK layers, and the layers of other compressors then
 * carry float32 values.
 *
 * Staleness: if the last step was for round r0 and this one is for round r,
 * missed = r - r0 - 1 rounds were skipped; the residual is multiplied by
 * beta^missed, and dropped (treated as zero) when max_staleness > 0 and
 * missed > max_staleness. The first step has missed = 0.
 *
 * PowerSGD layers are warm-started from the Q factor of the layer's previous
 * PowerSGD step, kept inside the object (not saved by strata_ef_save).
 *
 * Memory: two float32 copies of the layout (the residuals and a scratch
 * buffer that makes a step all-or-nothing). A strata_ef is not thread-safe;
 * steps may use OpenMP threads and BLAS internally. */
#ifndef STRATA_EF_H
#define STRATA_EF_H

#include "strata/compress.h"
#include "strata/error.h"
#include "strata/opts.h"
#include "strata/tensor.h"

#include <stddef.h>
#include <stdint.h>

typedef struct strata_ef strata_ef;

/* The largest max_staleness the programs' options take. */
#define STRATA_EF_MAX_STALENESS_MAX 1000000000

/* The staleness settings as a program's options: --ef-beta B, in (0, 1],
 * and --ef-max-staleness N, in [0, STRATA_EF_MAX_STALENESS_MAX]. */
typedef struct strata_ef_opts {
    double beta;
    long max_staleness;
} strata_ef_opts;

/* The settings when neither option is given: keep the residual whole, never
 * drop it. */
#define STRATA_EF_OPTS_DEFAULT                                                                     \
    {                                                                                              \
        .beta = 1.0, .max_staleness = 0                                                            \
    }

/* The option rows of strata_ef_opts (offsets into it): strata-client parses
 * them, strata-sim checks the values it passes on to its clients with them,
 * so both take the same keys and ranges. */
#define STRATA_EF_NOPTS 2
extern const strata_opt strata_ef_opt_rows[STRATA_EF_NOPTS];

/* Creates error-feedback state with zero residuals shaped like layout
 * (borrowed; names and shapes are copied). beta (staleness decay) must be in
 * (0, 1]; 1 keeps stale residuals unchanged. max_staleness 0 never drops.
 * *out is zeroed on entry. Errors: STRATA_EINVAL (NULL argument, bad beta),
 * STRATA_ENOMEM. */
int strata_ef_new(const strata_tensor_list *layout, double beta, uint32_t max_staleness,
                  strata_ef **out);

/* Frees ef. Accepts NULL. */
void strata_ef_free(strata_ef *ef);

/* Sets the staleness settings of ef (see strata_ef_new) for its next steps,
 * e.g. a client's options over those saved with its residuals; *changed
 * (may be NULL) is 1 when they differ from ef's. Errors: STRATA_EINVAL (NULL
 * ef, beta outside (0, 1]; ef unchanged). */
int strata_ef_configure(strata_ef *ef, double beta, uint32_t max_staleness, int *changed);

/* One error-feedback round (see the file comment). delta (borrowed) must
 * have exactly the layout of the residuals; budgets (borrowed) holds one
 * budget per tensor (its values format says how the kept float values
 * travel); round must be above the round of the previous step; seed drives the random
 * compressors (each layer derives its own seed from it and the layer
 * position; RANDK layers carry that seed). On success *out_layers is a new
 * array of delta->count compressed layers, layer_index set to the tensor
 * position (free with strata_clayers_free(*out_layers, delta->count)), and
 * the residuals and round are updated. On error *out_layers is NULL and ef
 * is unchanged. Errors: STRATA_EINVAL (NULL argument, layout mismatch, bad
 * budget or values format, a NaN or infinite value in a), STRATA_ESTATE
 * (round not after the previous step's round), STRATA_ETOOBIG (a tensor
 * above STRATA_CLAYER_MAX_NUMEL), STRATA_ENOMEM. diag (may be NULL) names
 * the tensor at fault. */
int strata_ef_step(strata_ef *ef, const strata_tensor_list *delta, const strata_budget *budgets,
                   uint32_t round, uint64_t seed, strata_clayer **out_layers, strata_diag *diag);

/* The error table of the lgreco policy (docs/algorithm.md): for every
 * tensor l and each of the ncand candidate budgets (borrowed, each passing
 * strata_budget_check), the squared L2 error ||a_l - decode(C_c(a_l))||^2
 * (in double) that compressing with candidate c would leave, where a_l is
 * the error-compensated update strata_ef_step(ef, delta, ..., round, seed)
 * would compress (residual with its staleness decay, plus delta). Written
 * row-major to err[l * ncand + c] (delta->count * ncand entries). Nothing
 * of ef's residuals, round or warm starts changes. Errors: STRATA_EINVAL
 * (NULL argument, layout mismatch, bad candidate, NaN or infinity in a),
 * STRATA_ESTATE (round not after the previous step's), STRATA_ENOMEM. */
int strata_ef_error_table(strata_ef *ef, const strata_tensor_list *delta, uint32_t round,
                          uint64_t seed, const strata_budget *cand, size_t ncand, double *err,
                          strata_diag *diag);

/* The residuals (borrowed; valid until the next step, load or free). */
const strata_tensor_list *strata_ef_residuals(const strata_ef *ef);

/* Writes the L2 norm of each residual (computed in double) to norms, which
 * must hold n == number of tensors entries. Errors: STRATA_EINVAL. */
int strata_ef_residual_norms(const strata_ef *ef, double *norms, size_t n);

/* The round of the last successful step in *round (zeroed on entry).
 * Returns STRATA_ESTATE when no step has happened yet. */
int strata_ef_last_round(const strata_ef *ef, uint32_t *round);

/* Saves the residuals to path as a safetensors file (atomically, see
 * strata_safetensors_write) whose metadata holds "strata.ef.version" ("1"),
 * "strata.ef.last_round" (a decimal round, or "none"), "strata.ef.beta" and
 * "strata.ef.max_staleness". Errors: those of strata_safetensors_write. */
int strata_ef_save(const strata_ef *ef, const char *path, strata_diag *diag);

/* Loads a file written by strata_ef_save into a new strata_ef (*out, zeroed
 * on entry); layout (borrowed) is the model the residuals must belong to.
 * Residual values round-trip exactly; PowerSGD warm-start factors are not
 * saved (the next PowerSGD step starts from random Q). Errors:
 * STRATA_EINVAL when the file's tensors do not match layout (count, name,
 * shape or order; diag says which), STRATA_EPROTO for missing or malformed
 * metadata or non-finite residuals, and those of strata_safetensors_read. */
int strata_ef_load(const char *path, const strata_tensor_list *layout, strata_ef **out,
                   strata_diag *diag);

#endif
