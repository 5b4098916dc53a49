/*
 * test_safetensors.c - the safetensors reader: round trips of valid single
 * and sharded files, and refusal (exact status, message naming the rule,
 * no crash, no leak under valgrind) of malformed ones.
 */
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "st_writer.h"

static char *tmp; /* per-test scratch directory */

static int setup(void **state)
{
    (void)state;
    tmp = stw_mkdtemp();
    return tmp ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    stw_rmtree(tmp);
    free(tmp);
    tmp = NULL;
    return 0;
}

/* Open `path` expecting `want`; the message must contain `needle` and the
 * set pointer must come back NULL. */
static void expect_open_fails(const char *path, int is_dir, dsq_status want, const char *needle)
{
    dsq_st_set *set = (dsq_st_set *)(uintptr_t)1; /* must be overwritten */
    dsq_status st = is_dir ? dsq_st_open_dir(path, &set) : dsq_st_open_file(path, &set);
    const char *msg = dsq_last_error_message();
    printf("    -> %s | %s\n", dsq_status_string(st), msg);
    assert_int_equal(st, want);
    assert_null(set);
    assert_non_null(strstr(msg, needle));
}

/* ---- valid files ---------------------------------------------------------- */

static void check_tensor(dsq_st_set *set, const stw_tensor *t, const uint8_t *data,
                         size_t off, dsq_dtype dt)
{
    const dsq_st_entry *e = dsq_st_find(set, t->name);
    assert_non_null(e);
    assert_string_equal(e->name, t->name);
    assert_string_equal(e->dtype_str, t->dtype);
    assert_int_equal(e->t.dtype, dt);
    assert_int_equal(e->t.ndim, t->ndim);
    for (int d = 0; d < t->ndim; d++)
        assert_int_equal(e->t.shape[d], t->shape[d]);
    assert_int_equal(e->t.nbytes, stw_nbytes(t));
    if (e->t.nbytes)
        assert_memory_equal(e->t.data, data + off, e->t.nbytes);
    /* the typed view: aligned, same bytes (a copy only where misaligned) */
    const void *mapped = e->t.data;
    dsq_tensor tv;
    assert_int_equal(dsq_st_tensor(set, e, 0, &tv), DSQ_OK);
    size_t es = dsq_dtype_size(dt);
    if (es && tv.nbytes)
        assert_int_equal((uintptr_t)tv.data % es, 0);
    if (!es || (uintptr_t)mapped % es == 0)
        assert_ptr_equal(tv.data, mapped);
    if (tv.nbytes)
        assert_memory_equal(tv.data, data + off, tv.nbytes);
    assert_int_equal(tv.nbytes, e->t.nbytes);
}

static const stw_tensor round_trip_tensors[] = {
    { "model.embed_tokens.weight", "BF16", 2, { 7, 5 } },
    { "a.f32", "F32", 3, { 2, 3, 1 } },
    { "b.odd_bf16", "BF16", 1, { 3 } }, /* leaves the next tensor 2 mod 4 */
    { "c.f32_after_odd", "F32", 1, { 4 } },
    { "d.i64", "I64", 2, { 1, 2 } },
    { "e.empty", "F16", 2, { 0, 9 } },
    { "f.scalar", "F16", 0, { 0 } },
    { "g.u8", "U8", 1, { 5 } },
};
static const dsq_dtype round_trip_dt[] = { DSQ_DT_BF16, DSQ_DT_F32, DSQ_DT_BF16, DSQ_DT_F32,
                                           DSQ_DT_OTHER, DSQ_DT_F16, DSQ_DT_F16, DSQ_DT_OTHER };

static void round_trip(size_t align)
{
    const int n = (int)(sizeof round_trip_tensors / sizeof round_trip_tensors[0]);
    char *path = stw_path(tmp, "rt.safetensors");
    size_t dlen, off[16];
    uint8_t *data = stw_write_tensors(path, round_trip_tensors, n,
                                      "\"__metadata__\":{\"format\":\"pt\",\"x\":\"y\"}", align,
                                      &dlen, off);
    assert_non_null(data);
    dsq_st_set *set = NULL;
    dsq_status st = dsq_st_open_file(path, &set);
    if (st != DSQ_OK)
        printf("    %s\n", dsq_last_error_message());
    assert_int_equal(st, DSQ_OK);
    assert_int_equal(dsq_st_count(set), n);
    for (int i = 0; i < n; i++)
        check_tensor(set, &round_trip_tensors[i], data, off[i], round_trip_dt[i]);
    /* dsq_st_at walks every entry once, in name order */
    for (int i = 0; i < n; i++) {
        const dsq_st_entry *e = dsq_st_at(set, i);
        assert_non_null(e);
        assert_ptr_equal(dsq_st_find(set, e->name), e);
        assert_int_equal(e->file, 0);
        if (i)
            assert_true(strcmp(dsq_st_at(set, i - 1)->name, e->name) < 0);
    }
    assert_null(dsq_st_at(set, n));
    assert_null(dsq_st_at(set, -1));
    assert_null(dsq_st_find(set, "nope"));
    assert_null(dsq_st_find(set, "a.f3"));
    assert_null(dsq_st_find(set, "model.embed_tokens.weight.x"));
    dsq_st_close(set);
    free(data);
    free(path);
}

static void test_round_trip_aligned(void **state)
{
    (void)state;
    round_trip(8);
}

/* Header length not a multiple of 8: data is legal but misaligned in the
 * mapping; the reader must still hand out aligned, equal bytes. */
static void test_round_trip_unaligned(void **state)
{
    (void)state;
    round_trip(1);
}

static void test_empty_header_ok(void **state)
{
    (void)state;
    char *p = stw_path(tmp, "e.safetensors");
    assert_int_equal(stw_write(p, "{}", NULL, 0, 8), 0);
    dsq_st_set *set = NULL;
    assert_int_equal(dsq_st_open_file(p, &set), DSQ_OK);
    assert_int_equal(dsq_st_count(set), 0);
    assert_null(dsq_st_find(set, "x"));
    dsq_st_close(set);
    free(p);
}

static void test_dir_prefers_single_file(void **state)
{
    (void)state;
    stw_tensor t = { "only", "F32", 1, { 3 } };
    char *p = stw_path(tmp, "model.safetensors");
    size_t dlen;
    uint8_t *data = stw_write_tensors(p, &t, 1, NULL, 8, &dlen, NULL);
    assert_non_null(data);
    /* a broken index beside it must not be read */
    char *ix = stw_path(tmp, "model.safetensors.index.json");
    assert_int_equal(stw_write_bytes(ix, "garbage", 7), 0);
    dsq_st_set *set = NULL;
    assert_int_equal(dsq_st_open_dir(tmp, &set), DSQ_OK);
    assert_int_equal(dsq_st_count(set), 1);
    assert_memory_equal(dsq_st_find(set, "only")->t.data, data, 12);
    dsq_st_close(set);
    free(data);
    free(p);
    free(ix);
}

/* Two shards + index; tensors of shard 2 come first alphabetically. */
static const stw_tensor shard1[] = {
    { "z.w1", "BF16", 2, { 4, 3 } },
    { "m.w2", "F32", 1, { 5 } },
};
static const stw_tensor shard2[] = {
    { "a.w3", "F16", 2, { 2, 2 } },
    { "b.w4", "BF16", 1, { 6 } },
    { "c.w5", "I32", 1, { 1 } },
};

/* Write both shards and an index whose weight_map is `wmap` (JSON object
 * body), or the matching one if NULL. */
static void write_sharded(const char *wmap, uint8_t **d1, uint8_t **d2, size_t *o1, size_t *o2)
{
    size_t l1, l2;
    char *p1 = stw_path(tmp, "model-00001-of-00002.safetensors");
    char *p2 = stw_path(tmp, "model-00002-of-00002.safetensors");
    *d1 = stw_write_tensors(p1, shard1, 2, NULL, 8, &l1, o1);
    *d2 = stw_write_tensors(p2, shard2, 3, NULL, 8, &l2, o2);
    assert_non_null(*d1);
    assert_non_null(*d2);
    const char *good = "\"z.w1\":\"model-00001-of-00002.safetensors\","
                       "\"m.w2\":\"model-00001-of-00002.safetensors\","
                       "\"a.w3\":\"model-00002-of-00002.safetensors\","
                       "\"b.w4\":\"model-00002-of-00002.safetensors\","
                       "\"c.w5\":\"model-00002-of-00002.safetensors\"";
    char ix[2048];
    snprintf(ix, sizeof ix, "{\"metadata\":{\"total_size\":100},\"weight_map\":{%s}}",
             wmap ? wmap : good);
    char *pi = stw_path(tmp, "model.safetensors.index.json");
    assert_int_equal(stw_write_bytes(pi, ix, strlen(ix)), 0);
    free(p1);
    free(p2);
    free(pi);
}

static void test_sharded_round_trip(void **state)
{
    (void)state;
    uint8_t *d1, *d2;
    size_t o1[2], o2[3];
    write_sharded(NULL, &d1, &d2, o1, o2);
    dsq_st_set *set = NULL;
    dsq_status st = dsq_st_open_dir(tmp, &set);
    if (st != DSQ_OK)
        printf("    %s\n", dsq_last_error_message());
    assert_int_equal(st, DSQ_OK);
    assert_int_equal(dsq_st_count(set), 5);
    check_tensor(set, &shard1[0], d1, o1[0], DSQ_DT_BF16);
    check_tensor(set, &shard1[1], d1, o1[1], DSQ_DT_F32);
    check_tensor(set, &shard2[0], d2, o2[0], DSQ_DT_F16);
    check_tensor(set, &shard2[1], d2, o2[1], DSQ_DT_BF16);
    check_tensor(set, &shard2[2], d2, o2[2], DSQ_DT_OTHER);
    /* each shard opened once: the two tensors of a shard share a file index */
    assert_int_equal(dsq_st_find(set, "z.w1")->file, dsq_st_find(set, "m.w2")->file);
    assert_int_equal(dsq_st_find(set, "a.w3")->file, dsq_st_find(set, "c.w5")->file);
    assert_int_not_equal(dsq_st_find(set, "a.w3")->file, dsq_st_find(set, "z.w1")->file);
    dsq_st_close(set);
    free(d1);
    free(d2);
}

/* ---- malformed single files ---------------------------------------------- */

typedef struct bad_case {
    const char *label;
    const char *header;  /* written padded to 8 with its true length declared */
    size_t data_len;     /* bytes of data section */
    dsq_status want;
    const char *needle;  /* must appear in the error message */
} bad_case;

#define T1 "\"t\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}"

static const bad_case bad_cases[] = {
    { "non-JSON header", "{this is not json}", 0, DSQ_ERR_FORMAT, "JSON" },
    { "JSON array instead of object", "[1,2,3]", 0, DSQ_ERR_FORMAT, "not a JSON object" },
    { "JSON string instead of object", "\"abc\"", 0, DSQ_ERR_FORMAT, "not a JSON object" },
    { "header not starting with {", " {}", 0, DSQ_ERR_FORMAT, "start with" },
    { "non-UTF-8 header", "{\"t\xff\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8,
      DSQ_ERR_FORMAT, "UTF-8" },
    { "overlong UTF-8", "{\"t\xc0\xaf\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8,
      DSQ_ERR_FORMAT, "UTF-8" },
    { "UTF-8 surrogate", "{\"t\xed\xa0\x80\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}",
      8, DSQ_ERR_FORMAT, "UTF-8" },
    { "raw control char in name", "{\"t\x01\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}",
      8, DSQ_ERR_FORMAT, "control character" },
    { "trailing garbage after object", "{" T1 "} x", 8, DSQ_ERR_FORMAT, "after the JSON" },
    { "entry not an object", "{\"t\":[1,2]}", 0, DSQ_ERR_FORMAT, "'t'" },
    { "missing dtype", "{\"t\":{\"shape\":[2],\"data_offsets\":[0,8]}}", 8, DSQ_ERR_FORMAT,
      "missing \"dtype\"" },
    { "missing shape", "{\"t\":{\"dtype\":\"F32\",\"data_offsets\":[0,8]}}", 8, DSQ_ERR_FORMAT,
      "missing \"shape\"" },
    { "missing data_offsets", "{\"t\":{\"dtype\":\"F32\",\"shape\":[2]}}", 8, DSQ_ERR_FORMAT,
      "missing \"data_offsets\"" },
    { "unknown dtype", "{\"t\":{\"dtype\":\"F12\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8,
      DSQ_ERR_FORMAT, "unknown dtype \"F12\"" },
    { "lowercase dtype", "{\"t\":{\"dtype\":\"f32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8,
      DSQ_ERR_FORMAT, "unknown dtype" },
    { "dtype not a string", "{\"t\":{\"dtype\":4,\"shape\":[2],\"data_offsets\":[0,8]}}", 8,
      DSQ_ERR_FORMAT, "not a string" },
    { "unknown field", "{\"t\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8],\"x\":1}}", 8,
      DSQ_ERR_FORMAT, "unknown field 'x'" },
    { "field twice", "{\"t\":{\"dtype\":\"F32\",\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}",
      8, DSQ_ERR_FORMAT, "twice" },
    { "shape not an array", "{\"t\":{\"dtype\":\"F32\",\"shape\":2,\"data_offsets\":[0,8]}}", 8,
      DSQ_ERR_FORMAT, "not an array" },
    { "negative shape", "{\"t\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", 8,
      DSQ_ERR_FORMAT, "shape[0]" },
    { "float shape", "{\"t\":{\"dtype\":\"F32\",\"shape\":[2.5],\"data_offsets\":[0,10]}}", 10,
      DSQ_ERR_FORMAT, "shape[0]" },
    { "integral float literal in shape", "{\"t\":{\"dtype\":\"F32\",\"shape\":[2.0],\"data_offsets\":[0,8]}}",
      8, DSQ_ERR_FORMAT, "integer literal" },
    { "exponent literal in offsets", "{\"t\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8e0]}}",
      8, DSQ_ERR_FORMAT, "integer literal" },
    { "string in shape", "{\"t\":{\"dtype\":\"F32\",\"shape\":[\"2\"],\"data_offsets\":[0,8]}}", 8,
      DSQ_ERR_FORMAT, "shape[0]" },
    { "too many dims",
      "{\"t\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,1]}}", 1,
      DSQ_ERR_FORMAT, "dimensions" },
    { "element count overflow",
      "{\"t\":{\"dtype\":\"U8\",\"shape\":[4294967296,4294967296,4294967296],\"data_offsets\":[0,8]}}",
      8, DSQ_ERR_FORMAT, "overflow" },
    { "shape entry above 2^53",
      "{\"t\":{\"dtype\":\"U8\",\"shape\":[18014398509481984,0],\"data_offsets\":[0,0]}}", 0,
      DSQ_ERR_FORMAT, "shape[0]" },
    { "data_offsets one entry", "{\"t\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8]}}", 8,
      DSQ_ERR_FORMAT, "[begin, end]" },
    { "data_offsets three entries",
      "{\"t\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8,8]}}", 8, DSQ_ERR_FORMAT,
      "[begin, end]" },
    { "data_offsets negative", "{\"t\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[-1,-1]}}", 0,
      DSQ_ERR_FORMAT, "non-negative" },
    { "data_offsets begin > end", "{\"t\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[8,0]}}", 8,
      DSQ_ERR_FORMAT, "begin 8 > end 0" },
    { "offsets past data section", "{\"t\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 4,
      DSQ_ERR_FORMAT, "past the data section" },
    { "size mismatch shape*dtype != end-begin",
      "{\"t\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8, DSQ_ERR_FORMAT,
      "data_offsets span 8 bytes" },
    { "overlapping offsets",
      "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
      "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
      12, DSQ_ERR_FORMAT, "overlaps" },
    { "identical offsets",
      "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
      "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}",
      8, DSQ_ERR_FORMAT, "overlaps" },
    { "gap between tensors",
      "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
      "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[12,20]}}",
      20, DSQ_ERR_FORMAT, "hole" },
    { "hole at the start", "{\"t\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 12,
      DSQ_ERR_FORMAT, "hole" },
    { "trailing unused bytes", "{" T1 "}", 12, DSQ_ERR_FORMAT, "trailing" },
    { "duplicate tensor name", "{" T1 "," T1 "}", 8, DSQ_ERR_FORMAT, "duplicate tensor name 't'" },
    { "__metadata__ non-string value", "{\"__metadata__\":{\"format\":\"pt\",\"n\":3}," T1 "}", 8,
      DSQ_ERR_FORMAT, "__metadata__" },
    { "__metadata__ not an object", "{\"__metadata__\":\"pt\"," T1 "}", 8, DSQ_ERR_FORMAT,
      "__metadata__" },
    { "__metadata__ twice", "{\"__metadata__\":{},\"__metadata__\":{}," T1 "}", 8, DSQ_ERR_FORMAT,
      "twice" },
    { "leading zero number", "{\"t\":{\"dtype\":\"F32\",\"shape\":[02],\"data_offsets\":[0,8]}}", 8,
      DSQ_ERR_FORMAT, "leading zero" },
    { "truncated JSON", "{\"t\":{\"dtype\":\"F32\",\"shape\":[2],\"data_off", 8, DSQ_ERR_FORMAT,
      "JSON" },
};
#define N_BAD (sizeof bad_cases / sizeof bad_cases[0])

static void test_bad_header(void **state)
{
    const bad_case *c = *state;
    char *p = stw_path(tmp, "bad.safetensors");
    assert_int_equal(stw_write(p, c->header, NULL, c->data_len, 8), 0);
    printf("    case: %s\n", c->label);
    expect_open_fails(p, 0, c->want, c->needle);
    /* every message names the file */
    assert_non_null(strstr(dsq_last_error_message(), "bad.safetensors"));
    free(p);
}

static void test_empty_file(void **state)
{
    (void)state;
    char *p = stw_path(tmp, "empty.safetensors");
    assert_int_equal(stw_write_bytes(p, "", 0), 0);
    expect_open_fails(p, 0, DSQ_ERR_FORMAT, "8-byte header length");
    free(p);
}

static void test_seven_byte_file(void **state)
{
    (void)state;
    char *p = stw_path(tmp, "seven.safetensors");
    assert_int_equal(stw_write_bytes(p, "\x02\0\0\0\0\0\0", 7), 0);
    expect_open_fails(p, 0, DSQ_ERR_FORMAT, "is 7 bytes");
    free(p);
}

static void test_header_len_past_eof(void **state)
{
    (void)state;
    char *p = stw_path(tmp, "past.safetensors");
    assert_int_equal(stw_write_raw(p, 64, "{}", 2, NULL, 0), 0);
    expect_open_fails(p, 0, DSQ_ERR_FORMAT, "past the end of the file");
    free(p);
}

static void test_header_len_huge(void **state)
{
    (void)state;
    char *p = stw_path(tmp, "huge.safetensors");
    assert_int_equal(stw_write_raw(p, UINT64_MAX - 7, "{}", 2, NULL, 0), 0);
    expect_open_fails(p, 0, DSQ_ERR_FORMAT, "limit");
    /* just over the limit, file big enough not to matter */
    assert_int_equal(stw_write_raw(p, 100000001ull, "{}", 2, NULL, 0), 0);
    expect_open_fails(p, 0, DSQ_ERR_FORMAT, "limit");
    free(p);
}

static void test_header_len_zero(void **state)
{
    (void)state;
    char *p = stw_path(tmp, "zero.safetensors");
    assert_int_equal(stw_write_raw(p, 0, "", 0, NULL, 8), 0);
    expect_open_fails(p, 0, DSQ_ERR_FORMAT, "start with");
    free(p);
}

static void test_nul_in_header(void **state)
{
    (void)state;
    char *p = stw_path(tmp, "nul.safetensors");
    /* cJSON would treat the NUL as whitespace; JSON does not allow it */
    assert_int_equal(stw_write_raw(p, 4, "{\0}\x20", 4, NULL, 0), 0);
    expect_open_fails(p, 0, DSQ_ERR_FORMAT, "control character");
    free(p);
}

static void test_missing_file(void **state)
{
    (void)state;
    char *p = stw_path(tmp, "absent.safetensors");
    expect_open_fails(p, 0, DSQ_ERR_IO, "absent.safetensors");
    expect_open_fails(tmp, 0, DSQ_ERR_IO, "not a regular file");
    free(p);
}

static void test_dir_without_model(void **state)
{
    (void)state;
    expect_open_fails(tmp, 1, DSQ_ERR_IO, "neither model.safetensors nor");
    char *p = stw_path(tmp, "nodir");
    expect_open_fails(p, 1, DSQ_ERR_IO, "not a directory");
    free(p);
}

static void test_null_args(void **state)
{
    (void)state;
    dsq_st_set *set = NULL;
    assert_int_equal(dsq_st_open_file(NULL, &set), DSQ_ERR_INVALID_ARG);
    assert_int_equal(dsq_st_open_file("x", NULL), DSQ_ERR_INVALID_ARG);
    assert_int_equal(dsq_st_open_dir(NULL, &set), DSQ_ERR_INVALID_ARG);
    assert_null(dsq_st_find(NULL, "x"));
    assert_int_equal(dsq_st_count(NULL), 0);
    assert_null(dsq_st_at(NULL, 0));
    dsq_st_close(NULL);
}

/* ---- malformed shard sets ---------------------------------------------------- */

static void sharded_fails(const char *wmap, dsq_status want, const char *needle)
{
    uint8_t *d1, *d2;
    size_t o1[2], o2[3];
    write_sharded(wmap, &d1, &d2, o1, o2);
    expect_open_fails(tmp, 1, want, needle);
    free(d1);
    free(d2);
}

#define S1 "\"model-00001-of-00002.safetensors\""
#define S2 "\"model-00002-of-00002.safetensors\""
#define REST2 "\"a.w3\":" S2 ",\"b.w4\":" S2 ",\"c.w5\":" S2

static void test_index_missing_shard(void **state)
{
    (void)state;
    sharded_fails("\"z.w1\":" S1 ",\"m.w2\":\"model-00009-of-00009.safetensors\"," REST2,
                  DSQ_ERR_IO, "model-00009-of-00009.safetensors");
}

static void test_index_tensor_absent_from_shard(void **state)
{
    (void)state;
    sharded_fails("\"z.w1\":" S1 ",\"m.w2\":" S1 ",\"ghost\":" S1 "," REST2, DSQ_ERR_FORMAT,
                  "'ghost' is not in its shard");
}

static void test_index_tensor_in_wrong_shard(void **state)
{
    (void)state;
    sharded_fails("\"z.w1\":" S1 ",\"m.w2\":" S2 "," REST2, DSQ_ERR_FORMAT,
                  "'m.w2' is listed in");
}

static void test_index_unlisted_tensor(void **state)
{
    (void)state;
    sharded_fails("\"z.w1\":" S1 ",\"m.w2\":" S1 ",\"a.w3\":" S2 ",\"b.w4\":" S2, DSQ_ERR_FORMAT,
                  "'c.w5' which");
}

static void test_index_duplicate_key(void **state)
{
    (void)state;
    sharded_fails("\"z.w1\":" S1 ",\"z.w1\":" S1 ",\"m.w2\":" S1 "," REST2, DSQ_ERR_FORMAT,
                  "twice");
}

static void test_index_path_escape(void **state)
{
    (void)state;
    sharded_fails("\"z.w1\":\"../model-00001-of-00002.safetensors\",\"m.w2\":" S1 "," REST2,
                  DSQ_ERR_FORMAT, "shard file name");
}

static void test_index_no_weight_map(void **state)
{
    (void)state;
    char *pi = stw_path(tmp, "model.safetensors.index.json");
    assert_int_equal(stw_write_bytes(pi, "{\"metadata\":{}}", 15), 0);
    expect_open_fails(tmp, 1, DSQ_ERR_FORMAT, "weight_map");
    assert_int_equal(stw_write_bytes(pi, "{\"weight_map\":{}}", 17), 0);
    expect_open_fails(tmp, 1, DSQ_ERR_FORMAT, "empty");
    assert_int_equal(stw_write_bytes(pi, "{\"weight_map\":", 14), 0);
    expect_open_fails(tmp, 1, DSQ_ERR_FORMAT, "JSON");
    free(pi);
}

/* The same tensor stored in two shards (both listed once in the index,
 * which can only name one of them). */
static void test_tensor_in_two_shards(void **state)
{
    (void)state;
    size_t l;
    char *p1 = stw_path(tmp, "s1.safetensors"), *p2 = stw_path(tmp, "s2.safetensors");
    stw_tensor a[] = { { "x", "F32", 1, { 2 } }, { "y", "F32", 1, { 2 } } };
    stw_tensor b[] = { { "x", "F32", 1, { 2 } }, { "w", "F32", 1, { 2 } } };
    uint8_t *d1 = stw_write_tensors(p1, a, 2, NULL, 8, &l, NULL);
    uint8_t *d2 = stw_write_tensors(p2, b, 2, NULL, 8, &l, NULL);
    const char *ix = "{\"weight_map\":{\"x\":\"s1.safetensors\",\"y\":\"s1.safetensors\","
                     "\"w\":\"s2.safetensors\"}}";
    char *pi = stw_path(tmp, "model.safetensors.index.json");
    assert_int_equal(stw_write_bytes(pi, ix, strlen(ix)), 0);
    expect_open_fails(tmp, 1, DSQ_ERR_FORMAT, "appears in two shards");
    free(d1);
    free(d2);
    free(p1);
    free(p2);
    free(pi);
}

/* A malformed shard is reported as such, naming the shard. */
static void test_index_bad_shard(void **state)
{
    (void)state;
    char *p1 = stw_path(tmp, "s1.safetensors");
    assert_int_equal(stw_write(p1, "{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}",
                               NULL, 9, 8), 0);
    char *pi = stw_path(tmp, "model.safetensors.index.json");
    const char *ix = "{\"weight_map\":{\"x\":\"s1.safetensors\"}}";
    assert_int_equal(stw_write_bytes(pi, ix, strlen(ix)), 0);
    expect_open_fails(tmp, 1, DSQ_ERR_FORMAT, "s1.safetensors");
    free(p1);
    free(pi);
}

/* Random corruption of a valid file: any status is fine, crashing is not
 * (valgrind / ASan make this meaningful). */
static void test_fuzz_bytes(void **state)
{
    (void)state;
    const int n = (int)(sizeof round_trip_tensors / sizeof round_trip_tensors[0]);
    char *p = stw_path(tmp, "fz.safetensors");
    size_t dlen;
    uint8_t *data = stw_write_tensors(p, round_trip_tensors, n, NULL, 8, &dlen, NULL);
    assert_non_null(data);
    size_t len;
    uint8_t *orig = dsq_test_read(p, &len);
    assert_non_null(orig);
    uint8_t *buf = malloc(len);
    int n_ok = 0, n_fail = 0;
    for (int iter = 0; iter < 400; iter++) {
        memcpy(buf, orig, len);
        int flips = 1 + iter % 4;
        for (int k = 0; k < flips; k++) {
            size_t at = (size_t)stw_rand_byte() * 256 + stw_rand_byte();
            at %= (iter % 2) ? len : (len < 200 ? len : 200); /* favour the header */
            buf[at] = stw_rand_byte();
        }
        size_t cut = (iter % 7 == 0) ? (size_t)stw_rand_byte() % len : len;
        assert_int_equal(stw_write_bytes(p, buf, cut), 0);
        dsq_st_set *set = NULL;
        dsq_status st = dsq_st_open_file(p, &set);
        if (st == DSQ_OK) {
            n_ok++;
            /* whatever was accepted must be readable in full */
            for (int32_t i = 0; i < dsq_st_count(set); i++) {
                const dsq_st_entry *e = dsq_st_at(set, i);
                volatile uint8_t sink = 0;
                for (size_t b = 0; b < e->t.nbytes; b++)
                    sink ^= ((const uint8_t *)e->t.data)[b];
                (void)sink;
            }
            dsq_st_close(set);
        } else {
            n_fail++;
            assert_true(st == DSQ_ERR_FORMAT);
            assert_null(set);
        }
    }
    printf("    fuzz: %d accepted, %d refused\n", n_ok, n_fail);
    assert_true(n_fail > 0);
    free(buf);
    free(orig);
    free(data);
    free(p);
}

int main(void)
{
    static struct CMUnitTest bad_tests[N_BAD];
    for (size_t i = 0; i < N_BAD; i++) {
        bad_tests[i].name = bad_cases[i].label;
        bad_tests[i].test_func = test_bad_header;
        bad_tests[i].setup_func = setup;
        bad_tests[i].teardown_func = teardown;
        bad_tests[i].initial_state = (void *)&bad_cases[i];
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_round_trip_aligned, setup, teardown),
        cmocka_unit_test_setup_teardown(test_round_trip_unaligned, setup, teardown),
        cmocka_unit_test_setup_teardown(test_empty_header_ok, setup, teardown),
        cmocka_unit_test_setup_teardown(test_dir_prefers_single_file, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sharded_round_trip, setup, teardown),
        cmocka_unit_test_setup_teardown(test_empty_file, setup, teardown),
        cmocka_unit_test_setup_teardown(test_seven_byte_file, setup, teardown),
        cmocka_unit_test_setup_teardown(test_header_len_past_eof, setup, teardown),
        cmocka_unit_test_setup_teardown(test_header_len_huge, setup, teardown),
        cmocka_unit_test_setup_teardown(test_header_len_zero, setup, teardown),
        cmocka_unit_test_setup_teardown(test_nul_in_header, setup, teardown),
        cmocka_unit_test_setup_teardown(test_missing_file, setup, teardown),
        cmocka_unit_test_setup_teardown(test_dir_without_model, setup, teardown),
        cmocka_unit_test(test_null_args),
        cmocka_unit_test_setup_teardown(test_index_missing_shard, setup, teardown),
        cmocka_unit_test_setup_teardown(test_index_tensor_absent_from_shard, setup, teardown),
        cmocka_unit_test_setup_teardown(test_index_tensor_in_wrong_shard, setup, teardown),
        cmocka_unit_test_setup_teardown(test_index_unlisted_tensor, setup, teardown),
        cmocka_unit_test_setup_teardown(test_index_duplicate_key, setup, teardown),
        cmocka_unit_test_setup_teardown(test_index_path_escape, setup, teardown),
        cmocka_unit_test_setup_teardown(test_index_no_weight_map, setup, teardown),
        cmocka_unit_test_setup_teardown(test_tensor_in_two_shards, setup, teardown),
        cmocka_unit_test_setup_teardown(test_index_bad_shard, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fuzz_bytes, setup, teardown),
    };
    int fails = cmocka_run_group_tests_name("safetensors", tests, NULL, NULL);
    fails += cmocka_run_group_tests_name("safetensors_malformed", bad_tests, NULL, NULL);
    return fails ? 1 : 0;
}
