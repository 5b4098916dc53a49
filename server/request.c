/* request.c - an OpenAI request body -> a tokenized srv_req.
 *
 * Runs on the connection's HTTP thread (never on the scheduler).  Fields
 * this server does not know are ignored; a known field of the wrong type or
 * out of range is refused with 400 and an OpenAI error object naming it.
 * JSON null means "the default", as in the OpenAI API. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "serve.h"

char *srv_error_json(const char *message, const char *type, const char *param,
                     const char *code)
{
    cJSON *root = cJSON_CreateObject();
    cJSON *e = cJSON_AddObjectToObject(root, "error");
    cJSON_AddStringToObject(e, "message", message);
    cJSON_AddStringToObject(e, "type", type);
    if (param)
        cJSON_AddStringToObject(e, "param", param);
    else
        cJSON_AddNullToObject(e, "param");
    if (code)
        cJSON_AddStringToObject(e, "code", code);
    else
        cJSON_AddNullToObject(e, "code");
    char *s = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return s;
}

void srv_req_free(srv_req *r)
{
    if (!r)
        return;
    free(r->prompt);
    for (size_t i = 0; i < r->n_stops; i++)
        free(r->stops[i]);
    free(r->stops);
    dsq_stopper_free(r->stopper);
    srv_buf_free(&r->content);
    srv_buf_free(&r->reasoning);
    srv_buf_free(&r->pending);
    srv_buf_free(&r->out);
    cJSON_Delete((cJSON *)r->lp_all);
    pthread_cond_destroy(&r->cv);
    free(r);
}

/* A parse failure: status 400 and the message, with the field named. */
typedef struct perr {
    char msg[512];
    const char *param;
    const char *code;
    int status;
} perr;

static int fail(perr *e, const char *param, const char *code, const char *fmt, const char *a)
{
    snprintf(e->msg, sizeof e->msg, fmt, a ? a : "");
    e->param = param;
    e->code = code;
    e->status = 400;
    return -1;
}

/* Field present and not null. */
static const cJSON *field(const cJSON *root, const char *name)
{
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(root, name);
    return f && !cJSON_IsNull(f) ? f : NULL;
}

static int get_bool(const cJSON *root, const char *name, int *out, perr *e)
{
    const cJSON *f = field(root, name);
    if (!f)
        return 0;
    if (!cJSON_IsBool(f))
        return fail(e, name, "invalid_type", "'%s' must be a boolean", name);
    *out = cJSON_IsTrue(f);
    return 0;
}

static int get_num(const cJSON *root, const char *name, double lo, double hi, double *out,
                   int *given, perr *e)
{
    const cJSON *f = field(root, name);
    if (!f)
        return 0;
    if (!cJSON_IsNumber(f) || !isfinite(f->valuedouble))
        return fail(e, name, "invalid_type", "'%s' must be a number", name);
    if (f->valuedouble < lo || f->valuedouble > hi) {
        char m[160];
        snprintf(m, sizeof m, "'%%s' must be in [%g, %g]", lo, hi);
        return fail(e, name, "invalid_value", m, name);
    }
    *out = f->valuedouble;
    if (given)
        *given = 1;
    return 0;
}

static int get_int(const cJSON *root, const char *name, double lo, double hi, int64_t *out,
                   int *given, perr *e)
{
    const cJSON *f = field(root, name);
    if (!f)
        return 0;
    if (!cJSON_IsNumber(f) || f->valuedouble != floor(f->valuedouble) || !isfinite(f->valuedouble))
        return fail(e, name, "invalid_type", "'%s' must be an integer", name);
    if (f->valuedouble < lo || f->valuedouble > hi) {
        char m[160];
        snprintf(m, sizeof m, "'%%s' must be in [%.0f, %.0f]", lo, hi);
        return fail(e, name, "invalid_value", m, name);
    }
    *out = (int64_t)f->valuedouble;
    if (given)
        *given = 1;
    return 0;
}

/* messages[].content: a string, or an array of {"type":"text","text":...}
 * parts (joined). */
static char *message_text(const cJSON *c, perr *e)
{
    if (cJSON_IsString(c))
        return strdup(c->valuestring);
    if (!cJSON_IsArray(c)) {
        fail(e, "messages", "invalid_type",
             "message 'content' must be a string or an array of text parts%s", NULL);
        return NULL;
    }
    srv_buf b = { 0 };
    const cJSON *part;
    cJSON_ArrayForEach(part, c)
    {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(part, "type");
        const cJSON *text = cJSON_GetObjectItemCaseSensitive(part, "text");
        if (!cJSON_IsObject(part) || !cJSON_IsString(type) || strcmp(type->valuestring, "text") ||
            !cJSON_IsString(text)) {
            srv_buf_free(&b);
            fail(e, "messages", "invalid_value",
                 "only text content parts ({\"type\":\"text\",\"text\":...}) are supported%s",
                 NULL);
            return NULL;
        }
        if (srv_buf_str(&b, text->valuestring)) {
            srv_buf_free(&b);
            return NULL;
        }
    }
    return b.p ? b.p : strdup("");
}

/* Render messages with the model's chat template (generation prompt opens
 * <think>); returns malloc'ed text. */
static char *render_chat(const cJSON *msgs, perr *e)
{
    if (!cJSON_IsArray(msgs))
        return fail(e, "messages", "invalid_type", "'messages' must be an array%s", NULL), NULL;
    int n = cJSON_GetArraySize(msgs);
    if (n == 0)
        return fail(e, "messages", "invalid_value", "'messages' is empty%s", NULL), NULL;
    dsq_chat_message *cm = calloc((size_t)n, sizeof *cm);
    char **texts = calloc((size_t)n, sizeof *texts);
    char *out = NULL;
    if (!cm || !texts)
        goto done;
    int i = 0;
    const cJSON *m;
    cJSON_ArrayForEach(m, msgs)
    {
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(m, "content");
        if (!cJSON_IsObject(m) || !cJSON_IsString(role)) {
            fail(e, "messages", "invalid_type", "each message needs a string 'role'%s", NULL);
            goto done;
        }
        const char *rn = role->valuestring;
        if (!strcmp(rn, "system") || !strcmp(rn, "developer"))
            cm[i].role = DSQ_ROLE_SYSTEM;
        else if (!strcmp(rn, "user"))
            cm[i].role = DSQ_ROLE_USER;
        else if (!strcmp(rn, "assistant"))
            cm[i].role = DSQ_ROLE_ASSISTANT;
        else {
            fail(e, "messages", "invalid_value",
                 "unsupported message role '%.100s' (system, developer, user, assistant)", rn);
            goto done;
        }
        if (!content || cJSON_IsNull(content))
            texts[i] = strdup("");
        else if (!(texts[i] = message_text(content, e)))
            goto done;
        if (!texts[i])
            goto done;
        cm[i].content = texts[i];
        i++;
    }
    size_t len = 0;
    dsq_status st = dsq_chat_format(cm, (size_t)n, 1, NULL, 0, &len);
    if (st != DSQ_OK && st != DSQ_ERR_BUFFER_TOO_SMALL) {
        fail(e, "messages", "invalid_value", "cannot format the messages: %s",
             dsq_last_error_message());
        goto done;
    }
    if (!(out = malloc(len + 1)))
        goto done;
    if (dsq_chat_format(cm, (size_t)n, 1, out, len + 1, &len) != DSQ_OK) {
        free(out);
        out = NULL;
        fail(e, "messages", "invalid_value", "cannot format the messages: %s",
             dsq_last_error_message());
    }
done:
    if (texts)
        for (int k = 0; k < n; k++)
            free(texts[k]);
    free(texts);
    free(cm);
    return out;
}

static int tokenize(srv *s, const char *text, uint32_t flags, int32_t **ids, int32_t *n, perr *e)
{
    size_t len = strlen(text), need = 0;
    size_t cap = len + 8;
    int32_t *v = malloc(cap * sizeof *v);
    if (!v)
        return -1;
    dsq_status st = dsq_tokenize(s->tok, text, len, flags, v, cap, &need);
    if (st == DSQ_ERR_BUFFER_TOO_SMALL) {
        int32_t *w = realloc(v, need * sizeof *v);
        if (!w) {
            free(v);
            return -1;
        }
        v = w;
        st = dsq_tokenize(s->tok, text, len, flags, v, need, &need);
    }
    if (st != DSQ_OK) {
        free(v);
        return fail(e, "prompt", "invalid_value", "cannot tokenize the prompt: %s",
                    dsq_last_error_message());
    }
    *ids = v;
    *n = (int32_t)need;
    return 0;
}

/* /v1/completions "prompt": a string, a list of one string, or token ids. */
static int completion_prompt(srv *s, const cJSON *p, int32_t **ids, int32_t *n, perr *e)
{
    if (!p)
        return fail(e, "prompt", "missing_field", "'prompt' is required%s", NULL);
    if (cJSON_IsString(p))
        return tokenize(s, p->valuestring, DSQ_TOKENIZE_ADD_SPECIAL, ids, n, e);
    if (!cJSON_IsArray(p))
        return fail(e, "prompt", "invalid_type",
                    "'prompt' must be a string, a list of one string or a list of token ids%s",
                    NULL);
    int k = cJSON_GetArraySize(p);
    if (k == 1 && cJSON_IsString(cJSON_GetArrayItem(p, 0)))
        return tokenize(s, cJSON_GetArrayItem(p, 0)->valuestring, DSQ_TOKENIZE_ADD_SPECIAL, ids,
                        n, e);
    if (k == 0)
        return fail(e, "prompt", "invalid_value", "'prompt' is empty%s", NULL);
    int32_t *v = malloc((size_t)k * sizeof *v);
    if (!v)
        return -1;
    int i = 0;
    const cJSON *t;
    cJSON_ArrayForEach(t, p)
    {
        if (!cJSON_IsNumber(t) || t->valuedouble != floor(t->valuedouble) || t->valuedouble < 0 ||
            t->valuedouble >= s->n_vocab) {
            free(v);
            return fail(e, "prompt", "invalid_value",
                        "'prompt' must be one string or a list of token ids in range (one "
                        "prompt per request)%s", NULL);
        }
        v[i++] = (int32_t)t->valuedouble;
    }
    *ids = v;
    *n = k;
    return 0;
}

static int parse_stop(const cJSON *root, srv_req *r, perr *e)
{
    const cJSON *f = field(root, "stop");
    if (!f)
        return 0;
    int k = cJSON_IsString(f) ? 1 : cJSON_IsArray(f) ? cJSON_GetArraySize(f) : -1;
    if (k < 0)
        return fail(e, "stop", "invalid_type", "'stop' must be a string or a list of strings%s",
                    NULL);
    if (k > 16)
        return fail(e, "stop", "invalid_value", "at most 16 stop strings%s", NULL);
    if (k == 0)
        return 0;
    if (!(r->stops = calloc((size_t)k, sizeof *r->stops)))
        return -1;
    const cJSON *one = cJSON_IsString(f) ? f : NULL;
    for (int i = 0; i < k; i++) {
        const cJSON *x = one ? one : cJSON_GetArrayItem(f, i);
        if (!cJSON_IsString(x))
            return fail(e, "stop", "invalid_type", "'stop' must be a string or a list of strings%s",
                        NULL);
        if (!x->valuestring[0])
            continue; /* an empty stop string matches nothing useful: ignored */
        if (strlen(x->valuestring) > 256)
            return fail(e, "stop", "invalid_value", "a stop string is longer than 256 bytes%s",
                        NULL);
        if (!(r->stops[r->n_stops] = strdup(x->valuestring)))
            return -1;
        r->n_stops++;
    }
    return 0;
}

static int parse_fields(srv *s, const cJSON *root, int chat, srv_req *r, perr *e)
{
    const cJSON *model = field(root, "model");
    if (model && !cJSON_IsString(model))
        return fail(e, "model", "invalid_type", "'model' must be a string%s", NULL);

    int64_t n = 1;
    if (get_int(root, "n", 1, 1e9, &n, NULL, e))
        return -1;
    if (n != 1)
        return fail(e, "n", "invalid_value", "only n = 1 is supported%s", NULL);
    int64_t best_of = 1;
    if (get_int(root, "best_of", 1, 1e9, &best_of, NULL, e))
        return -1;
    if (best_of != 1)
        return fail(e, "best_of", "invalid_value", "only best_of = 1 is supported%s", NULL);
    int echo = 0;
    if (get_bool(root, "echo", &echo, e))
        return -1;
    if (echo)
        return fail(e, "echo", "invalid_value", "echo is not supported%s", NULL);

    if (get_bool(root, "stream", &r->stream, e))
        return -1;
    if (get_bool(root, "ignore_eos", &r->ignore_eos, e))
        return -1;
    const cJSON *so = field(root, "stream_options");
    if (so) {
        if (!cJSON_IsObject(so))
            return fail(e, "stream_options", "invalid_type", "'stream_options' must be an object%s",
                        NULL);
        if (get_bool(so, "include_usage", &r->include_usage, e))
            return -1;
    }

    /* sampling: the model's generation_config.json, then the request */
    dsq_sample_params *sp = &r->sp;
    *sp = s->sp_default;
    double v;
    int64_t iv;
    int given = 0;
    v = sp->temperature;
    if (get_num(root, "temperature", 0, 100, &v, NULL, e))
        return -1;
    sp->temperature = (float)v;
    v = sp->top_p;
    if (get_num(root, "top_p", 0, 1, &v, NULL, e))
        return -1;
    if (v <= 0)
        return fail(e, "top_p", "invalid_value", "'top_p' must be in (0, 1]%s", NULL);
    sp->top_p = (float)v;
    iv = sp->top_k;
    if (get_int(root, "top_k", -1, 1e9, &iv, NULL, e))
        return -1;
    sp->top_k = iv < 0 ? 0 : (int32_t)iv; /* -1: off, as in vLLM */
    v = sp->min_p;
    if (get_num(root, "min_p", 0, 1, &v, NULL, e))
        return -1;
    sp->min_p = (float)v;
    v = sp->presence_penalty;
    if (get_num(root, "presence_penalty", -2, 2, &v, NULL, e))
        return -1;
    sp->presence_penalty = (float)v;
    v = sp->frequency_penalty;
    if (get_num(root, "frequency_penalty", -2, 2, &v, NULL, e))
        return -1;
    sp->frequency_penalty = (float)v;
    v = sp->repetition_penalty;
    if (get_num(root, "repetition_penalty", 1e-3, 100, &v, NULL, e))
        return -1;
    sp->repetition_penalty = (float)v;
    int64_t seed = 0;
    if (get_int(root, "seed", -9.2e18, 9.2e18, &seed, &given, e))
        return -1;
    if (given)
        sp->seed = (uint64_t)seed;
    else /* a fresh seed per request, as OpenAI does without one */
        sp->seed = ((uint64_t)time(NULL) << 20) ^ (r->num * 0x9E3779B97F4A7C15ull);

    /* max_completion_tokens wins over the older max_tokens */
    int64_t mt = -1;
    if (get_int(root, "max_tokens", 1, 1e9, &mt, NULL, e))
        return -1;
    if (get_int(root, "max_completion_tokens", 1, 1e9, &mt, NULL, e))
        return -1;
    r->max_tokens = mt < 0 ? INT32_MAX : (int32_t)mt;

    if (chat) {
        if (get_bool(root, "logprobs", &r->logprobs, e))
            return -1;
        int64_t tn = 0;
        given = 0;
        if (get_int(root, "top_logprobs", 0, DSQ_STEP_MAX_TOP_N, &tn, &given, e))
            return -1;
        if (given && tn > 0 && !r->logprobs)
            return fail(e, "top_logprobs", "invalid_value",
                        "'top_logprobs' needs 'logprobs': true%s", NULL);
        r->top_n = (int32_t)tn;
    } else {
        int64_t lp = -1;
        const cJSON *f = field(root, "logprobs");
        if (f && cJSON_IsBool(f)) /* some clients send true/false here too */
            lp = cJSON_IsTrue(f) ? 0 : -1;
        else if (get_int(root, "logprobs", 0, DSQ_STEP_MAX_TOP_N, &lp, NULL, e))
            return -1;
        r->logprobs = lp >= 0;
        r->top_n = lp > 0 ? (int32_t)lp : 0;
    }
    return parse_stop(root, r, e);
}

/* A U+0000 in a JSON string (the escape \u0000, or a raw NUL byte): cJSON
 * decodes it into a C string, which ends there, so the text after it would
 * be dropped without a word ("a\u0000b" read as "a", a role
 * "user\u0000x" as "user").  Backslashes occur only inside strings, and the
 * character after one is skipped, so "\\u0000" (an escaped backslash) is
 * not taken for one. */
static int has_nul(const char *body, size_t len)
{
    for (size_t i = 0; i < len; i++) {
        if (body[i] == '\0')
            return 1;
        if (body[i] == '\\') {
            if (i + 5 < len && body[i + 1] == 'u' && !memcmp(body + i + 2, "0000", 4))
                return 1;
            i++;
        }
    }
    return 0;
}

int srv_parse_request(srv *s, const char *body, size_t len, int chat, srv_req **out,
                      char **err_json)
{
    *out = NULL;
    *err_json = NULL;
    perr e = { .status = 400 };
    srv_req *r = calloc(1, sizeof *r);
    if (!r)
        goto oom;
    pthread_cond_init(&r->cv, NULL);
    r->seq = -1;
    r->prefix_entry = -1;
    r->chat = chat;
    r->created = (long)time(NULL);
    r->t_arrive = srv_now();
    pthread_mutex_lock(&s->mu);
    r->num = ++s->next_num;
    pthread_mutex_unlock(&s->mu);
    snprintf(r->id, sizeof r->id, "%s-%lx%06llx", chat ? "chatcmpl" : "cmpl", (long)s->started,
             (unsigned long long)r->num);

    if (has_nul(body, len)) {
        fail(&e, NULL, "invalid_value",
             "the request body has a U+0000 character (\\u0000 or a NUL byte); it is not "
             "supported%s", NULL);
        goto bad;
    }
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(body, len, &end, 0);
    while (root && end && end < body + len &&
           (*end == ' ' || *end == '\t' || *end == '\r' || *end == '\n'))
        end++;
    if (!root || (end && end < body + len)) { /* trailing bytes after the value too */
        cJSON_Delete(root);
        fail(&e, NULL, "invalid_json", "the request body is not valid JSON%s", NULL);
        goto bad;
    }
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        fail(&e, NULL, "invalid_type", "the request body must be a JSON object%s", NULL);
        goto bad;
    }
    int rc = parse_fields(s, root, chat, r, &e);
    if (rc == 0 && !s->tok)
        rc = fail(&e, NULL, "no_tokenizer", "the model has no tokenizer.json%s", NULL);
    if (rc == 0) {
        if (chat) {
            const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(root, "messages");
            char *text = NULL;
            if (!msgs)
                rc = fail(&e, "messages", "missing_field", "'messages' is required%s", NULL);
            else if (!(text = render_chat(msgs, &e)))
                rc = -1;
            else {
                rc = tokenize(s, text, 0, &r->prompt, &r->n_prompt, &e);
                free(text);
            }
            r->split_reasoning = !s->o.reasoning_inline;
            r->in_think = r->split_reasoning;
        } else {
            rc = completion_prompt(s, field(root, "prompt"), &r->prompt, &r->n_prompt, &e);
        }
    }
    cJSON_Delete(root);
    if (rc != 0) {
        if (e.msg[0])
            goto bad;
        goto oom;
    }
    if (r->n_prompt < 1) {
        fail(&e, "prompt", "invalid_value", "the prompt is empty%s", NULL);
        goto bad;
    }
    if (r->n_prompt + 1 > s->max_context) {
        snprintf(e.msg, sizeof e.msg,
                 "This model's maximum context length is %d tokens. However, your prompt has %d "
                 "tokens (and at least 1 must be generated). Please shorten your prompt.",
                 (int)s->max_context, (int)r->n_prompt);
        e.param = chat ? "messages" : "prompt";
        e.code = "context_length_exceeded";
        goto bad;
    }
    if (r->max_tokens > s->max_context - r->n_prompt)
        r->max_tokens = s->max_context - r->n_prompt;
    if (dsq_stopper_new(s->tok, (const char *const *)r->stops, r->n_stops, !r->ignore_eos, &r->stopper) !=
        DSQ_OK)
        goto oom;
    *out = r;
    return 0;

bad:
    *err_json = srv_error_json(e.msg, "invalid_request_error", e.param, e.code);
    srv_req_free(r);
    return e.status;
oom:
    *err_json = srv_error_json("out of memory", "server_error", NULL, NULL);
    srv_req_free(r);
    return 500;
}
