/* strata-tool info, train, eval and partition: models and data sets. */
#include "tool.h"

#include "strata/checkpoint.h"
#include "strata/data.h"
#include "strata/log.h"
#include "strata/partition.h"
#include "strata/train.h"

#include <getopt.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

int tool_info(int argc, char **argv)
{
    static const struct option opts[] = {
        {"model", required_argument, NULL, 'm'},
        {"json", no_argument, NULL, 'j'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    const char *spec = NULL;
    int json = 0, c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        if (c == 'm')
            spec = optarg;
        else if (c == 'j')
            json = 1;
        else if (c == 'h') {
            puts("usage: strata-tool info --model NAME|ARCH.json|CKPT.safetensors [--json]");
            return TOOL_EXIT_OK;
        } else
            return TOOL_EXIT_USAGE;
    }
    if (spec == NULL || optind != argc)
        return tool_usage_error("info: --model is required (and takes no positional arguments)");
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
    if (json) {
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

typedef struct train_args {
    const char *model, *data, *out, *normalize, *schedule;
    long epochs, threads, batch, limit;
    unsigned long long seed;
    double lr, momentum, weight_decay;
    int nesterov, json;
} train_args;

static const char TRAIN_USAGE[] =
    "usage: strata-tool train --model NAME|ARCH.json --data DIR --epochs N [options]\n"
    "  --threads T        threads for OpenMP and BLAS (default: OMP_NUM_THREADS or all cores)\n"
    "  --seed S           seed for initialisation and shuffling (default 1)\n"
    "  --batch B          mini-batch size (default 32)\n"
    "  --lr LR            learning rate (default 0.02)\n"
    "  --momentum M       SGD momentum (default 0.9)\n"
    "  --weight-decay WD  L2 weight decay (default 0)\n"
    "  --nesterov         Nesterov momentum\n"
    "  --schedule S       learning-rate schedule: cosine (decay to 0 over the run,\n"
    "                     default) or constant\n"
    "  --limit N          train on the first N training images only\n"
    "  --normalize X      input normalisation: auto (training-set mean/std, default),\n"
    "                     none, or MEAN,STD\n"
    "  --out FILE         write the trained model as a safetensors checkpoint\n"
    "  --json             last line of output is a JSON summary\n";

/* Parses the train options into *a. Returns TOOL_EXIT_OK (with *help set
 * when --help was answered) or TOOL_EXIT_USAGE. */
static int parse_train(int argc, char **argv, train_args *a, int *help)
{
    static const struct option opts[] = {
        {"model", required_argument, NULL, 'm'},
        {"data", required_argument, NULL, 'd'},
        {"epochs", required_argument, NULL, 'e'},
        {"threads", required_argument, NULL, 't'},
        {"seed", required_argument, NULL, 's'},
        {"batch", required_argument, NULL, 'b'},
        {"lr", required_argument, NULL, 'l'},
        {"momentum", required_argument, NULL, 'M'},
        {"weight-decay", required_argument, NULL, 'w'},
        {"nesterov", no_argument, NULL, 'n'},
        {"schedule", required_argument, NULL, 'S'},
        {"limit", required_argument, NULL, 'L'},
        {"normalize", required_argument, NULL, 'N'},
        {"out", required_argument, NULL, 'o'},
        {"json", no_argument, NULL, 'j'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    *a = (train_args){.epochs = 0,
                      .batch = 32,
                      .seed = 1,
                      .lr = 0.02,
                      .momentum = 0.9,
                      .normalize = "auto",
                      .schedule = "cosine"};
    int c;
    long v;
    *help = 0;
    optind = 1;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case 'm':
            a->model = optarg;
            break;
        case 'd':
            a->data = optarg;
            break;
        case 'o':
            a->out = optarg;
            break;
        case 'N':
            a->normalize = optarg;
            break;
        case 'S':
            if (strcmp(optarg, "cosine") != 0 && strcmp(optarg, "constant") != 0)
                return tool_usage_error("--schedule: expected cosine or constant, got '%s'",
                                        optarg);
            a->schedule = optarg;
            break;
        case 'e':
            if (strata_parse_long(optarg, 1, 100000, &a->epochs))
                return tool_usage_error("--epochs: expected an integer >= 1, got '%s'", optarg);
            break;
        case 't':
            if (strata_parse_long(optarg, 1, 1024, &a->threads))
                return tool_usage_error("--threads: expected an integer in [1, 1024], got '%s'",
                                        optarg);
            break;
        case 's':
            if (strata_parse_long(optarg, 0, __LONG_MAX__, &v))
                return tool_usage_error("--seed: expected a non-negative integer, got '%s'",
                                        optarg);
            a->seed = (unsigned long long)v;
            break;
        case 'b':
            if (strata_parse_long(optarg, 1, 65536, &a->batch))
                return tool_usage_error("--batch: expected an integer in [1, 65536], got '%s'",
                                        optarg);
            break;
        case 'L':
            if (strata_parse_long(optarg, 1, __LONG_MAX__, &a->limit))
                return tool_usage_error("--limit: expected an integer >= 1, got '%s'", optarg);
            break;
        case 'l':
            if (strata_parse_double(optarg, 1e-12, 1e6, &a->lr))
                return tool_usage_error("--lr: expected a positive number, got '%s'", optarg);
            break;
        case 'M':
            if (strata_parse_double(optarg, 0.0, 0.999999, &a->momentum))
                return tool_usage_error("--momentum: expected a number in [0, 1), got '%s'",
                                        optarg);
            break;
        case 'w':
            if (strata_parse_double(optarg, 0.0, 1e6, &a->weight_decay))
                return tool_usage_error("--weight-decay: expected a number >= 0, got '%s'", optarg);
            break;
        case 'n':
            a->nesterov = 1;
            break;
        case 'j':
            a->json = 1;
            break;
        case 'h':
            fputs(TRAIN_USAGE, stdout);
            *help = 1;
            return TOOL_EXIT_OK;
        default:
            fputs(TRAIN_USAGE, stderr);
            return TOOL_EXIT_USAGE;
        }
    }
    if (optind != argc)
        return tool_usage_error("train: unexpected argument '%s'", argv[optind]);
    if (a->model == NULL || a->data == NULL || a->epochs == 0) {
        fputs(TRAIN_USAGE, stderr);
        return tool_usage_error("train: --model, --data and --epochs are required");
    }
    return TOOL_EXIT_OK;
}

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

int tool_train(int argc, char **argv)
{
    train_args a;
    int help = 0, code = parse_train(argc, argv, &a, &help);
    if (code != TOOL_EXIT_OK || help)
        return code;
    int threads = strata_set_threads((int)a.threads);
    strata_dataset train, test;
    strata_model *m = NULL;
    strata_sgd *opt = NULL;
    json_t *epochs = json_array();
    int rc = 0;
    code = TOOL_EXIT_FAIL;
    strata_dataset_init(&train);
    strata_dataset_init(&test);
    if (load_split(a.data, "train", (size_t)a.limit, &train) < 0 ||
        load_split(a.data, "test", 0, &test) < 0)
        goto out;
    strata_diag d = {{0}};
    if ((rc = strata_model_new(a.model, &m, &d)) < 0) {
        strata_log_error("%s", strata_diag_msg(&d, rc));
        goto out;
    }
    if (strata_model_input_dim(m) != train.dim) {
        strata_log_error("model '%s' takes %zu inputs but the data has %zu per sample", a.model,
                         strata_model_input_dim(m), train.dim);
        goto out;
    }
    int classes = train.num_classes > test.num_classes ? train.num_classes : test.num_classes;
    if (strata_model_output_dim(m) < (size_t)classes) {
        strata_log_error("model '%s' has %zu outputs but the data has %d classes", a.model,
                         strata_model_output_dim(m), classes);
        goto out;
    }
    if (a.out != NULL && (rc = tool_check_writable(a.out, &d)) < 0) {
        strata_log_error("%s", strata_diag_msg(&d, rc));
        goto out;
    }
    float mean = 0.0f, std = 1.0f;
    if (strcmp(a.normalize, "auto") == 0) {
        double dm, ds;
        strata_dataset_stats(&train, &dm, &ds);
        mean = (float)dm;
        std = ds > 0 ? (float)ds : 1.0f;
    } else if (strcmp(a.normalize, "none") != 0 &&
               strata_parse_normalization(a.normalize, &mean, &std) < 0) {
        code = tool_usage_error(
            "--normalize: expected auto, none or MEAN,STD with STD > 0, got '%s'", a.normalize);
        goto out;
    }
    strata_model_set_normalization(m, mean, std);
    strata_model_init_params(m, a.seed);
    strata_sgd_config cfg = {.lr = (float)a.lr,
                             .momentum = (float)a.momentum,
                             .weight_decay = (float)a.weight_decay,
                             .nesterov = a.nesterov};
    if (strcmp(a.schedule, "cosine") == 0)
        cfg.decay_steps = (size_t)a.epochs * ((train.n + (size_t)a.batch - 1) / (size_t)a.batch);
    if ((rc = strata_sgd_new(strata_model_params(m), &cfg, &opt, &d)) < 0) {
        code = tool_usage_error("%s", strata_diag_msg(&d, rc));
        goto out;
    }
    size_t nparams = strata_tensor_list_numel(strata_model_params(m));
    strata_log_info("training %s (%zu parameters) on %zu images, %ld epochs, batch %ld, lr %g, "
                    "%d threads, normalisation %g,%g",
                    a.model, nparams, train.n, a.epochs, a.batch, a.lr, threads, (double)mean,
                    (double)std);
    strata_rng rng;
    strata_rng_seed(&rng, a.seed, 1);
    double train_seconds = 0.0;
    strata_train_stats ts = {0}, es = {0};
    for (long e = 1; e <= a.epochs; e++) {
        char label[64];
        snprintf(label, sizeof(label), "epoch %ld/%ld", e, a.epochs);
        if ((rc = strata_train_epoch(m, opt, &train, NULL, 0, (size_t)a.batch, 0, &rng,
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
               e, a.epochs, ts.loss, ts.accuracy, es.loss, es.accuracy,
               (double)ts.samples / ts.seconds);
        fflush(stdout);
        json_array_append_new(epochs,
                              json_pack("{s:I,s:f,s:f,s:f,s:f}", "epoch", (json_int_t)e,
                                        "train_loss", ts.loss, "train_accuracy", ts.accuracy,
                                        "test_loss", es.loss, "test_accuracy", es.accuracy));
    }
    if (a.out != NULL) {
        if ((rc = strata_checkpoint_save(m, a.out, &d)) < 0) {
            strata_log_error("%s", strata_diag_msg(&d, rc));
            goto out;
        }
        strata_log_info("checkpoint written to %s", a.out);
    }
    if (a.json) {
        json_t *root =
            json_pack("{s:s,s:I,s:I,s:I,s:I,s:I,s:f,s:f,s:f,s:f,s:f,s:O}", "model", a.model,
                      "params", (json_int_t)nparams, "epochs", (json_int_t)a.epochs, "batch",
                      (json_int_t)a.batch, "threads", (json_int_t)threads, "train_samples",
                      (json_int_t)train.n, "test_accuracy", es.accuracy, "test_loss", es.loss,
                      "images_per_second", (double)train.n * (double)a.epochs / train_seconds,
                      "train_seconds", train_seconds, "lr", a.lr, "history", epochs);
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

int tool_eval(int argc, char **argv)
{
    static const struct option opts[] = {
        {"model", required_argument, NULL, 'm'},   {"data", required_argument, NULL, 'd'},
        {"threads", required_argument, NULL, 't'}, {"json", no_argument, NULL, 'j'},
        {"help", no_argument, NULL, 'h'},          {NULL, 0, NULL, 0},
    };
    const char *spec = NULL, *data = NULL;
    long threads = 0;
    int json = 0, c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        if (c == 'm')
            spec = optarg;
        else if (c == 'd')
            data = optarg;
        else if (c == 'j')
            json = 1;
        else if (c == 't') {
            if (strata_parse_long(optarg, 1, 1024, &threads))
                return tool_usage_error("--threads: expected an integer in [1, 1024]");
        } else if (c == 'h') {
            puts("usage: strata-tool eval --model CKPT.safetensors --data DIR [--threads T] "
                 "[--json]");
            return TOOL_EXIT_OK;
        } else
            return TOOL_EXIT_USAGE;
    }
    if (spec == NULL || data == NULL || optind != argc)
        return tool_usage_error("eval: --model and --data are required");
    if (!tool_is_safetensors(spec))
        return tool_usage_error("eval: --model must be a checkpoint (.safetensors); '%s' has no "
                                "trained weights",
                                spec);
    strata_set_threads((int)threads);
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
    if (load_split(data, "test", 0, &test) < 0)
        goto out;
    strata_train_stats es;
    rc = strata_evaluate(m, &test, NULL, 0, 128, &es);
    if (rc < 0) {
        strata_log_error("evaluation failed: %s (does the model fit the data?)",
                         strata_strerror(rc));
        goto out;
    }
    if (json) {
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

int tool_partition(int argc, char **argv)
{
    static const struct option opts[] = {
        {"data", required_argument, NULL, 'd'},
        {"clients", required_argument, NULL, 'c'},
        {"partition", required_argument, NULL, 'p'},
        {"seed", required_argument, NULL, 's'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    const char *data = NULL, *spec = "iid";
    long clients = 10, seed = 1;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        if (c == 'd')
            data = optarg;
        else if (c == 'p')
            spec = optarg;
        else if (c == 'c') {
            if (strata_parse_long(optarg, 1, 1000000, &clients))
                return tool_usage_error("--clients: expected an integer >= 1, got '%s'", optarg);
        } else if (c == 's') {
            if (strata_parse_long(optarg, 0, __LONG_MAX__, &seed))
                return tool_usage_error("--seed: expected a non-negative integer, got '%s'",
                                        optarg);
        } else if (c == 'h') {
            puts("usage: strata-tool partition --data DIR [--clients N] "
                 "[--partition iid|dirichlet:ALPHA|shards:S] [--seed S]");
            return TOOL_EXIT_OK;
        } else
            return TOOL_EXIT_USAGE;
    }
    if (data == NULL || optind != argc)
        return tool_usage_error("partition: --data is required");
    strata_dataset train;
    if (load_split(data, "train", 0, &train) < 0)
        return TOOL_EXIT_FAIL;
    strata_partition *p = NULL;
    strata_diag d = {{0}};
    int rc = strata_partition_new(train.y, train.n, train.num_classes, spec, (size_t)clients,
                                  (uint64_t)seed, &p, &d);
    if (rc < 0) {
        strata_dataset_cleanup(&train);
        return tool_usage_error("%s", strata_diag_msg(&d, rc));
    }
    printf("partition %s of %zu training samples over %ld clients (seed %ld)\n", spec, train.n,
           clients, seed);
    strata_partition_print(p, train.y, train.num_classes, stdout);
    strata_partition_free(p);
    strata_dataset_cleanup(&train);
    return TOOL_EXIT_OK;
}
