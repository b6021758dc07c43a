/* A capped growable byte buffer: every buffer carries the largest size it
 * may reach, and an append past it fails with STRATA_ETOOBIG and leaves the
 * buffer as it was. The bytes are always followed by a NUL (not counted in
 * len), so a buffer of text can be used as a C string. The struct is
 * caller-owned (strata_buf_init / strata_buf_cleanup); not thread-safe. */
#ifndef STRATA_BUF_H
#define STRATA_BUF_H

#include "strata/error.h"

#include <stddef.h>
#include <stdint.h>

typedef struct strata_buf {
    uint8_t *data; /* NULL until the first append; then NUL-terminated */
    size_t len;    /* bytes in use */
    size_t cap;    /* bytes allocated (at least len + 1 once allocated) */
    size_t max;    /* largest len allowed */
} strata_buf;

/* Makes b an empty buffer that may grow to max bytes. Allocates nothing. */
void strata_buf_init(strata_buf *b, size_t max);

/* Makes room for extra more bytes. Errors: STRATA_ETOOBIG when len + extra
 * exceeds max, STRATA_ENOMEM; b is unchanged on error. */
int strata_buf_reserve(strata_buf *b, size_t extra);

/* Counts n more bytes as used after the caller wrote them at data + len,
 * into room made by an earlier strata_buf_reserve (n must fit in it), and
 * keeps the terminating NUL. For reading straight into the buffer. */
void strata_buf_commit(strata_buf *b, size_t n);

/* Appends n bytes of p (borrowed; may be NULL when n is 0). Errors as
 * strata_buf_reserve; b is unchanged on error. */
int strata_buf_append(strata_buf *b, const void *p, size_t n);

/* Appends printf-formatted text. Errors as strata_buf_reserve (and
 * STRATA_EINVAL for a bad format); b is unchanged on error. */
int strata_buf_appendf(strata_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Hands the bytes to the caller (free() them; NUL-terminated; never NULL
 * for an allocated buffer, NULL when nothing was ever appended) with their
 * length in *len (may be NULL), and leaves b empty with the same max. */
uint8_t *strata_buf_take(strata_buf *b, size_t *len);

/* Grows a typed array: returns arr (or its reallocation) with room for at
 * least need elements of elem bytes, doubling the capacity *cap from 16,
 * and updates *cap. Returns NULL, leaving arr and *cap as they were (arr is
 * not freed), when the size overflows or memory runs out. For arrays of
 * structs; byte buffers use strata_buf. */
void *strata_array_grow(void *arr, size_t *cap, size_t need, size_t elem);

/* Empties b, keeping its allocation. */
void strata_buf_reset(strata_buf *b);

/* Frees the bytes and empties b. Accepts NULL. */
void strata_buf_cleanup(strata_buf *b);

#endif
