/* sampling.cu - dsq_step() post-processing of logits rows on the GPU: the
 * model's log-probabilities and top-n, penalties from the device copy of the
 * sequence's tokens, greedy, temperature, top-k, top-p, min-p and the draw.
 * Same semantics and order as lib/sample_cpu.c (lib/sampler.c's pipeline).
 *
 * One CTA of 1024 threads per row; nothing is sorted globally.  Top-k, top-p
 * and top-n are all "cut points" in the total order (logit descending, id
 * ascending): the kept set is every token up to the cut.  A cut is found by
 * a mass- (top-p) or count- (top-k, top-n) weighted selection: a 1024-bin
 * histogram of the candidates over their value range finds the bin where the
 * running weight reaches the target; that bin's tokens (a few hundred to
 * ~2,000 for near-flat logits) are gathered into shared memory and sorted
 * exactly.  A bin larger than the gather limit (sample_gcap: 2,048 tokens
 * for 1-4 CTAs per row, 64 for clusters of 8-16, whose peers would each
 * have to pull and sort it) is binned again over its own exact range; a
 * bin of equal values is resolved by id.
 *
 * Masses are fixed point, exp((x - max) / T) * 2^42 as uint64, summed in
 * integers (histograms as three 14-bit limbs in 32-bit shared atomics; a
 * mass histogram counts no tokens, the gather pass counts its bin), so
 * every sum is exact and independent of thread timing: a given (seed,
 * position, logits) always draws the same token.  The draw walks the kept
 * tokens in id order: per-warp sums over contiguous id ranges, then the
 * block, over the one range holding it (per-thread pieces and a scan),
 * finds the token where the running mass passes r = floor(u * kept_mass),
 * u from Philox(seed, position).
 *
 * Penalties: the window's distinct ids are counted in a shared-memory hash
 * table, then each is rewritten in place in the logits row (the raw value is
 * kept in the table for the log-probability of the drawn token).  The logits
 * row is scratch: the caller's copy, if any, was taken before.
 *
 * Few rows (sm_90 and later): the same algorithm runs on a thread-block
 * cluster of CL CTAs per row (k_sample<CL>, CL = 2..16), each CTA owning a
 * contiguous slice of the row's ids for every pass.  Every block reduction
 * is followed by a cluster step through distributed shared memory: each CTA
 * publishes its partial in its own shared memory, a cluster barrier, then
 * every CTA reads all CL partials (max / min / argmax / integer sums are
 * order independent, so every CTA holds the same value and takes the same
 * branches).  Histograms are summed by a reduce-scatter (CTA r sums bins
 * [r*NB/CL, (r+1)*NB/CL) of every peer) and an all-gather; a gathered
 * boundary bin or top-n list is pulled from every CTA into each CTA's
 * shared memory and sorted there (redundantly, identically).  Penalties are
 * rewritten by the CTA owning the id; the draw's rank search runs in the
 * CTA holding the running mass' crossing; the CTA owning the drawn token
 * (rank 0 without one) writes the result.  Results are bit-identical to the
 * one-CTA kernel: the log-probability normaliser is a fixed-point sum too.
 * A cluster barrier separates every remote read of a buffer from the next
 * write of it; a CTA leaves only after a last barrier (its shared memory
 * must outlive its peers' reads). */
#include <float.h>
#include <limits.h>
#include <math.h>

#include <stdlib.h>
#include <string.h>

#include <cooperative_groups.h>

#include "common.cuh"
#include "philox.h"

/* Thread-block clusters and distributed shared memory: sm_90 and later.  On
 * older targets the cluster instances compile to a trap and are never
 * launched (dsq_cu_sample checks the device and the kernel's PTX version). */
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define DSQ_SAMP_CLUSTER 1
#else
#define DSQ_SAMP_CLUSTER 0
#endif

namespace {

constexpr int NT = 1024;        /* threads per row */
constexpr int NW = NT / 32;
constexpr int NB = 1024;        /* histogram bins (== NT: one bin per thread in scans) */
constexpr int GCAP = 2048;      /* boundary bin gathered and sorted in shared memory */
constexpr int PSLOTS = 2 * DSQ_PENALTY_MAX_N; /* penalty hash table */
constexpr int MAXLV = 8;
constexpr float MASS_ONE = 4398046511104.0f; /* 2^42 */

struct Level {
    float hi, sc;
    int b;
};

struct Smem {
    unsigned long long tw[NB]; /* cluster: summed weights of this CTA's bins, [0, NB/CL) */
    uint32_t tc[NB];           /* cluster: summed counts of this CTA's bins */
    uint32_t cnt[NB], l0[NB], l1[NB], l2[NB];
    float gx[GCAP];
    int32_t gi[GCAP];
    float lgx[GCAP];           /* cluster: this CTA's part of a gather */
    int32_t lgi[GCAP];
    int32_t pk[PSLOTS];
    int32_t pc[PSLOTS];
    float praw[PSLOTS];
};

/* one CTA's partial of a cluster reduction, read by its peers */
struct Xch {
    unsigned long long u[2];
    float f[2];
    int i[2];
};

/* block-wide scalars */
struct Bcast {
    Xch xch[2]; /* cluster exchange slots, alternating (Ctx::par) */
    Level lv[MAXLV];
    int nlv;
    float f[4];
    int i[4];
    unsigned long long u[4];
    float redf[NW];
    int redi[NW];
    unsigned long long redu[NW];
    int gcount;
    /* the draw's per-warp-range kept mass and count (Draw), filled by
     * find_cut's last gather when dvalid */
    unsigned long long dmass[NW];
    int dkept[NW];
    int dvalid;
};

__device__ __forceinline__ bool before(float a, int ia, float b, int ib)
{
    return a > b || (a == b && ia < ib);
}

__device__ __forceinline__ bool cut_le(float x, int i, float cx, int ci)
{
    return x > cx || (x == cx && i <= ci);
}

__device__ __forceinline__ int bin_of(float x, float hi, float sc)
{
    float d = hi - x;
    if (!(d > 0.0f))
        return 0;
    d *= sc;
    return d < (float)(NB - 1) ? (int)d : NB - 1;
}

/* exp((x - m) / T) = 2^((x - m) * k2), k2 = log2(e) / T: one rounding of
 * the argument (as the host's (x - m) * inv_t) and the hardware 2^x (relative
 * error ~2^-22); __expf would round x * log2(e) again, and the nucleus edge
 * of a near-flat row moves with the summed error of ~10^5 probabilities. */
__device__ __forceinline__ float prob_rel(float x, float m, float k2)
{
    float r;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"((x - m) * k2));
    return r;
}

__device__ __forceinline__ unsigned long long fx_of(float v) { return __float2ull_rz(v * MASS_ONE); }

__device__ __forceinline__ unsigned long long warp_sum_u64(unsigned long long v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ unsigned long long warp_incl_scan_u64(unsigned long long v)
{
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        unsigned long long t = __shfl_up_sync(0xffffffffu, v, o);
        if (lane >= o)
            v += t;
    }
    return v;
}

/* Inclusive scan of one u64 per thread over the block; *total gets the sum. */
__device__ unsigned long long block_incl_scan_u64(unsigned long long v, Bcast &bc, unsigned long long *total)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    unsigned long long inc = warp_incl_scan_u64(v);
    __syncthreads();
    if (lane == 31)
        bc.redu[warp] = inc;
    __syncthreads();
    if (warp == 0) {
        unsigned long long w = bc.redu[lane];
        unsigned long long wi = warp_incl_scan_u64(w);
        bc.redu[lane] = wi - w; /* exclusive warp offsets */
        if (lane == 31)
            bc.u[3] = wi;
    }
    __syncthreads();
    unsigned long long r = inc + bc.redu[warp];
    *total = bc.u[3];
    __syncthreads();
    return r;
}

__device__ float block_max(float v, Bcast &bc)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    __syncthreads();
    if (lane == 0)
        bc.redf[warp] = v;
    __syncthreads();
    float r = bc.redf[lane];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        r = fmaxf(r, __shfl_xor_sync(0xffffffffu, r, o));
    return r;
}

/* ---- cluster primitives (no-ops below sm_90, where they are never run) ---- */

__device__ __forceinline__ void cl_sync()
{
#if DSQ_SAMP_CLUSTER
    cooperative_groups::this_cluster().sync(); /* arrive.release + wait.acquire */
#endif
}

/* p (this CTA's shared memory) in CTA r of the cluster */
template <typename T> __device__ __forceinline__ T *cl_peer(T *p, int r)
{
#if DSQ_SAMP_CLUSTER
    return cooperative_groups::this_cluster().map_shared_rank(p, (unsigned)r);
#else
    (void)r;
    return p;
#endif
}

__device__ __forceinline__ int cl_rank()
{
#if DSQ_SAMP_CLUSTER
    return (int)cooperative_groups::this_cluster().block_rank();
#else
    return 0;
#endif
}

/* This CTA's place in its row.  par alternates the exchange slot: a slot
 * written for reduction k+2 was last read for reduction k, and every reader
 * of that finished before arriving at reduction k+1's barrier. */
struct Ctx {
    int rank;   /* in the cluster; 0 for CL == 1 */
    int lo, hi; /* this CTA's slice of the valid ids */
    int S;      /* slice length (the owner of id i is i / S) */
    int par;
    int gcap;   /* boundary bins up to this many tokens are gathered and sorted (<= GCAP) */
};

/* Cluster step: thread 0 has written bc.xch[c.par]; after the barrier lane
 * k of every warp gets rank k's slot (lanes >= CL: rank 0's, unused). */
template <int CL> __device__ __forceinline__ const Xch *xch_sync(Ctx &c, Bcast &bc)
{
    cl_sync();
    const int lane = threadIdx.x & 31;
    const Xch *p = cl_peer(&bc.xch[c.par], lane < CL ? lane : 0);
    c.par ^= 1;
    return p;
}

/* max of a and of b over the row (min as max of the negation) */
template <int CL> __device__ void red_max2(Ctx &c, Bcast &bc, float &a, float &b)
{
    a = block_max(a, bc);
    b = block_max(b, bc);
    if constexpr (CL > 1) {
        if (threadIdx.x == 0) {
            bc.xch[c.par].f[0] = a;
            bc.xch[c.par].f[1] = b;
        }
        const Xch *p = xch_sync<CL>(c, bc);
        const int lane = threadIdx.x & 31;
        float ra = lane < CL ? p->f[0] : -INFINITY, rb = lane < CL ? p->f[1] : -INFINITY;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            ra = fmaxf(ra, __shfl_xor_sync(0xffffffffu, ra, o));
            rb = fmaxf(rb, __shfl_xor_sync(0xffffffffu, rb, o));
        }
        a = ra;
        b = rb;
    }
}

template <int CL> __device__ unsigned long long red_sum_u64(Ctx &c, Bcast &bc, unsigned long long v)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = warp_sum_u64(v);
    __syncthreads();
    if (lane == 0)
        bc.redu[warp] = v;
    __syncthreads();
    v = warp_sum_u64(bc.redu[lane]);
    if constexpr (CL > 1) {
        if (threadIdx.x == 0)
            bc.xch[c.par].u[0] = v;
        const Xch *p = xch_sync<CL>(c, bc);
        v = warp_sum_u64(lane < CL ? p->u[0] : 0ull);
    }
    return v;
}

/* min over the cluster of a block-uniform int */
template <int CL> __device__ int red_min_int(Ctx &c, Bcast &bc, int v)
{
    if constexpr (CL > 1) {
        if (threadIdx.x == 0)
            bc.xch[c.par].i[0] = v;
        const Xch *p = xch_sync<CL>(c, bc);
        const int lane = threadIdx.x & 31;
        int r = lane < CL ? p->i[0] : INT_MAX;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1)
            r = min(r, __shfl_xor_sync(0xffffffffu, r, o));
        v = r;
    }
    return v;
}

__device__ __forceinline__ void argmax_merge(float &bv, int &bi)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (before(ov, oi, bv, bi)) {
            bv = ov;
            bi = oi;
        }
    }
}

/* f(v = x[i], i) for every i of [lo, hi) that `for (i = lo + tid; i < hi;
 * i += NT)` gives this thread, in the same order, with four independent
 * loads in flight: a pass over a row slice is bound by load round trips
 * otherwise (one CTA streams its ~150K logits one L2 latency per
 * iteration).  Same visits in the same order per thread, so every
 * thread-local result is the same; what was already order-free across
 * threads stays so (exact integer sums; gathers whose slots come from an
 * atomic counter and are then sorted by a total order). */
template <typename F> __device__ __forceinline__ void for_slice(const float *x, int lo, int hi, F &&f)
{
    int i = lo + (int)threadIdx.x;
    for (; i + 3 * NT < hi; i += 4 * NT) {
        const float v0 = x[i], v1 = x[i + NT], v2 = x[i + 2 * NT], v3 = x[i + 3 * NT];
        f(v0, i);
        f(v1, i + NT);
        f(v2, i + 2 * NT);
        f(v3, i + 3 * NT);
    }
    for (; i < hi; i += NT)
        f(x[i], i);
}

/* The same for a warp's contiguous range [w0, w1): lane visits i = b +
 * lane for b = w0, w0 + 32, ... (i < w1), in that order. */
template <typename F> __device__ __forceinline__ void for_warp_range(const float *x, int w0, int w1, F &&f)
{
    const int lane = threadIdx.x & 31;
    int b = w0;
    for (; b + 128 <= w1; b += 128) {
        const float v0 = x[b + lane], v1 = x[b + 32 + lane], v2 = x[b + 64 + lane], v3 = x[b + 96 + lane];
        f(v0, b + lane);
        f(v1, b + 32 + lane);
        f(v2, b + 64 + lane);
        f(v3, b + 96 + lane);
    }
    for (; b < w1; b += 32)
        if (b + lane < w1)
            f(x[b + lane], b + lane);
}

/* (max, first id holding it) of x[lo..hi) by `before`, over the row; NaN
 * never wins. */
template <int CL>
__device__ void red_argmax(Ctx &c, const float *x, int lo, int hi, Bcast &bc, float *m_out, int *id_out)
{
    float bv = -INFINITY;
    int bi = INT_MAX;
    for_slice(x, lo, hi, [&](float v, int i) {
        if (v == v && before(v, i, bv, bi)) {
            bv = v;
            bi = i;
        }
    });
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    argmax_merge(bv, bi);
    __syncthreads();
    if (lane == 0) {
        bc.redf[warp] = bv;
        bc.redi[warp] = bi;
    }
    __syncthreads();
    bv = bc.redf[lane];
    bi = bc.redi[lane];
    argmax_merge(bv, bi);
    __syncthreads();
    if constexpr (CL > 1) {
        if (threadIdx.x == 0) {
            bc.xch[c.par].f[0] = bv;
            bc.xch[c.par].i[0] = bi;
        }
        const Xch *p = xch_sync<CL>(c, bc);
        bv = lane < CL ? p->f[0] : -INFINITY;
        bi = lane < CL ? p->i[0] : INT_MAX;
        argmax_merge(bv, bi);
    }
    *m_out = bv;
    *id_out = bi;
}

/* The candidate set of one selection: ids in this CTA's slice [lo, hi) with
 * x >= lo_thr, inside the bins chosen at every level so far. */
struct Sel {
    const float *x;
    int lo, hi;
    float lo_thr;
    bool mass;  /* weight exp((x-m)/T) (fixed point) instead of 1 */
    float m, inv_t;
};

__device__ __forceinline__ bool member(const Sel &s, const Bcast &bc, float v)
{
    if (!(v >= s.lo_thr))
        return false;
    for (int l = 0; l < bc.nlv; l++)
        if (bin_of(v, bc.lv[l].hi, bc.lv[l].sc) != bc.lv[l].b)
            return false;
    return true;
}

/* Where v stands against the boundary bins of every level so far: 1 above
 * them (a higher value: kept by any cut inside them), 0 inside all of them
 * (a member), -1 below or not a candidate.  Bins are monotone in v (bin_of
 * falls as v rises), so the first level where v leaves the boundary bin
 * decides. */
__device__ __forceinline__ int classify(const Sel &s, const Bcast &bc, float v)
{
    if (!(v >= s.lo_thr))
        return -1;
    for (int l = 0; l < bc.nlv; l++) {
        const int b = bin_of(v, bc.lv[l].hi, bc.lv[l].sc);
        if (b != bc.lv[l].b)
            return b < bc.lv[l].b ? 1 : -1;
    }
    return 0;
}

/* The draw's partition of this CTA's slice (contiguous id ranges, one per
 * warp) and its keep rule beyond the cut (min-p), for find_cut to fill the
 * draw's per-range sums in its last gather pass instead of the draw making
 * a pass of its own. */
struct Draw {
    int C;       /* ids per warp range (a multiple of 32) */
    float min_p;
};

/* v, a token the cut keeps: its mass and count into a thread's (am, ak)
 * where min-p keeps it too */
__device__ __forceinline__ void draw_keep(const Sel &s, const Draw &d, float v, unsigned long long &am, int &ak)
{
    const float pr = prob_rel(v, s.m, s.inv_t);
    if (pr >= d.min_p) {
        am += fx_of(pr);
        ak++;
    }
}

/* the warp's (am, ak) summed into its range's slot: set, or added to it */
__device__ __forceinline__ void draw_store(Bcast &bc, unsigned long long am, int ak, bool add)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    am = warp_sum_u64(am);
    for (int o = 16; o > 0; o >>= 1)
        ak += __shfl_xor_sync(0xffffffffu, ak, o);
    if (lane == 0) {
        bc.dmass[warp] = add ? bc.dmass[warp] + am : am;
        bc.dkept[warp] = add ? bc.dkept[warp] + ak : ak;
    }
}

__device__ __forceinline__ unsigned long long weight(const Sel &s, float v)
{
    return s.mass ? fx_of(prob_rel(v, s.m, s.inv_t)) : 1ull;
}

/* Cluster: every CTA has gathered nloc entries into its lgx / lgi; each
 * CTA pulls all of them, in rank order, into its gx / gi (at most cap).
 * Returns the total (every thread). */
template <int CL> __device__ int cl_pull(Ctx &c, Smem &sm, Bcast &bc, int nloc, int cap)
{
    const int tid = threadIdx.x, lane = tid & 31;
    if (tid == 0)
        bc.xch[c.par].i[0] = nloc;
    const Xch *p = xch_sync<CL>(c, bc);
    const int cl = lane < CL ? p->i[0] : 0;
    int inc = cl;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        int t = __shfl_up_sync(0xffffffffu, inc, o);
        if (lane >= o)
            inc += t;
    }
    const int total = __shfl_sync(0xffffffffu, inc, 31);
    for (int r = 0; r < CL; r++) {
        const int cr = __shfl_sync(0xffffffffu, cl, r), off = __shfl_sync(0xffffffffu, inc, r) - cr;
        const Smem *ps = cl_peer(&sm, r);
        for (int j = tid; j < cr && off + j < cap; j += NT) {
            sm.gx[off + j] = ps->lgx[j];
            sm.gi[off + j] = ps->lgi[j];
        }
    }
    __syncthreads();
    return min(total, cap);
}

/* Ascending-id rank query: the id of the c-th (1-based) member with value
 * == v.  Warps own contiguous id ranges of the CTA's slice; with a cluster,
 * the CTA holding the c-th finds it. */
template <int CL>
__device__ int kth_equal_id(Ctx &cx_, const Sel &s, Bcast &bc, float v, unsigned long long c)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int len = s.hi - s.lo;
    const int C = (((len + NW - 1) / NW) + 31) & ~31;
    const int w0 = s.lo + warp * C, w1 = min(s.hi, w0 + C);
    int cntw = 0;
    for (int b = w0; b < w1; b += 32) {
        int i = b + lane;
        bool hit = i < w1 && s.x[i] == v && member(s, bc, s.x[i]);
        cntw += __popc(__ballot_sync(0xffffffffu, hit));
    }
    __syncthreads();
    if (lane == 0)
        bc.redi[warp] = cntw;
    __syncthreads();
    bool mine = true;
    if constexpr (CL > 1) {
        if (threadIdx.x == 0) {
            unsigned long long t = 0;
            for (int k = 0; k < NW; k++)
                t += (unsigned long long)bc.redi[k];
            bc.xch[cx_.par].u[0] = t;
        }
        cl_sync();
        if (threadIdx.x == 0) {
            unsigned long long acc = 0;
            int rr = CL - 1;
            for (int r = 0; r < CL; r++) {
                unsigned long long t = cl_peer(&bc.xch[cx_.par], r)->u[0];
                if (acc + t >= c) {
                    rr = r;
                    break;
                }
                acc += t;
            }
            bc.i[0] = rr;
            bc.u[2] = c - acc;
        }
        cx_.par ^= 1;
        __syncthreads();
        mine = bc.i[0] == cx_.rank;
        c = bc.u[2];
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        unsigned long long acc = 0;
        int ww = NW - 1;
        for (int k = 0; k < NW; k++) {
            if (acc + (unsigned long long)bc.redi[k] >= c) {
                ww = k;
                break;
            }
            acc += (unsigned long long)bc.redi[k];
        }
        bc.i[0] = ww;
        bc.u[0] = c - acc; /* rank inside warp ww's range */
        bc.i[1] = INT_MAX;
    }
    __syncthreads();
    if (mine && warp == bc.i[0]) {
        unsigned long long rank = bc.u[0];
        for (int b = w0; b < w1; b += 32) {
            int i = b + lane;
            bool hit = i < w1 && s.x[i] == v && member(s, bc, s.x[i]);
            unsigned bal = __ballot_sync(0xffffffffu, hit);
            int pc = __popc(bal);
            if ((unsigned long long)pc >= rank) {
                unsigned bits = bal;
                for (unsigned long long k = 1; k < rank; k++)
                    bits &= bits - 1;
                if (lane == 0)
                    bc.i[1] = b + __ffs(bits) - 1;
                break;
            }
            rank -= pc;
        }
    }
    __syncthreads();
    int r = bc.i[1];
    __syncthreads();
    return red_min_int<CL>(cx_, bc, r);
}

__device__ __forceinline__ unsigned long long limbs(const Smem &sm, int b)
{
    return (unsigned long long)sm.l0[b] + ((unsigned long long)sm.l1[b] << 14) + ((unsigned long long)sm.l2[b] << 28);
}

/* Find the cut: the first token (in order) at which the running weight of
 * the candidates reaches `need` (COUNT) or ceil(frac * total mass) (mass).
 * Returns false when the candidates' total is below it (keep all).
 * [lo, hi] bounds the candidates' values.  With `draw` (top-p), a cut that
 * ends in a gathered, sorted bin also leaves the draw's per-range kept sums
 * in bc.dmass / bc.dkept and sets bc.dvalid; a cut ending otherwise (bins
 * of equal values, a target out of reach) leaves bc.dvalid 0. */
template <int CL>
__device__ bool find_cut(Ctx &c, const Sel &s, Smem &sm, Bcast &bc, float lo, float hi, unsigned long long need,
                         double frac, float *cx, int *ci, const Draw *draw = nullptr)
{
    const int tid = threadIdx.x;
    if (tid == 0) {
        bc.nlv = 0;
        bc.dvalid = 0;
    }
    __syncthreads();
    for (int L = 0; L < MAXLV; L++) {
        float range = hi - lo;
        float sc = range > 0.0f ? (float)NB / range : 0.0f;
        if (!(sc < INFINITY))
            sc = 0.0f;
        if constexpr (CL > 1)
            cl_sync(); /* the peers are done reading this CTA's histogram and gather buffers */
        for (int b = tid; b < NB; b += NT) {
            sm.cnt[b] = 0;
            sm.l0[b] = sm.l1[b] = sm.l2[b] = 0;
        }
        if constexpr (CL > 1)
            if (tid < NB / CL) {
                sm.tw[tid] = 0;
                sm.tc[tid] = 0;
            }
        __syncthreads();
        for_slice(s.x, s.lo, s.hi, [&](float v, int) {
            if (!member(s, bc, v))
                return;
            int b = bin_of(v, hi, sc);
            if (s.mass) { /* the bins' counts are not needed: see the gather */
                unsigned long long f = weight(s, v);
                atomicAdd(&sm.l0[b], (uint32_t)(f & 0x3fff));
                atomicAdd(&sm.l1[b], (uint32_t)((f >> 14) & 0x3fff));
                atomicAdd(&sm.l2[b], (uint32_t)(f >> 28));
            } else {
                atomicAdd(&sm.cnt[b], 1u);
            }
        });
        __syncthreads();
        unsigned long long w;
        uint32_t cb;
        if constexpr (CL == 1) {
            cb = sm.cnt[tid];
            w = s.mass ? limbs(sm, tid) : (unsigned long long)cb;
        } else {
            /* reduce-scatter: this CTA sums bins [rank*BPR, (rank+1)*BPR) of
             * every peer (thread: one bin of one peer); then all-gather */
            constexpr int BPR = NB / CL;
            cl_sync();
            {
                const int j = tid % BPR, g = tid / BPR, b = c.rank * BPR + j;
                const Smem *ps = cl_peer(&sm, g);
                const uint32_t pc = ps->cnt[b];
                const unsigned long long pw = s.mass ? limbs(*ps, b) : (unsigned long long)pc;
                if (pw) {
                    if (pc)
                        atomicAdd(&sm.tc[j], pc);
                    atomicAdd(&sm.tw[j], pw);
                }
            }
            cl_sync();
            const Smem *po = cl_peer(&sm, tid / BPR);
            cb = po->tc[tid % BPR];
            w = po->tw[tid % BPR];
        }
        unsigned long long total;
        unsigned long long incl = block_incl_scan_u64(w, bc, &total);
        if (L == 0 && s.mass) {
            double t = ceil(frac * (double)total);
            need = t < 1.0 ? 1ull : (unsigned long long)t;
        }
        if (total < need)
            return false; /* only possible at level 0: the target is out of reach */
        if (incl - w < need && incl >= need) {
            bc.i[2] = tid;
            bc.u[1] = incl - w;
            bc.i[3] = (int)cb;
        }
        __syncthreads();
        const int b = bc.i[2];
        int cnt = bc.i[3]; /* mass mode: 0 here, counted by the gather below */
        need -= bc.u[1];
        if (tid == 0) {
            bc.lv[bc.nlv].hi = hi;
            bc.lv[bc.nlv].sc = sc;
            bc.lv[bc.nlv].b = b;
            bc.nlv++;
            bc.gcount = 0;
        }
        __syncthreads();
        /* Mass mode counted no bin: the gather pass counts the boundary bin,
         * stores what fits and takes the members' range, which the next
         * level needs when the bin is too large to sort (the pass the count
         * mode makes for it below). */
        float mx = -INFINITY, nmn = -INFINITY;
        bool gathered = false;
        if (s.mass || cnt <= c.gcap) {
            /* gather the boundary bin and sort it exactly */
            float *gx = CL > 1 ? sm.lgx : sm.gx;
            int32_t *gi = CL > 1 ? sm.lgi : sm.gi;
            auto put = [&](float v, int i) {
                int k = atomicAdd(&bc.gcount, 1);
                if (k < GCAP) {
                    gx[k] = v;
                    gi[k] = i;
                }
                if (s.mass) {
                    nmn = fmaxf(nmn, -v);
                    mx = fmaxf(mx, v);
                }
            };
            if (draw) {
                /* the same gather, walked in the draw's warp ranges: each
                 * warp also sums its range's tokens above the boundary bin
                 * (kept whatever the cut inside it) */
                const int warp = tid >> 5;
                const int r0 = s.lo + warp * draw->C, r1 = min(s.hi, r0 + draw->C);
                unsigned long long am = 0;
                int ak = 0;
                for_warp_range(s.x, r0, r1, [&](float v, int i) {
                    const int cl = classify(s, bc, v);
                    if (cl == 0)
                        put(v, i);
                    else if (cl > 0)
                        draw_keep(s, *draw, v, am, ak);
                });
                draw_store(bc, am, ak, false);
            } else {
                for_slice(s.x, s.lo, s.hi, [&](float v, int i) {
                    if (member(s, bc, v))
                        put(v, i);
                });
            }
            __syncthreads();
            if (s.mass) /* block-uniform (Sel) */
                cnt = (int)red_sum_u64<CL>(c, bc, tid == 0 ? (unsigned long long)bc.gcount : 0ull);
            gathered = cnt <= c.gcap;
        }
        if (gathered) {
            if constexpr (CL > 1)
                cl_pull<CL>(c, sm, bc, bc.gcount, GCAP);
            int P = 2;
            while (P < cnt)
                P <<= 1;
            for (int k = cnt + tid; k < P; k += NT) {
                sm.gx[k] = -INFINITY;
                sm.gi[k] = INT_MAX;
            }
            __syncthreads();
            for (int k = 2; k <= P; k <<= 1) {
                for (int j = k >> 1; j > 0; j >>= 1) {
                    for (int i = tid; i < P; i += NT) {
                        int ixj = i ^ j;
                        if (ixj > i) {
                            bool up = (i & k) == 0;
                            bool sw = up ? before(sm.gx[ixj], sm.gi[ixj], sm.gx[i], sm.gi[i])
                                         : before(sm.gx[i], sm.gi[i], sm.gx[ixj], sm.gi[ixj]);
                            if (sw) {
                                float tx = sm.gx[i];
                                sm.gx[i] = sm.gx[ixj];
                                sm.gx[ixj] = tx;
                                int ti = sm.gi[i];
                                sm.gi[i] = sm.gi[ixj];
                                sm.gi[ixj] = ti;
                            }
                        }
                    }
                    __syncthreads();
                }
            }
            /* two consecutive entries per thread */
            const int e0 = 2 * tid, e1 = 2 * tid + 1;
            unsigned long long w0 = e0 < cnt ? weight(s, sm.gx[e0]) : 0, w1 = e1 < cnt ? weight(s, sm.gx[e1]) : 0;
            unsigned long long tot2;
            unsigned long long inc = block_incl_scan_u64(w0 + w1, bc, &tot2);
            unsigned long long ex = inc - w0 - w1;
            if (tid == 0)
                bc.i[0] = cnt - 1; /* rounding fallback: the bin's last */
            __syncthreads();
            if (e0 < cnt && ex < need && ex + w0 >= need)
                bc.i[0] = e0;
            else if (e1 < cnt && ex + w0 < need && ex + w0 + w1 >= need)
                bc.i[0] = e1;
            __syncthreads();
            *cx = sm.gx[bc.i[0]];
            *ci = sm.gi[bc.i[0]];
            if (draw) {
                /* the sorted bin's entries up to the cut are kept: each warp
                 * adds those of this CTA's slice that fall in its range */
                const int lane = tid & 31, warp = tid >> 5;
                const int q = bc.i[0];
                const int r0 = s.lo + warp * draw->C, r1 = min(s.hi, r0 + draw->C);
                unsigned long long am = 0;
                int ak = 0;
                for (int k = lane; k <= q; k += 32) {
                    const int id = sm.gi[k];
                    if (id >= r0 && id < r1)
                        draw_keep(s, *draw, sm.gx[k], am, ak);
                }
                draw_store(bc, am, ak, true);
                if (tid == 0)
                    bc.dvalid = 1;
            }
            __syncthreads();
            return true;
        }
        /* too many to gather: exact range of the boundary bin (mass mode:
         * taken by the gather pass) */
        if (!s.mass)
            for_slice(s.x, s.lo, s.hi, [&](float v, int) {
                if (member(s, bc, v)) {
                    nmn = fmaxf(nmn, -v);
                    mx = fmaxf(mx, v);
                }
            });
        red_max2<CL>(c, bc, mx, nmn);
        const float mn = -nmn;
        if (mn == mx || L == MAXLV - 1) {
            /* all equal: the cut is the c-th of them by id */
            unsigned long long wv = weight(s, mx);
            unsigned long long cc = wv > 0 ? (need + wv - 1) / wv : (unsigned long long)cnt;
            if (cc < 1)
                cc = 1;
            if (cc > (unsigned long long)cnt)
                cc = (unsigned long long)cnt;
            *cx = mx;
            *ci = kth_equal_id<CL>(c, s, bc, mx, cc);
            return true;
        }
        lo = mn;
        hi = mx;
    }
    return false;
}

__device__ __forceinline__ unsigned pen_hash(int id) { return ((unsigned)id * 2654435761u) & (PSLOTS - 1); }

/* One row per CTA (CL == 1) or per cluster of CL CTAs (sm_90+). */
template <int CL>
__global__ void __launch_bounds__(NT) k_sample(float *logits, int V, const dsq_samp_row *rows, const int32_t *ring,
                                               int R, dsq_samp_result *results, int gcap, int draw_fused_ok)
{
    if constexpr (CL > 1 && !DSQ_SAMP_CLUSTER) {
        __trap(); /* never launched: the host checks the device */
    } else {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    Smem &sm = *reinterpret_cast<Smem *>(smem_raw);
    __shared__ Bcast bc;
    __shared__ dsq_samp_result res;
    const int tid = threadIdx.x;
    const int row = blockIdx.x / CL;
    const dsq_samp_row P = rows[row];
    float *x = logits + (size_t)row * V;
    const int n = P.n_valid;
    Ctx c;
    {
        const int nn = max(n, 0);
        c.rank = CL > 1 ? cl_rank() : 0;
        c.S = CL > 1 ? (((nn + CL - 1) / CL + 31) & ~31) : nn;
        c.lo = min(nn, c.rank * c.S);
        c.hi = min(nn, c.lo + c.S);
        c.par = 0;
        c.gcap = gcap;
    }
    if (tid == 0) {
        res.token = -1;
        res.logprob = 0.0f;
        res.n_top = 0;
        res.n_kept = 0;
    }
    __syncthreads();

    /* the model's log-probabilities and top-n, from the raw logits */
    float lse = 0.0f;
    if ((P.flags & DSQ_SROW_LOGPROB) || P.top_n > 0) {
        float mx = -INFINITY, nmn = -INFINITY;
        for_slice(x, c.lo, c.hi, [&](float v, int) {
            mx = fmaxf(mx, v);
            if (v > -INFINITY)
                nmn = fmaxf(nmn, -v);
        });
        red_max2<CL>(c, bc, mx, nmn);
        const float mn = -nmn;
        /* fixed point (each term <= 2^42, < 2^18 terms): exact, so the
         * same whatever the split of the row */
        unsigned long long sum = 0;
        if (mx > -INFINITY)
            for_slice(x, c.lo, c.hi, [&](float v, int) {
                if (v > -INFINITY)
                    sum += fx_of(__expf(v - mx));
            });
        sum = red_sum_u64<CL>(c, bc, sum);
        lse = mx + logf((float)sum * (1.0f / MASS_ONE));
        if (P.top_n > 0 && mx > -INFINITY) {
            Sel s = {x, c.lo, c.hi, -FLT_MAX, false, 0.0f, 0.0f};
            float cx = -FLT_MAX;
            int ci = INT_MAX;
            find_cut<CL>(c, s, sm, bc, mn, mx, (unsigned long long)P.top_n, 0.0, &cx, &ci);
            if constexpr (CL > 1)
                cl_sync(); /* the peers are done reading this CTA's lgx / lgi */
            float *gx = CL > 1 ? sm.lgx : sm.gx;
            int32_t *gi = CL > 1 ? sm.lgi : sm.gi;
            if (tid == 0)
                bc.gcount = 0;
            __syncthreads();
            for_slice(x, c.lo, c.hi, [&](float v, int i) {
                if (v >= -FLT_MAX && cut_le(v, i, cx, ci)) {
                    int k = atomicAdd(&bc.gcount, 1);
                    if (k < 32) {
                        gx[k] = v;
                        gi[k] = i;
                    }
                }
            });
            __syncthreads();
            int ng = min(bc.gcount, 32);
            if constexpr (CL > 1)
                ng = cl_pull<CL>(c, sm, bc, ng, 32);
            if (tid == 0) { /* at most top_n (<= 20) entries: insertion sort */
                int k = ng;
                for (int a = 1; a < k; a++) {
                    float tv = sm.gx[a];
                    int ti = sm.gi[a], b = a;
                    while (b > 0 && before(tv, ti, sm.gx[b - 1], sm.gi[b - 1])) {
                        sm.gx[b] = sm.gx[b - 1];
                        sm.gi[b] = sm.gi[b - 1];
                        b--;
                    }
                    sm.gx[b] = tv;
                    sm.gi[b] = ti;
                }
                k = min(k, P.top_n);
                res.n_top = k;
                for (int a = 0; a < k; a++) {
                    res.top_ids[a] = sm.gi[a];
                    res.top_lp[a] = sm.gx[a] - lse;
                }
            }
            __syncthreads();
        }
    }
    if (!(P.flags & DSQ_SROW_SAMPLE)) {
        if (tid == 0 && c.rank == 0)
            results[row] = res;
        if constexpr (CL > 1)
            cl_sync(); /* shared memory outlives the peers' reads */
        return;
    }

    /* penalties, in place: every CTA builds the whole table, each rewrites
     * the ids of its slice (the only ones it reads later) */
    const int wn = min(P.pen_n, P.hist_len);
    const bool pen = wn > 0 && (P.rep_pen != 1.0f || P.pres_pen != 0.0f || P.freq_pen != 0.0f);
    if (pen) {
        for (int k = tid; k < PSLOTS; k += NT) {
            sm.pk[k] = -1;
            sm.pc[k] = 0;
        }
        __syncthreads();
        const int32_t *h = ring + (size_t)P.seq * R;
        for (int j = tid; j < wn; j += NT) {
            int pos = P.hist_len - wn + j;
            int id = h[pos % R];
            if (id < 0 || id >= n)
                continue;
            unsigned k = pen_hash(id);
            for (;;) {
                int prev = atomicCAS(&sm.pk[k], -1, id);
                if (prev == -1 || prev == id) {
                    atomicAdd(&sm.pc[k], 1);
                    break;
                }
                k = (k + 1) & (PSLOTS - 1);
            }
        }
        __syncthreads();
        for (int k = tid; k < PSLOTS; k += NT) {
            int id = sm.pk[k];
            if (id < c.lo || id >= c.hi) /* empty slots are -1 */
                continue;
            float v = x[id];
            sm.praw[k] = v;
            v = v > 0.0f ? v / P.rep_pen : v * P.rep_pen;
            /* no fused multiply-add: the host rounds each operation */
            x[id] = __fsub_rn(__fsub_rn(v, __fmul_rn(P.freq_pen, (float)sm.pc[k])), P.pres_pen);
        }
        __syncthreads();
    }

    float m;
    int best;
    red_argmax<CL>(c, x, c.lo, c.hi, bc, &m, &best);
    int token = -1;
    int n_kept = 0;
    const float T = P.temperature;
    if (!(m > -INFINITY)) {
        token = -1; /* no finite logit */
    } else if (T <= 0.0f || isinf(m) || isinf(1.0f / T) || isinf(1.4426950408889634f / T)) {
        token = best;
        n_kept = 1;
    } else {
        const float inv_t = 1.4426950408889634f / T; /* k2 of prob_rel */
        float thr = __fsub_rn(m, __fmul_rn(30.0f, T)); /* as the host rounds it */
        if (P.top_k > 0 && P.top_k < n) {
            Sel s = {x, c.lo, c.hi, thr, false, m, inv_t};
            float cx;
            int ci;
            if (find_cut<CL>(c, s, sm, bc, thr, m, (unsigned long long)P.top_k, 0.0, &cx, &ci))
                thr = fmaxf(thr, cx); /* ties at the k-th value all stay */
        }
        /* draw: per-warp kept mass over contiguous id ranges of the slice;
         * with a cluster, per-CTA masses first */
        const int lane = tid & 31, warp = tid >> 5;
        const int len = c.hi - c.lo;
        const int C = (((len + NW - 1) / NW) + 31) & ~31;
        const int w0 = c.lo + warp * C, w1 = min(c.hi, w0 + C);
        bool has_cut = false;
        float cx = INFINITY;
        int ci = -1;
        bool summed = false; /* the ranges' sums came with the cut */
        if (P.top_p < 1.0f) {
            Sel s = {x, c.lo, c.hi, thr, true, m, inv_t};
            const Draw dr = {C, P.min_p};
            has_cut = find_cut<CL>(c, s, sm, bc, thr, m, 0, (double)P.top_p, &cx, &ci,
                                   draw_fused_ok ? &dr : nullptr);
            summed = has_cut && bc.dvalid;
        }
        unsigned long long acc = 0;
        int kept = 0;
        if (summed) {
            acc = bc.dmass[warp];
            kept = bc.dkept[warp];
        } else {
            for_warp_range(x, w0, w1, [&](float v, int i) {
                float pr = prob_rel(v, m, inv_t);
                if (v >= thr && (!has_cut || cut_le(v, i, cx, ci)) && pr >= P.min_p) {
                    acc += fx_of(pr);
                    kept++;
                }
            });
            acc = warp_sum_u64(acc);
            for (int o = 16; o > 0; o >>= 1)
                kept += __shfl_xor_sync(0xffffffffu, kept, o);
        }
        __syncthreads();
        if (lane == 0) {
            bc.redu[warp] = acc;
            bc.redi[warp] = kept;
        }
        __syncthreads();
        const uint64_t seed = (uint64_t)P.seed_lo | ((uint64_t)P.seed_hi << 32);
        if (tid == 0) {
            unsigned long long km = 0;
            int nk = 0;
            for (int k = 0; k < NW; k++) {
                km += bc.redu[k];
                nk += bc.redi[k];
            }
            if constexpr (CL > 1) {
                bc.xch[c.par].u[0] = km;
                bc.xch[c.par].i[0] = nk;
            } else {
                unsigned long long r = __umul64hi(dsq_philox64(seed, (uint64_t)P.hist_len), km);
                int ww = NW - 1;
                unsigned long long before_w = 0;
                for (int k = 0; k < NW; k++) {
                    if (r < before_w + bc.redu[k]) {
                        ww = k;
                        break;
                    }
                    before_w += bc.redu[k];
                }
                bc.i[0] = ww;
                bc.u[0] = r - before_w;
                bc.i[1] = best; /* fallback: never needed with exact sums */
                bc.i[2] = nk;
            }
        }
        if constexpr (CL > 1) {
            cl_sync();
            if (tid == 0) {
                unsigned long long km = 0;
                int nk = 0;
                for (int k = 0; k < CL; k++) {
                    const Xch *p = cl_peer(&bc.xch[c.par], k);
                    km += p->u[0];
                    nk += p->i[0];
                }
                unsigned long long r = __umul64hi(dsq_philox64(seed, (uint64_t)P.hist_len), km);
                int rk = CL - 1;
                unsigned long long before_r = 0;
                for (int k = 0; k < CL; k++) {
                    unsigned long long mk = cl_peer(&bc.xch[c.par], k)->u[0];
                    if (r < before_r + mk) {
                        rk = k;
                        break;
                    }
                    before_r += mk;
                }
                r -= before_r;
                int ww = -1; /* not this CTA's */
                unsigned long long before_w = 0;
                if (rk == c.rank) {
                    ww = NW - 1;
                    for (int k = 0; k < NW; k++) {
                        if (r < before_w + bc.redu[k]) {
                            ww = k;
                            break;
                        }
                        before_w += bc.redu[k];
                    }
                }
                bc.i[0] = ww;
                bc.u[0] = r - before_w;
                bc.i[1] = INT_MAX; /* fallback (best) after the cluster minimum */
                bc.i[2] = nk;
            }
            c.par ^= 1;
        }
        __syncthreads();
        /* the rank search inside warp ww's range, by the whole block: each
         * thread sums a contiguous piece of ~len / (NW * NT) ids, a block
         * scan finds the piece holding the crossing, its thread walks it.
         * One warp walking the range alone took a load round trip per 32
         * ids (~4,700 ids with one CTA per row): most of a top-p draw. */
        const int ww = bc.i[0]; /* block-uniform; -1: another CTA's */
        if (ww >= 0) {
            const unsigned long long rr = bc.u[0];
            const int r0 = c.lo + ww * C, r1 = min(c.hi, r0 + C);
            const int per = r1 > r0 ? (r1 - r0 + NT - 1) / NT : 0;
            const int t0 = min(r1, r0 + tid * per), t1 = min(r1, t0 + per);
            auto kept_f = [&](int i) -> unsigned long long {
                const float v = x[i];
                const float pr = prob_rel(v, m, inv_t);
                return v >= thr && (!has_cut || cut_le(v, i, cx, ci)) && pr >= P.min_p ? fx_of(pr) : 0ull;
            };
            unsigned long long mine = 0;
            for (int i = t0; i < t1; i++)
                mine += kept_f(i);
            unsigned long long tot;
            const unsigned long long inc = block_incl_scan_u64(mine, bc, &tot);
            if (mine > 0 && rr >= inc - mine && rr < inc) {
                unsigned long long run = inc - mine;
                for (int i = t0; i < t1; i++) {
                    const unsigned long long f = kept_f(i);
                    if (f > 0 && rr < run + f) {
                        bc.i[1] = i;
                        break;
                    }
                    run += f;
                }
            }
        }
        __syncthreads();
        token = bc.i[1];
        n_kept = bc.i[2];
        if constexpr (CL > 1) {
            token = red_min_int<CL>(c, bc, token);
            if (token == INT_MAX)
                token = best;
        }
    }
    /* the result: written by the CTA owning the token (its penalty raw value
     * and logit are there), rank 0 without a token */
    const int writer = CL > 1 && token >= 0 ? token / c.S : 0;
    if (tid == 0 && c.rank == writer) {
        res.token = token;
        res.n_kept = n_kept;
        if ((P.flags & DSQ_SROW_LOGPROB) && token >= 0) {
            float raw = x[token];
            if (pen)
                for (unsigned k = pen_hash(token); sm.pk[k] >= 0; k = (k + 1) & (PSLOTS - 1))
                    if (sm.pk[k] == token) {
                        raw = sm.praw[k];
                        break;
                    }
            res.logprob = raw - lse;
        }
        results[row] = res;
    }
    if constexpr (CL > 1)
        cl_sync(); /* shared memory outlives the peers' reads */
    }
}

__global__ void k_hist_scatter(int32_t *ring, int R, const int32_t *tok, const int32_t *pos, const int32_t *tseq,
                               const int32_t *sid, int T)
{
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t < T)
        ring[(size_t)sid[tseq[t]] * R + pos[t] % R] = tok[t];
}

} // namespace

/* Per device: how many clusters of CL CTAs can run at once (0: that size is
 * not used; all 0 below sm_90 or when the kernels were not built for it). */
static int samp_clusters[DSQ_CU_MAX_DEVICES][17];

template <int CL> static cudaLaunchConfig_t sample_cfg(int n_rows, cudaStream_t stream, cudaLaunchAttribute *at)
{
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3((unsigned)n_rows * CL);
    cfg.blockDim = dim3(NT);
    cfg.dynamicSmemBytes = sizeof(Smem);
    cfg.stream = stream;
    at[0].id = cudaLaunchAttributeClusterDimension;
    at[0].val.clusterDim.x = CL;
    at[0].val.clusterDim.y = 1;
    at[0].val.clusterDim.z = 1;
    cfg.attrs = at;
    cfg.numAttrs = 1;
    return cfg;
}

/* A cluster size's opt-ins and occupancy; a failure only leaves it unused. */
template <int CL> static void sample_setup_cluster(int dev)
{
    cudaError_t e = cudaFuncSetAttribute(k_sample<CL>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sizeof(Smem));
    if (e == cudaSuccess && CL > 8)
        e = cudaFuncSetAttribute(k_sample<CL>, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
    int n = 0;
    if (e == cudaSuccess) {
        cudaLaunchAttribute at[1];
        cudaLaunchConfig_t cfg = sample_cfg<CL>(1, 0, at);
        e = cudaOccupancyMaxActiveClusters(&n, k_sample<CL>, &cfg);
    }
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        n = 0;
    }
    samp_clusters[dev][CL] = n;
}

/* The kernels' shared-memory opt-ins (per-device attributes) and which
 * cluster sizes the device runs. */
static cudaError_t sample_setup(int dev)
{
    /* dev is the current device */
    cudaError_t e = cudaFuncSetAttribute(k_sample<1>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sizeof(Smem));
    if (e != cudaSuccess)
        return e;
    for (int k = 0; k <= 16; k++)
        samp_clusters[dev][k] = 0;
    int major = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) {
        (void)cudaGetLastError();
        major = 0;
    }
    cudaFuncAttributes fa;
    if (major < 9 || cudaFuncGetAttributes(&fa, k_sample<8>) != cudaSuccess || fa.ptxVersion < 90 ||
        fa.binaryVersion < 90) {
        (void)cudaGetLastError();
        return cudaSuccess; /* one CTA per row */
    }
    sample_setup_cluster<2>(dev);
    sample_setup_cluster<4>(dev);
    sample_setup_cluster<8>(dev);
    sample_setup_cluster<16>(dev);
    return cudaSuccess;
}

static dsq_cu_once sample_once;

/* CTAs per row: DSQ_SAMPLE_CLUSTER=0 or 1 forces one CTA per row, 2, 4, 8 or
 * 16 that cluster size where the device runs it (else one CTA); unset or
 * "auto": the largest size whose clusters for all rows run at once (16 for
 * a few rows on an H100 / H200), one CTA per row beyond that. */
static int sample_cluster_size(int dev, int32_t n_rows)
{
    const int *act = samp_clusters[dev];
    const char *env = getenv("DSQ_SAMPLE_CLUSTER");
    if (env && env[0] && strcmp(env, "auto") != 0) {
        int want = atoi(env);
        return (want == 2 || want == 4 || want == 8 || want == 16) && act[want] > 0 ? want : 1;
    }
    for (int cl = 16; cl >= 2; cl >>= 1)
        if (act[cl] > 0 && n_rows <= act[cl])
            return cl;
    return 1;
}

/* The largest boundary bin find_cut gathers and sorts; larger ones are
 * binned again.  The sort and (with clusters) its pull from every peer cost
 * more than one more histogram level once a row has 8 or 16 CTAs; with 1 or
 * 2 CTAs per row the extra level's pass over 76k-152k ids costs more (4
 * CTAs per row was not measured: it keeps the gather, as 2 does).
 * Measured on the H200 (test_cuda_sampling timing, T 0.6 / top-p 0.95 on
 * near-flat rows of 151,936): 2,048 vs 512 tokens: 1 row (16 CTAs) 65.5 vs
 * 45.1 us, 8 rows (8 CTAs) 72.5 vs 58.3 us, 64 rows (2 CTAs) 143.8 vs
 * 166.6 us, 256 rows (1 CTA) 664 vs 906 us; 512 down to 8 all alike.
 * DSQ_SAMPLE_GCAP (2..2048, read per launch) overrides it. */
static int sample_gcap(int cl)
{
    const char *env = getenv("DSQ_SAMPLE_GCAP");
    int g = env && env[0] ? atoi(env) : cl >= 8 ? 64 : GCAP;
    return g < 2 ? 2 : g > GCAP ? GCAP : g;
}

/* Whether top-p's last gather pass also sums the draw's per-range kept
 * masses (find_cut's Draw), sparing the draw its own pass over the row: the
 * same sums, so the same tokens.  On unless DSQ_SAMPLE_DRAW_FUSED=0 (read
 * per launch).  H100, stop 40 (test_cuda_sampling timing, T 0.6 / top-p
 * 0.95, near-flat rows): 256 rows 365 -> 336 us, 64 rows 107 -> 102, one
 * row on one CTA 138 -> 136; `dsqwen generate` drew the same tokens as
 * the tree before on every cluster size tried. */
static int sample_draw_fused(void)
{
    const char *env = getenv("DSQ_SAMPLE_DRAW_FUSED");
    return !(env && env[0] == '0');
}

template <int CL>
static cudaError_t sample_launch(float *logits, int32_t n_rows, int32_t V, const dsq_samp_row *rows,
                                 const int32_t *ring, int32_t R, dsq_samp_result *results, cudaStream_t stream)
{
    cudaLaunchAttribute at[1];
    cudaLaunchConfig_t cfg = sample_cfg<CL>(n_rows, stream, at);
    return cudaLaunchKernelEx(&cfg, k_sample<CL>, logits, (int)V, rows, ring, (int)R, results, sample_gcap(CL),
                              sample_draw_fused());
}

/* For tests and measurements: the CTAs per row dsq_cu_sample would use now
 * for n_rows on the current device (after its setup). */
extern "C" int dsq_cu_sample_cluster_size(int32_t n_rows)
{
    int dev = 0;
    if (dsq_cu_once_per_device(&sample_once, sample_setup, &dev) != cudaSuccess) {
        (void)cudaGetLastError();
        return 1;
    }
    return sample_cluster_size(dev, n_rows);
}

extern "C" dsq_status dsq_cu_sample(float *logits, int32_t n_rows, int32_t V, const dsq_samp_row *rows,
                                    const int32_t *ring, int32_t R, dsq_samp_result *results, cudaStream_t stream)
{
    if (n_rows <= 0)
        return DSQ_OK;
    if (V > 262143)
        return dsq_fail(DSQ_ERR_UNSUPPORTED, "GPU sampling: vocabulary of %d exceeds 262143 (fixed-point mass sums)",
                        V);
    int dev = 0;
    cudaError_t e = dsq_cu_once_per_device(&sample_once, sample_setup, &dev);
    if (e != cudaSuccess)
        return dsq_cu_status(e, "GPU sampling setup");
    const int cl = sample_cluster_size(dev, n_rows);
    e = cudaSuccess;
    switch (cl) {
    case 16: e = sample_launch<16>(logits, n_rows, V, rows, ring, R, results, stream); break;
    case 8: e = sample_launch<8>(logits, n_rows, V, rows, ring, R, results, stream); break;
    case 4: e = sample_launch<4>(logits, n_rows, V, rows, ring, R, results, stream); break;
    case 2: e = sample_launch<2>(logits, n_rows, V, rows, ring, R, results, stream); break;
    default: break;
    }
    if (cl == 1 || e != cudaSuccess) {
        (void)cudaGetLastError(); /* a refused cluster launch: one CTA per row */
        k_sample<1><<<n_rows, NT, sizeof(Smem), stream>>>(logits, V, rows, ring, R, results, sample_gcap(1),
                                                          sample_draw_fused());
    }
    return DSQ_CU_LAUNCHED("GPU sampling");
}

extern "C" dsq_status dsq_cu_hist_scatter(int32_t *ring, int32_t R, const int32_t *tok, const int32_t *pos,
                                          const int32_t *tseq, const int32_t *sid, int32_t T, cudaStream_t stream)
{
    if (T <= 0)
        return DSQ_OK;
    k_hist_scatter<<<(T + 255) / 256, 256, 0, stream>>>(ring, R, tok, pos, tseq, sid, T);
    return DSQ_CU_LAUNCHED("token history write");
}
