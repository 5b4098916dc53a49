/* test_cuda_threads.c - two contexts of one CUDA model, each driven by its
 * own thread at once (different KV layouts and dtypes, so the threads run
 * different kernels and graphs concurrently), give bit-identical logits to
 * the same work done alone, one context after the other (harness:
 * two_contexts.h): each context's stream, cuBLASLt handle, scratch and
 * graphs are its own, and the per-device kernel setup
 * (cuda/device_once.cu) is safe to race.  The CPU twin is test_threads.
 * Exits 77 (skipped) without a CUDA device or a CUDA build. */
enum { N_PROMPT = 40, N_STEPS = 12 };

#include "internal.h"
#include "testutil.h"
#include "two_contexts.h"

static dsq_model *g_model;
static int32_t g_vocab;

/* Variant 0 prefills in chunks through cuBLASLt and the prefill kernel,
 * variant 1 in one pass; both decode through graphs. */
static void tc_params(int v, dsq_ctx_params *cp)
{
    static const int32_t kinds[TC_THREADS][3] = {
        /* layout, dtype, max_batch_tokens */
        {DSQ_KV_STATIC, DSQ_KV_F16, 16},
        {DSQ_KV_PAGED, DSQ_KV_INT8, 64},
    };
    cp->max_seqs = 2;
    cp->max_context = 128;
    cp->kv_layout = kinds[v][0];
    cp->kv_dtype = kinds[v][1];
    cp->max_batch_tokens = kinds[v][2];
    cp->kv_block_size = 16;
}

static void test_two_contexts_two_threads(void **state)
{
    (void)state;
    tc_check(g_model, g_vocab);
}

int main(void)
{
#ifndef DSQ_HAVE_CUDA
    printf("SKIP: no CUDA device (built without CUDA)\n");
    return DSQ_TEST_SKIP;
#else
    const char *no_device = dsq_cuda_device_problem();
    if (no_device) {
        printf("SKIP: no CUDA device (%s)\n", no_device);
        return DSQ_TEST_SKIP;
    }
    char *dir = dsq_test_path("tiny");
    dsq_model_params mp = dsq_model_default_params();
    mp.backend = DSQ_BACKEND_CUDA;
    dsq_status st = dsq_model_load(dir, &mp, &g_model);
    free(dir);
    dsq_model_info mi = {.struct_size = sizeof mi};
    if (st != DSQ_OK || dsq_model_get_info(g_model, &mi) != DSQ_OK) {
        printf("cannot load tiny on CUDA: %s\n", dsq_last_error_message());
        return 1;
    }
    g_vocab = mi.n_vocab;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_two_contexts_two_threads),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    dsq_model_free(g_model);
    return rc;
#endif
}
