/*
 * tokenizer_decode.c - ids -> UTF-8 bytes, whole and streaming.
 *
 * Each id's bytes are precomputed at load (byte-level characters mapped back
 * to their bytes, added tokens as their content), so decoding is a copy.
 * The streaming decoder holds back only a trailing *incomplete but still
 * possibly valid* UTF-8 sequence (at most 3 bytes); bytes that can never
 * become valid are passed through at once, so the concatenation of what a
 * stream emits equals dsq_detokenize() of the same ids whenever that output
 * ends in a complete character.
 */
#include <stdlib.h>
#include <string.h>

#include "tokenizer_internal.h"

static int id_ok(const dsq_tokenizer *t, int32_t id)
{
    return id >= 0 && id < t->n_ids && (t->flags[id] & DSQ_TOKF_PRESENT);
}

static int skipped(const dsq_tokenizer *t, int32_t id, int skip_special)
{
    return skip_special && (t->flags[id] & DSQ_TOKF_SPECIAL);
}

DSQ_API dsq_status dsq_detokenize(const dsq_tokenizer *t, const int32_t *tokens, size_t n,
                                  int skip_special, char *text, size_t cap, size_t *len_out)
{
    dsq_clear_error();
    if (len_out) *len_out = 0;
    if (!t || !len_out || (!tokens && n) || (!text && cap))
        return dsq_fail(DSQ_ERR_INVALID_ARG, "dsq_detokenize: NULL tokenizer, tokens, text or len_out");
    size_t len = 0;
    for (size_t i = 0; i < n; i++) {
        if (!id_ok(t, tokens[i]))
            return dsq_fail(DSQ_ERR_TOKEN, "dsq_detokenize: token %zu has id %d, not a token of "
                            "this tokenizer (0..%d)", i, tokens[i], t->n_ids - 1);
        if (!skipped(t, tokens[i], skip_special)) len += t->dec_len[tokens[i]];
    }
    *len_out = len;
    size_t k = 0;
    for (size_t i = 0; i < n && k < cap; i++) {
        int32_t id = tokens[i];
        if (skipped(t, id, skip_special)) continue;
        size_t l = t->dec_len[id];
        if (l > cap - k) l = cap - k;
        memcpy(text + k, t->dec + t->dec_off[id], l);
        k += l;
    }
    if (len < cap) {
        text[len] = 0;
        return DSQ_OK;
    }
    return dsq_fail(DSQ_ERR_BUFFER_TOO_SMALL, "dsq_detokenize: %zu bytes + NUL needed, buffer holds %zu",
                    len, cap);
}

/* ---- streaming ---------------------------------------------------------------- */

struct dsq_detok_stream {
    const dsq_tokenizer *t;
    int skip_special;
    uint8_t held[4];   /* incomplete UTF-8 sequence waiting for its tail */
    size_t n_held;
};

/* How many of the last bytes of s[0..n) are the start of a UTF-8 sequence
 * that later bytes could still complete (0..3). */
static size_t incomplete_tail(const uint8_t *s, size_t n)
{
    for (size_t k = 1; k <= 3 && k <= n; k++) {
        uint8_t b = s[n - k];
        if ((b & 0xC0) == 0x80) continue; /* continuation byte: look further back */
        size_t need;
        uint8_t lo = 0x80, hi = 0xBF;
        if (b >= 0xC2 && b <= 0xDF) need = 2;
        else if (b >= 0xE0 && b <= 0xEF) {
            need = 3;
            if (b == 0xE0) lo = 0xA0;
            if (b == 0xED) hi = 0x9F;
        } else if (b >= 0xF0 && b <= 0xF4) {
            need = 4;
            if (b == 0xF0) lo = 0x90;
            if (b == 0xF4) hi = 0x8F;
        } else
            return 0;
        if (k >= need) return 0; /* complete (or too long: not ours to hold) */
        if (k >= 2 && (s[n - k + 1] < lo || s[n - k + 1] > hi)) return 0;
        return k;
    }
    return 0;
}

DSQ_API dsq_status dsq_detok_stream_new(const dsq_tokenizer *t, int skip_special,
                                        dsq_detok_stream **out)
{
    dsq_clear_error();
    if (out) *out = NULL;
    if (!t || !out) return dsq_fail(DSQ_ERR_INVALID_ARG, "dsq_detok_stream_new: NULL argument");
    dsq_detok_stream *s = calloc(1, sizeof *s);
    if (!s) return dsq_fail(DSQ_ERR_OUT_OF_MEMORY, "dsq_detok_stream_new: out of memory");
    s->t = t;
    s->skip_special = skip_special;
    *out = s;
    return DSQ_OK;
}

DSQ_API void dsq_detok_stream_free(dsq_detok_stream *s) { free(s); }

DSQ_API dsq_status dsq_detok_stream_push(dsq_detok_stream *s, int32_t token, char *text, size_t cap,
                                         size_t *len_out)
{
    dsq_clear_error();
    if (len_out) *len_out = 0;
    if (!s || !len_out || (!text && cap))
        return dsq_fail(DSQ_ERR_INVALID_ARG, "dsq_detok_stream_push: NULL argument");
    const dsq_tokenizer *t = s->t;
    if (!id_ok(t, token))
        return dsq_fail(DSQ_ERR_TOKEN, "dsq_detok_stream_push: id %d is not a token (0..%d)", token,
                        t->n_ids - 1);
    const uint8_t *tok = (const uint8_t *)t->dec + t->dec_off[token];
    size_t tl = skipped(t, token, s->skip_special) ? 0 : t->dec_len[token];
    size_t total = s->n_held + tl;

    /* The last (up to 3) bytes of held + token decide what is held next. */
    uint8_t last[7];
    size_t nl = 0;
    for (size_t i = total > 6 ? total - 6 : 0; i < total; i++)
        last[nl++] = i < s->n_held ? s->held[i] : tok[i - s->n_held];
    size_t tail = incomplete_tail(last, nl);
    size_t emit = total - tail;
    *len_out = emit;
    if (emit + 1 > cap)
        return dsq_fail(DSQ_ERR_BUFFER_TOO_SMALL,
                        "dsq_detok_stream_push: %zu bytes + NUL needed, buffer holds %zu", emit, cap);
    for (size_t i = 0; i < emit; i++)
        text[i] = (char)(i < s->n_held ? s->held[i] : tok[i - s->n_held]);
    text[emit] = 0;
    uint8_t nh[4] = {0};
    for (size_t i = 0; i < tail; i++) {
        size_t j = emit + i;
        nh[i] = j < s->n_held ? s->held[j] : tok[j - s->n_held];
    }
    memcpy(s->held, nh, tail);
    s->n_held = tail;
    return DSQ_OK;
}

DSQ_API dsq_status dsq_detok_stream_flush(dsq_detok_stream *s, char *text, size_t cap,
                                          size_t *len_out)
{
    dsq_clear_error();
    if (len_out) *len_out = 0;
    if (!s || !len_out || (!text && cap))
        return dsq_fail(DSQ_ERR_INVALID_ARG, "dsq_detok_stream_flush: NULL argument");
    /* What is held is one incomplete sequence: one U+FFFD, as a lossy
     * UTF-8 decoder would emit. */
    size_t emit = s->n_held ? 3 : 0;
    *len_out = emit;
    if (emit + 1 > cap)
        return dsq_fail(DSQ_ERR_BUFFER_TOO_SMALL,
                        "dsq_detok_stream_flush: %zu bytes + NUL needed, buffer holds %zu", emit, cap);
    memcpy(text, "\xEF\xBF\xBD", emit);
    text[emit] = 0;
    s->n_held = 0;
    return DSQ_OK;
}
