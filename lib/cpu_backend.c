/* cpu_backend.c - the CPU backend: the forward pass in fp32 over the
 * mmapped BF16/F16/F32 weights, and the numeric reference for the GPU.
 *
 * Each layer walks the model description's recipe (cfg->arch->recipe,
 * lib/arch.h), over all tokens of the batch (T = b->n_tokens):
 *   NORM          xn = rmsnorm(x)                          main thread
 *   QKV_ROPE      q,k,v = xn W^T + b; rope(q,k); k,v -> cache rows
 *                                                          one task per head
 *   ATTEND        att = softmax(q k^T / sqrt(D)) v  (causal, GQA)
 *                                                          one task per (token, KV head)
 *   LINEAR_RESID  x += in W^T (+ b)                        tasks over row chunks
 *   GATED_FFN     act = silu(xn Wg^T) * (xn Wu^T)          tasks over row chunks
 * then the final norm and the output head for the requested rows only.
 * An absent optional bias is zeros (no add).  Weight rows are converted to
 * fp32 inside the matmul and reused by every token of the batch (see
 * dsq_cpu_linear, which dispatches on each weight's format, lib/weight.h);
 * nothing is allocated here after ctx_init.
 *
 * Tensor parallelism on the CPU (dsq_model_params.tp_world > 1): every rank
 * runs in this process, one after the other, each with its slices of the
 * weights (lib/tp_weights.h), its share of the KV heads and its own copy of
 * the residual stream; a row-parallel product (o_proj, down) writes each
 * rank's partial sum, the partials are summed (the all-reduce) and added to
 * every rank's residual; each rank computes its vocabulary part of the
 * logits straight into the gathered row.  This mode is for verifying the
 * sharded math against the unsharded forward; it does not make the CPU
 * faster (docs/tensor_parallel.md). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "arch.h"
#include "cpu_ops.h"
#include "cpu_threadpool.h"
#include "internal.h"
#include "quant_cpu.h"
#include "tp_weights.h"
#include "weights_quant.h"

/* The products' view of the weights: a dsq_weight per linear role of each
 * layer (roles without a matrix stay zeroed) and the head.  Built from
 * m->w at load; a packer of another format fills these instead. */
/* One tensor-parallel rank: its weights and their descriptors. */
typedef struct cpu_rank {
    dsq_tp_weights tw;              /* slices; tw.cfg has the rank's sizes */
    dsq_weight (*lw)[DSQ_LW_COUNT]; /* [n_layers] */
    dsq_weight head;                /* [its n_vocab, E] */
} cpu_rank;

typedef struct cpu_model {
    dsq_weight (*lw)[DSQ_LW_COUNT]; /* [n_layers] */
    dsq_weight head;                /* [V, E] */
    int32_t world;                  /* tensor-parallel degree (1: none)    */
    cpu_rank *ranks;                /* [world] when world > 1              */
} cpu_model;

typedef struct cpu_ctx {
    dsq_cpu_pool *pool;
    int n_threads;
    int32_t T;            /* max_batch_tokens: rows of every activation buffer */
    int64_t kv_rows;      /* physical KV rows (static: max_seqs*max_context) */
    size_t kv_esz;        /* bytes per cached value */
    /* KV cache, per layer l: K at k + l*layer_kv_bytes, laid out
     * [kv_rows][n_kv_heads][head_dim] elements; V the same.  INT8 scales:
     * [n_layers][kv_rows][n_kv_heads] floats for K and for V. */
    char *k, *v;
    float *ks, *vs;
    size_t layer_kv_bytes;
    /* activations */
    float *x;             /* [T][E] residual stream */
    float *xn;            /* [T][E] normalized input of a sublayer / final norm */
    float *q;             /* [T][H*D] queries (roped in place) */
    float *kx, *vx;       /* [T][K*D] new keys (roped) / values before caching */
    float *att;           /* [T][H*D] attention output */
    float *g, *u;         /* [T][F] gate (then silu(gate)*up) and up */
    float *rope;          /* [T][D]: cos[D/2] then sin[D/2] of each token's position */
    float *inv_freq;      /* [D/2] */
    /* per thread */
    float *wbuf;          /* [n_threads][DSQ_CPU_MM_ROWS][k_max] converted weight rows */
    size_t wbuf_stride;
    float *scores;        /* [n_threads][n_rep][max_context] */
    size_t scores_stride;
    float *kv_tmp;        /* [n_threads][D] one dequantized K or V vector */
    int64_t *rows;        /* [n_threads][max_context] physical rows of a sequence */
    /* tensor parallelism (world > 1): this context is the ranks' holder
     * (pool, T, n_threads; no buffers of its own), each rank a cpu_ctx with
     * the buffers above sized by its config and `part` */
    int32_t world;
    struct cpu_ctx **ranks; /* [world] */
    float *part;            /* rank: [T][E] its partial sum of a row-parallel product */
} cpu_ctx;

/* ---- model ----------------------------------------------------------------- */

static dsq_status check_tensor(const dsq_tensor *t, const dsq_config *cfg, int per_layer,
                               int32_t role, int32_t layer)
{
    char name[160];
    if (!t->data)
        return dsq_fail(DSQ_ERR_MISSING_TENSOR, "cpu backend: tensor '%s' has no data",
                        dsq_arch_tensor_name(cfg->arch, per_layer, role, layer, name, sizeof name));
    if (t->dtype != DSQ_DT_BF16 && t->dtype != DSQ_DT_F16 && t->dtype != DSQ_DT_F32)
        return dsq_fail(DSQ_ERR_DTYPE, "cpu backend: tensor '%s' is %s; need BF16, F16 or F32",
                        dsq_arch_tensor_name(cfg->arch, per_layer, role, layer, name, sizeof name),
                        dsq_dtype_name(t->dtype));
    return DSQ_OK;
}

/* The descriptor of matrix `t`, checked against the product's dispatch (a
 * zero-token call: DSQ_ERR_UNSUPPORTED names a format without CPU code). */
static dsq_status product_weight(const dsq_weights *mw, int per_layer, int32_t role,
                                 int32_t layer, const dsq_tensor *t, dsq_weight *w)
{
    /* a quantized linear (lib/weights_quant.h) comes as its descriptor */
    const dsq_weight *qd = dsq_weights_qslot(mw, per_layer, role, layer);
    dsq_status st = DSQ_OK;
    if (qd)
        *w = *qd;
    else
        st = dsq_weight_from_tensor(t, w);
    if (st == DSQ_OK)
        st = dsq_cpu_linear(NULL, 0, NULL, 0, 0, w, NULL, 0, 0, 0, NULL);
    return st;
}

/* *lw_out [n_layers] and *head: every matrix the recipe multiplies by in
 * weights w, as a dsq_weight.  On failure *lw_out is NULL. */
static dsq_status build_lw(const dsq_config *cfg, const dsq_weights *w, dsq_weight (**lw_out)[DSQ_LW_COUNT],
                           dsq_weight *head)
{
    const dsq_arch *a = cfg->arch;
    dsq_weight (*lw)[DSQ_LW_COUNT] = calloc((size_t)cfg->n_layers, sizeof *lw);
    *lw_out = NULL;
    if (!lw)
        return dsq_fail(DSQ_ERR_OUT_OF_MEMORY, "no memory for the CPU weight descriptors");
    dsq_status st = product_weight(w, 0, DSQ_GW_LM_HEAD, 0, &w->g[DSQ_GW_LM_HEAD], head);
    for (int32_t l = 0; l < cfg->n_layers && st == DSQ_OK; l++)
        for (int32_t i = 0; i < a->n_ops && st == DSQ_OK; i++) {
            const dsq_op *op = &a->recipe[i];
            if (op->kind == DSQ_OP_NORM)
                continue; /* w[0] is a norm vector, not a matrix */
            for (int j = 0; j < 3 && st == DSQ_OK; j++)
                if (op->w[j] >= 0)
                    st = product_weight(w, 1, op->w[j], l, &w->layers[l].t[op->w[j]], &lw[l][op->w[j]]);
        }
    if (st != DSQ_OK)
        free(lw);
    else
        *lw_out = lw;
    return st;
}

static void free_cpu_model(cpu_model *cm)
{
    if (!cm)
        return;
    for (int32_t r = 0; cm->ranks && r < cm->world; r++) {
        free(cm->ranks[r].lw);
        dsq_tp_weights_free(&cm->ranks[r].tw);
    }
    free(cm->ranks);
    free(cm->lw);
    free(cm);
}

/* m->be: every matrix the recipe multiplies by, as a dsq_weight; with
 * tensor parallelism also each rank's slices and their descriptors. */
static dsq_status build_products(dsq_model *m, int32_t world)
{
    const dsq_config *cfg = &m->cfg;
    cpu_model *cm = calloc(1, sizeof *cm);
    if (!cm)
        return dsq_fail(DSQ_ERR_OUT_OF_MEMORY, "no memory for the CPU weight descriptors");
    m->device_bytes = 0;
    cm->world = world > 1 ? world : 1;
    dsq_status st = build_lw(cfg, &m->w, &cm->lw, &cm->head);
    if (st == DSQ_OK && cm->world > 1) {
        cm->ranks = calloc((size_t)cm->world, sizeof *cm->ranks);
        if (!cm->ranks)
            st = dsq_fail(DSQ_ERR_OUT_OF_MEMORY, "no memory for %d tensor-parallel ranks", cm->world);
        for (int32_t r = 0; r < cm->world && st == DSQ_OK; r++) {
            dsq_tp_slice sl;
            cpu_rank *rk = &cm->ranks[r];
            if ((st = dsq_tp_plan(cfg, r, cm->world, &sl)) == DSQ_OK &&
                (st = dsq_tp_weights_make(cfg, &m->w, &sl, &rk->tw)) == DSQ_OK)
                st = build_lw(&rk->tw.cfg, &rk->tw.w, &rk->lw, &rk->head);
        }
    }
    if (st != DSQ_OK) {
        free_cpu_model(cm);
        return st;
    }
    m->be = cm;
    return st;
}

/* The CPU computes straight from the views in m->w (the file mapping), so
 * there is nothing to copy; only check what the forward pass relies on:
 * every tensor the description requires has data (optional ones may be
 * absent: zeros). */
static dsq_status cpu_model_load(dsq_model *m, const dsq_model_params *p)
{
    const dsq_config *cfg = &m->cfg;
    const dsq_arch *a = cfg->arch;
    if (!a)
        return dsq_fail(DSQ_ERR_INTERNAL, "cpu backend: the config names no architecture");
    if (cfg->head_dim <= 0 || cfg->head_dim % 2 != 0)
        return dsq_fail(DSQ_ERR_UNSUPPORTED, "cpu backend: head_dim %d must be even", cfg->head_dim);
    if (cfg->n_kv_heads <= 0 || cfg->n_heads % cfg->n_kv_heads != 0)
        return dsq_fail(DSQ_ERR_UNSUPPORTED, "cpu backend: %d query heads are not a multiple of %d KV heads",
                        cfg->n_heads, cfg->n_kv_heads);
    if (!m->w.layers)
        return dsq_fail(DSQ_ERR_MISSING_TENSOR, "cpu backend: the model has no layer weights");
    const int32_t world = p && p->tp_world > 1 ? p->tp_world : 1;
    if (world > 1 && p->tp_id)
        return dsq_fail(DSQ_ERR_UNSUPPORTED,
                        "cpu backend: tensor parallelism on the CPU runs all %d ranks in this process (a "
                        "verification mode); one process per rank (tp_id) needs the CUDA backend", world);
    dsq_status st;
    for (int32_t i = 0; i < a->n_tensors; i++) {
        const dsq_tensor_spec *sp = &a->tensors[i];
        if (sp->per_layer || (sp->flags & DSQ_TF_OPTIONAL) ||
            dsq_weights_qslot(&m->w, 0, sp->role, 0))
            continue;
        if ((st = check_tensor(&m->w.g[sp->role], cfg, 0, sp->role, 0)) != DSQ_OK)
            return st;
    }
    for (int l = 0; l < cfg->n_layers; l++) {
        for (int32_t i = 0; i < a->n_tensors; i++) {
            const dsq_tensor_spec *sp = &a->tensors[i];
            const dsq_tensor *t = &m->w.layers[l].t[sp->role];
            if (!sp->per_layer || ((sp->flags & DSQ_TF_OPTIONAL) && !t->data) ||
                dsq_weights_qslot(&m->w, 1, sp->role, l))
                continue;
            if ((st = check_tensor(t, cfg, 1, sp->role, l)) != DSQ_OK)
                return st;
        }
        if ((st = dsq_load_progress(m, l + 1, cfg->n_layers)) != DSQ_OK)
            return st;
    }
    return build_products(m, world);
}

static void cpu_model_free(dsq_model *m)
{
    free_cpu_model(m->be);
    m->be = NULL;
}

/* ---- context ----------------------------------------------------------------- */

static void cpu_ctx_release(cpu_ctx *cc)
{
    if (!cc)
        return;
    for (int32_t r = 0; cc->ranks && r < cc->world; r++) {
        if (cc->ranks[r])
            cc->ranks[r]->pool = NULL; /* the holder's */
        cpu_ctx_release(cc->ranks[r]);
    }
    free(cc->ranks);
    free(cc->part);
    dsq_cpu_pool_free(cc->pool);
    free(cc->k);
    free(cc->v);
    free(cc->ks);
    free(cc->vs);
    free(cc->x);
    free(cc->xn);
    free(cc->q);
    free(cc->kx);
    free(cc->vx);
    free(cc->att);
    free(cc->g);
    free(cc->u);
    free(cc->rope);
    free(cc->inv_freq);
    free(cc->wbuf);
    free(cc->scores);
    free(cc->kv_tmp);
    free(cc->rows);
    free(cc);
}

/* a*b*c... in size_t, 0 on overflow */
static size_t mul_sz(size_t a, size_t b)
{
    size_t r;
    return __builtin_mul_overflow(a, b, &r) ? 0 : r;
}

static void *alloc_floats(size_t n, int64_t *total)
{
    size_t bytes = mul_sz(n, sizeof(float));
    if (!bytes)
        return NULL;
    *total += (int64_t)bytes;
    return malloc(bytes);
}

/* The KV cache and scratch of one context (or of one rank: cfg has the
 * rank's sizes, tp adds `part`) into cc; bytes added to *kv_total and
 * *scratch_total.  On failure the caller releases cc. */
static dsq_status ctx_buffers(const dsq_ctx *c, const dsq_config *cfg, int tp, cpu_ctx *cc, int64_t *kv_total,
                              int64_t *scratch_total)
{
    const int32_t E = cfg->n_embd, H = cfg->n_heads, KV = cfg->n_kv_heads, D = cfg->head_dim,
                  F = cfg->n_ff, NL = cfg->n_layers;
    const int32_t n_rep = H / KV;
    cc->n_threads = c->p.n_threads > 0 ? c->p.n_threads : 1;
    cc->T = c->p.max_batch_tokens;
    cc->kv_esz = dsq_cpu_kv_elem_size(c->p.kv_dtype);
    cc->kv_rows = c->p.kv_layout == DSQ_KV_PAGED
                      ? (int64_t)c->pages.n_blocks * c->pages.block_size
                      : (int64_t)c->p.max_seqs * c->p.max_context;
    const int is_int8 = c->p.kv_dtype == DSQ_KV_INT8;

    /* KV cache */
    size_t vecs = mul_sz((size_t)cc->kv_rows, (size_t)KV); /* (row, head) vectors per layer */
    cc->layer_kv_bytes = mul_sz(vecs, (size_t)D * cc->kv_esz);
    size_t kv_all = mul_sz(cc->layer_kv_bytes, (size_t)NL);
    int64_t kv_bytes = 0, scratch = 0;
    if (!vecs || !kv_all)
        return dsq_fail(DSQ_ERR_OUT_OF_MEMORY, "KV cache of %lld rows does not fit in memory",
                        (long long)cc->kv_rows);
    /* calloc: large blocks come zeroed from mmap and are only touched as
     * sequences grow */
    cc->k = calloc(kv_all, 1);
    cc->v = calloc(kv_all, 1);
    kv_bytes += 2 * (int64_t)kv_all;
    if (is_int8) {
        size_t ns = mul_sz(vecs, (size_t)NL);
        cc->ks = ns ? calloc(ns, sizeof(float)) : NULL;
        cc->vs = ns ? calloc(ns, sizeof(float)) : NULL;
        kv_bytes += 2 * (int64_t)ns * (int64_t)sizeof(float);
        if (!cc->ks || !cc->vs)
            return dsq_fail(DSQ_ERR_OUT_OF_MEMORY, "no memory for INT8 KV scales");
    }
    if (!cc->k || !cc->v)
        return dsq_fail(DSQ_ERR_OUT_OF_MEMORY, "no memory for a KV cache of %lld bytes",
                        (long long)kv_bytes);

    /* activations and per-thread scratch, all sized for T tokens */
    size_t T = (size_t)cc->T, nt = (size_t)cc->n_threads;
    size_t k_max = (size_t)E;
    if ((size_t)F > k_max)
        k_max = (size_t)F;
    if ((size_t)H * D > k_max)
        k_max = (size_t)H * D;
    cc->wbuf_stride = DSQ_CPU_MM_ROWS * k_max;
    if (dsq_quant_scratch_floats((int64_t)k_max) > cc->wbuf_stride) /* quantized products */
        cc->wbuf_stride = dsq_quant_scratch_floats((int64_t)k_max);
    cc->scores_stride = (size_t)n_rep * (size_t)c->p.max_context;
    cc->x = alloc_floats(T * E, &scratch);
    cc->xn = alloc_floats(T * E, &scratch);
    cc->q = alloc_floats(T * H * D, &scratch);
    cc->kx = alloc_floats(T * KV * D, &scratch);
    cc->vx = alloc_floats(T * KV * D, &scratch);
    cc->att = alloc_floats(T * H * D, &scratch);
    cc->g = alloc_floats(T * F, &scratch);
    cc->u = alloc_floats(T * F, &scratch);
    cc->rope = alloc_floats(T * D, &scratch);
    cc->inv_freq = alloc_floats((size_t)D / 2, &scratch);
    cc->wbuf = alloc_floats(nt * cc->wbuf_stride, &scratch);
    cc->scores = alloc_floats(nt * cc->scores_stride, &scratch);
    cc->kv_tmp = alloc_floats(nt * D, &scratch);
    if (tp)
        cc->part = alloc_floats(T * E, &scratch);
    size_t rows_bytes = mul_sz(nt * (size_t)c->p.max_context, sizeof(int64_t));
    cc->rows = rows_bytes ? malloc(rows_bytes) : NULL;
    scratch += (int64_t)rows_bytes;
    if (!cc->x || !cc->xn || !cc->q || !cc->kx || !cc->vx || !cc->att || !cc->g || !cc->u ||
        !cc->rope || !cc->inv_freq || !cc->wbuf || !cc->scores || !cc->kv_tmp || !cc->rows || (tp && !cc->part))
        return dsq_fail(DSQ_ERR_OUT_OF_MEMORY,
                        "no memory for CPU scratch (%lld bytes for %d batch tokens, %d threads)",
                        (long long)scratch, cc->T, cc->n_threads);
    dsq_cpu_rope_inv_freq(cc->inv_freq, D, cfg->rope_theta);
    *kv_total += kv_bytes;
    *scratch_total += scratch;
    return DSQ_OK;
}

static dsq_status cpu_ctx_init(dsq_ctx *c)
{
    const dsq_config *cfg = &c->model->cfg;
    const cpu_model *cm = c->model->be;
    cpu_ctx *cc = calloc(1, sizeof *cc);
    if (!cc)
        return dsq_fail(DSQ_ERR_OUT_OF_MEMORY, "no memory for the CPU context");
    int64_t kv_bytes = 0, scratch = 0;
    dsq_status st = DSQ_OK;
    if (cm && cm->world > 1) {
        /* the holder: pool and batch limits; the ranks hold the buffers */
        cc->world = cm->world;
        cc->n_threads = c->p.n_threads > 0 ? c->p.n_threads : 1;
        cc->T = c->p.max_batch_tokens;
        cc->ranks = calloc((size_t)cc->world, sizeof *cc->ranks);
        if (!cc->ranks)
            st = dsq_fail(DSQ_ERR_OUT_OF_MEMORY, "no memory for the CPU context's ranks");
        c->kv_bytes_per_token = 0;
        for (int32_t r = 0; r < cc->world && st == DSQ_OK; r++) {
            const dsq_config *rc = &cm->ranks[r].tw.cfg;
            if (!(cc->ranks[r] = calloc(1, sizeof *cc->ranks[r])))
                st = dsq_fail(DSQ_ERR_OUT_OF_MEMORY, "no memory for the CPU context");
            else
                st = ctx_buffers(c, rc, 1, cc->ranks[r], &kv_bytes, &scratch);
            c->kv_bytes_per_token += dsq_kv_bytes_per_token(rc, c->p.kv_dtype);
        }
    } else {
        c->kv_bytes_per_token = dsq_kv_bytes_per_token(cfg, c->p.kv_dtype);
        st = ctx_buffers(c, cfg, 0, cc, &kv_bytes, &scratch);
    }
    if (st == DSQ_OK)
        st = dsq_cpu_pool_new(cc->n_threads, &cc->pool);
    for (int32_t r = 0; st == DSQ_OK && r < cc->world; r++)
        cc->ranks[r]->pool = cc->pool; /* one pool runs every rank's ops */
    if (st != DSQ_OK) {
        cpu_ctx_release(cc);
        return st;
    }
    c->kv_bytes = kv_bytes;
    c->scratch_bytes = scratch;
    c->be = cc;
    return DSQ_OK;
}

static void cpu_ctx_free(dsq_ctx *c)
{
    cpu_ctx_release(c->be);
    c->be = NULL;
}

/* ---- forward ----------------------------------------------------------------- */

typedef struct fwd_job {
    const dsq_ctx *c;
    cpu_ctx *cc;
    const dsq_config *cfg;
    const dsq_layer_weights *L;
    const dsq_weight *LW;  /* [DSQ_LW_COUNT] this layer's products (cpu_model) */
    const dsq_op *op;      /* the recipe step being run */
    const dsq_batch *b;
    int32_t layer;
    int64_t chunk;   /* output rows per task in a matmul region */
    const dsq_weight *w_head; /* [head_rows, E] */
    int64_t head_rows;        /* logit columns this job computes            */
    int64_t logits_ld;        /* floats per row of `logits`                 */
    float *logits;
    int32_t rank;    /* tensor parallelism: this job's rank                  */
    int partial;     /* 1: LINEAR_RESID writes this rank's partial sum to
                        cc->part (bias on rank 0 only) instead of adding to x */
} fwd_job;

/* Rows per task: about 8 tasks per thread (so a thread slowed by other load
 * does not hold up the region), a multiple of the matmul row block. */
static int64_t pick_chunk(int64_t n_rows, int n_threads)
{
    int64_t ch = (n_rows + (int64_t)n_threads * 8 - 1) / ((int64_t)n_threads * 8);
    if (ch < 16)
        ch = 16;
    return (ch + DSQ_CPU_MM_ROWS - 1) / DSQ_CPU_MM_ROWS * DSQ_CPU_MM_ROWS;
}

static int64_t n_chunks(int64_t n_rows, int64_t chunk) { return (n_rows + chunk - 1) / chunk; }

static float *thread_wbuf(const cpu_ctx *cc, int thread) { return cc->wbuf + (size_t)thread * cc->wbuf_stride; }

/* A bias view, or NULL for none (no slot, or an optional bias the
 * checkpoint does not have: zeros). */
static const dsq_tensor *bias_of(const dsq_layer_weights *L, int8_t role)
{
    return role >= 0 && L->t[role].data ? &L->t[role] : NULL;
}

/* One head of q, k or v for all tokens: project, add bias, rotate, and for
 * k/v store into the cache rows of the tokens' (sequence, position). */
static void task_qkv(void *arg, int64_t task, int thread)
{
    const fwd_job *J = arg;
    const dsq_config *cfg = J->cfg;
    cpu_ctx *cc = J->cc;
    const dsq_batch *b = J->b;
    const int32_t E = cfg->n_embd, H = cfg->n_heads, KV = cfg->n_kv_heads, D = cfg->head_dim;
    const int32_t T = b->n_tokens;
    const dsq_layer_weights *L = J->L;
    int kind, head;
    if (task < H) {
        kind = 0;
        head = (int)task;
    } else if (task < H + KV) {
        kind = 1;
        head = (int)(task - H);
    } else {
        kind = 2;
        head = (int)(task - H - KV);
    }
    const dsq_weight *W = &J->LW[J->op->w[kind]];
    const dsq_tensor *B = bias_of(L, J->op->b[kind]);
    float *Y = kind == 0 ? cc->q : kind == 1 ? cc->kx : cc->vx;
    int64_t ldy = kind == 0 ? (int64_t)H * D : (int64_t)KV * D;
    int64_t o0 = (int64_t)head * D;
    /* formats were checked at load (build_products): cannot fail here */
    (void)dsq_cpu_linear(Y, ldy, cc->xn, E, T, W, B, o0, o0 + D, 0, thread_wbuf(cc, thread));
    if (kind != 2)
        for (int32_t t = 0; t < T; t++)
            dsq_cpu_rope_apply(Y + (size_t)t * ldy + o0, cc->rope + (size_t)t * D, D);
    if (kind == 0)
        return;
    const int32_t kvd = J->c->p.kv_dtype;
    char *base = (kind == 1 ? cc->k : cc->v) + (size_t)J->layer * cc->layer_kv_bytes;
    float *sbase = kind == 1 ? cc->ks : cc->vs;
    for (int32_t t = 0; t < T; t++) {
        int64_t row = dsq_kv_row(J->c, b->seq_ids[b->tok_seq[t]], b->pos[t]);
        size_t slot = (size_t)row * KV + head;
        float *scale = sbase ? sbase + ((size_t)J->layer * cc->kv_rows * KV + slot) : NULL;
        dsq_cpu_kv_store(base + slot * D * cc->kv_esz, scale, kvd, Y + (size_t)t * ldy + o0, D);
    }
}

/* Attention of one token's query heads that share KV head g. */
static void task_attn(void *arg, int64_t task, int thread)
{
    const fwd_job *J = arg;
    const dsq_config *cfg = J->cfg;
    cpu_ctx *cc = J->cc;
    const dsq_batch *b = J->b;
    const int32_t H = cfg->n_heads, KV = cfg->n_kv_heads, D = cfg->head_dim;
    const int32_t n_rep = H / KV;
    int32_t t = (int32_t)(task / KV), g = (int32_t)(task % KV);
    int32_t seq = b->seq_ids[b->tok_seq[t]];
    int32_t n_ctx = b->pos[t] + 1;
    int64_t *rows = cc->rows + (size_t)thread * J->c->p.max_context;
    for (int32_t p = 0; p < n_ctx; p++)
        rows[p] = dsq_kv_row(J->c, seq, p);
    size_t lo = (size_t)J->layer * cc->kv_rows * KV;
    dsq_cpu_kv_view kv = {
        .k = cc->k + (size_t)J->layer * cc->layer_kv_bytes,
        .v = cc->v + (size_t)J->layer * cc->layer_kv_bytes,
        .ks = cc->ks ? cc->ks + lo : NULL,
        .vs = cc->vs ? cc->vs + lo : NULL,
        .kv_dtype = J->c->p.kv_dtype,
        .n_kv = KV,
        .head_dim = D,
    };
    size_t off = (size_t)t * H * D + (size_t)g * n_rep * D;
    dsq_cpu_attend(&kv, g, rows, n_ctx, cc->q + off, n_rep, (float)(1.0 / sqrt((double)D)), cc->att + off,
                   cc->scores + (size_t)thread * cc->scores_stride, cc->kv_tmp + (size_t)thread * D);
}

/* x += in W^T (+ b) over a chunk of output features; in = att or act. */
static void task_linear_resid(void *arg, int64_t task, int thread)
{
    const fwd_job *J = arg;
    const dsq_config *cfg = J->cfg;
    const int from_act = J->op->in == DSQ_IN_ACT;
    const float *in = from_act ? J->cc->g : J->cc->att;
    const int64_t k = from_act ? cfg->n_ff : (int64_t)cfg->n_heads * cfg->head_dim;
    int64_t o0 = task * J->chunk, o1 = o0 + J->chunk;
    if (o1 > cfg->n_embd)
        o1 = cfg->n_embd;
    /* tensor parallelism: the partial sum over this rank's inputs; a bias
     * is added once, by rank 0 */
    float *Y = J->partial ? J->cc->part : J->cc->x;
    const dsq_tensor *B = J->partial && J->rank != 0 ? NULL : bias_of(J->L, J->op->b[0]);
    (void)dsq_cpu_linear(Y, cfg->n_embd, in, k, J->b->n_tokens, &J->LW[J->op->w[0]], B, o0, o1, !J->partial,
                         thread_wbuf(J->cc, thread));
}

/* g = silu(xn Wg^T) * (xn Wu^T) over a chunk of MLP features. */
static void task_gate_up(void *arg, int64_t task, int thread)
{
    const fwd_job *J = arg;
    const dsq_config *cfg = J->cfg;
    cpu_ctx *cc = J->cc;
    const int32_t F = cfg->n_ff, T = J->b->n_tokens;
    int64_t o0 = task * J->chunk, o1 = o0 + J->chunk;
    if (o1 > F)
        o1 = F;
    float *wb = thread_wbuf(cc, thread);
    (void)dsq_cpu_linear(cc->g, F, cc->xn, cfg->n_embd, T, &J->LW[J->op->w[0]], NULL, o0, o1, 0, wb);
    (void)dsq_cpu_linear(cc->u, F, cc->xn, cfg->n_embd, T, &J->LW[J->op->w[1]], NULL, o0, o1, 0, wb);
    for (int32_t t = 0; t < T; t++)
        dsq_cpu_silu_mul(cc->g + (size_t)t * F + o0, cc->u + (size_t)t * F + o0, o1 - o0);
}

/* logits[j] = xn[j] W_head^T over a chunk of the vocabulary (of this
 * rank's part of it, written at its columns of the gathered row). */
static void task_head(void *arg, int64_t task, int thread)
{
    const fwd_job *J = arg;
    const dsq_config *cfg = J->cfg;
    int64_t o0 = task * J->chunk, o1 = o0 + J->chunk;
    if (o1 > J->head_rows)
        o1 = J->head_rows;
    (void)dsq_cpu_linear(J->logits, J->logits_ld, J->cc->xn, cfg->n_embd, J->b->n_logits, J->w_head,
                         NULL, o0, o1, 0, thread_wbuf(J->cc, thread));
}

/* Reject a batch that would make the forward pass read or write out of
 * bounds; api.c builds correct ones, so this only guards against bugs. */
static dsq_status check_batch(const dsq_ctx *c, const dsq_batch *b, const float *logits)
{
    const cpu_ctx *cc = c->be;
    if (b->n_tokens < 1 || b->n_tokens > cc->T)
        return dsq_fail(DSQ_ERR_BATCH, "cpu forward: %d tokens; this context takes 1..%d",
                        b->n_tokens, cc->T);
    if (b->n_seqs < 1 || b->n_seqs > b->n_tokens)
        return dsq_fail(DSQ_ERR_INTERNAL, "cpu forward: bad sequence count %d", b->n_seqs);
    if (b->n_logits < 0 || b->n_logits > b->n_tokens || (b->n_logits > 0 && !logits))
        return dsq_fail(DSQ_ERR_INTERNAL, "cpu forward: bad logits request (%d rows)", b->n_logits);
    const int32_t nv = c->model->cfg.n_vocab;
    for (int32_t t = 0; t < b->n_tokens; t++) {
        int32_t s = b->tok_seq[t];
        if (b->tokens[t] < 0 || b->tokens[t] >= nv)
            return dsq_fail(DSQ_ERR_TOKEN, "cpu forward: token %d out of range", b->tokens[t]);
        if (s < 0 || s >= b->n_seqs || b->seq_ids[s] < 0 || b->seq_ids[s] >= c->p.max_seqs)
            return dsq_fail(DSQ_ERR_INTERNAL, "cpu forward: token %d has a bad sequence", t);
        if (b->pos[t] < 0 || b->pos[t] >= c->p.max_context)
            return dsq_fail(DSQ_ERR_CONTEXT_FULL, "cpu forward: position %d outside max_context %d",
                            b->pos[t], c->p.max_context);
        if (c->p.kv_layout == DSQ_KV_PAGED) {
            /* every row the token attends to must have a block */
            int32_t need = b->pos[t] / c->pages.block_size + 1;
            if (need > c->pages.n_seq_blocks[b->seq_ids[s]])
                return dsq_fail(DSQ_ERR_INTERNAL, "cpu forward: sequence %d has no KV block for position %d",
                                b->seq_ids[s], b->pos[t]);
        }
    }
    for (int32_t j = 0; j < b->n_logits; j++)
        if (b->logit_rows[j] < 0 || b->logit_rows[j] >= b->n_tokens)
            return dsq_fail(DSQ_ERR_INTERNAL, "cpu forward: logit row %d out of range", b->logit_rows[j]);
    return DSQ_OK;
}

/* One recipe op of layer J->layer over all tokens of the batch. */
static void run_op(fwd_job *J, const dsq_op *op)
{
    cpu_ctx *cc = J->cc;
    const dsq_config *cfg = J->cfg;
    const int32_t E = cfg->n_embd, T = J->b->n_tokens;
    const int nt = cc->n_threads;
    J->op = op;
    switch (op->kind) {
    case DSQ_OP_NORM:
        for (int32_t t = 0; t < T; t++)
            dsq_cpu_rmsnorm(cc->xn + (size_t)t * E, cc->x + (size_t)t * E, &J->L->t[op->w[0]], E, cfg->rms_eps);
        break;
    case DSQ_OP_QKV_ROPE:
        dsq_cpu_pool_run(cc->pool, cfg->n_heads + 2 * cfg->n_kv_heads, task_qkv, J);
        break;
    case DSQ_OP_ATTEND:
        dsq_cpu_pool_run(cc->pool, (int64_t)T * cfg->n_kv_heads, task_attn, J);
        break;
    case DSQ_OP_LINEAR_RESID:
        J->chunk = pick_chunk(E, nt);
        dsq_cpu_pool_run(cc->pool, n_chunks(E, J->chunk), task_linear_resid, J);
        break;
    case DSQ_OP_GATED_FFN:
        J->chunk = pick_chunk(cfg->n_ff, nt);
        dsq_cpu_pool_run(cc->pool, n_chunks(cfg->n_ff, J->chunk), task_gate_up, J);
        break;
    }
}

/* The all-reduce of the CPU's tensor parallelism: the ranks' partial sums
 * of a row-parallel product, summed in rank order, added to every rank's
 * residual stream (which stay identical). */
static void all_reduce_resid(cpu_ctx *top, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        float sum = 0.0f;
        for (int32_t r = 0; r < top->world; r++)
            sum += top->ranks[r]->part[i];
        for (int32_t r = 0; r < top->world; r++)
            top->ranks[r]->x[i] += sum;
    }
}

/* The forward pass of world ranks in this process, op by op in lock step. */
static dsq_status cpu_forward_tp(dsq_ctx *c, const dsq_batch *b, float *logits)
{
    cpu_ctx *top = c->be;
    const dsq_model *m = c->model;
    const cpu_model *cm = m->be;
    const int32_t E = m->cfg.n_embd, D = m->cfg.head_dim, T = b->n_tokens, W = top->world;
    const dsq_arch *arch = m->cfg.arch;
    fwd_job J = { .c = c, .b = b, .partial = 1 };

    for (int32_t r = 0; r < W; r++) {
        cpu_ctx *rc = top->ranks[r];
        const dsq_tensor *emb = &cm->ranks[r].tw.w.g[DSQ_GW_TOK_EMBD]; /* replicated */
        for (int32_t t = 0; t < T; t++) {
            const char *row = (const char *)emb->data + (size_t)b->tokens[t] * E * dsq_dtype_size(emb->dtype);
            dsq_cpu_row_to_f32(rc->x + (size_t)t * E, row, emb->dtype, E);
            dsq_cpu_rope_table(rc->rope + (size_t)t * D, rc->inv_freq, D / 2, b->pos[t]);
        }
    }
    for (int32_t l = 0; l < m->cfg.n_layers; l++) {
        J.layer = l;
        for (int32_t i = 0; i < arch->n_ops; i++) {
            for (int32_t r = 0; r < W; r++) {
                J.rank = r;
                J.cc = top->ranks[r];
                J.cfg = &cm->ranks[r].tw.cfg;
                J.L = &cm->ranks[r].tw.w.layers[l];
                J.LW = cm->ranks[r].lw[l];
                run_op(&J, &arch->recipe[i]);
            }
            if (arch->recipe[i].kind == DSQ_OP_LINEAR_RESID)
                all_reduce_resid(top, (int64_t)T * E);
        }
    }
    if (b->n_logits > 0)
        for (int32_t r = 0; r < W; r++) {
            cpu_ctx *rc = top->ranks[r];
            const cpu_rank *rk = &cm->ranks[r];
            for (int32_t j = 0; j < b->n_logits; j++)
                dsq_cpu_rmsnorm(rc->xn + (size_t)j * E, rc->x + (size_t)b->logit_rows[j] * E,
                                &rk->tw.w.g[DSQ_GW_OUT_NORM], E, m->cfg.rms_eps);
            J.rank = r;
            J.cc = rc;
            J.cfg = &rk->tw.cfg;
            J.w_head = &rk->head;
            J.head_rows = rk->tw.s.n_vocab;
            J.logits = logits + rk->tw.s.vocab0; /* its columns of the gathered rows */
            J.logits_ld = m->cfg.n_vocab;
            J.chunk = pick_chunk(J.head_rows, top->n_threads);
            dsq_cpu_pool_run(top->pool, n_chunks(J.head_rows, J.chunk), task_head, &J);
        }
    return DSQ_OK;
}

static dsq_status cpu_forward(dsq_ctx *c, const dsq_batch *b, float *logits)
{
    if (!c || !c->be || !b)
        return dsq_fail(DSQ_ERR_INTERNAL, "cpu forward: no context or batch");
    dsq_status st = check_batch(c, b, logits);
    if (st != DSQ_OK)
        return st;
    if (((cpu_ctx *)c->be)->world > 1)
        return cpu_forward_tp(c, b, logits);
    cpu_ctx *cc = c->be;
    const dsq_model *m = c->model;
    const dsq_config *cfg = &m->cfg;
    const int32_t E = cfg->n_embd, D = cfg->head_dim, T = b->n_tokens;
    const int nt = cc->n_threads;
    const cpu_model *cm = m->be;

    for (int32_t t = 0; t < T; t++) {
        const dsq_tensor *emb = &m->w.g[DSQ_GW_TOK_EMBD];
        const char *row = (const char *)emb->data + (size_t)b->tokens[t] * E * dsq_dtype_size(emb->dtype);
        dsq_cpu_row_to_f32(cc->x + (size_t)t * E, row, emb->dtype, E);
        dsq_cpu_rope_table(cc->rope + (size_t)t * D, cc->inv_freq, D / 2, b->pos[t]);
    }

    fwd_job J = { .c = c, .cc = cc, .cfg = cfg, .b = b, .logits = logits };
    const dsq_arch *arch = cfg->arch;
    for (int32_t l = 0; l < cfg->n_layers; l++) {
        J.layer = l;
        J.L = &m->w.layers[l];
        J.LW = cm->lw[l];
        for (int32_t i = 0; i < arch->n_ops; i++)
            run_op(&J, &arch->recipe[i]);
    }
    if (b->n_logits > 0) {
        for (int32_t j = 0; j < b->n_logits; j++)
            dsq_cpu_rmsnorm(cc->xn + (size_t)j * E, cc->x + (size_t)b->logit_rows[j] * E, &m->w.g[DSQ_GW_OUT_NORM],
                            E, cfg->rms_eps);
        J.w_head = &cm->head;
        J.head_rows = J.logits_ld = cfg->n_vocab;
        J.chunk = pick_chunk(cfg->n_vocab, nt);
        dsq_cpu_pool_run(cc->pool, n_chunks(cfg->n_vocab, J.chunk), task_head, &J);
    }
    return DSQ_OK;
}

/* Copy whole KV rows of every layer (and their INT8 scales): the copy of
 * a shared paged block before a write, a static-cache fork. */
static dsq_status copy_kv_rows(cpu_ctx *cc, const dsq_config *cfg, int32_t n, const dsq_kv_copy *copies)
{
    const size_t KV = (size_t)cfg->n_kv_heads, row_bytes = KV * (size_t)cfg->head_dim * cc->kv_esz;
    for (int32_t i = 0; i < n; i++) {
        const dsq_kv_copy *cp = &copies[i];
        if (cp->n_rows < 0 || cp->src_row < 0 || cp->dst_row < 0 || cp->src_row + cp->n_rows > cc->kv_rows ||
            cp->dst_row + cp->n_rows > cc->kv_rows)
            return dsq_fail(DSQ_ERR_INTERNAL, "cpu KV copy: rows %lld..+%lld -> %lld outside the cache",
                            (long long)cp->src_row, (long long)cp->n_rows, (long long)cp->dst_row);
        for (int32_t l = 0; l < cfg->n_layers; l++) {
            size_t lo = (size_t)l * cc->layer_kv_bytes;
            memcpy(cc->k + lo + (size_t)cp->dst_row * row_bytes, cc->k + lo + (size_t)cp->src_row * row_bytes,
                   (size_t)cp->n_rows * row_bytes);
            memcpy(cc->v + lo + (size_t)cp->dst_row * row_bytes, cc->v + lo + (size_t)cp->src_row * row_bytes,
                   (size_t)cp->n_rows * row_bytes);
            if (cc->ks) {
                size_t so = (size_t)l * (size_t)cc->kv_rows * KV;
                memcpy(cc->ks + so + (size_t)cp->dst_row * KV, cc->ks + so + (size_t)cp->src_row * KV,
                       (size_t)cp->n_rows * KV * sizeof(float));
                memcpy(cc->vs + so + (size_t)cp->dst_row * KV, cc->vs + so + (size_t)cp->src_row * KV,
                       (size_t)cp->n_rows * KV * sizeof(float));
            }
        }
    }
    return DSQ_OK;
}

static dsq_status cpu_copy_kv_rows(dsq_ctx *c, int32_t n, const dsq_kv_copy *copies)
{
    cpu_ctx *cc = c->be;
    const cpu_model *cm = c->model->be;
    if (cc->world <= 1)
        return copy_kv_rows(cc, &c->model->cfg, n, copies);
    dsq_status st = DSQ_OK; /* every rank its KV heads */
    for (int32_t r = 0; r < cc->world && st == DSQ_OK; r++)
        st = copy_kv_rows(cc->ranks[r], &cm->ranks[r].tw.cfg, n, copies);
    return st;
}

const dsq_backend_ops dsq_cpu_backend = {
    .name = "cpu",
    .kind = DSQ_BACKEND_CPU,
    .model_load = cpu_model_load,
    .model_free = cpu_model_free,
    .ctx_init = cpu_ctx_init,
    .ctx_free = cpu_ctx_free,
    .forward = cpu_forward,
    .seq_removed = NULL,
    .copy_kv_rows = cpu_copy_kv_rows,
    .step = NULL,      /* dsq_step samples on the host (lib/step.c) */
    .hist_sync = NULL, /* no device copy of the token history */
};
