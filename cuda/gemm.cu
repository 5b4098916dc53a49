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
 * wrappers spelled out (the *_internal symbols with the struct size).
 *
 * Tuning (dsq_gemm_set_tune; DSQ_CUDA_GEMM_TUNE=1 in the CUDA backend): the
 * heuristic's first answer is a prediction, and for the decode step's short
 * products (8-256 rows against a 1,536-wide weight) it leaves most SMs idle
 * (qkv at 64 rows streamed ~0.7 TB/s, stop 20's table).  With tuning on, a
 * plan made while the stream is being captured into a graph is marked
 * pending (nothing can be timed inside a capture); dsq_gemm_tune_pending(),
 * called after the capture ends, times the heuristic's candidates (and
 * split-K variants of its first ones: the short products have few output
 * tiles for the SMs) on the
 * recorded operands with the weights evicted from L2 before each run (the
 * step streams them from memory), keeps the fastest, and says whether any
 * choice changed so the caller captures again.  Mode 2 (DSQ_CUDA_GEMM_TUNE=2)
 * also times plans first used outside a capture (prompts, mixed steps)
 * before their first run: a stall of tens of ms the first time each row
 * count is seen, a measurement setting.  The choice depends on timings, so
 * two processes may pick different algorithms for a shape and their results
 * may differ in the last bits. */
#include <stdlib.h>
#include <string.h>

#include "cublaslt_loader.h"
#include "kernels.h"

#define GEMM_CACHE 256

/* The heuristic's candidates per pending plan; of its first TUNE_SPLIT_BASES
 * that allow split-K with a compute-type reduction (deterministic: partial
 * sums in fp32 in the workspace, reduced in a fixed order), variants with
 * each of TUNE_SPLITS splits; timed runs of each candidate. */
#define TUNE_CANDIDATES 16
#define TUNE_SPLIT_BASES 8
#define TUNE_SPLITS 4
#define TUNE_MAX (TUNE_CANDIDATES + TUNE_SPLIT_BASES * TUNE_SPLITS)
#define TUNE_RUNS 5

typedef struct gemm_plan {
    int32_t T, N, K, epi;
    cublasLtMatmulAlgo_t algo;
    int32_t tuned;   /* chosen by timing, or its timing failed (never retried):
                        kept when the cache evicts */
    int32_t pending; /* used by a capture (mode 2: any call) with tuning on: to be timed */
    /* pending plans: the operands of the call that made the plan (device
     * buffers of the caller that outlive the capture; only read here) */
    const dsq_bf16 *x, *w;
    const float *bias;
} gemm_plan;

struct dsq_gemm {
    const dsq_cublaslt *api;
    cublasLtHandle_t lt;
    void *ws;             /* device workspace [ws_bytes] */
    size_t ws_bytes;
    gemm_plan plans[GEMM_CACHE];
    int32_t n_plans, next_evict;
    int32_t tune, tune_max_rows; /* dsq_gemm_set_tune */
};

/* The descriptors of y = epi(x W^T) for (T, N, K) (see the top comment). */
typedef struct gemm_desc {
    cublasLtMatmulDescOpaque_t desc;
    cublasLtMatrixLayoutOpaque_t la, lb, lc;
} gemm_desc;

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

/* A plan's epilogue code: a dsq_epilogue (fp32 y), or this one: y = x W^T
 * rounded to bf16 (dsq_gemm_run_bf16). */
#define GEMM_EPI_STORE_BF16 16

static dsq_status make_desc(const dsq_gemm *g, const float *bias, int32_t T, int32_t N, int32_t K, int epi,
                            gemm_desc *d)
{
    const dsq_cublaslt *api = g->api;
    dsq_status st = lt_status(api, api->MatmulDescInit_internal(&d->desc, sizeof d->desc, CUBLAS_COMPUTE_32F,
                                                                CUDA_R_32F),
                              "descriptor init");
    if (st != DSQ_OK)
        return st;
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    api->MatmulDescSetAttribute(&d->desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta);
    api->MatmulDescSetAttribute(&d->desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb);
    if (epi == DSQ_EPI_BIAS) {
        cublasLtEpilogue_t e = CUBLASLT_EPILOGUE_BIAS;
        cudaDataType_t bt = CUDA_R_32F;
        api->MatmulDescSetAttribute(&d->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &e, sizeof e);
        api->MatmulDescSetAttribute(&d->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof bt);
        st = lt_status(api, api->MatmulDescSetAttribute(&d->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                                        sizeof bias),
                       "bias pointer");
        if (st != DSQ_OK)
            return st;
    }
    st = lt_status(api, api->MatrixLayoutInit_internal(&d->la, sizeof d->la, CUDA_R_16BF, K, N, K), "layout A");
    if (st == DSQ_OK)
        st = lt_status(api, api->MatrixLayoutInit_internal(&d->lb, sizeof d->lb, CUDA_R_16BF, K, T, K), "layout B");
    if (st == DSQ_OK)
        st = lt_status(api, api->MatrixLayoutInit_internal(&d->lc, sizeof d->lc,
                                                           epi == GEMM_EPI_STORE_BF16 ? CUDA_R_16BF : CUDA_R_32F, N,
                                                           T, N),
                       "layout C");
    return st;
}

/* Up to `want` algorithms the heuristic proposes for d, best guess first. */
static dsq_status heuristic(const dsq_gemm *g, gemm_desc *d, int32_t T, int32_t N, int32_t K, int want,
                            cublasLtMatmulHeuristicResult_t *res, int *found)
{
    const dsq_cublaslt *api = g->api;
    cublasLtMatmulPreferenceOpaque_t pref;
    dsq_status st = lt_status(api, api->MatmulPreferenceInit_internal(&pref, sizeof pref), "preference init");
    if (st != DSQ_OK)
        return st;
    size_t wsb = g->ws_bytes;
    api->MatmulPreferenceSetAttribute(&pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof wsb);
    *found = 0;
    st = lt_status(api, api->MatmulAlgoGetHeuristic(g->lt, &d->desc, &d->la, &d->lb, &d->lc, &d->lc, &pref, want,
                                                    res, found),
                   "heuristic query");
    if (st != DSQ_OK)
        return st;
    if (*found < 1)
        return dsq_fail(DSQ_ERR_DEVICE, "cuBLASLt has no algorithm for a %d x %d x %d bf16 product", T, N, K);
    return DSQ_OK;
}

/* A cache slot for a new plan: a free one, else the next one in turn that
 * is neither pending (its timing is owed to the graph being captured) nor
 * tuned (a timing run to remake), else the next one not pending, else the
 * next.  next_evict stays in [0, GEMM_CACHE). */
static gemm_plan *new_slot(dsq_gemm *g)
{
    if (g->n_plans < GEMM_CACHE)
        return &g->plans[g->n_plans++];
    for (int pass = 0; pass < 3; pass++)
        for (int i = 0; i < GEMM_CACHE; i++) {
            gemm_plan *p = &g->plans[g->next_evict];
            g->next_evict = (g->next_evict + 1) % GEMM_CACHE;
            if (pass == 2 || (!p->pending && (pass == 1 || !p->tuned)))
                return p;
        }
    return &g->plans[0]; /* not reached: pass 2 returns the first slot it sees */
}

/* With tuning on, an untuned plan of at most tune_max_rows rows becomes
 * pending with this call's operands while the stream is capturing; in mode
 * 2 outside a capture too, and it is then timed at once (the return value:
 * 1 = tune it now). */
static int mark_pending(dsq_gemm *g, gemm_plan *p, const dsq_bf16 *x, const dsq_bf16 *w, const float *bias,
                        cudaStream_t stream)
{
    if (!g->tune || p->tuned || p->pending || p->T > g->tune_max_rows)
        return 0;
    cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(stream, &cs) != cudaSuccess) {
        (void)cudaGetLastError(); /* e.g. the legacy stream beside a capture: not ours to report */
        return 0;
    }
    const int now = cs == cudaStreamCaptureStatusNone && g->tune == 2;
    if (cs != cudaStreamCaptureStatusActive && !now)
        return 0;
    p->pending = 1;
    p->x = x;
    p->w = w;
    p->bias = bias;
    return now;
}

/* A pending plan leaves the queue: its recorded operands are dropped;
 * `tuned` = 1 means it is not to be timed again (timed, or its timing
 * failed), 0 that a later capture may mark it again. */
static void plan_release(gemm_plan *p, int32_t tuned)
{
    p->pending = 0;
    p->tuned = tuned;
    p->x = p->w = NULL;
    p->bias = NULL;
}

extern "C" void dsq_gemm_set_tune(dsq_gemm *g, int on, int32_t max_rows)
{
    if (!g)
        return;
    g->tune = on == 2 ? 2 : on != 0;
    g->tune_max_rows = max_rows > 0 ? max_rows : 256;
}

/* dsq_gemm_run and dsq_gemm_run_bf16: epi a dsq_epilogue or GEMM_EPI_STORE_BF16 */
static dsq_status gemm_run(dsq_gemm *g, const dsq_bf16 *x, const dsq_bf16 *w, const float *bias, int32_t T,
                           int32_t N, int32_t K, int epi, void *y, cudaStream_t stream)
{
    const dsq_cublaslt *api = g->api;
    gemm_desc d;
    dsq_status st = make_desc(g, bias, T, N, K, epi, &d);
    if (st != DSQ_OK)
        return st;

    /* find or choose the algorithm; a plan first used by a capture (new,
     * or made before by an eager pass, e.g. the head's rows of a prompt)
     * is timed after it when tuning is on */
    gemm_plan *plan = NULL;
    for (int32_t i = 0; i < g->n_plans; i++) {
        gemm_plan *p = &g->plans[i];
        if (p->T == T && p->N == N && p->K == K && p->epi == epi) {
            plan = p;
            break;
        }
    }
    if (!plan) {
        cublasLtMatmulHeuristicResult_t res;
        int found = 0;
        st = heuristic(g, &d, T, N, K, 1, &res, &found);
        if (st != DSQ_OK)
            return st;
        gemm_plan *p = new_slot(g);
        memset(p, 0, sizeof *p);
        p->T = T;
        p->N = N;
        p->K = K;
        p->epi = epi;
        p->algo = res.algo;
        plan = p;
    }
    if (mark_pending(g, plan, x, w, bias, stream)) {
        /* mode 2, an eager call: timed before its first run.  A failure
         * leaves the heuristic's choice (the plan is no longer pending);
         * a failed device shows in the product's own status below. */
        int32_t tuned = 0, changed = 0;
        (void)dsq_gemm_tune_pending(g, stream, &tuned, &changed);
        if (plan->pending) /* refused (a capture began meanwhile): this call's operands go */
            plan_release(plan, 0);
    }
    const float alpha = 1.0f, beta = epi == DSQ_EPI_ADD ? 1.0f : 0.0f;
    return lt_status(api, api->Matmul(g->lt, &d.desc, &alpha, w, &d.la, x, &d.lb, &beta, y, &d.lc, y, &d.lc,
                                      &plan->algo, g->ws, g->ws_bytes, stream),
                     "matmul");
}

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
    return gemm_run(g, x, w, bias, T, N, K, (int)epi, y, stream);
}

extern "C" dsq_status dsq_gemm_run_bf16(dsq_gemm *g, const dsq_bf16 *x, const dsq_bf16 *w, int32_t T, int32_t N,
                                        int32_t K, dsq_bf16 *y, cudaStream_t stream)
{
    if (T <= 0)
        return DSQ_OK;
    return gemm_run(g, x, w, NULL, T, N, K, GEMM_EPI_STORE_BF16, y, stream);
}

/* ---- tuning ---------------------------------------------------------------- */

/* The device buffers one tuning call times with: y [T][N] fp32 (the
 * pending plans' own outputs are never written) and a buffer twice the L2
 * size, rewritten before each timed run so that the weights come from
 * memory as in a step. */
typedef struct tune_bufs {
    float *y;
    void *flush;
    size_t flush_bytes;
    cudaEvent_t e0, e1;
} tune_bufs;

/* Median time (us) of TUNE_RUNS runs of one candidate; -1 where cuBLASLt
 * refuses the candidate for this problem, -2 where the stream or device
 * failed (an error a fault leaves is sticky: tuning stops). */
static float time_candidate(dsq_gemm *g, const gemm_plan *p, gemm_desc *d, const cublasLtMatmulAlgo_t *algo,
                            tune_bufs *b, cudaStream_t stream)
{
    const dsq_cublaslt *api = g->api;
    const float alpha = 1.0f, beta = p->epi == DSQ_EPI_ADD ? 1.0f : 0.0f;
    float t[TUNE_RUNS];
    for (int r = -1; r < TUNE_RUNS; r++) { /* r = -1: warm-up (code, descriptors) */
        if (cudaMemsetAsync(b->flush, r & 0xff, b->flush_bytes, stream) != cudaSuccess ||
            cudaEventRecord(b->e0, stream) != cudaSuccess)
            return -2.0f;
        cublasStatus_t s = api->Matmul(g->lt, &d->desc, &alpha, p->w, &d->la, p->x, &d->lb, &beta, b->y, &d->lc,
                                       b->y, &d->lc, algo, g->ws, g->ws_bytes, stream);
        if (cudaEventRecord(b->e1, stream) != cudaSuccess || cudaEventSynchronize(b->e1) != cudaSuccess)
            return -2.0f; /* the device or stream failed: no further candidate can run */
        if (s != CUBLAS_STATUS_SUCCESS)
            return -1.0f; /* refused for this problem (nothing ran) */
        float ms = 0.0f;
        if (cudaEventElapsedTime(&ms, b->e0, b->e1) != cudaSuccess)
            return -2.0f;
        if (r >= 0)
            t[r] = ms * 1000.0f;
    }
    for (int i = 1; i < TUNE_RUNS; i++) /* insertion sort, 5 values */
        for (int j = i; j > 0 && t[j] < t[j - 1]; j--) {
            float v = t[j];
            t[j] = t[j - 1];
            t[j - 1] = v;
        }
    return t[TUNE_RUNS / 2];
}

/* The candidates to time: the heuristic's answers, then split-K variants
 * of its first TUNE_SPLIT_BASES where the algorithm allows them, each
 * checked by cuBLASLt for this problem and the workspace.  Returns the
 * count written to cand[TUNE_MAX]. */
static int candidates(const dsq_gemm *g, gemm_desc *d, int32_t K, const cublasLtMatmulHeuristicResult_t *res,
                      int found, cublasLtMatmulAlgo_t *cand)
{
    const dsq_cublaslt *api = g->api;
    int n = 0;
    for (int i = 0; i < found; i++)
        if (res[i].state == CUBLAS_STATUS_SUCCESS)
            cand[n++] = res[i].algo;
    static const int32_t splits[TUNE_SPLITS] = {2, 4, 8, 16};
    for (int i = 0; i < found && i < TUNE_SPLIT_BASES; i++) {
        if (res[i].state != CUBLAS_STATUS_SUCCESS)
            continue;
        int32_t sup = 0, cur = 1;
        uint32_t mask = 0;
        size_t wr = 0;
        if (api->MatmulAlgoCapGetAttribute(&res[i].algo, CUBLASLT_ALGO_CAP_SPLITK_SUPPORT, &sup, sizeof sup, &wr) !=
                CUBLAS_STATUS_SUCCESS ||
            !sup ||
            api->MatmulAlgoCapGetAttribute(&res[i].algo, CUBLASLT_ALGO_CAP_REDUCTION_SCHEME_MASK, &mask, sizeof mask,
                                           &wr) != CUBLAS_STATUS_SUCCESS ||
            !(mask & CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE) ||
            api->MatmulAlgoConfigGetAttribute(&res[i].algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &cur, sizeof cur, &wr) !=
                CUBLAS_STATUS_SUCCESS)
            continue;
        for (int s = 0; s < TUNE_SPLITS; s++) {
            if (splits[s] == cur || K < 128 * splits[s]) /* at least 128 of K per split */
                continue;
            cublasLtMatmulAlgo_t a = res[i].algo;
            const int32_t sk = splits[s];
            const uint32_t scheme = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
            cublasLtMatmulHeuristicResult_t chk;
            memset(&chk, 0, sizeof chk);
            if (api->MatmulAlgoConfigSetAttribute(&a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &sk, sizeof sk) !=
                    CUBLAS_STATUS_SUCCESS ||
                api->MatmulAlgoConfigSetAttribute(&a, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &scheme, sizeof scheme) !=
                    CUBLAS_STATUS_SUCCESS ||
                api->MatmulAlgoCheck(g->lt, &d->desc, &d->la, &d->lb, &d->lc, &d->lc, &a, &chk) !=
                    CUBLAS_STATUS_SUCCESS ||
                chk.workspaceSize > g->ws_bytes)
                continue;
            cand[n++] = a;
        }
    }
    return n;
}

static dsq_status tune_plan(dsq_gemm *g, gemm_plan *p, tune_bufs *b, cudaStream_t stream, int *changed)
{
    gemm_desc d;
    dsq_status st = make_desc(g, p->bias, p->T, p->N, p->K, p->epi, &d);
    if (st != DSQ_OK)
        return st;
    cublasLtMatmulHeuristicResult_t res[TUNE_CANDIDATES];
    int found = 0;
    st = heuristic(g, &d, p->T, p->N, p->K, TUNE_CANDIDATES, res, &found);
    if (st != DSQ_OK)
        return st;
    cublasLtMatmulAlgo_t cand[TUNE_MAX];
    const int n_cand = candidates(g, &d, p->K, res, found, cand);
    int best = -1;
    float best_us = 0.0f;
    for (int i = 0; i < n_cand; i++) {
        float us = time_candidate(g, p, &d, &cand[i], b, stream);
        if (us == -2.0f) {
            const cudaError_t e = cudaGetLastError();
            return dsq_cu_status(e != cudaSuccess ? e : cudaErrorUnknown, "GEMM tuning run");
        }
        if (us < 0.0f)
            continue;
        if (best < 0 || us < best_us) {
            best = i;
            best_us = us;
        }
    }
    if (best >= 0 && memcmp(&cand[best], &p->algo, sizeof p->algo) != 0) {
        p->algo = cand[best];
        ++*changed;
    }
    /* no candidate ran: the heuristic's choice stays (it ran in the graph) */
    return DSQ_OK;
}

extern "C" dsq_status dsq_gemm_tune_pending(dsq_gemm *g, cudaStream_t stream, int32_t *n_tuned,
                                            int32_t *n_changed)
{
    if (n_tuned)
        *n_tuned = 0;
    if (n_changed)
        *n_changed = 0;
    if (!g)
        return dsq_fail(DSQ_ERR_INTERNAL, "dsq_gemm_tune_pending: NULL handle");
    size_t y_elems = 0;
    int32_t n = 0;
    for (int32_t i = 0; i < g->n_plans; i++)
        if (g->plans[i].pending) {
            n++;
            size_t e = (size_t)g->plans[i].T * (size_t)g->plans[i].N;
            y_elems = e > y_elems ? e : y_elems;
        }
    if (n == 0)
        return DSQ_OK;
    cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(stream, &cs) != cudaSuccess || cs != cudaStreamCaptureStatusNone) {
        (void)cudaGetLastError();
        return dsq_fail(DSQ_ERR_INTERNAL, "dsq_gemm_tune_pending: the stream is capturing (or unusable)");
    }
    int dev = 0, l2 = 0;
    cudaGetDevice(&dev);
    if (cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev) != cudaSuccess || l2 <= 0)
        l2 = 64 << 20;
    tune_bufs b;
    memset(&b, 0, sizeof b);
    b.flush_bytes = (size_t)l2 * 2;
    dsq_status st = dsq_cu_status(cudaMalloc((void **)&b.y, y_elems * sizeof(float)), "GEMM tuning output");
    if (st == DSQ_OK)
        st = dsq_cu_status(cudaMalloc(&b.flush, b.flush_bytes), "GEMM tuning L2 flush buffer");
    if (st == DSQ_OK)
        st = dsq_cu_status(cudaEventCreate(&b.e0), "GEMM tuning event");
    if (st == DSQ_OK)
        st = dsq_cu_status(cudaEventCreate(&b.e1), "GEMM tuning event");
    if (st == DSQ_OK)
        /* finite inputs for beta = 1 (ADD reads y): zeros */
        st = dsq_cu_status(cudaMemsetAsync(b.y, 0, y_elems * sizeof(float), stream), "GEMM tuning output");
    int changed = 0, tuned = 0;
    for (int32_t i = 0; i < g->n_plans && st == DSQ_OK; i++) {
        gemm_plan *p = &g->plans[i];
        if (!p->pending)
            continue;
        st = tune_plan(g, p, &b, stream, &changed);
        if (st != DSQ_OK)
            break;
        plan_release(p, 1);
        tuned++;
    }
    /* the timed runs finished (each was synchronized) before the frees */
    if (b.e0)
        cudaEventDestroy(b.e0);
    if (b.e1)
        cudaEventDestroy(b.e1);
    cudaFree(b.flush);
    cudaFree(b.y);
    if (st != DSQ_OK) /* the rest keep the heuristic's choice, untimed and not retried */
        for (int32_t i = 0; i < g->n_plans; i++)
            if (g->plans[i].pending)
                plan_release(&g->plans[i], 1);
    if (n_tuned)
        *n_tuned = tuned;
    if (n_changed)
        *n_changed = changed;
    return st;
}
