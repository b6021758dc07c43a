/* Payload codec benchmark: size and speed of strata_payload_encode/decode.
 *
 * Data: a 1,000,000-element Gaussian tensor (seed 1234, or argv[1]; standard
 * deviation 1, or argv[2]); top-k keeps the 1% largest magnitudes (ties to
 * the lower index) through strata_compress. Reports, for fp32, fp16, bf16,
 * int8 and ternary values and zstd levels 1 and 3: bytes per kept element,
 * encode and decode throughput (MB/s of the in-memory layer, 8 bytes per
 * kept element for top-k and 4 per element for dense, and kept elements per
 * second; best of 5 runs of 50 ms each). Baselines measured in the same run: raw index+value pairs
 * (8 bytes), the same pairs through zstd level 1 without delta coding or byte shuffling, and memcpy
 * bandwidth. A dense fp32 layer of the same tensor shows the codec's dense throughput. Prints a
 * table, then one JSON line.
 *
 * Usage: bench_payload [seed [scale]] */
#include "strata/compress.h"
#include "strata/payload.h"
#include "strata/rng.h"
#include "strata/tensor.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zstd.h>

#define N 1000000u
#define K 10000u
#define TRIALS 5
#define TRIAL_SECONDS 0.05

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void die(const char *what, int rc, const strata_diag *d)
{
    fprintf(stderr, "bench_payload: %s failed: %s\n", what, strata_diag_msg(d, rc));
    exit(1);
}

typedef struct result {
    const char *name;
    int level;
    double bytes_per_kept;
    double enc_mbs, dec_mbs, enc_eps, dec_eps;
} result;

/* Times encode and decode of p; raw_bytes is the in-memory layer size and
 * kept the elements it carries. */
static result measure(const char *name, const strata_payload *p, int level, double raw_bytes,
                      double kept)
{
    result r = {name, level, 0, 0, 0, 0, 0};
    strata_diag d;
    uint8_t *wire = NULL;
    size_t len = 0;
    int rc = strata_payload_encode(p, level, &wire, &len, &d);
    if (rc < 0)
        die("encode", rc, &d);
    r.bytes_per_kept = (double)len / kept;

    /* Best of TRIALS timed runs: the machine may be shared. */
    double best_enc = 1e30, best_dec = 1e30;
    for (int trial = 0; trial < TRIALS; trial++) {
        long reps = 0;
        double t0 = now(), t;
        do {
            uint8_t *w = NULL;
            size_t l = 0;
            rc = strata_payload_encode(p, level, &w, &l, &d);
            if (rc < 0)
                die("encode", rc, &d);
            free(w);
            reps++;
        } while ((t = now() - t0) < TRIAL_SECONDS);
        if (t / (double)reps < best_enc)
            best_enc = t / (double)reps;

        reps = 0;
        t0 = now();
        do {
            strata_payload *q = NULL;
            rc = strata_payload_decode(wire, len, NULL, &q, &d);
            if (rc < 0)
                die("decode", rc, &d);
            strata_payload_free(q);
            reps++;
        } while ((t = now() - t0) < TRIAL_SECONDS);
        if (t / (double)reps < best_dec)
            best_dec = t / (double)reps;
    }
    r.enc_mbs = raw_bytes / best_enc / 1e6;
    r.enc_eps = kept / best_enc;
    r.dec_mbs = raw_bytes / best_dec / 1e6;
    r.dec_eps = kept / best_dec;
    free(wire);
    return r;
}

static double memcpy_mbs(void)
{
    size_t n = (size_t)64 << 20;
    uint8_t *a = malloc(n), *b = malloc(n);
    if (a == NULL || b == NULL) {
        fprintf(stderr, "bench_payload: out of memory\n");
        exit(1);
    }
    memset(a, 1, n);
    memset(b, 2, n);
    double best = 1e30;
    for (int trial = 0; trial < TRIALS; trial++) {
        long reps = 0;
        double t0 = now(), t;
        do {
            memcpy(reps % 2 ? a : b, reps % 2 ? b : a, n);
            reps++;
        } while ((t = now() - t0) < TRIAL_SECONDS);
        if (t / (double)reps < best)
            best = t / (double)reps;
    }
    volatile uint8_t sink = a[n / 2] ^ b[n / 3];
    (void)sink;
    free(a);
    free(b);
    return (double)n / best / 1e6;
}

int main(int argc, char **argv)
{
    uint64_t seed = argc > 1 ? strtoull(argv[1], NULL, 10) : 1234;
    double scale = argc > 2 ? strtod(argv[2], NULL) : 1.0;
    if (!(scale > 0.0 && scale < 1e30)) {
        fprintf(stderr, "bench_payload: scale must be a positive number\n");
        return 2;
    }
    float *x = strata_alloc_floats(N);
    if (x == NULL) {
        fprintf(stderr, "bench_payload: out of memory\n");
        return 1;
    }
    strata_rng rng;
    strata_rng_seed(&rng, seed, 0);
    for (uint32_t i = 0; i < N; i++)
        x[i] = (float)(scale * strata_rng_normal(&rng));
    const int64_t shape[1] = {N};
    const strata_budget topk = {.comp = STRATA_COMP_TOPK, .density = (double)K / N};
    strata_clayer c;
    strata_diag d;
    int rc = strata_compress(x, N, 1, shape, &topk, STRATA_VALUES_FP32, seed, NULL, &c, &d);
    if (rc < 0)
        die("compress", rc, &d);

    /* Baseline: raw (u32 index, f32 value) pairs through zstd level 1. */
    uint8_t *pairs = malloc((size_t)K * 8);
    size_t bound = ZSTD_compressBound((size_t)K * 8);
    uint8_t *zp = malloc(bound);
    if (pairs == NULL || zp == NULL)
        return 1;
    for (uint32_t i = 0; i < K; i++) {
        memcpy(pairs + 8 * i, &c.indices[i], 4);
        memcpy(pairs + 8 * i + 4, &c.values[i], 4);
    }
    strata_clayer_cleanup(&c);
    size_t zl = ZSTD_compress(zp, bound, pairs, (size_t)K * 8, 1);
    if (ZSTD_isError(zl))
        return 1;
    double raw_zstd = (double)zl / K;

    strata_payload p = {.round = 1, .num_layers = 1, .layers = &c};
    result res[16];
    int nres = 0;
    static const struct {
        const char *name;
        strata_values_format fmt;
    } fmts[] = {{"topk fp32", STRATA_VALUES_FP32},
                {"topk fp16", STRATA_VALUES_FP16},
                {"topk bf16", STRATA_VALUES_BF16},
                {"topk int8", STRATA_VALUES_INT8},
                {"topk ternary", STRATA_VALUES_TERNARY}};
    for (int f = 0; f < 5; f++) {
        rc = strata_compress(x, N, 1, shape, &topk, fmts[f].fmt, seed, NULL, &c, &d);
        if (rc < 0)
            die("compress", rc, &d);
        for (int level = 1; level <= 3; level += 2)
            res[nres++] = measure(fmts[f].name, &p, level, 8.0 * K, K);
        strata_clayer_cleanup(&c);
    }
    strata_clayer dense = {
        .layer_index = 0, .comp = STRATA_COMP_NONE, .numel = N, .count = N, .values = x};
    strata_payload pd = {.round = 1, .num_layers = 1, .layers = &dense};
    res[nres++] = measure("dense fp32", &pd, 1, 4.0 * N, N);
    double mcpy = memcpy_mbs();

    printf("payload codec, %u-element Gaussian (seed %llu, scale %g), top-k %u (1%%)\n", N,
           (unsigned long long)seed, scale, K);
    printf("baselines: raw pairs 8.000 B/kept, raw pairs + zstd-1 %.3f B/kept, memcpy %.0f MB/s\n",
           raw_zstd, mcpy);
    printf("%-13s %5s %10s %12s %12s %14s %14s\n", "case", "level", "B/kept", "enc MB/s",
           "dec MB/s", "enc elem/s", "dec elem/s");
    for (int i = 0; i < nres; i++)
        printf("%-13s %5d %10.3f %12.1f %12.1f %14.3e %14.3e\n", res[i].name, res[i].level,
               res[i].bytes_per_kept, res[i].enc_mbs, res[i].dec_mbs, res[i].enc_eps,
               res[i].dec_eps);
    printf("(MB/s of the in-memory layer: 8 B per kept element for top-k, 4 B per element for "
           "dense; dense B/kept is per element)\n");

    printf("{\"bench\":\"payload\",\"numel\":%u,\"kept\":%u,\"seed\":%llu,\"scale\":%g,"
           "\"raw_pair_bytes\":8,\"raw_pairs_zstd1_bytes_per_kept\":%.4f,\"memcpy_mbs\":%.1f,"
           "\"cases\":[",
           N, K, (unsigned long long)seed, scale, raw_zstd, mcpy);
    for (int i = 0; i < nres; i++)
        printf("%s{\"case\":\"%s\",\"level\":%d,\"bytes_per_kept\":%.4f,\"encode_mbs\":%.1f,"
               "\"decode_mbs\":%.1f,\"encode_elems_per_s\":%.4e,\"decode_elems_per_s\":%.4e,"
               "\"encode_vs_memcpy\":%.5f,\"decode_vs_memcpy\":%.5f}",
               i ? "," : "", res[i].name, res[i].level, res[i].bytes_per_kept, res[i].enc_mbs,
               res[i].dec_mbs, res[i].enc_eps, res[i].dec_eps, res[i].enc_mbs / mcpy,
               res[i].dec_mbs / mcpy);
    printf("]}\n");

    free(pairs);
    free(zp);
    strata_free_floats(x);
    return 0;
}
