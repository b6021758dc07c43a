/* strata-tool: the dispatcher — the command list and main(), which runs a
 * command through its descriptor. It depends only on the descriptors. */
#include "tool.h"

#include "strata/log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const tool_command *const COMMANDS[] = {
    &TOOL_INFO,     &TOOL_TRAIN,  &TOOL_EVAL,    &TOOL_PARTITION,
    &TOOL_COMPRESS, &TOOL_DECODE, &TOOL_INSPECT, &TOOL_POLICY,
};

/* Continuation lines of the command list start at this column. */
#define INDENT 9

static void usage(FILE *f)
{
    fputs("usage: strata-tool COMMAND [OPTIONS]\n\ncommands:\n", f);
    for (size_t i = 0; i < TOOL_COUNT(COMMANDS); i++) {
        int col = fprintf(f, "  %-6s ", COMMANDS[i]->name);
        tool_print_synopsis(f, col > 0 ? (size_t)col : 0, INDENT, COMMANDS[i]->synopsis);
        fprintf(f, "\n%*s%s\n", INDENT, "", COMMANDS[i]->help);
    }
    fputs("\nRun 'strata-tool COMMAND --help' for a command's options.\n", f);
}

/* Runs cmd with its command line (argv[0] is its name); returns a
 * TOOL_EXIT_* code. */
static int run_command(const tool_command *cmd, int argc, char **argv)
{
    void *o = calloc(1, cmd->size ? cmd->size : 1);
    if (o == NULL) {
        strata_log_error("out of memory");
        return TOOL_EXIT_FAIL;
    }
    if (cmd->defaults != NULL)
        memcpy(o, cmd->defaults, cmd->size);
    const char *arg = NULL;
    int done, code = tool_parse(cmd, argc, argv, o, &arg, &done);
    if (!done)
        code = cmd->run(o, arg);
    strata_opts_cleanup(cmd->opts, cmd->nopts, o);
    free(o);
    return code;
}

int main(int argc, char **argv)
{
    strata_log_setup("strata-tool", STRATA_LOG_INFO, STRATA_LOG_TEXT);
    if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? TOOL_EXIT_USAGE : TOOL_EXIT_OK;
    }
    for (size_t i = 0; i < TOOL_COUNT(COMMANDS); i++)
        if (strcmp(argv[1], COMMANDS[i]->name) == 0)
            return run_command(COMMANDS[i], argc - 1, argv + 1);
    fprintf(stderr, "strata-tool: unknown command '%s'\n\n", argv[1]);
    usage(stderr);
    return TOOL_EXIT_USAGE;
}
