/* Typed results (see result.h): building them, and the JSON bodies the
 * engine's modules hand over (result_internal.h). */
#include "result_internal.h"

#include "strata/log.h"

#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void srv_result_cleanup(srv_result *r)
{
    free(r->body);
    memset(r, 0, sizeof(*r));
}

int srv_outcome_is_error(srv_outcome o)
{
    return o >= SRV_E_FIRST;
}

void srv_result_error(srv_result *r, srv_outcome o, const char *fmt, ...)
{
    free(r->body);
    r->body = NULL;
    r->len = 0;
    r->media = SRV_MEDIA_NONE;
    r->outcome = o;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->message, sizeof(r->message), fmt, ap);
    va_end(ap);
    for (char *c = r->message; *c != '\0'; c++)
        if (*c < 0x20 || *c > 0x7e)
            *c = '?';
}

void srv_result_internal(srv_result *r, const char *detail)
{
    strata_log_error("internal error: %s", detail);
    srv_result_error(r, SRV_E_INTERNAL, "internal error; the coordinator's log has the details");
}

void srv_result_unavailable(srv_result *r, const char *what, const char *detail)
{
    strata_log_error("%s not stored: %s", what, detail);
    srv_result_error(r, SRV_E_UNAVAILABLE, "the coordinator cannot store this now; retry later");
    r->retry_after = SRV_UNAVAILABLE_RETRY_S;
}

void srv_result_take(srv_result *r, srv_outcome o, srv_media m, uint8_t *body, size_t len)
{
    free(r->body);
    r->body = body;
    r->len = body ? len : 0;
    r->media = m;
    r->outcome = o;
    r->message[0] = '\0';
    if (body == NULL && m != SRV_MEDIA_NONE && (o == SRV_OK || o == SRV_CREATED))
        srv_result_error(r, SRV_E_INTERNAL, "out of memory");
}

void srv__result_json(srv_result *r, srv_outcome o, struct json_t *j)
{
    char *s = j ? json_dumps(j, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    json_decref(j);
    srv_result_take(r, o, SRV_MEDIA_JSON, (uint8_t *)s, s ? strlen(s) : 0);
}

void srv__result_bad_body(srv_result *r, int rc, const strata_diag *d)
{
    srv_result_error(r, rc == STRATA_ETOOBIG ? SRV_E_TOO_LARGE : SRV_E_BAD_REQUEST, "%s",
                     strata_diag_msg(d, rc));
}
