/* Reading and writing tensor lists in the safetensors format.
 *
 * A safetensors file (https://github.com/huggingface/safetensors) is an
 * 8-byte little-endian u64 header length N, N bytes of UTF-8 JSON header and
 * a data buffer. The header maps each tensor name to
 * {"dtype": ..., "shape": [...], "data_offsets": [begin, end]} (offsets are
 * relative to the start of the data buffer) and may hold a "__metadata__"
 * object of string to string.
 *
 * Strata writes float32 ("F32") tensors in list order with ascending,
 * contiguous offsets and a header padded with spaces to a multiple of 8
 * bytes. The reader treats its input as untrusted: it checks every field,
 * accepts F32, F16, BF16 and F64 (the last three converted to float32) and
 * returns tensors ordered by ascending data offset, so a file written by
 * Strata reads back in its original order.
 *
 * No function here keeps global state; distinct objects may be used from
 * distinct threads. */
#ifndef STRATA_SAFETENSORS_H
#define STRATA_SAFETENSORS_H

#include "strata/error.h"
#include "strata/tensor.h"

#include <stddef.h>
#include <stdint.h>

/* Largest JSON header the reader accepts and the writer produces (bytes),
 * the same limit as the reference implementation. */
#define STRATA_SAFETENSORS_MAX_HEADER 100000000u

/* File size limit of strata_safetensors_read when max_bytes is 0: 4 GiB. */
#define STRATA_SAFETENSORS_DEFAULT_MAX_BYTES ((uint64_t)4 << 30)

/* Most entries a strata_metadata holds. */
#define STRATA_METADATA_MAX_ENTRIES 4096

/* String key/value metadata: insertion-ordered, keys unique. The struct is
 * caller-owned; its strings and array are owned by it. Not thread-safe. */
typedef struct strata_metadata_entry {
    char *key;
    char *value;
} strata_metadata_entry;

typedef struct strata_metadata {
    size_t count;
    size_t cap;
    strata_metadata_entry *items;
} strata_metadata;

/* Initialises an empty metadata set (caller-owned struct). */
void strata_metadata_init(strata_metadata *m);

/* Frees every entry and leaves m empty. Accepts NULL. */
void strata_metadata_cleanup(strata_metadata *m);

/* Copies key and value (both borrowed, NUL-terminated) into m. An existing
 * entry with the same key has its value replaced and keeps its position; a
 * new key is appended. Errors: STRATA_EINVAL for a NULL argument,
 * STRATA_ETOOBIG when m already holds STRATA_METADATA_MAX_ENTRIES entries,
 * STRATA_ENOMEM. On error m is unchanged. */
int strata_metadata_set(strata_metadata *m, const char *key, const char *value);

/* Returns the value stored for key (borrowed: valid until the entry is
 * replaced or m is cleaned up), or NULL when absent or an argument is NULL. */
const char *strata_metadata_get(const strata_metadata *m, const char *key);

/* Encodes the tensors of t (borrowed) as float32 ("F32") and the optional
 * metadata meta (borrowed, may be NULL; omitted from the file when empty)
 * into a new malloc'ed buffer. On success *buf (free with free()) and *len
 * hold the file bytes; both are zeroed on entry. Errors: STRATA_EINVAL for a
 * NULL argument, a tensor named "__metadata__", an inconsistent tensor, or a
 * name, key or value that is not valid UTF-8; STRATA_ETOOBIG when the header
 * would exceed STRATA_SAFETENSORS_MAX_HEADER or the size overflows;
 * STRATA_ENOMEM. */
int strata_safetensors_encode(const strata_tensor_list *t, const strata_metadata *meta,
                              uint8_t **buf, size_t *len);

/* Decodes len untrusted bytes at buf (borrowed). out must be an initialised
 * list: on success it is emptied and receives the tensors, ordered by
 * ascending data offset. meta may be NULL (the metadata is checked, then
 * ignored) or an initialised metadata, replaced on success. On error out and
 * meta are unchanged and diag (may be NULL) explains the problem, naming the
 * tensor and field. Errors: STRATA_EPROTO for malformed input (short file,
 * bad header length, invalid JSON, duplicate keys, missing or mistyped
 * fields, unknown or unsupported dtype, bad shape, offsets out of range,
 * overlapping or not covering the data buffer exactly, bad __metadata__),
 * STRATA_EINVAL for a NULL argument, STRATA_ENOMEM. */
int strata_safetensors_decode(const uint8_t *buf, size_t len, strata_tensor_list *out,
                              strata_metadata *meta, strata_diag *diag);

/* Encodes t and meta as strata_safetensors_encode does and stores them at
 * path: the bytes go to a new temporary file "<path>.tmp.XXXXXX" (mkostemp),
 * which is fsync'ed and renamed over path, then the directory is fsync'ed,
 * so a crash leaves either the old file or the complete new one at path;
 * concurrent writers of one path each use their own temporary file and the
 * last rename wins. Errors: those of
 * strata_safetensors_encode, and STRATA_EIO when a system call fails (the
 * temporary file is removed; after a failed directory fsync the new file is
 * already in place). diag (may be NULL) explains the error. */
int strata_safetensors_write(const char *path, const strata_tensor_list *t,
                             const strata_metadata *meta, strata_diag *diag);

/* Reads the file at path and decodes it as strata_safetensors_decode does
 * (same contract for out, meta and diag). Files larger than max_bytes (0
 * means STRATA_SAFETENSORS_DEFAULT_MAX_BYTES) are refused with
 * STRATA_ETOOBIG before anything is allocated. Errors: STRATA_EIO when the
 * file cannot be opened or read or is not a regular file, plus those of
 * strata_safetensors_decode. */
int strata_safetensors_read(const char *path, size_t max_bytes, strata_tensor_list *out,
                            strata_metadata *meta, strata_diag *diag);

#endif
