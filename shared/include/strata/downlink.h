/* The compressed downlink (docs/algorithm.md, "Downlink"): what the
 * coordinator and the clients share to agree, bit for bit, on the model x̂
 * the clients hold.
 *
 * The coordinator keeps its model x and the model x̂ it has published. When
 * a round closes it compresses a = x - x̂ layer by layer (the same
 * compressors, values formats and payload codec as the uplink), publishes
 * the layers as one payload (a "delta"), and sets x̂ += decode(C(a)); what
 * C left out stays in x - x̂, the server's residual, and is sent in later
 * rounds (error feedback). A client holding x̂ at version u applies the
 * deltas u+1 .. v in order with strata_downlink_apply and checks the
 * result against version v's digest.
 *
 * Digest: SHA-256 over the float32 bytes (little-endian) of every tensor
 * of the model in model order, nothing else (names, shapes and the
 * safetensors header are not part of it), written as 64 lowercase hex
 * digits.
 *
 * A delta payload (schemas/payload.md) has round = the round that closed,
 * model_version = the version it produces, client_id 0, sample_count 0, one
 * layer per tensor, and the metadata {"from":U,"to":V,"digest":"HEX"}: it
 * turns version U (= V - 1) into version V whose digest is HEX.
 *
 * A chain (GET /v1/models/{v}/delta?from=u) is "SDC1", a uint32 count
 * (little-endian), then count entries of a uint32 length and that many
 * bytes of one delta payload, oldest first, nothing after.
 *
 * A chain may end with a base: a payload whose metadata is
 * {"from":U,"to":V,"digest":"HEX","base":true} (U the chain's first
 * version, V its last) and whose layers are either NONE with the float32
 * values of x̂ at V (the layer is set to them) or TOPK with no element
 * (the layer is left as the deltas made it). In such a chain the layers
 * the base sets are empty in the deltas before it (see
 * strata_downlink_chain_compact): a tensor whose deltas together cost more
 * than its values travels once, as values. The deltas of a based chain do
 * not reproduce the digests their metadata name; only the result after the
 * base does.
 *
 * Functions keep no state; thread-safe for distinct arguments. */
#ifndef STRATA_DOWNLINK_H
#define STRATA_DOWNLINK_H

#include "strata/compress.h"
#include "strata/error.h"
#include "strata/payload.h"
#include "strata/tensor.h"

#include <stddef.h>
#include <stdint.h>

/* Characters of a digest's text, NUL included. */
#define STRATA_DIGEST_HEX_SIZE 65

/* Tensors below this many elements travel dense (bf16 values; the
 * rounding stays in x - x̂ and goes out with later deltas) in a delta. */
#define STRATA_DOWNLINK_DENSE_BELOW 1000

/* Most deltas one chain may carry. */
#define STRATA_DOWNLINK_MAX_CHAIN 4096u

/* Writes the digest of m's values (see the file comment) to hex. */
void strata_downlink_digest(const strata_tensor_list *m, char hex[STRATA_DIGEST_HEX_SIZE]);

/* The budget of tensor t in a delta compressed with b: b itself, except
 * dense bf16 (strata_budget_whole) for tensors below
 * STRATA_DOWNLINK_DENSE_BELOW elements when b is a sparsifier, quantiser or
 * low-rank compressor. */
strata_budget strata_downlink_budget(const strata_budget *b, size_t numel);

/* One downlink step: compresses a = target - ref (both borrowed, the same
 * layout; target unchanged) with b (strata_downlink_budget per tensor)
 * through one strata_ef_step from a zero residual (so every compressor
 * behaves as on the uplink, QSGD's contraction included),
 * then adds the decoded layers to ref in place (ref becomes the new x̂,
 * exactly what strata_downlink_apply computes from the same layers). On
 * success *layers (free with strata_clayers_free(*layers, ref->count)) has
 * one layer per tensor. On error ref is unchanged and *layers NULL. seed
 * drives the random compressors and stochastic rounding. Errors:
 * STRATA_EINVAL (layouts differ, bad budget, a value that is not finite),
 * STRATA_ENOMEM. */
int strata_downlink_step(strata_tensor_list *ref, const strata_tensor_list *target,
                         const strata_budget *b, uint64_t seed, strata_clayer **layers,
                         strata_diag *diag);

/* Adds the decoded layers of delta payload p (borrowed) to m in place:
 * m's values become x̂ of p's version when m held x̂ of the version
 * before. All-or-nothing: the layers are checked (one per tensor, in
 * order, matching element counts, decodable) before m changes. Errors:
 * STRATA_EPROTO (diag says why), STRATA_ENOMEM. */
int strata_downlink_apply(strata_tensor_list *m, const strata_payload *p, strata_diag *diag);

/* The metadata JSON of a delta from version `from` to `to` with digest
 * hex, into a new string (free()). Errors: STRATA_ENOMEM. */
int strata_downlink_meta(uint64_t from, uint64_t to, const char *hex, char **out);

/* Reads a delta payload's metadata (see the file comment): its versions
 * and digest. Errors: STRATA_EPROTO (missing or malformed; diag says
 * which). */
int strata_downlink_meta_parse(const strata_payload *p, uint64_t *from, uint64_t *to,
                               char hex[STRATA_DIGEST_HEX_SIZE], strata_diag *diag);

/* 1 when delta payload p's metadata marks it as a chain's base (see the
 * file comment), else 0. */
int strata_downlink_meta_is_base(const strata_payload *p);

/* Sets the layers of base payload p (borrowed) that carry values (NONE,
 * float32, one value per element) in m and leaves those that carry none
 * (TOPK with count 0). All-or-nothing: every layer is checked (one per
 * tensor, in order, matching element counts, one of those two forms, finite
 * values) before m changes. Errors: STRATA_EPROTO (diag says why). */
int strata_downlink_apply_base(strata_tensor_list *m, const strata_payload *p, strata_diag *diag);

/* Compacts the chain of n delta payloads (parts[i], lens[i] bytes; borrowed,
 * oldest first) that ends at x̂ = target (borrowed; the model of the last
 * delta's version, whose digest it must have; target_digest, when not NULL,
 * is taken as target's digest instead of computing it): every tensor whose
 * layers in the n deltas are estimated (strata_clayer_cost_bytes) to cost
 * more than its float32 values is emptied in each delta and set by a base at
 * the end (see the file comment). On success *out (free()) holds the
 * compacted chain, or is NULL (and *len 0) when no tensor gains or the
 * result would not be smaller than the plain chain; a client applying it
 * reaches target bit for bit. Errors: STRATA_EPROTO (a part that does not
 * decode, is not a delta of target's layout, or versions that do not follow
 * each other), STRATA_EINVAL (a digest that is not target's, n 0 or above
 * STRATA_DOWNLINK_MAX_CHAIN - 1), STRATA_ENOMEM. zstd_level as for
 * strata_payload_encode. */
int strata_downlink_chain_compact(const uint8_t *const *parts, const size_t *lens, size_t n,
                                  const strata_tensor_list *target, const char *target_digest,
                                  int zstd_level, uint8_t **out, size_t *len, strata_diag *diag);

/* Encodes n delta payloads (parts[i], lens[i] bytes; borrowed) as a chain
 * into a new buffer *out (free()) of *len bytes. Errors: STRATA_EINVAL (n 0
 * or above STRATA_DOWNLINK_MAX_CHAIN, a part above 4 GiB), STRATA_ENOMEM. */
int strata_downlink_chain_encode(const uint8_t *const *parts, const size_t *lens, size_t n,
                                 uint8_t **out, size_t *len);

/* Splits an untrusted chain (buf, len; borrowed) into its parts: *parts
 * and *lens are new arrays (free() both) of *n entries pointing into buf.
 * Errors: STRATA_EPROTO (bad magic, count 0 or above
 * STRATA_DOWNLINK_MAX_CHAIN, truncated, bytes left over), STRATA_ENOMEM. */
int strata_downlink_chain_split(const uint8_t *buf, size_t len, const uint8_t ***parts,
                                size_t **lens, size_t *n, strata_diag *diag);

#endif
