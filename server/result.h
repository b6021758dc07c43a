/* Typed results of the coordinator's engine: what a call decided (its
 * outcome), an optional body and the few facts a transport needs (ETag,
 * zstd encoding, Retry-After). The engine fills a srv_result and never
 * names a transport status; the HTTP layer (http.c) alone maps an outcome
 * to an HTTP status and an error code string and wraps an error's message
 * in the JSON error envelope of schemas/api.md.
 *
 * May call: libstrata (the logger) and, in result.c only, jansson. */
#ifndef STRATA_SERVER_RESULT_H
#define STRATA_SERVER_RESULT_H

#include <stddef.h>
#include <stdint.h>

/* What a request came to. The errors are the error codes of schemas/api.md,
 * one each. */
typedef enum srv_outcome {
    SRV_OK = 0,       /* done; the body (if any) is the answer */
    SRV_CREATED,      /* a resource was made (registration) */
    SRV_NO_CONTENT,   /* nothing now (no task for this client) */
    SRV_NOT_MODIFIED, /* the caller's copy is current (ETag matched) */
    SRV_E_BAD_REQUEST,
    SRV_E_BAD_PAYLOAD,
    SRV_E_TOO_LARGE,
    SRV_E_UNAUTHORIZED,
    SRV_E_BAD_SECRET,
    SRV_E_FORBIDDEN,
    SRV_E_NOT_FOUND,
    SRV_E_METHOD_NOT_ALLOWED,
    SRV_E_UNSUPPORTED_MEDIA_TYPE,
    SRV_E_INVALID_UPDATE,
    SRV_E_NOT_SELECTED,
    SRV_E_ROUND_CLOSED,
    SRV_E_ROUND_NOT_OPEN,
    SRV_E_RATE_LIMITED,
    SRV_E_TOO_MANY_CLIENTS,
    SRV_E_NO_DATA_SHARE, /* every share of --data-shares is taken */
    SRV_E_FINISHED,
    SRV_E_ROUND_CLOSING,
    SRV_E_REQUEST_TIMEOUT,
    SRV_E_CONFLICT,    /* the request contradicts what is stored (another update) */
    SRV_E_UNAVAILABLE, /* a passing condition (storage full or failing): retry later */
    SRV_E_INTERNAL,    /* the coordinator failed; details only in its log */
    SRV_OUTCOME_COUNT
} srv_outcome;

/* The first error outcome: o >= SRV_E_FIRST is an error. */
#define SRV_E_FIRST SRV_E_BAD_REQUEST

/* What the body is. */
typedef enum srv_media {
    SRV_MEDIA_NONE = 0,
    SRV_MEDIA_JSON,       /* a JSON document */
    SRV_MEDIA_BINARY,     /* opaque bytes (a safetensors model) */
    SRV_MEDIA_TEXT,       /* plain text */
    SRV_MEDIA_EXPOSITION, /* Prometheus text exposition format 0.0.4 */
} srv_media;

/* Longest error message kept, with its NUL. */
#define SRV_MESSAGE_MAX 600

/* A result. All zeros is "SRV_OK, no body". The body is owned by the
 * result (malloc'ed) until srv_result_cleanup or until a caller takes it
 * (sets body to NULL). */
typedef struct srv_result {
    srv_outcome outcome;
    srv_media media;
    uint8_t *body; /* NULL for none; an error carries none, only message */
    size_t len;
    char message[SRV_MESSAGE_MAX]; /* errors: printable ASCII, safe to send */
    char etag[48];                 /* "" for none */
    int zstd;                      /* 1: the body is one zstd frame of the content */
    int retry_after;               /* seconds; 0: none */
    int downlink;                  /* 1: a model or delta body, counted as downlink when sent */
} srv_result;

/* Frees the body and zeroes r. */
void srv_result_cleanup(srv_result *r);

/* Sets r to the error o (>= SRV_E_FIRST) with a printf message. Bytes of
 * the message outside printable ASCII (a message may quote what a client
 * sent) are replaced by '?'. Any body is freed. */
void srv_result_error(srv_result *r, srv_outcome o, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Sets r to SRV_E_INTERNAL: detail (paths, SQLite's words) goes to the log,
 * the message only says where to look. */
void srv_result_internal(srv_result *r, const char *detail);

/* Seconds a client is told to wait (Retry-After) before retrying a request
 * whose change the store could not make durable. */
#define SRV_UNAVAILABLE_RETRY_S 5

/* Sets r to SRV_E_UNAVAILABLE with Retry-After SRV_UNAVAILABLE_RETRY_S: the
 * store could not make a change durable (storage full or failing), nothing
 * was changed, and the same request may succeed later. what (the request)
 * and detail (paths, SQLite's words) go to the log only. */
void srv_result_unavailable(srv_result *r, const char *what, const char *detail);

/* Sets r to outcome o with body (taken; may be NULL) of len bytes and media
 * m. A NULL body with m != SRV_MEDIA_NONE and o SRV_OK or SRV_CREATED (an
 * allocation that failed upstream) becomes SRV_E_INTERNAL "out of memory". */
void srv_result_take(srv_result *r, srv_outcome o, srv_media m, uint8_t *body, size_t len);

/* 1 when o is an error outcome. */
int srv_outcome_is_error(srv_outcome o);

#endif
