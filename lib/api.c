/* api.c - the public entry points: argument checks, params, sequence
 * bookkeeping and batching; the numeric work is dispatched to a backend. */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "arch.h"
#include "internal.h"
#include "quant_config.h"
#include "weights_quant.h"
#ifdef DSQ_HAVE_CUDA
#include "nccl_comm.h"
_Static_assert(DSQ_TP_ID_BYTES == DSQ_COMM_ID_BYTES, "one id size for the API and NCCL");
#endif

/* First released sizes of the params/info structs (ABI floor). */
#define MODEL_PARAMS_V1 (offsetof(dsq_model_params, load_tokenizer) + sizeof(int32_t))
#define CTX_PARAMS_V1 sizeof(dsq_ctx_params)
#define MODEL_INFO_V1 sizeof(dsq_model_info)
#define CTX_INFO_V1 sizeof(dsq_ctx_info)

/* Sanity limits: beyond these a request is a mistake, not a workload. */
#define DSQ_MAX_THREADS 1024
#define DSQ_MAX_KV_BYTES ((int64_t)1 << 40) /* 1 TiB of KV cache */
/* Host bookkeeping is about 20 bytes per sequence id whether used or not
 * (lengths, block-table heads); 2^20 ids is 20 MB and far beyond any batch. */
#define DSQ_MAX_SEQS ((int32_t)1 << 20)

/* ---- model ----------------------------------------------------------------- */

static dsq_model_params model_defaults(void)
{
    dsq_model_params p;
    memset(&p, 0, sizeof p);
    p.struct_size = sizeof p;
    p.backend = DSQ_BACKEND_AUTO;
    p.device = 0;
    p.n_threads = 0;
    p.load_tokenizer = 1;
    return p;
}

dsq_status dsq_model_params_init(dsq_model_params *params, uint32_t struct_size)
{
    dsq_model_params d = model_defaults();
    return dsq_params_init(params, struct_size, &d, sizeof d, MODEL_PARAMS_V1, "dsq_model_params");
}

/* The CUDA backend needs the NVIDIA driver, a device and cuBLASLt, all
 * found at run time (nothing CUDA is a link-time dependency of the library),
 * so a CUDA build still loads and runs on the CPU where they are missing. */
static const dsq_backend_ops *pick_backend(int32_t want, dsq_status *st)
{
    *st = DSQ_OK;
    switch (want) {
    case DSQ_BACKEND_CPU: return &dsq_cpu_backend;
    case DSQ_BACKEND_CUDA: {
#ifdef DSQ_HAVE_CUDA
        /* both checked, so the message lists everything that is missing */
        const char *lib = dsq_cublaslt_problem(), *dev = dsq_cuda_device_problem();
        if (!lib && !dev)
            return &dsq_cuda_backend;
        *st = dsq_fail(DSQ_ERR_NO_DEVICE, "backend CUDA requested but unavailable: %s%s%s%s%s",
                       dev ? dev : "", dev && lib ? "; " : "", lib ? "cuBLASLt could not be loaded (" : "",
                       lib ? lib : "", lib ? ")" : "");
#else
        *st = dsq_fail(DSQ_ERR_NO_DEVICE, "backend CUDA requested but this libdsqwen was built without CUDA");
#endif
        return NULL;
    }
    case DSQ_BACKEND_AUTO: {
#ifdef DSQ_HAVE_CUDA
        /* device first: a machine without a GPU never pays for opening cuBLASLt */
        const char *why = dsq_cuda_device_problem();
        if (!why)
            why = dsq_cublaslt_problem();
        if (!why)
            return &dsq_cuda_backend;
        dsq_log(DSQ_LOG_INFO, "backend AUTO: using the CPU, CUDA is unavailable: %s", why);
#endif
        return &dsq_cpu_backend;
    }
    default:
        *st = dsq_fail(DSQ_ERR_INVALID_ARG, "params.backend = %d is not a dsq_backend value", (int)want);
        return NULL;
    }
}

#ifdef DSQ_HAVE_CUDA
int dsq_cuda_available(void)
{
    return dsq_cuda_device_problem() == NULL && dsq_cublaslt_problem() == NULL;
}
#endif

int dsq_backend_available(dsq_backend backend)
{
    switch (backend) {
    case DSQ_BACKEND_AUTO:
    case DSQ_BACKEND_CPU: return 1;
    case DSQ_BACKEND_CUDA:
#ifdef DSQ_HAVE_CUDA
        return dsq_cuda_available();
#else
        return 0;
#endif
    }
    return 0;
}

dsq_status dsq_tp_unique_id(void *id, size_t size)
{
    dsq_clear_error();
    if (!id || size < DSQ_TP_ID_BYTES)
        return dsq_fail(DSQ_ERR_INVALID_ARG, "dsq_tp_unique_id: id must hold %d bytes (got %zu%s)",
                        DSQ_TP_ID_BYTES, size, id ? "" : ", NULL");
#ifdef DSQ_HAVE_CUDA
    return dsq_comm_unique_id((uint8_t *)id);
#else
    return dsq_fail(DSQ_ERR_UNSUPPORTED, "dsq_tp_unique_id: libdsqwen was built without CUDA and NCCL");
#endif
}

const char *dsq_build_features(void)
{
#ifdef DSQ_HAVE_CUDA
    return "cpu cuda";
#else
    return "cpu";
#endif
}

dsq_status dsq_load_progress(dsq_model *m, int64_t done, int64_t total)
{
    if (!m->progress)
        return DSQ_OK;
    double f = total > 0 ? (double)done / (double)total : 1.0;
    f = f < 0.0 ? 0.0 : f > 1.0 ? 1.0 : f;
    float frac = (float)(m->progress_lo + (m->progress_hi - m->progress_lo) * f);
    if (m->progress(frac, m->progress_user) != 0)
        return dsq_fail(DSQ_ERR_CANCELLED, "model load cancelled by the progress callback at %.0f%%",
                        100.0 * frac);
    return DSQ_OK;
}

/* Progress at a fixed point between phases; the following phase (a
 * backend's upload) reports into [f, hi]. */
static dsq_status progress_at(dsq_model *m, float f, float hi)
{
    m->progress_lo = m->progress_hi = f;
    dsq_status st = dsq_load_progress(m, 1, 1);
    m->progress_hi = hi;
    return st;
}

static int ends_with(const char *s, const char *suffix)
{
    size_t ls = strlen(s), lx = strlen(suffix);
    return ls >= lx && strcmp(s + ls - lx, suffix) == 0;
}

dsq_status dsq_model_load(const char *path, const dsq_model_params *params, dsq_model **out)
{
    dsq_clear_error();
    if (out)
        *out = NULL;
    if (!path || !out)
        return dsq_fail(DSQ_ERR_INVALID_ARG, "dsq_model_load: path and out must not be NULL");
    dsq_model_params p = model_defaults();
    dsq_status st = dsq_copy_params(&p, sizeof p, params, MODEL_PARAMS_V1, "dsq_model_params");
    if (st != DSQ_OK)
        return st;
    if (p.n_threads < 0 || p.n_threads > DSQ_MAX_THREADS)
        return dsq_fail(DSQ_ERR_INVALID_ARG, "dsq_model_params.n_threads must be in 0..%d (got %d)",
                        DSQ_MAX_THREADS, p.n_threads);
    if (p.quantize < DSQ_QUANTIZE_NONE || p.quantize > DSQ_QUANTIZE_Q4 || p.quantize_head < 0 ||
        p.quantize_head > 1)
        return dsq_fail(DSQ_ERR_INVALID_ARG, "dsq_model_params.quantize %d / quantize_head %d: unknown value",
                        p.quantize, p.quantize_head);
    if (p.tp_world < 0 || (p.tp_world >= 1 && !p.tp_devices && (p.tp_rank < 0 || p.tp_rank >= p.tp_world)) ||
        !(p.tp_timeout_s >= 0.0f))
        return dsq_fail(DSQ_ERR_INVALID_ARG, "dsq_model_params: tp_world %d, tp_rank %d, tp_timeout_s %g",
                        p.tp_world, p.tp_rank, (double)p.tp_timeout_s);
    const dsq_backend_ops *ops = pick_backend(p.backend, &st);
    if (!ops)
        return st;
    /* The CPU backend computes from the weights in place; the CUDA backend
     * copies them to the device (and checks them there) anyway. */
    const int on_cpu = ops->kind == DSQ_BACKEND_CPU;

    dsq_model *m = calloc(1, sizeof *m);
    if (!m)
        return dsq_fail(DSQ_ERR_OUT_OF_MEMORY, "no memory for the model handle");
    m->progress = p.progress;
    m->progress_user = p.progress_user;
    /* Fractions of the whole load: parsing and checking the files (the
     * tokenizer is the slow part on the host) up to 0.1, then the backend's
     * weight placement (CUDA: the upload) to 1. */
    char *cfg_path = NULL;
    if ((st = progress_at(m, 0.0f, 0.0f)) != DSQ_OK)
        goto fail;
    if (dsq_is_dir(path)) {
        m->dir = strdup(path);
    } else if (ends_with(path, ".safetensors")) {
        const char *slash = strrchr(path, '/');
        m->dir = slash ? strndup(path, (size_t)(slash - path)) : strdup(".");
        if (m->dir && m->dir[0] == '\0') {
            free(m->dir);
            m->dir = strdup("/");
        }
    } else if (dsq_path_exists(path)) {
        st = dsq_fail(DSQ_ERR_INVALID_ARG,
                      "'%s' is neither a model directory nor a .safetensors file", path);
        goto fail;
    } else {
        st = dsq_fail(DSQ_ERR_IO, "model path '%s' does not exist", path);
        goto fail;
    }
    if (!m->dir || !(cfg_path = dsq_path_join(m->dir, "config.json"))) {
        st = dsq_fail(DSQ_ERR_OUT_OF_MEMORY, "no memory for paths");
        goto fail;
    }
    st = dsq_config_load(cfg_path, &m->cfg);
    if (st == DSQ_OK)
        st = progress_at(m, 0.01f, 0.01f);
    if (st != DSQ_OK)
        goto fail;
    st = dsq_gen_config_load(m->dir, &m->gen); /* optional file */
    if (st != DSQ_OK)
        goto fail;
    st = dsq_is_dir(path) ? dsq_st_open_dir(path, &m->st) : dsq_st_open_file(path, &m->st);
    if (st == DSQ_OK)
        st = progress_at(m, 0.03f, 0.03f);
    if (st != DSQ_OK)
        goto fail;
    st = dsq_weights_bind(m->st, &m->cfg, on_cpu && p.copy_weights, &m->w);
    if (st == DSQ_OK)
        st = progress_at(m, 0.04f, 0.04f);
    if (st != DSQ_OK)
        goto fail;
    if (on_cpu && p.copy_weights)
        dsq_st_unmap(m->st); /* the files may change from here on */
    if (on_cpu && !p.skip_finite_check) {
        st = dsq_weights_check_finite(&m->w, &m->cfg, p.n_threads);
        if (st != DSQ_OK)
            goto fail;
    }
    if (p.quantize != DSQ_QUANTIZE_NONE) {
        /* quantize at load (lib/weights_quant.c), on the host for every backend */
        /* a dsqwen checkpoint with only its head quantized (`dsqwen quantize
         * --head` of a bf16 one) still has dense layers to quantize */
        if (m->cfg.quant.method != DSQ_QM_NONE && dsq_weights_layers_quantized(&m->w, m->cfg.n_layers)) {
            st = dsq_fail(DSQ_ERR_UNSUPPORTED,
                          "dsq_model_params.quantize: the checkpoint is already quantized "
                          "(quantization_config quant_method \"%s\"); load it with quantize = "
                          "DSQ_QUANTIZE_NONE",
                          dsq_quant_method_name(m->cfg.quant.method));
            goto fail;
        }
        st = dsq_weights_quantize(&m->w, &m->cfg, p.quantize, p.quantize_head, p.n_threads);
        if (st != DSQ_OK)
            goto fail;
    } else if (p.quantize_head) {
        /* the head alone, of any checkpoint (AWQ / GPTQ keep a 16-bit lm_head) */
        st = dsq_weights_quantize(&m->w, &m->cfg, DSQ_QUANTIZE_NONE, 1, p.n_threads);
        if (st != DSQ_OK)
            goto fail;
    }
    if (p.tp_world > 1 &&
        (p.quantize != DSQ_QUANTIZE_NONE || p.quantize_head || m->cfg.quant.method != DSQ_QM_NONE)) {
        /* the rank slicing (lib/tp_weights.c) reads bf16/f16/f32 tensors */
        st = dsq_fail(DSQ_ERR_UNSUPPORTED,
                      "tensor parallelism (tp_world %d) of quantized weights is not supported yet "
                      "(%s); load the model unquantized",
                      p.tp_world,
                      m->cfg.quant.method != DSQ_QM_NONE ? "the checkpoint is quantized"
                      : p.quantize != DSQ_QUANTIZE_NONE  ? "dsq_model_params.quantize"
                                                         : "dsq_model_params.quantize_head");
        goto fail;
    }
    /* every file is checked before the (slow) upload to a device */
    if (p.load_tokenizer) {
        char *tok_path = dsq_path_join(m->dir, "tokenizer.json");
        if (!tok_path) {
            st = dsq_fail(DSQ_ERR_OUT_OF_MEMORY, "no memory for paths");
            goto fail;
        }
        if (dsq_path_exists(tok_path)) /* not a regular file: refused, not skipped */
            st = dsq_tokenizer_load(tok_path, &m->tokenizer);
        free(tok_path);
        if (st != DSQ_OK)
            goto fail;
    }
    if ((st = progress_at(m, 0.1f, 1.0f)) != DSQ_OK)
        goto fail;
    st = ops->model_load(m, &p);
    if (st != DSQ_OK)
        goto fail;
    m->ops = ops; /* from here on dsq_model_free releases backend state */
    if ((st = progress_at(m, 1.0f, 1.0f)) != DSQ_OK)
        goto fail;
    m->progress = NULL; /* the callback belongs to this call only */
    free(cfg_path);
    *out = m;
    return DSQ_OK;

fail:
    free(cfg_path);
    dsq_model_free(m);
    return st;
}

void dsq_model_free(dsq_model *m)
{
    if (!m)
        return;
    if (m->ops && m->ops->model_free)
        m->ops->model_free(m);
    dsq_tokenizer_free(m->tokenizer);
    dsq_weights_release(&m->w);
    dsq_st_close(m->st);
    free(m->dir);
    free(m);
}

const dsq_tokenizer *dsq_model_tokenizer(const dsq_model *m) { return m ? m->tokenizer : NULL; }

dsq_status dsq_model_get_info(const dsq_model *m, dsq_model_info *info)
{
    dsq_clear_error();
    if (!m || !info)
        return dsq_fail(DSQ_ERR_INVALID_ARG, "dsq_model_get_info: NULL argument");
    uint32_t want = info->struct_size;
    if (want < MODEL_INFO_V1 || want > sizeof(dsq_model_info))
        return dsq_fail(DSQ_ERR_STRUCT_SIZE, "dsq_model_info.struct_size is %u; expected %zu",
                        want, sizeof(dsq_model_info));
    dsq_model_info v;
    memset(&v, 0, sizeof v);
    v.struct_size = want;
    v.backend = m->ops->kind;
    v.n_vocab = m->cfg.n_vocab;
    v.n_embd = m->cfg.n_embd;
    v.n_layers = m->cfg.n_layers;
    v.n_heads = m->cfg.n_heads;
    v.n_kv_heads = m->cfg.n_kv_heads;
    v.head_dim = m->cfg.head_dim;
    v.n_ff = m->cfg.n_ff;
    v.max_context = m->cfg.max_pos;
    v.tie_embeddings = m->cfg.tie_embeddings;
    v.rope_theta = m->cfg.rope_theta;
    v.rms_norm_eps = m->cfg.rms_eps;
    v.n_params = m->w.n_params;
    v.weight_bytes = m->w.n_bytes;
    v.device_bytes = m->device_bytes;
    v.bos_token = m->cfg.bos_token;
    v.eos_token = m->cfg.eos_token;
    memcpy(info, &v, want);
    return DSQ_OK;
}

/* ---- context --------------------------------------------------------------- */

static dsq_ctx_params ctx_defaults(void)
{
    dsq_ctx_params p;
    memset(&p, 0, sizeof p);
    p.struct_size = sizeof p;
    p.max_seqs = 1;
    p.max_context = 0; /* resolved to min(4096, model max) */
    p.max_batch_tokens = 512;
    p.kv_layout = DSQ_KV_STATIC;
    p.kv_dtype = DSQ_KV_F16;
    p.kv_block_size = 16;
    p.kv_pool_tokens = 0;
    p.kv_budget_bytes = 0;
    p.n_threads = 0;
    return p;
}

dsq_status dsq_ctx_params_init(dsq_ctx_params *params, uint32_t struct_size)
{
    dsq_ctx_params d = ctx_defaults();
    return dsq_params_init(params, struct_size, &d, sizeof d, CTX_PARAMS_V1, "dsq_ctx_params");
}

static dsq_status ctx_status(const dsq_ctx *c, dsq_status st)
{
    if (st != DSQ_OK && c)
        strncpy(((dsq_ctx *)c)->last_error, dsq_last_error_message(), sizeof c->last_error - 1);
    return st;
}

const char *dsq_ctx_last_error(const dsq_ctx *c) { return c ? c->last_error : ""; }


/* Free the host-side bookkeeping of a context (backend state already gone). */
static void ctx_release_host(dsq_ctx *c)
{
    dsq_kv_pages_destroy(&c->pages);
    dsq_hist_destroy(&c->hist);
    dsq_sample_ws_free(c->sample_ws);
    free(c->step_logits);
    free(c->step_rows);
    free(c->step_res);
    free(c->seq_len);
    free(c->b_tokens);
    free(c->b_pos);
    free(c->b_tok_seq);
    free(c->b_logit_rows);
    free(c->b_seq_ids);
    free(c->b_seq_start);
    free(c->b_seq_pos0);
    free(c->b_new_len);
    free(c->b_cur_len);
    free(c->b_cow);
    free(c->b_copy);
    free(c->b_entry);
    free(c);
}

dsq_status dsq_ctx_new(dsq_model *m, const dsq_ctx_params *params, dsq_ctx **out)
{
    dsq_clear_error();
    if (out)
        *out = NULL;
    if (!m || !out)
        return dsq_fail(DSQ_ERR_INVALID_ARG, "dsq_ctx_new: model and out must not be NULL");
    dsq_ctx_params p = ctx_defaults();
    dsq_status st = dsq_copy_params(&p, sizeof p, params, CTX_PARAMS_V1, "dsq_ctx_params");
    if (st != DSQ_OK)
        return st;
    if (p.max_context == 0)
        p.max_context = m->cfg.max_pos < 4096 ? m->cfg.max_pos : 4096;
    if (p.max_seqs < 1 || p.max_seqs > DSQ_MAX_SEQS)
        return dsq_fail(DSQ_ERR_INVALID_ARG, "dsq_ctx_params.max_seqs must be in 1..%d (got %d)",
                        DSQ_MAX_SEQS, p.max_seqs);
    if (p.max_context < 1 || p.max_context > m->cfg.max_pos)
        return dsq_fail(DSQ_ERR_INVALID_ARG,
                        "dsq_ctx_params.max_context must be in 1..%d (the model's "
                        "max_position_embeddings); got %d", m->cfg.max_pos, p.max_context);
    if (p.max_batch_tokens < 1)
        return dsq_fail(DSQ_ERR_INVALID_ARG, "dsq_ctx_params.max_batch_tokens must be >= 1");
    if (p.kv_layout != DSQ_KV_STATIC && p.kv_layout != DSQ_KV_PAGED)
        return dsq_fail(DSQ_ERR_INVALID_ARG, "dsq_ctx_params.kv_layout = %d is not a dsq_kv_layout", p.kv_layout);
    if (p.kv_dtype != DSQ_KV_F16 && p.kv_dtype != DSQ_KV_INT8 && p.kv_dtype != DSQ_KV_F32)
        return dsq_fail(DSQ_ERR_INVALID_ARG, "dsq_ctx_params.kv_dtype = %d is not a dsq_kv_dtype", p.kv_dtype);
    if (p.n_threads < 0 || p.n_threads > DSQ_MAX_THREADS)
        return dsq_fail(DSQ_ERR_INVALID_ARG, "dsq_ctx_params.n_threads must be in 0..%d (got %d)",
                        DSQ_MAX_THREADS, p.n_threads);
    if (p.n_threads == 0)
        p.n_threads = dsq_n_cores();
    if (p.kv_layout == DSQ_KV_PAGED) {
        if (p.kv_block_size < 1 || p.kv_block_size > 4096)
            return dsq_fail(DSQ_ERR_INVALID_ARG, "dsq_ctx_params.kv_block_size must be in 1..4096");
        if (p.kv_pool_tokens < 0 || p.kv_budget_bytes < 0)
            return dsq_fail(DSQ_ERR_INVALID_ARG, "KV pool size must not be negative");
    } else {
        p.kv_block_size = 0;
    }

    if (p.kv_layout == DSQ_KV_STATIC) {
        /* checked before any size is computed from it (paged: see below) */
        /* the widest storage (F32) bounds every dtype */
        int64_t bpt = dsq_kv_bytes_per_token(&m->cfg, DSQ_KV_F32);
        if ((int64_t)p.max_seqs * p.max_context > DSQ_MAX_KV_BYTES / bpt)
            return dsq_fail(DSQ_ERR_INVALID_ARG,
                            "static KV cache of %d sequences x %d tokens exceeds %lld bytes",
                            p.max_seqs, p.max_context, (long long)DSQ_MAX_KV_BYTES);
    }

    dsq_ctx *c = calloc(1, sizeof *c);
    if (!c)
        return dsq_fail(DSQ_ERR_OUT_OF_MEMORY, "no memory for the context");
    c->model = m;
    c->p = p;
    const dsq_config *cfg = &m->cfg;
    /* Storage bytes per token of the dtype asked (every backend stores it
     * as asked or refuses it in ctx_init). */
    c->kv_bytes_per_token = dsq_kv_bytes_per_token(cfg, p.kv_dtype);
    int32_t nb = p.max_batch_tokens;
    size_t nseq_alloc = (size_t)nb + 1; /* a batch holds at most one sequence per token */
    c->seq_len = calloc((size_t)p.max_seqs, sizeof(int32_t));
    c->b_tokens = malloc((size_t)nb * sizeof(int32_t));
    c->b_pos = malloc((size_t)nb * sizeof(int32_t));
    c->b_tok_seq = malloc((size_t)nb * sizeof(int32_t));
    c->b_logit_rows = malloc((size_t)nb * sizeof(int32_t));
    c->b_seq_ids = malloc(nseq_alloc * sizeof(int32_t));
    c->b_seq_start = malloc(nseq_alloc * sizeof(int32_t));
    c->b_seq_pos0 = malloc(nseq_alloc * sizeof(int32_t));
    c->b_new_len = malloc(nseq_alloc * sizeof(int32_t));
    c->b_cur_len = malloc(nseq_alloc * sizeof(int32_t));
    c->b_cow = malloc(nseq_alloc * sizeof(dsq_kv_cow));
    c->b_copy = malloc(nseq_alloc * sizeof(dsq_kv_copy));
    c->b_entry = malloc(nseq_alloc * sizeof(dsq_batch_entry));
    if (!c->seq_len || !c->b_tokens || !c->b_pos || !c->b_tok_seq || !c->b_logit_rows ||
        !c->b_seq_ids || !c->b_seq_start || !c->b_seq_pos0 || !c->b_new_len || !c->b_cur_len ||
        !c->b_cow || !c->b_copy || !c->b_entry) {
        st = dsq_fail(DSQ_ERR_OUT_OF_MEMORY, "no memory for context bookkeeping");
        goto fail;
    }
    if ((st = dsq_hist_init(&c->hist, p.max_seqs)) != DSQ_OK)
        goto fail;
    if (p.kv_layout == DSQ_KV_PAGED) {
        int64_t tokens = p.kv_pool_tokens;
        if (tokens == 0 && p.kv_budget_bytes > 0)
            tokens = p.kv_budget_bytes / c->kv_bytes_per_token;
        int64_t blocks = tokens / p.kv_block_size;
        /* default only when neither size is given: a budget too small for
         * one token must be refused, not silently replaced by the default */
        if (p.kv_pool_tokens == 0 && p.kv_budget_bytes == 0)
            blocks = (int64_t)p.max_seqs * ((p.max_context + p.kv_block_size - 1) / p.kv_block_size);
        if (blocks < 1) {
            if (p.kv_pool_tokens == 0)
                st = dsq_fail(DSQ_ERR_INVALID_ARG,
                              "kv_budget_bytes = %lld holds no KV block of %d tokens (%lld bytes per token)",
                              (long long)p.kv_budget_bytes, p.kv_block_size,
                              (long long)c->kv_bytes_per_token);
            else
                st = dsq_fail(DSQ_ERR_INVALID_ARG,
                              "KV pool of %lld tokens holds no block of %d tokens",
                              (long long)tokens, p.kv_block_size);
            goto fail;
        }
        /* refuse sizes no machine holds before writing the block tables */
        if (blocks > INT32_MAX || blocks * p.kv_block_size > DSQ_MAX_KV_BYTES / c->kv_bytes_per_token) {
            st = dsq_fail(DSQ_ERR_INVALID_ARG, "KV pool of %lld blocks x %d tokens x %lld bytes exceeds %lld bytes",
                          (long long)blocks, p.kv_block_size, (long long)c->kv_bytes_per_token,
                          (long long)DSQ_MAX_KV_BYTES);
            goto fail;
        }
        c->p.kv_pool_tokens = blocks * p.kv_block_size;
        st = dsq_kv_pages_init(&c->pages, p.max_seqs, p.max_context, p.kv_block_size, (int32_t)blocks);
        if (st != DSQ_OK)
            goto fail;
    }
    st = m->ops->ctx_init(c);
    if (st != DSQ_OK)
        goto fail;
    *out = c;
    return DSQ_OK;

fail:
    ctx_release_host(c);
    return st;
}

void dsq_ctx_free(dsq_ctx *c)
{
    if (!c)
        return;
    c->model->ops->ctx_free(c);
    ctx_release_host(c);
}

dsq_status dsq_ctx_get_info(const dsq_ctx *c, dsq_ctx_info *info)
{
    dsq_clear_error();
    if (!c || !info)
        return ctx_status(c, dsq_fail(DSQ_ERR_INVALID_ARG, "dsq_ctx_get_info: NULL argument"));
    uint32_t want = info->struct_size;
    if (want < CTX_INFO_V1 || want > sizeof(dsq_ctx_info))
        return ctx_status(c, dsq_fail(DSQ_ERR_STRUCT_SIZE, "dsq_ctx_info.struct_size is %u; expected %zu",
                                      want, sizeof(dsq_ctx_info)));
    dsq_ctx_info v;
    memset(&v, 0, sizeof v);
    v.struct_size = want;
    v.backend = c->model->ops->kind;
    v.kv_layout = c->p.kv_layout;
    v.kv_dtype = c->p.kv_dtype;
    v.max_seqs = c->p.max_seqs;
    v.max_context = c->p.max_context;
    v.max_batch_tokens = c->p.max_batch_tokens;
    v.kv_block_size = c->p.kv_block_size;
    v.kv_bytes_per_token = c->kv_bytes_per_token;
    if (c->p.kv_layout == DSQ_KV_PAGED) {
        v.kv_capacity_tokens = (int64_t)c->pages.n_blocks * c->pages.block_size;
        v.kv_free_tokens = (int64_t)c->pages.n_free * c->pages.block_size;
    } else {
        v.kv_capacity_tokens = (int64_t)c->p.max_seqs * c->p.max_context;
        int64_t used = 0;
        for (int32_t i = 0; i < c->p.max_seqs; i++)
            used += c->seq_len[i];
        v.kv_free_tokens = v.kv_capacity_tokens - used;
    }
    v.kv_bytes = c->kv_bytes;
    v.scratch_bytes = c->scratch_bytes;
    v.n_threads = c->model->ops->kind == DSQ_BACKEND_CPU ? c->p.n_threads : 0;
    for (int32_t i = 0; i < c->p.max_seqs; i++)
        v.n_active_seqs += c->seq_len[i] > 0;
    memcpy(info, &v, want);
    return DSQ_OK;
}

dsq_status dsq_ctx_synchronize(dsq_ctx *c)
{
    dsq_clear_error();
    if (!c)
        return dsq_fail(DSQ_ERR_INVALID_ARG, "dsq_ctx_synchronize: NULL context");
    if (!c->model->ops->synchronize)
        return DSQ_OK;
    return ctx_status(c, c->model->ops->synchronize(c));
}

dsq_status dsq_ctx_cuda_stream(const dsq_ctx *c, void **stream)
{
    dsq_clear_error();
    if (stream)
        *stream = NULL;
    if (!c || !stream)
        return ctx_status(c, dsq_fail(DSQ_ERR_INVALID_ARG, "dsq_ctx_cuda_stream: NULL argument"));
    if (!c->model->ops->stream)
        return ctx_status(c, dsq_fail(DSQ_ERR_UNSUPPORTED, "dsq_ctx_cuda_stream: the context is on the %s backend,"
                                                           " which has no CUDA stream", c->model->ops->name));
    *stream = c->model->ops->stream(c);
    return DSQ_OK;
}

/* ---- inference ---------------------------------------------------------------- */

static dsq_status check_tokens(const dsq_ctx *c, const int32_t *tokens, int32_t n)
{
    int32_t nv = c->model->cfg.n_vocab;
    for (int32_t i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= nv)
            return dsq_fail(DSQ_ERR_TOKEN, "token[%d] = %d is outside 0..%d", i, tokens[i], nv - 1);
    return DSQ_OK;
}

static dsq_status check_seq(const dsq_ctx *c, int32_t seq)
{
    if (seq < 0 || seq >= c->p.max_seqs)
        return dsq_fail(DSQ_ERR_SEQ, "sequence id %d is outside 0..%d (max_seqs)", seq, c->p.max_seqs - 1);
    return DSQ_OK;
}

/* Undo reserve_batch for sequences that stay at keep_len[i] tokens. */
static void release_batch(dsq_ctx *c, int32_t n, const int32_t *seqs, const int32_t *keep_len, int32_t n_cow)
{
    if (c->p.kv_layout != DSQ_KV_PAGED)
        return;
    dsq_kv_pages_undo_cow(&c->pages, c->b_cow, n_cow);
    for (int32_t i = 0; i < n; i++)
        dsq_kv_pages_trim(&c->pages, seqs[i], keep_len[i]);
}

/* After a failed pass: the pass may have written its tokens into the
 * backend's device copy of the histories (CUDA: a ring of the last
 * DSQ_PENALTY_MAX_N positions, over slots still inside the penalty window
 * once a sequence is longer than that); refresh it from the host copy. */
static void hist_resync(dsq_ctx *c, int32_t n, const int32_t *seqs)
{
    if (c->model->ops->hist_sync)
        for (int32_t i = 0; i < n; i++)
            c->model->ops->hist_sync(c, seqs[i]);
}

/* KV room for n distinct sequences growing from cur_len[i] to new_len[i]
 * tokens, including private copies of shared partial blocks they are about
 * to write (copied here, before the forward pass).  All-or-nothing. */
static dsq_status reserve_batch(dsq_ctx *c, int32_t n, const int32_t *seqs, const int32_t *cur_len,
                                const int32_t *new_len, int32_t *n_cow)
{
    *n_cow = 0;
    if (c->p.kv_layout != DSQ_KV_PAGED)
        return DSQ_OK;
    dsq_status st = dsq_kv_pages_reserve(&c->pages, n, seqs, cur_len, new_len, c->b_cow, n_cow);
    if (st != DSQ_OK || *n_cow == 0)
        return st;
    const int64_t bs = c->pages.block_size;
    for (int32_t j = 0; j < *n_cow; j++) {
        c->b_copy[j].dst_row = c->b_cow[j].new_blk * bs;
        c->b_copy[j].src_row = c->b_cow[j].old_blk * bs;
        c->b_copy[j].n_rows = c->b_cow[j].n_rows;
    }
    st = c->model->ops->copy_kv_rows(c, *n_cow, c->b_copy);
    if (st != DSQ_OK) {
        release_batch(c, n, seqs, cur_len, *n_cow);
        *n_cow = 0;
    }
    return st;
}

dsq_status dsq_prefill(dsq_ctx *c, int32_t seq, const int32_t *tokens, int32_t n_tokens,
                       uint32_t flags, float *logits)
{
    dsq_clear_error();
    if (!c)
        return dsq_fail(DSQ_ERR_INVALID_ARG, "dsq_prefill: ctx is NULL");
    if (!tokens || n_tokens <= 0)
        return ctx_status(c, dsq_fail(DSQ_ERR_INVALID_ARG, "dsq_prefill: need tokens != NULL and n_tokens > 0 (got %d)", n_tokens));
    if (flags & ~DSQ_LOGITS_ALL)
        return ctx_status(c, dsq_fail(DSQ_ERR_INVALID_ARG, "dsq_prefill: unknown flags 0x%x", flags));
    dsq_status st = check_seq(c, seq);
    if (st == DSQ_OK)
        st = check_tokens(c, tokens, n_tokens);
    if (st != DSQ_OK)
        return ctx_status(c, st);
    int32_t old_len = c->seq_len[seq];
    if ((int64_t)old_len + n_tokens > c->p.max_context)
        return ctx_status(c, dsq_fail(DSQ_ERR_CONTEXT_FULL,
                                      "sequence %d holds %d tokens; %d more exceed max_context %d",
                                      seq, old_len, n_tokens, c->p.max_context));
    /* the token history grows first: its failure changes nothing */
    if ((st = dsq_hist_reserve(&c->hist, seq, old_len + n_tokens)) != DSQ_OK)
        return ctx_status(c, st);
    int32_t new_len = old_len + n_tokens, n_cow = 0;
    st = reserve_batch(c, 1, &seq, &old_len, &new_len, &n_cow);
    if (st != DSQ_OK)
        return ctx_status(c, st);
    const int32_t nv = c->model->cfg.n_vocab;
    const int32_t chunk_max = c->p.max_batch_tokens;
    int all = (flags & DSQ_LOGITS_ALL) != 0;
    for (int32_t done = 0; done < n_tokens;) {
        int32_t n = n_tokens - done < chunk_max ? n_tokens - done : chunk_max;
        int last_chunk = done + n == n_tokens;
        for (int32_t i = 0; i < n; i++) {
            c->b_tokens[i] = tokens[done + i];
            c->b_pos[i] = old_len + done + i;
            c->b_tok_seq[i] = 0;
        }
        c->b_seq_ids[0] = seq;
        c->b_seq_start[0] = 0;
        c->b_seq_start[1] = n;
        c->b_seq_pos0[0] = old_len + done;
        dsq_batch b = {
            .n_tokens = n, .n_seqs = 1, .tokens = c->b_tokens, .pos = c->b_pos,
            .tok_seq = c->b_tok_seq, .seq_ids = c->b_seq_ids, .seq_start = c->b_seq_start,
            .seq_pos0 = c->b_seq_pos0, .n_logits = 0, .logit_rows = c->b_logit_rows,
        };
        float *out = NULL;
        if (logits && all) {
            for (int32_t i = 0; i < n; i++)
                c->b_logit_rows[i] = i;
            b.n_logits = n;
            out = logits + (size_t)done * nv;
        } else if (logits && last_chunk) {
            c->b_logit_rows[0] = n - 1;
            b.n_logits = 1;
            out = logits;
        }
        st = c->model->ops->forward(c, &b, out);
        if (st != DSQ_OK) {
            release_batch(c, 1, &seq, &old_len, n_cow);
            hist_resync(c, 1, &seq);
            return ctx_status(c, st);
        }
        done += n;
    }
    c->seq_len[seq] = old_len + n_tokens;
    dsq_hist_append(&c->hist, seq, tokens, n_tokens);
    return DSQ_OK;
}

dsq_status dsq_decode_step(dsq_ctx *c, int32_t n_seqs, const int32_t *seqs, const int32_t *tokens,
                           float *logits)
{
    dsq_clear_error();
    if (!c)
        return dsq_fail(DSQ_ERR_INVALID_ARG, "dsq_decode_step: ctx is NULL");
    if (!seqs || !tokens || n_seqs <= 0)
        return ctx_status(c, dsq_fail(DSQ_ERR_INVALID_ARG, "dsq_decode_step: need seqs, tokens != NULL and n_seqs > 0 (got %d)", n_seqs));
    if (n_seqs > c->p.max_batch_tokens || n_seqs > c->p.max_seqs)
        return ctx_status(c, dsq_fail(DSQ_ERR_BATCH, "dsq_decode_step: %d sequences exceed max_batch_tokens %d / max_seqs %d",
                                      n_seqs, c->p.max_batch_tokens, c->p.max_seqs));
    dsq_status st = check_tokens(c, tokens, n_seqs);
    if (st != DSQ_OK)
        return ctx_status(c, st);
    /* b_new_len doubles as a "seen" mark per sequence id while checking */
    for (int32_t i = 0; i < n_seqs; i++) {
        int32_t s = seqs[i];
        if ((st = check_seq(c, s)) != DSQ_OK)
            return ctx_status(c, st);
        if (c->seq_len[s] == 0)
            return ctx_status(c, dsq_fail(DSQ_ERR_SEQ, "sequence %d holds no tokens (never prefilled or removed); start it with dsq_prefill", s));
        if (c->seq_len[s] + 1 > c->p.max_context)
            return ctx_status(c, dsq_fail(DSQ_ERR_CONTEXT_FULL, "sequence %d is full (max_context %d)", s, c->p.max_context));
        for (int32_t j = 0; j < i; j++)
            if (seqs[j] == s)
                return ctx_status(c, dsq_fail(DSQ_ERR_INVALID_ARG, "sequence %d appears twice in one decode step", s));
    }
    for (int32_t i = 0; i < n_seqs; i++) {
        c->b_tokens[i] = tokens[i];
        c->b_pos[i] = c->seq_len[seqs[i]];
        c->b_tok_seq[i] = i;
        c->b_seq_ids[i] = seqs[i];
        c->b_seq_start[i] = i;
        c->b_seq_pos0[i] = c->seq_len[seqs[i]];
        c->b_new_len[i] = c->seq_len[seqs[i]] + 1;
        c->b_cur_len[i] = c->seq_len[seqs[i]];
        c->b_logit_rows[i] = i;
    }
    c->b_seq_start[n_seqs] = n_seqs;
    for (int32_t i = 0; i < n_seqs; i++)
        if ((st = dsq_hist_reserve(&c->hist, seqs[i], c->b_new_len[i])) != DSQ_OK)
            return ctx_status(c, st);
    int32_t n_cow = 0;
    st = reserve_batch(c, n_seqs, seqs, c->b_cur_len, c->b_new_len, &n_cow);
    if (st != DSQ_OK)
        return ctx_status(c, st);
    dsq_batch b = {
        .n_tokens = n_seqs, .n_seqs = n_seqs, .tokens = c->b_tokens, .pos = c->b_pos,
        .tok_seq = c->b_tok_seq, .seq_ids = c->b_seq_ids, .seq_start = c->b_seq_start,
        .seq_pos0 = c->b_seq_pos0, .n_logits = logits ? n_seqs : 0, .logit_rows = c->b_logit_rows,
    };
    st = c->model->ops->forward(c, &b, logits);
    if (st != DSQ_OK) {
        release_batch(c, n_seqs, seqs, c->b_cur_len, n_cow);
        hist_resync(c, n_seqs, seqs);
        return ctx_status(c, st);
    }
    for (int32_t i = 0; i < n_seqs; i++) {
        c->seq_len[seqs[i]]++;
        dsq_hist_append(&c->hist, seqs[i], &tokens[i], 1);
    }
    return DSQ_OK;
}

dsq_status dsq_seq_remove(dsq_ctx *c, int32_t seq)
{
    dsq_clear_error();
    if (!c)
        return dsq_fail(DSQ_ERR_INVALID_ARG, "dsq_seq_remove: ctx is NULL");
    dsq_status st = check_seq(c, seq);
    if (st != DSQ_OK)
        return ctx_status(c, st);
    c->seq_len[seq] = 0;
    dsq_seq_history_clear(c, seq);
    if (c->p.kv_layout == DSQ_KV_PAGED)
        dsq_kv_pages_trim(&c->pages, seq, 0);
    if (c->model->ops->seq_removed)
        c->model->ops->seq_removed(c, seq);
    return DSQ_OK;
}

dsq_status dsq_seq_length(const dsq_ctx *c, int32_t seq, int32_t *n_out)
{
    dsq_clear_error();
    if (!c || !n_out)
        return ctx_status(c, dsq_fail(DSQ_ERR_INVALID_ARG, "dsq_seq_length: NULL argument"));
    dsq_status st = check_seq(c, seq);
    if (st != DSQ_OK)
        return ctx_status(c, st);
    *n_out = c->seq_len[seq];
    return DSQ_OK;
}

/* ---- sequence operations ------------------------------------------------------ */

dsq_status dsq_seq_truncate(dsq_ctx *c, int32_t seq, int32_t new_len)
{
    dsq_clear_error();
    if (!c)
        return dsq_fail(DSQ_ERR_INVALID_ARG, "dsq_seq_truncate: ctx is NULL");
    dsq_status st = check_seq(c, seq);
    if (st != DSQ_OK)
        return ctx_status(c, st);
    int32_t len = c->seq_len[seq];
    if (new_len < 0 || new_len > len)
        return ctx_status(c, dsq_fail(DSQ_ERR_INVALID_ARG,
                                      "dsq_seq_truncate: sequence %d holds %d tokens; cannot keep %d "
                                      "(need 0..%d)", seq, len, new_len, len));
    if (new_len == len)
        return DSQ_OK;
    /* the token history first: it is the only step that can fail (an
     * internal inconsistency), and then nothing has changed */
    if ((st = dsq_seq_history_truncate(c, seq, new_len)) != DSQ_OK)
        return ctx_status(c, st);
    /* Rows past new_len are not cleared: attention never reads past a
     * sequence's length and the next tokens overwrite them (a paged block
     * still shared with a fork is copied before that write). */
    if (c->p.kv_layout == DSQ_KV_PAGED)
        dsq_kv_pages_trim(&c->pages, seq, new_len);
    c->seq_len[seq] = new_len;
    if (new_len == 0 && c->model->ops->seq_removed)
        c->model->ops->seq_removed(c, seq);
    return DSQ_OK;
}

dsq_status dsq_seq_fork(dsq_ctx *c, int32_t src, int32_t dst)
{
    dsq_clear_error();
    if (!c)
        return dsq_fail(DSQ_ERR_INVALID_ARG, "dsq_seq_fork: ctx is NULL");
    dsq_status st = check_seq(c, src);
    if (st == DSQ_OK)
        st = check_seq(c, dst);
    if (st != DSQ_OK)
        return ctx_status(c, st);
    if (src == dst)
        return ctx_status(c, dsq_fail(DSQ_ERR_INVALID_ARG, "dsq_seq_fork: source and destination are both %d", src));
    if (c->seq_len[src] == 0)
        return ctx_status(c, dsq_fail(DSQ_ERR_SEQ, "dsq_seq_fork: source sequence %d holds no tokens", src));
    if (c->seq_len[dst] != 0)
        return ctx_status(c, dsq_fail(DSQ_ERR_SEQ,
                                      "dsq_seq_fork: destination sequence %d is active (%d tokens); "
                                      "remove it first", dst, c->seq_len[dst]));
    const int32_t len = c->seq_len[src];
    /* room for dst's copy of the token history before anything changes, so
     * that copying it below cannot fail */
    if ((st = dsq_hist_reserve(&c->hist, dst, len)) != DSQ_OK)
        return ctx_status(c, st);
    if (c->p.kv_layout == DSQ_KV_PAGED) {
        st = dsq_kv_pages_fork(&c->pages, src, dst);
    } else {
        dsq_kv_copy cp = { .dst_row = (int64_t)dst * c->p.max_context,
                           .src_row = (int64_t)src * c->p.max_context, .n_rows = len };
        st = c->model->ops->copy_kv_rows(c, 1, &cp);
    }
    if (st != DSQ_OK)
        return ctx_status(c, st);
    if ((st = dsq_seq_history_fork(c, dst, src)) != DSQ_OK) {
        /* not reached (room reserved, ids checked); undo the KV share */
        if (c->p.kv_layout == DSQ_KV_PAGED)
            dsq_kv_pages_trim(&c->pages, dst, 0);
        return ctx_status(c, st);
    }
    c->seq_len[dst] = len;
    return DSQ_OK;
}

/* ---- batches of prompt chunks and decode tokens (internal; see internal.h) ---- */

dsq_status dsq_batch_build(dsq_ctx *c, const char *who, int32_t n, const dsq_batch_entry *e, dsq_batch *b)
{
    if (!e || n <= 0)
        return dsq_fail(DSQ_ERR_INVALID_ARG, "%s: need at least one sequence (got %d)", who, n);
    if (n > c->p.max_batch_tokens || n > c->p.max_seqs)
        return dsq_fail(DSQ_ERR_BATCH, "%s: %d sequences exceed max_batch_tokens %d / max_seqs %d", who, n,
                        c->p.max_batch_tokens, c->p.max_seqs);
    int64_t total = 0;
    dsq_status st;
    for (int32_t i = 0; i < n; i++) {
        const int32_t s = e[i].seq;
        if ((st = check_seq(c, s)) != DSQ_OK)
            return st;
        for (int32_t j = 0; j < i; j++)
            if (e[j].seq == s)
                return dsq_fail(DSQ_ERR_INVALID_ARG, "%s: sequence %d appears twice (entries %d and %d)", who, s,
                                j, i);
        if (e[i].n_tokens < 1 || !e[i].tokens)
            return dsq_fail(DSQ_ERR_INVALID_ARG, "%s: sequence %d (entry %d) brings %d tokens%s; need >= 1", who, s,
                            i, e[i].n_tokens, e[i].tokens ? "" : " (tokens NULL)");
        total += e[i].n_tokens;
    }
    if (total > c->p.max_batch_tokens)
        return dsq_fail(DSQ_ERR_BATCH, "%s: %lld tokens exceed max_batch_tokens %d (split prompts into chunks)", who,
                        (long long)total, c->p.max_batch_tokens);
    for (int32_t i = 0; i < n; i++) {
        const int32_t s = e[i].seq;
        for (int32_t k = 0; k < e[i].n_tokens; k++)
            if (e[i].tokens[k] < 0 || e[i].tokens[k] >= c->model->cfg.n_vocab)
                return dsq_fail(DSQ_ERR_TOKEN, "%s: entry %d (sequence %d): token[%d] = %d is outside 0..%d", who,
                                i, s, k, e[i].tokens[k], c->model->cfg.n_vocab - 1);
        if ((int64_t)c->seq_len[s] + e[i].n_tokens > c->p.max_context)
            return dsq_fail(DSQ_ERR_CONTEXT_FULL, "%s: sequence %d holds %d tokens; %d more exceed max_context %d",
                            who, s, c->seq_len[s], e[i].n_tokens, c->p.max_context);
    }
    int32_t t = 0, r = 0;
    for (int32_t i = 0; i < n; i++) {
        const int32_t s = e[i].seq, len = c->seq_len[s];
        c->b_seq_ids[i] = s;
        c->b_seq_start[i] = t;
        c->b_seq_pos0[i] = len;
        c->b_cur_len[i] = len;
        c->b_new_len[i] = len + e[i].n_tokens;
        for (int32_t k = 0; k < e[i].n_tokens; k++, t++) {
            c->b_tokens[t] = e[i].tokens[k];
            c->b_pos[t] = len + k;
            c->b_tok_seq[t] = i;
        }
        if (e[i].want_logits)
            c->b_logit_rows[r++] = t - 1;
    }
    c->b_seq_start[n] = t;
    *b = (dsq_batch){
        .n_tokens = t, .n_seqs = n, .tokens = c->b_tokens, .pos = c->b_pos,
        .tok_seq = c->b_tok_seq, .seq_ids = c->b_seq_ids, .seq_start = c->b_seq_start,
        .seq_pos0 = c->b_seq_pos0, .n_logits = r, .logit_rows = c->b_logit_rows,
    };
    return DSQ_OK;
}

dsq_status dsq_batch_reserve(dsq_ctx *c, int32_t n, const dsq_batch_entry *e, int32_t *n_cow)
{
    *n_cow = 0;
    dsq_status st;
    for (int32_t i = 0; i < n; i++)
        if ((st = dsq_hist_reserve(&c->hist, e[i].seq, c->b_new_len[i])) != DSQ_OK)
            return st;
    if ((st = reserve_batch(c, n, c->b_seq_ids, c->b_cur_len, c->b_new_len, n_cow)) != DSQ_OK)
        return st;
    /* before the pass: the host sampler's penalties count this step's tokens */
    for (int32_t i = 0; i < n; i++)
        dsq_hist_append(&c->hist, e[i].seq, e[i].tokens, e[i].n_tokens);
    return DSQ_OK;
}

void dsq_batch_finish(dsq_ctx *c, int32_t n, const dsq_batch_entry *e, int32_t n_cow, dsq_status pass_st)
{
    if (pass_st == DSQ_OK) {
        for (int32_t i = 0; i < n; i++)
            c->seq_len[e[i].seq] += e[i].n_tokens;
        return;
    }
    release_batch(c, n, c->b_seq_ids, c->b_cur_len, n_cow);
    for (int32_t i = 0; i < n; i++)
        c->hist.len[e[i].seq] = c->b_cur_len[i];
    hist_resync(c, n, c->b_seq_ids);
}

dsq_status dsq_ctx_forward_mixed(dsq_ctx *c, int32_t n, const int32_t *seqs,
                                 const int32_t *n_tokens_each, const int32_t *tokens,
                                 float *logits)
{
    dsq_clear_error();
    if (!c)
        return dsq_fail(DSQ_ERR_INVALID_ARG, "mixed step: ctx is NULL");
    if (!seqs || !n_tokens_each || !tokens || n <= 0)
        return ctx_status(c, dsq_fail(DSQ_ERR_INVALID_ARG,
                                      "mixed step: need seqs, n_tokens_each, tokens != NULL and n > 0 (got %d)", n));
    if (n > c->p.max_batch_tokens || n > c->p.max_seqs)
        return ctx_status(c, dsq_fail(DSQ_ERR_BATCH, "mixed step: %d sequences exceed max_batch_tokens %d / max_seqs %d",
                                      n, c->p.max_batch_tokens, c->p.max_seqs));
    /* entries into the concatenated tokens; an offset past max_batch_tokens
     * is refused by dsq_batch_build before any token is read */
    dsq_batch_entry *e = c->b_entry;
    int64_t off = 0;
    for (int32_t i = 0; i < n; i++) {
        e[i] = (dsq_batch_entry){ .seq = seqs[i], .n_tokens = n_tokens_each[i], .want_logits = logits != NULL };
        e[i].tokens = off <= c->p.max_batch_tokens ? tokens + off : tokens;
        if (n_tokens_each[i] > 0)
            off += n_tokens_each[i];
    }
    dsq_batch b;
    dsq_status st = dsq_batch_build(c, "mixed step", n, e, &b);
    if (st != DSQ_OK)
        return ctx_status(c, st);
    int32_t n_cow = 0;
    if ((st = dsq_batch_reserve(c, n, e, &n_cow)) != DSQ_OK)
        return ctx_status(c, st);
    st = c->model->ops->forward(c, &b, logits);
    dsq_batch_finish(c, n, e, n_cow, st);
    return ctx_status(c, st);
}
