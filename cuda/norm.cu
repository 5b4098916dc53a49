/* norm.cu - RMSNorm: fp32 residual rows -> bf16 normalised rows (the input
 * of the next matrix product). */
#include "common.cuh"

/* One block per output row.  Two passes over the row: the sum of squares,
 * then the scaled write; the second read hits L1 (a row is E*4 bytes). */
__global__ void rmsnorm_kernel(const float *__restrict__ x, const int32_t *__restrict__ rows,
                               int32_t E, const float *__restrict__ w, float eps,
                               uint16_t *__restrict__ out)
{
    __shared__ float red[32];
    dsq_pdl_wait();
    dsq_pdl_trigger();
    const int t = blockIdx.x;
    const int r = rows ? rows[t] : t;
    const float *xr = x + (size_t)r * E;
    uint16_t *o = out + (size_t)t * E;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < E; i += blockDim.x) {
        float v = xr[i];
        ss += v * v;
    }
    ss = dsq_block_sum(ss, red);
    /* HF: variance = mean(x^2); x * rsqrt(variance + eps); then weight * (.) */
    const float inv = rsqrtf(ss / (float)E + eps);
    for (int i = threadIdx.x; i < E; i += blockDim.x)
        o[i] = dsq_f2bf(w[i] * (xr[i] * inv));
}

extern "C" dsq_status dsq_cu_rmsnorm(const float *x, const int32_t *rows, int32_t T, int32_t E,
                                     const float *w, float eps, dsq_bf16 *out, cudaStream_t stream)
{
    if (T <= 0)
        return DSQ_OK;
    int threads = E >= 1024 ? 512 : E >= 256 ? 256 : 64;
    return dsq_cu_status(dsq_launch_pdl(rmsnorm_kernel, dim3((unsigned)T), dim3(threads), 0, stream, x, rows, E, w,
                                        eps, (uint16_t *)out),
                         "rmsnorm kernel");
}
