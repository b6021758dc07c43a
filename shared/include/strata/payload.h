/* The payload codec: one client update (header, compressed layers, metadata)
 * as the bytes a client uploads.
 *
 * The wire format is specified byte by byte in schemas/payload.md. In short:
 * a body made of a 44-byte header ("STRP", format version 2, round, flags,
 * model version, client id, sample count, layer count), one block per layer
 * (fixed 60-byte block header, then the compressor's data: TOPK positions
 * as Rice-coded gaps, float values as exponent bit planes plus packed
 * sign-and-mantissa fields (float32, fp16 or bf16), quantised kept values
 * as int8 levels (sign and Rice-coded magnitude) or ternary sign bits, QSGD
 * levels as int8, SIGN bits packed), a length-prefixed metadata JSON object
 * and a CRC32C of everything before it; the whole body travels as exactly
 * one zstd frame that declares its content size. Integers are little-endian.
 *
 * The encoding is canonical: a body that decodes successfully is the only
 * body that encodes that payload (fields a compressor does not use are zero,
 * Rice parameters are the shortest, padding bits are zero).
 *
 * Decoding treats its input as untrusted and is total: every length, count,
 * index and float is checked, nothing is allocated before the size that
 * governs it has been checked against the input and the limits, and every
 * failure returns an error code with a diagnostic that says what was wrong
 * and where ("layer 3 (topk): index 1200 out of range for 1000 elements").
 *
 * Arrays of decoded layers follow the conventions of strata/compress.h:
 * indices, qlevels and signbits come from malloc, values from aligned_alloc
 * (64-byte aligned, like strata_alloc_floats), so strata_clayer_cleanup and
 * free() both release them. No function here keeps global state; distinct payloads may be
 * encoded and decoded from distinct threads at once. */
#ifndef STRATA_PAYLOAD_H
#define STRATA_PAYLOAD_H

#include "strata/compress.h"
#include "strata/error.h"
#include "strata/zframe.h"

#include <stddef.h>
#include <stdint.h>

/* Format version written and accepted by this implementation. */
#define STRATA_PAYLOAD_VERSION 2

/* Default limits, used for every field of strata_payload_limits left at 0. */
#define STRATA_PAYLOAD_DEFAULT_MAX_DECODED_BYTES ((uint64_t)1 << 30) /* 1 GiB body */
#define STRATA_PAYLOAD_DEFAULT_MAX_LAYERS 65536u
#define STRATA_PAYLOAD_DEFAULT_MAX_LAYER_NUMEL STRATA_CLAYER_MAX_NUMEL
#define STRATA_PAYLOAD_DEFAULT_MAX_METADATA_BYTES ((size_t)1 << 20) /* 1 MiB */
#define STRATA_PAYLOAD_DEFAULT_MAX_TOTAL_NUMEL ((uint64_t)1 << 28)  /* dense elements */

/* One update. Every pointer is owned by the struct; strata_payload_free
 * releases them.
 *
 * layers holds num_layers compressed layers in strictly ascending
 * layer_index order (a payload may skip layers). metadata_json is NULL or a
 * NUL-terminated JSON object (conventionally compact, with the client's
 * train loss, per-layer residual norms and an optional lgreco error table;
 * see schemas/payload.md); the codec carries its bytes verbatim. flags are
 * carried verbatim; the codec defines no bits. */
typedef struct strata_payload {
    uint32_t round;
    uint64_t model_version;
    uint64_t client_id;
    uint64_t sample_count;
    uint32_t flags;
    size_t num_layers;
    strata_clayer *layers; /* owned */
    char *metadata_json;   /* owned, NUL-terminated compact JSON object or NULL */
} strata_payload;

/* Limits applied by strata_payload_decode. A field left at 0 takes its
 * default:
 *   max_decoded_bytes   STRATA_PAYLOAD_DEFAULT_MAX_DECODED_BYTES (1 GiB): the
 *                       largest body (decompressed size) accepted; checked
 *                       against the size the zstd frame declares before
 *                       anything is allocated. Decoding allocates at most
 *                       about 4 times this, plus 9 bytes per kept element
 *                       of sparse layers (at most 32 times the body; also
 *                       bounded by max_total_numel).
 *   max_layers          STRATA_PAYLOAD_DEFAULT_MAX_LAYERS (65536)
 *   max_layer_numel     STRATA_PAYLOAD_DEFAULT_MAX_LAYER_NUMEL (2^32 - 1, the
 *                       format's own maximum): largest dense tensor a layer
 *                       may describe
 *   max_metadata_bytes  STRATA_PAYLOAD_DEFAULT_MAX_METADATA_BYTES (1 MiB)
 *   max_total_numel     STRATA_PAYLOAD_DEFAULT_MAX_TOTAL_NUMEL (2^28): the
 *                       largest sum of the layers' dense element counts, i.e.
 *                       what decoding the whole update densely costs (a
 *                       sparse layer can declare a huge tensor in a few
 *                       bytes)
 * A server should set max_decoded_bytes, max_layer_numel and max_total_numel
 * from its model. */
typedef struct strata_payload_limits {
    uint64_t max_decoded_bytes;
    uint32_t max_layers;
    uint64_t max_layer_numel;
    size_t max_metadata_bytes;
    uint64_t max_total_numel;
} strata_payload_limits;

/* Encodes p (borrowed) into a new malloc'ed buffer: *out (free with free())
 * and *len receive the zstd frame; both are zeroed on entry. zstd_level is
 * 1..19, or 0 for the default level 1.
 *
 * p is validated with the same rules the decoder applies, so whatever
 * encodes also decodes (with default limits, as long as the metadata fits
 * 1 MiB and the body 1 GiB): layers in strictly ascending layer_index order,
 * known compressor and values format, 1 <= numel <= 2^32 - 1, counts and
 * arrays as strata/compress.h describes them, finite values and scales,
 * values exactly representable in fp16/bf16 where the values format or the
 * compressor (FP16, BF16) says so (the codec never rounds), QSGD levels in
 * [1, 127] and qlevels within +-levels, POWERSGD rows * cols == numel and
 * 1 <= rank <= min(rows, cols), metadata a JSON object without duplicate
 * keys. Fields a compressor does not use (e.g. seed for TOPK) are written as
 * zero, as are SIGN's padding bits.
 *
 * Errors: STRATA_EINVAL for a NULL argument, a bad level or a payload that
 * breaks a rule above (diag, may be NULL, names the layer and the field),
 * STRATA_ETOOBIG when the body would not fit size_t, STRATA_ENOMEM, and
 * STRATA_EIO when zstd fails. */
int strata_payload_encode(const strata_payload *p, int zstd_level, uint8_t **out, size_t *len,
                          strata_diag *diag);

/* Decodes len untrusted bytes at buf (borrowed) into a new payload: on
 * success *out (free with strata_payload_free) holds it; *out is set to NULL
 * on entry and stays NULL on error. lim (borrowed, may be NULL for all
 * defaults) bounds what is accepted.
 *
 * The input must be exactly one zstd frame that declares its content size
 * and whose body is a valid payload per schemas/payload.md with a matching
 * CRC32C. Errors: STRATA_EINVAL for a NULL argument; STRATA_ETOOBIG when a
 * limit is exceeded (declared body size, layer count, a layer's numel,
 * metadata length); STRATA_EPROTO for anything malformed (not zstd, several
 * frames or trailing bytes, truncation, checksum mismatch, bad magic or
 * version, layers out of order, unknown compressor or values format,
 * inconsistent counts or parameters, indices out of range, a Rice
 * parameter that is not the shortest, set padding bits, NaN or infinite
 * values or scales, an int8/ternary scale that is not a bfloat16 value,
 * qlevels beyond +-levels or int8 magnitudes above 127, invalid metadata
 * JSON, bytes left over); STRATA_ENOMEM. diag
 * (may be NULL) says what was wrong and where. */
int strata_payload_decode(const uint8_t *buf, size_t len, const strata_payload_limits *lim,
                          strata_payload **out, strata_diag *diag);

/* strata_payload_decode with the zstd context z (strata/zframe.h; NULL: a
 * context made and freed for the call), for callers that decode many
 * payloads: making a decompression context costs about as much as
 * decoding a small payload. z is used by one call at a time. */
int strata_payload_decode_z(strata_zctx *z, const uint8_t *buf, size_t len,
                            const strata_payload_limits *lim, strata_payload **out,
                            strata_diag *diag);

/* Frees a payload returned by strata_payload_decode, or one built entirely
 * on the heap the same way (struct and layer array from malloc, arrays as
 * strata/compress.h describes). Accepts NULL. */
void strata_payload_free(strata_payload *p);

/* CRC32C (Castagnoli, reflected polynomial 0x82F63B78, initial value and
 * final xor 0xFFFFFFFF) of len bytes at data, continuing from crc: start with
 * crc = 0; strata_crc32c(strata_crc32c(0, a, n), b, m) equals the CRC of a
 * followed by b. strata_crc32c(0, "123456789", 9) == 0xE3069283. Uses the
 * SSE4.2 instruction where the CPU has it. Thread-safe. */
uint32_t strata_crc32c(uint32_t crc, const void *data, size_t len);

#endif
