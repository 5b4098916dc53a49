/*
 * config.c - Hugging Face config.json -> dsq_config for Qwen2 models.
 *
 * Only what the Qwen2 forward pass uses is read; everything that would change
 * the math in a way this library does not implement (sliding-window attention,
 * RoPE scaling, another activation, mrope) is refused with
 * DSQ_ERR_UNSUPPORTED rather than silently ignored.  Every refusal names the
 * field.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "internal.h"
#include "json_strict.h"

/* Upper bound for every size field: far above any real Qwen2 model, low
 * enough that products of two such values fit comfortably in int64. */
#define CFG_MAX_DIM (1 << 24)

static int is_int_value(const cJSON *v)
{
    return cJSON_IsNumber(v) && floor(v->valuedouble) == v->valuedouble &&
           fabs(v->valuedouble) <= 9007199254740992.0;
}

/* Required positive integer < CFG_MAX_DIM. */
static dsq_status get_size(const cJSON *root, const char *key, int32_t *out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!v)
        return dsq_fail(DSQ_ERR_CONFIG, "config.json: required field \"%s\" is missing", key);
    if (!is_int_value(v))
        return dsq_fail(DSQ_ERR_CONFIG, "config.json: \"%s\" must be an integer", key);
    if (v->valuedouble < 1 || v->valuedouble >= CFG_MAX_DIM)
        return dsq_fail(DSQ_ERR_CONFIG, "config.json: \"%s\" = %.0f is out of range (1..%d)", key,
                        v->valuedouble, CFG_MAX_DIM - 1);
    *out = (int32_t)v->valuedouble;
    return DSQ_OK;
}

/* Optional positive finite float; `dflt` when absent. */
static dsq_status get_float(const cJSON *root, const char *key, int required, double dflt,
                            double max, float *out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!v) {
        if (required)
            return dsq_fail(DSQ_ERR_CONFIG, "config.json: required field \"%s\" is missing", key);
        *out = (float)dflt;
        return DSQ_OK;
    }
    if (!cJSON_IsNumber(v))
        return dsq_fail(DSQ_ERR_CONFIG, "config.json: \"%s\" must be a number", key);
    double d = v->valuedouble;
    if (!(d > 0.0) || !(d < max) || !isfinite((float)d) || (float)d == 0.0f)
        return dsq_fail(DSQ_ERR_CONFIG, "config.json: \"%s\" = %g is out of range (0, %g)", key,
                        d, max);
    *out = (float)d;
    return DSQ_OK;
}

/* Optional boolean; `dflt` when absent or null. */
static dsq_status get_bool(const cJSON *root, const char *key, int dflt, int *out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!v || cJSON_IsNull(v)) {
        *out = dflt;
        return DSQ_OK;
    }
    if (!cJSON_IsBool(v))
        return dsq_fail(DSQ_ERR_CONFIG, "config.json: \"%s\" must be true or false", key);
    *out = cJSON_IsTrue(v) ? 1 : 0;
    return DSQ_OK;
}

/* bos/eos: an integer, a list of integers (the first is used), null or
 * absent (-1). */
static dsq_status get_token(const cJSON *root, const char *key, int32_t n_vocab, int32_t *out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
    *out = -1;
    if (!v || cJSON_IsNull(v))
        return DSQ_OK;
    if (cJSON_IsArray(v)) {
        if (!v->child)
            return DSQ_OK;
        v = v->child;
    }
    if (!is_int_value(v))
        return dsq_fail(DSQ_ERR_CONFIG,
                        "config.json: \"%s\" must be an integer or a list of integers", key);
    if (v->valuedouble < 0 || v->valuedouble >= n_vocab)
        return dsq_fail(DSQ_ERR_CONFIG, "config.json: \"%s\" = %.0f is outside the vocabulary (0..%d)",
                        key, v->valuedouble, n_vocab - 1);
    *out = (int32_t)v->valuedouble;
    return DSQ_OK;
}

static dsq_status check_arch(const cJSON *root)
{
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(root, "model_type");
    const cJSON *ar = cJSON_GetObjectItemCaseSensitive(root, "architectures");
    if (mt && !cJSON_IsString(mt) && !cJSON_IsNull(mt))
        return dsq_fail(DSQ_ERR_CONFIG, "config.json: \"model_type\" must be a string");
    if (ar && !cJSON_IsArray(ar) && !cJSON_IsNull(ar))
        return dsq_fail(DSQ_ERR_CONFIG, "config.json: \"architectures\" must be a list of strings");
    if (cJSON_IsString(mt) && strcmp(mt->valuestring, "qwen2") == 0)
        return DSQ_OK;
    if (cJSON_IsArray(ar))
        for (const cJSON *c = ar->child; c; c = c->next)
            if (cJSON_IsString(c) && strcmp(c->valuestring, "Qwen2ForCausalLM") == 0)
                return DSQ_OK;
    if (cJSON_IsString(mt))
        return dsq_fail(DSQ_ERR_UNSUPPORTED,
                        "config.json: model_type \"%.64s\" is not supported (only \"qwen2\"; "
                        "architectures does not list Qwen2ForCausalLM either)",
                        mt->valuestring);
    return dsq_fail(DSQ_ERR_UNSUPPORTED,
                    "config.json: neither model_type \"qwen2\" nor architectures "
                    "[\"Qwen2ForCausalLM\"] is given: not a supported model");
}

/* Features that change the math in ways this library does not implement. */
static dsq_status check_unsupported(const cJSON *root)
{
    const cJSON *act = cJSON_GetObjectItemCaseSensitive(root, "hidden_act");
    if (act && !cJSON_IsString(act))
        return dsq_fail(DSQ_ERR_CONFIG, "config.json: \"hidden_act\" must be a string");
    if (act && strcmp(act->valuestring, "silu") != 0)
        return dsq_fail(DSQ_ERR_UNSUPPORTED,
                        "config.json: hidden_act \"%.64s\" is not supported (only \"silu\")",
                        act->valuestring);
    int b = 0;
    dsq_status st = get_bool(root, "use_sliding_window", 0, &b);
    if (st != DSQ_OK)
        return st;
    if (b)
        return dsq_fail(DSQ_ERR_UNSUPPORTED,
                        "config.json: use_sliding_window = true is not supported");
    st = get_bool(root, "use_mrope", 0, &b);
    if (st != DSQ_OK)
        return st;
    if (b)
        return dsq_fail(DSQ_ERR_UNSUPPORTED, "config.json: use_mrope = true is not supported");
    const cJSON *rs = cJSON_GetObjectItemCaseSensitive(root, "rope_scaling");
    if (rs && !cJSON_IsNull(rs))
        return dsq_fail(DSQ_ERR_UNSUPPORTED,
                        "config.json: rope_scaling is set; only plain RoPE (rope_scaling null) "
                        "is supported");
    return DSQ_OK;
}

dsq_status dsq_config_parse(const char *json, size_t len, dsq_config *cfg)
{
    if (!json || !cfg)
        return dsq_fail(DSQ_ERR_INVALID_ARG, "dsq_config_parse: NULL argument");
    size_t nul = dsq_json_nul_offset(json, len);
    if (nul != len)
        return dsq_fail(DSQ_ERR_FORMAT,
                        "config.json: a key or string holds NUL (raw or \\u0000, byte %zu); it "
                        "would alias a shorter name",
                        nul);
    const char *end = NULL;
    errno = 0; /* cJSON returns NULL for bad text and failed allocations alike */
    cJSON *root = cJSON_ParseWithLengthOpts(json, len, &end, 0);
    if (!root && errno == ENOMEM)
        return dsq_fail(DSQ_ERR_OUT_OF_MEMORY, "no memory to parse config.json");
    if (!root)
        return dsq_fail(DSQ_ERR_FORMAT, "config.json is not valid JSON");
    dsq_status st = DSQ_OK;
    for (const char *p = end; p < json + len; p++)
        if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r') {
            st = dsq_fail(DSQ_ERR_FORMAT, "config.json has bytes after the JSON object");
            goto done;
        }
    if (!cJSON_IsObject(root)) {
        st = dsq_fail(DSQ_ERR_FORMAT, "config.json is not a JSON object");
        goto done;
    }
    /* Python's json (so transformers) keeps the last of a repeated key and
     * cJSON lookups the first: refuse rather than pick one silently. */
    int oom = 0;
    const cJSON *dup = dsq_json_duplicate_key(root, &oom);
    if (oom || dup) {
        st = oom ? dsq_fail(DSQ_ERR_OUT_OF_MEMORY, "config.json: no memory to check keys")
                 : dsq_fail(DSQ_ERR_CONFIG,
                            "config.json: key \"%.64s\" appears twice in one object (refused: "
                            "readers disagree on which one counts)",
                            dup->string);
        goto done;
    }

    dsq_config c;
    memset(&c, 0, sizeof c);
    if ((st = check_arch(root)) != DSQ_OK || (st = check_unsupported(root)) != DSQ_OK ||
        (st = get_size(root, "vocab_size", &c.n_vocab)) != DSQ_OK ||
        (st = get_size(root, "hidden_size", &c.n_embd)) != DSQ_OK ||
        (st = get_size(root, "num_hidden_layers", &c.n_layers)) != DSQ_OK ||
        (st = get_size(root, "num_attention_heads", &c.n_heads)) != DSQ_OK ||
        (st = get_size(root, "num_key_value_heads", &c.n_kv_heads)) != DSQ_OK ||
        (st = get_size(root, "intermediate_size", &c.n_ff)) != DSQ_OK ||
        (st = get_size(root, "max_position_embeddings", &c.max_pos)) != DSQ_OK ||
        (st = get_float(root, "rms_norm_eps", 1, 0, 1.0, &c.rms_eps)) != DSQ_OK ||
        (st = get_float(root, "rope_theta", 0, 10000.0, 1e12, &c.rope_theta)) != DSQ_OK ||
        (st = get_bool(root, "tie_word_embeddings", 0, &c.tie_embeddings)) != DSQ_OK)
        goto done;

    if (c.n_heads % c.n_kv_heads != 0) {
        st = dsq_fail(DSQ_ERR_CONFIG,
                      "config.json: num_attention_heads (%d) is not a multiple of "
                      "num_key_value_heads (%d)",
                      c.n_heads, c.n_kv_heads);
        goto done;
    }
    if (cJSON_GetObjectItemCaseSensitive(root, "head_dim") &&
        !cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(root, "head_dim"))) {
        if ((st = get_size(root, "head_dim", &c.head_dim)) != DSQ_OK)
            goto done;
    } else {
        if (c.n_embd % c.n_heads != 0) {
            st = dsq_fail(DSQ_ERR_CONFIG,
                          "config.json: hidden_size (%d) is not a multiple of num_attention_heads "
                          "(%d) and head_dim is not given",
                          c.n_embd, c.n_heads);
            goto done;
        }
        c.head_dim = c.n_embd / c.n_heads;
    }
    if (c.head_dim % 2 != 0) {
        st = dsq_fail(DSQ_ERR_CONFIG, "config.json: head_dim = %d must be even (RoPE pairs dims)",
                      c.head_dim);
        goto done;
    }
    if ((int64_t)c.n_heads * c.head_dim >= CFG_MAX_DIM) {
        st = dsq_fail(DSQ_ERR_CONFIG,
                      "config.json: num_attention_heads x head_dim = %lld is out of range",
                      (long long)c.n_heads * c.head_dim);
        goto done;
    }
    if ((st = get_token(root, "bos_token_id", c.n_vocab, &c.bos_token)) != DSQ_OK ||
        (st = get_token(root, "eos_token_id", c.n_vocab, &c.eos_token)) != DSQ_OK)
        goto done;
    *cfg = c;

done:
    cJSON_Delete(root);
    return st;
}

dsq_status dsq_config_load(const char *path, dsq_config *cfg)
{
    if (!path || !cfg)
        return dsq_fail(DSQ_ERR_INVALID_ARG, "dsq_config_load: NULL argument");
    char *text = NULL;
    size_t len = 0;
    dsq_status st = dsq_read_file(path, &text, &len);
    if (st != DSQ_OK)
        return st;
    st = dsq_config_parse(text, len, cfg);
    free(text);
    if (st != DSQ_OK) {
        /* say which file: the parser only knows the text */
        char msg[512];
        snprintf(msg, sizeof msg, "%s", dsq_last_error_message());
        if (strncmp(msg, "config.json", 11) == 0)
            st = dsq_fail(st, "%s%s", path, msg + 11);
        else
            st = dsq_fail(st, "%s: %s", path, msg);
    }
    return st;
}
