/* output.c - sampled ids -> OpenAI response text and JSON (scheduler thread).
 *
 * Text goes through the request's dsq_stopper (stop strings never reach the
 * client, even split across tokens; EOS ends the reply).  For chat replies
 * the R1 reasoning is split off: the chat template ends with "<think>\n", so
 * a reply starts inside the thought; everything up to the </think> token is
 * `reasoning_content`, the rest `content` (leading whitespace dropped), as
 * the DeepSeek API and vLLM's reasoning parser return it.  With
 * --reasoning-inline the whole text, "<think>\n" included, is `content`.
 *
 * Streaming: each step's text for a request becomes one SSE chunk in
 * r->pending, which the scheduler moves to r->out under the lock. */
#include <cjson/cJSON.h>
#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "serve.h"

int srv_buf_add(srv_buf *b, const char *s, size_t n)
{
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n + 1)
            cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p)
            return -1;
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
    return 0;
}

int srv_buf_str(srv_buf *b, const char *s)
{
    return srv_buf_add(b, s, strlen(s));
}

void srv_buf_free(srv_buf *b)
{
    free(b->p);
    b->p = NULL;
    b->len = b->cap = 0;
}

double srv_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void srv_hist_observe(srv_hist *h, double v)
{
    int i = 0;
    while (i < h->n && v > h->le[i])
        i++;
    h->count[i]++;
    h->sum += v;
    h->total++;
}

/* Copy of `s[n]` that is valid UTF-8 (JSON strings must be): ill-formed
 * bytes become U+FFFD. */
static char *utf8_clean(const char *s, size_t n)
{
    char *o = malloc(3 * n + 1), *w = o;
    if (!o)
        return NULL;
    const unsigned char *p = (const unsigned char *)s, *e = p + n;
    while (p < e) {
        unsigned c = *p;
        size_t k = c < 0x80 ? 1 : (c >= 0xC2 && c <= 0xDF) ? 2 : (c >= 0xE0 && c <= 0xEF) ? 3
                 : (c >= 0xF0 && c <= 0xF4) ? 4 : 0;
        int ok = k > 0 && (size_t)(e - p) >= k;
        for (size_t j = 1; ok && j < k; j++)
            ok = (p[j] & 0xC0) == 0x80;
        if (ok && k == 3)
            ok = !(c == 0xE0 && p[1] < 0xA0) && !(c == 0xED && p[1] > 0x9F);
        if (ok && k == 4)
            ok = !(c == 0xF0 && p[1] < 0x90) && !(c == 0xF4 && p[1] > 0x8F);
        if (ok && k == 1 && c == 0)
            ok = 0; /* NUL would end the C string */
        if (ok) {
            memcpy(w, p, k);
            w += k;
            p += k;
        } else {
            memcpy(w, "\xEF\xBF\xBD", 3);
            w += 3;
            p++;
        }
    }
    *w = '\0';
    return o;
}

static void add_clean_string(cJSON *obj, const char *key, const char *s, size_t n)
{
    char *c = utf8_clean(s, n);
    cJSON_AddStringToObject(obj, key, c ? c : "");
    free(c);
}

/* A token's text (special tokens as their text) and bytes. */
static void token_fields(srv *s, int32_t id, cJSON *obj, int with_bytes)
{
    char buf[1024];
    size_t len = 0;
    if (dsq_detokenize(s->tok, &id, 1, 0, buf, sizeof buf, &len) != DSQ_OK)
        len = 0;
    add_clean_string(obj, "token", buf, len);
    (void)with_bytes;
    if (with_bytes) {
        cJSON *b = cJSON_AddArrayToObject(obj, "bytes");
        for (size_t i = 0; i < len; i++)
            cJSON_AddItemToArray(b, cJSON_CreateNumber((unsigned char)buf[i]));
    }
}

/* Chat: one entry of logprobs.content. */
static cJSON *chat_logprob(srv *s, const srv_req *r, const dsq_step_out *o)
{
    cJSON *x = cJSON_CreateObject();
    token_fields(s, o->token, x, 1);
    cJSON_AddNumberToObject(x, "logprob", o->logprob);
    cJSON *top = cJSON_AddArrayToObject(x, "top_logprobs");
    for (int i = 0; i < o->n_top && i < r->top_n; i++) {
        cJSON *t = cJSON_CreateObject();
        token_fields(s, o->top_ids[i], t, 1);
        cJSON_AddNumberToObject(t, "logprob", o->top_logprobs[i]);
        cJSON_AddItemToArray(top, t);
    }
    return x;
}

/* Completions logprobs: {tokens, token_logprobs, top_logprobs, text_offset},
 * filled token by token. */
static cJSON *cmpl_logprobs_new(void)
{
    cJSON *x = cJSON_CreateObject();
    cJSON_AddArrayToObject(x, "tokens");
    cJSON_AddArrayToObject(x, "token_logprobs");
    cJSON_AddArrayToObject(x, "top_logprobs");
    cJSON_AddArrayToObject(x, "text_offset");
    return x;
}

static void cmpl_logprobs_add(srv *s, const srv_req *r, cJSON *x, const dsq_step_out *o,
                              size_t offset)
{
    cJSON *t = cJSON_CreateObject();
    token_fields(s, o->token, t, 0);
    cJSON_AddItemToArray(cJSON_GetObjectItem(x, "tokens"),
                         cJSON_CreateString(cJSON_GetObjectItem(t, "token")->valuestring));
    cJSON_Delete(t);
    cJSON_AddItemToArray(cJSON_GetObjectItem(x, "token_logprobs"),
                         cJSON_CreateNumber(o->logprob));
    cJSON *top = cJSON_CreateObject();
    for (int i = 0; i < o->n_top && i < r->top_n; i++) {
        cJSON *tt = cJSON_CreateObject();
        token_fields(s, o->top_ids[i], tt, 0);
        const char *key = cJSON_GetObjectItem(tt, "token")->valuestring;
        if (!cJSON_GetObjectItemCaseSensitive(top, key))
            cJSON_AddNumberToObject(top, key, o->top_logprobs[i]);
        cJSON_Delete(tt);
    }
    cJSON_AddItemToArray(cJSON_GetObjectItem(x, "top_logprobs"), top);
    cJSON_AddItemToArray(cJSON_GetObjectItem(x, "text_offset"), cJSON_CreateNumber((double)offset));
}

static cJSON *chunk_base(srv *s, const srv_req *r)
{
    cJSON *c = cJSON_CreateObject();
    cJSON_AddStringToObject(c, "id", r->id);
    cJSON_AddStringToObject(c, "object", r->chat ? "chat.completion.chunk" : "text_completion");
    cJSON_AddNumberToObject(c, "created", (double)r->created);
    cJSON_AddStringToObject(c, "model", s->served_name);
    return c;
}

static cJSON *usage_json(const srv_req *r)
{
    cJSON *u = cJSON_CreateObject();
    cJSON_AddNumberToObject(u, "prompt_tokens", r->n_prompt);
    cJSON_AddNumberToObject(u, "completion_tokens", r->n_gen);
    cJSON_AddNumberToObject(u, "total_tokens", r->n_prompt + r->n_gen);
    cJSON *d = cJSON_AddObjectToObject(u, "prompt_tokens_details");
    cJSON_AddNumberToObject(d, "cached_tokens", r->n_cached);
    return u;
}

/* "data: JSON\n\n" into r->pending; takes `c`. */
static void sse(srv_req *r, cJSON *c)
{
    char *js = cJSON_PrintUnformatted(c);
    cJSON_Delete(c);
    if (!js)
        return;
    srv_buf_str(&r->pending, "data: ");
    srv_buf_str(&r->pending, js);
    srv_buf_str(&r->pending, "\n\n");
    free(js);
}

/* `s[n]` as a JSON string literal (quotes included) appended to `b`: the
 * bytes cJSON prints for add_clean_string(s, n) -- its escapes (\b \f \n \r
 * \t, \u00xx for the other controls), ill-formed UTF-8 and NUL as a raw
 * U+FFFD as utf8_clean makes them. */
static void json_string(srv_buf *b, const char *s, size_t n)
{
    static const char hex[] = "0123456789abcdef";
    const unsigned char *p = (const unsigned char *)s, *e = p + n;
    srv_buf_add(b, "\"", 1);
    while (p < e) {
        const unsigned char *run = p; /* plain ASCII copied in one go */
        while (p < e && *p >= 0x20 && *p < 0x80 && *p != '"' && *p != '\\')
            p++;
        if (p > run)
            srv_buf_add(b, (const char *)run, (size_t)(p - run));
        if (p >= e)
            break;
        unsigned c = *p;
        if (c == 0) {
            srv_buf_add(b, "\xEF\xBF\xBD", 3);
            p++;
            continue;
        }
        if (c < 0x80) {
            char esc[7] = { '\\', (char)c, 0 };
            size_t k = 2;
            if (c == '\n') esc[1] = 'n';
            else if (c == '\r') esc[1] = 'r';
            else if (c == '\t') esc[1] = 't';
            else if (c == '\b') esc[1] = 'b';
            else if (c == '\f') esc[1] = 'f';
            else if (c < 0x20) {
                memcpy(esc, "\\u00", 4);
                esc[4] = hex[c >> 4];
                esc[5] = hex[c & 15];
                k = 6;
            }
            srv_buf_add(b, esc, k);
            p++;
            continue;
        }
        size_t k = (c >= 0xC2 && c <= 0xDF) ? 2 : (c >= 0xE0 && c <= 0xEF) ? 3
                 : (c >= 0xF0 && c <= 0xF4) ? 4 : 0;
        int ok = k > 0 && (size_t)(e - p) >= k;
        for (size_t j = 1; ok && j < k; j++)
            ok = (p[j] & 0xC0) == 0x80;
        if (ok && k == 3)
            ok = !(c == 0xE0 && p[1] < 0xA0) && !(c == 0xED && p[1] > 0x9F);
        if (ok && k == 4)
            ok = !(c == 0xF0 && p[1] < 0x90) && !(c == 0xF4 && p[1] > 0x8F);
        if (ok) {
            srv_buf_add(b, (const char *)p, k);
            p += k;
        } else {
            srv_buf_add(b, "\xEF\xBF\xBD", 3);
            p++;
        }
    }
    srv_buf_add(b, "\"", 1);
}

/* A number as cJSON prints it (print_number: integers with %d, else the
 * shortest of %1.15g / %1.17g that reads back). */
static void json_number(srv_buf *b, double d)
{
    char t[64];
    int vi = d >= (double)INT_MAX ? INT_MAX : d <= (double)INT_MIN ? INT_MIN : (int)d;
    if (isnan(d) || isinf(d)) {
        snprintf(t, sizeof t, "null");
    } else if (d == (double)vi) {
        snprintf(t, sizeof t, "%d", vi);
    } else {
        double back = 0.0;
        snprintf(t, sizeof t, "%1.15g", d);
        if (sscanf(t, "%lg", &back) != 1 ||
            !(fabs(back - d) <= fmax(fabs(back), fabs(d)) * DBL_EPSILON))
            snprintf(t, sizeof t, "%1.17g", d);
    }
    srv_buf_str(b, t);
}

/* A token's text (detokenized alone, as token_fields does) as
 * "token":"...", and with `with_bytes` its byte array after it. */
static void token_json(srv *s, srv_buf *b, int32_t id, int with_bytes)
{
    char buf[1024];
    size_t len = 0;
    if (dsq_detokenize(s->tok, &id, 1, 0, buf, sizeof buf, &len) != DSQ_OK)
        len = 0;
    srv_buf_str(b, "\"token\":");
    json_string(b, buf, len);
    if (with_bytes) {
        srv_buf_str(b, ",\"bytes\":[");
        for (size_t i = 0; i < len; i++) {
            char n[8];
            snprintf(n, sizeof n, i ? ",%u" : "%u", (unsigned)(unsigned char)buf[i]);
            srv_buf_str(b, n);
        }
        srv_buf_str(b, "]");
    }
}

/* The logprobs object of one streamed token, written directly with the
 * bytes cJSON would print for chat_logprob / cmpl_logprobs_add: a stream
 * makes one per token, and the cJSON tree for it was most of the
 * scheduler's work between steps (measured on the development machine:
 * 0.27 ms per step for 8 streaming requests with logprobs, 0.05-0.12 ms
 * without). */
static void stream_logprobs_json(srv *s, const srv_req *r, const dsq_step_out *o, srv_buf *b)
{
    b->len = 0;
    int n_top = o->n_top < r->top_n ? o->n_top : r->top_n;
    if (r->chat) {
        srv_buf_str(b, "{\"content\":[{");
        token_json(s, b, o->token, 1);
        srv_buf_str(b, ",\"logprob\":");
        json_number(b, o->logprob);
        srv_buf_str(b, ",\"top_logprobs\":[");
        for (int i = 0; i < n_top; i++) {
            srv_buf_str(b, i ? ",{" : "{");
            token_json(s, b, o->top_ids[i], 1);
            srv_buf_str(b, ",\"logprob\":");
            json_number(b, o->top_logprobs[i]);
            srv_buf_str(b, "}");
        }
        srv_buf_str(b, "]}]}");
        return;
    }
    /* token_json writes "token":"..."; these want the string alone */
    const size_t skip = strlen("\"token\":");
    srv_buf t = { 0 };
    srv_buf_str(b, "{\"tokens\":[");
    token_json(s, &t, o->token, 0);
    if (t.p && t.len > skip)
        srv_buf_add(b, t.p + skip, t.len - skip);
    srv_buf_str(b, "],\"token_logprobs\":[");
    json_number(b, o->logprob);
    srv_buf_str(b, "],\"top_logprobs\":[{");
    /* an object keyed by token text: a repeated text keeps its first
     * log-prob, as cJSON_GetObjectItemCaseSensitive made it */
    size_t key_at[DSQ_STEP_MAX_TOP_N], key_len[DSQ_STEP_MAX_TOP_N];
    int n_keys = 0;
    for (int i = 0; i < n_top && i < DSQ_STEP_MAX_TOP_N; i++) {
        t.len = 0;
        token_json(s, &t, o->top_ids[i], 0);
        if (!t.p || t.len <= skip)
            continue;
        const char *key = t.p + skip;
        size_t kl = t.len - skip;
        int dup = 0;
        for (int k = 0; k < n_keys && !dup; k++)
            dup = key_len[k] == kl && memcmp(b->p + key_at[k], key, kl) == 0;
        if (dup)
            continue;
        if (n_keys)
            srv_buf_str(b, ",");
        key_at[n_keys] = b->len;
        key_len[n_keys] = kl;
        n_keys++;
        srv_buf_add(b, key, kl);
        srv_buf_str(b, ":");
        json_number(b, o->top_logprobs[i]);
    }
    srv_buf_free(&t);
    srv_buf_str(b, "}],\"text_offset\":[");
    json_number(b, (double)r->stream_off);
    srv_buf_str(b, "]}");
}


/* One streamed chunk: text for content or reasoning, optional logprobs,
 * optional finish reason and usage. */
static void stream_chunk(srv *s, srv_req *r, const char *text, size_t n, int reasoning,
                         const char *logprobs, const char *finish, int with_usage)
{
    if ((text || (r->chat && logprobs)) && !finish && !with_usage && (r->sent_role || !r->chat)) {
        /* the chunk of nearly every token: written directly (a step makes
         * one per generating request; cJSON's tree would cost more than the
         * rest of the host work).  Same bytes as the cJSON path below. */
        char head[512];
        snprintf(head, sizeof head,
                 "data: {\"id\":\"%s\",\"object\":\"%s\",\"created\":%ld,\"model\":\"%s\","
                 "\"choices\":[{\"index\":0,%s",
                 r->id, r->chat ? "chat.completion.chunk" : "text_completion", r->created,
                 s->served_name,
                 !r->chat    ? "\"text\":"
                 : !text     ? "\"delta\":{"
                 : reasoning ? "\"delta\":{\"reasoning_content\":"
                             : "\"delta\":{\"content\":");
        srv_buf_str(&r->pending, head);
        if (text)
            json_string(&r->pending, text, n);
        srv_buf_str(&r->pending, r->chat ? "},\"logprobs\":" : ",\"logprobs\":");
        srv_buf_str(&r->pending, logprobs ? logprobs : "null");
        srv_buf_str(&r->pending, ",\"finish_reason\":null}]}\n\n");
        r->stream_off += text ? n : 0;
        return;
    }
    cJSON *c = chunk_base(s, r);
    cJSON *choices = cJSON_AddArrayToObject(c, "choices");
    cJSON *ch = cJSON_CreateObject();
    cJSON_AddItemToArray(choices, ch);
    cJSON_AddNumberToObject(ch, "index", 0);
    if (r->chat) {
        cJSON *d = cJSON_AddObjectToObject(ch, "delta");
        if (!r->sent_role) {
            cJSON_AddStringToObject(d, "role", "assistant");
            r->sent_role = 1;
        }
        if (text)
            add_clean_string(d, reasoning ? "reasoning_content" : "content", text, n);
    } else {
        add_clean_string(ch, "text", text ? text : "", text ? n : 0);
    }
    if (logprobs)
        cJSON_AddRawToObject(ch, "logprobs", logprobs);
    else
        cJSON_AddNullToObject(ch, "logprobs");
    if (finish)
        cJSON_AddStringToObject(ch, "finish_reason", finish);
    else
        cJSON_AddNullToObject(ch, "finish_reason");
    if (with_usage)
        cJSON_AddItemToObject(c, "usage", usage_json(r));
    sse(r, c);
    r->stream_off += text ? n : 0;
}

/* Stopper output buffer, grown on demand, and the streamed token's
 * logprobs text (scheduler thread only). */
static char *tbuf;
static size_t tbuf_cap;
static srv_buf lpbuf;

static int grow(size_t need)
{
    if (need <= tbuf_cap)
        return 0;
    char *p = realloc(tbuf, need);
    if (!p)
        return -1;
    tbuf = p;
    tbuf_cap = need;
    return 0;
}

static dsq_status push_text(srv_req *r, int32_t t, size_t *len, int *stopped)
{
    if (grow(4096))
        return DSQ_ERR_OUT_OF_MEMORY;
    dsq_status st = dsq_stopper_push(r->stopper, t, tbuf, tbuf_cap, len, stopped);
    if (st == DSQ_ERR_BUFFER_TOO_SMALL) {
        if (grow(*len + 1))
            return DSQ_ERR_OUT_OF_MEMORY;
        st = dsq_stopper_push(r->stopper, t, tbuf, tbuf_cap, len, stopped);
    }
    return st;
}

static dsq_status flush_text(srv_req *r, size_t *len)
{
    if (grow(4096))
        return DSQ_ERR_OUT_OF_MEMORY;
    dsq_status st = dsq_stopper_flush(r->stopper, tbuf, tbuf_cap, len);
    if (st == DSQ_ERR_BUFFER_TOO_SMALL) {
        if (grow(*len + 1))
            return DSQ_ERR_OUT_OF_MEMORY;
        st = dsq_stopper_flush(r->stopper, tbuf, tbuf_cap, len);
    }
    return st;
}

/* Text that came out of the stopper: to the stream or the reply so far. */
static void emit(srv *s, srv_req *r, const char *text, size_t n, const char *logprobs)
{
    int reasoning = r->split_reasoning && r->in_think;
    if (!reasoning && r->skip_ws) {
        while (n > 0 && (*text == '\n' || *text == ' ' || *text == '\r' || *text == '\t')) {
            text++;
            n--;
        }
        if (n > 0)
            r->skip_ws = 0;
    }
    if (r->stream) {
        if (n > 0 || logprobs)
            stream_chunk(s, r, n > 0 || !r->chat ? text : NULL, n, reasoning, logprobs, NULL, 0);
        return;
    }
    srv_buf_add(reasoning ? &r->reasoning : &r->content, text, n);
}

const char *srv_out_token(srv *s, srv_req *r, const dsq_step_out *o)
{
    r->n_gen++;
    if (r->n_gen == 1 && r->chat && r->stream && !r->sent_role)
        stream_chunk(s, r, "", 0, 0, NULL, NULL, 0); /* role first, as OpenAI */
    if (r->n_gen == 1 && r->chat && !r->split_reasoning) {
        /* inline reasoning: the template's "<think>\n" is part of the reply */
        const char *open = "<think>\n";
        emit(s, r, open, strlen(open), NULL);
    }
    /* streaming: the token's logprobs object as text, written directly;
     * whole replies: cJSON, kept for the final body */
    const char *lpj = NULL;
    if (r->logprobs && r->stream) {
        stream_logprobs_json(s, r, o, &lpbuf);
        if (srv_buf_add(&lpbuf, "", 1) == 0) /* NUL-terminated */
            lpj = lpbuf.p;
    }
    cJSON *lp = NULL;
    if (r->logprobs && !r->stream) {
        if (r->chat) {
            cJSON *x = cJSON_CreateObject();
            cJSON *arr = cJSON_AddArrayToObject(x, "content");
            cJSON_AddItemToArray(arr, chat_logprob(s, r, o));
            lp = x;
        } else {
            lp = cmpl_logprobs_new();
            cmpl_logprobs_add(s, r, lp, o, r->content.len);
        }
    }
    if (lp) { /* kept for the final body */
        if (!r->lp_all)
            r->lp_all = r->chat ? cJSON_CreateArray() : cmpl_logprobs_new();
        cJSON *all = r->lp_all;
        if (r->chat) {
            cJSON *e = cJSON_DetachItemFromArray(cJSON_GetObjectItem(lp, "content"), 0);
            cJSON_AddItemToArray(all, e);
        } else {
            const char *keys[] = { "tokens", "token_logprobs", "top_logprobs", "text_offset" };
            for (int k = 0; k < 4; k++)
                cJSON_AddItemToArray(cJSON_GetObjectItem(all, keys[k]),
                                     cJSON_DetachItemFromArray(cJSON_GetObjectItem(lp, keys[k]), 0));
        }
        cJSON_Delete(lp);
        lp = NULL;
    }

    size_t len = 0;
    int stopped = 0;
    if (r->split_reasoning && r->in_think && o->token == s->think_close) {
        /* the thought ends: what the stopper holds belongs to it */
        if (flush_text(r, &len) == DSQ_OK && len)
            emit(s, r, tbuf, len, NULL);
        r->in_think = 0;
        r->skip_ws = 1;
        if (lpj) /* the </think> token's own log-prob, with no text */
            stream_chunk(s, r, r->chat ? NULL : "", 0, 0, lpj, NULL, 0);
        return NULL;
    }
    if (push_text(r, o->token, &len, &stopped) != DSQ_OK)
        len = 0;
    emit(s, r, tbuf ? tbuf : "", len, lpj);
    return stopped ? "stop" : NULL;
}

void srv_out_finish(srv *s, srv_req *r, const char *reason, int http_status, const char *err_msg)
{
    r->http_status = http_status;
    if (http_status >= 400) {
        char *e = srv_error_json(err_msg, http_status >= 500 ? "server_error"
                                                             : "invalid_request_error",
                                 NULL, NULL);
        if (r->stream) {
            srv_buf_str(&r->pending, "data: ");
            srv_buf_str(&r->pending, e ? e : "{}");
            srv_buf_str(&r->pending, "\n\ndata: [DONE]\n\n");
        } else {
            srv_buf_str(&r->pending, e ? e : "{}");
        }
        free(e);
        return;
    }
    if (strcmp(reason, "length") == 0) { /* max_tokens: what the stopper holds is text */
        size_t len = 0;
        if (flush_text(r, &len) == DSQ_OK && len)
            emit(s, r, tbuf, len, NULL);
    }
    if (r->stream) {
        stream_chunk(s, r, r->chat ? NULL : "", 0, 0, NULL, reason, !r->include_usage);
        if (r->include_usage) {
            cJSON *c = chunk_base(s, r);
            cJSON_AddArrayToObject(c, "choices");
            cJSON_AddItemToObject(c, "usage", usage_json(r));
            sse(r, c);
        }
        srv_buf_str(&r->pending, "data: [DONE]\n\n");
        return;
    }
    cJSON *c = chunk_base(s, r);
    cJSON_ReplaceItemInObject(c, "object",
                              cJSON_CreateString(r->chat ? "chat.completion" : "text_completion"));
    cJSON *choices = cJSON_AddArrayToObject(c, "choices");
    cJSON *ch = cJSON_CreateObject();
    cJSON_AddItemToArray(choices, ch);
    cJSON_AddNumberToObject(ch, "index", 0);
    if (r->chat) {
        cJSON *m = cJSON_AddObjectToObject(ch, "message");
        cJSON_AddStringToObject(m, "role", "assistant");
        add_clean_string(m, "content", r->content.p ? r->content.p : "", r->content.len);
        if (r->split_reasoning)
            add_clean_string(m, "reasoning_content", r->reasoning.p ? r->reasoning.p : "",
                             r->reasoning.len);
    } else {
        add_clean_string(ch, "text", r->content.p ? r->content.p : "", r->content.len);
    }
    if (r->lp_all) {
        if (r->chat) {
            cJSON *x = cJSON_AddObjectToObject(ch, "logprobs");
            cJSON_AddItemToObject(x, "content", (cJSON *)r->lp_all);
        } else {
            cJSON_AddItemToObject(ch, "logprobs", (cJSON *)r->lp_all);
        }
        r->lp_all = NULL;
    } else {
        cJSON_AddNullToObject(ch, "logprobs");
    }
    cJSON_AddStringToObject(ch, "finish_reason", reason);
    cJSON_AddItemToObject(c, "usage", usage_json(r));
    char *js = cJSON_PrintUnformatted(c);
    cJSON_Delete(c);
    if (js) {
        srv_buf_str(&r->pending, js);
        free(js);
    } else {
        r->http_status = 500;
    }
}

void srv_out_cleanup(void)
{
    free(tbuf);
    tbuf = NULL;
    tbuf_cap = 0;
    srv_buf_free(&lpbuf);
}

/* ---- Prometheus text --------------------------------------------------------- */

static void hist_text(srv_buf *b, const char *name, const char *help, const srv_hist *h)
{
    char line[256];
    snprintf(line, sizeof line, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    srv_buf_str(b, line);
    uint64_t cum = 0;
    for (int i = 0; i <= h->n; i++) {
        cum += h->count[i];
        if (i < h->n)
            snprintf(line, sizeof line, "%s_bucket{le=\"%g\"} %llu\n", name, h->le[i],
                     (unsigned long long)cum);
        else
            snprintf(line, sizeof line, "%s_bucket{le=\"+Inf\"} %llu\n", name,
                     (unsigned long long)cum);
        srv_buf_str(b, line);
    }
    snprintf(line, sizeof line, "%s_sum %.6f\n%s_count %llu\n", name, h->sum, name,
             (unsigned long long)h->total);
    srv_buf_str(b, line);
}

static void metric(srv_buf *b, const char *name, const char *type, const char *help,
                   const char *labels, double v)
{
    char line[512];
    if (help) {
        snprintf(line, sizeof line, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
        srv_buf_str(b, line);
    }
    snprintf(line, sizeof line, "%s%s %.17g\n", name, labels ? labels : "", v);
    srv_buf_str(b, line);
}

char *srv_metrics_text(srv *s)
{
    srv_buf b = { 0 };
    const srv_metrics *m = &s->m;
    metric(&b, "dsqwen_requests_total", "counter",
           "Completion requests finished, by outcome (ok, client_error, rejected = 429, "
           "server_error, cancelled = client went away).",
           "{outcome=\"ok\"}", (double)m->requests_ok);
    metric(&b, "dsqwen_requests_total", NULL, NULL, "{outcome=\"client_error\"}",
           (double)m->requests_4xx);
    metric(&b, "dsqwen_requests_total", NULL, NULL, "{outcome=\"rejected\"}",
           (double)m->requests_429);
    metric(&b, "dsqwen_requests_total", NULL, NULL, "{outcome=\"server_error\"}",
           (double)m->requests_5xx);
    metric(&b, "dsqwen_requests_total", NULL, NULL, "{outcome=\"cancelled\"}",
           (double)m->cancelled);
    metric(&b, "dsqwen_prompt_tokens_total", "counter", "Prompt tokens of admitted requests.",
           NULL, (double)m->prompt_tokens);
    metric(&b, "dsqwen_prefix_cache_hit_tokens_total", "counter",
           "Prompt tokens taken from the prefix cache instead of being prefilled.", NULL,
           (double)m->prefix_hit_tokens);
    metric(&b, "dsqwen_prefix_cache_evictions_total", "counter",
           "Cached prefixes dropped to make room.", NULL, (double)m->prefix_evictions);
    metric(&b, "dsqwen_generation_tokens_total", "counter", "Tokens generated.", NULL,
           (double)m->gen_tokens);
    metric(&b, "dsqwen_steps_total", "counter", "dsq_step calls.", NULL, (double)m->steps);
    metric(&b, "dsqwen_mixed_steps_total", "counter",
           "Steps that ran prompt chunks beside decode tokens.", NULL, (double)m->mixed_steps);
    metric(&b, "dsqwen_prefill_tokens_total", "counter",
           "Prompt tokens run through the model (not taken from the prefix cache).", NULL,
           (double)m->prefill_tokens);
    metric(&b, "dsqwen_queue_length", "gauge", "Requests waiting for a sequence or KV room.",
           NULL, (double)s->n_waiting);
    metric(&b, "dsqwen_active_requests", "gauge", "Requests holding a sequence.", NULL,
           (double)s->n_active);
    metric(&b, "dsqwen_batch_size", "gauge", "Sequences in the latest step.", NULL,
           (double)m->last_batch);
    metric(&b, "dsqwen_batch_tokens", "gauge", "Tokens in the latest step.", NULL,
           (double)m->last_batch_tokens);
    metric(&b, "dsqwen_kv_capacity_tokens", "gauge", "Tokens the paged KV pool holds.", NULL,
           (double)m->kv_capacity_tokens);
    metric(&b, "dsqwen_kv_used_tokens", "gauge",
           "Tokens of the KV pool in use (active requests and cached prefixes).", NULL,
           (double)(m->kv_capacity_tokens - m->kv_free_tokens));
    metric(&b, "dsqwen_kv_usage_ratio", "gauge", "Used fraction of the KV pool.", NULL,
           m->kv_capacity_tokens > 0
               ? (double)(m->kv_capacity_tokens - m->kv_free_tokens) / (double)m->kv_capacity_tokens
               : 0.0);
    metric(&b, "dsqwen_kv_reserved_tokens", "gauge",
           "Tokens of the KV pool promised to admitted requests and cached prefixes.", NULL,
           (double)m->kv_reserved_tokens);
    metric(&b, "dsqwen_sequences", "gauge", "Sequences held in the context (cached prefixes too).",
           NULL, (double)m->active_seqs);
    int entries = 0;
    for (int i = 0; s->prefix && i < s->o.prefix_slots; i++)
        entries += s->prefix[i].seq >= 0;
    metric(&b, "dsqwen_prefix_cache_entries", "gauge", "Cached prefixes.", NULL, (double)entries);
    hist_text(&b, "dsqwen_time_to_first_token_seconds",
              "From the request's arrival to its first token.", &m->ttft);
    hist_text(&b, "dsqwen_inter_token_latency_seconds", "Between a request's successive tokens.",
              &m->itl);
    hist_text(&b, "dsqwen_batch_size_steps", "Sequences per dsq_step call.", &m->batch);
    hist_text(&b, "dsqwen_step_seconds", "Wall time inside each dsq_step call.", &m->step);
    hist_text(&b, "dsqwen_host_seconds",
              "Scheduler work per step outside dsq_step (admission, output formatting, locking).", &m->host);
    return b.p;
}
