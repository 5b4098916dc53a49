/* cpu_ops.h - numeric building blocks of the CPU backend (fp32 compute).
 *
 * Every function here is single-threaded and works on caller-owned memory;
 * cpu_backend.c splits the work across threads.  Each output element is
 * computed with a fixed order of floating-point operations that depends only
 * on the sizes of the problem, never on how many tokens share a batch or on
 * which thread runs it, so a sequence decoded alone or inside a batch gets
 * bit-identical results. */
#ifndef DSQ_CPU_OPS_H
#define DSQ_CPU_OPS_H

#include <stdint.h>

#include "internal.h"
#include "weight.h"

/* Output rows of a matmul are produced in blocks of this many; a caller's
 * row ranges should be multiples of it (except at the end) to avoid
 * recomputing edge rows. */
#define DSQ_CPU_MM_ROWS 4

/* Exact IEEE half -> float (same results as dsq_f16_to_f32 for all 65536
 * inputs, NaN payloads included), branch-free so loops vectorize. */
static inline float dsq_cpu_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t em = h & 0x7fffu;
    uint32_t e = em >> 10;
    /* normal: rebias 15 -> 127; inf/nan (e == 31): once more, to 255 */
    uint32_t bits = (em << 13) + (112u << 23) + (e == 31 ? (112u << 23) : 0u);
    union { uint32_t u; float f; } v = { .u = bits };
    /* zero / subnormal: em * 2^-24, exact in float */
    float sub = (float)(int32_t)em * 5.9604644775390625e-8f;
    float mag = e == 0 ? sub : v.f;
    union { float f; uint32_t u; } r = { .f = mag };
    r.u |= sign;
    return r.f;
}

/* dst[0..n) = float(src[0..n)) for a BF16/F16/F32 row (exact). */
void dsq_cpu_row_to_f32(float *dst, const void *src, dsq_dtype dt, int64_t n);

/* fp32 dot product in the matmul's order ("pair-split"): n is cut into
 * chunks of 16; in chunk c, lane j of an 8-lane accumulator adds
 * a[16c+2j]*b[16c+2j] then a[16c+2j+1]*b[16c+2j+1]; the 8 lanes are
 * combined pairwise, then the n%16 tail is added in order.  Every matmul
 * output is computed with exactly these operations, whatever tile (or
 * batch) computes it. */
float dsq_cpu_dot(const float *a, const float *b, int64_t n);
/* The attention's variant: 16 interleaved partial sums (two vectors of 8,
 * added lane-wise before the pairwise combination) for a shorter
 * dependency chain on head-sized vectors. */
float dsq_cpu_dot2(const float *a, const float *b, int64_t n);

/* The CPU's one matrix product, dispatching on W's format (lib/weight.h),
 * over a range of output features:
 *   Y[t*ldy + o] = (accumulate ? Y[t*ldy + o] : 0) + (dot(X[t], W[o]) + bias[o])
 * for t in 0..T-1, o in o0..o1-1.  W is [N, K] (F32/F16/BF16, layout ROWS),
 * X is [T][ldx] fp32 with K used, bias is [N] or NULL (zeros).  Every output
 * is exactly dsq_cpu_dot(X[t], float(W[o]), K) + bias[o], bit for bit.  For
 * several tokens, weight rows are converted to fp32 on the fly,
 * DSQ_CPU_MM_ROWS at a time, into wbuf[DSQ_CPU_MM_ROWS][K] (scratch) and
 * each converted block serves a block of tokens sized to stay in L2; a
 * single token with BF16 weights reads them directly.
 * Q8_ROW / Q4_G128 weights run lib/quant_cpu_matmul.c's products (their
 * own fixed lane order on the exactly dequantized rows, quant_cpu.h: batch-
 * and thread-invariant, not the dense order); they need wbuf of
 * dsq_quant_scratch_floats(K) floats.
 * DSQ_ERR_UNSUPPORTED (message naming the format) for a format or layout
 * without a CPU product (the AWQ / GPTQ source tags, which are repacked).
 * T = 0 runs nothing but the check (the backend asks at load, so the pass
 * itself cannot fail). */
dsq_status dsq_cpu_linear(float *Y, int64_t ldy, const float *X, int64_t ldx, int32_t T,
                          const dsq_weight *W, const dsq_tensor *bias, int64_t o0, int64_t o1,
                          int accumulate, float *wbuf);
/* dsq_cpu_linear's case for the dense formats, dt the element type of W
 * (F32 / F16 / BF16, layout ROWS); exported only for its CPU-feature clones. */
void dsq_cpu_matmul_dense(float *Y, int64_t ldy, const float *X, int64_t ldx, int32_t T,
                          const dsq_weight *W, dsq_dtype dt, const dsq_tensor *bias, int64_t o0,
                          int64_t o1, int accumulate, float *wbuf);

/* y[0..n) = (x * rsqrt(mean(x^2) + eps)) * w  (sum of squares in double). */
void dsq_cpu_rmsnorm(float *y, const float *x, const dsq_tensor *w, int64_t n, float eps);

/* inv_freq[i] = 1 / theta^(2i/head_dim) for i < head_dim/2, rounded to fp32
 * as Hugging Face computes it (fp32 exponent, correctly rounded power).  HF
 * keeps this buffer in fp32 however the model is loaded; only a model cast
 * after construction (model.to(bfloat16)) rounds it to bf16, which moves
 * logits by ~1e-2 and is not the reference. */
void dsq_cpu_rope_inv_freq(float *inv_freq, int32_t head_dim, float theta);
/* cos/sin of the fp32 angle pos*inv_freq[i] (fp32 product, as HF):
 * cs[0..half) = cos, cs[half..2*half) = sin. */
void dsq_cpu_rope_table(float *cs, const float *inv_freq, int32_t half, int32_t pos);
/* Rotate one head in place, neox style: dimension i pairs with i + D/2:
 *   x'[i]     = x[i]*cos[i] - x[i+h]*sin[i]
 *   x'[i+h]   = x[i+h]*cos[i] + x[i]*sin[i]        (h = D/2) */
void dsq_cpu_rope_apply(float *x, const float *cs, int32_t head_dim);

/* ---- KV cache rows --------------------------------------------------------
 * One (token, KV head) vector of D values is stored as:
 *   DSQ_KV_F32:  D floats, exact.
 *   DSQ_KV_F16:  D IEEE halves, each rounded to nearest-even from fp32
 *                (dsq_f32_to_f16); read back exactly.
 *   DSQ_KV_INT8: D int8 plus one fp32 scale, symmetric per (token, head):
 *                  amax  = max_d |x[d]|
 *                  scale = amax / 127.0f                  (fp32 division)
 *                  q[d]  = rint(x[d] / scale)             (fp32 division,
 *                          round half to even), clamped to [-127, 127];
 *                          all q = 0 and scale = 0 when amax == 0;
 *                          all q = 0 and scale = NaN when any x[d] is NaN
 *                          or +-Inf (int8 cannot hold them: the vector
 *                          reads back as all NaN, never as finite values)
 *                read back as x'[d] = (float)q[d] * scale  (fp32 product).
 *   F16 overflow (|x| >= 65520) gives +-Inf and NaN stays NaN (IEEE), so a
 *   non-finite K or V gives NaN attention output with every KV dtype.
 * The CUDA kernels are tested against exactly this. */
void dsq_cpu_kv_store(void *dst, float *scale, int32_t kv_dtype, const float *x, int32_t D);
void dsq_cpu_kv_load(float *x, const void *src, const float *scale, int32_t kv_dtype, int32_t D);
size_t dsq_cpu_kv_elem_size(int32_t kv_dtype);

/* One layer's cache as the attention sees it: element (row, head, d) of K is
 * at k + ((row * n_kv + head) * D + d) * elem, its INT8 scale at
 * ks[row * n_kv + head] (same for V). */
typedef struct dsq_cpu_kv_view {
    const void *k, *v;
    const float *ks, *vs; /* INT8 only */
    int32_t kv_dtype;
    int32_t n_kv;
    int32_t head_dim;
} dsq_cpu_kv_view;

/* Causal attention of n_rep query heads sharing KV head `head` over n_ctx
 * cached positions whose rows are rows[0..n_ctx):
 *   s[r][p] = dot(q[r], k_p) * scale;  w = softmax_p(s[r]) (fp32, max
 *   subtracted, sum in double);  out[r] = sum_p w[r][p] * v_p.
 * q, out: [n_rep][D]; scores: [n_rep][n_ctx] scratch; kv_tmp: [D] scratch. */
void dsq_cpu_attend(const dsq_cpu_kv_view *kv, int32_t head, const int64_t *rows, int32_t n_ctx,
                    const float *q, int32_t n_rep, float scale, float *out, float *scores,
                    float *kv_tmp);

/* g[i] = silu(g[i]) * u[i] = g/(1+exp(-g)) * u  (as torch computes silu). */
void dsq_cpu_silu_mul(float *g, const float *u, int64_t n);

#endif
