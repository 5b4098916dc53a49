/*
 * gemv_quant.h - C-callable launchers of the quantized-weight products
 * (cuda/gemv_quant.cu).  Conventions as cuda/kernels.h: enqueue only (no
 * allocation, no sync, graph-capturable), DSQ_OK or a dsq_fail() status
 * naming the kernel.
 *
 * Weight layouts are exactly the host ones of lib/quant_cpu.h, uploaded as
 * they are (W logically [N out][K in]):
 *   Q8_ROW   q int8 [N][K] (row stride K), scales fp32 [N]
 *            W[n][k] = (float)q * scales[n]
 *   Q4_G128  q uint8 [N][ldq], ldq = round_up(K, 32) / 2 (code of k: low
 *            nibble of byte k/2 for even k, high for odd k), scales f16 bits
 *            [N][ceil(K/128)], zeros uint8 [N][ceil(K/128)]
 *            W[n][k] = (float)(code - zero) * scale
 * Activations x are bf16 [T][K] (what the dense GEMV takes), y follows the
 * dsq_epilogue of kernels.h (fp32 [T][N], or bf16 [T][N/2] for SILU_MUL
 * with gate/up rows interleaved in pairs).
 *
 * Numerics: fp32 accumulation; Q4 sums x*(code - zero) over each 32-code
 * piece (inside one group) and adds scale * piece_sum; Q8 sums x*q over the
 * row and multiplies by the row scale once.  The dequantized codes are exact,
 * so the only difference from the CPU product (lib/quant_cpu_matmul.c) is the
 * order of fp32 additions: tests/test_cuda_quant.cu checks them against it
 * within a few fp32 roundings of sum|x*w|.
 */
#ifndef DSQ_CUDA_GEMV_QUANT_H
#define DSQ_CUDA_GEMV_QUANT_H

#include <stdint.h>

#include "kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

/* y = epilogue(x W^T) for T in 1..DSQ_GEMV_MAX_TOKENS with Q8_ROW W.
 * 16-byte loads of q (16 codes) when K % 16 == 0 and x, q are 16-byte
 * aligned; a scalar path covers the rest.  N even for SILU_MUL; bias fp32
 * [N] for BIAS. */
dsq_status dsq_cu_gemv_q8(const dsq_bf16 *x, const int8_t *q, const float *scales,
                          const float *bias, int32_t T, int32_t N, int32_t K, dsq_epilogue epi,
                          void *y, cudaStream_t stream);

/* The same with Q4_G128 W: 16-byte loads (32 codes, one group's quarter)
 * when K % 32 == 0 and x, q are 16-byte aligned; scalar path otherwise. */
dsq_status dsq_cu_gemv_q4(const dsq_bf16 *x, const uint8_t *q, const uint16_t *scales,
                          const uint8_t *zeros, const float *bias, int32_t T, int32_t N,
                          int32_t K, dsq_epilogue epi, void *y, cudaStream_t stream);

/* Explicit block shape, for tuning and tests: nt threads per block (32, 64,
 * 128 or 256), r rows per block (2, 4, or 8 for T <= 2 in gemv_quant.cu's
 * kernels; gemv.cu's take at most 4 for quantized weights) on the 16-byte
 * path (the scalar path always takes 2); 0, 0 = default. */
dsq_status dsq_cu_gemv_q8_cfg(const dsq_bf16 *x, const int8_t *q, const float *scales,
                              const float *bias, int32_t T, int32_t N, int32_t K,
                              dsq_epilogue epi, void *y, int nt, int r, cudaStream_t stream);
dsq_status dsq_cu_gemv_q4_cfg(const dsq_bf16 *x, const uint8_t *q, const uint16_t *scales,
                              const uint8_t *zeros, const float *bias, int32_t T, int32_t N,
                              int32_t K, dsq_epilogue epi, void *y, int nt, int r,
                              cudaStream_t stream);

/* Q8_ROW products in gemv.cu's kernel (stop 35): weights loaded before the
 * PDL wait, GEMV_UNROLL pieces in flight, row groups balanced over the
 * resident blocks; dsq_cu_gemv_q8_cfg sends its 16-byte path there for an
 * explicit block shape (32, 64, 128 or 256 threads) and, for the default
 * shape, where dsq_cu_gemv_q8_pdl_use says; dsq_cu_gemv_q8_old_cfg always
 * runs the older kernel above.  Needs dsq_cu_gemv_q8_pdl_ok (K % 16 == 0,
 * x and q 16-byte aligned); nt = r = 0 picks the shape.  The norm variant computes x =
 * bf16(nw * rmsnorm(xr row)) inside each block (xr fp32 [*][K], row t of
 * xr is rows[t] or t; dsq_cu_gemv_q8_norm_ok: T <= 4, T*K*2 <= 40 KB; not
 * with the ADD epilogue). */
int dsq_cu_gemv_q8_pdl_ok(int32_t T, int32_t K, const void *x, const int8_t *q);
/* Whether the default (nt = r = 0) Q8 product goes to gemv.cu's kernel:
 * DSQ_CUDA_Q8_GEMV=old never, =new always, default for N < 16384 (qkv, o,
 * down; gate/up and the head stay on the older kernel, faster there on the
 * H100 at stop 35).  The backend folds the RMSNorm only where this holds. */
int dsq_cu_gemv_q8_pdl_use(int32_t T, int32_t N, int32_t K, const void *x, const int8_t *q);
/* gemv_quant.cu's own Q8 kernel (one-warp blocks allowed), whatever the
 * policy: for comparison in the timing table */
dsq_status dsq_cu_gemv_q8_old_cfg(const dsq_bf16 *x, const int8_t *q, const float *scales,
                                  const float *bias, int32_t T, int32_t N, int32_t K,
                                  dsq_epilogue epi, void *y, int nt, int r, cudaStream_t stream);
int dsq_cu_gemv_q8_norm_ok(int32_t T, int32_t K, const void *xr, const float *nw, const int8_t *q);
dsq_status dsq_cu_gemv_q8_pdl_cfg(const dsq_bf16 *x, const int8_t *q, const float *scales,
                                  const float *bias, int32_t T, int32_t N, int32_t K,
                                  dsq_epilogue epi, void *y, int nt, int r, cudaStream_t stream);
dsq_status dsq_cu_gemv_q8_norm_cfg(const float *xr, const int32_t *rows, const float *nw, float eps,
                                   const int8_t *q, const float *scales, const float *bias, int32_t T,
                                   int32_t N, int32_t K, dsq_epilogue epi, void *y, int nt, int r,
                                   cudaStream_t stream);

/* Q4_G128 products in gemv.cu's kernel (stop 38), as the Q8 ones above:
 * dsq_cu_gemv_q4_cfg sends its 16-byte path (dsq_cu_gemv_q4_pdl_ok: K %
 * 32 == 0, x and q 16-byte aligned) there for an explicit block shape and,
 * for the default one, where dsq_cu_gemv_q4_pdl_use says
 * (DSQ_CUDA_Q4_GEMV=old: never, =new: always, default: N < 16384, as Q8;
 * the backend sends products there only below DSQ_CUDA_QROWS_Q4_MIN
 * rows, default 3: qkv, o and down at 1-2 rows); dsq_cu_gemv_q4_old_cfg
 * always runs gemv_quant.cu's kernel.  The norm variant as Q8's
 * (dsq_cu_gemv_q4_norm_ok: T <= 4, K % 32 == 0, T*K*2 <= 40 KB; not with
 * the ADD epilogue). */
int dsq_cu_gemv_q4_pdl_ok(int32_t T, int32_t K, const void *x, const uint8_t *q);
int dsq_cu_gemv_q4_pdl_use(int32_t T, int32_t N, int32_t K, const void *x, const uint8_t *q);
dsq_status dsq_cu_gemv_q4_old_cfg(const dsq_bf16 *x, const uint8_t *q, const uint16_t *scales,
                                  const uint8_t *zeros, const float *bias, int32_t T, int32_t N,
                                  int32_t K, dsq_epilogue epi, void *y, int nt, int r, cudaStream_t stream);
dsq_status dsq_cu_gemv_q4_pdl_cfg(const dsq_bf16 *x, const uint8_t *q, const uint16_t *scales,
                                  const uint8_t *zeros, const float *bias, int32_t T, int32_t N,
                                  int32_t K, dsq_epilogue epi, void *y, int nt, int r, cudaStream_t stream);
int dsq_cu_gemv_q4_norm_ok(int32_t T, int32_t K, const void *xr, const float *nw, const uint8_t *q);
dsq_status dsq_cu_gemv_q4_norm_cfg(const float *xr, const int32_t *rows, const float *nw, float eps,
                                   const uint8_t *q, const uint16_t *scales, const uint8_t *zeros,
                                   const float *bias, int32_t T, int32_t N, int32_t K, dsq_epilogue epi,
                                   void *y, int nt, int r, cudaStream_t stream);

/* Large batches: rows [n0, n1) of W dequantized into bf16 out [n1-n0][K]
 * (row stride K) for the cuBLASLt path (dsq_gemm_run) on a scratch tile of
 * rows: part 0, each weight's exact fp32 value w rounded to nearest even;
 * part 1, the remainder bf16(w - bf16(w)) (the two parts' products summed
 * give the exact weights' product: Q4 exactly, Q8 to 2^-16); Q8 only,
 * part 2: the codes as bf16 (exact), the row scales left to the caller
 * (dsq_cu_scale_epilogue). */
dsq_status dsq_cu_dequant_q8_bf16(const int8_t *q, const float *scales, int32_t K, int32_t n0,
                                  int32_t n1, int32_t part, dsq_bf16 *out, cudaStream_t stream);
dsq_status dsq_cu_dequant_q4_bf16(const uint8_t *q, const uint16_t *scales, const uint8_t *zeros,
                                  int32_t K, int32_t n0, int32_t n1, int32_t part, dsq_bf16 *out,
                                  cudaStream_t stream);

/* Q4_G128 / Q8_ROW products of 1..DSQ_GEMV_MAX_TOKENS rows on the tensor
 * cores (cuda/gemv_mma_quant.cu): blocks of nt threads (a multiple of 32
 * up to 512; 0 = its choice) over 16-row tiles of W, no K split, no
 * workspace; codes loaded before the PDL wait.  Only where the _ok
 * function holds: K a multiple of 128 (Q4) or 64 (Q8), x and q 16-byte
 * aligned; Q4 zero points 0..16 (as gemm_rows.cu).  Numerics as
 * dsq_cu_gemm_rows_q4 / _q8.  dsq_cu_linear sends products there as
 * its env's qmma_* fields say (cuda/kernels.h). */
int dsq_cu_gemv_mma_q4_ok(int32_t T, int32_t K, const void *x, const uint8_t *q);
dsq_status dsq_cu_gemv_mma_q4(const dsq_bf16 *x, const uint8_t *q, const uint16_t *scales,
                              const uint8_t *zeros, const float *bias, int32_t T, int32_t N,
                              int32_t K, dsq_epilogue epi, void *y, int nt, cudaStream_t stream);
int dsq_cu_gemv_mma_q8_ok(int32_t T, int32_t K, const void *x, const int8_t *q);
dsq_status dsq_cu_gemv_mma_q8(const dsq_bf16 *x, const int8_t *q, const float *scales, const float *bias,
                              int32_t T, int32_t N, int32_t K, dsq_epilogue epi, void *y, int nt,
                              cudaStream_t stream);
/* The same with the RMSNorm before the product folded in: every block
 * computes x = bf16(nw * rmsnorm(xr[rows ? rows[t] : t])) for its T rows
 * into shared memory (gemv_norm.cuh; a warp per row where T <= warps), as
 * dsq_cu_rmsnorm would, in another summation order.  At most 256 threads
 * (0: its choice, capped at 8 warps), not the ADD epilogue (y may be the
 * residual other blocks read), and only where the _norm_ok function holds:
 * the _ok conditions on xr, nw 16-byte aligned, T * (K + 32) * 2 <=
 * DSQ_GEMV_NORM_MAX_SMEM.  Its x reads from shared memory have 2-way bank
 * conflicts (4-bit: lanes q and q + 2 of a row; not yet measured). */
int dsq_cu_gemv_mma_q4_norm_ok(int32_t T, int32_t K, const float *xr, const float *nw, const uint8_t *q);
dsq_status dsq_cu_gemv_mma_q4_norm(const float *xr, const int32_t *rows, const float *nw, float eps,
                                   const uint8_t *q, const uint16_t *scales, const uint8_t *zeros,
                                   const float *bias, int32_t T, int32_t N, int32_t K, dsq_epilogue epi,
                                   void *y, int nt, cudaStream_t stream);
int dsq_cu_gemv_mma_q8_norm_ok(int32_t T, int32_t K, const float *xr, const float *nw, const int8_t *q);
dsq_status dsq_cu_gemv_mma_q8_norm(const float *xr, const int32_t *rows, const float *nw, float eps,
                                   const int8_t *q, const float *scales, const float *bias, int32_t T,
                                   int32_t N, int32_t K, dsq_epilogue epi, void *y, int nt,
                                   cudaStream_t stream);

/* Tensor-core products of 1..DSQ_GEMM_ROWS_MAX rows (cuda/gemm_rows.cu,
 * the bf16 dsq_cu_gemm_rows of kernels.h with the codes converted to bf16
 * in registers): same arguments, workspace, tickets, splits and stream
 * rules as dsq_cu_gemm_rows; only where dsq_cu_gemm_rows_q_ok(): K a
 * multiple of 128 (whole Q4 groups), 16-byte aligned x and q.  Numerics:
 * fp32 accumulation of x * code (exact bf16 operands); Q4 adds each group's
 * sum times its scale, Q8 multiplies the row's sum by its scale.  Q4 zero
 * points must be 0..16 (the loader's check, lib/weights_quant.c): the
 * code - zero pairs are exact bf16 integers only then. */
int dsq_cu_gemm_rows_q_ok(int32_t T, int32_t K, const void *x, const void *q);
dsq_status dsq_cu_gemm_rows_q8(const dsq_bf16 *x, const int8_t *q, const float *scales, const float *bias,
                               int32_t T, int32_t N, int32_t K, dsq_epilogue epi, void *y, float *ws,
                               size_t ws_bytes, int32_t *tickets, int32_t n_tickets, int32_t splits,
                               cudaStream_t stream);
dsq_status dsq_cu_gemm_rows_q4(const dsq_bf16 *x, const uint8_t *q, const uint16_t *scales,
                               const uint8_t *zeros, const float *bias, int32_t T, int32_t N, int32_t K,
                               dsq_epilogue epi, void *y, float *ws, size_t ws_bytes, int32_t *tickets,
                               int32_t n_tickets, int32_t splits, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif /* DSQ_CUDA_GEMV_QUANT_H */
