/*
 * tokenizer_encode.c - text -> ids, in HF `tokenizers` order:
 *
 *   1. added tokens whose `normalized` is false are cut out of the raw text
 *      (leftmost-longest, then single_word / lstrip / rstrip as HF applies
 *      them);
 *   2. each remaining segment is normalized (NFC) on its own, and added
 *      tokens with `normalized` true are cut out of the normalized text;
 *   3. each remaining piece is split by the pre-tokenizer regex (matches
 *      and the gaps between them are pieces: "Isolated"), and
 *   4. each piece goes through byte-level BPE;
 *   5. the post-processor template adds its ids around the result.
 */
#include <stdlib.h>
#include <string.h>

#include "tokenizer_internal.h"

typedef struct enc_ctx {
    const dsq_tokenizer *t;
    dsq_tok_scratch *s;
    pcre2_match_data *md;
    pcre2_match_context *mctx; /* only after the JIT stack ran out */
    pcre2_jit_stack *jstack;
    int plain;                 /* added tokens are plain text */
} enc_ctx;

/* ---- 3 + 4: regex split, BPE --------------------------------------------- */

static dsq_status regex_match(enc_ctx *c, const char *p, size_t n, size_t from, int *found)
{
    const dsq_tokenizer *t = c->t;
    for (;;) {
        int rc = pcre2_match(t->re, (PCRE2_SPTR)p, n, from, PCRE2_NO_UTF_CHECK, c->md, c->mctx);
        if (rc >= 0) {
            *found = 1;
            return DSQ_OK;
        }
        if (rc == PCRE2_ERROR_NOMATCH) {
            *found = 0;
            return DSQ_OK;
        }
        if (rc == PCRE2_ERROR_JIT_STACKLIMIT && !c->jstack) {
            /* Very long runs can outgrow the default 32 KiB JIT stack; give
             * this call its own (thread-safe: nothing is shared). */
            c->mctx = pcre2_match_context_create(NULL);
            c->jstack = pcre2_jit_stack_create(64 * 1024, 256 * 1024 * 1024, NULL);
            if (!c->mctx || !c->jstack)
                return dsq_fail(DSQ_ERR_OUT_OF_MEMORY, "tokenize: out of memory for the regex stack");
            pcre2_jit_stack_assign(c->mctx, NULL, c->jstack);
            continue;
        }
        PCRE2_UCHAR msg[128];
        pcre2_get_error_message(rc, msg, sizeof msg);
        if (rc == PCRE2_ERROR_NOMEMORY)
            return dsq_fail(DSQ_ERR_OUT_OF_MEMORY, "tokenize: pre-tokenizer regex: %s",
                            (const char *)msg);
        /* PCRE2's match/depth/heap limits and a JIT stack that even 256 MiB
         * does not satisfy: the tokenizer.json regex backtracks without
         * bound on this text.  The file is unusable for it, which is a
         * format problem of the file, not a library bug. */
        if (rc == PCRE2_ERROR_MATCHLIMIT || rc == PCRE2_ERROR_DEPTHLIMIT ||
            rc == PCRE2_ERROR_HEAPLIMIT || rc == PCRE2_ERROR_JIT_STACKLIMIT)
            return dsq_fail(DSQ_ERR_FORMAT,
                            "tokenize: the tokenizer.json pre-tokenizer regex is too costly on "
                            "this text (at byte %zu of a %zu-byte piece; PCRE2: %s)",
                            from, n, (const char *)msg);
        return dsq_fail(DSQ_ERR_INTERNAL, "tokenize: pre-tokenizer regex failed: %s",
                        (const char *)msg);
    }
}

static dsq_status pretokenize(enc_ctx *c, const char *p, size_t n)
{
    dsq_status st;
    size_t done = 0, from = 0; /* bytes emitted; where the next search starts */
    while (from < n) {
        int found;
        if ((st = regex_match(c, p, n, from, &found))) return st;
        if (!found) break;
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(c->md);
        size_t ms = ov[0], me = ov[1];
        if (me == ms) {
            /* An empty match splits nothing; step over one character.  One
             * at the very end ($, \z, \w+|$) has no character after it. */
            if (ms >= n) break;
            uint32_t cp;
            from = ms + dsq_utf8_next((const uint8_t *)p + ms, n - ms, &cp);
            continue;
        }
        if (ms > done && (st = dsq_tok_bpe(c->t, (const uint8_t *)p + done, ms - done, c->s)))
            return st;
        if ((st = dsq_tok_bpe(c->t, (const uint8_t *)p + ms, me - ms, c->s))) return st;
        done = from = me;
    }
    if (done < n) return dsq_tok_bpe(c->t, (const uint8_t *)p + done, n - done, c->s);
    return DSQ_OK;
}

/* ---- 1 + 2: added tokens --------------------------------------------------- */

typedef dsq_status (*segment_fn)(enc_ctx *c, const char *p, size_t n);

/* Longest added token of the set (normalized or not) matching at p[i..]:
 * a walk down that set's trie, so the cost is the match length, whatever
 * the number of added tokens. */
static const dsq_tok_added *match_at(const dsq_tokenizer *t, const char *p, size_t n, size_t i,
                                     int normalized)
{
    int32_t k = dsq_tok_trie_longest(normalized ? &t->trie_norm : &t->trie_raw, p + i, n - i);
    return k >= 0 ? &t->added[k] : NULL;
}

static int word_before(const char *p, size_t i)
{
    uint32_t cp;
    if (i == 0) return 0;
    dsq_utf8_prev((const uint8_t *)p, i, &cp);
    return dsq_tok_is_word_cp(cp);
}

static int word_after(const char *p, size_t n, size_t i)
{
    uint32_t cp;
    if (i >= n) return 0;
    dsq_utf8_next((const uint8_t *)p + i, n - i, &cp);
    return dsq_tok_is_word_cp(cp);
}

/* Split p[0..n) on the added tokens of one set; the segments in between go
 * to `segment`, each match becomes its id.  Mirrors HF's find_matches: the
 * matches are found leftmost-longest without regard to the flags, then a
 * single_word match inside a word is dropped, lstrip/rstrip widen a match
 * over the whitespace beside it. */
static dsq_status split_added(enc_ctx *c, const char *p, size_t n, int normalized,
                              segment_fn segment)
{
    const dsq_tokenizer *t = c->t;
    const uint8_t *first = normalized ? t->first_byte_norm : t->first_byte_raw;
    dsq_status st;
    size_t start_offset = 0, i = 0;
    while (i < n) {
        if (!first[(uint8_t)p[i]]) {
            i++;
            continue;
        }
        const dsq_tok_added *a = match_at(t, p, n, i, normalized);
        if (!a) {
            i++;
            continue;
        }
        size_t start = i, stop = i + a->match_len;
        i = stop;
        if (a->single_word && (word_before(p, start) || word_after(p, n, stop))) continue;
        if (a->lstrip) {
            size_t s = start;
            uint32_t cp;
            while (s > start_offset) {
                size_t l = dsq_utf8_prev((const uint8_t *)p, s, &cp);
                if (!dsq_tok_is_space_cp(cp)) break;
                s -= l;
            }
            start = s;
        }
        if (a->rstrip) {
            uint32_t cp;
            while (stop < n) {
                size_t l = dsq_utf8_next((const uint8_t *)p + stop, n - stop, &cp);
                if (!dsq_tok_is_space_cp(cp)) break;
                stop += l;
            }
        }
        if (start < start_offset) start = start_offset; /* overlap after an rstrip */
        if (start > start_offset && (st = segment(c, p + start_offset, start - start_offset)))
            return st;
        if ((st = dsq_tok_push(c->s, a->id))) return st;
        start_offset = stop;
        if (i < stop) i = stop;
    }
    if (start_offset < n) return segment(c, p + start_offset, n - start_offset);
    return DSQ_OK;
}

static int has_normalized_added(const dsq_tokenizer *t)
{
    for (int32_t k = 0; k < t->n_added; k++)
        if (t->added[k].normalized) return 1;
    return 0;
}

/* A segment of raw text between non-normalized added tokens. */
static dsq_status raw_segment(enc_ctx *c, const char *p, size_t n)
{
    const dsq_tokenizer *t = c->t;
    char *norm = (char *)p;
    size_t nn = n;
    int owned = 0;
    dsq_status st;
    if (t->nfc && (st = dsq_tok_nfc(p, n, &norm, &nn, &owned))) return st;
    if (!c->plain && has_normalized_added(t))
        st = split_added(c, norm, nn, 1, pretokenize);
    else
        st = pretokenize(c, norm, nn);
    if (owned) free(norm);
    return st;
}

dsq_status dsq_tok_encode(const dsq_tokenizer *t, const char *text, size_t len, int add_special,
                          int plain_special, dsq_tok_scratch *s)
{
    enc_ctx c = {.t = t, .s = s, .plain = plain_special};
    dsq_status st = DSQ_OK;
    if (add_special)
        for (int32_t i = 0; i < t->n_tmpl_pre && !st; i++) st = dsq_tok_push(s, t->tmpl_pre[i]);
    if (st) return st;
    if (len > 0) {
        c.md = pcre2_match_data_create_from_pattern(t->re, NULL);
        if (!c.md) return dsq_fail(DSQ_ERR_OUT_OF_MEMORY, "tokenize: out of memory");
        if (plain_special || t->n_added == 0)
            st = raw_segment(&c, text, len);
        else
            st = split_added(&c, text, len, 0, raw_segment);
        pcre2_match_data_free(c.md);
        if (c.mctx) pcre2_match_context_free(c.mctx);
        if (c.jstack) pcre2_jit_stack_free(c.jstack);
        if (st) return st;
    }
    if (add_special)
        for (int32_t i = 0; i < t->n_tmpl_post && !st; i++) st = dsq_tok_push(s, t->tmpl_post[i]);
    return st;
}
