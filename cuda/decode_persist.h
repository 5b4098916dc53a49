/*
 * decode_persist.h - every layer of a batch-1 decode step in one persistent
 * kernel (decode_persist.cu), internal and C-callable.
 *
 * Why: at batch 1 a step is ~170 short kernels; each pays a ramp and a
 * tail of a few microseconds with the memory idle, and attention leaves it
 * idle for ~7 us per layer (docs/performance.md, the batch-1 profiles).
 * Here one block per SM stays resident for all layers; a producer warp per
 * block streams the block's slice of every weight matrix, in the order the
 * step reads them, through a ring of shared-memory stages with bulk copies
 * (cp.async.bulk, mbarrier completion), and never stops at a phase
 * boundary: while the grid waits at a barrier or runs attention, the ring
 * fills with the next products' weights.  Phases per layer, each ended by a
 * grid-wide barrier: RMSNorm + q|k|v product (+ bias); RoPE, KV write and
 * split attention with the last split merging; o product + residual;
 * RMSNorm + gate/up product + SiLU*mul; down product + residual.
 *
 * Scope: one sequence, one token (decode steps of batch 1), bf16 weights
 * with the Qwen2 recipe, FP16 KV cache (static or paged), head_dim 128,
 * sm_90 devices (bulk copies, 227 KB of shared memory per block) and a
 * build with sm_90 code.  dsq_persist_supported says whether a model and
 * device qualify; the backend falls back to the per-kernel pass otherwise.
 *
 * Numerics: the per-kernel path's roundings (bf16 product inputs, fp32
 * products and residual, RoPE'd q/k rounded to bf16, K/V stored as fp16
 * of those bf16 values, silu*mul rounded to bf16), with its own fp32
 * summation orders; attention in fp32 on CUDA cores (the per-kernel decode
 * kernel rounds q to fp16 for the tensor cores).  Checked against that
 * path and the golden data by tests/test_cuda_e2e.c and test_cuda_persist.
 */
#ifndef DSQ_CUDA_DECODE_PERSIST_H
#define DSQ_CUDA_DECODE_PERSIST_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#include "internal.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One layer's device data (the backend builds a table of n_layers of them
 * in device memory once per context). */
typedef struct dsq_persist_layer {
    const float *norm_attn;  /* fp32 [E] */
    const uint16_t *w_qkv;   /* bf16 [QKV][E], rows q | k | v */
    const float *b_qkv;      /* fp32 [QKV] */
    const uint16_t *w_o;     /* bf16 [E][H*D] */
    const float *norm_ffn;   /* fp32 [E] */
    const uint16_t *w_gu;    /* bf16 [2F][E], (gate_i, up_i) row pairs */
    const uint16_t *w_down;  /* bf16 [E][F] */
    void *k, *v;             /* fp16 cache [rows][KV][D] of this layer */
} dsq_persist_layer;

typedef struct dsq_persist_args {
    const dsq_persist_layer *layers; /* device [n_layers] */
    int32_t n_layers, E, H, KV, D, F;
    float eps;
    const float *inv_freq;  /* fp32 [D/2] */
    float *x;               /* fp32 [E] residual stream, in and out */
    float *qkv;             /* scratch fp32 [QKV] */
    uint16_t *attn;         /* scratch bf16 [H*D] */
    uint16_t *act;          /* scratch bf16 [F] */
    float *part;            /* scratch fp32, dsq_persist_part_bytes */
    uint32_t *sync;         /* device [DSQ_PERSIST_SYNC_WORDS], zero before the first launch;
                               left zero-balanced by every launch that completes */
    const int32_t *len;     /* device [1]: keys of the sequence including this token */
    const int32_t *block_table; /* device [bt_stride] of the sequence */
    int32_t block_size;     /* rows per block (static cache: max_context) */
} dsq_persist_args;

#define DSQ_PERSIST_SYNC_WORDS 64

/* Whether the current device and the build run the kernel for this shape
 * (1), or not (0; reason, if not NULL, set to a static string).  Also sets
 * the kernel's shared-memory attribute on the current device. */
int dsq_persist_supported(int32_t E, int32_t H, int32_t KV, int32_t D, int32_t F, const char **reason);

/* Bytes of the attention partials scratch for the current device. */
size_t dsq_persist_part_bytes(int32_t H, int32_t KV, int32_t D);

/* Enqueue the layers of one batch-1 decode step on `stream` (one launch of
 * one block per SM, cooperative: the launch fails rather than runs when the
 * grid cannot be resident at once).  Asynchronous, no allocation, no host
 * synchronisation: capturable in a CUDA graph.  Returns DSQ_OK or
 * DSQ_ERR_DEVICE / DSQ_ERR_INTERNAL with a message. */
dsq_status dsq_persist_decode(const dsq_persist_args *a, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif /* DSQ_CUDA_DECODE_PERSIST_H */
