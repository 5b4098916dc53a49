/* tp_local.c - tensor parallelism from one process: the model split over
 * WORLD local GPUs (devices 0..WORLD-1), greedy decoding of a prompt of
 * token ids, and the decode speed.
 *
 * Usage: tp_local MODEL_DIR WORLD [--steps N] [--batch B] [--cpu] [ID...]
 *   WORLD 0: one GPU, no tensor parallelism (the baseline); 1: one rank
 *   through NCCL.  --batch B decodes B copies of the prompt together.
 *   --cpu: the CPU backend's in-process ranks (verification only: the
 *   sharded math, not faster).
 * Prints the generated ids of sequence 0 and one line
 *   "tp_local: world W batch B: X tok/s (Y ms/step)"
 * which scripts/tp_check.sh reads. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dsqwen.h"

static int check(dsq_status st, const char *what)
{
    if (st != DSQ_OK)
        fprintf(stderr, "%s: %s (%s)\n", what, dsq_status_string(st), dsq_last_error_message());
    return st != DSQ_OK;
}

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: %s MODEL_DIR WORLD [--steps N] [--batch B] [--cpu] [ID...]\n", argv[0]);
        return 2;
    }
    const int world = atoi(argv[2]);
    int steps = 32, batch = 1, n_prompt = 0, rc = 1, cpu = 0;
    int32_t prompt[256], devices[64];
    for (int i = 3; i < argc; i++) {
        if (!strcmp(argv[i], "--steps") && i + 1 < argc)
            steps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--batch") && i + 1 < argc)
            batch = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--cpu"))
            cpu = 1;
        else if (n_prompt < 256)
            prompt[n_prompt++] = (int32_t)atoi(argv[i]);
    }
    if (world < 0 || world > 64 || steps < 1 || batch < 1 || batch > 256) {
        fprintf(stderr, "tp_local: WORLD 0..64, --steps >= 1, --batch 1..256\n");
        return 2;
    }
    if (n_prompt == 0) /* a fixed prompt of ids when none is given */
        for (; n_prompt < 16; n_prompt++)
            prompt[n_prompt] = 100 + 7 * n_prompt;
    for (int r = 0; r < world; r++)
        devices[r] = r;

    dsq_model_params mp = dsq_model_default_params();
    mp.backend = cpu ? DSQ_BACKEND_CPU : DSQ_BACKEND_CUDA;
    mp.tp_world = world;
    mp.tp_devices = world > 0 ? devices : NULL;
    dsq_ctx_params cp = dsq_ctx_default_params();
    cp.max_seqs = batch;
    cp.max_context = n_prompt + steps + 1;
    cp.max_batch_tokens = n_prompt > batch ? n_prompt : batch;
    dsq_model *model = NULL;
    dsq_ctx *ctx = NULL;
    dsq_model_info info;
    memset(&info, 0, sizeof info);
    info.struct_size = sizeof info;
    float *logits = NULL;
    int32_t *seqs = malloc(sizeof(int32_t) * (size_t)batch), *toks = malloc(sizeof(int32_t) * (size_t)batch);
    if (!seqs || !toks)
        goto done;
    if (check(dsq_model_load(argv[1], &mp, &model), "load") || check(dsq_model_get_info(model, &info), "info") ||
        check(dsq_ctx_new(model, &cp, &ctx), "context"))
        goto done;
    logits = malloc(sizeof(float) * (size_t)info.n_vocab * (size_t)batch); /* [batch][n_vocab] */
    if (!logits)
        goto done;
    for (int s = 0; s < batch; s++) {
        if (check(dsq_prefill(ctx, s, prompt, n_prompt, DSQ_LOGITS_LAST, logits + (size_t)s * info.n_vocab),
                  "prefill"))
            goto done;
        seqs[s] = s;
    }
    double t0 = 0;
    for (int k = 0; k < steps; k++) {
        if (k == 1)
            t0 = now_s(); /* the first step sets up; time the rest */
        for (int s = 0; s < batch; s++) {
            const float *row = logits + (size_t)s * info.n_vocab;
            int32_t best = 0;
            for (int32_t v = 1; v < info.n_vocab; v++)
                if (row[v] > row[best])
                    best = v;
            toks[s] = best;
        }
        printf("%d%s", toks[0], k + 1 < steps ? " " : "\n");
        if (check(dsq_decode_step(ctx, batch, seqs, toks, logits), "decode"))
            goto done;
    }
    if (steps > 1) {
        const double dt = now_s() - t0;
        printf("tp_local: world %d batch %d: %.1f tok/s (%.3f ms/step)\n", world, batch,
               (double)(steps - 1) * batch / dt, 1e3 * dt / (steps - 1));
    }
    rc = 0;
done:
    free(logits);
    free(seqs);
    free(toks);
    dsq_ctx_free(ctx);
    dsq_model_free(model);
    return rc;
}
