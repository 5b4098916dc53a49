/*
 * fuzz_tokenizer_config.c - tokenizer_config.json (bos_token / eos_token,
 * as a string or {"content": ...}) read into the real Qwen2 tokenizer with
 * dsq_tok_read_config(), the step dsq_tokenizer_load() runs on the file
 * beside tokenizer.json.
 *
 * The text comes in an exact-size buffer without a NUL (the reader takes
 * pointer + length).  Whatever the file says, BOS and EOS afterwards are -1
 * or ids that have a token; the tokenizer (loaded once, from
 * $DSQ_FUZZ_TOKENIZER or tests/data/model/tokenizer.json) gets its own BOS
 * and EOS back after each input.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_util.h"
#include "tokenizer_internal.h"

#ifndef DSQ_FUZZ_TOKENIZER
#define DSQ_FUZZ_TOKENIZER "tests/data/model/tokenizer.json"
#endif

static dsq_tokenizer *g_tok;

static dsq_tokenizer *tokenizer(void)
{
    if (!g_tok) {
        const char *path = getenv("DSQ_FUZZ_TOKENIZER");
        if (!path || !*path)
            path = DSQ_FUZZ_TOKENIZER;
        if (dsq_tokenizer_load(path, &g_tok) != DSQ_OK) {
            fprintf(stderr, "fuzz_tokenizer_config: cannot load %s: %s\n", path,
                    dsq_last_error_message());
            abort(); /* a setup problem, not a finding */
        }
    }
    return g_tok;
}

static int valid_special(const dsq_tokenizer *t, int32_t id)
{
    return id == -1 || (id >= 0 && id < dsq_tokenizer_n_tokens(t) && dsq_token_text(t, id));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    dsq_tokenizer *t = tokenizer();
    int32_t bos = t->bos, eos = t->eos;
    char *text = fz_dup(data, size);
    if (!text)
        return 0;
    dsq_tok_read_config(t, text, size);
    free(text);
    if (!valid_special(t, dsq_tokenizer_bos(t)) || !valid_special(t, dsq_tokenizer_eos(t)))
        abort();
    t->bos = bos;
    t->eos = eos;
    return 0;
}
