/* arch.c - the registry of model descriptions and what every architecture
 * shares: dimension sizes, tensor names, KV bytes per token. */
#include <stdio.h>

#include "arch.h"

const dsq_arch *const dsq_archs[] = { &dsq_arch_qwen2, NULL };

int64_t dsq_arch_dim(const dsq_config *cfg, dsq_dim d)
{
    switch (d) {
    case DSQ_DIM_EMBD: return cfg->n_embd;
    case DSQ_DIM_Q: return (int64_t)cfg->n_heads * cfg->head_dim;
    case DSQ_DIM_KV: return (int64_t)cfg->n_kv_heads * cfg->head_dim;
    case DSQ_DIM_FF: return cfg->n_ff;
    case DSQ_DIM_VOCAB: return cfg->n_vocab;
    case DSQ_DIM_NONE: break;
    }
    return 0;
}

const dsq_tensor_spec *dsq_arch_tensor(const dsq_arch *a, int per_layer, int32_t role)
{
    for (int32_t i = 0; a && i < a->n_tensors; i++)
        if (a->tensors[i].role == role && a->tensors[i].per_layer == (per_layer != 0))
            return &a->tensors[i];
    return NULL;
}

const char *dsq_arch_tensor_name(const dsq_arch *a, int per_layer, int32_t role, int32_t layer,
                                 char *buf, size_t cap)
{
    const dsq_tensor_spec *s = dsq_arch_tensor(a, per_layer, role);
    if (!s)
        snprintf(buf, cap, "(unnamed)");
    else if (s->per_layer)
        snprintf(buf, cap, s->name, (int)layer);
    else
        snprintf(buf, cap, "%s", s->name);
    return buf;
}

int64_t dsq_kv_bytes_per_token(const dsq_config *cfg, int32_t kv_dtype)
{
    const int64_t elem = kv_dtype == DSQ_KV_F32 ? 4 : kv_dtype == DSQ_KV_INT8 ? 1 : 2;
    const int64_t scale = kv_dtype == DSQ_KV_INT8 ? 4 : 0; /* one fp32 per (token, head) */
    return (int64_t)cfg->n_layers * 2 * cfg->n_kv_heads * ((int64_t)cfg->head_dim * elem + scale);
}
