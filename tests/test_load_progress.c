/*
 * test_load_progress.c - the model-load progress callback
 * (dsq_model_params.progress): fractions in [0, 1], never decreasing, one
 * report per layer placed, 1 at the end; a nonzero return at any report
 * cancels the load with DSQ_ERR_CANCELLED and leaves nothing behind (ASan
 * checks the leaks); params of the first ABI size (no progress fields) still
 * load.  Also the build-feature queries.  On the tiny model (2 layers), CPU
 * backend, and on CUDA when a GPU is usable.
 */
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct rec {
    float f[256];
    int n;
    int cancel_at; /* return nonzero at this report (1-based); 0 = never */
} rec;

static int record(float fraction, void *user)
{
    rec *r = user;
    if (r->n < 256)
        r->f[r->n] = fraction;
    r->n++;
    return r->cancel_at && r->n == r->cancel_at;
}

static void check_backend(int32_t backend)
{
    char *dir = dsq_test_path("tiny");
    dsq_model_params mp = dsq_model_default_params();
    mp.backend = backend;
    rec r;
    memset(&r, 0, sizeof r);
    mp.progress = record;
    mp.progress_user = &r;
    dsq_model *m = NULL;
    assert_int_equal(dsq_model_load(dir, &mp, &m), DSQ_OK);
    assert_non_null(m);
    dsq_model_info info = { .struct_size = sizeof info };
    assert_int_equal(dsq_model_get_info(m, &info), DSQ_OK);
    dsq_model_free(m);

    /* a few parse/check points + one per layer + the end */
    assert_true(r.n >= info.n_layers + 2);
    assert_true(r.n < 256);
    assert_true(r.f[0] == 0.0f);
    assert_true(r.f[r.n - 1] == 1.0f);
    for (int i = 1; i < r.n; i++) {
        assert_true(r.f[i] >= r.f[i - 1]);
        assert_true(r.f[i] <= 1.0f);
    }

    /* cancel at every report in turn */
    const int total = r.n;
    for (int k = 1; k <= total; k++) {
        memset(&r, 0, sizeof r);
        r.cancel_at = k;
        m = (dsq_model *)&r; /* must be reset to NULL */
        assert_int_equal(dsq_model_load(dir, &mp, &m), DSQ_ERR_CANCELLED);
        assert_null(m);
        assert_int_equal(r.n, k); /* no report after the cancel */
        assert_non_null(strstr(dsq_last_error_message(), "cancelled"));
    }
    free(dir);
}

static void test_progress_cpu(void **state)
{
    (void)state;
    check_backend(DSQ_BACKEND_CPU);
}

static void test_progress_cuda(void **state)
{
    (void)state;
    if (!dsq_backend_available(DSQ_BACKEND_CUDA)) {
        printf("SKIP part: no usable CUDA device; CUDA upload progress not checked here\n");
        return;
    }
    check_backend(DSQ_BACKEND_CUDA);
}

/* A caller built against the first dsq_model_params (20 bytes, no progress
 * fields) still loads, with no callback. */
static void test_v1_params(void **state)
{
    (void)state;
    char *dir = dsq_test_path("tiny");
    dsq_model_params mp;
    memset(&mp, 0xAB, sizeof mp); /* bytes past struct_size must be ignored */
    uint32_t v1 = (uint32_t)(offsetof(dsq_model_params, load_tokenizer) + sizeof(int32_t));
    assert_int_equal(dsq_model_params_init(&mp, v1), DSQ_OK);
    mp.backend = DSQ_BACKEND_CPU;
    dsq_model *m = NULL;
    assert_int_equal(dsq_model_load(dir, &mp, &m), DSQ_OK);
    dsq_model_free(m);
    mp.struct_size = v1 - 4;
    assert_int_equal(dsq_model_load(dir, &mp, &m), DSQ_ERR_STRUCT_SIZE);
    free(dir);
}

static void test_build_features(void **state)
{
    (void)state;
    const char *f = dsq_build_features();
    assert_non_null(f);
    assert_true(strncmp(f, "cpu", 3) == 0);
    assert_int_equal(dsq_backend_available(DSQ_BACKEND_CPU), 1);
    assert_int_equal(dsq_backend_available(DSQ_BACKEND_AUTO), 1);
    assert_int_equal(dsq_backend_available((dsq_backend)7), 0);
    assert_int_equal(dsq_backend_available((dsq_backend)-1), 0);
    if (!strstr(f, "cuda"))
        assert_int_equal(dsq_backend_available(DSQ_BACKEND_CUDA), 0);
    /* what loading says agrees with the query */
    char *dir = dsq_test_path("tiny");
    dsq_model_params mp = dsq_model_default_params();
    mp.backend = DSQ_BACKEND_CUDA;
    dsq_model *m = NULL;
    dsq_status st = dsq_model_load(dir, &mp, &m);
    assert_int_equal(st == DSQ_OK, dsq_backend_available(DSQ_BACKEND_CUDA));
    if (st != DSQ_OK)
        assert_int_equal(st, DSQ_ERR_NO_DEVICE);
    dsq_model_free(m);
    free(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_progress_cpu),
        cmocka_unit_test(test_progress_cuda),
        cmocka_unit_test(test_v1_params),
        cmocka_unit_test(test_build_features),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
