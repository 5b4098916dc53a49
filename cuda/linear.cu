/* linear.cu - dsq_cu_linear: the product every layer op calls, dispatching
 * on the weight's format (lib/weight.h) and on the number of rows. */
#include "kernels.h"

static dsq_status linear_bf16(const dsq_weight *W, const dsq_bf16 *x, const float *bias, int32_t T,
                              dsq_epilogue epi, void *y, const dsq_cu_linear_env *env)
{
    const dsq_bf16 *w = (const dsq_bf16 *)W->data;
    const int32_t N = (int32_t)W->rows, K = (int32_t)W->cols;
    if (T <= env->gemv_max)
        return dsq_cu_gemv(x, w, bias, T, N, K, epi, y, env->stream);
    if (epi == DSQ_EPI_SILU_MUL) {
        dsq_status st = dsq_gemm_run(env->gemm, x, w, NULL, T, N, K, DSQ_EPI_STORE, env->gu_scratch, env->stream);
        if (st != DSQ_OK)
            return st;
        return dsq_cu_silu_mul(env->gu_scratch, T, N / 2, (dsq_bf16 *)y, env->stream);
    }
    return dsq_gemm_run(env->gemm, x, w, bias, T, N, K, epi, (float *)y, env->stream);
}

extern "C" dsq_status dsq_cu_linear(const dsq_weight *W, const dsq_bf16 *x, const float *bias, int32_t T,
                                    dsq_epilogue epi, void *y, const dsq_cu_linear_env *env)
{
    if ((epi == DSQ_EPI_SILU_MUL) != (W->layout == DSQ_WL_GATE_UP))
        return dsq_fail(DSQ_ERR_INTERNAL, "CUDA linear: the SwiGLU epilogue needs a gate/up interleaved "
                        "weight and only it (layout %d)", (int)W->layout);
    switch (W->format) {
    case DSQ_WF_BF16:
        return linear_bf16(W, x, bias, T, epi, y, env);
    case DSQ_WF_F32:
    case DSQ_WF_F16:
    case DSQ_WF_Q8_ROW:
    case DSQ_WF_Q4_AWQ:
    case DSQ_WF_Q4_GPTQ:
        break;
    }
    return dsq_fail(DSQ_ERR_UNSUPPORTED, "CUDA linear: weight format %s has no GPU product",
                    dsq_wformat_name(W->format));
}
