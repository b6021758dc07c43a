/* strata-tool: the helpers the sub-commands share — option parsing, usage
 * errors, the synopsis printer, model specs, the writability probe and the
 * terminal progress bar. */
#include "tool.h"

#include "strata/buf.h"
#include "strata/checkpoint.h"
#include "strata/fileio.h"
#include "strata/log.h"

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

/* Prints the line after a usage error of cmd that points at its --help;
 * returns TOOL_EXIT_USAGE. */
static int help_hint(const char *cmd)
{
    fprintf(stderr, "Run 'strata-tool %s --help' for its options.\n", cmd);
    return TOOL_EXIT_USAGE;
}

/* Prints the error of an option parse (rc, explained in d, may be NULL) for
 * cmd; returns the command's exit code. */
static int option_error(const char *cmd, int rc, const strata_diag *d)
{
    if (rc == STRATA_ENOMEM) {
        strata_log_error("out of memory");
        return TOOL_EXIT_FAIL;
    }
    tool_usage_error("%s", strata_diag_msg(d, rc));
    return help_hint(cmd);
}

/* Prints the usage error for a positional argument cmd does not take;
 * returns TOOL_EXIT_USAGE. */
static int unexpected_argument(const char *cmd, const char *arg)
{
    tool_usage_error("%s: unexpected argument '%s'", cmd, arg);
    return help_hint(cmd);
}

void tool_print_synopsis(FILE *f, size_t col, size_t indent, const char *synopsis)
{
    const size_t width = 80;
    const char *s = synopsis;
    for (int first = 1; *s != '\0'; first = 0) {
        /* The next word: up to a space outside brackets. */
        size_t n = 0;
        for (int depth = 0; s[n] != '\0' && (s[n] != ' ' || depth > 0); n++) {
            if (s[n] == '[')
                depth++;
            else if (s[n] == ']' && depth > 0)
                depth--;
        }
        if (!first && col + 1 + n > width) {
            fprintf(f, "\n%*s", (int)indent, "");
            col = indent;
        } else if (!first) {
            fputc(' ', f);
            col++;
        }
        fwrite(s, 1, n, f);
        col += n;
        for (s += n; *s == ' ';)
            s++;
    }
}

/* Prints cmd's usage text on stdout; returns the command's exit code. */
static int print_help(const tool_command *cmd)
{
    strata_buf b;
    strata_buf_init(&b, 1 << 16);
    int rc = strata_opts_usage(cmd->opts, cmd->nopts, &b);
    if (rc == STRATA_OK) {
        size_t col = strlen("usage: strata-tool ") + strlen(cmd->name) + 1;
        printf("usage: strata-tool %s ", cmd->name);
        tool_print_synopsis(stdout, col, col, cmd->synopsis);
        printf("\n%s", b.data ? (const char *)b.data : "");
    }
    strata_buf_cleanup(&b);
    if (rc < 0) {
        strata_log_error("usage text: %s", strata_strerror(rc));
        return TOOL_EXIT_FAIL;
    }
    return TOOL_EXIT_OK;
}

int tool_parse(const tool_command *cmd, int argc, char **argv, void *dst, const char **arg,
               int *done)
{
    *done = 1;
    if (!cmd->takes_arg)
        arg = NULL;
    if (arg != NULL)
        *arg = NULL;
    strata_diag d = {{0}};
    int help = 0, base = 0;
    /* Each pass parses the options after argv[base] (the command's name or
     * the positional found last) up to the next positional. */
    for (;;) {
        int rc =
            strata_opts_parse_argv(cmd->opts, cmd->nopts, argc - base, argv + base, dst, &help, &d);
        if (rc < 0)
            return option_error(cmd->name, rc, &d);
        if (help)
            return print_help(cmd);
        int i = base + rc;
        if (i >= argc)
            break;
        /* A lone "--" before it ended the options (an option's value is
         * never "--"): what follows is positional too. */
        int ended = strcmp(argv[i - 1], "--") == 0;
        if (arg == NULL || *arg != NULL)
            return unexpected_argument(cmd->name, argv[i]);
        *arg = argv[i];
        if (ended) {
            if (i + 1 < argc)
                return unexpected_argument(cmd->name, argv[i + 1]);
            break;
        }
        base = i;
    }
    *done = 0;
    return TOOL_EXIT_OK;
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
    char *tmp = NULL;
    strata_diag d = {{0}};
    int rc = strata_file_write_temp(path, NULL, 0, 0600, &tmp, &d);
    if (rc < 0)
        return strata_diag_set(diag, rc, "cannot write %s: %s", path, strata_diag_msg(&d, rc));
    unlink(tmp);
    free(tmp);
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
