/*
 * fuzz_tokenize_regex.c - dsq_tokenize() under adversarial pre-tokenizer
 * regexes: each input is a split regex and a text; the target builds a
 * small byte-level tokenizer.json around the regex, loads it and encodes the
 * text.
 *
 * Input: byte 0 = options, then the regex up to the first 0x00 byte, then
 * the text (any bytes).  Without a 0x00 the whole rest is the regex and a
 * fixed mixed-script text is encoded.  Options:
 *   bits 0-1  dsq_tokenize flags
 *   bit 2     NFC normalizer
 *   bit 3     added tokens: "<|s|>" (special), "ab" and "\u00e9"
 *             (normalized), "word" (single_word)
 *   bit 4     "<|s|>" also lstrip + rstrip
 *
 * The regex is prefixed with (*LIMIT_MATCH=200000) (see build_json).
 * Loading may refuse the regex (FORMAT / UNSUPPORTED, with a message).
 * Encoding may fail only with DSQ_ERR_FORMAT (regex engine limits, message
 * naming the regex).  An accepted encoding must: agree between the size
 * query and the real call, have ids in range, and, for valid UTF-8 without
 * NFC or whitespace-stripping tokens, decode back to the text byte for byte
 * (the pieces cover the text whatever the regex matched).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_util.h"
#include "tokenizer_internal.h"

static const char k_default_text[] =
    "Hello w\xc3\xb6rld, it's 2024!  aaab ab\n\n\tcafe\xcc\x81 \xe6\x97\xa5\xe6\x9c\xac "
    "<|s|>word words \xf0\x9f\x98\x80 ";

/* The model part (vocab of the 256 byte characters, ids = byte values, plus
 * "aa" "ab" "Ga"; three merges), built once. */
static const char *model_json(void)
{
    static char *cached;
    if (cached)
        return cached;
    fz_buf b = {0};
    fz_str(&b, "\"model\":{\"type\":\"BPE\",\"vocab\":{");
    for (int byte = 0; byte < 256; byte++) {
        char u[8];
        size_t l = dsq_utf8_put(dsq_tok_byte_to_cp((uint8_t)byte), u);
        fz_json_string(&b, u, l);
        char id[16];
        snprintf(id, sizeof id, ":%d,", byte);
        fz_str(&b, id);
    }
    fz_str(&b, "\"aa\":256,\"ab\":257,\"\xc4\xa0" "a\":258},"
               "\"merges\":[\"a a\",\"a b\",\"\xc4\xa0 a\"]}");
    if (b.oom)
        abort();
    return cached = b.p;
}

static char *build_json(uint8_t opts, const char *re, size_t re_len)
{
    fz_buf b = {0};
    fz_str(&b, "{\"version\":\"1.0\",\"added_tokens\":[");
    if (opts & 8) {
        fz_str(&b, (opts & 16) ? "{\"id\":300,\"content\":\"<|s|>\",\"special\":true,"
                                 "\"normalized\":false,\"lstrip\":true,\"rstrip\":true},"
                               : "{\"id\":300,\"content\":\"<|s|>\",\"special\":true,"
                                 "\"normalized\":false},");
        fz_str(&b, "{\"id\":301,\"content\":\"ab\",\"special\":false,\"normalized\":true},"
                   "{\"id\":302,\"content\":\"\xc3\xa9\",\"special\":false,\"normalized\":true},"
                   "{\"id\":303,\"content\":\"word\",\"special\":false,\"normalized\":false,"
                   "\"single_word\":true}");
    }
    fz_str(&b, "],\"normalizer\":");
    fz_str(&b, (opts & 4) ? "{\"type\":\"NFC\"}" : "null");
    fz_str(&b, ",\"pre_tokenizer\":{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\","
               "\"pattern\":{\"Regex\":");
    /* PCRE2's default match limit (10 million) lets one backtracking regex
     * take a good part of a second per input; a lower limit set inside the
     * pattern (a pattern may only lower it) reaches the same refusal path
     * sooner, so the fuzzer spends its time on new regexes instead. */
    static const char k_limit[] = "(*LIMIT_MATCH=200000)";
    fz_buf rx = {0};
    fz_str(&rx, k_limit);
    fz_put(&rx, re, re_len);
    if (rx.oom) {
        free(b.p);
        return NULL;
    }
    fz_json_string(&b, rx.p, rx.n);
    free(rx.p);
    fz_str(&b, "},\"behavior\":\"Isolated\",\"invert\":false},{\"type\":\"ByteLevel\","
               "\"add_prefix_space\":false,\"trim_offsets\":false,\"use_regex\":false}]},"
               "\"post_processor\":null,\"decoder\":{\"type\":\"ByteLevel\"},");
    fz_str(&b, model_json());
    fz_str(&b, "}");
    if (b.oom) {
        free(b.p);
        return NULL;
    }
    return b.p;
}

static void check_encode(const dsq_tokenizer *t, uint8_t opts, const char *text, size_t len)
{
    uint32_t flags = opts & 3u;
    size_t need = 0;
    dsq_status st = dsq_tokenize(t, text, len, flags, NULL, 0, &need);
    if (st == DSQ_ERR_FORMAT) {
        /* only the regex engine's limits may refuse a text, and say so */
        if (!strstr(dsq_last_error_message(), "regex") || need != 0)
            abort();
        return;
    }
    if (st != DSQ_OK && st != DSQ_ERR_BUFFER_TOO_SMALL)
        abort();
    if (len > 0 && need == 0)
        abort(); /* no post-processor: a non-empty text gives ids */
    int32_t *ids = (int32_t *)malloc((need ? need : 1) * sizeof *ids);
    if (!ids)
        return;
    size_t got = 0;
    st = dsq_tokenize(t, text, len, flags, ids, need, &got);
    if (st != DSQ_OK || got != need)
        abort();
    int32_t n_tok = dsq_tokenizer_n_tokens(t);
    for (size_t i = 0; i < got; i++)
        if (ids[i] < 0 || ids[i] >= n_tok || !dsq_token_text(t, ids[i]))
            abort();
    size_t dlen = 0;
    st = dsq_detokenize(t, ids, got, 0, NULL, 0, &dlen);
    if (st != DSQ_OK && st != DSQ_ERR_BUFFER_TOO_SMALL)
        abort();
    char *dec = (char *)malloc(dlen + 1);
    if (dec) {
        size_t d2 = 0;
        if (dsq_detokenize(t, ids, got, 0, dec, dlen + 1, &d2) != DSQ_OK || d2 != dlen)
            abort();
        int exact = !(opts & 4) && !((opts & 8) && (opts & 16)) &&
                    fz_utf8_valid((const uint8_t *)text, len) == len;
        if (exact && (dlen != len || memcmp(dec, text, len) != 0))
            abort();
        free(dec);
    }
    free(ids);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    uint8_t opts = data[0];
    const uint8_t *rest = data + 1;
    size_t n = size - 1;
    const uint8_t *nul = (const uint8_t *)memchr(rest, 0, n);
    size_t re_len = nul ? (size_t)(nul - rest) : n;

    char *json = build_json(opts, (const char *)rest, re_len);
    if (!json)
        return 0;
    dsq_tokenizer *t = (dsq_tokenizer *)calloc(1, sizeof *t);
    if (!t) {
        free(json);
        return 0;
    }
    size_t jlen = strlen(json);
    char *exact = fz_dupz(json, jlen); /* the loader's input: jlen + NUL bytes */
    free(json);
    if (!exact) {
        free(t);
        return 0;
    }
    dsq_status st = dsq_tok_from_json(t, exact, jlen);
    free(exact);
    if (st != DSQ_OK) {
        if (st == DSQ_ERR_INTERNAL || dsq_last_error_message()[0] == '\0')
            abort();
        dsq_tokenizer_free(t);
        return 0;
    }
    const char *src = nul ? (const char *)nul + 1 : k_default_text;
    size_t len = nul ? n - re_len - 1 : sizeof k_default_text - 1;
    char *text = fz_dup(src, len); /* exact size, no NUL */
    if (text) {
        check_encode(t, opts, text, len);
        free(text);
    }
    dsq_tokenizer_free(t);
    return 0;
}
