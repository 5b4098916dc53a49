/*
 * weights_quant.c - quantized linears at load (lib/weights_quant.h):
 * AWQ / GPTQ tensors repacked into Q4_G128, dsqwen tensors copied as they
 * are (Q8_ROW or Q4_G128, told apart per linear by the qweight dtype, so a
 * 4-bit model may carry an 8-bit head), and quantize-at-load over row
 * ranges on a thread pool.  Every array is a private 64-byte aligned copy:
 * nothing points into the file mapping, and a 16-byte GPU/vector load of a
 * row never straddles a misaligned start.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_threadpool.h"
#include "quant_config.h"
#include "quant_cpu.h"
#include "weights_quant.h"

int dsq_spec_is_linear(const dsq_arch *a, const dsq_tensor_spec *sp)
{
    if (!sp->per_layer)
        return sp->role == DSQ_GW_LM_HEAD;
    for (int32_t i = 0; i < a->n_ops; i++) {
        const dsq_op *op = &a->recipe[i];
        if (op->kind == DSQ_OP_NORM)
            continue;
        for (int j = 0; j < 3; j++)
            if (op->w[j] == sp->role)
                return 1;
    }
    return 0;
}

static dsq_weight *qslot(dsq_qweights *q, int per_layer, int32_t role, int32_t layer)
{
    if (!per_layer)
        return role == DSQ_GW_LM_HEAD ? &q->head : NULL;
    return &q->lw[layer][role];
}

const dsq_weight *dsq_weights_qslot(const dsq_weights *w, int per_layer, int32_t role,
                                    int32_t layer)
{
    if (!w || !w->q)
        return NULL;
    const dsq_weight *d = qslot(w->q, per_layer, role, layer);
    return d && d->data ? d : NULL;
}

int dsq_weights_layers_quantized(const dsq_weights *w, int32_t n_layers)
{
    if (!w || !w->q || !w->q->lw)
        return 0;
    for (int32_t l = 0; l < n_layers; l++)
        for (int32_t r = 0; r < DSQ_LW_COUNT; r++)
            if (w->q->lw[l][r].data)
                return 1;
    return 0;
}

void dsq_qweights_free(dsq_qweights *q)
{
    if (!q)
        return;
    for (int32_t i = 0; i < q->n_bufs; i++)
        free(q->bufs[i]);
    free(q->bufs);
    free(q->lw);
    free(q);
}

static dsq_status qw_get(dsq_weights *w, const dsq_config *cfg, dsq_qweights **out)
{
    if (!w->q) {
        dsq_qweights *q = calloc(1, sizeof *q);
        if (q)
            q->lw = calloc((size_t)cfg->n_layers, sizeof *q->lw);
        if (!q || !q->lw) {
            free(q);
            return dsq_fail(DSQ_ERR_OUT_OF_MEMORY, "no memory for quantized weight descriptors");
        }
        w->q = q;
    }
    *out = w->q;
    return DSQ_OK;
}

/* A zeroed 64-byte aligned block owned by q. */
static void *qw_alloc(dsq_qweights *q, size_t bytes)
{
    if (q->n_bufs == q->cap_bufs) {
        int32_t cap = q->cap_bufs ? 2 * q->cap_bufs : 64;
        void **nb = realloc(q->bufs, (size_t)cap * sizeof *nb);
        if (!nb)
            return NULL;
        q->bufs = nb;
        q->cap_bufs = cap;
    }
    size_t n = (bytes + 63) / 64 * 64;
    void *p = aligned_alloc(64, n ? n : 64);
    if (!p)
        return NULL;
    memset(p, 0, n ? n : 64);
    q->bufs[q->n_bufs++] = p;
    return p;
}

int64_t dsq_qweight_bytes(const dsq_weight *d)
{
    if (!d || !d->data)
        return 0;
    if (d->format == DSQ_WF_Q8_ROW)
        return d->rows * d->cols + d->rows * 4;
    if (d->format == DSQ_WF_Q4_G128)
        return (int64_t)(dsq_q4_q_bytes(d->rows, d->cols) + dsq_q4_scales_bytes(d->rows, d->cols) +
                         dsq_q4_zeros_bytes(d->rows, d->cols));
    return 0;
}

/* ---- binding a checkpoint's quantized linear -------------------------------------- */

/* Entry `prefix.suffix`, checked for dtype and 1-D / 2-D shape (d1 == 0: 1-D).
 * *e NULL (DSQ_OK) when absent and `optional`. */
static dsq_status find_part(dsq_st_set *st, const char *prefix, const char *suffix,
                            const char *dtype, int64_t d0, int64_t d1, int optional,
                            const dsq_st_entry **e)
{
    char name[192];
    snprintf(name, sizeof name, "%s.%s", prefix, suffix);
    *e = dsq_st_find(st, name);
    if (!*e) {
        if (optional)
            return DSQ_OK;
        return dsq_fail(DSQ_ERR_MISSING_TENSOR, "tensor '%s' (%s) is missing from the quantized checkpoint",
                        name, dtype);
    }
    if (strcmp((*e)->dtype_str, dtype) != 0)
        return dsq_fail(DSQ_ERR_DTYPE, "tensor '%s' has dtype %s; the format needs %s", name,
                        (*e)->dtype_str, dtype);
    const dsq_tensor *t = &(*e)->t;
    int ok = t->ndim == (d1 ? 2 : 1) && t->shape[0] == d0 && (!d1 || t->shape[1] == d1);
    if (!ok) {
        char got[96];
        size_t k = 0;
        got[0] = '\0';
        for (int32_t i = 0; i < t->ndim && k < sizeof got; i++)
            k += (size_t)snprintf(got + k, sizeof got - k, "%s%lld", i ? ", " : "",
                                  (long long)t->shape[i]);
        if (d1)
            return dsq_fail(DSQ_ERR_SHAPE, "tensor '%s' has shape [%s], expected [%lld, %lld]", name,
                            got, (long long)d0, (long long)d1);
        return dsq_fail(DSQ_ERR_SHAPE, "tensor '%s' has shape [%s], expected [%lld]", name, got,
                        (long long)d0);
    }
    if (!t->data && t->nbytes)
        return dsq_fail(DSQ_ERR_INTERNAL, "tensor '%s': its file is no longer mapped", name);
    return DSQ_OK;
}

/* A private aligned copy of an entry's bytes (the mapping may be misaligned
 * for int32 / f16 reads). */
static void *copy_part(dsq_qweights *q, const dsq_st_entry *e)
{
    void *p = qw_alloc(q, e->t.nbytes);
    if (p && e->t.nbytes)
        memcpy(p, e->t.data, e->t.nbytes);
    return p;
}

/* Temporary aligned copy (freed by the caller). */
static void *tmp_copy(const dsq_st_entry *e)
{
    if (!e)
        return NULL;
    void *p = malloc(e->t.nbytes ? e->t.nbytes : 1);
    if (p && e->t.nbytes)
        memcpy(p, e->t.data, e->t.nbytes);
    return p;
}

static dsq_status oom(const char *prefix)
{
    return dsq_fail(DSQ_ERR_OUT_OF_MEMORY, "no memory for the quantized weight '%s'", prefix);
}

/* Wrap the message of a failed conversion with the linear's name. */
static dsq_status name_it(dsq_status s, const char *prefix)
{
    char msg[400];
    snprintf(msg, sizeof msg, "%s", dsq_last_error_message());
    return dsq_fail(s, "quantized weight '%s': %s", prefix, msg);
}

static dsq_status bind_awq_gptq(dsq_st_set *st, const dsq_quant_config *qc, dsq_qweights *q,
                                const char *prefix, int64_t N, int64_t K, dsq_weight *d)
{
    if (N % 8 != 0 || K % DSQ_Q4_GROUP != 0)
        return dsq_fail(DSQ_ERR_SHAPE,
                        "quantized weight '%s' [%lld, %lld]: %s needs out features %% 8 == 0 "
                        "and in features %% 128 == 0",
                        prefix, (long long)N, (long long)K, dsq_quant_method_name(qc->method));
    const int awq = qc->method == DSQ_QM_AWQ;
    const int64_t G = K / DSQ_Q4_GROUP;
    const dsq_st_entry *eq, *ez, *es, *eg = NULL;
    dsq_status s;
    if ((s = find_part(st, prefix, "qweight", "I32", awq ? K : K / 8, awq ? N / 8 : N, 0, &eq)) != DSQ_OK ||
        (s = find_part(st, prefix, "qzeros", "I32", G, N / 8, 0, &ez)) != DSQ_OK ||
        (s = find_part(st, prefix, "scales", "F16", G, N, 0, &es)) != DSQ_OK ||
        (!awq && (s = find_part(st, prefix, "g_idx", "I32", K, 0, 1, &eg)) != DSQ_OK))
        return s;
    uint8_t *qq = qw_alloc(q, dsq_q4_q_bytes(N, K));
    uint16_t *qs = qw_alloc(q, dsq_q4_scales_bytes(N, K));
    uint8_t *qz = qw_alloc(q, dsq_q4_zeros_bytes(N, K));
    int32_t *tw = tmp_copy(eq), *tz = tmp_copy(ez), *tg = tmp_copy(eg);
    uint16_t *ts = tmp_copy(es);
    if (!qq || !qs || !qz || !tw || !tz || !ts || (eg && !tg)) {
        s = oom(prefix);
    } else if (awq) {
        s = dsq_q4_from_awq(tw, tz, ts, N, K, qq, qs, qz);
    } else {
        s = dsq_q4_from_gptq(tw, tz, ts, tg, qc->gptq_zero_offset, N, K, qq, qs, qz);
    }
    if (s != DSQ_OK && s != DSQ_ERR_OUT_OF_MEMORY)
        s = name_it(s, prefix);
    free(tw);
    free(tz);
    free(tg);
    free(ts);
    if (s != DSQ_OK)
        return s;
    *d = (dsq_weight){ .format = DSQ_WF_Q4_G128, .rows = N, .cols = K, .data = qq, .scales = qs,
                       .zeros = qz, .group_size = DSQ_Q4_GROUP, .layout = DSQ_WL_ROWS };
    return DSQ_OK;
}

static dsq_status bind_dsqwen(dsq_st_set *st, dsq_qweights *q, const char *prefix,
                              const dsq_st_entry *eqw, int64_t N, int64_t K, dsq_weight *d)
{
    const dsq_st_entry *eq, *es, *ez;
    dsq_status s;
    if (strcmp(eqw->dtype_str, "I8") == 0) { /* Q8_ROW */
        if ((s = find_part(st, prefix, "qweight", "I8", N, K, 0, &eq)) != DSQ_OK ||
            (s = find_part(st, prefix, "scales", "F32", N, 0, 0, &es)) != DSQ_OK)
            return s;
        void *qq = copy_part(q, eq), *qs = copy_part(q, es);
        if (!qq || !qs)
            return oom(prefix);
        if (dsq_any_nonfinite(qs, DSQ_DT_F32, (size_t)N))
            return dsq_fail(DSQ_ERR_FORMAT, "tensor '%s.scales' holds a non-finite value (NaN or Inf)",
                            prefix);
        *d = (dsq_weight){ .format = DSQ_WF_Q8_ROW, .rows = N, .cols = K, .data = qq, .scales = qs,
                           .layout = DSQ_WL_ROWS };
        return DSQ_OK;
    }
    if (strcmp(eqw->dtype_str, "U8") == 0) { /* Q4_G128 */
        const int64_t G = dsq_q4_groups(K);
        if ((s = find_part(st, prefix, "qweight", "U8", N, dsq_q4_ldq(K), 0, &eq)) != DSQ_OK ||
            (s = find_part(st, prefix, "scales", "F16", N, G, 0, &es)) != DSQ_OK ||
            (s = find_part(st, prefix, "zeros", "U8", N, G, 0, &ez)) != DSQ_OK)
            return s;
        uint8_t *qq = copy_part(q, eq), *qz = copy_part(q, ez);
        uint16_t *qs = copy_part(q, es);
        if (!qq || !qs || !qz)
            return oom(prefix);
        if (dsq_any_nonfinite(qs, DSQ_DT_F16, (size_t)(N * G)))
            return dsq_fail(DSQ_ERR_FORMAT, "tensor '%s.scales' holds a non-finite value (NaN or Inf)",
                            prefix);
        for (int64_t i = 0; i < N * G; i++)
            if (qz[i] > 16)
                return dsq_fail(DSQ_ERR_FORMAT, "tensor '%s.zeros' holds %u at %lld; 4-bit zero points are 0..16",
                                prefix, (unsigned)qz[i], (long long)i);
        /* pad nibbles past K must be 0 (the products read whole pieces) */
        const int64_t ldq = dsq_q4_ldq(K);
        if (K % 32 != 0)
            for (int64_t n = 0; n < N; n++) {
                uint8_t *row = qq + n * ldq;
                if (K % 2)
                    row[K / 2] &= 0x0f;
                memset(row + (K + 1) / 2, 0, (size_t)(ldq - (K + 1) / 2));
            }
        *d = (dsq_weight){ .format = DSQ_WF_Q4_G128, .rows = N, .cols = K, .data = qq, .scales = qs,
                           .zeros = qz, .group_size = DSQ_Q4_GROUP, .layout = DSQ_WL_ROWS };
        return DSQ_OK;
    }
    return dsq_fail(DSQ_ERR_DTYPE, "tensor '%s.qweight' has dtype %s; a dsqwen checkpoint stores I8 "
                                   "(8-bit) or U8 (4-bit)",
                    prefix, eqw->dtype_str);
}

dsq_status dsq_qweights_bind_linear(dsq_st_set *st, const dsq_config *cfg, dsq_weights *w,
                                    const dsq_tensor_spec *sp, int32_t layer, const char *name,
                                    int64_t N, int64_t K, int *found)
{
    *found = 0;
    char prefix[160], qname[192];
    size_t ln = strlen(name);
    if (ln < 7 || strcmp(name + ln - 7, ".weight") != 0 || ln - 7 >= sizeof prefix)
        return DSQ_OK;
    memcpy(prefix, name, ln - 7);
    prefix[ln - 7] = '\0';
    snprintf(qname, sizeof qname, "%s.qweight", prefix);
    const dsq_st_entry *eqw = dsq_st_find(st, qname);
    if (!eqw)
        return DSQ_OK;
    if (dsq_st_find(st, name))
        return dsq_fail(DSQ_ERR_FORMAT, "the checkpoint holds both '%s' and '%s'; which one counts "
                                        "is ambiguous",
                        name, qname);
    dsq_qweights *q = NULL;
    dsq_status s = qw_get(w, cfg, &q);
    if (s != DSQ_OK)
        return s;
    dsq_weight d = { 0 };
    if (cfg->quant.method == DSQ_QM_DSQWEN)
        s = bind_dsqwen(st, q, prefix, eqw, N, K, &d);
    else
        s = bind_awq_gptq(st, &cfg->quant, q, prefix, N, K, &d);
    if (s != DSQ_OK)
        return s;
    dsq_weight *slot = qslot(q, sp->per_layer, sp->role, layer);
    if (!slot)
        return dsq_fail(DSQ_ERR_INTERNAL, "'%s': no quantized slot for its role", name);
    *slot = d;
    *found = 1;
    return DSQ_OK;
}

/* ---- quantize at load -------------------------------------------------------------- */

#define QROWS 256 /* rows per task */

typedef struct qtask {
    const dsq_tensor *src;
    dsq_weight *dst;
    int64_t r0, r1;
    dsq_status st;
} qtask;

static dsq_status quantize_range(const qtask *k)
{
    const dsq_weight *d = k->dst;
    if (d->format == DSQ_WF_Q8_ROW)
        return dsq_q8_quantize_rows(k->src->data, k->src->dtype, d->cols, k->r0, k->r1,
                                    (int8_t *)d->data, (float *)d->scales);
    return dsq_q4_quantize_rows(k->src->data, k->src->dtype, d->cols, k->r0, k->r1,
                                (uint8_t *)d->data, (uint16_t *)d->scales, (uint8_t *)d->zeros);
}

static void quantize_task(void *arg, int64_t i, int thread)
{
    (void)thread;
    qtask *k = &((qtask *)arg)[i];
    k->st = quantize_range(k);
}

typedef struct qjob {
    dsq_tensor *src;
    dsq_weight *dst;
    char name[160];
} qjob;

dsq_status dsq_weights_quantize(dsq_weights *w, const dsq_config *cfg, int mode, int head,
                                int n_threads)
{
    if (!w || !cfg || !cfg->arch || !w->layers)
        return dsq_fail(DSQ_ERR_INVALID_ARG, "dsq_weights_quantize: no weights");
    if (mode != DSQ_QUANTIZE_INT8 && mode != DSQ_QUANTIZE_Q4 && !(mode == DSQ_QUANTIZE_NONE && head))
        return dsq_fail(DSQ_ERR_INVALID_ARG, "dsq_weights_quantize: mode %d, head %d", mode, head);
    const dsq_arch *a = cfg->arch;
    dsq_qweights *q = NULL;
    dsq_status s = qw_get(w, cfg, &q);
    if (s != DSQ_OK)
        return s;
    size_t max_jobs = (size_t)a->n_tensors * (size_t)cfg->n_layers + 1;
    qjob *jobs = calloc(max_jobs, sizeof *jobs);
    qtask *tasks = NULL;
    dsq_cpu_pool *pool = NULL;
    if (!jobs)
        return dsq_fail(DSQ_ERR_OUT_OF_MEMORY, "no memory to plan the quantization");
    size_t n_jobs = 0, n_tasks = 0;
    int64_t dense_bytes = 0;
    for (int32_t i = 0; i < a->n_tensors; i++) {
        const dsq_tensor_spec *sp = &a->tensors[i];
        if (!dsq_spec_is_linear(a, sp) || (!sp->per_layer && !head) ||
            (sp->per_layer && mode == DSQ_QUANTIZE_NONE))
            continue; /* mode NONE: the head alone */
        for (int32_t l = 0; l < (sp->per_layer ? cfg->n_layers : 1); l++) {
            dsq_tensor *t = sp->per_layer ? &w->layers[l].t[sp->role] : &w->g[sp->role];
            dsq_weight *d = qslot(q, sp->per_layer, sp->role, l);
            if (!t->data || !d || d->data)
                continue; /* absent, or already quantized */
            qjob *j = &jobs[n_jobs++];
            j->src = t;
            j->dst = d;
            dsq_arch_tensor_name(a, sp->per_layer, sp->role, l, j->name, sizeof j->name);
            const int64_t N = t->shape[0], K = t->shape[1];
            const int q8 = mode == DSQ_QUANTIZE_INT8 || !sp->per_layer; /* the head: int8 */
            dsq_weight nd = { .format = q8 ? DSQ_WF_Q8_ROW : DSQ_WF_Q4_G128, .rows = N, .cols = K,
                              .group_size = q8 ? 0 : DSQ_Q4_GROUP, .layout = DSQ_WL_ROWS };
            if (q8) {
                nd.data = qw_alloc(q, (size_t)(N * K));
                nd.scales = qw_alloc(q, (size_t)N * sizeof(float));
            } else {
                nd.data = qw_alloc(q, dsq_q4_q_bytes(N, K));
                nd.scales = qw_alloc(q, dsq_q4_scales_bytes(N, K));
                nd.zeros = qw_alloc(q, dsq_q4_zeros_bytes(N, K));
            }
            if (!nd.data || !nd.scales || (!q8 && !nd.zeros)) {
                s = dsq_fail(DSQ_ERR_OUT_OF_MEMORY, "no memory to quantize '%s'", j->name);
                goto done;
            }
            *d = nd;
            /* a tied head stays the embedding's tensor: it is counted once */
            if (sp->per_layer || t->data != w->g[DSQ_GW_TOK_EMBD].data)
                dense_bytes += (int64_t)t->nbytes;
            n_tasks += (size_t)((N + QROWS - 1) / QROWS);
        }
    }
    tasks = calloc(n_tasks ? n_tasks : 1, sizeof *tasks);
    if (!tasks) {
        s = dsq_fail(DSQ_ERR_OUT_OF_MEMORY, "no memory to plan the quantization");
        goto done;
    }
    size_t k = 0;
    for (size_t j = 0; j < n_jobs; j++)
        for (int64_t r = 0; r < jobs[j].dst->rows; r += QROWS) {
            tasks[k].src = jobs[j].src;
            tasks[k].dst = jobs[j].dst;
            tasks[k].r0 = r;
            tasks[k].r1 = r + QROWS < jobs[j].dst->rows ? r + QROWS : jobs[j].dst->rows;
            k++;
        }
    if (n_threads <= 0)
        n_threads = dsq_n_cores();
    if ((size_t)n_threads > n_tasks)
        n_threads = n_tasks > 0 ? (int)n_tasks : 1;
    if (n_threads > 1) {
        if ((s = dsq_cpu_pool_new(n_threads, &pool)) != DSQ_OK)
            goto done;
        dsq_cpu_pool_run(pool, (int64_t)n_tasks, quantize_task, tasks);
    } else {
        for (size_t i = 0; i < n_tasks; i++)
            quantize_task(tasks, (int64_t)i, 0);
    }
    for (size_t i = 0; i < n_tasks; i++)
        if (tasks[i].st != DSQ_OK) {
            /* again on this thread, for the message (the error text is per thread) */
            s = quantize_range(&tasks[i]);
            if (s == DSQ_OK)
                s = tasks[i].st;
            for (size_t j = 0; j < n_jobs; j++)
                if (jobs[j].dst == tasks[i].dst) {
                    s = name_it(s, jobs[j].name);
                    break;
                }
            goto done;
        }
    int64_t qbytes = 0;
    for (size_t j = 0; j < n_jobs; j++)
        qbytes += dsq_qweight_bytes(jobs[j].dst);
    w->n_bytes += qbytes - dense_bytes;
    /* the dense views are no longer what the products read */
    for (size_t j = 0; j < n_jobs; j++) {
        jobs[j].src->data = NULL;
        jobs[j].src->dtype = DSQ_DT_OTHER;
        jobs[j].src->nbytes = (size_t)dsq_qweight_bytes(jobs[j].dst);
    }
done:
    if (s != DSQ_OK)
        for (size_t j = 0; j < n_jobs; j++)
            memset(jobs[j].dst, 0, sizeof *jobs[j].dst);
    dsq_cpu_pool_free(pool);
    free(tasks);
    free(jobs);
    return s;
}
