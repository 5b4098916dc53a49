/* gemm_rows.cuh - what the two kernels of the up-to-64-row products share:
 * gemm_rows.cu's mma.sync kernel (every sm_80+ GPU) and gemm_rows_wg.cu's
 * Hopper kernel (sm_90a: wgmma, x and bf16 W staged in shared memory,
 * quantized W in registers).  Both
 * cut W into tiles of RN = 64 rows and K into stages of XK = 128 (one Q4
 * group), split K the same way (plan_splits; the wgmma kernel without the
 * quantized cap) and end a tile the same way
 * (finish_tile: split partials, tickets, epilogue), so the workspace and
 * ticket sizes of kernels.h hold for both. */
#ifndef DSQ_CUDA_GEMM_ROWS_CUH
#define DSQ_CUDA_GEMM_ROWS_CUH

#include "common.cuh"

namespace dsq_rows {

constexpr int RW = 4;          /* warps per block */
constexpr int RN = 16 * RW;    /* W rows per tile */
constexpr int XK = 128;        /* k per stage (= one Q4 group) */
constexpr int XS = XK + 32;    /* x stage row stride (bf16): 320 B = 20 x 16 B */
constexpr int RS = RN + 4;     /* epilogue tile row stride (floats): [token][RS] */

/* Weight formats: W_BF16 bf16 [N][K]; W_Q8 int8 [N][K] + fp32 row scales
 * [N]; W_Q4 Q4_G128 (K a multiple of 128 here: ldq = K / 2, G = K / 128). */
enum { W_BF16 = 0, W_Q8 = 1, W_Q4 = 2 };

/* The arguments of one launch (either kernel). */
struct RowsArgs {
    const uint16_t *x;      /* bf16 [T][K] */
    const void *w;          /* W_BF16 bf16 [N][K], W_Q8 int8 [N][K], W_Q4 uint8 [N][K/2] */
    const void *wscale;     /* W_Q8 fp32 [N]; W_Q4 f16 bits [N][K/128] */
    const uint8_t *wzero;   /* W_Q4 [N][K/128] */
    const float *bias;      /* [N] (BIAS) */
    void *y;                /* fp32 [T][N], or bf16 [T][N/2] (SILU_MUL) */
    float *ws;              /* fp32 [S][T][N] partials (S > 1) */
    int32_t *tickets;       /* [tiles] (S > 1): zero between launches */
    int T, N, K, S, kstages;
};

__device__ __forceinline__ void cp_async16(void *dst, const void *src, int src_bytes)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"((uint32_t)__cvta_generic_to_shared(dst)),
                 "l"(src), "r"(src_bytes)
                 : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
__device__ __forceinline__ void cp_async_wait1() { asm volatile("cp.async.wait_group 1;\n" ::: "memory"); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }

/* The STORE / BIAS / ADD epilogue of one output (token t, W row n);
 * SILU_MUL pairs rows in the kernel. */
template <int EPI>
__device__ __forceinline__ void store_one(const RowsArgs &a, int t, int n, float v)
{
    float *yo = static_cast<float *>(a.y) + (size_t)t * a.N + n;
    if (EPI == DSQ_EPI_BIAS)
        v += a.bias[n];
    if (EPI == DSQ_EPI_ADD)
        v += *yo;
    *yo = v;
}

/* The tile's sums over every split, in split order, into red: the last
 * block of a split tile reads S partials per output from L2.  Whole tiles
 * with 16-byte rows (N % 4 == 0) go four outputs at a time, FG float4 per
 * thread (FG = 4: the wgmma kernel; gemm_rows.cu passes 0, the scalar
 * loops only, which keeps its registers as they were) and two splits per round in flight (S = 8, T = 64: 8 rounds of L2
 * latency where one output at a time took ~64; stop 37); the summation order
 * per output is the scalar loop's, ((p0 + p1) + p2) + ... (which starts
 * from 0.0f + p0: the two differ only in the sign of an all-zero sum) */
__device__ __forceinline__ void add4(float4 &a, const float4 b)
{
    a.x += b.x, a.y += b.y, a.z += b.z, a.w += b.w;
}
template <int FG>
__device__ __forceinline__ void sum_splits_vec(const RowsArgs &a, float *red, int nseg, int n0)
{
    constexpr int V = RN / 4, NT = RW * 32; /* float4 per token row of the tile; threads */
    const size_t ss = (size_t)a.T * a.N / 4;   /* float4 between splits' partials */
    const int nv = a.T * V;
    for (int base = threadIdx.x; base < nv; base += FG * NT) {
        float4 acc[FG];
        const float4 *src[FG];
        bool ok[FG];
#pragma unroll
        for (int g = 0; g < FG; g++) {
            const int i = base + g * NT, t = i / V, c = i % V;
            ok[g] = i < nv;
            src[g] = reinterpret_cast<const float4 *>(a.ws + (size_t)(ok[g] ? t : 0) * a.N + n0) + c;
            acc[g] = ok[g] ? __ldcg(src[g]) : make_float4(0.f, 0.f, 0.f, 0.f);
        }
        int sp = 1;
        for (; sp + 1 < nseg; sp += 2) {
            float4 u[FG], w[FG];
#pragma unroll
            for (int g = 0; g < FG; g++)
                if (ok[g]) {
                    u[g] = __ldcg(src[g] + sp * ss);
                    w[g] = __ldcg(src[g] + (sp + 1) * ss);
                }
#pragma unroll
            for (int g = 0; g < FG; g++)
                if (ok[g]) {
                    add4(acc[g], u[g]);
                    add4(acc[g], w[g]);
                }
        }
        if (sp < nseg) {
#pragma unroll
            for (int g = 0; g < FG; g++)
                if (ok[g])
                    add4(acc[g], __ldcg(src[g] + sp * ss));
        }
#pragma unroll
        for (int g = 0; g < FG; g++)
            if (ok[g]) {
                const int i = base + g * NT;
                *reinterpret_cast<float4 *>(red + (i / V) * RS + 4 * (i % V)) = acc[g];
            }
    }
}

/* The end of a tile: red [T][RS] fp32 holds the block's sums (before any
 * bias / residual / SiLU*mul) for W rows n0 .. n0 + RN - 1 over its part
 * of K: segment seg of the tile's nseg (its split of a split-K launch).  With nseg > 1 the partial goes to
 * ws[seg], the block takes a ticket and the last block of the tile sums
 * the partials in segment order (a fixed
 * order: the result does not depend on which block finished first), runs
 * the epilogue and returns the ticket to zero (graph replays find it so).
 * All RW * 32 threads call it after a barrier that published red; `last`
 * is a __shared__ int.  red must be 16-byte aligned (RS * 4 is a multiple
 * of 16: the float4 path). */
template <int EPI, int FG = 4>
__device__ __forceinline__ void finish_tile(const RowsArgs &a, float *red, int tile, int seg, int nseg, int n0,
                                            int *last)
{
    static_assert(RS % 4 == 0, "float4 rows of red");
    const int nt = min(RN, a.N - n0); /* live rows of this tile */
    if (nseg > 1) {
        /* partial -> ws[seg]; the last block of the tile sums them in segment order */
        const bool vec = FG > 0 && nt == RN && (a.N & 3) == 0 && ((uintptr_t)a.ws & 15) == 0; /* whole tile, 16-byte rows */
        float *wp = a.ws + (size_t)seg * a.T * a.N;
        if (FG > 0 && vec) {
            for (int i = threadIdx.x; i < a.T * (RN / 4); i += RW * 32) {
                const int t = i / (RN / 4), c = i % (RN / 4);
                __stcg(reinterpret_cast<float4 *>(wp + (size_t)t * a.N + n0) + c,
                       *reinterpret_cast<const float4 *>(red + t * RS + 4 * c));
            }
        } else {
            for (int i = threadIdx.x; i < a.T * RN; i += RW * 32) {
                const int t = i / RN, r = i % RN;
                if (r < nt)
                    wp[(size_t)t * a.N + n0 + r] = red[t * RS + r];
            }
        }
        __threadfence();
        __syncthreads();
        if (threadIdx.x == 0)
            *last = atomicAdd(&a.tickets[tile], 1) == nseg - 1;
        __syncthreads();
        if (!*last)
            return;
        __threadfence(); /* the other splits' partials, written before their tickets */
        if (FG > 0 && vec) {
            sum_splits_vec<(FG > 0 ? FG : 1)>(a, red, nseg, n0);
        } else {
            for (int i = threadIdx.x; i < a.T * RN; i += RW * 32) {
                const int t = i / RN, r = i % RN;
                if (r < nt) {
                    float v = 0.0f;
                    for (int sp = 0; sp < nseg; sp++)
                        v += __ldcg(a.ws + ((size_t)sp * a.T + t) * a.N + n0 + r);
                    red[t * RS + r] = v;
                }
            }
        }
        if (threadIdx.x == 0)
            a.tickets[tile] = 0;
        __syncthreads();
    }
    if (EPI == DSQ_EPI_SILU_MUL) {
        /* rows 2p, 2p+1 of the tile are gate p, up p (n0 is even) */
        uint16_t *yo = static_cast<uint16_t *>(a.y);
        for (int i = threadIdx.x; i < a.T * (RN / 2); i += RW * 32) {
            const int t = i / (RN / 2), p = i % (RN / 2);
            if (2 * p + 1 < nt) {
                const float gs = red[t * RS + 2 * p], us = red[t * RS + 2 * p + 1];
                const float sl = gs / (1.0f + expf(-gs));
                yo[(size_t)t * (a.N / 2) + n0 / 2 + p] = dsq_f2bf(sl * us);
            }
        }
    } else {
        for (int i = threadIdx.x; i < a.T * RN; i += RW * 32) {
            const int t = i / RN, r = i % RN;
            if (r < nt)
                store_one<EPI>(a, t, n0 + r, red[t * RS + r]);
        }
    }
}

/* The split count: `splits` (0: enough blocks for about half the resident
 * slots, so that enough weight bytes are in flight), never more than the
 * stages, and 1 unless the workspace holds S partials and a ticket per
 * tile.  For quantized weights (row_bytes > 0) a planned count also stays
 * within two thirds of the stages and keeps the partials' bytes (S x T x 4
 * per output) within a third of the weight row's bytes: the best of the
 * forced counts 1/2/4/8 in the H200's timing table (test_cuda_quant,
 * 2026-12-05: e.g. 8 for qkv at 1-8 rows, 4 at 16, 1 at 64) but for Q4
 * down at 64 rows (5 where 8 was best) and Q8 qkv / o at 64 (2 where 1
 * was), where the plan alone measured 6.7 us against 4.2 (o, Q4, 1 row)
 * and 35.2 against 15.3 (qkv, Q8, 64 rows).  bf16 plans as before, and so
 * do the wgmma kernel's quantized products (row_bytes 0; stop 37).
 * fill_wave (gemm_rows.cu's kernel, quantized W at 1-2 rows): a wide
 * product that the half-of-the-resident-blocks rule leaves at one split
 * gets as many as one wave of resident blocks holds -- Q4 gate/up at 1 row,
 * 280 tiles over 660 resident blocks (5 per SM): 2 splits, 11.5-11.7 us
 * against 13.7-14.0 at one (H100, test_cuda_quant, stops 27, 38, 39). */
static inline int plan_splits(int splits, unsigned resident, unsigned tiles, const RowsArgs &a, size_t ws_floats,
                       int n_tickets, size_t row_bytes, bool fill_wave = false)
{
    if (splits <= 0) {
        splits = (int)(resident / (2 * tiles));
        if (fill_wave && splits < 2)
            splits = (int)(resident / tiles);
        if (row_bytes > 0) {
            const int by_stages = a.kstages * 2 / 3;
            const int by_bytes = (int)(row_bytes / ((size_t)12 * a.T));
            splits = splits > by_stages ? by_stages : splits;
            splits = splits > by_bytes ? by_bytes : splits;
        }
    }
    if (splits > a.kstages)
        splits = a.kstages;
    const size_t part = (size_t)a.T * a.N;
    if (splits > 1 && (!a.ws || !a.tickets || (int64_t)tiles > n_tickets))
        splits = 1;
    if (splits > 1 && (size_t)splits * part > ws_floats)
        splits = (int)(ws_floats / part);
    return splits < 1 ? 1 : splits;
}

/* ---- the Hopper kernel (gemm_rows_wg.cu) ---- */

/* Whether gemm_rows_wg.cu's kernel runs a T-row product on the current
 * device: the device runs this build's sm_90a code (a probe at first use)
 * and DSQ_CUDA_ROWS_WG (read per call) allows it: 0 never, 2 every T,
 * 1 (the default) T >= 32 (gemm_rows_wg.cu says why). */
bool rows_wg_use(int T);
/* Launch it (the launch_* checks of gemm_rows.cu done); wf W_*. */
cudaError_t rows_wg_launch(int wf, dsq_epilogue epi, RowsArgs a, int splits, size_t ws_floats, int n_tickets,
                           cudaStream_t s);

} // namespace dsq_rows

#endif /* DSQ_CUDA_GEMM_ROWS_CUH */
