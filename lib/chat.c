/* chat.c - the DeepSeek-R1-Distill chat format.
 *
 * This renders exactly what the model's published Jinja chat_template
 * (tokenizer_config.json of deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B, the
 * revision whose generation prompt ends in "<think>\n") produces for
 * system/user/assistant messages without tool calls.  The rules, read off
 * that template:
 *
 *  1. Output starts with bos_token "<｜begin▁of▁sentence｜>".
 *  2. System messages are not rendered in place: the template loops over all
 *     messages first and *assigns* ns.system_prompt = content for each system
 *     message, so only the LAST system message counts, wherever it appears.
 *     Its text follows the BOS directly (no separator).
 *  3. Then, in order: a user message renders "<｜User｜>" + content; an
 *     assistant message renders "<｜Assistant｜>" + content +
 *     "<｜end▁of▁sentence｜>", where content is first cut to what follows the
 *     LAST "</think>" if it contains one (content.split('</think>')[-1]);
 *     nothing is stripped, so the "\n\n" usually following "</think>" stays.
 *  4. add_generation_prompt appends "<｜Assistant｜><think>\n".
 *
 * Tool messages and tool calls have no counterpart in dsq_chat_message.
 * tests/make_chat_vectors.py renders test cases with the template itself
 * (jinja2) so tests/test_chat.c checks this code against it. */
#include <string.h>

#include "internal.h"

#define BOS "<｜begin▁of▁sentence｜>"
#define EOS "<｜end▁of▁sentence｜>"
#define USER "<｜User｜>"
#define ASSISTANT "<｜Assistant｜>"
#define THINK_END "</think>"
#define GEN_PROMPT "<｜Assistant｜><think>\n"

/* Appends while there is room, counts always. */
typedef struct writer {
    char *buf;
    size_t cap;
    size_t len;
} writer;

static void put(writer *w, const char *s, size_t n)
{
    if (w->buf && w->len + n < w->cap) /* keep one byte for the NUL */
        memcpy(w->buf + w->len, s, n);
    w->len += n;
}

static void puts_(writer *w, const char *s) { put(w, s, strlen(s)); }

/* What follows the last "</think>", or all of s. */
static const char *after_think(const char *s)
{
    const char *r = s, *p = s;
    while ((p = strstr(p, THINK_END)) != NULL) {
        p += strlen(THINK_END);
        r = p;
    }
    return r;
}

dsq_status dsq_chat_format(const dsq_chat_message *msgs, size_t n_msgs,
                           int add_generation_prompt, char *text, size_t cap, size_t *len_out)
{
    dsq_clear_error();
    if (len_out)
        *len_out = 0;
    /* text may be NULL only with cap 0, to ask for the length */
    if (!len_out || (!msgs && n_msgs > 0) || (!text && cap > 0))
        return dsq_fail(DSQ_ERR_INVALID_ARG, "dsq_chat_format: NULL msgs, text or len_out");
    const char *system = NULL;
    for (size_t i = 0; i < n_msgs; i++) {
        if (!msgs[i].content)
            return dsq_fail(DSQ_ERR_INVALID_ARG, "dsq_chat_format: msgs[%zu].content is NULL", i);
        if (msgs[i].role != DSQ_ROLE_SYSTEM && msgs[i].role != DSQ_ROLE_USER &&
            msgs[i].role != DSQ_ROLE_ASSISTANT)
            return dsq_fail(DSQ_ERR_INVALID_ARG, "dsq_chat_format: msgs[%zu].role = %d is not a "
                            "dsq_role", i, (int)msgs[i].role);
        if (msgs[i].role == DSQ_ROLE_SYSTEM)
            system = msgs[i].content; /* the last one wins (rule 2) */
    }

    writer w = { text, cap, 0 };
    puts_(&w, BOS);
    if (system)
        puts_(&w, system);
    for (size_t i = 0; i < n_msgs; i++) {
        if (msgs[i].role == DSQ_ROLE_USER) {
            puts_(&w, USER);
            puts_(&w, msgs[i].content);
        } else if (msgs[i].role == DSQ_ROLE_ASSISTANT) {
            puts_(&w, ASSISTANT);
            puts_(&w, after_think(msgs[i].content));
            puts_(&w, EOS);
        }
    }
    if (add_generation_prompt)
        puts_(&w, GEN_PROMPT);

    *len_out = w.len;
    if (w.len + 1 > cap) {
        if (cap > 0)
            text[0] = '\0'; /* never leave a partial rendering behind */
        return dsq_fail(DSQ_ERR_BUFFER_TOO_SMALL,
                        "dsq_chat_format: the text needs %zu bytes plus NUL, buffer holds %zu",
                        w.len, cap);
    }
    text[w.len] = '\0';
    return DSQ_OK;
}
