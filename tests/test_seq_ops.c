/*
 * test_seq_ops.c - sequence fork and truncate, mixed prompt-chunk / decode
 * passes, and context sizing that does not scale with max_seqs x
 * max_context, on the CPU backend (F32, F16 and INT8 KV; static and paged).
 * The cases live in seq_ops_cases.h (test_cuda_seq_ops.c runs them on the
 * GPU).
 */
#include <sys/resource.h>
#include <time.h>

#include "seq_ops_cases.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static long max_rss_kb(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_maxrss;
}

/* Issue 14 defect 8: a paged context with max_seqs 2^31-1, one 4096-token
 * block and max_context 4096 took 19 s and 8.2 GB (a block table of
 * max_seqs x max_blocks); and any large max_seqs x max_context table was
 * written out in full.  Now sequence ids are capped and block tables grow
 * with use: the absurd one is refused at once, a large legal one costs
 * megabytes, not the table. */
static void test_huge_paged_ctx_is_refused_or_cheap(void **state)
{
    (void)state;
    dsq_model *m = seq_load(DSQ_BACKEND_CPU);
    dsq_ctx_params cp = dsq_ctx_default_params();
    cp.kv_layout = DSQ_KV_PAGED;
    cp.max_seqs = INT32_MAX;
    cp.max_context = 4096;
    cp.kv_block_size = 4096;
    cp.kv_pool_tokens = 4096;
    cp.n_threads = 1;
    dsq_ctx *c = NULL;
    double t0 = now_s();
    assert_int_equal(dsq_ctx_new(m, &cp, &c), DSQ_ERR_INVALID_ARG);
    assert_null(c);
    printf("  max_seqs 2^31-1: %s (%.3f s)\n", dsq_last_error_message(), now_s() - t0);
    assert_non_null(strstr(dsq_last_error_message(), "max_seqs"));

    /* 65,536 sequences x 4096 positions with 1-token blocks: the old table
     * was 65536 x 4096 int32 = 1 GiB, written in full; now a few MB */
    long rss0 = max_rss_kb();
    cp.max_seqs = 65536;
    cp.kv_block_size = 1;
    cp.kv_pool_tokens = 64;
    t0 = now_s();
    assert_int_equal(dsq_ctx_new(m, &cp, &c), DSQ_OK);
    double dt = now_s() - t0;
    long grew_mb = (max_rss_kb() - rss0) / 1024;
    printf("  65,536 seqs x 4096 positions, 1-token blocks: created in %.3f s, peak RSS +%ld MB\n", dt, grew_mb);
    assert_true(grew_mb < 256);
    /* and it works: two sequences, a fork, a truncate */
    int32_t toks[40];
    rand_tokens(toks, 40, 1000, 1u);
    assert_int_equal(dsq_prefill(c, 65535, toks, 40, DSQ_LOGITS_LAST, NULL), DSQ_OK);
    assert_int_equal(dsq_seq_fork(c, 65535, 7), DSQ_OK);
    assert_int_equal(dsq_seq_truncate(c, 7, 3), DSQ_OK);
    int32_t s = 7, t = 5;
    assert_int_equal(dsq_decode_step(c, 1, &s, &t, NULL), DSQ_OK);
    assert_int_equal(used_tokens(c), 40 + 1); /* 3 shared + 1 own, 1-token blocks */
    dsq_ctx_free(c);

    /* the cap itself is accepted */
    cp.max_seqs = 1 << 20;
    cp.kv_block_size = 16;
    cp.kv_pool_tokens = 16;
    assert_int_equal(dsq_ctx_new(m, &cp, &c), DSQ_OK);
    dsq_ctx_free(c);
    cp.max_seqs = (1 << 20) + 1;
    assert_int_equal(dsq_ctx_new(m, &cp, &c), DSQ_ERR_INVALID_ARG);
    dsq_model_free(m);
}

int main(void)
{
    static const int dtypes[3] = {DSQ_KV_F32, DSQ_KV_F16, DSQ_KV_INT8};
    G.backend = DSQ_BACKEND_CPU;
    G.dtypes = dtypes;
    G.n_dtypes = 3;
    G.tol_same = 0.0;   /* same batch: bit-identical */
    G.tol_shape = 1e-5; /* numerics.md: CPU batch shapes agree to fp32 rounding */
    G.name = "cpu";
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_huge_paged_ctx_is_refused_or_cheap),
        cmocka_unit_test(test_fork_matches_independent),
        cmocka_unit_test(test_truncate_then_redecode),
        cmocka_unit_test(test_fork_memory),
        cmocka_unit_test(test_misuse),
        cmocka_unit_test(test_mixed_matches_separate),
        cmocka_unit_test(test_step_fork_truncate),
        cmocka_unit_test(test_step_misuse_changes_nothing),
        cmocka_unit_test(test_step_logit_rows_vary),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
