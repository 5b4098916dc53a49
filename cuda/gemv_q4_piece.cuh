/* gemv_q4_piece.cuh - one 16-byte piece of Q4_G128 codes (32 codes, a
 * quarter of a group of 128) against T rows of x, for the 4-bit GEMVs of
 * gemv.cu and gemv_quant.cu: both sum the same terms in the same order.
 * Codes become floats without int -> float conversions (quant_decode.cuh);
 * the caller multiplies the piece's sums by the group scale. */
#ifndef DSQ_CUDA_GEMV_Q4_PIECE_CUH
#define DSQ_CUDA_GEMV_Q4_PIECE_CUH

#include "common.cuh"
#include "quant_decode.cuh"

/* 32-bit word i (0..3) of a 16-byte piece */
__device__ __forceinline__ uint32_t dsq_u4_word(const uint4 &v, int i)
{
    return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

/* part[t][r] = sum over the piece's 32 codes c of row r: x[t] * (c - zero_r),
 * zb[r] = dsq_qd_zbias(zero_r); xpiece(t, w) returns the 8 bf16 of x row t
 * under codes 8w .. 8w+7 (w = 0..3) as one uint4. */
template <int T, int R, class XPiece>
__device__ __forceinline__ void dsq_q4_piece(const uint4 (&wv)[R], const float (&zb)[R], XPiece xpiece,
                                             float (&part)[T][R])
{
#pragma unroll
    for (int t = 0; t < T; t++)
#pragma unroll
        for (int r = 0; r < R; r++)
            part[t][r] = 0.0f;
#pragma unroll
    for (int w = 0; w < 4; w++) {
        float cw[R][8];
#pragma unroll
        for (int r = 0; r < R; r++) {
            const uint32_t word = dsq_u4_word(wv[r], w);
#pragma unroll
            for (int j = 0; j < 8; j++)
                cw[r][j] = dsq_qd_u4(word, j, zb[r]);
        }
#pragma unroll
        for (int t = 0; t < T; t++) {
            float xf[8];
            dsq_unpack8(xpiece(t, w), xf);
#pragma unroll
            for (int r = 0; r < R; r++)
#pragma unroll
                for (int e = 0; e < 8; e++)
                    part[t][r] = fmaf(xf[e], cw[r][e], part[t][r]);
        }
    }
}

#endif
