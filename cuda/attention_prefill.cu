/*
 * attention_prefill.cu - causal prefill attention, FlashAttention-2 style.
 *
 * Block = 4 warps = 64 query rows (16 per warp) of one query head of one
 * batch sequence; grid = (ceil(max_q_len/64), n_heads, n_seqs).  K/V stream
 * from the cache (any mix of previously cached and new tokens, static or
 * paged) through two shared-memory buffers of 64 keys: while the warps
 * compute on one, the next is in flight (cp.async for fp16; for int8, 16-byte
 * register loads that are dequantized to fp16 after the compute).  S = QK^T
 * and O += PV are mma.sync m16n8k16 (fp16 in, fp32 accumulate); P never
 * leaves registers (the C fragment of S is re-packed as the A fragment of
 * PV).  Softmax is online, in fp32, base 2.  GQA: head h reads kv head
 * h / group directly; the 6 query heads of one kv head read the same tiles,
 * which the L2 serves after the first.
 *
 * Hopper (WG = true; sm_90a code on an sm_90 device, FP16 caches by
 * default): the same block as one warpgroup, the two products as
 * wgmma.mma_async (wgmma.cuh) -- S = QK^T as 64 x 64 with Q's fragments
 * from registers and K a K-major operand, O += PV as 64 x D with P's
 * fragments from registers and V an N-major operand -- so the K/V tiles sit
 * in the 128-byte swizzled layout (attention_tile.cuh's tile_chunk), 1 KB
 * aligned, published to the tensor cores with fence.proxy.async after each
 * write (cp.async, the INT8 conversion, the V screen).  Every warp computes
 * every tile (the warpgroup issues together); the masking and the online
 * softmax are the mma.sync kernel's.
 *
 * INT8: K's per-token scale multiplies the fp32 scores (exact: q.(k*s) =
 * (q.k)*s up to rounding), V's scale multiplies P before it is rounded to
 * fp16 (the row sum l uses the unscaled P).
 *
 * Non-finite K/V (see attention.h): a NaN or Inf that a row attends to must
 * reach its output, and one it does not attend to must not.  NaN/Inf in K
 * or a K scale gives a NaN/Inf score, hence a NaN weight, for the rows that
 * see it; a causally masked key's score is replaced by -inf, so its K
 * cannot leak.  V is different: P.V runs on the tensor cores for all 16 rows
 * of a warp at once, and a masked key's weight 0 times a NaN (or Inf) V is
 * still NaN.  So tiles that hold keys after some row of the block (the
 * "diagonal" tiles, at most two per block) are screened first: non-finite V
 * values (fp16) or V scales (int8) are zeroed in shared memory and the key
 * is flagged; each row that attends to a flagged key outputs NaN.
 *
 * Split over keys (flash-decoding for prompts): a block walks its query
 * tile's keys one tile of 64 after another, so a short prompt (8 query
 * tiles x 12 heads = 96 blocks for 512 tokens on 132 SMs) or a chunk that
 * extends a long sequence (up to 64 tiles per block for a 512-token chunk at
 * offset 3,584) runs a long serial chain on a part-empty GPU.  With a
 * workspace, the launcher gives each query tile's keys to up to n_split
 * blocks of split_tiles tiles each (grid.z = n_seqs x n_split); a query tile
 * with one split writes its output as before, one with more writes each
 * split's unnormalised (o, m, l) to the workspace (l = NaN for a row that
 * saw a non-finite V), and prefill_merge_kernel combines them.
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>
#include <stdlib.h>

#include "attention.h"
#include "attention_tile.cuh"
#include "kernels.h" /* dsq_cu_status */
#include "wgmma.cuh"

namespace dsq_attn {

constexpr int kPrefillRows = 64; /* query rows per block */
/* Split over keys only where the longest query tile walks at least this
 * many key tiles: a split saves (tiles - tiles per split) tile steps of
 * ~1-1.5 us and costs the merge launch, ~2-3 us (H100, test_cuda_attention
 * timing, stop 32: 128 rows, 2 tiles, 9.98 us split vs 8.63 not; 512 rows,
 * 8 tiles, 16.18 vs 19.05) */
constexpr int kPrefillSplitMinTiles = 4;

/* Dynamic shared memory: two stages of K and V tiles (attention_tile.cuh's
 * layouts: padded for mma.sync, swizzled for wgmma, which also needs up to
 * 1 KB to align them), fp16, Q [64][D + 8], INT8 scales.  (Q staged in the
 * second K/V stage, so that three wgmma blocks fit an SM at 168 registers,
 * measured slower for short prompts and chunks at 1,536 and faster only at
 * 3,584: H200, 512 tokens 17.5 vs 15.2 us, chunk at 1,536 42.2 vs 39.7, at
 * 3,584 65.5 vs 74.4, 4,096-token prompt 271 vs 275.) */
template <int D, bool WG> constexpr int prefill_smem_bytes()
{
    return kPrefillRows * (D + 8) * 2 + 2 * 2 * kTileKeys * (WG ? D : D + 8) * 2 + 2 * 2 * kTileKeys * 4 +
           (WG ? 1024 : 0);
}

/* Screen one diagonal tile's V (see the top): zero non-finite V values
 * (fp16: exponent all ones) or INT8 V scales in place, and set bad[k] for
 * every key k of the tile that had one.  All threads; returns whether this
 * thread found one (the caller syncs with __syncthreads_or, so the common
 * all-finite tile skips the per-key flag scan). */
template <int D, bool INT8, bool SW>
__device__ __forceinline__ bool screen_v(__half *sv, float *svs, int *bad)
{
    const int t = threadIdx.x;
    if (INT8) { /* int8 values are finite; a NaN scale marks a bad vector */
        bool b = false;
        if (t < kTileKeys) {
            const float s = svs[t];
            b = !isfinite(s);
            if (b)
                svs[t] = 0.f;
            bad[t] = b;
        }
        return b;
    }
    constexpr int CPR = D / 8; /* 16-byte chunks per row: 16 or 8 lanes */
    const int lane = t & 31;
    bool any = false;
#pragma unroll
    for (int i = 0; i < kTileKeys * CPR / kThreads; i++) {
        const int c = t + i * kThreads, r = c / CPR, cc = c % CPR;
        uint4 *p = (uint4 *)(sv + tile_chunk<D, SW>(r, cc));
        uint4 w = *p;
        uint32_t wd[4] = {w.x, w.y, w.z, w.w};
        bool b = false;
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const bool lo = (wd[k] & 0x7c00u) == 0x7c00u, hi = (wd[k] & 0x7c000000u) == 0x7c000000u;
            wd[k] &= (lo ? 0xffff0000u : 0xffffffffu) & (hi ? 0x0000ffffu : 0xffffffffu);
            b = b || lo || hi;
        }
        if (b)
            *p = make_uint4(wd[0], wd[1], wd[2], wd[3]);
        /* the CPR lanes of one row are consecutive and aligned in the warp */
        const unsigned grp = __ballot_sync(0xffffffffu, b) >> (lane & ~(CPR - 1));
        if ((lane & (CPR - 1)) == 0)
            bad[r] = (grp & ((1u << CPR) - 1)) != 0;
        any = any || b;
    }
    return any;
}

/* The splits of a query tile whose keys end at kv_end (exclusive): tiles
 * [split * split_tiles, ...), the last split taking whatever remains, so a
 * max_kv_len that undercounts cannot drop keys.  Shared by the attention and
 * merge kernels. */
__device__ __forceinline__ int prefill_splits_used(int kv_end, int n_split, int split_tiles)
{
    const int n_tiles = (kv_end + kTileKeys - 1) / kTileKeys;
    return max(1, min(n_split, (n_tiles + split_tiles - 1) / split_tiles));
}

/* workspace (n_split > 1): acc [rows][n_heads][n_split][D] f32, then
 *                          ml  [rows][n_heads][n_split][2] f32 (m in log2
 *                              units, l; l NaN: the row saw a non-finite V)
 * rows: the pass's token rows (cu_seqlens). */
template <int D, bool INT8, bool WG>
__global__ void __launch_bounds__(kThreads)
    prefill_kernel(KvArgs a, const __nv_bfloat16 *q, int64_t q_stride, __nv_bfloat16 *out,
                   int64_t o_stride, const int32_t *cu_seqlens, const int32_t *seq_pos0,
                   int group, float scale_log2, int n_split, int split_tiles, float *ws_acc, float *ws_ml)
{
#if !defined(__CUDA_ARCH_FEAT_SM90_ALL)
    if constexpr (WG) { /* never launched here (the probe in prefill_init) */
        __trap();
        return;
    }
#endif
    constexpr int RH = D + 8;
    constexpr int TS = kTileKeys * (WG ? D : RH); /* halves per K (or V) tile */
    extern __shared__ __align__(16) unsigned char smem[];
    /* wgmma's swizzled tiles start 1024-byte aligned (shared addresses) */
    unsigned char *base = smem + (WG ? (1024 - (smem_u32(smem) & 1023)) & 1023 : 0);
    __half *sk = (__half *)base;                  /* [2][TS]         */
    __half *sv = sk + 2 * TS;                     /* [2][TS]         */
    __half *sq = sv + 2 * TS;                     /* [64][RH]        */
    float *sks = (float *)(sq + kPrefillRows * RH); /* [2][64]       */
    float *svs = sks + 2 * kTileKeys;             /* [2][64]         */
    __shared__ int vbad[kTileKeys]; /* diagonal tile: key's V was non-finite */

    const int b = blockIdx.z / n_split, split = blockIdx.z % n_split;
    const int h = blockIdx.y, m0 = blockIdx.x * kPrefillRows;
    const int kvh = h / group;
    const int t = threadIdx.x, warp = t >> 5, lane = t & 31;
    /* programmatic dependent launch (pdl.cuh): q and this pass's K/V rows
     * come from the kernels before, so every block waits (early exits
     * too); cu_seqlens, seq_pos0, the block table and the keys before
     * seq_pos0 were written before the pass's first kernel (attention.h)
     * and are read before the wait */
    const int tok0 = cu_seqlens[b];
    const int n = cu_seqlens[b + 1] - tok0;
    const int pos0 = seq_pos0[b];
    /* keys 0 .. kv_end-1: everything up to this block's last query */
    const int kv_end = pos0 + min(n, m0 + kPrefillRows);
    const int n_tiles = (kv_end + kTileKeys - 1) / kTileKeys;
    const int used = prefill_splits_used(kv_end, n_split, split_tiles);
    const bool active = m0 < n && split < used;
    const int j0 = split * split_tiles, j1 = split == used - 1 ? n_tiles : j0 + split_tiles;
    /* the first K/V tile, then the Q tile with all of its loads in flight at
     * once: the prologue costs about two memory latencies, not one per
     * 16-byte piece of Q (a short prompt's blocks are mostly prologue).  A
     * first tile of keys cached before this pass (a chunk extending a
     * sequence) is requested before the wait, like decode attention's */
    TileLoader<D, INT8, WG> ld;
    const bool old_tile = active && (j0 + 1) * kTileKeys <= pos0;
    if (old_tile)
        ld.issue(a, b, kvh, j0 * kTileKeys, kv_end, sk, sv, sks, svs);
    dsq_pdl_wait();
    dsq_pdl_trigger();
    if (!active)
        return;
    if (!old_tile)
        ld.issue(a, b, kvh, j0 * kTileKeys, kv_end, sk, sv, sks, svs);
    {
        /* Q tile: 64 rows x D, bf16 -> fp16, rows past n zero */
        constexpr int QPT = kPrefillRows * D / 8 / kThreads; /* 16-byte pieces per thread */
        uint4 qv[QPT];
#pragma unroll
        for (int i = 0; i < QPT; i++) {
            const int c = t + i * kThreads, r = c / (D / 8), cc = c % (D / 8);
            qv[i] = m0 + r < n ? *(const uint4 *)(q + (int64_t)(tok0 + m0 + r) * q_stride + h * D + cc * 8)
                               : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int i = 0; i < QPT; i++) {
            const int c = t + i * kThreads, r = c / (D / 8), cc = c % (D / 8);
            *(uint4 *)(sq + r * RH + cc * 8) = m0 + r < n ? bf16x8_to_h8(qv[i]) : make_uint4(0, 0, 0, 0);
        }
    }
    ld.commit(sk, sv, sks, svs);
    cp_async_wait_all();
    if constexpr (WG)
        fence_proxy_async();
    __syncthreads();

    uint32_t qf[D / 16][4];
    load_q_frags<D>(qf, sq + warp * 16 * RH);

    /* this thread's two rows: r0 = lane/4, r1 = r0 + 8 (of the warp's 16) */
    const int qpos_w = pos0 + m0 + warp * 16; /* position of warp row 0 */
    const int qpos0 = qpos_w + (lane >> 2), qpos1 = qpos0 + 8;
    float o[D / 8][4];
#pragma unroll
    for (int i = 0; i < D / 8; i++)
        o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
    float m_r[2] = {-INFINITY, -INFINITY}, l_r[2] = {0.f, 0.f};
    bool poison[2] = {false, false}; /* the row attends to a non-finite V */
    float s[8][4]; /* a tile's scores (wgmma overwrites them: set once) */
#pragma unroll
    for (int i = 0; i < 8; i++)
        s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.f;

    for (int j = j0; j < j1; j++) {
        const int cur = (j - j0) & 1;
        const int key0 = j * kTileKeys;
        if (j + 1 < j1)
            ld.issue(a, b, kvh, key0 + kTileKeys, kv_end, sk + (cur ^ 1) * TS, sv + (cur ^ 1) * TS,
                     sks + (cur ^ 1) * kTileKeys, svs + (cur ^ 1) * kTileKeys);
        /* block-uniform: the tile holds a key after the block's first row */
        if (key0 + kTileKeys - 1 > pos0 + m0) {
            const bool found = screen_v<D, INT8, WG>(sv + cur * TS, svs + cur * kTileKeys, vbad);
            if constexpr (WG)
                fence_proxy_async(); /* the zeroed V values, for wgmma */
            if (__syncthreads_or(found))
                for (int k = 0; k < kTileKeys; k++)
                    if (vbad[k]) {
                        poison[0] = poison[0] || key0 + k <= qpos0;
                        poison[1] = poison[1] || key0 + k <= qpos1;
                    }
        }
        /* a warp whose last row precedes the whole tile has nothing to do
         * (with wgmma the warpgroup computes together: every warp) */
        if (WG || key0 <= qpos_w + 15) {
            const __half *tk = sk + cur * TS, *tv = sv + cur * TS;
            const float *tks = sks + cur * kTileKeys, *tvs = svs + cur * kTileKeys;
            if constexpr (WG) {
                /* S = Q K^T: K-major B, k-step kk at D block kk / 4 (8 KB
                 * apart), 32 bytes per k-step inside its 128-byte rows */
                const uint32_t ka = smem_u32(tk);
                wgmma_fence();
#pragma unroll
                for (int kk = 0; kk < D / 16; kk++)
                    wgmma_m64n64k16_rs<0>(s, qf[kk],
                                          wgmma_desc_sw128(ka + (kk >> 2) * 8192 + (kk & 3) * 32, 16, 1024), kk > 0);
                wgmma_commit();
                wgmma_wait0();
                wgmma_pin<8>(s);
            } else {
#pragma unroll
                for (int i = 0; i < 8; i++)
                    s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.f;
#pragma unroll
                for (int np = 0; np < 4; np++)
                    qk_16keys<D>(&s[2 * np], qf, tk + np * 16 * RH);
            }
            const bool need_mask = key0 + kTileKeys - 1 > qpos_w;
            float mt[2] = {-INFINITY, -INFINITY};
#pragma unroll
            for (int nb = 0; nb < 8; nb++) {
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    int kl = nb * 8 + 2 * (lane & 3) + (e & 1);
                    float x = s[nb][e] * scale_log2;
                    if (INT8)
                        x *= tks[kl];
                    if (need_mask && key0 + kl > (e < 2 ? qpos0 : qpos1))
                        x = -INFINITY;
                    s[nb][e] = x;
                    mt[e >> 1] = fmaxf(mt[e >> 1], x);
                }
            }
            float mu[2];
            online_rescale<D>(m_r, l_r, o, mt, mu);
            uint32_t pa[4][4]; /* P's A fragments, 16 keys each */
#pragma unroll
            for (int kk = 0; kk < 4; kk++) {
                float p[2][4];
#pragma unroll
                for (int hb = 0; hb < 2; hb++) {
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        float pe = online_weight(s[2 * kk + hb][e], mu, l_r, e >> 1);
                        if (INT8)
                            pe *= tvs[(2 * kk + hb) * 8 + 2 * (lane & 3) + (e & 1)];
                        p[hb][e] = pe;
                    }
                }
                pa[kk][0] = pack_half2(p[0][0], p[0][1]);
                pa[kk][1] = pack_half2(p[0][2], p[0][3]);
                pa[kk][2] = pack_half2(p[1][0], p[1][1]);
                pa[kk][3] = pack_half2(p[1][2], p[1][3]);
                if constexpr (!WG)
                    pv_16keys<D>(o, pa[kk], tv + kk * 16 * RH);
            }
            if constexpr (WG) {
                /* O += P V: V is N-major B, 16 keys (2 KB) per k-step, the
                 * 64-column blocks of D 8 KB apart */
                const uint32_t va = smem_u32(tv);
                wgmma_fence();
#pragma unroll
                for (int kk = 0; kk < 4; kk++) {
                    const uint64_t dv = wgmma_desc_sw128(va + kk * 2048, 8192, 1024);
                    if constexpr (D == 128)
                        wgmma_m64n128k16_rs<1>(o, pa[kk], dv, 1);
                    else
                        wgmma_m64n64k16_rs<1>(o, pa[kk], dv, 1);
                }
                wgmma_commit();
                wgmma_wait0();
                wgmma_pin<D / 8>(o);
            }
        }
        if (j + 1 < j1)
            ld.commit(sk + (cur ^ 1) * TS, sv + (cur ^ 1) * TS, sks + (cur ^ 1) * kTileKeys,
                      svs + (cur ^ 1) * kTileKeys);
        cp_async_wait_all();
        if constexpr (WG)
            fence_proxy_async();
        __syncthreads();
    }

    /* normalise and store bf16 pairs; rows past n are padding.  A valid row
     * has l >= 1 (its largest finite score contributes 2^0) unless every
     * score it saw was -inf (l = 0: 0 * inf = NaN, as the CPU's softmax
     * gives) or NaN (l = NaN); neither may become a finite 0. */
    float inv[2], lsum[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        lsum[r] = quad_sum(l_r[r]);
        inv[r] = poison[r] ? __int_as_float(0x7fffffff) : 1.f / lsum[r];
    }
    const int row0 = m0 + warp * 16 + (lane >> 2);
    if (used > 1) { /* this split's partial, merged by prefill_merge_kernel */
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const int row = row0 + r * 8;
            if (row >= n)
                continue;
            const int64_t slot = ((int64_t)(tok0 + row) * gridDim.y + h) * n_split + split;
            float *acc = ws_acc + slot * D + 2 * (lane & 3);
#pragma unroll
            for (int i = 0; i < D / 8; i++)
                *(float2 *)(acc + i * 8) = make_float2(o[i][2 * r], o[i][2 * r + 1]);
            if ((lane & 3) == 0)
                *(float2 *)(ws_ml + slot * 2) =
                    make_float2(m_r[r], poison[r] ? __int_as_float(0x7fffffff) : lsum[r]);
        }
        return;
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int row = row0 + r * 8;
        if (row >= n)
            continue;
        __nv_bfloat16 *dst = out + (int64_t)(tok0 + row) * o_stride + h * D + 2 * (lane & 3);
#pragma unroll
        for (int i = 0; i < D / 8; i++)
            *(__nv_bfloat162 *)(dst + i * 8) =
                __floats2bfloat162_rn(o[i][2 * r] * inv[r], o[i][2 * r + 1] * inv[r]);
    }
}

/* One warp per (row, head) of a query tile that used several splits: o =
 * sum_s 2^(m_s - M) o_s / sum_s 2^(m_s - M) l_s, M = max_s m_s.  As in the
 * decode merge, a NaN sum (a NaN score or V) or every score -inf (M = -inf:
 * 2^(-inf - -inf) is NaN) gives NaN, as the CPU's softmax does.  grid
 * (ceil(max_q_len * n_heads / 4), 1, n_seqs), 128 threads. */
template <int D>
__global__ void __launch_bounds__(128)
    prefill_merge_kernel(const float *__restrict__ ws_acc, const float *__restrict__ ws_ml,
                         const int32_t *__restrict__ cu_seqlens, const int32_t *__restrict__ seq_pos0, int n_heads,
                         int n_split, int split_tiles, __nv_bfloat16 *__restrict__ out, int64_t o_stride)
{
    constexpr int E = D / 32; /* values per lane: 4 or 2 */
    const int b = blockIdx.z, lane = threadIdx.x & 31;
    const int idx = blockIdx.x * 4 + (threadIdx.x >> 5);
    const int row = idx / n_heads, h = idx % n_heads;
    /* pass metadata before the wait (as in prefill_kernel); the partials
     * after it; every block waits, early exits too (pdl.cuh) */
    const int tok0 = cu_seqlens[b], n = cu_seqlens[b + 1] - tok0;
    const int pos0 = seq_pos0[b];
    dsq_pdl_wait();
    dsq_pdl_trigger();
    if (row >= n)
        return;
    const int m0 = row / kPrefillRows * kPrefillRows;
    const int used = prefill_splits_used(pos0 + min(n, m0 + kPrefillRows), n_split, split_tiles);
    if (used <= 1)
        return; /* written by the attention kernel */
    const int64_t slot0 = ((int64_t)(tok0 + row) * n_heads + h) * n_split;
    /* unrolled so that a round's loads are in flight together (same
     * summation order as one at a time) */
    float M = -INFINITY;
#pragma unroll 8
    for (int s = 0; s < used; s++)
        M = fmaxf(M, ws_ml[(slot0 + s) * 2]);
    float L = 0.f, acc[E];
#pragma unroll
    for (int k = 0; k < E; k++)
        acc[k] = 0.f;
#pragma unroll 8
    for (int s = 0; s < used; s++) {
        const float2 ml = *(const float2 *)(ws_ml + (slot0 + s) * 2);
        const float f = exp2f(ml.x - M);
        L += f * ml.y;
        const float *src = ws_acc + (slot0 + s) * D + lane * E;
#pragma unroll
        for (int k = 0; k < E; k++)
            acc[k] += f * src[k];
    }
    __nv_bfloat16 *dst = out + (int64_t)(tok0 + row) * o_stride + h * D + lane * E;
#pragma unroll
    for (int k = 0; k < E; k += 2)
        *(__nv_bfloat162 *)(dst + k) = __floats2bfloat162_rn(acc[k] / L, acc[k + 1] / L);
}

template <int D, bool INT8, bool WG> static cudaError_t set_prefill_attr()
{
    return cudaFuncSetAttribute(prefill_kernel<D, INT8, WG>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                prefill_smem_bytes<D, WG>());
}

/* Whether the code this device runs has wgmma (built for sm_90a and the
 * device is one): a one-thread probe kernel, as the host cannot tell which
 * of the fat binary's images the driver picked. */
__global__ void wgmma_probe_kernel(int *out)
{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    *out = 1;
#else
    *out = 0;
#endif
}

static int g_wgmma[DSQ_CU_MAX_DEVICES]; /* per device: 1 wgmma kernels usable */

static cudaError_t wgmma_probe(int dev)
{
    int *d = NULL, h = 0;
    cudaError_t e = cudaMalloc(&d, sizeof(int));
    if (e != cudaSuccess)
        return e;
    wgmma_probe_kernel<<<1, 1>>>(d);
    e = cudaGetLastError();
    if (e == cudaSuccess)
        e = cudaMemcpy(&h, d, sizeof(int), cudaMemcpyDeviceToHost);
    cudaFree(d);
    if (e != cudaSuccess)
        return e;
    g_wgmma[dev] = h == 1; /* published by dsq_cu_once_per_device's release store */
    return cudaSuccess;
}

template <bool WG> static cudaError_t set_prefill_attrs()
{
    cudaError_t e;
    if ((e = set_prefill_attr<128, false, WG>()) != cudaSuccess) return e;
    if ((e = set_prefill_attr<128, true, WG>()) != cudaSuccess) return e;
    if ((e = set_prefill_attr<64, false, WG>()) != cudaSuccess) return e;
    return set_prefill_attr<64, true, WG>();
}

/* The current device `dev`'s attributes (per device) and its wgmma probe. */
cudaError_t prefill_init(int dev)
{
    cudaError_t e = set_prefill_attrs<false>();
    if (e == cudaSuccess)
        e = wgmma_probe(dev);
    if (e == cudaSuccess && g_wgmma[dev])
        e = set_prefill_attrs<true>();
    return e;
}

} /* namespace dsq_attn */

using namespace dsq_attn;

/* Bytes of split workspace for rows x n_split partials. */
static size_t prefill_ws_bytes(int64_t rows, int64_t n_heads, int64_t head_dim, int64_t n_split)
{
    return (size_t)(rows * n_heads * n_split * (head_dim + 2)) * sizeof(float);
}

extern "C" size_t dsq_attn_prefill_workspace_bytes(int32_t max_rows, int32_t n_heads, int32_t head_dim,
                                                   int32_t n_split)
{
    if (max_rows <= 0 || n_heads <= 0 || head_dim <= 0 || n_split <= 1)
        return 0;
    return prefill_ws_bytes(max_rows, n_heads, head_dim, n_split);
}

/* The wgmma kernel where the device has it, for FP16 caches (INT8's
 * conversion-bound loader measured slower on it: H100, 4,096-token prompt
 * 379 vs 359 us).  DSQ_CUDA_PREFILL_WGMMA=0: mma.sync only, =1: wgmma for
 * both (measurement knobs, read per call; the tests run both kernels). */
static bool use_wgmma(int dev, bool i8)
{
    const char *e = getenv("DSQ_CUDA_PREFILL_WGMMA");
    const int v = e && e[0] ? e[0] - '0' : -1;
    return g_wgmma[dev] && v != 0 && (!i8 || v == 1);
}

/* DSQ_CUDA_PREFILL_SPLIT=0: never split (a measurement knob, read per call) */
static bool split_enabled(void)
{
    const char *e = getenv("DSQ_CUDA_PREFILL_SPLIT");
    return !(e && e[0] == '0');
}

extern "C" int dsq_attn_prefill_kernel_wgmma(int32_t kv_dtype)
{
    int dev = 0;
    if (dsq_attn_init() != DSQ_OK || cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= DSQ_CU_MAX_DEVICES)
        return -1;
    return use_wgmma(dev, kv_dtype == DSQ_ATTN_KV_INT8) ? 1 : 0;
}

extern "C" dsq_status dsq_attn_prefill_ws(const dsq_attn_kv *kv, const void *q, int64_t q_stride, void *out,
                                           int64_t o_stride, const int32_t *cu_seqlens, const int32_t *seq_pos0,
                                           int32_t n_seqs, int32_t max_q_len, int32_t max_kv_len, int32_t n_heads,
                                           int32_t split_tiles, void *workspace, size_t workspace_bytes,
                                           cudaStream_t stream)
{
    if (!kv_ok(kv) || n_seqs < 0 || max_q_len < 0 || n_heads <= 0 ||
        n_heads % kv->n_kv_heads || n_seqs > 65535 || n_heads > 65535 || split_tiles < 0)
        return dsq_fail(DSQ_ERR_INTERNAL, "prefill attention: %d sequences, %d rows, %d heads over a cache of %d KV "
                        "heads, split every %d tiles (or one kv_ok() refuses)", (int)n_seqs, (int)max_q_len,
                        (int)n_heads, kv ? (int)kv->n_kv_heads : 0, (int)split_tiles);
    if (n_seqs == 0 || max_q_len == 0)
        return DSQ_OK;
    const int D = kv->head_dim;
    /* 16-byte Q loads: base aligned, row stride a multiple of 8 elements */
    if (!q || !out || !cu_seqlens || !seq_pos0 || !aligned16(q) || q_stride % 8 ||
        ((uintptr_t)out & 3) || o_stride % 2 || q_stride < (int64_t)n_heads * D ||
        o_stride < (int64_t)n_heads * D || (workspace && !aligned16(workspace)))
        return dsq_fail(DSQ_ERR_INTERNAL, "prefill attention: a NULL or misaligned pointer, or strides q %lld / out %lld "
                        "(>= %d, q a multiple of 8, out of 2)", (long long)q_stride, (long long)o_stride, (int)n_heads * D);
    int dev = 0;
    dsq_status st = dsq_attn_init();
    if (st != DSQ_OK)
        return st;
    cudaError_t e = cudaGetDevice(&dev);
    if (e != cudaSuccess || dev < 0 || dev >= DSQ_CU_MAX_DEVICES)
        return dsq_cu_status(e != cudaSuccess ? e : cudaErrorInvalidDevice, "prefill attention: device query");
    const bool wg = use_wgmma(dev, kv->dtype == DSQ_ATTN_KV_INT8);
    /* the split plan: kv_tiles, the longest query tile's keys in tiles */
    const int64_t n_qt = (max_q_len + kPrefillRows - 1) / kPrefillRows;
    const int64_t kv_tiles = ((int64_t)(max_kv_len > max_q_len ? max_kv_len : max_q_len) + kTileKeys - 1) / kTileKeys;
    const int64_t rows = (int64_t)n_seqs * max_q_len; /* bounds the pass's rows */
    int64_t n_split = 1, tiles = kv_tiles;
    if (workspace && split_tiles > 0) { /* forced (tests) */
        tiles = split_tiles;
        n_split = (kv_tiles + tiles - 1) / tiles;
        if (workspace_bytes < prefill_ws_bytes(rows, n_heads, D, n_split) || n_split * n_seqs > 65535)
            return dsq_fail(DSQ_ERR_INTERNAL, "prefill attention: %lld splits of %lld rows need %zu workspace bytes "
                            "(%zu given) and at most 65,535 grid rows", (long long)n_split, (long long)rows,
                            prefill_ws_bytes(rows, n_heads, D, n_split), workspace_bytes);
    } else if (workspace && split_enabled() && kv_tiles >= kPrefillSplitMinTiles) {
        /* about four blocks per SM (two rounds at the two that fit): the
         * longest chain is what a part-empty GPU waits for */
        int sms = 0;
        const cudaError_t ge = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
        if (ge != cudaSuccess)
            return dsq_cu_status(ge, "prefill attention: device query");
        const int64_t base = n_qt * n_heads * n_seqs;
        int64_t want = (4 * (int64_t)sms + base - 1) / base;
        const int64_t fit = (int64_t)(workspace_bytes / prefill_ws_bytes(rows, n_heads, D, 1));
        want = want < fit ? want : fit;
        want = want < kv_tiles ? want : kv_tiles;
        want = want < 65535 / n_seqs ? want : 65535 / n_seqs;
        if (want > 1) {
            tiles = (kv_tiles + want - 1) / want;
            n_split = (kv_tiles + tiles - 1) / tiles;
        }
    }
    KvArgs a = kv_args(kv);
    const int group = n_heads / kv->n_kv_heads;
    const float scale_log2 = (float)(1.4426950408889634 / sqrt((double)D));
    dim3 grid((unsigned)n_qt, (unsigned)n_heads, (unsigned)(n_seqs * n_split));
    const __nv_bfloat16 *qb = (const __nv_bfloat16 *)q;
    __nv_bfloat16 *ob = (__nv_bfloat16 *)out;
    const bool i8 = kv->dtype == DSQ_ATTN_KV_INT8;
    float *ws_acc = n_split > 1 ? (float *)workspace : NULL;
    float *ws_ml = n_split > 1 ? ws_acc + (size_t)(rows * n_heads * n_split * D) : NULL;
    const int ns = (int)n_split, st_tiles = (int)(n_split > 1 ? tiles : kv_tiles + 1);
#define DSQ_PREFILL_LAUNCH(DD, I8, WG)                                                                            \
    dsq_launch_pdl(prefill_kernel<DD, I8, WG>, grid, dim3(kThreads), (size_t)prefill_smem_bytes<DD, WG>(), stream, \
                   a, qb, q_stride, ob, o_stride, cu_seqlens, seq_pos0, group, scale_log2, ns, st_tiles, ws_acc, ws_ml)
    if (D == 128 && wg)
        e = i8 ? DSQ_PREFILL_LAUNCH(128, true, true) : DSQ_PREFILL_LAUNCH(128, false, true);
    else if (D == 128)
        e = i8 ? DSQ_PREFILL_LAUNCH(128, true, false) : DSQ_PREFILL_LAUNCH(128, false, false);
    else if (wg)
        e = i8 ? DSQ_PREFILL_LAUNCH(64, true, true) : DSQ_PREFILL_LAUNCH(64, false, true);
    else
        e = i8 ? DSQ_PREFILL_LAUNCH(64, true, false) : DSQ_PREFILL_LAUNCH(64, false, false);
#undef DSQ_PREFILL_LAUNCH
    if (e != cudaSuccess || n_split <= 1)
        return dsq_cu_status(e, "prefill attention kernel");
    const dim3 mgrid((unsigned)((max_q_len * (int64_t)n_heads + 3) / 4), 1, (unsigned)n_seqs);
    if (D == 128)
        e = dsq_launch_pdl(prefill_merge_kernel<128>, mgrid, dim3(128), 0, stream, (const float *)ws_acc,
                           (const float *)ws_ml, cu_seqlens, seq_pos0, (int)n_heads, ns, st_tiles, ob, o_stride);
    else
        e = dsq_launch_pdl(prefill_merge_kernel<64>, mgrid, dim3(128), 0, stream, (const float *)ws_acc,
                           (const float *)ws_ml, cu_seqlens, seq_pos0, (int)n_heads, ns, st_tiles, ob, o_stride);
    return dsq_cu_status(e, "prefill attention merge kernel");
}

extern "C" dsq_status dsq_attn_prefill(const dsq_attn_kv *kv, const void *q, int64_t q_stride,
                                        void *out, int64_t o_stride, const int32_t *cu_seqlens,
                                        const int32_t *seq_pos0, int32_t n_seqs,
                                        int32_t max_q_len, int32_t n_heads, cudaStream_t stream)
{
    return dsq_attn_prefill_ws(kv, q, q_stride, out, o_stride, cu_seqlens, seq_pos0, n_seqs, max_q_len, 0, n_heads,
                               0, NULL, 0, stream);
}
