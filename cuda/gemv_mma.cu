/* gemv_mma.cu - y = epilogue(x W^T) for 2..8 rows of x on the tensor cores.
 *
 * Why: with 8 rows the FMA GEMV (gemv.cu) spends more issue slots on
 * unpacking bf16 and on fp32 FMAs (4 per weight byte) than the SM has per
 * byte of bandwidth, so it streams W at about a third of the bandwidth.
 * mma.sync m16n8k16 (bf16 in, fp32 accumulate) does the 16 rows x 8 tokens
 * x 16 k of a step in one instruction per warp.
 *
 * Layout: a block owns one tile of 16 consecutive rows of W; its warps split
 * K in chunks of 32 (chunk c to warp c % warps), U chunks per warp loaded
 * at once (8; MMA_UNROLL = 4 with DSQ_CUDA_GEMV_MMA_UNROLL=4).  Lane
 * (g = lane / 4, q = lane % 4) loads 16 bytes of rows g and g + 8 and of x
 * row (token) g at columns 32c + 8q .. 32c + 8q + 7.
 * The k order inside an MMA is free (the product sums over k), so those
 * registers are the A and B fragments as they are: the first MMA of the
 * chunk takes the lane's columns 8q + 0..3, the second 8q + 4..7, and A and
 * B agree on which logical k each column plays.  Tokens g >= T are zeros.
 * The accumulators C[16 rows][8 tokens] of the warps are summed in shared
 * memory, then the epilogue runs per (row, token).
 *
 * With NORM the block first writes its T normalised rows to shared memory
 * (gemv_norm.cuh, a warp per row where the block has T warps; rows padded
 * by 64 bytes so the 8 token rows of a load hit different banks) and then
 * loops over row tiles, like gemv.cu's NORM path.
 * Weights are loaded before dsq_pdl_wait() (pdl.cuh). */
#include <stdlib.h>
#include <string.h>

#include "common.cuh"
#include "gemv_mma_tile.cuh"
#include "gemv_norm.cuh"

#define MMA_UNROLL 4
#define MMA_MAX_WARPS 8

namespace {

struct MmaArgs {
    const uint16_t *x; /* bf16 [T][K] (not NORM) */
    const float *xr;   /* NORM: fp32 residual rows [*][K] */
    const int32_t *rows;
    const float *nw;
    float eps;
    const uint16_t *w; /* bf16 [N][K] */
    const float *bias;
    int T, N, K;
    void *y;
};

/* chunks c0 + u*NWp (u < U) of this lane's two rows of tile `tile` */
template <int U>
__device__ __forceinline__ void load_tile_w(uint4 (&wa)[U], uint4 (&wb)[U], const MmaArgs &a,
                                            int tile, int c0, int NWp, int KC)
{
    const int lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
    const uint4 *ra = reinterpret_cast<const uint4 *>(a.w + (size_t)min(tile * 16 + g, a.N - 1) * a.K) + q;
    const uint4 *rb = reinterpret_cast<const uint4 *>(a.w + (size_t)min(tile * 16 + g + 8, a.N - 1) * a.K) + q;
#pragma unroll
    for (int u = 0; u < U; u++) {
        const int c = c0 + u * NWp;
        wa[u] = c < KC ? __ldcs(ra + 4 * c) : make_uint4(0, 0, 0, 0);
        wb[u] = c < KC ? __ldcs(rb + 4 * c) : make_uint4(0, 0, 0, 0);
    }
}

/* U: chunks per warp in flight (8, or MMA_UNROLL: mma_unroll) */
template <int EPI, bool NORM, int U = MMA_UNROLL>
__global__ void __launch_bounds__(MMA_MAX_WARPS * 32) gemv_mma_kernel(MmaArgs a)
{
    __shared__ float red[MMA_MAX_WARPS * 16 * 8]; /* [warp][row 16][token 8] */
    extern __shared__ uint4 xs_dyn[];              /* NORM: bf16 [T][K + 32] */
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, NWp = blockDim.x >> 5;
    const int g = lane >> 2, q = lane & 3;
    const int KC = a.K / 32, ntiles = (a.N + 15) / 16, xstride = NORM ? a.K + 32 : a.K;
    int tile = blockIdx.x;

    uint4 wa[U], wb[U];
    load_tile_w<U>(wa, wb, a, tile, warp, NWp, KC); /* before the wait: weights are constant */
    dsq_pdl_wait();
    dsq_pdl_trigger();
    const uint16_t *xbase;
    if (NORM) {
        if (a.T <= NWp) /* a warp per row */
            gemv_norm_rows_warp(a.xr, a.rows, a.nw, a.eps, a.T, a.K, reinterpret_cast<uint16_t *>(xs_dyn), xstride);
        else
            gemv_norm_rows<DSQ_GEMV_MAX_TOKENS>(a.xr, a.rows, a.nw, a.eps, a.T, a.K,
                                                reinterpret_cast<uint16_t *>(xs_dyn), xstride, red);
        xbase = reinterpret_cast<const uint16_t *>(xs_dyn);
    } else {
        xbase = a.x;
    }
    /* this lane's token row (g < T), 16-byte pieces */
    const uint4 *xrow = g < a.T ? reinterpret_cast<const uint4 *>(xbase + (size_t)g * xstride) + q : nullptr;

    for (;;) {
        float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        for (int c0 = warp;;) {
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int ch = c0 + u * NWp;
                if (ch < KC) {
                    uint4 xv = make_uint4(0, 0, 0, 0);
                    if (xrow)
                        xv = NORM ? xrow[4 * ch] : __ldg(xrow + 4 * ch);
                    dsq_mma_bf16(c, wa[u].x, wb[u].x, wa[u].y, wb[u].y, xv.x, xv.y);
                    dsq_mma_bf16(c, wa[u].z, wb[u].z, wa[u].w, wb[u].w, xv.z, xv.w);
                }
            }
            c0 += U * NWp;
            if (c0 >= KC)
                break;
            load_tile_w<U>(wa, wb, a, tile, c0, NWp, KC);
        }
        const int next = tile + gridDim.x; /* its first weights go out before this tile's epilogue */
        if (next < ntiles)
            load_tile_w<U>(wa, wb, a, next, warp, NWp, KC);
        dsq_mma_tile_put(c, red);
        __syncthreads();
        dsq_mma_tile_epilogue<EPI>(red, NWp, tile * 16, a.T, a.N, a.bias, a.y);
        tile = next;
        if (tile >= ntiles)
            break;
        __syncthreads(); /* red is read above before the next tile writes it */
    }
}

/* Chunks per warp in flight: 8 (stop 42; with 8 warps a
 * K = 1,536 tile's 48 chunks go out in one round instead of two: gate/up
 * at 8 rows 22.4 vs 24.4 us, the head 161.4 vs 164.9, the batch-8 step
 * 1.911-1.922 vs 2.006-2.010 ms, batch 4 1.873-1.875 vs 1.922-1.929, on an
 * H100).  DSQ_CUDA_GEMV_MMA_UNROLL=4 gives 4, as before (a measurement
 * knob, read once).  Launches with the norm likewise (since stop 42's
 * branch mma-norm; 4 before). */
static int mma_unroll(void)
{
    static int v = -1;
    int r = __atomic_load_n(&v, __ATOMIC_RELAXED);
    if (r < 0) {
        const char *u = getenv("DSQ_CUDA_GEMV_MMA_UNROLL");
        r = u && !strcmp(u, "4") ? 4 : 8;
        __atomic_store_n(&v, r, __ATOMIC_RELAXED);
    }
    return r;
}

/* resident blocks of a NORM launch (see gemv.cu's gemv_grid) */
template <int EPI, int U>
static unsigned mma_norm_grid(int nt, size_t smem, unsigned tiles)
{
    static int64_t per_sm[MMA_MAX_WARPS + 1];
    const unsigned cap =
        dsq_cu_resident_blocks((const void *)gemv_mma_kernel<EPI, true, U>, nt, smem, &per_sm[nt / 32]);
    return tiles < cap ? tiles : cap;
}

template <int EPI, int U>
static cudaError_t launch_u(const MmaArgs &a, bool norm, int nt, cudaStream_t s)
{
    const unsigned tiles = (unsigned)((a.N + 15) / 16);
    if (norm) {
        const size_t smem = (size_t)a.T * (a.K + 32) * 2;
        return dsq_launch_pdl(gemv_mma_kernel<EPI, true, U>, dim3(mma_norm_grid<EPI, U>(nt, smem, tiles)), dim3(nt),
                              smem, s, a);
    }
    return dsq_launch_pdl(gemv_mma_kernel<EPI, false, U>, dim3(tiles), dim3(nt), 0, s, a);
}

template <int EPI>
static cudaError_t launch(const MmaArgs &a, bool norm, int nt, cudaStream_t s)
{
    return mma_unroll() == 8 ? launch_u<EPI, 8>(a, norm, nt, s) : launch_u<EPI, MMA_UNROLL>(a, norm, nt, s);
}

/* DSQ_CUDA_GEMV_MMA_NT (read once): the block size of plain launches asked
 * with nt 0, instead of 256 (a measurement knob).  256 since stop 41 (128
 * before for products of 512+ tiles): gate/up at 8 rows 23.9 vs 30.1 us,
 * the head 160.0 vs 175.9 (H100 table); with gate/up and the head on this
 * kernel at 4-8 rows the batch-8 step took 1.977-1.992 ms at 256 threads,
 * 2.159 at 128. */
static int nt_env(void)
{
    static int v = -1;
    int r = __atomic_load_n(&v, __ATOMIC_RELAXED);
    if (r < 0) {
        const char *e = getenv("DSQ_CUDA_GEMV_MMA_NT");
        r = e && e[0] ? atoi(e) : 0;
        if (r < 0 || r % 32 || r > MMA_MAX_WARPS * 32)
            r = 0;
        __atomic_store_n(&v, r, __ATOMIC_RELAXED);
    }
    return r;
}

static dsq_status run(const MmaArgs &a, bool norm, dsq_epilogue epi, int nt, cudaStream_t stream)
{
    if (!dsq_cu_gemv_mma_ok(a.T, a.K, norm ? (const void *)a.xr : (const void *)a.x, (const dsq_bf16 *)a.w) ||
        a.N < 1 || (norm && ((uintptr_t)a.nw & 15)))
        return dsq_fail(DSQ_ERR_INTERNAL, "gemv (tensor cores): %d rows of %d x %d (needs 1..%d rows, K %% 32 == 0, "
                        "16-byte aligned data)", a.T, a.N, a.K, DSQ_GEMV_MAX_TOKENS);
    if (norm && (size_t)a.T * (a.K + 32) * 2 > DSQ_GEMV_NORM_MAX_SMEM)
        return dsq_fail(DSQ_ERR_INTERNAL, "gemv+norm (tensor cores): %d rows of %d do not fit shared memory", a.T, a.K);
    if (epi == DSQ_EPI_SILU_MUL && a.N % 2 != 0)
        return dsq_fail(DSQ_ERR_INTERNAL, "gemv: silu*mul needs an even row count (got %d)", a.N);
    if (epi == DSQ_EPI_BIAS && !a.bias)
        return dsq_fail(DSQ_ERR_INTERNAL, "gemv: bias epilogue without a bias");
    if (norm && epi == DSQ_EPI_ADD) /* y += ... into the residual while other blocks still read it for the norm */
        return dsq_fail(DSQ_ERR_INTERNAL, "gemv+norm (tensor cores): the ADD epilogue is not supported");
    if (nt <= 0 && !norm && nt_env() > 0)
        nt = nt_env();
    if (nt <= 0 && !norm) /* 8 warps per tile keep enough loads in flight */
        nt = 256;
    if (nt <= 0) /* the norm variant (dsq_cu_linear with mma_norm): 8 warps below 512 tiles */
        nt = (a.N + 15) / 16 < 512 ? 256 : 128;
    if (nt % 32 || nt < 32 || nt > MMA_MAX_WARPS * 32)
        return dsq_fail(DSQ_ERR_INTERNAL, "gemv (tensor cores): block of %d threads", nt);
    cudaError_t e;
    switch (epi) {
    case DSQ_EPI_STORE: e = launch<DSQ_EPI_STORE>(a, norm, nt, stream); break;
    case DSQ_EPI_BIAS: e = launch<DSQ_EPI_BIAS>(a, norm, nt, stream); break;
    case DSQ_EPI_ADD: e = launch<DSQ_EPI_ADD>(a, norm, nt, stream); break;
    case DSQ_EPI_SILU_MUL: e = launch<DSQ_EPI_SILU_MUL>(a, norm, nt, stream); break;
    default: return dsq_fail(DSQ_ERR_INTERNAL, "gemv: unknown epilogue %d", (int)epi);
    }
    return dsq_cu_status(e, norm ? "gemv+norm (tensor cores) kernel" : "gemv (tensor cores) kernel");
}

} // namespace

extern "C" int dsq_cu_gemv_mma_ok(int32_t T, int32_t K, const void *x, const dsq_bf16 *w)
{
    return T >= 1 && T <= DSQ_GEMV_MAX_TOKENS && K >= 32 && K % 32 == 0 && ((uintptr_t)x & 15) == 0 &&
           ((uintptr_t)w & 15) == 0;
}

extern "C" dsq_status dsq_cu_gemv_mma(const dsq_bf16 *x, const dsq_bf16 *w, const float *bias, int32_t T, int32_t N,
                                      int32_t K, dsq_epilogue epi, void *y, int nt, cudaStream_t stream)
{
    MmaArgs a = {};
    a.x = x;
    a.w = w;
    a.bias = bias;
    a.T = T;
    a.N = N;
    a.K = K;
    a.y = y;
    return run(a, false, epi, nt, stream);
}

extern "C" dsq_status dsq_cu_gemv_mma_norm(const float *xr, const int32_t *rows, const float *nw, float eps,
                                           const dsq_bf16 *w, const float *bias, int32_t T, int32_t N, int32_t K,
                                           dsq_epilogue epi, void *y, int nt, cudaStream_t stream)
{
    MmaArgs a = {};
    a.xr = xr;
    a.rows = rows;
    a.nw = nw;
    a.eps = eps;
    a.w = w;
    a.bias = bias;
    a.T = T;
    a.N = N;
    a.K = K;
    a.y = y;
    return run(a, true, epi, nt, stream);
}
