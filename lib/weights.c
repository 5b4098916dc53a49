/*
 * weights.c - bind the tensors a Qwen2 config implies to views into the
 * safetensors set, checking each one's dtype and exact shape.
 *
 * Names follow Hugging Face's Qwen2ForCausalLM state dict:
 *   model.embed_tokens.weight                         [V, E]
 *   model.layers.N.input_layernorm.weight             [E]
 *   model.layers.N.self_attn.q_proj.{weight,bias}     [H*D, E], [H*D]
 *   model.layers.N.self_attn.k_proj.{weight,bias}     [K*D, E], [K*D]
 *   model.layers.N.self_attn.v_proj.{weight,bias}     [K*D, E], [K*D]
 *   model.layers.N.self_attn.o_proj.weight            [E, H*D]
 *   model.layers.N.post_attention_layernorm.weight    [E]
 *   model.layers.N.mlp.{gate,up}_proj.weight          [F, E]
 *   model.layers.N.mlp.down_proj.weight               [E, F]
 *   model.norm.weight                                 [E]
 *   lm_head.weight                                    [V, E] (absent or ignored when tied)
 * Tensors in the file that the config does not imply are left alone (older
 * checkpoints carry e.g. rotary inv_freq buffers); their count is logged.
 * Only bound tensors are ever copied (misaligned ones, or all of them when
 * the caller wants private copies), never the unused ones.
 *
 * dsq_weights_check_finite() scans every bound value once for NaN/Inf, in
 * parallel over chunks, so a corrupt checkpoint is refused at load instead of
 * producing NaN logits (with DSQ_OK) on every call.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_threadpool.h"
#include "internal.h"

static void shape_str(char *buf, size_t cap, int32_t ndim, const int64_t *shape)
{
    size_t k = 0;
    k += (size_t)snprintf(buf + k, cap - k, "[");
    for (int32_t i = 0; i < ndim && k < cap; i++)
        k += (size_t)snprintf(buf + k, cap - k, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (k < cap)
        snprintf(buf + k, cap - k, "]");
}

/* Find `name`, check dtype and shape (d1 == 0 means a 1-D [d0] tensor). */
static dsq_status bind_one(dsq_st_set *st, const char *name, int64_t d0, int64_t d1,
                           int private_copy, dsq_tensor *out)
{
    int64_t want[2] = { d0, d1 };
    int32_t want_ndim = d1 ? 2 : 1;
    char ws[64], gs[160];
    const dsq_st_entry *e = dsq_st_find(st, name);
    if (!e) {
        shape_str(ws, sizeof ws, want_ndim, want);
        return dsq_fail(DSQ_ERR_MISSING_TENSOR,
                        "tensor '%s' %s (BF16/F16/F32) is missing from the safetensors", name, ws);
    }
    if (e->t.dtype != DSQ_DT_F32 && e->t.dtype != DSQ_DT_F16 && e->t.dtype != DSQ_DT_BF16)
        return dsq_fail(DSQ_ERR_DTYPE, "tensor '%s' has dtype %s; only BF16, F16 and F32 are supported",
                        name, e->dtype_str);
    int ok = e->t.ndim == want_ndim;
    for (int32_t i = 0; ok && i < want_ndim; i++)
        ok = e->t.shape[i] == want[i];
    if (!ok) {
        shape_str(ws, sizeof ws, want_ndim, want);
        shape_str(gs, sizeof gs, e->t.ndim, e->t.shape);
        return dsq_fail(DSQ_ERR_SHAPE, "tensor '%s' has shape %s, expected %s", name, gs, ws);
    }
    return dsq_st_tensor(st, e, private_copy, out);
}

/* Add a bound tensor to the totals; *n_bound counts tensors taken from the set. */
static void count(dsq_weights *w, const dsq_tensor *t, int32_t *n_bound)
{
    w->n_params += dsq_tensor_numel(t);
    w->n_bytes += (int64_t)t->nbytes;
    (*n_bound)++;
}

dsq_status dsq_weights_bind(dsq_st_set *st, const dsq_config *cfg, int private_copy,
                            dsq_weights *w)
{
    if (!st || !cfg || !w)
        return dsq_fail(DSQ_ERR_INVALID_ARG, "dsq_weights_bind: NULL argument");
    memset(w, 0, sizeof *w);
    const int64_t E = cfg->n_embd, H = cfg->n_heads, K = cfg->n_kv_heads, D = cfg->head_dim,
                  F = cfg->n_ff, V = cfg->n_vocab;
    if (cfg->n_layers < 1 || E < 1 || H < 1 || K < 1 || D < 1 || F < 1 || V < 1)
        return dsq_fail(DSQ_ERR_CONFIG, "dsq_weights_bind: config has non-positive sizes");

    w->layers = calloc((size_t)cfg->n_layers, sizeof *w->layers);
    if (!w->layers)
        return dsq_fail(DSQ_ERR_OUT_OF_MEMORY, "no memory for %d layer descriptors", cfg->n_layers);

    dsq_status s;
    int32_t n_bound = 0;
    if ((s = bind_one(st, "model.embed_tokens.weight", V, E, private_copy, &w->tok_embd)) != DSQ_OK)
        goto fail;
    count(w, &w->tok_embd, &n_bound);

    char name[128];
    for (int32_t l = 0; l < cfg->n_layers; l++) {
        dsq_layer_weights *L = &w->layers[l];
        const struct {
            const char *suffix;
            int64_t d0, d1;
            dsq_tensor *t;
        } want[] = {
            { "input_layernorm.weight", E, 0, &L->attn_norm },
            { "self_attn.q_proj.weight", H * D, E, &L->wq },
            { "self_attn.q_proj.bias", H * D, 0, &L->bq },
            { "self_attn.k_proj.weight", K * D, E, &L->wk },
            { "self_attn.k_proj.bias", K * D, 0, &L->bk },
            { "self_attn.v_proj.weight", K * D, E, &L->wv },
            { "self_attn.v_proj.bias", K * D, 0, &L->bv },
            { "self_attn.o_proj.weight", E, H * D, &L->wo },
            { "post_attention_layernorm.weight", E, 0, &L->ffn_norm },
            { "mlp.gate_proj.weight", F, E, &L->w_gate },
            { "mlp.up_proj.weight", F, E, &L->w_up },
            { "mlp.down_proj.weight", E, F, &L->w_down },
        };
        for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
            snprintf(name, sizeof name, "model.layers.%d.%s", (int)l, want[i].suffix);
            if ((s = bind_one(st, name, want[i].d0, want[i].d1, private_copy, want[i].t)) != DSQ_OK)
                goto fail;
            count(w, want[i].t, &n_bound);
        }
    }

    if ((s = bind_one(st, "model.norm.weight", E, 0, private_copy, &w->out_norm)) != DSQ_OK)
        goto fail;
    count(w, &w->out_norm, &n_bound);

    if (cfg->tie_embeddings) {
        /* Tied: the head is the embedding; a stored lm_head.weight (some
         * exporters write one anyway) is ignored, as transformers does. */
        w->lm_head = w->tok_embd;
    } else {
        if ((s = bind_one(st, "lm_head.weight", V, E, private_copy, &w->lm_head)) != DSQ_OK) {
            if (s == DSQ_ERR_MISSING_TENSOR)
                s = dsq_fail(s,
                             "tensor 'lm_head.weight' [%lld, %lld] is missing and config.json "
                             "says tie_word_embeddings is false",
                             (long long)V, (long long)E);
            goto fail;
        }
        count(w, &w->lm_head, &n_bound);
    }

    int32_t unused = dsq_st_count(st) - n_bound -
                     (cfg->tie_embeddings && dsq_st_find(st, "lm_head.weight") ? 1 : 0);
    if (unused > 0)
        dsq_log(DSQ_LOG_INFO, "%d tensor(s) in the safetensors are not used by the model",
                (int)unused);
    return DSQ_OK;

fail:
    dsq_weights_release(w);
    return s;
}

void dsq_weights_release(dsq_weights *w)
{
    if (!w)
        return;
    free(w->layers);
    memset(w, 0, sizeof *w);
}

/* ---- non-finite scan -------------------------------------------------------- */

/* Non-finite = every exponent bit set.  Tested on 64-bit words holding 4
 * (bf16/f16) or 2 (f32) values at once: per lane, (v & EXP) + LOW carries
 * into the lane's sign bit exactly when all of EXP is set, and never into the
 * next lane.  No early exit, so the loop becomes wide vector code. */
static uint64_t nonfinite_words(const unsigned char *p, size_t n_words, uint64_t exp, uint64_t low,
                                uint64_t sign)
{
    uint64_t bad = 0;
    for (size_t i = 0; i < n_words; i++) {
        uint64_t x;
        memcpy(&x, p + 8 * i, 8); /* data is only element-aligned */
        bad |= ((x & exp) + low) & sign;
    }
    return bad;
}

int dsq_any_nonfinite(const void *p, dsq_dtype dt, size_t n)
{
    const unsigned char *b = p;
    size_t es = dsq_dtype_size(dt);
    if (es == 0)
        return 0;
    size_t words = n * es / 8, rest = n - words * 8 / es;
    uint64_t bad = 0;
    uint32_t tail = 0;
    const unsigned char *t = b + words * 8;
    switch (dt) {
    case DSQ_DT_BF16:
        bad = nonfinite_words(b, words, 0x7f807f807f807f80ull, 0x0080008000800080ull,
                              0x8000800080008000ull);
        for (size_t i = 0; i < rest; i++) {
            uint16_t v;
            memcpy(&v, t + 2 * i, 2);
            tail |= (v & 0x7f80u) == 0x7f80u;
        }
        break;
    case DSQ_DT_F16:
        bad = nonfinite_words(b, words, 0x7c007c007c007c00ull, 0x0400040004000400ull,
                              0x8000800080008000ull);
        for (size_t i = 0; i < rest; i++) {
            uint16_t v;
            memcpy(&v, t + 2 * i, 2);
            tail |= (v & 0x7c00u) == 0x7c00u;
        }
        break;
    case DSQ_DT_F32:
        bad = nonfinite_words(b, words, 0x7f8000007f800000ull, 0x0080000000800000ull,
                              0x8000000080000000ull);
        for (size_t i = 0; i < rest; i++) {
            uint32_t v;
            memcpy(&v, t + 4 * i, 4);
            tail |= (v & 0x7f800000u) == 0x7f800000u;
        }
        break;
    default: break;
    }
    return (bad | tail) != 0;
}

/* Every weight tensor the model uses, once (a tied head is the embedding). */
typedef struct named_tensor {
    char name[96];
    const dsq_tensor *t;
} named_tensor;

static int32_t list_weights(const dsq_weights *w, const dsq_config *cfg, named_tensor *out)
{
    int32_t n = 0;
#define PUT(tensor, ...)                                                \
    do {                                                                \
        snprintf(out[n].name, sizeof out[n].name, __VA_ARGS__);         \
        out[n++].t = (tensor);                                          \
    } while (0)
    PUT(&w->tok_embd, "model.embed_tokens.weight");
    for (int32_t l = 0; l < cfg->n_layers; l++) {
        const dsq_layer_weights *L = &w->layers[l];
        PUT(&L->attn_norm, "model.layers.%d.input_layernorm.weight", (int)l);
        PUT(&L->wq, "model.layers.%d.self_attn.q_proj.weight", (int)l);
        PUT(&L->bq, "model.layers.%d.self_attn.q_proj.bias", (int)l);
        PUT(&L->wk, "model.layers.%d.self_attn.k_proj.weight", (int)l);
        PUT(&L->bk, "model.layers.%d.self_attn.k_proj.bias", (int)l);
        PUT(&L->wv, "model.layers.%d.self_attn.v_proj.weight", (int)l);
        PUT(&L->bv, "model.layers.%d.self_attn.v_proj.bias", (int)l);
        PUT(&L->wo, "model.layers.%d.self_attn.o_proj.weight", (int)l);
        PUT(&L->ffn_norm, "model.layers.%d.post_attention_layernorm.weight", (int)l);
        PUT(&L->w_gate, "model.layers.%d.mlp.gate_proj.weight", (int)l);
        PUT(&L->w_up, "model.layers.%d.mlp.up_proj.weight", (int)l);
        PUT(&L->w_down, "model.layers.%d.mlp.down_proj.weight", (int)l);
    }
    PUT(&w->out_norm, "model.norm.weight");
    if (w->lm_head.data != w->tok_embd.data)
        PUT(&w->lm_head, "lm_head.weight");
#undef PUT
    return n;
}

/* Values per task: big enough to amortise claiming a task, small enough that
 * one 1 GB tensor still spreads over every thread. */
#define SCAN_CHUNK ((size_t)1 << 20)

typedef struct scan_task {
    int32_t tensor;
    size_t begin, count; /* in elements */
} scan_task;

typedef struct scan_job {
    const named_tensor *list;
    const scan_task *tasks;
    unsigned char *bad; /* [n tensors], set by any thread */
} scan_job;

static void scan_one(void *arg, int64_t i, int thread)
{
    (void)thread;
    const scan_job *job = arg;
    const scan_task *k = &job->tasks[i];
    const dsq_tensor *t = job->list[k->tensor].t;
    const char *base = (const char *)t->data + k->begin * dsq_dtype_size(t->dtype);
    if (dsq_any_nonfinite(base, t->dtype, k->count))
        __atomic_store_n(&job->bad[k->tensor], 1, __ATOMIC_RELAXED);
}

dsq_status dsq_weights_check_finite(const dsq_weights *w, const dsq_config *cfg, int n_threads)
{
    if (!w || !cfg || !w->layers)
        return dsq_fail(DSQ_ERR_INVALID_ARG, "dsq_weights_check_finite: no weights");
    size_t max_list = 3 + (size_t)cfg->n_layers * 12;
    named_tensor *list = malloc(max_list * sizeof *list);
    unsigned char *bad = calloc(max_list, 1);
    scan_task *tasks = NULL;
    dsq_cpu_pool *pool = NULL;
    dsq_status st = DSQ_OK;
    if (!list || !bad) {
        st = dsq_fail(DSQ_ERR_OUT_OF_MEMORY, "no memory for the non-finite weight check");
        goto done;
    }
    int32_t n = list_weights(w, cfg, list);
    size_t n_tasks = 0;
    for (int32_t i = 0; i < n; i++) {
        size_t es = dsq_dtype_size(list[i].t->dtype);
        size_t elems = (list[i].t->data && es) ? list[i].t->nbytes / es : 0;
        n_tasks += (elems + SCAN_CHUNK - 1) / SCAN_CHUNK;
    }
    tasks = malloc((n_tasks ? n_tasks : 1) * sizeof *tasks);
    if (!tasks) {
        st = dsq_fail(DSQ_ERR_OUT_OF_MEMORY, "no memory for the non-finite weight check");
        goto done;
    }
    size_t k = 0;
    for (int32_t i = 0; i < n; i++) {
        size_t es = dsq_dtype_size(list[i].t->dtype);
        size_t elems = (list[i].t->data && es) ? list[i].t->nbytes / es : 0;
        for (size_t b = 0; b < elems; b += SCAN_CHUNK) {
            tasks[k].tensor = i;
            tasks[k].begin = b;
            tasks[k].count = elems - b < SCAN_CHUNK ? elems - b : SCAN_CHUNK;
            k++;
        }
    }
    if (n_threads <= 0)
        n_threads = dsq_n_cores();
    if ((size_t)n_threads > n_tasks)
        n_threads = n_tasks > 0 ? (int)n_tasks : 1;
    scan_job job = { list, tasks, bad };
    if (n_threads > 1) {
        if ((st = dsq_cpu_pool_new(n_threads, &pool)) != DSQ_OK)
            goto done;
        dsq_cpu_pool_run(pool, (int64_t)n_tasks, scan_one, &job);
    } else {
        for (size_t i = 0; i < n_tasks; i++)
            scan_one(&job, (int64_t)i, 0);
    }
    for (int32_t i = 0; i < n; i++)
        if (bad[i]) {
            st = dsq_fail(DSQ_ERR_FORMAT,
                          "tensor '%s' holds a non-finite value (NaN or Inf); the checkpoint is "
                          "corrupt (set dsq_model_params.skip_finite_check to load it anyway)",
                          list[i].name);
            break;
        }
done:
    dsq_cpu_pool_free(pool);
    free(tasks);
    free(bad);
    free(list);
    return st;
}
