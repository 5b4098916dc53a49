/*
 * backend_pass.cu - one forward pass of the CUDA backend: the batch
 * description packed into pinned memory and uploaded at once, then the
 * layers, each walking the model description's recipe (cfg->arch->recipe)
 * on the context's stream; decode steps replay a CUDA graph per shape.
 *
 * Activations (T rows): the residual stream x stays fp32 for the whole
 * pass; product inputs are bf16 (xn, attn, act); products write fp32 (qkv,
 * gu, logits) with bias / residual add fused into the epilogue, or, with
 * cu_ctx.resid_after, the residual added after the product (the seam a
 * tensor-parallel split needs: its partial sums are reduced before the add).
 * Products go through dsq_cu_linear (cuda/linear.cu), which picks GEMV or
 * cuBLASLt by rows and the kernel by the weight's format.
 */
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "quant_cpu.h"

/* The product environment of this context for a product class. */
static dsq_cu_linear_env lin_env(const cu_ctx *cc, int32_t gemv_max)
{
    dsq_cu_linear_env e;
    e.gemm = cc->gemm;
    e.gu_scratch = cc->gu;
    e.gu_scratch_elems = cc->gu_elems;
    e.gu_f32 = cc->gu_f32;
    e.gemv_max = gemv_max;
    e.mma_min = cc->gemv_mma_min;
    e.long_min = cc->gemv_long_min;
    e.mma_norm = cc->gemv_mma_norm;
    e.norm_fuse = cc->norm_fuse;
    e.stream = cc->stream;
    e.wq_tile = cc->wq_tile;
    e.wq_tile_elems = cc->wq_tile_elems;
    e.norm_x = NULL;
    e.norm_rows = NULL;
    e.norm_w = NULL;
    e.norm_eps = 0.0f;
    e.rows_max = cc->rows_max;
    e.qrows_max = cc->qrows_max;
    e.qrows_q8_min = cc->qrows_q8_min;
    e.qrows_q4_min = cc->qrows_q4_min;
    e.qmma_q4_max = cc->qmma_q4_max;
    e.qmma_q8_max = cc->qmma_q8_max;
    e.qmma_q4_long = cc->qmma_q4_long;
    e.qmma_q8_long = cc->qmma_q8_long;
    e.qmma_norm = cc->qmma_norm;
    e.qtile_parts = cc->qtile_parts;
    e.rows_min = cc->rows_min;
    e.rows_ws = cc->rows_ws;
    e.rows_ws_bytes = cc->rows_ws_bytes;
    e.rows_tickets = cc->rows_tickets;
    e.rows_n_tickets = cc->rows_n_tickets;
    return e;
}

/* The product reads rmsnorm(cc->x) * norm (norm NULL: cc->xn as it is). */
static void with_norm(dsq_cu_linear_env *e, const cu_ctx *cc, const dsq_config *cf, const float *norm)
{
    if (!norm)
        return;
    e->norm_x = cc->x;
    e->norm_w = norm;
    e->norm_eps = cf->rms_eps;
}

/* Whether op i of the recipe is a DSQ_OP_NORM the next op can take over
 * (a product op reading xn, which then normalises its own input). */
static int norm_deferred(const dsq_arch *a, int32_t i)
{
    return a->recipe[i].kind == DSQ_OP_NORM && i + 1 < a->n_ops &&
           (a->recipe[i + 1].kind == DSQ_OP_QKV_ROPE || a->recipe[i + 1].kind == DSQ_OP_GATED_FFN);
}

/* x += in W^T (+ b): fused into the product's epilogue, or (resid_after,
 * or a bias to add) the product into cc->part and then the add. */
static dsq_status linear_resid(cu_ctx *cc, const cu_op_data *d, const dsq_bf16 *in, int32_t T)
{
    const dsq_cu_linear_env env = lin_env(cc, cc->gemv_max_small);
    if (!cc->resid_after && !d->bias)
        return dsq_cu_linear(&d->w, in, NULL, T, DSQ_EPI_ADD, cc->x, &env);
    DSQ_TRY(dsq_cu_linear(&d->w, in, d->bias, T, d->bias ? DSQ_EPI_BIAS : DSQ_EPI_STORE, cc->part, &env));
    return dsq_cu_add(cc->x, cc->part, (int64_t)T * d->w.rows, cc->stream);
}

/* Attention of the pass over layer l's cache: q from cc->qkvb (or, decode
 * with decode_rope, q|k|v from cc->qkv, rotated with inv_freq), out
 * cc->attn. */
static dsq_status attend(cu_ctx *cc, const dsq_config *cf, const cu_pass *p, int32_t l, const float *inv_freq)
{
    const int32_t H = cf->n_heads, KV = cf->n_kv_heads, D = cf->head_dim;
    const int32_t QKV = (H + 2 * KV) * D;
    const dsq_bf16 *q = cc->qkvb;
    cudaStream_t s = cc->stream;
    dsq_attn_kv kv = cc->kv[l];
    kv.block_table = p->bt;
    kv.bt_stride = p->bt_stride;
    if (p->decode && cc->decode_rope) /* q, k, v straight from the product (run_op) */
        return dsq_attn_decode_rope(&kv, cc->qkv, QKV, inv_freq, cc->attn,
                                    (int64_t)H * D, p->len, p->S, H, p->splits, cc->dec_ws, cc->dec_ws_bytes, s);
    if (p->decode) {
        DSQ_TRY(dsq_attn_decode(&kv, q, QKV, cc->attn, (int64_t)H * D, p->len, p->S, H, p->splits, cc->dec_ws,
                                cc->dec_ws_bytes, s));
        return DSQ_OK;
    }
    /* mixed: one-token rows in front through the decode kernel (split over
     * the context), prompt chunks through the prefill kernel; the products
     * ran once over all rows */
    const int32_t nd = p->nd;
    if (nd > 0)
        DSQ_TRY(dsq_attn_decode(&kv, q, QKV, cc->attn, (int64_t)H * D, p->len, nd, H, p->splits, cc->dec_ws,
                                cc->dec_ws_bytes, s));
    dsq_attn_kv kc = kv;
    kc.block_table = p->bt + (size_t)nd * p->bt_stride;
    DSQ_TRY(dsq_attn_prefill_ws(&kc, q + (size_t)nd * QKV, QKV, cc->attn + (size_t)nd * H * D, (int64_t)H * D,
                                p->cu_pre, p->pos0 + nd, p->S - nd, p->max_q, p->max_kv, H, 0, cc->pre_ws,
                                cc->pre_ws_bytes, s));
    return DSQ_OK;
}

/* One recipe op of layer l over the pass's T rows.  norm (NULL: none): the
 * weight of a DSQ_OP_NORM that was deferred to this product op, which then
 * normalises cc->x into its input itself (or inside the GEMV). */
static dsq_status run_op(dsq_ctx *c, const cu_pass *p, const dsq_op *op, const cu_op_data *d, int32_t l,
                         const float *norm)
{
    cu_ctx *cc = (cu_ctx *)c->be;
    const cu_model *cm = (const cu_model *)c->model->be;
    const dsq_config *cf = &c->model->cfg;
    const int32_t E = cf->n_embd, H = cf->n_heads, KV = cf->n_kv_heads, D = cf->head_dim;
    const int32_t QKV = (H + 2 * KV) * D, T = p->T;
    cudaStream_t s = cc->stream;
    switch (op->kind) {
    case DSQ_OP_NORM:
        return dsq_cu_rmsnorm(cc->x, NULL, T, E, d->norm, cf->rms_eps, cc->xn, s);
    case DSQ_OP_QKV_ROPE: {
        dsq_cu_linear_env env = lin_env(cc, cc->gemv_max_small);
        with_norm(&env, cc, cf, norm);
        DSQ_TRY(dsq_cu_linear(&d->w, cc->xn, d->bias, T, DSQ_EPI_BIAS, cc->qkv, &env));
        dsq_attn_kv kv = cc->kv[l];
        kv.block_table = p->bt;
        kv.bt_stride = p->bt_stride;
        if (p->decode && cc->decode_rope) /* done inside the decode attention (attend) */
            return DSQ_OK;
        DSQ_TRY(dsq_attn_rope_kv_write(&kv, cc->qkv, QKV, p->pos, p->tseq, T, H, cm->inv_freq, cc->qkvb, s));
        return DSQ_OK;
    }
    case DSQ_OP_ATTEND:
        return attend(cc, cf, p, l, cm->inv_freq);
    case DSQ_OP_LINEAR_RESID:
        return linear_resid(cc, d, op->in == DSQ_IN_ACT ? cc->act : cc->attn, T);
    case DSQ_OP_GATED_FFN: {
        dsq_cu_linear_env env = lin_env(cc, cc->gemv_max_gu);
        with_norm(&env, cc, cf, norm);
        return dsq_cu_linear(&d->w, cc->xn, NULL, T, DSQ_EPI_SILU_MUL, cc->act, &env);
    }
    }
    return dsq_fail(DSQ_ERR_INTERNAL, "CUDA pass: recipe op %d unknown", (int)op->kind);
}

dsq_status cu_head_rows(dsq_ctx *c, int32_t r0, int32_t n)
{
    cu_ctx *cc = (cu_ctx *)c->be;
    const cu_model *cm = (const cu_model *)c->model->be;
    if (cm->tp)
        return cu_tp_head_rows(c, r0, n);
    const dsq_cu_linear_env env = lin_env(cc, cc->gemv_max_head);
    return dsq_cu_linear(&cm->lm_head, cc->xn + (size_t)r0 * c->model->cfg.n_embd, NULL, n, DSQ_EPI_STORE,
                         cc->logits, &env);
}

/* Bytes a product streams of its weight (scales and zero points aside). */
static uint64_t weight_stream_bytes(const dsq_weight *w)
{
    switch (w->format) {
    case DSQ_WF_BF16: return (uint64_t)w->rows * (uint64_t)w->cols * 2;
    case DSQ_WF_Q8_ROW: return (uint64_t)w->rows * (uint64_t)w->cols;
    case DSQ_WF_Q4_G128: return (uint64_t)dsq_q4_q_bytes(w->rows, w->cols);
    default: return 0;
    }
}

static int is_product(const dsq_op *op)
{
    return op->kind == DSQ_OP_QKV_ROPE || op->kind == DSQ_OP_LINEAR_RESID || op->kind == DSQ_OP_GATED_FFN;
}

/* Where a pass's weight prefetch has reached, in stream order: product op
 * `op` of layer `layer`, `off` bytes into its weight. */
typedef struct l2p_cursor {
    int32_t layer, op;
    uint64_t off;
} l2p_cursor;

/* After op i of layer l: ask the L2 for the weights of the next
 * cc->l2p_bytes bytes of the stream, in the order the products read them
 * (the rest of this layer, then the next layer's), counted from the start
 * of the next product: bytes an earlier prefetch of the pass already asked
 * for count against the budget and are not asked for again, so the front
 * never runs more than l2p_bytes ahead of the product about to run (data
 * fetched further ahead would be evicted before use).  A product's first
 * rows come first: its first rounds then hit L2. */
static dsq_status prefetch_next(dsq_ctx *c, int32_t l, int32_t i, l2p_cursor *cur)
{
    cu_ctx *cc = (cu_ctx *)c->be;
    const cu_model *cm = (const cu_model *)c->model->be;
    const dsq_arch *a = c->model->cfg.arch;
    const int32_t NL = c->model->cfg.n_layers;
    int32_t L = l, j = i + 1;
    uint64_t off = 0, left = cc->l2p_bytes;
    dsq_l2p_range r[DSQ_L2P_MAX_RANGES];
    int32_t n = 0;
    while (L < NL && n < DSQ_L2P_MAX_RANGES && left >= 16) {
        if (j >= a->n_ops) {
            L++, j = 0, off = 0;
            continue;
        }
        const dsq_weight *w = &cm->layers[L].op[j].w;
        const uint64_t total = is_product(&a->recipe[j]) && w->data ? weight_stream_bytes(w) : 0;
        if (off + 16 > total) { /* done with this weight (a tail under 16 bytes is left out) */
            j++, off = 0;
            continue;
        }
        const uint64_t b = ((total - off) < left ? (total - off) : left) & ~(uint64_t)15;
        /* the part of [off, off + b) an earlier prefetch asked for */
        uint64_t done = 0;
        if (L < cur->layer || (L == cur->layer && j < cur->op))
            done = b;
        else if (L == cur->layer && j == cur->op && cur->off > off)
            done = cur->off - off < b ? cur->off - off : b;
        if (b - done >= 16) {
            r[n].p = (const char *)w->data + off + done;
            r[n].bytes = b - done;
            n++;
        }
        left -= b;
        off += b;
    }
    if (L > cur->layer || (L == cur->layer && (j > cur->op || (j == cur->op && off > cur->off))))
        cur->layer = L, cur->op = j, cur->off = off;
    return dsq_cu_l2_prefetch(r, n, cc->stream);
}

/* Whether a prefetch follows op `op` in this pass (l2p_bytes, small decode
 * passes): after the qkv product (attention, next, leaves the memory
 * idle), or after every product with DSQ_CUDA_L2_PREFETCH_AT=all. */
static int prefetch_after(const cu_ctx *cc, const cu_pass *p, const dsq_op *op)
{
    if (!cc->l2p_bytes || !p->decode || p->T > DSQ_CU_L2P_ROWS)
        return 0;
    return op->kind == DSQ_OP_QKV_ROPE || (cc->l2p_all && is_product(op));
}

/* Layers [*l0, *l1) of piece k of a step launched as n graphs: one layer,
 * then 3, 8, the rest (a piece's launch costs the host less than the
 * piece before it takes the GPU: a layer's ~6 kernels ~5 us of host time
 * against ~50 us of GPU time at batch 1).  Piece 0 also holds the history
 * scatter and the embedding, the last the head; other pieces may be empty
 * in short models. */
static void cu_graph_piece(int32_t n_layers, int32_t n, int32_t k, int32_t *l0, int32_t *l1)
{
    static const int32_t at[DSQ_CU_GRAPH_PIECES] = {0, 1, 4, 12};
    *l0 = k == 0 ? 0 : at[k] < n_layers ? at[k] : n_layers;
    *l1 = k == n - 1 ? n_layers : at[k + 1] < n_layers ? at[k + 1] : n_layers;
}

/* Piece k of n of the pass (all of it for k = 0, n = 1), on the context's
 * stream; no host synchronisation.  Each layer walks the model
 * description's recipe; l2p carries the L2 prefetch's place from piece to
 * piece. */
static dsq_status enqueue_piece(dsq_ctx *c, const cu_pass *p, int32_t k, int32_t n, l2p_cursor *l2p)
{
    cu_ctx *cc = (cu_ctx *)c->be;
    const dsq_model *m = c->model;
    const cu_model *cm = (const cu_model *)m->be;
    const dsq_config *cf = &m->cfg;
    const dsq_arch *a = cf->arch;
    const int32_t E = cf->n_embd, T = p->T;
    cudaStream_t s = cc->stream;
    int32_t l0, l1;
    cu_graph_piece(cf->n_layers, n, k, &l0, &l1);

    if (k == 0) {
        DSQ_TRY(dsq_cu_hist_scatter(cc->ring, cc->hist_r, p->tok, p->pos, p->tseq, p->sid, T, s));
        DSQ_TRY(dsq_cu_embed(cm->tok_embd, p->tok, T, E, cc->x, s));
    }
    for (int32_t l = l0; l < l1; l++)
        for (int32_t i = 0; i < a->n_ops; i++) {
            if (norm_deferred(a, i))
                continue; /* the next op normalises its input */
            const float *norm = i > 0 && norm_deferred(a, i - 1) ? cm->layers[l].op[i - 1].norm : NULL;
            DSQ_TRY(run_op(c, p, &a->recipe[i], &cm->layers[l].op[i], l, norm));
            if (prefetch_after(cc, p, &a->recipe[i]))
                DSQ_TRY(prefetch_next(c, l, i, l2p));
        }
    if (k < n - 1 || p->NL == 0)
        return DSQ_OK;
    /* head: final norm of the wanted rows only, then the first chunk of lm_head */
    DSQ_TRY(dsq_cu_rmsnorm(cc->x, p->lrow, p->NL, E, cm->out_norm, cf->rms_eps, cc->xn, s));
    return cu_head_rows(c, 0, p->NL < cc->logit_chunk ? p->NL : cc->logit_chunk);
}

/* Everything from the embedding to the first chunk of logits (into
 * cc->logits), on the context's stream; no host synchronisation. */
static dsq_status enqueue_pass(dsq_ctx *c, const cu_pass *p)
{
    l2p_cursor l2p = {0, 0, 0};
    return enqueue_piece(c, p, 0, 1, &l2p);
}

int32_t cu_n_segments(const dsq_config *cf)
{
    int32_t n = 0;
    for (int32_t i = 0; i < cf->arch->n_ops; i++)
        n += cf->arch->recipe[i].kind == DSQ_OP_LINEAR_RESID;
    return n * cf->n_layers;
}

dsq_status cu_enqueue_segment(dsq_ctx *c, const cu_pass *p, int32_t seg, int add_bias)
{
    cu_ctx *cc = (cu_ctx *)c->be;
    const dsq_model *m = c->model;
    const cu_model *cm = (const cu_model *)m->be;
    const dsq_config *cf = &m->cfg;
    const dsq_arch *a = cf->arch;
    const int32_t E = cf->n_embd, T = p->T;
    cudaStream_t s = cc->stream;
    if (seg == 0) {
        DSQ_TRY(dsq_cu_hist_scatter(cc->ring, cc->hist_r, p->tok, p->pos, p->tseq, p->sid, T, s));
        DSQ_TRY(dsq_cu_embed(cm->tok_embd, p->tok, T, E, cc->x, s));
    }
    int32_t k = 0; /* row-parallel products before the current op */
    for (int32_t l = 0; l < cf->n_layers; l++)
        for (int32_t i = 0; i < a->n_ops; i++) {
            const dsq_op *op = &a->recipe[i];
            const cu_op_data *d = &cm->layers[l].op[i];
            if (op->kind != DSQ_OP_LINEAR_RESID) {
                if (k == seg)
                    DSQ_TRY(run_op(c, p, op, d, l, NULL));
                continue;
            }
            if (k == seg - 1) /* the previous segment's product, all-reduced */
                DSQ_TRY(dsq_cu_add(cc->x, cc->part, (int64_t)T * d->w.rows, s));
            if (k == seg) {
                const dsq_cu_linear_env env = lin_env(cc, cc->gemv_max_small);
                const float *b = add_bias ? d->bias : NULL;
                return dsq_cu_linear(&d->w, op->in == DSQ_IN_ACT ? cc->act : cc->attn, b, T,
                                     b ? DSQ_EPI_BIAS : DSQ_EPI_STORE, cc->part, &env);
            }
            k++;
        }
    if (seg != k)
        return dsq_fail(DSQ_ERR_INTERNAL, "CUDA pass: segment %d of %d", seg, k);
    if (p->NL == 0)
        return DSQ_OK;
    DSQ_TRY(dsq_cu_rmsnorm(cc->x, p->lrow, p->NL, E, cm->out_norm, cf->rms_eps, cc->xn, s));
    const dsq_cu_linear_env env = lin_env(cc, cc->gemv_max_head);
    return dsq_cu_linear(&cm->lm_head, cc->xn, NULL, p->NL < cc->logit_chunk ? p->NL : cc->logit_chunk,
                         DSQ_EPI_STORE, cc->logits, &env);
}

static void destroy_pieces(cudaGraphExec_t *ge, int32_t n)
{
    for (int32_t k = 0; k < n; k++) {
        if (ge[k])
            cudaGraphExecDestroy(ge[k]);
        ge[k] = NULL;
    }
}

/* Capture pass p as cc->graph_pieces graphs into ge[] (all NULL and a
 * warning logged where one fails: the shape then runs eagerly).  Returns
 * whether it worked. */
static int capture_pass(dsq_ctx *c, const cu_pass *p, cudaGraphExec_t *ge)
{
    cu_ctx *cc = (cu_ctx *)c->be;
    const int32_t n = cc->graph_pieces;
    l2p_cursor l2p = {0, 0, 0};
    for (int32_t k = 0; k < n; k++)
        ge[k] = NULL;
    for (int32_t k = 0; k < n; k++) {
        int32_t l0, l1;
        cu_graph_piece(c->model->cfg.n_layers, n, k, &l0, &l1);
        if (k > 0 && l0 == l1 && (k < n - 1 || p->NL == 0))
            continue; /* nothing in this piece (short models) */
        cudaGraph_t g = NULL;
        cudaError_t bc = cudaStreamBeginCapture(cc->stream, cudaStreamCaptureModeThreadLocal);
        if (bc != cudaSuccess) {
            cudaGetLastError();
            destroy_pieces(ge, n);
            dsq_log(DSQ_LOG_WARN, "CUDA graph capture could not start (%s); %d-sequence decode steps run eagerly",
                    cudaGetErrorString(bc), p->S);
            return 0;
        }
        dsq_status st = enqueue_piece(c, p, k, n, &l2p);
        cudaError_t ce = cudaStreamEndCapture(cc->stream, &g);
        if (st == DSQ_OK && ce == cudaSuccess && g)
            ce = cudaGraphInstantiate(&ge[k], g, 0);
        if (g)
            cudaGraphDestroy(g);
        if (st != DSQ_OK || ce != cudaSuccess || !ge[k]) {
            cudaGetLastError();
            destroy_pieces(ge, n);
            dsq_log(DSQ_LOG_WARN, "CUDA graph capture of a %d-sequence decode step failed (%s); running it eagerly",
                    p->S, st != DSQ_OK ? dsq_last_error_message() : cudaGetErrorString(ce));
            return 0;
        }
    }
    return 1;
}

/* Decode steps (one token per sequence, all logits in one chunk) replay
 * CUDA graphs captured on first use of that batch size: a step is then a
 * few launches (cu_graph_piece) instead of ~300.  A capture that fails
 * (e.g. a library call that refuses capture) marks the shape and the step
 * runs eagerly.  With DSQ_CUDA_GEMM_TUNE=1 the cuBLASLt plans the capture
 * made are timed (nothing can be timed inside a capture) and, where a
 * faster algorithm was found, the pass is captured again with it. */
static dsq_status run_pass(dsq_ctx *c, const cu_pass *p)
{
    cu_ctx *cc = (cu_ctx *)c->be;
    /* (a pass with more logit rows than one chunk captures its first chunk;
     * cu_forward / cu_step compute the rest after the graph) */
    if (!cc->graphs || !p->decode)
        return enqueue_pass(c, p);
    const int32_t key = ((p->S - 1) * 2 + (p->NL > 0)) * cc->n_bt_buckets + p->bt_key;
    cudaGraphExec_t *ge = cc->graphs + (size_t)key * DSQ_CU_GRAPH_PIECES;
    const int32_t n = cc->graph_pieces;
    if (!ge[0] && !cc->graph_failed[key]) {
        int ok = capture_pass(c, p, ge);
        if (!ok && cc->gemm_tune) { /* no graph: the plans it marked are timed anyway (for eager runs) */
            int32_t tuned = 0, changed = 0;
            (void)dsq_gemm_tune_pending(cc->gemm, cc->stream, &tuned, &changed);
            dsq_clear_error();
        }
        if (ok && cc->gemm_tune) {
            int32_t tuned = 0, changed = 0;
            dsq_status ts = dsq_gemm_tune_pending(cc->gemm, cc->stream, &tuned, &changed);
            if (ts != DSQ_OK) /* the graphs keep the heuristic's algorithms */
                dsq_log(DSQ_LOG_WARN, "cuBLASLt tuning for %d-sequence decode steps failed (%s); the heuristic's "
                        "choice stays", p->S, dsq_last_error_message());
            else if (tuned > 0)
                dsq_log(DSQ_LOG_INFO, "cuBLASLt tuning for %d-sequence decode steps: %d products timed, %d "
                        "changed", p->S, (int)tuned, (int)changed);
            if (ts == DSQ_OK && changed > 0) { /* a failed second capture keeps the first graphs */
                cudaGraphExec_t ge2[DSQ_CU_GRAPH_PIECES];
                if (capture_pass(c, p, ge2)) {
                    destroy_pieces(ge, n);
                    for (int32_t k = 0; k < n; k++)
                        ge[k] = ge2[k];
                }
            }
            dsq_clear_error();
        }
        if (!ok)
            cc->graph_failed[key] = 1;
    }
    if (!ge[0])
        return enqueue_pass(c, p);
    for (int32_t k = 0; k < n; k++)
        if (ge[k])
            CU_TRY(cudaGraphLaunch(ge[k], cc->stream), "graph launch");
    return DSQ_OK;
}

dsq_status cu_launch_forward(dsq_ctx *c, const dsq_batch *bt, int32_t NL)
{
    if (((const cu_model *)c->model->be)->tp)
        return cu_tp_launch_forward(c, bt, NL);
    cu_pass p;
    DSQ_TRY(cu_prepare_pass(c, bt, NL, &p));
    return run_pass(c, &p);
}

dsq_status cu_prepare_pass(dsq_ctx *c, const dsq_batch *bt, int32_t NL, cu_pass *pp)
{
    cu_ctx *cc = (cu_ctx *)c->be;
    const dsq_model *m = c->model;
    const cu_model *cm = (const cu_model *)m->be;
    const dsq_config *cf = &m->cfg;
    const int32_t KV = cf->n_kv_heads;
    const int32_t T = bt->n_tokens, S = bt->n_seqs;
    cudaStream_t s = cc->stream;

    if (T < 1 || T > cc->max_tokens || S < 1 || S > cc->max_bseqs || NL < 0 || NL > T)
        return dsq_fail(DSQ_ERR_INTERNAL, "CUDA forward: batch of %d tokens / %d sequences / %d logit rows "
                        "outside this context's limits (%d tokens, %d sequences)", T, S, NL, cc->max_tokens, cc->max_bseqs);

    /* ---- pack the batch description into pinned memory, one upload ---- */
    const int slot = cc->meta_slot;
    cc->meta_slot ^= 1;
    CU_TRY(cudaEventSynchronize(cc->meta_sent[slot]), "waiting for the metadata buffer");
    int32_t *h = cc->meta_host[slot];
    const int paged = c->p.kv_layout == DSQ_KV_PAGED;
    cu_pass p;
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
    p.bt_key = cu_bt_bucket(need, cc->bt_max, &p.bt_stride);
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
            if (bt->seq_pos0[i] + n > p.max_kv)
                p.max_kv = bt->seq_pos0[i] + n;
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
    CU_TRY(cudaMemcpyAsync(cc->meta, h, n_meta * 4, cudaMemcpyHostToDevice, s), "batch metadata upload");
    CU_TRY(cudaEventRecord(cc->meta_sent[slot], s), "event record");
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
    const int32_t kvd = cc->kv[0].dtype;
    p.splits = p.decode ? dsq_attn_decode_splits(S, KV, c->p.max_context, cm->n_sms, kvd)
               : p.nd > 0 ? dsq_attn_decode_splits(p.nd, KV, c->p.max_context, cm->n_sms, kvd) : 0;
    if (p.splits > cc->dec_splits_max)
        p.splits = cc->dec_splits_max;
    *pp = p;
    return DSQ_OK;
}

