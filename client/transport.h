/* The edge client's HTTP transport: the only module that includes
 * <curl/curl.h>. One strata_http per thread (a reused easy handle). */
#ifndef STRATA_CLIENT_TRANSPORT_H
#define STRATA_CLIENT_TRANSPORT_H

#include "strata/error.h"

#include <signal.h>
#include <stddef.h>
#include <stdint.h>

typedef struct strata_http strata_http;

typedef struct strata_http_response {
    long status;   /* HTTP status, 0 when no response arrived */
    uint8_t *body; /* malloc'ed, NUL-terminated (not counted in len) */
    size_t len;
    char etag[128];
    char content_encoding[32];
    double retry_after; /* seconds from Retry-After, -1 when absent */
} strata_http_response;

/* Creates a transport for base_url ("http://127.0.0.1:8080", no trailing
 * slash needed). ca_cert (may be NULL) names a PEM file of the CA to trust
 * for https; peer and host verification are always on. stop (borrowed, may
 * be NULL) aborts transfers and retries when it becomes non-zero. */
int strata_http_new(const char *base_url, const char *ca_cert, volatile sig_atomic_t *stop,
                    strata_http **out, strata_diag *diag);
void strata_http_free(strata_http *h);

/* Sets the bearer token sent with every request (copied; NULL clears). */
int strata_http_set_token(strata_http *h, const char *token);

/* One request. path starts with '/'. body may be NULL (len 0); content_type
 * and if_none_match may be NULL. accept_zstd asks for a zstd body, which is
 * then decoded here as strictly as payloads (exactly one frame declaring
 * its size, at most max_body bytes). A curl option the library refuses is
 * an error (STRATA_EINVAL or STRATA_ENOMEM, diag names it). Responses larger than
 * max_body are refused. Returns STRATA_OK when any HTTP response arrived
 * (check resp->status), STRATA_EIO for a transport failure (connection
 * refused, timeout, reset), STRATA_ETOOBIG for an oversize body,
 * STRATA_ESTATE when stopped. resp is zeroed on entry; release it with
 * strata_http_response_cleanup(). */
int strata_http_request(strata_http *h, const char *method, const char *path,
                        const char *content_type, const uint8_t *body, size_t len,
                        const char *if_none_match, int accept_zstd, size_t max_body,
                        strata_http_response *resp, strata_diag *diag);

/* The same with retries of transient failures (transport errors, 408, 429,
 * 5xx): capped exponential backoff with full jitter (base 0.5 s, cap
 * max_delay seconds), honouring Retry-After, for at most max_attempts tries
 * (0: until stopped). Returns the last outcome. */
int strata_http_request_retry(strata_http *h, const char *method, const char *path,
                              const char *content_type, const uint8_t *body, size_t len,
                              const char *if_none_match, int accept_zstd, size_t max_body,
                              int max_attempts, double max_delay, strata_http_response *resp,
                              strata_diag *diag);

void strata_http_response_cleanup(strata_http_response *r);

/* Sleeps for seconds, waking early when stop becomes non-zero. Returns
 * STRATA_OK, or STRATA_ESTATE when stopped. */
int strata_http_sleep(strata_http *h, double seconds);

#endif
