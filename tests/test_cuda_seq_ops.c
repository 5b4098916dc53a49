/*
 * test_cuda_seq_ops.c - the cases of seq_ops_cases.h on the CUDA backend
 * (F16 and INT8 KV, static and paged): fork and truncate against
 * independent sequences, copy on write with a full pool, misuse, and mixed
 * prompt-chunk / decode passes (decode kernel for the one-token rows,
 * prefill kernel for the chunks) against separate GPU calls and against the
 * CPU backend.  Exits 77 (skipped) without a CUDA device or CUDA build.
 */
#include "seq_ops_cases.h"

int main(void)
{
#ifndef DSQ_HAVE_CUDA
    printf("SKIP: no CUDA device (built without CUDA)\n");
    return DSQ_TEST_SKIP;
#else
    if (!dsq_cuda_available()) {
        printf("SKIP: no CUDA device\n");
        return DSQ_TEST_SKIP;
    }
    static const int dtypes[2] = {DSQ_KV_F16, DSQ_KV_INT8};
    G.backend = DSQ_BACKEND_CUDA;
    G.dtypes = dtypes;
    G.n_dtypes = 2;
    /* same batch, same kernels: expected bit-identical; the bound only
     * keeps a report of the figure if not */
    G.tol_same = 1e-5;
    /* mixed vs separate calls: products switch GEMV / cuBLASLt with the row
     * count (numerics.md: 3-4e-3); the GPU end-to-end bound */
    G.tol_shape = 2e-2;
    G.name = "cuda";
    const struct CMUnitTest tests[] = {
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
#endif
}
