/* step.c - dsq_step(): one forward pass over decode steps and prompt chunks
 * of several sequences, with per-sequence sampling in the library.
 *
 * Validation happens before anything changes (the batch checks and layout
 * are lib/api.c's dsq_batch_build, shared with every batch call); then
 * dsq_batch_reserve grows the token histories and reserves paged KV blocks
 * (copy on write of shared blocks), the backend runs the batch (its `step`
 * hook samples on the device; without one the logits come to host memory
 * and lib/sample_cpu.c samples them), and dsq_batch_finish moves the
 * lengths only on success; a failure undoes the reservations, so no
 * sequence changes. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#define SAMPLE_PARAMS_V1 sizeof(dsq_sample_params)
#define STEP_PARAMS_V1 sizeof(dsq_step_params)
#define STEP_FLAGS (DSQ_STEP_LOGITS | DSQ_STEP_LOGPROB)

static dsq_sample_params sample_defaults(void)
{
    dsq_sample_params p;
    memset(&p, 0, sizeof p);
    p.struct_size = sizeof p;
    /* generation_config.json of DeepSeek-R1-Distill-Qwen-1.5B, as dsq_sampler */
    p.temperature = DSQ_DEFAULT_TEMPERATURE;
    p.top_k = 0;
    p.top_p = DSQ_DEFAULT_TOP_P;
    p.min_p = 0.0f;
    p.repetition_penalty = 1.0f;
    p.presence_penalty = 0.0f;
    p.frequency_penalty = 0.0f;
    p.penalty_last_n = DSQ_DEFAULT_PENALTY_LAST_N;
    p.seed = DSQ_DEFAULT_SEED;
    p.n_vocab_valid = 0;
    return p;
}

dsq_status dsq_sample_params_init(dsq_sample_params *params, uint32_t struct_size)
{
    dsq_sample_params d = sample_defaults();
    return dsq_params_init(params, struct_size, &d, sizeof d, SAMPLE_PARAMS_V1, "dsq_sample_params");
}

static dsq_step_params step_defaults(void)
{
    dsq_step_params p;
    memset(&p, 0, sizeof p);
    p.struct_size = sizeof p;
    return p;
}

dsq_status dsq_step_params_init(dsq_step_params *params, uint32_t struct_size)
{
    dsq_step_params d = step_defaults();
    return dsq_params_init(params, struct_size, &d, sizeof d, STEP_PARAMS_V1, "dsq_step_params");
}

static dsq_status fail_ctx(dsq_ctx *c, dsq_status st)
{
    strncpy(c->last_error, dsq_last_error_message(), sizeof c->last_error - 1);
    return st;
}

/* Copy entry i's sampler settings (struct_size honoured) and check them. */
static dsq_status resolve_sample(const dsq_ctx *c, const dsq_sample_params *in, int32_t i,
                                 dsq_sample_params *p)
{
    *p = sample_defaults();
    dsq_status st = dsq_copy_params(p, sizeof *p, in, SAMPLE_PARAMS_V1, "dsq_sample_params");
    if (st != DSQ_OK)
        return st;
    const int32_t V = c->model->cfg.n_vocab;
    if (!isfinite(p->temperature) || p->temperature < 0.0f)
        return dsq_fail(DSQ_ERR_INVALID_ARG, "dsq_step: entry %d: temperature = %g must be finite and >= 0 "
                        "(0 = greedy)", i, (double)p->temperature);
    if (p->top_k < 0)
        return dsq_fail(DSQ_ERR_INVALID_ARG, "dsq_step: entry %d: top_k = %d is negative (0 = off)", i, p->top_k);
    if (!(p->top_p > 0.0f && p->top_p <= 1.0f))
        return dsq_fail(DSQ_ERR_INVALID_ARG, "dsq_step: entry %d: top_p = %g must be in (0, 1] (1 = off)", i,
                        (double)p->top_p);
    if (!(p->min_p >= 0.0f && p->min_p <= 1.0f))
        return dsq_fail(DSQ_ERR_INVALID_ARG, "dsq_step: entry %d: min_p = %g must be in [0, 1] (0 = off)", i,
                        (double)p->min_p);
    if (!(p->repetition_penalty > 0.0f) || !isfinite(p->repetition_penalty))
        return dsq_fail(DSQ_ERR_INVALID_ARG, "dsq_step: entry %d: repetition_penalty = %g must be finite and "
                        "> 0 (1 = off)", i, (double)p->repetition_penalty);
    if (!isfinite(p->presence_penalty) || !isfinite(p->frequency_penalty))
        return dsq_fail(DSQ_ERR_INVALID_ARG, "dsq_step: entry %d: presence/frequency penalties must be finite", i);
    if (p->penalty_last_n < 0 || p->penalty_last_n > DSQ_PENALTY_MAX_N)
        return dsq_fail(DSQ_ERR_INVALID_ARG, "dsq_step: entry %d: penalty_last_n = %d must be in 0..%d", i,
                        p->penalty_last_n, DSQ_PENALTY_MAX_N);
    if (p->n_vocab_valid < 0 || p->n_vocab_valid > V)
        return dsq_fail(DSQ_ERR_INVALID_ARG, "dsq_step: entry %d: n_vocab_valid = %d must be in 0..%d", i,
                        p->n_vocab_valid, V);
    return DSQ_OK;
}

static dsq_status ensure_scratch(dsq_ctx *c)
{
    if (c->step_rows)
        return DSQ_OK;
    int32_t cap = c->p.max_seqs < c->p.max_batch_tokens ? c->p.max_seqs : c->p.max_batch_tokens;
    c->step_rows = calloc((size_t)cap, sizeof *c->step_rows);
    c->step_res = calloc((size_t)cap, sizeof *c->step_res);
    if (!c->step_rows || !c->step_res) {
        free(c->step_rows);
        free(c->step_res);
        c->step_rows = NULL;
        c->step_res = NULL;
        return dsq_fail(DSQ_ERR_OUT_OF_MEMORY, "no memory for step scratch");
    }
    c->step_cap = cap;
    return DSQ_OK;
}

/* No backend hook: logits of every row into host memory, sampled there. */
static dsq_status step_on_host(dsq_ctx *c, const dsq_batch *b, float *logits)
{
    const int32_t V = c->model->cfg.n_vocab, NL = b->n_logits;
    if (NL == 0)
        return c->model->ops->forward(c, b, NULL);
    if (NL > c->step_logits_rows) {
        float *l = realloc(c->step_logits, sizeof(float) * (size_t)V * (size_t)c->step_cap);
        if (!l)
            return dsq_fail(DSQ_ERR_OUT_OF_MEMORY, "no memory for %d rows of logits", c->step_cap);
        c->step_logits = l;
        c->step_logits_rows = c->step_cap;
    }
    if (!c->sample_ws) {
        dsq_status st = dsq_sample_ws_new(V, &c->sample_ws);
        if (st != DSQ_OK)
            return st;
    }
    dsq_status st = c->model->ops->forward(c, b, c->step_logits);
    if (st != DSQ_OK)
        return st;
    for (int32_t r = 0; r < NL; r++) {
        const dsq_samp_row *row = &c->step_rows[r];
        const float *x = c->step_logits + (size_t)r * V;
        if (row->out_row >= 0)
            memcpy(logits + (size_t)row->out_row * V, x, sizeof(float) * (size_t)V);
        if ((st = dsq_sample_cpu_row(c->sample_ws, x, V, row, c->hist.tok[row->seq], &c->step_res[r])) != DSQ_OK)
            return st;
    }
    return DSQ_OK;
}

dsq_status dsq_step(dsq_ctx *c, const dsq_step_seq *seqs, int32_t n, const dsq_step_params *params,
                    dsq_step_out *out)
{
    dsq_clear_error();
    if (!c)
        return dsq_fail(DSQ_ERR_INVALID_ARG, "dsq_step: ctx is NULL");
    if (!seqs || n <= 0)
        return fail_ctx(c, dsq_fail(DSQ_ERR_INVALID_ARG, "dsq_step: need seqs != NULL and n_seqs > 0 (got %d)", n));
    dsq_step_params sp = step_defaults();
    dsq_status st = dsq_copy_params(&sp, sizeof sp, params, STEP_PARAMS_V1, "dsq_step_params");
    if (st != DSQ_OK)
        return fail_ctx(c, st);
    if (sp.logits_on_device != 0 && sp.logits_on_device != 1)
        return fail_ctx(c, dsq_fail(DSQ_ERR_INVALID_ARG, "dsq_step: logits_on_device = %d must be 0 or 1",
                                    sp.logits_on_device));
    if (sp.logits && sp.logits_on_device && c->model->ops->kind != DSQ_BACKEND_CUDA)
        return fail_ctx(c, dsq_fail(DSQ_ERR_UNSUPPORTED, "dsq_step: logits_on_device needs the CUDA backend; "
                                    "this context runs on the CPU (pass host memory)"));
    /* before anything is written per entry: the scratch holds
     * min(max_seqs, max_batch_tokens) entries */
    if (n > c->p.max_seqs || n > c->p.max_batch_tokens)
        return fail_ctx(c, dsq_fail(DSQ_ERR_BATCH, "dsq_step: %d entries exceed max_seqs %d / max_batch_tokens %d",
                                    n, c->p.max_seqs, c->p.max_batch_tokens));
    if ((st = ensure_scratch(c)) != DSQ_OK)
        return fail_ctx(c, st);

    /* ids, tokens, lengths and batch limits: the checks every batch call
     * shares (lib/api.c), which also lay out the batch */
    dsq_batch_entry *be = c->b_entry;
    for (int32_t i = 0; i < n; i++)
        be[i] = (dsq_batch_entry){ .seq = seqs[i].seq, .n_tokens = seqs[i].n_tokens, .tokens = seqs[i].tokens,
                                   .want_logits = seqs[i].sample || (seqs[i].flags & DSQ_STEP_LOGITS) };
    dsq_batch b;
    if ((st = dsq_batch_build(c, "dsq_step", n, be, &b)) != DSQ_OK)
        return fail_ctx(c, st);

    const dsq_model *m = c->model;
    const int32_t V = m->cfg.n_vocab;
    int32_t n_real = V;
    if (m->tokenizer) {
        int32_t nt = dsq_tokenizer_n_tokens(m->tokenizer);
        if (nt > 0 && nt < V)
            n_real = nt;
    }
    int32_t n_rows = 0, n_out_logits = 0, n_sampled = 0;
    for (int32_t i = 0; i < n; i++) {
        const dsq_step_seq *e = &seqs[i];
        if (e->flags & ~(uint32_t)STEP_FLAGS)
            return fail_ctx(c, dsq_fail(DSQ_ERR_INVALID_ARG, "dsq_step: entry %d: unknown flags 0x%x", i, e->flags));
        if (e->top_n < 0 || e->top_n > DSQ_STEP_MAX_TOP_N)
            return fail_ctx(c, dsq_fail(DSQ_ERR_INVALID_ARG, "dsq_step: entry %d: top_n = %d must be in 0..%d", i,
                                        e->top_n, DSQ_STEP_MAX_TOP_N));
        if (!e->sample && (e->top_n > 0 || (e->flags & DSQ_STEP_LOGPROB)))
            return fail_ctx(c, dsq_fail(DSQ_ERR_INVALID_ARG, "dsq_step: entry %d asks for log-probabilities but "
                                        "samples nothing (sample is NULL)", i));
        if ((e->flags & DSQ_STEP_LOGITS) && !sp.logits)
            return fail_ctx(c, dsq_fail(DSQ_ERR_INVALID_ARG, "dsq_step: entry %d asks for logits but "
                                        "params->logits is NULL", i));
        if (be[i].want_logits) {
            dsq_samp_row *r = &c->step_rows[n_rows++];
            memset(r, 0, sizeof *r);
            r->seq = e->seq;
            r->hist_len = c->seq_len[e->seq] + e->n_tokens;
            r->out_row = (e->flags & DSQ_STEP_LOGITS) ? n_out_logits++ : -1;
            r->n_valid = n_real;
            r->top_n = e->top_n;
            if (e->sample) {
                dsq_sample_params p;
                if ((st = resolve_sample(c, e->sample, i, &p)) != DSQ_OK)
                    return fail_ctx(c, st);
                r->flags = DSQ_SROW_SAMPLE | ((e->flags & DSQ_STEP_LOGPROB) ? DSQ_SROW_LOGPROB : 0u);
                r->temperature = p.temperature;
                r->top_k = p.top_k;
                r->top_p = p.top_p;
                r->min_p = p.min_p;
                r->rep_pen = p.repetition_penalty;
                r->pres_pen = p.presence_penalty;
                r->freq_pen = p.frequency_penalty;
                r->pen_n = p.penalty_last_n;
                r->seed_lo = (uint32_t)p.seed;
                r->seed_hi = (uint32_t)(p.seed >> 32);
                if (p.n_vocab_valid > 0)
                    r->n_valid = p.n_vocab_valid;
                n_sampled++;
            }
        }
    }
    if (sp.logits && n_out_logits == 0)
        return fail_ctx(c, dsq_fail(DSQ_ERR_INVALID_ARG, "dsq_step: params->logits is set but no entry has "
                                    "DSQ_STEP_LOGITS"));
    if (n_sampled > 0 && !out)
        return fail_ctx(c, dsq_fail(DSQ_ERR_INVALID_ARG, "dsq_step: out is NULL but %d entries sample", n_sampled));

    /* token histories, paged KV blocks and copies on write, all or nothing */
    int32_t n_cow = 0;
    if ((st = dsq_batch_reserve(c, n, be, &n_cow)) != DSQ_OK)
        return fail_ctx(c, st);
    if (m->ops->step)
        st = m->ops->step(c, &b, c->step_rows, c->step_res, sp.logits, sp.logits_on_device);
    else
        st = step_on_host(c, &b, sp.logits);
    dsq_batch_finish(c, n, be, n_cow, st);
    if (st != DSQ_OK)
        return fail_ctx(c, st);
    int32_t r = 0;
    for (int32_t i = 0; i < n; i++) {
        const dsq_step_seq *e = &seqs[i];
        int has_row = e->sample || (e->flags & DSQ_STEP_LOGITS);
        if (out) {
            dsq_step_out *o = &out[i];
            memset(o, 0, sizeof *o);
            o->token = -1;
            if (has_row && e->sample) {
                const dsq_samp_result *res = &c->step_res[r];
                o->token = res->token;
                o->logprob = (e->flags & DSQ_STEP_LOGPROB) ? res->logprob : 0.0f;
                o->n_top = res->n_top;
                memcpy(o->top_ids, res->top_ids, sizeof o->top_ids);
                memcpy(o->top_logprobs, res->top_lp, sizeof o->top_logprobs);
            }
        }
        r += has_row;
    }
    return DSQ_OK;
}
