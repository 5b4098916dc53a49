/* gemv.cu - y = epilogue(x W^T) for a handful of rows of x (decode at small
 * batch), where the product is bound by streaming W once from memory.
 *
 * Work split: a block of NT threads (64..256) owns R consecutive output rows
 * n (all T tokens at once, so W is read exactly once); its threads split K in
 * 16-byte pieces (8 bf16) strided by the block, up to 4 pieces per row in
 * flight before the first use.  Partial sums are reduced in the warp, then across the 8 warps
 * in shared memory, and the epilogue runs on the reduced values.  x (at most
 * 8 rows of K bf16) is small and read through L1; W goes through streaming
 * loads so it does not evict x or the KV cache from L2. */
#include "common.cuh"
#include "gemv_epilogue.cuh"

#define GEMV_MAX_THREADS 256 /* blockDim.x is 64, 128 or 256 (a runtime choice) */
#define GEMV_UNROLL 4

/* 16-byte path: K % 8 == 0, x and W 16-byte aligned. */
template <int T, int R, int EPI>
__global__ void __launch_bounds__(GEMV_MAX_THREADS)
gemv_vec_kernel(const uint16_t *__restrict__ x, const uint16_t *__restrict__ w,
                const float *__restrict__ bias, int N, int K, void *y)
{
    __shared__ float red[T * R * (GEMV_MAX_THREADS / 32)];
    const int row0 = blockIdx.x * R;
    const int K8 = K / 8;
    const uint4 *wr[R];
#pragma unroll
    for (int r = 0; r < R; r++) /* rows past N repeat the last one; never stored */
        wr[r] = reinterpret_cast<const uint4 *>(w + (size_t)min(row0 + r, N - 1) * K);
    const uint4 *xv = reinterpret_cast<const uint4 *>(x);

    float acc[T][R];
#pragma unroll
    for (int t = 0; t < T; t++)
#pragma unroll
        for (int r = 0; r < R; r++)
            acc[t][r] = 0.0f;

    const int NT = blockDim.x;
    int v = threadIdx.x;
    for (; v + (GEMV_UNROLL - 1) * NT < K8; v += GEMV_UNROLL * NT) {
        uint4 wv[GEMV_UNROLL][R];
#pragma unroll
        for (int u = 0; u < GEMV_UNROLL; u++)
#pragma unroll
            for (int r = 0; r < R; r++)
                wv[u][r] = __ldcs(wr[r] + v + u * NT);
#pragma unroll
        for (int u = 0; u < GEMV_UNROLL; u++) {
#pragma unroll
            for (int t = 0; t < T; t++) {
                float xf[8];
                dsq_unpack8(__ldg(xv + (size_t)t * K8 + v + u * NT), xf);
#pragma unroll
                for (int r = 0; r < R; r++) {
                    float wf[8];
                    dsq_unpack8(wv[u][r], wf);
#pragma unroll
                    for (int e = 0; e < 8; e++)
                        acc[t][r] = fmaf(xf[e], wf[e], acc[t][r]);
                }
            }
        }
    }
    for (; v < K8; v += NT) {
        uint4 wv[R];
#pragma unroll
        for (int r = 0; r < R; r++)
            wv[r] = __ldcs(wr[r] + v);
#pragma unroll
        for (int t = 0; t < T; t++) {
            float xf[8];
            dsq_unpack8(__ldg(xv + (size_t)t * K8 + v), xf);
#pragma unroll
            for (int r = 0; r < R; r++) {
                float wf[8];
                dsq_unpack8(wv[r], wf);
#pragma unroll
                for (int e = 0; e < 8; e++)
                    acc[t][r] = fmaf(xf[e], wf[e], acc[t][r]);
            }
        }
    }
    gemv_block_epilogue<T, R, EPI>(acc, red, row0, N, nullptr, bias, y);
}

/* Scalar path for any K and alignment (odd test sizes, exotic configs). */
template <int T, int R, int EPI>
__global__ void __launch_bounds__(GEMV_MAX_THREADS)
gemv_scalar_kernel(const uint16_t *__restrict__ x, const uint16_t *__restrict__ w,
                   const float *__restrict__ bias, int N, int K, void *y)
{
    __shared__ float red[T * R * (GEMV_MAX_THREADS / 32)];
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
            float wf = __uint_as_float((uint32_t)w[(size_t)min(row0 + r, N - 1) * K + k] << 16);
#pragma unroll
            for (int t = 0; t < T; t++)
                acc[t][r] = fmaf(__uint_as_float((uint32_t)x[(size_t)t * K + k] << 16), wf, acc[t][r]);
        }
    }
    gemv_block_epilogue<T, R, EPI>(acc, red, row0, N, nullptr, bias, y);
}

template <int T, int R, int EPI>
static void launch_rows(bool vec, int nt, const uint16_t *x, const uint16_t *w, const float *bias, int N, int K,
                        void *y, cudaStream_t s)
{
    const unsigned blocks = (unsigned)((N + R - 1) / R);
    if (vec)
        gemv_vec_kernel<T, R, EPI><<<blocks, nt, 0, s>>>(x, w, bias, N, K, y);
    else
        gemv_scalar_kernel<T, R, EPI><<<blocks, GEMV_MAX_THREADS, 0, s>>>(x, w, bias, N, K, y);
}

template <int T, int EPI>
static void launch_gemv(bool vec, int nt, int r, const uint16_t *x, const uint16_t *w, const float *bias, int N,
                        int K, void *y, cudaStream_t s)
{
    /* rows per block: 8 only for 1-2 tokens (registers), 2 or 4 otherwise */
    if (r >= 8 && T <= 2)
        launch_rows<T, (T <= 2 ? 8 : 4), EPI>(vec, nt, x, w, bias, N, K, y, s);
    else if (r >= 4)
        launch_rows<T, 4, EPI>(vec, nt, x, w, bias, N, K, y, s);
    else
        launch_rows<T, 2, EPI>(vec, nt, x, w, bias, N, K, y, s);
}

template <int EPI>
static void dispatch_tokens(int T, bool vec, int nt, int r, const uint16_t *x, const uint16_t *w,
                            const float *bias, int N, int K, void *y, cudaStream_t s)
{
    switch (T) {
    case 1: launch_gemv<1, EPI>(vec, nt, r, x, w, bias, N, K, y, s); break;
    case 2: launch_gemv<2, EPI>(vec, nt, r, x, w, bias, N, K, y, s); break;
    case 3: launch_gemv<3, EPI>(vec, nt, r, x, w, bias, N, K, y, s); break;
    case 4: launch_gemv<4, EPI>(vec, nt, r, x, w, bias, N, K, y, s); break;
    case 5: launch_gemv<5, EPI>(vec, nt, r, x, w, bias, N, K, y, s); break;
    case 6: launch_gemv<6, EPI>(vec, nt, r, x, w, bias, N, K, y, s); break;
    case 7: launch_gemv<7, EPI>(vec, nt, r, x, w, bias, N, K, y, s); break;
    default: launch_gemv<8, EPI>(vec, nt, r, x, w, bias, N, K, y, s); break;
    }
}

/* Block shape for (T, K): see dsq_cu_gemv_cfg.  Chosen from the timing
 * table of test_cuda_kernels on the H200 (docs/performance.md). */
static void default_cfg(int T, int K, int *nt, int *r)
{
    /* short rows (K <= 2048): 64 threads, so each thread still streams
     * several 16-byte pieces per row; long rows (down_proj): 256 / 128 */
    const int K8 = K / 8;
    if (K8 <= 256) {
        *nt = 64;
        *r = T <= 2 ? 4 : 2;
    } else {
        *nt = T <= 2 ? 256 : 128;
        *r = T <= 2 ? 2 : 4;
    }
}

extern "C" dsq_status dsq_cu_gemv_cfg(const dsq_bf16 *x, const dsq_bf16 *w, const float *bias, int32_t T,
                                      int32_t N, int32_t K, dsq_epilogue epi, void *y, int nt, int r,
                                      cudaStream_t stream)
{
    if (T < 1 || T > DSQ_GEMV_MAX_TOKENS)
        return dsq_fail(DSQ_ERR_INTERNAL, "gemv: %d rows; the kernel takes 1..%d", T, DSQ_GEMV_MAX_TOKENS);
    if (N < 1 || K < 1)
        return dsq_fail(DSQ_ERR_INTERNAL, "gemv: empty matrix %d x %d", N, K);
    if (epi == DSQ_EPI_SILU_MUL && N % 2 != 0)
        return dsq_fail(DSQ_ERR_INTERNAL, "gemv: silu*mul needs an even row count (got %d)", N);
    if (epi == DSQ_EPI_BIAS && !bias)
        return dsq_fail(DSQ_ERR_INTERNAL, "gemv: bias epilogue without a bias");
    if (nt <= 0 || r <= 0)
        default_cfg(T, K, &nt, &r);
    if (nt != 64 && nt != 128 && nt != 256)
        return dsq_fail(DSQ_ERR_INTERNAL, "gemv: block of %d threads (64, 128 or 256)", nt);
    const bool vec = K % 8 == 0 && ((uintptr_t)x & 15) == 0 && ((uintptr_t)w & 15) == 0;
    switch (epi) {
    case DSQ_EPI_STORE: dispatch_tokens<DSQ_EPI_STORE>(T, vec, nt, r, x, w, bias, N, K, y, stream); break;
    case DSQ_EPI_BIAS: dispatch_tokens<DSQ_EPI_BIAS>(T, vec, nt, r, x, w, bias, N, K, y, stream); break;
    case DSQ_EPI_ADD: dispatch_tokens<DSQ_EPI_ADD>(T, vec, nt, r, x, w, bias, N, K, y, stream); break;
    case DSQ_EPI_SILU_MUL: dispatch_tokens<DSQ_EPI_SILU_MUL>(T, vec, nt, r, x, w, bias, N, K, y, stream); break;
    default: return dsq_fail(DSQ_ERR_INTERNAL, "gemv: unknown epilogue %d", (int)epi);
    }
    return DSQ_CU_LAUNCHED("gemv kernel");
}

extern "C" dsq_status dsq_cu_gemv(const dsq_bf16 *x, const dsq_bf16 *w, const float *bias, int32_t T,
                                  int32_t N, int32_t K, dsq_epilogue epi, void *y, cudaStream_t stream)
{
    return dsq_cu_gemv_cfg(x, w, bias, T, N, K, epi, y, 0, 0, stream);
}
