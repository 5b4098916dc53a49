/*
 * test_cpu_tp.c - tensor parallelism's sharded math on the CPU backend
 * (lib/tp_weights.c slices, the in-process ranks of lib/cpu_backend.c)
 * equals the unsharded forward, through the public API:
 *  - models: tests/data/tiny (4 query heads, 2 KV heads, FFN 344, vocab
 *    1000, untied: degrees 1, 2, 4; at 4 each KV head is replicated on two
 *    ranks), tiny_tied (the same, head tied to the embedding: the head's
 *    vocabulary slices are views of the embedding), tiny_nobias_tied (1 KV
 *    head, no q/k/v biases: degree 2 replicates it; degree 4 does not
 *    divide its FFN and must be refused with DSQ_ERR_UNSUPPORTED);
 *  - KV static and paged, F32 / F16 / INT8;
 *  - a prompt of two sequences prefilled in chunks (several batches), then
 *    decode steps of both sequences together (tokens: the reference's
 *    greedy choices, fed to both), every logit row compared.
 * Tolerance (max |a-b| / max |ref| per row): 1e-5 with F32 KV (only the
 * summation order of o_proj / down differs: the ranks' partial sums are
 * added after their products).  With F16 / INT8 KV a key or value that the
 * unsharded pass rounds on one side of a storage step can round to the
 * other after that fp32 difference (one F16 ulp, one INT8 step of a vector):
 * 1e-3 and 1e-2.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

enum { PROMPT = 11, STEPS = 6, CHUNK = 4, NSEQ = 2 };

static dsq_model *load(const char *dir, int32_t world, dsq_status *st)
{
    dsq_model_params p;
    dsq_model_params_init(&p, sizeof p);
    p.backend = DSQ_BACKEND_CPU;
    p.n_threads = 2;
    p.tp_world = world;
    char *path = dsq_test_path(dir);
    dsq_model *m = NULL;
    *st = dsq_model_load(path, &p, &m);
    free(path);
    return m;
}

static dsq_ctx *ctx_of(dsq_model *m, int32_t layout, int32_t kvd)
{
    dsq_ctx_params cp;
    dsq_ctx_params_init(&cp, sizeof cp);
    cp.max_seqs = NSEQ;
    cp.max_context = 64;
    cp.max_batch_tokens = CHUNK;
    cp.kv_layout = layout;
    cp.kv_dtype = kvd;
    cp.n_threads = 2;
    if (layout == DSQ_KV_PAGED) {
        cp.kv_block_size = 4;
        cp.kv_pool_tokens = 128;
    }
    dsq_ctx *c = NULL;
    assert_int_equal(dsq_ctx_new(m, &cp, &c), DSQ_OK);
    return c;
}

/* Logit rows of the whole run, [NSEQ + STEPS * NSEQ][V]: each sequence's
 * prefill row, then each step's rows.  tokens: the decode tokens, chosen
 * (greedy) when `choose`, else read. */
static float *run(dsq_model *m, int32_t layout, int32_t kvd, int32_t V, int32_t *tokens, int choose)
{
    dsq_ctx *c = ctx_of(m, layout, kvd);
    float *out = calloc((size_t)(NSEQ + STEPS * NSEQ) * (size_t)V, sizeof *out);
    assert_non_null(out);
    for (int32_t s = 0; s < NSEQ; s++) {
        int32_t prompt[PROMPT + 3];
        const int32_t n = PROMPT + 3 * s; /* different lengths */
        for (int32_t i = 0; i < n; i++)
            prompt[i] = (int32_t)((i * 37 + s * 101 + 5) % V);
        assert_int_equal(dsq_prefill(c, s, prompt, n, 0, out + (size_t)s * V), DSQ_OK);
    }
    const int32_t seqs[NSEQ] = { 0, 1 };
    for (int32_t k = 0; k < STEPS; k++) {
        const float *prev = out + (size_t)(k * NSEQ) * V;
        if (choose)
            for (int32_t s = 0; s < NSEQ; s++)
                tokens[k * NSEQ + s] = (int32_t)dsq_argmax(prev + (size_t)s * V, (size_t)V);
        assert_int_equal(dsq_decode_step(c, NSEQ, seqs, tokens + k * NSEQ, out + (size_t)((k + 1) * NSEQ) * V),
                         DSQ_OK);
    }
    dsq_ctx_free(c);
    return out;
}

static void compare(const char *dir, int32_t world)
{
    static const int32_t layouts[] = { DSQ_KV_STATIC, DSQ_KV_PAGED };
    static const int32_t kvds[] = { DSQ_KV_F32, DSQ_KV_F16, DSQ_KV_INT8 };
    static const double tol[] = { 1e-5, 1e-3, 1e-2 };
    dsq_status st;
    dsq_model *ref = load(dir, 0, &st);
    assert_int_equal(st, DSQ_OK);
    dsq_model *tp = load(dir, world, &st);
    if (st != DSQ_OK)
        fprintf(stderr, "%s\n", dsq_last_error_message());
    assert_int_equal(st, DSQ_OK);
    dsq_model_info info;
    memset(&info, 0, sizeof info);
    info.struct_size = sizeof info;
    assert_int_equal(dsq_model_get_info(ref, &info), DSQ_OK);
    const int32_t V = info.n_vocab;
    for (size_t li = 0; li < 2; li++)
        for (size_t ki = 0; ki < 3; ki++) {
            int32_t tokens[STEPS * NSEQ];
            float *a = run(ref, layouts[li], kvds[ki], V, tokens, 1);
            float *b = run(tp, layouts[li], kvds[ki], V, tokens, 0);
            double worst = 0;
            for (int32_t r = 0; r < NSEQ + STEPS * NSEQ; r++) {
                double e = dsq_rel_err(b + (size_t)r * V, a + (size_t)r * V, (size_t)V);
                if (e > worst)
                    worst = e;
            }
            printf("  %-17s TP%d %s KV %-4s: max rel err %.3g (limit %g)\n", dir, world,
                   li ? "paged " : "static", ki == 0 ? "F32" : ki == 1 ? "F16" : "INT8", worst, tol[ki]);
            assert_true(worst <= tol[ki]);
            if (world == 1)
                assert_memory_equal(a, b, (size_t)(NSEQ + STEPS * NSEQ) * V * sizeof *a);
            free(a);
            free(b);
        }
    dsq_model_free(tp);
    dsq_model_free(ref);
}

static void test_tiny_degrees(void **state)
{
    (void)state;
    compare("tiny", 1);
    compare("tiny", 2);
    compare("tiny", 4);
}

static void test_tied_head(void **state)
{
    (void)state;
    compare("tiny_tied", 2);
    compare("tiny_tied", 4);
}

/* One KV head replicated on both ranks; no q/k/v biases. */
static void test_replicated_kv(void **state)
{
    (void)state;
    compare("tiny_nobias_tied", 2);
}

/* Degrees that do not divide the model, and the CPU's refusal of one
 * process per rank: clear statuses, nothing loaded. */
static void test_refused(void **state)
{
    (void)state;
    dsq_status st;
    assert_null(load("tiny_nobias_tied", 4, &st)); /* FFN 200 < 4 x 64 */
    assert_int_equal(st, DSQ_ERR_UNSUPPORTED);
    assert_non_null(strstr(dsq_last_error_message(), "intermediate_size"));
    assert_null(load("tiny", 3, &st)); /* 4 heads */
    assert_int_equal(st, DSQ_ERR_UNSUPPORTED);

    dsq_model_params p;
    dsq_model_params_init(&p, sizeof p);
    p.backend = DSQ_BACKEND_CPU;
    p.tp_world = 2;
    p.tp_rank = 1;
    unsigned char id[DSQ_TP_ID_BYTES] = { 0 };
    p.tp_id = id;
    char *path = dsq_test_path("tiny");
    dsq_model *m = NULL;
    assert_int_equal(dsq_model_load(path, &p, &m), DSQ_ERR_UNSUPPORTED);
    assert_null(m);
    /* an int8 head alone is quantized weights too: the rank slicing reads
     * bf16/f16/f32 tensors */
    dsq_model_params_init(&p, sizeof p);
    p.backend = DSQ_BACKEND_CPU;
    p.tp_world = 2;
    p.quantize_head = 1;
    assert_int_equal(dsq_model_load(path, &p, &m), DSQ_ERR_UNSUPPORTED);
    assert_non_null(strstr(dsq_last_error_message(), "quantize_head"));
    assert_null(m);
    free(path);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tiny_degrees),
        cmocka_unit_test(test_tied_head),
        cmocka_unit_test(test_replicated_kv),
        cmocka_unit_test(test_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
