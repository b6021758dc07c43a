/* Per-layer budgets (budgets.c and lgreco.c): the budget policy that maps
 * (layer, round) to each layer's compressor and parameter, the candidates a
 * round's task asks clients to measure error tables for, and the
 * coordinator's side of the lgreco loop (lgreco.c: the check of an
 * upload's error table, the solve when such a round closes, the lgreco part
 * of a round summary, and putting the last allocation back after a
 * restart).
 *
 * budgets.c and lgreco.c own the policy in their structure (srv_budgets).
 * Only start-up and the round thread touch it (opening a round asks for its
 * budgets, closing one solves its tables), so it needs no lock; the checks
 * of an upload's table are pure functions. It calls no other engine
 * module.
 *
 * May call: the store (a closing round's updates, the round summaries),
 * libstrata (policy, compress, payload, summary, log) and jansson. */
#ifndef STRATA_SERVER_BUDGETS_H
#define STRATA_SERVER_BUDGETS_H

#include "store.h"

#include "strata/compress.h"
#include "strata/payload.h"
#include "strata/summary.h"

#include <stddef.h>
#include <stdint.h>

typedef struct srv_budgets srv_budgets;

/* What the policy is given at start-up (copied; numel borrowed). */
typedef struct srv_budgets_config {
    const char *policy;                 /* --policy; "none": every layer dense */
    strata_values_format values_format; /* --values */
    double density;                     /* --density: the target */
    long rounds;                        /* the run's rounds */
    size_t nlayers;
    const size_t *numel; /* per layer */
} srv_budgets_config;

/* Parses the policy. Errors: the policy parser's; STRATA_EINVAL for a
 * values format that --policy none cannot send; STRATA_ENOMEM. */
int srv__budgets_new(const srv_budgets_config *c, srv_budgets **out, strata_diag *d);

/* Frees B. Accepts NULL. */
void srv__budgets_free(srv_budgets *B);

/* The budgets of round r into b (nlayers entries), and its error-table
 * candidates into a new array *cands (*ncands entries; NULL and 0 when the
 * round asks for none: not lgreco, r is not a multiple of lgreco_every, or
 * r is the last round). Errors: the policy's, STRATA_ENOMEM. */
int srv__budgets_of_round(srv_budgets *B, uint32_t r, strata_budget *b, strata_budget **cands,
                          size_t *ncands, strata_diag *d);

#endif
