/* cmd_bench.c - `dsqwen bench`: prefill and decode throughput at the batch
 * sizes given by --batch.
 *
 * For each batch size B: B sequences get a --prompt-len token prompt each
 * (deterministic pseudo-random ids; one prefill call per sequence), then
 * --max-tokens decode steps run with all B sequences in every step, each fed
 * its own next token:
 *   --sampling gpu (default): dsq_step samples each sequence in the library
 *     (on the GPU with CUDA) with the session's sampler settings (the
 *     model's generation_config.json, else temperature 0.6 / top-p 0.95,
 *     changed by --temperature etc.); only the ids come back.  The prompt's
 *     last pass (up to max_batch_tokens tokens) goes through dsq_step too
 *     and samples the first token, so prefill_ms is the time from the call
 *     to the first sampled token (with one sequence: time to first token);
 *   --sampling host: dsq_prefill of the whole prompt with the last row's
 *     logits; dsq_decode_step copies every logits row to the host and the
 *     argmax is taken there (what an application had to do before);
 *   --sampling none: dsq_prefill of all but the last prompt token (whose
 *     logits it copies, to wait for the GPU); no logits at all in the steps,
 *     the last prompt token is fed, then the same token again (the step
 *     alone).
 * Each batch size gets an untimed warm-up round first, and the first decode
 * step of the timed round is still reported apart.  floor% is the step's
 * memory floor -- bytes it must read (weights without the embedding table,
 * plus the KV cache of every sequence at its average length during the
 * steps) at --bandwidth GB/s (default 4,480, the H200's measured streaming
 * bandwidth; the header line names it) -- over the measured ms/step.
 * e2e_t/s is the round's generated tokens (B x steps) over its whole
 * time, prefill and every step included: the figure a server that admits
 * B prompts at once and generates `steps` tokens for each can be held to
 * (decode_t/s leaves the prefill out). */
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

static int bench_one(cli_session *s, const cli_opts *o, int32_t B, int32_t P, int32_t G, int32_t *prompt,
                     int32_t *seqs, int32_t *toks, dsq_step_seq *ent, dsq_step_out *outs, int quiet)
{
    const int32_t V = s->info.n_vocab;
    const int mode = o->bench_sampling;
    const dsq_sample_params sp = cli_sample_params(s);
    dsq_status st;
    dsq_ctx_info ci;
    memset(&ci, 0, sizeof ci);
    ci.struct_size = sizeof ci;
    dsq_ctx_get_info(s->ctx, &ci);
    const int32_t mbt = ci.max_batch_tokens > 0 ? ci.max_batch_tokens : 1;
    uint64_t rng = 0x9e3779b97f4a7c15ull * (uint64_t)(B + 1);
    /* --sampling none queues its steps without waiting for them: the
     * previous round's last steps must not be timed as this prefill */
    if ((st = dsq_ctx_synchronize(s->ctx)) != DSQ_OK)
        return cli_report(st, "synchronizing");
    double t0 = cli_now();
    for (int32_t b = 0; b < B; b++) {
        for (int32_t i = 0; i < P; i++) {
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            prompt[i] = (int32_t)((rng >> 33) % (uint64_t)s->n_vocab_valid);
        }
        seqs[b] = b;
        if (mode == CLI_BENCH_STEP) {
            /* gpu: the prompt's last pass through dsq_step with sampling in
             * the library (what a server does), so the prefill time is the
             * time to the first sampled token; tokens before that pass are
             * queued by dsq_prefill without logits */
            const int32_t c = P < mbt ? P : mbt;
            st = P > c ? dsq_prefill(s->ctx, b, prompt, P - c, DSQ_LOGITS_LAST, NULL) : DSQ_OK;
            if (st == DSQ_OK) {
                ent[0] = (dsq_step_seq){ b, c, prompt + (P - c), &sp, 0, 0 };
                st = dsq_step(s->ctx, ent, 1, NULL, outs);
            }
            if (st != DSQ_OK)
                return cli_report(st, "prefill");
            toks[b] = outs[0].token >= 0 ? outs[0].token : 0;
            continue;
        }
        /* host: the whole prompt, its last logits row argmaxed below;
         * none: all but the last prompt token, which the first step feeds */
        if (mode == CLI_BENCH_HOST)
            st = dsq_prefill(s->ctx, b, prompt, P, DSQ_LOGITS_LAST, s->logits + (size_t)b * V);
        else if (P > 1)
            /* the logits are not used, but asking for them makes the call wait
             * for the GPU: with NULL it returns once the work is queued and
             * the prefill time would measure the queueing only */
            st = dsq_prefill(s->ctx, b, prompt, P - 1, DSQ_LOGITS_LAST, s->logits + (size_t)b * V);
        else
            st = DSQ_OK;
        if (st != DSQ_OK)
            return cli_report(st, "prefill");
        toks[b] = prompt[P - 1];
    }
    double t_prefill = cli_now() - t0;
    /* none: the last prompt token goes in by an untimed step (it would
     * otherwise count its CUDA graph capture as prefill time; the timed
     * steps below feed the same token again) */
    if (mode == CLI_BENCH_NONE && (st = dsq_decode_step(s->ctx, B, seqs, toks, NULL)) != DSQ_OK)
        return cli_report(st, "decode step");
    if (mode == CLI_BENCH_HOST)
        for (int32_t b = 0; b < B; b++)
            toks[b] = argmax(s->logits + (size_t)b * V, s->n_vocab_valid);

    double t_step0 = 0.0, t_rest = 0.0;
    for (int32_t g = 0; g < G; g++) {
        double t = cli_now();
        if (mode == CLI_BENCH_STEP) {
            for (int32_t b = 0; b < B; b++)
                ent[b] = (dsq_step_seq){ b, 1, &toks[b], &sp, 0, 0 };
            if ((st = dsq_step(s->ctx, ent, B, NULL, outs)) != DSQ_OK)
                return cli_report(st, "decode step");
            for (int32_t b = 0; b < B; b++)
                toks[b] = outs[b].token >= 0 ? outs[b].token : 0;
        } else if (mode == CLI_BENCH_HOST) {
            if ((st = dsq_decode_step(s->ctx, B, seqs, toks, s->logits)) != DSQ_OK)
                return cli_report(st, "decode step");
            for (int32_t b = 0; b < B; b++)
                toks[b] = argmax(s->logits + (size_t)b * V, s->n_vocab_valid);
        } else {
            if ((st = dsq_decode_step(s->ctx, B, seqs, toks, NULL)) != DSQ_OK)
                return cli_report(st, "decode step");
        }
        /* none: the steps were only queued; the last one's time includes
         * waiting for all of them */
        if (mode == CLI_BENCH_NONE && g == G - 1 && (st = dsq_ctx_synchronize(s->ctx)) != DSQ_OK)
            return cli_report(st, "synchronizing");
        t = cli_now() - t;
        if (g == 0)
            t_step0 = t;
        else
            t_rest += t;
    }
    int32_t timed = G > 1 ? G - 1 : G;
    double t_dec = G > 1 ? t_rest : t_step0;
    /* the memory floor of an average step: weights read once (not the
     * embedding table, of which only B rows are read) + every sequence's KV */
    double wbytes = (double)(s->info.device_bytes > 0 ? s->info.device_bytes : s->info.weight_bytes);
    if (!s->info.tie_embeddings)
        wbytes -= (double)s->info.n_vocab * s->info.n_embd * 2.0; /* bf16 table */
    double kv = (double)B * (P + G / 2.0) * (double)ci.kv_bytes_per_token;
    double floor_ms = (wbytes + kv) / ((double)o->bench_gbps * 1e9) * 1e3;
    if (!quiet)
        printf("%6d %7d %12.1f %10.1f %8d %12.3f %12.1f %12.1f %8.1f %10.1f\n", (int)B, (int)P,
           (double)B * P / t_prefill, 1e3 * t_prefill, (int)G, 1e3 * t_dec / timed,
           (double)B * timed / t_dec, 1e3 * t_step0, 100.0 * floor_ms / (1e3 * t_dec / timed),
           (double)B * G / (t_prefill + t_step0 + t_rest));
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
    dsq_step_seq *ent = malloc(sizeof(dsq_step_seq) * (size_t)max_b);
    dsq_step_out *outs = malloc(sizeof(dsq_step_out) * (size_t)max_b);
    int rc = 1;
    if (!prompt || !seqs || !toks || !ent || !outs) {
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
    fprintf(stderr, "[backend %s, kv %s %s, %d layers, vocab %d, context %d, sampling %s, floor%% at %g GB/s]\n",
            s.info.backend == DSQ_BACKEND_CUDA ? "cuda" : "cpu",
            ci.kv_layout == DSQ_KV_PAGED ? "paged" : "static",
            ci.kv_dtype == DSQ_KV_INT8 ? "int8" : ci.kv_dtype == DSQ_KV_F32 ? "f32" : "f16",
            (int)s.info.n_layers, (int)s.info.n_vocab, (int)s.max_context,
            o->bench_sampling == CLI_BENCH_HOST ? "host argmax of copied logits"
            : o->bench_sampling == CLI_BENCH_NONE
                ? "none (no logits)"
                : "in the library (dsq_step); prefill_ms: call to first sampled token",
            (double)o->bench_gbps);
    printf("%6s %7s %12s %10s %8s %12s %12s %12s %8s %10s\n", "batch", "prompt", "prefill_t/s",
           "prefill_ms", "steps", "ms/step", "decode_t/s", "step0_ms", "floor%", "e2e_t/s");
    for (int32_t i = 0; i < n_batches; i++) {
        /* an untimed round first: one-time setup (kernel selection, graph
         * capture, page faults) must not count as throughput */
        if (bench_one(&s, o, batches[i], P, G < 3 ? G : 3, prompt, seqs, toks, ent, outs, 1) ||
            bench_one(&s, o, batches[i], P, G, prompt, seqs, toks, ent, outs, 0))
            goto done;
    }
    rc = 0;
done:
    free(prompt);
    free(seqs);
    free(toks);
    free(ent);
    free(outs);
    cli_session_close(&s);
    return rc;
}
