/*
 * nonfinite_models.h - copies of the tiny test model with chosen bf16
 * weights overwritten so that K turns non-finite, and a runner that counts
 * the non-finite logits of every output row (header-only, static; tests).
 *
 * The safetensors header is read here with plain string search (the fixture
 * is ours and simple), independent of lib/safetensors.c.
 */
#ifndef DSQ_NONFINITE_MODELS_H
#define DSQ_NONFINITE_MODELS_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "st_writer.h"
#include "testutil.h"

/* bf16 bit patterns used by the tests */
#define MP_BF16_NAN 0x7fc0u
#define MP_BF16_MAX 0x7f7fu /* 3.3895e38, the largest finite bf16 */

static int mp_copy_file(const char *src, const char *dst)
{
    size_t len = 0;
    void *data = dsq_test_read(src, &len);
    if (!data)
        return -1;
    int rc = stw_write_bytes(dst, data, len);
    free(data);
    return rc;
}

/* A fresh directory holding config.json and model.safetensors of
 * tests/data/<model>; malloc'ed path (remove with stw_rmtree), NULL on
 * failure. */
static char *mp_copy_model(const char *model)
{
    char *dir = stw_mkdtemp();
    if (!dir)
        return NULL;
    static const char *const files[2] = { "config.json", "model.safetensors" };
    for (int i = 0; i < 2; i++) {
        char rel[256];
        snprintf(rel, sizeof rel, "%s/%s", model, files[i]);
        char *src = dsq_test_path(rel), *dst = stw_path(dir, files[i]);
        int rc = src && dst ? mp_copy_file(src, dst) : -1;
        free(src);
        free(dst);
        if (rc != 0) {
            stw_rmtree(dir);
            free(dir);
            return NULL;
        }
    }
    return dir;
}

/* Set elements [first, first+count) of BF16 tensor `name` in
 * dir/model.safetensors to the bit pattern `bits`.  0 on success. */
static int mp_set_bf16(const char *dir, const char *name, int64_t first, int64_t count,
                       uint16_t bits)
{
    char *path = stw_path(dir, "model.safetensors");
    size_t len = 0;
    uint8_t *f = path ? dsq_test_read(path, &len) : NULL;
    int rc = -1;
    if (!f || len < 8)
        goto out;
    uint64_t hlen = 0;
    for (int i = 0; i < 8; i++)
        hlen |= (uint64_t)f[i] << (8 * i);
    if (hlen > len - 8)
        goto out;
    char *hdr = malloc(hlen + 1);
    if (!hdr)
        goto out;
    memcpy(hdr, f + 8, hlen);
    hdr[hlen] = 0;
    char key[256];
    snprintf(key, sizeof key, "\"%s\"", name);
    const char *e = strstr(hdr, key);
    const char *end = e ? strchr(e, '}') : NULL;
    const char *dt = e ? strstr(e, "\"dtype\"") : NULL;
    const char *off = e ? strstr(e, "\"data_offsets\"") : NULL;
    unsigned long long a = 0, b = 0;
    if (end && dt && off && dt < end && off < end && strncmp(strchr(dt, ':') + 1, "\"BF16\"", 6) == 0 &&
        sscanf(strchr(off, '[') + 1, "%llu , %llu", &a, &b) == 2 &&
        (uint64_t)(first + count) * 2 <= b - a && 8 + hlen + b <= len) {
        uint8_t *p = f + 8 + hlen + a + (size_t)first * 2;
        for (int64_t i = 0; i < count; i++) {
            p[2 * i] = (uint8_t)(bits & 0xff);
            p[2 * i + 1] = (uint8_t)(bits >> 8);
        }
        rc = stw_write_bytes(path, f, len);
    }
    free(hdr);
out:
    free(f);
    free(path);
    return rc;
}

/* The corrupted variants of the tiny model the non-finite tests use:
 *   0 "clean"       unchanged
 *   1 "nan_bias"    layer 0 k_proj bias[3] = NaN
 *   2 "huge_k_row"  layer 0 k_proj weight row 3 = 3.39e38 everywhere: every
 *                   weight finite, but the product overflows, so K is
 *                   non-finite (Inf, and NaN after RoPE)
 * Returns the directory (as mp_copy_model) or NULL. */
enum { MP_CLEAN, MP_NAN_BIAS, MP_HUGE_K_ROW, MP_N_VARIANTS };
static const char *const mp_variant_name[MP_N_VARIANTS] = { "clean", "nan_bias", "huge_k_row" };

static char *mp_make_variant(int variant)
{
    char *dir = mp_copy_model("tiny");
    if (!dir)
        return NULL;
    int rc = 0;
    if (variant == MP_NAN_BIAS)
        rc = mp_set_bf16(dir, "model.layers.0.self_attn.k_proj.bias", 3, 1, MP_BF16_NAN);
    else if (variant == MP_HUGE_K_ROW)
        rc = mp_set_bf16(dir, "model.layers.0.self_attn.k_proj.weight", 3 * 512, 512, MP_BF16_MAX);
    if (rc != 0) {
        stw_rmtree(dir);
        free(dir);
        return NULL;
    }
    return dir;
}

/* Rows the runner produces: a 12-token prompt (all rows), then 3 decode
 * steps. */
enum { MP_PROMPT = 12, MP_STEPS = 3, MP_ROWS = MP_PROMPT + MP_STEPS };
enum { MP_VOCAB = 1000 }; /* vocab_size of tests/data/tiny (checked on load) */

/* Load dir with `backend`, run the prompt and the steps on one context
 * (kv_dtype, layout), and store in bad[MP_ROWS] how many of each row's
 * logits are non-finite (and in nan[MP_ROWS] how many are NaN).  Returns the
 * first failing status (load, ctx_new, prefill, decode), its message in
 * msg. */
static dsq_status mp_run(const char *dir, int backend, int kv_dtype, int layout, int *bad,
                         int *nan_count, char *msg, size_t msg_len)
{
    dsq_model_params mp = dsq_model_default_params();
    mp.backend = backend;
    mp.load_tokenizer = 0;
    mp.skip_finite_check = 1; /* the load-time scan would refuse the NaN-bias variant; this test is about the KV path */
    dsq_model *m = NULL;
    dsq_ctx *c = NULL;
    float *logits = NULL;
    msg[0] = 0;
    dsq_status st = dsq_model_load(dir, &mp, &m);
    if (st != DSQ_OK) {
        snprintf(msg, msg_len, "load: %s", dsq_last_error_message());
        return st;
    }
    dsq_model_info info;
    memset(&info, 0, sizeof info);
    info.struct_size = sizeof info;
    dsq_model_get_info(m, &info);
    const int nv = info.n_vocab;
    if (nv != MP_VOCAB) {
        snprintf(msg, msg_len, "the model's vocabulary is %d, not %d", nv, (int)MP_VOCAB);
        st = DSQ_ERR_INTERNAL;
        goto out;
    }
    dsq_ctx_params cp = dsq_ctx_default_params();
    cp.kv_dtype = kv_dtype;
    cp.kv_layout = layout;
    cp.max_seqs = 2;
    cp.max_context = 64;
    cp.max_batch_tokens = 32;
    cp.n_threads = 1;
    if (layout == DSQ_KV_PAGED)
        cp.kv_block_size = 5;
    st = dsq_ctx_new(m, &cp, &c);
    if (st != DSQ_OK) {
        snprintf(msg, msg_len, "ctx: %s", dsq_last_error_message());
        goto out;
    }
    logits = malloc(sizeof(float) * (size_t)nv * MP_ROWS);
    int32_t prompt[MP_PROMPT];
    for (int i = 0; i < MP_PROMPT; i++)
        prompt[i] = (int32_t)((i * 37 + 11) % nv);
    st = dsq_prefill(c, 0, prompt, MP_PROMPT, DSQ_LOGITS_ALL, logits);
    for (int s = 0; st == DSQ_OK && s < MP_STEPS; s++) {
        int32_t seq = 0, tok = (int32_t)((s * 101 + 7) % nv);
        st = dsq_decode_step(c, 1, &seq, &tok, logits + (size_t)(MP_PROMPT + s) * nv);
    }
    if (st != DSQ_OK) {
        snprintf(msg, msg_len, "run: %s", dsq_ctx_last_error(c));
        goto out;
    }
    for (int r = 0; r < MP_ROWS; r++) {
        bad[r] = nan_count[r] = 0;
        for (int i = 0; i < nv; i++) {
            float x = logits[(size_t)r * nv + i];
            bad[r] += !isfinite(x);
            nan_count[r] += isnan(x);
        }
    }
out:
    free(logits);
    dsq_ctx_free(c);
    dsq_model_free(m);
    return st;
}

#endif /* DSQ_NONFINITE_MODELS_H */
