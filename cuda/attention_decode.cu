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
 * are double-buffered in shared memory; warp w takes keys 16w..16w+15 of each
 * tile with its own online-softmax state, and the 4 warps are combined in
 * shared memory at the end.  Each block writes (m, l, acc) of its split to
 * the workspace; a merge kernel rescales and sums the splits.
 *
 * The split plan depends only on the sequence's length (read on the device)
 * and max_splits (fixed per launch shape): blocks past a sequence's last
 * split return at once, so one captured graph serves any lengths.
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>

#include "attention.h"
#include "attention_tile.cuh"

namespace dsq_attn {

constexpr int kDecRows = 16; /* query heads per block (one mma M tile) */

template <int D> constexpr int decode_smem_bytes()
{
    return (kDecRows * (D + 8) + 2 * 2 * kTileKeys * (D + 8)) * 2 + 2 * 2 * kTileKeys * 4;
}

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

/* workspace: acc [n_seqs][n_heads][max_splits][D] f32, then
 *            ml  [n_seqs][n_heads][max_splits][2] f32 (running max m in
 *                log2 units, sum l) */
template <int D, bool INT8>
__global__ void __launch_bounds__(kThreads)
    decode_kernel(KvArgs a, const __nv_bfloat16 *q, int64_t q_stride, const int32_t *seq_lens,
                  int n_heads, int group, int n_hg, int max_splits, float scale_log2,
                  float *ws_acc, float *ws_ml)
{
    constexpr int RH = D + 8;
    extern __shared__ __align__(16) unsigned char smem[];
    __half *sq = (__half *)smem;                     /* [16][RH]    */
    __half *sk = sq + kDecRows * RH;                 /* [2][64][RH] */
    __half *sv = sk + 2 * kTileKeys * RH;            /* [2][64][RH] */
    float *sks = (float *)(sv + 2 * kTileKeys * RH); /* [2][64]     */
    float *svs = sks + 2 * kTileKeys;                /* [2][64]     */

    const int split = blockIdx.x, b = blockIdx.z;
    const int kvh = blockIdx.y / n_hg, hg = blockIdx.y % n_hg;
    const int len = seq_lens[b];
    int chunk, used;
    split_plan(len, max_splits, chunk, used);
    if (split >= used)
        return;
    const int kstart = split * chunk, kend = min(len, kstart + chunk);
    const int h0 = kvh * group + hg * kDecRows;
    const int nrows = min(kDecRows, group - hg * kDecRows);
    const int t = threadIdx.x, warp = t >> 5, lane = t & 31;

    for (int c = t; c < kDecRows * D / 8; c += kThreads) {
        int r = c / (D / 8), cc = c % (D / 8);
        uint4 val = make_uint4(0, 0, 0, 0);
        if (r < nrows)
            val = bf16x8_to_h8(*(const uint4 *)(q + (int64_t)b * q_stride + (h0 + r) * D + cc * 8));
        *(uint4 *)(sq + r * RH + cc * 8) = val;
    }
    TileLoader<D, INT8> ld;
    ld.issue(a, b, kvh, kstart, kend, sk, sv, sks, svs);
    ld.commit(sk, sv, sks, svs);
    cp_async_wait_all();
    __syncthreads();

    uint32_t qf[D / 16][4];
    load_q_frags<D>(qf, sq);
    float o[D / 8][4];
#pragma unroll
    for (int i = 0; i < D / 8; i++)
        o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
    float m_r[2] = {-INFINITY, -INFINITY}, l_r[2] = {0.f, 0.f};

    const int n_tiles = (kend - kstart + kTileKeys - 1) / kTileKeys;
    for (int j = 0; j < n_tiles; j++) {
        const int cur = j & 1;
        const int key0 = kstart + j * kTileKeys;
        if (j + 1 < n_tiles)
            ld.issue(a, b, kvh, key0 + kTileKeys, kend, sk + (cur ^ 1) * kTileKeys * RH,
                     sv + (cur ^ 1) * kTileKeys * RH, sks + (cur ^ 1) * kTileKeys,
                     svs + (cur ^ 1) * kTileKeys);
        const int wkey0 = key0 + warp * 16;
        if (wkey0 < kend) {
            const __half *tk = sk + cur * kTileKeys * RH + warp * 16 * RH;
            const __half *tv = sv + cur * kTileKeys * RH + warp * 16 * RH;
            const float *tks = sks + cur * kTileKeys + warp * 16;
            const float *tvs = svs + cur * kTileKeys + warp * 16;
            float s[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
            qk_16keys<D>(s, qf, tk);
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
            float mu[2], alpha[2];
#pragma unroll
            for (int r = 0; r < 2; r++) {
                float mn = fmaxf(m_r[r], quad_max(mt[r]));
                mu[r] = mn == -INFINITY ? 0.f : mn;
                alpha[r] = exp2f(m_r[r] - mu[r]);
                m_r[r] = mn;
                l_r[r] *= alpha[r];
            }
#pragma unroll
            for (int i = 0; i < D / 8; i++) {
                o[i][0] *= alpha[0];
                o[i][1] *= alpha[0];
                o[i][2] *= alpha[1];
                o[i][3] *= alpha[1];
            }
            float p[2][4];
#pragma unroll
            for (int nb = 0; nb < 2; nb++) {
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    float pe = exp2f(s[nb][e] - mu[e >> 1]);
                    l_r[e >> 1] += pe;
                    if (INT8)
                        pe *= tvs[nb * 8 + 2 * (lane & 3) + (e & 1)];
                    p[nb][e] = pe;
                }
            }
            uint32_t pa[4] = {pack_half2(p[0][0], p[0][1]), pack_half2(p[0][2], p[0][3]),
                              pack_half2(p[1][0], p[1][1]), pack_half2(p[1][2], p[1][3])};
            pv_16keys<D>(o, pa, tv);
        }
        if (j + 1 < n_tiles)
            ld.commit(sk + (cur ^ 1) * kTileKeys * RH, sv + (cur ^ 1) * kTileKeys * RH,
                      sks + (cur ^ 1) * kTileKeys, svs + (cur ^ 1) * kTileKeys);
        cp_async_wait_all();
        __syncthreads();
    }

    /* combine the 4 warps; the K buffers are free now (loop ended in a sync) */
    float *racc = (float *)sk;                 /* [4][16][D] */
    float *rm = racc + 4 * kDecRows * D;       /* [4][16]    */
    float *rl = rm + 4 * kDecRows;             /* [4][16]    */
    {
        const int g = lane >> 2;
#pragma unroll
        for (int r = 0; r < 2; r++) {
            float l = quad_sum(l_r[r]);
            float *dst = racc + (warp * kDecRows + g + 8 * r) * D + 2 * (lane & 3);
#pragma unroll
            for (int i = 0; i < D / 8; i++)
                *(float2 *)(dst + i * 8) = make_float2(o[i][2 * r], o[i][2 * r + 1]);
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
            acc += f * racc[(w * kDecRows + r) * D + d];
            L += f * rl[w * kDecRows + r];
        }
        const int64_t slot = ((int64_t)b * n_heads + h0 + r) * max_splits + split;
        ws_acc[slot * D + d] = acc;
        if (d == 0)
            *(float2 *)(ws_ml + slot * 2) = make_float2(M, L);
    }
}

/* One block per (head, sequence): out = sum_s acc_s 2^(m_s-M) / sum_s l_s 2^(m_s-M). */
template <int D>
__global__ void __launch_bounds__(D)
    decode_merge_kernel(const float *ws_acc, const float *ws_ml, const int32_t *seq_lens,
                        int n_heads, int max_splits, __nv_bfloat16 *out, int64_t o_stride)
{
    const int h = blockIdx.x, b = blockIdx.y, d = threadIdx.x;
    int chunk, used;
    split_plan(seq_lens[b], max_splits, chunk, used);
    const int64_t slot0 = ((int64_t)b * n_heads + h) * max_splits;
    float M = -INFINITY;
    for (int s = 0; s < used; s++)
        M = fmaxf(M, ws_ml[(slot0 + s) * 2]);
    float acc = 0.f, L = 0.f;
    for (int s = 0; s < used; s++) {
        float2 ml = *(const float2 *)(ws_ml + (slot0 + s) * 2);
        float f = exp2f(ml.x - M);
        L += f * ml.y;
        acc += f * ws_acc[(slot0 + s) * D + d];
    }
    out[(int64_t)b * o_stride + h * D + d] = __float2bfloat16_rn(L > 0.f ? acc / L : 0.f);
}

template <int D, bool INT8> static cudaError_t set_decode_attr()
{
    return cudaFuncSetAttribute(decode_kernel<D, INT8>,
                                cudaFuncAttributeMaxDynamicSharedMemorySize,
                                decode_smem_bytes<D>());
}

cudaError_t decode_init()
{
    cudaError_t e;
    if ((e = set_decode_attr<128, false>()) != cudaSuccess) return e;
    if ((e = set_decode_attr<128, true>()) != cudaSuccess) return e;
    if ((e = set_decode_attr<64, false>()) != cudaSuccess) return e;
    return set_decode_attr<64, true>();
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

extern "C" int32_t dsq_attn_decode_splits(int32_t n_seqs, int32_t n_kv_heads,
                                          int32_t max_context, int32_t n_sms)
{
    /* one full wave at ~3 resident blocks per SM; a split below one tile of
     * 64 keys only adds merge work */
    int64_t units = (int64_t)(n_seqs > 0 ? n_seqs : 1) * (n_kv_heads > 0 ? n_kv_heads : 1);
    int64_t target = 3 * (int64_t)(n_sms > 0 ? n_sms : 132);
    int64_t s = (target + units - 1) / units;
    int64_t cap = (max_context + kTileKeys - 1) / kTileKeys;
    if (s > cap)
        s = cap;
    if (s > 256)
        s = 256;
    return (int32_t)(s < 1 ? 1 : s);
}

extern "C" cudaError_t dsq_attn_init(void)
{
    static volatile int done = 0; /* benign race: the setters are idempotent */
    if (done)
        return cudaSuccess;
    cudaError_t e = prefill_init();
    if (e == cudaSuccess)
        e = decode_init();
    if (e == cudaSuccess)
        done = 1;
    return e;
}

extern "C" cudaError_t dsq_attn_decode(const dsq_attn_kv *kv, const void *q, int64_t q_stride,
                                       void *out, int64_t o_stride, const int32_t *seq_lens,
                                       int32_t n_seqs, int32_t n_heads, int32_t max_splits,
                                       void *workspace, size_t workspace_bytes,
                                       cudaStream_t stream)
{
    if (!kv_ok(kv) || n_seqs < 0 || n_heads <= 0 || n_heads % kv->n_kv_heads ||
        max_splits <= 0 || n_seqs > 65535)
        return cudaErrorInvalidValue;
    if (n_seqs == 0)
        return cudaSuccess;
    const int D = kv->head_dim;
    const int group = n_heads / kv->n_kv_heads;
    const int n_hg = (group + kDecRows - 1) / kDecRows;
    if (!q || !out || !seq_lens || !workspace || !aligned16(q) || !aligned16(workspace) ||
        q_stride % 8 || q_stride < (int64_t)n_heads * D || o_stride < (int64_t)n_heads * D ||
        workspace_bytes < ws_floats(n_seqs, n_heads, D, max_splits) * sizeof(float) ||
        (int64_t)kv->n_kv_heads * n_hg > 65535)
        return cudaErrorInvalidValue;
    cudaError_t e = dsq_attn_init();
    if (e != cudaSuccess)
        return e;
    KvArgs a = kv_args(kv);
    const float scale_log2 = (float)(1.4426950408889634 / sqrt((double)D));
    float *ws_acc = (float *)workspace;
    float *ws_ml = ws_acc + (size_t)n_seqs * n_heads * max_splits * D;
    dim3 grid((unsigned)max_splits, (unsigned)(kv->n_kv_heads * n_hg), (unsigned)n_seqs);
    const __nv_bfloat16 *qb = (const __nv_bfloat16 *)q;
    const bool i8 = kv->dtype == DSQ_ATTN_KV_INT8;
#define DSQ_DECODE_LAUNCH(DD, I8)                                                            \
    decode_kernel<DD, I8><<<grid, kThreads, decode_smem_bytes<DD>(), stream>>>(              \
        a, qb, q_stride, seq_lens, n_heads, group, n_hg, max_splits, scale_log2, ws_acc, ws_ml)
    if (D == 128) {
        if (i8) DSQ_DECODE_LAUNCH(128, true);
        else DSQ_DECODE_LAUNCH(128, false);
    } else {
        if (i8) DSQ_DECODE_LAUNCH(64, true);
        else DSQ_DECODE_LAUNCH(64, false);
    }
#undef DSQ_DECODE_LAUNCH
    if ((e = cudaGetLastError()) != cudaSuccess)
        return e;
    dim3 mgrid((unsigned)n_heads, (unsigned)n_seqs);
    if (D == 128)
        decode_merge_kernel<128><<<mgrid, 128, 0, stream>>>(ws_acc, ws_ml, seq_lens, n_heads,
                                                            max_splits, (__nv_bfloat16 *)out,
                                                            o_stride);
    else
        decode_merge_kernel<64><<<mgrid, 64, 0, stream>>>(ws_acc, ws_ml, seq_lens, n_heads,
                                                          max_splits, (__nv_bfloat16 *)out,
                                                          o_stride);
    return cudaGetLastError();
}
