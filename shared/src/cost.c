/* The byte-cost estimate of a compressed layer (strata_clayer_cost_bytes in
 * strata/compress.h): what one layer block of a payload (schemas/payload.md)
 * is expected to take after zstd, for a budget and a values format, so
 * that candidates of different families can be compared in one currency.
 *
 * The model assumes the layer's update is Gaussian (what the error-feedback
 * input of a round looks like to first order) and follows the wire format:
 *   - top-k positions: the expected length of the shortest Rice code of
 *     geometric gaps with the kept fraction p (exact for random positions,
 *     within about 1% of the entropy H(p) / p bits);
 *   - float values: for top-k, the bit planes of the exponent offsets, each
 *     costing about its entropy after zstd (at most a bit per value, at
 *     least what zstd spends on each rare set bit), averaged over where the
 *     layer's scale falls within a binade; for values from the whole
 *     distribution (dense, randk, powersgd) 4 bits, as measured; plus the
 *     packed sign-and-mantissa field (24, 11 or 8 bits, incompressible);
 *   - int8: a sign bit and the shortest Rice code of |q| - min |q|, with
 *     |q| = 127 |a| / max |a| over the kept magnitudes;
 *   - ternary: one sign bit per kept value;
 *   - qsgd: the entropy of the signed levels, bounded below by what zstd
 *     spends on each non-zero level among zeros;
 *   - sign: one bit per element.
 * All distributions are integrated numerically on a fixed grid: pure,
 * deterministic and a few tens of microseconds per call. */
#include "strata/compress.h"

#include <math.h>
#include <stddef.h>
#include <stdint.h>

/* What a layer block's 60-byte header costs after zstd (mostly zeros). */
#define BLOCK_HEADER 26.0
#define GRID 4096

/* P(|Z| > x) for a standard normal Z. */
static double tail2(double x)
{
    return erfc(x / M_SQRT2);
}

/* The x >= 0 with tail2(x) = p, for p in (0, 1]. */
static double tail2_inv(double p)
{
    double lo = 0.0, hi = 40.0;
    if (p >= 1.0)
        return 0.0;
    for (int i = 0; i < 200 && hi - lo > 1e-12; i++) {
        double mid = 0.5 * (lo + hi);
        if (tail2(mid) > p)
            lo = mid;
        else
            hi = mid;
    }
    return 0.5 * (lo + hi);
}

/* Expected bits per position of the shortest Rice code of geometric gaps
 * (P(g) = (1 - p)^g p): min over r of r + 1 + E[g >> r]. */
static double position_bits(double p)
{
    if (p >= 1.0)
        return 1.0;
    double best = INFINITY;
    for (int r = 0; r < 32; r++) {
        double qm = exp(ldexp(1.0, r) * log1p(-p)); /* (1 - p)^(2^r) */
        double bits = r + 1.0 + qm / (1.0 - qm);
        if (bits < best)
            best = bits;
    }
    return best;
}

/* Bits per value of one bit plane whose bits are set with probability p,
 * after zstd: about the entropy, at most one bit, at least what zstd spends
 * on a rare set bit among zero bytes. */
static double plane_bits(double p)
{
    double m = p < 1.0 - p ? p : 1.0 - p;
    if (m <= 0.0)
        return 0.0;
    double h = -(p * log2(p) + (1.0 - p) * log2(1.0 - p));
    double bits = fmax(1.1 * h, 12.0 * m);
    return bits < 1.0 ? bits : 1.0;
}

/* Bits per value of the exponent planes of m values |c Z| conditioned on
 * |Z| > t, averaged over eight scales c = 2^(u / 8) across a binade. The
 * smallest exponent is that of t (top-k) or of the typical smallest of m
 * magnitudes; the largest that of the typical largest. */
static double exponent_bits(double t, double m)
{
    /* Values from the whole distribution (dense, randk, powersgd factors):
     * their exponents spread over many binades, and zstd's cost of the
     * planes varies with how they share blocks with the mantissa bits;
     * measured: 3.3 to 4.6 bits per value, 4 typical. */
    if (t <= 0.0)
        return 4.0 + 16.0 / m;
    const double mass = tail2(t);
    const double xmin = t > 0.0 ? t : 0.8687 / m, xmax = tail2_inv(0.6931 / m);
    double total = 0.0;
    for (int u = 0; u < 8; u++) {
        const double c = exp2(u / 8.0);
        const int emin = (int)floor(log2(c * xmin)),
                  emax = (int)floor(log2(c * (xmax > xmin ? xmax : xmin)));
        int planes = 0;
        while (planes < 8 && (emax - emin) >> planes)
            planes++;
        double pj[8] = {0};
        for (int e = emin; e <= emax; e++) {
            double lo = fmax(ldexp(1.0, e) / c, t), hi = ldexp(1.0, e + 1) / c;
            if (e == emin)
                lo = t;
            if (e == emax)
                hi = INFINITY;
            double p = ((isinf(hi) ? 0.0 : -tail2(hi)) + tail2(lo)) / mass;
            for (int j = 0; j < planes; j++)
                if (((e - emin) >> j) & 1)
                    pj[j] += p;
        }
        for (int j = 0; j < planes; j++)
            total += plane_bits(pj[j]);
    }
    return total / 8.0 + 16.0 / m;
}

/* Bytes per float value in format vf (FP32, FP16, BF16) for m values |Z| >
 * t: the exponent planes after zstd and the packed field. */
static double float_value_bytes(strata_values_format vf, double t, double m)
{
    double field = vf == STRATA_VALUES_FP32 ? 3.0 : vf == STRATA_VALUES_FP16 ? 11.0 / 8 : 1.0;
    return field + exponent_bits(t, m) / 8.0;
}

/* Bits per int8 value: a sign bit and the shortest Rice code of |q| - base
 * for |Z| > t among m kept values, q = 127 |Z| / M with M the typical
 * largest kept magnitude. */
static double int8_bits(double t, double m)
{
    double mx = tail2_inv(0.6931 / m);
    if (mx <= t)
        mx = t + 1e-6;
    double scale = mx / 127.0, base = floor(t / scale), mass = tail2(t);
    double e[8] = {0};
    for (int i = 0; i < GRID; i++) {
        double x0 = t + (mx + 1.0 - t) * i / GRID, x1 = t + (mx + 1.0 - t) * (i + 1) / GRID;
        double w = (tail2(x0) - tail2(x1)) / mass, x = 0.5 * (x0 + x1);
        double q = fmin(127.0, floor(x / scale + 0.5));
        double d = q > base ? q - base : 0.0;
        for (int r = 0; r < 8; r++)
            e[r] += w * (r + 1.0 + floor(ldexp(d, -r)));
    }
    double best = e[0];
    for (int r = 1; r < 8; r++)
        best = e[r] < best ? e[r] : best;
    return 1.0 + best;
}

/* Bytes of n qsgd levels (s levels) of a Gaussian layer after zstd. */
static double qsgd_bytes(double n, uint32_t s)
{
    /* x = s |Z| / sqrt(n); level floor(x) or floor(x) + 1 with probability
     * the fraction. */
    double pl[129] = {0};
    const double zmax = 8.0;
    for (int i = 0; i < GRID; i++) {
        double z0 = zmax * i / GRID, z1 = zmax * (i + 1) / GRID;
        double w = tail2(z0) - tail2(z1), x = s * 0.5 * (z0 + z1) / sqrt(n);
        double fl = floor(x);
        int l = (int)fmin(fl, (double)s);
        double frac = x - fl;
        pl[l] += w * (1.0 - frac);
        pl[l + 1 <= (int)s ? l + 1 : (int)s] += w * frac;
    }
    double h = 0.0, nz = 1.0 - pl[0];
    for (uint32_t l = 0; l <= s; l++)
        if (pl[l] > 0.0)
            h -= pl[l] * log2(pl[l]);
    h += nz; /* the sign of a non-zero level */
    /* zstd spends a sequence on most non-zero levels among zeros: bytes per
     * non-zero level measured on Gaussian layers (level 1), by log10 of the
     * non-zero fraction, interpolated linearly. */
    static const double lg[] = {-2.52, -2.0, -1.89, -1.49, -1.40, -1.0, -0.92, -0.49, -0.15};
    static const double per[] = {2.6, 2.4, 2.24, 1.98, 1.9, 1.43, 1.4, 0.76, 0.55};
    double x = log10(nz > 1e-12 ? nz : 1e-12), c = per[0];
    for (int i = 0; i < 8; i++)
        if (x >= lg[i])
            c = x >= lg[i + 1] ? per[i + 1]
                               : per[i] + (per[i + 1] - per[i]) * (x - lg[i]) / (lg[i + 1] - lg[i]);
    double entropy_bytes = n * h / 8.0 * 1.05, sparse_bytes = n * nz * c;
    return entropy_bytes > sparse_bytes ? entropy_bytes : sparse_bytes;
}

double strata_clayer_cost_bytes(const strata_budget *b, strata_values_format vf, int ndim,
                                const int64_t *shape, uint64_t numel)
{
    if (b == NULL || numel == 0 || (unsigned)vf >= STRATA_VALUES_COUNT ||
        strata_budget_check(b, NULL) < 0)
        return -1.0;
    if (STRATA_VALUES_QUANTISED(vf) && b->comp != STRATA_COMP_TOPK && b->comp != STRATA_COMP_RANDK)
        return -1.0;
    const double n = (double)numel;
    switch (b->comp) {
    case STRATA_COMP_TOPK:
    case STRATA_COMP_RANDK: {
        double k = (double)strata_comp_kept(b->density, numel), p = k / n;
        double t = b->comp == STRATA_COMP_TOPK ? tail2_inv(p) : 0.0;
        double bytes = BLOCK_HEADER;
        if (b->comp == STRATA_COMP_TOPK)
            bytes += 1.0 + k * position_bits(p) / 8.0;
        if (vf == STRATA_VALUES_TERNARY)
            bytes += ceil(k / 8.0);
        else if (vf == STRATA_VALUES_INT8)
            bytes += 2.0 + k * int8_bits(t, b->comp == STRATA_COMP_TOPK ? n : k) / 8.0;
        else
            bytes += k * float_value_bytes(vf, t, k);
        return bytes;
    }
    case STRATA_COMP_QSGD:
        return BLOCK_HEADER + qsgd_bytes(n, b->levels);
    case STRATA_COMP_SIGN:
        return BLOCK_HEADER + ceil(n / 8.0);
    case STRATA_COMP_POWERSGD: {
        uint32_t rows, cols, rank;
        if (strata_powersgd_dims(ndim, shape, b->rank, &rows, &cols, &rank) == STRATA_OK) {
            double m = ((double)rows + (double)cols) * rank;
            return BLOCK_HEADER + m * float_value_bytes(vf, 0.0, m);
        }
        return BLOCK_HEADER + n * float_value_bytes(vf, 0.0, n);
    }
    case STRATA_COMP_FP16:
        return BLOCK_HEADER + n * float_value_bytes(STRATA_VALUES_FP16, 0.0, n);
    case STRATA_COMP_BF16:
        return BLOCK_HEADER + n * float_value_bytes(STRATA_VALUES_BF16, 0.0, n);
    default:
        return BLOCK_HEADER + n * float_value_bytes(vf, 0.0, n);
    }
}
