/*
 * backend_weights.cu - the CUDA model: weights laid out and uploaded as the
 * model description's recipe needs them (cfg->arch, lib/arch.h), then
 * checked for non-finite values.
 *
 * One device allocation (the arena), bf16 matrices (F16 / F32 checkpoints
 * are converted while staging), fp32 vectors:
 *   tok_embd [V][E]; out_norm fp32 [E]; lm_head [V][E] (tok_embd when
 *   tied); inv_freq fp32 [D/2] (RoPE)
 *   per layer, per recipe op (cu_op_data in backend.h):
 *     NORM          fp32 [E]
 *     QKV_ROPE      [QKV][E] = q rows | k rows | v rows, bias fp32 [QKV]
 *                   (zeros for biases the checkpoint does not have, as on
 *                   the CPU)
 *     LINEAR_RESID  [E][in] (in = H*D or F), bias fp32 [E] when the recipe
 *                   names one
 *     GATED_FFN     [2F][E], gate/up interleaved by rows (DSQ_WL_GATE_UP):
 *                   row 2i = gate_i, row 2i+1 = up_i, so a GEMV block owning
 *                   a row pair finishes silu(gate)*up itself and the GEMM
 *                   path reads (gate, up) as one float2
 * Quantized matrices (Q8_ROW / Q4_G128, lib/weights_quant.h) take the same
 * places in their own layouts, fused the same way (backend_quant.cu).
 * After the upload the file mapping is closed and the host views in m->w
 * forget their data (nothing points into the closed mapping).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "weights_quant.h"

size_t cu_carve(size_t *off, size_t bytes)
{
    size_t at = (*off + 255) & ~(size_t)255;
    *off = at + bytes;
    return at;
}

/* ---- layout ------------------------------------------------------------------ */

/* base + offset, or NULL while only sizing (base NULL). */
static void *at(char *base, size_t off) { return base ? base + off : NULL; }

static dsq_weight bf16_weight(void *data, int64_t rows, int64_t cols, dsq_wlayout layout)
{
    dsq_weight w;
    memset(&w, 0, sizeof w);
    w.format = DSQ_WF_BF16;
    w.rows = rows;
    w.cols = cols;
    w.data = data;
    w.layout = layout;
    return w;
}

/* Carve one layer's op data from *off (sizes only when base is NULL); qf[i]:
 * the quantized format of op i's weights, 0 for bf16. */
static void place_layer(const dsq_config *c, const int *qf, cu_layer *dl, char *base, size_t *off)
{
    const dsq_arch *a = c->arch;
    const int64_t E = c->n_embd, Q = dsq_arch_dim(c, DSQ_DIM_Q), KVD = dsq_arch_dim(c, DSQ_DIM_KV),
                  F = c->n_ff;
    for (int32_t i = 0; i < a->n_ops; i++) {
        const dsq_op *op = &a->recipe[i];
        cu_op_data *d = &dl->op[i];
        memset(d, 0, sizeof *d);
        switch (op->kind) {
        case DSQ_OP_NORM:
            d->norm = (float *)at(base, cu_carve(off, (size_t)E * 4));
            break;
        case DSQ_OP_QKV_ROPE: {
            const int64_t rows = Q + 2 * KVD;
            d->w = qf[i] ? cu_place_quant(qf[i], rows, E, DSQ_WL_ROWS, base, off)
                         : bf16_weight(at(base, cu_carve(off, (size_t)(rows * E) * 2)), rows, E, DSQ_WL_ROWS);
            d->bias = (float *)at(base, cu_carve(off, (size_t)rows * 4));
            break;
        }
        case DSQ_OP_LINEAR_RESID: {
            const int64_t in = op->in == DSQ_IN_ACT ? F : Q;
            d->w = qf[i] ? cu_place_quant(qf[i], E, in, DSQ_WL_ROWS, base, off)
                         : bf16_weight(at(base, cu_carve(off, (size_t)(E * in) * 2)), E, in, DSQ_WL_ROWS);
            if (op->b[0] >= 0)
                d->bias = (float *)at(base, cu_carve(off, (size_t)E * 4));
            break;
        }
        case DSQ_OP_GATED_FFN:
            d->w = qf[i] ? cu_place_quant(qf[i], 2 * F, E, DSQ_WL_GATE_UP, base, off)
                         : bf16_weight(at(base, cu_carve(off, (size_t)(2 * F * E) * 2)), 2 * F, E,
                                       DSQ_WL_GATE_UP);
            break;
        case DSQ_OP_ATTEND:
            break;
        }
    }
}

/* ---- upload ------------------------------------------------------------------ */

/* Host staging for conversions and uploads: pinned, reused chunk by chunk. */
#define STAGE_BYTES ((size_t)32 << 20)

/* One uploaded tensor, for the non-finite check. */
typedef struct region {
    const void *p;
    int eb;                    /* 2: bf16, 4: fp32 */
    int64_t rows, cols, pitch; /* elements */
    char name[160];
} region;

typedef struct uploader {
    void *stage;    /* pinned [STAGE_BYTES] */
    const dsq_arch *arch;
    region *rg;     /* [cap] */
    int n_rg, cap;
} uploader;

static void note_region(uploader *u, const void *p, int eb, int64_t rows, int64_t cols, int64_t pitch,
                        int per_layer, int32_t role, int32_t layer)
{
    if (u->n_rg >= u->cap)
        return; /* sized for every tensor of the description: cannot happen */
    region *g = &u->rg[u->n_rg++];
    g->p = p, g->eb = eb, g->rows = rows, g->cols = cols, g->pitch = pitch;
    dsq_arch_tensor_name(u->arch, per_layer, role, layer, g->name, sizeof g->name);
}

/* Copy tensor t, [rows][cols] in any supported dtype, as bf16 to dst, whose
 * rows are dst_pitch elements apart (pitch 2*cols interleaves two tensors). */
static dsq_status upload_bf16(uploader *u, dsq_bf16 *dst, size_t dst_pitch, const dsq_tensor *t,
                              int64_t rows, int64_t cols, int per_layer, int32_t role, int32_t layer)
{
    char what[160];
    dsq_arch_tensor_name(u->arch, per_layer, role, layer, what, sizeof what);
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
        CU_TRY(cudaMemcpy2D(dst + (size_t)r0 * dst_pitch, dst_pitch * 2, st, row_bytes, row_bytes, (size_t)n,
                            cudaMemcpyHostToDevice),
               "weight upload");
    }
    note_region(u, dst, 2, rows, cols, (int64_t)dst_pitch, per_layer, role, layer);
    return DSQ_OK;
}

/* Copy n values of t as fp32, or zeros when t has no data (an optional
 * bias the checkpoint does not have: zeros, as on the CPU). */
static dsq_status upload_f32(uploader *u, float *dst, const dsq_tensor *t, int64_t n, int per_layer, int32_t role,
                             int32_t layer)
{
    char what[160];
    dsq_arch_tensor_name(u->arch, per_layer, role, layer, what, sizeof what);
    if (t->data && dsq_tensor_numel(t) != n)
        return dsq_fail(DSQ_ERR_SHAPE, "CUDA upload: tensor %s has %lld elements, expected %lld", what,
                        (long long)dsq_tensor_numel(t), (long long)n);
    if ((size_t)n * 4 > STAGE_BYTES)
        return dsq_fail(DSQ_ERR_UNSUPPORTED, "CUDA upload: vector %s too long", what);
    float *st = (float *)u->stage;
    for (int64_t i = 0; i < n; i++)
        st[i] = t->data ? dsq_tensor_get(t, i) : 0.0f;
    CU_TRY(cudaMemcpy(dst, st, (size_t)n * 4, cudaMemcpyHostToDevice), "weight upload");
    if (t->data)
        note_region(u, dst, 4, 1, n, n, per_layer, role, layer);
    return DSQ_OK;
}

static const dsq_tensor no_tensor = { NULL, DSQ_DT_F32, 0, { 0 }, 0 };

/* One layer's tensors into the places place_layer carved. */
static dsq_status upload_layer(uploader *u, const dsq_model *m, const dsq_config *c, const dsq_layer_weights *lw,
                               cu_layer *dl, int32_t l)
{
    const dsq_arch *a = c->arch;
    const int64_t E = c->n_embd, Q = dsq_arch_dim(c, DSQ_DIM_Q), KVD = dsq_arch_dim(c, DSQ_DIM_KV),
                  F = c->n_ff;
    for (int32_t i = 0; i < a->n_ops; i++) {
        const dsq_op *op = &a->recipe[i];
        const cu_op_data *d = &dl->op[i];
        dsq_bf16 *w = (dsq_bf16 *)d->w.data;
        switch (op->kind) {
        case DSQ_OP_NORM:
            DSQ_TRY(upload_f32(u, d->norm, &lw->t[op->w[0]], E, 1, op->w[0], l));
            break;
        case DSQ_OP_QKV_ROPE: {
            /* q, k, v rows one after the other, each with its bias */
            const int64_t rows[3] = { Q, KVD, KVD };
            int64_t r0 = 0;
            for (int j = 0; j < 3; j++) {
                const dsq_weight *qw = dsq_weights_qslot(&m->w, 1, op->w[j], l);
                if (d->w.format != DSQ_WF_BF16)
                    DSQ_TRY(cu_upload_quant(&d->w, qw, r0, 1));
                else
                    DSQ_TRY(upload_bf16(u, w + (size_t)(r0 * E), (size_t)E, &lw->t[op->w[j]], rows[j], E, 1,
                                        op->w[j], l));
                /* no bias slot in the recipe, or none in the checkpoint: zeros */
                const dsq_tensor *b = op->b[j] >= 0 ? &lw->t[op->b[j]] : &no_tensor;
                DSQ_TRY(upload_f32(u, d->bias + r0, b, rows[j], 1, op->b[j], l));
                r0 += rows[j];
            }
            break;
        }
        case DSQ_OP_LINEAR_RESID:
            if (d->w.format != DSQ_WF_BF16)
                DSQ_TRY(cu_upload_quant(&d->w, dsq_weights_qslot(&m->w, 1, op->w[0], l), 0, 1));
            else
                DSQ_TRY(upload_bf16(u, w, (size_t)d->w.cols, &lw->t[op->w[0]], E, d->w.cols, 1, op->w[0], l));
            if (d->bias)
                DSQ_TRY(upload_f32(u, d->bias, &lw->t[op->b[0]], E, 1, op->b[0], l));
            break;
        case DSQ_OP_GATED_FFN:
            if (d->w.format != DSQ_WF_BF16) { /* gate rows even, up rows odd */
                DSQ_TRY(cu_upload_quant(&d->w, dsq_weights_qslot(&m->w, 1, op->w[0], l), 0, 2));
                DSQ_TRY(cu_upload_quant(&d->w, dsq_weights_qslot(&m->w, 1, op->w[1], l), 1, 2));
                break;
            }
            DSQ_TRY(upload_bf16(u, w, (size_t)(2 * E), &lw->t[op->w[0]], F, E, 1, op->w[0], l));
            DSQ_TRY(upload_bf16(u, w + E, (size_t)(2 * E), &lw->t[op->w[1]], F, E, 1, op->w[1], l));
            break;
        case DSQ_OP_ATTEND:
            break;
        }
    }
    return DSQ_OK;
}

static dsq_status upload_all(dsq_model *m, cu_model *cm, uploader *u)
{
    const dsq_config *c = &m->cfg;
    const dsq_weights *w = &m->w;
    const dsq_tensor *emb = &w->g[DSQ_GW_TOK_EMBD], *head = &w->g[DSQ_GW_LM_HEAD];
    const int64_t E = c->n_embd, D = c->head_dim, V = c->n_vocab, L = c->n_layers;
    /* VH: rows of the head; fewer than V for a tensor-parallel rank, whose
     * head is its vocabulary slice (never tied, even when it starts at the
     * embedding's first row).  A quantized head is never a TP slice (api.c
     * refuses tensor parallelism of quantized weights). */
    const int64_t VH = head->ndim >= 1 && head->shape[0] > 0 ? head->shape[0] : V;
    const dsq_weight *hq = dsq_weights_qslot(w, 0, DSQ_GW_LM_HEAD, 0); /* a quantized head */
    const int tied = !hq && (c->tie_embeddings || !head->data || head->data == emb->data) && VH == V;

    /* quantized formats per (layer, op); the largest quantized matrix sizes
     * each context's dequantization tile */
    int *qf = (int *)calloc((size_t)(L * DSQ_MAX_OPS), sizeof *qf);
    if (!qf)
        return dsq_fail(DSQ_ERR_OUT_OF_MEMORY, "no host memory for the weight layout");
    dsq_status qst = DSQ_OK;
    cm->wq_tile_elems = 0;
    for (int64_t l = 0; l < L && qst == DSQ_OK; l++)
        for (int32_t i = 0; i < c->arch->n_ops && qst == DSQ_OK; i++)
            qst = cu_op_qformat(m, &c->arch->recipe[i], (int32_t)l, &qf[l * DSQ_MAX_OPS + i]);
    if (qst != DSQ_OK) {
        free(qf);
        return qst;
    }

    /* layout: sizes first (base NULL), then the real addresses */
    size_t off = 0;
    size_t o_embd = cu_carve(&off, (size_t)(V * E) * 2);
    size_t o_head = tied || hq ? o_embd : cu_carve(&off, (size_t)(VH * E) * 2);
    if (hq)
        (void)cu_place_quant(hq->format, V, E, DSQ_WL_ROWS, NULL, &off);
    size_t o_onorm = cu_carve(&off, (size_t)E * 4);
    size_t o_freq = cu_carve(&off, (size_t)(D / 2) * 4);
    const size_t o_layers = off;
    for (int64_t l = 0; l < L; l++)
        place_layer(c, qf + l * DSQ_MAX_OPS, &cm->layers[l], NULL, &off);
    cm->arena_bytes = off;
    cudaError_t ce = cudaMalloc(&cm->arena, off);
    if (ce != cudaSuccess) {
        free(qf);
        cudaGetLastError();
        cm->arena = NULL;
        if (ce == cudaErrorMemoryAllocation)
            return dsq_fail(DSQ_ERR_DEVICE_OOM, "CUDA device %d: cannot allocate %.2f GB for the weights",
                            cm->device, (double)off / 1e9);
        return dsq_cu_status(ce, "weight allocation");
    }
    char *base = (char *)cm->arena;
    cm->tok_embd = (dsq_bf16 *)(base + o_embd);
    cm->lm_head = bf16_weight(base + o_head, VH, E, DSQ_WL_ROWS);
    if (hq) { /* carved right after the embedding, as in the sizing pass */
        size_t hoff = o_embd + (size_t)(V * E) * 2;
        cm->lm_head = cu_place_quant(hq->format, V, E, DSQ_WL_ROWS, base, &hoff);
    }
    cm->out_norm = (float *)(base + o_onorm);
    cm->inv_freq = (float *)(base + o_freq);
    off = o_layers;
    for (int64_t l = 0; l < L; l++) {
        place_layer(c, qf + l * DSQ_MAX_OPS, &cm->layers[l], base, &off);
        for (int32_t i = 0; i < c->arch->n_ops; i++) {
            const dsq_weight *qw = &cm->layers[l].op[i].w;
            if (qf[l * DSQ_MAX_OPS + i] && qw->rows * qw->cols > cm->wq_tile_elems)
                cm->wq_tile_elems = qw->rows * qw->cols;
        }
    }
    free(qf);

    /* contents, in layout order (progress counts bytes placed) */
    DSQ_TRY(upload_bf16(u, cm->tok_embd, (size_t)E, emb, V, E, 0, DSQ_GW_TOK_EMBD, 0));
    if (hq)
        DSQ_TRY(cu_upload_quant(&cm->lm_head, hq, 0, 1));
    else if (!tied)
        DSQ_TRY(upload_bf16(u, (dsq_bf16 *)cm->lm_head.data, (size_t)E, head, VH, E, 0, DSQ_GW_LM_HEAD, 0));
    DSQ_TRY(upload_f32(u, cm->out_norm, &w->g[DSQ_GW_OUT_NORM], E, 0, DSQ_GW_OUT_NORM, 0));
    {
        /* HF: inv_freq = 1 / theta ** (arange(0, D, 2).float() / D), all fp32 */
        float *fq = (float *)u->stage;
        for (int64_t i = 0; i < D / 2; i++)
            fq[i] = 1.0f / powf(c->rope_theta, (float)(2 * i) / (float)D);
        CU_TRY(cudaMemcpy(cm->inv_freq, fq, (size_t)(D / 2) * 4, cudaMemcpyHostToDevice), "weight upload");
    }
    DSQ_TRY(dsq_load_progress(m, (int64_t)o_layers, (int64_t)cm->arena_bytes));
    for (int64_t l = 0; l < L; l++) {
        DSQ_TRY(upload_layer(u, m, c, &w->layers[l], &cm->layers[l], (int32_t)l));
        /* layers are equal in size: the end of layer l, exactly the total at the last */
        const size_t done = o_layers + (cm->arena_bytes - o_layers) * (size_t)(l + 1) / (size_t)L;
        DSQ_TRY(dsq_load_progress(m, (int64_t)done, (int64_t)cm->arena_bytes));
    }
    return DSQ_OK;
}

/* Refuse non-finite weights, naming the tensor: one device flag per
 * uploaded tensor, set by a check of its uploaded copy (so values that
 * overflowed bf16 count too), read back with one copy.  Runs on the legacy
 * default stream, after the synchronous uploads. */
static dsq_status check_finite(const uploader *u)
{
    const int n = u->n_rg;
    uint32_t *hf = (uint32_t *)calloc((size_t)(n > 0 ? n : 1), sizeof *hf);
    uint32_t *df = NULL;
    dsq_status st = DSQ_OK;
    if (!hf)
        return dsq_fail(DSQ_ERR_OUT_OF_MEMORY, "no host memory for the non-finite weight check");
    if ((st = dsq_cu_status(cudaMalloc(&df, (size_t)n * sizeof *df), "non-finite check flags")) != DSQ_OK) {
        df = NULL;
        goto done;
    }
    if ((st = dsq_cu_status(cudaMemset(df, 0, (size_t)n * sizeof *df), "non-finite check flags")) != DSQ_OK)
        goto done;
    for (int i = 0; i < n && st == DSQ_OK; i++) {
        const region *g = &u->rg[i];
        st = dsq_cu_flag_nonfinite(g->p, g->eb, g->rows, g->cols, g->pitch, df + i, 0);
    }
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
                          u->rg[i].name, u->rg[i].eb == 2 ? "bf16" : "fp32");
            break;
        }
done:
    if (df)
        cudaFree(df);
    free(hf);
    return st;
}

void cu_model_free(dsq_model *m)
{
    cu_model *cm = (cu_model *)m->be;
    if (!cm)
        return;
    if (cm->tp) {
        cu_tp_model_free(m);
        return;
    }
    cu_device_guard g(cm->device);
    cudaFree(cm->arena);
    cudaGetLastError(); /* teardown errors are not reported */
    free(cm->layers);
    free(cm);
    m->be = NULL;
    m->device_bytes = 0;
}

/* Everything but the device check and the guard (cu_model_load). */
static dsq_status load_on_device(dsq_model *m, const dsq_model_params *p, cu_model *cm)
{
    const dsq_config *c = &m->cfg;
    uploader u;
    memset(&u, 0, sizeof u);
    u.arch = c->arch;
    u.cap = c->arch->n_tensors * c->n_layers + DSQ_GW_COUNT;
    u.rg = (region *)calloc((size_t)u.cap, sizeof *u.rg);
    if (!u.rg)
        return dsq_fail(DSQ_ERR_OUT_OF_MEMORY, "no host memory for the weight list");
    dsq_status st = dsq_cu_status(cudaDeviceGetAttribute(&cm->n_sms, cudaDevAttrMultiProcessorCount, p->device),
                                  "device query");
    if (st == DSQ_OK) {
        cudaError_t ce = cudaMallocHost(&u.stage, STAGE_BYTES);
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
        st = check_finite(&u);
    if (u.stage)
        cudaFreeHost(u.stage);
    free(u.rg);
    return st;
}

dsq_status cu_model_load(dsq_model *m, const dsq_model_params *p)
{
    /* tp_world 1 with tp_devices or tp_id: one rank through NCCL (a
     * communicator of one; the path tensor parallelism takes, on one GPU) */
    if (p->tp_world > 1 || (p->tp_world == 1 && (p->tp_devices || p->tp_id)))
        return cu_tp_model_load(m, p);
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
    if (!c->arch)
        return dsq_fail(DSQ_ERR_INTERNAL, "CUDA backend: the config names no architecture");
    if (c->head_dim % 2 != 0)
        return dsq_fail(DSQ_ERR_UNSUPPORTED, "CUDA backend: head_dim %d must be even", c->head_dim);
    if (c->arch->n_ops > DSQ_MAX_OPS)
        return dsq_fail(DSQ_ERR_INTERNAL, "CUDA backend: recipe of %d ops", c->arch->n_ops);
    cu_device_guard g(p->device);
    if (g.st != DSQ_OK)
        return g.st;

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
    dsq_status st = load_on_device(m, p, cm);
    if (st != DSQ_OK) {
        cu_model_free(m);
        return st;
    }
    m->device_bytes = (int64_t)cm->arena_bytes;
    /* Everything lives on the GPU now: drop the mapping, and with it every
     * host view's data (sizes and dtypes stay for dsq_model_get_info). */
    dsq_st_close(m->st);
    m->st = NULL;
    dsq_weights_forget_data(&m->w, c->n_layers);
    dsq_qweights_free(m->w.q); /* the quantized arrays too: they live on the device */
    m->w.q = NULL;
    return DSQ_OK;
}
