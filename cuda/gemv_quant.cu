/* gemv_quant.cu - y = epilogue(x W^T) for 1..8 rows of x with 8-bit
 * (Q8_ROW) or 4-bit (Q4_G128) weights, dequantized in registers; and the
 * dequantization into bf16 rows for the large-batch (cuBLASLt) path.
 * Layouts and numerics: gemv_quant.h and lib/quant_cpu.h.
 *
 * Work split as the bf16 GEMV (gemv.cu): a block of NT threads owns R
 * consecutive output rows for all T tokens, so W is streamed exactly once;
 * threads stride the row in 16-byte pieces (Q8: 16 codes, Q4: 32 codes,
 * a quarter of a group), loaded with streaming loads; x is read through L1.
 * Codes become floats without int->float conversions (quant_decode.cuh): a
 * code c placed in the low bits of the float 2^23 reads as 2^23 + c, and
 * one subtraction of 2^23 + zero (Q4) or 2^23 + 128 (Q8, sign bit flipped
 * first) leaves (c - zero) exactly.  Q4 sums x * (c - zero) over a piece
 * and then adds scale * sum; Q8 multiplies the whole row's sum by its scale
 * in the epilogue.
 *
 * tests/test_cuda_quant.cu checks it against the CPU products and times
 * its block shapes.  Since stop 35 the default Q8 products of N < 16384
 * rows (qkv, o, down) run gemv.cu's kernel instead (loads in flight before
 * the PDL wait, the RMSNorm folded in; dsq_cu_gemv_q8_pdl_use), measured
 * faster there; gate/up and the head stay here, where one-warp blocks were
 * faster. */
#include <cuda_fp16.h>
#include <string.h>

#include "common.cuh"
#include "gemv_epilogue.cuh"
#include "gemv_q4_piece.cuh"
#include "gemv_quant.h"
#include "quant_decode.cuh"

#define QG_MAX_THREADS 256

/* ---- Q8_ROW -------------------------------------------------------------------- */

/* 16-byte path: K % 16 == 0, x and q 16-byte aligned. */
template <int T, int R, int EPI>
__global__ void __launch_bounds__(QG_MAX_THREADS)
gemv_q8_vec(const uint16_t *__restrict__ x, const int8_t *__restrict__ q,
            const float *__restrict__ scales, const float *__restrict__ bias, int N, int K, void *y)
{
    __shared__ float red[T * R * (QG_MAX_THREADS / 32)];
    const int row0 = blockIdx.x * R;
    const int P = K / 16, K8 = K / 8;
    const uint4 *wr[R];
#pragma unroll
    for (int r = 0; r < R; r++) /* rows past N repeat the last one; never stored */
        wr[r] = reinterpret_cast<const uint4 *>(q + (size_t)min(row0 + r, N - 1) * K);
    const uint4 *xv = reinterpret_cast<const uint4 *>(x);
    float acc[T][R];
#pragma unroll
    for (int t = 0; t < T; t++)
#pragma unroll
        for (int r = 0; r < R; r++)
            acc[t][r] = 0.0f;
    for (int v = threadIdx.x; v < P; v += blockDim.x) {
        uint4 wv[R];
#pragma unroll
        for (int r = 0; r < R; r++)
            wv[r] = __ldcs(wr[r] + v);
#pragma unroll
        for (int h = 0; h < 2; h++) { /* codes 8h .. 8h+7 of the piece */
            float cw[R][8];
#pragma unroll
            for (int r = 0; r < R; r++) {
                const uint32_t lo = dsq_u4_word(wv[r], 2 * h), hi = dsq_u4_word(wv[r], 2 * h + 1);
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    cw[r][j] = dsq_qd_s8(lo, j);
                    cw[r][4 + j] = dsq_qd_s8(hi, j);
                }
            }
#pragma unroll
            for (int t = 0; t < T; t++) {
                float xf[8];
                dsq_unpack8(__ldg(xv + (size_t)t * K8 + 2 * v + h), xf);
#pragma unroll
                for (int r = 0; r < R; r++)
#pragma unroll
                    for (int e = 0; e < 8; e++)
                        acc[t][r] = fmaf(xf[e], cw[r][e], acc[t][r]);
            }
        }
    }
    gemv_block_epilogue<T, R, EPI>(acc, red, row0, N, scales, bias, y);
}

/* Scalar path for any K and alignment. */
template <int T, int R, int EPI>
__global__ void __launch_bounds__(QG_MAX_THREADS)
gemv_q8_scalar(const uint16_t *__restrict__ x, const int8_t *__restrict__ q,
               const float *__restrict__ scales, const float *__restrict__ bias, int N, int K, void *y)
{
    __shared__ float red[T * R * (QG_MAX_THREADS / 32)];
    const int row0 = blockIdx.x * R;
    float acc[T][R];
#pragma unroll
    for (int t = 0; t < T; t++)
#pragma unroll
        for (int r = 0; r < R; r++)
            acc[t][r] = 0.0f;
    for (int k = threadIdx.x; k < K; k += blockDim.x) {
#pragma unroll
        for (int r = 0; r < R; r++) {
            const float wf = (float)q[(size_t)min(row0 + r, N - 1) * K + k];
#pragma unroll
            for (int t = 0; t < T; t++)
                acc[t][r] = fmaf(__uint_as_float((uint32_t)x[(size_t)t * K + k] << 16), wf, acc[t][r]);
        }
    }
    gemv_block_epilogue<T, R, EPI>(acc, red, row0, N, scales, bias, y);
}

/* ---- Q4_G128 ------------------------------------------------------------------- */

/* 16-byte path: K % 32 == 0 (so ldq = K / 2), x and q 16-byte aligned. */
template <int T, int R, int EPI>
__global__ void __launch_bounds__(QG_MAX_THREADS)
gemv_q4_vec(const uint16_t *__restrict__ x, const uint8_t *__restrict__ q,
            const uint16_t *__restrict__ scales, const uint8_t *__restrict__ zeros,
            const float *__restrict__ bias, int N, int K, void *y)
{
    __shared__ float red[T * R * (QG_MAX_THREADS / 32)];
    const int row0 = blockIdx.x * R;
    const int P = K / 32, K8 = K / 8, G = (K + 127) / 128;
    const uint4 *wr[R];
    const uint16_t *sr[R];
    const uint8_t *zr[R];
#pragma unroll
    for (int r = 0; r < R; r++) {
        const size_t n = (size_t)min(row0 + r, N - 1);
        wr[r] = reinterpret_cast<const uint4 *>(q + n * (size_t)(K / 2));
        sr[r] = scales + n * G;
        zr[r] = zeros + n * G;
    }
    const uint4 *xv = reinterpret_cast<const uint4 *>(x);
    float acc[T][R];
#pragma unroll
    for (int t = 0; t < T; t++)
#pragma unroll
        for (int r = 0; r < R; r++)
            acc[t][r] = 0.0f;
    for (int v = threadIdx.x; v < P; v += blockDim.x) {
        const int g = v >> 2; /* 4 pieces of 32 codes per group of 128 */
        uint4 wv[R];
        float s[R], zb[R];
#pragma unroll
        for (int r = 0; r < R; r++) {
            wv[r] = __ldcs(wr[r] + v);
            s[r] = __half2float(__ushort_as_half(__ldg(sr[r] + g)));
            zb[r] = dsq_qd_zbias(__ldg(zr[r] + g));
        }
        float part[T][R];
        dsq_q4_piece<T, R>(wv, zb, [&](int t, int w) { return __ldg(xv + (size_t)t * K8 + 4 * v + w); }, part);
#pragma unroll
        for (int t = 0; t < T; t++)
#pragma unroll
            for (int r = 0; r < R; r++)
                acc[t][r] = fmaf(s[r], part[t][r], acc[t][r]);
    }
    gemv_block_epilogue<T, R, EPI>(acc, red, row0, N, nullptr, bias, y);
}

/* Scalar path for any K and alignment: each weight dequantized exactly. */
template <int T, int R, int EPI>
__global__ void __launch_bounds__(QG_MAX_THREADS)
gemv_q4_scalar(const uint16_t *__restrict__ x, const uint8_t *__restrict__ q,
               const uint16_t *__restrict__ scales, const uint8_t *__restrict__ zeros,
               const float *__restrict__ bias, int N, int K, void *y)
{
    __shared__ float red[T * R * (QG_MAX_THREADS / 32)];
    const int row0 = blockIdx.x * R;
    const size_t ldq = (size_t)((K + 31) / 32) * 16, G = (size_t)(K + 127) / 128;
    float acc[T][R];
#pragma unroll
    for (int t = 0; t < T; t++)
#pragma unroll
        for (int r = 0; r < R; r++)
            acc[t][r] = 0.0f;
    for (int k = threadIdx.x; k < K; k += blockDim.x) {
#pragma unroll
        for (int r = 0; r < R; r++) {
            const size_t n = (size_t)min(row0 + r, N - 1);
            const int code = (q[n * ldq + k / 2] >> (4 * (k & 1))) & 15;
            const size_t gi = n * G + (size_t)(k / 128);
            const float wf = (float)(code - (int)zeros[gi]) * __half2float(__ushort_as_half(scales[gi]));
#pragma unroll
            for (int t = 0; t < T; t++)
                acc[t][r] = fmaf(__uint_as_float((uint32_t)x[(size_t)t * K + k] << 16), wf, acc[t][r]);
        }
    }
    gemv_block_epilogue<T, R, EPI>(acc, red, row0, N, nullptr, bias, y);
}

/* ---- launch ------------------------------------------------------------------------ */

struct q_args {
    const uint16_t *x;
    const void *q;
    const void *scales;
    const uint8_t *zeros;
    const float *bias;
    int N, K;
    void *y;
};

template <int T, int R, int EPI, bool Q4>
static void launch_vec(int nt, const q_args &a, cudaStream_t s)
{
    const unsigned blocks = (unsigned)((a.N + R - 1) / R);
    if (Q4)
        gemv_q4_vec<T, R, EPI><<<blocks, nt, 0, s>>>(a.x, static_cast<const uint8_t *>(a.q),
                                                     static_cast<const uint16_t *>(a.scales), a.zeros,
                                                     a.bias, a.N, a.K, a.y);
    else
        gemv_q8_vec<T, R, EPI><<<blocks, nt, 0, s>>>(a.x, static_cast<const int8_t *>(a.q),
                                                     static_cast<const float *>(a.scales), a.bias, a.N,
                                                     a.K, a.y);
}

/* The scalar fallback (odd K, misaligned pointers: tests and exotic shapes,
 * never the model's) always owns 2 rows per block: fewer instantiations,
 * so this file compiles in reasonable time for four architectures. */
template <int T, int EPI, bool Q4>
static void launch_scalar(int nt, const q_args &a, cudaStream_t s)
{
    const unsigned blocks = (unsigned)((a.N + 1) / 2);
    if (Q4)
        gemv_q4_scalar<T, 2, EPI><<<blocks, nt, 0, s>>>(a.x, static_cast<const uint8_t *>(a.q),
                                                        static_cast<const uint16_t *>(a.scales), a.zeros,
                                                        a.bias, a.N, a.K, a.y);
    else
        gemv_q8_scalar<T, 2, EPI><<<blocks, nt, 0, s>>>(a.x, static_cast<const int8_t *>(a.q),
                                                        static_cast<const float *>(a.scales), a.bias, a.N,
                                                        a.K, a.y);
}

template <int T, int EPI, bool Q4>
static void launch_t(bool vec, int nt, int r, const q_args &a, cudaStream_t s)
{
    if (!vec)
        launch_scalar<T, EPI, Q4>(nt, a, s);
    else if (r >= 8 && T <= 2)
        launch_vec<T, (T <= 2 ? 8 : 4), EPI, Q4>(nt, a, s);
    else if (r >= 4)
        launch_vec<T, 4, EPI, Q4>(nt, a, s);
    else
        launch_vec<T, 2, EPI, Q4>(nt, a, s);
}

template <int EPI, bool Q4>
static void dispatch_tokens(int T, bool vec, int nt, int r, const q_args &a, cudaStream_t s)
{
    switch (T) {
    case 1: launch_t<1, EPI, Q4>(vec, nt, r, a, s); break;
    case 2: launch_t<2, EPI, Q4>(vec, nt, r, a, s); break;
    case 3: launch_t<3, EPI, Q4>(vec, nt, r, a, s); break;
    case 4: launch_t<4, EPI, Q4>(vec, nt, r, a, s); break;
    case 5: launch_t<5, EPI, Q4>(vec, nt, r, a, s); break;
    case 6: launch_t<6, EPI, Q4>(vec, nt, r, a, s); break;
    case 7: launch_t<7, EPI, Q4>(vec, nt, r, a, s); break;
    default: launch_t<8, EPI, Q4>(vec, nt, r, a, s); break;
    }
}

/* Default block shape from the number of 16-byte pieces per row: enough
 * threads that each streams a few pieces, never many idle ones (a Q4 row of
 * 1536 is only 48 pieces).  Untuned: no GPU in the session that wrote it.
 * Fewer rows per block where the matrix is short: at 8 rows the Q4 qkv
 * product (2,048 rows of 48 pieces) was 256 one-warp blocks, ~2 warps per
 * SM, too few to hide the dequantization's dependent arithmetic or to keep
 * loads in flight (the batch-1 4-bit step measured slower than bf16 on the
 * H200); blocks are now kept >= ~1,024 where 2 rows allow.  To be checked
 * against test_cuda_quant's timing table (test_quant_product_timing). */
static void default_cfg(int T, int N, int pieces, int *nt, int *r)
{
    /* Wide products (gate/up, lm_head): one warp per block and 2 rows
     * (more for the head at 1-2 tokens), the best shape of the H200 table
     * at 08c597a for INT8 and 4-bit gate/up at 1, 2, 4 and 8 tokens (q8:
     * 14.4 -> 11.5 us at 1 token, 47.4 -> 33.3 at 8; q4: 19.2 -> 12.7 at 1)
     * and for the INT8 head (75.3 -> 60.1 us at 1 token with 8 rows, 117.7
     * -> 77.5 at 2 with 4, 196.0 -> 120.6 at 4 with 2) */
    if (N >= 16384) {
        *nt = 32;
        *r = N >= 65536 && T == 1 ? 8 : N >= 65536 && T == 2 ? 4 : 2;
        return;
    }
    /* rows per block: 8 for 1-2 tokens, fewer as the per-thread
     * accumulators (T x R, twice for Q4) grow: T = 8, R = 4 takes 255
     * registers in the Q4 kernel */
    int rows = T <= 2 ? 8 : T <= 4 ? 4 : 2;
    while (rows > 2 && (N + rows - 1) / rows < 1024)
        rows /= 2;
    if (pieces <= 64) {
        *nt = 32;
        *r = rows;
    } else if (pieces <= 160) {
        *nt = 64;
        *r = rows;
    } else {
        *nt = T <= 2 ? 256 : 128;
        *r = T <= 2 ? 2 : rows;
    }
}

static dsq_status run(const char *what, bool q4, const q_args &a, int T, dsq_epilogue epi, int nt,
                      int r, cudaStream_t stream)
{
    if (T < 1 || T > DSQ_GEMV_MAX_TOKENS)
        return dsq_fail(DSQ_ERR_INTERNAL, "%s: %d rows; the kernel takes 1..%d", what, T, DSQ_GEMV_MAX_TOKENS);
    if (a.N < 1 || a.K < 1)
        return dsq_fail(DSQ_ERR_INTERNAL, "%s: empty matrix %d x %d", what, a.N, a.K);
    if (!a.x || !a.q || !a.scales || (q4 && !a.zeros) || !a.y)
        return dsq_fail(DSQ_ERR_INTERNAL, "%s: NULL pointer", what);
    if (epi == DSQ_EPI_SILU_MUL && a.N % 2 != 0)
        return dsq_fail(DSQ_ERR_INTERNAL, "%s: silu*mul needs an even row count (got %d)", what, a.N);
    if (epi == DSQ_EPI_BIAS && !a.bias)
        return dsq_fail(DSQ_ERR_INTERNAL, "%s: bias epilogue without a bias", what);
    const int per_piece = q4 ? 32 : 16;
    const bool vec = a.K % per_piece == 0 && ((uintptr_t)a.x & 15) == 0 && ((uintptr_t)a.q & 15) == 0;
    if (nt <= 0 || r <= 0)
        default_cfg(T, a.N, vec ? a.K / per_piece : a.K / 8, &nt, &r);
    if (nt != 32 && nt != 64 && nt != 128 && nt != 256)
        return dsq_fail(DSQ_ERR_INTERNAL, "%s: block of %d threads (32, 64, 128 or 256)", what, nt);
    switch (epi) {
#define QCASE(E)                                                                   \
    case E:                                                                        \
        if (q4)                                                                    \
            dispatch_tokens<E, true>(T, vec, nt, r, a, stream);                    \
        else                                                                       \
            dispatch_tokens<E, false>(T, vec, nt, r, a, stream);                   \
        break;
        QCASE(DSQ_EPI_STORE)
        QCASE(DSQ_EPI_BIAS)
        QCASE(DSQ_EPI_ADD)
        QCASE(DSQ_EPI_SILU_MUL)
#undef QCASE
    default: return dsq_fail(DSQ_ERR_INTERNAL, "%s: unknown epilogue %d", what, (int)epi);
    }
    return DSQ_CU_LAUNCHED(what);
}

extern "C" dsq_status dsq_cu_gemv_q8_cfg(const dsq_bf16 *x, const int8_t *q, const float *scales,
                                         const float *bias, int32_t T, int32_t N, int32_t K,
                                         dsq_epilogue epi, void *y, int nt, int r, cudaStream_t stream)
{
    /* the 16-byte path runs gemv.cu's kernel (where dsq_cu_gemv_q8_pdl_use
     * says so for the default shape; always for an explicit one) */
    if (x && q && scales && y && (nt > 0 ? dsq_cu_gemv_q8_pdl_ok(T, K, x, q) : dsq_cu_gemv_q8_pdl_use(T, N, K, x, q)))
        return dsq_cu_gemv_q8_pdl_cfg(x, q, scales, bias, T, N, K, epi, y, nt, r, stream);
    return dsq_cu_gemv_q8_old_cfg(x, q, scales, bias, T, N, K, epi, y, nt, r, stream);
}

/* DSQ_CUDA_Q8_GEMV, read once: 0 old kernel everywhere, 1 gemv.cu's
 * everywhere, 2 (default) gemv.cu's for N < 16384 */
static int q8_policy(void)
{
    static int v = -1;
    int p = __atomic_load_n(&v, __ATOMIC_RELAXED);
    if (p < 0) {
        const char *e = getenv("DSQ_CUDA_Q8_GEMV");
        p = e && !strcmp(e, "old") ? 0 : e && !strcmp(e, "new") ? 1 : 2;
        __atomic_store_n(&v, p, __ATOMIC_RELAXED);
    }
    return p;
}

extern "C" int dsq_cu_gemv_q8_pdl_use(int32_t T, int32_t N, int32_t K, const void *x, const int8_t *q)
{
    const int p = q8_policy();
    return p != 0 && (p == 1 || N < 16384) && dsq_cu_gemv_q8_pdl_ok(T, K, x, q);
}

extern "C" dsq_status dsq_cu_gemv_q8_old_cfg(const dsq_bf16 *x, const int8_t *q, const float *scales,
                                             const float *bias, int32_t T, int32_t N, int32_t K,
                                             dsq_epilogue epi, void *y, int nt, int r, cudaStream_t stream)
{
    q_args a = {x, q, scales, nullptr, bias, N, K, y};
    return run("gemv_q8", false, a, T, epi, nt, r, stream);
}

extern "C" dsq_status dsq_cu_gemv_q4_cfg(const dsq_bf16 *x, const uint8_t *q, const uint16_t *scales,
                                         const uint8_t *zeros, const float *bias, int32_t T, int32_t N,
                                         int32_t K, dsq_epilogue epi, void *y, int nt, int r,
                                         cudaStream_t stream)
{
    /* as Q8: the 16-byte path runs gemv.cu's kernel unless the policy says
     * otherwise for the default shape */
    if (x && q && scales && zeros && y &&
        (nt > 0 ? dsq_cu_gemv_q4_pdl_ok(T, K, x, q) : dsq_cu_gemv_q4_pdl_use(T, N, K, x, q)))
        return dsq_cu_gemv_q4_pdl_cfg(x, q, scales, zeros, bias, T, N, K, epi, y, nt, r, stream);
    return dsq_cu_gemv_q4_old_cfg(x, q, scales, zeros, bias, T, N, K, epi, y, nt, r, stream);
}

/* DSQ_CUDA_Q4_GEMV, read once: 0 ("old") gemv_quant.cu's kernel
 * everywhere, 1 ("new") gemv.cu's everywhere, 2 (default) gemv.cu's for
 * N < 16384 -- the Q8 policy's split, and for the same reason: at 1 row on
 * the H100 (stop 38) gemv.cu's kernel took qkv 3.4 us, o 3.1, down 6.8
 * against 4.4, 4.2, 7.6 on the older one and 4.5, 4.3, 9.6 on gemm_rows.cu,
 * but gate/up 17.0 against 13.0 and 14.0 (and 4,224 one-warp blocks each
 * recomputing the folded norm) */
static int q4_policy(void)
{
    static int v = -1;
    int p = __atomic_load_n(&v, __ATOMIC_RELAXED);
    if (p < 0) {
        const char *e = getenv("DSQ_CUDA_Q4_GEMV");
        p = e && !strcmp(e, "old") ? 0 : e && !strcmp(e, "new") ? 1 : 2;
        __atomic_store_n(&v, p, __ATOMIC_RELAXED);
    }
    return p;
}

extern "C" int dsq_cu_gemv_q4_pdl_use(int32_t T, int32_t N, int32_t K, const void *x, const uint8_t *q)
{
    const int p = q4_policy();
    return p != 0 && (p == 1 || N < 16384) && dsq_cu_gemv_q4_pdl_ok(T, K, x, q);
}

extern "C" dsq_status dsq_cu_gemv_q4_old_cfg(const dsq_bf16 *x, const uint8_t *q, const uint16_t *scales,
                                             const uint8_t *zeros, const float *bias, int32_t T, int32_t N,
                                             int32_t K, dsq_epilogue epi, void *y, int nt, int r,
                                             cudaStream_t stream)
{
    q_args a = {x, q, scales, zeros, bias, N, K, y};
    return run("gemv_q4", true, a, T, epi, nt, r, stream);
}

extern "C" dsq_status dsq_cu_gemv_q8(const dsq_bf16 *x, const int8_t *q, const float *scales,
                                     const float *bias, int32_t T, int32_t N, int32_t K,
                                     dsq_epilogue epi, void *y, cudaStream_t stream)
{
    return dsq_cu_gemv_q8_cfg(x, q, scales, bias, T, N, K, epi, y, 0, 0, stream);
}

extern "C" dsq_status dsq_cu_gemv_q4(const dsq_bf16 *x, const uint8_t *q, const uint16_t *scales,
                                     const uint8_t *zeros, const float *bias, int32_t T, int32_t N,
                                     int32_t K, dsq_epilogue epi, void *y, cudaStream_t stream)
{
    return dsq_cu_gemv_q4_cfg(x, q, scales, zeros, bias, T, N, K, epi, y, 0, 0, stream);
}

/* ---- dequantize to bf16 rows ------------------------------------------------------ */

/* The bf16 part `part` of the exact fp32 weight w: 0 = bf16(w), 1 = the
 * remainder bf16(w - bf16(w)); Q8_ROW's part 2 is part 0 of the code
 * itself (scale 1: exact), its row scale left to the product's epilogue.  For Q4_G128 (an fp16 scale times an
 * integer of at most 5 bits: at most 16 significant bits) the two parts sum
 * to w exactly; for Q8_ROW to within 2^-16 of it, relative. */
__device__ __forceinline__ uint16_t bf_part(float w, int part)
{
    const uint16_t hi = dsq_f2bf(w);
    return part ? dsq_f2bf(__fsub_rn(w, __uint_as_float((uint32_t)hi << 16))) : hi;
}

/* One thread per output weight of rows [n0, n0 + rows); grid-stride. */
__global__ void dequant_q8_kernel(const int8_t *__restrict__ q, const float *__restrict__ scales, int K,
                                  int n0, size_t total, int part, uint16_t *__restrict__ out)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        const size_t n = n0 + i / K, k = i % K;
        const float s = part == 2 ? 1.0f : scales[n];
        out[i] = bf_part(__fmul_rn((float)q[n * K + k], s), part & 1); /* _rn: never fused into the part's subtraction */
    }
}

__global__ void dequant_q4_kernel(const uint8_t *__restrict__ q, const uint16_t *__restrict__ scales,
                                  const uint8_t *__restrict__ zeros, int K, int n0, size_t total, int part,
                                  uint16_t *__restrict__ out)
{
    const size_t ldq = (size_t)((K + 31) / 32) * 16, G = (size_t)(K + 127) / 128;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        const size_t n = n0 + i / K, k = i % K;
        const int code = (q[n * ldq + k / 2] >> (4 * (k & 1))) & 15;
        const size_t gi = n * G + k / 128;
        out[i] = bf_part(__fmul_rn((float)(code - (int)zeros[gi]), __half2float(__ushort_as_half(scales[gi]))), part);
    }
}

/* The same parts, 8 consecutive k of one row per thread (one 16-byte
 * store; K % 8 == 0 and rows x K / 8 < 2^31): the tile is written at close
 * to the memory's bandwidth, where one 2-byte store and a 64-bit division
 * per weight made a 512-token prompt's dequantization several times the
 * cost of its products (docs/performance.md, stop 27).  Q4: k = 8c .. 8c + 7
 * are the 8 nibbles of the row's 32-bit word c, all in group c / 16. */
template <bool Q4>
__global__ void dequant8_kernel(const uint8_t *__restrict__ q, const void *__restrict__ scales,
                                const uint8_t *__restrict__ zeros, int K, int n0, uint32_t units, int part,
                                uint16_t *__restrict__ out)
{
    const uint32_t K8 = (uint32_t)K / 8, ldq = (uint32_t)((K + 31) / 32) * 16, G = (uint32_t)(K + 127) / 128;
    for (uint32_t u = blockIdx.x * blockDim.x + threadIdx.x; u < units; u += gridDim.x * blockDim.x) {
        const uint32_t r = u / K8, c = u - r * K8;
        const size_t n = (size_t)n0 + r;
        float w[8];
        if constexpr (Q4) {
            const uint32_t v = __ldg(reinterpret_cast<const uint32_t *>(q + n * ldq) + c);
            const size_t gi = n * G + c / 16;
            const float s = __half2float(__ushort_as_half(__ldg(static_cast<const uint16_t *>(scales) + gi)));
            const int z = zeros[gi];
#pragma unroll
            for (int i = 0; i < 8; i++)
                w[i] = __fmul_rn((float)((int)((v >> (4 * i)) & 15) - z), s);
        } else {
            const uint2 v = __ldg(reinterpret_cast<const uint2 *>(q + n * K) + c);
            const float s = part == 2 ? 1.0f : __ldg(static_cast<const float *>(scales) + n);
#pragma unroll
            for (int i = 0; i < 8; i++)
                w[i] = __fmul_rn((float)(int8_t)(((i < 4 ? v.x : v.y) >> (8 * (i & 3))) & 255), s);
        }
        uint32_t o[4];
#pragma unroll
        for (int i = 0; i < 4; i++)
            o[i] = (uint32_t)bf_part(w[2 * i], part & 1) | (uint32_t)bf_part(w[2 * i + 1], part & 1) << 16;
        *reinterpret_cast<uint4 *>(out + (size_t)r * K + (size_t)c * 8) = make_uint4(o[0], o[1], o[2], o[3]);
    }
}

/* units of 8 weights for dequant8_kernel, or 0 where it does not apply */
static uint32_t dequant8_units(int32_t K, int32_t rows, const void *q, uintptr_t q_align, const void *out)
{
    const size_t units = (size_t)rows * (size_t)(K / 8);
    return K % 8 == 0 && units < ((size_t)1 << 31) && ((uintptr_t)out & 15) == 0 && ((uintptr_t)q & (q_align - 1)) == 0
               ? (uint32_t)units
               : 0;
}

static unsigned grid_for(size_t total)
{
    size_t b = (total + 255) / 256;
    return (unsigned)(b < 65535 ? (b ? b : 1) : 65535);
}

extern "C" dsq_status dsq_cu_dequant_q8_bf16(const int8_t *q, const float *scales, int32_t K, int32_t n0,
                                             int32_t n1, int32_t part, dsq_bf16 *out, cudaStream_t stream)
{
    if (!q || !scales || !out || K < 1 || n0 < 0 || n1 < n0 || part < 0 || part > 2)
        return dsq_fail(DSQ_ERR_INTERNAL, "dequant_q8_bf16: bad arguments (K %d, rows %d..%d)", K, n0, n1);
    const size_t total = (size_t)(n1 - n0) * (size_t)K;
    if (total == 0)
        return DSQ_OK;
    const uint32_t units = dequant8_units(K, n1 - n0, q, 8, out);
    if (units)
        dequant8_kernel<false><<<grid_for(units), 256, 0, stream>>>((const uint8_t *)q, scales, NULL, K, n0, units,
                                                                    part, (uint16_t *)out);
    else
        dequant_q8_kernel<<<grid_for(total), 256, 0, stream>>>(q, scales, K, n0, total, part, out);
    return DSQ_CU_LAUNCHED("dequant_q8_bf16");
}

extern "C" dsq_status dsq_cu_dequant_q4_bf16(const uint8_t *q, const uint16_t *scales, const uint8_t *zeros,
                                             int32_t K, int32_t n0, int32_t n1, int32_t part, dsq_bf16 *out,
                                             cudaStream_t stream)
{
    if (!q || !scales || !zeros || !out || K < 1 || n0 < 0 || n1 < n0 || (part != 0 && part != 1))
        return dsq_fail(DSQ_ERR_INTERNAL, "dequant_q4_bf16: bad arguments (K %d, rows %d..%d)", K, n0, n1);
    const size_t total = (size_t)(n1 - n0) * (size_t)K;
    if (total == 0)
        return DSQ_OK;
    const uint32_t units = dequant8_units(K, n1 - n0, q, 4, out);
    if (units)
        dequant8_kernel<true><<<grid_for(units), 256, 0, stream>>>(q, scales, zeros, K, n0, units, part,
                                                                   (uint16_t *)out);
    else
        dequant_q4_kernel<<<grid_for(total), 256, 0, stream>>>(q, scales, zeros, K, n0, total, part, out);
    return DSQ_CU_LAUNCHED("dequant_q4_bf16");
}
