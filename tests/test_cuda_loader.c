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
 * Exits 77 (skipped) when there is no CUDA device or no CUDA build.
 */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "st_writer.h"

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
        cmocka_unit_test_setup_teardown(test_nonfinite_refused_on_upload, setup, teardown),
        cmocka_unit_test_setup_teardown(test_clean_model_matches_cpu, setup, teardown),
        cmocka_unit_test_setup_teardown(test_f32_overflowing_bf16, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
#endif
}
