/*
 * backend_out.cu - what leaves a CUDA pass: the caller's logits (DMA into a
 * page-locked buffer, else through pinned staging in overlapping pieces),
 * dsq_step's in-library sampling, the device token history, KV row copies;
 * the driver probe and the dsq_cuda_backend table.
 *
 * A forward pass enqueues everything on the context's stream; the only host
 * synchronisation is the copy of the logits (and, before packing a batch's
 * metadata, waiting for the copy out of the same pinned buffer two passes
 * ago, which has long completed in steady state).  The first decode step of
 * each batch size captures and instantiates a graph, and the first product
 * of each shape queries the cuBLASLt heuristic, which may allocate inside
 * those libraries once.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"

static dsq_status forward_impl(dsq_ctx *c, const dsq_batch *bt, float *logits)
{
    cu_ctx *cc = (cu_ctx *)c->be;
    const int32_t V = c->model->cfg.n_vocab;
    const int32_t NL = logits ? bt->n_logits : 0;
    cudaStream_t s = cc->stream;
    DSQ_TRY(cu_launch_forward(c, bt, NL));
    if (NL == 0)
        return dsq_cu_status(cudaGetLastError(), "forward pass");

    /* ---- logits out: chunk 0 was computed by the pass, the rest here ----
     * A caller whose buffer is page-locked (cudaHostRegister / cudaMallocHost)
     * gets the logits by DMA directly; at batch 64 that is 39 MB a step, and
     * the staged path is bound by the host memcpy. */
    cudaPointerAttributes pa;
    cc->pinned_out = cudaPointerGetAttributes(&pa, logits) == cudaSuccess && pa.type == cudaMemoryTypeHost;
    cudaGetLastError();
    for (int32_t r0 = 0; r0 < NL; r0 += cc->logit_chunk) {
        int32_t n = NL - r0 < cc->logit_chunk ? NL - r0 : cc->logit_chunk;
        if (r0 > 0)
            DSQ_TRY(cu_head_rows(c, r0, n));
        const size_t bytes = (size_t)n * V * 4;
        if (cc->pinned_out) {
            /* the caller's buffer is page-locked: one DMA straight into it */
            CU_TRY(cudaMemcpyAsync(logits + (size_t)r0 * V, cc->logits, bytes, cudaMemcpyDeviceToHost, s), "logits copy");
            CU_TRY(cudaStreamSynchronize(s), "forward pass");
            continue;
        }
        /* pageable: through the pinned staging buffer in pieces, so the host
         * copy of one piece overlaps the device-to-host transfer of the next */
        size_t np = bytes / ((size_t)4 << 20);
        np = np < 1 ? 1 : np > COPY_PIECES ? COPY_PIECES : np;
        const size_t piece = ((bytes + np - 1) / np + 4095) & ~(size_t)4095;
        char *dst = (char *)(logits + (size_t)r0 * V);
        for (size_t i = 0; i < np && i * piece < bytes; i++) {
            size_t off = i * piece, len = bytes - off < piece ? bytes - off : piece;
            CU_TRY(cudaMemcpyAsync((char *)cc->logits_host + off, (char *)cc->logits + off, len, cudaMemcpyDeviceToHost, s),
               "logits copy");
            CU_TRY(cudaEventRecord(cc->copied[i], s), "event record");
        }
        for (size_t i = 0; i < np && i * piece < bytes; i++) {
            size_t off = i * piece, len = bytes - off < piece ? bytes - off : piece;
            CU_TRY(cudaEventSynchronize(cc->copied[i]), "forward pass");
            memcpy(dst + off, (char *)cc->logits_host + off, len);
        }
    }
    return DSQ_OK;
}

/* dsq_step: the pass, then per chunk of logit rows the caller's logits copy
 * (before sampling rewrites penalised entries in place) and the sampling
 * kernel; one synchronisation for the O(rows) results. */
static dsq_status step_impl(dsq_ctx *c, const dsq_batch *bt, const dsq_samp_row *rows, dsq_samp_result *res,
                            float *logits, int on_device)
{
    cu_ctx *cc = (cu_ctx *)c->be;
    const int32_t V = c->model->cfg.n_vocab;
    const int32_t NL = bt->n_logits;
    cudaStream_t s = cc->stream;
    DSQ_TRY(cu_launch_forward(c, bt, NL));
    if (NL == 0)
        return dsq_cu_status(cudaGetLastError(), "forward pass");
    int any_sample = 0, any_host_logits = 0;
    for (int32_t r = 0; r < NL; r++) {
        any_sample |= (rows[r].flags & DSQ_SROW_SAMPLE) != 0;
        any_host_logits |= rows[r].out_row >= 0 && !on_device;
    }
    if (any_sample) {
        CU_TRY(cudaEventSynchronize(cc->srow_sent), "waiting for the sampling parameter buffer");
        memcpy(cc->srow_host, rows, (size_t)NL * sizeof(dsq_samp_row));
        CU_TRY(cudaMemcpyAsync(cc->srow_dev, cc->srow_host, (size_t)NL * sizeof(dsq_samp_row), cudaMemcpyHostToDevice, s),
           "sampling parameter upload");
        CU_TRY(cudaEventRecord(cc->srow_sent, s), "event record");
    }
    const cudaMemcpyKind kind = on_device ? cudaMemcpyDeviceToDevice : cudaMemcpyDeviceToHost;
    for (int32_t r0 = 0; r0 < NL; r0 += cc->logit_chunk) {
        int32_t n = NL - r0 < cc->logit_chunk ? NL - r0 : cc->logit_chunk;
        if (r0 > 0)
            DSQ_TRY(cu_head_rows(c, r0, n));
        /* the caller's rows: one copy when they are consecutive */
        int32_t k = 0;
        while (k < n) {
            if (rows[r0 + k].out_row < 0) {
                k++;
                continue;
            }
            int32_t k1 = k + 1;
            while (k1 < n && rows[r0 + k1].out_row == rows[r0 + k].out_row + (k1 - k))
                k1++;
            CU_TRY(cudaMemcpyAsync(logits + (size_t)rows[r0 + k].out_row * V, cc->logits + (size_t)k * V,
                               (size_t)(k1 - k) * V * 4, kind, s),
               "logits copy");
            k = k1;
        }
        if (any_sample)
            DSQ_TRY(dsq_cu_sample(cc->logits, n, V, cc->srow_dev + r0, cc->ring, cc->hist_r, cc->sres_dev + r0, s));
    }
    if (any_sample) {
        CU_TRY(cudaMemcpyAsync(cc->sres_host, cc->sres_dev, (size_t)NL * sizeof(dsq_samp_result), cudaMemcpyDeviceToHost, s),
           "sampling results copy");
        CU_TRY(cudaStreamSynchronize(s), "forward pass and sampling");
        memcpy(res, cc->sres_host, (size_t)NL * sizeof(dsq_samp_result));
    } else if (any_host_logits) {
        CU_TRY(cudaStreamSynchronize(s), "forward pass");
    }
    for (int32_t r = 0; r < NL; r++)
        if (!(rows[r].flags & DSQ_SROW_SAMPLE)) {
            memset(&res[r], 0, sizeof res[r]);
            res[r].token = -1;
        }
    return dsq_cu_status(cudaGetLastError(), "forward pass");
}

/* The host history of `seq` changed (truncate, fork): upload its last
 * hist_r tokens to the ring. */
static void cu_hist_sync(dsq_ctx *c, int32_t seq)
{
    cu_ctx *cc = (cu_ctx *)c->be;
    const int32_t len = c->hist.len[seq], R = cc->hist_r;
    const int32_t w = len < R ? len : R;
    const int32_t *t = c->hist.tok[seq];
    cu_device_guard g(cc->device);
    for (int32_t p = len - w; p < len;) {
        int32_t slot = p % R, n = len - p < R - slot ? len - p : R - slot;
        cudaMemcpyAsync(cc->ring + (size_t)seq * R + slot, t + p, (size_t)n * 4, cudaMemcpyHostToDevice, cc->stream);
        p += n;
    }
    cudaGetLastError(); /* a failure here surfaces at the next synchronising call */
}

/* ---- registration ---------------------------------------------------------------- */

/* The driver library is looked for here (as the CUDA runtime itself will,
 * by soname) only to name it in the message when it is missing: the runtime
 * alone would report "driver version is insufficient". */
static pthread_once_t driver_once = PTHREAD_ONCE_INIT;
static char driver_problem[512]; /* "" when libcuda.so.1 could be opened */

static void driver_probe(void)
{
    dlerror();
    void *h = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
    if (!h) {
        const char *e = dlerror();
        snprintf(driver_problem, sizeof driver_problem, "the NVIDIA driver library could not be loaded (%s)",
                 e ? e : "libcuda.so.1");
    }
    /* kept open: the runtime maps it for the rest of the process anyway */
}

extern "C" const char *dsq_cuda_device_problem(void)
{
    pthread_once(&driver_once, driver_probe);
    if (driver_problem[0])
        return driver_problem;
    int n = 0;
    cudaError_t ce = cudaGetDeviceCount(&n);
    if (ce != cudaSuccess) {
        cudaGetLastError();
        return cudaGetErrorString(ce); /* static text */
    }
    return n > 0 ? NULL : "the CUDA runtime reports no device";
}

/* KV rows copied on the context stream (a shared paged block before a
 * write, a static-cache fork); ordered before the next pass, no host wait. */
static dsq_status copy_kv_rows_impl(dsq_ctx *c, int32_t n, const dsq_kv_copy *copies)
{
    cu_ctx *cc = (cu_ctx *)c->be;
    const dsq_config *cf = &c->model->cfg;
    const int int8 = c->p.kv_dtype == DSQ_KV_INT8;
    const size_t KV = (size_t)cf->n_kv_heads, row = KV * (size_t)cf->head_dim * (int8 ? 1 : 2), srow = KV * 4;
    const int64_t rows = cc->kv_rows;
    for (int32_t i = 0; i < n; i++) {
        const dsq_kv_copy *cp = &copies[i];
        if (cp->n_rows < 0 || cp->src_row < 0 || cp->dst_row < 0 || cp->src_row + cp->n_rows > rows ||
            cp->dst_row + cp->n_rows > rows)
            return dsq_fail(DSQ_ERR_INTERNAL, "CUDA KV copy: rows %lld..+%lld -> %lld outside the cache",
                            (long long)cp->src_row, (long long)cp->n_rows, (long long)cp->dst_row);
        if (cp->n_rows == 0)
            continue;
        for (int a = 0; a < (int8 ? 4 : 2); a++) {
            const size_t w = a < 2 ? row : srow;
            const size_t so = (size_t)cp->src_row * w, d_o = (size_t)cp->dst_row * w, bytes = (size_t)cp->n_rows * w;
            char *base0 = (char *)(a == 0 ? cc->kv[0].k : a == 1 ? cc->kv[0].v : a == 2 ? (void *)cc->kv[0].k_scale
                                                                                        : (void *)cc->kv[0].v_scale);
            if (cc->kv_layer_pitch) {
                CU_TRY(cudaMemcpy2DAsync(base0 + d_o, cc->kv_layer_pitch, base0 + so, cc->kv_layer_pitch, bytes,
                                     (size_t)cf->n_layers, cudaMemcpyDeviceToDevice, cc->stream),
                   "KV row copy");
                continue;
            }
            for (int32_t l = 0; l < cf->n_layers; l++) {
                const dsq_attn_kv *kv = &cc->kv[l];
                char *base = (char *)(a == 0 ? kv->k : a == 1 ? kv->v : a == 2 ? (void *)kv->k_scale : (void *)kv->v_scale);
                CU_TRY(cudaMemcpyAsync(base + d_o, base + so, bytes, cudaMemcpyDeviceToDevice, cc->stream), "KV row copy");
            }
        }
    }
    return DSQ_OK;
}

/* ---- entries: each runs on the model's device, the caller's restored ---- */

static dsq_status cu_forward(dsq_ctx *c, const dsq_batch *bt, float *logits)
{
    cu_device_guard g(((const cu_ctx *)c->be)->device);
    return g.st != DSQ_OK ? g.st : forward_impl(c, bt, logits);
}

static dsq_status cu_step(dsq_ctx *c, const dsq_batch *bt, const dsq_samp_row *rows, dsq_samp_result *res,
                          float *logits, int on_device)
{
    cu_device_guard g(((const cu_ctx *)c->be)->device);
    return g.st != DSQ_OK ? g.st : step_impl(c, bt, rows, res, logits, on_device);
}

static dsq_status cu_copy_kv_rows(dsq_ctx *c, int32_t n, const dsq_kv_copy *copies)
{
    int32_t nr = 0;
    dsq_ctx *rc = cu_tp_rank_ctxs(c, &nr);
    if (rc) { /* tensor parallelism: every rank its KV heads */
        for (int32_t r = 0; r < nr; r++) {
            cu_device_guard g(((const cu_ctx *)rc[r].be)->device);
            DSQ_TRY(g.st != DSQ_OK ? g.st : copy_kv_rows_impl(&rc[r], n, copies));
        }
        return DSQ_OK;
    }
    cu_device_guard g(((const cu_ctx *)c->be)->device);
    return g.st != DSQ_OK ? g.st : copy_kv_rows_impl(c, n, copies);
}

/* dsq_ctx_synchronize: wait for the context's stream. */
static dsq_status cu_synchronize(dsq_ctx *c)
{
    int32_t nr = 0;
    dsq_ctx *rc = cu_tp_rank_ctxs(c, &nr);
    for (int32_t r = 1; rc && r < nr; r++) { /* the other ranks' streams */
        const cu_ctx *o = (const cu_ctx *)rc[r].be;
        cu_device_guard g(o->device);
        DSQ_TRY(g.st != DSQ_OK ? g.st : dsq_cu_status(cudaStreamSynchronize(o->stream), "a rank's stream"));
    }
    cu_ctx *cc = (cu_ctx *)c->be;
    cu_device_guard g(cc->device);
    if (g.st != DSQ_OK)
        return g.st;
    return dsq_cu_status(cudaStreamSynchronize(cc->stream), "waiting for the context's stream");
}

static void *cu_stream(const dsq_ctx *c) { return (void *)((const cu_ctx *)c->be)->stream; }

extern "C" const dsq_backend_ops dsq_cuda_backend = {
    /* positional, in struct dsq_backend_ops order: ..., seq_removed,
     * copy_kv_rows, step, hist_sync, synchronize, stream */
    "cuda", DSQ_BACKEND_CUDA, cu_model_load, cu_model_free, cu_ctx_init, cu_ctx_free, cu_forward, NULL,
    cu_copy_kv_rows, cu_step, cu_hist_sync, cu_synchronize, cu_stream,
};
