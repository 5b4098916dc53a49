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
 * The tokens are also kept here (`hist`), so that when a new message does not
 * fit any more, the oldest turns are dropped and the rest is prefilled again
 * (the user is told); the new message is always answered if it fits alone.
 *
 * Each line of input is one user message.  "/reset" starts over, "/quit" (or
 * end of input) leaves.  A line that cannot be used (bad token ids, a message
 * longer than the whole context) is reported and skipped.  Without a
 * tokenizer (e.g. the tiny test model) each line is a comma-separated list of
 * token ids, appended as they are. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"

#define BOS_TEXT "<｜begin▁of▁sentence｜>"

typedef struct chat {
    cli_session s;
    const cli_opts *o;
    cli_tokvec hist;     /* the conversation as the cache should hold it:
                            prefix, then per turn user part + reply tokens
                            (+ EOS once closed); the cache holds a prefix of
                            it (the last sampled token is fed with the next
                            message)                                        */
    int32_t n_prefix;    /* BOS + system prompt tokens at the start of hist */
    int32_t *turn_start; /* [n_turns] where each turn's user part begins    */
    int32_t n_turns, cap_turns;
    int need_close;      /* the last reply ended without EOS: append one    */
} chat;

/* Chat-template text: the prefix (BOS + system prompt) when `user` is NULL,
 * else one user turn with the generation prompt, without the BOS that opens
 * every rendering. */
static char *render(const cli_opts *o, const char *user)
{
    dsq_chat_message msg;
    size_t len = 0;
    if (!user && !o->system)
        return strdup(BOS_TEXT);
    msg = user ? (dsq_chat_message){ DSQ_ROLE_USER, user }
               : (dsq_chat_message){ DSQ_ROLE_SYSTEM, o->system };
    int gen = user != NULL;
    dsq_status st = dsq_chat_format(&msg, 1, gen, NULL, 0, &len);
    char *buf = (st == DSQ_OK || st == DSQ_ERR_BUFFER_TOO_SMALL) ? malloc(len + 1) : NULL;
    if (buf && (st = dsq_chat_format(&msg, 1, gen, buf, len + 1, &len)) == DSQ_OK) {
        size_t nb = strlen(BOS_TEXT);
        if (user && strncmp(buf, BOS_TEXT, nb) == 0)
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

/* Tokens of the conversation prefix: BOS + system prompt (template), BOS
 * (raw text), nothing (token ids). */
static int prefix_tokens(const chat *c, int32_t **ids, int32_t *n)
{
    *ids = NULL;
    *n = 0;
    if (!c->s.tok)
        return 0;
    if (c->o->raw)
        return cli_tokenize(&c->s, "", 1, ids, n);
    char *text = render(c->o, NULL);
    if (!text)
        return 1;
    int rc = cli_tokenize(&c->s, text, 0, ids, n);
    free(text);
    return rc;
}

/* Tokens of one user message. */
static int user_tokens(const chat *c, const char *line, int32_t **ids, int32_t *n)
{
    if (!c->s.tok)
        return cli_parse_list("chat line", line, 0, INT32_MAX, ids, n);
    if (c->o->raw)
        return cli_tokenize(&c->s, line, 0, ids, n);
    char *text = render(c->o, line);
    if (!text)
        return 1;
    int rc = cli_tokenize(&c->s, text, 0, ids, n);
    free(text);
    return rc;
}

static void reset(chat *c)
{
    c->hist.n = 0;
    c->n_turns = 0;
    c->need_close = 0;
}

/* Make room for a new message of `n_user` tokens: drop the oldest turns
 * until the kept history + the message + room for a reply fit.  Returns 0
 * (history unchanged or shortened, cache emptied when shortened), 1 if the
 * message cannot fit even alone, -1 on a library error. */
static int make_room(chat *c, int32_t n_user)
{
    const int32_t max = c->s.max_context;
    int32_t reserve = c->o->max_tokens < max / 4 ? c->o->max_tokens : max / 4;
    if ((int64_t)c->hist.n + n_user + reserve <= max)
        return 0;
    if ((int64_t)c->n_prefix + n_user + 1 > max) {
        fprintf(stderr, "dsqwen: this message (%d tokens) does not fit in the context (%d tokens); "
                        "not sent (raise --ctx)\n", (int)n_user, (int)max);
        return 1;
    }
    int32_t k = 0; /* turns to drop */
    while (k < c->n_turns &&
           (int64_t)c->n_prefix + (c->hist.n - c->turn_start[k]) + n_user + reserve > max)
        k++;
    if (k == 0)
        return 0; /* no earlier turn: the reply just gets less room */
    int32_t from = k < c->n_turns ? c->turn_start[k] : c->hist.n;
    fprintf(stderr, "dsqwen: the context (%d tokens) is full: dropped the oldest %d of %d "
                    "turn(s) of this conversation (raise --ctx to keep more)\n",
            (int)max, (int)k, (int)c->n_turns);
    int32_t cut = from - c->n_prefix;
    memmove(c->hist.v + c->n_prefix, c->hist.v + from,
            sizeof(int32_t) * (size_t)(c->hist.n - from));
    c->hist.n -= cut;
    for (int32_t i = k; i < c->n_turns; i++)
        c->turn_start[i - k] = c->turn_start[i] - cut;
    c->n_turns -= k;
    dsq_status st = dsq_seq_remove(c->s.ctx, 0);
    if (st != DSQ_OK) {
        cli_report(st, "dropping the old conversation");
        return -1;
    }
    return 0;
}

/* One user message: returns 0 (answered or skipped with a message), else an
 * exit code for a failure that ends the chat. */
static int one_message(chat *c, const char *line)
{
    cli_session *s = &c->s;
    int32_t *u = NULL, n_u = 0;
    if (user_tokens(c, line, &u, &n_u))
        return 0; /* reported; the conversation is unchanged */
    if (n_u == 0) {
        free(u);
        return 0;
    }
    if (c->hist.n == 0) {
        int32_t *pre = NULL, n_pre = 0;
        if (prefix_tokens(c, &pre, &n_pre) || cli_tokvec_push(&c->hist, pre, n_pre)) {
            free(pre);
            free(u);
            return CLI_EXIT_FAIL;
        }
        free(pre);
        c->n_prefix = n_pre;
    }
    if (c->need_close) { /* the previous reply was cut short: close it */
        if (cli_tokvec_push(&c->hist, &s->eos, 1)) {
            free(u);
            return CLI_EXIT_FAIL;
        }
        c->need_close = 0;
    }
    int room = make_room(c, n_u);
    if (room != 0) {
        free(u);
        return room < 0 ? CLI_EXIT_FAIL : 0;
    }
    int32_t held = 0; /* the cache holds hist[0:held] */
    dsq_status st = dsq_seq_length(s->ctx, 0, &held);
    if (st != DSQ_OK) {
        free(u);
        return cli_report(st, "reading the sequence length");
    }
    /* the new turn */
    if (c->n_turns == c->cap_turns) {
        int32_t cap = c->cap_turns ? 2 * c->cap_turns : 16;
        int32_t *nt = realloc(c->turn_start, sizeof(int32_t) * (size_t)cap);
        if (!nt) {
            free(u);
            fprintf(stderr, "dsqwen: no memory\n");
            return CLI_EXIT_FAIL;
        }
        c->turn_start = nt;
        c->cap_turns = cap;
    }
    int32_t turn_at = c->hist.n;
    if (cli_tokvec_push(&c->hist, u, n_u)) {
        free(u);
        return CLI_EXIT_FAIL;
    }
    free(u);
    c->turn_start[c->n_turns++] = turn_at;

    /* feed what the cache lacks: the previous reply's last token (+ EOS),
     * this message -- or, after dropping turns, the whole kept history */
    int32_t n_feed = c->hist.n - held;
    int32_t *feed = malloc(sizeof(int32_t) * (size_t)n_feed);
    if (!feed) {
        fprintf(stderr, "dsqwen: no memory\n");
        return CLI_EXIT_FAIL;
    }
    memcpy(feed, c->hist.v + held, sizeof(int32_t) * (size_t)n_feed);
    cli_printer pr;
    cli_stats stats;
    cli_turn turn;
    if (cli_printer_init(&pr, s, c->o->show_thinking, feed, n_feed)) {
        free(feed);
        return CLI_EXIT_FAIL;
    }
    cli_reply_begin();
    int failed = cli_run_turn(s, &pr, feed, n_feed, c->o->max_tokens, &stats, &turn, &c->hist);
    int interrupted = cli_reply_end();
    free(feed);
    if (failed && turn.prefill_failed) {
        /* the message was refused (e.g. a token id out of range): the cache
         * is as before; forget the message and go on */
        cli_printer_free(&pr);
        c->hist.n = turn_at;
        c->n_turns--;
        return 0;
    }
    if (!failed)
        failed = cli_printer_finish(&pr);
    cli_printer_free(&pr);
    if (failed)
        return CLI_EXIT_FAIL;
    cli_print_stats(&stats);
    if (interrupted)
        fprintf(stderr, "dsqwen: reply stopped (Ctrl-C); Ctrl-C at the prompt quits\n");
    if (turn.context_full)
        fprintf(stderr, "dsqwen: the context (%d tokens) filled up during this reply; the oldest "
                        "turns make way for the next message\n", (int)s->max_context);
    c->need_close = !turn.ended_eos && !c->o->raw && s->eos >= 0;
    return 0;
}

int cli_chat(const cli_opts *o)
{
    chat c;
    memset(&c, 0, sizeof c);
    c.o = o;
    if (cli_session_open(&c.s, o, 1, 1))
        return CLI_EXIT_FAIL;
    int interactive = isatty(STDIN_FILENO), rc = CLI_EXIT_OK;
    cli_input_init(interactive);
    if (interactive)
        fprintf(stderr, "dsqwen chat: one message per line; /reset starts over, /quit leaves.%s\n",
                c.s.tok ? "" : " No tokenizer: type token ids, e.g. 1,2,3.");
    for (;;) {
        char *line = cli_read_line(interactive ? "> " : NULL);
        if (!line)
            break;
        if (!line[0]) {
            free(line);
            continue;
        }
        if (strcmp(line, "/quit") == 0 || strcmp(line, "/exit") == 0) {
            free(line);
            break;
        }
        if (strcmp(line, "/reset") == 0) {
            free(line);
            dsq_status st = dsq_seq_remove(c.s.ctx, 0);
            if (st != DSQ_OK) {
                rc = cli_report(st, "resetting the conversation");
                break;
            }
            dsq_sampler_reset(c.s.sampler, c.s.sp.seed);
            reset(&c);
            continue;
        }
        rc = one_message(&c, line);
        free(line);
        if (rc != 0)
            break;
    }
    if (interactive)
        fputc('\n', stdout);
    cli_input_close();
    cli_tokvec_free(&c.hist);
    free(c.turn_start);
    cli_session_close(&c.s);
    return rc;
}
