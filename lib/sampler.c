/* sampler.c - next-token sampling on the host: greedy, temperature, top-k,
 * top-p (nucleus), min-p, repetition penalty, seeded RNG.
 *
 * Pipeline, in Hugging Face generate() order (RepetitionPenaltyLogitsProcessor,
 * then the Temperature, TopK, TopP and MinP warpers):
 *
 *   penalty:      every distinct id among the last penalty_last_n recorded
 *                 tokens: logit > 0 ? logit / penalty : logit * penalty
 *   greedy:       temperature <= 0 -> argmax (first index on ties); the
 *                 warpers are skipped, as HF skips them when do_sample=False
 *   temperature:  z = logit / T, p = softmax(z)
 *   top-k:        keep the tokens whose logit is >= the k-th largest (ties at
 *                 the boundary are all kept, as torch.topk + "<" does in HF)
 *   top-p:        renormalise over the survivors; walking them in descending
 *                 order keep a token while the mass of the tokens before it is
 *                 < top_p (so the token that crosses top_p is kept)
 *   min-p:        keep p >= min_p * p_max (after top-p; the ratio does not
 *                 depend on renormalisation, so it is a threshold on
 *                 exp(z - z_max))
 *   draw:         u in [0,1) from xoshiro256** (seeded by splitmix64), pick
 *                 the first token whose cumulative mass exceeds u * total.
 *
 * Efficiency for a 151,936-entry vocabulary: nothing is sorted or
 * exponentiated over the whole vocabulary.  One pass finds the max logit, a
 * second collects only tokens with z >= z_max - 30 (probability relative to
 * the top token >= e^-30 ~ 1e-13; the rest carry < 2e-8 of the mass together
 * even at full vocabulary size and are treated as zero).  Top-k is a
 * quickselect over those candidates; top-p sorts only the candidates above a
 * probability threshold that is lowered until their mass reaches top_p.
 * Buffers are sized to n_vocab on first use and reused. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#define SAMPLER_PARAMS_V1 sizeof(dsq_sampler_params)

/* z below z_max - CUT_Z is probability zero (see above). */
#define CUT_Z 30.0f

typedef struct cand {
    float v;   /* logit, then exp(z - z_max) once the probabilities are known */
    int32_t id;
} cand;

struct dsq_sampler {
    dsq_sampler_params p;
    uint64_t rng[4];           /* xoshiro256** state                         */
    int32_t *hist;             /* [penalty_last_n] ring of recorded tokens   */
    int32_t hist_len;          /* valid entries (<= penalty_last_n)          */
    int32_t hist_pos;          /* next write position                        */
    int32_t *pen_ids;          /* [penalty_last_n] scratch: distinct ids     */
    int32_t cap;               /* vocab size the buffers below hold          */
    float *work;               /* [cap] logits with the penalty applied      */
    float *scratch;            /* [cap] quickselect keys                     */
    cand *cands;               /* [cap] surviving tokens                     */
};

/* ---- RNG ------------------------------------------------------------------- */

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static uint64_t xoshiro_next(uint64_t s[4])
{
    uint64_t result = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

static void seed_rng(uint64_t s[4], uint64_t seed)
{
    uint64_t x = seed;
    for (int i = 0; i < 4; i++)
        s[i] = splitmix64(&x); /* never all zero: splitmix64 is a bijection */
}

/* uniform double in [0, 1) with 53 random bits */
static double rng_uniform(uint64_t s[4]) { return (double)(xoshiro_next(s) >> 11) * 0x1.0p-53; }

/* ---- params ------------------------------------------------------------------ */

dsq_sampler_params dsq_sampler_default_params(void)
{
    dsq_sampler_params p;
    memset(&p, 0, sizeof p);
    p.struct_size = sizeof p;
    /* generation_config.json of DeepSeek-R1-Distill-Qwen-1.5B */
    p.temperature = 0.6f;
    p.top_k = 0;
    p.top_p = 0.95f;
    p.min_p = 0.0f;
    p.repetition_penalty = 1.0f;
    p.penalty_last_n = 64;
    p.seed = 0x5eed;
    p.n_vocab_valid = 0;
    return p;
}

static dsq_status check_params(const dsq_sampler_params *p)
{
    /* temperature <= 0 means greedy, so only NaN/inf are invalid there */
    if (!isfinite(p->temperature))
        return dsq_fail(DSQ_ERR_INVALID_ARG, "sampler: temperature must be finite");
    if (p->top_k < 0)
        return dsq_fail(DSQ_ERR_INVALID_ARG, "sampler: top_k = %d is negative (0 = off)",
                        (int)p->top_k);
    if (!(p->top_p > 0.0f && p->top_p <= 1.0f))
        return dsq_fail(DSQ_ERR_INVALID_ARG, "sampler: top_p = %g must be in (0, 1] (1 = off)",
                        (double)p->top_p);
    if (!(p->min_p >= 0.0f && p->min_p <= 1.0f))
        return dsq_fail(DSQ_ERR_INVALID_ARG, "sampler: min_p = %g must be in [0, 1] (0 = off)",
                        (double)p->min_p);
    if (!(p->repetition_penalty > 0.0f) || !isfinite(p->repetition_penalty))
        return dsq_fail(DSQ_ERR_INVALID_ARG,
                        "sampler: repetition_penalty = %g must be finite and > 0 (1 = off)",
                        (double)p->repetition_penalty);
    if (p->penalty_last_n < 0)
        return dsq_fail(DSQ_ERR_INVALID_ARG, "sampler: penalty_last_n = %d is negative",
                        (int)p->penalty_last_n);
    if (p->n_vocab_valid < 0)
        return dsq_fail(DSQ_ERR_INVALID_ARG, "sampler: n_vocab_valid = %d is negative (0 = all)",
                        (int)p->n_vocab_valid);
    return DSQ_OK;
}

dsq_status dsq_sampler_new(const dsq_sampler_params *params, dsq_sampler **out)
{
    dsq_clear_error();
    if (out)
        *out = NULL;
    if (!out)
        return dsq_fail(DSQ_ERR_INVALID_ARG, "dsq_sampler_new: out must not be NULL");
    dsq_sampler_params p = dsq_sampler_default_params();
    dsq_status st = dsq_copy_params(&p, sizeof p, params, SAMPLER_PARAMS_V1,
                                    "dsq_sampler_params");
    if (st != DSQ_OK)
        return st;
    if ((st = check_params(&p)) != DSQ_OK)
        return st;
    dsq_sampler *s = calloc(1, sizeof *s);
    if (!s)
        return dsq_fail(DSQ_ERR_OUT_OF_MEMORY, "no memory for the sampler");
    s->p = p;
    if (p.penalty_last_n > 0 && p.repetition_penalty != 1.0f) {
        s->hist = malloc(sizeof(int32_t) * (size_t)p.penalty_last_n);
        s->pen_ids = malloc(sizeof(int32_t) * (size_t)p.penalty_last_n);
        if (!s->hist || !s->pen_ids) {
            dsq_sampler_free(s);
            return dsq_fail(DSQ_ERR_OUT_OF_MEMORY, "no memory for the sampler history (%d tokens)",
                            (int)p.penalty_last_n);
        }
    }
    seed_rng(s->rng, p.seed);
    *out = s;
    return DSQ_OK;
}

void dsq_sampler_free(dsq_sampler *s)
{
    if (!s)
        return;
    free(s->hist);
    free(s->pen_ids);
    free(s->work);
    free(s->scratch);
    free(s->cands);
    free(s);
}

void dsq_sampler_reset(dsq_sampler *s, uint64_t seed)
{
    if (!s)
        return;
    s->hist_len = 0;
    s->hist_pos = 0;
    s->p.seed = seed;
    seed_rng(s->rng, seed);
}

static void record(dsq_sampler *s, int32_t token)
{
    if (!s->hist)
        return; /* penalty off: nothing needs the history */
    s->hist[s->hist_pos] = token;
    s->hist_pos = (s->hist_pos + 1) % s->p.penalty_last_n;
    if (s->hist_len < s->p.penalty_last_n)
        s->hist_len++;
}

dsq_status dsq_sampler_accept(dsq_sampler *s, const int32_t *tokens, size_t n)
{
    dsq_clear_error();
    if (!s || (!tokens && n > 0))
        return dsq_fail(DSQ_ERR_INVALID_ARG, "dsq_sampler_accept: NULL sampler or tokens");
    for (size_t i = 0; i < n; i++)
        if (tokens[i] < 0)
            return dsq_fail(DSQ_ERR_INVALID_ARG, "dsq_sampler_accept: tokens[%zu] = %d is negative",
                            i, (int)tokens[i]);
    for (size_t i = 0; i < n; i++)
        record(s, tokens[i]);
    return DSQ_OK;
}

/* ---- helpers ----------------------------------------------------------------- */

static dsq_status ensure_buffers(dsq_sampler *s, int32_t n_vocab)
{
    if (n_vocab <= s->cap)
        return DSQ_OK;
    float *w = malloc(sizeof(float) * (size_t)n_vocab);
    float *sc = malloc(sizeof(float) * (size_t)n_vocab);
    cand *c = malloc(sizeof(cand) * (size_t)n_vocab);
    if (!w || !sc || !c) {
        free(w);
        free(sc);
        free(c);
        return dsq_fail(DSQ_ERR_OUT_OF_MEMORY, "no memory for sampler buffers (vocab %d)",
                        (int)n_vocab);
    }
    free(s->work);
    free(s->scratch);
    free(s->cands);
    s->work = w;
    s->scratch = sc;
    s->cands = c;
    s->cap = n_vocab;
    return DSQ_OK;
}

/* Heapsorts: O(n log n) worst case, in place.  glibc's qsort may malloc a
 * merge buffer, and sampling must not allocate after the first call. */
static void sift_i32(int32_t *a, size_t root, size_t n)
{
    for (;;) {
        size_t child = 2 * root + 1;
        if (child >= n)
            return;
        if (child + 1 < n && a[child + 1] > a[child])
            child++;
        if (a[root] >= a[child])
            return;
        int32_t t = a[root];
        a[root] = a[child];
        a[child] = t;
        root = child;
    }
}

static void sort_i32(int32_t *a, size_t n)
{
    for (size_t i = n / 2; i-- > 0;)
        sift_i32(a, i, n);
    for (size_t end = n; end-- > 1;) {
        int32_t t = a[0];
        a[0] = a[end];
        a[end] = t;
        sift_i32(a, 0, end);
    }
}

/* Copy logits[0..n) to s->work with the repetition penalty applied to each
 * distinct recorded id (HF gathers the scores of the ids and scatters the
 * penalised values, so a repeated id is penalised once). */
static const float *apply_penalty(dsq_sampler *s, const float *logits, int32_t n)
{
    if (!s->hist || s->hist_len == 0)
        return logits;
    memcpy(s->work, logits, sizeof(float) * (size_t)n);
    memcpy(s->pen_ids, s->hist, sizeof(int32_t) * (size_t)s->hist_len);
    sort_i32(s->pen_ids, (size_t)s->hist_len);
    const float pen = s->p.repetition_penalty;
    for (int32_t i = 0; i < s->hist_len; i++) {
        int32_t id = s->pen_ids[i];
        if ((i > 0 && id == s->pen_ids[i - 1]) || id >= n)
            continue;
        float x = s->work[id];
        s->work[id] = x > 0.0f ? x / pen : x * pen;
    }
    return s->work;
}

/* k-th largest (k >= 1) of a[0..n), reordering a.  Three-way partitions so
 * runs of equal values cannot make it quadratic. */
static float kth_largest(float *a, int32_t n, int32_t k)
{
    int32_t lo = 0, hi = n, target = k - 1;
    while (hi - lo > 1) {
        float x = a[lo], y = a[lo + (hi - lo) / 2], z = a[hi - 1];
        float pivot = x < y ? (y < z ? y : (x < z ? z : x)) : (x < z ? x : (y < z ? z : y));
        int32_t lt = lo, i = lo, gt = hi;
        while (i < gt) {
            float v = a[i];
            if (v > pivot) {
                a[i++] = a[lt];
                a[lt++] = v;
            } else if (v < pivot) {
                a[i] = a[--gt];
                a[gt] = v;
            } else {
                i++;
            }
        }
        if (target < lt)
            hi = lt;
        else if (target >= gt)
            lo = gt;
        else
            return pivot;
    }
    return a[lo];
}

/* "a comes before b": descending probability, then ascending id -- a total
 * order, so the draw does not depend on how the sort breaks ties */
static inline int cand_before(const cand *a, const cand *b)
{
    return a->v > b->v || (a->v == b->v && a->id < b->id);
}

static void sift_cand(cand *a, size_t root, size_t n)
{
    for (;;) {
        size_t child = 2 * root + 1;
        if (child >= n)
            return;
        /* max-heap on "comes later", so the heap's root ends up last */
        if (child + 1 < n && cand_before(&a[child], &a[child + 1]))
            child++;
        if (!cand_before(&a[root], &a[child]))
            return;
        cand t = a[root];
        a[root] = a[child];
        a[child] = t;
        root = child;
    }
}

static void sort_cands(cand *a, size_t n)
{
    for (size_t i = n / 2; i-- > 0;)
        sift_cand(a, i, n);
    for (size_t end = n; end-- > 1;) {
        cand t = a[0];
        a[0] = a[end];
        a[end] = t;
        sift_cand(a, 0, end);
    }
}

/* Move candidates with v >= t to the front; returns their count and mass. */
static int32_t partition_at(cand *c, int32_t n, float t, double *mass)
{
    int32_t f = 0;
    double m = 0.0;
    for (int32_t i = 0; i < n; i++) {
        if (c[i].v >= t) {
            cand tmp = c[i];
            c[i] = c[f];
            c[f++] = tmp;
            m += tmp.v;
        }
    }
    *mass = m;
    return f;
}

/* ---- sampling ------------------------------------------------------------------ */

dsq_status dsq_sampler_sample(dsq_sampler *s, const float *logits, int32_t n_vocab,
                              int32_t *token_out)
{
    dsq_clear_error();
    if (token_out)
        *token_out = -1;
    if (!s || !logits || !token_out)
        return dsq_fail(DSQ_ERR_INVALID_ARG, "dsq_sampler_sample: NULL sampler, logits or out");
    if (n_vocab <= 0)
        return dsq_fail(DSQ_ERR_INVALID_ARG, "dsq_sampler_sample: n_vocab = %d", (int)n_vocab);
    dsq_status st = ensure_buffers(s, n_vocab);
    if (st != DSQ_OK)
        return st;
    const int32_t n = (s->p.n_vocab_valid > 0 && s->p.n_vocab_valid < n_vocab)
                          ? s->p.n_vocab_valid : n_vocab;
    const float *x = apply_penalty(s, logits, n);

    /* max (NaN compares false and is never chosen) */
    int32_t best = -1;
    float m = -INFINITY;
    for (int32_t i = 0; i < n; i++)
        if (x[i] > m) {
            m = x[i];
            best = i;
        }
    if (best < 0)
        return dsq_fail(DSQ_ERR_INVALID_ARG,
                        "dsq_sampler_sample: no finite logit among the first %d", (int)n);
    const float T = s->p.temperature;
    if (T <= 0.0f || isinf(m)) { /* greedy (or a single +inf logit dominates) */
        *token_out = best;
        record(s, best);
        return DSQ_OK;
    }

    /* candidates: z >= z_max - CUT_Z */
    const float thr = m - CUT_Z * T;
    cand *c = s->cands;
    int32_t nc = 0;
    for (int32_t i = 0; i < n; i++)
        if (x[i] >= thr) {
            c[nc].v = x[i];
            c[nc++].id = i;
        }

    /* top-k: keep logits >= the k-th largest (ties kept) */
    if (s->p.top_k > 0 && s->p.top_k < nc) {
        for (int32_t i = 0; i < nc; i++)
            s->scratch[i] = c[i].v;
        float vk = kth_largest(s->scratch, nc, s->p.top_k);
        int32_t f = 0;
        for (int32_t i = 0; i < nc; i++)
            if (c[i].v >= vk)
                c[f++] = c[i];
        nc = f;
    }

    /* unnormalised probabilities relative to the top token (which gets 1) */
    const float inv_t = 1.0f / T;
    double total = 0.0;
    for (int32_t i = 0; i < nc; i++) {
        c[i].v = expf((c[i].v - m) * inv_t);
        total += c[i].v;
    }

    int32_t kept = nc;
    double kept_mass = total;
    const float min_p = s->p.min_p;
    if (s->p.top_p < 1.0f) {
        /* Sort only a prefix that provably holds the nucleus: the tokens with
         * p >= t, once their mass reaches top_p (or min-p would cut below t
         * anyway). */
        const double target = (double)s->p.top_p * total;
        float t = 1e-2f;
        double mass = 0.0;
        int32_t f;
        for (;;) {
            f = partition_at(c, nc, t, &mass);
            if (mass >= target || t <= min_p || f == nc)
                break;
            t = t > 1e-12f ? t * 1e-3f : 0.0f;
        }
        sort_cands(c, (size_t)f);
        double before = 0.0;
        kept = 0;
        while (kept < f && before < target)
            before += c[kept++].v;
        while (kept > 1 && c[kept - 1].v < min_p) /* min-p: a prefix too */
            before -= c[--kept].v;
        kept_mass = before;
    } else if (min_p > 0.0f) {
        kept = partition_at(c, nc, min_p, &kept_mass);
    }

    /* draw */
    const double u = rng_uniform(s->rng) * kept_mass;
    double acc = 0.0;
    int32_t tok = c[kept - 1].id; /* rounding fallback */
    for (int32_t i = 0; i < kept; i++) {
        acc += c[i].v;
        if (acc > u) {
            tok = c[i].id;
            break;
        }
    }
    *token_out = tok;
    record(s, tok);
    return DSQ_OK;
}
