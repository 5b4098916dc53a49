/* linear.cu - dsq_cu_linear: the product every layer op calls, dispatching
 * on the weight's format (lib/weight.h) and on the number of rows. */
#include "gemv_quant.h"
#include "kernels.h"

/* The tensor-core GEMV for this product: mma_min <= T rows, and short
 * rows only -- with K = 8960 (down) the 96 tiles of 16 rows leave the
 * H200's 132 SMs short of loads in flight (19.4 us vs 17.0 for the FMA
 * GEMV at 8 rows; qkv 4.8 vs 6.3, o 4.1 vs 6.0: test_cuda_kernels).
 * (Splitting those tiles' K over clusters of 2-8 CTAs, stop 41, tag
 * mmasplit-stop41: down at 8 rows 17.3 us at best against cuBLASLt's 15.2,
 * the batch-8 step unchanged.) */
static int use_mma(const dsq_cu_linear_env *env, int32_t T, int32_t K)
{
    return env->mma_min > 0 && T >= env->mma_min && K <= 4096;
}

/* DSQ_CUDA_GEMM_ROWS_MIN (rows_min > 0): products of rows_min..rows_max
 * rows go to gemm_rows.cu ahead of the GEMVs (a measurement knob). */
static int rows_from_min(const dsq_cu_linear_env *env, int32_t T)
{
    return env->rows_min > 0 && T >= env->rows_min && T <= env->rows_max;
}

/* bf16 products of long rows (K > 4,096: down of the 1.5B model; any
 * product of a model wider than 4,096) from this many rows up to the
 * GEMV's limit take the path of more rows (gemm_rows.cu where rows_max
 * allows, else cuBLASLt), not the FMA GEMV: from 4-5 rows the FMA
 * GEMV is issue-bound (down at 8 rows 19.1 us, cuBLASLt 15.2, H100) and
 * the tensor-core GEMV has too few tiles.  H100, `dsqwen bench` @ 512
 * (stop 41), ms per step against the FMA GEMV: batch 8 2.070 / 2.030 vs
 * 2.221 / 2.214, 6 2.064 vs 2.149, 5 2.051 vs 2.079, 4 (with the MMA
 * GEMV from 4 rows) 1.980 / 1.979 vs 1.999 / 2.010, batch 8 @ 8,192 2.779
 * vs 2.971; at 3 rows equal, at 2 slower (1.922 vs 1.821).
 * The row count is env->long_min (DSQ_CUDA_GEMV_LONG_MIN, backend_memory.cu). */
static int long_rows(const dsq_cu_linear_env *env, int32_t T, int32_t K)
{
    return K > 4096 && env->long_min > 0 && T >= env->long_min;
}

static dsq_status linear_bf16(const dsq_weight *W, const dsq_bf16 *x, const float *bias, int32_t T,
                              dsq_epilogue epi, void *y, const dsq_cu_linear_env *env)
{
    const dsq_bf16 *w = (const dsq_bf16 *)W->data;
    const int32_t N = (int32_t)W->rows, K = (int32_t)W->cols;
    if (rows_from_min(env, T) && dsq_cu_gemm_rows_ok(T, K, x, w))
        return dsq_cu_gemm_rows(x, w, bias, T, N, K, epi, y, env->rows_ws, env->rows_ws_bytes, env->rows_tickets,
                                env->rows_n_tickets, 0, env->stream);
    if (T <= env->gemv_max) {
        if (use_mma(env, T, K) && dsq_cu_gemv_mma_ok(T, K, x, w))
            return dsq_cu_gemv_mma(x, w, bias, T, N, K, epi, y, 0, env->stream);
        if (!(long_rows(env, T, K) && epi != DSQ_EPI_SILU_MUL))
            return dsq_cu_gemv(x, w, bias, T, N, K, epi, y, env->stream);
    }
    if (T <= env->rows_max && dsq_cu_gemm_rows_ok(T, K, x, w))
        return dsq_cu_gemm_rows(x, w, bias, T, N, K, epi, y, env->rows_ws, env->rows_ws_bytes, env->rows_tickets,
                                env->rows_n_tickets, 0, env->stream);
    if (epi == DSQ_EPI_SILU_MUL && !env->gu_f32) {
        /* the product rounded to bf16 (the values a bf16 model's gate/up
         * projections give): SiLU*mul streams half the bytes */
        dsq_bf16 *gu = (dsq_bf16 *)env->gu_scratch;
        dsq_status st = dsq_gemm_run_bf16(env->gemm, x, w, T, N, K, gu, env->stream);
        if (st != DSQ_OK)
            return st;
        return dsq_cu_silu_mul_bf16(gu, T, N / 2, (dsq_bf16 *)y, env->stream);
    }
    if (epi == DSQ_EPI_SILU_MUL) {
        dsq_status st = dsq_gemm_run(env->gemm, x, w, NULL, T, N, K, DSQ_EPI_STORE, env->gu_scratch, env->stream);
        if (st != DSQ_OK)
            return st;
        return dsq_cu_silu_mul(env->gu_scratch, T, N / 2, (dsq_bf16 *)y, env->stream);
    }
    return dsq_gemm_run(env->gemm, x, w, bias, T, N, K, epi, (float *)y, env->stream);
}

/* One quantized GEMV over rows [t0, t0 + n) of x and y. */
static dsq_status qgemv(const dsq_weight *W, const dsq_bf16 *x, const float *bias, int32_t n,
                        dsq_epilogue epi, void *y, cudaStream_t s)
{
    const int32_t N = (int32_t)W->rows, K = (int32_t)W->cols;
    if (W->format == DSQ_WF_Q8_ROW)
        return dsq_cu_gemv_q8(x, (const int8_t *)W->data, (const float *)W->scales, bias, n, N, K, epi, y, s);
    return dsq_cu_gemv_q4(x, (const uint8_t *)W->data, (const uint16_t *)W->scales, (const uint8_t *)W->zeros,
                          bias, n, N, K, epi, y, s);
}

/* Part `part` of W (0: bf16(w), 1: bf16(w - bf16(w)); 2, Q8_ROW only: the
 * codes themselves) into the context's dequantization tile. */
static dsq_status dequant_part(const dsq_weight *W, int part, const dsq_cu_linear_env *env)
{
    const int32_t N = (int32_t)W->rows, K = (int32_t)W->cols;
    return W->format == DSQ_WF_Q8_ROW
               ? dsq_cu_dequant_q8_bf16((const int8_t *)W->data, (const float *)W->scales, K, 0, N, part,
                                        env->wq_tile, env->stream)
               : dsq_cu_dequant_q4_bf16((const uint8_t *)W->data, (const uint16_t *)W->scales,
                                        (const uint8_t *)W->zeros, K, 0, N, part, env->wq_tile, env->stream);
}

/* Whether linear_quant sends this product to gemm_rows.cu: Q4_G128 ones
 * of fewer than qrows_q4_min rows only where gemv.cu's 4-bit GEMV would
 * not take them (gate/up, the head: dsq_cu_gemv_q4_pdl_use) */
static int quant_rows_path(const dsq_weight *W, const dsq_bf16 *x, int32_t T, const dsq_cu_linear_env *env)
{
    const int q4_gemv = W->format == DSQ_WF_Q4_G128 && T < env->qrows_q4_min &&
                        dsq_cu_gemv_q4_pdl_use(T, (int32_t)W->rows, (int32_t)W->cols, x, (const uint8_t *)W->data);
    const int rows_ok = T <= env->qrows_max && (W->format != DSQ_WF_Q8_ROW || T >= env->qrows_q8_min) && !q4_gemv;
    return rows_ok && dsq_cu_gemm_rows_q_ok(T, (int32_t)W->cols, x, W->data);
}

/* Whether linear_quant sends this product to the quantized GEMV */
static int quant_gemv_path(const dsq_weight *W, const dsq_bf16 *x, int32_t T, const dsq_cu_linear_env *env)
{
    return T <= DSQ_QGEMV_MAX && !quant_rows_path(W, x, T, env);
}

/* Whether a Q4_G128 / Q8_ROW product of T rows belongs on gemv_mma_quant.cu
 * (env qmma_*: up to qmma_q4_max / _q8_max rows; K > 4,096, i.e. down, from
 * qmma_q4_long / _q8_long rows); the kernel's own _ok checks come on top */
static int qmma_path(const dsq_weight *W, int32_t T, const dsq_cu_linear_env *env)
{
    const int q4 = W->format == DSQ_WF_Q4_G128;
    if (!q4 && W->format != DSQ_WF_Q8_ROW)
        return 0;
    const int32_t max = q4 ? env->qmma_q4_max : env->qmma_q8_max, from = q4 ? env->qmma_q4_long : env->qmma_q8_long;
    return T <= max && (W->cols <= 4096 || (from > 0 && T >= from));
}

/* Q8_ROW / Q4_G128: with qrows_max (DSQ_CUDA_QROWS), up to that many rows
 * (Q8_ROW from qrows_q8_min) on the tensor cores with the codes converted
 * in registers (gemm_rows.cu);
 * otherwise GEMV (dequantizing in registers) for a few rows; for
 * more, the whole matrix into the context's bf16 tile and cuBLASLt:
 * Q8_ROW's codes (exact in bf16) with the row scales in
 * dsq_cu_scale_epilogue where gu_scratch holds [T][N], else two parts
 * whose products add up to the exact weights' (DSQ_CUDA_QTILE=1: one part,
 * the weights rounded to bf16); without a tile big enough (the 1.5B
 * model's head; a small vocabulary's head fits) or, for SwiGLU, without
 * the scratch, GEMV in groups of rows. */
static dsq_status linear_quant(const dsq_weight *W, const dsq_bf16 *x, const float *bias, int32_t T,
                               dsq_epilogue epi, void *y, const dsq_cu_linear_env *env)
{
    const int32_t N = (int32_t)W->rows, K = (int32_t)W->cols;
    /* products of few rows on gemv_mma_quant.cu (env qmma_*: 1-8 rows,
     * down from 1 (4-bit) or 2 (INT8) rows), ahead of gemm_rows.cu and the quantized GEMVs
     * (not qkv where dsq_cu_linear folded its RMSNorm into the GEMV) */
    const int qmma = qmma_path(W, T, env);
    if (qmma && W->format == DSQ_WF_Q4_G128 && dsq_cu_gemv_mma_q4_ok(T, K, x, (const uint8_t *)W->data))
        return dsq_cu_gemv_mma_q4(x, (const uint8_t *)W->data, (const uint16_t *)W->scales,
                                  (const uint8_t *)W->zeros, bias, T, N, K, epi, y, 0, env->stream);
    if (qmma && W->format == DSQ_WF_Q8_ROW && dsq_cu_gemv_mma_q8_ok(T, K, x, (const int8_t *)W->data))
        return dsq_cu_gemv_mma_q8(x, (const int8_t *)W->data, (const float *)W->scales, bias, T, N, K, epi, y, 0,
                                  env->stream);
    if (quant_rows_path(W, x, T, env)) {
        if (W->format == DSQ_WF_Q8_ROW)
            return dsq_cu_gemm_rows_q8(x, (const int8_t *)W->data, (const float *)W->scales, bias, T, N, K, epi, y,
                                       env->rows_ws, env->rows_ws_bytes, env->rows_tickets, env->rows_n_tickets, 0,
                                       env->stream);
        return dsq_cu_gemm_rows_q4(x, (const uint8_t *)W->data, (const uint16_t *)W->scales,
                                   (const uint8_t *)W->zeros, bias, T, N, K, epi, y, env->rows_ws, env->rows_ws_bytes,
                                   env->rows_tickets, env->rows_n_tickets, 0, env->stream);
    }
    /* SwiGLU through the tile needs [T][N] fp32 of scratch (either path) */
    const int silu_fits = epi != DSQ_EPI_SILU_MUL ||
                          (env->gu_scratch && (env->gu_scratch_elems == 0 || (int64_t)T * N <= env->gu_scratch_elems));
    if (T > DSQ_QGEMV_MAX && env->wq_tile && (int64_t)N * K <= env->wq_tile_elems && silu_fits) {
        if (env->qtile_parts == 1) { /* DSQ_CUDA_QTILE=1: the weights rounded to bf16, one product */
            dsq_status st = dequant_part(W, 0, env);
            if (st != DSQ_OK)
                return st;
            dsq_weight d = *W;
            d.format = DSQ_WF_BF16;
            d.data = env->wq_tile;
            d.scales = d.zeros = NULL;
            dsq_cu_linear_env e = *env;
            e.norm_w = NULL; /* made by dsq_cu_linear already */
            e.gemv_max = 0; /* T > 8 here: cuBLASLt */
            e.rows_max = 0; /* gemm_rows.cu loads W before its PDL wait: never a tile the kernel before wrote */
            return linear_bf16(&d, x, bias, T, epi, y, &e);
        }
        const int silu = epi == DSQ_EPI_SILU_MUL;
        if (W->format == DSQ_WF_Q8_ROW && env->gu_scratch && (int64_t)T * N <= env->gu_scratch_elems) {
            /* Q8_ROW: the codes are exact in bf16 and the row scale is
             * common to a row's products, so one product on the codes and
             * the scales in the epilogue give the exact weights' result
             * at about one part's cost (512-token INT8 prompt on an H100:
             * two parts 28.8k tok/s, codes 72.7k, one rounded part 81.5k;
             * docs/performance.md, stop 27) */
            dsq_status st = dequant_part(W, 2, env);
            if (st == DSQ_OK)
                st = dsq_gemm_run(env->gemm, x, env->wq_tile, NULL, T, N, K, DSQ_EPI_STORE, env->gu_scratch,
                                  env->stream);
            if (st == DSQ_OK)
                st = dsq_cu_scale_epilogue(env->gu_scratch, (const float *)W->scales, bias, T, N, epi, y,
                                           env->stream);
            return st;
        }
        /* The exact weights as two bf16 parts (hi = bf16(w), lo = bf16(w -
         * hi)), one tile reused: x hi^T, then + x lo^T (cuBLASLt's beta = 1),
         * then the epilogue.  A single bf16-rounded copy moved the full-size
         * 4-bit model's logits 9.7e-3 from fp32 (argmax 96.4%); rounding
         * activations alone moves them 5.8e-3 (98.1%): docs/numerics.md,
         * "Stop 26". */
        float *acc = silu ? env->gu_scratch : (float *)y; /* fp32 [T][N] */
        const dsq_epilogue e0 = silu ? DSQ_EPI_STORE : epi;
        for (int part = 0; part < 2; part++) {
            dsq_status st = dequant_part(W, part, env);
            if (st == DSQ_OK)
                st = dsq_gemm_run(env->gemm, x, env->wq_tile, part == 0 && e0 == DSQ_EPI_BIAS ? bias : NULL, T, N,
                                  K, part == 0 ? e0 : DSQ_EPI_ADD, acc, env->stream);
            if (st != DSQ_OK)
                return st;
        }
        return silu ? dsq_cu_silu_mul(env->gu_scratch, T, N / 2, (dsq_bf16 *)y, env->stream) : DSQ_OK;
    }
    /* y row width: SILU_MUL writes N/2 bf16, the others N fp32 */
    const size_t y_row = epi == DSQ_EPI_SILU_MUL ? (size_t)(N / 2) * sizeof(dsq_bf16) : (size_t)N * sizeof(float);
    for (int32_t t0 = 0; t0 < T; t0 += DSQ_QGEMV_MAX) {
        const int32_t n = T - t0 < DSQ_QGEMV_MAX ? T - t0 : DSQ_QGEMV_MAX;
        dsq_status st = qgemv(W, x + (size_t)t0 * K, bias, n, epi, (char *)y + (size_t)t0 * y_row, env->stream);
        if (st != DSQ_OK)
            return st;
    }
    return DSQ_OK;
}

extern "C" dsq_status dsq_cu_linear(const dsq_weight *W, const dsq_bf16 *x, const float *bias, int32_t T,
                                    dsq_epilogue epi, void *y, const dsq_cu_linear_env *env)
{
    if ((epi == DSQ_EPI_SILU_MUL) != (W->layout == DSQ_WL_GATE_UP))
        return dsq_fail(DSQ_ERR_INTERNAL, "CUDA linear: the SwiGLU epilogue needs a gate/up interleaved "
                        "weight and only it (layout %d)", (int)W->layout);
    if (env->norm_w) {
        const int32_t K = (int32_t)W->cols;
        const dsq_bf16 *w = (const dsq_bf16 *)W->data;
        /* folded into the FMA GEMV (1 row by default: from 2 rows its
         * every-block norm made the step slower, stop 41); the tensor-core
         * GEMV's norm variant (dsq_cu_gemv_mma_norm) was slower than rmsnorm
         * + MMA on the H200 at 8 rows (12.6 vs ~7 us, qkv shape, its norm
         * then T rounds of loads and two barriers); with its norm a warp per
         * row it is faster (stop 43) and runs where mma_norm says (below) */
        if (W->format == DSQ_WF_BF16 && T <= env->gemv_max && T <= env->norm_fuse && !use_mma(env, T, K) &&
            !(rows_from_min(env, T) && dsq_cu_gemm_rows_ok(T, K, x, w))) {
            if (dsq_cu_gemv_norm_ok(T, K, env->norm_x, env->norm_w, w)) {
                return dsq_cu_gemv_norm_cfg(env->norm_x, env->norm_rows, env->norm_w, env->norm_eps, w, bias, T,
                                            (int32_t)W->rows, K, epi, y, 0, 0, env->stream);
            }
        }
        /* quantized products on gemv_mma_quant.cu of few tiles (qmma_norm:
         * qkv): each block computes the T norms */
        if (env->qmma_norm > 0 && env->norm_fuse && epi != DSQ_EPI_ADD && (W->rows + 15) / 16 <= env->qmma_norm &&
            qmma_path(W, T, env)) {
            if (W->format == DSQ_WF_Q4_G128 &&
                dsq_cu_gemv_mma_q4_norm_ok(T, K, env->norm_x, env->norm_w, (const uint8_t *)W->data))
                return dsq_cu_gemv_mma_q4_norm(env->norm_x, env->norm_rows, env->norm_w, env->norm_eps,
                                               (const uint8_t *)W->data, (const uint16_t *)W->scales,
                                               (const uint8_t *)W->zeros, bias, T, (int32_t)W->rows, K, epi, y, 0,
                                               env->stream);
            if (W->format == DSQ_WF_Q8_ROW &&
                dsq_cu_gemv_mma_q8_norm_ok(T, K, env->norm_x, env->norm_w, (const int8_t *)W->data))
                return dsq_cu_gemv_mma_q8_norm(env->norm_x, env->norm_rows, env->norm_w, env->norm_eps,
                                               (const int8_t *)W->data, (const float *)W->scales, bias, T,
                                               (int32_t)W->rows, K, epi, y, 0, env->stream);
        }
        /* Q8_ROW products that take gemv.cu's GEMV (1..2 rows, N < 16384
         * by default: qkv): folded the same way */
        if (W->format == DSQ_WF_Q8_ROW && env->norm_fuse && quant_gemv_path(W, x, T, env) &&
            dsq_cu_gemv_q8_pdl_use(T, (int32_t)W->rows, K, x, (const int8_t *)W->data) &&
            dsq_cu_gemv_q8_norm_ok(T, K, env->norm_x, env->norm_w, (const int8_t *)W->data))
            return dsq_cu_gemv_q8_norm_cfg(env->norm_x, env->norm_rows, env->norm_w, env->norm_eps,
                                           (const int8_t *)W->data, (const float *)W->scales, bias, T,
                                           (int32_t)W->rows, K, epi, y, 0, 0, env->stream);
        /* Q4_G128 products on gemv.cu's GEMV (qkv below qrows_q4_min rows): the same */
        if (W->format == DSQ_WF_Q4_G128 && env->norm_fuse && quant_gemv_path(W, x, T, env) &&
            dsq_cu_gemv_q4_pdl_use(T, (int32_t)W->rows, K, x, (const uint8_t *)W->data) &&
            dsq_cu_gemv_q4_norm_ok(T, K, env->norm_x, env->norm_w, (const uint8_t *)W->data))
            return dsq_cu_gemv_q4_norm_cfg(env->norm_x, env->norm_rows, env->norm_w, env->norm_eps,
                                           (const uint8_t *)W->data, (const uint16_t *)W->scales,
                                           (const uint8_t *)W->zeros, bias, T, (int32_t)W->rows, K, epi, y, 0, 0,
                                           env->stream);
        /* the tensor-core GEMV of few tiles (mma_norm: qkv at 4-8 rows):
         * each block computes the T norms, a warp per row */
        if (W->format == DSQ_WF_BF16 && env->mma_norm > 0 && T <= env->gemv_max && use_mma(env, T, K) &&
            (W->rows + 15) / 16 <= env->mma_norm && dsq_cu_gemv_mma_ok(T, K, env->norm_x, w) &&
            ((uintptr_t)env->norm_w & 15) == 0 && (size_t)T * (K + 32) * 2 <= DSQ_GEMV_NORM_MAX_SMEM &&
            epi != DSQ_EPI_ADD && !(rows_from_min(env, T) && dsq_cu_gemm_rows_ok(T, K, x, w)))
            return dsq_cu_gemv_mma_norm(env->norm_x, env->norm_rows, env->norm_w, env->norm_eps, w, bias, T,
                                        (int32_t)W->rows, K, epi, y, 0, env->stream);
        dsq_status st = dsq_cu_rmsnorm(env->norm_x, env->norm_rows, T, K, env->norm_w, env->norm_eps,
                                       (dsq_bf16 *)x, env->stream);
        if (st != DSQ_OK)
            return st;
    }
    switch (W->format) {
    case DSQ_WF_BF16:
        return linear_bf16(W, x, bias, T, epi, y, env);
    case DSQ_WF_Q8_ROW:
    case DSQ_WF_Q4_G128:
        return linear_quant(W, x, bias, T, epi, y, env);
    case DSQ_WF_F32:
    case DSQ_WF_F16:
    case DSQ_WF_Q4_AWQ:
    case DSQ_WF_Q4_GPTQ:
        break;
    }
    return dsq_fail(DSQ_ERR_UNSUPPORTED, "CUDA linear: weight format %s has no GPU product",
                    dsq_wformat_name(W->format));
}
