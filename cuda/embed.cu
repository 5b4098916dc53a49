/* embed.cu - token embedding gather: bf16 table rows -> fp32 residual stream. */
#include "common.cuh"

/* grid (ceil(E / (8*blockDim)), T); each thread widens 8 bf16s (one 16-byte
 * load) into two float4 stores.  VEC needs E % 8 == 0 (16-byte aligned rows). */
template <bool VEC>
__global__ void embed_kernel(const uint16_t *__restrict__ table, const int32_t *__restrict__ tokens,
                             int32_t E, float *__restrict__ x)
{
    const int t = blockIdx.y;
    const uint16_t *src = table + (size_t)tokens[t] * E;
    float *dst = x + (size_t)t * E;
    const int i = (blockIdx.x * blockDim.x + threadIdx.x) * 8;
    if (VEC) {
        if (i < E) {
            uint4 v = __ldg(reinterpret_cast<const uint4 *>(src + i));
            float f[8];
            dsq_unpack8(v, f);
            reinterpret_cast<float4 *>(dst + i)[0] = make_float4(f[0], f[1], f[2], f[3]);
            reinterpret_cast<float4 *>(dst + i)[1] = make_float4(f[4], f[5], f[6], f[7]);
        }
    } else {
        for (int j = i; j < i + 8 && j < E; j++)
            dst[j] = __uint_as_float((uint32_t)src[j] << 16);
    }
}

extern "C" dsq_status dsq_cu_embed(const dsq_bf16 *table, const int32_t *tokens, int32_t T,
                                   int32_t E, float *x, cudaStream_t stream)
{
    if (T <= 0)
        return DSQ_OK;
    const int threads = 128;
    dim3 grid((unsigned)((E + threads * 8 - 1) / (threads * 8)), (unsigned)T);
    const bool vec = E % 8 == 0 && ((uintptr_t)table & 15) == 0 && ((uintptr_t)x & 15) == 0;
    if (vec)
        embed_kernel<true><<<grid, threads, 0, stream>>>(table, tokens, E, x);
    else
        embed_kernel<false><<<grid, threads, 0, stream>>>(table, tokens, E, x);
    return DSQ_CU_LAUNCHED("embedding gather kernel");
}
