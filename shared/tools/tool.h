/* strata-tool: the sub-commands' descriptors (the dispatcher's only
 * dependency) and the helpers they share (tool_util.c). */
#ifndef STRATA_TOOL_H
#define STRATA_TOOL_H

#include "strata/error.h"
#include "strata/model.h"
#include "strata/opts.h"
#include "strata/parse.h"

#include <stddef.h>
#include <stdio.h>

/* Process exit codes of every sub-command. */
enum {
    TOOL_EXIT_OK = 0,    /* the command did its work */
    TOOL_EXIT_FAIL = 1,  /* a runtime failure: a file, a model, the data */
    TOOL_EXIT_USAGE = 2, /* a bad command line or option value */
};

/* A sub-command: its name, its command line and what runs it. main() runs
 * one by allocating size bytes, copying defaults into them, parsing the
 * command line into them with tool_parse, calling run unless tool_parse is
 * done, and freeing the struct's strings with strata_opts_cleanup. */
typedef struct tool_command {
    const char *name;       /* as typed after strata-tool */
    const char *help;       /* one line: what the command does */
    const char *synopsis;   /* its arguments, one line: shown (wrapped by
                             * tool_print_synopsis) in the command list and
                             * by --help */
    const strata_opt *opts; /* its option table */
    size_t nopts;           /* descriptors in opts */
    size_t size;            /* bytes of the options struct opts describes */
    const void *defaults;   /* size bytes copied into it before parsing, their
                             * strings NULL; NULL: all zero */
    int takes_arg;          /* non-zero: one positional argument, passed to run
                             * (NULL when absent) */
    /* Does the work with the parsed options (the struct, borrowed) and the
     * positional argument (NULL unless takes_arg); returns a TOOL_EXIT_*
     * code. Runtime failures are logged; usage errors are printed as plain
     * text on stderr. */
    int (*run)(const void *opts, const char *arg);
} tool_command;

/* The sub-commands, defined beside their option tables and run functions
 * (tool_train.c, tool_compress.c). */
extern const tool_command TOOL_INFO, TOOL_TRAIN, TOOL_EVAL, TOOL_PARTITION;
extern const tool_command TOOL_COMPRESS, TOOL_DECODE, TOOL_INSPECT, TOOL_POLICY;

/* The number of elements of the array a. */
#define TOOL_COUNT(a) (sizeof(a) / sizeof((a)[0]))

/* Prints synopsis on f with the cursor at column col: its words separated by
 * single spaces, a bracketed group ("[--seed S]") never split, a line broken
 * before a word that would pass column 80 and continued at column indent. A
 * word longer than a line overflows it. */
void tool_print_synopsis(FILE *f, size_t col, size_t indent, const char *synopsis);

/* Prints "strata-tool: <message>" and a newline on stderr (a usage error:
 * plain text, not a log line) and returns TOOL_EXIT_USAGE. */
int tool_usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Parses cmd's command line (argv[0] is its name) into dst, its options
 * struct (holding the defaults on entry), and answers --help. *done tells
 * the caller what to do with the return value:
 *   *done 0: go on; the return value is TOOL_EXIT_OK;
 *   *done 1: return the value now: TOOL_EXIT_OK after --help printed
 *            "usage: strata-tool <name> <synopsis>" and the table's option
 *            lines on stdout, TOOL_EXIT_USAGE after an option error was
 *            printed on stderr (the message naming the option, then a line
 *            pointing at --help), TOOL_EXIT_FAIL when memory ran out
 *            (logged).
 * Positional arguments may stand before, between or after the options; a
 * lone "--" ends the options. When cmd takes none, any positional is a
 * usage error naming it (arg is unused and may be NULL); otherwise *arg
 * receives the one positional (borrowed from argv), NULL when there is none
 * (run decides whether that is an error), and a second one is a usage
 * error. In every case the caller frees dst's strings with
 * strata_opts_cleanup. */
int tool_parse(const tool_command *cmd, int argc, char **argv, void *dst, const char **arg,
               int *done);

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
