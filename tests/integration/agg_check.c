/* agg_check: helper of tests/integration/test_server_aggregation.sh.
 *
 *   agg_check delta --like MODEL.safetensors --seed S --scale X --out D.safetensors
 *     writes a tensor list shaped like MODEL whose elements are scale * N(0, 1)
 *     (seeded), to be compressed into an update with strata-tool compress.
 *
 *   agg_check verify --w0 W0.safetensors --w1 W1.safetensors
 *                    [--opt plain|fedavgm|fedadam|fedyogi] [--lr X] [--tol T]
 *                    P1.bin P2.bin ...
 *     decodes the uploaded payloads, computes the sample-weighted mean
 *     d = sum_i n_i * decode(P_i) / sum_i n_i directly (double precision,
 *     rounded once to float32 as the coordinator's aggregator documents), applies
 *     one step of the named server optimiser by hand with its default
 *     hyperparameters (momentum 0.9, beta1 0.9, beta2 0.99, tau 1e-3; state
 *     starting at v = 0, resp. m = 0 and v = tau^2) and compares the result with
 *     W1, the coordinator's model after that round. It also computes what an
 *     unweighted mean would have given, to show that the check can tell the two
 *     apart. Prints one JSON line; exits 0 when max |W1 - expected| <= tol and
 *     the unweighted prediction is off by more than 100 * tol, 1 otherwise. */
#include "strata/compress.h"
#include "strata/payload.h"
#include "strata/rng.h"
#include "strata/safetensors.h"

#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static int die(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "agg_check: ");
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return 2;
}

static int read_all(const char *path, uint8_t **out, size_t *len)
{
    *out = NULL;
    *len = 0;
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return -1;
    struct stat st;
    if (fstat(fileno(f), &st) != 0 || st.st_size <= 0) {
        fclose(f);
        return -1;
    }
    uint8_t *buf = malloc((size_t)st.st_size);
    size_t n = buf ? fread(buf, 1, (size_t)st.st_size, f) : 0;
    fclose(f);
    if (buf == NULL || n != (size_t)st.st_size) {
        free(buf);
        return -1;
    }
    *out = buf;
    *len = n;
    return 0;
}

static int load(const char *path, strata_tensor_list *t)
{
    strata_diag d = {{0}};
    strata_tensor_list_init(t);
    int rc = strata_safetensors_read(path, 0, t, NULL, &d);
    if (rc < 0)
        return die("%s: %s", path, strata_diag_msg(&d, rc));
    return 0;
}

static int cmd_delta(int argc, char **argv)
{
    const char *like = NULL, *out = NULL;
    unsigned long long seed = 1;
    double scale = 0.01;
    static const struct option opts[] = {{"like", required_argument, NULL, 'l'},
                                         {"seed", required_argument, NULL, 's'},
                                         {"scale", required_argument, NULL, 'x'},
                                         {"out", required_argument, NULL, 'o'},
                                         {NULL, 0, NULL, 0}};
    int c;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        if (c == 'l')
            like = optarg;
        else if (c == 's')
            seed = strtoull(optarg, NULL, 10);
        else if (c == 'x')
            scale = strtod(optarg, NULL);
        else if (c == 'o')
            out = optarg;
        else
            return 2;
    }
    if (like == NULL || out == NULL || !(scale > 0))
        return die("delta: --like, --out and --scale > 0 are required");
    strata_tensor_list t;
    if (load(like, &t) != 0)
        return 2;
    strata_rng r;
    strata_rng_seed(&r, seed, 0);
    for (size_t i = 0; i < t.count; i++)
        for (size_t j = 0; j < t.items[i].numel; j++)
            t.items[i].data[j] = (float)(scale * strata_rng_normal(&r));
    strata_diag d = {{0}};
    int rc = strata_safetensors_write(out, &t, NULL, &d);
    strata_tensor_list_cleanup(&t);
    if (rc < 0)
        return die("%s: %s", out, strata_diag_msg(&d, rc));
    return 0;
}

enum { OPT_PLAIN, OPT_FEDAVGM, OPT_FEDADAM, OPT_FEDYOGI };

/* One hand-computed server step on one element: w0 and the aggregated delta
 * d (float32, as the aggregator returns it); state rounded to float32 as the
 * optimiser stores it. */
static double server_step(int opt, double lr, float w0, float d)
{
    const double momentum = 0.9, beta1 = 0.9, beta2 = 0.99, tau = 1e-3;
    double dd = d;
    switch (opt) {
    case OPT_FEDAVGM: {
        float v = (float)(momentum * 0.0 + dd);
        return (double)w0 + lr * (double)v;
    }
    case OPT_FEDADAM:
    case OPT_FEDYOGI: {
        float m = (float)(beta1 * 0.0 + (1 - beta1) * dd);
        double v0 = (double)(float)(tau * tau);
        double v;
        if (opt == OPT_FEDADAM) {
            v = beta2 * v0 + (1 - beta2) * dd * dd;
        } else {
            double s = v0 - dd * dd;
            v = v0 - (1 - beta2) * dd * dd * (double)((s > 0) - (s < 0));
        }
        float vf = (float)v;
        return (double)w0 + lr * (double)m / (sqrt((double)vf) + tau);
    }
    default:
        return (double)w0 + lr * dd;
    }
}

static int cmd_verify(int argc, char **argv)
{
    const char *w0p = NULL, *w1p = NULL, *optname = "plain";
    double lr = 1.0, tol = 1e-6;
    static const struct option opts[] = {
        {"w0", required_argument, NULL, 'a'},  {"w1", required_argument, NULL, 'b'},
        {"opt", required_argument, NULL, 'o'}, {"lr", required_argument, NULL, 'l'},
        {"tol", required_argument, NULL, 't'}, {NULL, 0, NULL, 0}};
    int c;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        if (c == 'a')
            w0p = optarg;
        else if (c == 'b')
            w1p = optarg;
        else if (c == 'o')
            optname = optarg;
        else if (c == 'l')
            lr = strtod(optarg, NULL);
        else if (c == 't')
            tol = strtod(optarg, NULL);
        else
            return 2;
    }
    int opt;
    if (strcmp(optname, "plain") == 0)
        opt = OPT_PLAIN;
    else if (strcmp(optname, "fedavgm") == 0)
        opt = OPT_FEDAVGM;
    else if (strcmp(optname, "fedadam") == 0)
        opt = OPT_FEDADAM;
    else if (strcmp(optname, "fedyogi") == 0)
        opt = OPT_FEDYOGI;
    else
        return die("verify: unknown --opt %s", optname);
    if (w0p == NULL || w1p == NULL || optind >= argc)
        return die("verify: --w0, --w1 and at least one payload are required");

    strata_tensor_list w0, w1;
    if (load(w0p, &w0) != 0 || load(w1p, &w1) != 0)
        return 2;
    if (!strata_tensor_list_same_layout(&w0, &w1))
        return die("verify: %s and %s differ in layout", w0p, w1p);

    size_t total = strata_tensor_list_numel(&w0);
    double *wsum = calloc(total ? total : 1, sizeof(double)); /* sum n_i * delta_i */
    double *usum = calloc(total ? total : 1, sizeof(double)); /* sum delta_i */
    if (wsum == NULL || usum == NULL)
        return die("out of memory");
    double weight = 0;
    size_t sparse = 0;
    int npay = argc - optind;
    printf("{\"weights\":[");
    for (int k = optind; k < argc; k++) {
        uint8_t *buf;
        size_t len;
        if (read_all(argv[k], &buf, &len) != 0)
            return die("%s: %s", argv[k], strerror(errno ? errno : EIO));
        strata_payload *p = NULL;
        strata_diag d = {{0}};
        int rc = strata_payload_decode(buf, len, NULL, &p, &d);
        free(buf);
        if (rc < 0)
            return die("%s: %s", argv[k], strata_diag_msg(&d, rc));
        if (p->num_layers != w0.count || p->sample_count == 0)
            return die("%s: layer count or sample count does not match", argv[k]);
        double n = (double)p->sample_count;
        printf("%s%llu", k > optind ? "," : "", (unsigned long long)p->sample_count);
        size_t off = 0;
        for (size_t i = 0; i < w0.count; i++) {
            const strata_clayer *l = &p->layers[i];
            sparse += l->comp == STRATA_COMP_TOPK || l->comp == STRATA_COMP_RANDK;
            if (l->layer_index != i || l->numel != w0.items[i].numel)
                return die("%s: layer %s does not match the model", argv[k], w0.items[i].name);
            float *dense = strata_alloc_floats(w0.items[i].numel);
            if (dense == NULL)
                return die("out of memory");
            rc = strata_clayer_decode(l, dense, &d);
            if (rc < 0)
                return die("%s: %s", argv[k], strata_diag_msg(&d, rc));
            for (size_t j = 0; j < w0.items[i].numel; j++) {
                wsum[off + j] += n * (double)dense[j];
                usum[off + j] += (double)dense[j];
            }
            strata_free_floats(dense);
            off += w0.items[i].numel;
        }
        weight += n;
        strata_payload_free(p);
    }

    double err = 0, uerr = 0, moved = 0, meanabs = 0;
    size_t off = 0, worst = 0;
    for (size_t i = 0; i < w0.count; i++) {
        const float *a = w0.items[i].data, *b = w1.items[i].data;
        for (size_t j = 0; j < w0.items[i].numel; j++) {
            float d = (float)(wsum[off + j] / weight);
            float du = (float)(usum[off + j] / npay);
            double e = fabs((double)b[j] - server_step(opt, lr, a[j], d));
            double eu = fabs((double)b[j] - server_step(opt, lr, a[j], du));
            if (e > err) {
                err = e;
                worst = off + j;
            }
            if (eu > uerr)
                uerr = eu;
            double mv = fabs((double)b[j] - (double)a[j]);
            if (mv > moved)
                moved = mv;
            meanabs += fabs((double)d);
        }
        off += w0.items[i].numel;
    }
    int ok = err <= tol && uerr > 100 * tol;
    printf("],\"opt\":\"%s\",\"lr\":%g,\"elements\":%zu,\"max_abs_err\":%.3e,"
           "\"worst_element\":%zu,\"unweighted_max_abs_err\":%.3e,\"max_abs_change\":%.3e,"
           "\"mean_abs_delta\":%.3e,\"sparse_layers\":%zu,\"tol\":%g,\"ok\":%s}\n",
           optname, lr, total, err, worst, uerr, moved, meanabs / (double)(total ? total : 1),
           sparse, tol, ok ? "true" : "false");
    free(wsum);
    free(usum);
    strata_tensor_list_cleanup(&w0);
    strata_tensor_list_cleanup(&w1);
    return ok ? 0 : 1;
}

int main(int argc, char **argv)
{
    if (argc >= 2 && strcmp(argv[1], "delta") == 0)
        return cmd_delta(argc - 1, argv + 1);
    if (argc >= 2 && strcmp(argv[1], "verify") == 0)
        return cmd_verify(argc - 1, argv + 1);
    fprintf(stderr, "usage: agg_check delta --like MODEL --seed S --scale X --out D.safetensors\n"
                    "       agg_check verify --w0 W0 --w1 W1 [--opt NAME] [--lr X] [--tol T] "
                    "P.bin...\n");
    return 2;
}
