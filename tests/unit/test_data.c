#include "strata/data.h"
#include "strata/error.h"
#include "test_util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

/* ---- helpers ---- */

static void put_be32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}

/* Writes len bytes to path, gzip-compressed when gz is set. Returns 0 on
 * success. */
static int write_file(const char *path, const void *data, size_t len, int gz)
{
    if (gz) {
        gzFile f = gzopen(path, "wb");
        if (f == NULL)
            return -1;
        int ok = len == 0 || gzwrite(f, data, (unsigned)len) == (int)len;
        return (gzclose(f) == Z_OK && ok) ? 0 : -1;
    }
    FILE *f = fopen(path, "wb");
    if (f == NULL)
        return -1;
    int ok = fwrite(data, 1, len, f) == len;
    return (fclose(f) == 0 && ok) ? 0 : -1;
}

static char *join(const char *dir, const char *name)
{
    size_t len = strlen(dir) + strlen(name) + 2;
    char *p = malloc(len);
    if (p != NULL)
        snprintf(p, len, "%s/%s", dir, name);
    return p;
}

static uint8_t synth_pixel(size_t i, size_t j)
{
    return (uint8_t)((i * 31 + j * 7) & 0xff);
}

/* Description of a synthetic IDX image/label pair; header fields and data
 * lengths are given separately so that malformed files can be described. */
typedef struct idx_spec {
    uint32_t img_magic, img_n, rows, cols;
    size_t img_bytes; /* bytes of pixel data actually written */
    uint32_t lab_magic, lab_n;
    size_t lab_bytes;
    size_t img_header_bytes; /* 16 normally; less writes a cut header */
} idx_spec;

static idx_spec good_spec(uint32_t n, uint32_t rows, uint32_t cols)
{
    idx_spec s = {0x803, n, rows, cols, (size_t)n * rows * cols, 0x801, n, n, 16};
    return s;
}

/* Writes images and labels files described by s. Pixel j of image i is
 * synth_pixel(i, j); label i is label_base + i % 4. */
static int write_idx(const char *images, const char *labels, const idx_spec *s, int gz,
                     int label_base)
{
    size_t ilen = 16 + s->img_bytes, llen = 8 + s->lab_bytes;
    uint8_t *ib = calloc(1, ilen), *lb = calloc(1, llen);
    int rc = -1;
    if (ib == NULL || lb == NULL)
        goto out;
    put_be32(ib, s->img_magic);
    put_be32(ib + 4, s->img_n);
    put_be32(ib + 8, s->rows);
    put_be32(ib + 12, s->cols);
    size_t dim = (size_t)s->rows * s->cols;
    if (dim == 0)
        dim = 1;
    for (size_t b = 0; b < s->img_bytes; b++)
        ib[16 + b] = synth_pixel(b / dim, b % dim);
    put_be32(lb, s->lab_magic);
    put_be32(lb + 4, s->lab_n);
    for (size_t b = 0; b < s->lab_bytes; b++)
        lb[8 + b] = (uint8_t)(label_base + b % 4);
    if (s->img_header_bytes < 16)
        ilen = s->img_header_bytes;
    if (write_file(images, ib, ilen, gz) == 0 && write_file(labels, lb, llen, gz) == 0)
        rc = 0;
out:
    free(ib);
    free(lb);
    return rc;
}

static void assert_empty(const strata_dataset *d)
{
    CU_ASSERT_EQUAL(d->n, 0);
    CU_ASSERT_PTR_NULL(d->x);
    CU_ASSERT_PTR_NULL(d->y);
}

/* ---- Fashion-MNIST ---- */

static strata_dataset fm_train;

static int fm_init(void)
{
    strata_diag diag;
    strata_dataset_init(&fm_train);
    int rc = strata_data_load_dir(strata_test_data_dir(), "train", 0, &fm_train, &diag);
    if (rc != STRATA_OK)
        fprintf(stderr, "loading Fashion-MNIST: %s\n", strata_diag_msg(&diag, rc));
    return rc == STRATA_OK ? 0 : 1;
}

static int fm_cleanup(void)
{
    strata_dataset_cleanup(&fm_train);
    return 0;
}

static void check_classes(const strata_dataset *d, size_t per_class)
{
    size_t counts[256] = {0};
    for (size_t i = 0; i < d->n; i++)
        counts[d->y[i]]++;
    for (int k = 0; k < 10; k++)
        CU_ASSERT_EQUAL(counts[k], per_class);
}

static void check_range(const strata_dataset *d)
{
    size_t bad = 0;
    float lo = 1.0f, hi = 0.0f;
    for (size_t i = 0; i < d->n * d->dim; i++) {
        float v = d->x[i];
        if (!(v >= 0.0f && v <= 1.0f))
            bad++;
        if (v < lo)
            lo = v;
        if (v > hi)
            hi = v;
    }
    CU_ASSERT_EQUAL(bad, 0);
    CU_ASSERT_EQUAL(lo, 0.0f);
    CU_ASSERT_EQUAL(hi, 1.0f);
}

static void test_fm_train_shape(void)
{
    const strata_dataset *d = &fm_train;
    CU_ASSERT_EQUAL(d->n, 60000);
    CU_ASSERT_EQUAL(d->channels, 1);
    CU_ASSERT_EQUAL(d->height, 28);
    CU_ASSERT_EQUAL(d->width, 28);
    CU_ASSERT_EQUAL(d->dim, 784);
    CU_ASSERT_EQUAL(d->num_classes, 10);
    check_classes(d, 6000);
    check_range(d);
}

/* Reads the first label and the first image independently of the loader. */
static void test_fm_train_first_sample(void)
{
    char *lpath = join(strata_test_data_dir(), "train-labels-idx1-ubyte.gz");
    char *ipath = join(strata_test_data_dir(), "train-images-idx3-ubyte.gz");
    CU_ASSERT_PTR_NOT_NULL_FATAL(lpath);
    CU_ASSERT_PTR_NOT_NULL_FATAL(ipath);
    uint8_t lb[9], ib[16 + 784];
    gzFile f = gzopen(lpath, "rb");
    CU_ASSERT_PTR_NOT_NULL_FATAL(f);
    CU_ASSERT_EQUAL(gzread(f, lb, sizeof(lb)), (int)sizeof(lb));
    gzclose(f);
    f = gzopen(ipath, "rb");
    CU_ASSERT_PTR_NOT_NULL_FATAL(f);
    CU_ASSERT_EQUAL(gzread(f, ib, sizeof(ib)), (int)sizeof(ib));
    gzclose(f);
    CU_ASSERT_EQUAL(lb[3], 0x01);
    CU_ASSERT_EQUAL(fm_train.y[0], lb[8]);
    CU_ASSERT_EQUAL(fm_train.y[0], 9); /* Fashion-MNIST's first sample is an ankle boot */
    size_t mismatched = 0;
    for (size_t j = 0; j < 784; j++)
        if (fm_train.x[j] != (float)ib[16 + j] / 255.0f)
            mismatched++;
    CU_ASSERT_EQUAL(mismatched, 0);
    free(lpath);
    free(ipath);
}

static void test_fm_stats(void)
{
    double mean = -1, std = -1;
    CU_ASSERT_EQUAL(strata_dataset_stats(&fm_train, &mean, &std), STRATA_OK);
    printf("\n    Fashion-MNIST train: mean %.4f std %.4f\n", mean, std);
    CU_ASSERT(fabs(mean - 0.2860) < 1e-3);
    CU_ASSERT(fabs(std - 0.3530) < 1e-3);
}

static void test_fm_test_split(void)
{
    strata_dataset d;
    strata_diag diag;
    int rc = strata_data_load_dir(strata_test_data_dir(), "test", 0, &d, &diag);
    CU_ASSERT_EQUAL_FATAL(rc, STRATA_OK);
    CU_ASSERT_EQUAL(d.n, 10000);
    CU_ASSERT_EQUAL(d.dim, 784);
    CU_ASSERT_EQUAL(d.num_classes, 10);
    check_classes(&d, 1000);
    check_range(&d);
    strata_dataset_cleanup(&d);
}

static void test_fm_limit(void)
{
    static const size_t limits[] = {1, 100, 1234};
    for (size_t t = 0; t < sizeof(limits) / sizeof(limits[0]); t++) {
        strata_dataset d;
        strata_diag diag;
        int rc = strata_data_load_dir(strata_test_data_dir(), "train", limits[t], &d, &diag);
        CU_ASSERT_EQUAL_FATAL(rc, STRATA_OK);
        CU_ASSERT_EQUAL(d.n, limits[t]);
        CU_ASSERT_EQUAL(d.dim, 784);
        CU_ASSERT_EQUAL(memcmp(d.y, fm_train.y, d.n), 0);
        CU_ASSERT_EQUAL(memcmp(d.x, fm_train.x, d.n * d.dim * sizeof(float)), 0);
        strata_dataset_cleanup(&d);
    }
}

/* ---- synthetic IDX round trips ---- */

static void check_synthetic(const strata_dataset *d, size_t n, int rows, int cols, int label_base)
{
    CU_ASSERT_EQUAL_FATAL(d->n, n);
    CU_ASSERT_EQUAL(d->channels, 1);
    CU_ASSERT_EQUAL(d->height, rows);
    CU_ASSERT_EQUAL(d->width, cols);
    size_t dim = (size_t)rows * (size_t)cols;
    CU_ASSERT_EQUAL_FATAL(d->dim, dim);
    size_t bad = 0;
    int max_label = 0;
    for (size_t i = 0; i < n; i++) {
        if (d->y[i] != (uint8_t)(label_base + i % 4))
            bad++;
        if (d->y[i] > max_label)
            max_label = d->y[i];
        for (size_t j = 0; j < dim; j++)
            if (d->x[i * dim + j] != (float)synth_pixel(i, j) / 255.0f)
                bad++;
    }
    CU_ASSERT_EQUAL(bad, 0);
    CU_ASSERT_EQUAL(d->num_classes, max_label + 1);
}

static void test_idx_round_trip(void)
{
    char *dir = strata_test_tmpdir();
    CU_ASSERT_PTR_NOT_NULL_FATAL(dir);
    char *img = join(dir, "img"), *lab = join(dir, "lab");
    idx_spec s = good_spec(7, 3, 5);
    static const struct {
        size_t limit, expect_n;
    } limits[] = {{0, 7}, {3, 3}, {7, 7}, {100, 7}};
    for (int gz = 0; gz <= 1; gz++) {
        CU_ASSERT_EQUAL_FATAL(write_idx(img, lab, &s, gz, 0), 0);
        for (size_t t = 0; t < sizeof(limits) / sizeof(limits[0]); t++) {
            strata_dataset d;
            strata_diag diag;
            int rc = strata_data_load_idx(img, lab, limits[t].limit, &d, &diag);
            CU_ASSERT_EQUAL_FATAL(rc, STRATA_OK);
            check_synthetic(&d, limits[t].expect_n, 3, 5, 0);
            strata_dataset_cleanup(&d);
            assert_empty(&d);
        }
    }
    strata_dataset_cleanup(NULL);
    free(img);
    free(lab);
    strata_test_rmtree(dir);
    free(dir);
}

/* Raw files win over .gz ones; t10k maps to "test"; a missing split or an
 * unknown split name are reported. */
static void test_load_dir_names(void)
{
    char *dir = strata_test_tmpdir();
    CU_ASSERT_PTR_NOT_NULL_FATAL(dir);
    idx_spec s = good_spec(5, 2, 2);
    char *ti = join(dir, "train-images-idx3-ubyte"), *tl = join(dir, "train-labels-idx1-ubyte");
    char *tig = join(dir, "train-images-idx3-ubyte.gz");
    char *tlg = join(dir, "train-labels-idx1-ubyte.gz");
    char *ei = join(dir, "t10k-images-idx3-ubyte.gz"), *el = join(dir, "t10k-labels-idx1-ubyte.gz");
    CU_ASSERT_EQUAL_FATAL(write_idx(ti, tl, &s, 0, 1), 0);
    CU_ASSERT_EQUAL_FATAL(write_idx(tig, tlg, &s, 1, 2), 0);
    CU_ASSERT_EQUAL_FATAL(write_idx(ei, el, &s, 1, 3), 0);

    strata_dataset d;
    strata_diag diag;
    CU_ASSERT_EQUAL_FATAL(strata_data_load_dir(dir, "train", 0, &d, &diag), STRATA_OK);
    check_synthetic(&d, 5, 2, 2, 1); /* labels from the raw file */
    strata_dataset_cleanup(&d);
    CU_ASSERT_EQUAL_FATAL(strata_data_load_dir(dir, "test", 0, &d, &diag), STRATA_OK);
    check_synthetic(&d, 5, 2, 2, 3);
    strata_dataset_cleanup(&d);

    /* Without the raw images the .gz pair is used. */
    CU_ASSERT_EQUAL(remove(ti), 0);
    CU_ASSERT_EQUAL(remove(tl), 0);
    CU_ASSERT_EQUAL_FATAL(strata_data_load_dir(dir, "train", 0, &d, &diag), STRATA_OK);
    check_synthetic(&d, 5, 2, 2, 2);
    strata_dataset_cleanup(&d);

    CU_ASSERT_EQUAL(strata_data_load_dir(dir, "valid", 0, &d, &diag), STRATA_EINVAL);
    CU_ASSERT_PTR_NOT_NULL(strstr(diag.msg, "valid"));
    assert_empty(&d);

    /* Images without labels. */
    CU_ASSERT_EQUAL(remove(el), 0);
    CU_ASSERT_EQUAL(strata_data_load_dir(dir, "test", 0, &d, &diag), STRATA_EIO);
    CU_ASSERT_PTR_NOT_NULL(strstr(diag.msg, "t10k-labels-idx1-ubyte"));
    CU_ASSERT_EQUAL(remove(ei), 0);
    CU_ASSERT_EQUAL(strata_data_load_dir(dir, "test", 0, &d, &diag), STRATA_EIO);
    CU_ASSERT_PTR_NOT_NULL(strstr(diag.msg, dir));
    assert_empty(&d);

    char *missing = join(dir, "nope");
    CU_ASSERT_EQUAL(strata_data_load_dir(missing, "train", 0, &d, &diag), STRATA_EIO);
    CU_ASSERT_PTR_NOT_NULL(strstr(diag.msg, missing));
    free(missing);

    free(ti);
    free(tl);
    free(tig);
    free(tlg);
    free(ei);
    free(el);
    strata_test_rmtree(dir);
    free(dir);
}

static void test_load_dir_emnist(void)
{
    char *dir = strata_test_tmpdir();
    CU_ASSERT_PTR_NOT_NULL_FATAL(dir);
    idx_spec s = good_spec(6, 4, 3);
    char *ai = join(dir, "emnist-digits-train-images-idx3-ubyte.gz");
    char *al = join(dir, "emnist-digits-train-labels-idx1-ubyte.gz");
    char *bi = join(dir, "emnist-letters-train-images-idx3-ubyte");
    char *bl = join(dir, "emnist-letters-train-labels-idx1-ubyte");
    CU_ASSERT_EQUAL_FATAL(write_idx(ai, al, &s, 1, 1), 0);

    strata_dataset d;
    strata_diag diag;
    CU_ASSERT_EQUAL_FATAL(strata_data_load_dir(dir, "train", 0, &d, &diag), STRATA_OK);
    check_synthetic(&d, 6, 4, 3, 1);
    strata_dataset_cleanup(&d);
    CU_ASSERT_EQUAL(strata_data_load_dir(dir, "test", 0, &d, &diag), STRATA_EIO);

    /* Two variants in one directory are ambiguous. */
    CU_ASSERT_EQUAL_FATAL(write_idx(bi, bl, &s, 0, 1), 0);
    CU_ASSERT_EQUAL(strata_data_load_dir(dir, "train", 0, &d, &diag), STRATA_EINVAL);
    CU_ASSERT_PTR_NOT_NULL(strstr(diag.msg, "several"));
    assert_empty(&d);

    free(ai);
    free(al);
    free(bi);
    free(bl);
    strata_test_rmtree(dir);
    free(dir);
}

/* ---- malformed IDX files ---- */

typedef struct bad_idx_case {
    const char *name;
    idx_spec spec;
    size_t limit;
    int expect;
    const char *msg_part; /* substring the diagnostic must contain */
} bad_idx_case;

static void test_idx_malformed(void)
{
    const uint32_t H = 0xffffffffu;
    const bad_idx_case cases[] = {
        {"image magic", {0x801, 4, 2, 2, 16, 0x801, 4, 4, 16}, 0, STRATA_EPROTO, "magic"},
        {"3-d float magic", {0x0d03, 4, 2, 2, 16, 0x801, 4, 4, 16}, 0, STRATA_EPROTO, "magic"},
        {"label magic", {0x803, 4, 2, 2, 16, 0x803, 4, 4, 16}, 0, STRATA_EPROTO, "magic"},
        {"count mismatch", {0x803, 4, 2, 2, 16, 0x801, 3, 3, 16}, 0, STRATA_EPROTO, "labels"},
        {"count mismatch, limited",
         {0x803, 4, 2, 2, 16, 0x801, 5, 5, 16},
         2,
         STRATA_EPROTO,
         "labels"},
        {"truncated pixels", {0x803, 4, 2, 2, 13, 0x801, 4, 4, 16}, 0, STRATA_EPROTO, "truncated"},
        {"no pixels", {0x803, 4, 2, 2, 0, 0x801, 4, 4, 16}, 0, STRATA_EPROTO, "truncated"},
        {"trailing pixels", {0x803, 4, 2, 2, 20, 0x801, 4, 4, 16}, 0, STRATA_EPROTO, "after"},
        {"trailing labels", {0x803, 4, 2, 2, 16, 0x801, 4, 5, 16}, 0, STRATA_EPROTO, "after"},
        {"trailing, limited", {0x803, 4, 2, 2, 20, 0x801, 4, 5, 16}, 3, STRATA_OK, NULL},
        {"truncated labels", {0x803, 4, 2, 2, 16, 0x801, 4, 2, 16}, 0, STRATA_EPROTO, "truncated"},
        {"truncated header", {0x803, 4, 2, 2, 16, 0x801, 4, 4, 10}, 0, STRATA_EPROTO, "header"},
        {"empty file", {0x803, 4, 2, 2, 16, 0x801, 4, 4, 0}, 0, STRATA_EPROTO, "header"},
        {"huge dims", {0x803, 4, H, H, 16, 0x801, 4, 4, 16}, 0, STRATA_EPROTO, "absurd"},
        {"huge rows",
         {0x803, 4, 1u << 20, 1u << 20, 16, 0x801, 4, 4, 16},
         0,
         STRATA_EPROTO,
         "absurd"},
        {"zero rows", {0x803, 4, 0, 2, 16, 0x801, 4, 4, 16}, 0, STRATA_EPROTO, "absurd"},
        {"zero samples", {0x803, 0, 2, 2, 0, 0x801, 0, 0, 16}, 0, STRATA_EPROTO, "no samples"},
        {"huge count", {0x803, H, 28, 28, 16, 0x801, H, 4, 16}, 0, STRATA_ETOOBIG, "limit"},
        {"huge count, limited", {0x803, H, 2, 2, 16, 0x801, H, 4, 16}, 4, STRATA_OK, NULL},
        {"huge count, over data",
         {0x803, H, 2, 2, 16, 0x801, H, 4, 16},
         5,
         STRATA_EPROTO,
         "truncated"},
    };
    char *dir = strata_test_tmpdir();
    CU_ASSERT_PTR_NOT_NULL_FATAL(dir);
    char *img = join(dir, "img"), *lab = join(dir, "lab");
    for (size_t t = 0; t < sizeof(cases) / sizeof(cases[0]); t++) {
        for (int gz = 0; gz <= 1; gz++) {
            const bad_idx_case *c = &cases[t];
            CU_ASSERT_EQUAL_FATAL(write_idx(img, lab, &c->spec, gz, 0), 0);
            strata_dataset d;
            strata_diag diag;
            int rc = strata_data_load_idx(img, lab, c->limit, &d, &diag);
            if (rc != c->expect || (c->msg_part && !strstr(diag.msg, c->msg_part)))
                printf("\n    case \"%s\" (gz %d): rc %d, message \"%s\"\n", c->name, gz, rc,
                       diag.msg);
            CU_ASSERT_EQUAL(rc, c->expect);
            if (c->expect == STRATA_OK) {
                CU_ASSERT_EQUAL(d.n, c->limit);
                strata_dataset_cleanup(&d);
                continue;
            }
            CU_ASSERT_PTR_NOT_NULL(strstr(diag.msg, c->msg_part));
            assert_empty(&d);
        }
    }
    free(img);
    free(lab);
    strata_test_rmtree(dir);
    free(dir);
}

/* Damaged gzip streams: cut short, corrupted in the middle, or not gzip at
 * all after a gzip magic. None may crash; all are EPROTO. */
static void test_idx_bad_gzip(void)
{
    char *dir = strata_test_tmpdir();
    CU_ASSERT_PTR_NOT_NULL_FATAL(dir);
    char *img = join(dir, "img"), *lab = join(dir, "lab");
    idx_spec s = good_spec(50, 28, 28);
    CU_ASSERT_EQUAL_FATAL(write_idx(img, lab, &s, 1, 0), 0);
    FILE *f = fopen(img, "rb");
    CU_ASSERT_PTR_NOT_NULL_FATAL(f);
    uint8_t buf[65536];
    size_t len = fread(buf, 1, sizeof(buf), f);
    fclose(f);
    CU_ASSERT_FATAL(len > 100 && len < sizeof(buf));

    struct {
        const char *name;
        size_t cut;  /* bytes kept */
        size_t flip; /* offset xor-ed with 0xff, 0 for none */
    } cases[] = {
        {"cut in half", len / 2, 0},      {"cut trailer", len - 4, 0},
        {"cut after gzip header", 12, 0}, {"flipped byte", len, len / 2},
        {"flipped crc", len, len - 6},
    };
    for (size_t t = 0; t < sizeof(cases) / sizeof(cases[0]); t++) {
        uint8_t copy[65536];
        memcpy(copy, buf, len);
        if (cases[t].flip)
            copy[cases[t].flip] ^= 0xff;
        CU_ASSERT_EQUAL_FATAL(write_file(img, copy, cases[t].cut, 0), 0);
        strata_dataset d;
        strata_diag diag;
        int rc = strata_data_load_idx(img, lab, 0, &d, &diag);
        printf("\n    %s: rc %d, %s\n", cases[t].name, rc, diag.msg);
        CU_ASSERT_EQUAL(rc, STRATA_EPROTO);
        CU_ASSERT(strlen(diag.msg) > 0);
        assert_empty(&d);
    }
    free(img);
    free(lab);
    strata_test_rmtree(dir);
    free(dir);
}

static void test_idx_missing(void)
{
    char *dir = strata_test_tmpdir();
    CU_ASSERT_PTR_NOT_NULL_FATAL(dir);
    char *img = join(dir, "img"), *lab = join(dir, "lab"), *none = join(dir, "absent");
    idx_spec s = good_spec(3, 2, 2);
    CU_ASSERT_EQUAL_FATAL(write_idx(img, lab, &s, 0, 0), 0);
    strata_dataset d;
    strata_diag diag;
    CU_ASSERT_EQUAL(strata_data_load_idx(none, lab, 0, &d, &diag), STRATA_EIO);
    CU_ASSERT_PTR_NOT_NULL(strstr(diag.msg, none));
    CU_ASSERT_EQUAL(strata_data_load_idx(img, none, 0, &d, &diag), STRATA_EIO);
    CU_ASSERT_PTR_NOT_NULL(strstr(diag.msg, none));
    assert_empty(&d);
    /* A directory opens but cannot be read. */
    CU_ASSERT_EQUAL(strata_data_load_idx(dir, lab, 0, &d, &diag), STRATA_EIO);
    CU_ASSERT_PTR_NOT_NULL(strstr(diag.msg, dir));
    CU_ASSERT_EQUAL(strata_data_load_idx(NULL, lab, 0, &d, NULL), STRATA_EINVAL);
    CU_ASSERT_EQUAL(strata_data_load_idx(img, lab, 0, NULL, NULL), STRATA_EINVAL);
    free(img);
    free(lab);
    free(none);
    strata_test_rmtree(dir);
    free(dir);
}

/* ---- CSV ---- */

typedef struct csv_case {
    const char *name;
    const char *text;
    size_t limit;
    int expect;
    size_t n, dim; /* expected on success */
    int num_classes;
    const char *msg_part; /* expected in the diagnostic on failure */
} csv_case;

static void test_csv_table(void)
{
    const csv_case cases[] = {
        {"plain", "0,1.5,2\n3,4,5.25\n", 0, STRATA_OK, 2, 2, 4, NULL},
        {"header", "label,a,b\n1,2,3\n", 0, STRATA_OK, 1, 2, 2, NULL},
        {"crlf, blanks, spaces", "1, 2 ,3\r\n\r\n 2 ,\t4,5\r\n\n", 0, STRATA_OK, 2, 2, 3, NULL},
        {"no final newline", "7,1e-3,-2", 0, STRATA_OK, 1, 2, 8, NULL},
        {"limit", "0,1\n1,2\n2,3\n", 2, STRATA_OK, 2, 1, 2, NULL},
        {"limit stops before bad row", "0,1\n1,2\n2,x\n", 2, STRATA_OK, 2, 1, 2, NULL},
        {"label 255", "255,1\n", 0, STRATA_OK, 1, 1, 256, NULL},
        {"ragged short", "1,2,3\n1,2\n", 0, STRATA_EPROTO, 0, 0, 0, "line 2 has 2 fields"},
        {"ragged long", "h,a\n1,2\n1,2,3\n", 0, STRATA_EPROTO, 0, 0, 0, "line 3 has 3 fields"},
        {"label 256", "1,2\n256,3\n", 0, STRATA_EPROTO, 0, 0, 0, "0..255"},
        {"label -1", "-1,2\n", 0, STRATA_EPROTO, 0, 0, 0, "0..255"},
        {"huge label", "99999999999999999999999,2\n", 0, STRATA_EPROTO, 0, 0, 0, "0..255"},
        {"label not integer", "1,2\n1.5,3\n", 0, STRATA_EPROTO, 0, 0, 0, "line 2: label"},
        {"label text", "1,2\ncat,3\n", 0, STRATA_EPROTO, 0, 0, 0, "not an integer"},
        {"bad feature", "1,abc,3\n", 0, STRATA_EPROTO, 0, 0, 0, "field 2"},
        {"empty feature", "1,2,,4\n", 0, STRATA_EPROTO, 0, 0, 0, "field 3"},
        {"nan feature", "1,nan\n", 0, STRATA_EPROTO, 0, 0, 0, "finite"},
        {"inf feature", "1,2\n1,inf\n", 0, STRATA_EPROTO, 0, 0, 0, "line 2"},
        {"label only", "1\n2\n", 0, STRATA_EPROTO, 0, 0, 0, "at least one feature"},
        {"empty file", "", 0, STRATA_EPROTO, 0, 0, 0, "no data rows"},
        {"header only", "label,x\n", 0, STRATA_EPROTO, 0, 0, 0, "no data rows"},
        {"two headers", "label,x\nlabel,x\n1,2\n", 0, STRATA_EPROTO, 0, 0, 0, "line 2"},
    };
    char *dir = strata_test_tmpdir();
    CU_ASSERT_PTR_NOT_NULL_FATAL(dir);
    char *path = join(dir, "data.csv");
    for (size_t t = 0; t < sizeof(cases) / sizeof(cases[0]); t++) {
        for (int gz = 0; gz <= 1; gz++) {
            const csv_case *c = &cases[t];
            CU_ASSERT_EQUAL_FATAL(write_file(path, c->text, strlen(c->text), gz), 0);
            strata_dataset d;
            strata_diag diag;
            int rc = strata_data_load_csv(path, c->limit, &d, &diag);
            if (rc != c->expect || (c->msg_part && !strstr(diag.msg, c->msg_part)))
                printf("\n    case \"%s\" (gz %d): rc %d, message \"%s\"\n", c->name, gz, rc,
                       diag.msg);
            CU_ASSERT_EQUAL(rc, c->expect);
            if (rc != STRATA_OK) {
                if (c->msg_part != NULL)
                    CU_ASSERT_PTR_NOT_NULL(strstr(diag.msg, c->msg_part));
                assert_empty(&d);
                continue;
            }
            CU_ASSERT_EQUAL(d.n, c->n);
            CU_ASSERT_EQUAL(d.dim, c->dim);
            CU_ASSERT_EQUAL(d.channels, 1);
            CU_ASSERT_EQUAL(d.height, 1);
            CU_ASSERT_EQUAL(d.width, (int)c->dim);
            CU_ASSERT_EQUAL(d.num_classes, c->num_classes);
            strata_dataset_cleanup(&d);
        }
    }
    free(path);
    strata_test_rmtree(dir);
    free(dir);
}

static void test_csv_values(void)
{
    char *dir = strata_test_tmpdir();
    CU_ASSERT_PTR_NOT_NULL_FATAL(dir);
    char *path = join(dir, "data.csv");
    const char *text = "y,a,b,c\n3,0.5,-2,1e3\n0, 7 ,255,0.125\r\n";
    CU_ASSERT_EQUAL_FATAL(write_file(path, text, strlen(text), 0), 0);
    strata_dataset d;
    strata_diag diag;
    CU_ASSERT_EQUAL_FATAL(strata_data_load_csv(path, 0, &d, &diag), STRATA_OK);
    const float want[] = {0.5f, -2.0f, 1000.0f, 7.0f, 255.0f, 0.125f};
    CU_ASSERT_EQUAL_FATAL(d.n * d.dim, 6);
    CU_ASSERT_EQUAL(memcmp(d.x, want, sizeof(want)), 0);
    CU_ASSERT_EQUAL(d.y[0], 3);
    CU_ASSERT_EQUAL(d.y[1], 0);
    strata_dataset_cleanup(&d);

    char *none = join(dir, "absent.csv");
    CU_ASSERT_EQUAL(strata_data_load_csv(none, 0, &d, &diag), STRATA_EIO);
    CU_ASSERT_PTR_NOT_NULL(strstr(diag.msg, none));
    assert_empty(&d);
    free(none);
    free(path);
    strata_test_rmtree(dir);
    free(dir);
}

/* Lines longer than the reader's initial buffer are assembled correctly;
 * a line over STRATA_DATA_MAX_LINE is refused. */
static void test_csv_long_lines(void)
{
    char *dir = strata_test_tmpdir();
    CU_ASSERT_PTR_NOT_NULL_FATAL(dir);
    char *path = join(dir, "wide.csv");
    const size_t features = 3000, rows = 4;
    FILE *f = fopen(path, "wb");
    CU_ASSERT_PTR_NOT_NULL_FATAL(f);
    for (size_t i = 0; i < rows; i++) {
        fprintf(f, "%zu", i);
        for (size_t j = 0; j < features; j++)
            fprintf(f, ",%zu.5", (i * 7 + j) % 1000);
        fputc('\n', f);
    }
    fclose(f);
    strata_dataset d;
    strata_diag diag;
    CU_ASSERT_EQUAL_FATAL(strata_data_load_csv(path, 0, &d, &diag), STRATA_OK);
    CU_ASSERT_EQUAL(d.n, rows);
    CU_ASSERT_EQUAL_FATAL(d.dim, features);
    size_t bad = 0;
    for (size_t i = 0; i < rows; i++)
        for (size_t j = 0; j < features; j++)
            if (d.x[i * features + j] != (float)((i * 7 + j) % 1000) + 0.5f)
                bad++;
    CU_ASSERT_EQUAL(bad, 0);
    CU_ASSERT_EQUAL(d.num_classes, (int)rows);
    strata_dataset_cleanup(&d);

    f = fopen(path, "wb");
    CU_ASSERT_PTR_NOT_NULL_FATAL(f);
    fputs("0,1\n1", f);
    for (size_t b = 0; b < STRATA_DATA_MAX_LINE / 2 + 1; b++)
        fputs(",1", f);
    fputc('\n', f);
    fclose(f);
    CU_ASSERT_EQUAL(strata_data_load_csv(path, 0, &d, &diag), STRATA_ETOOBIG);
    CU_ASSERT_PTR_NOT_NULL(strstr(diag.msg, "line 2 is longer"));
    assert_empty(&d);
    free(path);
    strata_test_rmtree(dir);
    free(dir);
}

/* ---- statistics ---- */

static void test_stats_small(void)
{
    float x[4] = {0.0f, 1.0f, 2.0f, 3.0f};
    uint8_t y[2] = {0, 1};
    strata_dataset d = {2, 1, 1, 2, 2, x, y, 2};
    double mean, std;
    CU_ASSERT_EQUAL(strata_dataset_stats(&d, &mean, &std), STRATA_OK);
    CU_ASSERT_DOUBLE_EQUAL(mean, 1.5, 1e-12);
    CU_ASSERT_DOUBLE_EQUAL(std, sqrt(1.25), 1e-12);
    strata_dataset e;
    strata_dataset_init(&e);
    CU_ASSERT_EQUAL(strata_dataset_stats(&e, &mean, &std), STRATA_EINVAL);
    CU_ASSERT_EQUAL(mean, 0.0);
    CU_ASSERT_EQUAL(strata_dataset_stats(NULL, &mean, &std), STRATA_EINVAL);
}

int main(void)
{
    CU_TestInfo fm_tests[] = {
        {"train shape, classes, range", test_fm_train_shape},
        {"train first sample matches file", test_fm_train_first_sample},
        {"train mean/std", test_fm_stats},
        {"test split", test_fm_test_split},
        {"limit", test_fm_limit},
        CU_TEST_INFO_NULL,
    };
    CU_TestInfo idx_tests[] = {
        {"round trip raw and gz", test_idx_round_trip},
        {"directory names", test_load_dir_names},
        {"EMNIST names", test_load_dir_emnist},
        {"malformed headers and data", test_idx_malformed},
        {"damaged gzip", test_idx_bad_gzip},
        {"missing files", test_idx_missing},
        CU_TEST_INFO_NULL,
    };
    CU_TestInfo csv_tests[] = {
        {"table", test_csv_table},
        {"values", test_csv_values},
        {"long lines", test_csv_long_lines},
        CU_TEST_INFO_NULL,
    };
    CU_TestInfo stats_tests[] = {
        {"small", test_stats_small},
        CU_TEST_INFO_NULL,
    };
    CU_SuiteInfo suites[] = {
        {"fashion-mnist", fm_init, fm_cleanup, NULL, NULL, fm_tests},
        {"idx", NULL, NULL, NULL, NULL, idx_tests},
        {"csv", NULL, NULL, NULL, NULL, csv_tests},
        {"stats", NULL, NULL, NULL, NULL, stats_tests},
        CU_SUITE_INFO_NULL,
    };
    return strata_test_run(suites);
}
