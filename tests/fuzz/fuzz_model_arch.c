/* libFuzzer target for model architectures (strata_model_count_params,
 * strata_model_from_json) and, for the small ones, the engine itself.
 *
 * Every input is parsed twice. strata_model_from_json may only succeed when
 * strata_model_count_params does, with the same count, and a model's
 * canonical JSON must parse again to the same count. When the model is
 * small (STRATA_FUZZ_* limits below), it is built twice, once per kernel set
 * (oneDNN and the reference kernels), with the same parameters, and runs one
 * training step on the same batch of two random inputs: the logits, the
 * loss, every parameter gradient and the input gradient must be finite and
 * agree between the two within a loose tolerance. Anything else aborts.
 *
 * Numerically extreme but legal models (activations beyond 1e15, which a
 * chain of residual adds reaches) are not compared. */
#include "model_internal.h"
#include "strata/model.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FUZZ_MAX_PARAMS 20000
#define FUZZ_MAX_ACT ((size_t)1 << 16)  /* floats per sample, all activations */
#define FUZZ_MAX_COST ((size_t)1 << 21) /* multiply-adds per sample */
#define FUZZ_BATCH 2
#define FUZZ_HUGE 1e15

static void check(int cond, const char *what)
{
    if (!cond) {
        fprintf(stderr, "fuzz_model_arch: %s\n", what);
        abort();
    }
}

/* 1 when the model is small enough to run: its activations and its
 * multiply-adds per sample. */
static int small_enough(const strata_model *m)
{
    size_t act = m->layers[0].in_dim, cost = 0;
    for (int i = 0; i < m->nlayers; i++) {
        const layer *L = &m->layers[i];
        act += L->out_dim;
        if (L->kind == L_CONV2D)
            cost += L->out_dim * strata__conv_k(L);
        else if (L->kind == L_MAXPOOL || L->kind == L_AVGPOOL)
            cost += L->out_dim * (size_t)(L->kind == L_MAXPOOL ? L->k * L->k : L->kh * L->kw);
        else
            cost += L->out_dim;
    }
    return act <= FUZZ_MAX_ACT && cost <= FUZZ_MAX_COST;
}

static double max_abs(const float *a, size_t n)
{
    double v = 0.0;
    for (size_t i = 0; i < n; i++)
        if (fabs((double)a[i]) > v || isnan(a[i]))
            v = isnan(a[i]) ? INFINITY : fabs((double)a[i]);
    return v;
}

/* Checks that a (oneDNN) and b (reference), n floats each, are finite and
 * agree: every difference within 1% of the largest magnitude in b, plus
 * noise (for a tensor whose true value is zero, such as the gradient of a
 * shift that a GroupNorm after it removes, both hold rounding noise). */
static void agree(const char *what, const float *a, const float *b, size_t n, double noise)
{
    double ma = max_abs(a, n), mb = max_abs(b, n);
    if (!isfinite(ma) || !isfinite(mb)) {
        fprintf(stderr, "fuzz_model_arch: %s not finite (oneDNN max %g, reference max %g)\n", what,
                ma, mb);
        abort();
    }
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (d > 1e-2 * mb + noise) {
            fprintf(stderr,
                    "fuzz_model_arch: %s differs at %zu of %zu: oneDNN %g, reference %g "
                    "(largest %g)\n",
                    what, i, n, (double)a[i], (double)b[i], mb);
            abort();
        }
    }
}

/* The piecewise-linear state of the last forward of the reference model m
 * (which ReLU outputs are positive, where each max pooling took its
 * maximum) into pat (FUZZ_BATCH * FUZZ_MAX_ACT entries); returns their
 * number. */
static size_t kinks(const strata_model *m, int32_t *pat)
{
    size_t n = 0;
    for (int li = 0; li < m->nlayers; li++) {
        const layer *L = &m->layers[li];
        const size_t e = FUZZ_BATCH * L->out_dim;
        if (L->kind == L_RELU)
            for (size_t i = 0; i < e; i++)
                pat[n++] = m->act[li + 1][i] > 0.0f;
        else if (L->kind == L_MAXPOOL)
            for (size_t i = 0; i < e; i++)
                pat[n++] = L->argmax[i];
    }
    return n;
}

/* 1 when a GroupNorm of the last forward of m normalised a group whose
 * variance is below 1000 eps (a group of equal values, as after a GroupNorm
 * of one-element groups): the function is then too curved there for a
 * finite difference. */
static int flat_group(const strata_model *m)
{
    for (int li = 0; li < m->nlayers; li++) {
        const layer *L = &m->layers[li];
        if (L->kind != L_GROUPNORM)
            continue;
        for (size_t bg = 0; bg < FUZZ_BATCH * (size_t)L->groups; bg++) {
            const double rstd = L->stats[4 * bg + 1];
            if (1.0 / (rstd * rstd) - L->eps < 1e3 * L->eps)
                return 1;
        }
    }
    return 0;
}

/* f = sum of R * logits of m at parameters p + h * v and input x + h * u
 * (v: one direction per parameter, in order; dropout masks from seed 5). */
static double objective(strata_model *m, const float *x, const float *u, const float *v,
                        const float *R, double h, float *xs, float *saved, const int32_t *base,
                        int32_t *pat, int *crossed)
{
    const size_t B = FUZZ_BATCH, nin = B * strata_model_input_dim(m);
    const size_t nout = B * strata_model_output_dim(m);
    strata_tensor_list *p = strata_model_params(m);
    size_t off = 0;
    for (size_t t = 0; t < p->count; t++)
        for (size_t j = 0; j < p->items[t].numel; j++, off++)
            p->items[t].data[j] = (float)(saved[off] + h * v[off]);
    for (size_t i = 0; i < nin; i++)
        xs[i] = (float)(x[i] + h * u[i]);
    strata_rng dr;
    strata_rng_seed(&dr, 5, 0);
    const float *y;
    check(strata_model_forward(m, xs, B, 1, &dr, &y) == STRATA_OK, "forward failed");
    double f = 0.0;
    for (size_t i = 0; i < nout; i++)
        f += (double)R[i] * y[i];
    size_t n = kinks(m, pat);
    if (memcmp(pat, base, n * sizeof(int32_t)) != 0)
        *crossed = 1;
    return f;
}

/* The gradients backward computes on the reference model m (parameters and
 * input) against a central difference of f along one random direction: the
 * oracle for the backward driver, which both kernel sets share. A step that
 * crosses a kink (a ReLU or a max pooling changing its choice) is tried
 * again smaller; when every step size crosses one, nothing is judged. */
static void directional(strata_model *m, const float *x, const float *R)
{
    const size_t B = FUZZ_BATCH, nin = B * strata_model_input_dim(m);
    strata_tensor_list *p = strata_model_params(m), *g = strata_model_grads(m);
    size_t np = 0;
    for (size_t t = 0; t < p->count; t++)
        np += p->items[t].numel;
    float *v = malloc((np + 1) * sizeof(float)), *saved = malloc((np + 1) * sizeof(float));
    float *u = malloc(nin * sizeof(float)), *xs = malloc(nin * sizeof(float));
    int32_t *base = malloc(FUZZ_BATCH * FUZZ_MAX_ACT * sizeof(int32_t));
    int32_t *pat = malloc(FUZZ_BATCH * FUZZ_MAX_ACT * sizeof(int32_t));
    check(v != NULL && saved != NULL && u != NULL && xs != NULL && base != NULL && pat != NULL,
          "out of memory");
    strata_rng r;
    strata_rng_seed(&r, 13, 0);
    strata_rng dr;
    strata_rng_seed(&dr, 5, 0);
    const float *y;
    check(strata_model_forward(m, x, B, 1, &dr, &y) == STRATA_OK, "forward failed");
    double fabs_f = 0.0;
    for (size_t i = 0; i < B * strata_model_output_dim(m); i++)
        fabs_f += fabs((double)R[i] * y[i]);
    kinks(m, base);
    const int curved = flat_group(m);
    check(strata_model_backward_from(m, R) == STRATA_OK, "backward failed");
    double dot = 0.0, scale = 0.0;
    size_t off = 0;
    for (size_t t = 0; t < p->count; t++)
        for (size_t j = 0; j < p->items[t].numel; j++, off++) {
            saved[off] = p->items[t].data[j];
            v[off] = (float)strata_rng_normal(&r);
            dot += (double)g->items[t].data[j] * v[off];
            scale += (double)g->items[t].data[j] * v[off] * g->items[t].data[j] * v[off];
        }
    const float *gx = strata_model_input_grad(m);
    for (size_t i = 0; i < nin; i++) {
        u[i] = (float)strata_rng_normal(&r);
        dot += (double)gx[i] * u[i];
        scale += (double)gx[i] * u[i] * gx[i] * u[i];
    }
    int ok = 0, judged = 0;
    double fd = 0.0;
    for (double h = 1e-3; h > 9e-5 && !ok && !curved; h /= 3.16) {
        int crossed = 0;
        double fp = objective(m, x, u, v, R, h, xs, saved, base, pat, &crossed);
        double fm = objective(m, x, u, v, R, -h, xs, saved, base, pat, &crossed);
        if (crossed)
            continue;
        judged = 1;
        fd = (fp - fm) / (2 * h);
        /* 2% of the derivative or of a typical term of the sum (the root of
         * the sum of squares), plus the rounding of f over 2h. */
        ok = fabs(fd - dot) <= 2e-2 * (fabs(dot) + sqrt(scale)) + 1e-6 * fabs_f / h;
    }
    if (judged && !ok) {
        fprintf(stderr,
                "fuzz_model_arch: directional derivative %g, backward says %g (typical term %g)\n",
                fd, dot, sqrt(scale));
        abort();
    }
    free(v);
    free(saved);
    free(u);
    free(xs);
    free(base);
    free(pat);
}

/* One training step on both kernel sets of the architecture json. */
static void run_both(const char *json, size_t len)
{
    strata_model *m[2] = {NULL, NULL};
    for (int k = 0; k < 2; k++) {
        check(strata_model_from_json(json, len, &m[k], NULL) == STRATA_OK, "second build failed");
        strata_model_init_params(m[k], 7);
        strata__model_set_reference(m[k], k);
        strata_model_set_input_grad(m[k], 1);
    }
    const size_t B = FUZZ_BATCH, nin = B * strata_model_input_dim(m[0]),
                 C = strata_model_output_dim(m[0]), nout = B * C;
    float *x = malloc(nin * sizeof(float)), *R = malloc(nout * sizeof(float));
    check(x != NULL && R != NULL, "out of memory");
    strata_rng r;
    strata_rng_seed(&r, 11, 0);
    for (size_t i = 0; i < nin; i++)
        x[i] = (float)strata_rng_uniform(&r);
    for (size_t i = 0; i < nout; i++)
        R[i] = (float)strata_rng_normal(&r);
    uint8_t labels[FUZZ_BATCH];
    for (size_t b = 0; b < B; b++)
        labels[b] = (uint8_t)strata_rng_below(&r, C < 256 ? C : 256);
    const float *y[2];
    double loss[2] = {0.0, 0.0};
    int huge = 0;
    for (int k = 0; k < 2; k++) {
        strata_rng dr;
        strata_rng_seed(&dr, 5, 0); /* the same dropout masks */
        check(strata_model_forward(m[k], x, B, 1, &dr, &y[k]) == STRATA_OK, "forward failed");
        for (int i = 1; i <= m[k]->nlayers; i++)
            if (!m[k]->dnnl_active &&
                !(max_abs(m[k]->act[i], B * m[k]->layers[i - 1].out_dim) < FUZZ_HUGE))
                huge = 1;
        int rc = C <= 256 ? strata_model_backward(m[k], labels, &loss[k], NULL)
                          : strata_model_backward_from(m[k], R);
        check(rc == STRATA_OK, "backward failed");
    }
    check(strcmp(strata__model_kernels(m[1]), "reference") == 0, "reference model ran oneDNN");
    if (!huge) {
        agree("logits", y[0], y[1], nout, 1e-5 * (1.0 + max_abs(y[1], nout)));
        check(isfinite(loss[0]) && isfinite(loss[1]) &&
                  fabs(loss[0] - loss[1]) <= 1e-2 * (1.0 + fabs(loss[1])),
              "losses differ");
        strata_tensor_list *g0 = strata_model_grads(m[0]), *g1 = strata_model_grads(m[1]);
        /* The noise floor: 0.1% of the largest gradient anywhere */
        double gmax = max_abs(strata_model_input_grad(m[1]), nin);
        for (size_t t = 0; t < g1->count; t++) {
            double v = max_abs(g1->items[t].data, g1->items[t].numel);
            if (v > gmax)
                gmax = v;
        }
        /* and float32 rounding of sums of the logits' gradient, which may
         * cancel to zero (a bias under a cross-entropy over its outputs):
         * at most 2 in all for the cross-entropy, the sum of |R| else. */
        double dl1 = 2.0;
        if (C > 256)
            for (size_t i = 0; i < nout; i++)
                dl1 += fabs((double)R[i]);
        const double noise = 1e-3 * gmax + 1e-6 * dl1;
        for (size_t t = 0; t < g0->count; t++)
            agree(g0->items[t].name, g0->items[t].data, g1->items[t].data, g0->items[t].numel,
                  noise);
        agree("input gradient", strata_model_input_grad(m[0]), strata_model_input_grad(m[1]), nin,
              noise);
        directional(m[1], x, R);
    }
    free(x);
    free(R);
    strata_model_free(m[0]);
    strata_model_free(m[1]);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    strata_set_threads(1);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *json = (const char *)data;
    size_t count = 0;
    strata_diag d1 = {{0}}, d2 = {{0}};
    int rc_count = strata_model_count_params(json, size, &count, &d1);
    strata_model *m = NULL;
    int rc = strata_model_from_json(json, size, &m, &d2);
    if (rc < 0) {
        check(m == NULL, "failed build returned a model");
        check(rc_count < 0 || rc == STRATA_ENOMEM, "count succeeded where the build failed");
        check(d2.msg[0] != '\0' || rc == STRATA_ENOMEM, "failed build without a message");
        return 0;
    }
    check(rc == STRATA_OK && m != NULL, "build returned no model");
    check(rc_count == STRATA_OK, "count failed where the build succeeded");
    size_t total = 0;
    strata_tensor_list *p = strata_model_params(m);
    for (size_t t = 0; t < p->count; t++)
        total += p->items[t].numel;
    check(count == total, "count differs from the built model's parameters");
    const char *canon = strata_model_arch(m);
    size_t again = 0;
    check(strata_model_count_params(canon, strlen(canon), &again, NULL) == STRATA_OK &&
              again == count,
          "canonical JSON does not parse to the same count");
    int run = count < FUZZ_MAX_PARAMS && small_enough(m);
    strata_model_free(m);
    if (run)
        run_both(json, size);
    return 0;
}
