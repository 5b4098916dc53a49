/*
 * model_save.c - dsq_model_save(): write a loaded model's weights, as the
 * backends run them, as a checkpoint libdsqwen loads again without
 * converting anything (`dsqwen quantize` = load with dsq_model_params.quantize,
 * then save).
 *
 * Written: model.safetensors (every tensor of the model description, dense
 * ones as stored, quantized linears as "<prefix>.qweight" I8 [N][K] +
 * ".scales" F32 [N] (Q8_ROW) or ".qweight" U8 [N][ldq] + ".scales" F16
 * [N][G] + ".zeros" U8 [N][G] (Q4_G128); docs/quantization.md), config.json
 * (the source's, quantization_config replaced by the dsqwen one, or removed
 * when nothing is quantized), and copies of the source's tokenizer*,
 * generation_config.json and special_tokens_map.json files.
 * Tensors are written back to back (the format allows no holes); readers
 * copy the few that land misaligned.
 */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <dirent.h>

#include <cjson/cJSON.h>

#include "arch.h"
#include "internal.h"
#include "quant_cpu.h"
#include "weights_quant.h"

/* One array to write. */
typedef struct part {
    char name[192];
    const char *dtype;
    int32_t ndim;
    int64_t shape[2];
    const void *data;
    size_t bytes;
} part;

typedef struct plan {
    part *p;
    size_t n, cap;
    int any_q4, any_q8_layer;
} plan;

static int add(plan *pl, const char *prefix, const char *suffix, const char *dtype, int32_t ndim,
               int64_t d0, int64_t d1, const void *data, size_t bytes)
{
    if (pl->n == pl->cap) {
        size_t cap = pl->cap ? 2 * pl->cap : 256;
        part *np = realloc(pl->p, cap * sizeof *np);
        if (!np)
            return 1;
        pl->p = np;
        pl->cap = cap;
    }
    part *t = &pl->p[pl->n++];
    snprintf(t->name, sizeof t->name, "%s%s", prefix, suffix);
    t->dtype = dtype;
    t->ndim = ndim;
    t->shape[0] = d0;
    t->shape[1] = d1;
    t->data = data;
    t->bytes = bytes;
    return 0;
}

static const char *dtype_str(dsq_dtype dt)
{
    return dt == DSQ_DT_F32 ? "F32" : dt == DSQ_DT_F16 ? "F16" : dt == DSQ_DT_BF16 ? "BF16" : NULL;
}

static dsq_status build_plan(const dsq_model *m, plan *pl)
{
    const dsq_config *cfg = &m->cfg;
    const dsq_arch *a = cfg->arch;
    char name[160], prefix[160];
    for (int32_t i = 0; i < a->n_tensors; i++) {
        const dsq_tensor_spec *sp = &a->tensors[i];
        for (int32_t l = 0; l < (sp->per_layer ? cfg->n_layers : 1); l++) {
            dsq_arch_tensor_name(a, sp->per_layer, sp->role, l, name, sizeof name);
            const dsq_weight *q = dsq_weights_qslot(&m->w, sp->per_layer, sp->role, l);
            const dsq_tensor *t = sp->per_layer ? &m->w.layers[l].t[sp->role] : &m->w.g[sp->role];
            int bad = 0;
            if (q) {
                size_t ln = strlen(name);
                snprintf(prefix, sizeof prefix, "%.*s", (int)(ln > 7 ? ln - 7 : 0), name);
                const int64_t N = q->rows, K = q->cols;
                if (q->format == DSQ_WF_Q8_ROW) {
                    bad = add(pl, prefix, ".qweight", "I8", 2, N, K, q->data, (size_t)(N * K)) ||
                          add(pl, prefix, ".scales", "F32", 1, N, 0, q->scales, (size_t)N * 4);
                    pl->any_q8_layer |= sp->per_layer;
                } else {
                    const int64_t G = dsq_q4_groups(K);
                    bad = add(pl, prefix, ".qweight", "U8", 2, N, dsq_q4_ldq(K), q->data,
                              dsq_q4_q_bytes(N, K)) ||
                          add(pl, prefix, ".scales", "F16", 2, N, G, q->scales,
                              dsq_q4_scales_bytes(N, K)) ||
                          add(pl, prefix, ".zeros", "U8", 2, N, G, q->zeros, dsq_q4_zeros_bytes(N, K));
                    pl->any_q4 |= sp->per_layer;
                }
            } else {
                if ((sp->flags & DSQ_TF_HEAD) && cfg->tie_embeddings)
                    continue; /* the embedding */
                if (!t->data) {
                    if (sp->flags & DSQ_TF_OPTIONAL)
                        continue; /* an absent bias stays absent */
                    return dsq_fail(DSQ_ERR_UNSUPPORTED,
                                    "dsq_model_save: tensor '%s' is not on the host (only a model "
                                    "loaded with the CPU backend can be saved)",
                                    name);
                }
                const char *ds = dtype_str(t->dtype);
                if (!ds)
                    return dsq_fail(DSQ_ERR_INTERNAL, "dsq_model_save: tensor '%s' has dtype %s", name,
                                    dsq_dtype_name(t->dtype));
                bad = add(pl, name, "", ds, t->ndim, t->shape[0], t->ndim > 1 ? t->shape[1] : 0, t->data,
                          t->nbytes);
            }
            if (bad)
                return dsq_fail(DSQ_ERR_OUT_OF_MEMORY, "dsq_model_save: no memory for the tensor list");
        }
    }
    if (pl->any_q4 && pl->any_q8_layer)
        return dsq_fail(DSQ_ERR_UNSUPPORTED, "dsq_model_save: layers mix 4- and 8-bit weights; a "
                                             "dsqwen quantization_config names one bit width");
    return DSQ_OK;
}

static dsq_status io_fail(const char *path)
{
    return dsq_fail(DSQ_ERR_IO, "dsq_model_save: cannot write '%s': %s", path, strerror(errno));
}

static dsq_status write_safetensors(const char *path, const plan *pl)
{
    cJSON *h = cJSON_CreateObject(), *meta = cJSON_CreateObject();
    dsq_status st = DSQ_OK;
    char *text = NULL;
    FILE *f = NULL;
    if (!h || !meta || !cJSON_AddStringToObject(meta, "format", "pt") ||
        !cJSON_AddItemToObject(h, "__metadata__", meta)) {
        cJSON_Delete(meta);
        st = dsq_fail(DSQ_ERR_OUT_OF_MEMORY, "dsq_model_save: no memory for the header");
        goto done;
    }
    uint64_t off = 0;
    for (size_t i = 0; i < pl->n; i++) {
        const part *t = &pl->p[i];
        cJSON *e = cJSON_CreateObject();
        double shape[2] = { (double)t->shape[0], (double)t->shape[1] };
        double offs[2] = { (double)off, (double)(off + t->bytes) };
        cJSON *sh = cJSON_CreateDoubleArray(shape, t->ndim), *of = cJSON_CreateDoubleArray(offs, 2);
        int ok = e && sh && of && cJSON_AddStringToObject(e, "dtype", t->dtype) &&
                 cJSON_AddItemToObject(e, "shape", sh);
        if (ok)
            sh = NULL; /* owned by e */
        ok = ok && cJSON_AddItemToObject(e, "data_offsets", of);
        if (ok)
            of = NULL;
        ok = ok && cJSON_AddItemToObject(h, t->name, e);
        if (!ok) {
            cJSON_Delete(e);
            cJSON_Delete(sh);
            cJSON_Delete(of);
            st = dsq_fail(DSQ_ERR_OUT_OF_MEMORY, "dsq_model_save: no memory for the header");
            goto done;
        }
        off += t->bytes;
    }
    text = cJSON_PrintUnformatted(h);
    if (!text) {
        st = dsq_fail(DSQ_ERR_OUT_OF_MEMORY, "dsq_model_save: no memory for the header");
        goto done;
    }
    size_t hl = strlen(text), pad = (8 - hl % 8) % 8;
    uint64_t hlen = hl + pad;
    unsigned char le[8];
    for (int i = 0; i < 8; i++)
        le[i] = (unsigned char)(hlen >> (8 * i));
    f = fopen(path, "wb");
    if (!f || fwrite(le, 1, 8, f) != 8 || fwrite(text, 1, hl, f) != hl ||
        fwrite("        ", 1, pad, f) != pad) {
        st = io_fail(path);
        goto done;
    }
    for (size_t i = 0; i < pl->n; i++)
        if (pl->p[i].bytes && fwrite(pl->p[i].data, 1, pl->p[i].bytes, f) != pl->p[i].bytes) {
            st = io_fail(path);
            goto done;
        }
    if (fclose(f) != 0) {
        f = NULL;
        st = io_fail(path);
        goto done;
    }
    f = NULL;
done:
    if (f)
        fclose(f);
    free(text);
    cJSON_Delete(h);
    return st;
}

static dsq_status write_text(const char *path, const char *text, size_t len)
{
    FILE *f = fopen(path, "wb");
    if (!f)
        return io_fail(path);
    int ok = fwrite(text, 1, len, f) == len;
    ok &= fclose(f) == 0;
    return ok ? DSQ_OK : io_fail(path);
}

static dsq_status write_config(const dsq_model *m, const plan *pl, const char *out_dir)
{
    char *src = dsq_path_join(m->dir, "config.json"), *dst = dsq_path_join(out_dir, "config.json");
    char *text = NULL, *out = NULL;
    size_t len = 0;
    cJSON *root = NULL;
    dsq_status st = (!src || !dst) ? dsq_fail(DSQ_ERR_OUT_OF_MEMORY, "no memory for paths")
                                   : dsq_read_file(src, &text, &len);
    if (st != DSQ_OK)
        goto done;
    errno = 0; /* cJSON returns NULL for bad text and failed allocations alike */
    root = cJSON_ParseWithLength(text, len);
    if (!root && errno == ENOMEM) {
        st = dsq_fail(DSQ_ERR_OUT_OF_MEMORY, "no memory to parse '%s'", src);
        goto done;
    }
    if (!root) {
        st = dsq_fail(DSQ_ERR_FORMAT, "dsq_model_save: '%s' no longer parses", src);
        goto done;
    }
    cJSON_DeleteItemFromObjectCaseSensitive(root, "quantization_config");
    int ok = 1;
    if (m->cfg.tie_embeddings && dsq_weights_qslot(&m->w, 0, DSQ_GW_LM_HEAD, 0)) {
        /* a tied head quantized on its own is a head of its own now */
        cJSON_DeleteItemFromObjectCaseSensitive(root, "tie_word_embeddings");
        ok = cJSON_AddBoolToObject(root, "tie_word_embeddings", 0) != NULL;
    }
    if (ok && m->w.q && (pl->any_q4 || pl->any_q8_layer || m->w.q->head.data)) {
        cJSON *qc = cJSON_CreateObject();
        ok = qc && cJSON_AddItemToObject(root, "quantization_config", qc);
        if (!ok)
            cJSON_Delete(qc);
        const int q4 = pl->any_q4 || (!pl->any_q8_layer && m->w.q->head.format == DSQ_WF_Q4_G128);
        ok = ok && cJSON_AddStringToObject(qc, "quant_method", "dsqwen") &&
             cJSON_AddNumberToObject(qc, "version", 1) && cJSON_AddNumberToObject(qc, "bits", q4 ? 4 : 8) &&
             cJSON_AddNumberToObject(qc, "group_size", q4 ? 128 : -1) &&
             (!q4 || cJSON_AddBoolToObject(qc, "zero_point", 1));
    }
    if (!ok) {
        st = dsq_fail(DSQ_ERR_OUT_OF_MEMORY, "no memory for the config");
        goto done;
    }
    out = cJSON_Print(root);
    if (!out) {
        st = dsq_fail(DSQ_ERR_OUT_OF_MEMORY, "no memory for the config");
        goto done;
    }
    st = write_text(dst, out, strlen(out));
done:
    cJSON_Delete(root);
    free(out);
    free(text);
    free(src);
    free(dst);
    return st;
}

/* tokenizer*, generation_config.json, special_tokens_map.json of the source. */
static dsq_status copy_side_files(const char *from_dir, const char *out_dir)
{
    DIR *d = opendir(from_dir);
    if (!d)
        return DSQ_OK; /* a .safetensors path: nothing beside it is required */
    dsq_status st = DSQ_OK;
    struct dirent *e;
    while (st == DSQ_OK && (e = readdir(d)) != NULL) {
        const char *n = e->d_name;
        if (strncmp(n, "tokenizer", 9) != 0 && strcmp(n, "generation_config.json") != 0 &&
            strcmp(n, "special_tokens_map.json") != 0)
            continue;
        char *src = dsq_path_join(from_dir, n), *dst = dsq_path_join(out_dir, n);
        char *text = NULL;
        size_t len = 0;
        if (!src || !dst)
            st = dsq_fail(DSQ_ERR_OUT_OF_MEMORY, "no memory for paths");
        else if (dsq_is_dir(src))
            ; /* not a file */
        else if ((st = dsq_read_file(src, &text, &len)) == DSQ_OK)
            st = write_text(dst, text, len);
        free(text);
        free(src);
        free(dst);
    }
    closedir(d);
    return st;
}

DSQ_API dsq_status dsq_model_save(const dsq_model *m, const char *out_dir)
{
    dsq_clear_error();
    if (!m || !out_dir)
        return dsq_fail(DSQ_ERR_INVALID_ARG, "dsq_model_save: NULL argument");
    if (!m->cfg.arch || !m->w.layers || !m->dir)
        return dsq_fail(DSQ_ERR_INVALID_ARG, "dsq_model_save: the model has no weights");
    if (mkdir(out_dir, 0777) != 0 && errno != EEXIST)
        return dsq_fail(DSQ_ERR_IO, "dsq_model_save: cannot create '%s': %s", out_dir, strerror(errno));
    if (!dsq_is_dir(out_dir))
        return dsq_fail(DSQ_ERR_IO, "dsq_model_save: '%s' is not a directory", out_dir);
    /* never over the files the model may still be mapped from */
    char ra[PATH_MAX], rb[PATH_MAX];
    if (realpath(out_dir, ra) && realpath(m->dir, rb) && strcmp(ra, rb) == 0)
        return dsq_fail(DSQ_ERR_INVALID_ARG, "dsq_model_save: '%s' is the model's own directory",
                        out_dir);
    plan pl = { 0 };
    dsq_status st = build_plan(m, &pl);
    char *path = NULL;
    if (st == DSQ_OK) {
        path = dsq_path_join(out_dir, "model.safetensors");
        st = path ? write_safetensors(path, &pl)
                  : dsq_fail(DSQ_ERR_OUT_OF_MEMORY, "no memory for paths");
    }
    if (st == DSQ_OK)
        st = write_config(m, &pl, out_dir);
    if (st == DSQ_OK)
        st = copy_side_files(m->dir, out_dir);
    free(path);
    free(pl.p);
    return st;
}
