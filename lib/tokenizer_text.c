/*
 * tokenizer_text.c - text-level helpers of the tokenizer: the GPT-2 byte
 * alphabet, UTF-8 checking and lossy repair, NFC through utf8proc, the
 * Unicode classes HF uses for added-token flags, and the rewrite that makes
 * PCRE2 read tokenizer.json's Oniguruma regex the way HF does.
 */
#include <stdlib.h>
#include <string.h>

#include <utf8proc.h>

#include "tokenizer_internal.h"

/* ---- GPT-2 byte-level alphabet ------------------------------------------ */

/* Printable Latin-1 bytes stand for themselves; the other 68 bytes (controls,
 * space, DEL, NBSP, soft hyphen) are moved, in byte order, to U+0100.. so
 * every byte has a visible, non-space character. */
static int byte_is_self(unsigned b)
{
    return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

/* The 68 moved bytes, in byte order: 0x00-0x20 (33), 0x7F-0xA0 (34), 0xAD.
 * Closed forms, not a count over the bytes below: encoding calls this for
 * every byte of every piece (a space took a 32-step loop). */
uint32_t dsq_tok_byte_to_cp(uint8_t b)
{
    if (byte_is_self(b)) return b;
    if (b <= 0x20) return 256u + b;
    if (b <= 0xA0) return 256u + 33u + (b - 0x7Fu);
    return 256u + 67u; /* 0xAD */
}

int dsq_tok_cp_to_byte(uint32_t cp)
{
    if (cp < 256) return byte_is_self(cp) ? (int)cp : -1;
    if (cp < 256 + 33) return (int)(cp - 256);
    if (cp < 256 + 67) return (int)(0x7F + (cp - 256 - 33));
    return cp == 256 + 67 ? 0xAD : -1;
}

/* ---- UTF-8 --------------------------------------------------------------- */

/* Check one character at s (n > 0 bytes left).  Returns its length if valid
 * (and sets *cp), else 0 and sets *bad to the length of the maximal ill-formed
 * subpart (>= 1): the lead byte plus the continuation bytes that still fit. */
static size_t utf8_one(const uint8_t *s, size_t n, uint32_t *cp, size_t *bad)
{
    uint8_t c = s[0];
    if (c < 0x80) {
        *cp = c;
        return 1;
    }
    size_t need;
    uint8_t lo = 0x80, hi = 0xBF; /* allowed range of the second byte */
    uint32_t v;
    if (c >= 0xC2 && c <= 0xDF) {
        need = 1; v = c & 0x1F;
    } else if (c >= 0xE0 && c <= 0xEF) {
        need = 2; v = c & 0x0F;
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        need = 3; v = c & 0x07;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;
    } else {
        *bad = 1;
        return 0;
    }
    size_t i;
    for (i = 1; i <= need; i++) {
        if (i >= n) break;
        uint8_t d = s[i];
        uint8_t l = i == 1 ? lo : 0x80, h = i == 1 ? hi : 0xBF;
        if (d < l || d > h) break;
        v = (v << 6) | (d & 0x3F);
    }
    if (i <= need) {
        *bad = i;
        return 0;
    }
    *cp = v;
    return need + 1;
}

size_t dsq_utf8_valid_prefix(const uint8_t *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        /* ASCII fast path, 8 bytes at a time */
        while (i + 8 <= n) {
            uint64_t w;
            memcpy(&w, s + i, 8);
            if (w & 0x8080808080808080ull) break;
            i += 8;
        }
        if (i >= n) break;
        uint32_t cp;
        size_t bad, l = utf8_one(s + i, n - i, &cp, &bad);
        if (!l) return i;
        i += l;
    }
    return n;
}

dsq_status dsq_utf8_repair(const uint8_t *s, size_t n, char **out, size_t *out_len)
{
    /* Each bad byte grows to at most 3 bytes (U+FFFD). */
    char *o = malloc(n * 3 + 1);
    if (!o) return dsq_fail(DSQ_ERR_OUT_OF_MEMORY, "tokenize: out of memory repairing UTF-8");
    size_t i = 0, k = 0;
    while (i < n) {
        uint32_t cp;
        size_t bad = 0, l = utf8_one(s + i, n - i, &cp, &bad);
        if (l) {
            memcpy(o + k, s + i, l);
            k += l;
            i += l;
        } else {
            memcpy(o + k, "\xEF\xBF\xBD", 3);
            k += 3;
            i += bad;
        }
    }
    o[k] = 0;
    *out = o;
    *out_len = k;
    return DSQ_OK;
}

size_t dsq_utf8_next(const uint8_t *s, size_t n, uint32_t *cp)
{
    size_t bad, l = utf8_one(s, n, cp, &bad);
    if (l) return l;
    *cp = 0xFFFD; /* not reached for repaired text */
    return bad;
}

size_t dsq_utf8_prev(const uint8_t *s, size_t n, uint32_t *cp)
{
    size_t k = 1;
    while (k < n && k < 4 && (s[n - k] & 0xC0) == 0x80) k++;
    dsq_utf8_next(s + n - k, k, cp);
    return k;
}

size_t dsq_utf8_put(uint32_t cp, char *o)
{
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (char)(0xC0 | (cp >> 6));
        o[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | (cp >> 12));
        o[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | (cp >> 18));
    o[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* ---- NFC ------------------------------------------------------------------- */

dsq_status dsq_tok_nfc(const char *s, size_t n, char **out, size_t *out_len, int *owned)
{
    /* Code points below U+0300 are all NFC_Quick_Check=Yes and none of them
     * combines with a preceding character, so text whose bytes are all below
     * 0xCC (the lead byte of U+0300) is already NFC. */
    size_t i = 0;
    while (i < n && (uint8_t)s[i] < 0xCC) i++;
    if (i == n) {
        *out = (char *)s;
        *out_len = n;
        *owned = 0;
        return DSQ_OK;
    }
    utf8proc_uint8_t *dst = NULL;
    utf8proc_ssize_t r = utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, &dst,
                                      UTF8PROC_STABLE | UTF8PROC_COMPOSE);
    if (r < 0) {
        free(dst);
        if (r == UTF8PROC_ERROR_NOMEM)
            return dsq_fail(DSQ_ERR_OUT_OF_MEMORY, "tokenize: out of memory in NFC");
        return dsq_fail(DSQ_ERR_INTERNAL, "tokenize: utf8proc NFC failed: %s",
                        utf8proc_errmsg(r));
    }
    *out = (char *)dst;
    *out_len = (size_t)r;
    *owned = 1;
    return DSQ_OK;
}

/* ---- character classes ------------------------------------------------------ */

int dsq_tok_is_space_cp(uint32_t cp)
{
    /* Unicode White_Space (Rust's \s; also Oniguruma's \s) */
    return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
           (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
           cp == 0x205F || cp == 0x3000;
}

int dsq_tok_is_word_cp(uint32_t cp)
{
    /* Rust's \w: Alphabetic + Mark + Decimal_Number + Connector_Punctuation +
     * Join_Control.  Alphabetic is letters, Nl and Other_Alphabetic; the
     * latter is nearly all marks, except the enclosed Latin letters below. */
    if (cp < 0x80)
        return (cp >= '0' && cp <= '9') || (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z') ||
               cp == '_';
    if (cp == 0x200C || cp == 0x200D) return 1;
    if ((cp >= 0x24B6 && cp <= 0x24E9) || (cp >= 0x1F130 && cp <= 0x1F149) ||
        (cp >= 0x1F150 && cp <= 0x1F169) || (cp >= 0x1F170 && cp <= 0x1F189))
        return 1;
    switch (utf8proc_category((utf8proc_int32_t)cp)) {
    case UTF8PROC_CATEGORY_LU: case UTF8PROC_CATEGORY_LL: case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM: case UTF8PROC_CATEGORY_LO:
    case UTF8PROC_CATEGORY_MN: case UTF8PROC_CATEGORY_MC: case UTF8PROC_CATEGORY_ME:
    case UTF8PROC_CATEGORY_ND: case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_PC:
        return 1;
    default:
        return 0;
    }
}

/* ---- regex rewrite ------------------------------------------------------------ */

/* Oniguruma's \s for Unicode text: 0009-000D, 0085 and the Z categories. */
#define WS_SET "\\t\\n\\x0b\\f\\r\\x20\\x{85}\\x{a0}\\x{1680}\\x{2000}-\\x{200a}" \
               "\\x{2028}\\x{2029}\\x{202f}\\x{205f}\\x{3000}"

typedef struct sbuf {
    char *p;
    size_t n, cap;
    int oom;
} sbuf;

static void sb_put(sbuf *b, const char *s, size_t n)
{
    if (b->oom) return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = (b->cap ? b->cap * 2 : 256);
        while (cap < b->n + n + 1) cap *= 2;
        char *q = realloc(b->p, cap);
        if (!q) {
            b->oom = 1;
            return;
        }
        b->p = q;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

static void sb_str(sbuf *b, const char *s) { sb_put(b, s, strlen(s)); }

dsq_status dsq_tok_rewrite_regex(const char *in, char **out)
{
    enum { MAX_DEPTH = 64 };
    unsigned char caseless[MAX_DEPTH];
    int depth = 0;
    int in_class = 0;
    sbuf b = {0};
    size_t n = strlen(in), i = 0;
    caseless[0] = 0;
    *out = NULL;
    while (i < n) {
        char c = in[i];
        int ci = caseless[depth];
        if (c == '\\') {
            if (i + 1 >= n) goto bad;
            char d = in[i + 1];
            if (d == 's') {
                sb_str(&b, in_class ? WS_SET : "[" WS_SET "]");
                i += 2;
            } else if (d == 'S') {
                if (in_class) goto unsupported; /* a negated set inside a class */
                sb_str(&b, "[^" WS_SET "]");
                i += 2;
            } else if ((d == 'p' || d == 'P' || d == 'x') && i + 2 < n && in[i + 2] == '{') {
                const char *close = strchr(in + i, '}');
                if (!close) goto bad;
                size_t l = (size_t)(close - (in + i)) + 1;
                sb_put(&b, in + i, l);
                i += l;
            } else if ((d == 'p' || d == 'P') && i + 2 < n) {
                sb_put(&b, in + i, 3);
                i += 3;
            } else if (d >= 0 && ((d >= 'a' && d <= 'z') || (d >= 'A' && d <= 'Z')) &&
                       !strchr("rntfvedDwWbBAzZ", d)) {
                goto unsupported; /* escapes whose meaning may differ */
            } else {
                sb_put(&b, in + i, 2);
                i += 2;
            }
            continue;
        }
        if (in_class) {
            if (c == ']') {
                in_class = 0;
                sb_put(&b, "]", 1);
            } else if (ci && ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'))) {
                char pair[2] = {c, (char)(c ^ 0x20)};
                sb_put(&b, pair, 2);
            } else {
                sb_put(&b, &c, 1);
            }
            i++;
            continue;
        }
        switch (c) {
        case '[':
            in_class = 1;
            sb_put(&b, "[", 1);
            i++;
            if (i < n && in[i] == '^') sb_put(&b, in + i++, 1);
            if (i < n && in[i] == ']') sb_put(&b, in + i++, 1); /* literal ']' first */
            continue;
        case '(': {
            if (depth + 1 >= MAX_DEPTH) goto unsupported;
            int nc = ci;
            size_t l = 1;
            if (i + 1 < n && in[i + 1] == '?') {
                if (!strncmp(in + i, "(?i:", 4)) {
                    nc = 1;
                    sb_str(&b, "(?:");
                    i += 4;
                    caseless[++depth] = (unsigned char)nc;
                    continue;
                }
                if (!strncmp(in + i, "(?:", 3) || !strncmp(in + i, "(?=", 3) ||
                    !strncmp(in + i, "(?!", 3))
                    l = 3;
                else if (!strncmp(in + i, "(?<=", 4) || !strncmp(in + i, "(?<!", 4))
                    l = 4;
                else
                    goto unsupported;
            }
            sb_put(&b, in + i, l);
            i += l;
            caseless[++depth] = (unsigned char)nc;
            continue;
        }
        case ')':
            if (depth == 0) goto bad;
            depth--;
            sb_put(&b, ")", 1);
            i++;
            continue;
        default:
            if (ci && ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'))) {
                char cls[4] = {'[', c, (char)(c ^ 0x20), ']'};
                sb_put(&b, cls, 4);
            } else if (ci && (unsigned char)c >= 0x80) {
                goto unsupported; /* non-ASCII caseless: folding rules differ */
            } else {
                sb_put(&b, &c, 1);
            }
            i++;
        }
    }
    if (depth != 0 || in_class) goto bad;
    if (b.oom) {
        free(b.p);
        return dsq_fail(DSQ_ERR_OUT_OF_MEMORY, "tokenizer: out of memory rewriting the regex");
    }
    if (!b.p) sb_str(&b, "");
    if (b.oom) {
        free(b.p);
        return dsq_fail(DSQ_ERR_OUT_OF_MEMORY, "tokenizer: out of memory rewriting the regex");
    }
    *out = b.p;
    return DSQ_OK;
bad:
    free(b.p);
    return dsq_fail(DSQ_ERR_FORMAT, "tokenizer.json: malformed pre-tokenizer regex near offset %zu",
                    i);
unsupported:
    free(b.p);
    return dsq_fail(DSQ_ERR_UNSUPPORTED,
                    "tokenizer.json: pre-tokenizer regex construct at offset %zu is not supported",
                    i);
}
