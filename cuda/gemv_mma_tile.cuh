/* gemv_mma_tile.cuh - the end of a 16-row tile of the tensor-core GEMVs
 * (gemv_mma.cu: bf16 weights; gemv_mma_quant.cu: Q4_G128, Q8_ROW): each warp's
 * m16n8k16 accumulators C[16 rows][8 tokens] into shared memory, then the
 * warps' sums through the epilogue, per (row, token).
 *
 * red: float [warps][16][8] in shared memory. */
#ifndef DSQ_CUDA_GEMV_MMA_TILE_CUH
#define DSQ_CUDA_GEMV_MMA_TILE_CUH

#include "common.cuh"

/* C fragment of lane (g = lane / 4, q = lane % 4): c0, c1 = row g, tokens
 * 2q, 2q + 1; c2, c3 = row g + 8. */
__device__ __forceinline__ void dsq_mma_tile_put(const float (&c)[4], float *red)
{
    const int lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
    float *rw = red + (threadIdx.x >> 5) * 128;
    rw[g * 8 + 2 * q] = c[0];
    rw[g * 8 + 2 * q + 1] = c[1];
    rw[(g + 8) * 8 + 2 * q] = c[2];
    rw[(g + 8) * 8 + 2 * q + 1] = c[3];
}

/* After a barrier that follows every warp's dsq_mma_tile_put: rows n0 ..
 * n0 + 15 of y for T tokens, summed over nw warps in warp order.
 * SILU_MUL: rows 2p, 2p + 1 are (gate, up) pair p, y bf16 [T][N/2];
 * else y fp32 [T][N] (BIAS adds bias[n], ADD adds to y). */
template <int EPI>
__device__ __forceinline__ void dsq_mma_tile_epilogue(const float *red, int nw, int n0, int T, int N,
                                                      const float *bias, void *y)
{
    if (EPI == DSQ_EPI_SILU_MUL) {
        for (int j = threadIdx.x; j < 8 * T; j += blockDim.x) {
            const int t = j / 8, p = j % 8, n = n0 + 2 * p;
            if (n + 1 < N) {
                float gs = 0.0f, us = 0.0f;
                for (int w = 0; w < nw; w++) {
                    gs += red[w * 128 + (2 * p) * 8 + t];
                    us += red[w * 128 + (2 * p + 1) * 8 + t];
                }
                const float s = gs / (1.0f + expf(-gs));
                static_cast<uint16_t *>(y)[(size_t)t * (N / 2) + n / 2] = dsq_f2bf(s * us);
            }
        }
    } else {
        for (int j = threadIdx.x; j < 16 * T; j += blockDim.x) {
            const int t = j / 16, r = j % 16, n = n0 + r;
            if (n < N) {
                float v = 0.0f;
                for (int w = 0; w < nw; w++)
                    v += red[w * 128 + r * 8 + t];
                float *yo = static_cast<float *>(y) + (size_t)t * N + n;
                if (EPI == DSQ_EPI_BIAS)
                    v += bias[n];
                if (EPI == DSQ_EPI_ADD)
                    v += *yo;
                *yo = v;
            }
        }
    }
}

#endif
