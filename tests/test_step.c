/* test_step.c - dsq_step() on the CPU backend (tiny model) and the host
 * sampling row it uses (lib/sample_cpu.c):
 *  - greedy is the argmax of the logits the same call returns; log-probs and
 *    top-n equal log_softmax of those logits computed here in double;
 *  - a mixed step (decodes beside prompt chunks, new and continued
 *    sequences) gives the logits of separate dsq_prefill / dsq_decode_step
 *    calls;
 *  - misuse is refused with the documented status and changes nothing;
 *  - penalties (repetition, presence, frequency) over the sequence's own
 *    tokens, padding ids never drawn, draws reproducible from (seed,
 *    position) and distributed as the reference (chi-square). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "sample_ref.h"
#include "testutil.h"

static dsq_model *g_model;
static int32_t g_V;

static int setup(void **state)
{
    (void)state;
    char *dir = dsq_test_path("tiny");
    dsq_model_params mp = dsq_model_default_params();
    mp.backend = DSQ_BACKEND_CPU;
    dsq_status st = dsq_model_load(dir, &mp, &g_model);
    free(dir);
    if (st != DSQ_OK)
        return -1;
    dsq_model_info mi;
    memset(&mi, 0, sizeof mi);
    mi.struct_size = sizeof mi;
    dsq_model_get_info(g_model, &mi);
    g_V = mi.n_vocab;
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    dsq_model_free(g_model);
    return 0;
}

static dsq_ctx *new_ctx(int32_t max_seqs, int32_t kv_layout)
{
    dsq_ctx_params cp = dsq_ctx_default_params();
    cp.max_seqs = max_seqs;
    cp.max_context = 256;
    cp.max_batch_tokens = 64;
    cp.kv_layout = kv_layout;
    cp.kv_dtype = DSQ_KV_F32;
    cp.n_threads = 2;
    dsq_ctx *c = NULL;
    assert_int_equal(dsq_ctx_new(g_model, &cp, &c), DSQ_OK);
    return c;
}

static void prompt_of(int32_t *t, int n, uint64_t seed)
{
    for (int i = 0; i < n; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        t[i] = (int32_t)((seed >> 33) % (uint64_t)g_V);
    }
}

/* ---- greedy, log-probs, top-n --------------------------------------------- */

static void check_row_stats(const float *x, int n, const dsq_step_out *o, int top_n)
{
    double m = -INFINITY, s = 0.0;
    for (int i = 0; i < n; i++)
        m = x[i] > m ? x[i] : m;
    for (int i = 0; i < n; i++)
        s += exp((double)x[i] - m);
    double lse = m + log(s);
    int am = (int)dsq_argmax(x, (size_t)n);
    assert_int_equal(o->token, am);
    assert_true(fabs(o->logprob - ((double)x[am] - lse)) < 1e-4);
    assert_int_equal(o->n_top, top_n);
    for (int k = 0; k < top_n; k++) {
        /* the k-th in (logit desc, id asc) order */
        int id = o->top_ids[k];
        int rank = 0;
        for (int i = 0; i < n; i++)
            rank += x[i] > x[id] || (x[i] == x[id] && i < id);
        assert_int_equal(rank, k);
        assert_true(fabs(o->top_logprobs[k] - ((double)x[id] - lse)) < 1e-4);
    }
}

static void test_greedy_logprobs(void **state)
{
    (void)state;
    dsq_ctx *a = new_ctx(4, DSQ_KV_STATIC), *b = new_ctx(4, DSQ_KV_STATIC);
    dsq_sample_params g = dsq_sample_default_params();
    g.temperature = 0.0f;
    float *lg = malloc(sizeof(float) * (size_t)g_V * 3), *ref = malloc(sizeof(float) * (size_t)g_V * 3);
    int32_t pr[3][20], seqs[3] = {0, 1, 2}, tok[3];
    dsq_step_seq e[3];
    dsq_step_out out[3];
    dsq_step_params sp = dsq_step_default_params();
    sp.logits = lg;
    for (int i = 0; i < 3; i++) {
        prompt_of(pr[i], 5 + 7 * i, 11 + i);
        e[i] = (dsq_step_seq){ i, 5 + 7 * i, pr[i], &g, 5, DSQ_STEP_LOGITS | DSQ_STEP_LOGPROB };
        assert_int_equal(dsq_prefill(b, i, pr[i], 5 + 7 * i, DSQ_LOGITS_LAST, ref + (size_t)i * g_V), DSQ_OK);
    }
    /* the three prompts as one step */
    assert_int_equal(dsq_step(a, e, 3, &sp, out), DSQ_OK);
    for (int i = 0; i < 3; i++) {
        assert_true(dsq_rel_err(lg + (size_t)i * g_V, ref + (size_t)i * g_V, (size_t)g_V) < 1e-4);
        check_row_stats(lg + (size_t)i * g_V, g_V, &out[i], 5);
        tok[i] = out[i].token;
    }
    for (int step = 0; step < 8; step++) {
        for (int i = 0; i < 3; i++)
            e[i] = (dsq_step_seq){ i, 1, &tok[i], &g, 3, DSQ_STEP_LOGITS | DSQ_STEP_LOGPROB };
        assert_int_equal(dsq_step(a, e, 3, &sp, out), DSQ_OK);
        assert_int_equal(dsq_decode_step(b, 3, seqs, tok, ref), DSQ_OK);
        for (int i = 0; i < 3; i++) {
            assert_true(dsq_rel_err(lg + (size_t)i * g_V, ref + (size_t)i * g_V, (size_t)g_V) < 1e-4);
            check_row_stats(lg + (size_t)i * g_V, g_V, &out[i], 3);
            tok[i] = out[i].token;
        }
    }
    int32_t n = 0;
    assert_int_equal(dsq_seq_length(a, 2, &n), DSQ_OK);
    assert_int_equal(n, 19 + 8);
    free(lg);
    free(ref);
    dsq_ctx_free(a);
    dsq_ctx_free(b);
}

/* ---- mixed steps ------------------------------------------------------------ */

static void run_mixed(int32_t layout)
{
    dsq_ctx *a = new_ctx(4, layout), *b = new_ctx(4, layout);
    int32_t p0[12], p1[9], p2[6], c1[4], d0 = 17, d2 = 23;
    prompt_of(p0, 12, 1);
    prompt_of(p1, 9, 2);
    prompt_of(p2, 6, 3);
    prompt_of(c1, 4, 4);
    float *lg = malloc(sizeof(float) * (size_t)g_V * 3), *ref = malloc(sizeof(float) * (size_t)g_V * 3);
    dsq_step_params sp = dsq_step_default_params();
    sp.logits = lg;
    /* step 1: seq 0 and 2 start with prompts, seq 1 with the first 5 of its prompt (no logits) */
    dsq_step_seq e1[3] = {
        { 0, 12, p0, NULL, 0, DSQ_STEP_LOGITS },
        { 1, 5, p1, NULL, 0, 0 },
        { 2, 6, p2, NULL, 0, DSQ_STEP_LOGITS },
    };
    assert_int_equal(dsq_step(a, e1, 3, &sp, NULL), DSQ_OK);
    assert_int_equal(dsq_prefill(b, 0, p0, 12, DSQ_LOGITS_LAST, ref), DSQ_OK);
    assert_int_equal(dsq_prefill(b, 1, p1, 5, DSQ_LOGITS_LAST, NULL), DSQ_OK);
    assert_int_equal(dsq_prefill(b, 2, p2, 6, DSQ_LOGITS_LAST, ref + g_V), DSQ_OK);
    for (int i = 0; i < 2; i++)
        assert_true(dsq_rel_err(lg + (size_t)i * g_V, ref + (size_t)i * g_V, (size_t)g_V) < 1e-4);
    /* step 2: decode 0 and 2 beside the rest of seq 1's prompt plus a chunk */
    int32_t rest[8];
    memcpy(rest, p1 + 5, 4 * sizeof(int32_t));
    memcpy(rest + 4, c1, 4 * sizeof(int32_t));
    dsq_step_seq e2[3] = {
        { 2, 1, &d2, NULL, 0, DSQ_STEP_LOGITS },
        { 1, 8, rest, NULL, 0, DSQ_STEP_LOGITS },
        { 0, 1, &d0, NULL, 0, DSQ_STEP_LOGITS },
    };
    assert_int_equal(dsq_step(a, e2, 3, &sp, NULL), DSQ_OK);
    int32_t s2[2] = {2, 0}, t2[2] = {d2, d0};
    float *ref2 = malloc(sizeof(float) * (size_t)g_V * 2);
    assert_int_equal(dsq_decode_step(b, 2, s2, t2, ref2), DSQ_OK);
    assert_int_equal(dsq_prefill(b, 1, rest, 8, DSQ_LOGITS_LAST, ref), DSQ_OK);
    double e_a = dsq_rel_err(lg, ref2, (size_t)g_V), e_b = dsq_rel_err(lg + g_V, ref, (size_t)g_V),
           e_c = dsq_rel_err(lg + 2 * (size_t)g_V, ref2 + g_V, (size_t)g_V);
    printf("  mixed vs separate (layout %d): %.2e %.2e %.2e\n", layout, e_a, e_b, e_c);
    assert_true(e_a < 1e-4 && e_b < 1e-4 && e_c < 1e-4);
    for (int s = 0; s < 3; s++) {
        int32_t na = 0, nb = 0;
        dsq_seq_length(a, s, &na);
        dsq_seq_length(b, s, &nb);
        assert_int_equal(na, nb);
        assert_int_equal(a->hist.len[s], na);
        /* the kept tokens are the sequence's tokens in order */
        assert_int_equal(b->hist.len[s], nb);
        assert_memory_equal(a->hist.tok[s], b->hist.tok[s], sizeof(int32_t) * (size_t)na);
    }
    assert_int_equal(a->hist.len[1], 13);
    assert_memory_equal(a->hist.tok[1], p1, sizeof(int32_t) * 9);
    assert_memory_equal(a->hist.tok[1] + 9, c1, sizeof(int32_t) * 4);
    free(lg);
    free(ref);
    free(ref2);
    dsq_ctx_free(a);
    dsq_ctx_free(b);
}

static void test_mixed_step(void **state)
{
    (void)state;
    run_mixed(DSQ_KV_STATIC);
    run_mixed(DSQ_KV_PAGED);
}

/* ---- misuse ----------------------------------------------------------------- */

static void expect(dsq_ctx *c, const dsq_step_seq *e, int n, const dsq_step_params *sp, dsq_step_out *o,
                   dsq_status want, const char *what)
{
    int32_t before[3], hist[3];
    for (int s = 0; s < 3; s++) {
        dsq_seq_length(c, s, &before[s]);
        hist[s] = c->hist.len[s];
    }
    dsq_status st = dsq_step(c, e, n, sp, o);
    if (st != want)
        fail_msg("%s: got %s, want %s (%s)", what, dsq_status_string(st), dsq_status_string(want),
                 dsq_last_error_message());
    assert_true(strlen(dsq_ctx_last_error(c)) > 0);
    for (int s = 0; s < 3; s++) {
        int32_t now;
        dsq_seq_length(c, s, &now);
        assert_int_equal(now, before[s]);
        assert_int_equal(c->hist.len[s], hist[s]);
    }
}

static void test_misuse(void **state)
{
    (void)state;
    dsq_ctx *c = new_ctx(3, DSQ_KV_PAGED);
    int32_t p[8], t1 = 5, bad = g_V;
    prompt_of(p, 8, 9);
    dsq_sample_params g = dsq_sample_default_params();
    dsq_step_out out[3];
    dsq_step_seq ok = { 0, 8, p, &g, 0, 0 };
    assert_int_equal(dsq_step(c, &ok, 1, NULL, out), DSQ_OK);
    dsq_step_seq two[2] = { { 1, 1, &t1, &g, 0, 0 }, { 1, 1, &t1, &g, 0, 0 } };
    expect(c, two, 2, NULL, out, DSQ_ERR_INVALID_ARG, "repeated id");
    dsq_step_seq empty[2] = { { 0, 1, &t1, &g, 0, 0 }, { 1, 0, &t1, &g, 0, 0 } };
    expect(c, empty, 2, NULL, out, DSQ_ERR_INVALID_ARG, "empty entry");
    dsq_step_seq nul = { 0, 1, NULL, &g, 0, 0 };
    expect(c, &nul, 1, NULL, out, DSQ_ERR_INVALID_ARG, "NULL tokens");
    expect(c, NULL, 1, NULL, out, DSQ_ERR_INVALID_ARG, "NULL seqs");
    expect(c, &ok, 0, NULL, out, DSQ_ERR_INVALID_ARG, "no entries");
    dsq_step_seq badtok[2] = { { 0, 1, &t1, &g, 0, 0 }, { 1, 1, &bad, &g, 0, 0 } };
    expect(c, badtok, 2, NULL, out, DSQ_ERR_TOKEN, "token out of range");
    dsq_step_seq badseq = { 3, 1, &t1, &g, 0, 0 };
    expect(c, &badseq, 1, NULL, out, DSQ_ERR_SEQ, "seq out of range");
    dsq_step_seq e = { 0, 1, &t1, &g, 0, 0 };
    expect(c, &e, 1, NULL, NULL, DSQ_ERR_INVALID_ARG, "out NULL");
    dsq_step_seq topn = { 0, 1, &t1, &g, 21, 0 };
    expect(c, &topn, 1, NULL, out, DSQ_ERR_INVALID_ARG, "top_n 21");
    dsq_step_seq flags = { 0, 1, &t1, &g, 0, 0x80 };
    expect(c, &flags, 1, NULL, out, DSQ_ERR_INVALID_ARG, "unknown flag");
    dsq_step_seq lp = { 0, 1, &t1, NULL, 0, DSQ_STEP_LOGPROB };
    expect(c, &lp, 1, NULL, out, DSQ_ERR_INVALID_ARG, "logprob without sampling");
    dsq_step_seq wantl = { 0, 1, &t1, &g, 0, DSQ_STEP_LOGITS };
    expect(c, &wantl, 1, NULL, out, DSQ_ERR_INVALID_ARG, "logits flag without buffer");
    float dummy[4];
    dsq_step_params dev = dsq_step_default_params();
    dev.logits = dummy;
    dev.logits_on_device = 1;
    expect(c, &wantl, 1, &dev, out, DSQ_ERR_UNSUPPORTED, "device logits on the CPU");
    dsq_step_params nol = dsq_step_default_params();
    nol.logits = dummy;
    expect(c, &e, 1, &nol, out, DSQ_ERR_INVALID_ARG, "logits buffer but no entry wants logits");
    dsq_step_params badsz = dsq_step_default_params();
    badsz.struct_size = 3;
    expect(c, &e, 1, &badsz, out, DSQ_ERR_STRUCT_SIZE, "step params size");
    int32_t many[65] = {0};
    dsq_step_seq big = { 1, 65, many, NULL, 0, 0 };
    expect(c, &big, 1, NULL, out, DSQ_ERR_BATCH, "over max_batch_tokens");
    struct { const char *what; dsq_sample_params p; } bads[9];
    for (int i = 0; i < 9; i++)
        bads[i].p = dsq_sample_default_params();
    bads[0].what = "NaN temperature"; bads[0].p.temperature = NAN;
    bads[1].what = "negative temperature"; bads[1].p.temperature = -0.5f;
    bads[2].what = "top_p 0"; bads[2].p.top_p = 0.0f;
    bads[3].what = "top_p 1.5"; bads[3].p.top_p = 1.5f;
    bads[4].what = "min_p 2"; bads[4].p.min_p = 2.0f;
    bads[5].what = "repetition 0"; bads[5].p.repetition_penalty = 0.0f;
    bads[6].what = "presence inf"; bads[6].p.presence_penalty = INFINITY;
    bads[7].what = "window too long"; bads[7].p.penalty_last_n = DSQ_PENALTY_MAX_N + 1;
    bads[8].what = "top_k negative"; bads[8].p.top_k = -1;
    for (int i = 0; i < 9; i++) {
        /* a good entry first: the refusal must leave it unchanged too */
        dsq_step_seq pair[2] = { { 0, 1, &t1, &g, 0, 0 }, { 1, 1, &t1, &bads[i].p, 0, 0 } };
        expect(c, pair, 2, NULL, out, DSQ_ERR_INVALID_ARG, bads[i].what);
    }
    dsq_sample_params small = dsq_sample_default_params();
    small.struct_size = 2;
    dsq_step_seq ss = { 0, 1, &t1, &small, 0, 0 };
    expect(c, &ss, 1, NULL, out, DSQ_ERR_STRUCT_SIZE, "sample params size");
    /* a sequence near max_context (256): 250 + 7 tokens do not fit */
    int32_t fill[250];
    prompt_of(fill, 250, 8);
    assert_int_equal(dsq_prefill(c, 2, fill, 250, DSQ_LOGITS_LAST, NULL), DSQ_OK);
    dsq_step_seq over[2] = { { 0, 1, &t1, &g, 0, 0 }, { 2, 7, many, NULL, 0, 0 } };
    expect(c, over, 2, NULL, out, DSQ_ERR_CONTEXT_FULL, "context full");
    /* after all the refusals the sequence still continues */
    assert_int_equal(dsq_step(c, &e, 1, NULL, out), DSQ_OK);
    int32_t n = 0;
    dsq_seq_length(c, 0, &n);
    assert_int_equal(n, 9);
    dsq_ctx_free(c);
}

/* ---- host sampling row ----------------------------------------------------- */

static dsq_samp_row row_of(ref_cfg c, int n, uint64_t seed, int32_t pos)
{
    dsq_samp_row r;
    memset(&r, 0, sizeof r);
    r.temperature = c.temperature;
    r.top_k = c.top_k;
    r.top_p = c.top_p;
    r.min_p = c.min_p;
    r.rep_pen = 1.0f;
    r.n_valid = n;
    r.flags = DSQ_SROW_SAMPLE;
    r.seed_lo = (uint32_t)seed;
    r.seed_hi = (uint32_t)(seed >> 32);
    r.hist_len = pos;
    r.out_row = -1;
    return r;
}

/* dsq_ctx_synchronize / dsq_ctx_cuda_stream on the CPU backend: synchronous,
 * no stream (UNSUPPORTED, *stream cleared), NULLs refused. */
static void test_sync_and_stream_cpu(void **state)
{
    (void)state;
    dsq_ctx *c = new_ctx(1, DSQ_KV_STATIC);
    assert_int_equal(dsq_ctx_synchronize(c), DSQ_OK);
    assert_int_equal(dsq_ctx_synchronize(NULL), DSQ_ERR_INVALID_ARG);
    void *s = (void *)&s;
    assert_int_equal(dsq_ctx_cuda_stream(c, &s), DSQ_ERR_UNSUPPORTED);
    assert_null(s);
    assert_non_null(strstr(dsq_ctx_last_error(c), "cpu backend"));
    assert_int_equal(dsq_ctx_cuda_stream(c, NULL), DSQ_ERR_INVALID_ARG);
    s = (void *)&s;
    assert_int_equal(dsq_ctx_cuda_stream(NULL, &s), DSQ_ERR_INVALID_ARG);
    assert_null(s);
    dsq_ctx_free(c);
}

static void test_cpu_row_distribution(void **state)
{
    (void)state;
    enum { N = 1001, DRAWS = 20000 };
    const ref_cfg cfgs[] = {
        { 1.0f, 0, 1.0f, 0.0f }, { 0.6f, 0, 0.95f, 0.0f }, { 0.8f, 40, 1.0f, 0.0f },
        { 1.3f, 0, 0.7f, 0.05f }, { 0.7f, 200, 0.9f, 0.0f },
    };
    float *x = malloc(sizeof(float) * N);
    double *q = malloc(sizeof(double) * N);
    int *counts = malloc(sizeof(int) * N);
    dsq_sample_ws *ws = NULL;
    assert_int_equal(dsq_sample_ws_new(N, &ws), DSQ_OK);
    int32_t hist[1] = {0};
    for (size_t k = 0; k < sizeof cfgs / sizeof cfgs[0]; k++) {
        uint64_t ls = 100 + k;
        do
            ref_random_logits(x, N, 2.5, ls++);
        while (ref_distribution(x, N, cfgs[k], q) < 1e-4);
        memset(counts, 0, sizeof(int) * N);
        for (int d = 0; d < DRAWS; d++) {
            dsq_samp_row r = row_of(cfgs[k], N, 77 + (uint64_t)d * 1000003ull, 5 + d % 97);
            dsq_samp_result res;
            assert_int_equal(dsq_sample_cpu_row(ws, x, N, &r, hist, &res), DSQ_OK);
            assert_true(res.token >= 0 && res.token < N);
            assert_true(q[res.token] > 0.0);
            counts[res.token]++;
        }
        int df = 0;
        double chi = ref_chi_square(counts, q, N, DRAWS, &df);
        printf("  host row T=%.1f k=%d p=%.2f min_p=%.2f: chi2 %.1f (df %d, limit %.1f)\n",
               (double)cfgs[k].temperature, cfgs[k].top_k, (double)cfgs[k].top_p, (double)cfgs[k].min_p, chi,
               df, ref_chi_limit(df));
        assert_true(chi < ref_chi_limit(df));
    }
    /* the same (seed, position) draws the same token; another position need not */
    dsq_samp_row r = row_of(cfgs[0], N, 42, 10);
    dsq_samp_result a, b;
    dsq_sample_cpu_row(ws, x, N, &r, hist, &a);
    dsq_sample_cpu_row(ws, x, N, &r, hist, &b);
    assert_int_equal(a.token, b.token);
    int differs = 0;
    for (int pos = 11; pos < 40; pos++) {
        r.hist_len = pos;
        dsq_sample_cpu_row(ws, x, N, &r, hist, &b);
        differs |= b.token != a.token;
    }
    assert_true(differs);
    dsq_sample_ws_free(ws);
    free(x);
    free(q);
    free(counts);
}

static void test_cpu_row_penalties_padding(void **state)
{
    (void)state;
    enum { N = 64 };
    float x[N];
    for (int i = 0; i < N; i++)
        x[i] = -2.0f + 0.01f * (float)i;
    x[5] = 3.0f;
    x[7] = 2.9f;
    x[9] = 2.6f;
    x[60] = 50.0f; /* a "padding" id above n_valid */
    dsq_sample_ws *ws = NULL;
    assert_int_equal(dsq_sample_ws_new(N, &ws), DSQ_OK);
    int32_t hist[6] = {5, 1, 5, 7, 2, 3};
    dsq_samp_row r = row_of((ref_cfg){ 0.0f, 0, 1.0f, 0.0f }, 50, 1, 6);
    dsq_samp_result res;
    assert_int_equal(dsq_sample_cpu_row(ws, x, N, &r, hist, &res), DSQ_OK);
    assert_int_equal(res.token, 5); /* no penalty; 60 is padding */
    r.rep_pen = 1.2f;
    r.pen_n = 64;
    r.flags |= DSQ_SROW_LOGPROB;
    /* 5: 3/1.2 = 2.5, 7: 2.9/1.2 = 2.417 -> 9 (2.6) wins */
    assert_int_equal(dsq_sample_cpu_row(ws, x, N, &r, hist, &res), DSQ_OK);
    assert_int_equal(res.token, 9);
    r.rep_pen = 1.0f;
    r.freq_pen = 0.2f; /* 5 seen twice: 3 - 0.4 = 2.6 ties 9 at 2.6 -> lower id 5... */
    r.pres_pen = 0.01f; /* ... unless presence also applies: 2.59 -> 7 (2.9 - 0.21 = 2.69) wins */
    assert_int_equal(dsq_sample_cpu_row(ws, x, N, &r, hist, &res), DSQ_OK);
    assert_int_equal(res.token, 7);
    /* the window: only the last 2 tokens (2, 3) -> no penalty on 5 */
    r.pen_n = 2;
    assert_int_equal(dsq_sample_cpu_row(ws, x, N, &r, hist, &res), DSQ_OK);
    assert_int_equal(res.token, 5);
    /* the log-prob is of the raw logits over ids < n_valid */
    double m = 3.0, s = 0.0;
    for (int i = 0; i < 50; i++)
        s += exp((double)x[i] - m);
    assert_true(fabs(res.logprob - (3.0 - (m + log(s)))) < 1e-5);
    /* sampling never draws padding even when it dominates */
    dsq_samp_row t = row_of((ref_cfg){ 1.0f, 0, 1.0f, 0.0f }, 50, 3, 6);
    for (int d = 0; d < 500; d++) {
        t.hist_len = d;
        assert_int_equal(dsq_sample_cpu_row(ws, x, N, &t, hist, &res), DSQ_OK);
        assert_true(res.token < 50);
    }
    dsq_sample_ws_free(ws);
}

/* Penalties through the API use the library's own copy of the tokens: a
 * huge repetition penalty makes greedy avoid every token it has seen. */
static void test_api_penalty_history(void **state)
{
    (void)state;
    dsq_ctx *c = new_ctx(2, DSQ_KV_STATIC);
    int32_t p[6];
    prompt_of(p, 6, 5);
    assert_int_equal(dsq_prefill(c, 0, p, 6, DSQ_LOGITS_LAST, NULL), DSQ_OK);
    dsq_sample_params g = dsq_sample_default_params();
    g.temperature = 0.0f;
    g.repetition_penalty = 1e6f;
    g.penalty_last_n = 64;
    int32_t t = p[5];
    int32_t seen[64];
    int ns = 0;
    for (int i = 0; i < 6; i++)
        seen[ns++] = p[i];
    for (int step = 0; step < 12; step++) {
        dsq_step_seq e = { 0, 1, &t, &g, 0, 0 };
        dsq_step_out o;
        assert_int_equal(dsq_step(c, &e, 1, NULL, &o), DSQ_OK);
        seen[ns++] = t; /* t is now in the sequence */
        for (int i = 0; i < ns; i++)
            if (seen[i] == o.token)
                fail_msg("step %d drew %d, already in the sequence", step, o.token);
        t = o.token;
    }
    /* removing the sequence forgets its tokens */
    assert_int_equal(dsq_seq_remove(c, 0), DSQ_OK);
    assert_int_equal(c->hist.len[0], 0);
    dsq_ctx_free(c);
}

/* The history operations the sequence fork / truncate calls use. */
static void test_history_ops(void **state)
{
    (void)state;
    dsq_ctx *c = new_ctx(3, DSQ_KV_STATIC);
    int32_t p[250];
    prompt_of(p, 250, 21);
    assert_int_equal(dsq_prefill(c, 0, p, 250, DSQ_LOGITS_LAST, NULL), DSQ_OK);
    assert_int_equal(c->hist.len[0], 250);
    assert_memory_equal(c->hist.tok[0], p, sizeof(int32_t) * 250);
    assert_int_equal(dsq_seq_history_fork(c, 1, 0), DSQ_OK);
    assert_int_equal(c->hist.len[1], 250);
    assert_memory_equal(c->hist.tok[1], p, sizeof(int32_t) * 250);
    /* arrays grow by doubling and keep their tokens */
    assert_int_equal(dsq_hist_reserve(&c->hist, 1, 5000), DSQ_OK);
    assert_true(c->hist.cap[1] >= 5000);
    assert_memory_equal(c->hist.tok[1], p, sizeof(int32_t) * 250);
    assert_int_equal(dsq_seq_history_truncate(c, 1, 120), DSQ_OK);
    assert_int_equal(c->hist.len[1], 120);
    assert_int_equal(c->hist.len[0], 250);
    assert_int_not_equal(dsq_seq_history_truncate(c, 1, 121), DSQ_OK); /* beyond the length */
    assert_int_not_equal(dsq_seq_history_fork(c, 1, 1), DSQ_OK);
    dsq_seq_history_clear(c, 0);
    assert_int_equal(c->hist.len[0], 0);
    assert_int_equal(c->hist.len[1], 120);
    dsq_ctx_free(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_greedy_logprobs),
        cmocka_unit_test(test_mixed_step),
        cmocka_unit_test(test_misuse),
        cmocka_unit_test(test_sync_and_stream_cpu),
        cmocka_unit_test(test_cpu_row_distribution),
        cmocka_unit_test(test_cpu_row_penalties_padding),
        cmocka_unit_test(test_api_penalty_history),
        cmocka_unit_test(test_history_ops),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
