/*
 * backend_persist.cu - the CUDA backend's use of the persistent batch-1
 * decode kernel (decode_persist.h): which contexts qualify, the device
 * table of layer pointers it reads, and the pass hook.
 *
 * DSQ_CUDA_PERSIST (read at context creation): "1" runs batch-1 decode
 * steps' layers through it where the model, cache and device qualify;
 * "0" or unset, the per-kernel pass (docs/performance.md, knobs).
 */
#include <stdlib.h>
#include <string.h>

#include "backend.h"

/* The Qwen2 recipe the kernel implements, op by op. */
static int recipe_is_qwen2(const dsq_arch *a)
{
    static const int kinds[7] = {DSQ_OP_NORM,         DSQ_OP_QKV_ROPE, DSQ_OP_ATTEND,      DSQ_OP_LINEAR_RESID,
                                 DSQ_OP_NORM,         DSQ_OP_GATED_FFN, DSQ_OP_LINEAR_RESID};
    if (a->n_ops != 7)
        return 0;
    for (int i = 0; i < 7; i++)
        if ((int)a->recipe[i].kind != kinds[i])
            return 0;
    return a->recipe[3].in == DSQ_IN_ATT && a->recipe[6].in == DSQ_IN_ACT;
}

static const char *layer_unfit(const cu_layer *L)
{
    const cu_op_data *o = L->op;
    if (o[1].w.format != DSQ_WF_BF16 || o[3].w.format != DSQ_WF_BF16 || o[5].w.format != DSQ_WF_BF16 ||
        o[6].w.format != DSQ_WF_BF16)
        return "quantized weights";
    if (o[5].w.layout != DSQ_WL_GATE_UP)
        return "gate/up not row-interleaved";
    if (o[3].bias || o[6].bias)
        return "biases on o or down";
    if (!o[1].bias)
        return "no q|k|v bias vector";
    return NULL;
}

void cu_persist_free(cu_ctx *cc)
{
    cudaFree(cc->persist_mem);
    cc->persist_mem = NULL;
    cc->persist_layers = NULL;
    cc->persist_sync = NULL;
    cc->persist_part = NULL;
}

dsq_status cu_persist_setup(dsq_ctx *c)
{
    cu_ctx *cc = (cu_ctx *)c->be;
    const dsq_model *m = c->model;
    const cu_model *cm = (const cu_model *)m->be;
    const dsq_config *cf = &m->cfg;
    const char *env = getenv("DSQ_CUDA_PERSIST");
    if (!(env && env[0] == '1' && env[1] == 0))
        return DSQ_OK;
    const char *why = NULL;
    if (cm->tp)
        why = "tensor parallelism";
    else if (c->p.kv_dtype != DSQ_KV_F16)
        why = "INT8 KV cache";
    else if (cc->resid_after)
        why = "DSQ_CUDA_RESIDUAL=after";
    else if (!recipe_is_qwen2(cf->arch))
        why = "not the Qwen2 layer recipe";
    for (int32_t l = 0; !why && l < cf->n_layers; l++)
        why = layer_unfit(&cm->layers[l]);
    if (!why)
        (void)dsq_persist_supported(cf->n_embd, cf->n_heads, cf->n_kv_heads, cf->head_dim, cf->n_ff, &why);
    if (why) {
        dsq_log(DSQ_LOG_INFO, "DSQ_CUDA_PERSIST: batch-1 decode steps keep the per-kernel pass (%s)", why);
        return DSQ_OK;
    }
    const int32_t NLy = cf->n_layers;
    dsq_persist_layer *t = (dsq_persist_layer *)calloc((size_t)NLy, sizeof *t);
    if (!t)
        return dsq_fail(DSQ_ERR_OUT_OF_MEMORY, "no host memory for the persistent kernel's layer table");
    for (int32_t l = 0; l < NLy; l++) {
        const cu_op_data *o = cm->layers[l].op;
        t[l].norm_attn = o[0].norm;
        t[l].w_qkv = (const uint16_t *)o[1].w.data;
        t[l].b_qkv = o[1].bias;
        t[l].w_o = (const uint16_t *)o[3].w.data;
        t[l].norm_ffn = o[4].norm;
        t[l].w_gu = (const uint16_t *)o[5].w.data;
        t[l].w_down = (const uint16_t *)o[6].w.data;
        t[l].k = cc->kv[l].k;
        t[l].v = cc->kv[l].v;
    }
    size_t off = 0;
    const size_t o_tab = cu_carve(&off, (size_t)NLy * sizeof *t);
    const size_t o_sync = cu_carve(&off, DSQ_PERSIST_SYNC_WORDS * 4);
    const size_t o_part = cu_carve(&off, dsq_persist_part_bytes(cf->n_heads, cf->n_kv_heads, cf->head_dim));
    cudaError_t ce = cudaMalloc(&cc->persist_mem, off);
    if (ce != cudaSuccess) {
        free(t);
        cudaGetLastError();
        cc->persist_mem = NULL;
        return dsq_fail(DSQ_ERR_DEVICE_OOM, "cannot allocate %.1f MB of GPU memory for the persistent decode kernel "
                        "(%s)", (double)off / 1e6, cudaGetErrorString(ce));
    }
    char *b = (char *)cc->persist_mem;
    cc->persist_layers = (const dsq_persist_layer *)(b + o_tab);
    cc->persist_sync = (uint32_t *)(b + o_sync);
    cc->persist_part = (float *)(b + o_part);
    ce = cudaMemcpyAsync(b + o_tab, t, (size_t)NLy * sizeof *t, cudaMemcpyHostToDevice, cc->stream);
    if (ce == cudaSuccess)
        ce = cudaMemsetAsync(cc->persist_sync, 0, DSQ_PERSIST_SYNC_WORDS * 4, cc->stream);
    if (ce == cudaSuccess) /* the table is host memory about to be freed */
        ce = cudaStreamSynchronize(cc->stream);
    free(t);
    if (ce != cudaSuccess) {
        cu_persist_free(cc);
        return dsq_cu_status(ce, "persistent decode kernel setup");
    }
    c->scratch_bytes += (int64_t)off;
    dsq_log(DSQ_LOG_INFO, "DSQ_CUDA_PERSIST: batch-1 decode steps run the persistent kernel (%d layers)",
            (int)NLy);
    return DSQ_OK;
}

int cu_persist_pass(const cu_ctx *cc, const cu_pass *p)
{
    return cc->persist_mem && p->decode && p->T == 1 && p->S == 1 && p->nd == 0;
}

dsq_status cu_persist_layers(dsq_ctx *c, const cu_pass *p)
{
    cu_ctx *cc = (cu_ctx *)c->be;
    const cu_model *cm = (const cu_model *)c->model->be;
    const dsq_config *cf = &c->model->cfg;
    dsq_persist_args a;
    memset(&a, 0, sizeof a);
    a.layers = cc->persist_layers;
    a.n_layers = cf->n_layers;
    a.E = cf->n_embd;
    a.H = cf->n_heads;
    a.KV = cf->n_kv_heads;
    a.D = cf->head_dim;
    a.F = cf->n_ff;
    a.eps = cf->rms_eps;
    a.inv_freq = cm->inv_freq;
    a.x = cc->x;
    a.qkv = cc->qkv;
    a.attn = cc->attn;
    a.act = cc->act;
    a.part = cc->persist_part;
    a.sync = cc->persist_sync;
    a.len = p->len;
    a.block_table = p->bt;
    a.block_size = cc->kv[0].block_size;
    return dsq_persist_decode(&a, cc->stream);
}
