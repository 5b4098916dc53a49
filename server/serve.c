/* serve.c - `dsqwen serve`: options, model and context setup, the server's
 * life (start, wait for SIGINT/SIGTERM, drain, free). */
#include <errno.h>
#include <getopt.h>
#include <microhttpd.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "serve.h"
#include "serve_main.h"

static const double TTFT_LE[SRV_TTFT_BUCKETS - 1] = { 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                                                      1,    2.5,   5,    10,  30,   60 };
static const double ITL_LE[SRV_ITL_BUCKETS - 1] = { 0.001, 0.0025, 0.005, 0.01, 0.02, 0.04,
                                                    0.08,  0.16,   0.32,  0.64, 1.28 };
static const double BATCH_LE[SRV_BATCH_BUCKETS - 1] = { 1, 2, 4, 8, 16, 32, 64, 128, 256 };
/* step and host time per step: 50 us .. 1 s */
static const double STEP_LE[SRV_STEP_BUCKETS - 1] = { 0.00005, 0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.003,
                                                      0.005,   0.0075, 0.01,   0.02,   0.05,  1.0 };

enum {
    O_MODEL = 256, O_NAME, O_HOST, O_PORT, O_API_KEY, O_BACKEND, O_KV, O_CTX, O_MAX_SEQS,
    O_POOL, O_BATCH, O_CHUNK, O_QUEUE, O_RETRY, O_PREFIX, O_PREFIX_MIN, O_MAX_BODY, O_MAX_CONN,
    O_THREADS, O_INLINE, O_VERBOSE, O_NO_OVERLAP, O_HELP
};

static const struct option longopts[] = {
    { "model", required_argument, NULL, O_MODEL },
    { "served-model-name", required_argument, NULL, O_NAME },
    { "host", required_argument, NULL, O_HOST },
    { "port", required_argument, NULL, O_PORT },
    { "api-key", required_argument, NULL, O_API_KEY },
    { "backend", required_argument, NULL, O_BACKEND },
    { "kv", required_argument, NULL, O_KV },
    { "ctx", required_argument, NULL, O_CTX },
    { "max-seqs", required_argument, NULL, O_MAX_SEQS },
    { "kv-pool-tokens", required_argument, NULL, O_POOL },
    { "batch-tokens", required_argument, NULL, O_BATCH },
    { "prefill-chunk", required_argument, NULL, O_CHUNK },
    { "max-queue", required_argument, NULL, O_QUEUE },
    { "retry-after", required_argument, NULL, O_RETRY },
    { "prefix-cache", required_argument, NULL, O_PREFIX },
    { "prefix-min", required_argument, NULL, O_PREFIX_MIN },
    { "max-body", required_argument, NULL, O_MAX_BODY },
    { "max-connections", required_argument, NULL, O_MAX_CONN },
    { "threads", required_argument, NULL, O_THREADS },
    { "reasoning-inline", no_argument, NULL, O_INLINE },
    { "verbose", no_argument, NULL, O_VERBOSE },
    { "no-overlap", no_argument, NULL, O_NO_OVERLAP },
    { "help", no_argument, NULL, O_HELP },
    { NULL, 0, NULL, 0 },
};

static void usage(FILE *f)
{
    fputs(
        "usage: dsqwen serve --model DIR [options]\n"
        "\n"
        "An OpenAI-compatible HTTP server with continuous batching:\n"
        "POST /v1/chat/completions, POST /v1/completions (streaming or not),\n"
        "GET /v1/models, /health, /metrics (Prometheus).  SIGINT/SIGTERM stop it.\n"
        "\n"
        "options:\n"
        "  --model DIR               model directory (config.json, safetensors, tokenizer.json)\n"
        "  --served-model-name NAME  the model id clients see (default: the directory name)\n"
        "  --host ADDR               address to bind (default 127.0.0.1; 0.0.0.0 for all)\n"
        "  --port N                  TCP port (default 8000; 0 = any free port, printed)\n"
        "  --api-key KEY             require 'Authorization: Bearer KEY' on /v1/*\n"
        "                            (default: $DSQWEN_API_KEY, else no key)\n"
        "  --backend auto|cpu|cuda   compute backend (default auto)\n"
        "  --kv f16|int8|f32         KV cache storage (default f16; f32 CPU only)\n"
        "  --ctx N                   max tokens per request, prompt + reply (default: the\n"
        "                            library's, min(4096, model))\n"
        "  --max-seqs N              requests generating at once (default 16)\n"
        "  --kv-pool-tokens N        paged KV pool size in tokens (default max-seqs x ctx)\n"
        "  --batch-tokens N          most tokens in one step (default 384, or --max-seqs\n"
        "                            when larger)\n"
        "  --prefill-chunk N         most prompt tokens of one request per step (default 256)\n"
        "  --max-queue N             requests that may wait for room before 429 (default 64)\n"
        "  --retry-after S           Retry-After seconds of a 429 (default 1)\n"
        "  --prefix-cache N          cached prompt prefixes shared by fork (default 4; 0 off)\n"
        "  --prefix-min N            shortest prefix worth caching, tokens (default 32)\n"
        "  --max-body BYTES          largest request body (default 4194304)\n"
        "  --max-connections N       open connections (default 256)\n"
        "  --threads N               CPU backend threads (default 0 = all cores)\n"
        "  --reasoning-inline        keep <think>...</think> in 'content' instead of\n"
        "                            returning it as 'reasoning_content'\n"
        "  --no-overlap              format each step's tokens before the next step\n"
        "                            instead of while it runs (lower latency per\n"
        "                            token, lower throughput; for comparison)\n"
        "  --verbose                 the library's log messages\n"
        "\n"
        "exit status: 0 stopped by SIGINT/SIGTERM, 1 runtime failure, 2 usage error\n",
        f);
}

static int num(const char *opt, const char *v, long long lo, long long hi, long long *out)
{
    char *end;
    errno = 0;
    long long x = strtoll(v, &end, 10);
    if (errno || end == v || *end || x < lo || x > hi) {
        fprintf(stderr, "dsqwen serve: --%s: '%s' is not an integer in %lld..%lld\n", opt, v, lo,
                hi);
        return -1;
    }
    *out = x;
    return 0;
}

int srv_parse_args(int argc, char **argv, srv_opts *o)
{
    memset(o, 0, sizeof *o);
    o->host = "127.0.0.1";
    o->port = 8000;
    o->backend = DSQ_BACKEND_AUTO;
    o->kv_dtype = -1;
    o->max_seqs = 16;
    o->batch_tokens = 0; /* not given: 384, or max_seqs when larger (below) */
    o->prefill_chunk = 256;
    o->max_queue = 64;
    o->retry_after = 1;
    o->prefix_slots = 4;
    o->prefix_min = 32;
    o->max_body = 4u << 20;
    o->max_connections = 256;
    o->api_key = getenv("DSQWEN_API_KEY");
    if (o->api_key && !o->api_key[0])
        o->api_key = NULL;
    optind = 1;
    opterr = 0;
    int c;
    long long v;
    while ((c = getopt_long(argc, argv, ":", longopts, NULL)) != -1) {
        const char *name = "";
        for (const struct option *p = longopts; p->name; p++)
            if (p->val == c)
                name = p->name;
        switch (c) {
        case O_MODEL: o->model = optarg; break;
        case O_NAME: o->served_name = optarg; break;
        case O_HOST: o->host = optarg; break;
        case O_API_KEY: o->api_key = optarg[0] ? optarg : NULL; break;
        case O_INLINE: o->reasoning_inline = 1; break;
        case O_VERBOSE: o->verbose = 1; break;
        case O_NO_OVERLAP: o->no_overlap = 1; break;
        case O_HELP: usage(stdout); return 0;
        case O_BACKEND:
            if (!strcmp(optarg, "auto")) o->backend = DSQ_BACKEND_AUTO;
            else if (!strcmp(optarg, "cpu")) o->backend = DSQ_BACKEND_CPU;
            else if (!strcmp(optarg, "cuda")) o->backend = DSQ_BACKEND_CUDA;
            else {
                fprintf(stderr, "dsqwen serve: --backend: '%s' (auto, cpu or cuda)\n", optarg);
                return 2;
            }
            break;
        case O_KV:
            if (!strcmp(optarg, "f16")) o->kv_dtype = DSQ_KV_F16;
            else if (!strcmp(optarg, "int8")) o->kv_dtype = DSQ_KV_INT8;
            else if (!strcmp(optarg, "f32")) o->kv_dtype = DSQ_KV_F32;
            else {
                fprintf(stderr, "dsqwen serve: --kv: '%s' (f16, int8 or f32)\n", optarg);
                return 2;
            }
            break;
        case O_PORT: if (num(name, optarg, 0, 65535, &v)) return 2; o->port = (int)v; break;
        case O_CTX: if (num(name, optarg, 2, 1 << 24, &v)) return 2; o->ctx = (int32_t)v; break;
        case O_MAX_SEQS: if (num(name, optarg, 1, 4096, &v)) return 2; o->max_seqs = (int32_t)v; break;
        case O_POOL: if (num(name, optarg, 1, 1LL << 40, &v)) return 2; o->kv_pool_tokens = v; break;
        case O_BATCH: if (num(name, optarg, 1, 1 << 20, &v)) return 2; o->batch_tokens = (int32_t)v; break;
        case O_CHUNK: if (num(name, optarg, 1, 1 << 20, &v)) return 2; o->prefill_chunk = (int32_t)v; break;
        case O_QUEUE: if (num(name, optarg, 0, 1 << 20, &v)) return 2; o->max_queue = (int32_t)v; break;
        case O_RETRY: if (num(name, optarg, 1, 3600, &v)) return 2; o->retry_after = (int32_t)v; break;
        case O_PREFIX: if (num(name, optarg, 0, 256, &v)) return 2; o->prefix_slots = (int32_t)v; break;
        case O_PREFIX_MIN: if (num(name, optarg, 1, 1 << 24, &v)) return 2; o->prefix_min = (int32_t)v; break;
        case O_MAX_BODY: if (num(name, optarg, 64, 1LL << 32, &v)) return 2; o->max_body = (size_t)v; break;
        case O_MAX_CONN: if (num(name, optarg, 1, 65536, &v)) return 2; o->max_connections = (int32_t)v; break;
        case O_THREADS: if (num(name, optarg, 0, 1024, &v)) return 2; o->threads = (int32_t)v; break;
        case ':':
            fprintf(stderr, "dsqwen serve: %s needs a value\n", argv[optind - 1]);
            return 2;
        default:
            fprintf(stderr, "dsqwen serve: unknown option '%s' (dsqwen serve --help)\n",
                    argv[optind - 1]);
            return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "dsqwen serve: unexpected argument '%s'\n", argv[optind]);
        return 2;
    }
    if (!o->model) {
        fprintf(stderr, "dsqwen serve: --model DIR is required (dsqwen serve --help)\n");
        return 2;
    }
    /* 384: on the H200, 64 streaming clients with 512-token prompts got p99
     * inter-token 1.82-1.91x the decode step over 8 runs at 88-91% of
     * `dsqwen bench`'s prefill-included rate; 512 gave 2.0-2.95x at 91-96%
     * (docs/performance.md, 2026-12-04, stop 22) */
    if (o->batch_tokens == 0)
        o->batch_tokens = o->max_seqs > 384 ? o->max_seqs : 384;
    if (o->batch_tokens < o->max_seqs) {
        fprintf(stderr, "dsqwen serve: --batch-tokens (%d) must be at least --max-seqs (%d): "
                        "every generating request feeds one token per step\n",
                (int)o->batch_tokens, (int)o->max_seqs);
        return 2;
    }
    return -1;
}

static void log_to_stderr(dsq_log_level level, const char *msg, void *user)
{
    (void)user;
    fprintf(stderr, "dsqwen serve: libdsqwen %s: %s\n",
            level == DSQ_LOG_ERROR ? "error" : level == DSQ_LOG_WARN ? "warning" : "info", msg);
}

static int report(dsq_status st, const char *what)
{
    fprintf(stderr, "dsqwen serve: %s: %s: %s\n", what, dsq_status_string(st),
            dsq_last_error_message());
    return 1;
}

/* Model, context and defaults. */
static int setup(srv *s)
{
    const srv_opts *o = &s->o;
    if (o->verbose)
        dsq_set_log_callback(log_to_stderr, NULL, DSQ_LOG_INFO);
    dsq_model_params mp = dsq_model_default_params();
    mp.backend = o->backend;
    mp.n_threads = o->threads;
    dsq_status st = dsq_model_load(o->model, &mp, &s->model);
    if (st != DSQ_OK)
        return report(st, "loading the model");
    dsq_model_info mi;
    memset(&mi, 0, sizeof mi);
    mi.struct_size = sizeof mi;
    if ((st = dsq_model_get_info(s->model, &mi)) != DSQ_OK)
        return report(st, "model info");
    s->n_vocab = mi.n_vocab;
    s->tok = dsq_model_tokenizer(s->model);
    if (!s->tok) {
        fprintf(stderr, "dsqwen serve: %s has no tokenizer.json; the server needs one\n",
                o->model);
        return 1;
    }
    s->eos = dsq_tokenizer_eos(s->tok);
    s->think_close = dsq_tokenizer_token_id(s->tok, "</think>");

    dsq_ctx_params cp = dsq_ctx_default_params();
    /* sequence ids: 0..max_seqs-1 requests, then the prefix-cache slots */
    cp.max_seqs = o->max_seqs + o->prefix_slots;
    if (o->ctx > 0)
        cp.max_context = o->ctx;
    if (o->kv_dtype >= 0)
        cp.kv_dtype = o->kv_dtype;
    cp.kv_layout = DSQ_KV_PAGED;
    cp.n_threads = o->threads;
    cp.max_batch_tokens = o->batch_tokens;
    int64_t per_seq = ((int64_t)cp.max_context + cp.kv_block_size - 1) / cp.kv_block_size;
    cp.kv_pool_tokens = o->kv_pool_tokens > 0 ? o->kv_pool_tokens
                                               : per_seq * cp.kv_block_size * o->max_seqs;
    if ((st = dsq_ctx_new(s->model, &cp, &s->ctx)) != DSQ_OK)
        return report(st, "creating the context");
    dsq_ctx_info ci;
    memset(&ci, 0, sizeof ci);
    ci.struct_size = sizeof ci;
    if ((st = dsq_ctx_get_info(s->ctx, &ci)) != DSQ_OK)
        return report(st, "context info");
    s->max_context = ci.max_context;
    s->max_batch_tokens = ci.max_batch_tokens;
    s->block = ci.kv_block_size > 0 ? ci.kv_block_size : 1;
    s->total_blocks = ci.kv_capacity_tokens / s->block;
    s->m.kv_capacity_tokens = ci.kv_capacity_tokens;
    s->m.kv_free_tokens = ci.kv_free_tokens;
    if (s->total_blocks < 1) {
        fprintf(stderr, "dsqwen serve: the KV pool holds no block\n");
        return 1;
    }

    /* the model's recommended sampling (generation_config.json) as the
     * default of every request */
    dsq_sampler_params gp = dsq_sampler_default_params();
    if ((st = dsq_model_sampler_params(s->model, &gp)) != DSQ_OK)
        return report(st, "sampler defaults");
    dsq_sample_params sp = dsq_sample_default_params();
    sp.temperature = gp.temperature < 0 ? 0 : gp.temperature;
    sp.top_k = gp.top_k;
    sp.top_p = gp.top_p;
    sp.min_p = gp.min_p;
    sp.repetition_penalty = gp.repetition_penalty;
    sp.penalty_last_n = gp.penalty_last_n;
    sp.n_vocab_valid = gp.n_vocab_valid;
    s->sp_default = sp;

    /* the served name: given, else the model directory's last component */
    const char *name = o->served_name;
    char dir[4096];
    if (!name) {
        snprintf(dir, sizeof dir, "%s", o->model);
        size_t n = strlen(dir);
        while (n > 1 && dir[n - 1] == '/')
            dir[--n] = '\0';
        const char *slash = strrchr(dir, '/');
        name = slash ? slash + 1 : dir;
    }
    for (const char *p = name; *p; p++)
        if (*p == '"' || *p == '\\' || (unsigned char)*p < 0x20) {
            fprintf(stderr, "dsqwen serve: the model name '%s' has a quote, backslash or control "
                            "character; use --served-model-name\n", name);
            return 2;
        }
    size_t name_len = strlen(name);
    if (name_len == 0 || name_len >= sizeof s->served_name) {
        fprintf(stderr, "dsqwen serve: the model name must have 1 to %zu bytes; use "
                        "--served-model-name\n", sizeof s->served_name - 1);
        return 2;
    }
    memcpy(s->served_name, name, name_len + 1);
    return 0;
}

int dsq_serve_main(int argc, char **argv)
{
    srv *s = calloc(1, sizeof *s);
    if (!s)
        return 1;
    int rc = srv_parse_args(argc, argv, &s->o);
    if (rc >= 0) {
        free(s);
        return rc;
    }
    s->started = (long)time(NULL);
    s->m.ttft = (srv_hist){ .le = TTFT_LE, .n = SRV_TTFT_BUCKETS - 1 };
    s->m.itl = (srv_hist){ .le = ITL_LE, .n = SRV_ITL_BUCKETS - 1 };
    s->m.batch = (srv_hist){ .le = BATCH_LE, .n = SRV_BATCH_BUCKETS - 1 };
    s->m.step = (srv_hist){ .le = STEP_LE, .n = SRV_STEP_BUCKETS - 1 };
    s->m.host = (srv_hist){ .le = STEP_LE, .n = SRV_STEP_BUCKETS - 1 };
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv_sched, NULL);

    /* SIGINT/SIGTERM are taken by sigwait() below: blocked in every thread
     * (the threads made later inherit the mask); a write to a closed socket
     * must not kill the process. */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);

    struct MHD_Daemon *d = NULL;
    int sched = 0;
    rc = setup(s);
    if (rc == 0 && srv_sched_start(s) != 0) {
        fprintf(stderr, "dsqwen serve: cannot start the scheduler (out of memory?)\n");
        srv_sched_free(s);
        rc = 1;
    } else if (rc == 0) {
        sched = 1;
    }
    int port = 0;
    if (rc == 0 && !(d = srv_http_start(s, &port)))
        rc = 1;
    if (rc == 0) {
        fprintf(stderr,
                "dsqwen serve: model %s, %d requests x %d tokens, KV pool %lld tokens, "
                "%d-token steps%s\n",
                s->served_name, (int)s->o.max_seqs, (int)s->max_context,
                (long long)(s->total_blocks * s->block), (int)s->max_batch_tokens,
                s->o.api_key ? ", API key required" : "");
        fprintf(stderr, "dsqwen serve: listening on http://%s:%d\n", s->o.host, port);
        fflush(stderr);
        int sig = 0;
        sigwait(&sigs, &sig);
        fprintf(stderr, "dsqwen serve: %s: stopping\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
    }
    /* stop: the scheduler ends every request (clients get what they have,
     * streams an error event and [DONE]), then the connection threads end */
    if (sched)
        srv_sched_stop(s);
    /* let the connection threads send what the ended requests still have
     * (the error event and [DONE] of a stream) before the sockets close */
    for (int i = 0; d && i < 500; i++) {
        pthread_mutex_lock(&s->mu);
        int left = s->n_http_reqs;
        pthread_mutex_unlock(&s->mu);
        if (left == 0)
            break;
        struct timespec ts = { 0, 10 * 1000 * 1000 };
        nanosleep(&ts, NULL);
    }
    if (d)
        MHD_stop_daemon(d);
    srv_out_cleanup();
    dsq_ctx_free(s->ctx);
    dsq_model_free(s->model);
    pthread_cond_destroy(&s->cv_sched);
    pthread_mutex_destroy(&s->mu);
    free(s);
    pthread_sigmask(SIG_UNBLOCK, &sigs, NULL);
    return rc;
}
