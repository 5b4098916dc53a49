/*
 * attention_decode.cu - decode attention (one query token per sequence),
 * flash-decoding style, for a batch of sequences of different lengths in one
 * launch.
 *
 * Grid = (max_splits, n_kv_heads * ceil(group/16), n_seqs).  Each block owns
 * one kv head of one sequence and a contiguous range of its keys; it reads
 * that range's K and V once for all the kv head's query heads (up to 16,
 * the M rows of the mma tiles: 6 of 16 are live for Qwen2-1.5B; the tensor
 * cores have throughput to spare, memory is the limit).  Tiles of 64 keys
 * stream through a ring of NS shared-memory stages filled by cp.async, or
 * on sm_90 by bulk copies, a row per thread, counted by one mbarrier per
 * stage (BULK, "bulk copies" below; DSQ_CUDA_DECODE_BULK=1, off until
 * measured) (NS-1 tiles in flight while one is computed); warp w takes keys
 * 16w..16w+15 of each tile with its own online-softmax state, and the 4
 * warps are combined in shared memory at the end.  fp16 tiles feed the
 * tensor cores through ldmatrix; int8 tiles stay raw bytes in shared memory
 * and each thread converts the bytes of its own mma fragments in registers
 * (see "INT8 fragments" below): a conversion pass through shared memory
 * made the int8 kernel issue-bound, as slow as fp16 with half the bytes.
 * Each block writes (m, l, acc) of its split to the workspace; a merge
 * kernel rescales and sums the splits.  A launch planned at one split per
 * sequence (max_splits 1: batches of ~100+ sequences) may write the bf16
 * output itself, with the bits the merge kernel would give, and launch no
 * merge (`direct`, the default since stop 40; DSQ_CUDA_DECODE_DIRECT=0 keeps
 * the merge launch).
 *
 * Non-finite K/V: keys past a sequence's end are zero-filled (never read),
 * so every key a block sees is one the query attends to, and a NaN/Inf in
 * its K, V or INT8 scale flows through the scores, weights and P.V into
 * NaN/Inf output (fmaxf in the running max skips a NaN score, but its weight
 * exp2(NaN) is NaN); the merge keeps a NaN or zero sum as NaN.
 *
 * RoPE variant (dsq_attn_decode_rope, decode-only passes): q, k, v come
 * unrotated in fp32 straight from the qkv product, each block rotates its
 * query heads as it loads them, and the last split's block stores the new
 * token's K and V into the cache and into its own ring stage (its loader
 * stops one key short), so the separate RoPE + KV write kernel, one launch
 * per layer, is gone; same bits as that kernel followed by this one.
 *
 * The split plan depends only on the sequence's length (read on the device)
 * and max_splits (fixed per launch shape): blocks past a sequence's last
 * split return at once, so one captured graph serves any lengths.
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>

#include "attention.h"
#include "attention_tile.cuh"
#include "kernels.h"
#include "kv_quant.cuh"
#include "rope.cuh"

namespace dsq_attn {

constexpr int kDecRows = 16;   /* query heads per block (one mma M tile) */
/* Ring depth: the deep ring where the device's per-block shared memory
 * allows it (sm_80, sm_90: 2 blocks of ~105 KB per SM), else 2 stages
 * (sm_86/89 allow 99 KB per block). */
constexpr int kStagesF16 = 3, kStagesI8 = 4;
constexpr int kMaxSplits = 1024;
/* How a launch fills its ring (decode_kernel's LD): cp.async with every
 * chunk's row looked up on its own (the default), bulk copies (sm_90,
 * DSQ_CUDA_DECODE_BULK=1), or cp.async addressed once per tile where the
 * tile is one run of rows (DSQ_CUDA_DECODE_LEAN=1; kv_issue_f16's LEAN).
 * The same bytes land in the same places whichever: the same output bits. */
constexpr int kLdCpAsync = 0, kLdBulk = 1, kLdLean = 2;

/* Shared memory of the decode kernel, in order:
 *   ring [NS] x stage:
 *        fp16: sk [64][D+8], sv [64][D+8] fp16   (ldmatrix reads them)
 *        int8: rk [64][RB],  rv [64][RB]  int8   (raw cache bytes; cp.async:
 *              RB = D, the 16-byte chunk cc of row r at chunk cc ^ (r %
 *              (D/16)); bulk copies, which write whole rows: RB = D + 16,
 *              the pad in place of the swizzle; at D = 128 either way the
 *              fragment reads below are free of bank conflicts -- i8_off)
 *              sks [64], svs [64] fp32           (scales)
 * Q of the block's heads, sq [16][D+8] fp16, sits in the last stage, which
 * the prologue leaves empty and the first iteration refills only after a
 * barrier that follows every warp's Q fragment loads.  The 4-warp combine at
 * the end reuses the ring (sized up to fit it where the ring is smaller). */
template <int D, bool INT8, int NS, bool BULK = false> struct DecSmem {
    static constexpr int kRowH = D + 8;
    static constexpr int kRowI8 = BULK ? D + 16 : D; /* int8 row bytes */
    static constexpr int kQ = kDecRows * kRowH * 2;
    static constexpr int kStage =
        INT8 ? 2 * kTileKeys * kRowI8 + 2 * kTileKeys * 4 : 2 * kTileKeys * kRowH * 2;
    static_assert(kQ <= kStage, "Q must fit in one stage");
    /* the 4-warp combine's row stride (floats): int8 rows carry 4 floats
     * of padding per 32 columns (comb_col), so that each thread's float4
     * stores of its 32 contiguous relabelled columns are conflict-free */
    static constexpr int kCombRow = INT8 ? D + D / 8 : D;
    static constexpr int kComb = (4 * kDecRows * kCombRow + 8 * kDecRows) * 4;
    static constexpr int kTotal = NS * kStage > kComb ? NS * kStage : kComb;
};

/* Split plan of a sequence of `len` keys: splits of `chunk` keys (a multiple
 * of the tile), `used` of them. */
__device__ __forceinline__ void split_plan(int len, int max_splits, int &chunk, int &used)
{
    if (len <= 0) {
        chunk = kTileKeys;
        used = 0;
        return;
    }
    int tiles = (len + kTileKeys - 1) / kTileKeys;
    int ns = min(max_splits, tiles);
    chunk = ((tiles + ns - 1) / ns) * kTileKeys;
    used = (len + chunk - 1) / chunk;
}

/* Stage position (in 16-byte chunks) of chunk cc of raw int8 row r (the
 * swizzle of the int8 stage layout, see DecSmem). */
__device__ __forceinline__ int i8_chunk(int r, int cc, int D) { return cc ^ (r & (D / 16 - 1)); }

/* Byte offset of 16-byte chunk cc of raw int8 row r in a stage: swizzled
 * rows of D bytes (cp.async) or padded rows of D + 16 (PAD: bulk copies).
 * With the pad, row g's chunk c sits (g + c) % 8 chunks into a 128-byte
 * bank line at D = 128, which spreads the fragment reads' 8 rows as the
 * swizzle does.  (At D = 64, a test shape, the 80-byte rows leave the K
 * reads 2-way conflicted and the V reads conflict-free.) */
template <int D, bool PAD> __device__ __forceinline__ int i8_off(int r, int cc)
{
    return PAD ? r * (D + 16) + cc * 16 : r * D + i8_chunk(r, cc, D) * 16;
}

__device__ __forceinline__ void cp_async4(void *dst, const void *src, int src_bytes)
{
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_u32(dst)),
                 "l"(src), "r"(src_bytes));
}
template <int N> __device__ __forceinline__ void cp_async_wait()
{
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

/* ---- bulk copies (sm_90: cp.async.bulk + mbarrier) -------------------------
 * The ring filled by the copy engine instead of cp.async: each thread asks
 * for one whole K or V row (256 bytes at D = 128 in F16, 128 in INT8) with
 * one instruction instead of 16-byte copies (F16: 32 per thread per tile,
 * each with its own address arithmetic), and one mbarrier per stage counts
 * the bytes in.  F16 stage rows are unchanged ([64][D+8]); INT8 rows are
 * padded instead of swizzled (i8_off), and INT8 scales (4 bytes a key, too
 * small for a bulk copy) still come by cp.async, counted on the same
 * barrier.  The arithmetic is the cp.async path's, so are the output bits.
 * Below sm_90 the helpers are never run (the host checks the kernel's PTX
 * version). */
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define DSQ_DEC_BULK_ARCH 1
#else
#define DSQ_DEC_BULK_ARCH 0
#endif

__device__ __forceinline__ void mbar_init(uint64_t *bar, unsigned count)
{
#if DSQ_DEC_BULK_ARCH
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(count));
#endif
}
/* the barriers' initialisation made visible to the copy engine */
__device__ __forceinline__ void mbar_init_fence()
{
#if DSQ_DEC_BULK_ARCH
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void mbar_arrive(uint64_t *bar)
{
#if DSQ_DEC_BULK_ARCH
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_u32(bar)) : "memory");
#endif
}
/* wait until the phase of parity `parity` has completed */
__device__ __forceinline__ void mbar_wait(uint64_t *bar, unsigned parity)
{
#if DSQ_DEC_BULK_ARCH
    asm volatile("{\n"
                 ".reg .pred p;\n"
                 "WAIT_%=:\n"
                 "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
                 "@!p bra WAIT_%=;\n"
                 "}\n" ::"r"(smem_u32(bar)),
                 "r"(parity)
                 : "memory");
#endif
}
/* this thread's generic writes to shared memory ordered before later
 * writes of the copy engine (the async proxy) to the same bytes: each
 * writer fences, then the block meets at a barrier, then copies start */
__device__ __forceinline__ void fence_proxy_async()
{
#if DSQ_DEC_BULK_ARCH
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}
/* this thread's arrival, announcing `bytes` more to come, then the copy of
 * `bytes` (a multiple of 16, both ends 16-byte aligned) from global memory */
__device__ __forceinline__ void bulk_row(void *dst, const void *src, unsigned bytes, uint64_t *bar)
{
#if DSQ_DEC_BULK_ARCH
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(bytes)
                 : "memory");
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                     smem_u32(dst)),
                 "l"(src), "r"(bytes), "r"(smem_u32(bar))
                 : "memory");
#else
    (void)dst, (void)src, (void)bytes, (void)bar;
    __trap();
#endif
}

/* cp.async's completion as an arrival on `bar` (one of the phase's counted
 * arrivals: .noinc), once this thread's earlier cp.async copies have landed */
__device__ __forceinline__ void cp_async_mbar_arrive(uint64_t *bar)
{
#if DSQ_DEC_BULK_ARCH
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(smem_u32(bar)) : "memory");
#endif
}

/* Arrivals a stage's barrier counts per phase: a row each, and for INT8 a
 * scale each (cp.async: 4 bytes, below the bulk copies' 16). */
template <bool INT8> __device__ constexpr unsigned bulk_arrivals() { return INT8 ? 2 * kThreads : kThreads; }

/* Start the bulk copy of keys key0..key0+63 (those < key_end; rows of the
 * others zeroed here) of kv head kvh into ring stage `st` (DecSmem's BULK
 * layout), counted on `bar`: thread t takes row t % 64 of K (t < 64) or V,
 * and for INT8 that row's scale.  A tile that is not `live` (past the
 * split's end) is never waited for, so it neither copies nor arrives. */
template <int D, bool INT8>
__device__ __forceinline__ void dec_issue_bulk(const KvArgs &a, int b, int kvh, int key0, int key_end, bool live,
                                               unsigned char *st, uint64_t *bar)
{
    static_assert(kThreads == 2 * kTileKeys, "one row per thread");
    if (!live)
        return;
    constexpr int RB = INT8 ? D + 16 : (D + 8) * 2; /* stage row bytes */
    constexpr int SB = INT8 ? D : D * 2;            /* cache row bytes */
    const int t = threadIdx.x, r = t & (kTileKeys - 1), is_v = t >= kTileKeys;
    const bool ok = key0 + r < key_end;
    const int64_t run = kv_run_row_lean(a, b, key0, kTileKeys); /* static caches: no division */
    const int64_t kr = ok ? kv_tile_row(a, b, kvh, key0, r, run) : 0;
    unsigned char *row = st + (is_v ? kTileKeys * RB : 0) + r * RB;
    if (INT8) { /* zero where !ok: a finite weight for a row of zeros */
        float *sc = (float *)(st + 2 * kTileKeys * RB) + (is_v ? kTileKeys : 0) + r;
        cp_async4(sc, (is_v ? a.vs : a.ks) + kr, ok ? 4 : 0);
        cp_async_mbar_arrive(bar);
    }
    if (ok) {
        bulk_row(row, (const unsigned char *)(is_v ? a.v : a.k) + kr * SB, SB, bar);
    } else {
#pragma unroll
        for (int c = 0; c < SB / 16; c++)
            *(uint4 *)(row + c * 16) = make_uint4(0, 0, 0, 0);
        mbar_arrive(bar);
    }
}

/* Start copying keys key0..key0+63 (those < key_end; others zero) of kv head
 * kvh into ring stage `st` (one cp.async group per call; an empty one for a
 * tile that is not `live`, past the split's end).  LEAN: the K/V rows by
 * kv_issue_lean where it can (attention_tile.cuh), for INT8 too. */
template <int D, bool INT8, bool LEAN = false>
__device__ __forceinline__ void dec_issue(const KvArgs &a, int b, int kvh, int key0, int key_end, bool live,
                                          unsigned char *st)
{
    const int t = threadIdx.x;
    constexpr int RH = D + 8;
    if (!live) { /* past the end: an empty group keeps the counting */
        cp_async_commit();
        return;
    }
    if (!INT8) {
        kv_issue_f16<D, false, LEAN>(a, b, kvh, key0, key_end, (__half *)st, (__half *)st + kTileKeys * RH);
    } else {
        int8_t *rk = (int8_t *)st, *rv = rk + kTileKeys * D;
        float *sks = (float *)(rv + kTileKeys * D), *svs = sks + kTileKeys;
        constexpr int CPR = D / 16;
        const int64_t run = LEAN ? kv_run_row_lean(a, b, key0, kTileKeys) : kv_run_row(a, b, key0, kTileKeys);
        if (!(LEAN && kv_issue_lean<CPR>(a, b, kvh, key0, key_end, run, (unsigned char *)rk, (unsigned char *)rv,
                                         [](int r, int c) { return r * D + i8_chunk(r, c, D) * 16; }))) {
#pragma unroll
            for (int i = 0; i < kTileKeys * CPR / kThreads; i++) {
                int c = t + i * kThreads, r = c / CPR, cc = c % CPR;
                bool ok = key0 + r < key_end;
                int64_t off = ok ? kv_tile_row(a, b, kvh, key0, r, run) * D + cc * 16 : 0;
                const int sw = i8_chunk(r, cc, D) * 16; /* swizzled chunk */
                cp_async16(rk + r * D + sw, (const int8_t *)a.k + off, ok ? 16 : 0);
                cp_async16(rv + r * D + sw, (const int8_t *)a.v + off, ok ? 16 : 0);
            }
        }
        /* threads 0..63: K scales, 64..127: V scales */
        int r = t & (kTileKeys - 1);
        bool ok = key0 + r < key_end;
        int64_t si = ok ? kv_tile_row(a, b, kvh, key0, r, run) : 0;
        cp_async4((t < kTileKeys ? sks : svs) + r, (t < kTileKeys ? a.ks : a.vs) + si, ok ? 4 : 0);
    }
    cp_async_commit();
}

/* ---- INT8 fragments ---------------------------------------------------------
 * The int8 kernel builds the fp16 B fragments of its two products straight
 * from the raw bytes in the ring, in registers, with the head dimension
 * relabelled so that each thread's bytes are contiguous (a sum over d, or a
 * set of output columns, does not care how d is numbered):
 *
 * Q.K^T, k-step kk, B[k = d][n = key]: thread (g = lane/4, c = lane%4)
 *   holds key g of each 8-key block and logical dims 16kk + {2c, 2c+1} (b0),
 *   16kk + {2c+8, 2c+9} (b1).  Logical dim (kk, j) of thread c is physical
 *   dim c*D/4 + 4kk + j (j = 0..3 for 2c, 2c+1, 2c+8, 2c+9), so a thread's
 *   D/4 bytes of a key are one or two 16-byte chunks, word kk = k-step kk.
 *   Q is staged into sq in the same logical order (q_logical_col).
 * P.V, n-block nb, B[k = key][n = d]: thread holds keys {2c, 2c+1} (b0),
 *   {2c+8, 2c+9} (b1) and logical dim 8nb + g, physical g*D/8 + nb: a
 *   thread's D/8 bytes of a key are contiguous; two keys' words are
 *   interleaved byte by byte (prmt) into key pairs.  The output column
 *   8nb + n of the accumulators is physical dim n*D/8 + nb (o_phys_col).
 *
 * Conversion is i8x4_to_h4 (exact); scales multiply the scores (K) and the
 * weights (V) as before. */

/* Logical sq column of physical head dim p (the Q.K^T relabelling). */
template <int D> __device__ __forceinline__ int q_logical_col(int p)
{
    const int c = p / (D / 4), rem = p % (D / 4), kk = rem >> 2, j = rem & 3;
    return 16 * kk + (j < 2 ? 2 * c + j : 8 + 2 * c + j - 2);
}

/* Physical head dim of logical output column n of n-block nb (P.V): thread
 * c's columns 2c, 2c+1 of every n-block are physical dims c*D/4 .. c*D/4 +
 * D/4 - 1, contiguous. */
template <int D> __host__ __device__ constexpr int o_phys_col(int nb, int n) { return n * (D / 8) + nb; }

/* Position of physical dim d in a padded int8 combine row (kCombRow). */
__device__ __forceinline__ int comb_col(int d) { return d + 4 * (d >> 5); }

/* s[2][4] = Q (A fragments, relabelled) . K^T of the 16 raw keys at stage
 * rows row0 .. row0+15 (K scales not applied). */
template <int D, bool PAD>
__device__ __forceinline__ void qk16_i8(float s[2][4], const uint32_t (*qf)[4], const int8_t *rk, int row0)
{
    const int lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
    constexpr int CPT = D / 64; /* 16-byte chunks per thread per key: 2 or 1 */
#pragma unroll
    for (int nb = 0; nb < 2; nb++) {
        const int r = row0 + nb * 8 + g;
        uint32_t w[D / 16];
#pragma unroll
        for (int q = 0; q < CPT; q++) {
            const uint4 v = *(const uint4 *)(rk + i8_off<D, PAD>(r, c * CPT + q));
            w[4 * q] = v.x;
            w[4 * q + 1] = v.y;
            w[4 * q + 2] = v.z;
            w[4 * q + 3] = v.w;
        }
#pragma unroll
        for (int kk = 0; kk < D / 16; kk++) {
            uint32_t b0, b1;
            i8x4_to_h4(w[kk], b0, b1);
            mma16816(s[nb], qf[kk], b0, b1);
        }
    }
}

/* The D/8 raw bytes of stage row r that thread g holds in P.V (physical
 * dims g*D/8 ..), as words. */
template <int D, bool PAD> __device__ __forceinline__ void v_words(const int8_t *rv, int r, int g, uint32_t *w)
{
    if (D == 128) {
        const uint4 v = *(const uint4 *)(rv + i8_off<D, PAD>(r, g));
        w[0] = v.x;
        w[1] = v.y;
        w[2] = v.z;
        w[3] = v.w;
    } else { /* D == 64: half a chunk */
        const uint2 v = *(const uint2 *)(rv + i8_off<D, PAD>(r, g >> 1) + (g & 1) * 8);
        w[0] = v.x;
        w[1] = v.y;
    }
}

/* o[D/8][4] += P (A fragment over the 16 keys) . V of the 16 raw keys at
 * stage rows row0 .. row0+15 (V scales already in P); o's columns are
 * relabelled (o_phys_col). */
template <int D, bool PAD>
__device__ __forceinline__ void pv16_i8(float (*o)[4], const uint32_t pa[4], const int8_t *rv, int row0)
{
    const int lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
    constexpr int NW = D / 32; /* words per thread per key */
    uint32_t w[4][NW];         /* keys 2c, 2c+1, 2c+8, 2c+9 */
    v_words<D, PAD>(rv, row0 + 2 * c, g, w[0]);
    v_words<D, PAD>(rv, row0 + 2 * c + 1, g, w[1]);
    v_words<D, PAD>(rv, row0 + 2 * c + 8, g, w[2]);
    v_words<D, PAD>(rv, row0 + 2 * c + 9, g, w[3]);
#pragma unroll
    for (int wi = 0; wi < NW; wi++) {
        uint32_t b0[4], b1[4]; /* n-blocks 4wi .. 4wi+3 */
        i8x4_to_h4(__byte_perm(w[0][wi], w[1][wi], 0x5140), b0[0], b0[1]);
        i8x4_to_h4(__byte_perm(w[0][wi], w[1][wi], 0x7362), b0[2], b0[3]);
        i8x4_to_h4(__byte_perm(w[2][wi], w[3][wi], 0x5140), b1[0], b1[1]);
        i8x4_to_h4(__byte_perm(w[2][wi], w[3][wi], 0x7362), b1[2], b1[3]);
#pragma unroll
        for (int j = 0; j < 4; j++)
            mma16816(o[4 * wi + j], pa, b0[j], b1[j]);
    }
}

/* The new token's K and V of one (sequence, kv head), as the ROPE variant's
 * last split computes them: thread t < D holds the pair (i, i + D/2) of K
 * (t < D/2) or V, rotated (K) and rounded to bf16 exactly as
 * rope_kv_write_kernel does, then in the cache's format: two fp16 (lo, hi
 * halves of `bits`) or two int8 (low bytes) and the vector's scale. */
struct NewKV {
    uint32_t bits;
    float scale;
};

template <int D, bool INT8>
__device__ __forceinline__ NewKV new_kv(float x0, float x1, float c, float sn, float *xmax, int *xfin)
{
    constexpr int half = D / 2;
    const int t = threadIdx.x;
    const bool live = t < D, is_v = t >= half;
    float f0 = 0.f, f1 = 0.f;
    if (live) {
        if (!is_v)
            dsq_rope_rot(x0, x1, c, sn);
        f0 = __bfloat162float(__float2bfloat16_rn(x0));
        f1 = __bfloat162float(__float2bfloat16_rn(x1));
    }
    NewKV r;
    r.scale = 0.f;
    if (!INT8) {
        __half2 h2 = __halves2half2(dsq_kv_f16(f0), dsq_kv_f16(f1));
        r.bits = *reinterpret_cast<uint32_t *>(&h2);
        return r;
    }
    /* max |x| over each side's D values: D/2 lanes = 1 or 2 warps per side */
    float amax = fmaxf(fabsf(f0), fabsf(f1));
    bool finite = isfinite(f0) && isfinite(f1);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    finite = __all_sync(0xffffffffu, finite);
    if ((t & 31) == 0) {
        xmax[t >> 5] = amax;
        xfin[t >> 5] = finite;
    }
    __syncthreads();
    if (live) {
        constexpr int WPS = half >= 32 ? half / 32 : 1; /* warps per side */
        const int w0 = (t / half) * WPS;
        for (int w = 0; w < WPS; w++) {
            amax = fmaxf(amax, xmax[w0 + w]);
            finite = finite && xfin[w0 + w];
        }
    }
    r.scale = dsq_kv_i8_scale(amax, finite);
    r.bits = (uint32_t)(dsq_kv_i8(f0, r.scale) & 0xff) | (uint32_t)(dsq_kv_i8(f1, r.scale) & 0xff) << 8;
    return r;
}

/* workspace: acc [n_seqs][n_heads][max_splits][D] f32, then
 *            ml  [n_seqs][n_heads][max_splits][2] f32 (running max m in
 *                log2 units, sum l)
 * direct (max_splits 1 only): no workspace writes; out[b][h][d] bf16 (row
 * stride o_stride) = the merge kernel's value for one split, acc / l (0
 * for an empty sequence).
 *
 * ROPE: q is the fp32 q|k|v product row of each sequence's new token (stride
 * q_stride floats), not yet rotated, and the token is at position len-1:
 * each block rotates its query heads while loading them (the bits the RoPE
 * kernel would have stored), and the block of the last split writes the new
 * K and V into the cache and into its own ring stage, in place of the tile
 * loader's copy (the loader stops one key short there: no block reads the
 * row through global memory in the kernel that writes it). */
template <int D, bool INT8, int NS, bool ROPE, int LD>
__global__ void __launch_bounds__(kThreads)
    decode_kernel(KvArgs a, const void *q_in, int64_t q_stride, const float *inv_freq,
                  const int32_t *seq_lens, int n_heads, int group, int n_hg, int max_splits,
                  float scale_log2, float *ws_acc, float *ws_ml, __nv_bfloat16 *out, int64_t o_stride,
                  int direct)
{
    constexpr bool BULK = LD == kLdBulk, LEAN = LD == kLdLean;
    using SM = DecSmem<D, INT8, NS, BULK>;
    constexpr int RI = SM::kRowI8;
    constexpr int RH = D + 8;
    extern __shared__ __align__(16) unsigned char smem[];
    __shared__ float xmax[kThreads / 32];
    __shared__ int xfin[kThreads / 32];
    __shared__ __align__(8) uint64_t bars[BULK ? NS : 1]; /* BULK: one per ring stage */
    unsigned char *ring = smem;
    __half *sq = (__half *)(ring + (NS - 1) * SM::kStage);

    const int split = blockIdx.x, b = blockIdx.z;
    const int kvh = blockIdx.y / n_hg, hg = blockIdx.y % n_hg;
    /* programmatic dependent launch (pdl.cuh): q, K/V and seq_lens come from
     * the kernels before; every block waits, early exits too.  ROPE: only q
     * does -- this kernel writes the step's new K/V itself, and seq_lens,
     * the block table and the older keys were written before the pass's
     * first kernel (attention.h) -- so the first tiles are requested before
     * the wait, while the qkv product drains */
    if (!ROPE) {
        dsq_pdl_wait();
        dsq_pdl_trigger();
    }
    const int len = seq_lens[b];
    int chunk, used;
    split_plan(len, max_splits, chunk, used);
    const int h0 = kvh * group + hg * kDecRows;
    const int nrows = min(kDecRows, group - hg * kDecRows);
    const int t = threadIdx.x, warp = t >> 5, lane = t & 31;
    if (split >= used) {
        if (ROPE) {
            dsq_pdl_wait();
            dsq_pdl_trigger();
        }
        if (direct && used == 0) /* an empty sequence: the merge's 0 (after the wait: out may be in use before) */
            for (int idx = t; idx < nrows * D; idx += kThreads)
                out[(int64_t)b * o_stride + (h0 + idx / D) * D + idx % D] = __float2bfloat16_rn(0.f);
        return;
    }
    const int kstart = split * chunk, kend = min(len, kstart + chunk);
    const int n_tiles = (kend - kstart + kTileKeys - 1) / kTileKeys;
    /* ROPE: the last split holds the new key, len - 1, and loads one less */
    const bool writer = ROPE && split == used - 1;
    const int kload = writer ? kend - 1 : kend;

    if (BULK) {
        if (t == 0) {
            for (int s = 0; s < NS; s++)
                mbar_init(bars + s, bulk_arrivals<INT8>());
            mbar_init_fence();
        }
        __syncthreads();
    }
    /* K/V first (the long latency), then Q while they are in flight */
#pragma unroll
    for (int s = 0; s < NS - 1; s++) {
        if (BULK)
            dec_issue_bulk<D, INT8>(a, b, kvh, kstart + s * kTileKeys, kload, s < n_tiles, ring + s * SM::kStage,
                                    bars + s);
        else
            dec_issue<D, INT8, LEAN>(a, b, kvh, kstart + s * kTileKeys, kload, s < n_tiles, ring + s * SM::kStage);
    }
    if (ROPE) {
        dsq_pdl_wait();
        dsq_pdl_trigger();
    }
    NewKV nkv = {0u, 0.f};
    if (ROPE) {
        /* thread t's pairs all have i = t % (D/2) (kThreads is a multiple
         * of D/2), so one angle per thread and no shared table; every load
         * is issued before the first use: one global latency */
        static_assert(kThreads % (D / 2) == 0 && kDecRows * D / 2 % kThreads == 0, "pairs per thread");
        constexpr int NP = kDecRows * D / 2 / kThreads;
        const float *row = (const float *)q_in + (int64_t)b * q_stride;
        const int i = t % (D / 2);
        float qx[NP][2];
#pragma unroll
        for (int k = 0; k < NP; k++) {
            const int r = (t + k * kThreads) / (D / 2);
            qx[k][0] = r < nrows ? row[(h0 + r) * D + i] : 0.f;
            qx[k][1] = r < nrows ? row[(h0 + r) * D + i + D / 2] : 0.f;
        }
        float kv0 = 0.f, kv1 = 0.f; /* the new K (t < D/2) or V (t < D) pair */
        if (writer && t < D) {
            const float *src = row + (int64_t)(n_heads + (t >= D / 2 ? a.n_kv : 0) + kvh) * D;
            kv0 = src[i];
            kv1 = src[i + D / 2];
        }
        float c, sn;
        dsq_rope_cs(len - 1, inv_freq[i], c, sn);
#pragma unroll
        for (int k = 0; k < NP; k++) {
            const int r = (t + k * kThreads) / (D / 2);
            float x0 = qx[k][0], x1 = qx[k][1];
            if (r < nrows)
                dsq_rope_rot(x0, x1, c, sn);
            /* bf16 as the RoPE kernel stores q, then fp16 as bf16x8_to_h8 */
            const __nv_bfloat162 bq = __floats2bfloat162_rn(x0, x1);
            uint4 w = make_uint4(*reinterpret_cast<const uint32_t *>(&bq), 0u, 0u, 0u);
            const uint32_t h = bf16x8_to_h8(w).x;
            sq[r * RH + (INT8 ? q_logical_col<D>(i) : i)] = __ushort_as_half((unsigned short)(h & 0xffffu));
            sq[r * RH + (INT8 ? q_logical_col<D>(i + D / 2) : i + D / 2)] =
                __ushort_as_half((unsigned short)(h >> 16));
        }
        if (writer) { /* block-uniform */
            nkv = new_kv<D, INT8>(kv0, kv1, c, sn, xmax, xfin);
            if (hg == 0 && t < D) {
                const int half = D / 2, is_v = t >= half;
                const int64_t crow = kv_row(a, b, len - 1);
                const int64_t off = (crow * a.n_kv + kvh) * D;
                if (!INT8) {
                    __half *dst = (__half *)(is_v ? a.v : a.k) + off;
                    dst[i] = __ushort_as_half((unsigned short)(nkv.bits & 0xffffu));
                    dst[i + half] = __ushort_as_half((unsigned short)(nkv.bits >> 16));
                } else {
                    int8_t *dst = (int8_t *)(is_v ? a.v : a.k) + off;
                    dst[i] = (int8_t)(nkv.bits & 0xffu);
                    dst[i + half] = (int8_t)(nkv.bits >> 8);
                    if (i == 0)
                        ((float *)(is_v ? a.vs : a.ks))[crow * a.n_kv + kvh] = nkv.scale;
                }
            }
        }
    } else {
        const __nv_bfloat16 *q = (const __nv_bfloat16 *)q_in;
        for (int c = t; c < kDecRows * D / 8; c += kThreads) {
            int r = c / (D / 8), cc = c % (D / 8);
            uint4 val = make_uint4(0, 0, 0, 0);
            if (r < nrows)
                val = bf16x8_to_h8(*(const uint4 *)(q + (int64_t)b * q_stride + (h0 + r) * D + cc * 8));
            if (!INT8) {
                *(uint4 *)(sq + r * RH + cc * 8) = val;
            } else { /* relabelled columns (INT8 fragments) */
                const uint32_t wv[4] = {val.x, val.y, val.z, val.w};
#pragma unroll
                for (int e = 0; e < 8; e++)
                    sq[r * RH + q_logical_col<D>(cc * 8 + e)] =
                        __ushort_as_half((unsigned short)(wv[e >> 1] >> (16 * (e & 1))));
            }
        }
    }
    /* BULK: Q's stage is the copy engine's next (the only bytes of the ring
     * written both ways before the last tile; zero rows and the new key's
     * row are in the last tile, never refilled) */
    if (BULK)
        fence_proxy_async();
    __syncthreads();
    uint32_t qf[D / 16][4];
    load_q_frags<D>(qf, sq);
    float o[D / 8][4];
#pragma unroll
    for (int i = 0; i < D / 8; i++)
        o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
    float m_r[2] = {-INFINITY, -INFINITY}, l_r[2] = {0.f, 0.f};

    for (int j = 0; j < n_tiles; j++) {
        if (BULK)
            mbar_wait(bars + j % NS, (unsigned)(j / NS) & 1u); /* tile j has landed */
        else
            cp_async_wait<NS - 2>(); /* tile j has landed (this thread's part) */
        __syncthreads();                 /* ... everyone's; stage j-1 is free      */
        {
            const int jn = j + NS - 1; /* empty group past the end keeps counts */
            if (BULK)
                dec_issue_bulk<D, INT8>(a, b, kvh, kstart + jn * kTileKeys, kload, jn < n_tiles,
                                        ring + (jn % NS) * SM::kStage, bars + jn % NS);
            else
                dec_issue<D, INT8, LEAN>(a, b, kvh, kstart + jn * kTileKeys, kload, jn < n_tiles,
                                   ring + (jn % NS) * SM::kStage);
        }
        const int key0 = kstart + j * kTileKeys;
        if (writer && j == n_tiles - 1) { /* the new key's row of this stage */
            unsigned char *st = ring + (j % NS) * SM::kStage;
            const int rr = kend - 1 - key0, half = D / 2, i = t % half, is_v = t >= half;
            if (t < D) {
                if (!INT8) {
                    __half *row = (__half *)st + (is_v ? kTileKeys * RH : 0) + rr * RH;
                    row[i] = __ushort_as_half((unsigned short)(nkv.bits & 0xffffu));
                    row[i + half] = __ushort_as_half((unsigned short)(nkv.bits >> 16));
                } else {
                    int8_t *side = (int8_t *)st + (is_v ? kTileKeys * RI : 0);
                    side[i8_off<D, BULK>(rr, i >> 4) + (i & 15)] = (int8_t)(nkv.bits & 0xffu);
                    side[i8_off<D, BULK>(rr, (i + half) >> 4) + ((i + half) & 15)] = (int8_t)(nkv.bits >> 8);
                    if (i == 0)
                        ((float *)(st + 2 * kTileKeys * RI))[(is_v ? kTileKeys : 0) + rr] = nkv.scale;
                }
            }
            __syncthreads();
        }
        const int wkey0 = key0 + warp * 16;
        if (wkey0 >= kend)
            continue;
        unsigned char *st = ring + (j % NS) * SM::kStage;
        const int8_t *rk = (const int8_t *)st, *rv = rk + kTileKeys * RI; /* int8 */
        const float *tks = (const float *)(rv + kTileKeys * RI) + warp * 16, *tvs = tks + kTileKeys;
        float s[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
        if (!INT8)
            qk_16keys<D>(s, qf, (const __half *)st + warp * 16 * RH);
        else
            qk16_i8<D, BULK>(s, qf, rk, warp * 16);
        float mt[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int nb = 0; nb < 2; nb++) {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int kl = nb * 8 + 2 * (lane & 3) + (e & 1);
                float x = s[nb][e] * scale_log2;
                if (INT8)
                    x *= tks[kl];
                if (wkey0 + kl >= kend)
                    x = -INFINITY;
                s[nb][e] = x;
                mt[e >> 1] = fmaxf(mt[e >> 1], x);
            }
        }
        float mu[2];
        online_rescale<D, LEAN>(m_r, l_r, o, mt, mu); /* LEAN: o left alone where no max moved */
        float p[2][4];
#pragma unroll
        for (int nb = 0; nb < 2; nb++) {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                float pe = online_weight(s[nb][e], mu, l_r, e >> 1);
                if (INT8)
                    pe *= tvs[nb * 8 + 2 * (lane & 3) + (e & 1)];
                p[nb][e] = pe;
            }
        }
        uint32_t pa[4] = {pack_half2(p[0][0], p[0][1]), pack_half2(p[0][2], p[0][3]),
                          pack_half2(p[1][0], p[1][1]), pack_half2(p[1][2], p[1][3])};
        if (!INT8)
            pv_16keys<D>(o, pa, (const __half *)st + kTileKeys * RH + warp * 16 * RH);
        else
            pv16_i8<D, BULK>(o, pa, rv, warp * 16);
    }
    if (!BULK)
        cp_async_wait<0>(); /* only empty groups can remain; keep the ring quiet */
    __syncthreads();    /* all warps done with the ring */

    /* combine the 4 warps in the ring area */
    constexpr int CR = SM::kCombRow;
    float *racc = (float *)ring;               /* [4][16][CR] */
    float *rm = racc + 4 * kDecRows * CR;      /* [4][16]    */
    float *rl = rm + 4 * kDecRows;             /* [4][16]    */
    {
        const int g = lane >> 2;
#pragma unroll
        for (int r = 0; r < 2; r++) {
            float l = quad_sum(l_r[r]);
            float *row = racc + (warp * kDecRows + g + 8 * r) * CR;
            const int c = lane & 3;
            if (!INT8) {
#pragma unroll
                for (int i = 0; i < D / 8; i++)
                    *(float2 *)(row + i * 8 + 2 * c) = make_float2(o[i][2 * r], o[i][2 * r + 1]);
            } else { /* relabelled: columns o_phys_col(i, 2c + e) = c*D/4 + e*D/8 + i */
                static_assert(o_phys_col<D>(0, 1) == D / 8, "relabelling");
#pragma unroll
                for (int m = 0; m < D / 16; m++) {
                    const int e = 4 * m >= D / 8, i0 = 4 * m - e * (D / 8);
                    *(float4 *)(row + comb_col(c * (D / 4) + 4 * m)) =
                        make_float4(o[i0][2 * r + e], o[i0 + 1][2 * r + e], o[i0 + 2][2 * r + e],
                                    o[i0 + 3][2 * r + e]);
                }
            }
            if ((lane & 3) == 0) {
                rm[warp * kDecRows + g + 8 * r] = m_r[r];
                rl[warp * kDecRows + g + 8 * r] = l;
            }
        }
    }
    __syncthreads();
    for (int idx = t; idx < nrows * D; idx += kThreads) {
        const int r = idx / D, d = idx % D;
        float M = -INFINITY;
#pragma unroll
        for (int w = 0; w < 4; w++)
            M = fmaxf(M, rm[w * kDecRows + r]);
        float acc = 0.f, L = 0.f;
#pragma unroll
        for (int w = 0; w < 4; w++) {
            float mw = rm[w * kDecRows + r];
            float f = mw == -INFINITY ? 0.f : exp2f(mw - M);
            acc += f * racc[(w * kDecRows + r) * CR + (INT8 ? comb_col(d) : d)];
            L += f * rl[w * kDecRows + r];
        }
        if (direct) {
            /* the merge kernel over one split: weight exp2(M - M) = 1, sum
             * 0 + 1 * acc (so -0 becomes +0 there too), then acc / L */
            out[(int64_t)b * o_stride + (h0 + r) * D + d] = __float2bfloat16_rn(__fadd_rn(0.f, acc) / L);
            continue;
        }
        const int64_t slot = ((int64_t)b * n_heads + h0 + r) * max_splits + split;
        ws_acc[slot * D + d] = acc;
        if (d == 0)
            *(float2 *)(ws_ml + slot * 2) = make_float2(M, L);
    }
}

/* One block of D threads per (head, sequence):
 * out = sum_s acc_s 2^(m_s-M) / sum_s l_s 2^(m_s-M).  The split weights are
 * computed once into shared memory so that the D threads' sums over splits
 * are independent loads (no chain of dependent L2 round trips). */
template <int D>
__global__ void __launch_bounds__(D)
    decode_merge_kernel(const float *ws_acc, const float *ws_ml, const int32_t *seq_lens,
                        int n_heads, int max_splits, __nv_bfloat16 *out, int64_t o_stride, int early_from)
{
    __shared__ float wsp[kMaxSplits];
    __shared__ float red[D / 32];
    const int h = blockIdx.x, b = blockIdx.y, d = threadIdx.x;
    const int lane = d & 31, warp = d >> 5;
    /* seq_lens is the pass's metadata, never written by the decode kernel
     * before this one: read it (one global round trip) before the wait */
    const int len = seq_lens[b];
    int chunk, used;
    split_plan(len, max_splits, chunk, used);
    /* early trigger (pdl.cuh) from `early_from` splits of this sequence
     * (0: never): decided by the splits the sequence uses, not the
     * launch's max_splits, which follows the context's capacity */
    const bool early = early_from > 0 && used >= early_from;
    if (early) /* the o_proj GEMV streams its weights during attention */
        dsq_pdl_trigger();
    dsq_pdl_wait(); /* the partials of the decode kernel before it */
    if (!early)
        dsq_pdl_trigger();
    const int64_t slot0 = ((int64_t)b * n_heads + h) * max_splits;

    float M = -INFINITY;
    for (int s = d; s < used; s += D)
        M = fmaxf(M, ws_ml[(slot0 + s) * 2]);
    for (int o = 16; o > 0; o >>= 1)
        M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, o));
    if (lane == 0)
        red[warp] = M;
    __syncthreads();
    M = red[0];
#pragma unroll
    for (int w = 1; w < D / 32; w++)
        M = fmaxf(M, red[w]);
    __syncthreads();

    float L = 0.f;
    for (int s = d; s < used; s += D) {
        float2 ml = *(const float2 *)(ws_ml + (slot0 + s) * 2);
        float f = exp2f(ml.x - M);
        wsp[s] = f;
        L += f * ml.y;
    }
    for (int o = 16; o > 0; o >>= 1)
        L += __shfl_xor_sync(0xffffffffu, L, o);
    if (lane == 0)
        red[warp] = L;
    __syncthreads();
    L = 0.f;
#pragma unroll
    for (int w = 0; w < D / 32; w++)
        L += red[w];

    float acc = 0.f;
    const float *src = ws_acc + slot0 * D + d;
#pragma unroll 8
    for (int s = 0; s < used; s++)
        acc += wsp[s] * src[(int64_t)s * D];
    /* L = NaN (a NaN score or V) or 0 (every score -inf) must give NaN, as
     * the CPU's softmax does, not a finite 0; only an empty sequence (no
     * split used) outputs 0 */
    out[(int64_t)b * o_stride + h * D + d] = __float2bfloat16_rn(used > 0 ? acc / L : 0.f);
}

/* per-block shared-memory opt-in limit of each device (decode_init) */
static int g_smem_optin[DSQ_CU_MAX_DEVICES];
/* per device: 1 where the decode kernel's code has the bulk copies (built
 * for sm_90 or later and run on such a device) */
static int g_bulk[DSQ_CU_MAX_DEVICES];

template <int D, bool INT8, int NS, int LD> static cudaError_t set_decode_attr_one(int optin)
{
    using SM = DecSmem<D, INT8, NS, LD == kLdBulk>;
    if (SM::kTotal > optin)
        return cudaSuccess; /* not used on this device */
    cudaError_t e = cudaFuncSetAttribute(decode_kernel<D, INT8, NS, false, LD>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, SM::kTotal);
    if (e != cudaSuccess)
        return e;
    return cudaFuncSetAttribute(decode_kernel<D, INT8, NS, true, LD>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                SM::kTotal);
}

template <int D, bool INT8, int NS> static cudaError_t set_decode_attr(int optin)
{
    cudaError_t e = set_decode_attr_one<D, INT8, NS, kLdCpAsync>(optin);
    if (e == cudaSuccess)
        e = set_decode_attr_one<D, INT8, NS, kLdBulk>(optin);
    return e != cudaSuccess ? e : set_decode_attr_one<D, INT8, NS, kLdLean>(optin);
}

/* The attributes of the current device, `dev` (kernel attributes are per
 * device). */
cudaError_t decode_init(int dev)
{
    int optin = 0;
    cudaError_t e = cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
    if (e != cudaSuccess)
        return e;
    if ((e = set_decode_attr<128, false, kStagesF16>(optin)) != cudaSuccess) return e;
    if ((e = set_decode_attr<128, false, 2>(optin)) != cudaSuccess) return e;
    if ((e = set_decode_attr<128, true, kStagesI8>(optin)) != cudaSuccess) return e;
    if ((e = set_decode_attr<128, true, 2>(optin)) != cudaSuccess) return e;
    if ((e = set_decode_attr<64, false, kStagesF16>(optin)) != cudaSuccess) return e;
    if ((e = set_decode_attr<64, false, 2>(optin)) != cudaSuccess) return e;
    if ((e = set_decode_attr<64, true, kStagesI8>(optin)) != cudaSuccess) return e;
    if ((e = set_decode_attr<64, true, 2>(optin)) != cudaSuccess) return e;
    /* the PTX the driver runs for this device: below 9.0 the bulk helpers
     * compiled to nothing (a fat binary without sm_90 code on an H100) */
    cudaFuncAttributes fa;
    if ((e = cudaFuncGetAttributes(&fa, decode_kernel<128, false, kStagesF16, true, kLdBulk>)) != cudaSuccess)
        return e;
    g_bulk[dev] = fa.ptxVersion >= 90;
    g_smem_optin[dev] = optin; /* published by dsq_cu_once_per_device's release store */
    return cudaSuccess;
}

static size_t ws_floats(int64_t n_seqs, int64_t n_heads, int64_t head_dim, int64_t max_splits)
{
    return (size_t)(n_seqs * n_heads * max_splits * (head_dim + 2));
}

} /* namespace dsq_attn */

using namespace dsq_attn;

extern "C" size_t dsq_attn_decode_workspace_bytes(int32_t max_batch, int32_t n_heads,
                                                  int32_t head_dim, int32_t max_splits)
{
    if (max_batch <= 0 || n_heads <= 0 || head_dim <= 0 || max_splits <= 0)
        return 0;
    return ws_floats(max_batch, n_heads, head_dim, max_splits) * sizeof(float);
}

/* An integer knob read once per process (slot: -1 before the first read):
 * the variable's value where it lies in lo..hi, else 0 (none). */
static int64_t env_once(int *slot, const char *name, int lo, int hi)
{
    int v = __atomic_load_n(slot, __ATOMIC_RELAXED);
    if (v < 0) {
        const char *e = getenv(name);
        v = e && *e ? atoi(e) : 0;
        v = v >= lo && v <= hi ? v : 0;
        __atomic_store_n(slot, v, __ATOMIC_RELAXED);
    }
    return v;
}

/* DSQ_CUDA_DECODE_SPLITS_MAX=k (k >= 1): at most k splits per sequence, a
 * measurement knob (read once; it can only lower the count, so workspaces
 * sized with this function stay large enough). */
static int64_t splits_cap_env(void)
{
    static int cap = -1;
    return env_once(&cap, "DSQ_CUDA_DECODE_SPLITS_MAX", 1, INT_MAX);
}

/* DSQ_CUDA_DECODE_BLOCKS_PER_SM=k (1..8): the split plan's wave target, k
 * blocks per SM for either dtype instead of 2 (F16) / 3 (INT8); a
 * measurement knob, read once, so that the workspace a context sizes at
 * creation and the plans of its passes agree.  With DSQ_CUDA_DECODE_STAGES=2
 * an F16 launch can hold 3 blocks per SM (shared memory 2 x 35 KB a block,
 * registers <= 168): stop 20 measured that ring only at 2 splits for batch
 * 64, a grid of 256 blocks that never fills a third slot. */
static int64_t blocks_per_sm_env(void)
{
    static int per_sm = -1;
    return env_once(&per_sm, "DSQ_CUDA_DECODE_BLOCKS_PER_SM", 1, 8);
}

extern "C" int32_t dsq_attn_decode_splits(int32_t n_seqs, int32_t n_kv_heads,
                                          int32_t max_context, int32_t n_sms, int32_t kv_dtype)
{
    /* about one wave of resident blocks: 2 per SM for F16 (a 104 KB ring),
     * 3 for INT8 (68 KB, 74 KB with bulk copies; registers allow 3).  Measured on H200 (graph
     * replay, context 4096, test_cuda_attention): batch 64 F16 fastest at
     * 2 splits (74 us, 81% of 4.48 TB/s; 3: 90, 4: 79), INT8 at 3 (50 us;
     * 2: 66, 4: 63); batch 1 at 32-64 splits; a split below one tile of 64
     * keys only adds merge work */
    const int64_t per_sm_env = blocks_per_sm_env();
    const int64_t per_sm = per_sm_env > 0 ? per_sm_env : kv_dtype == DSQ_ATTN_KV_INT8 ? 3 : 2;
    int64_t units = (int64_t)(n_seqs > 0 ? n_seqs : 1) * (n_kv_heads > 0 ? n_kv_heads : 1);
    int64_t target = per_sm * (int64_t)(n_sms > 0 ? n_sms : 132);
    int64_t s = target / units;
    int64_t cap = (max_context + kTileKeys - 1) / kTileKeys;
    if (s > cap)
        s = cap;
    if (s > 256)
        s = 256;
    const int64_t cap_env = splits_cap_env();
    if (cap_env > 0 && s > cap_env)
        s = cap_env;
    return (int32_t)(s < 1 ? 1 : s);
}

static cudaError_t attn_init_device(int dev)
{
    cudaError_t e = prefill_init(dev);
    return e == cudaSuccess ? decode_init(dev) : e;
}

static dsq_cu_once attn_once;

/* The current device's setup, once; *dev receives the device. */
static cudaError_t attn_ready(int *dev) { return dsq_cu_once_per_device(&attn_once, attn_init_device, dev); }

extern "C" dsq_status dsq_attn_init(void) { return dsq_cu_status(attn_ready(NULL), "attention kernel setup"); }

/* Whether a one-split launch writes its output itself (decode_kernel's
 * `direct`): yes unless DSQ_CUDA_DECODE_DIRECT=0 (read per launch).  H100,
 * stop 40 (`scripts/gpu_session.sh direct`): batch 256 @ 1,024, INT8 KV
 * 5.428 / 5.464 vs 5.521 / 5.512 ms per sampled step with the merge
 * launch, no logits 4.502 vs 4.621, F16 KV 6.088 vs 6.208; batches of 64
 * and 128 plan more splits and are unchanged. */
static bool decode_direct_env(void)
{
    const char *e = getenv("DSQ_CUDA_DECODE_DIRECT");
    return !(e && e[0] == '0');
}

/* How launches fill their ring (decode_kernel's LD; read per launch, both
 * knobs off until measured): bulk copies with DSQ_CUDA_DECODE_BULK=1 on
 * devices whose code has them, else lean cp.async with
 * DSQ_CUDA_DECODE_LEAN=1, else cp.async (dsq_attn_decode_loader). */
static int decode_loader(int dev)
{
    const char *e = getenv("DSQ_CUDA_DECODE_BULK");
    if (g_bulk[dev] && e && e[0] == '1')
        return kLdBulk;
    e = getenv("DSQ_CUDA_DECODE_LEAN");
    return e && e[0] == '1' ? kLdLean : kLdCpAsync;
}
static_assert(kLdCpAsync == DSQ_ATTN_LOADER_CP_ASYNC && kLdBulk == DSQ_ATTN_LOADER_BULK &&
                  kLdLean == DSQ_ATTN_LOADER_LEAN,
              "loader numbers");

/* dsq_attn_decode and dsq_attn_decode_rope: q_in is bf16 (rope false) or
 * the fp32 product row (rope true; inv_freq then set). */
static dsq_status decode_launch(const dsq_attn_kv *kv, const void *q_in, int64_t q_stride, bool rope,
                                const float *inv_freq, void *out, int64_t o_stride, const int32_t *seq_lens,
                                int32_t n_seqs, int32_t n_heads, int32_t max_splits, void *workspace,
                                size_t workspace_bytes, cudaStream_t stream)
{
    const char *fn = rope ? "decode attention + RoPE" : "decode attention";
    if (!kv_ok(kv) || n_seqs < 0 || n_heads <= 0 || n_heads % kv->n_kv_heads ||
        max_splits <= 0 || max_splits > kMaxSplits || n_seqs > 65535)
        return dsq_fail(DSQ_ERR_INTERNAL, "%s: %d sequences, %d heads over a cache of %d KV heads, "
                        "%d splits (1..%d; or a cache kv_ok() refuses)", fn, (int)n_seqs, (int)n_heads,
                        kv ? (int)kv->n_kv_heads : 0, (int)max_splits, kMaxSplits);
    if (n_seqs == 0)
        return DSQ_OK;
    const int D = kv->head_dim;
    const int group = n_heads / kv->n_kv_heads;
    const int n_hg = (group + kDecRows - 1) / kDecRows;
    /* bf16 q: 16-byte loads; fp32 rows: scalar loads, any stride that holds
     * the q|k|v heads */
    const int64_t q_min = rope ? (int64_t)(n_heads + 2 * kv->n_kv_heads) * D : (int64_t)n_heads * D;
    if (!q_in || !out || !seq_lens || !workspace || !aligned16(workspace) || (rope && !inv_freq) ||
        (!rope && (!aligned16(q_in) || q_stride % 8)) || q_stride < q_min || o_stride < (int64_t)n_heads * D ||
        workspace_bytes < ws_floats(n_seqs, n_heads, D, max_splits) * sizeof(float) ||
        (int64_t)kv->n_kv_heads * n_hg > 65535)
        return dsq_fail(DSQ_ERR_INTERNAL, "%s: a NULL or misaligned pointer, strides q %lld (>= %lld%s) / out %lld "
                        "(>= %d), or a workspace of %zu bytes (%zu needed)", fn, (long long)q_stride,
                        (long long)q_min, rope ? "" : ", a multiple of 8", (long long)o_stride, (int)n_heads * D,
                        workspace_bytes, ws_floats(n_seqs, n_heads, D, max_splits) * sizeof(float));
    int dev = 0;
    cudaError_t e = attn_ready(&dev);
    if (e != cudaSuccess)
        return dsq_cu_status(e, "attention kernel setup");
    /* DSQ_CUDA_DECODE_STAGES=2: the 2-stage ring even where the deep one
     * fits (3 blocks per SM instead of 2 by shared memory; a measurement
     * knob, read per launch) */
    const char *stg = getenv("DSQ_CUDA_DECODE_STAGES");
    const int smem_optin = stg && stg[0] == '2' ? 0 : g_smem_optin[dev];
    KvArgs a = kv_args(kv);
    const float scale_log2 = (float)(1.4426950408889634 / sqrt((double)D));
    float *ws_acc = (float *)workspace;
    float *ws_ml = ws_acc + (size_t)n_seqs * n_heads * max_splits * D;
    dim3 grid((unsigned)max_splits, (unsigned)(kv->n_kv_heads * n_hg), (unsigned)n_seqs);
    const bool i8 = kv->dtype == DSQ_ATTN_KV_INT8;
    const int direct = max_splits == 1 && decode_direct_env();
    /* runtime (head_dim, dtype, ring depth, rope, loader) -> the kernel instance */
    const int ld = decode_loader(dev);
#define DSQ_DECODE_LAUNCH(DD, I8, NS, RO, LD)                                                             \
    e = dsq_launch_pdl(decode_kernel<DD, I8, NS, RO, LD>, grid, dim3(kThreads),                            \
                       (size_t)DecSmem<DD, I8, NS, LD == kLdBulk>::kTotal, stream, a, q_in, q_stride, inv_freq, \
                       seq_lens, n_heads, group, n_hg, max_splits, scale_log2, ws_acc, ws_ml,                 \
                       (__nv_bfloat16 *)out, o_stride, direct)
#define DSQ_DECODE_ROPE(DD, I8, NS, LD)              \
    do {                                             \
        if (rope)                                    \
            DSQ_DECODE_LAUNCH(DD, I8, NS, true, LD);  \
        else                                         \
            DSQ_DECODE_LAUNCH(DD, I8, NS, false, LD); \
    } while (0)
#define DSQ_DECODE_RING(DD, I8, NS, LD)                                \
    do {                                                               \
        if (DecSmem<DD, I8, NS, LD == kLdBulk>::kTotal <= smem_optin) \
            DSQ_DECODE_ROPE(DD, I8, NS, LD);                           \
        else                                                           \
            DSQ_DECODE_ROPE(DD, I8, 2, LD);                            \
    } while (0)
#define DSQ_DECODE_LOADER(DD, I8, NS)                \
    do {                                             \
        if (ld == kLdBulk)                           \
            DSQ_DECODE_RING(DD, I8, NS, kLdBulk);    \
        else if (ld == kLdLean)                      \
            DSQ_DECODE_RING(DD, I8, NS, kLdLean);    \
        else                                         \
            DSQ_DECODE_RING(DD, I8, NS, kLdCpAsync); \
    } while (0)
#define DSQ_DECODE_HEAD_DIM(DD)                          \
    do {                                                 \
        if (i8)                                          \
            DSQ_DECODE_LOADER(DD, true, kStagesI8);      \
        else                                             \
            DSQ_DECODE_LOADER(DD, false, kStagesF16);    \
    } while (0)
    if (D == 128)
        DSQ_DECODE_HEAD_DIM(128);
    else
        DSQ_DECODE_HEAD_DIM(64);
#undef DSQ_DECODE_HEAD_DIM
#undef DSQ_DECODE_LOADER
#undef DSQ_DECODE_RING
#undef DSQ_DECODE_ROPE
#undef DSQ_DECODE_LAUNCH
    if (e != cudaSuccess)
        return dsq_cu_status(e, rope ? "decode attention + RoPE kernel" : "decode attention kernel");
    if (direct)
        return DSQ_OK;
    dim3 mgrid((unsigned)n_heads, (unsigned)n_seqs);
    const int em = dsq_pdl_early();
    const int early = (em & DSQ_PDL_EARLY_MERGE) ? 1 : (em & DSQ_PDL_EARLY_MERGE_LONG) ? DSQ_PDL_EARLY_MERGE_SPLITS : 0;
    if (D == 128)
        e = dsq_launch_pdl(decode_merge_kernel<128>, mgrid, dim3(128), 0, stream, ws_acc, ws_ml, seq_lens, n_heads,
                           max_splits, (__nv_bfloat16 *)out, o_stride, early);
    else
        e = dsq_launch_pdl(decode_merge_kernel<64>, mgrid, dim3(64), 0, stream, ws_acc, ws_ml, seq_lens, n_heads,
                           max_splits, (__nv_bfloat16 *)out, o_stride, early);
    return dsq_cu_status(e, "decode attention merge kernel");
}

extern "C" int32_t dsq_attn_decode_loader(void)
{
    int dev = 0;
    if (attn_ready(&dev) != cudaSuccess)
        return kLdCpAsync;
    return decode_loader(dev);
}

extern "C" dsq_status dsq_attn_decode(const dsq_attn_kv *kv, const void *q, int64_t q_stride,
                                       void *out, int64_t o_stride, const int32_t *seq_lens,
                                       int32_t n_seqs, int32_t n_heads, int32_t max_splits,
                                       void *workspace, size_t workspace_bytes,
                                       cudaStream_t stream)
{
    return decode_launch(kv, q, q_stride, false, NULL, out, o_stride, seq_lens, n_seqs, n_heads, max_splits,
                         workspace, workspace_bytes, stream);
}

extern "C" dsq_status dsq_attn_decode_rope(const dsq_attn_kv *kv, const float *qkv, int64_t row_stride,
                                            const float *inv_freq, void *out, int64_t o_stride,
                                            const int32_t *seq_lens, int32_t n_seqs, int32_t n_heads,
                                            int32_t max_splits, void *workspace, size_t workspace_bytes,
                                            cudaStream_t stream)
{
    return decode_launch(kv, qkv, row_stride, true, inv_freq, out, o_stride, seq_lens, n_seqs, n_heads,
                         max_splits, workspace, workspace_bytes, stream);
}
