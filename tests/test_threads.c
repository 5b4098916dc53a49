/* test_threads.c - the library's thread-safety promises, exercised from
 * several threads at once (built and run under ThreadSanitizer in CI, see
 * scripts/test.sh; under TSan every data race is a failure):
 *   - two contexts of one model, each driven by its own thread and each with
 *     its own worker pool, give bit-identical logits to the same work done
 *     alone, one context after the other;
 *   - concurrent model loads, and failing calls on several threads: each
 *     thread reads its own last-error message;
 *   - one tokenizer shared by several threads encoding and decoding;
 *   - the log callback replaced while other threads log: function, user
 *     pointer and level always arrive together.
 * The CPU worker pool alone is exercised by test_cpu_ops (test_threadpool). */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { N_PROMPT = 24, N_STEPS = 6, N_THR = 2 };

#include "testutil.h"
#include "two_contexts.h"

static dsq_model *g_model;
static int32_t g_vocab;

static dsq_model *load_tiny(void)
{
    char *dir = dsq_test_path("tiny");
    dsq_model_params mp = dsq_model_default_params();
    mp.backend = DSQ_BACKEND_CPU;
    dsq_model *m = NULL;
    dsq_status st = dsq_model_load(dir, &mp, &m);
    if (st != DSQ_OK)
        printf("cannot load %s: %s\n", dir, dsq_last_error_message());
    free(dir);
    return m;
}

static int setup(void **state)
{
    (void)state;
    g_model = load_tiny();
    if (!g_model)
        return -1;
    dsq_model_info mi = {.struct_size = sizeof mi};
    if (dsq_model_get_info(g_model, &mi) != DSQ_OK)
        return -1;
    g_vocab = mi.n_vocab;
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    dsq_model_free(g_model);
    return 0;
}

/* ---- two contexts of one model, two threads ------------------------------- */

/* The variants differ in KV layout/dtype and worker count so that two
 * threads run different code at once; variant 0 splits the prompt into
 * chunks. */
static void tc_params(int v, dsq_ctx_params *cp)
{
    static const int32_t kinds[TC_THREADS][4] = {
        /* layout, dtype, n_threads, max_batch_tokens */
        {DSQ_KV_STATIC, DSQ_KV_F32, 2, 16},
        {DSQ_KV_PAGED, DSQ_KV_F16, 2, 32},
    };
    cp->max_context = 64;
    cp->kv_layout = kinds[v][0];
    cp->kv_dtype = kinds[v][1];
    cp->n_threads = kinds[v][2];
    cp->max_batch_tokens = kinds[v][3];
}

static void test_two_contexts_two_threads(void **state)
{
    (void)state;
    tc_check(g_model, g_vocab);
}

/* ---- concurrent loads; per-thread last error ------------------------------------- */

typedef struct load_job {
    int idx;
    int bad;
} load_job;

static void *load_thread(void *p)
{
    load_job *j = p;
    for (int rep = 0; rep < 2; rep++) {
        dsq_model *m = load_tiny();
        if (!m) {
            j->bad++;
            continue;
        }
        dsq_model_info mi = {.struct_size = sizeof mi};
        if (dsq_model_get_info(m, &mi) != DSQ_OK || mi.n_vocab != g_vocab)
            j->bad++;
        dsq_model_free(m);
        /* a failure whose message names this thread's path */
        char path[64];
        snprintf(path, sizeof path, "/nonexistent/thread-%d-%d", j->idx, rep);
        dsq_model *none = NULL;
        dsq_status st = dsq_model_load(path, NULL, &none);
        if (st == DSQ_OK || none || !strstr(dsq_last_error_message(), path)) {
            printf("thread %d: load of %s gave %d, message '%s'\n", j->idx, path, st,
                   dsq_last_error_message());
            j->bad++;
        }
        dsq_model_free(none);
    }
    return NULL;
}

static void test_concurrent_loads_and_errors(void **state)
{
    (void)state;
    enum { N = 3 };
    pthread_t th[N];
    load_job jobs[N];
    for (int i = 0; i < N; i++) {
        jobs[i] = (load_job){.idx = i};
        assert_int_equal(pthread_create(&th[i], NULL, load_thread, &jobs[i]), 0);
    }
    int bad = 0;
    for (int i = 0; i < N; i++) {
        pthread_join(th[i], NULL);
        bad += jobs[i].bad;
    }
    assert_int_equal(bad, 0);
}

/* ---- one tokenizer, several threads -------------------------------------------------- */

static const char *const g_texts[] = {
    "Hello, world! 12345 tokens",
    "<｜User｜>What is 7*6?<｜Assistant｜><think>\nfine</think>",
    "  leading spaces, tabs\t\tand\nnewlines\r\n",
    "naïve café — 日本語のテキスト 🙂",
};
enum { N_TEXTS = sizeof g_texts / sizeof g_texts[0], MAX_IDS = 256 };

typedef struct tok_job {
    const dsq_tokenizer *tok;
    int32_t ids[N_TEXTS][MAX_IDS];
    size_t n[N_TEXTS];
    char text[N_TEXTS][512];
    int bad;
} tok_job;

static void tok_run(tok_job *j)
{
    for (int rep = 0; rep < 3; rep++) {
        for (int i = 0; i < N_TEXTS; i++) {
            size_t n = 0, len = 0;
            if (dsq_tokenize(j->tok, g_texts[i], strlen(g_texts[i]), 0, j->ids[i], MAX_IDS, &n) != DSQ_OK ||
                dsq_detokenize(j->tok, j->ids[i], n, 0, j->text[i], sizeof j->text[i], &len) != DSQ_OK)
                j->bad++;
            j->n[i] = n;
        }
    }
}

static void *tok_thread(void *p)
{
    tok_run(p);
    return NULL;
}

static void test_shared_tokenizer(void **state)
{
    (void)state;
    char *path = dsq_test_path("model/tokenizer.json");
    dsq_tokenizer *tok = NULL;
    dsq_status st = dsq_tokenizer_load(path, &tok);
    if (st != DSQ_OK)
        printf("cannot load %s: %s\n", path, dsq_last_error_message());
    free(path);
    assert_int_equal(st, DSQ_OK);
    enum { N = 3 };
    static tok_job ref, jobs[N];
    memset(&ref, 0, sizeof ref);
    ref.tok = tok;
    tok_run(&ref);
    assert_int_equal(ref.bad, 0);
    for (int i = 0; i < N_TEXTS; i++) /* the decoder gives back the text */
        assert_string_equal(ref.text[i], g_texts[i]);
    pthread_t th[N];
    for (int i = 0; i < N; i++) {
        memset(&jobs[i], 0, sizeof jobs[i]);
        jobs[i].tok = tok;
        assert_int_equal(pthread_create(&th[i], NULL, tok_thread, &jobs[i]), 0);
    }
    for (int i = 0; i < N; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(jobs[i].bad, 0);
        for (int t = 0; t < N_TEXTS; t++) {
            assert_int_equal(jobs[i].n[t], ref.n[t]);
            assert_memory_equal(jobs[i].ids[t], ref.ids[t], ref.n[t] * sizeof(int32_t));
            assert_string_equal(jobs[i].text[t], ref.text[t]);
        }
    }
    dsq_tokenizer_free(tok);
}

/* ---- the log callback replaced while others log ------------------------------------ */

typedef struct sink {
    int tag;
    atomic_int calls;
    atomic_int mismatched;
} sink;

static sink g_sink_a = {.tag = 'a'}, g_sink_b = {.tag = 'b'};

static void log_a(dsq_log_level level, const char *msg, void *user)
{
    sink *s = user;
    (void)level;
    if (s != &g_sink_a || !msg)
        atomic_fetch_add(&g_sink_a.mismatched, 1);
    else
        atomic_fetch_add(&s->calls, 1);
}

static void log_b(dsq_log_level level, const char *msg, void *user)
{
    sink *s = user;
    (void)level;
    if (s != &g_sink_b || !msg)
        atomic_fetch_add(&g_sink_b.mismatched, 1);
    else
        atomic_fetch_add(&s->calls, 1);
}

static atomic_int g_stop;

static void *failing_calls(void *p)
{
    (void)p;
    while (!atomic_load(&g_stop)) {
        dsq_ctx *c = NULL;
        (void)dsq_ctx_new(NULL, NULL, &c); /* DSQ_ERR_INVALID_ARG, logged at DEBUG */
    }
    return NULL;
}

static void test_log_callback_swaps(void **state)
{
    (void)state;
    enum { N = 2 };
    pthread_t th[N];
    atomic_store(&g_stop, 0);
    for (int i = 0; i < N; i++)
        assert_int_equal(pthread_create(&th[i], NULL, failing_calls, NULL), 0);
    /* swap until both callbacks have been reached (at least 2000 swaps,
     * at most ~10 s) */
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int i = 0;; i++) {
        if (i % 2)
            dsq_set_log_callback(log_a, &g_sink_a, DSQ_LOG_DEBUG);
        else
            dsq_set_log_callback(log_b, &g_sink_b, DSQ_LOG_DEBUG);
        if (i % 100 == 0)
            dsq_set_log_callback(NULL, NULL, DSQ_LOG_ERROR);
        /* let the loggers run under each callback in turn: a sleep only after
         * even i would leave log_a installed for a few instructions at a time,
         * and on a loaded 2-core machine it was never reached in 10 s (CI) */
        if (i % 64 == 0 || i % 64 == 1)
            nanosleep(&(struct timespec){0, 100000}, NULL);
        clock_gettime(CLOCK_MONOTONIC, &t);
        if ((i >= 2000 && atomic_load(&g_sink_a.calls) > 0 && atomic_load(&g_sink_b.calls) > 0) ||
            t.tv_sec - t0.tv_sec > 10)
            break;
    }
    atomic_store(&g_stop, 1);
    for (int i = 0; i < N; i++)
        pthread_join(th[i], NULL);
    dsq_set_log_callback(NULL, NULL, DSQ_LOG_ERROR);
    printf("  log callback: %d calls to a, %d to b\n", atomic_load(&g_sink_a.calls),
           atomic_load(&g_sink_b.calls));
    assert_int_equal(atomic_load(&g_sink_a.mismatched), 0);
    assert_int_equal(atomic_load(&g_sink_b.mismatched), 0);
    assert_true(atomic_load(&g_sink_a.calls) > 0);
    assert_true(atomic_load(&g_sink_b.calls) > 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_two_contexts_two_threads),
        cmocka_unit_test(test_concurrent_loads_and_errors),
        cmocka_unit_test(test_shared_tokenizer),
        cmocka_unit_test(test_log_callback_swaps),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
