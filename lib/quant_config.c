/* quant_config.c - config.json's quantization_config -> dsq_quant_config.
 *
 * What each tool writes (read from their published descriptions):
 *   AutoAWQ / transformers AwqConfig: {"quant_method": "awq", "bits": 4,
 *     "group_size": 128, "zero_point": true, "version": "gemm",
 *     "modules_to_not_convert": null}; AutoAWQ's quant_config.json spells
 *     bits and group_size "w_bit" and "q_group_size".
 *   AutoGPTQ / GPTQModel / transformers GPTQConfig: {"quant_method": "gptq",
 *     "bits": 4, "group_size": 128, "desc_act": false, "sym": true,
 *     "checkpoint_format": "gptq", ...}; GPTQModel also writes "format",
 *     "method" (its name for quant_method), "pack_dtype", "lm_head" and
 *     "dynamic"; transformers' AwqConfig "backend" ("autoawq" or "llm-awq",
 *     which packs differently).  "gptq" (v1) stores zero - 1 in qzeros,
 *     "gptq_v2" the zero itself.
 * Fields that do not change the stored layout or the math (damp_percent,
 * true_sequential, static_groups, model_name_or_path, ...) are ignored. */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <string.h>

#include "json_strict.h"
#include "quant_config.h"

#define QC "config.json: quantization_config"

const char *dsq_quant_method_name(dsq_quant_method m)
{
    switch (m) {
    case DSQ_QM_NONE: return "none";
    case DSQ_QM_AWQ: return "awq";
    case DSQ_QM_GPTQ: return "gptq";
    case DSQ_QM_DSQWEN: return "dsqwen";
    }
    return "?";
}

static const cJSON *item(const cJSON *o, const char *key)
{
    return cJSON_GetObjectItemCaseSensitive(o, key);
}

/* The first present of two spellings of one field; both present and
 * different is refused (which one a tool reads is not ours to guess). */
static dsq_status pick(const cJSON *qc, const char *a, const char *b, const cJSON **out,
                       const char **name)
{
    const cJSON *va = item(qc, a), *vb = b ? item(qc, b) : NULL;
    if (va && cJSON_IsNull(va))
        va = NULL;
    if (vb && cJSON_IsNull(vb))
        vb = NULL;
    *out = va ? va : vb;
    *name = va ? a : vb ? b : a;
    if (va && vb) {
        char *sa = cJSON_PrintUnformatted(va), *sb = cJSON_PrintUnformatted(vb);
        int same = sa && sb && strcmp(sa, sb) == 0;
        int oom = !sa || !sb;
        cJSON_free(sa);
        cJSON_free(sb);
        if (oom)
            return dsq_fail(DSQ_ERR_OUT_OF_MEMORY, QC ": no memory to compare %s and %s", a, b);
        if (!same)
            return dsq_fail(DSQ_ERR_CONFIG, QC ": \"%s\" and \"%s\" are both given and differ", a, b);
    }
    return DSQ_OK;
}

/* Integer field (required or with a default). */
static dsq_status get_int(const cJSON *qc, const char *key, const char *alt, int required,
                          int32_t dflt, int32_t *out)
{
    const cJSON *v;
    const char *name;
    dsq_status st = pick(qc, key, alt, &v, &name);
    if (st != DSQ_OK)
        return st;
    if (!v) {
        if (required)
            return dsq_fail(DSQ_ERR_CONFIG, QC ".%s is missing", key);
        *out = dflt;
        return DSQ_OK;
    }
    if (!cJSON_IsNumber(v) || floor(v->valuedouble) != v->valuedouble ||
        fabs(v->valuedouble) > 1e9)
        return dsq_fail(DSQ_ERR_CONFIG, QC ".%s must be an integer", name);
    *out = (int32_t)v->valuedouble;
    return DSQ_OK;
}

static dsq_status get_bool(const cJSON *qc, const char *key, int dflt, int *out)
{
    const cJSON *v = item(qc, key);
    if (!v || cJSON_IsNull(v)) {
        *out = dflt;
        return DSQ_OK;
    }
    if (!cJSON_IsBool(v))
        return dsq_fail(DSQ_ERR_CONFIG, QC ".%s must be true or false", key);
    *out = cJSON_IsTrue(v) ? 1 : 0;
    return DSQ_OK;
}

/* Optional string (NULL when absent or null). */
static dsq_status get_str(const cJSON *qc, const char *key, const char *alt, const char **out,
                          const char **name)
{
    const cJSON *v;
    dsq_status st = pick(qc, key, alt, &v, name);
    if (st != DSQ_OK)
        return st;
    *out = NULL;
    if (!v)
        return DSQ_OK;
    if (!cJSON_IsString(v))
        return dsq_fail(DSQ_ERR_CONFIG, QC ".%s must be a string", *name);
    *out = v->valuestring;
    return DSQ_OK;
}

static int eq_nocase(const char *a, const char *b)
{
    for (; *a && *b; a++, b++)
        if (tolower((unsigned char)*a) != tolower((unsigned char)*b))
            return 0;
    return *a == *b;
}

/* bits == 4 and group_size == 128, the only shape AWQ/GPTQ load as. */
static dsq_status check_4bit_g128(const char *method, const char *bits_name, int32_t bits,
                                  const char *gs_name, int32_t gs)
{
    if (bits != 4)
        return dsq_fail(DSQ_ERR_UNSUPPORTED, QC ".%s = %d is not supported (%s: 4 only)", bits_name,
                        bits, method);
    if (gs != 128)
        return dsq_fail(DSQ_ERR_UNSUPPORTED, QC ".%s = %d is not supported (%s: 128 only)", gs_name,
                        gs, method);
    return DSQ_OK;
}

static dsq_status parse_awq(const cJSON *qc, dsq_quant_config *c)
{
    dsq_status st;
    const cJSON *v;
    const char *bits_name, *gs_name, *ver, *ver_name;
    if ((st = pick(qc, "bits", "w_bit", &v, &bits_name)) != DSQ_OK ||
        (st = get_int(qc, "bits", "w_bit", 1, 0, &c->bits)) != DSQ_OK ||
        (st = pick(qc, "group_size", "q_group_size", &v, &gs_name)) != DSQ_OK ||
        (st = get_int(qc, "group_size", "q_group_size", 1, 0, &c->group_size)) != DSQ_OK ||
        (st = check_4bit_g128("awq", bits_name, c->bits, gs_name, c->group_size)) != DSQ_OK ||
        (st = get_bool(qc, "zero_point", 1, &c->zero_point)) != DSQ_OK ||
        (st = get_str(qc, "version", NULL, &ver, &ver_name)) != DSQ_OK)
        return st;
    if (!c->zero_point)
        return dsq_fail(DSQ_ERR_UNSUPPORTED,
                        QC ".zero_point = false is not supported (AWQ GEMM with zero points only)");
    const char *be, *be_name;
    if ((st = get_str(qc, "backend", NULL, &be, &be_name)) != DSQ_OK)
        return st;
    if (be && strcmp(be, "autoawq") != 0) /* llm-awq packs differently (GEMV_FAST) */
        return dsq_fail(DSQ_ERR_UNSUPPORTED,
                        QC ".backend = \"%.32s\" is not supported (AutoAWQ packing only)", be);
    if (ver && !eq_nocase(ver, "gemm"))
        return dsq_fail(DSQ_ERR_UNSUPPORTED,
                        QC ".version = \"%.32s\" is not supported (AWQ \"gemm\" packing only)", ver);
    const cJSON *skip = item(qc, "modules_to_not_convert");
    if (skip && !cJSON_IsNull(skip)) {
        if (!cJSON_IsArray(skip))
            return dsq_fail(DSQ_ERR_CONFIG, QC ".modules_to_not_convert must be a list of strings");
        for (const cJSON *e = skip->child; e; e = e->next)
            if (!cJSON_IsString(e))
                return dsq_fail(DSQ_ERR_CONFIG,
                                QC ".modules_to_not_convert must be a list of strings");
        c->has_skip_list = skip->child != NULL;
    }
    return DSQ_OK;
}

static dsq_status parse_gptq(const cJSON *qc, dsq_quant_config *c)
{
    dsq_status st;
    int sym = 1;
    const char *fmt, *fmt_name;
    if ((st = get_int(qc, "bits", NULL, 1, 0, &c->bits)) != DSQ_OK ||
        (st = get_int(qc, "group_size", NULL, 1, 0, &c->group_size)) != DSQ_OK ||
        (st = check_4bit_g128("gptq", "bits", c->bits, "group_size", c->group_size)) != DSQ_OK ||
        (st = get_bool(qc, "desc_act", 0, &c->desc_act)) != DSQ_OK ||
        (st = get_bool(qc, "sym", 1, &sym)) != DSQ_OK ||
        (st = get_bool(qc, "lm_head", 0, &c->lm_head)) != DSQ_OK ||
        (st = get_str(qc, "checkpoint_format", "format", &fmt, &fmt_name)) != DSQ_OK)
        return st;
    if (c->desc_act)
        return dsq_fail(DSQ_ERR_UNSUPPORTED,
                        QC ".desc_act = true (act-order) is not supported: groups must be "
                        "contiguous runs of input features");
    int32_t ig;
    if ((st = get_bool(qc, "is_marlin_format", 0, &ig)) != DSQ_OK)
        return st;
    if (ig)
        return dsq_fail(DSQ_ERR_UNSUPPORTED,
                        QC ".is_marlin_format = true is not supported (plain GPTQ packing only)");
    const cJSON *dyn = item(qc, "dynamic");
    if (dyn && !cJSON_IsNull(dyn)) {
        if (!cJSON_IsObject(dyn))
            return dsq_fail(DSQ_ERR_CONFIG, QC ".dynamic must be an object");
        if (dyn->child)
            return dsq_fail(DSQ_ERR_UNSUPPORTED,
                            QC ".dynamic (per-module overrides) is not supported");
    }
    const char *pd, *pd_name;
    if ((st = get_str(qc, "pack_dtype", NULL, &pd, &pd_name)) != DSQ_OK)
        return st;
    if (pd && strcmp(pd, "int32") != 0)
        return dsq_fail(DSQ_ERR_UNSUPPORTED,
                        QC ".pack_dtype = \"%.32s\" is not supported (int32 words only)", pd);
    if (!fmt || strcmp(fmt, "gptq") == 0)
        c->gptq_zero_offset = 1;
    else if (strcmp(fmt, "gptq_v2") == 0)
        c->gptq_zero_offset = 0;
    else
        return dsq_fail(DSQ_ERR_UNSUPPORTED,
                        QC ".%s = \"%.32s\" is not supported (\"gptq\" or \"gptq_v2\")", fmt_name,
                        fmt);
    c->zero_point = !sym;
    return DSQ_OK;
}

static dsq_status parse_dsqwen(const cJSON *qc, dsq_quant_config *c)
{
    dsq_status st;
    if ((st = get_int(qc, "version", NULL, 1, 0, &c->version)) != DSQ_OK ||
        (st = get_int(qc, "bits", NULL, 1, 0, &c->bits)) != DSQ_OK)
        return st;
    if (c->version != 1)
        return dsq_fail(DSQ_ERR_UNSUPPORTED, QC ".version = %d is not supported (dsqwen: 1)",
                        c->version);
    if (c->bits == 8) {
        if ((st = get_int(qc, "group_size", NULL, 0, -1, &c->group_size)) != DSQ_OK)
            return st;
        if (c->group_size != -1)
            return dsq_fail(DSQ_ERR_UNSUPPORTED,
                            QC ".group_size = %d is not supported (dsqwen 8-bit: -1, one scale "
                            "per output row)",
                            c->group_size);
        if ((st = get_bool(qc, "zero_point", 0, &c->zero_point)) != DSQ_OK)
            return st;
        if (c->zero_point)
            return dsq_fail(DSQ_ERR_UNSUPPORTED,
                            QC ".zero_point = true is not supported (dsqwen 8-bit is symmetric)");
    } else if (c->bits == 4) {
        if ((st = get_int(qc, "group_size", NULL, 0, 128, &c->group_size)) != DSQ_OK)
            return st;
        if (c->group_size != 128)
            return dsq_fail(DSQ_ERR_UNSUPPORTED,
                            QC ".group_size = %d is not supported (dsqwen 4-bit: 128)",
                            c->group_size);
        if ((st = get_bool(qc, "zero_point", 1, &c->zero_point)) != DSQ_OK)
            return st;
        if (!c->zero_point)
            return dsq_fail(DSQ_ERR_UNSUPPORTED,
                            QC ".zero_point = false is not supported (dsqwen 4-bit stores zero "
                            "points)");
    } else {
        return dsq_fail(DSQ_ERR_UNSUPPORTED, QC ".bits = %d is not supported (dsqwen: 8 or 4)",
                        c->bits);
    }
    return DSQ_OK;
}

dsq_status dsq_quant_config_from_root(const cJSON *root, dsq_quant_config *out)
{
    if (!root || !out)
        return dsq_fail(DSQ_ERR_INVALID_ARG, "dsq_quant_config_from_root: NULL argument");
    dsq_quant_config c;
    memset(&c, 0, sizeof c);
    const cJSON *qc = item(root, "quantization_config");
    if (!qc || cJSON_IsNull(qc)) {
        *out = c;
        return DSQ_OK;
    }
    if (!cJSON_IsObject(qc))
        return dsq_fail(DSQ_ERR_CONFIG, QC " must be an object");
    const cJSON *m;
    const char *m_name;
    dsq_status st = pick(qc, "quant_method", "method", &m, &m_name);
    if (st != DSQ_OK)
        return st;
    if (!m)
        return dsq_fail(DSQ_ERR_CONFIG, QC ".quant_method is missing");
    if (!cJSON_IsString(m))
        return dsq_fail(DSQ_ERR_CONFIG, QC ".%s must be a string", m_name);
    if (strcmp(m->valuestring, "awq") == 0) {
        c.method = DSQ_QM_AWQ;
        st = parse_awq(qc, &c);
    } else if (strcmp(m->valuestring, "gptq") == 0) {
        c.method = DSQ_QM_GPTQ;
        st = parse_gptq(qc, &c);
    } else if (strcmp(m->valuestring, "dsqwen") == 0) {
        c.method = DSQ_QM_DSQWEN;
        st = parse_dsqwen(qc, &c);
    } else {
        return dsq_fail(DSQ_ERR_UNSUPPORTED,
                        QC ".%s = \"%.32s\" is not supported (awq, gptq or dsqwen)", m_name,
                        m->valuestring);
    }
    if (st == DSQ_OK)
        *out = c;
    return st;
}

dsq_status dsq_quant_config_parse(const char *json, size_t len, dsq_quant_config *out)
{
    if (!json || !out)
        return dsq_fail(DSQ_ERR_INVALID_ARG, "dsq_quant_config_parse: NULL argument");
    size_t nul = dsq_json_nul_offset(json, len);
    if (nul != len)
        return dsq_fail(DSQ_ERR_FORMAT, "config.json: a key or string holds NUL (byte %zu)", nul);
    errno = 0;
    cJSON *root = cJSON_ParseWithLength(json, len);
    if (!root && errno == ENOMEM)
        return dsq_fail(DSQ_ERR_OUT_OF_MEMORY, "no memory to parse config.json");
    if (!root)
        return dsq_fail(DSQ_ERR_FORMAT, "config.json is not valid JSON");
    dsq_status st;
    int oom = 0;
    const cJSON *dup = dsq_json_duplicate_key(root, &oom);
    if (!cJSON_IsObject(root))
        st = dsq_fail(DSQ_ERR_FORMAT, "config.json is not a JSON object");
    else if (oom)
        st = dsq_fail(DSQ_ERR_OUT_OF_MEMORY, "config.json: no memory to check keys");
    else if (dup)
        st = dsq_fail(DSQ_ERR_CONFIG, "config.json: key \"%.64s\" appears twice in one object",
                      dup->string);
    else
        st = dsq_quant_config_from_root(root, out);
    cJSON_Delete(root);
    return st;
}
