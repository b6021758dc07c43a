#include "strata/partition.h"

#include "strata/rng.h"

#include <assert.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* RNG stream of the partitioners, so that a partition seed reused elsewhere
 * (model initialisation, client sampling) gives an unrelated stream. */
#define PARTITION_STREAM 0x7061727469ULL

enum scheme { SCHEME_IID, SCHEME_DIRICHLET, SCHEME_SHARDS };

/* The public struct plus the one block that holds every client's indices. */
typedef struct partition_impl {
    strata_partition pub; /* first member: a strata_partition * is a partition_impl * */
    size_t *flat;
} partition_impl;

void strata_partition_free(strata_partition *p)
{
    if (p == NULL)
        return;
    partition_impl *impl = (partition_impl *)p;
    free(impl->flat);
    free(p->indices);
    free(p->counts);
    free(impl);
}

static int parse_spec(const char *spec, enum scheme *scheme, double *alpha, size_t *shards,
                      strata_diag *diag)
{
    static const char expected[] = "expected iid, dirichlet:ALPHA or shards:S";
    if (strcmp(spec, "iid") == 0) {
        *scheme = SCHEME_IID;
        return STRATA_OK;
    }
    if (strcmp(spec, "dirichlet") == 0 || strcmp(spec, "dirichlet:") == 0)
        return strata_diag_set(diag, STRATA_EINVAL,
                               "partition \"%s\": dirichlet needs a concentration, e.g. "
                               "dirichlet:0.5",
                               spec);
    if (strcmp(spec, "shards") == 0 || strcmp(spec, "shards:") == 0)
        return strata_diag_set(diag, STRATA_EINVAL,
                               "partition \"%s\": shards needs a shard count per client, e.g. "
                               "shards:2",
                               spec);
    if (strncmp(spec, "dirichlet:", 10) == 0) {
        const char *a = spec + 10;
        char *end;
        double v = strtod(a, &end);
        if (end == a || *end != '\0' || !isfinite(v) || !(v > 0.0))
            return strata_diag_set(diag, STRATA_EINVAL,
                                   "partition \"%s\": bad Dirichlet concentration \"%s\" (need a "
                                   "finite number > 0)",
                                   spec, a);
        *scheme = SCHEME_DIRICHLET;
        *alpha = v;
        return STRATA_OK;
    }
    if (strncmp(spec, "shards:", 7) == 0) {
        const char *s = spec + 7;
        for (const char *q = s; *q != '\0'; q++)
            if (*q < '0' || *q > '9')
                return strata_diag_set(diag, STRATA_EINVAL,
                                       "partition \"%s\": bad shard count \"%s\" (need an integer "
                                       ">= 1)",
                                       spec, s);
        errno = 0;
        unsigned long long v = strtoull(s, NULL, 10);
        if (errno == ERANGE || v > SIZE_MAX)
            return strata_diag_set(diag, STRATA_EINVAL, "partition \"%s\": shard count too large",
                                   spec);
        if (v < 1)
            return strata_diag_set(diag, STRATA_EINVAL,
                                   "partition \"%s\": shard count must be at least 1", spec);
        *scheme = SCHEME_SHARDS;
        *shards = (size_t)v;
        return STRATA_OK;
    }
    return strata_diag_set(diag, STRATA_EINVAL, "unknown partition scheme \"%s\" (%s)", spec,
                           expected);
}

/* Stable counting sort of sample indices by label: sorted[] lists the
 * samples of class 0 ascending, then class 1, ...; start[k] is the first
 * position of class k and start[num_classes] == n. */
static void sort_by_label(const uint8_t *labels, size_t n, int num_classes, size_t *sorted,
                          size_t *start)
{
    size_t next[STRATA_PARTITION_MAX_CLASSES];
    memset(start, 0, (size_t)(num_classes + 1) * sizeof(*start));
    for (size_t i = 0; i < n; i++)
        start[labels[i] + 1]++;
    for (int k = 0; k < num_classes; k++)
        start[k + 1] += start[k];
    memcpy(next, start, (size_t)num_classes * sizeof(*next));
    for (size_t i = 0; i < n; i++)
        sorted[next[labels[i]]++] = i;
}

static void assign_iid(size_t n, size_t clients, strata_rng *r, size_t *perm, size_t *owner)
{
    for (size_t i = 0; i < n; i++)
        perm[i] = i;
    strata_rng_shuffle(r, perm, n);
    size_t q = n / clients, rem = n % clients, pos = 0;
    for (size_t c = 0; c < clients; c++) {
        size_t size = q + (c < rem ? 1 : 0);
        for (size_t j = 0; j < size; j++)
            owner[perm[pos++]] = c;
    }
}

static void assign_shards(const size_t *sorted, size_t n, size_t clients, size_t per_client,
                          strata_rng *r, size_t *shard_perm, size_t *owner)
{
    size_t total = clients * per_client, q = n / total, rem = n % total;
    for (size_t j = 0; j < total; j++)
        shard_perm[j] = j;
    strata_rng_shuffle(r, shard_perm, total);
    for (size_t c = 0; c < clients; c++) {
        for (size_t t = 0; t < per_client; t++) {
            size_t j = shard_perm[c * per_client + t];
            size_t lo = j * q + (j < rem ? j : rem);
            size_t hi = lo + q + (j < rem ? 1 : 0);
            for (size_t pos = lo; pos < hi; pos++)
                owner[sorted[pos]] = c;
        }
    }
}

/* Uniform double in (0, 1): never 0, so its logarithm is finite. */
static double open_uniform(strata_rng *r)
{
    return ((double)(strata_rng_u64(r) >> 11) + 0.5) * 0x1.0p-53;
}

/* Draws p ~ Dir(alpha, ..., alpha) over k components into p. Works in log
 * space so that tiny alpha, whose Gamma variates underflow to zero, still
 * gives a valid (then nearly one-hot) vector: for alpha < 1 it uses
 * Gamma(alpha) = Gamma(alpha + 1) * U^(1/alpha), keeping alpha * log G,
 * whose differences divided by alpha are the log ratios of the variates. */
static void draw_dirichlet(strata_rng *r, double alpha, size_t k, double *p)
{
    double div = alpha < 1.0 ? alpha : 1.0, kmax = -INFINITY, sum = 0.0;
    for (size_t c = 0; c < k; c++) {
        if (alpha < 1.0)
            p[c] = alpha * log(strata_rng_gamma(r, alpha + 1.0)) + log(open_uniform(r));
        else
            p[c] = log(strata_rng_gamma(r, alpha));
        if (p[c] > kmax)
            kmax = p[c];
    }
    for (size_t c = 0; c < k; c++) {
        p[c] = exp((p[c] - kmax) / div);
        sum += p[c];
    }
    for (size_t c = 0; c < k; c++)
        p[c] /= sum;
}

static void assign_dirichlet(size_t *sorted, const size_t *start, int num_classes, size_t clients,
                             double alpha, strata_rng *r, double *p, size_t *owner)
{
    for (int k = 0; k < num_classes; k++) {
        size_t nk = start[k + 1] - start[k];
        size_t *members = sorted + start[k];
        if (nk == 0)
            continue;
        strata_rng_shuffle(r, members, nk);
        draw_dirichlet(r, alpha, clients, p);
        double acc = 0.0;
        size_t prev = 0;
        for (size_t c = 0; c < clients; c++) {
            acc += p[c];
            size_t b = nk;
            if (c + 1 < clients) {
                double f = floor(acc * (double)nk);
                b = f < (double)nk ? (size_t)f : nk;
                if (b < prev)
                    b = prev;
            }
            for (size_t pos = prev; pos < b; pos++)
                owner[members[pos]] = c;
            prev = b;
        }
    }
}

/* Groups the samples by owner into flat (ascending within each client) and
 * fills counts and offsets (clients + 1 values). */
static void build_lists(const size_t *owner, size_t n, size_t clients, size_t *counts,
                        size_t *offsets, size_t *flat, size_t *next)
{
    memset(counts, 0, clients * sizeof(*counts));
    for (size_t i = 0; i < n; i++)
        counts[owner[i]]++;
    offsets[0] = 0;
    for (size_t c = 0; c < clients; c++)
        offsets[c + 1] = offsets[c] + counts[c];
    memcpy(next, offsets, clients * sizeof(*next));
    for (size_t i = 0; i < n; i++)
        flat[next[owner[i]]++] = i;
}

/* Max-heap of client ids ordered by (counts descending, id ascending). */
static int heap_before(const size_t *counts, size_t a, size_t b)
{
    return counts[a] > counts[b] || (counts[a] == counts[b] && a < b);
}

static void heap_sift_down(size_t *heap, size_t len, size_t i, const size_t *counts)
{
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, best = i;
        if (l < len && heap_before(counts, heap[l], heap[best]))
            best = l;
        if (r < len && heap_before(counts, heap[r], heap[best]))
            best = r;
        if (best == i)
            return;
        size_t t = heap[i];
        heap[i] = heap[best];
        heap[best] = t;
        i = best;
    }
}

/* Gives every empty client one sample of the currently largest client (see
 * the header). flat/offsets/counts come from build_lists and are used as
 * scratch; owner is updated. heap has room for clients values. */
static void repair_empty(size_t *owner, size_t clients, size_t *counts, const size_t *offsets,
                         size_t *flat, size_t *heap, strata_rng *r)
{
    size_t len = 0;
    for (size_t c = 0; c < clients; c++)
        if (counts[c] > 0)
            heap[len++] = c;
    for (size_t i = len / 2; i-- > 0;)
        heap_sift_down(heap, len, i, counts);
    for (size_t e = 0; e < clients; e++) {
        if (counts[e] != 0)
            continue;
        size_t donor = heap[0];
        assert(len > 0 && counts[donor] >= 2); /* n >= clients guarantees it */
        size_t *seg = flat + offsets[donor];
        size_t pos = (size_t)strata_rng_below(r, counts[donor]);
        size_t s = seg[pos];
        seg[pos] = seg[counts[donor] - 1];
        counts[donor]--;
        heap_sift_down(heap, len, 0, counts);
        owner[s] = e;
        counts[e] = 1;
    }
}

int strata_partition_new(const uint8_t *labels, size_t n, int num_classes, const char *spec,
                         size_t num_clients, uint64_t seed, strata_partition **out,
                         strata_diag *diag)
{
    partition_impl *impl = NULL;
    size_t *owner = NULL, *scratch = NULL, *offsets = NULL, *next = NULL;
    size_t start[STRATA_PARTITION_MAX_CLASSES + 1];
    double *p = NULL;
    enum scheme scheme = SCHEME_IID;
    double alpha = 0.0;
    size_t shards = 0;
    strata_rng r;
    int rc;

    if (diag != NULL)
        diag->msg[0] = '\0';
    if (out == NULL)
        return strata_diag_set(diag, STRATA_EINVAL, "strata_partition_new: out is NULL");
    *out = NULL;
    if (labels == NULL || spec == NULL)
        return strata_diag_set(diag, STRATA_EINVAL, "strata_partition_new: NULL labels or spec");
    if (n == 0)
        return strata_diag_set(diag, STRATA_EINVAL, "cannot partition an empty data set");
    if (num_classes < 1 || num_classes > STRATA_PARTITION_MAX_CLASSES)
        return strata_diag_set(diag, STRATA_EINVAL, "num_classes %d is outside 1..%d", num_classes,
                               STRATA_PARTITION_MAX_CLASSES);
    if (num_clients == 0)
        return strata_diag_set(diag, STRATA_EINVAL, "need at least one client");
    if (num_clients > n)
        return strata_diag_set(diag, STRATA_EINVAL,
                               "more clients (%zu) than samples (%zu): every client needs one",
                               num_clients, n);
    rc = parse_spec(spec, &scheme, &alpha, &shards, diag);
    if (rc < 0)
        return rc;
    if (scheme == SCHEME_SHARDS && (shards > n / num_clients))
        return strata_diag_set(diag, STRATA_EINVAL,
                               "partition \"%s\": %zu clients x %zu shards need more shards than "
                               "the %zu samples",
                               spec, num_clients, shards, n);
    for (size_t i = 0; i < n; i++)
        if (labels[i] >= num_classes)
            return strata_diag_set(diag, STRATA_EINVAL,
                                   "label %u of sample %zu is not below num_classes %d",
                                   (unsigned)labels[i], i, num_classes);
    /* The largest block: owner, scratch and the flat index list, n each. */
    if (n > SIZE_MAX / sizeof(size_t) - 1)
        return strata_diag_set(diag, STRATA_ENOMEM, "too many samples (%zu)", n);

    impl = calloc(1, sizeof(*impl));
    owner = malloc(n * sizeof(*owner));
    scratch = malloc(n * sizeof(*scratch));
    offsets = malloc((num_clients + 1) * sizeof(*offsets));
    next = malloc(num_clients * sizeof(*next));
    if (impl == NULL || owner == NULL || scratch == NULL || offsets == NULL || next == NULL)
        goto nomem;
    impl->pub.num_clients = num_clients;
    impl->pub.counts = malloc(num_clients * sizeof(size_t));
    impl->pub.indices = malloc(num_clients * sizeof(size_t *));
    impl->flat = malloc(n * sizeof(size_t));
    if (impl->pub.counts == NULL || impl->pub.indices == NULL || impl->flat == NULL)
        goto nomem;

    strata_rng_seed(&r, seed, PARTITION_STREAM);
    switch (scheme) {
    case SCHEME_IID:
        assign_iid(n, num_clients, &r, scratch, owner);
        break;
    case SCHEME_SHARDS: {
        size_t *shard_perm = malloc(num_clients * shards * sizeof(size_t));
        if (shard_perm == NULL)
            goto nomem;
        sort_by_label(labels, n, num_classes, scratch, start);
        assign_shards(scratch, n, num_clients, shards, &r, shard_perm, owner);
        free(shard_perm);
        break;
    }
    case SCHEME_DIRICHLET:
        p = malloc(num_clients * sizeof(*p));
        if (p == NULL)
            goto nomem;
        sort_by_label(labels, n, num_classes, scratch, start);
        assign_dirichlet(scratch, start, num_classes, num_clients, alpha, &r, p, owner);
        break;
    }

    size_t *counts = impl->pub.counts;
    build_lists(owner, n, num_clients, counts, offsets, impl->flat, next);
    int empty = 0;
    for (size_t c = 0; c < num_clients; c++)
        if (counts[c] == 0)
            empty = 1;
    if (empty) {
        /* Only the Dirichlet scheme can leave a client empty. */
        repair_empty(owner, num_clients, counts, offsets, impl->flat, next, &r);
        build_lists(owner, n, num_clients, counts, offsets, impl->flat, next);
    }
    for (size_t c = 0; c < num_clients; c++)
        impl->pub.indices[c] = impl->flat + offsets[c];

    *out = &impl->pub;
    impl = NULL;
    rc = STRATA_OK;
    goto out;
nomem:
    rc = strata_diag_set(diag, STRATA_ENOMEM, "out of memory partitioning %zu samples", n);
out:
    strata_partition_free(impl != NULL ? &impl->pub : NULL);
    free(owner);
    free(scratch);
    free(offsets);
    free(next);
    free(p);
    return rc;
}

void strata_partition_histogram(const strata_partition *p, const uint8_t *labels, int num_classes,
                                size_t *histogram)
{
    if (p == NULL || labels == NULL || histogram == NULL || num_classes < 1)
        return;
    size_t k_count = (size_t)num_classes;
    memset(histogram, 0, p->num_clients * k_count * sizeof(*histogram));
    for (size_t c = 0; c < p->num_clients; c++) {
        size_t *row = histogram + c * k_count;
        for (size_t i = 0; i < p->counts[c]; i++) {
            uint8_t k = labels[p->indices[c][i]];
            if (k < num_classes)
                row[k]++;
        }
    }
}

static int digits(size_t v)
{
    int d = 1;
    while (v >= 10) {
        v /= 10;
        d++;
    }
    return d;
}

void strata_partition_print(const strata_partition *p, const uint8_t *labels, int num_classes,
                            FILE *f)
{
    if (p == NULL || labels == NULL || f == NULL || num_classes < 1 ||
        num_classes > STRATA_PARTITION_MAX_CLASSES)
        return;
    size_t row[STRATA_PARTITION_MAX_CLASSES], max_count = 0, total = 0;
    for (size_t c = 0; c < p->num_clients; c++) {
        total += p->counts[c];
        if (p->counts[c] > max_count)
            max_count = p->counts[c];
    }
    int cw = digits(p->num_clients > 0 ? p->num_clients - 1 : 0);
    int nw = digits(max_count);
    if (cw < 6)
        cw = 6;
    if (nw < 7)
        nw = 7;
    int kw = digits(max_count);
    if (kw < digits((size_t)num_classes - 1))
        kw = digits((size_t)num_classes - 1);

    fprintf(f, "%*s %*s |", cw, "client", nw, "samples");
    for (int k = 0; k < num_classes; k++)
        fprintf(f, " %*d", kw, k);
    fprintf(f, " |   top\n");
    double top_sum = 0.0;
    for (size_t c = 0; c < p->num_clients; c++) {
        memset(row, 0, (size_t)num_classes * sizeof(row[0]));
        for (size_t i = 0; i < p->counts[c]; i++) {
            uint8_t k = labels[p->indices[c][i]];
            if (k < num_classes)
                row[k]++;
        }
        size_t top = 0;
        fprintf(f, "%*zu %*zu |", cw, c, nw, p->counts[c]);
        for (int k = 0; k < num_classes; k++) {
            fprintf(f, " %*zu", kw, row[k]);
            if (row[k] > top)
                top = row[k];
        }
        double frac = p->counts[c] > 0 ? (double)top / (double)p->counts[c] : 0.0;
        top_sum += frac;
        fprintf(f, " | %5.3f\n", frac);
    }
    fprintf(f, "%zu clients, %zu samples; mean top-class fraction %.3f\n", p->num_clients, total,
            p->num_clients > 0 ? top_sum / (double)p->num_clients : 0.0);
}
