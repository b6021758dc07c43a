/* The executables' logger (see strata/log.h). */
#include "strata/log.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static const char *g_prog = "strata";
static strata_log_level g_min = STRATA_LOG_INFO;
static strata_log_format g_format = STRATA_LOG_TEXT;

static const char *const LEVEL_NAMES[] = {"debug", "info", "warn", "error"};

void strata_log_setup(const char *prog, strata_log_level min, strata_log_format format)
{
    g_prog = prog != NULL ? prog : "strata";
    g_min = min;
    g_format = format;
}

int strata_log_parse_format(const char *s, strata_log_format *out, strata_diag *diag)
{
    *out = STRATA_LOG_TEXT;
    if (s != NULL && strcmp(s, "text") == 0)
        return STRATA_OK;
    if (s != NULL && strcmp(s, "json") == 0) {
        *out = STRATA_LOG_JSON;
        return STRATA_OK;
    }
    return strata_diag_set(diag, STRATA_EINVAL, "log format \"%.40s\": expected text or json",
                           s != NULL ? s : "");
}

int strata_log_parse_level(const char *s, strata_log_level *out, strata_diag *diag)
{
    *out = STRATA_LOG_INFO;
    for (int i = 0; s != NULL && i < 4; i++)
        if (strcmp(s, LEVEL_NAMES[i]) == 0) {
            *out = (strata_log_level)i;
            return STRATA_OK;
        }
    return strata_diag_set(diag, STRATA_EINVAL,
                           "log level \"%.40s\": expected debug, info, warn or error",
                           s != NULL ? s : "");
}

int strata_log_enabled(strata_log_level level)
{
    return level >= g_min;
}

/* A bounded line under construction; appends past the end are dropped. */
typedef struct line {
    char b[STRATA_LOG_LINE_MAX + 64];
    size_t n;
} line;

/* Appends n bytes, or nothing when they do not all fit (so an escape
 * sequence is never cut), keeping room for a closing '"}' and the '\n'. */
static void put(line *l, const char *s, size_t n)
{
    if (n > sizeof l->b - 4 - l->n)
        return;
    memcpy(l->b + l->n, s, n);
    l->n += n;
}

static void puts_(line *l, const char *s)
{
    put(l, s, strlen(s));
}

/* Appends msg, cleaned of control bytes (text) or escaped (JSON). */
static void put_msg(line *l, const char *msg, int json)
{
    for (const unsigned char *p = (const unsigned char *)msg; *p != '\0'; p++) {
        char esc[8];
        if (json && (*p == '"' || *p == '\\')) {
            esc[0] = '\\';
            esc[1] = (char)*p;
            put(l, esc, 2);
        } else if (*p < 0x20 || *p == 0x7f || (json && *p >= 0x80)) {
            /* JSON: bytes >= 0x80 as \u00XX, so any input gives valid JSON. */
            if (json) {
                snprintf(esc, sizeof esc, "\\u%04x", *p);
                put(l, esc, 6);
            } else {
                put(l, "?", 1);
            }
        } else {
            put(l, (const char *)p, 1);
        }
    }
}

void strata_log(strata_log_level level, const char *fmt, ...)
{
    if (level < g_min)
        return;
    if ((int)level < 0 || (int)level > 3)
        level = STRATA_LOG_ERROR;
    int saved = errno;
    char msg[STRATA_LOG_LINE_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);

    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    char stamp[96];
    snprintf(stamp, sizeof stamp, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ", tm.tm_year + 1900,
             tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
             (long)(ts.tv_nsec / 1000000) % 1000);

    line l;
    l.n = 0;
    if (g_format == STRATA_LOG_JSON) {
        puts_(&l, "{\"ts\":\"");
        puts_(&l, stamp);
        puts_(&l, "\",\"level\":\"");
        puts_(&l, LEVEL_NAMES[level]);
        puts_(&l, "\",\"prog\":\"");
        put_msg(&l, g_prog, 1);
        puts_(&l, "\",\"msg\":\"");
        put_msg(&l, msg, 1);
        memcpy(l.b + l.n, "\"}", 2); /* room kept by put */
        l.n += 2;
    } else {
        puts_(&l, stamp);
        puts_(&l, " ");
        puts_(&l, LEVEL_NAMES[level]);
        puts_(&l, " ");
        put_msg(&l, g_prog, 0);
        puts_(&l, ": ");
        put_msg(&l, msg, 0);
    }
    l.b[l.n++] = '\n';
    const char *p = l.b;
    size_t left = l.n;
    while (left > 0) {
        ssize_t w = write(STDERR_FILENO, p, left);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            break;
        p += w;
        left -= (size_t)w;
    }
    errno = saved;
}
