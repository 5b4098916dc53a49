/* cli.h - shared pieces of the `dsqwen` command-line tool: options, model and
 * context setup, prompt building, streamed output, timing, Ctrl-C and line
 * input.
 *
 * Exit codes of every command: 0 done, 1 a runtime failure (model does not
 * load, prompt does not fit, library error), 2 a usage error (bad flag or
 * value, found before the model loads), 130 stopped by Ctrl-C. */
#ifndef DSQ_CLI_H
#define DSQ_CLI_H

#include <stddef.h>
#include <stdint.h>

#include "dsqwen.h"

enum { CLI_EXIT_OK = 0, CLI_EXIT_FAIL = 1, CLI_EXIT_USAGE = 2, CLI_EXIT_INTERRUPTED = 130 };

/* bench's default bandwidth for floor%: the H200's measured streaming read
 * (docs/performance.md), in GB/s */
#define CLI_BENCH_GBPS 4480.0f

typedef struct cli_opts {
    const char *cmd;         /* "generate", "chat" or "bench"               */
    const char *model;       /* --model DIR (resolved: "tiny" expanded)     */
    int32_t backend;         /* dsq_backend                                 */
    int32_t kv_dtype;        /* dsq_kv_dtype, -1 = library default          */
    int32_t kv_layout;       /* dsq_kv_layout                               */
    dsq_sampler_params sp;   /* --temperature --top-p --top-k --min-p ...:
                                only the fields named in sp_set are used;
                                the rest come from dsq_model_sampler_params */
    uint32_t sp_set;         /* CLI_SP_* bits                               */
    const char **stops;      /* --stop STR, repeatable                      */
    size_t n_stops;
    int32_t max_tokens;      /* tokens to generate (bench: decode steps)    */
    int32_t ctx;             /* --ctx: max context per sequence, 0 = default */
    int32_t batch_tokens;    /* --batch-tokens: max_batch_tokens, 0 = default */
    int32_t threads;         /* --threads, 0 = all cores                    */
    int show_thinking;       /* 1: print <think>..</think> text             */
    int32_t *tokens;         /* --tokens "1,2,3": prompt as ids (parsed)    */
    int32_t n_tokens;
    int raw;                 /* --raw: no chat template                     */
    const char *system;      /* --system TEXT (chat / templated generate)   */
    int32_t *batch;          /* --batch "1,8,32" (bench; parsed)            */
    int32_t n_batch;
    int32_t prompt_len;      /* --prompt-len N (bench)                      */
    const char *prompt;      /* positional prompt text (generate)           */
    int verbose;             /* --verbose: backend, shapes, timing, log     */
    int progress;            /* draw a load progress bar (stderr is a tty)  */
    int bench_sampling;      /* --sampling: CLI_BENCH_* (bench)             */
    float bench_gbps;        /* --bandwidth GBPS: floor%'s bandwidth (bench) */
    int32_t quantize;        /* --quantize: dsq_quantize (load-time)        */
    int quantize_head;       /* --quantize-head / quantize --head           */
    int32_t bits;            /* quantize --bits 8|4 (0: not given)          */
    const char *in_dir, *out_dir; /* quantize IN_DIR OUT_DIR                */
} cli_opts;

/* How `dsqwen bench` picks each step's next tokens. */
enum {
    CLI_BENCH_STEP = 0, /* dsq_step samples in the library (GPU on CUDA)     */
    CLI_BENCH_HOST = 1, /* logits to the host, argmax there                  */
    CLI_BENCH_NONE = 2  /* no logits, the same token fed again               */
};

/* Sampler fields given on the command line (they override the model's
 * generation_config.json). */
enum {
    CLI_SP_TEMPERATURE = 1u << 0,
    CLI_SP_TOP_P = 1u << 1,
    CLI_SP_TOP_K = 1u << 2,
    CLI_SP_MIN_P = 1u << 3,
    CLI_SP_PENALTY = 1u << 4,
    CLI_SP_PENALTY_N = 1u << 5,
    CLI_SP_SEED = 1u << 6
};

/* Everything a command needs once the model is up. */
typedef struct cli_session {
    dsq_model *model;
    dsq_ctx *ctx;
    dsq_sampler *sampler;
    dsq_sampler_params sp;        /* what the sampler was made with          */
    const dsq_tokenizer *tok;     /* borrowed from the model; may be NULL    */
    const char *const *stops;     /* --stop strings (borrowed from opts)     */
    size_t n_stops;
    dsq_model_info info;
    int32_t n_vocab_valid;        /* ids >= this are padding rows            */
    int32_t eos;                  /* -1 if unknown                           */
    int32_t think_open, think_close; /* ids of <think> / </think>, or -1   */
    int32_t max_context;          /* tokens one sequence may hold            */
    float *logits;                /* [max_seqs][n_vocab] host buffer         */
} cli_session;

/* Print "dsqwen: WHAT: STATUS: message" to stderr; returns 1 (exit code). */
int cli_report(dsq_status st, const char *what);

/* Seconds on a monotonic clock. */
double cli_now(void);

/* Load model, create a context for `max_seqs` sequences and a sampler.
 * Prints its own errors (and, with --verbose, what was loaded); returns 0 on
 * success, else an exit code.  `max_batch` raises the context's
 * max_batch_tokens when a decode step batches more sequences. */
int cli_session_open(cli_session *s, const cli_opts *o, int32_t max_seqs, int32_t max_batch);
void cli_session_close(cli_session *s);

/* Parse "1,2,3" into a malloc'ed array of values in lo..hi; on a bad element
 * prints "dsqwen: WHAT: 'ELEM' is not ..." and returns 1. */
int cli_parse_list(const char *what, const char *list, long lo, long hi, int32_t **out,
                   int32_t *n);

/* The session's sampler settings (model defaults + command line) as
 * dsq_step's per-sequence parameters. */
dsq_sample_params cli_sample_params(const cli_session *s);

/* Tokenize `text` (special-token text is recognised; no BOS added: the chat
 * format already holds it, raw callers pass add_bos).  Prints its own
 * errors. */
int cli_tokenize(const cli_session *s, const char *text, int add_bos, int32_t **ids,
                 int32_t *n);

/* A growable token array. */
typedef struct cli_tokvec {
    int32_t *v;
    int32_t n, cap;
} cli_tokvec;
int cli_tokvec_push(cli_tokvec *t, const int32_t *ids, int32_t n); /* 1: no memory */
void cli_tokvec_free(cli_tokvec *t);

/* Streams generated tokens to stdout: text through a dsq_stopper (which
 * decodes and holds back what could begin a --stop string) when the model
 * has a tokenizer (hiding <think>..</think> unless asked), else ids.  The
 * <think> / </think> tags bypass the stopper (a stop string never spans
 * one). */
typedef struct cli_printer {
    const cli_session *s;
    dsq_stopper *stopper;
    int stopped;       /* a --stop string was completed                     */
    int show_thinking;
    int in_think;      /* currently between <think> and </think>            */
    int open_pending;  /* the prompt ended inside a thought: print "<think>"
                          before the first output (never after an error)   */
    int skip_space;    /* drop whitespace right after a hidden </think>     */
    int printed_ids;   /* ids printed so far (id mode, for separators)      */
    char *buf;         /* [buf_cap] text from the stopper, grown on demand  */
    size_t buf_cap;
} cli_printer;

/* `prompt` sets the initial think state (a prompt ending in "<think>\n" puts
 * the reply inside a thought).  Prints nothing. */
int cli_printer_init(cli_printer *p, const cli_session *s, int show_thinking,
                     const int32_t *prompt, int32_t n_prompt);
int cli_printer_push(cli_printer *p, int32_t token);
int cli_printer_finish(cli_printer *p); /* flush held bytes, newline */
void cli_printer_free(cli_printer *p);

/* Timing of one prompt + reply. */
typedef struct cli_stats {
    int32_t n_prompt;   /* tokens prefilled                                  */
    double t_first;     /* seconds from prefill start to first sampled token */
    int32_t n_decode;   /* decode steps run                                  */
    double t_decode;    /* seconds spent after the first token               */
} cli_stats;

/* Outcome of cli_run_turn, for continuing the conversation. */
typedef struct cli_turn {
    int32_t last;       /* last sampled token, not yet in the KV cache       */
    int ended_eos;      /* reply ended with the EOS token                    */
    int context_full;   /* stopped because the sequence filled its context   */
    int stopped;        /* a --stop string ended the reply                   */
    int interrupted;    /* Ctrl-C ended the reply                            */
    int prefill_failed; /* nothing was generated: the prompt was refused (does
                           not fit, bad token id); the cache is unchanged   */
} cli_turn;

/* Prefill `prompt` onto sequence 0 (extending what it holds), then sample,
 * stream and decode until EOS, a --stop string, `max_tokens` sampled tokens,
 * a full context or Ctrl-C.  Every sampled token is appended to `reply` when
 * it is not NULL.  Prints its own errors; returns 0 on success. */
int cli_run_turn(cli_session *s, cli_printer *p, const int32_t *prompt, int32_t n_prompt,
                 int32_t max_tokens, cli_stats *stats, cli_turn *turn, cli_tokvec *reply);
/* "prompt N tokens, time to first token X ms, decode M tokens at Y tokens/s"
 * on stderr. */
void cli_print_stats(const cli_stats *stats);

/* Ctrl-C: the first one during a reply sets a flag that cli_run_turn checks
 * per token (the reply stops); a second one, or one while no reply runs,
 * ends the process (exit 130). */
void cli_signals_install(void);
void cli_reply_begin(void);     /* a reply starts: Ctrl-C now stops it      */
int cli_reply_end(void);        /* returns 1 if Ctrl-C stopped the reply    */
int cli_interrupted(void);

/* Interactive line input: libedit (editing, history) when built with it and
 * stdin is a terminal, else plain reads.  cli_read_line returns a malloc'ed
 * line without its newline, or NULL at end of input. */
void cli_input_init(int interactive);
char *cli_read_line(const char *prompt);
void cli_input_close(void);
int cli_input_has_libedit(void);

/* Subcommands; each returns the process exit code. */
int cli_generate(const cli_opts *o);
int cli_chat(const cli_opts *o);
int cli_bench(const cli_opts *o);
int cli_quantize(const cli_opts *o);

#endif
