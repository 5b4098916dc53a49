/* test_cuda_nonfinite.c - non-finite keys on the CUDA backend give the same
 * non-finite logits as on the CPU (issue 14, defect 4).
 *
 * Measured before the fix on the H200: with a NaN in a k_proj bias of the
 * tiny model, F16 and INT8 KV both returned finite logits with DSQ_OK (the
 * F16 KV store saturated NaN to -65504, the INT8 absmax dropped NaN, the
 * decode merge turned a NaN sum into 0), while the CPU gave all-NaN logits.
 *
 * For each corrupted variant of the tiny model (nonfinite_models.h: a NaN in
 * the layer-0 k_proj bias; a layer-0 k_proj row of 3.39e38 whose product
 * overflows) and the clean model, the CPU backend with F32 KV is the
 * reference; the GPU runs F16 and INT8 KV, static and paged.  Per output row
 * (12 prompt rows, 3 decode steps) the GPU row must be non-finite exactly
 * when the CPU row is, and for the corrupted models every logit must be NaN.
 * The models load with skip_finite_check set (mp_run), so the NaN variant
 * reaches the KV path instead of being refused by the load-time scan.
 * Exits 77 (skipped) without a CUDA build or device. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "nonfinite_models.h"

#ifdef DSQ_HAVE_CUDA
static void check_variant(int variant)
{
    char *dir = mp_make_variant(variant);
    assert_non_null(dir);
    int cpu_bad[MP_ROWS], cpu_nan[MP_ROWS];
    char msg[512];
    dsq_status st = mp_run(dir, DSQ_BACKEND_CPU, DSQ_KV_F32, DSQ_KV_STATIC, cpu_bad, cpu_nan, msg,
                           sizeof msg);
    if (st != DSQ_OK)
        fail_msg("CPU %s: %s (%s)", mp_variant_name[variant], dsq_status_string(st), msg);
    const struct { int dtype, layout; const char *name; } runs[4] = {
        { DSQ_KV_F16, DSQ_KV_STATIC, "F16 static" },
        { DSQ_KV_F16, DSQ_KV_PAGED, "F16 paged" },
        { DSQ_KV_INT8, DSQ_KV_STATIC, "INT8 static" },
        { DSQ_KV_INT8, DSQ_KV_PAGED, "INT8 paged" },
    };
    for (int i = 0; i < 4; i++) {
        int bad[MP_ROWS], nan_count[MP_ROWS];
        st = mp_run(dir, DSQ_BACKEND_CUDA, runs[i].dtype, runs[i].layout, bad, nan_count, msg,
                    sizeof msg);
        if (st != DSQ_OK)
            fail_msg("GPU %s %s: %s (%s)", mp_variant_name[variant], runs[i].name,
                     dsq_status_string(st), msg);
        int agree = 0, all_nan = 0, finite = 0;
        for (int r = 0; r < MP_ROWS; r++) {
            agree += (bad[r] > 0) == (cpu_bad[r] > 0);
            all_nan += nan_count[r] == MP_VOCAB;
            finite += bad[r] == 0;
        }
        printf("  %-10s GPU %-11s rows: non-finite as on the CPU %2d/%d, all-NaN %2d, "
               "all-finite %2d\n", mp_variant_name[variant], runs[i].name, agree, MP_ROWS, all_nan,
               finite);
        assert_int_equal(agree, MP_ROWS);
        if (variant == MP_CLEAN)
            assert_int_equal(finite, MP_ROWS);
        else
            assert_int_equal(all_nan, MP_ROWS);
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
#endif

int main(void)
{
#ifndef DSQ_HAVE_CUDA
    printf("SKIP: no CUDA device (built without CUDA)\n");
    return DSQ_TEST_SKIP;
#else
    if (!dsq_cuda_available()) {
        printf("SKIP: no CUDA device\n");
        return DSQ_TEST_SKIP;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_clean),
        cmocka_unit_test(test_nan_in_k_bias),
        cmocka_unit_test(test_k_row_overflows),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
#endif
}
