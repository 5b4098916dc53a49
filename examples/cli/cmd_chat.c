/* cmd_chat.c - `dsqwen chat`: interactive multi-turn chat from stdin.
 *
 * The conversation lives in the KV cache of sequence 0: after each reply only
 * the new turn's tokens are prefilled.  That differs from re-rendering the
 * whole conversation with the chat template in one respect: the template
 * drops an earlier reply's <think>..</think> part, while the cache keeps the
 * tokens the model actually produced (thought included).  Re-prefilling the
 * whole history each turn would cost O(history) per turn; keeping the cache
 * is what interactive use wants.
 *
 * Each line of input is one user message.  "/reset" starts over, "/quit" (or
 * end of input) leaves.  Without a tokenizer (e.g. the tiny test model) each
 * line is a comma-separated list of token ids, appended as they are. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"

#define BOS_TEXT "<｜begin▁of▁sentence｜>"
#define EOS_TEXT "<｜end▁of▁sentence｜>"

/* Text to append for a user turn: the chat template's rendering of
 * [system?, user] + generation prompt on the first turn; on later turns the
 * same for [user] alone, minus the BOS that opens every rendering. */
static char *turn_text(const cli_opts *o, const char *user, int first)
{
    dsq_chat_message msgs[2];
    size_t k = 0, len = 0;
    if (first && o->system)
        msgs[k++] = (dsq_chat_message){ DSQ_ROLE_SYSTEM, o->system };
    msgs[k++] = (dsq_chat_message){ DSQ_ROLE_USER, user };
    dsq_status st = dsq_chat_format(msgs, k, 1, NULL, 0, &len);
    char *buf = (st == DSQ_OK || st == DSQ_ERR_BUFFER_TOO_SMALL) ? malloc(len + 1) : NULL;
    if (buf && (st = dsq_chat_format(msgs, k, 1, buf, len + 1, &len)) == DSQ_OK) {
        size_t nb = strlen(BOS_TEXT);
        if (!first && strncmp(buf, BOS_TEXT, nb) == 0)
            memmove(buf, buf + nb, len - nb + 1);
        return buf;
    }
    free(buf);
    if (st != DSQ_OK)
        cli_report(st, "formatting the chat turn");
    else
        fprintf(stderr, "dsqwen: no memory\n");
    return NULL;
}

/* Token ids for one input line, including what closes the previous reply:
 * its last sampled token (never fed to the model yet) and, if the reply was
 * cut short (--max-tokens or a --stop string), the EOS the template puts
 * after every assistant message. */
static int turn_tokens(const cli_session *s, const cli_opts *o, const char *line, int first,
                       const cli_turn *prev, int32_t **ids, int32_t *n)
{
    int32_t *body = NULL, n_body = 0;
    if (!s->tok) {
        if (cli_parse_ids(line, &body, &n_body))
            return 1;
    } else if (o->raw) {
        if (cli_tokenize(s, line, first, &body, &n_body))
            return 1;
    } else {
        char *text = turn_text(o, line, first);
        if (!text)
            return 1;
        int rc = cli_tokenize(s, text, 0, &body, &n_body);
        free(text);
        if (rc)
            return 1;
    }
    int32_t extra = 0, pre[2];
    if (!first && prev->last >= 0) {
        pre[extra++] = prev->last;
        if (!prev->ended_eos && !o->raw && s->eos >= 0)
            pre[extra++] = s->eos;
    }
    int32_t *all = malloc(sizeof(int32_t) * (size_t)(n_body + extra));
    if (!all) {
        free(body);
        fprintf(stderr, "dsqwen: no memory\n");
        return 1;
    }
    memcpy(all, pre, sizeof(int32_t) * (size_t)extra);
    memcpy(all + extra, body, sizeof(int32_t) * (size_t)n_body);
    free(body);
    *ids = all;
    *n = n_body + extra;
    return 0;
}

int cli_chat(const cli_opts *o)
{
    cli_session s;
    if (cli_session_open(&s, o, 1, 1))
        return 1;
    int interactive = isatty(STDIN_FILENO), rc = 0, first = 1;
    char *line = NULL;
    size_t line_cap = 0;
    cli_turn prev = { -1, 0, 0, 0 };
    if (interactive)
        fprintf(stderr, "dsqwen chat: one message per line; /reset starts over, /quit leaves.%s\n",
                s.tok ? "" : " No tokenizer: type token ids, e.g. 1,2,3.");
    for (;;) {
        if (interactive) {
            fputs("> ", stdout);
            fflush(stdout);
        }
        ssize_t got = getline(&line, &line_cap, stdin);
        if (got < 0)
            break;
        while (got > 0 && (line[got - 1] == '\n' || line[got - 1] == '\r'))
            line[--got] = '\0';
        if (got == 0)
            continue;
        if (strcmp(line, "/quit") == 0 || strcmp(line, "/exit") == 0)
            break;
        if (strcmp(line, "/reset") == 0) {
            dsq_status st = dsq_seq_remove(s.ctx, 0);
            if (st != DSQ_OK) {
                rc = cli_report(st, "resetting the conversation");
                break;
            }
            dsq_sampler_reset(s.sampler, s.sp.seed);
            first = 1;
            prev.last = -1;
            continue;
        }
        int32_t *ids = NULL, n = 0;
        if (turn_tokens(&s, o, line, first, &prev, &ids, &n)) {
            rc = 1;
            break;
        }
        cli_printer pr;
        cli_stats stats;
        if (cli_printer_init(&pr, &s, o->show_thinking, ids, n)) {
            free(ids);
            rc = 1;
            break;
        }
        int failed = cli_run_turn(&s, &pr, ids, n, o->max_tokens, &stats, &prev);
        free(ids);
        if (!failed)
            failed = cli_printer_finish(&pr);
        cli_printer_free(&pr);
        if (failed && !prev.context_full) {
            rc = 1;
            break;
        }
        if (!failed)
            cli_print_stats(&stats);
        if (prev.context_full) {
            fprintf(stderr, "dsqwen: the context (%d tokens) is full; starting a new "
                            "conversation (raise --ctx to keep more)\n", (int)s.max_context);
            dsq_seq_remove(s.ctx, 0);
            dsq_sampler_reset(s.sampler, s.sp.seed);
            first = 1;
            prev.last = -1;
            continue;
        }
        first = 0;
    }
    free(line);
    cli_session_close(&s);
    return rc;
}
