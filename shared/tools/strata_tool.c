/* strata-tool: the dispatcher — the command table and main(). It depends
 * only on the sub-commands' entry points. */
#include "tool.h"

#include "strata/log.h"

#include <stdio.h>
#include <string.h>

typedef struct tool_command {
    const char *name;
    const char *help;                  /* one line: what the command does */
    int (*run)(int argc, char **argv); /* argv[0] is the command's name */
    const char *usage;                 /* the options' synopsis */
} tool_command;

/* Continuation lines of a synopsis are indented under the first. */
#define CONT "\n         "

static const tool_command COMMANDS[] = {
    {"info", "print the parameter tensors and the total parameter count", tool_info,
     "--model NAME|ARCH.json|CKPT.safetensors [--json]"},
    {"train", "train centrally and print per-epoch test accuracy", tool_train,
     "--model NAME|ARCH.json --data DIR --epochs N [--threads T] [--seed S]" CONT
     "[--batch B] [--lr LR] [--momentum M] [--weight-decay WD] [--nesterov]" CONT
     "[--schedule cosine|constant] [--limit N] [--normalize auto|none|MEAN,STD]" CONT
     "[--out CKPT.safetensors] [--json]"},
    {"eval", "evaluate a checkpoint on the test split of a data set", tool_eval,
     "--model CKPT.safetensors --data DIR [--threads T] [--json]"},
    {"partition", "print the per-client label histogram of a partition of the training split",
     tool_partition,
     "--data DIR [--clients N] [--partition iid|dirichlet:ALPHA|shards:S] [--seed S]"},
    {"compress", "compress tensors into a payload with a budget policy and error feedback",
     tool_compress,
     "--in MODEL_OR_DELTA.safetensors --policy SPEC --density D [--values fp32|fp16|bf16]" CONT
     "--out P.bin [--residual R.safetensors] [--round R] [--rounds T] [--seed S]" CONT
     "[--level L] [--client-id C] [--model-version V] [--samples N]"},
    {"decode", "decode a payload back to dense tensors", tool_decode,
     "--in P.bin --out DENSE.safetensors"},
    {"inspect", "print a payload's header and per-layer compressor, kept elements and bytes",
     tool_inspect, "P.bin [--json]"},
    {"policy", "print the per-layer density table of every phase, kept elements vs uniform",
     tool_policy, "--model NAME|ARCH.json --policy SPEC --density D --rounds T [--json]"},
};

#define NCOMMANDS (sizeof(COMMANDS) / sizeof(COMMANDS[0]))

static void usage(FILE *f)
{
    fputs("usage: strata-tool COMMAND [OPTIONS]\n\ncommands:\n", f);
    for (size_t i = 0; i < NCOMMANDS; i++)
        fprintf(f, "  %-6s %s" CONT "%s\n", COMMANDS[i].name, COMMANDS[i].usage, COMMANDS[i].help);
    fputs("\nRun 'strata-tool COMMAND --help' for a command's options.\n", f);
}

int main(int argc, char **argv)
{
    strata_log_setup("strata-tool", STRATA_LOG_INFO, STRATA_LOG_TEXT);
    if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? TOOL_EXIT_USAGE : TOOL_EXIT_OK;
    }
    for (size_t i = 0; i < NCOMMANDS; i++)
        if (strcmp(argv[1], COMMANDS[i].name) == 0)
            return COMMANDS[i].run(argc - 1, argv + 1);
    fprintf(stderr, "strata-tool: unknown command '%s'\n\n", argv[1]);
    usage(stderr);
    return TOOL_EXIT_USAGE;
}
