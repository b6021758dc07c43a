/* PowerSGD (Vogels et al., 2019): one power iteration per round on the
 * rows x cols matrix view M of a tensor, warm-started from the previous
 * round's Q:  P = M Q,  P <- orthonormal columns (Gram-Schmidt in double),
 * Q = M^T P,  M ~ P Q^T.  The products use cblas_sgemm (OpenBLAS, OpenMP
 * variant), so callers must not be inside an OpenMP parallel region. */
#include "compress_internal.h"
#include "strata/rng.h"

#include <cblas.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define STREAM_POWERSGD 0x706f77657273ULL /* "powers" */

/* Column j of a row-major n x r matrix: stride r. */
static double col_norm2(const float *m, size_t n, size_t r, size_t j)
{
    double s = 0.0;
    for (size_t i = 0; i < n; i++)
        s += (double)m[i * r + j] * (double)m[i * r + j];
    return s;
}

/* Orthonormalises the r columns of the rows x r matrix p in place (modified
 * Gram-Schmidt in double); a column that vanishes becomes zero. */
static int orthonormalise(float *p, size_t rows, size_t r)
{
    double *w = malloc(rows * r * sizeof(double));
    if (w == NULL)
        return STRATA_ENOMEM;
    for (size_t i = 0; i < rows * r; i++)
        w[i] = p[i];
    for (size_t j = 0; j < r; j++) {
        for (size_t q = 0; q < j; q++) {
            double dot = 0.0;
            for (size_t i = 0; i < rows; i++)
                dot += w[i * r + q] * w[i * r + j];
            for (size_t i = 0; i < rows; i++)
                w[i * r + j] -= dot * w[i * r + q];
        }
        double nrm = 0.0;
        for (size_t i = 0; i < rows; i++)
            nrm += w[i * r + j] * w[i * r + j];
        nrm = sqrt(nrm);
        double inv = (nrm > 1e-30 && isfinite(nrm)) ? 1.0 / nrm : 0.0;
        for (size_t i = 0; i < rows; i++)
            w[i * r + j] *= inv;
    }
    for (size_t i = 0; i < rows * r; i++)
        p[i] = (float)w[i];
    free(w);
    return STRATA_OK;
}

int strata__powersgd_compress(const float *a, uint32_t rows, uint32_t cols, uint32_t rank,
                              strata_values_format vf, uint64_t seed, const float *q_warm,
                              strata_clayer *out, strata_diag *diag)
{
    const size_t R = rows, C = cols, r = rank;
    if (R > INT_MAX || C > INT_MAX || r == 0)
        return strata_diag_set(diag, STRATA_EINVAL, "powersgd: %u x %u (rank %u) unsupported", rows,
                               cols, rank);
    const size_t count = (R + C) * r;
    float *q0 = malloc(C * r * sizeof(float));
    out->values = malloc(count * sizeof(float));
    int rc = STRATA_ENOMEM;
    if (q0 == NULL || out->values == NULL)
        goto out;
    float *p = out->values, *q = out->values + R * r;

    strata_rng rng;
    strata_rng_seed(&rng, seed, STREAM_POWERSGD);
    if (q_warm != NULL)
        memcpy(q0, q_warm, C * r * sizeof(float));
    for (size_t j = 0; j < r; j++) {
        double nn = q_warm != NULL ? col_norm2(q0, C, r, j) : 0.0;
        if (!(nn > 0.0 && isfinite(nn)))
            for (size_t i = 0; i < C; i++)
                q0[i * r + j] = (float)strata_rng_normal(&rng);
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)R, (int)r, (int)C, 1.0f, a, (int)C,
                q0, (int)r, 0.0f, p, (int)r);
    rc = orthonormalise(p, R, r);
    if (rc < 0)
        goto out;
    for (size_t i = 0; i < R * r; i++)
        p[i] = strata__round_vf(p[i], vf);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)C, (int)r, (int)R, 1.0f, a, (int)C, p,
                (int)r, 0.0f, q, (int)r);
    float mp = 0.0f, mq = 0.0f;
    for (size_t i = 0; i < R * r; i++)
        mp = fmaxf(mp, fabsf(p[i]));
    for (size_t i = 0; i < C * r; i++) {
        q[i] = strata__round_vf(q[i], vf);
        if (!isfinite(q[i]))
            mq = INFINITY;
        else
            mq = fmaxf(mq, fabsf(q[i]));
    }
    /* The decoder refuses factors whose product could overflow; so do we. */
    if (!((double)r * (double)mp * (double)mq <= 1e38)) {
        rc = strata_diag_set(diag, STRATA_EINVAL, "powersgd: the factors overflow float32");
        goto out;
    }
    out->comp = STRATA_COMP_POWERSGD;
    out->values_format = vf;
    out->rows = rows;
    out->cols = cols;
    out->rank = rank;
    out->count = count;
    rc = STRATA_OK;
out:
    free(q0);
    return rc;
}

void strata__powersgd_expand(const strata_clayer *c, float *dense)
{
    const int R = (int)c->rows, C = (int)c->cols, r = (int)c->rank;
    const float *p = c->values, *q = c->values + (size_t)c->rows * c->rank;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, R, C, r, 1.0f, p, r, q, r, 0.0f, dense, C);
}
