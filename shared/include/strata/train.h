/* Local training and evaluation loops over a data set. */
#ifndef STRATA_TRAIN_H
#define STRATA_TRAIN_H

#include "strata/data.h"
#include "strata/model.h"
#include "strata/optim.h"

typedef struct strata_train_stats {
    double loss;     /* mean loss over the samples */
    double accuracy; /* fraction of correct arg-max predictions */
    size_t samples;
    size_t steps;   /* batches processed (optimiser steps when training) */
    double seconds; /* wall-clock time of the pass */
} strata_train_stats;

/* Called after each batch with the samples done so far and the total. A
 * non-zero return stops the epoch after that batch (the stats then cover the
 * batches done). */
typedef int (*strata_progress_fn)(void *ctx, size_t done, size_t total);

/* One epoch of SGD over the samples indices[0..n) of d (indices may be NULL:
 * all n = d->n samples), visited in an order shuffled with rng, in batches of
 * batch (the last one may be smaller). max_steps > 0 stops after that many
 * batches. progress may be NULL. Errors: STRATA_EINVAL when the data does
 * not fit the model or an index is out of range. */
int strata_train_epoch(strata_model *m, strata_sgd *opt, const strata_dataset *d,
                       const size_t *indices, size_t n, size_t batch, size_t max_steps,
                       strata_rng *rng, strata_progress_fn progress, void *ctx,
                       strata_train_stats *st);

/* Loss and accuracy of the model on indices[0..n) of d (NULL: all). */
int strata_evaluate(strata_model *m, const strata_dataset *d, const size_t *indices, size_t n,
                    size_t batch, strata_train_stats *st);

#endif
