/* test_tokenizer.c - the byte-level BPE tokenizer against Hugging Face
 * `tokenizers`.  Expected ids and decodes come from
 * tests/data/tokenizer_vectors.json (tests/make_tokenizer_vectors.py runs HF
 * on tests/data/model/tokenizer.json); the three README vectors are the ones
 * /work/shared/model/README.md records from HF. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "testutil.h"

static dsq_tokenizer *g_tok;
static cJSON *g_vec;     /* the parsed vectors file */
static char *g_tok_path; /* tests/data/model/tokenizer.json */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- helpers ------------------------------------------------------------------- */

/* malloc'ed bytes of a hex string; *n its length */
static uint8_t *unhex(const char *h, size_t *n)
{
    size_t l = strlen(h) / 2;
    uint8_t *b = malloc(l + 1);
    for (size_t i = 0; i < l; i++) {
        unsigned v;
        sscanf(h + 2 * i, "%2x", &v);
        b[i] = (uint8_t)v;
    }
    b[l] = 0;
    *n = l;
    return b;
}

static int32_t *json_ids(const cJSON *a, size_t *n)
{
    *n = (size_t)cJSON_GetArraySize(a);
    int32_t *v = malloc((*n + 1) * sizeof *v);
    for (size_t i = 0; i < *n; i++) v[i] = (int32_t)cJSON_GetArrayItem(a, (int)i)->valuedouble;
    return v;
}

/* Encode; malloc'ed ids (NULL on error, status in *st). */
static int32_t *encode(const dsq_tokenizer *t, const void *text, size_t len, uint32_t flags,
                       size_t *n, dsq_status *st)
{
    size_t need = 0;
    dsq_status s = dsq_tokenize(t, text, len, flags, NULL, 0, &need);
    if (s != DSQ_OK && s != DSQ_ERR_BUFFER_TOO_SMALL) {
        *st = s;
        return NULL;
    }
    int32_t *ids = malloc((need + 1) * sizeof *ids);
    *st = dsq_tokenize(t, text, len, flags, ids, need, n);
    if (*st != DSQ_OK || *n != need) {
        free(ids);
        return NULL;
    }
    return ids;
}

static char *decode(const dsq_tokenizer *t, const int32_t *ids, size_t n, int skip, size_t *len)
{
    size_t need = 0;
    dsq_status st = dsq_detokenize(t, ids, n, skip, NULL, 0, &need);
    if (st != DSQ_OK && st != DSQ_ERR_BUFFER_TOO_SMALL) return NULL;
    char *s = malloc(need + 1);
    st = dsq_detokenize(t, ids, n, skip, s, need + 1, len);
    if (st != DSQ_OK) {
        free(s);
        return NULL;
    }
    return s;
}

static void print_ids(const char *what, const int32_t *v, size_t n)
{
    fprintf(stderr, "    %s (%zu):", what, n);
    for (size_t i = 0; i < n && i < 40; i++) fprintf(stderr, " %d", v[i]);
    fprintf(stderr, n > 40 ? " ...\n" : "\n");
}

/* Plain UTF-8 well-formedness (RFC 3629), written out independently of the
 * library's own checker. */
static int utf8_ok(const uint8_t *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        uint32_t c = s[i], need, cp;
        if (c < 0x80) { i++; continue; }
        if ((c & 0xE0) == 0xC0) need = 1, cp = c & 0x1F;
        else if ((c & 0xF0) == 0xE0) need = 2, cp = c & 0x0F;
        else if ((c & 0xF8) == 0xF0) need = 3, cp = c & 0x07;
        else return 0;
        for (uint32_t k = 1; k <= need; k++) {
            if (i + k >= n || (s[i + k] & 0xC0) != 0x80) return 0;
            cp = (cp << 6) | (s[i + k] & 0x3F);
        }
        static const uint32_t min[4] = {0, 0x80, 0x800, 0x10000};
        if (cp < min[need] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
        i += need + 1;
    }
    return 1;
}

static int same_ids(const int32_t *a, size_t na, const int32_t *b, size_t nb)
{
    return na == nb && (na == 0 || !memcmp(a, b, na * sizeof *a));
}

static void write_file(const char *path, const char *s)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    fputs(s, f);
    fclose(f);
}

/* ---- setup ---------------------------------------------------------------------- */

static int group_setup(void **state)
{
    (void)state;
    g_tok_path = dsq_test_path("model/tokenizer.json");
    double t0 = now_s();
    dsq_status st = dsq_tokenizer_load(g_tok_path, &g_tok);
    double t1 = now_s();
    if (st != DSQ_OK) {
        fprintf(stderr, "load %s: %s\n", g_tok_path, dsq_last_error_message());
        return -1;
    }
    printf("tokenizer load: %.1f ms (%s)\n", (t1 - t0) * 1e3, g_tok_path);
    char *vp = dsq_test_path("tokenizer_vectors.json");
    char *txt = dsq_test_read(vp, NULL);
    free(vp);
    if (!txt) return -1;
    g_vec = cJSON_Parse(txt);
    free(txt);
    return g_vec ? 0 : -1;
}

static int group_teardown(void **state)
{
    (void)state;
    dsq_tokenizer_free(g_tok);
    cJSON_Delete(g_vec);
    free(g_tok_path);
    return 0;
}

/* ---- tests ----------------------------------------------------------------------- */

static void test_readme_vectors(void **state)
{
    (void)state;
    static const struct {
        const char *text;
        int32_t ids[8];
        size_t n;
    } cases[] = {
        {"Hello world", {9707, 1879}, 2},
        {" Hello world", {21927, 1879}, 2},
        {"<｜begin▁of▁sentence｜><｜User｜>Hello, world!<｜Assistant｜>",
         {151646, 151644, 9707, 11, 1879, 0, 151645}, 7},
    };
    for (size_t c = 0; c < 3; c++) {
        size_t n;
        dsq_status st;
        int32_t *ids = encode(g_tok, cases[c].text, strlen(cases[c].text), 0, &n, &st);
        assert_non_null(ids);
        if (!same_ids(ids, n, cases[c].ids, cases[c].n)) {
            print_ids("got", ids, n);
            print_ids("want", cases[c].ids, cases[c].n);
        }
        assert_true(same_ids(ids, n, cases[c].ids, cases[c].n));
        free(ids);
    }
    assert_int_equal(dsq_tokenizer_bos(g_tok), 151646);
    assert_int_equal(dsq_tokenizer_eos(g_tok), 151643);
}

static void test_accessors(void **state)
{
    (void)state;
    const cJSON *acc = cJSON_GetObjectItem(g_vec, "accessors");
    assert_int_equal(dsq_tokenizer_n_tokens(g_tok),
                     (int32_t)cJSON_GetObjectItem(acc, "n_tokens")->valuedouble);
    const cJSON *p;
    cJSON_ArrayForEach(p, cJSON_GetObjectItem(acc, "id_to_token")) {
        int32_t id = (int32_t)cJSON_GetArrayItem(p, 0)->valuedouble;
        const char *want = cJSON_GetArrayItem(p, 1)->valuestring;
        const char *got = dsq_token_text(g_tok, id);
        assert_non_null(got);
        assert_string_equal(got, want);
        assert_int_equal(dsq_tokenizer_token_id(g_tok, want), id);
    }
    cJSON_ArrayForEach(p, cJSON_GetObjectItem(acc, "absent"))
        assert_int_equal(dsq_tokenizer_token_id(g_tok, p->valuestring), -1);
    assert_null(dsq_token_text(g_tok, -1));
    assert_null(dsq_token_text(g_tok, dsq_tokenizer_n_tokens(g_tok)));
    /* special flags as in tokenizer.json's added_tokens */
    assert_int_equal(dsq_token_is_special(g_tok, 151643), 1);
    assert_int_equal(dsq_token_is_special(g_tok, 151646), 1);
    assert_int_equal(dsq_token_is_special(g_tok, 151644), 0);
    assert_int_equal(dsq_token_is_special(g_tok, 151648), 0);
    assert_int_equal(dsq_token_is_special(g_tok, 9707), 0);
    assert_int_equal(dsq_token_is_special(g_tok, -5), 0);
}

static void test_vectors_encode(void **state)
{
    (void)state;
    const int32_t bos = (int32_t)cJSON_GetObjectItem(g_vec, "bos")->valuedouble;
    const cJSON *v;
    int n_vec = 0, bad = 0, n_invalid = 0;
    cJSON_ArrayForEach(v, cJSON_GetObjectItem(g_vec, "vectors")) {
        size_t len, nw, ng;
        uint8_t *text = unhex(cJSON_GetObjectItem(v, "hex")->valuestring, &len);
        int32_t *want = json_ids(cJSON_GetObjectItem(v, "ids"), &nw);
        n_invalid += !cJSON_GetObjectItem(v, "valid")->valueint;
        for (int mode = 0; mode < 3; mode++) {
            uint32_t flags = mode == 1 ? DSQ_TOKENIZE_ADD_SPECIAL
                             : mode == 2 ? DSQ_TOKENIZE_PLAIN_SPECIAL : 0;
            int32_t *exp = want;
            size_t ne = nw;
            int32_t *tmp = NULL;
            const cJSON *alt = cJSON_GetObjectItem(v, mode == 1 ? "ids_bos" : "ids_plain");
            if (mode > 0 && alt) {
                exp = tmp = json_ids(alt, &ne);
            } else if (mode == 1) {
                exp = tmp = malloc((nw + 1) * sizeof *tmp);
                tmp[0] = bos;
                memcpy(tmp + 1, want, nw * sizeof *want);
                ne = nw + 1;
            }
            dsq_status st;
            int32_t *got = encode(g_tok, text, len, flags, &ng, &st);
            if (!got || !same_ids(got, ng, exp, ne)) {
                if (bad < 10) {
                    fprintf(stderr, "  mismatch (flags %u) on hex %s\n", flags,
                            cJSON_GetObjectItem(v, "hex")->valuestring);
                    if (got) print_ids("got", got, ng);
                    else fprintf(stderr, "    error %d: %s\n", st, dsq_last_error_message());
                    print_ids("want", exp, ne);
                }
                bad++;
            }
            free(got);
            free(tmp);
        }
        free(want);
        free(text);
        n_vec++;
    }
    printf("encode: %d vectors (%d with invalid UTF-8) x 3 flag sets, %d mismatches\n", n_vec,
           n_invalid, bad);
    assert_true(n_vec >= 200);
    assert_true(n_invalid >= 10);
    assert_int_equal(bad, 0);
}

static void test_vectors_decode(void **state)
{
    (void)state;
    const cJSON *v;
    int bad = 0, roundtrip = 0;
    cJSON_ArrayForEach(v, cJSON_GetObjectItem(g_vec, "vectors")) {
        size_t nids, lw, lws, lin, lg;
        int32_t *ids = json_ids(cJSON_GetObjectItem(v, "ids"), &nids);
        const char *dh = cJSON_GetObjectItem(v, "decode")->valuestring;
        const cJSON *dsk = cJSON_GetObjectItem(v, "decode_skip");
        uint8_t *want = unhex(dh, &lw);
        uint8_t *want_skip = unhex(dsk ? dsk->valuestring : dh, &lws);
        uint8_t *in = unhex(cJSON_GetObjectItem(v, "hex")->valuestring, &lin);
        char *got = decode(g_tok, ids, nids, 0, &lg);
        if (!got || lg != lw || memcmp(got, want, lw)) {
            if (bad++ < 10) fprintf(stderr, "  decode mismatch on hex %s\n", dh);
        }
        free(got);
        got = decode(g_tok, ids, nids, 1, &lg);
        if (!got || lg != lws || memcmp(got, want_skip, lws)) {
            if (bad++ < 10) fprintf(stderr, "  decode(skip) mismatch on hex %s\n", dh);
        }
        free(got);
        /* Round trip of our own encoding when HF says the text survives
         * (valid UTF-8 already in NFC); otherwise the HF decode above is
         * the expectation. */
        if (lw == lin && !memcmp(want, in, lin)) {
            size_t n;
            dsq_status st;
            int32_t *mine = encode(g_tok, in, lin, 0, &n, &st);
            got = mine ? decode(g_tok, mine, n, 0, &lg) : NULL;
            if (!got || lg != lin || memcmp(got, in, lin)) {
                if (bad++ < 10) fprintf(stderr, "  round trip failed on hex %s\n", dh);
            }
            roundtrip++;
            free(got);
            free(mine);
        }
        free(ids);
        free(want);
        free(want_skip);
        free(in);
    }
    printf("decode: %d mismatches, %d exact round trips\n", bad, roundtrip);
    assert_int_equal(bad, 0);
    assert_true(roundtrip >= 150);
}

/* Streaming over every vector: the pieces concatenated + flush equal the
 * whole decode (which is valid UTF-8 for every vector). */
static void test_stream_decode(void **state)
{
    (void)state;
    const cJSON *v;
    int bad = 0;
    /* the documented bound: 64 bytes + the longest token */
    size_t max_tok = 0;
    for (int32_t id = 0; id < dsq_tokenizer_n_tokens(g_tok); id++) {
        size_t l = 0;
        if (dsq_token_text(g_tok, id)) dsq_detokenize(g_tok, &id, 1, 0, NULL, 0, &l);
        if (l > max_tok) max_tok = l;
    }
    size_t cap = 64 + max_tok;
    char *piece = malloc(cap);
    for (int skip = 0; skip < 2; skip++) {
        cJSON_ArrayForEach(v, cJSON_GetObjectItem(g_vec, "vectors")) {
            size_t nids, lw, lg;
            int32_t *ids = json_ids(cJSON_GetObjectItem(v, "ids"), &nids);
            char *want = decode(g_tok, ids, nids, skip, &lw);
            char *got = malloc(lw + 16);
            dsq_detok_stream *s;
            assert_int_equal(dsq_detok_stream_new(g_tok, skip, &s), DSQ_OK);
            lg = 0;
            for (size_t i = 0; i < nids; i++) {
                size_t l;
                assert_int_equal(dsq_detok_stream_push(s, ids[i], piece, cap, &l), DSQ_OK);
                assert_true(lg + l <= lw);
                memcpy(got + lg, piece, l);
                lg += l;
                /* every vector decodes to valid UTF-8, so every piece must
                 * be valid on its own: no character is ever cut */
                if (!utf8_ok((const uint8_t *)piece, l)) bad++;
            }
            size_t l;
            assert_int_equal(dsq_detok_stream_flush(s, piece, cap, &l), DSQ_OK);
            memcpy(got + lg, piece, l);
            lg += l;
            if (lg != lw || memcmp(got, want, lw)) bad++;
            dsq_detok_stream_free(s);
            free(got);
            free(want);
            free(ids);
        }
    }
    free(piece);
    printf("stream decode: %d mismatches (buffer %zu bytes)\n", bad, cap);
    assert_int_equal(bad, 0);

    /* A character split over tokens is held back until complete. */
    const char *txt = "你好";
    size_t n;
    dsq_status st;
    int32_t *ids = encode(g_tok, txt, strlen(txt), 0, &n, &st);
    assert_non_null(ids);
    free(ids);
    int32_t b_e4 = dsq_tokenizer_token_id(g_tok, "ä"); /* byte 0xE4 in byte-level form */
    int32_t b_bd = dsq_tokenizer_token_id(g_tok, "½"); /* byte 0xBD */
    int32_t b_a0 = dsq_tokenizer_token_id(g_tok, "ł"); /* byte 0xA0 */
    assert_true(b_e4 >= 0 && b_bd >= 0 && b_a0 >= 0);
    dsq_detok_stream *s;
    char out[80];
    size_t l;
    assert_int_equal(dsq_detok_stream_new(g_tok, 0, &s), DSQ_OK);
    assert_int_equal(dsq_detok_stream_push(s, b_e4, out, sizeof out, &l), DSQ_OK);
    assert_int_equal(l, 0);
    assert_int_equal(dsq_detok_stream_push(s, b_bd, out, sizeof out, &l), DSQ_OK);
    assert_int_equal(l, 0);
    /* too small a buffer: error, state unchanged */
    assert_int_equal(dsq_detok_stream_push(s, b_a0, out, 3, &l), DSQ_ERR_BUFFER_TOO_SMALL);
    assert_int_equal(l, 3);
    assert_int_equal(dsq_detok_stream_push(s, b_a0, out, sizeof out, &l), DSQ_OK);
    assert_int_equal(l, 3);
    assert_string_equal(out, "你"); /* E4 BD A0 */
    /* an incomplete tail is flushed as U+FFFD */
    assert_int_equal(dsq_detok_stream_push(s, b_e4, out, sizeof out, &l), DSQ_OK);
    assert_int_equal(l, 0);
    assert_int_equal(dsq_detok_stream_flush(s, out, sizeof out, &l), DSQ_OK);
    assert_int_equal(l, 3);
    assert_string_equal(out, "\xEF\xBF\xBD");
    assert_int_equal(dsq_detok_stream_flush(s, out, sizeof out, &l), DSQ_OK);
    assert_int_equal(l, 0);
    /* a held byte that can never complete is passed through as is */
    assert_int_equal(dsq_detok_stream_push(s, b_e4, out, sizeof out, &l), DSQ_OK);
    int32_t a = dsq_tokenizer_token_id(g_tok, "a");
    assert_int_equal(dsq_detok_stream_push(s, a, out, sizeof out, &l), DSQ_OK);
    assert_int_equal(l, 2);
    assert_memory_equal(out, "\xE4" "a", 2);
    assert_int_equal(dsq_detok_stream_push(s, -1, out, sizeof out, &l), DSQ_ERR_TOKEN);
    dsq_detok_stream_free(s);
    dsq_detok_stream_free(NULL);
}

static void test_plain_special(void **state)
{
    (void)state;
    const char *txt = "<｜User｜>hi<｜end▁of▁sentence｜><think>";
    size_t n, np;
    dsq_status st;
    int32_t *ids = encode(g_tok, txt, strlen(txt), 0, &n, &st);
    int32_t *plain = encode(g_tok, txt, strlen(txt), DSQ_TOKENIZE_PLAIN_SPECIAL, &np, &st);
    assert_non_null(ids);
    assert_non_null(plain);
    assert_int_equal(n, 4);
    assert_int_equal(ids[0], 151644);
    assert_int_equal(ids[2], 151643);
    assert_int_equal(ids[3], 151648);
    for (size_t i = 0; i < np; i++) assert_true(plain[i] < 151643);
    /* and the plain-text ids still decode to the text */
    size_t l;
    char *d = decode(g_tok, plain, np, 0, &l);
    assert_string_equal(d, txt);
    free(d);
    /* skip_special drops special tokens only, not the other added ones */
    d = decode(g_tok, ids, n, 1, &l);
    assert_string_equal(d, "<｜User｜>hi<think>");
    free(d);
    /* BOS from the post-processor with both flags */
    free(plain);
    plain = encode(g_tok, txt, strlen(txt), DSQ_TOKENIZE_PLAIN_SPECIAL | DSQ_TOKENIZE_ADD_SPECIAL,
                   &np, &st);
    assert_int_equal(plain[0], 151646);
    for (size_t i = 1; i < np; i++) assert_true(plain[i] < 151643);
    free(plain);
    free(ids);
}

static void test_invalid_utf8(void **state)
{
    (void)state;
    /* each maximal ill-formed subsequence -> U+FFFD (one for E2 82, three
     * for ED A0 80), then encoded like that text */
    static const struct {
        const char *bad, *fixed;
    } cases[] = {
        {"a\xff" "b", "a\xEF\xBF\xBD" "b"},
        {"\xe2\x82(", "\xEF\xBF\xBD("},
        {"\xed\xa0\x80", "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD"},
        {"\xf0\x9f\x98 ok", "\xEF\xBF\xBD ok"},
        {"\xc0\xaf", "\xEF\xBF\xBD\xEF\xBF\xBD"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        size_t n1, n2;
        dsq_status st;
        int32_t *a = encode(g_tok, cases[c].bad, strlen(cases[c].bad), 0, &n1, &st);
        int32_t *b = encode(g_tok, cases[c].fixed, strlen(cases[c].fixed), 0, &n2, &st);
        assert_non_null(a);
        assert_non_null(b);
        assert_true(same_ids(a, n1, b, n2));
        free(a);
        free(b);
    }
}

static void test_args_and_buffers(void **state)
{
    (void)state;
    size_t n = 99;
    int32_t ids[4];
    assert_int_equal(dsq_tokenize(NULL, "a", 1, 0, ids, 4, &n), DSQ_ERR_INVALID_ARG);
    assert_int_equal(dsq_tokenize(g_tok, NULL, 1, 0, ids, 4, &n), DSQ_ERR_INVALID_ARG);
    assert_int_equal(dsq_tokenize(g_tok, "a", 1, 0, ids, 4, NULL), DSQ_ERR_INVALID_ARG);
    assert_int_equal(dsq_tokenize(g_tok, "a", 1, 0x80, ids, 4, &n), DSQ_ERR_INVALID_ARG);
    assert_int_equal(dsq_tokenize(g_tok, NULL, 0, 0, ids, 4, &n), DSQ_OK);
    assert_int_equal(n, 0);
    assert_int_equal(dsq_tokenize(g_tok, "", 0, DSQ_TOKENIZE_ADD_SPECIAL, ids, 4, &n), DSQ_OK);
    assert_int_equal(n, 1);
    assert_int_equal(ids[0], 151646);
    const char *txt = "Hello, world!"; /* 4 ids */
    assert_int_equal(dsq_tokenize(g_tok, txt, strlen(txt), 0, ids, 2, &n), DSQ_ERR_BUFFER_TOO_SMALL);
    assert_int_equal(n, 4);
    assert_int_equal(dsq_tokenize(g_tok, txt, strlen(txt), 0, ids, 4, &n), DSQ_OK);
    assert_int_equal(n, 4);

    char buf[64];
    size_t l;
    assert_int_equal(dsq_detokenize(g_tok, ids, 4, 0, buf, 5, &l), DSQ_ERR_BUFFER_TOO_SMALL);
    assert_int_equal(l, strlen(txt));
    assert_int_equal(dsq_detokenize(g_tok, ids, 4, 0, buf, l, &l), DSQ_ERR_BUFFER_TOO_SMALL);
    assert_int_equal(dsq_detokenize(g_tok, ids, 4, 0, buf, l + 1, &l), DSQ_OK);
    assert_string_equal(buf, txt);
    int32_t badid[2] = {9707, 151665};
    assert_int_equal(dsq_detokenize(g_tok, badid, 2, 0, buf, sizeof buf, &l), DSQ_ERR_TOKEN);
    badid[1] = -1;
    assert_int_equal(dsq_detokenize(g_tok, badid, 2, 0, buf, sizeof buf, &l), DSQ_ERR_TOKEN);
    assert_int_equal(dsq_detokenize(g_tok, NULL, 1, 0, buf, sizeof buf, &l), DSQ_ERR_INVALID_ARG);
    assert_int_equal(dsq_detokenize(g_tok, ids, 0, 0, buf, sizeof buf, &l), DSQ_OK);
    assert_int_equal(l, 0);
    assert_string_equal(buf, "");
    dsq_tokenizer *t = (dsq_tokenizer *)1;
    assert_int_equal(dsq_tokenizer_load(NULL, &t), DSQ_ERR_INVALID_ARG);
    assert_int_equal(dsq_tokenizer_load("/nonexistent/tokenizer.json", &t), DSQ_ERR_IO);
    assert_null(t);
    dsq_tokenizer_free(NULL);
}

/* Loading through the directory finds tokenizer.json and its config. */
static void test_load_dir(void **state)
{
    (void)state;
    char *dir = dsq_test_path("model");
    dsq_tokenizer *t;
    assert_int_equal(dsq_tokenizer_load(dir, &t), DSQ_OK);
    assert_int_equal(dsq_tokenizer_n_tokens(t), dsq_tokenizer_n_tokens(g_tok));
    assert_int_equal(dsq_tokenizer_eos(t), 151643);
    dsq_tokenizer_free(t);
    free(dir);
}

/* Flags the shipped file does not use: the real file with some added tokens
 * changed, against HF on the same change. */
static void test_added_token_flags(void **state)
{
    (void)state;
    char *txt = dsq_test_read(g_tok_path, NULL);
    assert_non_null(txt);
    cJSON *base = cJSON_Parse(txt);
    free(txt);
    assert_non_null(base);
    const cJSON *var;
    int bad = 0, total = 0;
    cJSON_ArrayForEach(var, cJSON_GetObjectItem(g_vec, "variants")) {
        cJSON *j = cJSON_Duplicate(base, 1);
        const cJSON *p;
        cJSON_ArrayForEach(p, cJSON_GetObjectItem(var, "patch")) {
            int id = (int)cJSON_GetObjectItem(p, "id")->valuedouble;
            cJSON *at;
            cJSON_ArrayForEach(at, cJSON_GetObjectItem(j, "added_tokens")) {
                if ((int)cJSON_GetObjectItem(at, "id")->valuedouble != id) continue;
                const cJSON *f;
                cJSON_ArrayForEach(f, p) {
                    if (!strcmp(f->string, "id")) continue;
                    cJSON_ReplaceItemInObject(at, f->string, cJSON_Duplicate(f, 1));
                }
            }
        }
        char path[] = "/tmp/dsq_tok_variant_XXXXXX";
        int fd = mkstemp(path);
        assert_true(fd >= 0);
        close(fd);
        char *out = cJSON_PrintUnformatted(j);
        write_file(path, out);
        free(out);
        cJSON_Delete(j);
        dsq_tokenizer *t;
        dsq_status st = dsq_tokenizer_load(path, &t);
        unlink(path);
        assert_int_equal(st, DSQ_OK);
        const cJSON *v;
        cJSON_ArrayForEach(v, cJSON_GetObjectItem(var, "vectors")) {
            size_t len, nw, ng;
            uint8_t *text = unhex(cJSON_GetObjectItem(v, "hex")->valuestring, &len);
            int32_t *want = json_ids(cJSON_GetObjectItem(v, "ids"), &nw);
            int32_t *got = encode(t, text, len, 0, &ng, &st);
            if (!got || !same_ids(got, ng, want, nw)) {
                fprintf(stderr, "  variant mismatch on '%s'\n", (char *)text);
                if (got) print_ids("got", got, ng);
                print_ids("want", want, nw);
                bad++;
            }
            total++;
            free(got);
            free(want);
            free(text);
        }
        dsq_tokenizer_free(t);
    }
    cJSON_Delete(base);
    printf("added-token flag variants: %d vectors, %d mismatches\n", total, bad);
    assert_true(total >= 20);
    assert_int_equal(bad, 0);
}

/* ~1 MB of mixed text: correctness against HF's count and hash, and speed. */
static void test_bulk_and_speed(void **state)
{
    (void)state;
    const cJSON *bulk = cJSON_GetObjectItem(g_vec, "bulk");
    int repeat = (int)cJSON_GetObjectItem(bulk, "repeat")->valuedouble;
    size_t want_bytes = (size_t)cJSON_GetObjectItem(bulk, "bytes")->valuedouble;
    size_t want_n = (size_t)cJSON_GetObjectItem(bulk, "n_ids")->valuedouble;
    const char *want_hash = cJSON_GetObjectItem(bulk, "fnv1a64")->valuestring;

    /* unit = valid vector texts joined by "\n"; text = unit * repeat */
    size_t ucap = 1 << 16, ulen = 0;
    char *unit = malloc(ucap);
    const cJSON *v;
    int first = 1;
    cJSON_ArrayForEach(v, cJSON_GetObjectItem(g_vec, "vectors")) {
        if (!cJSON_GetObjectItem(v, "valid")->valueint) continue;
        size_t l;
        uint8_t *b = unhex(cJSON_GetObjectItem(v, "hex")->valuestring, &l);
        while (ulen + l + 2 > ucap) unit = realloc(unit, ucap *= 2);
        if (!first) unit[ulen++] = '\n';
        first = 0;
        memcpy(unit + ulen, b, l);
        ulen += l;
        free(b);
    }
    char *text = malloc(ulen * (size_t)repeat + 1);
    for (int r = 0; r < repeat; r++) memcpy(text + (size_t)r * ulen, unit, ulen);
    size_t len = ulen * (size_t)repeat;
    free(unit);
    assert_int_equal(len, want_bytes);

    size_t n;
    dsq_status st;
    double t0 = now_s();
    int32_t *ids = encode(g_tok, text, len, 0, &n, &st);
    double t1 = now_s();
    assert_non_null(ids);
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++)
        for (int k = 0; k < 4; k++) {
            h ^= ((uint32_t)ids[i] >> (8 * k)) & 0xff;
            h *= 0x100000001b3ull;
        }
    char hs[17];
    snprintf(hs, sizeof hs, "%016llx", (unsigned long long)h);
    /* the query call + the real call both encode: half the time is one pass */
    printf("encode %.2f MB mixed text: %.1f ms (%.1f MB/s), %zu ids (HF %zu), hash %s (HF %s)\n",
           len / 1e6, (t1 - t0) * 1e3 / 2, len / 1e6 / ((t1 - t0) / 2), n, want_n, hs, want_hash);
    assert_int_equal(n, want_n);
    assert_string_equal(hs, want_hash);

    size_t l;
    t0 = now_s();
    char *back = decode(g_tok, ids, n, 0, &l);
    t1 = now_s();
    printf("decode %zu ids: %.1f ms\n", n, (t1 - t0) * 1e3);
    free(back);
    free(ids);

    /* pathological single pieces: long runs of one class */
    static const char *runs[] = {" ", "a", "7", "!", "\n", "界", "\xCC\x81"};
    size_t rl = 1 << 18;
    char *r = malloc(rl * 3 + 2);
    for (size_t k = 0; k < sizeof runs / sizeof *runs; k++) {
        size_t cl = strlen(runs[k]), m = 0;
        for (size_t i = 0; i + cl <= rl; i += cl) memcpy(r + m, runs[k], cl), m += cl;
        r[m++] = 'x';
        t0 = now_s();
        ids = encode(g_tok, r, m, 0, &n, &st);
        t1 = now_s();
        if (!ids) fprintf(stderr, "  run error: %s\n", dsq_last_error_message());
        assert_non_null(ids);
        printf("run of %zu x U+%04X-ish (%zu bytes): %zu ids, %.1f ms\n", m / cl, (unsigned)(uint8_t)runs[k][0],
               m, n, (t1 - t0) * 1e3 / 2);
        free(ids);
    }
    free(r);
    free(text);
}

/* Many threads encode the vectors at once and agree with one thread. */
typedef struct thr_arg {
    int bad;
} thr_arg;

static void *thr_main(void *p)
{
    thr_arg *a = p;
    for (int rep = 0; rep < 2; rep++) {
        const cJSON *v;
        cJSON_ArrayForEach(v, cJSON_GetObjectItem(g_vec, "vectors")) {
            size_t len, nw, ng;
            uint8_t *text = unhex(cJSON_GetObjectItem(v, "hex")->valuestring, &len);
            int32_t *want = json_ids(cJSON_GetObjectItem(v, "ids"), &nw);
            dsq_status st;
            int32_t *got = encode(g_tok, text, len, 0, &ng, &st);
            if (!got || !same_ids(got, ng, want, nw)) a->bad++;
            free(got);
            free(want);
            free(text);
        }
    }
    return NULL;
}

static void test_threads(void **state)
{
    (void)state;
    enum { N = 4 };
    pthread_t th[N];
    thr_arg args[N] = {{0}};
    for (int i = 0; i < N; i++) assert_int_equal(pthread_create(&th[i], NULL, thr_main, &args[i]), 0);
    int bad = 0;
    for (int i = 0; i < N; i++) {
        pthread_join(th[i], NULL);
        bad += args[i].bad;
    }
    assert_int_equal(bad, 0);
}

/* ---- malformed / unsupported tokenizer.json ------------------------------------------- */

/* A tiny valid byte-level BPE file: the 256 byte characters + "ab", "abc". */
static char *tiny_json(const char *merges, const char *normalizer, const char *pre,
                       const char *model_type, const char *decoder)
{
    size_t cap = 65536;
    char *s = malloc(cap);
    size_t k = 0;
    k += (size_t)snprintf(s + k, cap - k, "{\"version\":\"1.0\",\"added_tokens\":[{\"id\":259,"
                          "\"content\":\"<eos>\",\"special\":true,\"normalized\":false}],"
                          "\"normalizer\":%s,\"pre_tokenizer\":%s,\"post_processor\":null,"
                          "\"decoder\":%s,\"model\":{\"type\":\"%s\",\"vocab\":{",
                          normalizer, pre, decoder, model_type);
    for (int b = 0; b < 256; b++) {
        int cp = b;
        if (!((b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE))) {
            int n = 0;
            for (int i = 0; i < b; i++)
                if (!((i >= 0x21 && i <= 0x7E) || (i >= 0xA1 && i <= 0xAC) || (i >= 0xAE))) n++;
            cp = 256 + n;
        }
        char u[8];
        int ul;
        if (cp < 0x80) u[0] = (char)cp, ul = 1;
        else u[0] = (char)(0xC0 | (cp >> 6)), u[1] = (char)(0x80 | (cp & 63)), ul = 2;
        if (cp == '"' || cp == '\\') k += (size_t)snprintf(s + k, cap - k, "\"\\%c\":%d,", cp, b);
        else k += (size_t)snprintf(s + k, cap - k, "\"%.*s\":%d,", ul, u, b);
    }
    k += (size_t)snprintf(s + k, cap - k, "\"ab\":256,\"abc\":257,\"bc\":258},\"merges\":%s}}", merges);
    return s;
}

#define QWEN_PRE \
    "{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":{\"Regex\":" \
    "\"\\\\s+|\\\\p{L}+|\\\\p{N}|[^\\\\s\\\\p{L}\\\\p{N}]+\"},\"behavior\":\"Isolated\"," \
    "\"invert\":false},{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"trim_offsets\":false," \
    "\"use_regex\":false}]}"
#define BL_DEC "{\"type\":\"ByteLevel\"}"

static dsq_status load_text(const char *json, dsq_tokenizer **t)
{
    char path[] = "/tmp/dsq_tok_bad_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    write_file(path, json);
    dsq_status st = dsq_tokenizer_load(path, t);
    unlink(path);
    return st;
}

static void expect_load(const char *json, dsq_status want, const char *what)
{
    dsq_tokenizer *t = (dsq_tokenizer *)1;
    dsq_status st = load_text(json, &t);
    printf("  %-28s -> %s: %s\n", what, dsq_status_string(st), dsq_last_error_message());
    assert_int_equal(st, want);
    if (st != DSQ_OK) assert_null(t);
    dsq_tokenizer_free(st == DSQ_OK ? t : NULL);
}

static void test_malformed(void **state)
{
    (void)state;
    char *j;
    /* valid tiny files, both merge formats, give the same encoding */
    const char *both[] = {"[\"a b\",\"ab c\"]", "[[\"a\",\"b\"],[\"ab\",\"c\"]]"};
    for (int f = 0; f < 2; f++) {
        j = tiny_json(both[f], "{\"type\":\"NFC\"}", QWEN_PRE, "BPE", BL_DEC);
        dsq_tokenizer *t;
        assert_int_equal(load_text(j, &t), DSQ_OK);
        free(j);
        int32_t ids[16];
        size_t n;
        assert_int_equal(dsq_tokenize(t, "abc abx<eos>", 12, 0, ids, 16, &n), DSQ_OK);
        /* pieces "abc", " ", "abx", then the added token */
        assert_int_equal(n, 5);
        assert_int_equal(ids[0], 257);
        assert_int_equal(ids[1], ' ');
        assert_int_equal(ids[2], 256);
        assert_int_equal(ids[3], 'x');
        assert_int_equal(ids[4], 259);
        assert_int_equal(dsq_tokenizer_eos(t), -1);
        dsq_tokenizer_free(t);
    }
    expect_load("", DSQ_ERR_FORMAT, "empty file");
    expect_load("{\"model\": {", DSQ_ERR_FORMAT, "truncated JSON");
    expect_load("not json at all", DSQ_ERR_FORMAT, "not JSON");
    expect_load("[1,2,3]", DSQ_ERR_FORMAT, "array at top level");
    expect_load("{\"normalizer\":null}", DSQ_ERR_FORMAT, "missing model");
    j = tiny_json("[]", "null", QWEN_PRE, "WordPiece", BL_DEC);
    expect_load(j, DSQ_ERR_UNSUPPORTED, "model type WordPiece");
    free(j);
    j = tiny_json("[\"a zz\"]", "null", QWEN_PRE, "BPE", BL_DEC);
    expect_load(j, DSQ_ERR_FORMAT, "merge of unknown token");
    free(j);
    j = tiny_json("[\"a c\"]", "null", QWEN_PRE, "BPE", BL_DEC);
    expect_load(j, DSQ_ERR_FORMAT, "merge result not in vocab");
    free(j);
    j = tiny_json("[\"abc\"]", "null", QWEN_PRE, "BPE", BL_DEC);
    expect_load(j, DSQ_ERR_FORMAT, "merge without a space");
    free(j);
    j = tiny_json("[\"a b c\"]", "null", QWEN_PRE, "BPE", BL_DEC);
    expect_load(j, DSQ_ERR_FORMAT, "merge with two spaces");
    free(j);
    j = tiny_json("[[\"a\"]]", "null", QWEN_PRE, "BPE", BL_DEC);
    expect_load(j, DSQ_ERR_FORMAT, "merge pair of one");
    free(j);
    j = tiny_json("[7]", "null", QWEN_PRE, "BPE", BL_DEC);
    expect_load(j, DSQ_ERR_FORMAT, "merge is a number");
    free(j);
    j = tiny_json("{}", "null", QWEN_PRE, "BPE", BL_DEC);
    expect_load(j, DSQ_ERR_FORMAT, "merges not an array");
    free(j);
    j = tiny_json("[]", "{\"type\":\"NFKC\"}", QWEN_PRE, "BPE", BL_DEC);
    expect_load(j, DSQ_ERR_UNSUPPORTED, "normalizer NFKC");
    free(j);
    j = tiny_json("[]", "null", "null", "BPE", BL_DEC);
    expect_load(j, DSQ_ERR_UNSUPPORTED, "no pre-tokenizer");
    free(j);
    j = tiny_json("[]", "null", "{\"type\":\"Whitespace\"}", "BPE", BL_DEC);
    expect_load(j, DSQ_ERR_UNSUPPORTED, "pre-tokenizer Whitespace");
    free(j);
    j = tiny_json("[]", "null",
                  "{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"use_regex\":true}", "BPE",
                  BL_DEC);
    expect_load(j, DSQ_ERR_UNSUPPORTED, "ByteLevel use_regex");
    free(j);
    j = tiny_json("[]", "null",
                  "{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":"
                  "{\"Regex\":\"(?i)a\"},\"behavior\":\"Isolated\",\"invert\":false},"
                  "{\"type\":\"ByteLevel\",\"use_regex\":false}]}",
                  "BPE", BL_DEC);
    expect_load(j, DSQ_ERR_UNSUPPORTED, "regex with (?i) flag");
    free(j);
    j = tiny_json("[]", "null",
                  "{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":"
                  "{\"Regex\":\"(a\"},\"behavior\":\"Isolated\",\"invert\":false},"
                  "{\"type\":\"ByteLevel\",\"use_regex\":false}]}",
                  "BPE", BL_DEC);
    expect_load(j, DSQ_ERR_FORMAT, "unbalanced regex");
    free(j);
    j = tiny_json("[]", "null",
                  "{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":"
                  "{\"Regex\":\"a\"},\"behavior\":\"Removed\",\"invert\":false},"
                  "{\"type\":\"ByteLevel\",\"use_regex\":false}]}",
                  "BPE", BL_DEC);
    expect_load(j, DSQ_ERR_UNSUPPORTED, "Split behavior Removed");
    free(j);
    j = tiny_json("[]", "null", QWEN_PRE, "BPE", "{\"type\":\"WordPiece\"}");
    expect_load(j, DSQ_ERR_UNSUPPORTED, "decoder WordPiece");
    free(j);
    /* a vocab id that is not a number */
    j = tiny_json("[]", "null", QWEN_PRE, "BPE", BL_DEC);
    char *p = strstr(j, "\"ab\":256");
    memcpy(p, "\"ab\":\"x\"", 8);
    expect_load(j, DSQ_ERR_FORMAT, "vocab id a string");
    free(j);
    /* a directory without tokenizer.json */
    dsq_tokenizer *t;
    assert_int_equal(dsq_tokenizer_load("/tmp", &t), DSQ_ERR_IO);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_readme_vectors),
        cmocka_unit_test(test_accessors),
        cmocka_unit_test(test_vectors_encode),
        cmocka_unit_test(test_vectors_decode),
        cmocka_unit_test(test_stream_decode),
        cmocka_unit_test(test_plain_special),
        cmocka_unit_test(test_invalid_utf8),
        cmocka_unit_test(test_args_and_buffers),
        cmocka_unit_test(test_load_dir),
        cmocka_unit_test(test_added_token_flags),
        cmocka_unit_test(test_bulk_and_speed),
        cmocka_unit_test(test_threads),
        cmocka_unit_test(test_malformed),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
