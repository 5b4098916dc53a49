/* minimal.c - the smallest complete libdsqwen program: load a model, prefill
 * token ids given on the command line, decode greedily, print the ids.
 * Usage: minimal MODEL_DIR ID [ID...] */
#include <stdio.h>
#include <stdlib.h>

#include "dsqwen.h"

static int check(dsq_status st, const char *what)
{
    if (st != DSQ_OK)
        fprintf(stderr, "%s: %s (%s)\n", what, dsq_status_string(st), dsq_last_error_message());
    return st != DSQ_OK;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: %s MODEL_DIR ID [ID...]\n", argv[0]);
        return 2;
    }
    int n_prompt = argc - 2, n_new = 16, rc = 1;
    int32_t *prompt = malloc(sizeof(int32_t) * (size_t)n_prompt);
    float *logits = NULL;
    dsq_model *model = NULL;
    dsq_ctx *ctx = NULL;
    dsq_model_info info;
    info.struct_size = sizeof info;
    for (int i = 0; prompt && i < n_prompt; i++)
        prompt[i] = (int32_t)atoi(argv[i + 2]);
    if (!prompt) return 1;

    if (check(dsq_model_load(argv[1], NULL, &model), "load") ||
        check(dsq_model_get_info(model, &info), "info") ||
        check(dsq_ctx_new(model, NULL, &ctx), "context"))
        goto done;
    logits = malloc(sizeof(float) * (size_t)info.n_vocab); /* [n_vocab] */
    if (!logits || check(dsq_prefill(ctx, 0, prompt, n_prompt, DSQ_LOGITS_LAST, logits), "prefill"))
        goto done;
    for (int step = 0; step < n_new; step++) {
        int32_t best = 0, seq = 0;
        for (int32_t v = 1; v < info.n_vocab; v++) /* greedy: argmax */
            if (logits[v] > logits[best])
                best = v;
        printf("%d ", (int)best);
        if (best == info.eos_token)
            break;
        if (check(dsq_decode_step(ctx, 1, &seq, &best, logits), "decode"))
            goto done;
    }
    printf("\n");
    rc = 0;
done:
    free(logits);
    free(prompt);
    dsq_ctx_free(ctx);
    dsq_model_free(model);
    return rc;
}
