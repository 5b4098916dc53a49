/* kv_pages.c - host-side block allocator for the paged KV cache.  The
 * backends read block_table to find a token's physical row; only this file
 * changes it. */
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
    p->max_blocks_per_seq = (max_context + block_size - 1) / block_size;
    size_t table = (size_t)max_seqs * (size_t)p->max_blocks_per_seq;
    p->block_table = malloc(table * sizeof(int32_t));
    p->n_seq_blocks = calloc((size_t)max_seqs, sizeof(int32_t));
    p->free_stack = malloc((size_t)n_blocks * sizeof(int32_t));
    if (!p->block_table || !p->n_seq_blocks || !p->free_stack) {
        dsq_kv_pages_destroy(p);
        return dsq_fail(DSQ_ERR_OUT_OF_MEMORY, "no memory for the KV block tables");
    }
    for (size_t i = 0; i < table; i++)
        p->block_table[i] = -1;
    /* pop order 0,1,2,... so a fresh pool hands out ascending blocks */
    for (int32_t i = 0; i < n_blocks; i++)
        p->free_stack[i] = n_blocks - 1 - i;
    p->n_free = n_blocks;
    return DSQ_OK;
}

void dsq_kv_pages_destroy(dsq_kv_pages *p)
{
    free(p->block_table);
    free(p->n_seq_blocks);
    free(p->free_stack);
    memset(p, 0, sizeof *p);
}

dsq_status dsq_kv_pages_reserve(dsq_kv_pages *p, int32_t n, const int32_t *seqs,
                                const int32_t *new_len)
{
    int64_t need = 0;
    for (int32_t i = 0; i < n; i++) {
        int32_t want = (new_len[i] + p->block_size - 1) / p->block_size;
        if (want > p->n_seq_blocks[seqs[i]])
            need += want - p->n_seq_blocks[seqs[i]];
    }
    if (need > p->n_free)
        return dsq_fail(DSQ_ERR_KV_FULL,
                        "KV pool exhausted: %lld more blocks of %d tokens needed, %d free of %d",
                        (long long)need, p->block_size, p->n_free, p->n_blocks);
    for (int32_t i = 0; i < n; i++) {
        int32_t s = seqs[i];
        int32_t want = (new_len[i] + p->block_size - 1) / p->block_size;
        int32_t *row = p->block_table + (size_t)s * p->max_blocks_per_seq;
        while (p->n_seq_blocks[s] < want)
            row[p->n_seq_blocks[s]++] = p->free_stack[--p->n_free];
    }
    return DSQ_OK;
}

void dsq_kv_pages_trim(dsq_kv_pages *p, int32_t seq, int32_t keep_len)
{
    int32_t keep = (keep_len + p->block_size - 1) / p->block_size;
    int32_t *row = p->block_table + (size_t)seq * p->max_blocks_per_seq;
    while (p->n_seq_blocks[seq] > keep) {
        int32_t b = row[--p->n_seq_blocks[seq]];
        row[p->n_seq_blocks[seq]] = -1;
        p->free_stack[p->n_free++] = b;
    }
}
