/* Models (strata/model.h): architecture parsing, parameters, activation
 * buffers, the element-wise layers, the loss, the reference linear layer
 * (BLAS sgemm), and the forward and backward passes, which run
 * convolutions, linear layers and pooling on oneDNN (model_dnnl.c) or on
 * the reference kernels (model_ref.c and the linear layer here). */
#include "strata/model.h"
#include "model_internal.h"
#include "strata/fileio.h"

#include <cblas.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char MLP_JSON[] =
    "{\"name\":\"mlp\",\"input\":[1,28,28],\"layers\":["
    "{\"type\":\"flatten\"},"
    "{\"type\":\"linear\",\"name\":\"fc1\",\"out_features\":200},{\"type\":\"relu\"},"
    "{\"type\":\"linear\",\"name\":\"fc2\",\"out_features\":200},{\"type\":\"relu\"},"
    "{\"type\":\"linear\",\"name\":\"fc3\",\"out_features\":10}]}";

static const char CNN_JSON[] =
    "{\"name\":\"cnn\",\"input\":[1,28,28],\"layers\":["
    "{\"type\":\"conv2d\",\"name\":\"conv1\",\"out_channels\":32,\"kernel_size\":5,\"padding\":2},"
    "{\"type\":\"relu\"},{\"type\":\"maxpool2d\",\"kernel_size\":2},"
    "{\"type\":\"conv2d\",\"name\":\"conv2\",\"out_channels\":64,\"kernel_size\":5,\"padding\":2},"
    "{\"type\":\"relu\"},{\"type\":\"maxpool2d\",\"kernel_size\":2},"
    "{\"type\":\"flatten\"},"
    "{\"type\":\"linear\",\"name\":\"fc1\",\"out_features\":512},{\"type\":\"relu\"},"
    "{\"type\":\"linear\",\"name\":\"fc2\",\"out_features\":10}]}";

/* resnet: ResNet-18's layout (two basic blocks in each of four stages) at
 * widths 16, 32, 64 and 128 for 28x28 inputs, GroupNorm with 8 groups in
 * place of BatchNorm, a 3x3 stem without max pooling; PyTorch's torchvision
 * names (docs/architecture.md has the PyTorch definition). */
#define RN_CONV(N, C, S, K, P)                                                                     \
    "{\"type\":\"conv2d\",\"name\":\"" N "\",\"out_channels\":" C ",\"kernel_size\":" K            \
    ",\"stride\":" S ",\"padding\":" P ",\"bias\":false},"
#define RN_GN(N) "{\"type\":\"groupnorm\",\"name\":\"" N "\",\"num_groups\":8},"
#define RN_RELU "{\"type\":\"relu\"},"
#define RN_BODY(P, C, S)                                                                           \
    RN_CONV(P ".conv1", C, S, "3", "1")                                                            \
    RN_GN(P ".bn1") RN_RELU RN_CONV(P ".conv2", C, "1", "3", "1") RN_GN(P ".bn2")
#define RN_END(P, WITH)                                                                            \
    "{\"type\":\"add\",\"with\":\"" WITH "\"},{\"type\":\"relu\",\"id\":\"" P "\"},"
/* A block that keeps the shape: its input is added to its output. */
#define RN_BLOCK(P, C, IN) RN_BODY(P, C, "1") RN_END(P, IN)
/* A block that halves the image and doubles the channels: a strided 1x1
 * convolution and GroupNorm (downsample.0, .1) bring its input along. */
#define RN_DOWN(P, C, IN)                                                                          \
    RN_BODY(P, C, "2")                                                                             \
    "{\"type\":\"conv2d\",\"name\":\"" P ".downsample.0\",\"input\":\"" IN                         \
    "\",\"out_channels\":" C                                                                       \
    ",\"kernel_size\":1,\"stride\":2,\"bias\":false}," RN_GN(P ".downsample.1")                    \
        RN_END(P, P ".bn2")

static const char RESNET_JSON[] = "{\"name\":\"resnet\",\"input\":[1,28,28],\"layers\":[" RN_CONV(
    "conv1", "16", "1", "3",
    "1") RN_GN("bn1") "{\"type\":\"relu\",\"id\":\"relu\"}," RN_BLOCK("layer1.0", "16", "relu")
    RN_BLOCK("layer1.1", "16", "layer1.0") RN_DOWN("layer2.0", "32", "layer1.1")
        RN_BLOCK("layer2.1", "32", "layer2.0") RN_DOWN("layer3.0", "64", "layer2.1")
            RN_BLOCK("layer3.1", "64", "layer3.0") RN_DOWN("layer4.0", "128", "layer3.1")
                RN_BLOCK("layer4.1", "128",
                         "layer4.0") "{\"type\":\"global_avgpool2d\"},{\"type\":\"flatten\"},"
                                     "{\"type\":\"linear\",\"name\":\"fc\",\"out_features\":10}]}";

const char *strata_model_builtin_json(const char *name)
{
    if (name == NULL)
        return NULL;
    if (strcmp(name, "mlp") == 0)
        return MLP_JSON;
    if (strcmp(name, "cnn") == 0)
        return CNN_JSON;
    if (strcmp(name, "resnet") == 0)
        return RESNET_JSON;
    return NULL;
}

int strata_set_threads(int threads)
{
    if (threads <= 0) {
        const char *env = getenv("OMP_NUM_THREADS");
        threads = (env && atoi(env) > 0) ? atoi(env) : omp_get_num_procs();
    }
    omp_set_num_threads(threads);
    openblas_set_num_threads(threads);
    return threads;
}

/* ---- architecture parsing ---- */

/* Smallest GroupNorm eps. */
#define MIN_EPS 1e-10

static int get_int_field(json_t *obj, const char *key, int idx, int required, int def, int min,
                         int max, int *out, strata_diag *diag)
{
    json_t *v = json_object_get(obj, key);
    if (v == NULL) {
        if (required)
            return strata_diag_set(diag, STRATA_EINVAL, "layers[%d].%s: missing (required)", idx,
                                   key);
        *out = def;
        return STRATA_OK;
    }
    if (!json_is_integer(v) || json_integer_value(v) < min || json_integer_value(v) > max)
        return strata_diag_set(diag, STRATA_EINVAL,
                               "layers[%d].%s: expected an integer in [%d, %d]", idx, key, min,
                               max);
    *out = (int)json_integer_value(v);
    return STRATA_OK;
}

static int check_keys(json_t *obj, int idx, const char *const *allowed, strata_diag *diag)
{
    const char *key;
    json_t *v;
    json_object_foreach(obj, key, v)
    {
        int ok = strcmp(key, "id") == 0 || strcmp(key, "input") == 0;
        for (const char *const *a = allowed; *a; a++)
            if (strcmp(*a, key) == 0)
                ok = 1;
        if (!ok)
            return strata_diag_set(diag, STRATA_EINVAL, "layers[%d]: unknown key '%s'", idx, key);
    }
    return STRATA_OK;
}

static int add_param(strata_model *m, const char *lname, const char *suffix, int ndim,
                     const int64_t *shape, int idx, int *slot, strata_diag *diag)
{
    char name[STRATA_MAX_NAME];
    if ((size_t)snprintf(name, sizeof(name), "%s.%s", lname, suffix) >= sizeof(name))
        return strata_diag_set(diag, STRATA_EINVAL, "layers[%d].name: too long", idx);
    size_t numel;
    int rc = strata_shape_numel(ndim, shape, &numel);
    if (rc == STRATA_OK && numel > STRATA_MODEL_MAX_PARAMS - m->nparams)
        rc = STRATA_ETOOBIG;
    if (rc < 0)
        return strata_diag_set(diag, rc == STRATA_ETOOBIG ? STRATA_ETOOBIG : STRATA_EINVAL,
                               "layers[%d]: the model would have more than %zu parameters", idx,
                               (size_t)STRATA_MODEL_MAX_PARAMS);
    m->nparams += numel;
    if (m->dry)
        return STRATA_OK;
    if (strata_tensor_list_find(&m->params, name) != NULL)
        return strata_diag_set(diag, STRATA_EINVAL, "layers[%d].name: '%s' is used twice", idx,
                               lname);
    rc = strata_tensor_list_add(&m->params, name, ndim, shape, NULL);
    if (rc == STRATA_OK)
        rc = strata_tensor_list_add(&m->grads, name, ndim, shape, NULL);
    if (rc < 0)
        return strata_diag_set(diag, rc, "layers[%d]: cannot create parameter %s: %s", idx, name,
                               strata_strerror(rc));
    *slot = (int)m->params.count - 1;
    return STRATA_OK;
}

/* The index of the earlier layer (before idx) whose "id" or "name" is the
 * string value of key in layer idx, in *out; errors name the field. */
static int find_ref(json_t *layers, int idx, const char *key, int *out, strata_diag *diag)
{
    const char *ref = json_string_value(json_object_get(json_array_get(layers, idx), key));
    if (ref == NULL || ref[0] == '\0')
        return strata_diag_set(diag, STRATA_EINVAL,
                               "layers[%d].%s: expected the id or name of an earlier layer", idx,
                               key);
    for (int r = idx - 1; r >= 0; r--) {
        json_t *lr = json_array_get(layers, r);
        const char *id = json_string_value(json_object_get(lr, "id"));
        const char *name = json_string_value(json_object_get(lr, "name"));
        if ((id && strcmp(id, ref) == 0) || (name && strcmp(name, ref) == 0)) {
            *out = r;
            return STRATA_OK;
        }
    }
    return strata_diag_set(diag, STRATA_EINVAL,
                           "layers[%d].%s: no earlier layer has the id or name '%s'", idx, key,
                           ref);
}

/* Checks layer idx's "id" and "name": each, when it is a string, must be
 * non-empty (an id must be a string) and used by no earlier layer as its id
 * or name, so that a reference names one layer and parameter names do not
 * collide. Checked while counting too, so that counting and building agree. */
static int check_id(json_t *layers, int idx, strata_diag *diag)
{
    static const char *const keys[] = {"id", "name"};
    json_t *lj = json_array_get(layers, idx);
    for (int k = 0; k < 2; k++) {
        json_t *v = json_object_get(lj, keys[k]);
        if (v == NULL || (k == 1 && !json_is_string(v)))
            continue; /* a name that is not a string: parse_layer says so */
        const char *id = json_string_value(v);
        if (id == NULL || id[0] == '\0')
            return strata_diag_set(diag, STRATA_EINVAL,
                                   "layers[%d].%s: expected a non-empty string", idx, keys[k]);
        for (int r = 0; r < idx; r++) {
            json_t *lr = json_array_get(layers, r);
            const char *o = json_string_value(json_object_get(lr, "id"));
            const char *name = json_string_value(json_object_get(lr, "name"));
            if ((o && strcmp(o, id) == 0) || (name && strcmp(name, id) == 0))
                return strata_diag_set(diag, STRATA_EINVAL,
                                       "layers[%d].%s: '%s' is already used by layers[%d]", idx,
                                       keys[k], id, r);
        }
    }
    return STRATA_OK;
}

static int parse_layer(strata_model *m, json_t *lj, int idx, int *c, int *h, int *w, int *flat,
                       strata_diag *diag)
{
    static const char *const k_linear[] = {"type", "name", "out_features", "bias", NULL};
    static const char *const k_conv[] = {"type",   "name",    "out_channels", "kernel_size",
                                         "stride", "padding", "bias",         NULL};
    static const char *const k_pool[] = {"type", "kernel_size", "stride", NULL};
    static const char *const k_plain[] = {"type", NULL};
    static const char *const k_drop[] = {"type", "p", NULL};
    static const char *const k_norm[] = {"type", "name", "num_groups", "eps", NULL};
    static const char *const k_add[] = {"type", "with", NULL};
    if (!json_is_object(lj))
        return strata_diag_set(diag, STRATA_EINVAL, "layers[%d]: expected an object", idx);
    const char *type = json_string_value(json_object_get(lj, "type"));
    if (type == NULL)
        return strata_diag_set(diag, STRATA_EINVAL, "layers[%d].type: missing or not a string",
                               idx);
    layer *L = &m->layers[idx];
    int src = L->src, with = L->with; /* set by the caller */
    memset(L, 0, sizeof(*L));
    L->w = L->b = -1;
    L->src = src;
    L->with = with;
    L->in_c = *c;
    L->in_h = *h;
    L->in_w = *w;
    L->in_dim = (size_t)*c * (size_t)*h * (size_t)*w;
    int rc;
    const char *lname = NULL;
    if (strcmp(type, "linear") == 0 || strcmp(type, "conv2d") == 0 ||
        strcmp(type, "groupnorm") == 0) {
        lname = json_string_value(json_object_get(lj, "name"));
        if (lname == NULL || lname[0] == '\0')
            return strata_diag_set(diag, STRATA_EINVAL,
                                   "layers[%d].name: missing or not a non-empty string", idx);
        json_t *bias = json_object_get(lj, "bias");
        if (type[0] == 'g')
            bias = NULL; /* groupnorm: always a weight and a bias */
        if (bias != NULL && !json_is_boolean(bias))
            return strata_diag_set(diag, STRATA_EINVAL, "layers[%d].bias: expected true or false",
                                   idx);
        L->has_bias = bias == NULL || json_is_true(bias);
    }
    if (strcmp(type, "linear") == 0) {
        if ((rc = check_keys(lj, idx, k_linear, diag)) < 0)
            return rc;
        if (!*flat)
            return strata_diag_set(diag, STRATA_EINVAL,
                                   "layers[%d]: linear needs a flat input; add a flatten layer "
                                   "before it",
                                   idx);
        int out = 0;
        if ((rc = get_int_field(lj, "out_features", idx, 1, 0, 1, 1 << 20, &out, diag)) < 0)
            return rc;
        if ((size_t)out * L->in_dim > ((size_t)1 << 31))
            return strata_diag_set(diag, STRATA_EINVAL, "layers[%d]: weight matrix too large", idx);
        L->kind = L_LINEAR;
        int64_t ws[2] = {out, (int64_t)L->in_dim}, bs[1] = {out};
        if ((rc = add_param(m, lname, "weight", 2, ws, idx, &L->w, diag)) < 0)
            return rc;
        if (L->has_bias && (rc = add_param(m, lname, "bias", 1, bs, idx, &L->b, diag)) < 0)
            return rc;
        *c = out;
        *h = *w = 1;
    } else if (strcmp(type, "conv2d") == 0) {
        if ((rc = check_keys(lj, idx, k_conv, diag)) < 0)
            return rc;
        if (*flat)
            return strata_diag_set(diag, STRATA_EINVAL,
                                   "layers[%d]: conv2d needs an image input, not a flat one", idx);
        int oc = 0, k = 0, s = 1, p = 0;
        if ((rc = get_int_field(lj, "out_channels", idx, 1, 0, 1, 65536, &oc, diag)) < 0 ||
            (rc = get_int_field(lj, "kernel_size", idx, 1, 0, 1, 64, &k, diag)) < 0 ||
            (rc = get_int_field(lj, "stride", idx, 0, 1, 1, 64, &s, diag)) < 0 ||
            (rc = get_int_field(lj, "padding", idx, 0, 0, 0, 64, &p, diag)) < 0)
            return rc;
        if (*h + 2 * p < k || *w + 2 * p < k)
            return strata_diag_set(diag, STRATA_EINVAL,
                                   "layers[%d].kernel_size: %d is larger than the padded input "
                                   "%dx%d",
                                   idx, k, *h + 2 * p, *w + 2 * p);
        L->kind = L_CONV2D;
        L->k = k;
        L->stride = s;
        L->pad = p;
        int64_t ws[4] = {oc, *c, k, k}, bs[1] = {oc};
        if ((rc = add_param(m, lname, "weight", 4, ws, idx, &L->w, diag)) < 0)
            return rc;
        if (L->has_bias && (rc = add_param(m, lname, "bias", 1, bs, idx, &L->b, diag)) < 0)
            return rc;
        *h = (*h + 2 * p - k) / s + 1;
        *w = (*w + 2 * p - k) / s + 1;
        *c = oc;
    } else if (strcmp(type, "maxpool2d") == 0 || strcmp(type, "avgpool2d") == 0) {
        if ((rc = check_keys(lj, idx, k_pool, diag)) < 0)
            return rc;
        if (*flat)
            return strata_diag_set(diag, STRATA_EINVAL,
                                   "layers[%d]: %s needs an image input, not a flat one", idx,
                                   type);
        int k = 0, s = 1;
        if ((rc = get_int_field(lj, "kernel_size", idx, 1, 0, 1, 64, &k, diag)) < 0 ||
            (rc = get_int_field(lj, "stride", idx, 0, k, 1, 64, &s, diag)) < 0)
            return rc;
        if (*h < k || *w < k)
            return strata_diag_set(diag, STRATA_EINVAL,
                                   "layers[%d].kernel_size: %d is larger than the input %dx%d", idx,
                                   k, *h, *w);
        L->kind = type[0] == 'm' ? L_MAXPOOL : L_AVGPOOL;
        L->kh = L->kw = k;
        L->stride = s;
        *h = (*h - k) / s + 1;
        *w = (*w - k) / s + 1;
    } else if (strcmp(type, "global_avgpool2d") == 0) {
        if ((rc = check_keys(lj, idx, k_plain, diag)) < 0)
            return rc;
        if (*flat)
            return strata_diag_set(diag, STRATA_EINVAL,
                                   "layers[%d]: global_avgpool2d needs an image input, not a flat "
                                   "one",
                                   idx);
        L->kind = L_AVGPOOL;
        L->kh = *h;
        L->kw = *w;
        L->stride = 1;
        *h = *w = 1;
    } else if (strcmp(type, "groupnorm") == 0) {
        if ((rc = check_keys(lj, idx, k_norm, diag)) < 0)
            return rc;
        int g = 0;
        if ((rc = get_int_field(lj, "num_groups", idx, 1, 0, 1, 65536, &g, diag)) < 0)
            return rc;
        if (*c % g != 0)
            return strata_diag_set(diag, STRATA_EINVAL,
                                   "layers[%d].num_groups: %d does not divide the %d channels", idx,
                                   g, *c);
        json_t *ev = json_object_get(lj, "eps");
        double eps = 1e-5;
        if (ev != NULL) {
            /* From 1e-10: a smaller one (float32 rounds 1e-46 to 0) would
             * divide by a zero variance. */
            if (!json_is_number(ev) || !(json_number_value(ev) >= MIN_EPS) ||
                json_number_value(ev) > 1.0)
                return strata_diag_set(diag, STRATA_EINVAL,
                                       "layers[%d].eps: expected a number in [1e-10, 1]", idx);
            eps = json_number_value(ev);
        }
        L->kind = L_GROUPNORM;
        L->groups = g;
        L->eps = (float)eps;
        int64_t cs[1] = {*c};
        if ((rc = add_param(m, lname, "weight", 1, cs, idx, &L->w, diag)) < 0 ||
            (rc = add_param(m, lname, "bias", 1, cs, idx, &L->b, diag)) < 0)
            return rc;
    } else if (strcmp(type, "add") == 0) {
        if ((rc = check_keys(lj, idx, k_add, diag)) < 0)
            return rc;
        const layer *O = &m->layers[with - 1];
        if (O->out_c != *c || O->out_h != *h || O->out_w != *w || O->flat != *flat)
            return strata_diag_set(diag, STRATA_EINVAL,
                                   "layers[%d].with: adds a %dx%dx%d output to a %dx%dx%d input; "
                                   "the shapes must be equal",
                                   idx, O->out_c, O->out_h, O->out_w, *c, *h, *w);
        L->kind = L_ADD;
    } else if (strcmp(type, "relu") == 0 || strcmp(type, "flatten") == 0) {
        if ((rc = check_keys(lj, idx, k_plain, diag)) < 0)
            return rc;
        L->kind = type[0] == 'r' ? L_RELU : L_FLATTEN;
        if (L->kind == L_FLATTEN) {
            *c = *c * *h * *w;
            *h = *w = 1;
            *flat = 1;
        }
    } else if (strcmp(type, "dropout") == 0) {
        if ((rc = check_keys(lj, idx, k_drop, diag)) < 0)
            return rc;
        json_t *pv = json_object_get(lj, "p");
        double p = 0.5;
        if (pv != NULL) {
            /* Checked in float32 too: 0.99999999 would round to 1. */
            if (!json_is_number(pv) || json_number_value(pv) < 0.0 ||
                !((float)json_number_value(pv) < 1.0f))
                return strata_diag_set(diag, STRATA_EINVAL,
                                       "layers[%d].p: expected a number in [0, 1)", idx);
            p = json_number_value(pv);
        }
        L->kind = L_DROPOUT;
        L->p = (float)p;
    } else {
        return strata_diag_set(diag, STRATA_EINVAL,
                               "layers[%d].type: unknown layer type '%s' (expected linear, "
                               "conv2d, maxpool2d, avgpool2d, global_avgpool2d, groupnorm, add, "
                               "relu, flatten or dropout)",
                               idx, type);
    }
    L->out_c = *c;
    L->out_h = *h;
    L->out_w = *w;
    L->flat = *flat;
    L->out_dim = (size_t)*c * (size_t)*h * (size_t)*w;
    return STRATA_OK;
}

/* Resolves layer idx's "input" and "with" into L->src and L->with and sets
 * the input geometry (*c, *h, *w, *flat) to that of its input. */
static int layer_inputs(strata_model *m, json_t *layers, int idx, int *c, int *h, int *w, int *flat,
                        strata_diag *diag)
{
    json_t *lj = json_array_get(layers, idx);
    layer *L = &m->layers[idx];
    L->src = idx;
    L->with = -1;
    int rc = check_id(layers, idx, diag), r;
    if (rc == STRATA_OK && json_object_get(lj, "input") != NULL) {
        if ((rc = find_ref(layers, idx, "input", &r, diag)) < 0)
            return rc;
        const layer *from = &m->layers[r];
        L->src = r + 1;
        *c = from->out_c;
        *h = from->out_h;
        *w = from->out_w;
        *flat = from->flat;
    }
    const char *type = json_string_value(json_object_get(lj, "type"));
    if (rc == STRATA_OK && type != NULL && strcmp(type, "add") == 0) {
        if ((rc = find_ref(layers, idx, "with", &r, diag)) < 0)
            return rc;
        L->with = r + 1;
    }
    return rc;
}

/* Every activation but the logits must be read by some layer; the reader
 * that runs last forward is the first backward and writes the gradient,
 * the others add to it. */
static int link_readers(strata_model *m, strata_diag *diag)
{
    unsigned char seen[MAX_LAYERS + 1] = {0};
    for (int i = m->nlayers - 1; i >= 0; i--) {
        layer *L = &m->layers[i];
        L->acc_src = seen[L->src];
        seen[L->src] = 1;
        if (L->kind == L_ADD) {
            L->acc_with = seen[L->with];
            seen[L->with] = 1;
        }
    }
    for (int k = 1; k < m->nlayers; k++)
        if (!seen[k])
            return strata_diag_set(diag, STRATA_EINVAL,
                                   "layers[%d]: its output is never used (no later layer reads it)",
                                   k - 1);
    return STRATA_OK;
}

/* Parses an architecture. dry: only count the parameters (*nparams), build
 * nothing and allocate no tensor. */
static int parse_arch(const char *json, size_t len, int dry, strata_model **out, size_t *nparams,
                      strata_diag *diag)
{
    *out = NULL;
    if (len > MAX_ARCH_BYTES)
        return strata_diag_set(diag, STRATA_ETOOBIG, "architecture JSON larger than %u bytes",
                               MAX_ARCH_BYTES);
    json_error_t jerr;
    json_t *root = json_loadb(json, len, JSON_REJECT_DUPLICATES, &jerr);
    if (root == NULL)
        return strata_diag_set(diag, STRATA_EINVAL, "architecture JSON, line %d column %d: %s",
                               jerr.line, jerr.column, jerr.text);
    int rc = STRATA_EINVAL;
    strata_model *m = calloc(1, sizeof(*m));
    if (m == NULL) {
        json_decref(root);
        return STRATA_ENOMEM;
    }
    strata_tensor_list_init(&m->params);
    strata_tensor_list_init(&m->grads);
    m->std = 1.0f;
    m->dry = dry;
    if (!json_is_object(root)) {
        rc = strata_diag_set(diag, STRATA_EINVAL, "architecture: expected a JSON object");
        goto out;
    }
    const char *key;
    json_t *val;
    json_object_foreach(root, key, val)
    {
        if (strcmp(key, "name") != 0 && strcmp(key, "input") != 0 && strcmp(key, "layers") != 0) {
            rc = strata_diag_set(diag, STRATA_EINVAL, "architecture: unknown key '%s'", key);
            goto out;
        }
    }
    json_t *name = json_object_get(root, "name");
    if (name != NULL && !json_is_string(name)) {
        rc = strata_diag_set(diag, STRATA_EINVAL, "name: expected a string");
        goto out;
    }
    json_t *input = json_object_get(root, "input");
    size_t nin = json_array_size(input);
    if (!json_is_array(input) || (nin != 1 && nin != 3)) {
        rc = strata_diag_set(diag, STRATA_EINVAL,
                             "input: expected [channels, height, width] or [features]");
        goto out;
    }
    int dims[3] = {1, 1, 1};
    for (size_t i = 0; i < nin; i++) {
        json_t *d = json_array_get(input, i);
        if (!json_is_integer(d) || json_integer_value(d) < 1 ||
            json_integer_value(d) > MAX_DIM_SIZE) {
            rc = strata_diag_set(diag, STRATA_EINVAL, "input[%zu]: expected an integer in [1, %d]",
                                 i, MAX_DIM_SIZE);
            goto out;
        }
        dims[i] = (int)json_integer_value(d);
    }
    if ((size_t)dims[0] * dims[1] * dims[2] > ((size_t)1 << 24)) {
        rc = strata_diag_set(diag, STRATA_EINVAL, "input: more than 2^24 values per sample");
        goto out;
    }
    json_t *layers = json_object_get(root, "layers");
    if (!json_is_array(layers) || json_array_size(layers) == 0) {
        rc = strata_diag_set(diag, STRATA_EINVAL, "layers: expected a non-empty array");
        goto out;
    }
    if (json_array_size(layers) > MAX_LAYERS) {
        rc = strata_diag_set(diag, STRATA_EINVAL, "layers: at most %d layers", MAX_LAYERS);
        goto out;
    }
    int c = dims[0], h = dims[1], w = dims[2], flat = nin == 1;
    size_t max_dim = (size_t)c * h * w;
    for (size_t i = 0; i < json_array_size(layers); i++) {
        rc = layer_inputs(m, layers, (int)i, &c, &h, &w, &flat, diag);
        if (rc == STRATA_OK)
            rc = parse_layer(m, json_array_get(layers, i), (int)i, &c, &h, &w, &flat, diag);
        if (rc < 0)
            goto out;
        m->nlayers++;
        size_t od = m->layers[i].out_dim;
        if (od > ((size_t)1 << 24)) {
            rc = strata_diag_set(diag, STRATA_EINVAL,
                                 "layers[%zu]: more than 2^24 outputs per sample", i);
            goto out;
        }
        if (od > max_dim)
            max_dim = od;
    }
    m->max_dim = max_dim;
    if ((rc = link_readers(m, diag)) < 0)
        goto out;
    if (nparams != NULL)
        *nparams = m->nparams;
    if (dry) {
        rc = STRATA_OK;
        goto out;
    }
    m->arch = json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER);
    if (m->arch == NULL) {
        rc = STRATA_ENOMEM;
        goto out;
    }
    rc = STRATA_OK;
out:
    json_decref(root);
    if (rc < 0 || dry)
        strata_model_free(m);
    else
        *out = m;
    return rc;
}

int strata_model_from_json(const char *json, size_t len, strata_model **out, strata_diag *diag)
{
    return parse_arch(json, len, 0, out, NULL, diag);
}

int strata_model_count_params(const char *json, size_t len, size_t *count, strata_diag *diag)
{
    strata_model *unused;
    *count = 0;
    return parse_arch(json, len, 1, &unused, count, diag);
}

int strata_model_new(const char *spec, strata_model **out, strata_diag *diag)
{
    *out = NULL;
    const char *builtin = strata_model_builtin_json(spec);
    if (builtin != NULL)
        return strata_model_from_json(builtin, strlen(builtin), out, diag);
    uint8_t *buf = NULL;
    size_t n = 0;
    strata_diag rd;
    int rc = spec ? strata_file_read_all(spec, MAX_ARCH_BYTES, &buf, &n, &rd) : STRATA_EINVAL;
    if (rc == STRATA_ETOOBIG)
        return strata_diag_set(diag, STRATA_ETOOBIG, "%s: larger than %u bytes", spec,
                               MAX_ARCH_BYTES);
    if (rc == STRATA_ENOMEM)
        return STRATA_ENOMEM;
    if (rc < 0)
        return strata_diag_set(diag, STRATA_EINVAL,
                               "model '%s': not a built-in model (mlp, cnn, resnet) nor a readable "
                               "architecture JSON file",
                               spec ? spec : "(null)");
    rc = strata_model_from_json((const char *)buf, n, out, diag);
    free(buf);
    return rc;
}

static void free_grads(strata_model *m)
{
    for (int i = 1; i <= m->nlayers; i++) {
        strata_free_floats(m->gact[i]);
        m->gact[i] = NULL;
    }
    strata_free_floats(m->gtmp);
    strata_free_floats(m->dinput);
    m->gtmp = m->dinput = NULL;
    m->cap_grad = 0;
}

static void free_buffers(strata_model *m)
{
    if (m->act != NULL)
        for (int i = 0; i <= m->nlayers; i++)
            strata_free_floats(m->act[i]);
    free(m->act);
    m->act = NULL;
    if (m->gact != NULL)
        free_grads(m);
    free(m->gact);
    m->gact = NULL;
    for (int i = 0; i < m->nlayers; i++) {
        strata_free_floats(m->layers[i].mask);
        strata_free_floats(m->layers[i].stats);
        free(m->layers[i].chs);
        m->layers[i].mask = m->layers[i].stats = NULL;
        m->layers[i].chs = NULL;
    }
    strata__ref_free(m);
    strata_free_floats(m->probs);
    m->probs = NULL;
    m->cap_batch = 0;
}

void strata_model_free(strata_model *m)
{
    if (m == NULL)
        return;
    free_buffers(m);
    strata__dnnl_free(m->dnnl);
    strata_tensor_list_cleanup(&m->params);
    strata_tensor_list_cleanup(&m->grads);
    free(m->arch);
    free(m);
}

const char *strata_model_arch(const strata_model *m)
{
    return m->arch;
}

strata_tensor_list *strata_model_params(strata_model *m)
{
    return &m->params;
}

strata_tensor_list *strata_model_grads(strata_model *m)
{
    return &m->grads;
}

size_t strata_model_input_dim(const strata_model *m)
{
    return m->layers[0].in_dim;
}

size_t strata_model_output_dim(const strata_model *m)
{
    return m->layers[m->nlayers - 1].out_dim;
}

void strata_model_init_params(strata_model *m, uint64_t seed)
{
    strata_rng rng;
    strata_rng_seed(&rng, seed, 0x5eed);
    for (int i = 0; i < m->nlayers; i++) {
        layer *L = &m->layers[i];
        if (L->w < 0)
            continue;
        strata_tensor *w = &m->params.items[L->w];
        if (L->kind == L_GROUPNORM) { /* the identity: weight 1, bias 0 */
            for (size_t j = 0; j < w->numel; j++)
                w->data[j] = 1.0f;
            memset(m->params.items[L->b].data, 0, w->numel * sizeof(float));
            continue;
        }
        size_t fan_in = w->numel / (size_t)w->shape[0];
        double bound = 1.0 / sqrt((double)fan_in);
        for (size_t j = 0; j < w->numel; j++)
            w->data[j] = (float)((2.0 * strata_rng_uniform(&rng) - 1.0) * bound);
        if (L->b >= 0) {
            strata_tensor *b = &m->params.items[L->b];
            for (size_t j = 0; j < b->numel; j++)
                b->data[j] = (float)((2.0 * strata_rng_uniform(&rng) - 1.0) * bound);
        }
    }
}

int strata_model_set_normalization(strata_model *m, float mean, float std)
{
    if (!(std > 0.0f) || !isfinite(mean) || !isfinite(std))
        return STRATA_EINVAL;
    m->mean = mean;
    m->std = std;
    return STRATA_OK;
}

void strata_model_get_normalization(const strata_model *m, float *mean, float *std)
{
    *mean = m->mean;
    *std = m->std;
}

void strata_model_set_input_grad(strata_model *m, int on)
{
    m->input_grad = on != 0;
}

const float *strata_model_input_grad(const strata_model *m)
{
    return m->dinput;
}

void strata__model_set_reference(strata_model *m, int on)
{
    m->reference = on != 0;
}

const char *strata__model_kernels(const strata_model *m)
{
    return m->dnnl_active ? "onednn" : "reference";
}

static int ensure_batch(strata_model *m, size_t batch)
{
    if (batch <= m->cap_batch)
        return STRATA_OK;
    /* Every buffer, and every BLAS dimension (an int), must stay below 2^31
     * elements. */
    const size_t cap = (size_t)INT_MAX;
    if (batch > ((size_t)1 << 20) || m->max_dim > cap / batch)
        return STRATA_ETOOBIG;
    for (int i = 0; i < m->nlayers; i++)
        if (m->layers[i].kind == L_CONV2D &&
            (strata__conv_p(&m->layers[i]) > cap / batch ||
             strata__conv_k(&m->layers[i]) > cap / (batch * strata__conv_p(&m->layers[i]))))
            return STRATA_ETOOBIG;
    free_buffers(m);
    m->act = calloc((size_t)m->nlayers + 1, sizeof(float *));
    m->gact = calloc((size_t)m->nlayers + 1, sizeof(float *));
    if (m->act == NULL || m->gact == NULL) {
        free_buffers(m);
        return STRATA_ENOMEM;
    }
    int ok = 1;
    m->act[0] = strata_alloc_floats(batch * m->layers[0].in_dim);
    ok &= m->act[0] != NULL;
    for (int i = 0; i < m->nlayers && ok; i++) {
        layer *L = &m->layers[i];
        m->act[i + 1] = strata_alloc_floats(batch * L->out_dim);
        ok &= m->act[i + 1] != NULL;
        if (L->kind == L_DROPOUT) {
            L->mask = strata_alloc_floats(batch * L->out_dim);
            ok &= L->mask != NULL;
        } else if (L->kind == L_GROUPNORM) {
            L->stats = strata_alloc_floats(4 * batch * (size_t)L->groups);
            L->chs = malloc(2 * batch * (size_t)L->in_c * sizeof(double));
            ok &= L->stats != NULL && L->chs != NULL;
        }
    }
    if (ok) {
        m->probs = strata_alloc_floats(batch * strata_model_output_dim(m));
        ok = m->probs != NULL;
    }
    if (!ok) {
        free_buffers(m);
        return STRATA_ENOMEM;
    }
    m->cap_batch = batch;
    return STRATA_OK;
}

/* The gradient buffers, for the batch of the last forward pass, made by a
 * backward pass that needs more than they hold: a model that only
 * evaluates (the coordinator's) never holds them, about half of its
 * per-batch memory on oneDNN, and a larger evaluation batch between
 * training steps (strata-tool train) does not size them. */
static int ensure_grads(strata_model *m, size_t batch)
{
    if (m->cap_grad >= batch)
        return STRATA_OK;
    free_grads(m);
    int ok = 1;
    for (int i = 0; i < m->nlayers && ok; i++) {
        m->gact[i + 1] = strata_alloc_floats(batch * m->layers[i].out_dim);
        ok = m->gact[i + 1] != NULL;
    }
    if (ok) {
        m->gtmp = strata_alloc_floats(batch * m->max_dim);
        m->dinput = strata_alloc_floats(batch * m->layers[0].in_dim);
        ok = m->gtmp != NULL && m->dinput != NULL;
    }
    if (!ok) {
        free_grads(m);
        return STRATA_ENOMEM;
    }
    m->cap_grad = batch;
    return STRATA_OK;
}

/* ---- kernels ---- */

static void linear_forward(strata_model *m, layer *L, const float *x, float *y, size_t B)
{
    const int in = (int)L->in_dim, out = (int)L->out_dim;
    const float *w = m->params.items[L->w].data;
    if (L->b >= 0) {
        const float *bias = m->params.items[L->b].data;
        for (size_t b = 0; b < B; b++)
            memcpy(y + b * out, bias, (size_t)out * sizeof(float));
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)B, out, in, 1.0f, x, in, w, in,
                L->b >= 0 ? 1.0f : 0.0f, y, out);
}

static void linear_backward(strata_model *m, layer *L, const float *x, const float *dy, float *dx,
                            size_t B)
{
    const int in = (int)L->in_dim, out = (int)L->out_dim;
    float *gw = m->grads.items[L->w].data;
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, out, in, (int)B, 1.0f, dy, out, x, in,
                0.0f, gw, in);
    if (L->b >= 0) {
        float *gb = m->grads.items[L->b].data;
        for (int o = 0; o < out; o++) {
            float s = 0.0f;
            for (size_t b = 0; b < B; b++)
                s += dy[b * out + o];
            gb[o] = s;
        }
    }
    if (dx != NULL) {
        const float *w = m->params.items[L->w].data;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)B, in, out, 1.0f, dy, out, w,
                    in, 0.0f, dx, in);
    }
}

int strata_model_forward(strata_model *m, const float *x, size_t batch, int training,
                         strata_rng *rng, const float **logits)
{
    *logits = NULL;
    if (batch == 0)
        return STRATA_EINVAL;
    m->batch = 0; /* no valid forward pass until this one completes */
    int rc = ensure_batch(m, batch);
    if (rc < 0)
        return rc;
    int dn = 0, dnnl_layers = 0; /* conv2d, linear or pooling present */
    for (int li = 0; li < m->nlayers; li++) {
        layer_kind k = m->layers[li].kind;
        dnnl_layers |= k == L_LINEAR || k == L_CONV2D || k == L_MAXPOOL || k == L_AVGPOOL;
    }
    if (dnnl_layers && !m->reference && !m->dnnl_unusable) {
        rc = strata__dnnl_prepare(m, batch);
        if (rc == STRATA_ENOMEM)
            return rc;
        m->dnnl_unusable = rc < 0;
        dn = rc == STRATA_OK;
    }
    m->dnnl_active = dn;
    if (!dn && (rc = strata__ref_ensure(m)) < 0)
        return rc;
    const size_t n0 = batch * m->layers[0].in_dim;
    const float mean = m->mean, inv = 1.0f / m->std;
    float *a0 = m->act[0];
#pragma omp parallel for schedule(static) if (n0 >= PAR_MIN)
    for (size_t i = 0; i < n0; i++)
        a0[i] = (x[i] - mean) * inv;
    for (int li = 0; li < m->nlayers; li++) {
        layer *L = &m->layers[li];
        const float *in = m->act[L->src];
        float *o = m->act[li + 1];
        const size_t n = batch * L->out_dim;
        switch (L->kind) {
        case L_LINEAR:
            if (dn)
                rc = strata__dnnl_linear_forward(
                    m, li, in, strata__dnnl_fused_relu(m, li) ? m->act[li + 2] : o);
            else
                linear_forward(m, L, in, o, batch);
            break;
        case L_CONV2D:
            if (dn)
                rc = strata__dnnl_conv_forward(m, li, in,
                                               strata__dnnl_fused_relu(m, li) ? m->act[li + 2] : o);
            else
                strata__ref_conv_forward(m, L, in, o, batch);
            break;
        case L_MAXPOOL:
        case L_AVGPOOL:
            if (dn)
                rc = strata__dnnl_pool_forward(m, li, in, o);
            else if (L->kind == L_MAXPOOL)
                strata__ref_maxpool_forward(L, in, o, batch);
            else
                strata__avgpool_forward(L, in, o, batch);
            break;
        case L_GROUPNORM:
            strata__groupnorm_forward(m, L, in, o, batch, dn && strata__dnnl_blocked(m, L->src));
            break;
        case L_ADD:
            strata__add(o, in, m->act[L->with], n);
            break;
        case L_RELU:
            if (dn && strata__dnnl_fused_relu(m, li - 1))
                break; /* computed by the layer before it */
#pragma omp parallel for schedule(static) if (n >= PAR_MIN)
            for (size_t i = 0; i < n; i++)
                o[i] = in[i] > 0.0f ? in[i] : 0.0f;
            break;
        case L_FLATTEN:
            if (dn)
                rc = strata__dnnl_flatten_forward(m, li, in, o);
            else
                memcpy(o, in, n * sizeof(float));
            break;
        case L_DROPOUT:
            if (!training || L->p == 0.0f) {
                for (size_t i = 0; i < n; i++)
                    L->mask[i] = 1.0f;
            } else {
                if (rng == NULL)
                    return STRATA_EINVAL;
                /* Drawn in plain element order whatever the layout, so that
                 * both kernel sets drop the same elements. */
                const float keep = 1.0f / (1.0f - L->p);
                for (size_t i = 0; i < n; i++)
                    L->mask[dn ? strata__dnnl_index(m, li, i) : i] =
                        strata_rng_uniform(rng) < L->p ? 0.0f : keep;
            }
            for (size_t i = 0; i < n; i++)
                o[i] = in[i] * L->mask[i];
            break;
        }
        if (rc < 0)
            return rc;
    }
    m->batch = batch;
    *logits = m->act[m->nlayers];
    return STRATA_OK;
}

/* Where the gradient of act[k] goes: gact[k], or the input gradient for
 * k = 0 (NULL when it is not wanted). */
static float *grad_of(strata_model *m, int k)
{
    if (k > 0)
        return m->gact[k];
    return m->input_grad ? m->dinput : NULL;
}

/* Passes dy (n floats) on to the gradient of act[k]: copied, or added when
 * acc (another reader wrote it first). */
static void pass_on(strata_model *m, int k, int acc, const float *dy, size_t n)
{
    float *g = grad_of(m, k);
    if (g == NULL)
        return;
    if (acc)
        strata__add(g, dy, NULL, n);
    else
        memcpy(g, dy, n * sizeof(float));
}

int strata_model_backward_from(strata_model *m, const float *dlogits)
{
    if (m->batch == 0)
        return STRATA_ESTATE;
    const size_t B = m->batch;
    int rc = ensure_grads(m, B);
    if (rc < 0)
        return rc;
    memcpy(m->gact[m->nlayers], dlogits, B * strata_model_output_dim(m) * sizeof(float));
    const int dn = m->dnnl_active;
    for (int li = m->nlayers - 1; li >= 0; li--) {
        layer *L = &m->layers[li];
        const float *dy = m->gact[li + 1];
        float *target = grad_of(m, L->src);
        /* A reader that is not the first to write its input's gradient
         * computes its share in gtmp and adds it. */
        float *dx = target != NULL && L->acc_src ? m->gtmp : target;
        const float *in = m->act[L->src], *out = m->act[li + 1];
        const size_t n = B * L->in_dim;
        switch (L->kind) {
        case L_LINEAR:
            if (dn)
                rc = strata__dnnl_linear_backward(m, li, in, dy, dx);
            else
                linear_backward(m, L, in, dy, dx, B);
            break;
        case L_CONV2D:
            if (dn)
                rc = strata__dnnl_conv_backward(m, li, in, dy, dx);
            else
                strata__ref_conv_backward(m, L, dy, dx, B);
            break;
        case L_MAXPOOL:
        case L_AVGPOOL:
            if (dx && dn)
                rc = strata__dnnl_pool_backward(m, li, dy, dx);
            else if (dx && L->kind == L_MAXPOOL)
                strata__ref_maxpool_backward(L, dy, dx, B);
            else if (dx)
                strata__avgpool_backward(L, dy, dx, B);
            break;
        case L_GROUPNORM:
            strata__groupnorm_backward(m, L, in, dy, dx, B, dn && strata__dnnl_blocked(m, L->src));
            break;
        case L_ADD: /* the second input after the first (they may be one) */
            if (dx)
                memcpy(dx, dy, n * sizeof(float));
            break;
        case L_RELU:
            if (dx) {
#pragma omp parallel for schedule(static) if (n >= PAR_MIN)
                for (size_t i = 0; i < n; i++) {
                    const float g = dy[i]; /* loaded unconditionally: the loop vectorises */
                    dx[i] = out[i] > 0.0f ? g : 0.0f;
                }
            }
            break;
        case L_FLATTEN:
            if (dx && dn)
                rc = strata__dnnl_flatten_backward(m, li, dy, dx);
            else if (dx)
                memcpy(dx, dy, n * sizeof(float));
            break;
        case L_DROPOUT:
            if (dx)
                for (size_t i = 0; i < n; i++)
                    dx[i] = dy[i] * L->mask[i];
            break;
        }
        if (rc < 0)
            return rc;
        if (dx != NULL && dx != target)
            strata__add(target, dx, NULL, n);
        if (L->kind == L_ADD)
            pass_on(m, L->with, L->acc_with, dy, n);
    }
    return STRATA_OK;
}

/* Softmax cross-entropy of the last forward; fills m->probs with the
 * gradient of the mean loss with respect to the logits. */
static int softmax_xent(strata_model *m, const uint8_t *labels, double *loss, size_t *correct)
{
    if (m->batch == 0)
        return STRATA_ESTATE;
    const size_t B = m->batch, C = strata_model_output_dim(m);
    const float *z = m->act[m->nlayers];
    for (size_t b = 0; b < B; b++)
        if (labels[b] >= C)
            return STRATA_EINVAL;
    double total = 0.0;
    size_t hits = 0;
    for (size_t b = 0; b < B; b++) {
        const float *zb = z + b * C;
        float *pb = m->probs + b * C;
        size_t arg = 0;
        for (size_t c = 1; c < C; c++)
            if (zb[c] > zb[arg])
                arg = c;
        hits += arg == labels[b];
        double sum = 0.0;
        for (size_t c = 0; c < C; c++) {
            double e = exp((double)zb[c] - (double)zb[arg]);
            pb[c] = (float)e;
            sum += e;
        }
        total += log(sum) - ((double)zb[labels[b]] - (double)zb[arg]);
        for (size_t c = 0; c < C; c++)
            pb[c] = (float)(pb[c] / sum / (double)B);
        pb[labels[b]] -= (float)(1.0 / (double)B);
    }
    if (loss)
        *loss = total / (double)B;
    if (correct)
        *correct = hits;
    return STRATA_OK;
}

int strata_model_loss(strata_model *m, const uint8_t *labels, double *loss, size_t *correct)
{
    return softmax_xent(m, labels, loss, correct);
}

int strata_model_backward(strata_model *m, const uint8_t *labels, double *loss, size_t *correct)
{
    int rc = softmax_xent(m, labels, loss, correct);
    if (rc < 0)
        return rc;
    return strata_model_backward_from(m, m->probs);
}
