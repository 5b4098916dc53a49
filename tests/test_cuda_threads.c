/* test_cuda_threads.c - two contexts of one CUDA model, each driven by its
 * own thread at once (different KV layouts and dtypes, so the threads run
 * different kernels and graphs concurrently), give bit-identical logits to
 * the same work done alone, one context after the other (harness:
 * two_contexts.h): each context's stream, cuBLASLt handle, scratch and
 * graphs are its own, and the per-device kernel setup
 * (cuda/device_once.cu) is safe to race.  The CPU twin is test_threads.
 * With two or more GPUs also: every public call on a model of one device
 * leaves the caller's current device as it was, and a context on the second
 * device runs (its kernels' shared-memory opt-ins are that device's);
 * skipped (reported by cmocka as skipped) on one GPU.
 * Exits 77 (skipped) without a CUDA device or a CUDA build. */
enum { N_PROMPT = 40, N_STEPS = 12 };

#ifdef DSQ_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

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

#ifdef DSQ_HAVE_CUDA
static int current_device(void)
{
    int d = -1;
    assert_int_equal(cudaGetDevice(&d), cudaSuccess);
    return d;
}

/* Model on device `model_dev` driven from a thread whose current device is
 * `caller_dev`: after every call the current device is caller_dev again. */
static void run_on_other_device(int model_dev, int caller_dev)
{
    assert_int_equal(cudaSetDevice(caller_dev), cudaSuccess);
    char *dir = dsq_test_path("tiny");
    dsq_model_params mp = dsq_model_default_params();
    mp.backend = DSQ_BACKEND_CUDA;
    mp.device = model_dev;
    dsq_model *m = NULL;
    assert_int_equal(dsq_model_load(dir, &mp, &m), DSQ_OK);
    free(dir);
    assert_int_equal(current_device(), caller_dev);
    dsq_ctx_params cp = dsq_ctx_default_params();
    cp.max_seqs = 2;
    cp.max_context = 128;
    dsq_ctx *c = NULL;
    assert_int_equal(dsq_ctx_new(m, &cp, &c), DSQ_OK);
    assert_int_equal(current_device(), caller_dev);
    int32_t prompt[N_PROMPT];
    for (int i = 0; i < N_PROMPT; i++)
        prompt[i] = (int32_t)((i * 13 + 5) % g_vocab);
    float *lg = malloc((size_t)g_vocab * sizeof(float));
    assert_int_equal(dsq_prefill(c, 0, prompt, N_PROMPT, DSQ_LOGITS_LAST, lg), DSQ_OK);
    assert_int_equal(current_device(), caller_dev);
    for (int s = 0; s < 4; s++) {
        int32_t seq = 0, tok = (int32_t)dsq_argmax(lg, (size_t)g_vocab);
        assert_int_equal(dsq_decode_step(c, 1, &seq, &tok, lg), DSQ_OK);
        assert_int_equal(current_device(), caller_dev);
    }
    assert_int_equal(dsq_ctx_synchronize(c), DSQ_OK);
    assert_int_equal(current_device(), caller_dev);
    dsq_ctx_free(c);
    assert_int_equal(current_device(), caller_dev);
    dsq_model_free(m);
    assert_int_equal(current_device(), caller_dev);
    free(lg);
    printf("  model on device %d, caller on device %d: caller's device kept\n", model_dev, caller_dev);
}

static void test_caller_device_kept(void **state)
{
    (void)state;
    int n = 0;
    assert_int_equal(cudaGetDeviceCount(&n), cudaSuccess);
    if (n < 2) {
        printf("  one CUDA device: the two-device check needs two\n");
        skip();
    }
    run_on_other_device(0, 1);
    run_on_other_device(1, 0);
    assert_int_equal(cudaSetDevice(0), cudaSuccess);
}
#endif

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
        cmocka_unit_test(test_caller_device_kept),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    dsq_model_free(g_model);
    return rc;
#endif
}
