/*
 * weights_quant.h - quantized linear weights of a loaded model: the binder's
 * part for AWQ / GPTQ / dsqwen checkpoints (repacked or copied into the two
 * runtime layouts of lib/quant_cpu.h) and quantize-at-load
 * (dsq_model_params.quantize).  docs/quantization.md has the formats.
 *
 * The arrays are owned here (64-byte aligned heap blocks, independent of the
 * safetensors mapping); a quantized role keeps its dsq_tensor slot in
 * dsq_weights with data NULL and its logical shape [N, K], and its
 * dsq_weight (format DSQ_WF_Q8_ROW or DSQ_WF_Q4_G128) here.
 */
#ifndef DSQ_WEIGHTS_QUANT_H
#define DSQ_WEIGHTS_QUANT_H

#include "arch.h"
#include "internal.h"
#include "weight.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dsq_qweights {
    dsq_weight (*lw)[DSQ_LW_COUNT]; /* [n_layers]; data NULL: role not quantized */
    dsq_weight head;                /* data NULL: head not quantized */
    void **bufs;                    /* owned arrays */
    int32_t n_bufs, cap_bufs;
} dsq_qweights;

/* 1 if `sp` is a matrix some product multiplies by (a recipe weight of a
 * non-NORM op, or the head). */
int dsq_spec_is_linear(const dsq_arch *a, const dsq_tensor_spec *sp);

/* The quantized descriptor of a role, NULL when it is not quantized. */
const dsq_weight *dsq_weights_qslot(const dsq_weights *w, int per_layer, int32_t role,
                                    int32_t layer);

/* Binder hook for one linear `name` ("....weight", logical [N, K]) of a
 * checkpoint whose config has a quantization_config: if "<prefix>.qweight"
 * exists, check the format's tensors (dtypes, shapes, finite scales), build
 * the runtime layout, fill the role's tensor slot (data NULL) and set
 * *found = 1; otherwise *found = 0 (the linear is stored unquantized: AWQ's
 * modules_to_not_convert, a head).  DSQ_ERR_DTYPE / DSQ_ERR_SHAPE /
 * DSQ_ERR_FORMAT / DSQ_ERR_UNSUPPORTED / DSQ_ERR_OUT_OF_MEMORY naming the
 * tensor. */
dsq_status dsq_qweights_bind_linear(dsq_st_set *st, const dsq_config *cfg, dsq_weights *w,
                                    const dsq_tensor_spec *sp, int32_t layer, const char *name,
                                    int64_t N, int64_t K, int *found);

/* Quantize at load: every dense linear of the layers into `mode`
 * (DSQ_QUANTIZE_INT8: Q8_ROW, DSQ_QUANTIZE_Q4: Q4_G128), and the head into
 * Q8_ROW when `head` is 1 (a tied head gets its own copy; the embedding
 * stays).  mode DSQ_QUANTIZE_NONE with head 1: the head alone, whatever the
 * layers are (a slot already quantized is never touched).  Row ranges over n_threads threads (0 = all cores).  w->n_bytes
 * then counts the quantized arrays instead of the dense tensors.
 * DSQ_ERR_FORMAT naming the tensor for a weight that cannot be quantized
 * (NaN/Inf, a Q4 group range beyond f16), DSQ_ERR_OUT_OF_MEMORY. */
dsq_status dsq_weights_quantize(dsq_weights *w, const dsq_config *cfg, int mode, int head,
                                int n_threads);

/* 1 if some linear of the layers is quantized (loaded so or quantized at
 * load), 0 if only the head is, or nothing. */
int dsq_weights_layers_quantized(const dsq_weights *w, int32_t n_layers);

/* Bytes of the arrays of one quantized descriptor. */
int64_t dsq_qweight_bytes(const dsq_weight *q);

void dsq_qweights_free(dsq_qweights *q);

#ifdef __cplusplus
}
#endif

#endif
