/* json_strict.c - see json_strict.h. */
#include "json_strict.h"

#include <stdlib.h>
#include <string.h>

size_t dsq_json_nul_offset(const char *text, size_t len)
{
    int in_str = 0, esc = 0;
    for (size_t i = 0; i < len; i++) {
        char c = text[i];
        if (c == '\0')
            return i;
        if (!in_str) {
            in_str = (c == '"');
            continue;
        }
        if (esc) {
            esc = 0;
            if (c == 'u' && len - i > 4 && memcmp(text + i + 1, "0000", 4) == 0)
                return i - 1; /* the backslash */
        } else if (c == '\\') {
            esc = 1;
        } else if (c == '"') {
            in_str = 0;
        }
    }
    return len;
}

/* Members of one object, ordered by key then by position, so the second of
 * two equal keys is the later one in the file. */
typedef struct key_ref {
    const char *key;
    size_t pos;
    const cJSON *item;
} key_ref;

static int key_ref_cmp(const void *a, const void *b)
{
    const key_ref *x = a, *y = b;
    int c = strcmp(x->key, y->key);
    if (c != 0)
        return c;
    return x->pos < y->pos ? -1 : x->pos > y->pos;
}

static const cJSON *object_duplicate(const cJSON *obj, int *oom)
{
    size_t n = 0;
    for (const cJSON *c = obj->child; c; c = c->next)
        n++;
    if (n < 2)
        return NULL;
    key_ref *refs = malloc(n * sizeof *refs);
    if (!refs) {
        *oom = 1;
        return NULL;
    }
    size_t i = 0;
    for (const cJSON *c = obj->child; c; c = c->next, i++) {
        refs[i].key = c->string ? c->string : "";
        refs[i].pos = i;
        refs[i].item = c;
    }
    qsort(refs, n, sizeof *refs, key_ref_cmp);
    /* the duplicate that comes first in the file */
    const cJSON *dup = NULL;
    size_t dup_pos = n;
    for (i = 1; i < n; i++)
        if (strcmp(refs[i - 1].key, refs[i].key) == 0 && refs[i].pos < dup_pos) {
            dup = refs[i].item;
            dup_pos = refs[i].pos;
        }
    free(refs);
    return dup;
}

const cJSON *dsq_json_duplicate_key(const cJSON *node, int *oom)
{
    *oom = 0;
    /* Depth-first without recursion: cJSON allows 1000 levels of nesting,
     * and the walk follows child/next links with an explicit parent path. */
    const cJSON *stack[CJSON_NESTING_LIMIT + 2];
    int depth = 0;
    const cJSON *cur = node;
    while (cur) {
        if (cJSON_IsObject(cur)) {
            const cJSON *d = object_duplicate(cur, oom);
            if (d || *oom)
                return d;
        }
        if ((cJSON_IsObject(cur) || cJSON_IsArray(cur)) && cur->child &&
            depth < (int)(sizeof stack / sizeof stack[0])) {
            stack[depth++] = cur;
            cur = cur->child;
            continue;
        }
        while (cur && cur != node && !cur->next)
            cur = depth > 0 ? stack[--depth] : NULL;
        if (!cur || cur == node)
            break;
        cur = cur->next;
    }
    return NULL;
}
