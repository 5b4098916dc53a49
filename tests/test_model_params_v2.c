/*
 * test_model_params_v2.c - the dsq_model_params fields of 0.2.0
 * (quantize, quantize_head, tp_*) and dsq_tp_unique_id(): defaults, values
 * refused before anything is loaded, and a combination the library cannot
 * do (tensor parallelism of quantized weights) reported as
 * DSQ_ERR_UNSUPPORTED with a message (never a silent ignore).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

static dsq_status load_with(const dsq_model_params *p)
{
    char *dir = dsq_test_path("tiny");
    dsq_model *m = (dsq_model *)dir; /* must be cleared on failure */
    dsq_status st = dsq_model_load(dir, p, &m);
    if (st == DSQ_OK)
        dsq_model_free(m);
    else
        assert_null(m);
    free(dir);
    return st;
}

static void test_defaults(void **state)
{
    (void)state;
    dsq_model_params p = dsq_model_default_params();
    assert_int_equal(p.quantize, DSQ_QUANTIZE_NONE);
    assert_int_equal(p.quantize_head, 0);
    assert_int_equal(p.tp_world, 0);
    assert_null(p.tp_devices);
    assert_int_equal(p.tp_rank, 0);
    assert_null(p.tp_id);
    assert_true(p.tp_timeout_s == 0.0f);
    p.backend = DSQ_BACKEND_CPU;
    p.load_tokenizer = 0;
    assert_int_equal(load_with(&p), DSQ_OK);
    p.tp_world = 1; /* degree 1 is no tensor parallelism */
    assert_int_equal(load_with(&p), DSQ_OK);
}

static void test_refused(void **state)
{
    (void)state;
    dsq_model_params p = dsq_model_default_params();
    p.backend = DSQ_BACKEND_CPU;
    p.load_tokenizer = 0;
    p.quantize = 3;
    assert_int_equal(load_with(&p), DSQ_ERR_INVALID_ARG);
    assert_non_null(strstr(dsq_last_error_message(), "quantize"));
    p.quantize = DSQ_QUANTIZE_NONE;
    p.quantize_head = 2;
    assert_int_equal(load_with(&p), DSQ_ERR_INVALID_ARG);
    p.quantize_head = 0;
    p.tp_world = -1;
    assert_int_equal(load_with(&p), DSQ_ERR_INVALID_ARG);
    p.tp_world = 2;
    p.tp_rank = 2; /* no tp_devices: one process per rank, rank out of range */
    assert_int_equal(load_with(&p), DSQ_ERR_INVALID_ARG);
    p.tp_world = 0;
    p.tp_rank = 0;
    p.tp_timeout_s = -1.0f;
    assert_int_equal(load_with(&p), DSQ_ERR_INVALID_ARG);
}

/* the rank slicing reads bf16/f16/f32 tensors: tensor parallelism of
 * quantized weights is refused, not run wrong */
static void test_tp_of_quantized_refused(void **state)
{
    (void)state;
    dsq_model_params p = dsq_model_default_params();
    p.backend = DSQ_BACKEND_CPU;
    p.load_tokenizer = 0;
    p.tp_world = 2;
    assert_int_equal(load_with(&p), DSQ_OK); /* the CPU verification mode */
    p.quantize = DSQ_QUANTIZE_INT8;
    assert_int_equal(load_with(&p), DSQ_ERR_UNSUPPORTED);
    assert_non_null(strstr(dsq_last_error_message(), "quantized"));
}

static void test_tp_unique_id(void **state)
{
    (void)state;
    unsigned char id[DSQ_TP_ID_BYTES];
    assert_int_equal(dsq_tp_unique_id(NULL, sizeof id), DSQ_ERR_INVALID_ARG);
    assert_int_equal(dsq_tp_unique_id(id, sizeof id - 1), DSQ_ERR_INVALID_ARG);
    dsq_status st = dsq_tp_unique_id(id, sizeof id);
    /* OK where NCCL can be opened; else UNSUPPORTED saying why */
    printf("  dsq_tp_unique_id: %s %s\n", dsq_status_string(st), st ? dsq_last_error_message() : "");
    if (st != DSQ_OK) {
        assert_int_equal(st, DSQ_ERR_UNSUPPORTED);
        assert_true(strlen(dsq_last_error_message()) > 10);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_refused),
        cmocka_unit_test(test_tp_of_quantized_refused),
        cmocka_unit_test(test_tp_unique_id),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
