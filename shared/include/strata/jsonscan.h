/* Checks on untrusted JSON text that run before (or beside) a JSON parser:
 * the nesting depth by a scan of the bytes, and quoting of input text for
 * messages. Used by the wire codecs of libstrata and by the coordinator's
 * request parsers, so both refuse the same inputs the same way. Pure
 * functions; thread-safe. */
#ifndef STRATA_JSONSCAN_H
#define STRATA_JSONSCAN_H

#include <stddef.h>

/* Returns 1, and in *at the offset of the opening bracket, when the nesting
 * depth of the objects and arrays in the n bytes at p goes above max; else
 * 0. Brackets inside strings do not count; a backslash inside a string
 * hides the byte after it (enough for every JSON escape, \uXXXX included,
 * since hex digits are neither quotes nor backslashes). Malformed input
 * gets some depth, never a crash: the parser refuses it afterwards. */
int strata_json_too_deep(const void *p, size_t n, size_t max, size_t *at);

/* Copies up to cap bytes of s[0, n) into dst (cap + 4 bytes) with every
 * byte that is not printable ASCII replaced by '?', and "..." appended when
 * s was longer, so that input text (a key, a parser's excerpt) can go into
 * a message that is logged or sent back as JSON. */
void strata_json_quote(const char *s, size_t n, size_t cap, char *dst);

#endif
