/* test_tokenizer_regressions.c - tokenizer defects found by adversarial
 * inputs (issue 14), each checked on a tiny byte-level tokenizer.json built
 * here around the one thing under test (split regex, added tokens).
 *
 *  - split regexes that can match empty at the end of the text ($, \z, \w+|$,
 *    (a+)*$) made dsq_tokenize read one byte past the caller's text;
 *  - added-token matching cost O(text x added tokens);
 *  - a split regex that hits PCRE2's match limit came back as
 *    DSQ_ERR_INTERNAL ("a bug in libdsqwen") instead of DSQ_ERR_FORMAT;
 *  - and the byte alphabet's closed forms against its definition (they
 *    replaced per-byte counting loops that the fuzz profile showed). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "testutil.h"
#include "tokenizer_internal.h"

/* ---- building tokenizer.json ---------------------------------------------------- */

typedef struct sbuf {
    char *p;
    size_t n, cap;
} sbuf;

static void sb_put(sbuf *b, const char *s, size_t n)
{
    if (b->n + n + 1 > b->cap) {
        b->cap = (b->n + n + 1) * 2;
        b->p = realloc(b->p, b->cap);
        assert_non_null(b->p);
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = '\0';
}

static void sb_str(sbuf *b, const char *s) { sb_put(b, s, strlen(s)); }

/* s as a JSON string literal */
static void sb_json_string(sbuf *b, const char *s)
{
    sb_put(b, "\"", 1);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        char e[8];
        if (c == '"' || c == '\\') {
            e[0] = '\\', e[1] = (char)c;
            sb_put(b, e, 2);
        } else if (c < 0x20) {
            snprintf(e, sizeof e, "\\u%04x", c);
            sb_put(b, e, 6);
        } else {
            sb_put(b, (const char *)&c, 1);
        }
    }
    sb_put(b, "\"", 1);
}

/* A byte-level BPE tokenizer.json: the 256 byte characters (id = byte), the
 * merge "a a" -> "aa" (id 256), no normalizer, `regex` as the Split
 * pattern, and `n_added` added tokens (ids 300...) named by added(k). */
static char *make_json(const char *regex, int32_t n_added, const char *(*added)(int32_t k))
{
    sbuf b = {0};
    sb_str(&b, "{\"version\":\"1.0\",\"added_tokens\":[");
    for (int32_t k = 0; k < n_added; k++) {
        char head[64];
        snprintf(head, sizeof head, "%s{\"id\":%d,\"content\":", k ? "," : "", 300 + k);
        sb_str(&b, head);
        sb_json_string(&b, added(k));
        sb_str(&b, ",\"special\":true,\"normalized\":false}");
    }
    sb_str(&b, "],\"normalizer\":null,\"pre_tokenizer\":{\"type\":\"Sequence\",\"pretokenizers\":["
               "{\"type\":\"Split\",\"pattern\":{\"Regex\":");
    sb_json_string(&b, regex);
    sb_str(&b, "},\"behavior\":\"Isolated\",\"invert\":false},{\"type\":\"ByteLevel\","
               "\"add_prefix_space\":false,\"trim_offsets\":false,\"use_regex\":false}]},"
               "\"post_processor\":null,\"decoder\":{\"type\":\"ByteLevel\"},"
               "\"model\":{\"type\":\"BPE\",\"vocab\":{");
    for (int byte = 0; byte < 256; byte++) {
        char u[8];
        size_t l = dsq_utf8_put(dsq_tok_byte_to_cp((uint8_t)byte), u);
        u[l] = '\0';
        sb_json_string(&b, u);
        char id[16];
        snprintf(id, sizeof id, ":%d,", byte);
        sb_str(&b, id);
    }
    sb_str(&b, "\"aa\":256},\"merges\":[\"a a\"]}}");
    return b.p;
}

static dsq_tokenizer *load_json(const char *json, dsq_status *st_out)
{
    char path[] = "/tmp/dsq_tokreg_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    size_t len = strlen(json);
    assert_int_equal(write(fd, json, len), (ssize_t)len);
    close(fd);
    dsq_tokenizer *t = NULL;
    dsq_status st = dsq_tokenizer_load(path, &t);
    unlink(path);
    if (st_out) *st_out = st;
    return t;
}

static const char *no_added(int32_t k)
{
    (void)k;
    return "";
}

/* ---- 1. empty matches at the end of the text -------------------------------------- */

/* Encode `len` bytes that end exactly at the end of readable memory (an
 * mmap'ed page followed by a PROT_NONE page), so a read past the text faults
 * in any build, and again from an exact-size malloc copy (no NUL after it),
 * which AddressSanitizer watches.  Returns the ids (malloc'ed) in *ids. */
static dsq_status encode_guarded(const dsq_tokenizer *t, const char *text, size_t len,
                                 int32_t **ids, size_t *n)
{
    long pg = sysconf(_SC_PAGESIZE);
    assert_true(len <= (size_t)pg);
    char *map = mmap(NULL, 2 * (size_t)pg, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                     -1, 0);
    assert_true(map != MAP_FAILED);
    assert_int_equal(mprotect(map + pg, (size_t)pg, PROT_NONE), 0);
    char *at_end = map + pg - len;
    memcpy(at_end, text, len);

    size_t need = 0;
    dsq_status st = dsq_tokenize(t, at_end, len, 0, NULL, 0, &need);
    if (st == DSQ_OK || st == DSQ_ERR_BUFFER_TOO_SMALL) {
        *ids = malloc((need + 1) * sizeof **ids);
        assert_non_null(*ids);
        st = dsq_tokenize(t, at_end, len, 0, *ids, need, n);
        if (st == DSQ_OK) {
            char *heap = malloc(len ? len : 1);
            assert_non_null(heap);
            memcpy(heap, text, len);
            int32_t *again = malloc((need + 1) * sizeof *again);
            size_t n2 = 0;
            assert_int_equal(dsq_tokenize(t, heap, len, 0, again, need, &n2), DSQ_OK);
            assert_int_equal(n2, *n);
            assert_memory_equal(again, *ids, n2 * sizeof *again);
            free(again);
            free(heap);
        }
    }
    munmap(map, 2 * (size_t)pg);
    return st;
}

/* The GPT-2 byte alphabet against its definition, counted the slow way:
 * printable Latin-1 bytes stand for themselves, the other 68 take U+0100..
 * in byte order.  Anchors from GPT-2's vocabulary: space is U+0120 'Ġ',
 * newline U+010A 'Ċ', the soft hyphen (the last moved byte) U+0143. */
static void test_byte_alphabet(void **state)
{
    (void)state;
    int self[256];
    for (int b = 0; b < 256; b++)
        self[b] = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    int cp_of[256], byte_of[1024];
    for (int i = 0; i < 1024; i++)
        byte_of[i] = -1;
    int moved = 0;
    for (int b = 0; b < 256; b++) {
        cp_of[b] = self[b] ? b : 256 + moved++;
        byte_of[cp_of[b]] = b;
    }
    assert_int_equal(moved, 68);
    for (int b = 0; b < 256; b++) {
        assert_int_equal((int)dsq_tok_byte_to_cp((uint8_t)b), cp_of[b]);
        assert_int_equal(dsq_tok_cp_to_byte((uint32_t)cp_of[b]), b);
    }
    for (int cp = 0; cp < 1024; cp++)
        assert_int_equal(dsq_tok_cp_to_byte((uint32_t)cp), byte_of[cp]);
    assert_int_equal(dsq_tok_cp_to_byte(0x110000u), -1);
    assert_int_equal((int)dsq_tok_byte_to_cp(' '), 0x120);
    assert_int_equal((int)dsq_tok_byte_to_cp('\n'), 0x10A);
    assert_int_equal((int)dsq_tok_byte_to_cp(0xAD), 0x143);
}

static void test_empty_match_at_end_stays_in_text(void **state)
{
    (void)state;
    static const char *const regexes[] = {
        "$", "\\z", "\\Z", "\\w+|$", "(a+)*$", "a*", "(?:)", "\\b", "(?=a)|$", "\\s*$",
        /* Qwen2's own pattern with an empty alternative at the end */
        "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+"
        "[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+|$",
    };
    static const char *const texts[] = {
        "a", "aa", "ab", "b", " ", "abc abc", "aaa\n", "x\n\n", "h\xc3\xa9llo",
        "\xe6\x97\xa5\xe6\x9c\xac", "\xf0\x9f\x98\x80", "word. ", "a b c d e f",
    };
    int runs = 0;
    for (size_t r = 0; r < sizeof regexes / sizeof *regexes; r++) {
        char *json = make_json(regexes[r], 0, no_added);
        dsq_status st;
        dsq_tokenizer *t = load_json(json, &st);
        free(json);
        if (st != DSQ_OK) fprintf(stderr, "regex %s: %s\n", regexes[r], dsq_last_error_message());
        assert_int_equal(st, DSQ_OK);
        for (size_t k = 0; k < sizeof texts / sizeof *texts; k++) {
            size_t len = strlen(texts[k]), n = 0;
            int32_t *ids = NULL;
            assert_int_equal(encode_guarded(t, texts[k], len, &ids, &n), DSQ_OK);
            /* byte-level BPE without a normalizer gives the text back */
            char out[256];
            size_t ol = 0;
            assert_int_equal(dsq_detokenize(t, ids, n, 0, out, sizeof out, &ol), DSQ_OK);
            assert_int_equal(ol, len);
            assert_memory_equal(out, texts[k], len);
            free(ids);
            runs++;
        }
        dsq_tokenizer_free(t);
    }
    printf("empty-match regexes: %d encodes at the end of readable memory\n", runs);
}

/* ---- 2. added tokens: cost independent of their number --------------------------- */

static char g_name[32];

/* "a00000" ... : 20,000 tokens that all start with the text's byte but never
 * match it. */
static const char *a_number(int32_t k)
{
    snprintf(g_name, sizeof g_name, "a%05d", (int)k);
    return g_name;
}

static double cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* CPU seconds of one dsq_tokenize of text[0..len); ids to *ids (malloc'ed). */
static double time_encode(const dsq_tokenizer *t, const char *text, size_t len, int32_t **ids,
                          size_t *n)
{
    *ids = malloc((len + 8) * sizeof **ids);
    assert_non_null(*ids);
    double t0 = cpu_s();
    assert_int_equal(dsq_tokenize(t, text, len, 0, *ids, len + 8, n), DSQ_OK);
    return cpu_s() - t0;
}

/* The defect: 20,000 added tokens all starting with 'a', then 100 KB of 'a',
 * took 3.5 s, since every position of the text compared every token.  The
 * same text with no added tokens at all is the yardstick: whatever the
 * matcher costs on top of it must not grow with the number of tokens.  The
 * old code spends 2e9 token comparisons here (seconds even in a release
 * build, ~10x more under ASan); the bound, 0.5 CPU-s over the yardstick, is
 * far above what walking a trie over 100 KB costs in any build, and CPU time
 * (not wall time) keeps a busy machine from failing it. */
static void test_many_added_tokens_cost(void **state)
{
    (void)state;
    const size_t len = 100 * 1000;
    char *text = malloc(len);
    assert_non_null(text);
    memset(text, 'a', len);

    char *json = make_json("\\p{L}+|\\s+|.", 0, no_added);
    dsq_tokenizer *plain = load_json(json, NULL);
    free(json);
    json = make_json("\\p{L}+|\\s+|.", 20000, a_number);
    dsq_tokenizer *many = load_json(json, NULL);
    free(json);
    assert_non_null(plain);
    assert_non_null(many);

    int32_t *ids0, *ids1;
    size_t n0, n1;
    double t_plain = time_encode(plain, text, len, &ids0, &n0);
    double t_many = time_encode(many, text, len, &ids1, &n1);
    printf("100 KB of 'a': %.3f CPU-s without added tokens, %.3f CPU-s with 20,000\n", t_plain,
           t_many);
    /* none of the added tokens occurs: the same ids ("aa" x 50,000) */
    assert_int_equal(n0, len / 2);
    assert_int_equal(n1, n0);
    assert_memory_equal(ids0, ids1, n0 * sizeof *ids0);
    assert_true(t_many - t_plain < 0.5);

    free(ids0);
    free(ids1);
    free(text);
    dsq_tokenizer_free(plain);
    dsq_tokenizer_free(many);
}

/* ---- 3. leftmost-longest matching, unchanged by the trie ------------------------ */

static const char *const k_overlap[] = {"ab", "abc", "bcd", "abcde", "cd", "e", "\xc3\xa9", "d"};
static const char *overlap_token(int32_t k) { return k_overlap[k]; }

/* The matches HF's leftmost-longest Aho-Corasick finds: at the leftmost
 * position where some token starts, the longest one; then on after it. */
static void test_added_leftmost_longest(void **state)
{
    (void)state;
    char *json = make_json("\\p{L}+|\\s+|.", (int32_t)(sizeof k_overlap / sizeof *k_overlap),
                           overlap_token);
    dsq_tokenizer *t = load_json(json, NULL);
    free(json);
    assert_non_null(t);
    static const struct {
        const char *text;
        int32_t want[12];
        size_t n;
    } cases[] = {
        /* "abcd": "abc" (longest at 0, not "ab"), then "d" */
        {"abcd", {301, 307}, 2},
        /* "abcdef": "abcde" wins over "abc"; "f" is plain */
        {"abcdef", {303, 'f'}, 2},
        /* "xbcde": "bcd" at 1 (leftmost), then "e" */
        {"xbcde", {'x', 302, 305}, 3},
        /* "abcdx": "abc" then "d" (not "bcd": it starts inside the match) */
        {"abcdx", {301, 307, 'x'}, 3},
        /* a token one byte longer than what is left is not matched */
        {"abcd", {301, 307}, 2},
        {"a", {'a'}, 1},
        {"\xc3\xa9\xc3\xa9", {306, 306}, 2},
        {"cab", {'c', 300}, 2},
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        int32_t ids[32];
        size_t n = 0;
        size_t len = strlen(cases[c].text);
        char *heap = malloc(len);
        memcpy(heap, cases[c].text, len);
        assert_int_equal(dsq_tokenize(t, heap, len, 0, ids, 32, &n), DSQ_OK);
        free(heap);
        if (n != cases[c].n || memcmp(ids, cases[c].want, n * sizeof *ids)) {
            fprintf(stderr, "case '%s':", cases[c].text);
            for (size_t i = 0; i < n; i++) fprintf(stderr, " %d", ids[i]);
            fprintf(stderr, "\n");
        }
        assert_int_equal(n, cases[c].n);
        assert_memory_equal(ids, cases[c].want, n * sizeof *ids);
    }
    dsq_tokenizer_free(t);
}

/* Two added tokens with the same text: the first in file order wins. */
static const char *dup_token(int32_t k) { return k < 2 ? "zz" : "zzz"; }

static void test_added_duplicate_text_first_wins(void **state)
{
    (void)state;
    char *json = make_json("\\p{L}+|\\s+|.", 3, dup_token);
    dsq_tokenizer *t = load_json(json, NULL);
    free(json);
    assert_non_null(t);
    int32_t ids[8];
    size_t n = 0;
    assert_int_equal(dsq_tokenize(t, "zzqzzz", 6, 0, ids, 8, &n), DSQ_OK);
    assert_int_equal(n, 3);
    assert_int_equal(ids[0], 300);
    assert_int_equal(ids[1], 'q');
    assert_int_equal(ids[2], 302);
    dsq_tokenizer_free(t);
}

/* ---- 4. regex engine limits --------------------------------------------------------- */

/* (a+)+$ backtracks exponentially on a run of 'a' that does not end the
 * text: PCRE2 gives up at its match limit.  That is the tokenizer file's
 * regex being unusable on this text, not a library bug: DSQ_ERR_FORMAT with
 * a message that says so, and the tokenizer stays usable. */
static void test_regex_limit_is_format_error(void **state)
{
    (void)state;
    char *json = make_json("(a+)+$", 0, no_added);
    dsq_status st;
    dsq_tokenizer *t = load_json(json, &st);
    free(json);
    assert_int_equal(st, DSQ_OK);
    char text[64];
    memset(text, 'a', 40);
    text[40] = 'b';
    size_t n = 0;
    int32_t ids[64];
    st = dsq_tokenize(t, text, 41, 0, ids, 64, &n);
    printf("catastrophic regex -> %s: %s\n", dsq_status_string(st), dsq_last_error_message());
    assert_int_equal(st, DSQ_ERR_FORMAT);
    assert_non_null(strstr(dsq_last_error_message(), "regex"));
    assert_int_equal(n, 0);
    /* still usable on text where the regex is cheap */
    assert_int_equal(dsq_tokenize(t, "aab", 3, 0, ids, 64, &n), DSQ_OK);
    assert_true(n > 0);
    dsq_tokenizer_free(t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_byte_alphabet),
        cmocka_unit_test(test_empty_match_at_end_stays_in_text),
        cmocka_unit_test(test_many_added_tokens_cost),
        cmocka_unit_test(test_added_leftmost_longest),
        cmocka_unit_test(test_added_duplicate_text_first_wins),
        cmocka_unit_test(test_regex_limit_is_format_error),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
