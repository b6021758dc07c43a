/* The coordinator's evaluation of a model on the held-out test split
 * (eval.c): the test split itself, the images of --eval-samples, and the
 * one model that runs forward.
 *
 * eval.c owns these in its own structure (srv_eval). Start-up loads it; the
 * round thread's close evaluates with it, without the engine lock (it is
 * never called with the lock held). It calls no other engine module.
 *
 * May call: libstrata (data, model, train). */
#ifndef STRATA_SERVER_EVAL_H
#define STRATA_SERVER_EVAL_H

#include "strata/data.h"
#include "strata/error.h"
#include "strata/model.h"
#include "strata/train.h"

#include <stddef.h>
#include <stdint.h>

typedef struct srv_eval srv_eval;

/* Loads the test split of the data set in data_dir; with eval_samples N
 * below its size, N of its images at even steps (the same every round) are
 * what every round but the last (of `rounds`) is evaluated on. *out is new
 * (srv__eval_free). Errors: the data loader's, STRATA_ENOMEM. */
int srv__eval_new(const char *data_dir, long eval_samples, long rounds, srv_eval **out,
                  strata_diag *d);

/* Frees ev. Accepts NULL. */
void srv__eval_free(srv_eval *ev);

/* The test split (borrowed; start-up reads its statistics and sizes). */
const strata_dataset *srv__eval_test(const srv_eval *ev);

/* Makes the model that runs forward, of m's architecture (start-up, once
 * the global model is known). Errors: the model builder's. */
int srv__eval_prepare(srv_eval *ev, const strata_model *m, strata_diag *d);

/* Evaluates m for round r into *st: on the --eval-samples images for every
 * round but the last, on the whole test set for the last round and
 * without --eval-samples; st->samples says how many. m's parameters and
 * normalisation are copied into the evaluation model, which runs the
 * batches, so m itself never makes activation buffers. Round thread only.
 * Errors: strata_model_set_normalization's and strata_evaluate's. */
int srv__eval_run(srv_eval *ev, strata_model *m, uint32_t r, strata_train_stats *st);

#endif
