/* strata-tool info, train, eval and partition: models and data sets. */
#include "tool.h"

#include "strata/checkpoint.h"
#include "strata/data.h"
#include "strata/log.h"
#include "strata/partition.h"
#include "strata/train.h"

#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

typedef struct info_opts {
    char *model;
    int json;
} info_opts;

static const strata_opt INFO_OPTS[] = {
    {"model", STRATA_OPT_STRING, offsetof(info_opts, model), 0, 0, "SPEC",
     "a built-in model (mlp, cnn, resnet), an ARCH.json file or a\n"
     ".safetensors file (listed as stored); required"},
    {"json", STRATA_OPT_FLAG, offsetof(info_opts, json), 0, 0, NULL, "print one JSON object"},
};

/* info's run (opts: an info_opts): lists the parameter tensors of --model.
 * Returns a TOOL_EXIT_* code. */
static int run_info(const void *opts, const char *arg)
{
    const info_opts *o = opts;
    (void)arg;
    if (o->model == NULL)
        return tool_usage_error("info: --model is required");
    const char *spec = o->model;
    /* A safetensors file is listed as it is (a checkpoint, a delta, a
     * residual); anything else is built as a model. */
    strata_model *m = NULL;
    strata_tensor_list file;
    strata_tensor_list_init(&file);
    strata_tensor_list *p = &file;
    strata_diag d = {{0}};
    int rc = tool_is_safetensors(spec) ? strata_safetensors_read(spec, 0, &file, NULL, &d)
                                       : tool_load_model(spec, &m, &d);
    if (rc < 0) {
        strata_log_error("%s", strata_diag_msg(&d, rc));
        strata_tensor_list_cleanup(&file);
        return TOOL_EXIT_FAIL;
    }
    if (m != NULL)
        p = strata_model_params(m);
    size_t total = strata_tensor_list_numel(p);
    if (o->json) {
        json_t *root = json_object(), *arr = json_array();
        for (size_t i = 0; i < p->count; i++) {
            json_t *shape = json_array();
            for (int d = 0; d < p->items[i].ndim; d++)
                json_array_append_new(shape, json_integer(p->items[i].shape[d]));
            json_array_append_new(arr, json_pack("{s:s,s:o,s:I}", "name", p->items[i].name, "shape",
                                                 shape, "numel", (json_int_t)p->items[i].numel));
        }
        json_object_set_new(root, "model", json_string(spec));
        json_object_set_new(root, "tensors", arr);
        json_object_set_new(root, "params", json_integer((json_int_t)total));
        char *s = json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER);
        puts(s);
        free(s);
        json_decref(root);
    } else {
        printf("%-24s %-20s %12s\n", "tensor", "shape", "elements");
        for (size_t i = 0; i < p->count; i++) {
            char shape[64];
            strata_tensor_shape_str(&p->items[i], shape, sizeof(shape));
            printf("%-24s %-20s %12zu\n", p->items[i].name, shape, p->items[i].numel);
        }
        printf("total parameters: %zu\n", total);
    }
    strata_tensor_list_cleanup(&file);
    strata_model_free(m);
    return TOOL_EXIT_OK;
}

const tool_command TOOL_INFO = {
    .name = "info",
    .help = "print the parameter tensors and the total parameter count",
    .synopsis = "--model NAME|ARCH.json|CKPT.safetensors [--json]",
    .opts = INFO_OPTS,
    .nopts = TOOL_COUNT(INFO_OPTS),
    .size = sizeof(info_opts),
    .run = run_info,
};

typedef struct train_opts {
    char *model, *data, *out, *normalize, *schedule; /* NULL: the default */
    long epochs, threads, batch, limit, seed;
    double lr, momentum, weight_decay;
    int nesterov, json;
} train_opts;

#define OFF(f) offsetof(train_opts, f)
static const strata_opt TRAIN_OPTS[] = {
    {"model", STRATA_OPT_STRING, OFF(model), 0, 0, "SPEC",
     "a built-in model (mlp, cnn, resnet) or an ARCH.json file;\nrequired"},
    {"data", STRATA_OPT_STRING, OFF(data), 0, 0, "DIR", "data set directory; required"},
    {"epochs", STRATA_OPT_INTEGER, OFF(epochs), 1, 100000, "N", "training epochs; required"},
    {"threads", STRATA_OPT_INTEGER, OFF(threads), 1, 1024, "T",
     "threads for OpenMP and BLAS\n(default: OMP_NUM_THREADS or all cores)"},
    {"seed", STRATA_OPT_INTEGER, OFF(seed), 0, (double)LONG_MAX, "S",
     "seed for initialisation and shuffling (default 1)"},
    {"batch", STRATA_OPT_INTEGER, OFF(batch), 1, 65536, "B", "mini-batch size (default 32)"},
    {"lr", STRATA_OPT_DOUBLE, OFF(lr), 1e-12, 1e6, "LR", "learning rate (default 0.02)"},
    {"momentum", STRATA_OPT_DOUBLE, OFF(momentum), 0, 0.999999, "M",
     "SGD momentum, in [0, 1) (default 0.9)"},
    {"weight_decay", STRATA_OPT_DOUBLE, OFF(weight_decay), 0, 1e6, "WD",
     "L2 weight decay (default 0)"},
    {"nesterov", STRATA_OPT_FLAG, OFF(nesterov), 0, 0, NULL, "Nesterov momentum"},
    {"schedule", STRATA_OPT_STRING, OFF(schedule), 0, 0, "S",
     "learning-rate schedule: cosine (decay to 0 over\nthe run, default) or constant"},
    {"limit", STRATA_OPT_INTEGER, OFF(limit), 1, (double)LONG_MAX, "N",
     "train on the first N training images only"},
    {"normalize", STRATA_OPT_STRING, OFF(normalize), 0, 0, "X",
     "input normalisation: auto (training-set mean/std,\ndefault), none, or MEAN,STD"},
    {"out", STRATA_OPT_STRING, OFF(out), 0, 0, "FILE",
     "write the trained model as a safetensors checkpoint"},
    {"json", STRATA_OPT_FLAG, OFF(json), 0, 0, NULL, "last line of output is a JSON summary"},
};
#undef OFF

static const train_opts TRAIN_DEFAULTS = {.batch = 32, .seed = 1, .lr = 0.02, .momentum = 0.9};

/* Loads one split of a data set directory into *ds (initialised here).
 * Errors: those of strata_data_load_dir, logged. */
static int load_split(const char *dir, const char *split, size_t limit, strata_dataset *ds)
{
    strata_diag d = {{0}};
    strata_dataset_init(ds);
    int rc = strata_data_load_dir(dir, split, limit, ds, &d);
    if (rc < 0)
        strata_log_error("%s", strata_diag_msg(&d, rc));
    return rc;
}

/* train's run (opts: a train_opts): trains --model on --data and reports
 * every epoch. Returns a TOOL_EXIT_* code. */
static int run_train(const void *opts, const char *arg)
{
    const train_opts *o = opts;
    (void)arg;
    if (o->model == NULL || o->data == NULL || o->epochs == 0)
        return tool_usage_error("train: --model, --data and --epochs are required");
    const char *schedule = o->schedule ? o->schedule : "cosine";
    if (strcmp(schedule, "cosine") != 0 && strcmp(schedule, "constant") != 0)
        return tool_usage_error("--schedule: expected cosine or constant, got '%s'", schedule);
    /* Normalisation: "auto" takes the training set's statistics below. */
    const char *normalize = o->normalize ? o->normalize : "auto";
    int norm_auto = strcmp(normalize, "auto") == 0;
    float mean = 0.0f, std = 1.0f;
    if (!norm_auto && strcmp(normalize, "none") != 0 &&
        strata_parse_normalization(normalize, &mean, &std) < 0)
        return tool_usage_error(
            "--normalize: expected auto, none or MEAN,STD with STD > 0, got '%s'", normalize);
    int threads = strata_set_threads((int)o->threads);
    strata_dataset train, test;
    strata_model *m = NULL;
    strata_sgd *opt = NULL;
    json_t *epochs = json_array();
    int rc = 0, code = TOOL_EXIT_FAIL;
    strata_dataset_init(&train);
    strata_dataset_init(&test);
    if (load_split(o->data, "train", (size_t)o->limit, &train) < 0 ||
        load_split(o->data, "test", 0, &test) < 0)
        goto out;
    strata_diag d = {{0}};
    if ((rc = strata_model_new(o->model, &m, &d)) < 0) {
        strata_log_error("%s", strata_diag_msg(&d, rc));
        goto out;
    }
    if (strata_model_input_dim(m) != train.dim) {
        strata_log_error("model '%s' takes %zu inputs but the data has %zu per sample", o->model,
                         strata_model_input_dim(m), train.dim);
        goto out;
    }
    int classes = train.num_classes > test.num_classes ? train.num_classes : test.num_classes;
    if (strata_model_output_dim(m) < (size_t)classes) {
        strata_log_error("model '%s' has %zu outputs but the data has %d classes", o->model,
                         strata_model_output_dim(m), classes);
        goto out;
    }
    if (o->out != NULL && (rc = tool_check_writable(o->out, &d)) < 0) {
        strata_log_error("%s", strata_diag_msg(&d, rc));
        goto out;
    }
    if (norm_auto) {
        double dm, ds;
        strata_dataset_stats(&train, &dm, &ds);
        mean = (float)dm;
        std = ds > 0 ? (float)ds : 1.0f;
    }
    strata_model_set_normalization(m, mean, std);
    strata_model_init_params(m, (uint64_t)o->seed);
    strata_sgd_config cfg = {.lr = (float)o->lr,
                             .momentum = (float)o->momentum,
                             .weight_decay = (float)o->weight_decay,
                             .nesterov = o->nesterov};
    if (strcmp(schedule, "cosine") == 0)
        cfg.decay_steps = (size_t)o->epochs * ((train.n + (size_t)o->batch - 1) / (size_t)o->batch);
    if ((rc = strata_sgd_new(strata_model_params(m), &cfg, &opt, &d)) < 0) {
        code = tool_usage_error("%s", strata_diag_msg(&d, rc));
        goto out;
    }
    size_t nparams = strata_tensor_list_numel(strata_model_params(m));
    strata_log_info("training %s (%zu parameters) on %zu images, %ld epochs, batch %ld, lr %g, "
                    "%d threads, normalisation %g,%g",
                    o->model, nparams, train.n, o->epochs, o->batch, o->lr, threads, (double)mean,
                    (double)std);
    strata_rng rng;
    strata_rng_seed(&rng, (uint64_t)o->seed, 1);
    double train_seconds = 0.0;
    strata_train_stats ts = {0}, es = {0};
    for (long e = 1; e <= o->epochs; e++) {
        char label[64];
        snprintf(label, sizeof(label), "epoch %ld/%ld", e, o->epochs);
        if ((rc = strata_train_epoch(m, opt, &train, NULL, 0, (size_t)o->batch, 0, &rng,
                                     tool_progress, label, &ts)) < 0 ||
            (rc = strata_evaluate(m, &test, NULL, 0, 128, &es)) < 0) {
            strata_log_error("training failed: %s", strata_strerror(rc));
            goto out;
        }
        train_seconds += ts.seconds;
        if (!isfinite(ts.loss)) {
            strata_log_error("training diverged (loss is not finite); lower --lr");
            goto out;
        }
        printf("epoch %ld/%ld  train_loss %.4f  train_acc %.4f  test_loss %.4f  test_acc %.4f  "
               "%.0f img/s\n",
               e, o->epochs, ts.loss, ts.accuracy, es.loss, es.accuracy,
               (double)ts.samples / ts.seconds);
        fflush(stdout);
        json_array_append_new(epochs,
                              json_pack("{s:I,s:f,s:f,s:f,s:f}", "epoch", (json_int_t)e,
                                        "train_loss", ts.loss, "train_accuracy", ts.accuracy,
                                        "test_loss", es.loss, "test_accuracy", es.accuracy));
    }
    if (o->out != NULL) {
        if ((rc = strata_checkpoint_save(m, o->out, &d)) < 0) {
            strata_log_error("%s", strata_diag_msg(&d, rc));
            goto out;
        }
        strata_log_info("checkpoint written to %s", o->out);
    }
    if (o->json) {
        json_t *root =
            json_pack("{s:s,s:I,s:I,s:I,s:I,s:I,s:f,s:f,s:f,s:f,s:f,s:O}", "model", o->model,
                      "params", (json_int_t)nparams, "epochs", (json_int_t)o->epochs, "batch",
                      (json_int_t)o->batch, "threads", (json_int_t)threads, "train_samples",
                      (json_int_t)train.n, "test_accuracy", es.accuracy, "test_loss", es.loss,
                      "images_per_second", (double)train.n * (double)o->epochs / train_seconds,
                      "train_seconds", train_seconds, "lr", o->lr, "history", epochs);
        char *s = json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER);
        puts(s);
        free(s);
        json_decref(root);
    }
    code = TOOL_EXIT_OK;
out:
    json_decref(epochs);
    strata_sgd_free(opt);
    strata_model_free(m);
    strata_dataset_cleanup(&train);
    strata_dataset_cleanup(&test);
    return code;
}

const tool_command TOOL_TRAIN = {
    .name = "train",
    .help = "train centrally and print per-epoch test accuracy",
    .synopsis = "--model NAME|ARCH.json --data DIR --epochs N [--threads T] [--seed S] [--batch B] "
                "[--lr LR] [--momentum M] [--weight-decay WD] [--nesterov] "
                "[--schedule cosine|constant] [--limit N] [--normalize auto|none|MEAN,STD] "
                "[--out CKPT.safetensors] [--json]",
    .opts = TRAIN_OPTS,
    .nopts = TOOL_COUNT(TRAIN_OPTS),
    .size = sizeof(train_opts),
    .defaults = &TRAIN_DEFAULTS,
    .run = run_train,
};

typedef struct eval_opts {
    char *model, *data;
    long threads;
    int json;
} eval_opts;

static const strata_opt EVAL_OPTS[] = {
    {"model", STRATA_OPT_STRING, offsetof(eval_opts, model), 0, 0, "CKPT",
     "the checkpoint (.safetensors) to evaluate; required"},
    {"data", STRATA_OPT_STRING, offsetof(eval_opts, data), 0, 0, "DIR",
     "data set directory (its test split); required"},
    {"threads", STRATA_OPT_INTEGER, offsetof(eval_opts, threads), 1, 1024, "T",
     "threads for OpenMP and BLAS\n(default: OMP_NUM_THREADS or all cores)"},
    {"json", STRATA_OPT_FLAG, offsetof(eval_opts, json), 0, 0, NULL, "print one JSON object"},
};

/* eval's run (opts: an eval_opts): evaluates the checkpoint --model on the
 * test split of --data. Returns a TOOL_EXIT_* code. */
static int run_eval(const void *opts, const char *arg)
{
    const eval_opts *o = opts;
    (void)arg;
    if (o->model == NULL || o->data == NULL)
        return tool_usage_error("eval: --model and --data are required");
    const char *spec = o->model;
    if (!tool_is_safetensors(spec))
        return tool_usage_error("eval: --model must be a checkpoint (.safetensors); '%s' has no "
                                "trained weights",
                                spec);
    strata_set_threads((int)o->threads);
    strata_model *m = NULL;
    strata_dataset test;
    strata_dataset_init(&test);
    int code = TOOL_EXIT_FAIL;
    strata_diag d = {{0}};
    int rc = tool_load_model(spec, &m, &d);
    if (rc < 0) {
        strata_log_error("%s", strata_diag_msg(&d, rc));
        goto out;
    }
    if (load_split(o->data, "test", 0, &test) < 0)
        goto out;
    strata_train_stats es;
    rc = strata_evaluate(m, &test, NULL, 0, 128, &es);
    if (rc < 0) {
        strata_log_error("evaluation failed: %s (does the model fit the data?)",
                         strata_strerror(rc));
        goto out;
    }
    if (o->json) {
        json_t *root =
            json_pack("{s:s,s:I,s:f,s:f}", "model", spec, "samples", (json_int_t)es.samples,
                      "test_accuracy", es.accuracy, "test_loss", es.loss);
        char *s = json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER);
        puts(s);
        free(s);
        json_decref(root);
    } else
        printf("test_acc %.4f  test_loss %.4f  (%zu images)\n", es.accuracy, es.loss, es.samples);
    code = TOOL_EXIT_OK;
out:
    strata_model_free(m);
    strata_dataset_cleanup(&test);
    return code;
}

const tool_command TOOL_EVAL = {
    .name = "eval",
    .help = "evaluate a checkpoint on the test split of a data set",
    .synopsis = "--model CKPT.safetensors --data DIR [--threads T] [--json]",
    .opts = EVAL_OPTS,
    .nopts = TOOL_COUNT(EVAL_OPTS),
    .size = sizeof(eval_opts),
    .run = run_eval,
};

typedef struct partition_opts {
    char *data, *partition; /* partition NULL: iid */
    long clients, seed;
} partition_opts;

static const strata_opt PARTITION_OPTS[] = {
    {"data", STRATA_OPT_STRING, offsetof(partition_opts, data), 0, 0, "DIR",
     "data set directory (its training split); required"},
    {"clients", STRATA_OPT_INTEGER, offsetof(partition_opts, clients), 1, 1000000, "N",
     "clients to split the training set over (default 10)"},
    {"partition", STRATA_OPT_STRING, offsetof(partition_opts, partition), 0, 0, "SPEC",
     "iid (default), dirichlet:ALPHA or shards:S"},
    {"seed", STRATA_OPT_INTEGER, offsetof(partition_opts, seed), 0, (double)LONG_MAX, "S",
     "partition seed (default 1)"},
};

static const partition_opts PARTITION_DEFAULTS = {.clients = 10, .seed = 1};

/* partition's run (opts: a partition_opts): prints the label histogram of
 * every client's share of --data's training split. Returns a TOOL_EXIT_*
 * code. */
static int run_partition(const void *opts, const char *arg)
{
    const partition_opts *o = opts;
    (void)arg;
    if (o->data == NULL)
        return tool_usage_error("partition: --data is required");
    const char *spec = o->partition ? o->partition : "iid";
    strata_dataset train;
    if (load_split(o->data, "train", 0, &train) < 0)
        return TOOL_EXIT_FAIL;
    strata_partition *p = NULL;
    strata_diag d = {{0}};
    int rc = strata_partition_new(train.y, train.n, train.num_classes, spec, (size_t)o->clients,
                                  (uint64_t)o->seed, &p, &d);
    if (rc < 0) {
        strata_dataset_cleanup(&train);
        return tool_usage_error("%s", strata_diag_msg(&d, rc));
    }
    printf("partition %s of %zu training samples over %ld clients (seed %ld)\n", spec, train.n,
           o->clients, o->seed);
    strata_partition_print(p, train.y, train.num_classes, stdout);
    strata_partition_free(p);
    strata_dataset_cleanup(&train);
    return TOOL_EXIT_OK;
}

const tool_command TOOL_PARTITION = {
    .name = "partition",
    .help = "print the per-client label histogram of a partition of the training split",
    .synopsis = "--data DIR [--clients N] [--partition iid|dirichlet:ALPHA|shards:S] [--seed S]",
    .opts = PARTITION_OPTS,
    .nopts = TOOL_COUNT(PARTITION_OPTS),
    .size = sizeof(partition_opts),
    .defaults = &PARTITION_DEFAULTS,
    .run = run_partition,
};
