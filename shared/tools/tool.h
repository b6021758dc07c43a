/* strata-tool: the sub-commands' entry points (the dispatcher's only
 * dependency) and the helpers they share (tool_util.c). */
#ifndef STRATA_TOOL_H
#define STRATA_TOOL_H

#include "strata/error.h"
#include "strata/model.h"
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

/* Non-zero when path names a .safetensors file (by its suffix). */
int tool_is_safetensors(const char *path);

/* Loads a model from a built-in name, an architecture JSON file or a
 * .safetensors checkpoint into *out (NULL on entry; the caller frees it).
 * Errors: those of strata_checkpoint_load or strata_model_new, explained in
 * diag. */
int tool_load_model(const char *spec, strata_model **out, strata_diag *diag);

/* Checks that a file can be created at path (its directory exists and is
 * writable) without leaving anything behind. Errors: STRATA_ENOMEM,
 * STRATA_EIO (diag names the path and the system error). */
int tool_check_writable(const char *path, strata_diag *diag);

/* A one-line progress bar on stderr when it is a terminal, labelled with
 * ctx (a borrowed string, may be NULL); nothing otherwise. The signature of
 * a training progress callback; always returns 0 (continue). */
int tool_progress(void *ctx, size_t done, size_t total);

#endif
