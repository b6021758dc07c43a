/* The task: what the coordinator asks of a client for one round (GET
 * /v1/tasks/next, schemas/api.md and the Task schema of
 * schemas/openapi.yaml), as a struct and its JSON codec. This module is the
 * only place that knows the task's keys.
 *
 * The JSON is one compact object with its keys in this order:
 *   {"round":3,"total_rounds":30,"model_version":3,
 *    "deadline_unix_ms":1764672000000,
 *    "budgets":[{"layer":"fc1.weight","compressor":"topk","density":0.0089,
 *                "levels":0,"rank":0,"values":"fp32"},...],
 *    "error_candidates":[{"compressor":"topk","density":0.001,"levels":0,
 *                         "rank":0,"values":"int8"},...],
 *    "train":{"epochs":1,"batch":32,"lr":0.05,"momentum":0.0,
 *             "weight_decay":0.0,"prox_mu":0.0,"max_steps":0},
 *    "seed":123456,"model_digest":"9f86...","downlink":true}
 * Numbers that are doubles in the struct are written as JSON reals with 17
 * significant digits (so they read back bit for bit); integers as integers.
 *
 * Field ranges, which both the encoder and the decoder enforce:
 *   round            [0, 2^32 - 1]
 *   total_rounds     [1, 2^32 - 1]
 *   model_version    [0, 2^63 - 1]
 *   deadline_unix_ms [0, 2^63 - 1]
 *   budgets          at most max_layers entries, one per model tensor in
 *                    model order; each with
 *     layer          1 to max_name_bytes bytes of UTF-8, no control
 *                    characters
 *     compressor     a name of strata_comp_name ("none", "topk", ...)
 *     density        (0, 1]
 *     levels, rank   [0, 2^31 - 1]
 *     values         a name of strata_values_format_name ("fp32", "int8",
 *                    ...); the budget passes strata_budget_check (QSGD
 *                    levels in [1, 127], POWERSGD rank >= 1, a values
 *                    format the compressor takes)
 *   error_candidates at most STRATA_TASK_MAX_CANDIDATES budgets without
 *                    "layer" (same keys and ranges otherwise): the lgreco
 *                    policy's candidates, for which the client reports an
 *                    error table in its payload metadata (schemas/payload.md);
 *                    empty when the round asks for none
 *   train.epochs     [1, 2^31 - 1]
 *   train.batch      [1, 2^31 - 1]
 *   train.lr, weight_decay, prox_mu   [0, FLT_MAX] (clients train in float)
 *   train.momentum   [0, 1)
 *   train.max_steps  [0, 2^63 - 1], 0 means no cap
 *   seed             [0, 2^53 - 1] (exact in every JSON implementation)
 *   model_digest     optional: 64 lowercase hex digits, the digest of model
 *                    version model_version (strata/downlink.h); written
 *                    when the struct's model_digest is not ""
 *   downlink         optional: true when the coordinator publishes deltas
 *                    (GET /v1/models/{v}/delta); written only when true
 *
 * Strictness: the decoder refuses every key it does not know, at every level,
 * as well as missing keys, duplicate keys, wrong types (an integer field
 * given as 1.0, a string given as a number), values out of range and
 * anything after the object. Coordinator and client are built from the same
 * tree, so a new task field is a change to this codec that both sides get at
 * once; a client never has to guess at keys. The coordinator sends exactly
 * the keys above, so no correct coordinator's task is refused.
 *
 * No function here keeps state; distinct tasks may be encoded and decoded
 * from distinct threads at once. */
#ifndef STRATA_TASK_H
#define STRATA_TASK_H

#include "strata/compress.h"
#include "strata/error.h"

#include <stddef.h>
#include <stdint.h>

/* Default limits, used for every field of strata_task_limits left at 0. */
#define STRATA_TASK_DEFAULT_MAX_BYTES ((size_t)8 << 20) /* 8 MiB of JSON */
#define STRATA_TASK_DEFAULT_MAX_LAYERS 65536u
#define STRATA_TASK_DEFAULT_MAX_NAME_BYTES 127u /* strata/tensor.h: STRATA_MAX_NAME - 1 */

/* Most error-table candidates a task may carry. */
#define STRATA_TASK_MAX_CANDIDATES 255u
/* Deepest nesting of a valid task (object, budgets array, budget object);
 * anything deeper is refused before jansson parses it. */
#define STRATA_TASK_MAX_DEPTH 3

/* Local-training settings of a task. */
typedef struct strata_task_train {
    uint32_t epochs;
    uint32_t batch;
    double lr;
    double momentum;
    double weight_decay;
    double prox_mu;
    uint64_t max_steps; /* 0: no cap */
} strata_task_train;

/* One task. num_layers entries in both layer_names and budgets: layer i is
 * the model's i-th tensor. After strata_task_decode the struct owns its
 * arrays and strings (release with strata_task_cleanup); for
 * strata_task_encode everything is only read, so the caller may point
 * layer_names and budgets at arrays it keeps (borrowed). */
typedef struct strata_task {
    uint32_t round;
    uint32_t total_rounds;
    uint64_t model_version;
    int64_t deadline_unix_ms;
    size_t num_layers;
    char **layer_names;     /* num_layers NUL-terminated names */
    strata_budget *budgets; /* num_layers budgets */
    size_t num_candidates;
    strata_budget *candidates; /* num_candidates error-table candidates (NULL when 0) */
    strata_task_train train;
    uint64_t seed;         /* drives the client's random compressors and shuffling */
    char model_digest[65]; /* "" when the task carries none */
    int downlink;          /* 1: deltas are published */
} strata_task;

/* Limits applied by strata_task_decode. A field left at 0 takes its default:
 *   max_bytes       STRATA_TASK_DEFAULT_MAX_BYTES (8 MiB): the largest JSON
 *                   text accepted, checked before anything is parsed
 *   max_layers      STRATA_TASK_DEFAULT_MAX_LAYERS (65536): the most budgets,
 *                   checked before the arrays are allocated
 *   max_name_bytes  STRATA_TASK_DEFAULT_MAX_NAME_BYTES (127): the longest
 *                   layer name
 * A client may set max_layers to its model's tensor count. */
typedef struct strata_task_limits {
    size_t max_bytes;
    size_t max_layers;
    size_t max_name_bytes;
} strata_task_limits;

/* Encodes t (borrowed) as the task JSON described above into a new
 * malloc'ed NUL-terminated string: *json_out (free with free()) and *len_out
 * (its length without the NUL), both zeroed on entry. t is checked against
 * the field ranges first, so whatever encodes also decodes with default
 * limits when it has at most 65536 layers with names of at most 127 bytes.
 * Errors: STRATA_EINVAL for a NULL argument (layer_names or budgets may be
 * NULL only when num_layers is 0) or a field out of range (diag, may be
 * NULL, names the field); STRATA_ENOMEM. */
int strata_task_encode(const strata_task *t, char **json_out, size_t *len_out, strata_diag *diag);

/* Decodes len untrusted bytes at json (borrowed; need not be NUL-terminated)
 * into *out, which is zeroed on entry and owns its arrays on success
 * (release with strata_task_cleanup); on error it is left zeroed, with
 * nothing to release. lim (borrowed) may be NULL for every default.
 *
 * The checks run cheapest first: the size against max_bytes, the nesting
 * depth (STRATA_TASK_MAX_DEPTH), then jansson (duplicate keys refused), then
 * unknown keys of the object, then every field in the order listed above,
 * each type- and range-checked, with the budget count checked against
 * max_layers before anything is allocated. Errors:
 * STRATA_EINVAL for a NULL argument; STRATA_ETOOBIG for a text above
 * max_bytes or more budgets than max_layers; STRATA_EPROTO for anything
 * else (invalid JSON, not an object, too deep, missing, unknown or
 * duplicate keys, wrong types, values out of range, an unknown compressor
 * or values format, a budget strata_budget_check refuses); STRATA_ENOMEM.
 * diag (may be NULL) names the field ("budgets[3].density: 1.5 is not in
 * (0, 1]"); text from the input is quoted as printable ASCII, so the
 * message is safe to log. */
int strata_task_decode(const char *json, size_t len, const strata_task_limits *lim,
                       strata_task *out, strata_diag *diag);

/* Frees the names and arrays of a decoded task and zeroes it. Accepts NULL
 * and a zeroed task. Not for a task whose arrays the caller lent to
 * strata_task_encode. */
void strata_task_cleanup(strata_task *t);

#endif
