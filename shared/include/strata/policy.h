/* Budget policies: how many elements each layer may keep in each round.
 *
 * The coordinator owns a policy, asks it for per-layer budgets every round
 * and sends them to the clients, which compress accordingly (see
 * docs/algorithm.md "Budget policies"). A layer is one parameter tensor.
 *
 * Densities. A layer of n elements compressed at density d keeps
 *     kept(n, d) = n                        if d >= 1 (sent uncompressed)
 *                = max(1, floor(d * n))     otherwise (n > 0)
 * elements: strata_comp_kept() in strata/compress.h, the one implementation
 * of that rule, which the compressors use too.
 * Layers with fewer than `dense_below` elements always get density 1 and
 * count toward the volume. The target d0 is a mean density for the whole
 * model: the uniform policy keeps sum_l kept(n_l, d0) elements per round
 * (dense layers included), and the calibrated policies spend the same.
 *
 * Policies: "uniform", "legacy-layer", "legacy-phase", "legacy" (layer x
 * phase), "legacy-ref" (the published LEGACY setting: layers under 10,000
 * elements keep 1% and larger ones 0.1%, the first half of the run keeps
 * 1% everywhere; uncalibrated, d0 ignored) and "lgreco" (error-constrained
 * allocation from client-reported error tables). A legacy policy's
 * densities are min(1, alpha * W) with weight W[phase][group] and one scale
 * alpha chosen by equal-volume calibration ("round", "run"; the volume in
 * kept elements or, with "calibration_unit": "bytes", in estimated payload
 * bytes) or alpha = d0 ("none"). Every policy compresses with one
 * compressor ("compressor", topk by default; the legacy policies and lgreco
 * need topk or randk, whose density they set).
 *
 * Thread-safety: a parsed policy is read-only for every function taking a
 * const pointer, so concurrent calls on one policy are safe; only
 * strata_policy_set_values(), strata_policy_set_lgreco_table(),
 * strata_policy_restore_lgreco() and strata_policy_free() modify it and
 * must not run concurrently with anything else on the same policy. */
#ifndef STRATA_POLICY_H
#define STRATA_POLICY_H

#include "strata/compress.h"
#include "strata/error.h"

#include <stddef.h>
#include <stdint.h>

/* Limits on a policy configuration. */
#define STRATA_POLICY_MAX_SPLITS 32 /* thresholds, so at most 33 groups */
#define STRATA_POLICY_MAX_PHASES 64
#define STRATA_POLICY_MAX_JSON (1u << 20) /* bytes of JSON text or file */
#define STRATA_LGRECO_MAX_CAND 64         /* configured densities (d0 may add one) */
#define STRATA_LGRECO_MAX_TABLE 255       /* candidates of an error table, all kinds */
/* Units of the discretised error axis of the lgreco dynamic programme: the
 * error budget is split into this many units and every layer's error is
 * rounded up to whole units, so a solution never exceeds the budget and at
 * most nlayers units (nlayers / 10000 of the budget) are lost to rounding. */
#define STRATA_LGRECO_RESOLUTION 10000

typedef struct strata_policy strata_policy;

/* Creates a policy from spec, which is one of
 *   - a policy name with all defaults: "uniform", "legacy-layer",
 *     "legacy-phase", "legacy", "legacy-ref", "lgreco";
 *   - a compressor specification (strata_budget_parse without a density:
 *     "fp16", "qsgd:4", "sign", "powersgd:2", "randk"): the uniform policy
 *     with that compressor;
 *   - JSON text (first non-blank character '{'), e.g.
 *     {"type": "legacy-layer", "splits": [10000], "layer_weights": [2, 1]};
 *   - "@path" naming a file that holds such JSON (at most
 *     STRATA_POLICY_MAX_JSON bytes).
 * JSON keys: "type" (required), "dense_below", "compressor" (a compressor
 * specification without density), "splits", "layer_weights", "phases",
 * "phase_weights", "weights" (phases x groups, "legacy" only),
 * "calibration" ("round", "run", "none"), "calibration_unit" ("elements",
 * "bytes"), "candidates", "candidate_values", "candidate_compressors" and
 * "lgreco_every" (lgreco only); docs/algorithm.md lists the defaults and
 * which key applies to which type.
 * On success *out owns a new policy (free with strata_policy_free). Errors:
 * STRATA_EINVAL for an unknown name, malformed JSON, an unknown key, a key
 * that does not apply to the type, a wrong type or length, non-ascending
 * splits or candidates, non-positive weights; the diag message starts with
 * the offending key ("layer_weights: expected 4 numbers (one per group of
 * splits), got 3"). STRATA_EIO when "@path" cannot be read, STRATA_ETOOBIG
 * when the text is too large, STRATA_ENOMEM. *out is NULL on failure. */
int strata_policy_parse(const char *spec, strata_policy **out, strata_diag *diag);

/* Frees a policy. Accepts NULL. */
void strata_policy_free(strata_policy *p);

/* Returns the policy type ("uniform", "legacy-layer", ...); static string. */
const char *strata_policy_name(const strata_policy *p);

/* Returns the effective configuration, defaults filled in, as compact JSON
 * that strata_policy_parse() accepts back (an lgreco table is not included).
 * The string is malloc'ed and owned by the caller (free()); NULL when out of
 * memory. */
char *strata_policy_json(const strata_policy *p);

/* Number of phases P of the policy (1 for policies without phases). */
uint32_t strata_policy_phases(const strata_policy *p);

/* Phase of round `round` (0-based) in a run of total_rounds rounds:
 * floor(round * P / total_rounds). A round at or past the end counts as the
 * last phase; total_rounds == 0 gives phase 0. */
uint32_t strata_policy_phase(const strata_policy *p, uint32_t round, uint32_t total_rounds);

/* Rounds between lgreco re-solves ("lgreco_every"); 0 for other policies. */
uint32_t strata_policy_lgreco_every(const strata_policy *p);

/* Sets the values format of the kept float values of the compressed layers
 * (and of the layers sent whole where NONE takes it: strata_budget_whole), e.g. from
 * --values; fp32 until set. Errors: STRATA_EINVAL (p unchanged) when the
 * policy's compressor does not take that format (strata_budget_check). */
int strata_policy_set_values(strata_policy *p, strata_values_format vf, strata_diag *diag);

/* The lgreco candidates the clients must report errors for when the target
 * is d0, in a fixed order: for each configured density ("candidates", with
 * d0 inserted, ascending) and each candidate values format
 * ("candidate_values", with the policy's own inserted) a TOPK budget; then
 * each extra compressor ("candidate_compressors"); then the budget of a
 * layer sent whole (strata_policy_budgets), unless already present.
 * Writes them to out (room for STRATA_LGRECO_MAX_TABLE budgets) and returns
 * their number; returns 0 (and writes nothing) for a policy that is not
 * lgreco or an invalid d0. */
size_t strata_policy_lgreco_candidates(const strata_policy *p, double d0, strata_budget *out);

/* What the last lgreco solve decided (see strata_policy_set_lgreco_table):
 * solved is 0 before any table; the error budget is the uniform
 * allocation's total error; errors are sums of squared errors over layers,
 * bytes the estimated payload bytes (strata_budget_bytes) of one update. */
struct strata_lgreco_report {
    int solved;
    int fell_back; /* the programme found nothing cheaper: uniform stands */
    double error_budget, chosen_error;
    double bytes, uniform_bytes;
};
typedef struct strata_lgreco_report strata_lgreco_report;

/* The report of the last solve (all zero before one, or for another
 * policy). */
strata_lgreco_report strata_policy_lgreco_report(const strata_policy *p);

/* Computes the density of every layer for round `round` (0-based) of a run
 * of total_rounds rounds, for layers with the given element counts, at
 * target mean density d0 (0 < d0 <= 1). density[l] is 1 for a layer sent
 * uncompressed. numel and density are borrowed arrays of nlayers entries.
 * Errors: STRATA_EINVAL for d0 outside (0, 1], total_rounds == 0 or
 * round >= total_rounds; STRATA_ESTATE for an lgreco policy whose table was
 * solved for other layers or another d0. density is zeroed on entry. */
int strata_policy_densities(const strata_policy *p, const size_t *numel, size_t nlayers, double d0,
                            uint32_t round, uint32_t total_rounds, double *density,
                            strata_diag *diag);

/* Same as strata_policy_densities(), expressed as per-layer budgets: the
 * policy's compressor with the density (TOPK, RANDK) or its parameter, and
 * the policy's values format; a layer sent uncompressed gets NONE with
 * density 1 (strata_budget_whole of the policy's values format); an lgreco policy
 * with a solved table gets its chosen budget per layer. out (nlayers
 * entries, borrowed) is zeroed on entry. */
int strata_policy_budgets(const strata_policy *p, const size_t *numel, size_t nlayers, double d0,
                          uint32_t round, uint32_t total_rounds, strata_budget *out,
                          strata_diag *diag);

/* Total elements kept by nlayers layers at the given densities (each in
 * (0, 1]; 1 means sent whole), by strata_comp_kept(). */
size_t strata_policy_kept(const size_t *numel, const double *density, size_t nlayers);

/* Feeds an lgreco policy the error table of the current model and re-solves
 * its allocation; the coordinator calls it every strata_policy_lgreco_every()
 * rounds with the clients' averaged tables. err is row-major nlayers x ncand
 * where the columns are strata_policy_lgreco_candidates(p, d0) and
 * err[l * ncand + c] = ||a_l - decode(C_c(a_l))||^2 for the layer's
 * error-compensated update a_l (strata_ef_error_table on a client). The
 * error budget is the uniform allocation's error (each layer's
 * strata_policy_budgets budget before any table: the policy's compressor at
 * d0, or dense); the chosen allocation is the one with the fewest estimated
 * payload bytes (strata_budget_bytes) whose total error stays within it, and
 * never costs more than uniform (uniform itself is the fallback). Until a
 * table is set, an lgreco policy behaves like uniform; afterwards
 * strata_policy_densities() must be called with the same layers and d0.
 * Errors: STRATA_EINVAL for a policy that is not lgreco, a bad d0, or a
 * negative or non-finite error (the previous allocation is kept);
 * STRATA_ENOMEM. */
int strata_policy_set_lgreco_table(strata_policy *p, const double *err, const size_t *numel,
                                   size_t nlayers, double d0, strata_diag *diag);

/* Puts back an allocation an lgreco policy chose before (e.g. read from the
 * coordinator's round summaries after a restart): alloc holds one budget per
 * layer (each passing strata_budget_check), rep the report of that solve.
 * Errors: STRATA_EINVAL for a policy that is not lgreco, a bad d0 or a bad
 * budget (the previous allocation is kept); STRATA_ENOMEM. */
int strata_policy_restore_lgreco(strata_policy *p, const strata_budget *alloc, const size_t *numel,
                                 size_t nlayers, double d0, const strata_lgreco_report *rep,
                                 strata_diag *diag);

/* Chooses one candidate per layer (choice[l] indexes the ncand columns)
 * minimising the total cost sum_l cost[l][choice[l]] subject to
 * sum_l err[l][choice[l]] <= budget, by dynamic programming over an error
 * axis of STRATA_LGRECO_RESOLUTION units (errors rounded up, so the budget
 * is never exceeded; the optimum is exact up to that rounding: any choice
 * with error at most budget * (1 - nlayers / STRATA_LGRECO_RESOLUTION) is
 * within reach). err and cost are row-major nlayers x ncand, finite and
 * >= 0; ncand <= STRATA_LGRECO_MAX_TABLE. Among equally cheap solutions the
 * choice is deterministic but unspecified. Memory: nlayers * (RESOLUTION +
 * 1) bytes. Errors: STRATA_EINVAL for bad arguments or when no choice fits
 * the discretised budget (even the lowest-error candidates exceed it);
 * STRATA_ENOMEM. choice is zeroed on entry. Thread-safe. */
int strata_lgreco_solve(const double *err, const double *cost, size_t nlayers, size_t ncand,
                        double budget, size_t *choice, strata_diag *diag);
#endif
