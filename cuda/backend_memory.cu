/*
 * backend_memory.cu - a CUDA context's memory plan, made once at
 * dsq_ctx_new(): nothing is allocated after it.
 *
 * Device (on the model's device):
 *   KV cache      one allocation; per layer k, v [rows][KV][D] fp16 or int8,
 *                 + fp32 scales [rows][KV] for INT8 (cuda/attention.h);
 *                 rows = max_seqs * max_context (static) or n_blocks *
 *                 block_size (paged); zeroed
 *   scratch       one allocation carved into the activations of
 *                 max_batch_tokens rows (cu_ctx in backend.h), the logits
 *                 chunk, the batch metadata and the flash-decoding workspace
 *   cuBLASLt      handle + 32 MB workspace (cuda/gemm.cu)
 *   dsq_step      token history ring [max_seqs][hist_r], sampling rows and
 *                 results [max_bseqs]
 * Pinned host: two metadata buffers (alternating passes), the logits
 * staging chunk, sampling rows / results.
 * Host: the decode-graph table [max_bseqs][2][block-table buckets].
 */
#include <stdlib.h>
#include <string.h>

#include "backend.h"

void cu_ctx_free(dsq_ctx *c)
{
    cu_ctx *cc = (cu_ctx *)c->be;
    if (!cc)
        return;
    if (cc->tp && ((const cu_model *)c->model->be)->tp) {
        cu_tp_ctx_free(c);
        return;
    }
    cu_device_guard g(cc->device);
    if (cc->stream)
        cudaStreamSynchronize(cc->stream);
    for (int i = 0; i < 2; i++) {
        if (cc->meta_sent[i])
            cudaEventDestroy(cc->meta_sent[i]);
        if (cc->meta_host[i])
            cudaFreeHost(cc->meta_host[i]);
    }
    if (cc->logits_host)
        cudaFreeHost(cc->logits_host);
    if (cc->srow_host)
        cudaFreeHost(cc->srow_host);
    if (cc->sres_host)
        cudaFreeHost(cc->sres_host);
    if (cc->srow_sent)
        cudaEventDestroy(cc->srow_sent);
    cudaFree(cc->ring);
    cudaFree(cc->srow_dev);
    cudaFree(cc->sres_dev);
    for (int i = 0; i < COPY_PIECES; i++)
        if (cc->copied[i])
            cudaEventDestroy(cc->copied[i]);
    if (cc->graphs)
        for (int32_t i = 0; i < 2 * cc->max_bseqs * cc->n_bt_buckets * DSQ_CU_GRAPH_PIECES; i++)
            if (cc->graphs[i])
                cudaGraphExecDestroy(cc->graphs[i]);
    free(cc->graphs);
    free(cc->graph_failed);
    free(cc->h_order);
    free(cc->h_tokmap);
    cudaFree(cc->scratch);
    cudaFree(cc->kv_arena);
    dsq_gemm_destroy(cc->gemm);
    if (cc->stream)
        cudaStreamDestroy(cc->stream);
    cudaGetLastError(); /* teardown errors are not reported */
    free(cc->kv);
    free(cc);
    c->be = NULL;
}

/* The next power of two, so that a pass uploads only the rows' used part
 * while decode graphs, which bake the stride in, stay few (one per power of
 * two). */
int32_t cu_bt_bucket(int32_t need, int32_t bt_max, int32_t *stride)
{
    int32_t b = 0, st = 1;
    while (st < need && st < bt_max) {
        st <<= 1;
        b++;
    }
    *stride = st < bt_max ? st : bt_max;
    return b;
}

static dsq_status device_alloc(void **p, size_t bytes, const char *what)
{
    cudaError_t ce = cudaMalloc(p, bytes);
    if (ce == cudaSuccess)
        return DSQ_OK;
    *p = NULL;
    cudaGetLastError();
    if (ce == cudaErrorMemoryAllocation)
        return dsq_fail(DSQ_ERR_DEVICE_OOM, "cannot allocate %.1f MB of GPU memory for %s", (double)bytes / 1e6, what);
    return dsq_cu_status(ce, what);
}

static dsq_status host_alloc(void **p, size_t bytes, const char *what)
{
    cudaError_t ce = cudaMallocHost(p, bytes);
    if (ce == cudaSuccess)
        return DSQ_OK;
    *p = NULL;
    cudaGetLastError();
    return dsq_fail(DSQ_ERR_OUT_OF_MEMORY, "cannot allocate %.1f MB of pinned host memory for %s (%s)",
                    (double)bytes / 1e6, what, cudaGetErrorString(ce));
}

static dsq_status ctx_setup(dsq_ctx *c, cu_ctx *cc)
{
    const dsq_model *m = c->model;
    const cu_model *cm = (const cu_model *)m->be;
    const dsq_config *cf = &m->cfg;
    const int64_t E = cf->n_embd, H = cf->n_heads, KV = cf->n_kv_heads, D = cf->head_dim, F = cf->n_ff,
                  V = cf->n_vocab, L = cf->n_layers;
    const int64_t QKV = (H + 2 * KV) * D;
    const dsq_ctx_params *p = &c->p;

    if (p->kv_dtype != DSQ_KV_F16 && p->kv_dtype != DSQ_KV_INT8)
        return dsq_fail(DSQ_ERR_UNSUPPORTED, "the CUDA backend stores the KV cache as F16 or INT8; "
                        "kv_dtype %d (F32) is CPU-only", p->kv_dtype);
    if (D != 128 && D != 64)
        return dsq_fail(DSQ_ERR_UNSUPPORTED, "CUDA attention supports head_dim 128 or 64, not %lld", (long long)D);
    if (H % KV != 0)
        return dsq_fail(DSQ_ERR_UNSUPPORTED, "CUDA attention needs n_heads %% n_kv_heads == 0 (%lld, %lld)",
                        (long long)H, (long long)KV);

    CU_TRY(cudaStreamCreateWithFlags(&cc->stream, cudaStreamNonBlocking), "stream creation");
    DSQ_TRY(dsq_attn_init());
    DSQ_TRY(dsq_cu_gemm_rows_init());
    DSQ_TRY(dsq_gemm_create((size_t)32 << 20, &cc->gemm));
    /* DSQ_CUDA_GEMM_TUNE=1: the cuBLASLt products of each decode graph
     * (batch sizes up to 256) timed over the heuristic's candidates before
     * the graph is kept (run_pass; gemm.cu's top comment).  Off by default
     * until measured on the GPU. */
    const char *tune_env = getenv("DSQ_CUDA_GEMM_TUNE"); /* 2: prompts and mixed steps too, any row count */
    cc->gemm_tune = tune_env && (tune_env[0] == '1' || tune_env[0] == '2') ? tune_env[0] - '0' : 0;
    dsq_gemm_set_tune(cc->gemm, cc->gemm_tune, cc->gemm_tune == 2 ? INT32_MAX : 256);

    /* H200, 1.5B shapes (us per call, GEMV vs cuBLASLt): qkv/o/down win up
     * to 8 rows (qkv T=8 5.9 vs 12.5, down T=8 13.0 vs 16.7; down from 4
     * rows now goes to cuBLASLt inside dsq_cu_linear).  gate/up and the
     * head: up to 2 rows until stop 41, when the tensor-core GEMV at 256
     * threads (from 4 rows) and the FMA GEMV (3) beat cuBLASLt + silu_mul
     * end to end: H100 batch 3 1.865 vs 1.941 / 1.950 ms, 4 1.921 / 1.926 vs
     * 1.982 / 1.975, 8 1.992 / 1.977 vs 2.033 / 2.029 */
    cc->gemv_max_small = 8;
    cc->gemv_max_gu = 8;
    cc->gemv_max_head = 8;
    /* 4..8 rows: tensor-core GEMV (gemv_mma.cu), on sm_80 and later.  H100,
     * `dsqwen bench` batch 4 @ 512 (stop 41): 1.999 / 2.010 ms against 2.183
     * / 2.172 on the FMA GEMV with the norm folded in (that kernel took 13.8
     * us per layer for qkv at 4 rows: the norm recomputed by every resident
     * block); at 3 rows the MMA and the FMA GEMV without the fold are equal
     * (1.953-1.956 vs 1.951-1.954), at 2 the FMA GEMV wins (1.76 vs 1.98) */
    cc->gemv_mma_min = 4;
    int major = 0; /* compute capability: the mma.sync kernels need 8 */
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, cc->device) != cudaSuccess) {
        (void)cudaGetLastError();
        major = 0;
    }
    if (major < 8)
        cc->gemv_mma_min = 0;
    const char *mma_env = getenv("DSQ_CUDA_GEMV_MMA"); /* measurement knob: fewest rows for the MMA GEMV, 0 = off */
    if (mma_env && *mma_env && cc->gemv_mma_min > 0) /* never below sm_80, where mma.sync bf16 does not exist */
        cc->gemv_mma_min = atoi(mma_env) < 0 ? 0 : atoi(mma_env);
    if (cc->gemv_mma_min == 0) /* no tensor-core GEMV: gate/up and the head past 2 rows on cuBLASLt as before */
        cc->gemv_max_gu = cc->gemv_max_head = 2;
    /* bf16 down (K > 4,096) from 4 rows on cuBLASLt (linear.cu, long_min);
     * DSQ_CUDA_GEMV_LONG_MIN (measurement knob): another row count, 0 never */
    const char *long_env = getenv("DSQ_CUDA_GEMV_LONG_MIN");
    cc->gemv_long_min = 4;
    if (long_env && *long_env)
        cc->gemv_long_min = atoi(long_env) < 0 ? 0 : atoi(long_env);
    /* The RMSNorm folded into the tensor-core GEMV of few tiles (qkv at 4-8
     * rows; a warp per row computes the norm in each block).  H100, stop 43,
     * ms per step folded / norm kernel + GEMV: batch 4 1.856, 1.840 / 1.867,
     * 1.868; batch 8 1.908, 1.907 / 1.918, 1.917.  DSQ_CUDA_MMA_NORM=n:
     * products of at most n 16-row tiles (default 256: qkv's 128, not
     * gate/up's 1,120); 0: never. */
    const char *mnorm_env = getenv("DSQ_CUDA_MMA_NORM");
    cc->gemv_mma_norm = 256;
    if (mnorm_env && *mnorm_env)
        cc->gemv_mma_norm = atoi(mnorm_env) > 0 ? atoi(mnorm_env) : 0;
    /* The RMSNorm folded into the FMA GEMV after it: bf16 weights at 1 row
     * only (H100 stop 41, ms per step with the fold / the norm's own kernel:
     * batch 1 1.609 / 1.704, batch 2 1.845-1.862 / 1.758-1.761, batch 3
     * 2.031-2.041 / 1.951-1.954); the quantized GEMVs' folds at 1-2 rows as
     * before.  DSQ_CUDA_NORM_FUSE (measurement knob): 0 never, n (1..4) bf16
     * products up to n rows. */
    const char *fuse_env = getenv("DSQ_CUDA_NORM_FUSE");
    cc->norm_fuse = 1;
    if (fuse_env && fuse_env[0])
        cc->norm_fuse = atoi(fuse_env) < 0 ? 0 : atoi(fuse_env) > 4 ? 4 : atoi(fuse_env);
    const char *gu_env = getenv("DSQ_CUDA_GU_F32"); /* measurement knob: 1 = prompt gate/up products in fp32 */
    cc->gu_f32 = gu_env && gu_env[0] == '1';
    /* DSQ_CUDA_GEMM_ROWS=n (1..64): bf16 products of more rows than the
     * GEMV takes, up to n, run gemm_rows.cu instead of cuBLASLt (off by
     * default until measured against it on the GPU) */
    const char *rows_env = getenv("DSQ_CUDA_GEMM_ROWS");
    cc->rows_max = rows_env && *rows_env && major >= 8 ? atoi(rows_env) : 0;
    cc->rows_max = cc->rows_max < 0 ? 0 : cc->rows_max > DSQ_GEMM_ROWS_MAX ? DSQ_GEMM_ROWS_MAX : cc->rows_max;
    /* DSQ_CUDA_GEMM_ROWS_MIN=m (1..64, with DSQ_CUDA_GEMM_ROWS): from m rows
     * on, gemm_rows.cu even where a GEMV would run (measurement knob: the
     * batch-1 products on the tensor cores) */
    const char *rmin_env = getenv("DSQ_CUDA_GEMM_ROWS_MIN");
    cc->rows_min = rmin_env && *rmin_env && cc->rows_max > 0 ? atoi(rmin_env) : 0;
    cc->rows_min = cc->rows_min < 0 ? 0 : cc->rows_min > cc->rows_max ? cc->rows_max : cc->rows_min;
    /* Products with Q8_ROW / Q4_G128 weights of up to DSQ_CUDA_QROWS rows
     * (default 64; 0 = off) run on the tensor cores (gemm_rows.cu) instead
     * of the quantized GEMV (1..8 rows) or dequantize + cuBLASLt; Q8_ROW
     * ones from DSQ_CUDA_QROWS_Q8_MIN rows (default 3).  Measured on the
     * H200 (2026-12-05, docs/performance.md "stop 26"): batch-1 decode with
     * 4-bit weights 1.390 vs 1.471 ms, batch 64 5.86 vs 7.60 ms; INT8 at
     * batch 1 1.333 vs 1.214 ms (the GEMV stays), at 4-8 rows the products
     * 1.1-2.7x faster (test_cuda_quant's timing table). */
    const char *qrows_env = getenv("DSQ_CUDA_QROWS");
    cc->qrows_max = major < 8 ? 0 : qrows_env && *qrows_env ? atoi(qrows_env) : DSQ_GEMM_ROWS_MAX;
    cc->qrows_max = cc->qrows_max < 0 ? 0 : cc->qrows_max > DSQ_GEMM_ROWS_MAX ? DSQ_GEMM_ROWS_MAX : cc->qrows_max;
    const char *q8min_env = getenv("DSQ_CUDA_QROWS_Q8_MIN");
    cc->qrows_q8_min = q8min_env && *q8min_env ? atoi(q8min_env) : 3;
    /* Q4_G128 below DSQ_CUDA_QROWS_Q4_MIN rows on gemv.cu's 4-bit GEMV
     * where dsq_cu_gemv_q4_pdl_use says (qkv, o, down; gate/up stays on the
     * tensor cores).  Default 3 (stop 39, H100): the batch-1 step 1.380 vs
     * 1.465-1.469 ms with every product on gemm_rows.cu (1, as before),
     * 8,192 keys 1.606 vs 1.735, batch 2 and 8 unchanged; every 1-2-row
     * product on the GEMV (gate/up too, DSQ_CUDA_Q4_GEMV=new) measured
     * slower (stop 38: 1.71 vs 1.45 ms) */
    const char *q4min_env = getenv("DSQ_CUDA_QROWS_Q4_MIN");
    cc->qrows_q4_min = q4min_env && *q4min_env ? atoi(q4min_env) : 3;
    /* Q4_G128 / Q8_ROW products of 1-8 rows on the quantized tensor-core
     * GEMV (gemv_mma_quant.cu): all but down; down (K = 8,960) too, 4-bit
     * from 1 row, INT8 from 2.  H100, stop 44, `dsqwen bench` @ 512, ms per
     * step.  Without down, against stop 43's paths (DSQ_CUDA_Q4_MMA=0,
     * DSQ_CUDA_Q8_MMA=0): 4-bit batch 1 1.258, 1.259 / 1.290, 1.306; batch
     * 2 1.342 / 1.428; batch 4 1.374, 1.381 / 1.574; batch 8 1.486, 1.491 /
     * 1.742; INT8 batch 1 1.299, 1.298 / 1.325, 1.326; batch 8 1.511 /
     * 1.793.  Down there too on 16-warp blocks (one knob for both formats then, at 1),
     * against without: 4-bit batch 1 1.223, 1.226 / 1.277, 1.271; batch 8
     * 1.285 / 1.507; INT8 batch 1 1.351, 1.363 / 1.326, 1.325 (its GEMV:
     * 7.7 us against 8.0 alone), batch 8 1.400 / 1.538.  (On 8-warp blocks
     * 4-bit down from 4 rows had been slower in the step: batch 8 1.544 vs
     * 1.486.)  DSQ_CUDA_Q4_MMA / DSQ_CUDA_Q8_MMA=n: up to n rows (0: never);
     * DSQ_CUDA_Q4_MMA_LONG / DSQ_CUDA_Q8_MMA_LONG=m: down from m rows (0:
     * never). */
    cc->qmma_q4_max = cc->qmma_q8_max = major >= 8 ? 8 : 0;
    cc->qmma_q4_long = 1;
    cc->qmma_q8_long = 2;
    const char *q4mma_env = getenv("DSQ_CUDA_Q4_MMA"), *q8mma_env = getenv("DSQ_CUDA_Q8_MMA");
    const char *q4long_env = getenv("DSQ_CUDA_Q4_MMA_LONG"), *q8long_env = getenv("DSQ_CUDA_Q8_MMA_LONG");
    if (q4mma_env && *q4mma_env && major >= 8)
        cc->qmma_q4_max = atoi(q4mma_env) < 0 ? 0 : atoi(q4mma_env);
    if (q8mma_env && *q8mma_env && major >= 8)
        cc->qmma_q8_max = atoi(q8mma_env) < 0 ? 0 : atoi(q8mma_env);
    if (q4long_env && *q4long_env)
        cc->qmma_q4_long = atoi(q4long_env) < 0 ? 0 : atoi(q4long_env);
    if (q8long_env && *q8long_env)
        cc->qmma_q8_long = atoi(q8long_env) < 0 ? 0 : atoi(q8long_env);
    /* DSQ_CUDA_QMMA_NORM=n: the RMSNorm before such a product of at most n
     * tiles (qkv: 128) folded into it, every block computing the norms (off
     * by default: measured slower at stop 45, H100) */
    const char *qnorm_env = getenv("DSQ_CUDA_QMMA_NORM");
    cc->qmma_norm = qnorm_env && *qnorm_env && atoi(qnorm_env) > 0 ? atoi(qnorm_env) : 0;
    /* DSQ_CUDA_QTILE=1: quantized products of more rows than gemm_rows.cu
     * takes (prompts) use the weights rounded to bf16 in one cuBLASLt
     * product instead of two bf16 parts that add up to the exact weights
     * (twice the products' arithmetic; docs/numerics.md "Stop 26") */
    const char *qtile_env = getenv("DSQ_CUDA_QTILE");
    cc->qtile_parts = qtile_env && qtile_env[0] == '1' ? 1 : 2;
    /* DSQ_CUDA_L2_PREFETCH=MB: small decode passes prefetch the next
     * weights of each layer into L2 while attention runs (l2_prefetch.cu;
     * off by default until measured on the GPU) */
    const char *l2p_env = getenv("DSQ_CUDA_L2_PREFETCH");
    const long l2p_mb = l2p_env && *l2p_env ? atol(l2p_env) : 0;
    cc->l2p_bytes = l2p_mb > 0 && l2p_mb <= 1024 ? (uint64_t)l2p_mb << 20 : 0;
    const char *l2p_at = getenv("DSQ_CUDA_L2_PREFETCH_AT");
    cc->l2p_all = l2p_at && strcmp(l2p_at, "all") == 0;
    const char *env = getenv("DSQ_CUDA_GEMV_MAX"); /* measurement knob: one limit for all; 0 = cuBLASLt only */
    if (env && *env) {
        int v = atoi(env);
        v = v < 0 ? 0 : v > DSQ_GEMV_MAX_TOKENS ? DSQ_GEMV_MAX_TOKENS : v;
        cc->gemv_max_small = cc->gemv_max_gu = cc->gemv_max_head = v;
    }
    cc->max_tokens = p->max_batch_tokens;
    cc->max_bseqs = p->max_seqs < p->max_batch_tokens ? p->max_seqs : p->max_batch_tokens;
    cc->bt_max = p->kv_layout == DSQ_KV_PAGED ? c->pages.max_blocks_per_seq : 1;
    {
        int32_t stride;
        cc->n_bt_buckets = cu_bt_bucket(cc->bt_max, cc->bt_max, &stride) + 1;
    }
    cc->h_order = (int32_t *)malloc((size_t)cc->max_bseqs * sizeof(int32_t));
    cc->h_tokmap = (int32_t *)malloc((size_t)cc->max_tokens * sizeof(int32_t));
    if (!cc->h_order || !cc->h_tokmap)
        return dsq_fail(DSQ_ERR_OUT_OF_MEMORY, "no host memory for batch packing");
    cc->logit_chunk = cc->max_tokens < 128 ? cc->max_tokens : 128;

    /* KV cache: per layer k, v [rows][KV][D] (+ fp32 scales [rows][KV] for INT8) */
    const int64_t rows = p->kv_layout == DSQ_KV_PAGED ? (int64_t)c->pages.n_blocks * c->pages.block_size
                                                      : (int64_t)p->max_seqs * p->max_context;
    const int64_t esz = p->kv_dtype == DSQ_KV_INT8 ? 1 : 2;
    const int int8 = p->kv_dtype == DSQ_KV_INT8;
    cc->kv_rows = rows;
    c->kv_bytes_per_token = dsq_kv_bytes_per_token(cf, p->kv_dtype);
    size_t off = 0;
    size_t *lo = (size_t *)calloc((size_t)L * 4, sizeof(size_t));
    cc->kv = (dsq_attn_kv *)calloc((size_t)L, sizeof(dsq_attn_kv));
    if (!lo || !cc->kv) {
        free(lo);
        return dsq_fail(DSQ_ERR_OUT_OF_MEMORY, "no host memory for the KV descriptors");
    }
    for (int64_t l = 0; l < L; l++) {
        lo[l * 4 + 0] = cu_carve(&off, (size_t)(rows * KV * D * esz));
        lo[l * 4 + 1] = cu_carve(&off, (size_t)(rows * KV * D * esz));
        if (int8) {
            lo[l * 4 + 2] = cu_carve(&off, (size_t)(rows * KV) * 4);
            lo[l * 4 + 3] = cu_carve(&off, (size_t)(rows * KV) * 4);
        }
    }
    dsq_status st = device_alloc(&cc->kv_arena, off, "the KV cache");
    if (st != DSQ_OK) {
        free(lo);
        return st;
    }
    c->kv_bytes = (int64_t)off;
    for (int64_t l = 0; l < L; l++) {
        dsq_attn_kv *kv = &cc->kv[l];
        char *b = (char *)cc->kv_arena;
        kv->k = b + lo[l * 4 + 0];
        kv->v = b + lo[l * 4 + 1];
        kv->k_scale = int8 ? (float *)(b + lo[l * 4 + 2]) : NULL;
        kv->v_scale = int8 ? (float *)(b + lo[l * 4 + 3]) : NULL;
        kv->bt_stride = cc->bt_max; /* set per pass */
        kv->block_size = p->kv_layout == DSQ_KV_PAGED ? c->pages.block_size : p->max_context;
        kv->n_kv_heads = (int32_t)KV;
        kv->head_dim = (int32_t)D;
        kv->dtype = int8 ? DSQ_ATTN_KV_INT8 : DSQ_ATTN_KV_F16;
    }
    free(lo);
    /* one strided copy per KV array covers every layer when the layers sit
     * at a fixed distance (they do: equal sizes, equal alignment) */
    cc->kv_layer_pitch = L > 1 ? (size_t)((char *)cc->kv[1].k - (char *)cc->kv[0].k) : 0;
    for (int64_t l = 1; l < L && cc->kv_layer_pitch; l++) {
        const dsq_attn_kv *a = &cc->kv[l - 1], *b2 = &cc->kv[l];
        if ((size_t)((char *)b2->k - (char *)a->k) != cc->kv_layer_pitch ||
            (size_t)((char *)b2->v - (char *)a->v) != cc->kv_layer_pitch ||
            (int8 && ((size_t)((char *)b2->k_scale - (char *)a->k_scale) != cc->kv_layer_pitch ||
                      (size_t)((char *)b2->v_scale - (char *)a->v_scale) != cc->kv_layer_pitch)))
            cc->kv_layer_pitch = 0;
    }
    /* finite contents everywhere: attention tiles may load rows past a
     * sequence's end (masked to weight 0, and 0 * NaN would still be NaN) */
    /* on the context's (non-blocking) stream, so the first KV write is
     * ordered after the zeroing */
    CU_TRY(cudaMemsetAsync(cc->kv_arena, 0, (size_t)c->kv_bytes, cc->stream), "KV cache initialisation");

    /* decode workspace: the largest any batch size needs */
    cc->dec_splits_max = 1;
    cc->dec_ws_bytes = 0;
    for (int32_t n = 1; n <= cc->max_bseqs; n++) {
        int32_t s = dsq_attn_decode_splits(n, (int32_t)KV, p->max_context, cm->n_sms,
                                           int8 ? DSQ_ATTN_KV_INT8 : DSQ_ATTN_KV_F16);
        size_t b = dsq_attn_decode_workspace_bytes(n, (int32_t)H, (int32_t)D, s);
        if (s > cc->dec_splits_max)
            cc->dec_splits_max = s;
        if (b > cc->dec_ws_bytes)
            cc->dec_ws_bytes = b;
    }

    /* split-key prefill workspace: 4,096 row-splits (8 splits of a
     * 512-token chunk; 25.6 MB for the 1.5B model's 12 heads), never more
     * than 16 splits of the context's largest pass */
    {
        const int32_t budget = 4096, per = cc->max_tokens < budget ? cc->max_tokens : budget;
        int32_t ns = budget / per;
        ns = ns > 16 ? 16 : ns;
        cc->pre_ws_bytes = dsq_attn_prefill_workspace_bytes(per, (int32_t)H, (int32_t)D, ns);
    }

    /* batch metadata: tokens, pos, tok_seq [T]; cu_seqlens [S+1]; pos0, lens [S];
     * logit rows [T]; cu_seqlens of the prompt-chunk part [S+1]; block
     * tables [S][stride <= bt_max]; seq ids [S] (token history) */
    const int64_t MT = cc->max_tokens, MS = cc->max_bseqs;
    cc->meta_cap = (size_t)(4 * MT + 5 * MS + 2 + MS * cc->bt_max + 64);

    off = 0;
    size_t o_x = cu_carve(&off, (size_t)(MT * E) * 4);
    size_t o_xn = cu_carve(&off, (size_t)(MT * E) * 2);
    size_t o_qkv = cu_carve(&off, (size_t)(MT * QKV) * 4);
    size_t o_qkvb = cu_carve(&off, (size_t)(MT * QKV) * 2);
    size_t o_attn = cu_carve(&off, (size_t)(MT * H * D) * 2);
    /* gate/up's fp32 products, or any layer product of the Q8 tile path
     * (linear.cu) before its row scales: the widest of 2F, QKV, E */
    const int64_t GU = 2 * F > QKV ? (2 * F > E ? 2 * F : E) : (QKV > E ? QKV : E);
    size_t o_gu = cu_carve(&off, (size_t)(MT * GU) * 4);
    size_t o_act = cu_carve(&off, (size_t)(MT * F) * 2);
    /* a product before its residual add (LINEAR_RESID, resid_after): the
     * qkv rows are dead by then (attention read the roped bf16 copy), so
     * they serve when wide enough */
    size_t o_part = QKV >= E ? o_qkv : cu_carve(&off, (size_t)(MT * E) * 4);
    size_t o_log = cu_carve(&off, (size_t)(cc->logit_chunk * V) * 4);
    size_t o_meta = cu_carve(&off, cc->meta_cap * 4);
    size_t o_ws = cu_carve(&off, cc->dec_ws_bytes);
    size_t o_pws = cc->pre_ws_bytes ? cu_carve(&off, cc->pre_ws_bytes) : 0;
    /* gemm_rows.cu's split-K partials (16 MB; its plan for the split
     * products at 64 rows needs ~5-6 MB: qkv 10-12 splits x 64 x 2,048
     * floats, down ~13 x 64 x 1,536; it clamps to what is here) and one
     * ticket per 64-row tile of the widest product (the head); for
     * quantized products only where the model has quantized weights */
    const int any_quant = cm->wq_tile_elems > 0 || cm->lm_head.format != DSQ_WF_BF16;
    const int rows_on = cc->rows_max > 0 || (cc->qrows_max > 0 && any_quant);
    cc->rows_ws_bytes = rows_on ? (size_t)16 << 20 : 0;
    cc->rows_n_tickets = rows_on ? (int32_t)((V > 2 * F ? V : 2 * F) + 63) / 64 : 0;
    size_t o_rws = rows_on ? cu_carve(&off, cc->rows_ws_bytes) : 0;
    size_t o_rtk = rows_on ? cu_carve(&off, (size_t)cc->rows_n_tickets * 4) : 0;
    /* quantized layers: one matrix dequantized to bf16 for the cuBLASLt path */
    const int64_t wq = cm->wq_tile_elems;
    size_t o_wq = wq ? cu_carve(&off, (size_t)wq * 2) : 0;
    DSQ_TRY(device_alloc(&cc->scratch, off, "activation scratch"));
    char *b = (char *)cc->scratch;
    cc->x = (float *)(b + o_x);
    cc->xn = (dsq_bf16 *)(b + o_xn);
    cc->qkv = (float *)(b + o_qkv);
    cc->qkvb = (dsq_bf16 *)(b + o_qkvb);
    cc->attn = (dsq_bf16 *)(b + o_attn);
    cc->gu = (float *)(b + o_gu);
    cc->gu_elems = MT * GU;
    cc->act = (dsq_bf16 *)(b + o_act);
    cc->part = (float *)(b + o_part);
    cc->logits = (float *)(b + o_log);
    cc->meta = (int32_t *)(b + o_meta);
    cc->dec_ws = b + o_ws;
    cc->pre_ws = cc->pre_ws_bytes ? b + o_pws : NULL;
    cc->rows_ws = rows_on ? (float *)(b + o_rws) : NULL;
    cc->rows_tickets = rows_on ? (int32_t *)(b + o_rtk) : NULL;
    if (rows_on)
        CU_TRY(cudaMemsetAsync(cc->rows_tickets, 0, (size_t)cc->rows_n_tickets * 4, cc->stream),
               "gemm (rows) ticket initialisation");
    cc->wq_tile = wq ? (dsq_bf16 *)(b + o_wq) : NULL;
    cc->wq_tile_elems = wq;
    c->scratch_bytes = (int64_t)(off + dsq_gemm_device_bytes(cc->gemm));

    for (int i = 0; i < 2; i++) {
        DSQ_TRY(host_alloc((void **)&cc->meta_host[i], cc->meta_cap * 4, "batch metadata staging"));
        CU_TRY(cudaEventCreateWithFlags(&cc->meta_sent[i], cudaEventDisableTiming), "event creation");
    }
    DSQ_TRY(host_alloc((void **)&cc->logits_host, (size_t)(cc->logit_chunk * V) * 4, "logits staging"));
    for (int i = 0; i < COPY_PIECES; i++)
        CU_TRY(cudaEventCreateWithFlags(&cc->copied[i], cudaEventDisableTiming), "event creation");

    /* dsq_step: the device token history and the sampling rows / results */
    cc->hist_r = p->max_context < DSQ_PENALTY_MAX_N ? p->max_context : DSQ_PENALTY_MAX_N;
    {
        size_t rb = (size_t)p->max_seqs * (size_t)cc->hist_r * 4;
        DSQ_TRY(device_alloc((void **)&cc->ring, rb, "the token history"));
        CU_TRY(cudaMemsetAsync(cc->ring, 0, rb, cc->stream), "token history initialisation");
        DSQ_TRY(device_alloc((void **)&cc->srow_dev, (size_t)MS * sizeof(dsq_samp_row), "sampling parameters"));
        DSQ_TRY(device_alloc((void **)&cc->sres_dev, (size_t)MS * sizeof(dsq_samp_result), "sampling results"));
        DSQ_TRY(host_alloc((void **)&cc->srow_host, (size_t)MS * sizeof(dsq_samp_row), "sampling parameters"));
        DSQ_TRY(host_alloc((void **)&cc->sres_host, (size_t)MS * sizeof(dsq_samp_result), "sampling results"));
        CU_TRY(cudaEventCreateWithFlags(&cc->srow_sent, cudaEventDisableTiming), "event creation");
        c->scratch_bytes += (int64_t)(rb + (size_t)MS * (sizeof(dsq_samp_row) + sizeof(dsq_samp_result)));
    }

    /* knobs read once per context: docs/performance.md, "Environment knobs" */
    env = getenv("DSQ_CUDA_MIXED"); /* 0 = mixed passes all through the prefill kernel */
    cc->mixed_split = !(env && env[0] == '0');
    env = getenv("DSQ_CUDA_RESIDUAL"); /* "after": residual add after each product, not fused */
    cc->resid_after = env && strcmp(env, "after") == 0;
    env = getenv("DSQ_CUDA_DECODE_ROPE"); /* 0 = decode passes keep the RoPE + KV write kernel */
    cc->decode_rope = !(env && env[0] == '0');
    env = getenv("DSQ_CUDA_GRAPHS"); /* 0 = launch every kernel of every step */
    if (!(env && env[0] == '0')) {
        size_t ng = (size_t)cc->max_bseqs * 2 * (size_t)cc->n_bt_buckets;
        /* graphs per decode step: 1 (4 pieces measured no faster through
         * dsqwen bench at stop 30; docs/performance.md) */
        env = getenv("DSQ_CUDA_GRAPH_PIECES");
        cc->graph_pieces = env && *env ? atoi(env) : 1;
        if (cc->graph_pieces < 1 || cc->graph_pieces > DSQ_CU_GRAPH_PIECES)
            cc->graph_pieces = 1;
        cc->graphs = (cudaGraphExec_t *)calloc(ng * DSQ_CU_GRAPH_PIECES, sizeof(cudaGraphExec_t));
        cc->graph_failed = (uint8_t *)calloc(ng, 1);
        if (!cc->graphs || !cc->graph_failed)
            return dsq_fail(DSQ_ERR_OUT_OF_MEMORY, "no host memory for the decode graph table");
    }
    return DSQ_OK;
}

dsq_status cu_ctx_init(dsq_ctx *c)
{
    const cu_model *cm = (const cu_model *)c->model->be;
    if (cm->tp)
        return cu_tp_ctx_init(c);
    cu_ctx *cc = (cu_ctx *)calloc(1, sizeof *cc);
    if (!cc)
        return dsq_fail(DSQ_ERR_OUT_OF_MEMORY, "no host memory for the CUDA context state");
    cc->device = cm->device;
    c->be = cc;
    cu_device_guard g(cc->device);
    dsq_status st = g.st != DSQ_OK ? g.st : ctx_setup(c, cc);
    if (st != DSQ_OK)
        cu_ctx_free(c);
    return st;
}

