/* main.c - `dsqwen`: command line front end of libdsqwen.
 *   dsqwen generate|chat|bench --model DIR [options] [PROMPT] */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

static void usage(FILE *f)
{
    fprintf(f,
"usage: dsqwen COMMAND --model DIR [options] [PROMPT]\n"
"\n"
"commands:\n"
"  generate   complete one prompt (argument or stdin), streaming the reply\n"
"  chat       interactive multi-turn chat on stdin (history kept in the KV cache)\n"
"  bench      prefill and decode throughput at the batch sizes of --batch\n"
"\n"
"options:\n"
"  --model DIR            model directory (config.json + safetensors); 'tiny' runs\n"
"                         the bundled tiny random test model\n"
"  --backend auto|cpu|cuda    (default auto)\n"
"  --kv f16|int8|f32      KV cache storage (default f16; f32 is CPU only)\n"
"  --kv-layout static|paged   (default static)\n"
"  --ctx N                max tokens per sequence (default: library default)\n"
"  --threads N            CPU threads (default: all cores)\n"
"  --max-tokens N         tokens to generate (bench: decode steps; default 512, bench 64)\n"
"  sampling defaults come from the model's generation_config.json when it has\n"
"  one, else the library's (the values shown):\n"
"  --temperature T        <= 0 is greedy (default 0.6)\n"
"  --top-p P              (default 0.95)   --top-k K  (default 0 = off)\n"
"  --min-p P              (default 0 = off)\n"
"  --repeat-penalty R     (default 1 = off) --repeat-last-n N (default 64)\n"
"  --seed N               sampler seed\n"
"  --greedy               same as --temperature 0\n"
"  --stop STR             end the reply where its text contains STR (not printed);\n"
"                         repeatable; EOS always ends it\n"
"  --show-thinking / --hide-thinking   print or hide <think>..</think> (default show)\n"
"  --system TEXT          system prompt (chat template mode)\n"
"  --raw                  no chat template: the prompt is plain text\n"
"  --tokens 1,2,3         prompt as token ids (no tokenizer needed; output as ids\n"
"                         when the model has no tokenizer)\n"
"  --batch 1,8,32         bench: batch sizes (default 1)\n"
"  --prompt-len N         bench: prompt tokens per sequence (default 128)\n"
"  --sampling MODE        bench: gpu (default: dsq_step samples in the library),\n"
"                         host (logits to the host, argmax there), none (no logits)\n"
"  --version, --help\n");
}

static void no_model_help(void)
{
    fprintf(stderr,
"dsqwen: no --model given.\n"
"\n"
"To run DeepSeek-R1-Distill-Qwen-1.5B, download the weights (3.5 GB) once:\n"
"    huggingface-cli download deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B --local-dir DIR\n"
"and pass --model DIR.\n"
"\n"
"To try the tool right away, `--model tiny` runs the bundled tiny random test\n"
"model (%s); it has no tokenizer, so give the prompt as ids:\n"
"    dsqwen generate --model tiny --tokens 1,2,3,4 --max-tokens 8\n",
            DSQ_DEFAULT_TINY_MODEL);
}

enum {
    OPT_MODEL = 256, OPT_BACKEND, OPT_KV, OPT_KV_LAYOUT, OPT_TEMP, OPT_TOP_P, OPT_TOP_K,
    OPT_MIN_P, OPT_PENALTY, OPT_PENALTY_N, OPT_SEED, OPT_MAX_TOKENS, OPT_CTX, OPT_THREADS,
    OPT_SHOW_THINK, OPT_HIDE_THINK, OPT_TOKENS, OPT_RAW, OPT_SYSTEM, OPT_BATCH, OPT_PROMPT_LEN,
    OPT_GREEDY, OPT_STOP, OPT_VERSION, OPT_HELP, OPT_SAMPLING
};

static const struct option long_opts[] = {
    { "model", required_argument, NULL, OPT_MODEL },
    { "backend", required_argument, NULL, OPT_BACKEND },
    { "kv", required_argument, NULL, OPT_KV },
    { "kv-layout", required_argument, NULL, OPT_KV_LAYOUT },
    { "temperature", required_argument, NULL, OPT_TEMP },
    { "temp", required_argument, NULL, OPT_TEMP },
    { "top-p", required_argument, NULL, OPT_TOP_P },
    { "top-k", required_argument, NULL, OPT_TOP_K },
    { "min-p", required_argument, NULL, OPT_MIN_P },
    { "repeat-penalty", required_argument, NULL, OPT_PENALTY },
    { "repeat-last-n", required_argument, NULL, OPT_PENALTY_N },
    { "seed", required_argument, NULL, OPT_SEED },
    { "max-tokens", required_argument, NULL, OPT_MAX_TOKENS },
    { "ctx", required_argument, NULL, OPT_CTX },
    { "threads", required_argument, NULL, OPT_THREADS },
    { "show-thinking", no_argument, NULL, OPT_SHOW_THINK },
    { "hide-thinking", no_argument, NULL, OPT_HIDE_THINK },
    { "tokens", required_argument, NULL, OPT_TOKENS },
    { "raw", no_argument, NULL, OPT_RAW },
    { "system", required_argument, NULL, OPT_SYSTEM },
    { "batch", required_argument, NULL, OPT_BATCH },
    { "prompt-len", required_argument, NULL, OPT_PROMPT_LEN },
    { "greedy", no_argument, NULL, OPT_GREEDY },
    { "sampling", required_argument, NULL, OPT_SAMPLING },
    { "stop", required_argument, NULL, OPT_STOP },
    { "version", no_argument, NULL, OPT_VERSION },
    { "help", no_argument, NULL, OPT_HELP },
    { NULL, 0, NULL, 0 },
};

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
    fprintf(stderr, "dsqwen: --%s: unknown value '%s'\n", name, s);
    return 1;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    const char *cmd = argv[1];
    if (strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0 || strcmp(cmd, "help") == 0) {
        usage(stdout);
        return 0;
    }
    if (strcmp(cmd, "--version") == 0) {
        printf("dsqwen %s\n", dsq_version_string());
        return 0;
    }
    int is_bench = strcmp(cmd, "bench") == 0;
    if (strcmp(cmd, "generate") != 0 && strcmp(cmd, "chat") != 0 && !is_bench) {
        fprintf(stderr, "dsqwen: unknown command '%s' (generate, chat or bench)\n", cmd);
        usage(stderr);
        return 2;
    }

    cli_opts o;
    memset(&o, 0, sizeof o);
    o.backend = DSQ_BACKEND_AUTO;
    o.kv_dtype = -1;
    o.kv_layout = DSQ_KV_STATIC;
    o.sp = dsq_sampler_default_params();
    o.max_tokens = is_bench ? 64 : 512;
    o.show_thinking = 1;
    o.prompt_len = 128;
    /* every --stop is one argument, so argc bounds their number */
    const char **stops = calloc((size_t)argc, sizeof *stops);
    if (!stops) {
        fprintf(stderr, "dsqwen: no memory\n");
        return 1;
    }
    o.stops = stops;

    static const char *const backends[] = { "auto", "cpu", "cuda" };
    static const char *const kv_dtypes[] = { "f16", "int8", "f32" };
    static const char *const layouts[] = { "static", "paged" };
    int c, bad = 0;
    int32_t iv;
    optind = 2;
    while (!bad && (c = getopt_long(argc, argv, "", long_opts, NULL)) != -1) {
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
            o.sp_set |= CLI_SP_TOP_P;
            break;
        case OPT_TOP_K:
            bad = parse_int("top-k", optarg, 0, INT32_MAX, &o.sp.top_k);
            o.sp_set |= CLI_SP_TOP_K;
            break;
        case OPT_MIN_P:
            bad = parse_float("min-p", optarg, &o.sp.min_p);
            o.sp_set |= CLI_SP_MIN_P;
            break;
        case OPT_PENALTY:
            bad = parse_float("repeat-penalty", optarg, &o.sp.repetition_penalty);
            o.sp_set |= CLI_SP_PENALTY;
            break;
        case OPT_PENALTY_N:
            bad = parse_int("repeat-last-n", optarg, 0, INT32_MAX, &o.sp.penalty_last_n);
            o.sp_set |= CLI_SP_PENALTY_N;
            break;
        case OPT_SEED: {
            char *end;
            errno = 0;
            unsigned long long v = strtoull(optarg, &end, 0);
            if (end == optarg || *end || errno) {
                fprintf(stderr, "dsqwen: --seed wants an integer, got '%s'\n", optarg);
                bad = 1;
            }
            o.sp.seed = (uint64_t)v;
            o.sp_set |= CLI_SP_SEED;
            break;
        }
        case OPT_MAX_TOKENS: bad = parse_int("max-tokens", optarg, 1, INT32_MAX, &o.max_tokens); break;
        case OPT_CTX: bad = parse_int("ctx", optarg, 1, INT32_MAX, &o.ctx); break;
        case OPT_THREADS: bad = parse_int("threads", optarg, 0, 4096, &o.threads); break;
        case OPT_SHOW_THINK: o.show_thinking = 1; break;
        case OPT_HIDE_THINK: o.show_thinking = 0; break;
        case OPT_TOKENS: o.tokens = optarg; break;
        case OPT_RAW: o.raw = 1; break;
        case OPT_SYSTEM: o.system = optarg; break;
        case OPT_BATCH: o.batch = optarg; break;
        case OPT_PROMPT_LEN: bad = parse_int("prompt-len", optarg, 1, INT32_MAX, &iv); o.prompt_len = iv; break;
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
        case OPT_VERSION:
            printf("dsqwen %s\n", dsq_version_string());
            free(stops);
            return 0;
        case OPT_HELP:
            usage(stdout);
            free(stops);
            return 0;
        default: bad = 1; break;
        }
    }
    int rc = 2;
    if (bad)
        goto done;
    if (optind < argc) {
        if (strcmp(cmd, "generate") != 0 || optind + 1 < argc || o.tokens) {
            fprintf(stderr, "dsqwen: unexpected argument '%s'\n", argv[optind]);
            goto done;
        }
        o.prompt = argv[optind];
    }
    if (!o.model) {
        no_model_help();
        goto done;
    }
    if (strcmp(cmd, "generate") == 0)
        rc = cli_generate(&o);
    else if (strcmp(cmd, "chat") == 0)
        rc = cli_chat(&o);
    else
        rc = cli_bench(&o);
done:
    free(stops);
    return rc;
}
