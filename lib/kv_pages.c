/* kv_pages.c - host-side block allocator for the paged KV cache, with
 * blocks shared between sequences by reference count.  The backends read
 * rows[] to find a token's physical row; only this file changes it.
 *
 * Memory: per sequence a pointer, a capacity and a count (16 bytes) plus
 * its block list, allocated on first use and grown by doubling; per block a
 * reference count and a free-stack slot.  Nothing is sized
 * max_seqs x max_context. */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

dsq_status dsq_kv_pages_init(dsq_kv_pages *p, int32_t max_seqs, int32_t max_context,
                             int32_t block_size, int32_t n_blocks)
{
    memset(p, 0, sizeof *p);
    p->block_size = block_size;
    p->n_blocks = n_blocks;
    p->max_seqs = max_seqs;
    p->max_blocks_per_seq = (int32_t)(((int64_t)max_context + block_size - 1) / block_size);
    p->rows = calloc((size_t)max_seqs, sizeof *p->rows);
    p->row_cap = calloc((size_t)max_seqs, sizeof(int32_t));
    p->n_seq_blocks = calloc((size_t)max_seqs, sizeof(int32_t));
    p->ref = calloc((size_t)n_blocks, sizeof(int32_t));
    p->free_stack = malloc((size_t)n_blocks * sizeof(int32_t));
    if (!p->rows || !p->row_cap || !p->n_seq_blocks || !p->ref || !p->free_stack) {
        dsq_kv_pages_destroy(p);
        return dsq_fail(DSQ_ERR_OUT_OF_MEMORY, "no memory for the KV block tables (%d sequences, %d blocks)",
                        max_seqs, n_blocks);
    }
    /* pop order 0,1,2,... so a fresh pool hands out ascending blocks */
    for (int32_t i = 0; i < n_blocks; i++)
        p->free_stack[i] = n_blocks - 1 - i;
    p->n_free = n_blocks;
    return DSQ_OK;
}

void dsq_kv_pages_destroy(dsq_kv_pages *p)
{
    if (p->rows)
        for (int32_t s = 0; s < p->max_seqs; s++)
            free(p->rows[s]);
    free(p->rows);
    free(p->row_cap);
    free(p->n_seq_blocks);
    free(p->ref);
    free(p->free_stack);
    memset(p, 0, sizeof *p);
}

/* Room for `want` block ids in seq's row (capacity only; contents kept). */
static dsq_status ensure_cap(dsq_kv_pages *p, int32_t seq, int32_t want)
{
    if (want <= p->row_cap[seq])
        return DSQ_OK;
    int64_t cap = p->row_cap[seq] ? p->row_cap[seq] : 4;
    while (cap < want)
        cap *= 2;
    if (cap > p->max_blocks_per_seq)
        cap = p->max_blocks_per_seq;
    int32_t *r = realloc(p->rows[seq], (size_t)cap * sizeof(int32_t));
    if (!r)
        return dsq_fail(DSQ_ERR_OUT_OF_MEMORY, "no memory for the block table of sequence %d", seq);
    p->rows[seq] = r;
    p->row_cap[seq] = (int32_t)cap;
    return DSQ_OK;
}

static int32_t take_block(dsq_kv_pages *p)
{
    int32_t b = p->free_stack[--p->n_free];
    p->ref[b] = 1;
    return b;
}

static void drop_block(dsq_kv_pages *p, int32_t b)
{
    if (--p->ref[b] == 0)
        p->free_stack[p->n_free++] = b;
}

static int32_t blocks_for(const dsq_kv_pages *p, int32_t len)
{
    return (int32_t)(((int64_t)len + p->block_size - 1) / p->block_size);
}

/* The shared block seq must copy before writing at position cur, or -1. */
static int32_t shared_partial(const dsq_kv_pages *p, int32_t seq, int32_t cur)
{
    if (cur % p->block_size == 0)
        return -1; /* the next token opens a new block */
    int32_t b = p->rows[seq][cur / p->block_size];
    return p->ref[b] > 1 ? b : -1;
}

dsq_status dsq_kv_pages_reserve(dsq_kv_pages *p, int32_t n, const int32_t *seqs,
                                const int32_t *cur_len, const int32_t *new_len,
                                dsq_kv_cow *cow, int32_t *n_cow)
{
    *n_cow = 0;
    for (int32_t i = 0; i < n; i++) {
        dsq_status st = ensure_cap(p, seqs[i], blocks_for(p, new_len[i]));
        if (st != DSQ_OK)
            return st;
    }
    /* Count fresh blocks and copies.  Two sequences of the batch may share
     * the same partial block: the first to be planned copies and the shared
     * count drops, so the last holder writes in place.  Simulate that with
     * the counts and restore them before deciding. */
    int64_t need = 0;
    int32_t nc = 0;
    for (int32_t i = 0; i < n; i++) {
        int32_t s = seqs[i];
        int32_t want = blocks_for(p, new_len[i]);
        if (want > p->n_seq_blocks[s])
            need += want - p->n_seq_blocks[s];
        int32_t b = shared_partial(p, s, cur_len[i]);
        if (b >= 0) {
            p->ref[b]--;
            cow[nc].seq = s;
            cow[nc].idx = cur_len[i] / p->block_size;
            cow[nc].old_blk = b;
            cow[nc].n_rows = cur_len[i] % p->block_size;
            nc++;
            need++;
        }
    }
    for (int32_t j = 0; j < nc; j++)
        p->ref[cow[j].old_blk]++;
    if (need > p->n_free)
        return dsq_fail(DSQ_ERR_KV_FULL,
                        "KV pool exhausted: %lld more blocks of %d tokens needed (%d of them copies of "
                        "shared blocks), %d free of %d",
                        (long long)need, p->block_size, nc, p->n_free, p->n_blocks);
    for (int32_t j = 0; j < nc; j++) {
        dsq_kv_cow *w = &cow[j];
        w->new_blk = take_block(p);
        p->rows[w->seq][w->idx] = w->new_blk;
        p->ref[w->old_blk]--; /* > 0: another sequence still holds it */
    }
    for (int32_t i = 0; i < n; i++) {
        int32_t s = seqs[i];
        int32_t want = blocks_for(p, new_len[i]);
        while (p->n_seq_blocks[s] < want)
            p->rows[s][p->n_seq_blocks[s]++] = take_block(p);
    }
    *n_cow = nc;
    return DSQ_OK;
}

void dsq_kv_pages_undo_cow(dsq_kv_pages *p, const dsq_kv_cow *cow, int32_t n_cow)
{
    for (int32_t j = n_cow - 1; j >= 0; j--) {
        const dsq_kv_cow *w = &cow[j];
        p->rows[w->seq][w->idx] = w->old_blk;
        p->ref[w->old_blk]++;
        drop_block(p, w->new_blk);
    }
}

void dsq_kv_pages_trim(dsq_kv_pages *p, int32_t seq, int32_t keep_len)
{
    int32_t keep = blocks_for(p, keep_len);
    while (p->n_seq_blocks[seq] > keep)
        drop_block(p, p->rows[seq][--p->n_seq_blocks[seq]]);
    if (p->n_seq_blocks[seq] == 0) {
        /* an empty sequence holds no host memory either */
        free(p->rows[seq]);
        p->rows[seq] = NULL;
        p->row_cap[seq] = 0;
    }
}

dsq_status dsq_kv_pages_fork(dsq_kv_pages *p, int32_t src, int32_t dst)
{
    int32_t nb = p->n_seq_blocks[src];
    dsq_status st = ensure_cap(p, dst, nb);
    if (st != DSQ_OK)
        return st;
    for (int32_t j = 0; j < nb; j++) {
        p->rows[dst][j] = p->rows[src][j];
        p->ref[p->rows[src][j]]++;
    }
    p->n_seq_blocks[dst] = nb;
    return DSQ_OK;
}
