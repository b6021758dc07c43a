/* Shared helpers for Strata's CUnit test binaries. */
#ifndef STRATA_TEST_UTIL_H
#define STRATA_TEST_UTIL_H

#include <CUnit/CUnit.h>
#include <stddef.h>

/* Registers the NULL-terminated suite array, runs every test with the basic
 * interface (standard "Run Summary" output) and returns the process exit code:
 * non-zero when any test or suite set-up failed. */
int strata_test_run(CU_SuiteInfo *suites);

/* Directory of the Fashion-MNIST files: $STRATA_DATA_DIR or the Debian
 * package's location. */
const char *strata_test_data_dir(void);

/* Creates a fresh temporary directory; returns its path (static buffer per
 * call site is the caller's job: the result is malloc'ed) or NULL. */
char *strata_test_tmpdir(void);

/* Removes a directory tree created by strata_test_tmpdir. */
void strata_test_rmtree(const char *path);

#endif
