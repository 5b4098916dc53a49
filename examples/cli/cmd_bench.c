/* cmd_bench.c - `dsqwen bench`: prefill and decode throughput at the batch
 * sizes given by --batch.
 *
 * For each batch size B: B sequences get a --prompt-len token prompt each
 * (deterministic pseudo-random ids; one prefill call per sequence), then
 * --max-tokens decode steps run with all B sequences in every step, each fed
 * its own greedy (argmax) token, logits copied to the host as a real
 * application would.  Each batch size gets an untimed warm-up round first,
 * and the first decode step of the timed round is still reported apart. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

static int32_t argmax(const float *x, int32_t n)
{
    int32_t best = 0;
    for (int32_t i = 1; i < n; i++)
        if (x[i] > x[best])
            best = i;
    return best;
}

static int bench_one(cli_session *s, int32_t B, int32_t P, int32_t G, int32_t *prompt,
                     int32_t *seqs, int32_t *toks, int quiet)
{
    const int32_t V = s->info.n_vocab;
    dsq_status st;
    uint64_t rng = 0x9e3779b97f4a7c15ull * (uint64_t)(B + 1);
    double t0 = cli_now();
    for (int32_t b = 0; b < B; b++) {
        for (int32_t i = 0; i < P; i++) {
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            prompt[i] = (int32_t)((rng >> 33) % (uint64_t)s->n_vocab_valid);
        }
        seqs[b] = b;
        if ((st = dsq_prefill(s->ctx, b, prompt, P, DSQ_LOGITS_LAST, s->logits + (size_t)b * V)) !=
            DSQ_OK)
            return cli_report(st, "prefill");
    }
    double t_prefill = cli_now() - t0;
    for (int32_t b = 0; b < B; b++)
        toks[b] = argmax(s->logits + (size_t)b * V, s->n_vocab_valid);

    double t_step0 = 0.0, t_rest = 0.0;
    for (int32_t g = 0; g < G; g++) {
        double t = cli_now();
        if ((st = dsq_decode_step(s->ctx, B, seqs, toks, s->logits)) != DSQ_OK)
            return cli_report(st, "decode step");
        for (int32_t b = 0; b < B; b++)
            toks[b] = argmax(s->logits + (size_t)b * V, s->n_vocab_valid);
        t = cli_now() - t;
        if (g == 0)
            t_step0 = t;
        else
            t_rest += t;
    }
    int32_t timed = G > 1 ? G - 1 : G;
    double t_dec = G > 1 ? t_rest : t_step0;
    if (!quiet)
        printf("%6d %7d %12.1f %10.1f %8d %12.2f %12.1f %12.1f\n", (int)B, (int)P,
           (double)B * P / t_prefill, 1e3 * t_prefill, (int)G, 1e3 * t_dec / timed,
           (double)B * timed / t_dec, 1e3 * t_step0);
    fflush(stdout);
    for (int32_t b = 0; b < B; b++)
        if ((st = dsq_seq_remove(s->ctx, b)) != DSQ_OK)
            return cli_report(st, "removing a sequence");
    return 0;
}

int cli_bench(const cli_opts *o)
{
    /* --batch was checked when parsed (1..65536 each) */
    static const int32_t one = 1;
    const int32_t *batches = o->n_batch ? o->batch : &one;
    int32_t n_batches = o->n_batch ? o->n_batch : 1, max_b = 0;
    for (int32_t i = 0; i < n_batches; i++)
        if (batches[i] > max_b)
            max_b = batches[i];
    int32_t P = o->prompt_len, G = o->max_tokens;
    cli_opts oo = *o;
    if (oo.ctx <= 0)
        oo.ctx = P + G + 1;
    cli_session s;
    if (cli_session_open(&s, &oo, max_b, max_b))
        return 1;
    int32_t *prompt = malloc(sizeof(int32_t) * (size_t)P);
    int32_t *seqs = malloc(sizeof(int32_t) * (size_t)max_b);
    int32_t *toks = malloc(sizeof(int32_t) * (size_t)max_b);
    int rc = 1;
    if (!prompt || !seqs || !toks) {
        fprintf(stderr, "dsqwen: no memory\n");
        goto done;
    }
    if (P + G > s.max_context) {
        fprintf(stderr, "dsqwen: --prompt-len + --max-tokens (%d) exceeds the context (%d)\n",
                (int)(P + G), (int)s.max_context);
        goto done;
    }
    dsq_ctx_info ci;
    memset(&ci, 0, sizeof ci);
    ci.struct_size = sizeof ci;
    dsq_ctx_get_info(s.ctx, &ci);
    fprintf(stderr, "[backend %s, kv %s %s, %d layers, vocab %d, context %d]\n",
            s.info.backend == DSQ_BACKEND_CUDA ? "cuda" : "cpu",
            ci.kv_layout == DSQ_KV_PAGED ? "paged" : "static",
            ci.kv_dtype == DSQ_KV_INT8 ? "int8" : ci.kv_dtype == DSQ_KV_F32 ? "f32" : "f16",
            (int)s.info.n_layers, (int)s.info.n_vocab, (int)s.max_context);
    printf("%6s %7s %12s %10s %8s %12s %12s %12s\n", "batch", "prompt", "prefill_t/s",
           "prefill_ms", "steps", "ms/step", "decode_t/s", "step0_ms");
    for (int32_t i = 0; i < n_batches; i++) {
        /* an untimed round first: one-time setup (kernel selection, graph
         * capture, page faults) must not count as throughput */
        if (bench_one(&s, batches[i], P, G < 3 ? G : 3, prompt, seqs, toks, 1) ||
            bench_one(&s, batches[i], P, G, prompt, seqs, toks, 0))
            goto done;
    }
    rc = 0;
done:
    free(prompt);
    free(seqs);
    free(toks);
    cli_session_close(&s);
    return rc;
}
