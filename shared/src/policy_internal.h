/* What policy.c (configuration, densities, calibration) and lgreco.c (the
 * error-constrained allocation) share: the policy object and the layer
 * rules. Not installed; internal to libstrata. */
#ifndef STRATA_POLICY_INTERNAL_H
#define STRATA_POLICY_INTERNAL_H

#include "strata/policy.h"

#define STRATA__POLICY_MAX_GROUPS (STRATA_POLICY_MAX_SPLITS + 1)
#define STRATA__LGRECO_MAX_VALUES 8 /* candidate value formats */
#define STRATA__LGRECO_MAX_EXTRA 16 /* candidate compressors besides top-k */

typedef enum {
    STRATA__POL_UNIFORM,
    STRATA__POL_LAYER,
    STRATA__POL_PHASE,
    STRATA__POL_LEGACY,
    STRATA__POL_LEGACY_REF,
    STRATA__POL_LGRECO
} strata__pol_type;
typedef enum { STRATA__CAL_ROUND, STRATA__CAL_RUN, STRATA__CAL_NONE } strata__cal_mode;

struct strata_policy {
    strata__pol_type type;
    strata_budget base;          /* compressor of the compressed layers; density unused */
    strata_values_format values; /* strata_policy_set_values */
    size_t dense_below;
    strata__cal_mode cal;
    int cal_bytes; /* calibrate payload bytes instead of kept elements */
    int absolute;  /* legacy-ref: weights are densities, d0 is ignored */
    size_t nsplits;
    size_t splits[STRATA_POLICY_MAX_SPLITS];
    size_t ngroups; /* nsplits + 1 */
    uint32_t nphases;
    double w[STRATA_POLICY_MAX_PHASES][STRATA__POLICY_MAX_GROUPS]; /* w[phase][group] */
    /* lgreco candidates: top-k densities x value formats, plus other
     * compressors */
    size_t ncand;
    double cand[STRATA_LGRECO_MAX_CAND];
    size_t ncvals;
    strata_values_format cvals[STRATA__LGRECO_MAX_VALUES];
    size_t nextra;
    strata_budget extra[STRATA__LGRECO_MAX_EXTRA];
    uint32_t lgreco_every;
    /* lgreco allocation from the last table (lg_ready), for these layers */
    int lg_ready;
    double lg_d0;
    size_t lg_nlayers;
    size_t *lg_numel;
    strata_budget *lg_budget;
    strata_lgreco_report lg_report;
};

/* 1 when a layer of n elements is sent uncompressed (below dense_below). */
int strata__policy_is_dense(const strata_policy *p, size_t n);

/* The budget of a layer sent uncompressed: strata_budget_whole of the
 * policy's values format (NONE in it where NONE takes it, else fp32). */
strata_budget strata__policy_dense_budget(const strata_policy *p);

/* The budget of a compressed layer at density d (d >= 1: the dense one). */
strata_budget strata__policy_layer_budget(const strata_policy *p, double d);

/* STRATA_ESTATE (with diag) unless the solved lgreco allocation is for
 * these layers and d0. */
int strata__policy_lgreco_applies(const strata_policy *p, const size_t *numel, size_t nlayers,
                                  double d0, strata_diag *diag);

#endif
