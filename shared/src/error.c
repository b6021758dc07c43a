#include "strata/error.h"

#include <stdarg.h>
#include <stdio.h>

const char *strata_strerror(int err)
{
    switch (err) {
    case STRATA_OK:
        return "success";
    case STRATA_ENOMEM:
        return "out of memory";
    case STRATA_EINVAL:
        return "invalid argument";
    case STRATA_ETOOBIG:
        return "size limit exceeded";
    case STRATA_EPROTO:
        return "malformed data";
    case STRATA_EIO:
        return "input/output error";
    case STRATA_ESTATE:
        return "invalid state";
    default:
        return "unknown error";
    }
}

int strata_diag_set(strata_diag *diag, int err, const char *fmt, ...)
{
    if (diag == NULL)
        return err;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(diag->msg, sizeof(diag->msg), fmt, ap);
    va_end(ap);
    return err;
}

const char *strata_diag_msg(const strata_diag *diag, int err)
{
    if (diag == NULL || diag->msg[0] == '\0')
        return strata_strerror(err);
    return diag->msg;
}
