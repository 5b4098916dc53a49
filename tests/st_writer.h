/*
 * st_writer.h - a tiny safetensors writer for tests (header-only, static).
 *
 * Written from the format description (u64 LE header length, JSON header,
 * data section) and independent of lib/safetensors.c, so the tests do not
 * check the reader against itself.  Also writes deliberately broken files.
 */
#ifndef DSQ_ST_WRITER_H
#define DSQ_ST_WRITER_H

/* needs _GNU_SOURCE (set for every test by tests/CMakeLists.txt) for nftw */
#include <ftw.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* A fresh directory under $TMPDIR (or /tmp); malloc'ed path, NULL on failure. */
static char *stw_mkdtemp(void)
{
    const char *base = getenv("TMPDIR");
    if (!base || !*base)
        base = "/tmp";
    char *p = malloc(strlen(base) + 32);
    if (!p)
        return NULL;
    sprintf(p, "%s/dsq_test_XXXXXX", base);
    if (!mkdtemp(p)) {
        free(p);
        return NULL;
    }
    return p;
}

static int stw_rm_cb(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb, (void)flag, (void)ftw;
    return remove(path);
}

/* rm -rf */
static void stw_rmtree(const char *path)
{
    if (path)
        nftw(path, stw_rm_cb, 16, FTW_DEPTH | FTW_PHYS);
}

/* malloc'ed dir/name */
static char *stw_path(const char *dir, const char *name)
{
    char *p = malloc(strlen(dir) + strlen(name) + 2);
    if (p)
        sprintf(p, "%s/%s", dir, name);
    return p;
}

static int stw_write_bytes(const char *path, const void *data, size_t len)
{
    FILE *f = fopen(path, "wb");
    if (!f)
        return -1;
    size_t n = len ? fwrite(data, 1, len, f) : 0;
    return (fclose(f) == 0 && n == len) ? 0 : -1;
}

/* Write `declared` as the u64 LE header length, then `hlen` header bytes,
 * then `dlen` data bytes (pattern if data is NULL).  Nothing is checked:
 * this is how the broken files are made. */
static int stw_write_raw(const char *path, uint64_t declared, const void *hdr, size_t hlen,
                         const void *data, size_t dlen)
{
    size_t total = 8 + hlen + dlen;
    uint8_t *buf = malloc(total ? total : 1);
    if (!buf)
        return -1;
    for (int i = 0; i < 8; i++)
        buf[i] = (uint8_t)(declared >> (8 * i));
    memcpy(buf + 8, hdr, hlen);
    for (size_t i = 0; i < dlen; i++)
        buf[8 + hlen + i] = data ? ((const uint8_t *)data)[i] : (uint8_t)(i * 37 + 11);
    int r = stw_write_bytes(path, buf, total);
    free(buf);
    return r;
}

/* Header text padded with spaces to a multiple of `align` (1 = no padding),
 * with the true padded length declared. */
static int stw_write(const char *path, const char *hdr, const void *data, size_t dlen, size_t align)
{
    size_t hl = strlen(hdr);
    size_t padded = (hl + align - 1) / align * align;
    char *h = malloc(padded + 1);
    if (!h)
        return -1;
    memcpy(h, hdr, hl);
    memset(h + hl, ' ', padded - hl);
    int r = stw_write_raw(path, padded, h, padded, data, dlen);
    free(h);
    return r;
}

/* One tensor of a well-formed file. */
typedef struct stw_tensor {
    const char *name;
    const char *dtype; /* "F32", "BF16", "I32", ... */
    int ndim;
    int64_t shape[8];
} stw_tensor;

static size_t stw_dtype_bytes(const char *dt)
{
    if (!strcmp(dt, "F64") || !strcmp(dt, "I64") || !strcmp(dt, "U64"))
        return 8;
    if (!strcmp(dt, "F32") || !strcmp(dt, "I32") || !strcmp(dt, "U32"))
        return 4;
    if (!strcmp(dt, "F16") || !strcmp(dt, "BF16") || !strcmp(dt, "I16") || !strcmp(dt, "U16"))
        return 2;
    return 1;
}

static size_t stw_nbytes(const stw_tensor *t)
{
    size_t n = stw_dtype_bytes(t->dtype);
    for (int i = 0; i < t->ndim; i++)
        n *= (size_t)t->shape[i];
    return n;
}

/* Simple deterministic bytes (xorshift) so data is never all zeros. */
static uint64_t stw_rng = 0x9e3779b97f4a7c15ull;
static uint8_t stw_rand_byte(void)
{
    stw_rng ^= stw_rng << 13;
    stw_rng ^= stw_rng >> 7;
    stw_rng ^= stw_rng << 17;
    return (uint8_t)(stw_rng >> 24);
}

/* Write a valid file holding `n` tensors laid out back to back in the given
 * order, header padded to `align`.  `meta` is an extra JSON member (e.g.
 * "\"__metadata__\":{\"format\":\"pt\"}") or NULL.  On success returns the
 * data section (malloc'ed, random bytes) and its length; offsets[i] receives
 * tensor i's begin. */
static uint8_t *stw_write_tensors(const char *path, const stw_tensor *t, int n, const char *meta,
                                  size_t align, size_t *data_len, size_t *offsets)
{
    size_t cap = 256 + (meta ? strlen(meta) : 0) + (size_t)n * 512, k = 0;
    char *h = malloc(cap);
    if (!h)
        return NULL;
    size_t off = 0;
    k += (size_t)snprintf(h + k, cap - k, "{");
    if (meta)
        k += (size_t)snprintf(h + k, cap - k, "%s%s", meta, n ? "," : "");
    for (int i = 0; i < n; i++) {
        size_t nb = stw_nbytes(&t[i]);
        k += (size_t)snprintf(h + k, cap - k, "%s\"%s\":{\"dtype\":\"%s\",\"shape\":[", i ? "," : "",
                              t[i].name, t[i].dtype);
        for (int d = 0; d < t[i].ndim; d++)
            k += (size_t)snprintf(h + k, cap - k, "%s%lld", d ? "," : "", (long long)t[i].shape[d]);
        k += (size_t)snprintf(h + k, cap - k, "],\"data_offsets\":[%zu,%zu]}", off, off + nb);
        if (offsets)
            offsets[i] = off;
        off += nb;
    }
    snprintf(h + k, cap - k, "}");
    uint8_t *data = malloc(off ? off : 1);
    if (!data) {
        free(h);
        return NULL;
    }
    for (size_t i = 0; i < off; i++)
        data[i] = stw_rand_byte();
    /* Float values finite (the loader refuses NaN/Inf): clear the top
     * exponent bit of each element (in its most significant byte). */
    size_t b = 0;
    for (int i = 0; i < n; b += stw_nbytes(&t[i]), i++) {
        size_t es = stw_dtype_bytes(t[i].dtype), nb = stw_nbytes(&t[i]);
        if (!strcmp(t[i].dtype, "F32") || !strcmp(t[i].dtype, "F16") ||
            !strcmp(t[i].dtype, "BF16") || !strcmp(t[i].dtype, "F64"))
            for (size_t k = b + es - 1; k < b + nb; k += es)
                data[k] &= 0xbf;
    }
    if (stw_write(path, h, data, off, align) != 0) {
        free(h);
        free(data);
        return NULL;
    }
    free(h);
    *data_len = off;
    return data;
}

#endif
