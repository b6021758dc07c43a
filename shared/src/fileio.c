#include "strata/fileio.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

int strata_file_write_all(int fd, const void *data, size_t n, strata_diag *diag)
{
    const uint8_t *p = data;
    if (fd < 0 || (p == NULL && n > 0))
        return strata_diag_set(diag, STRATA_EINVAL, "write: bad argument");
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            int e = errno;
            strata_diag_set(diag, STRATA_EIO, "write: %s", strerror(e));
            errno = e;
            return STRATA_EIO;
        }
        p += w;
        n -= (size_t)w;
    }
    return STRATA_OK;
}

int strata_file_fsync_dir(const char *path, strata_diag *diag)
{
    if (path == NULL)
        return strata_diag_set(diag, STRATA_EINVAL, "fsync directory: NULL path");
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return strata_diag_set(diag, STRATA_EIO, "open directory %s: %s", path, strerror(errno));
    /* Some file systems cannot fsync a directory and say EINVAL. */
    int rc = STRATA_OK;
    if (fsync(fd) < 0 && errno != EINVAL)
        rc = strata_diag_set(diag, STRATA_EIO, "fsync directory %s: %s", path, strerror(errno));
    close(fd);
    return rc;
}

int strata_file_read_all(const char *path, size_t max, uint8_t **out, size_t *len,
                         strata_diag *diag)
{
    if (out != NULL)
        *out = NULL;
    if (len != NULL)
        *len = 0;
    if (path == NULL || out == NULL || len == NULL)
        return strata_diag_set(diag, STRATA_EINVAL, "read: NULL argument");
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        if (errno == ENOENT)
            return strata_diag_set(diag, STRATA_ESTATE, "%s: no such file", path);
        return strata_diag_set(diag, STRATA_EIO, "%s: %s", path, strerror(errno));
    }
    int rc = STRATA_OK;
    uint8_t *buf = NULL;
    struct stat st;
    if (fstat(fd, &st) < 0) {
        rc = strata_diag_set(diag, STRATA_EIO, "%s: %s", path, strerror(errno));
        goto out;
    }
    if (!S_ISREG(st.st_mode)) {
        rc = strata_diag_set(diag, STRATA_EIO, "%s: not a regular file", path);
        goto out;
    }
    if ((uint64_t)st.st_size > max || (uint64_t)st.st_size >= SIZE_MAX) {
        rc = strata_diag_set(diag, STRATA_ETOOBIG, "%s: %lld bytes, more than the limit %zu", path,
                             (long long)st.st_size, max);
        goto out;
    }
    size_t n = (size_t)st.st_size, got = 0;
    buf = malloc(n + 1);
    if (buf == NULL) {
        rc = strata_diag_set(diag, STRATA_ENOMEM, "%s: out of memory", path);
        goto out;
    }
    /* Read one byte more than the size: a file that grew is an error. */
    while (got <= n) {
        ssize_t r = read(fd, buf + got, n + 1 - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            rc = strata_diag_set(diag, STRATA_EIO, "%s: %s", path, strerror(errno));
            goto out;
        }
        if (r == 0)
            break;
        got += (size_t)r;
    }
    if (got != n) {
        rc = strata_diag_set(diag, STRATA_EIO, "%s: changed while it was read", path);
        goto out;
    }
    buf[n] = '\0';
    *out = buf;
    *len = n;
    buf = NULL;
out:
    free(buf);
    close(fd);
    return rc;
}

/* Returns a malloc'ed copy of the directory part of path ("." when none). */
static char *dir_of(const char *path)
{
    const char *slash = strrchr(path, '/');
    if (slash == NULL)
        return strdup(".");
    if (slash == path)
        return strdup("/");
    size_t n = (size_t)(slash - path);
    char *d = malloc(n + 1);
    if (d != NULL) {
        memcpy(d, path, n);
        d[n] = '\0';
    }
    return d;
}

int strata_file_write_temp(const char *path, const void *data, size_t len, unsigned mode,
                           char **tmp, strata_diag *diag)
{
    if (tmp != NULL)
        *tmp = NULL;
    if (path == NULL || path[0] == '\0' || tmp == NULL || (data == NULL && len > 0))
        return strata_diag_set(diag, STRATA_EINVAL, "write: NULL or empty argument");
    int rc = STRATA_OK, fd = -1;
    size_t plen = strlen(path);
    char *name = malloc(plen + sizeof(".tmp.XXXXXX"));
    if (name == NULL)
        return strata_diag_set(diag, STRATA_ENOMEM, "out of memory");
    memcpy(name, path, plen);
    memcpy(name + plen, ".tmp.XXXXXX", sizeof(".tmp.XXXXXX"));
    fd = mkostemp(name, O_CLOEXEC);
    if (fd < 0) {
        rc = strata_diag_set(diag, STRATA_EIO, "open %s: %s", name, strerror(errno));
        free(name);
        return rc;
    }
    /* mkostemp creates the file 0600; apply the requested mode less the umask. */
    mode_t mask = umask(0);
    umask(mask);
    if (fchmod(fd, (mode_t)mode & ~mask) < 0 || strata_file_write_all(fd, data, len, NULL) < 0)
        rc = strata_diag_set(diag, STRATA_EIO, "write %s: %s", name, strerror(errno));
    else if (fsync(fd) < 0)
        rc = strata_diag_set(diag, STRATA_EIO, "fsync %s: %s", name, strerror(errno));
    if (close(fd) < 0 && rc == STRATA_OK)
        rc = strata_diag_set(diag, STRATA_EIO, "close %s: %s", name, strerror(errno));
    if (rc < 0) {
        unlink(name);
        free(name);
        return rc;
    }
    *tmp = name;
    return STRATA_OK;
}

int strata_file_write_atomic(const char *path, const void *data, size_t len, unsigned mode,
                             strata_diag *diag)
{
    char *tmp = NULL, *dir = NULL;
    int rc = strata_file_write_temp(path, data, len, mode, &tmp, diag);
    if (rc < 0)
        return rc;
    if ((dir = dir_of(path)) == NULL) {
        rc = strata_diag_set(diag, STRATA_ENOMEM, "out of memory");
        unlink(tmp);
    } else if (rename(tmp, path) < 0) {
        rc = strata_diag_set(diag, STRATA_EIO, "rename %s to %s: %s", tmp, path, strerror(errno));
        unlink(tmp);
    } else {
        rc = strata_file_fsync_dir(dir, diag);
    }
    free(tmp);
    free(dir);
    return rc;
}

int strata_file_read_line(const char *path, char *buf, size_t cap, size_t *len, strata_diag *diag)
{
    if (len != NULL)
        *len = 0;
    if (buf == NULL || cap < 2 || path == NULL) {
        if (buf != NULL && cap > 0)
            buf[0] = '\0';
        return strata_diag_set(diag, STRATA_EINVAL, "read line: bad argument");
    }
    buf[0] = '\0';
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return strata_diag_set(diag, errno == ENOENT ? STRATA_ESTATE : STRATA_EIO, "%s: %s", path,
                               strerror(errno));
    size_t n = fread(buf, 1, cap - 1, f);
    int err = ferror(f);
    fclose(f);
    buf[n] = '\0';
    if (err) {
        buf[0] = '\0';
        return strata_diag_set(diag, STRATA_EIO, "%s: read error", path);
    }
    size_t line = strcspn(buf, "\r\n");
    if (line == n && n == cap - 1) {
        buf[0] = '\0';
        return strata_diag_set(diag, STRATA_ETOOBIG, "%s: first line longer than %zu bytes", path,
                               cap - 2);
    }
    buf[line] = '\0';
    if (len != NULL)
        *len = line;
    return 0;
}

int strata_random_token(char out[STRATA_TOKEN_HEX + 1], strata_diag *diag)
{
    uint8_t rnd[STRATA_TOKEN_HEX / 2];
    out[0] = '\0';
    if (getrandom(rnd, sizeof(rnd), 0) != (ssize_t)sizeof(rnd))
        return strata_diag_set(diag, STRATA_EIO, "no randomness: %s", strerror(errno));
    static const char hex[] = "0123456789abcdef";
    for (size_t i = 0; i < sizeof(rnd); i++) {
        out[2 * i] = hex[rnd[i] >> 4];
        out[2 * i + 1] = hex[rnd[i] & 15];
    }
    out[STRATA_TOKEN_HEX] = '\0';
    return 0;
}
