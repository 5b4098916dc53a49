/* testutil.c - shared helpers for the CMocka tests. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

const char *dsq_test_data_dir(void)
{
    const char *d = getenv("DSQ_TEST_DATA");
    return d && *d ? d : DSQ_TEST_DATA;
}

char *dsq_test_path(const char *rel)
{
    const char *d = dsq_test_data_dir();
    char *s = malloc(strlen(d) + strlen(rel) + 2);
    sprintf(s, "%s/%s", d, rel);
    return s;
}

void *dsq_test_read(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    if (buf) {
        buf[n] = 0;
        if (len)
            *len = (size_t)n;
    }
    return buf;
}

double dsq_rel_err(const float *a, const float *ref, size_t n)
{
    double md = 0, mr = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)ref[i]);
        if (d > md || isnan(d))
            md = isnan(d) ? INFINITY : d;
        if (fabs(ref[i]) > mr)
            mr = fabs(ref[i]);
    }
    return mr > 0 ? md / mr : md;
}

size_t dsq_argmax(const float *x, size_t n)
{
    size_t best = 0;
    for (size_t i = 1; i < n; i++)
        if (x[i] > x[best])
            best = i;
    return best;
}
