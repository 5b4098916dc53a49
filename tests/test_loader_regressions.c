/*
 * test_loader_regressions.c - loader defects found by an adversarial test set
 * (issue 14), each checked against the behaviour that was wrong:
 *
 *  - a FIFO in place of a model file (the .safetensors path, a shard, the
 *    index, config.json, generation_config.json, tokenizer.json) blocked
 *    open() forever: now DSQ_ERR_IO at once (an alarm kills a test that
 *    hangs, so the old code fails instead of stalling ctest);
 *  - an index naming 100,000 distinct shards took 34 s (quadratic shard
 *    dedup) before its first IO error: now well under the bound here;
 *  - an unused, misaligned 256 MB tensor was copied at load (peak memory
 *    grew by twice its size): now only used tensors are copied;
 *  - a key or string holding NUL (\u0000) aliased a shorter name;
 *  - a repeated config.json key: the first one counted (Python takes the
 *    last): now refused naming the key;
 *  - NaN/Inf weights loaded with DSQ_OK: now DSQ_ERR_FORMAT naming the
 *    tensor, unless skip_finite_check;
 *  - copy_weights: the files may be truncated or overwritten after the load
 *    and the results do not change; without it a truncated file raises
 *    SIGBUS (the documented behaviour).
 */
#include "testutil.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"
#include "json_strict.h"
#include "st_writer.h"

static char *tmp;

static int setup(void **state)
{
    (void)state;
    tmp = stw_mkdtemp();
    /* a test that blocks (the FIFO defects) dies here instead of hanging */
    alarm(120);
    return tmp ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    alarm(0);
    stw_rmtree(tmp);
    free(tmp);
    tmp = NULL;
    return 0;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

#include "tiny_model.h"

static dsq_model_params cpu_params(void)
{
    dsq_model_params p = dsq_model_default_params();
    p.backend = DSQ_BACKEND_CPU;
    return p;
}

/* ---- defect 5: FIFOs ------------------------------------------------------ */

static void make_fifo(const char *dir, const char *name)
{
    char *p = stw_path(dir, name);
    unlink(p);
    assert_int_equal(mkfifo(p, 0600), 0);
    free(p);
}

static void test_fifo_safetensors_path(void **state)
{
    (void)state;
    write_config(tmp, 32);
    make_fifo(tmp, "x.safetensors");
    char *p = stw_path(tmp, "x.safetensors");
    dsq_model_params mp = cpu_params();
    expect_load(p, &mp, DSQ_ERR_IO, "not a regular file");
    /* and straight through the reader */
    dsq_st_set *set = (dsq_st_set *)(uintptr_t)1;
    assert_int_equal(dsq_st_open_file(p, &set), DSQ_ERR_IO);
    assert_null(set);
    free(p);
}

static void test_fifo_model_safetensors_in_dir(void **state)
{
    (void)state;
    write_config(tmp, 32);
    make_fifo(tmp, "model.safetensors");
    dsq_model_params mp = cpu_params();
    expect_load(tmp, &mp, DSQ_ERR_IO, "not a regular file");
}

static void test_fifo_shard_and_index(void **state)
{
    (void)state;
    model_list m;
    write_model(tmp, 32, &m, NULL);
    char *single = stw_path(tmp, "model.safetensors");
    char *shard = stw_path(tmp, "a.safetensors");
    assert_int_equal(rename(single, shard), 0);
    make_fifo(tmp, "b.safetensors");
    /* every tensor in a.safetensors except the last, which the index puts in
     * the FIFO b.safetensors (opened second) */
    char *idx = malloc(65536);
    size_t k = (size_t)snprintf(idx, 65536, "{\"metadata\":{},\"weight_map\":{");
    for (int i = 0; i < m.n; i++)
        k += (size_t)snprintf(idx + k, 65536 - k, "%s\"%s\":\"%s\"", i ? "," : "", m.t[i].name,
                              i == m.n - 1 ? "b.safetensors" : "a.safetensors");
    snprintf(idx + k, 65536 - k, "}}");
    write_text(tmp, "model.safetensors.index.json", idx);
    dsq_model_params mp = cpu_params();
    expect_load(tmp, &mp, DSQ_ERR_IO, "b.safetensors");
    /* the index itself a FIFO */
    make_fifo(tmp, "model.safetensors.index.json");
    expect_load(tmp, &mp, DSQ_ERR_IO, "not a regular file");
    free(idx);
    free(single);
    free(shard);
}

static void test_fifo_json_files(void **state)
{
    (void)state;
    model_list m;
    dsq_model_params mp = cpu_params();
    const char *names[] = { "config.json", "generation_config.json", "tokenizer.json" };
    for (int i = 0; i < 3; i++) {
        write_model(tmp, 32, &m, NULL);
        make_fifo(tmp, names[i]);
        printf("  %s is a FIFO\n", names[i]);
        expect_load(tmp, &mp, DSQ_ERR_IO, names[i]);
        char *p = stw_path(tmp, names[i]);
        unlink(p);
        free(p);
    }
    /* the model loads once the FIFOs are gone (the checks above were not
     * refusing for another reason) */
    write_model(tmp, 32, &m, NULL);
    expect_load(tmp, &mp, DSQ_OK, NULL);
    /* dsq_read_file itself */
    make_fifo(tmp, "plain.json");
    char *p = stw_path(tmp, "plain.json");
    char *text = (char *)(uintptr_t)1;
    size_t len = 7;
    assert_int_equal(dsq_read_file(p, &text, &len), DSQ_ERR_IO);
    assert_null(text);
    assert_int_equal(len, 0);
    free(p);
}

/* ---- defect 6: quadratic index -------------------------------------------- */

static void test_index_many_shards_is_fast(void **state)
{
    (void)state;
    enum { N = 100000 };
    size_t cap = (size_t)N * 64 + 64, k = 0;
    char *idx = malloc(cap);
    assert_non_null(idx);
    k += (size_t)snprintf(idx + k, cap - k, "{\"weight_map\":{");
    for (int i = 0; i < N; i++)
        k += (size_t)snprintf(idx + k, cap - k, "%s\"t%06d\":\"s%06d.safetensors\"", i ? "," : "",
                              i, i);
    snprintf(idx + k, cap - k, "}}");
    write_text(tmp, "model.safetensors.index.json", idx);
    free(idx);
    dsq_st_set *set = NULL;
    double t0 = now_s();
    dsq_status st = dsq_st_open_dir(tmp, &set);
    double dt = now_s() - t0;
    printf("    %d distinct shards: %s after %.3f s | %s\n", N, dsq_status_string(st), dt,
           dsq_last_error_message());
    assert_int_equal(st, DSQ_ERR_IO); /* s000000.safetensors does not exist */
    assert_non_null(strstr(dsq_last_error_message(), "s000000.safetensors"));
    assert_null(set);
    /* the quadratic version took 34 s (release build); this is n log n */
    assert_true(dt < 5.0);
}

/* ---- defect 9: unused misaligned tensors ---------------------------------- */

/* Peak RSS growth (bytes) of a child process that loads `path` (exit 0 if
 * DSQ_OK); *copied gets dsq_st_copied_bytes of the loaded model. */
static long load_peak_growth(const char *path, uint64_t *copied)
{
    int pfd[2];
    assert_int_equal(pipe(pfd), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        close(pfd[0]);
        struct rusage r0, r1;
        getrusage(RUSAGE_SELF, &r0);
        dsq_model_params mp = cpu_params();
        dsq_model *m = NULL;
        dsq_status st = dsq_model_load(path, &mp, &m);
        getrusage(RUSAGE_SELF, &r1);
        long out[2] = { (r1.ru_maxrss - r0.ru_maxrss) * 1024L,
                        m ? (long)dsq_st_copied_bytes(m->st) : -1 };
        if (st != DSQ_OK)
            fprintf(stderr, "child load: %s\n", dsq_last_error_message());
        if (write(pfd[1], out, sizeof out) != (ssize_t)sizeof out)
            _exit(3);
        dsq_model_free(m);
        _exit(st == DSQ_OK ? 0 : 2);
    }
    close(pfd[1]);
    long out[2] = { -1, -1 };
    ssize_t got = read(pfd[0], out, sizeof out);
    close(pfd[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    assert_int_equal(got, (ssize_t)sizeof out);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    *copied = (uint64_t)out[1];
    return out[0];
}

static void test_unused_misaligned_tensor_not_copied(void **state)
{
    (void)state;
    const int64_t big = (int64_t)128 << 20; /* BF16 elements: 256 MB */
    model_list m;
    write_config(tmp, 32);
    model_tensors(&m, 32);
    /* header of the used tensors + one unused giant, data sparse: the used
     * tensors first (small, written), the giant last (a hole) */
    size_t cap = 65536, k = 0, off = 0;
    char *h = malloc(cap);
    k += (size_t)snprintf(h + k, cap - k, "{");
    for (int i = 0; i < m.n; i++) {
        size_t nb = stw_nbytes(&m.t[i]);
        k += (size_t)snprintf(h + k, cap - k, "\"%s\":{\"dtype\":\"%s\",\"shape\":[", m.t[i].name,
                              m.t[i].dtype);
        for (int d = 0; d < m.t[i].ndim; d++)
            k += (size_t)snprintf(h + k, cap - k, "%s%lld", d ? "," : "",
                                  (long long)m.t[i].shape[d]);
        k += (size_t)snprintf(h + k, cap - k, "],\"data_offsets\":[%zu,%zu]},", off, off + nb);
        off += nb;
    }
    size_t used_bytes = off;
    k += (size_t)snprintf(h + k, cap - k,
                          "\"zz.unused\":{\"dtype\":\"BF16\",\"shape\":[%lld],"
                          "\"data_offsets\":[%zu,%zu]}}",
                          (long long)big, off, off + (size_t)big * 2);
    if (k % 2 == 0) /* odd header length: every 2- and 4-byte tensor misaligned */
        h[k++] = ' ';
    h[k] = '\0';
    char *path = stw_path(tmp, "model.safetensors");
    uint8_t *small = calloc(1, used_bytes); /* zeros: finite */
    assert_int_equal(stw_write_raw(path, k, h, k, small, used_bytes), 0);
    assert_int_equal(truncate(path, (off_t)(8 + k + used_bytes + (size_t)big * 2)), 0);
    free(small);
    free(h);

    uint64_t copied = 0;
    long grew = load_peak_growth(tmp, &copied);
    printf("    unused 256 MB misaligned tensor: peak RSS grew %.1f MB, %llu bytes copied "
           "(used tensors: %zu bytes)\n",
           grew / 1e6, (unsigned long long)copied, used_bytes);
    /* the old loader copied the giant: +256 MB heap, +256 MB mapped pages */
    assert_true(grew < (long)64 << 20);
    assert_true(copied <= used_bytes);
    free(path);
}

/* ---- defect 10: NUL in keys and strings ----------------------------------- */

static void test_nul_in_safetensors_name(void **state)
{
    (void)state;
    char *p = stw_path(tmp, "n.safetensors");
    /* the escaped NUL: a second entry whose C-string name is "a" */
    const char *hdr =
        "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
        "\"b\\u0000evil\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}";
    float data[2] = { 1.0f, 2.0f };
    assert_int_equal(stw_write(p, hdr, data, sizeof data, 8), 0);
    dsq_st_set *set = (dsq_st_set *)(uintptr_t)1;
    dsq_status st = dsq_st_open_file(p, &set);
    printf("    -> %s | %s\n", dsq_status_string(st), dsq_last_error_message());
    assert_int_equal(st, DSQ_ERR_FORMAT);
    assert_null(set);
    assert_non_null(strstr(dsq_last_error_message(), "NUL"));
    /* the NUL aliasing an existing name: "a\u0000x" vs "a" */
    const char *hdr2 =
        "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
        "\"a\\u0000x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}";
    assert_int_equal(stw_write(p, hdr2, data, sizeof data, 8), 0);
    assert_int_equal(dsq_st_open_file(p, &set), DSQ_ERR_FORMAT);
    assert_non_null(strstr(dsq_last_error_message(), "NUL"));
    /* an escaped backslash followed by "u0000" is no NUL */
    const char *ok = "{\"a\\\\u0000\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}";
    assert_int_equal(stw_write(p, ok, data, 4, 8), 0);
    assert_int_equal(dsq_st_open_file(p, &set), DSQ_OK);
    assert_non_null(dsq_st_find(set, "a\\u0000"));
    dsq_st_close(set);
    free(p);
}

static void test_nul_in_model_json(void **state)
{
    (void)state;
    model_list m;
    dsq_model_params mp = cpu_params();
    /* config.json: "hidden_size\u0000x" would be read as hidden_size */
    write_model(tmp, 32, &m, NULL);
    char cfg[1024];
    snprintf(cfg, sizeof cfg, config_fmt, 32, E, L, H, K, D, F);
    char *hs = strstr(cfg, "\"hidden_size\":");
    assert_non_null(hs);
    char bad[1200];
    snprintf(bad, sizeof bad, "%.*s\"hidden_size\\u0000x\":4096,%s", (int)(hs - cfg), cfg, hs);
    write_text(tmp, "config.json", bad);
    expect_load(tmp, &mp, DSQ_ERR_FORMAT, "NUL");
    dsq_config c;
    assert_int_equal(dsq_config_parse(bad, strlen(bad), &c), DSQ_ERR_FORMAT);
    /* a raw NUL byte inside a string value */
    char raw[] = "{\"model_type\":\"qwen2X\"}";
    raw[20] = '\0';
    assert_int_equal(dsq_config_parse(raw, sizeof raw - 1, &c), DSQ_ERR_FORMAT);
    write_config(tmp, 32);

    /* generation_config.json */
    write_text(tmp, "generation_config.json", "{\"temperature\\u0000x\":0.1,\"temperature\":0.7}");
    expect_load(tmp, &mp, DSQ_ERR_FORMAT, "NUL");
    char *gp = stw_path(tmp, "generation_config.json");
    unlink(gp);
    free(gp);

    /* index weight_map key */
    char *single = stw_path(tmp, "model.safetensors");
    char *shard = stw_path(tmp, "a.safetensors");
    assert_int_equal(rename(single, shard), 0);
    char *idx = malloc(65536);
    size_t k = (size_t)snprintf(idx, 65536, "{\"weight_map\":{");
    for (int i = 0; i < m.n; i++)
        k += (size_t)snprintf(idx + k, 65536 - k, "%s\"%s\":\"a.safetensors\"", i ? "," : "",
                              m.t[i].name);
    snprintf(idx + k, 65536 - k, ",\"model.norm.weight\\u0000evil\":\"a.safetensors\"}}");
    write_text(tmp, "model.safetensors.index.json", idx);
    expect_load(tmp, &mp, DSQ_ERR_FORMAT, "NUL");
    /* shard name with NUL ("a.safetensors\u0000x" would open a.safetensors) */
    snprintf(idx + k, 65536 - k, "}}");
    char *q = strstr(idx, "\"a.safetensors\"");
    assert_non_null(q);
    char *idx2 = malloc(65600);
    snprintf(idx2, 65600, "%.*s\"a.safetensors\\u0000x\"%s", (int)(q - idx), idx,
             q + strlen("\"a.safetensors\""));
    write_text(tmp, "model.safetensors.index.json", idx2);
    expect_load(tmp, &mp, DSQ_ERR_FORMAT, "NUL");
    /* and the clean index loads */
    write_text(tmp, "model.safetensors.index.json", idx);
    expect_load(tmp, &mp, DSQ_OK, NULL);
    free(idx2);
    free(idx);
    free(single);
    free(shard);
}

/* ---- defect 11: duplicate keys -------------------------------------------- */

static void test_duplicate_config_key(void **state)
{
    (void)state;
    model_list m;
    dsq_model_params mp = cpu_params();
    write_model(tmp, 32, &m, NULL);
    char cfg[1024], bad[1200];
    snprintf(cfg, sizeof cfg, config_fmt, 32, E, L, H, K, D, F);
    /* "hidden_size": E, then "hidden_size": 4096 at the end */
    snprintf(bad, sizeof bad, "%.*s,\"hidden_size\":4096}", (int)strlen(cfg) - 1, cfg);
    write_text(tmp, "config.json", bad);
    expect_load(tmp, &mp, DSQ_ERR_CONFIG, "\"hidden_size\" appears twice");
    /* nested objects too */
    snprintf(bad, sizeof bad, "%.*s,\"extra\":{\"x\":1,\"y\":{\"z\":1,\"z\":2}}}",
             (int)strlen(cfg) - 1, cfg);
    write_text(tmp, "config.json", bad);
    expect_load(tmp, &mp, DSQ_ERR_CONFIG, "\"z\" appears twice");
    /* the same key in different objects is fine */
    snprintf(bad, sizeof bad, "%.*s,\"extra\":{\"hidden_size\":1,\"y\":{\"hidden_size\":2}}}",
             (int)strlen(cfg) - 1, cfg);
    write_text(tmp, "config.json", bad);
    expect_load(tmp, &mp, DSQ_OK, NULL);
    write_config(tmp, 32);

    write_text(tmp, "generation_config.json", "{\"temperature\":0.6,\"top_p\":0.9,\"temperature\":0.1}");
    expect_load(tmp, &mp, DSQ_ERR_FORMAT, "\"temperature\" appears twice");
    char *gp = stw_path(tmp, "generation_config.json");
    unlink(gp);
    free(gp);

    /* index: "weight_map" twice (the second would win in Python) */
    char *single = stw_path(tmp, "model.safetensors");
    char *shard = stw_path(tmp, "a.safetensors");
    assert_int_equal(rename(single, shard), 0);
    char *idx = malloc(65536);
    size_t k = (size_t)snprintf(idx, 65536, "{\"weight_map\":{");
    for (int i = 0; i < m.n; i++)
        k += (size_t)snprintf(idx + k, 65536 - k, "%s\"%s\":\"a.safetensors\"", i ? "," : "",
                              m.t[i].name);
    snprintf(idx + k, 65536 - k, "},\"weight_map\":{}}");
    write_text(tmp, "model.safetensors.index.json", idx);
    expect_load(tmp, &mp, DSQ_ERR_FORMAT, "'weight_map' appears twice");
    free(idx);
    free(single);
    free(shard);

    /* safetensors __metadata__ with a repeated key */
    char *p = stw_path(tmp, "meta.safetensors");
    float one = 1.0f;
    assert_int_equal(stw_write(p, "{\"__metadata__\":{\"format\":\"pt\",\"format\":\"np\"},"
                                  "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}",
                               &one, 4, 8),
                     0);
    dsq_st_set *set = NULL;
    assert_int_equal(dsq_st_open_file(p, &set), DSQ_ERR_FORMAT);
    assert_non_null(strstr(dsq_last_error_message(), "'format' appears twice"));
    free(p);
}

static void test_duplicate_key_walk(void **state)
{
    (void)state;
    /* the iterative walk reaches every object: siblings after deep subtrees,
     * objects inside arrays, 900 levels down */
    const struct { const char *json; const char *dup; } cases[] = {
        { "{}", NULL },
        { "{\"a\":1,\"b\":{\"a\":2},\"c\":[{\"a\":3}]}", NULL },
        { "{\"a\":1,\"a\":2}", "a" },
        { "{\"x\":{\"y\":{\"z\":[]}},\"q\":1,\"q\":2}", "q" },
        { "[1,{\"k\":[{},{\"m\":0,\"n\":0,\"m\":1}]}]", "m" },
        { "{\"b\":1,\"a\":1,\"c\":1,\"a\":2,\"b\":2}", "a" }, /* first repeat in the file */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        cJSON *j = cJSON_Parse(cases[i].json);
        assert_non_null(j);
        int oom = 1;
        const cJSON *d = dsq_json_duplicate_key(j, &oom);
        assert_int_equal(oom, 0);
        if (cases[i].dup) {
            assert_non_null(d);
            assert_string_equal(d->string, cases[i].dup);
        } else {
            assert_null(d);
        }
        cJSON_Delete(j);
    }
    enum { DEPTH = 900 };
    char *deep = malloc(DEPTH * 8 + 64);
    size_t k = 0;
    for (int i = 0; i < DEPTH; i++)
        k += (size_t)sprintf(deep + k, "{\"o\":");
    k += (size_t)sprintf(deep + k, "{\"z\":1,\"z\":2}");
    for (int i = 0; i < DEPTH; i++)
        deep[k++] = '}';
    deep[k] = '\0';
    cJSON *j = cJSON_Parse(deep);
    assert_non_null(j);
    int oom = 0;
    const cJSON *d = dsq_json_duplicate_key(j, &oom);
    assert_non_null(d);
    assert_string_equal(d->string, "z");
    cJSON_Delete(j);
    free(deep);
    /* NUL offsets: raw, escaped; an escaped backslash before u0000 is not one */
    const char *esc = "{\"a\\u0000\":1}", *not_esc = "{\"a\\\\u0000\":1}";
    assert_int_equal(dsq_json_nul_offset(esc, strlen(esc)), 3);
    assert_int_equal(dsq_json_nul_offset(not_esc, strlen(not_esc)), strlen(not_esc));
    assert_int_equal(dsq_json_nul_offset("{\"a\":1}\0", 8), 7);
    const char *in_value = "{\"a\":\"\\u00001\"}";
    assert_int_equal(dsq_json_nul_offset(in_value, strlen(in_value)), 6);
}

/* ---- item 2: non-finite weights ------------------------------------------- */

static void test_any_nonfinite_each_dtype(void **state)
{
    (void)state;
    /* every position, every dtype, NaN / +Inf / -Inf; largest finite values
     * and negative zero are fine */
    enum { N = 37 };
    uint16_t h[N];
    uint32_t f[N];
    const uint16_t bf_bad[] = { 0x7fc0, 0x7f80, 0xff80, 0x7f81, 0xffff };
    const uint16_t f16_bad[] = { 0x7e00, 0x7c00, 0xfc00, 0x7c01, 0xffff };
    const uint32_t f32_bad[] = { 0x7fc00000u, 0x7f800000u, 0xff800000u, 0x7f800001u, 0xffffffffu };
    for (int i = 0; i < N; i++) {
        h[i] = (uint16_t)(i % 2 ? 0x7f7f : 0x8000);
        f[i] = i % 2 ? 0x7f7fffffu : 0xff7fffffu;
    }
    assert_int_equal(dsq_any_nonfinite(h, DSQ_DT_BF16, N), 0);
    assert_int_equal(dsq_any_nonfinite(f, DSQ_DT_F32, N), 0);
    for (int i = 0; i < N; i++)
        h[i] = (uint16_t)(i % 2 ? 0x7bff : 0xfbff);
    assert_int_equal(dsq_any_nonfinite(h, DSQ_DT_F16, N), 0);
    for (int b = 0; b < 5; b++)
        for (int pos = 0; pos < N; pos++) {
            for (int i = 0; i < N; i++)
                h[i] = 0x3f80;
            h[pos] = bf_bad[b];
            assert_int_equal(dsq_any_nonfinite(h, DSQ_DT_BF16, N), 1);
            assert_int_equal(dsq_any_nonfinite(h, DSQ_DT_BF16, (size_t)pos), 0);
            for (int i = 0; i < N; i++)
                h[i] = 0x3c00;
            h[pos] = f16_bad[b];
            assert_int_equal(dsq_any_nonfinite(h, DSQ_DT_F16, N), 1);
            assert_int_equal(dsq_any_nonfinite(h, DSQ_DT_F16, (size_t)pos), 0);
            for (int i = 0; i < N; i++)
                f[i] = 0x3f800000u;
            f[pos] = f32_bad[b];
            assert_int_equal(dsq_any_nonfinite(f, DSQ_DT_F32, N), 1);
            assert_int_equal(dsq_any_nonfinite(f, DSQ_DT_F32, (size_t)pos), 0);
        }
}

static void test_nonfinite_weights_refused(void **state)
{
    (void)state;
    /* vocab big enough that the embedding spans several scan chunks (1 M
     * values each): its last value is in the last chunk */
    const int vocab = 140000;
    const struct {
        const char *tensor;
        int last; /* poison the last element, else the first */
        uint8_t bytes[4];
    } cases[] = {
        { "model.layers.1.self_attn.k_proj.bias", 0, { 0xc0, 0x7f } },    /* BF16 NaN */
        { "model.embed_tokens.weight", 1, { 0x80, 0x7f } },               /* BF16 +Inf, last */
        { "model.embed_tokens.weight", 0, { 0x80, 0xff } },               /* BF16 -Inf */
        { "model.layers.0.self_attn.v_proj.weight", 1, { 0x00, 0x7e } },  /* F16 NaN */
        { "model.norm.weight", 1, { 0x00, 0x00, 0x80, 0x7f } },           /* F32 +Inf */
        { "model.layers.1.post_attention_layernorm.weight", 0, { 0x01, 0x00, 0x80, 0xff } },
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        model_list m;
        size_t off[64];
        write_model(tmp, vocab, &m, off);
        int i = find_tensor(&m, cases[c].tensor);
        size_t es = stw_dtype_bytes(m.t[i].dtype);
        size_t at = off[i] + (cases[c].last ? stw_nbytes(&m.t[i]) - es : 0);
        char *file = stw_path(tmp, "model.safetensors");
        patch_data(file, at, cases[c].bytes, es);
        free(file);
        for (int threads = 1; threads <= 3; threads += 2) {
            dsq_model_params mp = cpu_params();
            mp.n_threads = threads;
            printf("  %s (%s), %d thread(s)\n", cases[c].tensor, m.t[i].dtype, threads);
            char needle[128];
            snprintf(needle, sizeof needle, "'%s'", cases[c].tensor);
            expect_load(tmp, &mp, DSQ_ERR_FORMAT, needle);
        }
        /* the caller who trusts the file can still load it */
        dsq_model_params mp = cpu_params();
        mp.skip_finite_check = 1;
        expect_load(tmp, &mp, DSQ_OK, NULL);
    }
    /* the clean model loads with the check on; a caller built against the
     * 0.1.0 struct (no skip_finite_check field) gets the check too */
    model_list m;
    size_t off[64];
    write_model(tmp, 32, &m, off);
    dsq_model_params mp = cpu_params();
    expect_load(tmp, &mp, DSQ_OK, NULL);
    mp.n_threads = -1; /* the scan's thread count is checked like a context's */
    expect_load(tmp, &mp, DSQ_ERR_INVALID_ARG, "n_threads");
    mp.n_threads = 0;
    mp.struct_size = (uint32_t)(offsetof(dsq_model_params, load_tokenizer) + sizeof(int32_t));
    char *file = stw_path(tmp, "model.safetensors");
    const uint8_t nan_bf16[2] = { 0xc0, 0x7f };
    patch_data(file, off[find_tensor(&m, "model.layers.0.mlp.down_proj.weight")], nan_bf16, 2);
    free(file);
    expect_load(tmp, &mp, DSQ_ERR_FORMAT, "down_proj");
    /* a non-finite value in an unused tensor is not the model's business */
}

static void test_nonfinite_unused_tensor_ignored(void **state)
{
    (void)state;
    model_list m;
    write_config(tmp, 32);
    model_tensors(&m, 32);
    add(&m, "model.rotary_emb.inv_freq", "F32", 3, 0);
    char *p = stw_path(tmp, "model.safetensors");
    size_t dlen, off[64];
    uint8_t *data = stw_write_tensors(p, m.t, m.n, NULL, 8, &dlen, off);
    assert_non_null(data);
    free(data);
    const uint8_t inf_f32[4] = { 0x00, 0x00, 0x80, 0x7f };
    patch_data(p, off[m.n - 1], inf_f32, 4);
    free(p);
    dsq_model_params mp = cpu_params();
    expect_load(tmp, &mp, DSQ_OK, NULL);
}

/* ---- item 7: copy_weights and files changed while mapped ------------------ */

static void copy_file(const char *from, const char *to)
{
    size_t n = 0;
    void *b = dsq_test_read(from, &n);
    assert_non_null(b);
    assert_int_equal(stw_write_bytes(to, b, n), 0);
    free(b);
}

/* Last-token logits of a fixed prompt. */
static void run_prompt(dsq_model *m, float *logits)
{
    dsq_ctx *c = NULL;
    assert_int_equal(dsq_ctx_new(m, NULL, &c), DSQ_OK);
    const int32_t prompt[] = { 1, 17, 250, 999, 3, 42 };
    assert_int_equal(dsq_prefill(c, 0, prompt, 6, DSQ_LOGITS_LAST, logits), DSQ_OK);
    dsq_ctx_free(c);
}

static void test_copy_weights_survives_file_changes(void **state)
{
    (void)state;
    char *src_cfg = dsq_test_path("tiny/config.json");
    char *src_st = dsq_test_path("tiny/model.safetensors");
    char *cfg = stw_path(tmp, "config.json");
    char *st = stw_path(tmp, "model.safetensors");
    copy_file(src_cfg, cfg);
    copy_file(src_st, st);
    dsq_model_params mp = cpu_params();
    dsq_model *ref = NULL;
    assert_int_equal(load(tmp, &mp, &ref), DSQ_OK);
    dsq_model_info info = { .struct_size = sizeof info };
    assert_int_equal(dsq_model_get_info(ref, &info), DSQ_OK);
    const int V = info.n_vocab;
    float *want = malloc((size_t)V * sizeof *want), *got = malloc((size_t)V * sizeof *got);
    run_prompt(ref, want);
    dsq_model_free(ref);

    /* copy, then truncate the file to nothing */
    mp.copy_weights = 1;
    dsq_model *m = NULL;
    assert_int_equal(load(tmp, &mp, &m), DSQ_OK);
    assert_true(dsq_st_copied_bytes(m->st) > 0); /* every used tensor, privately */
    assert_int_equal(truncate(st, 0), 0);
    run_prompt(m, got);
    assert_memory_equal(got, want, (size_t)V * sizeof *got);
    dsq_model_free(m);

    /* copy, then overwrite every byte of the data in place */
    copy_file(src_st, st);
    assert_int_equal(load(tmp, &mp, &m), DSQ_OK);
    struct stat sb;
    assert_int_equal(stat(st, &sb), 0);
    uint8_t h[8];
    int fd = open(st, O_RDWR);
    assert_true(fd >= 0);
    assert_int_equal(pread(fd, h, 8, 0), 8);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--)
        hlen = (hlen << 8) | h[i];
    size_t dlen = (size_t)sb.st_size - 8 - (size_t)hlen;
    uint8_t *junk = malloc(dlen);
    for (size_t i = 0; i < dlen; i++)
        junk[i] = (uint8_t)(i * 7 + 3) & 0xbf; /* other finite values */
    assert_int_equal(pwrite(fd, junk, dlen, (off_t)(8 + hlen)), (ssize_t)dlen);
    close(fd);
    run_prompt(m, got);
    assert_memory_equal(got, want, (size_t)V * sizeof *got);
    dsq_model_free(m);

    /* without the copy the overwrite shows through the mapping (documented) */
    copy_file(src_st, st);
    mp.copy_weights = 0;
    assert_int_equal(load(tmp, &mp, &m), DSQ_OK);
    fd = open(st, O_RDWR);
    assert_true(fd >= 0);
    assert_int_equal(pwrite(fd, junk, dlen, (off_t)(8 + hlen)), (ssize_t)dlen);
    close(fd);
    run_prompt(m, got);
    assert_true(memcmp(got, want, (size_t)V * sizeof *got) != 0);
    dsq_model_free(m);
    free(junk);

    /* ... and truncation raises SIGBUS on the next read (in a child: it
     * kills the process; under ASan its handler reports it and exits) */
    copy_file(src_st, st);
    fflush(stdout);
    pid_t pid = fork();
    assert_true(pid >= 0);
    char *errlog = stw_path(tmp, "child_stderr.txt");
    if (pid == 0) {
        /* ASan's deadly-signal report (and its leak list) goes to a file */
        int efd = open(errlog, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        if (efd >= 0)
            dup2(efd, 2);
        /* cmocka catches SIGBUS to report a failed test: restore the
         * default, which is what a caller of the library gets */
        signal(SIGBUS, SIG_DFL);
        dsq_model *cm = NULL;
        if (dsq_model_load(tmp, &mp, &cm) != DSQ_OK)
            _exit(2);
        if (truncate(st, 0) != 0)
            _exit(3);
        float *l = malloc((size_t)V * sizeof *l);
        dsq_ctx *c = NULL;
        const int32_t prompt[] = { 1, 17, 250 };
        if (dsq_ctx_new(cm, NULL, &c) == DSQ_OK)
            dsq_prefill(c, 0, prompt, 3, DSQ_LOGITS_LAST, l);
        _exit(0); /* survived: not what the header documents */
    }
    int status = 0;
    waitpid(pid, &status, 0);
    printf("    truncated while mapped: %s %d\n", WIFSIGNALED(status) ? "signal" : "exit",
           WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));
    if (WIFSIGNALED(status)) {
        assert_int_equal(WTERMSIG(status), SIGBUS);
    } else {
        /* under ASan: its handler reports the signal and exits 1 */
        assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 1);
        char *log = dsq_test_read(errlog, NULL);
        assert_non_null(log);
        assert_non_null(strstr(log, "BUS"));
        free(log);
    }
    free(errlog);
    free(want);
    free(got);
    free(cfg);
    free(st);
    free(src_cfg);
    free(src_st);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_fifo_safetensors_path, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fifo_model_safetensors_in_dir, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fifo_shard_and_index, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fifo_json_files, setup, teardown),
        cmocka_unit_test_setup_teardown(test_index_many_shards_is_fast, setup, teardown),
        cmocka_unit_test_setup_teardown(test_unused_misaligned_tensor_not_copied, setup, teardown),
        cmocka_unit_test_setup_teardown(test_nul_in_safetensors_name, setup, teardown),
        cmocka_unit_test_setup_teardown(test_nul_in_model_json, setup, teardown),
        cmocka_unit_test_setup_teardown(test_duplicate_config_key, setup, teardown),
        cmocka_unit_test(test_duplicate_key_walk),
        cmocka_unit_test_setup_teardown(test_any_nonfinite_each_dtype, setup, teardown),
        cmocka_unit_test_setup_teardown(test_nonfinite_weights_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_nonfinite_unused_tensor_ignored, setup, teardown),
        cmocka_unit_test_setup_teardown(test_copy_weights_survives_file_changes, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
