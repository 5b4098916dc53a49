/*
 * arch_qwen2.c - the Qwen2 description (Hugging Face Qwen2ForCausalLM):
 * DeepSeek-R1-Distill-Qwen 1.5B / 7B / 14B / 32B and any other Qwen2 size.
 *
 * Config: only what the forward pass uses is read; everything that would
 * change the math in a way the backends do not implement (sliding-window
 * attention, RoPE scaling, another activation, mrope) is refused with
 * DSQ_ERR_UNSUPPORTED rather than silently ignored.
 */
#include <string.h>

#include "arch.h"
#include "config_fields.h"

/* Features that change the math in ways the backends do not implement. */
static dsq_status check_unsupported(const cJSON *root)
{
    const char *act = NULL;
    dsq_status st = dsq_cfg_string(root, "hidden_act", &act);
    if (st != DSQ_OK)
        return st;
    if (act && strcmp(act, "silu") != 0)
        return dsq_fail(DSQ_ERR_UNSUPPORTED,
                        "config.json: hidden_act \"%.64s\" is not supported (only \"silu\")", act);
    int b = 0;
    if ((st = dsq_cfg_bool(root, "use_sliding_window", 0, &b)) != DSQ_OK)
        return st;
    if (b)
        return dsq_fail(DSQ_ERR_UNSUPPORTED,
                        "config.json: use_sliding_window = true is not supported");
    if ((st = dsq_cfg_bool(root, "use_mrope", 0, &b)) != DSQ_OK)
        return st;
    if (b)
        return dsq_fail(DSQ_ERR_UNSUPPORTED, "config.json: use_mrope = true is not supported");
    if (dsq_cfg_has(root, "rope_scaling"))
        return dsq_fail(DSQ_ERR_UNSUPPORTED,
                        "config.json: rope_scaling is set; only plain RoPE (rope_scaling null) "
                        "is supported");
    return DSQ_OK;
}

static dsq_status qwen2_parse(const void *json, dsq_config *c)
{
    const cJSON *root = json;
    dsq_status st;
    if ((st = check_unsupported(root)) != DSQ_OK ||
        (st = dsq_cfg_size(root, "vocab_size", &c->n_vocab)) != DSQ_OK ||
        (st = dsq_cfg_size(root, "hidden_size", &c->n_embd)) != DSQ_OK ||
        (st = dsq_cfg_size(root, "num_hidden_layers", &c->n_layers)) != DSQ_OK ||
        (st = dsq_cfg_size(root, "num_attention_heads", &c->n_heads)) != DSQ_OK ||
        (st = dsq_cfg_size(root, "num_key_value_heads", &c->n_kv_heads)) != DSQ_OK ||
        (st = dsq_cfg_size(root, "intermediate_size", &c->n_ff)) != DSQ_OK ||
        (st = dsq_cfg_size(root, "max_position_embeddings", &c->max_pos)) != DSQ_OK ||
        (st = dsq_cfg_float(root, "rms_norm_eps", 1, 0, 1.0, &c->rms_eps)) != DSQ_OK ||
        (st = dsq_cfg_float(root, "rope_theta", 0, 10000.0, 1e12, &c->rope_theta)) != DSQ_OK ||
        (st = dsq_cfg_bool(root, "tie_word_embeddings", 0, &c->tie_embeddings)) != DSQ_OK)
        return st;
    if (c->n_heads % c->n_kv_heads != 0)
        return dsq_fail(DSQ_ERR_CONFIG,
                        "config.json: num_attention_heads (%d) is not a multiple of "
                        "num_key_value_heads (%d)",
                        c->n_heads, c->n_kv_heads);
    if (dsq_cfg_has(root, "head_dim")) {
        if ((st = dsq_cfg_size(root, "head_dim", &c->head_dim)) != DSQ_OK)
            return st;
    } else {
        if (c->n_embd % c->n_heads != 0)
            return dsq_fail(DSQ_ERR_CONFIG,
                            "config.json: hidden_size (%d) is not a multiple of "
                            "num_attention_heads (%d) and head_dim is not given",
                            c->n_embd, c->n_heads);
        c->head_dim = c->n_embd / c->n_heads;
    }
    if (c->head_dim % 2 != 0)
        return dsq_fail(DSQ_ERR_CONFIG, "config.json: head_dim = %d must be even (RoPE pairs dims)",
                        c->head_dim);
    if ((int64_t)c->n_heads * c->head_dim >= DSQ_CFG_MAX_DIM)
        return dsq_fail(DSQ_ERR_CONFIG,
                        "config.json: num_attention_heads x head_dim = %lld is out of range",
                        (long long)c->n_heads * c->head_dim);
    return DSQ_OK;
}

#define L_(role, name, r, c, f, sp) { role, 1, "model.layers.%d." name, r, c, f, sp }

/* The state dict of Qwen2ForCausalLM, with each tensor's tensor-parallel
 * split (Megatron: q/k/v and gate/up by output rows, o_proj and down by
 * input columns, the head by vocabulary; lib/tp_plan.h).  q/k/v biases are optional: Qwen2
 * checkpoints have them, but a fine-tune or converter may drop them, and
 * transformers then uses zeros; every backend does the same. */
static const dsq_tensor_spec qwen2_tensors[] = {
    { DSQ_GW_TOK_EMBD, 0, "model.embed_tokens.weight", DSQ_DIM_VOCAB, DSQ_DIM_EMBD, 0, DSQ_TP_REPLICATED },
    L_(DSQ_LW_ATTN_NORM, "input_layernorm.weight", DSQ_DIM_EMBD, DSQ_DIM_NONE, 0, DSQ_TP_REPLICATED),
    L_(DSQ_LW_Q, "self_attn.q_proj.weight", DSQ_DIM_Q, DSQ_DIM_EMBD, 0, DSQ_TP_COLUMN),
    L_(DSQ_LW_Q_BIAS, "self_attn.q_proj.bias", DSQ_DIM_Q, DSQ_DIM_NONE, DSQ_TF_OPTIONAL, DSQ_TP_COLUMN),
    L_(DSQ_LW_K, "self_attn.k_proj.weight", DSQ_DIM_KV, DSQ_DIM_EMBD, 0, DSQ_TP_COLUMN),
    L_(DSQ_LW_K_BIAS, "self_attn.k_proj.bias", DSQ_DIM_KV, DSQ_DIM_NONE, DSQ_TF_OPTIONAL, DSQ_TP_COLUMN),
    L_(DSQ_LW_V, "self_attn.v_proj.weight", DSQ_DIM_KV, DSQ_DIM_EMBD, 0, DSQ_TP_COLUMN),
    L_(DSQ_LW_V_BIAS, "self_attn.v_proj.bias", DSQ_DIM_KV, DSQ_DIM_NONE, DSQ_TF_OPTIONAL, DSQ_TP_COLUMN),
    L_(DSQ_LW_O, "self_attn.o_proj.weight", DSQ_DIM_EMBD, DSQ_DIM_Q, 0, DSQ_TP_ROW),
    L_(DSQ_LW_FFN_NORM, "post_attention_layernorm.weight", DSQ_DIM_EMBD, DSQ_DIM_NONE, 0, DSQ_TP_REPLICATED),
    L_(DSQ_LW_GATE, "mlp.gate_proj.weight", DSQ_DIM_FF, DSQ_DIM_EMBD, 0, DSQ_TP_COLUMN),
    L_(DSQ_LW_UP, "mlp.up_proj.weight", DSQ_DIM_FF, DSQ_DIM_EMBD, 0, DSQ_TP_COLUMN),
    L_(DSQ_LW_DOWN, "mlp.down_proj.weight", DSQ_DIM_EMBD, DSQ_DIM_FF, 0, DSQ_TP_ROW),
    { DSQ_GW_OUT_NORM, 0, "model.norm.weight", DSQ_DIM_EMBD, DSQ_DIM_NONE, 0, DSQ_TP_REPLICATED },
    { DSQ_GW_LM_HEAD, 0, "lm_head.weight", DSQ_DIM_VOCAB, DSQ_DIM_EMBD, DSQ_TF_HEAD, DSQ_TP_VOCAB },
};
#undef L_

/* Pre-norm decoder layer: attention block, then the SwiGLU MLP block, each
 * adding into the residual stream. */
static const dsq_op qwen2_recipe[] = {
    { DSQ_OP_NORM, { DSQ_LW_ATTN_NORM, -1, -1 }, { -1, -1, -1 }, DSQ_IN_ATT },
    { DSQ_OP_QKV_ROPE, { DSQ_LW_Q, DSQ_LW_K, DSQ_LW_V }, { DSQ_LW_Q_BIAS, DSQ_LW_K_BIAS, DSQ_LW_V_BIAS },
      DSQ_IN_ATT },
    { DSQ_OP_ATTEND, { -1, -1, -1 }, { -1, -1, -1 }, DSQ_IN_ATT },
    { DSQ_OP_LINEAR_RESID, { DSQ_LW_O, -1, -1 }, { -1, -1, -1 }, DSQ_IN_ATT },
    { DSQ_OP_NORM, { DSQ_LW_FFN_NORM, -1, -1 }, { -1, -1, -1 }, DSQ_IN_ATT },
    { DSQ_OP_GATED_FFN, { DSQ_LW_GATE, DSQ_LW_UP, -1 }, { -1, -1, -1 }, DSQ_IN_ATT },
    { DSQ_OP_LINEAR_RESID, { DSQ_LW_DOWN, -1, -1 }, { -1, -1, -1 }, DSQ_IN_ACT },
};

const dsq_arch dsq_arch_qwen2 = {
    .name = "qwen2",
    .model_type = "qwen2",
    .hf_class = "Qwen2ForCausalLM",
    .parse_config = qwen2_parse,
    .tensors = qwen2_tensors,
    .n_tensors = (int32_t)(sizeof qwen2_tensors / sizeof qwen2_tensors[0]),
    .recipe = qwen2_recipe,
    .n_ops = (int32_t)(sizeof qwen2_recipe / sizeof qwen2_recipe[0]),
};
