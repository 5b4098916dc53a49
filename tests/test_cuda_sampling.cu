/* test_cuda_sampling.cu - cuda/sampling.cu against lib/sample_cpu.c (the
 * host implementation of the same pipeline) on fresh random logits of odd
 * vocabulary sizes, outputs poisoned first:
 *  - greedy (penalties from random device histories included, ties planted):
 *    exactly the host's id; log-prob and top-n (ids exact, values 2e-4);
 *  - random sampling: per-token frequencies over 20,000 rows (one seed
 *    each, one launch) against the exact reference distribution (chi-square),
 *    for temperature / top-k / top-p / min-p mixes; on a 151,937-token
 *    near-flat row (random weights' case) the kept-set size equals the
 *    reference nucleus within 2 + 1/20000 of it and no draw falls outside it;
 *  - a row draws the same token whatever else is in the launch;
 *  - one CTA per row and clusters of 2 / 4 / 8 / 16 CTAs per row (sm_90;
 *    forced through DSQ_SAMPLE_CLUSTER) give bit-identical results on the
 *    same inputs (1, 2, 3, 8 and 37 rows: greedy, top-k, top-p, min-p,
 *    penalties, log-probs / top-n, ties, -inf, n_valid < V, rows of equal
 *    values), and the greedy / top-n tests run on every path; top-p's draw
 *    sums taken with the last gather pass or in their own pass
 *    (DSQ_SAMPLE_DRAW_FUSED) give the same results too;
 *  - through dsq_step on the tiny model: greedy == argmax of the logits the
 *    same call returns, device logits == host logits, a mixed step matches
 *    separate prefill / decode calls;
 *  - timing (printed): batches of 1, 2, 8, 64 and 256 rows of 151,936
 *    logits (1 and 8 also with one CTA per row forced, 64 also with
 *    clusters of 4 / 8 forced, 256 with clusters of 2 / 4 / 8).
 * Exits 77 (skipped) without a CUDA device. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>

extern "C" {
#include "testutil.h"
}
#include "internal.h"
#include "kernels.h"
#include "sample_ref.h"

#define CKC(x) assert_int_equal((int)(x), (int)cudaSuccess)

/* cuda/sampling.cu: CTAs per row dsq_cu_sample uses now for n rows */
extern "C" int dsq_cu_sample_cluster_size(int32_t n_rows);

/* DSQ_SAMPLE_CLUSTER for the next launches (NULL: automatic) */
static void set_cluster(const char *mode)
{
    if (mode)
        setenv("DSQ_SAMPLE_CLUSTER", mode, 1);
    else
        unsetenv("DSQ_SAMPLE_CLUSTER");
}

/* the modes every path test runs: automatic, one CTA per row, each cluster size */
static const char *const MODES[6] = {NULL, "0", "2", "4", "8", "16"};

typedef struct gpu_rows {
    float *d_logits;
    dsq_samp_row *d_rows;
    int32_t *d_ring;
    dsq_samp_result *d_res;
    int R;
} gpu_rows;

/* Run n rows (logits [n][V] host, rows [n]) with ring [n_seqs][R]; results
 * to res[n].  The device results are poisoned first. */
static void run_gpu(const float *logits, int n, int V, const dsq_samp_row *rows, const int32_t *ring, int n_seqs,
                    int R, dsq_samp_result *res)
{
    gpu_rows g;
    CKC(cudaMalloc((void **)&g.d_logits, sizeof(float) * (size_t)n * V));
    CKC(cudaMalloc((void **)&g.d_rows, sizeof(dsq_samp_row) * (size_t)n));
    CKC(cudaMalloc((void **)&g.d_ring, sizeof(int32_t) * (size_t)n_seqs * R));
    CKC(cudaMalloc((void **)&g.d_res, sizeof(dsq_samp_result) * (size_t)n));
    CKC(cudaMemcpy(g.d_logits, logits, sizeof(float) * (size_t)n * V, cudaMemcpyHostToDevice));
    CKC(cudaMemcpy(g.d_rows, rows, sizeof(dsq_samp_row) * (size_t)n, cudaMemcpyHostToDevice));
    CKC(cudaMemcpy(g.d_ring, ring, sizeof(int32_t) * (size_t)n_seqs * R, cudaMemcpyHostToDevice));
    CKC(cudaMemset(g.d_res, 0xAB, sizeof(dsq_samp_result) * (size_t)n));
    assert_int_equal(dsq_cu_sample(g.d_logits, n, V, g.d_rows, g.d_ring, R, g.d_res, 0), DSQ_OK);
    CKC(cudaDeviceSynchronize());
    CKC(cudaMemcpy(res, g.d_res, sizeof(dsq_samp_result) * (size_t)n, cudaMemcpyDeviceToHost));
    cudaFree(g.d_logits);
    cudaFree(g.d_rows);
    cudaFree(g.d_ring);
    cudaFree(g.d_res);
}

static dsq_samp_row mkrow(ref_cfg c, int n_valid, uint64_t seed, int32_t seq, int32_t pos)
{
    dsq_samp_row r;
    memset(&r, 0, sizeof r);
    r.temperature = c.temperature;
    r.top_k = c.top_k;
    r.top_p = c.top_p;
    r.min_p = c.min_p;
    r.rep_pen = 1.0f;
    r.n_valid = n_valid;
    r.flags = DSQ_SROW_SAMPLE;
    r.seed_lo = (uint32_t)seed;
    r.seed_hi = (uint32_t)(seed >> 32);
    r.seq = seq;
    r.hist_len = pos;
    r.out_row = -1;
    return r;
}

static void test_greedy_logprobs_penalties(void **state)
{
    (void)state;
    const int Vs[3] = {1001, 50257, 151937};
    const int R = 4096, NR = 37;
    for (int vi = 0; vi < 3; vi++) {
        const int V = Vs[vi];
        float *x = (float *)malloc(sizeof(float) * (size_t)NR * V);
        int32_t *ring = (int32_t *)calloc((size_t)NR * R, sizeof(int32_t));
        int32_t *hist = (int32_t *)malloc(sizeof(int32_t) * 600);
        dsq_samp_row rows[NR];
        dsq_samp_result got[NR], want;
        dsq_sample_ws *ws = NULL;
        assert_int_equal(dsq_sample_ws_new(V, &ws), DSQ_OK);
        for (int r = 0; r < NR; r++) {
            ref_random_logits(x + (size_t)r * V, V, 0.5 + r % 5, 1000 * vi + r);
            float *row = x + (size_t)r * V;
            if (r % 3 == 0) { /* planted ties at the maximum */
                int a = (r * 7919) % V, b = (r * 104729 + 13) % V;
                row[a] = row[b] = 40.0f;
            }
            if (r % 7 == 1)
                row[V - 1] = 1e4f; /* padding beats everything but is not valid */
            rows[r] = mkrow((ref_cfg){ 0.0f, 0, 1.0f, 0.0f }, r % 7 == 1 ? V - 3 : V, r, r, 50 + (r * 37) % 500);
            rows[r].flags |= DSQ_SROW_LOGPROB;
            rows[r].top_n = r % 21;
            if (r % 2) {
                rows[r].rep_pen = 1.0f + 0.1f * (r % 4);
                rows[r].freq_pen = 0.05f * (r % 3);
                rows[r].pres_pen = 0.3f;
                rows[r].pen_n = 1 + (r * 53) % 700;
            }
            /* history: favour the current top ids so penalties matter */
            for (int p = 0; p < rows[r].hist_len; p++) {
                int id = (int)(ref_urand() * V);
                if (p % 3 == 0)
                    id = (int)dsq_argmax(row, (size_t)rows[r].n_valid);
                ring[(size_t)r * R + p % R] = id;
            }
        }
        dsq_samp_result *want_all = (dsq_samp_result *)malloc(sizeof(dsq_samp_result) * NR);
        for (int r = 0; r < NR; r++) {
            for (int p = 0; p < rows[r].hist_len; p++)
                hist[p] = ring[(size_t)r * R + p % R];
            assert_int_equal(dsq_sample_cpu_row(ws, x + (size_t)r * V, V, &rows[r], hist, &want_all[r]), DSQ_OK);
        }
        /* the whole batch, then batches of 1, 2, 3 and 8 rows (the cluster
         * sizes), on every path */
        const int b0[5] = {0, 0, 1, 3, 6}, bn[5] = {NR, 1, 2, 3, 8};
        for (int mi = 0; mi < 6; mi++) {
            set_cluster(MODES[mi]);
            for (int bi = 0; bi < 5; bi++) {
                const int r0 = b0[bi], nb = bn[bi];
                run_gpu(x + (size_t)r0 * V, nb, V, rows + r0, ring, NR, R, got + r0);
                for (int r = r0; r < r0 + nb; r++) {
                    want = want_all[r];
                    if (got[r].token != want.token)
                        fail_msg("V %d row %d (mode %s, %d rows, %d CTAs per row): GPU greedy %d, host %d", V, r,
                                 MODES[mi] ? MODES[mi] : "auto", nb, dsq_cu_sample_cluster_size(nb), got[r].token,
                                 want.token);
                    assert_true(fabs(got[r].logprob - want.logprob) < 2e-4);
                    assert_int_equal(got[r].n_top, want.n_top);
                    for (int k = 0; k < want.n_top; k++) {
                        assert_int_equal(got[r].top_ids[k], want.top_ids[k]);
                        assert_true(fabs(got[r].top_lp[k] - want.top_lp[k]) < 2e-4);
                    }
                }
            }
        }
        set_cluster(NULL);
        free(want_all);
        printf("  greedy/log-probs/top-n/penalties: %d rows of %d logits agree with the host on every path\n", NR, V);
        dsq_sample_ws_free(ws);
        free(x);
        free(ring);
        free(hist);
    }
}

static void distribution(int V, ref_cfg c, double scale, uint64_t lseed, int draws)
{
    float *x1 = (float *)malloc(sizeof(float) * V);
    double *q = (double *)malloc(sizeof(double) * V);
    /* inputs where rounding could flip a filtering decision are redrawn
     * (a bounded number of times: with a large vocabulary some token always
     * sits near the nucleus edge) */
    ref_random_logits(x1, V, scale, lseed++);
    for (int tries = 0; tries < 20 && ref_distribution(x1, V, c, q) < 1e-4; tries++)
        ref_random_logits(x1, V, scale, lseed++);
    ref_distribution(x1, V, c, q);
    float *x = (float *)malloc(sizeof(float) * (size_t)draws * V);
    dsq_samp_row *rows = (dsq_samp_row *)malloc(sizeof(dsq_samp_row) * draws);
    dsq_samp_result *res = (dsq_samp_result *)malloc(sizeof(dsq_samp_result) * draws);
    int32_t ring[1] = {0};
    for (int d = 0; d < draws; d++) {
        memcpy(x + (size_t)d * V, x1, sizeof(float) * V);
        rows[d] = mkrow(c, V, 0x1234567ull + (uint64_t)d * 7919ull, 0, 10 + d % 13);
    }
    run_gpu(x, draws, V, rows, ring, 1, 1, res);
    /* the same draws through 16-CTA clusters: bit-identical */
    dsq_samp_result *res16 = (dsq_samp_result *)malloc(sizeof(dsq_samp_result) * draws);
    set_cluster("16");
    run_gpu(x, draws, V, rows, ring, 1, 1, res16);
    set_cluster(NULL);
    for (int d = 0; d < draws; d++)
        if (res16[d].token != res[d].token || res16[d].n_kept != res[d].n_kept)
            fail_msg("draw %d: %d CTAs per row drew %d (kept %d), 16-CTA clusters %d (kept %d)", d,
                     dsq_cu_sample_cluster_size(draws), res[d].token, res[d].n_kept, res16[d].token, res16[d].n_kept);
    free(res16);
    int *counts = (int *)calloc((size_t)V, sizeof(int));
    int support = 0;
    for (int i = 0; i < V; i++)
        support += q[i] > 0.0;
    for (int d = 0; d < draws; d++) {
        int t = res[d].token;
        if (t < 0 || t >= V || q[t] == 0.0)
            fail_msg("draw %d: token %d outside the reference support", d, t);
        counts[t]++;
    }
    int df = 0;
    double chi = ref_chi_square(counts, q, V, draws, &df);
    printf("  GPU V=%d T=%.1f k=%d p=%.2f min_p=%.2f: kept %d (reference %d), chi2 %.1f (df %d, limit %.1f)\n", V,
           (double)c.temperature, c.top_k, (double)c.top_p, (double)c.min_p, res[0].n_kept, support, chi, df,
           ref_chi_limit(df));
    assert_true(chi < ref_chi_limit(df));
    free(x1);
    free(q);
    free(x);
    free(rows);
    free(res);
    free(counts);
}

static void test_distributions(void **state)
{
    (void)state;
    distribution(1001, (ref_cfg){ 1.0f, 0, 1.0f, 0.0f }, 2.5, 1, 20000);
    distribution(1001, (ref_cfg){ 0.6f, 0, 0.95f, 0.0f }, 2.5, 2, 20000);
    distribution(4099, (ref_cfg){ 0.8f, 40, 1.0f, 0.0f }, 2.5, 3, 20000);
    distribution(4099, (ref_cfg){ 1.3f, 0, 0.7f, 0.05f }, 2.0, 4, 20000);
    distribution(1001, (ref_cfg){ 0.7f, 200, 0.9f, 0.0f }, 1.0, 5, 20000);
    distribution(151937, (ref_cfg){ 0.6f, 0, 0.95f, 0.0f }, 4.0, 6, 4000);
}

/* Near-flat logits over the full vocabulary: the nucleus holds most tokens. */
static void test_flat_nucleus(void **state)
{
    (void)state;
    const int V = 151937, NR = 64;
    ref_cfg c = { 0.6f, 0, 0.95f, 0.0f };
    float *x = (float *)malloc(sizeof(float) * (size_t)NR * V);
    double *q = (double *)malloc(sizeof(double) * V);
    ref_random_logits(x, V, 1.0, 99);
    ref_distribution(x, V, c, q);
    int support = 0;
    for (int i = 0; i < V; i++)
        support += q[i] > 0.0;
    dsq_samp_row rows[NR];
    for (int r = 0; r < NR; r++) {
        if (r > 0)
            memcpy(x + (size_t)r * V, x, sizeof(float) * V);
        rows[r] = mkrow(c, V, 5 + r, 0, 100 + r);
    }
    dsq_samp_result res[NR];
    int32_t ring[1] = {0};
    run_gpu(x, NR, V, rows, ring, 1, 1, res);
    dsq_samp_result res8[NR];
    set_cluster("8");
    run_gpu(x, NR, V, rows, ring, 1, 1, res8);
    set_cluster(NULL);
    for (int r = 0; r < NR; r++) {
        assert_int_equal(res8[r].token, res[r].token);
        assert_int_equal(res8[r].n_kept, res[r].n_kept);
        /* float vs double probabilities move the edge by a few tokens */
        assert_true(abs(res[r].n_kept - support) <= 2 + support / 20000);
        assert_true(res[r].token >= 0 && q[res[r].token] > 0.0);
    }
    printf("  flat V=%d: GPU kept %d, reference nucleus %d\n", V, res[0].n_kept, support);
    free(x);
    free(q);
}

static void test_batch_independent(void **state)
{
    (void)state;
    const int V = 50257, NR = 9;
    float *x = (float *)malloc(sizeof(float) * (size_t)NR * V);
    dsq_samp_row rows[NR];
    for (int r = 0; r < NR; r++) {
        ref_random_logits(x + (size_t)r * V, V, 1.5, 500 + r);
        rows[r] = mkrow((ref_cfg){ 0.9f, 50 * (r % 3), 0.9f, 0.0f }, V, 31 + r, 0, 7 + r);
    }
    int32_t ring[1] = {0};
    dsq_samp_result a[NR], b[NR];
    run_gpu(x, NR, V, rows, ring, 1, 1, a);
    /* row 4 alone, and rows reversed */
    run_gpu(x + 4 * (size_t)V, 1, V, &rows[4], ring, 1, 1, b);
    assert_int_equal(a[4].token, b[0].token);
    float *y = (float *)malloc(sizeof(float) * (size_t)NR * V);
    dsq_samp_row rr[NR];
    for (int r = 0; r < NR; r++) {
        memcpy(y + (size_t)r * V, x + (size_t)(NR - 1 - r) * V, sizeof(float) * V);
        rr[r] = rows[NR - 1 - r];
    }
    run_gpu(y, NR, V, rr, ring, 1, 1, b);
    for (int r = 0; r < NR; r++)
        assert_int_equal(a[r].token, b[NR - 1 - r].token);
    free(x);
    free(y);
}

/* Every path on the same inputs: results bit-identical to one CTA per row;
 * greedy rows, log-probs and top-n also against the host. */
static int same_result(const dsq_samp_result *a, const dsq_samp_result *b)
{
    if (a->token != b->token || a->n_kept != b->n_kept || a->n_top != b->n_top ||
        memcmp(&a->logprob, &b->logprob, sizeof(float)) != 0)
        return 0;
    for (int k = 0; k < a->n_top; k++)
        if (a->top_ids[k] != b->top_ids[k] || memcmp(&a->top_lp[k], &b->top_lp[k], sizeof(float)) != 0)
            return 0;
    return 1;
}

static void test_paths_agree(void **state)
{
    (void)state;
    const int Vs[3] = {1001, 50257, 151937};
    const int R = 1024, NR = 37;
    for (int vi = 0; vi < 3; vi++) {
        const int V = Vs[vi];
        float *x = (float *)malloc(sizeof(float) * (size_t)NR * V);
        int32_t *ring = (int32_t *)calloc((size_t)NR * R, sizeof(int32_t));
        int32_t *hist = (int32_t *)malloc(sizeof(int32_t) * R);
        dsq_samp_row rows[NR];
        dsq_samp_result base[NR], got[NR], want;
        dsq_sample_ws *ws = NULL;
        assert_int_equal(dsq_sample_ws_new(V, &ws), DSQ_OK);
        for (int r = 0; r < NR; r++) {
            float *row = x + (size_t)r * V;
            const int kind = r % 8;
            ref_random_logits(row, V, kind == 1 ? 1.0 : 0.5 + r % 5, 7000 * vi + r);
            ref_cfg c = { 0.0f, 0, 1.0f, 0.0f };
            int n_valid = V;
            switch (kind) {
            case 0: /* greedy with planted ties */
                row[(r * 7919) % V] = row[(r * 104729 + 13) % V] = 40.0f;
                break;
            case 1: c = (ref_cfg){ 0.6f, 0, 0.95f, 0.0f }; break; /* near flat nucleus */
            case 2: c = (ref_cfg){ 0.8f, 40, 1.0f, 0.0f }; break;
            case 3: /* -inf entries */
                c = (ref_cfg){ 1.3f, 0, 0.7f, 0.05f };
                for (int i = 0; i < V; i += 3)
                    row[i] = -INFINITY;
                break;
            case 4: c = (ref_cfg){ 0.7f, 200, 0.9f, 0.0f }; break; /* with penalties below */
            case 5: /* many equal values: quantized, or all equal */
                for (int i = 0; i < V; i++)
                    row[i] = (r / 8) % 2 ? 1.5f : floorf(row[i] * 2.0f) * 0.5f;
                c = (ref_cfg){ 1.0f, (r / 8) % 3 == 0 ? 1000 : 0, 0.5f, 0.0f };
                break;
            case 6: /* padding beats everything but is not valid */
                c = (ref_cfg){ 0.9f, 0, 0.95f, 0.0f };
                n_valid = V - 5;
                for (int i = n_valid; i < V; i++)
                    row[i] = 1e4f;
                break;
            default: break; /* 7: log-probs only, no sampling */
            }
            rows[r] = mkrow(c, n_valid, 0x9e3779b9ull * (uint64_t)(r + 1), r, 20 + (r * 37) % 900);
            if (kind == 7)
                rows[r].flags = 0;
            if (kind == 0 || kind == 4 || kind == 6 || kind == 7 || r % 5 == 0) {
                rows[r].flags |= DSQ_SROW_LOGPROB;
                rows[r].top_n = 1 + r % 20;
            }
            if (kind == 4 || r % 3 == 0) {
                rows[r].rep_pen = 1.0f + 0.1f * (1 + r % 4);
                rows[r].freq_pen = 0.05f * (r % 3);
                rows[r].pres_pen = 0.3f;
                rows[r].pen_n = 1 + (r * 53) % 700;
            }
            for (int p = 0; p < rows[r].hist_len; p++) {
                int id = (int)(ref_urand() * V);
                if (p % 3 == 0)
                    id = (int)dsq_argmax(row, (size_t)n_valid);
                ring[(size_t)r * R + p % R] = id;
            }
        }
        int host_same = 0, sampled = 0;
        const int b0[5] = {0, 0, 1, 3, 6}, bn[5] = {NR, 1, 2, 3, 8};
        for (int bi = 0; bi < 5; bi++) {
            const int r0 = b0[bi], nb = bn[bi];
            set_cluster("0");
            run_gpu(x + (size_t)r0 * V, nb, V, rows + r0, ring, NR, R, base + r0);
            for (int mi = 0; mi < 6; mi++) {
                if (mi == 1)
                    continue;
                set_cluster(MODES[mi]);
                const int cl = dsq_cu_sample_cluster_size(nb);
                run_gpu(x + (size_t)r0 * V, nb, V, rows + r0, ring, NR, R, got + r0);
                for (int r = r0; r < r0 + nb; r++)
                    if (!same_result(&got[r], &base[r]))
                        fail_msg("V %d row %d (kind %d), %d rows, mode %s (%d CTAs per row): token %d kept %d "
                                 "logprob %.9g n_top %d; one CTA per row: token %d kept %d logprob %.9g n_top %d",
                                 V, r, r % 8, nb, MODES[mi] ? MODES[mi] : "auto", cl, got[r].token, got[r].n_kept,
                                 (double)got[r].logprob, got[r].n_top, base[r].token, base[r].n_kept,
                                 (double)base[r].logprob, base[r].n_top);
            }
            /* top-p's draw sums with the last gather pass (fused) or in a
             * pass of their own: the same sums, the same results */
            {
                const char *fe = getenv("DSQ_SAMPLE_DRAW_FUSED");
                const bool fused_now = !(fe && fe[0] == '0');
                char *saved = fe ? strdup(fe) : NULL;
                setenv("DSQ_SAMPLE_DRAW_FUSED", fused_now ? "0" : "1", 1);
                const char *fmodes[3] = {"0", NULL, "2"};
                char mismatch[320] = ""; /* the first, reported once the environment is back */
                for (int fi = 0; fi < 3; fi++) {
                    set_cluster(fmodes[fi]);
                    run_gpu(x + (size_t)r0 * V, nb, V, rows + r0, ring, NR, R, got + r0);
                    for (int r = r0; r < r0 + nb; r++)
                        if (!same_result(&got[r], &base[r]) && !mismatch[0])
                            snprintf(mismatch, sizeof mismatch,
                                     "V %d row %d (kind %d), %d rows, mode %s, draw sums %s: token %d kept %d; "
                                     "the other way, one CTA per row: token %d kept %d",
                                     V, r, r % 8, nb, fmodes[fi] ? fmodes[fi] : "auto",
                                     fused_now ? "in their own pass" : "with the gather", got[r].token,
                                     got[r].n_kept, base[r].token, base[r].n_kept);
                }
                if (saved) {
                    setenv("DSQ_SAMPLE_DRAW_FUSED", saved, 1);
                    free(saved);
                } else {
                    unsetenv("DSQ_SAMPLE_DRAW_FUSED");
                }
                if (mismatch[0]) {
                    set_cluster(NULL);
                    fail_msg("%s", mismatch);
                }
            }
            set_cluster(NULL);
            if (bi > 0)
                continue;
            for (int r = 0; r < NR; r++) {
                for (int p = 0; p < rows[r].hist_len; p++)
                    hist[p] = ring[(size_t)r * R + p % R];
                assert_int_equal(dsq_sample_cpu_row(ws, x + (size_t)r * V, V, &rows[r], hist, &want), DSQ_OK);
                const int greedy = rows[r].temperature <= 0.0f || !(rows[r].flags & DSQ_SROW_SAMPLE);
                if (greedy && base[r].token != want.token)
                    fail_msg("V %d row %d: GPU %d, host %d", V, r, base[r].token, want.token);
                if (!greedy) {
                    sampled++;
                    host_same += base[r].token == want.token;
                    assert_true(base[r].token >= 0 && base[r].token < rows[r].n_valid);
                }
                if ((rows[r].flags & DSQ_SROW_LOGPROB) && base[r].token == want.token)
                    assert_true(fabs(base[r].logprob - want.logprob) < 2e-4);
                assert_int_equal(base[r].n_top, want.n_top);
                for (int k = 0; k < want.n_top; k++) {
                    assert_int_equal(base[r].top_ids[k], want.top_ids[k]);
                    assert_true(fabs(base[r].top_lp[k] - want.top_lp[k]) < 2e-4);
                }
            }
        }
        printf("  paths: V=%d, batches of 37/1/2/3/8 rows: clusters of 2/4/8/16 == one CTA per row "
               "(CTAs per row chosen for 1 / 8 / 37 rows: %d / %d / %d); sampled tokens equal to the host's "
               "draw: %d of %d\n",
               V, dsq_cu_sample_cluster_size(1), dsq_cu_sample_cluster_size(8), dsq_cu_sample_cluster_size(37),
               host_same, sampled);
        dsq_sample_ws_free(ws);
        free(x);
        free(ring);
        free(hist);
    }
}

static void test_timing(void **state)
{
    (void)state;
    const int V = 151936;
    /* batch, forced mode (NULL: automatic); the forced clusters at 64 and
     * 256 rows may run in several waves, which the automatic rule avoids:
     * they measure whether a cluster's smaller share of the row, re-read
     * by every pass, beats one CTA streaming the whole row */
    enum { NTIME = 12 };
    const int Bs[NTIME] = {1, 1, 2, 8, 8, 64, 64, 64, 256, 256, 256, 256};
    const char *Ms[NTIME] = {NULL, "0", NULL, NULL, "0", NULL, "4", "8", NULL, "2", "4", "8"};
    for (int bi = 0; bi < NTIME; bi++) {
        const int B = Bs[bi];
        set_cluster(Ms[bi]);
        const int cl = dsq_cu_sample_cluster_size(B);
        float *x = (float *)malloc(sizeof(float) * (size_t)B * V);
        dsq_samp_row *rows = (dsq_samp_row *)malloc(sizeof(dsq_samp_row) * B);
        for (int r = 0; r < B; r++) {
            ref_random_logits(x + (size_t)r * V, V, 1.0, 900 + r); /* near flat: the worst case */
            rows[r] = mkrow((ref_cfg){ 0.6f, 0, 0.95f, 0.0f }, V, r, r, 1000);
        }
        float *dl;
        dsq_samp_row *dr;
        dsq_samp_result *dres;
        int32_t *ring;
        CKC(cudaMalloc((void **)&dl, sizeof(float) * (size_t)B * V));
        CKC(cudaMalloc((void **)&dr, sizeof(dsq_samp_row) * B));
        CKC(cudaMalloc((void **)&dres, sizeof(dsq_samp_result) * B));
        CKC(cudaMalloc((void **)&ring, sizeof(int32_t) * (size_t)B * 4096));
        CKC(cudaMemset(ring, 0, sizeof(int32_t) * (size_t)B * 4096));
        CKC(cudaMemcpy(dl, x, sizeof(float) * (size_t)B * V, cudaMemcpyHostToDevice));
        const char *names[3] = {"T=0.6 top-p 0.95", "greedy", "T=0.6 top-p 0.95 + penalties, top-5"};
        for (int mode = 0; mode < 3; mode++) {
            for (int r = 0; r < B; r++) {
                rows[r].temperature = mode == 1 ? 0.0f : 0.6f;
                if (mode == 2) {
                    rows[r].rep_pen = 1.1f;
                    rows[r].pen_n = 64;
                    rows[r].top_n = 5;
                    rows[r].flags |= DSQ_SROW_LOGPROB;
                }
            }
            CKC(cudaMemcpy(dr, rows, sizeof(dsq_samp_row) * B, cudaMemcpyHostToDevice));
            cudaEvent_t e0, e1;
            cudaEventCreate(&e0);
            cudaEventCreate(&e1);
            for (int w = 0; w < 3; w++)
                assert_int_equal(dsq_cu_sample(dl, B, V, dr, ring, 4096, dres, 0), DSQ_OK);
            const int iters = 20;
            cudaEventRecord(e0, 0);
            for (int it = 0; it < iters; it++)
                assert_int_equal(dsq_cu_sample(dl, B, V, dr, ring, 4096, dres, 0), DSQ_OK);
            cudaEventRecord(e1, 0);
            CKC(cudaEventSynchronize(e1));
            float ms = 0;
            cudaEventElapsedTime(&ms, e0, e1);
            printf("  timing: %3d rows x %d, %2d CTA(s) per row, %-36s %7.1f us per launch\n", B, V, cl, names[mode],
                   1e3 * ms / iters);
            cudaEventDestroy(e0);
            cudaEventDestroy(e1);
        }
        cudaFree(dl);
        cudaFree(dr);
        cudaFree(dres);
        cudaFree(ring);
        free(x);
        free(rows);
    }
    set_cluster(NULL);
}

/* ---- through dsq_step on the tiny model -------------------------------------- */

static dsq_ctx *tiny_ctx(dsq_model *m, int layout)
{
    dsq_ctx_params cp = dsq_ctx_default_params();
    cp.max_seqs = 8;
    cp.max_context = 256;
    cp.max_batch_tokens = 64;
    cp.kv_layout = layout;
    dsq_ctx *c = NULL;
    assert_int_equal(dsq_ctx_new(m, &cp, &c), DSQ_OK);
    return c;
}

static void test_api(void **state)
{
    (void)state;
    char *dir = dsq_test_path("tiny");
    dsq_model_params mp = dsq_model_default_params();
    mp.backend = DSQ_BACKEND_CUDA;
    dsq_model *m = NULL;
    assert_int_equal(dsq_model_load(dir, &mp, &m), DSQ_OK);
    free(dir);
    const int V = 1000, B = 7;
    dsq_ctx *a = tiny_ctx(m, DSQ_KV_PAGED), *b = tiny_ctx(m, DSQ_KV_PAGED);
    dsq_sample_params g = dsq_sample_default_params();
    g.temperature = 0.0f;
    int32_t pr[B][12], tok[B];
    float *lg = (float *)malloc(sizeof(float) * V * B), *lg2 = (float *)malloc(sizeof(float) * V * B);
    float *dlg;
    CKC(cudaMalloc((void **)&dlg, sizeof(float) * V * B));
    dsq_step_seq e[B];
    dsq_step_out oa[B], ob[B];
    dsq_step_params hp = dsq_step_default_params(), dp = dsq_step_default_params();
    hp.logits = lg;
    dp.logits = dlg;
    dp.logits_on_device = 1;
    for (int i = 0; i < B; i++) {
        for (int k = 0; k < 12; k++)
            pr[i][k] = (i * 131 + k * 17) % V;
        e[i] = (dsq_step_seq){ i, 3 + i, pr[i], &g, 4, DSQ_STEP_LOGITS | DSQ_STEP_LOGPROB };
    }
    assert_int_equal(dsq_step(a, e, B, &hp, oa), DSQ_OK);
    assert_int_equal(dsq_step(b, e, B, &dp, ob), DSQ_OK);
    for (int step = 0; step < 24; step++) {
        for (int i = 0; i < B; i++) {
            assert_int_equal(oa[i].token, (int)dsq_argmax(lg + (size_t)i * V, V));
            assert_int_equal(oa[i].token, ob[i].token);
            tok[i] = oa[i].token;
        }
        CKC(cudaMemcpy(lg2, dlg, sizeof(float) * V * B, cudaMemcpyDeviceToHost));
        assert_memory_equal(lg, lg2, sizeof(float) * V * B);
        for (int i = 0; i < B; i++)
            e[i] = (dsq_step_seq){ i, 1, &tok[i], &g, 4, DSQ_STEP_LOGITS | DSQ_STEP_LOGPROB };
        assert_int_equal(dsq_step(a, e, B, &hp, oa), DSQ_OK);
        assert_int_equal(dsq_step(b, e, B, &dp, ob), DSQ_OK);
    }
    /* mixed step vs separate calls on a third context */
    dsq_ctx *c3 = tiny_ctx(m, DSQ_KV_STATIC), *c4 = tiny_ctx(m, DSQ_KV_STATIC);
    int32_t p0[20], d1 = 5;
    for (int k = 0; k < 20; k++)
        p0[k] = (k * 37 + 3) % V;
    assert_int_equal(dsq_prefill(c3, 1, p0, 10, DSQ_LOGITS_LAST, NULL), DSQ_OK);
    assert_int_equal(dsq_prefill(c4, 1, p0, 10, DSQ_LOGITS_LAST, NULL), DSQ_OK);
    dsq_step_seq mx[2] = { { 1, 1, &d1, NULL, 0, DSQ_STEP_LOGITS }, { 2, 20, p0, NULL, 0, DSQ_STEP_LOGITS } };
    assert_int_equal(dsq_step(c3, mx, 2, &hp, NULL), DSQ_OK);
    int32_t s1 = 1;
    assert_int_equal(dsq_decode_step(c4, 1, &s1, &d1, lg2), DSQ_OK);
    assert_int_equal(dsq_prefill(c4, 2, p0, 20, DSQ_LOGITS_LAST, lg2 + V), DSQ_OK);
    double e0 = dsq_rel_err(lg, lg2, V), e1 = dsq_rel_err(lg + V, lg2 + V, V);
    printf("  GPU mixed step vs separate calls: %.2e %.2e (max|diff|/max|ref|)\n", e0, e1);
    assert_true(e0 < 2e-2 && e1 < 2e-2);
    cudaFree(dlg);
    free(lg);
    free(lg2);
    dsq_ctx_free(a);
    dsq_ctx_free(b);
    dsq_ctx_free(c3);
    dsq_ctx_free(c4);
    dsq_model_free(m);
}

int main(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n < 1) {
        printf("SKIP: no CUDA device\n");
        return DSQ_TEST_SKIP;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_greedy_logprobs_penalties), cmocka_unit_test(test_distributions),
        cmocka_unit_test(test_flat_nucleus),              cmocka_unit_test(test_batch_independent),
        cmocka_unit_test(test_paths_agree),
        cmocka_unit_test(test_api),                       cmocka_unit_test(test_timing),
    };
    /* DSQ_TEST_FILTER=test_timing: one test (cmocka's wildcard pattern) */
    if (getenv("DSQ_TEST_FILTER"))
        cmocka_set_test_filter(getenv("DSQ_TEST_FILTER"));
    return cmocka_run_group_tests(tests, NULL, NULL);
}
