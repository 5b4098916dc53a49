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
 * running weight reaches the target; that bin's tokens (usually a few
 * hundred even for near-flat logits) are gathered into shared memory and
 * sorted exactly.  A bin too large to gather is binned again over its own
 * exact range; a bin of equal values is resolved by id.
 *
 * Masses are fixed point, exp((x - max) / T) * 2^42 as uint64, summed in
 * integers (histograms as three 14-bit limbs in 32-bit shared atomics), so
 * every sum is exact and independent of thread timing: a given (seed,
 * position, logits) always draws the same token.  The draw walks the kept
 * tokens in id order: per-warp sums over contiguous id ranges, then one warp
 * finds the token where the running mass passes r = floor(u * kept_mass),
 * u from Philox(seed, position).
 *
 * Penalties: the window's distinct ids are counted in a shared-memory hash
 * table, then each is rewritten in place in the logits row (the raw value is
 * kept in the table for the log-probability of the drawn token).  The logits
 * row is scratch: the caller's copy, if any, was taken before. */
#include <float.h>
#include <limits.h>
#include <math.h>

#include "common.cuh"
#include "philox.h"

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
    uint32_t cnt[NB], l0[NB], l1[NB], l2[NB];
    float gx[GCAP];
    int32_t gi[GCAP];
    int32_t pk[PSLOTS];
    int32_t pc[PSLOTS];
    float praw[PSLOTS];
};

/* block-wide scalars */
struct Bcast {
    Level lv[MAXLV];
    int nlv;
    float f[4];
    int i[4];
    unsigned long long u[4];
    float redf[NW];
    int redi[NW];
    unsigned long long redu[NW];
    int gcount;
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

__device__ float block_min(float v, Bcast &bc) { return -block_max(-v, bc); }

__device__ float block_sum_f(float v, Bcast &bc)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = dsq_warp_sum(v);
    __syncthreads();
    if (lane == 0)
        bc.redf[warp] = v;
    __syncthreads();
    return dsq_warp_sum(bc.redf[lane]);
}

/* (max, first id holding it) of a[0..n) by `before`; NaN never wins. */
__device__ void block_argmax(const float *x, int n, Bcast &bc, float *m_out, int *id_out)
{
    float bv = -INFINITY;
    int bi = INT_MAX;
    for (int i = threadIdx.x; i < n; i += NT) {
        float v = x[i];
        if (v == v && before(v, i, bv, bi)) {
            bv = v;
            bi = i;
        }
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (before(ov, oi, bv, bi)) {
            bv = ov;
            bi = oi;
        }
    }
    __syncthreads();
    if (lane == 0) {
        bc.redf[warp] = bv;
        bc.redi[warp] = bi;
    }
    __syncthreads();
    bv = bc.redf[lane];
    bi = bc.redi[lane];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (before(ov, oi, bv, bi)) {
            bv = ov;
            bi = oi;
        }
    }
    *m_out = bv;
    *id_out = bi;
    __syncthreads();
}

/* The candidate set of one selection: ids < n with x >= lo_thr, inside the
 * bins chosen at every level so far. */
struct Sel {
    const float *x;
    int n;
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

__device__ __forceinline__ unsigned long long weight(const Sel &s, float v)
{
    return s.mass ? fx_of(prob_rel(v, s.m, s.inv_t)) : 1ull;
}

/* Ascending-id rank query: the id of the c-th (1-based) member with value
 * == v.  Warps own contiguous id ranges. */
__device__ int kth_equal_id(const Sel &s, Bcast &bc, float v, unsigned long long c)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int C = (((s.n + NW - 1) / NW) + 31) & ~31;
    const int w0 = warp * C, w1 = min(s.n, w0 + C);
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
    if (warp == bc.i[0]) {
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
    return r;
}

/* Find the cut: the first token (in order) at which the running weight of
 * the candidates reaches `need` (COUNT) or ceil(frac * total mass) (mass).
 * Returns false when the candidates' total is below it (keep all).
 * [lo, hi] bounds the candidates' values. */
__device__ bool find_cut(const Sel &s, Smem &sm, Bcast &bc, float lo, float hi, unsigned long long need,
                         double frac, float *cx, int *ci)
{
    const int tid = threadIdx.x;
    if (tid == 0)
        bc.nlv = 0;
    __syncthreads();
    for (int L = 0; L < MAXLV; L++) {
        float range = hi - lo;
        float sc = range > 0.0f ? (float)NB / range : 0.0f;
        if (!(sc < INFINITY))
            sc = 0.0f;
        for (int b = tid; b < NB; b += NT) {
            sm.cnt[b] = 0;
            sm.l0[b] = sm.l1[b] = sm.l2[b] = 0;
        }
        __syncthreads();
        for (int i = tid; i < s.n; i += NT) {
            float v = s.x[i];
            if (!member(s, bc, v))
                continue;
            int b = bin_of(v, hi, sc);
            atomicAdd(&sm.cnt[b], 1u);
            if (s.mass) {
                unsigned long long f = weight(s, v);
                atomicAdd(&sm.l0[b], (uint32_t)(f & 0x3fff));
                atomicAdd(&sm.l1[b], (uint32_t)((f >> 14) & 0x3fff));
                atomicAdd(&sm.l2[b], (uint32_t)(f >> 28));
            }
        }
        __syncthreads();
        unsigned long long w = s.mass ? (unsigned long long)sm.l0[tid] + ((unsigned long long)sm.l1[tid] << 14) +
                                            ((unsigned long long)sm.l2[tid] << 28)
                                      : (unsigned long long)sm.cnt[tid];
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
            bc.i[3] = (int)sm.cnt[tid];
        }
        __syncthreads();
        const int b = bc.i[2];
        const int cnt = bc.i[3];
        need -= bc.u[1];
        if (tid == 0) {
            bc.lv[bc.nlv].hi = hi;
            bc.lv[bc.nlv].sc = sc;
            bc.lv[bc.nlv].b = b;
            bc.nlv++;
            bc.gcount = 0;
        }
        __syncthreads();
        if (cnt <= GCAP) {
            /* gather the boundary bin and sort it exactly */
            for (int i = tid; i < s.n; i += NT) {
                float v = s.x[i];
                if (member(s, bc, v)) {
                    int k = atomicAdd(&bc.gcount, 1);
                    sm.gx[k] = v;
                    sm.gi[k] = i;
                }
            }
            __syncthreads();
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
            __syncthreads();
            return true;
        }
        /* too many to gather: exact range of the boundary bin */
        float mn = INFINITY, mx = -INFINITY;
        for (int i = tid; i < s.n; i += NT) {
            float v = s.x[i];
            if (member(s, bc, v)) {
                mn = fminf(mn, v);
                mx = fmaxf(mx, v);
            }
        }
        mn = block_min(mn, bc);
        mx = block_max(mx, bc);
        if (mn == mx || L == MAXLV - 1) {
            /* all equal: the cut is the c-th of them by id */
            unsigned long long wv = weight(s, mx);
            unsigned long long c = wv > 0 ? (need + wv - 1) / wv : (unsigned long long)cnt;
            if (c < 1)
                c = 1;
            if (c > (unsigned long long)cnt)
                c = (unsigned long long)cnt;
            *cx = mx;
            *ci = kth_equal_id(s, bc, mx, c);
            return true;
        }
        lo = mn;
        hi = mx;
    }
    return false;
}

__device__ __forceinline__ unsigned pen_hash(int id) { return ((unsigned)id * 2654435761u) & (PSLOTS - 1); }

__global__ void __launch_bounds__(NT) k_sample(float *logits, int V, const dsq_samp_row *rows, const int32_t *ring,
                                               int R, dsq_samp_result *results)
{
    extern __shared__ __align__(16) unsigned char smem_raw[];
    Smem &sm = *reinterpret_cast<Smem *>(smem_raw);
    __shared__ Bcast bc;
    __shared__ dsq_samp_result res;
    const int tid = threadIdx.x;
    const dsq_samp_row P = rows[blockIdx.x];
    float *x = logits + (size_t)blockIdx.x * V;
    const int n = P.n_valid;
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
        float mx = -INFINITY, mn = INFINITY;
        for (int i = tid; i < n; i += NT) {
            float v = x[i];
            mx = fmaxf(mx, v);
            if (v > -INFINITY)
                mn = fminf(mn, v);
        }
        mx = block_max(mx, bc);
        mn = block_min(mn, bc);
        float sum = 0.0f;
        if (mx > -INFINITY)
            for (int i = tid; i < n; i += NT) {
                float v = x[i];
                if (v > -INFINITY)
                    sum += __expf(v - mx);
            }
        sum = block_sum_f(sum, bc);
        lse = mx + logf(sum);
        if (P.top_n > 0 && mx > -INFINITY) {
            Sel s = {x, n, -FLT_MAX, false, 0.0f, 0.0f};
            float cx = -FLT_MAX;
            int ci = INT_MAX;
            find_cut(s, sm, bc, mn, mx, (unsigned long long)P.top_n, 0.0, &cx, &ci);
            if (tid == 0)
                bc.gcount = 0;
            __syncthreads();
            for (int i = tid; i < n; i += NT) {
                float v = x[i];
                if (v >= -FLT_MAX && cut_le(v, i, cx, ci)) {
                    int k = atomicAdd(&bc.gcount, 1);
                    if (k < 32) {
                        sm.gx[k] = v;
                        sm.gi[k] = i;
                    }
                }
            }
            __syncthreads();
            if (tid == 0) { /* at most top_n (<= 20) entries: insertion sort */
                int k = min(bc.gcount, 32);
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
        if (tid == 0)
            results[blockIdx.x] = res;
        return;
    }

    /* penalties, in place */
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
            if (id < 0)
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
    block_argmax(x, n, bc, &m, &best);
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
            Sel s = {x, n, thr, false, m, inv_t};
            float cx;
            int ci;
            if (find_cut(s, sm, bc, thr, m, (unsigned long long)P.top_k, 0.0, &cx, &ci))
                thr = fmaxf(thr, cx); /* ties at the k-th value all stay */
        }
        bool has_cut = false;
        float cx = INFINITY;
        int ci = -1;
        if (P.top_p < 1.0f) {
            Sel s = {x, n, thr, true, m, inv_t};
            has_cut = find_cut(s, sm, bc, thr, m, 0, (double)P.top_p, &cx, &ci);
        }
        /* draw: per-warp kept mass over contiguous id ranges */
        const int lane = tid & 31, warp = tid >> 5;
        const int C = (((n + NW - 1) / NW) + 31) & ~31;
        const int w0 = warp * C, w1 = min(n, w0 + C);
        unsigned long long acc = 0;
        int kept = 0;
        for (int b = w0; b < w1; b += 32) {
            int i = b + lane;
            unsigned long long f = 0;
            if (i < w1) {
                float v = x[i];
                float pr = prob_rel(v, m, inv_t);
                if (v >= thr && (!has_cut || cut_le(v, i, cx, ci)) && pr >= P.min_p) {
                    f = fx_of(pr);
                    kept++;
                }
            }
            acc += f;
        }
        acc = warp_sum_u64(acc);
        for (int o = 16; o > 0; o >>= 1)
            kept += __shfl_xor_sync(0xffffffffu, kept, o);
        __syncthreads();
        if (lane == 0) {
            bc.redu[warp] = acc;
            bc.redi[warp] = kept;
        }
        __syncthreads();
        if (tid == 0) {
            unsigned long long km = 0;
            int nk = 0;
            for (int k = 0; k < NW; k++) {
                km += bc.redu[k];
                nk += bc.redi[k];
            }
            const uint64_t seed = (uint64_t)P.seed_lo | ((uint64_t)P.seed_hi << 32);
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
        __syncthreads();
        if (warp == bc.i[0]) {
            unsigned long long rr = bc.u[0], base = 0;
            for (int b = w0; b < w1; b += 32) {
                int i = b + lane;
                unsigned long long f = 0;
                if (i < w1) {
                    float v = x[i];
                    float pr = prob_rel(v, m, inv_t);
                    if (v >= thr && (!has_cut || cut_le(v, i, cx, ci)) && pr >= P.min_p)
                        f = fx_of(pr);
                }
                unsigned long long inc = warp_incl_scan_u64(f);
                unsigned long long tot = __shfl_sync(0xffffffffu, inc, 31);
                if (rr < base + tot) {
                    unsigned hit = __ballot_sync(0xffffffffu, f > 0 && rr >= base + inc - f && rr < base + inc);
                    if (lane == 0 && hit)
                        bc.i[1] = b + __ffs(hit) - 1;
                    break;
                }
                base += tot;
            }
        }
        __syncthreads();
        token = bc.i[1];
        n_kept = bc.i[2];
    }
    if (tid == 0) {
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
        results[blockIdx.x] = res;
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

/* The kernel's shared-memory opt-in: a per-device attribute. */
static cudaError_t sample_setup(int dev)
{
    (void)dev; /* the current device */
    return cudaFuncSetAttribute(k_sample, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sizeof(Smem));
}

static dsq_cu_once sample_once;

extern "C" dsq_status dsq_cu_sample(float *logits, int32_t n_rows, int32_t V, const dsq_samp_row *rows,
                                    const int32_t *ring, int32_t R, dsq_samp_result *results, cudaStream_t stream)
{
    if (n_rows <= 0)
        return DSQ_OK;
    if (V > 262143)
        return dsq_fail(DSQ_ERR_UNSUPPORTED, "GPU sampling: vocabulary of %d exceeds 262143 (fixed-point mass sums)",
                        V);
    cudaError_t e = dsq_cu_once_per_device(&sample_once, sample_setup, NULL);
    if (e != cudaSuccess)
        return dsq_cu_status(e, "GPU sampling setup");
    k_sample<<<n_rows, NT, sizeof(Smem), stream>>>(logits, V, rows, ring, R, results);
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
