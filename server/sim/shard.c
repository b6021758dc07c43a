/* strata-sim: per-client shards — the training split cut with the same
 * partitioner the clients use, each client's share written as a raw IDX
 * pair of its own, so that a client process loads only its share
 * (strata-client --partition none). */
#include "sim.h"

#include "strata/data.h"
#include "strata/partition.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* IDX magic numbers: unsigned bytes, 3 and 1 dimensions. */
#define IDX_IMAGES 0x00000803u
#define IDX_LABELS 0x00000801u

static void put_be32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}

/* Writes len bytes of header then body to path (created or truncated). */
static int write_file(const char *path, const uint8_t *head, size_t hlen, const uint8_t *body,
                      size_t len, strata_diag *diag)
{
    FILE *f = fopen(path, "wb");
    int ok = f != NULL && fwrite(head, 1, hlen, f) == hlen && fwrite(body, 1, len, f) == len;
    if (f != NULL && fclose(f) != 0)
        ok = 0;
    return ok ? STRATA_OK
              : strata_diag_set(diag, STRATA_EIO, "cannot write %s: %s", path, strerror(errno));
}

/* Writes one share (count samples at idx) of ds as dir's IDX pair; pixels
 * is scratch room for count * ds->dim bytes. */
static int write_share(const strata_dataset *ds, const size_t *idx, size_t count, const char *dir,
                       uint8_t *pixels, uint8_t *labels, strata_diag *diag)
{
    char path[PATH_MAX];
    if (mkdir(dir, 0755) != 0 && errno != EEXIST)
        return strata_diag_set(diag, STRATA_EIO, "cannot create %s: %s", dir, strerror(errno));
    for (size_t i = 0; i < count; i++) {
        const float *x = ds->x + idx[i] * ds->dim;
        uint8_t *px = pixels + i * ds->dim;
        for (size_t k = 0; k < ds->dim; k++) /* the reader stored byte / 255 */
            px[k] = (uint8_t)lrintf(x[k] * 255.0f);
        labels[i] = ds->y[idx[i]];
    }
    uint8_t head[16];
    put_be32(head, IDX_IMAGES);
    put_be32(head + 4, (uint32_t)count);
    put_be32(head + 8, (uint32_t)ds->height);
    put_be32(head + 12, (uint32_t)ds->width);
    int rc;
    if (snprintf(path, sizeof(path), "%s/train-images-idx3-ubyte", dir) >= (int)sizeof(path))
        return strata_diag_set(diag, STRATA_EINVAL, "path too long: %s", dir);
    if ((rc = write_file(path, head, 16, pixels, count * ds->dim, diag)) < 0)
        return rc;
    put_be32(head, IDX_LABELS);
    if (snprintf(path, sizeof(path), "%s/train-labels-idx1-ubyte", dir) >= (int)sizeof(path))
        return strata_diag_set(diag, STRATA_EINVAL, "path too long: %s", dir);
    return write_file(path, head, 8, labels, count, diag);
}

int sim_shards_write(const char *data_dir, const char *spec, long nclients, long seed,
                     const char *base, strata_diag *diag)
{
    strata_dataset ds;
    strata_dataset_init(&ds);
    strata_partition *part = NULL;
    uint8_t *pixels = NULL, *labels = NULL;
    int rc = strata_data_load_dir(data_dir, "train", 0, &ds, diag);
    if (rc < 0)
        goto out;
    if (ds.channels != 1) {
        rc = strata_diag_set(diag, STRATA_EINVAL, "%s: not a single-channel IDX set", data_dir);
        goto out;
    }
    rc = strata_partition_new(ds.y, ds.n, ds.num_classes, spec, (size_t)nclients, (uint64_t)seed,
                              &part, diag);
    if (rc < 0)
        goto out;
    size_t most = 0;
    for (long c = 0; c < nclients; c++)
        if (part->counts[c] > most)
            most = part->counts[c];
    if ((pixels = malloc(most * ds.dim)) == NULL || (labels = malloc(most)) == NULL) {
        rc = strata_diag_set(diag, STRATA_ENOMEM, "out of memory");
        goto out;
    }
    if (mkdir(base, 0755) != 0 && errno != EEXIST) {
        rc = strata_diag_set(diag, STRATA_EIO, "cannot create %s: %s", base, strerror(errno));
        goto out;
    }
    for (long c = 0; c < nclients && rc == 0; c++) {
        char dir[PATH_MAX];
        if (snprintf(dir, sizeof(dir), "%s/%ld", base, c) >= (int)sizeof(dir))
            rc = strata_diag_set(diag, STRATA_EINVAL, "path too long: %s", base);
        else
            rc = write_share(&ds, part->indices[c], part->counts[c], dir, pixels, labels, diag);
    }
out:
    free(pixels);
    free(labels);
    strata_partition_free(part);
    strata_dataset_cleanup(&ds);
    return rc;
}
