/* Strict parsing of numbers from command-line and configuration text. */
#ifndef STRATA_PARSE_H
#define STRATA_PARSE_H

/* Parses all of s as a base-10 integer in [min, max]. Returns STRATA_OK and
 * sets *out, or STRATA_EINVAL (leaving *out unchanged) for empty text,
 * trailing characters, overflow or a value out of range. */
int strata_parse_long(const char *s, long min, long max, long *out);

/* Parses all of s as a finite number in [min, max]; same contract. */
int strata_parse_double(const char *s, double min, double max, double *out);

#endif
