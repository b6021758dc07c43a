/* Strata's single error type and diagnostics.
 *
 * Every function that can fail returns an int: STRATA_OK (0) on success or a
 * negative strata_err. Functions that parse untrusted input also take an
 * optional strata_diag that receives a human-readable explanation. */
#ifndef STRATA_ERROR_H
#define STRATA_ERROR_H

#include <stddef.h>

typedef enum {
    STRATA_OK = 0,
    STRATA_ENOMEM = -1,  /* allocation failed */
    STRATA_EINVAL = -2,  /* invalid argument or configuration */
    STRATA_ETOOBIG = -3, /* a size limit was exceeded */
    STRATA_EPROTO = -4,  /* malformed input data */
    STRATA_EIO = -5,     /* an operating-system I/O call failed */
    STRATA_ESTATE = -6   /* the object is in the wrong state for the call */
} strata_err;

/* A fixed-size message buffer that explains the last error of a call. */
typedef struct strata_diag {
    char msg[512];
} strata_diag;

/* Returns a static description of an error code; never NULL. */
const char *strata_strerror(int err);

/* Formats a message into diag (printf-style). diag may be NULL, in which case
 * nothing happens. Returns err unchanged so callers can write
 * `return strata_diag_set(d, STRATA_EPROTO, "...")`. */
int strata_diag_set(strata_diag *diag, int err, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Returns diag's message, or strata_strerror(err) when diag is NULL or empty. */
const char *strata_diag_msg(const strata_diag *diag, int err);

#endif
