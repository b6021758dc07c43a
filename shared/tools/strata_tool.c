/* strata-tool: inspect, train and convert models and payloads. */
#include "tool.h"

#include "strata/checkpoint.h"

#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char USAGE[] =
    "usage: strata-tool COMMAND [OPTIONS]\n"
    "\n"
    "commands:\n"
    "  info   --model NAME|ARCH.json|CKPT.safetensors [--json]\n"
    "         print the parameter tensors and the total parameter count\n"
    "  train  --model NAME|ARCH.json --data DIR --epochs N [--threads T] [--seed S]\n"
    "         [--batch B] [--lr LR] [--momentum M] [--weight-decay WD] [--nesterov]\n"
    "         [--schedule cosine|constant] [--limit N] [--normalize auto|none|MEAN,STD]\n"
    "         [--out CKPT.safetensors] [--json]\n"
    "         train centrally and print per-epoch test accuracy\n"
    "  eval   --model CKPT.safetensors --data DIR [--threads T] [--json]\n"
    "         evaluate a checkpoint on the test split of a data set\n"
    "  partition --data DIR [--clients N] [--partition iid|dirichlet:ALPHA|shards:S] [--seed S]\n"
    "         print the per-client label histogram of a partition of the training split\n"
    "  compress --in MODEL_OR_DELTA.safetensors --policy SPEC --density D [--values "
    "fp32|fp16|bf16]\n"
    "         --out P.bin [--residual R.safetensors] [--round R] [--rounds T] [--seed S]\n"
    "         compress tensors into a payload with a budget policy and error feedback\n"
    "  decode --in P.bin --out DENSE.safetensors\n"
    "         decode a payload back to dense tensors\n"
    "  inspect P.bin [--json]\n"
    "         print a payload's header and per-layer compressor, kept elements and bytes\n"
    "  policy --model NAME|ARCH.json --policy SPEC --density D --rounds T [--json]\n"
    "         print the per-layer density table of every phase, kept elements vs uniform\n"
    "\n"
    "Run 'strata-tool COMMAND --help' for a command's options.\n";

int tool_fail(int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("strata-tool: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return code;
}

int tool_is_safetensors(const char *path)
{
    size_t len = strlen(path);
    return len > 12 && strcmp(path + len - 12, ".safetensors") == 0;
}

int tool_load_model(const char *spec, strata_model **out)
{
    strata_diag d = {{0}};
    int rc;
    if (tool_is_safetensors(spec))
        rc = strata_checkpoint_load(spec, out, &d);
    else
        rc = strata_model_new(spec, out, &d);
    if (rc < 0)
        tool_fail(1, "%s", strata_diag_msg(&d, rc));
    return rc;
}

int tool_check_writable(const char *path)
{
    size_t n = strlen(path) + 16;
    char *name = malloc(n);
    if (name == NULL)
        return tool_fail(1, "out of memory");
    snprintf(name, n, "%s.tmp.XXXXXX", path);
    int fd = mkstemp(name);
    int e = errno;
    if (fd >= 0) {
        close(fd);
        unlink(name);
    }
    free(name);
    return fd >= 0 ? 0 : tool_fail(1, "cannot write %s: %s", path, strerror(e));
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

int main(int argc, char **argv)
{
    if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        fputs(USAGE, argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    const char *cmd = argv[1];
    if (strcmp(cmd, "info") == 0)
        return tool_info(argc - 1, argv + 1);
    if (strcmp(cmd, "train") == 0)
        return tool_train(argc - 1, argv + 1);
    if (strcmp(cmd, "eval") == 0)
        return tool_eval(argc - 1, argv + 1);
    if (strcmp(cmd, "partition") == 0)
        return tool_partition(argc - 1, argv + 1);
    if (strcmp(cmd, "compress") == 0)
        return tool_compress(argc - 1, argv + 1);
    if (strcmp(cmd, "decode") == 0)
        return tool_decode(argc - 1, argv + 1);
    if (strcmp(cmd, "inspect") == 0)
        return tool_inspect(argc - 1, argv + 1);
    if (strcmp(cmd, "policy") == 0)
        return tool_policy(argc - 1, argv + 1);
    fprintf(stderr, "strata-tool: unknown command '%s'\n\n%s", cmd, USAGE);
    return 2;
}
