/* tp_plan.h - how a Qwen2-family layer stack is split over `world` ranks
 * (Megatron-style tensor parallelism).
 *
 * Per layer, rank r holds (E = n_embd, H = n_heads, KV = n_kv_heads,
 * D = head_dim, F = n_ff, V = n_vocab, W = world):
 *   q_proj   rows [q_head0*D, (q_head0+n_q_heads)*D)    of [H*D, E]   (column parallel)
 *   k/v_proj rows [kv_head0*D, (kv_head0+n_kv_heads)*D) of [KV*D, E]
 *   biases   the same row ranges
 *   o_proj   columns [q_head0*D, ...+n_q_heads*D)       of [E, H*D]   (row parallel:
 *            each rank's product is a partial sum over its heads; the ranks'
 *            partials are all-reduced before the residual add)
 *   gate/up  rows [ff0, ff0+n_ff)                       of [F, E]     (column parallel)
 *   down     columns [ff0, ff0+n_ff)                    of [E, F]     (row parallel,
 *            all-reduced before the residual add)
 *   norms    replicated
 * and for the model:
 *   embedding replicated (a lookup: nothing to gain from splitting it)
 *   lm_head   rows [vocab0, vocab0+n_vocab) of [V, E] (each rank computes its
 *             slice of the logits; they are gathered once for sampling)
 * The KV cache of rank r holds only its n_kv_heads heads.
 *
 * Heads split evenly: H % W == 0.  KV heads split evenly when KV % W == 0;
 * when W > KV (more ranks than KV heads, e.g. the 1.5B model's 2 KV heads
 * on 4 GPUs) W % KV == 0 is required and each KV head is replicated on the
 * W / KV ranks whose query heads use it (n_kv_heads = 1 each).  F and V
 * are split into W near-equal parts, each a multiple of `align` elements
 * (the last part takes the rest), so no product sees a ragged tile.
 */
#ifndef DSQ_TP_PLAN_H
#define DSQ_TP_PLAN_H

#include "internal.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dsq_tp_slice {
    int32_t rank, world;
    int32_t q_head0, n_q_heads;   /* query heads of this rank               */
    int32_t kv_head0, n_kv_heads; /* KV heads it holds (cache and k/v_proj) */
    int32_t kv_replicas;          /* ranks holding each of its KV heads     */
    int32_t ff0, n_ff;            /* FFN columns                            */
    int32_t vocab0, n_vocab;      /* lm_head rows / logit columns           */
} dsq_tp_slice;

/* Element alignment of the FFN and vocabulary split points. */
#define DSQ_TP_ALIGN 64

/* Fill *s for `rank` of `world` on config `cfg`.  DSQ_ERR_INVALID_ARG
 * (world < 1, rank outside 0..world-1, NULL), DSQ_ERR_UNSUPPORTED (a split
 * that does not divide: the message names the dimension and the degrees
 * that would work). */
dsq_status dsq_tp_plan(const dsq_config *cfg, int32_t rank, int32_t world, dsq_tp_slice *s);

/* The tensor-parallel degrees (1..max_world) that divide `cfg`, as a bit
 * set: bit w set when world w is possible. */
uint64_t dsq_tp_degrees(const dsq_config *cfg, int32_t max_world);

#ifdef __cplusplus
}
#endif

#endif
