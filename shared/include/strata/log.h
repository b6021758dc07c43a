/* The executables' one logger: one line per message on standard error,
 * with a UTC timestamp, the level and the program's name, as text
 *
 *   2026-12-02T19:06:16.123Z info strata-server: round 3 closed
 *
 * or, with STRATA_LOG_JSON (`--log-format json`), as one JSON object a line:
 *
 *   {"ts":"2026-12-02T19:06:16.123Z","level":"info","prog":"strata-server","msg":"round 3 closed"}
 *
 * The logger is the process's one piece of global state, set once by
 * strata_log_setup before threads start; strata_log is thread-safe (each
 * line is one write(2), so lines of concurrent threads never interleave).
 * Messages longer than STRATA_LOG_LINE_MAX bytes are cut. Control bytes in
 * a message are written as '?' in text and escaped in JSON, so a message
 * that quotes client input cannot forge log lines. Library code (libstrata)
 * does not log: it returns errors; executables log them. */
#ifndef STRATA_LOG_H
#define STRATA_LOG_H

#include "strata/error.h"

#define STRATA_LOG_LINE_MAX 2048

typedef enum {
    STRATA_LOG_DEBUG = 0,
    STRATA_LOG_INFO = 1,
    STRATA_LOG_WARN = 2,
    STRATA_LOG_ERROR = 3
} strata_log_level;

typedef enum { STRATA_LOG_TEXT = 0, STRATA_LOG_JSON = 1 } strata_log_format;

/* Sets the program name (borrowed; a static string), the least level that
 * is written and the format. Before the first call the logger writes text
 * from level info on with the program name "strata". */
void strata_log_setup(const char *prog, strata_log_level min, strata_log_format format);

/* Parses "text" or "json". Errors: STRATA_EINVAL (diag names the value). */
int strata_log_parse_format(const char *s, strata_log_format *out, strata_diag *diag);

/* Parses "debug", "info", "warn" or "error". Errors: STRATA_EINVAL. */
int strata_log_parse_level(const char *s, strata_log_level *out, strata_diag *diag);

/* 1 when messages of this level are written. */
int strata_log_enabled(strata_log_level level);

/* Writes one message (printf-style, without a trailing newline). */
void strata_log(strata_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define strata_log_debug(...) strata_log(STRATA_LOG_DEBUG, __VA_ARGS__)
#define strata_log_info(...) strata_log(STRATA_LOG_INFO, __VA_ARGS__)
#define strata_log_warn(...) strata_log(STRATA_LOG_WARN, __VA_ARGS__)
#define strata_log_error(...) strata_log(STRATA_LOG_ERROR, __VA_ARGS__)

#endif
