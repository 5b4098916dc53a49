/* tp_weights.h - one rank's weights under tensor parallelism, shared by the
 * CPU and CUDA backends.
 *
 * From the full model (dsq_weights: views by role) and a rank's slice
 * (lib/tp_plan.h), dsq_tp_weights_make() builds the rank's own dsq_weights,
 * driven by each tensor's split kind in the model description's tensor
 * table (dsq_tensor_spec.split, lib/arch.h):
 *   DSQ_TP_REPLICATED  the full view (norms, embedding)
 *   DSQ_TP_COLUMN      rows [r0, r0+n) of the full tensor: a view (rows are
 *                      contiguous), a 1-D bias likewise
 *   DSQ_TP_ROW         columns [c0, c0+n) of every row: a strided copy into
 *                      memory the dsq_tp_weights owns ([rows][n], same dtype)
 *   DSQ_TP_VOCAB       rows [vocab0, vocab0+n_vocab) of the head (of the
 *                      embedding when tied): a view
 * An absent optional tensor stays absent (data NULL) with its sliced shape.
 * Views point into the full weights: they live as long as those do.
 *
 * The rank's config (dsq_tp_weights.cfg) is the model's with the rank's
 * sizes: n_heads = its query heads, n_kv_heads = its KV heads, n_ff = its
 * FFN part; n_vocab stays the model's (the embedding is whole; the head's
 * rows are the tensor's shape[0]). */
#ifndef DSQ_TP_WEIGHTS_H
#define DSQ_TP_WEIGHTS_H

#include "internal.h"
#include "tp_plan.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dsq_tp_weights {
    dsq_tp_slice s;
    dsq_config cfg;     /* the rank's sizes (see above)                       */
    dsq_weights w;      /* the rank's tensors; w.layers [n_layers] owned      */
    void *owned;        /* the column slices' copies                          */
    size_t owned_bytes;
} dsq_tp_weights;

/* The rank's config for slice s of cfg. */
void dsq_tp_rank_config(const dsq_config *cfg, const dsq_tp_slice *s, dsq_config *out);

/* Build rank s->rank's weights from `full` (bound for cfg).  The head is
 * taken from full->g[DSQ_GW_LM_HEAD] (the embedding's view when tied).
 * DSQ_ERR_OUT_OF_MEMORY, DSQ_ERR_INTERNAL (a table entry whose split the
 * dimensions do not allow); on failure *out is zeroed and owns nothing. */
dsq_status dsq_tp_weights_make(const dsq_config *cfg, const dsq_weights *full, const dsq_tp_slice *s,
                               dsq_tp_weights *out);

/* Free what *tw owns (the copies, the layer array); NULL or zeroed: no-op. */
void dsq_tp_weights_free(dsq_tp_weights *tw);

#ifdef __cplusplus
}
#endif

#endif
