/* test_chat.c - dsq_chat_format against renderings of the model's Jinja chat
 * template (tests/data/chat_vectors.json, made by tests/make_chat_vectors.py
 * with jinja2), plus its error contract. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "testutil.h"

static cJSON *load_vectors(void)
{
    char *path = dsq_test_path("chat_vectors.json");
    char *text = dsq_test_read(path, NULL);
    free(path);
    assert_non_null(text);
    cJSON *root = cJSON_Parse(text);
    free(text);
    assert_non_null(root);
    return root;
}

static int32_t role_of(const char *r)
{
    if (strcmp(r, "system") == 0)
        return DSQ_ROLE_SYSTEM;
    if (strcmp(r, "user") == 0)
        return DSQ_ROLE_USER;
    if (strcmp(r, "assistant") == 0)
        return DSQ_ROLE_ASSISTANT;
    fail_msg("unknown role '%s' in chat_vectors.json", r);
    return -1;
}

/* Every case rendered by the reference template must come out byte-exact,
 * through both the length query and the real call. */
static void test_vectors(void **state)
{
    (void)state;
    cJSON *root = load_vectors();
    cJSON *cases = cJSON_GetObjectItem(root, "cases");
    assert_true(cJSON_IsArray(cases));
    int n_cases = 0;
    cJSON *c;
    cJSON_ArrayForEach(c, cases) {
        const char *name = cJSON_GetObjectItem(c, "name")->valuestring;
        const char *expected = cJSON_GetObjectItem(c, "expected")->valuestring;
        int gen = cJSON_IsTrue(cJSON_GetObjectItem(c, "add_generation_prompt"));
        cJSON *msgs = cJSON_GetObjectItem(c, "messages");
        size_t n = (size_t)cJSON_GetArraySize(msgs);
        dsq_chat_message *m = calloc(n ? n : 1, sizeof *m);
        assert_non_null(m);
        for (size_t i = 0; i < n; i++) {
            cJSON *mi = cJSON_GetArrayItem(msgs, (int)i);
            m[i].role = role_of(cJSON_GetObjectItem(mi, "role")->valuestring);
            m[i].content = cJSON_GetObjectItem(mi, "content")->valuestring;
        }
        size_t len = 12345;
        dsq_status st = dsq_chat_format(m, n, gen, NULL, 0, &len);
        assert_int_equal(st, DSQ_ERR_BUFFER_TOO_SMALL);
        assert_int_equal(len, strlen(expected));
        char *buf = malloc(len + 1);
        assert_non_null(buf);
        memset(buf, 'X', len + 1);
        size_t len2 = 0;
        st = dsq_chat_format(m, n, gen, buf, len + 1, &len2);
        if (st != DSQ_OK || len2 != len || strcmp(buf, expected) != 0)
            fail_msg("case %s: got '%s' (status %d), expected '%s'", name, buf, (int)st, expected);
        printf("  chat case %-28s ok (%zu bytes)\n", name, len);
        free(buf);
        free(m);
        n_cases++;
    }
    assert_true(n_cases >= 10);
    cJSON_Delete(root);
}

/* Messages and expected text of the named case (messages point into root). */
static const char *get_case(cJSON *root, const char *want, dsq_chat_message *m, size_t cap,
                            size_t *n, int *gen)
{
    cJSON *c;
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(root, "cases")) {
        if (strcmp(cJSON_GetObjectItem(c, "name")->valuestring, want) != 0)
            continue;
        cJSON *msgs = cJSON_GetObjectItem(c, "messages");
        *n = (size_t)cJSON_GetArraySize(msgs);
        assert_true(*n <= cap);
        for (size_t i = 0; i < *n; i++) {
            cJSON *mi = cJSON_GetArrayItem(msgs, (int)i);
            m[i].role = role_of(cJSON_GetObjectItem(mi, "role")->valuestring);
            m[i].content = cJSON_GetObjectItem(mi, "content")->valuestring;
        }
        *gen = cJSON_IsTrue(cJSON_GetObjectItem(c, "add_generation_prompt"));
        return cJSON_GetObjectItem(c, "expected")->valuestring;
    }
    fail_msg("case %s missing from chat_vectors.json", want);
    return NULL;
}

static void test_buffer_too_small(void **state)
{
    (void)state;
    cJSON *root = load_vectors();
    dsq_chat_message msgs[8];
    size_t n = 0;
    int gen = 0;
    const char *expected = get_case(root, "system_user_gen", msgs, 8, &n, &gen);
    size_t need = strlen(expected), len = 0;
    char buf[256];
    assert_true(need + 1 <= sizeof buf);
    /* exactly the text but no room for the NUL: too small, length reported */
    memset(buf, 'Z', sizeof buf);
    assert_int_equal(dsq_chat_format(msgs, n, gen, buf, need, &len), DSQ_ERR_BUFFER_TOO_SMALL);
    assert_int_equal(len, need);
    assert_int_equal(buf[0], '\0'); /* no partial text left behind */
    assert_true(strlen(dsq_last_error_message()) > 0);
    assert_int_equal(dsq_chat_format(msgs, n, gen, buf, 5, &len), DSQ_ERR_BUFFER_TOO_SMALL);
    assert_int_equal(len, need);
    /* one more byte fits */
    assert_int_equal(dsq_chat_format(msgs, n, gen, buf, need + 1, &len), DSQ_OK);
    assert_int_equal(len, need);
    assert_string_equal(buf, expected);
    cJSON_Delete(root);
}

static void test_invalid(void **state)
{
    (void)state;
    char buf[128];
    size_t len = 0;
    dsq_chat_message bad_role = { 7, "x" };
    dsq_chat_message null_content = { DSQ_ROLE_USER, NULL };
    dsq_chat_message ok = { DSQ_ROLE_USER, "x" };
    assert_int_equal(dsq_chat_format(&bad_role, 1, 1, buf, sizeof buf, &len), DSQ_ERR_INVALID_ARG);
    assert_non_null(strstr(dsq_last_error_message(), "role"));
    assert_int_equal(dsq_chat_format(&null_content, 1, 1, buf, sizeof buf, &len),
                     DSQ_ERR_INVALID_ARG);
    assert_int_equal(dsq_chat_format(NULL, 1, 1, buf, sizeof buf, &len), DSQ_ERR_INVALID_ARG);
    assert_int_equal(dsq_chat_format(&ok, 1, 1, NULL, sizeof buf, &len), DSQ_ERR_INVALID_ARG);
    assert_int_equal(dsq_chat_format(&ok, 1, 1, buf, sizeof buf, NULL), DSQ_ERR_INVALID_ARG);
    /* zero messages (msgs may then be NULL) renders like the template does */
    cJSON *root = load_vectors();
    dsq_chat_message m[1];
    size_t n = 1;
    int gen = 1;
    const char *expected = get_case(root, "empty_nogen", m, 1, &n, &gen);
    assert_int_equal(n, 0);
    assert_int_equal(dsq_chat_format(NULL, 0, gen, buf, sizeof buf, &len), DSQ_OK);
    assert_string_equal(buf, expected);
    cJSON_Delete(root);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_vectors),
        cmocka_unit_test(test_buffer_too_small),
        cmocka_unit_test(test_invalid),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
