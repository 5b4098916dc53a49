/*
 * test_cuda_quant_e2e.c - quantized models on the CUDA backend against the
 * CPU backend (the reference for the GPU kernels, docs/quantization.md).
 *
 * Every checkpoint of tests/data/quant_tiny (AWQ, GPTQ v1 asym / sym, v2,
 * dsqwen Q8 / Q4, Q4 with an int8 head) and the bf16 model quantized at load
 * (INT8; Q4 + int8 head) run a 12-token prefill with every row's logits
 * (T = 12: by default gemm_rows.cu's tensor-core products, the head too)
 * and 3 decode steps (T = 1: gemm_rows.cu for Q4, the quantized GEMV for
 * Q8; test_gpu_vs_cpu_qrows runs the other paths) on both backends; the GPU's logits (bf16
 * activations, F16 KV) must be within 2e-2 of the CPU's relative to their
 * largest magnitude, with the same argmax in most rows, and device_bytes
 * must be below the bf16 model's.
 * Exits 77 (skipped) without a CUDA build or device.
 */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#define N_PROMPT 12
#define N_DEC 3
#define V 320
#define N_ROWS (N_PROMPT + N_DEC)
#define BOUND 2e-2

static const int32_t g_prompt[N_PROMPT] = { 5, 17, 300, 42, 7, 99, 128, 3, 250, 61, 11, 200 };
static const int32_t g_dec[N_DEC] = { 77, 150, 9 };

static int64_t run(const char *dir, int backend, int quantize, int qhead, float *out)
{
    dsq_model_params mp = dsq_model_default_params();
    mp.backend = backend;
    mp.quantize = quantize;
    mp.quantize_head = qhead;
    dsq_model *m = NULL;
    dsq_status st = dsq_model_load(dir, &mp, &m);
    if (st != DSQ_OK)
        fail_msg("%s (backend %d): %s: %s", dir, backend, dsq_status_string(st), dsq_last_error_message());
    dsq_model_info info = { .struct_size = sizeof info };
    assert_int_equal(dsq_model_get_info(m, &info), DSQ_OK);
    dsq_ctx_params cp = dsq_ctx_default_params();
    cp.max_context = 64;
    cp.kv_dtype = DSQ_KV_F16;
    dsq_ctx *c = NULL;
    assert_int_equal(dsq_ctx_new(m, &cp, &c), DSQ_OK);
    for (int i = 0; i < N_ROWS * V; i++)
        out[i] = NAN;
    assert_int_equal(dsq_prefill(c, 0, g_prompt, N_PROMPT, DSQ_LOGITS_ALL, out), DSQ_OK);
    int32_t seq = 0;
    for (int i = 0; i < N_DEC; i++)
        assert_int_equal(dsq_decode_step(c, 1, &seq, &g_dec[i], out + (size_t)(N_PROMPT + i) * V), DSQ_OK);
    dsq_ctx_free(c);
    dsq_model_free(m);
    return info.device_bytes;
}

static void test_gpu_vs_cpu(void **state)
{
    (void)state;
    static const struct {
        const char *dir;
        int quantize, head;
    } cases[] = {
        { "awq", 0, 0 },  { "gptq", 0, 0 }, { "gptq_sym", 0, 0 }, { "gptq_v2", 0, 0 },
        { "q8", 0, 0 },   { "q4", 0, 0 },   { "q4h", 0, 0 },
        { "bf16", DSQ_QUANTIZE_INT8, 0 },   { "bf16", DSQ_QUANTIZE_Q4, 1 },
    };
    float *g = malloc(sizeof(float) * N_ROWS * V), *r = malloc(sizeof(float) * N_ROWS * V);
    char *bf = dsq_test_path("quant_tiny/bf16");
    const int64_t dense_bytes = run(bf, DSQ_BACKEND_CUDA, 0, 0, g);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char rel[64];
        snprintf(rel, sizeof rel, "quant_tiny/%s", cases[i].dir);
        char *dir = dsq_test_path(rel);
        const int64_t db = run(dir, DSQ_BACKEND_CUDA, cases[i].quantize, cases[i].head, g);
        run(dir, DSQ_BACKEND_CPU, cases[i].quantize, cases[i].head, r);
        int same = 0;
        for (int k = 0; k < N_ROWS; k++)
            same += dsq_argmax(g + (size_t)k * V, V) == dsq_argmax(r + (size_t)k * V, V);
        for (int k = 0; k < N_ROWS * V; k++)
            assert_true(isfinite(g[k]));
        const double e = dsq_rel_err(g, r, (size_t)N_ROWS * V);
        printf("%-9s quantize %d head %d: GPU vs CPU rel err %.3g, argmax %d/%d, device_bytes %lld (bf16 %lld)\n",
               cases[i].dir, cases[i].quantize, cases[i].head, e, same, N_ROWS, (long long)db,
               (long long)dense_bytes);
        assert_true(e <= BOUND);
        assert_true(same >= N_ROWS - 1);
        assert_true(db < dense_bytes);
        free(dir);
    }
    free(bf);
    free(g);
    free(r);
}

/* The defaults (above) send every Q4 product of the prompt (12 rows), Q4
 * gate/up of the decode steps (1 row), and the Q8 ones of the prompt
 * through gemm_rows.cu (quant_tiny's in-feature counts are multiples of
 * 128, as it needs), Q4 qkv, o and down of the decode steps to gemv.cu's
 * 4-bit GEMV; the other paths once more: every decode product on the
 * tensor cores (DSQ_CUDA_QROWS_Q8_MIN=1, DSQ_CUDA_QROWS_Q4_MIN=1, the Q4
 * default before stop 39), then none (DSQ_CUDA_QROWS=0: the
 * quantized GEMV and the dequantization tile in two exact parts), then
 * the tile as one bf16-rounded part (DSQ_CUDA_QTILE=1). */
static void test_gpu_vs_cpu_qrows(void **state)
{
    assert_int_equal(setenv("DSQ_CUDA_QROWS_Q8_MIN", "1", 1), 0);
    assert_int_equal(setenv("DSQ_CUDA_QROWS_Q4_MIN", "1", 1), 0);
    test_gpu_vs_cpu(state);
    unsetenv("DSQ_CUDA_QROWS_Q8_MIN");
    unsetenv("DSQ_CUDA_QROWS_Q4_MIN");
    assert_int_equal(setenv("DSQ_CUDA_QROWS", "0", 1), 0);
    test_gpu_vs_cpu(state);
    assert_int_equal(setenv("DSQ_CUDA_QTILE", "1", 1), 0);
    test_gpu_vs_cpu(state);
    unsetenv("DSQ_CUDA_QTILE");
    unsetenv("DSQ_CUDA_QROWS");
}

int main(void)
{
#ifndef DSQ_HAVE_CUDA
    printf("SKIP: no CUDA device (built without CUDA)\n");
    return DSQ_TEST_SKIP;
#else
    const char *no_device = dsq_cuda_device_problem();
    if (no_device) {
        printf("SKIP: no CUDA device (%s)\n", no_device);
        return DSQ_TEST_SKIP;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gpu_vs_cpu),
        cmocka_unit_test(test_gpu_vs_cpu_qrows),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
#endif
}
