/* Exact top-k selection by magnitude, optionally fused with the error
 * feedback update a = decay * e + delta.
 *
 * Plan for one call (n elements, keep k):
 *  1. Fast path (n >= FAST_MIN, k well below n): read a stratified sample of
 *     the magnitude keys, pick a key a little below the sample's k-th
 *     largest, and stream once over the data, writing a (error feedback)
 *     and collecting every element whose key reaches that threshold into
 *     small per-chunk candidate buffers. When the candidates number at least
 *     k (and fit), the exact top k are among them: selection then runs on
 *     the candidates only.
 *  2. Otherwise (small n, high density, heavy ties, an unlucky sample) a
 *     radix selection runs over the whole data: an 11-bit histogram of the
 *     top magnitude bits, then the boundary bucket refined on 11 and 9 more
 *     bits.
 * Either way the result is a threshold key T and a count take_eq: every
 * element with key > T is kept, plus the first take_eq elements (in index
 * order) with key == T, which is exactly "ties to the lower index". The final
 * gather walks in index order, so indices come out ascending.
 * Large inputs are split into contiguous chunks processed by OpenMP threads;
 * chunk results are combined in chunk order, so the output never depends on
 * the number of threads. */
#include "compress_internal.h"
#include "strata/rng.h"

#include <assert.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#define FAST_MIN ((size_t)1 << 15)
#define SAMPLE_MAX ((size_t)1 << 16)
#define NT_MIN ((size_t)1 << 18)
#define MAX_CHUNKS 64
#define L0_BUCKETS 2048u

/* The three radix levels on the 31-bit magnitude key: bits 30..20, 19..9,
 * 8..0. */
static const struct {
    unsigned shift;
    uint32_t mask;
} LEVELS[3] = {{20, 0x7ff}, {9, 0x7ff}, {0, 0x1ff}};

/* A run of elements: values v[0..n), positions idx[j] or base + j. */
typedef struct seg {
    const float *v;
    const uint32_t *idx;
    size_t base;
    size_t n;
} seg;

/* Keep key > key, and the first take_eq elements with key == key. */
typedef struct thr {
    uint32_t key;
    size_t take_eq;
} thr;

typedef struct cands {
    uint32_t *idx;
    float *val;
    size_t n; /* candidates seen (may exceed cap: overflow) */
    size_t cap;
} cands;

static int chunk_count(size_t n)
{
    if (n < STRATA_TOPK_PARALLEL_MIN)
        return 1;
    int t = omp_get_max_threads();
    if (t > MAX_CHUNKS)
        t = MAX_CHUNKS;
    return t < 1 ? 1 : t;
}

/* Start of chunk t of nt over n elements (multiples of 16, n at the end). */
static size_t chunk_lo(size_t n, int t, int nt)
{
    if (t >= nt)
        return n;
    return ((n / 16) * (size_t)t / (size_t)nt) * 16;
}

/* Finds the top-k threshold among n keys that all agree with prefix on the
 * bits of the levels before `level` (1 <= k <= n). Compacts keys in place. */
static thr keys_select(uint32_t *keys, size_t n, size_t k, int level, uint32_t prefix)
{
    size_t hist[L0_BUCKETS];
    assert(k >= 1 && k <= n);
    for (; level < 3; level++) {
        const unsigned sh = LEVELS[level].shift;
        const uint32_t mask = LEVELS[level].mask;
        memset(hist, 0, (mask + 1) * sizeof(hist[0]));
        for (size_t i = 0; i < n; i++)
            hist[(keys[i] >> sh) & mask]++;
        uint32_t b = mask;
        size_t above = 0;
        while (above + hist[b] < k) {
            above += hist[b];
            assert(b > 0);
            b--;
        }
        k -= above;
        prefix |= b << sh;
        if (level < 2) {
            size_t m = 0;
            for (size_t i = 0; i < n; i++)
                if (((keys[i] >> sh) & mask) == b)
                    keys[m++] = keys[i];
            n = m;
        }
    }
    return (thr){prefix, k};
}

/* Level-0 histogram of a run, four interleaved sub-histograms to keep
 * repeated buckets from serialising on one counter. */
static void hist_l0(const float *v, size_t n, uint32_t *h)
{
    uint32_t sub[4][L0_BUCKETS];
    memset(sub, 0, sizeof(sub));
    size_t i = 0;
    for (; i + 4 <= n; i += 4) {
        sub[0][strata__mag_key(v[i]) >> 20]++;
        sub[1][strata__mag_key(v[i + 1]) >> 20]++;
        sub[2][strata__mag_key(v[i + 2]) >> 20]++;
        sub[3][strata__mag_key(v[i + 3]) >> 20]++;
    }
    for (; i < n; i++)
        sub[0][strata__mag_key(v[i]) >> 20]++;
    for (uint32_t b = 0; b < L0_BUCKETS; b++)
        h[b] = sub[0][b] + sub[1][b] + sub[2][b] + sub[3][b];
}

/* Top-k threshold over the runs s[0..ns) (k <= total elements). par: run
 * the full passes on OpenMP threads, one run each. Returns STRATA_EINVAL
 * when a NaN or infinity is present. */
static int seg_threshold(const seg *s, int ns, size_t k, int par, thr *out)
{
    uint32_t(*hist)[L0_BUCKETS] = malloc((size_t)ns * sizeof(*hist));
    size_t *off = malloc(((size_t)ns + 1) * sizeof(size_t));
    uint32_t *keys = NULL;
    int rc = STRATA_ENOMEM;
    if (hist == NULL || off == NULL)
        goto out;
#pragma omp parallel for schedule(static) if (par && ns > 1)
    for (int t = 0; t < ns; t++)
        hist_l0(s[t].v, s[t].n, hist[t]);
    size_t tot[L0_BUCKETS];
    for (uint32_t b = 0; b < L0_BUCKETS; b++) {
        tot[b] = 0;
        for (int t = 0; t < ns; t++)
            tot[b] += hist[t][b];
    }
    rc = STRATA_EINVAL;
    for (uint32_t b = STRATA__KEY_NONFINITE >> 20; b < L0_BUCKETS; b++)
        if (tot[b] != 0)
            goto out;
    uint32_t b1 = L0_BUCKETS - 1;
    size_t above = 0;
    while (above + tot[b1] < k) {
        above += tot[b1];
        assert(b1 > 0);
        b1--;
    }
    off[0] = 0;
    for (int t = 0; t < ns; t++)
        off[t + 1] = off[t] + hist[t][b1];
    rc = STRATA_ENOMEM;
    keys = malloc(tot[b1] * sizeof(uint32_t));
    if (keys == NULL)
        goto out;
#pragma omp parallel for schedule(static) if (par && ns > 1)
    for (int t = 0; t < ns; t++) {
        size_t m = off[t];
        const float *v = s[t].v;
        for (size_t j = 0; j < s[t].n; j++) {
            uint32_t key = strata__mag_key(v[j]);
            if ((key >> 20) == b1)
                keys[m++] = key;
        }
    }
    *out = keys_select(keys, tot[b1], k - above, 1, b1 << 20);
    rc = STRATA_OK;
out:
    free(keys);
    free(off);
    free(hist);
    return rc;
}

/* Appends the kept elements of one run to idx/vals (vals may be NULL),
 * taking at most *eq_left elements equal to the threshold; returns the
 * number written. When restore is non-NULL, every element not kept is
 * written back to restore[position] (candidates whose residual slot the
 * streaming pass had already cleared). */
static size_t gather_one(const seg *s, thr t, size_t *eq_left, uint32_t *idx, float *vals,
                         float *restore)
{
    size_t m = 0, eq = *eq_left;
    for (size_t j = 0; j < s->n; j++) {
        uint32_t key = strata__mag_key(s->v[j]);
        uint32_t pos = s->idx != NULL ? s->idx[j] : (uint32_t)(s->base + j);
        if (key > t.key || (key == t.key && eq > 0)) {
            if (key == t.key)
                eq--;
            idx[m] = pos;
            if (vals != NULL)
                vals[m] = s->v[j];
            m++;
        } else if (restore != NULL) {
            restore[pos] = s->v[j];
        }
    }
    *eq_left = eq;
    return m;
}

/* Writes the k kept elements of the runs in order (restore: see
 * gather_one). par: count then write on OpenMP threads, one run each. */
static int seg_gather(const seg *s, int ns, thr t, int par, uint32_t *idx, float *vals,
                      float *restore)
{
    if (!par || ns == 1) {
        size_t m = 0, eq = t.take_eq;
        for (int i = 0; i < ns; i++)
            m += gather_one(&s[i], t, &eq, idx + m, vals != NULL ? vals + m : NULL, restore);
        return STRATA_OK;
    }
    size_t *gt = calloc((size_t)ns * 3, sizeof(size_t));
    if (gt == NULL)
        return STRATA_ENOMEM;
    size_t *eqc = gt + ns, *off = gt + 2 * (size_t)ns;
#pragma omp parallel for schedule(static)
    for (int i = 0; i < ns; i++) {
        size_t g = 0, e = 0;
        for (size_t j = 0; j < s[i].n; j++) {
            uint32_t key = strata__mag_key(s[i].v[j]);
            g += key > t.key;
            e += key == t.key;
        }
        gt[i] = g;
        eqc[i] = e;
    }
    /* eqc becomes each run's quota of threshold-equal elements. */
    size_t eq_left = t.take_eq, m = 0;
    for (int i = 0; i < ns; i++) {
        size_t q = eqc[i] < eq_left ? eqc[i] : eq_left;
        eq_left -= q;
        eqc[i] = q;
        off[i] = m;
        m += gt[i] + q;
    }
#pragma omp parallel for schedule(static)
    for (int i = 0; i < ns; i++) {
        size_t q = eqc[i];
        gather_one(&s[i], t, &q, idx + off[i], vals != NULL ? vals + off[i] : NULL, restore);
    }
    free(gt);
    return STRATA_OK;
}

/* ---- the streaming pass ---- */

static inline float a_at(strata__topk_mode mode, const strata__topk_in *in, size_t i)
{
    switch (mode) {
    case STRATA__TOPK_SRC:
        return in->src[i];
    case STRATA__TOPK_ADD:
        return (in->e[i] + in->src[i]) + 0.0f;
    case STRATA__TOPK_SCALE:
        return (in->decay * in->e[i] + in->src[i]) + 0.0f;
    default:
        return in->src[i] + 0.0f;
    }
}

/* Records candidate (pos, x) and returns what the streaming pass stores at
 * pos: in the writing modes a recorded candidate's slot gets its residual
 * as if it were kept (x - round(x), 0 for FP32); unrecorded elements (and
 * candidates past the buffer's capacity, which force the fallback) keep x. */
static inline __attribute__((always_inline)) float push(cands *c, size_t pos, float x, int write,
                                                        strata_values_format vf)
{
    if (c->n < c->cap) {
        c->idx[c->n] = (uint32_t)pos;
        c->val[c->n] = x;
        c->n++;
        return write ? x - strata__round_vf(x, vf) : x;
    }
    c->n++;
    return x;
}

/* Computes a over [lo, hi), stores it to dst in the writing modes
 * (non-temporal stores when nt) and collects elements with key > tk1 into c.
 * Specialised per mode by always_inline + constant arguments. */
static inline __attribute__((always_inline)) void
filter_body(const strata__topk_mode mode, const int nt, const strata__topk_in *in,
            strata_values_format vf, size_t lo, size_t hi, int32_t tk1, cands *cp)
{
    float *dst = in->dst;
    const int write = mode != STRATA__TOPK_SRC;
    cands c = *cp;
    size_t i = lo;
    if (write)
        for (; i < hi && ((uintptr_t)(dst + i) & 15) != 0; i++) {
            float x = a_at(mode, in, i);
            dst[i] = (int32_t)strata__mag_key(x) > tk1 ? push(&c, i, x, write, vf) : x;
        }
#if defined(__SSE2__)
    {
        const float *src = in->src, *e = in->e;
        const __m128i absm = _mm_set1_epi32(0x7fffffff), thv = _mm_set1_epi32(tk1);
        const __m128 zero = _mm_setzero_ps(), dv = _mm_set1_ps(in->decay);
        for (; i + 16 <= hi; i += 16) {
            __m128 x[4];
            unsigned mask = 0;
            for (int v = 0; v < 4; v++) {
                size_t p = i + 4 * (size_t)v;
                __m128 s = _mm_loadu_ps(src + p);
                if (mode == STRATA__TOPK_SRC)
                    x[v] = s;
                else if (mode == STRATA__TOPK_ADD)
                    x[v] = _mm_add_ps(_mm_add_ps(_mm_loadu_ps(e + p), s), zero);
                else if (mode == STRATA__TOPK_SCALE)
                    x[v] = _mm_add_ps(_mm_add_ps(_mm_mul_ps(dv, _mm_loadu_ps(e + p)), s), zero);
                else
                    x[v] = _mm_add_ps(s, zero);
                __m128i k = _mm_and_si128(_mm_castps_si128(x[v]), absm);
                mask |= (unsigned)_mm_movemask_ps(_mm_castsi128_ps(_mm_cmpgt_epi32(k, thv)))
                        << (4 * v);
            }
            if (mask != 0) {
                float tmp[16];
                for (int v = 0; v < 4; v++)
                    _mm_storeu_ps(tmp + 4 * v, x[v]);
                do {
                    int j = __builtin_ctz(mask);
                    tmp[j] = push(&c, i + (size_t)j, tmp[j], write, vf);
                    mask &= mask - 1;
                } while (mask != 0);
                if (write)
                    for (int v = 0; v < 4; v++)
                        x[v] = _mm_loadu_ps(tmp + 4 * v);
            }
            if (write)
                for (int v = 0; v < 4; v++) {
                    if (nt)
                        _mm_stream_ps(dst + i + 4 * (size_t)v, x[v]);
                    else
                        _mm_store_ps(dst + i + 4 * (size_t)v, x[v]);
                }
        }
        if (write && nt)
            _mm_sfence();
    }
#else
    (void)nt;
#endif
    for (; i < hi; i++) {
        float x = a_at(mode, in, i);
        if ((int32_t)strata__mag_key(x) > tk1)
            x = push(&c, i, x, write, vf);
        if (write)
            dst[i] = x;
    }
    *cp = c;
}

static void filter_range(const strata__topk_in *in, int nt, strata_values_format vf, size_t lo,
                         size_t hi, int32_t tk1, cands *c)
{
    switch (in->mode) {
    case STRATA__TOPK_SRC:
        filter_body(STRATA__TOPK_SRC, 0, in, vf, lo, hi, tk1, c);
        break;
    case STRATA__TOPK_ADD:
        if (nt)
            filter_body(STRATA__TOPK_ADD, 1, in, vf, lo, hi, tk1, c);
        else
            filter_body(STRATA__TOPK_ADD, 0, in, vf, lo, hi, tk1, c);
        break;
    case STRATA__TOPK_SCALE:
        if (nt)
            filter_body(STRATA__TOPK_SCALE, 1, in, vf, lo, hi, tk1, c);
        else
            filter_body(STRATA__TOPK_SCALE, 0, in, vf, lo, hi, tk1, c);
        break;
    default:
        if (nt)
            filter_body(STRATA__TOPK_COPY, 1, in, vf, lo, hi, tk1, c);
        else
            filter_body(STRATA__TOPK_COPY, 0, in, vf, lo, hi, tk1, c);
        break;
    }
}

/* The fast path's candidate threshold: the key of rank r in a stratified
 * sample of m keys, with r = m k / n + 4 sd + 16, so that fewer than k
 * elements reach it only with probability ~1e-5 (the fallback then keeps the
 * result exact anyway). Returns 0 when sampling does not pay (the caller
 * then selects over everything). */
static int sample_threshold(const strata__topk_in *in, size_t n, size_t k, uint32_t *tkey,
                            size_t *expect)
{
    if (n < FAST_MIN || k > n / 8)
        return 0;
    size_t m = n / 8 < SAMPLE_MAX ? n / 8 : SAMPLE_MAX;
    double mean = (double)k * (double)m / (double)n;
    size_t r = (size_t)ceil(mean + 4.0 * sqrt(mean) + 16.0);
    if (r >= m / 2)
        return 0;
    uint32_t *keys = malloc(m * sizeof(uint32_t));
    if (keys == NULL)
        return 0;
    size_t stride = n / m;
    for (size_t j = 0; j < m; j++) {
        size_t p = j * stride + (size_t)(strata_mix64(j + 0x9e3779b97f4a7c15ULL) % stride);
        keys[j] = strata__mag_key(a_at(in->mode, in, p));
    }
    thr t = keys_select(keys, m, r, 0, 0);
    free(keys);
    *tkey = t.key;
    *expect = (size_t)((double)n * (double)r / (double)m);
    return 1;
}

int strata__topk_run(const strata__topk_in *in, size_t n, size_t k, strata_values_format vf,
                     uint32_t *idx, float *values)
{
    assert(k >= 1 && k <= n && n <= UINT32_MAX);
    const int nc = chunk_count(n);
    const int write = in->mode != STRATA__TOPK_SRC;
    const int nt = write && n >= NT_MIN;
    seg segs[MAX_CHUNKS];
    cands cb[MAX_CHUNKS];
    void *cmem = NULL;
    int rc = STRATA_OK, streamed = 0;
    uint32_t tkey = 0;
    size_t expect = 0;

    memset(cb, 0, sizeof(cb));
    if (sample_threshold(in, n, k, &tkey, &expect)) {
        /* Each chunk may hold all expected candidates (skewed tensors put
         * the large values in one place), but never more than its length. */
        size_t cap = expect + expect / 4 + 4096, total_cap = 0;
        for (int t = 0; t < nc; t++) {
            size_t len = chunk_lo(n, t + 1, nc) - chunk_lo(n, t, nc);
            cb[t].cap = cap < len ? cap : len;
            total_cap += cb[t].cap;
        }
        cmem = malloc(total_cap * (sizeof(uint32_t) + sizeof(float)));
        if (cmem != NULL) {
            size_t off = 0;
            for (int t = 0; t < nc; t++) {
                cb[t].idx = (uint32_t *)cmem + off;
                cb[t].val = (float *)((uint32_t *)cmem + total_cap) + off;
                off += cb[t].cap;
            }
            const int32_t tk1 = (int32_t)tkey - 1;
#pragma omp parallel for schedule(static) if (nc > 1)
            for (int t = 0; t < nc; t++)
                filter_range(in, nt, vf, chunk_lo(n, t, nc), chunk_lo(n, t + 1, nc), tk1, &cb[t]);
            streamed = 1;
            size_t total = 0;
            int fits = 1;
            for (int t = 0; t < nc; t++) {
                total += cb[t].n;
                fits &= cb[t].n <= cb[t].cap;
                segs[t] = (seg){cb[t].val, cb[t].idx, 0, cb[t].n <= cb[t].cap ? cb[t].n : 0};
            }
            if (fits && total >= k) {
                /* Exact selection among the candidates; the ones not kept
                 * get their value back in the residual. */
                thr th;
                rc = seg_threshold(segs, nc, k, 0, &th);
                if (rc == STRATA_OK)
                    rc = seg_gather(segs, nc, th, 0, idx, values, in->dst);
                free(cmem);
                if (rc < 0 || values == NULL)
                    return rc;
                for (size_t j = 0; j < k; j++)
                    values[j] = strata__round_vf(values[j], vf);
                return STRATA_OK;
            }
            /* Fallback: undo the residual slots the pass already cleared. */
            if (write)
                for (int t = 0; t < nc; t++) {
                    size_t m = cb[t].n < cb[t].cap ? cb[t].n : cb[t].cap;
                    for (size_t j = 0; j < m; j++)
                        in->dst[cb[t].idx[j]] = cb[t].val[j];
                }
        }
    }
    free(cmem);
    /* Selection over everything; the writing modes first compute a. */
    if (write && !streamed) {
#pragma omp parallel for schedule(static) if (nc > 1)
        for (int t = 0; t < nc; t++) {
            cands none = {NULL, NULL, 0, 0};
            filter_range(in, nt, vf, chunk_lo(n, t, nc), chunk_lo(n, t + 1, nc), INT32_MAX, &none);
        }
    }
    const float *data = write ? in->dst : in->src;
    for (int t = 0; t < nc; t++) {
        size_t lo = chunk_lo(n, t, nc);
        segs[t] = (seg){data + lo, NULL, lo, chunk_lo(n, t + 1, nc) - lo};
    }
    thr th;
    rc = seg_threshold(segs, nc, k, 1, &th);
    if (rc == STRATA_OK)
        rc = seg_gather(segs, nc, th, 1, idx, values, NULL);
    if (rc < 0 || values == NULL)
        return rc;
    for (size_t j = 0; j < k; j++) {
        float raw = values[j];
        float v = strata__round_vf(raw, vf);
        values[j] = v;
        if (write)
            in->dst[idx[j]] = raw - v;
    }
    return STRATA_OK;
}

int strata_topk_select(const float *a, size_t n, size_t k, uint32_t *idx_out)
{
    if (a == NULL || idx_out == NULL || k == 0 || k > n || n > UINT32_MAX)
        return STRATA_EINVAL;
    strata__topk_in in = {STRATA__TOPK_SRC, a, NULL, 1.0f, NULL};
    return strata__topk_run(&in, n, k, STRATA_VALUES_FP32, idx_out, NULL);
}
