/*
 * test_config.c - config.json parsing: the real DeepSeek-R1-Distill-Qwen-1.5B
 * config gives its published values; each bad or unsupported field is
 * refused with the right status and the field named in the message.
 */
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "arch.h"
#include "internal.h"

static char *real_text; /* tests/data/model/config.json */
static size_t real_len;

static int group_setup(void **state)
{
    (void)state;
    char *p = dsq_test_path("model/config.json");
    real_text = dsq_test_read(p, &real_len);
    if (!real_text)
        fprintf(stderr, "cannot read %s\n", p);
    free(p);
    return real_text ? 0 : -1;
}

static int group_teardown(void **state)
{
    (void)state;
    free(real_text);
    return 0;
}

/* The values published in config.json (copied verbatim from the model). */
static void check_real_values(const dsq_config *c)
{
    assert_int_equal(c->n_vocab, 151936);
    assert_int_equal(c->n_embd, 1536);
    assert_int_equal(c->n_layers, 28);
    assert_int_equal(c->n_heads, 12);
    assert_int_equal(c->n_kv_heads, 2);
    assert_int_equal(c->head_dim, 128);
    assert_int_equal(c->n_ff, 8960);
    assert_int_equal(c->max_pos, 131072);
    assert_true(c->rope_theta == 10000.0f);
    assert_true(c->rms_eps == (float)1e-6);
    assert_int_equal(c->tie_embeddings, 0);
    assert_int_equal(c->bos_token, 151643);
    assert_int_equal(c->eos_token, 151643);
}

/* The larger checkpoints of the family (tests/data/configs): every size
 * parses as Qwen2 with the published shapes, and the KV bytes per token
 * follow from them (layers x K and V x KV heads x head_dim x bytes, + one
 * fp32 scale per (token, head) for INT8). */
static void test_family_configs(void **state)
{
    (void)state;
    static const struct {
        const char *file;
        int32_t E, L, H, KV, F, V;
        float theta, eps;
    } fam[] = {
        { "configs/r1-distill-qwen-7b.json", 3584, 28, 28, 4, 18944, 152064, 10000.0f, 1e-6f },
        { "configs/r1-distill-qwen-14b.json", 5120, 48, 40, 8, 13824, 152064, 1e6f, 1e-5f },
        { "configs/r1-distill-qwen-32b.json", 5120, 64, 40, 8, 27648, 152064, 1e6f, 1e-5f },
    };
    for (size_t i = 0; i < sizeof fam / sizeof fam[0]; i++) {
        char *p = dsq_test_path(fam[i].file);
        dsq_config c;
        dsq_status st = dsq_config_load(p, &c);
        printf("  %s -> %s %s\n", fam[i].file, dsq_status_string(st), st ? dsq_last_error_message() : "");
        free(p);
        assert_int_equal(st, DSQ_OK);
        assert_ptr_equal(c.arch, &dsq_arch_qwen2);
        assert_int_equal(c.n_embd, fam[i].E);
        assert_int_equal(c.n_layers, fam[i].L);
        assert_int_equal(c.n_heads, fam[i].H);
        assert_int_equal(c.n_kv_heads, fam[i].KV);
        assert_int_equal(c.n_ff, fam[i].F);
        assert_int_equal(c.n_vocab, fam[i].V);
        assert_int_equal(c.head_dim, 128);
        assert_int_equal(c.tie_embeddings, 0);
        assert_true(c.rope_theta == fam[i].theta);
        assert_true(c.rms_eps == fam[i].eps);
        const int64_t per_layer_heads = (int64_t)fam[i].L * 2 * fam[i].KV;
        assert_int_equal(dsq_kv_bytes_per_token(&c, DSQ_KV_F16), per_layer_heads * 128 * 2);
        assert_int_equal(dsq_kv_bytes_per_token(&c, DSQ_KV_INT8), per_layer_heads * (128 + 4));
        assert_int_equal(dsq_kv_bytes_per_token(&c, DSQ_KV_F32), per_layer_heads * 128 * 4);
    }
}

static void test_real_config_parse(void **state)
{
    (void)state;
    dsq_config c;
    memset(&c, 0xab, sizeof c);
    assert_int_equal(dsq_config_parse(real_text, real_len, &c), DSQ_OK);
    check_real_values(&c);
}

static void test_real_config_load(void **state)
{
    (void)state;
    char *p = dsq_test_path("model/config.json");
    dsq_config c;
    memset(&c, 0xab, sizeof c);
    assert_int_equal(dsq_config_load(p, &c), DSQ_OK);
    check_real_values(&c);
    free(p);
}

/* The real config with `field` set to the JSON `value` (NULL: removed),
 * parsed; returns the status and leaves the result in *c. */
static dsq_status parse_with(const char *field, const char *value, dsq_config *c)
{
    cJSON *root = cJSON_ParseWithLength(real_text, real_len);
    assert_non_null(root);
    cJSON_DeleteItemFromObjectCaseSensitive(root, field);
    if (value) {
        cJSON *v = cJSON_Parse(value);
        assert_non_null(v);
        cJSON_AddItemToObject(root, field, v);
    }
    char *text = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    assert_non_null(text);
    memset(c, 0, sizeof *c);
    dsq_status st = dsq_config_parse(text, strlen(text), c);
    free(text);
    return st;
}

typedef struct bad_field {
    const char *field;
    const char *value; /* JSON text; NULL = field removed */
    dsq_status want;
} bad_field;

static const bad_field bad_fields[] = {
    { "vocab_size", NULL, DSQ_ERR_CONFIG },
    { "vocab_size", "0", DSQ_ERR_CONFIG },
    { "hidden_size", NULL, DSQ_ERR_CONFIG },
    { "hidden_size", "-1536", DSQ_ERR_CONFIG },
    { "hidden_size", "1537", DSQ_ERR_CONFIG }, /* not a multiple of the heads, no head_dim */
    { "num_hidden_layers", NULL, DSQ_ERR_CONFIG },
    { "num_hidden_layers", "\"28\"", DSQ_ERR_CONFIG },
    { "num_attention_heads", NULL, DSQ_ERR_CONFIG },
    { "num_attention_heads", "12.5", DSQ_ERR_CONFIG },
    { "num_key_value_heads", NULL, DSQ_ERR_CONFIG },
    { "num_key_value_heads", "5", DSQ_ERR_CONFIG }, /* 12 % 5 != 0 */
    { "num_key_value_heads", "0", DSQ_ERR_CONFIG },
    { "intermediate_size", NULL, DSQ_ERR_CONFIG },
    { "intermediate_size", "true", DSQ_ERR_CONFIG },
    { "max_position_embeddings", NULL, DSQ_ERR_CONFIG },
    { "max_position_embeddings", "16777216", DSQ_ERR_CONFIG }, /* 1 << 24 */
    { "rms_norm_eps", NULL, DSQ_ERR_CONFIG },
    { "rms_norm_eps", "-1e-6", DSQ_ERR_CONFIG },
    { "rms_norm_eps", "\"1e-6\"", DSQ_ERR_CONFIG },
    { "rms_norm_eps", "1e-300", DSQ_ERR_CONFIG }, /* 0 as a float */
    { "rope_theta", "0", DSQ_ERR_CONFIG },
    { "rope_theta", "[10000]", DSQ_ERR_CONFIG },
    { "tie_word_embeddings", "\"false\"", DSQ_ERR_CONFIG },
    { "tie_word_embeddings", "0", DSQ_ERR_CONFIG },
    { "head_dim", "127", DSQ_ERR_CONFIG }, /* odd: RoPE pairs dims */
    { "head_dim", "0", DSQ_ERR_CONFIG },
    { "head_dim", "\"128\"", DSQ_ERR_CONFIG },
    { "bos_token_id", "\"x\"", DSQ_ERR_CONFIG },
    { "eos_token_id", "151936", DSQ_ERR_CONFIG }, /* == vocab_size */
    { "eos_token_id", "[-3]", DSQ_ERR_CONFIG },
    { "hidden_act", "\"gelu\"", DSQ_ERR_UNSUPPORTED },
    { "hidden_act", "7", DSQ_ERR_CONFIG },
    { "use_sliding_window", "true", DSQ_ERR_UNSUPPORTED },
    { "use_sliding_window", "\"no\"", DSQ_ERR_CONFIG },
    { "use_mrope", "true", DSQ_ERR_UNSUPPORTED },
    { "rope_scaling", "{\"type\":\"yarn\",\"factor\":4.0}", DSQ_ERR_UNSUPPORTED },
    { "model_type", "5", DSQ_ERR_CONFIG },
    { "architectures", "\"Qwen2ForCausalLM\"", DSQ_ERR_CONFIG },
};

static void test_bad_fields(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof bad_fields / sizeof bad_fields[0]; i++) {
        const bad_field *b = &bad_fields[i];
        dsq_config c;
        dsq_status st = parse_with(b->field, b->value, &c);
        const char *msg = dsq_last_error_message();
        printf("    %s = %s -> %s | %s\n", b->field, b->value ? b->value : "(removed)",
               dsq_status_string(st), msg);
        assert_int_equal(st, b->want);
        assert_non_null(strstr(msg, b->field));
    }
}

/* Another architecture: both identifying fields say so. */
static void test_other_architecture(void **state)
{
    (void)state;
    const char *text = "{\"model_type\":\"llama\",\"architectures\":[\"LlamaForCausalLM\"],"
                       "\"vocab_size\":10,\"hidden_size\":8,\"num_hidden_layers\":1,"
                       "\"num_attention_heads\":2,\"num_key_value_heads\":1,"
                       "\"intermediate_size\":16,\"max_position_embeddings\":32,"
                       "\"rms_norm_eps\":1e-6}";
    dsq_config c;
    assert_int_equal(dsq_config_parse(text, strlen(text), &c), DSQ_ERR_UNSUPPORTED);
    assert_non_null(strstr(dsq_last_error_message(), "model_type"));
    /* neither field present */
    cJSON *root = cJSON_Parse(text);
    cJSON_DeleteItemFromObject(root, "model_type");
    cJSON_DeleteItemFromObject(root, "architectures");
    char *t2 = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    assert_int_equal(dsq_config_parse(t2, strlen(t2), &c), DSQ_ERR_UNSUPPORTED);
    assert_non_null(strstr(dsq_last_error_message(), "model_type"));
    free(t2);
}

/* Either identifying field alone is enough. */
static void test_arch_either_field(void **state)
{
    (void)state;
    dsq_config c;
    assert_int_equal(parse_with("model_type", NULL, &c), DSQ_OK);
    check_real_values(&c);
    assert_int_equal(parse_with("architectures", NULL, &c), DSQ_OK);
    check_real_values(&c);
    assert_int_equal(parse_with("architectures", "[\"Foo\",\"Qwen2ForCausalLM\"]", &c), DSQ_OK);
}

static void test_defaults_and_options(void **state)
{
    (void)state;
    dsq_config c;
    assert_int_equal(parse_with("rope_theta", NULL, &c), DSQ_OK);
    assert_true(c.rope_theta == 10000.0f);
    assert_int_equal(parse_with("rope_theta", "1000000.0", &c), DSQ_OK);
    assert_true(c.rope_theta == 1000000.0f);
    assert_int_equal(parse_with("tie_word_embeddings", NULL, &c), DSQ_OK);
    assert_int_equal(c.tie_embeddings, 0);
    assert_int_equal(parse_with("tie_word_embeddings", "true", &c), DSQ_OK);
    assert_int_equal(c.tie_embeddings, 1);
    assert_int_equal(parse_with("head_dim", "64", &c), DSQ_OK); /* explicit, != E/H */
    assert_int_equal(c.head_dim, 64);
    assert_int_equal(parse_with("head_dim", "null", &c), DSQ_OK);
    assert_int_equal(c.head_dim, 128);
    assert_int_equal(parse_with("bos_token_id", NULL, &c), DSQ_OK);
    assert_int_equal(c.bos_token, -1);
    assert_int_equal(parse_with("eos_token_id", "[151645, 151643]", &c), DSQ_OK);
    assert_int_equal(c.eos_token, 151645);
    assert_int_equal(parse_with("eos_token_id", "null", &c), DSQ_OK);
    assert_int_equal(c.eos_token, -1);
    assert_int_equal(parse_with("hidden_act", NULL, &c), DSQ_OK);
    assert_int_equal(parse_with("use_sliding_window", "false", &c), DSQ_OK);
    assert_int_equal(parse_with("rope_scaling", "null", &c), DSQ_OK);
    /* fields the model does not use are ignored */
    assert_int_equal(parse_with("sliding_window", "null", &c), DSQ_OK);
    assert_int_equal(parse_with("torch_dtype", "\"float32\"", &c), DSQ_OK);
}

static void test_not_json(void **state)
{
    (void)state;
    dsq_config c;
    const char *cases[] = { "", "{", "[1,2]", "\"qwen2\"", "{\"model_type\":\"qwen2\"} x" };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        dsq_status st = dsq_config_parse(cases[i], strlen(cases[i]), &c);
        printf("    '%s' -> %s | %s\n", cases[i], dsq_status_string(st), dsq_last_error_message());
        assert_int_equal(st, DSQ_ERR_FORMAT);
    }
    assert_int_equal(dsq_config_parse(NULL, 0, &c), DSQ_ERR_INVALID_ARG);
}

static void test_load_errors_name_the_file(void **state)
{
    (void)state;
    dsq_config c;
    assert_int_equal(dsq_config_load("/nonexistent/dir/config.json", &c), DSQ_ERR_IO);
    assert_non_null(strstr(dsq_last_error_message(), "/nonexistent/dir/config.json"));

    char tmpl[] = "/tmp/dsq_cfg_XXXXXX";
    int fd = mkstemp(tmpl);
    assert_true(fd >= 0);
    const char *bad = "{\"model_type\":\"qwen2\",\"vocab_size\":0}";
    assert_int_equal(write(fd, bad, strlen(bad)), (ssize_t)strlen(bad));
    close(fd);
    assert_int_equal(dsq_config_load(tmpl, &c), DSQ_ERR_CONFIG);
    printf("    %s\n", dsq_last_error_message());
    assert_non_null(strstr(dsq_last_error_message(), tmpl));
    assert_non_null(strstr(dsq_last_error_message(), "vocab_size"));
    unlink(tmpl);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_real_config_parse),
        cmocka_unit_test(test_family_configs),
        cmocka_unit_test(test_real_config_load),
        cmocka_unit_test(test_bad_fields),
        cmocka_unit_test(test_other_architecture),
        cmocka_unit_test(test_arch_either_field),
        cmocka_unit_test(test_defaults_and_options),
        cmocka_unit_test(test_not_json),
        cmocka_unit_test(test_load_errors_name_the_file),
    };
    return cmocka_run_group_tests_name("config", tests, group_setup, group_teardown);
}
