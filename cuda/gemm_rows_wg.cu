/* gemm_rows_wg.cu - gemm_rows.cu's products (y = epilogue(x W^T), 1..64
 * rows of x, every weight byte read once) on Hopper's warpgroup MMA
 * (sm_90a wgmma.mma_async, wgmma.cuh), for bf16, Q8_ROW and Q4_G128 W.
 *
 * Why a second kernel.  gemm_rows.cu's mma.sync kernel holds W in
 * registers as the A operand and reads every token group of x from shared
 * memory once per 16 x 8 x 16 MMA: at 64 rows it reaches ~72 TFLOP/s (4-bit
 * gate/up 48.6 us on the H200, docs/performance.md "stop 26"), which keeps
 * the batch-64 step with 4-bit weights at 0.45x bf16's; and for bf16 at 64
 * rows it lost to cuBLASLt (gate/up 52.3 vs 20.8 us), which itself streams
 * the short products (qkv, o, down) at 30-55% of the memory bandwidth.
 * Here one warpgroup (the block's 4 warps) computes the tile D[64 tokens][64
 * W rows] with m64n64k16 wgmma, both operands read by the tensor cores from
 * shared memory in the 128-byte swizzled layout.
 *
 * Layout.  Tiles of RN = 64 W rows, K in stages of XK = 128 (one Q4 group)
 * and split-K as gemm_rows.cu (gemm_rows.cuh: plan_splits, finish_tile),
 * so workspace, tickets and results' summation order per split are alike
 * (the order of the additions inside a stage differs); the split counts
 * are planned here without the quantized cap (launch_wg_e).
 * (Stream-K -- every resident block given an equal range of the (tile,
 * stage) units, tiles cut into segments -- was tried at stop 36 and
 * measured 2-4x slower than split-K on the H100: docs/performance.md.)  A
 * ring of 2, 3 or 4 stage slots (launch_wg_e chooses), each [x tile | W]:
 *   x tile   bf16 [64 tokens][128 k], swizzled (sw()): rows >= T zero
 *   W        bf16: the B tile [64 rows][128 k], swizzled, by cp.async;
 *            quantized: nothing (the codes wait in registers, below)
 * and, for quantized W, two converted B tiles [2][64][128] bf16 (swizzled)
 * that alternate by stage.  Stage s + slots - 1 is copied (cp.async)
 * while stage s computes: slots - 1 stages of x in flight per block.
 *
 * Quantized codes: thread t holds half (64 k) of W row t / 2 for the next
 * stage it converts and the PD - 1 = 3 after it, in registers (load_wr: Q4 32
 * bytes a stage, Q8 64), so that the weight bytes in flight do not depend
 * on the ring (stop 37: staged in the slots, only the ring's two were).
 * They become bf16 exactly (small integers, quant_decode.cuh) in the
 * converted B tile of the next stage while the current stage's MMAs run.
 * Q4: code - zero in the B tile, the group's MMAs go to a separate
 * accumulator that is added times the group scale (per W row: the scales
 * sit in qsc[], loaded a stage ahead); Q8: the row scale multiplies the
 * sum at the end.  The arithmetic differs from the CPU product only in the
 * order and grouping of fp32 additions.
 *
 * Weights are constant, so the first stages' W bytes are requested before
 * dsq_pdl_wait() (pdl.cuh); x after it. */
#include <stdlib.h>

#include "gemm_rows.cuh"
#include "quant_decode.cuh"
#include "wgmma.cuh"

namespace dsq_rows {
namespace {

using namespace dsq_attn; /* the wgmma wrappers */

constexpr int TILE_B = RN * XK * 2;  /* bytes of one swizzled [64][128] bf16 tile: 16 KB */

/* Shared-memory bytes by weight format (after 1024-byte alignment). */
template <int WF, int NSL> struct WgLayout {
    static constexpr int SLOTS = NSL; /* ring slots: stages in flight + 1 (2..4) */
    /* W bytes per stage in the slot: bf16's B tile; quantized W stays in
     * registers (WReg) until converted */
    static constexpr int RAW = WF == W_BF16 ? TILE_B : 0;
    static constexpr int SLOT = TILE_B + RAW;
    static constexpr int QB = WF == W_BF16 ? 0 : 2 * TILE_B; /* converted B tiles */
    static constexpr int BYTES = 1024 + SLOTS * SLOT + QB;
    /* blocks per SM the shared memory allows (227 KB; 1 KB reserved per block
     * plus 1 KB of slack for the static qsc / last), at most 3 */
    static constexpr int PER_SM = 232448 / (BYTES + 1024 + 1024) >= 3 ? 3 : 232448 / (BYTES + 1024 + 1024);
    static_assert(RN * RS * 4 <= SLOTS * SLOT, "the epilogue tile reuses the ring");
    static_assert(PER_SM >= 1, "one block per SM at least");
};

/* Byte offset of 16-byte chunk c (k = 8c .. 8c + 7, c < 16) of row r (< 64)
 * in a [64][128] bf16 tile in wgmma's 128-byte swizzle: two 8 KB column
 * blocks of 64 k, rows of 128 bytes, chunk index XOR'ed with r % 8. */
__device__ __forceinline__ uint32_t sw(int r, int c)
{
    return (uint32_t)((c >> 3) * 8192 + r * 128 + (((c & 7) ^ (r & 7)) << 4));
}

template <int N> __device__ __forceinline__ void cp_async_wait()
{
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

/* x rows < T of stage s into the tile at xt (rows >= T stay zero). */
[[maybe_unused]] __device__ __forceinline__ void load_x(const RowsArgs &a, int s, unsigned char *xt)
{
    for (int i = threadIdx.x; i < a.T * 16; i += RW * 32) {
        const int r = i >> 4, c = i & 15;
        cp_async16(xt + sw(r, c), a.x + (size_t)r * a.K + (size_t)s * XK + c * 8, 16);
    }
}

/* bf16 stage s's B tile, W rows n0 .. n0 + 63 (clamped to N - 1: those
 * columns are never stored), swizzled into wt. */
[[maybe_unused]] __device__ __forceinline__ void load_w(const RowsArgs &a, int s, int n0, unsigned char *wt)
{
    const int t = threadIdx.x;
#pragma unroll
    for (int j = 0; j < 8; j++) {
        const int i = t + j * RW * 32, r = i >> 4, c = i & 15;
        const int n = min(n0 + r, a.N - 1);
        cp_async16(wt + sw(r, c), static_cast<const uint16_t *>(a.w) + (size_t)n * a.K + (size_t)s * XK + c * 8, 16);
    }
}

/* Quantized W in registers: thread t holds half t % 2 of W row t / 2 for
 * the next PD stages it converts (Q4 32 bytes a stage, Q8 64), so
 * that PD stages of weight bytes per block are in flight from memory
 * whatever the x ring's depth (the shared-memory slots held only 2 with a
 * 3-slot ring: stop 36's kernel). */
[[maybe_unused]] constexpr int PD = 4;
template <int WF> struct WReg {
    static constexpr int B = WF == W_Q8 ? 64 : 32; /* bytes per thread per stage */
    static constexpr int N4 = B / 16;
};

/* Stage s's bytes of this thread's half row into r (streaming loads). */
template <int WF>
__device__ __forceinline__ void load_wr(const RowsArgs &a, int s, int n0, uint4 (&r)[WReg<WF>::N4])
{
    constexpr int B = WReg<WF>::B;
    const int t = threadIdx.x, n = min(n0 + (t >> 1), a.N - 1);
    const size_t row = WF == W_Q8 ? (size_t)a.K : (size_t)a.K / 2;
    const uint4 *src = reinterpret_cast<const uint4 *>(static_cast<const unsigned char *>(a.w) + (size_t)n * row +
                                                       (size_t)s * 2 * B + (t & 1) * B);
#pragma unroll
    for (int u = 0; u < B / 16; u++)
        r[u] = __ldcs(src + u);
}

/* Q4: the zero pair (dsq_qd_q4_zero_bf16x2) and the scale of row n's group s. */
[[maybe_unused]] __device__ __forceinline__ void load_zs(const RowsArgs &a, int n, int s, uint32_t &zq, float &sc)
{
    const size_t i = (size_t)n * a.kstages + s;
    zq = dsq_qd_q4_zero_bf16x2(__ldg(a.wzero + i));
    sc = __half2float(__ushort_as_half(__ldg(static_cast<const uint16_t *>(a.wscale) + i)));
}

[[maybe_unused]] __device__ __forceinline__ uint32_t bf16x2_sub(uint32_t x, uint32_t y)
{
    const __nv_bfloat162 d = __hsub2(*reinterpret_cast<const __nv_bfloat162 *>(&x),
                                     *reinterpret_cast<const __nv_bfloat162 *>(&y));
    return *reinterpret_cast<const uint32_t *>(&d);
}

/* This thread's raw bytes of a stage (half h of row r, load_wr) -> its 8
 * chunks of the B tile bt, as bf16 (Q4: code - zero, zq the zero pair). */
template <int WF>
__device__ __forceinline__ void convert_q(const uint4 (&src)[WReg<WF>::N4], unsigned char *bt, uint32_t zq)
{
    const int r = threadIdx.x >> 1, h = threadIdx.x & 1;
    if constexpr (WF == W_Q4) {
#pragma unroll
        for (int u = 0; u < 2; u++) {
            const uint4 v = src[u];
            const uint32_t wv[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
            for (int j = 0; j < 4; j++) { /* word j: k = 8j .. 8j + 7 of the 32 in this 16 bytes */
                const uint32_t w = wv[j], hi = w >> 4;
                uint4 o;
                o.x = bf16x2_sub(dsq_qd_q4_bf16x2(w, hi, 0), zq);
                o.y = bf16x2_sub(dsq_qd_q4_bf16x2(w, hi, 1), zq);
                o.z = bf16x2_sub(dsq_qd_q4_bf16x2(w, hi, 2), zq);
                o.w = bf16x2_sub(dsq_qd_q4_bf16x2(w, hi, 3), zq);
                *reinterpret_cast<uint4 *>(bt + sw(r, 8 * h + 4 * u + j)) = o;
            }
        }
    } else {
        (void)zq;
#pragma unroll
        for (int u = 0; u < 4; u++) { /* 16 codes: chunks 2u, 2u + 1 of the half */
            const uint4 v = src[u];
            uint4 o0, o1;
            o0.x = dsq_qd_s8_bf16x2(v.x, 0), o0.y = dsq_qd_s8_bf16x2(v.x, 1);
            o0.z = dsq_qd_s8_bf16x2(v.y, 0), o0.w = dsq_qd_s8_bf16x2(v.y, 1);
            o1.x = dsq_qd_s8_bf16x2(v.z, 0), o1.y = dsq_qd_s8_bf16x2(v.z, 1);
            o1.z = dsq_qd_s8_bf16x2(v.w, 0), o1.w = dsq_qd_s8_bf16x2(v.w, 1);
            *reinterpret_cast<uint4 *>(bt + sw(r, 8 * h + 2 * u)) = o0;
            *reinterpret_cast<uint4 *>(bt + sw(r, 8 * h + 2 * u + 1)) = o1;
        }
    }
}

/* Stages s0 .. s1 - 1 of tile `tile`: split seg of the tile's nseg; the
 * PDL wait after the first weights are requested; ends in finish_tile. */
template <int WF, int EPI, int NSL>
__device__ __forceinline__ void wg_segment(const RowsArgs &a, unsigned char *sm, int tile, int s0, int s1, int seg,
                                           int nseg, float (*qsc)[RN], int *last)
{
    using L = WgLayout<WF, NSL>;
    constexpr int NS = L::SLOTS;
    constexpr bool QW = WF != W_BF16;
    unsigned char *qb = sm + NS * L::SLOT; /* quantized: B tiles [2][TILE_B] */
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, q = lane & 3;
    const int ns = s1 - s0; /* >= 1 */
    const int n0 = tile * RN;
    const int my_n = min(n0 + (tid >> 1), a.N - 1); /* the W row this thread converts (quantized) */
    auto slot = [&](int i) { return sm + i * L::SLOT; };

    /* quantized: stages s0 .. s0 + PD - 1 into registers (wr[d] holds
     * stages s0 + d + PD j); bf16: the B tiles of the first NS - 1 stages */
    uint4 wr[QW ? PD : 1][QW ? WReg<WF>::N4 : 1];
    if constexpr (QW) {
#pragma unroll
        for (int d = 0; d < PD; d++)
            if (d < ns)
                load_wr<WF>(a, s0 + d, n0, wr[d]);
    } else {
#pragma unroll
        for (int d = 0; d < NS - 1; d++)
            if (d < ns)
                load_w(a, s0 + d, n0, slot(d) + TILE_B);
    }
    /* Q4: zero pair and scale of my_n for the next stage to convert (zq,
     * scv) and the one after (zq_n, sc_n: requested a stage ahead, so that
     * the conversion never waits on these loads) */
    uint32_t zq = 0, zq_n = 0;
    float scv = 0.0f, sc_n = 0.0f;
    if constexpr (WF == W_Q4) {
        load_zs(a, my_n, s0, zq, scv);
        if (ns > 1)
            load_zs(a, my_n, s0 + 1, zq_n, sc_n);
    }
    dsq_pdl_wait();
    dsq_pdl_trigger();

    /* rows >= T of every slot's x tile: zero, never copied over */
    const int zrows = RN - a.T;
    for (int i = tid; i < zrows * 16 * NS; i += RW * 32) {
        const int sl = i / (zrows * 16), rem = i % (zrows * 16);
        *reinterpret_cast<uint4 *>(slot(sl) + sw(a.T + rem / 16, rem % 16)) = make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int d = 0; d < NS - 1; d++) {
        if (d < ns)
            load_x(a, s0 + d, slot(d));
        cp_async_commit(); /* one group per stage (bf16: the W bytes above join group 0) */
    }
    cp_async_wait<NS - 2>(); /* stage s0 (this thread's copies) */
    if constexpr (QW) {
        convert_q<WF>(wr[0], qb, zq);
        if (WF == W_Q4 && (tid & 1) == 0)
            qsc[0][tid >> 1] = scv;
        if (PD < ns)
            load_wr<WF>(a, s0 + PD, n0, wr[0]);
    }
    fence_proxy_async(); /* generic-proxy writes (zeros, converted codes) -> wgmma */
    __syncthreads();

    float acc[8][4], gacc[WF == W_Q4 ? 8 : 1][4];
#pragma unroll
    for (int j = 0; j < 8; j++)
        acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
#pragma unroll
    for (int j = 0; j < (WF == W_Q4 ? 8 : 1); j++)
        gacc[j][0] = gacc[j][1] = gacc[j][2] = gacc[j][3] = 0.0f;

    /* unrolled by PD, so that wr[] is indexed by constants (registers) */
    for (int i0 = 0; i0 < ns; i0 += PD) {
#pragma unroll
    for (int d = 0; d < PD; d++) {
        const int i = i0 + d;
        if (i >= ns)
            break;
        const int s = s0 + i, bb = i & 1;
        unsigned char *cur = slot(i % NS);
        if constexpr (WF == W_Q4) {
            zq = zq_n, scv = sc_n; /* stage s + 1's */
            if (i + 2 < ns)
                load_zs(a, my_n, s + 2, zq_n, sc_n);
        }
        const uint32_t xa = (uint32_t)__cvta_generic_to_shared(cur);
        const uint32_t ba = (uint32_t)__cvta_generic_to_shared(QW ? qb + bb * TILE_B : cur + TILE_B);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < XK / 16; kk++) {
            const uint32_t off = (kk >> 2) * 8192 + (kk & 3) * 32;
            const uint64_t da = wgmma_desc_sw128(xa + off, 16, 1024), db = wgmma_desc_sw128(ba + off, 16, 1024);
            if constexpr (WF == W_Q4)
                wgmma_m64n64k16_ss_bf16(gacc, da, db, kk > 0);
            else
                wgmma_m64n64k16_ss_bf16(acc, da, db, 1);
        }
        wgmma_commit();
        /* while they run: stage s + NS - 1 into the slot stage s - 1
         * used (its MMAs ended before the barrier closing the last
         * iteration), and the next stage's codes converted */
        if (i + NS - 1 < ns) {
            unsigned char *nx = slot((i + NS - 1) % NS);
            if constexpr (!QW)
                load_w(a, s + NS - 1, n0, nx + TILE_B);
            load_x(a, s + NS - 1, nx);
        }
        cp_async_commit();
        cp_async_wait<NS - 2>(); /* stage s + 1 (this thread's copies) */
        if constexpr (QW) {
            if (i + 1 < ns) {
                const int nd = (d + 1) % PD; /* wr slot of stage s + 1 */
                convert_q<WF>(wr[nd], qb + (bb ^ 1) * TILE_B, zq);
                if (WF == W_Q4 && (tid & 1) == 0)
                    qsc[bb ^ 1][tid >> 1] = scv;
                if (i + 1 + PD < ns)
                    load_wr<WF>(a, s + 1 + PD, n0, wr[nd]);
            }
        }
        wgmma_wait0();
        if constexpr (WF == W_Q4) {
            wgmma_pin<8>(gacc);
#pragma unroll
            for (int j = 0; j < 8; j++) {
                const float c0 = qsc[bb][8 * j + 2 * q], c1 = qsc[bb][8 * j + 2 * q + 1];
                acc[j][0] = fmaf(c0, gacc[j][0], acc[j][0]);
                acc[j][1] = fmaf(c1, gacc[j][1], acc[j][1]);
                acc[j][2] = fmaf(c0, gacc[j][2], acc[j][2]);
                acc[j][3] = fmaf(c1, gacc[j][3], acc[j][3]);
            }
        } else {
            wgmma_pin<8>(acc);
        }
        fence_proxy_async();
        __syncthreads(); /* stage s + 1 published; slot of stage s free */
    }
    }
    cp_async_wait_all(); /* only empty groups can be pending here */

    /* accumulators -> red [64][RS]: acc[j][0..1] = token 16 warp + g, W rows
     * 8j + 2q, 8j + 2q + 1; acc[j][2..3] = token + 8; Q8's row scales here */
    float *red = reinterpret_cast<float *>(sm);
    const int t = warp * 16 + g;
#pragma unroll
    for (int j = 0; j < 8; j++) {
        const int r = 8 * j + 2 * q;
        float c0 = 1.0f, c1 = 1.0f;
        if constexpr (WF == W_Q8) {
            const float *rs = static_cast<const float *>(a.wscale);
            c0 = __ldg(rs + min(n0 + r, a.N - 1));
            c1 = __ldg(rs + min(n0 + r + 1, a.N - 1));
        }
        red[t * RS + r] = acc[j][0] * c0;
        red[t * RS + r + 1] = acc[j][1] * c1;
        red[(t + 8) * RS + r] = acc[j][2] * c0;
        red[(t + 8) * RS + r + 1] = acc[j][3] * c1;
    }
    __syncthreads();
    finish_tile<EPI>(a, red, tile, seg, nseg, n0, last);
}

/* One block: tile blockIdx.x / S, split blockIdx.x % S of K. */
template <int WF, int EPI, int NSL>
__global__ void __launch_bounds__(RW * 32, WgLayout<WF, NSL>::PER_SM) wg_kernel(RowsArgs a)
{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    extern __shared__ __align__(16) unsigned char wg_smem[];
    unsigned char *sm = wg_smem + ((1024 - ((uint32_t)__cvta_generic_to_shared(wg_smem) & 1023)) & 1023);
    __shared__ float qsc[2][RN]; /* Q4: group scale per W row, by B tile */
    __shared__ int last;
    const int tile = blockIdx.x / a.S, split = blockIdx.x % a.S;
    const int s0 = (int)((int64_t)split * a.kstages / a.S), s1 = (int)((int64_t)(split + 1) * a.kstages / a.S);
    wg_segment<WF, EPI, NSL>(a, sm, tile, s0, s1, split, a.S, qsc, &last);
#else
    (void)a;
    __trap(); /* never launched: rows_wg_use() asks the probe */
#endif
}

/* Whether the code this device runs has wgmma: a one-thread probe (the
 * host cannot tell which image of the fat binary the driver picked). */
__global__ void wg_probe_kernel(int *out)
{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    *out = 1;
#else
    *out = 0;
#endif
}

int g_wg[DSQ_CU_MAX_DEVICES]; /* per device: 1 = the kernel runs there */
dsq_cu_once wg_once;

template <int WF, int EPI, int NSL> cudaError_t wg_attr()
{
    return cudaFuncSetAttribute(wg_kernel<WF, EPI, NSL>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                WgLayout<WF, NSL>::BYTES);
}

template <int WF, int NSL> cudaError_t wg_attrs_n()
{
    cudaError_t e;
    if ((e = wg_attr<WF, DSQ_EPI_STORE, NSL>()) != cudaSuccess) return e;
    if ((e = wg_attr<WF, DSQ_EPI_BIAS, NSL>()) != cudaSuccess) return e;
    if ((e = wg_attr<WF, DSQ_EPI_ADD, NSL>()) != cudaSuccess) return e;
    return wg_attr<WF, DSQ_EPI_SILU_MUL, NSL>();
}

template <int WF> cudaError_t wg_attrs()
{
    cudaError_t e;
    if ((e = wg_attrs_n<WF, 2>()) != cudaSuccess) return e;
    if ((e = wg_attrs_n<WF, 3>()) != cudaSuccess) return e;
    return wg_attrs_n<WF, 4>();
}

cudaError_t wg_init(int dev)
{
    int *d = NULL, h = 0;
    cudaError_t e = cudaMalloc(&d, sizeof(int));
    if (e != cudaSuccess)
        return e;
    wg_probe_kernel<<<1, 1>>>(d);
    e = cudaGetLastError();
    if (e == cudaSuccess)
        e = cudaMemcpy(&h, d, sizeof(int), cudaMemcpyDeviceToHost);
    cudaFree(d);
    if (e == cudaSuccess && h == 1 && (e = wg_attrs<W_BF16>()) == cudaSuccess &&
        (e = wg_attrs<W_Q8>()) == cudaSuccess)
        e = wg_attrs<W_Q4>();
    if (e == cudaSuccess)
        g_wg[dev] = h == 1; /* published by dsq_cu_once_per_device's release store */
    return e;
}

/* Resident blocks of one instance (cached per instance). */
template <int WF, int EPI, int NSL> unsigned wg_resident()
{
    static int64_t occ; /* blocks per SM, dsq_cu_resident_blocks */
    return dsq_cu_resident_blocks((const void *)wg_kernel<WF, EPI, NSL>, RW * 32, WgLayout<WF, NSL>::BYTES, &occ);
}

template <int WF, int EPI, int NSL> cudaError_t launch_wg_t(RowsArgs a, unsigned tiles, cudaStream_t s)
{
    return dsq_launch_pdl(wg_kernel<WF, EPI, NSL>, dim3(tiles * (unsigned)a.S), dim3(RW * 32),
                          (size_t)WgLayout<WF, NSL>::BYTES, s, a);
}

/* DSQ_CUDA_ROWS_WG_SLOTS=2|3|4 (a measurement knob, read per launch): the
 * ring's slots for every product; unset, the choice below. */
static int wg_slots(void)
{
    const char *e = getenv("DSQ_CUDA_ROWS_WG_SLOTS");
    const int v = e && e[0] ? e[0] - '0' : 0;
    return v >= 2 && v <= 4 ? v : 0;
}

/* DSQ_CUDA_ROWS_WG_PLAN=1 (a measurement knob, read per launch): stop 36's
 * split plan for quantized W (plan_splits' partial-bytes cap, made for the
 * one-output-at-a-time fix-up). */
static bool wg_plan_capped(void)
{
    const char *e = getenv("DSQ_CUDA_ROWS_WG_PLAN");
    return e && e[0] == '1';
}

/* The ring depth and split count.  3 slots (two x stages in flight) unless
 * the launch needs more than one wave of 3-slot blocks and fits one of
 * 2-slot blocks (three per SM): gate/up at 64 rows, 280 tiles over 264 or
 * 396 resident blocks, 25.6 vs 31.1 us (Q4, H100, stop 37) while qkv, o and
 * down were faster on 3 (13.4 vs 16.1 us for qkv).  Splits as plan_splits
 * plans bf16 (about half the resident blocks): the float4 fix-up
 * (gemm_rows.cuh) made partials cheap enough to drop the quantized cap,
 * unless DSQ_CUDA_ROWS_WG_PLAN=1. */
template <int WF, int EPI>
cudaError_t launch_wg_e(RowsArgs a, int splits, size_t wsf, int n_tickets, cudaStream_t s)
{
    const unsigned tiles = (unsigned)((a.N + RN - 1) / RN);
    const size_t rb = !wg_plan_capped() || WF == W_BF16 ? 0 : WF == W_Q8 ? (size_t)a.K : (size_t)a.K / 2;
    int sl = wg_slots();
    unsigned res = 0;
    if (sl == 0) {
        sl = 3;
        res = wg_resident<WF, EPI, 3>();
        const int s3 = plan_splits(splits, res, tiles, a, wsf, n_tickets, rb);
        if (tiles * (unsigned)s3 > res) {
            const unsigned r2 = wg_resident<WF, EPI, 2>();
            if (tiles * (unsigned)plan_splits(splits, r2, tiles, a, wsf, n_tickets, rb) <= r2)
                sl = 2, res = r2;
        }
    } else {
        res = sl == 2 ? wg_resident<WF, EPI, 2>() : sl == 4 ? wg_resident<WF, EPI, 4>() : wg_resident<WF, EPI, 3>();
    }
    a.S = plan_splits(splits, res, tiles, a, wsf, n_tickets, rb);
    switch (sl) { /* runtime choice -> the ring depth of the instance */
    case 2: return launch_wg_t<WF, EPI, 2>(a, tiles, s);
    case 4: return launch_wg_t<WF, EPI, 4>(a, tiles, s);
    default: return launch_wg_t<WF, EPI, 3>(a, tiles, s);
    }
}

template <int WF>
cudaError_t launch_wg_w(dsq_epilogue epi, const RowsArgs &a, int splits, size_t wsf, int n_tickets, cudaStream_t s)
{
    switch (epi) {
    case DSQ_EPI_STORE: return launch_wg_e<WF, DSQ_EPI_STORE>(a, splits, wsf, n_tickets, s);
    case DSQ_EPI_BIAS: return launch_wg_e<WF, DSQ_EPI_BIAS>(a, splits, wsf, n_tickets, s);
    case DSQ_EPI_ADD: return launch_wg_e<WF, DSQ_EPI_ADD>(a, splits, wsf, n_tickets, s);
    default: return launch_wg_e<WF, DSQ_EPI_SILU_MUL>(a, splits, wsf, n_tickets, s);
    }
}

} // namespace

/* DSQ_CUDA_ROWS_WG unset (kDefault = 1): from kMinRows rows.  H100,
 * stop 36 (test_cuda_quant / _kernels timing, split-K as planned): at 64
 * rows Q4 qkv 14.6 vs 17.1 us (mma.sync), gate/up 31.5 vs 48.5, down 38.0
 * vs 43.0, and the batch-64 step with 4-bit weights 4.79 vs 5.71-5.77 ms;
 * at 16 rows slower (qkv 9.6 vs 8.0, gate/up 27.2 vs 21.6, down 21.0 vs
 * 17.4) and at 8 rows the batch-8 4-bit step 2.61 vs 1.81 ms.  bf16
 * products stay with cuBLASLt by default (DSQ_CUDA_GEMM_ROWS off): at 64
 * rows it wins (gate/up 26.0 vs 31.7 us, down 15.4 vs 35.3).  Stop 37
 * (fix-up, W in registers, depth and plan; H100): the batch-32 4-bit step
 * 3.01 ms vs 3.85 on mma.sync, batch 64 3.92-3.96 vs 4.75 (stop 36's
 * kernel); at 16 rows still mixed (Q4 down 25.6 vs 20.8 us, gate/up 22.2
 * vs 25.5), at 8 rows slower (gate/up 26.8 vs 17.1): the threshold stays. */
static const int kDefault = 1;
static const int kMinRows = 32;

bool rows_wg_use(int T)
{
    const char *e = getenv("DSQ_CUDA_ROWS_WG");
    const int v = e && e[0] ? e[0] - '0' : kDefault;
    if (v != 1 && v != 2)
        return false;
    if (v == 1 && T < kMinRows)
        return false;
    int dev = 0;
    if (dsq_cu_once_per_device(&wg_once, wg_init, &dev) != cudaSuccess) {
        (void)cudaGetLastError();
        return false;
    }
    return g_wg[dev] != 0;
}

cudaError_t rows_wg_launch(int wf, dsq_epilogue epi, RowsArgs a, int splits, size_t ws_floats, int n_tickets,
                           cudaStream_t s)
{
    return wf == W_Q8   ? launch_wg_w<W_Q8>(epi, a, splits, ws_floats, n_tickets, s)
           : wf == W_Q4 ? launch_wg_w<W_Q4>(epi, a, splits, ws_floats, n_tickets, s)
                        : launch_wg_w<W_BF16>(epi, a, splits, ws_floats, n_tickets, s);
}

} // namespace dsq_rows

extern "C" dsq_status dsq_cu_gemm_rows_init(void)
{
    return dsq_cu_status(dsq_cu_once_per_device(&dsq_rows::wg_once, dsq_rows::wg_init, NULL),
                         "gemm (rows) setup");
}

extern "C" int dsq_cu_gemm_rows_wg(int32_t T)
{
    return dsq_rows::rows_wg_use(T) ? 1 : 0;
}
