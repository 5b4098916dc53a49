/*
 * backend_tp.cu - tensor parallelism on the CUDA backend (Megatron style;
 * the split is lib/tp_plan.h, the slices lib/tp_weights.h).
 *
 * Every rank is an ordinary single-GPU model and context of this backend,
 * built from the rank's sizes and slices: a "shadow" dsq_model (config with
 * the rank's heads / KV heads / FFN part, weights = its slices, head = its
 * vocabulary part) and a shadow dsq_ctx (a copy of the application's context
 * refreshed before each pass, so block tables and limits are the caller's).
 * The application's dsq_model gets a copy of the first local rank's
 * cu_model with `tp` set; its dsq_ctx's backend state is the first local
 * rank's cu_ctx (its logits, sampling ring and staging buffers serve the
 * caller unchanged).
 *
 * Setups (dsq_model_params):
 *   tp_devices: one process drives tp_world local GPUs; rank r on
 *               tp_devices[r]; communicators from dsq_comm_init_local.
 *   tp_id:      one process per rank (tp_rank, on `device`); every rank
 *               calls the same API with the same inputs; dsq_comm_init_rank.
 *
 * A pass: each local rank packs and uploads its own copy of the batch
 * metadata, then the pass runs in segments (cu_enqueue_segment): segment k
 * of every local rank is enqueued on its own stream, then the ranks'
 * partial sums (cc->part, [T][E] fp32) are all-reduced in one NCCL group
 * (one thread, several communicators: a group is required), then segment
 * k+1 starts with the residual add.  The last segment computes each rank's
 * vocabulary part of the first logit chunk; an all-gather (padded to the
 * widest part) and one 2-D copy per rank assemble [rows][V] in every rank's
 * cc->logits, so every rank (and every process) returns the same logits and
 * samples the same token.  Each pass ends with dsq_comm_sync_stream on every
 * local rank: a lost peer is DSQ_ERR_DEVICE after tp_timeout_s (the
 * communicator is aborted), never a hang.
 *
 * Decode graphs are off under tensor parallelism (the segments are enqueued
 * eagerly; capturing NCCL collectives is left for later).
 */
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "nccl_comm.h"
#include "tp_weights.h"

typedef struct cu_tp_rank {
    dsq_tp_slice s;   /* this rank's slice                                  */
    dsq_model sm;     /* shadow model: the rank's config and cu_model      */
    dsq_comm *comm;
    int device;
} cu_tp_rank;

struct cu_tp_model {
    int32_t world, n_local, rank_first; /* local ranks rank_first..+n_local */
    int32_t vmax;                       /* widest vocabulary part          */
    int32_t *vocab0, *n_vocab;          /* [world] every rank's part        */
    cu_tp_rank *r;                      /* [n_local]                        */
    dsq_comm **comms;                   /* [n_local]                        */
};

struct cu_tp_ctx {
    dsq_ctx *sc;       /* [n_local] shadow contexts                          */
    float **gather;    /* [n_local] device [world][logit_chunk * vmax]       */
};

/* ---- model -------------------------------------------------------------------- */

void cu_tp_model_free(dsq_model *m)
{
    cu_model *top = (cu_model *)m->be;
    if (!top)
        return;
    cu_tp_model *tp = top->tp;
    for (int32_t i = 0; tp && tp->r && i < tp->n_local; i++) {
        cu_tp_rank *rk = &tp->r[i];
        if (rk->sm.be)
            cu_model_free(&rk->sm); /* the rank's own cu_model: tp NULL */
    }
    for (int32_t i = 0; tp && tp->comms && i < tp->n_local; i++)
        dsq_comm_free(tp->comms[i]);
    if (tp) {
        free(tp->comms);
        free(tp->r);
        free(tp->vocab0);
        free(tp->n_vocab);
        free(tp);
    }
    free(top); /* a copy: the device memory was the first rank's */
    m->be = NULL;
    m->device_bytes = 0;
}

/* Rank i's slices uploaded to its device as an ordinary model. */
static dsq_status load_rank(dsq_model *m, const dsq_model_params *p, cu_tp_rank *rk)
{
    dsq_tp_weights tw;
    DSQ_TRY(dsq_tp_weights_make(&m->cfg, &m->w, &rk->s, &tw));
    rk->sm = *m;
    rk->sm.cfg = tw.cfg;
    rk->sm.w = tw.w;
    rk->sm.st = NULL; /* the mapping stays the application model's */
    rk->sm.be = NULL;
    rk->sm.progress = NULL;
    dsq_model_params rp = *p;
    rp.device = rk->device;
    rp.tp_world = 0;
    dsq_status st = cu_model_load(&rk->sm, &rp);
    dsq_tp_weights_free(&tw); /* uploaded (or failed): the host slices go */
    memset(&rk->sm.w, 0, sizeof rk->sm.w);
    return st;
}

dsq_status cu_tp_model_load(dsq_model *m, const dsq_model_params *p)
{
    const char *why = dsq_nccl_problem();
    if (why)
        return dsq_fail(DSQ_ERR_UNSUPPORTED, "tensor parallelism (tp_world %d) needs NCCL: %s", p->tp_world, why);
    if (!m->cfg.arch)
        return dsq_fail(DSQ_ERR_INTERNAL, "CUDA backend: the config names no architecture");
    const int local = p->tp_devices != NULL; /* else one process per rank */
    if (!local && !p->tp_id)
        return dsq_fail(DSQ_ERR_INVALID_ARG, "dsq_model_params: tp_world %d needs tp_devices (one process) or "
                        "tp_id and tp_rank (one process per rank)", p->tp_world);
    const double timeout = p->tp_timeout_s > 0.0f ? (double)p->tp_timeout_s : 60.0;
    cu_model *top = (cu_model *)calloc(1, sizeof *top);
    cu_tp_model *tp = (cu_tp_model *)calloc(1, sizeof *tp);
    if (!top || !tp) {
        free(top);
        free(tp);
        return dsq_fail(DSQ_ERR_OUT_OF_MEMORY, "no host memory for the tensor-parallel state");
    }
    top->tp = tp;
    m->be = top; /* from here cu_tp_model_free cleans up */
    tp->world = p->tp_world;
    tp->n_local = local ? p->tp_world : 1;
    tp->rank_first = local ? 0 : p->tp_rank;
    tp->r = (cu_tp_rank *)calloc((size_t)tp->n_local, sizeof *tp->r);
    tp->comms = (dsq_comm **)calloc((size_t)tp->n_local, sizeof *tp->comms);
    tp->vocab0 = (int32_t *)calloc((size_t)tp->world, sizeof(int32_t));
    tp->n_vocab = (int32_t *)calloc((size_t)tp->world, sizeof(int32_t));
    dsq_status st = tp->r && tp->comms && tp->vocab0 && tp->n_vocab
                        ? DSQ_OK
                        : dsq_fail(DSQ_ERR_OUT_OF_MEMORY, "no host memory for the tensor-parallel state");
    for (int32_t q = 0; q < tp->world && st == DSQ_OK; q++) {
        dsq_tp_slice s;
        if ((st = dsq_tp_plan(&m->cfg, q, tp->world, &s)) != DSQ_OK)
            break;
        tp->vocab0[q] = s.vocab0;
        tp->n_vocab[q] = s.n_vocab;
        if (s.n_vocab > tp->vmax)
            tp->vmax = s.n_vocab;
        if (q >= tp->rank_first && q < tp->rank_first + tp->n_local) {
            cu_tp_rank *rk = &tp->r[q - tp->rank_first];
            rk->s = s;
            rk->device = local ? p->tp_devices[q] : p->device;
        }
    }
    /* the communicators first: a missing peer fails before the long upload */
    int devs[64];
    if (st == DSQ_OK && tp->n_local > 64)
        st = dsq_fail(DSQ_ERR_UNSUPPORTED, "tensor parallelism: at most 64 local GPUs (asked %d)", tp->n_local);
    if (st == DSQ_OK && local) {
        for (int32_t i = 0; i < tp->n_local; i++)
            devs[i] = tp->r[i].device;
        st = dsq_comm_init_local(devs, tp->n_local, timeout, tp->comms);
    } else if (st == DSQ_OK) {
        uint8_t id[DSQ_COMM_ID_BYTES];
        memcpy(id, p->tp_id, sizeof id);
        st = dsq_comm_init_rank(id, p->tp_rank, tp->world, p->device, timeout, &tp->comms[0]);
    }
    for (int32_t i = 0; i < tp->n_local && st == DSQ_OK; i++) {
        tp->r[i].comm = tp->comms[i];
        st = load_rank(m, p, &tp->r[i]);
    }
    if (st != DSQ_OK) {
        cu_tp_model_free(m);
        return st;
    }
    /* the application's view: the first local rank's model, with tp */
    *top = *(const cu_model *)tp->r[0].sm.be;
    top->tp = tp;
    m->device_bytes = 0;
    for (int32_t i = 0; i < tp->n_local; i++)
        m->device_bytes += tp->r[i].sm.device_bytes;
    dsq_st_close(m->st);
    m->st = NULL;
    dsq_weights_forget_data(&m->w, m->cfg.n_layers);
    return DSQ_OK;
}

/* ---- context ------------------------------------------------------------------ */

static cu_tp_model *tp_of(const dsq_ctx *c) { return ((const cu_model *)c->model->be)->tp; }

/* Shadow i as of now: the application context's fields, the rank's model
 * and backend state. */
static dsq_ctx *shadow(dsq_ctx *c, int32_t i)
{
    cu_tp_ctx *tc = ((cu_ctx *)c->be)->tp;
    dsq_ctx *sc = &tc->sc[i];
    void *be = sc->be;
    dsq_model *sm = sc->model;
    memcpy(sc, c, sizeof *sc);
    sc->be = be;
    sc->model = sm;
    return sc;
}

dsq_ctx *cu_tp_rank_ctxs(dsq_ctx *c, int32_t *n)
{
    cu_tp_model *tp = c && c->model && c->model->be ? tp_of(c) : NULL;
    if (!tp || !c->be || !((cu_ctx *)c->be)->tp)
        return NULL;
    for (int32_t i = 0; i < tp->n_local; i++)
        (void)shadow(c, i);
    *n = tp->n_local;
    return ((cu_ctx *)c->be)->tp->sc;
}

void cu_tp_ctx_free(dsq_ctx *c)
{
    cu_ctx *first = (cu_ctx *)c->be;
    cu_tp_model *tp = tp_of(c);
    cu_tp_ctx *tc = first ? first->tp : NULL;
    if (first)
        first->tp = NULL;
    for (int32_t i = 0; tc && tc->sc && i < tp->n_local; i++) {
        if (tc->gather && tc->gather[i]) {
            cu_device_guard g(tp->r[i].device);
            cudaFree(tc->gather[i]);
            cudaGetLastError();
        }
        if (tc->sc[i].be)
            cu_ctx_free(&tc->sc[i]); /* the first is `first` */
    }
    if (tc) {
        free(tc->gather);
        free(tc->sc);
        free(tc);
    }
    c->be = NULL;
}

dsq_status cu_tp_ctx_init(dsq_ctx *c)
{
    cu_tp_model *tp = tp_of(c);
    cu_tp_ctx *tc = (cu_tp_ctx *)calloc(1, sizeof *tc);
    if (tc) {
        tc->sc = (dsq_ctx *)calloc((size_t)tp->n_local, sizeof *tc->sc);
        tc->gather = (float **)calloc((size_t)tp->n_local, sizeof *tc->gather);
    }
    if (!tc || !tc->sc || !tc->gather) {
        if (tc) {
            free(tc->sc);
            free(tc->gather);
        }
        free(tc);
        return dsq_fail(DSQ_ERR_OUT_OF_MEMORY, "no host memory for the tensor-parallel context");
    }
    dsq_status st = DSQ_OK;
    int64_t kv = 0, scratch = 0, kv_tok = 0;
    for (int32_t i = 0; i < tp->n_local && st == DSQ_OK; i++) {
        dsq_ctx *sc = &tc->sc[i];
        memcpy(sc, c, sizeof *sc);
        sc->model = &tp->r[i].sm;
        sc->be = NULL;
        if ((st = cu_ctx_init(sc)) != DSQ_OK)
            break;
        cu_ctx *cc = (cu_ctx *)sc->be;
        /* graphs off under tensor parallelism (the segments run eagerly) */
        free(cc->graphs);
        free(cc->graph_failed);
        cc->graphs = NULL;
        cc->graph_failed = NULL;
        kv += sc->kv_bytes;
        scratch += sc->scratch_bytes;
        kv_tok += sc->kv_bytes_per_token;
        const size_t gbytes = (size_t)tp->world * (size_t)cc->logit_chunk * (size_t)tp->vmax * sizeof(float);
        cu_device_guard g(tp->r[i].device);
        st = g.st != DSQ_OK ? g.st : dsq_cu_status(cudaMalloc((void **)&tc->gather[i], gbytes), "logit gather buffer");
        if (st != DSQ_OK)
            tc->gather[i] = NULL;
        scratch += (int64_t)gbytes;
    }
    c->be = tc->sc[0].be;
    if (c->be)
        ((cu_ctx *)c->be)->tp = tc;
    if (st != DSQ_OK) {
        if (!c->be) { /* the first rank failed: nothing to hang the state on */
            free(tc->gather);
            free(tc->sc);
            free(tc);
            return st;
        }
        cu_tp_ctx_free(c);
        return st;
    }
    c->kv_bytes = kv;
    c->scratch_bytes = scratch;
    c->kv_bytes_per_token = kv_tok;
    return DSQ_OK;
}

/* ---- a pass ------------------------------------------------------------------- */

/* The ranks' buffers bufs[i][count] (fp32) summed in place, in one group. */
static dsq_status all_reduce(cu_tp_model *tp, dsq_ctx *const *sc, size_t count)
{
    DSQ_TRY(dsq_comm_group_start());
    dsq_status st = DSQ_OK;
    for (int32_t i = 0; i < tp->n_local && st == DSQ_OK; i++) {
        cu_ctx *cc = (cu_ctx *)sc[i]->be;
        cu_device_guard g(cc->device);
        st = g.st != DSQ_OK ? g.st : dsq_comm_all_reduce_sum(tp->comms[i], cc->part, count, DSQ_COMM_F32, cc->stream);
    }
    dsq_status ge = dsq_comm_group_end(tp->comms, tp->n_local); /* always close the group */
    return st != DSQ_OK ? st : ge;
}

/* The n rows of this pass's logits (each local rank's part in its
 * cc->logits, [n][its part]) assembled into every local rank's
 * cc->logits [n][V]: an all-gather of [n * vmax] per rank, then one 2-D copy
 * per rank's part. */
static dsq_status gather_logits(dsq_ctx *c, dsq_ctx *const *sc, int32_t n)
{
    cu_tp_model *tp = tp_of(c);
    cu_tp_ctx *tc = ((cu_ctx *)c->be)->tp;
    const int32_t V = c->model->cfg.n_vocab;
    const size_t cnt = (size_t)n * (size_t)tp->vmax;
    DSQ_TRY(dsq_comm_group_start());
    dsq_status st = DSQ_OK;
    for (int32_t i = 0; i < tp->n_local && st == DSQ_OK; i++) {
        cu_ctx *cc = (cu_ctx *)sc[i]->be;
        cu_device_guard g(cc->device);
        st = g.st != DSQ_OK ? g.st
                            : dsq_comm_all_gather(tp->comms[i], cc->logits, tc->gather[i], cnt, DSQ_COMM_F32, cc->stream);
    }
    dsq_status ge = dsq_comm_group_end(tp->comms, tp->n_local);
    DSQ_TRY(st != DSQ_OK ? st : ge);
    for (int32_t i = 0; i < tp->n_local; i++) {
        cu_ctx *cc = (cu_ctx *)sc[i]->be;
        cu_device_guard g(cc->device);
        DSQ_TRY(g.st);
        for (int32_t q = 0; q < tp->world; q++)
            CU_TRY(cudaMemcpy2DAsync(cc->logits + tp->vocab0[q], (size_t)V * sizeof(float),
                                     tc->gather[i] + (size_t)q * cnt, (size_t)tp->n_vocab[q] * sizeof(float),
                                     (size_t)tp->n_vocab[q] * sizeof(float), (size_t)n, cudaMemcpyDeviceToDevice,
                                     cc->stream),
                   "logit gather");
    }
    return DSQ_OK;
}

/* Every local rank's stream drained, each bounded by its communicator's
 * timeout (a peer lost inside a collective: DSQ_ERR_DEVICE, aborted). */
static dsq_status sync_ranks(cu_tp_model *tp, dsq_ctx *const *sc)
{
    for (int32_t i = 0; i < tp->n_local; i++) {
        cu_ctx *cc = (cu_ctx *)sc[i]->be;
        cu_device_guard g(cc->device);
        DSQ_TRY(g.st);
        DSQ_TRY(dsq_comm_sync_stream(tp->comms[i], cc->stream));
    }
    return DSQ_OK;
}

dsq_status cu_tp_launch_forward(dsq_ctx *c, const dsq_batch *bt, int32_t NL)
{
    cu_tp_model *tp = tp_of(c);
    dsq_ctx *sc[64];
    cu_pass p[64];
    for (int32_t i = 0; i < tp->n_local; i++) {
        sc[i] = shadow(c, i);
        cu_device_guard g(((cu_ctx *)sc[i]->be)->device);
        DSQ_TRY(g.st);
        DSQ_TRY(cu_prepare_pass(sc[i], bt, NL, &p[i]));
    }
    const int32_t n_seg = cu_n_segments(&c->model->cfg);
    const size_t count = (size_t)bt->n_tokens * (size_t)c->model->cfg.n_embd;
    for (int32_t seg = 0; seg <= n_seg; seg++) {
        for (int32_t i = 0; i < tp->n_local; i++) {
            cu_device_guard g(((cu_ctx *)sc[i]->be)->device);
            DSQ_TRY(g.st);
            DSQ_TRY(cu_enqueue_segment(sc[i], &p[i], seg, tp->rank_first + i == 0));
        }
        if (seg < n_seg)
            DSQ_TRY(all_reduce(tp, sc, count));
    }
    if (p[0].NL > 0) {
        const cu_ctx *cc = (const cu_ctx *)c->be;
        DSQ_TRY(gather_logits(c, sc, p[0].NL < cc->logit_chunk ? p[0].NL : cc->logit_chunk));
    }
    return sync_ranks(tp, sc);
}

dsq_status cu_tp_head_rows(dsq_ctx *c, int32_t r0, int32_t n)
{
    cu_tp_model *tp = tp_of(c);
    dsq_ctx *sc[64];
    for (int32_t i = 0; i < tp->n_local; i++) {
        sc[i] = shadow(c, i);
        cu_ctx *cc = (cu_ctx *)sc[i]->be;
        const cu_model *cm = (const cu_model *)sc[i]->model->be;
        cu_device_guard g(cc->device);
        DSQ_TRY(g.st);
        dsq_cu_linear_env env;
        memset(&env, 0, sizeof env); /* no norm folded in, no dequantization tile */
        env.mma_min = cc->gemv_mma_min;
        env.long_min = cc->gemv_long_min;
        env.gemm = cc->gemm;
        env.gu_scratch = cc->gu;
        env.gemv_max = cc->gemv_max_head;
        env.stream = cc->stream;
        DSQ_TRY(dsq_cu_linear(&cm->lm_head, cc->xn + (size_t)r0 * c->model->cfg.n_embd, NULL, n, DSQ_EPI_STORE,
                              cc->logits, &env));
    }
    DSQ_TRY(gather_logits(c, sc, n));
    return sync_ranks(tp, sc);
}
