/* scheduler.c - continuous batching: one thread owns the dsq_ctx and runs
 * dsq_step over every active request, admitting waiting ones between steps.
 *
 * Each step holds the decode token of every generating request plus prompt
 * chunks of requests still being prefilled, up to max_batch_tokens in all
 * (a long prompt takes several steps; the decodes never wait for it).  The
 * last chunk of a prompt samples the first token in the same step.
 *
 * KV budget: a request is admitted only when the paged pool can hold its
 * prompt plus max_tokens (in whole blocks, less the full blocks it shares
 * with a cached prefix), so a step never runs out of KV memory halfway
 * through a reply; otherwise it waits in the FIFO (or is refused with 429
 * when the FIFO is full, see srv_submit).
 *
 * Prefix cache: the scheduler remembers the last prompts it admitted; when
 * a new prompt shares at least --prefix-min tokens with one of them (a
 * repeated system prompt, a few-shot prefix) and no cached entry covers as
 * much, the new request's sequence is forked into a cache slot
 * (dsq_seq_fork + dsq_seq_truncate to the shared length) once its prompt is
 * in the cache.  Later requests with that prefix fork the cached sequence
 * (paged blocks shared by reference count) and prefill only the rest. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve.h"

#define HIST_N 8 /* recent prompts remembered for prefix detection */

int64_t srv_req_blocks(const srv *s, const srv_req *r, int32_t shared)
{
    int64_t total = (int64_t)r->n_prompt + r->max_tokens;
    return (total + s->block - 1) / s->block - shared / s->block;
}

static void wake(srv_req *r)
{
    pthread_cond_broadcast(&r->cv);
}

/* Under s->mu. */
void srv_req_release_locked(srv *s, srv_req *r)
{
    (void)s;
    if (--r->refs == 0)
        srv_req_free(r);
}

/* Under s->mu: the client is gone; the scheduler frees the sequence before
 * its next step. */
void srv_req_cancel_locked(srv *s, srv_req *r)
{
    if (!r->finished && !r->cancelled) {
        r->cancelled = 1;
        pthread_cond_signal(&s->cv_sched);
    }
}

/* Under s->mu. */
static void recompute_evictable(srv *s)
{
    int64_t b = 0;
    for (int i = 0; i < s->o.prefix_slots; i++)
        if (s->prefix[i].seq >= 0 && s->prefix[i].users == 0)
            b += s->prefix[i].blocks;
    s->evictable_blocks = b;
}

int srv_submit(srv *s, srv_req *r)
{
    pthread_mutex_lock(&s->mu);
    if (s->stopping) {
        pthread_mutex_unlock(&s->mu);
        return 503;
    }
    /* a reply never needs more than the whole pool */
    int64_t pool = s->total_blocks * s->block;
    if ((int64_t)r->n_prompt + r->max_tokens > pool)
        r->max_tokens = (int32_t)(pool - r->n_prompt);
    if (r->max_tokens < 1) {
        pthread_mutex_unlock(&s->mu);
        return 413; /* the caller says: prompt larger than the KV pool */
    }
    int64_t need = srv_req_blocks(s, r, 0);
    int fits_now = s->n_waiting == 0 && s->n_active < s->o.max_seqs &&
                   s->reserved_blocks - s->evictable_blocks + need <= s->total_blocks;
    if (!fits_now && s->n_waiting >= s->o.max_queue) {
        s->m.requests_429++;
        pthread_mutex_unlock(&s->mu);
        return 429;
    }
    r->refs = 2; /* the HTTP thread and the scheduler */
    r->state = REQ_WAITING;
    r->next = NULL;
    if (s->wait_tail)
        s->wait_tail->next = r;
    else
        s->wait_head = r;
    s->wait_tail = r;
    s->n_waiting++;
    /* counted in the same lock hold as the admission: the shutdown drain
     * (serve.c) never sees an admitted request whose HTTP side is
     * uncounted */
    s->n_http_reqs++;
    pthread_cond_signal(&s->cv_sched);
    pthread_mutex_unlock(&s->mu);
    return 0;
}

static int32_t lcp(const int32_t *a, int32_t na, const int32_t *b, int32_t nb)
{
    int32_t n = na < nb ? na : nb, i = 0;
    while (i < n && a[i] == b[i])
        i++;
    return i;
}

/* Under s->mu (touches reserved_blocks). Drops the least recently used
 * prefix entry nobody uses, other than `keep`.  Returns 1 if one went. */
static int evict_one(srv *s, int keep)
{
    int best = -1;
    for (int i = 0; i < s->o.prefix_slots; i++) {
        srv_prefix *p = &s->prefix[i];
        if (p->seq < 0 || p->users > 0 || i == keep)
            continue;
        if (best < 0 || p->last_use < s->prefix[best].last_use)
            best = i;
    }
    if (best < 0)
        return 0;
    srv_prefix *p = &s->prefix[best];
    dsq_seq_remove(s->ctx, p->seq);
    s->reserved_blocks -= p->blocks;
    free(p->tokens);
    p->tokens = NULL;
    p->len = 0;
    p->seq = -1;
    recompute_evictable(s);
    s->m.prefix_evictions++;
    return 1;
}

/* Under s->mu: move waiting requests into sequences while the pool and the
 * sequence slots allow, oldest first. */
static void admit(srv *s)
{
    while (s->wait_head && s->n_free_seqs > 0) {
        srv_req *r = s->wait_head;
        /* the longest cached prefix of this prompt */
        int best = -1;
        int32_t best_len = 0;
        for (int i = 0; i < s->o.prefix_slots; i++) {
            srv_prefix *p = &s->prefix[i];
            if (p->seq < 0)
                continue;
            int32_t l = lcp(p->tokens, p->len, r->prompt, r->n_prompt);
            if (l >= s->o.prefix_min && l > best_len) {
                best = i;
                best_len = l;
            }
        }
        int32_t shared = best >= 0 ? (best_len < r->n_prompt ? best_len : r->n_prompt - 1) : 0;
        int64_t need = srv_req_blocks(s, r, shared);
        while (s->reserved_blocks + need > s->total_blocks && evict_one(s, best))
            ;
        if (s->reserved_blocks + need > s->total_blocks && best >= 0 && s->n_active == 0) {
            /* Nothing runs, so nothing will free blocks: the entry it would
             * fork from is all that is left, and entry + request can exceed
             * the pool (the entry's partial last block, or its tokens past
             * the shared length) although the request alone fits.  Drop the
             * entry and prefill in full rather than wait forever (and
             * every request behind it in the FIFO). */
            best = -1;
            best_len = shared = 0;
            need = srv_req_blocks(s, r, 0);
            while (s->reserved_blocks + need > s->total_blocks && evict_one(s, -1))
                ;
        }
        if (s->reserved_blocks + need > s->total_blocks)
            break; /* FIFO: the head waits for room, nobody overtakes it */

        s->wait_head = r->next;
        if (!s->wait_head)
            s->wait_tail = NULL;
        s->n_waiting--;
        r->next = NULL;
        r->seq = s->free_seqs[--s->n_free_seqs];
        if (shared > 0) {
            srv_prefix *p = &s->prefix[best];
            if (dsq_seq_fork(s->ctx, p->seq, r->seq) != DSQ_OK ||
                (shared < p->len && dsq_seq_truncate(s->ctx, r->seq, shared) != DSQ_OK)) {
                dsq_seq_remove(s->ctx, r->seq);
                shared = 0;
                need = srv_req_blocks(s, r, 0);
            } else {
                p->users++;
                p->last_use = ++s->use_clock;
                r->prefix_entry = best;
                recompute_evictable(s);
            }
        }
        r->n_fed = r->n_cached = shared;
        r->own_blocks = need;
        s->reserved_blocks += need;
        s->n_active++;
        r->state = REQ_PREFILL;
        for (int i = 0; i < s->o.max_seqs; i++)
            if (!s->active[i]) {
                s->active[i] = r;
                break;
            }
        s->m.prompt_tokens += (uint64_t)r->n_prompt;
        s->m.prefix_hit_tokens += (uint64_t)shared;

        /* prefix detection against the recent prompts */
        if (s->o.prefix_slots > 0) {
            int32_t h = 0;
            for (int i = 0; i < s->hist_n; i++) {
                int32_t l = lcp(s->hist[i], s->hist_len[i], r->prompt, r->n_prompt);
                if (l > h)
                    h = l;
            }
            if (h >= r->n_prompt)
                h = r->n_prompt - 1;
            if (h >= s->o.prefix_min && h > best_len)
                r->cache_at = h;
            int32_t *copy = malloc((size_t)r->n_prompt * sizeof *copy);
            if (copy) {
                memcpy(copy, r->prompt, (size_t)r->n_prompt * sizeof *copy);
                free(s->hist[s->hist_pos]);
                s->hist[s->hist_pos] = copy;
                s->hist_len[s->hist_pos] = r->n_prompt;
                s->hist_pos = (s->hist_pos + 1) % HIST_N;
                if (s->hist_n < HIST_N)
                    s->hist_n++;
            }
        }
    }
}

/* Under s->mu: fork the first r->cache_at prompt tokens of `r` into a free
 * (or freed) prefix slot. */
static void make_prefix(srv *s, srv_req *r)
{
    int32_t len = r->cache_at;
    r->cache_at = 0;
    for (int i = 0; i < s->o.prefix_slots; i++) /* someone cached it meanwhile */
        if (s->prefix[i].seq >= 0 && s->prefix[i].len >= len &&
            lcp(s->prefix[i].tokens, s->prefix[i].len, r->prompt, len) == len)
            return;
    int slot = -1;
    for (int i = 0; i < s->o.prefix_slots && slot < 0; i++)
        if (s->prefix[i].seq < 0)
            slot = i;
    int64_t blocks = (len + s->block - 1) / s->block;
    if (slot < 0 && evict_one(s, -1))
        for (int i = 0; i < s->o.prefix_slots && slot < 0; i++)
            if (s->prefix[i].seq < 0)
                slot = i;
    if (slot < 0)
        return;
    while (s->reserved_blocks + blocks > s->total_blocks && evict_one(s, slot))
        ;
    if (s->reserved_blocks + blocks > s->total_blocks)
        return;
    srv_prefix *p = &s->prefix[slot];
    int32_t seq = s->o.max_seqs + slot;
    int32_t *tokens = malloc((size_t)len * sizeof *tokens);
    if (!tokens)
        return;
    if (dsq_seq_fork(s->ctx, r->seq, seq) != DSQ_OK ||
        dsq_seq_truncate(s->ctx, seq, len) != DSQ_OK) {
        dsq_seq_remove(s->ctx, seq);
        free(tokens);
        return;
    }
    memcpy(tokens, r->prompt, (size_t)len * sizeof *tokens);
    p->seq = seq;
    p->tokens = tokens;
    p->len = len;
    p->users = 0;
    p->blocks = blocks;
    p->last_use = ++s->use_clock;
    s->reserved_blocks += blocks;
    recompute_evictable(s);
}

/* Scheduler thread, without the lock: the request leaves its sequence.  The
 * shared counters are settled by retire_locked(). */
static void leave_seq(srv *s, srv_req *r)
{
    if (r->seq >= 0) {
        dsq_seq_remove(s->ctx, r->seq);
        s->free_seqs[s->n_free_seqs++] = r->seq;
        r->seq = -1;
    }
    for (int i = 0; i < s->o.max_seqs; i++)
        if (s->active[i] == r)
            s->active[i] = NULL;
}

/* Under s->mu: after leave_seq; publishes the last bytes and drops the
 * scheduler's reference. */
static void retire_locked(srv *s, srv_req *r)
{
    if (r->prefix_entry >= 0) {
        s->prefix[r->prefix_entry].users--;
        r->prefix_entry = -1;
        recompute_evictable(s);
    }
    s->n_active--;
    s->reserved_blocks -= r->own_blocks;
    r->own_blocks = 0;
    r->state = REQ_DONE;
    if (r->pending.len) {
        srv_buf_add(&r->out, r->pending.p, r->pending.len);
        r->pending.len = 0;
    }
    r->finished = 1;
    if (r->cancelled)
        s->m.cancelled++;
    else if (r->http_status >= 500)
        s->m.requests_5xx++;
    else if (r->http_status >= 400)
        s->m.requests_4xx++;
    else
        s->m.requests_ok++;
    wake(r);
    srv_req_release_locked(s, r);
}

/* ---- the output worker ----------------------------------------------------
 *
 * Turning a step's sampled ids into text and SSE bytes (srv_out_token: the
 * stopper, detokenizing, JSON) is host work the device would wait for if it
 * ran between steps.  So it runs on a second thread while the next step
 * runs: the scheduler hands the worker step k's tokens as a job, starts step
 * k+1, then waits for the job.  The worker publishes the bytes of replies
 * that go on as soon as they are made (under s->mu) and says which replies
 * ended (stop string or EOS); those were already entered in step k+1, whose
 * token for them is dropped (it was inside the reply's KV reservation) before
 * their sequences are freed.  Length limits and non-finite steps are decided
 * by the scheduler itself, so such replies take no extra step.
 *
 * Ownership while a job runs: the worker touches only the job's requests'
 * output fields (stopper, pending, content, n_gen, t_first/t_last, ...) and
 * the output statics of output.c; the scheduler is inside dsq_step and
 * touches no request field the worker writes (dsq_step reads r->feed,
 * r->sp and r->prompt, which the worker never writes).  With --no-overlap
 * the scheduler runs the job itself right after the step. */

enum { END_NONE = 0, END_LENGTH, END_NONFINITE };

typedef struct srv_job {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int posted;        /* handed to the worker, not finished                    */
    int quit;
    int n;             /* items; 0: no job                                      */
    srv_req **req;     /* [max_seqs] NULL: dropped (the client went away)       */
    dsq_step_out *o;   /* [max_seqs] the step's output for req[i]               */
    int *end;          /* [max_seqs] in: END_*; out: 1 when the reply ended     */
    srv_req **wake;    /* [max_seqs]                                            */
} srv_job;

/* The worker's part: text, JSON and the bytes of the replies that go on. */
static void job_run(srv *s, srv_job *j)
{
    for (int i = 0; i < j->n; i++) {
        srv_req *r = j->req[i];
        if (!r)
            continue;
        if (j->end[i] == END_NONFINITE) {
            srv_out_finish(s, r, NULL, 500, "the model produced no finite logit");
            j->end[i] = 1;
            continue;
        }
        const char *reason = srv_out_token(s, r, &j->o[i]);
        if (!reason && j->end[i] == END_LENGTH)
            reason = "length";
        if (reason)
            srv_out_finish(s, r, reason, 200, NULL);
        j->end[i] = reason != NULL;
    }
    int n_wake = 0;
    double now = srv_now();
    pthread_mutex_lock(&s->mu);
    for (int i = 0; i < j->n; i++) {
        srv_req *r = j->req[i];
        if (!r)
            continue;
        if (r->t_first == 0.0) {
            r->t_first = now;
            srv_hist_observe(&s->m.ttft, now - r->t_arrive);
        } else {
            srv_hist_observe(&s->m.itl, now - r->t_last);
        }
        r->t_last = now;
        /* an ended reply's last bytes go out when it is retired */
        if (!j->end[i] && r->pending.len) {
            srv_buf_add(&r->out, r->pending.p, r->pending.len);
            r->pending.len = 0;
            j->wake[n_wake++] = r;
        }
    }
    pthread_mutex_unlock(&s->mu);
    /* the scheduler's reference keeps them alive until the job is taken */
    for (int i = 0; i < n_wake; i++)
        wake(j->wake[i]);
}

static void *out_main(void *arg)
{
    srv *s = arg;
    srv_job *j = s->job;
    pthread_mutex_lock(&j->mu);
    for (;;) {
        while (!j->posted && !j->quit)
            pthread_cond_wait(&j->cv, &j->mu);
        if (!j->posted)
            break; /* quit, nothing left */
        pthread_mutex_unlock(&j->mu);
        job_run(s, j);
        pthread_mutex_lock(&j->mu);
        j->posted = 0;
        pthread_cond_broadcast(&j->cv);
    }
    pthread_mutex_unlock(&j->mu);
    return NULL;
}

static void job_post(srv_job *j)
{
    pthread_mutex_lock(&j->mu);
    j->posted = 1;
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
}

static void job_wait(srv_job *j)
{
    pthread_mutex_lock(&j->mu);
    while (j->posted)
        pthread_cond_wait(&j->cv, &j->mu);
    pthread_mutex_unlock(&j->mu);
}

/* After a job: replies that ended leave their sequences (a reply stopped by
 * text may be in the step just run; its token there is dropped because its
 * seq is gone) and wait in st_retire for the lock. */
static void job_take(srv *s, srv_job *j)
{
    for (int i = 0; i < j->n; i++) {
        srv_req *r = j->req[i];
        if (r && j->end[i]) {
            leave_seq(s, r);
            s->st_retire[s->n_retire++] = r;
        }
    }
    j->n = 0;
}

/* Under s->mu: the client of `r` went away; it is no longer in the job that
 * waits to be run. */
static void job_drop_locked(srv_job *j, const srv_req *r)
{
    for (int i = 0; i < j->n; i++)
        if (j->req[i] == r)
            j->req[i] = NULL;
}

/* What a step did, recorded under the lock afterwards. */
typedef struct step_obs {
    int n_gen;         /* tokens sampled                                         */
    int mixed;         /* prompt chunks beside decodes                           */
    int32_t n_prefill; /* prompt tokens in the step                              */
    double step_s;     /* wall time inside dsq_step                              */
} step_obs;

/* The step's entries: every generating request's next token, then prompt
 * chunks, oldest request first, in the room the decodes leave.  Returns the
 * number of entries. */
static int plan_step(srv *s, dsq_step_seq *e, srv_req **map, int32_t *chunk, step_obs *obs)
{
    int n = 0;
    int32_t budget = s->max_batch_tokens;
    for (int i = 0; i < s->o.max_seqs; i++) {
        srv_req *r = s->active[i];
        if (!r || r->state != REQ_DECODE)
            continue;
        e[n] = (dsq_step_seq){ r->seq, 1, &r->feed, &r->sp, r->top_n,
                               r->logprobs ? DSQ_STEP_LOGPROB : 0u };
        map[n] = r;
        chunk[n] = 0;
        n++;
        budget--;
    }
    for (;;) {
        srv_req *r = NULL;
        for (int i = 0; i < s->o.max_seqs; i++) {
            srv_req *q = s->active[i];
            if (!q || q->state != REQ_PREFILL || budget <= 0)
                continue;
            int seen = 0;
            for (int k = 0; k < n; k++)
                seen |= map[k] == q;
            if (!seen && (!r || q->num < r->num))
                r = q;
        }
        if (!r)
            break;
        int32_t rem = r->n_prompt - r->n_fed;
        int32_t c = rem < budget ? rem : budget;
        if (c > s->o.prefill_chunk)
            c = s->o.prefill_chunk;
        int last = c == rem;
        e[n] = (dsq_step_seq){ r->seq, c, r->prompt + r->n_fed, last ? &r->sp : NULL,
                               last ? r->top_n : 0,
                               last && r->logprobs ? DSQ_STEP_LOGPROB : 0u };
        map[n] = r;
        chunk[n] = c;
        n++;
        budget -= c;
    }
    int n_chunks = 0;
    for (int i = 0; i < n; i++) {
        n_chunks += chunk[i] > 0;
        obs->n_prefill += chunk[i];
    }
    obs->mixed = n_chunks > 0 && n_chunks < n;
    return n;
}

/* After the step: prompt progress, the next token to feed, and the job of
 * the sampled tokens.  Replies that reach max_tokens (or get no finite
 * logit) leave their sequences now; the job writes their last bytes. */
static void take_step(srv *s, const dsq_step_out *out, srv_req **map, const int32_t *chunk, int n,
                      step_obs *obs)
{
    srv_job *j = s->job;
    j->n = 0;
    for (int i = 0; i < n; i++) {
        srv_req *r = map[i];
        if (r->seq < 0)
            continue; /* its reply ended in the job that ran beside the step */
        if (chunk[i] > 0) {
            r->n_fed += chunk[i];
            if (r->n_fed < r->n_prompt)
                continue;
            r->state = REQ_DECODE;
        }
        int end = END_NONE;
        if (out[i].token < 0) {
            end = END_NONFINITE;
        } else {
            obs->n_gen++;
            r->n_sampled++;
            r->feed = out[i].token;
            if (r->n_sampled >= r->max_tokens)
                end = END_LENGTH;
        }
        j->req[j->n] = r;
        j->o[j->n] = out[i];
        j->end[j->n] = end;
        j->n++;
        if (end != END_NONE)
            leave_seq(s, r); /* retired after the job (job_take) */
    }
}

/* Under s->mu: replies that ended in a finished job. */
static void retire_ended_locked(srv *s)
{
    for (int i = 0; i < s->n_retire; i++)
        retire_locked(s, s->st_retire[i]);
    s->n_retire = 0;
}

/* Under s->mu, on the scheduler thread (the only caller of dsq_step, so the
 * context is quiet): the KV and sequence gauges from the context itself.
 * Called wherever sequences come or go before the lock is dropped, so a
 * metrics reader never sees a request retired with its sequence still
 * counted (or a new prefix entry without its sequence). */
static void kv_metrics_locked(srv *s)
{
    dsq_ctx_info ci;
    memset(&ci, 0, sizeof ci);
    ci.struct_size = sizeof ci;
    if (dsq_ctx_get_info(s->ctx, &ci) == DSQ_OK) {
        s->m.kv_free_tokens = ci.kv_free_tokens;
        s->m.active_seqs = ci.n_active_seqs;
    }
    s->m.kv_reserved_tokens = s->reserved_blocks * s->block;
}

static void *sched_main(void *arg)
{
    srv *s = arg;
    srv_job *j = s->job;
    dsq_step_seq *e = s->st_e;
    dsq_step_out *out = s->st_out;
    srv_req **map = s->st_map;
    int32_t *chunk = s->st_chunk;

    pthread_mutex_lock(&s->mu);
    for (;;) {
        /* the host-time clock of this step starts here (after any wait for
         * work, which is idleness, not overhead) */
        double t_iter = srv_now();
        retire_ended_locked(s);
        /* clients that went away: free their sequences before the next step */
        for (int i = 0; i < s->o.max_seqs; i++) {
            srv_req *r = s->active[i];
            if (r && r->cancelled) {
                job_drop_locked(j, r);
                leave_seq(s, r);
                retire_locked(s, r);
            }
        }
        for (srv_req **pp = &s->wait_head; *pp;) {
            srv_req *r = *pp;
            if (r->cancelled || s->stopping) {
                *pp = r->next;
                s->n_waiting--;
                if (s->stopping && !r->cancelled)
                    srv_out_finish(s, r, NULL, 503, "the server is shutting down");
                s->n_active++; /* retire_locked counts it out again */
                retire_locked(s, r);
            } else {
                pp = &r->next;
            }
        }
        s->wait_tail = NULL;
        for (srv_req *r = s->wait_head; r; r = r->next)
            s->wait_tail = r;
        if (s->stopping) {
            /* the job waiting to run finishes its replies first (the worker
             * is idle: jobs only run beside a step) */
            if (j->n > 0) {
                pthread_mutex_unlock(&s->mu);
                job_run(s, j);
                job_take(s, j);
                pthread_mutex_lock(&s->mu);
                retire_ended_locked(s);
            }
            for (int i = 0; i < s->o.max_seqs; i++) {
                srv_req *r = s->active[i];
                if (r) {
                    srv_out_finish(s, r, NULL, 503, "the server is shutting down");
                    leave_seq(s, r);
                    retire_locked(s, r);
                }
            }
            kv_metrics_locked(s);
            break;
        }
        admit(s);
        kv_metrics_locked(s); /* cancellations above freed sequences */
        if (s->n_active == 0 && j->n == 0) {
            s->m.last_batch = s->m.last_batch_tokens = 0;
            pthread_cond_wait(&s->cv_sched, &s->mu);
            continue;
        }
        pthread_mutex_unlock(&s->mu);

        step_obs obs = { 0, 0, 0, 0.0 };
        int n = plan_step(s, e, map, chunk, &obs);
        int had_job = j->n > 0;
        if (had_job)
            job_post(j); /* the previous step's tokens, beside this step */
        dsq_status st = DSQ_OK;
        if (n > 0) {
            double t_step = srv_now();
            st = dsq_step(s->ctx, e, n, NULL, out);
            obs.step_s = srv_now() - t_step;
        }
        if (had_job) {
            job_wait(j);
            job_take(s, j);
        }
        if (st != DSQ_OK) {
            /* cannot happen with the KV reservations; fail the batch's
             * requests rather than spin on the same error */
            char msg[512];
            snprintf(msg, sizeof msg, "dsq_step failed: %s: %s", dsq_status_string(st),
                     dsq_ctx_last_error(s->ctx));
            fprintf(stderr, "dsqwen serve: %s\n", msg);
            for (int i = 0; i < n; i++) {
                if (map[i]->seq < 0)
                    continue;
                srv_out_finish(s, map[i], NULL, 500, msg);
                leave_seq(s, map[i]);
                s->st_retire[s->n_retire++] = map[i];
            }
        } else {
            take_step(s, out, map, chunk, n, &obs);
            if (s->o.no_overlap && j->n > 0) { /* the output work now, not beside the next step */
                job_run(s, j);
                job_take(s, j);
            }
        }
        int32_t n_tok = 0;
        for (int i = 0; i < n; i++)
            n_tok += e[i].n_tokens;

        pthread_mutex_lock(&s->mu);
        for (int i = 0; i < n && st == DSQ_OK; i++) {
            srv_req *r = map[i];
            if (r->seq >= 0 && r->cache_at > 0 && r->n_fed >= r->n_prompt)
                make_prefix(s, r);
        }
        s->m.gen_tokens += (uint64_t)obs.n_gen;
        s->m.mixed_steps += (uint64_t)obs.mixed;
        s->m.prefill_tokens += (uint64_t)obs.n_prefill;
        retire_ended_locked(s);
        if (n > 0) {
            s->m.steps++;
            s->m.last_batch = n;
            s->m.last_batch_tokens = n_tok;
            srv_hist_observe(&s->m.batch, (double)n);
            srv_hist_observe(&s->m.step, obs.step_s);
            srv_hist_observe(&s->m.host, srv_now() - t_iter - obs.step_s);
        }
        kv_metrics_locked(s); /* after make_prefix's forks and the retirements */
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

static srv_job *job_new(int cap)
{
    srv_job *j = calloc(1, sizeof *j);
    if (!j)
        return NULL;
    j->req = calloc((size_t)cap, sizeof *j->req);
    j->o = calloc((size_t)cap, sizeof *j->o);
    j->end = calloc((size_t)cap, sizeof *j->end);
    j->wake = calloc((size_t)cap, sizeof *j->wake);
    pthread_mutex_init(&j->mu, NULL);
    pthread_cond_init(&j->cv, NULL);
    if (!j->req || !j->o || !j->end || !j->wake) {
        free(j->req);
        free(j->o);
        free(j->end);
        free(j->wake);
        pthread_mutex_destroy(&j->mu);
        pthread_cond_destroy(&j->cv);
        free(j);
        return NULL;
    }
    return j;
}

int srv_sched_start(srv *s)
{
    s->active = calloc((size_t)s->o.max_seqs, sizeof *s->active);
    s->free_seqs = calloc((size_t)s->o.max_seqs, sizeof *s->free_seqs);
    s->prefix = calloc((size_t)(s->o.prefix_slots > 0 ? s->o.prefix_slots : 1), sizeof *s->prefix);
    s->hist = calloc(HIST_N, sizeof *s->hist);
    s->hist_len = calloc(HIST_N, sizeof *s->hist_len);
    size_t cap = (size_t)s->o.max_seqs;
    s->st_e = calloc(cap, sizeof *s->st_e);
    s->st_out = calloc(cap, sizeof *s->st_out);
    s->st_map = calloc(cap, sizeof *s->st_map);
    s->st_chunk = calloc(cap, sizeof *s->st_chunk);
    /* every active request, plus the ones a job ends: never more than
     * max_seqs between two retirements */
    s->st_retire = calloc(cap, sizeof *s->st_retire);
    s->job = job_new(s->o.max_seqs);
    if (!s->active || !s->free_seqs || !s->prefix || !s->hist || !s->hist_len || !s->st_e ||
        !s->st_out || !s->st_map || !s->st_chunk || !s->st_retire || !s->job)
        return -1; /* srv_sched_free() releases what was made */
    for (int32_t i = 0; i < s->o.max_seqs; i++)
        s->free_seqs[s->n_free_seqs++] = s->o.max_seqs - 1 - i; /* 0 on top */
    for (int i = 0; i < s->o.prefix_slots; i++)
        s->prefix[i].seq = -1;
    if (!s->o.no_overlap) {
        if (pthread_create(&s->out_thread, NULL, out_main, s) != 0)
            return -1;
        s->out_thread_up = 1;
    }
    if (pthread_create(&s->sched_thread, NULL, sched_main, s) != 0) {
        pthread_mutex_lock(&s->job->mu);
        s->job->quit = 1;
        pthread_cond_broadcast(&s->job->cv);
        pthread_mutex_unlock(&s->job->mu);
        if (s->out_thread_up)
            pthread_join(s->out_thread, NULL);
        s->out_thread_up = 0;
        return -1;
    }
    return 0;
}

void srv_sched_free(srv *s)
{
    for (int i = 0; s->hist && i < HIST_N; i++)
        free(s->hist[i]);
    free(s->hist);
    free(s->hist_len);
    free(s->prefix);
    free(s->active);
    free(s->free_seqs);
    free(s->st_e);
    free(s->st_out);
    free(s->st_map);
    free(s->st_chunk);
    free(s->st_retire);
    if (s->job) {
        free(s->job->req);
        free(s->job->o);
        free(s->job->end);
        free(s->job->wake);
        pthread_mutex_destroy(&s->job->mu);
        pthread_cond_destroy(&s->job->cv);
        free(s->job);
    }
    s->job = NULL;
    s->st_retire = NULL;
    s->hist = NULL;
    s->hist_len = NULL;
    s->prefix = NULL;
    s->active = NULL;
    s->free_seqs = NULL;
}

void srv_sched_stop(srv *s)
{
    pthread_mutex_lock(&s->mu);
    s->stopping = 1;
    pthread_cond_signal(&s->cv_sched);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->sched_thread, NULL);
    if (s->out_thread_up) {
        pthread_mutex_lock(&s->job->mu);
        s->job->quit = 1;
        pthread_cond_broadcast(&s->job->cv);
        pthread_mutex_unlock(&s->job->mu);
        pthread_join(s->out_thread, NULL);
        s->out_thread_up = 0;
    }
    /* /metrics may still be asked (the listener closes after this): it
     * sees no prefix array */
    pthread_mutex_lock(&s->mu);
    srv_prefix *prefix = s->prefix;
    s->prefix = NULL;
    pthread_mutex_unlock(&s->mu);
    for (int i = 0; i < s->o.prefix_slots; i++) {
        if (prefix[i].seq >= 0)
            dsq_seq_remove(s->ctx, prefix[i].seq);
        free(prefix[i].tokens);
    }
    free(prefix);
    pthread_mutex_lock(&s->mu);
    kv_metrics_locked(s); /* the scheduler has exited: the context is quiet */
    pthread_mutex_unlock(&s->mu);
    srv_sched_free(s);
}
