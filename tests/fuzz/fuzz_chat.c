/*
 * fuzz_chat.c - dsq_chat_format() on arbitrary conversations.
 *
 * Input: byte 0 bit 0 = add_generation_prompt; then messages, each a role
 * byte (read as a signed value, so -128..127: only 0, 1, 2 are roles) and
 * content up to the next 0x00 byte (or the end).  Each content is an
 * exact-size heap copy, len + 1 bytes with its NUL (the API takes C
 * strings).
 *
 * Checks: a bad role is DSQ_ERR_INVALID_ARG with a message; otherwise the
 * size query, a buffer one byte short (refused, and left as an empty
 * string) and an exact buffer agree, and the text equals this file's own
 * rendering of the documented rules (BOS, the last system text, "<|User|>"
 * + text, "<|Assistant|>" + what follows the last "</think>" + EOS, and the
 * generation prompt).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "dsqwen.h"
#include "fuzz_util.h"

#define BOS "<\xef\xbd\x9c" "begin\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>"
#define EOS "<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>"
#define USER "<\xef\xbd\x9cUser\xef\xbd\x9c>"
#define ASSISTANT "<\xef\xbd\x9c" "Assistant\xef\xbd\x9c>"
#define GEN ASSISTANT "<think>\n"

enum { MAX_MSGS = 64 };

/* The reference: rules of the header comment, searched from the end. */
static void render(const dsq_chat_message *m, size_t n, int gen, fz_buf *b)
{
    fz_str(b, BOS);
    for (size_t i = n; i-- > 0;)
        if (m[i].role == DSQ_ROLE_SYSTEM) {
            fz_str(b, m[i].content);
            break;
        }
    for (size_t i = 0; i < n; i++) {
        if (m[i].role == DSQ_ROLE_USER) {
            fz_str(b, USER);
            fz_str(b, m[i].content);
        } else if (m[i].role == DSQ_ROLE_ASSISTANT) {
            const char *c = m[i].content;
            size_t l = strlen(c), start = 0;
            for (size_t k = l; k >= 8; k--)
                if (!memcmp(c + k - 8, "</think>", 8)) {
                    start = k;
                    break;
                }
            fz_str(b, ASSISTANT);
            fz_str(b, c + start);
            fz_str(b, EOS);
        }
    }
    if (gen)
        fz_str(b, GEN);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    int gen = data[0] & 1;
    dsq_chat_message msgs[MAX_MSGS];
    size_t n = 0, at = 1;
    int bad_role = 0;
    while (at < size && n < MAX_MSGS) {
        int32_t role = (int8_t)data[at++];
        const uint8_t *c = data + at;
        const uint8_t *z = (const uint8_t *)memchr(c, 0, size - at);
        size_t l = z ? (size_t)(z - c) : size - at;
        at += l + (z ? 1 : 0);
        char *copy = fz_dupz(c, l);
        if (!copy)
            break;
        msgs[n].role = role;
        msgs[n].content = copy;
        n++;
        if (role < 0 || role > 2)
            bad_role = 1;
    }

    size_t need = 0;
    dsq_status st = dsq_chat_format(msgs, n, gen, NULL, 0, &need);
    if (bad_role) {
        if (st != DSQ_ERR_INVALID_ARG || dsq_last_error_message()[0] == '\0')
            abort();
    } else {
        if (st != DSQ_ERR_BUFFER_TOO_SMALL || need == 0)
            abort();
        fz_buf ref = {0};
        render(msgs, n, gen, &ref);
        char *out = (char *)malloc(need + 1);
        if (out && !ref.oom) {
            size_t got = 0;
            memset(out, 'X', need + 1);
            if (dsq_chat_format(msgs, n, gen, out, need, &got) != DSQ_ERR_BUFFER_TOO_SMALL ||
                got != need || out[0] != '\0')
                abort();
            if (dsq_chat_format(msgs, n, gen, out, need + 1, &got) != DSQ_OK || got != need ||
                out[need] != '\0' || ref.n != need || memcmp(out, ref.p, need) != 0)
                abort();
        }
        free(out);
        free(ref.p);
    }
    for (size_t i = 0; i < n; i++)
        free((void *)msgs[i].content);
    return 0;
}
