/* seq_history.c - every sequence's tokens (prompt and generated, exactly the
 * tokens its KV cache holds), kept for the sampling penalties of dsq_step().
 *
 * One growable array per sequence (capacity doubles, starting at 256), so a
 * context with many possible sequences costs memory only for the tokens it
 * holds.  The CUDA backend mirrors the last DSQ_PENALTY_MAX_N tokens of each
 * sequence on the device: appends reach the mirror through the forward pass
 * itself; any other change (truncate, fork) goes through the backend's
 * hist_sync hook, which re-uploads the window from here. */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

dsq_status dsq_hist_init(dsq_seq_history *h, int32_t n_seqs)
{
    memset(h, 0, sizeof *h);
    h->tok = calloc((size_t)n_seqs, sizeof *h->tok);
    h->len = calloc((size_t)n_seqs, sizeof *h->len);
    h->cap = calloc((size_t)n_seqs, sizeof *h->cap);
    if (!h->tok || !h->len || !h->cap) {
        dsq_hist_destroy(h);
        return dsq_fail(DSQ_ERR_OUT_OF_MEMORY, "no memory for the token history of %d sequences", n_seqs);
    }
    h->n_seqs = n_seqs;
    return DSQ_OK;
}

void dsq_hist_destroy(dsq_seq_history *h)
{
    if (h->tok)
        for (int32_t i = 0; i < h->n_seqs; i++)
            free(h->tok[i]);
    free(h->tok);
    free(h->len);
    free(h->cap);
    memset(h, 0, sizeof *h);
}

dsq_status dsq_hist_reserve(dsq_seq_history *h, int32_t seq, int32_t n)
{
    if (n <= h->cap[seq])
        return DSQ_OK;
    int32_t cap = h->cap[seq] > 0 ? h->cap[seq] : 256;
    while (cap < n)
        cap = cap > INT32_MAX / 2 ? INT32_MAX : cap * 2;
    int32_t *t = realloc(h->tok[seq], sizeof(int32_t) * (size_t)cap);
    if (!t)
        return dsq_fail(DSQ_ERR_OUT_OF_MEMORY, "no memory for the token history of sequence %d (%d tokens)",
                        seq, n);
    h->tok[seq] = t;
    h->cap[seq] = cap;
    return DSQ_OK;
}

void dsq_hist_append(dsq_seq_history *h, int32_t seq, const int32_t *tokens, int32_t n)
{
    /* capacity was reserved before the forward pass */
    memcpy(h->tok[seq] + h->len[seq], tokens, sizeof(int32_t) * (size_t)n);
    h->len[seq] += n;
}

static void sync_device(dsq_ctx *c, int32_t seq)
{
    if (c->model->ops->hist_sync)
        c->model->ops->hist_sync(c, seq);
}

dsq_status dsq_seq_history_truncate(dsq_ctx *c, int32_t seq, int32_t n)
{
    dsq_seq_history *h = &c->hist;
    if (seq < 0 || seq >= h->n_seqs || n < 0 || n > h->len[seq])
        return dsq_fail(DSQ_ERR_INTERNAL, "token history: truncate sequence %d to %d tokens", seq, n);
    h->len[seq] = n;
    sync_device(c, seq);
    return DSQ_OK;
}

dsq_status dsq_seq_history_fork(dsq_ctx *c, int32_t dst, int32_t src)
{
    dsq_seq_history *h = &c->hist;
    if (src < 0 || src >= h->n_seqs || dst < 0 || dst >= h->n_seqs || src == dst)
        return dsq_fail(DSQ_ERR_INTERNAL, "token history: fork %d into %d", src, dst);
    dsq_status st = dsq_hist_reserve(h, dst, h->len[src]);
    if (st != DSQ_OK)
        return st;
    if (h->len[src] > 0)
        memcpy(h->tok[dst], h->tok[src], sizeof(int32_t) * (size_t)h->len[src]);
    h->len[dst] = h->len[src];
    sync_device(c, dst);
    return DSQ_OK;
}

void dsq_seq_history_clear(dsq_ctx *c, int32_t seq)
{
    /* the storage is kept for the id's next sequence; positions restart at 0,
     * so the device mirror needs no refresh */
    c->hist.len[seq] = 0;
}
