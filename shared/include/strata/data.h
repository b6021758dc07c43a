/* Labelled data sets: IDX (MNIST, Fashion-MNIST, EMNIST; raw or gzip) and
 * CSV readers.
 *
 * A strata_dataset is a caller-owned struct holding n samples as one dense
 * float array (sample-major, each sample channels*height*width values) and
 * one uint8 label per sample. Readers never trust their input: malformed files
 * are rejected with STRATA_EPROTO and an explanation in the optional diag,
 * files that cannot be opened or read with STRATA_EIO. Every reader zeroes its
 * out-parameter on entry and leaves it empty on error.
 *
 * The functions keep no state and may be called from several threads at once
 * on different data sets. */
#ifndef STRATA_DATA_H
#define STRATA_DATA_H

#include "strata/error.h"

#include <stddef.h>
#include <stdint.h>

/* Largest number of values (pixels or features) in one sample. */
#define STRATA_DATA_MAX_SAMPLE_DIM ((size_t)1 << 24)

/* Largest number of float values (n * dim) one data set may hold: 4 GiB of
 * floats, enough for EMNIST ByClass. Larger files can be read with a limit. */
#define STRATA_DATA_MAX_ELEMENTS ((size_t)1 << 30)

/* Longest CSV line the reader accepts, in bytes. */
#define STRATA_DATA_MAX_LINE ((size_t)1 << 24)

typedef struct strata_dataset {
    size_t n;                    /* number of samples */
    int channels, height, width; /* image geometry; CSV data: 1, 1, features */
    size_t dim;                  /* channels * height * width */
    float *x;        /* n * dim values, owned (strata_alloc_floats); IDX pixels are byte / 255 */
    uint8_t *y;      /* n labels, owned (malloc) */
    int num_classes; /* largest label + 1 */
} strata_dataset;

/* Makes d an empty data set (all fields zero, no memory owned). */
void strata_dataset_init(strata_dataset *d);

/* Frees the memory d owns and leaves it empty. Accepts NULL. */
void strata_dataset_cleanup(strata_dataset *d);

/* Reads an IDX image file (magic 0x00000803: unsigned bytes, 3 dimensions
 * n x rows x cols) and the matching IDX label file (magic 0x00000801, n
 * bytes) into out. Either file may be gzip-compressed; compression is detected
 * from the content, not the name. limit > 0 keeps only the first limit
 * samples (and reads no further); 0 or a limit above n loads all of them.
 * When every sample is loaded, the files must end after the last record, and
 * reading to the end makes zlib verify the gzip checksum.
 * Pixels become floats in [0, 1] (byte / 255); geometry is 1 x rows x cols.
 *
 * out is overwritten without being freed: pass an empty or uninitialised
 * struct, and release it with strata_dataset_cleanup().
 *
 * Errors: STRATA_EINVAL for NULL arguments; STRATA_EIO when a file cannot be
 * opened or read (the message names the path); STRATA_EPROTO for a wrong
 * magic number, differing image and label counts, zero or absurd dimensions,
 * truncated data, bytes after the last record or a corrupt gzip stream; STRATA_ETOOBIG when the
 * samples to load exceed STRATA_DATA_MAX_ELEMENTS values; STRATA_ENOMEM. */
int strata_data_load_idx(const char *images_path, const char *labels_path, size_t limit,
                         strata_dataset *out, strata_diag *diag);

/* Loads split "train" or "test" from directory dir, which holds files named
 * as MNIST and Fashion-MNIST ship them: train-images-idx3-ubyte and
 * train-labels-idx1-ubyte for "train", t10k-images-idx3-ubyte and
 * t10k-labels-idx1-ubyte for "test", each either raw or with a ".gz" suffix.
 * The raw file is preferred when both exist. When those names are absent the
 * directory is searched for EMNIST-style names, PREFIX-SPLIT-images-idx3-ubyte
 * and PREFIX-SPLIT-labels-idx1-ubyte (raw or .gz, e.g.
 * emnist-digits-train-images-idx3-ubyte.gz); exactly one PREFIX must match.
 * EMNIST images are used as stored (transposed relative to MNIST), which is
 * harmless as long as training and evaluation read the same files.
 *
 * limit and out behave as in strata_data_load_idx(). Errors: STRATA_EINVAL
 * for a NULL argument, an unknown split or several EMNIST candidates;
 * STRATA_EIO when no matching files exist (the message names what was looked
 * for); otherwise those of strata_data_load_idx(). */
int strata_data_load_dir(const char *dir, const char *split, size_t limit, strata_dataset *out,
                         strata_diag *diag);

/* Reads a CSV file in which every line is "label,f1,f2,...": an integer label
 * 0..255 followed by at least one feature. Features are taken as written (no
 * scaling) and must be finite numbers. The first line is treated as a header
 * and skipped when its first field is not an integer. Blank lines are
 * ignored, fields may be surrounded by spaces or tabs, and CRLF line ends are
 * accepted. Every row must have as many fields as the first data row. The file
 * may be gzip-compressed. Geometry is 1 x 1 x features. limit behaves as in
 * strata_data_load_idx(), and so does out.
 *
 * Errors: STRATA_EINVAL for NULL arguments; STRATA_EIO when the file cannot
 * be opened or read; STRATA_EPROTO (the message gives the line number) for an
 * empty file, a ragged row, a bad label or a bad feature; STRATA_ETOOBIG for a
 * line longer than STRATA_DATA_MAX_LINE bytes, more than
 * STRATA_DATA_MAX_SAMPLE_DIM features or more than STRATA_DATA_MAX_ELEMENTS
 * values in total; STRATA_ENOMEM. */
int strata_data_load_csv(const char *path, size_t limit, strata_dataset *out, strata_diag *diag);

/* Computes the mean and the population standard deviation (dividing by the
 * count) of all n * dim values of d, over every sample, pixel and channel,
 * with double-precision accumulation (two passes). Both outputs are zeroed on
 * entry. Errors: STRATA_EINVAL when an argument is NULL or d holds no values. */
int strata_dataset_stats(const strata_dataset *d, double *mean, double *std);

#endif
