/*
 * fuzz_generation_config.c - generation_config.json (dsq_gen_config_parse,
 * what dsq_model_load() runs on the file beside config.json).
 *
 * The text comes in an exact-size buffer without a NUL.  A refusal must be
 * DSQ_ERR_FORMAT with a message.  Whatever is accepted must be usable: the
 * values are in their documented ranges, dsq_model_sampler_params() turns
 * them into sampler params that dsq_sampler_new() accepts, and the sampler
 * then never draws a token whose logit is -inf.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_util.h"
#include "internal.h"

static void use(const dsq_gen_config *g)
{
    if (g->has & ~0x1Fu)
        abort();
    if ((g->has & DSQ_GEN_TEMPERATURE) && !(g->temperature >= 0.0f && isfinite(g->temperature)))
        abort();
    if ((g->has & DSQ_GEN_TOP_K) && g->top_k < 0)
        abort();
    if ((g->has & DSQ_GEN_TOP_P) && !(g->top_p > 0.0f && g->top_p <= 1.0f))
        abort();
    if ((g->has & DSQ_GEN_MIN_P) && !(g->min_p >= 0.0f && g->min_p <= 1.0f))
        abort();
    if ((g->has & DSQ_GEN_REPETITION_PENALTY) &&
        !(g->repetition_penalty > 0.0f && isfinite(g->repetition_penalty)))
        abort();

    /* The public conversion, on a model that holds only this config. */
    dsq_model m;
    memset(&m, 0, sizeof m);
    m.gen = *g;
    m.cfg.n_vocab = 8;
    dsq_sampler_params p;
    memset(&p, 0, sizeof p);
    p.struct_size = (uint32_t)sizeof p;
    if (dsq_model_sampler_params(&m, &p) != DSQ_OK)
        abort();
    dsq_sampler *s = NULL;
    if (dsq_sampler_new(&p, &s) != DSQ_OK)
        abort(); /* an accepted file must give a usable sampler */
    static const float logits[8] = {0.0f, -INFINITY, 1.0f, -INFINITY, 2.0f, 0.5f, -INFINITY,
                                     -INFINITY};
    for (int i = 0; i < 4; i++) {
        int32_t tok = -1;
        if (dsq_sampler_sample(s, logits, 8, &tok) != DSQ_OK || tok < 0 || tok >= 8 ||
            isinf(logits[tok]))
            abort();
    }
    dsq_sampler_free(s);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = fz_dup(data, size);
    if (!text)
        return 0;
    dsq_gen_config g;
    memset(&g, 0xA5, sizeof g);
    dsq_status st = dsq_gen_config_parse(text, size, "generation_config.json", &g);
    free(text);
    if (st == DSQ_OK)
        use(&g);
    else if (st != DSQ_ERR_FORMAT || dsq_last_error_message()[0] == '\0')
        abort();
    return 0;
}
