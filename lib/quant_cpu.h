/* quant_cpu.h - quantized linear weights on the host: the two layouts the
 * backends run (Q8_ROW, Q4_G128), conversion into them from AWQ and GPTQ
 * checkpoints and from bf16/f16/f32 weights (quantize at load), and the
 * CPU products, which are the numeric reference for the GPU kernels
 * (cuda/gemv_quant.cu).  docs/quantization.md describes the formats.
 *
 * A linear weight is logically W [N out][K in] as in the dense path (y = x
 * W^T).  Both layouts keep that row order, one output row after the other,
 * so a row range [o0, o1) of the product touches only its own bytes, and a
 * GPU block owning a few rows streams them with 16-byte loads like the bf16
 * GEMV.
 *
 * ---- Q8_ROW (8-bit, symmetric, one scale per output row) --------------------
 *   q      int8  [N][K]   row-major, row stride K bytes
 *   scales float [N]      fp32
 *   W[n][k] = (float)q[n*K + k] * scales[n]          (one fp32 product)
 *
 * ---- Q4_G128 (4-bit, asymmetric, groups of 128 along K) ---------------------
 *   ldq = dsq_q4_ldq(K) = round_up(K, 32) / 2 bytes per row (a whole number
 *         of 16-byte pieces, so every row of a 16-byte aligned q is aligned)
 *   G   = dsq_q4_groups(K) = ceil(K / 128); the last group may be partial
 *   q      uint8  [N][ldq]  W[n][k]'s 4-bit code is nibble k%2 of byte
 *                           q[n*ldq + k/2]: the low nibble holds the even k,
 *                           the high nibble the odd k.  Read as a little-
 *                           endian uint32, word j of a row holds k = 8j..8j+7
 *                           at bits 4(k-8j)..4(k-8j)+3.  Nibbles past K are 0.
 *   scales uint16 [N][G]    IEEE half scale of group g = k/128 of row n
 *   zeros  uint8  [N][G]    zero point of that group (0..15 from AWQ, GPTQ
 *                           v2 and quantize-at-load; 1..16 from GPTQ v1,
 *                           whose stored zero is zero - 1)
 *   W[n][k] = (float)((int)code - (int)zero) * (float)scale
 *   This is exact in fp32 (an integer of at most 9 bits times an 11-bit
 *   significand), so every dequantization of the same bytes -- numpy, the CPU,
 *   a GPU kernel in registers -- gives the same fp32 weight bit for bit.
 *
 * Everything here works on caller-owned memory and is thread-safe on
 * disjoint outputs.  Functions returning dsq_status report bad sizes,
 * unsupported contents and non-finite values with dsq_fail(); the caller
 * adds the tensor's name. */
#ifndef DSQ_QUANT_CPU_H
#define DSQ_QUANT_CPU_H

#include <stddef.h>
#include <stdint.h>

#include "internal.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DSQ_Q4_GROUP 128

/* A Q8_ROW matrix (layout above); rows = N, cols = K. */
typedef struct dsq_q8_mat {
    const int8_t *q;
    const float *scales;
    int64_t rows, cols;
} dsq_q8_mat;

/* A Q4_G128 matrix (layout above); rows = N, cols = K. */
typedef struct dsq_q4_mat {
    const uint8_t *q;
    const uint16_t *scales;
    const uint8_t *zeros;
    int64_t rows, cols;
} dsq_q4_mat;

/* Bytes per Q4 row (round_up(K, 32) / 2) and groups per row (ceil(K/128)). */
int64_t dsq_q4_ldq(int64_t K);
int64_t dsq_q4_groups(int64_t K);
/* Bytes of each array of an N x K Q4_G128 matrix. */
size_t dsq_q4_q_bytes(int64_t N, int64_t K);
size_t dsq_q4_scales_bytes(int64_t N, int64_t K); /* N*G*2 */
size_t dsq_q4_zeros_bytes(int64_t N, int64_t K);  /* N*G   */

/* ---- from checkpoints (repack at load) ------------------------------------
 * Both write a whole Q4_G128 matrix (q [N][ldq], scales [N][G], zeros
 * [N][G], caller-allocated with the sizes above) from the tensors as stored
 * (int32 read as little-endian uint32 bit patterns; scales f16 bits).
 * DSQ_ERR_SHAPE when N or K do not fit the format, DSQ_ERR_FORMAT for a NaN
 * or infinite scale (naming group and column), DSQ_ERR_INVALID_ARG on
 * NULL. */

/* AutoAWQ GEMM packing, group size 128:
 *   qweight int32 [K][N/8]:    word (k, c) holds W[8c + AWQ_ORDER[i]][k]'s
 *                              code in bits 4i..4i+3, AWQ_ORDER = {0, 2, 4,
 *                              6, 1, 3, 5, 7}
 *   qzeros  int32 [K/128][N/8]: the zero points, same nibble order
 *   scales  f16   [K/128][N]
 * Needs N % 8 == 0 and K % 128 == 0. */
dsq_status dsq_q4_from_awq(const int32_t *qweight, const int32_t *qzeros, const uint16_t *scales,
                           int64_t N, int64_t K, uint8_t *q, uint16_t *q_scales,
                           uint8_t *q_zeros);

/* AutoGPTQ / GPTQModel packing, group size 128, desc_act false:
 *   qweight int32 [K/8][N]:    word (r, n) holds W[n][8r + j]'s code in bits
 *                              4j..4j+3
 *   qzeros  int32 [K/128][N/8]: word (g, c) holds the stored zero of column
 *                              8c + j in bits 4j..4j+3; zero = stored +
 *                              zero_offset (1 for "gptq" v1 checkpoints,
 *                              0 for "gptq_v2")
 *   scales  f16   [K/128][N]
 *   g_idx   int32 [K] or NULL: must be k / 128 for every k (anything else is
 *                              act-order or a permuted grouping:
 *                              DSQ_ERR_UNSUPPORTED naming the first bad k)
 * Needs N % 8 == 0 and K % 128 == 0. */
dsq_status dsq_q4_from_gptq(const int32_t *qweight, const int32_t *qzeros, const uint16_t *scales,
                            const int32_t *g_idx, int zero_offset, int64_t N, int64_t K,
                            uint8_t *q, uint16_t *q_scales, uint8_t *q_zeros);

/* ---- quantize at load ---------------------------------------------------------
 * Rows [n0, n1) of W (dtype dt: BF16, F16 or F32; [N][K] row-major at w,
 * row stride K elements) into the layouts above; the outputs are the whole
 * matrices' arrays (row n is written at its own offset), so threads may
 * quantize disjoint row ranges at once.  A NaN or +-Inf weight is
 * DSQ_ERR_FORMAT naming the row; so is a Q4 group whose range needs a scale
 * beyond the f16 range (|w| of ~5e5).  Round to nearest, ties to even (rint)
 * throughout; every step in fp32:
 *
 * Q8_ROW:  amax = max_k |w|;  scale = amax / 127;  q = clamp(rint(w / scale),
 *          -127, 127)  (all q = 0 and scale = 0 for a zero row).
 *          |w - w'| <= scale / 2.
 * Q4_G128, per group of 128 (or fewer, the last one):
 *          lo = min(0, min w), hi = max(0, max w)   (so 0 is representable)
 *          s  = f16((hi - lo) / 15), rounded to nearest and then raised by
 *               one f16 step if below (hi - lo) / 15, so no code overflows
 *          z  = clamp(rint(-lo / s), 0, 15)
 *          q  = clamp(rint(w / s) + z, 0, 15)
 *          (s = 0, z = q = 0 only for an all-zero group; a tiny nonzero
 *          range gets at least the smallest f16 subnormal, 2^-24).
 *          |w - w'| <= s / 2 (to fp32 rounding of w / s). */
dsq_status dsq_q8_quantize_rows(const void *w, dsq_dtype dt, int64_t K, int64_t n0, int64_t n1,
                                int8_t *q, float *scales);
dsq_status dsq_q4_quantize_rows(const void *w, dsq_dtype dt, int64_t K, int64_t n0, int64_t n1,
                                uint8_t *q, uint16_t *q_scales, uint8_t *q_zeros);

/* ---- dequantize ------------------------------------------------------------------
 * dst [n1-n0][K] fp32 = rows [n0, n1) of W exactly as the formulas above. */
void dsq_q8_dequant_rows(const dsq_q8_mat *W, int64_t n0, int64_t n1, float *dst);
void dsq_q4_dequant_rows(const dsq_q4_mat *W, int64_t n0, int64_t n1, float *dst);

/* ---- products ------------------------------------------------------------------------
 * The dense matmul's contract (cpu_ops.h) on the dequantized weights W':
 *   Y[t*ldy + o] = (accumulate ? Y[t*ldy + o] : 0) + (dot(X[t], W'[o]) + bias[o])
 * for t < T, o in [o0, o1); X fp32 [T][ldx] (K used), bias [N] or NULL.
 * The dot is 16 fp32 lanes of fused multiply-adds in a fixed order and a
 * fixed lane sum (quant_cpu_matmul.c spells out which k each lane takes);
 * Q8 multiplies the row's sum by its scale.  So an output is the same bits
 * whatever the batch T, the row range, the thread, and whichever kernel
 * (AVX-512, AVX2 + FMA, portable) the CPU runs; it is within a few K ulps
 * of the exact dot (tests/test_quant_cpu.c), not bit-equal to the dense
 * kernel's order on an F32 W'.  The codes are read once per block of 16
 * tokens.  scratch: dsq_quant_scratch_floats(K) floats per thread (the
 * activations of 16 tokens in lane order; re-aligned to 64 bytes inside). */
size_t dsq_quant_scratch_floats(int64_t K);
void dsq_q8_matmul_rows(float *Y, int64_t ldy, const float *X, int64_t ldx, int32_t T,
                        const dsq_q8_mat *W, const dsq_tensor *bias, int64_t o0, int64_t o1,
                        int accumulate, float *scratch);
void dsq_q4_matmul_rows(float *Y, int64_t ldy, const float *X, int64_t ldx, int32_t T,
                        const dsq_q4_mat *W, const dsq_tensor *bias, int64_t o0, int64_t o1,
                        int accumulate, float *scratch);

/* The kernel the products run: chosen from the CPU's features once, on the
 * first product, and kept (DSQ_QISA_AUTO), or forced (tests and benchmarks:
 * not thread-safe, set it before products run).  force returns 0, changing
 * nothing, when the CPU lacks the instructions. */
enum { DSQ_QISA_AUTO = 0, DSQ_QISA_PORTABLE = 1, DSQ_QISA_AVX2 = 2, DSQ_QISA_AVX512 = 3 };
int dsq_quant_cpu_force_isa(int isa);
int dsq_quant_cpu_isa(void); /* the one in use now */

#ifdef __cplusplus
}
#endif

#endif
