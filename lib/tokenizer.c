/*
 * tokenizer.c - public entry points of the byte-level BPE tokenizer: load,
 * free, encode, and the per-token accessors.  See tokenizer_internal.h for
 * how the work is split across files.
 */
#include <stdlib.h>
#include <string.h>

#include "tokenizer_internal.h"

DSQ_API dsq_status dsq_tokenizer_load(const char *path, dsq_tokenizer **out)
{
    dsq_clear_error();
    if (out) *out = NULL;
    if (!path || !out) return dsq_fail(DSQ_ERR_INVALID_ARG, "dsq_tokenizer_load: NULL path or out");

    char *file = dsq_is_dir(path) ? dsq_path_join(path, "tokenizer.json") : strdup(path);
    char *json = NULL, *cfg = NULL, *cfg_path = NULL;
    size_t len = 0, cfg_len = 0;
    dsq_tokenizer *t = NULL;
    dsq_status st;
    if (!file) return dsq_fail(DSQ_ERR_OUT_OF_MEMORY, "dsq_tokenizer_load: out of memory");
    if ((st = dsq_read_file(file, &json, &len))) goto fail;
    if (!(t = calloc(1, sizeof *t))) {
        st = dsq_fail(DSQ_ERR_OUT_OF_MEMORY, "dsq_tokenizer_load: out of memory");
        goto fail;
    }
    if ((st = dsq_tok_from_json(t, json, len))) goto fail;
    free(json);
    json = NULL;

    /* tokenizer_config.json beside the file names BOS/EOS. */
    const char *slash = strrchr(file, '/');
    if (slash) {
        size_t dl = (size_t)(slash - file);
        cfg_path = malloc(dl + sizeof "/tokenizer_config.json");
        if (!cfg_path) {
            st = dsq_fail(DSQ_ERR_OUT_OF_MEMORY, "dsq_tokenizer_load: out of memory");
            goto fail;
        }
        memcpy(cfg_path, file, dl);
        strcpy(cfg_path + dl, "/tokenizer_config.json");
    } else if (!(cfg_path = strdup("tokenizer_config.json"))) {
        st = dsq_fail(DSQ_ERR_OUT_OF_MEMORY, "dsq_tokenizer_load: out of memory");
        goto fail;
    }
    if (dsq_file_exists(cfg_path)) {
        if ((st = dsq_read_file(cfg_path, &cfg, &cfg_len)) == DSQ_OK) {
            st = dsq_tok_read_config(t, cfg, cfg_len);
            free(cfg);
        }
        /* an unreadable or invalid config is not fatal; no memory is */
        if (st == DSQ_ERR_OUT_OF_MEMORY) goto fail;
        dsq_clear_error();
    }
    free(cfg_path);
    free(file);
    *out = t;
    return DSQ_OK;

fail:
    free(json);
    free(cfg_path);
    free(file);
    if (t) {
        dsq_tok_release(t);
        free(t);
    }
    return st;
}

DSQ_API void dsq_tokenizer_free(dsq_tokenizer *t)
{
    if (!t) return;
    dsq_tok_release(t);
    free(t);
}

DSQ_API dsq_status dsq_tokenize(const dsq_tokenizer *t, const char *text, size_t len, uint32_t flags,
                                int32_t *tokens, size_t cap, size_t *n_out)
{
    dsq_clear_error();
    if (n_out) *n_out = 0;
    if (!t || !n_out || (!text && len) || (!tokens && cap))
        return dsq_fail(DSQ_ERR_INVALID_ARG, "dsq_tokenize: NULL tokenizer, text, tokens or n_out");
    if (flags & ~(DSQ_TOKENIZE_ADD_SPECIAL | DSQ_TOKENIZE_PLAIN_SPECIAL))
        return dsq_fail(DSQ_ERR_INVALID_ARG, "dsq_tokenize: unknown flags 0x%x", flags);

    /* Invalid UTF-8 is repaired first (U+FFFD per maximal ill-formed
     * subsequence), as the text HF's Python binding would be given. */
    char *fixed = NULL;
    size_t valid = len ? dsq_utf8_valid_prefix((const uint8_t *)text, len) : 0;
    dsq_status st;
    if (valid < len) {
        if ((st = dsq_utf8_repair((const uint8_t *)text, len, &fixed, &len))) return st;
        text = fixed;
    }
    dsq_tok_scratch s = {0};
    st = dsq_tok_encode(t, text, len, (flags & DSQ_TOKENIZE_ADD_SPECIAL) != 0,
                        (flags & DSQ_TOKENIZE_PLAIN_SPECIAL) != 0, &s);
    free(fixed);
    if (st) {
        dsq_tok_scratch_free(&s);
        return st;
    }
    *n_out = s.n_ids;
    if (s.n_ids && cap) memcpy(tokens, s.ids, (s.n_ids < cap ? s.n_ids : cap) * sizeof *tokens);
    size_t n = s.n_ids;
    dsq_tok_scratch_free(&s);
    if (n > cap)
        return dsq_fail(DSQ_ERR_BUFFER_TOO_SMALL, "dsq_tokenize: %zu ids, buffer holds %zu", n, cap);
    return DSQ_OK;
}

DSQ_API int32_t dsq_tokenizer_n_tokens(const dsq_tokenizer *t) { return t ? t->n_ids : 0; }

DSQ_API int32_t dsq_tokenizer_token_id(const dsq_tokenizer *t, const char *text)
{
    if (!t || !text) return -1;
    /* added tokens first, as HF's token_to_id */
    for (int32_t i = 0; i < t->n_added; i++)
        if (!strcmp(t->added[i].content, text)) return t->added[i].id;
    return dsq_tok_vocab_find(t, text, strlen(text));
}

DSQ_API const char *dsq_token_text(const dsq_tokenizer *t, int32_t id)
{
    if (!t || id < 0 || id >= t->n_ids || !(t->flags[id] & DSQ_TOKF_PRESENT)) return NULL;
    return t->text + t->text_off[id];
}

DSQ_API int dsq_token_is_special(const dsq_tokenizer *t, int32_t id)
{
    if (!t || id < 0 || id >= t->n_ids) return 0;
    return (t->flags[id] & DSQ_TOKF_SPECIAL) != 0;
}

DSQ_API int32_t dsq_tokenizer_bos(const dsq_tokenizer *t) { return t ? t->bos : -1; }
DSQ_API int32_t dsq_tokenizer_eos(const dsq_tokenizer *t) { return t ? t->eos : -1; }
