/* serve.h - `dsqwen serve`: an OpenAI-compatible HTTP server over the public
 * libdsqwen API (dsqwen.h only).
 *
 * Threads and who owns what:
 *  - libmicrohttpd's threads (one per connection, MHD's internal thread
 *    mode) read a request body, parse and tokenize it (the tokenizer is
 *    thread-safe), hand a srv_req to the scheduler, then only move bytes:
 *    they copy what the scheduler put in the request's `out` buffer to the
 *    socket, and report a client that went away (`cancelled`).
 *  - ONE scheduler thread owns the dsq_ctx: it admits waiting requests,
 *    builds each dsq_step batch (decodes beside prompt chunks), turns sampled
 *    ids into text / JSON, and frees sequences.  It never touches a socket,
 *    so a slow or vanished client cannot stall the batch.
 *  - srv.mu guards the queues, every request's shared fields (marked below)
 *    and the metrics.  Each request has its own condition variable (the
 *    HTTP thread waits on it); srv.cv_sched wakes the scheduler.
 */
#ifndef DSQ_SERVE_H
#define DSQ_SERVE_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "dsqwen.h"

/* A growable byte buffer (NUL-terminated when non-empty). */
typedef struct srv_buf {
    char *p;
    size_t len, cap;
} srv_buf;
int srv_buf_add(srv_buf *b, const char *s, size_t n); /* 0 ok, -1 no memory */
int srv_buf_str(srv_buf *b, const char *s);
void srv_buf_free(srv_buf *b);

/* ---- options ------------------------------------------------------------ */

typedef struct srv_opts {
    const char *model;          /* --model DIR                                  */
    const char *served_name;    /* --served-model-name (default: dir name)      */
    const char *host;           /* --host (default 127.0.0.1)                   */
    int port;                   /* --port (default 8000; 0: any free port)      */
    const char *api_key;        /* --api-key or $DSQWEN_API_KEY; NULL: none     */
    int32_t backend;            /* dsq_backend                                  */
    int32_t kv_dtype;           /* -1: library default                          */
    int32_t ctx;                /* --ctx: tokens per sequence (0: library's)    */
    int32_t max_seqs;           /* --max-seqs: requests generating at once      */
    int64_t kv_pool_tokens;     /* --kv-pool-tokens (0: max_seqs x ctx)         */
    int32_t batch_tokens;       /* --batch-tokens: max tokens per step          */
    int32_t prefill_chunk;      /* --prefill-chunk: most prompt tokens of one
                                   request per step                             */
    int32_t max_queue;          /* --max-queue: waiting requests before 429     */
    int32_t retry_after;        /* --retry-after seconds in a 429               */
    int32_t prefix_slots;       /* --prefix-cache N cached prefixes (0: off)    */
    int32_t prefix_min;         /* --prefix-min tokens worth caching            */
    size_t max_body;            /* --max-body bytes                             */
    int32_t max_connections;    /* --max-connections                            */
    int32_t threads;            /* --threads (CPU backend)                      */
    int reasoning_inline;       /* --reasoning-inline: <think> text in content  */
    int verbose;
    int no_overlap;             /* --no-overlap: output work between steps      */
} srv_opts;

/* Parse argv (argv[0] is "serve").  Returns -1 to go on, else an exit code
 * (0 after --help, 2 on a usage error, printed). */
int srv_parse_args(int argc, char **argv, srv_opts *o);

/* ---- requests ----------------------------------------------------------- */

enum { REQ_WAITING = 0, REQ_PREFILL, REQ_DECODE, REQ_DONE };

typedef struct srv_req {
    /* --- set by the HTTP thread before submission, then read-only --- */
    uint64_t num;
    char id[48];                /* "chatcmpl-..." / "cmpl-..."                  */
    int chat;                   /* /v1/chat/completions (else /v1/completions)  */
    int stream;
    int include_usage;          /* stream_options.include_usage                 */
    int split_reasoning;        /* chat and not --reasoning-inline              */
    int32_t *prompt;            /* [n_prompt] token ids                         */
    int32_t n_prompt;
    int32_t max_tokens;         /* already clipped to the context               */
    dsq_sample_params sp;
    int logprobs;               /* return the sampled token's log-prob          */
    int32_t top_n;              /* top log-probs per token (0..20)              */
    char **stops;               /* [n_stops] stop strings                       */
    int ignore_eos;             /* vLLM's extension: EOS does not end the reply
                                   (fixed-length benchmarks)                    */
    size_t n_stops;
    long created;               /* unix time                                    */
    double t_arrive;            /* monotonic seconds                            */

    /* --- scheduler-owned --- */
    int state;                  /* REQ_*                                        */
    int32_t seq;                /* sequence id while active, else -1            */
    int32_t n_fed;              /* prompt tokens already in the cache           */
    int32_t n_cached;           /* prompt tokens that came from the prefix cache */
    int32_t feed;               /* next token to feed (decode)                  */
    int32_t n_gen;              /* tokens sampled                               */
    int64_t own_blocks;         /* KV blocks reserved for this request          */
    int prefix_entry;           /* prefix-cache entry it forked from, or -1     */
    int32_t cache_at;           /* fork a prefix-cache entry of this many
                                   prompt tokens once they are cached (0: no)   */
    dsq_stopper *stopper;
    int in_think;               /* split_reasoning: inside <think>..</think>    */
    int skip_ws;                /* drop whitespace right after </think>         */
    int sent_role;              /* chat stream: the role chunk went out         */
    size_t stream_off;          /* stream: text bytes sent so far (text_offset) */
    double t_first, t_last;     /* when the first / latest token's bytes were
                                   published (output worker)                    */
    int32_t n_sampled;          /* tokens sampled so far (scheduler; n_gen is
                                   the output side's count)                     */
    srv_buf content, reasoning; /* non-streaming: the text so far               */
    void *lp_all;               /* non-streaming logprobs (cJSON array)         */
    srv_buf pending;            /* stream bytes made this step, moved to `out`  */

    /* --- shared, under srv.mu --- */
    srv_buf out;                /* bytes for the HTTP thread to send            */
    int finished;               /* nothing more will be added to `out`          */
    int http_status;            /* non-streaming: status of the body in `out`   */
    int cancelled;              /* the client went away                         */
    int refs;                   /* HTTP side + scheduler side                   */
    pthread_cond_t cv;
    struct srv_req *next;       /* waiting-queue link                           */
} srv_req;

/* ---- metrics (under srv.mu) ----------------------------------------------- */

#define SRV_TTFT_BUCKETS 13
#define SRV_ITL_BUCKETS 12
#define SRV_BATCH_BUCKETS 10
#define SRV_STEP_BUCKETS 14
typedef struct srv_hist {
    const double *le;           /* upper bounds, ascending                      */
    int n;
    uint64_t count[16];         /* per bucket (not cumulative); [n] = +Inf      */
    double sum;
    uint64_t total;
} srv_hist;
void srv_hist_observe(srv_hist *h, double v);

typedef struct srv_metrics {
    uint64_t requests_ok, requests_4xx, requests_429, requests_5xx;
    uint64_t cancelled;
    uint64_t prompt_tokens, gen_tokens, prefix_hit_tokens;
    uint64_t steps;
    uint64_t mixed_steps;        /* steps with prompt chunks beside decodes      */
    uint64_t prefill_tokens;     /* prompt tokens run through the model          */
    uint64_t prefix_evictions;   /* cached prefixes dropped for room             */
    int32_t last_batch;          /* entries in the latest step                   */
    int32_t last_batch_tokens;   /* tokens in the latest step                    */
    int64_t kv_capacity_tokens, kv_free_tokens, kv_reserved_tokens;
    int32_t active_seqs;         /* sequences held in the context (cache too)    */
    srv_hist ttft, itl, batch;
    srv_hist step;               /* seconds inside dsq_step, per step          */
    srv_hist host;               /* seconds of scheduler work around it, per step:
                                  * the rest of a step's wall time, while the
                                  * GPU waits                                  */
} srv_metrics;

/* ---- the server ------------------------------------------------------------ */

typedef struct srv_prefix {
    int32_t seq;                /* sequence id holding the prefix; -1: unused   */
    int32_t *tokens;            /* [len]                                        */
    int32_t len;
    int users;                  /* active requests forked from it               */
    uint64_t last_use;
    int64_t blocks;             /* KV blocks reserved for it                    */
} srv_prefix;

typedef struct srv {
    srv_opts o;
    dsq_model *model;
    dsq_ctx *ctx;               /* scheduler thread only                        */
    const dsq_tokenizer *tok;
    dsq_sample_params sp_default; /* the model's generation_config.json         */
    int32_t n_vocab;
    int32_t eos, think_close;   /* -1 when unknown                              */
    int32_t max_context;
    int32_t max_batch_tokens;
    int32_t block;              /* KV block size (tokens)                       */
    int64_t total_blocks;
    char served_name[256];
    long started;

    pthread_mutex_t mu;
    pthread_cond_t cv_sched;
    int stopping;               /* shutdown began                               */
    srv_req *wait_head, *wait_tail; /* FIFO of admitted-but-waiting requests   */
    int32_t n_waiting;
    int32_t n_active;           /* requests holding a sequence                  */
    int64_t reserved_blocks;    /* KV blocks promised to active requests and
                                   cache entries                               */
    int64_t evictable_blocks;   /* blocks of cache entries nobody uses          */
    uint64_t next_num;
    int32_t n_http_reqs;        /* submitted requests whose HTTP side is not
                                   done yet (shutdown lets them drain)         */
    srv_metrics m;

    /* scheduler-owned */
    srv_req **active;           /* [o.max_seqs]                                 */
    int32_t *free_seqs;         /* stack of unused request sequence ids         */
    int32_t n_free_seqs;
    srv_prefix *prefix;         /* [o.prefix_slots]                             */
    int32_t **hist;             /* recent prompts (for prefix detection)        */
    int32_t *hist_len;
    int hist_n, hist_pos;
    uint64_t use_clock;
    /* the scheduler's per-step arrays, [o.max_seqs] each, made before it
     * starts */
    dsq_step_seq *st_e;
    dsq_step_out *st_out;
    struct srv_req **st_map;
    int32_t *st_chunk;
    struct srv_job *job;        /* the output worker's job (scheduler.c)        */
    srv_req **st_retire;        /* [o.max_seqs] replies ended, to retire       */
    int n_retire;
    pthread_t sched_thread, out_thread;
    int out_thread_up;
} srv;

/* scheduler.c */
int srv_sched_start(srv *s);    /* -1: no memory or thread (srv_sched_free) */
void srv_sched_free(srv *s);    /* the scheduler's arrays; NULL-safe        */
void srv_sched_stop(srv *s);    /* after s->stopping = 1: ends every request  */
/* Hand a parsed request to the scheduler: 0 queued (and counted in
 * n_http_reqs, in the same lock hold), or 429 (the pool and the queue are
 * full), 413 (the prompt exceeds the KV pool) or 503 (shutting down).
 * Takes the lock itself. */
int srv_submit(srv *s, srv_req *r);
/* The HTTP side is done with `r` (client gone or response sent).  Under
 * s->mu. */
void srv_req_release_locked(srv *s, srv_req *r);
void srv_req_cancel_locked(srv *s, srv_req *r);
/* KV blocks a request needs of its own (prompt + output, no prefix sharing). */
int64_t srv_req_blocks(const srv *s, const srv_req *r, int32_t shared);

/* request.c: parse a POST body into a request (tokenized).  Returns 0, or an
 * HTTP status with *err_json set to a malloc'ed OpenAI error object. */
int srv_parse_request(srv *s, const char *body, size_t len, int chat, srv_req **out,
                      char **err_json);
void srv_req_free(srv_req *r);
/* {"error":{"message","type","param","code"}} as a malloc'ed string. */
char *srv_error_json(const char *message, const char *type, const char *param,
                     const char *code);

/* output.c: text and JSON of the responses (scheduler thread). */
/* Returns "stop" when the reply ended (stop string or EOS), else NULL. */
const char *srv_out_token(srv *s, srv_req *r, const dsq_step_out *o);
/* Finish `r`: reason "stop" / "length", or an error (http_status >= 400 and
 * err_msg) -- fills r->pending (stream) or the body. */
void srv_out_finish(srv *s, srv_req *r, const char *reason, int http_status,
                    const char *err_msg);
char *srv_metrics_text(srv *s); /* under s->mu; malloc'ed */
void srv_out_cleanup(void);     /* after the scheduler has stopped */

/* http.c */
struct MHD_Daemon;
struct MHD_Daemon *srv_http_start(srv *s, int *port_out);

double srv_now(void);

#endif
