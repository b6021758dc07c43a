/* strata-tool: the helpers the sub-commands share — usage errors, model
 * specs, the writability probe and the terminal progress bar. */
#include "tool.h"

#include "strata/checkpoint.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int tool_usage_error(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("strata-tool: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return TOOL_EXIT_USAGE;
}

int tool_is_safetensors(const char *path)
{
    size_t len = strlen(path);
    return len > 12 && strcmp(path + len - 12, ".safetensors") == 0;
}

int tool_load_model(const char *spec, strata_model **out, strata_diag *diag)
{
    if (tool_is_safetensors(spec))
        return strata_checkpoint_load(spec, out, diag);
    return strata_model_new(spec, out, diag);
}

int tool_check_writable(const char *path, strata_diag *diag)
{
    size_t n = strlen(path) + 16;
    char *name = malloc(n);
    if (name == NULL)
        return strata_diag_set(diag, STRATA_ENOMEM, "out of memory");
    snprintf(name, n, "%s.tmp.XXXXXX", path);
    int fd = mkstemp(name);
    int e = errno;
    if (fd >= 0) {
        close(fd);
        unlink(name);
    }
    free(name);
    if (fd < 0)
        return strata_diag_set(diag, STRATA_EIO, "cannot write %s: %s", path, strerror(e));
    return STRATA_OK;
}

int tool_progress(void *ctx, size_t done, size_t total)
{
    const char *label = ctx;
    static int tty = -1;
    if (tty < 0)
        tty = isatty(STDERR_FILENO);
    if (!tty || total == 0)
        return 0;
    const int width = 30;
    int filled = (int)((double)done / (double)total * width);
    char bar[64];
    for (int i = 0; i < width; i++)
        bar[i] = i < filled ? '#' : '.';
    bar[width] = '\0';
    fprintf(stderr, "\r%s [%s] %5.1f%%", label ? label : "", bar,
            100.0 * (double)done / (double)total);
    if (done >= total)
        fputs("\r\033[K", stderr);
    fflush(stderr);
    return 0;
}
