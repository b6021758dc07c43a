/* Robust aggregation rules for the coordinator (docs/algorithm.md "Robust
 * aggregation"): coordinate-wise trimmed mean and coordinate-wise median
 * over all the updates of a round, optionally after clipping each update's
 * L2 norm.
 *
 * Plain FedAvg is streamed by strata_agg (aggregate.h), which never holds
 * more than one update. The rules here need every update of the round at
 * once; the coordinator keeps the accepted updates on disk anyway, decodes
 * each stored payload when the round closes and lends the layer arrays to
 * strata_robust_aggregate.
 *
 * Robust statistics are unweighted: every update counts once, whatever
 * sample count its client reported. A weight would let one client with a
 * large (self-reported) sample count move the median or survive the
 * trimming, which is what these rules exist to prevent.
 *
 * Every update is checked by the rules of strata_agg_add (the same code), so
 * a malformed update is an error naming the update and the layer, never a
 * partial result. The functions keep no state; distinct calls may run on
 * distinct threads (their OpenMP loops then share the process's threads). */
#ifndef STRATA_SERVER_ROBUST_H
#define STRATA_SERVER_ROBUST_H

#include "strata/compress.h"
#include "strata/error.h"
#include "strata/tensor.h"

#include <stddef.h>

typedef enum {
    STRATA_ROBUST_FEDAVG = 0,       /* "fedavg": weighted streaming mean (strata_agg) */
    STRATA_ROBUST_TRIMMED_MEAN = 1, /* "trimmed-mean" */
    STRATA_ROBUST_MEDIAN = 2        /* "median" */
} strata_robust_method;

/* One update, borrowed: n_layers compressed layers, possibly from an
 * untrusted payload. A valid update has one layer per tensor of the model,
 * layers[i].layer_index == i. */
typedef struct strata_robust_update {
    const strata_clayer *layers;
    size_t n_layers;
} strata_robust_update;

/* Returns the method's name ("trimmed-mean"), or "?" for an unknown one. */
const char *strata_robust_name(strata_robust_method method);

/* Parses an aggregation rule name: "fedavg", "trimmed-mean" or "median".
 * *out is written only on success. Errors: STRATA_EINVAL (NULL argument or
 * unknown name, with diag listing the known names). */
int strata_robust_parse(const char *name, strata_robust_method *out, strata_diag *diag);

/* Checks a configuration before any round runs: a known method,
 * trim_fraction in [0, 0.5) (read by the trimmed mean only, but checked for
 * every method) and clip_norm >= 0 (0 disables clipping). Errors:
 * STRATA_EINVAL with diag. */
int strata_robust_check(strata_robust_method method, double trim_fraction, double clip_norm,
                        strata_diag *diag);

/* Checks each of the n_updates updates (borrowed) against layout (borrowed;
 * names, shapes and order of the model's tensors) and writes its L2 norm
 * over all layers, in double precision, to norms_out[u] (n_updates entries,
 * zeroed on entry when non-NULL). This is the norm strata_agg_add_clipped
 * and the clipping of strata_robust_aggregate use, so the coordinator can
 * derive a clipping bound from a round's norms (for example their median).
 * Time: O(count) per TOPK/RANDK layer, a decode per other layer. Memory: one
 * float scratch of the largest layer's size. Errors: STRATA_EINVAL (NULL
 * argument, empty or oversized layout), STRATA_EPROTO (an update does not
 * match the layout or a layer is inconsistent; diag names the update and
 * the layer), STRATA_ENOMEM. */
int strata_robust_norms(const strata_tensor_list *layout, const strata_robust_update *updates,
                        size_t n_updates, double *norms_out, strata_diag *diag);

/* Aggregates the n_updates updates (borrowed) coordinate by coordinate and
 * writes the result, rounded once to float32, into delta_out, which must be
 * an initialised list with exactly layout's names, shapes and order (for
 * example made with strata_tensor_list_zeros_like).
 *
 * Each update's dense delta is its decoded layers, with the coordinates a
 * sparse (TOPK, RANDK) layer did not send counted as 0. When clip_norm > 0,
 * every update whose L2 norm (see strata_robust_norms) exceeds clip_norm is
 * first scaled by clip_norm / norm. Then, for every coordinate, over the
 * n_updates values v_1..v_n (unweighted):
 *   STRATA_ROBUST_TRIMMED_MEAN  with k = floor(trim_fraction * n), drop the
 *                               k lowest and the k highest values and
 *                               average the n - 2k others (trim_fraction 0
 *                               is the unweighted mean);
 *   STRATA_ROBUST_MEDIAN        the middle value; for an even n, the mean
 *                               of the two middle values (trim_fraction is
 *                               ignored).
 * Values are combined in double precision. The result does not depend on
 * the order of the updates (up to the rounding of the trimmed mean's sum).
 *
 * Work: layer by layer. Each update's layer is decoded into one row of a
 * scratch matrix (n_updates x the largest layer's element count, float32);
 * then, per coordinate, the n values are gathered and the order statistics
 * found by quickselect (expected O(n), O(n log n) at worst) in OpenMP
 * threads, which take the coordinates in tiles of 32 so that the matrix is
 * read row by row. With clipping, the norms are computed first
 * (strata_robust_norms), so dense layers are decoded twice. Memory: 4 * n_updates * (largest layer)
 * bytes for the matrix, 4 * (largest layer) bytes for RANDK indices, 4 bytes
 * per model element for the result (delta_out is written only once
 * everything succeeded), and 256 * n_updates bytes per thread; plus the
 * working memory of decoding one layer. Time: O(n_updates * model elements)
 * expected.
 *
 * Errors, with diag (may be NULL), delta_out unchanged:
 *   STRATA_EINVAL  NULL argument, empty or oversized layout, delta_out not
 *                  laid out like layout, method STRATA_ROBUST_FEDAVG (use
 *                  strata_agg) or unknown, trim_fraction not in [0, 0.5),
 *                  clip_norm NaN or negative, n_updates == 0 (trimming
 *                  k = floor(trim_fraction * n) with trim_fraction < 0.5
 *                  always keeps n - 2k >= 1 of n >= 1 updates);
 *   STRATA_EPROTO  an update does not match the layout or a layer is
 *                  inconsistent (diag names the update and the layer);
 *   STRATA_ETOOBIG the scratch matrix would not fit size_t;
 *   STRATA_ENOMEM. */
int strata_robust_aggregate(const strata_tensor_list *layout, const strata_robust_update *updates,
                            size_t n_updates, strata_robust_method method, double trim_fraction,
                            double clip_norm, strata_tensor_list *delta_out, strata_diag *diag);

#endif
