/* cpu_ops.c - numeric building blocks of the CPU backend.
 *
 * Inner loops use GCC/Clang vector extensions (8 floats) rather than relying
 * on auto-vectorization: without -ffast-math the compiler may not reorder a
 * float reduction, and we want one fixed, documented order anyway (see
 * dsq_cpu_dot and the matmul section).  Floating-point contraction stays off (ISO C mode for GCC,
 * the pragma for Clang) so every path rounds the same way.  On x86-64 with
 * GCC the hot functions are also compiled for AVX2 and AVX-512 and picked
 * at load time (target_clones); all clones give identical results. */
#include <math.h>
#include <string.h>

#include "cpu_ops.h"
#include "quant_cpu.h"

/* (The always-inline helpers pass 32-byte vectors by value; GCC's note
 * about that ABI is silenced for this file in CMakeLists.txt.) */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && \
    !defined(DSQ_NO_TARGET_CLONES)
#define DSQ_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define DSQ_CLONES
#endif
#define DSQ_INLINE static inline __attribute__((always_inline))

typedef float v8f __attribute__((vector_size(32)));

DSQ_INLINE v8f ld8(const float *p)
{
    v8f v;
    memcpy(&v, p, sizeof v);
    return v;
}

typedef uint32_t v8u __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));
typedef uint16_t v8h __attribute__((vector_size(16)));

/* 8 bf16 -> 8 floats: widen and shift (exact). */
DSQ_INLINE v8f ld8_bf16(const uint16_t *p)
{
    v8h h;
    memcpy(&h, p, sizeof h);
    return (v8f)(__builtin_convertvector(h, v8u) << 16);
}

/* 8 IEEE halves -> 8 floats, exactly as dsq_cpu_f16_to_f32 (bit tricks
 * with masks, so it vectorizes on any ISA). */
DSQ_INLINE v8f ld8_f16(const uint16_t *p)
{
    v8h h;
    memcpy(&h, p, sizeof h);
    v8u x = __builtin_convertvector(h, v8u);
    v8u sign = (x & 0x8000u) << 16;
    v8u em = x & 0x7fffu;
    v8u e = em >> 10;
    v8u bits = (em << 13) + (112u << 23);
    bits += (v8u)(e == 31u) & (112u << 23);
    v8f sub = __builtin_convertvector((v8i)em, v8f) * 5.9604644775390625e-8f;
    v8u zero_exp = (v8u)(e == 0u);
    v8u mag = ((v8u)sub & zero_exp) | (bits & ~zero_exp);
    return (v8f)(mag | sign);
}

DSQ_INLINE void st8(float *p, v8f v) { memcpy(p, &v, sizeof v); }

/* Fixed pairwise combination of the 8 partial sums. */
DSQ_INLINE float hsum8(v8f v)
{
    return ((v[0] + v[1]) + (v[2] + v[3])) + ((v[4] + v[5]) + (v[6] + v[7]));
}

/* The attention's dot product: 16-element steps into two accumulators
 * (halves the dependency chain on short vectors), then an 8-step, the
 * pairwise sums, and the tail in order. */
DSQ_INLINE float dot2_inl(const float *a, const float *b, int64_t n)
{
    v8f acc0 = {0}, acc1 = {0};
    int64_t n16 = n & ~(int64_t)15, n8 = n & ~(int64_t)7;
    for (int64_t k = 0; k < n16; k += 16) {
        acc0 += ld8(a + k) * ld8(b + k);
        acc1 += ld8(a + k + 8) * ld8(b + k + 8);
    }
    if (n8 > n16)
        acc0 += ld8(a + n16) * ld8(b + n16);
    float s = hsum8(acc0 + acc1);
    for (int64_t k = n8; k < n; k++)
        s += a[k] * b[k];
    return s;
}

float dsq_cpu_dot2(const float *a, const float *b, int64_t n) { return dot2_inl(a, b, n); }

DSQ_INLINE void row_to_f32_inl(float *dst, const void *src, dsq_dtype dt, int64_t n)
{
    switch (dt) {
    case DSQ_DT_BF16: {
        const uint16_t *s = src;
        for (int64_t i = 0; i < n; i++) {
            union { uint32_t u; float f; } v = { .u = (uint32_t)s[i] << 16 };
            dst[i] = v.f;
        }
        break;
    }
    case DSQ_DT_F16: {
        const uint16_t *s = src;
        int64_t n8 = n & ~(int64_t)7;
        for (int64_t i = 0; i < n8; i += 8)
            st8(dst + i, ld8_f16(s + i));
        for (int64_t i = n8; i < n; i++)
            dst[i] = dsq_cpu_f16_to_f32(s[i]);
        break;
    }
    case DSQ_DT_F32: memcpy(dst, src, (size_t)n * sizeof(float)); break;
    default: memset(dst, 0, (size_t)n * sizeof(float)); break; /* refused at load */
    }
}

DSQ_CLONES void dsq_cpu_row_to_f32(float *dst, const void *src, dsq_dtype dt, int64_t n)
{
    row_to_f32_inl(dst, src, dt, n);
}

/* ---- matmul ------------------------------------------------------------------
 *
 * Order of operations for every output y = dot(x, w) + b (see cpu_ops.h):
 * K is cut into chunks of 16; in chunk c, lane j of an 8-lane accumulator
 * adds x[16c+2j]*w[16c+2j] and then x[16c+2j+1]*w[16c+2j+1]; the lanes are
 * combined pairwise (hsum8), the K%16 tail is added in order, then the bias.
 * This "pair-split" lane order is what a 32-byte load of 16 BF16 weights
 * yields for free (the low and high halves of each 32-bit word), so the
 * decode kernel converts BF16 with one shift and one mask; the batched
 * kernels stage converted rows in the same split layout in wbuf and split
 * the activations to match.  Every path therefore computes each output
 * with identical operations, whatever the batch. */

/* 16 BF16 -> even-index and odd-index elements as floats. */
DSQ_INLINE void ld16_bf16_split(const uint16_t *p, v8f *even, v8f *odd)
{
    v8u u;
    memcpy(&u, p, sizeof u);
    *even = (v8f)(u << 16);
    *odd = (v8f)(u & 0xffff0000u);
}

/* 16 floats -> even-index and odd-index elements. */
DSQ_INLINE void ld16_f32_split(const float *p, v8f *even, v8f *odd)
{
    v8f a = ld8(p), b = ld8(p + 8);
    *even = __builtin_shufflevector(a, b, 0, 2, 4, 6, 8, 10, 12, 14);
    *odd = __builtin_shufflevector(a, b, 1, 3, 5, 7, 9, 11, 13, 15);
}

/* One weight row to fp32 in the split layout: per 16-chunk, its 8 even
 * elements then its 8 odd ones; the K%16 tail in natural order. */
DSQ_INLINE void row_to_split(float *dst, const void *src, dsq_dtype dt, int64_t K)
{
    int64_t K16 = K & ~(int64_t)15;
    v8f e, o;
    if (dt == DSQ_DT_BF16) {
        const uint16_t *s = src;
        for (int64_t k = 0; k < K16; k += 16) {
            ld16_bf16_split(s + k, &e, &o);
            st8(dst + k, e);
            st8(dst + k + 8, o);
        }
    } else if (dt == DSQ_DT_F16) {
        const uint16_t *s = src;
        for (int64_t k = 0; k < K16; k += 16) {
            v8f a = ld8_f16(s + k), b = ld8_f16(s + k + 8);
            st8(dst + k, __builtin_shufflevector(a, b, 0, 2, 4, 6, 8, 10, 12, 14));
            st8(dst + k + 8, __builtin_shufflevector(a, b, 1, 3, 5, 7, 9, 11, 13, 15));
        }
    } else {
        const float *s = src;
        for (int64_t k = 0; k < K16; k += 16) {
            ld16_f32_split(s + k, &e, &o);
            st8(dst + k, e);
            st8(dst + k + 8, o);
        }
    }
    const char *tail = (const char *)src + (size_t)K16 * dsq_dtype_size(dt);
    row_to_f32_inl(dst + K16, tail, dt, K - K16);
}

/* out[t][r] = dot(x_t, w_r) for 2 tokens x 4 split-layout rows. */
DSQ_INLINE void tile_2x4(const float *x0, const float *x1, const float *const w[4], int64_t K,
                         float out[2][4])
{
    v8f a00 = {0}, a01 = {0}, a02 = {0}, a03 = {0};
    v8f a10 = {0}, a11 = {0}, a12 = {0}, a13 = {0};
    const float *w0 = w[0], *w1 = w[1], *w2 = w[2], *w3 = w[3];
    int64_t K16 = K & ~(int64_t)15;
    for (int64_t k = 0; k < K16; k += 16) {
        v8f xe0, xo0, xe1, xo1;
        ld16_f32_split(x0 + k, &xe0, &xo0);
        ld16_f32_split(x1 + k, &xe1, &xo1);
        v8f we = ld8(w0 + k), wo = ld8(w0 + k + 8);
        a00 += xe0 * we;
        a00 += xo0 * wo;
        a10 += xe1 * we;
        a10 += xo1 * wo;
        we = ld8(w1 + k), wo = ld8(w1 + k + 8);
        a01 += xe0 * we;
        a01 += xo0 * wo;
        a11 += xe1 * we;
        a11 += xo1 * wo;
        we = ld8(w2 + k), wo = ld8(w2 + k + 8);
        a02 += xe0 * we;
        a02 += xo0 * wo;
        a12 += xe1 * we;
        a12 += xo1 * wo;
        we = ld8(w3 + k), wo = ld8(w3 + k + 8);
        a03 += xe0 * we;
        a03 += xo0 * wo;
        a13 += xe1 * we;
        a13 += xo1 * wo;
    }
    out[0][0] = hsum8(a00);
    out[0][1] = hsum8(a01);
    out[0][2] = hsum8(a02);
    out[0][3] = hsum8(a03);
    out[1][0] = hsum8(a10);
    out[1][1] = hsum8(a11);
    out[1][2] = hsum8(a12);
    out[1][3] = hsum8(a13);
    for (int64_t k = K16; k < K; k++)
        for (int r = 0; r < 4; r++) {
            out[0][r] += x0[k] * w[r][k];
            out[1][r] += x1[k] * w[r][k];
        }
}

/* The same for one token (an odd batch's last one). */
DSQ_INLINE void tile_1x4(const float *x0, const float *const w[4], int64_t K, float out[4])
{
    v8f a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};
    const float *w0 = w[0], *w1 = w[1], *w2 = w[2], *w3 = w[3];
    int64_t K16 = K & ~(int64_t)15;
    for (int64_t k = 0; k < K16; k += 16) {
        v8f xe, xo;
        ld16_f32_split(x0 + k, &xe, &xo);
        a0 += xe * ld8(w0 + k);
        a0 += xo * ld8(w0 + k + 8);
        a1 += xe * ld8(w1 + k);
        a1 += xo * ld8(w1 + k + 8);
        a2 += xe * ld8(w2 + k);
        a2 += xo * ld8(w2 + k + 8);
        a3 += xe * ld8(w3 + k);
        a3 += xo * ld8(w3 + k + 8);
    }
    out[0] = hsum8(a0);
    out[1] = hsum8(a1);
    out[2] = hsum8(a2);
    out[3] = hsum8(a3);
    for (int64_t k = K16; k < K; k++)
        for (int r = 0; r < 4; r++)
            out[r] += x0[k] * w[r][k];
}

/* One token x 8 rows straight from BF16 weights: the decode case, where
 * staging converted rows through wbuf would cost a store and a load per
 * weight for a single use.  Same per-output operations as the tiles above. */
DSQ_INLINE void tile_1x8_bf16(const float *x0, const uint16_t *const w[8], int64_t K, float out[8])
{
    v8f a[8] = {{0}};
    int64_t K16 = K & ~(int64_t)15;
    for (int64_t k = 0; k < K16; k += 16) {
        v8f xe, xo;
        ld16_f32_split(x0 + k, &xe, &xo);
        for (int r = 0; r < 8; r++) {
            v8f we, wo;
            ld16_bf16_split(w[r] + k, &we, &wo);
            a[r] += xe * we;
            a[r] += xo * wo;
        }
    }
    for (int r = 0; r < 8; r++)
        out[r] = hsum8(a[r]);
    for (int64_t k = K16; k < K; k++)
        for (int r = 0; r < 8; r++)
            out[r] += x0[k] * dsq_bf16_to_f32(w[r][k]);
}

DSQ_INLINE void store_row(float *y, float v, float b, int accumulate)
{
    v = v + b;
    *y = accumulate ? *y + v : v;
}

float dsq_cpu_dot(const float *a, const float *b, int64_t n)
{
    v8f acc = {0};
    int64_t n16 = n & ~(int64_t)15;
    for (int64_t k = 0; k < n16; k += 16) {
        v8f ae, ao, be, bo;
        ld16_f32_split(a + k, &ae, &ao);
        ld16_f32_split(b + k, &be, &bo);
        acc += ae * be;
        acc += ao * bo;
    }
    float s = hsum8(acc);
    for (int64_t k = n16; k < n; k++)
        s += a[k] * b[k];
    return s;
}

DSQ_CLONES void dsq_cpu_matmul_dense(float *Y, int64_t ldy, const float *X, int64_t ldx, int32_t T,
                                    const dsq_weight *W, dsq_dtype dt, const dsq_tensor *bias,
                                    int64_t o0, int64_t o1, int accumulate, float *wbuf)
{
    const int64_t K = W->cols;
    const size_t esz = dsq_dtype_size(dt);
    const char *wdata = W->data;
    if (T == 1 && dt == DSQ_DT_BF16) {
        for (int64_t o = o0; o < o1; o += 8) {
            int nr = o1 - o < 8 ? (int)(o1 - o) : 8;
            const uint16_t *w[8];
            for (int r = 0; r < 8; r++) /* edge block: repeat the last row */
                w[r] = (const uint16_t *)wdata + (size_t)(o + (r < nr ? r : nr - 1)) * (size_t)K;
            float out[8];
            tile_1x8_bf16(X, w, K, out);
            for (int r = 0; r < nr; r++)
                store_row(Y + o + r, out[r], bias ? dsq_tensor_get(bias, o + r) : 0.0f, accumulate);
        }
        return;
    }
    /* Tokens per block: keep the block's activations (tb*K floats) within
     * about half of a typical 1 MiB L2 while a converted row block is reused
     * across them; a weight row is converted once per token block. */
    int64_t tblk = (int64_t)(512 * 1024) / (K * (int64_t)sizeof(float));
    tblk = tblk < 2 ? 2 : tblk & ~(int64_t)1;
    for (int64_t t0 = 0; t0 < T; t0 += tblk) {
        int64_t tb = T - t0 < tblk ? T - t0 : tblk;
        for (int64_t o = o0; o < o1; o += DSQ_CPU_MM_ROWS) {
            int nr = o1 - o < DSQ_CPU_MM_ROWS ? (int)(o1 - o) : DSQ_CPU_MM_ROWS;
            const float *w[DSQ_CPU_MM_ROWS];
            float b[DSQ_CPU_MM_ROWS];
            for (int r = 0; r < DSQ_CPU_MM_ROWS; r++) {
                if (r >= nr) { /* edge block: repeat the last row, drop its results */
                    w[r] = w[nr - 1];
                    b[r] = 0.0f;
                    continue;
                }
                const char *src = wdata + (size_t)(o + r) * (size_t)K * esz;
                row_to_split(wbuf + (size_t)r * (size_t)K, src, dt, K);
                w[r] = wbuf + (size_t)r * (size_t)K;
                b[r] = bias ? dsq_tensor_get(bias, o + r) : 0.0f;
            }
            int64_t t = t0;
            for (; t + 1 < t0 + tb; t += 2) {
                float out[2][4];
                tile_2x4(X + t * ldx, X + (t + 1) * ldx, w, K, out);
                for (int r = 0; r < nr; r++) {
                    store_row(Y + t * ldy + o + r, out[0][r], b[r], accumulate);
                    store_row(Y + (t + 1) * ldy + o + r, out[1][r], b[r], accumulate);
                }
            }
            if (t < t0 + tb) {
                float out[4];
                tile_1x4(X + t * ldx, w, K, out);
                for (int r = 0; r < nr; r++)
                    store_row(Y + t * ldy + o + r, out[r], b[r], accumulate);
            }
        }
    }
}

dsq_status dsq_cpu_linear(float *Y, int64_t ldy, const float *X, int64_t ldx, int32_t T,
                          const dsq_weight *W, const dsq_tensor *bias, int64_t o0, int64_t o1,
                          int accumulate, float *wbuf)
{
    if (W->layout != DSQ_WL_ROWS)
        return dsq_fail(DSQ_ERR_UNSUPPORTED, "cpu linear: weight layout %d is not supported",
                        (int)W->layout);
    dsq_dtype dt;
    switch (W->format) {
    case DSQ_WF_F32: dt = DSQ_DT_F32; break;
    case DSQ_WF_F16: dt = DSQ_DT_F16; break;
    case DSQ_WF_BF16: dt = DSQ_DT_BF16; break;
    case DSQ_WF_Q8_ROW: {
        /* lib/quant_cpu_matmul.c (its own lane order, quant_cpu.h);
         * wbuf holds dsq_quant_scratch_floats(K) */
        const dsq_q8_mat q = { W->data, W->scales, W->rows, W->cols };
        if (T > 0 && o1 > o0)
            dsq_q8_matmul_rows(Y, ldy, X, ldx, T, &q, bias, o0, o1, accumulate, wbuf);
        return DSQ_OK;
    }
    case DSQ_WF_Q4_G128: {
        const dsq_q4_mat q = { W->data, W->scales, W->zeros, W->rows, W->cols };
        if (T > 0 && o1 > o0)
            dsq_q4_matmul_rows(Y, ldy, X, ldx, T, &q, bias, o0, o1, accumulate, wbuf);
        return DSQ_OK;
    }
    case DSQ_WF_Q4_AWQ:
    case DSQ_WF_Q4_GPTQ:
    default:
        return dsq_fail(DSQ_ERR_UNSUPPORTED, "cpu linear: weight format %s has no CPU product",
                        dsq_wformat_name(W->format));
    }
    if (T > 0 && o1 > o0)
        dsq_cpu_matmul_dense(Y, ldy, X, ldx, T, W, dt, bias, o0, o1, accumulate, wbuf);
    return DSQ_OK;
}

/* ---- normalization, rotary embedding, activation ------------------------------- */

void dsq_cpu_rmsnorm(float *y, const float *x, const dsq_tensor *w, int64_t n, float eps)
{
    double ss = 0.0;
    for (int64_t i = 0; i < n; i++)
        ss += (double)x[i] * (double)x[i];
    float var = (float)(ss / (double)n);
    float r = 1.0f / sqrtf(var + eps);
    for (int64_t i = 0; i < n; i++)
        y[i] = (x[i] * r) * dsq_tensor_get(w, i);
}

void dsq_cpu_rope_inv_freq(float *inv_freq, int32_t head_dim, float theta)
{
    for (int32_t i = 0; i < head_dim / 2; i++) {
        float e = (float)(2 * i) / (float)head_dim;
        float p = (float)pow((double)theta, (double)e);
        inv_freq[i] = 1.0f / p;
    }
}

void dsq_cpu_rope_table(float *cs, const float *inv_freq, int32_t half, int32_t pos)
{
    for (int32_t i = 0; i < half; i++) {
        float a = (float)pos * inv_freq[i];
        cs[i] = (float)cos((double)a);
        cs[half + i] = (float)sin((double)a);
    }
}

void dsq_cpu_rope_apply(float *x, const float *cs, int32_t head_dim)
{
    int32_t h = head_dim / 2;
    const float *c = cs, *s = cs + h;
    for (int32_t i = 0; i < h; i++) {
        float a = x[i], b = x[i + h];
        x[i] = a * c[i] - b * s[i];
        x[i + h] = b * c[i] + a * s[i];
    }
}

void dsq_cpu_silu_mul(float *g, const float *u, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        float x = g[i];
        g[i] = (x / (1.0f + expf(-x))) * u[i];
    }
}

/* ---- KV cache ------------------------------------------------------------------------ */

size_t dsq_cpu_kv_elem_size(int32_t kv_dtype)
{
    return kv_dtype == DSQ_KV_F32 ? 4 : kv_dtype == DSQ_KV_F16 ? 2 : 1;
}

void dsq_cpu_kv_store(void *dst, float *scale, int32_t kv_dtype, const float *x, int32_t D)
{
    if (kv_dtype == DSQ_KV_F32) {
        memcpy(dst, x, (size_t)D * sizeof(float));
    } else if (kv_dtype == DSQ_KV_F16) {
        uint16_t *h = dst;
        for (int32_t d = 0; d < D; d++)
            h[d] = dsq_f32_to_f16(x[d]);
    } else {
        int8_t *q = dst;
        float amax = 0.0f;
        int finite = 1;
        for (int32_t d = 0; d < D; d++) {
            amax = fabsf(x[d]) > amax ? fabsf(x[d]) : amax;
            finite &= isfinite(x[d]) != 0;
        }
        /* int8 cannot hold NaN or Inf: such a vector is stored as all-zero
         * values with a NaN scale, so it reads back as all NaN (attention
         * then gives NaN, as with F32/F16 KV) instead of finite garbage */
        float s = finite ? amax / 127.0f : NAN;
        *scale = s;
        for (int32_t d = 0; d < D; d++) {
            float r = s > 0.0f ? rintf(x[d] / s) : 0.0f; /* NaN s: 0 */
            r = r > 127.0f ? 127.0f : r < -127.0f ? -127.0f : r;
            q[d] = (int8_t)r;
        }
    }
}

DSQ_INLINE void kv_load_inl(float *x, const void *src, const float *scale, int32_t kv_dtype,
                            int32_t D)
{
    if (kv_dtype == DSQ_KV_F32) {
        memcpy(x, src, (size_t)D * sizeof(float));
    } else if (kv_dtype == DSQ_KV_F16) {
        const uint16_t *h = src;
        int32_t d8 = D & ~7;
        for (int32_t d = 0; d < d8; d += 8)
            st8(x + d, ld8_f16(h + d));
        for (int32_t d = d8; d < D; d++)
            x[d] = dsq_cpu_f16_to_f32(h[d]);
    } else {
        const int8_t *q = src;
        float s = *scale;
        for (int32_t d = 0; d < D; d++)
            x[d] = (float)q[d] * s;
    }
}

void dsq_cpu_kv_load(float *x, const void *src, const float *scale, int32_t kv_dtype, int32_t D)
{
    kv_load_inl(x, src, scale, kv_dtype, D);
}

/* ---- attention ------------------------------------------------------------------- */

DSQ_CLONES void dsq_cpu_attend(const dsq_cpu_kv_view *kv, int32_t head, const int64_t *rows,
                               int32_t n_ctx, const float *q, int32_t n_rep, float scale,
                               float *out, float *scores, float *kv_tmp)
{
    const int32_t D = kv->head_dim;
    const size_t esz = dsq_cpu_kv_elem_size(kv->kv_dtype);
    const char *kb = kv->k, *vb = kv->v;
    for (int32_t p = 0; p < n_ctx; p++) {
        int64_t slot = rows[p] * kv->n_kv + head; /* (row, head) vector index */
        const char *src = kb + (size_t)slot * (size_t)D * esz;
        const float *k;
        if (kv->kv_dtype == DSQ_KV_F32) {
            k = (const float *)src;
        } else {
            kv_load_inl(kv_tmp, src, kv->ks ? kv->ks + slot : NULL, kv->kv_dtype, D);
            k = kv_tmp;
        }
        for (int32_t r = 0; r < n_rep; r++)
            scores[(size_t)r * n_ctx + p] = dot2_inl(q + (size_t)r * D, k, D) * scale;
    }
    for (int32_t r = 0; r < n_rep; r++) {
        float *s = scores + (size_t)r * n_ctx;
        float m = s[0];
        for (int32_t p = 1; p < n_ctx; p++)
            m = s[p] > m ? s[p] : m;
        double sum = 0.0;
        for (int32_t p = 0; p < n_ctx; p++) {
            s[p] = expf(s[p] - m);
            sum += s[p];
        }
        float fs = (float)sum;
        for (int32_t p = 0; p < n_ctx; p++)
            s[p] = s[p] / fs;
    }
    memset(out, 0, (size_t)n_rep * D * sizeof(float));
    for (int32_t p = 0; p < n_ctx; p++) {
        int64_t slot = rows[p] * kv->n_kv + head;
        const char *src = vb + (size_t)slot * (size_t)D * esz;
        const float *v;
        if (kv->kv_dtype == DSQ_KV_F32) {
            v = (const float *)src;
        } else {
            kv_load_inl(kv_tmp, src, kv->vs ? kv->vs + slot : NULL, kv->kv_dtype, D);
            v = kv_tmp;
        }
        for (int32_t r = 0; r < n_rep; r++) {
            float w = scores[(size_t)r * n_ctx + p];
            float *o = out + (size_t)r * D;
            for (int32_t d = 0; d < D; d++)
                o[d] += w * v[d];
        }
    }
}
