#include "strata/data.h"
#include "strata/buf.h"

#include "strata/tensor.h"

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <zlib.h>

#define IDX_IMAGES_MAGIC 0x00000803u
#define IDX_LABELS_MAGIC 0x00000801u

/* Bytes handed to one gzread call. */
#define READ_CHUNK ((size_t)1 << 20)

/* First allocation when reading a block whose size comes from a header; the
 * buffer then doubles as data actually arrives, so a header that lies about
 * its size costs no more memory than the file really holds. */
#define GROW_START ((size_t)1 << 20)

/* Longest path the directory loader builds. */
#define MAX_PATH 4096

/* Longest EMNIST-style file name prefix considered. */
#define MAX_PREFIX 256

void strata_dataset_init(strata_dataset *d)
{
    d->n = 0;
    d->channels = 0;
    d->height = 0;
    d->width = 0;
    d->dim = 0;
    d->x = NULL;
    d->y = NULL;
    d->num_classes = 0;
}

void strata_dataset_cleanup(strata_dataset *d)
{
    if (d == NULL)
        return;
    strata_free_floats(d->x);
    free(d->y);
    strata_dataset_init(d);
}

static uint32_t be32(const uint8_t *p)
{
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

static int label_classes(const uint8_t *y, size_t n)
{
    int max = 0;
    for (size_t i = 0; i < n; i++)
        if (y[i] > max)
            max = y[i];
    return max + 1;
}

static int gz_open(const char *path, gzFile *out, strata_diag *diag)
{
    errno = 0;
    *out = gzopen(path, "rb");
    if (*out == NULL) {
        if (errno == 0)
            return strata_diag_set(diag, STRATA_ENOMEM, "%s: out of memory opening file", path);
        return strata_diag_set(diag, STRATA_EIO, "cannot open %s: %s", path, strerror(errno));
    }
    gzbuffer(*out, 1u << 17);
    return STRATA_OK;
}

/* Turns the error state of f after a failed read into a code and message. */
static int gz_fail(gzFile f, const char *path, strata_diag *diag)
{
    int errnum = Z_OK;
    const char *msg = gzerror(f, &errnum);
    if (errnum == Z_ERRNO)
        return strata_diag_set(diag, STRATA_EIO, "%s: read error: %s", path, strerror(errno));
    if (errnum == Z_MEM_ERROR)
        return strata_diag_set(diag, STRATA_ENOMEM, "%s: out of memory decompressing", path);
    if (msg == NULL)
        msg = "unknown error";
    size_t plen = strlen(path); /* zlib prefixes "path: " */
    if (strncmp(msg, path, plen) == 0 && msg[plen] == ':' && msg[plen + 1] == ' ')
        msg += plen + 2;
    return strata_diag_set(diag, STRATA_EPROTO, "%s: corrupt gzip data: %s", path, msg);
}

/* Reads up to len bytes into buf; *got is short only at the end of the data.
 * Returns STRATA_OK or the error of a failed read. */
static int gz_read(gzFile f, const char *path, void *buf, size_t len, size_t *got,
                   strata_diag *diag)
{
    unsigned char *p = buf;
    *got = 0;
    while (*got < len) {
        size_t want = len - *got;
        if (want > READ_CHUNK)
            want = READ_CHUNK;
        int r = gzread(f, p + *got, (unsigned)want);
        if (r < 0)
            return gz_fail(f, path, diag);
        if (r == 0)
            break;
        *got += (size_t)r;
    }
    return STRATA_OK;
}

/* Explains a short read: a gzip stream cut off, or a file with too few bytes. */
static int truncated(gzFile f, const char *path, const char *what, size_t want, size_t have,
                     strata_diag *diag)
{
    int errnum = Z_OK;
    gzerror(f, &errnum);
    return strata_diag_set(diag, STRATA_EPROTO, "%s: truncated %s: expected %zu bytes, found %zu%s",
                           path, what, want, have,
                           errnum == Z_BUF_ERROR ? " (gzip stream ends early)" : "");
}

/* Reads exactly len bytes into a new malloc'ed buffer (*out), growing it as
 * data arrives (so a file that lies about its size costs no more memory than
 * it has bytes). On error *out is NULL. */
static int read_block(gzFile f, const char *path, const char *what, size_t len, uint8_t **out,
                      strata_diag *diag)
{
    int rc = STRATA_OK;
    strata_buf b;
    strata_buf_init(&b, len);
    *out = NULL;
    if (strata_buf_reserve(&b, 0) < 0)
        return strata_diag_set(diag, STRATA_ENOMEM, "%s: out of memory", path);
    while (b.len < len) {
        size_t want = b.len == 0 ? GROW_START : b.len;
        if (want > len - b.len)
            want = len - b.len;
        if (strata_buf_reserve(&b, want) < 0) {
            rc = strata_diag_set(diag, STRATA_ENOMEM, "%s: out of memory", path);
            goto out;
        }
        size_t got;
        rc = gz_read(f, path, b.data + b.len, want, &got, diag);
        if (rc < 0)
            goto out;
        strata_buf_commit(&b, got);
        if (got < want) {
            rc = truncated(f, path, what, len, b.len, diag);
            goto out;
        }
    }
    *out = strata_buf_take(&b, NULL);
out:
    strata_buf_cleanup(&b);
    return rc;
}

/* Called after the last record of a file has been read: reading on makes
 * zlib verify the gzip trailer (CRC and length), and a raw file must end
 * here. */
static int check_end(gzFile f, const char *path, strata_diag *diag)
{
    uint8_t b;
    int r = gzread(f, &b, 1);
    if (r < 0)
        return gz_fail(f, path, diag);
    if (r > 0)
        return strata_diag_set(diag, STRATA_EPROTO, "%s: unexpected data after the last record",
                               path);
    int errnum = Z_OK;
    gzerror(f, &errnum);
    if (errnum == Z_BUF_ERROR)
        return strata_diag_set(diag, STRATA_EPROTO, "%s: truncated gzip trailer", path);
    if (errnum != Z_OK)
        return gz_fail(f, path, diag);
    return STRATA_OK;
}

/* Reads an IDX header of hlen bytes and checks its magic number. */
static int read_header(gzFile f, const char *path, uint8_t *h, size_t hlen, uint32_t magic,
                       const char *kind, strata_diag *diag)
{
    size_t got;
    int rc = gz_read(f, path, h, hlen, &got, diag);
    if (rc < 0)
        return rc;
    if (got < hlen)
        return truncated(f, path, "IDX header", hlen, got, diag);
    if (be32(h) != magic)
        return strata_diag_set(diag, STRATA_EPROTO,
                               "%s: not an IDX %s file (magic 0x%08x, expected 0x%08x)", path, kind,
                               (unsigned)be32(h), (unsigned)magic);
    return STRATA_OK;
}

int strata_data_load_idx(const char *images_path, const char *labels_path, size_t limit,
                         strata_dataset *out, strata_diag *diag)
{
    gzFile fi = NULL, fl = NULL;
    uint8_t *pix = NULL, *lab = NULL;
    float *x = NULL;
    uint8_t hi[16], hl[8];
    int rc;

    if (diag != NULL)
        diag->msg[0] = '\0';
    if (out != NULL)
        strata_dataset_init(out);
    if (images_path == NULL || labels_path == NULL || out == NULL)
        return strata_diag_set(diag, STRATA_EINVAL, "strata_data_load_idx: NULL argument");

    rc = gz_open(images_path, &fi, diag);
    if (rc < 0)
        goto out;
    rc = gz_open(labels_path, &fl, diag);
    if (rc < 0)
        goto out;
    rc = read_header(fi, images_path, hi, sizeof(hi), IDX_IMAGES_MAGIC, "image (u8, 3-d)", diag);
    if (rc < 0)
        goto out;
    rc = read_header(fl, labels_path, hl, sizeof(hl), IDX_LABELS_MAGIC, "label (u8, 1-d)", diag);
    if (rc < 0)
        goto out;

    uint32_t n_img = be32(hi + 4), rows = be32(hi + 8), cols = be32(hi + 12);
    uint32_t n_lab = be32(hl + 4);
    if (n_img != n_lab) {
        rc = strata_diag_set(diag, STRATA_EPROTO, "%s holds %u images but %s holds %u labels",
                             images_path, (unsigned)n_img, labels_path, (unsigned)n_lab);
        goto out;
    }
    if (n_img == 0) {
        rc = strata_diag_set(diag, STRATA_EPROTO, "%s holds no samples", images_path);
        goto out;
    }
    uint64_t dim64 = (uint64_t)rows * cols; /* both < 2^32: cannot overflow */
    if (rows == 0 || cols == 0 || dim64 > STRATA_DATA_MAX_SAMPLE_DIM) {
        rc = strata_diag_set(
            diag, STRATA_EPROTO, "%s: absurd image size %ux%u (at most %zu pixels per image)",
            images_path, (unsigned)rows, (unsigned)cols, (size_t)STRATA_DATA_MAX_SAMPLE_DIM);
        goto out;
    }
    size_t dim = (size_t)dim64;
    size_t n = n_img;
    if (limit > 0 && limit < n)
        n = limit;
    if (n > STRATA_DATA_MAX_ELEMENTS / dim) {
        rc = strata_diag_set(diag, STRATA_ETOOBIG,
                             "%s: %zu images of %zu pixels exceed the limit of %zu values; "
                             "load fewer with a limit",
                             images_path, n, dim, (size_t)STRATA_DATA_MAX_ELEMENTS);
        goto out;
    }

    rc = read_block(fl, labels_path, "label data", n, &lab, diag);
    if (rc < 0)
        goto out;
    rc = read_block(fi, images_path, "image data", n * dim, &pix, diag);
    if (rc < 0)
        goto out;
    if (n == n_img) {
        rc = check_end(fl, labels_path, diag);
        if (rc < 0)
            goto out;
        rc = check_end(fi, images_path, diag);
        if (rc < 0)
            goto out;
    }
    x = strata_alloc_floats(n * dim);
    if (x == NULL) {
        rc = strata_diag_set(diag, STRATA_ENOMEM, "%s: out of memory for %zu values", images_path,
                             n * dim);
        goto out;
    }
    for (size_t i = 0; i < n * dim; i++)
        x[i] = (float)pix[i] / 255.0f;

    out->n = n;
    out->channels = 1;
    out->height = (int)rows;
    out->width = (int)cols;
    out->dim = dim;
    out->x = x;
    out->y = lab;
    out->num_classes = label_classes(lab, n);
    x = NULL;
    lab = NULL;
    rc = STRATA_OK;
out:
    if (fi != NULL)
        gzclose(fi);
    if (fl != NULL)
        gzclose(fl);
    free(pix);
    free(lab);
    strata_free_floats(x);
    return rc;
}

static int is_file(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/* Writes dir/name (raw preferred) or dir/name.gz into buf when one exists.
 * Returns 1 when found, 0 when neither exists, STRATA_EINVAL when the path
 * does not fit. */
static int find_variant(char *buf, size_t len, const char *dir, const char *name, strata_diag *diag)
{
    static const char *const suffixes[] = {"", ".gz"};
    for (size_t i = 0; i < sizeof(suffixes) / sizeof(suffixes[0]); i++) {
        int w = snprintf(buf, len, "%s/%s%s", dir, name, suffixes[i]);
        if (w < 0 || (size_t)w >= len)
            return strata_diag_set(diag, STRATA_EINVAL, "path too long: %s/%s", dir, name);
        if (is_file(buf))
            return 1;
    }
    return 0;
}

/* Looks in dir for exactly one PREFIX such that PREFIX-SPLIT-images-idx3-ubyte
 * or the same with .gz exists, and copies PREFIX into prefix. Returns 1 when
 * found, 0 when none matches, a negative error otherwise. */
static int find_emnist_prefix(const char *dir, const char *split, char *prefix, size_t len,
                              strata_diag *diag)
{
    char suffix[64];
    int found = 0, rc;
    snprintf(suffix, sizeof(suffix), "-%s-images-idx3-ubyte", split);
    size_t slen = strlen(suffix);
    DIR *d = opendir(dir);
    if (d == NULL)
        return strata_diag_set(diag, STRATA_EIO, "cannot open directory %s: %s", dir,
                               strerror(errno));
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        const char *name = e->d_name;
        size_t nlen = strlen(name);
        if (nlen > 3 && strcmp(name + nlen - 3, ".gz") == 0)
            nlen -= 3;
        if (nlen <= slen || strncmp(name + nlen - slen, suffix, slen) != 0)
            continue;
        size_t plen = nlen - slen;
        if (plen >= len)
            continue;
        if (!found) {
            memcpy(prefix, name, plen);
            prefix[plen] = '\0';
            found = 1;
        } else if (strlen(prefix) != plen || strncmp(prefix, name, plen) != 0) {
            rc = strata_diag_set(diag, STRATA_EINVAL,
                                 "%s: several data sets match split \"%s\" (%s and %.*s); "
                                 "use strata_data_load_idx with explicit paths",
                                 dir, split, prefix, (int)plen, name);
            closedir(d);
            return rc;
        }
    }
    closedir(d);
    return found;
}

int strata_data_load_dir(const char *dir, const char *split, size_t limit, strata_dataset *out,
                         strata_diag *diag)
{
    char images[MAX_PATH], labels[MAX_PATH], name[MAX_PATH], prefix[MAX_PREFIX];
    const char *stem;
    int rc;

    if (diag != NULL)
        diag->msg[0] = '\0';
    if (out != NULL)
        strata_dataset_init(out);
    if (dir == NULL || split == NULL || out == NULL)
        return strata_diag_set(diag, STRATA_EINVAL, "strata_data_load_dir: NULL argument");
    if (strcmp(split, "train") == 0)
        stem = "train";
    else if (strcmp(split, "test") == 0)
        stem = "t10k";
    else
        return strata_diag_set(diag, STRATA_EINVAL,
                               "unknown split \"%s\" (expected \"train\" or \"test\")", split);

    snprintf(name, sizeof(name), "%s-images-idx3-ubyte", stem);
    rc = find_variant(images, sizeof(images), dir, name, diag);
    if (rc < 0)
        return rc;
    if (rc == 0) {
        rc = find_emnist_prefix(dir, split, prefix, sizeof(prefix), diag);
        if (rc < 0)
            return rc;
        if (rc == 0)
            return strata_diag_set(diag, STRATA_EIO,
                                   "%s: no %s images (looked for %s-images-idx3-ubyte[.gz] and "
                                   "*-%s-images-idx3-ubyte[.gz])",
                                   dir, split, stem, split);
        snprintf(name, sizeof(name), "%s-%s-images-idx3-ubyte", prefix, split);
        rc = find_variant(images, sizeof(images), dir, name, diag);
        if (rc < 0)
            return rc;
        snprintf(name, sizeof(name), "%s-%s-labels-idx1-ubyte", prefix, split);
    } else {
        snprintf(name, sizeof(name), "%s-labels-idx1-ubyte", stem);
    }
    rc = find_variant(labels, sizeof(labels), dir, name, diag);
    if (rc < 0)
        return rc;
    if (rc == 0)
        return strata_diag_set(diag, STRATA_EIO, "%s: found %s but no labels %s[.gz]", dir, images,
                               name);
    return strata_data_load_idx(images, labels, limit, out, diag);
}

/* ---- CSV ---- */

typedef struct line_reader {
    gzFile f;
    const char *path;
    strata_buf buf; /* the current line; capped one byte above the limit */
    size_t lineno;
} line_reader;

/* Reads the next line into r->buf without its line end. Returns 1 for a
 * line, 0 at the end of the file, or a negative error. */
static int next_line(line_reader *r, size_t *len, strata_diag *diag)
{
    strata_buf *b = &r->buf;
    *len = 0;
    strata_buf_reset(b);
    for (;;) {
        /* gzgets needs room for one byte and the NUL. */
        int rc = strata_buf_reserve(b, b->cap > b->len + 1 ? b->cap - b->len - 1 : 4096);
        if (rc == STRATA_ETOOBIG && b->len < b->max)
            rc = strata_buf_reserve(b, b->max - b->len);
        if (rc == STRATA_ETOOBIG)
            return strata_diag_set(diag, STRATA_ETOOBIG, "%s: line %zu is longer than %zu bytes",
                                   r->path, r->lineno + 1, (size_t)STRATA_DATA_MAX_LINE);
        if (rc < 0)
            return strata_diag_set(diag, STRATA_ENOMEM, "%s: out of memory", r->path);
        size_t room = b->cap - b->len;
        if (room > (size_t)1 << 30)
            room = (size_t)1 << 30;
        char *at = (char *)b->data + b->len;
        if (gzgets(r->f, at, (int)room) == NULL) {
            int errnum = Z_OK;
            gzerror(r->f, &errnum);
            if (errnum == Z_BUF_ERROR)
                return strata_diag_set(diag, STRATA_EPROTO, "%s: gzip stream ends early", r->path);
            if (errnum != Z_OK)
                return gz_fail(r->f, r->path, diag);
            b->data[b->len] = '\0';
            if (b->len == 0)
                return 0;
            break; /* last line without a line end */
        }
        strata_buf_commit(b, strlen(at));
        if (b->len > 0 && b->data[b->len - 1] == '\n')
            break;
        if (gzeof(r->f))
            break;
    }
    r->lineno++;
    size_t have = b->len;
    char *line = (char *)b->data;
    while (have > 0 && (line[have - 1] == '\n' || line[have - 1] == '\r'))
        have--;
    line[have] = '\0';
    if (have > STRATA_DATA_MAX_LINE)
        return strata_diag_set(diag, STRATA_ETOOBIG, "%s: line %zu is longer than %zu bytes",
                               r->path, r->lineno, (size_t)STRATA_DATA_MAX_LINE);
    *len = have;
    return 1;
}

/* Trims spaces and tabs around the NUL-terminated field s in place. */
static char *trim(char *s)
{
    while (*s == ' ' || *s == '\t')
        s++;
    size_t n = strlen(s);
    while (n > 0 && (s[n - 1] == ' ' || s[n - 1] == '\t'))
        s[--n] = '\0';
    return s;
}

/* Returns 1 when s is an optionally signed decimal integer (stored in *v,
 * clamped to the long range), else 0. */
static int parse_int(const char *s, long *v)
{
    const char *p = s;
    if (*p == '+' || *p == '-')
        p++;
    if (*p < '0' || *p > '9')
        return 0;
    for (const char *q = p; *q != '\0'; q++)
        if (*q < '0' || *q > '9')
            return 0;
    errno = 0;
    *v = strtol(s, NULL, 10);
    return 1;
}

static size_t count_fields(const char *s)
{
    size_t n = 1;
    for (; *s != '\0'; s++)
        if (*s == ',')
            n++;
    return n;
}

/* Splits line into fields at commas (in place), trimming each. Returns the
 * next field and advances *cursor, or NULL after the last field. */
static char *next_field(char **cursor)
{
    char *s = *cursor;
    if (s == NULL)
        return NULL;
    char *comma = strchr(s, ',');
    if (comma != NULL) {
        *comma = '\0';
        *cursor = comma + 1;
    } else {
        *cursor = NULL;
    }
    return trim(s);
}

static int is_blank(const char *s)
{
    for (; *s != '\0'; s++)
        if (*s != ' ' && *s != '\t')
            return 0;
    return 1;
}

int strata_data_load_csv(const char *path, size_t limit, strata_dataset *out, strata_diag *diag)
{
    line_reader r = {NULL, path, {0}, 0};
    float *xs = NULL, *x = NULL;
    uint8_t *ys = NULL;
    size_t rows = 0, cap_x = 0, cap_y = 0, nfields = 0, dim = 0, len;
    int rc, first = 1;

    if (diag != NULL)
        diag->msg[0] = '\0';
    if (out != NULL)
        strata_dataset_init(out);
    if (path == NULL || out == NULL)
        return strata_diag_set(diag, STRATA_EINVAL, "strata_data_load_csv: NULL argument");
    rc = gz_open(path, &r.f, diag);
    if (rc < 0)
        goto out;
    strata_buf_init(&r.buf, STRATA_DATA_MAX_LINE + 2); /* the line and its "\r\n" */

    while (limit == 0 || rows < limit) {
        rc = next_line(&r, &len, diag);
        if (rc < 0)
            goto out;
        if (rc == 0)
            break;
        if (is_blank((char *)r.buf.data))
            continue;
        size_t fields = count_fields((char *)r.buf.data);
        char *cursor = (char *)r.buf.data;
        char *field = next_field(&cursor);
        long label;
        if (!parse_int(field, &label)) {
            if (first) {
                first = 0; /* header line */
                continue;
            }
            rc = strata_diag_set(diag, STRATA_EPROTO,
                                 "%s: line %zu: label \"%.40s\" is not an integer", path, r.lineno,
                                 field);
            goto out;
        }
        first = 0;
        if (label < 0 || label > 255) {
            rc = strata_diag_set(diag, STRATA_EPROTO, "%s: line %zu: label %.40s is outside 0..255",
                                 path, r.lineno, field);
            goto out;
        }
        if (nfields == 0) {
            if (fields < 2) {
                rc = strata_diag_set(diag, STRATA_EPROTO,
                                     "%s: line %zu: need a label and at least one feature", path,
                                     r.lineno);
                goto out;
            }
            if (fields - 1 > STRATA_DATA_MAX_SAMPLE_DIM) {
                rc = strata_diag_set(diag, STRATA_ETOOBIG,
                                     "%s: %zu features exceed the limit of %zu", path, fields - 1,
                                     (size_t)STRATA_DATA_MAX_SAMPLE_DIM);
                goto out;
            }
            nfields = fields;
            dim = fields - 1;
        } else if (fields != nfields) {
            rc = strata_diag_set(diag, STRATA_EPROTO, "%s: line %zu has %zu fields, expected %zu",
                                 path, r.lineno, fields, nfields);
            goto out;
        }
        if (rows + 1 > STRATA_DATA_MAX_ELEMENTS / dim) {
            rc = strata_diag_set(diag, STRATA_ETOOBIG,
                                 "%s: more than %zu values; load fewer with a limit", path,
                                 (size_t)STRATA_DATA_MAX_ELEMENTS);
            goto out;
        }
        float *nx = strata_array_grow(xs, &cap_x, (rows + 1) * dim, sizeof(float));
        if (nx != NULL)
            xs = nx;
        uint8_t *ny = strata_array_grow(ys, &cap_y, rows + 1, 1);
        if (ny != NULL)
            ys = ny;
        if (nx == NULL || ny == NULL) {
            rc = strata_diag_set(diag, STRATA_ENOMEM, "%s: out of memory", path);
            goto out;
        }
        float *dst = xs + rows * dim;
        for (size_t j = 0; j < dim; j++) {
            field = next_field(&cursor);
            char *end;
            errno = 0;
            float v = strtof(field, &end);
            if (*field == '\0' || *end != '\0' || !isfinite(v)) {
                rc = strata_diag_set(diag, STRATA_EPROTO,
                                     "%s: line %zu, field %zu: \"%.40s\" is not a finite number",
                                     path, r.lineno, j + 2, field);
                goto out;
            }
            dst[j] = v;
        }
        ys[rows++] = (uint8_t)label;
    }
    if (rows == 0) {
        rc = strata_diag_set(diag, STRATA_EPROTO, "%s: no data rows", path);
        goto out;
    }
    x = strata_alloc_floats(rows * dim);
    if (x == NULL) {
        rc = strata_diag_set(diag, STRATA_ENOMEM, "%s: out of memory", path);
        goto out;
    }
    memcpy(x, xs, rows * dim * sizeof(float));
    out->n = rows;
    out->channels = 1;
    out->height = 1;
    out->width = (int)dim;
    out->dim = dim;
    out->x = x;
    out->y = ys;
    out->num_classes = label_classes(ys, rows);
    ys = NULL;
    rc = STRATA_OK;
out:
    if (r.f != NULL)
        gzclose(r.f);
    strata_buf_cleanup(&r.buf);
    free(xs);
    free(ys);
    return rc;
}

int strata_dataset_stats(const strata_dataset *d, double *mean, double *std)
{
    if (mean != NULL)
        *mean = 0.0;
    if (std != NULL)
        *std = 0.0;
    if (d == NULL || mean == NULL || std == NULL || d->x == NULL || d->n == 0 || d->dim == 0)
        return STRATA_EINVAL;
    size_t total = d->n * d->dim;
    double sum = 0.0;
    for (size_t i = 0; i < total; i++)
        sum += d->x[i];
    double m = sum / (double)total;
    double ss = 0.0;
    for (size_t i = 0; i < total; i++) {
        double dv = d->x[i] - m;
        ss += dv * dv;
    }
    *mean = m;
    *std = sqrt(ss / (double)total);
    return STRATA_OK;
}
