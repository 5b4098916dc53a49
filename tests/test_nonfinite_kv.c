/* test_nonfinite_kv.c - non-finite keys reach the logits with every KV dtype
 * on the CPU backend (issue 14, defect 4).
 *
 * INT8 quantization converted NaN to int8 (undefined) and turned an Inf into
 * a scale of Inf, so a model whose K is non-finite gave all-NaN logits with
 * F32 and F16 KV but finite logits -- the clean model's greedy token -- with
 * INT8 KV.  Here the tiny model is corrupted two ways (nonfinite_models.h):
 * a NaN in a k_proj bias, and a k_proj row of 3.39e38 (every weight finite,
 * the product overflows); each runs a 12-token prompt and 3 decode steps
 * with F32, F16 and INT8 KV (static, and paged for INT8).  Expected: every
 * logit of every row is NaN (K is non-finite at every position, and every
 * query attends to position 0); the clean model: every logit finite.
 *
 * The models load with skip_finite_check set (mp_run): the load-time scan
 * for non-finite weights would refuse the NaN variant, and this test is
 * about the KV path (the scan has its own tests in test_loader_regressions). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nonfinite_models.h"

static void check_variant(int variant)
{
    char *dir = mp_make_variant(variant);
    assert_non_null(dir);
    const struct { int dtype, layout; const char *name; } runs[4] = {
        { DSQ_KV_F32, DSQ_KV_STATIC, "F32" },
        { DSQ_KV_F16, DSQ_KV_STATIC, "F16" },
        { DSQ_KV_INT8, DSQ_KV_STATIC, "INT8" },
        { DSQ_KV_INT8, DSQ_KV_PAGED, "INT8 paged" },
    };
    for (int i = 0; i < 4; i++) {
        int bad[MP_ROWS], nan_count[MP_ROWS];
        char msg[512];
        dsq_status st = mp_run(dir, DSQ_BACKEND_CPU, runs[i].dtype, runs[i].layout, bad, nan_count,
                               msg, sizeof msg);
        if (st != DSQ_OK)
            fail_msg("%s %s: %s (%s)", mp_variant_name[variant], runs[i].name, dsq_status_string(st), msg);
        int rows_all_nan = 0, rows_finite = 0;
        for (int r = 0; r < MP_ROWS; r++) {
            rows_all_nan += nan_count[r] == MP_VOCAB;
            rows_finite += bad[r] == 0;
        }
        printf("  %-10s %-10s rows all-NaN %2d/%d, rows all-finite %2d/%d\n", mp_variant_name[variant],
               runs[i].name, rows_all_nan, MP_ROWS, rows_finite, MP_ROWS);
        if (variant == MP_CLEAN)
            assert_int_equal(rows_finite, MP_ROWS);
        else
            assert_int_equal(rows_all_nan, MP_ROWS);
    }
    stw_rmtree(dir);
    free(dir);
}

static void test_clean(void **state)
{
    (void)state;
    check_variant(MP_CLEAN);
}

static void test_nan_in_k_bias(void **state)
{
    (void)state;
    check_variant(MP_NAN_BIAS);
}

static void test_k_row_overflows(void **state)
{
    (void)state;
    check_variant(MP_HUGE_K_ROW);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_clean),
        cmocka_unit_test(test_nan_in_k_bias),
        cmocka_unit_test(test_k_row_overflows),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
