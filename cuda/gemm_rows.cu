/* gemm_rows.cu - y = epilogue(x W^T) for up to 64 rows of x on the tensor
 * cores, every weight byte read once from memory: the batched decode step's
 * products (batch 9..64), where cuBLASLt streams the weights at ~55% of the
 * bandwidth (docs/performance.md, stop 23) and needs a separate SiLU*mul
 * kernel; and the products with 8- and 4-bit weights (Q8_ROW, Q4_G128:
 * lib/quant_cpu.h) for 1..64 rows, whose codes become the MMA's bf16 A
 * operand in registers (exactly: integers of at most 8 bits).
 *
 * Layout.  A block of 4 warps owns a tile of 64 consecutive rows of W (warp
 * w: rows 16w .. 16w+15) and all T rows ("tokens") of x, over a range of K
 * (its split).  K is walked in stages of 128 (one Q4 group): the stage's x
 * rows [T][128] are copied into shared memory by cp.async (double
 * buffered; tokens >= T are zeros), while each warp streams its own weights
 * straight into registers, ahead of use (__ldcs; 16-byte loads).  Lane
 * (g = lane / 4, q = lane % 4) holds k = 32q .. 32q + 31 of the stage for
 * rows g and g + 8: 4 x 16 bytes of bf16, 2 of Q8 or 1 of Q4 per row, so a
 * ring of 4 x 16 bytes per row holds 1 stage of bf16, 2 of Q8 and 4 of Q4
 * (similar bytes in flight for each format).  The k order inside an MMA is
 * free: the 8 k = 32q + 8c .. + 7 ("chunk" c) of rows g, g + 8 are the A
 * fragments of two m16n8k16 MMAs, and the B fragments are the same 8 k of
 * token 8j + g, one 16-byte shared-memory read per token group j (x rows
 * are padded and their 16-byte chunks XOR-swizzled so that those reads hit
 * distinct banks; stage_x).
 *
 * Quantized codes.  Q4: two codes become a bf16 pair 128 + code with one
 * byte permute and one logic op (quant_decode.cuh), minus the pair
 * 128 + zero: exact integers -16..15 (zero points 0..16); the
 * MMAs of a stage (= group) accumulate separately and are added to the
 * result times the group's scale.  Q8: signed bytes -> floats by the 2^23
 * trick -> bf16 pairs (exact); the row scale multiplies the row's sum at the
 * end.  The only difference from the CPU product (lib/quant_cpu_matmul.c) is the
 * order and grouping of the fp32 additions.
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
 * shared-memory tile of the block's accumulators.  Weights (codes, scales,
 * zeros) are loaded before dsq_pdl_wait() (pdl.cuh): they are constant.
 *
 * On Hopper, gemm_rows_wg.cu's wgmma kernel runs the same products where
 * DSQ_CUDA_ROWS_WG allows (rows_wg_use, gemm_rows.cuh); what both kernels
 * share (arguments, split plan, the end of a tile) is in gemm_rows.cuh. */
#include "gemm_rows.cuh"
#include "gemv_quant.h"
#include "quant_decode.cuh"

namespace {

using namespace dsq_rows;

/* 16-byte words per lane per row per stage (U) and stages in the ring (D). */
template <int WF> struct WTr {
    static constexpr int U = WF == W_BF16 ? 4 : WF == W_Q8 ? 2 : 1;
    static constexpr int D = 4 / U;
};

/* Where 16-byte chunk cc (k = 8cc .. 8cc + 7) of a stage row sits: lanes
 * read chunk 4q + c for q = 0..3 together (with tokens g, g + 1), so the
 * chunk index's low bits are XOR'ed with q: with the 20-chunk row stride
 * the 8 lanes of a quarter warp hit 8 distinct 16-byte bank groups. */
__device__ __forceinline__ int x_slot(int cc) { return cc ^ ((cc >> 2) & 3); }

/* Copy stage s of x (k = s*XK ..) into buffer `dst` [TM][XS]; tokens >= T
 * are zero-filled. One cp.async group. */
template <int TM>
__device__ __forceinline__ void stage_x(const RowsArgs &a, int s, uint16_t *dst)
{
    constexpr int CPR = XK / 8; /* 16-byte chunks per row */
    for (int c = threadIdx.x; c < TM * CPR; c += RW * 32) {
        const int r = c / CPR, cc = c % CPR;
        const uint16_t *src = a.x + (size_t)(r < a.T ? r : 0) * a.K + (size_t)s * XK + cc * 8;
        cp_async16(dst + r * XS + x_slot(cc) * 8, src, r < a.T ? 16 : 0);
    }
    cp_async_commit();
}

/* Chunk c's A registers of one row from its 16-byte word `v` (the word
 * holding chunk c): p[i] = the bf16 pair of k = 8c + 2i, 8c + 2i + 1 (of the
 * lane's 32).  zq: Q4's (128 + zero) pair. */
template <int WF>
__device__ __forceinline__ void chunk_regs(const uint4 &v, int c, uint32_t zq, uint32_t (&p)[4])
{
    if constexpr (WF == W_BF16) {
        p[0] = v.x, p[1] = v.y, p[2] = v.z, p[3] = v.w;
    } else if constexpr (WF == W_Q8) {
        const uint32_t lo = (c & 1) ? v.z : v.x, hi = (c & 1) ? v.w : v.y;
        p[0] = dsq_qd_s8_bf16x2(lo, 0), p[1] = dsq_qd_s8_bf16x2(lo, 1);
        p[2] = dsq_qd_s8_bf16x2(hi, 0), p[3] = dsq_qd_s8_bf16x2(hi, 1);
    } else {
        const uint32_t w = c == 0 ? v.x : c == 1 ? v.y : c == 2 ? v.z : v.w, u = w >> 4;
        const __nv_bfloat162 z = *reinterpret_cast<const __nv_bfloat162 *>(&zq);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const uint32_t b = dsq_qd_q4_bf16x2(w, u, i);
            const __nv_bfloat162 d = __hsub2(*reinterpret_cast<const __nv_bfloat162 *>(&b), z);
            p[i] = *reinterpret_cast<const uint32_t *>(&d);
        }
    }
}

/* One lane's view of its two weight rows. */
template <int WF> struct WRows {
    const uint4 *ra, *rb;   /* rows g, g + 8 at this lane's first word (k = 32q) */
    int na, nb;             /* their row indices (clamped to N - 1) */
    uint4 wa[4], wb[4];     /* ring: word u of ring stage d at [d * U + u] */
    uint32_t sz[WTr<WF>::D]; /* W_Q4: f16 scale of row g | row g + 8 << 16, per ring stage */
    uint32_t zz[WTr<WF>::D]; /* W_Q4: zero of row g | row g + 8 << 16 */

    /* stage s's words (and Q4 scales / zeros) into ring stage d */
    __device__ __forceinline__ void load(const RowsArgs &a, int s, int d)
    {
        constexpr int U = WTr<WF>::U;
#pragma unroll
        for (int u = 0; u < U; u++) {
            wa[d * U + u] = __ldcs(ra + (size_t)s * 4 * U + u);
            wb[d * U + u] = __ldcs(rb + (size_t)s * 4 * U + u);
        }
        if constexpr (WF == W_Q4)
            load_sz(a, s, d);
    }
    __device__ __forceinline__ void load_sz(const RowsArgs &a, int s, int d)
    {
        const uint16_t *sc = static_cast<const uint16_t *>(a.wscale);
        const size_t G = (size_t)a.kstages;
        sz[d] = (uint32_t)__ldg(sc + (size_t)na * G + s) | (uint32_t)__ldg(sc + (size_t)nb * G + s) << 16;
        zz[d] = (uint32_t)__ldg(a.wzero + (size_t)na * G + s) | (uint32_t)__ldg(a.wzero + (size_t)nb * G + s) << 16;
    }
};

template <int WF, int NT8, int EPI>
__global__ void __launch_bounds__(RW * 32) gemm_rows_kernel(RowsArgs a)
{
    constexpr int TM = NT8 * 8, U = WTr<WF>::U, D = WTr<WF>::D;
    extern __shared__ __align__(16) uint16_t xs[]; /* [2][TM][XS]; then the epilogue tile [TM][RS] fp32 */
    __shared__ int last;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, q = lane & 3;
    const int tile = blockIdx.x / a.S, split = blockIdx.x % a.S;
    const int s0 = (int)((int64_t)split * a.kstages / a.S), s1 = (int)((int64_t)(split + 1) * a.kstages / a.S);
    const int n0 = tile * RN;
    /* 16-byte words per W row: 4U per stage (K/8 bf16, K/16 Q8, K/32 Q4) */
    const size_t row_words = (size_t)a.kstages * 4 * U;
    WRows<WF> w;
    w.na = min(n0 + warp * 16 + g, a.N - 1);
    w.nb = min(n0 + warp * 16 + g + 8, a.N - 1);
    w.ra = static_cast<const uint4 *>(a.w) + (size_t)w.na * row_words + q * U;
    w.rb = static_cast<const uint4 *>(a.w) + (size_t)w.nb * row_words + q * U;
#pragma unroll
    for (int d = 0; d < D; d++)
        if (s0 + d < s1) /* s0 < s1: the host keeps S <= kstages */
            w.load(a, s0 + d, d);
    dsq_pdl_wait();
    dsq_pdl_trigger();

    float acc[NT8][4];
#pragma unroll
    for (int j = 0; j < NT8; j++)
        acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
    stage_x<TM>(a, s0, xs);
    for (int sb = s0; sb < s1; sb += D) {
#pragma unroll
        for (int d = 0; d < D; d++) {
            const int s = sb + d;
            if (s < s1) { /* block-uniform */
                const int buf = (s - s0) & 1;
                if (s + 1 < s1) /* the other buffer, free since the barrier ending the previous stage */
                    stage_x<TM>(a, s + 1, xs + (buf ^ 1) * TM * XS);
                else
                    cp_async_commit(); /* an empty group keeps the count */
                cp_async_wait1();      /* stage s has landed (this thread's part) */
                __syncthreads();       /* ... everyone's */
                const uint16_t *xb = xs + buf * TM * XS + g * XS;
                float gacc[WF == W_Q4 ? NT8 : 1][4]; /* W_Q4: this group's sums, before its scale */
                uint32_t zqa = 0, zqb = 0;
                if constexpr (WF == W_Q4) {
#pragma unroll
                    for (int j = 0; j < NT8; j++)
                        gacc[j][0] = gacc[j][1] = gacc[j][2] = gacc[j][3] = 0.0f;
                    zqa = dsq_qd_q4_zero_bf16x2(w.zz[d] & 0xffffu);
                    zqb = dsq_qd_q4_zero_bf16x2(w.zz[d] >> 16);
                }
#pragma unroll
                for (int c = 0; c < 4; c++) {
                    const int slot = d * U + c / D; /* the word holding chunk c */
                    uint32_t pa[4], pb[4];
                    chunk_regs<WF>(w.wa[slot], c % D, zqa, pa);
                    chunk_regs<WF>(w.wb[slot], c % D, zqb, pb);
                    const uint16_t *xc = xb + x_slot(4 * q + c) * 8;
#pragma unroll
                    for (int j = 0; j < NT8; j++) {
                        const uint4 xv = *reinterpret_cast<const uint4 *>(xc + j * 8 * XS);
                        if constexpr (WF == W_Q4) {
                            dsq_mma_bf16(gacc[j], pa[0], pb[0], pa[1], pb[1], xv.x, xv.y);
                            dsq_mma_bf16(gacc[j], pa[2], pb[2], pa[3], pb[3], xv.z, xv.w);
                        } else {
                            dsq_mma_bf16(acc[j], pa[0], pb[0], pa[1], pb[1], xv.x, xv.y);
                            dsq_mma_bf16(acc[j], pa[2], pb[2], pa[3], pb[3], xv.z, xv.w);
                        }
                    }
                    /* the word's last chunk: refill it with stage s + D */
                    if (c % D == D - 1 && s + D < s1) {
                        w.wa[slot] = __ldcs(w.ra + (size_t)(s + D) * 4 * U + c / D);
                        w.wb[slot] = __ldcs(w.rb + (size_t)(s + D) * 4 * U + c / D);
                    }
                }
                if constexpr (WF == W_Q4) {
                    const float sa = __half2float(__ushort_as_half((unsigned short)(w.sz[d] & 0xffffu)));
                    const float sb2 = __half2float(__ushort_as_half((unsigned short)(w.sz[d] >> 16)));
#pragma unroll
                    for (int j = 0; j < NT8; j++) {
                        acc[j][0] = fmaf(sa, gacc[j][0], acc[j][0]);
                        acc[j][1] = fmaf(sa, gacc[j][1], acc[j][1]);
                        acc[j][2] = fmaf(sb2, gacc[j][2], acc[j][2]);
                        acc[j][3] = fmaf(sb2, gacc[j][3], acc[j][3]);
                    }
                    if (s + D < s1)
                        w.load_sz(a, s + D, d);
                }
                __syncthreads(); /* buffer `buf` is refilled by the next stage's copy */
            }
        }
    }

    /* accumulators -> red [TM][RS]: acc[j][0..1] = row g, tokens 8j + 2q,
     * 8j + 2q + 1; acc[j][2..3] = row g + 8; Q8's row scales here */
    float *red = reinterpret_cast<float *>(xs);
    {
        const int r = warp * 16 + g;
        float ra_s = 1.0f, rb_s = 1.0f;
        if constexpr (WF == W_Q8) {
            ra_s = __ldg(static_cast<const float *>(a.wscale) + w.na);
            rb_s = __ldg(static_cast<const float *>(a.wscale) + w.nb);
        }
#pragma unroll
        for (int j = 0; j < NT8; j++) {
            const int t = 8 * j + 2 * q;
            red[t * RS + r] = acc[j][0] * ra_s;
            red[(t + 1) * RS + r] = acc[j][1] * ra_s;
            red[t * RS + r + 8] = acc[j][2] * rb_s;
            red[(t + 1) * RS + r + 8] = acc[j][3] * rb_s;
        }
    }
    __syncthreads();
    finish_tile<EPI, 0>(a, red, tile, split, a.S, n0, &last);
}

/* plan_splits' one-wave fill for quantized T-row products (bf16 plans as
 * before: not measured with it): at 1-2 rows (stop 39,
 * H100: the 4-bit batch-1 step 1.350 vs 1.380 ms with its qkv, o and down
 * on the GEMV, 1.441-1.448 vs 1.465-1.469 without; batch 2 1.486 vs 1.490),
 * not beyond (batch 8: 4-bit 1.815 vs 1.792 ms, INT8 1.884 vs 1.831 with
 * it).  DSQ_CUDA_ROWS_FILL (a measurement knob, read per launch): 0 never,
 * 1 at every row count. */
static bool rows_fill_wave(int T)
{
    const char *e = getenv("DSQ_CUDA_ROWS_FILL");
    if (e && e[0] == '0')
        return false;
    return (e && e[0] == '1') || T <= 2;
}

template <int NT8> static size_t smem_bytes() { return (size_t)2 * NT8 * 8 * XS * 2; }

template <int WF, int NT8, int EPI>
static cudaError_t launch_t(RowsArgs a, int splits, size_t ws_floats, int n_tickets, cudaStream_t s)
{
    static int64_t occ; /* blocks per SM, dsq_cu_resident_blocks */
    const unsigned tiles = (unsigned)((a.N + RN - 1) / RN);
    const size_t smem = smem_bytes<NT8>();
    const unsigned res = splits > 0 ? 0
                                    : dsq_cu_resident_blocks((const void *)gemm_rows_kernel<WF, NT8, EPI>, RW * 32,
                                                             smem, &occ);
    const size_t row_bytes = WF == W_BF16 ? 0 : WF == W_Q8 ? (size_t)a.K : (size_t)a.K / 2; /* 0: no caps */
    a.S = plan_splits(splits, res, tiles, a, ws_floats, n_tickets, row_bytes,
                      row_bytes > 0 && rows_fill_wave(a.T));
    return dsq_launch_pdl(gemm_rows_kernel<WF, NT8, EPI>, dim3(tiles * (unsigned)a.S), dim3(RW * 32), smem, s, a);
}

template <int WF, int EPI>
static cudaError_t launch_e(const RowsArgs &a, int splits, size_t ws_floats, int n_tickets, cudaStream_t s)
{
    if (rows_wg_use(a.T)) /* Hopper: gemm_rows_wg.cu's kernel */
        return rows_wg_launch(WF, (dsq_epilogue)EPI, a, splits, ws_floats, n_tickets, s);
    switch ((a.T + 7) / 8) { /* runtime rows -> the token-group count of the instance */
    case 1: return launch_t<WF, 1, EPI>(a, splits, ws_floats, n_tickets, s);
    case 2: return launch_t<WF, 2, EPI>(a, splits, ws_floats, n_tickets, s);
    case 3: return launch_t<WF, 3, EPI>(a, splits, ws_floats, n_tickets, s);
    case 4: return launch_t<WF, 4, EPI>(a, splits, ws_floats, n_tickets, s);
    case 5: return launch_t<WF, 5, EPI>(a, splits, ws_floats, n_tickets, s);
    case 6: return launch_t<WF, 6, EPI>(a, splits, ws_floats, n_tickets, s);
    case 7: return launch_t<WF, 7, EPI>(a, splits, ws_floats, n_tickets, s);
    default: return launch_t<WF, 8, EPI>(a, splits, ws_floats, n_tickets, s);
    }
}

template <int WF>
static cudaError_t launch_w(const RowsArgs &a, dsq_epilogue epi, int splits, size_t ws_floats, int n_tickets,
                            cudaStream_t s)
{
    switch (epi) {
    case DSQ_EPI_STORE: return launch_e<WF, DSQ_EPI_STORE>(a, splits, ws_floats, n_tickets, s);
    case DSQ_EPI_BIAS: return launch_e<WF, DSQ_EPI_BIAS>(a, splits, ws_floats, n_tickets, s);
    case DSQ_EPI_ADD: return launch_e<WF, DSQ_EPI_ADD>(a, splits, ws_floats, n_tickets, s);
    default: return launch_e<WF, DSQ_EPI_SILU_MUL>(a, splits, ws_floats, n_tickets, s);
    }
}

/* Checks shared by the three entry points, then the launch. */
static dsq_status run(const char *what, int wf, const RowsArgs &a0, dsq_epilogue epi, size_t ws_bytes,
                      int32_t n_tickets, int32_t splits, cudaStream_t stream)
{
    if (a0.N < 1 || !a0.y)
        return dsq_fail(DSQ_ERR_INTERNAL, "%s: %d x %d matrix, output %p", what, a0.N, a0.K, a0.y);
    if (epi == DSQ_EPI_SILU_MUL && a0.N % 2 != 0)
        return dsq_fail(DSQ_ERR_INTERNAL, "%s: silu*mul needs an even row count (got %d)", what, a0.N);
    if (epi == DSQ_EPI_BIAS && !a0.bias)
        return dsq_fail(DSQ_ERR_INTERNAL, "%s: bias epilogue without a bias", what);
    if (epi != DSQ_EPI_STORE && epi != DSQ_EPI_BIAS && epi != DSQ_EPI_ADD && epi != DSQ_EPI_SILU_MUL)
        return dsq_fail(DSQ_ERR_INTERNAL, "%s: unknown epilogue %d", what, (int)epi);
    const size_t wsf = a0.ws ? ws_bytes / sizeof(float) : 0;
    cudaError_t e = wf == W_Q8   ? launch_w<W_Q8>(a0, epi, splits, wsf, n_tickets, stream)
                    : wf == W_Q4 ? launch_w<W_Q4>(a0, epi, splits, wsf, n_tickets, stream)
                                 : launch_w<W_BF16>(a0, epi, splits, wsf, n_tickets, stream);
    return dsq_cu_status(e, what);
}

static RowsArgs make_args(const dsq_bf16 *x, const void *w, const void *scales, const uint8_t *zeros,
                          const float *bias, int32_t T, int32_t N, int32_t K, void *y, float *ws, int32_t *tickets)
{
    RowsArgs a;
    a.x = reinterpret_cast<const uint16_t *>(x);
    a.w = w;
    a.wscale = scales;
    a.wzero = zeros;
    a.bias = bias;
    a.y = y;
    a.ws = ws;
    a.tickets = tickets;
    a.T = T;
    a.N = N;
    a.K = K;
    a.S = 1;
    a.kstages = K / XK;
    return a;
}

} // namespace

extern "C" int dsq_cu_gemm_rows_ok(int32_t T, int32_t K, const void *x, const dsq_bf16 *w)
{
    return T >= 1 && T <= DSQ_GEMM_ROWS_MAX && K >= XK && K % XK == 0 && ((uintptr_t)x & 15) == 0 &&
           ((uintptr_t)w & 15) == 0;
}

extern "C" int dsq_cu_gemm_rows_q_ok(int32_t T, int32_t K, const void *x, const void *q)
{
    return dsq_cu_gemm_rows_ok(T, K, x, static_cast<const dsq_bf16 *>(q));
}

extern "C" size_t dsq_cu_gemm_rows_ws_floats(int32_t T, int32_t N, int32_t splits)
{
    return T > 0 && N > 0 && splits > 1 ? (size_t)splits * T * N : 0;
}

#define ROWS_SHAPE_FAIL(what)                                                                                    \
    dsq_fail(DSQ_ERR_INTERNAL, "%s: %d rows of %d x %d (needs 1..%d rows, K a multiple of %d, 16-byte aligned " \
             "data)", what, (int)T, (int)N, (int)K, DSQ_GEMM_ROWS_MAX, XK)

extern "C" dsq_status dsq_cu_gemm_rows(const dsq_bf16 *x, const dsq_bf16 *w, const float *bias, int32_t T, int32_t N,
                                       int32_t K, dsq_epilogue epi, void *y, float *ws, size_t ws_bytes,
                                       int32_t *tickets, int32_t n_tickets, int32_t splits, cudaStream_t stream)
{
    if (!dsq_cu_gemm_rows_ok(T, K, x, w))
        return ROWS_SHAPE_FAIL("gemm (rows)");
    return run("gemm (rows)", W_BF16, make_args(x, w, NULL, NULL, bias, T, N, K, y, ws, tickets), epi, ws_bytes,
               n_tickets, splits, stream);
}

extern "C" dsq_status dsq_cu_gemm_rows_q8(const dsq_bf16 *x, const int8_t *q, const float *scales, const float *bias,
                                          int32_t T, int32_t N, int32_t K, dsq_epilogue epi, void *y, float *ws,
                                          size_t ws_bytes, int32_t *tickets, int32_t n_tickets, int32_t splits,
                                          cudaStream_t stream)
{
    if (!dsq_cu_gemm_rows_q_ok(T, K, x, q))
        return ROWS_SHAPE_FAIL("gemm (rows, q8)");
    if (!scales)
        return dsq_fail(DSQ_ERR_INTERNAL, "gemm (rows, q8): NULL scales");
    return run("gemm (rows, q8)", W_Q8, make_args(x, q, scales, NULL, bias, T, N, K, y, ws, tickets), epi, ws_bytes,
               n_tickets, splits, stream);
}

extern "C" dsq_status dsq_cu_gemm_rows_q4(const dsq_bf16 *x, const uint8_t *q, const uint16_t *scales,
                                          const uint8_t *zeros, const float *bias, int32_t T, int32_t N, int32_t K,
                                          dsq_epilogue epi, void *y, float *ws, size_t ws_bytes, int32_t *tickets,
                                          int32_t n_tickets, int32_t splits, cudaStream_t stream)
{
    if (!dsq_cu_gemm_rows_q_ok(T, K, x, q))
        return ROWS_SHAPE_FAIL("gemm (rows, q4)");
    if (!scales || !zeros)
        return dsq_fail(DSQ_ERR_INTERNAL, "gemm (rows, q4): NULL scales or zero points");
    return run("gemm (rows, q4)", W_Q4, make_args(x, q, scales, zeros, bias, T, N, K, y, ws, tickets), epi, ws_bytes,
               n_tickets, splits, stream);
}
