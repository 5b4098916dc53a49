/*
 * fuzz_util.h - helpers the fuzz targets share (header-only: each target is
 * one translation unit plus replay_main.c or libFuzzer).
 *
 * The one rule every target follows: what the library reads comes from a
 * heap block of exactly the size the API is given (len bytes, or len + 1
 * with the NUL when the API takes a C string), never from libFuzzer's buffer
 * or a string literal, so a read one byte past the end is an ASan report.
 */
#ifndef DSQ_FUZZ_UTIL_H
#define DSQ_FUZZ_UTIL_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* malloc'ed copy of p[0..n), exactly n bytes (1 if n is 0); NULL on OOM. */
static inline char *fz_dup(const void *p, size_t n)
{
    char *c = (char *)malloc(n ? n : 1);
    if (c && n)
        memcpy(c, p, n);
    return c;
}

/* malloc'ed copy of p[0..n) plus a NUL: exactly n + 1 bytes. */
static inline char *fz_dupz(const void *p, size_t n)
{
    char *c = (char *)malloc(n + 1);
    if (c) {
        if (n)
            memcpy(c, p, n);
        c[n] = '\0';
    }
    return c;
}

/* Growable text buffer; on OOM `oom` is set and appends are dropped. */
typedef struct fz_buf {
    char *p;
    size_t n, cap;
    int oom;
} fz_buf;

static inline void fz_put(fz_buf *b, const void *s, size_t n)
{
    if (b->oom)
        return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 1024;
        while (cap < b->n + n + 1)
            cap *= 2;
        char *q = (char *)realloc(b->p, cap);
        if (!q) {
            b->oom = 1;
            return;
        }
        b->p = q;
        b->cap = cap;
    }
    if (n)
        memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = '\0';
}

static inline void fz_str(fz_buf *b, const char *s) { fz_put(b, s, strlen(s)); }

/* s[0..n) as a JSON string literal; bytes >= 0x80 go through unchanged (so
 * invalid UTF-8 reaches the parser), NUL and control bytes as \u00XX. */
static inline void fz_json_string(fz_buf *b, const char *s, size_t n)
{
    static const char hex[] = "0123456789abcdef";
    fz_put(b, "\"", 1);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') {
            char e[2] = {'\\', (char)c};
            fz_put(b, e, 2);
        } else if (c < 0x20) {
            char e[6] = {'\\', 'u', '0', '0', hex[c >> 4], hex[c & 15]};
            fz_put(b, e, 6);
        } else {
            fz_put(b, &s[i], 1);
        }
    }
    fz_put(b, "\"", 1);
}

/* Length of the valid UTF-8 prefix of s[0..n) (no surrogates, no overlongs,
 * nothing above U+10FFFF) -- the target's own check, independent of the
 * library's. */
static inline size_t fz_utf8_valid(const uint8_t *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        uint8_t c = s[i];
        size_t l;
        uint32_t min, cp;
        if (c < 0x80) {
            i++;
            continue;
        } else if ((c & 0xE0) == 0xC0) {
            l = 2, min = 0x80, cp = c & 0x1F;
        } else if ((c & 0xF0) == 0xE0) {
            l = 3, min = 0x800, cp = c & 0x0F;
        } else if ((c & 0xF8) == 0xF0) {
            l = 4, min = 0x10000, cp = c & 0x07;
        } else {
            return i;
        }
        if (i + l > n)
            return i;
        for (size_t k = 1; k < l; k++) {
            if ((s[i + k] & 0xC0) != 0x80)
                return i;
            cp = cp << 6 | (s[i + k] & 0x3F);
        }
        if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
            return i;
        i += l;
    }
    return n;
}

#endif /* DSQ_FUZZ_UTIL_H */
