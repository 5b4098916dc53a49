/*
 * decode_persist.cu - the layers of a batch-1 decode step in one persistent
 * kernel (decode_persist.h says why and what).
 *
 * Block = NW consumer warps + 1 producer warp, one block per SM, grid = the
 * SM count.  Shared memory:
 *   bars  : full[NS], empty[NS] mbarriers; flag; red[NW]
 *   U     : the union of a phase's input vector xs (bf16 [K], K <= max(E,
 *           H*D, F)) and the attention scratch (q fp32 [g][D]; per
 *           attention warp m, l [AW][g] and acc [AW][g][D])
 *   ring  : NS stages of SB bytes, each one chunk of whole weight rows
 *
 * Work split of a product phase (N units of u rows, K columns; u = 2 for
 * gate/up, whose row pairs must meet in one warp): block b owns units
 * [N b / G, N (b+1) / G), a contiguous slice of the weight, cut into chunks
 * of upc units (as many as fit a stage, at most kRowsMax rows).  The
 * block's chunks over the whole step are numbered c = 0, 1, ... in the
 * order layer, phase (qkv, o, gate/up, down), chunk; chunk c goes to ring
 * stage c % NS and to consumer warp c % NW.  The producer (one thread)
 * walks the same sequence: waits for stage s to be empty, arms full[s] with
 * the chunk's bytes and issues one bulk copy; the consumer warp waits on
 * full[s], computes its rows from shared memory and arrives on empty[s].
 * Each warp takes its chunks in increasing c, so the oldest unconsumed
 * chunk is always resident and the ring cannot deadlock; the producer runs
 * ahead of the phases, limited only by free stages.
 *
 * Grid barrier: consumer warps only (named barrier 1), a counter and a
 * generation word in global memory (the last arriver resets the counter
 * and bumps the generation); data written by other blocks is read after
 * it with L2 loads (__ldcg).
 */
#include <cuda_fp16.h>
#include <math.h>
#include <stdlib.h>

#include "common.cuh"
#include "decode_persist.h"
#include "rope.cuh"

namespace {

constexpr int NW = 15;                   /* consumer warps (+1: 512 threads, 128 registers each) */
constexpr int kThreads = (NW + 1) * 32;  /* + the producer warp */
constexpr int AW = 8;                    /* consumer warps that run attention */
constexpr int kD = 128;
constexpr int kGroupMax = 6;             /* query heads per kv head */
constexpr int kRowsMax = 8;              /* rows per chunk */
constexpr int kStagesMax = 16;
constexpr int kSmemMax = 232448;         /* sm_90: 227 KB per block */
constexpr int kHeader = 512;             /* mbarriers, flag, red */

/* sync words: [0..1] the grid barrier's 64-bit arrival count (8-byte
 * aligned: the buffer is), [8 + h] merge ticket of kv head h */
constexpr int kSyncCount = 0, kSyncTicket = 8;

struct Plan {
    int SB, NS, U; /* stage bytes, stages, union bytes */
    int G;         /* blocks */
    int max_splits;
};

struct KArgs {
    dsq_persist_args a;
    Plan pl;
    int dbg; /* temporary bisect mask (DSQ_PERSIST_DBG) */
    int pf;  /* L2 prefetch distance in chunks beyond the ring (DSQ_PERSIST_PF; 0 = off) */
};

/* One product phase of a layer as the block sees it. */
struct Phase {
    const uint16_t *w; /* first row of the block's slice */
    int K;             /* columns */
    int u;             /* rows per unit */
    int unit0, nunits; /* the block's units */
    int upc;           /* units per chunk */
    int nchunks;
};

__device__ __forceinline__ Phase phase_of(const dsq_persist_layer &L, int p, const dsq_persist_args &a,
                                          const Plan &pl, int b)
{
    Phase ph;
    int N;
    const uint16_t *w;
    switch (p) {
    case 0: w = L.w_qkv, N = (a.H + 2 * a.KV) * a.D, ph.K = a.E, ph.u = 1; break;
    case 1: w = L.w_o, N = a.E, ph.K = a.H * a.D, ph.u = 1; break;
    case 2: w = L.w_gu, N = a.F, ph.K = a.E, ph.u = 2; break;
    default: w = L.w_down, N = a.E, ph.K = a.F, ph.u = 1; break;
    }
    ph.unit0 = (int)((int64_t)N * b / pl.G);
    ph.nunits = (int)((int64_t)N * (b + 1) / pl.G) - ph.unit0;
    const int unit_bytes = ph.u * ph.K * 2;
    int upc = pl.SB / unit_bytes;
    upc = upc < 1 ? 1 : upc;
    upc = upc * ph.u > kRowsMax ? kRowsMax / ph.u : upc;
    ph.upc = upc;
    ph.nchunks = (ph.nunits + upc - 1) / upc;
    ph.w = w + (size_t)ph.unit0 * ph.u * ph.K;
    return ph;
}

__device__ __forceinline__ uint32_t su32(const void *p)
{
    return (uint32_t)__cvta_generic_to_shared(p);
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
__device__ __forceinline__ void mbar_init(uint64_t *b, unsigned n)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(su32(b)), "r"(n) : "memory");
}
__device__ __forceinline__ void mbar_expect_tx(uint64_t *b, unsigned bytes)
{
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(su32(b)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t *b)
{
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(su32(b)) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t *b, unsigned parity)
{
    unsigned ok;
    do {
        asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                     " selp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(ok)
                     : "r"(su32(b)), "r"(parity)
                     : "memory");
    } while (!ok);
}
/* bytes % 16 == 0, both addresses 16-byte aligned; evict-first in L2 (each
 * weight byte is read once per step; the KV cache and activations stay) */
__device__ __forceinline__ void bulk_copy(void *dst, const void *src, unsigned bytes, uint64_t *bar, uint64_t pol)
{
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint"
                 " [%0], [%1], %2, [%3], %4;" ::"r"(su32(dst)),
                 "l"(src), "r"(bytes), "r"(su32(bar)), "l"(pol)
                 : "memory");
}
#endif

/* A position in the block's chunk sequence (layer, phase, chunk): the L2
 * prefetch cursor, which runs ka.pf chunks ahead of the ring's copies so
 * that the memory keeps streaming while every stage is full (grid
 * barriers, attention). */
struct Cursor {
    int l, p, j;
    Phase ph;
};

__device__ void prefetch_next(Cursor &q, const dsq_persist_args &a, const Plan &pl, int b, int nl, int dbg)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    while (q.l < nl && q.j >= q.ph.nchunks) {
        if (++q.p == 4) {
            q.p = 0;
            q.l++;
        }
        q.j = 0;
        if (q.l < nl)
            q.ph = phase_of(a.layers[(dbg & 64) ? 0 : q.l], q.p, a, pl, b);
    }
    if (q.l >= nl)
        return;
    const int units = min(q.ph.upc, q.ph.nunits - q.j * q.ph.upc);
    const unsigned bytes = (unsigned)(units * q.ph.u * q.ph.K * 2);
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(q.ph.w + (size_t)q.j * q.ph.upc * q.ph.u * q.ph.K),
                 "r"(bytes)
                 : "memory");
    q.j++;
#endif
}

__device__ __forceinline__ void consumers_sync()
{
    asm volatile("bar.sync 1, %0;" ::"n"(NW * 32) : "memory");
}

/* Every consumer thread of every block: writes before are visible to every
 * consumer after.  One 64-bit arrival counter that only grows: every launch
 * adds G per barrier, so it is a multiple of G between launches and the
 * barrier an arrival belongs to ends when the counter reaches the next
 * multiple of G.  One atomic per block and polling, against the previous
 * counter + generation word's three dependent atomics on the last
 * arriver's path (count, reset, bump); 2^64 arrivals never wrap. */
__device__ __forceinline__ void grid_sync(uint32_t *sync, int G)
{
    consumers_sync();
    if (threadIdx.x == 0) {
        unsigned long long *cnt = reinterpret_cast<unsigned long long *>(sync + kSyncCount);
        unsigned long long old;
        __threadfence(); /* the block's writes, ordered before by bar.sync, then the arrival */
        asm volatile("atom.add.acq_rel.gpu.global.u64 %0, [%1], 1;" : "=l"(old) : "l"(cnt) : "memory");
        const unsigned long long target = (old / (unsigned)G + 1ull) * (unsigned)G;
        unsigned long long v = old + 1ull;
        while (v < target)
            asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(cnt) : "memory");
    }
    consumers_sync();
}

/* xs = bf16(nw * (x * rsqrt(mean(x^2) + eps))), x fp32 [E] from L2: the
 * arithmetic of gemv_norm.cuh with this block's summation order. */
__device__ void norm_into(const float *x, const float *nw, float eps, int E, uint16_t *xs, float *red)
{
    const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
    const float4 *x4 = reinterpret_cast<const float4 *>(x);
    float s = 0.0f;
    for (int i = t; i < E / 4; i += NW * 32) {
        const float4 v = __ldcg(x4 + i);
        s += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
    }
    s = dsq_warp_sum(s);
    if (lane == 0)
        red[warp] = s;
    consumers_sync();
    float ss = 0.0f;
    for (int w = 0; w < NW; w++)
        ss += red[w];
    const float inv = rsqrtf(ss / (float)E + eps);
    const float4 *g4 = reinterpret_cast<const float4 *>(nw);
    uint2 *o = reinterpret_cast<uint2 *>(xs);
    for (int i = t; i < E / 4; i += NW * 32) {
        const float4 v = __ldcg(x4 + i), g = g4[i];
        o[i] = make_uint2((uint32_t)dsq_f2bf(g.x * (v.x * inv)) | (uint32_t)dsq_f2bf(g.y * (v.y * inv)) << 16,
                          (uint32_t)dsq_f2bf(g.z * (v.z * inv)) | (uint32_t)dsq_f2bf(g.w * (v.w * inv)) << 16);
    }
    consumers_sync(); /* xs complete; red free */
}

/* xs = src (bf16 [n], n % 8 == 0, written by other blocks) */
__device__ void load_vec(const uint16_t *src, int n, uint16_t *xs)
{
    const uint4 *s4 = reinterpret_cast<const uint4 *>(src);
    uint4 *d4 = reinterpret_cast<uint4 *>(xs);
    for (int i = threadIdx.x; i < n / 8; i += NW * 32)
        d4[i] = __ldcg(s4 + i);
    consumers_sync();
}

/* The consumer side of product phase p: this warp's chunks among the
 * block's nchunks, starting at sequence number c0. */
template <int P>
__device__ void consume(const Phase &ph, uint32_t c0, const Plan &pl, unsigned char *ring, uint64_t *full,
                        uint64_t *empty, const uint16_t *xs, const dsq_persist_args &a, const float *bias, int dbg)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int K8 = ph.K / 8;
    const uint4 *xv = reinterpret_cast<const uint4 *>(xs);
    /* Stage-affine ownership: stage s is always consumed by warp s % NW,
     * so a warp waiting on round r of stage s has itself consumed round
     * r - 1 of it, and the full barrier is at most one phase behind the
     * parity it waits on.  (Chunk c -> warp c % NW, as before, let a warp
     * wait on round r + 1 while round r was not yet filled: with NS < NW
     * try_wait.parity then saw round r - 1's completed phase of the same
     * parity and went on with stale data -- the full-size fault.) */
    for (int j = 0; j < ph.nchunks; j++) {
        const uint32_t c = c0 + (uint32_t)j;
        const int s = (int)(c % (uint32_t)pl.NS);
        if (s % NW != warp)
            continue;
        const int units = min(ph.upc, ph.nunits - j * ph.upc);
        const int R = units * ph.u;
        mbar_wait(&full[s], (c / (uint32_t)pl.NS) & 1u);
        if (dbg & 128) { /* timing: no arithmetic, the stage released at once */
            __syncwarp();
            if (lane == 0)
                mbar_arrive(&empty[s]);
            continue;
        }
        const uint4 *wv = reinterpret_cast<const uint4 *>(ring + (size_t)s * pl.SB);
        float acc[kRowsMax];
#pragma unroll
        for (int r = 0; r < kRowsMax; r++)
            acc[r] = 0.0f;
        for (int i = lane; i < K8; i += 32) {
            float xf[8];
            dsq_unpack8(xv[i], xf);
#pragma unroll
            for (int r = 0; r < kRowsMax; r++) {
                if (r < R) {
                    float wf[8];
                    dsq_unpack8(wv[r * K8 + i], wf);
#pragma unroll
                    for (int e = 0; e < 8; e++)
                        acc[r] = fmaf(xf[e], wf[e], acc[r]);
                }
            }
        }
        __syncwarp();
        if (lane == 0)
            mbar_arrive(&empty[s]); /* the stage's reads are done */
#pragma unroll
        for (int r = 0; r < kRowsMax; r++)
            if (r < R)
                acc[r] = dsq_warp_sum(acc[r]);
        const int row0 = (ph.unit0 + j * ph.upc) * ph.u; /* first row of the chunk in the matrix */
        if (P == 2) { /* gate/up pairs: act[pair] = bf16(silu(g) * u) */
#pragma unroll
            for (int r = 0; r < kRowsMax; r += 2)
                if (r < R && lane == r) {
                    const float g = acc[r], u = acc[r + 1];
                    const float sg = g / (1.0f + expf(-g));
                    a.act[(row0 + r) / 2] = dsq_f2bf(sg * u);
                }
        } else {
#pragma unroll
            for (int r = 0; r < kRowsMax; r++)
                if (r < R && lane == r) {
                    const int n = row0 + r;
                    if (P == 0)
                        a.qkv[n] = acc[r] + bias[n];
                    else
                        a.x[n] = __ldcg(a.x + n) + acc[r];
                }
        }
    }
#endif
}

/* Attention of layer L, phase B: block b < KV * ns is split (b % ns) of kv
 * head b / ns.  The last split holds the new token: it rotates k, stores k
 * and v into the cache and reads them back like every other key. */
template <int GQ>
__device__ void attend(const dsq_persist_layer &L, const dsq_persist_args &a, const Plan &pl, int len,
                       unsigned char *U, int *flag)
{
    constexpr int kGMax = GQ, g = GQ; /* query heads per kv head */
    const int b = blockIdx.x, t = threadIdx.x, lane = t & 31, warp = t >> 5;
    const int D = kD, QKV = (a.H + 2 * a.KV) * D;
    int ns = (len + 63) / 64;
    ns = ns > pl.max_splits ? pl.max_splits : ns;
    if (b >= a.KV * ns)
        return;
    const int kvh = b / ns, sp = b % ns;
    const int chunk = (len + ns - 1) / ns;
    const int k0 = sp * chunk, k1 = min(len, k0 + chunk);
    const int pos = len - 1;
    float *qs = reinterpret_cast<float *>(U);                /* [g][D] */
    float *rm = qs + g * D, *rl = rm + AW * g, *racc = rl + AW * g; /* [AW][g], [AW][g], [AW][g][D] */

    /* q heads of the group: rotate, round to bf16 (what the per-kernel path
     * feeds attention), keep in fp32 */
    for (int i = t; i < g * (D / 2); i += NW * 32) {
        const int hh = i / (D / 2), d = i % (D / 2);
        const float *qr = a.qkv + (size_t)(kvh * g + hh) * D;
        float x0 = __ldcg(qr + d), x1 = __ldcg(qr + d + D / 2);
        dsq_rope_pair(x0, x1, pos, a.inv_freq[d]);
        qs[hh * D + d] = __uint_as_float((uint32_t)dsq_f2bf(x0) << 16);
        qs[hh * D + d + D / 2] = __uint_as_float((uint32_t)dsq_f2bf(x1) << 16);
    }
    const int64_t row_new = (int64_t)a.block_table[pos / a.block_size] * a.block_size + pos % a.block_size;
    __half *kc = static_cast<__half *>(L.k), *vc = static_cast<__half *>(L.v);
    if (k1 == len) { /* this split holds the new token */
        const float *kr = a.qkv + (size_t)(a.H + kvh) * D, *vr = a.qkv + (size_t)(a.H + a.KV + kvh) * D;
        __half *ko = kc + (row_new * a.KV + kvh) * D, *vo = vc + (row_new * a.KV + kvh) * D;
        for (int d = t; d < D / 2; d += NW * 32) {
            float x0 = __ldcg(kr + d), x1 = __ldcg(kr + d + D / 2);
            dsq_rope_pair(x0, x1, pos, a.inv_freq[d]);
            ko[d] = __float2half_rn(__uint_as_float((uint32_t)dsq_f2bf(x0) << 16));
            ko[d + D / 2] = __float2half_rn(__uint_as_float((uint32_t)dsq_f2bf(x1) << 16));
        }
        for (int d = t; d < D; d += NW * 32)
            vo[d] = __float2half_rn(__uint_as_float((uint32_t)dsq_f2bf(__ldcg(vr + d)) << 16));
    }
    consumers_sync(); /* q in shared memory; the new K/V row written (the block's own reads see it) */
    (void)QKV;

    if (warp < AW) {
        /* 8 keys per round: for the scores, lanes 4j..4j+3 hold key j, a
         * quarter of its dims each; for P.V lane i holds dims 4i..4i+3 of
         * all 8.  K and V of a round are loaded at once (one trip to
         * memory per round). */
        const float sl2 = 1.4426950408889634f / sqrtf((float)D);
        const int kj = lane >> 2, qq = lane & 3;
        float m[kGMax], l[kGMax], acc[kGMax][4];
#pragma unroll
        for (int h = 0; h < kGMax; h++) {
            m[h] = -INFINITY;
            l[h] = 0.0f;
            acc[h][0] = acc[h][1] = acc[h][2] = acc[h][3] = 0.0f;
        }
        for (int kb = k0 + warp * 8; kb < k1; kb += AW * 8) {
            const int nk = min(8, k1 - kb);
            const bool ok = kj < nk;
            uint4 kq[4];
            uint2 vv[8];
            {
                const int key = kb + (ok ? kj : 0);
                const int64_t row = (int64_t)a.block_table[key / a.block_size] * a.block_size + key % a.block_size;
                const uint4 *kr = reinterpret_cast<const uint4 *>(kc + (row * a.KV + kvh) * D + qq * 32);
#pragma unroll
                for (int e = 0; e < 4; e++)
                    kq[e] = kr[e];
            }
#pragma unroll
            for (int j = 0; j < 8; j++) {
                const int key = kb + (j < nk ? j : 0);
                const int64_t row = (int64_t)a.block_table[key / a.block_size] * a.block_size + key % a.block_size;
                vv[j] = *reinterpret_cast<const uint2 *>(vc + (row * a.KV + kvh) * D + lane * 4);
            }
            float s[kGMax];
#pragma unroll
            for (int h = 0; h < kGMax; h++)
                s[h] = 0.0f;
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const __half2 *k2 = reinterpret_cast<const __half2 *>(&kq[e]);
                float kf[8];
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    const float2 f = __half22float2(k2[i]);
                    kf[2 * i] = f.x;
                    kf[2 * i + 1] = f.y;
                }
#pragma unroll
                for (int h = 0; h < kGMax; h++)
                    if (h < g) {
                        const float *q = qs + h * D + qq * 32 + e * 8;
                        const float4 q0 = *reinterpret_cast<const float4 *>(q);
                        const float4 q1 = *reinterpret_cast<const float4 *>(q + 4);
                        s[h] = fmaf(q0.x, kf[0], s[h]);
                        s[h] = fmaf(q0.y, kf[1], s[h]);
                        s[h] = fmaf(q0.z, kf[2], s[h]);
                        s[h] = fmaf(q0.w, kf[3], s[h]);
                        s[h] = fmaf(q1.x, kf[4], s[h]);
                        s[h] = fmaf(q1.y, kf[5], s[h]);
                        s[h] = fmaf(q1.z, kf[6], s[h]);
                        s[h] = fmaf(q1.w, kf[7], s[h]);
                    }
            }
            float p[kGMax];
#pragma unroll
            for (int h = 0; h < kGMax; h++) {
                if (h >= g)
                    break;
                float sv = s[h] + __shfl_xor_sync(0xffffffffu, s[h], 1);
                sv += __shfl_xor_sync(0xffffffffu, sv, 2);
                sv = ok ? sv * sl2 : -INFINITY;
                float mx = sv;
#pragma unroll
                for (int o = 16; o >= 4; o >>= 1)
                    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
                const float mn = fmaxf(m[h], mx);
                const float corr = m[h] == -INFINITY ? 0.0f : exp2f(m[h] - mn);
                p[h] = ok ? exp2f(sv - mn) : 0.0f;
                l[h] = l[h] * corr + dsq_warp_sum(qq == 0 ? p[h] : 0.0f);
                m[h] = mn;
#pragma unroll
                for (int e = 0; e < 4; e++)
                    acc[h][e] *= corr;
            }
#pragma unroll
            for (int j = 0; j < 8; j++) {
                const float2 v01 = __half22float2(*reinterpret_cast<const __half2 *>(&vv[j].x));
                const float2 v23 = __half22float2(*reinterpret_cast<const __half2 *>(&vv[j].y));
#pragma unroll
                for (int h = 0; h < kGMax; h++) {
                    if (h >= g)
                        break;
                    const float pj = __shfl_sync(0xffffffffu, p[h], 4 * j); /* 0 past nk */
                    acc[h][0] = fmaf(pj, v01.x, acc[h][0]);
                    acc[h][1] = fmaf(pj, v01.y, acc[h][1]);
                    acc[h][2] = fmaf(pj, v23.x, acc[h][2]);
                    acc[h][3] = fmaf(pj, v23.y, acc[h][3]);
                }
            }
        }
#pragma unroll
        for (int h = 0; h < kGMax; h++) {
            if (h >= g)
                break;
            if (lane == 0) {
                rm[warp * g + h] = m[h];
                rl[warp * g + h] = l[h];
            }
            *reinterpret_cast<float4 *>(racc + ((size_t)warp * g + h) * D + lane * 4) =
                make_float4(acc[h][0], acc[h][1], acc[h][2], acc[h][3]);
        }
    }
    consumers_sync();

    /* the block's warps combined: thread (h, d) */
    float *part = a.part + ((size_t)kvh * pl.max_splits) * g * (D + 2);
    for (int i = t; i < g * D; i += NW * 32) {
        const int h = i / D, d = i % D;
        float M = -INFINITY;
        for (int w = 0; w < AW; w++)
            M = fmaxf(M, rm[w * g + h]);
        float Ls = 0.0f, A = 0.0f;
        for (int w = 0; w < AW; w++) {
            const float mw = rm[w * g + h];
            if (mw == -INFINITY)
                continue;
            const float f = exp2f(mw - M);
            Ls += rl[w * g + h] * f;
            A += racc[((size_t)w * g + h) * D + d] * f;
        }
        if (ns == 1) {
            a.attn[(size_t)(kvh * g + h) * D + d] = dsq_f2bf(A / Ls);
        } else {
            float *pp = part + ((size_t)sp * g + h) * (D + 2);
            pp[d] = A;
            if (d == 0) {
                pp[D] = M;
                pp[D + 1] = Ls;
            }
        }
    }
    if (ns == 1)
        return;
    /* the last split of this kv head to finish merges them all */
    consumers_sync();
    if (t == 0) {
        __threadfence();
        const unsigned tk = atomicAdd(a.sync + kSyncTicket + kvh, 1u);
        *flag = tk == (unsigned)ns - 1;
        if (*flag) {
            atomicExch(a.sync + kSyncTicket + kvh, 0u);
            __threadfence();
        }
    }
    consumers_sync();
    if (!*flag)
        return;
    for (int i = t; i < g * D; i += NW * 32) {
        const int h = i / D, d = i % D;
        float M = -INFINITY;
        for (int s2 = 0; s2 < ns; s2++)
            M = fmaxf(M, __ldcg(part + ((size_t)s2 * g + h) * (D + 2) + D));
        float Ls = 0.0f, A = 0.0f;
        for (int s2 = 0; s2 < ns; s2++) {
            const float *pp = part + ((size_t)s2 * g + h) * (D + 2);
            const float ms = __ldcg(pp + D);
            if (ms == -INFINITY)
                continue;
            const float f = exp2f(ms - M);
            Ls += __ldcg(pp + D + 1) * f;
            A += __ldcg(pp + d) * f;
        }
        a.attn[(size_t)(kvh * g + h) * D + d] = dsq_f2bf(A / Ls);
    }
}

template <int GQ> __global__ void __maxnreg__(128) persist_kernel(KArgs ka)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    extern __shared__ __align__(128) unsigned char sm[];
    const dsq_persist_args &a = ka.a;
    const Plan &pl = ka.pl;
    uint64_t *full = reinterpret_cast<uint64_t *>(sm), *empty = full + kStagesMax;
    int *flag = reinterpret_cast<int *>(empty + kStagesMax);
    float *red = reinterpret_cast<float *>(flag + 4);
    unsigned char *U = sm + kHeader;
    unsigned char *ring = U + pl.U;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, b = blockIdx.x;

    if (threadIdx.x == 0) {
        for (int s = 0; s < pl.NS; s++) {
            mbar_init(&full[s], 1);
            mbar_init(&empty[s], 1);
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
        flag[2] = 0;
    }
    __syncthreads();

    if (warp == NW) { /* producer */
        if (lane != 0 || (ka.dbg & 32))
            return;
        uint64_t pol;
        asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
        uint32_t c = 0;
        const int nl = (ka.dbg & 4) ? 1 : (ka.dbg >> 16) ? min(ka.dbg >> 16, a.n_layers) : a.n_layers;
        Cursor q;
        q.l = q.p = q.j = 0;
        q.ph = phase_of(a.layers[0], 0, a, pl, b);
        for (int i = 0; i < ka.pf; i++)
            prefetch_next(q, a, pl, b, nl, ka.dbg);
        for (int l = 0; l < nl; l++) {
            const dsq_persist_layer L = a.layers[(ka.dbg & 64) ? 0 : l];
            for (int p = 0; p < 4; p++) {
                if (ka.dbg & 1024) /* no running ahead of the consumers' phase */
                    while (*(volatile int *)(flag + 2) < l * 4 + p) {
                    }
                const Phase ph = phase_of(L, p, a, pl, b);
                for (int j = 0; j < ph.nchunks; j++, c++) {
                    const int s = (int)(c % (uint32_t)pl.NS);
                    if (c >= (uint32_t)pl.NS)
                        mbar_wait(&empty[s], ((c / (uint32_t)pl.NS) - 1u) & 1u);
                    const int units = min(ph.upc, ph.nunits - j * ph.upc);
                    const unsigned bytes = (unsigned)(units * ph.u * ph.K * 2);
                    mbar_expect_tx(&full[s], bytes);
                    if (ka.dbg & 2) {
                        for (unsigned o = 0; o < bytes; o += 2048)
                            bulk_copy(ring + (size_t)s * pl.SB + o,
                                      (const char *)(ph.w + (size_t)j * ph.upc * ph.u * ph.K) + o,
                                      bytes - o < 2048 ? bytes - o : 2048, &full[s], pol);
                    } else {
                        bulk_copy(ring + (size_t)s * pl.SB, ph.w + (size_t)j * ph.upc * ph.u * ph.K, bytes, &full[s],
                                  pol);
                    }
                    if (ka.pf > 0)
                        prefetch_next(q, a, pl, b, nl, ka.dbg);
                }
            }
        }
        return;
    }

    const int len = __ldcg(a.len);
    uint16_t *xs = reinterpret_cast<uint16_t *>(U);
    uint32_t c = 0;
    const int nl = (ka.dbg & 4) ? 1 : (ka.dbg >> 16) ? min(ka.dbg >> 16, a.n_layers) : a.n_layers;
    for (int l = 0; l < nl; l++) {
        const dsq_persist_layer L = a.layers[(ka.dbg & 64) ? 0 : l];
        if (l > 0)
            if (!(ka.dbg & 256)) /* timing: no barriers (results wrong) */
                grid_sync(a.sync, pl.G);
        /* A: RMSNorm, q|k|v + bias */
        norm_into(a.x, L.norm_attn, a.eps, a.E, xs, red);
        if (threadIdx.x == 0)
            *(volatile int *)(flag + 2) = l * 4 + 0;
        Phase ph = phase_of(L, 0, a, pl, b);
        if (!(ka.dbg & 32))
            consume<0>(ph, c, pl, ring, full, empty, xs, a, L.b_qkv, ka.dbg);
        c += ph.nchunks;
        if (!(ka.dbg & 256)) /* timing: no barriers (results wrong) */
                grid_sync(a.sync, pl.G);
        /* B: RoPE, KV write, attention */
        if (!(ka.dbg & 1))
            attend<GQ>(L, a, pl, len, U, flag);
        if (!(ka.dbg & 256)) /* timing: no barriers (results wrong) */
                grid_sync(a.sync, pl.G);
        /* C: o + residual */
        load_vec(a.attn, a.H * a.D, xs);
        if (threadIdx.x == 0)
            *(volatile int *)(flag + 2) = l * 4 + 1;
        ph = phase_of(L, 1, a, pl, b);
        if (!(ka.dbg & 32))
            consume<1>(ph, c, pl, ring, full, empty, xs, a, nullptr, ka.dbg);
        c += ph.nchunks;
        if (!(ka.dbg & 256)) /* timing: no barriers (results wrong) */
                grid_sync(a.sync, pl.G);
        /* D: RMSNorm, gate/up, SiLU*mul */
        norm_into(a.x, L.norm_ffn, a.eps, a.E, xs, red);
        if (threadIdx.x == 0)
            *(volatile int *)(flag + 2) = l * 4 + 2;
        ph = phase_of(L, 2, a, pl, b);
        if (!(ka.dbg & 32))
            consume<2>(ph, c, pl, ring, full, empty, xs, a, nullptr, ka.dbg);
        c += ph.nchunks;
        if (!(ka.dbg & 256)) /* timing: no barriers (results wrong) */
                grid_sync(a.sync, pl.G);
        /* E: down + residual */
        load_vec(a.act, a.F, xs);
        if (threadIdx.x == 0)
            *(volatile int *)(flag + 2) = l * 4 + 3;
        ph = phase_of(L, 3, a, pl, b);
        if (!(ka.dbg & 32))
            consume<3>(ph, c, pl, ring, full, empty, xs, a, nullptr, ka.dbg);
        c += ph.nchunks;
    }
#else
    __trap();
#endif
}

/* The device's plan for a shape (host). */
static bool make_plan(int E, int H, int KV, int D, int F, int n_sms, Plan *pl, const char **why)
{
    const int g = KV > 0 ? H / KV : 0;
    if (D != kD || KV < 1 || H % KV != 0 || g > kGroupMax) {
        *why = "head_dim 128 and at most 6 query heads per kv head";
        return false;
    }
    if (E % 8 != 0 || F % 8 != 0 || (H * D) % 8 != 0) {
        *why = "hidden and intermediate sizes multiples of 8";
        return false;
    }
    if (KV * 8 + 8 > DSQ_PERSIST_SYNC_WORDS) {
        *why = "too many kv heads";
        return false;
    }
    const int maxK = E > F ? (E > H * D ? E : H * D) : (F > H * D ? F : H * D);
    /* stages hold a whole row of the longest K and a whole gate/up pair */
    int sb = 2 * maxK > 4 * E ? 2 * maxK : 4 * E;
    sb = (sb + 4 * E - 1) / (4 * E) * (4 * E); /* whole gate/up pairs and q|k|v rows */
    sb = (sb + 127) / 128 * 128;
    const int attn = g * D * 4 + 2 * AW * g * 4 + AW * g * D * 4;
    int u = 2 * maxK > attn ? 2 * maxK : attn;
    u = (u + 127) / 128 * 128;
    const int ns = (kSmemMax - kHeader - u) / sb;
    if (ns < 2) {
        *why = "shared memory too small for two stages";
        return false;
    }
    pl->SB = sb;
    pl->NS = ns > kStagesMax ? kStagesMax : ns;
    pl->U = u;
    pl->G = n_sms;
    pl->max_splits = n_sms / KV;
    return true;
}

static size_t plan_smem(const Plan &pl) { return (size_t)kHeader + pl.U + (size_t)pl.NS * pl.SB; }

/* The kernel instance for g query heads per kv head (1..kGroupMax). */
static void (*kernel_for(int g))(KArgs)
{
    switch (g) {
    case 1: return persist_kernel<1>;
    case 2: return persist_kernel<2>;
    case 3: return persist_kernel<3>;
    case 4: return persist_kernel<4>;
    case 5: return persist_kernel<5>;
    case 6: return persist_kernel<6>;
    default: return nullptr;
    }
}

} // namespace

extern "C" int dsq_persist_supported(int32_t E, int32_t H, int32_t KV, int32_t D, int32_t F, const char **reason)
{
    const char *why = NULL;
    int dev = 0, major = 0, sms = 0;
    cudaFuncAttributes fa;
    Plan pl;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) {
        cudaGetLastError();
        why = "device query failed";
    } else if (major < 9) {
        why = "needs an sm_90 or newer device";
    } else if (!make_plan(E, H, KV, D, F, sms, &pl, &why)) {
        /* why set */
    } else if (cudaFuncGetAttributes(&fa, kernel_for(H / KV)) != cudaSuccess) {
        cudaGetLastError();
        why = "kernel not in this build for the device";
    } else if (fa.binaryVersion < 90 && fa.ptxVersion < 90) {
        why = "build has no sm_90 code";
    } else if (cudaFuncSetAttribute(kernel_for(H / KV), cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    (int)plan_smem(pl)) != cudaSuccess) {
        cudaGetLastError();
        why = "shared memory attribute refused";
    } else {
        int per_sm = 0;
        if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel_for(H / KV), kThreads, plan_smem(pl)) !=
                cudaSuccess ||
            per_sm < 1) {
            cudaGetLastError();
            why = "no block fits an SM";
        }
    }
    if (reason)
        *reason = why;
    return why == NULL;
}

extern "C" size_t dsq_persist_part_bytes(int32_t H, int32_t KV, int32_t D)
{
    int dev = 0, sms = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) {
        cudaGetLastError();
        sms = 256;
    }
    const int g = KV > 0 ? H / KV : 1;
    return (size_t)KV * (size_t)(sms / (KV > 0 ? KV : 1)) * g * (D + 2) * 4;
}

extern "C" dsq_status dsq_persist_decode(const dsq_persist_args *a, cudaStream_t stream)
{
    int dev = 0, sms = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess)
        return dsq_cu_status(cudaGetLastError(), "persistent decode: device query");
    KArgs ka;
    ka.a = *a;
    const char *dbg = getenv("DSQ_PERSIST_DBG");
    ka.dbg = dbg ? atoi(dbg) : 0;
    const char *pf = getenv("DSQ_PERSIST_PF");
    ka.pf = pf && atoi(pf) > 0 ? atoi(pf) : 0;
    const char *why = NULL;
    if (!make_plan(a->E, a->H, a->KV, a->D, a->F, sms, &ka.pl, &why))
        return dsq_fail(DSQ_ERR_INTERNAL, "persistent decode: %s", why);
    /* fewer ring stages than the shared memory holds: a test knob, so that
     * the tiny model (16 stages fit) also runs with fewer stages than
     * consumer warps, as the full-size model does (11) */
    const char *cap = getenv("DSQ_PERSIST_STAGES");
    if (cap && atoi(cap) >= 2 && atoi(cap) < ka.pl.NS)
        ka.pl.NS = atoi(cap);
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3((unsigned)ka.pl.G);
    cfg.blockDim = dim3(kThreads);
    cfg.dynamicSmemBytes = plan_smem(ka.pl);
    cfg.stream = stream;
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeCooperative;
    at[0].val.cooperative = 1;
    cfg.attrs = at;
    cfg.numAttrs = 1;
    return dsq_cu_status(cudaLaunchKernelEx(&cfg, kernel_for(a->H / a->KV), ka), "persistent decode kernel");
}
