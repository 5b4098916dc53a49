/*
 * weight.h - the weight descriptor every matrix product dispatches on.
 *
 * A dsq_weight says how one linear weight W (logical shape [rows = out,
 * cols = in], y = x W^T) is stored, wherever it lives (a host mapping for
 * the CPU backend, device memory for the CUDA backend).  The products take
 * a dsq_weight and switch on its format:
 *   CPU   dsq_cpu_linear()  (lib/cpu_ops.h)
 *   CUDA  dsq_cu_linear()   (cuda/kernels.h): GEMV or cuBLASLt by batch
 * so a new storage format is a new case in those two switches (and its
 * packer), never a change to the layer code that calls them.
 */
#ifndef DSQ_WEIGHT_H
#define DSQ_WEIGHT_H

#include <stdint.h>

#include "internal.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum dsq_wformat {
    DSQ_WF_F32 = 0,  /* data: float [rows][cols] */
    DSQ_WF_F16 = 1,  /* data: IEEE half [rows][cols] */
    DSQ_WF_BF16 = 2, /* data: bfloat16 [rows][cols] */
    /* Quantized formats (lib/quant_cpu.h, docs/quantization.md); made at
     * load by lib/weights_quant.c. */
    DSQ_WF_Q8_ROW = 16,  /* data: int8 [rows][cols]; scales: float [rows] */
    DSQ_WF_Q4_AWQ = 17,  /* source tags only: AWQ and GPTQ checkpoints are */
    DSQ_WF_Q4_GPTQ = 18, /* repacked into Q4_G128 at load; no product takes them */
    DSQ_WF_Q4_G128 = 19  /* data: uint8 [rows][dsq_q4_ldq(cols)] codes; scales:
                            f16 [rows][G]; zeros: uint8 [rows][G]; G =
                            ceil(cols / 128), group_size 128 */
} dsq_wformat;

/* How rows are ordered in memory. */
typedef enum dsq_wlayout {
    DSQ_WL_ROWS = 0,      /* row r of W at r * cols */
    DSQ_WL_GATE_UP = 1    /* two [rows/2, cols] matrices (gate, up) interleaved
                             by rows: row 2i = gate_i, row 2i+1 = up_i (CUDA's
                             fused SwiGLU weight; a GEMV block owning a row
                             pair finishes silu(gate)*up itself) */
} dsq_wlayout;

typedef struct dsq_weight {
    dsq_wformat format;
    int64_t rows, cols;  /* logical [out, in], row-major */
    const void *data;
    const void *scales;  /* quantized formats: per row or per (row, group) */
    const void *zeros;   /* quantized formats with zero points */
    int32_t group_size;  /* columns per scale (0: per row or none) */
    int32_t layout;      /* dsq_wlayout */
} dsq_weight;

/* "bf16", "q4_awq", ... ("?" for an unknown value). */
const char *dsq_wformat_name(dsq_wformat f);

/* The descriptor of a plain host tensor [rows, cols] (a 1-D tensor [n] is
 * [n, 1]): format from its dtype, layout ROWS.  DSQ_ERR_DTYPE for a dtype
 * that is no weight format. */
dsq_status dsq_weight_from_tensor(const dsq_tensor *t, dsq_weight *w);

#ifdef __cplusplus
}
#endif

#endif /* DSQ_WEIGHT_H */
