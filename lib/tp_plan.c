/* tp_plan.c - the per-rank slices of tensor parallelism (see tp_plan.h). */
#include <stdio.h>
#include <string.h>

#include "tp_plan.h"

/* [start, count) of part `r` of `w` near-equal parts of n, part boundaries
 * on multiples of align (the last part takes the rest). */
static void split_aligned(int32_t n, int32_t r, int32_t w, int32_t align, int32_t *start, int32_t *count)
{
    int64_t units = ((int64_t)n + align - 1) / align;
    int64_t u0 = units * r / w, u1 = units * (r + 1) / w;
    int64_t s = u0 * align, e = r == w - 1 ? n : u1 * align;
    if (e > n)
        e = n;
    if (s > e)
        s = e;
    *start = (int32_t)s;
    *count = (int32_t)(e - s);
}

static int divides(const dsq_config *c, int32_t w, const char **why)
{
    if (c->n_heads % w) {
        *why = "num_attention_heads";
        return 0;
    }
    if (!(c->n_kv_heads % w == 0 || (w % c->n_kv_heads == 0 && (c->n_heads / w) <= c->n_heads / c->n_kv_heads))) {
        *why = "num_key_value_heads";
        return 0;
    }
    /* every rank needs a non-empty FFN and vocabulary part */
    if ((int64_t)c->n_ff < (int64_t)w * DSQ_TP_ALIGN) {
        *why = "intermediate_size";
        return 0;
    }
    if ((int64_t)c->n_vocab < (int64_t)w * DSQ_TP_ALIGN) {
        *why = "vocab_size";
        return 0;
    }
    return 1;
}

uint64_t dsq_tp_degrees(const dsq_config *cfg, int32_t max_world)
{
    uint64_t set = 0;
    const char *why;
    for (int32_t w = 1; cfg && w <= max_world && w < 64; w++)
        if (divides(cfg, w, &why))
            set |= (uint64_t)1 << w;
    return set;
}

dsq_status dsq_tp_plan(const dsq_config *cfg, int32_t rank, int32_t world, dsq_tp_slice *s)
{
    if (!cfg || !s || world < 1 || rank < 0 || rank >= world)
        return dsq_fail(DSQ_ERR_INVALID_ARG, "tensor parallelism: rank %d of world %d", rank, world);
    const char *why = NULL;
    if (!divides(cfg, world, &why)) {
        char ok[160];
        size_t k = 0;
        uint64_t d = dsq_tp_degrees(cfg, 16);
        ok[0] = '\0';
        for (int32_t w = 1; w <= 16 && k < sizeof ok; w++)
            if (d >> w & 1)
                k += (size_t)snprintf(ok + k, sizeof ok - k, "%s%d", k ? ", " : "", w);
        return dsq_fail(DSQ_ERR_UNSUPPORTED,
                        "tensor parallelism of degree %d does not divide this model's %s (heads %d, KV heads %d, "
                        "FFN %d, vocabulary %d); degrees that do, up to 16: %s",
                        world, why, cfg->n_heads, cfg->n_kv_heads, cfg->n_ff, cfg->n_vocab, ok);
    }
    memset(s, 0, sizeof *s);
    s->rank = rank;
    s->world = world;
    s->n_q_heads = cfg->n_heads / world;
    s->q_head0 = rank * s->n_q_heads;
    if (cfg->n_kv_heads % world == 0) {
        s->n_kv_heads = cfg->n_kv_heads / world;
        s->kv_head0 = rank * s->n_kv_heads;
        s->kv_replicas = 1;
    } else {
        /* world is a multiple of the KV heads: this rank's query heads all
         * belong to one KV group (checked in divides()) */
        const int32_t group = cfg->n_heads / cfg->n_kv_heads;
        s->n_kv_heads = 1;
        s->kv_head0 = s->q_head0 / group;
        s->kv_replicas = world / cfg->n_kv_heads;
    }
    split_aligned(cfg->n_ff, rank, world, DSQ_TP_ALIGN, &s->ff0, &s->n_ff);
    split_aligned(cfg->n_vocab, rank, world, DSQ_TP_ALIGN, &s->vocab0, &s->n_vocab);
    return DSQ_OK;
}
