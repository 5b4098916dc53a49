/* cmd_generate.c - `dsqwen generate`: one prompt, one streamed reply. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"

/* Whole of stdin as a NUL-terminated string, trailing newline dropped. */
static char *read_stdin(void)
{
    size_t cap = 4096, len = 0;
    char *buf = malloc(cap);
    while (buf) {
        size_t got = fread(buf + len, 1, cap - len - 1, stdin);
        len += got;
        /* stop at end of input: another fread after a terminal's Ctrl-D
         * would wait for a second one */
        if (got == 0 || feof(stdin) || ferror(stdin))
            break;
        if (len + 1 == cap) {
            char *nb = realloc(buf, cap * 2);
            if (!nb) {
                free(buf);
                return NULL;
            }
            buf = nb;
            cap *= 2;
        }
    }
    if (!buf)
        return NULL;
    while (len > 0 && buf[len - 1] == '\n')
        len--;
    buf[len] = '\0';
    return buf;
}

/* The chat-formatted prompt for one user message (plus --system), or the
 * text itself with --raw; tokenized. */
static int build_prompt(const cli_session *s, const cli_opts *o, const char *text,
                        int32_t **ids, int32_t *n)
{
    if (o->raw)
        return cli_tokenize(s, text, 1, ids, n);
    dsq_chat_message msgs[2];
    size_t k = 0;
    if (o->system)
        msgs[k++] = (dsq_chat_message){ DSQ_ROLE_SYSTEM, o->system };
    msgs[k++] = (dsq_chat_message){ DSQ_ROLE_USER, text };
    size_t len = 0;
    dsq_status st = dsq_chat_format(msgs, k, 1, NULL, 0, &len);
    if (st != DSQ_OK && st != DSQ_ERR_BUFFER_TOO_SMALL)
        return cli_report(st, "formatting the chat prompt");
    char *buf = malloc(len + 1);
    if (!buf) {
        fprintf(stderr, "dsqwen: no memory\n");
        return 1;
    }
    st = dsq_chat_format(msgs, k, 1, buf, len + 1, &len);
    int rc = st != DSQ_OK ? cli_report(st, "formatting the chat prompt")
                          : cli_tokenize(s, buf, 0, ids, n);
    free(buf);
    return rc;
}

int cli_generate(const cli_opts *o)
{
    char *text = NULL;
    if (!o->tokens && !o->prompt) {
        /* read stdin before the (slow) load; on a terminal say so, rather
         * than wait silently */
        if (isatty(STDIN_FILENO))
            fprintf(stderr, "dsqwen generate: no prompt given; type it now and end with Ctrl-D "
                            "on an empty line\n(or pass it as an argument: dsqwen generate "
                            "--model DIR \"PROMPT\"; see dsqwen generate --help)\n");
        if (!(text = read_stdin())) {
            fprintf(stderr, "dsqwen: could not read the prompt from stdin\n");
            return CLI_EXIT_FAIL;
        }
    }
    cli_session s;
    if (cli_session_open(&s, o, 1, 1)) {
        free(text);
        return CLI_EXIT_FAIL;
    }
    int rc = CLI_EXIT_FAIL;
    int32_t *prompt = NULL, n_prompt = 0;
    cli_printer pr;
    memset(&pr, 0, sizeof pr);

    if (o->tokens) {
        n_prompt = o->n_tokens;
        prompt = malloc(sizeof(int32_t) * (size_t)n_prompt);
        if (!prompt) {
            fprintf(stderr, "dsqwen: no memory\n");
            goto done;
        }
        memcpy(prompt, o->tokens, sizeof(int32_t) * (size_t)n_prompt);
    } else if (build_prompt(&s, o, o->prompt ? o->prompt : text, &prompt, &n_prompt)) {
        goto done;
    }
    if (cli_printer_init(&pr, &s, o->show_thinking, prompt, n_prompt))
        goto done;
    cli_stats stats;
    cli_turn turn;
    cli_reply_begin();
    int failed = cli_run_turn(&s, &pr, prompt, n_prompt, o->max_tokens, &stats, &turn, NULL);
    int stopped = cli_reply_end();
    if (failed)
        goto done;
    if (cli_printer_finish(&pr))
        goto done;
    if (turn.context_full)
        fprintf(stderr, "dsqwen: stopped: the context (%d tokens) is full\n",
                (int)s.max_context);
    if (stopped)
        fprintf(stderr, "dsqwen: stopped by Ctrl-C\n");
    cli_print_stats(&stats);
    rc = stopped ? CLI_EXIT_INTERRUPTED : CLI_EXIT_OK;
done:
    cli_printer_free(&pr);
    free(prompt);
    free(text);
    cli_session_close(&s);
    return rc;
}
