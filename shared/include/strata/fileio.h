/* Files: capped whole-file reads, durable (atomic) writes, small secret
 * files and random tokens. */
#ifndef STRATA_FILEIO_H
#define STRATA_FILEIO_H

#include "strata/error.h"

#include <stddef.h>
#include <stdint.h>

/* The first phase of a durable write, for callers that publish later (or
 * several files at once): writes len bytes of data (borrowed) to a new
 * temporary file beside path ("<path>.tmp.XXXXXX") with mode (less the
 * umask), fsyncs and closes it. *tmp receives its name (malloc'ed); the
 * caller publishes it with rename(*tmp, path) followed by
 * strata_file_fsync_dir of the directory, or unlinks it, and frees the name.
 * Errors: STRATA_EINVAL for a NULL or empty argument, STRATA_ENOMEM,
 * STRATA_EIO when a system call fails (diag names it and the file; nothing
 * is left behind). *tmp is NULL on error. */
int strata_file_write_temp(const char *path, const void *data, size_t len, unsigned mode,
                           char **tmp, strata_diag *diag);

/* Writes len bytes of data (borrowed) to path atomically: they go to a new
 * temporary file beside it ("<path>.tmp.XXXXXX"), which gets mode (less the
 * umask), is fsync'ed and renamed over path; then the directory is fsync'ed.
 * A crash leaves either the old file or the complete new one at path, and
 * concurrent writers never share a temporary file (the last rename wins).
 * Both phases in one call (strata_file_write_temp, rename, directory
 * fsync). Errors: STRATA_EINVAL for a NULL or empty argument, STRATA_ENOMEM,
 * and STRATA_EIO when a system call fails (diag names it and the path; the
 * temporary file is removed; after a failed directory fsync the new file is
 * already in place). */
int strata_file_write_atomic(const char *path, const void *data, size_t len, unsigned mode,
                             strata_diag *diag);

/* Writes all n bytes of data (borrowed) to the open descriptor fd, retrying
 * short writes and EINTR. Errors: STRATA_EINVAL (fd < 0, or NULL data with
 * n > 0), STRATA_EIO when write fails (errno is left as write set it; diag
 * names the system error). Does not fsync. */
int strata_file_write_all(int fd, const void *data, size_t n, strata_diag *diag);

/* fsyncs the directory at path so that entries created, renamed or removed
 * in it are durable; a file system that cannot fsync a directory (EINVAL) is
 * accepted. Errors: STRATA_EINVAL (NULL path), STRATA_EIO when the directory
 * cannot be opened or fsync'ed (diag names it). */
int strata_file_fsync_dir(const char *path, strata_diag *diag);

/* Reads the whole regular file at path into a new buffer (*out, free();
 * NUL-terminated after its *len bytes, so text can be used as a string).
 * The size is checked against max before anything is allocated, and the
 * read must give exactly the size the file had when opened. Errors:
 * STRATA_EINVAL (NULL argument), STRATA_ESTATE when the file does not
 * exist, STRATA_ETOOBIG when it has more than max bytes, STRATA_EIO when it
 * is not a regular file or cannot be read (diag names the path and the
 * system error), STRATA_ENOMEM. Out-parameters are zeroed on entry. */
int strata_file_read_all(const char *path, size_t max, uint8_t **out, size_t *len,
                         strata_diag *diag);

/* Reads the first line of the small file at path into buf (cap bytes, at
 * least 2) without its "\n" or "\r\n", NUL-terminated; *len (may be NULL)
 * receives its length. For secrets and tokens kept in files. Errors:
 * STRATA_EINVAL (NULL argument, cap < 2), STRATA_ESTATE when the file does
 * not exist, STRATA_EIO when it cannot be read, STRATA_ETOOBIG when the
 * first line has cap or more bytes; buf is "" on error. */
int strata_file_read_line(const char *path, char *buf, size_t cap, size_t *len, strata_diag *diag);

/* Number of hex characters of a token from strata_random_token. */
#define STRATA_TOKEN_HEX 64

/* Writes 256 bits from the operating system's random source as 64
 * lower-case hex characters and a NUL to out. Errors: STRATA_EIO (no
 * randomness; out is ""). */
int strata_random_token(char out[STRATA_TOKEN_HEX + 1], strata_diag *diag);

#endif
