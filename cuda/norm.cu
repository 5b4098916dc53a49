/* norm.cu - RMSNorm: fp32 residual rows -> bf16 normalised rows (the input
 * of the next matrix product). */
#include "common.cuh"

constexpr int kNormRowsPerBlock = 8; /* one warp per row */

/* One warp per output row, 8 rows per block: no block barrier, and a
 * 4,096-row prompt launches 512 blocks instead of 4,096 (one 512-thread
 * block per row was bound by block launch and its barriers: 20.7 us per
 * call for 4,096 x 1,536 on the H200, ~2x its memory time).  Two passes
 * over the row: the sum of squares, then the scaled write; the second read
 * hits L1 (a row is E*4 bytes).  VEC: E % 4 == 0 and x, w 16-byte, out
 * 8-byte aligned: float4 reads, 4 bf16 per write. */
template <bool VEC>
__global__ void __launch_bounds__(32 * kNormRowsPerBlock)
    rmsnorm_kernel(const float *__restrict__ x, const int32_t *__restrict__ rows, int32_t T, int32_t E,
                   const float *__restrict__ w, float eps, uint16_t *__restrict__ out)
{
    dsq_pdl_wait();
    dsq_pdl_trigger();
    const int lane = threadIdx.x & 31;
    const int t = blockIdx.x * kNormRowsPerBlock + (threadIdx.x >> 5);
    if (t >= T)
        return;
    const int r = rows ? rows[t] : t;
    const float *xr = x + (size_t)r * E;
    uint16_t *o = out + (size_t)t * E;
    float ss = 0.0f;
    if (VEC) {
        const float4 *x4 = reinterpret_cast<const float4 *>(xr);
#pragma unroll 4
        for (int i = lane; i < E / 4; i += 32) {
            const float4 v = x4[i];
            ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
        }
    } else {
        for (int i = lane; i < E; i += 32) {
            const float v = xr[i];
            ss += v * v;
        }
    }
    ss = dsq_warp_sum(ss);
    /* HF: variance = mean(x^2); x * rsqrt(variance + eps); then weight * (.) */
    const float inv = rsqrtf(ss / (float)E + eps);
    if (VEC) {
        const float4 *x4 = reinterpret_cast<const float4 *>(xr), *w4 = reinterpret_cast<const float4 *>(w);
        uint2 *o4 = reinterpret_cast<uint2 *>(o);
#pragma unroll 4
        for (int i = lane; i < E / 4; i += 32) {
            const float4 v = x4[i], g = w4[i];
            o4[i] = make_uint2((uint32_t)dsq_f2bf(g.x * (v.x * inv)) | (uint32_t)dsq_f2bf(g.y * (v.y * inv)) << 16,
                               (uint32_t)dsq_f2bf(g.z * (v.z * inv)) | (uint32_t)dsq_f2bf(g.w * (v.w * inv)) << 16);
        }
    } else {
        for (int i = lane; i < E; i += 32)
            o[i] = dsq_f2bf(w[i] * (xr[i] * inv));
    }
}

extern "C" dsq_status dsq_cu_rmsnorm(const float *x, const int32_t *rows, int32_t T, int32_t E,
                                     const float *w, float eps, dsq_bf16 *out, cudaStream_t stream)
{
    if (T <= 0)
        return DSQ_OK;
    const dim3 grid((unsigned)((T + kNormRowsPerBlock - 1) / kNormRowsPerBlock)), block(32 * kNormRowsPerBlock);
    const bool vec = E % 4 == 0 && !(((uintptr_t)x | (uintptr_t)w) & 15) && !((uintptr_t)out & 7);
    cudaError_t e = vec ? dsq_launch_pdl(rmsnorm_kernel<true>, grid, block, 0, stream, x, rows, T, E, w, eps,
                                         (uint16_t *)out)
                        : dsq_launch_pdl(rmsnorm_kernel<false>, grid, block, 0, stream, x, rows, T, E, w, eps,
                                         (uint16_t *)out);
    return dsq_cu_status(e, "rmsnorm kernel");
}
