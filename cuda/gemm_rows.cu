/* gemm_rows.cu - y = epilogue(x W^T) for up to 64 rows of x on the tensor
 * cores, every weight byte read once from memory: the batched decode step's
 * products (batch 9..64), where cuBLASLt streams the weights at ~55% of the
 * bandwidth (docs/performance.md, stop 23) and needs a separate SiLU*mul
 * kernel.
 *
 * Layout.  A block of 4 warps owns a tile of 64 consecutive rows of W (warp
 * w: rows 16w .. 16w+15) and all T rows ("tokens") of x, over a range of K
 * (its split).  K is walked in stages of 128: the stage's x rows [T][128]
 * are copied into shared memory by cp.async (double buffered; rows padded
 * by 64 bytes so the lanes' 16-byte reads below hit distinct banks; tokens
 * >= T are zeros), while each warp streams its own weights straight into
 * registers, one stage ahead (__ldcs, 16 bytes per lane per row, 4 chunks of
 * 32 k in flight), as gemv_mma.cu does.  Lane (g = lane / 4, q = lane % 4)
 * holds k = 32c + 8q .. 8q + 7 of rows g and g + 8 for chunk c; the k order
 * inside an MMA is free, so those registers are the A fragments of two
 * m16n8k16 MMAs as they are, and the B fragments are the same 8 k of token
 * 8j + g read from shared memory as one 16-byte word per token group j.
 *
 * Splits.  Short products (qkv, o, down: 24-32 tiles) split K over several
 * blocks so that enough weight bytes are in flight: each block writes its
 * fp32 partial tile to a workspace, takes a ticket, and the block holding
 * the last ticket of the tile sums the partials in split order (a fixed
 * order: the result does not depend on which block finished first), runs
 * the epilogue and returns the tile's ticket to zero (graph replays find it
 * so).  Wide products (gate/up, lm_head) run one split.
 *
 * Epilogues: STORE, BIAS, ADD (y += ...), and SILU_MUL for the gate/up
 * interleaved weight (rows 2p, 2p+1 = gate p, up p; y bf16 [T][N/2]), from a
 * shared-memory tile of the block's accumulators.  Weights are loaded before
 * dsq_pdl_wait() (pdl.cuh): they are constant. */
#include "common.cuh"

namespace {

constexpr int RW = 4;          /* warps per block */
constexpr int RN = 16 * RW;    /* W rows per tile */
constexpr int XK = 128;        /* k per stage */
constexpr int XS = XK + 32;    /* x stage row stride (bf16): 320 B = 20 x 16 B, so the
                                  8 lanes of a quarter warp (tokens g, g+1; q 0..3) hit
                                  distinct 16-byte bank groups: (20 r + q) % 8 = 4 r + q */
constexpr int CPS = XK / 32;   /* 32-k chunks per stage */
constexpr int RS = RN + 4;     /* epilogue tile row stride (floats): [token][RS] */

struct RowsArgs {
    const uint16_t *x;  /* bf16 [T][K] */
    const uint16_t *w;  /* bf16 [N][K] */
    const float *bias;  /* [N] (BIAS) */
    void *y;            /* fp32 [T][N], or bf16 [T][N/2] (SILU_MUL) */
    float *ws;          /* fp32 [S][T][N] partials (S > 1) */
    int32_t *tickets;   /* [tiles] (S > 1): zero between launches */
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

/* Copy stage s of x (k = s*XK ..) into buffer `dst` [TM][XS]; tokens >= T
 * are zero-filled. One cp.async group. */
template <int TM>
__device__ __forceinline__ void stage_x(const RowsArgs &a, int s, uint16_t *dst)
{
    constexpr int CPR = XK / 8; /* 16-byte chunks per row */
    for (int c = threadIdx.x; c < TM * CPR; c += RW * 32) {
        const int r = c / CPR, cc = c % CPR;
        const uint16_t *src = a.x + (size_t)(r < a.T ? r : 0) * a.K + (size_t)s * XK + cc * 8;
        cp_async16(dst + r * XS + cc * 8, src, r < a.T ? 16 : 0);
    }
    cp_async_commit();
}

/* This lane's weights of stage s: chunks c = 0..CPS-1 of rows g and g + 8. */
__device__ __forceinline__ void stage_w(const uint4 *ra, const uint4 *rb, int s, uint4 (&wa)[CPS], uint4 (&wb)[CPS])
{
#pragma unroll
    for (int c = 0; c < CPS; c++) {
        wa[c] = __ldcs(ra + (s * CPS + c) * 4);
        wb[c] = __ldcs(rb + (s * CPS + c) * 4);
    }
}

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

template <int NT8, int EPI>
__global__ void __launch_bounds__(RW * 32) gemm_rows_kernel(RowsArgs a)
{
    constexpr int TM = NT8 * 8;
    extern __shared__ __align__(16) uint16_t xs[]; /* [2][TM][XS]; then the epilogue tile [TM][RS] fp32 */
    __shared__ int last;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, q = lane & 3;
    const int tile = blockIdx.x / a.S, split = blockIdx.x % a.S;
    const int s0 = (int)((int64_t)split * a.kstages / a.S), s1 = (int)((int64_t)(split + 1) * a.kstages / a.S);
    const int n0 = tile * RN;
    const uint4 *ra = reinterpret_cast<const uint4 *>(a.w + (size_t)min(n0 + warp * 16 + g, a.N - 1) * a.K) + q;
    const uint4 *rb = reinterpret_cast<const uint4 *>(a.w + (size_t)min(n0 + warp * 16 + g + 8, a.N - 1) * a.K) + q;

    uint4 wa[CPS], wb[CPS];
    stage_w(ra, rb, s0, wa, wb); /* s0 < s1: the host keeps S <= kstages */
    dsq_pdl_wait();
    dsq_pdl_trigger();

    float acc[NT8][4];
#pragma unroll
    for (int j = 0; j < NT8; j++)
        acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
    stage_x<TM>(a, s0, xs);
    for (int s = s0; s < s1; s++) {
        const int buf = (s - s0) & 1;
        if (s + 1 < s1) /* the other buffer, free since the barrier ending the previous stage */
            stage_x<TM>(a, s + 1, xs + (buf ^ 1) * TM * XS);
        else
            cp_async_commit(); /* an empty group keeps the count */
        cp_async_wait1();      /* stage s has landed (this thread's part) */
        __syncthreads();       /* ... everyone's */
        const uint16_t *xb = xs + buf * TM * XS + g * XS + q * 8;
#pragma unroll
        for (int c = 0; c < CPS; c++) {
#pragma unroll
            for (int j = 0; j < NT8; j++) {
                const uint4 xv = *reinterpret_cast<const uint4 *>(xb + j * 8 * XS + c * 32);
                dsq_mma_bf16(acc[j], wa[c].x, wb[c].x, wa[c].y, wb[c].y, xv.x, xv.y);
                dsq_mma_bf16(acc[j], wa[c].z, wb[c].z, wa[c].w, wb[c].w, xv.z, xv.w);
            }
            if (s + 1 < s1) { /* chunk c of the next stage, as soon as its registers are free */
                wa[c] = __ldcs(ra + ((s + 1) * CPS + c) * 4);
                wb[c] = __ldcs(rb + ((s + 1) * CPS + c) * 4);
            }
        }
        __syncthreads(); /* buffer `buf` is refilled by the next stage's copy */
    }

    /* accumulators -> red [TM][RS]: acc[j][0..1] = row g, tokens 8j + 2q,
     * 8j + 2q + 1; acc[j][2..3] = row g + 8 */
    float *red = reinterpret_cast<float *>(xs);
    {
        const int r = warp * 16 + g;
#pragma unroll
        for (int j = 0; j < NT8; j++) {
            const int t = 8 * j + 2 * q;
            red[t * RS + r] = acc[j][0];
            red[(t + 1) * RS + r] = acc[j][1];
            red[t * RS + r + 8] = acc[j][2];
            red[(t + 1) * RS + r + 8] = acc[j][3];
        }
    }
    __syncthreads();
    const int nt = min(RN, a.N - n0); /* live rows of this tile */
    if (a.S > 1) {
        /* partial -> ws[split]; the last block of the tile sums them in split order */
        float *wp = a.ws + (size_t)split * a.T * a.N;
        for (int i = threadIdx.x; i < a.T * RN; i += RW * 32) {
            const int t = i / RN, r = i % RN;
            if (r < nt)
                wp[(size_t)t * a.N + n0 + r] = red[t * RS + r];
        }
        __threadfence();
        __syncthreads();
        if (threadIdx.x == 0)
            last = atomicAdd(&a.tickets[tile], 1) == a.S - 1;
        __syncthreads();
        if (!last)
            return;
        __threadfence(); /* the other splits' partials, written before their tickets */
        for (int i = threadIdx.x; i < a.T * RN; i += RW * 32) {
            const int t = i / RN, r = i % RN;
            if (r < nt) {
                float v = 0.0f;
                for (int sp = 0; sp < a.S; sp++)
                    v += __ldcg(a.ws + ((size_t)sp * a.T + t) * a.N + n0 + r);
                red[t * RS + r] = v;
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

template <int NT8> static size_t smem_bytes() { return (size_t)2 * NT8 * 8 * XS * 2; }

/* The split count: `splits` (0: enough blocks for about half the resident
 * slots, so that enough weight bytes are in flight), never more than the
 * stages, and 1 unless the workspace holds S partials and a ticket per
 * tile. */
static int plan_splits(int splits, unsigned resident, unsigned tiles, const RowsArgs &a, size_t ws_floats,
                       int n_tickets)
{
    if (splits <= 0)
        splits = (int)(resident / (2 * tiles));
    if (splits > a.kstages)
        splits = a.kstages;
    const size_t part = (size_t)a.T * a.N;
    if (splits > 1 && (!a.ws || !a.tickets || (int64_t)tiles > n_tickets))
        splits = 1;
    if (splits > 1 && (size_t)splits * part > ws_floats)
        splits = (int)(ws_floats / part);
    return splits < 1 ? 1 : splits;
}

template <int NT8, int EPI>
static cudaError_t launch_t(RowsArgs a, int splits, size_t ws_floats, int n_tickets, cudaStream_t s)
{
    static int64_t occ; /* blocks per SM, dsq_cu_resident_blocks */
    const unsigned tiles = (unsigned)((a.N + RN - 1) / RN);
    const size_t smem = smem_bytes<NT8>();
    const unsigned res =
        splits > 0 ? 0 : dsq_cu_resident_blocks((const void *)gemm_rows_kernel<NT8, EPI>, RW * 32, smem, &occ);
    a.S = plan_splits(splits, res, tiles, a, ws_floats, n_tickets);
    return dsq_launch_pdl(gemm_rows_kernel<NT8, EPI>, dim3(tiles * (unsigned)a.S), dim3(RW * 32), smem, s, a);
}

template <int EPI>
static cudaError_t launch_e(const RowsArgs &a, int splits, size_t ws_floats, int n_tickets, cudaStream_t s)
{
    switch ((a.T + 7) / 8) { /* runtime rows -> the token-group count of the instance */
    case 1: return launch_t<1, EPI>(a, splits, ws_floats, n_tickets, s);
    case 2: return launch_t<2, EPI>(a, splits, ws_floats, n_tickets, s);
    case 3: return launch_t<3, EPI>(a, splits, ws_floats, n_tickets, s);
    case 4: return launch_t<4, EPI>(a, splits, ws_floats, n_tickets, s);
    case 5: return launch_t<5, EPI>(a, splits, ws_floats, n_tickets, s);
    case 6: return launch_t<6, EPI>(a, splits, ws_floats, n_tickets, s);
    case 7: return launch_t<7, EPI>(a, splits, ws_floats, n_tickets, s);
    default: return launch_t<8, EPI>(a, splits, ws_floats, n_tickets, s);
    }
}

} // namespace

extern "C" int dsq_cu_gemm_rows_ok(int32_t T, int32_t K, const void *x, const dsq_bf16 *w)
{
    return T >= 1 && T <= DSQ_GEMM_ROWS_MAX && K >= XK && K % XK == 0 && ((uintptr_t)x & 15) == 0 &&
           ((uintptr_t)w & 15) == 0;
}

extern "C" size_t dsq_cu_gemm_rows_ws_floats(int32_t T, int32_t N, int32_t splits)
{
    return T > 0 && N > 0 && splits > 1 ? (size_t)splits * T * N : 0;
}

extern "C" dsq_status dsq_cu_gemm_rows(const dsq_bf16 *x, const dsq_bf16 *w, const float *bias, int32_t T, int32_t N,
                                       int32_t K, dsq_epilogue epi, void *y, float *ws, size_t ws_bytes,
                                       int32_t *tickets, int32_t n_tickets, int32_t splits, cudaStream_t stream)
{
    if (!dsq_cu_gemm_rows_ok(T, K, x, w) || N < 1 || !y)
        return dsq_fail(DSQ_ERR_INTERNAL, "gemm (rows): %d rows of %d x %d (needs 1..%d rows, K a multiple of %d, "
                        "16-byte aligned data)", (int)T, (int)N, (int)K, DSQ_GEMM_ROWS_MAX, XK);
    if (epi == DSQ_EPI_SILU_MUL && N % 2 != 0)
        return dsq_fail(DSQ_ERR_INTERNAL, "gemm (rows): silu*mul needs an even row count (got %d)", (int)N);
    if (epi == DSQ_EPI_BIAS && !bias)
        return dsq_fail(DSQ_ERR_INTERNAL, "gemm (rows): bias epilogue without a bias");
    RowsArgs a;
    a.x = reinterpret_cast<const uint16_t *>(x);
    a.w = reinterpret_cast<const uint16_t *>(w);
    a.bias = bias;
    a.y = y;
    a.ws = ws;
    a.tickets = tickets;
    a.T = T;
    a.N = N;
    a.K = K;
    a.kstages = K / XK;
    a.S = 1;
    const size_t wsf = ws ? ws_bytes / sizeof(float) : 0;
    cudaError_t e;
    switch (epi) {
    case DSQ_EPI_STORE: e = launch_e<DSQ_EPI_STORE>(a, splits, wsf, n_tickets, stream); break;
    case DSQ_EPI_BIAS: e = launch_e<DSQ_EPI_BIAS>(a, splits, wsf, n_tickets, stream); break;
    case DSQ_EPI_ADD: e = launch_e<DSQ_EPI_ADD>(a, splits, wsf, n_tickets, stream); break;
    case DSQ_EPI_SILU_MUL: e = launch_e<DSQ_EPI_SILU_MUL>(a, splits, wsf, n_tickets, stream); break;
    default: return dsq_fail(DSQ_ERR_INTERNAL, "gemm (rows): unknown epilogue %d", (int)epi);
    }
    return dsq_cu_status(e, "gemm (rows) kernel");
}
