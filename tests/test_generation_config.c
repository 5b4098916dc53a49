/* test_generation_config.c - sampler defaults from generation_config.json:
 * dsq_gen_config_parse() on the file DeepSeek-R1-Distill-Qwen-1.5B ships,
 * and dsq_model_load() + dsq_model_sampler_params() on the tiny test model
 * copied into a temporary directory with crafted generation_config.json
 * files (valid ones, and broken ones that must fail with DSQ_ERR_FORMAT
 * naming the file and the field). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "internal.h"
#include "st_writer.h"
#include "testutil.h"

static char *tmp; /* model directory of the current test */

/* Copy tests/data/<rel> to tmp/<name>. */
static int copy_fixture(const char *rel, const char *name)
{
    char *src = dsq_test_path(rel), *dst = stw_path(tmp, name);
    size_t len = 0;
    void *data = src ? dsq_test_read(src, &len) : NULL;
    int rc = data && dst ? stw_write_bytes(dst, data, len) : -1;
    free(data);
    free(src);
    free(dst);
    return rc;
}

static int setup(void **state)
{
    (void)state;
    tmp = stw_mkdtemp();
    if (!tmp || copy_fixture("tiny/config.json", "config.json") ||
        copy_fixture("tiny/model.safetensors", "model.safetensors"))
        return -1;
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    stw_rmtree(tmp);
    free(tmp);
    tmp = NULL;
    return 0;
}

static void write_gen_config(const char *text)
{
    char *p = stw_path(tmp, "generation_config.json");
    assert_non_null(p);
    assert_int_equal(stw_write_bytes(p, text, strlen(text)), 0);
    free(p);
}

static dsq_model *load_tmp(void)
{
    dsq_model_params mp = dsq_model_default_params();
    mp.backend = DSQ_BACKEND_CPU;
    mp.n_threads = 1;
    dsq_model *m = NULL;
    dsq_status st = dsq_model_load(tmp, &mp, &m);
    if (st != DSQ_OK)
        fprintf(stderr, "load: %s: %s\n", dsq_status_string(st), dsq_last_error_message());
    assert_int_equal(st, DSQ_OK);
    assert_non_null(m);
    return m;
}

static dsq_sampler_params model_params(const dsq_model *m)
{
    dsq_sampler_params p;
    memset(&p, 0xAB, sizeof p);
    p.struct_size = sizeof p;
    assert_int_equal(dsq_model_sampler_params(m, &p), DSQ_OK);
    assert_int_equal(p.struct_size, sizeof p);
    /* whatever the file says, the result must be accepted by the sampler */
    dsq_sampler *s = NULL;
    assert_int_equal(dsq_sampler_new(&p, &s), DSQ_OK);
    dsq_sampler_free(s);
    return p;
}

/* The generation_config.json of deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B,
 * as shipped: do_sample true, temperature 0.6, top_p 0.95, nothing else the
 * sampler uses. */
static void test_parse_shipped_file(void **state)
{
    (void)state;
    char *path = dsq_test_path("model/generation_config.json");
    size_t len = 0;
    char *json = dsq_test_read(path, &len);
    assert_non_null(json);
    dsq_gen_config g;
    assert_int_equal(dsq_gen_config_parse(json, len, path, &g), DSQ_OK);
    assert_int_equal(g.has, DSQ_GEN_TEMPERATURE | DSQ_GEN_TOP_P);
    assert_true(g.temperature == 0.6f);
    assert_true(g.top_p == 0.95f);
    free(json);
    free(path);
}

static void test_model_with_shipped_file(void **state)
{
    (void)state;
    assert_int_equal(copy_fixture("model/generation_config.json", "generation_config.json"), 0);
    dsq_model *m = load_tmp();
    dsq_sampler_params p = model_params(m), d = dsq_sampler_default_params();
    printf("shipped: temperature %g top_p %g top_k %d min_p %g penalty %g\n",
           (double)p.temperature, (double)p.top_p, (int)p.top_k, (double)p.min_p,
           (double)p.repetition_penalty);
    assert_true(p.temperature == 0.6f);
    assert_true(p.top_p == 0.95f);
    assert_int_equal(p.top_k, d.top_k);
    assert_true(p.min_p == d.min_p);
    assert_true(p.repetition_penalty == d.repetition_penalty);
    assert_int_equal(p.penalty_last_n, d.penalty_last_n);
    assert_true(p.seed == d.seed);
    assert_int_equal(p.n_vocab_valid, 0); /* no tokenizer */
    dsq_model_free(m);
}

static void test_model_without_file_gives_library_defaults(void **state)
{
    (void)state;
    dsq_model *m = load_tmp();
    dsq_sampler_params p = model_params(m), d = dsq_sampler_default_params();
    assert_memory_equal(&p, &d, sizeof p);
    dsq_model_free(m);
}

static void test_do_sample_false_is_greedy(void **state)
{
    (void)state;
    write_gen_config("{\"do_sample\": false, \"temperature\": 0.7, \"top_p\": 0.8}");
    dsq_model *m = load_tmp();
    dsq_sampler_params p = model_params(m);
    assert_true(p.temperature == 0.0f);
    assert_true(p.top_p == 0.8f);
    dsq_model_free(m);
}

static void test_all_fields(void **state)
{
    (void)state;
    write_gen_config("{\n  \"bos_token_id\": 1, \"eos_token_id\": [2, 3], \"do_sample\": true,\n"
                     "  \"temperature\": 0.7, \"top_k\": 20, \"top_p\": 0.8, \"min_p\": 0.05,\n"
                     "  \"repetition_penalty\": 1.05, \"max_new_tokens\": 100\n}\n");
    dsq_model *m = load_tmp();
    dsq_sampler_params p = model_params(m);
    assert_true(p.temperature == 0.7f);
    assert_int_equal(p.top_k, 20);
    assert_true(p.top_p == 0.8f);
    assert_true(p.min_p == 0.05f);
    assert_true(p.repetition_penalty == 1.05f);
    dsq_model_free(m);
}

static void test_null_fields_keep_defaults(void **state)
{
    (void)state;
    write_gen_config("{\"top_k\": null, \"temperature\": null, \"do_sample\": null, \"top_p\": 1}");
    dsq_model *m = load_tmp();
    dsq_sampler_params p = model_params(m), d = dsq_sampler_default_params();
    assert_true(p.temperature == d.temperature);
    assert_int_equal(p.top_k, d.top_k);
    assert_true(p.top_p == 1.0f);
    dsq_model_free(m);
}

/* Each file must make dsq_model_load fail with DSQ_ERR_FORMAT and a message
 * naming the file and (where there is one) the field. */
static void expect_format_error(const char *text, const char *field)
{
    write_gen_config(text);
    dsq_model_params mp = dsq_model_default_params();
    mp.backend = DSQ_BACKEND_CPU;
    dsq_model *m = (dsq_model *)(uintptr_t)1;
    dsq_status st = dsq_model_load(tmp, &mp, &m);
    const char *msg = dsq_last_error_message();
    printf("%-50s -> %s: %s\n", text, dsq_status_string(st), msg);
    assert_int_equal(st, DSQ_ERR_FORMAT);
    assert_null(m);
    assert_non_null(strstr(msg, "generation_config.json"));
    if (field)
        assert_non_null(strstr(msg, field));
}

static void test_malformed_json(void **state)
{
    (void)state;
    expect_format_error("{\"temperature\": 0.6,", NULL);
    expect_format_error("", NULL);
    expect_format_error("{\"temperature\": 0.6} x", NULL);
    expect_format_error("[0.6, 0.95]", NULL);
}

static void test_wrong_types_and_values(void **state)
{
    (void)state;
    expect_format_error("{\"temperature\": \"0.6\"}", "temperature");
    expect_format_error("{\"temperature\": -1}", "temperature");
    expect_format_error("{\"top_k\": 2.5}", "top_k");
    expect_format_error("{\"top_k\": -1}", "top_k");
    expect_format_error("{\"top_k\": [40]}", "top_k");
    expect_format_error("{\"top_p\": 0}", "top_p");
    expect_format_error("{\"top_p\": 1.5}", "top_p");
    expect_format_error("{\"min_p\": true}", "min_p");
    expect_format_error("{\"repetition_penalty\": 0}", "repetition_penalty");
    /* positive, but 0 once stored as float (found by fuzz_generation_config:
     * the file loaded and dsq_sampler_new refused its params) */
    expect_format_error("{\"repetition_penalty\": 1e-90}", "repetition_penalty");
    expect_format_error("{\"top_p\": 1e-50}", "top_p");
    expect_format_error("{\"do_sample\": \"false\"}", "do_sample");
    expect_format_error("{\"do_sample\": 0}", "do_sample");
}

/* tokenizer.json of R1-Distill cut down to its first 300 vocab entries (no
 * merges, no added tokens): fewer ids than the tiny model's 1000 rows. */
static void write_small_tokenizer(int32_t keep)
{
    char *path = dsq_test_path("model/tokenizer.json");
    size_t len = 0;
    char *json = dsq_test_read(path, &len);
    assert_non_null(json);
    cJSON *root = cJSON_ParseWithLength(json, len);
    assert_non_null(root);
    cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab"), *next;
    for (cJSON *e = vocab->child; e; e = next) {
        next = e->next;
        if (e->valuedouble >= keep)
            cJSON_DeleteItemFromObjectCaseSensitive(vocab, e->string);
    }
    assert_int_equal(cJSON_GetArraySize(vocab), keep);
    cJSON_ReplaceItemInObjectCaseSensitive(model, "merges", cJSON_CreateArray());
    cJSON_ReplaceItemInObjectCaseSensitive(root, "added_tokens", cJSON_CreateArray());
    cJSON_ReplaceItemInObjectCaseSensitive(root, "post_processor", cJSON_CreateNull());
    char *out = cJSON_PrintUnformatted(root);
    char *dst = stw_path(tmp, "tokenizer.json");
    assert_int_equal(stw_write_bytes(dst, out, strlen(out)), 0);
    free(dst);
    free(out);
    cJSON_Delete(root);
    free(json);
    free(path);
}

static void test_n_vocab_valid_from_tokenizer(void **state)
{
    (void)state;
    write_small_tokenizer(300);
    write_gen_config("{\"temperature\": 0.5}");
    dsq_model *m = load_tmp();
    const dsq_tokenizer *tok = dsq_model_tokenizer(m);
    assert_non_null(tok);
    assert_int_equal(dsq_tokenizer_n_tokens(tok), 300);
    dsq_sampler_params p = model_params(m);
    assert_int_equal(p.n_vocab_valid, 300);
    assert_true(p.temperature == 0.5f);
    dsq_model_free(m);
}

/* A tokenizer with more ids than the model has rows: nothing to mask. */
static void test_n_vocab_valid_large_tokenizer(void **state)
{
    (void)state;
    assert_int_equal(copy_fixture("model/tokenizer.json", "tokenizer.json"), 0);
    dsq_model *m = load_tmp();
    assert_true(dsq_tokenizer_n_tokens(dsq_model_tokenizer(m)) > 1000);
    dsq_sampler_params p = model_params(m);
    assert_int_equal(p.n_vocab_valid, 0);
    dsq_model_free(m);
}

static void test_invalid_args(void **state)
{
    (void)state;
    dsq_model *m = load_tmp();
    dsq_sampler_params p = dsq_sampler_default_params();
    assert_int_equal(dsq_model_sampler_params(NULL, &p), DSQ_ERR_INVALID_ARG);
    assert_int_equal(dsq_model_sampler_params(m, NULL), DSQ_ERR_INVALID_ARG);
    p.struct_size = 4;
    assert_int_equal(dsq_model_sampler_params(m, &p), DSQ_ERR_STRUCT_SIZE);
    p.struct_size = sizeof p + 8;
    assert_int_equal(dsq_model_sampler_params(m, &p), DSQ_ERR_STRUCT_SIZE);

    /* only struct_size bytes are written */
    unsigned char buf[sizeof(dsq_sampler_params) + 16];
    memset(buf, 0x5A, sizeof buf);
    uint32_t size = sizeof(dsq_sampler_params);
    memcpy(buf, &size, sizeof size);
    assert_int_equal(dsq_model_sampler_params(m, (dsq_sampler_params *)(void *)buf), DSQ_OK);
    for (size_t i = sizeof(dsq_sampler_params); i < sizeof buf; i++)
        assert_int_equal(buf[i], 0x5A);
    dsq_model_free(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse_shipped_file),
        cmocka_unit_test_setup_teardown(test_model_with_shipped_file, setup, teardown),
        cmocka_unit_test_setup_teardown(test_model_without_file_gives_library_defaults, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_do_sample_false_is_greedy, setup, teardown),
        cmocka_unit_test_setup_teardown(test_all_fields, setup, teardown),
        cmocka_unit_test_setup_teardown(test_null_fields_keep_defaults, setup, teardown),
        cmocka_unit_test_setup_teardown(test_malformed_json, setup, teardown),
        cmocka_unit_test_setup_teardown(test_wrong_types_and_values, setup, teardown),
        cmocka_unit_test_setup_teardown(test_n_vocab_valid_from_tokenizer, setup, teardown),
        cmocka_unit_test_setup_teardown(test_n_vocab_valid_large_tokenizer, setup, teardown),
        cmocka_unit_test_setup_teardown(test_invalid_args, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
