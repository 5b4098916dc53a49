/* gemv_mma_q4.cu - y = epilogue(x W^T) for 1..8 rows of x with Q4_G128
 * weights (gemv_quant.h's layout) on the tensor cores, one block per 16-row
 * tile of W and no split of K over blocks.
 *
 * Why: at one row the 4-bit gate/up ran on gemm_rows.cu at 2 K-splits (11.7
 * us on an H100 for 14 MB of codes, 1.2 TB/s; docs/performance.md, stop
 * 39): its blocks walk K in stages with two barriers and an x copy each,
 * and the splits meet in a workspace fix-up.  Here every warp asks for all
 * its codes at once, before the PDL wait, reads x straight from global
 * memory (L1/L2: a few KB shared by every block) and the warps of a tile
 * meet once, in shared memory: the shape of gemv_mma.cu's bf16 GEMV, with
 * the codes converted in registers as gemm_rows.cu does.
 *
 * Layout.  A block of NW warps owns rows n0 .. n0 + 15 (then n0 + 16 x
 * the grid, where the tiles outnumber the resident blocks); K is walked in
 * groups of 128 (one scale and zero point per row), group c to warp
 * c % NW, U groups per warp in flight.  Lane (g = lane / 4, q = lane % 4)
 * loads the 16 bytes of codes k = 128c + 32q .. + 31 of rows g and g + 8
 * and the two rows' scale and zero, and x row (token) g at the same k
 * (tokens g >= T are zeros).  Inside an MMA the k order is free: word wi of
 * the lane's 16 bytes holds codes 8wi .. 8wi + 7; its four bf16 pairs
 * (128 + code - (128 + zero), exact: zero points 0..16) are the A
 * fragments of two m16n8k16 MMAs whose B fragments are the lane's x at the
 * same 8 k (one 16-byte load).  A group's MMAs accumulate apart and are
 * added to the result times the group's scale, as in gemm_rows.cu.
 *
 * Numerics: fp32 accumulation of exact products x * (code - zero); the only
 * difference from the CPU product (lib/quant_cpu_matmul.c) is the order and
 * grouping of the fp32 additions (tests/test_cuda_quant.cu). */
#include <cuda_fp16.h>
#include <stdlib.h>

#include "common.cuh"
#include "gemv_mma_tile.cuh"
#include "gemv_quant.h"
#include "quant_decode.cuh"

namespace {

constexpr int kMaxWarps = 8;

struct Q4MmaArgs {
    const uint16_t *x;      /* bf16 [T][K] */
    const uint8_t *q;       /* codes [N][K/2] */
    const uint16_t *scales; /* f16 bits [N][G], G = K / 128 */
    const uint8_t *zeros;   /* [N][G] */
    const float *bias;
    int T, N, K, G;
    void *y;
};

/* One group of this lane's two rows (g, g + 8): 32 codes each, the scales
 * (f16 bits, row g low) and zero points (row g low). */
struct Q4Group {
    uint4 a, b;
    uint32_t sz, zz;
};

template <int U>
__device__ __forceinline__ void load_groups(Q4Group (&w)[U], const Q4MmaArgs &a, int n0, int c0, int NW)
{
    const int lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
    const int na = min(n0 + g, a.N - 1), nb = min(n0 + g + 8, a.N - 1);
    const uint4 *ra = reinterpret_cast<const uint4 *>(a.q + (size_t)na * (a.K / 2)) + q;
    const uint4 *rb = reinterpret_cast<const uint4 *>(a.q + (size_t)nb * (a.K / 2)) + q;
#pragma unroll
    for (int u = 0; u < U; u++) {
        const int c = c0 + u * NW;
        if (c < a.G) {
            w[u].a = __ldcs(ra + 4 * c);
            w[u].b = __ldcs(rb + 4 * c);
            w[u].sz = (uint32_t)__ldg(a.scales + (size_t)na * a.G + c) |
                      (uint32_t)__ldg(a.scales + (size_t)nb * a.G + c) << 16;
            w[u].zz = (uint32_t)__ldg(a.zeros + (size_t)na * a.G + c) |
                      (uint32_t)__ldg(a.zeros + (size_t)nb * a.G + c) << 16;
        }
    }
}

/* word i (0..3) of a 16-byte piece */
__device__ __forceinline__ uint32_t word_of(const uint4 &v, int i)
{
    return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

/* acc += the group's scale times x . (code - zero) over group c of this
 * lane's two rows (w), for the lane's token row (xrow; NULL: zeros) */
__device__ __forceinline__ void group_mma(const Q4Group &w, const uint4 *xrow, int c, float (&acc)[4])
{
    uint4 xv[4];
#pragma unroll
    for (int i = 0; i < 4; i++)
        xv[i] = xrow ? __ldg(xrow + 16 * c + i) : make_uint4(0, 0, 0, 0);
    const uint32_t zqa = dsq_qd_q4_zero_bf16x2(w.zz & 0xffffu), zqb = dsq_qd_q4_zero_bf16x2(w.zz >> 16);
    const __nv_bfloat162 za = *reinterpret_cast<const __nv_bfloat162 *>(&zqa);
    const __nv_bfloat162 zb = *reinterpret_cast<const __nv_bfloat162 *>(&zqb);
    float gs[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int wi = 0; wi < 4; wi++) {
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

template <int EPI, int U>
__global__ void __launch_bounds__(kMaxWarps * 32) gemv_mma_q4_kernel(Q4MmaArgs a)
{
    __shared__ float red[kMaxWarps * 16 * 8]; /* [warp][row 16][token 8] */
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, NW = blockDim.x >> 5;
    const int g = lane >> 2, q = lane & 3;
    const int ntiles = (a.N + 15) / 16;
    int tile = blockIdx.x;

    Q4Group w[U];
    load_groups<U>(w, a, tile * 16, warp, NW); /* before the wait: weights are constant */
    dsq_pdl_wait();
    dsq_pdl_trigger();
    /* this lane's token row (g < T) at its 32 k of a group */
    const uint4 *xrow = g < a.T ? reinterpret_cast<const uint4 *>(a.x + (size_t)g * a.K) + 4 * q : nullptr;

    for (;;) {
        float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        for (int c0 = warp;;) {
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int c = c0 + u * NW;
                if (c < a.G)
                    group_mma(w[u], xrow, c, acc);
            }
            c0 += U * NW;
            if (c0 >= a.G)
                break;
            load_groups<U>(w, a, tile * 16, c0, NW);
        }
        const int next = tile + gridDim.x; /* its first codes go out before this tile's epilogue */
        if (next < ntiles)
            load_groups<U>(w, a, next * 16, warp, NW);
        dsq_mma_tile_put(acc, red);
        __syncthreads();
        dsq_mma_tile_epilogue<EPI>(red, NW, tile * 16, a.T, a.N, a.bias, a.y);
        tile = next;
        if (tile >= ntiles)
            break;
        __syncthreads(); /* red is read above before the next tile writes it */
    }
}

/* groups per warp in flight: K = 1,536 (12 groups) in one round with 4
 * warps; 68 registers (80 with 4: 6 blocks of 4 warps per SM instead of 7) */
constexpr int kU = 3;

/* Warps per block: enough that each warp's groups go out in one round
 * (up to 8), at least 4. */
int default_warps(int G)
{
    int nw = (G + kU - 1) / kU;
    return nw < 4 ? 4 : nw > kMaxWarps ? kMaxWarps : nw;
}

/* Grid: one block per tile up to the resident blocks (gate/up's 1,120
 * tiles are more than one wave of 4-warp blocks); the blocks then walk
 * the tiles, each tile's first codes requested before the previous
 * tile's epilogue. */
template <int EPI> cudaError_t launch(const Q4MmaArgs &a, int nw, cudaStream_t s)
{
    static int64_t per_sm[kMaxWarps + 1];
    const unsigned tiles = (unsigned)((a.N + 15) / 16);
    const unsigned cap = dsq_cu_resident_blocks((const void *)gemv_mma_q4_kernel<EPI, kU>, nw * 32, 0, &per_sm[nw]);
    return dsq_launch_pdl(gemv_mma_q4_kernel<EPI, kU>, dim3(tiles < cap ? tiles : cap), dim3((unsigned)nw * 32), 0,
                          s, a);
}

} // namespace

extern "C" int dsq_cu_gemv_mma_q4_ok(int32_t T, int32_t K, const void *x, const uint8_t *q)
{
    return T >= 1 && T <= DSQ_GEMV_MAX_TOKENS && K > 0 && K % 128 == 0 && ((uintptr_t)x & 15) == 0 &&
           ((uintptr_t)q & 15) == 0;
}

/* DSQ_CUDA_Q4_MMA=n (read once): products of at most n rows and short
 * rows (K <= 4,096: qkv, o, gate/up; down's 96 tiles of K = 8,960 leave
 * too few loads in flight, as for gemv_mma.cu) take this kernel where
 * dsq_cu_gemv_mma_q4_use is asked (0 or unset: never). */
extern "C" int dsq_cu_gemv_mma_q4_use(int32_t T, int32_t N, int32_t K, const void *x, const uint8_t *q)
{
    static int rows = -1;
    int r = __atomic_load_n(&rows, __ATOMIC_RELAXED);
    if (r < 0) {
        const char *e = getenv("DSQ_CUDA_Q4_MMA");
        r = e && *e && atoi(e) > 0 ? atoi(e) : 0;
        __atomic_store_n(&rows, r, __ATOMIC_RELAXED);
    }
    (void)N;
    return T <= r && K <= 4096 && dsq_cu_gemv_mma_q4_ok(T, K, x, q);
}

extern "C" dsq_status dsq_cu_gemv_mma_q4(const dsq_bf16 *x, const uint8_t *q, const uint16_t *scales,
                                         const uint8_t *zeros, const float *bias, int32_t T, int32_t N, int32_t K,
                                         dsq_epilogue epi, void *y, int nt, cudaStream_t stream)
{
    if (!x || !q || !scales || !zeros || !y || N <= 0)
        return dsq_fail(DSQ_ERR_INTERNAL, "gemv mma q4: NULL operand or N %d", (int)N);
    if (!dsq_cu_gemv_mma_q4_ok(T, K, x, q))
        return dsq_fail(DSQ_ERR_INTERNAL, "gemv mma q4: T %d, K %d or alignment not supported", (int)T, (int)K);
    if (epi == DSQ_EPI_SILU_MUL && N % 2)
        return dsq_fail(DSQ_ERR_INTERNAL, "gemv mma q4: SwiGLU with odd N %d", (int)N);
    if (epi == DSQ_EPI_BIAS && !bias)
        return dsq_fail(DSQ_ERR_INTERNAL, "gemv mma q4: BIAS without a bias");
    if (nt != 0 && (nt % 32 || nt < 32 || nt > kMaxWarps * 32))
        return dsq_fail(DSQ_ERR_INTERNAL, "gemv mma q4: %d threads per block", nt);
    Q4MmaArgs a;
    a.x = (const uint16_t *)x, a.q = q, a.scales = scales, a.zeros = zeros, a.bias = bias;
    a.T = T, a.N = N, a.K = K, a.G = K / 128, a.y = y;
    const int nw = nt ? nt / 32 : default_warps(a.G);
    cudaError_t e;
    switch (epi) {
    case DSQ_EPI_STORE: e = launch<DSQ_EPI_STORE>(a, nw, stream); break;
    case DSQ_EPI_BIAS: e = launch<DSQ_EPI_BIAS>(a, nw, stream); break;
    case DSQ_EPI_ADD: e = launch<DSQ_EPI_ADD>(a, nw, stream); break;
    case DSQ_EPI_SILU_MUL: e = launch<DSQ_EPI_SILU_MUL>(a, nw, stream); break;
    default: return dsq_fail(DSQ_ERR_INTERNAL, "gemv mma q4: unknown epilogue %d", (int)epi);
    }
    return dsq_cu_status(e, "gemv mma q4 kernel");
}
