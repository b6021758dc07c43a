/* The policy's structure, shared by budgets.c and lgreco.c alone (see
 * budgets.h). */
#ifndef STRATA_SERVER_BUDGETS_INTERNAL_H
#define STRATA_SERVER_BUDGETS_INTERNAL_H

#include "budgets.h"

#include "strata/policy.h"

struct srv_budgets {
    srv_budgets_config c;
    strata_policy *policy; /* NULL for --policy none */
};

#endif
