/*
 * backend_quant.cu - the CUDA model's quantized matrices (backend.h,
 * "quantized weights"): format of a recipe op's weights, carving and upload
 * of the Q8_ROW / Q4_G128 arrays (lib/quant_cpu.h layouts, unchanged on the
 * device: the GEMV kernels of gemv_quant.cu and the dequantize-to-bf16
 * kernels read them as the CPU does).
 *
 *   Q8_ROW   q int8 [rows][K]            scales fp32 [rows]
 *   Q4_G128  q uint8 [rows][ldq]         scales f16 [rows][G]   zeros uint8 [rows][G]
 * fused QKV: rows q | k | v; fused gate/up (DSQ_WL_GATE_UP): row 2i of each
 * array = gate row i, row 2i+1 = up row i.
 */
#include <string.h>

#include "backend.h"
#include "quant_cpu.h"
#include "weights_quant.h"

dsq_status cu_op_qformat(const dsq_model *m, const dsq_op *op, int32_t l, int *fmt)
{
    *fmt = 0;
    if (op->kind == DSQ_OP_NORM || op->kind == DSQ_OP_ATTEND)
        return DSQ_OK;
    int n = 0, nq = 0, f = 0;
    for (int j = 0; j < 3; j++) {
        if (op->w[j] < 0)
            continue;
        n++;
        const dsq_weight *q = dsq_weights_qslot(&m->w, 1, op->w[j], l);
        if (q) {
            if (nq && q->format != f)
                nq = -100; /* two quantized formats */
            f = q->format;
            nq++;
        }
    }
    if (nq == 0)
        return DSQ_OK;
    if (nq != n) {
        char name[160];
        dsq_arch_tensor_name(m->cfg.arch, 1, op->w[0], l, name, sizeof name);
        return dsq_fail(DSQ_ERR_UNSUPPORTED,
                        "CUDA backend: the weights fused with '%s' mix quantized and unquantized (or two "
                        "quantized) formats; one fused matrix holds one format",
                        name);
    }
    *fmt = f;
    return DSQ_OK;
}

static void *at_off(char *base, size_t off) { return base ? base + off : NULL; }

dsq_weight cu_place_quant(int fmt, int64_t rows, int64_t cols, dsq_wlayout layout, char *base, size_t *off)
{
    dsq_weight w;
    memset(&w, 0, sizeof w);
    w.format = (dsq_wformat)fmt;
    w.rows = rows;
    w.cols = cols;
    w.layout = layout;
    if (fmt == DSQ_WF_Q8_ROW) {
        w.data = at_off(base, cu_carve(off, (size_t)(rows * cols)));
        w.scales = at_off(base, cu_carve(off, (size_t)rows * 4));
    } else {
        w.data = at_off(base, cu_carve(off, dsq_q4_q_bytes(rows, cols)));
        w.scales = at_off(base, cu_carve(off, dsq_q4_scales_bytes(rows, cols)));
        w.zeros = at_off(base, cu_carve(off, dsq_q4_zeros_bytes(rows, cols)));
        w.group_size = DSQ_Q4_GROUP;
    }
    return w;
}

/* Rows of src's array into rows row0 + i*step of dst's (row_bytes each). */
static dsq_status rows_2d(const void *dst, const void *src, size_t row_bytes, int64_t rows, int64_t row0,
                          int64_t step)
{
    CU_TRY(cudaMemcpy2D((char *)dst + (size_t)row0 * row_bytes, (size_t)step * row_bytes, src, row_bytes, row_bytes,
                        (size_t)rows, cudaMemcpyHostToDevice),
           "quantized weight upload");
    return DSQ_OK;
}

dsq_status cu_upload_quant(const dsq_weight *dst, const dsq_weight *src, int64_t row0, int64_t step)
{
    if (src->format != dst->format || src->cols != dst->cols || row0 + (src->rows - 1) * step >= dst->rows)
        return dsq_fail(DSQ_ERR_INTERNAL, "CUDA upload: a %s matrix [%lld, %lld] does not fit its place",
                        dsq_wformat_name(src->format), (long long)src->rows, (long long)src->cols);
    const int64_t N = src->rows, K = src->cols;
    if (src->format == DSQ_WF_Q8_ROW) {
        DSQ_TRY(rows_2d(dst->data, src->data, (size_t)K, N, row0, step));
        return rows_2d(dst->scales, src->scales, 4, N, row0, step);
    }
    const int64_t G = dsq_q4_groups(K);
    DSQ_TRY(rows_2d(dst->data, src->data, (size_t)dsq_q4_ldq(K), N, row0, step));
    DSQ_TRY(rows_2d(dst->scales, src->scales, (size_t)G * 2, N, row0, step));
    return rows_2d(dst->zeros, src->zeros, (size_t)G, N, row0, step);
}
