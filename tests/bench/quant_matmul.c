/*
 * quant_matmul.c - benchmark (not a test): one thread's CPU product time
 * for the 1.5B model's linear shapes with bf16 weights (the dense kernel,
 * dsq_cpu_matmul_rows) and with Q8_ROW and Q4_G128 weights
 * (lib/quant_cpu_matmul.c), at T tokens.
 *
 *   bench_quant_matmul [T 1] [reps 20]
 *
 * Reports ms per product and the weight bytes streamed per second.  The
 * weights are random (quantized from the same bf16 matrix), so the numbers
 * are the kernels', not the model's.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cpu_ops.h"
#include "internal.h"
#include "quant_cpu.h"

/* The bf16 baseline through whichever dense entry point this tree has
 * (issue 9 replaces dsq_cpu_matmul_rows with dsq_cpu_linear on a
 * dsq_weight), so the bench builds before and after that change. */
#if __has_include("weight.h")
#include "weight.h"
static void dense(float *Y, const float *X, int T, const dsq_tensor *W, int64_t N, float *wbuf)
{
    dsq_weight dw;
    if (dsq_weight_from_tensor(W, &dw) == DSQ_OK)
        dsq_cpu_linear(Y, N, X, W->shape[1], T, &dw, NULL, 0, N, 0, wbuf);
}
#else
static void dense(float *Y, const float *X, int T, const dsq_tensor *W, int64_t N, float *wbuf)
{
    dsq_cpu_matmul_rows(Y, N, X, W->shape[1], T, W, NULL, 0, N, 0, wbuf);
}
#endif

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

int main(int argc, char **argv)
{
    const int T = argc > 1 ? atoi(argv[1]) : 1;
    const int reps = argc > 2 ? atoi(argv[2]) : 20;
    /* q|k|v fused, o_proj, gate|up fused, down_proj of R1-Distill-Qwen-1.5B */
    const int64_t shapes[][2] = {{2048, 1536}, {1536, 1536}, {17920, 1536}, {1536, 8960}};
    const char *names[] = {"qkv", "o", "gate_up", "down"};
    uint64_t rng = 88172645463325252ull;
    printf("T=%d, one thread, ms per product (weight GB/s)\n", T);
    printf("%-8s %6s %6s  %16s %16s %16s\n", "shape", "N", "K", "bf16", "q8_row", "q4_g128");
    for (int s = 0; s < 4; s++) {
        const int64_t N = shapes[s][0], K = shapes[s][1];
        uint16_t *w = malloc((size_t)(N * K) * 2);
        for (int64_t i = 0; i < N * K; i++) {
            rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
            w[i] = dsq_f32_to_bf16((float)((int64_t)(rng >> 40) - (1 << 23)) * 1e-9f);
        }
        int8_t *q8 = malloc((size_t)(N * K));
        float *s8 = malloc((size_t)N * 4);
        uint8_t *q4 = malloc(dsq_q4_q_bytes(N, K)), *z4 = malloc(dsq_q4_zeros_bytes(N, K));
        uint16_t *s4 = malloc(dsq_q4_scales_bytes(N, K));
        if (dsq_q8_quantize_rows(w, DSQ_DT_BF16, K, 0, N, q8, s8) != DSQ_OK ||
            dsq_q4_quantize_rows(w, DSQ_DT_BF16, K, 0, N, q4, s4, z4) != DSQ_OK) {
            fprintf(stderr, "quantize failed: %s\n", dsq_last_error_message());
            return 1;
        }
        dsq_tensor W = {.data = w, .dtype = DSQ_DT_BF16, .ndim = 2, .shape = {N, K},
                        .nbytes = (size_t)(N * K) * 2};
        dsq_q8_mat W8 = {q8, s8, N, K};
        dsq_q4_mat W4 = {q4, s4, z4, N, K};
        float *X = malloc((size_t)(T * K) * 4), *Y = malloc((size_t)(T * N) * 4);
        for (int64_t i = 0; i < T * K; i++)
            X[i] = (float)(i % 17) * 0.01f - 0.08f;
        float *scratch = malloc(dsq_quant_scratch_floats(K) * 4);
        double ms[3];
        double bytes[3] = {(double)(N * K) * 2, (double)(N * K) + N * 4.0,
                           (double)dsq_q4_q_bytes(N, K) + dsq_q4_scales_bytes(N, K) + dsq_q4_zeros_bytes(N, K)};
        for (int f = 0; f < 3; f++) {
            double best = 1e30;
            for (int r = 0; r < reps; r++) {
                double t0 = now_ms();
                if (f == 0)
                    dense(Y, X, T, &W, N, scratch);
                else if (f == 1)
                    dsq_q8_matmul_rows(Y, N, X, K, T, &W8, NULL, 0, N, 0, scratch);
                else
                    dsq_q4_matmul_rows(Y, N, X, K, T, &W4, NULL, 0, N, 0, scratch);
                double t = now_ms() - t0;
                best = t < best ? t : best;
            }
            ms[f] = best;
        }
        printf("%-8s %6lld %6lld  %7.3f (%5.1f)  %7.3f (%5.1f)  %7.3f (%5.1f)\n", names[s], (long long)N,
               (long long)K, ms[0], bytes[0] / ms[0] / 1e6, ms[1], bytes[1] / ms[1] / 1e6, ms[2],
               bytes[2] / ms[2] / 1e6);
        free(w), free(q8), free(s8), free(q4), free(z4), free(s4), free(X), free(Y), free(scratch);
    }
    return 0;
}
