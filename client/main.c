/* strata-client: the edge client. The federation protocol (register, poll,
 * train, compress, upload) is not implemented yet; this binary reports that
 * plainly instead of pretending to work. */
#include <stdio.h>
#include <string.h>

int main(int argc, char **argv)
{
    if (argc > 1 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0)) {
        puts("usage: strata-client (not implemented yet: the edge client of the federation)");
        return 0;
    }
    fputs("strata-client: the edge client is not implemented yet\n", stderr);
    return 2;
}
