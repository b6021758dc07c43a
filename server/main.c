/* strata-server: the coordinator. Not implemented yet; this binary reports
 * that plainly instead of pretending to work. */
#include <stdio.h>
#include <string.h>

int main(int argc, char **argv)
{
    if (argc > 1 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0)) {
        puts("usage: strata-server (not implemented yet: the federation coordinator)");
        return 0;
    }
    fputs("strata-server: the coordinator is not implemented yet\n", stderr);
    return 2;
}
