/* strata-server's responses (see http_internal.h): the one table from an
 * engine outcome to an HTTP status and error code string, the JSON error
 * envelope, and queueing a response with its headers and counters. */
#include "http_internal.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The one table from outcome to HTTP status and error code string. */
static const struct {
    unsigned status;
    const char *code; /* NULL for successes */
} OUTCOMES[SRV_OUTCOME_COUNT] = {
    [SRV_OK] = {200, NULL},
    [SRV_CREATED] = {201, NULL},
    [SRV_NO_CONTENT] = {204, NULL},
    [SRV_NOT_MODIFIED] = {304, NULL},
    [SRV_E_BAD_REQUEST] = {400, "bad_request"},
    [SRV_E_BAD_PAYLOAD] = {400, "bad_payload"},
    [SRV_E_TOO_LARGE] = {413, "too_large"},
    [SRV_E_UNAUTHORIZED] = {401, "unauthorized"},
    [SRV_E_BAD_SECRET] = {401, "bad_secret"},
    [SRV_E_FORBIDDEN] = {403, "forbidden"},
    [SRV_E_NOT_FOUND] = {404, "not_found"},
    [SRV_E_METHOD_NOT_ALLOWED] = {405, "method_not_allowed"},
    [SRV_E_UNSUPPORTED_MEDIA_TYPE] = {415, "unsupported_media_type"},
    [SRV_E_INVALID_UPDATE] = {422, "invalid_update"},
    [SRV_E_NOT_SELECTED] = {403, "not_selected"},
    [SRV_E_ROUND_CLOSED] = {409, "round_closed"},
    [SRV_E_ROUND_NOT_OPEN] = {409, "round_not_open"},
    [SRV_E_RATE_LIMITED] = {429, "rate_limited"},
    [SRV_E_TOO_MANY_CLIENTS] = {429, "too_many_clients"},
    [SRV_E_NO_DATA_SHARE] = {409, "no_data_share"},
    [SRV_E_FINISHED] = {410, "finished"},
    [SRV_E_ROUND_CLOSING] = {409, "round_closing"},
    [SRV_E_REQUEST_TIMEOUT] = {408, "request_timeout"},
    [SRV_E_CONFLICT] = {409, "conflict"},
    [SRV_E_UNAVAILABLE] = {503, "unavailable"},
    [SRV_E_INTERNAL] = {500, "internal"},
};

static const char *media_type(srv_media m)
{
    switch (m) {
    case SRV_MEDIA_JSON:
        return "application/json";
    case SRV_MEDIA_BINARY:
        return "application/octet-stream";
    case SRV_MEDIA_TEXT:
        return "text/plain";
    case SRV_MEDIA_EXPOSITION:
        return "text/plain; version=0.0.4; charset=utf-8";
    case SRV_MEDIA_NONE:
        break;
    }
    return NULL;
}

/* Replaces an error result's body with the JSON error envelope
 * {"error":{"code":...,"message":...}}. */
static void error_envelope(srv_result *r)
{
    json_t *j = json_pack("{s:{s:s,s:s}}", "error", "code", OUTCOMES[r->outcome].code, "message",
                          r->message);
    char *s = j ? json_dumps(j, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    json_decref(j);
    if (s == NULL) {
        r->outcome = SRV_E_INTERNAL;
        s = strdup("{\"error\":{\"code\":\"internal\",\"message\":\"out of memory\"}}");
    }
    free(r->body);
    r->body = (uint8_t *)s;
    r->len = s ? strlen(s) : 0;
    r->media = SRV_MEDIA_JSON;
}

/* Queues r (an error in the JSON envelope) with Allow: allow when not NULL,
 * counts a 4xx by its code and frees r's contents. */
enum MHD_Result srv__http_send(srv_engine *e, struct MHD_Connection *c, srv_result *r,
                               const char *allow, unsigned how)
{
    if ((unsigned)r->outcome >= SRV_OUTCOME_COUNT)
        srv_result_error(r, SRV_E_INTERNAL, "internal error");
    if (srv_outcome_is_error(r->outcome))
        error_envelope(r);
    unsigned status = OUTCOMES[r->outcome].status;
    struct MHD_Response *resp;
    size_t len = r->len;
    if (r->body != NULL && status != 204 && status != 304) {
        resp = MHD_create_response_from_buffer(r->len, r->body, MHD_RESPMEM_MUST_FREE);
        if (resp != NULL)
            r->body = NULL; /* owned by the response now */
    } else {
        len = 0;
        resp = MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
    }
    if (resp == NULL) {
        srv_result_cleanup(r);
        return MHD_NO;
    }
    const char *ctype = media_type(r->media);
    if (ctype != NULL && status != 204)
        MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, ctype);
    if (r->etag[0] != '\0')
        MHD_add_response_header(resp, MHD_HTTP_HEADER_ETAG, r->etag);
    if (r->zstd)
        MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_ENCODING, "zstd");
    if (r->retry_after > 0) {
        char ra[16];
        snprintf(ra, sizeof(ra), "%d", r->retry_after);
        MHD_add_response_header(resp, MHD_HTTP_HEADER_RETRY_AFTER, ra);
    }
    if (allow != NULL)
        MHD_add_response_header(resp, MHD_HTTP_HEADER_ALLOW, allow);
    if (status == 401)
        MHD_add_response_header(resp, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer");
    if (how & SEND_CLOSE)
        MHD_add_response_header(resp, MHD_HTTP_HEADER_CONNECTION, "close");
    if (how & SEND_HEAD)
        len = 0;
    if (status >= 400 && status < 500)
        srv_engine_count_refused(e, r->outcome);
    enum MHD_Result ok = MHD_queue_response(c, status, resp);
    MHD_destroy_response(resp);
    srv_engine_count_bytes(e, 0, len);
    if (r->downlink && status == 200 && len > 0)
        srv_engine_count_downlink(e, len);
    srv_result_cleanup(r);
    return ok;
}
