/* The coordinator's streaming aggregation and server optimisers.
 *
 * strata_agg computes the sample-weighted FedAvg mean of client updates as
 * they arrive: it holds one double-precision accumulator per model element
 * (and a float32 scratch of the same size), never the updates themselves, so
 * its memory does not depend on how many updates a round receives.
 *
 * strata_server_opt applies the aggregated delta (the weighted mean of the
 * clients' w_local - w_global) to the global model with one of the server
 * optimisers of Reddi et al., "Adaptive Federated Optimization" (ICLR 2021):
 * plain (server learning rate), FedAvgM, FedAdam and FedYogi.
 *
 * strata_agg_add_clipped bounds the influence of one update by clipping its
 * L2 norm before it is accumulated. The coordinate-wise robust statistics
 * (trimmed mean, median), which need every update of a round at once, live
 * in robust.h.
 *
 * Neither object is thread-safe: the coordinator serialises calls on one
 * object (for example under the round's lock). Distinct objects may be used
 * from distinct threads. */
#ifndef STRATA_SERVER_AGGREGATE_H
#define STRATA_SERVER_AGGREGATE_H

#include "strata/compress.h"
#include "strata/error.h"
#include "strata/tensor.h"

#include <stddef.h>
#include <stdint.h>

/* ---- Streaming weighted FedAvg ---- */

/* Largest weight (sample count) one update may carry. Together with the
 * float32 range of the values it keeps every accumulator finite. */
#define STRATA_AGG_MAX_WEIGHT 1e12

typedef struct strata_agg strata_agg;

/* Creates an empty aggregator for the model layout (borrowed; names and
 * shapes are copied, the data is not read). *out is zeroed on entry.
 * Memory: 12 bytes per model element (a double accumulator and a float32
 * scratch that makes strata_agg_add all-or-nothing), allocated here once.
 * Errors: STRATA_EINVAL (NULL argument, empty layout, a tensor above
 * STRATA_CLAYER_MAX_NUMEL), STRATA_ETOOBIG (size overflow), STRATA_ENOMEM. */
int strata_agg_new(const strata_tensor_list *layout, strata_agg **out);

/* Frees agg. Accepts NULL. */
void strata_agg_free(strata_agg *agg);

/* Adds one client update: n compressed layers (borrowed, possibly from an
 * untrusted payload) with weight `weight` (the client's sample count).
 * The update is checked completely before any accumulator changes, so a
 * rejected update leaves agg exactly as it was. It must have one layer per
 * tensor of the layout, layers[i].layer_index == i, layers[i].numel equal
 * to tensor i's element count, and every layer must be internally
 * consistent by the rules of strata_clayer_decode() (indices in range and
 * strictly ascending, finite values representable in the values format,
 * ...). weight must be finite and in (0, STRATA_AGG_MAX_WEIGHT].
 *
 * TOPK and RANDK layers are added sparsely in O(count) time (RANDK indices
 * are regenerated from the seed with strata_randk_indices, which uses a
 * transient numel-bit bitmap); all other compressors are decoded into the
 * preallocated scratch and added densely. The mean treats the coordinates
 * a sparse update did not send as zero, which is the standard FedAvg of
 * compressed deltas (the error feedback on the client keeps what was not
 * sent). Apart from that bitmap and the working memory of a PowerSGD
 * decode, this call allocates nothing.
 *
 * Errors: STRATA_EINVAL (NULL argument, bad weight), STRATA_EPROTO (the
 * update does not match the layout or a layer is inconsistent), STRATA_ENOMEM;
 * diag (may be NULL) names the layer and the problem. */
int strata_agg_add(strata_agg *agg, const strata_clayer *layers, size_t n, double weight,
                   strata_diag *diag);

/* Adds one client update as strata_agg_add does (same checks, same errors,
 * all-or-nothing), with update-norm clipping: after the update has been
 * checked, its L2 norm over all layers, norm = sqrt(sum of the squares of
 * the decoded delta's elements) in double precision, is computed, and when
 * max_norm > 0 and norm > max_norm the update is scaled by max_norm / norm
 * before it is accumulated (an update at or below the bound is added
 * unchanged). Clipping scales the delta, not the weight: the update still
 * counts with its full weight in the mean. max_norm == 0 disables clipping
 * (strata_agg_add is this call with max_norm 0); +infinity is accepted and
 * never clips. Sparse (TOPK, RANDK) layers contribute the squares of their
 * kept values, so they stay O(count). norm_out (may be NULL) is zeroed on
 * entry and receives the norm before clipping once the update is accepted;
 * the coordinator can log it or derive the next round's bound from it.
 * When neither clipping nor norm_out asks for the norm, it is not computed.
 * Errors: those of strata_agg_add, and STRATA_EINVAL for a NaN or negative
 * max_norm. */
int strata_agg_add_clipped(strata_agg *agg, const strata_clayer *layers, size_t n, double weight,
                           double max_norm, double *norm_out, strata_diag *diag);

/* Number of updates accepted since creation or the last reset. */
uint64_t strata_agg_count(const strata_agg *agg);

/* Sum of the weights of the accepted updates. */
double strata_agg_total_weight(const strata_agg *agg);

/* Writes the weighted mean update, sum_i w_i * delta_i / sum_i w_i computed
 * in double precision and rounded once to float32, into delta_out, which
 * must be an initialised list with exactly the layout given to
 * strata_agg_new (names, shapes, order; for example made with
 * strata_tensor_list_zeros_like). agg is not changed. Errors: STRATA_EINVAL
 * (NULL argument, layout mismatch; diag says which tensor), STRATA_ESTATE
 * (no update accepted yet); delta_out is unchanged on error. */
int strata_agg_mean(const strata_agg *agg, strata_tensor_list *delta_out, strata_diag *diag);

/* Forgets every update (zero accumulators, count and weight) for the next
 * round; keeps the memory. Accepts NULL. */
void strata_agg_reset(strata_agg *agg);

/* Bytes of heap memory agg owns (struct, layout copy, accumulators,
 * scratch). Constant from strata_agg_new to strata_agg_free: it does not grow
 * with the number of updates added. For the coordinator's memory report. */
size_t strata_agg_memory_bytes(const strata_agg *agg);

/* ---- Internal to server/core (shared with robust.c) ---- */

/* Checks compressed layer c against position i of a model layout whose
 * tensor there is called name and has numel elements, by the rules
 * strata_agg_add documents, and prepares it in slot (numel float-sized
 * cells, caller-owned): dense compressors are decoded into it; a RANDK
 * layer's regenerated indices (uint32) are written to its first count cells;
 * a TOPK layer only uses it as scratch for checking its values. Errors:
 * STRATA_EPROTO naming the layer, STRATA_ENOMEM. Thread-safe for distinct
 * slots. */
int strata__agg_layer_prepare(size_t i, const char *name, size_t numel, const strata_clayer *c,
                              void *slot, strata_diag *diag);

/* The squared L2 norm, in double, of a layer prepared by
 * strata__agg_layer_prepare into slot: O(count) for TOPK and RANDK (the
 * squares of the kept values), O(numel) otherwise. */
double strata__agg_layer_sqnorm(const strata_clayer *c, const void *slot, size_t numel);

/* Checks a clipping bound: STRATA_EINVAL (with diag) unless max_norm >= 0. */
int strata__agg_clip_check(double max_norm, strata_diag *diag);

/* The factor that clips an update of L2 norm `norm` to max_norm: max_norm /
 * norm when max_norm > 0 and norm > max_norm, else 1. */
double strata__agg_clip_scale(double norm, double max_norm);

/* ---- Server optimisers ---- */

typedef enum {
    STRATA_SERVER_OPT_PLAIN = 0,   /* w += lr * delta */
    STRATA_SERVER_OPT_FEDAVGM = 1, /* v = momentum * v + delta; w += lr * v */
    STRATA_SERVER_OPT_FEDADAM = 2, /* see strata_server_opt_step */
    STRATA_SERVER_OPT_FEDYOGI = 3
} strata_server_opt_type;

typedef struct strata_server_opt_config {
    strata_server_opt_type type;
    double lr;        /* server learning rate, > 0; default 1 (plain, FedAvgM), 0.05 */
    double momentum;  /* FedAvgM, [0, 1); default 0.5 */
    double beta1;     /* FedAdam/FedYogi, [0, 1); default 0 */
    double beta2;     /* FedAdam/FedYogi, [0, 1); default 0.99 */
    double tau;       /* FedAdam/FedYogi adaptivity, > 0; default 0.01 */
    double lr_final;  /* 0 (default): lr at every step; > 0: see strata_server_opt_lr */
    uint64_t horizon; /* steps over which lr falls to lr_final; >= 1 when lr_final > 0 */
} strata_server_opt_config;

/* Fills cfg with type and its default hyperparameters, listed above: the
 * ones that reached at least plain FedAvg's accuracy in ten rounds of the
 * mlp with four clients (docs/algorithm.md has the measurements; the
 * adaptive optimisers' published constants, lr 1, beta1 0.9, tau 1e-3,
 * diverge or lag there). */
void strata_server_opt_config_init(strata_server_opt_config *cfg, strata_server_opt_type type);

/* Parses an optimiser name ("plain", "fedavgm", "fedadam", "fedyogi") and
 * fills cfg as strata_server_opt_config_init does. Errors: STRATA_EINVAL
 * (NULL argument or unknown name, with diag); cfg is unchanged then. */
int strata_server_opt_parse(const char *name, strata_server_opt_config *cfg, strata_diag *diag);

/* Returns the optimiser's name ("fedadam"), or "?" for an unknown type. */
const char *strata_server_opt_name(strata_server_opt_type type);

/* Checks cfg: known type, finite lr > 0, momentum/beta1/beta2 in [0, 1),
 * finite tau > 0, finite lr_final >= 0 and, when lr_final > 0, horizon >= 1.
 * Returns STRATA_EINVAL with diag otherwise. */
int strata_server_opt_check(const strata_server_opt_config *cfg, strata_diag *diag);

typedef struct strata_server_opt strata_server_opt;

/* Creates an optimiser for the model layout (borrowed; names and shapes are
 * copied) with cfg (copied, checked by strata_server_opt_check). State:
 * FedAvgM keeps v = 0; FedAdam and FedYogi keep m = 0 and v = tau^2 (the
 * paper's initialisation v_{-1} >= tau^2), all float32, one tensor per
 * layout tensor. *out is zeroed on entry. Errors: STRATA_EINVAL (NULL
 * argument, bad cfg, a tensor name too long to be prefixed with "m." or
 * "v." in the state file), STRATA_ENOMEM. */
int strata_server_opt_new(const strata_tensor_list *layout, const strata_server_opt_config *cfg,
                          strata_server_opt **out, strata_diag *diag);

/* Frees opt. Accepts NULL. */
void strata_server_opt_free(strata_server_opt *opt);

/* Applies one server step to params with the aggregated delta (both must
 * have opt's layout; delta is borrowed). Element by element, in double
 * precision, with the state stored as float32 after each step:
 *   plain    w += lr * delta
 *   FedAvgM  v = momentum * v + delta;                 w += lr * v
 *   FedAdam  m = beta1 * m + (1 - beta1) * delta;
 *            v = beta2 * v + (1 - beta2) * delta^2;   w += lr * m / (sqrt(v) + tau)
 *   FedYogi  m as FedAdam;
 *            v = v - (1 - beta2) * delta^2 * sign(v - delta^2);
 *                                                      w += lr * m / (sqrt(v) + tau)
 * There is no bias correction (as in the paper); the w update uses the new
 * m and v after their rounding to float32. The whole delta is checked first:
 * on error nothing changes. Errors: STRATA_EINVAL (NULL argument, layout
 * mismatch, a NaN or infinite delta value; diag says which). */
int strata_server_opt_step(strata_server_opt *opt, strata_tensor_list *params,
                           const strata_tensor_list *delta, strata_diag *diag);

/* Makes dst's state (its moments and step count) a copy of src's, so that
 * dst's next step is bit-identical to the one src would make. Both must have
 * the same optimiser type and the same layout (names, shapes, order); their
 * hyperparameters are not copied. The coordinator steps such a copy and
 * keeps the original until the step is durable. No allocation. Errors:
 * STRATA_EINVAL (NULL argument, another type or layout; diag says which);
 * dst is unchanged then. */
int strata_server_opt_copy_state(strata_server_opt *dst, const strata_server_opt *src,
                                 strata_diag *diag);

/* The learning rate of opt's next step (the step with index
 * strata_server_opt_steps, from 0). With lr_final 0 it is lr at every step;
 * otherwise it falls from lr at step 0 to lr_final at step horizon - 1 along
 * a half cosine, lr_final + (lr - lr_final) (1 + cos(pi t / (horizon - 1))) / 2,
 * and stays at lr_final after that (a horizon of 1 is lr_final throughout).
 * Returns 0 for NULL. */
double strata_server_opt_lr(const strata_server_opt *opt);

/* Number of successful steps (restored by strata_server_opt_load). */
uint64_t strata_server_opt_steps(const strata_server_opt *opt);

/* The configuration opt runs with (borrowed). */
const strata_server_opt_config *strata_server_opt_get_config(const strata_server_opt *opt);

/* Saves the optimiser state to path as a safetensors file, atomically (see
 * strata_safetensors_write). Tensors: "m.<name>" (FedAdam/FedYogi) and
 * "v.<name>" (FedAvgM/FedAdam/FedYogi) in layout order, float32; plain has
 * none. Metadata: "strata.server_opt.version" ("1"),
 * "strata.server_opt.type" (the name), "strata.server_opt.steps" (decimal)
 * and the hyperparameters (informational). Errors: those of
 * strata_safetensors_write. */
int strata_server_opt_save(const strata_server_opt *opt, const char *path, strata_diag *diag);

/* Creates an optimiser from layout and cfg as strata_server_opt_new does and
 * restores the state and step count saved at path, so that the next step is
 * bit-identical to the one the saved optimiser would have made. cfg's
 * hyperparameters may differ from the saved ones (they apply from the next
 * step); its type must match. *out is zeroed on entry. Errors: those of
 * strata_server_opt_new and strata_safetensors_read; STRATA_EINVAL when the
 * file's optimiser type differs from cfg->type or its tensors do not match
 * the layout (count, name, shape, order; diag names the tensor);
 * STRATA_EPROTO for missing or malformed metadata, non-finite state or a
 * negative second moment. */
int strata_server_opt_load(const char *path, const strata_tensor_list *layout,
                           const strata_server_opt_config *cfg, strata_server_opt **out,
                           strata_diag *diag);

#endif
