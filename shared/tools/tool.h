/* strata-tool: shared helpers of the sub-commands. */
#ifndef STRATA_TOOL_H
#define STRATA_TOOL_H

#include "strata/model.h"
#include "strata/parse.h"

#include <stdio.h>

/* Every sub-command: argc/argv start at the sub-command's name. Returns the
 * process exit code (0 ok, 1 runtime failure, 2 usage error). */
int tool_info(int argc, char **argv);
int tool_train(int argc, char **argv);
int tool_eval(int argc, char **argv);
int tool_partition(int argc, char **argv);
int tool_compress(int argc, char **argv);
int tool_decode(int argc, char **argv);
int tool_inspect(int argc, char **argv);
int tool_policy(int argc, char **argv);

/* Prints "strata-tool: <msg>" to stderr; returns 1 (or 2 for usage). */
int tool_fail(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Non-zero when path names a .safetensors file. */
int tool_is_safetensors(const char *path);

/* Loads a model from a built-in name, an architecture JSON file or a
 * .safetensors checkpoint. */
int tool_load_model(const char *spec, strata_model **out);

/* Checks that a file can be created at path (its directory exists and is
 * writable) without leaving anything behind; prints an error and returns
 * non-zero otherwise. */
int tool_check_writable(const char *path);

/* A one-line progress bar on stderr when it is a terminal. */
int tool_progress(void *ctx, size_t done, size_t total);

#endif
