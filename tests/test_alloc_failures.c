/* test_alloc_failures.c - allocation-failure injection.
 *
 * The scenario below (model load with tokenizer and generation config, a
 * context, prefill + decode, a sampler, tokenize / detokenize, a detok
 * stream, a stopper, chat formatting) is first run once counting the
 * allocation points it passes, then once per n = 1..N with the n-th point
 * failing.  Each run must end with DSQ_ERR_OUT_OF_MEMORY from the call that
 * hit the failure, NULL in its out pointer, and the objects made before
 * still usable: the failed call is retried without injection and the
 * scenario finishes with results equal to the clean run.  Under ASan
 * (scripts/test.sh) LeakSanitizer checks after every run that nothing
 * leaked.
 *
 * Allocation points, all in this binary's link (tests/CMakeLists.txt adds
 * -Wl,--wrap for them, so only calls made by the library's objects and this
 * file are redirected):
 *   - malloc, calloc, realloc, strdup, strndup, posix_memalign, aligned_alloc;
 *   - every allocation cJSON makes (cJSON_InitHooks routes them here);
 *   - the PCRE2 and utf8proc calls that allocate: pcre2_compile,
 *     pcre2_jit_compile, pcre2_match_data_create_from_pattern,
 *     pcre2_match_context_create, pcre2_jit_stack_create, pcre2_match and
 *     utf8proc_map fail as those libraries do when their malloc fails.
 * Not covered: allocations inside glibc (fopen, pthread_create) and the
 * mmap of the weights. */
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <utf8proc.h>

#include "testutil.h"

/* ---- the failpoints ---------------------------------------------------------------- */

static atomic_long g_seen;   /* allocation points passed while armed */
static long g_fail_at;       /* 1-based point to fail; 0: none */
static atomic_int g_armed;
static atomic_int g_injected; /* failures injected since armed */
/* Blocks handed out by the wrapped allocators (and PCRE2 objects) minus
 * those given back: a cheap leak count per run (LeakSanitizer runs on a
 * sample of runs and at exit). */
static atomic_long g_live;

static int fail_now(void)
{
    if (!atomic_load(&g_armed))
        return 0;
    long n = atomic_fetch_add(&g_seen, 1) + 1;
    if (n != g_fail_at)
        return 0;
    atomic_fetch_add(&g_injected, 1);
    errno = ENOMEM; /* as malloc does */
    return 1;
}

static void *counted(void *p)
{
    if (p)
        atomic_fetch_add(&g_live, 1);
    return p;
}

void *__real_malloc(size_t n);
void *__real_calloc(size_t n, size_t m);
void *__real_realloc(void *p, size_t n);
char *__real_strdup(const char *s);
char *__real_strndup(const char *s, size_t n);
int __real_posix_memalign(void **p, size_t a, size_t n);
void *__real_aligned_alloc(size_t a, size_t n);
void __real_free(void *p);
void __real_pcre2_code_free_8(pcre2_code *);
void __real_pcre2_match_data_free_8(pcre2_match_data *);
void __real_pcre2_match_context_free_8(pcre2_match_context *);
void __real_pcre2_jit_stack_free_8(pcre2_jit_stack *);
pcre2_code *__real_pcre2_compile_8(PCRE2_SPTR, PCRE2_SIZE, uint32_t, int *, PCRE2_SIZE *,
                                   pcre2_compile_context *);
int __real_pcre2_jit_compile_8(pcre2_code *, uint32_t);
pcre2_match_data *__real_pcre2_match_data_create_from_pattern_8(const pcre2_code *,
                                                                pcre2_general_context *);
pcre2_match_context *__real_pcre2_match_context_create_8(pcre2_general_context *);
pcre2_jit_stack *__real_pcre2_jit_stack_create_8(PCRE2_SIZE, PCRE2_SIZE, pcre2_general_context *);
int __real_pcre2_match_8(const pcre2_code *, PCRE2_SPTR, PCRE2_SIZE, PCRE2_SIZE, uint32_t,
                         pcre2_match_data *, pcre2_match_context *);
utf8proc_ssize_t __real_utf8proc_map(const utf8proc_uint8_t *, utf8proc_ssize_t, utf8proc_uint8_t **,
                                     utf8proc_option_t);

void *__wrap_malloc(size_t n) { return fail_now() ? NULL : counted(__real_malloc(n)); }
void *__wrap_calloc(size_t n, size_t m) { return fail_now() ? NULL : counted(__real_calloc(n, m)); }
void *__wrap_realloc(void *p, size_t n)
{
    if (fail_now())
        return NULL;
    void *q = __real_realloc(p, n);
    if (!p && q)
        atomic_fetch_add(&g_live, 1);
    return q;
}
char *__wrap_strdup(const char *s) { return fail_now() ? NULL : counted(__real_strdup(s)); }
char *__wrap_strndup(const char *s, size_t n) { return fail_now() ? NULL : counted(__real_strndup(s, n)); }
int __wrap_posix_memalign(void **p, size_t a, size_t n)
{
    if (fail_now())
        return ENOMEM;
    int r = __real_posix_memalign(p, a, n);
    if (r == 0)
        counted(*p);
    return r;
}
void *__wrap_aligned_alloc(size_t a, size_t n)
{
    return fail_now() ? NULL : counted(__real_aligned_alloc(a, n));
}
void __wrap_free(void *p)
{
    if (p)
        atomic_fetch_sub(&g_live, 1);
    __real_free(p);
}
/* PCRE2 reports a failed allocation in pcre2_compile as compile error 121
 * ("failed to allocate heap memory"), elsewhere as PCRE2_ERROR_NOMEMORY. */
pcre2_code *__wrap_pcre2_compile_8(PCRE2_SPTR pat, PCRE2_SIZE len, uint32_t opts, int *err,
                                   PCRE2_SIZE *off, pcre2_compile_context *cc)
{
    if (fail_now()) {
        *err = 121;
        *off = 0;
        return NULL;
    }
    return counted(__real_pcre2_compile_8(pat, len, opts, err, off, cc));
}
int __wrap_pcre2_jit_compile_8(pcre2_code *c, uint32_t o)
{
    return fail_now() ? PCRE2_ERROR_NOMEMORY : __real_pcre2_jit_compile_8(c, o);
}
pcre2_match_data *__wrap_pcre2_match_data_create_from_pattern_8(const pcre2_code *c,
                                                                pcre2_general_context *g)
{
    return fail_now() ? NULL : counted(__real_pcre2_match_data_create_from_pattern_8(c, g));
}
pcre2_match_context *__wrap_pcre2_match_context_create_8(pcre2_general_context *g)
{
    return fail_now() ? NULL : counted(__real_pcre2_match_context_create_8(g));
}
pcre2_jit_stack *__wrap_pcre2_jit_stack_create_8(PCRE2_SIZE a, PCRE2_SIZE b, pcre2_general_context *g)
{
    return fail_now() ? NULL : counted(__real_pcre2_jit_stack_create_8(a, b, g));
}
#define PCRE2_FREE(type, fn)                                                                     \
    void __wrap_##fn(type *p)                                                                    \
    {                                                                                            \
        if (p)                                                                                   \
            atomic_fetch_sub(&g_live, 1);                                                        \
        __real_##fn(p);                                                                          \
    }
PCRE2_FREE(pcre2_code, pcre2_code_free_8)
PCRE2_FREE(pcre2_match_data, pcre2_match_data_free_8)
PCRE2_FREE(pcre2_match_context, pcre2_match_context_free_8)
PCRE2_FREE(pcre2_jit_stack, pcre2_jit_stack_free_8)
int __wrap_pcre2_match_8(const pcre2_code *c, PCRE2_SPTR s, PCRE2_SIZE n, PCRE2_SIZE from, uint32_t o,
                         pcre2_match_data *md, pcre2_match_context *mc)
{
    return fail_now() ? PCRE2_ERROR_NOMEMORY : __real_pcre2_match_8(c, s, n, from, o, md, mc);
}
utf8proc_ssize_t __wrap_utf8proc_map(const utf8proc_uint8_t *s, utf8proc_ssize_t n,
                                     utf8proc_uint8_t **dst, utf8proc_option_t o)
{
    if (fail_now()) {
        *dst = NULL;
        return UTF8PROC_ERROR_NOMEM;
    }
    utf8proc_ssize_t r = __real_utf8proc_map(s, n, dst, o);
    if (r >= 0)
        counted(*dst);
    return r;
}

/* LeakSanitizer, when linked in (ASan builds). */
int __lsan_do_recoverable_leak_check(void) __attribute__((weak));

/* ---- the fixture: the tiny model with a small tokenizer --------------------------------- */

static char g_dir[64];

static void write_text(const char *dir, const char *name, const char *text)
{
    char p[256];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *f = fopen(p, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(text, 1, strlen(text), f), strlen(text));
    fclose(f);
}

/* A byte-level BPE tokenizer.json: the 256 byte symbols, three merges,
 * added tokens, NFC, the Qwen-style split regex (so PCRE2 runs). */
static char *small_tokenizer_json(void)
{
    size_t cap = 32768, k = 0;
    char *s = malloc(cap);
    k += (size_t)snprintf(s + k, cap - k,
        "{\"version\":\"1.0\",\"added_tokens\":["
        "{\"id\":259,\"content\":\"<eos>\",\"special\":true,\"normalized\":false},"
        "{\"id\":260,\"content\":\"<think>\",\"special\":false,\"normalized\":false}],"
        "\"normalizer\":{\"type\":\"NFC\"},"
        "\"pre_tokenizer\":{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":"
        "{\"Regex\":\"\\\\s+|\\\\p{L}+|\\\\p{N}|[^\\\\s\\\\p{L}\\\\p{N}]+\"},\"behavior\":\"Isolated\","
        "\"invert\":false},{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"trim_offsets\":false,"
        "\"use_regex\":false}]},\"post_processor\":null,\"decoder\":{\"type\":\"ByteLevel\"},"
        "\"model\":{\"type\":\"BPE\",\"vocab\":{");
    for (int b = 0; b < 256; b++) {
        /* GPT-2 byte-to-unicode: printable bytes map to themselves, the
         * others to 256 + their rank among the non-printable ones */
        int printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
        int cp = b;
        if (!printable) {
            int n = 0;
            for (int i = 0; i < b; i++)
                n += !((i >= 0x21 && i <= 0x7E) || (i >= 0xA1 && i <= 0xAC) || i >= 0xAE);
            cp = 256 + n;
        }
        char u[4];
        int ul;
        if (cp < 0x80)
            u[0] = (char)cp, ul = 1;
        else
            u[0] = (char)(0xC0 | (cp >> 6)), u[1] = (char)(0x80 | (cp & 63)), ul = 2;
        if (cp == '"' || cp == '\\')
            k += (size_t)snprintf(s + k, cap - k, "\"\\%c\":%d,", cp, b);
        else
            k += (size_t)snprintf(s + k, cap - k, "\"%.*s\":%d,", ul, u, b);
    }
    snprintf(s + k, cap - k, "\"ab\":256,\"abc\":257,\"bc\":258},\"merges\":[\"a b\",\"ab c\",\"b c\"]}}");
    return s;
}

static int setup(void **state)
{
    (void)state;
    snprintf(g_dir, sizeof g_dir, "/tmp/dsq_allocfail_XXXXXX");
    if (!mkdtemp(g_dir))
        return -1;
    const char *files[] = {"config.json", "model.safetensors"};
    for (int i = 0; i < 2; i++) {
        char *src = dsq_test_path("tiny");
        char from[512], to[256];
        snprintf(from, sizeof from, "%s/%s", src, files[i]);
        snprintf(to, sizeof to, "%s/%s", g_dir, files[i]);
        free(src);
        if (symlink(from, to) != 0)
            return -1;
    }
    char *tj = small_tokenizer_json();
    write_text(g_dir, "tokenizer.json", tj);
    free(tj);
    write_text(g_dir, "tokenizer_config.json",
               "{\"add_bos_token\":false,\"eos_token\":\"<eos>\",\"bos_token\":\"<think>\"}");
    write_text(g_dir, "generation_config.json",
               "{\"do_sample\":true,\"temperature\":0.6,\"top_p\":0.95,\"top_k\":20}");
    /* cJSON's own allocations go through the failpoints too */
    cJSON_Hooks hooks = {__wrap_malloc, __wrap_free};
    cJSON_InitHooks(&hooks);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    const char *names[] = {"config.json", "model.safetensors", "tokenizer.json",
                           "tokenizer_config.json", "generation_config.json"};
    for (int i = 0; i < 5; i++) {
        char p[256];
        snprintf(p, sizeof p, "%s/%s", g_dir, names[i]);
        unlink(p);
    }
    rmdir(g_dir);
    cJSON_InitHooks(NULL);
    return 0;
}

/* ---- the scenario ------------------------------------------------------------------------ */

typedef struct outcome {
    int32_t sampled;      /* sampler's draw from the last logits */
    int32_t bos, eos;     /* from tokenizer.json + tokenizer_config.json */
    int32_t greedy[3];    /* argmax after prefill and each decode step */
    size_t n_ids;
    int32_t ids[64];      /* tokenize result */
    char text[256];       /* detokenize, then stream, then stopper output */
    char chat[256];
} outcome;

typedef struct run_log {
    int failed_calls;     /* calls that returned an error while armed */
    char bad[512];        /* first violation, "" if none */
} run_log;

static run_log *g_log;

/* A call that may hit the injected failure: if it fails, it must say
 * DSQ_ERR_OUT_OF_MEMORY and `out` (if any) must be NULL; then it is
 * retried with injection off, and must succeed. */
#define CALL(what, expr, outp)                                                                   \
    do {                                                                                         \
        dsq_status st_ = (expr);                                                                 \
        if (st_ != DSQ_OK) {                                                                     \
            g_log->failed_calls++;                                                               \
            if (!g_log->bad[0] && (st_ != DSQ_ERR_OUT_OF_MEMORY || atomic_load(&g_injected) != 1 ||              \
                                   ((outp) && *(void **)(outp))))                                \
                snprintf(g_log->bad, sizeof g_log->bad, "%s: %s (%s)%s%s", what,                 \
                         dsq_status_string(st_), dsq_last_error_message(),                       \
                         atomic_load(&g_injected) != 1 ? " without an injected failure" : "",    \
                         ((outp) && *(void **)(outp)) ? ", out pointer not NULL" : "");          \
            atomic_store(&g_armed, 0);                                                           \
            st_ = (expr);                                                                        \
            if (st_ != DSQ_OK) {                                                                 \
                if (!g_log->bad[0])                                                              \
                    snprintf(g_log->bad, sizeof g_log->bad, "%s: retry after the failure: %s (%s)", \
                             what, dsq_status_string(st_), dsq_last_error_message());            \
                goto out;                                                                        \
            }                                                                                    \
        }                                                                                        \
    } while (0)

static void scenario(outcome *o)
{
    memset(o, 0, sizeof *o);
    dsq_model *m = NULL;
    dsq_ctx *c = NULL;
    dsq_sampler *smp = NULL;
    dsq_detok_stream *ds = NULL;
    dsq_stopper *stp = NULL;
    float *lg = NULL;

    dsq_model_params mp = dsq_model_default_params();
    mp.backend = DSQ_BACKEND_CPU;
    CALL("dsq_model_load", dsq_model_load(g_dir, &mp, &m), &m);
    dsq_model_info mi = {.struct_size = sizeof mi};
    CALL("dsq_model_get_info", dsq_model_get_info(m, &mi), (void **)NULL);
    const dsq_tokenizer *tok = dsq_model_tokenizer(m);
    if (!tok) {
        snprintf(g_log->bad, sizeof g_log->bad, "model loaded without its tokenizer");
        goto out;
    }
    o->bos = dsq_tokenizer_bos(tok);
    o->eos = dsq_tokenizer_eos(tok);

    dsq_ctx_params cp = dsq_ctx_default_params();
    cp.max_context = 64;
    cp.max_seqs = 2;
    cp.kv_layout = DSQ_KV_PAGED;
    cp.kv_block_size = 8;
    cp.max_batch_tokens = 8;
    cp.n_threads = 2;
    CALL("dsq_ctx_new", dsq_ctx_new(m, &cp, &c), &c);
    lg = __real_malloc((size_t)mi.n_vocab * sizeof(float));
    int32_t prompt[12];
    for (int i = 0; i < 12; i++)
        prompt[i] = (int32_t)((i * 53 + 7) % mi.n_vocab);
    CALL("dsq_prefill", dsq_prefill(c, 0, prompt, 12, DSQ_LOGITS_LAST, lg), (void **)NULL);
    o->greedy[0] = (int32_t)dsq_argmax(lg, (size_t)mi.n_vocab);
    for (int s = 0; s < 2; s++) {
        int32_t seq = 0, t = o->greedy[s];
        CALL("dsq_decode_step", dsq_decode_step(c, 1, &seq, &t, lg), (void **)NULL);
        o->greedy[s + 1] = (int32_t)dsq_argmax(lg, (size_t)mi.n_vocab);
    }

    dsq_sampler_params sp = dsq_sampler_default_params();
    CALL("dsq_model_sampler_params", dsq_model_sampler_params(m, &sp), (void **)NULL);
    sp.seed = 42;
    CALL("dsq_sampler_new", dsq_sampler_new(&sp, &smp), &smp);
    CALL("dsq_sampler_accept", dsq_sampler_accept(smp, prompt, 12), (void **)NULL);
    CALL("dsq_sampler_sample", dsq_sampler_sample(smp, lg, mi.n_vocab, &o->sampled), (void **)NULL);

    static const char text[] = "abc abx<eos> caf\xc3\xa9 <think>bc";
    CALL("dsq_tokenize", dsq_tokenize(tok, text, sizeof text - 1, 0, o->ids, 64, &o->n_ids),
         (void **)NULL);
    size_t len = 0;
    CALL("dsq_detokenize", dsq_detokenize(tok, o->ids, o->n_ids, 0, o->text, 128, &len), (void **)NULL);

    CALL("dsq_detok_stream_new", dsq_detok_stream_new(tok, 1, &ds), &ds);
    size_t at = strlen(o->text);
    for (size_t i = 0; i < o->n_ids; i++) {
        CALL("dsq_detok_stream_push", dsq_detok_stream_push(ds, o->ids[i], o->text + at, 200 - at, &len),
             (void **)NULL);
        at += len;
    }
    const char *stops[] = {"bx", "caf"};
    CALL("dsq_stopper_new", dsq_stopper_new(tok, stops, 2, 1, &stp), &stp);
    for (size_t i = 0; i < o->n_ids; i++) {
        int stopped = 0;
        CALL("dsq_stopper_push", dsq_stopper_push(stp, o->ids[i], o->text + at, 250 - at, &len, &stopped),
             (void **)NULL);
        at += len;
        if (stopped)
            break;
    }
    dsq_chat_message msgs[2] = {{DSQ_ROLE_SYSTEM, "be brief"}, {DSQ_ROLE_USER, "hi"}};
    CALL("dsq_chat_format", dsq_chat_format(msgs, 2, 1, o->chat, sizeof o->chat, &len), (void **)NULL);
out:
    atomic_store(&g_armed, 0);
    dsq_stopper_free(stp);
    dsq_detok_stream_free(ds);
    dsq_sampler_free(smp);
    __real_free(lg);
    dsq_ctx_free(c);
    dsq_model_free(m);
}

/* Quantized weights (lib/weights_quant.c, lib/model_save.c): loading a
 * quantized checkpoint (AWQ: repacked; dsqwen Q4 + int8 head: copied), and a
 * bf16 one quantized at load (Q4 + int8 head), a prefill, and the AWQ model
 * saved (dsq_model_save) into a scratch directory. */
static const char *g_qdir;
static int g_qmode;
static char g_save_dir[64];

static void scenario_quant(outcome *o)
{
    memset(o, 0, sizeof *o);
    dsq_model *m = NULL;
    dsq_ctx *c = NULL;
    float *lg = NULL;
    dsq_model_params mp = dsq_model_default_params();
    mp.backend = DSQ_BACKEND_CPU;
    mp.n_threads = 1;
    mp.quantize = g_qmode;
    mp.quantize_head = g_qmode != 0;
    CALL("dsq_model_load", dsq_model_load(g_qdir, &mp, &m), &m);
    dsq_model_info mi = {.struct_size = sizeof mi};
    CALL("dsq_model_get_info", dsq_model_get_info(m, &mi), (void **)NULL);
    dsq_ctx_params cp = dsq_ctx_default_params();
    cp.max_context = 16;
    cp.n_threads = 1;
    CALL("dsq_ctx_new", dsq_ctx_new(m, &cp, &c), &c);
    lg = __real_malloc((size_t)mi.n_vocab * sizeof(float));
    const int32_t prompt[3] = {5, 17, 300};
    CALL("dsq_prefill", dsq_prefill(c, 0, prompt, 3, DSQ_LOGITS_LAST, lg), (void **)NULL);
    o->greedy[0] = (int32_t)dsq_argmax(lg, (size_t)mi.n_vocab);
    if (g_save_dir[0])
        CALL("dsq_model_save", dsq_model_save(m, g_save_dir), (void **)NULL);
out:
    atomic_store(&g_armed, 0);
    __real_free(lg);
    dsq_ctx_free(c);
    dsq_model_free(m);
}

static void every_point(void (*scenario)(outcome *));

static void test_every_allocation_fails_once(void **state)
{
    (void)state;
    every_point(scenario);
}

static void test_quantized_every_allocation_fails_once(void **state)
{
    (void)state;
    static const struct {
        const char *dir;
        int mode, save;
    } cases[] = {{"quant_tiny/awq", 0, 1}, {"quant_tiny/q4h", 0, 0}, {"quant_tiny/bf16", DSQ_QUANTIZE_Q4, 0}};
    snprintf(g_save_dir, sizeof g_save_dir, "/tmp/dsq_allocfail_save_XXXXXX");
    assert_non_null(mkdtemp(g_save_dir));
    char keep[64];
    snprintf(keep, sizeof keep, "%s", g_save_dir);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *d = dsq_test_path(cases[i].dir);
        g_qdir = d;
        g_qmode = cases[i].mode;
        if (!cases[i].save)
            g_save_dir[0] = '\0';
        printf("  %s%s%s:\n", cases[i].dir, cases[i].mode ? " quantized at load" : "",
               cases[i].save ? " + dsq_model_save" : "");
        every_point(scenario_quant);
        free(d);
    }
    const char *names[] = {"config.json", "model.safetensors"};
    for (int i = 0; i < 2; i++) {
        char p[128];
        snprintf(p, sizeof p, "%s/%s", keep, names[i]);
        unlink(p);
    }
    rmdir(keep);
}

static void every_point(void (*scenario)(outcome *))
{
    run_log log;
    outcome clean, o;

    /* clean run: count the points (twice: the count must be stable) */
    long total[2];
    for (int r = 0; r < 2; r++) {
        memset(&log, 0, sizeof log);
        g_log = &log;
        atomic_store(&g_seen, 0);
        g_fail_at = 0;
        atomic_store(&g_injected, 0);
        long live0 = atomic_load(&g_live);
        atomic_store(&g_armed, 1);
        scenario(r ? &o : &clean);
        assert_int_equal(atomic_load(&g_live), live0);
        total[r] = atomic_load(&g_seen);
        if (log.bad[0] || log.failed_calls)
            printf("clean run: %s\n", log.bad);
        assert_int_equal(log.failed_calls, 0);
    }
    printf("  %ld allocation points in the scenario\n", total[0]);
    assert_int_equal(total[0], total[1]);
    assert_true(total[0] > 100);
    assert_memory_equal(&o, &clean, sizeof o);
    int lsan = __lsan_do_recoverable_leak_check != NULL;
    if (lsan && __lsan_do_recoverable_leak_check() != 0)
        fail_msg("leaks after the clean runs");

    /* every n up to LIMIT, then a stride (the count is small today; the
     * bound keeps CI time fixed if it grows) */
    const long LIMIT = 4000;
    long stride = total[0] <= LIMIT ? 1 : (total[0] - LIMIT) / 500 + 1;
    int n_bad = 0, n_runs = 0, n_leaky = 0, n_absorbed = 0;
    for (long n = 1; n <= total[0]; n += n <= LIMIT ? 1 : stride) {
        memset(&log, 0, sizeof log);
        g_log = &log;
        atomic_store(&g_seen, 0);
        g_fail_at = n;
        atomic_store(&g_injected, 0);
        long live0 = atomic_load(&g_live);
        atomic_store(&g_armed, 1);
        scenario(&o);
        n_runs++;
        long leaked = atomic_load(&g_live) - live0;
        /* LeakSanitizer scans the heap (slow): every 64th run and the last */
        if (lsan && (leaked || n % 64 == 0 || n == total[0]) && __lsan_do_recoverable_leak_check() != 0 &&
            !leaked)
            leaked = -1; /* LSan saw what the count did not */
        if (!log.bad[0] && !atomic_load(&g_injected))
            snprintf(log.bad, sizeof log.bad, "no failure injected (the point count moved)");
        if (!log.bad[0] && memcmp(&o, &clean, sizeof o) != 0)
            snprintf(log.bad, sizeof log.bad, "results differ from the clean run");
        /* a failure the library absorbed with the same results (e.g. PCRE2
         * JIT compilation failing: the interpreter takes over) is fine */
        if (!log.bad[0] && log.failed_calls == 0 && n_absorbed++ < 10)
            printf("  n=%ld: absorbed (no call failed, same results)\n", n);
        if (log.bad[0] || leaked) {
            n_bad++;
            n_leaky += leaked != 0;
            if (n_bad <= 40)
                printf("  n=%ld: %s%s\n", n, log.bad[0] ? log.bad : "ok",
                       leaked > 0 ? " [leak: blocks not given back]" : leaked ? " [leak: LSan report above]" : "");
        }
    }
    printf("  %d runs (points 1..%ld%s), %d bad, %d leaking, %d absorbed; block count checked every "
           "run, LSan %s\n",
           n_runs, total[0] < LIMIT ? total[0] : LIMIT, total[0] > LIMIT ? ", then a stride" : "", n_bad,
           n_leaky, n_absorbed, lsan ? "every 64th run" : "off (no ASan)");
    assert_int_equal(n_bad, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_allocation_fails_once),
        cmocka_unit_test(test_quantized_every_allocation_fails_once),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
