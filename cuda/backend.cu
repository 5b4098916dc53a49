/*
 * backend.cu - the CUDA backend: weight upload, per-context device state and
 * the forward pass (dsq_cuda_backend in internal.h).
 *
 * Device weights (one allocation, bf16 unless noted; E = n_embd, H/K = query
 * / KV heads, D = head_dim, F = n_ff, V = n_vocab, QKV = (H + 2K) * D):
 *   tok_embd  [V][E]
 *   per layer attn_norm fp32 [E], ffn_norm fp32 [E]
 *             wqkv [QKV][E]  = rows of q_proj, then k_proj, then v_proj
 *             bqkv fp32 [QKV] = bq | bk | bv
 *             wo   [E][H*D]
 *             wgu  [2F][E]   gate/up interleaved by rows: row 2i = gate_i,
 *                            row 2i+1 = up_i, so a GEMV block owning a row
 *                            pair can finish silu(gate)*up itself and the
 *                            GEMM path reads (gate, up) as one float2
 *             wdown [E][F]
 *   out_norm fp32 [E]; lm_head [V][E] (the tok_embd buffer when tied)
 *   inv_freq fp32 [D/2] (RoPE)
 *
 * Activations per context (T <= max_batch_tokens rows): the residual stream
 * x stays fp32 for the whole pass; matrix inputs are bf16 (xn, attn, act);
 * products write fp32 (qkv, gu, logits), bias and residual add fused.
 *
 * A forward pass enqueues everything on the context's stream; the only host
 * synchronisation is the copy of the logits (and, before packing a batch's
 * metadata, waiting for the copy out of the same pinned buffer two passes
 * ago, which has long completed in steady state).  No buffer is allocated
 * after dsq_ctx_new(); the first decode step of each batch size captures and
 * instantiates a graph, and the first product of each shape queries the
 * cuBLASLt heuristic, which may allocate inside those libraries once.
 */
#include <dlfcn.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>

#include "attention.h"
#include "internal.h"
#include "kernels.h"

#define CK(call, what)                                     \
    do {                                                   \
        dsq_status st_ = dsq_cu_status((call), (what));    \
        if (st_ != DSQ_OK)                                 \
            return st_;                                    \
    } while (0)
#define OK(expr)                        \
    do {                                \
        dsq_status st_ = (expr);        \
        if (st_ != DSQ_OK)              \
            return st_;                 \
    } while (0)

/* ---- device memory carving ------------------------------------------------- */

/* Offsets inside one allocation, each 256-byte aligned (cuBLASLt and the
 * 16-byte vector loads want aligned rows). */
static size_t carve(size_t *off, size_t bytes)
{
    size_t at = (*off + 255) & ~(size_t)255;
    *off = at + bytes;
    return at;
}

/* ---- model ----------------------------------------------------------------- */

typedef struct cu_layer {
    float *attn_norm, *ffn_norm; /* [E] */
    dsq_bf16 *wqkv;              /* [QKV][E] */
    float *bqkv;                 /* [QKV] */
    dsq_bf16 *wo;                /* [E][H*D] */
    dsq_bf16 *wgu;               /* [2F][E] interleaved gate/up rows */
    dsq_bf16 *wdown;             /* [E][F] */
} cu_layer;

typedef struct cu_model {
    int device;
    int n_sms;
    void *arena;        /* the single weight allocation */
    size_t arena_bytes;
    dsq_bf16 *tok_embd; /* [V][E] */
    dsq_bf16 *lm_head;  /* [V][E]; == tok_embd when tied */
    float *out_norm;    /* [E] */
    float *inv_freq;    /* [D/2] */
    cu_layer *layers;   /* host array [n_layers] of device pointers */
} cu_model;

/* Host staging for conversions and uploads: pinned, reused chunk by chunk. */
#define STAGE_BYTES ((size_t)32 << 20)

typedef struct uploader {
    void *stage; /* pinned [STAGE_BYTES] */
} uploader;

/* Copy a [rows][cols] tensor (any supported dtype) as bf16 to dst, whose
 * rows are dst_pitch elements apart (pitch 2*cols interleaves two tensors). */
static dsq_status upload_bf16(uploader *u, dsq_bf16 *dst, size_t dst_pitch, const dsq_tensor *t,
                              int64_t rows, int64_t cols, const char *what)
{
    if (!t->data)
        return dsq_fail(DSQ_ERR_INTERNAL, "CUDA upload: tensor %s has no data", what);
    if (dsq_tensor_numel(t) != rows * cols)
        return dsq_fail(DSQ_ERR_SHAPE, "CUDA upload: tensor %s has %lld elements, expected %lld x %lld",
                        what, (long long)dsq_tensor_numel(t), (long long)rows, (long long)cols);
    const size_t row_bytes = (size_t)cols * 2;
    int64_t chunk = (int64_t)(STAGE_BYTES / row_bytes);
    if (chunk < 1)
        return dsq_fail(DSQ_ERR_UNSUPPORTED, "CUDA upload: rows of %s (%lld values) exceed the staging buffer",
                        what, (long long)cols);
    uint16_t *st = (uint16_t *)u->stage;
    for (int64_t r0 = 0; r0 < rows; r0 += chunk) {
        int64_t n = rows - r0 < chunk ? rows - r0 : chunk;
        if (t->dtype == DSQ_DT_BF16) {
            memcpy(st, (const uint16_t *)t->data + r0 * cols, (size_t)n * row_bytes);
        } else {
            for (int64_t i = 0; i < n * cols; i++)
                st[i] = dsq_f32_to_bf16(dsq_tensor_get(t, r0 * cols + i));
        }
        CK(cudaMemcpy2D(dst + (size_t)r0 * dst_pitch, dst_pitch * 2, st, row_bytes, row_bytes, (size_t)n,
                        cudaMemcpyHostToDevice),
           "weight upload");
    }
    return DSQ_OK;
}

/* Copy n values of t (or zeros when t has no data: a checkpoint without
 * that bias) as fp32. */
static dsq_status upload_f32(uploader *u, float *dst, const dsq_tensor *t, int64_t n, const char *what)
{
    if (t->data && dsq_tensor_numel(t) != n)
        return dsq_fail(DSQ_ERR_SHAPE, "CUDA upload: tensor %s has %lld elements, expected %lld", what,
                        (long long)dsq_tensor_numel(t), (long long)n);
    if ((size_t)n * 4 > STAGE_BYTES)
        return dsq_fail(DSQ_ERR_UNSUPPORTED, "CUDA upload: vector %s too long", what);
    float *st = (float *)u->stage;
    for (int64_t i = 0; i < n; i++)
        st[i] = t->data ? dsq_tensor_get(t, i) : 0.0f;
    CK(cudaMemcpy(dst, st, (size_t)n * 4, cudaMemcpyHostToDevice), "weight upload");
    return DSQ_OK;
}

static void cu_model_free(dsq_model *m)
{
    cu_model *cm = (cu_model *)m->be;
    if (!cm)
        return;
    cudaSetDevice(cm->device);
    cudaFree(cm->arena);
    free(cm->layers);
    free(cm);
    m->be = NULL;
    m->device_bytes = 0;
}

static dsq_status upload_all(dsq_model *m, cu_model *cm, uploader *u)
{
    const dsq_config *c = &m->cfg;
    const dsq_weights *w = &m->w;
    const int64_t E = c->n_embd, H = c->n_heads, K = c->n_kv_heads, D = c->head_dim, F = c->n_ff,
                  V = c->n_vocab, L = c->n_layers;
    const int64_t QKV = (H + 2 * K) * D;
    const int tied = c->tie_embeddings || !w->lm_head.data || w->lm_head.data == w->tok_embd.data;

    /* layout */
    size_t off = 0;
    size_t o_embd = carve(&off, (size_t)(V * E) * 2);
    size_t o_head = tied ? o_embd : carve(&off, (size_t)(V * E) * 2);
    size_t o_onorm = carve(&off, (size_t)E * 4);
    size_t o_freq = carve(&off, (size_t)(D / 2) * 4);
    size_t *lo = (size_t *)calloc((size_t)L * 7, sizeof(size_t));
    if (!lo)
        return dsq_fail(DSQ_ERR_OUT_OF_MEMORY, "no host memory for the weight layout");
    for (int64_t l = 0; l < L; l++) {
        size_t *o = lo + l * 7;
        o[0] = carve(&off, (size_t)E * 4);            /* attn_norm */
        o[1] = carve(&off, (size_t)E * 4);            /* ffn_norm */
        o[2] = carve(&off, (size_t)(QKV * E) * 2);    /* wqkv */
        o[3] = carve(&off, (size_t)QKV * 4);          /* bqkv */
        o[4] = carve(&off, (size_t)(E * H * D) * 2);  /* wo */
        o[5] = carve(&off, (size_t)(2 * F * E) * 2);  /* wgu */
        o[6] = carve(&off, (size_t)(E * F) * 2);      /* wdown */
    }
    cm->arena_bytes = off;
    cudaError_t ce = cudaMalloc(&cm->arena, off);
    if (ce != cudaSuccess) {
        free(lo);
        cudaGetLastError();
        cm->arena = NULL;
        if (ce == cudaErrorMemoryAllocation)
            return dsq_fail(DSQ_ERR_DEVICE_OOM, "CUDA device %d: cannot allocate %.2f GB for the weights",
                            cm->device, (double)off / 1e9);
        return dsq_cu_status(ce, "weight allocation");
    }
    char *base = (char *)cm->arena;
    cm->tok_embd = (dsq_bf16 *)(base + o_embd);
    cm->lm_head = (dsq_bf16 *)(base + o_head);
    cm->out_norm = (float *)(base + o_onorm);
    cm->inv_freq = (float *)(base + o_freq);
    for (int64_t l = 0; l < L; l++) {
        const size_t *o = lo + l * 7;
        cu_layer *dl = &cm->layers[l];
        dl->attn_norm = (float *)(base + o[0]);
        dl->ffn_norm = (float *)(base + o[1]);
        dl->wqkv = (dsq_bf16 *)(base + o[2]);
        dl->bqkv = (float *)(base + o[3]);
        dl->wo = (dsq_bf16 *)(base + o[4]);
        dl->wgu = (dsq_bf16 *)(base + o[5]);
        dl->wdown = (dsq_bf16 *)(base + o[6]);
    }
    free(lo);

    /* contents */
    OK(upload_bf16(u, cm->tok_embd, (size_t)E, &w->tok_embd, V, E, "model.embed_tokens.weight"));
    if (!tied)
        OK(upload_bf16(u, cm->lm_head, (size_t)E, &w->lm_head, V, E, "lm_head.weight"));
    OK(upload_f32(u, cm->out_norm, &w->out_norm, E, "model.norm.weight"));
    {
        /* HF: inv_freq = 1 / theta ** (arange(0, D, 2).float() / D), all fp32 */
        float *fq = (float *)u->stage;
        for (int64_t i = 0; i < D / 2; i++)
            fq[i] = 1.0f / powf(c->rope_theta, (float)(2 * i) / (float)D);
        CK(cudaMemcpy(cm->inv_freq, fq, (size_t)(D / 2) * 4, cudaMemcpyHostToDevice), "weight upload");
    }
    /* progress by bytes placed: the arena is filled in layout order */
    OK(dsq_load_progress(m, (int64_t)((char *)(cm->inv_freq + D / 2) - base), (int64_t)off));
    for (int64_t l = 0; l < L; l++) {
        const dsq_layer_weights *lw = &w->layers[l];
        cu_layer *dl = &cm->layers[l];
        OK(upload_f32(u, dl->attn_norm, &lw->attn_norm, E, "input_layernorm.weight"));
        OK(upload_f32(u, dl->ffn_norm, &lw->ffn_norm, E, "post_attention_layernorm.weight"));
        OK(upload_bf16(u, dl->wqkv, (size_t)E, &lw->wq, H * D, E, "q_proj.weight"));
        OK(upload_bf16(u, dl->wqkv + (size_t)(H * D * E), (size_t)E, &lw->wk, K * D, E, "k_proj.weight"));
        OK(upload_bf16(u, dl->wqkv + (size_t)((H + K) * D * E), (size_t)E, &lw->wv, K * D, E, "v_proj.weight"));
        OK(upload_f32(u, dl->bqkv, &lw->bq, H * D, "q_proj.bias"));
        OK(upload_f32(u, dl->bqkv + H * D, &lw->bk, K * D, "k_proj.bias"));
        OK(upload_f32(u, dl->bqkv + (H + K) * D, &lw->bv, K * D, "v_proj.bias"));
        OK(upload_bf16(u, dl->wo, (size_t)(H * D), &lw->wo, E, H * D, "o_proj.weight"));
        OK(upload_bf16(u, dl->wgu, (size_t)(2 * E), &lw->w_gate, F, E, "gate_proj.weight"));
        OK(upload_bf16(u, dl->wgu + E, (size_t)(2 * E), &lw->w_up, F, E, "up_proj.weight"));
        OK(upload_bf16(u, dl->wdown, (size_t)F, &lw->w_down, E, F, "down_proj.weight"));
        OK(dsq_load_progress(m, (int64_t)((char *)(dl->wdown + E * F) - base), (int64_t)off));
    }
    return DSQ_OK;
}

/* Refuse non-finite weights, naming the tensor: one device flag per tensor,
 * set by a check of its uploaded copy (so values that overflowed bf16 count
 * too), read back with one copy.  Runs on the legacy default stream, after
 * the synchronous uploads. */
static dsq_status check_finite(const dsq_model *m, const cu_model *cm)
{
    const dsq_config *c = &m->cfg;
    const int64_t E = c->n_embd, H = c->n_heads, K = c->n_kv_heads, D = c->head_dim, F = c->n_ff,
                  V = c->n_vocab, L = c->n_layers;
    typedef struct region {
        const void *p;
        int eb;                    /* 2: bf16, 4: fp32 */
        int64_t rows, cols, pitch; /* elements */
        char name[96];
    } region;
    const int n_max = 3 + 12 * (int)L;
    region *rg = (region *)calloc((size_t)n_max, sizeof *rg);
    uint32_t *hf = (uint32_t *)calloc((size_t)n_max, sizeof *hf);
    uint32_t *df = NULL;
    dsq_status st = DSQ_OK;
    int n = 0;
    if (!rg || !hf) {
        st = dsq_fail(DSQ_ERR_OUT_OF_MEMORY, "no host memory for the non-finite weight check");
        goto done;
    }
#define REGION(ptr, elem, r, cl, pt, ...)                               \
    do {                                                               \
        region *g_ = &rg[n++];                                         \
        g_->p = (ptr), g_->eb = (elem), g_->rows = (r), g_->cols = (cl); \
        g_->pitch = (pt);                                              \
        snprintf(g_->name, sizeof g_->name, __VA_ARGS__);              \
    } while (0)
    REGION(cm->tok_embd, 2, V, E, E, "model.embed_tokens.weight");
    if (cm->lm_head != cm->tok_embd)
        REGION(cm->lm_head, 2, V, E, E, "lm_head.weight");
    REGION(cm->out_norm, 4, 1, E, E, "model.norm.weight");
    for (int64_t l = 0; l < L; l++) {
        const cu_layer *dl = &cm->layers[l];
        const int li = (int)l;
        REGION(dl->attn_norm, 4, 1, E, E, "model.layers.%d.input_layernorm.weight", li);
        REGION(dl->wqkv, 2, H * D, E, E, "model.layers.%d.self_attn.q_proj.weight", li);
        REGION(dl->wqkv + (size_t)(H * D * E), 2, K * D, E, E, "model.layers.%d.self_attn.k_proj.weight", li);
        REGION(dl->wqkv + (size_t)((H + K) * D * E), 2, K * D, E, E, "model.layers.%d.self_attn.v_proj.weight", li);
        REGION(dl->bqkv, 4, 1, H * D, H * D, "model.layers.%d.self_attn.q_proj.bias", li);
        REGION(dl->bqkv + H * D, 4, 1, K * D, K * D, "model.layers.%d.self_attn.k_proj.bias", li);
        REGION(dl->bqkv + (H + K) * D, 4, 1, K * D, K * D, "model.layers.%d.self_attn.v_proj.bias", li);
        REGION(dl->wo, 2, E, H * D, H * D, "model.layers.%d.self_attn.o_proj.weight", li);
        REGION(dl->ffn_norm, 4, 1, E, E, "model.layers.%d.post_attention_layernorm.weight", li);
        REGION(dl->wgu, 2, F, E, 2 * E, "model.layers.%d.mlp.gate_proj.weight", li);
        REGION(dl->wgu + E, 2, F, E, 2 * E, "model.layers.%d.mlp.up_proj.weight", li);
        REGION(dl->wdown, 2, E, F, F, "model.layers.%d.mlp.down_proj.weight", li);
    }
#undef REGION
    if ((st = dsq_cu_status(cudaMalloc(&df, (size_t)n * sizeof *df), "non-finite check flags")) != DSQ_OK) {
        df = NULL;
        goto done;
    }
    if ((st = dsq_cu_status(cudaMemset(df, 0, (size_t)n * sizeof *df), "non-finite check flags")) != DSQ_OK)
        goto done;
    for (int i = 0; i < n && st == DSQ_OK; i++)
        st = dsq_cu_flag_nonfinite(rg[i].p, rg[i].eb, rg[i].rows, rg[i].cols, rg[i].pitch, df + i, 0);
    if (st != DSQ_OK)
        goto done;
    if ((st = dsq_cu_status(cudaMemcpy(hf, df, (size_t)n * sizeof *df, cudaMemcpyDeviceToHost),
                            "non-finite weight check")) != DSQ_OK)
        goto done;
    for (int i = 0; i < n; i++)
        if (hf[i]) {
            st = dsq_fail(DSQ_ERR_FORMAT,
                          "tensor '%s' holds a non-finite value (NaN or Inf) as uploaded (%s); the "
                          "checkpoint is corrupt (set dsq_model_params.skip_finite_check to load it "
                          "anyway)",
                          rg[i].name, rg[i].eb == 2 ? "bf16" : "fp32");
            break;
        }
done:
    if (df)
        cudaFree(df);
    free(hf);
    free(rg);
    return st;
}

static dsq_status cu_model_load(dsq_model *m, const dsq_model_params *p)
{
    int count = 0;
    cudaError_t ce = cudaGetDeviceCount(&count);
    if (ce != cudaSuccess || count < 1) {
        cudaGetLastError();
        return dsq_fail(DSQ_ERR_NO_DEVICE, "no usable CUDA device (%s)",
                        ce != cudaSuccess ? cudaGetErrorString(ce) : "device count is 0");
    }
    if (p->device < 0 || p->device >= count)
        return dsq_fail(DSQ_ERR_NO_DEVICE, "params.device = %d, but only CUDA devices 0..%d exist",
                        p->device, count - 1);
    const dsq_config *c = &m->cfg;
    if (c->head_dim % 2 != 0)
        return dsq_fail(DSQ_ERR_UNSUPPORTED, "CUDA backend: head_dim %d must be even", c->head_dim);
    CK(cudaSetDevice(p->device), "cudaSetDevice");

    cu_model *cm = (cu_model *)calloc(1, sizeof *cm);
    if (!cm)
        return dsq_fail(DSQ_ERR_OUT_OF_MEMORY, "no host memory for the CUDA model state");
    cm->device = p->device;
    cm->layers = (cu_layer *)calloc((size_t)c->n_layers, sizeof(cu_layer));
    if (!cm->layers) {
        free(cm);
        return dsq_fail(DSQ_ERR_OUT_OF_MEMORY, "no host memory for the CUDA model state");
    }
    m->be = cm;
    dsq_status st = dsq_cu_status(cudaDeviceGetAttribute(&cm->n_sms, cudaDevAttrMultiProcessorCount, p->device),
                                  "device query");
    uploader u = {NULL};
    if (st == DSQ_OK) {
        ce = cudaMallocHost(&u.stage, STAGE_BYTES);
        if (ce != cudaSuccess) {
            cudaGetLastError();
            u.stage = NULL;
            st = dsq_fail(DSQ_ERR_OUT_OF_MEMORY, "cannot allocate %zu MB of pinned host staging memory (%s)",
                          STAGE_BYTES >> 20, cudaGetErrorString(ce));
        }
    }
    if (st == DSQ_OK)
        st = upload_all(m, cm, &u);
    if (st == DSQ_OK && !p->skip_finite_check)
        st = check_finite(m, cm);
    if (u.stage)
        cudaFreeHost(u.stage);
    if (st != DSQ_OK) {
        cu_model_free(m);
        return st;
    }
    m->device_bytes = (int64_t)cm->arena_bytes;
    /* Everything lives on the GPU now: drop the mapping (m->w's views become
     * invalid; api.c only frees the layer array they sit in). */
    dsq_st_close(m->st);
    m->st = NULL;
    return DSQ_OK;
}

/* ---- context --------------------------------------------------------------- */

#define COPY_PIECES 8

typedef struct cu_ctx {
    int device;
    cudaStream_t stream;
    dsq_gemm *gemm;
    /* products with <= this many rows use the GEMV kernel, else cuBLASLt
     * (crossovers measured on the H200 by test_cuda_kernels' timing table):
     * the small matrices (qkv, o, down), the wide gate/up, the lm_head */
    int32_t gemv_max_small, gemv_max_gu, gemv_max_head;
    int32_t max_tokens;    /* max_batch_tokens */
    int32_t max_bseqs;     /* sequences one batch may hold: min(max_seqs, max_tokens) */
    int32_t bt_max;        /* longest block-table row (static: 1) */
    int32_t n_bt_buckets;  /* block-table strides a pass may use: 1, 2, 4, .., bt_max */
    int32_t *h_order;      /* host [max_bseqs]: batch order of a pass (decode rows first) */
    int32_t *h_tokmap;     /* host [max_tokens]: caller's token index -> pass row */
    size_t kv_layer_pitch; /* bytes between layers of each KV array, 0 if not uniform */
    int mixed_split;       /* mixed passes split decode / prefill attention (DSQ_CUDA_MIXED=0: no) */
    int32_t logit_chunk;   /* rows of logits computed and copied at once */
    int32_t dec_splits_max;

    void *kv_arena;        /* the whole KV cache */
    dsq_attn_kv *kv;       /* host [n_layers]; block_table set per pass */

    void *scratch;         /* one allocation carved into: */
    float *x;              /* [max_tokens][E] residual stream */
    dsq_bf16 *xn;          /* [max_tokens][E] normalised rows */
    float *qkv;            /* [max_tokens][QKV] q|k|v products, bias added */
    dsq_bf16 *qkvb;        /* [max_tokens][QKV] same after RoPE, bf16 */
    dsq_bf16 *attn;        /* [max_tokens][H*D] attention output */
    float *gu;             /* [max_tokens][2F] gate/up products (GEMM path) */
    dsq_bf16 *act;         /* [max_tokens][F] silu(gate)*up */
    float *logits;         /* [logit_chunk][V] */
    int32_t *meta;         /* [meta_cap] this pass's batch description */
    void *dec_ws;          /* flash-decoding partials */
    size_t dec_ws_bytes;
    size_t meta_cap;       /* int32 elements */

    int32_t *meta_host[2]; /* pinned [meta_cap], alternating between passes */
    cudaEvent_t meta_sent[2];
    int meta_slot;
    float *logits_host;    /* pinned [logit_chunk][V] */
    cudaEvent_t copied[COPY_PIECES]; /* logits pieces that reached logits_host */
    int pinned_out;        /* this pass's logits buffer is page-locked host memory */

    /* decode-step graphs, [max_bseqs][2][n_bt_buckets] by (batch size,
     * logits wanted, block-table stride); NULL when graphs are off
     * (DSQ_CUDA_GRAPHS=0) */
    cudaGraphExec_t *graphs;
    uint8_t *graph_failed;

    /* dsq_step sampling (cuda/sampling.cu) */
    int32_t *ring;         /* [max_seqs][hist_r] last hist_r tokens of each
                              sequence: position p at p % hist_r */
    int32_t hist_r;        /* min(DSQ_PENALTY_MAX_N, max_context) */
    dsq_samp_row *srow_dev, *srow_host;       /* [max_bseqs]; host pinned */
    dsq_samp_result *sres_dev, *sres_host;    /* [max_bseqs]; host pinned */
    cudaEvent_t srow_sent; /* the upload out of srow_host finished */
} cu_ctx;

static void cu_ctx_free(dsq_ctx *c)
{
    cu_ctx *cc = (cu_ctx *)c->be;
    if (!cc)
        return;
    cudaSetDevice(cc->device);
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
        for (int32_t i = 0; i < 2 * cc->max_bseqs * cc->n_bt_buckets; i++)
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

/* Block-table stride for a pass whose longest sequence needs `need`
 * blocks: the next power of two (at most bt_max), so that a pass uploads
 * only the rows' used part while decode graphs, which bake the stride in,
 * stay few (one per power of two).  Returns the bucket index. */
static int32_t bt_bucket(int32_t need, int32_t bt_max, int32_t *stride)
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
    const int64_t E = cf->n_embd, H = cf->n_heads, K = cf->n_kv_heads, D = cf->head_dim, F = cf->n_ff,
                  V = cf->n_vocab, L = cf->n_layers;
    const int64_t QKV = (H + 2 * K) * D;
    const dsq_ctx_params *p = &c->p;

    if (p->kv_dtype != DSQ_KV_F16 && p->kv_dtype != DSQ_KV_INT8)
        return dsq_fail(DSQ_ERR_UNSUPPORTED, "the CUDA backend stores the KV cache as F16 or INT8; "
                        "kv_dtype %d (F32) is CPU-only", p->kv_dtype);
    if (D != 128 && D != 64)
        return dsq_fail(DSQ_ERR_UNSUPPORTED, "CUDA attention supports head_dim 128 or 64, not %lld", (long long)D);
    if (H % K != 0)
        return dsq_fail(DSQ_ERR_UNSUPPORTED, "CUDA attention needs n_heads %% n_kv_heads == 0 (%lld, %lld)",
                        (long long)H, (long long)K);

    CK(cudaSetDevice(cc->device), "cudaSetDevice");
    CK(cudaStreamCreateWithFlags(&cc->stream, cudaStreamNonBlocking), "stream creation");
    CK(dsq_attn_init(), "attention kernel setup");
    OK(dsq_gemm_create((size_t)32 << 20, &cc->gemm));

    /* H200, 1.5B shapes (us per call, GEMV vs cuBLASLt): qkv/o/down win up
     * to 8 rows (qkv T=8 5.9 vs 12.5, down T=8 13.0 vs 16.7); gate/up up to
     * 2 (T=2 16.3 vs 18.0, T=4 19.0 vs 18.3); lm_head up to 2 (T=1 104.5 vs
     * 110.1, T=4 128 vs 112) */
    cc->gemv_max_small = 8;
    cc->gemv_max_gu = 2;
    cc->gemv_max_head = 2;
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
        cc->n_bt_buckets = bt_bucket(cc->bt_max, cc->bt_max, &stride) + 1;
    }
    cc->h_order = (int32_t *)malloc((size_t)cc->max_bseqs * sizeof(int32_t));
    cc->h_tokmap = (int32_t *)malloc((size_t)cc->max_tokens * sizeof(int32_t));
    if (!cc->h_order || !cc->h_tokmap)
        return dsq_fail(DSQ_ERR_OUT_OF_MEMORY, "no host memory for batch packing");
    cc->logit_chunk = cc->max_tokens < 128 ? cc->max_tokens : 128;

    /* KV cache: per layer k, v [rows][K][D] (+ fp32 scales [rows][K] for INT8) */
    const int64_t rows = p->kv_layout == DSQ_KV_PAGED ? (int64_t)c->pages.n_blocks * c->pages.block_size
                                                      : (int64_t)p->max_seqs * p->max_context;
    const int64_t esz = p->kv_dtype == DSQ_KV_INT8 ? 1 : 2;
    const int int8 = p->kv_dtype == DSQ_KV_INT8;
    c->kv_bytes_per_token = L * 2 * K * (D * esz + (int8 ? 4 : 0));
    size_t off = 0;
    size_t *lo = (size_t *)calloc((size_t)L * 4, sizeof(size_t));
    cc->kv = (dsq_attn_kv *)calloc((size_t)L, sizeof(dsq_attn_kv));
    if (!lo || !cc->kv) {
        free(lo);
        return dsq_fail(DSQ_ERR_OUT_OF_MEMORY, "no host memory for the KV descriptors");
    }
    for (int64_t l = 0; l < L; l++) {
        lo[l * 4 + 0] = carve(&off, (size_t)(rows * K * D * esz));
        lo[l * 4 + 1] = carve(&off, (size_t)(rows * K * D * esz));
        if (int8) {
            lo[l * 4 + 2] = carve(&off, (size_t)(rows * K) * 4);
            lo[l * 4 + 3] = carve(&off, (size_t)(rows * K) * 4);
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
        kv->n_kv_heads = (int32_t)K;
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
    CK(cudaMemsetAsync(cc->kv_arena, 0, (size_t)c->kv_bytes, cc->stream), "KV cache initialisation");

    /* decode workspace: the largest any batch size needs */
    cc->dec_splits_max = 1;
    cc->dec_ws_bytes = 0;
    for (int32_t n = 1; n <= cc->max_bseqs; n++) {
        int32_t s = dsq_attn_decode_splits(n, (int32_t)K, p->max_context, cm->n_sms);
        size_t b = dsq_attn_decode_workspace_bytes(n, (int32_t)H, (int32_t)D, s);
        if (s > cc->dec_splits_max)
            cc->dec_splits_max = s;
        if (b > cc->dec_ws_bytes)
            cc->dec_ws_bytes = b;
    }

    /* batch metadata: tokens, pos, tok_seq [T]; cu_seqlens [S+1]; pos0, lens [S];
     * logit rows [T]; cu_seqlens of the prompt-chunk part [S+1]; block
     * tables [S][stride <= bt_max]; seq ids [S] (token history) */
    const int64_t MT = cc->max_tokens, MS = cc->max_bseqs;
    cc->meta_cap = (size_t)(4 * MT + 5 * MS + 2 + MS * cc->bt_max + 64);

    off = 0;
    size_t o_x = carve(&off, (size_t)(MT * E) * 4);
    size_t o_xn = carve(&off, (size_t)(MT * E) * 2);
    size_t o_qkv = carve(&off, (size_t)(MT * QKV) * 4);
    size_t o_qkvb = carve(&off, (size_t)(MT * QKV) * 2);
    size_t o_attn = carve(&off, (size_t)(MT * H * D) * 2);
    size_t o_gu = carve(&off, (size_t)(MT * 2 * F) * 4);
    size_t o_act = carve(&off, (size_t)(MT * F) * 2);
    size_t o_log = carve(&off, (size_t)(cc->logit_chunk * V) * 4);
    size_t o_meta = carve(&off, cc->meta_cap * 4);
    size_t o_ws = carve(&off, cc->dec_ws_bytes);
    OK(device_alloc(&cc->scratch, off, "activation scratch"));
    char *b = (char *)cc->scratch;
    cc->x = (float *)(b + o_x);
    cc->xn = (dsq_bf16 *)(b + o_xn);
    cc->qkv = (float *)(b + o_qkv);
    cc->qkvb = (dsq_bf16 *)(b + o_qkvb);
    cc->attn = (dsq_bf16 *)(b + o_attn);
    cc->gu = (float *)(b + o_gu);
    cc->act = (dsq_bf16 *)(b + o_act);
    cc->logits = (float *)(b + o_log);
    cc->meta = (int32_t *)(b + o_meta);
    cc->dec_ws = b + o_ws;
    c->scratch_bytes = (int64_t)(off + dsq_gemm_device_bytes(cc->gemm));

    for (int i = 0; i < 2; i++) {
        OK(host_alloc((void **)&cc->meta_host[i], cc->meta_cap * 4, "batch metadata staging"));
        CK(cudaEventCreateWithFlags(&cc->meta_sent[i], cudaEventDisableTiming), "event creation");
    }
    OK(host_alloc((void **)&cc->logits_host, (size_t)(cc->logit_chunk * V) * 4, "logits staging"));
    for (int i = 0; i < COPY_PIECES; i++)
        CK(cudaEventCreateWithFlags(&cc->copied[i], cudaEventDisableTiming), "event creation");

    /* dsq_step: the device token history and the sampling rows / results */
    cc->hist_r = p->max_context < DSQ_PENALTY_MAX_N ? p->max_context : DSQ_PENALTY_MAX_N;
    {
        size_t rb = (size_t)p->max_seqs * (size_t)cc->hist_r * 4;
        OK(device_alloc((void **)&cc->ring, rb, "the token history"));
        CK(cudaMemsetAsync(cc->ring, 0, rb, cc->stream), "token history initialisation");
        OK(device_alloc((void **)&cc->srow_dev, (size_t)MS * sizeof(dsq_samp_row), "sampling parameters"));
        OK(device_alloc((void **)&cc->sres_dev, (size_t)MS * sizeof(dsq_samp_result), "sampling results"));
        OK(host_alloc((void **)&cc->srow_host, (size_t)MS * sizeof(dsq_samp_row), "sampling parameters"));
        OK(host_alloc((void **)&cc->sres_host, (size_t)MS * sizeof(dsq_samp_result), "sampling results"));
        CK(cudaEventCreateWithFlags(&cc->srow_sent, cudaEventDisableTiming), "event creation");
        c->scratch_bytes += (int64_t)(rb + (size_t)MS * (sizeof(dsq_samp_row) + sizeof(dsq_samp_result)));
    }

    env = getenv("DSQ_CUDA_MIXED"); /* measurement knob: 0 = mixed passes all through the prefill kernel */
    cc->mixed_split = !(env && env[0] == '0');
    env = getenv("DSQ_CUDA_GRAPHS"); /* 0 = launch every kernel of every step */
    if (!(env && env[0] == '0')) {
        size_t ng = (size_t)cc->max_bseqs * 2 * (size_t)cc->n_bt_buckets;
        cc->graphs = (cudaGraphExec_t *)calloc(ng, sizeof(cudaGraphExec_t));
        cc->graph_failed = (uint8_t *)calloc(ng, 1);
        if (!cc->graphs || !cc->graph_failed)
            return dsq_fail(DSQ_ERR_OUT_OF_MEMORY, "no host memory for the decode graph table");
    }
    return DSQ_OK;
}

static dsq_status cu_ctx_init(dsq_ctx *c)
{
    const cu_model *cm = (const cu_model *)c->model->be;
    cu_ctx *cc = (cu_ctx *)calloc(1, sizeof *cc);
    if (!cc)
        return dsq_fail(DSQ_ERR_OUT_OF_MEMORY, "no host memory for the CUDA context state");
    cc->device = cm->device;
    c->be = cc;
    dsq_status st = ctx_setup(c, cc);
    if (st != DSQ_OK)
        cu_ctx_free(c);
    return st;
}

/* ---- forward ------------------------------------------------------------------ */

/* y = epilogue(x W^T): GEMV for few rows, cuBLASLt otherwise.  SILU_MUL
 * writes bf16 act [T][N/2] (through gu on the GEMM path). */
static dsq_status linear(cu_ctx *cc, const dsq_bf16 *x, const dsq_bf16 *w, const float *bias, int32_t T,
                         int32_t N, int32_t K, dsq_epilogue epi, void *y, int32_t gemv_max)
{
    if (T <= gemv_max)
        return dsq_cu_gemv(x, w, bias, T, N, K, epi, y, cc->stream);
    if (epi == DSQ_EPI_SILU_MUL) {
        OK(dsq_gemm_run(cc->gemm, x, w, NULL, T, N, K, DSQ_EPI_STORE, cc->gu, cc->stream));
        return dsq_cu_silu_mul(cc->gu, T, N / 2, (dsq_bf16 *)y, cc->stream);
    }
    return dsq_gemm_run(cc->gemm, x, w, bias, T, N, K, epi, (float *)y, cc->stream);
}

/* One pass's shape and the device addresses of its metadata (fixed for a
 * given shape, which is what lets a decode step be replayed from a graph). */
typedef struct pass {
    int32_t T, S, NL, max_q, decode, splits;
    int32_t nd;        /* mixed pass: the first nd sequences (rows 0..nd-1) bring one
                          token each and use the decode kernel; the rest the prefill
                          kernel (max_q over those).  0 otherwise. */
    int32_t bt_stride, bt_key;
    const int32_t *tok, *pos, *tseq, *cu, *pos0, *len, *lrow, *bt, *sid;
    const int32_t *cu_pre; /* [S-nd+1] cu_seqlens of the prefill part, from 0 */
} pass;

/* Everything from the embedding to the first chunk of logits (into
 * cc->logits), on the context's stream; no host synchronisation. */
static dsq_status enqueue_pass(dsq_ctx *c, const pass *p)
{
    cu_ctx *cc = (cu_ctx *)c->be;
    const dsq_model *m = c->model;
    const cu_model *cm = (const cu_model *)m->be;
    const dsq_config *cf = &m->cfg;
    const int32_t E = cf->n_embd, H = cf->n_heads, K = cf->n_kv_heads, D = cf->head_dim, F = cf->n_ff,
                  V = cf->n_vocab, L = cf->n_layers;
    const int32_t QKV = (H + 2 * K) * D, T = p->T;
    cudaStream_t s = cc->stream;

    OK(dsq_cu_hist_scatter(cc->ring, cc->hist_r, p->tok, p->pos, p->tseq, p->sid, T, s));
    OK(dsq_cu_embed(cm->tok_embd, p->tok, T, E, cc->x, s));
    const dsq_bf16 *q = cc->qkvb, *k = cc->qkvb + (size_t)H * D, *v = cc->qkvb + (size_t)(H + K) * D;
    for (int32_t l = 0; l < L; l++) {
        const cu_layer *w = &cm->layers[l];
        dsq_attn_kv kv = cc->kv[l];
        kv.block_table = p->bt;
        kv.bt_stride = p->bt_stride;
        OK(dsq_cu_rmsnorm(cc->x, NULL, T, E, w->attn_norm, cf->rms_eps, cc->xn, s));
        OK(linear(cc, cc->xn, w->wqkv, w->bqkv, T, QKV, E, DSQ_EPI_BIAS, cc->qkv, cc->gemv_max_small));
        OK(dsq_cu_rope(cc->qkv, QKV, p->pos, T, H + K, H + 2 * K, D, cm->inv_freq, cc->qkvb, s));
        CK(dsq_attn_kv_write(&kv, k, QKV, v, QKV, p->tseq, p->pos, T, s), "KV cache write");
        if (p->decode) {
            CK(dsq_attn_decode(&kv, q, QKV, cc->attn, (int64_t)H * D, p->len, p->S, H, p->splits, cc->dec_ws,
                               cc->dec_ws_bytes, s),
               "decode attention");
        } else {
            /* mixed: one-token rows in front through the decode kernel
             * (split over the context), prompt chunks through the prefill
             * kernel; the products above and below ran once over all rows */
            const int32_t nd = p->nd;
            if (nd > 0)
                CK(dsq_attn_decode(&kv, q, QKV, cc->attn, (int64_t)H * D, p->len, nd, H, p->splits, cc->dec_ws,
                                   cc->dec_ws_bytes, s),
                   "decode attention");
            dsq_attn_kv kc = kv;
            kc.block_table = p->bt + (size_t)nd * p->bt_stride;
            CK(dsq_attn_prefill(&kc, q + (size_t)nd * QKV, QKV, cc->attn + (size_t)nd * H * D, (int64_t)H * D,
                                p->cu_pre, p->pos0 + nd, p->S - nd, p->max_q, H, s),
               "prefill attention");
        }
        OK(linear(cc, cc->attn, w->wo, NULL, T, E, H * D, DSQ_EPI_ADD, cc->x, cc->gemv_max_small));
        OK(dsq_cu_rmsnorm(cc->x, NULL, T, E, w->ffn_norm, cf->rms_eps, cc->xn, s));
        OK(linear(cc, cc->xn, w->wgu, NULL, T, 2 * F, E, DSQ_EPI_SILU_MUL, cc->act, cc->gemv_max_gu));
        OK(linear(cc, cc->act, w->wdown, NULL, T, E, F, DSQ_EPI_ADD, cc->x, cc->gemv_max_small));
    }
    if (p->NL == 0)
        return DSQ_OK;
    /* head: final norm of the wanted rows only, then the first chunk of lm_head */
    OK(dsq_cu_rmsnorm(cc->x, p->lrow, p->NL, E, cm->out_norm, cf->rms_eps, cc->xn, s));
    int32_t n = p->NL < cc->logit_chunk ? p->NL : cc->logit_chunk;
    return linear(cc, cc->xn, cm->lm_head, NULL, n, V, E, DSQ_EPI_STORE, cc->logits, cc->gemv_max_head);
}

/* Decode steps (one token per sequence, all logits in one chunk) replay a
 * CUDA graph captured on first use of that batch size: a step is then one
 * launch instead of ~300.  A capture that fails (e.g. a library call that
 * refuses capture) marks the shape and the step runs eagerly. */
static dsq_status run_pass(dsq_ctx *c, const pass *p)
{
    cu_ctx *cc = (cu_ctx *)c->be;
    /* (a pass with more logit rows than one chunk captures its first chunk;
     * cu_forward / cu_step compute the rest after the graph) */
    if (!cc->graphs || !p->decode)
        return enqueue_pass(c, p);
    const int32_t key = ((p->S - 1) * 2 + (p->NL > 0)) * cc->n_bt_buckets + p->bt_key;
    if (!cc->graphs[key] && !cc->graph_failed[key]) {
        cudaGraph_t g = NULL;
        cudaGraphExec_t ge = NULL;
        cudaError_t bc = cudaStreamBeginCapture(cc->stream, cudaStreamCaptureModeThreadLocal);
        if (bc != cudaSuccess) { /* no graph for this shape: run it eagerly from now on */
            cudaGetLastError();
            cc->graph_failed[key] = 1;
            dsq_log(DSQ_LOG_WARN, "CUDA graph capture could not start (%s); %d-sequence decode steps run eagerly",
                    cudaGetErrorString(bc), p->S);
            return enqueue_pass(c, p);
        }
        dsq_status st = enqueue_pass(c, p);
        cudaError_t ce = cudaStreamEndCapture(cc->stream, &g);
        if (st == DSQ_OK && ce == cudaSuccess && g)
            ce = cudaGraphInstantiate(&ge, g, 0);
        if (g)
            cudaGraphDestroy(g);
        if (st == DSQ_OK && ce == cudaSuccess && ge) {
            cc->graphs[key] = ge;
        } else {
            cudaGetLastError();
            cc->graph_failed[key] = 1;
            dsq_log(DSQ_LOG_WARN, "CUDA graph capture of a %d-sequence decode step failed (%s); running it eagerly",
                    p->S, st != DSQ_OK ? dsq_last_error_message() : cudaGetErrorString(ce));
        }
    }
    if (cc->graphs[key])
        return dsq_cu_status(cudaGraphLaunch(cc->graphs[key], cc->stream), "graph launch");
    return enqueue_pass(c, p);
}

/* Pack the batch description, upload it and enqueue (or replay) the pass
 * with NL logit rows; the first chunk of logits ends in cc->logits. */
static dsq_status launch_forward(dsq_ctx *c, const dsq_batch *bt, int32_t NL)
{
    cu_ctx *cc = (cu_ctx *)c->be;
    const dsq_model *m = c->model;
    const cu_model *cm = (const cu_model *)m->be;
    const dsq_config *cf = &m->cfg;
    const int32_t K = cf->n_kv_heads;
    const int32_t T = bt->n_tokens, S = bt->n_seqs;
    cudaStream_t s = cc->stream;

    if (T < 1 || T > cc->max_tokens || S < 1 || S > cc->max_bseqs || NL < 0 || NL > T)
        return dsq_fail(DSQ_ERR_INTERNAL, "CUDA forward: batch of %d tokens / %d sequences / %d logit rows "
                        "outside this context's limits (%d tokens, %d sequences)", T, S, NL, cc->max_tokens, cc->max_bseqs);
    CK(cudaSetDevice(cc->device), "cudaSetDevice");

    /* ---- pack the batch description into pinned memory, one upload ---- */
    const int slot = cc->meta_slot;
    cc->meta_slot ^= 1;
    CK(cudaEventSynchronize(cc->meta_sent[slot]), "waiting for the metadata buffer");
    int32_t *h = cc->meta_host[slot];
    const int paged = c->p.kv_layout == DSQ_KV_PAGED;
    pass p;
    memset(&p, 0, sizeof p);
    p.T = T;
    p.S = S;
    p.NL = NL;
    /* Order: as given, except that a pass mixing one-token sequences with
     * prompt chunks puts the one-token ones first (the decode kernel takes
     * rows 0..nd-1).  need: blocks of the longest sequence after the pass. */
    int32_t nd = 0, need = 1;
    for (int32_t i = 0; i < S; i++) {
        int32_t n = bt->seq_start[i + 1] - bt->seq_start[i];
        nd += n == 1;
        if (paged) {
            int32_t nb = c->pages.n_seq_blocks[bt->seq_ids[i]];
            need = nb > need ? nb : need;
        }
    }
    p.decode = nd == S;
    const int mixed = nd > 0 && nd < S && cc->mixed_split;
    int32_t *ord = cc->h_order;
    if (mixed) {
        int32_t j = 0;
        for (int32_t i = 0; i < S; i++)
            if (bt->seq_start[i + 1] - bt->seq_start[i] == 1)
                ord[j++] = i;
        for (int32_t i = 0; i < S; i++)
            if (bt->seq_start[i + 1] - bt->seq_start[i] != 1)
                ord[j++] = i;
        p.nd = nd;
    } else {
        for (int32_t i = 0; i < S; i++)
            ord[i] = i;
    }
    p.bt_key = bt_bucket(need, cc->bt_max, &p.bt_stride);
    const size_t o_tok = 0, o_pos = (size_t)T, o_tseq = 2 * (size_t)T, o_cu = 3 * (size_t)T,
                 o_pos0 = o_cu + S + 1, o_len = o_pos0 + S, o_lrow = o_len + S, o_cupre = o_lrow + T,
                 o_bt = o_cupre + S + 1;
    const size_t o_sid = o_bt + (size_t)S * p.bt_stride;
    const size_t n_meta = o_sid + (size_t)S;
    int32_t row = 0;
    for (int32_t j = 0; j < S; j++) {
        const int32_t i = ord[j], a = bt->seq_start[i], n = bt->seq_start[i + 1] - a;
        h[o_cu + j] = row;
        h[o_pos0 + j] = bt->seq_pos0[i];
        h[o_len + j] = bt->seq_pos0[i] + n;
        h[o_sid + j] = bt->seq_ids[i]; /* the history scatter's row of this sequence */
        if (j >= p.nd) {
            h[o_cupre + j - p.nd] = row - p.nd;
            if (n > p.max_q)
                p.max_q = n;
        }
        for (int32_t t = a; t < a + n; t++, row++) {
            h[o_tok + row] = bt->tokens[t];
            h[o_pos + row] = bt->pos[t];
            h[o_tseq + row] = j;
            cc->h_tokmap[t] = row;
        }
        /* only the blocks this sequence uses: the kernels never look past
         * a sequence's length */
        if (paged)
            memcpy(h + o_bt + (size_t)j * p.bt_stride, c->pages.rows[bt->seq_ids[i]],
                   (size_t)c->pages.n_seq_blocks[bt->seq_ids[i]] * 4);
        else
            h[o_bt + j] = bt->seq_ids[i];
    }
    h[o_cu + S] = row;
    h[o_cupre + S - p.nd] = row - p.nd;
    for (int32_t k = 0; k < NL; k++)
        h[o_lrow + k] = cc->h_tokmap[bt->logit_rows[k]];
    /* A decode graph bakes in its number of logit rows but is keyed only by
     * (batch size, any logits, block-table width): with graphs on, a decode
     * pass wanting some rows computes all S (the extra rows, row 0 again,
     * are never read), so a graph captured for fewer rows is never replayed
     * for more. */
    if (cc->graphs && p.decode && NL > 0 && NL < S) {
        for (int32_t k = NL; k < S; k++)
            h[o_lrow + k] = 0;
        p.NL = S;
    }
    CK(cudaMemcpyAsync(cc->meta, h, n_meta * 4, cudaMemcpyHostToDevice, s), "batch metadata upload");
    CK(cudaEventRecord(cc->meta_sent[slot], s), "event record");
    p.tok = cc->meta + o_tok;
    p.pos = cc->meta + o_pos;
    p.tseq = cc->meta + o_tseq;
    p.cu = cc->meta + o_cu;
    p.pos0 = cc->meta + o_pos0;
    p.len = cc->meta + o_len;
    p.lrow = cc->meta + o_lrow;
    p.cu_pre = cc->meta + o_cupre;
    p.bt = cc->meta + o_bt;
    p.sid = cc->meta + o_sid;
    p.splits = p.decode ? dsq_attn_decode_splits(S, K, c->p.max_context, cm->n_sms)
               : p.nd > 0 ? dsq_attn_decode_splits(p.nd, K, c->p.max_context, cm->n_sms) : 0;
    if (p.splits > cc->dec_splits_max)
        p.splits = cc->dec_splits_max;

    return run_pass(c, &p);
}

static dsq_status cu_forward(dsq_ctx *c, const dsq_batch *bt, float *logits)
{
    cu_ctx *cc = (cu_ctx *)c->be;
    const dsq_model *m = c->model;
    const cu_model *cm = (const cu_model *)m->be;
    const dsq_config *cf = &m->cfg;
    const int32_t E = cf->n_embd, V = cf->n_vocab;
    const int32_t NL = logits ? bt->n_logits : 0;
    cudaStream_t s = cc->stream;
    OK(launch_forward(c, bt, NL));
    if (NL == 0)
        return dsq_cu_status(cudaGetLastError(), "forward pass");

    /* ---- logits out: chunk 0 was computed by the pass, the rest here ----
     * A caller whose buffer is page-locked (cudaHostRegister / cudaMallocHost)
     * gets the logits by DMA directly; at batch 64 that is 39 MB a step, and
     * the staged path is bound by the host memcpy. */
    cudaPointerAttributes pa;
    cc->pinned_out = cudaPointerGetAttributes(&pa, logits) == cudaSuccess && pa.type == cudaMemoryTypeHost;
    cudaGetLastError();
    for (int32_t r0 = 0; r0 < NL; r0 += cc->logit_chunk) {
        int32_t n = NL - r0 < cc->logit_chunk ? NL - r0 : cc->logit_chunk;
        if (r0 > 0)
            OK(linear(cc, cc->xn + (size_t)r0 * E, cm->lm_head, NULL, n, V, E, DSQ_EPI_STORE, cc->logits,
                         cc->gemv_max_head));
        const size_t bytes = (size_t)n * V * 4;
        if (cc->pinned_out) {
            /* the caller's buffer is page-locked: one DMA straight into it */
            CK(cudaMemcpyAsync(logits + (size_t)r0 * V, cc->logits, bytes, cudaMemcpyDeviceToHost, s), "logits copy");
            CK(cudaStreamSynchronize(s), "forward pass");
            continue;
        }
        /* pageable: through the pinned staging buffer in pieces, so the host
         * copy of one piece overlaps the device-to-host transfer of the next */
        size_t np = bytes / ((size_t)4 << 20);
        np = np < 1 ? 1 : np > COPY_PIECES ? COPY_PIECES : np;
        const size_t piece = ((bytes + np - 1) / np + 4095) & ~(size_t)4095;
        char *dst = (char *)(logits + (size_t)r0 * V);
        for (size_t i = 0; i < np && i * piece < bytes; i++) {
            size_t off = i * piece, len = bytes - off < piece ? bytes - off : piece;
            CK(cudaMemcpyAsync((char *)cc->logits_host + off, (char *)cc->logits + off, len, cudaMemcpyDeviceToHost, s),
               "logits copy");
            CK(cudaEventRecord(cc->copied[i], s), "event record");
        }
        for (size_t i = 0; i < np && i * piece < bytes; i++) {
            size_t off = i * piece, len = bytes - off < piece ? bytes - off : piece;
            CK(cudaEventSynchronize(cc->copied[i]), "forward pass");
            memcpy(dst + off, (char *)cc->logits_host + off, len);
        }
    }
    return DSQ_OK;
}

/* dsq_step: the pass, then per chunk of logit rows the caller's logits copy
 * (before sampling rewrites penalised entries in place) and the sampling
 * kernel; one synchronisation for the O(rows) results. */
static dsq_status cu_step(dsq_ctx *c, const dsq_batch *bt, const dsq_samp_row *rows, dsq_samp_result *res,
                          float *logits, int on_device)
{
    cu_ctx *cc = (cu_ctx *)c->be;
    const dsq_model *m = c->model;
    const cu_model *cm = (const cu_model *)m->be;
    const dsq_config *cf = &m->cfg;
    const int32_t E = cf->n_embd, V = cf->n_vocab;
    const int32_t NL = bt->n_logits;
    cudaStream_t s = cc->stream;
    OK(launch_forward(c, bt, NL));
    if (NL == 0)
        return dsq_cu_status(cudaGetLastError(), "forward pass");
    int any_sample = 0, any_host_logits = 0;
    for (int32_t r = 0; r < NL; r++) {
        any_sample |= (rows[r].flags & DSQ_SROW_SAMPLE) != 0;
        any_host_logits |= rows[r].out_row >= 0 && !on_device;
    }
    if (any_sample) {
        CK(cudaEventSynchronize(cc->srow_sent), "waiting for the sampling parameter buffer");
        memcpy(cc->srow_host, rows, (size_t)NL * sizeof(dsq_samp_row));
        CK(cudaMemcpyAsync(cc->srow_dev, cc->srow_host, (size_t)NL * sizeof(dsq_samp_row), cudaMemcpyHostToDevice, s),
           "sampling parameter upload");
        CK(cudaEventRecord(cc->srow_sent, s), "event record");
    }
    const cudaMemcpyKind kind = on_device ? cudaMemcpyDeviceToDevice : cudaMemcpyDeviceToHost;
    for (int32_t r0 = 0; r0 < NL; r0 += cc->logit_chunk) {
        int32_t n = NL - r0 < cc->logit_chunk ? NL - r0 : cc->logit_chunk;
        if (r0 > 0)
            OK(linear(cc, cc->xn + (size_t)r0 * E, cm->lm_head, NULL, n, V, E, DSQ_EPI_STORE, cc->logits,
                      cc->gemv_max_head));
        /* the caller's rows: one copy when they are consecutive */
        int32_t k = 0;
        while (k < n) {
            if (rows[r0 + k].out_row < 0) {
                k++;
                continue;
            }
            int32_t k1 = k + 1;
            while (k1 < n && rows[r0 + k1].out_row == rows[r0 + k].out_row + (k1 - k))
                k1++;
            CK(cudaMemcpyAsync(logits + (size_t)rows[r0 + k].out_row * V, cc->logits + (size_t)k * V,
                               (size_t)(k1 - k) * V * 4, kind, s),
               "logits copy");
            k = k1;
        }
        if (any_sample)
            OK(dsq_cu_sample(cc->logits, n, V, cc->srow_dev + r0, cc->ring, cc->hist_r, cc->sres_dev + r0, s));
    }
    if (any_sample) {
        CK(cudaMemcpyAsync(cc->sres_host, cc->sres_dev, (size_t)NL * sizeof(dsq_samp_result), cudaMemcpyDeviceToHost, s),
           "sampling results copy");
        CK(cudaStreamSynchronize(s), "forward pass and sampling");
        memcpy(res, cc->sres_host, (size_t)NL * sizeof(dsq_samp_result));
    } else if (any_host_logits) {
        CK(cudaStreamSynchronize(s), "forward pass");
    }
    for (int32_t r = 0; r < NL; r++)
        if (!(rows[r].flags & DSQ_SROW_SAMPLE)) {
            memset(&res[r], 0, sizeof res[r]);
            res[r].token = -1;
        }
    return dsq_cu_status(cudaGetLastError(), "forward pass");
}

/* The host history of `seq` changed (truncate, fork): upload its last
 * hist_r tokens to the ring. */
static void cu_hist_sync(dsq_ctx *c, int32_t seq)
{
    cu_ctx *cc = (cu_ctx *)c->be;
    const int32_t len = c->hist.len[seq], R = cc->hist_r;
    const int32_t w = len < R ? len : R;
    const int32_t *t = c->hist.tok[seq];
    cudaSetDevice(cc->device);
    for (int32_t p = len - w; p < len;) {
        int32_t slot = p % R, n = len - p < R - slot ? len - p : R - slot;
        cudaMemcpyAsync(cc->ring + (size_t)seq * R + slot, t + p, (size_t)n * 4, cudaMemcpyHostToDevice, cc->stream);
        p += n;
    }
    cudaGetLastError(); /* a failure here surfaces at the next synchronising call */
}

/* ---- registration ---------------------------------------------------------------- */

/* The driver library is looked for here (as the CUDA runtime itself will,
 * by soname) only to name it in the message when it is missing: the runtime
 * alone would report "driver version is insufficient". */
static pthread_once_t driver_once = PTHREAD_ONCE_INIT;
static char driver_problem[512]; /* "" when libcuda.so.1 could be opened */

static void driver_probe(void)
{
    dlerror();
    void *h = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
    if (!h) {
        const char *e = dlerror();
        snprintf(driver_problem, sizeof driver_problem, "the NVIDIA driver library could not be loaded (%s)",
                 e ? e : "libcuda.so.1");
    }
    /* kept open: the runtime maps it for the rest of the process anyway */
}

extern "C" const char *dsq_cuda_device_problem(void)
{
    pthread_once(&driver_once, driver_probe);
    if (driver_problem[0])
        return driver_problem;
    int n = 0;
    cudaError_t ce = cudaGetDeviceCount(&n);
    if (ce != cudaSuccess) {
        cudaGetLastError();
        return cudaGetErrorString(ce); /* static text */
    }
    return n > 0 ? NULL : "the CUDA runtime reports no device";
}

/* KV rows copied on the context stream (a shared paged block before a
 * write, a static-cache fork); ordered before the next pass, no host wait. */
static dsq_status cu_copy_kv_rows(dsq_ctx *c, int32_t n, const dsq_kv_copy *copies)
{
    cu_ctx *cc = (cu_ctx *)c->be;
    const dsq_config *cf = &c->model->cfg;
    const int int8 = c->p.kv_dtype == DSQ_KV_INT8;
    const size_t K = (size_t)cf->n_kv_heads, row = K * (size_t)cf->head_dim * (int8 ? 1 : 2), srow = K * 4;
    const int64_t rows = c->p.kv_layout == DSQ_KV_PAGED ? (int64_t)c->pages.n_blocks * c->pages.block_size
                                                        : (int64_t)c->p.max_seqs * c->p.max_context;
    CK(cudaSetDevice(cc->device), "cudaSetDevice");
    for (int32_t i = 0; i < n; i++) {
        const dsq_kv_copy *cp = &copies[i];
        if (cp->n_rows < 0 || cp->src_row < 0 || cp->dst_row < 0 || cp->src_row + cp->n_rows > rows ||
            cp->dst_row + cp->n_rows > rows)
            return dsq_fail(DSQ_ERR_INTERNAL, "CUDA KV copy: rows %lld..+%lld -> %lld outside the cache",
                            (long long)cp->src_row, (long long)cp->n_rows, (long long)cp->dst_row);
        if (cp->n_rows == 0)
            continue;
        for (int a = 0; a < (int8 ? 4 : 2); a++) {
            const size_t w = a < 2 ? row : srow;
            const size_t so = (size_t)cp->src_row * w, d_o = (size_t)cp->dst_row * w, bytes = (size_t)cp->n_rows * w;
            char *base0 = (char *)(a == 0 ? cc->kv[0].k : a == 1 ? cc->kv[0].v : a == 2 ? (void *)cc->kv[0].k_scale
                                                                                        : (void *)cc->kv[0].v_scale);
            if (cc->kv_layer_pitch) {
                CK(cudaMemcpy2DAsync(base0 + d_o, cc->kv_layer_pitch, base0 + so, cc->kv_layer_pitch, bytes,
                                     (size_t)cf->n_layers, cudaMemcpyDeviceToDevice, cc->stream),
                   "KV row copy");
                continue;
            }
            for (int32_t l = 0; l < cf->n_layers; l++) {
                const dsq_attn_kv *kv = &cc->kv[l];
                char *base = (char *)(a == 0 ? kv->k : a == 1 ? kv->v : a == 2 ? (void *)kv->k_scale : (void *)kv->v_scale);
                CK(cudaMemcpyAsync(base + d_o, base + so, bytes, cudaMemcpyDeviceToDevice, cc->stream), "KV row copy");
            }
        }
    }
    return DSQ_OK;
}

/* dsq_ctx_synchronize: the caller's current device is left as it was. */
static dsq_status cu_synchronize(dsq_ctx *c)
{
    cu_ctx *cc = (cu_ctx *)c->be;
    int prev = -1;
    CK(cudaGetDevice(&prev), "cudaGetDevice");
    if (prev != cc->device)
        CK(cudaSetDevice(cc->device), "cudaSetDevice");
    dsq_status st = dsq_cu_status(cudaStreamSynchronize(cc->stream), "waiting for the context's stream");
    if (prev != cc->device)
        (void)cudaSetDevice(prev);
    return st;
}

static void *cu_stream(const dsq_ctx *c) { return (void *)((const cu_ctx *)c->be)->stream; }

extern "C" const dsq_backend_ops dsq_cuda_backend = {
    /* positional, in struct dsq_backend_ops order: ..., seq_removed,
     * copy_kv_rows, step, hist_sync, synchronize, stream */
    "cuda", DSQ_BACKEND_CUDA, cu_model_load, cu_model_free, cu_ctx_init, cu_ctx_free, cu_forward, NULL,
    cu_copy_kv_rows, cu_step, cu_hist_sync, cu_synchronize, cu_stream,
};
