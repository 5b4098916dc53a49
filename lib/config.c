/*
 * config.c - Hugging Face config.json -> dsq_config: the JSON plumbing
 * (strict parse, duplicate keys, typed field readers of config_fields.h),
 * the choice of architecture (model_type / architectures against
 * dsq_archs[]) and the token ids every architecture shares.  Which sizes
 * an architecture reads, and what it refuses, is its parse_config
 * (lib/arch_*.c).  Every refusal names the field.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "arch.h"
#include "quant_config.h"
#include "config_fields.h"
#include "internal.h"
#include "json_strict.h"

#define CFG_MAX_DIM DSQ_CFG_MAX_DIM

static int is_int_value(const cJSON *v)
{
    return cJSON_IsNumber(v) && floor(v->valuedouble) == v->valuedouble &&
           fabs(v->valuedouble) <= 9007199254740992.0;
}

dsq_status dsq_cfg_size(const cJSON *root, const char *key, int32_t *out)
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

dsq_status dsq_cfg_float(const cJSON *root, const char *key, int required, double dflt,
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

dsq_status dsq_cfg_bool(const cJSON *root, const char *key, int dflt, int *out)
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

int dsq_cfg_has(const cJSON *root, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
    return v && !cJSON_IsNull(v);
}

dsq_status dsq_cfg_string(const cJSON *root, const char *key, const char **out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
    *out = NULL;
    if (!v || cJSON_IsNull(v))
        return DSQ_OK;
    if (!cJSON_IsString(v))
        return dsq_fail(DSQ_ERR_CONFIG, "config.json: \"%s\" must be a string", key);
    *out = v->valuestring;
    return DSQ_OK;
}

/* The architecture config.json names: model_type first, else an entry of
 * "architectures". */
static dsq_status pick_arch(const cJSON *root, const dsq_arch **out)
{
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(root, "model_type");
    const cJSON *ar = cJSON_GetObjectItemCaseSensitive(root, "architectures");
    if (mt && !cJSON_IsString(mt) && !cJSON_IsNull(mt))
        return dsq_fail(DSQ_ERR_CONFIG, "config.json: \"model_type\" must be a string");
    if (ar && !cJSON_IsArray(ar) && !cJSON_IsNull(ar))
        return dsq_fail(DSQ_ERR_CONFIG, "config.json: \"architectures\" must be a list of strings");
    for (int i = 0; dsq_archs[i]; i++)
        if (cJSON_IsString(mt) && strcmp(mt->valuestring, dsq_archs[i]->model_type) == 0) {
            *out = dsq_archs[i];
            return DSQ_OK;
        }
    if (cJSON_IsArray(ar))
        for (const cJSON *c = ar->child; c; c = c->next)
            for (int i = 0; dsq_archs[i]; i++)
                if (cJSON_IsString(c) && strcmp(c->valuestring, dsq_archs[i]->hf_class) == 0) {
                    *out = dsq_archs[i];
                    return DSQ_OK;
                }
    char known[256];
    size_t k = 0;
    known[0] = '\0';
    for (int i = 0; dsq_archs[i] && k < sizeof known; i++)
        k += (size_t)snprintf(known + k, sizeof known - k, "%s\"%s\" (%s)", i ? ", " : "",
                              dsq_archs[i]->model_type, dsq_archs[i]->hf_class);
    if (cJSON_IsString(mt))
        return dsq_fail(DSQ_ERR_UNSUPPORTED,
                        "config.json: model_type \"%.64s\" is not supported (known: %s; "
                        "architectures lists none of them either)",
                        mt->valuestring, known);
    return dsq_fail(DSQ_ERR_UNSUPPORTED,
                    "config.json: neither model_type nor architectures names a supported model "
                    "(known: %s)",
                    known);
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
    const dsq_arch *arch = NULL;
    if ((st = pick_arch(root, &arch)) != DSQ_OK || (st = arch->parse_config(root, &c)) != DSQ_OK)
        goto done;
    c.arch = arch;
    /* quantized checkpoints: what the weights are (refusing what no backend runs) */
    if ((st = dsq_quant_config_from_root(root, &c.quant)) != DSQ_OK)
        goto done;
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
