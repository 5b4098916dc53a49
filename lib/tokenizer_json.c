/*
 * tokenizer_json.c - tokenizer.json (Hugging Face `tokenizers` format) ->
 * struct dsq_tokenizer.  Only what Qwen2's byte-level BPE uses is accepted;
 * anything else is refused with DSQ_ERR_UNSUPPORTED naming the field, so a
 * tokenizer that would encode differently from HF is never loaded silently.
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "tokenizer_internal.h"

/* Ids above this are refused: the tables are dense in the id. */
#define MAX_TOKEN_ID (1 << 24)

/* ---- hashing ---------------------------------------------------------------- */

uint64_t dsq_tok_hash(const void *data, size_t len)
{
    /* FNV-1a: token texts are short, so a byte loop is fine */
    const uint8_t *p = data;
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < len; i++) {
        h ^= p[i];
        h *= 0x100000001b3ull;
    }
    return h ^ (h >> 29);
}

int32_t dsq_tok_vocab_find(const dsq_tokenizer *t, const char *s, size_t len)
{
    if (!t->vocab_slots) return -1;
    uint32_t i = (uint32_t)dsq_tok_hash(s, len) & t->vocab_mask;
    for (;;) {
        int32_t id = t->vocab_slots[i];
        if (id < 0) return -1;
        if (t->vocab_len[id] == len && !memcmp(t->text + t->vocab_off[id], s, len)) return id;
        i = (i + 1) & t->vocab_mask;
    }
}

/* ---- small JSON helpers ---------------------------------------------------------- */

static int is_null_or_absent(const cJSON *o) { return !o || cJSON_IsNull(o); }

/* Integer value of a JSON number in [0, MAX_TOKEN_ID), or -1. */
static int32_t json_id(const cJSON *o)
{
    if (!cJSON_IsNumber(o)) return -1;
    double v = o->valuedouble;
    if (!(v >= 0 && v < MAX_TOKEN_ID) || floor(v) != v) return -1;
    return (int32_t)v;
}

static int json_flag(const cJSON *o, const char *name, int def)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);
    if (cJSON_IsBool(v)) return cJSON_IsTrue(v);
    return def;
}

static const char *json_type(const cJSON *o)
{
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(o, "type");
    return cJSON_IsString(t) ? t->valuestring : NULL;
}

static int type_is(const cJSON *o, const char *want)
{
    const char *t = json_type(o);
    return t && !strcmp(t, want);
}

/* ---- model: vocab + merges ---------------------------------------------------------- */

static uint32_t pow2_at_least(size_t n)
{
    uint32_t c = 16;
    while (c < n) c <<= 1;
    return c;
}

/* Lay out the token texts of vocab and added tokens; builds text/flags. */
static dsq_status build_texts(dsq_tokenizer *t, const cJSON *vocab, const cJSON *added)
{
    int32_t max_id = -1, n_vocab = 0;
    size_t bytes = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, vocab) {
        int32_t id = json_id(e);
        if (id < 0)
            return dsq_fail(DSQ_ERR_FORMAT, "tokenizer.json: vocab entry '%.40s' has a bad id",
                            e->string ? e->string : "");
        if (id > max_id) max_id = id;
        bytes += strlen(e->string) + 1;
        n_vocab++;
    }
    if (n_vocab == 0) return dsq_fail(DSQ_ERR_FORMAT, "tokenizer.json: model.vocab is empty");
    cJSON_ArrayForEach(e, added) {
        int32_t id = json_id(cJSON_GetObjectItemCaseSensitive(e, "id"));
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(e, "content");
        if (id < 0 || !cJSON_IsString(c) || !c->valuestring[0])
            return dsq_fail(DSQ_ERR_FORMAT,
                            "tokenizer.json: added_tokens entry without a valid id and content");
        /* Matching cuts the input at these texts: they must be valid UTF-8
         * (a lone surrogate escape is not) so cuts fall between characters. */
        size_t cl = strlen(c->valuestring);
        if (dsq_utf8_valid_prefix((const uint8_t *)c->valuestring, cl) != cl)
            return dsq_fail(DSQ_ERR_FORMAT, "tokenizer.json: added token %d is not valid UTF-8", id);
        if (id > max_id) max_id = id;
        bytes += strlen(c->valuestring) + 1;
    }
    if (bytes >= UINT32_MAX) return dsq_fail(DSQ_ERR_FORMAT, "tokenizer.json: vocabulary too large");
    t->n_vocab = n_vocab;
    t->n_ids = max_id + 1;
    size_t n = (size_t)t->n_ids;
    t->text = malloc(bytes ? bytes : 1);
    t->text_off = calloc(n, sizeof *t->text_off);
    t->text_len = calloc(n, sizeof *t->text_len);
    t->vocab_off = calloc(n, sizeof *t->vocab_off);
    t->vocab_len = calloc(n, sizeof *t->vocab_len);
    t->flags = calloc(n, 1);
    if (!t->text || !t->text_off || !t->text_len || !t->vocab_off || !t->vocab_len || !t->flags)
        return dsq_fail(DSQ_ERR_OUT_OF_MEMORY, "tokenizer: out of memory for %d tokens", t->n_ids);

    uint32_t k = 0;
    cJSON_ArrayForEach(e, vocab) {
        int32_t id = json_id(e);
        if (t->flags[id] & DSQ_TOKF_PRESENT)
            return dsq_fail(DSQ_ERR_FORMAT, "tokenizer.json: vocab id %d is used twice", id);
        size_t l = strlen(e->string);
        memcpy(t->text + k, e->string, l + 1);
        t->text_off[id] = t->vocab_off[id] = k;
        t->text_len[id] = t->vocab_len[id] = (uint32_t)l;
        t->flags[id] = DSQ_TOKF_PRESENT | DSQ_TOKF_VOCAB;
        k += (uint32_t)l + 1;
    }

    /* Hash the vocab texts before added tokens can take over an id. */
    t->vocab_mask = pow2_at_least((size_t)n_vocab * 2) - 1;
    t->vocab_slots = malloc(((size_t)t->vocab_mask + 1) * sizeof *t->vocab_slots);
    if (!t->vocab_slots) return dsq_fail(DSQ_ERR_OUT_OF_MEMORY, "tokenizer: out of memory");
    memset(t->vocab_slots, 0xff, ((size_t)t->vocab_mask + 1) * sizeof *t->vocab_slots);
    for (int32_t id = 0; id < t->n_ids; id++) {
        if (!(t->flags[id] & DSQ_TOKF_PRESENT)) continue;
        const char *s = t->text + t->vocab_off[id];
        size_t l = t->vocab_len[id];
        uint32_t i = (uint32_t)dsq_tok_hash(s, l) & t->vocab_mask;
        while (t->vocab_slots[i] >= 0) {
            int32_t o = t->vocab_slots[i];
            if (t->vocab_len[o] == l && !memcmp(t->text + t->vocab_off[o], s, l))
                return dsq_fail(DSQ_ERR_FORMAT, "tokenizer.json: vocab token '%.40s' appears twice",
                                s);
            i = (i + 1) & t->vocab_mask;
        }
        t->vocab_slots[i] = id;
    }

    /* Added tokens: text = content (HF's id_to_token prefers added tokens). */
    int32_t n_added = cJSON_GetArraySize(added);
    t->added = calloc((size_t)(n_added > 0 ? n_added : 1), sizeof *t->added);
    if (!t->added) return dsq_fail(DSQ_ERR_OUT_OF_MEMORY, "tokenizer: out of memory");
    cJSON_ArrayForEach(e, added) {
        int32_t id = json_id(cJSON_GetObjectItemCaseSensitive(e, "id"));
        const char *c = cJSON_GetObjectItemCaseSensitive(e, "content")->valuestring;
        size_t l = strlen(c);
        dsq_tok_added *a = &t->added[t->n_added];
        a->content = t->text + k; /* points into the arena */
        memcpy(t->text + k, c, l + 1);
        a->len = l;
        a->id = id;
        a->special = (uint8_t)json_flag(e, "special", 0);
        a->single_word = (uint8_t)json_flag(e, "single_word", 0);
        a->lstrip = (uint8_t)json_flag(e, "lstrip", 0);
        a->rstrip = (uint8_t)json_flag(e, "rstrip", 0);
        a->normalized = (uint8_t)json_flag(e, "normalized", 1);
        t->n_added++;
        t->text_off[id] = k;
        t->text_len[id] = (uint32_t)l;
        if (t->flags[id] & DSQ_TOKF_ADDED)
            return dsq_fail(DSQ_ERR_FORMAT, "tokenizer.json: added token id %d is used twice", id);
        t->flags[id] |= DSQ_TOKF_PRESENT | DSQ_TOKF_ADDED | (a->special ? DSQ_TOKF_SPECIAL : 0);
        k += (uint32_t)l + 1;
    }
    return DSQ_OK;
}

/* Bytes emitted when decoding each id: byte-level characters go back to
 * their byte, anything else (added tokens, characters outside the byte
 * alphabet) is emitted as its own UTF-8. */
static dsq_status build_decoded(dsq_tokenizer *t)
{
    size_t n = (size_t)t->n_ids, bytes = 0;
    for (size_t id = 0; id < n; id++) bytes += t->text_len[id];
    t->dec = malloc(bytes ? bytes : 1);
    t->dec_off = calloc(n, sizeof *t->dec_off);
    t->dec_len = calloc(n, sizeof *t->dec_len);
    if (!t->dec || !t->dec_off || !t->dec_len)
        return dsq_fail(DSQ_ERR_OUT_OF_MEMORY, "tokenizer: out of memory");
    int16_t cp_byte[512];
    for (uint32_t cp = 0; cp < 512; cp++) cp_byte[cp] = (int16_t)dsq_tok_cp_to_byte(cp);
    uint32_t k = 0;
    for (size_t id = 0; id < n; id++) {
        const uint8_t *s = (const uint8_t *)t->text + t->text_off[id];
        size_t l = t->text_len[id];
        t->dec_off[id] = k;
        if (t->flags[id] & DSQ_TOKF_ADDED) {
            memcpy(t->dec + k, s, l);
            k += (uint32_t)l;
        } else {
            size_t i = 0;
            while (i < l) {
                uint32_t cp;
                size_t cl = dsq_utf8_next(s + i, l - i, &cp);
                if (cp < 512 && cp_byte[cp] >= 0) {
                    t->dec[k++] = (char)cp_byte[cp];
                } else {
                    memcpy(t->dec + k, s + i, cl);
                    k += (uint32_t)cl;
                }
                i += cl;
            }
        }
        t->dec_len[id] = k - t->dec_off[id];
        if (t->dec_len[id] > t->max_dec_len) t->max_dec_len = t->dec_len[id];
    }
    return DSQ_OK;
}

static dsq_status build_merges(dsq_tokenizer *t, const cJSON *merges)
{
    int32_t n = cJSON_GetArraySize(merges);
    t->merge_mask = pow2_at_least((size_t)(n > 0 ? n : 1) * 2) - 1;
    size_t cap = (size_t)t->merge_mask + 1;
    t->merge_key = malloc(cap * sizeof *t->merge_key);
    t->merge_rank = malloc(cap * sizeof *t->merge_rank);
    t->merge_out = malloc(cap * sizeof *t->merge_out);
    char *buf = NULL;
    size_t buf_cap = 0;
    if (!t->merge_key || !t->merge_rank || !t->merge_out)
        return dsq_fail(DSQ_ERR_OUT_OF_MEMORY, "tokenizer: out of memory for %d merges", n);
    memset(t->merge_key, 0xff, cap * sizeof *t->merge_key);

    uint32_t rank = 0;
    const cJSON *m;
    dsq_status st = DSQ_OK;
    cJSON_ArrayForEach(m, merges) {
        const char *a, *b;
        size_t la, lb;
        if (cJSON_IsString(m)) {
            /* "left right": exactly one space (HF splits on ' ' into 2 parts) */
            a = m->valuestring;
            const char *sp = strchr(a, ' ');
            if (!sp || strchr(sp + 1, ' ')) {
                st = dsq_fail(DSQ_ERR_FORMAT, "tokenizer.json: merge %u ('%.40s') is not 'a b'",
                              rank, a);
                break;
            }
            la = (size_t)(sp - a);
            b = sp + 1;
            lb = strlen(b);
        } else if (cJSON_IsArray(m) && cJSON_GetArraySize(m) == 2 &&
                   cJSON_IsString(cJSON_GetArrayItem(m, 0)) &&
                   cJSON_IsString(cJSON_GetArrayItem(m, 1))) {
            a = cJSON_GetArrayItem(m, 0)->valuestring;
            b = cJSON_GetArrayItem(m, 1)->valuestring;
            la = strlen(a);
            lb = strlen(b);
        } else {
            st = dsq_fail(DSQ_ERR_FORMAT,
                          "tokenizer.json: merge %u is neither \"a b\" nor [\"a\", \"b\"]", rank);
            break;
        }
        int32_t ia = dsq_tok_vocab_find(t, a, la), ib = dsq_tok_vocab_find(t, b, lb);
        if (ia < 0 || ib < 0) {
            st = dsq_fail(DSQ_ERR_FORMAT, "tokenizer.json: merge %u: '%.*s' is not in the vocab",
                          rank, (int)(ia < 0 ? (la > 40 ? 40 : la) : (lb > 40 ? 40 : lb)),
                          ia < 0 ? a : b);
            break;
        }
        if (la + lb > buf_cap) {
            buf_cap = (la + lb) * 2 + 64;
            char *nb = realloc(buf, buf_cap);
            if (!nb) {
                st = dsq_fail(DSQ_ERR_OUT_OF_MEMORY, "tokenizer: out of memory");
                break;
            }
            buf = nb;
        }
        memcpy(buf, a, la);
        memcpy(buf + la, b, lb);
        int32_t io = dsq_tok_vocab_find(t, buf, la + lb);
        if (io < 0) {
            st = dsq_fail(DSQ_ERR_FORMAT,
                          "tokenizer.json: merge %u: result '%.*s' is not in the vocab", rank,
                          (int)(la + lb > 40 ? 40 : la + lb), buf);
            break;
        }
        /* Insert; a repeated pair keeps its last rank, as HF's map does. */
        uint64_t key = ((uint64_t)(uint32_t)ia << 32) | (uint32_t)ib;
        uint32_t i = (uint32_t)((key * 0x9E3779B97F4A7C15ull) >> 32) & t->merge_mask;
        while (t->merge_key[i] != UINT64_MAX && t->merge_key[i] != key)
            i = (i + 1) & t->merge_mask;
        t->merge_key[i] = key;
        t->merge_rank[i] = rank;
        t->merge_out[i] = io;
        rank++;
    }
    free(buf);
    return st;
}

static dsq_status parse_model(dsq_tokenizer *t, const cJSON *model, const cJSON *added)
{
    if (!cJSON_IsObject(model))
        return dsq_fail(DSQ_ERR_FORMAT, "tokenizer.json: no \"model\" object");
    const char *type = json_type(model);
    if (type && strcmp(type, "BPE"))
        return dsq_fail(DSQ_ERR_UNSUPPORTED,
                        "tokenizer.json: model type '%s' is not supported (only BPE)", type);
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
    const cJSON *merges = cJSON_GetObjectItemCaseSensitive(model, "merges");
    if (!cJSON_IsObject(vocab)) return dsq_fail(DSQ_ERR_FORMAT, "tokenizer.json: no model.vocab object");
    if (!cJSON_IsArray(merges)) return dsq_fail(DSQ_ERR_FORMAT, "tokenizer.json: no model.merges array");

    const cJSON *o = cJSON_GetObjectItemCaseSensitive(model, "dropout");
    if (!is_null_or_absent(o) && !(cJSON_IsNumber(o) && o->valuedouble == 0))
        return dsq_fail(DSQ_ERR_UNSUPPORTED, "tokenizer.json: BPE dropout is not supported");
    const char *str_opts[] = {"continuing_subword_prefix", "end_of_word_suffix"};
    for (int i = 0; i < 2; i++) {
        o = cJSON_GetObjectItemCaseSensitive(model, str_opts[i]);
        if (!is_null_or_absent(o) && !(cJSON_IsString(o) && !o->valuestring[0]))
            return dsq_fail(DSQ_ERR_UNSUPPORTED, "tokenizer.json: BPE %s is not supported",
                            str_opts[i]);
    }
    if (json_flag(model, "byte_fallback", 0))
        return dsq_fail(DSQ_ERR_UNSUPPORTED, "tokenizer.json: BPE byte_fallback is not supported");
    t->ignore_merges = json_flag(model, "ignore_merges", 0);
    t->fuse_unk = json_flag(model, "fuse_unk", 0);

    if (!is_null_or_absent(added) && !cJSON_IsArray(added))
        return dsq_fail(DSQ_ERR_FORMAT, "tokenizer.json: added_tokens is not an array");
    dsq_status st = build_texts(t, vocab, cJSON_IsArray(added) ? added : NULL);
    if (st) return st;
    st = build_merges(t, merges);
    if (st) return st;

    t->unk_id = -1;
    o = cJSON_GetObjectItemCaseSensitive(model, "unk_token");
    if (cJSON_IsString(o)) t->unk_id = dsq_tok_vocab_find(t, o->valuestring, strlen(o->valuestring));

    for (int b = 0; b < 256; b++) {
        char u[4];
        size_t l = dsq_utf8_put(dsq_tok_byte_to_cp((uint8_t)b), u);
        t->byte_id[b] = dsq_tok_vocab_find(t, u, l);
    }
    return build_decoded(t);
}

/* ---- normalizer, pre-tokenizer, post-processor, decoder ----------------------------- */

static dsq_status parse_normalizer(dsq_tokenizer *t, const cJSON *n)
{
    if (is_null_or_absent(n)) return DSQ_OK;
    const char *type = json_type(n);
    if (type && !strcmp(type, "NFC")) {
        t->nfc = 1;
        return DSQ_OK;
    }
    if (type && !strcmp(type, "Sequence")) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(n, "normalizers"), *e;
        if (!cJSON_IsArray(list))
            return dsq_fail(DSQ_ERR_FORMAT, "tokenizer.json: normalizer Sequence without a list");
        cJSON_ArrayForEach(e, list) {
            dsq_status st = parse_normalizer(t, e);
            if (st) return st;
        }
        return DSQ_OK;
    }
    return dsq_fail(DSQ_ERR_UNSUPPORTED, "tokenizer.json: normalizer '%s' is not supported (only NFC)",
                    type ? type : "?");
}

static dsq_status parse_split(dsq_tokenizer *t, const cJSON *s)
{
    const cJSON *pat = cJSON_GetObjectItemCaseSensitive(s, "pattern");
    const cJSON *re = cJSON_GetObjectItemCaseSensitive(pat, "Regex");
    const cJSON *lit = cJSON_GetObjectItemCaseSensitive(pat, "String");
    const cJSON *beh = cJSON_GetObjectItemCaseSensitive(s, "behavior");
    if (!cJSON_IsString(re) && !cJSON_IsString(lit))
        return dsq_fail(DSQ_ERR_FORMAT, "tokenizer.json: Split pre-tokenizer without a pattern");
    if (!cJSON_IsString(beh) || strcmp(beh->valuestring, "Isolated") || json_flag(s, "invert", 0))
        return dsq_fail(DSQ_ERR_UNSUPPORTED,
                        "tokenizer.json: Split behavior '%s'%s is not supported (only Isolated)",
                        cJSON_IsString(beh) ? beh->valuestring : "?",
                        json_flag(s, "invert", 0) ? " with invert" : "");
    if (t->re)
        return dsq_fail(DSQ_ERR_UNSUPPORTED, "tokenizer.json: more than one Split pre-tokenizer");

    char *pattern = NULL;
    uint32_t opts = PCRE2_UTF | PCRE2_UCP; /* the pattern itself is UTF-checked */
    if (cJSON_IsString(re)) {
        dsq_status st = dsq_tok_rewrite_regex(re->valuestring, &pattern);
        if (st) return st;
    } else {
        pattern = strdup(lit->valuestring);
        if (!pattern) return dsq_fail(DSQ_ERR_OUT_OF_MEMORY, "tokenizer: out of memory");
        opts |= PCRE2_LITERAL;
        opts &= ~(uint32_t)PCRE2_UCP;
    }
    int err;
    PCRE2_SIZE off;
    t->re = pcre2_compile((PCRE2_SPTR)pattern, PCRE2_ZERO_TERMINATED, opts, &err, &off, NULL);
    free(pattern);
    if (!t->re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(err, msg, sizeof msg);
        if (err == PCRE2_ERROR_HEAP_FAILED)
            return dsq_fail(DSQ_ERR_OUT_OF_MEMORY, "tokenizer.json: pre-tokenizer regex: %s",
                            (const char *)msg);
        return dsq_fail(DSQ_ERR_UNSUPPORTED,
                        "tokenizer.json: pre-tokenizer regex does not compile with PCRE2 at %zu: %s",
                        (size_t)off, (const char *)msg);
    }
    t->re_jit = pcre2_jit_compile(t->re, PCRE2_JIT_COMPLETE) == 0;
    return DSQ_OK;
}

static dsq_status parse_pre_tokenizer(dsq_tokenizer *t, const cJSON *p)
{
    if (is_null_or_absent(p))
        return dsq_fail(DSQ_ERR_UNSUPPORTED, "tokenizer.json: no pre-tokenizer (ByteLevel needed)");
    const cJSON *list = NULL, *single[1] = {p};
    if (type_is(p, "Sequence")) {
        list = cJSON_GetObjectItemCaseSensitive(p, "pretokenizers");
        if (!cJSON_IsArray(list))
            return dsq_fail(DSQ_ERR_FORMAT, "tokenizer.json: pre-tokenizer Sequence without a list");
    }
    /* Qwen2: Split(regex, Isolated) then ByteLevel(use_regex false). */
    int n = list ? cJSON_GetArraySize(list) : 1, seen_bytelevel = 0;
    for (int i = 0; i < n; i++) {
        const cJSON *e = list ? cJSON_GetArrayItem(list, i) : single[0];
        const char *type = json_type(e);
        if (type && !strcmp(type, "Split") && !seen_bytelevel) {
            dsq_status st = parse_split(t, e);
            if (st) return st;
        } else if (type && !strcmp(type, "ByteLevel") && !seen_bytelevel) {
            if (json_flag(e, "add_prefix_space", 0))
                return dsq_fail(DSQ_ERR_UNSUPPORTED,
                                "tokenizer.json: ByteLevel add_prefix_space is not supported");
            if (json_flag(e, "use_regex", 1))
                return dsq_fail(DSQ_ERR_UNSUPPORTED,
                                "tokenizer.json: ByteLevel use_regex is not supported (Qwen2 "
                                "splits with its own Split regex)");
            seen_bytelevel = 1;
        } else {
            return dsq_fail(DSQ_ERR_UNSUPPORTED,
                            "tokenizer.json: pre-tokenizer '%s' is not supported here (expected "
                            "Split then ByteLevel)", type ? type : "?");
        }
    }
    if (!seen_bytelevel || !t->re)
        return dsq_fail(DSQ_ERR_UNSUPPORTED,
                        "tokenizer.json: pre-tokenizer must be Split(regex) then ByteLevel");
    return DSQ_OK;
}

/* Id of an added token or vocab entry by its text, or -1. */
static int32_t token_id(const dsq_tokenizer *t, const char *s)
{
    for (int32_t i = 0; i < t->n_added; i++)
        if (!strcmp(t->added[i].content, s)) return t->added[i].id;
    return dsq_tok_vocab_find(t, s, strlen(s));
}

static dsq_status parse_template(dsq_tokenizer *t, const cJSON *p)
{
    const cJSON *single = cJSON_GetObjectItemCaseSensitive(p, "single");
    const cJSON *specials = cJSON_GetObjectItemCaseSensitive(p, "special_tokens");
    if (!cJSON_IsArray(single))
        return dsq_fail(DSQ_ERR_FORMAT, "tokenizer.json: TemplateProcessing without \"single\"");
    int n = cJSON_GetArraySize(single), seen_a = 0;
    /* Each piece adds at most a few ids; count first to size the arrays. */
    size_t cap = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, single) {
        const cJSON *sp = cJSON_GetObjectItemCaseSensitive(e, "SpecialToken");
        if (sp) {
            const cJSON *id = cJSON_GetObjectItemCaseSensitive(sp, "id");
            const cJSON *def = cJSON_IsString(id)
                                   ? cJSON_GetObjectItemCaseSensitive(specials, id->valuestring)
                                   : NULL;
            const cJSON *ids = cJSON_GetObjectItemCaseSensitive(def, "ids");
            if (!cJSON_IsArray(ids))
                return dsq_fail(DSQ_ERR_FORMAT,
                                "tokenizer.json: post-processor special token '%s' has no ids",
                                cJSON_IsString(id) ? id->valuestring : "?");
            cap += (size_t)cJSON_GetArraySize(ids);
        }
    }
    free(t->tmpl_pre);
    free(t->tmpl_post);
    t->tmpl_pre = malloc((cap + 1) * sizeof(int32_t));
    t->tmpl_post = malloc((cap + 1) * sizeof(int32_t));
    t->n_tmpl_pre = t->n_tmpl_post = 0;
    if (!t->tmpl_pre || !t->tmpl_post) return dsq_fail(DSQ_ERR_OUT_OF_MEMORY, "tokenizer: out of memory");
    for (int i = 0; i < n; i++) {
        e = cJSON_GetArrayItem(single, i);
        const cJSON *sp = cJSON_GetObjectItemCaseSensitive(e, "SpecialToken");
        const cJSON *sq = cJSON_GetObjectItemCaseSensitive(e, "Sequence");
        if (sq) {
            const cJSON *id = cJSON_GetObjectItemCaseSensitive(sq, "id");
            if (!cJSON_IsString(id) || strcmp(id->valuestring, "A") || seen_a)
                return dsq_fail(DSQ_ERR_UNSUPPORTED,
                                "tokenizer.json: post-processor template must hold $A once");
            seen_a = 1;
        } else if (sp) {
            const cJSON *id = cJSON_GetObjectItemCaseSensitive(sp, "id");
            const cJSON *ids =
                cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(specials, id->valuestring), "ids");
            const cJSON *x;
            cJSON_ArrayForEach(x, ids) {
                int32_t v = json_id(x);
                if (v < 0 || v >= t->n_ids || !(t->flags[v] & DSQ_TOKF_PRESENT))
                    return dsq_fail(DSQ_ERR_FORMAT,
                                    "tokenizer.json: post-processor token id out of range");
                if (seen_a) t->tmpl_post[t->n_tmpl_post++] = v;
                else t->tmpl_pre[t->n_tmpl_pre++] = v;
            }
        } else {
            return dsq_fail(DSQ_ERR_FORMAT, "tokenizer.json: bad post-processor template piece");
        }
    }
    if (!seen_a)
        return dsq_fail(DSQ_ERR_UNSUPPORTED, "tokenizer.json: post-processor template lacks $A");
    return DSQ_OK;
}

static dsq_status parse_post_processor(dsq_tokenizer *t, const cJSON *p)
{
    if (is_null_or_absent(p)) return DSQ_OK;
    const char *type = json_type(p);
    if (type && !strcmp(type, "TemplateProcessing")) return parse_template(t, p);
    if (type && !strcmp(type, "ByteLevel")) return DSQ_OK; /* offsets only */
    if (type && !strcmp(type, "Sequence")) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(p, "processors"), *e;
        if (!cJSON_IsArray(list))
            return dsq_fail(DSQ_ERR_FORMAT, "tokenizer.json: post-processor Sequence without a list");
        cJSON_ArrayForEach(e, list) {
            dsq_status st = parse_post_processor(t, e);
            if (st) return st;
        }
        return DSQ_OK;
    }
    return dsq_fail(DSQ_ERR_UNSUPPORTED, "tokenizer.json: post-processor '%s' is not supported",
                    type ? type : "?");
}

static dsq_status parse_decoder(const cJSON *d)
{
    if (type_is(d, "ByteLevel")) return DSQ_OK;
    const char *type = is_null_or_absent(d) ? "none" : json_type(d);
    return dsq_fail(DSQ_ERR_UNSUPPORTED, "tokenizer.json: decoder '%s' is not supported (only ByteLevel)",
                    type ? type : "?");
}

/* NFC form of each normalized added token, first-byte tables. */
static dsq_status prepare_added(dsq_tokenizer *t)
{
    for (int32_t i = 0; i < t->n_added; i++) {
        dsq_tok_added *a = &t->added[i];
        a->match = a->content;
        a->match_len = a->len;
        if (a->normalized && t->nfc) {
            char *o;
            size_t ol;
            int owned;
            dsq_status st = dsq_tok_nfc(a->content, a->len, &o, &ol, &owned);
            if (st) return st;
            if (owned) {
                a->match = o;
                a->match_len = ol;
            }
        }
        uint8_t *fb = a->normalized ? t->first_byte_norm : t->first_byte_raw;
        fb[(uint8_t)a->match[0]] = 1;
    }
    dsq_status st = dsq_tok_trie_build(&t->trie_raw, t->added, t->n_added, 0);
    if (!st) st = dsq_tok_trie_build(&t->trie_norm, t->added, t->n_added, 1);
    return st;
}

dsq_status dsq_tok_from_json(dsq_tokenizer *t, const char *json, size_t len)
{
    t->bos = t->eos = t->unk_id = -1;
    errno = 0; /* cJSON returns NULL for bad text and failed allocations alike */
    cJSON *root = cJSON_ParseWithLength(json, len);
    if (!root && errno == ENOMEM) return dsq_fail(DSQ_ERR_OUT_OF_MEMORY, "no memory to parse tokenizer.json");
    if (!root) return dsq_fail(DSQ_ERR_FORMAT, "tokenizer.json: not valid JSON");
    dsq_status st = DSQ_OK;
    if (!cJSON_IsObject(root)) {
        st = dsq_fail(DSQ_ERR_FORMAT, "tokenizer.json: top level is not an object");
        goto done;
    }
    if ((st = parse_model(t, cJSON_GetObjectItemCaseSensitive(root, "model"),
                          cJSON_GetObjectItemCaseSensitive(root, "added_tokens"))))
        goto done;
    if ((st = parse_normalizer(t, cJSON_GetObjectItemCaseSensitive(root, "normalizer")))) goto done;
    if ((st = parse_pre_tokenizer(t, cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer"))))
        goto done;
    if ((st = parse_post_processor(t, cJSON_GetObjectItemCaseSensitive(root, "post_processor"))))
        goto done;
    if ((st = parse_decoder(cJSON_GetObjectItemCaseSensitive(root, "decoder")))) goto done;
    if ((st = prepare_added(t))) goto done;
    if (!is_null_or_absent(cJSON_GetObjectItemCaseSensitive(root, "truncation")))
        dsq_log(DSQ_LOG_WARN, "tokenizer.json: truncation settings are ignored");
    if (t->n_tmpl_pre > 0) t->bos = t->tmpl_pre[0];
done:
    cJSON_Delete(root);
    return st;
}

/* bos_token / eos_token: a string or {"content": string}. */
static int32_t config_token(const dsq_tokenizer *t, const cJSON *cfg, const char *name)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(cfg, name);
    if (cJSON_IsObject(v)) v = cJSON_GetObjectItemCaseSensitive(v, "content");
    if (!cJSON_IsString(v)) return -2;
    return token_id(t, v->valuestring);
}

dsq_status dsq_tok_read_config(dsq_tokenizer *t, const char *json, size_t len)
{
    errno = 0; /* cJSON returns NULL for bad text and failed allocations alike */
    cJSON *root = cJSON_ParseWithLength(json, len);
    if (!root && errno == ENOMEM)
        return dsq_fail(DSQ_ERR_OUT_OF_MEMORY, "no memory to parse tokenizer_config.json");
    if (!root) {
        dsq_log(DSQ_LOG_WARN, "tokenizer_config.json is not valid JSON; ignored");
        return DSQ_OK;
    }
    int32_t b = config_token(t, root, "bos_token"), e = config_token(t, root, "eos_token");
    if (b != -2) t->bos = b;
    if (e != -2) t->eos = e;
    cJSON_Delete(root);
    return DSQ_OK;
}

void dsq_tok_release(dsq_tokenizer *t)
{
    for (int32_t i = 0; i < t->n_added; i++)
        if (t->added[i].match && t->added[i].match != t->added[i].content) free(t->added[i].match);
    free(t->added);
    free(t->text);
    free(t->text_off);
    free(t->text_len);
    free(t->vocab_off);
    free(t->vocab_len);
    free(t->dec);
    free(t->dec_off);
    free(t->dec_len);
    free(t->flags);
    free(t->vocab_slots);
    free(t->merge_key);
    free(t->merge_rank);
    free(t->merge_out);
    free(t->tmpl_pre);
    free(t->tmpl_post);
    if (t->re) pcre2_code_free(t->re);
    dsq_tok_trie_free(&t->trie_raw);
    dsq_tok_trie_free(&t->trie_norm);
    memset(t, 0, sizeof *t);
}
