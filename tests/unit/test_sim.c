/* strata-sim's modules that stand alone: the per-client shards (shard.c)
 * against the partitioner on Fashion-MNIST, and the SVG plots (plot.c). */
#include "sim.h"
#include "test_util.h"

#include "strata/data.h"
#include "strata/fileio.h"
#include "strata/partition.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static int exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

/* Each shard holds exactly its client's samples of the partition, in the
 * same order, pixel for pixel. */
static void test_shards_match_partition(void)
{
    static const struct {
        const char *spec;
        long clients, seed;
    } CASES[] = {{"dirichlet:0.5", 7, 3}, {"iid", 3, 1}, {"shards:2", 5, 2}};
    strata_dataset all;
    strata_dataset_init(&all);
    CU_ASSERT_EQUAL_FATAL(strata_data_load_dir(strata_test_data_dir(), "train", 0, &all, NULL), 0);
    for (size_t c = 0; c < sizeof(CASES) / sizeof(CASES[0]); c++) {
        char *tmp = strata_test_tmpdir(), base[512];
        CU_ASSERT_PTR_NOT_NULL_FATAL(tmp);
        snprintf(base, sizeof(base), "%s/shards", tmp);
        strata_diag d = {{0}};
        CU_ASSERT_EQUAL(sim_shards_write(strata_test_data_dir(), CASES[c].spec, CASES[c].clients,
                                         CASES[c].seed, base, &d),
                        0);
        strata_partition *p = NULL;
        CU_ASSERT_EQUAL_FATAL(strata_partition_new(all.y, all.n, all.num_classes, CASES[c].spec,
                                                   (size_t)CASES[c].clients,
                                                   (uint64_t)CASES[c].seed, &p, NULL),
                              0);
        size_t total = 0;
        for (long i = 0; i < CASES[c].clients; i++) {
            char dir[600];
            snprintf(dir, sizeof(dir), "%s/%ld", base, i);
            strata_dataset s;
            strata_dataset_init(&s);
            CU_ASSERT_EQUAL_FATAL(strata_data_load_dir(dir, "train", 0, &s, NULL), 0);
            CU_ASSERT_EQUAL(s.n, p->counts[i]);
            CU_ASSERT_EQUAL(s.dim, all.dim);
            int same = s.n == p->counts[i];
            for (size_t k = 0; same && k < s.n; k++) {
                size_t j = p->indices[i][k];
                same = s.y[k] == all.y[j] &&
                       memcmp(s.x + k * s.dim, all.x + j * all.dim, s.dim * sizeof(float)) == 0;
            }
            CU_ASSERT(same);
            total += s.n;
            strata_dataset_cleanup(&s);
        }
        CU_ASSERT_EQUAL(total, all.n);
        strata_partition_free(p);
        strata_test_rmtree(tmp);
        free(tmp);
    }
    strata_dataset_cleanup(&all);
}

/* Bad inputs fail with a message and write nothing. */
static void test_shards_errors(void)
{
    char *tmp = strata_test_tmpdir(), base[512], nodata[512];
    CU_ASSERT_PTR_NOT_NULL_FATAL(tmp);
    snprintf(base, sizeof(base), "%s/shards", tmp);
    snprintf(nodata, sizeof(nodata), "%s/none", tmp);
    strata_diag d = {{0}};
    CU_ASSERT_EQUAL(sim_shards_write(nodata, "iid", 2, 1, base, &d), STRATA_EIO);
    CU_ASSERT(strlen(d.msg) > 0);
    CU_ASSERT_EQUAL(sim_shards_write(strata_test_data_dir(), "dirichlet:-1", 2, 1, base, &d),
                    STRATA_EINVAL);
    CU_ASSERT_PTR_NOT_NULL(strstr(d.msg, "irichlet"));
    CU_ASSERT_EQUAL(sim_shards_write(strata_test_data_dir(), "iid", 70000, 1, base, &d),
                    STRATA_EINVAL);
    CU_ASSERT_FALSE(exists(base));
    strata_test_rmtree(tmp);
    free(tmp);
}

/* Reads a small file into a NUL-terminated string (NULL when absent). */
static char *slurp(const char *path)
{
    uint8_t *data = NULL;
    size_t len = 0;
    if (strata_file_read_all(path, 1 << 22, &data, &len, NULL) < 0)
        return NULL;
    char *s = realloc(data, len + 1);
    if (s == NULL) {
        free(data);
        return NULL;
    }
    s[len] = '\0';
    return s;
}

static void test_plot_lines(void)
{
    char *tmp = strata_test_tmpdir(), path[512];
    CU_ASSERT_PTR_NOT_NULL_FATAL(tmp);
    snprintf(path, sizeof(path), "%s/p.svg", tmp);
    const double x[] = {1e3, 1e4, 2e5}, y[] = {0.5, 0.6, 0.7}, lo[] = {0.45, 0.55, 0.68},
                 hi[] = {0.55, 0.65, 0.72}, zero[] = {0, -1, 0};
    sim_plot_line lines[2] = {{"a<b", x, y, lo, hi, 3}, {"uniform", x, y, y, y, 3}};
    CU_ASSERT_EQUAL(sim_plot_lines(path, "t & t", "bytes", "accuracy", lines, 2), 0);
    char *svg = slurp(path);
    CU_ASSERT_PTR_NOT_NULL_FATAL(svg);
    CU_ASSERT_PTR_NOT_NULL(strstr(svg, "<svg"));
    CU_ASSERT_PTR_NOT_NULL(strstr(svg, "</svg>"));
    CU_ASSERT_PTR_NOT_NULL(strstr(svg, "a&lt;b"));
    CU_ASSERT_PTR_NOT_NULL(strstr(svg, "t &amp; t"));
    CU_ASSERT_PTR_NULL(strstr(svg, "a<b"));
    CU_ASSERT_PTR_NOT_NULL(strstr(svg, ">1e3<"));
    CU_ASSERT_PTR_NOT_NULL(strstr(svg, ">1e6<"));
    size_t polylines = 0;
    for (const char *p = svg; (p = strstr(p, "<polyline")) != NULL; p++)
        polylines++;
    CU_ASSERT_EQUAL(polylines, 2);
    free(svg);
    /* No point with x > 0: nothing to draw, no file. */
    snprintf(path, sizeof(path), "%s/empty.svg", tmp);
    sim_plot_line bad = {"z", zero, y, lo, hi, 3};
    CU_ASSERT_EQUAL(sim_plot_lines(path, "t", "x", "y", &bad, 1), STRATA_EINVAL);
    CU_ASSERT_FALSE(exists(path));
    /* Points whose accuracy is not known (NaN) are left out of the line and
     * its band; a plot with no known point is refused. */
    const double yn[] = {NAN, 0.6, 0.7};
    sim_plot_line gap = {"gap", x, yn, lo, hi, 3};
    snprintf(path, sizeof(path), "%s/gap.svg", tmp);
    CU_ASSERT_EQUAL(sim_plot_lines(path, "t", "x", "y", &gap, 1), 0);
    svg = slurp(path);
    CU_ASSERT_PTR_NOT_NULL_FATAL(svg);
    CU_ASSERT_PTR_NULL(strstr(svg, "nan"));
    const char *pl = strstr(svg, "<polyline");
    CU_ASSERT_PTR_NOT_NULL_FATAL(pl);
    pl = strstr(pl, "points=\"");
    CU_ASSERT_PTR_NOT_NULL_FATAL(pl);
    size_t points = 0;
    for (const char *p = pl + 8; *p != '"'; p++)
        points += *p == ',';
    CU_ASSERT_EQUAL(points, 2);
    free(svg);
    const double none[] = {NAN, NAN, NAN};
    sim_plot_line unknown = {"none", x, none, none, none, 3};
    snprintf(path, sizeof(path), "%s/none.svg", tmp);
    CU_ASSERT_EQUAL(sim_plot_lines(path, "t", "x", "y", &unknown, 1), STRATA_EINVAL);
    CU_ASSERT_FALSE(exists(path));
    strata_test_rmtree(tmp);
    free(tmp);
}

static void test_plot_heatmap(void)
{
    char *tmp = strata_test_tmpdir(), path[512];
    CU_ASSERT_PTR_NOT_NULL_FATAL(tmp);
    snprintf(path, sizeof(path), "%s/h.svg", tmp);
    const char *rows[] = {"fc1.weight", "fc1.bias"};
    const double v[] = {0.001, 0.002, 0.004, 1, 1, 0};
    CU_ASSERT_EQUAL(sim_plot_heatmap(path, "densities", rows, 2, 3, v), 0);
    char *svg = slurp(path);
    CU_ASSERT_PTR_NOT_NULL_FATAL(svg);
    CU_ASSERT_PTR_NOT_NULL(strstr(svg, "fc1.bias"));
    CU_ASSERT_PTR_NOT_NULL(strstr(svg, "#ffffff")); /* the 0 cell */
    size_t cells = 0;
    for (const char *p = svg; (p = strstr(p, "<title>round")) != NULL; p++)
        cells++;
    CU_ASSERT_EQUAL(cells, 6);
    free(svg);
    const double zeros[] = {0, 0};
    snprintf(path, sizeof(path), "%s/z.svg", tmp);
    CU_ASSERT_EQUAL(sim_plot_heatmap(path, "z", rows, 1, 2, zeros), STRATA_EINVAL);
    CU_ASSERT_FALSE(exists(path));
    strata_test_rmtree(tmp);
    free(tmp);
}

int main(void)
{
    CU_TestInfo shard_tests[] = {
        {"shards match the partition", test_shards_match_partition},
        {"errors", test_shards_errors},
        CU_TEST_INFO_NULL,
    };
    CU_TestInfo plot_tests[] = {
        {"lines", test_plot_lines},
        {"heat map", test_plot_heatmap},
        CU_TEST_INFO_NULL,
    };
    CU_SuiteInfo suites[] = {
        {"shard", NULL, NULL, NULL, NULL, shard_tests},
        {"plot", NULL, NULL, NULL, NULL, plot_tests},
        CU_SUITE_INFO_NULL,
    };
    return strata_test_run(suites);
}
