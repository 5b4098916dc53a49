/*
 * tokenizer_trie.c - byte trie over the added tokens' match texts, so that
 * finding the longest added token at a position costs the length of that
 * token (plus one byte), not the number of added tokens.
 *
 * Edges live in one open-addressing table keyed by (parent node, byte): a
 * node with 200 children costs no more to step through than one with 2, and
 * the whole trie is three flat arrays.
 */
#include <stdlib.h>
#include <string.h>

#include "tokenizer_internal.h"

static uint32_t edge_slot(uint64_t key, uint32_t mask)
{
    return (uint32_t)((key * 0x9E3779B97F4A7C15ull) >> 32) & mask;
}

/* Child of `node` on `byte`, or 0 (the root is never a child). */
static uint32_t child_of(const dsq_tok_trie *tr, uint32_t node, uint8_t byte)
{
    uint64_t key = ((uint64_t)node << 8 | byte) + 1;
    for (uint32_t i = edge_slot(key, tr->edge_mask);; i = (i + 1) & tr->edge_mask) {
        uint64_t k = tr->edge_key[i];
        if (k == key) return tr->edge_child[i];
        if (k == 0) return 0;
    }
}

dsq_status dsq_tok_trie_build(dsq_tok_trie *tr, const dsq_tok_added *added, int32_t n_added,
                              int normalized)
{
    memset(tr, 0, sizeof *tr);
    size_t bytes = 0;
    for (int32_t k = 0; k < n_added; k++)
        if (added[k].normalized == normalized) bytes += added[k].match_len;
    if (bytes >= UINT32_MAX / 4)
        return dsq_fail(DSQ_ERR_FORMAT, "tokenizer.json: added tokens too long in total");
    /* at most one node per byte, plus the root; edges = nodes - 1 */
    size_t max_nodes = bytes + 1, slots = 16;
    while (slots < 2 * bytes) slots <<= 1;
    tr->term = malloc(max_nodes * sizeof *tr->term);
    tr->edge_key = calloc(slots, sizeof *tr->edge_key);
    tr->edge_child = malloc(slots * sizeof *tr->edge_child);
    if (!tr->term || !tr->edge_key || !tr->edge_child)
        return dsq_fail(DSQ_ERR_OUT_OF_MEMORY, "tokenizer: out of memory for the added-token trie");
    tr->edge_mask = (uint32_t)(slots - 1);
    tr->term[0] = -1;
    tr->n_nodes = 1;
    for (int32_t k = 0; k < n_added; k++) {
        const dsq_tok_added *a = &added[k];
        if (a->normalized != normalized) continue;
        uint32_t node = 0;
        for (size_t j = 0; j < a->match_len; j++) {
            uint8_t b = (uint8_t)a->match[j];
            uint32_t c = child_of(tr, node, b);
            if (!c) {
                c = tr->n_nodes++;
                tr->term[c] = -1;
                uint64_t key = ((uint64_t)node << 8 | b) + 1;
                uint32_t i = edge_slot(key, tr->edge_mask);
                while (tr->edge_key[i]) i = (i + 1) & tr->edge_mask;
                tr->edge_key[i] = key;
                tr->edge_child[i] = c;
            }
            node = c;
        }
        /* Same text twice: the first in file order keeps it (what the
         * linear scan this replaces did). */
        if (node && tr->term[node] < 0) tr->term[node] = k;
    }
    return DSQ_OK;
}

int32_t dsq_tok_trie_longest(const dsq_tok_trie *tr, const char *p, size_t n)
{
    int32_t best = -1;
    uint32_t node = 0;
    for (size_t j = 0; j < n; j++) {
        if (!(node = child_of(tr, node, (uint8_t)p[j]))) break;
        if (tr->term[node] >= 0) best = tr->term[node];
    }
    return best;
}

void dsq_tok_trie_free(dsq_tok_trie *tr)
{
    free(tr->term);
    free(tr->edge_key);
    free(tr->edge_child);
    memset(tr, 0, sizeof *tr);
}
