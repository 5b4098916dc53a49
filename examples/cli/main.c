/* main.c - `dsqwen`: command line front end of libdsqwen.
 *   dsqwen generate|chat|bench --model DIR [options] [PROMPT]
 *   dsqwen quantize IN_DIR OUT_DIR --bits 8|4 [--head]
 * Every flag is checked here, before the model loads; a bad one is a usage
 * error (exit 2).  See cli.h for the exit codes. */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#ifdef DSQ_CLI_HAVE_SERVE
#include "serve_main.h" /* server/: `dsqwen serve` */
#endif

/* Which commands an option applies to. */
enum { C_GEN = 1, C_CHAT = 2, C_BENCH = 4, C_ALL = 7, C_TEXT = C_GEN | C_CHAT, C_QUANT = 8 };

enum {
    OPT_MODEL = 256, OPT_BACKEND, OPT_KV, OPT_KV_LAYOUT, OPT_TEMP, OPT_TOP_P, OPT_TOP_K,
    OPT_MIN_P, OPT_PENALTY, OPT_PENALTY_N, OPT_SEED, OPT_MAX_TOKENS, OPT_CTX, OPT_THREADS,
    OPT_SHOW_THINK, OPT_HIDE_THINK, OPT_TOKENS, OPT_RAW, OPT_SYSTEM, OPT_BATCH, OPT_PROMPT_LEN,
    OPT_GREEDY, OPT_STOP, OPT_VERBOSE, OPT_NO_PROGRESS, OPT_VERSION, OPT_HELP,
    OPT_SAMPLING, OPT_QUANTIZE, OPT_QUANTIZE_HEAD, OPT_BITS, OPT_HEAD, OPT_BATCH_TOKENS, OPT_BANDWIDTH
};

typedef struct opt_doc {
    struct option opt;
    unsigned cmds;     /* C_* bits                                           */
    const char *arg;   /* argument name in the help, NULL for none           */
    const char *help;  /* one or more lines, each already indented by the table */
} opt_doc;

static const opt_doc docs[] = {
    { { "model", required_argument, NULL, OPT_MODEL }, C_ALL, "DIR",
      "model directory (config.json + safetensors; tokenizer.json for text)" },
    { { "backend", required_argument, NULL, OPT_BACKEND }, C_ALL, "auto|cpu|cuda",
      "compute backend (default auto: CUDA if built in and a GPU is usable)" },
    { { "kv", required_argument, NULL, OPT_KV }, C_ALL, "f16|int8|f32",
      "KV cache storage (default f16; f32 is CPU only)" },
    { { "kv-layout", required_argument, NULL, OPT_KV_LAYOUT }, C_ALL, "static|paged",
      "KV cache layout (default static)" },
    { { "ctx", required_argument, NULL, OPT_CTX }, C_ALL, "N",
      "max tokens per sequence (default: the library's; bench: prompt + steps + 1)" },
    { { "batch-tokens", required_argument, NULL, OPT_BATCH_TOKENS }, C_ALL, "N",
      "most tokens one forward pass takes (max_batch_tokens; default 512, or the\n"
      "bench's batch when larger): longer prompts are prefilled in chunks of N;\n"
      "a prompt in one pass is faster on the GPU and holds N rows of activations" },
    { { "threads", required_argument, NULL, OPT_THREADS }, C_ALL | C_QUANT, "N",
      "CPU threads (default 0 = all cores)" },
    { { "quantize", required_argument, NULL, OPT_QUANTIZE }, C_ALL, "none|int8|q4",
      "quantize the linear weights at load: int8 (one scale per row) or q4\n"
      "(4-bit, groups of 128); default none (as the checkpoint stores them)" },
    { { "quantize-head", no_argument, NULL, OPT_QUANTIZE_HEAD }, C_ALL, NULL,
      "quantize the output head at load (int8, one scale per row); alone,\n"
      "the head of any checkpoint (AWQ / GPTQ keep theirs 16-bit)" },
    { { "bits", required_argument, NULL, OPT_BITS }, C_QUANT, "8|4",
      "8: int8 weights, one scale per output row; 4: 4-bit, groups of 128\n"
      "inputs with a scale and a zero point (required unless --head is\n"
      "given: an already quantized checkpoint gets an int8 head only)" },
    { { "head", no_argument, NULL, OPT_HEAD }, C_QUANT, NULL,
      "quantize the output head too (int8); default: kept as stored" },
    { { "max-tokens", required_argument, NULL, OPT_MAX_TOKENS }, C_ALL, "N",
      "tokens to generate per reply (default 512); bench: decode steps (default 64)" },
    { { "temperature", required_argument, NULL, OPT_TEMP }, C_TEXT, "T",
      "sampling temperature, <= 0 is greedy (default: the model's\n"
      "generation_config.json, else 0.6)" },
    { { "temp", required_argument, NULL, OPT_TEMP }, C_TEXT, "T", NULL },
    { { "top-p", required_argument, NULL, OPT_TOP_P }, C_TEXT, "P",
      "nucleus sampling, 0 < P <= 1 (default: the model's, else 0.95)" },
    { { "top-k", required_argument, NULL, OPT_TOP_K }, C_TEXT, "K",
      "keep the K most likely tokens, 0 = off (default 0)" },
    { { "min-p", required_argument, NULL, OPT_MIN_P }, C_TEXT, "P",
      "drop tokens below P x the top probability, 0 <= P <= 1 (default 0)" },
    { { "repeat-penalty", required_argument, NULL, OPT_PENALTY }, C_TEXT, "R",
      "repetition penalty > 0, 1 = off (default 1)" },
    { { "repeat-last-n", required_argument, NULL, OPT_PENALTY_N }, C_TEXT, "N",
      "tokens the penalty looks back (default 64)" },
    { { "seed", required_argument, NULL, OPT_SEED }, C_TEXT, "N",
      "sampler seed, 0..18446744073709551615; -1 = a random seed (printed\n"
      "with --verbose)" },
    { { "greedy", no_argument, NULL, OPT_GREEDY }, C_TEXT, NULL, "same as --temperature 0" },
    { { "stop", required_argument, NULL, OPT_STOP }, C_TEXT, "STR",
      "end the reply where its text contains STR (not printed); repeatable;\n"
      "EOS always ends it; needs the model's tokenizer" },
    { { "show-thinking", no_argument, NULL, OPT_SHOW_THINK }, C_TEXT, NULL,
      "print the <think>..</think> part (default)" },
    { { "hide-thinking", no_argument, NULL, OPT_HIDE_THINK }, C_TEXT, NULL,
      "print only what follows </think>" },
    { { "system", required_argument, NULL, OPT_SYSTEM }, C_TEXT, "TEXT", "system prompt" },
    { { "raw", no_argument, NULL, OPT_RAW }, C_TEXT, NULL,
      "no chat template: the prompt (each chat line) is plain text" },
    { { "tokens", required_argument, NULL, OPT_TOKENS }, C_GEN, "1,2,3",
      "the prompt as token ids (no tokenizer needed; the output is ids when\n"
      "the model has no tokenizer)" },
    { { "batch", required_argument, NULL, OPT_BATCH }, C_BENCH, "1,8,32",
      "batch sizes to measure (default 1)" },
    { { "prompt-len", required_argument, NULL, OPT_PROMPT_LEN }, C_BENCH, "N",
      "prompt tokens per sequence (default 128)" },
    { { "sampling", required_argument, NULL, OPT_SAMPLING }, C_BENCH, "gpu|host|none",
      "how each step's next tokens are picked: gpu (default: dsq_step samples\n"
      "in the library, on the GPU with CUDA), host (logits to the host, argmax\n"
      "there), none (no logits; the step alone)" },
    { { "bandwidth", required_argument, NULL, OPT_BANDWIDTH }, C_BENCH, "GBPS",
      "the memory bandwidth that floor% is computed against, in GB/s (default\n"
      "4480: the H200's measured streaming read)" },
    { { "verbose", no_argument, NULL, OPT_VERBOSE }, C_ALL, NULL,
      "show backend, device, model shape, load time and library messages" },
    { { "no-progress", no_argument, NULL, OPT_NO_PROGRESS }, C_ALL, NULL,
      "no load progress bar (it is drawn only when stderr is a terminal)" },
    { { "version", no_argument, NULL, OPT_VERSION }, C_ALL | C_QUANT, NULL, "what is built in" },
    { { "help", no_argument, NULL, OPT_HELP }, C_ALL | C_QUANT, NULL, "this help" },
};
#define N_DOCS (sizeof docs / sizeof docs[0])

typedef struct cmd_doc {
    const char *name;
    unsigned bit;
    const char *synopsis;
    const char *about;
} cmd_doc;

static const cmd_doc cmds[] = {
    { "generate", C_GEN, "dsqwen generate --model DIR [options] [PROMPT]",
      "Complete one prompt and stream the reply.  The prompt is the argument, or\n"
      "--tokens, or else all of stdin.  With a tokenizer the prompt is wrapped in\n"
      "the model's chat template unless --raw.  Ctrl-C stops the reply (exit 130)." },
    { "chat", C_CHAT, "dsqwen chat --model DIR [options]",
      "Interactive multi-turn chat: one message per line of stdin (line editing\n"
      "and history on a terminal when built with libedit).  /reset starts over,\n"
      "/quit or end of input leaves.  A line that cannot be used is reported and\n"
      "skipped.  When the context is full the oldest turns are dropped (with a\n"
      "notice).  Ctrl-C stops the current reply; at the prompt (or a second one)\n"
      "it exits.  Without a tokenizer each line is a list of token ids (1,2,3)." },
    { "bench", C_BENCH, "dsqwen bench --model DIR [options]",

      "Prefill and decode throughput at each batch size of --batch, an untimed\n"
      "warm-up first; --sampling says how next tokens are picked (default: in\n"
      "the library through dsq_step, on the GPU with CUDA)." },
    { "quantize", C_QUANT, "dsqwen quantize IN_DIR OUT_DIR --bits 8|4 [--head] [options]",
      "Write a quantized copy of the checkpoint in IN_DIR to OUT_DIR (created if\n"
      "missing): model.safetensors with the library's own quantization_config\n"
      "(docs/quantization.md), config.json and the tokenizer / generation\n"
      "config files.  It loads again without re-quantizing.  The embedding stays\n"
      "as stored.  An AWQ or GPTQ checkpoint cannot be quantized again." },
};
#define N_CMDS (sizeof cmds / sizeof cmds[0])

static void usage(FILE *f)
{
    fprintf(f,
            "usage: dsqwen COMMAND --model DIR [options]\n"
            "\n"
            "commands:\n"
            "  generate   complete one prompt (argument, --tokens or stdin), streaming the reply\n"
            "  chat       interactive multi-turn chat on stdin\n"
            "  bench      prefill and decode throughput at the batch sizes of --batch\n"
            "  quantize   write an int8 or 4-bit copy of a checkpoint (IN_DIR OUT_DIR --bits)\n"
            "  serve      OpenAI-compatible HTTP server (`dsqwen serve --help`)\n"
            "\n"
            "`dsqwen COMMAND --help` lists the options of a command.\n"
            "dsqwen --version     what this build has (CUDA, line editing)\n"
            "\n"
            "exit status: 0 done, 1 runtime failure, 2 usage error, 130 stopped by Ctrl-C\n");
}

static void usage_cmd(FILE *f, const cmd_doc *c)
{
    fprintf(f, "usage: %s\n\n%s\n\noptions:\n", c->synopsis, c->about);
    for (size_t i = 0; i < N_DOCS; i++) {
        const opt_doc *d = &docs[i];
        if (!(d->cmds & c->bit) || !d->help)
            continue;
        char head[64];
        snprintf(head, sizeof head, "--%s%s%s", d->opt.name, d->arg ? " " : "",
                 d->arg ? d->arg : "");
        fprintf(f, "  %-24s ", head);
        for (const char *p = d->help; *p; p++) {
            fputc(*p, f);
            if (*p == '\n')
                fprintf(f, "  %-24s ", "");
        }
        fputc('\n', f);
    }
    fprintf(f, "\nexit status: 0 done, 1 runtime failure, 2 usage error, 130 stopped by Ctrl-C\n");
}

static void version(void)
{
    const char *feat = dsq_build_features();
    int cuda = strstr(feat, "cuda") != NULL;
    printf("dsqwen %s (libdsqwen %s)\n", DSQ_CLI_VERSION, dsq_version_string());
    printf("library built with: %s\n", feat);
    printf("CUDA backend: %s\n", cuda ? "yes (used when a GPU is usable; --verbose says which)"
                                      : "no (CPU only)");
    printf("line editing: %s\n", cli_input_has_libedit() ? "libedit" : "no (built without libedit)");
#ifdef DSQ_CLI_HAVE_SERVE
    printf("serve: yes (libmicrohttpd)\n");
#else
    printf("serve: no (built without libmicrohttpd)\n");
#endif
}

static void no_model_help(void)
{
    fprintf(stderr,
            "dsqwen: no --model given.\n"
            "\n"
            "To run DeepSeek-R1-Distill-Qwen-1.5B, download the weights (3.5 GB) once:\n"
            "    huggingface-cli download deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B --local-dir DIR\n"
            "and pass --model DIR.\n"
#ifdef DSQ_DEFAULT_TINY_MODEL
            "\n"
            "To try the tool right away, `--model tiny` runs the source tree's tiny random\n"
            "test model (%s); it has no tokenizer, so give the prompt as ids:\n"
            "    dsqwen generate --model tiny --tokens 1,2,3,4 --max-tokens 8\n",
            DSQ_DEFAULT_TINY_MODEL
#endif
    );
}

static int parse_int(const char *name, const char *s, long lo, long hi, int32_t *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (end == s || *end || errno || v < lo || v > hi) {
        fprintf(stderr, "dsqwen: --%s wants an integer in %ld..%ld, got '%s'\n", name, lo, hi, s);
        return 1;
    }
    *out = (int32_t)v;
    return 0;
}

static int parse_float(const char *name, const char *s, float *out)
{
    char *end;
    errno = 0;
    float v = strtof(s, &end);
    if (end == s || *end || errno || !isfinite(v)) {
        fprintf(stderr, "dsqwen: --%s wants a number, got '%s'\n", name, s);
        return 1;
    }
    *out = v;
    return 0;
}

static int parse_choice(const char *name, const char *s, const char *const *names, int n,
                        int32_t *out)
{
    for (int i = 0; i < n; i++)
        if (strcmp(s, names[i]) == 0) {
            *out = i;
            return 0;
        }
    fprintf(stderr, "dsqwen: --%s: unknown value '%s' (one of:", name, s);
    for (int i = 0; i < n; i++)
        fprintf(stderr, " %s", names[i]);
    fprintf(stderr, ")\n");
    return 1;
}

/* --seed: an unsigned 64-bit value, or -1 for a random one.  strtoull alone
 * would silently wrap any negative number. */
static int parse_seed(const char *s, uint64_t *out)
{
    if (strcmp(s, "-1") == 0) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        uint64_t x = (uint64_t)ts.tv_sec * 1000000007ull ^ (uint64_t)ts.tv_nsec ^
                     ((uint64_t)getpid() << 32);
        x ^= x >> 33; /* spread the bits (splitmix64 finalizer) */
        x *= 0xff51afd7ed558ccdull;
        x ^= x >> 33;
        *out = x;
        return 0;
    }
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 0);
    if (s[0] == '-' || s[0] == '+' || end == s || *end || errno) {
        fprintf(stderr, "dsqwen: --seed wants an integer in 0..18446744073709551615 or -1 "
                        "(random), got '%s'\n", s);
        return 1;
    }
    *out = (uint64_t)v;
    return 0;
}

static int is_dir(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

/* Whether the model (a directory, or a .safetensors file) has a
 * tokenizer.json next to it: text prompts and --stop need one, and that is
 * known before the (slow) load. */
static int model_has_tokenizer(const char *model)
{
    char path[4096];
    if (is_dir(model)) {
        snprintf(path, sizeof path, "%s/tokenizer.json", model);
    } else {
        const char *slash = strrchr(model, '/');
        int n = slash ? (int)(slash - model) : 1;
        snprintf(path, sizeof path, "%.*s/tokenizer.json", n, slash ? model : ".");
    }
    return access(path, R_OK) == 0;
}

static int find_cmd(const char *name)
{
    for (size_t i = 0; i < N_CMDS; i++)
        if (strcmp(name, cmds[i].name) == 0)
            return (int)i;
    return -1;
}

/* The checks that need all options together; 0 if fine. */
static int check_combination(cli_opts *o, int cmd_bit)
{
    if (!o->model) {
        no_model_help();
        return 1;
    }
    if (strcmp(o->model, "tiny") == 0) {
#ifdef DSQ_DEFAULT_TINY_MODEL
        o->model = DSQ_DEFAULT_TINY_MODEL;
#else
        fprintf(stderr, "dsqwen: '--model tiny' names the tiny test model of a source build "
                        "(tests/data/tiny); pass its path instead\n");
        return 1;
#endif
    }
    if (access(o->model, R_OK) != 0) {
        fprintf(stderr, "dsqwen: --model '%s': %s\n", o->model, strerror(errno));
        return 1;
    }
    if (o->backend == DSQ_BACKEND_CUDA && o->kv_dtype == DSQ_KV_F32) {
        fprintf(stderr, "dsqwen: --kv f32 is CPU only (use f16 or int8 with --backend cuda)\n");
        return 1;
    }
    int text_in = cmd_bit == C_CHAT || (cmd_bit == C_GEN && !o->tokens);
    if ((text_in || o->n_stops > 0) && !model_has_tokenizer(o->model)) {
        if (o->n_stops > 0)
            fprintf(stderr, "dsqwen: --stop needs the model's tokenizer.json, which '%s' lacks\n",
                    o->model);
        else if (cmd_bit == C_GEN)
            fprintf(stderr, "dsqwen: '%s' has no tokenizer.json; give the prompt as token ids "
                            "with --tokens 1,2,3\n", o->model);
        /* chat without a tokenizer reads token ids: allowed */
        if (o->n_stops > 0 || cmd_bit == C_GEN)
            return 1;
    }
    if (cmd_bit == C_BENCH && o->ctx > 0 && (int64_t)o->prompt_len + o->max_tokens > o->ctx) {
        fprintf(stderr, "dsqwen: --prompt-len + --max-tokens (%lld) exceeds --ctx (%d)\n",
                (long long)o->prompt_len + o->max_tokens, (int)o->ctx);
        return 1;
    }
    /* the sampler settings given here, over the library defaults: the
     * library's own check, now rather than after the load (the model's
     * generation_config.json only fills the fields not given) */
    if (cmd_bit != C_BENCH) {
        dsq_sampler_params sp = dsq_sampler_default_params();
        const dsq_sampler_params *c = &o->sp;
        if (o->sp_set & CLI_SP_TEMPERATURE) sp.temperature = c->temperature;
        if (o->sp_set & CLI_SP_TOP_P) sp.top_p = c->top_p;
        if (o->sp_set & CLI_SP_TOP_K) sp.top_k = c->top_k;
        if (o->sp_set & CLI_SP_MIN_P) sp.min_p = c->min_p;
        if (o->sp_set & CLI_SP_PENALTY) sp.repetition_penalty = c->repetition_penalty;
        if (o->sp_set & CLI_SP_PENALTY_N) sp.penalty_last_n = c->penalty_last_n;
        dsq_sampler *smp = NULL;
        dsq_status st = dsq_sampler_new(&sp, &smp);
        dsq_sampler_free(smp);
        if (st != DSQ_OK) {
            fprintf(stderr, "dsqwen: bad sampling option: %s\n", dsq_last_error_message());
            return 1;
        }
    }
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return CLI_EXIT_USAGE;
    }
    const char *cmd = argv[1];
    if (strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0) {
        usage(stdout);
        return CLI_EXIT_OK;
    }
    /* `dsqwen help serve` is `dsqwen serve --help` */
    char *serve_help[] = { argv[0], (char *)"serve", (char *)"--help", NULL };
    if (strcmp(cmd, "help") == 0 && argc > 2 && strcmp(argv[2], "serve") == 0) {
        argc = 3;
        argv = serve_help;
        cmd = argv[1];
    }
    if (strcmp(cmd, "help") == 0) {
        int k = argc > 2 ? find_cmd(argv[2]) : -1;
        if (argc > 2 && k < 0) {
            fprintf(stderr, "dsqwen: unknown command '%s' (generate, chat, bench, quantize or serve)\n", argv[2]);
            return CLI_EXIT_USAGE;
        }
        if (k >= 0)
            usage_cmd(stdout, &cmds[k]);
        else
            usage(stdout);
        return CLI_EXIT_OK;
    }
    if (strcmp(cmd, "--version") == 0) {
        version();
        return CLI_EXIT_OK;
    }
    if (strcmp(cmd, "serve") == 0) {
#ifdef DSQ_CLI_HAVE_SERVE
        return dsq_serve_main(argc - 1, argv + 1);
#else
        fprintf(stderr, "dsqwen: this dsqwen was built without `serve` (it needs libmicrohttpd: "
                        "install libmicrohttpd-dev and rebuild)\n");
        return CLI_EXIT_USAGE;
#endif
    }
    int k = find_cmd(cmd);
    if (k < 0) {
        fprintf(stderr, "dsqwen: unknown command '%s' (generate, chat, bench, quantize or serve)\n", cmd);
        usage(stderr);
        return CLI_EXIT_USAGE;
    }
    const cmd_doc *cd = &cmds[k];

    cli_opts o;
    memset(&o, 0, sizeof o);
    o.cmd = cd->name;
    o.backend = DSQ_BACKEND_AUTO;
    o.kv_dtype = -1;
    o.kv_layout = DSQ_KV_STATIC;
    o.sp = dsq_sampler_default_params();
    o.max_tokens = cd->bit == C_BENCH ? 64 : 512;
    o.show_thinking = 1;
    o.prompt_len = 128;
    o.bench_gbps = CLI_BENCH_GBPS;
    o.progress = isatty(STDERR_FILENO);
    /* every --stop is one argument, so argc bounds their number */
    const char **stops = calloc((size_t)argc, sizeof *stops);
    struct option *longs = calloc(N_DOCS + 1, sizeof *longs);
    if (!stops || !longs) {
        fprintf(stderr, "dsqwen: no memory\n");
        free(stops);
        free(longs);
        return CLI_EXIT_FAIL;
    }
    for (size_t i = 0; i < N_DOCS; i++)
        longs[i] = docs[i].opt;
    o.stops = stops;

    static const char *const backends[] = { "auto", "cpu", "cuda" };
    static const char *const kv_dtypes[] = { "f16", "int8", "f32" };
    static const char *const layouts[] = { "static", "paged" };
    int c, bad = 0, idx = 0, rc = CLI_EXIT_USAGE;
    optind = 2;
    opterr = 0; /* getopt's own messages lack the command; ours follow */
    while (!bad && (c = getopt_long(argc, argv, ":h", longs, &idx)) != -1) {
        if (c == '?' || c == ':') {
            const char *arg = argv[optind - 1];
            if (c == ':')
                fprintf(stderr, "dsqwen %s: option '%s' needs a value\n", cd->name, arg);
            else
                fprintf(stderr, "dsqwen %s: unknown option '%s' (see dsqwen %s --help)\n",
                        cd->name, arg, cd->name);
            bad = 1;
            break;
        }
        if (c == 'h')
            c = OPT_HELP;
        if (c != OPT_HELP && c != OPT_VERSION && !(docs[idx].cmds & cd->bit)) {
            fprintf(stderr, "dsqwen %s: --%s does not apply to %s (see dsqwen %s --help)\n",
                    cd->name, docs[idx].opt.name, cd->name, cd->name);
            bad = 1;
            break;
        }
        switch (c) {
        case OPT_MODEL: o.model = optarg; break;
        case OPT_BACKEND: bad = parse_choice("backend", optarg, backends, 3, &o.backend); break;
        case OPT_KV: bad = parse_choice("kv", optarg, kv_dtypes, 3, &o.kv_dtype); break;
        case OPT_KV_LAYOUT: bad = parse_choice("kv-layout", optarg, layouts, 2, &o.kv_layout); break;
        case OPT_TEMP:
            bad = parse_float("temperature", optarg, &o.sp.temperature);
            o.sp_set |= CLI_SP_TEMPERATURE;
            break;
        case OPT_TOP_P:
            bad = parse_float("top-p", optarg, &o.sp.top_p);
            if (!bad && !(o.sp.top_p > 0.0f && o.sp.top_p <= 1.0f)) {
                fprintf(stderr, "dsqwen: --top-p wants a number in (0, 1], got '%s'\n", optarg);
                bad = 1;
            }
            o.sp_set |= CLI_SP_TOP_P;
            break;
        case OPT_TOP_K:
            bad = parse_int("top-k", optarg, 0, INT32_MAX, &o.sp.top_k);
            o.sp_set |= CLI_SP_TOP_K;
            break;
        case OPT_MIN_P:
            bad = parse_float("min-p", optarg, &o.sp.min_p);
            if (!bad && !(o.sp.min_p >= 0.0f && o.sp.min_p <= 1.0f)) {
                fprintf(stderr, "dsqwen: --min-p wants a number in [0, 1], got '%s'\n", optarg);
                bad = 1;
            }
            o.sp_set |= CLI_SP_MIN_P;
            break;
        case OPT_PENALTY:
            bad = parse_float("repeat-penalty", optarg, &o.sp.repetition_penalty);
            if (!bad && !(o.sp.repetition_penalty > 0.0f)) {
                fprintf(stderr, "dsqwen: --repeat-penalty wants a number > 0, got '%s'\n", optarg);
                bad = 1;
            }
            o.sp_set |= CLI_SP_PENALTY;
            break;
        case OPT_PENALTY_N:
            bad = parse_int("repeat-last-n", optarg, 0, INT32_MAX, &o.sp.penalty_last_n);
            o.sp_set |= CLI_SP_PENALTY_N;
            break;
        case OPT_SEED:
            bad = parse_seed(optarg, &o.sp.seed);
            o.sp_set |= CLI_SP_SEED;
            break;
        case OPT_MAX_TOKENS: bad = parse_int("max-tokens", optarg, 1, INT32_MAX, &o.max_tokens); break;
        case OPT_CTX: bad = parse_int("ctx", optarg, 1, INT32_MAX, &o.ctx); break;
        case OPT_BATCH_TOKENS: bad = parse_int("batch-tokens", optarg, 1, INT32_MAX, &o.batch_tokens); break;
        case OPT_THREADS: bad = parse_int("threads", optarg, 0, 1024, &o.threads); break;
        case OPT_SHOW_THINK: o.show_thinking = 1; break;
        case OPT_HIDE_THINK: o.show_thinking = 0; break;
        case OPT_TOKENS:
            free(o.tokens);
            bad = cli_parse_list("--tokens", optarg, 0, INT32_MAX, &o.tokens, &o.n_tokens);
            break;
        case OPT_RAW: o.raw = 1; break;
        case OPT_SYSTEM: o.system = optarg; break;
        case OPT_BATCH:
            free(o.batch);
            bad = cli_parse_list("--batch", optarg, 1, 65536, &o.batch, &o.n_batch);
            break;
        case OPT_PROMPT_LEN: bad = parse_int("prompt-len", optarg, 1, INT32_MAX, &o.prompt_len); break;
        case OPT_BANDWIDTH:
            bad = parse_float("bandwidth", optarg, &o.bench_gbps);
            if (!bad && !(o.bench_gbps > 0.0f)) {
                fprintf(stderr, "dsqwen: --bandwidth wants a positive number of GB/s, got '%s'\n", optarg);
                bad = 1;
            }
            break;
        case OPT_SAMPLING:
            if (strcmp(optarg, "gpu") == 0)
                o.bench_sampling = CLI_BENCH_STEP;
            else if (strcmp(optarg, "host") == 0)
                o.bench_sampling = CLI_BENCH_HOST;
            else if (strcmp(optarg, "none") == 0)
                o.bench_sampling = CLI_BENCH_NONE;
            else {
                fprintf(stderr, "dsqwen: --sampling wants gpu, host or none\n");
                bad = 1;
            }
            break;
        case OPT_GREEDY:
            o.sp.temperature = 0.0f;
            o.sp_set |= CLI_SP_TEMPERATURE;
            break;
        case OPT_STOP:
            if (!optarg[0]) {
                fprintf(stderr, "dsqwen: --stop wants a non-empty string\n");
                bad = 1;
            }
            stops[o.n_stops++] = optarg;
            break;
        case OPT_QUANTIZE: {
            static const char *const qn[] = { "none", "int8", "q4" };
            bad = parse_choice("quantize", optarg, qn, 3, &o.quantize);
            break;
        }
        case OPT_QUANTIZE_HEAD: o.quantize_head = 1; break;
        case OPT_HEAD: o.quantize_head = 1; break;
        case OPT_BITS:
            if (strcmp(optarg, "8") == 0)
                o.bits = 8;
            else if (strcmp(optarg, "4") == 0)
                o.bits = 4;
            else {
                fprintf(stderr, "dsqwen: --bits wants 8 or 4, got '%s'\n", optarg);
                bad = 1;
            }
            break;
        case OPT_VERBOSE: o.verbose = 1; break;
        case OPT_NO_PROGRESS: o.progress = 0; break;
        case OPT_VERSION:
            version();
            rc = CLI_EXIT_OK;
            goto done;
        case OPT_HELP:
            usage_cmd(stdout, cd);
            rc = CLI_EXIT_OK;
            goto done;
        default: bad = 1; break;
        }
    }
    if (bad)
        goto done;
    if (cd->bit == C_QUANT) {
        if (argc - optind != 2) {
            fprintf(stderr, "dsqwen quantize: wants IN_DIR and OUT_DIR (see dsqwen quantize --help)\n");
            goto done;
        }
        if (!o.bits && !o.quantize_head) {
            fprintf(stderr, "dsqwen quantize: --bits 8 or --bits 4 (or --head alone) is required\n");
            goto done;
        }
        o.in_dir = argv[optind];
        o.out_dir = argv[optind + 1];
        if (access(o.in_dir, R_OK) != 0) {
            fprintf(stderr, "dsqwen quantize: '%s': %s\n", o.in_dir, strerror(errno));
            rc = CLI_EXIT_FAIL;
            goto done;
        }
        rc = cli_quantize(&o);
        goto done;
    }
    if (optind < argc) {
        if (cd->bit != C_GEN || optind + 1 < argc || o.tokens) {
            fprintf(stderr, "dsqwen %s: unexpected argument '%s'%s\n", cd->name, argv[optind],
                    cd->bit == C_GEN ? " (one prompt; quote it, or use --tokens or stdin)" : "");
            goto done;
        }
        o.prompt = argv[optind];
    }
    if (check_combination(&o, (int)cd->bit))
        goto done;

    cli_signals_install();
    if (cd->bit == C_GEN)
        rc = cli_generate(&o);
    else if (cd->bit == C_CHAT)
        rc = cli_chat(&o);
    else
        rc = cli_bench(&o);
done:
    free(o.tokens);
    free(o.batch);
    free(longs);
    free(stops);
    return rc;
}
