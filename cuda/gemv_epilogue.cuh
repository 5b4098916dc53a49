/* gemv_epilogue.cuh - the end of every GEMV block (bf16 in gemv.cu, 8- and
 * 4-bit in gemv_quant.cu): reduce each (token, row) partial sum over the
 * block's warps, then apply the epilogue. */
#ifndef DSQ_CUDA_GEMV_EPILOGUE_CUH
#define DSQ_CUDA_GEMV_EPILOGUE_CUH

#include "common.cuh"

/* Reduce acc[T][R] (this thread's partial sums) over the block through
 * red[T * R * warps] and apply the epilogue to rows row0..row0+R-1 of N;
 * rowscale (Q8's per-row scale, or NULL: bf16, Q4) multiplies each row's
 * sum before the bias.  SILU_MUL: rows come in (gate, up) pairs and y is
 * bf16 [T][N/2]; otherwise y is fp32 [T][N]. */
template <int T, int R, int EPI>
__device__ __forceinline__ void gemv_block_epilogue(float (&acc)[T][R], float *red, int row0, int N,
                                                    const float *__restrict__ rowscale,
                                                    const float *__restrict__ bias, void *y)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int NW = blockDim.x >> 5;
#pragma unroll
    for (int t = 0; t < T; t++)
#pragma unroll
        for (int r = 0; r < R; r++) {
            float v = dsq_warp_sum(acc[t][r]);
            if (lane == 0)
                red[(t * R + r) * NW + warp] = v;
        }
    __syncthreads();
    const int j = threadIdx.x;
    if (EPI == DSQ_EPI_SILU_MUL) {
        if (j < T * (R / 2)) {
            const int t = j / (R / 2), p = j % (R / 2);
            const int n = row0 + 2 * p;
            if (n + 1 < N) {
                float g = 0.0f, u = 0.0f;
                for (int w = 0; w < NW; w++) {
                    g += red[(t * R + 2 * p) * NW + w];
                    u += red[(t * R + 2 * p + 1) * NW + w];
                }
                if (rowscale) {
                    g *= rowscale[n];
                    u *= rowscale[n + 1];
                }
                float s = g / (1.0f + expf(-g));
                static_cast<uint16_t *>(y)[(size_t)t * (N / 2) + n / 2] = dsq_f2bf(s * u);
            }
        }
    } else if (j < T * R) {
        const int t = j / R, r = j % R;
        const int n = row0 + r;
        if (n < N) {
            float v = 0.0f;
            for (int w = 0; w < NW; w++)
                v += red[j * NW + w];
            if (rowscale)
                v *= rowscale[n];
            float *yo = static_cast<float *>(y) + (size_t)t * N + n;
            if (EPI == DSQ_EPI_BIAS)
                v += bias[n];
            if (EPI == DSQ_EPI_ADD)
                v += *yo;
            *yo = v;
        }
    }
}

#endif
