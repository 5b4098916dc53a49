/*
 * tiny_model.h - a tiny tied Qwen2 checkpoint (config.json +
 * model.safetensors, finite random values, mixed BF16/F16/F32 dtypes) for
 * loader tests, and a way to poison single values in it.  Header-only,
 * static; needs testutil.h (cmocka) and st_writer.h first.
 */
#ifndef DSQ_TINY_MODEL_H
#define DSQ_TINY_MODEL_H

#include <fcntl.h>
#include <unistd.h>

static void write_text(const char *dir, const char *name, const char *text)
{
    char *p = stw_path(dir, name);
    assert_int_equal(stw_write_bytes(p, text, strlen(text)), 0);
    free(p);
}

/* Tiny shapes: E=8, H=2 heads of D=6, K=1 KV head, F=10, 2 layers. */
enum { E = 8, H = 2, D = 6, K = 1, F = 10, L = 2 };

static const char *config_fmt =
    "{\"architectures\":[\"Qwen2ForCausalLM\"],\"model_type\":\"qwen2\","
    "\"vocab_size\":%d,\"hidden_size\":%d,\"num_hidden_layers\":%d,"
    "\"num_attention_heads\":%d,\"num_key_value_heads\":%d,\"head_dim\":%d,"
    "\"intermediate_size\":%d,\"max_position_embeddings\":64,"
    "\"rms_norm_eps\":1e-6,\"rope_theta\":10000.0,\"tie_word_embeddings\":true,"
    "\"hidden_act\":\"silu\",\"bos_token_id\":1,\"eos_token_id\":2}";

static void write_config(const char *dir, int vocab)
{
    char cfg[1024];
    snprintf(cfg, sizeof cfg, config_fmt, vocab, E, L, H, K, D, F);
    write_text(dir, "config.json", cfg);
}

/* The tensors of a tied tiny model, mixed dtypes, optionally followed by
 * extra (unused) ones. */
typedef struct model_list {
    stw_tensor t[64];
    char names[64][80];
    int n;
} model_list;

static void add(model_list *m, const char *name, const char *dt, int64_t d0, int64_t d1)
{
    stw_tensor *t = &m->t[m->n];
    snprintf(m->names[m->n], sizeof m->names[0], "%s", name);
    t->name = m->names[m->n];
    t->dtype = dt;
    t->ndim = d1 ? 2 : 1;
    t->shape[0] = d0;
    t->shape[1] = d1;
    m->n++;
}

static void model_tensors(model_list *m, int vocab)
{
    m->n = 0;
    char n[80];
    add(m, "model.embed_tokens.weight", "BF16", vocab, E);
    for (int l = 0; l < L; l++) {
#define LAYER(suffix, dt, a, b)                                \
    snprintf(n, sizeof n, "model.layers.%d.%s", l, suffix);    \
    add(m, n, dt, a, b)
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
    add(m, "model.norm.weight", "F32", E, 0);
}

/* config.json + model.safetensors (finite random values) in dir; the data
 * section offsets of each tensor in off[] when off is not NULL. */
static void write_model(const char *dir, int vocab, model_list *m, size_t *off)
{
    write_config(dir, vocab);
    model_tensors(m, vocab);
    char *p = stw_path(dir, "model.safetensors");
    size_t dlen;
    uint8_t *data = stw_write_tensors(p, m->t, m->n, NULL, 8, &dlen, off);
    assert_non_null(data);
    free(data);
    free(p);
}

/* Overwrite `len` bytes of tensor data at data-section offset `off`. */
static void patch_data(const char *file, size_t off, const void *bytes, size_t len)
{
    int fd = open(file, O_RDWR);
    assert_true(fd >= 0);
    uint8_t h[8];
    assert_int_equal(pread(fd, h, 8, 0), 8);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--)
        hlen = (hlen << 8) | h[i];
    assert_int_equal(pwrite(fd, bytes, len, (off_t)(8 + hlen + off)), (ssize_t)len);
    close(fd);
}

static int find_tensor(const model_list *m, const char *name)
{
    for (int i = 0; i < m->n; i++)
        if (strcmp(m->t[i].name, name) == 0)
            return i;
    fail_msg("no tensor %s", name);
    return -1;
}

static dsq_status load(const char *path, const dsq_model_params *p, dsq_model **out)
{
    dsq_status st = dsq_model_load(path, p, out);
    printf("    load -> %s | %s\n", dsq_status_string(st),
           st == DSQ_OK ? "" : dsq_last_error_message());
    return st;
}

static void expect_load(const char *path, const dsq_model_params *p, dsq_status want,
                        const char *needle)
{
    dsq_model *m = (dsq_model *)(uintptr_t)1;
    dsq_status st = load(path, p, &m);
    assert_int_equal(st, want);
    if (st != DSQ_OK) {
        assert_null(m);
        if (needle)
            assert_non_null(strstr(dsq_last_error_message(), needle));
    }
    dsq_model_free(m);
}

#endif
