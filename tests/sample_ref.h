/* sample_ref.h - test-side reference of the sampling pipeline: the exact
 * target distribution in double with the Hugging Face warper definitions
 * (temperature, top-k, top-p, min-p; the same as tests/test_sampler.c), a
 * Pearson chi-square and its acceptance limit, and seeded random logits.
 * Shared by test_step.c and test_cuda_sampling.cu (C and C++). */
#ifndef DSQ_SAMPLE_REF_H
#define DSQ_SAMPLE_REF_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>

typedef struct ref_cfg {
    float temperature;
    int top_k;
    float top_p;
    float min_p;
} ref_cfg;

static uint64_t ref_lcg;
static double ref_urand(void)
{
    ref_lcg = ref_lcg * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(ref_lcg >> 11) * 0x1.0p-53;
}
static double ref_nrand(void)
{
    double u = ref_urand() + 1e-300, v = ref_urand();
    return sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v);
}
static void ref_random_logits(float *x, int n, double scale, uint64_t seed)
{
    ref_lcg = seed;
    for (int i = 0; i < n; i++)
        x[i] = (float)(scale * ref_nrand());
}

static const double *ref_sort_p;
static int ref_cmp_desc(const void *a, const void *b)
{
    int i = *(const int *)a, j = *(const int *)b;
    if (ref_sort_p[i] != ref_sort_p[j])
        return ref_sort_p[i] < ref_sort_p[j] ? 1 : -1;
    return i - j;
}

/* q[n]: the exact distribution over ids 0..n-1.  Returns the smallest
 * relative distance of a filtering decision from its threshold (callers skip
 * inputs where float rounding could flip one). */
static double ref_distribution(const float *x, int n, ref_cfg c, double *q)
{
    double margin = INFINITY;
    int *ord = (int *)malloc(sizeof(int) * (size_t)n);
    double m = -INFINITY;
    for (int i = 0; i < n; i++)
        if ((double)x[i] / c.temperature > m)
            m = (double)x[i] / c.temperature;
    for (int i = 0; i < n; i++) {
        q[i] = exp((double)x[i] / c.temperature - m);
        ord[i] = i;
    }
    ref_sort_p = q;
    qsort(ord, (size_t)n, sizeof(int), ref_cmp_desc);
    if (c.top_k > 0 && c.top_k < n) {
        double vk = q[ord[c.top_k - 1]];
        for (int r = c.top_k; r < n; r++)
            if (q[ord[r]] < vk) {
                margin = fmin(margin, (vk - q[ord[r]]) / vk);
                q[ord[r]] = 0.0;
            }
    }
    double total = 0.0;
    for (int i = 0; i < n; i++)
        total += q[i];
    if (c.top_p < 1.0f) {
        double before = 0.0;
        for (int r = 0; r < n; r++) {
            double p = q[ord[r]] / total;
            if (p == 0.0)
                continue;
            margin = fmin(margin, fabs(before - c.top_p));
            if (before < c.top_p)
                before += p;
            else
                q[ord[r]] = 0.0;
        }
    }
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
    return margin;
}

/* Pearson chi-square over the support of q (expected counts < 5 pooled). */
static double ref_chi_square(const int *counts, const double *q, int n, int draws, int *df)
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

/* Far above df (mean df, sd sqrt(2 df)): probability < 1e-6 under the null. */
static double ref_chi_limit(int df) { return df + 7.0 * sqrt(2.0 * df) + 20.0; }

#endif
