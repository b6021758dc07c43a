/* The engine modules' helpers for building results (result.c): JSON bodies
 * and the refusal of a request body. Not part of the engine's API. */
#ifndef STRATA_SERVER_RESULT_INTERNAL_H
#define STRATA_SERVER_RESULT_INTERNAL_H

#include "result.h"

#include "strata/error.h"

struct json_t;

/* Sets r to the refusal of a request body that a request.h parser refused
 * with rc (explained in d): SRV_E_TOO_LARGE for STRATA_ETOOBIG, else
 * SRV_E_BAD_REQUEST, with the parser's message. */
void srv__result_bad_body(srv_result *r, int rc, const strata_diag *d);

/* Sets r to outcome o with j (a jansson value, stolen; may be NULL after a
 * failed allocation, then r is SRV_E_INTERNAL) dumped compactly in key
 * order as the JSON body. */
void srv__result_json(srv_result *r, srv_outcome o, struct json_t *j);

#endif
