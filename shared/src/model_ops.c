/* The model's own kernels for GroupNorm, average pooling (on plain images;
 * oneDNN pools blocked ones) and the residual add. GroupNorm runs on both
 * layouts: every pass goes over (sample, channel) pairs, one at a time in
 * NCHW, 16 at a time in nChw16c (where a block of 16 channels of one
 * sample is contiguous, position by position). Each pair is summed in a
 * fixed order (float partial sums of 64 positions, added in double), so
 * results do not depend on the thread count. */
#include "model_internal.h"

#include <math.h>
#include <string.h>

void strata__add(float *y, const float *a, const float *b, size_t n)
{
    if (b == NULL) {
#pragma omp parallel for schedule(static) if (n >= PAR_MIN)
        for (size_t i = 0; i < n; i++)
            y[i] += a[i];
        return;
    }
#pragma omp parallel for schedule(static) if (n >= PAR_MIN)
    for (size_t i = 0; i < n; i++)
        y[i] = a[i] + b[i];
}

void strata__avgpool_forward(const layer *L, const float *x, float *y, size_t B)
{
    const int KH = L->kh, KW = L->kw, S = L->stride, W = L->in_w, OH = L->out_h, OW = L->out_w;
    const size_t planes = B * (size_t)L->in_c, iplane = (size_t)L->in_h * W;
    const size_t oplane = (size_t)OH * OW;
    const float inv = 1.0f / (float)(KH * KW);
#pragma omp parallel for schedule(static) if (planes * iplane >= PAR_MIN)
    for (size_t pl = 0; pl < planes; pl++) {
        const float *xp = x + pl * iplane;
        float *yp = y + pl * oplane;
        for (int oh = 0; oh < OH; oh++)
            for (int ow = 0; ow < OW; ow++) {
                float s = 0.0f;
                for (int i = 0; i < KH; i++)
                    for (int j = 0; j < KW; j++)
                        s += xp[(size_t)(oh * S + i) * W + ow * S + j];
                yp[oh * OW + ow] = s * inv;
            }
    }
}

void strata__avgpool_backward(const layer *L, const float *dy, float *dx, size_t B)
{
    const int KH = L->kh, KW = L->kw, S = L->stride, W = L->in_w, OH = L->out_h, OW = L->out_w;
    const size_t planes = B * (size_t)L->in_c, iplane = (size_t)L->in_h * W;
    const size_t oplane = (size_t)OH * OW;
    const float inv = 1.0f / (float)(KH * KW);
#pragma omp parallel for schedule(static) if (planes * iplane >= PAR_MIN)
    for (size_t pl = 0; pl < planes; pl++) {
        float *dp = dx + pl * iplane;
        const float *g = dy + pl * oplane;
        memset(dp, 0, iplane * sizeof(float));
        for (int oh = 0; oh < OH; oh++)
            for (int ow = 0; ow < OW; ow++) {
                const float v = g[oh * OW + ow] * inv;
                for (int i = 0; i < KH; i++)
                    for (int j = 0; j < KW; j++)
                        dp[(size_t)(oh * S + i) * W + ow * S + j] += v;
            }
    }
}

/* Adds the sums of u[i * stride + j] and of u * v over i in [0, n) to
 * s1[j] and s2[j], j < 16: float partial sums over runs of 64 positions
 * (16 independent lanes, which the compiler vectorises), each run's added
 * into the double totals. */
static void lane_sums(const float *u, const float *v, size_t n, size_t stride, double *s1,
                      double *s2)
{
    for (size_t i0 = 0; i0 < n; i0 += 64) {
        const size_t i1 = i0 + 64 < n ? i0 + 64 : n;
        float f1[16] = {0}, f2[16] = {0};
        for (size_t i = i0; i < i1; i++)
            for (int j = 0; j < 16; j++) {
                const float x = u[i * stride + j];
                f1[j] += x;
                f2[j] += x * v[i * stride + j];
            }
        for (int j = 0; j < 16; j++) {
            s1[j] += f1[j];
            s2[j] += f2[j];
        }
    }
}

/* chs[2 * (b * C + c) + {0, 1}] = the sums over the spatial positions of
 * (sample b, channel c) of u and of u * v (v NULL: u * u), in a fixed order
 * whatever the thread count. Blocked images sum the 16 channels of a block
 * together, position by position; a plain channel is summed as 16 lanes of
 * interleaved positions, then the lanes in order. */
static void pair_sums(const layer *L, const float *u, const float *v, size_t B, int blocked,
                      double *chs)
{
    const size_t C = (size_t)L->in_c, HW = (size_t)L->in_h * L->in_w;
    if (!v)
        v = u;
    if (blocked) {
#pragma omp parallel for schedule(static) if (B * C * HW >= PAR_MIN)
        for (size_t blk = 0; blk < B * (C / 16); blk++) {
            double s1[16] = {0}, s2[16] = {0};
            lane_sums(u + blk * HW * 16, v + blk * HW * 16, HW, 16, s1, s2);
            /* block blk holds the pairs blk * 16 + j */
            for (int j = 0; j < 16; j++) {
                chs[2 * (blk * 16 + j)] = s1[j];
                chs[2 * (blk * 16 + j) + 1] = s2[j];
            }
        }
        return;
    }
#pragma omp parallel for schedule(static) if (B * C * HW >= PAR_MIN)
    for (size_t bc = 0; bc < B * C; bc++) {
        const float *up = u + bc * HW, *vp = v + bc * HW;
        double s1[16] = {0}, s2[16] = {0}, t1 = 0.0, t2 = 0.0;
        const size_t full = HW / 16;
        lane_sums(up, vp, full, 16, s1, s2);
        for (int j = 0; j < 16; j++) {
            t1 += s1[j];
            t2 += s2[j];
        }
        for (size_t i = full * 16; i < HW; i++) {
            t1 += up[i];
            t2 += (double)up[i] * vp[i];
        }
        chs[2 * bc] = t1;
        chs[2 * bc + 1] = t2;
    }
}

/* One pass over the (sample, channel) pairs with a = rstd * gamma[c]:
 *   forward (in = x):   out = a * x + (beta[c] - mean * a)
 *   backward (in = dy): out = a * dy + k1 * x + k2, k1 and k2 per group.
 * Each pair's coefficients are worked out once; blocked images are passed
 * through 16 channels at a time. */
static void pair_apply(const strata_model *m, const layer *L, const float *in, const float *x,
                       float *out, size_t B, int blocked, int backward)
{
    const size_t C = (size_t)L->in_c, HW = (size_t)L->in_h * L->in_w;
    const size_t G = (size_t)L->groups, cg = C / G, lanes = blocked ? 16 : 1;
    const float *gamma = m->params.items[L->w].data, *beta = m->params.items[L->b].data;
    const float *st = L->stats;
    /* Runs of `lanes` pairs: one block, or one (sample, channel) pair. */
#pragma omp parallel for schedule(static) if (B * C * HW >= PAR_MIN)
    for (size_t run = 0; run < B * C / lanes; run++) {
        float a[16], k0[16], k1[16];
        for (size_t j = 0; j < lanes; j++) {
            const size_t bc = run * lanes + j, b = bc / C, c = bc % C, bg = b * G + c / cg;
            const float mean = st[4 * bg], rstd = st[4 * bg + 1];
            a[j] = rstd * gamma[c];
            k0[j] = backward ? st[4 * bg + 3] : beta[c] - mean * a[j];
            k1[j] = backward ? st[4 * bg + 2] : 0.0f;
        }
        const size_t off = run * lanes * HW;
        const float *ip = in + off, *xp = backward ? x + off : NULL;
        float *op = out + off;
        if (lanes == 1) {
            if (backward)
                for (size_t s = 0; s < HW; s++)
                    op[s] = a[0] * ip[s] + k1[0] * xp[s] + k0[0];
            else
                for (size_t s = 0; s < HW; s++)
                    op[s] = ip[s] * a[0] + k0[0];
        } else if (backward) {
            for (size_t s = 0; s < HW; s++)
                for (int j = 0; j < 16; j++)
                    op[s * 16 + j] = a[j] * ip[s * 16 + j] + k1[j] * xp[s * 16 + j] + k0[j];
        } else {
            for (size_t s = 0; s < HW; s++)
                for (int j = 0; j < 16; j++)
                    op[s * 16 + j] = ip[s * 16 + j] * a[j] + k0[j];
        }
    }
}

void strata__groupnorm_forward(strata_model *m, layer *L, const float *x, float *y, size_t B,
                               int blocked)
{
    const size_t C = (size_t)L->in_c, HW = (size_t)L->in_h * L->in_w;
    const size_t G = (size_t)L->groups, cg = C / G;
    const double n = (double)(cg * HW);
    pair_sums(L, x, NULL, B, blocked, L->chs);
    for (size_t bg = 0; bg < B * G; bg++) {
        double s1 = 0.0, s2 = 0.0;
        const size_t b = bg / G, g = bg % G;
        for (size_t c = g * cg; c < (g + 1) * cg; c++) {
            s1 += L->chs[2 * (b * C + c)];
            s2 += L->chs[2 * (b * C + c) + 1];
        }
        const double mean = s1 / n;
        double var = s2 / n - mean * mean;
        if (var < 0.0)
            var = 0.0;
        L->stats[4 * bg] = (float)mean;
        L->stats[4 * bg + 1] = (float)(1.0 / sqrt(var + (double)L->eps));
    }
    pair_apply(m, L, x, NULL, y, B, blocked, 0);
}

/* With xhat = (x - mean) * rstd and N values per group:
 *   dbeta[c]  = sum over samples and positions of dy
 *   dgamma[c] = sum of dy * xhat
 *   dx = rstd * (gamma[c] * dy - A / N - xhat * Bv / N), where A and Bv are
 *        the group's sums of gamma * dy and of gamma * dy * xhat;
 * so dx = rstd * gamma[c] * dy + k1 * x + k2 per (sample, group). */
void strata__groupnorm_backward(strata_model *m, layer *L, const float *x, const float *dy,
                                float *dx, size_t B, int blocked)
{
    const size_t C = (size_t)L->in_c, HW = (size_t)L->in_h * L->in_w;
    const size_t G = (size_t)L->groups, cg = C / G;
    const double n = (double)(cg * HW);
    const float *gamma = m->params.items[L->w].data;
    float *dgamma = m->grads.items[L->w].data, *dbeta = m->grads.items[L->b].data;
    double *chs = L->chs;
    pair_sums(L, dy, x, B, blocked, chs); /* sum dy, sum dy * x */
    for (size_t c = 0; c < C; c++) {
        double sg = 0.0, sb = 0.0;
        for (size_t b = 0; b < B; b++) {
            const size_t bg = b * G + c / cg;
            const double mean = L->stats[4 * bg], rstd = L->stats[4 * bg + 1];
            const double sdy = chs[2 * (b * C + c)], sdyx = chs[2 * (b * C + c) + 1];
            sg += rstd * (sdyx - mean * sdy);
            sb += sdy;
        }
        dgamma[c] = (float)sg;
        dbeta[c] = (float)sb;
    }
    if (dx == NULL)
        return;
    for (size_t bg = 0; bg < B * G; bg++) {
        const size_t b = bg / G, g = bg % G;
        const double mean = L->stats[4 * bg], rstd = L->stats[4 * bg + 1];
        double A = 0.0, Bv = 0.0;
        for (size_t c = g * cg; c < (g + 1) * cg; c++) {
            const double sdy = chs[2 * (b * C + c)], sdyx = chs[2 * (b * C + c) + 1];
            A += gamma[c] * sdy;
            Bv += gamma[c] * rstd * (sdyx - mean * sdy);
        }
        L->stats[4 * bg + 2] = (float)(-rstd * rstd * Bv / n);
        L->stats[4 * bg + 3] = (float)(-rstd * A / n + rstd * rstd * mean * Bv / n);
    }
    pair_apply(m, L, dy, x, dx, B, blocked, 1);
}
