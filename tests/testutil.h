/* testutil.h - shared helpers for the CMocka tests. */
#ifndef DSQ_TESTUTIL_H
#define DSQ_TESTUTIL_H
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "dsqwen.h"

/* Directory of committed fixtures (tests/data), from $DSQ_TEST_DATA or the
 * build-time default. */
const char *dsq_test_data_dir(void);
/* malloc'ed path dsq_test_data_dir()/rel */
char *dsq_test_path(const char *rel);
/* Read a whole file; NULL on failure.  *len may be NULL. */
void *dsq_test_read(const char *path, size_t *len);
/* max|a-b| / max|ref| */
double dsq_rel_err(const float *a, const float *ref, size_t n);
size_t dsq_argmax(const float *x, size_t n);
/* Exit code ctest treats as "skipped". */
#define DSQ_TEST_SKIP 77
#endif
