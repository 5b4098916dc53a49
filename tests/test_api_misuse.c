/* test_api_misuse.c - every public entry point fed NULLs, bad sizes, bad
 * ids and impossible requests must fail with the documented status, leave
 * a message (per thread and, for calls on a context, per context), change
 * nothing, and never crash.  Runs on the CPU backend explicitly with the
 * tiny golden model, so "nothing changed" is checked against reference
 * logits after each refused call. */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "testutil.h"

static dsq_model *g_model;
static int32_t *g_prompt;   /* golden prompt of the tiny model */
static int g_n_prompt;
static float *g_pre;        /* golden logits of every prompt position [n][V] */
static int g_vocab;

/* A failing call: its status, and a message for this thread. */
#define EXPECT_FAIL(call, code)                                                  \
    do {                                                                         \
        dsq_status st_ = (call);                                                 \
        if (st_ != (code))                                                       \
            printf("%s:%d: %s returned %s\n", __FILE__, __LINE__, #call,         \
                   dsq_status_string(st_));                                      \
        assert_int_equal(st_, (code));                                           \
        assert_true(dsq_last_error_message()[0] != '\0');                        \
    } while (0)

/* A failing call on a context: also the context's message, which must be
 * the same as the thread's. */
#define EXPECT_CTX_FAIL(ctx, call, code)                                         \
    do {                                                                         \
        EXPECT_FAIL(call, code);                                                 \
        assert_true(dsq_ctx_last_error(ctx)[0] != '\0');                         \
        assert_string_equal(dsq_ctx_last_error(ctx), dsq_last_error_message());  \
    } while (0)

static int setup(void **state)
{
    (void)state;
    char *dir = dsq_test_path("tiny");
    char *gpath = dsq_test_path("tiny/golden.json");
    char *lpath = dsq_test_path("tiny/prefill_logits.f32");
    char *txt = dsq_test_read(gpath, NULL);
    cJSON *j = txt ? cJSON_Parse(txt) : NULL;
    if (j) {
        const cJSON *p = cJSON_GetObjectItem(j, "prompt"), *v = cJSON_GetObjectItem(j, "vocab");
        if (cJSON_IsArray(p) && cJSON_IsNumber(v)) {
            g_vocab = v->valueint;
            g_n_prompt = cJSON_GetArraySize(p);
            g_prompt = malloc((size_t)g_n_prompt * sizeof(int32_t));
            int i = 0;
            const cJSON *e;
            cJSON_ArrayForEach(e, p) g_prompt[i++] = e->valueint;
        }
        cJSON_Delete(j);
    }
    size_t len = 0;
    g_pre = dsq_test_read(lpath, &len);
    if (g_pre && len != (size_t)g_n_prompt * g_vocab * 4) {
        free(g_pre);
        g_pre = NULL;
    }
    dsq_model_params mp = dsq_model_default_params();
    mp.backend = DSQ_BACKEND_CPU;
    dsq_status st = dsq_model_load(dir, &mp, &g_model);
    if (st != DSQ_OK)
        printf("cannot load %s: %s\n", dir, dsq_last_error_message());
    if (!g_prompt || !g_pre)
        printf("golden data of %s missing or malformed\n", dir);
    free(txt);
    free(dir);
    free(gpath);
    free(lpath);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    dsq_model_free(g_model);
    free(g_prompt);
    free(g_pre);
    return 0;
}

static void need_model(void)
{
    if (!g_model || !g_prompt || !g_pre || g_n_prompt < 40)
        fail_msg("tiny model or its golden data unavailable (see above)");
}

static dsq_ctx *new_ctx(int layout, int max_seqs, int max_context, int max_batch, int64_t pool_tokens)
{
    dsq_ctx_params cp = dsq_ctx_default_params();
    cp.max_seqs = max_seqs;
    cp.max_context = max_context;
    cp.max_batch_tokens = max_batch;
    cp.kv_layout = layout;
    cp.kv_dtype = DSQ_KV_F32;
    cp.kv_block_size = 16;
    cp.kv_pool_tokens = pool_tokens;
    cp.n_threads = 2;
    dsq_ctx *c = NULL;
    dsq_status st = dsq_ctx_new(g_model, &cp, &c);
    if (st != DSQ_OK)
        fail_msg("dsq_ctx_new: %s", dsq_last_error_message());
    return c;
}

/* Feed prompt[from..to) to `seq` one decode step at a time and check each
 * step's logits against the golden prefill row (same position, same
 * history); returns the largest error. */
static double decode_prompt_and_check(dsq_ctx *c, int32_t seq, int from, int to)
{
    float *lg = malloc((size_t)g_vocab * 4);
    double worst = 0;
    for (int i = from; i < to; i++) {
        assert_int_equal(dsq_decode_step(c, 1, &seq, &g_prompt[i], lg), DSQ_OK);
        double e = dsq_rel_err(lg, g_pre + (size_t)i * g_vocab, (size_t)g_vocab);
        worst = e > worst ? e : worst;
        assert_int_equal(dsq_argmax(lg, g_vocab), dsq_argmax(g_pre + (size_t)i * g_vocab, g_vocab));
    }
    free(lg);
    assert_true(worst <= 1e-4);
    return worst;
}

static int32_t seq_len(dsq_ctx *c, int32_t seq)
{
    int32_t n = -1;
    assert_int_equal(dsq_seq_length(c, seq, &n), DSQ_OK);
    return n;
}

/* ---- status strings --------------------------------------------------------- */

static void test_status_strings(void **state)
{
    (void)state;
    const char *names[] = {"DSQ_OK", "DSQ_ERR_INVALID_ARG", "DSQ_ERR_STRUCT_SIZE", "DSQ_ERR_OUT_OF_MEMORY",
                           "DSQ_ERR_IO", "DSQ_ERR_FORMAT", "DSQ_ERR_CONFIG", "DSQ_ERR_UNSUPPORTED",
                           "DSQ_ERR_MISSING_TENSOR", "DSQ_ERR_SHAPE", "DSQ_ERR_DTYPE", "DSQ_ERR_TOKEN",
                           "DSQ_ERR_SEQ", "DSQ_ERR_CONTEXT_FULL", "DSQ_ERR_KV_FULL", "DSQ_ERR_BATCH",
                           "DSQ_ERR_BUFFER_TOO_SMALL", "DSQ_ERR_NO_DEVICE", "DSQ_ERR_DEVICE_OOM",
                           "DSQ_ERR_DEVICE", "DSQ_ERR_INTERNAL", "DSQ_ERR_CANCELLED"};
    for (int code = 0; code >= DSQ_ERR_CANCELLED; code--) {
        const char *s = dsq_status_string((dsq_status)code);
        assert_non_null(s);
        const char *name = names[-code];
        /* the enum's own name, and not a prefix of a longer one */
        assert_true(strncmp(s, name, strlen(name)) == 0);
        assert_true(s[strlen(name)] == ':' || s[strlen(name)] == '\0');
        assert_string_not_equal(s, "unknown status");
    }
    assert_string_equal(dsq_status_string((dsq_status)1), "unknown status");
    assert_string_equal(dsq_status_string((dsq_status)-22), "unknown status");
    assert_string_equal(dsq_status_string((dsq_status)-1000), "unknown status");
    assert_non_null(dsq_version_string());
    assert_int_equal(dsq_version_number(), DSQ_VERSION_NUMBER);
}

/* ---- NULLs and no-op frees ---------------------------------------------------- */

static int g_log_calls;
static void log_fn(dsq_log_level level, const char *msg, void *user)
{
    (void)level;
    (void)user;
    if (msg && msg[0])
        g_log_calls++;
}

static void test_null_model_and_ctx(void **state)
{
    (void)state;
    need_model();
    dsq_model *m = (dsq_model *)0x1;
    dsq_model_params mp = dsq_model_default_params();
    mp.backend = DSQ_BACKEND_CPU;
    EXPECT_FAIL(dsq_model_load(NULL, &mp, &m), DSQ_ERR_INVALID_ARG);
    assert_null(m);
    char *dir = dsq_test_path("tiny");
    EXPECT_FAIL(dsq_model_load(dir, &mp, NULL), DSQ_ERR_INVALID_ARG);
    EXPECT_FAIL(dsq_model_load("/nonexistent/model", &mp, &m), DSQ_ERR_IO);
    mp.backend = 7;
    EXPECT_FAIL(dsq_model_load(dir, &mp, &m), DSQ_ERR_INVALID_ARG);
#ifndef DSQ_HAVE_CUDA
    mp.backend = DSQ_BACKEND_CUDA;
    EXPECT_FAIL(dsq_model_load(dir, &mp, &m), DSQ_ERR_NO_DEVICE);
#endif
    free(dir);
    dsq_model_free(NULL);
    dsq_ctx_free(NULL);
    assert_string_equal(dsq_ctx_last_error(NULL), "");

    dsq_model_info mi = {.struct_size = sizeof mi};
    EXPECT_FAIL(dsq_model_get_info(NULL, &mi), DSQ_ERR_INVALID_ARG);
    EXPECT_FAIL(dsq_model_get_info(g_model, NULL), DSQ_ERR_INVALID_ARG);
    assert_int_equal(dsq_model_get_info(g_model, &mi), DSQ_OK);
    assert_int_equal(mi.backend, DSQ_BACKEND_CPU);
    assert_int_equal(mi.n_vocab, g_vocab);
    assert_null(dsq_model_tokenizer(NULL));

    dsq_ctx *c = (dsq_ctx *)0x1;
    dsq_ctx_params cp = dsq_ctx_default_params();
    EXPECT_FAIL(dsq_ctx_new(NULL, &cp, &c), DSQ_ERR_INVALID_ARG);
    assert_null(c);
    EXPECT_FAIL(dsq_ctx_new(g_model, &cp, NULL), DSQ_ERR_INVALID_ARG);
    /* bad values */
    const struct { int field; int value; } bad[] = {
        {0, 0}, {0, -2}, {1, -1}, {1, 5000}, /* max_context 0 = default */ {2, 0}, {3, 9}, {4, 9}, {5, -1}, {6, 0},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cp = dsq_ctx_default_params();
        cp.max_context = 64;
        switch (bad[i].field) {
        case 0: cp.max_seqs = bad[i].value; break;
        case 1: cp.max_context = bad[i].value; break;
        case 2: cp.max_batch_tokens = bad[i].value; break;
        case 3: cp.kv_layout = bad[i].value; break;
        case 4: cp.kv_dtype = bad[i].value; break;
        case 5: cp.n_threads = bad[i].value; break;
        case 6: cp.kv_layout = DSQ_KV_PAGED; cp.kv_block_size = bad[i].value; break;
        }
        c = (dsq_ctx *)0x1;
        EXPECT_FAIL(dsq_ctx_new(g_model, &cp, &c), DSQ_ERR_INVALID_ARG);
        assert_null(c);
    }
    /* NULL params means defaults */
    c = NULL;
    assert_int_equal(dsq_ctx_new(g_model, NULL, &c), DSQ_OK);
    dsq_ctx_info ci = {.struct_size = sizeof ci};
    EXPECT_FAIL(dsq_ctx_get_info(NULL, &ci), DSQ_ERR_INVALID_ARG);
    EXPECT_CTX_FAIL(c, dsq_ctx_get_info(c, NULL), DSQ_ERR_INVALID_ARG);
    assert_int_equal(dsq_ctx_get_info(c, &ci), DSQ_OK);
    assert_int_equal(ci.backend, DSQ_BACKEND_CPU);
    assert_true(ci.n_threads >= 1);
    assert_true(ci.kv_bytes > 0 && ci.scratch_bytes > 0);
    /* F16 default: 2 layers * K,V * 2 heads * 128 * 2 bytes */
    assert_int_equal(ci.kv_dtype, DSQ_KV_F16);
    assert_int_equal(ci.kv_bytes_per_token, 2 * 2 * 2 * 128 * 2);

    int32_t tok = 1, seq = 0, n = 0;
    float lg[1];
    EXPECT_FAIL(dsq_prefill(NULL, 0, &tok, 1, 0, NULL), DSQ_ERR_INVALID_ARG);
    EXPECT_CTX_FAIL(c, dsq_prefill(c, 0, NULL, 1, 0, NULL), DSQ_ERR_INVALID_ARG);
    EXPECT_CTX_FAIL(c, dsq_prefill(c, 0, &tok, 0, 0, NULL), DSQ_ERR_INVALID_ARG);
    EXPECT_CTX_FAIL(c, dsq_prefill(c, 0, &tok, -3, 0, NULL), DSQ_ERR_INVALID_ARG);
    EXPECT_CTX_FAIL(c, dsq_prefill(c, 0, &tok, 1, 4u, NULL), DSQ_ERR_INVALID_ARG);
    EXPECT_FAIL(dsq_decode_step(NULL, 1, &seq, &tok, lg), DSQ_ERR_INVALID_ARG);
    EXPECT_CTX_FAIL(c, dsq_decode_step(c, 1, NULL, &tok, lg), DSQ_ERR_INVALID_ARG);
    EXPECT_CTX_FAIL(c, dsq_decode_step(c, 1, &seq, NULL, lg), DSQ_ERR_INVALID_ARG);
    EXPECT_CTX_FAIL(c, dsq_decode_step(c, 0, &seq, &tok, lg), DSQ_ERR_INVALID_ARG);
    EXPECT_FAIL(dsq_seq_remove(NULL, 0), DSQ_ERR_INVALID_ARG);
    EXPECT_FAIL(dsq_seq_length(NULL, 0, &n), DSQ_ERR_INVALID_ARG);
    EXPECT_CTX_FAIL(c, dsq_seq_length(c, 0, NULL), DSQ_ERR_INVALID_ARG);
    assert_int_equal(seq_len(c, 0), 0);
    dsq_ctx_free(c);

    /* the log callback sees failures; NULL removes it */
    g_log_calls = 0;
    dsq_set_log_callback(log_fn, NULL, DSQ_LOG_DEBUG);
    EXPECT_FAIL(dsq_ctx_new(NULL, NULL, &c), DSQ_ERR_INVALID_ARG);
    dsq_set_log_callback(NULL, NULL, DSQ_LOG_DEBUG);
    int seen = g_log_calls;
    EXPECT_FAIL(dsq_ctx_new(NULL, NULL, &c), DSQ_ERR_INVALID_ARG);
    assert_true(seen >= 1);
    assert_int_equal(g_log_calls, seen);
}

static void test_null_tokenizer_sampler_chat(void **state)
{
    (void)state;
    dsq_tokenizer *t = (dsq_tokenizer *)0x1;
    EXPECT_FAIL(dsq_tokenizer_load(NULL, &t), DSQ_ERR_INVALID_ARG);
    char *tp = dsq_test_path("model/tokenizer.json");
    EXPECT_FAIL(dsq_tokenizer_load(tp, NULL), DSQ_ERR_INVALID_ARG);
    EXPECT_FAIL(dsq_tokenizer_load("/nonexistent/tokenizer.json", &t), DSQ_ERR_IO);
    dsq_tokenizer_free(NULL);
    t = NULL;
    dsq_status st = dsq_tokenizer_load(tp, &t);
    free(tp);
    if (st != DSQ_OK)
        fail_msg("cannot load the tokenizer: %s", dsq_last_error_message());
    int32_t ids[8];
    size_t n = 0;
    char buf[64];
    EXPECT_FAIL(dsq_tokenize(NULL, "a", 1, 0, ids, 8, &n), DSQ_ERR_INVALID_ARG);
    EXPECT_FAIL(dsq_tokenize(t, NULL, 1, 0, ids, 8, &n), DSQ_ERR_INVALID_ARG);
    EXPECT_FAIL(dsq_tokenize(t, "a", 1, 0, NULL, 8, &n), DSQ_ERR_INVALID_ARG);
    EXPECT_FAIL(dsq_tokenize(t, "a", 1, 0, ids, 8, NULL), DSQ_ERR_INVALID_ARG);
    EXPECT_FAIL(dsq_detokenize(NULL, ids, 0, 0, buf, sizeof buf, &n), DSQ_ERR_INVALID_ARG);
    EXPECT_FAIL(dsq_detokenize(t, NULL, 2, 0, buf, sizeof buf, &n), DSQ_ERR_INVALID_ARG);
    EXPECT_FAIL(dsq_detokenize(t, ids, 0, 0, NULL, sizeof buf, &n), DSQ_ERR_INVALID_ARG);
    EXPECT_FAIL(dsq_detokenize(t, ids, 0, 0, buf, sizeof buf, NULL), DSQ_ERR_INVALID_ARG);
    int32_t bad_ids[2] = {-1, dsq_tokenizer_n_tokens(t)};
    EXPECT_FAIL(dsq_detokenize(t, bad_ids, 1, 0, buf, sizeof buf, &n), DSQ_ERR_TOKEN);
    EXPECT_FAIL(dsq_detokenize(t, bad_ids + 1, 1, 0, buf, sizeof buf, &n), DSQ_ERR_TOKEN);
    assert_int_equal(dsq_tokenizer_n_tokens(NULL), 0);
    assert_int_equal(dsq_tokenizer_token_id(NULL, "a"), -1);
    assert_int_equal(dsq_tokenizer_token_id(t, NULL), -1);
    assert_null(dsq_token_text(NULL, 0));
    assert_null(dsq_token_text(t, -1));
    assert_null(dsq_token_text(t, dsq_tokenizer_n_tokens(t)));
    assert_int_equal(dsq_token_is_special(NULL, 0), 0);
    assert_int_equal(dsq_token_is_special(t, -1), 0);
    assert_int_equal(dsq_tokenizer_bos(NULL), -1);
    assert_int_equal(dsq_tokenizer_eos(NULL), -1);
    dsq_detok_stream *s = (dsq_detok_stream *)0x1;
    EXPECT_FAIL(dsq_detok_stream_new(NULL, 0, &s), DSQ_ERR_INVALID_ARG);
    EXPECT_FAIL(dsq_detok_stream_new(t, 0, NULL), DSQ_ERR_INVALID_ARG);
    dsq_detok_stream_free(NULL);
    assert_int_equal(dsq_detok_stream_new(t, 0, &s), DSQ_OK);
    EXPECT_FAIL(dsq_detok_stream_push(NULL, 1, buf, sizeof buf, &n), DSQ_ERR_INVALID_ARG);
    EXPECT_FAIL(dsq_detok_stream_push(s, 1, NULL, sizeof buf, &n), DSQ_ERR_INVALID_ARG);
    EXPECT_FAIL(dsq_detok_stream_push(s, 1, buf, sizeof buf, NULL), DSQ_ERR_INVALID_ARG);
    EXPECT_FAIL(dsq_detok_stream_push(s, -1, buf, sizeof buf, &n), DSQ_ERR_TOKEN);
    EXPECT_FAIL(dsq_detok_stream_flush(NULL, buf, sizeof buf, &n), DSQ_ERR_INVALID_ARG);
    EXPECT_FAIL(dsq_detok_stream_flush(s, buf, sizeof buf, NULL), DSQ_ERR_INVALID_ARG);
    dsq_detok_stream_free(s);
    dsq_tokenizer_free(t);

    dsq_sampler *sm = (dsq_sampler *)0x1;
    dsq_sampler_params sp = dsq_sampler_default_params();
    EXPECT_FAIL(dsq_sampler_new(&sp, NULL), DSQ_ERR_INVALID_ARG);
    union { dsq_sampler_params p; char pad[512]; } big;
    memset(&big, 0, sizeof big);
    big.p = sp;
    const uint32_t bad_sizes[] = {0, 4, (uint32_t)sizeof sp - 1, (uint32_t)sizeof sp + 1, (uint32_t)sizeof big};
    for (size_t i = 0; i < sizeof bad_sizes / sizeof bad_sizes[0]; i++) {
        big.p.struct_size = bad_sizes[i];
        sm = (dsq_sampler *)0x1;
        EXPECT_FAIL(dsq_sampler_new(&big.p, &sm), DSQ_ERR_STRUCT_SIZE);
        assert_null(sm);
    }
    assert_int_equal(dsq_sampler_new(&sp, &sm), DSQ_OK);
    float logits[4] = {0, 1, 2, 3};
    int32_t tok = 0;
    EXPECT_FAIL(dsq_sampler_sample(NULL, logits, 4, &tok), DSQ_ERR_INVALID_ARG);
    EXPECT_FAIL(dsq_sampler_sample(sm, NULL, 4, &tok), DSQ_ERR_INVALID_ARG);
    EXPECT_FAIL(dsq_sampler_sample(sm, logits, 4, NULL), DSQ_ERR_INVALID_ARG);
    EXPECT_FAIL(dsq_sampler_sample(sm, logits, 0, &tok), DSQ_ERR_INVALID_ARG);
    EXPECT_FAIL(dsq_sampler_accept(NULL, ids, 1), DSQ_ERR_INVALID_ARG);
    EXPECT_FAIL(dsq_sampler_accept(sm, NULL, 3), DSQ_ERR_INVALID_ARG);
    dsq_sampler_reset(NULL, 1);
    dsq_sampler_free(sm);
    dsq_sampler_free(NULL);

    dsq_chat_message msg = {DSQ_ROLE_USER, "hi"};
    EXPECT_FAIL(dsq_chat_format(NULL, 1, 1, buf, sizeof buf, &n), DSQ_ERR_INVALID_ARG);
    EXPECT_FAIL(dsq_chat_format(&msg, 1, 1, NULL, sizeof buf, &n), DSQ_ERR_INVALID_ARG);
    EXPECT_FAIL(dsq_chat_format(&msg, 1, 1, buf, sizeof buf, NULL), DSQ_ERR_INVALID_ARG);
    dsq_chat_message bad_msg = {DSQ_ROLE_USER, NULL};
    EXPECT_FAIL(dsq_chat_format(&bad_msg, 1, 1, buf, sizeof buf, &n), DSQ_ERR_INVALID_ARG);
    bad_msg.role = 9;
    bad_msg.content = "x";
    EXPECT_FAIL(dsq_chat_format(&bad_msg, 1, 1, buf, sizeof buf, &n), DSQ_ERR_INVALID_ARG);
}

/* ---- struct sizes ------------------------------------------------------------------ */

static void test_struct_sizes(void **state)
{
    (void)state;
    need_model();
    char *dir = dsq_test_path("tiny");
    union { dsq_model_params p; char pad[512]; } mp;
    union { dsq_ctx_params p; char pad[512]; } cp;
    union { dsq_model_info i; char pad[512]; } mi;
    union { dsq_ctx_info i; char pad[512]; } ci;
    dsq_ctx *c = NULL;
    assert_int_equal(dsq_ctx_new(g_model, NULL, &c), DSQ_OK);
    const uint32_t deltas_small[] = {0, 4};
    for (int k = 0; k < 5; k++) {
        /* 0, 4 (only struct_size), one byte short, one byte long, far too long */
        /* dsq_model_params has grown (progress fields): one byte short of
         * its first version */
        const uint32_t mp_v1 = offsetof(dsq_model_params, load_tokenizer) + sizeof(int32_t);
        uint32_t ms = k < 2 ? deltas_small[k] : k == 2 ? mp_v1 - 1
                                           : k == 3 ? sizeof(dsq_model_params) + 1 : 512;
        uint32_t cs = k < 2 ? deltas_small[k] : k == 2 ? sizeof(dsq_ctx_params) - 1
                                           : k == 3 ? sizeof(dsq_ctx_params) + 1 : 512;
        uint32_t mis = k < 2 ? deltas_small[k] : k == 2 ? sizeof(dsq_model_info) - 1
                                            : k == 3 ? sizeof(dsq_model_info) + 1 : 512;
        uint32_t cis = k < 2 ? deltas_small[k] : k == 2 ? sizeof(dsq_ctx_info) - 1
                                            : k == 3 ? sizeof(dsq_ctx_info) + 1 : 512;
        memset(&mp, 0, sizeof mp);
        mp.p = dsq_model_default_params();
        mp.p.backend = DSQ_BACKEND_CPU;
        mp.p.struct_size = ms;
        dsq_model *m = (dsq_model *)0x1;
        EXPECT_FAIL(dsq_model_load(dir, &mp.p, &m), DSQ_ERR_STRUCT_SIZE);
        assert_null(m);
        memset(&cp, 0, sizeof cp);
        cp.p = dsq_ctx_default_params();
        cp.p.struct_size = cs;
        dsq_ctx *c2 = (dsq_ctx *)0x1;
        EXPECT_FAIL(dsq_ctx_new(g_model, &cp.p, &c2), DSQ_ERR_STRUCT_SIZE);
        assert_null(c2);
        memset(&mi, 0x5a, sizeof mi);
        mi.i.struct_size = mis;
        EXPECT_FAIL(dsq_model_get_info(g_model, &mi.i), DSQ_ERR_STRUCT_SIZE);
        assert_int_equal((unsigned char)mi.pad[sizeof(uint32_t)], 0x5a); /* nothing written */
        memset(&ci, 0x5a, sizeof ci);
        ci.i.struct_size = cis;
        EXPECT_CTX_FAIL(c, dsq_ctx_get_info(c, &ci.i), DSQ_ERR_STRUCT_SIZE);
        assert_int_equal((unsigned char)ci.pad[sizeof(uint32_t)], 0x5a);
    }
    /* the exact sizes work */
    memset(&mi, 0, sizeof mi);
    mi.i.struct_size = sizeof(dsq_model_info);
    assert_int_equal(dsq_model_get_info(g_model, &mi.i), DSQ_OK);
    memset(&ci, 0, sizeof ci);
    ci.i.struct_size = sizeof(dsq_ctx_info);
    assert_int_equal(dsq_ctx_get_info(c, &ci.i), DSQ_OK);
    dsq_ctx_free(c);
    free(dir);
}

/* ---- tokens, sequences, context limits ------------------------------------------------------ */

static void test_bad_tokens_and_seqs(void **state)
{
    (void)state;
    need_model();
    dsq_ctx *c = new_ctx(DSQ_KV_STATIC, 3, 128, 32, 0);
    float *lg = malloc((size_t)g_vocab * 4 * 4);
    int32_t toks[3] = {5, -1, 7};
    EXPECT_CTX_FAIL(c, dsq_prefill(c, 0, toks, 3, 0, lg), DSQ_ERR_TOKEN);
    toks[1] = g_vocab;
    EXPECT_CTX_FAIL(c, dsq_prefill(c, 0, toks, 3, 0, lg), DSQ_ERR_TOKEN);
    assert_int_equal(seq_len(c, 0), 0);
    EXPECT_CTX_FAIL(c, dsq_prefill(c, -1, g_prompt, 4, 0, lg), DSQ_ERR_SEQ);
    EXPECT_CTX_FAIL(c, dsq_prefill(c, 3, g_prompt, 4, 0, lg), DSQ_ERR_SEQ);
    int32_t n;
    EXPECT_CTX_FAIL(c, dsq_seq_length(c, 3, &n), DSQ_ERR_SEQ);
    EXPECT_CTX_FAIL(c, dsq_seq_remove(c, -1), DSQ_ERR_SEQ);
    EXPECT_CTX_FAIL(c, dsq_seq_remove(c, 3), DSQ_ERR_SEQ);

    /* decode on never-prefilled, out-of-range and removed sequences */
    int32_t seq = 1, tok = g_prompt[0];
    EXPECT_CTX_FAIL(c, dsq_decode_step(c, 1, &seq, &tok, lg), DSQ_ERR_SEQ);
    seq = 3;
    EXPECT_CTX_FAIL(c, dsq_decode_step(c, 1, &seq, &tok, lg), DSQ_ERR_SEQ);
    seq = -2;
    EXPECT_CTX_FAIL(c, dsq_decode_step(c, 1, &seq, &tok, lg), DSQ_ERR_SEQ);
    assert_int_equal(dsq_prefill(c, 1, g_prompt, 10, 0, lg), DSQ_OK);
    assert_int_equal(dsq_seq_remove(c, 1), DSQ_OK);
    assert_int_equal(dsq_seq_remove(c, 1), DSQ_OK); /* removing an empty one is allowed */
    seq = 1;
    EXPECT_CTX_FAIL(c, dsq_decode_step(c, 1, &seq, &tok, lg), DSQ_ERR_SEQ);

    /* seq 0 holds 20 prompt tokens; refused decodes must leave it intact */
    assert_int_equal(dsq_prefill(c, 0, g_prompt, 20, DSQ_LOGITS_LAST, lg), DSQ_OK);
    assert_true(dsq_rel_err(lg, g_pre + (size_t)19 * g_vocab, (size_t)g_vocab) <= 1e-4);
    int32_t seqs2[2] = {0, 0}, toks2[2] = {g_prompt[20], g_prompt[20]};
    EXPECT_CTX_FAIL(c, dsq_decode_step(c, 2, seqs2, toks2, lg), DSQ_ERR_INVALID_ARG); /* duplicate */
    int32_t seqs3[2] = {0, 2};
    EXPECT_CTX_FAIL(c, dsq_decode_step(c, 2, seqs3, toks2, lg), DSQ_ERR_SEQ); /* 2 is empty */
    int32_t badtok[2] = {g_prompt[20], -5};
    assert_int_equal(dsq_prefill(c, 2, g_prompt, 3, 0, NULL), DSQ_OK);
    EXPECT_CTX_FAIL(c, dsq_decode_step(c, 2, seqs3, badtok, lg), DSQ_ERR_TOKEN);
    assert_int_equal(seq_len(c, 0), 20);
    assert_int_equal(seq_len(c, 2), 3);
    double e = decode_prompt_and_check(c, 0, 20, 24);
    printf("  after refused calls, sequence 0 still matches golden: rel err %.3e\n", e);
    free(lg);
    dsq_ctx_free(c);

    /* more sequences than max_batch_tokens in one step */
    c = new_ctx(DSQ_KV_STATIC, 4, 64, 2, 0);
    int32_t s4[3] = {0, 1, 2}, t4[3] = {1, 2, 3};
    for (int i = 0; i < 3; i++)
        assert_int_equal(dsq_prefill(c, i, g_prompt, 2, 0, NULL), DSQ_OK);
    EXPECT_CTX_FAIL(c, dsq_decode_step(c, 3, s4, t4, NULL), DSQ_ERR_BATCH);
    dsq_ctx_free(c);
}

static void test_context_full(void **state)
{
    (void)state;
    need_model();
    for (int layout = 0; layout < 2; layout++) {
        const int MC = 24;
        dsq_ctx *c = new_ctx(layout, 2, MC, 8, 0);
        float *lg = malloc((size_t)g_vocab * 4);
        /* a prompt longer than the context */
        EXPECT_CTX_FAIL(c, dsq_prefill(c, 0, g_prompt, MC + 1, DSQ_LOGITS_LAST, lg), DSQ_ERR_CONTEXT_FULL);
        assert_int_equal(seq_len(c, 0), 0);
        /* a second prompt that would overflow leaves the first intact */
        assert_int_equal(dsq_prefill(c, 0, g_prompt, 15, DSQ_LOGITS_LAST, lg), DSQ_OK);
        EXPECT_CTX_FAIL(c, dsq_prefill(c, 0, g_prompt + 15, MC - 15 + 1, DSQ_LOGITS_LAST, lg),
                        DSQ_ERR_CONTEXT_FULL);
        assert_int_equal(seq_len(c, 0), 15);
        double e = decode_prompt_and_check(c, 0, 15, MC); /* fills it exactly */
        assert_int_equal(seq_len(c, 0), MC);
        int32_t seq = 0, tok = 1;
        EXPECT_CTX_FAIL(c, dsq_decode_step(c, 1, &seq, &tok, lg), DSQ_ERR_CONTEXT_FULL);
        EXPECT_CTX_FAIL(c, dsq_prefill(c, 0, &tok, 1, 0, NULL), DSQ_ERR_CONTEXT_FULL);
        assert_int_equal(seq_len(c, 0), MC);
        printf("  %s: context full refused cleanly; decode up to the limit rel err %.3e\n",
               layout ? "paged" : "static", e);
        /* the id is reusable after removal */
        assert_int_equal(dsq_seq_remove(c, 0), DSQ_OK);
        assert_int_equal(dsq_prefill(c, 0, g_prompt, 10, 0, NULL), DSQ_OK);
        decode_prompt_and_check(c, 0, 10, 12);
        free(lg);
        dsq_ctx_free(c);
    }
}

/* Paged pool exhaustion: refused all-or-nothing, others keep decoding. */
static void test_kv_pool_exhaustion(void **state)
{
    (void)state;
    need_model();
    /* 4 blocks of 16 tokens */
    dsq_ctx *c = new_ctx(DSQ_KV_PAGED, 3, 128, 64, 64);
    dsq_ctx_info ci = {.struct_size = sizeof ci};
    assert_int_equal(dsq_ctx_get_info(c, &ci), DSQ_OK);
    assert_int_equal(ci.kv_capacity_tokens, 64);
    float *lg = malloc((size_t)g_vocab * 4 * 2);
    assert_int_equal(dsq_prefill(c, 0, g_prompt, 40, DSQ_LOGITS_LAST, lg), DSQ_OK); /* 3 blocks */
    /* 30 tokens need 2 blocks; 1 is free */
    EXPECT_CTX_FAIL(c, dsq_prefill(c, 1, g_prompt, 30, DSQ_LOGITS_LAST, lg), DSQ_ERR_KV_FULL);
    assert_int_equal(seq_len(c, 1), 0);
    assert_int_equal(dsq_ctx_get_info(c, &ci), DSQ_OK);
    assert_int_equal(ci.kv_free_tokens, 16);
    double e1 = decode_prompt_and_check(c, 0, 40, 44);
    /* sequence 1 takes the last block */
    assert_int_equal(dsq_prefill(c, 1, g_prompt, 10, 0, NULL), DSQ_OK);
    double e2 = decode_prompt_and_check(c, 0, 44, 48); /* seq 0 now fills 3 blocks exactly */
    /* seq 0 needs a 4th block: the whole step is refused, seq 1 included */
    int32_t seqs[2] = {1, 0}, toks[2] = {g_prompt[10], g_prompt[48]};
    EXPECT_CTX_FAIL(c, dsq_decode_step(c, 2, seqs, toks, lg), DSQ_ERR_KV_FULL);
    assert_int_equal(seq_len(c, 0), 48);
    assert_int_equal(seq_len(c, 1), 10);
    /* seq 1 alone still fits in its block */
    double e3 = decode_prompt_and_check(c, 1, 10, 13);
    /* freeing seq 1 lets seq 0 go on, still matching the reference */
    assert_int_equal(dsq_seq_remove(c, 1), DSQ_OK);
    double e4 = decode_prompt_and_check(c, 0, 48, 55);
    printf("  paged pool exhaustion: refusals clean; decode errors %.3e %.3e %.3e %.3e\n", e1, e2, e3, e4);
    free(lg);
    dsq_ctx_free(c);
}

/* The default paged pool lets every sequence reach max_context even when
 * max_context is not a multiple of the block size. */
static void test_default_pool_size(void **state)
{
    (void)state;
    need_model();
    dsq_ctx *c = new_ctx(DSQ_KV_PAGED, 3, 20, 64, 0); /* 20 tokens = 2 blocks of 16 */
    dsq_ctx_info ci = {.struct_size = sizeof ci};
    assert_int_equal(dsq_ctx_get_info(c, &ci), DSQ_OK);
    assert_int_equal(ci.kv_capacity_tokens, 3 * 32);
    for (int32_t s = 0; s < 3; s++)
        assert_int_equal(dsq_prefill(c, s, g_prompt, 20, 0, NULL), DSQ_OK);
    EXPECT_CTX_FAIL(c, dsq_decode_step(c, 1, &(int32_t){0}, g_prompt, NULL), DSQ_ERR_CONTEXT_FULL);
    dsq_ctx_free(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_default_pool_size),
        cmocka_unit_test(test_status_strings),
        cmocka_unit_test(test_null_model_and_ctx),
        cmocka_unit_test(test_null_tokenizer_sampler_chat),
        cmocka_unit_test(test_struct_sizes),
        cmocka_unit_test(test_bad_tokens_and_seqs),
        cmocka_unit_test(test_context_full),
        cmocka_unit_test(test_kv_pool_exhaustion),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
