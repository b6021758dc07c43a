/* The model's layers on oneDNN: convolution, linear (inner product) and
 * max and average pooling, forward and backward, with the bias and a following ReLU
 * fused into the forward primitive. Primitives are created once per batch
 * size and reused across steps; images stay in oneDNN's blocked layout
 * between them (model_internal.h says where layouts change). Element-wise
 * layers, GroupNorm and the residual add stay on the model's own loops
 * (model.c, model_ops.c), on either layout; all of them share the one
 * OpenMP thread pool set by strata_set_threads().
 *
 * At a fixed thread count oneDNN's CPU kernels are deterministic, so a
 * seeded run stays bit-for-bit reproducible. */
#include "model_internal.h"

#include <oneapi/dnnl/dnnl.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

/* Batch sizes kept (the training batch and a remainder); a plan is made
 * again when the thread count changed. */
#define PLANS 2

typedef struct dlayer {
    dnnl_memory_desc_t x_md, y_md;   /* activations in their chosen layouts */
    dnnl_memory_desc_t wf_md, wb_md; /* weights as forward / backward-data want them */
    dnnl_memory_desc_t gw_md, ws_md; /* weight gradient as produced; pool workspace */
    dnnl_primitive_t fwd, bwd_data, bwd_w;
    dnnl_primitive_t w_to_f, w_to_b, gw_to_plain; /* NULL when no reorder is needed */
    dnnl_primitive_t to_plain, to_blocked;        /* flatten of a blocked image */
    void *wf, *wb, *gw, *ws;
} dlayer;

typedef struct plan {
    size_t batch;
    int threads;                 /* OpenMP threads when made: oneDNN splits work for them */
    unsigned long used;          /* last use, for replacing the older plan */
    int blocked[MAX_LAYERS + 1]; /* act[i] is nChw16c */
    int fused[MAX_LAYERS];       /* layer i (conv2d, linear) computes the ReLU i + 1 too */
    dlayer L[MAX_LAYERS];
} plan;

struct strata__dnnl {
    dnnl_engine_t eng;
    dnnl_stream_t st;
    plan *plans[PLANS];
    plan *cur;
    unsigned long clock;
    int wide; /* the CPU has AVX-512: blocked (nChw16c) activations pay */
};

static void free_plan(plan *p)
{
    if (p == NULL)
        return;
    for (int i = 0; i < MAX_LAYERS; i++) {
        dlayer *d = &p->L[i];
        dnnl_primitive_t *prims[] = {&d->fwd,    &d->bwd_data,    &d->bwd_w,    &d->w_to_f,
                                     &d->w_to_b, &d->gw_to_plain, &d->to_plain, &d->to_blocked};
        for (size_t j = 0; j < sizeof(prims) / sizeof(prims[0]); j++)
            if (*prims[j] != NULL)
                dnnl_primitive_destroy(*prims[j]);
        free(d->wf);
        free(d->wb);
        free(d->gw);
        free(d->ws);
    }
    free(p);
}

void strata__dnnl_free(strata__dnnl *d)
{
    if (d == NULL)
        return;
    for (int i = 0; i < PLANS; i++)
        free_plan(d->plans[i]);
    if (d->st != NULL)
        dnnl_stream_destroy(d->st);
    if (d->eng != NULL)
        dnnl_engine_destroy(d->eng);
    free(d);
}

static int err(dnnl_status_t s)
{
    return s == dnnl_out_of_memory ? STRATA_ENOMEM : STRATA_EINVAL;
}

/* Creates the primitive of an operation descriptor; *pd_out (optional)
 * receives its primitive descriptor, which the caller destroys. */
static int make(strata__dnnl *d, const void *desc, const_dnnl_primitive_attr_t attr,
                const_dnnl_primitive_desc_t hint, dnnl_primitive_t *prim,
                dnnl_primitive_desc_t *pd_out)
{
    dnnl_primitive_desc_t pd;
    dnnl_status_t s = dnnl_primitive_desc_create(&pd, desc, attr, d->eng, hint);
    if (s != dnnl_success)
        return err(s);
    s = dnnl_primitive_create(prim, pd);
    if (s == dnnl_success && pd_out != NULL) {
        *pd_out = pd;
        return STRATA_OK;
    }
    dnnl_primitive_desc_destroy(pd);
    return s == dnnl_success ? STRATA_OK : err(s);
}

static int make_reorder(strata__dnnl *d, const dnnl_memory_desc_t *from,
                        const dnnl_memory_desc_t *to, dnnl_primitive_t *prim)
{
    dnnl_primitive_desc_t pd;
    dnnl_status_t s = dnnl_reorder_primitive_desc_create(&pd, from, d->eng, to, d->eng, NULL);
    if (s != dnnl_success)
        return err(s);
    s = dnnl_primitive_create(prim, pd);
    dnnl_primitive_desc_destroy(pd);
    return s == dnnl_success ? STRATA_OK : err(s);
}

/* A buffer for memory of descriptor md (64-byte aligned). */
static int alloc_md(const dnnl_memory_desc_t *md, void **buf)
{
    size_t n = dnnl_memory_desc_get_size(md);
    n = (n + 63) / 64 * 64;
    *buf = aligned_alloc(64, n ? n : 64);
    return *buf != NULL ? STRATA_OK : STRATA_ENOMEM;
}

static void md4(dnnl_memory_desc_t *md, size_t B, int c, int h, int w, dnnl_format_tag_t tag)
{
    dnnl_dims_t dims = {(dnnl_dim_t)B, c, h, w};
    dnnl_memory_desc_init_by_tag(md, 4, dims, dnnl_f32, tag);
}

/* nChw16c is the layout of oneDNN's AVX-512 kernels; without AVX-512 it
 * has only reference kernels for it (a hundred times slower), while plain
 * NCHW convolutions still run on its JIT GEMM. */
static int blockable(const strata__dnnl *d, int channels)
{
    return d->wide && channels % 16 == 0;
}

/* Weights: plain OIHW md and the format primitive pd wants (query q); a
 * reorder and a buffer when they differ. */
static int weights_reorder(strata__dnnl *d, const dnnl_memory_desc_t *plain,
                           const_dnnl_primitive_desc_t pd, dnnl_query_t q, int to_plain,
                           dnnl_memory_desc_t *want, dnnl_primitive_t *re, void **buf)
{
    *want = *dnnl_primitive_desc_query_md(pd, q, 0);
    if (dnnl_memory_desc_equal(want, plain))
        return STRATA_OK;
    int rc = to_plain ? make_reorder(d, want, plain, re) : make_reorder(d, plain, want, re);
    return rc < 0 ? rc : alloc_md(want, buf);
}

/* A ReLU fused into the forward convolution (relu = 1): the convolution then
 * writes the ReLU's output. */
static int relu_attr(int relu, dnnl_primitive_attr_t *attr)
{
    *attr = NULL;
    if (!relu)
        return STRATA_OK;
    dnnl_post_ops_t po = NULL;
    int ok =
        dnnl_primitive_attr_create(attr) == dnnl_success &&
        dnnl_post_ops_create(&po) == dnnl_success &&
        dnnl_post_ops_append_eltwise(po, 1.0f, dnnl_eltwise_relu, 0.0f, 0.0f) == dnnl_success &&
        dnnl_primitive_attr_set_post_ops(*attr, po) == dnnl_success;
    if (po != NULL)
        dnnl_post_ops_destroy(po);
    if (!ok && *attr != NULL) {
        dnnl_primitive_attr_destroy(*attr);
        *attr = NULL;
    }
    return ok ? STRATA_OK : STRATA_ENOMEM;
}

static int plan_conv(strata__dnnl *d, const layer *L, dlayer *dl, dnnl_format_tag_t xt,
                     dnnl_format_tag_t yt, int relu, size_t B)
{
    md4(&dl->x_md, B, L->in_c, L->in_h, L->in_w, xt);
    md4(&dl->y_md, B, L->out_c, L->out_h, L->out_w, yt);
    dnnl_memory_desc_t w_any, w_plain, b_md;
    dnnl_dims_t wd = {L->out_c, L->in_c, L->k, L->k}, bd = {L->out_c};
    dnnl_memory_desc_init_by_tag(&w_any, 4, wd, dnnl_f32, dnnl_format_tag_any);
    dnnl_memory_desc_init_by_tag(&w_plain, 4, wd, dnnl_f32, dnnl_oihw);
    dnnl_memory_desc_init_by_tag(&b_md, 1, bd, dnnl_f32, dnnl_a);
    const dnnl_memory_desc_t *bp = L->has_bias ? &b_md : NULL;
    dnnl_dims_t strides = {L->stride, L->stride}, pad = {L->pad, L->pad};
    dnnl_convolution_desc_t cd;
    dnnl_primitive_desc_t fpd = NULL, pd = NULL;
    if (dnnl_convolution_forward_desc_init(&cd, dnnl_forward_training, dnnl_convolution_direct,
                                           &dl->x_md, &w_any, bp, &dl->y_md, strides, pad,
                                           pad) != dnnl_success)
        return STRATA_EINVAL;
    dnnl_primitive_attr_t attr;
    int rc = relu_attr(relu, &attr);
    if (rc == STRATA_OK)
        rc = make(d, &cd, attr, NULL, &dl->fwd, &fpd);
    if (attr != NULL)
        dnnl_primitive_attr_destroy(attr);
    if (rc == STRATA_OK)
        rc = weights_reorder(d, &w_plain, fpd, dnnl_query_weights_md, 0, &dl->wf_md, &dl->w_to_f,
                             &dl->wf);
    if (rc == STRATA_OK &&
        dnnl_convolution_backward_data_desc_init(&cd, dnnl_convolution_direct, &dl->x_md, &w_any,
                                                 &dl->y_md, strides, pad, pad) != dnnl_success)
        rc = STRATA_EINVAL;
    if (rc == STRATA_OK)
        rc = make(d, &cd, NULL, fpd, &dl->bwd_data, &pd);
    if (rc == STRATA_OK)
        rc = weights_reorder(d, &w_plain, pd, dnnl_query_weights_md, 0, &dl->wb_md, &dl->w_to_b,
                             &dl->wb);
    if (pd != NULL)
        dnnl_primitive_desc_destroy(pd);
    pd = NULL;
    if (rc == STRATA_OK && dnnl_convolution_backward_weights_desc_init(
                               &cd, dnnl_convolution_direct, &dl->x_md, &w_any, bp, &dl->y_md,
                               strides, pad, pad) != dnnl_success)
        rc = STRATA_EINVAL;
    if (rc == STRATA_OK)
        rc = make(d, &cd, NULL, fpd, &dl->bwd_w, &pd);
    if (rc == STRATA_OK)
        rc = weights_reorder(d, &w_plain, pd, dnnl_query_diff_weights_md, 1, &dl->gw_md,
                             &dl->gw_to_plain, &dl->gw);
    if (pd != NULL)
        dnnl_primitive_desc_destroy(pd);
    if (fpd != NULL)
        dnnl_primitive_desc_destroy(fpd);
    return rc;
}

/* Linear: an inner product on plain (batch x features) activations and
 * plain (out x in) weights, so that no reorder is needed. */
static int plan_linear(strata__dnnl *d, const layer *L, dlayer *dl, int relu, size_t B)
{
    dnnl_dims_t xd = {(dnnl_dim_t)B, (dnnl_dim_t)L->in_dim}, yd = {(dnnl_dim_t)B, L->out_c};
    dnnl_dims_t wd = {L->out_c, (dnnl_dim_t)L->in_dim}, bd = {L->out_c};
    dnnl_memory_desc_t b_md;
    dnnl_memory_desc_init_by_tag(&dl->x_md, 2, xd, dnnl_f32, dnnl_ab);
    dnnl_memory_desc_init_by_tag(&dl->y_md, 2, yd, dnnl_f32, dnnl_ab);
    dnnl_memory_desc_init_by_tag(&dl->wf_md, 2, wd, dnnl_f32, dnnl_ab);
    dnnl_memory_desc_init_by_tag(&b_md, 1, bd, dnnl_f32, dnnl_a);
    dl->wb_md = dl->gw_md = dl->wf_md;
    const dnnl_memory_desc_t *bp = L->has_bias ? &b_md : NULL;
    dnnl_inner_product_desc_t ipd;
    dnnl_primitive_desc_t fpd = NULL;
    if (dnnl_inner_product_forward_desc_init(&ipd, dnnl_forward_training, &dl->x_md, &dl->wf_md, bp,
                                             &dl->y_md) != dnnl_success)
        return STRATA_EINVAL;
    dnnl_primitive_attr_t attr;
    int rc = relu_attr(relu, &attr);
    if (rc == STRATA_OK)
        rc = make(d, &ipd, attr, NULL, &dl->fwd, &fpd);
    if (attr != NULL)
        dnnl_primitive_attr_destroy(attr);
    if (rc == STRATA_OK && dnnl_inner_product_backward_data_desc_init(&ipd, &dl->x_md, &dl->wb_md,
                                                                      &dl->y_md) != dnnl_success)
        rc = STRATA_EINVAL;
    if (rc == STRATA_OK)
        rc = make(d, &ipd, NULL, fpd, &dl->bwd_data, NULL);
    if (rc == STRATA_OK && dnnl_inner_product_backward_weights_desc_init(
                               &ipd, &dl->x_md, &dl->gw_md, bp, &dl->y_md) != dnnl_success)
        rc = STRATA_EINVAL;
    if (rc == STRATA_OK)
        rc = make(d, &ipd, NULL, fpd, &dl->bwd_w, NULL);
    if (fpd != NULL)
        dnnl_primitive_desc_destroy(fpd);
    return rc;
}

static int plan_pool(strata__dnnl *d, const layer *L, dlayer *dl, dnnl_format_tag_t t, size_t B)
{
    md4(&dl->x_md, B, L->in_c, L->in_h, L->in_w, t);
    md4(&dl->y_md, B, L->out_c, L->out_h, L->out_w, t);
    const int max = L->kind == L_MAXPOOL;
    const dnnl_alg_kind_t alg = max ? dnnl_pooling_max : dnnl_pooling_avg_exclude_padding;
    dnnl_dims_t strides = {L->stride, L->stride}, zero = {0, 0};
    dnnl_dims_t kernel = {L->kh, L->kw};
    dnnl_pooling_desc_t pdesc;
    dnnl_primitive_desc_t fpd = NULL;
    if (dnnl_pooling_forward_desc_init(&pdesc, dnnl_forward_training, alg, &dl->x_md, &dl->y_md,
                                       strides, kernel, zero, zero) != dnnl_success)
        return STRATA_EINVAL;
    int rc = make(d, &pdesc, NULL, NULL, &dl->fwd, &fpd);
    if (rc == STRATA_OK && max) { /* the arg-max positions */
        dl->ws_md = *dnnl_primitive_desc_query_md(fpd, dnnl_query_workspace_md, 0);
        rc = alloc_md(&dl->ws_md, &dl->ws);
    }
    if (rc == STRATA_OK &&
        dnnl_pooling_backward_desc_init(&pdesc, alg, &dl->x_md, &dl->y_md, strides, kernel, zero,
                                        zero) != dnnl_success)
        rc = STRATA_EINVAL;
    if (rc == STRATA_OK)
        rc = make(d, &pdesc, NULL, fpd, &dl->bwd_data, NULL);
    if (fpd != NULL)
        dnnl_primitive_desc_destroy(fpd);
    return rc;
}

static int plan_flatten(strata__dnnl *d, const layer *L, dlayer *dl, size_t B)
{
    dnnl_memory_desc_t plain;
    md4(&dl->x_md, B, L->in_c, L->in_h, L->in_w, dnnl_nChw16c);
    md4(&plain, B, L->in_c, L->in_h, L->in_w, dnnl_nchw);
    int rc = make_reorder(d, &dl->x_md, &plain, &dl->to_plain);
    return rc < 0 ? rc : make_reorder(d, &plain, &dl->x_md, &dl->to_blocked);
}

/* Layers that read and write one layout, whatever it is. */
static int keeps_layout(layer_kind k)
{
    return k == L_MAXPOOL || k == L_AVGPOOL || k == L_GROUPNORM || k == L_ADD || k == L_RELU ||
           k == L_DROPOUT;
}

/* Chooses the layout of every activation (blocked[i]: act[i] is nChw16c)
 * and creates the primitives for batch B. Convolutions choose their output
 * layout; the layers that keep a layout pass theirs on. STRATA_EINVAL when
 * the layouts cannot agree (an add of a blocked and a plain image, an
 * element-wise tail between a residual and the logits): the model then runs
 * on the reference kernels. */
static int plan_new(strata__dnnl *d, const strata_model *m, size_t B, plan **out)
{
    *out = NULL;
    plan *p = calloc(1, sizeof(*p));
    if (p == NULL)
        return STRATA_ENOMEM;
    p->batch = B;
    p->threads = omp_get_max_threads();
    int *blocked = p->blocked;
    int readers[MAX_LAYERS + 1] = {0};
    for (int i = 0; i < m->nlayers; i++) {
        const layer *L = &m->layers[i];
        readers[L->src]++;
        if (L->kind == L_ADD)
            readers[L->with]++;
        if (L->kind == L_CONV2D)
            blocked[i + 1] = blockable(d, L->out_c);
        else if (keeps_layout(L->kind))
            blocked[i + 1] = blocked[L->src];
    }
    /* The logits are plain, and so is every image an element-wise tail
     * before them reads. */
    for (int i = m->nlayers; i > 0;) {
        const layer *L = &m->layers[i - 1];
        blocked[i] = 0;
        if (L->kind != L_RELU && L->kind != L_DROPOUT && L->kind != L_MAXPOOL &&
            L->kind != L_AVGPOOL)
            break;
        i = L->src;
    }
    int rc = STRATA_OK;
    for (int i = 0; i < m->nlayers && rc == STRATA_OK; i++) {
        const layer *L = &m->layers[i];
        dnnl_format_tag_t xt = blocked[L->src] ? dnnl_nChw16c : dnnl_nchw;
        dnnl_format_tag_t yt = blocked[i + 1] ? dnnl_nChw16c : dnnl_nchw;
        if (keeps_layout(L->kind) &&
            (xt != yt || (L->kind == L_ADD && blocked[L->with] != blocked[i + 1])))
            rc = STRATA_EINVAL;
        /* The ReLU is fused when it alone reads the layer's output. */
        p->fused[i] = (L->kind == L_CONV2D || L->kind == L_LINEAR) && i + 1 < m->nlayers &&
                      m->layers[i + 1].kind == L_RELU && m->layers[i + 1].src == i + 1 &&
                      readers[i + 1] == 1;
        if (rc < 0)
            break;
        if (L->kind == L_LINEAR)
            rc = plan_linear(d, L, &p->L[i], p->fused[i], B);
        else if (L->kind == L_CONV2D)
            rc = plan_conv(d, L, &p->L[i], xt, yt, p->fused[i], B);
        else if (L->kind == L_MAXPOOL || L->kind == L_AVGPOOL)
            rc = plan_pool(d, L, &p->L[i], xt, B);
        else if (L->kind == L_FLATTEN && blocked[L->src])
            rc = plan_flatten(d, L, &p->L[i], B);
    }
    if (rc < 0) {
        free_plan(p);
        return rc;
    }
    *out = p;
    return STRATA_OK;
}

int strata__dnnl_prepare(strata_model *m, size_t batch)
{
    strata__dnnl *d = m->dnnl;
    if (d == NULL) {
        d = calloc(1, sizeof(*d));
        if (d == NULL)
            return STRATA_ENOMEM;
        if (dnnl_engine_create(&d->eng, dnnl_cpu, 0) != dnnl_success ||
            dnnl_stream_create(&d->st, d->eng, dnnl_stream_default_flags) != dnnl_success) {
            strata__dnnl_free(d);
            return STRATA_EINVAL;
        }
        d->wide =
            (dnnl_get_effective_cpu_isa() & dnnl_cpu_isa_avx512_core) == dnnl_cpu_isa_avx512_core;
        m->dnnl = d;
    }
    d->clock++;
    int slot = 0;
    for (int i = 0; i < PLANS; i++) {
        if (d->plans[i] != NULL && d->plans[i]->batch == batch &&
            d->plans[i]->threads == omp_get_max_threads()) {
            d->cur = d->plans[i];
            d->cur->used = d->clock;
            return STRATA_OK;
        }
        if (d->plans[i] == NULL ||
            (d->plans[slot] != NULL && d->plans[i]->used < d->plans[slot]->used))
            slot = i;
    }
    plan *p;
    int rc = plan_new(d, m, batch, &p);
    if (rc < 0)
        return rc;
    free_plan(d->plans[slot]);
    d->plans[slot] = p;
    p->used = d->clock;
    d->cur = p;
    return STRATA_OK;
}

/* ---- execution ---- */

typedef struct arg {
    int kind;
    const dnnl_memory_desc_t *md;
    const void *ptr;
} arg;

static int run(strata__dnnl *d, dnnl_primitive_t prim, int n, const arg *a)
{
    dnnl_exec_arg_t ex[6];
    int made = 0, rc = STRATA_OK;
    for (; made < n; made++) {
        ex[made].arg = a[made].kind;
        if (dnnl_memory_create(&ex[made].memory, a[made].md, d->eng, (void *)a[made].ptr) !=
            dnnl_success) {
            rc = STRATA_ENOMEM;
            break;
        }
    }
    if (rc == STRATA_OK && (dnnl_primitive_execute(prim, d->st, n, ex) != dnnl_success ||
                            dnnl_stream_wait(d->st) != dnnl_success))
        rc = STRATA_EIO;
    for (int i = 0; i < made; i++)
        dnnl_memory_destroy(ex[i].memory);
    return rc;
}

static int reorder(strata__dnnl *d, dnnl_primitive_t re, const dnnl_memory_desc_t *from,
                   const void *src, const dnnl_memory_desc_t *to, void *dst)
{
    const arg a[] = {{DNNL_ARG_FROM, from, src}, {DNNL_ARG_TO, to, dst}};
    return run(d, re, 2, a);
}

static void plain_weights(const layer *L, dnnl_memory_desc_t *md)
{
    dnnl_dims_t wd = {L->out_c, L->in_c, L->k, L->k};
    dnnl_memory_desc_init_by_tag(md, 4, wd, dnnl_f32, dnnl_oihw);
}

int strata__dnnl_conv_forward(strata_model *m, int li, const float *x, float *y)
{
    strata__dnnl *d = m->dnnl;
    dlayer *dl = &d->cur->L[li];
    const layer *L = &m->layers[li];
    const float *w = m->params.items[L->w].data;
    dnnl_memory_desc_t wp, b_md;
    plain_weights(L, &wp);
    dnnl_dims_t bd = {L->out_c};
    dnnl_memory_desc_init_by_tag(&b_md, 1, bd, dnnl_f32, dnnl_a);
    int rc = STRATA_OK;
    if (dl->w_to_f != NULL) {
        rc = reorder(d, dl->w_to_f, &wp, w, &dl->wf_md, dl->wf);
        w = dl->wf;
    }
    /* The backward-data weights are the same values: reorder them now too,
     * while they are in cache. */
    if (rc == STRATA_OK && dl->w_to_b != NULL)
        rc = reorder(d, dl->w_to_b, &wp, m->params.items[L->w].data, &dl->wb_md, dl->wb);
    if (rc < 0)
        return rc;
    arg a[4] = {{DNNL_ARG_SRC, &dl->x_md, x},
                {DNNL_ARG_WEIGHTS, &dl->wf_md, w},
                {DNNL_ARG_DST, &dl->y_md, y},
                {DNNL_ARG_BIAS, &b_md, NULL}};
    if (L->b >= 0)
        a[3].ptr = m->params.items[L->b].data;
    return run(d, dl->fwd, L->b >= 0 ? 4 : 3, a);
}

int strata__dnnl_conv_backward(strata_model *m, int li, const float *x, const float *dy, float *dx)
{
    strata__dnnl *d = m->dnnl;
    dlayer *dl = &d->cur->L[li];
    const layer *L = &m->layers[li];
    dnnl_memory_desc_t wp, b_md;
    plain_weights(L, &wp);
    dnnl_dims_t bd = {L->out_c};
    dnnl_memory_desc_init_by_tag(&b_md, 1, bd, dnnl_f32, dnnl_a);
    float *gw = m->grads.items[L->w].data;
    arg a[4] = {{DNNL_ARG_SRC, &dl->x_md, x},
                {DNNL_ARG_DIFF_DST, &dl->y_md, dy},
                {DNNL_ARG_DIFF_WEIGHTS, &dl->gw_md, dl->gw_to_plain ? dl->gw : gw},
                {DNNL_ARG_DIFF_BIAS, &b_md, NULL}};
    if (L->b >= 0)
        a[3].ptr = m->grads.items[L->b].data;
    int rc = run(d, dl->bwd_w, L->b >= 0 ? 4 : 3, a);
    if (rc == STRATA_OK && dl->gw_to_plain != NULL)
        rc = reorder(d, dl->gw_to_plain, &dl->gw_md, dl->gw, &wp, gw);
    if (rc < 0 || dx == NULL)
        return rc;
    const arg b[3] = {
        {DNNL_ARG_DIFF_DST, &dl->y_md, dy},
        {DNNL_ARG_WEIGHTS, &dl->wb_md, dl->w_to_b ? dl->wb : m->params.items[L->w].data},
        {DNNL_ARG_DIFF_SRC, &dl->x_md, dx}};
    return run(d, dl->bwd_data, 3, b);
}

int strata__dnnl_linear_forward(strata_model *m, int li, const float *x, float *y)
{
    dlayer *dl = &m->dnnl->cur->L[li];
    const layer *L = &m->layers[li];
    dnnl_memory_desc_t b_md;
    dnnl_dims_t bd = {L->out_c};
    dnnl_memory_desc_init_by_tag(&b_md, 1, bd, dnnl_f32, dnnl_a);
    arg a[4] = {{DNNL_ARG_SRC, &dl->x_md, x},
                {DNNL_ARG_WEIGHTS, &dl->wf_md, m->params.items[L->w].data},
                {DNNL_ARG_DST, &dl->y_md, y},
                {DNNL_ARG_BIAS, &b_md, NULL}};
    if (L->b >= 0)
        a[3].ptr = m->params.items[L->b].data;
    return run(m->dnnl, dl->fwd, L->b >= 0 ? 4 : 3, a);
}

int strata__dnnl_linear_backward(strata_model *m, int li, const float *x, const float *dy,
                                 float *dx)
{
    dlayer *dl = &m->dnnl->cur->L[li];
    const layer *L = &m->layers[li];
    dnnl_memory_desc_t b_md;
    dnnl_dims_t bd = {L->out_c};
    dnnl_memory_desc_init_by_tag(&b_md, 1, bd, dnnl_f32, dnnl_a);
    arg a[4] = {{DNNL_ARG_SRC, &dl->x_md, x},
                {DNNL_ARG_DIFF_DST, &dl->y_md, dy},
                {DNNL_ARG_DIFF_WEIGHTS, &dl->gw_md, m->grads.items[L->w].data},
                {DNNL_ARG_DIFF_BIAS, &b_md, NULL}};
    if (L->b >= 0)
        a[3].ptr = m->grads.items[L->b].data;
    int rc = run(m->dnnl, dl->bwd_w, L->b >= 0 ? 4 : 3, a);
    if (rc < 0 || dx == NULL)
        return rc;
    const arg b[3] = {{DNNL_ARG_DIFF_DST, &dl->y_md, dy},
                      {DNNL_ARG_WEIGHTS, &dl->wb_md, m->params.items[L->w].data},
                      {DNNL_ARG_DIFF_SRC, &dl->x_md, dx}};
    return run(m->dnnl, dl->bwd_data, 3, b);
}

/* Max pooling passes its workspace (the arg-max positions); average
 * pooling has none. */
int strata__dnnl_pool_forward(strata_model *m, int li, const float *x, float *y)
{
    dlayer *dl = &m->dnnl->cur->L[li];
    const arg a[3] = {{DNNL_ARG_SRC, &dl->x_md, x},
                      {DNNL_ARG_DST, &dl->y_md, y},
                      {DNNL_ARG_WORKSPACE, &dl->ws_md, dl->ws}};
    return run(m->dnnl, dl->fwd, dl->ws != NULL ? 3 : 2, a);
}

int strata__dnnl_pool_backward(strata_model *m, int li, const float *dy, float *dx)
{
    dlayer *dl = &m->dnnl->cur->L[li];
    const arg a[3] = {{DNNL_ARG_DIFF_DST, &dl->y_md, dy},
                      {DNNL_ARG_DIFF_SRC, &dl->x_md, dx},
                      {DNNL_ARG_WORKSPACE, &dl->ws_md, dl->ws}};
    return run(m->dnnl, dl->bwd_data, dl->ws != NULL ? 3 : 2, a);
}

int strata__dnnl_flatten_forward(strata_model *m, int li, const float *x, float *y)
{
    dlayer *dl = &m->dnnl->cur->L[li];
    const layer *L = &m->layers[li];
    if (dl->to_plain == NULL) {
        memcpy(y, x, m->dnnl->cur->batch * L->in_dim * sizeof(float));
        return STRATA_OK;
    }
    dnnl_memory_desc_t plain;
    md4(&plain, m->dnnl->cur->batch, L->in_c, L->in_h, L->in_w, dnnl_nchw);
    return reorder(m->dnnl, dl->to_plain, &dl->x_md, x, &plain, y);
}

int strata__dnnl_flatten_backward(strata_model *m, int li, const float *dy, float *dx)
{
    dlayer *dl = &m->dnnl->cur->L[li];
    const layer *L = &m->layers[li];
    if (dl->to_blocked == NULL) {
        memcpy(dx, dy, m->dnnl->cur->batch * L->in_dim * sizeof(float));
        return STRATA_OK;
    }
    dnnl_memory_desc_t plain;
    md4(&plain, m->dnnl->cur->batch, L->in_c, L->in_h, L->in_w, dnnl_nchw);
    return reorder(m->dnnl, dl->to_blocked, &plain, dy, &dl->x_md, dx);
}

int strata__dnnl_blocked(const strata_model *m, int k)
{
    return m->dnnl->cur->blocked[k];
}

size_t strata__dnnl_index(const strata_model *m, int li, size_t i)
{
    if (!m->dnnl->cur->blocked[m->layers[li].src])
        return i;
    const layer *L = &m->layers[li];
    const size_t C = (size_t)L->in_c, HW = (size_t)L->in_h * L->in_w;
    const size_t b = i / (C * HW), c = i / HW % C, s = i % HW;
    return ((b * (C / 16) + c / 16) * HW + s) * 16 + c % 16;
}

int strata__dnnl_fused_relu(const strata_model *m, int li)
{
    return li >= 0 && m->dnnl->cur->fused[li];
}
