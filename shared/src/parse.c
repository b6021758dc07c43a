#include "strata/parse.h"

#include "strata/error.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>

int strata_parse_long(const char *s, long min, long max, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno != 0 || end == s || *end != '\0' || v < min || v > max)
        return STRATA_EINVAL;
    *out = v;
    return STRATA_OK;
}

int strata_parse_double(const char *s, double min, double max, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno != 0 || end == s || *end != '\0' || !isfinite(v) || !(v >= min && v <= max))
        return STRATA_EINVAL;
    *out = v;
    return STRATA_OK;
}
