/*
 * attention.h - KV cache layout and the attention launchers of the CUDA
 * backend (internal, C-callable).  Implemented in kv_write.cu,
 * attention_prefill.cu, attention_decode.cu.
 *
 * ---- KV cache layout (one layer; the backend keeps one dsq_attn_kv per layer)
 *
 *   k, v     : [n_rows][n_kv_heads][head_dim]   fp16 (DSQ_KV_F16) or int8 (DSQ_KV_INT8)
 *   k_scale,
 *   v_scale  : [n_rows][n_kv_heads]             fp32, INT8 only (NULL for F16)
 *
 *   A "row" is one token slot.  Physical row of (batch sequence b, position p):
 *       row = block_table[b * bt_stride + p / block_size] * block_size + p % block_size
 *   Paged cache: block_size = tokens per block (e.g. 16), block_table = the
 *   batch's block tables (row b = the b-th sequence of the batch, as in
 *   dsq_batch), bt_stride = max_blocks_per_seq.
 *   Static cache: the same formula with block_size = max_context, bt_stride = 1
 *   and block_table[b] = the sequence's slot (its seq id), so that
 *   row = slot * max_context + p.  One code path serves both layouts.
 *
 *   Why [rows][kv_heads][head_dim] ("NHD") rather than per-block HND: one
 *   (token, kv head) is head_dim contiguous elements = 256 B in fp16 (128 B in
 *   int8), i.e. whole 128-byte lines, so the tile loaders issue 16-byte loads
 *   with consecutive lanes on consecutive addresses either way, and every
 *   transaction is a full line.  NHD additionally keeps a token's K (or V)
 *   for all heads contiguous, so kv_write stores each token with one
 *   coalesced burst, and static and paged caches share one layout (a static
 *   slot is just a block of max_context rows).
 *
 *   INT8: per (token, kv head) symmetric quantization, identical to the CPU
 *   backend:  amax = max_i |x_i| (x_i = the bf16 input as fp32),
 *             scale = amax / 127.0f,
 *             q_i = scale > 0 ? clamp(rintf(x_i / scale), -127, 127) : 0,
 *   dequantized value = q_i * scale.  Dequantization happens inside the
 *   attention kernels: K's scale multiplies the fp32 score q.k_int, V's scale
 *   multiplies the softmax weight before P.V.  No separate pass.
 *   A (token, head) vector holding any NaN or Inf is stored as q_i = 0 with
 *   scale = NaN (int8 cannot hold it; it must not read back finite).
 *   F16: x_i rounded to nearest fp16 (IEEE, as the CPU: |x| >= 65520 is
 *   +-Inf, NaN stays NaN).
 *   Non-finite values: a NaN or Inf in the K, V or scale of a key that a
 *   query attends to makes that query's output non-finite (NaN, or Inf
 *   where IEEE arithmetic gives Inf; a K of -Inf giving a score of -inf is
 *   weight 0, as on the CPU); keys it does not attend to (causally later,
 *   past the sequence's end) never affect it.
 *
 * ---- Activations (caller's buffers, bf16, row-major)
 *   Q / K / V inputs may live inside one fused QKV buffer: every input takes a
 *   row stride in elements, head h's head_dim values start at
 *   ptr + t * stride + h * head_dim.
 *
 * ---- Supported shapes
 *   head_dim 128 or 64; n_heads a multiple of n_kv_heads (any group size);
 *   requires sm_80 or newer.  Anything else returns DSQ_ERR_INTERNAL (with
 *   a message naming the argument) before launching: the backend checks a
 *   model's shape at load, so a refused launch is a library bug.
 *
 * All launchers: asynchronous on `stream`, no host synchronisation, no host
 * allocation, no reading of device data on the host, so a decode step can be
 * captured in a CUDA graph.  They return a dsq_status like the launchers of
 * kernels.h: DSQ_OK, DSQ_ERR_INTERNAL for bad arguments, or the launch error
 * through dsq_cu_status() (DSQ_ERR_DEVICE_OOM / DSQ_ERR_DEVICE with a
 * message naming the kernel); faults inside a kernel surface at the next
 * synchronisation.
 */
#ifndef DSQ_CUDA_ATTENTION_H
#define DSQ_CUDA_ATTENTION_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime.h>

#include "internal.h" /* dsq_status, dsq_fail */

#ifdef __cplusplus
extern "C" {
#endif

/* dtype codes, same values as dsq_kv_dtype in dsqwen.h */
#define DSQ_ATTN_KV_F16 0
#define DSQ_ATTN_KV_INT8 1

/* One layer of the KV cache plus the mapping of (batch sequence, position) to
 * physical rows.  All pointers are device pointers.  Passed by pointer to
 * the launchers, which copy it into kernel arguments (so the struct itself
 * may live on the host stack). */
typedef struct dsq_attn_kv {
    void *k;                    /* [n_rows][n_kv_heads][head_dim] fp16 | int8 */
    void *v;                    /* [n_rows][n_kv_heads][head_dim] fp16 | int8 */
    float *k_scale;             /* [n_rows][n_kv_heads] INT8 only, else NULL  */
    float *v_scale;             /* [n_rows][n_kv_heads] INT8 only, else NULL  */
    const int32_t *block_table; /* [n_batch_seqs][bt_stride] physical block ids
                                   (static: [n_batch_seqs][1] slot ids)        */
    int32_t bt_stride;          /* elements per block_table row               */
    int32_t block_size;         /* rows per block (static: max_context)       */
    int32_t n_kv_heads;
    int32_t head_dim;           /* 128 or 64                                  */
    int32_t dtype;              /* DSQ_ATTN_KV_F16 | DSQ_ATTN_KV_INT8         */
} dsq_attn_kv;

/* Write K and V of n_tokens new tokens into the cache (quantizing for INT8).
 *   k      : [n_tokens][k_stride] bf16, RoPE already applied; kv head h at
 *            k + t*k_stride + h*head_dim
 *   v      : [n_tokens][v_stride] bf16, same
 *   tok_seq: [n_tokens] device, batch sequence index of token t (block_table row)
 *   pos    : [n_tokens] device, absolute position of token t
 * Every (tok_seq, pos) must map to a reserved row.  n_tokens == 0 is a no-op. */
dsq_status dsq_attn_kv_write(const dsq_attn_kv *kv, const void *k, int64_t k_stride,
                              const void *v, int64_t v_stride, const int32_t *tok_seq,
                              const int32_t *pos, int32_t n_tokens, cudaStream_t stream);

/* RoPE and the KV write fused (one launch): qkv fp32 [n_tokens][row_stride]
 * holds the q|k|v product (n_q_heads q heads, then the cache's n_kv_heads k
 * and v heads, head_dim columns each); q and k heads are rotated as
 * dsq_cu_rope does (inv_freq device fp32 [head_dim/2]), the whole row is
 * stored to out, bf16 [n_tokens][row_stride], and k and v go into the cache
 * exactly as dsq_attn_kv_write would store the bf16 values.  pos / tok_seq
 * as for dsq_attn_kv_write.  Launched with PDL (cuda/pdl.cuh). */
dsq_status dsq_attn_rope_kv_write(const dsq_attn_kv *kv, const float *qkv, int64_t row_stride,
                                   const int32_t *pos, const int32_t *tok_seq, int32_t n_tokens,
                                   int32_t n_q_heads, const float *inv_freq, void *out, cudaStream_t stream);

/* Causal prefill attention over a varlen batch, K/V read from the cache (so a
 * prompt may extend a sequence that already holds tokens).  kv_write for
 * these tokens must have run first (same stream).
 *   q         : [n_tokens][q_stride] bf16; head h at q + t*q_stride + h*head_dim
 *   out       : [n_tokens][o_stride] bf16; head h at out + t*o_stride + h*head_dim
 *   cu_seqlens: [n_seqs + 1] device; tokens of batch sequence b are
 *               cu_seqlens[b] .. cu_seqlens[b+1]-1 (rows of q and out)
 *   seq_pos0  : [n_seqs] device; position of b's first new token (= tokens it
 *               held before); token i of b is at pos0+i and attends to cache
 *               positions 0 .. pos0+i
 *   max_q_len : host; >= every cu_seqlens[b+1]-cu_seqlens[b] (sizes the grid)
 * Scale 1/sqrt(head_dim), softmax in fp32, fp16 tensor-core products
 * (wgmma on sm_90a builds running on sm_90, else mma.sync).
 * Ordering (PDL, as for dsq_attn_decode_rope): the kernel reads cu_seqlens,
 * seq_pos0, the block table and the cached keys before each b's seq_pos0
 * before it waits for the kernel before it, so none of them may come from
 * that kernel (the backend uploads or copies them ahead of the pass's first
 * kernel); q and this call's own K/V rows may. */
dsq_status dsq_attn_prefill(const dsq_attn_kv *kv, const void *q, int64_t q_stride,
                             void *out, int64_t o_stride, const int32_t *cu_seqlens,
                             const int32_t *seq_pos0, int32_t n_seqs, int32_t max_q_len,
                             int32_t n_heads, cudaStream_t stream);

/* dsq_attn_prefill split over keys where the grid would leave the GPU
 * part-empty (short prompts, chunks extending long sequences): each query
 * tile's keys go to several blocks whose partials a merge kernel combines
 * (attention_prefill.cu).
 *   max_kv_len : host; >= every seq_pos0[b] + (its rows) (sizes the plan;
 *                an undercount costs speed, not correctness)
 *   split_tiles: 0 = choose from the SM count and the workspace (DSQ_CUDA_
 *                PREFILL_SPLIT=0 turns that off); k > 0 = split every k
 *                tiles of 64 keys (tests; the workspace must hold the
 *                splits, else DSQ_ERR_INTERNAL)
 *   workspace  : device, 16-byte aligned, scratch after the call; NULL: no
 *                split.  dsq_attn_prefill_workspace_bytes(n_seqs * max_q_len,
 *                n_heads, head_dim, n) bytes hold n splits.
 * Same results as dsq_attn_prefill up to rounding (the merge divides by
 * the summed l once; rows of a query tile with one split are identical). */
dsq_status dsq_attn_prefill_ws(const dsq_attn_kv *kv, const void *q, int64_t q_stride, void *out,
                                int64_t o_stride, const int32_t *cu_seqlens, const int32_t *seq_pos0,
                                int32_t n_seqs, int32_t max_q_len, int32_t max_kv_len, int32_t n_heads,
                                int32_t split_tiles, void *workspace, size_t workspace_bytes,
                                cudaStream_t stream);
size_t dsq_attn_prefill_workspace_bytes(int32_t max_rows, int32_t n_heads, int32_t head_dim, int32_t n_split);

/* Which prefill kernel the current device runs for a cache of kv_dtype: 1
 * the Hopper one (wgmma: the build has sm_90a code and the device is sm_90,
 * see wgmma.cuh; FP16 caches), 0 the mma.sync one (other devices, builds and
 * INT8 caches; DSQ_CUDA_PREFILL_WGMMA=0 / =1, measurement knobs read per
 * call, force mma.sync / wgmma where the device has it), -1 on a setup
 * error.  Both give the same results up to fp32 summation order. */
int dsq_attn_prefill_kernel_wgmma(int32_t kv_dtype);

/* Decode attention (flash-decoding): one query token per batch sequence.
 *   q        : [n_seqs][q_stride] bf16; head h at q + b*q_stride + h*head_dim
 *   out      : [n_seqs][o_stride] bf16
 *   seq_lens : [n_seqs] device; cached tokens of b INCLUDING this step's
 *              token (kv_write must have run first): b attends to positions
 *              0 .. seq_lens[b]-1.  Must be >= 1.  Not written by
 *              the kernel right before on the stream: the merge kernel
 *              reads it before its PDL wait.
 *   max_splits: host, 1..1024; fixed per launch shape (graph-capture safe).
 *              Each sequence uses min(max_splits, ceil(len/64)) splits
 *              computed on the device from its own length.  Use
 *              dsq_attn_decode_splits() (e.g. once per batch-size bucket).
 *   workspace: device, >= dsq_attn_decode_workspace_bytes(n_seqs, n_heads,
 *              head_dim, max_splits) bytes, 256-byte aligned; contents need
 *              no initialisation and are scratch after the call.
 * Grid: n_seqs x n_kv_heads x max_splits blocks plus one merge kernel, both
 * launched with programmatic dependent launch (pdl.cuh) where enabled; so is
 * dsq_attn_prefill. */
dsq_status dsq_attn_decode(const dsq_attn_kv *kv, const void *q, int64_t q_stride,
                            void *out, int64_t o_stride, const int32_t *seq_lens,
                            int32_t n_seqs, int32_t n_heads, int32_t max_splits,
                            void *workspace, size_t workspace_bytes, cudaStream_t stream);

/* dsq_attn_rope_kv_write and dsq_attn_decode in one kernel (decode-only
 * passes: one launch fewer per layer).  qkv fp32 [n_seqs][row_stride]: the
 * q|k|v product of each sequence's new token, not yet rotated (n_heads q
 * heads, then the cache's n_kv_heads k and v heads), at position
 * seq_lens[b] - 1, whose cache row must be reserved.  The q heads are
 * rotated as they are loaded, and the new K and V are stored into the cache
 * (rotated, rounded, quantized), with exactly the bits the two-kernel path
 * gives, cache and output alike (test_cuda_attention, "rope").  The bf16
 * rows of dsq_attn_rope_kv_write are not written.  Other arguments as for
 * dsq_attn_decode, except one ordering rule: with PDL the kernel reads
 * seq_lens, the block table and the cached keys before it waits for the
 * kernel before it (it starts loading the cache while the qkv product
 * drains), so none of them may come from the kernel right before it on
 * the stream (a kernel that triggers its dependents after its own wait, as
 * all of ours do, guarantees only that the kernels before it completed):
 * the backend writes them in earlier passes or uploads / copies them ahead
 * of the pass's first kernel.  qkv may come from the kernel right before. */
dsq_status dsq_attn_decode_rope(const dsq_attn_kv *kv, const float *qkv, int64_t row_stride,
                                 const float *inv_freq, void *out, int64_t o_stride,
                                 const int32_t *seq_lens, int32_t n_seqs, int32_t n_heads,
                                 int32_t max_splits, void *workspace, size_t workspace_bytes,
                                 cudaStream_t stream);

/* How decode launches on the current device now fill their shared-memory
 * ring (the environment is read per launch), one of
 *   DSQ_ATTN_LOADER_CP_ASYNC  16-byte cp.async, every chunk's row looked up
 *                             on its own (the default);
 *   DSQ_ATTN_LOADER_BULK      bulk copies, a row per thread (cp.async.bulk +
 *                             mbarrier; DSQ_CUDA_DECODE_BULK=1, where the
 *                             device runs sm_90 code);
 *   DSQ_ATTN_LOADER_LEAN      cp.async addressed once per tile where the
 *                             tile's rows are one run (DSQ_CUDA_DECODE_LEAN=1;
 *                             BULK wins where both are set).
 * The same output bits whichever.  Sets the device's kernels up on first
 * use (DSQ_ATTN_LOADER_CP_ASYNC if that fails). */
enum { DSQ_ATTN_LOADER_CP_ASYNC = 0, DSQ_ATTN_LOADER_BULK = 1, DSQ_ATTN_LOADER_LEAN = 2 };
int32_t dsq_attn_decode_loader(void);

/* Bytes of decode workspace for n_seqs <= max_batch sequences at up to
 * max_splits.  The launcher needs n_seqs * max_splits slots, so when the
 * split count varies with the batch size (dsq_attn_decode_splits), size the
 * workspace for the largest n * splits(n) over the batch sizes used. */
size_t dsq_attn_decode_workspace_bytes(int32_t max_batch, int32_t n_heads, int32_t head_dim,
                                       int32_t max_splits);

/* A good max_splits for a batch of n_seqs sequences of up to max_context
 * tokens in a cache of kv_dtype (dsq_attn_kv_dtype) on a device with n_sms
 * multiprocessors: about one wave of the decode kernel's resident blocks
 * (2 per SM for F16, 3 for INT8, whose ring is half the size;
 * DSQ_CUDA_DECODE_BLOCKS_PER_SM=k, read once per process, sets k for both),
 * never more than one 64-token tile per split. */
int32_t dsq_attn_decode_splits(int32_t n_seqs, int32_t n_kv_heads, int32_t max_context,
                               int32_t n_sms, int32_t kv_dtype);

/* Raise the kernels' shared-memory limits on the current device (kernel
 * attributes are per device) and probe whether the device runs the build's
 * wgmma code (a one-thread kernel and a 4-byte copy on the legacy stream,
 * synchronous): once per device, thread-safe.  The launchers call it
 * themselves, but call it once at context creation so that none of this
 * happens while a stream is being captured.  DSQ_ERR_DEVICE_OOM if the
 * probe's 4 bytes cannot be allocated. */
dsq_status dsq_attn_init(void);

#ifdef __cplusplus
}
#endif

#endif /* DSQ_CUDA_ATTENTION_H */
