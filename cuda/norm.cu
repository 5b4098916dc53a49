/* norm.cu - RMSNorm: fp32 residual rows -> bf16 normalised rows (the input
 * of the next matrix product). */
#include "common.cuh"

constexpr int kNormRowsPerBlock = 8; /* rmsnorm_warp_kernel: one warp per row */
constexpr int kNormWarpMinRows = 1024; /* below: rmsnorm_block_kernel */

/* One block per output row.  PER > 0 (E <= PER x threads): the thread's
 * PER elements of the norm weight are read before the PDL wait (constants,
 * pdl.cuh) and its elements of the row are kept in registers for the
 * write, so a row costs one memory latency after the wait instead of three
 * (row, then weight and row again); the same additions in the same order
 * as PER = 0, which reads the row twice (the second time from L1). */
template <int PER>
__global__ void rmsnorm_block_kernel(const float *__restrict__ x, const int32_t *__restrict__ rows, int32_t E,
                                     const float *__restrict__ w, float eps, uint16_t *__restrict__ out)
{
    __shared__ float red[32];
    float wv[PER > 0 ? PER : 1];
#pragma unroll
    for (int k = 0; k < PER; k++) {
        const int i = threadIdx.x + k * blockDim.x;
        wv[k] = i < E ? w[i] : 0.0f;
    }
    dsq_pdl_wait();
    dsq_pdl_trigger();
    const int t = blockIdx.x;
    const int r = rows ? rows[t] : t;
    const float *xr = x + (size_t)r * E;
    uint16_t *o = out + (size_t)t * E;
    float ss = 0.0f;
    if constexpr (PER > 0) {
        float xv[PER];
#pragma unroll
        for (int k = 0; k < PER; k++) {
            const int i = threadIdx.x + k * blockDim.x;
            xv[k] = i < E ? xr[i] : 0.0f;
        }
#pragma unroll
        for (int k = 0; k < PER; k++)
            if (threadIdx.x + k * blockDim.x < E)
                ss += xv[k] * xv[k];
        ss = dsq_block_sum(ss, red);
        /* HF: variance = mean(x^2); x * rsqrt(variance + eps); then weight * (.) */
        const float inv = rsqrtf(ss / (float)E + eps);
#pragma unroll
        for (int k = 0; k < PER; k++) {
            const int i = threadIdx.x + k * blockDim.x;
            if (i < E)
                o[i] = dsq_f2bf(wv[k] * (xv[k] * inv));
        }
    } else {
        for (int i = threadIdx.x; i < E; i += blockDim.x) {
            float v = xr[i];
            ss += v * v;
        }
        ss = dsq_block_sum(ss, red);
        const float inv = rsqrtf(ss / (float)E + eps);
        for (int i = threadIdx.x; i < E; i += blockDim.x)
            o[i] = dsq_f2bf(w[i] * (xr[i] * inv));
    }
}

/* One warp per output row, no block barrier.  NV > 0 (E % 4 == 0, E <=
 * 128 NV; x and w 16-byte, out 8-byte aligned): the lane's NV float4 of the
 * row are all requested at once and kept in registers for the write, so a
 * row costs one memory latency.  NV == 0: any E, two passes, the second
 * read from L1.  For long prompts: the block kernel above is bound by block
 * launch and its barriers there (20.7 us per call for 4,096 x 1,536 on the
 * H200, ~2x its memory time; this one 11-12 us), but it is the faster one
 * for few rows (H200, per call: 64 rows 3.3 vs 5.1 us, 512 rows 3.4 vs 4-5
 * us; a batch-8 step lost 0.11 ms to this kernel), hence kNormWarpMinRows. */
template <int NV>
__global__ void __launch_bounds__(32 * kNormRowsPerBlock)
    rmsnorm_warp_kernel(const float *__restrict__ x, const int32_t *__restrict__ rows, int32_t T, int32_t E,
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
    if (NV > 0) {
        const int E4 = E / 4;
        const float4 *x4 = reinterpret_cast<const float4 *>(xr), *w4 = reinterpret_cast<const float4 *>(w);
        float4 v[NV > 0 ? NV : 1];
#pragma unroll
        for (int k = 0; k < NV; k++) {
            const int i = lane + 32 * k;
            v[k] = i < E4 ? x4[i] : make_float4(0.f, 0.f, 0.f, 0.f);
        }
#pragma unroll
        for (int k = 0; k < NV; k++)
            ss += v[k].x * v[k].x + v[k].y * v[k].y + v[k].z * v[k].z + v[k].w * v[k].w;
        ss = dsq_warp_sum(ss);
        /* HF: variance = mean(x^2); x * rsqrt(variance + eps); then weight * (.) */
        const float inv = rsqrtf(ss / (float)E + eps);
        uint2 *o4 = reinterpret_cast<uint2 *>(o);
#pragma unroll
        for (int k = 0; k < NV; k++) {
            const int i = lane + 32 * k;
            if (i < E4) {
                const float4 g = w4[i];
                o4[i] = make_uint2(
                    (uint32_t)dsq_f2bf(g.x * (v[k].x * inv)) | (uint32_t)dsq_f2bf(g.y * (v[k].y * inv)) << 16,
                    (uint32_t)dsq_f2bf(g.z * (v[k].z * inv)) | (uint32_t)dsq_f2bf(g.w * (v[k].w * inv)) << 16);
            }
        }
    } else {
        for (int i = lane; i < E; i += 32) {
            const float v = xr[i];
            ss += v * v;
        }
        ss = dsq_warp_sum(ss);
        const float inv = rsqrtf(ss / (float)E + eps);
        for (int i = lane; i < E; i += 32)
            o[i] = dsq_f2bf(w[i] * (xr[i] * inv));
    }
}

extern "C" dsq_status dsq_cu_rmsnorm(const float *x, const int32_t *rows, int32_t T, int32_t E,
                                     const float *w, float eps, dsq_bf16 *out, cudaStream_t stream)
{
    if (T <= 0)
        return DSQ_OK;
    if (T < kNormWarpMinRows) {
        const int threads = E >= 1024 ? 512 : E >= 256 ? 256 : 64;
        const int per = (E + threads - 1) / threads; /* 1,536: 3; the 7B shape's 3,584: 7 */
        cudaError_t e;
        if (per <= 4)
            e = dsq_launch_pdl(rmsnorm_block_kernel<4>, dim3((unsigned)T), dim3(threads), 0, stream, x, rows, E, w,
                               eps, (uint16_t *)out);
        else if (per <= 8)
            e = dsq_launch_pdl(rmsnorm_block_kernel<8>, dim3((unsigned)T), dim3(threads), 0, stream, x, rows, E, w,
                               eps, (uint16_t *)out);
        else
            e = dsq_launch_pdl(rmsnorm_block_kernel<0>, dim3((unsigned)T), dim3(threads), 0, stream, x, rows, E, w,
                               eps, (uint16_t *)out);
        return dsq_cu_status(e, "rmsnorm kernel");
    }
    const dim3 grid((unsigned)((T + kNormRowsPerBlock - 1) / kNormRowsPerBlock)), block(32 * kNormRowsPerBlock);
    const bool vec = E % 4 == 0 && !(((uintptr_t)x | (uintptr_t)w) & 15) && !((uintptr_t)out & 7);
    /* float4 per lane: the smallest register tile that holds the row */
    const int nv = vec ? (E + 127) / 128 : 0;
    uint16_t *o = (uint16_t *)out;
    cudaError_t e;
    if (nv == 0 || nv > 32)
        e = dsq_launch_pdl(rmsnorm_warp_kernel<0>, grid, block, 0, stream, x, rows, T, E, w, eps, o);
    else if (nv <= 4)
        e = dsq_launch_pdl(rmsnorm_warp_kernel<4>, grid, block, 0, stream, x, rows, T, E, w, eps, o);
    else if (nv <= 8)
        e = dsq_launch_pdl(rmsnorm_warp_kernel<8>, grid, block, 0, stream, x, rows, T, E, w, eps, o);
    else if (nv <= 16)
        e = dsq_launch_pdl(rmsnorm_warp_kernel<16>, grid, block, 0, stream, x, rows, T, E, w, eps, o);
    else
        e = dsq_launch_pdl(rmsnorm_warp_kernel<32>, grid, block, 0, stream, x, rows, T, E, w, eps, o);
    return dsq_cu_status(e, "rmsnorm kernel");
}
