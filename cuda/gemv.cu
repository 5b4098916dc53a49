/* gemv.cu - y = epilogue(x W^T) for a handful of rows of x (decode at small
 * batch), where the product is bound by streaming W once from memory;
 * optionally with the RMSNorm that produces x folded in (x computed from the
 * fp32 residual rows inside each block).
 *
 * Work split: a block of NT threads (64..256) owns R consecutive output rows
 * n (all T tokens at once, so W is read exactly once); its threads split K in
 * 16-byte pieces (8 bf16) strided by the block, GEMV_UNROLL pieces per row
 * loaded at once (predicated, so short rows -- K = 1536 is 3 pieces per
 * thread at 64 threads -- still have every load in flight before the first
 * use).  Partial sums are reduced in the warp, then across the warps in
 * shared memory, and the epilogue runs on the reduced values.  x (at most 8
 * rows of K bf16) is small and read through L1; W goes through streaming
 * loads so it does not evict x or the KV cache from L2.
 *
 * Programmatic dependent launch (pdl.cuh): W never depends on an earlier
 * kernel, so each block issues its first W loads before dsq_pdl_wait() and
 * the weight stream starts while the previous kernel drains.
 *
 * Fused RMSNorm (NORM): each block first computes the normalised bf16 rows
 * bf16(nw * (x * rsqrt(mean(x^2) + eps))) into shared memory, exactly the
 * arithmetic of norm.cu but with the block's own summation order, and the
 * block then loops over row groups (grid = the blocks that fit at once), so
 * the norm is computed once per resident block, not once per row group.
 *
 * Q8_ROW weights (WQ_Q8; int8 codes [N][K], fp32 row scales [N]): the
 * same kernel with 16-byte pieces of 16 codes (two pieces of x each),
 * codes turned into floats as gemv_quant.cu does (quant_decode.cuh) and
 * each row's sum multiplied by its scale in the epilogue.  Before stop 35
 * the 1..2-row INT8 products ran gemv_quant.cu's kernel, which has none of
 * the loads in flight, PDL or fused norm above (the INT8 batch-1 step
 * measured 1.21 ms for half of bf16's 1.32 ms worth of bytes).
 *
 * Q4_G128 weights (WQ_Q4; codes [N][K/2], two per byte, low nibble first,
 * fp16 scales and uint8 zero points [N][K/128]): 16-byte pieces of 32
 * codes (a quarter of a group; four pieces of x each), each piece's group
 * scale and zero loaded with its codes before the PDL wait, and the
 * arithmetic of gemv_quant.cu's Q4 kernel (part = sum x (c - zero) over the
 * piece, then acc += scale * part).  The backend's 4-bit qkv, o and down
 * products of 1-2 rows run here (below DSQ_CUDA_QROWS_Q4_MIN rows, default
 * 3; H100, 1 row: 3.4, 3.1, 6.8 us against 4.5, 4.3, 9.6 on gemm_rows.cu,
 * stop 38; the batch-1 step 1.380 vs 1.467 ms, stop 39), gate/up stays on
 * gemm_rows.cu's tensor-core kernel (here with the norm folded into 4,224
 * one-warp blocks it was slower: docs/performance.md, stop 38). */
#include <cuda_fp16.h>
#include <stdio.h>
#include <string.h>

#include "common.cuh"
#include "gemv_epilogue.cuh"
#include "gemv_norm.cuh"
#include "gemv_q4_piece.cuh"
#include "gemv_quant.h"
#include "quant_decode.cuh"

#define GEMV_MAX_THREADS 256 /* blockDim.x is 64, 128 or 256 (32 for Q8 / Q4; a runtime choice) */
#define GEMV_UNROLL 4

namespace {

/* weight formats of the kernel (template argument WQ) */
enum { WQ_BF16 = 0, WQ_Q8 = 1, WQ_Q4 = 2 };

struct GemvArgs {
    const uint16_t *x;   /* bf16 [T][K] (not NORM) */
    const float *xr;     /* NORM: fp32 residual rows [*][K] */
    const int32_t *rows; /* NORM: row of xr for token t, or NULL (t) */
    const float *nw;     /* NORM: fp32 norm weight [K] */
    float eps;
    const uint16_t *w; /* bf16 [N][K] (Q8: int8 codes [N][K]; Q4: 4-bit codes [N][K/2]) */
    const float *scales; /* Q8: fp32 row scales [N]; NULL otherwise */
    const uint16_t *gscales; /* Q4: fp16 group scales [N][G], G = ceil(K / 128) */
    const uint8_t *gzeros;   /* Q4: zero points [N][G] */
    const float *bias; /* fp32 [N] (BIAS) */
    int N, K;
    void *y;
    int early; /* trigger the dependent launch before the wait (pdl.cuh) */
};

/* W pieces v + u*NT (u < GEMV_UNROLL) of the R rows of group g; pieces
 * past the row (PW pieces: K / 8 bf16, K / 16 Q8, K / 32 Q4) are zero.
 * Q4: sz gets each piece's group scale (fp16 bits, low half) and zero
 * point (bits 16..23), raw, so nothing here waits for the loads. */
template <int R, int WQ>
__device__ __forceinline__ void load_w(uint4 (&wv)[GEMV_UNROLL][R], uint32_t (&sz)[GEMV_UNROLL][R],
                                       const GemvArgs &a, int g, int v, int PW)
{
    const int NT = blockDim.x;
    const size_t row_bytes = WQ == WQ_Q4 ? (size_t)a.K / 2 : (size_t)a.K * (WQ == WQ_Q8 ? 1 : 2);
    const int G = (a.K + 127) / 128;
#pragma unroll
    for (int r = 0; r < R; r++) { /* rows past N repeat the last one; never stored */
        const size_t n = (size_t)min(g * R + r, a.N - 1);
        const uint4 *wr = reinterpret_cast<const uint4 *>(reinterpret_cast<const char *>(a.w) + n * row_bytes);
#pragma unroll
        for (int u = 0; u < GEMV_UNROLL; u++) {
            const int p = v + u * NT;
            wv[u][r] = p < PW ? __ldcs(wr + p) : make_uint4(0, 0, 0, 0);
            if (WQ == WQ_Q4) /* 4 pieces per group of 128 */
                sz[u][r] = p < PW ? (uint32_t)__ldg(a.gscales + n * G + (p >> 2)) |
                                        (uint32_t)__ldg(a.gzeros + n * G + (p >> 2)) << 16
                                  : 0u;
        }
    }
}

/* 16-byte path: K % 8 == 0, x and W 16-byte aligned.  Block b computes row
 * groups b, b + gridDim.x, ... */
template <int T, int R, int EPI, bool NORM, int WQ>
__global__ void __launch_bounds__(GEMV_MAX_THREADS) gemv_vec_kernel(GemvArgs a)
{
    __shared__ float red[T * R * (GEMV_MAX_THREADS / 32)];
    extern __shared__ uint4 xs_dyn[]; /* NORM: bf16 [T][K] */
    const int K8 = a.K / 8, NT = blockDim.x;
    constexpr bool Q8 = WQ == WQ_Q8, Q4 = WQ == WQ_Q4;
    const int PW = Q4 ? a.K / 32 : Q8 ? a.K / 16 : K8; /* 16-byte pieces of a W row */
    const int ngroups = (a.N + R - 1) / R;
    int g = blockIdx.x;

    uint4 wv[GEMV_UNROLL][R];
    uint32_t sz[GEMV_UNROLL][R]; /* Q4 only */
    if (a.early)
        dsq_pdl_trigger();
    load_w<R, WQ>(wv, sz, a, g, threadIdx.x, PW); /* before the wait: weights are constant */
    dsq_pdl_wait();
    if (!a.early)
        dsq_pdl_trigger();
    if (NORM)
        gemv_norm_rows<T>(a.xr, a.rows, a.nw, a.eps, T, a.K, reinterpret_cast<uint16_t *>(xs_dyn), a.K, red);
    const uint4 *xv = NORM ? xs_dyn : reinterpret_cast<const uint4 *>(a.x);

    for (;;) {
        float acc[T][R];
#pragma unroll
        for (int t = 0; t < T; t++)
#pragma unroll
            for (int r = 0; r < R; r++)
                acc[t][r] = 0.0f;
        for (int v = threadIdx.x;;) {
#pragma unroll
            for (int u = 0; u < GEMV_UNROLL; u++) {
                if (Q4 && v + u * NT < PW) {
                    const int p = v + u * NT;
                    float zb[R], part[T][R];
#pragma unroll
                    for (int r = 0; r < R; r++)
                        zb[r] = dsq_qd_zbias(sz[u][r] >> 16);
                    /* codes 8w .. 8w+7 of the piece: x piece 4 p + w */
                    dsq_q4_piece<T, R>(
                        wv[u], zb,
                        [&](int t, int w) {
                            return NORM ? xv[(size_t)t * K8 + 4 * p + w] : __ldg(xv + (size_t)t * K8 + 4 * p + w);
                        },
                        part);
#pragma unroll
                    for (int r = 0; r < R; r++) {
                        const float sc = __half2float(__ushort_as_half((unsigned short)(sz[u][r] & 0xffffu)));
#pragma unroll
                        for (int t = 0; t < T; t++)
                            acc[t][r] = fmaf(sc, part[t][r], acc[t][r]);
                    }
                } else if (Q8 && v + u * NT < PW) {
#pragma unroll
                    for (int h = 0; h < 2; h++) { /* codes 8h .. 8h+7 of the piece: x piece 2 (v + u NT) + h */
                        float cw[R][8];
#pragma unroll
                        for (int r = 0; r < R; r++) {
                            const uint32_t lo = h ? wv[u][r].z : wv[u][r].x, hi = h ? wv[u][r].w : wv[u][r].y;
#pragma unroll
                            for (int j = 0; j < 4; j++) {
                                cw[r][j] = dsq_qd_s8(lo, j);
                                cw[r][4 + j] = dsq_qd_s8(hi, j);
                            }
                        }
                        const int xi = 2 * (v + u * NT) + h;
#pragma unroll
                        for (int t = 0; t < T; t++) {
                            float xf[8];
                            dsq_unpack8(NORM ? xv[(size_t)t * K8 + xi] : __ldg(xv + (size_t)t * K8 + xi), xf);
#pragma unroll
                            for (int r = 0; r < R; r++)
#pragma unroll
                                for (int e = 0; e < 8; e++)
                                    acc[t][r] = fmaf(xf[e], cw[r][e], acc[t][r]);
                        }
                    }
                } else if (WQ == WQ_BF16 && v + u * NT < K8) {
#pragma unroll
                    for (int t = 0; t < T; t++) {
                        float xf[8];
                        dsq_unpack8(NORM ? xv[(size_t)t * K8 + v + u * NT] : __ldg(xv + (size_t)t * K8 + v + u * NT),
                                    xf);
#pragma unroll
                        for (int r = 0; r < R; r++) {
                            float wf[8];
                            dsq_unpack8(wv[u][r], wf);
#pragma unroll
                            for (int e = 0; e < 8; e++)
                                acc[t][r] = fmaf(xf[e], wf[e], acc[t][r]);
                        }
                    }
                }
            }
            v += GEMV_UNROLL * NT;
            if (v >= PW)
                break;
            load_w<R, WQ>(wv, sz, a, g, v, PW);
        }
        /* the next group's first weights go out before this group's
         * epilogue, so its reductions overlap the loads */
        const int next = g + gridDim.x;
        if (next < ngroups)
            load_w<R, WQ>(wv, sz, a, next, threadIdx.x, PW);
        gemv_block_epilogue<T, R, EPI>(acc, red, g * R, a.N, Q8 ? a.scales : nullptr, a.bias, a.y);
        g = next;
        if (g >= ngroups)
            break;
        __syncthreads(); /* the epilogue's reads of red are done */
    }
}

/* Scalar path for any K and alignment (odd test sizes, exotic configs);
 * launched without PDL. */
template <int T, int R, int EPI>
__global__ void __launch_bounds__(GEMV_MAX_THREADS)
gemv_scalar_kernel(const uint16_t *__restrict__ x, const uint16_t *__restrict__ w,
                   const float *__restrict__ bias, int N, int K, void *y)
{
    __shared__ float red[T * R * (GEMV_MAX_THREADS / 32)];
    const int row0 = blockIdx.x * R;
    float acc[T][R];
#pragma unroll
    for (int t = 0; t < T; t++)
#pragma unroll
        for (int r = 0; r < R; r++)
            acc[t][r] = 0.0f;
    for (int k = threadIdx.x; k < K; k += blockDim.x) {
#pragma unroll
        for (int r = 0; r < R; r++) {
            float wf = __uint_as_float((uint32_t)w[(size_t)min(row0 + r, N - 1) * K + k] << 16);
#pragma unroll
            for (int t = 0; t < T; t++)
                acc[t][r] = fmaf(__uint_as_float((uint32_t)x[(size_t)t * K + k] << 16), wf, acc[t][r]);
        }
    }
    gemv_block_epilogue<T, R, EPI>(acc, red, row0, N, nullptr, bias, y);
}

/* Whether vec launches size their grid by residency (gemv_grid); env
 * DSQ_CUDA_GEMV_BALANCE=0 gives one block per row group (a measurement
 * knob, read once). */
static bool balance_enabled(void)
{
    static int on = -1; /* -1 not yet read */
    int v = __atomic_load_n(&on, __ATOMIC_RELAXED);
    if (v < 0) {
        const char *e = getenv("DSQ_CUDA_GEMV_BALANCE");
        v = !(e && e[0] == '0' && e[1] == 0);
        __atomic_store_n(&on, v, __ATOMIC_RELAXED);
    }
    return v != 0;
}

/* Blocks of a vec launch over `groups` row groups.  Each block loops over
 * groups b, b + grid, ..., so the grid sets how evenly the weight stream
 * ends: with grid = groups and more groups than resident blocks, the last
 * wave is a fraction of the GPU with too few loads in flight to keep the
 * memory busy (down_proj at batch 1: 768 groups over 528 resident blocks,
 * 2.4 TB/s).  So: rounds = the waves the groups need at full residency, and
 * grid = groups / rounds rounded up, every block doing the same number of
 * groups (+-1): down_proj 291 vs 318 us per batch-1 step (H200, profile).
 * A NORM launch always loops (the norm is computed once per block) on
 * every resident block, at most one per group: balancing it measured
 * slower (gate/up 494 vs 485 us per step).  The occupancy is cached per
 * kernel instance and block size (it does not depend on the device's SM
 * count, which is read per call). */
template <int T, int R, int EPI, bool NORM, int WQ>
static unsigned gemv_grid(int nt, size_t smem, unsigned groups)
{
    if (!NORM && !balance_enabled())
        return groups;
    static int64_t per_sm[4]; /* nt 64, 128, 256, 32 (quantized only) */
    const unsigned cap = dsq_cu_resident_blocks((const void *)gemv_vec_kernel<T, R, EPI, NORM, WQ>, nt, smem,
                                                &per_sm[nt == 64 ? 0 : nt == 128 ? 1 : nt == 256 ? 2 : 3]);
    if (groups <= cap)
        return groups;
    if (NORM) /* every resident block: measured faster than balanced here */
        return cap;
    const unsigned rounds = (groups + cap - 1) / cap;
    return (groups + rounds - 1) / rounds;
}

template <int T, int R, int EPI, int WQ>
static cudaError_t launch_rows(bool vec, bool norm, int nt, const GemvArgs &a, cudaStream_t s)
{
    const unsigned groups = (unsigned)((a.N + R - 1) / R);
    if constexpr (T <= DSQ_GEMV_NORM_MAX_TOKENS) {
        if (norm) {
            const size_t smem = (size_t)T * a.K * 2;
            return dsq_launch_pdl(gemv_vec_kernel<T, R, EPI, true, WQ>,
                                  dim3(gemv_grid<T, R, EPI, true, WQ>(nt, smem, groups)), dim3(nt), smem, s, a);
        }
    }
    if (vec)
        return dsq_launch_pdl(gemv_vec_kernel<T, R, EPI, false, WQ>,
                              dim3(gemv_grid<T, R, EPI, false, WQ>(nt, 0, groups)), dim3(nt), 0, s, a);
    if (WQ != WQ_BF16) /* run() sends quantized weights only where vec holds */
        return cudaErrorInvalidValue;
    gemv_scalar_kernel<T, R, EPI><<<groups, GEMV_MAX_THREADS, 0, s>>>(a.x, a.w, a.bias, a.N, a.K, a.y);
    return cudaGetLastError();
}

template <int T, int EPI, int WQ>
static cudaError_t launch_gemv(bool vec, bool norm, int nt, int r, const GemvArgs &a, cudaStream_t s)
{
    /* rows per block: 8 only for 1-2 bf16 tokens (registers: quantized
     * weights' decoded codes take R x 8 more, Q4's scales R x 4), 2 or 4
     * otherwise */
    if constexpr (T <= 2 && WQ == WQ_BF16) { /* (no 8-row instances of the others) */
        if (r >= 8)
            return launch_rows<T, 8, EPI, WQ>(vec, norm, nt, a, s);
    }
    if (r >= 4)
        return launch_rows<T, 4, EPI, WQ>(vec, norm, nt, a, s);
    return launch_rows<T, 2, EPI, WQ>(vec, norm, nt, a, s);
}

template <int EPI, int WQ>
static cudaError_t dispatch_tokens(int T, bool vec, bool norm, int nt, int r, const GemvArgs &a, cudaStream_t s)
{
    switch (T) {
    case 1: return launch_gemv<1, EPI, WQ>(vec, norm, nt, r, a, s);
    case 2: return launch_gemv<2, EPI, WQ>(vec, norm, nt, r, a, s);
    case 3: return launch_gemv<3, EPI, WQ>(vec, norm, nt, r, a, s);
    case 4: return launch_gemv<4, EPI, WQ>(vec, norm, nt, r, a, s);
    case 5: return launch_gemv<5, EPI, WQ>(vec, false, nt, r, a, s);
    case 6: return launch_gemv<6, EPI, WQ>(vec, false, nt, r, a, s);
    case 7: return launch_gemv<7, EPI, WQ>(vec, false, nt, r, a, s);
    default: return launch_gemv<8, EPI, WQ>(vec, false, nt, r, a, s);
    }
}

/* Block shape for (T, K): see dsq_cu_gemv_cfg.  Chosen from the timing
 * table of test_cuda_kernels on the H200 (docs/performance.md). */
static void default_cfg(int T, int N, int K, int *nt, int *r)
{
    /* short rows (K <= 2048): 64 threads, so each thread still streams
     * several 16-byte pieces per row -- 128 x 2 rows for the small
     * products at 1-2 rows (qkv 3.1 vs 3.8 us at 1 row, 3.5 vs 4.6 at 2;
     * o 2.9 vs 4.0 at 2), 64 x 8 (1 row) or 64 x 2 for gate/up's 17,920
     * rows (14.8 vs 15.9 us; 16.6 vs 18.1); long rows (down_proj): 128 x 2
     * at 1-2 rows (9.1 vs 9.3 us, 9.7 vs 10.5), 128 x 4 beyond.  Those
     * figures are one H200 run; the next run's table put qkv at 1 row at
     * 4.4 us with 128 x 2 and 3.8 with 64 x 4 (run-to-run noise of ~1 us at
     * this size): re-measure before trusting the small-product choice */
    const int K8 = K / 8;
    if (K8 <= 256) {
        if (T <= 2 && N < 8192) {
            *nt = 128;
            *r = 2;
        } else {
            *nt = 64;
            *r = T == 1 ? 8 : 2;
        }
    } else {
        *nt = 128;
        *r = T <= 2 ? 2 : 4;
    }
}

/* DSQ_CUDA_Q8_SMALL=128 (read once): the 128-thread shape below for the
 * small Q8 products at 1-2 rows (a measurement knob, stop 35) */
static bool q8_small_wide(void)
{
    static int on = -1;
    int v = __atomic_load_n(&on, __ATOMIC_RELAXED);
    if (v < 0) {
        const char *e = getenv("DSQ_CUDA_Q8_SMALL");
        v = e && !strcmp(e, "128");
        __atomic_store_n(&on, v, __ATOMIC_RELAXED);
    }
    return v != 0;
}

/* Q8 block shape from the 16-byte pieces of a row (16 codes each).  H100
 * timing table (test_cuda_quant, stop 35), 1 row: qkv / o 64 x 4 (3.9 /
 * 4.2 us), down 256 x 2 (7.7 vs 8.4 at 128 x 2); wide products (gate/up,
 * the head: N >= 16384) were fastest on gemv_quant.cu's one-warp blocks of
 * 2 rows, each lane holding all 3 pieces of a 1,536 row -- 32 x 2 here,
 * with every piece in flight before the PDL wait. */
static void q8_default_cfg(int T, int N, int K, int *nt, int *r)
{
    const int P = K / 16;
    if (P > 128) {
        *nt = 256;
        *r = 2;
    } else if (N >= 16384) {
        *nt = 32;
        *r = 2;
    } else if (T <= 2 && q8_small_wide()) {
        *nt = 128;
        *r = T == 1 ? 4 : 2;
    } else {
        *nt = 64;
        *r = T <= 2 ? 4 : 2;
    }
}

/* Q4 block shape from the 16-byte pieces of a row (32 codes each; 1,536:
 * 48 pieces, 8,960: 280).  H100 timing table (test_cuda_quant, stop 38),
 * best shapes: 1 row qkv 64 x 4 (3.4 us), o 128 x 2 (3.1), down 128 x 4
 * (6.8); 2 rows qkv 128 x 4 (4.3), o 128 x 2 (3.6), down 128 x 2 (7.3).
 * End to end the short products (qkv, o) at one row run 64 x 2: twice the
 * blocks of 64 x 4, fastest of the shapes tried in both H100 calls that
 * tried them (`DSQ_CUDA_Q4_GEMV_SHORT`; 4-bit batch 1 @ 512, sampled: stop
 * 38 1.487 vs 1.513 ms at 64 x 4, stop 40 1.312 vs 1.352 / 1.361).
 * Wide products (gate/up, N >= 16384) run gemm_rows.cu by default
 * (dsq_cu_gemv_q4_pdl_use); here with DSQ_CUDA_Q4_GEMV=new or an explicit
 * shape: one warp, 2 rows (32 x 2, gemv_quant.cu's choice). */
static void q4_default_cfg(int T, int N, int K, int *nt, int *r)
{
    const int P = K / 32;
    /* DSQ_CUDA_Q4_GEMV_SHORT=NTxR (read once; a measurement knob): this
     * shape for every product of short rows (P <= 64: qkv, o, gate/up, and
     * a 4-bit head of such rows), NT 32, 64, 128 or 256, R 2 or 4 */
    static int knob = -1; /* nt * 16 + r; 0 unset */
    int kv = __atomic_load_n(&knob, __ATOMIC_RELAXED);
    if (kv < 0) {
        const char *e = getenv("DSQ_CUDA_Q4_GEMV_SHORT");
        int a = 0, b = 0;
        kv = e && sscanf(e, "%dx%d", &a, &b) == 2 && (a == 32 || a == 64 || a == 128 || a == 256) &&
                     (b == 2 || b == 4)
                 ? a * 16 + b
                 : 0;
        __atomic_store_n(&knob, kv, __ATOMIC_RELAXED);
    }
    if (kv > 0 && P <= 64) {
        *nt = kv / 16;
        *r = kv % 16;
        return;
    }
    if (P > 128) {
        *nt = T <= 2 ? 128 : 64;
        *r = T == 1 ? 4 : 2;
    } else if (P > 64) {
        *nt = 64;
        *r = 2;
    } else if (N >= 16384) {
        *nt = 32;
        *r = 2;
    } else {
        *nt = T == 2 ? 128 : 64;
        *r = 2;
    }
}

/* What the 16-byte path needs, `piece` weights per 16 bytes (8 bf16, 16
 * Q8, 32 Q4): without the norm, and with it (T * K * 2 bytes of shared
 * memory for the normalised rows) */
static int vec_ok(int32_t T, int32_t K, int piece, const void *x, const void *w)
{
    return T >= 1 && T <= DSQ_GEMV_MAX_TOKENS && K % piece == 0 && ((uintptr_t)x & 15) == 0 &&
           ((uintptr_t)w & 15) == 0;
}

static int norm_ok(int32_t T, int32_t K, int piece, const void *xr, const float *nw, const void *w)
{
    return T >= 1 && T <= DSQ_GEMV_NORM_MAX_TOKENS && K % piece == 0 && (size_t)T * K * 2 <= DSQ_GEMV_NORM_MAX_SMEM &&
           ((uintptr_t)xr & 15) == 0 && ((uintptr_t)nw & 15) == 0 && ((uintptr_t)w & 15) == 0;
}

static dsq_status run(const GemvArgs &a, bool norm, int wq, int32_t T, dsq_epilogue epi, int nt, int r,
                      cudaStream_t stream)
{
    const int N = a.N, K = a.K;
    const bool q8 = wq == WQ_Q8, q4 = wq == WQ_Q4, quant = q8 || q4;
    const char *name = q4 ? "gemv q4" : q8 ? "gemv q8" : "gemv";
    if (T < 1 || T > DSQ_GEMV_MAX_TOKENS)
        return dsq_fail(DSQ_ERR_INTERNAL, "%s: %d rows; the kernel takes 1..%d", name, T, DSQ_GEMV_MAX_TOKENS);
    if (N < 1 || K < 1)
        return dsq_fail(DSQ_ERR_INTERNAL, "%s: empty matrix %d x %d", name, N, K);
    if (epi == DSQ_EPI_SILU_MUL && N % 2 != 0)
        return dsq_fail(DSQ_ERR_INTERNAL, "%s: silu*mul needs an even row count (got %d)", name, N);
    if (epi == DSQ_EPI_BIAS && !a.bias)
        return dsq_fail(DSQ_ERR_INTERNAL, "%s: bias epilogue without a bias", name);
    /* blocks loop over row groups, each reading every row of xr for its
     * norm: an ADD into the residual could change rows another block has
     * yet to read (the backend folds norms only into qkv and gate/up) */
    if (norm && epi == DSQ_EPI_ADD)
        return dsq_fail(DSQ_ERR_INTERNAL, "%s+norm: the ADD epilogue is not supported", name);
    if (nt <= 0 || r <= 0) {
        if (q4)
            q4_default_cfg(T, N, K, &nt, &r);
        else if (q8)
            q8_default_cfg(T, N, K, &nt, &r);
        else
            default_cfg(T, N, K, &nt, &r);
    }
    GemvArgs ea = a;
    ea.early = (dsq_pdl_early() & DSQ_PDL_EARLY_GEMV) != 0;
    if (nt != 64 && nt != 128 && nt != 256 && !(quant && nt == 32))
        return dsq_fail(DSQ_ERR_INTERNAL, "%s: block of %d threads (64, 128 or 256; 32 for quantized weights)", name,
                        nt);
    const int piece = q4 ? 32 : q8 ? 16 : 8; /* weights per 16-byte piece */
    const bool vec = K % piece == 0 && ((uintptr_t)a.x & 15) == 0 && ((uintptr_t)a.w & 15) == 0;
    if (quant && !norm && !vec)
        return dsq_fail(DSQ_ERR_INTERNAL, "%s: needs K %% %d == 0 and 16-byte aligned x and codes (K %d)", name,
                        piece, K);
    if (q8 && !a.scales)
        return dsq_fail(DSQ_ERR_INTERNAL, "gemv q8: no row scales");
    if (q4 && (!a.gscales || !a.gzeros))
        return dsq_fail(DSQ_ERR_INTERNAL, "gemv q4: no group scales or zero points");
    if (norm && !norm_ok(T, K, piece, a.xr, a.nw, a.w))
        return dsq_fail(DSQ_ERR_INTERNAL, "%s+norm: %d rows of %d (needs K %% %d == 0, 16-byte aligned data, "
                        "T <= %d, T*K*2 <= %d)", name, T, K, piece, DSQ_GEMV_NORM_MAX_TOKENS, DSQ_GEMV_NORM_MAX_SMEM);
    cudaError_t e = cudaSuccess;
    switch (epi) {
#define GCASE(E)                                                                                 \
    case E:                                                                                      \
        e = q4   ? dispatch_tokens<E, WQ_Q4>(T, vec || norm, norm, nt, r, ea, stream)            \
            : q8 ? dispatch_tokens<E, WQ_Q8>(T, vec || norm, norm, nt, r, ea, stream)            \
                 : dispatch_tokens<E, WQ_BF16>(T, vec, norm, nt, r, ea, stream);                 \
        break;
        GCASE(DSQ_EPI_STORE)
        GCASE(DSQ_EPI_BIAS)
        GCASE(DSQ_EPI_ADD)
        GCASE(DSQ_EPI_SILU_MUL)
#undef GCASE
    default: return dsq_fail(DSQ_ERR_INTERNAL, "%s: unknown epilogue %d", name, (int)epi);
    }
    return dsq_cu_status(e, norm ? (q4 ? "gemv q4+norm kernel" : q8 ? "gemv q8+norm kernel" : "gemv+norm kernel")
                                 : q4 ? "gemv q4 kernel" : q8 ? "gemv q8 kernel" : "gemv kernel");
}

} // namespace

/* The arguments every C entry point below packs: x (bf16 rows) or, for
 * the norm variants, xr / rows / nw / eps; w bf16 or Q8 codes (scales) or
 * Q4 codes (set gscales / gzeros after). */
static GemvArgs args_of(const dsq_bf16 *x, const float *xr, const int32_t *rows, const float *nw, float eps,
                        const void *w, const float *scales, const float *bias, int32_t N, int32_t K, void *y)
{
    GemvArgs a = {};
    a.x = x;
    a.xr = xr;
    a.rows = rows;
    a.nw = nw;
    a.eps = eps;
    a.w = static_cast<const uint16_t *>(w);
    a.scales = scales;
    a.bias = bias;
    a.N = N;
    a.K = K;
    a.y = y;
    return a;
}

extern "C" int dsq_cu_gemv_norm_ok(int32_t T, int32_t K, const void *xr, const float *nw, const dsq_bf16 *w)
{
    return norm_ok(T, K, 8, xr, nw, w);
}

extern "C" dsq_status dsq_cu_gemv_cfg(const dsq_bf16 *x, const dsq_bf16 *w, const float *bias, int32_t T,
                                      int32_t N, int32_t K, dsq_epilogue epi, void *y, int nt, int r,
                                      cudaStream_t stream)
{
    return run(args_of(x, NULL, NULL, NULL, 0.0f, w, NULL, bias, N, K, y), false, WQ_BF16, T, epi, nt, r, stream);
}

extern "C" dsq_status dsq_cu_gemv(const dsq_bf16 *x, const dsq_bf16 *w, const float *bias, int32_t T,
                                  int32_t N, int32_t K, dsq_epilogue epi, void *y, cudaStream_t stream)
{
    return dsq_cu_gemv_cfg(x, w, bias, T, N, K, epi, y, 0, 0, stream);
}

extern "C" dsq_status dsq_cu_gemv_norm_cfg(const float *xr, const int32_t *rows, const float *nw, float eps,
                                           const dsq_bf16 *w, const float *bias, int32_t T, int32_t N, int32_t K,
                                           dsq_epilogue epi, void *y, int nt, int r, cudaStream_t stream)
{
    return run(args_of(NULL, xr, rows, nw, eps, w, NULL, bias, N, K, y), true, WQ_BF16, T, epi, nt, r, stream);
}

extern "C" int dsq_cu_gemv_q8_pdl_ok(int32_t T, int32_t K, const void *x, const int8_t *q)
{
    return vec_ok(T, K, 16, x, q);
}

extern "C" int dsq_cu_gemv_q8_norm_ok(int32_t T, int32_t K, const void *xr, const float *nw, const int8_t *q)
{
    return norm_ok(T, K, 16, xr, nw, q);
}

extern "C" dsq_status dsq_cu_gemv_q8_pdl_cfg(const dsq_bf16 *x, const int8_t *q, const float *scales,
                                             const float *bias, int32_t T, int32_t N, int32_t K, dsq_epilogue epi,
                                             void *y, int nt, int r, cudaStream_t stream)
{
    return run(args_of(x, NULL, NULL, NULL, 0.0f, q, scales, bias, N, K, y), false, WQ_Q8, T, epi, nt, r, stream);
}

extern "C" dsq_status dsq_cu_gemv_q8_norm_cfg(const float *xr, const int32_t *rows, const float *nw, float eps,
                                              const int8_t *q, const float *scales, const float *bias, int32_t T,
                                              int32_t N, int32_t K, dsq_epilogue epi, void *y, int nt, int r,
                                              cudaStream_t stream)
{
    return run(args_of(NULL, xr, rows, nw, eps, q, scales, bias, N, K, y), true, WQ_Q8, T, epi, nt, r, stream);
}

extern "C" int dsq_cu_gemv_q4_pdl_ok(int32_t T, int32_t K, const void *x, const uint8_t *q)
{
    return vec_ok(T, K, 32, x, q);
}

extern "C" int dsq_cu_gemv_q4_norm_ok(int32_t T, int32_t K, const void *xr, const float *nw, const uint8_t *q)
{
    return norm_ok(T, K, 32, xr, nw, q);
}

extern "C" dsq_status dsq_cu_gemv_q4_pdl_cfg(const dsq_bf16 *x, const uint8_t *q, const uint16_t *scales,
                                             const uint8_t *zeros, const float *bias, int32_t T, int32_t N,
                                             int32_t K, dsq_epilogue epi, void *y, int nt, int r, cudaStream_t stream)
{
    GemvArgs a = args_of(x, NULL, NULL, NULL, 0.0f, q, NULL, bias, N, K, y);
    a.gscales = scales;
    a.gzeros = zeros;
    return run(a, false, WQ_Q4, T, epi, nt, r, stream);
}

extern "C" dsq_status dsq_cu_gemv_q4_norm_cfg(const float *xr, const int32_t *rows, const float *nw, float eps,
                                              const uint8_t *q, const uint16_t *scales, const uint8_t *zeros,
                                              const float *bias, int32_t T, int32_t N, int32_t K, dsq_epilogue epi,
                                              void *y, int nt, int r, cudaStream_t stream)
{
    GemvArgs a = args_of(NULL, xr, rows, nw, eps, q, NULL, bias, N, K, y);
    a.gscales = scales;
    a.gzeros = zeros;
    return run(a, true, WQ_Q4, T, epi, nt, r, stream);
}
