/*
 * test_quant_fixtures.c - the AWQ and GPTQ repacks against numpy.
 *
 * tests/data/quant/packed.safetensors is made by tests/fixtures/quant_pack.py:
 * AWQ and GPTQ (v1 symmetric, v1 asymmetric with a wrapped zero point, v2
 * asymmetric) tensors packed from the formats' descriptions, numpy's own
 * dequantization of them (C.deq, fp32 [N][K]) and products with random
 * activations (C.y = x C.deq^T in float64, stored fp32).  Here each case is
 * repacked into Q4_G128 by lib/quant_cpu.c, dequantized (must equal C.deq bit
 * for bit: the dequantization is exact in fp32), and multiplied by x with the
 * CPU product (must be within 1e-4 of C.y relative to its largest value;
 * outputs poisoned with NaN first).
 *
 * The same file holds quantize-at-load results computed by numpy from the
 * documented rules (rtn.*): dsq_q8_quantize_rows and dsq_q4_quantize_rows
 * must give the same codes, scales and zero points bit for bit.
 */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "quant_cpu.h"

static dsq_st_set *g_set;

static int setup(void **state)
{
    (void)state;
    char *p = dsq_test_path("quant/packed.safetensors");
    dsq_status st = dsq_st_open_file(p, &g_set);
    if (st != DSQ_OK)
        fprintf(stderr, "cannot open %s: %s\n", p, dsq_last_error_message());
    free(p);
    return st == DSQ_OK ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    dsq_st_close(g_set);
    return 0;
}

/* The tensor "<c>.<what>" with its dtype string checked; data aligned. */
static dsq_tensor get(const char *c, const char *what, const char *dtype)
{
    char name[128];
    snprintf(name, sizeof name, "%s.%s", c, what);
    const dsq_st_entry *e = dsq_st_find(g_set, name);
    if (!e)
        fail_msg("fixture has no tensor %s", name);
    assert_string_equal(e->dtype_str, dtype);
    dsq_tensor t;
    assert_int_equal(dsq_st_tensor(g_set, e, 0, &t), DSQ_OK);
    return t;
}

static void run_case(const char *c, int is_awq, int zero_offset)
{
    dsq_tensor qw = get(c, "qweight", "I32"), qz = get(c, "qzeros", "I32");
    dsq_tensor sc = get(c, "scales", "F16"), deq = get(c, "deq", "F32"), y = get(c, "y", "F32");
    const int64_t N = deq.shape[0], K = deq.shape[1], T = y.shape[0];
    assert_int_equal(y.shape[1], N);
    if (is_awq) {
        assert_true(qw.shape[0] == K && qw.shape[1] == N / 8);
    } else {
        assert_true(qw.shape[0] == K / 8 && qw.shape[1] == N);
    }
    assert_true(qz.shape[0] == K / 128 && qz.shape[1] == N / 8);
    assert_true(sc.shape[0] == K / 128 && sc.shape[1] == N);
    char xname[32];
    snprintf(xname, sizeof xname, "x.%lld", (long long)K);
    const dsq_st_entry *xe = dsq_st_find(g_set, xname);
    assert_non_null(xe);
    dsq_tensor x;
    assert_int_equal(dsq_st_tensor(g_set, xe, 0, &x), DSQ_OK);
    assert_true(x.shape[0] == T && x.shape[1] == K);

    uint8_t *q = malloc(dsq_q4_q_bytes(N, K));
    uint16_t *s = malloc(dsq_q4_scales_bytes(N, K));
    uint8_t *z = malloc(dsq_q4_zeros_bytes(N, K));
    memset(q, 0xcd, dsq_q4_q_bytes(N, K));
    if (is_awq) {
        assert_int_equal(dsq_q4_from_awq(qw.data, qz.data, sc.data, N, K, q, s, z), DSQ_OK);
    } else {
        dsq_tensor gi = get(c, "g_idx", "I32");
        assert_int_equal(gi.shape[0], K);
        assert_int_equal(dsq_q4_from_gptq(qw.data, qz.data, sc.data, gi.data, zero_offset, N, K, q, s, z),
                         DSQ_OK);
    }
    dsq_q4_mat W = {q, s, z, N, K};
    float *d = malloc((size_t)(N * K) * sizeof(float));
    for (int64_t i = 0; i < N * K; i++)
        d[i] = NAN;
    dsq_q4_dequant_rows(&W, 0, N, d);
    const float *ref = deq.data;
    for (int64_t i = 0; i < N * K; i++)
        if (memcmp(&d[i], &ref[i], 4) != 0)
            fail_msg("%s: W[%lld][%lld] = %a, numpy %a", c, (long long)(i / K), (long long)(i % K),
                     (double)d[i], (double)ref[i]);

    float *Y = malloc((size_t)(T * N) * sizeof(float));
    for (int64_t i = 0; i < T * N; i++)
        Y[i] = NAN;
    float *scratch = malloc(dsq_quant_scratch_floats(K) * sizeof(float));
    /* two row ranges, as two threads would run them */
    dsq_q4_matmul_rows(Y, N, x.data, K, (int32_t)T, &W, NULL, 0, N / 2, 0, scratch);
    dsq_q4_matmul_rows(Y, N, x.data, K, (int32_t)T, &W, NULL, N / 2, N, 0, scratch);
    double rel = dsq_rel_err(Y, y.data, (size_t)(T * N));
    printf("  %-20s %3lld x %3lld  dequant bit-exact, product rel err %.3g\n", c, (long long)N,
           (long long)K, rel);
    for (int64_t i = 0; i < T * N; i++)
        assert_false(isnan(Y[i]));
    assert_true(rel <= 1e-4);
    free(q), free(s), free(z), free(d), free(Y), free(scratch);
}

static void test_awq(void **state)
{
    (void)state;
    run_case("awq_24x256", 1, 0);
    run_case("awq_40x384", 1, 0);
}

static void test_gptq_v1(void **state)
{
    (void)state;
    run_case("gptq1_sym_24x256", 0, 1);
    run_case("gptq1_asym_40x384", 0, 1);
}

static void test_gptq_v2(void **state)
{
    (void)state;
    run_case("gptq2_asym_24x256", 0, 0);
}

/* Reading a v1 checkpoint as v2 (or the reverse) must not match: the zero
 * offset is load-bearing, so the test above could not pass by accident. */
static void test_offset_matters(void **state)
{
    (void)state;
    const char *c = "gptq1_sym_24x256";
    dsq_tensor qw = get(c, "qweight", "I32"), qz = get(c, "qzeros", "I32");
    dsq_tensor sc = get(c, "scales", "F16"), deq = get(c, "deq", "F32");
    const int64_t N = deq.shape[0], K = deq.shape[1];
    uint8_t *q = malloc(dsq_q4_q_bytes(N, K));
    uint16_t *s = malloc(dsq_q4_scales_bytes(N, K));
    uint8_t *z = malloc(dsq_q4_zeros_bytes(N, K));
    assert_int_equal(dsq_q4_from_gptq(qw.data, qz.data, sc.data, NULL, 0, N, K, q, s, z), DSQ_OK);
    dsq_q4_mat W = {q, s, z, N, K};
    float *d = malloc((size_t)(N * K) * sizeof(float));
    dsq_q4_dequant_rows(&W, 0, N, d);
    int64_t same = 0;
    for (int64_t i = 0; i < N * K; i++)
        same += d[i] == ((const float *)deq.data)[i];
    assert_true(same < N * K / 4);
    free(q), free(s), free(z), free(d);
}

/* Quantize at load vs numpy's reading of the documented rules. */
static void test_quantize_matches_numpy(void **state)
{
    (void)state;
    dsq_tensor w = get("rtn", "w", "BF16");
    dsq_tensor q8 = get("rtn.q8", "q", "I8"), s8 = get("rtn.q8", "scales", "F32");
    dsq_tensor q4 = get("rtn.q4", "q", "U8"), s4 = get("rtn.q4", "scales", "F16");
    dsq_tensor z4 = get("rtn.q4", "zeros", "U8");
    const int64_t N = w.shape[0], K = w.shape[1];
    assert_true(q4.shape[1] == dsq_q4_ldq(K) && s4.shape[1] == dsq_q4_groups(K));
    int8_t *q = malloc((size_t)(N * K));
    float *s = malloc((size_t)N * 4);
    assert_int_equal(dsq_q8_quantize_rows(w.data, DSQ_DT_BF16, K, 0, N, q, s), DSQ_OK);
    assert_memory_equal(q, q8.data, (size_t)(N * K));
    assert_memory_equal(s, s8.data, (size_t)N * 4);
    uint8_t *qq = malloc(dsq_q4_q_bytes(N, K)), *zz = malloc(dsq_q4_zeros_bytes(N, K));
    uint16_t *ss = malloc(dsq_q4_scales_bytes(N, K));
    memset(qq, 0xa5, dsq_q4_q_bytes(N, K));
    assert_int_equal(dsq_q4_quantize_rows(w.data, DSQ_DT_BF16, K, 0, N, qq, ss, zz), DSQ_OK);
    for (size_t i = 0; i < dsq_q4_q_bytes(N, K); i++)
        if (qq[i] != ((const uint8_t *)q4.data)[i])
            fail_msg("q4 code byte %zu (row %zu): %02x, numpy %02x", i, i / (size_t)dsq_q4_ldq(K), qq[i],
                     ((const uint8_t *)q4.data)[i]);
    assert_memory_equal(ss, s4.data, dsq_q4_scales_bytes(N, K));
    assert_memory_equal(zz, z4.data, dsq_q4_zeros_bytes(N, K));
    printf("  quantize at load: %lld x %lld bf16 -> Q8_ROW and Q4_G128 equal numpy bit for bit\n",
           (long long)N, (long long)K);
    free(q), free(s), free(qq), free(zz), free(ss);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_awq),
        cmocka_unit_test(test_gptq_v1),
        cmocka_unit_test(test_gptq_v2),
        cmocka_unit_test(test_offset_matters),
        cmocka_unit_test(test_quantize_matches_numpy),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
