/*
 * fuzz_tokenize.c - dsq_tokenize() with the real Qwen2 tokenizer on
 * arbitrary bytes (invalid UTF-8 included), then dsq_detokenize().
 *
 * The first input byte picks the flags (bits 0-1); the rest is the text.  The
 * tokenizer is loaded once per process from $DSQ_FUZZ_TOKENIZER or the
 * compiled-in tests/data/model/tokenizer.json and stays reachable through a
 * static pointer, so LeakSanitizer does not count it.
 *
 * Checks: the size query and the real call agree, ids are in range, a buffer
 * one short is refused with DSQ_ERR_BUFFER_TOO_SMALL, and the ids decode.
 * For valid UTF-8 without special-token handling, decoding gives the text
 * back up to NFC (the only normalizer), so only the lengths of both are
 * compared loosely: an empty text must give no ids, a non-empty one some.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsqwen.h"

#ifndef DSQ_FUZZ_TOKENIZER
#define DSQ_FUZZ_TOKENIZER "tests/data/model/tokenizer.json"
#endif

static dsq_tokenizer *g_tok;

static const dsq_tokenizer *tokenizer(void)
{
    if (!g_tok) {
        const char *path = getenv("DSQ_FUZZ_TOKENIZER");
        if (!path || !*path)
            path = DSQ_FUZZ_TOKENIZER;
        if (dsq_tokenizer_load(path, &g_tok) != DSQ_OK) {
            fprintf(stderr, "fuzz_tokenize: cannot load %s: %s\n", path,
                    dsq_last_error_message());
            abort(); /* a setup problem, not a finding: say so loudly */
        }
    }
    return g_tok;
}

/* The 7 MB tokenizer is loaded before the first input (libFuzzer calls
 * this once), so its load -- seconds under ASan on a busy machine -- does
 * not count against the first input's -timeout. */
int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    (void)tokenizer();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const dsq_tokenizer *t = tokenizer();
    if (size == 0)
        return 0;
    uint32_t flags = data[0] & 3u;
    const char *text = (const char *)data + 1;
    size_t len = size - 1;
    /* Exact-size copy: the tokenizer takes (pointer, length), so a read past
     * the end must be visible to ASan. */
    char *copy = malloc(len ? len : 1);
    if (!copy)
        return 0;
    memcpy(copy, text, len);

    size_t need = 0;
    dsq_status st = dsq_tokenize(t, copy, len, flags, NULL, 0, &need);
    if (st != DSQ_OK && st != DSQ_ERR_BUFFER_TOO_SMALL)
        abort(); /* every byte string is encodable */
    if ((len == 0) != (need == 0) && !(flags & DSQ_TOKENIZE_ADD_SPECIAL))
        abort();
    int32_t *ids = malloc((need + 1) * sizeof *ids);
    if (!ids) {
        free(copy);
        return 0;
    }
    size_t got = 0;
    if (need > 0) {
        st = dsq_tokenize(t, copy, len, flags, ids, need - 1, &got);
        if (st != DSQ_ERR_BUFFER_TOO_SMALL || got != need)
            abort();
    }
    st = dsq_tokenize(t, copy, len, flags, ids, need + 1, &got);
    if (st != DSQ_OK || got != need)
        abort();
    int32_t n_tok = dsq_tokenizer_n_tokens(t);
    for (size_t i = 0; i < got; i++)
        if (ids[i] < 0 || ids[i] >= n_tok)
            abort();

    size_t dlen = 0;
    st = dsq_detokenize(t, ids, got, 0, NULL, 0, &dlen);
    if (st != DSQ_OK && st != DSQ_ERR_BUFFER_TOO_SMALL)
        abort();
    char *dec = malloc(dlen + 1);
    if (dec) {
        size_t dlen2 = 0;
        if (dsq_detokenize(t, ids, got, 0, dec, dlen + 1, &dlen2) != DSQ_OK || dlen2 != dlen ||
            dec[dlen] != '\0')
            abort();
        free(dec);
    }
    free(ids);
    free(copy);
    return 0;
}
