/*
 * test_cuda_quant.cu - the quantized-weight GPU kernels (cuda/gemv_quant.cu,
 * and the Q8 / Q4 instances of cuda/gemm_rows.cu) against the CPU products
 * of lib/quant_cpu_matmul.c, which are the reference.
 *
 * Weights are quantized on the host (dsq_q8_quantize_rows /
 * dsq_q4_quantize_rows) from random bf16 matrices of odd sizes, uploaded
 * as they are; activations are random bf16, given to the CPU as their exact
 * fp32 values.  Every output buffer is filled with NaN first.  Tolerance:
 * both sides sum exact products x * w' in fp32 in different orders, so the
 * difference is bounded by a few K x 2^-24 x sum|x w'|; SILU_MUL outputs are
 * bf16 (half an ulp, 2^-9 relative, on top).  Sizes cover the 16-byte paths
 * (K % 32 == 0 for Q4, K % 16 == 0 for Q8), the scalar paths (other K, a
 * misaligned x) and partial last groups, T = 1..8, every epilogue and the
 * explicit block shapes.  The bf16 dequantization kernels must equal
 * bf16(CPU dequantization) bit for bit.  Exits 77 (skipped) without a GPU.
 *
 * The gemm_rows.cu cases (test_gemm_rows_q8 / _q4 and the gemm_rows
 * column of the timing table) were written in a session without a GPU
 * (stop 24): compiled, not yet run.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime.h>

extern "C" {
#include "testutil.h"
}
#include "gemv_quant.h"
#include "internal.h"
#include "quant_cpu.h"
#include "rows_kernel.h"

static uint64_t g_rng;

static uint64_t rng_next(void)
{
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return g_rng;
}

static float frand(float a) { return a * (2.0f * (float)((rng_next() >> 40) * (1.0 / 16777216.0)) - 1.0f); }

#define CU(call) assert_int_equal((int)(call), (int)cudaSuccess)
#define DS(call) assert_int_equal((int)(call), (int)DSQ_OK)

static void *dev_copy(const void *h, size_t bytes)
{
    void *d = NULL;
    CU(cudaMalloc(&d, bytes ? bytes : 16));
    if (bytes)
        CU(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice));
    return d;
}

static void *dev_nan(size_t bytes)
{
    void *d = NULL;
    CU(cudaMalloc(&d, bytes ? bytes : 16));
    CU(cudaMemset(d, 0xff, bytes ? bytes : 16));
    return d;
}

static void to_host(void *h, const void *d, size_t bytes)
{
    CU(cudaDeviceSynchronize());
    CU(cudaMemcpy(h, d, bytes, cudaMemcpyDeviceToHost));
}

/* One quantized matrix on host and device. */
typedef struct qmat {
    int is_q4;
    int64_t N, K;
    dsq_q8_mat h8;
    dsq_q4_mat h4;
    float *deq;        /* [N][K] exact dequantized weights */
    void *dq, *ds, *dz; /* device copies */
} qmat;

static qmat make_qmat(int is_q4, int64_t N, int64_t K)
{
    qmat m;
    memset(&m, 0, sizeof m);
    m.is_q4 = is_q4, m.N = N, m.K = K;
    uint16_t *w = (uint16_t *)malloc((size_t)(N * K) * 2);
    for (int64_t i = 0; i < N * K; i++)
        w[i] = dsq_f32_to_bf16(frand((i / K) % 7 == 2 ? 0.02f : 0.5f));
    m.deq = (float *)malloc((size_t)(N * K) * 4);
    if (is_q4) {
        uint8_t *q = (uint8_t *)malloc(dsq_q4_q_bytes(N, K));
        uint16_t *s = (uint16_t *)malloc(dsq_q4_scales_bytes(N, K));
        uint8_t *z = (uint8_t *)malloc(dsq_q4_zeros_bytes(N, K));
        DS(dsq_q4_quantize_rows(w, DSQ_DT_BF16, K, 0, N, q, s, z));
        m.h4 = (dsq_q4_mat){q, s, z, N, K};
        dsq_q4_dequant_rows(&m.h4, 0, N, m.deq);
        m.dq = dev_copy(q, dsq_q4_q_bytes(N, K));
        m.ds = dev_copy(s, dsq_q4_scales_bytes(N, K));
        m.dz = dev_copy(z, dsq_q4_zeros_bytes(N, K));
    } else {
        int8_t *q = (int8_t *)malloc((size_t)(N * K));
        float *s = (float *)malloc((size_t)N * 4);
        DS(dsq_q8_quantize_rows(w, DSQ_DT_BF16, K, 0, N, q, s));
        m.h8 = (dsq_q8_mat){q, s, N, K};
        dsq_q8_dequant_rows(&m.h8, 0, N, m.deq);
        m.dq = dev_copy(q, (size_t)(N * K));
        m.ds = dev_copy(s, (size_t)N * 4);
    }
    free(w);
    return m;
}

static void free_qmat(qmat *m)
{
    free((void *)m->h8.q), free((void *)m->h8.scales);
    free((void *)m->h4.q), free((void *)m->h4.scales), free((void *)m->h4.zeros);
    free(m->deq);
    cudaFree(m->dq), cudaFree(m->ds), cudaFree(m->dz);
}

/* The backend's weight descriptor of a test matrix (rows layout) */
static dsq_weight qweight_of(const qmat *m)
{
    dsq_weight w = {};
    w.format = m->is_q4 ? DSQ_WF_Q4_G128 : DSQ_WF_Q8_ROW;
    w.layout = DSQ_WL_ROWS;
    w.rows = m->N;
    w.cols = m->K;
    w.data = m->dq;
    w.scales = m->ds;
    w.zeros = m->dz;
    w.group_size = m->is_q4 ? 128 : 0;
    return w;
}

/* CPU reference: y[t][n] = x W'^T (fp32, the library's CPU product) and
 * mag[t][n] = sum |x w'| in double, for the tolerance. */
static void cpu_ref(const qmat *m, const float *xf, int T, float *y, double *mag)
{
    float *scratch = (float *)malloc(dsq_quant_scratch_floats(m->K) * 4);
    if (m->is_q4)
        dsq_q4_matmul_rows(y, m->N, xf, m->K, T, &m->h4, NULL, 0, m->N, 0, scratch);
    else
        dsq_q8_matmul_rows(y, m->N, xf, m->K, T, &m->h8, NULL, 0, m->N, 0, scratch);
    for (int t = 0; t < T; t++)
        for (int64_t n = 0; n < m->N; n++) {
            double s = 0;
            for (int64_t k = 0; k < m->K; k++)
                s += fabs((double)xf[t * m->K + k] * m->deq[n * m->K + k]);
            mag[t * m->N + n] = s;
        }
    free(scratch);
}

/* rows_splits -1: the GEMV (nt x r); -2: gemv_mma_quant.cu (nt threads);
 * >= 0: gemm_rows.cu with that many
 * K splits (0: its plan) over a NaN-poisoned workspace and zeroed tickets,
 * which must come back zero. */
static dsq_status launch(const qmat *m, const uint16_t *dx, const float *dbias, int T, dsq_epilogue epi,
                         void *dy, int nt, int r, int rows_splits)
{
    if (rows_splits == -2) /* gemv_mma_quant.cu, nt threads (0: its choice) */
        return m->is_q4 ? dsq_cu_gemv_mma_q4(dx, (const uint8_t *)m->dq, (const uint16_t *)m->ds,
                                             (const uint8_t *)m->dz, dbias, T, (int32_t)m->N, (int32_t)m->K, epi, dy,
                                             nt, 0)
                        : dsq_cu_gemv_mma_q8(dx, (const int8_t *)m->dq, (const float *)m->ds, dbias, T,
                                             (int32_t)m->N, (int32_t)m->K, epi, dy, nt, 0);
    if (rows_splits < 0) {
        /* gemv_quant.cu's own kernels: nt == 1 at their default shape, nt < 0 at -nt x r */
        if (m->is_q4 && (nt == 1 || nt < 0))
            return dsq_cu_gemv_q4_old_cfg(dx, (const uint8_t *)m->dq, (const uint16_t *)m->ds, (const uint8_t *)m->dz,
                                          dbias, T, (int32_t)m->N, (int32_t)m->K, epi, dy, nt < 0 ? -nt : 0,
                                          nt < 0 ? r : 0, 0);
        if (nt < 0)
            return dsq_cu_gemv_q8_old_cfg(dx, (const int8_t *)m->dq, (const float *)m->ds, dbias, T, (int32_t)m->N,
                                          (int32_t)m->K, epi, dy, -nt, r, 0);
        if (m->is_q4)
            return dsq_cu_gemv_q4_cfg(dx, (const uint8_t *)m->dq, (const uint16_t *)m->ds, (const uint8_t *)m->dz,
                                      dbias, T, (int32_t)m->N, (int32_t)m->K, epi, dy, nt, r, 0);
        if (nt == 1) /* gemv_quant.cu's own Q8 kernel at its default shape */
            return dsq_cu_gemv_q8_old_cfg(dx, (const int8_t *)m->dq, (const float *)m->ds, dbias, T, (int32_t)m->N,
                                          (int32_t)m->K, epi, dy, 0, 0, 0);
        return dsq_cu_gemv_q8_cfg(dx, (const int8_t *)m->dq, (const float *)m->ds, dbias, T, (int32_t)m->N,
                                  (int32_t)m->K, epi, dy, nt, r, 0);
    }
    const int32_t N = (int32_t)m->N, K = (int32_t)m->K, tiles = (N + 63) / 64;
    const int max_splits = K / 128 < 16 ? K / 128 : 16;
    const size_t wsb = dsq_cu_gemm_rows_ws_floats(T, N, rows_splits ? rows_splits : max_splits) * 4;
    void *dws = dev_nan(wsb);
    int32_t *dtk = NULL;
    CU(cudaMalloc((void **)&dtk, (size_t)tiles * 4));
    CU(cudaMemset(dtk, 0, (size_t)tiles * 4));
    dsq_status st;
    if (m->is_q4)
        st = dsq_cu_gemm_rows_q4(dx, (const uint8_t *)m->dq, (const uint16_t *)m->ds, (const uint8_t *)m->dz, dbias, T,
                                 N, K, epi, dy, (float *)dws, wsb, dtk, tiles, rows_splits, 0);
    else
        st = dsq_cu_gemm_rows_q8(dx, (const int8_t *)m->dq, (const float *)m->ds, dbias, T, N, K, epi, dy,
                                 (float *)dws, wsb, dtk, tiles, rows_splits, 0);
    int32_t *tk = (int32_t *)malloc((size_t)tiles * 4);
    to_host(tk, dtk, (size_t)tiles * 4);
    for (int i = 0; i < tiles; i++)
        if (tk[i] != 0)
            fail_msg("gemm_rows %s %dx%d T=%d splits %d: ticket %d left at %d", m->is_q4 ? "q4" : "q8", N, K, T,
                     rows_splits, i, tk[i]);
    free(tk);
    cudaFree(dws), cudaFree(dtk);
    return st;
}

static void check_case(const qmat *m, int T, dsq_epilogue epi, int nt, int r, int misalign, double *worst,
                       int rows_splits = -1)
{
    const int64_t N = m->N, K = m->K;
    uint16_t *x = (uint16_t *)malloc((size_t)(T * K + 8) * 2);
    float *xf = (float *)malloc((size_t)(T * K) * 4);
    for (int64_t i = 0; i < T * K; i++) {
        x[i + misalign] = dsq_f32_to_bf16(frand(1.0f));
        xf[i] = dsq_bf16_to_f32(x[i + misalign]);
    }
    float *bias = (float *)malloc((size_t)N * 4), *init = (float *)malloc((size_t)(T * N) * 4);
    for (int64_t n = 0; n < N; n++)
        bias[n] = frand(0.5f);
    for (int64_t i = 0; i < T * N; i++)
        init[i] = frand(1.0f);
    float *y = (float *)malloc((size_t)(T * N) * 4);
    double *mag = (double *)malloc((size_t)(T * N) * 8);
    cpu_ref(m, xf, T, y, mag);

    uint16_t *dxb = (uint16_t *)dev_copy(x, (size_t)(T * K + 8) * 2);
    float *dbias = (float *)dev_copy(bias, (size_t)N * 4);
    const size_t ybytes = epi == DSQ_EPI_SILU_MUL ? (size_t)(T * (N / 2)) * 2 : (size_t)(T * N) * 4;
    void *dy = epi == DSQ_EPI_ADD ? dev_copy(init, ybytes) : dev_nan(ybytes);
    DS(launch(m, dxb + misalign, epi == DSQ_EPI_BIAS ? dbias : NULL, T, epi, dy, nt, r, rows_splits));
    void *got = malloc(ybytes);
    to_host(got, dy, ybytes);
    const double fp = 4.0 * (double)K * 0x1p-24;
    if (epi == DSQ_EPI_SILU_MUL) {
        for (int t = 0; t < T; t++)
            for (int64_t i = 0; i < N / 2; i++) {
                double g = y[t * N + 2 * i], u = y[t * N + 2 * i + 1];
                double tg = fp * mag[t * N + 2 * i] + 1e-30, tu = fp * mag[t * N + 2 * i + 1] + 1e-30;
                double sg = g / (1 + exp(-g)), ref = sg * u;
                double tol = fabs(ref) * 0x1p-8 + 1.2 * tg * fabs(u) + fabs(sg) * tu + 1e-30;
                double v = dsq_bf16_to_f32(((uint16_t *)got)[t * (N / 2) + i]);
                double e = isnan(v) ? INFINITY : fabs(v - ref) / tol;
                *worst = e > *worst ? e : *worst;
                if (!(e <= 1.0))
                    fail_msg("%s %lldx%lld T=%d silu_mul splits %d (%d,%lld): %g vs %g (tol %g)",
                             m->is_q4 ? "q4" : "q8", (long long)N, (long long)K, T, rows_splits, t, (long long)i, v,
                             ref, tol);
            }
    } else {
        for (int t = 0; t < T; t++)
            for (int64_t n = 0; n < N; n++) {
                double ref = y[t * N + n];
                if (epi == DSQ_EPI_BIAS)
                    ref += bias[n];
                if (epi == DSQ_EPI_ADD)
                    ref += init[t * N + n];
                double tol = fp * mag[t * N + n] + 4e-7 * fabs(ref) + 1e-30;
                double v = ((float *)got)[t * N + n];
                double e = isnan(v) ? INFINITY : fabs(v - ref) / tol;
                *worst = e > *worst ? e : *worst;
                if (!(e <= 1.0))
                    fail_msg("%s %lldx%lld T=%d epi %d nt %d r %d splits %d (%d,%lld): %g vs CPU %g (tol %g)",
                             m->is_q4 ? "q4" : "q8", (long long)N, (long long)K, T, (int)epi, nt, r, rows_splits, t,
                             (long long)n, v, ref, tol);
            }
    }
    free(x), free(xf), free(bias), free(init), free(y), free(mag), free(got);
    cudaFree(dxb), cudaFree(dbias), cudaFree(dy);
}

static const int64_t SIZES[][2] = {{1, 32}, {7, 96}, {33, 160}, {31, 1536}, {65, 1000},
                                   {18, 8960}, {129, 1536}, {9, 17}, {20, 250}};

static void run_gemv_tests(int is_q4)
{
    double worst = 0;
    for (size_t si = 0; si < sizeof SIZES / sizeof SIZES[0]; si++) {
        qmat m = make_qmat(is_q4, SIZES[si][0], SIZES[si][1]);
        for (int T = 1; T <= DSQ_GEMV_MAX_TOKENS; T++) {
            check_case(&m, T, DSQ_EPI_STORE, 0, 0, 0, &worst);
            if (T == 1 || T == 3 || T == 8) {
                check_case(&m, T, DSQ_EPI_BIAS, 0, 0, 0, &worst);
                check_case(&m, T, DSQ_EPI_ADD, 0, 0, 0, &worst);
                if (m.N % 2 == 0)
                    check_case(&m, T, DSQ_EPI_SILU_MUL, 0, 0, 0, &worst);
                check_case(&m, T, DSQ_EPI_STORE, 0, 0, 1, &worst); /* misaligned x: scalar path */
                { /* gemv_quant.cu's kernels (Q8 gate/up and the head by default; Q4 with DSQ_CUDA_Q4_GEMV=old) */
                    check_case(&m, T, DSQ_EPI_STORE, 1, 0, 0, &worst);
                    if (m.N % 2 == 0)
                        check_case(&m, T, DSQ_EPI_SILU_MUL, 1, 0, 0, &worst);
                }
            }
        }
        const int nts[] = {32, 64, 128, 256}, rs[] = {2, 4, 8};
        for (int a = 0; a < 4; a++)
            for (int b = 0; b < 3; b++) {
                check_case(&m, 1, DSQ_EPI_STORE, nts[a], rs[b], 0, &worst);
                check_case(&m, 5, DSQ_EPI_STORE, nts[a], rs[b], 0, &worst);
                check_case(&m, 1 + (a + b) % 2, DSQ_EPI_STORE, -nts[a], rs[b], 0, &worst); /* the older kernel */
            }
        free_qmat(&m);
    }
    printf("  %s: worst |gpu - cpu| / tol over all cases = %.3g\n", is_q4 ? "q4" : "q8", worst);
}

static void test_gemv_q8(void **state)
{
    (void)state;
    run_gemv_tests(0);
}

static void test_gemv_q4(void **state)
{
    (void)state;
    run_gemv_tests(1);
}

/* The Q8_ROW and Q4_G128 GEMVs with the RMSNorm folded in
 * (dsq_cu_gemv_q8_norm_cfg / dsq_cu_gemv_q4_norm_cfg, gemv.cu; mma:
 * dsq_cu_gemv_mma_q4_norm / _q8_norm, gemv_mma_quant.cu) against the CPU product of the exactly normalised rows: as the
 * bf16 test in test_cuda_kernels, the kernel rounds the normalised row to
 * bf16, so each term may also be off by a bf16 rounding of x (2^-8 of
 * sum |x w| more tolerance).  Residual rows gathered or not, N up to the
 * gate/up shape (blocks loop over row groups), outputs NaN-poisoned. */
static void run_gemv_q_norm(int is_q4, int T, int64_t N, int64_t K, dsq_epilogue epi, int gather, int nt, int r,
                            double *worst, int mma = 0)
{
    const int Rr = T + 2;
    float *xr = (float *)malloc((size_t)(Rr * K) * 4), *nw = (float *)malloc((size_t)K * 4);
    for (int64_t i = 0; i < Rr * K; i++)
        xr[i] = frand(3.0f);
    for (int64_t k = 0; k < K; k++)
        nw[k] = frand(1.5f);
    int32_t rows[DSQ_GEMV_MAX_TOKENS];
    for (int t = 0; t < T; t++)
        rows[t] = gather ? (int32_t)(rng_next() % (uint64_t)Rr) : t;
    float *x = (float *)malloc((size_t)(T * K) * 4);
    for (int t = 0; t < T; t++) {
        const float *v = xr + (size_t)rows[t] * K;
        double ss = 0;
        for (int64_t k = 0; k < K; k++)
            ss += (double)v[k] * v[k];
        const double inv = 1.0 / sqrt(ss / (double)K + 1e-6);
        for (int64_t k = 0; k < K; k++)
            x[t * K + k] = (float)(nw[k] * (v[k] * inv));
    }
    qmat m = make_qmat(is_q4, N, K);
    float *bias = (float *)malloc((size_t)N * 4), *y = (float *)malloc((size_t)(T * N) * 4);
    for (int64_t n = 0; n < N; n++)
        bias[n] = frand(0.5f);
    double *mag = (double *)malloc((size_t)(T * N) * 8);
    cpu_ref(&m, x, T, y, mag);
    void *dxr = dev_copy(xr, (size_t)(Rr * K) * 4), *dnw = dev_copy(nw, (size_t)K * 4);
    void *drows = dev_copy(rows, sizeof rows), *dbias = dev_copy(bias, (size_t)N * 4);
    const size_t ybytes = epi == DSQ_EPI_SILU_MUL ? (size_t)(T * (N / 2)) * 2 : (size_t)(T * N) * 4;
    void *dy = dev_nan(ybytes);
    const float *bp = epi == DSQ_EPI_BIAS ? (const float *)dbias : NULL;
    const int32_t *rp = gather ? (const int32_t *)drows : NULL;
    dsq_status st;
    if (mma && is_q4) { /* gemv_mma_quant.cu's norm variant, nt threads (0: its choice) */
        assert_true(dsq_cu_gemv_mma_q4_norm_ok(T, (int32_t)K, (const float *)dxr, (const float *)dnw,
                                               (const uint8_t *)m.dq));
        st = dsq_cu_gemv_mma_q4_norm((const float *)dxr, rp, (const float *)dnw, 1e-6f, (const uint8_t *)m.dq,
                                     (const uint16_t *)m.ds, (const uint8_t *)m.dz, bp, T, (int32_t)N, (int32_t)K,
                                     epi, dy, nt, 0);
    } else if (mma) {
        assert_true(dsq_cu_gemv_mma_q8_norm_ok(T, (int32_t)K, (const float *)dxr, (const float *)dnw,
                                               (const int8_t *)m.dq));
        st = dsq_cu_gemv_mma_q8_norm((const float *)dxr, rp, (const float *)dnw, 1e-6f, (const int8_t *)m.dq,
                                     (const float *)m.ds, bp, T, (int32_t)N, (int32_t)K, epi, dy, nt, 0);
    } else if (is_q4) {
        assert_true(dsq_cu_gemv_q4_norm_ok(T, (int32_t)K, dxr, (const float *)dnw, (const uint8_t *)m.dq));
        st = dsq_cu_gemv_q4_norm_cfg((const float *)dxr, rp, (const float *)dnw, 1e-6f, (const uint8_t *)m.dq,
                                     (const uint16_t *)m.ds, (const uint8_t *)m.dz, bp, T, (int32_t)N, (int32_t)K, epi,
                                     dy, nt, r, 0);
    } else {
        assert_true(dsq_cu_gemv_q8_norm_ok(T, (int32_t)K, dxr, (const float *)dnw, (const int8_t *)m.dq));
        st = dsq_cu_gemv_q8_norm_cfg((const float *)dxr, rp, (const float *)dnw, 1e-6f, (const int8_t *)m.dq,
                                     (const float *)m.ds, bp, T, (int32_t)N, (int32_t)K, epi, dy, nt, r, 0);
    }
    const char *fmt = mma ? (is_q4 ? "mma q4+norm" : "mma q8+norm") : is_q4 ? "q4+norm" : "q8+norm";
    if (st != DSQ_OK)
        fail_msg("%s %lldx%lld T=%d epi %d nt %d r %d: %s (%s)", fmt, (long long)N, (long long)K, T, (int)epi, nt, r,
                 dsq_status_string(st), dsq_last_error_message());
    void *got = malloc(ybytes);
    to_host(got, dy, ybytes);
    const double fp = 4.0 * (double)K * 0x1p-24 + 0x1p-8; /* the product's rounding + x's bf16 rounding */
    for (int t = 0; t < T; t++) {
        if (epi == DSQ_EPI_SILU_MUL) {
            for (int64_t i = 0; i < N / 2; i++) {
                const double g = y[t * N + 2 * i], u = y[t * N + 2 * i + 1];
                const double tg = fp * mag[t * N + 2 * i] + 1e-30, tu = fp * mag[t * N + 2 * i + 1] + 1e-30;
                const double sg = g / (1 + exp(-g)), ref = sg * u;
                const double tol = fabs(ref) * 0x1p-8 + 1.2 * tg * fabs(u) + fabs(sg) * tu + tg * tu + 1e-30;
                const double v = dsq_bf16_to_f32(((uint16_t *)got)[t * (N / 2) + i]);
                const double e = isnan(v) ? INFINITY : fabs(v - ref) / tol;
                *worst = e > *worst ? e : *worst;
                if (!(e <= 1.0))
                    fail_msg("%s %lldx%lld T=%d silu_mul nt %d r %d (%d,%lld): %g vs %g (tol %g)", fmt, (long long)N,
                             (long long)K, T, nt, r, t, (long long)i, v, ref, tol);
            }
            continue;
        }
        for (int64_t n = 0; n < N; n++) {
            const double ref = y[t * N + n] + (epi == DSQ_EPI_BIAS ? bias[n] : 0.0);
            const double tol = fp * mag[t * N + n] + 4e-7 * fabs(ref) + 1e-30;
            const double v = ((float *)got)[t * N + n];
            const double e = isnan(v) ? INFINITY : fabs(v - ref) / tol;
            *worst = e > *worst ? e : *worst;
            if (!(e <= 1.0))
                fail_msg("%s %lldx%lld T=%d epi %d nt %d r %d (%d,%lld): %g vs CPU %g (tol %g)", fmt, (long long)N,
                         (long long)K, T, (int)epi, nt, r, t, (long long)n, v, ref, tol);
        }
    }
    free(xr), free(nw), free(x), free(bias), free(y), free(mag), free(got);
    cudaFree(dxr), cudaFree(dnw), cudaFree(drows), cudaFree(dbias), cudaFree(dy);
    free_qmat(&m);
}

static void run_gemv_q_norm_tests(int is_q4)
{
    double worst = 0;
    const int64_t shapes[][2] = {{37, 16}, {33, 1536}, {18, 8960}, {2048, 1536}, {17920, 1536}, {11, 96}};
    for (int T = 1; T <= DSQ_GEMV_NORM_MAX_TOKENS; T++)
        for (int s = 0; s < 6; s++) {
            if ((shapes[s][0] > 10000 && T > 1) || (size_t)T * shapes[s][1] * 2 > DSQ_GEMV_NORM_MAX_SMEM ||
                shapes[s][1] % (is_q4 ? 32 : 16) != 0)
                continue;
            for (int e : {(int)DSQ_EPI_STORE, (int)DSQ_EPI_BIAS, (int)DSQ_EPI_SILU_MUL}) {
                if (shapes[s][1] > 4096 && T > 1 && e != DSQ_EPI_STORE)
                    continue;
                run_gemv_q_norm(is_q4, T, shapes[s][0] + (e == DSQ_EPI_SILU_MUL && shapes[s][0] % 2), shapes[s][1],
                                (dsq_epilogue)e, (T + e) % 2, 0, 0, &worst);
            }
        }
    for (int nt : {32, 64, 128, 256})
        for (int r : {2, 4, 8})
            run_gemv_q_norm(is_q4, 1 + (nt / 32 + r) % DSQ_GEMV_NORM_MAX_TOKENS, 36, 1024, DSQ_EPI_SILU_MUL, 1, nt,
                            r, &worst);
    printf("  %s+norm: worst |gpu - cpu| / tol over all cases = %.3g\n", is_q4 ? "q4" : "q8", worst);
}

/* gemv_mma_quant.cu with the RMSNorm folded in, against the CPU product
 * of the double-precision norm (run_gemv_q_norm's bound): 1-8 rows (a warp
 * per row up to the block's warps, block-wide rounds past them), odd tile
 * counts, K of 1-32 groups, gathered rows, 1-8 warps; refusals. */
static void test_q4_mma_norm(void **state)
{
    (void)state;
    for (int is_q4 = 1; is_q4 >= 0; is_q4--) {
        double worst = 0;
        const int64_t shapes[][2] = {{37, 256}, {2048, 1536}, {129, 1536}, {18, 4096}, {7, 128}};
        for (int T = 1; T <= DSQ_GEMV_MAX_TOKENS; T++)
            for (int si = 0; si < 5; si++) {
                const int64_t N = shapes[si][0], K = shapes[si][1];
                if ((size_t)T * (K + 32) * 2 > DSQ_GEMV_NORM_MAX_SMEM)
                    continue;
                run_gemv_q_norm(is_q4, T, N, K, DSQ_EPI_STORE, T % 2, 0, 0, &worst, 1);
                if (T == 1 || T == 3 || T == 8) {
                    run_gemv_q_norm(is_q4, T, N, K, DSQ_EPI_BIAS, 1 - T % 2, 0, 0, &worst, 1);
                    run_gemv_q_norm(is_q4, T, N + N % 2, K, DSQ_EPI_SILU_MUL, 1, 0, 0, &worst, 1);
                }
            }
        for (int nt : {32, 64, 128, 256}) /* T past the warps: block-wide norm rounds */
            for (int T : {1, 5, 8})
                run_gemv_q_norm(is_q4, T, 45, 1536, DSQ_EPI_BIAS, 1, nt, 0, &worst, 1);
        printf("  gemv mma %s+norm: worst |gpu - cpu| / tol over all cases = %.3g\n", is_q4 ? "q4" : "q8", worst);
    }
    /* dsq_cu_linear with qmma_norm: the direct launch's bits */
    for (int is_q4 = 1; is_q4 >= 0; is_q4--) {
        const int64_t N = 2048, K = 1536;
        qmat m = make_qmat(is_q4, N, K);
        float *xr = (float *)malloc((size_t)(8 * K) * 4), *nw = (float *)malloc((size_t)K * 4);
        for (int64_t i = 0; i < 8 * K; i++)
            xr[i] = frand(3.0f);
        for (int64_t k = 0; k < K; k++)
            nw[k] = frand(1.5f);
        float *dxr = (float *)dev_copy(xr, (size_t)(8 * K) * 4), *dnw = (float *)dev_copy(nw, (size_t)K * 4);
        uint16_t *dx = (uint16_t *)dev_nan((size_t)(8 * K) * 2);
        const size_t yb = (size_t)(8 * N) * 4;
        void *d0 = dev_nan(yb), *d1 = dev_nan(yb);
        void *h0 = malloc(yb), *h1 = malloc(yb);
        dsq_weight w = qweight_of(&m);
        for (int T : {1, 4, 8})
            for (int on = 1; on >= 0; on--) {
                dsq_cu_linear_env env = {};
                env.gemv_max = DSQ_GEMV_MAX_TOKENS;
                env.qmma_q4_max = env.qmma_q8_max = 8;
                env.qmma_norm = on ? 256 : 0;
                env.norm_fuse = 1;
                env.norm_x = dxr, env.norm_w = dnw, env.norm_eps = 1e-6f;
                DS(dsq_cu_linear(&w, (const dsq_bf16 *)dx, NULL, T, DSQ_EPI_STORE, d1, &env));
                if (is_q4)
                    DS(dsq_cu_gemv_mma_q4_norm(dxr, NULL, dnw, 1e-6f, (const uint8_t *)m.dq, (const uint16_t *)m.ds,
                                               (const uint8_t *)m.dz, NULL, T, (int32_t)N, (int32_t)K, DSQ_EPI_STORE,
                                               d0, 0, 0));
                else
                    DS(dsq_cu_gemv_mma_q8_norm(dxr, NULL, dnw, 1e-6f, (const int8_t *)m.dq, (const float *)m.ds,
                                               NULL, T, (int32_t)N, (int32_t)K, DSQ_EPI_STORE, d0, 0, 0));
                to_host(h0, d0, (size_t)T * N * 4);
                to_host(h1, d1, (size_t)T * N * 4);
                const int same = memcmp(h0, h1, (size_t)T * N * 4) == 0;
                /* off, the norm's own kernel then the product may give the same bits (the same bf16 x
                 * where the two summation orders round alike): only printed */
                if (on && !same)
                    fail_msg("dsq_cu_linear %s+norm T=%d qmma_norm 256: not the folded kernel's bits",
                             is_q4 ? "q4" : "q8", T);
                printf("  dsq_cu_linear %s+norm 2048x1536 T=%d qmma_norm %d: %s\n", is_q4 ? "q4" : "q8", T,
                       on ? 256 : 0, same ? "the folded kernel's bits" : "another path's");
            }
        free(xr), free(nw), free(h0), free(h1);
        cudaFree(dxr), cudaFree(dnw), cudaFree(dx), cudaFree(d0), cudaFree(d1);
        free_qmat(&m);
    }
    /* refusals: ADD, more than 8 warps, shared rows past 48 KB, misaligned xr / nw */
    const float *fp = (const float *)16;
    const uint8_t *qp = (const uint8_t *)16;
    assert_int_equal(dsq_cu_gemv_mma_q4_norm(fp, NULL, fp, 1e-6f, qp, (const uint16_t *)16, qp, NULL, 1, 16, 1536,
                                             DSQ_EPI_ADD, (void *)16, 0, 0),
                     DSQ_ERR_INTERNAL);
    assert_int_equal(dsq_cu_gemv_mma_q8_norm(fp, NULL, fp, 1e-6f, (const int8_t *)qp, fp, NULL, 1, 16, 1536,
                                             DSQ_EPI_STORE, (void *)16, 512, 0),
                     DSQ_ERR_INTERNAL);
    assert_false(dsq_cu_gemv_mma_q4_norm_ok(8, 4096, fp, fp, qp));
    assert_false(dsq_cu_gemv_mma_q8_norm_ok(8, 2816, fp, fp, (const int8_t *)qp)); /* 45,568 B: past 40 KB */
    assert_true(dsq_cu_gemv_mma_q8_norm_ok(8, 2432, fp, fp, (const int8_t *)qp));  /* 39,424 B */
    assert_false(dsq_cu_gemv_mma_q4_norm_ok(1, 1536, (const float *)24, fp, qp));
    assert_false(dsq_cu_gemv_mma_q8_norm_ok(1, 1536, fp, (const float *)20, (const int8_t *)qp));
    assert_true(dsq_cu_gemv_mma_q8_norm_ok(8, 1536, fp, fp, (const int8_t *)qp));
}

static void test_gemv_q8_norm(void **state)
{
    (void)state;
    run_gemv_q_norm_tests(0);
    /* refusals: ADD (blocks read every residual row the ADD may write), K not a multiple of 16, T > 4 */
    const float *fp = (const float *)16;
    const int8_t *qp = (const int8_t *)16;
    assert_int_equal(dsq_cu_gemv_q8_norm_cfg(fp, NULL, fp, 1e-6f, qp, fp, NULL, 1, 8, 1536, DSQ_EPI_ADD, (void *)16, 0,
                                             0, 0),
                     DSQ_ERR_INTERNAL);
    assert_false(dsq_cu_gemv_q8_norm_ok(1, 1544, (void *)16, fp, qp));
    assert_false(dsq_cu_gemv_q8_norm_ok(DSQ_GEMV_NORM_MAX_TOKENS + 1, 1536, (void *)16, fp, qp));
    assert_false(dsq_cu_gemv_q8_pdl_ok(1, 1536, (void *)24, qp));
}

static void test_gemv_q4_norm(void **state)
{
    (void)state;
    run_gemv_q_norm_tests(1);
    /* refusals: ADD, K not a multiple of 32, T > 4, misaligned x, no zero points */
    const float *fp = (const float *)16;
    const uint8_t *qp = (const uint8_t *)16;
    const uint16_t *sp = (const uint16_t *)16;
    assert_int_equal(dsq_cu_gemv_q4_norm_cfg(fp, NULL, fp, 1e-6f, qp, sp, qp, NULL, 1, 8, 1536, DSQ_EPI_ADD,
                                             (void *)16, 0, 0, 0),
                     DSQ_ERR_INTERNAL);
    assert_int_equal(dsq_cu_gemv_q4_pdl_cfg((const dsq_bf16 *)16, qp, sp, NULL, NULL, 1, 8, 1536, DSQ_EPI_STORE,
                                            (void *)16, 0, 0, 0),
                     DSQ_ERR_INTERNAL);
    assert_false(dsq_cu_gemv_q4_norm_ok(1, 1552, (void *)16, fp, qp));
    assert_false(dsq_cu_gemv_q4_norm_ok(DSQ_GEMV_NORM_MAX_TOKENS + 1, 1536, (void *)16, fp, qp));
    assert_false(dsq_cu_gemv_q4_pdl_ok(1, 1536, (void *)24, qp));
    assert_false(dsq_cu_gemv_q4_pdl_ok(1, 1552, (void *)16, qp));
}

/* The tensor-core products of 1..64 rows (gemm_rows.cu) against the same
 * CPU products and tolerance: K a multiple of 128 (whole groups; 70 groups
 * for the down shape), partial 64-row tiles, T across the token-group
 * counts, every epilogue, the planned split and forced ones (1, 2, 3, 7);
 * the refusals last. */
static void run_rows_tests(int is_q4, int wg)
{
    static const int64_t RS_SIZES[][2] = {{1, 128}, {33, 1536}, {130, 256}, {64, 384}, {18, 8960}, {200, 640}};
    const int Ts[] = {1, 2, 5, 8, 9, 17, 27, 33, 44, 50, 64}; /* every token-group count 1..8 */
    double worst = 0;
    for (size_t si = 0; si < sizeof RS_SIZES / sizeof RS_SIZES[0]; si++) {
        qmat m = make_qmat(is_q4, RS_SIZES[si][0], RS_SIZES[si][1]);
        for (int ti = 0; ti < (int)(sizeof Ts / sizeof Ts[0]); ti++) {
            const int T = Ts[ti];
            check_case(&m, T, DSQ_EPI_STORE, 0, 0, 0, &worst, 0);
            check_case(&m, T, DSQ_EPI_BIAS, 0, 0, 0, &worst, 0);
            check_case(&m, T, DSQ_EPI_ADD, 0, 0, 0, &worst, 0);
            if (m.N % 2 == 0)
                check_case(&m, T, DSQ_EPI_SILU_MUL, 0, 0, 0, &worst, 0);
            if (ti % 3 == si % 3)
                for (int sp : {1, 2, 3, 7})
                    check_case(&m, T, (dsq_epilogue)((ti + sp) % (m.N % 2 ? 3 : 4)), 0, 0, 0, &worst, sp);
        }
        free_qmat(&m);
    }
    printf("  gemm_rows %s (%s): worst |gpu - cpu| / tol over all cases = %.3g\n", is_q4 ? "q4" : "q8",
           kRowsKernelName[wg], worst);
    /* refusals: K not whole groups, 65 rows, misaligned x, missing scales / zeros */
    qmat m = make_qmat(is_q4, 8, 256);
    uint16_t *dx = (uint16_t *)dev_nan(65 * 256 * 2 + 16);
    float *dy = (float *)dev_nan(65 * 8 * 4);
    assert_false(dsq_cu_gemm_rows_q_ok(4, 200, dx, m.dq));
    assert_false(dsq_cu_gemm_rows_q_ok(65, 256, dx, m.dq));
    assert_false(dsq_cu_gemm_rows_q_ok(4, 256, dx + 1, m.dq));
    assert_true(dsq_cu_gemm_rows_q_ok(64, 256, dx, m.dq));
    if (is_q4) {
        assert_int_equal(dsq_cu_gemm_rows_q4(dx, (const uint8_t *)m.dq, (const uint16_t *)m.ds, NULL, NULL, 4, 8, 256,
                                             DSQ_EPI_STORE, dy, NULL, 0, NULL, 0, 0, 0),
                         DSQ_ERR_INTERNAL);
        assert_int_equal(dsq_cu_gemm_rows_q4(dx, (const uint8_t *)m.dq, (const uint16_t *)m.ds, (const uint8_t *)m.dz,
                                             NULL, 65, 8, 256, DSQ_EPI_STORE, dy, NULL, 0, NULL, 0, 0, 0),
                         DSQ_ERR_INTERNAL);
    } else {
        assert_int_equal(dsq_cu_gemm_rows_q8(dx, (const int8_t *)m.dq, NULL, NULL, 4, 8, 256, DSQ_EPI_STORE, dy, NULL,
                                             0, NULL, 0, 0, 0),
                         DSQ_ERR_INTERNAL);
        assert_int_equal(dsq_cu_gemm_rows_q8(dx, (const int8_t *)m.dq, (const float *)m.ds, NULL, 4, 8, 256,
                                             DSQ_EPI_BIAS, dy, NULL, 0, NULL, 0, 0, 0),
                         DSQ_ERR_INTERNAL);
    }
    cudaFree(dx), cudaFree(dy);
    free_qmat(&m);
}

static void test_gemm_rows_q8(void **state)
{
    (void)state;
    for (int wg = 0; wg < ROWS_KERNELS; wg++)
        if (rows_kernel_select(wg, "gemm_rows q8"))
            run_rows_tests(0, wg);
    rows_kernel_reset();
}

static void test_gemm_rows_q4(void **state)
{
    (void)state;
    for (int wg = 0; wg < ROWS_KERNELS; wg++)
        if (rows_kernel_select(wg, "gemm_rows q4"))
            run_rows_tests(1, wg);
    rows_kernel_reset();
}

/* gemv_mma_quant.cu (Q4 and Q8) against the CPU product: odd tile counts
 * (N not a multiple of 16), K of 1 to 70 Q4 groups (more units than a
 * warp's U in flight: several rounds), every epilogue, 1..8 rows, block
 * sizes of 1 to 16 warps (the default from the unit count too), more tiles
 * than one wave of resident blocks, output poisoned with NaN */
static void test_q4_mma_gemv(void **state)
{
    (void)state;
    /* 13,002 x 128: 813 tiles, more than one wave of 4-warp blocks on a
     * 132-SM GPU (6-7 per SM) */
    static const int64_t sizes[][2] = {{1, 128}, {17, 384}, {31, 1536}, {130, 128}, {18, 8960}, {40, 4096},
                                       {129, 1536}, {9, 640}, {13002, 128}};
    for (int is_q4 = 1; is_q4 >= 0; is_q4--) {
    double worst = 0;
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
        qmat m = make_qmat(is_q4, sizes[si][0], sizes[si][1]);
        for (int T = 1; T <= DSQ_GEMV_MAX_TOKENS; T++) {
            check_case(&m, T, DSQ_EPI_STORE, 0, 0, 0, &worst, -2);
            if (T == 1 || T == 2 || T == 5 || T == 8) {
                check_case(&m, T, DSQ_EPI_BIAS, 0, 0, 0, &worst, -2);
                check_case(&m, T, DSQ_EPI_ADD, 0, 0, 0, &worst, -2);
                if (m.N % 2 == 0)
                    check_case(&m, T, DSQ_EPI_SILU_MUL, 0, 0, 0, &worst, -2);
            }
        }
        for (int nt : {32, 96, 128, 256, 384, 512}) {
            check_case(&m, 1, DSQ_EPI_STORE, nt, 0, 0, &worst, -2);
            check_case(&m, 3, DSQ_EPI_BIAS, nt, 0, 0, &worst, -2);
            if (m.N % 2 == 0)
                check_case(&m, 2, DSQ_EPI_SILU_MUL, nt, 0, 0, &worst, -2);
        }
        free_qmat(&m);
    }
    printf("  gemv mma %s: worst |gpu - cpu| / tol over all cases = %.3g\n", is_q4 ? "q4" : "q8", worst);
    }
    { /* Q8: K not whole 64-k units, misaligned x, no row scales */
        qmat m8 = make_qmat(0, 8, 256);
        uint16_t *dx8 = (uint16_t *)dev_nan(8 * 256 * 2 + 16);
        float *dy8 = (float *)dev_nan(8 * 8 * 4);
        assert_false(dsq_cu_gemv_mma_q8_ok(1, 96, dx8, (const int8_t *)m8.dq));
        assert_false(dsq_cu_gemv_mma_q8_ok(1, 256, dx8 + 1, (const int8_t *)m8.dq));
        assert_true(dsq_cu_gemv_mma_q8_ok(1, 192, dx8, (const int8_t *)m8.dq));
        assert_int_equal(dsq_cu_gemv_mma_q8(dx8 + 1, (const int8_t *)m8.dq, (const float *)m8.ds, NULL, 1, 8, 256,
                                            DSQ_EPI_STORE, dy8, 0, 0),
                         DSQ_ERR_INTERNAL);
        assert_int_equal(dsq_cu_gemv_mma_q8(dx8, (const int8_t *)m8.dq, NULL, NULL, 1, 8, 256, DSQ_EPI_STORE, dy8,
                                            0, 0),
                         DSQ_ERR_INTERNAL);
        assert_int_equal(dsq_cu_gemv_mma_q8(dx8, (const int8_t *)m8.dq, (const float *)m8.ds, NULL, 1, 7, 256,
                                            DSQ_EPI_SILU_MUL, dy8, 0, 0),
                         DSQ_ERR_INTERNAL);
        float h8[64];
        to_host(h8, dy8, sizeof h8);
        for (int i = 0; i < 64; i++)
            assert_true(isnan(h8[i])); /* untouched */
        cudaFree(dx8), cudaFree(dy8);
        free_qmat(&m8);
    }

    /* refused, nothing launched: K not whole groups, misaligned x, T out
     * of range, odd N with SwiGLU, BIAS without bias, block size */
    qmat m = make_qmat(1, 8, 256);
    uint16_t *dx = (uint16_t *)dev_nan(8 * 256 * 2 + 16);
    float *dy = (float *)dev_nan(8 * 8 * 4);
    const uint8_t *q = (const uint8_t *)m.dq, *z = (const uint8_t *)m.dz;
    const uint16_t *sc = (const uint16_t *)m.ds;
    assert_false(dsq_cu_gemv_mma_q4_ok(1, 96, dx, q));
    assert_false(dsq_cu_gemv_mma_q4_ok(1, 256, dx + 1, q));
    assert_false(dsq_cu_gemv_mma_q4_ok(0, 256, dx, q));
    assert_false(dsq_cu_gemv_mma_q4_ok(DSQ_GEMV_MAX_TOKENS + 1, 256, dx, q));
    assert_true(dsq_cu_gemv_mma_q4_ok(DSQ_GEMV_MAX_TOKENS, 256, dx, q));
    assert_int_equal(dsq_cu_gemv_mma_q4(dx + 1, q, sc, z, NULL, 1, 8, 256, DSQ_EPI_STORE, dy, 0, 0),
                     DSQ_ERR_INTERNAL);
    assert_int_equal(dsq_cu_gemv_mma_q4(dx, q, sc, z, NULL, 1, 7, 256, DSQ_EPI_SILU_MUL, dy, 0, 0),
                     DSQ_ERR_INTERNAL);
    assert_int_equal(dsq_cu_gemv_mma_q4(dx, q, sc, z, NULL, 1, 8, 256, DSQ_EPI_BIAS, dy, 0, 0), DSQ_ERR_INTERNAL);
    assert_int_equal(dsq_cu_gemv_mma_q4(dx, q, sc, NULL, NULL, 1, 8, 256, DSQ_EPI_STORE, dy, 0, 0),
                     DSQ_ERR_INTERNAL);
    assert_int_equal(dsq_cu_gemv_mma_q4(dx, q, sc, z, NULL, 1, 8, 256, DSQ_EPI_STORE, dy, 48, 0), DSQ_ERR_INTERNAL);
    assert_int_equal(dsq_cu_gemv_mma_q4(dx, q, sc, z, NULL, 1, 8, 256, DSQ_EPI_STORE, dy, 544, 0), DSQ_ERR_INTERNAL);
    float *hy = (float *)malloc(8 * 8 * 4);
    to_host(hy, dy, 8 * 8 * 4);
    for (int i = 0; i < 64; i++)
        assert_true(isnan(hy[i])); /* untouched */
    free(hy);
    cudaFree(dx), cudaFree(dy);
    free_qmat(&m);
}

/* dsq_cu_linear sends the Q4_G128 (Q8_ROW) products of at most qmma_q4_max
 * (qmma_q8_max) rows to gemv_mma_quant.cu -- the same bits as the direct
 * launch -- where K <= 4,096 or T >= qmma_q4_long (qmma_q8_long); other
 * products keep the GEMV (qrows_max 0 here).  Two settings: the backend's
 * row cap (8) with down from 4 rows, and 2 rows without long rows. */
static void test_q4_mma_linear(void **state)
{
    (void)state;
    static const int cfg[][2] = {{8, 4}, {2, 0}}; /* {max rows, long_min} */
    for (int ci = 0; ci < 2; ci++)
        for (int is_q4 = 1; is_q4 >= 0; is_q4--) {
            const int rows = cfg[ci][0], long_min = cfg[ci][1];
            static const int64_t sizes[][2] = {{2048, 1536}, {17920, 1536}, {1536, 8960}};
            for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
                qmat m = make_qmat(is_q4, sizes[si][0], sizes[si][1]);
                const int64_t N = m.N, K = m.K;
                for (int T = 1; T <= DSQ_GEMV_MAX_TOKENS; T++) {
                    if (ci == 1 && T > rows + 1)
                        break;
                    const dsq_epilogue epi = N == 17920 ? DSQ_EPI_SILU_MUL : DSQ_EPI_STORE;
                    uint16_t *x = (uint16_t *)malloc((size_t)(T * K) * 2);
                    for (int64_t i = 0; i < T * K; i++)
                        x[i] = dsq_f32_to_bf16(frand(1.0f));
                    uint16_t *dx = (uint16_t *)dev_copy(x, (size_t)(T * K) * 2);
                    const size_t yb = epi == DSQ_EPI_SILU_MUL ? (size_t)(T * (N / 2)) * 2 : (size_t)(T * N) * 4;
                    void *d0 = dev_nan(yb), *d1 = dev_nan(yb);
                    DS(launch(&m, dx, NULL, T, epi, d0, 0, 0, -2));
                    dsq_weight w = qweight_of(&m);
                    if (epi == DSQ_EPI_SILU_MUL)
                        w.layout = DSQ_WL_GATE_UP;
                    dsq_cu_linear_env env = {}; /* the rest on the GEMVs: no workspace, no tile */
                    env.gemv_max = DSQ_GEMV_MAX_TOKENS;
                    env.qmma_q4_max = is_q4 ? rows : 0;
                    env.qmma_q8_max = is_q4 ? 0 : rows;
                    env.qmma_q4_long = env.qmma_q8_long = long_min;
                    DS(dsq_cu_linear(&w, (const dsq_bf16 *)dx, NULL, T, epi, d1, &env));
                    void *h0 = malloc(yb), *h1 = malloc(yb);
                    to_host(h0, d0, yb);
                    to_host(h1, d1, yb);
                    const int via =
                        T <= rows && (K <= 4096 || (long_min > 0 && T >= long_min));
                    const int same = memcmp(h0, h1, yb) == 0;
                    if (epi == DSQ_EPI_SILU_MUL) { /* written at all (both buffers were NaN) */
                        const uint16_t v = ((const uint16_t *)h1)[0];
                        if ((v & 0x7f80u) == 0x7f80u && (v & 0x7fu))
                            fail_msg("dsq_cu_linear %s T=%d: output not written", is_q4 ? "q4" : "q8", T);
                    } else if (isnan(((const float *)h1)[0]) || isnan(((const float *)h1)[yb / 4 - 1])) {
                        fail_msg("dsq_cu_linear %s %lldx%lld T=%d: output not written", is_q4 ? "q4" : "q8",
                                 (long long)N, (long long)K, T);
                    }
                    if (via && !same)
                        fail_msg("dsq_cu_linear %s %lldx%lld T=%d: not gemv_mma_quant.cu's bits",
                                 is_q4 ? "q4" : "q8", (long long)N, (long long)K, T);
                    if (!via && same) /* the GEMV sums in another order: equal bits would mean the mma ran */
                        fail_msg("dsq_cu_linear %s %lldx%lld T=%d (rows %d, long %d): gemv_mma_quant.cu's bits "
                                 "where the GEMV should run",
                                 is_q4 ? "q4" : "q8", (long long)N, (long long)K, T, rows, long_min);
                    printf("  dsq_cu_linear %s %lldx%lld T=%d rows %d long %d: %s\n", is_q4 ? "q4" : "q8",
                           (long long)N, (long long)K, T, rows, long_min,
                           via ? "gemv_mma_quant.cu's bits" : "the GEMV's");
                    free(x), free(h0), free(h1);
                    cudaFree(dx), cudaFree(d0), cudaFree(d1);
                }
                free_qmat(&m);
            }
        }
}

/* dsq_cu_linear with qrows_max (DSQ_CUDA_QROWS): quantized products of up
 * to that many rows go to gemm_rows.cu with the env's workspace and tickets
 * (the same bits as the direct launch), more rows keep the previous path;
 * with qrows_max 0 a few rows still take the GEMV. */
static void test_linear_qrows_dispatch(void **state)
{
    (void)state;
    for (int is_q4 = 0; is_q4 < 2; is_q4++) {
        const int N = 96, K = 384, TM = 64;
        qmat m = make_qmat(is_q4, N, K);
        uint16_t *x = (uint16_t *)malloc((size_t)TM * K * 2);
        for (int i = 0; i < TM * K; i++)
            x[i] = dsq_f32_to_bf16(frand(1.0f));
        uint16_t *dx = (uint16_t *)dev_copy(x, (size_t)TM * K * 2);
        void *da = dev_nan((size_t)TM * N * 4), *db = dev_nan((size_t)TM * N * 4);
        const size_t wsb = (size_t)1 << 20;
        void *dws = dev_nan(wsb), *dtk;
        CU(cudaMalloc(&dtk, 64 * 4));
        CU(cudaMemset(dtk, 0, 64 * 4));
        dsq_cu_linear_env env = {}; /* no norm, no dequantization tile, legacy stream */
        env.gemv_max = 8;
        env.qrows_max = TM;
        env.rows_ws = (float *)dws;
        env.rows_ws_bytes = wsb;
        env.rows_tickets = (int32_t *)dtk;
        env.rows_n_tickets = 64;
        dsq_weight w = qweight_of(&m); /* layout set per case below */
        float *ha = (float *)malloc((size_t)TM * N * 4), *hb = (float *)malloc((size_t)TM * N * 4);
        const int Ts[] = {1, 7, 9, 64};
        for (int ti = 0; ti < 4; ti++)
            for (int e = 0; e < 2; e++) {
                const int T = Ts[ti];
                const dsq_epilogue epi = e ? DSQ_EPI_SILU_MUL : DSQ_EPI_STORE;
                const size_t yb = e ? (size_t)T * (N / 2) * 2 : (size_t)T * N * 4;
                w.layout = e ? DSQ_WL_GATE_UP : DSQ_WL_ROWS;
                DS(dsq_cu_linear(&w, (const dsq_bf16 *)dx, NULL, T, epi, da, &env));
                if (is_q4)
                    DS(dsq_cu_gemm_rows_q4((const dsq_bf16 *)dx, (const uint8_t *)m.dq, (const uint16_t *)m.ds,
                                           (const uint8_t *)m.dz, NULL, T, N, K, epi, db, (float *)dws, wsb,
                                           (int32_t *)dtk, 64, 0, 0));
                else
                    DS(dsq_cu_gemm_rows_q8((const dsq_bf16 *)dx, (const int8_t *)m.dq, (const float *)m.ds, NULL, T,
                                           N, K, epi, db, (float *)dws, wsb, (int32_t *)dtk, 64, 0, 0));
                to_host(ha, da, yb);
                to_host(hb, db, yb);
                assert_memory_equal(ha, hb, yb);
            }
        /* qrows_max 0: 3 rows through the quantized GEMV */
        env.qrows_max = 0;
        w.layout = DSQ_WL_ROWS;
        DS(dsq_cu_linear(&w, (const dsq_bf16 *)dx, NULL, 3, DSQ_EPI_STORE, da, &env));
        DS(launch(&m, dx, NULL, 3, DSQ_EPI_STORE, db, 0, 0, -1));
        to_host(ha, da, (size_t)3 * N * 4);
        to_host(hb, db, (size_t)3 * N * 4);
        assert_memory_equal(ha, hb, (size_t)3 * N * 4);
        /* more rows than qrows_max (8): the previous path, here (no
         * dequantization tile) the GEMV over rows 0..7, then row 8 */
        env.qrows_max = 8;
        DS(dsq_cu_linear(&w, (const dsq_bf16 *)dx, NULL, 9, DSQ_EPI_STORE, da, &env));
        DS(launch(&m, dx, NULL, 8, DSQ_EPI_STORE, db, 0, 0, -1));
        DS(launch(&m, dx + (size_t)8 * K, NULL, 1, DSQ_EPI_STORE, (float *)db + (size_t)8 * N, 0, 0, -1));
        to_host(ha, da, (size_t)9 * N * 4);
        to_host(hb, db, (size_t)9 * N * 4);
        assert_memory_equal(ha, hb, (size_t)9 * N * 4);
        /* qrows_q8_min / qrows_q4_min 3 (the defaults): products of 1-2
         * rows take the GEMV, of 3 gemm_rows.cu (above, with both 0, Q4
         * ones took gemm_rows.cu from 1 row) */
        env.qrows_max = TM;
        env.qrows_q8_min = 3;
        env.qrows_q4_min = 3;
        for (int T = 1; T <= 3; T++) {
            CU(cudaMemset(da, 0xff, (size_t)T * N * 4)); /* NaN: both launches must write */
            CU(cudaMemset(db, 0xff, (size_t)T * N * 4));
            DS(dsq_cu_linear(&w, (const dsq_bf16 *)dx, NULL, T, DSQ_EPI_STORE, da, &env));
            if (T >= 3)
                DS(is_q4 ? dsq_cu_gemm_rows_q4((const dsq_bf16 *)dx, (const uint8_t *)m.dq, (const uint16_t *)m.ds,
                                               (const uint8_t *)m.dz, NULL, T, N, K, DSQ_EPI_STORE, db, (float *)dws,
                                               wsb, (int32_t *)dtk, 64, 0, 0)
                         : dsq_cu_gemm_rows_q8((const dsq_bf16 *)dx, (const int8_t *)m.dq, (const float *)m.ds, NULL,
                                               T, N, K, DSQ_EPI_STORE, db, (float *)dws, wsb, (int32_t *)dtk, 64, 0,
                                               0));
            else
                DS(launch(&m, dx, NULL, T, DSQ_EPI_STORE, db, 0, 0, -1));
            to_host(ha, da, (size_t)T * N * 4);
            to_host(hb, db, (size_t)T * N * 4);
            assert_memory_equal(ha, hb, (size_t)T * N * 4);
        }
        printf("  dsq_cu_linear %s, qrows_max 64 (T 1, 7, 9, 64), 0 (T 3), 8 (T 9), 64 from 3 rows (T 1-3): "
               "bit-identical to the direct launches\n", is_q4 ? "q4" : "q8");
        free(x), free(ha), free(hb);
        cudaFree(dx), cudaFree(da), cudaFree(db), cudaFree(dws), cudaFree(dtk);
        free_qmat(&m);
    }
    /* a wide Q4 product (N >= 16384: gate/up, the head) of 1 row stays on
     * gemm_rows.cu with qrows_q4_min 3 (dsq_cu_gemv_q4_pdl_use) */
    {
        const int N = 16384, K = 128, tiles = N / 64;
        qmat m = make_qmat(1, N, K);
        uint16_t x[K];
        for (int i = 0; i < K; i++)
            x[i] = dsq_f32_to_bf16(frand(1.0f));
        uint16_t *dx = (uint16_t *)dev_copy(x, sizeof x);
        void *da = dev_nan((size_t)N * 4), *db = dev_nan((size_t)N * 4);
        const size_t wsb = dsq_cu_gemm_rows_ws_floats(1, N, 1) * 4 + 256;
        void *dws = dev_nan(wsb), *dtk;
        CU(cudaMalloc(&dtk, (size_t)tiles * 4));
        CU(cudaMemset(dtk, 0, (size_t)tiles * 4));
        dsq_cu_linear_env env = {};
        env.gemv_max = 8;
        env.rows_ws = (float *)dws;
        env.rows_ws_bytes = wsb;
        env.rows_tickets = (int32_t *)dtk;
        env.rows_n_tickets = tiles;
        env.qrows_max = 64;
        env.qrows_q8_min = 3;
        env.qrows_q4_min = 3;
        dsq_weight w = qweight_of(&m);
        DS(dsq_cu_linear(&w, (const dsq_bf16 *)dx, NULL, 1, DSQ_EPI_STORE, da, &env));
        DS(dsq_cu_gemm_rows_q4((const dsq_bf16 *)dx, (const uint8_t *)m.dq, (const uint16_t *)m.ds,
                               (const uint8_t *)m.dz, NULL, 1, N, K, DSQ_EPI_STORE, db, (float *)dws, wsb,
                               (int32_t *)dtk, tiles, 0, 0));
        float *ha = (float *)malloc((size_t)N * 4), *hb = (float *)malloc((size_t)N * 4);
        to_host(ha, da, (size_t)N * 4);
        to_host(hb, db, (size_t)N * 4);
        assert_memory_equal(ha, hb, (size_t)N * 4);
        printf("  dsq_cu_linear q4 %d x %d, 1 row, qrows_q4_min 3: gemm_rows.cu (bit-identical)\n", N, K);
        free(ha), free(hb);
        cudaFree(dx), cudaFree(da), cudaFree(db), cudaFree(dws), cudaFree(dtk);
        free_qmat(&m);
    }
}

static void test_dequant_bf16(void **state)
{
    (void)state;
    for (int is_q4 = 0; is_q4 < 2; is_q4++)
        for (size_t si = 0; si < sizeof SIZES / sizeof SIZES[0]; si++) {
            qmat m = make_qmat(is_q4, SIZES[si][0], SIZES[si][1]);
            const int32_t n0 = m.N > 3 ? 2 : 0, n1 = (int32_t)m.N;
            const size_t n = (size_t)(n1 - n0) * (size_t)m.K;
            uint16_t *got[2];
            for (int part = 0; part < 2; part++) {
                uint16_t *dout = (uint16_t *)dev_nan(n * 2);
                if (is_q4)
                    DS(dsq_cu_dequant_q4_bf16((const uint8_t *)m.dq, (const uint16_t *)m.ds, (const uint8_t *)m.dz,
                                              (int32_t)m.K, n0, n1, part, dout, 0));
                else
                    DS(dsq_cu_dequant_q8_bf16((const int8_t *)m.dq, (const float *)m.ds, (int32_t)m.K, n0, n1, part,
                                              dout, 0));
                got[part] = (uint16_t *)malloc(n * 2);
                to_host(got[part], dout, n * 2);
                cudaFree(dout);
            }
            double worst = 0; /* |hi + lo - w| / |w| */
            for (size_t i = 0; i < n; i++) {
                const float w = m.deq[(size_t)n0 * m.K + i];
                const uint16_t hi = dsq_f32_to_bf16(w), lo = dsq_f32_to_bf16(w - dsq_bf16_to_f32(hi));
                if (got[0][i] != hi || got[1][i] != lo)
                    fail_msg("%s dequant %zu: %04x %04x, bf16 parts of cpu %04x %04x", is_q4 ? "q4" : "q8", i,
                             got[0][i], got[1][i], hi, lo);
                const double d = fabs((double)dsq_bf16_to_f32(got[0][i]) + dsq_bf16_to_f32(got[1][i]) - w);
                if (w != 0 && d / fabs(w) > worst)
                    worst = d / fabs(w);
            }
            if (!is_q4) { /* part 2: the codes, exact in bf16 (scale left to the epilogue) */
                uint16_t *dout = (uint16_t *)dev_nan(n * 2), *codes = (uint16_t *)malloc(n * 2);
                DS(dsq_cu_dequant_q8_bf16((const int8_t *)m.dq, (const float *)m.ds, (int32_t)m.K, n0, n1, 2, dout,
                                          0));
                to_host(codes, dout, n * 2);
                for (size_t i = 0; i < n; i++)
                    if (dsq_bf16_to_f32(codes[i]) != (float)m.h8.q[(size_t)n0 * m.K + i])
                        fail_msg("q8 dequant codes %zu: %04x for code %d", i, codes[i], m.h8.q[(size_t)n0 * m.K + i]);
                cudaFree(dout);
                free(codes);
            }
            /* Q4: an fp16 scale times an integer of <= 5 bits has <= 16
             * significant bits, so the parts are exact; Q8 within 2^-16 */
            if (is_q4 ? worst != 0 : worst > 0x1p-16)
                fail_msg("%s dequant parts: hi + lo off the exact weight by %g relative", is_q4 ? "q4" : "q8", worst);
            free(got[0]);
            free(got[1]);
            free_qmat(&m);
        }
}

/* The tile path of dsq_cu_linear (more rows than gemm_rows.cu takes:
 * qrows_max 0 here) against the CPU product of the exact weights: two
 * parts (the default) within the tolerance of the products on exact
 * weights; one part (DSQ_CUDA_QTILE=1) further, as rounding every weight
 * to bf16 makes it.  Every epilogue; SwiGLU on the Q8 codes path, whose
 * scratch must then hold the unscaled codes product (the two-part path
 * would leave the scaled one there). */
static void test_linear_tile_exact(void **state)
{
    (void)state;
    for (int is_q4 = 0; is_q4 < 2; is_q4++) {
        const int N = 200, K = 640, T = 19;
        qmat m = make_qmat(is_q4, N, K);
        uint16_t *x = (uint16_t *)malloc((size_t)T * K * 2);
        float *xf = (float *)malloc((size_t)T * K * 4), *bias = (float *)malloc((size_t)N * 4);
        float *y0 = (float *)malloc((size_t)T * N * 4), *got = (float *)malloc((size_t)T * N * 4);
        for (int i = 0; i < T * K; i++) {
            x[i] = dsq_f32_to_bf16(frand(1.0f));
            xf[i] = dsq_bf16_to_f32(x[i]);
        }
        for (int i = 0; i < N; i++)
            bias[i] = frand(1.0f);
        for (int i = 0; i < T * N; i++)
            y0[i] = frand(1.0f);
        uint16_t *dx = (uint16_t *)dev_copy(x, (size_t)T * K * 2);
        float *dbias = (float *)dev_copy(bias, (size_t)N * 4);
        float *dy = (float *)dev_nan((size_t)T * N * 4);
        dsq_bf16 *tile = (dsq_bf16 *)dev_nan((size_t)N * K * 2);
        dsq_gemm *gemm = NULL;
        DS(dsq_gemm_create((size_t)32 << 20, &gemm));
        dsq_cu_linear_env env = {};
        env.gemm = gemm;
        env.wq_tile = tile;
        env.wq_tile_elems = (int64_t)N * K;
        dsq_weight w = qweight_of(&m);
        float *scratch = (float *)dev_nan((size_t)T * N * 4);
        /* ways: 0 one bf16 part; 1 exact, hi + lo parts (Q8: no scratch);
         * 2 (Q8) exact, codes + row scales in the epilogue */
        double worst[3] = {0, 0, 0};
        for (int way = is_q4 ? 1 : 2; way >= 0; way--)
            for (int e = 0; e < 3; e++) {
                const dsq_epilogue epi = e == 0 ? DSQ_EPI_STORE : e == 1 ? DSQ_EPI_BIAS : DSQ_EPI_ADD;
                const int parts = way ? 2 : 1;
                env.qtile_parts = parts;
                env.gu_scratch = way == 2 ? scratch : NULL;
                env.gu_scratch_elems = way == 2 ? (int64_t)T * N : 0;
                if (epi == DSQ_EPI_ADD)
                    CU(cudaMemcpy(dy, y0, (size_t)T * N * 4, cudaMemcpyHostToDevice));
                else
                    CU(cudaMemset(dy, 0xff, (size_t)T * N * 4)); /* NaN */
                if (way == 2)
                    CU(cudaMemset(scratch, 0xff, (size_t)T * N * 4)); /* NaN */
                DS(dsq_cu_linear(&w, (const dsq_bf16 *)dx, epi == DSQ_EPI_BIAS ? dbias : NULL, T, epi, dy, &env));
                if (way == 2) { /* the codes path ran: its unscaled product is in the scratch (the
                                   two-part path never writes it for these epilogues) */
                    float sc[2];
                    to_host(sc, scratch + (size_t)T * N - 2, sizeof sc);
                    if (!isfinite(sc[0]) || !isfinite(sc[1]))
                        fail_msg("q8 tile, epilogue %d: the codes path did not run (scratch untouched)", (int)epi);
                }
                to_host(got, dy, (size_t)T * N * 4);
                for (int t = 0; t < T; t++)
                    for (int n = 0; n < N; n++) {
                        double ref = 0, mag = 0;
                        for (int k = 0; k < K; k++) {
                            const double p = (double)xf[t * K + k] * m.deq[(size_t)n * K + k];
                            ref += p;
                            mag += fabs(p);
                        }
                        ref += epi == DSQ_EPI_BIAS ? bias[n] : epi == DSQ_EPI_ADD ? y0[t * N + n] : 0;
                        const double tol = 4.0 * K * 0x1p-24 * (mag + 1.0);
                        const double r = fabs(got[t * N + n] - ref) / tol;
                        if (!(r <= worst[way]))
                            worst[way] = r; /* NaN sticks */
                    }
            }
        if (!is_q4) { /* SILU_MUL on the codes path, against silu(g) * u of the exact products */
            const int NP = N / 2;
            uint16_t *dact = (uint16_t *)dev_nan((size_t)T * NP * 2), *act = (uint16_t *)malloc((size_t)T * NP * 2);
            env.qtile_parts = 2;
            env.gu_scratch = scratch;
            env.gu_scratch_elems = (int64_t)T * N;
            w.layout = DSQ_WL_GATE_UP;
            CU(cudaMemset(scratch, 0xff, (size_t)T * N * 4)); /* NaN */
            DS(dsq_cu_linear(&w, (const dsq_bf16 *)dx, NULL, T, DSQ_EPI_SILU_MUL, dact, &env));
            w.layout = DSQ_WL_ROWS;
            to_host(act, dact, (size_t)T * NP * 2);
            { /* the codes path ran: its scratch holds x codes^T, unscaled */
                float *sc = (float *)malloc((size_t)T * N * 4);
                to_host(sc, scratch, (size_t)T * N * 4);
                for (int t = 0; t < T; t++)
                    for (int n = 0; n < N; n++) {
                        double ref = 0, mag = 0;
                        for (int k = 0; k < K; k++) {
                            const double q = (double)xf[t * K + k] * m.h8.q[(size_t)n * K + k];
                            ref += q;
                            mag += fabs(q);
                        }
                        const double d = fabs(sc[t * N + n] - ref), tol = 4.0 * K * 0x1p-24 * (mag + 1.0);
                        if (!(d <= tol))
                            fail_msg("q8 codes path SILU_MUL: scratch t %d n %d is %g, x codes^T %g (tol %g)", t, n,
                                     sc[t * N + n], ref, tol);
                    }
                free(sc);
            }
            for (int t = 0; t < T; t++)
                for (int p = 0; p < NP; p++) {
                    double gu[2], mag[2];
                    for (int h = 0; h < 2; h++) {
                        gu[h] = mag[h] = 0;
                        for (int k = 0; k < K; k++) {
                            const double q = (double)xf[t * K + k] * m.deq[(size_t)(2 * p + h) * K + k];
                            gu[h] += q;
                            mag[h] += fabs(q);
                        }
                    }
                    const double sg = gu[0] / (1.0 + exp(-gu[0])), ref = sg * gu[1];
                    /* the products' tolerance carried through silu(g) * u
                     * (|d silu/dg| <= 1.1), plus bf16's rounding of the result */
                    const double tol = 4.0 * K * 0x1p-24 * ((mag[0] + 1.0) * 1.1 * fabs(gu[1]) +
                                                           (mag[1] + 1.0) * fabs(sg)) +
                                       0x1p-8 * fabs(ref) + 1e-30;
                    const double d = fabs(dsq_bf16_to_f32(act[t * NP + p]) - ref);
                    if (!(d <= tol))
                        fail_msg("q8 codes path SILU_MUL t %d pair %d: %g vs %g (tol %g)", t, p,
                                 dsq_bf16_to_f32(act[t * NP + p]), ref, tol);
                }
            cudaFree(dact);
            free(act);
        }
        printf("  tile path %s, T %d: |gpu - exact| / tol worst %.3f (two parts), %.3f (one bf16 part)\n",
               is_q4 ? "q4" : "q8", T, worst[1], worst[0]);
        if (!is_q4)
            printf("  tile path q8, T %d: %.3f (codes + row scales, the default), SILU_MUL within tolerance\n", T,
                   worst[2]);
        assert_true(worst[1] <= 1.0);
        assert_true(is_q4 || worst[2] <= 1.0);
        assert_true(worst[0] > worst[1]); /* the one-part path rounds every weight: further off */
        cudaFree(scratch);
        dsq_gemm_destroy(gemm);
        cudaFree(dx), cudaFree(dbias), cudaFree(dy), cudaFree(tile);
        free(x), free(xf), free(bias), free(y0), free(got);
        free_qmat(&m);
    }
}

static void test_bad_args(void **state)
{
    (void)state;
    qmat m = make_qmat(1, 8, 128);
    uint16_t *dx = (uint16_t *)dev_nan(8 * 128 * 2);
    float *dy = (float *)dev_nan(8 * 8 * 4);
    assert_int_equal(dsq_cu_gemv_q4(dx, (const uint8_t *)m.dq, (const uint16_t *)m.ds, (const uint8_t *)m.dz, NULL,
                                    0, 8, 128, DSQ_EPI_STORE, dy, 0),
                     DSQ_ERR_INTERNAL);
    assert_int_equal(dsq_cu_gemv_q4(dx, (const uint8_t *)m.dq, (const uint16_t *)m.ds, (const uint8_t *)m.dz, NULL,
                                    9, 8, 128, DSQ_EPI_STORE, dy, 0),
                     DSQ_ERR_INTERNAL);
    assert_int_equal(dsq_cu_gemv_q4(dx, (const uint8_t *)m.dq, (const uint16_t *)m.ds, NULL, NULL, 1, 8, 128,
                                    DSQ_EPI_STORE, dy, 0),
                     DSQ_ERR_INTERNAL);
    assert_int_equal(dsq_cu_gemv_q4(dx, (const uint8_t *)m.dq, (const uint16_t *)m.ds, (const uint8_t *)m.dz, NULL,
                                    1, 8, 128, DSQ_EPI_BIAS, dy, 0),
                     DSQ_ERR_INTERNAL);
    assert_int_equal(dsq_cu_gemv_q8_cfg(dx, (const int8_t *)m.dq, (const float *)m.ds, NULL, 1, 8, 128,
                                        DSQ_EPI_STORE, dy, 96, 2, 0),
                     DSQ_ERR_INTERNAL);
    assert_int_equal(dsq_cu_gemv_q8(dx, (const int8_t *)m.dq, (const float *)m.ds, NULL, 1, 7, 128,
                                    DSQ_EPI_SILU_MUL, dy, 0),
                     DSQ_ERR_INTERNAL);
    cudaFree(dx), cudaFree(dy);
    free_qmat(&m);
}

/* ---- timing: quantized GEMV block shapes on the model's products (informative) ---- */

/* us per call, rotating through `copies` weight copies of `wb` bytes each in
 * pool (together larger than L2); q4 scales / zeros sit after the codes of
 * each copy.  nt < 0: gemm_rows.cu (`splits`, 0: its plan; ws, tickets);
 * nt >= 1000: gemv_mma_quant.cu at nt - 1000 threads (0: its choice). */
static float time_q(int q4, int nt, int r, const uint16_t *dx, char *pool, size_t wb, int copies, void *dy,
                    int T, int N, int K, cudaEvent_t e0, cudaEvent_t e1, float *ws = NULL, size_t ws_bytes = 0,
                    int32_t *tickets = NULL, int n_tickets = 0, int splits = 0)
{
    const int iters = 20;
    const size_t codes = q4 ? (size_t)N * (K / 2) : (size_t)N * K;
    const size_t G = (size_t)(K + 127) / 128;
    for (int it = -3; it < iters; it++) {
        if (it == 0)
            CU(cudaEventRecord(e0, 0));
        char *w = pool + (size_t)((it + 3) % copies) * wb;
        if (nt >= 1000 && q4) /* gemv_mma_quant.cu, nt - 1000 threads (0: its choice) */
            DS(dsq_cu_gemv_mma_q4(dx, (const uint8_t *)w, (const uint16_t *)(w + codes),
                                  (const uint8_t *)(w + codes + (size_t)N * G * 2), NULL, T, N, K, DSQ_EPI_STORE, dy,
                                  nt - 1000, 0));
        else if (nt >= 1000)
            DS(dsq_cu_gemv_mma_q8(dx, (const int8_t *)w, (const float *)(w + codes), NULL, T, N, K, DSQ_EPI_STORE, dy,
                                  nt - 1000, 0));
        else if (nt < 0 && q4)
            DS(dsq_cu_gemm_rows_q4(dx, (const uint8_t *)w, (const uint16_t *)(w + codes),
                                   (const uint8_t *)(w + codes + (size_t)N * G * 2), NULL, T, N, K, DSQ_EPI_STORE, dy,
                                   ws, ws_bytes, tickets, n_tickets, splits, 0));
        else if (nt < 0)
            DS(dsq_cu_gemm_rows_q8(dx, (const int8_t *)w, (const float *)(w + codes), NULL, T, N, K, DSQ_EPI_STORE, dy,
                                   ws, ws_bytes, tickets, n_tickets, splits, 0));
        else if (q4 && nt == 1) /* gemv_quant.cu's own Q4 kernel, default shape */
            DS(dsq_cu_gemv_q4_old_cfg(dx, (const uint8_t *)w, (const uint16_t *)(w + codes),
                                      (const uint8_t *)(w + codes + (size_t)N * G * 2), NULL, T, N, K, DSQ_EPI_STORE,
                                      dy, 0, 0, 0));
        else if (q4)
            DS(dsq_cu_gemv_q4_cfg(dx, (const uint8_t *)w, (const uint16_t *)(w + codes),
                                  (const uint8_t *)(w + codes + (size_t)N * G * 2), NULL, T, N, K, DSQ_EPI_STORE,
                                  dy, nt, r, 0));
        else if (nt == 1) /* gemv_quant.cu's own Q8 kernel, default shape */
            DS(dsq_cu_gemv_q8_old_cfg(dx, (const int8_t *)w, (const float *)(w + codes), NULL, T, N, K, DSQ_EPI_STORE,
                                      dy, 0, 0, 0));
        else
            DS(dsq_cu_gemv_q8_cfg(dx, (const int8_t *)w, (const float *)(w + codes), NULL, T, N, K, DSQ_EPI_STORE,
                                  dy, nt, r, 0));
    }
    CU(cudaEventRecord(e1, 0));
    CU(cudaEventSynchronize(e1));
    float ms = 0;
    CU(cudaEventElapsedTime(&ms, e0, e1));
    return ms * 1000.0f / iters;
}

/* Prints, per product of the 1.5B model and rows T, the default block shape
 * and the best (threads x rows per block) tried, in us per call and GB/s of
 * quantized bytes streamed: the data to choose default_cfg (gemv_quant.cu)
 * from.  Codes, scales and zeros are constant bytes (finite scales): the
 * time does not depend on the values. */
static void test_quant_product_timing(void **state)
{
    (void)state;
    struct { const char *name; int N, K; } sh[] = {
        {"qkv 2048x1536", 2048, 1536}, {"o 1536x1536", 1536, 1536}, {"gate/up 17920x1536", 17920, 1536},
        {"down 1536x8960", 1536, 8960}, {"lm_head 151936x1536", 151936, 1536},
    };
    const int Ts[] = {1, 2, 4, 8, 16, 64};
    const size_t pool_bytes = (size_t)512 << 20;
    const size_t ws_bytes = (size_t)16 << 20;
    const int n_tickets = (151936 + 63) / 64;
    float *ws = NULL;
    int32_t *tickets = NULL;
    CU(cudaMalloc((void **)&ws, ws_bytes));
    CU(cudaMalloc((void **)&tickets, (size_t)n_tickets * 4));
    CU(cudaMemset(tickets, 0, (size_t)n_tickets * 4));
    char *pool = NULL;
    void *dx = NULL, *dy = NULL;
    CU(cudaMalloc((void **)&pool, pool_bytes));
    CU(cudaMemset(pool, 0x2c, pool_bytes)); /* fp16 0x2c2c = 0.066, fp32 0x2c2c2c2c: finite scales */
    CU(cudaMalloc(&dx, (size_t)64 * 8960 * 2));
    CU(cudaMemset(dx, 0x3c, (size_t)64 * 8960 * 2));
    CU(cudaMalloc(&dy, (size_t)64 * 151936 * 4));
    cudaEvent_t e0, e1;
    CU(cudaEventCreate(&e0));
    CU(cudaEventCreate(&e1));
    printf("\n  quantized product timing, us per call (GB/s of quantized bytes); GEMV (1..8 rows): default block\n"
           "  shape and the best (threads x rows per block) tried; gemm_rows.cu (tensor cores, 1..64 rows)\n");
    printf("  rows wg: gemm_rows_wg.cu's Hopper kernel with the split count and ring depth it plans (- where the\n"
           "  device has no sm_90a); then 2 and 4 slots forced, and its best forced split count (1, 2, 4, 8, as\n"
           "  asked: the workspace may cap it, e.g. gate/up at 64 rows) from 16 rows\n");
    printf("  %-4s %-20s %3s %14s %22s %14s %18s %14s\n", "fmt", "shape", "T", "gemv default", "gemv best",
           "rows planned", "rows best (S)", "rows wg");
    setenv("DSQ_CUDA_ROWS_WG", "2", 1);
    const int have_wg = dsq_cu_gemm_rows_wg(1);
    setenv("DSQ_CUDA_ROWS_WG", "0", 1); /* the other columns: gemm_rows.cu's kernel */
    for (int q4 = 1; q4 >= 0; q4--)
        for (int si = 0; si < 5; si++) {
            if (q4 && si == 4)
                continue; /* the head is quantized to Q8 only */
            const int N = sh[si].N, K = sh[si].K;
            const size_t G = (size_t)(K + 127) / 128;
            const size_t wb = q4 ? (size_t)N * (K / 2) + (size_t)N * G * 3 : (size_t)N * K + (size_t)N * 4;
            const size_t wb_al = (wb + 255) & ~(size_t)255;
            int copies = (int)(pool_bytes / wb_al);
            copies = copies < 1 ? 1 : copies > 8 ? 8 : copies;
            for (int ti = 0; ti < 6; ti++) {
                const int T = Ts[ti];
                const float urows = time_q(q4, -1, 0, (const uint16_t *)dx, pool, wb_al, copies, dy, T, N, K, e0, e1,
                                           ws, ws_bytes, tickets, n_tickets);
                float urb = -1;
                int rbs = 0;
                for (int sp : {1, 2, 4, 8}) {
                    if (sp > K / 128)
                        continue;
                    const float u = time_q(q4, -1, 0, (const uint16_t *)dx, pool, wb_al, copies, dy, T, N, K, e0, e1,
                                           ws, ws_bytes, tickets, n_tickets, sp);
                    if (urb < 0 || u < urb)
                        urb = u, rbs = sp;
                }
                float uwg = -1, uw2 = -1, uw4 = -1; /* the ring depth it chooses, 2 and 4 slots */
                float uwb = -1; /* its best forced split count (and that count) */
                int wbs = 0;
                if (have_wg) {
                    setenv("DSQ_CUDA_ROWS_WG", "2", 1);
                    uwg = time_q(q4, -1, 0, (const uint16_t *)dx, pool, wb_al, copies, dy, T, N, K, e0, e1, ws,
                                 ws_bytes, tickets, n_tickets);
                    for (int sp : {1, 2, 4, 8}) {
                        if (sp > K / 128 || T < 16)
                            continue;
                        const float u = time_q(q4, -1, 0, (const uint16_t *)dx, pool, wb_al, copies, dy, T, N, K, e0,
                                               e1, ws, ws_bytes, tickets, n_tickets, sp);
                        if (uwb < 0 || u < uwb)
                            uwb = u, wbs = sp;
                    }
                    if (T >= 16) {
                        setenv("DSQ_CUDA_ROWS_WG_SLOTS", "2", 1);
                        uw2 = time_q(q4, -1, 0, (const uint16_t *)dx, pool, wb_al, copies, dy, T, N, K, e0, e1, ws,
                                     ws_bytes, tickets, n_tickets);
                        setenv("DSQ_CUDA_ROWS_WG_SLOTS", "4", 1);
                        uw4 = time_q(q4, -1, 0, (const uint16_t *)dx, pool, wb_al, copies, dy, T, N, K, e0, e1, ws,
                                     ws_bytes, tickets, n_tickets);
                        unsetenv("DSQ_CUDA_ROWS_WG_SLOTS");
                    }
                    setenv("DSQ_CUDA_ROWS_WG", "0", 1);
                }
                if (T > DSQ_GEMV_MAX_TOKENS) {
                    printf("  %-4s %-20s %3d %14s %22s %7.1f (%4.0f) %7.1f (%4.0f) %2d %7.1f (%4.0f)   "
                           "2 / 4 slots %6.1f %6.1f   wg best %6.1f (S %d)\n",
                           q4 ? "q4" : "q8", sh[si].name, T, "", "", urows, wb / (urows * 1e3), urb, wb / (urb * 1e3),
                           rbs, uwg, uwg > 0 ? wb / (uwg * 1e3) : 0.0, uw2, uw4, uwb, wbs);
                    continue;
                }
                const float ud = time_q(q4, 0, 0, (const uint16_t *)dx, pool, wb_al, copies, dy, T, N, K, e0, e1);
                float ub = -1;
                int bnt = 0, br = 0;
                const int nts[] = {32, 64, 128, 256}, rs[] = {2, 4, 8};
                for (int a = 0; a < 4; a++)
                    for (int b = 0; b < 3; b++) {
                        if (rs[b] == 8 && T > 2)
                            continue;
                        const float u =
                            time_q(q4, nts[a], rs[b], (const uint16_t *)dx, pool, wb_al, copies, dy, T, N, K, e0, e1);
                        if (ub < 0 || u < ub)
                            ub = u, bnt = nts[a], br = rs[b];
                    }
                /* also gemv_quant.cu's kernel at its own default (the
                 * "best" column's shapes are gemv.cu's since stop 35 for
                 * Q8, stop 38 for Q4) */
                const float uo = time_q(q4, 1, 0, (const uint16_t *)dx, pool, wb_al, copies, dy, T, N, K, e0, e1);
                printf("  %-4s %-20s %3d %7.1f (%4.0f) %7.1f (%4.0f) %3dx%d %7.1f (%4.0f) %7.1f (%4.0f) %2d", q4 ? "q4" : "q8",
                       sh[si].name, T, ud, wb / (ud * 1e3), ub, wb / (ub * 1e3), bnt, br, urows, wb / (urows * 1e3), urb,
                       wb / (urb * 1e3), rbs);
                printf(" %7.1f (%4.0f)", uwg, uwg > 0 ? wb / (uwg * 1e3) : 0.0);
                printf("   old kernel %6.1f (%4.0f)\n", uo, wb / (uo * 1e3));
            }
        }
    rows_kernel_reset();
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    cudaFree(pool);
    cudaFree(dx);
    cudaFree(dy);
    cudaFree(ws);
    cudaFree(tickets);
}

/* gemv_mma_quant.cu beside the paths the quantized products take today
 * (the GEMV's default shape; gemm_rows.cu's plan; Q8's gate/up: gemv_quant.cu's
 * kernel), us per call (GB/s of quantized bytes), 1..8 rows; informative */
static void test_timing_q4_mma(void **state)
{
    (void)state;
    struct { const char *name; int N, K; } sh[] = {
        {"qkv 2048x1536", 2048, 1536}, {"o 1536x1536", 1536, 1536}, {"gate/up 17920x1536", 17920, 1536},
        {"down 1536x8960", 1536, 8960},
    };
    const size_t pool_bytes = (size_t)512 << 20, ws_bytes = (size_t)16 << 20;
    const int n_tickets = (17920 + 63) / 64;
    float *ws = NULL;
    int32_t *tickets = NULL;
    char *pool = NULL;
    void *dx = NULL, *dy = NULL;
    CU(cudaMalloc((void **)&ws, ws_bytes));
    CU(cudaMalloc((void **)&tickets, (size_t)n_tickets * 4));
    CU(cudaMemset(tickets, 0, (size_t)n_tickets * 4));
    CU(cudaMalloc((void **)&pool, pool_bytes));
    CU(cudaMemset(pool, 0x2c, pool_bytes)); /* fp16 0x2c2c = 0.066, fp32 0x2c2c2c2c: finite scales */
    CU(cudaMalloc(&dx, (size_t)8 * 8960 * 2));
    CU(cudaMemset(dx, 0x3c, (size_t)8 * 8960 * 2));
    CU(cudaMalloc(&dy, (size_t)8 * 17920 * 4));
    cudaEvent_t e0, e1;
    CU(cudaEventCreate(&e0));
    CU(cudaEventCreate(&e1));
    setenv("DSQ_CUDA_ROWS_WG", "0", 1); /* at 1..8 rows the plan is gemm_rows.cu's mma.sync kernel */
    printf("\n  quantized products, us per call (GB/s of quantized bytes): GEMV default shape (Q8: and\n"
           "  gemv_quant.cu's kernel, gate/up's default), gemm_rows.cu planned, gemv_mma_quant.cu at its\n"
           "  choice of warps and at 2, 4, 8, 16 warps\n");
    printf("  %-4s %-20s %2s %14s %8s %14s %14s %8s %8s %8s %8s\n", "fmt", "shape", "T", "gemv", "old", "rows",
           "mma", "2 w", "4 w", "8 w", "16 w");
    for (int q4 = 1; q4 >= 0; q4--)
        for (int si = 0; si < 4; si++) {
            const int N = sh[si].N, K = sh[si].K;
            const size_t G = (size_t)K / 128;
            const size_t wb = q4 ? (size_t)N * (K / 2) + (size_t)N * G * 3 : (size_t)N * K + (size_t)N * 4;
            const size_t wb_al = (wb + 255) & ~(size_t)255;
            int copies = (int)(pool_bytes / wb_al);
            copies = copies < 1 ? 1 : copies > 8 ? 8 : copies;
            for (int T : {1, 2, 4, 8}) {
                const uint16_t *x = (const uint16_t *)dx;
                const float ug = time_q(q4, 0, 0, x, pool, wb_al, copies, dy, T, N, K, e0, e1);
                const float uo = q4 ? -1 : time_q(q4, 1, 0, x, pool, wb_al, copies, dy, T, N, K, e0, e1);
                const float ur = time_q(q4, -1, 0, x, pool, wb_al, copies, dy, T, N, K, e0, e1, ws, ws_bytes, tickets,
                                        n_tickets);
                const float um = time_q(q4, 1000, 0, x, pool, wb_al, copies, dy, T, N, K, e0, e1);
                float uw[4];
                for (int i = 0; i < 4; i++)
                    uw[i] = time_q(q4, 1000 + (64 << i), 0, x, pool, wb_al, copies, dy, T, N, K, e0, e1);
                printf("  %-4s %-20s %2d %6.1f (%5.0f) %8.1f %6.1f (%5.0f) %6.1f (%5.0f) %8.1f %8.1f %8.1f %8.1f\n",
                       q4 ? "q4" : "q8", sh[si].name, T, ug, wb / (ug * 1e3), uo, ur, wb / (ur * 1e3), um,
                       wb / (um * 1e3), uw[0], uw[1], uw[2], uw[3]);
            }
        }
    unsetenv("DSQ_CUDA_ROWS_WG");
    rows_kernel_reset();
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    cudaFree(pool), cudaFree(dx), cudaFree(dy), cudaFree(ws), cudaFree(tickets);
}

int main(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n < 1) {
        printf("SKIP: no CUDA device\n");
        return DSQ_TEST_SKIP;
    }
    const char *seed = getenv("DSQ_TEST_SEED");
    g_rng = seed && *seed ? strtoull(seed, NULL, 0) : (uint64_t)time(NULL) * 2654435761u + 1;
    if (!g_rng)
        g_rng = 1;
    printf("random seed %llu (set DSQ_TEST_SEED to repeat)\n", (unsigned long long)g_rng);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gemv_q8),
        cmocka_unit_test(test_gemv_q4),
        cmocka_unit_test(test_gemv_q8_norm),
        cmocka_unit_test(test_gemv_q4_norm),
        cmocka_unit_test(test_gemm_rows_q8),
        cmocka_unit_test(test_gemm_rows_q4),
        cmocka_unit_test(test_q4_mma_gemv),
        cmocka_unit_test(test_q4_mma_linear),
        cmocka_unit_test(test_q4_mma_norm),
        cmocka_unit_test(test_linear_qrows_dispatch),
        cmocka_unit_test(test_dequant_bf16),
        cmocka_unit_test(test_linear_tile_exact),
        cmocka_unit_test(test_bad_args),
        cmocka_unit_test(test_quant_product_timing),
        cmocka_unit_test(test_timing_q4_mma),
    };
    /* DSQ_TEST_FILTER=test_q4_mma_gemv: some tests (cmocka's wildcard pattern) */
    if (getenv("DSQ_TEST_FILTER"))
        cmocka_set_test_filter(getenv("DSQ_TEST_FILTER"));
    return cmocka_run_group_tests(tests, NULL, NULL);
}
