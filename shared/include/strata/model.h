/* Models: a sequential network of layers described in JSON, with named
 * parameters (PyTorch state_dict names), forward and backward passes.
 *
 * Layers: linear, conv2d (stride, padding), maxpool2d, avgpool2d,
 * global_avgpool2d, groupnorm, add (a residual connection: a layer may read
 * any earlier layer's output), relu, flatten, dropout; convolutions, linear
 * layers and pooling run on oneDNN, with reference kernels (im2col +
 * OpenBLAS sgemm) beside them. The loss is softmax cross-entropy over the
 * last layer's outputs. Built-in architectures "mlp", "cnn" and "resnet"
 * are defined in the same JSON form as custom ones (docs/architecture.md
 * describes the format).
 *
 * A model owns its parameters, gradients and activation buffers; it is used
 * by one thread at a time (its kernels use OpenMP and BLAS threads inside).
 * With a fixed thread count, the same inputs give bit-identical results. */
#ifndef STRATA_MODEL_H
#define STRATA_MODEL_H

#include "strata/error.h"
#include "strata/rng.h"
#include "strata/tensor.h"

#include <stddef.h>
#include <stdint.h>

typedef struct strata_model strata_model;

/* Most parameters a model may have (1 GiB of float32). */
#define STRATA_MODEL_MAX_PARAMS ((size_t)1 << 28)

/* Builds a model from a built-in name ("mlp", "cnn", "resnet") or, when spec names an
 * existing file, from a JSON architecture file. Parameters are zero until
 * strata_model_init_params() or a load. Errors name the offending field. */
int strata_model_new(const char *spec, strata_model **out, strata_diag *diag);

/* Builds a model from JSON architecture text of len bytes. Errors:
 * STRATA_EINVAL naming the field, STRATA_ETOOBIG above
 * STRATA_MODEL_MAX_PARAMS parameters, STRATA_ENOMEM. */
int strata_model_from_json(const char *json, size_t len, strata_model **out, strata_diag *diag);

/* Counts the parameters an architecture would have without building it or
 * allocating any tensor (for checking untrusted descriptions against data
 * before committing memory). Same errors as strata_model_from_json(). */
int strata_model_count_params(const char *json, size_t len, size_t *count, strata_diag *diag);

/* Returns the JSON text of a built-in architecture, or NULL. */
const char *strata_model_builtin_json(const char *name);

void strata_model_free(strata_model *m);

/* Canonical compact JSON of the architecture (borrowed, lives with m). */
const char *strata_model_arch(const strata_model *m);

/* Parameters and gradients, in layer order (borrowed, live with m). Callers
 * may change values but not names or shapes. */
strata_tensor_list *strata_model_params(strata_model *m);
strata_tensor_list *strata_model_grads(strata_model *m);

/* PyTorch's default initialisation: weights and biases uniform in
 * +-1/sqrt(fan_in), drawn from a generator seeded with seed; GroupNorm
 * weights 1 and biases 0. */
void strata_model_init_params(strata_model *m, uint64_t seed);

/* Input preprocessing applied after scaling pixels to [0,1]:
 * x' = (x - mean) / std. Defaults to mean 0, std 1. std must be > 0. */
int strata_model_set_normalization(strata_model *m, float mean, float std);
void strata_model_get_normalization(const strata_model *m, float *mean, float *std);

size_t strata_model_input_dim(const strata_model *m);
size_t strata_model_output_dim(const strata_model *m);

/* Runs the network on batch samples x (batch * input_dim floats, borrowed,
 * not yet normalised). training enables dropout, whose masks come from rng
 * (may be NULL when the model has no dropout or training is 0). *logits
 * receives a borrowed pointer to batch * output_dim values, valid until the
 * next call. The model keeps its activation buffers for the largest batch it
 * has run; its gradient buffers are made by a backward pass that needs them
 * (and dropped when the activation buffers grow), so a model that only runs
 * forward holds about half as much on oneDNN. */
int strata_model_forward(strata_model *m, const float *x, size_t batch, int training,
                         strata_rng *rng, const float **logits);

/* Softmax cross-entropy of the last forward pass against labels, then the
 * backward pass: gradients (mean over the batch) overwrite grads. Reports the
 * mean loss and the number of correct arg-max predictions (either may be
 * NULL). Returns STRATA_EINVAL for a label >= output_dim. */
int strata_model_backward(strata_model *m, const uint8_t *labels, double *loss, size_t *correct);

/* Backward pass from an arbitrary gradient of the outputs (batch *
 * output_dim floats, borrowed) of the last forward pass. Either backward
 * returns STRATA_ENOMEM when the gradient buffers cannot be made. */
int strata_model_backward_from(strata_model *m, const float *dlogits);

/* Loss and correct count of the last forward pass without a backward. */
int strata_model_loss(strata_model *m, const uint8_t *labels, double *loss, size_t *correct);

/* When on, backward also computes the gradient with respect to the
 * (normalised) input, readable with strata_model_input_grad() after a
 * backward pass (NULL before one, and after a forward pass on a larger batch
 * than any before it). Off by default. */
void strata_model_set_input_grad(strata_model *m, int on);
const float *strata_model_input_grad(const strata_model *m);

/* Sets the number of threads used by OpenMP loops and BLAS (process-wide).
 * threads <= 0 means: OMP_NUM_THREADS when set, else all cores. Returns the
 * number in force. */
int strata_set_threads(int threads);

#endif
