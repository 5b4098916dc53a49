/* quant_cpu_matmul.c - the CPU products of the Q8_ROW and Q4_G128 layouts
 * (quant_cpu.h states their contract; docs/quantization.md, "CPU products").
 *
 * Why this shape.  At one token the product streams the codes once and does
 * one multiply-add per weight, so the cost that decides the speed is the
 * instructions spent turning codes into fp32 weights.  A Q4 weight is
 * W' = (code - zero) * scale exactly (quant_cpu.h); the 16 values a group
 * can take are a 16-float table, and AVX-512's vpermps looks a whole vector
 * of codes up in it with one instruction -- no mask (vpermps reads only the
 * low 4 bits of each index), no convert, no subtract, no multiply.  Q8 costs
 * a sign extension and a convert, its row scale applied once per row.
 *
 * The numbers are defined by lanes, not by the instruction set.  Every
 * (token, row) output is 16 fp32 lanes accumulated with fused multiply-adds
 * in one fixed order, then summed in one fixed tree:
 *
 *   Q4: group g, slice i = 0..7, lane j = 0..15 takes k = 128 g + 8 j + i
 *       (the nibble i of little-endian dword j of the group's 64 bytes):
 *         acc[j] = fma(x[k], W'[k], acc[j])      for g ascending, i ascending
 *   Q8: chunk c, lane j = 0..15 takes k = 16 c + j:
 *         acc[j] = fma(x[k], (float)q[k], acc[j]) for c ascending
 *       and the lane sum is multiplied by the row scale.
 *   lane sum: a8[i] = acc[i] + acc[i+8]; a4[i] = a8[i] + a8[i+4];
 *             a2[i] = a4[i] + a4[i+2]; sum = a2[0] + a2[1]
 *   then + bias (and + y when accumulating).
 *
 * k past K reads x = 0 (the prepared activations are zero-padded) and a code
 * of 0 (the layouts pad rows with zero nibbles; a group cut by the row's end
 * is copied into a zeroed buffer), so a padded lane adds fma(0, w, acc) =
 * acc.  The AVX-512, AVX2 and portable kernels below all compute exactly
 * this, so an output is the same bits whatever the batch, the row range,
 * the thread, and which of the three the CPU runs; tests/test_quant_cpu.c
 * checks that, and the tolerance against a double reference.
 *
 * Activations are prepared once per call and token block: x is copied into
 * scratch in the lane order above (Q4: each group as 8 slices of 16; Q8:
 * natural order), zero-padded to a whole group, so the tiles read them with
 * plain aligned loads.  Tiles are 4 rows x up to 4 tokens (Q4) or 2 (Q8):
 * one decode of the codes serves every token of the tile. */
#include <math.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

#include "quant_cpu.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define DSQ_QX86 1
#include <immintrin.h>
#endif

#define TOK_BLOCK 16 /* tokens whose prepared activations sit in scratch at once */
#define XP_ALIGN 16  /* floats: scratch is re-aligned to 64 bytes */
#define MAXNT 4      /* tokens per tile: one decode of the codes serves them all */

static int64_t xp_stride(int64_t K) { return (K + DSQ_Q4_GROUP - 1) / DSQ_Q4_GROUP * DSQ_Q4_GROUP; }

size_t dsq_quant_scratch_floats(int64_t K)
{
    return (size_t)TOK_BLOCK * (size_t)xp_stride(K) + XP_ALIGN;
}

/* ---- activations in lane order -------------------------------------------------- */

static void prep_q4(float *xp, const float *x, int64_t K)
{
    const int64_t Kp = xp_stride(K);
    for (int64_t g = 0; g < Kp; g += DSQ_Q4_GROUP)
        for (int i = 0; i < 8; i++)
            for (int j = 0; j < 16; j++) {
                int64_t k = g + 8 * j + i;
                xp[g + 16 * i + j] = k < K ? x[k] : 0.0f;
            }
}

static void prep_q8(float *xp, const float *x, int64_t K)
{
    memcpy(xp, x, (size_t)K * sizeof(float));
    for (int64_t k = K; k < xp_stride(K); k++)
        xp[k] = 0.0f;
}

/* The group's 64 code bytes of a Q4 row: in place, or (a group cut by the
 * row's end) copied into buf with zero padding. */
static inline const uint8_t *q4_group_bytes(const uint8_t *row, int64_t ldq, int64_t g, uint8_t buf[64])
{
    if (64 * g + 64 <= ldq)
        return row + 64 * g;
    memset(buf, 0, 64);
    memcpy(buf, row + 64 * g, (size_t)(ldq - 64 * g));
    return buf;
}

/* The chunk's 16 code bytes of a Q8 row, likewise. */
static inline const int8_t *q8_chunk_bytes(const int8_t *row, int64_t K, int64_t c, int8_t buf[16])
{
    if (16 * c + 16 <= K)
        return row + 16 * c;
    memset(buf, 0, 16);
    memcpy(buf, row + 16 * c, (size_t)(K - 16 * c));
    return buf;
}

static inline float lane_sum(const float a[16])
{
    float a8[8], a4[4], a2[2];
    for (int i = 0; i < 8; i++)
        a8[i] = a[i] + a[i + 8];
    for (int i = 0; i < 4; i++)
        a4[i] = a8[i] + a8[i + 4];
    for (int i = 0; i < 2; i++)
        a2[i] = a4[i] + a4[i + 2];
    return a2[0] + a2[1];
}

/* Calls BODY with the tile's token count as a constant, so each copy of
 * the body keeps its accumulators in registers. */
#define BY_NT(BODY)                          \
    switch (tl->nt) {                        \
    case 4: BODY(W, tl, out, 4); break;      \
    case 3: BODY(W, tl, out, 3); break;      \
    case 2: BODY(W, tl, out, 2); break;      \
    default: BODY(W, tl, out, 1); break;     \
    }

/* One tile: out[t][r] = lane_sum of rows n[r] against prepared x[t]. */
typedef struct q_tile {
    const float *x[MAXNT]; /* prepared activations of the tile's tokens */
    int nt;                /* 1..MAXNT */
    int64_t n[4];      /* the 4 rows (an edge tile repeats its last) */
} q_tile;

/* ---- portable kernels (fmaf per lane) ------------------------------------------------
 * The fused multiply-add is what fixes the bits, so these call fmaf even
 * where the CPU has no FMA instruction: on an x86-64 without AVX2/FMA (the
 * only x86 CPUs that run this code) libm then emulates it, several times
 * slower than a multiply and an add.  Such CPUs predate 2013 (Haswell,
 * Piledriver); AArch64 and POWER have the instruction and the compiler
 * inlines it. */

static void q4_tile_portable(const dsq_q4_mat *W, const q_tile *tl, float out[MAXNT][4])
{
    const int64_t K = W->cols, ldq = dsq_q4_ldq(K), G = dsq_q4_groups(K);
    for (int r = 0; r < 4; r++) {
        const int64_t n = tl->n[r];
        float acc[MAXNT][16] = {{0}};
        for (int64_t g = 0; g < G; g++) {
            uint8_t buf[64];
            const uint8_t *b = q4_group_bytes(W->q + n * ldq, ldq, g, buf);
            const int z = W->zeros[n * G + g];
            const float s = dsq_f16_to_f32(W->scales[n * G + g]);
            uint32_t dw[16];
            for (int j = 0; j < 16; j++)
                dw[j] = (uint32_t)b[4 * j] | (uint32_t)b[4 * j + 1] << 8 | (uint32_t)b[4 * j + 2] << 16 |
                        (uint32_t)b[4 * j + 3] << 24;
            for (int i = 0; i < 8; i++)
                for (int j = 0; j < 16; j++) {
                    float w = (float)((int)((dw[j] >> (4 * i)) & 15u) - z) * s;
                    for (int t = 0; t < tl->nt; t++)
                        acc[t][j] = fmaf(tl->x[t][g * DSQ_Q4_GROUP + 16 * i + j], w, acc[t][j]);
                }
        }
        for (int t = 0; t < tl->nt; t++)
            out[t][r] = lane_sum(acc[t]);
    }
}

static void q8_tile_portable(const dsq_q8_mat *W, const q_tile *tl, float out[MAXNT][4])
{
    const int64_t K = W->cols, C = (K + 15) / 16;
    for (int r = 0; r < 4; r++) {
        const int64_t n = tl->n[r];
        float acc[MAXNT][16] = {{0}};
        for (int64_t c = 0; c < C; c++) {
            int8_t buf[16];
            const int8_t *b = q8_chunk_bytes(W->q + n * K, K, c, buf);
            for (int j = 0; j < 16; j++)
                for (int t = 0; t < tl->nt; t++)
                    acc[t][j] = fmaf(tl->x[t][16 * c + j], (float)b[j], acc[t][j]);
        }
        for (int t = 0; t < tl->nt; t++)
            out[t][r] = lane_sum(acc[t]) * W->scales[n];
    }
}

#ifdef DSQ_QX86
/* ---- AVX2 + FMA kernels: each 16-lane accumulator is two ymm halves ------------------- */

#define AVX2_FN __attribute__((target("avx2,fma,f16c")))
#define AVX2_INLINE static inline __attribute__((always_inline, target("avx2,fma,f16c")))

AVX2_INLINE float avx2_lane_sum(__m256 lo, __m256 hi)
{
    __m256 a8 = _mm256_add_ps(lo, hi);
    __m128 a4 = _mm_add_ps(_mm256_castps256_ps128(a8), _mm256_extractf128_ps(a8, 1));
    __m128 a2 = _mm_add_ps(a4, _mm_movehl_ps(a4, a4));
    return _mm_cvtss_f32(_mm_add_ss(a2, _mm_movehdup_ps(a2)));
}

AVX2_INLINE void q4_tile_avx2_body(const dsq_q4_mat *W, const q_tile *tl, float out[MAXNT][4], const int nt)
{
    const int64_t K = W->cols, ldq = dsq_q4_ldq(K), G = dsq_q4_groups(K);
    const __m256i m15 = _mm256_set1_epi32(15);
    for (int r = 0; r < 4; r++) {
        const int64_t n = tl->n[r];
        __m256 acc[MAXNT][2];
        for (int t = 0; t < MAXNT; t++)
            acc[t][0] = acc[t][1] = _mm256_setzero_ps();
        for (int64_t g = 0; g < G; g++) {
            uint8_t buf[64];
            const uint8_t *b = q4_group_bytes(W->q + n * ldq, ldq, g, buf);
            const __m256i z = _mm256_set1_epi32(W->zeros[n * G + g]);
            const __m256 s = _mm256_set1_ps(_cvtsh_ss(W->scales[n * G + g]));
            const float *xg[MAXNT];
            for (int t = 0; t < nt; t++)
                xg[t] = tl->x[t] + g * DSQ_Q4_GROUP;
            for (int h = 0; h < 2; h++) {
                const __m256i dw = _mm256_loadu_si256((const __m256i *)(b + 32 * h));
                for (int i = 0; i < 8; i++) {
                    __m256i c = _mm256_and_si256(_mm256_srli_epi32(dw, 4 * i), m15);
                    __m256 w = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(c, z)), s);
                    for (int t = 0; t < nt; t++)
                        acc[t][h] = _mm256_fmadd_ps(_mm256_load_ps(xg[t] + 16 * i + 8 * h), w, acc[t][h]);
                }
            }
        }
        for (int t = 0; t < nt; t++)
            out[t][r] = avx2_lane_sum(acc[t][0], acc[t][1]);
    }
}

AVX2_FN static void q4_tile_avx2(const dsq_q4_mat *W, const q_tile *tl, float out[MAXNT][4])
{
    BY_NT(q4_tile_avx2_body);
}

AVX2_INLINE void q8_tile_avx2_body(const dsq_q8_mat *W, const q_tile *tl, float out[MAXNT][4], const int nt)
{
    const int64_t K = W->cols, C = (K + 15) / 16;
    for (int r = 0; r < 4; r++) {
        const int64_t n = tl->n[r];
        __m256 acc[MAXNT][2];
        for (int t = 0; t < MAXNT; t++)
            acc[t][0] = acc[t][1] = _mm256_setzero_ps();
        for (int64_t c = 0; c < C; c++) {
            int8_t buf[16];
            const int8_t *b = q8_chunk_bytes(W->q + n * K, K, c, buf);
            for (int h = 0; h < 2; h++) {
                __m256 w = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(b + 8 * h))));
                for (int t = 0; t < nt; t++)
                    acc[t][h] = _mm256_fmadd_ps(_mm256_load_ps(tl->x[t] + 16 * c + 8 * h), w, acc[t][h]);
            }
        }
        for (int t = 0; t < nt; t++)
            out[t][r] = avx2_lane_sum(acc[t][0], acc[t][1]) * W->scales[n];
    }
}

AVX2_FN static void q8_tile_avx2(const dsq_q8_mat *W, const q_tile *tl, float out[MAXNT][4])
{
    BY_NT(q8_tile_avx2_body);
}

/* ---- AVX-512 kernels: one zmm per accumulator, four rows at once ---------------------- */

#define AVX512_FN __attribute__((target("avx512f,avx512dq,avx2,fma,f16c")))
#define AVX512_INLINE static inline __attribute__((always_inline, target("avx512f,avx512dq,avx2,fma,f16c")))

AVX512_INLINE float avx512_lane_sum(__m512 a)
{
    __m256 a8 = _mm256_add_ps(_mm512_castps512_ps256(a), _mm512_extractf32x8_ps(a, 1));
    __m128 a4 = _mm_add_ps(_mm256_castps256_ps128(a8), _mm256_extractf128_ps(a8, 1));
    __m128 a2 = _mm_add_ps(a4, _mm_movehl_ps(a4, a4));
    return _mm_cvtss_f32(_mm_add_ss(a2, _mm_movehdup_ps(a2)));
}

/* The table of a group: lut[c] = (float)(c - zero) * scale, c = 0..15. */
AVX512_INLINE __m512 q4_lut(const dsq_q4_mat *W, int64_t n, int64_t G, int64_t g)
{
    const __m512 iota = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    return _mm512_mul_ps(_mm512_sub_ps(iota, _mm512_set1_ps((float)W->zeros[n * G + g])),
                         _mm512_set1_ps(_cvtsh_ss(W->scales[n * G + g])));
}

AVX512_INLINE void q4_tile_avx512_body(const dsq_q4_mat *W, const q_tile *tl, float out[MAXNT][4], const int nt)
{
    const int64_t K = W->cols, ldq = dsq_q4_ldq(K), G = dsq_q4_groups(K);
    __m512 acc[MAXNT][4];
    for (int t = 0; t < MAXNT; t++)
        for (int r = 0; r < 4; r++)
            acc[t][r] = _mm512_setzero_ps();
    const uint8_t *row[4];
    for (int r = 0; r < 4; r++)
        row[r] = W->q + tl->n[r] * ldq;
    for (int64_t g = 0; g < G; g++) {
        __m512i dw[4];
        __m512 lut[4];
        uint8_t buf[4][64];
        for (int r = 0; r < 4; r++) {
            dw[r] = _mm512_loadu_si512(q4_group_bytes(row[r], ldq, g, buf[r]));
            lut[r] = q4_lut(W, tl->n[r], G, g);
        }
        const float *xg[MAXNT];
            for (int t = 0; t < nt; t++)
                xg[t] = tl->x[t] + g * DSQ_Q4_GROUP;
        for (int i = 0; i < 8; i++) {
            __m512 xv[MAXNT];
            for (int t = 0; t < nt; t++)
                xv[t] = _mm512_load_ps(xg[t] + 16 * i);
            for (int r = 0; r < 4; r++) {
                /* vpermps reads the low 4 bits of each index: the code */
                __m512 w = _mm512_permutexvar_ps(_mm512_srli_epi32(dw[r], 4 * i), lut[r]);
                for (int t = 0; t < nt; t++)
                    acc[t][r] = _mm512_fmadd_ps(xv[t], w, acc[t][r]);
            }
        }
    }
    for (int t = 0; t < nt; t++)
        for (int r = 0; r < 4; r++)
            out[t][r] = avx512_lane_sum(acc[t][r]);
}

AVX512_FN static void q4_tile_avx512(const dsq_q4_mat *W, const q_tile *tl, float out[MAXNT][4])
{
    BY_NT(q4_tile_avx512_body);
}

AVX512_INLINE void q8_tile_avx512_body(const dsq_q8_mat *W, const q_tile *tl, float out[MAXNT][4], const int nt)
{
    const int64_t K = W->cols, C = (K + 15) / 16;
    __m512 acc[MAXNT][4];
    for (int t = 0; t < MAXNT; t++)
        for (int r = 0; r < 4; r++)
            acc[t][r] = _mm512_setzero_ps();
    const int8_t *row[4];
    for (int r = 0; r < 4; r++)
        row[r] = W->q + tl->n[r] * K;
    for (int64_t c = 0; c < C; c++) {
        __m512 xv[MAXNT];
        for (int t = 0; t < nt; t++)
            xv[t] = _mm512_load_ps(tl->x[t] + 16 * c);
        for (int r = 0; r < 4; r++) {
            int8_t buf[16];
            const int8_t *b = q8_chunk_bytes(row[r], K, c, buf);
            __m512 w = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)b)));
            for (int t = 0; t < nt; t++)
                acc[t][r] = _mm512_fmadd_ps(xv[t], w, acc[t][r]);
        }
    }
    for (int t = 0; t < nt; t++)
        for (int r = 0; r < 4; r++)
            out[t][r] = avx512_lane_sum(acc[t][r]) * W->scales[tl->n[r]];
}

AVX512_FN static void q8_tile_avx512(const dsq_q8_mat *W, const q_tile *tl, float out[MAXNT][4])
{
    BY_NT(q8_tile_avx512_body);
}
#endif /* DSQ_QX86 */

/* ---- which kernels ------------------------------------------------------------------- */

typedef void (*q4_tile_fn)(const dsq_q4_mat *, const q_tile *, float[MAXNT][4]);
typedef void (*q8_tile_fn)(const dsq_q8_mat *, const q_tile *, float[MAXNT][4]);

static int g_forced_isa; /* tests: dsq_quant_cpu_force_isa */

#ifdef DSQ_QX86
/* F16C (the scales' conversion, exact like dsq_f16_to_f32): CPUID 1, ECX
 * bit 29 (__builtin_cpu_supports has no name for it in GCC 12). */
#include <cpuid.h>
static int has_f16c(void)
{
    unsigned a, b, c, d;
    return __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 29));
}
#endif

static int isa_supported(int isa)
{
    if (isa == DSQ_QISA_PORTABLE)
        return 1;
#ifdef DSQ_QX86
    if (isa == DSQ_QISA_AVX2)
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && has_f16c();
    if (isa == DSQ_QISA_AVX512)
        return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
               __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && has_f16c();
#endif
    return 0;
}

int dsq_quant_cpu_force_isa(int isa)
{
    if (isa != DSQ_QISA_AUTO && !isa_supported(isa))
        return 0;
    g_forced_isa = isa;
    return 1;
}

/* The CPU's best kernel, found once: CPUID traps to the hypervisor in a
 * virtual machine (tens of microseconds), too slow for every product.
 * Threads racing on the first call store the same value. */
static _Atomic int g_best_isa;

int dsq_quant_cpu_isa(void)
{
    if (g_forced_isa != DSQ_QISA_AUTO)
        return g_forced_isa;
    int isa = atomic_load_explicit(&g_best_isa, memory_order_relaxed);
    if (isa == DSQ_QISA_AUTO) {
        isa = isa_supported(DSQ_QISA_AVX512) ? DSQ_QISA_AVX512
              : isa_supported(DSQ_QISA_AVX2) ? DSQ_QISA_AVX2
                                             : DSQ_QISA_PORTABLE;
        atomic_store_explicit(&g_best_isa, isa, memory_order_relaxed);
    }
    return isa;
}

static inline void store_out(float *y, float v, const dsq_tensor *bias, int64_t o, int accumulate)
{
    v = v + (bias ? dsq_tensor_get(bias, o) : 0.0f);
    *y = accumulate ? *y + v : v;
}

/* Token blocks of prepared activations; in each, 4-row tiles over groups
 * of NT tokens (the last group smaller).  TILE(W, tl, out) is the kernel. */
#define RUN_PRODUCT(PREP, TILE, W, NT)                                                          \
    do {                                                                                    \
        const int64_t K = (W)->cols, xs = xp_stride(K);                                     \
        float *xp = (float *)(((uintptr_t)scratch + 63) & ~(uintptr_t)63);                  \
        for (int32_t t0 = 0; t0 < T; t0 += TOK_BLOCK) {                                     \
            const int32_t tb = T - t0 < TOK_BLOCK ? T - t0 : TOK_BLOCK;                     \
            for (int32_t t = 0; t < tb; t++)                                                \
                PREP(xp + t * xs, X + (int64_t)(t0 + t) * ldx, K);                          \
            for (int64_t o = o0; o < o1; o += 4) {                                          \
                const int nr = o1 - o < 4 ? (int)(o1 - o) : 4;                              \
                q_tile tl;                                                                  \
                for (int r = 0; r < 4; r++)                                                 \
                    tl.n[r] = o + (r < nr ? r : nr - 1);                                    \
                for (int32_t t = 0; t < tb; t += (NT)) {                                    \
                    tl.nt = tb - t >= (NT) ? (NT) : tb - t;                                 \
                    for (int u = 0; u < tl.nt; u++)                                         \
                        tl.x[u] = xp + (t + u) * xs;                                        \
                    float out[MAXNT][4];                                                        \
                    TILE(W, &tl, out);                                                      \
                    for (int u = 0; u < tl.nt; u++)                                         \
                        for (int r = 0; r < nr; r++)                                        \
                            store_out(Y + (int64_t)(t0 + t + u) * ldy + o + r, out[u][r],   \
                                      bias, o + r, accumulate);                             \
                }                                                                           \
            }                                                                               \
        }                                                                                   \
    } while (0)

void dsq_q4_matmul_rows(float *Y, int64_t ldy, const float *X, int64_t ldx, int32_t T,
                        const dsq_q4_mat *W, const dsq_tensor *bias, int64_t o0, int64_t o1,
                        int accumulate, float *scratch)
{
    q4_tile_fn tile = q4_tile_portable;
#ifdef DSQ_QX86
    const int isa = dsq_quant_cpu_isa();
    if (isa == DSQ_QISA_AVX512)
        tile = q4_tile_avx512;
    else if (isa == DSQ_QISA_AVX2)
        tile = q4_tile_avx2;
#endif
    RUN_PRODUCT(prep_q4, tile, W, 4);
}

void dsq_q8_matmul_rows(float *Y, int64_t ldy, const float *X, int64_t ldx, int32_t T,
                        const dsq_q8_mat *W, const dsq_tensor *bias, int64_t o0, int64_t o1,
                        int accumulate, float *scratch)
{
    q8_tile_fn tile = q8_tile_portable;
#ifdef DSQ_QX86
    const int isa = dsq_quant_cpu_isa();
    if (isa == DSQ_QISA_AVX512)
        tile = q8_tile_avx512;
    else if (isa == DSQ_QISA_AVX2)
        tile = q8_tile_avx2;
#endif
    RUN_PRODUCT(prep_q8, tile, W, 2); /* 4 measured slower: one decode is cheap */
}
