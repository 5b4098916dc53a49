/*
 * test_quant_cpu.c - lib/quant_cpu.c and lib/quant_cpu_matmul.c on random
 * odd sizes:
 *  - quantize at load (Q8_ROW, Q4_G128) from BF16/F16/F32: codes in range,
 *    |w - w'| within half a step of each row/group, the edge groups (zero,
 *    constant, one-signed), non-finite and out-of-range weights refused;
 *  - dequantization against a scalar reading of the documented layout
 *    written here (nibble by nibble), bit for bit;
 *  - the products: the same bits from every kernel (AVX-512, AVX2,
 *    portable), whatever the batch and the row range, equal to a scalar
 *    reading of the lane order quant_cpu_matmul.c documents, and within
 *    fp32 rounding of a double-precision reference;
 *    outputs poisoned with NaN first, rows outside [o0, o1) must stay NaN;
 *    bias and accumulate;
 *  - the repack functions' refusals (shapes, act-order g_idx).
 * The AWQ/GPTQ repacks themselves are checked against numpy in
 * test_quant_fixtures.c.
 */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_ops.h"
#include "internal.h"
#include "quant_cpu.h"

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;

static uint64_t rng_next(void)
{
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return g_rng;
}

/* uniform in [-a, a) */
static float frand(float a) { return a * (2.0f * (float)((rng_next() >> 40) * (1.0 / 16777216.0)) - 1.0f); }

/* Random weights of dtype dt, [N][K], and their exact fp32 values. */
static void *rand_weights(dsq_dtype dt, int64_t N, int64_t K, float a, float **f32)
{
    size_t n = (size_t)(N * K);
    void *w = malloc(n * dsq_dtype_size(dt) + 4);
    float *f = malloc(n * sizeof(float) + 4);
    assert_non_null(w);
    assert_non_null(f);
    for (size_t i = 0; i < n; i++) {
        float v = frand(a);
        /* some rows with a different scale, so groups differ */
        if ((i / (size_t)K) % 5 == 3)
            v *= 0.01f;
        if (dt == DSQ_DT_BF16) {
            ((uint16_t *)w)[i] = dsq_f32_to_bf16(v);
            f[i] = dsq_bf16_to_f32(((uint16_t *)w)[i]);
        } else if (dt == DSQ_DT_F16) {
            ((uint16_t *)w)[i] = dsq_f32_to_f16(v);
            f[i] = dsq_f16_to_f32(((uint16_t *)w)[i]);
        } else {
            ((float *)w)[i] = v;
            f[i] = v;
        }
    }
    *f32 = f;
    return w;
}

static float *nan_floats(size_t n)
{
    float *p = malloc(n * sizeof(float) + 4);
    assert_non_null(p);
    for (size_t i = 0; i < n; i++)
        p[i] = NAN;
    return p;
}

/* W'[n][k] read from the documented Q4 layout, one nibble at a time. */
static float q4_ref(const dsq_q4_mat *W, int64_t n, int64_t k)
{
    int64_t ldq = (W->cols + 31) / 32 * 16, G = (W->cols + 127) / 128;
    uint8_t byte = W->q[n * ldq + k / 2];
    int code = k % 2 == 0 ? (byte & 15) : (byte >> 4);
    int zero = W->zeros[n * G + k / 128];
    return (float)(code - zero) * dsq_f16_to_f32(W->scales[n * G + k / 128]);
}

static const dsq_dtype DTS[] = {DSQ_DT_BF16, DSQ_DT_F16, DSQ_DT_F32};
static const int64_t SIZES[][2] = {{1, 1}, {3, 7}, {5, 128}, {7, 129}, {13, 255}, {9, 300},
                                   {33, 1536}, {17, 1001}, {8, 8960}};

static void test_q8_quantize(void **state)
{
    (void)state;
    for (size_t di = 0; di < 3; di++)
        for (size_t si = 0; si < sizeof SIZES / sizeof SIZES[0]; si++) {
            const int64_t N = SIZES[si][0], K = SIZES[si][1];
            float *f;
            void *w = rand_weights(DTS[di], N, K, 0.5f, &f);
            if (N > 2) /* a zero row */
                for (int64_t k = 0; k < K; k++) {
                    f[2 * K + k] = 0.0f;
                    memset((char *)w + (size_t)(2 * K + k) * dsq_dtype_size(DTS[di]), 0,
                           dsq_dtype_size(DTS[di]));
                }
            int8_t *q = malloc((size_t)(N * K));
            float *s = nan_floats((size_t)N);
            /* two row ranges, as two threads would */
            assert_int_equal(dsq_q8_quantize_rows(w, DTS[di], K, 0, N / 2, q, s), DSQ_OK);
            assert_int_equal(dsq_q8_quantize_rows(w, DTS[di], K, N / 2, N, q, s), DSQ_OK);
            dsq_q8_mat W = {q, s, N, K};
            float *d = nan_floats((size_t)(N * K));
            dsq_q8_dequant_rows(&W, 0, N, d);
            for (int64_t n = 0; n < N; n++) {
                float amax = 0;
                for (int64_t k = 0; k < K; k++)
                    amax = fmaxf(amax, fabsf(f[n * K + k]));
                assert_true(s[n] == amax / 127.0f);
                for (int64_t k = 0; k < K; k++) {
                    int64_t i = n * K + k;
                    assert_true(q[i] >= -127 && q[i] <= 127);
                    assert_true(d[i] == (float)q[i] * s[n]);
                    double err = fabs((double)d[i] - f[i]);
                    /* half a step, plus the rounding of w / scale */
                    if (!(err <= 0.5 * s[n] + fabs(f[i]) * 0x1p-22 + 1e-30))
                        fail_msg("q8 %lldx%lld row %lld k %lld: |%g - %g| > scale/2 = %g", (long long)N,
                                 (long long)K, (long long)n, (long long)k, (double)d[i], (double)f[i],
                                 0.5 * s[n]);
                }
            }
            if (N > 2)
                assert_true(s[2] == 0.0f && d[2 * K] == 0.0f);
            free(w), free(f), free(q), free(s), free(d);
        }
}

static void check_q4_roundtrip(const float *f, const dsq_q4_mat *W)
{
    const int64_t N = W->rows, K = W->cols, G = dsq_q4_groups(K), ldq = dsq_q4_ldq(K);
    float *d = nan_floats((size_t)(N * K));
    dsq_q4_dequant_rows(W, 0, N, d);
    for (int64_t n = 0; n < N; n++) {
        for (int64_t b = (K + 1) / 2; b < ldq; b++) /* padding */
            assert_int_equal(W->q[n * ldq + b], 0);
        if (K % 2)
            assert_int_equal(W->q[n * ldq + K / 2] >> 4, 0);
        for (int64_t g = 0; g < G; g++) {
            float s = dsq_f16_to_f32(W->scales[n * G + g]);
            assert_true(s >= 0.0f && isfinite(s));
            assert_true(W->zeros[n * G + g] <= 15);
            for (int64_t k = g * 128; k < K && k < (g + 1) * 128; k++) {
                int64_t i = n * K + k;
                float ref = q4_ref(W, n, k);
                if (memcmp(&ref, &d[i], 4) != 0)
                    fail_msg("q4 dequant %lld,%lld: %a, layout says %a", (long long)n, (long long)k,
                             (double)d[i], (double)ref);
                double err = fabs((double)d[i] - f[i]);
                if (!(err <= 0.5 * s + fabs(f[i]) * 0x1p-22))
                    fail_msg("q4 %lldx%lld (%lld,%lld): |%g - %g| > s/2 = %g", (long long)N, (long long)K,
                             (long long)n, (long long)k, (double)d[i], (double)f[i], 0.5 * s);
            }
        }
    }
    free(d);
}

static void test_q4_quantize(void **state)
{
    (void)state;
    for (size_t di = 0; di < 3; di++)
        for (size_t si = 0; si < sizeof SIZES / sizeof SIZES[0]; si++) {
            const int64_t N = SIZES[si][0], K = SIZES[si][1];
            float *f;
            void *w = rand_weights(DTS[di], N, K, 0.5f, &f);
            const size_t es = dsq_dtype_size(DTS[di]);
            /* edge groups in row 1 when there is one: zero first group,
             * constant positive second, all-negative third */
            if (N > 1)
                for (int64_t k = 0; k < K; k++) {
                    float v = k < 128 ? 0.0f : k < 256 ? 0.25f : -fabsf(f[K + k]);
                    uint16_t h = DTS[di] == DSQ_DT_BF16 ? dsq_f32_to_bf16(v) : dsq_f32_to_f16(v);
                    if (DTS[di] == DSQ_DT_F32)
                        memcpy((char *)w + (size_t)(K + k) * es, &v, 4);
                    else
                        memcpy((char *)w + (size_t)(K + k) * es, &h, 2);
                    f[K + k] = v;
                }
            uint8_t *q = malloc(dsq_q4_q_bytes(N, K));
            uint16_t *s = malloc(dsq_q4_scales_bytes(N, K));
            uint8_t *z = malloc(dsq_q4_zeros_bytes(N, K));
            memset(q, 0xee, dsq_q4_q_bytes(N, K)); /* padding must be cleared */
            assert_int_equal(dsq_q4_quantize_rows(w, DTS[di], K, 0, N - N / 3, q, s, z), DSQ_OK);
            assert_int_equal(dsq_q4_quantize_rows(w, DTS[di], K, N - N / 3, N, q, s, z), DSQ_OK);
            dsq_q4_mat W = {q, s, z, N, K};
            check_q4_roundtrip(f, &W);
            if (N > 1) {
                int64_t G = dsq_q4_groups(K);
                assert_int_equal(s[G], 0); /* all-zero group */
                assert_int_equal(z[G], 0);
                if (K >= 256) { /* constant 0.25: zero point 0, every code 15 */
                    assert_int_equal(z[G + 1], 0);
                    assert_int_equal(q[dsq_q4_ldq(K) + 100], 0xff);
                }
            }
            free(w), free(f), free(q), free(s), free(z);
        }
}

static void test_quantize_refusals(void **state)
{
    (void)state;
    float w[300];
    for (int i = 0; i < 300; i++)
        w[i] = 0.01f * (float)i;
    int8_t q8[300];
    float s8[2];
    uint8_t q4[2 * 160];
    uint16_t s4[6];
    uint8_t z4[6];
    w[250] = NAN;
    assert_int_equal(dsq_q8_quantize_rows(w, DSQ_DT_F32, 150, 0, 2, q8, s8), DSQ_ERR_FORMAT);
    assert_non_null(strstr(dsq_last_error_message(), "row 1"));
    assert_int_equal(dsq_q4_quantize_rows(w, DSQ_DT_F32, 150, 0, 2, q4, s4, z4), DSQ_ERR_FORMAT);
    w[250] = INFINITY;
    assert_int_equal(dsq_q4_quantize_rows(w, DSQ_DT_F32, 150, 0, 2, q4, s4, z4), DSQ_ERR_FORMAT);
    w[250] = 2.0e6f; /* range / 15 beyond f16 */
    assert_int_equal(dsq_q4_quantize_rows(w, DSQ_DT_F32, 150, 0, 2, q4, s4, z4), DSQ_ERR_FORMAT);
    assert_non_null(strstr(dsq_last_error_message(), "f16"));
    assert_int_equal(dsq_q8_quantize_rows(w, DSQ_DT_F32, 150, 0, 2, q8, s8), DSQ_OK); /* fine in Q8 */
    assert_int_equal(dsq_q8_quantize_rows(w, DSQ_DT_OTHER, 150, 0, 2, q8, s8), DSQ_ERR_DTYPE);
    assert_int_equal(dsq_q8_quantize_rows(NULL, DSQ_DT_F32, 150, 0, 2, q8, s8), DSQ_ERR_INVALID_ARG);
    assert_int_equal(dsq_q4_quantize_rows(w, DSQ_DT_F32, 150, 0, 2, q4, s4, NULL), DSQ_ERR_INVALID_ARG);
    assert_int_equal(dsq_q4_quantize_rows(w, DSQ_DT_F32, 0, 0, 2, q4, s4, z4), DSQ_ERR_INVALID_ARG);
    assert_int_equal(dsq_q4_quantize_rows(w, DSQ_DT_F32, 150, 2, 1, q4, s4, z4), DSQ_ERR_INVALID_ARG);
}

static void test_repack_refusals(void **state)
{
    (void)state;
    int32_t qw[256 * 2] = {0}, qz[2 * 2] = {0}, gi[256]; /* N 16, K 256 */
    uint16_t sc[2 * 16] = {0};
    uint8_t q[16 * 128], z[32];
    uint16_t s[32];
    for (int k = 0; k < 256; k++)
        gi[k] = k / 128;
    /* N 16, K 256 fits */
    assert_int_equal(dsq_q4_from_gptq(qw, qz, sc, gi, 1, 16, 256, q, s, z), DSQ_OK);
    assert_int_equal(z[0], 1); /* v1: stored 0 means zero 1 */
    assert_int_equal(dsq_q4_from_gptq(qw, qz, sc, gi, 0, 16, 256, q, s, z), DSQ_OK);
    assert_int_equal(z[0], 0);
    assert_int_equal(dsq_q4_from_awq(qw, qz, sc, 16, 256, q, s, z), DSQ_OK);
    assert_int_equal(dsq_q4_from_awq(qw, qz, sc, 12, 256, q, s, z), DSQ_ERR_SHAPE);
    assert_int_equal(dsq_q4_from_awq(qw, qz, sc, 16, 200, q, s, z), DSQ_ERR_SHAPE);
    assert_int_equal(dsq_q4_from_gptq(qw, qz, sc, gi, 1, 16, 64, q, s, z), DSQ_ERR_SHAPE);
    assert_int_equal(dsq_q4_from_awq(NULL, qz, sc, 16, 256, q, s, z), DSQ_ERR_INVALID_ARG);
    assert_int_equal(dsq_q4_from_gptq(qw, qz, sc, gi, 2, 16, 256, q, s, z), DSQ_ERR_INVALID_ARG);
    sc[17] = 0x7c00; /* +Inf scale: group 1, column 1 */
    assert_int_equal(dsq_q4_from_awq(qw, qz, sc, 16, 256, q, s, z), DSQ_ERR_FORMAT);
    assert_non_null(strstr(dsq_last_error_message(), "group 1, column 1 is infinite"));
    sc[17] = 0x7e01; /* NaN */
    assert_int_equal(dsq_q4_from_gptq(qw, qz, sc, gi, 1, 16, 256, q, s, z), DSQ_ERR_FORMAT);
    assert_non_null(strstr(dsq_last_error_message(), "NaN"));
    sc[17] = 0xfbff; /* -65504: finite, accepted */
    assert_int_equal(dsq_q4_from_gptq(qw, qz, sc, gi, 1, 16, 256, q, s, z), DSQ_OK);
    gi[5] = 1; /* act-order-like grouping */
    assert_int_equal(dsq_q4_from_gptq(qw, qz, sc, gi, 1, 16, 256, q, s, z), DSQ_ERR_UNSUPPORTED);
    assert_non_null(strstr(dsq_last_error_message(), "g_idx[5]"));
}

static double g_worst; /* over every check_product */

/* One product call into a fresh poisoned (or `init`-filled) Y. */
static float *product(int is_q4, const dsq_q8_mat *W8, const dsq_q4_mat *W4, const float *X, int64_t ldx,
                      int32_t T, const dsq_tensor *bp, int64_t o0, int64_t o1, int accumulate, float init,
                      int64_t ldy, int64_t K)
{
    float *Y = nan_floats((size_t)(T * ldy));
    if (accumulate)
        for (int64_t i = 0; i < T * ldy; i++)
            Y[i] = init;
    float *scratch = nan_floats(dsq_quant_scratch_floats(K));
    if (is_q4)
        dsq_q4_matmul_rows(Y, ldy, X, ldx, T, W4, bp, o0, o1, accumulate, scratch);
    else
        dsq_q8_matmul_rows(Y, ldy, X, ldx, T, W8, bp, o0, o1, accumulate, scratch);
    free(scratch);
    return Y;
}

/* The product as lib/quant_cpu_matmul.c's header defines it, one scalar
 * fmaf at a time in the stated lane order and lane-sum tree: every kernel
 * must give these bits.  x is one token's K activations; W' comes from
 * q4_ref (the layout read nibble by nibble), k past K reads x = 0 and a
 * code of 0. */
static float lanes_ref(int is_q4, const dsq_q8_mat *W8, const dsq_q4_mat *W4, const float *x, int64_t K,
                       int64_t n)
{
    float acc[16] = {0};
    if (is_q4) {
        for (int64_t g = 0; g < (K + 127) / 128; g++)
            for (int i = 0; i < 8; i++)
                for (int j = 0; j < 16; j++) {
                    const int64_t k = 128 * g + 8 * j + i;
                    float w;
                    if (k < K) {
                        w = q4_ref(W4, n, k);
                    } else { /* code 0 of the same group */
                        const int64_t G = (K + 127) / 128;
                        w = (float)(0 - (int)W4->zeros[n * G + g]) * dsq_f16_to_f32(W4->scales[n * G + g]);
                    }
                    acc[j] = fmaf(k < K ? x[k] : 0.0f, w, acc[j]);
                }
    } else {
        for (int64_t c = 0; c < (K + 15) / 16; c++)
            for (int j = 0; j < 16; j++) {
                const int64_t k = 16 * c + j;
                acc[j] = fmaf(k < K ? x[k] : 0.0f, k < K ? (float)W8->q[n * K + k] : 0.0f, acc[j]);
            }
    }
    float a8[8], a4[4], a2[2];
    for (int i = 0; i < 8; i++)
        a8[i] = acc[i] + acc[i + 8];
    for (int i = 0; i < 4; i++)
        a4[i] = a8[i] + a8[i + 4];
    for (int i = 0; i < 2; i++)
        a2[i] = a4[i] + a4[i + 2];
    const float sum = a2[0] + a2[1];
    return is_q4 ? sum : sum * W8->scales[n];
}

/* The products against a double reference on W' (tolerance), and their
 * invariances bit for bit: every kernel this CPU has (portable, AVX2,
 * AVX-512) gives the same bits; a token's outputs do not depend on the
 * batch around it (T tokens vs that token alone); rows do not depend on
 * the row range (one call vs two halves).  Rows outside [o0, o1) stay
 * poisoned (or at their accumulated value). */
static void check_product(int is_q4, int64_t N, int64_t K, int32_t T, int with_bias, int accumulate)
{
    float *f;
    void *w = rand_weights(DSQ_DT_BF16, N, K, 0.5f, &f);
    dsq_q8_mat W8 = {0};
    dsq_q4_mat W4 = {0};
    int8_t *q8 = NULL;
    float *s8 = NULL;
    uint8_t *q4 = NULL, *z4 = NULL;
    uint16_t *s4 = NULL;
    float *deq = malloc((size_t)(N * K) * sizeof(float));
    if (is_q4) {
        q4 = malloc(dsq_q4_q_bytes(N, K));
        s4 = malloc(dsq_q4_scales_bytes(N, K));
        z4 = malloc(dsq_q4_zeros_bytes(N, K));
        assert_int_equal(dsq_q4_quantize_rows(w, DSQ_DT_BF16, K, 0, N, q4, s4, z4), DSQ_OK);
        W4 = (dsq_q4_mat){q4, s4, z4, N, K};
        dsq_q4_dequant_rows(&W4, 0, N, deq);
    } else {
        q8 = malloc((size_t)(N * K));
        s8 = malloc((size_t)N * sizeof(float));
        assert_int_equal(dsq_q8_quantize_rows(w, DSQ_DT_BF16, K, 0, N, q8, s8), DSQ_OK);
        W8 = (dsq_q8_mat){q8, s8, N, K};
        dsq_q8_dequant_rows(&W8, 0, N, deq);
    }
    const int64_t ldx = K + 3, ldy = N + 5;
    float *X = malloc((size_t)(T * ldx) * sizeof(float));
    for (int64_t i = 0; i < T * ldx; i++)
        X[i] = frand(1.0f);
    for (int32_t t = 0; t < T; t++) /* the columns past K must not be read */
        for (int64_t k = K; k < ldx; k++)
            X[t * ldx + k] = NAN;
    uint16_t *bb = malloc((size_t)N * 2);
    for (int64_t n = 0; n < N; n++)
        bb[n] = dsq_f32_to_bf16(frand(0.5f));
    dsq_tensor bias = {.data = bb, .dtype = DSQ_DT_BF16, .ndim = 1, .shape = {N}, .nbytes = (size_t)N * 2};
    const dsq_tensor *bp = with_bias ? &bias : NULL;
    const int64_t o0 = N > 4 ? 3 : 0, o1 = N > 9 ? N - 2 : N;
    const float init = 0.75f;
    const char *fmt = is_q4 ? "q4" : "q8";

    float *Y = product(is_q4, &W8, &W4, X, ldx, T, bp, o0, o1, accumulate, init, ldy, K);
    /* every kernel of this CPU: the same bits */
    static const int isas[] = {DSQ_QISA_PORTABLE, DSQ_QISA_AVX2, DSQ_QISA_AVX512};
    for (size_t i = 0; i < 3; i++) {
        if (!dsq_quant_cpu_force_isa(isas[i]))
            continue;
        float *Yi = product(is_q4, &W8, &W4, X, ldx, T, bp, o0, o1, accumulate, init, ldy, K);
        for (int64_t e = 0; e < T * ldy; e++)
            if (memcmp(&Yi[e], &Y[e], 4) != 0)
                fail_msg("%s %lldx%lld T=%d kernel %d: y[%lld] %a, auto kernel %a", fmt, (long long)N,
                         (long long)K, T, isas[i], (long long)e, (double)Yi[e], (double)Y[e]);
        free(Yi);
    }
    dsq_quant_cpu_force_isa(DSQ_QISA_AUTO);
    /* batch invariance: each token alone */
    for (int32_t t = 0; t < T; t++) {
        float *Y1 = product(is_q4, &W8, &W4, X + t * ldx, ldx, 1, bp, o0, o1, accumulate, init, ldy, K);
        if (memcmp(Y1, Y + t * ldy, (size_t)ldy * 4) != 0)
            fail_msg("%s %lldx%lld: token %d alone differs from it in a batch of %d", fmt, (long long)N,
                     (long long)K, t, T);
        free(Y1);
    }
    /* row-range invariance: [o0, m) and [m, o1) in two calls */
    if (o1 - o0 > 1) {
        const int64_t m = o0 + (o1 - o0) / 2 + 1;
        float *Ya = product(is_q4, &W8, &W4, X, ldx, T, bp, o0, m, accumulate, init, ldy, K);
        float *Yb = product(is_q4, &W8, &W4, X, ldx, T, bp, m, o1, accumulate, init, ldy, K);
        for (int32_t t = 0; t < T; t++)
            for (int64_t o = o0; o < o1; o++) {
                float v = o < m ? Ya[t * ldy + o] : Yb[t * ldy + o];
                if (memcmp(&v, &Y[t * ldy + o], 4) != 0)
                    fail_msg("%s: row %lld differs with the row range split at %lld", fmt, (long long)o,
                             (long long)m);
            }
        free(Ya);
        free(Yb);
    }
    /* the documented lane order, bit for bit */
    for (int32_t t = 0; t < T; t++)
        for (int64_t o = o0; o < o1; o++) {
            float v = lanes_ref(is_q4, &W8, &W4, X + t * ldx, K, o);
            v = v + (with_bias ? dsq_bf16_to_f32(bb[o]) : 0.0f);
            v = accumulate ? init + v : v;
            if (memcmp(&v, &Y[t * ldy + o], 4) != 0)
                fail_msg("%s %lldx%lld (%d,%lld): %a, the documented lane order gives %a", fmt, (long long)N,
                         (long long)K, t, (long long)o, (double)Y[t * ldy + o], (double)v);
        }
    double worst = 0;
    for (int32_t t = 0; t < T; t++)
        for (int64_t o = 0; o < ldy; o++) {
            float got = Y[t * ldy + o];
            if (o < o0 || o >= o1) {
                if (accumulate ? got != init : !isnan(got))
                    fail_msg("row %lld outside [%lld,%lld) was written", (long long)o, (long long)o0,
                             (long long)o1);
                continue;
            }
            double ref = 0, mag = 0;
            for (int64_t k = 0; k < K; k++) {
                ref += (double)X[t * ldx + k] * deq[o * K + k];
                mag += fabs((double)X[t * ldx + k] * deq[o * K + k]);
            }
            double b = with_bias ? dsq_bf16_to_f32(bb[o]) : 0.0;
            ref += b + (accumulate ? init : 0.0);
            mag += fabs(b) + (accumulate ? init : 0.0);
            /* 16 lanes of K/16 fused steps, a 4-level lane sum, the Q8
             * scale (W' = q s rounded once in the reference), bias, y */
            double tol = ((double)K / 16.0 + 8.0) * 0x1p-24 * mag + 1e-30;
            double r = fabs(got - ref) / tol;
            worst = r > worst ? r : worst;
            if (!(r <= 1.0))
                fail_msg("%s (%d,%lld): %g vs double %g (tol %g)", fmt, t, (long long)o, (double)got, ref,
                         tol);
        }
    g_worst = worst > g_worst ? worst : g_worst;
    free(w), free(f), free(deq), free(q8), free(s8), free(q4), free(s4), free(z4);
    free(X), free(bb), free(Y);
}

static void test_products(void **state)
{
    (void)state;
    const int64_t NK[][2] = {{1, 1}, {7, 3}, {5, 17}, {19, 128}, {31, 257}, {12, 1000}, {40, 1536}, {9, 8960}};
    const int32_t Ts[] = {1, 2, 3, 8, 9, 35}; /* 35: three token blocks of 16 */
    printf("quantized CPU products: kernel %d in use (1 portable, 2 AVX2, 3 AVX-512)\n", dsq_quant_cpu_isa());
    for (int q4 = 0; q4 < 2; q4++)
        for (size_t i = 0; i < sizeof NK / sizeof NK[0]; i++)
            for (size_t t = 0; t < sizeof Ts / sizeof Ts[0]; t++)
                check_product(q4, NK[i][0], NK[i][1], Ts[t], (int)((i + t) % 2), (int)(t == 2));
    printf("worst |got - double| / tolerance: %.3f\n", g_worst);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_q8_quantize),
        cmocka_unit_test(test_q4_quantize),
        cmocka_unit_test(test_quantize_refusals),
        cmocka_unit_test(test_repack_refusals),
        cmocka_unit_test(test_products),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
