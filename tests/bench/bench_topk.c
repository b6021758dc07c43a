/* Top-k + error feedback throughput: one strata_ef_step with top-k at the
 * given density on one Gaussian tensor of n elements, in elements per
 * second, next to the elements per second of a memcpy of the same tensor
 * measured in the same run (and plain strata_topk_select for reference).
 * Prints a few human lines and one JSON line. scripts/bench.sh may run it
 * with --threads 1 and --threads 2. */
#include "strata/compress.h"
#include "strata/ef.h"
#include "strata/rng.h"
#include "strata/tensor.h"

#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int cmp_double(const void *x, const void *y)
{
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

int main(int argc, char **argv)
{
    long n = 25000000, reps = 7;
    int threads = 1;
    double density = 0.01;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--threads") == 0)
            threads = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--n") == 0)
            n = atol(argv[i + 1]);
        else if (strcmp(argv[i], "--density") == 0)
            density = atof(argv[i + 1]);
        else if (strcmp(argv[i], "--reps") == 0)
            reps = atol(argv[i + 1]);
        else {
            fprintf(stderr, "usage: bench_topk [--threads T] [--n N] [--density D] [--reps R]\n");
            return 2;
        }
    }
    if (argc % 2 == 0 || threads < 1 || n < 1 || reps < 1 || reps > 1000 ||
        !(density > 0 && density <= 1)) {
        fprintf(stderr, "bench_topk: bad arguments\n");
        return 2;
    }
    omp_set_num_threads(threads);

    strata_tensor_list layout;
    strata_tensor_list_init(&layout);
    int64_t shape[1] = {n};
    if (strata_tensor_list_add(&layout, "w", 1, shape, NULL) < 0) {
        fprintf(stderr, "bench_topk: cannot allocate %ld floats\n", n);
        return 1;
    }
    float *d = layout.items[0].data;
    float *copy = strata_alloc_floats((size_t)n);
    uint32_t *idx = malloc((size_t)strata_comp_kept(density, (uint64_t)n) * sizeof(uint32_t));
    double *t_copy = malloc((size_t)reps * sizeof(double));
    double *t_ef = malloc((size_t)reps * sizeof(double));
    double *t_sel = malloc((size_t)reps * sizeof(double));
    strata_ef *ef = NULL;
    if (copy == NULL || idx == NULL || t_copy == NULL || t_ef == NULL || t_sel == NULL ||
        strata_ef_new(&layout, 1.0, 0, &ef) < 0) {
        fprintf(stderr, "bench_topk: out of memory\n");
        return 1;
    }
    strata_rng r;
    strata_rng_seed(&r, 1, 0);
    for (long i = 0; i < n; i++)
        d[i] = (float)strata_rng_normal(&r);

    strata_budget b = {.comp = STRATA_COMP_TOPK, .density = density};
    size_t k = 0;
    for (long rep = -1; rep < reps; rep++) { /* rep -1 warms up */
        double t0 = now();
        memcpy(copy, d, (size_t)n * sizeof(float));
        double t1 = now();
        strata_clayer *layers = NULL;
        strata_diag diag = {{0}};
        int rc = strata_ef_step(ef, &layout, &b, (uint32_t)(rep + 2), 1, &layers, &diag);
        double t2 = now();
        if (rc < 0) {
            fprintf(stderr, "bench_topk: %s\n", strata_diag_msg(&diag, rc));
            return 1;
        }
        k = (size_t)layers[0].count;
        strata_clayers_free(layers, 1);
        double t3 = now();
        rc = strata_topk_select(d, (size_t)n, k, idx);
        double t4 = now();
        if (rc < 0) {
            fprintf(stderr, "bench_topk: select failed\n");
            return 1;
        }
        if (rep >= 0) {
            t_copy[rep] = t1 - t0;
            t_ef[rep] = t2 - t1;
            t_sel[rep] = t4 - t3;
        }
    }
    qsort(t_copy, (size_t)reps, sizeof(double), cmp_double);
    qsort(t_ef, (size_t)reps, sizeof(double), cmp_double);
    qsort(t_sel, (size_t)reps, sizeof(double), cmp_double);
    double med_copy = t_copy[reps / 2], med_ef = t_ef[reps / 2], med_sel = t_sel[reps / 2];
    double eps_copy = (double)n / med_copy, eps_ef = (double)n / med_ef,
           eps_sel = (double)n / med_sel;
    printf("top-k + EF, n = %ld, density %g (k = %zu), %d thread(s), median of %ld\n", n, density,
           k, threads, reps);
    printf("  memcpy            %8.2f ms  %.3g elements/s\n", med_copy * 1e3, eps_copy);
    printf("  ef step (top-k)   %8.2f ms  %.3g elements/s  (%.2f x memcpy, best %.3g)\n",
           med_ef * 1e3, eps_ef, eps_ef / eps_copy, (double)n / t_ef[0]);
    printf("  topk_select only  %8.2f ms  %.3g elements/s  (%.2f x memcpy)\n", med_sel * 1e3,
           eps_sel, eps_sel / eps_copy);
    printf("{\"bench\":\"topk_ef\",\"n\":%ld,\"density\":%g,\"k\":%zu,\"threads\":%d,\"reps\":%ld,"
           "\"memcpy_elements_per_s\":%.4g,\"ef_topk_seconds\":%.6f,"
           "\"ef_topk_elements_per_s\":%.4g,\"ef_topk_ratio_to_memcpy\":%.3f,"
           "\"select_elements_per_s\":%.4g,\"select_ratio_to_memcpy\":%.3f}\n",
           n, density, k, threads, reps, eps_copy, med_ef, eps_ef, eps_ef / eps_copy, eps_sel,
           eps_sel / eps_copy);
    strata_ef_free(ef);
    free(t_sel);
    free(t_ef);
    free(t_copy);
    free(idx);
    strata_free_floats(copy);
    strata_tensor_list_cleanup(&layout);
    return 0;
}
