/*
 * kernels.h - C-callable launchers of the CUDA backend's dense kernels
 * (everything but attention and the KV cache, which live in attention.h).
 *
 * Conventions:
 *  - Every launcher only enqueues work on `stream`: it never allocates, never
 *    synchronizes and never reads device memory on the host, so a decode step
 *    built from them can be captured as a CUDA graph.
 *  - Each returns DSQ_OK or a dsq_status made with dsq_fail() naming the
 *    kernel and the CUDA error (launch configuration errors are caught with
 *    cudaGetLastError(); faults inside a kernel surface at the next sync).
 *  - Matrices are row-major.  Linear weights are [N out, K in]; the layer
 *    code multiplies only through dsq_cu_linear(), which dispatches on the
 *    weight's dsq_weight format (lib/weight.h); the GEMV and cuBLASLt
 *    launchers below are its BF16 case.  Activations that feed a matrix product are bf16;
 *    everything between products (residual stream, q/k/v, gate/up) is fp32,
 *    so rounding happens only where the tensor cores need it.
 *  - Runtime sizes are mapped to template constants in one switch per family
 *    (GEMV: tokens 1..DSQ_GEMV_MAX_TOKENS); other sizes take a generic path.
 */
#ifndef DSQ_CUDA_KERNELS_H
#define DSQ_CUDA_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#include "internal.h"
#include "weight.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Raw bf16 bits on the host side of the interface (device code reinterprets
 * them as __nv_bfloat16). */
typedef uint16_t dsq_bf16;

/* Map a CUDA runtime error to a dsq_status with a message naming `what`:
 * allocation failures -> DSQ_ERR_DEVICE_OOM, the rest -> DSQ_ERR_DEVICE. */
dsq_status dsq_cu_status(cudaError_t err, const char *what);

/* What a matrix product does with its result y (fp32 unless noted):
 *  STORE     y = x W^T
 *  BIAS      y = x W^T + bias             (bias fp32 [N])
 *  ADD       y = y + x W^T                (residual add, in place)
 *  SILU_MUL  rows of W come in (gate_i, up_i) pairs (row 2i = gate_i,
 *            row 2i+1 = up_i); y is bf16 [T][N/2] = silu(gate) * up.
 *            GEMV only (the GEMM path stores [T][N] and calls dsq_cu_silu_mul). */
typedef enum dsq_epilogue {
    DSQ_EPI_STORE = 0,
    DSQ_EPI_BIAS = 1,
    DSQ_EPI_ADD = 2,
    DSQ_EPI_SILU_MUL = 3
} dsq_epilogue;

/* ---- embed.cu ------------------------------------------------------------ */

/* x[t][:] = (float)table[tokens[t]][:].  table bf16 [V][E], tokens device
 * int32 [T] (already validated by the host), x fp32 [T][E]. */
dsq_status dsq_cu_embed(const dsq_bf16 *table, const int32_t *tokens, int32_t T, int32_t E,
                        float *x, cudaStream_t stream);

/* ---- norm.cu ------------------------------------------------------------- */

/* RMSNorm in fp32, as Hugging Face Qwen2 computes it on fp32 activations:
 * out[t] = bf16( w * (x[r] * rsqrt(mean(x[r]^2) + eps)) ), r = rows ? rows[t] : t.
 * x fp32 [*][E], rows device int32 [T] or NULL (gathers the rows the logits
 * need before the head), w fp32 [E], out bf16 [T][E]. */
dsq_status dsq_cu_rmsnorm(const float *x, const int32_t *rows, int32_t T, int32_t E,
                          const float *w, float eps, dsq_bf16 *out, cudaStream_t stream);

/* ---- rope.cu ------------------------------------------------------------- */

/* Rotary embedding, non-interleaved ("neox": dimension i pairs with i+D/2),
 * fused with the conversion to bf16 that attention takes.  qkv fp32
 * [T][row_stride] (the fused q|k|v product, bias added), head h at columns
 * h*D..h*D+D-1; the first n_rot_heads heads (q then k) are rotated, heads up
 * to n_heads (v) only converted; out bf16 [T][row_stride], same columns.
 * Angles as HF computes them: fp32 ang = (float)pos[t] * inv_freq[i], then
 * cos/sin in fp32 (full-precision sincosf: positions reach thousands of
 * radians).  pos device int32 [T]; inv_freq device fp32 [D/2]; D even. */
dsq_status dsq_cu_rope(const float *qkv, int32_t row_stride, const int32_t *pos, int32_t T,
                       int32_t n_rot_heads, int32_t n_heads, int32_t D, const float *inv_freq,
                       dsq_bf16 *out, cudaStream_t stream);

/* ---- l2_prefetch.cu: weights into L2 ahead of their product --------------- */

/* One byte range of device memory (16-byte aligned start and length). */
#define DSQ_L2P_MAX_RANGES 4
typedef struct dsq_l2p_range {
    const void *p;
    uint64_t bytes;
} dsq_l2p_range;

/* Ask the L2 to fetch up to DSQ_L2P_MAX_RANGES ranges (empty ones skipped)
 * while later kernels on the stream run: a hint, nothing is written.  PDL,
 * triggering before its wait (the exception pdl.cuh describes): the next
 * kernel may launch at once.
 * Enqueue only; capturable.  DSQ_ERR_INTERNAL for a misaligned range. */
dsq_status dsq_cu_l2_prefetch(const dsq_l2p_range *ranges, int32_t n, cudaStream_t stream);

/* ---- elementwise.cu ------------------------------------------------------ */

/* out[t][i] = bf16( silu(gu[t][2i]) * gu[t][2i+1] ), silu(g) = g / (1 + e^-g),
 * in fp32.  gu fp32 [T][2F] with gate/up interleaved by row pairs (the
 * layout of the fused gate/up weight), out bf16 [T][F]. */
dsq_status dsq_cu_silu_mul(const float *gu, int32_t T, int32_t F, dsq_bf16 *out,
                           cudaStream_t stream);
/* The same from a bf16 product (dsq_gemm_run_bf16): gu bf16 [T][2F] (4-byte
 * aligned), silu(g) * u in fp32 on the bf16 values. */
dsq_status dsq_cu_silu_mul_bf16(const dsq_bf16 *gu, int32_t T, int32_t F, dsq_bf16 *out, cudaStream_t stream);

/* y = epi(acc * scales): acc fp32 [T][N] (a product on Q8_ROW codes),
 * scales fp32 [N]; STORE / BIAS (bias fp32 [N]) / ADD into fp32 y [T][N],
 * SILU_MUL into bf16 y [T][N/2] (gate/up interleaved as dsq_cu_silu_mul).
 * acc may not be y.  Stream-ordered; DSQ_ERR_INTERNAL on bad arguments. */
dsq_status dsq_cu_scale_epilogue(const float *acc, const float *scales, const float *bias, int32_t T, int32_t N,
                                 dsq_epilogue epi, void *y, cudaStream_t stream);

/* y[i] += x[i] for n fp32 values: the residual add after a product, when
 * it is not fused into the product's epilogue (cu_ctx.resid_after; a
 * tensor-parallel split adds only after the all-reduce). */
dsq_status dsq_cu_add(float *y, const float *x, int64_t n, cudaStream_t stream);

/* out[i] = bf16(x[i]) for n fp32 values. */
dsq_status dsq_cu_f32_to_bf16(const float *x, int64_t n, dsq_bf16 *out, cudaStream_t stream);

/* ---- finite_check.cu ------------------------------------------------------ */

/* Set *flag (device uint32, not cleared here) to 1 if any value of a
 * [rows][cols] region whose rows are `pitch` elements apart is NaN or +-Inf.
 * elem_bytes 2: bf16, 4: fp32.  Used once per weight tensor at load. */
dsq_status dsq_cu_flag_nonfinite(const void *p, int elem_bytes, int64_t rows, int64_t cols,
                                 int64_t pitch, uint32_t *flag, cudaStream_t stream);

/* ---- gemv.cu: few rows, bandwidth bound ------------------------------------ */

/* The GEMV kernel is specialised for 1..DSQ_GEMV_MAX_TOKENS rows of x. */
#define DSQ_GEMV_MAX_TOKENS 8

/* y = epilogue(x W^T) for T <= DSQ_GEMV_MAX_TOKENS: x bf16 [T][K], W bf16
 * [N][K], y as dsq_epilogue says.  Every weight byte is read once with
 * 16-byte streaming loads (when K % 8 == 0 and the pointers are 16-byte
 * aligned; a scalar path covers the rest), x stays in L1.  N must be even
 * for SILU_MUL. */
dsq_status dsq_cu_gemv(const dsq_bf16 *x, const dsq_bf16 *w, const float *bias, int32_t T,
                       int32_t N, int32_t K, dsq_epilogue epi, void *y, cudaStream_t stream);

/* The same with an explicit block shape (for tuning and tests): nt threads
 * per block (64, 128, 256), r rows per block (2, 4, or 8 for T <= 2);
 * nt = r = 0 picks the default for (T, K). */
dsq_status dsq_cu_gemv_cfg(const dsq_bf16 *x, const dsq_bf16 *w, const float *bias, int32_t T,
                           int32_t N, int32_t K, dsq_epilogue epi, void *y, int nt, int r,
                           cudaStream_t stream);

/* The same with the RMSNorm that makes x folded in (batch-1 decode: one
 * launch instead of two, and the weight stream starts before the norm):
 * x[t] = bf16(nw * (xr[r] * rsqrt(mean(xr[r]^2) + eps))), r = rows ? rows[t]
 * : t, computed in each block (the arithmetic of dsq_cu_rmsnorm, with the
 * block's own summation order).  xr fp32 [*][K], rows device int32 [T] or
 * NULL, nw fp32 [K].  Only where dsq_cu_gemv_norm_ok(); nt = r = 0 picks
 * the default block shape. */
#define DSQ_GEMV_NORM_MAX_TOKENS 4
#define DSQ_GEMV_NORM_MAX_SMEM (40 * 1024) /* T*K bf16 in shared memory */
int dsq_cu_gemv_norm_ok(int32_t T, int32_t K, const void *xr, const float *nw, const dsq_bf16 *w);
dsq_status dsq_cu_gemv_norm_cfg(const float *xr, const int32_t *rows, const float *nw, float eps,
                                const dsq_bf16 *w, const float *bias, int32_t T, int32_t N, int32_t K,
                                dsq_epilogue epi, void *y, int nt, int r, cudaStream_t stream);

/* ---- gemv_mma.cu: 2..8 rows on the tensor cores ----------------------------- */

/* The same products as dsq_cu_gemv / dsq_cu_gemv_norm_cfg through
 * mma.sync (bf16 in, fp32 accumulate; sm_80 and later), for T <= 8 rows
 * where dsq_cu_gemv_mma_ok(T, K, x or xr, w): K % 32 == 0, 16-byte aligned
 * data.  The norm variant also needs T*(K+32)*2 <= DSQ_GEMV_NORM_MAX_SMEM.
 * nt: threads per block (multiple of 32, <= 256), 0 = default. */
int dsq_cu_gemv_mma_ok(int32_t T, int32_t K, const void *x, const dsq_bf16 *w);
dsq_status dsq_cu_gemv_mma(const dsq_bf16 *x, const dsq_bf16 *w, const float *bias, int32_t T, int32_t N,
                           int32_t K, dsq_epilogue epi, void *y, int nt, cudaStream_t stream);
dsq_status dsq_cu_gemv_mma_norm(const float *xr, const int32_t *rows, const float *nw, float eps,
                                const dsq_bf16 *w, const float *bias, int32_t T, int32_t N, int32_t K,
                                dsq_epilogue epi, void *y, int nt, cudaStream_t stream);

/* ---- gemm_rows.cu: up to 64 rows on the tensor cores, weights read once ------ */

/* y = epilogue(x W^T) for 1..DSQ_GEMM_ROWS_MAX rows (the batched decode
 * step's products): x bf16 [T][K], W bf16 [N][K], y as dsq_epilogue says
 * (SILU_MUL: gate/up interleaved rows, N even).  Only where
 * dsq_cu_gemm_rows_ok(): K a multiple of 128, 16-byte aligned x and W.
 * Products with few 64-row tiles split K over `splits` blocks (0: the
 * kernel's plan; clamped to K/128 and to the workspace): the partials go to
 * ws (fp32, >= dsq_cu_gemm_rows_ws_floats(T, N, splits) floats) and one
 * ticket per tile (tickets [>= ceil(N/64)], zero before the first call;
 * every call leaves them zero) picks the block that sums them in a fixed
 * order; without ws / tickets one split.  Same stream rules as the GEMVs
 * (PDL); no host synchronisation, capturable. */
#define DSQ_GEMM_ROWS_MAX 64
/* Per-device setup of the products' Hopper kernel (gemm_rows_wg.cu: a probe
 * of whether the device runs this build's sm_90a code, and its kernels'
 * shared-memory limits); call it outside any stream capture before the
 * first product on the device (the backend does at context creation).
 * Thread-safe, once per device. */
dsq_status dsq_cu_gemm_rows_init(void);
/* 1 where a T-row product of dsq_cu_gemm_rows / _q8 / _q4 runs the Hopper
 * kernel (gemm_rows_wg.cu) on the current device: sm_90a code and the
 * knob DSQ_CUDA_ROWS_WG (read per call; 0 never, 1 (the default) from 32
 * rows, 2 every T); 0 where gemm_rows.cu's mma.sync kernel. */
int dsq_cu_gemm_rows_wg(int32_t T);
int dsq_cu_gemm_rows_ok(int32_t T, int32_t K, const void *x, const dsq_bf16 *w);
size_t dsq_cu_gemm_rows_ws_floats(int32_t T, int32_t N, int32_t splits);
dsq_status dsq_cu_gemm_rows(const dsq_bf16 *x, const dsq_bf16 *w, const float *bias, int32_t T, int32_t N,
                            int32_t K, dsq_epilogue epi, void *y, float *ws, size_t ws_bytes, int32_t *tickets,
                            int32_t n_tickets, int32_t splits, cudaStream_t stream);

/* ---- gemm.cu: many rows, cuBLASLt ------------------------------------------- */

/* A cuBLASLt handle, its workspace and a cache of chosen algorithms (so the
 * steady state runs no heuristic query and allocates nothing).  One per
 * context: it is used from one thread at a time. */
typedef struct dsq_gemm dsq_gemm;

/* Create the handle and a device workspace of `workspace_bytes` on the
 * current device.  DSQ_ERR_DEVICE_OOM / DSQ_ERR_DEVICE / DSQ_ERR_OUT_OF_MEMORY. */
dsq_status dsq_gemm_create(size_t workspace_bytes, dsq_gemm **out);
void dsq_gemm_destroy(dsq_gemm *g);
/* Device bytes held (the workspace). */
size_t dsq_gemm_device_bytes(const dsq_gemm *g);

/* y = epilogue(x W^T) with bf16 operands, fp32 accumulation and fp32 y
 * [T][N] (STORE, BIAS, ADD; not SILU_MUL).  x bf16 [T][K], W bf16 [N][K]. */
dsq_status dsq_gemm_run(dsq_gemm *g, const dsq_bf16 *x, const dsq_bf16 *w, const float *bias,
                        int32_t T, int32_t N, int32_t K, dsq_epilogue epi, float *y,
                        cudaStream_t stream);
/* y = x W^T rounded to bf16: y bf16 [T][N] (fp32 accumulation; the gate/up
 * product of a prompt, half the bytes of fp32 for dsq_cu_silu_mul_bf16). */
dsq_status dsq_gemm_run_bf16(dsq_gemm *g, const dsq_bf16 *x, const dsq_bf16 *w, int32_t T, int32_t N, int32_t K,
                             dsq_bf16 *y, cudaStream_t stream);

/* Tuning (gemm.cu's top comment): with `on` (1), untuned plans of at most
 * max_rows rows (<= 0: 256) used while the stream is capturing a graph are
 * marked pending, with the operands of that call (x, W and bias must stay
 * valid until dsq_gemm_tune_pending).  on = 2: also plans used outside a
 * capture, timed inside that dsq_gemm_run call before its product (which
 * then synchronizes the stream and allocates the timing buffers). */
void dsq_gemm_set_tune(dsq_gemm *g, int on, int32_t max_rows);
/* Outside any capture: time the heuristic's candidates (up to 16, and
 * split-K variants of its first 8 that cuBLASLt accepts for the problem
 * and the workspace) for every pending plan and keep the fastest.  Writes
 * only buffers of its own (the recorded y is never touched; x, W, bias are
 * read), allocates them for the call and synchronizes on `stream` after
 * each timed run.  *n_tuned plans
 * were timed, *n_changed got a different algorithm than the one they were
 * made with (a graph captured with them should be captured again).  On an
 * error (out of device memory for its buffers: DSQ_ERR_DEVICE_OOM) the
 * plans keep the heuristic's choice and are no longer pending (nor timed
 * again).  Plans pending and `stream` being captured: DSQ_ERR_INTERNAL,
 * nothing done.  Plans used by a capture but made before it (eagerly)
 * become pending too; in mode 1 plans made and used outside captures
 * never do. */
dsq_status dsq_gemm_tune_pending(dsq_gemm *g, cudaStream_t stream, int32_t *n_tuned, int32_t *n_changed);

/* ---- linear.cu: the one product the layers call -------------------------------- */

/* What a product may use besides its operands. */
typedef struct dsq_cu_linear_env {
    dsq_gemm *gemm;      /* the context's cuBLASLt handle */
    float *gu_scratch;   /* fp32 [T][N]: SILU_MUL on the cuBLASLt path, and the
                            Q8_ROW codes product of the tile path (any epilogue) */
    int64_t gu_scratch_elems; /* its size in floats (0: unknown; the Q8 codes path then
                                 declines it, SILU_MUL trusts it) */
    int32_t gu_f32;      /* bf16 SILU_MUL on the cuBLASLt path: 1 = the gate/up
                            product in fp32, else rounded to bf16 (half the
                            bytes; DSQ_CUDA_GU_F32=1 is the measurement knob) */
    int32_t gemv_max;    /* T <= this: GEMV, else cuBLASLt (but long_min below) */
    int32_t mma_min;     /* bf16 GEMV with mma_min <= T: on the tensor cores
                            (gemv_mma.cu) where it applies; 0: never */
    int32_t long_min;    /* bf16 products with K > 4,096 (down) of long_min..gemv_max
                            rows take the path of more rows, not the FMA GEMV
                            (linear.cu); 0: never */
    int32_t mma_norm;    /* bf16 products on the tensor-core GEMV of at most this
                            many 16-row tiles take the RMSNorm folded in
                            (dsq_cu_gemv_mma_norm: qkv, 128 tiles) instead of
                            the norm's own kernel; 0: never */
    cudaStream_t stream;
    /* quantized weights (Q8_ROW / Q4_G128) with T > DSQ_QGEMV_MAX: the
     * matrix dequantized to bf16 here, then the cuBLASLt path; NULL or too
     * small: the quantized GEMV over groups of DSQ_QGEMV_MAX rows */
    dsq_bf16 *wq_tile;
    int64_t wq_tile_elems;
    /* RMSNorm before the product (norm_w NULL: none; x is the input as
     * given).  With norm_w, x (bf16 [T][cols], written here) becomes
     * dsq_cu_rmsnorm(norm_x, norm_rows, T, cols, norm_w, norm_eps), or the
     * norm is folded into the GEMV (dsq_cu_gemv_norm_cfg: bf16 weights,
     * T <= gemv_max and T <= norm_fuse, not the tensor-core GEMV,
     * dsq_cu_gemv_norm_ok; or dsq_cu_gemv_mma_norm: the tensor-core GEMV
     * of at most mma_norm tiles, not the ADD epilogue; quantized weights:
     * dsq_cu_gemv_mma_q4_norm / _q8_norm where qmma_norm says, else the
     * quantized FMA GEMVs' folds at 1-2 rows) and x is not written. */
    const float *norm_x;     /* fp32 residual rows [*][cols] */
    const int32_t *norm_rows; /* device int32 [T] or NULL */
    const float *norm_w;     /* fp32 [cols] */
    float norm_eps;
    int32_t norm_fuse;        /* fold the norm into bf16 GEMVs of at most this many rows, into the quantized
                               * GEMVs where non-zero (0: never; a measurement knob) */
    /* bf16 products of gemv_max < T <= rows_max rows through gemm_rows.cu
     * (0: never; DSQ_CUDA_GEMM_ROWS) with this split-K workspace */
    int32_t rows_max;
    /* > 0: bf16 products of rows_min..rows_max rows through gemm_rows.cu
     * even where the GEMV would take them (DSQ_CUDA_GEMM_ROWS_MIN) */
    int32_t rows_min;
    /* Q8_ROW / Q4_G128 products of T <= qrows_max rows through gemm_rows.cu
     * (0: never; DSQ_CUDA_QROWS), Q8_ROW only from qrows_q8_min rows,
     * Q4_G128 ones that dsq_cu_gemv_q4_pdl_use gives the GEMV (qkv, o,
     * down) only from qrows_q4_min rows, with the same workspace */
    int32_t qrows_max;
    int32_t qrows_q8_min;
    int32_t qrows_q4_min;
    /* Q4_G128 (Q8_ROW) products of T <= qmma_q4_max (qmma_q8_max) rows on
     * the quantized tensor-core GEMV (gemv_mma_quant.cu), ahead of the
     * paths above, where K <= 4,096 or T >= qmma_q4_long (qmma_q8_long):
     * down's K = 8,960 from that many rows (0: never); 0: never */
    int32_t qmma_q4_max;
    int32_t qmma_q8_max;
    int32_t qmma_q4_long;
    int32_t qmma_q8_long;
    /* with norm_w: such products of at most this many 16-row tiles take the
     * RMSNorm folded in (dsq_cu_gemv_mma_q4_norm / _q8_norm: qkv's 128),
     * ahead of the quantized GEMVs' folds; 0: never */
    int32_t qmma_norm;
    /* quantized products through the dequantization tile: 1 = the
     * weights rounded to bf16 (DSQ_CUDA_QTILE=1), else exact: Q8_ROW's
     * codes (exact in bf16) and the row scales in dsq_cu_scale_epilogue
     * where gu_scratch holds [T][N], otherwise (and Q4_G128) two bf16
     * parts whose products add up to the exact weights' */
    int32_t qtile_parts;
    float *rows_ws;
    size_t rows_ws_bytes;
    int32_t *rows_tickets;    /* [rows_n_tickets], zero between products */
    int32_t rows_n_tickets;
} dsq_cu_linear_env;

/* Most rows the quantized GEMV kernels take (cuda/gemv_quant.h). */
#define DSQ_QGEMV_MAX 8

/* y = epilogue(x W^T) for x bf16 [T][W->cols], W a device dsq_weight of
 * W->rows outputs, y as dsq_epilogue says (SILU_MUL needs layout
 * DSQ_WL_GATE_UP).  Picks the kernel by format and by T: BF16 (GEMV or
 * cuBLASLt by gemv_max, mma_min and long rows: env above), Q8_ROW and Q4_G128 (cuda/gemv_quant.h: GEMV for T
 * <= DSQ_QGEMV_MAX, else dequantize into env->wq_tile + cuBLASLt, or GEMV
 * in groups of DSQ_QGEMV_MAX rows without a tile).  F32 / F16 weights are
 * converted to BF16 at upload; any other format answers
 * DSQ_ERR_UNSUPPORTED naming it. */
dsq_status dsq_cu_linear(const dsq_weight *W, const dsq_bf16 *x, const float *bias, int32_t T,
                         dsq_epilogue epi, void *y, const dsq_cu_linear_env *env);

/* ---- device_once.cu: per-device setup -------------------------------------------- */

#define DSQ_CU_MAX_DEVICES 64

/* Work done once per device (kernel attributes are per device: raising a
 * kernel's shared-memory limit on one GPU does not raise it on another). */
typedef struct dsq_cu_once {
    unsigned char done[DSQ_CU_MAX_DEVICES]; /* read with acquire loads; static storage (zeroed) */
} dsq_cu_once;

/* Run fn(device) for the current device unless it succeeded there before;
 * thread-safe (a failure is retried by the next call).  *device (may be
 * NULL) receives the current device.  cudaErrorInvalidDevice for a device
 * index >= DSQ_CU_MAX_DEVICES. */
cudaError_t dsq_cu_once_per_device(dsq_cu_once *o, cudaError_t (*fn)(int device), int *device);

/* ---- sampling.cu: dsq_step() post-processing --------------------------------- */

/* Post-process n_rows logits rows (fp32 [n_rows][V], modified: penalties are
 * applied in place) with rows[r] (device copy of dsq_samp_row) into
 * results[r] (device): log-probs / top-n of the raw row, penalties from
 * ring (int32 [seqs][R]: token at position p of sequence s at s*R + p % R),
 * greedy or temperature / top-k / top-p / min-p and the Philox draw, as
 * lib/sample_cpu.c.  One 1024-thread CTA per row (~157 KB of shared memory),
 * or on sm_90 a cluster of 2..16 such CTAs per row when the rows are few
 * (env DSQ_SAMPLE_CLUSTER = 0 | 1 | 2 | 4 | 8 | 16 | auto, see sampling.cu).
 * V <= 262143 (DSQ_ERR_UNSUPPORTED above). */
dsq_status dsq_cu_sample(float *logits, int32_t n_rows, int32_t V, const dsq_samp_row *rows,
                         const int32_t *ring, int32_t R, dsq_samp_result *results,
                         cudaStream_t stream);

/* ring[sid[tseq[t]] * R + pos[t] % R] = tok[t] for t < T (device arrays of a
 * forward pass's metadata): keeps the device token history current. */
dsq_status dsq_cu_hist_scatter(int32_t *ring, int32_t R, const int32_t *tok, const int32_t *pos,
                               const int32_t *tseq, const int32_t *sid, int32_t T,
                               cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif /* DSQ_CUDA_KERNELS_H */
