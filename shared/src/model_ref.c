/* The model's reference kernels: convolution as im2col + OpenBLAS sgemm and
 * max pooling with an arg-max table, forward and backward, on plain (NCHW)
 * images. The tests compare the oneDNN kernels (model_dnnl.c) against
 * them, and a model whose layers oneDNN cannot run uses them. */
#include "model_internal.h"

#include <cblas.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

/* Range [*lo, *hi) of output positions o whose input position o*S - PAD + j
 * lies inside [0, n). */
static void valid_range(int n, int out, int S, int PAD, int j, int *lo, int *hi)
{
    int a = PAD - j; /* o*S >= a */
    int l = a <= 0 ? 0 : (a + S - 1) / S;
    int h = (n - 1 + PAD - j) < 0 ? 0 : (n - 1 + PAD - j) / S + 1; /* o*S <= n-1+PAD-j */
    if (h > out)
        h = out;
    if (l > h)
        l = h;
    *lo = l;
    *hi = h;
}

/* cols[k][b*P + p] = x[b][c][oh*S - PAD + i][ow*S - PAD + j] (0 outside),
 * with k = (c*K + i)*K + j and p = oh*OW + ow. */
static void im2col(const layer *L, const float *x, size_t B, float *cols)
{
    const int K = L->k, S = L->stride, PAD = L->pad;
    const int H = L->in_h, W = L->in_w, OH = L->out_h, OW = L->out_w;
    const size_t P = strata__conv_p(L), KK = strata__conv_k(L), plane = (size_t)H * W;
#pragma omp parallel for schedule(static) if (KK * B * P >= PAR_MIN)
    for (size_t kk = 0; kk < KK; kk++) {
        int j = (int)(kk % K), i = (int)((kk / K) % K), c = (int)(kk / ((size_t)K * K));
        int ow_lo, ow_hi;
        valid_range(W, OW, S, PAD, j, &ow_lo, &ow_hi);
        float *row = cols + kk * B * P;
        for (size_t b = 0; b < B; b++) {
            const float *xp = x + (b * L->in_c + c) * plane;
            for (int oh = 0; oh < OH; oh++) {
                int ih = oh * S - PAD + i;
                float *d = row + b * P + (size_t)oh * OW;
                if (ih < 0 || ih >= H) {
                    memset(d, 0, (size_t)OW * sizeof(float));
                    continue;
                }
                const float *src = xp + (size_t)ih * W + j - PAD;
                for (int ow = 0; ow < ow_lo; ow++)
                    d[ow] = 0.0f;
                if (S == 1)
                    memcpy(d + ow_lo, src + ow_lo, (size_t)(ow_hi - ow_lo) * sizeof(float));
                else
                    for (int ow = ow_lo; ow < ow_hi; ow++)
                        d[ow] = src[ow * S];
                for (int ow = ow_hi; ow < OW; ow++)
                    d[ow] = 0.0f;
            }
        }
    }
}

/* dx[b][c][...] = sum of the dcols entries that im2col read from there. */
static void col2im(const layer *L, const float *dcols, size_t B, float *dx)
{
    const int K = L->k, S = L->stride, PAD = L->pad;
    const int H = L->in_h, W = L->in_w, OH = L->out_h, OW = L->out_w, C = L->in_c;
    const size_t P = strata__conv_p(L), plane = (size_t)H * W;
#pragma omp parallel for schedule(static) if (B * (size_t)C * plane >= PAR_MIN)
    for (size_t bc = 0; bc < B * (size_t)C; bc++) {
        size_t b = bc / C;
        int c = (int)(bc % C);
        float *dp = dx + bc * plane;
        memset(dp, 0, plane * sizeof(float));
        for (int i = 0; i < K; i++)
            for (int j = 0; j < K; j++) {
                size_t kk = ((size_t)c * K + i) * K + j;
                const float *src = dcols + kk * B * P + b * P;
                int ow_lo, ow_hi;
                valid_range(W, OW, S, PAD, j, &ow_lo, &ow_hi);
                for (int oh = 0; oh < OH; oh++) {
                    int ih = oh * S - PAD + i;
                    if (ih < 0 || ih >= H)
                        continue;
                    float *d = dp + (size_t)ih * W + j - PAD;
                    const float *s = src + (size_t)oh * OW;
                    if (S == 1) /* contiguous: lets the compiler vectorise */
                        for (int ow = ow_lo; ow < ow_hi; ow++)
                            d[ow] += s[ow];
                    else
                        for (int ow = ow_lo; ow < ow_hi; ow++)
                            d[ow * S] += s[ow];
                }
            }
    }
}

void strata__ref_conv_forward(strata_model *m, layer *L, const float *x, float *y, size_t B)
{
    const size_t P = strata__conv_p(L), KK = strata__conv_k(L), OC = (size_t)L->out_c, BP = B * P;
    const float *w = m->params.items[L->w].data;
    const float *bias = L->b >= 0 ? m->params.items[L->b].data : NULL;
    float *tmp = m->scratch[0];
    im2col(L, x, B, L->cols);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)OC, (int)BP, (int)KK, 1.0f, w,
                (int)KK, L->cols, (int)BP, 0.0f, tmp, (int)BP);
#pragma omp parallel for schedule(static) if (B * OC * P >= PAR_MIN)
    for (size_t bo = 0; bo < B * OC; bo++) {
        size_t b = bo / OC, oc = bo % OC;
        const float *src = tmp + oc * BP + b * P;
        float *dst = y + bo * P;
        float bv = bias ? bias[oc] : 0.0f;
        for (size_t p = 0; p < P; p++)
            dst[p] = src[p] + bv;
    }
}

void strata__ref_conv_backward(strata_model *m, layer *L, const float *dy, float *dx, size_t B)
{
    const size_t P = strata__conv_p(L), KK = strata__conv_k(L), OC = (size_t)L->out_c, BP = B * P;
    float *dyt = m->scratch[0], *dcols = m->scratch[1];
    float *gw = m->grads.items[L->w].data;
    float *gb = L->b >= 0 ? m->grads.items[L->b].data : NULL;
#pragma omp parallel for schedule(static) if (OC * BP >= PAR_MIN)
    for (size_t oc = 0; oc < OC; oc++) {
        float *dst = dyt + oc * BP;
        double s = 0.0;
        for (size_t b = 0; b < B; b++) {
            const float *src = dy + (b * OC + oc) * P;
            for (size_t p = 0; p < P; p++) {
                dst[b * P + p] = src[p];
                s += src[p];
            }
        }
        if (gb)
            gb[oc] = (float)s;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)OC, (int)KK, (int)BP, 1.0f, dyt,
                (int)BP, L->cols, (int)BP, 0.0f, gw, (int)KK);
    if (dx == NULL)
        return;
    const float *w = m->params.items[L->w].data;
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)KK, (int)BP, (int)OC, 1.0f, w,
                (int)KK, dyt, (int)BP, 0.0f, dcols, (int)BP);
    col2im(L, dcols, B, dx);
}

void strata__ref_maxpool_forward(layer *L, const float *x, float *y, size_t B)
{
    const int KH = L->kh, KW = L->kw, S = L->stride, W = L->in_w, OH = L->out_h, OW = L->out_w;
    const size_t planes = B * (size_t)L->in_c, iplane = (size_t)L->in_h * W;
    const size_t oplane = (size_t)OH * OW;
#pragma omp parallel for schedule(static) if (planes * iplane >= PAR_MIN)
    for (size_t pl = 0; pl < planes; pl++) {
        const float *xp = x + pl * iplane;
        float *yp = y + pl * oplane;
        int32_t *ap = L->argmax + pl * oplane;
        for (int oh = 0; oh < OH; oh++)
            for (int ow = 0; ow < OW; ow++) {
                int best = (oh * S) * W + ow * S;
                float bv = xp[best];
                for (int i = 0; i < KH; i++)
                    for (int j = 0; j < KW; j++) {
                        int o = (oh * S + i) * W + ow * S + j;
                        if (xp[o] > bv) {
                            bv = xp[o];
                            best = o;
                        }
                    }
                yp[oh * OW + ow] = bv;
                ap[oh * OW + ow] = best;
            }
    }
}

void strata__ref_maxpool_backward(layer *L, const float *dy, float *dx, size_t B)
{
    const size_t planes = B * (size_t)L->in_c, iplane = (size_t)L->in_h * L->in_w;
    const size_t oplane = (size_t)L->out_h * L->out_w;
#pragma omp parallel for schedule(static) if (planes * iplane >= PAR_MIN)
    for (size_t pl = 0; pl < planes; pl++) {
        float *dp = dx + pl * iplane;
        memset(dp, 0, iplane * sizeof(float));
        const float *g = dy + pl * oplane;
        const int32_t *ap = L->argmax + pl * oplane;
        for (size_t o = 0; o < oplane; o++)
            dp[ap[o]] += g[o];
    }
}

/* The reference kernels' buffers (im2col matrices, workspaces, pooling
 * arg-max), for cap_batch samples, made on their first use: a model that
 * runs on oneDNN never holds them. */
int strata__ref_ensure(strata_model *m)
{
    if (m->scratch[0] != NULL)
        return STRATA_OK;
    const size_t batch = m->cap_batch;
    size_t scratch = 1;
    int ok = 1;
    for (int i = 0; i < m->nlayers && ok; i++) {
        layer *L = &m->layers[i];
        if (L->kind == L_CONV2D) {
            size_t bp = batch * strata__conv_p(L);
            L->cols = strata_alloc_floats(strata__conv_k(L) * bp);
            ok &= L->cols != NULL;
            size_t need =
                (strata__conv_k(L) > (size_t)L->out_c ? strata__conv_k(L) : (size_t)L->out_c) * bp;
            if (need > scratch)
                scratch = need;
        } else if (L->kind == L_MAXPOOL) {
            L->argmax = malloc(batch * L->out_dim * sizeof(int32_t));
            ok &= L->argmax != NULL;
        }
    }
    for (int i = 0; i < 2 && ok; i++) {
        m->scratch[i] = strata_alloc_floats(scratch);
        ok &= m->scratch[i] != NULL;
    }
    if (!ok) {
        strata__ref_free(m);
        return STRATA_ENOMEM;
    }
    return STRATA_OK;
}

void strata__ref_free(strata_model *m)
{
    for (int i = 0; i < 2; i++) {
        strata_free_floats(m->scratch[i]);
        m->scratch[i] = NULL;
    }
    for (int i = 0; i < m->nlayers; i++) {
        strata_free_floats(m->layers[i].cols);
        free(m->layers[i].argmax);
        m->layers[i].cols = NULL;
        m->layers[i].argmax = NULL;
    }
}
