/* status.c - status names, per-thread last error, the log callback. */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "internal.h"

static _Thread_local char tls_error[512];

/* The callback, its user pointer and level change together: they are read
 * and written under one mutex (logging is rare: errors and load-time info),
 * and the callback itself runs outside it. */
typedef struct log_sink {
    dsq_log_fn fn;
    void *user;
    dsq_log_level max_level;
} log_sink;

static log_sink sink;
static pthread_mutex_t sink_mu = PTHREAD_MUTEX_INITIALIZER;

const char *dsq_status_string(dsq_status st)
{
    switch (st) {
    case DSQ_OK: return "DSQ_OK: success";
    case DSQ_ERR_INVALID_ARG: return "DSQ_ERR_INVALID_ARG: invalid argument";
    case DSQ_ERR_STRUCT_SIZE: return "DSQ_ERR_STRUCT_SIZE: params struct_size not recognised";
    case DSQ_ERR_OUT_OF_MEMORY: return "DSQ_ERR_OUT_OF_MEMORY: host memory exhausted";
    case DSQ_ERR_IO: return "DSQ_ERR_IO: file could not be opened or read";
    case DSQ_ERR_FORMAT: return "DSQ_ERR_FORMAT: malformed file";
    case DSQ_ERR_CONFIG: return "DSQ_ERR_CONFIG: invalid model configuration";
    case DSQ_ERR_UNSUPPORTED: return "DSQ_ERR_UNSUPPORTED: not supported";
    case DSQ_ERR_MISSING_TENSOR: return "DSQ_ERR_MISSING_TENSOR: required tensor missing";
    case DSQ_ERR_SHAPE: return "DSQ_ERR_SHAPE: tensor has the wrong shape";
    case DSQ_ERR_DTYPE: return "DSQ_ERR_DTYPE: unsupported tensor dtype";
    case DSQ_ERR_TOKEN: return "DSQ_ERR_TOKEN: token id out of range";
    case DSQ_ERR_SEQ: return "DSQ_ERR_SEQ: unknown or empty sequence";
    case DSQ_ERR_CONTEXT_FULL: return "DSQ_ERR_CONTEXT_FULL: sequence exceeds max context";
    case DSQ_ERR_KV_FULL: return "DSQ_ERR_KV_FULL: KV cache pool exhausted";
    case DSQ_ERR_BATCH: return "DSQ_ERR_BATCH: batch larger than the context allows";
    case DSQ_ERR_BUFFER_TOO_SMALL: return "DSQ_ERR_BUFFER_TOO_SMALL: output buffer too small";
    case DSQ_ERR_NO_DEVICE: return "DSQ_ERR_NO_DEVICE: no usable CUDA device";
    case DSQ_ERR_DEVICE_OOM: return "DSQ_ERR_DEVICE_OOM: GPU memory exhausted";
    case DSQ_ERR_DEVICE: return "DSQ_ERR_DEVICE: CUDA error";
    case DSQ_ERR_INTERNAL: return "DSQ_ERR_INTERNAL: internal error";
    case DSQ_ERR_CANCELLED: return "DSQ_ERR_CANCELLED: cancelled by a callback";
    }
    return "unknown status";
}

const char *dsq_last_error_message(void) { return tls_error; }

void dsq_clear_error(void) { tls_error[0] = '\0'; }

void dsq_set_log_callback(dsq_log_fn fn, void *user, dsq_log_level max_level)
{
    pthread_mutex_lock(&sink_mu);
    sink.fn = fn;
    sink.user = fn ? user : NULL;
    sink.max_level = max_level;
    pthread_mutex_unlock(&sink_mu);
}

static void vlog(dsq_log_level level, const char *fmt, va_list ap)
{
    pthread_mutex_lock(&sink_mu);
    log_sink s = sink;
    pthread_mutex_unlock(&sink_mu);
    if (!s.fn || level > s.max_level)
        return;
    char buf[1024];
    vsnprintf(buf, sizeof buf, fmt, ap);
    s.fn(level, buf, s.user);
}

void dsq_log(dsq_log_level level, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vlog(level, fmt, ap);
    va_end(ap);
}

dsq_status dsq_fail(dsq_status st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(tls_error, sizeof tls_error, fmt, ap);
    va_end(ap);
    dsq_log(DSQ_LOG_DEBUG, "%s (%s)", tls_error, dsq_status_string(st));
    return st;
}

const char *dsq_version_string(void)
{
#define DSQ_STR2(x) #x
#define DSQ_STR(x) DSQ_STR2(x)
    return DSQ_STR(DSQ_VERSION_MAJOR) "." DSQ_STR(DSQ_VERSION_MINOR) "." DSQ_STR(DSQ_VERSION_PATCH);
}

unsigned dsq_version_number(void) { return DSQ_VERSION_NUMBER; }
