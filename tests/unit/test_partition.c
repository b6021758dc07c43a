#include "strata/error.h"
#include "strata/partition.h"
#include "strata/rng.h"
#include "test_util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- helpers ---- */

/* n labels, class k appearing n/k_count or n/k_count+1 times, in a seeded
 * random order. Caller frees. */
static uint8_t *balanced_labels(size_t n, int k_count, uint64_t seed)
{
    uint8_t *y = malloc(n > 0 ? n : 1);
    if (y == NULL)
        return NULL;
    for (size_t i = 0; i < n; i++)
        y[i] = (uint8_t)(i % (size_t)k_count);
    strata_rng r;
    strata_rng_seed(&r, seed, 99);
    for (size_t i = n; i > 1; i--) {
        size_t j = (size_t)strata_rng_below(&r, i);
        uint8_t t = y[i - 1];
        y[i - 1] = y[j];
        y[j] = t;
    }
    return y;
}

/* Counts violations of the partition invariants: the right client count,
 * every client non-empty with strictly ascending indices below n, counts
 * summing to n, and every sample seen exactly once. */
static size_t partition_problems(const strata_partition *p, size_t n, size_t clients)
{
    size_t problems = 0, total = 0;
    unsigned char *seen = calloc(n, 1);
    if (seen == NULL || p->num_clients != clients) {
        free(seen);
        return 1;
    }
    for (size_t c = 0; c < clients; c++) {
        if (p->counts[c] == 0)
            problems++;
        total += p->counts[c];
        for (size_t i = 0; i < p->counts[c]; i++) {
            size_t s = p->indices[c][i];
            if (s >= n) {
                problems++;
                continue;
            }
            if (i > 0 && s <= p->indices[c][i - 1])
                problems++;
            if (seen[s]++ != 0)
                problems++;
        }
    }
    if (total != n)
        problems++;
    for (size_t i = 0; i < n; i++)
        if (seen[i] != 1)
            problems++;
    free(seen);
    return problems;
}

static int same_partition(const strata_partition *a, const strata_partition *b)
{
    if (a->num_clients != b->num_clients)
        return 0;
    for (size_t c = 0; c < a->num_clients; c++)
        if (a->counts[c] != b->counts[c] ||
            memcmp(a->indices[c], b->indices[c], a->counts[c] * sizeof(size_t)) != 0)
            return 0;
    return 1;
}

/* owner[i] = client of sample i. */
static size_t *owners(const strata_partition *p, size_t n)
{
    size_t *owner = malloc(n * sizeof(*owner));
    if (owner == NULL)
        return NULL;
    for (size_t c = 0; c < p->num_clients; c++)
        for (size_t i = 0; i < p->counts[c]; i++)
            owner[p->indices[c][i]] = c;
    return owner;
}

/* Label-skew summary of a partition: the mean over clients of the fraction
 * held by the client's most common class, the largest distance of any
 * client's class fraction from 1/k_count, and the largest relative distance
 * of a client's size from n / clients. */
typedef struct skew {
    double mean_top, max_frac_dev, max_size_dev;
} skew;

static skew measure_skew(const strata_partition *p, const uint8_t *y, size_t n, int k_count)
{
    skew s = {0, 0, 0};
    size_t clients = p->num_clients;
    size_t *h = malloc(clients * (size_t)k_count * sizeof(*h));
    if (h == NULL)
        return s;
    strata_partition_histogram(p, y, k_count, h);
    for (size_t c = 0; c < clients; c++) {
        size_t top = 0;
        for (int k = 0; k < k_count; k++) {
            size_t v = h[c * (size_t)k_count + (size_t)k];
            double frac = (double)v / (double)p->counts[c];
            if (v > top)
                top = v;
            if (fabs(frac - 1.0 / k_count) > s.max_frac_dev)
                s.max_frac_dev = fabs(frac - 1.0 / k_count);
        }
        s.mean_top += (double)top / (double)p->counts[c];
        double ideal = (double)n / (double)clients;
        double dev = fabs((double)p->counts[c] - ideal) / ideal;
        if (dev > s.max_size_dev)
            s.max_size_dev = dev;
    }
    s.mean_top /= (double)clients;
    free(h);
    return s;
}

/* ---- every scheme: a valid partition ---- */

typedef struct valid_case {
    const char *spec;
    size_t n;
    int k_count;     /* classes present in the labels */
    int num_classes; /* passed to the partitioner (>= k_count) */
    size_t clients;
} valid_case;

static void test_valid_partitions(void)
{
    const valid_case cases[] = {
        {"iid", 60000, 10, 10, 10},
        {"iid", 7, 2, 2, 3},
        {"iid", 10, 3, 3, 10},
        {"iid", 1, 1, 1, 1},
        {"dirichlet:0.05", 60000, 10, 10, 10},
        {"dirichlet:0.5", 60000, 10, 10, 100},
        {"dirichlet:0.1", 5000, 10, 10, 1000},
        {"dirichlet:0.01", 20, 2, 2, 15},
        {"dirichlet:0.001", 50, 5, 5, 50},
        {"dirichlet:1e-300", 200, 4, 4, 30},
        {"dirichlet:5", 1000, 2, 10, 7},
        {"dirichlet:1e6", 1000, 3, 3, 10},
        {"shards:2", 60000, 10, 10, 100},
        {"shards:1", 10, 2, 2, 10},
        {"shards:3", 1003, 10, 10, 10},
        {"shards:5", 50, 3, 3, 10},
        {"shards:1", 9, 3, 256, 4},
    };
    for (size_t t = 0; t < sizeof(cases) / sizeof(cases[0]); t++) {
        const valid_case *c = &cases[t];
        uint8_t *y = balanced_labels(c->n, c->k_count, 5);
        CU_ASSERT_PTR_NOT_NULL_FATAL(y);
        strata_partition *p = NULL;
        strata_diag diag;
        int rc = strata_partition_new(y, c->n, c->num_classes, c->spec, c->clients, 11, &p, &diag);
        if (rc != STRATA_OK)
            printf("\n    %s n=%zu clients=%zu: %s\n", c->spec, c->n, c->clients,
                   strata_diag_msg(&diag, rc));
        CU_ASSERT_EQUAL(rc, STRATA_OK);
        if (p != NULL) {
            size_t problems = partition_problems(p, c->n, c->clients);
            if (problems != 0)
                printf("\n    %s n=%zu clients=%zu: %zu problems\n", c->spec, c->n, c->clients,
                       problems);
            CU_ASSERT_EQUAL(problems, 0);
        }
        strata_partition_free(p);
        free(y);
    }
    strata_partition_free(NULL);
}

/* ---- iid ---- */

static void test_iid(void)
{
    static const struct {
        size_t n, clients;
    } cases[] = {{60000, 7}, {60001, 10}, {60000, 10}, {999, 1000 - 1}};
    for (size_t t = 0; t < sizeof(cases) / sizeof(cases[0]); t++) {
        size_t n = cases[t].n, clients = cases[t].clients;
        uint8_t *y = balanced_labels(n, 10, 1);
        CU_ASSERT_PTR_NOT_NULL_FATAL(y);
        strata_partition *p = NULL;
        CU_ASSERT_EQUAL_FATAL(strata_partition_new(y, n, 10, "iid", clients, 3, &p, NULL),
                              STRATA_OK);
        size_t lo = n, hi = 0;
        for (size_t c = 0; c < clients; c++) {
            lo = p->counts[c] < lo ? p->counts[c] : lo;
            hi = p->counts[c] > hi ? p->counts[c] : hi;
        }
        CU_ASSERT(hi - lo <= 1);
        CU_ASSERT_EQUAL(lo, n / clients);
        if (n / clients >= 1000) {
            skew s = measure_skew(p, y, n, 10);
            CU_ASSERT(s.max_frac_dev < 0.03);
            CU_ASSERT(s.mean_top < 0.14);
        }
        strata_partition_free(p);
        free(y);
    }
}

/* ---- Dirichlet ---- */

static void test_dirichlet_skew(void)
{
    const size_t n = 60000, clients = 10;
    uint8_t *y = balanced_labels(n, 10, 2);
    CU_ASSERT_PTR_NOT_NULL_FATAL(y);
    double top_sum = 0.0;
    printf("\n");
    for (uint64_t seed = 1; seed <= 5; seed++) {
        strata_partition *lo = NULL, *mid = NULL, *hi = NULL;
        CU_ASSERT_EQUAL_FATAL(
            strata_partition_new(y, n, 10, "dirichlet:0.05", clients, seed, &lo, NULL), STRATA_OK);
        CU_ASSERT_EQUAL_FATAL(
            strata_partition_new(y, n, 10, "dirichlet:0.5", clients, seed, &mid, NULL), STRATA_OK);
        CU_ASSERT_EQUAL_FATAL(
            strata_partition_new(y, n, 10, "dirichlet:1000", clients, seed, &hi, NULL), STRATA_OK);
        skew a = measure_skew(lo, y, n, 10), b = measure_skew(mid, y, n, 10);
        skew c = measure_skew(hi, y, n, 10);
        printf("    seed %llu: mean top-class fraction alpha=0.05 %.3f, alpha=0.5 %.3f, "
               "alpha=1000 %.3f (max class-fraction dev %.4f, max size dev %.4f)\n",
               (unsigned long long)seed, a.mean_top, b.mean_top, c.mean_top, c.max_frac_dev,
               c.max_size_dev);
        top_sum += a.mean_top;
        CU_ASSERT(a.mean_top > 0.5);
        CU_ASSERT(a.mean_top > b.mean_top);
        CU_ASSERT(b.mean_top > c.mean_top);
        /* alpha = 1000: every client holds about 10% of each class and about
         * n / clients samples (binomial-like spread ~0.3% and ~1%). */
        CU_ASSERT(c.max_frac_dev < 0.02);
        CU_ASSERT(c.max_size_dev < 0.05);
        strata_partition_free(lo);
        strata_partition_free(mid);
        strata_partition_free(hi);
    }
    /* Over 200 seeds the alpha = 0.05 mean is about 0.70. */
    printf("    alpha=0.05 mean over seeds %.3f\n", top_sum / 5.0);
    CU_ASSERT(top_sum / 5.0 > 0.6);
    free(y);
}

/* Tiny alpha with as many clients as samples leaves most clients empty
 * before the repair step: afterwards every client holds exactly one. */
static void test_dirichlet_repair(void)
{
    const size_t n = 300;
    uint8_t *y = balanced_labels(n, 3, 4);
    CU_ASSERT_PTR_NOT_NULL_FATAL(y);
    strata_partition *p = NULL;
    CU_ASSERT_EQUAL_FATAL(strata_partition_new(y, n, 3, "dirichlet:0.01", n, 8, &p, NULL),
                          STRATA_OK);
    CU_ASSERT_EQUAL(partition_problems(p, n, n), 0);
    for (size_t c = 0; c < n; c++)
        CU_ASSERT_EQUAL(p->counts[c], 1);
    strata_partition_free(p);
    /* Fewer clients: at least one sample each, and the split stays skewed. */
    CU_ASSERT_EQUAL_FATAL(strata_partition_new(y, n, 3, "dirichlet:0.01", 40, 8, &p, NULL),
                          STRATA_OK);
    CU_ASSERT_EQUAL(partition_problems(p, n, 40), 0);
    strata_partition_free(p);
    free(y);
}

/* ---- shards ---- */

static const uint8_t *sort_labels; /* qsort has no context argument */

static int by_label_then_index(const void *a, const void *b)
{
    size_t i = *(const size_t *)a, j = *(const size_t *)b;
    if (sort_labels[i] != sort_labels[j])
        return sort_labels[i] < sort_labels[j] ? -1 : 1;
    return i < j ? -1 : (i > j ? 1 : 0);
}

/* Recomputes the label-sorted order and the shard boundaries independently
 * and checks that every shard belongs to one client and that every client
 * owns exactly per_client whole shards. */
static void check_shards(size_t n, int k_count, size_t clients, size_t per_client, uint64_t seed)
{
    char spec[32];
    snprintf(spec, sizeof(spec), "shards:%zu", per_client);
    uint8_t *y = balanced_labels(n, k_count, seed);
    size_t *sorted = malloc(n * sizeof(*sorted));
    size_t *shards_of = calloc(clients, sizeof(*shards_of));
    CU_ASSERT_FATAL(y != NULL && sorted != NULL && shards_of != NULL);
    strata_partition *p = NULL;
    strata_diag diag;
    CU_ASSERT_EQUAL_FATAL(strata_partition_new(y, n, k_count, spec, clients, seed, &p, &diag),
                          STRATA_OK);
    CU_ASSERT_EQUAL(partition_problems(p, n, clients), 0);
    size_t *owner = owners(p, n);
    CU_ASSERT_PTR_NOT_NULL_FATAL(owner);

    for (size_t i = 0; i < n; i++)
        sorted[i] = i;
    sort_labels = y;
    qsort(sorted, n, sizeof(*sorted), by_label_then_index);
    size_t total = clients * per_client, q = n / total, rem = n % total;
    size_t split_shards = 0, pos = 0;
    for (size_t j = 0; j < total; j++) {
        size_t size = q + (j < rem ? 1 : 0);
        size_t c = owner[sorted[pos]];
        for (size_t t = 0; t < size; t++)
            if (owner[sorted[pos + t]] != c)
                split_shards++;
        shards_of[c]++;
        pos += size;
    }
    CU_ASSERT_EQUAL(pos, n);
    CU_ASSERT_EQUAL(split_shards, 0);
    size_t wrong_count = 0, wrong_size = 0, too_many_labels = 0;
    for (size_t c = 0; c < clients; c++) {
        if (shards_of[c] != per_client)
            wrong_count++;
        if (p->counts[c] < per_client * q || p->counts[c] > per_client * (q + 1))
            wrong_size++;
        if (rem == 0 && p->counts[c] != per_client * q)
            wrong_size++;
        /* When shards never straddle a class boundary, a client sees at
         * most per_client labels. */
        if (rem == 0 && (n / (size_t)k_count) % q == 0 && n % (size_t)k_count == 0) {
            int present[256] = {0}, distinct = 0;
            for (size_t i = 0; i < p->counts[c]; i++)
                if (!present[y[p->indices[c][i]]]++)
                    distinct++;
            if ((size_t)distinct > per_client)
                too_many_labels++;
        }
    }
    CU_ASSERT_EQUAL(wrong_count, 0);
    CU_ASSERT_EQUAL(wrong_size, 0);
    CU_ASSERT_EQUAL(too_many_labels, 0);
    free(owner);
    strata_partition_free(p);
    free(shards_of);
    free(sorted);
    free(y);
}

static void test_shards(void)
{
    check_shards(60000, 10, 100, 2, 1); /* the FedAvg setting: 200 shards of 300 */
    check_shards(60000, 10, 10, 1, 2);  /* one class per client */
    check_shards(1003, 10, 10, 3, 3);   /* 30 shards, the first 13 one sample larger */
    check_shards(50, 3, 10, 5, 4);      /* shards of one sample */
}

/* ---- reproducibility ---- */

static void test_reproducible(void)
{
    static const char *const specs[] = {"iid", "dirichlet:0.3", "shards:2"};
    const size_t n = 6000, clients = 20;
    uint8_t *y = balanced_labels(n, 10, 6);
    CU_ASSERT_PTR_NOT_NULL_FATAL(y);
    for (size_t t = 0; t < sizeof(specs) / sizeof(specs[0]); t++) {
        strata_partition *a = NULL, *b = NULL, *c = NULL;
        CU_ASSERT_EQUAL_FATAL(strata_partition_new(y, n, 10, specs[t], clients, 42, &a, NULL),
                              STRATA_OK);
        CU_ASSERT_EQUAL_FATAL(strata_partition_new(y, n, 10, specs[t], clients, 42, &b, NULL),
                              STRATA_OK);
        CU_ASSERT_EQUAL_FATAL(strata_partition_new(y, n, 10, specs[t], clients, 43, &c, NULL),
                              STRATA_OK);
        CU_ASSERT(same_partition(a, b));
        CU_ASSERT(!same_partition(a, c));
        strata_partition_free(a);
        strata_partition_free(b);
        strata_partition_free(c);
    }
    free(y);
}

/* ---- rejected arguments ---- */

typedef struct bad_case {
    const char *spec;
    size_t n, clients;
    int num_classes;
    int label_max; /* labels are 0..label_max */
    const char *msg_part;
} bad_case;

static void test_bad_args(void)
{
    const bad_case cases[] = {
        {"", 100, 10, 10, 9, "unknown partition scheme"},
        {"foo", 100, 10, 10, 9, "unknown partition scheme \"foo\""},
        {"IID", 100, 10, 10, 9, "unknown"},
        {"iid:2", 100, 10, 10, 9, "unknown"},
        {"dirichlet", 100, 10, 10, 9, "needs a concentration"},
        {"dirichlet:", 100, 10, 10, 9, "needs a concentration"},
        {"dirichlet:0", 100, 10, 10, 9, "bad Dirichlet concentration \"0\""},
        {"dirichlet:-1", 100, 10, 10, 9, "bad Dirichlet"},
        {"dirichlet:abc", 100, 10, 10, 9, "bad Dirichlet"},
        {"dirichlet:0.5x", 100, 10, 10, 9, "bad Dirichlet"},
        {"dirichlet:nan", 100, 10, 10, 9, "bad Dirichlet"},
        {"dirichlet:inf", 100, 10, 10, 9, "bad Dirichlet"},
        {"dirichlet:1e-400", 100, 10, 10, 9, "bad Dirichlet"},
        {"shards", 100, 10, 10, 9, "needs a shard count"},
        {"shards:", 100, 10, 10, 9, "needs a shard count"},
        {"shards:0", 100, 10, 10, 9, "at least 1"},
        {"shards:-2", 100, 10, 10, 9, "bad shard count"},
        {"shards:1.5", 100, 10, 10, 9, "bad shard count"},
        {"shards: 2", 100, 10, 10, 9, "bad shard count"},
        {"shards:99999999999999999999999", 100, 10, 10, 9, "too large"},
        {"shards:2", 100, 60, 10, 9, "more shards"},
        {"shards:11", 100, 10, 10, 9, "more shards"},
        {"iid", 100, 0, 10, 9, "at least one client"},
        {"iid", 100, 101, 10, 9, "more clients (101) than samples (100)"},
        {"dirichlet:1", 5, 6, 10, 9, "more clients"},
        {"iid", 0, 1, 10, 9, "empty"},
        {"iid", 100, 10, 0, 0, "num_classes"},
        {"iid", 100, 10, 257, 9, "num_classes"},
        {"dirichlet:1", 100, 10, 5, 9, "label"},
    };
    uint8_t y[100];
    for (size_t t = 0; t < sizeof(cases) / sizeof(cases[0]); t++) {
        const bad_case *c = &cases[t];
        for (size_t i = 0; i < sizeof(y); i++)
            y[i] = (uint8_t)(i % (size_t)(c->label_max + 1));
        strata_partition *p = (strata_partition *)&y; /* must be reset to NULL */
        strata_diag diag;
        int rc = strata_partition_new(y, c->n, c->num_classes, c->spec, c->clients, 1, &p, &diag);
        if (rc != STRATA_EINVAL || strstr(diag.msg, c->msg_part) == NULL)
            printf("\n    spec \"%s\": rc %d, message \"%s\"\n", c->spec, rc, diag.msg);
        CU_ASSERT_EQUAL(rc, STRATA_EINVAL);
        CU_ASSERT_PTR_NULL(p);
        CU_ASSERT_PTR_NOT_NULL(strstr(diag.msg, c->msg_part));
        strata_partition_free(rc == STRATA_OK ? p : NULL);
    }
    strata_partition *p = NULL;
    CU_ASSERT_EQUAL(strata_partition_new(NULL, 10, 10, "iid", 2, 1, &p, NULL), STRATA_EINVAL);
    CU_ASSERT_EQUAL(strata_partition_new(y, 10, 10, NULL, 2, 1, &p, NULL), STRATA_EINVAL);
    CU_ASSERT_EQUAL(strata_partition_new(y, 10, 10, "iid", 2, 1, NULL, NULL), STRATA_EINVAL);
    CU_ASSERT_PTR_NULL(p);
}

/* ---- histogram and table ---- */

static void test_histogram_print(void)
{
    const size_t n = 1000, clients = 8;
    uint8_t *y = balanced_labels(n, 4, 7);
    CU_ASSERT_PTR_NOT_NULL_FATAL(y);
    strata_partition *p = NULL;
    CU_ASSERT_EQUAL_FATAL(strata_partition_new(y, n, 4, "dirichlet:0.2", clients, 9, &p, NULL),
                          STRATA_OK);
    size_t h[8 * 4];
    memset(h, 0xff, sizeof(h)); /* must be overwritten */
    strata_partition_histogram(p, y, 4, h);
    size_t class_total[4] = {0};
    for (size_t c = 0; c < clients; c++) {
        size_t row = 0;
        for (int k = 0; k < 4; k++) {
            row += h[c * 4 + (size_t)k];
            class_total[k] += h[c * 4 + (size_t)k];
        }
        CU_ASSERT_EQUAL(row, p->counts[c]);
    }
    for (int k = 0; k < 4; k++)
        CU_ASSERT_EQUAL(class_total[k], 250);

    FILE *f = tmpfile();
    CU_ASSERT_PTR_NOT_NULL_FATAL(f);
    strata_partition_print(p, y, 4, f);
    rewind(f);
    char line[512];
    size_t lines = 0;
    int has_header = 0, has_summary = 0;
    while (fgets(line, sizeof(line), f) != NULL) {
        lines++;
        if (strstr(line, "client") && strstr(line, "samples"))
            has_header = 1;
        if (strstr(line, "8 clients, 1000 samples; mean top-class fraction"))
            has_summary = 1;
        if (lines <= 3)
            printf("%s%s", lines == 1 ? "\n" : "", line);
    }
    fclose(f);
    CU_ASSERT_EQUAL(lines, clients + 2);
    CU_ASSERT(has_header);
    CU_ASSERT(has_summary);
    strata_partition_free(p);
    free(y);
}

int main(void)
{
    CU_TestInfo tests[] = {
        {"valid for every scheme", test_valid_partitions},
        {"iid sizes and balance", test_iid},
        {"dirichlet skew vs alpha", test_dirichlet_skew},
        {"dirichlet repairs empty clients", test_dirichlet_repair},
        {"shards membership", test_shards},
        {"reproducible by seed", test_reproducible},
        {"bad arguments rejected", test_bad_args},
        {"histogram and table", test_histogram_print},
        CU_TEST_INFO_NULL,
    };
    CU_SuiteInfo suites[] = {
        {"partition", NULL, NULL, NULL, NULL, tests},
        CU_SUITE_INFO_NULL,
    };
    return strata_test_run(suites);
}
