/* Training throughput: images per second of forward + backward + SGD step
 * for one model at one batch size and thread count, on real Fashion-MNIST
 * images. Prints one JSON line. scripts/bench.sh runs the matrix. */
#include "strata/data.h"
#include "strata/model.h"
#include "strata/optim.h"
#include "strata/train.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Internal helpers of shared/src/model.c (model_internal.h). */
void strata__model_set_reference(strata_model *m, int on);
const char *strata__model_kernels(const strata_model *m);

int main(int argc, char **argv)
{
    const char *model = "mlp", *data = getenv("STRATA_DATA_DIR"), *kernels = "onednn";
    int threads = 1, batch = 32;
    long images = 0;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--model") == 0)
            model = argv[i + 1];
        else if (strcmp(argv[i], "--threads") == 0)
            threads = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--batch") == 0)
            batch = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--images") == 0)
            images = atol(argv[i + 1]);
        else if (strcmp(argv[i], "--data") == 0)
            data = argv[i + 1];
        else if (strcmp(argv[i], "--kernels") == 0)
            kernels = argv[i + 1];
        else {
            fprintf(stderr, "usage: bench_train [--model M] [--threads T] [--batch B] "
                            "[--images N] [--data DIR] [--kernels onednn|reference]\n");
            return 2;
        }
    }
    if (data == NULL)
        data = "/usr/share/datasets/fashion-mnist";
    if (threads < 1 || batch < 1 ||
        (strcmp(kernels, "onednn") != 0 && strcmp(kernels, "reference") != 0)) {
        fprintf(stderr, "bench_train: --threads and --batch must be >= 1, --kernels onednn or "
                        "reference\n");
        return 2;
    }
    if (images <= 0)
        images = strcmp(model, "mlp") == 0 ? 60000 : 4000;
    strata_set_threads(threads);
    strata_diag d = {{0}};
    strata_dataset ds;
    strata_dataset_init(&ds);
    strata_model *m = NULL;
    strata_sgd *opt = NULL;
    int rc = strata_data_load_dir(data, "train", (size_t)images, &ds, &d);
    if (rc == 0)
        rc = strata_model_new(model, &m, &d);
    if (rc < 0) {
        fprintf(stderr, "bench_train: %s\n", strata_diag_msg(&d, rc));
        return 1;
    }
    strata_model_init_params(m, 1);
    strata__model_set_reference(m, strcmp(kernels, "reference") == 0);
    strata_sgd_config cfg = {.lr = 0.01f, .momentum = 0.9f};
    strata_sgd_new(strata_model_params(m), &cfg, &opt, NULL);
    strata_rng rng;
    strata_rng_seed(&rng, 1, 0);
    strata_train_stats warm, st;
    /* Warm-up: buffers, BLAS threads, caches. */
    strata_train_epoch(m, opt, &ds, NULL, 0, (size_t)batch, 20, &rng, NULL, NULL, &warm);
    rc = strata_train_epoch(m, opt, &ds, NULL, 0, (size_t)batch, 0, &rng, NULL, NULL, &st);
    if (rc < 0) {
        fprintf(stderr, "bench_train: %s\n", strata_strerror(rc));
        return 1;
    }
    printf("{\"impl\":\"strata\",\"kernels\":\"%s\",\"model\":\"%s\",\"threads\":%d,"
           "\"batch\":%d,\"images\":%zu,\"seconds\":%.4f,\"images_per_second\":%.1f}\n",
           strata__model_kernels(m), model, threads, batch, st.samples, st.seconds,
           (double)st.samples / st.seconds);
    strata_sgd_free(opt);
    strata_model_free(m);
    strata_dataset_cleanup(&ds);
    return 0;
}
