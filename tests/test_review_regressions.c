/* test_review_regressions.c - regression tests for defects found in review:
 *
 *  - a path that names a directory (or device) where a file is expected
 *    (config.json, tokenizer.json, a .safetensors) gave a 2^63-byte malloc
 *    (DSQ_ERR_OUT_OF_MEMORY with a nonsense size; an abort under ASan)
 *    instead of DSQ_ERR_IO;
 *  - a paged context whose kv_budget_bytes is too small for one token
 *    silently got the default pool (room for every sequence to reach
 *    max_context) instead of being refused.
 *
 * Expected values are the documented status codes and, for the pool size,
 * arithmetic on the model's own dimensions (dsq_model_get_info). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "testutil.h"

/* A fresh temporary directory; the caller removes it. */
static char *make_tmpdir(void)
{
    char *d = strdup("/tmp/dsq_review_XXXXXX");
    assert_non_null(d);
    assert_non_null(mkdtemp(d));
    return d;
}

static char *join(const char *a, const char *b)
{
    size_t n = strlen(a) + strlen(b) + 2;
    char *s = malloc(n);
    assert_non_null(s);
    snprintf(s, n, "%s/%s", a, b);
    return s;
}

static void test_directory_where_a_file_is_expected(void **state)
{
    (void)state;
    char *dir = make_tmpdir();
    char *tok_as_dir = join(dir, "tokenizer.json");
    char *cfg_as_dir = join(dir, "config.json");
    assert_int_equal(mkdir(tok_as_dir, 0700), 0);
    assert_int_equal(mkdir(cfg_as_dir, 0700), 0);

    /* tokenizer: the directory holds a *directory* named tokenizer.json */
    dsq_tokenizer *tok = (dsq_tokenizer *)(uintptr_t)1;
    dsq_status st = dsq_tokenizer_load(dir, &tok);
    printf("  tokenizer.json is a directory: %s (%s)\n", dsq_status_string(st),
           dsq_last_error_message());
    assert_int_equal(st, DSQ_ERR_IO);
    assert_null(tok);
    assert_non_null(strstr(dsq_last_error_message(), "not a regular file"));

    /* a device is not a tokenizer file either (and must not block or crash) */
    tok = (dsq_tokenizer *)(uintptr_t)1;
    assert_int_equal(dsq_tokenizer_load("/dev/null", &tok), DSQ_ERR_IO);
    assert_null(tok);

    /* model: config.json is a directory */
    dsq_model_params mp = dsq_model_default_params();
    mp.backend = DSQ_BACKEND_CPU;
    dsq_model *m = (dsq_model *)(uintptr_t)1;
    st = dsq_model_load(dir, &mp, &m);
    printf("  config.json is a directory: %s (%s)\n", dsq_status_string(st),
           dsq_last_error_message());
    assert_int_equal(st, DSQ_ERR_IO);
    assert_null(m);

    rmdir(tok_as_dir);
    rmdir(cfg_as_dir);
    rmdir(dir);
    free(tok_as_dir);
    free(cfg_as_dir);
    free(dir);
}

/* tests/data/tiny on the CPU backend, without a tokenizer */
static dsq_model *load_tiny_cpu(void)
{
    char *mdir = dsq_test_path("tiny");
    dsq_model_params mp = dsq_model_default_params();
    mp.backend = DSQ_BACKEND_CPU;
    mp.load_tokenizer = 0;
    dsq_model *m = NULL;
    dsq_status st = dsq_model_load(mdir, &mp, &m);
    free(mdir);
    if (st != DSQ_OK)
        fail_msg("tiny model: %s", dsq_last_error_message());
    return m;
}

static void test_kv_budget_too_small_is_refused(void **state)
{
    (void)state;
    dsq_model *m = load_tiny_cpu();
    dsq_status st;
    dsq_model_info mi = {.struct_size = sizeof mi};
    assert_int_equal(dsq_model_get_info(m, &mi), DSQ_OK);
    /* F32 KV: K and V of every layer and KV head, 4 bytes per value */
    const int64_t bpt = (int64_t)mi.n_layers * 2 * mi.n_kv_heads * mi.head_dim * 4;

    dsq_ctx_params cp = dsq_ctx_default_params();
    cp.max_seqs = 2;
    cp.max_context = 64;
    cp.kv_layout = DSQ_KV_PAGED;
    cp.kv_dtype = DSQ_KV_F32;
    cp.kv_block_size = 16;
    cp.n_threads = 1;

    /* less than one token: refused, not silently the default pool */
    cp.kv_budget_bytes = bpt - 1;
    dsq_ctx *c = (dsq_ctx *)(uintptr_t)1;
    st = dsq_ctx_new(m, &cp, &c);
    printf("  kv_budget_bytes %lld (< 1 token): %s (%s)\n", (long long)cp.kv_budget_bytes,
           dsq_status_string(st), dsq_last_error_message());
    assert_int_equal(st, DSQ_ERR_INVALID_ARG);
    assert_null(c);

    /* one token but less than one block: refused the same way */
    cp.kv_budget_bytes = bpt;
    c = (dsq_ctx *)(uintptr_t)1;
    assert_int_equal(dsq_ctx_new(m, &cp, &c), DSQ_ERR_INVALID_ARG);
    assert_null(c);

    /* exactly one block and a bit: a pool of one block */
    cp.kv_budget_bytes = bpt * 16 + bpt - 1;
    assert_int_equal(dsq_ctx_new(m, &cp, &c), DSQ_OK);
    dsq_ctx_info ci = {.struct_size = sizeof ci};
    assert_int_equal(dsq_ctx_get_info(c, &ci), DSQ_OK);
    assert_int_equal(ci.kv_bytes_per_token, bpt);
    assert_int_equal(ci.kv_capacity_tokens, 16);
    dsq_ctx_free(c);

    /* neither size given: the default, every sequence can reach max_context */
    cp.kv_budget_bytes = 0;
    assert_int_equal(dsq_ctx_new(m, &cp, &c), DSQ_OK);
    assert_int_equal(dsq_ctx_get_info(c, &ci), DSQ_OK);
    assert_int_equal(ci.kv_capacity_tokens, 2 * 64);
    dsq_ctx_free(c);
    dsq_model_free(m);
}

/* Absurd sizes are refused up front with INVALID_ARG instead of trying to
 * start a million threads or write gigabytes of block tables. */
static void test_absurd_ctx_sizes_are_refused(void **state)
{
    (void)state;
    dsq_model *m = load_tiny_cpu();
    dsq_ctx_params cp = dsq_ctx_default_params();
    cp.max_context = 64;
    cp.n_threads = 1000000;
    dsq_ctx *c = NULL;
    assert_int_equal(dsq_ctx_new(m, &cp, &c), DSQ_ERR_INVALID_ARG);
    assert_null(c);
    cp.n_threads = 1;
    /* static: 2^31 sequences x 4096 tokens would wrap size arithmetic */
    cp.max_seqs = INT32_MAX;
    cp.max_context = 4096;
    assert_int_equal(dsq_ctx_new(m, &cp, &c), DSQ_ERR_INVALID_ARG);
    printf("  huge static cache: %s\n", dsq_last_error_message());
    assert_null(c);
    cp.max_seqs = 1;
    cp.max_context = 64;
    cp.kv_layout = DSQ_KV_PAGED;
    cp.kv_pool_tokens = (int64_t)1 << 40;
    assert_int_equal(dsq_ctx_new(m, &cp, &c), DSQ_ERR_INVALID_ARG);
    printf("  huge pool: %s\n", dsq_last_error_message());
    assert_null(c);
    dsq_model_free(m);
}

/* A subnormal temperature: 1/T overflows; the draw is the greedy limit and
 * UBSan sees no NaN-to-int conversion. */
static void test_tiny_temperature_is_greedy(void **state)
{
    (void)state;
    dsq_sampler_params sp = dsq_sampler_default_params();
    sp.temperature = 1e-40f;
    sp.top_p = 1.0f;
    dsq_sampler *s = NULL;
    assert_int_equal(dsq_sampler_new(&sp, &s), DSQ_OK);
    float logits[7] = { 0.5f, 2.0f, -1.0f, 3.25f, 3.0f, 0.0f, 1.0f };
    for (int i = 0; i < 20; i++) {
        int32_t tok = -1;
        assert_int_equal(dsq_sampler_sample(s, logits, 7, &tok), DSQ_OK);
        assert_int_equal(tok, 3);
    }
    dsq_sampler_free(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_absurd_ctx_sizes_are_refused),
        cmocka_unit_test(test_tiny_temperature_is_greedy),
        cmocka_unit_test(test_directory_where_a_file_is_expected),
        cmocka_unit_test(test_kv_budget_too_small_is_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
