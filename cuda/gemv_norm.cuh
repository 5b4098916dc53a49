/* gemv_norm.cuh - the RMSNorm a GEMV block folds in (gemv.cu, gemv_mma.cu):
 * the block's T normalised rows, bf16, into shared memory. */
#ifndef DSQ_CUDA_GEMV_NORM_CUH
#define DSQ_CUDA_GEMV_NORM_CUH

#include "common.cuh"

/* xs[t * xs_stride + k] = bf16(nw[k] * (xr[r][k] * rsqrt(mean(xr[r]^2) + eps))),
 * r = rows ? rows[t] : t, for t < T <= TMAX: the arithmetic of norm.cu's
 * rmsnorm_kernel with this block's summation order.  K % 4 == 0, xr rows
 * and nw 16-byte aligned, xs_stride % 4 == 0.  red: >= TMAX * warps floats
 * of shared memory.  Ends with a barrier (xs complete, red free). */
template <int TMAX>
__device__ __forceinline__ void gemv_norm_rows(const float *__restrict__ xr0, const int32_t *__restrict__ rows,
                                               const float *__restrict__ nw0, float eps, int T, int K,
                                               uint16_t *xs, int xs_stride, float *red)
{
    const int NT = blockDim.x, NW = NT >> 5, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int K4 = K / 4;
#pragma unroll
    for (int t = 0; t < TMAX; t++) {
        if (t >= T)
            break;
        const float4 *xr = reinterpret_cast<const float4 *>(xr0 + (size_t)(rows ? rows[t] : t) * K);
        float s = 0.0f;
        for (int i = threadIdx.x; i < K4; i += NT) {
            const float4 v = xr[i];
            s += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
        }
        s = dsq_warp_sum(s);
        if (lane == 0)
            red[t * NW + warp] = s;
    }
    __syncthreads();
    const float4 *nw = reinterpret_cast<const float4 *>(nw0);
#pragma unroll
    for (int t = 0; t < TMAX; t++) {
        if (t >= T)
            break;
        float ss = 0.0f;
        for (int w = 0; w < NW; w++)
            ss += red[t * NW + w];
        /* HF: variance = mean(x^2); x * rsqrt(variance + eps); then weight * (.) */
        const float inv = rsqrtf(ss / (float)K + eps);
        const float4 *xr = reinterpret_cast<const float4 *>(xr0 + (size_t)(rows ? rows[t] : t) * K);
        uint2 *o = reinterpret_cast<uint2 *>(xs + (size_t)t * xs_stride);
        for (int i = threadIdx.x; i < K4; i += NT) {
            const float4 v = xr[i], g = nw[i];
            o[i] = make_uint2((uint32_t)dsq_f2bf(g.x * (v.x * inv)) | (uint32_t)dsq_f2bf(g.y * (v.y * inv)) << 16,
                              (uint32_t)dsq_f2bf(g.z * (v.z * inv)) | (uint32_t)dsq_f2bf(g.w * (v.w * inv)) << 16);
        }
    }
    __syncthreads();
}

/* The same rows with one warp per row (T <= warps of the block): each
 * warp sums its row's squares with shuffles only, so the norm costs one
 * round of loads and one barrier instead of T rounds and two barriers
 * (gemv_mma.cu's launches of 4-8 rows on a few hundred blocks; stop 42).
 * Another summation order than gemv_norm_rows.  Ends with a barrier. */
__device__ __forceinline__ void gemv_norm_rows_warp(const float *__restrict__ xr0, const int32_t *__restrict__ rows,
                                                    const float *__restrict__ nw0, float eps, int T, int K,
                                                    uint16_t *xs, int xs_stride)
{
    const int lane = threadIdx.x & 31, t = threadIdx.x >> 5;
    if (t < T) {
        const int K4 = K / 4;
        const float4 *xr = reinterpret_cast<const float4 *>(xr0 + (size_t)(rows ? rows[t] : t) * K);
        const float4 *nw = reinterpret_cast<const float4 *>(nw0);
        float s = 0.0f;
#pragma unroll 4
        for (int i = lane; i < K4; i += 32) {
            const float4 v = xr[i];
            s += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
        }
        s = dsq_warp_sum(s);
        /* HF: variance = mean(x^2); x * rsqrt(variance + eps); then weight * (.) */
        const float inv = rsqrtf(s / (float)K + eps);
        uint2 *o = reinterpret_cast<uint2 *>(xs + (size_t)t * xs_stride);
#pragma unroll 4
        for (int i = lane; i < K4; i += 32) {
            const float4 v = xr[i], g = nw[i];
            o[i] = make_uint2((uint32_t)dsq_f2bf(g.x * (v.x * inv)) | (uint32_t)dsq_f2bf(g.y * (v.y * inv)) << 16,
                              (uint32_t)dsq_f2bf(g.z * (v.z * inv)) | (uint32_t)dsq_f2bf(g.w * (v.w * inv)) << 16);
        }
    }
    __syncthreads();
}

#endif
