/* The budget policy of the coordinator (see budgets.h): parsing it and the
 * budgets and error-table candidates of each round. budgets.c and lgreco.c
 * alone touch struct srv_budgets (budgets_internal.h). */
#include "budgets_internal.h"

#include <stdlib.h>
#include <string.h>

int srv__budgets_new(const srv_budgets_config *c, srv_budgets **out, strata_diag *d)
{
    *out = NULL;
    srv_budgets *B = calloc(1, sizeof(*B));
    if (B == NULL)
        return STRATA_ENOMEM;
    B->c = *c;
    int rc = 0;
    if (strcmp(c->policy, "none") != 0 && (rc = strata_policy_parse(c->policy, &B->policy, d)) < 0)
        goto fail;
    if (B->policy != NULL && (rc = strata_policy_set_values(B->policy, c->values_format, d)) < 0)
        goto fail;
    if (B->policy == NULL && (unsigned)c->values_format > STRATA_VALUES_BF16) {
        rc = strata_diag_set(d, STRATA_EINVAL,
                             "values %s: --policy none sends every layer dense (fp32, fp16 or "
                             "bf16)",
                             strata_values_format_name(c->values_format));
        goto fail;
    }
    *out = B;
    return 0;
fail:
    srv__budgets_free(B);
    return rc;
}

void srv__budgets_free(srv_budgets *B)
{
    if (B == NULL)
        return;
    strata_policy_free(B->policy);
    free(B);
}

/* The error-table candidates of round r (see srv__budgets_of_round). */
static int candidates(const srv_budgets *B, uint32_t r, strata_budget **out, size_t *n)
{
    *out = NULL;
    *n = 0;
    uint32_t every = B->policy != NULL ? strata_policy_lgreco_every(B->policy) : 0;
    if (every == 0 || r % every != 0 || r + 1 >= (uint32_t)B->c.rounds)
        return 0; /* the last round's table would serve no round */
    strata_budget *c = malloc(STRATA_LGRECO_MAX_TABLE * sizeof(*c));
    if (c == NULL)
        return STRATA_ENOMEM;
    *n = strata_policy_lgreco_candidates(B->policy, B->c.density, c);
    if (*n == 0) {
        free(c);
        return 0;
    }
    *out = c;
    return 0;
}

int srv__budgets_of_round(srv_budgets *B, uint32_t r, strata_budget *b, strata_budget **cands,
                          size_t *ncands, strata_diag *d)
{
    *cands = NULL;
    *ncands = 0;
    int rc = 0;
    if (B->policy == NULL) {
        for (size_t i = 0; i < B->c.nlayers; i++)
            b[i] = (strata_budget){
                .comp = STRATA_COMP_NONE, .density = 1.0, .values = B->c.values_format};
    } else if ((rc = strata_policy_budgets(B->policy, B->c.numel, B->c.nlayers, B->c.density, r,
                                           (uint32_t)B->c.rounds, b, d)) < 0) {
        return rc;
    }
    return candidates(B, r, cands, ncands);
}
