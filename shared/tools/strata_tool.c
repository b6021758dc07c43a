#include <stdio.h>
int main(void)
{
    puts("strata-tool");
    return 0;
}
