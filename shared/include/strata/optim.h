/* Client optimiser: SGD with momentum, Nesterov momentum, weight decay and
 * the FedProx proximal term mu/2 * ||w - w_anchor||^2.
 *
 * Update per element (PyTorch's SGD, dampening 0):
 *   g = grad + weight_decay * w + prox_mu * (w - anchor)
 *   v = momentum * v + g                      (when momentum > 0)
 *   g = nesterov ? g + momentum * v : v
 *   w = w - lr * g
 * The optimiser owns its momentum buffers; one thread at a time. */
#ifndef STRATA_OPTIM_H
#define STRATA_OPTIM_H

#include "strata/error.h"
#include "strata/tensor.h"

#include <stdint.h>

typedef struct strata_sgd_config {
    float lr;
    float momentum;
    float weight_decay;
    float prox_mu;
    int nesterov;
    /* Cosine decay: when > 0, step t (counted from creation or the last
     * reset) uses lr * (1 + cos(pi * min(t, decay_steps) / decay_steps)) / 2.
     * 0 keeps lr constant. */
    size_t decay_steps;
} strata_sgd_config;

typedef struct strata_sgd strata_sgd;

/* Checks cfg (lr > 0, momentum in [0,1), weight_decay >= 0, prox_mu >= 0,
 * nesterov needs momentum > 0) and creates an optimiser for parameters laid
 * out like params (borrowed; only the layout is read). */
int strata_sgd_new(const strata_tensor_list *params, const strata_sgd_config *cfg, strata_sgd **out,
                   strata_diag *diag);
void strata_sgd_free(strata_sgd *o);

/* Sets the FedProx anchor (usually the global model the round started
 * from); borrowed, must outlive the steps. NULL disables the term. The
 * anchor must have the layout of params. */
int strata_sgd_set_anchor(strata_sgd *o, const strata_tensor_list *anchor);

/* Zeroes the momentum buffers and the step counter (e.g. at the start of a
 * federated round). */
void strata_sgd_reset(strata_sgd *o);

/* Applies one update to params from grads (same layout as at creation). */
int strata_sgd_step(strata_sgd *o, strata_tensor_list *params, const strata_tensor_list *grads);

/* The learning rate the next step will use. */
float strata_sgd_current_lr(const strata_sgd *o);

/* A half-cosine schedule from `from` at step 0 to `to` at step T:
 * to + (from - to) * (1 + cos(pi * min(t, T) / T)) / 2; `to` when T is 0.
 * strata_sgd_config.decay_steps (to 0) and the coordinator's server rate
 * (--server-lr-final) both use it. */
double strata_cosine_schedule(double from, double to, uint64_t t, uint64_t T);

#endif
