/* quant_cpu.c - see quant_cpu.h: repacking, quantize at load, dequantize
 * and the CPU products of the quantized layouts.
 *
 * The products are in quant_cpu_matmul.c.  The dequantization here is
 * branch-free 8-lane vector code (shifts, masks, converts), so it
 * vectorizes on any ISA. */
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
