/*
 * internal.h - types shared by the host code and the backends.  Not installed.
 *
 * Data flow: dsq_model_load() -> config (cfg.arch: the model description,
 * lib/arch.h) + safetensors (mmap, validated) -> dsq_weights (views into
 * the mapping, by role, as the description names them) ->
 * backend->model_load (CUDA uploads per recipe op and the views forget their
 * data; CPU keeps the views and builds dsq_weight descriptors, lib/weight.h).  dsq_prefill()/dsq_decode_step() -> api.c validates,
 * reserves KV room, builds a dsq_batch -> backend->forward.
 */
#ifndef DSQ_INTERNAL_H
#define DSQ_INTERNAL_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include "dsqwen.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- errors -------------------------------------------------------------- */

/* Record `st` with a printf-style message as this thread's last error, send it
 * to the log callback at DEBUG level, and return `st`.  Every failing internal
 * path returns through this so the user always gets a message. */
dsq_status dsq_fail(dsq_status st, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
/* Clear this thread's last error (called at the start of each public call). */
void dsq_clear_error(void);
/* Deliver a message to the log callback, if one is installed. */
void dsq_log(dsq_log_level level, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* ---- tensors ------------------------------------------------------------- */

typedef enum dsq_dtype {
    DSQ_DT_F32 = 0,
    DSQ_DT_F16 = 1,
    DSQ_DT_BF16 = 2,
    DSQ_DT_OTHER = 3 /* a valid safetensors dtype the model cannot use */
} dsq_dtype;

size_t dsq_dtype_size(dsq_dtype dt);
const char *dsq_dtype_name(dsq_dtype dt);

#define DSQ_MAX_DIMS 8

/* A read-only view of a tensor in host memory (usually the mmapped file).
 * Row-major; shape[0] is the slowest dimension.  Linear weights are
 * [out_features, in_features]. */
typedef struct dsq_tensor {
    const void *data;
    dsq_dtype dtype;
    int32_t ndim;
    int64_t shape[DSQ_MAX_DIMS];
    size_t nbytes;
} dsq_tensor;

int64_t dsq_tensor_numel(const dsq_tensor *t);

/* ---- safetensors (lib/safetensors.c) --------------------------------------- */

typedef struct dsq_st_entry {
    char *name;
    char dtype_str[8]; /* as in the header: "BF16", "F32", "I64", ... */
    dsq_tensor t;      /* data points into the file mapping, possibly
                          misaligned for the dtype (use dsq_st_tensor), or
                          to the private copy once one was made; NULL after
                          dsq_st_unmap unless copied */
    int32_t file;      /* index into the set's files */
} dsq_st_entry;

typedef struct dsq_st_set dsq_st_set; /* one or more mapped files */

/* Open a single .safetensors file. */
dsq_status dsq_st_open_file(const char *path, dsq_st_set **out);
/* Open a directory: model.safetensors, or model.safetensors.index.json and
 * the shards it names. */
dsq_status dsq_st_open_dir(const char *dir, dsq_st_set **out);
void dsq_st_close(dsq_st_set *set);
const dsq_st_entry *dsq_st_find(const dsq_st_set *set, const char *name);
int32_t dsq_st_count(const dsq_st_set *set);
const dsq_st_entry *dsq_st_at(const dsq_st_set *set, int32_t i);
/* A typed view of entry `e` of `set` in *out: data aligned for its dtype.
 * The bytes are copied to private heap memory (once; kept until the set is
 * closed) when the mapped bytes are misaligned or `private_copy` is set, so
 * only tensors someone asks for are ever copied.  DSQ_ERR_OUT_OF_MEMORY,
 * DSQ_ERR_INVALID_ARG.  Not thread-safe (updates the set). */
dsq_status dsq_st_tensor(dsq_st_set *set, const dsq_st_entry *e, int private_copy,
                         dsq_tensor *out);
/* Bytes copied by dsq_st_tensor so far. */
uint64_t dsq_st_copied_bytes(const dsq_st_set *set);
/* Drop every file mapping: only copied tensors keep their data (others get
 * data NULL), and the files may change from then on. */
void dsq_st_unmap(dsq_st_set *set);

/* ---- config (lib/config.c) ----------------------------------------------- */

/* config.json's quantization_config (lib/quant_config.h parses it). */
typedef enum dsq_quant_method {
    DSQ_QM_NONE = 0,  /* not quantized */
    DSQ_QM_AWQ = 1,   /* AutoAWQ GEMM packing (repacked at load) */
    DSQ_QM_GPTQ = 2,  /* AutoGPTQ / GPTQModel packing (repacked at load) */
    DSQ_QM_DSQWEN = 3 /* this library's own layouts (used as stored) */
} dsq_quant_method;

typedef struct dsq_quant_config {
    dsq_quant_method method;
    int32_t bits;             /* 4 or 8 (0 for NONE) */
    int32_t group_size;       /* 128, or -1 = one group per output row (Q8_ROW) */
    int32_t zero_point;       /* 1: asymmetric, a zero point per group is stored
                                 (AWQ, GPTQ sym=false, dsqwen 4-bit); 0: symmetric */
    int32_t desc_act;         /* always 0 once accepted */
    int32_t gptq_zero_offset; /* GPTQ: 1 for v1 checkpoints ("gptq": the stored
                                 zero nibble is zero - 1), 0 for "gptq_v2";
                                 0 for the other methods */
    int32_t version;          /* dsqwen: format version (1); others 0 */
    int32_t lm_head;          /* GPTQ "lm_head": true = the head is quantized too */
    int32_t has_skip_list;    /* AWQ modules_to_not_convert is a non-empty list:
                                 some linears stay unquantized (the loader tells
                                 them apart by their tensor names) */
} dsq_quant_config;


typedef struct dsq_config {
    int32_t n_vocab;
    int32_t n_embd;
    int32_t n_layers;
    int32_t n_heads;
    int32_t n_kv_heads;
    int32_t head_dim;   /* n_embd / n_heads unless config says head_dim */
    int32_t n_ff;
    int32_t max_pos;    /* max_position_embeddings */
    float rope_theta;
    float rms_eps;
    int32_t tie_embeddings;
    int32_t bos_token;  /* -1 if absent */
    int32_t eos_token;  /* -1 if absent (first of a list) */
    const struct dsq_arch *arch; /* the model description (lib/arch.h) */
    dsq_quant_config quant;      /* quantization_config (method NONE if absent) */
} dsq_config;

/* Parse config.json text; refuses unsupported architectures/values naming
 * the field (DSQ_ERR_CONFIG / DSQ_ERR_UNSUPPORTED / DSQ_ERR_FORMAT). */
dsq_status dsq_config_parse(const char *json, size_t len, dsq_config *cfg);
dsq_status dsq_config_load(const char *path, dsq_config *cfg);

/* ---- weights (lib/weights.c) -------------------------------------------- */

/* Views of every weight the config implies, shapes checked, by role: the
 * model description (lib/arch.h) says which checkpoint tensor plays each
 * role, its shape and whether it may be absent.  An absent optional tensor
 * (a bias) has data NULL and means zeros, on every backend.  Roles are
 * generic: an architecture uses the ones its recipe names. */
enum {
    DSQ_GW_TOK_EMBD = 0, /* [V, E] */
    DSQ_GW_OUT_NORM,     /* [E] */
    DSQ_GW_LM_HEAD,      /* [V, E]; == the embedding when tied */
    DSQ_GW_COUNT
};
enum {
    DSQ_LW_ATTN_NORM = 0, /* [E] */
    DSQ_LW_Q, DSQ_LW_Q_BIAS, /* [H*D, E], [H*D] */
    DSQ_LW_K, DSQ_LW_K_BIAS, /* [KV*D, E], [KV*D] */
    DSQ_LW_V, DSQ_LW_V_BIAS, /* [KV*D, E], [KV*D] */
    DSQ_LW_O, DSQ_LW_O_BIAS, /* [E, H*D], [E] */
    DSQ_LW_FFN_NORM,      /* [E] */
    DSQ_LW_GATE, DSQ_LW_UP, /* [F, E] */
    DSQ_LW_DOWN,          /* [E, F] */
    DSQ_LW_COUNT
};

typedef struct dsq_layer_weights {
    dsq_tensor t[DSQ_LW_COUNT];
} dsq_layer_weights;

typedef struct dsq_weights {
    dsq_tensor g[DSQ_GW_COUNT];
    dsq_layer_weights *layers;     /* [n_layers] */
    int64_t n_params;
    int64_t n_bytes;
    /* quantized linears (lib/weights_quant.h): NULL when none; a role held
     * there has a dsq_tensor slot with data NULL (shape [N, K] logical) */
    struct dsq_qweights *q;
} dsq_weights;

/* Bind, copying only the misaligned tensors the model uses
 * (dsq_st_tensor); with `private_copy` every used tensor is copied, so the
 * files may be unmapped (dsq_st_unmap) afterwards.  The views stay owned
 * by `st`. */
dsq_status dsq_weights_bind(dsq_st_set *st, const dsq_config *cfg, int private_copy,
                            dsq_weights *w);
void dsq_weights_release(dsq_weights *w);
/* Forget every view's data (after the backend copied the weights and the
 * mapping was closed): sizes and dtypes stay, data becomes NULL, so nothing
 * points into a closed mapping. */
void dsq_weights_forget_data(dsq_weights *w, int32_t n_layers);
/* Refuse non-finite values (NaN, +-Inf) in any bound weight with
 * DSQ_ERR_FORMAT naming the tensor: one pass over every value, split over
 * n_threads threads (0 = all cores).  DSQ_ERR_OUT_OF_MEMORY if the threads
 * cannot be had. */
dsq_status dsq_weights_check_finite(const dsq_weights *w, const dsq_config *cfg, int n_threads);
/* 1 if any of the n values of dtype dt at p is NaN or +-Inf, else 0 (the
 * scan the check above runs per chunk; branch-free, so it vectorizes). */
int dsq_any_nonfinite(const void *p, dsq_dtype dt, size_t n);

/* ---- batches --------------------------------------------------------------- */

/* One forward pass over tokens of one or more sequences (varlen batch).
 * Tokens of sequence i are tokens[seq_start[i] .. seq_start[i+1]) at
 * positions seq_pos0[i], seq_pos0[i]+1, ...; the cache already holds
 * seq_pos0[i] tokens of that sequence and room for the new ones has been
 * reserved (paged blocks included) before forward is called.
 * A prefill chunk is n_seqs == 1; a decode step is one token per sequence. */
typedef struct dsq_batch {
    int32_t n_tokens;
    int32_t n_seqs;
    const int32_t *tokens;     /* [n_tokens] */
    const int32_t *pos;        /* [n_tokens] absolute positions */
    const int32_t *tok_seq;    /* [n_tokens] index (0..n_seqs-1) of the token's sequence */
    const int32_t *seq_ids;    /* [n_seqs] */
    const int32_t *seq_start;  /* [n_seqs + 1] */
    const int32_t *seq_pos0;   /* [n_seqs] */
    int32_t n_logits;          /* rows of logits wanted (0 = skip the head) */
    const int32_t *logit_rows; /* [n_logits] token indices, in output order */
} dsq_batch;

/* ---- paged KV bookkeeping (lib/kv_pages.c) ------------------------------- */

/* Host-side block allocator shared by the backends, with blocks shared
 * between sequences by reference count (dsq_seq_fork).
 * Pool of n_blocks blocks of block_size tokens; rows[seq][j] is the physical
 * block holding that sequence's tokens j*bs .. (j+1)*bs-1, for
 * j < n_seq_blocks[seq].  A sequence's row is allocated on first use and
 * grows by doubling, so host memory follows the tokens cached, not
 * max_seqs x max_context.  Invariant between calls: n_seq_blocks[seq] ==
 * ceil(length / bs).  A block with ref > 1 is never written: a sequence
 * about to write into a shared partial block first gets a private copy
 * (copy on write, planned by dsq_kv_pages_reserve, copied by the backend's
 * copy_kv_rows). */
typedef struct dsq_kv_pages {
    int32_t block_size;
    int32_t n_blocks;
    int32_t max_seqs;
    int32_t max_blocks_per_seq;   /* ceil(max_context / block_size) */
    int32_t **rows;               /* [max_seqs] -> [row_cap[seq]] block ids; NULL until used */
    int32_t *row_cap;             /* [max_seqs] */
    int32_t *n_seq_blocks;        /* [max_seqs] blocks held */
    int32_t *ref;                 /* [n_blocks] sequences holding each block (0 = free) */
    int32_t *free_stack;          /* [n_blocks] */
    int32_t n_free;
} dsq_kv_pages;

/* One copy-on-write planned by dsq_kv_pages_reserve: sequence `seq` now
 * holds new_blk at index idx of its row instead of the shared old_blk, and
 * the first n_rows rows of old_blk must be copied into new_blk before the
 * forward pass writes. */
typedef struct dsq_kv_cow {
    int32_t seq, idx, old_blk, new_blk, n_rows;
} dsq_kv_cow;

/* One copy of KV rows inside the cache (every layer, K and V, INT8 scales):
 * rows src_row .. src_row+n_rows-1 -> dst_row ..; ranges do not overlap. */
typedef struct dsq_kv_copy {
    int64_t dst_row, src_row, n_rows;
} dsq_kv_copy;

dsq_status dsq_kv_pages_init(dsq_kv_pages *p, int32_t max_seqs, int32_t max_context,
                             int32_t block_size, int32_t n_blocks);
void dsq_kv_pages_destroy(dsq_kv_pages *p);
/* Ensure every seqs[i] (distinct) has room for new_len[i] tokens when it now
 * holds cur_len[i] (< new_len[i]), with a private copy of a shared partial
 * last block; the copies to make are written to cow[0 .. *n_cow) (room for n
 * entries).  All-or-nothing: DSQ_ERR_KV_FULL or DSQ_ERR_OUT_OF_MEMORY leave
 * every table and count unchanged (row capacity may have grown). */
dsq_status dsq_kv_pages_reserve(dsq_kv_pages *p, int32_t n, const int32_t *seqs,
                                const int32_t *cur_len, const int32_t *new_len,
                                dsq_kv_cow *cow, int32_t *n_cow);
/* Undo the copies-on-write of a reserve whose forward pass failed (each
 * sequence gets its shared block back; the private copy returns to the pool).
 * Call before trimming the same sequences. */
void dsq_kv_pages_undo_cow(dsq_kv_pages *p, const dsq_kv_cow *cow, int32_t n_cow);
/* Give back blocks of `seq` beyond those needed for `keep_len` tokens
 * (a shared block only loses a reference). */
void dsq_kv_pages_trim(dsq_kv_pages *p, int32_t seq, int32_t keep_len);
/* Make empty sequence `dst` share every block of `src` (references +1).
 * DSQ_ERR_OUT_OF_MEMORY (host, for dst's row) changes nothing. */
dsq_status dsq_kv_pages_fork(dsq_kv_pages *p, int32_t src, int32_t dst);
/* Blocks in use (held by at least one sequence). */
static inline int32_t dsq_kv_pages_used(const dsq_kv_pages *p) { return p->n_blocks - p->n_free; }

/* ---- sampling defaults ------------------------------------------------------- */

/* generation_config.json of DeepSeek-R1-Distill-Qwen-1.5B: the defaults of
 * both dsq_sampler_params (host sampler) and dsq_sample_params (dsq_step),
 * kept in one place so the two cannot drift. */
#define DSQ_DEFAULT_TEMPERATURE 0.6f
#define DSQ_DEFAULT_TOP_P 0.95f
#define DSQ_DEFAULT_PENALTY_LAST_N 64
#define DSQ_DEFAULT_SEED 0x5eedu

/* ---- generation_config.json (lib/generation_config.c) -------------------- */

/* Bits of dsq_gen_config.has: which sampler fields the file set. */
enum {
    DSQ_GEN_TEMPERATURE = 1u << 0, /* "temperature", or do_sample false -> 0 */
    DSQ_GEN_TOP_K = 1u << 1,
    DSQ_GEN_TOP_P = 1u << 2,
    DSQ_GEN_MIN_P = 1u << 3,
    DSQ_GEN_REPETITION_PENALTY = 1u << 4
};

typedef struct dsq_gen_config {
    uint32_t has;              /* DSQ_GEN_* bits; 0: no file or no field */
    float temperature;         /* 0 when "do_sample" is false */
    int32_t top_k;
    float top_p;
    float min_p;
    float repetition_penalty;
} dsq_gen_config;

/* Parse generation_config.json text; `name` (the path) goes into messages.
 * DSQ_ERR_FORMAT naming the field for bad JSON, types or values. */
dsq_status dsq_gen_config_parse(const char *json, size_t len, const char *name,
                                dsq_gen_config *g);
/* Read dir/generation_config.json if it exists (else g->has = 0, DSQ_OK). */
dsq_status dsq_gen_config_load(const char *dir, dsq_gen_config *g);

/* ---- per-sequence token history (lib/seq_history.c) ---------------------- */

/* tok[seq][0..len[seq]) are the tokens sequence `seq` holds (as its KV cache);
 * each array grows by doubling (capacity cap[seq]). */
typedef struct dsq_seq_history {
    int32_t n_seqs;
    int32_t **tok;  /* [n_seqs] malloc'ed arrays, NULL until first use */
    int32_t *len;   /* [n_seqs] */
    int32_t *cap;   /* [n_seqs] */
} dsq_seq_history;

dsq_status dsq_hist_init(dsq_seq_history *h, int32_t n_seqs);
void dsq_hist_destroy(dsq_seq_history *h);
/* Room for n tokens in seq's array (DSQ_ERR_OUT_OF_MEMORY changes nothing). */
dsq_status dsq_hist_reserve(dsq_seq_history *h, int32_t seq, int32_t n);
/* Append after a successful dsq_hist_reserve (cannot fail). */
void dsq_hist_append(dsq_seq_history *h, int32_t seq, const int32_t *tokens, int32_t n);

/* For sequence operations (dsq_seq_truncate / dsq_seq_fork): keep the history
 * and the backend's device copy equal to what the KV cache holds.
 * truncate: keep the first n tokens; fork: dst gets a copy of src's tokens
 * (dst's old tokens dropped); clear: the sequence was removed. */
dsq_status dsq_seq_history_truncate(dsq_ctx *c, int32_t seq, int32_t n);
dsq_status dsq_seq_history_fork(dsq_ctx *c, int32_t dst, int32_t src);
void dsq_seq_history_clear(dsq_ctx *c, int32_t seq);

/* ---- sampling inside a step (lib/step.c, lib/sample_cpu.c, cuda/sampling.cu) */

enum { DSQ_SROW_SAMPLE = 1u, DSQ_SROW_LOGPROB = 2u };

/* One logits row to post-process: resolved dsq_sample_params plus where the
 * row's sequence stands.  Plain data, copied to the device as is. */
typedef struct dsq_samp_row {
    float temperature, top_p, min_p;
    float rep_pen, pres_pen, freq_pen;
    int32_t top_k;
    int32_t pen_n;      /* penalty window; 0 = no penalties */
    int32_t n_valid;    /* ids >= this are never chosen (1..n_vocab) */
    int32_t top_n;      /* 0..DSQ_STEP_MAX_TOP_N */
    int32_t seq;        /* sequence id (row of the device history) */
    int32_t hist_len;   /* tokens the sequence holds after this step = the
                           position of the token drawn (RNG counter) */
    uint32_t flags;     /* DSQ_SROW_* */
    uint32_t seed_lo, seed_hi;
    int32_t out_row;    /* row of the caller's logits buffer, -1: none */
} dsq_samp_row;

typedef struct dsq_samp_result {
    int32_t token;      /* -1: not sampled / no finite logit */
    float logprob;
    int32_t n_top;
    int32_t n_kept;     /* tokens the draw chose among (diagnostics, tests) */
    int32_t top_ids[DSQ_STEP_MAX_TOP_N];
    float top_lp[DSQ_STEP_MAX_TOP_N];
} dsq_samp_result;

/* Host implementation of one row (lib/sample_cpu.c): raw log-probs / top-n,
 * penalties over hist[0..r->hist_len) (the sequence's tokens, this step's
 * included), then lib/sampler.c's pipeline with the Philox uniform of
 * (seed, hist_len).  `x` is the row of n_vocab logits (not modified). */
typedef struct dsq_sample_ws dsq_sample_ws;
dsq_status dsq_sample_ws_new(int32_t n_vocab, dsq_sample_ws **out);
void dsq_sample_ws_free(dsq_sample_ws *ws);
dsq_status dsq_sample_cpu_row(dsq_sample_ws *ws, const float *x, int32_t n_vocab,
                              const dsq_samp_row *r, const int32_t *hist, dsq_samp_result *res);

/* lib/sampler.c hooks for the above: replace the warper settings of a
 * sampler (penalty untouched) and draw with a given uniform u in [0,1). */
void dsq_sampler_set_warpers(dsq_sampler *s, float temperature, int32_t top_k, float top_p,
                             float min_p, int32_t n_vocab_valid);
dsq_status dsq_sampler_sample_u(dsq_sampler *s, const float *logits, int32_t n_vocab, double u,
                                int32_t *token_out);

/* ---- model, context, backends -------------------------------------------- */

typedef struct dsq_backend_ops dsq_backend_ops;

struct dsq_model {
    dsq_config cfg;
    dsq_st_set *st;            /* mapping; NULL once a backend dropped it;
                                  unmapped (only private copies left) with
                                  params.copy_weights on the CPU backend   */
    dsq_weights w;             /* views into st (invalid once st is NULL)  */
    const dsq_backend_ops *ops;
    void *be;                  /* backend state */
    int64_t device_bytes;
    dsq_tokenizer *tokenizer;  /* owned; may be NULL */
    char *dir;                 /* directory the model came from */
    dsq_gen_config gen;        /* generation_config.json (has == 0 if none) */
    /* load progress (only during dsq_model_load): params' callback, and the
     * part of 0..1 that the current phase maps its own 0..1 into */
    dsq_progress_fn progress;
    void *progress_user;
    float progress_lo, progress_hi;
};

struct dsq_ctx {
    dsq_model *model;
    dsq_ctx_params p;          /* resolved: every default filled in */
    int32_t *seq_len;          /* [max_seqs] tokens cached per sequence */
    dsq_kv_pages pages;        /* used when p.kv_layout == DSQ_KV_PAGED */
    int64_t kv_bytes_per_token;
    int64_t kv_bytes;
    int64_t scratch_bytes;
    void *be;                  /* backend state */
    /* host scratch for building batches: [max_batch_tokens] each ([+1] for
     * the per-sequence ones; a batch never holds more sequences than tokens) */
    int32_t *b_tokens, *b_pos, *b_tok_seq, *b_seq_ids, *b_seq_start, *b_seq_pos0,
        *b_logit_rows, *b_new_len, *b_cur_len;
    dsq_kv_cow *b_cow;         /* [max_batch_tokens] copies-on-write of one pass */
    dsq_kv_copy *b_copy;       /* [max_batch_tokens] the same as row copies */
    struct dsq_batch_entry *b_entry; /* [max_batch_tokens] dsq_batch_build input */
    char last_error[512];
    dsq_seq_history hist;      /* every sequence's tokens (penalties) */
    dsq_sample_ws *sample_ws;  /* host sampling scratch, made on first use */
    float *step_logits;        /* host [step_logits_rows][n_vocab], first use */
    int32_t step_logits_rows;
    dsq_samp_row *step_rows;   /* [step_cap] dsq_step scratch, first use */
    dsq_samp_result *step_res; /* [step_cap] */
    int32_t step_cap;
};

/* Physical KV row of (seq, pos): static = seq*max_context + pos;
 * paged = rows[seq][pos/bs]*bs + pos%bs. */
static inline int64_t dsq_kv_row(const dsq_ctx *c, int32_t seq, int32_t pos)
{
    if (c->p.kv_layout == DSQ_KV_PAGED) {
        const dsq_kv_pages *p = &c->pages;
        int32_t blk = p->rows[seq][pos / p->block_size];
        return (int64_t)blk * p->block_size + pos % p->block_size;
    }
    return (int64_t)seq * c->p.max_context + pos;
}

struct dsq_backend_ops {
    const char *name;
    dsq_backend kind;
    /* Take the weights in m->w (views into m->st).  May set m->be,
     * m->device_bytes; may close m->st if it no longer needs it. */
    dsq_status (*model_load)(dsq_model *m, const dsq_model_params *p);
    void (*model_free)(dsq_model *m);
    /* c->p is resolved and c->pages initialised (paged).  Check what the
     * backend supports (DSQ_ERR_UNSUPPORTED), set c->kv_bytes_per_token,
     * allocate KV + scratch, set c->kv_bytes / c->scratch_bytes, c->be. */
    dsq_status (*ctx_init)(dsq_ctx *c);
    void (*ctx_free)(dsq_ctx *c);
    /* Run the batch: write K/V of the new tokens at their rows, compute
     * logits of b->logit_rows into logits[n_logits][n_vocab] (host). */
    dsq_status (*forward)(dsq_ctx *c, const dsq_batch *b, float *logits);
    /* Optional: the sequence was removed (KV rows may be reused). */
    void (*seq_removed)(dsq_ctx *c, int32_t seq);
    /* Copy KV rows (copy-on-write of a shared paged block, the static
     * cache's dsq_seq_fork), ordered before the next forward pass (CUDA: on
     * the context stream, no host synchronisation). */
    dsq_status (*copy_kv_rows)(dsq_ctx *c, int32_t n, const dsq_kv_copy *copies);
    /* Optional (NULL: api.c runs forward into host memory and samples there):
     * run the batch, write the logits of row r to logits + out_row * n_vocab
     * (host, or device memory when logits_on_device) for rows with out_row
     * >= 0, and post-process row r of b->logit_rows with rows[r] into res[r]
     * (all n_logits rows). */
    dsq_status (*step)(dsq_ctx *c, const dsq_batch *b, const dsq_samp_row *rows,
                       dsq_samp_result *res, float *logits, int logits_on_device);
    /* Optional: c->hist of `seq` changed other than by appending (truncate,
     * fork); refresh any device copy. */
    void (*hist_sync)(dsq_ctx *c, int32_t seq);
    /* Optional (NULL: calls are synchronous): wait for the context's queued
     * work; a device fault that surfaces is returned. */
    dsq_status (*synchronize)(dsq_ctx *c);
    /* Optional (NULL: no stream): the context's CUDA stream. */
    void *(*stream)(const dsq_ctx *c);
};

/* ---- sequence batches beyond dsq_prefill / dsq_decode_step (lib/api.c) ---- */

/* One sequence's part of a batch: n_tokens >= 1 new tokens (a prompt chunk,
 * or 1 for a decode step); want_logits: its last token's logits row is
 * computed (rows in entry order). */
typedef struct dsq_batch_entry {
    int32_t seq, n_tokens;
    const int32_t *tokens;
    int32_t want_logits;
} dsq_batch_entry;

/* The validation and all-or-nothing bookkeeping shared by every call that
 * runs such a batch (dsq_ctx_forward_mixed, dsq_step):
 *   dsq_batch_build: check n entries (n <= max_batch_tokens and max_seqs;
 *     distinct valid ids: DSQ_ERR_SEQ / _INVALID_ARG; tokens: _TOKEN; total
 *     <= max_batch_tokens: _BATCH; max_context: _CONTEXT_FULL; messages
 *     prefixed by `who`), then fill c's batch scratch and *b.  Changes no
 *     state.
 *   dsq_batch_reserve: token-history room, paged KV blocks (copy on write of
 *     shared partial blocks enqueued on the backend), then the new tokens
 *     appended to the histories.  On error nothing changed.
 *   dsq_batch_finish: after the pass: DSQ_OK advances the lengths; an error
 *     undoes dsq_batch_reserve (blocks, copies, histories and their device
 *     copies), so no sequence changed.
 * The e array must stay valid and unchanged between the three calls; the
 * batch scratch (c->b_*) must not be reused in between. */
dsq_status dsq_batch_build(dsq_ctx *c, const char *who, int32_t n, const dsq_batch_entry *e, dsq_batch *b);
dsq_status dsq_batch_reserve(dsq_ctx *c, int32_t n, const dsq_batch_entry *e, int32_t *n_cow);
void dsq_batch_finish(dsq_ctx *c, int32_t n, const dsq_batch_entry *e, int32_t n_cow, dsq_status pass_st);

/* One forward pass advancing n distinct sequences: seqs[i] gets
 * n_tokens_each[i] >= 1 tokens (a prompt chunk, or 1 for a decode step; an
 * empty sequence starts at position 0), taken in order from the concatenated
 * `tokens`.  logits: NULL, or [n][n_vocab], the logits of each sequence's last
 * new token.  Validates like dsq_decode_step (DSQ_ERR_INVALID_ARG, _BATCH when
 * the tokens exceed max_batch_tokens, _SEQ, _TOKEN, _CONTEXT_FULL, _KV_FULL)
 * and is all-or-nothing: on any error no sequence changes.  Internal (tests,
 * benchmarks); dsq_step() runs the same dsq_batch_* sequence. */
dsq_status dsq_ctx_forward_mixed(dsq_ctx *c, int32_t n, const int32_t *seqs,
                                 const int32_t *n_tokens_each, const int32_t *tokens,
                                 float *logits);

extern const dsq_backend_ops dsq_cpu_backend;
#ifdef DSQ_HAVE_CUDA
extern const dsq_backend_ops dsq_cuda_backend;
/* NULL when the NVIDIA driver library loads and the CUDA runtime reports
 * a device, else why not (static text).  Cheap after the first call. */
const char *dsq_cuda_device_problem(void);
/* NULL when cuBLASLt was opened (dlopen, once per process; see
 * cuda/cublaslt_loader.cu), else why not, naming the library and dlerror()
 * (static text).  Thread-safe. */
const char *dsq_cublaslt_problem(void);
/* 1 when both of the above are NULL: the CUDA backend can run here (tests
 * use it to decide whether to skip). */
int dsq_cuda_available(void);
#endif

/* Load progress of the current phase (a backend's model_load: `done` of
 * `total`, e.g. bytes uploaded) to the load's progress callback, if any.
 * DSQ_ERR_CANCELLED (message set) when the callback asks to stop; the caller
 * then fails the load. */
dsq_status dsq_load_progress(dsq_model *m, int64_t done, int64_t total);

/* ---- tokenizer (lib/tokenizer.c) --------------------------------------------- */
/* dsq_tokenizer_load() is public; nothing else needed here. */

/* ---- small helpers (lib/util.c) ------------------------------------------------ */

/* Read a whole regular file (NUL-terminated); DSQ_ERR_IO (also for a FIFO,
 * device or directory, refused without blocking) / DSQ_ERR_OUT_OF_MEMORY. */
dsq_status dsq_read_file(const char *path, char **data, size_t *len);
/* malloc'ed "a/b" */
char *dsq_path_join(const char *a, const char *b);
int dsq_is_dir(const char *path);
int dsq_file_exists(const char *path);
/* 1 if `path` names anything (a FIFO, a directory, ...): optional files that
 * exist but are not regular are then refused by dsq_read_file, not skipped. */
int dsq_path_exists(const char *path);
int dsq_n_cores(void);

/* bf16/f16 <-> f32 conversions, exact (round-to-nearest-even on narrowing). */
static inline float dsq_bf16_to_f32(uint16_t h)
{
    union { uint32_t u; float f; } v;
    v.u = (uint32_t)h << 16;
    return v.f;
}
float dsq_f16_to_f32(uint16_t h);
uint16_t dsq_f32_to_f16(float f);
uint16_t dsq_f32_to_bf16(float f);

/* Read element i of a tensor as float, whatever its dtype. */
static inline float dsq_tensor_get(const dsq_tensor *t, int64_t i)
{
    switch (t->dtype) {
    case DSQ_DT_BF16: return dsq_bf16_to_f32(((const uint16_t *)t->data)[i]);
    case DSQ_DT_F16: return dsq_f16_to_f32(((const uint16_t *)t->data)[i]);
    case DSQ_DT_F32: return ((const float *)t->data)[i];
    default: return 0.0f;
    }
}

/* Params struct handling: copy the first `given` bytes of a caller's struct
 * over defaults.  `min` is the size of the struct's first released version. */
dsq_status dsq_copy_params(void *dst, size_t dst_size, const void *src, size_t min_size,
                           const char *what);

/* The body of every dsq_*_params_init(): copy the first `size` bytes of the
 * full defaults `defaults` (of `full` bytes) into `dst` and set its
 * struct_size to `size`. */
dsq_status dsq_params_init(void *dst, uint32_t size, const void *defaults, size_t full,
                           size_t min_size, const char *what);

#ifdef __cplusplus
}
#endif

#endif /* DSQ_INTERNAL_H */
