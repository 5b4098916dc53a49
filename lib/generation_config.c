/* generation_config.c - the sampler settings a checkpoint ships in
 * generation_config.json, and dsq_model_sampler_params().
 *
 * Only the fields that map onto dsq_sampler_params are read: temperature,
 * top_k, top_p, min_p, repetition_penalty, and do_sample (false means greedy,
 * as Hugging Face generate() then skips the sampling warpers).  Everything
 * else (bos/eos ids, max_length, "_from_model_config", ...) is ignored.  A
 * field that is absent or null keeps the library default; note that this is
 * not Hugging Face's GenerationConfig default (do_sample false, top_k 50), a
 * deliberate choice: the library defaults are R1-Distill's own settings.
 * A field of the wrong type or with an impossible value is refused, rather
 * than silently ignored, so a typo in the file cannot change how the model
 * samples without anyone noticing. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "internal.h"
#include "json_strict.h"

/* The field as a number in [lo, hi] (lo excluded when lo_open), or absent
 * (returns 0, *present = 0). */
static dsq_status get_number(const cJSON *root, const char *name, const char *key, double lo,
                             int lo_open, double hi, double *v, int *present)
{
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(root, key);
    *present = 0;
    if (!it || cJSON_IsNull(it))
        return DSQ_OK;
    if (!cJSON_IsNumber(it))
        return dsq_fail(DSQ_ERR_FORMAT, "%s: \"%s\" must be a number", name, key);
    double x = it->valuedouble;
    if (!isfinite(x) || x < lo || (lo_open && x == lo) || x > hi)
        return dsq_fail(DSQ_ERR_FORMAT, "%s: \"%s\" = %.10g must be in %c%.10g, %.10g]", name, key, x,
                        lo_open ? '(' : '[', lo, hi);
    /* The values are stored as float: a positive number below float's
     * range (repetition_penalty 1e-90) would become 0, which the sampler
     * refuses, so the file would load and its params not work. */
    if (lo_open && !((float)x > (float)lo))
        return dsq_fail(DSQ_ERR_FORMAT, "%s: \"%s\" = %.10g is too small to be stored as a float",
                        name, key, x);
    *v = x;
    *present = 1;
    return DSQ_OK;
}

dsq_status dsq_gen_config_parse(const char *json, size_t len, const char *name,
                                dsq_gen_config *g)
{
    if (!json || !name || !g)
        return dsq_fail(DSQ_ERR_INVALID_ARG, "dsq_gen_config_parse: NULL argument");
    memset(g, 0, sizeof *g);
    size_t nul = dsq_json_nul_offset(json, len);
    if (nul != len)
        return dsq_fail(DSQ_ERR_FORMAT,
                        "%s: a key or string holds NUL (raw or \\u0000, byte %zu); it would alias "
                        "a shorter name",
                        name, nul);
    const char *end = NULL;
    errno = 0; /* cJSON returns NULL for bad text and failed allocations alike */
    cJSON *root = cJSON_ParseWithLengthOpts(json, len, &end, 0);
    if (!root && errno == ENOMEM)
        return dsq_fail(DSQ_ERR_OUT_OF_MEMORY, "no memory to parse %s", name);
    if (!root)
        return dsq_fail(DSQ_ERR_FORMAT, "%s is not valid JSON (near byte %td)", name,
                        end ? end - json : (ptrdiff_t)0);
    dsq_status st = DSQ_OK;
    for (const char *p = end; p < json + len; p++)
        if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r') {
            st = dsq_fail(DSQ_ERR_FORMAT, "%s has bytes after the JSON object", name);
            goto done;
        }
    if (!cJSON_IsObject(root)) {
        st = dsq_fail(DSQ_ERR_FORMAT, "%s is not a JSON object", name);
        goto done;
    }
    /* Python's json keeps the last of a repeated key, cJSON lookups the
     * first: refuse rather than pick one silently. */
    int oom = 0;
    const cJSON *dup = dsq_json_duplicate_key(root, &oom);
    if (oom || dup) {
        st = oom ? dsq_fail(DSQ_ERR_OUT_OF_MEMORY, "%s: no memory to check keys", name)
                 : dsq_fail(DSQ_ERR_FORMAT, "%s: key \"%.64s\" appears twice in one object", name,
                            dup->string);
        goto done;
    }

    dsq_gen_config c;
    memset(&c, 0, sizeof c);
    double v = 0.0;
    int present = 0;
    if ((st = get_number(root, name, "temperature", 0.0, 0, 1e6, &v, &present)) != DSQ_OK)
        goto done;
    if (present) {
        c.temperature = (float)v;
        c.has |= DSQ_GEN_TEMPERATURE;
    }
    if ((st = get_number(root, name, "top_k", 0.0, 0, (double)INT32_MAX, &v, &present)) != DSQ_OK)
        goto done;
    if (present) {
        if (v != floor(v)) {
            st = dsq_fail(DSQ_ERR_FORMAT, "%s: \"top_k\" = %g must be an integer", name, v);
            goto done;
        }
        c.top_k = (int32_t)v;
        c.has |= DSQ_GEN_TOP_K;
    }
    if ((st = get_number(root, name, "top_p", 0.0, 1, 1.0, &v, &present)) != DSQ_OK)
        goto done;
    if (present) {
        c.top_p = (float)v;
        c.has |= DSQ_GEN_TOP_P;
    }
    if ((st = get_number(root, name, "min_p", 0.0, 0, 1.0, &v, &present)) != DSQ_OK)
        goto done;
    if (present) {
        c.min_p = (float)v;
        c.has |= DSQ_GEN_MIN_P;
    }
    if ((st = get_number(root, name, "repetition_penalty", 0.0, 1, 1e6, &v, &present)) != DSQ_OK)
        goto done;
    if (present) {
        c.repetition_penalty = (float)v;
        c.has |= DSQ_GEN_REPETITION_PENALTY;
    }
    const cJSON *ds = cJSON_GetObjectItemCaseSensitive(root, "do_sample");
    if (ds && !cJSON_IsNull(ds)) {
        if (!cJSON_IsBool(ds)) {
            st = dsq_fail(DSQ_ERR_FORMAT, "%s: \"do_sample\" must be true or false", name);
            goto done;
        }
        if (cJSON_IsFalse(ds)) { /* greedy, whatever temperature says */
            c.temperature = 0.0f;
            c.has |= DSQ_GEN_TEMPERATURE;
        }
    }
    *g = c;
done:
    cJSON_Delete(root);
    return st;
}

dsq_status dsq_gen_config_load(const char *dir, dsq_gen_config *g)
{
    if (!dir || !g)
        return dsq_fail(DSQ_ERR_INVALID_ARG, "dsq_gen_config_load: NULL argument");
    memset(g, 0, sizeof *g);
    char *path = dsq_path_join(dir, "generation_config.json");
    if (!path)
        return dsq_fail(DSQ_ERR_OUT_OF_MEMORY, "no memory for paths");
    dsq_status st = DSQ_OK;
    /* optional: many checkpoints have none; one that exists but is not a
     * regular file (a FIFO) is refused by dsq_read_file, not skipped */
    if (dsq_path_exists(path)) {
        char *json = NULL;
        size_t len = 0;
        st = dsq_read_file(path, &json, &len);
        if (st == DSQ_OK)
            st = dsq_gen_config_parse(json, len, path, g);
        free(json);
    }
    free(path);
    return st;
}

/* First released size of dsq_sampler_params (ABI floor), as in sampler.c. */
#define SAMPLER_PARAMS_V1 sizeof(dsq_sampler_params)

dsq_status dsq_model_sampler_params(const dsq_model *m, dsq_sampler_params *params)
{
    dsq_clear_error();
    if (!m || !params)
        return dsq_fail(DSQ_ERR_INVALID_ARG, "dsq_model_sampler_params: NULL argument");
    uint32_t want = params->struct_size;
    if (want < SAMPLER_PARAMS_V1 || want > sizeof(dsq_sampler_params))
        return dsq_fail(DSQ_ERR_STRUCT_SIZE, "dsq_sampler_params.struct_size is %u; expected %zu",
                        want, sizeof(dsq_sampler_params));
    dsq_sampler_params v;
    memset(&v, 0, sizeof v);
    dsq_status st = dsq_sampler_params_init(&v, (uint32_t)sizeof v);
    if (st != DSQ_OK)
        return st;
    const dsq_gen_config *g = &m->gen;
    if (g->has & DSQ_GEN_TEMPERATURE)
        v.temperature = g->temperature;
    if (g->has & DSQ_GEN_TOP_K)
        v.top_k = g->top_k;
    if (g->has & DSQ_GEN_TOP_P)
        v.top_p = g->top_p;
    if (g->has & DSQ_GEN_MIN_P)
        v.min_p = g->min_p;
    if (g->has & DSQ_GEN_REPETITION_PENALTY)
        v.repetition_penalty = g->repetition_penalty;
    if (m->tokenizer) {
        /* the embedding has padding rows past the tokenizer's last id: their
         * logits are meaningless and must never be drawn */
        int32_t n = dsq_tokenizer_n_tokens(m->tokenizer);
        if (n > 0 && n < m->cfg.n_vocab)
            v.n_vocab_valid = n;
    }
    v.struct_size = want;
    memcpy(params, &v, want);
    return DSQ_OK;
}
