/* strata-sim: runs a whole federation on one machine. Not implemented yet
 * (it needs the coordinator and the edge client); this binary reports that
 * plainly. Centralised training is available as `strata-tool train`. */
#include <stdio.h>
#include <string.h>

int main(int argc, char **argv)
{
    if (argc > 1 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0)) {
        puts("usage: strata-sim (not implemented yet: a simulated federation on one machine;\n"
             "       use 'strata-tool train' for centralised training)");
        return 0;
    }
    fputs("strata-sim: the simulated federation is not implemented yet; use 'strata-tool train' "
          "for centralised training\n",
          stderr);
    return 2;
}
