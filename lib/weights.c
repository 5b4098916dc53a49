/*
 * weights.c - bind the tensors the model description (cfg->arch->tensors,
 * lib/arch_*.c) implies to views into the safetensors set, checking each
 * one's dtype and exact shape.  Optional tensors (biases) may be absent:
 * their view keeps data NULL, which every backend reads as zeros.  A head
 * tied to the embedding is the embedding's view; a stored head is then
 * ignored, as transformers does.
 * Tensors in the file that the description does not name are left alone
 * (older checkpoints carry e.g. rotary inv_freq buffers); their count is
 * logged.  Only bound tensors are ever copied (misaligned ones, or all of
 * them when the caller wants private copies), never the unused ones.
 *
 * dsq_weights_check_finite() scans every bound value once for NaN/Inf, in
 * parallel over chunks, so a corrupt checkpoint is refused at load instead of
 * producing NaN logits (with DSQ_OK) on every call.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "arch.h"
#include "cpu_threadpool.h"
#include "internal.h"
#include "weights_quant.h"

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

/* The view a spec fills. */
static dsq_tensor *slot(dsq_weights *w, const dsq_tensor_spec *sp, int32_t layer)
{
    return sp->per_layer ? &w->layers[layer].t[sp->role] : &w->g[sp->role];
}

dsq_status dsq_weights_bind(dsq_st_set *st, const dsq_config *cfg, int private_copy,
                            dsq_weights *w)
{
    if (!st || !cfg || !w)
        return dsq_fail(DSQ_ERR_INVALID_ARG, "dsq_weights_bind: NULL argument");
    memset(w, 0, sizeof *w);
    const dsq_arch *a = cfg->arch;
    if (!a)
        return dsq_fail(DSQ_ERR_CONFIG, "dsq_weights_bind: the config names no architecture");
    for (int d = DSQ_DIM_EMBD; d <= DSQ_DIM_VOCAB; d++)
        if (dsq_arch_dim(cfg, (dsq_dim)d) < 1 || cfg->n_layers < 1)
            return dsq_fail(DSQ_ERR_CONFIG, "dsq_weights_bind: config has non-positive sizes");

    w->layers = calloc((size_t)cfg->n_layers, sizeof *w->layers);
    if (!w->layers)
        return dsq_fail(DSQ_ERR_OUT_OF_MEMORY, "no memory for %d layer descriptors", cfg->n_layers);

    dsq_status s = DSQ_OK;
    int32_t n_bound = 0, n_ignored = 0;
    char name[160];
    for (int32_t i = 0; i < a->n_tensors; i++) {
        const dsq_tensor_spec *sp = &a->tensors[i];
        const int64_t d0 = dsq_arch_dim(cfg, sp->rows), d1 = dsq_arch_dim(cfg, sp->cols);
        for (int32_t l = 0; l < (sp->per_layer ? cfg->n_layers : 1); l++) {
            dsq_arch_tensor_name(a, sp->per_layer, sp->role, l, name, sizeof name);
            dsq_tensor *t = slot(w, sp, l);
            if ((sp->flags & DSQ_TF_HEAD) && cfg->tie_embeddings) {
                /* tied: the head is the embedding; a stored one (some
                 * exporters write it anyway) is ignored, as transformers does */
                *t = w->g[DSQ_GW_TOK_EMBD];
                n_ignored += dsq_st_find(st, name) != NULL;
                continue;
            }
            if ((sp->flags & DSQ_TF_OPTIONAL) && !dsq_st_find(st, name)) {
                /* absent: zeros, on every backend; the shape says how many */
                memset(t, 0, sizeof *t);
                t->dtype = DSQ_DT_F32;
                t->ndim = d1 ? 2 : 1;
                t->shape[0] = d0;
                t->shape[1] = d1;
                continue;
            }
            if (cfg->quant.method != DSQ_QM_NONE && dsq_spec_is_linear(a, sp)) {
                /* a quantized linear (lib/weights_quant.c); absent: stored dense */
                int found = 0;
                if ((s = dsq_qweights_bind_linear(st, cfg, w, sp, l, name, d0, d1, &found)) != DSQ_OK)
                    goto fail;
                if (found) {
                    const dsq_weight *qd = dsq_weights_qslot(w, sp->per_layer, sp->role, l);
                    memset(t, 0, sizeof *t);
                    t->dtype = DSQ_DT_OTHER; /* data NULL: the product reads w->q */
                    t->ndim = 2;
                    t->shape[0] = d0;
                    t->shape[1] = d1;
                    t->nbytes = (size_t)dsq_qweight_bytes(qd);
                    w->n_params += d0 * d1;
                    w->n_bytes += (int64_t)t->nbytes;
                    n_bound += 2 + (cfg->quant.method == DSQ_QM_GPTQ) +
                               (cfg->quant.method != DSQ_QM_DSQWEN || qd->format == DSQ_WF_Q4_G128);
                    continue;
                }
            }
            if ((s = bind_one(st, name, d0, d1, private_copy, t)) != DSQ_OK) {
                if (s == DSQ_ERR_MISSING_TENSOR && (sp->flags & DSQ_TF_HEAD))
                    s = dsq_fail(s,
                                 "tensor '%s' [%lld, %lld] is missing and config.json says "
                                 "tie_word_embeddings is false",
                                 name, (long long)d0, (long long)d1);
                goto fail;
            }
            count(w, t, &n_bound);
        }
    }

    int32_t unused = dsq_st_count(st) - n_bound - n_ignored;
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
    dsq_qweights_free(w->q);
    free(w->layers);
    memset(w, 0, sizeof *w);
}

void dsq_weights_forget_data(dsq_weights *w, int32_t n_layers)
{
    if (!w)
        return;
    for (int i = 0; i < DSQ_GW_COUNT; i++)
        w->g[i].data = NULL;
    for (int32_t l = 0; w->layers && l < n_layers; l++)
        for (int i = 0; i < DSQ_LW_COUNT; i++)
            w->layers[l].t[i].data = NULL;
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
    char name[160];
    const dsq_tensor *t;
} named_tensor;

static int32_t list_weights(const dsq_weights *w, const dsq_config *cfg, named_tensor *out)
{
    const dsq_arch *a = cfg->arch;
    int32_t n = 0;
    for (int32_t i = 0; i < a->n_tensors; i++) {
        const dsq_tensor_spec *sp = &a->tensors[i];
        for (int32_t l = 0; l < (sp->per_layer ? cfg->n_layers : 1); l++) {
            const dsq_tensor *t = sp->per_layer ? &w->layers[l].t[sp->role] : &w->g[sp->role];
            if (!t->data || ((sp->flags & DSQ_TF_HEAD) && t->data == w->g[DSQ_GW_TOK_EMBD].data))
                continue; /* absent, or the tied embedding (listed once) */
            dsq_arch_tensor_name(a, sp->per_layer, sp->role, l, out[n].name, sizeof out[n].name);
            out[n++].t = t;
        }
    }
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
    if (!w || !cfg || !w->layers || !cfg->arch)
        return dsq_fail(DSQ_ERR_INVALID_ARG, "dsq_weights_check_finite: no weights");
    size_t max_list = (size_t)cfg->arch->n_tensors * (size_t)cfg->n_layers;
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
