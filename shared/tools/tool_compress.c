/* strata-tool compress, decode, inspect and policy: payloads and budgets. */
#include "tool.h"

#include "strata/compress.h"
#include "strata/ef.h"
#include "strata/fileio.h"
#include "strata/log.h"
#include "strata/payload.h"
#include "strata/policy.h"
#include "strata/safetensors.h"

#include <errno.h>
#include <jansson.h>
#include <libgen.h>
#include <limits.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAX_PAYLOAD_FILE ((size_t)1 << 31)

static size_t *layer_sizes(const strata_tensor_list *t)
{
    size_t *n = malloc((t->count ? t->count : 1) * sizeof(size_t));
    for (size_t i = 0; n && i < t->count; i++)
        n[i] = t->items[i].numel;
    return n;
}

/* Per-layer budgets from a policy spec (a policy name, JSON, @file or a
 * compressor: the uniform policy with it, exactly as the coordinator
 * computes them); vf is the values format. Errors: those of the policy
 * parser, strata_policy_set_values and strata_policy_budgets; diag's message
 * starts with "--policy". */
static int make_budgets(const char *spec, const strata_tensor_list *t, double d0, uint32_t round,
                        uint32_t rounds, strata_values_format vf, strata_budget *budgets,
                        strata_diag *diag)
{
    strata_policy *p = NULL;
    strata_diag d = {{0}};
    int rc = strata_policy_parse(spec, &p, &d);
    size_t *sizes = NULL;
    if (rc == 0)
        rc = strata_policy_set_values(p, vf, &d);
    if (rc < 0)
        goto out;
    sizes = layer_sizes(t);
    rc = sizes ? strata_policy_budgets(p, sizes, t->count, d0, round, rounds, budgets, &d)
               : STRATA_ENOMEM;
out:
    free(sizes);
    strata_policy_free(p);
    if (rc < 0)
        strata_diag_set(diag, rc, "--policy: %s", strata_diag_msg(&d, rc));
    return rc;
}

static json_t *layout_json(const strata_tensor_list *t)
{
    json_t *arr = json_array();
    for (size_t i = 0; i < t->count; i++) {
        json_t *shape = json_array();
        for (int k = 0; k < t->items[i].ndim; k++)
            json_array_append_new(shape, json_integer(t->items[i].shape[k]));
        json_array_append_new(arr,
                              json_pack("{s:s,s:o}", "name", t->items[i].name, "shape", shape));
    }
    return arr;
}

typedef struct compress_opts {
    char *in, *out, *policy, *values, *residual; /* values NULL: fp32 */
    double density;
    long round, rounds, seed, level, client_id, model_version, samples;
} compress_opts;

#define OFF(f) offsetof(compress_opts, f)
static const strata_opt COMPRESS_OPTS[] = {
    {"in", STRATA_OPT_STRING, OFF(in), 0, 0, "FILE",
     "the model or delta to compress (safetensors);\nrequired"},
    {"policy", STRATA_OPT_STRING, OFF(policy), 0, 0, "SPEC",
     "a budget policy (uniform, legacy-layer,\nlegacy-phase, legacy, lgreco, JSON text or\n"
     "@file.json), or a compressor (the uniform policy\n"
     "with it): topk, randk, none, fp16, bf16, sign,\n"
     "qsgd:LEVELS, powersgd:RANK; required"},
    {"density", STRATA_OPT_DOUBLE, OFF(density), 1e-12, 1, "D",
     "target mean density, in (0, 1]; required"},
    {"out", STRATA_OPT_STRING, OFF(out), 0, 0, "P.bin", "the payload file to write; required"},
    {"values", STRATA_OPT_STRING, OFF(values), 0, 0, "F",
     "format of kept values: fp32 (default), fp16, bf16,\nint8 or ternary (the last two: topk and "
     "randk)"},
    {"residual", STRATA_OPT_STRING, OFF(residual), 0, 0, "FILE",
     "error-feedback state (safetensors): read when the\nfile exists, written back after"},
    {"round", STRATA_OPT_INTEGER, OFF(round), 0, (double)(UINT32_MAX - 1), "R",
     "this round of the run, from 0 (default 0)"},
    {"rounds", STRATA_OPT_INTEGER, OFF(rounds), 1, (double)UINT32_MAX, "T",
     "rounds in the run (default 1)"},
    {"seed", STRATA_OPT_INTEGER, OFF(seed), 0, (double)LONG_MAX, "S",
     "seed of the random compressors (default 1)"},
    {"level", STRATA_OPT_INTEGER, OFF(level), 1, 19, "L", "zstd level, 1-19 (default 1)"},
    {"client_id", STRATA_OPT_INTEGER, OFF(client_id), 0, (double)LONG_MAX, "C",
     "payload header: client id (default 0)"},
    {"model_version", STRATA_OPT_INTEGER, OFF(model_version), 0, (double)LONG_MAX, "V",
     "payload header: model version (default 0)"},
    {"samples", STRATA_OPT_INTEGER, OFF(samples), 0, (double)LONG_MAX, "N",
     "payload header: sample count (default 0)"},
};
#undef OFF

static const compress_opts COMPRESS_DEFAULTS = {.rounds = 1, .seed = 1, .level = 1};

/* compress's run (opts: a compress_opts): compresses --in into the payload
 * --out, carrying the error-feedback residual in --residual when given.
 * Nothing is written unless everything succeeds. Returns a TOOL_EXIT_*
 * code. */
static int run_compress(const void *opts, const char *arg)
{
    const compress_opts *o = opts;
    (void)arg;
    if (o->in == NULL || o->out == NULL || o->policy == NULL || o->density == 0.0)
        return tool_usage_error("compress: --in, --out, --policy and --density are required");
    strata_values_format vf = STRATA_VALUES_FP32;
    if (o->values != NULL && strata_values_format_parse(o->values, &vf) < 0)
        return tool_usage_error("--values: expected fp32, fp16, bf16, int8 or ternary, got '%s'",
                                o->values);
    if (o->round >= o->rounds)
        return tool_usage_error("--round %ld is outside a run of %ld rounds (rounds count from 0)",
                                o->round, o->rounds);
    const char *in = o->in, *out = o->out, *residual = o->residual;
    int code = TOOL_EXIT_FAIL, rc;
    strata_diag d = {{0}};
    strata_tensor_list t;
    strata_tensor_list_init(&t);
    strata_ef *ef = NULL;
    strata_budget *budgets = NULL;
    strata_clayer *layers = NULL;
    uint8_t *buf = NULL;
    size_t len = 0;
    char *meta = NULL, *tmp = NULL, *dir = NULL;
    if ((rc = strata_safetensors_read(in, 0, &t, NULL, &d)) < 0) {
        strata_log_error("%s", strata_diag_msg(&d, rc));
        goto out;
    }
    budgets = calloc(t.count ? t.count : 1, sizeof(*budgets));
    if (budgets == NULL) {
        strata_log_error("out of memory");
        goto out;
    }
    if ((rc = make_budgets(o->policy, &t, o->density, (uint32_t)o->round, (uint32_t)o->rounds, vf,
                           budgets, &d)) < 0) {
        code = tool_usage_error("%s", strata_diag_msg(&d, rc));
        goto out;
    }
    struct stat st;
    if (residual != NULL && stat(residual, &st) == 0)
        rc = strata_ef_load(residual, &t, &ef, &d);
    else
        rc = strata_ef_new(&t, 1.0, 0, &ef);
    if (rc < 0) {
        strata_log_error("residual %s: %s", residual ? residual : "", strata_diag_msg(&d, rc));
        goto out;
    }
    if ((rc = strata_ef_step(ef, &t, budgets, (uint32_t)o->round, (uint64_t)o->seed, &layers, &d)) <
        0) {
        strata_log_error("compression failed: %s", strata_diag_msg(&d, rc));
        goto out;
    }
    double *norms = calloc(t.count ? t.count : 1, sizeof(double));
    json_t *norms_j = json_array();
    if (norms != NULL && strata_ef_residual_norms(ef, norms, t.count) == 0)
        for (size_t i = 0; i < t.count; i++)
            json_array_append_new(norms_j, json_real(norms[i]));
    free(norms);
    json_t *mj = json_pack("{s:o,s:o}", "tensors", layout_json(&t), "residual_norms", norms_j);
    meta = json_dumps(mj, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(mj);
    strata_payload p = {.round = (uint32_t)o->round,
                        .model_version = (uint64_t)o->model_version,
                        .client_id = (uint64_t)o->client_id,
                        .sample_count = (uint64_t)o->samples,
                        .num_layers = t.count,
                        .layers = layers,
                        .metadata_json = meta};
    if ((rc = strata_payload_encode(&p, (int)o->level, &buf, &len, &d)) < 0) {
        strata_log_error("encoding failed: %s", strata_diag_msg(&d, rc));
        goto out;
    }
    /* Nothing becomes visible unless everything succeeds: the payload goes to
     * a temporary file, the residual is saved (atomically), then the payload
     * is renamed into place and its directory fsync'ed. */
    if ((rc = strata_file_write_temp(out, buf, len, 0644, &tmp, &d)) < 0) {
        strata_log_error("%s", strata_diag_msg(&d, rc));
        goto out;
    }
    if (residual != NULL && (rc = strata_ef_save(ef, residual, &d)) < 0) {
        strata_log_error("residual %s: %s", residual, strata_diag_msg(&d, rc));
        goto out;
    }
    if ((dir = strdup(out)) == NULL) {
        strata_log_error("out of memory");
        goto out;
    }
    if (rename(tmp, out) != 0) {
        strata_log_error("rename %s to %s: %s", tmp, out, strerror(errno));
        goto out;
    }
    free(tmp);
    tmp = NULL;
    if ((rc = strata_file_fsync_dir(dirname(dir), &d)) < 0) {
        strata_log_error("%s", strata_diag_msg(&d, rc));
        goto out;
    }
    size_t total = strata_tensor_list_numel(&t), kept = 0;
    for (size_t i = 0; i < t.count; i++)
        kept += (layers[i].comp == STRATA_COMP_TOPK || layers[i].comp == STRATA_COMP_RANDK)
                    ? (size_t)layers[i].count
                    : (size_t)layers[i].numel;
    printf("%s: %zu tensors, %zu elements, %zu kept (%.4f%%), %zu bytes (dense float32: %zu, "
           "ratio %.1fx)\n",
           out, t.count, total, kept, 100.0 * (double)kept / (double)total, len, total * 4,
           (double)(total * 4) / (double)len);
    code = TOOL_EXIT_OK;
out:
    if (tmp != NULL)
        unlink(tmp);
    free(tmp);
    free(dir);
    free(meta);
    free(buf);
    if (layers)
        strata_clayers_free(layers, t.count);
    free(budgets);
    strata_ef_free(ef);
    strata_tensor_list_cleanup(&t);
    return code;
}

const tool_command TOOL_COMPRESS = {
    .name = "compress",
    .help = "compress tensors into a payload with a budget policy and error feedback",
    .synopsis = "--in MODEL_OR_DELTA.safetensors --policy SPEC --density D --out P.bin "
                "[--values fp32|fp16|bf16|int8|ternary] [--residual R.safetensors] [--round R] "
                "[--rounds T] "
                "[--seed S] [--level L] [--client-id C] [--model-version V] [--samples N]",
    .opts = COMPRESS_OPTS,
    .nopts = TOOL_COUNT(COMPRESS_OPTS),
    .size = sizeof(compress_opts),
    .defaults = &COMPRESS_DEFAULTS,
    .run = run_compress,
};

/* Reads and decodes the payload file at path into *p (the caller frees it);
 * *file_len receives the file's size. Errors: those of
 * strata_file_read_all and strata_payload_decode, logged. */
static int load_payload(const char *path, strata_payload **p, size_t *file_len)
{
    *p = NULL;
    *file_len = 0;
    uint8_t *buf = NULL;
    size_t len = 0;
    strata_diag d = {{0}};
    int rc = strata_file_read_all(path, MAX_PAYLOAD_FILE, &buf, &len, &d);
    if (rc < 0)
        strata_log_error("%s", strata_diag_msg(&d, rc));
    else if ((rc = strata_payload_decode(buf, len, NULL, p, &d)) < 0)
        strata_log_error("%s: %s", path, strata_diag_msg(&d, rc));
    else
        *file_len = len;
    free(buf);
    return rc;
}

/* Name and shape of layer i from the payload's metadata ("tensors"), or
 * "layer.<i>" with a flat shape. */
static void layer_layout(json_t *meta, size_t i, uint64_t numel, char *name, size_t nlen, int *ndim,
                         int64_t *shape)
{
    json_t *t = json_array_get(json_object_get(meta, "tensors"), i);
    const char *nm = json_string_value(json_object_get(t, "name"));
    json_t *sh = json_object_get(t, "shape");
    size_t nd = json_array_size(sh);
    uint64_t prod = 1;
    int ok = nm != NULL && nd >= 1 && nd <= STRATA_MAX_DIMS;
    for (size_t k = 0; ok && k < nd; k++) {
        json_int_t v = json_integer_value(json_array_get(sh, k));
        ok = v > 0 && (uint64_t)v <= numel;
        if (ok) {
            shape[k] = v;
            prod *= (uint64_t)v;
        }
    }
    if (ok && prod == numel && strlen(nm) < nlen) {
        snprintf(name, nlen, "%s", nm);
        *ndim = (int)nd;
        return;
    }
    snprintf(name, nlen, "layer.%zu", i);
    *ndim = 1;
    shape[0] = (int64_t)numel;
}

typedef struct decode_opts {
    char *in, *out;
} decode_opts;

static const strata_opt DECODE_OPTS[] = {
    {"in", STRATA_OPT_STRING, offsetof(decode_opts, in), 0, 0, "P.bin",
     "the payload to decode; required"},
    {"out", STRATA_OPT_STRING, offsetof(decode_opts, out), 0, 0, "FILE",
     "the dense tensors to write (safetensors); required"},
};

/* decode's run (opts: a decode_opts): decodes the payload --in into dense
 * tensors in --out. Returns a TOOL_EXIT_* code. */
static int run_decode(const void *opts, const char *arg)
{
    const decode_opts *o = opts;
    (void)arg;
    if (o->in == NULL || o->out == NULL)
        return tool_usage_error("decode: --in and --out are required");
    const char *in = o->in, *out = o->out;
    strata_payload *p = NULL;
    size_t flen;
    if (load_payload(in, &p, &flen) < 0)
        return TOOL_EXIT_FAIL;
    json_t *meta = p->metadata_json ? json_loads(p->metadata_json, 0, NULL) : NULL;
    strata_tensor_list t;
    strata_tensor_list_init(&t);
    int code = TOOL_EXIT_FAIL, rc = 0;
    strata_diag d = {{0}};
    for (size_t i = 0; i < p->num_layers; i++) {
        char name[STRATA_MAX_NAME];
        int ndim;
        int64_t shape[STRATA_MAX_DIMS];
        layer_layout(meta, i, p->layers[i].numel, name, sizeof(name), &ndim, shape);
        if ((rc = strata_tensor_list_add(&t, name, ndim, shape, NULL)) < 0) {
            strata_log_error("layer %zu (%s): %s", i, name, strata_strerror(rc));
            goto out;
        }
        if ((rc = strata_clayer_decode(&p->layers[i], t.items[i].data, &d)) < 0) {
            strata_log_error("layer %zu: %s", i, strata_diag_msg(&d, rc));
            goto out;
        }
    }
    if ((rc = strata_safetensors_write(out, &t, NULL, &d)) < 0) {
        strata_log_error("%s", strata_diag_msg(&d, rc));
        goto out;
    }
    printf("%s: %zu tensors, %zu elements\n", out, t.count, strata_tensor_list_numel(&t));
    code = TOOL_EXIT_OK;
out:
    json_decref(meta);
    strata_tensor_list_cleanup(&t);
    strata_payload_free(p);
    return code;
}

const tool_command TOOL_DECODE = {
    .name = "decode",
    .help = "decode a payload back to dense tensors",
    .synopsis = "--in P.bin --out DENSE.safetensors",
    .opts = DECODE_OPTS,
    .nopts = TOOL_COUNT(DECODE_OPTS),
    .size = sizeof(decode_opts),
    .run = run_decode,
};

/* A JSON integer, or a decimal string above the signed 64-bit range. */
static json_t *json_u64(uint64_t v)
{
    if (v <= (uint64_t)INT64_MAX)
        return json_integer((json_int_t)v);
    char buf[32];
    snprintf(buf, sizeof(buf), "%llu", (unsigned long long)v);
    return json_string(buf);
}

/* Bytes of a compressed layer's arrays in memory (4-byte indices, 4- or
 * 2-byte values, 1-byte int8 or qsgd levels, packed sign bits for ternary
 * and sign), before the wire coding and zstd. */
static size_t layer_array_bytes(const strata_clayer *c)
{
    size_t vb = c->values_format == STRATA_VALUES_FP32 ? 4 : 2;
    if (c->values_format == STRATA_VALUES_INT8)
        vb = 1;
    if (c->values_format == STRATA_VALUES_TERNARY && c->comp == STRATA_COMP_TOPK)
        return (size_t)c->count * 4 + ((size_t)c->count + 7) / 8 + 4;
    if (c->values_format == STRATA_VALUES_TERNARY)
        return ((size_t)c->count + 7) / 8 + 12;
    switch (c->comp) {
    case STRATA_COMP_TOPK:
        return (size_t)c->count * (4 + vb);
    case STRATA_COMP_RANDK:
        return (size_t)c->count * vb + 8;
    case STRATA_COMP_QSGD:
        return (size_t)c->numel + 4;
    case STRATA_COMP_SIGN:
        return (size_t)(c->numel + 7) / 8 + 4;
    default:
        return (size_t)c->count * vb;
    }
}

typedef struct inspect_opts {
    int json;
} inspect_opts;

static const strata_opt INSPECT_OPTS[] = {
    {"json", STRATA_OPT_FLAG, offsetof(inspect_opts, json), 0, 0, NULL, "print one JSON object"},
};

/* inspect's run (opts: an inspect_opts): prints the header and the
 * per-layer table of the payload file at path (NULL: a usage error).
 * Returns a TOOL_EXIT_* code. */
static int run_inspect(const void *opts, const char *path)
{
    const inspect_opts *o = opts;
    if (path == NULL)
        return tool_usage_error("inspect: expected one payload file");
    strata_payload *p = NULL;
    size_t flen;
    if (load_payload(path, &p, &flen) < 0)
        return TOOL_EXIT_FAIL;
    json_t *meta = p->metadata_json ? json_loads(p->metadata_json, 0, NULL) : NULL;
    json_t *root =
        json_pack("{s:s,s:I,s:I,s:o,s:o,s:o,s:I,s:I}", "file", path, "bytes", (json_int_t)flen,
                  "round", (json_int_t)p->round, "model_version", json_u64(p->model_version),
                  "client_id", json_u64(p->client_id), "sample_count", json_u64(p->sample_count),
                  "layers", (json_int_t)p->num_layers, "flags", (json_int_t)p->flags);
    json_t *arr = json_array();
    size_t total = 0, kept_total = 0, raw_total = 0;
    for (size_t i = 0; i < p->num_layers; i++) {
        const strata_clayer *l = &p->layers[i];
        char name[STRATA_MAX_NAME];
        int ndim;
        int64_t shape[STRATA_MAX_DIMS];
        layer_layout(meta, i, l->numel, name, sizeof(name), &ndim, shape);
        size_t kept = (l->comp == STRATA_COMP_TOPK || l->comp == STRATA_COMP_RANDK)
                          ? (size_t)l->count
                          : (size_t)l->numel;
        size_t raw = layer_array_bytes(l);
        total += l->numel;
        kept_total += kept;
        raw_total += raw;
        json_t *lj =
            json_pack("{s:i,s:s,s:s,s:s,s:I,s:I,s:I}", "index", (int)l->layer_index, "name", name,
                      "compressor", strata_comp_name(l->comp), "values",
                      strata_values_format_name(l->values_format), "elements", (json_int_t)l->numel,
                      "kept", (json_int_t)kept, "array_bytes", (json_int_t)raw);
        if (l->comp == STRATA_COMP_QSGD)
            json_object_set_new(lj, "levels", json_integer(l->levels));
        if (l->comp == STRATA_COMP_POWERSGD)
            json_object_set_new(lj, "rank", json_integer(l->rank));
        json_array_append_new(arr, lj);
    }
    json_object_set_new(root, "elements", json_integer((json_int_t)total));
    json_object_set_new(root, "kept", json_integer((json_int_t)kept_total));
    json_object_set_new(root, "array_bytes", json_integer((json_int_t)raw_total));
    json_object_set_new(root, "per_layer", arr);
    if (o->json) {
        char *s = json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER);
        puts(s);
        free(s);
    } else {
        printf("%s: %zu bytes, round %u, model version %llu, client %llu, %llu samples, "
               "%zu layers, flags 0x%x\n",
               path, flen, p->round, (unsigned long long)p->model_version,
               (unsigned long long)p->client_id, (unsigned long long)p->sample_count, p->num_layers,
               p->flags);
        printf("%5s %-24s %-9s %-5s %12s %12s %9s %12s\n", "index", "tensor", "comp", "vals",
               "elements", "kept", "density", "array bytes");
        for (size_t i = 0; i < json_array_size(arr); i++) {
            json_t *lj = json_array_get(arr, i);
            json_int_t el = json_integer_value(json_object_get(lj, "elements"));
            json_int_t kp = json_integer_value(json_object_get(lj, "kept"));
            printf("%5d %-24s %-9s %-5s %12lld %12lld %9.5f %12lld\n",
                   (int)json_integer_value(json_object_get(lj, "index")),
                   json_string_value(json_object_get(lj, "name")),
                   json_string_value(json_object_get(lj, "compressor")),
                   json_string_value(json_object_get(lj, "values")), (long long)el, (long long)kp,
                   (double)kp / (double)el,
                   (long long)json_integer_value(json_object_get(lj, "array_bytes")));
        }
        printf("total: %zu elements, %zu kept (%.4f%%), %zu array bytes, %zu payload bytes "
               "(%.2f bytes per kept element)\n",
               total, kept_total, 100.0 * (double)kept_total / (double)(total ? total : 1),
               raw_total, flen, (double)flen / (double)(kept_total ? kept_total : 1));
    }
    json_decref(root);
    json_decref(meta);
    strata_payload_free(p);
    return TOOL_EXIT_OK;
}

const tool_command TOOL_INSPECT = {
    .name = "inspect",
    .help = "print a payload's header and per-layer compressor, kept elements and bytes",
    .synopsis = "P.bin [--json]",
    .opts = INSPECT_OPTS,
    .nopts = TOOL_COUNT(INSPECT_OPTS),
    .size = sizeof(inspect_opts),
    .takes_arg = 1,
    .run = run_inspect,
};

typedef struct policy_opts {
    char *model, *policy;
    double density;
    long rounds;
    int json;
} policy_opts;

#define OFF(f) offsetof(policy_opts, f)
static const strata_opt POLICY_OPTS[] = {
    {"model", STRATA_OPT_STRING, OFF(model), 0, 0, "SPEC",
     "a built-in model (mlp, cnn, resnet) or an ARCH.json file;\nrequired"},
    {"policy", STRATA_OPT_STRING, OFF(policy), 0, 0, "SPEC",
     "a budget policy: uniform, legacy-layer,\nlegacy-phase, legacy, lgreco, JSON text or\n"
     "@file.json; required"},
    {"density", STRATA_OPT_DOUBLE, OFF(density), 1e-12, 1, "D",
     "target mean density, in (0, 1]; required"},
    {"rounds", STRATA_OPT_INTEGER, OFF(rounds), 1, 1000000, "T", "rounds in the run; required"},
    {"json", STRATA_OPT_FLAG, OFF(json), 0, 0, NULL, "print one JSON object"},
};
#undef OFF

/* policy's run (opts: a policy_opts): prints the per-layer densities of
 * every phase of the policy --policy on --model and the elements kept over
 * the run against the uniform policy. Returns a TOOL_EXIT_* code. */
static int run_policy(const void *opts, const char *arg)
{
    const policy_opts *o = opts;
    (void)arg;
    if (o->model == NULL || o->policy == NULL || o->density == 0.0 || o->rounds == 0)
        return tool_usage_error("policy: --model, --policy, --density and --rounds are required");
    const char *model = o->model, *spec = o->policy;
    double density = o->density;
    long rounds = o->rounds;
    strata_model *m = NULL;
    strata_diag d = {{0}};
    int rc = tool_load_model(model, &m, &d);
    if (rc < 0) {
        strata_log_error("%s", strata_diag_msg(&d, rc));
        return TOOL_EXIT_FAIL;
    }
    strata_policy *pol = NULL, *uni = NULL;
    rc = strata_policy_parse(spec, &pol, &d);
    if (rc < 0) {
        strata_model_free(m);
        return tool_usage_error("--policy: %s", strata_diag_msg(&d, rc));
    }
    strata_policy_parse("uniform", &uni, NULL);
    const strata_tensor_list *t = strata_model_params(m);
    size_t n = t->count, *sizes = layer_sizes(t);
    uint32_t P = strata_policy_phases(pol);
    double *dens = calloc(n * P + 1, sizeof(double)), *udens = calloc(n + 1, sizeof(double));
    size_t *first = calloc(P + 1, sizeof(size_t)), *count = calloc(P + 1, sizeof(size_t));
    int code = TOOL_EXIT_FAIL;
    if (!sizes || !dens || !udens || !first || !count) {
        strata_log_error("out of memory");
        goto out;
    }
    /* Rounds of each phase, and the densities at its first round. */
    for (uint32_t r = (uint32_t)rounds; r-- > 0;) {
        uint32_t ph = strata_policy_phase(pol, r, (uint32_t)rounds);
        first[ph] = r;
        count[ph]++;
    }
    double run_kept = 0.0;
    for (uint32_t ph = 0; ph < P; ph++) {
        if (count[ph] == 0)
            continue;
        rc = strata_policy_densities(pol, sizes, n, density, (uint32_t)first[ph], (uint32_t)rounds,
                                     dens + ph * n, &d);
        if (rc < 0) {
            strata_log_error("%s", strata_diag_msg(&d, rc));
            goto out;
        }
        run_kept += (double)count[ph] * (double)strata_policy_kept(sizes, dens + ph * n, n);
    }
    strata_policy_densities(uni, sizes, n, density, 0, (uint32_t)rounds, udens, NULL);
    double uni_kept = (double)strata_policy_kept(sizes, udens, n) * (double)rounds;
    if (o->json) {
        json_t *root =
            json_pack("{s:s,s:s,s:f,s:I,s:I}", "model", model, "policy", strata_policy_name(pol),
                      "density", density, "rounds", (json_int_t)rounds, "phases", (json_int_t)P);
        json_t *phases = json_array();
        for (uint32_t ph = 0; ph < P; ph++) {
            json_t *dj = json_array();
            for (size_t i = 0; i < n && count[ph]; i++)
                json_array_append_new(dj, json_real(dens[ph * n + i]));
            json_array_append_new(
                phases,
                json_pack(
                    "{s:I,s:I,s:o,s:I}", "first_round", (json_int_t)first[ph], "rounds",
                    (json_int_t)count[ph], "densities", dj, "kept",
                    (json_int_t)(count[ph] ? strata_policy_kept(sizes, dens + ph * n, n) : 0)));
        }
        json_t *layers = json_array();
        for (size_t i = 0; i < n; i++)
            json_array_append_new(layers, json_pack("{s:s,s:I}", "name", t->items[i].name,
                                                    "elements", (json_int_t)sizes[i]));
        json_object_set_new(root, "layers", layers);
        json_object_set_new(root, "by_phase", phases);
        json_object_set_new(root, "run_kept", json_integer((json_int_t)run_kept));
        json_object_set_new(root, "uniform_run_kept", json_integer((json_int_t)uni_kept));
        json_object_set_new(root, "ratio_to_uniform", json_real(run_kept / uni_kept));
        char *s = json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER);
        puts(s);
        free(s);
        json_decref(root);
    } else {
        printf("policy %s on %s, target density %g, %ld rounds\n", strata_policy_name(pol), model,
               density, rounds);
        printf("%-20s %12s", "tensor", "elements");
        for (uint32_t ph = 0; ph < P; ph++) {
            char h[32];
            snprintf(h, sizeof(h), "r%zu-%zu", first[ph], first[ph] + count[ph] - 1);
            printf(" %11s", count[ph] ? h : "(none)");
        }
        printf(" %11s\n", "uniform");
        for (size_t i = 0; i < n; i++) {
            printf("%-20s %12zu", t->items[i].name, sizes[i]);
            for (uint32_t ph = 0; ph < P; ph++)
                printf(" %11.6f", count[ph] ? dens[ph * n + i] : 0.0);
            printf(" %11.6f\n", udens[i]);
        }
        printf("%-20s %12s", "kept per round", "");
        for (uint32_t ph = 0; ph < P; ph++)
            printf(" %11zu", count[ph] ? strata_policy_kept(sizes, dens + ph * n, n) : (size_t)0);
        printf(" %11zu\n", strata_policy_kept(sizes, udens, n));
        printf("kept over the run: %.0f (uniform: %.0f, ratio %.4f)\n", run_kept, uni_kept,
               run_kept / uni_kept);
    }
    code = TOOL_EXIT_OK;
out:
    free(sizes);
    free(dens);
    free(udens);
    free(first);
    free(count);
    strata_policy_free(pol);
    strata_policy_free(uni);
    strata_model_free(m);
    return code;
}

const tool_command TOOL_POLICY = {
    .name = "policy",
    .help = "print the per-layer density table of every phase, kept elements vs uniform",
    .synopsis = "--model NAME|ARCH.json --policy SPEC --density D --rounds T [--json]",
    .opts = POLICY_OPTS,
    .nopts = TOOL_COUNT(POLICY_OPTS),
    .size = sizeof(policy_opts),
    .run = run_policy,
};
