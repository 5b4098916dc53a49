/* sample_cpu.c - one logits row of a dsq_step() on the host: the model's
 * log-probabilities (raw logits), penalties from the sequence's kept tokens,
 * then lib/sampler.c's temperature / top-k / top-p / min-p / draw with the
 * counter-based uniform of (seed, position).  The CPU backend uses it for
 * every row; the CUDA tests use it as the reference of cuda/sampling.cu. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "philox.h"

struct dsq_sample_ws {
    dsq_sampler *s;     /* warpers set per row; its own penalty off       */
    int32_t n_vocab;
    float *work;        /* [n_vocab] logits with penalties applied         */
    int32_t *ids;       /* [DSQ_PENALTY_MAX_N] penalty window, sorted      */
};

dsq_status dsq_sample_ws_new(int32_t n_vocab, dsq_sample_ws **out)
{
    *out = NULL;
    dsq_sample_ws *w = calloc(1, sizeof *w);
    if (!w)
        return dsq_fail(DSQ_ERR_OUT_OF_MEMORY, "no memory for sampling scratch");
    dsq_sampler_params p = dsq_sampler_default_params();
    p.repetition_penalty = 1.0f; /* penalties are applied here, per step */
    dsq_status st = dsq_sampler_new(&p, &w->s);
    w->n_vocab = n_vocab;
    w->work = malloc(sizeof(float) * (size_t)n_vocab);
    w->ids = malloc(sizeof(int32_t) * DSQ_PENALTY_MAX_N);
    if (st == DSQ_OK && (!w->work || !w->ids))
        st = dsq_fail(DSQ_ERR_OUT_OF_MEMORY, "no memory for sampling scratch (vocab %d)", n_vocab);
    if (st != DSQ_OK) {
        dsq_sample_ws_free(w);
        return st;
    }
    *out = w;
    return DSQ_OK;
}

void dsq_sample_ws_free(dsq_sample_ws *w)
{
    if (!w)
        return;
    dsq_sampler_free(w->s);
    free(w->work);
    free(w->ids);
    free(w);
}

static void sift(int32_t *a, size_t root, size_t n)
{
    for (;;) {
        size_t c = 2 * root + 1;
        if (c >= n)
            return;
        if (c + 1 < n && a[c + 1] > a[c])
            c++;
        if (a[root] >= a[c])
            return;
        int32_t t = a[root];
        a[root] = a[c];
        a[c] = t;
        root = c;
    }
}

static void heapsort_i32(int32_t *a, size_t n)
{
    for (size_t i = n / 2; i-- > 0;)
        sift(a, i, n);
    for (size_t end = n; end-- > 1;) {
        int32_t t = a[0];
        a[0] = a[end];
        a[end] = t;
        sift(a, 0, end);
    }
}

/* (a, ia) comes before (b, ib): larger logit first, then lower id */
static int before(float a, int32_t ia, float b, int32_t ib) { return a > b || (a == b && ia < ib); }

dsq_status dsq_sample_cpu_row(dsq_sample_ws *w, const float *x, int32_t V, const dsq_samp_row *r,
                              const int32_t *hist, dsq_samp_result *res)
{
    memset(res, 0, sizeof *res);
    res->token = -1;
    const int32_t n = r->n_valid;
    if (V > w->n_vocab || n < 1 || n > V)
        return dsq_fail(DSQ_ERR_INTERNAL, "host sampling: vocab %d / %d valid ids vs scratch %d", V, n,
                        w->n_vocab);

    /* the model's log-probabilities: raw logits, ids < n */
    double lse = 0.0;
    if ((r->flags & DSQ_SROW_LOGPROB) || r->top_n > 0) {
        float m = -INFINITY;
        for (int32_t i = 0; i < n; i++)
            m = x[i] > m ? x[i] : m;
        double sum = 0.0;
        if (m > -INFINITY)
            for (int32_t i = 0; i < n; i++)
                if (x[i] > -INFINITY)
                    sum += exp((double)x[i] - (double)m);
        lse = (double)m + log(sum);
        /* top-n by insertion: n <= 20 */
        int32_t k = 0;
        for (int32_t i = 0; i < n && r->top_n > 0; i++) {
            float v = x[i];
            if (!(v > -INFINITY))
                continue;
            if (k == r->top_n && !before(v, i, x[res->top_ids[k - 1]], res->top_ids[k - 1]))
                continue;
            int32_t j = k < r->top_n ? k++ : k - 1;
            while (j > 0 && before(v, i, x[res->top_ids[j - 1]], res->top_ids[j - 1])) {
                res->top_ids[j] = res->top_ids[j - 1];
                j--;
            }
            res->top_ids[j] = i;
        }
        res->n_top = k;
        for (int32_t j = 0; j < k; j++)
            res->top_lp[j] = (float)((double)x[res->top_ids[j]] - lse);
    }
    if (!(r->flags & DSQ_SROW_SAMPLE))
        return DSQ_OK;

    /* penalties: each distinct id of the window once, with its count */
    const float *y = x;
    int32_t wn = r->pen_n < r->hist_len ? r->pen_n : r->hist_len;
    if (wn > 0 && (r->rep_pen != 1.0f || r->pres_pen != 0.0f || r->freq_pen != 0.0f)) {
        memcpy(w->work, x, sizeof(float) * (size_t)V);
        memcpy(w->ids, hist + r->hist_len - wn, sizeof(int32_t) * (size_t)wn);
        heapsort_i32(w->ids, (size_t)wn);
        for (int32_t i = 0; i < wn;) {
            int32_t id = w->ids[i], c = 0;
            while (i < wn && w->ids[i] == id) {
                c++;
                i++;
            }
            if (id < 0 || id >= n)
                continue;
            float v = w->work[id];
            v = v > 0.0f ? v / r->rep_pen : v * r->rep_pen;
            w->work[id] = v - r->freq_pen * (float)c - r->pres_pen;
        }
        y = w->work;
    }

    const uint64_t seed = (uint64_t)r->seed_lo | ((uint64_t)r->seed_hi << 32);
    const double u = (double)(dsq_philox64(seed, (uint64_t)r->hist_len) >> 11) * 0x1.0p-53;
    dsq_sampler_set_warpers(w->s, r->temperature, r->top_k, r->top_p, r->min_p, n);
    int32_t tok = -1;
    dsq_status st = dsq_sampler_sample_u(w->s, y, V, u, &tok);
    if (st == DSQ_ERR_INVALID_ARG) { /* no finite logit: reported as token -1 */
        dsq_clear_error();
        return DSQ_OK;
    }
    if (st != DSQ_OK)
        return st;
    res->token = tok;
    if (r->flags & DSQ_SROW_LOGPROB)
        res->logprob = (float)((double)x[tok] - lse);
    return DSQ_OK;
}
