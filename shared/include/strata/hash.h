/* Hashes: SHA-256 (FIPS 180-4), streaming and one-shot. Used for the
 * integrity of stored payloads and to keep bearer tokens out of storage.
 * (The payload checksum, CRC32C, lives with the payload codec.) */
#ifndef STRATA_HASH_H
#define STRATA_HASH_H

#include <stddef.h>
#include <stdint.h>

/* Bytes of a SHA-256 digest. */
#define STRATA_SHA256_LEN 32

/* A SHA-256 computation in progress. Caller-owned (on the stack is fine);
 * the fields are private. One context per thread; distinct contexts are
 * independent. */
typedef struct strata_sha256_ctx {
    uint32_t h[8];
    uint8_t block[64];
    size_t used;
    uint64_t total;
} strata_sha256_ctx;

/* Starts a new digest in *c (any earlier content is discarded). */
void strata_sha256_init(strata_sha256_ctx *c);

/* Feeds n bytes of data (borrowed; may be NULL when n is 0) into *c. Any
 * split of a message into updates gives the same digest. */
void strata_sha256_update(strata_sha256_ctx *c, const void *data, size_t n);

/* Writes the digest of everything fed since init to out. *c is spent
 * afterwards: init it again before reuse. */
void strata_sha256_final(strata_sha256_ctx *c, uint8_t out[STRATA_SHA256_LEN]);

/* SHA-256 of len bytes of data (data may be NULL when len is 0) in one call. */
void strata_sha256(const void *data, size_t len, uint8_t out[STRATA_SHA256_LEN]);

#endif
