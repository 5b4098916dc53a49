/*
 * mixed_step.c - benchmark (not a test): n_dec sequences decoding while a
 * new prompt is admitted in chunks through mixed passes
 * (dsq_ctx_forward_mixed: n_dec one-token rows + one chunk per pass), against
 * plain decode steps of the same sequences and against the two-call
 * alternative (a decode step, then dsq_prefill of the chunk).  Every step
 * copies one row of logits per sequence into page-locked host memory (the
 * copy synchronises, so wall time per call is the step time).
 *
 *   bench_mixed_step MODEL_DIR [ctx_len 1024] [n_dec 63] [prompt 2048] [chunk 512] [rounds 5]
 *
 * Paged F16 KV, blocks of 16, max_context 4096.  DSQ_CUDA_MIXED=0 in the
 * environment runs mixed passes entirely through the prefill kernel (the
 * behaviour before the decode/prefill split), for comparison.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifdef DSQ_HAVE_CUDA
#include <cuda_runtime.h>
#endif

#include "internal.h"

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return 1e3 * (double)ts.tv_sec + 1e-6 * (double)ts.tv_nsec;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

#define CHECK(call)                                                                                  \
    do {                                                                                             \
        dsq_status st_ = (call);                                                                     \
        if (st_ != DSQ_OK) {                                                                         \
            fprintf(stderr, "%s: %s (%s)\n", #call, dsq_status_string(st_), dsq_last_error_message()); \
            return 1;                                                                                \
        }                                                                                            \
    } while (0)

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s MODEL_DIR [ctx_len] [n_dec] [prompt] [chunk] [rounds]\n", argv[0]);
        return 2;
    }
    const int32_t ctx_len = argc > 2 ? atoi(argv[2]) : 1024, n_dec = argc > 3 ? atoi(argv[3]) : 63,
                  prompt = argc > 4 ? atoi(argv[4]) : 2048, chunk = argc > 5 ? atoi(argv[5]) : 512,
                  rounds = argc > 6 ? atoi(argv[6]) : 5;
    dsq_model_params mp = dsq_model_default_params();
    mp.load_tokenizer = 0;
    dsq_model *m = NULL;
    CHECK(dsq_model_load(argv[1], &mp, &m));
    dsq_ctx_params cp = dsq_ctx_default_params();
    cp.max_seqs = n_dec + 1;
    cp.max_context = 4096;
    cp.max_batch_tokens = chunk + n_dec;
    cp.kv_layout = DSQ_KV_PAGED;
    cp.kv_dtype = DSQ_KV_F16;
    dsq_ctx *c = NULL;
    CHECK(dsq_ctx_new(m, &cp, &c));
    const int32_t nv = m->cfg.n_vocab;
    float *logits;
#ifdef DSQ_HAVE_CUDA
    if (cudaMallocHost((void **)&logits, sizeof(float) * (size_t)(n_dec + 1) * nv) != cudaSuccess)
        return 1;
#else
    logits = malloc(sizeof(float) * (size_t)(n_dec + 1) * nv);
#endif
    int32_t *toks = malloc(sizeof(int32_t) * (size_t)(prompt + ctx_len + n_dec + chunk));
    unsigned seed = 12345u;
    for (int32_t i = 0; i < prompt + ctx_len + n_dec + chunk; i++) {
        seed = seed * 1103515245u + 12345u;
        toks[i] = (int32_t)((seed >> 8) % (unsigned)nv);
    }
    int32_t *seqs = malloc(sizeof(int32_t) * (size_t)(n_dec + 1)), *each = malloc(sizeof(int32_t) * (size_t)(n_dec + 1));
    int32_t *mt = malloc(sizeof(int32_t) * (size_t)(n_dec + chunk));
    for (int32_t s = 0; s < n_dec; s++) {
        seqs[s] = s;
        each[s] = 1;
        CHECK(dsq_prefill(c, s, toks + s, ctx_len, DSQ_LOGITS_LAST, logits));
    }
    const int n_plain_per = 10;
    double *plain = malloc(sizeof(double) * (size_t)(rounds + 1) * n_plain_per);
    double *mixed = malloc(sizeof(double) * (size_t)rounds * (prompt / chunk + 1));
    double *two = malloc(sizeof(double) * (size_t)rounds * (prompt / chunk + 1));
    int np = 0, nm = 0, n2 = 0;
    for (int i = 0; i < 10; i++) /* warm-up: graphs, cuBLASLt heuristics */
        CHECK(dsq_decode_step(c, n_dec, seqs, toks, logits));
    for (int r = 0; r <= rounds; r++) {
        for (int i = 0; i < n_plain_per; i++) {
            double t0 = now_ms();
            CHECK(dsq_decode_step(c, n_dec, seqs, toks + i, logits));
            plain[np++] = now_ms() - t0;
        }
        if (r == rounds)
            break;
        /* admit seq n_dec through mixed passes */
        for (int32_t done = 0; done < prompt; done += chunk) {
            int32_t n = prompt - done < chunk ? prompt - done : chunk;
            for (int32_t s = 0; s < n_dec; s++)
                mt[s] = toks[s + r];
            memcpy(mt + n_dec, toks + ctx_len + done, sizeof(int32_t) * (size_t)n);
            seqs[n_dec] = n_dec;
            each[n_dec] = n;
            double t0 = now_ms();
            CHECK(dsq_ctx_forward_mixed(c, n_dec + 1, seqs, each, mt, logits));
            double dt = now_ms() - t0;
            if (r > 0) /* round 0 also warms the mixed shapes */
                mixed[nm++] = dt;
            printf("round %d mixed step (%d decode + %d-token chunk at %d): %.3f ms\n", r, n_dec, n, done, dt);
        }
        CHECK(dsq_seq_remove(c, n_dec));
        /* the two-call alternative: a decode step, then the chunk alone */
        for (int32_t done = 0; done < prompt; done += chunk) {
            int32_t n = prompt - done < chunk ? prompt - done : chunk;
            double t0 = now_ms();
            CHECK(dsq_decode_step(c, n_dec, seqs, toks + r, logits));
            CHECK(dsq_prefill(c, n_dec, toks + ctx_len + done, n, DSQ_LOGITS_LAST, logits + (size_t)n_dec * nv));
            double dt = now_ms() - t0;
            if (r > 0)
                two[n2++] = dt;
        }
        CHECK(dsq_seq_remove(c, n_dec));
    }
    qsort(plain, (size_t)np, sizeof(double), cmp_d);
    qsort(mixed, (size_t)nm, sizeof(double), cmp_d);
    qsort(two, (size_t)n2, sizeof(double), cmp_d);
    double pmed = plain[np / 2];
    printf("RESULT backend=%s ctx_len=%d n_dec=%d prompt=%d chunk=%d mixed_split=%s\n",
           m->ops->name, ctx_len, n_dec, prompt, chunk, getenv("DSQ_CUDA_MIXED") ? getenv("DSQ_CUDA_MIXED") : "1");
    printf("RESULT plain decode step (%d seqs): median %.3f ms, max %.3f ms (%d steps)\n", n_dec, pmed, plain[np - 1], np);
    printf("RESULT mixed step: median %.3f ms, max %.3f ms (%d steps) = %.2fx the plain median (target <= 2x)\n",
           mixed[nm / 2], mixed[nm - 1], nm, mixed[nm - 1] / pmed);
    printf("RESULT decode step + separate chunk prefill: median %.3f ms, max %.3f ms\n", two[n2 / 2], two[n2 - 1]);
    dsq_ctx_free(c);
    dsq_model_free(m);
#ifdef DSQ_HAVE_CUDA
    cudaFreeHost(logits);
#else
    free(logits);
#endif
    free(toks);
    free(seqs);
    free(each);
    free(mt);
    free(plain);
    free(mixed);
    free(two);
    return 0;
}
