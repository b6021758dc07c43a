/* The recipe of model version 0 (strata/recipe.h): its JSON codec and the
 * build that checks the result against the recipe's digest. */
#include "strata/recipe.h"

#include "json_strict.h"

#include <float.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#define MAX_SEED ((int64_t)((UINT64_C(1) << 53) - 1))
/* Nesting an architecture may reach inside the recipe object. */
#define RECIPE_MAX_DEPTH 16

static const char *const KEYS[] = {"architecture", "init_seed", "mean", "std", "digest"};
#define NKEYS (sizeof(KEYS) / sizeof(KEYS[0]))

static int hex_digest_ok(const char *s, size_t n)
{
    if (n != STRATA_DIGEST_HEX_SIZE - 1)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
            return 0;
    return 1;
}

void strata_recipe_cleanup(strata_recipe *r)
{
    if (r == NULL)
        return;
    free(r->arch);
    memset(r, 0, sizeof(*r));
}

int strata_recipe_of(const strata_model *m, uint64_t seed, strata_recipe *out, strata_diag *diag)
{
    memset(out, 0, sizeof(*out));
    if (seed > (uint64_t)MAX_SEED)
        return strata_diag_set(diag, STRATA_EINVAL, "recipe: seed %" PRIu64 " above 2^53 - 1",
                               seed);
    if (strata__json_strdup(strata_model_arch(m), &out->arch) < 0)
        return strata_diag_set(diag, STRATA_ENOMEM, "recipe: out of memory");
    out->seed = seed;
    strata_model_get_normalization(m, &out->mean, &out->std);
    /* The digest reads the values only; the model is not changed. */
    strata_downlink_digest(strata_model_params((strata_model *)m), out->digest);
    return STRATA_OK;
}

int strata_recipe_encode(const strata_recipe *r, char **json, size_t *len, strata_diag *diag)
{
    *json = NULL;
    *len = 0;
    if (r->seed > (uint64_t)MAX_SEED || !(r->std > 0) || !(r->std <= FLT_MAX) ||
        !(r->mean >= -FLT_MAX && r->mean <= FLT_MAX) ||
        !hex_digest_ok(r->digest, strnlen(r->digest, sizeof(r->digest))))
        return strata_diag_set(diag, STRATA_EINVAL,
                               "recipe: seed, normalisation or digest out of range");
    json_error_t je;
    json_t *arch = r->arch != NULL ? json_loads(r->arch, JSON_REJECT_DUPLICATES, &je) : NULL;
    if (!json_is_object(arch)) {
        json_decref(arch);
        return strata_diag_set(diag, STRATA_EINVAL,
                               "recipe: the architecture is not a JSON object");
    }
    /* "o" steals arch, also when json_pack fails. */
    json_t *j =
        json_pack("{s:o,s:I,s:f,s:f,s:s}", "architecture", arch, "init_seed", (json_int_t)r->seed,
                  "mean", (double)r->mean, "std", (double)r->std, "digest", r->digest);
    int rc = j != NULL ? strata__json_dump(j, json, len) : STRATA_ENOMEM;
    json_decref(j);
    if (rc < 0)
        return strata_diag_set(diag, rc, "recipe: out of memory");
    return STRATA_OK;
}

int strata_recipe_decode(const char *json, size_t len, strata_recipe *out, strata_diag *diag)
{
    memset(out, 0, sizeof(*out));
    json_t *root = NULL;
    int rc = strata__json_load(json, len, STRATA_RECIPE_MAX_BYTES, RECIPE_MAX_DEPTH, "recipe",
                               &root, diag);
    if (rc < 0)
        return rc;
    const char *where = "recipe";
    int64_t seed = 0;
    double mean = 0, sd = 0;
    const json_t *arch = json_object_get(root, "architecture");
    const json_t *dg = json_object_get(root, "digest");
    size_t alen = 0;
    if ((rc = strata__json_known_keys(root, KEYS, NKEYS, where, diag)) < 0 ||
        (rc = strata__json_int(root, "init_seed", 0, MAX_SEED, where, &seed, diag)) < 0 ||
        (rc = strata__json_number(root, "mean", -FLT_MAX, 0, FLT_MAX, 0, where, &mean, diag)) < 0 ||
        (rc = strata__json_number(root, "std", 0.0, 1, FLT_MAX, 0, where, &sd, diag)) < 0)
        goto out;
    if (!json_is_object(arch)) {
        rc = strata_diag_set(diag, STRATA_EPROTO, "recipe.architecture: %s",
                             arch == NULL ? "missing" : "expected an object");
        goto out;
    }
    if (!json_is_string(dg) || !hex_digest_ok(json_string_value(dg), json_string_length(dg))) {
        rc =
            strata_diag_set(diag, STRATA_EPROTO, "recipe.digest: expected 64 lowercase hex digits");
        goto out;
    }
    out->seed = (uint64_t)seed;
    out->mean = (float)mean;
    out->std = (float)sd;
    if (!(out->std > 0)) {
        rc = strata_diag_set(diag, STRATA_EPROTO, "recipe.std: %.17g is 0 in float32", sd);
        goto out;
    }
    memcpy(out->digest, json_string_value(dg), STRATA_DIGEST_HEX_SIZE);
    if ((rc = strata__json_dump(arch, &out->arch, &alen)) < 0)
        rc = strata_diag_set(diag, rc, "recipe: out of memory");
out:
    json_decref(root);
    if (rc < 0)
        strata_recipe_cleanup(out);
    return rc;
}

int strata_recipe_build(const strata_recipe *r, size_t max_params, strata_model **out,
                        strata_diag *diag)
{
    *out = NULL;
    if (r->arch == NULL)
        return strata_diag_set(diag, STRATA_EPROTO, "recipe: no architecture");
    size_t n = 0, alen = strlen(r->arch);
    strata_diag inner = {{0}};
    int rc = strata_model_count_params(r->arch, alen, &n, &inner);
    if (rc < 0)
        return strata_diag_set(diag, rc == STRATA_ENOMEM ? rc : STRATA_EPROTO,
                               "recipe.architecture: %s", strata_diag_msg(&inner, rc));
    if (n > max_params)
        return strata_diag_set(diag, STRATA_EPROTO,
                               "recipe.architecture: %zu parameters, above the limit of %zu", n,
                               max_params);
    strata_model *m = NULL;
    if ((rc = strata_model_from_json(r->arch, alen, &m, &inner)) < 0)
        return strata_diag_set(diag, rc == STRATA_ENOMEM ? rc : STRATA_EPROTO,
                               "recipe.architecture: %s", strata_diag_msg(&inner, rc));
    strata_model_init_params(m, r->seed);
    if ((rc = strata_model_set_normalization(m, r->mean, r->std)) < 0) {
        strata_model_free(m);
        return strata_diag_set(diag, STRATA_EPROTO, "recipe: std %g refused", (double)r->std);
    }
    char got[STRATA_DIGEST_HEX_SIZE];
    strata_downlink_digest(strata_model_params(m), got);
    if (strcmp(got, r->digest) != 0) {
        strata_model_free(m);
        return strata_diag_set(diag, STRATA_EPROTO,
                               "the model built from the recipe has digest %.16s..., version 0's "
                               "is %.16s...",
                               got, r->digest);
    }
    *out = m;
    return STRATA_OK;
}
