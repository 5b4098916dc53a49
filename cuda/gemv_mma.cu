/* gemv_mma.cu - y = epilogue(x W^T) for 2..8 rows of x on the tensor cores.
 *
 * Why: with 8 rows the FMA GEMV (gemv.cu) spends more issue slots on
 * unpacking bf16 and on fp32 FMAs (4 per weight byte) than the SM has per
 * byte of bandwidth, so it streams W at about a third of the bandwidth.
 * mma.sync m16n8k16 (bf16 in, fp32 accumulate) does the 16 rows x 8 tokens
 * x 16 k of a step in one instruction per warp.
 *
 * Layout: a block owns one tile of 16 consecutive rows of W; its warps split
 * K in chunks of 32 (chunk c to warp c % warps), MMA_UNROLL chunks per warp
 * loaded at once.  Lane (g = lane / 4, q = lane % 4) loads 16 bytes of rows
 * g and g + 8 and of x row (token) g at columns 32c + 8q .. 32c + 8q + 7.
 * The k order inside an MMA is free (the product sums over k), so those
 * registers are the A and B fragments as they are: the first MMA of the
 * chunk takes the lane's columns 8q + 0..3, the second 8q + 4..7, and A and
 * B agree on which logical k each column plays.  Tokens g >= T are zeros.
 * The accumulators C[16 rows][8 tokens] of the warps are summed in shared
 * memory, then the epilogue runs per (row, token).
 *
 * With NORM the block first writes its T normalised rows to shared memory
 * (gemv_norm.cuh; rows padded by 64 bytes so the 8 token rows of a load hit
 * different banks) and then loops over row tiles, like gemv.cu's NORM path.
 * Weights are loaded before dsq_pdl_wait() (pdl.cuh).
 *
 * K split over a cluster (CL; sm_90, plain launches only).  A product of
 * few tiles -- o and down have 96 of 16 rows, qkv 128, on 132 SMs -- gets
 * one block per tile and leaves SMs without loads in flight (down at 8
 * rows: 18.6 us on the FMA GEMV, ~20 here, cuBLASLt 15.3, against 10.8 for
 * one row on the FMA GEMV: test_cuda_kernels' H100 table, stop 38).  With
 * CL a cluster of S CTAs shares a tile: its S x warps split the tile's
 * chunks as one block's warps do (warp w of CTA r is the tile's warp
 * r * warps + w), each CTA writes its warps' C fragments to its own shared
 * memory, and CTA 0 adds the S CTAs' sums in rank order through
 * distributed shared memory and runs the epilogue.  The order of the
 * additions is fixed (no atomics), so results do not depend on timing;
 * with S = 1 they are the unsplit kernel's bits. */
#include <stdlib.h>
#include <string.h>

#include <cooperative_groups.h>

#include "common.cuh"
#include "gemv_norm.cuh"

/* Clusters and distributed shared memory: sm_90 and later (the CL
 * instances compile to a trap below that and are never launched there). */
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define DSQ_MMA_CLUSTER 1
#else
#define DSQ_MMA_CLUSTER 0
#endif

#define MMA_UNROLL 4
#define MMA_MAX_WARPS 8
#define MMA_MAX_SPLITS 8 /* CTAs per cluster (the portable maximum) */

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

/* chunks c0 + u*NWp (u < MMA_UNROLL) of this lane's two rows of tile `tile` */
__device__ __forceinline__ void load_tile_w(uint4 (&wa)[MMA_UNROLL], uint4 (&wb)[MMA_UNROLL], const MmaArgs &a,
                                            int tile, int c0, int NWp, int KC)
{
    const int lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
    const uint4 *ra = reinterpret_cast<const uint4 *>(a.w + (size_t)min(tile * 16 + g, a.N - 1) * a.K) + q;
    const uint4 *rb = reinterpret_cast<const uint4 *>(a.w + (size_t)min(tile * 16 + g + 8, a.N - 1) * a.K) + q;
#pragma unroll
    for (int u = 0; u < MMA_UNROLL; u++) {
        const int c = c0 + u * NWp;
        wa[u] = c < KC ? __ldcs(ra + 4 * c) : make_uint4(0, 0, 0, 0);
        wb[u] = c < KC ? __ldcs(rb + 4 * c) : make_uint4(0, 0, 0, 0);
    }
}

/* cluster helpers (the CL instances run on sm_90+ only) */
__device__ __forceinline__ void mma_cluster_sync()
{
#if DSQ_MMA_CLUSTER
    cooperative_groups::this_cluster().sync(); /* arrive.release + wait.acquire */
#endif
}

/* p (this CTA's shared memory) in CTA r of the cluster */
__device__ __forceinline__ const float *mma_cluster_peer(float *p, int r)
{
#if DSQ_MMA_CLUSTER
    return cooperative_groups::this_cluster().map_shared_rank(p, (unsigned)r);
#else
    (void)r;
    return p;
#endif
}

/* The epilogue of tile `tile`: the C sums of the S CTAs' NWp warps each
 * (red [warp][row 16][token 8] in CTA 0 .. S - 1, added in that order),
 * then bias / residual / SiLU*mul and the store. */
template <int EPI, bool CL>
__device__ __forceinline__ void mma_epilogue(const MmaArgs &a, float *red, int tile, int S, int NWp)
{
    auto sum = [&](int off) {
        float v = 0.0f;
        for (int r = 0; r < (CL ? S : 1); r++) {
            const float *src = r == 0 ? red : mma_cluster_peer(red, r); /* CTA 0 runs this */
            for (int w = 0; w < NWp; w++)
                v += src[w * 128 + off];
        }
        return v;
    };
    const int n0 = tile * 16;
    if (EPI == DSQ_EPI_SILU_MUL) {
        for (int j = threadIdx.x; j < 8 * a.T; j += blockDim.x) { /* (gate, up) row pairs 2p, 2p+1 */
            const int t = j / 8, p = j % 8, n = n0 + 2 * p;
            if (n + 1 < a.N) {
                const float gs = sum((2 * p) * 8 + t), us = sum((2 * p + 1) * 8 + t);
                const float s = gs / (1.0f + expf(-gs));
                static_cast<uint16_t *>(a.y)[(size_t)t * (a.N / 2) + n / 2] = dsq_f2bf(s * us);
            }
        }
    } else {
        for (int j = threadIdx.x; j < 16 * a.T; j += blockDim.x) {
            const int t = j / 16, r = j % 16, n = n0 + r;
            if (n < a.N) {
                float v = sum(r * 8 + t);
                float *yo = static_cast<float *>(a.y) + (size_t)t * a.N + n;
                if (EPI == DSQ_EPI_BIAS)
                    v += a.bias[n];
                if (EPI == DSQ_EPI_ADD)
                    v += *yo;
                *yo = v;
            }
        }
    }
}

template <int EPI, bool NORM, bool CL>
__global__ void __launch_bounds__(MMA_MAX_WARPS * 32) gemv_mma_kernel(MmaArgs a)
{
    __shared__ float red[MMA_MAX_WARPS * 16 * 8]; /* [warp][row 16][token 8] */
    extern __shared__ uint4 xs_dyn[];              /* NORM: bf16 [T][K + 32] */
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, NWp = blockDim.x >> 5;
    const int g = lane >> 2, q = lane & 3;
    const int KC = a.K / 32, ntiles = (a.N + 15) / 16, xstride = NORM ? a.K + 32 : a.K;
    /* CL: the S CTAs of a cluster (consecutive along x) share each tile */
    int S = 1, rank = 0;
    if (CL) {
#if DSQ_MMA_CLUSTER
        S = (int)cooperative_groups::this_cluster().num_blocks();
        rank = (int)cooperative_groups::this_cluster().block_rank();
#else
        __trap();
#endif
    }
    const int NWt = S * NWp, wt = rank * NWp + warp; /* the tile's warps; this warp among them */
    const int tstride = gridDim.x / S;
    int tile = blockIdx.x / S;

    uint4 wa[MMA_UNROLL], wb[MMA_UNROLL];
    load_tile_w(wa, wb, a, tile, wt, NWt, KC); /* before the wait: weights are constant */
    dsq_pdl_wait();
    dsq_pdl_trigger();
    const uint16_t *xbase;
    if (NORM) {
        gemv_norm_rows<DSQ_GEMV_MAX_TOKENS>(a.xr, a.rows, a.nw, a.eps, a.T, a.K, reinterpret_cast<uint16_t *>(xs_dyn),
                                            xstride, red);
        xbase = reinterpret_cast<const uint16_t *>(xs_dyn);
    } else {
        xbase = a.x;
    }
    /* this lane's token row (g < T), 16-byte pieces */
    const uint4 *xrow = g < a.T ? reinterpret_cast<const uint4 *>(xbase + (size_t)g * xstride) + q : nullptr;

    for (;;) {
        float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        for (int c0 = wt;;) {
#pragma unroll
            for (int u = 0; u < MMA_UNROLL; u++) {
                const int ch = c0 + u * NWt;
                if (ch < KC) {
                    uint4 xv = make_uint4(0, 0, 0, 0);
                    if (xrow)
                        xv = NORM ? xrow[4 * ch] : __ldg(xrow + 4 * ch);
                    dsq_mma_bf16(c, wa[u].x, wb[u].x, wa[u].y, wb[u].y, xv.x, xv.y);
                    dsq_mma_bf16(c, wa[u].z, wb[u].z, wa[u].w, wb[u].w, xv.z, xv.w);
                }
            }
            c0 += MMA_UNROLL * NWt;
            if (c0 >= KC)
                break;
            load_tile_w(wa, wb, a, tile, c0, NWt, KC);
        }
        const int next = tile + tstride; /* its first weights go out before this tile's epilogue */
        if (next < ntiles)
            load_tile_w(wa, wb, a, next, wt, NWt, KC);
        /* C fragment: c0,c1 = rows g, tokens 2q, 2q+1; c2,c3 = row g + 8 */
        float *rw = red + warp * 128;
        rw[g * 8 + 2 * q] = c[0];
        rw[g * 8 + 2 * q + 1] = c[1];
        rw[(g + 8) * 8 + 2 * q] = c[2];
        rw[(g + 8) * 8 + 2 * q + 1] = c[3];
        if (CL) {
            mma_cluster_sync(); /* every CTA's red is written */
            if (rank == 0)
                mma_epilogue<EPI, true>(a, red, tile, S, NWp);
            mma_cluster_sync(); /* CTA 0 is done with the others' red: they may overwrite it or exit */
        } else {
            __syncthreads();
            mma_epilogue<EPI, false>(a, red, tile, 1, NWp);
        }
        tile = next;
        if (tile >= ntiles)
            break;
        if (!CL)
            __syncthreads(); /* red is read above before the next tile writes it */
    }
}

/* resident blocks of a NORM launch (see gemv.cu's gemv_grid) */
template <int EPI>
static unsigned mma_norm_grid(int nt, size_t smem, unsigned tiles)
{
    static int64_t per_sm[MMA_MAX_WARPS + 1];
    const unsigned cap =
        dsq_cu_resident_blocks((const void *)gemv_mma_kernel<EPI, true, false>, nt, smem, &per_sm[nt / 32]);
    return tiles < cap ? tiles : cap;
}

template <int EPI>
static cudaError_t launch(const MmaArgs &a, bool norm, int nt, int splits, cudaStream_t s)
{
    const unsigned tiles = (unsigned)((a.N + 15) / 16);
    if (norm) {
        const size_t smem = (size_t)a.T * (a.K + 32) * 2;
        return dsq_launch_pdl(gemv_mma_kernel<EPI, true, false>, dim3(mma_norm_grid<EPI>(nt, smem, tiles)), dim3(nt),
                              smem, s, a);
    }
    if (splits > 1)
        return dsq_launch_pdl_cluster(gemv_mma_kernel<EPI, false, true>, dim3(tiles * (unsigned)splits), dim3(nt), 0,
                                      (unsigned)splits, s, a);
    return dsq_launch_pdl(gemv_mma_kernel<EPI, false, false>, dim3(tiles), dim3(nt), 0, s, a);
}

/* Per device: whether the cluster instances run (sm_90+ device and code);
 * 0 not yet known, 1 no, 2 yes. */
static int mma_cluster_state[DSQ_CU_MAX_DEVICES];

static bool mma_clusters_ok(void)
{
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= DSQ_CU_MAX_DEVICES) {
        (void)cudaGetLastError();
        return false;
    }
    int st = __atomic_load_n(&mma_cluster_state[dev], __ATOMIC_RELAXED);
    if (st == 0) {
        int major = 0;
        cudaFuncAttributes fa;
        st = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess && major >= 9 &&
                     cudaFuncGetAttributes(&fa, gemv_mma_kernel<DSQ_EPI_STORE, false, true>) == cudaSuccess &&
                     fa.binaryVersion >= 90
                 ? 2
                 : 1;
        (void)cudaGetLastError();
        __atomic_store_n(&mma_cluster_state[dev], st, __ATOMIC_RELAXED);
    }
    return st == 2;
}

/* DSQ_CUDA_GEMV_MMA_SPLIT (read once): unset or "1" no split (the default
 * until measured), "auto" the rule in plan(), 2..8 that many CTAs per tile
 * for every plain launch. */
static int split_env(void)
{
    static int v = -1; /* -1 not yet read; 0 auto */
    int r = __atomic_load_n(&v, __ATOMIC_RELAXED);
    if (r < 0) {
        const char *e = getenv("DSQ_CUDA_GEMV_MMA_SPLIT");
        r = !e || !e[0] ? 1 : !strcmp(e, "auto") ? 0 : atoi(e);
        if (r < 0 || r > MMA_MAX_SPLITS)
            r = 1;
        __atomic_store_n(&v, r, __ATOMIC_RELAXED);
    }
    return r;
}

/* DSQ_CUDA_GEMV_MMA_NT (read once): the block size of plain unsplit
 * launches asked with nt 0, instead of the rule in plan() (a measurement
 * knob, stop 41: test_cuda_kernels' H100 tables ranked 256 threads ahead of
 * the rule's 128 for gate/up and the head at 8 rows). */
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

/* Splits (CTAs per tile) and block size of a plain launch: splits > 0 and
 * nt > 0 as asked; splits 0 = the knob's, whose "auto" gives enough CTAs
 * for two per SM (down and o: 96 tiles -> 3; qkv: 128 -> 3; gate/up's
 * 1,120 tiles and the head's stay at 1) but no more than leave each CTA
 * one round of MMA_UNROLL chunks per warp; and with nt 0 the most threads
 * (256, 128 or 64) for which each of the tile's warps still has such a
 * round (K = 1,536, 3 CTAs: 128; K = 8,960: 256). */
static void plan(int T, int N, int K, int *nt, int *splits)
{
    (void)T;
    const int tiles = (N + 15) / 16, KC = K / 32;
    int S = *splits > 0 ? *splits : split_env();
    if (S == 0) {
        int dev = 0, sms = 132;
        if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) !=
                                                      cudaSuccess || sms <= 0) {
            (void)cudaGetLastError();
            sms = 132;
        }
        S = (2 * sms + tiles - 1) / tiles;
        if (S > KC / MMA_UNROLL)
            S = KC / MMA_UNROLL;
        S = S < 1 ? 1 : S > MMA_MAX_SPLITS ? MMA_MAX_SPLITS : S;
    }
    if (S > 1 && !mma_clusters_ok())
        S = 1;
    if (*nt <= 0) {
        if (S > 1) {
            int n = 256;
            while (n > 64 && KC / (S * (n / 32)) < MMA_UNROLL)
                n /= 2;
            *nt = n;
        } else if (nt_env() > 0) {
            *nt = nt_env();
        } else { /* few tiles (o, down, qkv): more warps per tile keep enough loads in flight */
            *nt = tiles < 512 ? 256 : 128;
        }
    }
    *splits = S;
}

static dsq_status run(const MmaArgs &a, bool norm, dsq_epilogue epi, int nt, int splits, cudaStream_t stream)
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
    if (splits < 0 || splits > MMA_MAX_SPLITS || (norm && splits > 1))
        return dsq_fail(DSQ_ERR_INTERNAL, "gemv (tensor cores): %d CTAs per tile (1..%d, 1 with the norm)", splits,
                        MMA_MAX_SPLITS);
    if (norm) {
        if (nt <= 0)
            nt = (a.N + 15) / 16 < 512 ? 256 : 128;
        splits = 1;
    } else {
        plan(a.T, a.N, a.K, &nt, &splits);
    }
    if (nt % 32 || nt < 32 || nt > MMA_MAX_WARPS * 32)
        return dsq_fail(DSQ_ERR_INTERNAL, "gemv (tensor cores): block of %d threads", nt);
    cudaError_t e;
    switch (epi) {
    case DSQ_EPI_STORE: e = launch<DSQ_EPI_STORE>(a, norm, nt, splits, stream); break;
    case DSQ_EPI_BIAS: e = launch<DSQ_EPI_BIAS>(a, norm, nt, splits, stream); break;
    case DSQ_EPI_ADD: e = launch<DSQ_EPI_ADD>(a, norm, nt, splits, stream); break;
    case DSQ_EPI_SILU_MUL: e = launch<DSQ_EPI_SILU_MUL>(a, norm, nt, splits, stream); break;
    default: return dsq_fail(DSQ_ERR_INTERNAL, "gemv: unknown epilogue %d", (int)epi);
    }
    return dsq_cu_status(e, norm ? "gemv+norm (tensor cores) kernel"
                            : splits > 1 ? "gemv (tensor cores, split over a cluster) kernel"
                                         : "gemv (tensor cores) kernel");
}

} // namespace

extern "C" int dsq_cu_gemv_mma_ok(int32_t T, int32_t K, const void *x, const dsq_bf16 *w)
{
    return T >= 1 && T <= DSQ_GEMV_MAX_TOKENS && K >= 32 && K % 32 == 0 && ((uintptr_t)x & 15) == 0 &&
           ((uintptr_t)w & 15) == 0;
}

extern "C" dsq_status dsq_cu_gemv_mma_cfg(const dsq_bf16 *x, const dsq_bf16 *w, const float *bias, int32_t T,
                                          int32_t N, int32_t K, dsq_epilogue epi, void *y, int nt, int splits,
                                          cudaStream_t stream)
{
    MmaArgs a = {};
    a.x = x;
    a.w = w;
    a.bias = bias;
    a.T = T;
    a.N = N;
    a.K = K;
    a.y = y;
    return run(a, false, epi, nt, splits, stream);
}

extern "C" dsq_status dsq_cu_gemv_mma(const dsq_bf16 *x, const dsq_bf16 *w, const float *bias, int32_t T, int32_t N,
                                      int32_t K, dsq_epilogue epi, void *y, int nt, cudaStream_t stream)
{
    return dsq_cu_gemv_mma_cfg(x, w, bias, T, N, K, epi, y, nt, 0, stream);
}

extern "C" int dsq_cu_gemv_mma_split_on(void)
{
    return split_env() != 1 && mma_clusters_ok();
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
    return run(a, true, epi, nt, 1, stream);
}
