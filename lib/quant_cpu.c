/* quant_cpu.c - see quant_cpu.h: repacking, quantize at load, dequantize
 * and the CPU products of the quantized layouts.
 *
 * The products have one definition of their numerics: the dense path's
 * fixed summation order (dsq_cpu_dot) on the exactly dequantized weights.
 * Several tokens: a block of rows is dequantized into fp32 scratch and
 * tiles like the dense kernel's run on it.  One token: the
 * codes are dequantized in registers straight into the dense kernel's lane
 * order.  The dequantization is branch-free 8-lane vector code (shifts,
 * masks, converts), so it vectorizes on any ISA. */
#include <math.h>
#include <string.h>

#include "cpu_ops.h"
#include "quant_cpu.h"

#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && \
    !defined(DSQ_NO_TARGET_CLONES)
#define DSQ_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define DSQ_CLONES
#endif

typedef float v8f __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));
typedef uint32_t v8u __attribute__((vector_size(32)));

/* AWQ's pack order: nibble i of a word holds output column 8c + AWQ_ORDER[i]. */
static const int AWQ_ORDER[8] = {0, 2, 4, 6, 1, 3, 5, 7};

int64_t dsq_q4_ldq(int64_t K) { return ((K + 31) / 32) * 16; }
int64_t dsq_q4_groups(int64_t K) { return (K + DSQ_Q4_GROUP - 1) / DSQ_Q4_GROUP; }
size_t dsq_q4_q_bytes(int64_t N, int64_t K) { return (size_t)N * (size_t)dsq_q4_ldq(K); }
size_t dsq_q4_scales_bytes(int64_t N, int64_t K) { return (size_t)N * (size_t)dsq_q4_groups(K) * 2; }
size_t dsq_q4_zeros_bytes(int64_t N, int64_t K) { return (size_t)N * (size_t)dsq_q4_groups(K); }

static dsq_status check_packed(const char *fmt, const void *a, const void *b, const void *c,
                               const void *d, const void *e, const void *f, int64_t N, int64_t K)
{
    if (!a || !b || !c || !d || !e || !f)
        return dsq_fail(DSQ_ERR_INVALID_ARG, "%s repack: NULL array", fmt);
    if (N < 8 || K < DSQ_Q4_GROUP || N % 8 != 0 || K % DSQ_Q4_GROUP != 0 || N > (1 << 24) ||
        K > (1 << 24))
        return dsq_fail(DSQ_ERR_SHAPE,
                        "%s repack: %lld x %lld weight; 4-bit group-128 packing needs out "
                        "features a multiple of 8 and in features a multiple of 128",
                        fmt, (long long)N, (long long)K);
    return DSQ_OK;
}

/* DSQ_ERR_FORMAT if any of the n f16 scales (stored [G][N]) is NaN or Inf. */
static dsq_status check_scales(const char *fmt, const uint16_t *scales, int64_t G, int64_t N)
{
    for (int64_t i = 0; i < G * N; i++)
        if ((scales[i] & 0x7c00u) == 0x7c00u)
            return dsq_fail(DSQ_ERR_FORMAT, "%s repack: scale of group %lld, column %lld is %s", fmt,
                            (long long)(i / N), (long long)(i % N),
                            (scales[i] & 0x3ffu) ? "NaN" : "infinite");
    return DSQ_OK;
}

static inline void put_code(uint8_t *q, int64_t ldq, int64_t n, int64_t k, uint32_t v)
{
    q[n * ldq + k / 2] |= (uint8_t)(v << (4 * (k & 1)));
}

dsq_status dsq_q4_from_awq(const int32_t *qweight, const int32_t *qzeros, const uint16_t *scales,
                           int64_t N, int64_t K, uint8_t *q, uint16_t *q_scales, uint8_t *q_zeros)
{
    dsq_status st = check_packed("AWQ", qweight, qzeros, scales, q, q_scales, q_zeros, N, K);
    if (st == DSQ_OK)
        st = check_scales("AWQ", scales, K / DSQ_Q4_GROUP, N);
    if (st != DSQ_OK)
        return st;
    /* K % 128 == 0, so ldq = K / 2 and every byte of q is written: byte
     * k/2 of row n from codes k, k+1 (two words of column block n/8).
     * Blocks of 64 k keep the words read (64 x N/8) in cache while each
     * row gets a contiguous run of 32 bytes. */
    const int64_t ldq = dsq_q4_ldq(K), G = dsq_q4_groups(K), C = N / 8;
    for (int64_t k0 = 0; k0 < K; k0 += 64)
        for (int64_t c = 0; c < C; c++)
            for (int64_t k = k0; k < k0 + 64 && k < K; k += 2) {
                uint32_t w0 = (uint32_t)qweight[k * C + c], w1 = (uint32_t)qweight[(k + 1) * C + c];
                for (int i = 0; i < 8; i++)
                    q[(8 * c + AWQ_ORDER[i]) * ldq + k / 2] =
                        (uint8_t)(((w0 >> (4 * i)) & 15u) | (((w1 >> (4 * i)) & 15u) << 4));
            }
    for (int64_t g = 0; g < G; g++)
        for (int64_t c = 0; c < C; c++) {
            uint32_t word = (uint32_t)qzeros[g * C + c];
            for (int i = 0; i < 8; i++)
                q_zeros[(8 * c + AWQ_ORDER[i]) * G + g] = (uint8_t)((word >> (4 * i)) & 15u);
        }
    for (int64_t g = 0; g < G; g++)
        for (int64_t n = 0; n < N; n++)
            q_scales[n * G + g] = scales[g * N + n];
    return DSQ_OK;
}

dsq_status dsq_q4_from_gptq(const int32_t *qweight, const int32_t *qzeros, const uint16_t *scales,
                            const int32_t *g_idx, int zero_offset, int64_t N, int64_t K,
                            uint8_t *q, uint16_t *q_scales, uint8_t *q_zeros)
{
    dsq_status st = check_packed("GPTQ", qweight, qzeros, scales, q, q_scales, q_zeros, N, K);
    if (st == DSQ_OK)
        st = check_scales("GPTQ", scales, K / DSQ_Q4_GROUP, N);
    if (st != DSQ_OK)
        return st;
    if (zero_offset != 0 && zero_offset != 1)
        return dsq_fail(DSQ_ERR_INVALID_ARG, "GPTQ repack: zero offset %d (0 or 1)", zero_offset);
    if (g_idx)
        for (int64_t k = 0; k < K; k++)
            if (g_idx[k] != k / DSQ_Q4_GROUP)
                return dsq_fail(DSQ_ERR_UNSUPPORTED,
                                "GPTQ g_idx[%lld] = %d, not %lld: act-order or permuted groups "
                                "are not supported",
                                (long long)k, (int)g_idx[k], (long long)(k / DSQ_Q4_GROUP));
    /* A GPTQ word (r, n) holds codes 8r..8r+7 of row n at bits 4j: exactly
     * word r of row n in Q4_G128 (ldq = K / 2 here), so the repack of the
     * codes is a transpose of 32-bit words, blocked for the cache. */
    const int64_t ldq = dsq_q4_ldq(K), G = dsq_q4_groups(K), C = N / 8;
    for (int64_t n0 = 0; n0 < N; n0 += 64)
        for (int64_t r = 0; r < K / 8; r++)
            for (int64_t n = n0; n < n0 + 64 && n < N; n++)
                memcpy(q + n * ldq + 4 * r, &qweight[r * N + n], 4);
    for (int64_t g = 0; g < G; g++)
        for (int64_t c = 0; c < C; c++) {
            uint32_t word = (uint32_t)qzeros[g * C + c];
            for (int j = 0; j < 8; j++)
                q_zeros[(8 * c + j) * G + g] = (uint8_t)(((word >> (4 * j)) & 15u) + (uint32_t)zero_offset);
        }
    for (int64_t g = 0; g < G; g++)
        for (int64_t n = 0; n < N; n++)
            q_scales[n * G + g] = scales[g * N + n];
    return DSQ_OK;
}

/* ---- quantize at load ------------------------------------------------------------ */

static dsq_status check_quant_args(const void *w, dsq_dtype dt, int64_t K, int64_t n0, int64_t n1,
                                   const void *a, const void *b)
{
    if (!w || !a || !b)
        return dsq_fail(DSQ_ERR_INVALID_ARG, "quantize: NULL array");
    if (dt != DSQ_DT_BF16 && dt != DSQ_DT_F16 && dt != DSQ_DT_F32)
        return dsq_fail(DSQ_ERR_DTYPE, "quantize: weights are %s; need BF16, F16 or F32",
                        dsq_dtype_name(dt));
    if (K < 1 || n0 < 0 || n1 < n0)
        return dsq_fail(DSQ_ERR_INVALID_ARG, "quantize: rows [%lld, %lld) of K = %lld",
                        (long long)n0, (long long)n1, (long long)K);
    return DSQ_OK;
}

dsq_status dsq_q8_quantize_rows(const void *w, dsq_dtype dt, int64_t K, int64_t n0, int64_t n1,
                                int8_t *q, float *scales)
{
    dsq_status st = check_quant_args(w, dt, K, n0, n1, q, scales);
    if (st != DSQ_OK)
        return st;
    for (int64_t n = n0; n < n1; n++) {
        int8_t *qr = q + n * K;
        /* two passes over the row (amax, then codes) through a small stack
         * buffer, so no scratch is needed */
        float amax = 0.0f;
        int finite = 1;
        float buf[256];
        for (int64_t k0 = 0; k0 < K; k0 += 256) {
            int64_t m = K - k0 < 256 ? K - k0 : 256;
            const char *src = (const char *)w + ((size_t)n * (size_t)K + (size_t)k0) * dsq_dtype_size(dt);
            dsq_cpu_row_to_f32(buf, src, dt, m);
            for (int64_t k = 0; k < m; k++) {
                finite &= isfinite(buf[k]) != 0;
                amax = fabsf(buf[k]) > amax ? fabsf(buf[k]) : amax;
            }
        }
        if (!finite)
            return dsq_fail(DSQ_ERR_FORMAT, "quantize: row %lld holds NaN or Inf", (long long)n);
        float s = amax / 127.0f;
        scales[n] = s;
        for (int64_t k0 = 0; k0 < K; k0 += 256) {
            int64_t m = K - k0 < 256 ? K - k0 : 256;
            const char *src = (const char *)w + ((size_t)n * (size_t)K + (size_t)k0) * dsq_dtype_size(dt);
            dsq_cpu_row_to_f32(buf, src, dt, m);
            for (int64_t k = 0; k < m; k++) {
                float r = s > 0.0f ? rintf(buf[k] / s) : 0.0f;
                r = r > 127.0f ? 127.0f : r < -127.0f ? -127.0f : r;
                qr[k0 + k] = (int8_t)r;
            }
        }
    }
    return DSQ_OK;
}

/* f16 bits of the scale for a group range: nearest, raised one step if it
 * came out below `sf` (positive, finite).  0xffff when out of f16 range. */
static uint16_t q4_scale_bits(float sf)
{
    uint16_t h = dsq_f32_to_f16(sf);
    if (dsq_f16_to_f32(h) < sf)
        h++; /* positive halves: the next bit pattern is the next value up */
    if ((h & 0x7c00u) == 0x7c00u)
        return 0xffffu;
    return h;
}

dsq_status dsq_q4_quantize_rows(const void *w, dsq_dtype dt, int64_t K, int64_t n0, int64_t n1,
                                uint8_t *q, uint16_t *q_scales, uint8_t *q_zeros)
{
    dsq_status st = check_quant_args(w, dt, K, n0, n1, q, q_scales);
    if (st != DSQ_OK)
        return st;
    if (!q_zeros)
        return dsq_fail(DSQ_ERR_INVALID_ARG, "quantize: NULL array");
    const int64_t ldq = dsq_q4_ldq(K), G = dsq_q4_groups(K);
    float buf[DSQ_Q4_GROUP];
    for (int64_t n = n0; n < n1; n++) {
        uint8_t *qr = q + n * ldq;
        memset(qr, 0, (size_t)ldq);
        for (int64_t g = 0; g < G; g++) {
            int64_t k0 = g * DSQ_Q4_GROUP;
            int64_t m = K - k0 < DSQ_Q4_GROUP ? K - k0 : DSQ_Q4_GROUP;
            const char *src = (const char *)w + ((size_t)n * (size_t)K + (size_t)k0) * dsq_dtype_size(dt);
            dsq_cpu_row_to_f32(buf, src, dt, m);
            float lo = 0.0f, hi = 0.0f;
            int finite = 1;
            for (int64_t k = 0; k < m; k++) {
                finite &= isfinite(buf[k]) != 0;
                lo = buf[k] < lo ? buf[k] : lo;
                hi = buf[k] > hi ? buf[k] : hi;
            }
            if (!finite)
                return dsq_fail(DSQ_ERR_FORMAT, "quantize: row %lld holds NaN or Inf", (long long)n);
            float sf = (hi - lo) / 15.0f;
            uint16_t sh = sf > 0.0f ? q4_scale_bits(sf) : 0;
            if (sh == 0xffffu || !isfinite(sf))
                return dsq_fail(DSQ_ERR_FORMAT,
                                "quantize: row %lld, group %lld spans [%g, %g]: its 4-bit scale "
                                "is beyond the f16 range",
                                (long long)n, (long long)g, (double)lo, (double)hi);
            float s = dsq_f16_to_f32(sh);
            uint8_t z = 0;
            if (s > 0.0f) {
                float zf = rintf(-lo / s);
                z = (uint8_t)(zf > 15.0f ? 15.0f : zf < 0.0f ? 0.0f : zf);
                for (int64_t k = 0; k < m; k++) {
                    float c = rintf(buf[k] / s) + (float)z;
                    c = c > 15.0f ? 15.0f : c < 0.0f ? 0.0f : c;
                    put_code(q, ldq, n, k0 + k, (uint32_t)c);
                }
            } else {
                sh = 0; /* all codes 0, zero 0: the group reads back as zeros */
            }
            q_scales[n * G + g] = sh;
            q_zeros[n * G + g] = z;
        }
    }
    return DSQ_OK;
}

/* ---- dequantize ------------------------------------------------------------------ */

static inline void q8_row(const dsq_q8_mat *W, int64_t n, float *dst)
{
    const int8_t *qr = W->q + n * W->cols;
    const float s = W->scales[n];
    for (int64_t k = 0; k < W->cols; k++)
        dst[k] = (float)qr[k] * s;
}

/* One Q4 row: 8 codes (one uint32) per step, (code - zero) as an exact
 * integer, converted, times the group's scale. */
static inline void q4_row(const dsq_q4_mat *W, int64_t n, float *dst)
{
    const int64_t K = W->cols, ldq = dsq_q4_ldq(K), G = dsq_q4_groups(K);
    const uint8_t *qr = W->q + n * ldq;
    const v8u shifts = {0, 4, 8, 12, 16, 20, 24, 28};
    for (int64_t g = 0; g < G; g++) {
        const v8i zero = (v8i){0} + (int32_t)W->zeros[n * G + g];
        const float s = dsq_f16_to_f32(W->scales[n * G + g]);
        int64_t k0 = g * DSQ_Q4_GROUP;
        int64_t k1 = k0 + DSQ_Q4_GROUP < K ? k0 + DSQ_Q4_GROUP : K;
        for (int64_t k = k0; k < k1; k += 8) {
            uint32_t word;
            memcpy(&word, qr + k / 2, 4); /* within ldq: rows are padded to 32 codes */
            v8u codes = (((v8u){0} + word) >> shifts) & 15u;
            v8f f = __builtin_convertvector((v8i)codes - zero, v8f) * s;
            if (k + 8 <= k1)
                memcpy(dst + k, &f, sizeof f);
            else
                memcpy(dst + k, &f, (size_t)(k1 - k) * sizeof(float));
        }
    }
}

void dsq_q8_dequant_rows(const dsq_q8_mat *W, int64_t n0, int64_t n1, float *dst)
{
    for (int64_t n = n0; n < n1; n++)
        q8_row(W, n, dst + (n - n0) * W->cols);
}

DSQ_CLONES void dsq_q4_dequant_rows(const dsq_q4_mat *W, int64_t n0, int64_t n1, float *dst)
{
    for (int64_t n = n0; n < n1; n++)
        q4_row(W, n, dst + (n - n0) * W->cols);
}

/* ---- products ---------------------------------------------------------------------- */

/* One token (decode): the weights are dequantized straight into the
 * dense kernel's "pair-split" order (see cpu_ops.c): per 16-chunk, the 8
 * even-k weights and the 8 odd-k weights, each an 8-lane vector, added as
 * acc += x_even * w_even; acc += x_odd * w_odd; then the pairwise lane sum
 * and the K % 16 tail in order -- the operations of dsq_cpu_dot on the same
 * fp32 weights, so the result is bit for bit the block path's.  The split
 * costs nothing: a Q4 byte holds k = 2b in its low nibble and 2b+1 in its
 * high one, a pair of Q8 bytes is one int16 (low byte even k). */


#define QINLINE static inline __attribute__((always_inline))

QINLINE v8f ld8f(const float *p)
{
    v8f v;
    memcpy(&v, p, sizeof v);
    return v;
}

QINLINE void x_split(const float *p, v8f *even, v8f *odd)
{
    v8f a = ld8f(p), b = ld8f(p + 8);
    *even = __builtin_shufflevector(a, b, 0, 2, 4, 6, 8, 10, 12, 14);
    *odd = __builtin_shufflevector(a, b, 1, 3, 5, 7, 9, 11, 13, 15);
}

QINLINE float hsum8(v8f v)
{
    return ((v[0] + v[1]) + (v[2] + v[3])) + ((v[4] + v[5]) + (v[6] + v[7]));
}

/* 16 codes of a Q4 row (8 bytes) -> even-k and odd-k weights: byte j of
 * the two little-endian words is code 2j (low nibble) and 2j+1 (high). */
QINLINE void q4_split16(const uint8_t *p, v8i zero, float s, v8f *we, v8f *wo)
{
    uint32_t w0, w1;
    memcpy(&w0, p, 4);
    memcpy(&w1, p + 4, 4);
    const v8u words = {w0, w0, w0, w0, w1, w1, w1, w1};
    const v8u sh = {0, 8, 16, 24, 0, 8, 16, 24};
    *we = __builtin_convertvector((v8i)((words >> sh) & 15u) - zero, v8f) * s;
    *wo = __builtin_convertvector((v8i)((words >> (sh + 4u)) & 15u) - zero, v8f) * s;
}

typedef int16_t v8s __attribute__((vector_size(16)));

/* 16 int8 codes -> even-k and odd-k weights: read as 8 int16 pairs, the low
 * byte (sign-extended) is the even code, the high byte the odd one. */
QINLINE void q8_split16(const int8_t *p, float s, v8f *we, v8f *wo)
{
    v8s pairs;
    memcpy(&pairs, p, sizeof pairs);
    v8i v = __builtin_convertvector(pairs, v8i);
    *we = __builtin_convertvector((v8i)((v8u)v << 24) >> 24, v8f) * s; /* no signed left shift */
    *wo = __builtin_convertvector(v >> 8, v8f) * s;
}

QINLINE void store_out(float *y, float v, const dsq_tensor *bias, int64_t o, int accumulate)
{
    v = v + (bias ? dsq_tensor_get(bias, o) : 0.0f);
    *y = accumulate ? *y + v : v;
}

/* out[r] = dot(x, W'[n_r]) for 4 Q4 rows. */
QINLINE void q4_tile_1x4(const float *x, const dsq_q4_mat *W, const int64_t n[4], float out[4])
{
    const int64_t K = W->cols, ldq = dsq_q4_ldq(K), G = dsq_q4_groups(K);
    const int64_t K16 = K & ~(int64_t)15;
    v8f a[4] = {{0}};
    for (int64_t g = 0; g * DSQ_Q4_GROUP < K16; g++) {
        v8i zero[4];
        float s[4];
        const uint8_t *qr[4];
        for (int r = 0; r < 4; r++) {
            zero[r] = (v8i){0} + (int32_t)W->zeros[n[r] * G + g];
            s[r] = dsq_f16_to_f32(W->scales[n[r] * G + g]);
            qr[r] = W->q + n[r] * ldq;
        }
        int64_t k1 = (g + 1) * DSQ_Q4_GROUP < K16 ? (g + 1) * DSQ_Q4_GROUP : K16;
        for (int64_t k = g * DSQ_Q4_GROUP; k < k1; k += 16) {
            v8f xe, xo;
            x_split(x + k, &xe, &xo);
            for (int r = 0; r < 4; r++) {
                v8f we, wo;
                q4_split16(qr[r] + k / 2, zero[r], s[r], &we, &wo);
                a[r] += xe * we;
                a[r] += xo * wo;
            }
        }
    }
    for (int r = 0; r < 4; r++) {
        out[r] = hsum8(a[r]);
        for (int64_t k = K16; k < K; k++) {
            const int64_t gi = n[r] * G + k / DSQ_Q4_GROUP;
            int code = (W->q[n[r] * ldq + k / 2] >> (4 * (k & 1))) & 15;
            float w = (float)(code - (int)W->zeros[gi]) * dsq_f16_to_f32(W->scales[gi]);
            out[r] += x[k] * w;
        }
    }
}

QINLINE void q8_tile_1x4(const float *x, const dsq_q8_mat *W, const int64_t n[4], float out[4])
{
    const int64_t K = W->cols, K16 = K & ~(int64_t)15;
    v8f a[4] = {{0}};
    const int8_t *qr[4];
    float s[4];
    for (int r = 0; r < 4; r++) {
        qr[r] = W->q + n[r] * K;
        s[r] = W->scales[n[r]];
    }
    for (int64_t k = 0; k < K16; k += 16) {
        v8f xe, xo;
        x_split(x + k, &xe, &xo);
        for (int r = 0; r < 4; r++) {
            v8f we, wo;
            q8_split16(qr[r] + k, s[r], &we, &wo);
            a[r] += xe * we;
            a[r] += xo * wo;
        }
    }
    for (int r = 0; r < 4; r++) {
        out[r] = hsum8(a[r]);
        for (int64_t k = K16; k < K; k++)
            out[r] += x[k] * ((float)qr[r][k] * s[r]);
    }
}

/* Rows [o0, o1) for one token, 4 at a time (an edge block repeats its last
 * row and drops the extra results). */
#define ONE_TOKEN(TILE, W)                                                          \
    for (int64_t o = o0; o < o1; o += 4) {                                          \
        int nr = o1 - o < 4 ? (int)(o1 - o) : 4;                                    \
        int64_t n[4];                                                               \
        for (int r = 0; r < 4; r++)                                                 \
            n[r] = o + (r < nr ? r : nr - 1);                                       \
        float out[4];                                                               \
        TILE(X, W, n, out);                                                         \
        for (int r = 0; r < nr; r++)                                                \
            store_out(Y + o + r, out[r], bias, o + r, accumulate);                  \
    }

size_t dsq_quant_scratch_floats(int64_t K)
{
    return (size_t)DSQ_QUANT_ROWS * (size_t)K; /* DSQ_QUANT_ROWS dequantized rows */
}

/* ---- several tokens -------------------------------------------------------------
 * A block of DSQ_QUANT_ROWS rows is dequantized into scratch in the dense
 * kernel's split layout (per 16-chunk: the 8 even-k weights, then the 8
 * odd-k ones; the K % 16 tail in order) and tiles of 2 tokens x 4 rows run
 * on it with exactly the operations of cpu_ops.c's tile_2x4 / tile_1x4, so
 * every output is bit for bit dsq_cpu_dot(x, W'[o], K).  Tokens are taken
 * in blocks whose activations fit in about half of a 1 MiB L2, as the dense
 * kernel does; a row block is dequantized once per token block. */

/* In place: natural order -> split layout. */
QINLINE void split_row(float *w, int64_t K)
{
    for (int64_t k = 0; k + 16 <= K; k += 16) {
        v8f e, o;
        x_split(w + k, &e, &o);
        memcpy(w + k, &e, sizeof e);
        memcpy(w + k + 8, &o, sizeof o);
    }
}

/* out[t][r] = dot(x_t, w_r) for 2 tokens x 4 split rows. */
QINLINE void qtile_2x4(const float *x0, const float *x1, const float *const w[4], int64_t K,
                       float out[2][4])
{
    v8f a[2][4] = {{{0}}};
    const int64_t K16 = K & ~(int64_t)15;
    for (int64_t k = 0; k < K16; k += 16) {
        v8f xe0, xo0, xe1, xo1;
        x_split(x0 + k, &xe0, &xo0);
        x_split(x1 + k, &xe1, &xo1);
        for (int r = 0; r < 4; r++) {
            v8f we = ld8f(w[r] + k), wo = ld8f(w[r] + k + 8);
            a[0][r] += xe0 * we;
            a[0][r] += xo0 * wo;
            a[1][r] += xe1 * we;
            a[1][r] += xo1 * wo;
        }
    }
    for (int r = 0; r < 4; r++) {
        out[0][r] = hsum8(a[0][r]);
        out[1][r] = hsum8(a[1][r]);
    }
    for (int64_t k = K16; k < K; k++)
        for (int r = 0; r < 4; r++) {
            out[0][r] += x0[k] * w[r][k];
            out[1][r] += x1[k] * w[r][k];
        }
}

QINLINE void qtile_1x4(const float *x0, const float *const w[4], int64_t K, float out[4])
{
    v8f a[4] = {{0}};
    const int64_t K16 = K & ~(int64_t)15;
    for (int64_t k = 0; k < K16; k += 16) {
        v8f xe, xo;
        x_split(x0 + k, &xe, &xo);
        for (int r = 0; r < 4; r++) {
            a[r] += xe * ld8f(w[r] + k);
            a[r] += xo * ld8f(w[r] + k + 8);
        }
    }
    for (int r = 0; r < 4; r++)
        out[r] = hsum8(a[r]);
    for (int64_t k = K16; k < K; k++)
        for (int r = 0; r < 4; r++)
            out[r] += x0[k] * w[r][k];
}

/* Tokens [t0, t1) on the nb split rows in deq, outputs o .. o+nb-1. */
QINLINE void rows_block(float *Y, int64_t ldy, const float *X, int64_t ldx, int64_t t0, int64_t t1,
                        const float *deq, int64_t nb, int64_t K, const dsq_tensor *bias, int64_t o,
                        int accumulate)
{
    for (int64_t r0 = 0; r0 < nb; r0 += 4) {
        int nr = nb - r0 < 4 ? (int)(nb - r0) : 4;
        const float *w[4];
        for (int r = 0; r < 4; r++) /* edge: repeat the last row, drop its results */
            w[r] = deq + (r0 + (r < nr ? r : nr - 1)) * K;
        int64_t t = t0;
        for (; t + 1 < t1; t += 2) {
            float out[2][4];
            qtile_2x4(X + t * ldx, X + (t + 1) * ldx, w, K, out);
            for (int r = 0; r < nr; r++) {
                store_out(Y + t * ldy + o + r0 + r, out[0][r], bias, o + r0 + r, accumulate);
                store_out(Y + (t + 1) * ldy + o + r0 + r, out[1][r], bias, o + r0 + r, accumulate);
            }
        }
        if (t < t1) {
            float out[4];
            qtile_1x4(X + t * ldx, w, K, out);
            for (int r = 0; r < nr; r++)
                store_out(Y + t * ldy + o + r0 + r, out[r], bias, o + r0 + r, accumulate);
        }
    }
}

/* The several-token product: ROW(W, n, dst) dequantizes row n. */
#define MANY_TOKENS(ROW, W)                                                           \
    do {                                                                              \
        const int64_t K = (W)->cols;                                                  \
        int64_t tblk = (int64_t)(512 * 1024) / (K * (int64_t)sizeof(float));          \
        tblk = tblk < 2 ? 2 : tblk & ~(int64_t)1;                                     \
        for (int64_t t0 = 0; t0 < T; t0 += tblk) {                                    \
            int64_t t1 = T - t0 < tblk ? T : t0 + tblk;                               \
            for (int64_t o = o0; o < o1; o += DSQ_QUANT_ROWS) {                       \
                int64_t nb = o1 - o < DSQ_QUANT_ROWS ? o1 - o : DSQ_QUANT_ROWS;       \
                for (int64_t r = 0; r < nb; r++) {                                    \
                    ROW(W, o + r, scratch + r * K);                                   \
                    split_row(scratch + r * K, K);                                    \
                }                                                                     \
                rows_block(Y, ldy, X, ldx, t0, t1, scratch, nb, K, bias, o, accumulate); \
            }                                                                         \
        }                                                                             \
    } while (0)

DSQ_CLONES void dsq_q8_matmul_rows(float *Y, int64_t ldy, const float *X, int64_t ldx, int32_t T,
                                   const dsq_q8_mat *W, const dsq_tensor *bias, int64_t o0,
                                   int64_t o1, int accumulate, float *scratch)
{
    if (T == 1) {
        ONE_TOKEN(q8_tile_1x4, W)
        return;
    }
    MANY_TOKENS(q8_row, W);
}

DSQ_CLONES void dsq_q4_matmul_rows(float *Y, int64_t ldy, const float *X, int64_t ldx, int32_t T,
                                   const dsq_q4_mat *W, const dsq_tensor *bias, int64_t o0,
                                   int64_t o1, int accumulate, float *scratch)
{
    if (T == 1) {
        ONE_TOKEN(q4_tile_1x4, W)
        return;
    }
    MANY_TOKENS(q4_row, W);
}
