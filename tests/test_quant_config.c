/*
 * test_quant_config.c - quantization_config parsing (lib/quant_config.c):
 * the configs AutoAWQ, AutoGPTQ/GPTQModel and this library write are read
 * to the right struct; every malformed or unsupported one is refused with
 * the right status and a message naming the field; *out is untouched on
 * failure.  The real R1-Distill config (no quantization_config) is NONE.
 */
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "quant_config.h"

/* A config.json holding `qc` as its quantization_config. */
static dsq_status parse_qc(const char *qc, dsq_quant_config *out)
{
    char buf[4096];
    int n = snprintf(buf, sizeof buf, "{\"model_type\": \"qwen2\", \"quantization_config\": %s}", qc);
    assert_true(n > 0 && n < (int)sizeof buf);
    return dsq_quant_config_parse(buf, (size_t)n, out);
}

static void test_real_config_is_unquantized(void **state)
{
    (void)state;
    char *p = dsq_test_path("model/config.json");
    size_t len = 0;
    char *text = dsq_test_read(p, &len);
    assert_non_null(text);
    dsq_quant_config c;
    memset(&c, 0xab, sizeof c);
    assert_int_equal(dsq_quant_config_parse(text, len, &c), DSQ_OK);
    assert_int_equal(c.method, DSQ_QM_NONE);
    assert_int_equal(c.bits, 0);
    free(text);
    free(p);
    memset(&c, 0xab, sizeof c);
    assert_int_equal(parse_qc("null", &c), DSQ_OK);
    assert_int_equal(c.method, DSQ_QM_NONE);
}

/* What AutoAWQ / transformers write for a 4-bit GEMM checkpoint. */
static void test_awq_accepted(void **state)
{
    (void)state;
    dsq_quant_config c;
    assert_int_equal(parse_qc("{\"bits\": 4, \"group_size\": 128, \"modules_to_not_convert\": null, "
                              "\"quant_method\": \"awq\", \"version\": \"gemm\", \"zero_point\": true}",
                              &c),
                     DSQ_OK);
    assert_int_equal(c.method, DSQ_QM_AWQ);
    assert_int_equal(c.bits, 4);
    assert_int_equal(c.group_size, 128);
    assert_int_equal(c.zero_point, 1);
    assert_int_equal(c.gptq_zero_offset, 0);
    assert_int_equal(c.has_skip_list, 0);
    /* AutoAWQ's own spellings, version in capitals, a skip list */
    assert_int_equal(parse_qc("{\"quant_method\": \"awq\", \"w_bit\": 4, \"q_group_size\": 128, "
                              "\"version\": \"GEMM\", \"modules_to_not_convert\": [\"visual\"]}",
                              &c),
                     DSQ_OK);
    assert_int_equal(c.bits, 4);
    assert_int_equal(c.group_size, 128);
    assert_int_equal(c.zero_point, 1);
    assert_int_equal(c.has_skip_list, 1);
    /* both spellings, agreeing */
    assert_int_equal(parse_qc("{\"quant_method\": \"awq\", \"bits\": 4, \"w_bit\": 4, \"group_size\": 128}", &c),
                     DSQ_OK);
}

static void test_gptq_accepted(void **state)
{
    (void)state;
    dsq_quant_config c;
    /* transformers GPTQConfig / AutoGPTQ, v1 by default */
    assert_int_equal(parse_qc("{\"bits\": 4, \"damp_percent\": 0.01, \"desc_act\": false, "
                              "\"group_size\": 128, \"quant_method\": \"gptq\", \"static_groups\": false, "
                              "\"sym\": true, \"true_sequential\": true, \"model_name_or_path\": null}",
                              &c),
                     DSQ_OK);
    assert_int_equal(c.method, DSQ_QM_GPTQ);
    assert_int_equal(c.bits, 4);
    assert_int_equal(c.group_size, 128);
    assert_int_equal(c.zero_point, 0);
    assert_int_equal(c.desc_act, 0);
    assert_int_equal(c.gptq_zero_offset, 1);
    assert_int_equal(c.lm_head, 0);
    /* explicit v1 */
    assert_int_equal(parse_qc("{\"quant_method\": \"gptq\", \"bits\": 4, \"group_size\": 128, "
                              "\"checkpoint_format\": \"gptq\", \"sym\": false}",
                              &c),
                     DSQ_OK);
    assert_int_equal(c.gptq_zero_offset, 1);
    assert_int_equal(c.zero_point, 1);
    /* GPTQModel: "format", v2, lm_head, empty dynamic */
    assert_int_equal(parse_qc("{\"quant_method\": \"gptq\", \"bits\": 4, \"group_size\": 128, "
                              "\"format\": \"gptq_v2\", \"lm_head\": true, \"dynamic\": {}}",
                              &c),
                     DSQ_OK);
    assert_int_equal(c.gptq_zero_offset, 0);
    assert_int_equal(c.lm_head, 1);
    assert_int_equal(parse_qc("{\"quant_method\": \"gptq\", \"bits\": 4, \"group_size\": 128, "
                              "\"format\": \"gptq_v2\", \"checkpoint_format\": \"gptq_v2\"}",
                              &c),
                     DSQ_OK);
    assert_int_equal(c.gptq_zero_offset, 0);
    /* newer GPTQModel: "method", "pack_dtype" */
    assert_int_equal(parse_qc("{\"method\": \"gptq\", \"quant_method\": \"gptq\", \"bits\": 4, "
                              "\"group_size\": 128, \"pack_dtype\": \"int32\"}",
                              &c),
                     DSQ_OK);
    assert_int_equal(c.method, DSQ_QM_GPTQ);
    assert_int_equal(parse_qc("{\"method\": \"gptq\", \"bits\": 4, \"group_size\": 128}", &c), DSQ_OK);
    assert_int_equal(c.method, DSQ_QM_GPTQ);
}

static void test_dsqwen_accepted(void **state)
{
    (void)state;
    dsq_quant_config c;
    assert_int_equal(parse_qc("{\"quant_method\": \"dsqwen\", \"version\": 1, \"bits\": 8, \"group_size\": -1}", &c),
                     DSQ_OK);
    assert_int_equal(c.method, DSQ_QM_DSQWEN);
    assert_int_equal(c.bits, 8);
    assert_int_equal(c.group_size, -1);
    assert_int_equal(c.zero_point, 0);
    assert_int_equal(c.version, 1);
    assert_int_equal(parse_qc("{\"quant_method\": \"dsqwen\", \"version\": 1, \"bits\": 4}", &c), DSQ_OK);
    assert_int_equal(c.bits, 4);
    assert_int_equal(c.group_size, 128);
    assert_int_equal(c.zero_point, 1);
    assert_string_equal(dsq_quant_method_name(DSQ_QM_DSQWEN), "dsqwen");
}

/* Refusals: the quantization_config text, the status, a word the message
 * must hold (the field's name). */
static const struct bad_case {
    const char *qc;
    dsq_status st;
    const char *needle;
} BAD[] = {
    /* shape of the object itself */
    {"[]", DSQ_ERR_CONFIG, "quantization_config must be an object"},
    {"\"awq\"", DSQ_ERR_CONFIG, "must be an object"},
    {"{}", DSQ_ERR_CONFIG, "quant_method is missing"},
    {"{\"bits\": 4}", DSQ_ERR_CONFIG, "quant_method"},
    {"{\"quant_method\": 4}", DSQ_ERR_CONFIG, "quant_method must be a string"},
    {"{\"quant_method\": null}", DSQ_ERR_CONFIG, "quant_method is missing"}, /* null = absent */
    {"{\"quant_method\": \"bitsandbytes\", \"load_in_4bit\": true}", DSQ_ERR_UNSUPPORTED, "bitsandbytes"},
    {"{\"quant_method\": \"fp8\"}", DSQ_ERR_UNSUPPORTED, "quant_method"},
    {"{\"quant_method\": \"AWQ\", \"bits\": 4, \"group_size\": 128}", DSQ_ERR_UNSUPPORTED, "quant_method"},
    {"{\"quant_method\": \"\"}", DSQ_ERR_UNSUPPORTED, "quant_method"},
    /* AWQ */
    {"{\"quant_method\": \"awq\", \"group_size\": 128}", DSQ_ERR_CONFIG, "bits is missing"},
    {"{\"quant_method\": \"awq\", \"bits\": 4}", DSQ_ERR_CONFIG, "group_size is missing"},
    {"{\"quant_method\": \"awq\", \"bits\": 8, \"group_size\": 128}", DSQ_ERR_UNSUPPORTED, "bits = 8"},
    {"{\"quant_method\": \"awq\", \"bits\": 3, \"group_size\": 128}", DSQ_ERR_UNSUPPORTED, "bits = 3"},
    {"{\"quant_method\": \"awq\", \"w_bit\": 2, \"q_group_size\": 128}", DSQ_ERR_UNSUPPORTED, "w_bit = 2"},
    {"{\"quant_method\": \"awq\", \"bits\": 4, \"group_size\": 64}", DSQ_ERR_UNSUPPORTED, "group_size = 64"},
    {"{\"quant_method\": \"awq\", \"bits\": 4, \"q_group_size\": 32}", DSQ_ERR_UNSUPPORTED, "q_group_size = 32"},
    {"{\"quant_method\": \"awq\", \"bits\": 4, \"group_size\": -1}", DSQ_ERR_UNSUPPORTED, "group_size = -1"},
    {"{\"quant_method\": \"awq\", \"bits\": \"4\", \"group_size\": 128}", DSQ_ERR_CONFIG, "bits must be an integer"},
    {"{\"quant_method\": \"awq\", \"bits\": 4.5, \"group_size\": 128}", DSQ_ERR_CONFIG, "bits must be an integer"},
    {"{\"quant_method\": \"awq\", \"bits\": 1e30, \"group_size\": 128}", DSQ_ERR_CONFIG, "bits must be an integer"},
    {"{\"quant_method\": \"awq\", \"bits\": true, \"group_size\": 128}", DSQ_ERR_CONFIG, "bits must be an integer"},
    {"{\"quant_method\": \"awq\", \"bits\": 4, \"group_size\": [128]}", DSQ_ERR_CONFIG, "group_size must be an integer"},
    {"{\"quant_method\": \"awq\", \"bits\": 4, \"w_bit\": 8, \"group_size\": 128}", DSQ_ERR_CONFIG, "\"w_bit\""},
    {"{\"quant_method\": \"awq\", \"bits\": 4, \"group_size\": 128, \"q_group_size\": 64}", DSQ_ERR_CONFIG, "q_group_size"},
    {"{\"quant_method\": \"awq\", \"bits\": 4, \"group_size\": 128, \"zero_point\": false}", DSQ_ERR_UNSUPPORTED, "zero_point"},
    {"{\"quant_method\": \"awq\", \"bits\": 4, \"group_size\": 128, \"zero_point\": 1}", DSQ_ERR_CONFIG, "zero_point must be true or false"},
    {"{\"quant_method\": \"awq\", \"bits\": 4, \"group_size\": 128, \"version\": \"gemv\"}", DSQ_ERR_UNSUPPORTED, "version = \"gemv\""},
    {"{\"quant_method\": \"awq\", \"bits\": 4, \"group_size\": 128, \"version\": \"gemv_fast\"}", DSQ_ERR_UNSUPPORTED, "version"},
    {"{\"quant_method\": \"awq\", \"bits\": 4, \"group_size\": 128, \"version\": \"exllama\"}", DSQ_ERR_UNSUPPORTED, "version"},
    {"{\"quant_method\": \"awq\", \"bits\": 4, \"group_size\": 128, \"version\": \"marlin\"}", DSQ_ERR_UNSUPPORTED, "version"},
    {"{\"quant_method\": \"awq\", \"bits\": 4, \"group_size\": 128, \"version\": 2}", DSQ_ERR_CONFIG, "version must be a string"},
    {"{\"quant_method\": \"awq\", \"bits\": 4, \"group_size\": 128, \"modules_to_not_convert\": \"x\"}", DSQ_ERR_CONFIG, "modules_to_not_convert"},
    {"{\"quant_method\": \"awq\", \"bits\": 4, \"group_size\": 128, \"modules_to_not_convert\": [1]}", DSQ_ERR_CONFIG, "modules_to_not_convert"},
    {"{\"quant_method\": \"awq\", \"bits\": 4, \"group_size\": 128, \"backend\": \"llm-awq\"}", DSQ_ERR_UNSUPPORTED, "backend = \"llm-awq\""},
    {"{\"quant_method\": \"awq\", \"bits\": 4, \"group_size\": 128, \"backend\": 1}", DSQ_ERR_CONFIG, "backend must be a string"},
    /* GPTQ */
    {"{\"quant_method\": \"gptq\", \"method\": \"awq\", \"bits\": 4, \"group_size\": 128}", DSQ_ERR_CONFIG, "differ"},
    {"{\"method\": \"qqq\", \"bits\": 4, \"group_size\": 128}", DSQ_ERR_UNSUPPORTED, "method = \"qqq\""},
    {"{\"method\": 7}", DSQ_ERR_CONFIG, "method must be a string"},
    {"{\"quant_method\": \"gptq\", \"bits\": 4, \"group_size\": 128, \"pack_dtype\": \"int8\"}", DSQ_ERR_UNSUPPORTED, "pack_dtype = \"int8\""},
    {"{\"quant_method\": \"gptq\", \"bits\": 4, \"group_size\": 128, \"pack_dtype\": 32}", DSQ_ERR_CONFIG, "pack_dtype must be a string"},
    {"{\"quant_method\": \"gptq\", \"group_size\": 128}", DSQ_ERR_CONFIG, "bits is missing"},
    {"{\"quant_method\": \"gptq\", \"bits\": 4}", DSQ_ERR_CONFIG, "group_size is missing"},
    {"{\"quant_method\": \"gptq\", \"bits\": 8, \"group_size\": 128}", DSQ_ERR_UNSUPPORTED, "bits = 8"},
    {"{\"quant_method\": \"gptq\", \"bits\": 3, \"group_size\": 128}", DSQ_ERR_UNSUPPORTED, "bits = 3"},
    {"{\"quant_method\": \"gptq\", \"bits\": 2, \"group_size\": 128}", DSQ_ERR_UNSUPPORTED, "bits = 2"},
    {"{\"quant_method\": \"gptq\", \"bits\": 4, \"group_size\": -1}", DSQ_ERR_UNSUPPORTED, "group_size = -1"},
    {"{\"quant_method\": \"gptq\", \"bits\": 4, \"group_size\": 32}", DSQ_ERR_UNSUPPORTED, "group_size = 32"},
    {"{\"quant_method\": \"gptq\", \"bits\": 4, \"group_size\": 128, \"desc_act\": true}", DSQ_ERR_UNSUPPORTED, "desc_act"},
    {"{\"quant_method\": \"gptq\", \"bits\": 4, \"group_size\": 128, \"desc_act\": \"false\"}", DSQ_ERR_CONFIG, "desc_act must be true or false"},
    {"{\"quant_method\": \"gptq\", \"bits\": 4, \"group_size\": 128, \"sym\": 0}", DSQ_ERR_CONFIG, "sym must be true or false"},
    {"{\"quant_method\": \"gptq\", \"bits\": 4, \"group_size\": 128, \"checkpoint_format\": \"marlin\"}", DSQ_ERR_UNSUPPORTED, "checkpoint_format = \"marlin\""},
    {"{\"quant_method\": \"gptq\", \"bits\": 4, \"group_size\": 128, \"format\": \"bitblas\"}", DSQ_ERR_UNSUPPORTED, "format = \"bitblas\""},
    {"{\"quant_method\": \"gptq\", \"bits\": 4, \"group_size\": 128, \"checkpoint_format\": 1}", DSQ_ERR_CONFIG, "checkpoint_format must be a string"},
    {"{\"quant_method\": \"gptq\", \"bits\": 4, \"group_size\": 128, \"checkpoint_format\": \"gptq\", \"format\": \"gptq_v2\"}", DSQ_ERR_CONFIG, "differ"},
    {"{\"quant_method\": \"gptq\", \"bits\": 4, \"group_size\": 128, \"is_marlin_format\": true}", DSQ_ERR_UNSUPPORTED, "is_marlin_format"},
    {"{\"quant_method\": \"gptq\", \"bits\": 4, \"group_size\": 128, \"dynamic\": {\"-:.*mlp.*\": {}}}", DSQ_ERR_UNSUPPORTED, "dynamic"},
    {"{\"quant_method\": \"gptq\", \"bits\": 4, \"group_size\": 128, \"dynamic\": []}", DSQ_ERR_CONFIG, "dynamic must be an object"},
    {"{\"quant_method\": \"gptq\", \"bits\": 4, \"group_size\": 128, \"lm_head\": \"yes\"}", DSQ_ERR_CONFIG, "lm_head must be true or false"},
    /* dsqwen */
    {"{\"quant_method\": \"dsqwen\", \"bits\": 8}", DSQ_ERR_CONFIG, "version is missing"},
    {"{\"quant_method\": \"dsqwen\", \"version\": 2, \"bits\": 8}", DSQ_ERR_UNSUPPORTED, "version = 2"},
    {"{\"quant_method\": \"dsqwen\", \"version\": 1}", DSQ_ERR_CONFIG, "bits is missing"},
    {"{\"quant_method\": \"dsqwen\", \"version\": 1, \"bits\": 16}", DSQ_ERR_UNSUPPORTED, "bits = 16"},
    {"{\"quant_method\": \"dsqwen\", \"version\": 1, \"bits\": 8, \"group_size\": 128}", DSQ_ERR_UNSUPPORTED, "group_size = 128"},
    {"{\"quant_method\": \"dsqwen\", \"version\": 1, \"bits\": 8, \"zero_point\": true}", DSQ_ERR_UNSUPPORTED, "zero_point"},
    {"{\"quant_method\": \"dsqwen\", \"version\": 1, \"bits\": 4, \"group_size\": 64}", DSQ_ERR_UNSUPPORTED, "group_size = 64"},
    {"{\"quant_method\": \"dsqwen\", \"version\": 1, \"bits\": 4, \"zero_point\": false}", DSQ_ERR_UNSUPPORTED, "zero_point"},
    {"{\"quant_method\": \"dsqwen\", \"version\": \"1\", \"bits\": 4}", DSQ_ERR_CONFIG, "version must be an integer"},
    /* the JSON around it */
    {"{\"quant_method\": \"awq\", \"quant_method\": \"gptq\", \"bits\": 4, \"group_size\": 128}", DSQ_ERR_CONFIG, "appears twice"},
    {"{\"quant_method\": \"awq\", \"bits\": 4, \"group_size\": 128", DSQ_ERR_FORMAT, "not valid JSON"},
    {"{\"quant_method\": \"awq\\u0000x\", \"bits\": 4, \"group_size\": 128}", DSQ_ERR_FORMAT, "NUL"},
};

static void test_refusals(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof BAD / sizeof BAD[0]; i++) {
        dsq_quant_config c, before;
        memset(&c, 0x5a, sizeof c);
        before = c;
        dsq_status st = parse_qc(BAD[i].qc, &c);
        const char *msg = dsq_last_error_message();
        if (st != BAD[i].st || !strstr(msg, BAD[i].needle))
            fail_msg("case %zu %s: status %d (want %d), message \"%s\" (want \"%s\" in it)", i,
                     BAD[i].qc, (int)st, (int)BAD[i].st, msg, BAD[i].needle);
        assert_memory_equal(&c, &before, sizeof c); /* untouched */
    }
}

static void test_bad_text_and_args(void **state)
{
    (void)state;
    dsq_quant_config c;
    assert_int_equal(dsq_quant_config_parse(NULL, 0, &c), DSQ_ERR_INVALID_ARG);
    assert_int_equal(dsq_quant_config_parse("{}", 2, NULL), DSQ_ERR_INVALID_ARG);
    assert_int_equal(dsq_quant_config_from_root(NULL, &c), DSQ_ERR_INVALID_ARG);
    assert_int_equal(dsq_quant_config_parse("[1]", 3, &c), DSQ_ERR_FORMAT);
    assert_int_equal(dsq_quant_config_parse("", 0, &c), DSQ_ERR_FORMAT);
    /* a raw NUL byte inside the text */
    const char t[] = "{\"a\": \"x\0y\"}";
    assert_int_equal(dsq_quant_config_parse(t, sizeof t - 1, &c), DSQ_ERR_FORMAT);
    /* length shorter than the text: only the prefix counts */
    assert_int_equal(dsq_quant_config_parse("{}garbage", 2, &c), DSQ_OK);
    assert_int_equal(c.method, DSQ_QM_NONE);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_real_config_is_unquantized),
        cmocka_unit_test(test_awq_accepted),
        cmocka_unit_test(test_gptq_accepted),
        cmocka_unit_test(test_dsqwen_accepted),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_bad_text_and_args),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
