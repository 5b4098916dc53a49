/* rope.cu - rotary position embedding (neox form) on q and k in fp32, fused
 * with the bf16 conversion of the whole q|k|v row that attention consumes. */
#include "common.cuh"
#include "rope.cuh"

/* grid (T, n_heads), block >= D/2 threads: thread i handles the pair
 * (i, i + D/2) of one head of one token.  Heads below n_rot_heads (q, then
 * k) are rotated, the rest (v) only converted (rope.cuh: the rotation). */
__global__ void rope_kernel(const float *__restrict__ qkv, int32_t row_stride,
                            const int32_t *__restrict__ pos, int32_t n_rot_heads, int32_t D,
                            const float *__restrict__ inv_freq, uint16_t *__restrict__ out)
{
    const int t = blockIdx.x, h = blockIdx.y, i = threadIdx.x;
    const int half = D / 2;
    if (i >= half)
        return;
    const size_t base = (size_t)t * row_stride + (size_t)h * D;
    float a = qkv[base + i], b = qkv[base + i + half];
    if (h < n_rot_heads)
        dsq_rope_pair(a, b, pos[t], inv_freq[i]);
    out[base + i] = dsq_f2bf(a);
    out[base + i + half] = dsq_f2bf(b);
}

extern "C" dsq_status dsq_cu_rope(const float *qkv, int32_t row_stride, const int32_t *pos, int32_t T,
                                  int32_t n_rot_heads, int32_t n_heads, int32_t D,
                                  const float *inv_freq, dsq_bf16 *out, cudaStream_t stream)
{
    if (T <= 0 || n_heads <= 0)
        return DSQ_OK;
    if (D % 2 != 0 || D > 2048 || n_rot_heads > n_heads || (int64_t)n_heads * D > row_stride)
        return dsq_fail(DSQ_ERR_UNSUPPORTED, "rope: head_dim %d (must be even, <= 2048), %d rotated of %d heads, row stride %d",
                        D, n_rot_heads, n_heads, row_stride);
    int threads = ((D / 2 + 31) / 32) * 32;
    dim3 grid((unsigned)T, (unsigned)n_heads);
    rope_kernel<<<grid, threads, 0, stream>>>(qkv, row_stride, pos, n_rot_heads, D, inv_freq, out);
    return DSQ_CU_LAUNCHED("rope kernel");
}
