/*
 * test_tp_plan.c - the tensor-parallel split (lib/tp_plan.c):
 *  - for the shapes of the Qwen2 family (DeepSeek-R1-Distill-Qwen 1.5B, 7B,
 *    14B, 32B; Qwen2.5-72B) and every degree 1..8: the accepted degrees are
 *    exactly those whose heads / KV heads divide, and the ranks' slices
 *    cover every query head, KV head, FFN column and vocabulary row once
 *    (KV heads: once per replica), on aligned boundaries, each rank's query
 *    heads using only the KV heads it holds;
 *  - the sharded math equals the unsharded: a plain fp32 layer (RMSNorm,
 *    QKV with biases, RoPE, causal GQA attention, o_proj, SwiGLU FFN) run
 *    by W simulated ranks on their slices, partial o_proj / down outputs
 *    summed (the all-reduce) before each residual add, plus the lm_head
 *    slices concatenated, against the same code with W = 1, on random
 *    weights of odd sizes.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"
#include "tp_plan.h"

typedef struct shape {
    const char *name;
    int32_t E, H, KV, D, F, V;
} shape;

static const shape family[] = {
    {"1.5B", 1536, 12, 2, 128, 8960, 151936},   {"7B", 3584, 28, 4, 128, 18944, 152064},
    {"14B", 5120, 40, 8, 128, 13824, 152064},   {"32B", 5120, 40, 8, 128, 27648, 152064},
    {"72B", 8192, 64, 8, 128, 29568, 152064},
};

static dsq_config cfg_of(const shape *s)
{
    dsq_config c;
    memset(&c, 0, sizeof c);
    c.n_embd = s->E;
    c.n_heads = s->H;
    c.n_kv_heads = s->KV;
    c.head_dim = s->D;
    c.n_ff = s->F;
    c.n_vocab = s->V;
    c.n_layers = 1;
    c.rope_theta = 10000.0f;
    c.rms_eps = 1e-6f;
    return c;
}

static void check_cover(const dsq_config *c, int32_t w)
{
    int32_t *qh = calloc((size_t)c->n_heads, sizeof *qh), *kv = calloc((size_t)c->n_kv_heads, sizeof *kv);
    int32_t ff_next = 0, v_next = 0;
    const int32_t group = c->n_heads / c->n_kv_heads;
    for (int32_t r = 0; r < w; r++) {
        dsq_tp_slice s;
        assert_int_equal(dsq_tp_plan(c, r, w, &s), DSQ_OK);
        assert_true(s.n_q_heads > 0 && s.n_kv_heads > 0 && s.n_ff > 0 && s.n_vocab > 0);
        for (int32_t h = s.q_head0; h < s.q_head0 + s.n_q_heads; h++) {
            qh[h]++;
            /* the KV head of every local query head is local */
            assert_true(h / group >= s.kv_head0 && h / group < s.kv_head0 + s.n_kv_heads);
        }
        for (int32_t k = s.kv_head0; k < s.kv_head0 + s.n_kv_heads; k++)
            kv[k]++;
        assert_int_equal(s.ff0, ff_next); /* contiguous, in rank order */
        assert_int_equal(s.vocab0, v_next);
        if (r < w - 1) {
            assert_int_equal(s.n_ff % DSQ_TP_ALIGN, 0);
            assert_int_equal(s.n_vocab % DSQ_TP_ALIGN, 0);
        }
        ff_next += s.n_ff;
        v_next += s.n_vocab;
        int32_t reps = c->n_kv_heads % w == 0 ? 1 : w / c->n_kv_heads;
        assert_int_equal(s.kv_replicas, reps);
    }
    assert_int_equal(ff_next, c->n_ff);
    assert_int_equal(v_next, c->n_vocab);
    for (int32_t h = 0; h < c->n_heads; h++)
        assert_int_equal(qh[h], 1);
    int32_t reps = c->n_kv_heads % w == 0 ? 1 : w / c->n_kv_heads;
    for (int32_t k = 0; k < c->n_kv_heads; k++)
        assert_int_equal(kv[k], reps);
    free(qh);
    free(kv);
}

static void test_family_splits(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof family / sizeof family[0]; i++) {
        dsq_config c = cfg_of(&family[i]);
        char ok[64] = "";
        size_t k = 0;
        for (int32_t w = 1; w <= 8; w++) {
            int want = c.n_heads % w == 0 && (c.n_kv_heads % w == 0 || w % c.n_kv_heads == 0);
            dsq_tp_slice s;
            dsq_status st = dsq_tp_plan(&c, 0, w, &s);
            if (!want) {
                assert_int_equal(st, DSQ_ERR_UNSUPPORTED);
                assert_non_null(strstr(dsq_last_error_message(), "does not divide"));
                continue;
            }
            assert_int_equal(st, DSQ_OK);
            check_cover(&c, w);
            k += (size_t)snprintf(ok + k, sizeof ok - k, "%s%d", k ? "," : "", w);
        }
        printf("  %-5s heads %2d KV %d: degrees %s\n", family[i].name, c.n_heads, c.n_kv_heads, ok);
    }
    dsq_config c = cfg_of(&family[0]);
    dsq_tp_slice s;
    assert_int_equal(dsq_tp_plan(&c, 2, 2, &s), DSQ_ERR_INVALID_ARG);
    assert_int_equal(dsq_tp_plan(&c, 0, 0, &s), DSQ_ERR_INVALID_ARG);
    assert_int_equal(dsq_tp_plan(NULL, 0, 1, &s), DSQ_ERR_INVALID_ARG);
    assert_int_equal(dsq_tp_plan(&c, 0, 5, &s), DSQ_ERR_UNSUPPORTED);
    assert_non_null(strstr(dsq_last_error_message(), "degrees that do, up to 16: 1, 2, 4, 6, 12"));
}

/* ---- the sharded layer against the unsharded one ---------------------------- */

typedef struct layer {
    int32_t E, H, KV, D, F, V, T;
    float *attn_norm, *ffn_norm, *out_norm; /* [E] */
    float *wq, *bq;                          /* [H*D, E], [H*D] */
    float *wk, *bk, *wv, *bv;                /* [KV*D, E], [KV*D] */
    float *wo;                               /* [E, H*D] */
    float *wg, *wu;                          /* [F, E] */
    float *wd;                               /* [E, F] */
    float *lm;                               /* [V, E] */
} layer;

static float *rnd(size_t n, float scale, unsigned *seed)
{
    float *p = malloc(n * sizeof *p);
    for (size_t i = 0; i < n; i++) {
        *seed = *seed * 1664525u + 1013904223u;
        p[i] = scale * ((float)(*seed >> 8) / 16777216.0f - 0.5f);
    }
    return p;
}

static void rmsnorm(const float *x, const float *w, float *y, int32_t E)
{
    double ss = 0;
    for (int32_t i = 0; i < E; i++)
        ss += (double)x[i] * x[i];
    float r = (float)(1.0 / sqrt(ss / E + 1e-6));
    for (int32_t i = 0; i < E; i++)
        y[i] = x[i] * r * w[i];
}

/* y[rows] = W[row0.., col0..col0+n) . x[n] (+ b[row0..]) for W of row length ld */
static void matvec(const float *W, int32_t ld, int32_t row0, int32_t rows, int32_t col0, int32_t n,
                   const float *x, const float *b, float *y)
{
    for (int32_t r = 0; r < rows; r++) {
        double acc = b ? b[row0 + r] : 0.0;
        const float *w = W + (size_t)(row0 + r) * ld + col0;
        for (int32_t i = 0; i < n; i++)
            acc += (double)w[i] * x[i];
        y[r] = (float)acc;
    }
}

static void rope(float *v, int32_t D, int32_t pos)
{
    for (int32_t i = 0; i < D / 2; i++) {
        double a = pos * pow(10000.0, -2.0 * i / D);
        float x0 = v[i], x1 = v[i + D / 2];
        v[i] = (float)(x0 * cos(a) - x1 * sin(a));
        v[i + D / 2] = (float)(x0 * sin(a) + x1 * cos(a));
    }
}

/* Rank `s` of the attention half for all T tokens: partial[T][E] (its heads'
 * share of o_proj). */
static void attn_partial(const layer *L, const dsq_tp_slice *s, const float *x, float *partial)
{
    const int32_t E = L->E, D = L->D, T = L->T, nq = s->n_q_heads, nk = s->n_kv_heads;
    const int32_t group = L->H / L->KV;
    float *h = malloc(sizeof(float) * E), *q = malloc(sizeof(float) * (size_t)T * nq * D);
    float *k = malloc(sizeof(float) * (size_t)T * nk * D), *v = malloc(sizeof(float) * (size_t)T * nk * D);
    float *att = malloc(sizeof(float) * (size_t)nq * D), *sc = malloc(sizeof(float) * T);
    for (int32_t t = 0; t < T; t++) {
        rmsnorm(x + (size_t)t * E, L->attn_norm, h, E);
        matvec(L->wq, E, s->q_head0 * D, nq * D, 0, E, h, L->bq, q + (size_t)t * nq * D);
        matvec(L->wk, E, s->kv_head0 * D, nk * D, 0, E, h, L->bk, k + (size_t)t * nk * D);
        matvec(L->wv, E, s->kv_head0 * D, nk * D, 0, E, h, L->bv, v + (size_t)t * nk * D);
        for (int32_t j = 0; j < nq; j++)
            rope(q + ((size_t)t * nq + j) * D, D, t);
        for (int32_t j = 0; j < nk; j++)
            rope(k + ((size_t)t * nk + j) * D, D, t);
    }
    for (int32_t t = 0; t < T; t++) {
        for (int32_t j = 0; j < nq; j++) {
            const int32_t kvl = (s->q_head0 + j) / group - s->kv_head0; /* local KV head */
            const float *qv = q + ((size_t)t * nq + j) * D;
            double m = -INFINITY, z = 0;
            for (int32_t u = 0; u <= t; u++) {
                double d = 0;
                for (int32_t i = 0; i < D; i++)
                    d += (double)qv[i] * k[((size_t)u * nk + kvl) * D + i];
                sc[u] = (float)(d / sqrt((double)D));
                m = sc[u] > m ? sc[u] : m;
            }
            for (int32_t u = 0; u <= t; u++)
                z += exp(sc[u] - m);
            for (int32_t i = 0; i < D; i++) {
                double a = 0;
                for (int32_t u = 0; u <= t; u++)
                    a += exp(sc[u] - m) / z * v[((size_t)u * nk + kvl) * D + i];
                att[j * D + i] = (float)a;
            }
        }
        matvec(L->wo, L->H * D, 0, E, s->q_head0 * D, nq * D, att, NULL, partial + (size_t)t * E);
    }
    free(h), free(q), free(k), free(v), free(att), free(sc);
}

static void ffn_partial(const layer *L, const dsq_tp_slice *s, const float *x, float *partial)
{
    const int32_t E = L->E, nf = s->n_ff;
    float *h = malloc(sizeof(float) * E), *g = malloc(sizeof(float) * nf), *u = malloc(sizeof(float) * nf);
    for (int32_t t = 0; t < L->T; t++) {
        rmsnorm(x + (size_t)t * E, L->ffn_norm, h, E);
        matvec(L->wg, E, s->ff0, nf, 0, E, h, NULL, g);
        matvec(L->wu, E, s->ff0, nf, 0, E, h, NULL, u);
        for (int32_t i = 0; i < nf; i++)
            g[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
        matvec(L->wd, L->F, 0, E, s->ff0, nf, g, NULL, partial + (size_t)t * E);
    }
    free(h), free(g), free(u);
}

/* The whole layer and the head on `w` simulated ranks: logits[T][V]. */
static void run_ranks(const layer *L, const dsq_config *c, int32_t w, const float *x0, float *logits)
{
    const size_t TE = (size_t)L->T * L->E;
    float *x = malloc(sizeof(float) * TE), *sum = malloc(sizeof(float) * TE);
    float *part = malloc(sizeof(float) * TE), *h = malloc(sizeof(float) * L->E);
    memcpy(x, x0, sizeof(float) * TE);
    dsq_tp_slice s[8];
    for (int32_t r = 0; r < w; r++)
        assert_int_equal(dsq_tp_plan(c, r, w, &s[r]), DSQ_OK);
    for (int half = 0; half < 2; half++) {
        memset(sum, 0, sizeof(float) * TE);
        for (int32_t r = 0; r < w; r++) { /* the all-reduce: a sum of partials */
            if (half == 0)
                attn_partial(L, &s[r], x, part);
            else
                ffn_partial(L, &s[r], x, part);
            for (size_t i = 0; i < TE; i++)
                sum[i] += part[i];
        }
        for (size_t i = 0; i < TE; i++) /* residual after the reduction */
            x[i] += sum[i];
    }
    for (int32_t t = 0; t < L->T; t++) {
        rmsnorm(x + (size_t)t * L->E, L->out_norm, h, L->E);
        for (int32_t r = 0; r < w; r++) /* vocabulary slices, gathered */
            matvec(L->lm, L->E, s[r].vocab0, s[r].n_vocab, 0, L->E, h, NULL,
                   logits + (size_t)t * L->V + s[r].vocab0);
    }
    free(x), free(sum), free(part), free(h);
}

static void test_sharded_layer_equals_unsharded(void **state)
{
    (void)state;
    /* odd sizes: FFN and vocabulary not multiples of the alignment, 8 query
     * heads over 2 KV heads (degrees 1, 2, 4, 8: KV replicated at 4 and 8) */
    layer L = {.E = 72, .H = 8, .KV = 2, .D = 16, .F = 1000, .V = 777, .T = 5};
    unsigned seed = 20261203u;
    const int32_t E = L.E, QD = L.H * L.D, KD = L.KV * L.D;
    L.attn_norm = rnd((size_t)E, 2.0f, &seed);
    L.ffn_norm = rnd((size_t)E, 2.0f, &seed);
    L.out_norm = rnd((size_t)E, 2.0f, &seed);
    L.wq = rnd((size_t)QD * E, 0.4f, &seed);
    L.bq = rnd((size_t)QD, 0.2f, &seed);
    L.wk = rnd((size_t)KD * E, 0.4f, &seed);
    L.bk = rnd((size_t)KD, 0.2f, &seed);
    L.wv = rnd((size_t)KD * E, 0.4f, &seed);
    L.bv = rnd((size_t)KD, 0.2f, &seed);
    L.wo = rnd((size_t)E * QD, 0.2f, &seed);
    L.wg = rnd((size_t)L.F * E, 0.3f, &seed);
    L.wu = rnd((size_t)L.F * E, 0.3f, &seed);
    L.wd = rnd((size_t)E * L.F, 0.1f, &seed);
    L.lm = rnd((size_t)L.V * E, 0.3f, &seed);
    float *x0 = rnd((size_t)L.T * E, 2.0f, &seed);
    dsq_config c = cfg_of(&(shape){"test", L.E, L.H, L.KV, L.D, L.F, L.V});
    const size_t n = (size_t)L.T * L.V;
    float *ref = malloc(sizeof(float) * n), *got = malloc(sizeof(float) * n);
    run_ranks(&L, &c, 1, x0, ref);
    static const int32_t degrees[3] = {2, 4, 8};
    for (int i = 0; i < 3; i++) {
        for (size_t k = 0; k < n; k++)
            got[k] = NAN; /* every logit must be written by some rank */
        run_ranks(&L, &c, degrees[i], x0, got);
        double e = dsq_rel_err(got, ref, n);
        printf("  degree %d: logits rel err %.3g vs one rank\n", degrees[i], e);
        assert_true(e <= 1e-5);
    }
    free(ref), free(got), free(x0);
    float *bufs[] = {L.attn_norm, L.ffn_norm, L.out_norm, L.wq, L.bq, L.wk, L.bk, L.wv,
                     L.bv, L.wo, L.wg, L.wu, L.wd, L.lm};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        free(bufs[i]);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_family_splits),
        cmocka_unit_test(test_sharded_layer_equals_unsharded),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
