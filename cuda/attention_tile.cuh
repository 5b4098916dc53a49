/*
 * attention_tile.cuh - device pieces shared by the prefill and decode
 * attention kernels: the KV row mapping, tensor-core wrappers
 * (ldmatrix, mma.sync m16n8k16 f16 -> f32), and the loader that brings a
 * 64-key tile of K and V from the cache into shared memory as fp16.
 * Private to attention_prefill.cu / attention_decode.cu.
 */
#ifndef DSQ_ATTENTION_TILE_CUH
#define DSQ_ATTENTION_TILE_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include "attention.h"
#include "pdl.cuh"

namespace dsq_attn {

constexpr int kThreads = 128; /* 4 warps per block, both kernels          */
constexpr int kTileKeys = 64; /* keys per shared-memory tile              */

/* The cache as the kernels see it (kernel argument, by value). */
struct KvArgs {
    const void *k, *v;       /* [rows][n_kv][D] fp16 | int8 */
    const float *ks, *vs;    /* [rows][n_kv] (INT8)         */
    const int32_t *bt;       /* [n_batch_seqs][bt_stride]   */
    int32_t bt_stride, bs, n_kv;
    int32_t bs_shift;        /* log2(bs) when bs is a power of two, else -1 */
};

static inline KvArgs kv_args(const dsq_attn_kv *kv)
{
    KvArgs a;
    a.k = kv->k;
    a.v = kv->v;
    a.ks = kv->k_scale;
    a.vs = kv->v_scale;
    a.bt = kv->block_table;
    a.bt_stride = kv->bt_stride;
    a.bs = kv->block_size;
    a.n_kv = kv->n_kv_heads;
    a.bs_shift = -1;
    for (int sh = 0; sh < 31; sh++)
        if (kv->block_size == (1 << sh))
            a.bs_shift = sh;
    return a;
}

/* Block index bi and offset in of position pos (paged caches have
 * power-of-two blocks, 16: a shift, not a division). */
__device__ __forceinline__ void kv_block_of(const KvArgs &a, int pos, int &bi, int &in)
{
    bi = a.bs_shift >= 0 ? pos >> a.bs_shift : pos / a.bs;
    in = a.bs_shift >= 0 ? pos & (a.bs - 1) : pos - bi * a.bs;
}

/* Physical row of position `pos` of batch sequence `b` (see attention.h). */
__device__ __forceinline__ int64_t kv_row(const KvArgs &a, int b, int pos)
{
    int bi, in;
    kv_block_of(a, pos, bi, in);
    return (int64_t)__ldg(a.bt + (int64_t)b * a.bt_stride + bi) * a.bs + in;
}

/* Physical row of position pos0 when positions pos0 .. pos0 + n - 1 all lie
 * in one block (then row(pos0 + r) = that + r: one block-table read for a
 * whole tile, as in a static cache), else -1. */
__device__ __forceinline__ int64_t kv_run_row(const KvArgs &a, int b, int pos0, int n)
{
    int bi, in;
    kv_block_of(a, pos0, bi, in);
    return in + n > a.bs ? -1 : kv_row(a, b, pos0);
}

/* kv_run_row without its division where the table has one block per
 * sequence (static caches: bt_stride 1, a block of the whole capacity, whose
 * size need not be a power of two): every valid position lies in block 0.
 * Same value as kv_run_row for every valid position. */
__device__ __forceinline__ int64_t kv_run_row_lean(const KvArgs &a, int b, int pos0, int n)
{
    if (a.bt_stride == 1)
        return pos0 + n > a.bs ? -1 : (int64_t)__ldg(a.bt + b) * a.bs + pos0;
    return kv_run_row(a, b, pos0, n);
}

/* Physical row of position pos in a table of power-of-two blocks
 * (a.bs_shift >= 0; bt_row: the sequence's row of the table): kv_row
 * without its branch between a shift and a division. */
__device__ __forceinline__ int64_t kv_pow2_row(const KvArgs &a, const int32_t *bt_row, int pos)
{
    return (int64_t)__ldg(bt_row + (pos >> a.bs_shift)) * a.bs + (pos & (a.bs - 1));
}

/* K/V row index (physical row * n_kv + kvh: multiply by D for the first
 * element, or index the INT8 scales with it) of key key0 + r of a tile
 * whose physical rows start at `run` (kv_run_row; < 0: looked up per key).
 * Every K/V tile load of both attention kernels addresses rows with it. */
__device__ __forceinline__ int64_t kv_tile_row(const KvArgs &a, int b, int kvh, int key0, int r, int64_t run)
{
    return (run >= 0 ? run + r : kv_row(a, b, key0 + r)) * a.n_kv + kvh;
}

/* ---- tensor-core wrappers ------------------------------------------------- */

__device__ __forceinline__ uint32_t smem_u32(const void *p)
{
    return (uint32_t)__cvta_generic_to_shared(p);
}

__device__ __forceinline__ void ldsm_x4(uint32_t r[4], const void *p)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_u32(p)));
}

__device__ __forceinline__ void ldsm_x4_t(uint32_t r[4], const void *p)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_u32(p)));
}

/* c[4] += a[4] (16x16 fp16, row) * b0,b1 (16x8 fp16, col), fp32 accumulate */
__device__ __forceinline__ void mma16816(float c[4], const uint32_t a[4], uint32_t b0,
                                         uint32_t b1)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t pack_half2(float lo, float hi)
{
    __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&h);
}

/* 16-byte async copy global -> shared; src_bytes 0 writes zeros. */
__device__ __forceinline__ void cp_async16(void *dst, const void *src, int src_bytes)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(dst)),
                 "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n"); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n"); }

/* 4 int8 (one word) -> 4 fp16, exact: bias to unsigned, splice the byte into
 * the mantissa of 1024.0 and subtract 1024+128. */
__device__ __forceinline__ void i8x4_to_h4(uint32_t w, uint32_t &lo, uint32_t &hi)
{
    w ^= 0x80808080u;
    uint32_t a = __byte_perm(w, 0x64646464u, 0x4140);
    uint32_t b = __byte_perm(w, 0x64646464u, 0x4342);
    const __half2 bias = __halves2half2(__ushort_as_half(0x6480), __ushort_as_half(0x6480));
    __half2 ha = __hsub2(*reinterpret_cast<__half2 *>(&a), bias);
    __half2 hb = __hsub2(*reinterpret_cast<__half2 *>(&b), bias);
    lo = *reinterpret_cast<uint32_t *>(&ha);
    hi = *reinterpret_cast<uint32_t *>(&hb);
}

/* bf16x8 (16 B) -> fp16x8 (16 B).  Exact for |x| <= 65504 (bf16 has fewer
 * mantissa bits); larger finite values saturate; NaN and Inf stay NaN and
 * Inf (fminf/fmaxf alone would turn NaN into -65504). */
__device__ __forceinline__ uint4 bf16x8_to_h8(uint4 in)
{
    uint32_t w[4] = {in.x, in.y, in.z, in.w};
    uint32_t o[4];
#pragma unroll
    for (int i = 0; i < 4; i++) {
        __nv_bfloat162 b = *reinterpret_cast<__nv_bfloat162 *>(&w[i]);
        float2 f = __bfloat1622float2(b);
        f.x = isfinite(f.x) ? fminf(fmaxf(f.x, -65504.f), 65504.f) : f.x;
        f.y = isfinite(f.y) ? fminf(fmaxf(f.y, -65504.f), 65504.f) : f.y;
        o[i] = pack_half2(f.x, f.y);
    }
    return make_uint4(o[0], o[1], o[2], o[3]);
}

/* ---- K/V tile loaders ---------------------------------------------------------
 * Two shared layouts of a tile of kTileKeys rows (keys) x D fp16:
 *  padded (SW false): [kTileKeys][D + 8], the layout ldmatrix reads (the
 *    16-byte pad puts the 8 rows an ldmatrix reads in distinct bank groups);
 *  swizzled (SW true): [D / 64][kTileKeys][64], each row of a 64-column
 *    block 128 bytes whose 16-byte chunk c sits at c ^ (row % 8) -- the
 *    128-byte swizzle wgmma reads (wgmma.cuh), as K-major B for K and
 *    N-major B for V; the tile must start 1024-byte aligned.
 * tile_chunk: offset in halves of chunk c (halves 8c .. 8c + 7) of row r. */
template <int D, bool SW> __device__ __forceinline__ int tile_chunk(int r, int c)
{
    if constexpr (SW)
        return (c >> 3) * (kTileKeys * 64) + r * 64 + ((c & 7) ^ (r & 7)) * 8;
    else
        return r * (D + 8) + c * 8;
}

/* The LEAN loaders' copies (kv_issue_f16's LEAN, attention_decode.cu's
 * INT8 dec_issue): K and V of keys key0 .. key0 + 63 of kv head kvh, rows of
 * CPR 16-byte chunks, thread t taking chunk t % CPR of rows t / CPR + i *
 * RS (the general loops' assignment), keys >= key_end zero-filled, into
 * stage bytes sk / sv + dst(row, chunk).  Where the tile is one run of
 * rows (run >= 0, kv_run_row_lean) each address is the first plus a fixed
 * step: the run's 64 rows lie in one block of the cache, so every address
 * is inside it, rows past key_end too (zero-filled, never read).  A paged
 * tile across power-of-two blocks looks each row up without the general
 * loops' branches.  false: neither (a block size that is not a power of
 * two), the caller's general loop copies. */
template <int CPR, class Dst>
__device__ __forceinline__ bool kv_issue_lean(const KvArgs &a, int b, int kvh, int key0, int key_end, int64_t run,
                                              unsigned char *sk, unsigned char *sv, Dst dst)
{
    static_assert(kThreads % CPR == 0 && kTileKeys * CPR % kThreads == 0, "a thread's chunks share one column");
    constexpr int RS = kThreads / CPR, N = kTileKeys * CPR / kThreads;
    const int t = threadIdx.x, r0 = t / CPR, cc = t % CPR;
    const int64_t rowb = (int64_t)CPR * 16; /* bytes of one head's row */
    if (run >= 0) {
        const int64_t off0 = ((run + r0) * a.n_kv + kvh) * rowb + cc * 16, step = (int64_t)RS * a.n_kv * rowb;
        const unsigned char *gk = (const unsigned char *)a.k + off0, *gv = (const unsigned char *)a.v + off0;
#pragma unroll
        for (int i = 0; i < N; i++) {
            const int r = r0 + i * RS, n = key0 + r < key_end ? 16 : 0, o = dst(r, cc);
            cp_async16(sk + o, gk, n);
            cp_async16(sv + o, gv, n);
            gk += step;
            gv += step;
        }
        return true;
    }
    if (a.bs_shift < 0)
        return false;
    const int32_t *bt_row = a.bt + (int64_t)b * a.bt_stride;
#pragma unroll
    for (int i = 0; i < N; i++) {
        const int r = r0 + i * RS, pos = key0 + r, o = dst(r, cc);
        const bool ok = pos < key_end;
        const int64_t off = ok ? (kv_pow2_row(a, bt_row, pos) * a.n_kv + kvh) * rowb + cc * 16 : 0;
        cp_async16(sk + o, (const unsigned char *)a.k + off, ok ? 16 : 0);
        cp_async16(sv + o, (const unsigned char *)a.v + off, ok ? 16 : 0);
    }
    return true;
}

/* An fp16 tile, as both kernels stage it: K and V of keys key0 ..
 * key0 + 63 of kv head kvh (keys >= key_end zero-filled) into sk, sv (layout
 * SW, above) by cp.async, 16 bytes per copy; the caller commits the group.
 * (INT8 tiles differ by kernel on purpose: prefill converts them to fp16
 * for the tensor cores, TileLoader below; decode keeps the raw bytes for its
 * register fragments, attention_decode.cu's dec_issue.)
 *
 * LEAN: the same copies by kv_issue_lean where it can (a tile that is one
 * run of rows: static caches always, but for a tile past the capacity's
 * end; a paged tile of power-of-two blocks): the general loop below
 * computes every chunk's row on its own (a branch, 64-bit products and, for
 * a static cache whose capacity is not a power of two, a division per
 * tile; ~44 instructions a chunk in the decode kernel's SASS). */
template <int D, bool SW = false, bool LEAN = false>
__device__ __forceinline__ void kv_issue_f16(const KvArgs &a, int b, int kvh, int key0, int key_end, __half *sk,
                                             __half *sv)
{
    constexpr int CPR = D / 8; /* 16-byte chunks per row */
    static_assert(kTileKeys * CPR % kThreads == 0, "tile must split evenly");
    const int t = threadIdx.x;
    const int64_t run = LEAN ? kv_run_row_lean(a, b, key0, kTileKeys) : kv_run_row(a, b, key0, kTileKeys);
    if (LEAN && kv_issue_lean<CPR>(a, b, kvh, key0, key_end, run, (unsigned char *)sk, (unsigned char *)sv,
                                   [](int r, int c) { return tile_chunk<D, SW>(r, c) * 2; }))
        return;
#pragma unroll
    for (int i = 0; i < kTileKeys * CPR / kThreads; i++) {
        const int c = t + i * kThreads, r = c / CPR, cc = c % CPR;
        const bool ok = key0 + r < key_end;
        const int64_t off = ok ? kv_tile_row(a, b, kvh, key0, r, run) * D : 0;
        const __half *gk = (const __half *)a.k + off + cc * 8, *gv = (const __half *)a.v + off + cc * 8;
        const int so = tile_chunk<D, SW>(r, cc);
        cp_async16(sk + so, ok ? (const void *)gk : a.k, ok ? 16 : 0);
        cp_async16(sv + so, ok ? (const void *)gv : a.v, ok ? 16 : 0);
    }
}

/* The prefill kernel's loader.  Shared layout per buffer: sk, sv fp16 tiles
 * in layout SW (tile_chunk), sks, svs [kTileKeys] fp32 (INT8 scales; 0 for
 * keys past the end).
 * issue(): start loading keys key0 .. key0+63 (keys >= key_end read as 0).
 *   fp16: cp.async straight into the buffer; INT8: 16-byte loads into
 *   registers (so they overlap the compute on the other buffer).
 * commit(): INT8 only: convert the staged registers to fp16 into the buffer.
 * The caller waits (cp_async_wait_all) and __syncthreads before reading. */
template <int D, bool INT8, bool SW = false> struct TileLoader {
    static constexpr int kChunks = INT8 ? kTileKeys * D / 16 : kTileKeys * D / 8;
    static constexpr int kPerThread = kChunks / kThreads;             /* per K (and per V)   */
    static constexpr int kChunksPerRow = INT8 ? D / 16 : D / 8;
    static_assert(kChunks % kThreads == 0, "tile must split evenly");

    uint4 rk[INT8 ? kPerThread : 1], rv[INT8 ? kPerThread : 1];
    float rscale;

    __device__ __forceinline__ void issue(const KvArgs &a, int b, int kvh, int key0,
                                          int key_end, __half *sk, __half *sv, float *sks,
                                          float *svs)
    {
        if constexpr (!INT8) {
            kv_issue_f16<D, SW>(a, b, kvh, key0, key_end, sk, sv);
            cp_async_commit();
        } else {
            const int t = threadIdx.x;
            const int64_t run = kv_run_row(a, b, key0, kTileKeys);
#pragma unroll
            for (int i = 0; i < kPerThread; i++) {
                int c = t + i * kThreads;
                int r = c / kChunksPerRow, cc = c % kChunksPerRow;
                bool ok = key0 + r < key_end;
                int64_t off = ok ? kv_tile_row(a, b, kvh, key0, r, run) * D : 0;
                uint4 z = make_uint4(0, 0, 0, 0);
                rk[i] = ok ? __ldg((const uint4 *)((const int8_t *)a.k + off + cc * 16)) : z;
                rv[i] = ok ? __ldg((const uint4 *)((const int8_t *)a.v + off + cc * 16)) : z;
            }
            /* threads 0..63: K scales, 64..127: V scales */
            const int r = t & (kTileKeys - 1);
            rscale = 0.f;
            if (key0 + r < key_end)
                rscale = __ldg((t < kTileKeys ? a.ks : a.vs) + kv_tile_row(a, b, kvh, key0, r, run));
        }
    }

    __device__ __forceinline__ void commit(__half *sk, __half *sv, float *sks, float *svs)
    {
        if (!INT8)
            return;
        const int t = threadIdx.x;
#pragma unroll
        for (int i = 0; i < kPerThread; i++) {
            int c = t + i * kThreads;
            int r = c / kChunksPerRow, cc = c % kChunksPerRow;
            uint4 o0, o1;
            i8x4_to_h4(rk[i].x, o0.x, o0.y);
            i8x4_to_h4(rk[i].y, o0.z, o0.w);
            i8x4_to_h4(rk[i].z, o1.x, o1.y);
            i8x4_to_h4(rk[i].w, o1.z, o1.w);
            *(uint4 *)(sk + tile_chunk<D, SW>(r, 2 * cc)) = o0;
            *(uint4 *)(sk + tile_chunk<D, SW>(r, 2 * cc + 1)) = o1;
            i8x4_to_h4(rv[i].x, o0.x, o0.y);
            i8x4_to_h4(rv[i].y, o0.z, o0.w);
            i8x4_to_h4(rv[i].z, o1.x, o1.y);
            i8x4_to_h4(rv[i].w, o1.z, o1.w);
            *(uint4 *)(sv + tile_chunk<D, SW>(r, 2 * cc)) = o0;
            *(uint4 *)(sv + tile_chunk<D, SW>(r, 2 * cc + 1)) = o1;
        }
        (t < kTileKeys ? sks : svs)[t & (kTileKeys - 1)] = rscale;
    }
};

/* Scores of one warp's 16 query rows against 16 keys: s[2][4] (C fragments
 * of two 16x8 blocks) += Q (qf, D/16 A fragments) . K^T, K rows read from
 * shared memory at sk_rows (the first of the 16 keys). */
template <int D>
__device__ __forceinline__ void qk_16keys(float s[2][4], const uint32_t (*qf)[4],
                                          const __half *sk_rows)
{
    const int lane = threadIdx.x & 31;
    const __half *base =
        sk_rows + ((lane & 7) + (lane >> 4) * 8) * (D + 8) + ((lane >> 3) & 1) * 8;
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++) {
        uint32_t b[4];
        ldsm_x4(b, base + kk * 16);
        mma16816(s[0], qf[kk], b[0], b[1]);
        mma16816(s[1], qf[kk], b[2], b[3]);
    }
}

/* o[D/8][4] += P (one A fragment: 16 rows x 16 keys) . V (16 keys from
 * sv_rows, all D dims). */
template <int D>
__device__ __forceinline__ void pv_16keys(float (*o)[4], const uint32_t pa[4],
                                          const __half *sv_rows)
{
    const int lane = threadIdx.x & 31;
    const __half *base =
        sv_rows + ((lane & 7) + ((lane >> 3) & 1) * 8) * (D + 8) + (lane >> 4) * 8;
#pragma unroll
    for (int dp = 0; dp < D / 16; dp++) {
        uint32_t b[4];
        ldsm_x4_t(b, base + dp * 16);
        mma16816(o[2 * dp], pa, b[0], b[1]);
        mma16816(o[2 * dp + 1], pa, b[2], b[3]);
    }
}

/* Load 16 rows x D of Q (bf16 -> fp16) as A fragments, through shared
 * memory sq [16][D+8] (rows of this warp; already filled by the block). */
template <int D>
__device__ __forceinline__ void load_q_frags(uint32_t (*qf)[4], const __half *sq_rows)
{
    const int lane = threadIdx.x & 31;
    const __half *base =
        sq_rows + ((lane & 7) + ((lane >> 3) & 1) * 8) * (D + 8) + (lane >> 4) * 8;
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++)
        ldsm_x4(qf[kk], base + kk * 16);
}

__device__ __forceinline__ float quad_max(float x)
{
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
    return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_sum(float x)
{
    x += __shfl_xor_sync(0xffffffffu, x, 1);
    return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

/* ---- online softmax (base 2), shared by prefill and decode ---------------------
 * State of a thread's two rows (the C-fragment rows lane/4 and lane/4 + 8 of
 * its warp's 16): running max m_r (log2 units, -inf before any key), sum
 * l_r of the weights so far, and the unnormalised output o[D/8][4] (elements
 * 0,1 belong to row 0, elements 2,3 to row 1).
 *
 * online_rescale: fold a new tile whose per-thread score maximum of each row
 * is mt[r] (scores already scaled to log2 units; masked ones -inf): the new
 * max is taken over the quad (the 4 lanes holding a row), l and o are
 * rescaled by alpha = 2^(m_old - m_new), and mu[r] receives the offset the
 * tile's weights use, 2^(s - mu).  A row whose every score so far is -inf
 * keeps m = -inf and uses mu = 0 (its weights are 0, and alpha = 2^-inf = 0
 * leaves the zeros it has).  fmaxf skips a NaN score, so m stays a number;
 * the NaN reaches the output through the NaN weight 2^(NaN - mu).
 *
 * SKIP: the warp leaves o alone where no thread's alpha differs from 1 (no
 * row's max moved: the common case once a sequence's largest scores have
 * been seen), a warp-uniform branch instead of D/2 multiplications per
 * thread; o * 1 is o bit for bit (no flush-to-zero here), so the outputs
 * are the same. */
template <int D, bool SKIP = false>
__device__ __forceinline__ void online_rescale(float m_r[2], float l_r[2], float (*o)[4],
                                               const float mt[2], float mu[2])
{
    float alpha[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const float mn = fmaxf(m_r[r], quad_max(mt[r]));
        mu[r] = mn == -INFINITY ? 0.f : mn;
        alpha[r] = exp2f(m_r[r] - mu[r]);
        m_r[r] = mn;
        l_r[r] *= alpha[r];
    }
    if (SKIP && !__any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f))
        return;
#pragma unroll
    for (int i = 0; i < D / 8; i++) {
        o[i][0] *= alpha[0];
        o[i][1] *= alpha[0];
        o[i][2] *= alpha[1];
        o[i][3] *= alpha[1];
    }
}

/* The weight of score s (log2 units) in row r's sum: 2^(s - mu[r]), added
 * to l_r[r] and returned (before any INT8 V scale). */
__device__ __forceinline__ float online_weight(float s, const float mu[2], float l_r[2], int r)
{
    const float p = exp2f(s - mu[r]);
    l_r[r] += p;
    return p;
}

/* Host: argument checks common to the launchers. */
static inline bool kv_ok(const dsq_attn_kv *kv)
{
    if (!kv || !kv->k || !kv->v || !kv->block_table || kv->block_size <= 0 ||
        kv->bt_stride <= 0 || kv->n_kv_heads <= 0)
        return false;
    if (kv->head_dim != 64 && kv->head_dim != 128)
        return false;
    if (kv->dtype == DSQ_ATTN_KV_INT8)
        return kv->k_scale && kv->v_scale;
    return kv->dtype == DSQ_ATTN_KV_F16;
}

static inline bool aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

/* Shared-memory attribute setters, one per kernel family, for the current
 * device `dev` (dsq_attn_init runs them once per device). */
cudaError_t prefill_init(int dev);
cudaError_t decode_init(int dev);

} /* namespace dsq_attn */

#endif /* DSQ_ATTENTION_TILE_CUH */
