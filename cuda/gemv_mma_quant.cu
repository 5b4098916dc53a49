/* gemv_mma_quant.cu - y = epilogue(x W^T) for 1..8 rows of x with Q4_G128
 * or Q8_ROW weights (gemv_quant.h's layouts) on the tensor cores, one block
 * per 16-row tile of W and no split of K over blocks.
 *
 * Why: at one row the 4-bit gate/up ran on gemm_rows.cu at 2 K-splits (11.7
 * us on an H100 for 14 MB of codes, 1.2 TB/s; docs/performance.md, stop
 * 39): its blocks walk K in stages with two barriers and an x copy each,
 * and the splits meet in a workspace fix-up; the INT8 one on gemv_quant.cu's
 * FMA GEMV (12.7 us for 27.5 MB, stop 43's profile).  Here every warp asks
 * for all its codes at once, before the PDL wait, reads x straight from
 * global memory (L1/L2: a few KB shared by every block; the norm variant
 * computes it into shared memory) and the warps of a
 * tile meet once, in shared memory: the shape of gemv_mma.cu's bf16 GEMV,
 * with the codes converted in registers as gemm_rows.cu does.
 *
 * Layout.  A block of NW warps owns rows n0 .. n0 + 15; K is walked in
 * units of 64 bytes of a row's codes (Q4: a group of 128 k, with its scale
 * and zero point; Q8: 64 k), unit c to warp c % NW, U units per warp in
 * flight.  Lane (g = lane / 4, q = lane % 4) loads bytes 64c + 16q .. + 15
 * of rows g and g + 8 (Q4: k = 128c + 32q .. + 31; Q8: k = 64c + 16q ..
 * + 15) and x row (token) g at the same k (tokens g >= T are zeros).
 * Inside an MMA the k order is free: every 8 codes of the lane's 16 bytes
 * (Q4: word wi; Q8: words 2ci, 2ci + 1) become four exact bf16 pairs, the
 * A fragments of two m16n8k16 MMAs whose B fragments are the lane's x at
 * the same 8 k (one 16-byte load).  Q4: code - zero as 128 + code minus
 * 128 + zero (zero points 0..16); a group's MMAs accumulate apart and are
 * added to the result times the group's scale, as in gemm_rows.cu.  Q8:
 * signed bytes by the 2^23 trick; the row scales multiply the row sums at
 * the end.
 *
 * Numerics: fp32 accumulation of exact products x * code; the only
 * difference from the CPU product (lib/quant_cpu_matmul.c) is the order and
 * grouping of the fp32 additions (tests/test_cuda_quant.cu). */
#include <cuda_fp16.h>
#include <stdlib.h>

#include "common.cuh"
#include "gemv_mma_tile.cuh"
#include "gemv_norm.cuh"
#include "gemv_quant.h"
#include "quant_decode.cuh"

namespace {

constexpr int kMaxWarps = 16;
enum { F_Q4 = 0, F_Q8 = 1 };

struct QMmaArgs {
    const uint16_t *x;      /* bf16 [T][K] */
    const uint8_t *q;       /* codes: Q4 [N][K/2] (two per byte, low nibble first), Q8 int8 [N][K] */
    const uint16_t *scales; /* Q4: f16 bits [N][K/128] */
    const uint8_t *zeros;   /* Q4: [N][K/128] */
    const float *rscales;   /* Q8: fp32 [N] */
    const float *bias;
    int T, N, K;
    int units; /* 64-byte units of a row's codes: Q4 K / 128 (= groups), Q8 K / 64 */
    void *y;
    /* NORM: x = rmsnorm(xr rows, nw, eps), computed by every block into
     * shared memory (bf16 [T][K + 32]) instead of read from x */
    const float *xr;      /* fp32 residual rows [*][K] */
    const int32_t *rows;  /* device [T] or NULL: rows 0..T-1 */
    const float *nw;      /* fp32 [K] */
    float eps;
};

/* One unit of this lane's two rows (g, g + 8): 16 bytes of codes each;
 * Q4: the group's scales (f16 bits, row g low) and zero points (row g low). */
struct QUnit {
    uint4 a, b;
    uint32_t sz, zz;
};

template <int F>
__device__ __forceinline__ size_t row_bytes(const QMmaArgs &a)
{
    return F == F_Q4 ? (size_t)a.K / 2 : (size_t)a.K;
}

/* units c0 + u * NW (u < U) of tile rows n0 .. n0 + 15 */
template <int F, int U>
__device__ __forceinline__ void load_units(QUnit (&w)[U], const QMmaArgs &a, int n0, int c0, int NW)
{
    const int lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
    const int na = min(n0 + g, a.N - 1), nb = min(n0 + g + 8, a.N - 1);
    const uint4 *ra = reinterpret_cast<const uint4 *>(a.q + (size_t)na * row_bytes<F>(a)) + q;
    const uint4 *rb = reinterpret_cast<const uint4 *>(a.q + (size_t)nb * row_bytes<F>(a)) + q;
#pragma unroll
    for (int u = 0; u < U; u++) {
        const int c = c0 + u * NW;
        if (c < a.units) {
            w[u].a = __ldcs(ra + 4 * c);
            w[u].b = __ldcs(rb + 4 * c);
            if (F == F_Q4) {
                w[u].sz = (uint32_t)__ldg(a.scales + (size_t)na * a.units + c) |
                          (uint32_t)__ldg(a.scales + (size_t)nb * a.units + c) << 16;
                w[u].zz = (uint32_t)__ldg(a.zeros + (size_t)na * a.units + c) |
                          (uint32_t)__ldg(a.zeros + (size_t)nb * a.units + c) << 16;
            }
        }
    }
}

/* word i (0..3) of a 16-byte piece */
__device__ __forceinline__ uint32_t word_of(const uint4 &v, int i)
{
    return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

/* The unit's products for the lane's token row (xrow: this lane's first
 * 16-byte piece of x in unit 0; NULL: zeros).  Q4: acc += the group's
 * scale times x . (code - zero); Q8: acc += x . code (row scales later). */
template <int F, bool XS>
__device__ __forceinline__ void unit_mma(const QUnit &w, const uint4 *xrow, int c, float (&acc)[4])
{
    constexpr int XP = F == F_Q4 ? 4 : 2; /* 16-byte pieces of x per lane per unit */
    uint4 xv[XP];
#pragma unroll
    for (int i = 0; i < XP; i++) /* XS: x in shared memory (the NORM variant) */
        xv[i] = xrow ? (XS ? xrow[4 * XP * c + i] : __ldg(xrow + 4 * XP * c + i)) : make_uint4(0, 0, 0, 0);
    if (F == F_Q8) {
#pragma unroll
        for (int ci = 0; ci < 2; ci++) { /* codes 8ci .. 8ci + 7: words 2ci, 2ci + 1 */
            const uint32_t la = word_of(w.a, 2 * ci), ha = word_of(w.a, 2 * ci + 1);
            const uint32_t lb = word_of(w.b, 2 * ci), hb = word_of(w.b, 2 * ci + 1);
            dsq_mma_bf16(acc, dsq_qd_s8_bf16x2(la, 0), dsq_qd_s8_bf16x2(lb, 0), dsq_qd_s8_bf16x2(la, 1),
                         dsq_qd_s8_bf16x2(lb, 1), xv[ci].x, xv[ci].y);
            dsq_mma_bf16(acc, dsq_qd_s8_bf16x2(ha, 0), dsq_qd_s8_bf16x2(hb, 0), dsq_qd_s8_bf16x2(ha, 1),
                         dsq_qd_s8_bf16x2(hb, 1), xv[ci].z, xv[ci].w);
        }
        return;
    }
    const uint32_t zqa = dsq_qd_q4_zero_bf16x2(w.zz & 0xffffu), zqb = dsq_qd_q4_zero_bf16x2(w.zz >> 16);
    const __nv_bfloat162 za = *reinterpret_cast<const __nv_bfloat162 *>(&zqa);
    const __nv_bfloat162 zb = *reinterpret_cast<const __nv_bfloat162 *>(&zqb);
    float gs[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int wi = 0; wi < 4; wi++) { /* codes 8wi .. 8wi + 7 */
        const uint32_t wa = word_of(w.a, wi), wb = word_of(w.b, wi);
        const uint32_t ua = wa >> 4, ub = wb >> 4;
        uint32_t pa[4], pb[4];
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const uint32_t ba = dsq_qd_q4_bf16x2(wa, ua, i), bb = dsq_qd_q4_bf16x2(wb, ub, i);
            const __nv_bfloat162 da = __hsub2(*reinterpret_cast<const __nv_bfloat162 *>(&ba), za);
            const __nv_bfloat162 db = __hsub2(*reinterpret_cast<const __nv_bfloat162 *>(&bb), zb);
            pa[i] = *reinterpret_cast<const uint32_t *>(&da);
            pb[i] = *reinterpret_cast<const uint32_t *>(&db);
        }
        dsq_mma_bf16(gs, pa[0], pb[0], pa[1], pb[1], xv[wi].x, xv[wi].y);
        dsq_mma_bf16(gs, pa[2], pb[2], pa[3], pb[3], xv[wi].z, xv[wi].w);
    }
    const float sa = __half2float(__ushort_as_half((unsigned short)(w.sz & 0xffffu)));
    const float sb = __half2float(__ushort_as_half((unsigned short)(w.sz >> 16)));
    acc[0] = fmaf(sa, gs[0], acc[0]);
    acc[1] = fmaf(sa, gs[1], acc[1]);
    acc[2] = fmaf(sb, gs[2], acc[2]);
    acc[3] = fmaf(sb, gs[3], acc[3]);
}

/* MW: the most warps the launch may have (8 or 16: the register bound and
 * the reduction's shared memory follow it, so 8-warp launches keep the
 * 256-thread bound and 4 KB) */
template <int F, int EPI, int U, int MW, bool NORM>
__global__ void __launch_bounds__(MW * 32) gemv_mma_quant_kernel(QMmaArgs a)
{
    __shared__ float red[MW * 16 * 8]; /* [warp][row 16][token 8] */
    extern __shared__ uint4 xs_dyn[];  /* NORM: bf16 [T][K + 32] */
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, NW = blockDim.x >> 5;
    const int g = lane >> 2, q = lane & 3;
    const int n0 = blockIdx.x * 16;

    QUnit w[U];
    load_units<F, U>(w, a, n0, warp, NW); /* before the wait: weights are constant */
    dsq_pdl_wait();
    dsq_pdl_trigger();
    /* this lane's token row (g < T) at its k of unit 0 (Q4: 32 k, Q8: 16) */
    const uint4 *xrow;
    if (NORM) { /* T <= NW: a warp per row (one round of loads); else block-wide rounds (red: 8 x NW floats) */
        uint16_t *xs = reinterpret_cast<uint16_t *>(xs_dyn);
        if (a.T <= NW)
            gemv_norm_rows_warp(a.xr, a.rows, a.nw, a.eps, a.T, a.K, xs, a.K + 32);
        else
            gemv_norm_rows<DSQ_GEMV_MAX_TOKENS>(a.xr, a.rows, a.nw, a.eps, a.T, a.K, xs, a.K + 32, red);
        xrow = g < a.T ? reinterpret_cast<const uint4 *>(xs + (size_t)g * (a.K + 32)) + (F == F_Q4 ? 4 : 2) * q
                       : nullptr;
    } else {
        xrow = g < a.T ? reinterpret_cast<const uint4 *>(a.x + (size_t)g * a.K) + (F == F_Q4 ? 4 : 2) * q : nullptr;
    }

    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int c0 = warp;;) {
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int c = c0 + u * NW;
            if (c < a.units)
                unit_mma<F, NORM>(w[u], xrow, c, acc);
        }
        c0 += U * NW;
        if (c0 >= a.units)
            break;
        load_units<F, U>(w, a, n0, c0, NW);
    }
    if (F == F_Q8) { /* the row scales (every warp's partial sum: a common factor) */
        const float sa = __ldg(a.rscales + min(n0 + g, a.N - 1));
        const float sb = __ldg(a.rscales + min(n0 + g + 8, a.N - 1));
        acc[0] *= sa, acc[1] *= sa, acc[2] *= sb, acc[3] *= sb;
    }
    dsq_mma_tile_put(acc, red);
    __syncthreads();
    dsq_mma_tile_epilogue<EPI>(red, NW, n0, a.T, a.N, a.bias, a.y);
}

/* units per warp in flight: K = 1,536's 24 Q8 units in one round with 8
 * warps (its 12 Q4 groups with 4); Q4 takes 64 registers (68 with SwiGLU:
 * 4 or 3 blocks of 8 warps per SM; 4 in flight took 80).  Rows of more
 * units than kU per warp (down: 70 Q4 groups, 140 Q8 units) keep kUBig in
 * flight: with 16 warps a 4-bit down row in one round. */
constexpr int kU = 3, kUBig = 5;

/* Warps per block.  H100, stop 44 (test_timing_q4_mma, us per call at 1 /
 * 8 rows):
 * - rows of more than 24 units (down: 70 Q4 groups, 140 Q8 units): 16
 *   warps with 5 units each in flight (3 where a row has at most 48), Q4
 *   5.7 / 6.2 against 7.7 / 8.2 with 8 warps (then 3 rounds of 3; now
 *   8-warp launches of such rows keep 5 in flight) and 6.9 / 12.3 on
 *   today's paths; Q8 8.0 / 8.5.  Measured for down's 96 tiles only: a
 *   16-warp block of 96 registers a thread leaves room for one per SM;
 * - else 8 (qkv, o, gate/up, the INT8 head; INT8 gate/up 11.7 / 11.9
 *   against 13.1 / 14.1 with 4).
 * - 4-bit products of 1,024+ tiles (gate/up's 1,120): 2 warps (5 units
 *   each in flight, two rounds): small blocks fit that grid in one wave of
 *   resident blocks.  Table (stop 44): 9.6 / 9.9 us against 10.3 / 11.5
 *   with 8; the 4-bit step (stop 45, H100, ms, two runs each, 8 warps /
 *   2): batch 8 1.272-1.274 / 1.230-1.236, batch 4 1.207-1.224 /
 *   1.181-1.183, batch 2 1.316-1.322 / 1.272-1.288, batch 1 1.212 / 1.213.
 * DSQ_CUDA_QMMA_WIDE_WARPS=n (measurement knob, per process): n warps for
 * those products instead. */
int wide_warps()
{
    static int w = -1;
    int r = __atomic_load_n(&w, __ATOMIC_RELAXED);
    if (r < 0) {
        const char *e = getenv("DSQ_CUDA_QMMA_WIDE_WARPS");
        r = e && atoi(e) >= 1 && atoi(e) <= kMaxWarps ? atoi(e) : 2;
        __atomic_store_n(&w, r, __ATOMIC_RELAXED);
    }
    return r;
}

template <int F> int default_warps(const QMmaArgs &a)
{
    if (a.units > 24)
        return kMaxWarps;
    if (F == F_Q4 && (a.N + 15) / 16 >= 1024)
        return wide_warps();
    return 8;
}

/* Grid: one block per tile, gate/up's 1,120 tiles too (more than one wave
 * of 4-warp blocks): for gemv_mma.cu's bf16 GEMV a grid of the resident
 * blocks walking the tiles, the next tile's weights requested before the
 * epilogue, measured slower (stop 42, H100: gate/up at 8 rows 24.9 vs 22.4
 * us, the head 179.7 vs 161.6) */
template <int F, int EPI> cudaError_t launch(const QMmaArgs &a, int nw, cudaStream_t s)
{
    const dim3 grid((unsigned)((a.N + 15) / 16)), block((unsigned)nw * 32);
    const bool big = a.units > kU * nw;
    if constexpr (EPI != DSQ_EPI_ADD) { /* NORM: at most 8 warps, never ADD (run() refuses it) */
        if (a.xr) {
            const size_t smem = (size_t)a.T * (a.K + 32) * 2;
            return big ? dsq_launch_pdl(gemv_mma_quant_kernel<F, EPI, kUBig, 8, true>, grid, block, smem, s, a)
                       : dsq_launch_pdl(gemv_mma_quant_kernel<F, EPI, kU, 8, true>, grid, block, smem, s, a);
        }
    }
    if (nw > 8)
        return big ? dsq_launch_pdl(gemv_mma_quant_kernel<F, EPI, kUBig, kMaxWarps, false>, grid, block, 0, s, a)
                   : dsq_launch_pdl(gemv_mma_quant_kernel<F, EPI, kU, kMaxWarps, false>, grid, block, 0, s, a);
    return big ? dsq_launch_pdl(gemv_mma_quant_kernel<F, EPI, kUBig, 8, false>, grid, block, 0, s, a)
               : dsq_launch_pdl(gemv_mma_quant_kernel<F, EPI, kU, 8, false>, grid, block, 0, s, a);
}

template <int F> dsq_status run(const QMmaArgs &a, dsq_epilogue epi, int nt, cudaStream_t stream)
{
    const char *name = a.xr ? (F == F_Q4 ? "gemv mma q4+norm" : "gemv mma q8+norm")
                            : (F == F_Q4 ? "gemv mma q4" : "gemv mma q8");
    if ((!a.x && !a.xr) || (a.xr && !a.nw) || !a.q || !a.y || a.N <= 0 || (F == F_Q4 ? !a.scales || !a.zeros : !a.rscales))
        return dsq_fail(DSQ_ERR_INTERNAL, "%s: NULL operand or N %d", name, a.N);
    if (epi == DSQ_EPI_SILU_MUL && a.N % 2)
        return dsq_fail(DSQ_ERR_INTERNAL, "%s: SwiGLU with odd N %d", name, a.N);
    if (epi == DSQ_EPI_BIAS && !a.bias)
        return dsq_fail(DSQ_ERR_INTERNAL, "%s: BIAS without a bias", name);
    if (nt != 0 && (nt % 32 || nt < 32 || nt > kMaxWarps * 32))
        return dsq_fail(DSQ_ERR_INTERNAL, "%s: %d threads per block", name, nt);
    int nw = nt ? nt / 32 : default_warps<F>(a);
    if (a.xr) {
        if (epi == DSQ_EPI_ADD) /* y += ... into the residual while other blocks still read it for the norm */
            return dsq_fail(DSQ_ERR_INTERNAL, "%s: the ADD epilogue is not supported", name);
        if (nt == 0 && nw > 8)
            nw = 8;
        if (nw > 8)
            return dsq_fail(DSQ_ERR_INTERNAL, "%s: %d threads per block (at most 256)", name, nt);
    }
    cudaError_t e;
    switch (epi) {
    case DSQ_EPI_STORE: e = launch<F, DSQ_EPI_STORE>(a, nw, stream); break;
    case DSQ_EPI_BIAS: e = launch<F, DSQ_EPI_BIAS>(a, nw, stream); break;
    case DSQ_EPI_ADD: e = launch<F, DSQ_EPI_ADD>(a, nw, stream); break;
    case DSQ_EPI_SILU_MUL: e = launch<F, DSQ_EPI_SILU_MUL>(a, nw, stream); break;
    default: return dsq_fail(DSQ_ERR_INTERNAL, "%s: unknown epilogue %d", name, (int)epi);
    }
    return dsq_cu_status(e, name);
}

int mma_q_ok(int32_t T, int32_t K, int32_t unit_k, const void *x, const void *q)
{
    return T >= 1 && T <= DSQ_GEMV_MAX_TOKENS && K > 0 && K % unit_k == 0 && ((uintptr_t)x & 15) == 0 &&
           ((uintptr_t)q & 15) == 0;
}

/* the norm variant's extra conditions: xr and nw 16-byte aligned, its
 * shared rows within DSQ_GEMV_NORM_MAX_SMEM (40 KB: with the 4 KB of the
 * static reduction buffer under the 48 KB a block gets without the opt-in
 * attribute) */
int mma_q_norm_ok(int32_t T, int32_t K, const float *xr, const float *nw)
{
    return xr && nw && ((uintptr_t)xr & 15) == 0 && ((uintptr_t)nw & 15) == 0 && K % 4 == 0 &&
           (size_t)T * (K + 32) * 2 <= DSQ_GEMV_NORM_MAX_SMEM;
}

} // namespace

extern "C" int dsq_cu_gemv_mma_q4_norm_ok(int32_t T, int32_t K, const float *xr, const float *nw, const uint8_t *q)
{
    return mma_q_ok(T, K, 128, xr, q) && mma_q_norm_ok(T, K, xr, nw);
}

extern "C" int dsq_cu_gemv_mma_q8_norm_ok(int32_t T, int32_t K, const float *xr, const float *nw, const int8_t *q)
{
    return mma_q_ok(T, K, 64, xr, q) && mma_q_norm_ok(T, K, xr, nw);
}

extern "C" dsq_status dsq_cu_gemv_mma_q4_norm(const float *xr, const int32_t *rows, const float *nw, float eps,
                                              const uint8_t *q, const uint16_t *scales, const uint8_t *zeros,
                                              const float *bias, int32_t T, int32_t N, int32_t K, dsq_epilogue epi,
                                              void *y, int nt, cudaStream_t stream)
{
    if (!dsq_cu_gemv_mma_q4_norm_ok(T, K, xr, nw, q))
        return dsq_fail(DSQ_ERR_INTERNAL, "gemv mma q4+norm: T %d, K %d or alignment not supported", (int)T, (int)K);
    QMmaArgs a = {};
    a.xr = xr, a.rows = rows, a.nw = nw, a.eps = eps;
    a.q = q, a.scales = scales, a.zeros = zeros, a.bias = bias;
    a.T = T, a.N = N, a.K = K, a.units = K / 128, a.y = y;
    return run<F_Q4>(a, epi, nt, stream);
}

extern "C" dsq_status dsq_cu_gemv_mma_q8_norm(const float *xr, const int32_t *rows, const float *nw, float eps,
                                              const int8_t *q, const float *scales, const float *bias, int32_t T,
                                              int32_t N, int32_t K, dsq_epilogue epi, void *y, int nt,
                                              cudaStream_t stream)
{
    if (!dsq_cu_gemv_mma_q8_norm_ok(T, K, xr, nw, q))
        return dsq_fail(DSQ_ERR_INTERNAL, "gemv mma q8+norm: T %d, K %d or alignment not supported", (int)T, (int)K);
    QMmaArgs a = {};
    a.xr = xr, a.rows = rows, a.nw = nw, a.eps = eps;
    a.q = (const uint8_t *)q, a.rscales = scales, a.bias = bias;
    a.T = T, a.N = N, a.K = K, a.units = K / 64, a.y = y;
    return run<F_Q8>(a, epi, nt, stream);
}

extern "C" int dsq_cu_gemv_mma_q4_ok(int32_t T, int32_t K, const void *x, const uint8_t *q)
{
    return mma_q_ok(T, K, 128, x, q);
}

extern "C" int dsq_cu_gemv_mma_q8_ok(int32_t T, int32_t K, const void *x, const int8_t *q)
{
    return mma_q_ok(T, K, 64, x, q);
}

extern "C" dsq_status dsq_cu_gemv_mma_q4(const dsq_bf16 *x, const uint8_t *q, const uint16_t *scales,
                                         const uint8_t *zeros, const float *bias, int32_t T, int32_t N, int32_t K,
                                         dsq_epilogue epi, void *y, int nt, cudaStream_t stream)
{
    if (!dsq_cu_gemv_mma_q4_ok(T, K, x, q))
        return dsq_fail(DSQ_ERR_INTERNAL, "gemv mma q4: T %d, K %d or alignment not supported", (int)T, (int)K);
    QMmaArgs a = {};
    a.x = (const uint16_t *)x, a.q = q, a.scales = scales, a.zeros = zeros, a.bias = bias;
    a.T = T, a.N = N, a.K = K, a.units = K / 128, a.y = y;
    return run<F_Q4>(a, epi, nt, stream);
}

extern "C" dsq_status dsq_cu_gemv_mma_q8(const dsq_bf16 *x, const int8_t *q, const float *scales, const float *bias,
                                         int32_t T, int32_t N, int32_t K, dsq_epilogue epi, void *y, int nt,
                                         cudaStream_t stream)
{
    if (!dsq_cu_gemv_mma_q8_ok(T, K, x, q))
        return dsq_fail(DSQ_ERR_INTERNAL, "gemv mma q8: T %d, K %d or alignment not supported", (int)T, (int)K);
    QMmaArgs a = {};
    a.x = (const uint16_t *)x, a.q = (const uint8_t *)q, a.rscales = scales, a.bias = bias;
    a.T = T, a.N = N, a.K = K, a.units = K / 64, a.y = y;
    return run<F_Q8>(a, epi, nt, stream);
}
