/* gemm.cu - y = epilogue(x W^T) for many rows through cuBLASLt: bf16
 * operands, fp32 accumulation and scale, fp32 result (bias and residual add
 * fused into the library's epilogue).
 *
 * Row-major y[T][N] = x[T][K] W[N][K]^T is, in cuBLAS's column-major terms,
 * y^T (N x T, ld N) = op(A) B with A = W seen as K x N (ld K) transposed and
 * B = x seen as K x T (ld K).
 *
 * Descriptors live on the stack (the *Init calls fill caller memory) and the
 * algorithm chosen for each (T, N, K, epilogue) is cached, so after the first
 * call of a shape nothing is allocated and no heuristic runs: a decode step
 * stays allocation-free and capturable.
 *
 * cuBLASLt is called through the table of cublaslt_loader.h (opened with
 * dlopen), never linked; the descriptor *Init calls are the header's inline
 * wrappers spelled out (the *_internal symbols with the struct size). */
#include <stdlib.h>
#include <string.h>

#include "cublaslt_loader.h"
#include "kernels.h"

#define GEMM_CACHE 256

typedef struct gemm_plan {
    int32_t T, N, K, epi;
    cublasLtMatmulAlgo_t algo;
} gemm_plan;

struct dsq_gemm {
    const dsq_cublaslt *api;
    cublasLtHandle_t lt;
    void *ws;             /* device workspace [ws_bytes] */
    size_t ws_bytes;
    gemm_plan plans[GEMM_CACHE];
    int32_t n_plans, next_evict;
};

static dsq_status lt_status(const dsq_cublaslt *api, cublasStatus_t s, const char *what)
{
    if (s == CUBLAS_STATUS_SUCCESS)
        return DSQ_OK;
    if (s == CUBLAS_STATUS_ALLOC_FAILED)
        return dsq_fail(DSQ_ERR_DEVICE_OOM, "cuBLASLt %s: allocation failed", what);
    return dsq_fail(DSQ_ERR_DEVICE, "cuBLASLt %s failed: status %d (%s)", what, (int)s,
                    api->GetStatusString(s));
}

extern "C" dsq_status dsq_gemm_create(size_t workspace_bytes, dsq_gemm **out)
{
    *out = NULL;
    const dsq_cublaslt *api = dsq_cublaslt_get();
    if (!api)
        return dsq_fail(DSQ_ERR_NO_DEVICE, "cuBLASLt could not be loaded: %s", dsq_cublaslt_problem());
    dsq_gemm *g = (dsq_gemm *)calloc(1, sizeof *g);
    if (!g)
        return dsq_fail(DSQ_ERR_OUT_OF_MEMORY, "no host memory for the GEMM state");
    g->api = api;
    dsq_status st = lt_status(api, api->Create(&g->lt), "handle creation");
    if (st != DSQ_OK) {
        free(g);
        return st;
    }
    if (workspace_bytes) {
        st = dsq_cu_status(cudaMalloc(&g->ws, workspace_bytes), "cuBLASLt workspace allocation");
        if (st != DSQ_OK) {
            api->Destroy(g->lt);
            free(g);
            return st;
        }
    }
    g->ws_bytes = workspace_bytes;
    *out = g;
    return DSQ_OK;
}

extern "C" void dsq_gemm_destroy(dsq_gemm *g)
{
    if (!g)
        return;
    cudaFree(g->ws);
    g->api->Destroy(g->lt);
    free(g);
}

extern "C" size_t dsq_gemm_device_bytes(const dsq_gemm *g) { return g ? g->ws_bytes : 0; }

extern "C" dsq_status dsq_gemm_run(dsq_gemm *g, const dsq_bf16 *x, const dsq_bf16 *w, const float *bias,
                                   int32_t T, int32_t N, int32_t K, dsq_epilogue epi, float *y,
                                   cudaStream_t stream)
{
    if (T <= 0)
        return DSQ_OK;
    if (epi == DSQ_EPI_SILU_MUL)
        return dsq_fail(DSQ_ERR_INTERNAL, "gemm: silu*mul epilogue is GEMV-only");
    if (epi == DSQ_EPI_BIAS && !bias)
        return dsq_fail(DSQ_ERR_INTERNAL, "gemm: bias epilogue without a bias");

    const dsq_cublaslt *api = g->api;
    cublasLtMatmulDescOpaque_t desc;
    cublasLtMatrixLayoutOpaque_t la, lb, lc;
    dsq_status st = lt_status(api, api->MatmulDescInit_internal(&desc, sizeof desc, CUBLAS_COMPUTE_32F, CUDA_R_32F),
                              "descriptor init");
    if (st != DSQ_OK)
        return st;
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    api->MatmulDescSetAttribute(&desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta);
    api->MatmulDescSetAttribute(&desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb);
    if (epi == DSQ_EPI_BIAS) {
        cublasLtEpilogue_t e = CUBLASLT_EPILOGUE_BIAS;
        cudaDataType_t bt = CUDA_R_32F;
        api->MatmulDescSetAttribute(&desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &e, sizeof e);
        api->MatmulDescSetAttribute(&desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof bt);
        st = lt_status(api, api->MatmulDescSetAttribute(&desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias),
                       "bias pointer");
        if (st != DSQ_OK)
            return st;
    }
    st = lt_status(api, api->MatrixLayoutInit_internal(&la, sizeof la, CUDA_R_16BF, K, N, K), "layout A");
    if (st == DSQ_OK)
        st = lt_status(api, api->MatrixLayoutInit_internal(&lb, sizeof lb, CUDA_R_16BF, K, T, K), "layout B");
    if (st == DSQ_OK)
        st = lt_status(api, api->MatrixLayoutInit_internal(&lc, sizeof lc, CUDA_R_32F, N, T, N), "layout C");
    if (st != DSQ_OK)
        return st;

    /* find or choose the algorithm */
    const gemm_plan *plan = NULL;
    for (int32_t i = 0; i < g->n_plans; i++) {
        const gemm_plan *p = &g->plans[i];
        if (p->T == T && p->N == N && p->K == K && p->epi == (int32_t)epi) {
            plan = p;
            break;
        }
    }
    if (!plan) {
        cublasLtMatmulPreferenceOpaque_t pref;
        st = lt_status(api, api->MatmulPreferenceInit_internal(&pref, sizeof pref), "preference init");
        if (st != DSQ_OK)
            return st;
        api->MatmulPreferenceSetAttribute(&pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                             &g->ws_bytes, sizeof g->ws_bytes);
        cublasLtMatmulHeuristicResult_t res;
        int found = 0;
        st = lt_status(api, api->MatmulAlgoGetHeuristic(g->lt, &desc, &la, &lb, &lc, &lc, &pref, 1, &res, &found),
                       "heuristic query");
        if (st != DSQ_OK)
            return st;
        if (found < 1)
            return dsq_fail(DSQ_ERR_DEVICE, "cuBLASLt has no algorithm for a %d x %d x %d bf16 product", T, N, K);
        int32_t slot = g->n_plans < GEMM_CACHE ? g->n_plans++ : (g->next_evict++ % GEMM_CACHE);
        gemm_plan *p = &g->plans[slot];
        p->T = T;
        p->N = N;
        p->K = K;
        p->epi = (int32_t)epi;
        p->algo = res.algo;
        plan = p;
    }
    const float alpha = 1.0f, beta = epi == DSQ_EPI_ADD ? 1.0f : 0.0f;
    return lt_status(api, api->Matmul(g->lt, &desc, &alpha, w, &la, x, &lb, &beta, y, &lc, y, &lc,
                                    &plan->algo, g->ws, g->ws_bytes, stream),
                     "matmul");
}
