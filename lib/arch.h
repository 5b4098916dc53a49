/*
 * arch.h - the model description: one per architecture (lib/arch_*.c).
 *
 * Everything that differs between decoder-only architectures lives in a
 * dsq_arch: how config.json is read into dsq_config, which tensors the
 * checkpoint holds (names, shapes, which may be absent), and the layer
 * recipe: the sequence of operations each layer applies.  The loader
 * (lib/weights.c), the CPU backend (lib/cpu_backend.c) and the CUDA backend
 * (cuda/backend_*.cu) take names, shapes, optional-ness and the order of
 * operations from here; none of them names a checkpoint tensor.
 *
 *   config.json --arch->parse_config--> dsq_config (cfg->arch = the arch)
 *   safetensors --arch->tensors-------> dsq_weights  (views, by role)
 *   forward pass: for each layer, for op in arch->recipe: backend runs op
 *
 * Adding an architecture: docs/architecture.md, "Adding an architecture".
 */
#ifndef DSQ_ARCH_H
#define DSQ_ARCH_H

#include <stdint.h>

#include "internal.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Sizes a tensor dimension can take, resolved from the config by
 * dsq_arch_dim().  E = n_embd, H = n_heads, KV = n_kv_heads, D = head_dim,
 * F = n_ff, V = n_vocab. */
typedef enum dsq_dim {
    DSQ_DIM_NONE = 0, /* no second dimension: a 1-D tensor */
    DSQ_DIM_EMBD,     /* E */
    DSQ_DIM_Q,        /* H * D: all query heads */
    DSQ_DIM_KV,       /* KV * D: all key (or value) heads */
    DSQ_DIM_FF,       /* F */
    DSQ_DIM_VOCAB     /* V */
} dsq_dim;

int64_t dsq_arch_dim(const dsq_config *cfg, dsq_dim d);

/* What a tensor is for; how it is stored is the tensor table's business. */
enum {
    DSQ_TF_OPTIONAL = 1u << 0, /* may be absent: the model then uses zeros (a bias) */
    DSQ_TF_HEAD = 1u << 1      /* the output head: absent and ignored when the
                                  config ties it to the token embedding */
};

/* How tensor parallelism (lib/tp_plan.h, lib/tp_weights.c) splits a tensor
 * over the ranks; the range each rank takes comes from the dimension that
 * is split (DSQ_DIM_Q: its query heads, DSQ_DIM_KV: its KV heads, DSQ_DIM_FF:
 * its FFN part, DSQ_DIM_VOCAB: its vocabulary part). */
typedef enum dsq_tp_split {
    DSQ_TP_REPLICATED = 0, /* every rank holds all of it (norms, embedding)    */
    DSQ_TP_COLUMN,         /* column parallel: rows (outputs) split by `rows`;
                              a bias [rows] the same way; a contiguous view   */
    DSQ_TP_ROW,            /* row parallel: columns (inputs) split by `cols`;
                              each rank's product is a partial sum, all-reduced
                              before the residual add; a strided copy          */
    DSQ_TP_VOCAB           /* the output head: rows split by vocabulary; each
                              rank's logits are gathered for sampling          */
} dsq_tp_split;

/* One tensor of the checkpoint.  `role` indexes dsq_weights.g (per_layer
 * 0) or dsq_layer_weights.t (per_layer 1); `name` is a printf pattern whose
 * one %d is the layer index (per-layer tensors only).  Shape [rows, cols]
 * (row-major, a linear weight is [out, in]) or [rows] when cols is
 * DSQ_DIM_NONE. */
typedef struct dsq_tensor_spec {
    int32_t role;
    int32_t per_layer;
    const char *name;
    dsq_dim rows, cols;
    uint32_t flags;
    dsq_tp_split split; /* tensor parallelism */
} dsq_tensor_spec;

/* ---- the layer recipe -------------------------------------------------------
 * The buffers the ops talk about (per token of the batch):
 *   x    residual stream [E]          xn   normalised x [E]
 *   q,k,v  [H*D], [KV*D], [KV*D]       att  attention output [H*D]
 *   act  feed-forward activation [F]
 * A weight or bias slot of -1 is unused. */
typedef enum dsq_op_kind {
    DSQ_OP_NORM = 1,      /* xn = rmsnorm(x) * w[0]                            */
    DSQ_OP_QKV_ROPE,      /* q|k|v = xn W[0|1|2]^T + b[0|1|2]; rope(q, k);
                             k, v stored in the cache                          */
    DSQ_OP_ATTEND,        /* att = causal softmax(q k^T / sqrt(D)) v (GQA)     */
    DSQ_OP_LINEAR_RESID,  /* x += in W[0]^T + b[0], in = att or act (op.in)    */
    DSQ_OP_GATED_FFN      /* act = silu(xn W[0]^T) * (xn W[1]^T)               */
} dsq_op_kind;

/* Inputs of DSQ_OP_LINEAR_RESID. */
typedef enum dsq_op_input { DSQ_IN_ATT = 0, DSQ_IN_ACT = 1 } dsq_op_input;

typedef struct dsq_op {
    dsq_op_kind kind;
    int8_t w[3]; /* dsq_layer_weights roles */
    int8_t b[3]; /* bias roles (DSQ_TF_OPTIONAL in the table: absent = 0) */
    dsq_op_input in;
} dsq_op;

#define DSQ_MAX_OPS 16

typedef struct dsq_arch {
    const char *name;         /* "qwen2" */
    const char *model_type;   /* config.json "model_type" */
    const char *hf_class;     /* an entry of config.json "architectures" */
    /* Read the architecture's fields of a parsed config.json object (a
     * cJSON *; void here so this header needs no cJSON) into cfg, refusing
     * what the backends do not implement (DSQ_ERR_CONFIG /
     * DSQ_ERR_UNSUPPORTED naming the field). */
    dsq_status (*parse_config)(const void *root, dsq_config *cfg);
    const dsq_tensor_spec *tensors;
    int32_t n_tensors;
    const dsq_op *recipe; /* one layer, in order */
    int32_t n_ops;
} dsq_arch;

/* Every architecture the library knows, NULL-terminated (lib/arch.c). */
extern const dsq_arch *const dsq_archs[];
extern const dsq_arch dsq_arch_qwen2;

/* The spec of `role` (per-layer or not), NULL if the arch has none. */
const dsq_tensor_spec *dsq_arch_tensor(const dsq_arch *a, int per_layer, int32_t role);

/* "model.layers.3.self_attn.q_proj.weight": the name of a tensor for
 * layer l (ignored for model-wide ones) into buf.  The arch's name or
 * "(unnamed)" when it has no spec for the role. */
const char *dsq_arch_tensor_name(const dsq_arch *a, int per_layer, int32_t role, int32_t layer,
                                 char *buf, size_t cap);

/* Bytes of KV cache per token (every layer, K and V, INT8 scales) when
 * stored as kv_dtype (dsq_kv_dtype).  The one place this is computed. */
int64_t dsq_kv_bytes_per_token(const dsq_config *cfg, int32_t kv_dtype);

#ifdef __cplusplus
}
#endif

#endif /* DSQ_ARCH_H */
