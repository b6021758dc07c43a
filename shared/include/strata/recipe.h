/* The recipe of model version 0 (docs/algorithm.md, "Downlink"; GET
 * /v1/models/0/init in schemas/api.md): what a client needs to build the
 * coordinator's version 0 itself instead of downloading it, when that
 * version is the seeded initialisation (strata_model_init_params with the
 * federation's seed, then the input normalisation).
 *
 * The JSON is one compact object with its keys in this order:
 *   {"architecture":{...},"init_seed":42,"mean":0.28604060411453247,
 *    "std":0.35302424430847168,"digest":"9f86..."}
 *   architecture  the model's canonical architecture JSON
 *                 (strata_model_arch), as a JSON object
 *   init_seed     [0, 2^53 - 1], the seed given to strata_model_init_params
 *   mean, std     the normalisation (float32 values written as reals with 17
 *                 significant digits); std > 0
 *   digest        64 lowercase hex digits: version 0's digest
 *                 (strata/downlink.h), over the parameters only
 * The decoder refuses unknown, missing and duplicate keys, wrong types,
 * values out of range and documents above STRATA_RECIPE_MAX_BYTES.
 *
 * Functions keep no state; thread-safe for distinct arguments. */
#ifndef STRATA_RECIPE_H
#define STRATA_RECIPE_H

#include "strata/downlink.h"
#include "strata/error.h"
#include "strata/model.h"

#include <stddef.h>
#include <stdint.h>

/* The largest recipe document accepted (checked before parsing). */
#define STRATA_RECIPE_MAX_BYTES ((size_t)1 << 20)

/* One recipe. After strata_recipe_decode or strata_recipe_of the struct
 * owns arch (release with strata_recipe_cleanup). */
typedef struct strata_recipe {
    char *arch;    /* canonical compact architecture JSON */
    uint64_t seed; /* init seed */
    float mean, std;
    char digest[STRATA_DIGEST_HEX_SIZE];
} strata_recipe;

/* Fills *out (zeroed on entry) with m's architecture, normalisation and
 * digest, and seed: the recipe of m when m is strata_model_init_params(m,
 * seed) followed by its normalisation (the caller vouches for that).
 * Errors: STRATA_EINVAL (seed above 2^53 - 1), STRATA_ENOMEM. */
int strata_recipe_of(const strata_model *m, uint64_t seed, strata_recipe *out, strata_diag *diag);

/* Encodes r (borrowed) as the JSON above into a new NUL-terminated string
 * *json (free()) of *len bytes. Errors: STRATA_EINVAL (arch is not a JSON
 * object, seed out of range, std not positive), STRATA_ENOMEM. */
int strata_recipe_encode(const strata_recipe *r, char **json, size_t *len, strata_diag *diag);

/* Decodes untrusted JSON (json, len; borrowed) into *out (zeroed on entry,
 * and again on error). Errors: STRATA_ETOOBIG (above
 * STRATA_RECIPE_MAX_BYTES), STRATA_EPROTO (diag names the field),
 * STRATA_ENOMEM. */
int strata_recipe_decode(const char *json, size_t len, strata_recipe *out, strata_diag *diag);

/* Builds the model r describes: the architecture (refused above
 * max_params parameters before anything is allocated), initialised with
 * r's seed and normalised, and checks its digest against r's. On success
 * *out is the new model (strata_model_free). Errors: STRATA_EPROTO (an
 * architecture that does not build, too many parameters, or a digest that
 * differs: diag says which), STRATA_ENOMEM. */
int strata_recipe_build(const strata_recipe *r, size_t max_params, strata_model **out,
                        strata_diag *diag);

/* Frees r's architecture and zeroes r. Accepts NULL. */
void strata_recipe_cleanup(strata_recipe *r);

#endif
