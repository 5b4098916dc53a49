/*
 * tokenizer_internal.h - the byte-level BPE tokenizer's data and the helpers
 * its files share.  Not installed.
 *
 * Files:  tokenizer.c         public entry points, load/free, accessors
 *         tokenizer_json.c    tokenizer.json -> struct dsq_tokenizer
 *         tokenizer_text.c    UTF-8 repair, NFC, regex rewrite, char classes
 *         tokenizer_bpe.c     merge loop on one pre-tokenized piece
 *         tokenizer_encode.c  added tokens, normalization, pre-tokenizer
 *         tokenizer_trie.c    byte trie for finding added tokens in text
 *         tokenizer_decode.c  ids -> bytes, streaming decoder
 *
 * Everything here is immutable once dsq_tokenizer_load() returns, so any
 * number of threads may encode/decode at once; per-call state lives in a
 * dsq_tok_scratch on the caller's stack/heap.
 */
#ifndef DSQ_TOKENIZER_INTERNAL_H
#define DSQ_TOKENIZER_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "internal.h"

/* One entry of tokenizer.json's added_tokens.  `match` is the text looked
 * for in the input: the raw content, or its NFC form when `normalized`. */
typedef struct dsq_tok_added {
    char *content;        /* raw content, NUL-terminated                    */
    size_t len;
    char *match;          /* text matched (== content unless normalized)    */
    size_t match_len;
    int32_t id;
    uint8_t special, single_word, lstrip, rstrip, normalized;
} dsq_tok_added;

/* Byte trie over the match texts of one set of added tokens (normalized or
 * not), built at load (tokenizer_trie.c).  Node 0 is the root.
 * term[node] is the index into dsq_tokenizer.added of the token whose match
 * text ends at the node (-1: none); edges are an open-addressing table of
 * key ((parent << 8 | byte) + 1, 0 = empty slot) -> child. */
typedef struct dsq_tok_trie {
    int32_t *term;         /* [n_nodes]          */
    uint64_t *edge_key;    /* [edge_mask + 1]    */
    uint32_t *edge_child;  /* [edge_mask + 1]    */
    uint32_t edge_mask;
    uint32_t n_nodes;
} dsq_tok_trie;

/* Token flags, [n_ids] */
#define DSQ_TOKF_PRESENT 1u /* the id has a token                          */
#define DSQ_TOKF_ADDED 2u   /* from added_tokens                           */
#define DSQ_TOKF_SPECIAL 4u /* added token with special: true              */
#define DSQ_TOKF_VOCAB 8u   /* in model.vocab (vocab_off/vocab_len valid)   */

struct dsq_tokenizer {
    int32_t n_ids;            /* max id + 1 over vocab and added tokens      */
    int32_t n_vocab;          /* entries in model.vocab                      */

    /* Token texts, NUL-terminated in the arena `text`:
     * text[vocab_off[id] .. +vocab_len[id]) is the model.vocab entry
     * (byte-level form), text[text_off[id] .. +text_len[id]) what
     * dsq_token_text() shows (the added token's content if the id is an added
     * token, as HF's id_to_token, else the vocab entry).
     * dec[dec_off[id] .. +dec_len[id]) is what decoding emits for the id.
     * Arrays are [n_ids]; absent ids have length 0 and no flag. */
    char *text;
    uint32_t *vocab_off, *vocab_len;
    uint32_t *text_off, *text_len;
    char *dec;
    uint32_t *dec_off, *dec_len;
    uint8_t *flags;
    size_t max_dec_len;       /* longest decoded token, bytes                */

    /* Vocab lookup (model.vocab only): open addressing on the stored text,
     * slots hold an id or -1.  [vocab_mask + 1] */
    int32_t *vocab_slots;
    uint32_t vocab_mask;

    /* Merges: open addressing on key (left id << 32 | right id).  rank is the
     * line number in model.merges (lower merges first), out the merged id.
     * [merge_mask + 1]; empty slots have key UINT64_MAX. */
    uint64_t *merge_key;
    uint32_t *merge_rank;
    int32_t *merge_out;
    uint32_t merge_mask;

    /* Vocab id of the byte-level character of each byte (-1: not in vocab). */
    int32_t byte_id[256];

    /* BPE model options from tokenizer.json */
    int ignore_merges;        /* whole piece in vocab -> emitted as is        */
    int32_t unk_id;           /* -1 if none                                  */
    int fuse_unk;

    int nfc;                  /* normalizer is NFC                            */

    /* Added tokens, in file order.  first_byte[b] is set if some added
     * token's match text starts with byte b (quick reject while scanning). */
    dsq_tok_added *added;
    int32_t n_added;
    uint8_t first_byte_raw[256];  /* tokens with normalized false        */
    uint8_t first_byte_norm[256]; /* tokens with normalized true         */
    dsq_tok_trie trie_raw, trie_norm; /* the same two sets              */

    /* Pre-tokenizer regex (rewritten for PCRE2, see tokenizer_text.c). */
    pcre2_code *re;
    int re_jit;               /* JIT compiled successfully                    */

    /* Post-processor (TemplateProcessing "single"): ids around $A. */
    int32_t *tmpl_pre, *tmpl_post;
    int32_t n_tmpl_pre, n_tmpl_post;

    int32_t bos, eos;
};

/* ---- hashing / lookup (tokenizer_json.c) ------------------------------- */

uint64_t dsq_tok_hash(const void *data, size_t len);
/* Vocab id of the byte-level text s[0..len), or -1. */
int32_t dsq_tok_vocab_find(const dsq_tokenizer *t, const char *s, size_t len);
/* Merge of (a, b): returns 1 and sets *rank / *out if it exists. */
static inline int dsq_tok_merge_find(const dsq_tokenizer *t, int32_t a, int32_t b,
                                     uint32_t *rank, int32_t *out)
{
    uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    uint64_t h = key * 0x9E3779B97F4A7C15ull;
    uint32_t i = (uint32_t)(h >> 32) & t->merge_mask;
    for (;;) {
        uint64_t k = t->merge_key[i];
        if (k == key) {
            *rank = t->merge_rank[i];
            *out = t->merge_out[i];
            return 1;
        }
        if (k == UINT64_MAX) return 0;
        i = (i + 1) & t->merge_mask;
    }
}

/* Parse tokenizer.json text (NUL-terminated, len bytes) into `t`, which the
 * caller zeroed; on failure whatever was built is left for
 * dsq_tok_release() to free. */
dsq_status dsq_tok_from_json(dsq_tokenizer *t, const char *json, size_t len);
/* Read bos/eos from tokenizer_config.json text (missing fields keep the
 * post-processor's values).  DSQ_ERR_OUT_OF_MEMORY, else DSQ_OK (invalid
 * JSON is logged and ignored). */
dsq_status dsq_tok_read_config(dsq_tokenizer *t, const char *json, size_t len);
/* Free everything `t` owns (not `t` itself). */
void dsq_tok_release(dsq_tokenizer *t);

/* ---- text helpers (tokenizer_text.c) ------------------------------------ */

/* GPT-2 byte <-> unicode code point table (bytes_to_unicode). */
uint32_t dsq_tok_byte_to_cp(uint8_t b);
/* Byte for a code point of the byte-level alphabet, or -1. */
int dsq_tok_cp_to_byte(uint32_t cp);

/* Length of the longest prefix of s[0..n) that is valid UTF-8. */
size_t dsq_utf8_valid_prefix(const uint8_t *s, size_t n);
/* Copy s[0..n) replacing each maximal ill-formed subsequence (Unicode's
 * "maximal subpart" rule, as Python's errors="replace" and Rust's
 * from_utf8_lossy) by U+FFFD.  *out is malloc'ed.  DSQ_ERR_OUT_OF_MEMORY. */
dsq_status dsq_utf8_repair(const uint8_t *s, size_t n, char **out, size_t *out_len);
/* Decode one code point of valid UTF-8 at s (n > 0 bytes left); returns its
 * length. */
size_t dsq_utf8_next(const uint8_t *s, size_t n, uint32_t *cp);
/* Length of the code point ending at s[n-1] in valid UTF-8 (n > 0). */
size_t dsq_utf8_prev(const uint8_t *s, size_t n, uint32_t *cp);
/* Append the UTF-8 of cp to out; returns bytes written (1..4). */
size_t dsq_utf8_put(uint32_t cp, char *out);

/* NFC of valid UTF-8 s[0..n).  Sets *out to s itself (and *owned = 0) when
 * the text is ASCII and so already NFC, else to a malloc'ed copy (*owned =
 * 1).  DSQ_ERR_OUT_OF_MEMORY, DSQ_ERR_INTERNAL (utf8proc error). */
dsq_status dsq_tok_nfc(const char *s, size_t n, char **out, size_t *out_len, int *owned);

/* Rust regex \w and \s (used by the added-token flags, as HF does). */
int dsq_tok_is_word_cp(uint32_t cp);
int dsq_tok_is_space_cp(uint32_t cp);

/* Rewrite a tokenizer.json (Oniguruma) regex for PCRE2 so both engines agree:
 * \s / \S become Oniguruma's explicit Unicode whitespace set (PCRE2 also
 * counts U+180E), and ASCII letters inside (?i: ...) become [xX] (PCRE2's
 * caseless mode would also match U+017F for s, Oniguruma here does not).
 * *out is malloc'ed.  DSQ_ERR_UNSUPPORTED for constructs it does not know. */
dsq_status dsq_tok_rewrite_regex(const char *in, char **out);

/* ---- added-token trie (tokenizer_trie.c) --------------------------------- */

/* Build the trie of the added tokens with .normalized == normalized (their
 * match texts).  Where two share a text, the first in file order is kept.
 * On failure whatever was allocated is left for dsq_tok_trie_free().
 * DSQ_ERR_OUT_OF_MEMORY, DSQ_ERR_FORMAT (texts too long in total). */
dsq_status dsq_tok_trie_build(dsq_tok_trie *tr, const dsq_tok_added *added, int32_t n_added,
                              int normalized);
/* Index (into the `added` array the trie was built from) of the longest
 * token that p[0..n) starts with, or -1.  Reads p[0] up to p[len of that
 * token], never past n; cost grows with that length only. */
int32_t dsq_tok_trie_longest(const dsq_tok_trie *tr, const char *p, size_t n);
/* Free the arrays (zeroed struct: no-op). */
void dsq_tok_trie_free(dsq_tok_trie *tr);

/* ---- BPE (tokenizer_bpe.c) ------------------------------------------------ */

/* Growable per-call buffers.  Zero-initialise; free with
 * dsq_tok_scratch_free(). */
typedef struct dsq_tok_scratch {
    int32_t *sym;       /* [cap] symbol ids                               */
    int32_t *next, *prev; /* [cap] linked list over symbols (-1 = none)   */
    uint64_t *heap;     /* [cap] (rank << 32 | position), min-heap         */
    size_t cap;
    char *bl;           /* [bl_cap] byte-level text of a piece (ignore_merges) */
    size_t bl_cap;
    int32_t *ids;       /* output ids                                     */
    size_t n_ids, ids_cap;
} dsq_tok_scratch;

void dsq_tok_scratch_free(dsq_tok_scratch *s);
/* Append one id to s->ids.  DSQ_ERR_OUT_OF_MEMORY. */
dsq_status dsq_tok_push(dsq_tok_scratch *s, int32_t id);
/* Byte-level BPE of the piece p[0..n) (raw bytes, n > 0): appends its ids. */
dsq_status dsq_tok_bpe(const dsq_tokenizer *t, const uint8_t *p, size_t n, dsq_tok_scratch *s);

/* ---- encode (tokenizer_encode.c) ----------------------------------------- */

/* Encode valid UTF-8 text into s->ids (post-processing included when
 * add_special). */
dsq_status dsq_tok_encode(const dsq_tokenizer *t, const char *text, size_t len, int add_special,
                          int plain_special, dsq_tok_scratch *s);

#endif /* DSQ_TOKENIZER_INTERNAL_H */
