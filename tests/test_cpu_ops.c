/* test_cpu_ops.c - the CPU backend's building blocks (conversions, matmul,
 * RMSNorm, RoPE, KV quantization, attention, thread pool) against naive
 * double-precision loops on random inputs of odd sizes, and the whole
 * forward pass of a small random in-memory model against a naive
 * double-precision Qwen2 forward. */
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

#include "arch.h"
#include "cpu_ops.h"
#include "cpu_threadpool.h"
#include "internal.h"
#include "quant_cpu.h"

/* ---- random numbers (splitmix64), fixed seeds ----------------------------- */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t rng_u64(void)
{
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
/* uniform in [-a, a) */
static float rng_f(float a) { return (float)(((double)(rng_u64() >> 11) / 9007199254740992.0) * 2.0 - 1.0) * a; }
static void fill(float *x, size_t n, float a)
{
    for (size_t i = 0; i < n; i++)
        x[i] = rng_f(a);
}
static void poison(float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        x[i] = NAN;
}

/* A tensor of shape [rows, cols] in `dt` holding random values; *ref gets
 * the values it really holds (after rounding to dt) as doubles. */
static dsq_tensor make_tensor(dsq_dtype dt, int64_t rows, int64_t cols, float a, double **ref)
{
    dsq_tensor t;
    memset(&t, 0, sizeof t);
    int64_t n = rows * cols;
    t.dtype = dt;
    t.ndim = cols > 0 ? 2 : 1;
    t.shape[0] = rows;
    t.shape[1] = cols;
    if (cols == 0) {
        t.shape[0] = rows;
        n = rows;
    }
    t.nbytes = (size_t)n * dsq_dtype_size(dt);
    void *data = malloc(t.nbytes);
    *ref = malloc((size_t)n * sizeof(double));
    for (int64_t i = 0; i < n; i++) {
        float v = rng_f(a);
        if (dt == DSQ_DT_BF16) {
            uint16_t h = dsq_f32_to_bf16(v);
            ((uint16_t *)data)[i] = h;
            (*ref)[i] = dsq_bf16_to_f32(h);
        } else if (dt == DSQ_DT_F16) {
            uint16_t h = dsq_f32_to_f16(v);
            ((uint16_t *)data)[i] = h;
            (*ref)[i] = dsq_f16_to_f32(h);
        } else {
            ((float *)data)[i] = v;
            (*ref)[i] = v;
        }
    }
    t.data = data;
    return t;
}

/* max|a-b| / max|ref| with a in float, ref in double */
static double rel_err_d(const float *a, const double *ref, size_t n)
{
    double md = 0, mr = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - ref[i]);
        if (isnan(d))
            return INFINITY;
        md = d > md ? d : md;
        mr = fabs(ref[i]) > mr ? fabs(ref[i]) : mr;
    }
    return mr > 0 ? md / mr : md;
}

/* ---- conversions ------------------------------------------------------------ */

static void test_f16_exhaustive(void **state)
{
    (void)state;
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float a = dsq_cpu_f16_to_f32((uint16_t)h), b = dsq_f16_to_f32((uint16_t)h);
        uint32_t ua, ub;
        memcpy(&ua, &a, 4);
        memcpy(&ub, &b, 4);
        if (ua != ub && bad++ < 5)
            printf("f16 0x%04x: fast 0x%08x exact 0x%08x\n", h, ua, ub);
    }
    /* the vector paths: weight rows and F16 KV vectors */
    uint16_t *all = malloc(65536 * 2);
    float *row = malloc(65536 * 4), *kv = malloc(128 * 4);
    for (uint32_t h = 0; h < 65536; h++)
        all[h] = (uint16_t)h;
    dsq_cpu_row_to_f32(row, all, DSQ_DT_F16, 65536);
    for (uint32_t h = 0; h < 65536; h++) {
        float b = dsq_f16_to_f32((uint16_t)h);
        if (memcmp(&row[h], &b, 4) != 0 && bad++ < 10)
            printf("f16 row 0x%04x differs\n", h);
    }
    for (uint32_t h0 = 0; h0 < 65536; h0 += 128) {
        dsq_cpu_kv_load(kv, all + h0, NULL, DSQ_KV_F16, 128);
        for (uint32_t d = 0; d < 128; d++) {
            float b = dsq_f16_to_f32((uint16_t)(h0 + d));
            if (memcmp(&kv[d], &b, 4) != 0 && bad++ < 10)
                printf("f16 kv 0x%04x differs\n", h0 + d);
        }
    }
    free(all);
    free(row);
    free(kv);
    printf("f16->f32 (scalar, row and KV paths): %d of 3x65536 values differ bitwise from dsq_f16_to_f32\n", bad);
    assert_int_equal(bad, 0);
}

static void test_row_convert(void **state)
{
    (void)state;
    const dsq_dtype dts[] = {DSQ_DT_BF16, DSQ_DT_F16, DSQ_DT_F32};
    for (int d = 0; d < 3; d++) {
        int64_t n = 1 + (int64_t)(rng_u64() % 301);
        double *ref;
        dsq_tensor t = make_tensor(dts[d], n, 0, 3.0f, &ref);
        float *out = malloc((size_t)n * sizeof(float));
        poison(out, (size_t)n);
        dsq_cpu_row_to_f32(out, t.data, t.dtype, n);
        for (int64_t i = 0; i < n; i++)
            assert_true((double)out[i] == ref[i]);
        free(out);
        free(ref);
        free((void *)t.data);
    }
}

static void test_dot(void **state)
{
    (void)state;
    const int64_t sizes[] = {1, 7, 8, 9, 127, 128, 1001};
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        int64_t n = sizes[s];
        float *a = malloc((size_t)n * 4), *b = malloc((size_t)n * 4);
        fill(a, (size_t)n, 1.0f);
        fill(b, (size_t)n, 1.0f);
        double ref = 0, mag = 0;
        for (int64_t i = 0; i < n; i++) {
            ref += (double)a[i] * b[i];
            mag += fabs((double)a[i] * b[i]);
        }
        float got = dsq_cpu_dot(a, b, n), got2 = dsq_cpu_dot2(a, b, n);
        double err = fabs(got - ref) / mag, err2 = fabs(got2 - ref) / mag;
        printf("dot n=%lld: |err|/sum|terms| = %.3e (attention variant %.3e)\n", (long long)n, err, err2);
        assert_true(err < 1e-6);
        assert_true(err2 < 1e-6);
        free(a);
        free(b);
    }
}

/* ---- matmul -------------------------------------------------------------------- */

static void check_matmul(dsq_dtype dt, int32_t T, int64_t N, int64_t K, int with_bias, int accumulate)
{
    double *wref, *bref = NULL;
    dsq_tensor W = make_tensor(dt, N, K, 0.5f, &wref);
    dsq_tensor B;
    if (with_bias)
        B = make_tensor(dt, N, 0, 1.0f, &bref);
    int64_t ldx = K + 3, ldy = N + 5; /* strides wider than the data */
    float *X = malloc((size_t)T * ldx * 4), *Y = malloc((size_t)T * ldy * 4);
    float *Y0 = malloc((size_t)T * ldy * 4);
    fill(X, (size_t)T * ldx, 1.0f);
    if (accumulate)
        fill(Y, (size_t)T * ldy, 2.0f);
    else
        poison(Y, (size_t)T * ldy);
    memcpy(Y0, Y, (size_t)T * ldy * 4);
    float *wbuf = malloc(DSQ_CPU_MM_ROWS * (size_t)K * 4);
    poison(wbuf, DSQ_CPU_MM_ROWS * (size_t)K);
    /* two uneven row ranges covering [1, N-1); rows 0 and N-1 must stay */
    int64_t mid = 1 + (N - 2) / 3;
    dsq_weight Wd;
    assert_int_equal(dsq_weight_from_tensor(&W, &Wd), DSQ_OK);
    assert_int_equal(dsq_cpu_linear(Y, ldy, X, ldx, T, &Wd, with_bias ? &B : NULL, 1, mid, accumulate, wbuf), DSQ_OK);
    assert_int_equal(dsq_cpu_linear(Y, ldy, X, ldx, T, &Wd, with_bias ? &B : NULL, mid, N - 1, accumulate, wbuf),
                     DSQ_OK);
    double maxd = 0, maxr = 0;
    int untouched_ok = 1;
    for (int32_t t = 0; t < T; t++)
        for (int64_t o = 0; o < ldy; o++) {
            float got = Y[t * ldy + o];
            if (o < 1 || o >= N - 1) {
                uint32_t a, b;
                memcpy(&a, &got, 4);
                memcpy(&b, &Y0[t * ldy + o], 4);
                untouched_ok &= a == b;
                continue;
            }
            double ref = 0;
            for (int64_t k = 0; k < K; k++)
                ref += (double)X[t * ldx + k] * wref[o * K + k];
            if (with_bias)
                ref += bref[o];
            if (accumulate)
                ref += Y0[t * ldy + o];
            double d = fabs(got - ref);
            maxd = isnan(d) ? INFINITY : d > maxd ? d : maxd;
            maxr = fabs(ref) > maxr ? fabs(ref) : maxr;
        }
    double err = maxd / maxr;
    /* every output is exactly dsq_cpu_dot(x, w) + b, as documented */
    if (!accumulate) {
        float *wrow = malloc((size_t)K * 4);
        int exact = 1;
        for (int64_t o = 1; o < N - 1; o++) {
            for (int64_t k = 0; k < K; k++)
                wrow[k] = (float)wref[o * K + k];
            for (int32_t t = 0; t < T; t++) {
                float want = dsq_cpu_dot(X + t * ldx, wrow, K) + (with_bias ? (float)bref[o] : 0.0f);
                exact &= memcmp(&want, &Y[t * ldy + o], 4) == 0;
            }
        }
        free(wrow);
        assert_true(exact);
    }
    printf("matmul %s T=%d N=%lld K=%lld bias=%d acc=%d: rel err %.3e\n", dsq_dtype_name(dt), T,
           (long long)N, (long long)K, with_bias, accumulate, err);
    assert_true(untouched_ok);
    assert_true(err < 2e-6);

    /* batch independence: each token alone gives bit-identical rows */
    float *Y1 = malloc((size_t)ldy * 4);
    for (int32_t t = 0; t < T; t++) {
        memcpy(Y1, Y0 + (size_t)t * ldy, (size_t)ldy * 4);
        dsq_cpu_linear(Y1, ldy, X + (size_t)t * ldx, ldx, 1, &Wd, with_bias ? &B : NULL, 1, N - 1,
                            accumulate, wbuf);
        assert_memory_equal(Y1 + 1, Y + (size_t)t * ldy + 1, (size_t)(N - 2) * 4);
    }
    free(Y1);
    free(wbuf);
    free(X);
    free(Y);
    free(Y0);
    free(wref);
    free((void *)W.data);
    if (with_bias) {
        free(bref);
        free((void *)B.data);
    }
}

/* The product dispatches on the weight's format: the quantized formats are
 * reserved seams (their kernels land separately) and answer
 * DSQ_ERR_UNSUPPORTED naming the format, without touching the output; a
 * dense weight with another layout is refused too. */
static void test_linear_formats(void **state)
{
    (void)state;
    float x[8] = {1, 2, 3, 4, 5, 6, 7, 8}, y[2] = {42.0f, 43.0f}, wbuf[4 * 8];
    const int8_t q[16] = {0};
    const float sc[2] = {1.0f, 1.0f};
    /* AWQ / GPTQ are source tags (repacked into Q4_G128 at load): no product */
    const dsq_wformat quant[] = {DSQ_WF_Q4_AWQ, DSQ_WF_Q4_GPTQ};
    for (size_t i = 0; i < sizeof quant / sizeof quant[0]; i++) {
        dsq_weight w = {.format = quant[i], .rows = 2, .cols = 8, .data = q, .scales = sc, .group_size = 8};
        assert_int_equal(dsq_cpu_linear(y, 2, x, 8, 1, &w, NULL, 0, 2, 0, wbuf), DSQ_ERR_UNSUPPORTED);
        assert_non_null(strstr(dsq_last_error_message(), dsq_wformat_name(quant[i])));
        assert_true(y[0] == 42.0f && y[1] == 43.0f);
    }
    float wf[16];
    for (int i = 0; i < 16; i++)
        wf[i] = (float)(i % 3);
    dsq_weight w = {.format = DSQ_WF_F32, .rows = 2, .cols = 8, .data = wf, .layout = DSQ_WL_GATE_UP};
    assert_int_equal(dsq_cpu_linear(y, 2, x, 8, 1, &w, NULL, 0, 2, 0, wbuf), DSQ_ERR_UNSUPPORTED);
    w.layout = DSQ_WL_ROWS;
    assert_int_equal(dsq_cpu_linear(y, 2, x, 8, 1, &w, NULL, 0, 2, 0, wbuf), DSQ_OK);
    assert_true(y[0] == dsq_cpu_dot(x, wf, 8) && y[1] == dsq_cpu_dot(x, wf + 8, 8));

    /* Q8_ROW and Q4_G128 run lib/quant_cpu_matmul.c's products (wbuf:
     * dsq_quant_scratch_floats(K)); these small integer products are exact
     * in any summation order, so they equal the dense numbers on the
     * dequantized rows */
    float *qbuf = malloc(dsq_quant_scratch_floats(8) * sizeof(float)), deq[16];
    assert_non_null(qbuf);
    const int8_t q8[16] = {1, -2, 3, -4, 5, -6, 7, -8, 127, -127, 0, 1, 2, 3, 4, 5};
    const float s8[2] = {0.5f, 0.25f};
    for (int i = 0; i < 16; i++)
        deq[i] = (float)q8[i] * s8[i / 8];
    dsq_weight w8 = {.format = DSQ_WF_Q8_ROW, .rows = 2, .cols = 8, .data = q8, .scales = s8};
    assert_int_equal(dsq_cpu_linear(y, 2, x, 8, 1, &w8, NULL, 0, 2, 0, qbuf), DSQ_OK);
    assert_true(y[0] == dsq_cpu_dot(x, deq, 8) && y[1] == dsq_cpu_dot(x, deq + 8, 8));
    /* Q4: K = 8 -> 16 bytes per row (one 32-code piece), one group */
    uint8_t q4[32] = {0};
    for (int i = 0; i < 8; i++) {
        q4[i / 2] |= (uint8_t)((i * 2 % 16) << (4 * (i % 2)));
        q4[16 + i / 2] |= (uint8_t)((15 - i) << (4 * (i % 2)));
    }
    const uint16_t s4[2] = {0x3800, 0x3c00}; /* 0.5, 1.0 */
    const uint8_t z4[2] = {3, 8};
    for (int i = 0; i < 8; i++) {
        deq[i] = (float)(i * 2 % 16 - 3) * 0.5f;
        deq[8 + i] = (float)(15 - i - 8) * 1.0f;
    }
    dsq_weight w4 = {.format = DSQ_WF_Q4_G128, .rows = 2, .cols = 8, .data = q4, .scales = s4,
                     .zeros = z4, .group_size = 128};
    assert_int_equal(dsq_cpu_linear(y, 2, x, 8, 1, &w4, NULL, 0, 2, 0, qbuf), DSQ_OK);
    assert_true(y[0] == dsq_cpu_dot(x, deq, 8) && y[1] == dsq_cpu_dot(x, deq + 8, 8));
    free(qbuf);
}

static void test_matmul(void **state)
{
    (void)state;
    check_matmul(DSQ_DT_BF16, 1, 37, 129, 1, 0);
    check_matmul(DSQ_DT_BF16, 5, 101, 77, 0, 1);
    check_matmul(DSQ_DT_F16, 7, 23, 200, 1, 1);
    check_matmul(DSQ_DT_F32, 3, 9, 5, 1, 0);
    check_matmul(DSQ_DT_F32, 2, 66, 64, 0, 0);
    /* K large enough that tokens are processed in several L2 blocks */
    check_matmul(DSQ_DT_BF16, 37, 13, 9001, 1, 0);
}

/* ---- norms, rope, activation ----------------------------------------------------- */

static void test_rmsnorm(void **state)
{
    (void)state;
    const int64_t n = 1003;
    double *wref;
    dsq_tensor w = make_tensor(DSQ_DT_BF16, n, 0, 1.5f, &wref);
    float *x = malloc(n * 4), *y = malloc(n * 4);
    double *ref = malloc(n * sizeof(double));
    fill(x, n, 4.0f);
    poison(y, n);
    const float eps = 1e-6f;
    dsq_cpu_rmsnorm(y, x, &w, n, eps);
    double ss = 0;
    for (int64_t i = 0; i < n; i++)
        ss += (double)x[i] * x[i];
    double r = 1.0 / sqrt(ss / n + eps);
    for (int64_t i = 0; i < n; i++)
        ref[i] = x[i] * r * wref[i];
    double err = rel_err_d(y, ref, n);
    printf("rmsnorm n=%lld: rel err %.3e\n", (long long)n, err);
    assert_true(err < 1e-6);
    free(x);
    free(y);
    free(ref);
    free(wref);
    free((void *)w.data);
}

static void test_rope(void **state)
{
    (void)state;
    const int32_t D = 128, half = 64;
    float inv[64], cs[128];
    dsq_cpu_rope_inv_freq(inv, D, 10000.0f);
    for (int i = 0; i < half; i++) {
        double exact = pow(10000.0, -2.0 * i / D);
        double ulp = (double)nextafterf(inv[i], INFINITY) - (double)inv[i];
        assert_true(fabs(inv[i] - exact) <= 1.5 * ulp);
    }
    const int32_t positions[] = {0, 1, 17, 1000, 4095};
    double max_err = 0;
    for (size_t pi = 0; pi < sizeof positions / sizeof positions[0]; pi++) {
        int32_t pos = positions[pi];
        dsq_cpu_rope_table(cs, inv, half, pos);
        float x[128], y[128];
        fill(x, D, 2.0f);
        memcpy(y, x, sizeof x);
        dsq_cpu_rope_apply(y, cs, D);
        double ref[128];
        for (int i = 0; i < half; i++) {
            /* the fp32 angle, as HF forms it; trig and rotation in double */
            double a = (double)((float)pos * inv[i]);
            ref[i] = x[i] * cos(a) - x[i + half] * sin(a);
            ref[i + half] = x[i + half] * cos(a) + x[i] * sin(a);
        }
        double err = rel_err_d(y, ref, D);
        max_err = err > max_err ? err : max_err;
    }
    printf("rope D=%d: rel err %.3e over positions up to 4095\n", D, max_err);
    assert_true(max_err < 1e-6);
    /* odd-ish head dim */
    float inv6[3], cs6[6];
    dsq_cpu_rope_inv_freq(inv6, 6, 500.0f);
    dsq_cpu_rope_table(cs6, inv6, 3, 5);
    for (int i = 0; i < 3; i++) {
        double a = 5.0 * pow(500.0, -2.0 * i / 6);
        assert_true(fabs(cs6[i] - cos(a)) < 1e-5 && fabs(cs6[3 + i] - sin(a)) < 1e-5);
    }
}

static void test_silu_mul(void **state)
{
    (void)state;
    const int64_t n = 517;
    float *g = malloc(n * 4), *u = malloc(n * 4);
    double *ref = malloc(n * sizeof(double));
    fill(g, n, 12.0f);
    fill(u, n, 3.0f);
    for (int64_t i = 0; i < n; i++)
        ref[i] = g[i] / (1.0 + exp(-(double)g[i])) * u[i];
    dsq_cpu_silu_mul(g, u, n);
    double err = rel_err_d(g, ref, n);
    printf("silu*up n=%lld: rel err %.3e\n", (long long)n, err);
    assert_true(err < 1e-6);
    free(g);
    free(u);
    free(ref);
}

/* ---- KV storage and attention ------------------------------------------------------ */

static void test_kv_roundtrip(void **state)
{
    (void)state;
    const int32_t D = 131;
    float x[131], y[131];
    uint8_t buf[131 * 4];
    for (int dt = 0; dt < 3; dt++) {
        float scale = NAN;
        fill(x, D, 7.0f);
        x[5] = 0.0f;
        poison(y, D);
        dsq_cpu_kv_store(buf, &scale, dt, x, D);
        dsq_cpu_kv_load(y, buf, &scale, dt, D);
        double maxd = 0;
        for (int d = 0; d < D; d++) {
            double e = fabs((double)y[d] - x[d]);
            maxd = e > maxd ? e : maxd;
            if (dt == DSQ_KV_F32)
                assert_true(y[d] == x[d]);
            else if (dt == DSQ_KV_F16)
                assert_true(y[d] == dsq_f16_to_f32(dsq_f32_to_f16(x[d])));
            else {
                /* the documented formula, step by step */
                float amax = 0;
                for (int j = 0; j < D; j++)
                    amax = fabsf(x[j]) > amax ? fabsf(x[j]) : amax;
                float s = amax / 127.0f;
                assert_true(scale == s);
                float q = rintf(x[d] / s);
                assert_true(y[d] == q * s);
                assert_true(fabs((double)y[d] - x[d]) <= 0.5 * s * (1 + 1e-6));
            }
        }
        printf("kv %s roundtrip: max abs err %.3e (|x| < 7)\n",
               dt == DSQ_KV_F32 ? "F32" : dt == DSQ_KV_F16 ? "F16" : "INT8", maxd);
    }
    /* all zeros: INT8 must not divide by zero */
    float scale = NAN;
    memset(x, 0, sizeof x);
    dsq_cpu_kv_store(buf, &scale, DSQ_KV_INT8, x, D);
    dsq_cpu_kv_load(y, buf, &scale, DSQ_KV_INT8, D);
    for (int d = 0; d < D; d++)
        assert_true(y[d] == 0.0f);
}

static void check_attention(int32_t kv_dtype, int32_t n_kv, int32_t n_rep, int32_t D, int32_t n_ctx)
{
    const int64_t n_rows = n_ctx * 2 + 3;
    size_t esz = dsq_cpu_kv_elem_size(kv_dtype);
    uint8_t *K = calloc((size_t)n_rows * n_kv * D, esz), *V = calloc((size_t)n_rows * n_kv * D, esz);
    float *ks = calloc((size_t)n_rows * n_kv, 4), *vs = calloc((size_t)n_rows * n_kv, 4);
    /* the sequence's rows are scattered, as in a paged cache */
    int64_t *rows = malloc((size_t)n_ctx * sizeof(int64_t));
    for (int32_t p = 0; p < n_ctx; p++)
        rows[p] = (int64_t)((p * 7 + 3) % n_rows);
    /* rows must be distinct for the test to make sense */
    if (n_rows % 7 == 0)
        for (int32_t p = 0; p < n_ctx; p++)
            rows[p] = 2 * p + 1;
    float *vec = malloc((size_t)D * 4);
    for (int64_t r = 0; r < n_rows; r++)
        for (int32_t h = 0; h < n_kv; h++) {
            size_t slot = (size_t)r * n_kv + h;
            fill(vec, D, 2.0f);
            dsq_cpu_kv_store(K + slot * D * esz, ks + slot, kv_dtype, vec, D);
            fill(vec, D, 2.0f);
            dsq_cpu_kv_store(V + slot * D * esz, vs + slot, kv_dtype, vec, D);
        }
    dsq_cpu_kv_view kv = {K, V, ks, vs, kv_dtype, n_kv, D};
    const int32_t head = n_kv - 1;
    float *q = malloc((size_t)n_rep * D * 4), *out = malloc((size_t)n_rep * D * 4);
    float *scores = malloc((size_t)n_rep * n_ctx * 4), *tmp = malloc((size_t)D * 4);
    fill(q, (size_t)n_rep * D, 1.5f);
    poison(out, (size_t)n_rep * D);
    poison(scores, (size_t)n_rep * n_ctx);
    float scale = (float)(1.0 / sqrt((double)D));
    dsq_cpu_attend(&kv, head, rows, n_ctx, q, n_rep, scale, out, scores, tmp);

    double *ref = calloc((size_t)n_rep * D, sizeof(double));
    double *s = malloc((size_t)n_ctx * sizeof(double));
    float *kf = malloc((size_t)D * 4), *vf = malloc((size_t)D * 4);
    for (int32_t r = 0; r < n_rep; r++) {
        double m = -INFINITY, sum = 0;
        for (int32_t p = 0; p < n_ctx; p++) {
            size_t slot = (size_t)rows[p] * n_kv + head;
            dsq_cpu_kv_load(kf, K + slot * D * esz, ks + slot, kv_dtype, D);
            double dot = 0;
            for (int32_t d = 0; d < D; d++)
                dot += (double)q[r * D + d] * kf[d];
            s[p] = dot / sqrt((double)D);
            m = s[p] > m ? s[p] : m;
        }
        for (int32_t p = 0; p < n_ctx; p++)
            sum += (s[p] = exp(s[p] - m));
        for (int32_t p = 0; p < n_ctx; p++) {
            size_t slot = (size_t)rows[p] * n_kv + head;
            dsq_cpu_kv_load(vf, V + slot * D * esz, vs + slot, kv_dtype, D);
            for (int32_t d = 0; d < D; d++)
                ref[r * D + d] += s[p] / sum * vf[d];
        }
    }
    double err = rel_err_d(out, ref, (size_t)n_rep * D);
    printf("attention kv=%d n_kv=%d n_rep=%d D=%d n_ctx=%d: rel err %.3e\n", kv_dtype, n_kv, n_rep, D,
           n_ctx, err);
    assert_true(err < 2e-6);
    free(K);
    free(V);
    free(ks);
    free(vs);
    free(rows);
    free(vec);
    free(q);
    free(out);
    free(scores);
    free(tmp);
    free(ref);
    free(s);
    free(kf);
    free(vf);
}

static void test_attention(void **state)
{
    (void)state;
    check_attention(DSQ_KV_F32, 2, 6, 128, 1);
    check_attention(DSQ_KV_F32, 3, 2, 37, 101);
    check_attention(DSQ_KV_F16, 2, 3, 64, 77);
    check_attention(DSQ_KV_INT8, 1, 5, 130, 300);
}

/* Non-finite K/V (issue 14, defect 4): INT8 converted NaN to int8 (undefined)
 * and an Inf gave a scale of Inf, so a corrupted vector read back finite.
 * Now: F32 keeps it, F16 keeps NaN/Inf (and overflows past 65504 to Inf),
 * INT8 reads back all NaN; finite vectors are unchanged. */
static void test_kv_nonfinite(void **state)
{
    (void)state;
    const int32_t D = 67;
    const float bad[3] = { NAN, INFINITY, -INFINITY };
    float x[67], y[67];
    uint8_t buf[67 * 4];
    for (int dt = 0; dt < 3; dt++)
        for (int b = 0; b < 3; b++)
            for (int at = 0; at < D; at += 33) {
                fill(x, D, 3.0f);
                x[at] = bad[b];
                float scale = 1.0f;
                poison(y, D);
                dsq_cpu_kv_store(buf, &scale, dt, x, D);
                dsq_cpu_kv_load(y, buf, &scale, dt, D);
                for (int d = 0; d < D; d++) {
                    if (dt == DSQ_KV_INT8) {
                        if (!isnan(y[d]))
                            fail_msg("INT8, x[%d] = %g: read back y[%d] = %g, want NaN", at,
                                     (double)bad[b], d, (double)y[d]);
                    } else if (d == at) {
                        assert_true(isnan(bad[b]) ? isnan(y[d]) : y[d] == bad[b]);
                    } else {
                        assert_true(isfinite(y[d]));
                    }
                }
            }
    /* finite but beyond fp16: F16 overflows to Inf (IEEE, as the CUDA
     * kernels store it); INT8 and F32 stay finite */
    fill(x, D, 3.0f);
    x[10] = 1e5f;
    x[11] = -3e38f;
    for (int dt = 0; dt < 3; dt++) {
        float scale = 1.0f;
        dsq_cpu_kv_store(buf, &scale, dt, x, D);
        dsq_cpu_kv_load(y, buf, &scale, dt, D);
        if (dt == DSQ_KV_F16) {
            assert_true(y[10] == INFINITY && y[11] == -INFINITY);
        } else {
            for (int d = 0; d < D; d++)
                assert_true(isfinite(y[d]));
        }
    }
}

/* A NaN or Inf in one cached K or V vector makes the attention output of
 * every query that attends to it non-finite, with every KV dtype; queries
 * that do not reach it (fewer positions) stay finite. */
static void test_attention_nonfinite(void **state)
{
    (void)state;
    const int32_t D = 64, n_kv = 2, n_rep = 3, n_ctx = 9, head = 1, bad_pos = 5;
    const size_t n_rows = (size_t)n_ctx;
    int64_t rows[9];
    for (int p = 0; p < n_ctx; p++)
        rows[p] = n_ctx - 1 - p;
    float vec[64], q[3 * 64], out[3 * 64], scores[3 * 9], tmp[64];
    const float bad[3] = { NAN, INFINITY, -INFINITY };
    for (int dt = 0; dt < 3; dt++)
        for (int side = 0; side < 2; side++)
            for (int b = 0; b < 3; b++) {
                size_t esz = dsq_cpu_kv_elem_size(dt);
                uint8_t *K = calloc(n_rows * n_kv * D, esz), *V = calloc(n_rows * n_kv * D, esz);
                float ks[9 * 2], vs[9 * 2];
                for (size_t r = 0; r < n_rows; r++)
                    for (int h = 0; h < n_kv; h++) {
                        size_t slot = r * n_kv + h;
                        fill(vec, D, 1.0f);
                        if (h == head && (int64_t)r == rows[bad_pos] && side == 0)
                            vec[7] = bad[b];
                        dsq_cpu_kv_store(K + slot * D * esz, ks + slot, dt, vec, D);
                        fill(vec, D, 1.0f);
                        if (h == head && (int64_t)r == rows[bad_pos] && side == 1)
                            vec[7] = bad[b];
                        dsq_cpu_kv_store(V + slot * D * esz, vs + slot, dt, vec, D);
                    }
                dsq_cpu_kv_view kv = {K, V, ks, vs, dt, n_kv, D};
                fill(q, (size_t)n_rep * D, 1.0f);
                for (int r = 0; r < n_rep; r++)
                    q[r * D + 7] = 1.0f; /* K[7] = +-Inf gives a score of +-Inf */
                /* IEEE: a score of -Inf is weight 0 (a masked key), so F32
                 * and F16 K = -Inf give finite output; INT8 cannot store
                 * -Inf and reads the vector back as NaN */
                const int masked = side == 0 && b == 2 && dt != DSQ_KV_INT8;
                /* a query that stops before bad_pos, then one that reaches it */
                for (int reach = 0; reach < 2; reach++) {
                    int32_t nc = reach ? n_ctx : bad_pos;
                    poison(out, (size_t)n_rep * D);
                    dsq_cpu_attend(&kv, head, rows, nc, q, n_rep, 0.125f, out, scores, tmp);
                    int n_bad = 0;
                    for (int i = 0; i < n_rep * D; i++)
                        n_bad += !isfinite(out[i]);
                    if (reach && !masked ? n_bad == 0 : n_bad != 0)
                        fail_msg("kv dtype %d, %s[%d][7] = %g, %d positions: %d of %d outputs "
                                 "non-finite", dt, side ? "V" : "K", bad_pos, (double)bad[b], nc,
                                 n_bad, n_rep * D);
                }
                free(K);
                free(V);
            }
}

/* ---- thread pool ------------------------------------------------------------------- */

typedef struct pool_probe {
    atomic_int *hits;
    atomic_int bad_thread;
    int n_threads;
} pool_probe;

static void probe_task(void *arg, int64_t task, int thread)
{
    pool_probe *p = arg;
    atomic_fetch_add(&p->hits[task], 1);
    if (thread < 0 || thread >= p->n_threads)
        atomic_store(&p->bad_thread, 1);
}

static void test_threadpool(void **state)
{
    (void)state;
    const int counts[] = {1, 2, 3, 5};
    for (size_t ci = 0; ci < sizeof counts / sizeof counts[0]; ci++) {
        dsq_cpu_pool *pool = NULL;
        assert_int_equal(dsq_cpu_pool_new(counts[ci], &pool), DSQ_OK);
        assert_int_equal(dsq_cpu_pool_threads(pool), counts[ci]);
        for (int rep = 0; rep < 200; rep++) {
            int64_t n = 1 + (rep * 37) % 97;
            atomic_int hits[97];
            for (int i = 0; i < 97; i++)
                atomic_init(&hits[i], 0);
            pool_probe p = {.hits = hits, .n_threads = counts[ci]};
            atomic_init(&p.bad_thread, 0);
            dsq_cpu_pool_run(pool, n, probe_task, &p);
            for (int64_t i = 0; i < 97; i++)
                assert_int_equal(atomic_load(&hits[i]), i < n ? 1 : 0);
            assert_int_equal(atomic_load(&p.bad_thread), 0);
        }
        dsq_cpu_pool_run(pool, 0, probe_task, NULL); /* no tasks: no call */
        dsq_cpu_pool_free(pool);
    }
    dsq_cpu_pool_free(NULL);
}

/* ---- whole forward pass on a small random model ----------------------------------- */

typedef struct mini {
    dsq_model m;
    double **ref;    /* reference copies of every tensor, by index */
    int n_ref;
    dsq_tensor *all[64];
} mini;

enum { MINI_E = 48, MINI_H = 4, MINI_KV = 2, MINI_D = 12, MINI_F = 37, MINI_V = 91, MINI_L = 2 };

typedef struct ref_layer {
    double *an, *wq, *wk, *wv, *bq, *bk, *bv, *wo, *fn, *wg, *wu, *wd;
} ref_layer;
typedef struct ref_model {
    double *emb, *on, *head;
    ref_layer l[MINI_L];
} ref_model;

static void mini_build(dsq_model *m, ref_model *r, int tied)
{
    memset(m, 0, sizeof *m);
    memset(r, 0, sizeof *r);
    dsq_config *c = &m->cfg;
    c->n_vocab = MINI_V;
    c->n_embd = MINI_E;
    c->n_layers = MINI_L;
    c->n_heads = MINI_H;
    c->n_kv_heads = MINI_KV;
    c->head_dim = MINI_D;
    c->n_ff = MINI_F;
    c->max_pos = 64;
    c->rope_theta = 10000.0f;
    c->rms_eps = 1e-6f;
    c->tie_embeddings = tied;
    c->bos_token = c->eos_token = -1;
    c->arch = &dsq_arch_qwen2;
    m->w.g[DSQ_GW_TOK_EMBD] = make_tensor(DSQ_DT_BF16, MINI_V, MINI_E, 1.0f, &r->emb);
    m->w.layers = calloc(MINI_L, sizeof(dsq_layer_weights));
    for (int l = 0; l < MINI_L; l++) {
        dsq_layer_weights *L = &m->w.layers[l];
        ref_layer *R = &r->l[l];
        /* norms near 1, biases random: default inits would hide bugs */
        L->t[DSQ_LW_ATTN_NORM] = make_tensor(DSQ_DT_BF16, MINI_E, 0, 0.5f, &R->an);
        for (int i = 0; i < MINI_E; i++) {
            ((uint16_t *)L->t[DSQ_LW_ATTN_NORM].data)[i] = dsq_f32_to_bf16((float)(R->an[i] + 1.0));
            R->an[i] = dsq_bf16_to_f32(((uint16_t *)L->t[DSQ_LW_ATTN_NORM].data)[i]);
        }
        L->t[DSQ_LW_Q] = make_tensor(DSQ_DT_BF16, MINI_H * MINI_D, MINI_E, 0.3f, &R->wq);
        L->t[DSQ_LW_K] = make_tensor(DSQ_DT_F16, MINI_KV * MINI_D, MINI_E, 0.3f, &R->wk);
        L->t[DSQ_LW_V] = make_tensor(DSQ_DT_F32, MINI_KV * MINI_D, MINI_E, 0.3f, &R->wv);
        L->t[DSQ_LW_Q_BIAS] = make_tensor(DSQ_DT_BF16, MINI_H * MINI_D, 0, 0.5f, &R->bq);
        L->t[DSQ_LW_K_BIAS] = make_tensor(DSQ_DT_BF16, MINI_KV * MINI_D, 0, 0.5f, &R->bk);
        L->t[DSQ_LW_V_BIAS] = make_tensor(DSQ_DT_BF16, MINI_KV * MINI_D, 0, 0.5f, &R->bv);
        L->t[DSQ_LW_O] = make_tensor(DSQ_DT_BF16, MINI_E, MINI_H * MINI_D, 0.3f, &R->wo);
        L->t[DSQ_LW_FFN_NORM] = make_tensor(DSQ_DT_F32, MINI_E, 0, 1.5f, &R->fn);
        L->t[DSQ_LW_GATE] = make_tensor(DSQ_DT_BF16, MINI_F, MINI_E, 0.3f, &R->wg);
        L->t[DSQ_LW_UP] = make_tensor(DSQ_DT_BF16, MINI_F, MINI_E, 0.3f, &R->wu);
        L->t[DSQ_LW_DOWN] = make_tensor(DSQ_DT_BF16, MINI_E, MINI_F, 0.3f, &R->wd);
    }
    m->w.g[DSQ_GW_OUT_NORM] = make_tensor(DSQ_DT_BF16, MINI_E, 0, 1.5f, &r->on);
    if (tied) {
        m->w.g[DSQ_GW_LM_HEAD] = m->w.g[DSQ_GW_TOK_EMBD];
        r->head = r->emb;
    } else {
        m->w.g[DSQ_GW_LM_HEAD] = make_tensor(DSQ_DT_BF16, MINI_V, MINI_E, 0.5f, &r->head);
    }
    m->ops = &dsq_cpu_backend;
    assert_int_equal(dsq_cpu_backend.model_load(m, NULL), DSQ_OK);
}

static void mini_free(dsq_model *m, ref_model *r)
{
    dsq_cpu_backend.model_free(m);
    free((void *)m->w.g[DSQ_GW_TOK_EMBD].data);
    free(r->emb);
    for (int l = 0; l < MINI_L; l++) {
        dsq_layer_weights *L = &m->w.layers[l];
        ref_layer *R = &r->l[l];
        const dsq_tensor *ts[] = {&L->t[DSQ_LW_ATTN_NORM], &L->t[DSQ_LW_Q], &L->t[DSQ_LW_K], &L->t[DSQ_LW_V], &L->t[DSQ_LW_Q_BIAS], &L->t[DSQ_LW_K_BIAS],
                                  &L->t[DSQ_LW_V_BIAS], &L->t[DSQ_LW_O], &L->t[DSQ_LW_FFN_NORM], &L->t[DSQ_LW_GATE], &L->t[DSQ_LW_UP], &L->t[DSQ_LW_DOWN]};
        double *rs[] = {R->an, R->wq, R->wk, R->wv, R->bq, R->bk, R->bv, R->wo, R->fn, R->wg, R->wu, R->wd};
        for (int i = 0; i < 12; i++) {
            free((void *)ts[i]->data);
            free(rs[i]);
        }
    }
    free(m->w.layers);
    free((void *)m->w.g[DSQ_GW_OUT_NORM].data);
    free(r->on);
    if (!m->cfg.tie_embeddings) {
        free((void *)m->w.g[DSQ_GW_LM_HEAD].data);
        free(r->head);
    }
}

static void ref_rmsnorm(double *y, const double *x, const double *w, int n, double eps)
{
    double ss = 0;
    for (int i = 0; i < n; i++)
        ss += x[i] * x[i];
    double r = 1.0 / sqrt(ss / n + eps);
    for (int i = 0; i < n; i++)
        y[i] = x[i] * r * w[i];
}

static void ref_linear(double *y, const double *x, const double *w, const double *b, int n_out, int n_in)
{
    for (int o = 0; o < n_out; o++) {
        double s = b ? b[o] : 0;
        for (int i = 0; i < n_in; i++)
            s += x[i] * w[(size_t)o * n_in + i];
        y[o] = s;
    }
}

/* Logits [n][V] of every position of `toks` run as one causal sequence. */
static void ref_forward(const ref_model *r, const int32_t *toks, int n, double *logits)
{
    const int E = MINI_E, H = MINI_H, KV = MINI_KV, D = MINI_D, F = MINI_F;
    double *x = calloc((size_t)n * E, 8), *xn = malloc((size_t)E * 8);
    double *q = malloc((size_t)n * H * D * 8), *k = malloc((size_t)n * KV * D * 8);
    double *v = malloc((size_t)n * KV * D * 8), *att = malloc((size_t)H * D * 8);
    double *tmp = malloc((size_t)E * 8), *g = malloc((size_t)F * 8), *u = malloc((size_t)F * 8);
    double *s = malloc((size_t)n * 8);
    for (int t = 0; t < n; t++)
        for (int i = 0; i < E; i++)
            x[t * E + i] = r->emb[(size_t)toks[t] * E + i];
    for (int l = 0; l < MINI_L; l++) {
        const ref_layer *R = &r->l[l];
        for (int t = 0; t < n; t++) {
            ref_rmsnorm(xn, x + t * E, R->an, E, 1e-6);
            ref_linear(q + t * H * D, xn, R->wq, R->bq, H * D, E);
            ref_linear(k + t * KV * D, xn, R->wk, R->bk, KV * D, E);
            ref_linear(v + t * KV * D, xn, R->wv, R->bv, KV * D, E);
            for (int h = 0; h < H + KV; h++) {
                double *vec = h < H ? q + (t * H + h) * D : k + (t * KV + h - H) * D;
                for (int i = 0; i < D / 2; i++) {
                    double a = t * pow(10000.0, -2.0 * i / D);
                    double x0 = vec[i], x1 = vec[i + D / 2];
                    vec[i] = x0 * cos(a) - x1 * sin(a);
                    vec[i + D / 2] = x1 * cos(a) + x0 * sin(a);
                }
            }
        }
        for (int t = 0; t < n; t++) {
            for (int h = 0; h < H; h++) {
                int kh = h / (H / KV);
                double m = -INFINITY, sum = 0;
                for (int p = 0; p <= t; p++) {
                    double d = 0;
                    for (int i = 0; i < D; i++)
                        d += q[(t * H + h) * D + i] * k[(p * KV + kh) * D + i];
                    s[p] = d / sqrt((double)D);
                    m = s[p] > m ? s[p] : m;
                }
                for (int p = 0; p <= t; p++)
                    sum += (s[p] = exp(s[p] - m));
                for (int i = 0; i < D; i++) {
                    double o = 0;
                    for (int p = 0; p <= t; p++)
                        o += s[p] / sum * v[(p * KV + kh) * D + i];
                    att[h * D + i] = o;
                }
            }
            ref_linear(tmp, att, R->wo, NULL, E, H * D);
            for (int i = 0; i < E; i++)
                x[t * E + i] += tmp[i];
            ref_rmsnorm(xn, x + t * E, R->fn, E, 1e-6);
            ref_linear(g, xn, R->wg, NULL, F, E);
            ref_linear(u, xn, R->wu, NULL, F, E);
            for (int i = 0; i < F; i++)
                g[i] = g[i] / (1 + exp(-g[i])) * u[i];
            ref_linear(tmp, g, R->wd, NULL, E, F);
            for (int i = 0; i < E; i++)
                x[t * E + i] += tmp[i];
        }
    }
    for (int t = 0; t < n; t++) {
        ref_rmsnorm(xn, x + t * E, r->on, E, 1e-6);
        ref_linear(logits + (size_t)t * MINI_V, xn, r->head, NULL, MINI_V, E);
    }
    free(x);
    free(xn);
    free(q);
    free(k);
    free(v);
    free(att);
    free(tmp);
    free(g);
    free(u);
    free(s);
}

static double rel_err_rows(const float *a, const double *ref, int rows)
{
    return rel_err_d(a, ref, (size_t)rows * MINI_V);
}

static void run_forward_case(int tied, int layout, int n_threads, int max_batch)
{
    dsq_model m;
    ref_model r;
    mini_build(&m, &r, tied);
    enum { NP = 13, ND = 6 };
    int32_t toks[NP + ND];
    for (int i = 0; i < NP + ND; i++)
        toks[i] = (int32_t)(rng_u64() % MINI_V);
    double *ref = malloc((size_t)(NP + ND) * MINI_V * 8);
    ref_forward(&r, toks, NP + ND, ref);

    dsq_ctx_params cp = dsq_ctx_default_params();
    cp.max_seqs = 3;
    cp.max_context = 40;
    cp.max_batch_tokens = max_batch;
    cp.kv_layout = layout;
    cp.kv_dtype = DSQ_KV_F32;
    cp.kv_block_size = 4;
    cp.n_threads = n_threads;
    dsq_ctx *c = NULL;
    assert_int_equal(dsq_ctx_new(&m, &cp, &c), DSQ_OK);
    float *lg = malloc((size_t)(NP + ND) * MINI_V * 4);
    poison(lg, (size_t)(NP + ND) * MINI_V);
    /* sequence 2, so rows of slot 0 are not what gets used */
    assert_int_equal(dsq_prefill(c, 2, toks, NP, DSQ_LOGITS_ALL, lg), DSQ_OK);
    for (int i = 0; i < ND; i++) {
        int32_t s = 2;
        assert_int_equal(dsq_decode_step(c, 1, &s, &toks[NP + i], lg + (size_t)(NP + i) * MINI_V), DSQ_OK);
    }
    double e_pre = rel_err_rows(lg, ref, NP);
    double e_dec = rel_err_rows(lg + (size_t)NP * MINI_V, ref + (size_t)NP * MINI_V, ND);
    printf("mini forward tied=%d %s threads=%d max_batch=%d: prefill rel err %.3e, decode %.3e\n", tied,
           layout == DSQ_KV_PAGED ? "paged" : "static", n_threads, max_batch, e_pre, e_dec);
    assert_true(e_pre < 1e-5);
    assert_true(e_dec < 1e-5);
    dsq_ctx_free(c);
    free(lg);
    free(ref);
    mini_free(&m, &r);
}

static void test_forward_vs_naive(void **state)
{
    (void)state;
    run_forward_case(0, DSQ_KV_STATIC, 1, 64);
    run_forward_case(0, DSQ_KV_PAGED, 3, 5);
    run_forward_case(1, DSQ_KV_STATIC, 2, 4);
    run_forward_case(1, DSQ_KV_PAGED, 2, 64);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_f16_exhaustive), cmocka_unit_test(test_row_convert),
        cmocka_unit_test(test_dot),            cmocka_unit_test(test_matmul),
        cmocka_unit_test(test_linear_formats),
        cmocka_unit_test(test_rmsnorm),        cmocka_unit_test(test_rope),
        cmocka_unit_test(test_silu_mul),       cmocka_unit_test(test_kv_roundtrip),
        cmocka_unit_test(test_attention),      cmocka_unit_test(test_threadpool),
        cmocka_unit_test(test_kv_nonfinite),   cmocka_unit_test(test_attention_nonfinite),
        cmocka_unit_test(test_forward_vs_naive),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
