/*
 * test_cuda_nccl.c - the NCCL communicator layer of tensor parallelism
 * (cuda/nccl_comm.cu) on whatever GPUs are present:
 *  - a communicator of one rank (dsq_comm_init_local over device 0): an
 *    all-reduce leaves the buffer as it was (sum over one rank), in f32 and
 *    bf16, and a second communicator of one rank via dsq_comm_init_rank with
 *    a fresh unique id does the same;
 *  - a missing peer never hangs: rank 0 of a world of 2 whose rank 1 never
 *    joins returns DSQ_ERR_DEVICE ("timed out") after about the timeout;
 *  - bad arguments are refused before NCCL is touched.
 * With two or more GPUs, also a two-rank communicator over devices 0 and 1
 * (sum of two buffers).  Exits 77 (skipped) without a CUDA build, without
 * NCCL (the loader's reason is printed) or without a device.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "internal.h"
#include "testutil.h"
#ifdef DSQ_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "../cuda/nccl_comm.h"

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* all-reduce of n floats over comms[0..k) where rank r holds r+1+i*0.5:
 * the result everywhere is sum_r (r+1) + k*i*0.5 */
static void reduce_case(dsq_comm **comms, const int *devices, int k, size_t n)
{
    float *dbuf[8], *h = malloc(n * sizeof *h);
    cudaStream_t s[8];
    assert_non_null(h);
    for (int r = 0; r < k; r++) {
        assert_int_equal(cudaSetDevice(devices[r]), cudaSuccess);
        assert_int_equal(cudaStreamCreate(&s[r]), cudaSuccess);
        assert_int_equal(cudaMalloc((void **)&dbuf[r], n * sizeof(float)), cudaSuccess);
        for (size_t i = 0; i < n; i++)
            h[i] = (float)(r + 1) + 0.5f * (float)i;
        assert_int_equal(cudaMemcpy(dbuf[r], h, n * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
    }
    /* one thread enqueues every rank: inside no group each call would wait
     * for its peers; dsq_comm_all_reduce_sum returns once enqueued */
    for (int r = 0; r < k; r++)
        assert_int_equal(dsq_comm_all_reduce_sum(comms[r], dbuf[r], n, DSQ_COMM_F32, s[r]), DSQ_OK);
    double want0 = (double)k * (k + 1) / 2.0;
    for (int r = 0; r < k; r++) {
        assert_int_equal(dsq_comm_sync_stream(comms[r], s[r]), DSQ_OK);
        assert_int_equal(cudaMemcpy(h, dbuf[r], n * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
        for (size_t i = 0; i < n; i++)
            if (fabs((double)h[i] - (want0 + (double)k * 0.5 * (double)i)) > 1e-3 * (1.0 + (double)i))
                fail_msg("rank %d of %d, element %zu: %g, want %g", r, k, i, (double)h[i],
                         want0 + (double)k * 0.5 * (double)i);
        cudaFree(dbuf[r]);
        cudaStreamDestroy(s[r]);
    }
    free(h);
}

static void test_one_rank(void **state)
{
    (void)state;
    int dev = 0, cur = -1;
    dsq_comm *c = NULL;
    assert_int_equal(cudaSetDevice(0), cudaSuccess);
    assert_int_equal(dsq_comm_init_local(&dev, 1, 30.0, &c), DSQ_OK);
    assert_int_equal(cudaGetDevice(&cur), cudaSuccess);
    assert_int_equal(cur, 0);
    assert_int_equal(dsq_comm_rank(c), 0);
    assert_int_equal(dsq_comm_world(c), 1);
    reduce_case(&c, &dev, 1, 1000003);
    assert_int_equal(dsq_comm_wait(c), DSQ_OK);
    dsq_comm_free(c);

    uint8_t id[DSQ_COMM_ID_BYTES];
    assert_int_equal(dsq_comm_unique_id(id), DSQ_OK);
    c = NULL;
    assert_int_equal(dsq_comm_init_rank(id, 0, 1, 0, 30.0, &c), DSQ_OK);
    reduce_case(&c, &dev, 1, 17);
    dsq_comm_free(c);
}

static void test_missing_peer_times_out(void **state)
{
    (void)state;
    uint8_t id[DSQ_COMM_ID_BYTES];
    assert_int_equal(dsq_comm_unique_id(id), DSQ_OK);
    dsq_comm *c = (dsq_comm *)&id; /* must be cleared */
    double t0 = now_s();
    dsq_status st = dsq_comm_init_rank(id, 0, 2, 0, 3.0, &c);
    double t = now_s() - t0;
    printf("  rank 0 of 2 alone: %s after %.2f s: %s\n", dsq_status_string(st), t, dsq_last_error_message());
    assert_int_equal(st, DSQ_ERR_DEVICE);
    assert_null(c);
    assert_non_null(strstr(dsq_last_error_message(), "timed out"));
    assert_true(t >= 2.9 && t < 30.0);
}

static void test_bad_arguments(void **state)
{
    (void)state;
    uint8_t id[DSQ_COMM_ID_BYTES] = {0};
    dsq_comm *c = NULL;
    assert_int_equal(dsq_comm_init_rank(id, 2, 2, 0, 1.0, &c), DSQ_ERR_INVALID_ARG);
    assert_int_equal(dsq_comm_init_rank(id, 0, 0, 0, 1.0, &c), DSQ_ERR_INVALID_ARG);
    assert_int_equal(dsq_comm_init_rank(id, 0, 1, 0, 0.0, &c), DSQ_ERR_INVALID_ARG);
    assert_int_equal(dsq_comm_init_rank(NULL, 0, 1, 0, 1.0, &c), DSQ_ERR_INVALID_ARG);
    assert_int_equal(dsq_comm_init_rank(id, 0, 1, 4096, 1.0, &c), DSQ_ERR_INVALID_ARG);
    int two[2] = {0, 0};
    dsq_comm *cs[2];
    assert_int_equal(dsq_comm_init_local(two, 2, 1.0, cs), DSQ_ERR_INVALID_ARG); /* listed twice */
    assert_null(cs[0]);
    assert_int_equal(dsq_comm_all_reduce_sum(NULL, NULL, 0, DSQ_COMM_F32, NULL), DSQ_ERR_INVALID_ARG);
    assert_int_equal(dsq_comm_unique_id(NULL), DSQ_ERR_INVALID_ARG);
    dsq_comm_free(NULL);
}

static void test_two_ranks(void **state)
{
    (void)state;
    int n = 0;
    assert_int_equal(cudaGetDeviceCount(&n), cudaSuccess);
    if (n < 2) {
        printf("  SKIP (this case): %d GPU, two-rank all-reduce needs 2\n", n);
        skip();
    }
    int devs[2] = {0, 1};
    dsq_comm *cs[2];
    assert_int_equal(dsq_comm_init_local(devs, 2, 60.0, cs), DSQ_OK);
    reduce_case(cs, devs, 2, 1 << 20);
    dsq_comm_free(cs[0]);
    dsq_comm_free(cs[1]);
}
#endif

int main(void)
{
#ifndef DSQ_HAVE_CUDA
    printf("SKIP: built without CUDA\n");
    return DSQ_TEST_SKIP;
#else
    const char *why = dsq_nccl_problem();
    if (why) {
        printf("SKIP: no NCCL: %s\n", why);
        return DSQ_TEST_SKIP;
    }
    if (!dsq_cuda_available()) {
        printf("SKIP: no CUDA device\n");
        return DSQ_TEST_SKIP;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bad_arguments),
        cmocka_unit_test(test_one_rank),
        cmocka_unit_test(test_missing_peer_times_out),
        cmocka_unit_test(test_two_ranks),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
#endif
}
