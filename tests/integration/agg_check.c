/* agg_check: helper of tests/integration/test_server_aggregation.sh.
 *
 *   agg_check delta --like MODEL.safetensors --seed S --scale X --out D.safetensors
 *     writes a tensor list shaped like MODEL whose elements are scale * N(0, 1)
 *     (seeded), to be compressed into an update with strata-tool compress.
 *
 *   agg_check verify --w0 W0.safetensors --w1 W1.safetensors
 *                    [--opt plain|fedavgm|fedadam|fedyogi] [--lr X] [--tol T]
 *                    [--rule mean|trimmed-mean|median] [--trim F] [--clip C]
 *                    [--attacker I --honest H.bin] P1.bin P2.bin ...
 *     decodes the uploaded payloads to dense deltas (coordinates a sparse
 *     layer did not send are 0) and computes the coordinator's aggregate
 *     directly, in double precision, rounded once to float32 as the
 *     coordinator's aggregators document:
 *       clipping (C > 0): every delta whose L2 norm over all layers exceeds C
 *         is first scaled by C / norm;
 *       mean (default): the sample-weighted mean sum_i n_i d_i / sum_i n_i;
 *       trimmed-mean: per coordinate, unweighted, the mean of the n values
 *         left after dropping the k = floor(F * n) lowest and k highest;
 *       median: per coordinate, unweighted, the middle value (the mean of the
 *         two middle ones for an even n).
 *     It then applies one step of the named server optimiser by hand with its
 *     default hyperparameters (momentum 0.5, beta1 0, beta2 0.99, tau 0.01;
 *     state starting at v = 0, resp. m = 0 and v = tau^2) and compares the
 *     result with W1, the coordinator's model after that round.
 *
 *     To show that the check can tell the rule from a near miss it also
 *     predicts W1 from an alternative, which must be off by more than
 *     100 * tol: for the mean rule the unweighted mean (of the clipped deltas
 *     when clipping); for a robust rule the plain, unclipped weighted mean.
 *     For the mean rule with clipping that actually scaled an update, the
 *     unclipped weighted mean must be off by more than 100 * tol as well.
 *
 *     --attacker I names the payload (0-based) of a client that scaled its
 *     delta, --honest the payload it would have sent otherwise. The check then
 *     reports how far the attack moved W1 from the rule applied to the honest
 *     payloads (attack_shift) and how far it moved the plain weighted mean
 *     (fedavg_attack_shift), and requires the first to be at most 1/100 of
 *     the second.
 *
 *     Prints one JSON line (for the mean rule without clipping or attacker,
 *     the same fields as before the robust rules existed); exits 0 when
 *     max |W1 - expected| <= tol and every check above holds, 1 otherwise. */
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
    const double momentum = 0.5, beta1 = 0.0, beta2 = 0.99, tau = 0.01;
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

enum { RULE_MEAN, RULE_UNWEIGHTED, RULE_TRIMMED, RULE_MEDIAN };

/* One decoded upload: its dense delta over the whole model (float32, as the
 * library's decoder returns it), its sample count, its L2 norm over all
 * layers and the factor clipping scales it by (1 when not clipped). */
typedef struct {
    float *dense;
    double weight;
    double norm;
    double clip_scale;
} update;

/* Reads and decodes the payload at path into u (dense over the layout of w0);
 * counts its TOPK/RANDK layers into *sparse. Returns 0 or die()'s status. */
static int load_update(const char *path, const strata_tensor_list *w0, size_t total, update *u,
                       size_t *sparse)
{
    uint8_t *buf;
    size_t len;
    if (read_all(path, &buf, &len) != 0)
        return die("%s: %s", path, strerror(errno ? errno : EIO));
    strata_payload *p = NULL;
    strata_diag d = {{0}};
    int rc = strata_payload_decode(buf, len, NULL, &p, &d);
    free(buf);
    if (rc < 0)
        return die("%s: %s", path, strata_diag_msg(&d, rc));
    if (p->num_layers != w0->count || p->sample_count == 0) {
        strata_payload_free(p);
        return die("%s: layer count or sample count does not match", path);
    }
    u->dense = strata_alloc_floats(total ? total : 1);
    if (u->dense == NULL) {
        strata_payload_free(p);
        return die("out of memory");
    }
    u->weight = (double)p->sample_count;
    double sq = 0;
    size_t off = 0;
    for (size_t i = 0; i < w0->count; i++) {
        const strata_clayer *l = &p->layers[i];
        *sparse += l->comp == STRATA_COMP_TOPK || l->comp == STRATA_COMP_RANDK;
        if (l->layer_index != i || l->numel != w0->items[i].numel) {
            strata_payload_free(p);
            return die("%s: layer %s does not match the model", path, w0->items[i].name);
        }
        rc = strata_clayer_decode(l, u->dense + off, &d);
        if (rc < 0) {
            strata_payload_free(p);
            return die("%s: %s", path, strata_diag_msg(&d, rc));
        }
        for (size_t j = 0; j < l->numel; j++)
            sq += (double)u->dense[off + j] * (double)u->dense[off + j];
        off += l->numel;
    }
    strata_payload_free(p);
    u->norm = sqrt(sq);
    u->clip_scale = 1.0;
    return 0;
}

/* The aggregate of the n updates, coordinate by coordinate, in double
 * precision, rounded once to float32 into out (total elements). clip: use
 * each update's clip_scale. RULE_MEAN weights by sample count; the other
 * rules count every update once. */
static void aggregate(int rule, double trim, const update *ups, size_t n, int clip, size_t total,
                      float *out)
{
    double v[64];
    size_t k = (size_t)floor(trim * (double)n);
    for (size_t j = 0; j < total; j++) {
        double acc = 0, wsum = 0;
        for (size_t u = 0; u < n; u++) {
            double x = (clip ? ups[u].clip_scale : 1.0) * (double)ups[u].dense[j];
            double w = rule == RULE_MEAN ? ups[u].weight : 1.0;
            acc += w * x;
            wsum += w;
            /* insertion sort: n is a handful of clients */
            size_t p = u;
            while (p > 0 && v[p - 1] > x) {
                v[p] = v[p - 1];
                p--;
            }
            v[p] = x;
        }
        double r;
        if (rule == RULE_MEDIAN) {
            r = n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
        } else if (rule == RULE_TRIMMED) {
            r = 0;
            for (size_t p = k; p < n - k; p++)
                r += v[p];
            r /= (double)(n - 2 * k);
        } else {
            r = acc / wsum;
        }
        out[j] = (float)r;
    }
}

/* The model the server step predicts from w0 and the aggregate d. */
static void predict(int opt, double lr, const strata_tensor_list *w0, const float *d, double *out)
{
    size_t off = 0;
    for (size_t i = 0; i < w0->count; i++) {
        for (size_t j = 0; j < w0->items[i].numel; j++)
            out[off + j] = server_step(opt, lr, w0->items[i].data[j], d[off + j]);
        off += w0->items[i].numel;
    }
}

/* max_j |a_j - b_j|; its index into *worst when non-NULL. */
static double max_dist(const double *a, const double *b, size_t total, size_t *worst)
{
    double m = 0;
    for (size_t j = 0; j < total; j++) {
        double e = fabs(a[j] - b[j]);
        if (e > m) {
            m = e;
            if (worst != NULL)
                *worst = j;
        }
    }
    return m;
}

static int cmd_verify(int argc, char **argv)
{
    const char *w0p = NULL, *w1p = NULL, *optname = "plain", *rulename = "mean";
    const char *honestp = NULL;
    double lr = 1.0, tol = 1e-6, trim = 0.1, clip = 0;
    long attacker = -1;
    static const struct option opts[] = {{"w0", required_argument, NULL, 'a'},
                                         {"w1", required_argument, NULL, 'b'},
                                         {"opt", required_argument, NULL, 'o'},
                                         {"lr", required_argument, NULL, 'l'},
                                         {"tol", required_argument, NULL, 't'},
                                         {"rule", required_argument, NULL, 'r'},
                                         {"trim", required_argument, NULL, 'm'},
                                         {"clip", required_argument, NULL, 'c'},
                                         {"attacker", required_argument, NULL, 'x'},
                                         {"honest", required_argument, NULL, 'h'},
                                         {NULL, 0, NULL, 0}};
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
        else if (c == 'r')
            rulename = optarg;
        else if (c == 'm')
            trim = strtod(optarg, NULL);
        else if (c == 'c')
            clip = strtod(optarg, NULL);
        else if (c == 'x')
            attacker = strtol(optarg, NULL, 10);
        else if (c == 'h')
            honestp = optarg;
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
    int rule;
    if (strcmp(rulename, "mean") == 0)
        rule = RULE_MEAN;
    else if (strcmp(rulename, "trimmed-mean") == 0)
        rule = RULE_TRIMMED;
    else if (strcmp(rulename, "median") == 0)
        rule = RULE_MEDIAN;
    else
        return die("verify: unknown --rule %s", rulename);
    if (!(trim >= 0 && trim < 0.5) || !(clip >= 0))
        return die("verify: --trim must be in [0, 0.5) and --clip >= 0");
    if (w0p == NULL || w1p == NULL || optind >= argc)
        return die("verify: --w0, --w1 and at least one payload are required");
    size_t npay = (size_t)(argc - optind);
    if (npay > 64)
        return die("verify: at most 64 payloads");
    if ((attacker >= 0) != (honestp != NULL) || attacker >= (long)npay)
        return die("verify: --attacker I (a payload index) and --honest P.bin go together");

    strata_tensor_list w0, w1;
    if (load(w0p, &w0) != 0 || load(w1p, &w1) != 0)
        return 2;
    if (!strata_tensor_list_same_layout(&w0, &w1))
        return die("verify: %s and %s differ in layout", w0p, w1p);

    size_t total = strata_tensor_list_numel(&w0), sparse = 0, nalloc = total ? total : 1;
    /* ups[0..npay-1]: the uploads; ups[npay]: the attacker's honest update. */
    update ups[65] = {{0}}, hon[64];
    int rc;
    for (size_t u = 0; u < npay; u++)
        if ((rc = load_update(argv[optind + (int)u], &w0, total, &ups[u], &sparse)) != 0)
            return rc;
    if (honestp != NULL) {
        size_t ignored = 0;
        if ((rc = load_update(honestp, &w0, total, &ups[npay], &ignored)) != 0)
            return rc;
    }
    size_t nclipped = 0;
    for (size_t u = 0; u <= npay; u++) {
        if (clip > 0 && ups[u].dense != NULL && ups[u].norm > clip) {
            ups[u].clip_scale = clip / ups[u].norm;
            nclipped += u < npay;
        }
        if (u < npay)
            hon[u] = (long)u == attacker ? ups[npay] : ups[u];
    }

    /* exp: the rule as configured; alt: the check's alternative (unweighted
     * mean for the weighted mean, the plain weighted mean otherwise). */
    float *d = malloc(nalloc * sizeof(float));
    double *w1d = malloc(nalloc * sizeof(double)), *pexp = malloc(nalloc * sizeof(double));
    double *palt = malloc(nalloc * sizeof(double)), *pw0 = malloc(nalloc * sizeof(double));
    if (d == NULL || w1d == NULL || pexp == NULL || palt == NULL || pw0 == NULL)
        return die("out of memory");
    size_t off = 0;
    for (size_t i = 0; i < w1.count; i++) {
        for (size_t j = 0; j < w1.items[i].numel; j++) {
            w1d[off + j] = w1.items[i].data[j];
            pw0[off + j] = w0.items[i].data[j];
        }
        off += w1.items[i].numel;
    }
    double meanabs = 0;
    aggregate(rule, trim, ups, npay, clip > 0, total, d);
    for (size_t j = 0; j < total; j++)
        meanabs += fabs((double)d[j]);
    predict(opt, lr, &w0, d, pexp);
    size_t worst = 0;
    double err = max_dist(w1d, pexp, total, &worst);
    double moved = max_dist(w1d, pw0, total, NULL);
    /* For the weighted mean: what an unweighted mean would give (of the
     * clipped updates when clipping). For a robust rule: what the plain,
     * unclipped weighted mean would give. */
    aggregate(rule == RULE_MEAN ? RULE_UNWEIGHTED : RULE_MEAN, 0, ups, npay,
              rule == RULE_MEAN && clip > 0, total, d);
    predict(opt, lr, &w0, d, palt);
    double alterr = max_dist(w1d, palt, total, NULL);
    /* With clipping under the weighted mean: the unclipped weighted mean. */
    double unclipped_err = 0;
    if (rule == RULE_MEAN && clip > 0) {
        aggregate(RULE_MEAN, 0, ups, npay, 0, total, d);
        predict(opt, lr, &w0, d, palt);
        unclipped_err = max_dist(w1d, palt, total, NULL);
    }
    /* With an attacker: how far the attack moved the configured rule (the
     * coordinator's W1 against the rule over the honest updates) and how far
     * it moved the plain weighted mean. */
    double rule_shift = 0, fedavg_shift = 0;
    if (attacker >= 0) {
        aggregate(rule, trim, hon, npay, clip > 0, total, d);
        predict(opt, lr, &w0, d, palt);
        rule_shift = max_dist(w1d, palt, total, NULL);
        aggregate(RULE_MEAN, 0, hon, npay, 0, total, d);
        predict(opt, lr, &w0, d, palt);
        aggregate(RULE_MEAN, 0, ups, npay, 0, total, d);
        predict(opt, lr, &w0, d, pexp);
        fedavg_shift = max_dist(pexp, palt, total, NULL);
    }

    int ok = err <= tol && alterr > 100 * tol;
    if (rule == RULE_MEAN && nclipped > 0)
        ok = ok && unclipped_err > 100 * tol;
    if (attacker >= 0)
        ok = ok && rule_shift * 100 <= fedavg_shift;

    printf("{\"weights\":[");
    for (size_t u = 0; u < npay; u++)
        printf("%s%.0f", u ? "," : "", ups[u].weight);
    printf("]");
    if (rule != RULE_MEAN)
        printf(",\"rule\":\"%s\",\"trim\":%g", rulename, trim);
    if (clip > 0) {
        printf(",\"clip\":%g,\"norms\":[", clip);
        for (size_t u = 0; u < npay; u++)
            printf("%s%.4g", u ? "," : "", ups[u].norm);
        printf("],\"clipped\":%zu", nclipped);
    }
    printf(",\"opt\":\"%s\",\"lr\":%g,\"elements\":%zu,\"max_abs_err\":%.3e,\"worst_element\":%zu,",
           optname, lr, total, err, worst);
    if (rule == RULE_MEAN)
        printf("\"unweighted_max_abs_err\":%.3e,", alterr);
    else
        printf("\"fedavg_max_abs_err\":%.3e,", alterr);
    if (rule == RULE_MEAN && clip > 0)
        printf("\"unclipped_max_abs_err\":%.3e,", unclipped_err);
    if (attacker >= 0)
        printf("\"attacker\":%ld,\"attack_shift\":%.3e,\"fedavg_attack_shift\":%.3e,", attacker,
               rule_shift, fedavg_shift);
    printf("\"max_abs_change\":%.3e,\"mean_abs_delta\":%.3e,\"sparse_layers\":%zu,\"tol\":%g,"
           "\"ok\":%s}\n",
           moved, meanabs / (double)nalloc, sparse, tol, ok ? "true" : "false");
    for (size_t u = 0; u <= npay; u++)
        strata_free_floats(ups[u].dense);
    free(d);
    free(w1d);
    free(pexp);
    free(palt);
    free(pw0);
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
                    "       agg_check verify --w0 W0 --w1 W1 [--opt NAME] [--lr X] [--tol T]\n"
                    "                        [--rule mean|trimmed-mean|median] [--trim F] "
                    "[--clip C]\n"
                    "                        [--attacker I --honest H.bin] P.bin...\n");
    return 2;
}
