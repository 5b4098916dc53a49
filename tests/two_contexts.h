/* two_contexts.h - the harness of "two contexts of one model, two threads"
 * (test_threads on the CPU, test_cuda_threads on the GPU): each context
 * prefills a fixed prompt (all logits) and takes greedy decode steps; run
 * alone one after the other for references, then three rounds of both at
 * once on two threads, whose logits must be bit-identical to the
 * references.  The includer defines N_PROMPT, N_STEPS and the context
 * parameters of each variant (tc_params). */
#ifndef DSQ_TWO_CONTEXTS_H
#define DSQ_TWO_CONTEXTS_H

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

enum { TC_THREADS = 2 };

typedef struct ctx_job {
    dsq_model *model;
    int32_t vocab;
    int variant;   /* which context configuration (tc_params) */
    float *logits; /* [N_PROMPT + N_STEPS][vocab] out */
    dsq_status st;
    char msg[256];
} ctx_job;

/* The context parameters of variant v (defined by the includer). */
static void tc_params(int v, dsq_ctx_params *cp);

static void tc_run(ctx_job *j)
{
    dsq_ctx_params cp = dsq_ctx_default_params();
    tc_params(j->variant, &cp);
    dsq_ctx *c = NULL;
    j->st = dsq_ctx_new(j->model, &cp, &c);
    if (j->st != DSQ_OK) {
        snprintf(j->msg, sizeof j->msg, "ctx_new: %s", dsq_last_error_message());
        return;
    }
    int32_t prompt[N_PROMPT];
    for (int i = 0; i < N_PROMPT; i++)
        prompt[i] = (int32_t)((i * 37 + 11 + j->variant) % j->vocab);
    float *lg = j->logits;
    j->st = dsq_prefill(c, 0, prompt, N_PROMPT, DSQ_LOGITS_ALL, lg);
    for (int s = 0; s < N_STEPS && j->st == DSQ_OK; s++) {
        const float *last = lg + (size_t)(N_PROMPT - 1 + s) * j->vocab;
        int32_t seq = 0, tok = (int32_t)dsq_argmax(last, (size_t)j->vocab);
        j->st = dsq_decode_step(c, 1, &seq, &tok, lg + (size_t)(N_PROMPT + s) * j->vocab);
    }
    if (j->st != DSQ_OK)
        snprintf(j->msg, sizeof j->msg, "%s / %s", dsq_status_string(j->st), dsq_ctx_last_error(c));
    dsq_ctx_free(c);
}

static void *tc_thread(void *p)
{
    tc_run(p);
    return NULL;
}

static void tc_check(dsq_model *m, int32_t vocab)
{
    const size_t n = (size_t)(N_PROMPT + N_STEPS) * vocab;
    ctx_job ref[TC_THREADS], job[TC_THREADS];
    for (int i = 0; i < TC_THREADS; i++) {
        ref[i] = (ctx_job){.model = m, .vocab = vocab, .variant = i, .logits = calloc(n, sizeof(float))};
        tc_run(&ref[i]);
        if (ref[i].st != DSQ_OK)
            printf("reference %d: %s\n", i, ref[i].msg);
        assert_int_equal(ref[i].st, DSQ_OK);
    }
    for (int round = 0; round < 3; round++) {
        pthread_t th[TC_THREADS];
        for (int i = 0; i < TC_THREADS; i++) {
            job[i] = (ctx_job){.model = m, .vocab = vocab, .variant = i, .logits = malloc(n * sizeof(float))};
            memset(job[i].logits, 0xff, n * sizeof(float)); /* NaN poison */
            assert_int_equal(pthread_create(&th[i], NULL, tc_thread, &job[i]), 0);
        }
        for (int i = 0; i < TC_THREADS; i++)
            pthread_join(th[i], NULL);
        for (int i = 0; i < TC_THREADS; i++) {
            if (job[i].st != DSQ_OK)
                printf("round %d thread %d: %s\n", round, i, job[i].msg);
            assert_int_equal(job[i].st, DSQ_OK);
            assert_memory_equal(job[i].logits, ref[i].logits, n * sizeof(float));
            free(job[i].logits);
        }
    }
    for (int i = 0; i < TC_THREADS; i++)
        free(ref[i].logits);
}

#endif
