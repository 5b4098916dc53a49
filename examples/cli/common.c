/* common.c - model/context/sampler setup, tokenizing, streamed output and
 * timing shared by the dsqwen subcommands. */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"

int cli_report(dsq_status st, const char *what)
{
    const char *msg = dsq_last_error_message();
    fprintf(stderr, "dsqwen: %s: %s%s%s\n", what, dsq_status_string(st), msg[0] ? ": " : "",
            msg);
    return 1;
}

double cli_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* --verbose: the library's log messages, as they come. */
static void log_to_stderr(dsq_log_level level, const char *msg, void *user)
{
    static const char *const names[] = { "error", "warning", "info", "debug" };
    (void)user;
    fprintf(stderr, "dsqwen: libdsqwen %s: %s\n",
            level >= DSQ_LOG_ERROR && level <= DSQ_LOG_DEBUG ? names[level] : "log", msg);
}

/* A load progress bar on stderr (a terminal): redrawn when the percentage
 * changes, erased when the load ends. */
typedef struct load_bar {
    int last_pct;
} load_bar;

static int draw_load_bar(float fraction, void *user)
{
    load_bar *b = user;
    int pct = (int)(fraction * 100.0f + 0.5f);
    if (pct == b->last_pct)
        return 0;
    b->last_pct = pct;
    enum { WIDTH = 30 };
    char bar[WIDTH + 1];
    int fill = pct * WIDTH / 100;
    for (int i = 0; i < WIDTH; i++)
        bar[i] = i < fill ? '#' : ' ';
    bar[WIDTH] = '\0';
    fprintf(stderr, "\rloading the model [%s] %3d%%", bar, pct);
    fflush(stderr);
    return 0;
}

static const char *backend_name(int32_t b)
{
    return b == DSQ_BACKEND_CUDA ? "cuda" : b == DSQ_BACKEND_CPU ? "cpu" : "auto";
}

static const char *kv_name(int32_t d)
{
    return d == DSQ_KV_INT8 ? "int8" : d == DSQ_KV_F32 ? "f32" : "f16";
}

int cli_session_open(cli_session *s, const cli_opts *o, int32_t max_seqs, int32_t max_batch)
{
    memset(s, 0, sizeof *s);
    s->think_open = s->think_close = -1;

    if (o->verbose)
        dsq_set_log_callback(log_to_stderr, NULL, DSQ_LOG_INFO);
    dsq_model_params mp = dsq_model_default_params();
    mp.backend = o->backend;
    mp.n_threads = o->threads;
    mp.quantize = o->quantize;
    mp.quantize_head = o->quantize_head;
    load_bar bar = { -1 };
    if (o->progress) {
        mp.progress = draw_load_bar;
        mp.progress_user = &bar;
    }
    if (o->verbose)
        fprintf(stderr, "dsqwen: loading %s (backend %s requested%s)\n", o->model,
                backend_name(o->backend),
                o->backend == DSQ_BACKEND_AUTO
                    ? (dsq_backend_available(DSQ_BACKEND_CUDA) ? ": a CUDA device is usable"
                                                               : ": no CUDA, so cpu")
                    : "");
    double t0 = cli_now();
    dsq_status st = dsq_model_load(o->model, &mp, &s->model);
    double t_load = cli_now() - t0;
    if (o->progress && bar.last_pct >= 0) {
        fputs("\r\033[K", stderr); /* erase the bar */
        fflush(stderr);
    }
    if (st != DSQ_OK) {
        cli_report(st, "loading the model");
        return 1;
    }
    s->info.struct_size = sizeof s->info;
    if ((st = dsq_model_get_info(s->model, &s->info)) != DSQ_OK)
        goto fail_report;
    s->tok = dsq_model_tokenizer(s->model);

    dsq_ctx_params cp = dsq_ctx_default_params();
    cp.max_seqs = max_seqs;
    if (o->ctx > 0)
        cp.max_context = o->ctx;
    if (o->kv_dtype >= 0)
        cp.kv_dtype = o->kv_dtype;
    cp.kv_layout = o->kv_layout;
    cp.n_threads = o->threads;
    if (cp.kv_layout == DSQ_KV_PAGED && o->ctx > 0) {
        /* the default pool (max_seqs * max_context tokens, whole blocks)
         * falls one block short per sequence when --ctx is not a multiple of
         * the block size */
        int64_t per_seq = ((int64_t)o->ctx + cp.kv_block_size - 1) / cp.kv_block_size;
        cp.kv_pool_tokens = per_seq * cp.kv_block_size * max_seqs;
    }
    if (o->batch_tokens > 0)
        cp.max_batch_tokens = o->batch_tokens;
    if (max_batch > cp.max_batch_tokens)
        cp.max_batch_tokens = max_batch;
    if ((st = dsq_ctx_new(s->model, &cp, &s->ctx)) != DSQ_OK)
        goto fail_report;
    dsq_ctx_info ci;
    memset(&ci, 0, sizeof ci);
    ci.struct_size = sizeof ci;
    if ((st = dsq_ctx_get_info(s->ctx, &ci)) != DSQ_OK)
        goto fail_report;
    s->max_context = ci.max_context;
    if (o->verbose) {
        const dsq_model_info *mi = &s->info;
        fprintf(stderr, "dsqwen: backend %s", backend_name(mi->backend));
        if (mi->backend == DSQ_BACKEND_CUDA)
            fprintf(stderr, ", CUDA device %d, %.2f GB of weights on the device", (int)mp.device,
                    (double)mi->device_bytes / 1e9);
        else
            fprintf(stderr, ", %d threads", (int)ci.n_threads);
        fprintf(stderr, "; loaded in %.2f s\n", t_load);
        fprintf(stderr, "dsqwen: model: %d layers, hidden %d, %d heads (%d KV) x %d, MLP %d, vocab "
                        "%d, %.1f M parameters (%.2f GB), max context %d, tokenizer %s\n",
                (int)mi->n_layers, (int)mi->n_embd, (int)mi->n_heads, (int)mi->n_kv_heads,
                (int)mi->head_dim, (int)mi->n_ff, (int)mi->n_vocab, (double)mi->n_params / 1e6,
                (double)mi->weight_bytes / 1e9, (int)mi->max_context, s->tok ? "yes" : "no");
        fprintf(stderr, "dsqwen: context: %d sequence(s) x %d tokens, KV %s %s, %.1f MB\n",
                (int)ci.max_seqs, (int)ci.max_context, kv_name(ci.kv_dtype),
                ci.kv_layout == DSQ_KV_PAGED ? "paged" : "static", (double)ci.kv_bytes / 1e6);
    }

    /* The model's own settings (generation_config.json over the library
     * defaults; n_vocab_valid masks the embedding's padding rows past the
     * tokenizer's last id), then what the command line changed. */
    dsq_sampler_params sp = dsq_sampler_default_params();
    if ((st = dsq_model_sampler_params(s->model, &sp)) != DSQ_OK)
        goto fail_report;
    const dsq_sampler_params *c = &o->sp;
    if (o->sp_set & CLI_SP_TEMPERATURE) sp.temperature = c->temperature;
    if (o->sp_set & CLI_SP_TOP_P) sp.top_p = c->top_p;
    if (o->sp_set & CLI_SP_TOP_K) sp.top_k = c->top_k;
    if (o->sp_set & CLI_SP_MIN_P) sp.min_p = c->min_p;
    if (o->sp_set & CLI_SP_PENALTY) sp.repetition_penalty = c->repetition_penalty;
    if (o->sp_set & CLI_SP_PENALTY_N) sp.penalty_last_n = c->penalty_last_n;
    if (o->sp_set & CLI_SP_SEED) sp.seed = c->seed;
    s->sp = sp;
    s->n_vocab_valid = sp.n_vocab_valid > 0 ? sp.n_vocab_valid : s->info.n_vocab;
    if ((st = dsq_sampler_new(&sp, &s->sampler)) != DSQ_OK)
        goto fail_report;
    if (o->verbose && strcmp(o->cmd, "bench") != 0)
        fprintf(stderr, "dsqwen: sampling: temperature %g, top-p %g, top-k %d, min-p %g, "
                        "repeat penalty %g over %d, seed %llu\n",
                (double)sp.temperature, (double)sp.top_p, (int)sp.top_k, (double)sp.min_p,
                (double)sp.repetition_penalty, (int)sp.penalty_last_n,
                (unsigned long long)sp.seed);
    if (o->n_stops > 0 && !s->tok) {
        fprintf(stderr, "dsqwen: --stop needs the model's tokenizer.json (this model has none)\n");
        cli_session_close(s);
        return 1;
    }
    s->stops = o->stops;
    s->n_stops = o->n_stops;

    s->eos = s->tok ? dsq_tokenizer_eos(s->tok) : -1;
    if (s->eos < 0)
        s->eos = s->info.eos_token;
    if (s->tok) {
        s->think_open = dsq_tokenizer_token_id(s->tok, "<think>");
        s->think_close = dsq_tokenizer_token_id(s->tok, "</think>");
    }
    s->logits = malloc(sizeof(float) * (size_t)max_seqs * (size_t)s->info.n_vocab);
    if (!s->logits) {
        fprintf(stderr, "dsqwen: no memory for the logits buffer\n");
        cli_session_close(s);
        return 1;
    }
    return 0;

fail_report:
    cli_report(st, "setting up the model");
    cli_session_close(s);
    return 1;
}

dsq_sample_params cli_sample_params(const cli_session *s)
{
    dsq_sample_params p = dsq_sample_default_params();
    p.temperature = s->sp.temperature > 0.0f ? s->sp.temperature : 0.0f;
    p.top_k = s->sp.top_k;
    p.top_p = s->sp.top_p;
    p.min_p = s->sp.min_p;
    p.repetition_penalty = s->sp.repetition_penalty;
    p.penalty_last_n = s->sp.penalty_last_n < DSQ_PENALTY_MAX_N ? s->sp.penalty_last_n : DSQ_PENALTY_MAX_N;
    p.seed = s->sp.seed;
    p.n_vocab_valid = s->n_vocab_valid;
    return p;
}

void cli_session_close(cli_session *s)
{
    dsq_set_log_callback(NULL, NULL, DSQ_LOG_ERROR);
    free(s->logits);
    dsq_sampler_free(s->sampler);
    dsq_ctx_free(s->ctx);
    dsq_model_free(s->model);
    memset(s, 0, sizeof *s);
}

int cli_parse_list(const char *name, const char *list, long lo, long hi, int32_t **out,
                   int32_t *n)
{
    *out = NULL;
    *n = 0;
    size_t cap = 1;
    for (const char *p = list; *p; p++)
        cap += *p == ',';
    int32_t *v = malloc(sizeof(int32_t) * cap);
    if (!v) {
        fprintf(stderr, "dsqwen: no memory\n");
        return 1;
    }
    const char *p = list;
    int32_t k = 0;
    for (;;) {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        char *end;
        errno = 0;
        long x = strtol(p, &end, 10);
        if (len == 0 || end != p + len || errno || x < lo || x > hi || isspace((unsigned char)*p)) {
            fprintf(stderr, "dsqwen: %s: '%.*s' is not an integer in %ld..%ld (expected a list "
                            "like 1,2,3)\n", name, (int)len, p, lo, hi);
            free(v);
            return 1;
        }
        v[k++] = (int32_t)x;
        if (!comma)
            break;
        p = comma + 1;
    }
    *out = v;
    *n = k;
    return 0;
}

int cli_tokvec_push(cli_tokvec *t, const int32_t *ids, int32_t n)
{
    if (n <= 0)
        return 0;
    if (t->n + n > t->cap) {
        int32_t cap = t->cap ? t->cap : 256;
        while (cap < t->n + n)
            cap *= 2;
        int32_t *nv = realloc(t->v, sizeof(int32_t) * (size_t)cap);
        if (!nv) {
            fprintf(stderr, "dsqwen: no memory\n");
            return 1;
        }
        t->v = nv;
        t->cap = cap;
    }
    memcpy(t->v + t->n, ids, sizeof(int32_t) * (size_t)n);
    t->n += n;
    return 0;
}

void cli_tokvec_free(cli_tokvec *t)
{
    free(t->v);
    memset(t, 0, sizeof *t);
}

int cli_tokenize(const cli_session *s, const char *text, int add_bos, int32_t **ids,
                 int32_t *n)
{
    *ids = NULL;
    *n = 0;
    if (!s->tok) {
        fprintf(stderr, "dsqwen: this model directory has no tokenizer.json; give the prompt "
                        "as token ids with --tokens 1,2,3\n");
        return 1;
    }
    uint32_t flags = add_bos ? DSQ_TOKENIZE_ADD_SPECIAL : 0u;
    size_t len = strlen(text), need = 0;
    dsq_status st = dsq_tokenize(s->tok, text, len, flags, NULL, 0, &need);
    if (st != DSQ_OK && st != DSQ_ERR_BUFFER_TOO_SMALL)
        return cli_report(st, "tokenizing the prompt");
    int32_t *v = malloc(sizeof(int32_t) * (need ? need : 1));
    if (!v) {
        fprintf(stderr, "dsqwen: no memory\n");
        return 1;
    }
    st = dsq_tokenize(s->tok, text, len, flags, v, need, &need);
    if (st != DSQ_OK) {
        free(v);
        return cli_report(st, "tokenizing the prompt");
    }
    *ids = v;
    *n = (int32_t)need;
    return 0;
}

/* ---- streamed output ------------------------------------------------------- */

int cli_printer_init(cli_printer *p, const cli_session *s, int show_thinking,
                     const int32_t *prompt, int32_t n_prompt)
{
    memset(p, 0, sizeof *p);
    p->s = s;
    p->show_thinking = show_thinking;
    if (!s->tok)
        return 0;
    /* EOS never reaches the printer (cli_run_turn stops first), so the
     * stopper only looks for the --stop strings */
    dsq_status st = dsq_stopper_new(s->tok, s->stops, s->n_stops, 0, &p->stopper);
    if (st != DSQ_OK)
        return cli_report(st, "creating the stop-string matcher");
    for (int32_t i = 0; i < n_prompt; i++) {
        if (prompt[i] == s->think_open)
            p->in_think = 1;
        else if (prompt[i] == s->think_close)
            p->in_think = 0;
    }
    /* The generation prompt ends in "<think>\n": show where the thought
     * starts, since that tag was part of the prompt, not of the output --
     * but only once there is output, so nothing stray follows an error. */
    p->open_pending = p->in_think && show_thinking;
    return 0;
}

static void put_pending_open(cli_printer *p)
{
    if (p->open_pending) {
        fputs("<think>\n", stdout);
        p->open_pending = 0;
    }
}

static void put_text(cli_printer *p, const char *text, size_t len)
{
    if (p->in_think && !p->show_thinking)
        return;
    if (len > 0)
        put_pending_open(p);
    if (p->skip_space) {
        while (len > 0 && isspace((unsigned char)*text)) {
            text++;
            len--;
        }
        if (len == 0)
            return;
        p->skip_space = 0;
    }
    fwrite(text, 1, len, stdout);
    fflush(stdout);
}

/* Text the stopper releases for `token` (flush when token < 0) into p->buf,
 * growing it when the stopper asks for more room. */
static int stopper_text(cli_printer *p, int32_t token, size_t *len)
{
    for (;;) {
        int stopped = 0;
        dsq_status st = token >= 0 ? dsq_stopper_push(p->stopper, token, p->buf, p->buf_cap,
                                                      len, &stopped)
                                   : dsq_stopper_flush(p->stopper, p->buf, p->buf_cap, len);
        if (st == DSQ_OK) {
            p->stopped |= stopped;
            return 0;
        }
        if (st != DSQ_ERR_BUFFER_TOO_SMALL)
            return cli_report(st, "detokenizing");
        size_t cap = *len + 1 > 2 * p->buf_cap ? *len + 1 : 2 * p->buf_cap;
        char *nb = realloc(p->buf, cap);
        if (!nb) {
            fprintf(stderr, "dsqwen: no memory\n");
            return 1;
        }
        p->buf = nb;
        p->buf_cap = cap;
    }
}

int cli_printer_push(cli_printer *p, int32_t token)
{
    const cli_session *s = p->s;
    size_t len = 0;
    if (!p->stopper) {
        printf("%s%d", p->printed_ids++ ? " " : "", (int)token);
        fflush(stdout);
        return 0;
    }
    if (token == s->eos)
        return 0;
    if (token == s->think_open || token == s->think_close) {
        int open = token == s->think_open;
        /* what was held back belongs to the side of the tag it came from */
        if (stopper_text(p, -1, &len))
            return 1;
        put_text(p, p->buf, len);
        if (p->show_thinking) {
            put_pending_open(p);
            fputs(open ? "<think>" : "</think>", stdout);
            fflush(stdout);
        } else if (!open) {
            /* the answer after a hidden thought usually starts with blank
             * lines that belonged to the thought's layout */
            p->skip_space = 1;
        }
        p->in_think = open;
        return 0;
    }
    if (stopper_text(p, token, &len))
        return 1;
    put_text(p, p->buf, len);
    return 0;
}

int cli_printer_finish(cli_printer *p)
{
    if (p->stopper) { /* after a stop this writes nothing */
        size_t len = 0;
        if (stopper_text(p, -1, &len))
            return 1;
        put_text(p, p->buf, len);
    }
    fputc('\n', stdout);
    fflush(stdout);
    return 0;
}

void cli_printer_free(cli_printer *p)
{
    dsq_stopper_free(p->stopper);
    p->stopper = NULL;
    free(p->buf);
    p->buf = NULL;
    p->buf_cap = 0;
}
