/* The coordinator's evaluation (see eval.h): the test split, the
 * --eval-samples subset and the evaluation model. This file alone touches
 * struct srv_eval. */
#include "eval.h"

#include <stdlib.h>
#include <string.h>

/* Images per evaluation batch. A model keeps its activation buffers for the
 * largest batch it has run (no gradient buffers: the coordinator's models
 * never run backward), and every evaluation runs on the evaluation model,
 * whichever model it measures (x, or with a downlink x̂ too): for resnet
 * about 125 MB at 64 against 430 MB at 256, evaluated as fast
 * (docs/benchmarks.md, "Simulator at scale"). */
#define EVAL_BATCH 64

struct srv_eval {
    strata_dataset test;
    size_t *idx;         /* --eval-samples: the test images of every round but the last */
    size_t n;            /* entries of idx; 0: every round sees the whole test set */
    long rounds;         /* the run's rounds: the last one sees the whole test set */
    strata_model *model; /* the one model that runs forward */
};

/* --eval-samples N below the test set's size: N images at even steps over
 * the test set, the same every round. */
static int eval_subset(srv_eval *ev, long samples, strata_diag *d)
{
    size_t n = (size_t)samples, count = ev->test.n;
    if (n == 0 || n >= count)
        return STRATA_OK;
    ev->idx = malloc(n * sizeof(*ev->idx));
    if (ev->idx == NULL)
        return strata_diag_set(d, STRATA_ENOMEM, "out of memory (the evaluation subset)");
    for (size_t i = 0; i < n; i++)
        ev->idx[i] = (size_t)((double)i * (double)count / (double)n);
    ev->n = n;
    return STRATA_OK;
}

int srv__eval_new(const char *data_dir, long eval_samples, long rounds, srv_eval **out,
                  strata_diag *d)
{
    *out = NULL;
    srv_eval *ev = calloc(1, sizeof(*ev));
    if (ev == NULL)
        return STRATA_ENOMEM;
    strata_dataset_init(&ev->test);
    ev->rounds = rounds;
    int rc = strata_data_load_dir(data_dir, "test", 0, &ev->test, d);
    if (rc == 0)
        rc = eval_subset(ev, eval_samples, d);
    if (rc < 0) {
        srv__eval_free(ev);
        return rc;
    }
    *out = ev;
    return 0;
}

void srv__eval_free(srv_eval *ev)
{
    if (ev == NULL)
        return;
    strata_dataset_cleanup(&ev->test);
    free(ev->idx);
    strata_model_free(ev->model);
    free(ev);
}

const strata_dataset *srv__eval_test(const srv_eval *ev)
{
    return &ev->test;
}

int srv__eval_prepare(srv_eval *ev, const strata_model *m, strata_diag *d)
{
    const char *arch = strata_model_arch(m);
    return strata_model_from_json(arch, strlen(arch), &ev->model, d);
}

int srv__eval_run(srv_eval *ev, strata_model *m, uint32_t r, strata_train_stats *st)
{
    strata_tensor_list_copy_values(strata_model_params(ev->model), strata_model_params(m));
    float mean = 0, sd = 1;
    strata_model_get_normalization(m, &mean, &sd);
    int rc = strata_model_set_normalization(ev->model, mean, sd);
    if (rc < 0)
        return rc;
    int last = (long)r + 1 >= ev->rounds;
    if (ev->n > 0 && !last)
        return strata_evaluate(ev->model, &ev->test, ev->idx, ev->n, EVAL_BATCH, st);
    return strata_evaluate(ev->model, &ev->test, NULL, 0, EVAL_BATCH, st);
}
