/*
 * tokenizer_bpe.c - byte-level BPE on one pre-tokenized piece.
 *
 * The piece starts as one symbol per byte (the vocab id of that byte's
 * byte-level character).  Candidate merges of adjacent symbols sit in a
 * min-heap keyed (rank, left position); the lowest rank, leftmost first, is
 * applied, exactly HF's order.  Entries made stale by an earlier merge are
 * skipped when popped (the pair at that position no longer has that rank).
 * Symbols form a linked list so a merge is O(1) plus O(log n) heap work:
 * O(n log n) per piece, however long.
 */
#include <stdlib.h>
#include <string.h>

#include "tokenizer_internal.h"

void dsq_tok_scratch_free(dsq_tok_scratch *s)
{
    free(s->sym);
    free(s->next);
    free(s->prev);
    free(s->heap);
    free(s->bl);
    free(s->ids);
    memset(s, 0, sizeof *s);
}

dsq_status dsq_tok_push(dsq_tok_scratch *s, int32_t id)
{
    if (s->n_ids == s->ids_cap) {
        size_t cap = s->ids_cap ? s->ids_cap * 2 : 256;
        int32_t *p = realloc(s->ids, cap * sizeof *p);
        if (!p) return dsq_fail(DSQ_ERR_OUT_OF_MEMORY, "tokenize: out of memory for ids");
        s->ids = p;
        s->ids_cap = cap;
    }
    s->ids[s->n_ids++] = id;
    return DSQ_OK;
}

static dsq_status reserve(dsq_tok_scratch *s, size_t n)
{
    if (n <= s->cap) return DSQ_OK;
    size_t cap = s->cap ? s->cap : 64;
    while (cap < n) cap *= 2;
    int32_t *sym = realloc(s->sym, cap * sizeof *sym);
    if (sym) s->sym = sym;
    int32_t *nx = realloc(s->next, cap * sizeof *nx);
    if (nx) s->next = nx;
    int32_t *pv = realloc(s->prev, cap * sizeof *pv);
    if (pv) s->prev = pv;
    /* every merge pushes at most two new candidates: < 3n entries */
    uint64_t *hp = realloc(s->heap, 3 * cap * sizeof *hp);
    if (hp) s->heap = hp;
    if (!sym || !nx || !pv || !hp)
        return dsq_fail(DSQ_ERR_OUT_OF_MEMORY, "tokenize: out of memory (piece of %zu bytes)", n);
    s->cap = cap;
    return DSQ_OK;
}

/* ---- min-heap of (rank << 32 | position) ----------------------------------- */

static void heap_push(uint64_t *h, size_t *n, uint64_t v)
{
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (h[p] <= v) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = v;
}

static uint64_t heap_pop(uint64_t *h, size_t *n)
{
    uint64_t top = h[0], v = h[--*n];
    size_t i = 0, m = *n;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= m) break;
        if (c + 1 < m && h[c + 1] < h[c]) c++;
        if (v <= h[c]) break;
        h[i] = h[c];
        i = c;
    }
    if (m) h[i] = v;
    return top;
}

/* ---- the merge loop ----------------------------------------------------------- */

static dsq_status whole_piece(const dsq_tokenizer *t, const uint8_t *p, size_t n,
                              dsq_tok_scratch *s, int32_t *id)
{
    /* ignore_merges: a piece that is a vocab entry as a whole is one token */
    if (s->bl_cap < 2 * n) {
        char *b = realloc(s->bl, 2 * n);
        if (!b) return dsq_fail(DSQ_ERR_OUT_OF_MEMORY, "tokenize: out of memory");
        s->bl = b;
        s->bl_cap = 2 * n;
    }
    size_t k = 0;
    for (size_t i = 0; i < n; i++) k += dsq_utf8_put(dsq_tok_byte_to_cp(p[i]), s->bl + k);
    *id = dsq_tok_vocab_find(t, s->bl, k);
    return DSQ_OK;
}

dsq_status dsq_tok_bpe(const dsq_tokenizer *t, const uint8_t *p, size_t n, dsq_tok_scratch *s)
{
    dsq_status st;
    if (t->ignore_merges) {
        int32_t id = -1;
        if ((st = whole_piece(t, p, n, s, &id))) return st;
        if (id >= 0) return dsq_tok_push(s, id);
    }
    if (n == 1 && t->byte_id[p[0]] >= 0) return dsq_tok_push(s, t->byte_id[p[0]]);
    if ((st = reserve(s, n))) return st;

    /* Initial symbols.  A byte without a vocab entry becomes unk (fused
     * with a preceding unk if fuse_unk) or, with no unk token, is dropped:
     * HF's behaviour; Qwen2's vocab has all 256 bytes. */
    int32_t *sym = s->sym, *next = s->next, *prev = s->prev;
    size_t m = 0;
    int last_unk = 0;
    for (size_t i = 0; i < n; i++) {
        int32_t id = t->byte_id[p[i]];
        if (id < 0) {
            if (t->unk_id < 0 || (last_unk && t->fuse_unk)) continue;
            id = t->unk_id;
            last_unk = 1;
        } else {
            last_unk = 0;
        }
        sym[m++] = id;
    }
    if (m == 0) return DSQ_OK;
    for (size_t i = 0; i < m; i++) {
        prev[i] = (int32_t)i - 1;
        next[i] = i + 1 < m ? (int32_t)i + 1 : -1;
    }

    uint64_t *heap = s->heap;
    size_t hn = 0;
    uint32_t rank;
    int32_t out;
    for (size_t i = 0; i + 1 < m; i++)
        if (dsq_tok_merge_find(t, sym[i], sym[i + 1], &rank, &out))
            heap_push(heap, &hn, ((uint64_t)rank << 32) | i);

    while (hn) {
        uint64_t top = heap_pop(heap, &hn);
        int32_t pos = (int32_t)(top & 0xffffffffu);
        uint32_t want = (uint32_t)(top >> 32);
        if (sym[pos] < 0) continue; /* merged into its left neighbour */
        int32_t r = next[pos];
        if (r < 0) continue;
        if (!dsq_tok_merge_find(t, sym[pos], sym[r], &rank, &out) || rank != want) continue;
        sym[pos] = out;
        sym[r] = -1;
        next[pos] = next[r];
        if (next[r] >= 0) prev[next[r]] = pos;
        int32_t l = prev[pos];
        if (l >= 0 && dsq_tok_merge_find(t, sym[l], sym[pos], &rank, &out))
            heap_push(heap, &hn, ((uint64_t)rank << 32) | (uint32_t)l);
        if (next[pos] >= 0 && dsq_tok_merge_find(t, sym[pos], sym[next[pos]], &rank, &out))
            heap_push(heap, &hn, ((uint64_t)rank << 32) | (uint32_t)pos);
    }

    for (int32_t i = 0; i >= 0; i = next[i])
        if ((st = dsq_tok_push(s, sym[i]))) return st;
    return DSQ_OK;
}
