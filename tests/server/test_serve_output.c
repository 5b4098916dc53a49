/* test_serve_output.c - the server's reply text without a model: the R1
 * reasoning split at </think> (reasoning_content / content, streamed and
 * not), --reasoning-inline, a stop string after the thought, and the SSE
 * framing.  The ids come from tokenizing known text with the real
 * tokenizer (tests/data/model), so the expected strings are the text itself,
 * not values produced by the code under test. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve.h"

static srv S;
static dsq_tokenizer *tok;

static int setup(void **state)
{
    (void)state;
    const char *dir = getenv("DSQ_TEST_DATA");
    char path[4096];
    snprintf(path, sizeof path, "%s/model", dir ? dir : DSQ_TEST_DATA);
    if (dsq_tokenizer_load(path, &tok) != DSQ_OK)
        return -1;
    S.tok = tok;
    S.eos = dsq_tokenizer_eos(tok);
    S.think_close = dsq_tokenizer_token_id(tok, "</think>");
    snprintf(S.served_name, sizeof S.served_name, "test-model");
    return S.think_close >= 0 ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    srv_out_cleanup();
    dsq_tokenizer_free(tok);
    return 0;
}

static srv_req *make_req(int stream, int split, const char *stop)
{
    srv_req *r = calloc(1, sizeof *r);
    assert_non_null(r);
    pthread_cond_init(&r->cv, NULL);
    r->chat = 1;
    r->stream = stream;
    r->split_reasoning = split;
    r->in_think = split;
    r->seq = -1;
    r->prefix_entry = -1;
    r->n_prompt = 7;
    r->max_tokens = 1000;
    snprintf(r->id, sizeof r->id, "chatcmpl-test");
    if (stop) {
        r->stops = calloc(1, sizeof *r->stops);
        r->stops[0] = strdup(stop);
        r->n_stops = 1;
    }
    assert_int_equal(dsq_stopper_new(tok, (const char *const *)r->stops, r->n_stops, 1,
                                     &r->stopper),
                     DSQ_OK);
    return r;
}

/* Push the ids of `text` as if sampled; returns the finish reason the
 * output code reported ("stop") or NULL, and the number of ids pushed. */
static const char *feed(srv_req *r, const char *text, int *n_pushed)
{
    int32_t ids[256];
    size_t n = 0;
    assert_int_equal(dsq_tokenize(tok, text, strlen(text), 0, ids, 256, &n), DSQ_OK);
    for (size_t i = 0; i < n; i++) {
        dsq_step_out o;
        memset(&o, 0, sizeof o);
        o.token = ids[i];
        const char *reason = srv_out_token(&S, r, &o);
        if (reason) {
            *n_pushed = (int)i + 1;
            return reason;
        }
    }
    *n_pushed = (int)n;
    return NULL;
}

static cJSON *body_message(srv_req *r)
{
    cJSON *js = cJSON_Parse(r->pending.p);
    assert_non_null(js);
    return js;
}

static void test_split_nonstream(void **state)
{
    (void)state;
    srv_req *r = make_req(0, 1, NULL);
    int n;
    assert_null(feed(r, "Let me think.</think>\n\nHello there.", &n));
    srv_out_finish(&S, r, "length", 200, NULL);
    cJSON *js = body_message(r);
    cJSON *m = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(js, "choices"), 0),
                                   "message");
    assert_string_equal(cJSON_GetObjectItem(m, "reasoning_content")->valuestring, "Let me think.");
    assert_string_equal(cJSON_GetObjectItem(m, "content")->valuestring, "Hello there.");
    assert_string_equal(cJSON_GetObjectItem(js, "object")->valuestring, "chat.completion");
    cJSON *u = cJSON_GetObjectItem(js, "usage");
    assert_int_equal(cJSON_GetObjectItem(u, "completion_tokens")->valueint, n);
    assert_int_equal(cJSON_GetObjectItem(u, "total_tokens")->valueint, n + 7);
    cJSON_Delete(js);
    srv_req_free(r);
}

/* Join the deltas of the SSE in r->pending. */
static void collect_stream(srv_req *r, srv_buf *content, srv_buf *reasoning, int *saw_role,
                           int *saw_done, char *finish, size_t finish_cap)
{
    char *p = r->pending.p;
    *saw_role = *saw_done = 0;
    finish[0] = '\0';
    int first = 1;
    while (p && *p) {
        assert_memory_equal(p, "data: ", 6);
        char *end = strstr(p, "\n\n");
        assert_non_null(end);
        *end = '\0';
        const char *payload = p + 6;
        if (!strcmp(payload, "[DONE]")) {
            *saw_done = 1;
            assert_string_equal(end + 2, ""); /* nothing after [DONE] */
            break;
        }
        cJSON *c = cJSON_Parse(payload);
        assert_non_null(c);
        assert_string_equal(cJSON_GetObjectItem(c, "object")->valuestring,
                            "chat.completion.chunk");
        cJSON *ch = cJSON_GetArrayItem(cJSON_GetObjectItem(c, "choices"), 0);
        if (ch) {
            cJSON *d = cJSON_GetObjectItem(ch, "delta");
            cJSON *role = cJSON_GetObjectItem(d, "role");
            if (role) {
                assert_true(first); /* the role comes in the first chunk only */
                *saw_role = 1;
            }
            cJSON *x = cJSON_GetObjectItem(d, "content");
            if (x)
                srv_buf_str(content, x->valuestring);
            x = cJSON_GetObjectItem(d, "reasoning_content");
            if (x)
                srv_buf_str(reasoning, x->valuestring);
            x = cJSON_GetObjectItem(ch, "finish_reason");
            if (cJSON_IsString(x))
                snprintf(finish, finish_cap, "%s", x->valuestring);
        }
        first = 0;
        cJSON_Delete(c);
        p = end + 2;
    }
}

static void test_split_stream(void **state)
{
    (void)state;
    srv_req *r = make_req(1, 1, NULL);
    int n;
    assert_null(feed(r, "Step one, step two.</think>\n\nThe answer is 4.", &n));
    srv_out_finish(&S, r, "length", 200, NULL);
    srv_buf content = { 0 }, reasoning = { 0 };
    int role, done;
    char finish[32];
    collect_stream(r, &content, &reasoning, &role, &done, finish, sizeof finish);
    assert_true(role && done);
    assert_string_equal(reasoning.p, "Step one, step two.");
    assert_string_equal(content.p, "The answer is 4.");
    assert_string_equal(finish, "length");
    srv_buf_free(&content);
    srv_buf_free(&reasoning);
    srv_req_free(r);
}

static void test_inline(void **state)
{
    (void)state;
    srv_req *r = make_req(0, 0, NULL);
    int n;
    assert_null(feed(r, "Hmm.</think>\n\nYes.", &n));
    srv_out_finish(&S, r, "stop", 200, NULL);
    cJSON *js = body_message(r);
    cJSON *m = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(js, "choices"), 0),
                                   "message");
    assert_string_equal(cJSON_GetObjectItem(m, "content")->valuestring,
                        "<think>\nHmm.</think>\n\nYes.");
    assert_null(cJSON_GetObjectItem(m, "reasoning_content"));
    cJSON_Delete(js);
    srv_req_free(r);
}

/* A stop string in the answer ends the reply; the thought is kept whole. */
static void test_stop_after_thought(void **state)
{
    (void)state;
    srv_req *r = make_req(1, 1, "STOP");
    int n;
    const char *reason = feed(r, "Plan: say hi.</think>\n\nHi there STOP and more text", &n);
    assert_non_null(reason);
    assert_string_equal(reason, "stop");
    srv_out_finish(&S, r, reason, 200, NULL);
    srv_buf content = { 0 }, reasoning = { 0 };
    int role, done;
    char finish[32];
    collect_stream(r, &content, &reasoning, &role, &done, finish, sizeof finish);
    assert_true(done);
    assert_string_equal(reasoning.p, "Plan: say hi.");
    assert_string_equal(content.p, "Hi there ");
    assert_string_equal(finish, "stop");
    srv_buf_free(&content);
    srv_buf_free(&reasoning);
    srv_req_free(r);
}

/* Characters JSON escapes, and multi-byte UTF-8, survive the streamed
 * chunks (written without cJSON) byte for byte. */
static void test_stream_escapes(void **state)
{
    (void)state;
    const char *text = "q\"uote b\\ack tab\t nl\n cr\r ctl\x01\x1f e\xc3\xa9 \xe4\xb8\xad "
                       "\xf0\x9f\x98\x80 </ end";
    srv_req *r = make_req(1, 0, NULL);
    r->chat = 0; /* completions: no <think> prefix, text as is */
    int n;
    assert_null(feed(r, text, &n));
    srv_out_finish(&S, r, "length", 200, NULL);
    srv_buf got = { 0 };
    char *p = r->pending.p;
    while (p && (p = strstr(p, "data: {"))) {
        char *end = strstr(p, "\n\n");
        *end = '\0';
        cJSON *c = cJSON_Parse(p + 6);
        assert_non_null(c);
        cJSON *t = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(c, "choices"), 0),
                                       "text");
        if (cJSON_IsString(t))
            srv_buf_str(&got, t->valuestring);
        cJSON_Delete(c);
        p = end + 2;
    }
    assert_string_equal(got.p, text);
    srv_buf_free(&got);
    srv_req_free(r);
}

/* An error after the stream began: an error event, then [DONE]. */
static void test_stream_error(void **state)
{
    (void)state;
    srv_req *r = make_req(1, 1, NULL);
    int n;
    feed(r, "abc", &n);
    srv_out_finish(&S, r, NULL, 503, "the server is shutting down");
    const char *p = strstr(r->pending.p, "data: {\"error\":");
    assert_non_null(p);
    assert_non_null(strstr(p, "shutting down"));
    const char *done = "data: [DONE]\n\n";
    size_t len = strlen(r->pending.p);
    assert_string_equal(r->pending.p + len - strlen(done), done);
    srv_req_free(r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_split_nonstream), cmocka_unit_test(test_split_stream),
        cmocka_unit_test(test_inline),          cmocka_unit_test(test_stop_after_thought),
        cmocka_unit_test(test_stream_error),    cmocka_unit_test(test_stream_escapes),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
