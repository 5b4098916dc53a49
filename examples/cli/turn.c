/* turn.c - one prompt + streamed reply on sequence 0, with timing. */
#include <stdio.h>

#include "cli.h"

int cli_run_turn(cli_session *s, cli_printer *p, const int32_t *prompt, int32_t n_prompt,
                 int32_t max_tokens, cli_stats *stats, cli_turn *turn, cli_tokvec *reply)
{
    const int32_t seq = 0;
    turn->last = -1;
    turn->ended_eos = 0;
    turn->context_full = 0;
    turn->stopped = 0;
    turn->interrupted = 0;
    turn->prefill_failed = 1;
    stats->n_prompt = n_prompt;
    stats->n_decode = 0;
    stats->t_first = stats->t_decode = 0.0;

    int32_t held = 0;
    dsq_status st = dsq_seq_length(s->ctx, seq, &held);
    if (st != DSQ_OK)
        return cli_report(st, "reading the sequence length");
    if (held + n_prompt > s->max_context) {
        fprintf(stderr, "dsqwen: the prompt (%d tokens) does not fit: the context holds %d of "
                        "%d tokens (raise --ctx)\n", (int)n_prompt, (int)held,
                (int)s->max_context);
        turn->context_full = 1;
        return 1;
    }
    if (n_prompt < 1) {
        fprintf(stderr, "dsqwen: empty prompt\n");
        return 1;
    }
    /* The prompt but its last token is prefilled; every dsq_step then feeds
     * one token and samples the next inside the library (on the GPU with
     * CUDA; the penalty window sees the prompt too, as in HF generate()). */
    const dsq_sample_params sp = cli_sample_params(s);
    double t0 = cli_now();
    if (n_prompt > 1 && (st = dsq_prefill(s->ctx, seq, prompt, n_prompt - 1, DSQ_LOGITS_LAST, NULL)) != DSQ_OK)
        return cli_report(st, "prefill");
    held += n_prompt - 1;
    int32_t feed = prompt[n_prompt - 1];

    double t_first_abs = 0.0;
    for (int32_t n_gen = 0;;) {
        dsq_step_seq e = { seq, 1, &feed, &sp, 0, 0 };
        dsq_step_out o;
        if ((st = dsq_step(s->ctx, &e, 1, NULL, &o)) != DSQ_OK)
            return cli_report(st, n_gen == 0 ? "prefill" : "decode step");
        held++;
        turn->prefill_failed = 0; /* the prompt's last token went in with this step */
        if (n_gen > 0)
            stats->n_decode++;
        if (o.token < 0) {
            fprintf(stderr, "dsqwen: the model produced no finite logit\n");
            return 1;
        }
        const int32_t tok = o.token;
        turn->last = tok;
        if (reply && cli_tokvec_push(reply, &tok, 1))
            return 1;
        if (n_gen++ == 0) {
            t_first_abs = cli_now();
            stats->t_first = t_first_abs - t0;
        }
        if (tok == s->eos) {
            turn->ended_eos = 1;
            break;
        }
        if (cli_printer_push(p, tok))
            return 1;
        if (p->stopped) { /* a --stop string completed: the reply ends here */
            turn->stopped = 1;
            break;
        }
        if (n_gen >= max_tokens)
            break;
        if (cli_interrupted()) { /* Ctrl-C: this token was the last */
            turn->interrupted = 1;
            break;
        }
        if (held + 1 > s->max_context) {
            turn->context_full = 1;
            break;
        }
        feed = tok;
    }
    stats->t_decode = cli_now() - t_first_abs;
    return 0;
}

void cli_print_stats(const cli_stats *st)
{
    double tps = st->t_decode > 0 ? st->n_decode / st->t_decode : 0.0;
    fprintf(stderr,
            "[prompt %d tokens, time to first token %.1f ms, decode %d tokens at %.2f tokens/s]\n",
            (int)st->n_prompt, 1e3 * st->t_first, (int)st->n_decode, tps);
}
