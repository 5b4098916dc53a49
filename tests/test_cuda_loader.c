/*
 * test_cuda_loader.c - the CUDA backend's load-time non-finite check
 * (cuda/finite_check.cu on the uploaded weights): a NaN or Inf in any weight
 * the model uses is refused with DSQ_ERR_FORMAT naming the tensor, for every
 * upload path (bf16 matrices, the interleaved gate/up rows, fp32 norms and
 * biases, F16 and F32 sources converted on the host), at the first and the
 * last element; skip_finite_check loads it anyway; a clean model loads and
 * its logits stay close to the CPU backend's.  An F32 value finite in the file but
 * beyond bf16's range is refused on the GPU (it becomes Inf there) and
 * accepted on the CPU, which computes with it as stored.
 * The kernel itself (dsq_cu_flag_nonfinite) against the CPU scan on random
 * regions of odd shapes and pitches, poisoned inside and outside the region.
 * Exits 77 (skipped) when there is no CUDA device or no CUDA build.
 */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "st_writer.h"
#ifdef DSQ_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "../cuda/kernels.h"
#endif

static char *tmp;

static int setup(void **state)
{
    (void)state;
    tmp = stw_mkdtemp();
    return tmp ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    stw_rmtree(tmp);
    free(tmp);
    tmp = NULL;
    return 0;
}

#include "tiny_model.h"

static dsq_model_params params(dsq_backend b)
{
    dsq_model_params p = dsq_model_default_params();
    p.backend = b;
    return p;
}

static void test_nonfinite_refused_on_upload(void **state)
{
    (void)state;
    const int vocab = 40000; /* embedding rows over several check blocks */
    const struct {
        const char *tensor;
        int last;
        uint8_t bytes[4];
    } cases[] = {
        { "model.embed_tokens.weight", 1, { 0x80, 0x7f } },                 /* BF16 +Inf */
        { "model.layers.0.self_attn.q_proj.weight", 0, { 0xc0, 0xff } },    /* BF16 NaN */
        { "model.layers.1.self_attn.k_proj.weight", 1, { 0x80, 0xff } },    /* BF16 -Inf */
        { "model.layers.1.self_attn.v_proj.weight", 1, { 0x00, 0x7c } },    /* F16 +Inf */
        { "model.layers.0.self_attn.q_proj.bias", 1, { 0xc0, 0x7f } },      /* BF16 NaN -> fp32 */
        { "model.layers.1.self_attn.v_proj.bias", 0, { 0x00, 0xfe } },      /* F16 NaN -> fp32 */
        { "model.layers.0.self_attn.o_proj.weight", 1, { 0xc0, 0x7f } },
        { "model.layers.1.mlp.gate_proj.weight", 1, { 0xc0, 0x7f } },      /* even rows of wgu */
        { "model.layers.0.mlp.up_proj.weight", 0, { 0x80, 0x7f } },        /* odd rows of wgu */
        { "model.layers.1.mlp.down_proj.weight", 1, { 0x80, 0x7f } },
        { "model.layers.0.input_layernorm.weight", 0, { 0x00, 0x00, 0xc0, 0x7f } }, /* F32 */
        { "model.layers.1.post_attention_layernorm.weight", 1, { 0x00, 0x00, 0x80, 0xff } },
        { "model.norm.weight", 1, { 0x00, 0x00, 0x80, 0x7f } },
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        model_list m;
        size_t off[64];
        write_model(tmp, vocab, &m, off);
        int i = find_tensor(&m, cases[c].tensor);
        size_t es = stw_dtype_bytes(m.t[i].dtype);
        size_t at = off[i] + (cases[c].last ? stw_nbytes(&m.t[i]) - es : 0);
        char *file = stw_path(tmp, "model.safetensors");
        patch_data(file, at, cases[c].bytes, es);
        free(file);
        printf("  %s (%s, %s element)\n", cases[c].tensor, m.t[i].dtype,
               cases[c].last ? "last" : "first");
        char needle[128];
        snprintf(needle, sizeof needle, "'%s'", cases[c].tensor);
        dsq_model_params mp = params(DSQ_BACKEND_CUDA);
        expect_load(tmp, &mp, DSQ_ERR_FORMAT, needle);
        assert_non_null(strstr(dsq_last_error_message(), "as uploaded"));
        mp.skip_finite_check = 1;
        expect_load(tmp, &mp, DSQ_OK, NULL);
    }
}

static void test_clean_model_matches_cpu(void **state)
{
    (void)state;
    /* the committed tiny model (head_dim 128, which CUDA attention needs) */
    char *dir = dsq_test_path("tiny");
    dsq_model_params mg = params(DSQ_BACKEND_CUDA), mc = params(DSQ_BACKEND_CPU);
    dsq_model *g = NULL, *c = NULL;
    assert_int_equal(load(dir, &mg, &g), DSQ_OK);
    assert_int_equal(load(dir, &mc, &c), DSQ_OK);
    dsq_model_info info = { .struct_size = sizeof info };
    assert_int_equal(dsq_model_get_info(g, &info), DSQ_OK);
    const int V = info.n_vocab;
    float *lg = malloc((size_t)V * sizeof *lg), *lc = malloc((size_t)V * sizeof *lc);
    const int32_t prompt[] = { 1, 7, 299, 42 };
    dsq_ctx *cg = NULL, *cc = NULL;
    assert_int_equal(dsq_ctx_new(g, NULL, &cg), DSQ_OK);
    assert_int_equal(dsq_ctx_new(c, NULL, &cc), DSQ_OK);
    assert_int_equal(dsq_prefill(cg, 0, prompt, 4, DSQ_LOGITS_LAST, lg), DSQ_OK);
    assert_int_equal(dsq_prefill(cc, 0, prompt, 4, DSQ_LOGITS_LAST, lc), DSQ_OK);
    double err = dsq_rel_err(lg, lc, (size_t)V);
    printf("    clean model loads with the check: GPU vs CPU rel err %.3g, argmax %zu / %zu\n", err,
           dsq_argmax(lg, (size_t)V), dsq_argmax(lc, (size_t)V));
    for (int i = 0; i < V; i++)
        assert_true(isfinite(lg[i]));
    assert_true(err < 2e-2); /* the bound test_cuda_e2e uses for F16 KV */
    dsq_ctx_free(cg);
    dsq_ctx_free(cc);
    dsq_model_free(g);
    dsq_model_free(c);
    free(lg);
    free(lc);
    free(dir);
}

static void test_f32_overflowing_bf16(void **state)
{
    (void)state;
    /* 3.4e38 as F32 is finite; in bf16 (max 3.39e38) it rounds to Inf */
    model_list m;
    write_config(tmp, 32);
    model_tensors(&m, 32);
    for (int i = 0; i < m.n; i++)
        if (strcmp(m.t[i].name, "model.layers.0.self_attn.o_proj.weight") == 0)
            m.t[i].dtype = "F32";
    char *p = stw_path(tmp, "model.safetensors");
    size_t dlen, off[64];
    uint8_t *data = stw_write_tensors(p, m.t, m.n, NULL, 8, &dlen, off);
    assert_non_null(data);
    free(data);
    float big = 3.4e38f;
    patch_data(p, off[find_tensor(&m, "model.layers.0.self_attn.o_proj.weight")], &big, 4);
    free(p);
    dsq_model_params mg = params(DSQ_BACKEND_CUDA), mc = params(DSQ_BACKEND_CPU);
    expect_load(tmp, &mg, DSQ_ERR_FORMAT, "o_proj.weight' holds a non-finite value (NaN or Inf) as uploaded (bf16)");
    expect_load(tmp, &mc, DSQ_OK, NULL);
}

#ifdef DSQ_HAVE_CUDA
static uint64_t rng = 0x243f6a8885a308d3ull;
static uint32_t rnd(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 16);
}

/* One flag from the kernel over [rows][cols] at pitch in `host` (elem 2 or
 * 4 bytes, `total` elements). */
static uint32_t gpu_flag(const void *host, size_t total, int eb, int64_t rows, int64_t cols,
                         int64_t pitch, uint32_t start)
{
    void *d = NULL;
    uint32_t *df = NULL, hf = 0xdead;
    assert_int_equal(cudaMalloc(&d, total * (size_t)eb), cudaSuccess);
    assert_int_equal(cudaMalloc((void **)&df, 4), cudaSuccess);
    assert_int_equal(cudaMemcpy(d, host, total * (size_t)eb, cudaMemcpyHostToDevice), cudaSuccess);
    assert_int_equal(cudaMemcpy(df, &start, 4, cudaMemcpyHostToDevice), cudaSuccess);
    assert_int_equal(dsq_cu_flag_nonfinite(d, eb, rows, cols, pitch, df, 0), DSQ_OK);
    assert_int_equal(cudaMemcpy(&hf, df, 4, cudaMemcpyDeviceToHost), cudaSuccess);
    cudaFree(d);
    cudaFree(df);
    return hf;
}

/* The CPU scan over the same region, row by row. */
static int cpu_flag(const void *host, int eb, int64_t rows, int64_t cols, int64_t pitch)
{
    int bad = 0;
    for (int64_t r = 0; r < rows; r++)
        bad |= dsq_any_nonfinite((const char *)host + (size_t)(r * pitch) * (size_t)eb,
                                 eb == 2 ? DSQ_DT_BF16 : DSQ_DT_F32, (size_t)cols);
    return bad;
}

static void test_flag_kernel_vs_cpu(void **state)
{
    (void)state;
    const struct { int64_t rows, cols, pitch; } shapes[] = {
        { 1, 1, 1 }, { 3, 7, 7 }, { 5, 13, 26 }, { 4097, 3, 5 }, { 2, 70001, 70003 }, { 9000, 33, 66 },
    };
    for (int eb = 2; eb <= 4; eb += 2)
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
            const int64_t R = shapes[s].rows, C = shapes[s].cols, P = shapes[s].pitch;
            const size_t total = (size_t)(R * P) + 17; /* the last row's gap + a tail */
            uint8_t *h = malloc(total * (size_t)eb);
            for (int trial = 0; trial < 4; trial++) {
                /* finite random values: top exponent bit clear */
                for (size_t i = 0; i < total; i++) {
                    uint32_t v = rnd() & (eb == 2 ? 0xbfffu : 0xbfffffffu);
                    memcpy(h + i * (size_t)eb, &v, (size_t)eb);
                }
                int64_t r = (int64_t)(rnd() % (uint32_t)R), c = (int64_t)(rnd() % (uint32_t)C);
                size_t at = (size_t)(r * P + c);
                if (trial == 1 || trial == 3) { /* inside: NaN / -Inf */
                    uint32_t v = eb == 2 ? (trial == 1 ? 0x7fc1u : 0xff80u)
                                         : (trial == 1 ? 0x7fc00001u : 0xff800000u);
                    memcpy(h + at * (size_t)eb, &v, (size_t)eb);
                } else if (trial == 2) { /* outside: in the pitch gap or past the end */
                    size_t out = P > C ? (size_t)(r * P + C + (int64_t)(rnd() % (uint32_t)(P - C)))
                                       : total - 1 - rnd() % 17; /* P == C */
                    uint32_t v = eb == 2 ? 0x7f80u : 0x7f800000u;
                    memcpy(h + out * (size_t)eb, &v, (size_t)eb);
                }
                int want = cpu_flag(h, eb, R, C, P);
                assert_int_equal(want, trial == 1 || trial == 3);
                uint32_t got = gpu_flag(h, total, eb, R, C, P, 0);
                assert_int_equal(got, (uint32_t)want);
                /* the flag is only ever set, never cleared */
                assert_int_equal(gpu_flag(h, total, eb, R, C, P, 1), 1);
            }
            printf("    %d-byte [%lld][%lld] pitch %lld: clean, inside and outside poison agree\n", eb,
                   (long long)R, (long long)C, (long long)P);
            free(h);
        }
}
#endif

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
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_flag_kernel_vs_cpu),
        cmocka_unit_test_setup_teardown(test_nonfinite_refused_on_upload, setup, teardown),
        cmocka_unit_test_setup_teardown(test_clean_model_matches_cpu, setup, teardown),
        cmocka_unit_test_setup_teardown(test_f32_overflowing_bf16, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
#endif
}
