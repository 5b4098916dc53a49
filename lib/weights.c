/*
 * weights.c - bind the tensors a Qwen2 config implies to views into the
 * safetensors set, checking each one's dtype and exact shape.
 *
 * Names follow Hugging Face's Qwen2ForCausalLM state dict:
 *   model.embed_tokens.weight                         [V, E]
 *   model.layers.N.input_layernorm.weight             [E]
 *   model.layers.N.self_attn.q_proj.{weight,bias}     [H*D, E], [H*D]
 *   model.layers.N.self_attn.k_proj.{weight,bias}     [K*D, E], [K*D]
 *   model.layers.N.self_attn.v_proj.{weight,bias}     [K*D, E], [K*D]
 *   model.layers.N.self_attn.o_proj.weight            [E, H*D]
 *   model.layers.N.post_attention_layernorm.weight    [E]
 *   model.layers.N.mlp.{gate,up}_proj.weight          [F, E]
 *   model.layers.N.mlp.down_proj.weight               [E, F]
 *   model.norm.weight                                 [E]
 *   lm_head.weight                                    [V, E] (absent or ignored when tied)
 * Tensors in the file that the config does not imply are left alone (older
 * checkpoints carry e.g. rotary inv_freq buffers); their count is logged.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

static void shape_str(char *buf, size_t cap, int32_t ndim, const int64_t *shape)
{
    size_t k = 0;
    k += (size_t)snprintf(buf + k, cap - k, "[");
    for (int32_t i = 0; i < ndim && k < cap; i++)
        k += (size_t)snprintf(buf + k, cap - k, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (k < cap)
        snprintf(buf + k, cap - k, "]");
}

/* Find `name`, check dtype and shape (d1 == 0 means a 1-D [d0] tensor). */
static dsq_status bind_one(const dsq_st_set *st, const char *name, int64_t d0, int64_t d1,
                           dsq_tensor *out)
{
    int64_t want[2] = { d0, d1 };
    int32_t want_ndim = d1 ? 2 : 1;
    char ws[64], gs[160];
    const dsq_st_entry *e = dsq_st_find(st, name);
    if (!e) {
        shape_str(ws, sizeof ws, want_ndim, want);
        return dsq_fail(DSQ_ERR_MISSING_TENSOR,
                        "tensor '%s' %s (BF16/F16/F32) is missing from the safetensors", name, ws);
    }
    if (e->t.dtype != DSQ_DT_F32 && e->t.dtype != DSQ_DT_F16 && e->t.dtype != DSQ_DT_BF16)
        return dsq_fail(DSQ_ERR_DTYPE, "tensor '%s' has dtype %s; only BF16, F16 and F32 are supported",
                        name, e->dtype_str);
    int ok = e->t.ndim == want_ndim;
    for (int32_t i = 0; ok && i < want_ndim; i++)
        ok = e->t.shape[i] == want[i];
    if (!ok) {
        shape_str(ws, sizeof ws, want_ndim, want);
        shape_str(gs, sizeof gs, e->t.ndim, e->t.shape);
        return dsq_fail(DSQ_ERR_SHAPE, "tensor '%s' has shape %s, expected %s", name, gs, ws);
    }
    *out = e->t;
    return DSQ_OK;
}

/* Add a bound tensor to the totals; *n_bound counts tensors taken from the set. */
static void count(dsq_weights *w, const dsq_tensor *t, int32_t *n_bound)
{
    w->n_params += dsq_tensor_numel(t);
    w->n_bytes += (int64_t)t->nbytes;
    (*n_bound)++;
}

dsq_status dsq_weights_bind(const dsq_st_set *st, const dsq_config *cfg, dsq_weights *w)
{
    if (!st || !cfg || !w)
        return dsq_fail(DSQ_ERR_INVALID_ARG, "dsq_weights_bind: NULL argument");
    memset(w, 0, sizeof *w);
    const int64_t E = cfg->n_embd, H = cfg->n_heads, K = cfg->n_kv_heads, D = cfg->head_dim,
                  F = cfg->n_ff, V = cfg->n_vocab;
    if (cfg->n_layers < 1 || E < 1 || H < 1 || K < 1 || D < 1 || F < 1 || V < 1)
        return dsq_fail(DSQ_ERR_CONFIG, "dsq_weights_bind: config has non-positive sizes");

    w->layers = calloc((size_t)cfg->n_layers, sizeof *w->layers);
    if (!w->layers)
        return dsq_fail(DSQ_ERR_OUT_OF_MEMORY, "no memory for %d layer descriptors", cfg->n_layers);

    dsq_status s;
    int32_t n_bound = 0;
    if ((s = bind_one(st, "model.embed_tokens.weight", V, E, &w->tok_embd)) != DSQ_OK)
        goto fail;
    count(w, &w->tok_embd, &n_bound);

    char name[128];
    for (int32_t l = 0; l < cfg->n_layers; l++) {
        dsq_layer_weights *L = &w->layers[l];
        const struct {
            const char *suffix;
            int64_t d0, d1;
            dsq_tensor *t;
        } want[] = {
            { "input_layernorm.weight", E, 0, &L->attn_norm },
            { "self_attn.q_proj.weight", H * D, E, &L->wq },
            { "self_attn.q_proj.bias", H * D, 0, &L->bq },
            { "self_attn.k_proj.weight", K * D, E, &L->wk },
            { "self_attn.k_proj.bias", K * D, 0, &L->bk },
            { "self_attn.v_proj.weight", K * D, E, &L->wv },
            { "self_attn.v_proj.bias", K * D, 0, &L->bv },
            { "self_attn.o_proj.weight", E, H * D, &L->wo },
            { "post_attention_layernorm.weight", E, 0, &L->ffn_norm },
            { "mlp.gate_proj.weight", F, E, &L->w_gate },
            { "mlp.up_proj.weight", F, E, &L->w_up },
            { "mlp.down_proj.weight", E, F, &L->w_down },
        };
        for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
            snprintf(name, sizeof name, "model.layers.%d.%s", (int)l, want[i].suffix);
            if ((s = bind_one(st, name, want[i].d0, want[i].d1, want[i].t)) != DSQ_OK)
                goto fail;
            count(w, want[i].t, &n_bound);
        }
    }

    if ((s = bind_one(st, "model.norm.weight", E, 0, &w->out_norm)) != DSQ_OK)
        goto fail;
    count(w, &w->out_norm, &n_bound);

    if (cfg->tie_embeddings) {
        /* Tied: the head is the embedding; a stored lm_head.weight (some
         * exporters write one anyway) is ignored, as transformers does. */
        w->lm_head = w->tok_embd;
    } else {
        if ((s = bind_one(st, "lm_head.weight", V, E, &w->lm_head)) != DSQ_OK) {
            if (s == DSQ_ERR_MISSING_TENSOR)
                s = dsq_fail(s,
                             "tensor 'lm_head.weight' [%lld, %lld] is missing and config.json "
                             "says tie_word_embeddings is false",
                             (long long)V, (long long)E);
            goto fail;
        }
        count(w, &w->lm_head, &n_bound);
    }

    int32_t unused = dsq_st_count(st) - n_bound -
                     (cfg->tie_embeddings && dsq_st_find(st, "lm_head.weight") ? 1 : 0);
    if (unused > 0)
        dsq_log(DSQ_LOG_INFO, "%d tensor(s) in the safetensors are not used by the model",
                (int)unused);
    return DSQ_OK;

fail:
    dsq_weights_release(w);
    return s;
}

void dsq_weights_release(dsq_weights *w)
{
    if (!w)
        return;
    free(w->layers);
    memset(w, 0, sizeof *w);
}
