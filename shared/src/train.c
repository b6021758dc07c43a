#include "strata/train.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

typedef struct batcher {
    float *x;
    uint8_t *y;
    size_t *order;
} batcher;

static void batcher_cleanup(batcher *b)
{
    strata_free_floats(b->x);
    free(b->y);
    free(b->order);
}

static int batcher_init(batcher *b, strata_model *m, const strata_dataset *d, const size_t *indices,
                        size_t n, size_t batch)
{
    memset(b, 0, sizeof(*b));
    if (batch == 0 || n == 0 || d->dim != strata_model_input_dim(m))
        return STRATA_EINVAL;
    if (batch > n)
        batch = n;
    if (batch > SIZE_MAX / d->dim || n > SIZE_MAX / sizeof(size_t))
        return STRATA_ETOOBIG;
    b->x = strata_alloc_floats(batch * d->dim);
    b->y = malloc(batch);
    b->order = malloc(n * sizeof(size_t));
    if (b->x == NULL || b->y == NULL || b->order == NULL) {
        batcher_cleanup(b);
        return STRATA_ENOMEM;
    }
    for (size_t i = 0; i < n; i++) {
        size_t s = indices ? indices[i] : i;
        if (s >= d->n) {
            batcher_cleanup(b);
            return STRATA_EINVAL;
        }
        b->order[i] = s;
    }
    return STRATA_OK;
}

static void gather(batcher *b, const strata_dataset *d, size_t start, size_t count)
{
    for (size_t i = 0; i < count; i++) {
        size_t s = b->order[start + i];
        memcpy(b->x + i * d->dim, d->x + s * d->dim, d->dim * sizeof(float));
        b->y[i] = d->y[s];
    }
}

/* One pass over the samples in batches. With opt, a training pass: order
 * shuffled with rng, dropout on, backward and an optimiser step per batch,
 * at most max_steps batches (0: all), progress may stop it. Without opt, an
 * evaluation pass in the given order. */
static int run_pass(strata_model *m, strata_sgd *opt, const strata_dataset *d,
                    const size_t *indices, size_t n, size_t batch, size_t max_steps,
                    strata_rng *rng, strata_progress_fn progress, void *ctx, strata_train_stats *st)
{
    memset(st, 0, sizeof(*st));
    if (indices == NULL)
        n = d->n;
    batcher b;
    int rc = batcher_init(&b, m, d, indices, n, batch);
    if (rc < 0)
        return rc;
    double t0 = now_seconds(), loss_sum = 0.0;
    size_t hits = 0, done = 0;
    if (opt != NULL)
        strata_rng_shuffle(rng, b.order, n);
    while (done < n && (max_steps == 0 || st->steps < max_steps)) {
        size_t count = n - done < batch ? n - done : batch;
        gather(&b, d, done, count);
        const float *logits;
        double loss;
        size_t correct;
        if ((rc = strata_model_forward(m, b.x, count, opt != NULL, rng, &logits)) < 0)
            goto out;
        if (opt != NULL)
            rc = strata_model_backward(m, b.y, &loss, &correct);
        else
            rc = strata_model_loss(m, b.y, &loss, &correct);
        if (rc < 0 || (opt != NULL && (rc = strata_sgd_step(opt, strata_model_params(m),
                                                            strata_model_grads(m))) < 0))
            goto out;
        loss_sum += loss * (double)count;
        hits += correct;
        done += count;
        st->steps++;
        if (progress && progress(ctx, done, n) != 0)
            break;
    }
    st->samples = done;
    st->loss = done ? loss_sum / (double)done : 0.0;
    st->accuracy = done ? (double)hits / (double)done : 0.0;
    st->seconds = now_seconds() - t0;
out:
    batcher_cleanup(&b);
    return rc;
}

int strata_train_epoch(strata_model *m, strata_sgd *opt, const strata_dataset *d,
                       const size_t *indices, size_t n, size_t batch, size_t max_steps,
                       strata_rng *rng, strata_progress_fn progress, void *ctx,
                       strata_train_stats *st)
{
    if (opt == NULL || rng == NULL) {
        memset(st, 0, sizeof(*st));
        return STRATA_EINVAL;
    }
    return run_pass(m, opt, d, indices, n, batch, max_steps, rng, progress, ctx, st);
}

int strata_evaluate(strata_model *m, const strata_dataset *d, const size_t *indices, size_t n,
                    size_t batch, strata_train_stats *st)
{
    return run_pass(m, NULL, d, indices, n, batch, 0, NULL, NULL, NULL, st);
}
