/*
 * test_quant_load.c - quantized checkpoints and quantize-at-load, end to end
 * on the CPU backend.
 *
 * tests/data/quant_tiny (tests/fixtures/make_quant_tiny.py, numpy only): a
 * small random Qwen2 model in bf16, the same model converted by
 * quant_model.py into AWQ, GPTQ (v1 asymmetric, v1 symmetric, v2) and the
 * dsqwen Q8_ROW / Q4_G128 formats, and the fp32 models of their dequantized
 * weights (deq_map.json names which one belongs to which format; numpy
 * dequantized them, checked there against quant_pack.py's independent
 * dequantizers).
 *
 *  - every format: logits (a 12-token prefill, every row, then 3 decode
 *    steps; F32 KV) of the quantized checkpoint vs the CPU backend running
 *    its dequantized fp32 model: <= 1e-4 relative (issue 10's CPU bound);
 *  - quantize-at-load of the bf16 model (INT8; Q4; Q4 with an int8 head)
 *    vs the checkpoints numpy quantized with the documented rules: the same
 *    bits, so the logits must be bit-identical;
 *  - weight_bytes counts the stored quantized arrays;
 *  - quantize_head alone (quantize NONE): AWQ / GPTQ with an int8 head vs
 *    their dequantized models with the same int8 head;
 *  - refusals: quantize on a quantized checkpoint, unsupported or mismatched
 *    quantization_config, wrong tensor shapes / dtypes, NaN scales, NaN
 *    weights met by the quantizer.
 */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "st_writer.h"

#define N_PROMPT 12
#define N_DEC 3
#define V 320     /* quant_tiny's vocabulary */
#define MAXV 1000 /* the largest vocabulary a test here loads (tiny_tied) */
#define N_ROWS (N_PROMPT + N_DEC)
static int32_t g_vocab; /* of the last model run() loaded */

static const int32_t g_prompt[N_PROMPT] = { 5, 17, 300, 42, 7, 99, 128, 3, 250, 61, 11, 200 };
static const int32_t g_dec[N_DEC] = { 77, 150, 9 };

static char *qdir(const char *name)
{
    char rel[128];
    snprintf(rel, sizeof rel, "quant_tiny/%s", name);
    return dsq_test_path(rel);
}

/* Load `dir` on the CPU with the given quantize params; logits [N_ROWS][V]
 * into out (NULL: load only).  Returns the load's status; *bytes =
 * weight_bytes. */
static dsq_status run(const char *dir, int quantize, int qhead, int skip_finite, float *out,
                      int64_t *bytes)
{
    dsq_model_params mp = dsq_model_default_params();
    mp.backend = DSQ_BACKEND_CPU;
    mp.quantize = quantize;
    mp.quantize_head = qhead;
    mp.skip_finite_check = skip_finite;
    mp.n_threads = 2;
    dsq_model *m = NULL;
    dsq_status st = dsq_model_load(dir, &mp, &m);
    if (st != DSQ_OK)
        return st;
    dsq_model_info info = { .struct_size = sizeof info };
    assert_int_equal(dsq_model_get_info(m, &info), DSQ_OK);
    assert_true(info.n_vocab <= MAXV);
    g_vocab = info.n_vocab;
    const int32_t V_ = info.n_vocab;
    if (bytes)
        *bytes = info.weight_bytes;
    if (out) {
        dsq_ctx_params cp = dsq_ctx_default_params();
        cp.max_context = 64;
        cp.kv_dtype = DSQ_KV_F32;
        cp.n_threads = 2;
        dsq_ctx *c = NULL;
        assert_int_equal(dsq_ctx_new(m, &cp, &c), DSQ_OK);
        for (int i = 0; i < N_ROWS * V_; i++)
            out[i] = NAN;
        assert_int_equal(dsq_prefill(c, 0, g_prompt, N_PROMPT, DSQ_LOGITS_ALL, out), DSQ_OK);
        int32_t seq = 0;
        for (int i = 0; i < N_DEC; i++)
            assert_int_equal(dsq_decode_step(c, 1, &seq, &g_dec[i], out + (size_t)(N_PROMPT + i) * V_),
                             DSQ_OK);
        dsq_ctx_free(c);
    }
    dsq_model_free(m);
    return DSQ_OK;
}

static void expect_load(const char *dir, int quantize, int qhead, float *out, int64_t *bytes)
{
    dsq_status st = run(dir, quantize, qhead, 0, out, bytes);
    if (st != DSQ_OK)
        fail_msg("%s: %s: %s", dir, dsq_status_string(st), dsq_last_error_message());
}

static char *deq_of(const char *fmt)
{
    char *map_path = qdir("deq_map.json");
    char *text = dsq_test_read(map_path, NULL);
    assert_non_null(text);
    cJSON *root = cJSON_Parse(text);
    assert_non_null(root);
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, fmt);
    assert_true(cJSON_IsString(v));
    char *d = qdir(v->valuestring);
    cJSON_Delete(root);
    free(text);
    free(map_path);
    return d;
}

static void test_formats_vs_dequantized(void **state)
{
    (void)state;
    static const char *fmts[] = { "awq", "gptq", "gptq_sym", "gptq_v2", "q8", "q4" };
    float *a = malloc(sizeof(float) * N_ROWS * V), *b = malloc(sizeof(float) * N_ROWS * V);
    for (size_t i = 0; i < sizeof fmts / sizeof fmts[0]; i++) {
        char *dq = qdir(fmts[i]), *dd = deq_of(fmts[i]);
        expect_load(dq, DSQ_QUANTIZE_NONE, 0, a, NULL);
        expect_load(dd, DSQ_QUANTIZE_NONE, 0, b, NULL);
        for (int k = 0; k < N_ROWS * V; k++)
            assert_true(isfinite(a[k]));
        double e = dsq_rel_err(a, b, (size_t)N_ROWS * V);
        int same = memcmp(a, b, sizeof(float) * N_ROWS * V) == 0;
        printf("%-8s vs its dequantized fp32 model: rel err %.3g%s\n", fmts[i], e,
               same ? " (bit-identical)" : "");
        assert_true(e <= 1e-4);
        for (int r = 0; r < N_ROWS; r++)
            assert_int_equal(dsq_argmax(a + (size_t)r * V, V), dsq_argmax(b + (size_t)r * V, V));
        free(dq);
        free(dd);
    }
    free(a);
    free(b);
}

/* Bytes of the linears of the model in each storage (the test model's shapes). */
typedef enum { ST_BF16, ST_Q8, ST_Q4 } storage;
static int64_t lin_bytes(int64_t N, int64_t K, storage s)
{
    int64_t G = (K + 127) / 128, ldq = (K + 31) / 32 * 16;
    return s == ST_BF16 ? 2 * N * K : s == ST_Q8 ? N * K + 4 * N : N * ldq + 3 * N * G;
}
static int64_t layers_bytes(storage s)
{
    const int64_t E = 128, F = 256, QD = 128, KVD = 64;
    const int64_t per = lin_bytes(QD, E, s) + 2 * lin_bytes(KVD, E, s) + lin_bytes(E, QD, s) +
                        2 * lin_bytes(F, E, s) + lin_bytes(E, F, s);
    return 2 * per;
}

static void test_quantize_at_load(void **state)
{
    (void)state;
    char *src = qdir("bf16");
    float *a = malloc(sizeof(float) * N_ROWS * V), *b = malloc(sizeof(float) * N_ROWS * V);
    int64_t dense = 0, bq = 0, bc = 0;
    expect_load(src, DSQ_QUANTIZE_NONE, 0, NULL, &dense);
    static const struct {
        const char *ckpt;
        int mode, head;
        storage lin, hd;
    } cases[] = {
        { "q8", DSQ_QUANTIZE_INT8, 0, ST_Q8, ST_BF16 },
        { "q4", DSQ_QUANTIZE_Q4, 0, ST_Q4, ST_BF16 },
        { "q4h", DSQ_QUANTIZE_Q4, 1, ST_Q4, ST_Q8 },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *ck = qdir(cases[i].ckpt);
        expect_load(src, cases[i].mode, cases[i].head, a, &bq);
        expect_load(ck, DSQ_QUANTIZE_NONE, 0, b, &bc);
        int same = memcmp(a, b, sizeof(float) * N_ROWS * V) == 0;
        printf("quantize-at-load %s: %s the numpy-quantized checkpoint\n", cases[i].ckpt,
               same ? "bit-identical to" : "DIFFERS from");
        assert_true(same);
        /* weight_bytes: the dense linears (and head) replaced by their arrays */
        int64_t want = dense - layers_bytes(ST_BF16) + layers_bytes(cases[i].lin) -
                       lin_bytes(V, 128, ST_BF16) + lin_bytes(V, 128, cases[i].hd);
        assert_int_equal(bq, want);
        free(ck);
    }
    /* checkpoint: embedding and head stored F32 by quant_model.py, linears quantized */
    int64_t emb = (int64_t)V * 128 * 4, norms = (2 * 2 + 1) * 128 * 4, bias = 2 * (128 + 64 + 64) * 4;
    assert_int_equal(bc, emb + norms + bias + layers_bytes(ST_Q4) + lin_bytes(V, 128, ST_Q8));
    free(a);
    free(b);
    free(src);
}

/* quantize_head with quantize NONE: the head alone.  An AWQ / GPTQ
 * checkpoint keeps its 16-bit (here F32) lm_head; quantized at load to int8
 * it must give the logits of the dequantized fp32 model whose head is
 * quantized the same way (the same F32 head values, so the same int8
 * rows), and weight_bytes must drop by the dense head minus its Q8 arrays.
 * A head the checkpoint already stores quantized is kept bit for bit. */
static void test_head_only(void **state)
{
    (void)state;
    float *a = malloc(sizeof(float) * N_ROWS * V), *b = malloc(sizeof(float) * N_ROWS * V);
    static const char *fmts[] = { "awq", "gptq_sym" };
    const int64_t head_f32 = (int64_t)V * 128 * 4;
    for (size_t i = 0; i < sizeof fmts / sizeof fmts[0]; i++) {
        char *dq = qdir(fmts[i]), *dd = deq_of(fmts[i]);
        int64_t plain = 0, qh = 0;
        expect_load(dq, DSQ_QUANTIZE_NONE, 0, NULL, &plain);
        expect_load(dq, DSQ_QUANTIZE_NONE, 1, a, &qh);
        expect_load(dd, DSQ_QUANTIZE_NONE, 1, b, NULL);
        double e = dsq_rel_err(a, b, (size_t)N_ROWS * V);
        printf("%-8s + int8 head vs its dequantized model + int8 head: rel err %.3g, weight bytes "
               "%lld -> %lld\n", fmts[i], e, (long long)plain, (long long)qh);
        assert_true(e <= 1e-4);
        for (int r = 0; r < N_ROWS; r++)
            assert_int_equal(dsq_argmax(a + (size_t)r * V, V), dsq_argmax(b + (size_t)r * V, V));
        assert_int_equal(qh, plain - head_f32 + lin_bytes(V, 128, ST_Q8));
        /* and it differs from the F32-head logits: the head really changed */
        expect_load(dq, DSQ_QUANTIZE_NONE, 0, b, NULL);
        assert_true(memcmp(a, b, sizeof(float) * N_ROWS * V) != 0);
        free(dq);
        free(dd);
    }
    /* bf16 checkpoint: only the head; the layers stay bf16 */
    char *bf = qdir("bf16");
    int64_t dense = 0, qh = 0;
    expect_load(bf, DSQ_QUANTIZE_NONE, 0, NULL, &dense);
    expect_load(bf, DSQ_QUANTIZE_NONE, 1, NULL, &qh);
    assert_int_equal(qh, dense - lin_bytes(V, 128, ST_BF16) + lin_bytes(V, 128, ST_Q8));
    free(bf);
    /* q4h stores an int8 head already: kept as it is */
    char *q4h = qdir("q4h");
    int64_t b0 = 0, b1 = 0;
    expect_load(q4h, DSQ_QUANTIZE_NONE, 0, a, &b0);
    expect_load(q4h, DSQ_QUANTIZE_NONE, 1, b, &b1);
    assert_true(memcmp(a, b, sizeof(float) * N_ROWS * V) == 0);
    assert_int_equal(b0, b1);
    free(q4h);
    free(a);
    free(b);
}

/* dsq_model_save of a model loaded from `src` with the quantize params, then
 * the saved checkpoint loaded as it is: the same logits bit for bit, the
 * same weight_bytes, a dsqwen quantization_config. */
static void save_roundtrip(const char *src, int mode, int head, const char *want_bits)
{
    float *a = malloc(sizeof(float) * N_ROWS * MAXV), *b = malloc(sizeof(float) * N_ROWS * MAXV);
    char *out = stw_mkdtemp();
    assert_non_null(out);
    dsq_model_params mp = dsq_model_default_params();
    mp.backend = DSQ_BACKEND_CPU;
    mp.quantize = mode;
    mp.quantize_head = head;
    dsq_model *m = NULL;
    assert_int_equal(dsq_model_load(src, &mp, &m), DSQ_OK);
    assert_int_equal(dsq_model_save(m, out), DSQ_OK);
    /* not over the model's own files */
    assert_int_equal(dsq_model_save(m, src), DSQ_ERR_INVALID_ARG);
    assert_int_equal(dsq_model_save(NULL, out), DSQ_ERR_INVALID_ARG);
    assert_int_equal(dsq_model_save(m, NULL), DSQ_ERR_INVALID_ARG);
    dsq_model_free(m);
    int64_t b1 = 0, b2 = 0;
    expect_load(src, mode, head, a, &b1);
    expect_load(out, DSQ_QUANTIZE_NONE, 0, b, &b2);
    assert_true(memcmp(a, b, sizeof(float) * N_ROWS * g_vocab) == 0);
    assert_int_equal(b1, b2);
    char *cfgp = stw_path(out, "config.json");
    char *text = dsq_test_read(cfgp, NULL);
    assert_non_null(text);
    cJSON *root = cJSON_Parse(text);
    const cJSON *qc = cJSON_GetObjectItemCaseSensitive(root, "quantization_config");
    assert_string_equal(cJSON_GetObjectItemCaseSensitive(qc, "quant_method")->valuestring, "dsqwen");
    char bits[8];
    snprintf(bits, sizeof bits, "%d", cJSON_GetObjectItemCaseSensitive(qc, "bits")->valueint);
    assert_string_equal(bits, want_bits);
    printf("saved %s (quantize %d, head %d): reloads bit-identical, %lld weight bytes\n", src, mode,
           head, (long long)b2);
    cJSON_Delete(root);
    free(text);
    free(cfgp);
    stw_rmtree(out);
    free(out);
    free(a);
    free(b);
}

static void test_save_roundtrip(void **state)
{
    (void)state;
    char *bf = qdir("bf16"), *awq = qdir("awq"), *gs = qdir("gptq_sym");
    save_roundtrip(bf, DSQ_QUANTIZE_INT8, 0, "8");
    save_roundtrip(bf, DSQ_QUANTIZE_Q4, 1, "4");
    save_roundtrip(awq, DSQ_QUANTIZE_NONE, 0, "4"); /* AWQ -> the repacked dsqwen layout */
    save_roundtrip(gs, DSQ_QUANTIZE_NONE, 0, "4");
    save_roundtrip(awq, DSQ_QUANTIZE_NONE, 1, "4"); /* AWQ + an int8 head (head only) */
    /* tied embedding: the int8 head is written as a head of its own (and
     * K = 512, F = 344: partial 4-bit groups) */
    char *tied = dsq_test_path("tiny_tied");
    save_roundtrip(tied, DSQ_QUANTIZE_Q4, 1, "4");
    free(tied);
    free(bf);
    free(awq);
    free(gs);
}

/* A dsqwen checkpoint with only its head quantized (`dsqwen quantize --head`
 * of a bf16 one) has dense layers: quantizing them at load is allowed and
 * gives what quantizing the bf16 checkpoint with its head does, bit for
 * bit (the head kept as stored). */
static void test_quantize_head_only_ckpt(void **state)
{
    (void)state;
    float *a = malloc(sizeof(float) * N_ROWS * MAXV), *b = malloc(sizeof(float) * N_ROWS * MAXV);
    char *bf = qdir("bf16"), *out = stw_mkdtemp();
    assert_non_null(out);
    dsq_model_params mp = dsq_model_default_params();
    mp.backend = DSQ_BACKEND_CPU;
    mp.quantize_head = 1;
    dsq_model *m = NULL;
    assert_int_equal(dsq_model_load(bf, &mp, &m), DSQ_OK);
    assert_int_equal(dsq_model_save(m, out), DSQ_OK);
    dsq_model_free(m);
    static const int modes[] = { DSQ_QUANTIZE_INT8, DSQ_QUANTIZE_Q4 };
    for (int i = 0; i < 2; i++) {
        int64_t b1 = 0, b2 = 0;
        expect_load(bf, modes[i], 1, a, &b1);
        expect_load(out, modes[i], 0, b, &b2);
        assert_true(memcmp(a, b, sizeof(float) * N_ROWS * g_vocab) == 0);
        assert_int_equal(b1, b2);
        printf("head-only dsqwen checkpoint + quantize %d == bf16 + quantize %d + head: "
               "bit-identical, %lld weight bytes\n", modes[i], modes[i], (long long)b2);
    }
    stw_rmtree(out);
    free(out);
    free(bf);
    free(a);
    free(b);
}

/* ---- refusals ---------------------------------------------------------------- */

/* A temp copy of quant_tiny/<name> with config.json's quantization_config
 * replaced by `qcfg` (JSON text; NULL keeps it). */
static char *copy_ckpt(const char *name, const char *qcfg)
{
    char *tmp = stw_mkdtemp();
    assert_non_null(tmp);
    char *src = qdir(name);
    static const char *files[] = { "config.json", "model.safetensors" };
    for (int i = 0; i < 2; i++) {
        char *from = stw_path(src, files[i]), *to = stw_path(tmp, files[i]);
        size_t len = 0;
        char *d = dsq_test_read(from, &len);
        assert_non_null(d);
        if (i == 0 && qcfg) {
            cJSON *root = cJSON_ParseWithLength(d, len);
            assert_non_null(root);
            cJSON_DeleteItemFromObjectCaseSensitive(root, "quantization_config");
            cJSON_AddItemToObject(root, "quantization_config", cJSON_Parse(qcfg));
            free(d);
            d = cJSON_Print(root);
            len = strlen(d);
            cJSON_Delete(root);
        }
        assert_int_equal(stw_write_bytes(to, d, len), 0);
        free(d);
        free(from);
        free(to);
    }
    free(src);
    return tmp;
}

/* Overwrite element `idx` of tensor `tensor` in dir/model.safetensors with
 * the `n` bytes at `val`. */
static void poke(const char *dir, const char *tensor, size_t idx, const void *val, size_t n)
{
    char *p = stw_path(dir, "model.safetensors");
    size_t len = 0;
    unsigned char *d = dsq_test_read(p, &len);
    assert_non_null(d);
    uint64_t hl;
    memcpy(&hl, d, 8);
    cJSON *h = cJSON_ParseWithLength((const char *)d + 8, (size_t)hl);
    assert_non_null(h);
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(h, tensor);
    assert_non_null(e);
    size_t off = (size_t)cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(e, "data_offsets"), 0)->valuedouble;
    memcpy(d + 8 + hl + off + idx * n, val, n);
    assert_int_equal(stw_write_bytes(p, d, len), 0);
    cJSON_Delete(h);
    free(d);
    free(p);
}

static void expect_refused(const char *dir, int quantize, int skip_finite, dsq_status want,
                           const char *needle)
{
    dsq_status st = run(dir, quantize, 0, skip_finite, NULL, NULL);
    const char *msg = dsq_last_error_message();
    printf("  %s -> %s: %s\n", dir, dsq_status_string(st), msg);
    assert_int_equal(st, want);
    if (needle && !strstr(msg, needle))
        fail_msg("message '%s' does not name '%s'", msg, needle);
}

static void test_refusals(void **state)
{
    (void)state;
    char *q8 = qdir("q8"), *t;
    /* quantize on an already-quantized checkpoint */
    expect_refused(q8, DSQ_QUANTIZE_Q4, 0, DSQ_ERR_UNSUPPORTED, "already quantized");
    expect_refused(q8, DSQ_QUANTIZE_INT8, 0, DSQ_ERR_UNSUPPORTED, "already quantized");
    /* unknown quantize value: invalid argument, as before */
    expect_refused(q8, 7, 0, DSQ_ERR_INVALID_ARG, "quantize");
    free(q8);

    /* unsupported quantization_config values, naming the field */
    t = copy_ckpt("awq", "{\"quant_method\":\"awq\",\"bits\":3,\"group_size\":128}");
    expect_refused(t, 0, 0, DSQ_ERR_UNSUPPORTED, "bits");
    stw_rmtree(t), free(t);
    t = copy_ckpt("gptq", "{\"quant_method\":\"gptq\",\"bits\":4,\"group_size\":128,\"desc_act\":true}");
    expect_refused(t, 0, 0, DSQ_ERR_UNSUPPORTED, "desc_act");
    stw_rmtree(t), free(t);
    t = copy_ckpt("q4", "{\"quant_method\":\"bitsandbytes\"}");
    expect_refused(t, 0, 0, DSQ_ERR_UNSUPPORTED, "bitsandbytes");
    stw_rmtree(t), free(t);

    /* the config says GPTQ, the tensors are AWQ-packed: qweight [K][N/8] is no [K/8][N] */
    t = copy_ckpt("awq", "{\"quant_method\":\"gptq\",\"bits\":4,\"group_size\":128}");
    expect_refused(t, 0, 0, DSQ_ERR_SHAPE, "qweight");
    stw_rmtree(t), free(t);
    /* the config says dsqwen, the tensors are AWQ's int32 words */
    t = copy_ckpt("awq", "{\"quant_method\":\"dsqwen\",\"version\":1,\"bits\":4,\"group_size\":128}");
    expect_refused(t, 0, 0, DSQ_ERR_DTYPE, "qweight");
    stw_rmtree(t), free(t);
    /* a quantized checkpoint whose config lost its quantization_config:
     * the dense .weight tensors are missing */
    t = copy_ckpt("q4", "null");
    expect_refused(t, 0, 0, DSQ_ERR_MISSING_TENSOR, ".weight");
    stw_rmtree(t), free(t);

    /* NaN scales: f32 (Q8), f16 (dsqwen Q4, AWQ, GPTQ) -- refused even with
     * skip_finite_check (a NaN scale poisons whole rows) */
    const float fnan = NAN;
    const uint16_t hnan = 0x7e00, hinf = 0x7c00;
    t = copy_ckpt("q8", NULL);
    poke(t, "model.layers.1.mlp.down_proj.scales", 5, &fnan, 4);
    expect_refused(t, 0, 1, DSQ_ERR_FORMAT, "model.layers.1.mlp.down_proj.scales");
    stw_rmtree(t), free(t);
    t = copy_ckpt("q4", NULL);
    poke(t, "model.layers.0.self_attn.k_proj.scales", 1, &hinf, 2);
    expect_refused(t, 0, 1, DSQ_ERR_FORMAT, "model.layers.0.self_attn.k_proj.scales");
    stw_rmtree(t), free(t);
    t = copy_ckpt("awq", NULL);
    poke(t, "model.layers.0.mlp.up_proj.scales", 3, &hnan, 2);
    expect_refused(t, 0, 1, DSQ_ERR_FORMAT, "model.layers.0.mlp.up_proj");
    stw_rmtree(t), free(t);
    t = copy_ckpt("gptq", NULL);
    poke(t, "model.layers.1.self_attn.o_proj.scales", 0, &hnan, 2);
    expect_refused(t, 0, 1, DSQ_ERR_FORMAT, "model.layers.1.self_attn.o_proj");
    stw_rmtree(t), free(t);
    /* GPTQ act-order in the tensors (g_idx not k / 128) although desc_act is false */
    const int32_t gi = 1;
    t = copy_ckpt("gptq_v2", NULL);
    poke(t, "model.layers.1.mlp.down_proj.g_idx", 5, &gi, 4);
    expect_refused(t, 0, 0, DSQ_ERR_UNSUPPORTED, "model.layers.1.mlp.down_proj");
    stw_rmtree(t), free(t);
    /* zero points past 16 in a dsqwen Q4 checkpoint */
    const uint8_t z = 200;
    t = copy_ckpt("q4", NULL);
    poke(t, "model.layers.0.mlp.gate_proj.zeros", 2, &z, 1);
    expect_refused(t, 0, 0, DSQ_ERR_FORMAT, "zeros");
    stw_rmtree(t), free(t);
    /* quantize at load meets a NaN weight (finite check skipped): the
     * quantizer refuses it, naming the tensor */
    const uint16_t bnan = 0x7fc0;
    t = copy_ckpt("bf16", NULL);
    poke(t, "model.layers.1.mlp.gate_proj.weight", 300, &bnan, 2);
    expect_refused(t, DSQ_QUANTIZE_Q4, 1, DSQ_ERR_FORMAT, "model.layers.1.mlp.gate_proj.weight");
    expect_refused(t, DSQ_QUANTIZE_INT8, 1, DSQ_ERR_FORMAT, "model.layers.1.mlp.gate_proj.weight");
    stw_rmtree(t), free(t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_formats_vs_dequantized),
        cmocka_unit_test(test_quantize_at_load),
        cmocka_unit_test(test_head_only),
        cmocka_unit_test(test_save_roundtrip),
        cmocka_unit_test(test_quantize_head_only_ckpt),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
