/* The round summary: what the coordinator records about one round and shows
 * in GET /v1/rounds and GET /v1/rounds/{round} (schemas/api.md, the
 * RoundSummary schema of schemas/openapi.yaml), as a struct and its JSON
 * codec. This module is the only place that knows the summary's keys; what
 * a summary says (stopped, recovered) is read from its fields, never by
 * searching the text.
 *
 * The JSON is one compact object whose keys come in this order, each group
 * present only as the struct says:
 *   always       "round", "state" ("open" or "closed"), "model_version",
 *                "selected", "participants"
 *   has_stats    "accuracy", "loss" (numbers, or null when not known),
 *                "eval_samples" (the test images behind them; only when
 *                eval_samples > 0: a round that was evaluated),
 *                "uplink_bytes", "downlink_bytes", "dense_uplink_bytes",
 *                "duration_ms", then the traffic derived from them:
 *                "dense_downlink_bytes" (= dense_uplink_bytes),
 *                "total_bytes", "dense_total_bytes" (each left out when it
 *                would pass 2^63 - 1), "uplink_ratio", "downlink_ratio",
 *                "total_ratio" (dense / actual, null when actual is 0);
 *                the decoder checks their types and ignores them
 *   has_densities "densities": {"<layer>": density, ...} in layer order,
 *                then, when compressors is set, "compressors":
 *                {"<layer>": "topk:0.01:int8", ...} (the budgets of the
 *                round as strata_budget_format writes them, same layers)
 *   has_lgreco   "lgreco": {"fell_back": false, "error_budget": x,
 *                "chosen_error": y, "bytes": b, "uniform_bytes": u,
 *                "allocation": {"<layer>": "topk:0.002", ...}}: the lgreco
 *                policy solved its table at this round's close; the
 *                allocation (same layers as "densities") is what the next
 *                rounds use (strata/policy.h, strata_lgreco_report)
 *   num_quarantined > 0
 *                "quarantined": [{"client_id": 7, "reason": "norm",
 *                "norm": 1.5e31}, ...]: the accepted updates the round's
 *                aggregate left out, in ascending client_id order
 *   failed       "failed": "aggregate_not_finite" | "model_not_finite" |
 *                "loss_not_finite" | "too_few_updates": the round closed
 *                without a new model (the model stayed at model_version),
 *                and why
 *   stopped      "stopped": true (closed unaggregated by an admin stop)
 *   recovered    "recovered": true (closed during crash recovery, having
 *                been aggregated before the crash)
 * The coordinator's forms are: a closed round (stats and densities, and the
 * quarantined updates when there were any), a failed round (the same, with
 * "failed" and null accuracy and loss), a stopped one and a recovered one
 * (neither stats nor densities), and the view of a round without a stored
 * summary (stats with null accuracy and loss; densities only for the open
 * round).
 *
 * Non-finite numbers: JSON has no NaN or infinity, so a non-finite accuracy,
 * loss or quarantined norm is written as null, never refused, and null
 * decodes to NaN; +-infinity therefore reads back as NaN. What a null means
 * is said by the summary itself: not measured yet (an open round), not
 * measured because the round failed ("failed" says why), or not finite. The
 * coordinator never closes a round normally with a non-finite loss: it
 * fails it instead. Every other double must be finite.
 *
 * Field ranges, which both the encoder and the decoder enforce:
 *   round             [0, 2^32 - 1]
 *   model_version     [0, 2^63 - 1]
 *   selected          [1, 2^63 - 1]
 *   participants, uplink_bytes, downlink_bytes, dense_uplink_bytes,
 *   duration_ms       [0, 2^63 - 1]
 *   eval_samples      [1, 2^63 - 1] when present (only with the stats)
 *   densities         at most max_layers entries; names 1 to max_name_bytes
 *                     bytes of UTF-8 without control characters, distinct;
 *                     values in (0, 1]
 *   quarantined       at most participants entries, each with all three
 *                     keys: client_id in [1, 2^63 - 1], strictly ascending;
 *                     reason "norm" or "non_finite"; norm >= 0 or null (an
 *                     empty array is accepted and means absent)
 *   failed            one of the three names above
 *   stopped, recovered booleans (false is accepted and means absent)
 * The decoder refuses unknown and duplicate keys, missing keys of the
 * always-present group, a stats group given in part, wrong types and values
 * out of range.
 *
 * No function here keeps state; distinct summaries may be encoded and
 * decoded from distinct threads at once. */
#ifndef STRATA_SUMMARY_H
#define STRATA_SUMMARY_H

#include "strata/error.h"

#include <stddef.h>
#include <stdint.h>

/* Default limits, used for every field of strata_summary_limits left at 0. */
#define STRATA_SUMMARY_DEFAULT_MAX_BYTES ((size_t)8 << 20) /* 8 MiB of JSON */
#define STRATA_SUMMARY_DEFAULT_MAX_LAYERS 65536u
#define STRATA_SUMMARY_DEFAULT_MAX_NAME_BYTES 127u /* strata/tensor.h: STRATA_MAX_NAME - 1 */

/* Deepest nesting of a valid summary (object, quarantined array, entry). */
#define STRATA_SUMMARY_MAX_DEPTH 3

typedef enum { STRATA_ROUND_OPEN = 0, STRATA_ROUND_CLOSED = 1 } strata_round_state;

/* Why the coordinator left an accepted update out of a round's aggregate
 * (docs/algorithm.md, "Screening"). */
typedef enum {
    STRATA_QUARANTINE_NORM = 0,      /* "norm": its L2 norm is an outlier */
    STRATA_QUARANTINE_NON_FINITE = 1 /* "non_finite": left out, largest norms
                                        first, because with it the aggregate,
                                        the model or its loss was not finite */
} strata_quarantine_reason;

/* One quarantined update. */
typedef struct strata_round_quarantine {
    uint64_t client_id;
    strata_quarantine_reason reason;
    double norm; /* the update's L2 norm; NaN: unknown (null) */
} strata_round_quarantine;

/* Why a round closed without a new model ("failed"). */
typedef enum {
    STRATA_ROUND_FAILED_NONE = 0,      /* not failed: no "failed" key */
    STRATA_ROUND_FAILED_AGGREGATE = 1, /* "aggregate_not_finite" */
    STRATA_ROUND_FAILED_MODEL = 2,     /* "model_not_finite": after the server step */
    STRATA_ROUND_FAILED_LOSS = 3,      /* "loss_not_finite": the evaluation's loss or accuracy */
    STRATA_ROUND_FAILED_TOO_FEW = 4    /* "too_few_updates": fewer than min_updates by the
                                          deadline, or every selected client skipped */
} strata_round_failure;

/* The names of a quarantine reason and a failure ("norm",
 * "loss_not_finite"); "?" for a value out of range ("" for
 * STRATA_ROUND_FAILED_NONE). */
const char *strata_quarantine_reason_name(strata_quarantine_reason r);
const char *strata_round_failure_name(strata_round_failure f);

/* One round's summary. After strata_round_summary_decode the struct owns
 * layer_names (each name and the array), densities and quarantined (release with
 * strata_round_summary_cleanup); for strata_round_summary_encode everything
 * is only read, so the caller may lend arrays it keeps. */
typedef struct strata_round_summary {
    uint32_t round;
    strata_round_state state;
    uint64_t model_version; /* the model version the round trained */
    uint64_t selected;      /* clients sampled for the round */
    uint64_t participants;  /* accepted updates */

    int has_stats;               /* the six fields below are present */
    double accuracy;             /* on the held-out set; NaN: unknown (null, or no stats) */
    double loss;                 /* NaN: unknown (null, or no stats) */
    uint64_t eval_samples;       /* test images evaluated; 0: none (no key) */
    uint64_t uplink_bytes;       /* bytes of the accepted uploads */
    uint64_t downlink_bytes;     /* bytes of model downloads */
    uint64_t dense_uplink_bytes; /* participants x parameters x 4 */
    uint64_t duration_ms;

    int has_densities;  /* "densities" is present (possibly empty) */
    size_t num_layers;  /* entries of layer_names and densities */
    char **layer_names; /* NUL-terminated, distinct */
    double *densities;  /* each in (0, 1] */
    char **compressors; /* NULL, or num_layers budget specifications */

    int has_lgreco; /* needs has_densities; the fields below */
    int lg_fell_back;
    double lg_error_budget, lg_chosen_error, lg_bytes, lg_uniform_bytes; /* finite, >= 0 */
    char **lg_allocation; /* num_layers budget specifications */

    size_t num_quarantined;               /* entries of quarantined; 0: no key */
    strata_round_quarantine *quarantined; /* ascending client_id */
    strata_round_failure failed;          /* STRATA_ROUND_FAILED_NONE: no key */

    int stopped;   /* closed unaggregated by an admin stop */
    int recovered; /* closed during crash recovery */
} strata_round_summary;

/* Limits applied by strata_round_summary_decode; a field left at 0 takes
 * its default:
 *   max_bytes       STRATA_SUMMARY_DEFAULT_MAX_BYTES (8 MiB), checked before
 *                   anything is parsed
 *   max_layers      STRATA_SUMMARY_DEFAULT_MAX_LAYERS (65536), checked
 *                   before the density arrays are allocated
 *   max_name_bytes  STRATA_SUMMARY_DEFAULT_MAX_NAME_BYTES (127) */
typedef struct strata_summary_limits {
    size_t max_bytes;
    size_t max_layers;
    size_t max_name_bytes;
} strata_summary_limits;

/* Encodes s (borrowed) as the summary JSON described above into a new
 * malloc'ed NUL-terminated string: *json_out (free with free()) and *len_out
 * (without the NUL), both zeroed on entry. Non-finite accuracy, loss and
 * quarantined norms become null (never an error). Errors: STRATA_EINVAL for
 * a NULL argument (layer_names and densities may be NULL only when
 * num_layers is 0 or has_densities is 0; quarantined only when
 * num_quarantined is 0), a field out of range, duplicate layer names, or
 * quarantined client ids that are not strictly ascending (diag, may be NULL,
 * names the field); STRATA_ENOMEM (diag says so). Whatever encodes also decodes with default
 * limits when it has at most 65536 layers with names of at most 127 bytes. */
int strata_round_summary_encode(const strata_round_summary *s, char **json_out, size_t *len_out,
                                strata_diag *diag);

/* Decodes len untrusted bytes at json (borrowed; need not be
 * NUL-terminated) into *out, which is zeroed on entry and owns its arrays on
 * success (release with strata_round_summary_cleanup); on error it is left
 * zeroed. lim (borrowed) may be NULL for every default. The size is checked
 * before jansson runs, then the nesting depth; duplicate keys are refused.
 * Errors: STRATA_EINVAL for a NULL argument; STRATA_ETOOBIG for a text
 * above max_bytes or more densities than max_layers; STRATA_EPROTO for
 * anything else, with diag (may be NULL) naming the field and quoting input
 * text as printable ASCII; STRATA_ENOMEM. */
int strata_round_summary_decode(const char *json, size_t len, const strata_summary_limits *lim,
                                strata_round_summary *out, strata_diag *diag);

/* Frees the arrays of a decoded summary (names, densities, quarantined)
 * and zeroes it. Accepts NULL and a
 * zeroed summary. Not for a summary whose arrays the caller lent to
 * strata_round_summary_encode. */
void strata_round_summary_cleanup(strata_round_summary *s);

#endif
