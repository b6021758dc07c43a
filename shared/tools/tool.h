/* strata-tool: the sub-commands' entry points (the dispatcher's only
 * dependency) and the helpers they share (tool_util.c). */
#ifndef STRATA_TOOL_H
#define STRATA_TOOL_H

#include "strata/error.h"
#include "strata/model.h"
#include "strata/opts.h"
#include "strata/parse.h"

#include <stddef.h>

/* Process exit codes of every sub-command. */
enum {
    TOOL_EXIT_OK = 0,    /* the command did its work */
    TOOL_EXIT_FAIL = 1,  /* a runtime failure: a file, a model, the data */
    TOOL_EXIT_USAGE = 2, /* a bad command line or option value */
};

/* Sub-commands: argc/argv start at the sub-command's name. Each returns a
 * TOOL_EXIT_* code. Runtime failures are logged; usage errors are printed
 * as plain text on stderr. */
int tool_info(int argc, char **argv);
int tool_train(int argc, char **argv);
int tool_eval(int argc, char **argv);
int tool_partition(int argc, char **argv);
int tool_compress(int argc, char **argv);
int tool_decode(int argc, char **argv);
int tool_inspect(int argc, char **argv);
int tool_policy(int argc, char **argv);

/* Prints "strata-tool: <message>" and a newline on stderr (a usage error:
 * plain text, not a log line) and returns TOOL_EXIT_USAGE. */
int tool_usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Parses a sub-command's command line (argv[0] is its name) into dst with
 * the option table (n descriptors, borrowed; dst holds the defaults on
 * entry) and answers --help. *done tells the caller what to do with the
 * return value:
 *   *done 0: go on; the return value is TOOL_EXIT_OK;
 *   *done 1: return the value now: TOOL_EXIT_OK after --help printed
 *            "usage: strata-tool <cmd> <synopsis>" and the table's option
 *            lines on stdout, TOOL_EXIT_USAGE after an option error was
 *            printed on stderr (the message naming the option, then a line
 *            pointing at --help), TOOL_EXIT_FAIL when memory ran out
 *            (logged).
 * Positional arguments may stand before, between or after the options; a
 * lone "--" ends the options. A command that takes none passes arg NULL,
 * and any positional is a usage error naming it; otherwise *arg receives
 * the one positional (borrowed from argv), NULL when there is none (the
 * caller decides whether that is an error), and a second one is a usage
 * error. In every case the caller frees dst's strings with
 * strata_opts_cleanup. */
int tool_parse(const char *cmd, const char *synopsis, const strata_opt *table, size_t n, int argc,
               char **argv, void *dst, const char **arg, int *done);

/* Non-zero when path names a .safetensors file (by its suffix). */
int tool_is_safetensors(const char *path);

/* Loads a model from a built-in name, an architecture JSON file or a
 * .safetensors checkpoint into *out (NULL on entry; the caller frees it).
 * Errors: those of strata_checkpoint_load or strata_model_new, explained in
 * diag. */
int tool_load_model(const char *spec, strata_model **out, strata_diag *diag);

/* Checks that a file can be created at path (its directory exists and is
 * writable) by creating an empty temporary file beside it and removing it
 * again; nothing is left behind. Errors: those of strata_file_write_temp
 * (STRATA_EIO: diag starts "cannot write <path>: " and names the system
 * error). */
int tool_check_writable(const char *path, strata_diag *diag);

/* A one-line progress bar on stderr when it is a terminal, labelled with
 * ctx (a borrowed string, may be NULL); nothing otherwise. The signature of
 * a training progress callback; always returns 0 (continue). */
int tool_progress(void *ctx, size_t done, size_t total);

#endif
