#include "strata/checkpoint.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int strata_parse_normalization(const char *s, float *mean, float *std)
{
    char *end;
    double m = strtod(s, &end);
    if (end == s || *end != ',')
        return STRATA_EINVAL;
    const char *p = end + 1;
    double sd = strtod(p, &end);
    if (end == p || *end != '\0' || !isfinite(m) || !isfinite(sd) || !(sd > 0.0))
        return STRATA_EINVAL;
    *mean = (float)m;
    *std = (float)sd;
    return STRATA_OK;
}

int strata_checkpoint_metadata(const strata_model *m, strata_metadata *meta)
{
    float mean, std;
    char norm[64];
    strata_model_get_normalization(m, &mean, &std);
    snprintf(norm, sizeof(norm), "%.9g,%.9g", (double)mean, (double)std);
    int rc = strata_metadata_set(meta, STRATA_META_ARCH, strata_model_arch(m));
    if (rc == STRATA_OK)
        rc = strata_metadata_set(meta, STRATA_META_NORM, norm);
    return rc;
}

int strata_checkpoint_save(strata_model *m, const char *path, strata_diag *diag)
{
    strata_metadata meta;
    strata_metadata_init(&meta);
    int rc = strata_checkpoint_metadata(m, &meta);
    if (rc == STRATA_OK)
        rc = strata_safetensors_write(path, strata_model_params(m), &meta, diag);
    strata_metadata_cleanup(&meta);
    return rc;
}

/* Builds the model described by meta and moves tensors into it. */
static int build_from(strata_tensor_list *tensors, const strata_metadata *meta, strata_model **out,
                      strata_diag *diag)
{
    const char *arch = strata_metadata_get(meta, STRATA_META_ARCH);
    if (arch == NULL)
        return strata_diag_set(diag, STRATA_EPROTO, "checkpoint has no '%s' metadata entry",
                               STRATA_META_ARCH);
    /* The description is untrusted: check that it needs exactly the
     * parameters the file holds (bounded by the file's size) before building
     * it, so a tiny file cannot make us allocate a huge model. */
    strata_model *m = NULL;
    strata_diag inner = {{0}};
    size_t need = 0;
    int rc = strata_model_count_params(arch, strlen(arch), &need, &inner);
    if (rc < 0)
        return strata_diag_set(diag, STRATA_EPROTO, "checkpoint architecture: %s", inner.msg);
    if (need != strata_tensor_list_numel(tensors))
        return strata_diag_set(diag, STRATA_EPROTO,
                               "checkpoint tensors do not match its architecture (%zu parameters "
                               "in the file, %zu in the architecture)",
                               strata_tensor_list_numel(tensors), need);
    rc = strata_model_from_json(arch, strlen(arch), &m, &inner);
    if (rc < 0)
        return strata_diag_set(diag, STRATA_EPROTO, "checkpoint architecture: %s", inner.msg);
    strata_tensor_list *p = strata_model_params(m);
    if (!strata_tensor_list_same_layout(p, tensors)) {
        strata_model_free(m);
        return strata_diag_set(diag, STRATA_EPROTO,
                               "checkpoint tensors do not match its architecture (names, "
                               "shapes or order differ)");
    }
    strata_tensor_list_copy_values(p, tensors);
    const char *norm = strata_metadata_get(meta, STRATA_META_NORM);
    float mean = 0.0f, std = 1.0f;
    if (norm != NULL && strata_parse_normalization(norm, &mean, &std) < 0) {
        strata_model_free(m);
        return strata_diag_set(diag, STRATA_EPROTO,
                               "checkpoint '%s' is '%s', expected \"mean,std\" with std > 0",
                               STRATA_META_NORM, norm);
    }
    strata_model_set_normalization(m, mean, std);
    *out = m;
    return STRATA_OK;
}

int strata_checkpoint_load(const char *path, strata_model **out, strata_diag *diag)
{
    *out = NULL;
    strata_tensor_list t;
    strata_metadata meta;
    strata_tensor_list_init(&t);
    strata_metadata_init(&meta);
    int rc = strata_safetensors_read(path, 0, &t, &meta, diag);
    if (rc == STRATA_OK)
        rc = build_from(&t, &meta, out, diag);
    strata_tensor_list_cleanup(&t);
    strata_metadata_cleanup(&meta);
    return rc;
}

int strata_checkpoint_decode(const uint8_t *buf, size_t len, strata_model **out, strata_diag *diag)
{
    *out = NULL;
    strata_tensor_list t;
    strata_metadata meta;
    strata_tensor_list_init(&t);
    strata_metadata_init(&meta);
    int rc = strata_safetensors_decode(buf, len, &t, &meta, diag);
    if (rc == STRATA_OK)
        rc = build_from(&t, &meta, out, diag);
    strata_tensor_list_cleanup(&t);
    strata_metadata_cleanup(&meta);
    return rc;
}
