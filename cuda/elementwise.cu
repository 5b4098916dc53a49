/* elementwise.cu - SiLU gating, residual add, fp32 -> bf16 conversion. */
#include "common.cuh"

/* One thread per output element; gate/up are adjacent (interleaved rows of
 * the fused weight), so one 8-byte load fetches both. */
__global__ void silu_mul_kernel(const float2 *__restrict__ gu, int64_t n, uint16_t *__restrict__ out)
{
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n)
        return;
    float2 v = gu[i];
    /* silu(g) = g * sigmoid(g); expf, not __expf, to stay within an ulp or two */
    float s = v.x / (1.0f + expf(-v.x));
    out[i] = dsq_f2bf(s * v.y);
}

__global__ void add_kernel(float *__restrict__ y, const float *__restrict__ x, int64_t n)
{
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        y[i] += x[i];
}

__global__ void f32_to_bf16_kernel(const float *__restrict__ x, int64_t n, uint16_t *__restrict__ out)
{
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        out[i] = dsq_f2bf(x[i]);
}

static unsigned blocks_for(int64_t n, int threads) { return (unsigned)((n + threads - 1) / threads); }

extern "C" dsq_status dsq_cu_silu_mul(const float *gu, int32_t T, int32_t F, dsq_bf16 *out,
                                      cudaStream_t stream)
{
    int64_t n = (int64_t)T * F;
    if (n <= 0)
        return DSQ_OK;
    silu_mul_kernel<<<blocks_for(n, 256), 256, 0, stream>>>(reinterpret_cast<const float2 *>(gu), n, out);
    return DSQ_CU_LAUNCHED("silu*mul kernel");
}

extern "C" dsq_status dsq_cu_add(float *y, const float *x, int64_t n, cudaStream_t stream)
{
    if (n <= 0)
        return DSQ_OK;
    add_kernel<<<blocks_for(n, 256), 256, 0, stream>>>(y, x, n);
    return DSQ_CU_LAUNCHED("residual add kernel");
}

extern "C" dsq_status dsq_cu_f32_to_bf16(const float *x, int64_t n, dsq_bf16 *out, cudaStream_t stream)
{
    if (n <= 0)
        return DSQ_OK;
    f32_to_bf16_kernel<<<blocks_for(n, 256), 256, 0, stream>>>(x, n, out);
    return DSQ_CU_LAUNCHED("f32->bf16 kernel");
}
