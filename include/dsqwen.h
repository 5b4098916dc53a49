/*
 * dsqwen.h - the public C API of libdsqwen.
 *
 * libdsqwen runs DeepSeek-R1-Distill-Qwen-1.5B (and other Qwen2-architecture
 * checkpoints) from safetensors on NVIDIA GPUs, with a CPU backend as the
 * portable reference.  This is the only public header; it is C99 and usable
 * from C++ and through any C FFI (ctypes, cffi, cgo, Rust).
 *
 * Conventions that hold for every function below unless its comment says
 * otherwise:
 *
 *  - Status: fallible calls return dsq_status.  DSQ_OK is 0; errors are negative
 *    and their numeric values are fixed forever.  dsq_status_string() names
 *    them.  A failing call also stores a message: per thread
 *    (dsq_last_error_message()) and, for calls taking a context, per context
 *    (dsq_ctx_last_error()).
 *  - The library never prints, exits or aborts.  Diagnostics go to an optional
 *    log callback (dsq_set_log_callback()).
 *  - Ownership: objects returned through `**out` are owned by the caller and
 *    released with the matching *_free(); every *_free(NULL) is a no-op.  On
 *    failure `*out` is set to NULL and nothing is leaked.
 *  - Params structs start with `uint32_t struct_size`.  Get one from the
 *    matching *_default_params() (a static inline function of this header,
 *    built into the caller, so it never writes more bytes than the caller's
 *    struct has) or, from an FFI, from *_params_init(p, sizeof *p); change
 *    fields, pass it in.  Fields are only ever appended, so a binary built
 *    against an older header keeps working: the library reads only the first
 *    struct_size bytes and uses defaults for the rest.  A struct_size smaller
 *    than the first version of the struct, or larger than this library knows,
 *    is DSQ_ERR_STRUCT_SIZE.  (The structs are never returned by value from
 *    the library: a larger struct from a newer library would overrun an older
 *    caller's.)
 *  - Threads: a dsq_model is immutable after load and may be used by many
 *    threads and contexts at once.  A dsq_ctx must be used by one thread at a
 *    time (calls on different contexts may run concurrently).  A dsq_tokenizer
 *    is immutable and thread-safe; a dsq_sampler, a dsq_detok_stream and a
 *    dsq_stopper belong to one thread at a time.
 *  - CUDA: each context owns one CUDA stream, created by dsq_ctx_new(), and
 *    all of its GPU work runs on that stream.  Calls that return results to
 *    host memory (logits) synchronize that stream before returning; calls
 *    asked for no logits do not wait for the GPU to finish.  The CPU backend
 *    is synchronous.
 */
#ifndef DSQWEN_H
#define DSQWEN_H

#include <stddef.h>
#include <stdint.h>
#include <string.h> /* memset in the inline *_default_params() */

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32) && defined(DSQ_BUILDING_LIBRARY)
#define DSQ_API __declspec(dllexport)
#elif defined(_WIN32)
#define DSQ_API __declspec(dllimport)
#elif defined(__GNUC__) && __GNUC__ >= 4
#define DSQ_API __attribute__((visibility("default")))
#else
#define DSQ_API
#endif

/* ------------------------------------------------------------------------ */
/* Version                                                                  */
/* ------------------------------------------------------------------------ */

#define DSQ_VERSION_MAJOR 0
#define DSQ_VERSION_MINOR 1
#define DSQ_VERSION_PATCH 0
#define DSQ_VERSION_NUMBER \
    (DSQ_VERSION_MAJOR * 10000 + DSQ_VERSION_MINOR * 100 + DSQ_VERSION_PATCH)

/** "MAJOR.MINOR.PATCH" of the library actually loaded (not of this header).
 *  Never fails; the string is static.  Thread-safe. */
DSQ_API const char *dsq_version_string(void);

/** DSQ_VERSION_NUMBER of the library actually loaded.  Thread-safe. */
DSQ_API unsigned dsq_version_number(void);

/** What this library was built with: a static, space-separated list of
 *  words, "cpu" always, "cuda" when the CUDA backend is compiled in (whether
 *  a GPU is present is dsq_backend_available()'s question).  Never NULL.
 *  Thread-safe. */
DSQ_API const char *dsq_build_features(void);

/* ------------------------------------------------------------------------ */
/* Status codes and errors                                                  */
/* ------------------------------------------------------------------------ */

typedef enum dsq_status {
    DSQ_OK = 0,
    DSQ_ERR_INVALID_ARG = -1,     /* NULL pointer, bad count, bad enum value  */
    DSQ_ERR_STRUCT_SIZE = -2,     /* params struct_size unknown               */
    DSQ_ERR_OUT_OF_MEMORY = -3,   /* host allocation failed                   */
    DSQ_ERR_IO = -4,              /* open/read/mmap of a file failed          */
    DSQ_ERR_FORMAT = -5,          /* malformed safetensors / JSON / tokenizer */
    DSQ_ERR_CONFIG = -6,          /* config.json value missing or invalid     */
    DSQ_ERR_UNSUPPORTED = -7,     /* valid but not supported (arch, option)   */
    DSQ_ERR_MISSING_TENSOR = -8,  /* a tensor the config implies is absent    */
    DSQ_ERR_SHAPE = -9,           /* tensor has the wrong shape               */
    DSQ_ERR_DTYPE = -10,          /* tensor dtype not BF16/F16/F32            */
    DSQ_ERR_TOKEN = -11,          /* token id out of range                    */
    DSQ_ERR_SEQ = -12,            /* unknown / inactive / out-of-range seq id */
    DSQ_ERR_CONTEXT_FULL = -13,   /* sequence would exceed max context        */
    DSQ_ERR_KV_FULL = -14,        /* paged KV pool exhausted                  */
    DSQ_ERR_BATCH = -15,          /* too many tokens/sequences for one call   */
    DSQ_ERR_BUFFER_TOO_SMALL = -16, /* caller's output buffer too small       */
    DSQ_ERR_NO_DEVICE = -17,      /* CUDA requested but no usable GPU         */
    DSQ_ERR_DEVICE_OOM = -18,     /* GPU memory exhausted                     */
    DSQ_ERR_DEVICE = -19,         /* any other CUDA / cuBLAS failure          */
    DSQ_ERR_INTERNAL = -20,       /* a bug in libdsqwen; please report        */
    DSQ_ERR_CANCELLED = -21       /* a callback asked to stop (model load)    */
} dsq_status;

/** Static English name of a status ("DSQ_ERR_KV_FULL: KV cache is full").
 *  Unknown values give "unknown status".  Never NULL.  Thread-safe. */
DSQ_API const char *dsq_status_string(dsq_status status);

/** Message of the last failing libdsqwen call made by this thread (or "" if
 *  none).  Valid until the next libdsqwen call on this thread.  Thread-local,
 *  so thread-safe. */
DSQ_API const char *dsq_last_error_message(void);

typedef enum dsq_log_level {
    DSQ_LOG_ERROR = 0,
    DSQ_LOG_WARN = 1,
    DSQ_LOG_INFO = 2,
    DSQ_LOG_DEBUG = 3
} dsq_log_level;

typedef void (*dsq_log_fn)(dsq_log_level level, const char *message, void *user);

/** Install a process-wide log callback (NULL removes it).  Messages at or
 *  below `max_level` are delivered; the callback may be called from any thread
 *  that calls into the library and must be thread-safe itself.  Setting the
 *  callback while other threads are inside the library is allowed (function,
 *  user pointer and level change together) but a message already being
 *  delivered may reach the old callback. */
DSQ_API void dsq_set_log_callback(dsq_log_fn fn, void *user, dsq_log_level max_level);

/* ------------------------------------------------------------------------ */
/* Enumerations used in params                                              */
/* ------------------------------------------------------------------------ */

typedef enum dsq_backend {
    DSQ_BACKEND_AUTO = 0, /* CUDA if built in and a GPU is usable, else CPU */
    DSQ_BACKEND_CPU = 1,
    DSQ_BACKEND_CUDA = 2
} dsq_backend;

/** 1 if `backend` can be used on this machine now, else 0 (never an error
 *  status).  DSQ_BACKEND_CPU and DSQ_BACKEND_AUTO: always 1.
 *  DSQ_BACKEND_CUDA: 1 when the CUDA backend is compiled in (see
 *  dsq_build_features()) and a usable CUDA device is found; the first call
 *  initializes the CUDA runtime, which may take a second.  Values that are
 *  not a dsq_backend: 0.  Thread-safe; no CUDA stream is used. */
DSQ_API int dsq_backend_available(dsq_backend backend);

typedef enum dsq_kv_layout {
    DSQ_KV_STATIC = 0, /* one contiguous slot of max_context per sequence   */
    DSQ_KV_PAGED = 1   /* shared pool of fixed-size blocks + block tables    */
} dsq_kv_layout;

typedef enum dsq_kv_dtype {
    DSQ_KV_F16 = 0,  /* IEEE half                                           */
    DSQ_KV_INT8 = 1, /* symmetric int8, one fp32 scale per (token, KV head)  */
    DSQ_KV_F32 = 2   /* CPU backend only: exact reference storage           */
} dsq_kv_dtype;

/* ------------------------------------------------------------------------ */
/* Model                                                                    */
/* ------------------------------------------------------------------------ */

typedef struct dsq_model dsq_model;

/** Load-progress callback (dsq_model_params.progress).  Called by
 *  dsq_model_load() on the thread that called it, synchronously, with
 *  `fraction` in [0, 1], never decreasing from one call to the next: a few
 *  calls while the files are parsed and checked, then after each layer's
 *  weights are in place (with the CUDA backend: uploaded), and 1 once the
 *  model is ready.  Return 0 to continue; any other value cancels the load,
 *  which then frees everything it made and returns DSQ_ERR_CANCELLED.  The
 *  callback must not free or use the model being loaded (it has none yet);
 *  other libdsqwen calls are allowed. */
typedef int (*dsq_progress_fn)(float fraction, void *user);

typedef struct dsq_model_params {
    uint32_t struct_size;  /* sizeof(dsq_model_params)                      */
    int32_t backend;       /* dsq_backend; default DSQ_BACKEND_AUTO          */
    int32_t device;        /* CUDA device index; default 0                   */
    int32_t n_threads;     /* threads for the CPU backend's load-time scan
                              of the weights (skip_finite_check); 0
                              (default) = all cores; outside 0..1024:
                              DSQ_ERR_INVALID_ARG                        */
    int32_t load_tokenizer; /* 1 (default): load tokenizer.json if present   */
    /* Fields below were added after 0.1.0 (a struct_size that stops before
     * one leaves it at its default). */
    int32_t skip_finite_check; /* 0 (default): every weight the model uses is
                              checked once at load and a NaN or +-Inf
                              anywhere is refused with DSQ_ERR_FORMAT naming
                              the tensor (CPU: one pass over the mapped
                              files, split over n_threads; CUDA: a kernel over
                              the uploaded bf16/fp32 copy, so an F32/F16
                              value that overflows bf16 is refused too).
                              1: skip the scan, for callers who trust their
                              files (loads a checkpoint whose every call would
                              return NaN logits).                         */
    int32_t copy_weights;  /* 0 (default): the CPU backend computes from the
                              memory-mapped files, which must then stay
                              unchanged while the model lives (see
                              dsq_model_load).  1: the CPU backend copies
                              every tensor it uses into private memory at
                              load and unmaps the files (costs the weights'
                              size in RAM; the files may then change or
                              go).  The CUDA backend always copies the
                              weights to the GPU and unmaps the files at
                              the end of the load; it ignores this field.  */
    dsq_progress_fn progress; /* NULL (default): no progress reports; see
                                 dsq_progress_fn                         */
    void *progress_user;    /* passed to `progress` unchanged; default NULL  */
    /* Added in 0.2.0: weight quantization (see docs/quantization.md). */
    int32_t quantize;       /* dsq_quantize; DSQ_QUANTIZE_NONE (default):
                               compute with the weights as the checkpoint
                               stores them (bf16/f16/f32, or its own AWQ,
                               GPTQ or dsqwen 4-/8-bit format, detected from
                               config.json's quantization_config).  INT8 /
                               Q4: quantize bf16/f16/f32 linear weights at
                               load (the embedding stays as stored).  Asking
                               to quantize a checkpoint whose layers are
                               already quantized: DSQ_ERR_UNSUPPORTED (one
                               with only its head quantized, as `dsqwen
                               quantize --head` writes, is accepted).     */
    int32_t quantize_head;  /* 1: quantize the output head to int8 (one
                               scale per row) at load; 0 (default) keeps it
                               as stored.  Works with any quantize value:
                               with NONE it is the only change, which is how
                               an AWQ / GPTQ checkpoint (whose lm_head is
                               bf16/f16) gets an 8-bit head; a head the
                               checkpoint already stores quantized is kept
                               as it is                                     */
    /* Added in 0.2.0: tensor parallelism over GPUs through NCCL (CUDA
     * backend; see docs/tensor_parallel.md). */
    int32_t tp_world;       /* tensor-parallel degree; 0 or 1 (default): none
                               (1 with tp_devices or tp_id on CUDA: one rank
                               through NCCL, the TP path on one GPU).  The
                               CPU backend runs every rank in-process, a
                               verification mode, not faster              */
    const int32_t *tp_devices; /* one process driving tp_world local GPUs:
                               [tp_world] CUDA device of each rank (rank 0
                               owns the contexts' results); NULL (default)
                               with tp_world > 1: one process per rank,
                               identified by tp_rank and tp_id             */
    int32_t tp_rank;        /* one process per rank: this process's rank,
                               0..tp_world-1 (its GPU is `device`)         */
    const void *tp_id;      /* one process per rank: the DSQ_TP_ID_BYTES
                               bytes dsq_tp_unique_id() made once (on rank
                               0), passed to every rank by the application's
                               own launcher (e.g. MPI); NULL (default)      */
    float tp_timeout_s;     /* longest wait for a peer (joining, a step)
                               before the call fails with DSQ_ERR_DEVICE;
                               0 (default) = 60 seconds                    */
} dsq_model_params;

/** dsq_model_params.quantize values. */
typedef enum dsq_quantize {
    DSQ_QUANTIZE_NONE = 0, /* as stored                                       */
    DSQ_QUANTIZE_INT8 = 1, /* int8, one scale per output row (symmetric)      */
    DSQ_QUANTIZE_Q4 = 2    /* 4-bit, groups of 128 inputs, scale + zero point */
} dsq_quantize;

/** Bytes of a tensor-parallel communicator id (dsq_model_params.tp_id). */
#define DSQ_TP_ID_BYTES 128

/** Make a fresh communicator id for one-process-per-rank tensor
 *  parallelism into id[0..DSQ_TP_ID_BYTES): call once (on rank 0) and hand
 *  the bytes to every rank's dsq_model_params.tp_id.  The library opens no
 *  sockets for this: NCCL's id names rank 0's listening address.
 *
 *  Returns DSQ_OK, DSQ_ERR_INVALID_ARG (NULL id, size < DSQ_TP_ID_BYTES),
 *  DSQ_ERR_UNSUPPORTED (built without NCCL, or libnccl.so.2 cannot be
 *  opened: the message says which), DSQ_ERR_DEVICE.  Thread-safe. */
DSQ_API dsq_status dsq_tp_unique_id(void *id, size_t size);

/** Fill the first `struct_size` bytes of *params with defaults and set
 *  params->struct_size = struct_size.  DSQ_ERR_INVALID_ARG (NULL),
 *  DSQ_ERR_STRUCT_SIZE (size below the first version or above this
 *  library's).  Thread-safe. */
DSQ_API dsq_status dsq_model_params_init(dsq_model_params *params, uint32_t struct_size);

/** dsq_model_params with every field at its default: calls dsq_model_params_init()
 *  with this header's sizeof.  Inline so the library never writes past the
 *  caller's struct.  If the library is older than this header the struct
 *  keeps struct_size and zeros, and the library refuses it with
 *  DSQ_ERR_STRUCT_SIZE when it is used. */
static inline dsq_model_params dsq_model_default_params(void)
{
    dsq_model_params p;
    memset(&p, 0, sizeof p);
    p.struct_size = (uint32_t)sizeof p;
    (void)dsq_model_params_init(&p, (uint32_t)sizeof p);
    return p;
}

/** Load a model.
 *
 *  `path` is either a directory holding `config.json` and `model.safetensors`
 *  (or `model.safetensors.index.json` with its shards), or a `.safetensors`
 *  file with `config.json` in the same directory.  `params` may be NULL for
 *  defaults.  The safetensors files are memory-mapped and fully validated
 *  (header, dtypes, offsets, shapes against the config) before any use, and
 *  every weight value is checked to be finite (unless
 *  params->skip_finite_check).  Every file is opened without blocking and
 *  must be a regular file (a FIFO or device is DSQ_ERR_IO).  JSON files with
 *  a string holding NUL (raw or \u0000) are DSQ_ERR_FORMAT; a key repeated in
 *  one object of config.json is DSQ_ERR_CONFIG (of the index or
 *  generation_config.json DSQ_ERR_FORMAT), since cJSON and Python would
 *  disagree on what such a file says.
 *  With the CUDA backend the weights are copied to the GPU once and the
 *  mapping is dropped.
 *
 *  Files modified while mapped: the CPU backend (without
 *  params->copy_weights) reads the weights straight from the mapping for
 *  the model's whole life.  The files must not change until
 *  dsq_model_free(): a file truncated while mapped makes the next read of
 *  its lost pages raise SIGBUS, which kills the process (the library cannot
 *  turn it into a status); bytes overwritten in place show through the
 *  mapping and silently change the results.  Replacing a file by rename (a
 *  new inode), as downloaders do, is safe.  Callers who cannot promise this
 *  set params->copy_weights = 1.  Either backend reads the files during the
 *  load itself, so they must not change before dsq_model_load() returns.
 *
 *  Returns DSQ_OK and a new model in *out, or: DSQ_ERR_INVALID_ARG (NULL path
 *  or out), DSQ_ERR_STRUCT_SIZE, DSQ_ERR_IO, DSQ_ERR_FORMAT, DSQ_ERR_CONFIG,
 *  DSQ_ERR_UNSUPPORTED, DSQ_ERR_MISSING_TENSOR, DSQ_ERR_SHAPE, DSQ_ERR_DTYPE,
 *  DSQ_ERR_OUT_OF_MEMORY, DSQ_ERR_NO_DEVICE, DSQ_ERR_DEVICE_OOM,
 *  DSQ_ERR_DEVICE, DSQ_ERR_CANCELLED (params->progress returned nonzero).
 *  Thread-safe (loads may run concurrently).  Synchronous. */
DSQ_API dsq_status dsq_model_load(const char *path, const dsq_model_params *params,
                                  dsq_model **out);

/** Free a model.  All contexts created from it must be freed first.  NULL is
 *  a no-op.  Not thread-safe with respect to other uses of the same model. */
DSQ_API void dsq_model_free(dsq_model *model);

typedef struct dsq_model_info {
    uint32_t struct_size;      /* caller sets sizeof(dsq_model_info)          */
    int32_t backend;           /* dsq_backend actually in use (CPU or CUDA)   */
    int32_t n_vocab;           /* rows of the embedding / logits width        */
    int32_t n_embd;            /* hidden size                                 */
    int32_t n_layers;
    int32_t n_heads;           /* query heads                                 */
    int32_t n_kv_heads;
    int32_t head_dim;
    int32_t n_ff;              /* MLP intermediate size                       */
    int32_t max_context;       /* max_position_embeddings                     */
    int32_t tie_embeddings;    /* 1 if lm_head shares the embedding table     */
    float rope_theta;
    float rms_norm_eps;
    int64_t n_params;          /* parameters in the checkpoint                */
    int64_t weight_bytes;      /* bytes of the weights the model uses, as
                                  stored (quantized linears: their quantized
                                  arrays, also after quantizing at load)     */
    int64_t device_bytes;      /* GPU memory held by the model (0 on CPU)     */
    int32_t bos_token;         /* from config.json, -1 if absent              */
    int32_t eos_token;         /* from config.json, -1 if absent              */
} dsq_model_info;

/** Fill `info` (whose struct_size the caller sets; fields past it are left
 *  untouched).  DSQ_ERR_INVALID_ARG on NULL, DSQ_ERR_STRUCT_SIZE.
 *  Thread-safe. */
DSQ_API dsq_status dsq_model_get_info(const dsq_model *model, dsq_model_info *info);

/** Write the model's weights, as it computes with them, as a checkpoint in
 *  directory `out_dir` (created if missing; files of the same names are
 *  replaced): model.safetensors, config.json (the source's, with the
 *  quantization_config of the weights: the library's own "dsqwen" format
 *  for quantized linears, see docs/quantization.md; removed when nothing is
 *  quantized) and copies of the source's tokenizer*, generation_config.json
 *  and special_tokens_map.json files.  Loading the result gives the same
 *  logits bit for bit without converting anything again.  With
 *  dsq_model_params.quantize this writes a quantized checkpoint (what
 *  `dsqwen quantize` does); an AWQ or GPTQ checkpoint is written in the
 *  repacked 4-bit layout.
 *  Needs the weights on the host: a model loaded with the CPU backend
 *  (otherwise DSQ_ERR_UNSUPPORTED).  DSQ_ERR_INVALID_ARG on NULL or when
 *  `out_dir` is the model's own directory; DSQ_ERR_IO (message with the
 *  path and the system's reason), DSQ_ERR_OUT_OF_MEMORY.  Files written
 *  before a failure are left.  Thread-safe with other read-only uses of
 *  the model. */
DSQ_API dsq_status dsq_model_save(const dsq_model *model, const char *out_dir);

/* ------------------------------------------------------------------------ */
/* Context: KV cache, scratch, threads, CUDA stream                         */
/* ------------------------------------------------------------------------ */

typedef struct dsq_ctx dsq_ctx;

typedef struct dsq_ctx_params {
    uint32_t struct_size;   /* sizeof(dsq_ctx_params)                         */
    int32_t max_seqs;       /* sequence ids are 0..max_seqs-1; default 1;
                               at most 1,048,576 (host bookkeeping is ~20
                               bytes per id; paged block tables grow with
                               the tokens cached, not with max_seqs)      */
    int32_t max_context;    /* tokens per sequence; default min(4096, model)  */
    int32_t max_batch_tokens; /* most tokens one prefill chunk or decode step
                                 processes at once; longer prompts are split
                                 internally; default 512                      */
    int32_t kv_layout;      /* dsq_kv_layout; default DSQ_KV_STATIC           */
    int32_t kv_dtype;       /* dsq_kv_dtype; default DSQ_KV_F16.  The CPU
                               backend stores F32, F16 or INT8 as asked (F32
                               is its exact reference mode); CUDA stores F16
                               or INT8 and refuses F32 (DSQ_ERR_UNSUPPORTED) */
    int32_t kv_block_size;  /* paged: tokens per block; default 16            */
    int64_t kv_pool_tokens; /* paged: pool size in tokens (rounded down to
                               whole blocks); 0 = use the budget          */
    int64_t kv_budget_bytes;/* paged: pool size in bytes when kv_pool_tokens
                               is 0 (rounded down to whole blocks); 0 = room
                               for every sequence to reach max_context     */
    int32_t n_threads;      /* CPU backend worker threads; 0 = all cores      */
} dsq_ctx_params;

/** As dsq_model_params_init(), for dsq_ctx_params.  Thread-safe. */
DSQ_API dsq_status dsq_ctx_params_init(dsq_ctx_params *params, uint32_t struct_size);

/** dsq_ctx_params with every field at its default: calls dsq_ctx_params_init()
 *  with this header's sizeof.  Inline so the library never writes past the
 *  caller's struct.  If the library is older than this header the struct
 *  keeps struct_size and zeros, and the library refuses it with
 *  DSQ_ERR_STRUCT_SIZE when it is used. */
static inline dsq_ctx_params dsq_ctx_default_params(void)
{
    dsq_ctx_params p;
    memset(&p, 0, sizeof p);
    p.struct_size = (uint32_t)sizeof p;
    (void)dsq_ctx_params_init(&p, (uint32_t)sizeof p);
    return p;
}

/** Create a context on `model`: allocates the KV cache and all scratch
 *  memory up front (prefill and decode allocate no buffers later; on CUDA the
 *  first decode step at each batch size captures a CUDA graph and the first
 *  product of each shape picks a cuBLASLt algorithm, which the CUDA runtime
 *  and cuBLASLt may allocate for once), starts the worker threads (CPU) or
 *  creates the CUDA stream and library handles.
 *  `params` may be NULL for defaults.
 *
 *  Returns DSQ_OK, or DSQ_ERR_INVALID_ARG (NULL model/out, non-positive
 *  sizes, max_context above the model's), DSQ_ERR_STRUCT_SIZE,
 *  DSQ_ERR_UNSUPPORTED (layout or dtype this backend lacks, with a message),
 *  DSQ_ERR_OUT_OF_MEMORY, DSQ_ERR_DEVICE_OOM, DSQ_ERR_DEVICE.  Thread-safe. */
DSQ_API dsq_status dsq_ctx_new(dsq_model *model, const dsq_ctx_params *params,
                               dsq_ctx **out);

/** Free a context, its cache and threads.  NULL is a no-op.  Synchronizes
 *  the context's stream first. */
DSQ_API void dsq_ctx_free(dsq_ctx *ctx);

/** Message of the last failing call on this context ("" if none).  Valid
 *  until the next call on the context. */
DSQ_API const char *dsq_ctx_last_error(const dsq_ctx *ctx);

typedef struct dsq_ctx_info {
    uint32_t struct_size;     /* caller sets sizeof(dsq_ctx_info)             */
    int32_t backend;          /* dsq_backend in use                           */
    int32_t kv_layout;
    int32_t kv_dtype;         /* storage actually used                        */
    int32_t max_seqs;
    int32_t max_context;
    int32_t max_batch_tokens;
    int32_t kv_block_size;    /* 0 for static                                 */
    int64_t kv_bytes_per_token; /* all layers, K and V (and scales)           */
    int64_t kv_capacity_tokens; /* tokens the cache can hold in all           */
    int64_t kv_free_tokens;   /* paged: tokens still free in the pool         */
    int64_t kv_bytes;         /* memory held by the KV cache                  */
    int64_t scratch_bytes;    /* other memory held by the context             */
    int32_t n_threads;        /* CPU worker threads (0 on CUDA)               */
    int32_t n_active_seqs;
} dsq_ctx_info;

/** Fill `info` (caller sets struct_size).  DSQ_ERR_INVALID_ARG,
 *  DSQ_ERR_STRUCT_SIZE.  Same thread rule as the context. */
DSQ_API dsq_status dsq_ctx_get_info(const dsq_ctx *ctx, dsq_ctx_info *info);

/** Wait until all work queued on the context has finished: on CUDA, the
 *  context's stream (e.g. device logits written by dsq_step(), or a step
 *  that sampled nothing and so returned before the GPU ran); a device fault
 *  that surfaces is returned here.  On the CPU backend every call is
 *  already synchronous and this returns DSQ_OK at once.  The caller's
 *  current CUDA device is left as it was.
 *
 *  Returns DSQ_OK, DSQ_ERR_INVALID_ARG (NULL ctx), DSQ_ERR_DEVICE.  Same
 *  thread rule as the context. */
DSQ_API dsq_status dsq_ctx_synchronize(dsq_ctx *ctx);

/** The context's CUDA stream, as a `cudaStream_t` cast to void *, for CUDA
 *  callers that read device logits on it (enqueue their kernels on it, or
 *  make their stream wait on it with an event) instead of synchronizing.
 *  The library owns the stream; it is valid until dsq_ctx_free().  Do not
 *  destroy it or capture it into a graph while a library call runs.
 *
 *  Returns DSQ_OK, DSQ_ERR_INVALID_ARG (NULL ctx or stream),
 *  DSQ_ERR_UNSUPPORTED (the context is not on the CUDA backend; *stream is
 *  set to NULL).  Thread-safe; no CUDA call is made. */
DSQ_API dsq_status dsq_ctx_cuda_stream(const dsq_ctx *ctx, void **stream);

/* ------------------------------------------------------------------------ */
/* Inference                                                                */
/* ------------------------------------------------------------------------ */

/** dsq_prefill flags. */
#define DSQ_LOGITS_LAST 0u /* logits of the last prompt token only: [n_vocab] */
#define DSQ_LOGITS_ALL 1u  /* logits of every prompt token: [n_tokens][n_vocab] */

/** Append `n_tokens` tokens to sequence `seq` (0 <= seq < max_seqs) and run
 *  them through the model as one prompt (matrix-matrix work, split into
 *  chunks of max_batch_tokens).  A sequence that holds no tokens starts at
 *  position 0; one that already holds tokens is extended (multi-turn chat).
 *
 *  `logits`: host buffer of n_vocab floats (DSQ_LOGITS_LAST) or
 *  n_tokens * n_vocab floats (DSQ_LOGITS_ALL), row-major, or NULL to skip the
 *  output head.  On CUDA, returns after the logits are copied (synchronizes
 *  the context's stream); with logits NULL it does not wait for the GPU.
 *
 *  Returns DSQ_OK, or DSQ_ERR_INVALID_ARG (NULL ctx/tokens, n_tokens <= 0,
 *  unknown flags), DSQ_ERR_SEQ, DSQ_ERR_TOKEN (an id outside 0..n_vocab-1),
 *  DSQ_ERR_CONTEXT_FULL (length would exceed max_context), DSQ_ERR_KV_FULL
 *  (paged pool exhausted), DSQ_ERR_DEVICE_OOM, DSQ_ERR_DEVICE.  On any error
 *  the sequence is left exactly as it was before the call (its cache length
 *  does not change) and every other sequence is untouched.  With logits NULL
 *  on CUDA the call returns before the GPU has run, so a device fault in that
 *  work is reported by a later call on the context (the sequence has then
 *  already advanced). */
DSQ_API dsq_status dsq_prefill(dsq_ctx *ctx, int32_t seq, const int32_t *tokens,
                               int32_t n_tokens, uint32_t flags, float *logits);

/** One decode step for a batch of independent sequences: token tokens[i] is
 *  appended to sequence seqs[i] (which must already hold at least one token,
 *  from dsq_prefill; an empty or removed sequence is DSQ_ERR_SEQ) and its
 *  next-token logits are written to logits[i * n_vocab .. ]; logits may be
 *  NULL.  Sequence ids in one call must
 *  be distinct; n_seqs may not exceed max_batch_tokens.
 *
 *  Returns DSQ_OK, or DSQ_ERR_INVALID_ARG (NULLs, n_seqs <= 0, a repeated
 *  seq id), DSQ_ERR_BATCH, DSQ_ERR_SEQ, DSQ_ERR_TOKEN, DSQ_ERR_CONTEXT_FULL,
 *  DSQ_ERR_KV_FULL, DSQ_ERR_DEVICE_OOM, DSQ_ERR_DEVICE.  On error no sequence
 *  changes.  On CUDA it synchronizes only to copy the logits out (and, like
 *  dsq_prefill, with logits NULL reports device faults on a later call); it
 *  allocates nothing itself (see dsq_ctx_new on the first step of a batch
 *  size). */
DSQ_API dsq_status dsq_decode_step(dsq_ctx *ctx, int32_t n_seqs, const int32_t *seqs,
                                   const int32_t *tokens, float *logits);

/** Drop sequence `seq`: its cache is released (paged blocks return to the
 *  pool) and the id may be reused for a new sequence.  Removing an empty
 *  sequence is allowed.  DSQ_ERR_INVALID_ARG, DSQ_ERR_SEQ (id out of range). */
DSQ_API dsq_status dsq_seq_remove(dsq_ctx *ctx, int32_t seq);

/** Number of tokens held for `seq` in *n_out.  DSQ_ERR_INVALID_ARG,
 *  DSQ_ERR_SEQ. */
DSQ_API dsq_status dsq_seq_length(const dsq_ctx *ctx, int32_t seq, int32_t *n_out);

/** Keep only the first `new_len` tokens of sequence `seq` (0 <= new_len <=
 *  its length): regenerate from an earlier point, or reject the draft
 *  tokens of speculative decoding.  The next dsq_prefill/dsq_decode_step
 *  continues at position new_len and gives the logits a sequence of those
 *  new_len tokens would give.  Paged: whole blocks past new_len return to
 *  the pool (a block still shared with a fork only loses this sequence's
 *  reference).  new_len == 0 empties the sequence like dsq_seq_remove;
 *  new_len == length is a no-op.  The tokens dsq_step() penalises are
 *  truncated with it.  No KV work; CUDA: the sequence's last (up to
 *  DSQ_PENALTY_MAX_N) tokens are uploaded for the GPU sampler on the
 *  context's stream from pageable memory, which waits for the stream's
 *  earlier work.
 *  Returns DSQ_OK, or DSQ_ERR_INVALID_ARG (NULL ctx, new_len < 0 or beyond
 *  the length), DSQ_ERR_SEQ (id out of range); on error nothing changes.
 *  Same thread rule as the context. */
DSQ_API dsq_status dsq_seq_truncate(dsq_ctx *ctx, int32_t seq, int32_t new_len);

/** Start sequence `dst` as a copy of sequence `src`: afterwards dst holds
 *  the same tokens and continues exactly as src would (a system prompt or
 *  few-shot prefix prefilled once, then forked for each request); both then
 *  advance independently.  Paged cache: dst shares src's blocks by reference
 *  count and costs no KV memory until it writes; a block shared and only
 *  partly filled is copied (one block, on the device) the first time either
 *  sequence writes into it, which is when DSQ_ERR_KV_FULL can occur (from
 *  dsq_prefill / dsq_decode_step, all-or-nothing as usual).  Static cache:
 *  src's rows are copied into dst's slot (CUDA: cudaMemcpyAsync on the
 *  context's stream, no synchronisation; ordered before the next step).
 *  dst also starts with a copy of src's token history (what dsq_step()
 *  penalises; CUDA: its last up to DSQ_PENALTY_MAX_N tokens are uploaded on
 *  the context's stream from pageable memory, which waits for the stream's
 *  earlier work).
 *  Returns DSQ_OK, or DSQ_ERR_INVALID_ARG (NULL ctx, src == dst), DSQ_ERR_SEQ
 *  (an id out of range, src empty, dst active: remove it first),
 *  DSQ_ERR_OUT_OF_MEMORY (host, for dst's block table or token history),
 *  DSQ_ERR_DEVICE; on
 *  error nothing changes.  Same thread rule as the context. */
DSQ_API dsq_status dsq_seq_fork(dsq_ctx *ctx, int32_t src, int32_t dst);

/* ------------------------------------------------------------------------ */
/* Tokenizer (byte-level BPE from tokenizer.json)                           */
/* ------------------------------------------------------------------------ */

typedef struct dsq_tokenizer dsq_tokenizer;

/** Load a tokenizer from `path`: a tokenizer.json file or a directory holding
 *  one (tokenizer_config.json beside it is read if present).
 *  DSQ_ERR_INVALID_ARG, DSQ_ERR_IO, DSQ_ERR_FORMAT, DSQ_ERR_UNSUPPORTED
 *  (a model/normalizer/pre-tokenizer type other than Qwen2's byte-level BPE),
 *  DSQ_ERR_OUT_OF_MEMORY.  The tokenizer is immutable and thread-safe. */
DSQ_API dsq_status dsq_tokenizer_load(const char *path, dsq_tokenizer **out);

/** Free a tokenizer loaded with dsq_tokenizer_load().  NULL is a no-op.
 *  Do not free the one borrowed from dsq_model_tokenizer(). */
DSQ_API void dsq_tokenizer_free(dsq_tokenizer *tok);

/** The tokenizer loaded together with `model` (NULL if the model directory had
 *  no tokenizer.json or load_tokenizer was 0).  Borrowed: valid as long as the
 *  model.  Thread-safe. */
DSQ_API const dsq_tokenizer *dsq_model_tokenizer(const dsq_model *model);

/** dsq_tokenize flags. */
#define DSQ_TOKENIZE_ADD_SPECIAL 1u   /* add BOS as the post-processor says    */
#define DSQ_TOKENIZE_PLAIN_SPECIAL 2u /* treat special-token text as plain text */

/** Encode UTF-8 `text` of `len` bytes.  Writes up to `cap` ids to `tokens`
 *  and the number needed to *n_out (always set).  If *n_out > cap the call
 *  returns DSQ_ERR_BUFFER_TOO_SMALL and the caller retries with a larger
 *  buffer (tokens may be NULL with cap 0 to query).  Invalid UTF-8 is first
 *  converted lossily, as Python's bytes.decode("utf-8", errors="replace")
 *  and Rust's String::from_utf8_lossy do: each maximal ill-formed
 *  subsequence becomes one U+FFFD (a stray or impossible byte is one; a
 *  truncated sequence such as E2 82 is one in all), and the result is
 *  encoded exactly as Hugging Face tokenizers encode that text.  Added tokens
 *  are matched in the text before normalization; with
 *  DSQ_TOKENIZE_PLAIN_SPECIAL every added token's text (special or not) is
 *  encoded as ordinary text.  DSQ_ERR_INVALID_ARG, DSQ_ERR_OUT_OF_MEMORY,
 *  DSQ_ERR_FORMAT when the tokenizer.json pre-tokenizer regex exceeds the
 *  regex engine's match limits on this text (a pattern that backtracks
 *  without bound, such as (a+)+$; the message says so; the tokenizer stays
 *  usable).  Thread-safe. */
DSQ_API dsq_status dsq_tokenize(const dsq_tokenizer *tok, const char *text, size_t len,
                                uint32_t flags, int32_t *tokens, size_t cap, size_t *n_out);

/** Decode ids to UTF-8 bytes (special tokens included as their text unless
 *  `skip_special`; as in HF, that skips only added tokens marked special,
 *  e.g. <｜end▁of▁sentence｜>, not <think> or <｜User｜>).  Writes up to `cap` bytes plus a terminating NUL if room,
 *  and the byte length (without NUL) to *len_out.  Byte sequences that are
 *  not valid UTF-8 are emitted as-is.  DSQ_ERR_TOKEN for ids out of range,
 *  DSQ_ERR_BUFFER_TOO_SMALL if len+1 > cap.  Thread-safe. */
DSQ_API dsq_status dsq_detokenize(const dsq_tokenizer *tok, const int32_t *tokens, size_t n,
                                  int skip_special, char *text, size_t cap, size_t *len_out);

/** Number of ids the tokenizer knows (vocab plus added tokens; ids in
 *  0..n-1 that have no token are reported invalid by dsq_token_text). */
DSQ_API int32_t dsq_tokenizer_n_tokens(const dsq_tokenizer *tok);

/** Id of the token whose text is exactly `text` (vocab entry in byte-level
 *  form, or an added token's content), or -1.  Thread-safe. */
DSQ_API int32_t dsq_tokenizer_token_id(const dsq_tokenizer *tok, const char *text);

/** The raw stored text of token `id` (byte-level form for vocab tokens), or
 *  NULL if the id has no token.  Borrowed from the tokenizer. */
DSQ_API const char *dsq_token_text(const dsq_tokenizer *tok, int32_t id);

/** 1 if `id` is an added special token (e.g. <｜end▁of▁sentence｜>), else 0. */
DSQ_API int dsq_token_is_special(const dsq_tokenizer *tok, int32_t id);

/** BOS / EOS ids from tokenizer_config.json / the post-processor, or -1. */
DSQ_API int32_t dsq_tokenizer_bos(const dsq_tokenizer *tok);
DSQ_API int32_t dsq_tokenizer_eos(const dsq_tokenizer *tok);

/** Streaming decoder: feed ids one at a time, get back only complete UTF-8
 *  (a token can end in the middle of a character; its bytes are held until
 *  the character completes).  One thread at a time. */
typedef struct dsq_detok_stream dsq_detok_stream;

/** DSQ_ERR_INVALID_ARG, DSQ_ERR_OUT_OF_MEMORY.  The tokenizer must outlive
 *  the stream. */
DSQ_API dsq_status dsq_detok_stream_new(const dsq_tokenizer *tok, int skip_special,
                                        dsq_detok_stream **out);
DSQ_API void dsq_detok_stream_free(dsq_detok_stream *s);

/** Push one id; writes the newly completed text (possibly empty) to `text`
 *  (NUL-terminated) and its length to *len_out.  A buffer of 64 bytes plus the
 *  longest token is always enough.  DSQ_ERR_TOKEN, DSQ_ERR_BUFFER_TOO_SMALL
 *  (state unchanged). */
DSQ_API dsq_status dsq_detok_stream_push(dsq_detok_stream *s, int32_t token, char *text,
                                         size_t cap, size_t *len_out);

/** Emit what is still held (incomplete UTF-8 as U+FFFD) and reset. */
DSQ_API dsq_status dsq_detok_stream_flush(dsq_detok_stream *s, char *text, size_t cap,
                                          size_t *len_out);

/* ------------------------------------------------------------------------ */
/* Chat format (DeepSeek-R1-Distill)                                        */
/* ------------------------------------------------------------------------ */

typedef enum dsq_role {
    DSQ_ROLE_SYSTEM = 0,
    DSQ_ROLE_USER = 1,
    DSQ_ROLE_ASSISTANT = 2
} dsq_role;

typedef struct dsq_chat_message {
    int32_t role;        /* dsq_role */
    const char *content; /* UTF-8, NUL-terminated */
} dsq_chat_message;

/** Render a conversation in the R1-Distill chat format:
 *  "<｜begin▁of▁sentence｜>" + system texts + for each turn "<｜User｜>" + text
 *  or "<｜Assistant｜>" + text (only what follows "</think>") +
 *  "<｜end▁of▁sentence｜>", and when `add_generation_prompt`,
 *  "<｜Assistant｜><think>\n".  Output NUL-terminated in `text`; byte length in
 *  *len_out; DSQ_ERR_BUFFER_TOO_SMALL if it does not fit (len_out still set;
 *  text NULL with cap 0 asks for the length).  Only the last system message
 *  counts, as in the model's template.
 *  DSQ_ERR_INVALID_ARG for NULLs or a bad role.  Thread-safe. */
DSQ_API dsq_status dsq_chat_format(const dsq_chat_message *msgs, size_t n_msgs,
                                   int add_generation_prompt, char *text, size_t cap,
                                   size_t *len_out);

/* ------------------------------------------------------------------------ */
/* Sampling                                                                 */
/* ------------------------------------------------------------------------ */

typedef struct dsq_sampler dsq_sampler;

typedef struct dsq_sampler_params {
    uint32_t struct_size;       /* sizeof(dsq_sampler_params)                 */
    float temperature;          /* <= 0: greedy; default 0.6                  */
    int32_t top_k;              /* 0: off; default 0                          */
    float top_p;                /* 1: off; default 0.95                       */
    float min_p;                /* 0: off; default 0                          */
    float repetition_penalty;   /* 1: off; default 1                          */
    int32_t penalty_last_n;     /* window for the penalty; default 64         */
    uint64_t seed;              /* default 0x5eed                             */
    int32_t n_vocab_valid;      /* ids >= this are never sampled (padding
                                   rows); 0 = all                             */
} dsq_sampler_params;

/** As dsq_model_params_init(), for dsq_sampler_params.  Thread-safe. */
DSQ_API dsq_status dsq_sampler_params_init(dsq_sampler_params *params, uint32_t struct_size);

/** dsq_sampler_params at their defaults (inline; see dsq_model_default_params). */
static inline dsq_sampler_params dsq_sampler_default_params(void)
{
    dsq_sampler_params p;
    memset(&p, 0, sizeof p);
    p.struct_size = (uint32_t)sizeof p;
    (void)dsq_sampler_params_init(&p, (uint32_t)sizeof p);
    return p;
}

/** DSQ_ERR_INVALID_ARG (NaN or negative values, top_p outside (0,1]),
 *  DSQ_ERR_STRUCT_SIZE, DSQ_ERR_OUT_OF_MEMORY. */
DSQ_API dsq_status dsq_sampler_new(const dsq_sampler_params *params, dsq_sampler **out);
DSQ_API void dsq_sampler_free(dsq_sampler *s);

/** Draw one token from host `logits[n_vocab]` (not modified) and record it
 *  for the repetition penalty.  A logit that is -inf or NaN is never drawn
 *  (NaN counts as -inf), whatever the settings; if some logit is +inf the
 *  first +inf one is drawn.  Any finite temperature is accepted: as it grows
 *  the draw tends to uniform over the finite logits.  DSQ_ERR_INVALID_ARG
 *  (also when no logit among the first n_vocab_valid is above -inf).  One
 *  thread at a time. */
DSQ_API dsq_status dsq_sampler_sample(dsq_sampler *s, const float *logits, int32_t n_vocab,
                                      int32_t *token_out);

/** Record tokens (e.g. the prompt) for the repetition penalty without
 *  sampling. */
DSQ_API dsq_status dsq_sampler_accept(dsq_sampler *s, const int32_t *tokens, size_t n);

/** Forget history and re-seed with `seed`. */
DSQ_API void dsq_sampler_reset(dsq_sampler *s, uint64_t seed);

/** The sampler settings the model's authors recommend: the library defaults
 *  (dsq_sampler_params_init) overridden by the values of the
 *  generation_config.json that dsq_model_load() read beside config.json
 *  (temperature, top_k, top_p, min_p, repetition_penalty; "do_sample": false
 *  gives temperature 0, i.e. greedy; a field the file leaves out keeps the
 *  library default), and n_vocab_valid = dsq_tokenizer_n_tokens() of the
 *  model's tokenizer when one is loaded and it is below n_vocab (ids above it
 *  are the vocabulary's padding rows).  Without generation_config.json the
 *  result is the library defaults plus n_vocab_valid.  The caller sets
 *  params->struct_size; only that many bytes are written (fields past it are
 *  left untouched).  Pass the result, changed as wanted, to dsq_sampler_new().
 *  (dsq_model_load() fails with DSQ_ERR_FORMAT, naming the file and field,
 *  when generation_config.json is not valid JSON or a field has the wrong
 *  type or an impossible value; a missing file is fine.)
 *  DSQ_ERR_INVALID_ARG (NULL), DSQ_ERR_STRUCT_SIZE.  Thread-safe. */
DSQ_API dsq_status dsq_model_sampler_params(const dsq_model *model, dsq_sampler_params *params);

/* ---- stop conditions ---------------------------------------------------- */

/** Streaming stop-string matcher: feed it the sampled ids one at a time, show
 *  the text it gives back, and stop generating when it says so.  It decodes
 *  like a dsq_detok_stream with skip_special = 1 (so <｜end▁of▁sentence｜>
 *  never appears as text; <think> and <｜User｜> do) and holds back any
 *  trailing text that could be the beginning of a stop string, so a stop
 *  string is never emitted, even when it is split across tokens; text that
 *  turns out not to start a stop string is emitted intact, later.
 *  Matching is on exact bytes of the decoded text.  When several stop
 *  strings occur, the one that is completed first (earliest end in the text;
 *  the longest of those ending at the same byte) wins, so the result does not
 *  depend on how the text was split into tokens.  Belongs to one thread at a
 *  time; the tokenizer must outlive it. */
typedef struct dsq_stopper dsq_stopper;

/** Create a stopper for ids of `tok`.  `stop_strings` holds `n_stop`
 *  non-empty NUL-terminated UTF-8 strings (copied; may be NULL when n_stop is
 *  0).  With `stop_on_eos` nonzero, the tokenizer's EOS id
 *  (dsq_tokenizer_eos(), <｜end▁of▁sentence｜> = 151643 for R1-Distill) also
 *  stops.  DSQ_ERR_INVALID_ARG (NULL tok or out, NULL stop_strings with
 *  n_stop > 0, a NULL or empty stop string), DSQ_ERR_OUT_OF_MEMORY. */
DSQ_API dsq_status dsq_stopper_new(const dsq_tokenizer *tok, const char *const *stop_strings,
                                   size_t n_stop, int stop_on_eos, dsq_stopper **out);

/** Free a stopper.  NULL is a no-op. */
DSQ_API void dsq_stopper_free(dsq_stopper *s);

/** Push one sampled id.  Writes the text that is now safe to show (possibly
 *  empty; NUL-terminated) to `text`, its byte length to *len_out, and
 *  *stopped = 1 when generation should stop, else 0:
 *   - a stop string was completed: the text before it is written (including
 *     any text held back earlier); the stop string and whatever follows it
 *     are dropped;
 *   - `token` is the EOS id and the stopper was made with stop_on_eos: all
 *     held-back text is written (an incomplete UTF-8 character as U+FFFD).
 *  Once stopped, further pushes write nothing and report *stopped = 1 until
 *  dsq_stopper_reset().  The text written is at most the held-back text
 *  (shorter than the longest stop string) + 3 + the token's text, so a
 *  buffer of 64 bytes + the longest token + the longest stop string is
 *  always enough; `cap` below that bound + 1 for this call is
 *  DSQ_ERR_BUFFER_TOO_SMALL with *len_out = the bound and nothing changed.
 *  DSQ_ERR_INVALID_ARG (NULL s, len_out or stopped; NULL text with cap > 0),
 *  DSQ_ERR_TOKEN (id not in the tokenizer). */
DSQ_API dsq_status dsq_stopper_push(dsq_stopper *s, int32_t token, char *text, size_t cap,
                                    size_t *len_out, int *stopped);

/** At the end of generation (e.g. max tokens reached): write the text still
 *  held back (an incomplete UTF-8 character as U+FFFD) and clear it; the
 *  stopper stays usable and a stop string can no longer span the flush.
 *  After a stop nothing is written.  Needs `cap` >= held-back bytes + 4, else
 *  DSQ_ERR_BUFFER_TOO_SMALL with *len_out = that size - 1 and nothing
 *  changed.  DSQ_ERR_INVALID_ARG. */
DSQ_API dsq_status dsq_stopper_flush(dsq_stopper *s, char *text, size_t cap, size_t *len_out);

/** Drop held-back text and the stopped state, ready for a new generation
 *  with the same stop strings.  NULL is a no-op. */
DSQ_API void dsq_stopper_reset(dsq_stopper *s);

/* ------------------------------------------------------------------------ */
/* Steps: mixed prefill/decode batches with sampling inside the library     */
/* ------------------------------------------------------------------------ */

/** Most top log-probabilities one step entry can ask for. */
#define DSQ_STEP_MAX_TOP_N 20
/** Longest penalty window (tokens) of dsq_sample_params.penalty_last_n. */
#define DSQ_PENALTY_MAX_N 4096

/** Sampling settings of one sequence in a dsq_step() call.  Applied in this
 *  order (Hugging Face generate() order, as dsq_sampler):
 *   penalties    over the distinct ids among the sequence's last
 *                penalty_last_n tokens (prompt and generated, as held in its
 *                cache, the tokens of this step included), each id once with
 *                its count c in that window:
 *                x = (x > 0 ? x / repetition_penalty : x * repetition_penalty)
 *                    - frequency_penalty * c - presence_penalty
 *   greedy       temperature == 0: the argmax of the penalised logits (ties
 *                to the lowest id); everything below is skipped
 *   temperature  p = softmax(x / temperature)
 *   top-k        keep logits >= the k-th largest (ties kept)
 *   top-p        renormalised over the survivors, in descending order keep a
 *                token while the mass before it is < top_p
 *   min-p        keep p >= min_p * p_max
 *   draw         from the kept tokens in proportion to p, with a random
 *                number that depends only on (seed, position of the new
 *                token in its sequence): the same seed, logits and position
 *                give the same token whatever else is in the batch.
 *  Ids >= n_vocab_valid (the vocabulary's padding rows) are never chosen. */
typedef struct dsq_sample_params {
    uint32_t struct_size;       /* sizeof(dsq_sample_params)                  */
    float temperature;          /* 0: greedy; must be >= 0; default 0.6       */
    int32_t top_k;              /* 0: off; default 0                          */
    float top_p;                /* in (0, 1]; 1: off; default 0.95            */
    float min_p;                /* in [0, 1]; 0: off; default 0               */
    float repetition_penalty;   /* > 0; 1: off; default 1                     */
    float presence_penalty;     /* finite; 0: off; default 0                  */
    float frequency_penalty;    /* finite; 0: off; default 0                  */
    int32_t penalty_last_n;     /* 0..DSQ_PENALTY_MAX_N tokens; default 64    */
    uint64_t seed;              /* default 0x5eed                             */
    int32_t n_vocab_valid;      /* ids >= this are never sampled; 0 (default):
                                   the model's tokenizer size when one is
                                   loaded and smaller than n_vocab, else
                                   n_vocab                                    */
} dsq_sample_params;

/** As dsq_model_params_init(), for dsq_sample_params.  Thread-safe. */
DSQ_API dsq_status dsq_sample_params_init(dsq_sample_params *params, uint32_t struct_size);

/** dsq_sample_params at their defaults (inline; see dsq_model_default_params). */
static inline dsq_sample_params dsq_sample_default_params(void)
{
    dsq_sample_params p;
    memset(&p, 0, sizeof p);
    p.struct_size = (uint32_t)sizeof p;
    (void)dsq_sample_params_init(&p, (uint32_t)sizeof p);
    return p;
}

/** dsq_step_seq.flags */
#define DSQ_STEP_LOGITS 1u  /* write this entry's logits (of its last token) */
#define DSQ_STEP_LOGPROB 2u /* return the sampled token's log-probability    */

/** One entry of a dsq_step() batch.  This layout is fixed (it is an array
 *  element); new options come in dsq_step_params. */
typedef struct dsq_step_seq {
    int32_t seq;            /* sequence id, 0..max_seqs-1, distinct per call  */
    int32_t n_tokens;       /* >= 1: 1 = a decode step, more = a prompt chunk */
    const int32_t *tokens;  /* [n_tokens] appended to the sequence            */
    const dsq_sample_params *sample; /* NULL: sample nothing for this entry
                                        (e.g. a prompt chunk that is not the
                                        last); else draw the next token from
                                        the logits of its last token          */
    int32_t top_n;          /* 0..DSQ_STEP_MAX_TOP_N top log-probs (needs
                               sample)                                        */
    uint32_t flags;         /* DSQ_STEP_* bits                                */
} dsq_step_seq;

/** Per-entry results of dsq_step().  Log-probabilities are those of the
 *  model: log_softmax of the raw logits over ids < n_vocab_valid, before
 *  penalties, temperature and truncation. */
typedef struct dsq_step_out {
    int32_t token;          /* sampled id; -1 if the entry sampled nothing or
                               its logits held no finite value               */
    float logprob;          /* of `token`, with DSQ_STEP_LOGPROB; else 0      */
    int32_t n_top;          /* entries filled below (top_n, or fewer finite)  */
    int32_t top_ids[DSQ_STEP_MAX_TOP_N];       /* descending; ties by id     */
    float top_logprobs[DSQ_STEP_MAX_TOP_N];
} dsq_step_out;

/** Where dsq_step() writes logits. */
typedef struct dsq_step_params {
    uint32_t struct_size;   /* sizeof(dsq_step_params)                        */
    float *logits;          /* [n_rows][n_vocab] fp32, one row per entry with
                               DSQ_STEP_LOGITS, in entry order; NULL: none    */
    int32_t logits_on_device; /* 0 (default): `logits` is host memory;
                                 1: a CUDA device pointer of the context's
                                 device, written on the context's stream (the
                                 CPU backend refuses it: DSQ_ERR_UNSUPPORTED) */
} dsq_step_params;

/** As dsq_model_params_init(), for dsq_step_params.  Thread-safe. */
DSQ_API dsq_status dsq_step_params_init(dsq_step_params *params, uint32_t struct_size);

/** dsq_step_params at their defaults (inline; see dsq_model_default_params). */
static inline dsq_step_params dsq_step_default_params(void)
{
    dsq_step_params p;
    memset(&p, 0, sizeof p);
    p.struct_size = (uint32_t)sizeof p;
    (void)dsq_step_params_init(&p, (uint32_t)sizeof p);
    return p;
}

/** One forward pass over several sequences at once, each advanced by its own
 *  tokens -- decode steps (1 token) beside prompt chunks (more; a sequence
 *  that holds no tokens starts at position 0) -- then, for the entries that
 *  ask, sampling inside the library (on the GPU with the CUDA backend), so
 *  only O(n_seqs) bytes come back to the host.
 *
 *  `seqs[n_seqs]`: the entries; all their tokens together may not exceed
 *  max_batch_tokens (DSQ_ERR_BATCH; split long prompts into chunks over
 *  several calls).  `params` may be NULL (no logits).  `out[n_seqs]` gets the
 *  results (may be NULL when no entry samples).
 *
 *  The library keeps every sequence's tokens (for the penalties), also those
 *  added by dsq_prefill() and dsq_decode_step(); dsq_seq_remove() forgets
 *  them, dsq_seq_truncate() drops the truncated ones and dsq_seq_fork()
 *  gives the new sequence a copy.  Paged cache: a step's first write into a
 *  block shared with a fork copies that block first (DSQ_ERR_KV_FULL when
 *  the pool has no room, all-or-nothing).
 *
 *  Returns DSQ_OK, or DSQ_ERR_INVALID_ARG (NULL ctx/seqs, n_seqs <= 0, an
 *  entry with no tokens or NULL tokens, a repeated seq id, unknown flags,
 *  top_n or DSQ_STEP_LOGPROB without sample, top_n outside
 *  0..DSQ_STEP_MAX_TOP_N, a sampler value out of range: NaN or negative
 *  temperature, top_k < 0, top_p outside (0,1], min_p outside [0,1],
 *  repetition_penalty <= 0 or not finite, presence/frequency penalty not
 *  finite, penalty_last_n outside 0..DSQ_PENALTY_MAX_N, n_vocab_valid
 *  outside 0..n_vocab; DSQ_STEP_LOGITS without params->logits, logits
 *  without any DSQ_STEP_LOGITS entry; out NULL while an entry samples),
 *  DSQ_ERR_STRUCT_SIZE, DSQ_ERR_UNSUPPORTED (device logits on the CPU
 *  backend), DSQ_ERR_BATCH, DSQ_ERR_SEQ, DSQ_ERR_TOKEN,
 *  DSQ_ERR_CONTEXT_FULL, DSQ_ERR_KV_FULL, DSQ_ERR_OUT_OF_MEMORY,
 *  DSQ_ERR_DEVICE_OOM, DSQ_ERR_DEVICE.  On any error no sequence changes
 *  (as dsq_decode_step) and `out` is unspecified.
 *
 *  Same thread rule as the context.  CUDA: everything runs on the context's
 *  stream; when an entry samples, the call synchronizes that stream once to
 *  copy the results (O(n_seqs) bytes) back; host logits are copied and
 *  waited for as in dsq_decode_step; device logits are written on the stream
 *  and not waited for (read them on that stream or after a synchronization;
 *  a call that samples nothing returns before the GPU has run, and a device
 *  fault then surfaces on a later call).  Allocates nothing after the first
 *  call of each batch shape (see dsq_ctx_new), except when a sequence's kept
 *  token list outgrows its capacity (amortised doubling). */
DSQ_API dsq_status dsq_step(dsq_ctx *ctx, const dsq_step_seq *seqs, int32_t n_seqs,
                            const dsq_step_params *params, dsq_step_out *out);

#ifdef __cplusplus
}
#endif

#endif /* DSQWEN_H */
