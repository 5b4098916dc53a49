/*
 * fuzz_stopper.c - dsq_stopper_* (stop strings and EOS over a stream of
 * sampled ids) with the real Qwen2 tokenizer.
 *
 * Input: byte 0: bits 0-1 = number of stop strings (0-3), bit 2 =
 * stop_on_eos, bit 3 = reset and run the same ids again; then each stop
 * string up to a 0x00 byte; the rest are ids, 3 bytes each (little-endian,
 * taken modulo n_tokens + 2, minus 1: so -1 and n_tokens, which are not
 * tokens, occur too).  Stop strings are exact-size heap copies (len + 1
 * with the NUL: the API takes C strings).
 *
 * Every push first asks with a zero-size buffer, which must be refused with
 * DSQ_ERR_BUFFER_TOO_SMALL and the bound, then pushes into a heap buffer of
 * exactly bound + 1 bytes.  The text written is checked against a plain
 * dsq_detok_stream (skip_special) fed the same ids:
 *   - never stopped: everything written, plus the final flush, equals the
 *     stream's text plus its flush, and no stop string was written before
 *     that flush;
 *   - stopped by a stop string: what was written is the stream's text up to
 *     the start of the stop string that ends first (the longest of those
 *     ending at the same byte);
 *   - stopped by EOS (stop_on_eos): the stream's text plus its flush.
 * Ids that are not tokens must be DSQ_ERR_TOKEN and change nothing.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsqwen.h"
#include "fuzz_util.h"

#ifndef DSQ_FUZZ_TOKENIZER
#define DSQ_FUZZ_TOKENIZER "tests/data/model/tokenizer.json"
#endif

enum { MAX_STOP = 3, REF_CAP = 1 << 16 };

static dsq_tokenizer *g_tok;

static const dsq_tokenizer *tokenizer(void)
{
    if (!g_tok) {
        const char *path = getenv("DSQ_FUZZ_TOKENIZER");
        if (!path || !*path)
            path = DSQ_FUZZ_TOKENIZER;
        if (dsq_tokenizer_load(path, &g_tok) != DSQ_OK) {
            fprintf(stderr, "fuzz_stopper: cannot load %s: %s\n", path, dsq_last_error_message());
            abort(); /* a setup problem, not a finding */
        }
    }
    return g_tok;
}

typedef struct run_result {
    fz_buf out;     /* everything the stopper wrote */
    size_t pre_flush; /* bytes of `out` written by pushes (not by a final flush / EOS) */
    int stopped;    /* 0, 1 = stop string, 2 = EOS */
} run_result;

/* Start of the stop string that ends first in p[0..n) (longest of those
 * ending at the same byte), or -1. */
static long first_stop(const char *p, size_t n, char *const *stop, size_t n_stop)
{
    for (size_t e = 1; e <= n; e++) {
        size_t best = 0;
        for (size_t i = 0; i < n_stop; i++) {
            size_t l = strlen(stop[i]);
            if (l <= e && l > best && !memcmp(p + e - l, stop[i], l))
                best = l;
        }
        if (best)
            return (long)(e - best);
    }
    return -1;
}

static void run(const dsq_tokenizer *t, dsq_stopper *s, const int32_t *ids, size_t n_ids,
                int32_t eos, char *const *stop, size_t n_stop, run_result *r)
{
    memset(r, 0, sizeof *r);
    dsq_detok_stream *ref_stream = NULL;
    if (dsq_detok_stream_new(t, 1, &ref_stream) != DSQ_OK)
        abort();
    fz_buf ref = {0};
    char *tmp = (char *)malloc(REF_CAP);
    if (!tmp)
        abort();
    for (size_t i = 0; i < n_ids; i++) {
        size_t bound = 0;
        int stopped = -1;
        dsq_status st = dsq_stopper_push(s, ids[i], NULL, 0, &bound, &stopped);
        if (st == DSQ_ERR_TOKEN) {
            size_t l = 0;
            if (dsq_detok_stream_push(ref_stream, ids[i], tmp, REF_CAP, &l) != DSQ_ERR_TOKEN)
                abort();
            continue;
        }
        if (st != DSQ_ERR_BUFFER_TOO_SMALL || bound < 3 || stopped != 0)
            abort();
        char *buf = (char *)malloc(bound + 1);
        if (!buf)
            abort();
        size_t len = 0;
        if (dsq_stopper_push(s, ids[i], buf, bound + 1, &len, &stopped) != DSQ_OK || len > bound ||
            buf[len] != '\0' || (stopped != 0 && stopped != 1))
            abort();
        /* the reference: the same id through a plain stream */
        size_t l = 0;
        if (ids[i] == eos && stopped)
            st = dsq_detok_stream_flush(ref_stream, tmp, REF_CAP, &l);
        else
            st = dsq_detok_stream_push(ref_stream, ids[i], tmp, REF_CAP, &l);
        if (st != DSQ_OK)
            abort();
        fz_put(&ref, tmp, l);
        fz_put(&r->out, buf, len);
        free(buf);
        if (stopped) {
            r->stopped = ids[i] == eos ? 2 : 1;
            break;
        }
        r->pre_flush = r->out.n;
    }
    if (!r->stopped) {
        size_t need = 0, len = 0, l = 0;
        dsq_status st = dsq_stopper_flush(s, NULL, 0, &need);
        if (st != DSQ_ERR_BUFFER_TOO_SMALL)
            abort();
        char *buf = (char *)malloc(need + 1);
        if (!buf)
            abort();
        if (dsq_stopper_flush(s, buf, need + 1, &len) != DSQ_OK || len > need || buf[len] != '\0')
            abort();
        fz_put(&r->out, buf, len);
        free(buf);
        if (dsq_detok_stream_flush(ref_stream, tmp, REF_CAP, &l) != DSQ_OK)
            abort();
        fz_put(&ref, tmp, l);
    }
    if (ref.oom || r->out.oom)
        abort();
    const char *out = r->out.p ? r->out.p : "";
    const char *rp = ref.p ? ref.p : "";
    if (r->stopped == 1) {
        long start = first_stop(rp, ref.n, stop, n_stop);
        if (start < 0 || (size_t)start != r->out.n || memcmp(out, rp, r->out.n) != 0)
            abort();
    } else {
        if (r->out.n != ref.n || memcmp(out, rp, ref.n) != 0)
            abort();
        if (first_stop(out, r->pre_flush, stop, n_stop) >= 0)
            abort(); /* a stop string went out and nothing stopped */
    }
    /* After the run: a stopped stopper stays stopped, writes nothing. */
    if (r->stopped) {
        char b[8];
        size_t len = 9;
        int stopped = 0;
        if (dsq_stopper_push(s, ids[0] >= 0 && ids[0] < dsq_tokenizer_n_tokens(t) &&
                                    dsq_token_text(t, ids[0]) ? ids[0] : 0,
                             b, sizeof b, &len, &stopped) != DSQ_OK ||
            len != 0 || stopped != 1 || b[0] != '\0')
            abort();
    }
    free(tmp);
    free(ref.p);
    dsq_detok_stream_free(ref_stream);
}

/* The 7 MB tokenizer is loaded before the first input (libFuzzer calls
 * this once), so its load -- seconds under ASan on a busy machine -- does
 * not count against the first input's -timeout. */
int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    (void)tokenizer();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const dsq_tokenizer *t = tokenizer();
    if (size < 1)
        return 0;
    size_t n_stop = data[0] & 3u;
    int stop_on_eos = (data[0] >> 2) & 1, again = (data[0] >> 3) & 1;
    size_t at = 1;
    char *stop[MAX_STOP] = {0};
    int empty = 0;
    for (size_t i = 0; i < n_stop; i++) {
        const uint8_t *c = data + at;
        const uint8_t *z = (const uint8_t *)memchr(c, 0, size - at);
        size_t l = z ? (size_t)(z - c) : size - at;
        at += l + (z ? 1 : 0);
        stop[i] = fz_dupz(c, l);
        if (!stop[i])
            abort();
        if (l == 0)
            empty = 1;
    }
    int32_t n_tok = dsq_tokenizer_n_tokens(t);
    size_t n_ids = (size - at) / 3;
    int32_t *ids = (int32_t *)malloc((n_ids ? n_ids : 1) * sizeof *ids);
    if (!ids)
        abort();
    for (size_t i = 0; i < n_ids; i++, at += 3) {
        uint32_t v = (uint32_t)data[at] | (uint32_t)data[at + 1] << 8 | (uint32_t)data[at + 2] << 16;
        ids[i] = (int32_t)(v % (uint32_t)(n_tok + 2)) - 1;
    }

    dsq_stopper *s = NULL;
    dsq_status st = dsq_stopper_new(t, (const char *const *)stop, n_stop, stop_on_eos, &s);
    if (empty) {
        if (st != DSQ_ERR_INVALID_ARG || s != NULL)
            abort();
    } else {
        if (st != DSQ_OK)
            abort();
        int32_t eos = stop_on_eos ? dsq_tokenizer_eos(t) : -2;
        run_result r1, r2;
        run(t, s, ids, n_ids, eos, stop, n_stop, &r1);
        if (again) {
            dsq_stopper_reset(s);
            run(t, s, ids, n_ids, eos, stop, n_stop, &r2);
            if (r1.stopped != r2.stopped || r1.out.n != r2.out.n ||
                (r1.out.n && memcmp(r1.out.p, r2.out.p, r1.out.n) != 0))
                abort();
            free(r2.out.p);
        }
        free(r1.out.p);
        dsq_stopper_free(s);
    }
    free(ids);
    for (size_t i = 0; i < n_stop; i++)
        free(stop[i]);
    return 0;
}
