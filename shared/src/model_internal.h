/* Internals of the model engine shared by its files: model.c (the
 * architecture, buffers, element-wise layers, the reference linear layer,
 * the loss and the forward/backward drivers), model_ref.c (the reference
 * convolution and pooling kernels), model_ops.c (GroupNorm, average pooling
 * on plain images and the residual add) and model_dnnl.c (convolution,
 * linear and pooling on oneDNN primitives).
 *
 * The network is a list of layers. act[0] is the (normalised) input and
 * act[i + 1] the output of layer i; layer i reads act[src] (src = i unless
 * the architecture names another layer's output as its "input"), and an add
 * layer also reads act[with]. Every activation but the logits has at least
 * one reader. Backward writes the gradient of act[k] into gact[k]: the last
 * reader of act[k] (the first one the backward pass meets) writes it, the
 * others add theirs (acc_src, acc_with).
 *
 * Activation buffers act[i] hold batch * dim floats. On the reference path
 * they are plain (NCHW for images, row-major for flat vectors). On the
 * oneDNN path an image whose channel count is a multiple of 16 may be kept in
 * oneDNN's blocked layout (nChw16c: same size, channels interleaved by 16)
 * between convolutions, poolings and element-wise layers; the network input,
 * the logits, every flat vector and every parameter and gradient stay plain. */
#ifndef STRATA_MODEL_INTERNAL_H
#define STRATA_MODEL_INTERNAL_H

#include "strata/model.h"

#include <stddef.h>
#include <stdint.h>

#define MAX_LAYERS 128
#define MAX_ARCH_BYTES (1u << 20)
#define MAX_DIM_SIZE 65536
/* Loops over fewer elements run on one thread: a parallel region costs more
 * than it saves there, and far more when a core is busy with another process. */
#define PAR_MIN ((size_t)1 << 16)

typedef enum {
    L_LINEAR,
    L_CONV2D,
    L_MAXPOOL,
    L_AVGPOOL, /* also the global average pooling: a kernel the size of the input */
    L_GROUPNORM,
    L_ADD,
    L_RELU,
    L_FLATTEN,
    L_DROPOUT
} layer_kind;

typedef struct layer {
    layer_kind kind;
    int in_c, in_h, in_w; /* per-sample input geometry (flat: in_c features) */
    int out_c, out_h, out_w;
    size_t in_dim, out_dim;
    int flat;              /* the output is a flat vector */
    int src, with;         /* act[src] is the input; add: act[with] is added to it */
    int acc_src, acc_with; /* backward adds to gact[src] / gact[with] */
    int k, stride, pad;    /* conv2d (k: square kernel); stride also for pooling */
    int kh, kw;            /* pooling: the kernel (global_avgpool2d: the whole input) */
    int groups;            /* groupnorm */
    float eps;             /* groupnorm */
    int has_bias;
    float p;         /* dropout probability */
    int w, b;        /* indices into params/grads, -1 when absent */
    float *stats;    /* groupnorm: per (sample, group) mean, 1/std and two
                        backward coefficients, 4 * B * groups */
    double *chs;     /* groupnorm: two sums per (sample, channel), 2 * B * C */
    float *cols;     /* conv2d (reference): im2col of the last forward, K x (B*P) */
    int32_t *argmax; /* maxpool2d (reference): flat input offset per output */
    float *mask;     /* dropout: scale per element of the last forward */
} layer;

/* Rows (C*K*K) and columns per sample (OH*OW) of a convolution's im2col
 * matrix. */
static inline size_t strata__conv_k(const layer *L)
{
    return (size_t)L->in_c * L->k * L->k;
}

static inline size_t strata__conv_p(const layer *L)
{
    return (size_t)L->out_h * L->out_w;
}

/* The oneDNN state of one model: engine, stream and the primitives of the
 * batch sizes in use (model_dnnl.c). */
typedef struct strata__dnnl strata__dnnl;

struct strata_model {
    char *arch;
    int nlayers;
    layer layers[MAX_LAYERS];
    strata_tensor_list params, grads;
    float mean, std;
    size_t cap_batch;  /* buffers sized for this many samples */
    size_t cap_grad;   /* gact, gtmp, dinput sized for this many; 0: not made */
    size_t batch;      /* samples in the last forward */
    float **act;       /* act[0]: input; act[i + 1]: output of layer i */
    float **gact;      /* gact[k]: gradient of act[k] (k >= 1) */
    float *gtmp;       /* a layer's input gradient before it is added */
    float *scratch[2]; /* conv2d workspaces (reference) */
    size_t max_dim, max_scratch;
    float *probs; /* softmax of the last loss computation */
    int input_grad;
    float *dinput;
    int dry; /* parsing only: count parameters, allocate nothing */
    size_t nparams;
    int reference;      /* 1: reference kernels only (im2col + sgemm) */
    int dnnl_active;    /* the last forward ran on oneDNN */
    strata__dnnl *dnnl; /* NULL until the first oneDNN forward */
    int dnnl_unusable;  /* oneDNN refused this architecture: reference kernels */
};

/* The reference kernels (model_ref.c), on plain layouts. ensure makes
 * their buffers for m->cap_batch samples on first use (STRATA_ENOMEM, with
 * none kept, when it cannot); free releases them. The convolution keeps its
 * im2col matrix from forward to backward; dx may be NULL in conv_backward. */
int strata__ref_ensure(strata_model *m);
void strata__ref_free(strata_model *m);
void strata__ref_conv_forward(strata_model *m, layer *L, const float *x, float *y, size_t B);
void strata__ref_conv_backward(strata_model *m, layer *L, const float *dy, float *dx, size_t B);
void strata__ref_maxpool_forward(layer *L, const float *x, float *y, size_t B);
void strata__ref_maxpool_backward(layer *L, const float *dy, float *dx, size_t B);

/* Average pooling on plain images (model_ops.c). */
void strata__avgpool_forward(const layer *L, const float *x, float *y, size_t B);
void strata__avgpool_backward(const layer *L, const float *dy, float *dx, size_t B);

/* GroupNorm (model_ops.c) on plain images, or on nChw16c ones when blocked
 * is 1 (C a multiple of 16). Forward keeps each group's statistics in
 * L->stats for the backward pass, which writes the weight and bias
 * gradients and, when dx is not NULL, the input gradient. */
void strata__groupnorm_forward(strata_model *m, layer *L, const float *x, float *y, size_t B,
                               int blocked);
void strata__groupnorm_backward(strata_model *m, layer *L, const float *x, const float *dy,
                                float *dx, size_t B, int blocked);

/* y = a + b, or y += a when b is NULL, over n floats (model_ops.c). */
void strata__add(float *y, const float *a, const float *b, size_t n);

/* Makes the oneDNN primitives for batch samples ready (created once per
 * batch size; the two most recent sizes are kept). Returns STRATA_OK when
 * every layer of m can run on oneDNN, STRATA_ENOMEM, or STRATA_EINVAL when
 * oneDNN has no implementation for some layer (the caller then uses the
 * reference kernels). */
int strata__dnnl_prepare(strata_model *m, size_t batch);

/* Frees the oneDNN state (accepts NULL). */
void strata__dnnl_free(strata__dnnl *d);

/* The oneDNN kernels of layer li for the batch of the last prepare. x, y,
 * dy, dx are activation buffers in the layouts the plan chose; parameters
 * and gradients are read and written in their plain PyTorch layout. dx may
 * be NULL in conv_backward (weight and bias gradients only). Each returns
 * STRATA_OK or STRATA_EIO when oneDNN fails to execute. */
int strata__dnnl_conv_forward(strata_model *m, int li, const float *x, float *y);
int strata__dnnl_conv_backward(strata_model *m, int li, const float *x, const float *dy, float *dx);
int strata__dnnl_linear_forward(strata_model *m, int li, const float *x, float *y);
int strata__dnnl_linear_backward(strata_model *m, int li, const float *x, const float *dy,
                                 float *dx);
int strata__dnnl_pool_forward(strata_model *m, int li, const float *x, float *y);
int strata__dnnl_pool_backward(strata_model *m, int li, const float *dy, float *dx);
/* Flatten: blocked image to plain vector (forward) and back (backward); a
 * plain copy when the image is plain already. */
int strata__dnnl_flatten_forward(strata_model *m, int li, const float *x, float *y);
int strata__dnnl_flatten_backward(strata_model *m, int li, const float *dy, float *dx);

/* 1 when the convolution li of the last prepare also computes the ReLU
 * li + 1 (oneDNN post-op): it then writes act[li + 2], and the ReLU's
 * forward has nothing left to do; its backward runs as usual. */
int strata__dnnl_fused_relu(const strata_model *m, int li);

/* Where plain element i (in NCHW order) of layer li's input lies in the
 * layout the plan chose for it. */
size_t strata__dnnl_index(const strata_model *m, int li, size_t i);

/* 1 when the plan keeps act[k] in the blocked layout. */
int strata__dnnl_blocked(const strata_model *m, int k);

/* Chooses the kernels of m: on = 1 forces the reference kernels (im2col +
 * sgemm, plain layouts), on = 0 (the default) uses oneDNN wherever it has
 * an implementation. Tests and benchmarks compare the two with it. */
void strata__model_set_reference(strata_model *m, int on);

/* "onednn" when the last forward pass ran on oneDNN, else "reference"
 * (also for models of element-wise layers only, which never need oneDNN:
 * their layers are the same on both kernel sets). */
const char *strata__model_kernels(const strata_model *m);

#endif
