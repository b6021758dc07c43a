/* Durable file writes. */
#ifndef STRATA_FILEIO_H
#define STRATA_FILEIO_H

#include "strata/error.h"

#include <stddef.h>

/* Writes len bytes of data (borrowed) to path atomically: they go to a new
 * temporary file beside it ("<path>.tmp.XXXXXX"), which gets mode (less the
 * umask), is fsync'ed and renamed over path; then the directory is fsync'ed.
 * A crash leaves either the old file or the complete new one at path, and
 * concurrent writers never share a temporary file (the last rename wins).
 * Errors: STRATA_EINVAL for a NULL or empty argument, STRATA_ENOMEM, and
 * STRATA_EIO when a system call fails (diag names it and the path; the
 * temporary file is removed; after a failed directory fsync the new file is
 * already in place). */
int strata_file_write_atomic(const char *path, const void *data, size_t len, unsigned mode,
                             strata_diag *diag);

#endif
