/*
 * fuzz_tokenizer.c - the tokenizer.json loader on arbitrary bytes.
 *
 * Uses dsq_tok_from_json(), the from-memory step of dsq_tokenizer_load()
 * (the public call only adds reading the file and tokenizer_config.json), so
 * no file is written per input.  A tokenizer that loads is then used: a few
 * fixed texts are encoded from exact-size heap copies (ids must be in
 * range, the count stable between the size query and the real call) and
 * decoded, and the first ids' texts are read back.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_util.h"
#include "tokenizer_internal.h"

static const char *const k_texts[] = {
    "Hello, world! 123 4567",
    "  leading spaces\n\n\ttabs and\r\nnewlines  ",
    "caf\xc3\xa9 \xe4\xbd\xa0\xe5\xa5\xbd \xf0\x9f\x98\x80 na\xc3\xafve",
    "<|endoftext|><\xef\xbd\x9c" "User\xef\xbd\x9c>hi<think>x</think>",
    "bad \xff\xfe utf8 \xe2\x82 tail \xc0\xaf",
    "",
};

static void use_tokenizer(const dsq_tokenizer *t)
{
    int32_t n_tok = dsq_tokenizer_n_tokens(t);
    if (n_tok < 0)
        abort();
    for (size_t k = 0; k < sizeof k_texts / sizeof *k_texts; k++) {
        /* exact-size heap copy without the NUL: a read past the text must
         * be visible to ASan (a string literal hides it) */
        size_t slen = strlen(k_texts[k]);
        char *s = fz_dup(k_texts[k], slen);
        if (!s)
            return;
        for (uint32_t flags = 0; flags < 4; flags++) {
            size_t need = 0;
            dsq_status st = dsq_tokenize(t, s, slen, flags, NULL, 0, &need);
            if (st != DSQ_OK && st != DSQ_ERR_BUFFER_TOO_SMALL)
                continue; /* a refusal is fine; it must just not crash or leak */
            int32_t *ids = malloc((need ? need : 1) * sizeof *ids);
            if (!ids) {
                free(s);
                return;
            }
            size_t got = 0;
            st = dsq_tokenize(t, s, slen, flags, ids, need, &got);
            if (st == DSQ_OK) {
                if (got != need)
                    abort();
                for (size_t i = 0; i < got; i++)
                    if (ids[i] < 0 || ids[i] >= n_tok)
                        abort();
                size_t len = 0;
                char buf[4096];
                /* an id the encoder emits is a real token: it must decode */
                if (dsq_detokenize(t, ids, got, (int)(flags & 1), buf, sizeof buf, &len) ==
                    DSQ_ERR_TOKEN)
                    abort();
            }
            free(ids);
        }
        free(s);
    }
    /* Per-id accessors and single-id decoding over the first ids. */
    for (int32_t id = -1; id < n_tok && id < 1024; id++) {
        const char *txt = dsq_token_text(t, id);
        if (txt)
            (void)strlen(txt);
        char buf[256];
        size_t len = 0;
        (void)dsq_detokenize(t, &id, 1, 0, buf, sizeof buf, &len);
    }
    (void)dsq_detokenize(t, &n_tok, 1, 0, NULL, 0, &(size_t){0});
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* dsq_tok_from_json() wants NUL-terminated text (as dsq_read_file gives). */
    char *json = malloc(size + 1);
    if (!json)
        return 0;
    memcpy(json, data, size);
    json[size] = '\0';
    dsq_tokenizer *t = calloc(1, sizeof *t);
    if (!t) {
        free(json);
        return 0;
    }
    dsq_status st = dsq_tok_from_json(t, json, size);
    free(json);
    if (st == DSQ_OK)
        use_tokenizer(t);
    else if (dsq_last_error_message()[0] == '\0')
        abort();
    dsq_tokenizer_free(t); /* dsq_tok_release + free, also after a failed load */
    return 0;
}
