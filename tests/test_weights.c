/*
 * test_weights.c - binding a tiny Qwen2 checkpoint to dsq_weights: valid
 * untied / tied models, and refusal of a missing tensor, a wrong shape and an
 * unusable dtype, both through dsq_weights_bind and through dsq_model_load.
 */
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "arch.h"
#include "internal.h"
#include "st_writer.h"

/* Tiny shapes, all distinct so a swapped dimension cannot pass:
 * E=8, H=2 heads of D=6 (H*D=12 != E), K=1 KV head, F=10, V=14, 2 layers. */
enum { E = 8, H = 2, D = 6, K = 1, F = 10, V = 14, L = 2 };

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

/* How to spoil the checkpoint. */
typedef struct model_opts {
    int tie;               /* config tie_word_embeddings */
    int with_lm_head;      /* write lm_head.weight */
    const char *drop;      /* tensor left out */
    const char *transpose; /* 2-D tensor written with its dims swapped */
    const char *as_i32;    /* tensor written as I32 */
    int extra;             /* also write an unused tensor */
} model_opts;

static void write_config(const char *dir, int tie)
{
    char cfg[1024];
    snprintf(cfg, sizeof cfg,
             "{\"architectures\":[\"Qwen2ForCausalLM\"],\"model_type\":\"qwen2\","
             "\"vocab_size\":%d,\"hidden_size\":%d,\"num_hidden_layers\":%d,"
             "\"num_attention_heads\":%d,\"num_key_value_heads\":%d,\"head_dim\":%d,"
             "\"intermediate_size\":%d,\"max_position_embeddings\":64,"
             "\"rms_norm_eps\":1e-6,\"rope_theta\":10000.0,\"tie_word_embeddings\":%s,"
             "\"hidden_act\":\"silu\",\"use_sliding_window\":false,"
             "\"bos_token_id\":1,\"eos_token_id\":2}",
             V, E, L, H, K, D, F, tie ? "true" : "false");
    char *p = stw_path(dir, "config.json");
    assert_int_equal(stw_write_bytes(p, cfg, strlen(cfg)), 0);
    free(p);
}

typedef struct tensor_list {
    stw_tensor t[64];
    char names[64][80];
    int n;
} tensor_list;

static void add(tensor_list *tl, const model_opts *o, const char *name, const char *dtype,
                int64_t d0, int64_t d1)
{
    if (o->drop && strcmp(o->drop, name) == 0)
        return;
    stw_tensor *t = &tl->t[tl->n];
    snprintf(tl->names[tl->n], sizeof tl->names[0], "%s", name);
    t->name = tl->names[tl->n];
    t->dtype = (o->as_i32 && strcmp(o->as_i32, name) == 0) ? "I32" : dtype;
    t->ndim = d1 ? 2 : 1;
    int swap = o->transpose && strcmp(o->transpose, name) == 0;
    t->shape[0] = swap ? d1 : d0;
    t->shape[1] = swap ? d0 : d1;
    tl->n++;
}

/* Write config.json + model.safetensors into `dir`; returns the list written. */
static void write_model(const char *dir, const model_opts *o, tensor_list *tl)
{
    write_config(dir, o->tie);
    tl->n = 0;
    char n[80];
    add(tl, o, "model.embed_tokens.weight", "BF16", V, E);
    for (int l = 0; l < L; l++) {
#define LAYER(suffix, dt, a, b)                                   \
    snprintf(n, sizeof n, "model.layers.%d.%s", l, suffix);       \
    add(tl, o, n, dt, a, b)
        LAYER("input_layernorm.weight", "F32", E, 0);
        LAYER("self_attn.q_proj.weight", "BF16", H * D, E);
        LAYER("self_attn.q_proj.bias", "BF16", H * D, 0);
        LAYER("self_attn.k_proj.weight", "BF16", K * D, E);
        LAYER("self_attn.k_proj.bias", "BF16", K * D, 0);
        LAYER("self_attn.v_proj.weight", "F16", K * D, E);
        LAYER("self_attn.v_proj.bias", "F16", K * D, 0);
        LAYER("self_attn.o_proj.weight", "BF16", E, H * D);
        LAYER("post_attention_layernorm.weight", "F32", E, 0);
        LAYER("mlp.gate_proj.weight", "BF16", F, E);
        LAYER("mlp.up_proj.weight", "BF16", F, E);
        LAYER("mlp.down_proj.weight", "BF16", E, F);
#undef LAYER
    }
    add(tl, o, "model.norm.weight", "F32", E, 0);
    if (o->with_lm_head)
        add(tl, o, "lm_head.weight", "BF16", V, E);
    if (o->extra)
        add(tl, o, "model.rotary_emb.inv_freq", "F32", D / 2, 0);
    char *p = stw_path(dir, "model.safetensors");
    size_t dlen;
    /* random bytes: bf16/f16/f32 values of any kind, never all zeros */
    uint8_t *data = stw_write_tensors(p, tl->t, tl->n, NULL, 8, &dlen, NULL);
    assert_non_null(data);
    free(data);
    free(p);
}

/* Open tmp and bind; returns the bind status (set and weights released). */
static dsq_status bind_dir(const char *dir, dsq_weights *keep, dsq_st_set **keep_set)
{
    char *cp = stw_path(dir, "config.json");
    dsq_config cfg;
    assert_int_equal(dsq_config_load(cp, &cfg), DSQ_OK);
    free(cp);
    dsq_st_set *set = NULL;
    assert_int_equal(dsq_st_open_dir(dir, &set), DSQ_OK);
    dsq_weights w;
    memset(&w, 0x5a, sizeof w);
    dsq_status st = dsq_weights_bind(set, &cfg, 0, &w);
    printf("    bind -> %s | %s\n", dsq_status_string(st), st ? dsq_last_error_message() : "");
    if (st != DSQ_OK) {
        assert_null(w.layers); /* nothing left to free */
        dsq_weights_release(&w);
        dsq_st_close(set);
        return st;
    }
    if (keep) {
        *keep = w;
        *keep_set = set;
    } else {
        dsq_weights_release(&w);
        dsq_st_close(set);
    }
    return st;
}

static void expect_view(const dsq_st_set *set, const char *name, const dsq_tensor *t)
{
    const dsq_st_entry *e = dsq_st_find(set, name);
    assert_non_null(e);
    assert_ptr_equal(t->data, e->t.data);
    assert_int_equal(t->dtype, e->t.dtype);
    assert_int_equal(t->ndim, e->t.ndim);
    assert_int_equal(t->shape[0], e->t.shape[0]);
    assert_int_equal(t->nbytes, e->t.nbytes);
}

/* n_params / n_bytes of the tensors the writer wrote, minus `skip`. */
static void totals(const tensor_list *tl, const char *skip, int64_t *params, int64_t *bytes)
{
    *params = *bytes = 0;
    for (int i = 0; i < tl->n; i++) {
        if (skip && strcmp(tl->t[i].name, skip) == 0)
            continue;
        int64_t n = 1;
        for (int d = 0; d < tl->t[i].ndim; d++)
            n *= tl->t[i].shape[d];
        *params += n;
        *bytes += (int64_t)stw_nbytes(&tl->t[i]);
    }
}

static void test_untied_binds(void **state)
{
    (void)state;
    model_opts o = { .tie = 0, .with_lm_head = 1, .extra = 1 };
    tensor_list tl;
    write_model(tmp, &o, &tl);
    dsq_weights w;
    dsq_st_set *set;
    assert_int_equal(bind_dir(tmp, &w, &set), DSQ_OK);
    expect_view(set, "model.embed_tokens.weight", &w.g[DSQ_GW_TOK_EMBD]);
    expect_view(set, "model.norm.weight", &w.g[DSQ_GW_OUT_NORM]);
    expect_view(set, "lm_head.weight", &w.g[DSQ_GW_LM_HEAD]);
    assert_ptr_not_equal(w.g[DSQ_GW_LM_HEAD].data, w.g[DSQ_GW_TOK_EMBD].data);
    char n[80];
    for (int l = 0; l < L; l++) {
        const dsq_layer_weights *lw = &w.layers[l];
#define CHECK(suffix, field)                                 \
    snprintf(n, sizeof n, "model.layers.%d.%s", l, suffix);  \
    expect_view(set, n, &lw->field)
        CHECK("input_layernorm.weight", t[DSQ_LW_ATTN_NORM]);
        CHECK("self_attn.q_proj.weight", t[DSQ_LW_Q]);
        CHECK("self_attn.q_proj.bias", t[DSQ_LW_Q_BIAS]);
        CHECK("self_attn.k_proj.weight", t[DSQ_LW_K]);
        CHECK("self_attn.k_proj.bias", t[DSQ_LW_K_BIAS]);
        CHECK("self_attn.v_proj.weight", t[DSQ_LW_V]);
        CHECK("self_attn.v_proj.bias", t[DSQ_LW_V_BIAS]);
        CHECK("self_attn.o_proj.weight", t[DSQ_LW_O]);
        CHECK("post_attention_layernorm.weight", t[DSQ_LW_FFN_NORM]);
        CHECK("mlp.gate_proj.weight", t[DSQ_LW_GATE]);
        CHECK("mlp.up_proj.weight", t[DSQ_LW_UP]);
        CHECK("mlp.down_proj.weight", t[DSQ_LW_DOWN]);
#undef CHECK
    }
    int64_t params, bytes;
    totals(&tl, "model.rotary_emb.inv_freq", &params, &bytes);
    printf("    n_params %lld (expected %lld), n_bytes %lld (expected %lld)\n",
           (long long)w.n_params, (long long)params, (long long)w.n_bytes, (long long)bytes);
    assert_int_equal(w.n_params, params);
    assert_int_equal(w.n_bytes, bytes);
    dsq_weights_release(&w);
    assert_null(w.layers);
    dsq_weights_release(&w); /* twice is harmless */
    dsq_st_close(set);
}

static void test_tied_without_lm_head(void **state)
{
    (void)state;
    model_opts o = { .tie = 1, .with_lm_head = 0 };
    tensor_list tl;
    write_model(tmp, &o, &tl);
    dsq_weights w;
    dsq_st_set *set;
    assert_int_equal(bind_dir(tmp, &w, &set), DSQ_OK);
    assert_ptr_equal(w.g[DSQ_GW_LM_HEAD].data, w.g[DSQ_GW_TOK_EMBD].data);
    assert_int_equal(w.g[DSQ_GW_LM_HEAD].shape[0], V);
    assert_int_equal(w.g[DSQ_GW_LM_HEAD].shape[1], E);
    int64_t params, bytes;
    totals(&tl, NULL, &params, &bytes); /* the embedding counted once */
    assert_int_equal(w.n_params, params);
    assert_int_equal(w.n_bytes, bytes);
    dsq_weights_release(&w);
    dsq_st_close(set);
}

static void test_tied_ignores_lm_head(void **state)
{
    (void)state;
    model_opts o = { .tie = 1, .with_lm_head = 1 };
    tensor_list tl;
    write_model(tmp, &o, &tl);
    dsq_weights w;
    dsq_st_set *set;
    assert_int_equal(bind_dir(tmp, &w, &set), DSQ_OK);
    assert_ptr_equal(w.g[DSQ_GW_LM_HEAD].data, w.g[DSQ_GW_TOK_EMBD].data);
    assert_ptr_not_equal(w.g[DSQ_GW_LM_HEAD].data, dsq_st_find(set, "lm_head.weight")->t.data);
    int64_t params, bytes;
    totals(&tl, "lm_head.weight", &params, &bytes);
    assert_int_equal(w.n_params, params);
    dsq_weights_release(&w);
    dsq_st_close(set);
}

/* ---- checkpoints of the family's real sizes ---------------------------------- */

/* A model.safetensors of the given Qwen2 shapes whose data is a hole: the
 * header names every tensor with contiguous offsets and the file is
 * extended with ftruncate, so a 65 GB checkpoint costs no disk. */
static void write_sparse(const char *path, int64_t E, int64_t Lyr, int64_t Hd, int64_t KVd, int64_t Fd,
                         int64_t Vd)
{
    size_t cap = 1 << 20, n = 0;
    char *hdr = malloc(cap);
    assert_non_null(hdr);
    uint64_t off = 0;
    const int64_t Dh = 128;
#define PUT(name, a, b)                                                                              \
    do {                                                                                             \
        uint64_t bytes = (uint64_t)(a) * (uint64_t)((b) ? (b) : 1) * 2;                              \
        if ((b))                                                                                     \
            n += (size_t)snprintf(hdr + n, cap - n, "%s\"%s\":{\"dtype\":\"BF16\",\"shape\":[%lld,%lld],"     \
                                  "\"data_offsets\":[%llu,%llu]}", n > 1 ? "," : "", name, (long long)(a),   \
                                  (long long)(b), (unsigned long long)off, (unsigned long long)(off + bytes)); \
        else                                                                                         \
            n += (size_t)snprintf(hdr + n, cap - n, "%s\"%s\":{\"dtype\":\"BF16\",\"shape\":[%lld],"         \
                                  "\"data_offsets\":[%llu,%llu]}", n > 1 ? "," : "", name, (long long)(a),   \
                                  (unsigned long long)off, (unsigned long long)(off + bytes));         \
        off += bytes;                                                                                \
    } while (0)
    n += (size_t)snprintf(hdr, cap, "{");
    char nm[96];
    PUT("model.embed_tokens.weight", Vd, E);
    for (int64_t l = 0; l < Lyr; l++) {
        const struct { const char *s; int64_t a, b; } t[] = {
            { "input_layernorm.weight", E, 0 },          { "self_attn.q_proj.weight", Hd * Dh, E },
            { "self_attn.q_proj.bias", Hd * Dh, 0 },     { "self_attn.k_proj.weight", KVd * Dh, E },
            { "self_attn.k_proj.bias", KVd * Dh, 0 },    { "self_attn.v_proj.weight", KVd * Dh, E },
            { "self_attn.v_proj.bias", KVd * Dh, 0 },    { "self_attn.o_proj.weight", E, Hd * Dh },
            { "post_attention_layernorm.weight", E, 0 }, { "mlp.gate_proj.weight", Fd, E },
            { "mlp.up_proj.weight", Fd, E },             { "mlp.down_proj.weight", E, Fd },
        };
        for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
            snprintf(nm, sizeof nm, "model.layers.%lld.%s", (long long)l, t[i].s);
            PUT(nm, t[i].a, t[i].b);
        }
    }
    PUT("model.norm.weight", E, 0);
    PUT("lm_head.weight", Vd, E);
#undef PUT
    n += (size_t)snprintf(hdr + n, cap - n, "}");
    while (n % 8)
        hdr[n++] = ' ';
    assert_true(n < cap);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    uint8_t len[8];
    for (int i = 0; i < 8; i++)
        len[i] = (uint8_t)((uint64_t)n >> (8 * i));
    assert_int_equal(fwrite(len, 1, 8, f), 8);
    assert_int_equal(fwrite(hdr, 1, n, f), n);
    assert_int_equal(fflush(f), 0);
    assert_int_equal(ftruncate(fileno(f), (off_t)(8 + n + off)), 0);
    fclose(f);
    free(hdr);
}

/* 7B, 14B and 32B shapes (tests/data/configs) bind: every tensor found
 * with the shape the description derives from the config; the totals are
 * the checkpoints' parameter counts. */
static void test_family_shapes_bind(void **state)
{
    (void)state;
    static const struct {
        const char *cfg;
        int64_t E, L, H, KV, F, V;
    } fam[] = {
        { "configs/r1-distill-qwen-7b.json", 3584, 28, 28, 4, 18944, 152064 },
        { "configs/r1-distill-qwen-14b.json", 5120, 48, 40, 8, 13824, 152064 },
        { "configs/r1-distill-qwen-32b.json", 5120, 64, 40, 8, 27648, 152064 },
    };
    for (size_t i = 0; i < sizeof fam / sizeof fam[0]; i++) {
        char *cp = dsq_test_path(fam[i].cfg);
        dsq_config cfg;
        assert_int_equal(dsq_config_load(cp, &cfg), DSQ_OK);
        free(cp);
        char *f = stw_path(tmp, "model.safetensors");
        write_sparse(f, fam[i].E, fam[i].L, fam[i].H, fam[i].KV, fam[i].F, fam[i].V);
        dsq_st_set *set = NULL;
        assert_int_equal(dsq_st_open_file(f, &set), DSQ_OK);
        dsq_weights w;
        dsq_status st = dsq_weights_bind(set, &cfg, 0, &w);
        printf("    %s: bind -> %s %s, %lld params\n", fam[i].cfg, dsq_status_string(st),
               st ? dsq_last_error_message() : "", (long long)w.n_params);
        assert_int_equal(st, DSQ_OK);
        const int64_t E = fam[i].E, Q = fam[i].H * 128, KVD = fam[i].KV * 128, F = fam[i].F;
        const int64_t per_layer = 2 * E + Q * E + Q + 2 * (KVD * E + KVD) + E * Q + 3 * F * E;
        assert_int_equal(w.n_params, 2 * fam[i].V * E + E + fam[i].L * per_layer);
        assert_int_equal(w.layers[fam[i].L - 1].t[DSQ_LW_DOWN].shape[1], F);
        dsq_weights_release(&w);
        dsq_st_close(set);
        unlink(f);
        free(f);
    }
}

/* ---- refusals, through bind and through dsq_model_load ---------------------- */

static void expect_load(const char *path, dsq_status want, const char *needle)
{
    dsq_model_params mp = dsq_model_default_params();
    mp.backend = DSQ_BACKEND_CPU;
    mp.load_tokenizer = 0;
    dsq_model *m = (dsq_model *)(uintptr_t)1;
    dsq_status st = dsq_model_load(path, &mp, &m);
    printf("    load -> %s | %s\n", dsq_status_string(st), dsq_last_error_message());
    assert_int_equal(st, want);
    assert_null(m);
    if (needle)
        assert_non_null(strstr(dsq_last_error_message(), needle));
}

static void refused(const model_opts *o, dsq_status want, const char *needle)
{
    tensor_list tl;
    write_model(tmp, o, &tl);
    assert_int_equal(bind_dir(tmp, NULL, NULL), want);
    assert_non_null(strstr(dsq_last_error_message(), needle));
    expect_load(tmp, want, needle);
    char *f = stw_path(tmp, "model.safetensors");
    expect_load(f, want, needle);
    free(f);
}

static void test_missing_tensor(void **state)
{
    (void)state;
    model_opts o = { .with_lm_head = 1, .drop = "model.layers.1.self_attn.k_proj.weight" };
    refused(&o, DSQ_ERR_MISSING_TENSOR, "model.layers.1.self_attn.k_proj.weight");
}

/* Biases are optional in the description (arch_qwen2.c): an absent one
 * binds as a view without data (zeros) of the expected shape, and is not
 * counted as a parameter. */
static void test_absent_bias_binds(void **state)
{
    (void)state;
    model_opts o = { .with_lm_head = 1, .drop = "model.layers.1.self_attn.k_proj.bias" };
    tensor_list tl;
    write_model(tmp, &o, &tl);
    dsq_weights w;
    dsq_st_set *set = NULL;
    assert_int_equal(bind_dir(tmp, &w, &set), DSQ_OK);
    const dsq_tensor *bk = &w.layers[1].t[DSQ_LW_K_BIAS];
    assert_null(bk->data);
    assert_int_equal(bk->ndim, 1);
    assert_int_equal(bk->shape[0], K * D);
    assert_non_null(w.layers[0].t[DSQ_LW_K_BIAS].data);
    assert_non_null(w.layers[1].t[DSQ_LW_Q_BIAS].data);
    /* after a device upload the views forget their data (the mapping is
     * closed then); shapes stay */
    dsq_weights copy = w;
    dsq_layer_weights lcopy[L];
    memcpy(lcopy, w.layers, sizeof lcopy);
    copy.layers = lcopy;
    dsq_weights_forget_data(&copy, L);
    for (int i = 0; i < DSQ_GW_COUNT; i++)
        assert_null(copy.g[i].data);
    for (int l = 0; l < L; l++)
        for (int i = 0; i < DSQ_LW_COUNT; i++)
            assert_null(copy.layers[l].t[i].data);
    assert_int_equal(copy.layers[0].t[DSQ_LW_Q].shape[0], H * D);
    int64_t params, bytes;
    totals(&tl, NULL, &params, &bytes);
    assert_int_equal(w.n_params, params); /* the dropped bias was never written */
    dsq_weights_release(&w);
    dsq_st_close(set);
}

static void test_missing_lm_head_untied(void **state)
{
    (void)state;
    model_opts o = { .tie = 0, .with_lm_head = 0 };
    refused(&o, DSQ_ERR_MISSING_TENSOR, "lm_head.weight");
}

static void test_missing_norm(void **state)
{
    (void)state;
    model_opts o = { .with_lm_head = 1, .drop = "model.norm.weight" };
    refused(&o, DSQ_ERR_MISSING_TENSOR, "model.norm.weight");
}

static void test_wrong_shape(void **state)
{
    (void)state;
    model_opts o = { .with_lm_head = 1, .transpose = "model.layers.0.self_attn.q_proj.weight" };
    refused(&o, DSQ_ERR_SHAPE, "has shape [8, 12], expected [12, 8]");
}

static void test_wrong_shape_down(void **state)
{
    (void)state;
    model_opts o = { .with_lm_head = 1, .transpose = "model.layers.1.mlp.down_proj.weight" };
    refused(&o, DSQ_ERR_SHAPE, "model.layers.1.mlp.down_proj.weight");
}

static void test_i32_dtype(void **state)
{
    (void)state;
    model_opts o = { .with_lm_head = 1, .as_i32 = "model.layers.0.post_attention_layernorm.weight" };
    refused(&o, DSQ_ERR_DTYPE, "model.layers.0.post_attention_layernorm.weight");
}

/* The config decides what is needed: a checkpoint with fewer layers than the
 * config says is missing tensors; a wrong vocab size is a shape error. */
static void test_config_mismatch(void **state)
{
    (void)state;
    model_opts o = { .with_lm_head = 1 };
    tensor_list tl;
    write_model(tmp, &o, &tl);
    char *cp = stw_path(tmp, "config.json");
    dsq_config cfg;
    assert_int_equal(dsq_config_load(cp, &cfg), DSQ_OK);
    free(cp);
    dsq_st_set *set = NULL;
    assert_int_equal(dsq_st_open_dir(tmp, &set), DSQ_OK);
    dsq_weights w;
    dsq_config c = cfg;
    c.n_layers = L + 1;
    assert_int_equal(dsq_weights_bind(set, &c, 0, &w), DSQ_ERR_MISSING_TENSOR);
    assert_non_null(strstr(dsq_last_error_message(), "model.layers.2."));
    c = cfg;
    c.n_vocab = V + 1;
    assert_int_equal(dsq_weights_bind(set, &c, 0, &w), DSQ_ERR_SHAPE);
    assert_non_null(strstr(dsq_last_error_message(), "model.embed_tokens.weight"));
    c = cfg;
    c.n_kv_heads = 2;
    assert_int_equal(dsq_weights_bind(set, &c, 0, &w), DSQ_ERR_SHAPE);
    assert_non_null(strstr(dsq_last_error_message(), "k_proj"));
    assert_int_equal(dsq_weights_bind(NULL, &c, 0, &w), DSQ_ERR_INVALID_ARG);
    dsq_st_close(set);
}

/* Errors before the weights: config and files. */
static void test_load_config_and_io_errors(void **state)
{
    (void)state;
    model_opts o = { .with_lm_head = 1 };
    tensor_list tl;
    write_model(tmp, &o, &tl);
    char *cp = stw_path(tmp, "config.json");
    const char *bad = "{\"model_type\":\"qwen2\",\"vocab_size\":14}";
    assert_int_equal(stw_write_bytes(cp, bad, strlen(bad)), 0);
    expect_load(tmp, DSQ_ERR_CONFIG, "hidden_size");
    remove(cp);
    expect_load(tmp, DSQ_ERR_IO, "config.json");
    write_config(tmp, 0);
    char *sp = stw_path(tmp, "model.safetensors");
    remove(sp);
    expect_load(tmp, DSQ_ERR_IO, "model.safetensors");
    assert_int_equal(stw_write_bytes(sp, "1234567", 7), 0);
    expect_load(tmp, DSQ_ERR_FORMAT, "model.safetensors");
    free(cp);
    free(sp);
}

/* A valid checkpoint loads on the CPU backend with the sizes bound here. */
static void test_load_valid(void **state)
{
    (void)state;
    model_opts o = { .tie = 1, .with_lm_head = 0 };
    tensor_list tl;
    write_model(tmp, &o, &tl);
    dsq_model_params mp = dsq_model_default_params();
    mp.backend = DSQ_BACKEND_CPU;
    mp.load_tokenizer = 0;
    dsq_model *m = NULL;
    dsq_status st = dsq_model_load(tmp, &mp, &m);
    printf("    load -> %s | %s\n", dsq_status_string(st), dsq_last_error_message());
    assert_int_equal(st, DSQ_OK);
    dsq_model_info info;
    info.struct_size = sizeof info;
    assert_int_equal(dsq_model_get_info(m, &info), DSQ_OK);
    int64_t params, bytes;
    totals(&tl, NULL, &params, &bytes);
    assert_int_equal(info.n_params, params);
    assert_int_equal(info.weight_bytes, bytes);
    assert_int_equal(info.n_layers, L);
    assert_int_equal(info.head_dim, D);
    assert_int_equal(info.tie_embeddings, 1);
    dsq_model_free(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_untied_binds, setup, teardown),
        cmocka_unit_test_setup_teardown(test_tied_without_lm_head, setup, teardown),
        cmocka_unit_test_setup_teardown(test_tied_ignores_lm_head, setup, teardown),
        cmocka_unit_test_setup_teardown(test_missing_tensor, setup, teardown),
        cmocka_unit_test_setup_teardown(test_absent_bias_binds, setup, teardown),
        cmocka_unit_test_setup_teardown(test_family_shapes_bind, setup, teardown),
        cmocka_unit_test_setup_teardown(test_missing_lm_head_untied, setup, teardown),
        cmocka_unit_test_setup_teardown(test_missing_norm, setup, teardown),
        cmocka_unit_test_setup_teardown(test_wrong_shape, setup, teardown),
        cmocka_unit_test_setup_teardown(test_wrong_shape_down, setup, teardown),
        cmocka_unit_test_setup_teardown(test_i32_dtype, setup, teardown),
        cmocka_unit_test_setup_teardown(test_config_mismatch, setup, teardown),
        cmocka_unit_test_setup_teardown(test_load_config_and_io_errors, setup, teardown),
        cmocka_unit_test_setup_teardown(test_load_valid, setup, teardown),
    };
    return cmocka_run_group_tests_name("weights", tests, NULL, NULL);
}
