/*
 * backend.h - state shared by the CUDA backend's files (host code only):
 *
 *   backend_weights.cu  model load: device layout of the weights from the
 *                       model description's recipe, upload, non-finite check
 *   backend_memory.cu   context creation: the memory plan (KV cache,
 *                       activation scratch, pinned staging, graph table)
 *   backend_pass.cu     one forward pass: batch metadata packing, the layer
 *                       recipe walked on the stream, decode-step graphs
 *   backend_out.cu      what leaves a pass: logits copies, dsq_step sampling,
 *                       token history, KV row copies; the dsq_backend_ops table
 *   backend_tp.cu       tensor parallelism: a rank per GPU (its slices, its
 *                       context), passes in segments between all-reduces
 *
 * Names: E = n_embd, H = query heads, KV = KV heads, D = head_dim,
 * F = n_ff, V = n_vocab, QKV = (H + 2 KV) D (the fused q|k|v row), T =
 * tokens of a pass, S = sequences of a pass, NL = logit rows.  In a product
 * y = x W^T, W is [N out, K in] (cuda/kernels.h); K never means KV heads.
 *
 * Device: every entry of dsq_cuda_backend runs under a cu_device_guard:
 * the model's device is made current and the caller's is restored on return.
 */
#ifndef DSQ_CUDA_BACKEND_H
#define DSQ_CUDA_BACKEND_H

#include <cuda_runtime.h>

#include "arch.h"
#include "attention.h"
#include "internal.h"
#include "kernels.h"
#include "weight.h"

/* Return the dsq_status of a CUDA call (message naming `what`) if it failed. */
#define CU_TRY(call, what)                                 \
    do {                                                   \
        dsq_status st_ = dsq_cu_status((call), (what));    \
        if (st_ != DSQ_OK)                                 \
            return st_;                                    \
    } while (0)
/* Return a failing dsq_status. */
#define DSQ_TRY(expr)                   \
    do {                                \
        dsq_status st_ = (expr);        \
        if (st_ != DSQ_OK)              \
            return st_;                 \
    } while (0)

/* Makes `device` current for its scope and restores the caller's current
 * device (the runtime's default, 0, if the thread never chose one) when it
 * ends.  Check .st before using the device. */
struct cu_device_guard {
    int prev;
    int changed;
    dsq_status st;
    explicit cu_device_guard(int device) : prev(0), changed(0), st(DSQ_OK)
    {
        if (cudaGetDevice(&prev) != cudaSuccess) {
            cudaGetLastError();
            prev = -1;
        }
        if (prev != device) {
            st = dsq_cu_status(cudaSetDevice(device), "cudaSetDevice");
            changed = st == DSQ_OK && prev >= 0;
        }
    }
    ~cu_device_guard()
    {
        if (changed && cudaSetDevice(prev) != cudaSuccess)
            cudaGetLastError();
    }
    cu_device_guard(const cu_device_guard &) = delete;
    cu_device_guard &operator=(const cu_device_guard &) = delete;
};

/* 256-byte aligned offset of `bytes` more inside one allocation (cuBLASLt
 * and the 16-byte vector loads want aligned rows). */
size_t cu_carve(size_t *off, size_t bytes);

/* ---- model (backend_weights.cu) ------------------------------------------- */

/* The device data of one recipe op of one layer (what the op uses):
 *   NORM          norm fp32 [E]
 *   QKV_ROPE      w bf16 [QKV][E] = rows of q, then k, then v;
 *                 bias fp32 [QKV] (zeros where the checkpoint has none)
 *   LINEAR_RESID  w bf16 [E][in]; bias fp32 [E] or NULL
 *   GATED_FFN     w bf16 [2F][E], layout DSQ_WL_GATE_UP (gate/up
 *                 interleaved by rows)
 *   ATTEND        nothing */
/* Decode passes of at most this many rows may prefetch weights (l2p_bytes):
 * more rows make attention itself stream enough bytes. */
#define DSQ_CU_L2P_ROWS 8

typedef struct cu_op_data {
    float *norm;
    dsq_weight w;
    float *bias;
} cu_op_data;

typedef struct cu_layer {
    cu_op_data op[DSQ_MAX_OPS]; /* indexed like cfg->arch->recipe */
} cu_layer;

typedef struct cu_tp_model cu_tp_model; /* backend_tp.cu */
typedef struct cu_tp_ctx cu_tp_ctx;

typedef struct cu_model {
    int device;
    int n_sms;
    void *arena;        /* the single weight allocation */
    size_t arena_bytes;
    dsq_bf16 *tok_embd; /* [V][E] */
    dsq_weight lm_head; /* [V][E]; data == tok_embd when tied */
    float *out_norm;    /* [E] */
    float *inv_freq;    /* [D/2] */
    cu_layer *layers;   /* host array [n_layers] of device pointers */
    /* tensor parallelism: set only in the application's model, whose
     * cu_model is a copy of its first local rank's (the ranks' own models
     * have tp NULL and own the device memory) */
    cu_tp_model *tp;
    int64_t wq_tile_elems; /* largest quantized layer matrix (rows x cols), 0 if none:
                              each context's bf16 dequantization tile (backend_quant.cu) */
} cu_model;

dsq_status cu_model_load(dsq_model *m, const dsq_model_params *p);

/* ---- quantized weights (backend_quant.cu) ------------------------------------
 * Q8_ROW / Q4_G128 matrices (lib/weights_quant.h) are uploaded as they are:
 * q, scales and zeros arrays each carved 256-byte aligned; fused q|k|v is a
 * row concatenation and fused gate/up a row interleave of all three arrays
 * (both layouts keep rows independent). */
/* The quantized format of op's weights in layer l (0: dense); DSQ_ERR_UNSUPPORTED
 * when they mix formats (one fused matrix has one format). */
dsq_status cu_op_qformat(const dsq_model *m, const dsq_op *op, int32_t l, int *fmt);
/* Carve a [rows][cols] matrix of format fmt (sizes only when base is NULL). */
dsq_weight cu_place_quant(int fmt, int64_t rows, int64_t cols, dsq_wlayout layout, char *base, size_t *off);
/* Copy host matrix src into rows row0, row0 + step, ... of device dst. */
dsq_status cu_upload_quant(const dsq_weight *dst, const dsq_weight *src, int64_t row0, int64_t step);
void cu_model_free(dsq_model *m);

/* ---- context (backend_memory.cu) ------------------------------------------- */

#define COPY_PIECES 8

typedef struct cu_ctx {
    int device;
    cudaStream_t stream;
    dsq_gemm *gemm;
    /* products with <= this many rows use the GEMV kernel, else cuBLASLt
     * (crossovers measured on the H200 by test_cuda_kernels' timing table):
     * the small matrices (qkv, o, down), the wide gate/up, the lm_head */
    int32_t gemv_max_small, gemv_max_gu, gemv_max_head;
    int32_t gemv_mma_min;  /* GEMV products of >= this many rows on the tensor cores (0: never) */
    int32_t gemv_long_min; /* bf16 products with K > 4,096 of >= this many rows off the FMA GEMV (0: never;
                            * DSQ_CUDA_GEMV_LONG_MIN; linear.cu) */
    int32_t gemv_mma_norm; /* the RMSNorm folded into tensor-core GEMVs of at most this many tiles (0: never;
                            * DSQ_CUDA_MMA_NORM; linear.cu) */
    int32_t norm_fuse;     /* fold RMSNorm into the next GEMV: bf16 products of at most this many rows (default
                            * 1), the quantized GEMVs' where non-zero (DSQ_CUDA_NORM_FUSE; 0: never) */
    int32_t gu_f32;        /* prompt gate/up products in fp32 before SiLU*mul (DSQ_CUDA_GU_F32=1), else bf16 */
    int32_t max_tokens;    /* max_batch_tokens */
    int32_t max_bseqs;     /* sequences one batch may hold: min(max_seqs, max_tokens) */
    int32_t bt_max;        /* longest block-table row (static: 1) */
    int32_t n_bt_buckets;  /* block-table strides a pass may use: 1, 2, 4, .., bt_max */
    int32_t *h_order;      /* host [max_bseqs]: batch order of a pass (decode rows first) */
    int32_t *h_tokmap;     /* host [max_tokens]: caller's token index -> pass row */
    size_t kv_layer_pitch; /* bytes between layers of each KV array, 0 if not uniform */
    int mixed_split;       /* mixed passes split decode / prefill attention (DSQ_CUDA_MIXED=0: no) */
    int resid_after;       /* LINEAR_RESID as product then add, not fused (DSQ_CUDA_RESIDUAL=after) */
    int decode_rope;       /* decode passes: RoPE + KV write inside the decode attention kernel
                              (DSQ_CUDA_DECODE_ROPE=0: the separate RoPE + KV write kernel) */
    uint64_t l2p_bytes;    /* decode passes of <= DSQ_CU_L2P_ROWS rows: after each qkv product,
                              prefetch this many bytes of the layer's next weights into L2
                              (DSQ_CUDA_L2_PREFETCH=MB; 0: off) */
    int l2p_all;           /* ... after every product, not only qkv (DSQ_CUDA_L2_PREFETCH_AT=all) */
    int32_t logit_chunk;   /* rows of logits computed and copied at once */
    int32_t dec_splits_max;
    int64_t kv_rows;       /* physical KV rows (static: max_seqs * max_context) */

    void *kv_arena;        /* the whole KV cache */
    dsq_attn_kv *kv;       /* host [n_layers]; block_table set per pass */

    void *scratch;         /* one allocation carved into: */
    float *x;              /* [max_tokens][E] residual stream */
    dsq_bf16 *xn;          /* [max_tokens][E] normalised rows */
    float *qkv;            /* [max_tokens][QKV] q|k|v products, bias added */
    dsq_bf16 *qkvb;        /* [max_tokens][QKV] same after RoPE, bf16 */
    dsq_bf16 *attn;        /* [max_tokens][H*D] attention output */
    float *gu;             /* [max_tokens][gu_cols] gate/up products (GEMM path), and
                              any layer product on Q8 codes before its row scales */
    int64_t gu_elems;      /* max_tokens x max(2F, QKV, E) */
    dsq_bf16 *wq_tile;     /* [cm->wq_tile_elems] a quantized matrix dequantized
                              for the cuBLASLt path (NULL: no quantized layers) */
    int64_t wq_tile_elems;
    dsq_bf16 *act;         /* [max_tokens][F] silu(gate)*up */
    float *part;           /* [max_tokens][E] a product before its residual add
                              (resid_after); aliases qkv when QKV >= E */
    float *logits;         /* [logit_chunk][V] */
    int32_t *meta;         /* [meta_cap] this pass's batch description */
    void *dec_ws;          /* flash-decoding partials */
    size_t dec_ws_bytes;
    void *pre_ws;          /* split-key prefill partials (dsq_attn_prefill_ws) */
    size_t pre_ws_bytes;
    int32_t rows_max;      /* products of up to this many rows through gemm_rows.cu
                              (DSQ_CUDA_GEMM_ROWS; 0: cuBLASLt as before) */
    int32_t rows_min;      /* > 0: from this many rows up to rows_max, gemm_rows.cu even
                              below gemv_max (DSQ_CUDA_GEMM_ROWS_MIN; measurement) */
    int32_t qrows_max;     /* quantized products of up to this many rows through
                              gemm_rows.cu (DSQ_CUDA_QROWS, default 64 on sm_80
                              and later; 0: GEMV / dequantize + cuBLASLt) */
    int32_t qrows_q8_min;  /* ... Q8_ROW ones from this many rows (DSQ_CUDA_QROWS_Q8_MIN,
                              default 3: at 1-2 rows its GEMV is as fast or faster) */
    int32_t qrows_q4_min;  /* ... Q4_G128 ones the 4-bit GEMV would take (qkv, o, down)
                              from this many rows (DSQ_CUDA_QROWS_Q4_MIN, default 3:
                              1-2 rows on gemv.cu's GEMV; 1: every row count) */
    int32_t qmma_q4_max;   /* Q4_G128 products of up to this many rows on
                              gemv_mma_quant.cu (DSQ_CUDA_Q4_MMA, default 8 on
                              sm_80 and later; 0: never) */
    int32_t qmma_q8_max;   /* ... Q8_ROW ones (DSQ_CUDA_Q8_MMA, default 8) */
    int32_t qmma_q4_long;  /* ... Q4_G128 ones with K > 4,096 (down) from this many
                              rows (DSQ_CUDA_Q4_MMA_LONG, default 1; 0: never) */
    int32_t qmma_q8_long;  /* ... Q8_ROW ones (DSQ_CUDA_Q8_MMA_LONG, default 2) */
    int32_t qmma_norm;     /* ... of at most this many tiles with the RMSNorm folded in
                              (DSQ_CUDA_QMMA_NORM; default 0: never) */
    int32_t qtile_parts;   /* 2 (default): quantized products of more rows through the
                              dequantization tile as hi + lo bf16 parts (exact);
                              1: one bf16-rounded part (DSQ_CUDA_QTILE=1) */
    float *rows_ws;        /* gemm_rows.cu's split-K partials [rows_ws_bytes]
                              (rows_max > 0, or qrows_max > 0 with quantized weights) */
    size_t rows_ws_bytes;
    int32_t *rows_tickets; /* [rows_n_tickets], zeroed at creation */
    int32_t rows_n_tickets;
    size_t meta_cap;       /* int32 elements */

    int32_t *meta_host[2]; /* pinned [meta_cap], alternating between passes */
    cudaEvent_t meta_sent[2];
    int meta_slot;
    float *logits_host;    /* pinned [logit_chunk][V] */
    cudaEvent_t copied[COPY_PIECES]; /* logits pieces that reached logits_host */
    int pinned_out;        /* this pass's logits buffer is page-locked host memory */

    /* decode-step graphs, [max_bseqs][2][n_bt_buckets][DSQ_CU_GRAPH_PIECES]
     * by (batch size, logits wanted, block-table stride), then piece (a
     * step is captured as graph_pieces graphs over consecutive layers:
     * cu_graph_piece); NULL when graphs are off (DSQ_CUDA_GRAPHS=0).
     * graph_failed: [max_bseqs][2][n_bt_buckets] */
    cudaGraphExec_t *graphs;
    uint8_t *graph_failed;
    int32_t graph_pieces; /* 1..DSQ_CU_GRAPH_PIECES (DSQ_CUDA_GRAPH_PIECES) */
    int32_t gemm_tune; /* DSQ_CUDA_GEMM_TUNE: a decode graph's cuBLASLt plans timed, then captured again */

    /* dsq_step sampling (cuda/sampling.cu) */
    int32_t *ring;         /* [max_seqs][hist_r] last hist_r tokens of each
                              sequence: position p at p % hist_r */
    int32_t hist_r;        /* min(DSQ_PENALTY_MAX_N, max_context) */
    dsq_samp_row *srow_dev, *srow_host;       /* [max_bseqs]; host pinned */
    dsq_samp_result *sres_dev, *sres_host;    /* [max_bseqs]; host pinned */
    cudaEvent_t srow_sent; /* the upload out of srow_host finished */
    cu_tp_ctx *tp;         /* tensor parallelism: the ranks' contexts (this
                              context is the first local rank's) */
} cu_ctx;

dsq_status cu_ctx_init(dsq_ctx *c);
void cu_ctx_free(dsq_ctx *c);
/* Block-table stride for a pass whose longest sequence needs `need`
 * blocks (the next power of two, at most bt_max) in *stride; returns the
 * bucket index. */
int32_t cu_bt_bucket(int32_t need, int32_t bt_max, int32_t *stride);

/* ---- one pass (backend_pass.cu) ------------------------------------------------ */

/* One pass's shape and the device addresses of its metadata (fixed for a
 * given shape, which is what lets a decode step be replayed from a graph). */
/* A decode step's graph is launched as up to this many graphs over
 * consecutive layers (cu_graph_piece): cudaGraphLaunch's host time grows
 * with the graph's nodes (~140 us for a 1.5B step's ~170 kernels, measured
 * on an H100), and the GPU waits for all of it before the first kernel;
 * launched in pieces, the first (one layer) starts at once and each later
 * piece is launched while the one before it runs.  Default 1 piece: the
 * first kernel then starts ~4 us after the first call instead of ~140, but
 * dsqwen bench's step measured no faster (stop 30); DSQ_CUDA_GRAPH_PIECES
 * = 2..4 turns them on. */
#define DSQ_CU_GRAPH_PIECES 4

typedef struct cu_pass {
    int32_t T, S, NL, max_q, decode, splits;
    int32_t max_kv;    /* prefill part: the most keys a sequence holds after the pass */
    int32_t nd;        /* mixed pass: the first nd sequences (rows 0..nd-1) bring one
                          token each and use the decode kernel; the rest the prefill
                          kernel (max_q over those).  0 otherwise. */
    int32_t bt_stride, bt_key;
    const int32_t *tok, *pos, *tseq, *cu, *pos0, *len, *lrow, *bt, *sid;
    const int32_t *cu_pre; /* [S-nd+1] cu_seqlens of the prefill part, from 0 */
} cu_pass;

/* Pack the batch description and upload it on the context's stream (no
 * pass enqueued). */
dsq_status cu_prepare_pass(dsq_ctx *c, const dsq_batch *bt, int32_t NL, cu_pass *p);
/* Tensor parallelism: the pass in segments that end where a row-parallel
 * product's partial sums must be all-reduced.  Segment 0 starts with the
 * embedding; segment k (0 < k) starts with the residual add of product k-1
 * (cc->part, reduced by then); segments 0..n-1 end with product k into
 * cc->part (its bias when add_bias: rank 0); segment n (n = n_layers x the
 * recipe's LINEAR_RESID ops) ends with the final norm and this rank's head
 * rows of the first logit chunk into cc->logits ([rows][its vocab part]). */
dsq_status cu_enqueue_segment(dsq_ctx *c, const cu_pass *p, int32_t seg, int add_bias);
/* n above for the context's model. */
int32_t cu_n_segments(const dsq_config *cf);

/* Pack the batch description, upload it and enqueue (or replay) the pass
 * with NL logit rows; the first chunk of logits ends in cc->logits. */
dsq_status cu_launch_forward(dsq_ctx *c, const dsq_batch *bt, int32_t NL);
/* Logits of n more rows (xn rows r0..r0+n) into cc->logits: the chunks of
 * the head after the first, which the pass computed. */
dsq_status cu_head_rows(dsq_ctx *c, int32_t r0, int32_t n);

/* ---- tensor parallelism (backend_tp.cu) ---------------------------------------- */

/* cu_model_load with p->tp_world > 1: ranks, slices, uploads, communicators. */
dsq_status cu_tp_model_load(dsq_model *m, const dsq_model_params *p);
void cu_tp_model_free(dsq_model *m);
dsq_status cu_tp_ctx_init(dsq_ctx *c);
void cu_tp_ctx_free(dsq_ctx *c);
/* cu_launch_forward / cu_head_rows of a tensor-parallel context: every
 * local rank's pass, all-reduces between segments, the logits gathered into
 * the first rank's cc->logits ([rows][V]); bounded by tp_timeout_s. */
dsq_status cu_tp_launch_forward(dsq_ctx *c, const dsq_batch *bt, int32_t NL);
dsq_status cu_tp_head_rows(dsq_ctx *c, int32_t r0, int32_t n);
/* The local ranks' contexts (shadows of c, refreshed from it) and their
 * count, for per-rank work such as KV row copies; NULL if not TP. */
dsq_ctx *cu_tp_rank_ctxs(dsq_ctx *c, int32_t *n);

#endif /* DSQ_CUDA_BACKEND_H */
