/* stop.c - dsq_stopper: stop strings and EOS over a stream of sampled ids.
 *
 * Ids go through a dsq_detok_stream (skip_special = 1), which yields only
 * complete UTF-8 characters.  The decoded text is appended to `pend`, whose
 * first n_held bytes were held back by earlier pushes.  Invariants between
 * calls: pend[0..n_held) contains no complete stop string, and it is the
 * longest suffix of everything decoded so far that is a proper prefix of some
 * stop string -- so it is shorter than the longest stop string, and any
 * match the next push completes must end inside the newly decoded text.
 *
 * Which match wins when several are possible: the one that ends first (then
 * the longest).  Feeding the same text character by character would stop at
 * that same match, so the output does not depend on the tokenization.
 *
 * Cost per push: O(new bytes * stop strings * their length) comparisons;
 * stop strings are few and short.  No allocation after dsq_stopper_new(). */
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "tokenizer_internal.h"

struct dsq_stopper {
    const dsq_tokenizer *tok;
    dsq_detok_stream *ds;
    int32_t eos;              /* stop id, -1 = none (stop_on_eos off / no EOS) */
    size_t n_stop;
    char **stop;              /* [n_stop] NUL-terminated copies              */
    size_t *stop_len;         /* [n_stop] bytes, > 0                         */
    size_t max_stop;          /* longest stop string, 0 if none              */
    char *pend;               /* [pend_cap] held text, then the new text     */
    size_t pend_cap;          /* max_stop + 8 + longest token: never full    */
    size_t n_held;
    int stopped;
};

void dsq_stopper_free(dsq_stopper *s)
{
    if (!s)
        return;
    for (size_t i = 0; i < s->n_stop; i++)
        free(s->stop[i]);
    free(s->stop);
    free(s->stop_len);
    free(s->pend);
    dsq_detok_stream_free(s->ds);
    free(s);
}

dsq_status dsq_stopper_new(const dsq_tokenizer *tok, const char *const *stop_strings,
                           size_t n_stop, int stop_on_eos, dsq_stopper **out)
{
    dsq_clear_error();
    if (out)
        *out = NULL;
    if (!tok || !out)
        return dsq_fail(DSQ_ERR_INVALID_ARG, "dsq_stopper_new: NULL tokenizer or out");
    if (n_stop > 0 && !stop_strings)
        return dsq_fail(DSQ_ERR_INVALID_ARG, "dsq_stopper_new: stop_strings is NULL but n_stop = %zu",
                        n_stop);
    for (size_t i = 0; i < n_stop; i++)
        if (!stop_strings[i] || !stop_strings[i][0])
            return dsq_fail(DSQ_ERR_INVALID_ARG, "dsq_stopper_new: stop string %zu is %s", i,
                            stop_strings[i] ? "empty" : "NULL");

    dsq_stopper *s = calloc(1, sizeof *s);
    if (!s)
        return dsq_fail(DSQ_ERR_OUT_OF_MEMORY, "dsq_stopper_new: out of memory");
    s->tok = tok;
    s->eos = stop_on_eos ? dsq_tokenizer_eos(tok) : -1;
    if (n_stop > 0) {
        s->stop = calloc(n_stop, sizeof *s->stop);
        s->stop_len = calloc(n_stop, sizeof *s->stop_len);
        if (!s->stop || !s->stop_len)
            goto oom;
        for (size_t i = 0; i < n_stop; i++) {
            s->n_stop = i + 1; /* so free() releases what exists on failure */
            if (!(s->stop[i] = strdup(stop_strings[i])))
                goto oom;
            s->stop_len[i] = strlen(stop_strings[i]);
            if (s->stop_len[i] > s->max_stop)
                s->max_stop = s->stop_len[i];
        }
    }
    /* held (< max_stop) + what one detok push emits (<= 3 held bytes + the
     * token) or a flush (3), plus the NUL */
    s->pend_cap = s->max_stop + 8 + tok->max_dec_len;
    if (!(s->pend = malloc(s->pend_cap)))
        goto oom;
    dsq_status st = dsq_detok_stream_new(tok, 1, &s->ds);
    if (st != DSQ_OK) {
        dsq_stopper_free(s);
        return st;
    }
    *out = s;
    return DSQ_OK;
oom:
    dsq_stopper_free(s);
    return dsq_fail(DSQ_ERR_OUT_OF_MEMORY, "dsq_stopper_new: out of memory");
}

void dsq_stopper_reset(dsq_stopper *s)
{
    if (!s)
        return;
    /* flushing empties the detok stream's partial character; the bytes are
     * dropped (pend always has room for a flush) */
    size_t dropped = 0;
    (void)dsq_detok_stream_flush(s->ds, s->pend, s->pend_cap, &dropped);
    s->n_held = 0;
    s->stopped = 0;
}

/* Earliest-ending complete stop string in p[0..n) that ends after byte
 * `from` (earlier ends were checked by previous pushes); the longest of those
 * ending at the same byte.  Returns 1 and its start in *start, else 0. */
static int find_stop(const dsq_stopper *s, const char *p, size_t n, size_t from, size_t *start)
{
    for (size_t e = from + 1; e <= n; e++) {
        size_t best = 0;
        for (size_t i = 0; i < s->n_stop; i++) {
            size_t l = s->stop_len[i];
            if (l <= e && l > best && memcmp(p + e - l, s->stop[i], l) == 0)
                best = l;
        }
        if (best) {
            *start = e - best;
            return 1;
        }
    }
    return 0;
}

/* Length of the longest suffix of p[0..n) that is a proper prefix of some
 * stop string: the text that must wait for the next token. */
static size_t hold_len(const dsq_stopper *s, const char *p, size_t n)
{
    size_t k = s->max_stop ? s->max_stop - 1 : 0;
    if (k > n)
        k = n;
    for (; k > 0; k--)
        for (size_t i = 0; i < s->n_stop; i++)
            if (s->stop_len[i] > k && memcmp(p + n - k, s->stop[i], k) == 0)
                return k;
    return 0;
}

/* Copy p[0..n) to the caller's buffer (room checked by the caller). */
static void put(char *text, const char *p, size_t n, size_t *len_out)
{
    if (n)
        memcpy(text, p, n);
    text[n] = '\0';
    *len_out = n;
}

dsq_status dsq_stopper_push(dsq_stopper *s, int32_t token, char *text, size_t cap,
                            size_t *len_out, int *stopped)
{
    dsq_clear_error();
    if (len_out)
        *len_out = 0;
    if (stopped)
        *stopped = 0;
    if (!s || !len_out || !stopped || (!text && cap))
        return dsq_fail(DSQ_ERR_INVALID_ARG, "dsq_stopper_push: NULL stopper, len_out, stopped or text");
    const dsq_tokenizer *t = s->tok;
    if (token < 0 || token >= t->n_ids || !(t->flags[token] & DSQ_TOKF_PRESENT))
        return dsq_fail(DSQ_ERR_TOKEN, "dsq_stopper_push: id %d is not a token (0..%d)", (int)token,
                        (int)t->n_ids - 1);
    if (s->stopped) {
        *stopped = 1;
        if (cap)
            text[0] = '\0';
        return DSQ_OK;
    }
    const int is_eos = token == s->eos;
    /* Upper bound of what this call writes, checked before any state
     * changes: held text + the detok stream's partial character (<= 3) +
     * the token's text (nothing for EOS, which is flushed instead). */
    size_t tok_len = (t->flags[token] & DSQ_TOKF_SPECIAL) ? 0 : t->dec_len[token];
    size_t bound = s->n_held + 3 + (is_eos ? 0 : tok_len);
    if (bound + 1 > cap) {
        *len_out = bound;
        return dsq_fail(DSQ_ERR_BUFFER_TOO_SMALL,
                        "dsq_stopper_push: up to %zu bytes + NUL may be written, buffer holds %zu",
                        bound, cap);
    }

    size_t got = 0;
    char *tail = s->pend + s->n_held;
    size_t room = s->pend_cap - s->n_held;
    dsq_status st = is_eos ? dsq_detok_stream_flush(s->ds, tail, room, &got)
                           : dsq_detok_stream_push(s->ds, token, tail, room, &got);
    if (st != DSQ_OK) /* cannot happen: pend_cap covers both */
        return st;
    size_t n = s->n_held + got;
    if (is_eos) { /* held text was no stop string after all */
        put(text, s->pend, n, len_out);
        s->n_held = 0;
        s->stopped = 1;
        *stopped = 1;
        return DSQ_OK;
    }
    size_t start;
    if (find_stop(s, s->pend, n, s->n_held, &start)) {
        put(text, s->pend, start, len_out);
        s->n_held = 0;
        s->stopped = 1;
        *stopped = 1;
        return DSQ_OK;
    }
    size_t hold = hold_len(s, s->pend, n);
    put(text, s->pend, n - hold, len_out);
    memmove(s->pend, s->pend + n - hold, hold);
    s->n_held = hold;
    return DSQ_OK;
}

dsq_status dsq_stopper_flush(dsq_stopper *s, char *text, size_t cap, size_t *len_out)
{
    dsq_clear_error();
    if (len_out)
        *len_out = 0;
    if (!s || !len_out || (!text && cap))
        return dsq_fail(DSQ_ERR_INVALID_ARG, "dsq_stopper_flush: NULL stopper, len_out or text");
    if (s->stopped) {
        if (cap)
            text[0] = '\0';
        return DSQ_OK;
    }
    size_t bound = s->n_held + 3;
    if (bound + 1 > cap) {
        *len_out = bound;
        return dsq_fail(DSQ_ERR_BUFFER_TOO_SMALL,
                        "dsq_stopper_flush: up to %zu bytes + NUL may be written, buffer holds %zu",
                        bound, cap);
    }
    size_t got = 0;
    dsq_status st = dsq_detok_stream_flush(s->ds, s->pend + s->n_held, s->pend_cap - s->n_held, &got);
    if (st != DSQ_OK)
        return st;
    put(text, s->pend, s->n_held + got, len_out);
    s->n_held = 0;
    return DSQ_OK;
}
