/* test_stop.c - dsq_stopper with the real R1-Distill tokenizer
 * (tests/data/model).  Expected text always comes from dsq_detokenize() of
 * the same ids (itself checked against HF tokenizers in test_tokenizer.c):
 * the stopper's output must be exactly the decoded text up to the first stop
 * string, whatever the token boundaries, and every intermediate output must
 * be a prefix of that and never contain a stop string. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

static dsq_tokenizer *tok;

static int group_setup(void **state)
{
    (void)state;
    char *path = dsq_test_path("model");
    dsq_status st = dsq_tokenizer_load(path, &tok);
    free(path);
    if (st != DSQ_OK) {
        fprintf(stderr, "tokenizer: %s: %s\n", dsq_status_string(st), dsq_last_error_message());
        return -1;
    }
    return 0;
}

static int group_teardown(void **state)
{
    (void)state;
    dsq_tokenizer_free(tok);
    return 0;
}

/* ids of `text` (no BOS; special-token text recognised); *n set */
static int32_t *encode(const char *text, size_t *n)
{
    size_t need = 0;
    dsq_status st = dsq_tokenize(tok, text, strlen(text), 0, NULL, 0, &need);
    assert_true(st == DSQ_OK || st == DSQ_ERR_BUFFER_TOO_SMALL);
    int32_t *ids = malloc(sizeof(int32_t) * (need + 1));
    assert_non_null(ids);
    assert_int_equal(dsq_tokenize(tok, text, strlen(text), 0, ids, need, n), DSQ_OK);
    return ids;
}

/* ids of `text` one UTF-8 character per token (each character encoded on its
 * own), so every stop string is split at every character boundary */
static int32_t *encode_per_char(const char *text, size_t *n)
{
    size_t len = strlen(text), k = 0;
    int32_t *ids = malloc(sizeof(int32_t) * len * 4 + 4);
    assert_non_null(ids);
    for (size_t i = 0; i < len;) {
        size_t cl = 1;
        while (i + cl < len && ((unsigned char)text[i + cl] & 0xC0) == 0x80)
            cl++;
        char ch[8] = { 0 };
        memcpy(ch, text + i, cl);
        size_t got = 0;
        assert_int_equal(dsq_tokenize(tok, ch, cl, 0, ids + k, len * 4 + 4 - k, &got), DSQ_OK);
        k += got;
        i += cl;
    }
    *n = k;
    return ids;
}

/* dsq_detokenize(ids) with skip_special, malloc'ed */
static char *decode(const int32_t *ids, size_t n)
{
    size_t len = 0;
    dsq_detokenize(tok, ids, n, 1, NULL, 0, &len);
    char *s = malloc(len + 1);
    assert_non_null(s);
    assert_int_equal(dsq_detokenize(tok, ids, n, 1, s, len + 1, &len), DSQ_OK);
    return s;
}

/* Push ids[0..n) (then flush unless stopped) and return everything emitted
 * (malloc'ed); *stopped_at = index of the id that stopped, or -1.  After
 * every push the output so far must be a prefix of `expect` and contain no
 * stop string. */
static char *run(dsq_stopper *s, const int32_t *ids, size_t n, const char *const *stops,
                 size_t n_stops, const char *expect, long *stopped_at)
{
    size_t cap = 1 << 16, used = 0;
    char *all = calloc(1, cap), buf[4096];
    assert_non_null(all);
    *stopped_at = -1;
    for (size_t i = 0; i < n; i++) {
        size_t len = 12345;
        int stopped = -1;
        assert_int_equal(dsq_stopper_push(s, ids[i], buf, sizeof buf, &len, &stopped), DSQ_OK);
        assert_true(stopped == 0 || stopped == 1);
        assert_int_equal(strlen(buf), len);
        assert_true(used + len < cap);
        memcpy(all + used, buf, len + 1);
        used += len;
        if (expect) {
            assert_true(used <= strlen(expect));
            assert_memory_equal(all, expect, used);
        }
        for (size_t j = 0; j < n_stops; j++)
            assert_null(strstr(all, stops[j]));
        if (stopped) {
            *stopped_at = (long)i;
            return all;
        }
    }
    size_t len = 0;
    assert_int_equal(dsq_stopper_flush(s, buf, sizeof buf, &len), DSQ_OK);
    memcpy(all + used, buf, len + 1);
    return all;
}

/* Text before the first-completed stop string (earliest end, then longest),
 * computed naively on the whole decoded text. */
static char *before_first_stop(const char *text, const char *const *stops, size_t n_stops,
                               int *found)
{
    size_t len = strlen(text);
    *found = 0;
    for (size_t e = 1; e <= len; e++) {
        size_t best = 0;
        for (size_t j = 0; j < n_stops; j++) {
            size_t l = strlen(stops[j]);
            if (l <= e && l > best && memcmp(text + e - l, stops[j], l) == 0)
                best = l;
        }
        if (best) {
            *found = 1;
            return strndup(text, e - best);
        }
    }
    return strdup(text);
}

/* "text" with newlines shown as \n */
static void print_escaped(const char *s)
{
    putchar('"');
    for (; *s; s++)
        if (*s == '\n')
            fputs("\\n", stdout);
        else
            putchar(*s);
    putchar('"');
}

/* Run `text` through a stopper with `stops`, tokenized normally and one
 * character per token; both must give the naive answer. */
static void check_case(const char *text, const char *const *stops, size_t n_stops,
                       int expect_stop)
{
    for (int per_char = 0; per_char < 2; per_char++) {
        size_t n = 0;
        int32_t *ids = per_char ? encode_per_char(text, &n) : encode(text, &n);
        char *full = decode(ids, n);
        assert_string_equal(full, text); /* round trip of this plain text */
        int found = 0;
        char *expect = before_first_stop(full, stops, n_stops, &found);
        assert_int_equal(found, expect_stop);
        dsq_stopper *s = NULL;
        assert_int_equal(dsq_stopper_new(tok, stops, n_stops, 1, &s), DSQ_OK);
        long at = 0;
        char *got = run(s, ids, n, stops, n_stops, expect, &at);
        printf("%s [%2zu ids] stop[0]=", per_char ? "per char" : "tokens  ", n);
        print_escaped(n_stops ? stops[0] : "");
        printf(": ");
        print_escaped(got);
        printf(" (stopped at id %ld)\n", at);
        assert_string_equal(got, expect);
        assert_int_equal(at >= 0, expect_stop);
        free(got);
        dsq_stopper_free(s);
        free(expect);
        free(full);
        free(ids);
    }
}

static const char *const TEXT = "The answer is 42.\n\nUser: what next?";

/* Index of the token in which byte `pos` of the decoded text lies. */
static size_t token_at(const int32_t *ids, size_t n, size_t pos)
{
    size_t off = 0;
    for (size_t i = 0; i < n; i++) {
        char *t = decode(ids + i, 1);
        off += strlen(t);
        free(t);
        if (pos < off)
            return i;
    }
    return n;
}

static void test_eos_id_is_end_of_sentence(void **state)
{
    (void)state;
    /* tokenizer_config.json: eos_token "<｜end▁of▁sentence｜>" = id 151643 */
    assert_int_equal(dsq_tokenizer_eos(tok), 151643);
    assert_int_equal(dsq_tokenizer_token_id(tok, "<｜end▁of▁sentence｜>"), 151643);
}

static void test_split_stop_never_emitted(void **state)
{
    (void)state;
    /* each of these starts and ends in different tokens of TEXT */
    static const char *const cases[] = { "\n\nUser:", "swer i", "42.\n", "s 4" };
    size_t n = 0;
    int32_t *ids = encode(TEXT, &n);
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        const char *hit = strstr(TEXT, cases[c]);
        assert_non_null(hit);
        size_t a = (size_t)(hit - TEXT), b = a + strlen(cases[c]) - 1;
        assert_true(token_at(ids, n, a) < token_at(ids, n, b)); /* really split */
        check_case(TEXT, &cases[c], 1, 1);
    }
    free(ids);
}

static void test_partial_matches_emitted_intact(void **state)
{
    (void)state;
    static const char *const stops[] = { "answer was", "42!", "User: who", "?!" };
    check_case(TEXT, stops, 4, 0);

    /* and the held text really is held: after " answer" only "The " is out */
    size_t n = 0;
    int32_t *ids = encode(TEXT, &n);
    dsq_stopper *s = NULL;
    assert_int_equal(dsq_stopper_new(tok, stops, 4, 1, &s), DSQ_OK);
    char buf[256];
    size_t len = 0;
    int stopped = 1;
    assert_int_equal(dsq_stopper_push(s, ids[0], buf, sizeof buf, &len, &stopped), DSQ_OK);
    assert_string_equal(buf, "The");
    assert_int_equal(dsq_stopper_push(s, ids[1], buf, sizeof buf, &len, &stopped), DSQ_OK);
    assert_string_equal(buf, " "); /* "answer" could start "answer was" */
    assert_int_equal(stopped, 0);
    assert_int_equal(dsq_stopper_push(s, ids[2], buf, sizeof buf, &len, &stopped), DSQ_OK);
    assert_string_equal(buf, "answer is");
    dsq_stopper_free(s);
    free(ids);
}

static void test_multiple_stops(void **state)
{
    (void)state;
    static const char *const a[] = { "User:", "42" };        /* "42" comes first  */
    static const char *const b[] = { "answer is 42", "is" }; /* "is" ends first   */
    static const char *const c[] = { "42", "is 42" };        /* same end: longest */
    static const char *const d[] = { "nope", "next", "zzz" };
    check_case(TEXT, a, 2, 1);
    check_case(TEXT, b, 2, 1);
    check_case(TEXT, c, 2, 1);
    check_case(TEXT, d, 3, 1);
    check_case("café au lait, naïve résumé", (const char *const[]){ "é au", "ïve r" }, 2, 1);
    check_case("café au lait, naïve résumé", (const char *const[]){ "ïve r" }, 1, 1);
    check_case("café au lait, naïve résumé", (const char *const[]){ "é!", "sumé " }, 2, 0);

    /* spelled out once: "is" wins over "answer is 42" */
    size_t n = 0;
    int32_t *ids = encode(TEXT, &n);
    dsq_stopper *s = NULL;
    assert_int_equal(dsq_stopper_new(tok, b, 2, 0, &s), DSQ_OK);
    long at = 0;
    char *got = run(s, ids, n, b, 2, NULL, &at);
    assert_string_equal(got, "The answer ");
    assert_int_equal(at, 2);
    free(got);
    dsq_stopper_free(s);
    free(ids);
}

/* A character split across byte tokens (é = C3 A9 as two byte-level ids)
 * inside a stop string. */
static void test_stop_across_split_character(void **state)
{
    (void)state;
    int32_t ids[8];
    size_t n = 0, k = 0;
    int32_t *caf = encode("caf", &n);
    assert_int_equal(n, 1);
    ids[k++] = caf[0];
    free(caf);
    ids[k++] = dsq_tokenizer_token_id(tok, "Ã"); /* byte 0xC3 */
    ids[k++] = dsq_tokenizer_token_id(tok, "©"); /* byte 0xA9 */
    int32_t *au = encode(" au", &n);
    assert_int_equal(n, 1);
    ids[k++] = au[0];
    free(au);
    assert_true(ids[1] >= 0 && ids[2] >= 0);
    char *full = decode(ids, k);
    assert_string_equal(full, "café au");
    free(full);

    static const char *const stops[] = { "é au" };
    dsq_stopper *s = NULL;
    assert_int_equal(dsq_stopper_new(tok, stops, 1, 1, &s), DSQ_OK);
    long at = 0;
    char *got = run(s, ids, k, stops, 1, "café au", &at);
    assert_string_equal(got, "caf");
    assert_int_equal(at, 3);
    free(got);
    dsq_stopper_free(s);
}

static void test_special_token_text_stops(void **state)
{
    (void)state;
    /* <｜User｜> is an added token with special: false, so it decodes to its
     * text and can be a stop string; EOS is special and decodes to nothing */
    static const char *const stops[] = { "<｜User｜>" };
    const char *text = "Done.<｜User｜>Next question";
    size_t n = 0;
    int32_t *ids = encode(text, &n);
    assert_int_equal(ids[2], dsq_tokenizer_token_id(tok, "<｜User｜>"));
    dsq_stopper *s = NULL;
    assert_int_equal(dsq_stopper_new(tok, stops, 1, 1, &s), DSQ_OK);
    long at = 0;
    char *got = run(s, ids, n, stops, 1, text, &at);
    assert_string_equal(got, "Done.");
    assert_int_equal(at, 2);
    free(got);
    dsq_stopper_free(s);
    free(ids);
}

static void test_eos_stops(void **state)
{
    (void)state;
    static const char *const stops[] = { "world peace" };
    size_t n = 0;
    int32_t *hw = encode("Hello world", &n);
    assert_int_equal(n, 2);
    int32_t ids[4] = { hw[0], hw[1], dsq_tokenizer_eos(tok), hw[0] };
    free(hw);

    /* stop_on_eos: the held "world" (not a stop after all) comes out at EOS */
    dsq_stopper *s = NULL;
    assert_int_equal(dsq_stopper_new(tok, stops, 1, 1, &s), DSQ_OK);
    char buf[256];
    size_t len = 0;
    int stopped = 0;
    assert_int_equal(dsq_stopper_push(s, ids[0], buf, sizeof buf, &len, &stopped), DSQ_OK);
    assert_int_equal(dsq_stopper_push(s, ids[1], buf, sizeof buf, &len, &stopped), DSQ_OK);
    assert_string_equal(buf, " ");
    assert_int_equal(stopped, 0);
    assert_int_equal(dsq_stopper_push(s, ids[2], buf, sizeof buf, &len, &stopped), DSQ_OK);
    assert_string_equal(buf, "world");
    assert_int_equal(len, 5);
    assert_int_equal(stopped, 1);
    /* stays stopped: nothing more comes out */
    stopped = 0;
    assert_int_equal(dsq_stopper_push(s, ids[3], buf, sizeof buf, &len, &stopped), DSQ_OK);
    assert_int_equal(stopped, 1);
    assert_int_equal(len, 0);
    assert_string_equal(buf, "");
    assert_int_equal(dsq_stopper_flush(s, buf, sizeof buf, &len), DSQ_OK);
    assert_int_equal(len, 0);
    /* reset: usable again */
    dsq_stopper_reset(s);
    assert_int_equal(dsq_stopper_push(s, ids[3], buf, sizeof buf, &len, &stopped), DSQ_OK);
    assert_string_equal(buf, "Hello");
    assert_int_equal(stopped, 0);
    dsq_stopper_free(s);

    /* without stop_on_eos, EOS is just a (silent, special) token */
    assert_int_equal(dsq_stopper_new(tok, stops, 1, 0, &s), DSQ_OK);
    long at = 0;
    char *got = run(s, ids, 4, stops, 1, "Hello worldHello", &at);
    assert_string_equal(got, "Hello worldHello");
    assert_int_equal(at, -1);
    free(got);
    dsq_stopper_free(s);

    /* no stop strings at all: EOS alone */
    assert_int_equal(dsq_stopper_new(tok, NULL, 0, 1, &s), DSQ_OK);
    got = run(s, ids, 4, NULL, 0, "Hello world", &at);
    assert_string_equal(got, "Hello world");
    assert_int_equal(at, 2);
    free(got);
    dsq_stopper_free(s);
}

static void test_flush(void **state)
{
    (void)state;
    static const char *const stops[] = { "world peace" };
    size_t n = 0;
    int32_t *hw = encode("Hello world", &n);
    dsq_stopper *s = NULL;
    assert_int_equal(dsq_stopper_new(tok, stops, 1, 1, &s), DSQ_OK);
    char buf[256];
    size_t len = 0;
    int stopped = 0;
    assert_int_equal(dsq_stopper_push(s, hw[0], buf, sizeof buf, &len, &stopped), DSQ_OK);
    assert_int_equal(dsq_stopper_push(s, hw[1], buf, sizeof buf, &len, &stopped), DSQ_OK);
    assert_string_equal(buf, " ");
    assert_int_equal(dsq_stopper_flush(s, buf, sizeof buf, &len), DSQ_OK);
    assert_string_equal(buf, "world");
    assert_int_equal(dsq_stopper_flush(s, buf, sizeof buf, &len), DSQ_OK); /* nothing left */
    assert_int_equal(len, 0);

    /* an incomplete character is flushed as U+FFFD, as
     * b"\xc3".decode("utf-8", "replace") gives */
    int32_t c3 = dsq_tokenizer_token_id(tok, "Ã");
    assert_int_equal(dsq_stopper_push(s, c3, buf, sizeof buf, &len, &stopped), DSQ_OK);
    assert_int_equal(len, 0);
    assert_int_equal(dsq_stopper_flush(s, buf, sizeof buf, &len), DSQ_OK);
    assert_string_equal(buf, "\xEF\xBF\xBD");

    /* a stop string cannot span a flush; the stopper goes on working */
    assert_int_equal(dsq_stopper_push(s, hw[1], buf, sizeof buf, &len, &stopped), DSQ_OK);
    assert_string_equal(buf, " ");
    assert_int_equal(dsq_stopper_flush(s, buf, sizeof buf, &len), DSQ_OK);
    assert_string_equal(buf, "world");
    int32_t *peace = encode(" peace", &n);
    assert_int_equal(dsq_stopper_push(s, peace[0], buf, sizeof buf, &len, &stopped), DSQ_OK);
    assert_string_equal(buf, " peace");
    assert_int_equal(stopped, 0);
    free(peace);
    free(hw);
    dsq_stopper_free(s);
}

static void test_small_buffer_changes_nothing(void **state)
{
    (void)state;
    static const char *const stops[] = { "\n\nUser:" };
    size_t n = 0;
    int32_t *ids = encode(TEXT, &n);
    dsq_stopper *s = NULL;
    assert_int_equal(dsq_stopper_new(tok, stops, 1, 1, &s), DSQ_OK);
    char all[256] = "", buf[256], tiny[2];
    for (size_t i = 0; i < n; i++) {
        size_t len = 0;
        int stopped = 0;
        /* first too small: refused with the bound, state untouched */
        assert_int_equal(dsq_stopper_push(s, ids[i], tiny, sizeof tiny, &len, &stopped),
                         DSQ_ERR_BUFFER_TOO_SMALL);
        assert_true(len + 1 > sizeof tiny);
        assert_int_equal(stopped, 0);
        assert_int_equal(dsq_stopper_push(s, ids[i], buf, len + 1, &len, &stopped), DSQ_OK);
        strcat(all, buf);
        if (stopped)
            break;
    }
    assert_string_equal(all, "The answer is 42.");
    dsq_stopper_reset(s);
    size_t len = 0;
    int stopped = 0;
    assert_int_equal(dsq_stopper_push(s, ids[0], buf, sizeof buf, &len, &stopped), DSQ_OK);
    assert_int_equal(dsq_stopper_push(s, ids[6], buf, sizeof buf, &len, &stopped), DSQ_OK);
    assert_string_equal(buf, "."); /* "\n\n" held */
    assert_int_equal(dsq_stopper_flush(s, NULL, 0, &len), DSQ_ERR_BUFFER_TOO_SMALL);
    assert_int_equal(len, 2 + 3);
    assert_int_equal(dsq_stopper_flush(s, buf, sizeof buf, &len), DSQ_OK);
    assert_string_equal(buf, "\n\n");
    dsq_stopper_free(s);
    free(ids);
}

static void test_invalid_args(void **state)
{
    (void)state;
    static const char *const ok[] = { "x" };
    const char *const with_empty[] = { "x", "" };
    const char *const with_null[] = { "x", NULL };
    dsq_stopper *s = (dsq_stopper *)(uintptr_t)1;
    assert_int_equal(dsq_stopper_new(NULL, ok, 1, 1, &s), DSQ_ERR_INVALID_ARG);
    assert_null(s);
    assert_int_equal(dsq_stopper_new(tok, ok, 1, 1, NULL), DSQ_ERR_INVALID_ARG);
    assert_int_equal(dsq_stopper_new(tok, NULL, 1, 1, &s), DSQ_ERR_INVALID_ARG);
    assert_int_equal(dsq_stopper_new(tok, with_empty, 2, 1, &s), DSQ_ERR_INVALID_ARG);
    assert_non_null(strstr(dsq_last_error_message(), "empty"));
    assert_int_equal(dsq_stopper_new(tok, with_null, 2, 1, &s), DSQ_ERR_INVALID_ARG);
    assert_null(s);

    assert_int_equal(dsq_stopper_new(tok, ok, 1, 1, &s), DSQ_OK);
    char buf[64];
    size_t len = 0;
    int stopped = 0;
    assert_int_equal(dsq_stopper_push(NULL, 1, buf, sizeof buf, &len, &stopped), DSQ_ERR_INVALID_ARG);
    assert_int_equal(dsq_stopper_push(s, 1, buf, sizeof buf, NULL, &stopped), DSQ_ERR_INVALID_ARG);
    assert_int_equal(dsq_stopper_push(s, 1, buf, sizeof buf, &len, NULL), DSQ_ERR_INVALID_ARG);
    assert_int_equal(dsq_stopper_push(s, 1, NULL, 8, &len, &stopped), DSQ_ERR_INVALID_ARG);
    assert_int_equal(dsq_stopper_push(s, -1, buf, sizeof buf, &len, &stopped), DSQ_ERR_TOKEN);
    assert_int_equal(dsq_stopper_push(s, dsq_tokenizer_n_tokens(tok), buf, sizeof buf, &len,
                                      &stopped), DSQ_ERR_TOKEN);
    assert_int_equal(dsq_stopper_flush(NULL, buf, sizeof buf, &len), DSQ_ERR_INVALID_ARG);
    assert_int_equal(dsq_stopper_flush(s, buf, sizeof buf, NULL), DSQ_ERR_INVALID_ARG);
    assert_int_equal(dsq_stopper_flush(s, NULL, 8, &len), DSQ_ERR_INVALID_ARG);
    dsq_stopper_free(s);
    dsq_stopper_free(NULL);
    dsq_stopper_reset(NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_eos_id_is_end_of_sentence),
        cmocka_unit_test(test_split_stop_never_emitted),
        cmocka_unit_test(test_partial_matches_emitted_intact),
        cmocka_unit_test(test_multiple_stops),
        cmocka_unit_test(test_stop_across_split_character),
        cmocka_unit_test(test_special_token_text_stops),
        cmocka_unit_test(test_eos_stops),
        cmocka_unit_test(test_flush),
        cmocka_unit_test(test_small_buffer_changes_nothing),
        cmocka_unit_test(test_invalid_args),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
