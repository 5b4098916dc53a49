/* tp_weights.c - a rank's views and copies of the weights (tp_weights.h). */
#include <stdlib.h>
#include <string.h>

#include "arch.h"
#include "tp_weights.h"

void dsq_tp_rank_config(const dsq_config *cfg, const dsq_tp_slice *s, dsq_config *out)
{
    *out = *cfg;
    out->n_heads = s->n_q_heads;
    out->n_kv_heads = s->n_kv_heads;
    out->n_ff = s->n_ff;
    /* the rank's head is its own slice, never the whole embedding */
    if (s->world > 1)
        out->tie_embeddings = 0;
}

/* [start, count) of dimension d that rank s holds; 0 if d is not split. */
static int dim_range(const dsq_config *cfg, const dsq_tp_slice *s, dsq_dim d, int64_t *start, int64_t *count)
{
    const int64_t D = cfg->head_dim;
    switch (d) {
    case DSQ_DIM_Q:
        *start = (int64_t)s->q_head0 * D;
        *count = (int64_t)s->n_q_heads * D;
        return 1;
    case DSQ_DIM_KV:
        *start = (int64_t)s->kv_head0 * D;
        *count = (int64_t)s->n_kv_heads * D;
        return 1;
    case DSQ_DIM_FF:
        *start = s->ff0;
        *count = s->n_ff;
        return 1;
    case DSQ_DIM_VOCAB:
        *start = s->vocab0;
        *count = s->n_vocab;
        return 1;
    default:
        return 0;
    }
}

/* Bytes the column slice of spec sp takes (0 for other splits). */
static size_t col_copy_bytes(const dsq_config *cfg, const dsq_tp_slice *s, const dsq_tensor_spec *sp,
                             const dsq_tensor *t)
{
    int64_t c0, n;
    if (sp->split != DSQ_TP_ROW || !t->data || t->ndim != 2 || !dim_range(cfg, s, sp->cols, &c0, &n))
        return 0;
    size_t b = (size_t)t->shape[0] * (size_t)n * dsq_dtype_size(t->dtype);
    return (b + 63) & ~(size_t)63; /* each copy 64-byte aligned */
}

/* out = the rank's tensor of spec sp from full tensor t; copies go to *arena. */
static dsq_status slice_one(const dsq_config *cfg, const dsq_tp_slice *s, const dsq_tensor_spec *sp,
                            const dsq_tensor *t, dsq_tensor *out, char **arena)
{
    *out = *t;
    if (sp->split == DSQ_TP_REPLICATED)
        return DSQ_OK;
    const size_t esz = dsq_dtype_size(t->dtype);
    int64_t r0, n;
    if (sp->split == DSQ_TP_COLUMN || sp->split == DSQ_TP_VOCAB) {
        if (!dim_range(cfg, s, sp->rows, &r0, &n) || t->ndim < 1 || r0 + n > t->shape[0])
            return dsq_fail(DSQ_ERR_INTERNAL, "tensor parallelism: '%s' cannot be split by rows", sp->name);
        const int64_t row_elems = t->ndim == 2 ? t->shape[1] : 1;
        out->shape[0] = n;
        out->nbytes = (size_t)n * (size_t)row_elems * esz;
        if (t->data)
            out->data = (const char *)t->data + (size_t)r0 * (size_t)row_elems * esz;
        return DSQ_OK;
    }
    /* DSQ_TP_ROW: columns [c0, c0+n) of each row */
    if (!dim_range(cfg, s, sp->cols, &r0, &n) || t->ndim != 2 || r0 + n > t->shape[1])
        return dsq_fail(DSQ_ERR_INTERNAL, "tensor parallelism: '%s' cannot be split by columns", sp->name);
    out->shape[1] = n;
    out->nbytes = (size_t)t->shape[0] * (size_t)n * esz;
    if (!t->data)
        return DSQ_OK;
    char *dst = *arena;
    const char *src = (const char *)t->data + (size_t)r0 * esz;
    const size_t row_in = (size_t)t->shape[1] * esz, row_out = (size_t)n * esz;
    for (int64_t r = 0; r < t->shape[0]; r++)
        memcpy(dst + (size_t)r * row_out, src + (size_t)r * row_in, row_out);
    out->data = dst;
    *arena += (out->nbytes + 63) & ~(size_t)63;
    return DSQ_OK;
}

dsq_status dsq_tp_weights_make(const dsq_config *cfg, const dsq_weights *full, const dsq_tp_slice *s,
                               dsq_tp_weights *out)
{
    if (!out)
        return dsq_fail(DSQ_ERR_INTERNAL, "tensor parallelism: no output for the rank's weights");
    memset(out, 0, sizeof *out);
    if (!cfg || !cfg->arch || !full || !full->layers || !s)
        return dsq_fail(DSQ_ERR_INTERNAL, "tensor parallelism: no model to slice");
    const dsq_arch *a = cfg->arch;
    size_t bytes = 0;
    for (int32_t i = 0; i < a->n_tensors; i++) {
        const dsq_tensor_spec *sp = &a->tensors[i];
        if (!sp->per_layer)
            bytes += col_copy_bytes(cfg, s, sp, &full->g[sp->role]);
        else
            for (int32_t l = 0; l < cfg->n_layers; l++)
                bytes += col_copy_bytes(cfg, s, sp, &full->layers[l].t[sp->role]);
    }
    out->w.layers = calloc((size_t)cfg->n_layers, sizeof *out->w.layers);
    out->owned = bytes ? aligned_alloc(64, bytes) : NULL;
    if (!out->w.layers || (bytes && !out->owned)) {
        free(out->w.layers);
        free(out->owned);
        memset(out, 0, sizeof *out);
        return dsq_fail(DSQ_ERR_OUT_OF_MEMORY, "no memory for rank %d's weight slices (%zu bytes)", s->rank,
                        bytes);
    }
    out->owned_bytes = bytes;
    out->s = *s;
    dsq_tp_rank_config(cfg, s, &out->cfg);
    /* roles the table does not name (none today) stay as the full views */
    memcpy(out->w.g, full->g, sizeof out->w.g);
    for (int32_t l = 0; l < cfg->n_layers; l++)
        out->w.layers[l] = full->layers[l];
    char *arena = out->owned;
    dsq_status st = DSQ_OK;
    for (int32_t i = 0; i < a->n_tensors && st == DSQ_OK; i++) {
        const dsq_tensor_spec *sp = &a->tensors[i];
        if (!sp->per_layer)
            st = slice_one(cfg, s, sp, &full->g[sp->role], &out->w.g[sp->role], &arena);
        else
            for (int32_t l = 0; l < cfg->n_layers && st == DSQ_OK; l++)
                st = slice_one(cfg, s, sp, &full->layers[l].t[sp->role], &out->w.layers[l].t[sp->role], &arena);
    }
    out->w.n_params = full->n_params;
    out->w.n_bytes = full->n_bytes;
    if (st != DSQ_OK)
        dsq_tp_weights_free(out);
    return st;
}

void dsq_tp_weights_free(dsq_tp_weights *tw)
{
    if (!tw)
        return;
    free(tw->w.layers);
    free(tw->owned);
    memset(tw, 0, sizeof *tw);
}
