/* test_sampler.c - dsq_sampler against probabilities computed here in double
 * with the Hugging Face warper definitions (TemperatureLogitsWarper,
 * TopKLogitsWarper, TopPLogitsWarper, MinPLogitsWarper and
 * RepetitionPenaltyLogitsProcessor), over many draws. */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <malloc.h>

#include "testutil.h"

/* ---- test-side randomness and reference ----------------------------------- */

static uint64_t lcg_state;
static double urand(void) /* [0,1) */
{
    lcg_state = lcg_state * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(lcg_state >> 11) * 0x1.0p-53;
}
static double nrand(void)
{
    double u = urand() + 1e-300, v = urand();
    return sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v);
}

static void random_logits(float *x, int n, double scale, uint64_t seed)
{
    lcg_state = seed;
    for (int i = 0; i < n; i++)
        x[i] = (float)(scale * nrand());
}

typedef struct cfg {
    float temperature;
    int top_k;
    float top_p;
    float min_p;
} cfg;

static int cmp_desc(const void *a, const void *b, const double *p)
{
    int i = *(const int *)a, j = *(const int *)b;
    if (p[i] != p[j])
        return p[i] < p[j] ? 1 : -1;
    return i - j;
}
static const double *g_sort_p;
static int cmp_desc_g(const void *a, const void *b) { return cmp_desc(a, b, g_sort_p); }

/* Exact target distribution q[n] (double) of the HF pipeline.  Returns the
 * smallest distance, over the filtering decisions, between a probability
 * and the threshold it was compared to, so callers can reject inputs where
 * float rounding could flip a decision. */
static double reference(const float *x, int n, cfg c, double *q)
{
    double margin = INFINITY;
    int *ord = malloc(sizeof(int) * (size_t)n);
    double *z = malloc(sizeof(double) * (size_t)n);
    double m = -INFINITY;
    for (int i = 0; i < n; i++) {
        z[i] = (double)x[i] / c.temperature;
        if (z[i] > m)
            m = z[i];
        ord[i] = i;
    }
    for (int i = 0; i < n; i++)
        q[i] = exp(z[i] - m);
    g_sort_p = q;
    qsort(ord, (size_t)n, sizeof(int), cmp_desc_g);
    /* top-k: drop everything strictly below the k-th largest */
    if (c.top_k > 0 && c.top_k < n) {
        double vk = q[ord[c.top_k - 1]];
        for (int r = c.top_k; r < n; r++) {
            if (q[ord[r]] < vk) {
                margin = fmin(margin, (vk - q[ord[r]]) / vk);
                q[ord[r]] = 0.0;
            }
        }
    }
    double total = 0.0;
    for (int i = 0; i < n; i++)
        total += q[i];
    /* top-p over the renormalised survivors */
    if (c.top_p < 1.0f) {
        double before = 0.0;
        for (int r = 0; r < n; r++) {
            double p = q[ord[r]] / total;
            if (p == 0.0)
                continue;
            if (before < c.top_p) {
                margin = fmin(margin, fabs(before - c.top_p));
                before += p;
            } else {
                margin = fmin(margin, fabs(before - c.top_p));
                q[ord[r]] = 0.0;
            }
        }
    }
    /* min-p relative to the top token */
    if (c.min_p > 0.0f) {
        double top = q[ord[0]];
        for (int i = 0; i < n; i++) {
            if (q[i] == 0.0)
                continue;
            margin = fmin(margin, fabs(q[i] / top - c.min_p));
            if (q[i] < c.min_p * top)
                q[i] = 0.0;
        }
    }
    total = 0.0;
    for (int i = 0; i < n; i++)
        total += q[i];
    for (int i = 0; i < n; i++)
        q[i] /= total;
    free(ord);
    free(z);
    return margin;
}

/* Pearson chi-square of counts against q over the support of q (cells with
 * expected count < 5 are pooled).  *df gets the degrees of freedom. */
static double chi_square(const int *counts, const double *q, int n, int draws, int *df)
{
    double chi = 0.0, pool_e = 0.0, pool_o = 0.0;
    int cells = 0;
    for (int i = 0; i < n; i++) {
        if (q[i] == 0.0)
            continue;
        double e = q[i] * draws;
        if (e < 5.0) {
            pool_e += e;
            pool_o += counts[i];
            continue;
        }
        chi += (counts[i] - e) * (counts[i] - e) / e;
        cells++;
    }
    if (pool_e > 0.0) {
        chi += (pool_o - pool_e) * (pool_o - pool_e) / fmax(pool_e, 1e-9);
        cells++;
    }
    *df = cells > 1 ? cells - 1 : 1;
    return chi;
}

/* A chi-square value this far above its df (mean df, sd sqrt(2 df)) has
 * probability far below 1e-6 under the null hypothesis. */
static double chi_limit(int df) { return df + 7.0 * sqrt(2.0 * df) + 20.0; }

static dsq_sampler *make(cfg c, uint64_t seed)
{
    dsq_sampler_params p = dsq_sampler_default_params();
    p.temperature = c.temperature;
    p.top_k = c.top_k;
    p.top_p = c.top_p;
    p.min_p = c.min_p;
    p.seed = seed;
    dsq_sampler *s = NULL;
    assert_int_equal(dsq_sampler_new(&p, &s), DSQ_OK);
    assert_non_null(s);
    return s;
}

/* ---- tests --------------------------------------------------------------------- */

static void test_defaults(void **state)
{
    (void)state;
    /* generation_config.json: temperature 0.6, top_p 0.95 */
    dsq_sampler_params p = dsq_sampler_default_params();
    assert_int_equal(p.struct_size, sizeof p);
    assert_true(p.temperature == 0.6f);
    assert_true(p.top_p == 0.95f);
    assert_int_equal(p.top_k, 0);
    assert_true(p.min_p == 0.0f);
    assert_true(p.repetition_penalty == 1.0f);
    dsq_sampler *s = NULL;
    assert_int_equal(dsq_sampler_new(NULL, &s), DSQ_OK);
    dsq_sampler_free(s);
    dsq_sampler_free(NULL);
}

static void test_greedy_is_argmax(void **state)
{
    (void)state;
    const int n = 1003;
    float *x = malloc(sizeof(float) * n);
    const cfg greedy_cfgs[] = {
        { 0.0f, 0, 1.0f, 0.0f },   /* plain greedy */
        { 0.0f, 3, 0.5f, 0.5f },   /* filters are ignored at temperature 0 */
        { -1.0f, 0, 0.95f, 0.0f }, /* negative temperature is greedy too */
    };
    for (int t = 0; t < 50; t++) {
        random_logits(x, n, 3.0, 1000 + (uint64_t)t);
        int32_t want = (int32_t)dsq_argmax(x, (size_t)n);
        for (size_t c = 0; c < sizeof greedy_cfgs / sizeof greedy_cfgs[0]; c++) {
            dsq_sampler *s = make(greedy_cfgs[c], 77 + (uint64_t)t);
            for (int rep = 0; rep < 3; rep++) {
                int32_t tok = -1;
                assert_int_equal(dsq_sampler_sample(s, x, n, &tok), DSQ_OK);
                assert_int_equal(tok, want);
            }
            dsq_sampler_free(s);
        }
    }
    free(x);
}

static void draw_many(dsq_sampler *s, const float *x, int n, int count, int32_t *out)
{
    for (int i = 0; i < count; i++)
        assert_int_equal(dsq_sampler_sample(s, x, n, &out[i]), DSQ_OK);
}

static void test_seed_reproducible(void **state)
{
    (void)state;
    const int n = 517, draws = 2000;
    float *x = malloc(sizeof(float) * n);
    random_logits(x, n, 1.0, 42);
    int32_t *a = malloc(sizeof(int32_t) * draws), *b = malloc(sizeof(int32_t) * draws),
            *c = malloc(sizeof(int32_t) * draws);
    cfg cf = { 0.8f, 0, 0.95f, 0.0f };
    dsq_sampler *s1 = make(cf, 1234), *s2 = make(cf, 1234), *s3 = make(cf, 1235);
    draw_many(s1, x, n, draws, a);
    draw_many(s2, x, n, draws, b);
    draw_many(s3, x, n, draws, c);
    assert_memory_equal(a, b, sizeof(int32_t) * draws);
    int differ = 0;
    for (int i = 0; i < draws; i++)
        differ += a[i] != c[i];
    printf("  seeds 1234 vs 1235: %d of %d draws differ\n", differ, draws);
    assert_true(differ > draws / 2); /* this distribution is far from a point mass */
    /* reset to the same seed replays the sequence */
    dsq_sampler_reset(s1, 1234);
    draw_many(s1, x, n, draws, b);
    assert_memory_equal(a, b, sizeof(int32_t) * draws);
    dsq_sampler_free(s1);
    dsq_sampler_free(s2);
    dsq_sampler_free(s3);
    free(a);
    free(b);
    free(c);
    free(x);
}

/* Draw many tokens; every one must lie in the support of the reference and
 * the frequencies must match it (chi-square).  The same counts must also
 * REJECT a deliberately wrong distribution, which shows the check has the
 * power to fail. */
static void check_distribution(const char *name, cfg c, int n, double scale, int draws,
                               int check_power)
{
    float *x = malloc(sizeof(float) * (size_t)n);
    double *q = malloc(sizeof(double) * (size_t)n), *wrong = malloc(sizeof(double) * (size_t)n);
    int *counts = calloc((size_t)n, sizeof(int));
    /* find logits where no filtering decision is within 2e-5 of its
     * threshold, so float vs double rounding (~1e-6 here) cannot change the
     * support */
    uint64_t seed = 9000;
    double margin;
    for (;; seed++) {
        random_logits(x, n, scale, seed);
        margin = reference(x, n, c, q);
        if (margin > 2e-5)
            break;
    }
    int support = 0;
    for (int i = 0; i < n; i++)
        support += q[i] > 0.0;

    dsq_sampler *s = make(c, 31337);
    for (int i = 0; i < draws; i++) {
        int32_t tok = -1;
        assert_int_equal(dsq_sampler_sample(s, x, n, &tok), DSQ_OK);
        assert_true(tok >= 0 && tok < n);
        if (q[tok] == 0.0)
            fail_msg("%s: drew token %d which the reference filters out", name, (int)tok);
        counts[tok]++;
    }
    dsq_sampler_free(s);

    int df = 0;
    double chi = chi_square(counts, q, n, draws, &df);
    double max_dev = 0.0;
    for (int i = 0; i < n; i++)
        max_dev = fmax(max_dev, fabs((double)counts[i] / draws - q[i]));
    /* the wrong distribution: same filters and support, temperature doubled */
    cfg cw = c;
    cw.temperature = c.temperature * 2.0f;
    reference(x, n, cw, wrong);
    int dfw = 0;
    for (int i = 0; i < n; i++)
        if (q[i] == 0.0)
            wrong[i] = 0.0; /* compare on the same support */
    double tw = 0.0;
    for (int i = 0; i < n; i++)
        tw += wrong[i];
    for (int i = 0; i < n; i++)
        wrong[i] /= tw;
    double chi_wrong = chi_square(counts, wrong, n, draws, &dfw);
    printf("  %-22s support %4d/%d  chi2 %8.1f (df %d, limit %.1f)  max|f-p| %.4f  "
           "chi2 vs wrong T %.1f\n", name, support, n, chi, df, chi_limit(df), max_dev, chi_wrong);
    assert_true(chi < chi_limit(df));
    if (check_power) /* a near-flat distribution over 1500 tokens is too
                        close to its tempered self for 20k draws to tell */
        assert_true(chi_wrong > chi_limit(dfw));
    free(x);
    free(q);
    free(wrong);
    free(counts);
}

static void test_distributions(void **state)
{
    (void)state;
    /* DSQ_SAMPLER_DRAWS raises the count to look for small biases */
    const char *env = getenv("DSQ_SAMPLER_DRAWS");
    const int draws = env && atoi(env) > 0 ? atoi(env) : 20000;
    check_distribution("temperature 0.7", (cfg){ 0.7f, 0, 1.0f, 0.0f }, 211, 1.0, draws, 1);
    check_distribution("top-k 7", (cfg){ 1.0f, 7, 1.0f, 0.0f }, 1003, 1.5, draws, 1);
    check_distribution("top-k 50 T 0.6", (cfg){ 0.6f, 50, 1.0f, 0.0f }, 1003, 1.0, draws, 1);
    check_distribution("top-p 0.8", (cfg){ 1.0f, 0, 0.8f, 0.0f }, 1003, 2.0, draws, 1);
    check_distribution("top-p 0.95 T 0.6", (cfg){ 0.6f, 0, 0.95f, 0.0f }, 1003, 2.5, draws, 1);
    check_distribution("min-p 0.05", (cfg){ 1.0f, 0, 1.0f, 0.05f }, 1003, 1.5, draws, 1);
    check_distribution("top-k+top-p+min-p", (cfg){ 1.3f, 40, 0.9f, 0.02f }, 1003, 1.5, draws, 1);
    /* min-p that cuts inside the nucleus */
    check_distribution("top-p 0.95+min-p 0.15", (cfg){ 1.0f, 0, 0.95f, 0.15f }, 1003, 1.5, draws, 1);
    /* so flat that the top-p histogram must refine its boundary bin twice;
     * with ~2 expected draws per token only the support check bites */
    check_distribution("very flat top-p 0.5", (cfg){ 1.0f, 0, 0.5f, 0.0f }, 20011, 0.01, draws, 0);
    check_distribution("flat top-p 0.5", (cfg){ 1.0f, 0, 0.5f, 0.0f }, 4001, 0.3, draws, 0);
}

/* Ids >= n_vocab_valid (padding rows of the embedding) are never chosen,
 * even when their logits are the largest, at full model vocabulary size. */
static void test_padding_never_sampled(void **state)
{
    (void)state;
    const int n = 151936, valid = 151665;
    float *x = malloc(sizeof(float) * n);
    random_logits(x, n, 2.0, 5);
    for (int i = valid; i < n; i++)
        x[i] = 100.0f;
    int32_t want = (int32_t)dsq_argmax(x, (size_t)valid);
    const cfg cfgs[] = { { 0.0f, 0, 1.0f, 0.0f }, { 0.6f, 0, 0.95f, 0.0f },
                         { 1.0f, 0, 1.0f, 0.0f }, { 1.0f, 20, 1.0f, 0.0f } };
    for (size_t c = 0; c < sizeof cfgs / sizeof cfgs[0]; c++) {
        dsq_sampler_params p = dsq_sampler_default_params();
        p.temperature = cfgs[c].temperature;
        p.top_k = cfgs[c].top_k;
        p.top_p = cfgs[c].top_p;
        p.n_vocab_valid = valid;
        dsq_sampler *s = NULL;
        assert_int_equal(dsq_sampler_new(&p, &s), DSQ_OK);
        for (int i = 0; i < 300; i++) {
            int32_t tok = -1;
            assert_int_equal(dsq_sampler_sample(s, x, n, &tok), DSQ_OK);
            assert_true(tok >= 0 && tok < valid);
            if (cfgs[c].temperature <= 0.0f)
                assert_int_equal(tok, want);
        }
        dsq_sampler_free(s);
    }
    free(x);
}

static dsq_sampler *penalty_sampler(float penalty, int last_n)
{
    dsq_sampler_params p = dsq_sampler_default_params();
    p.temperature = 0.0f;
    p.repetition_penalty = penalty;
    p.penalty_last_n = last_n;
    dsq_sampler *s = NULL;
    assert_int_equal(dsq_sampler_new(&p, &s), DSQ_OK);
    return s;
}

static void test_repetition_penalty(void **state)
{
    (void)state;
    int32_t tok;
    /* positive logits are divided: 5/2 = 2.5 < 3 */
    float pos[4] = { 0.0f, 5.0f, 3.0f, 1.0f };
    dsq_sampler *s = penalty_sampler(2.0f, 8);
    assert_int_equal(dsq_sampler_sample(s, pos, 4, &tok), DSQ_OK);
    assert_int_equal(tok, 1); /* nothing recorded yet */
    /* that draw was recorded: id 1 is now penalised */
    assert_int_equal(dsq_sampler_sample(s, pos, 4, &tok), DSQ_OK);
    assert_int_equal(tok, 2);
    dsq_sampler_free(s);

    /* negative logits are multiplied: -1*2 = -2 < -1.5 (dividing would give
     * -0.5 and keep id 0) */
    float neg[3] = { -1.0f, -1.5f, -3.0f };
    s = penalty_sampler(2.0f, 8);
    int32_t hist0 = 0;
    assert_int_equal(dsq_sampler_accept(s, &hist0, 1), DSQ_OK);
    assert_int_equal(dsq_sampler_sample(s, neg, 3, &tok), DSQ_OK);
    assert_int_equal(tok, 1);
    dsq_sampler_free(s);

    /* an id repeated in the window is penalised once: 5/2 = 2.5 > 2 (twice
     * would be 1.25 < 2) */
    float dup[3] = { 2.0f, 5.0f, 0.0f };
    s = penalty_sampler(2.0f, 8);
    int32_t h2[3] = { 1, 1, 1 };
    assert_int_equal(dsq_sampler_accept(s, h2, 3), DSQ_OK);
    assert_int_equal(dsq_sampler_sample(s, dup, 3, &tok), DSQ_OK);
    assert_int_equal(tok, 1);
    dsq_sampler_free(s);

    /* only the last penalty_last_n tokens count */
    s = penalty_sampler(2.0f, 2);
    int32_t h3[3] = { 1, 2, 2 }; /* id 1 fell out of the 2-token window */
    assert_int_equal(dsq_sampler_accept(s, h3, 3), DSQ_OK);
    assert_int_equal(dsq_sampler_sample(s, pos, 4, &tok), DSQ_OK);
    assert_int_equal(tok, 1);
    dsq_sampler_free(s);

    /* penalty < 1 encourages repetition: 3/0.5 = 6 > 5 */
    s = penalty_sampler(0.5f, 4);
    int32_t h4 = 2;
    assert_int_equal(dsq_sampler_accept(s, &h4, 1), DSQ_OK);
    assert_int_equal(dsq_sampler_sample(s, pos, 4, &tok), DSQ_OK);
    assert_int_equal(tok, 2);
    /* reset forgets the history */
    dsq_sampler_reset(s, 1);
    assert_int_equal(dsq_sampler_sample(s, pos, 4, &tok), DSQ_OK);
    assert_int_equal(tok, 1);
    dsq_sampler_free(s);

    /* the caller's logits are never modified */
    float before[4];
    memcpy(before, pos, sizeof pos);
    s = penalty_sampler(3.0f, 4);
    int32_t h5[2] = { 1, 2 };
    assert_int_equal(dsq_sampler_accept(s, h5, 2), DSQ_OK);
    assert_int_equal(dsq_sampler_sample(s, pos, 4, &tok), DSQ_OK);
    assert_memory_equal(before, pos, sizeof pos);
    dsq_sampler_free(s);
}

static void expect_invalid(dsq_sampler_params p, dsq_status want, const char *what)
{
    dsq_sampler *s = (dsq_sampler *)(uintptr_t)1;
    dsq_status st = dsq_sampler_new(&p, &s);
    if (st != want)
        fail_msg("%s: got %s, want %s", what, dsq_status_string(st), dsq_status_string(want));
    assert_null(s);
    assert_true(strlen(dsq_last_error_message()) > 0);
}

static void test_invalid_params(void **state)
{
    (void)state;
    const dsq_sampler_params d = dsq_sampler_default_params();
    dsq_sampler_params p;
#define BAD(field, value)                                     \
    do {                                                      \
        p = d;                                                \
        p.field = value;                                      \
        expect_invalid(p, DSQ_ERR_INVALID_ARG, #field " = " #value); \
    } while (0)
    BAD(temperature, NAN);
    BAD(temperature, INFINITY);
    BAD(top_k, -1);
    BAD(top_p, 0.0f);
    BAD(top_p, -0.5f);
    BAD(top_p, 1.01f);
    BAD(top_p, NAN);
    BAD(min_p, -0.1f);
    BAD(min_p, 1.5f);
    BAD(min_p, NAN);
    BAD(repetition_penalty, 0.0f);
    BAD(repetition_penalty, -1.0f);
    BAD(repetition_penalty, NAN);
    BAD(penalty_last_n, -1);
    BAD(n_vocab_valid, -5);
#undef BAD
    p = d;
    p.struct_size = 4;
    expect_invalid(p, DSQ_ERR_STRUCT_SIZE, "struct_size 4");
    p.struct_size = sizeof p + 8;
    expect_invalid(p, DSQ_ERR_STRUCT_SIZE, "struct_size too large");
    assert_int_equal(dsq_sampler_new(&d, NULL), DSQ_ERR_INVALID_ARG);

    dsq_sampler *s = NULL;
    assert_int_equal(dsq_sampler_new(&d, &s), DSQ_OK);
    float x[3] = { 1, 2, 3 };
    int32_t tok;
    assert_int_equal(dsq_sampler_sample(s, NULL, 3, &tok), DSQ_ERR_INVALID_ARG);
    assert_int_equal(dsq_sampler_sample(s, x, 0, &tok), DSQ_ERR_INVALID_ARG);
    assert_int_equal(dsq_sampler_sample(s, x, 3, NULL), DSQ_ERR_INVALID_ARG);
    assert_int_equal(dsq_sampler_sample(NULL, x, 3, &tok), DSQ_ERR_INVALID_ARG);
    float nans[3] = { NAN, NAN, -INFINITY };
    assert_int_equal(dsq_sampler_sample(s, nans, 3, &tok), DSQ_ERR_INVALID_ARG);
    int32_t neg = -3;
    assert_int_equal(dsq_sampler_accept(s, &neg, 1), DSQ_ERR_INVALID_ARG);
    assert_int_equal(dsq_sampler_accept(NULL, &neg, 1), DSQ_ERR_INVALID_ARG);
    /* NaN logits are skipped, never sampled */
    float some_nan[4] = { NAN, 0.5f, NAN, 0.25f };
    for (int i = 0; i < 200; i++) {
        assert_int_equal(dsq_sampler_sample(s, some_nan, 4, &tok), DSQ_OK);
        assert_true(tok == 1 || tok == 3);
    }
    dsq_sampler_free(s);
}

/* ---- non-finite logits and extreme settings (issue 14, defect 3) ----------- */

/* A draw must be a token whose (penalised) logit is finite, or the first
 * +inf one when there is any; never -inf (masked) or NaN. */
static void check_draw(const float *x, int n, int32_t tok, const char *what)
{
    int first_pinf = -1;
    for (int i = 0; i < n && first_pinf < 0; i++)
        if (x[i] == INFINITY)
            first_pinf = i;
    if (tok < 0 || tok >= n)
        fail_msg("%s: token %d outside 0..%d", what, (int)tok, n - 1);
    if (first_pinf >= 0 ? tok != first_pinf : !isfinite(x[tok]))
        fail_msg("%s: drew token %d whose logit is %g", what, (int)tok, (double)x[tok]);
}

/* The reported case: temperature 1e38 made the cutoff m - 30*T -inf, the
 * masked tokens became candidates and exp of -inf was converted to an
 * integer; token 7 (a -inf logit) was drawn every time. */
static void test_huge_temperature_never_draws_masked(void **state)
{
    (void)state;
    const float x[8] = { 0, -INFINITY, 1, -INFINITY, 2, 0.5f, -INFINITY, -INFINITY };
    dsq_sampler_params p = dsq_sampler_default_params();
    p.temperature = 1e38f;
    dsq_sampler *s = NULL;
    assert_int_equal(dsq_sampler_new(&p, &s), DSQ_OK);
    int count[8] = { 0 };
    for (int i = 0; i < 1000; i++) {
        int32_t tok = -1;
        assert_int_equal(dsq_sampler_sample(s, x, 8, &tok), DSQ_OK);
        check_draw(x, 8, tok, "T=1e38");
        count[tok]++;
    }
    printf("  T=1e38 over {0,-inf,1,-inf,2,0.5,-inf,-inf}: %d %d %d %d %d %d %d %d\n", count[0],
           count[1], count[2], count[3], count[4], count[5], count[6], count[7]);
    /* T -> inf is uniform over the finite logits (top-p 0.95 of four equal
     * masses keeps all four): each expected 250 of 1000 */
    for (int i = 0; i < 8; i++)
        if (isfinite(x[i]))
            assert_true(count[i] > 150 && count[i] < 350);
    dsq_sampler_free(s);
}

/* Every combination of extreme temperatures, filters and penalties over
 * logit sets with -inf, NaN, +inf and values near +-FLT_MAX.  Under UBSan
 * (the sanitizer build) this also checks that no float-to-int conversion or
 * shift is out of range. */
static void test_nonfinite_logits_any_settings(void **state)
{
    (void)state;
    const float NA = NAN, NI = -INFINITY;
    const float sets[][8] = {
        { 0, NI, 1, NI, 2, 0.5f, NI, NI },
        { NA, NI, 3, NA, NI, -1, NA, 2.5f },
        { -FLT_MAX, FLT_MAX, NI, 1, NA, -3e38f, 3e38f, NI },
        { -3e38f, NI, -FLT_MAX, -1e38f, NA, NI, -2e38f, NI },
        { NI, NI, NI, 5, NI, NI, NI, NI },
        { 1, INFINITY, NI, NA, INFINITY, 2, NI, 0 },
    };
    const float temps[] = { 1e-30f, 1e-6f, 0.6f, 1, 100, 1e6f, 1e20f, 1e37f, 1.2e37f, 1e38f, FLT_MAX };
    const int topk[] = { 0, 1, 3, 5, 8, 2000 };
    const float topp[] = { 0.1f, 0.95f, 1 };
    const float minp[] = { 0, 0.5f, 1 };
    const float pens[] = { 1, 1.5f, 1e30f };
    long draws = 0;
    for (size_t si = 0; si < sizeof sets / sizeof sets[0]; si++)
        for (size_t ti = 0; ti < sizeof temps / sizeof temps[0]; ti++)
            for (size_t ki = 0; ki < sizeof topk / sizeof topk[0]; ki++)
                for (size_t pi = 0; pi < sizeof topp / sizeof topp[0]; pi++)
                    for (size_t mi = 0; mi < sizeof minp / sizeof minp[0]; mi++)
                        for (size_t ri = 0; ri < sizeof pens / sizeof pens[0]; ri++) {
                            dsq_sampler_params p = dsq_sampler_default_params();
                            p.temperature = temps[ti];
                            p.top_k = topk[ki];
                            p.top_p = topp[pi];
                            p.min_p = minp[mi];
                            p.repetition_penalty = pens[ri];
                            p.seed = draws;
                            dsq_sampler *s = NULL;
                            assert_int_equal(dsq_sampler_new(&p, &s), DSQ_OK);
                            /* penalised logits, as the sampler sees them
                             * (history: tokens 0, 3 and 6) */
                            float y[8];
                            memcpy(y, sets[si], sizeof y);
                            if (pens[ri] != 1) {
                                const int32_t hist[3] = { 0, 3, 6 };
                                assert_int_equal(dsq_sampler_accept(s, hist, 3), DSQ_OK);
                                for (int h = 0; h < 3; h++)
                                    y[hist[h]] = y[hist[h]] > 0 ? y[hist[h]] / pens[ri]
                                                                : y[hist[h]] * pens[ri];
                            }
                            char what[160];
                            snprintf(what, sizeof what, "set %zu T %g top_k %d top_p %g min_p %g pen %g",
                                     si, (double)temps[ti], topk[ki], (double)topp[pi],
                                     (double)minp[mi], (double)pens[ri]);
                            for (int d = 0; d < 8; d++) {
                                int32_t tok = -1;
                                dsq_status st = dsq_sampler_sample(s, sets[si], 8, &tok);
                                if (st != DSQ_OK)
                                    fail_msg("%s: %s (%s)", what, dsq_status_string(st),
                                             dsq_last_error_message());
                                check_draw(y, 8, tok, what);
                                draws++;
                                if (pens[ri] != 1) { /* keep the history as above */
                                    const int32_t hist[3] = { 0, 3, 6 };
                                    dsq_sampler_reset(s, (uint64_t)draws);
                                    assert_int_equal(dsq_sampler_accept(s, hist, 3), DSQ_OK);
                                }
                            }
                            dsq_sampler_free(s);
                        }
    printf("  %ld draws with non-finite logits and extreme settings: none masked\n", draws);
}

/* A full-size vocabulary (the vectorized and histogram paths): half the
 * tokens -inf, some NaN, temperature 1e38 and FLT_MAX. */
static void test_nonfinite_full_vocab(void **state)
{
    (void)state;
    const int n = 151936;
    float *x = malloc(sizeof(float) * n);
    assert_non_null(x);
    random_logits(x, n, 2.0, 99);
    for (int i = 0; i < n; i++) {
        if (i % 2)
            x[i] = -INFINITY;
        else if (i % 97 == 0)
            x[i] = NAN;
    }
    const float temps[3] = { 1e38f, FLT_MAX, 5e36f };
    for (int t = 0; t < 3; t++) {
        dsq_sampler_params p = dsq_sampler_default_params();
        p.temperature = temps[t];
        dsq_sampler *s = NULL;
        assert_int_equal(dsq_sampler_new(&p, &s), DSQ_OK);
        for (int d = 0; d < 200; d++) {
            int32_t tok = -1;
            assert_int_equal(dsq_sampler_sample(s, x, n, &tok), DSQ_OK);
            check_draw(x, n, tok, "full vocabulary");
        }
        dsq_sampler_free(s);
    }
    free(x);
}

/* After the first call at a vocabulary size, sampling allocates nothing. */
static void test_no_allocation_after_first(void **state)
{
    (void)state;
    const int n = 151936;
    float *x = malloc(sizeof(float) * n);
    random_logits(x, n, 1.5, 77);
    dsq_sampler_params p = dsq_sampler_default_params();
    p.top_k = 40;
    p.min_p = 0.01f;
    p.repetition_penalty = 1.1f;
    dsq_sampler *s = NULL;
    assert_int_equal(dsq_sampler_new(&p, &s), DSQ_OK);
    int32_t tok;
    assert_int_equal(dsq_sampler_sample(s, x, n, &tok), DSQ_OK);
    struct mallinfo2 before = mallinfo2();
    for (int i = 0; i < 50; i++)
        assert_int_equal(dsq_sampler_sample(s, x, n, &tok), DSQ_OK);
    dsq_sampler_reset(s, 3);
    for (int i = 0; i < 20; i++)
        assert_int_equal(dsq_sampler_sample(s, x, n - 100, &tok), DSQ_OK);
    struct mallinfo2 after = mallinfo2();
    assert_int_equal(before.uordblks, after.uordblks);
    assert_int_equal(before.hblkhd, after.hblkhd);
    dsq_sampler_free(s);
    free(x);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_greedy_is_argmax),
        cmocka_unit_test(test_seed_reproducible),
        cmocka_unit_test(test_distributions),
        cmocka_unit_test(test_padding_never_sampled),
        cmocka_unit_test(test_repetition_penalty),
        cmocka_unit_test(test_invalid_params),
        cmocka_unit_test(test_no_allocation_after_first),
        cmocka_unit_test(test_huge_temperature_never_draws_masked),
        cmocka_unit_test(test_nonfinite_logits_any_settings),
        cmocka_unit_test(test_nonfinite_full_vocab),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
