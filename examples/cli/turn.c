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
    double t0 = cli_now();
    st = dsq_prefill(s->ctx, seq, prompt, n_prompt, DSQ_LOGITS_LAST, s->logits);
    if (st != DSQ_OK)
        return cli_report(st, "prefill");
    held += n_prompt;
    turn->prefill_failed = 0;
    /* the penalty window sees the prompt too, as in HF generate() */
    if ((st = dsq_sampler_accept(s->sampler, prompt, (size_t)n_prompt)) != DSQ_OK)
        return cli_report(st, "recording the prompt");

    double t_first_abs = 0.0;
    for (int32_t n_gen = 0;;) {
        int32_t tok;
        if ((st = dsq_sampler_sample(s->sampler, s->logits, s->info.n_vocab, &tok)) != DSQ_OK)
            return cli_report(st, "sampling");
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
        if ((st = dsq_decode_step(s->ctx, 1, &seq, &tok, s->logits)) != DSQ_OK)
            return cli_report(st, "decode step");
        held++;
        stats->n_decode++;
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
