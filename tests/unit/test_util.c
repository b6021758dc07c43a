#include "test_util.h"

#include <CUnit/Basic.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int strata_test_run(CU_SuiteInfo *suites)
{
    if (CU_initialize_registry() != CUE_SUCCESS)
        return 2;
    if (CU_register_suites(suites) != CUE_SUCCESS) {
        fprintf(stderr, "suite registration failed: %s\n", CU_get_error_msg());
        CU_cleanup_registry();
        return 2;
    }
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    unsigned failed = CU_get_number_of_tests_failed() + CU_get_number_of_suites_failed();
    unsigned ran = CU_get_number_of_tests_run();
    CU_cleanup_registry();
    if (ran == 0) {
        fprintf(stderr, "no test ran\n");
        return 1;
    }
    return failed > 0 ? 1 : 0;
}

const char *strata_test_data_dir(void)
{
    const char *d = getenv("STRATA_DATA_DIR");
    return (d && *d) ? d : "/usr/share/datasets/fashion-mnist";
}

char *strata_test_tmpdir(void)
{
    const char *base = getenv("TMPDIR");
    char tmpl[512];
    snprintf(tmpl, sizeof(tmpl), "%s/strata-test-XXXXXX", (base && *base) ? base : "/tmp");
    if (mkdtemp(tmpl) == NULL)
        return NULL;
    return strdup(tmpl);
}

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(path);
}

void strata_test_rmtree(const char *path)
{
    if (path != NULL)
        nftw(path, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}
