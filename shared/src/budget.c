/* Compressor specifications: the one text form of a budget on every
 * interface (strata/compress.h, strata_budget_parse). */
#include "strata/compress.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SPEC_MAX 64

/* Parses the text in [s, s + len) as a density in (0, 1]. */
static int parse_density(const char *s, double *out)
{
    char *end = NULL;
    errno = 0;
    double d = strtod(s, &end);
    if (end == s || *end != '\0' || errno != 0 || !(d > 0.0 && d <= 1.0))
        return STRATA_EINVAL;
    *out = d;
    return STRATA_OK;
}

static int parse_u32(const char *s, uint32_t lo, uint32_t hi, uint32_t *out)
{
    char *end = NULL;
    if (*s < '0' || *s > '9')
        return STRATA_EINVAL;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (*end != '\0' || errno != 0 || v < lo || v > hi)
        return STRATA_EINVAL;
    *out = (uint32_t)v;
    return STRATA_OK;
}

int strata_budget_parse(const char *spec, int need_density, strata_budget *out, strata_diag *diag)
{
    if (out != NULL)
        memset(out, 0, sizeof(*out));
    if (spec == NULL || out == NULL)
        return strata_diag_set(diag, STRATA_EINVAL, "compressor: NULL argument");
    char buf[SPEC_MAX];
    size_t len = strlen(spec);
    if (len == 0 || len >= sizeof(buf))
        return strata_diag_set(diag, STRATA_EINVAL,
                               "compressor '%.*s': expected 1 to %d characters", SPEC_MAX, spec,
                               SPEC_MAX - 1);
    memcpy(buf, spec, len + 1);
    char *part[4] = {buf, NULL, NULL, NULL};
    size_t np = 1;
    for (char *c = buf; *c != '\0'; c++)
        if (*c == ':') {
            if (np == 4)
                goto bad;
            *c = '\0';
            part[np++] = c + 1;
        }
    strata_budget b = {.comp = STRATA_COMP_NONE, .density = 1.0, .values = STRATA_VALUES_FP32};
    if (strata_comp_from_name(part[0], &b.comp) < 0)
        goto bad;
    size_t next = 1;
    switch (b.comp) {
    case STRATA_COMP_TOPK:
    case STRATA_COMP_RANDK:
        if (np > next && parse_density(part[next], &b.density) == STRATA_OK)
            next++;
        else if (need_density)
            return strata_diag_set(diag, STRATA_EINVAL,
                                   "compressor '%s': expected %s:DENSITY[:VALUES] with a density "
                                   "in (0, 1]",
                                   spec, part[0]);
        break;
    case STRATA_COMP_QSGD:
        if (np <= next || parse_u32(part[next], 1, 127, &b.levels) < 0)
            return strata_diag_set(diag, STRATA_EINVAL,
                                   "compressor '%s': expected qsgd:LEVELS with levels in [1, 127]",
                                   spec);
        next++;
        break;
    case STRATA_COMP_POWERSGD:
        if (np <= next || parse_u32(part[next], 1, 1u << 20, &b.rank) < 0)
            return strata_diag_set(diag, STRATA_EINVAL,
                                   "compressor '%s': expected powersgd:RANK with a rank in [1, "
                                   "1048576]",
                                   spec);
        next++;
        break;
    default:
        break;
    }
    if (np > next && strata_values_format_parse(part[next], &b.values) == STRATA_OK)
        next++;
    if (np != next)
        goto bad;
    strata_diag inner = {{0}};
    if (strata_budget_check(&b, &inner) < 0)
        return strata_diag_set(diag, STRATA_EINVAL, "compressor '%s': %s", spec, inner.msg);
    *out = b;
    return STRATA_OK;
bad:
    return strata_diag_set(diag, STRATA_EINVAL,
                           "compressor '%s': expected none, fp16, bf16, sign, qsgd:LEVELS, "
                           "powersgd:RANK, topk[:DENSITY] or randk[:DENSITY], each optionally "
                           "followed by :VALUES where the compressor takes a values format",
                           spec);
}

/* The shortest of %.6g and %.17g that reads back as d. */
static void density_text(double d, char *out, size_t size)
{
    snprintf(out, size, "%.6g", d);
    if (strtod(out, NULL) != d)
        snprintf(out, size, "%.17g", d);
}

char *strata_budget_format(const strata_budget *b, int with_density, char *buf, size_t size)
{
    if (buf == NULL || size == 0)
        return buf;
    const char *name = strata_comp_name(b->comp), *vf = strata_values_format_name(b->values);
    const char *sep = b->values != STRATA_VALUES_FP32 ? ":" : "";
    if (b->values == STRATA_VALUES_FP32)
        vf = "";
    char d[32];
    switch (b->comp) {
    case STRATA_COMP_TOPK:
    case STRATA_COMP_RANDK:
        density_text(b->density, d, sizeof(d));
        if (with_density)
            snprintf(buf, size, "%s:%s%s%s", name, d, sep, vf);
        else
            snprintf(buf, size, "%s%s%s", name, sep, vf);
        break;
    case STRATA_COMP_QSGD:
        snprintf(buf, size, "%s:%u", name, b->levels);
        break;
    case STRATA_COMP_POWERSGD:
        snprintf(buf, size, "%s:%u%s%s", name, b->rank, sep, vf);
        break;
    default:
        snprintf(buf, size, "%s%s%s", name, sep, vf);
        break;
    }
    return buf;
}

double strata_budget_bytes(const strata_budget *b, uint64_t numel)
{
    /* PowerSGD's cost depends on the matrix view, which a policy does not
     * know: a square view is assumed. Everything else is the payload
     * codec's own estimate for a vector of numel elements. */
    if (b->comp == STRATA_COMP_POWERSGD) {
        double n = (double)numel, vb = b->values == STRATA_VALUES_FP32 ? 4.0 : 2.0;
        return 60.0 + fmin(n, 2.0 * sqrt(n) * (double)b->rank) * vb;
    }
    const int64_t shape[1] = {(int64_t)numel};
    double c = strata_clayer_cost_bytes(b, b->values, 1, shape, numel);
    return c >= 0.0 ? c : 0.0;
}
