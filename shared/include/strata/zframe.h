/* zstd frames: the one module of Strata that calls zstd. Every compressed
 * body on the wire (payloads, model downloads) is exactly one zstd frame
 * that declares its content size; the decoder is total over untrusted bytes
 * and checks the declared size against the caller's limits before it
 * allocates anything.
 *
 * A strata_zctx holds reusable compression and decompression contexts. It
 * may be used by one thread at a time; every function also accepts NULL and
 * then uses a temporary context (simpler, slower for many small frames). */
#ifndef STRATA_ZFRAME_H
#define STRATA_ZFRAME_H

#include "strata/error.h"

#include <stddef.h>
#include <stdint.h>

/* Highest compression level accepted. */
#define STRATA_ZFRAME_MAX_LEVEL 19

typedef struct strata_zctx strata_zctx;

/* Creates contexts. Errors: STRATA_ENOMEM. */
int strata_zctx_new(strata_zctx **out);

/* Frees z. Accepts NULL. */
void strata_zctx_free(strata_zctx *z);

/* Compresses len bytes of in (borrowed) at level (1 to
 * STRATA_ZFRAME_MAX_LEVEL) into one frame with its content size, in a new
 * buffer *out (free()) of *out_len bytes. Errors: STRATA_EINVAL (bad level,
 * NULL argument), STRATA_ETOOBIG (input too large for zstd), STRATA_ENOMEM,
 * STRATA_EIO (zstd failed; diag has its message). Out-parameters are zeroed
 * on entry. */
int strata_zframe_compress(strata_zctx *z, const void *in, size_t len, int level, uint8_t **out,
                           size_t *out_len, strata_diag *diag);

/* Decodes in (borrowed, untrusted), which must be exactly one zstd frame
 * (no skippable frame, nothing after it) declaring a content size in
 * [min_len, max_len], into a new buffer *out (free()) of exactly that size.
 * Errors: STRATA_EPROTO (not a frame, truncated, corrupt, no declared size,
 * below min_len, a second frame or trailing bytes, a decoded size other
 * than the declared one), STRATA_ETOOBIG (declared size above max_len),
 * STRATA_ENOMEM; diag says which. Out-parameters are zeroed on entry. */
int strata_zframe_decompress(strata_zctx *z, const uint8_t *in, size_t len, size_t min_len,
                             size_t max_len, uint8_t **out, size_t *out_len, strata_diag *diag);

#endif
