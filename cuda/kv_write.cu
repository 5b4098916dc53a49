/*
 * kv_write.cu - append the K and V of a batch of new tokens to the KV cache
 * (layout in attention.h), rounding to fp16 or quantizing to int8 with one
 * fp32 scale per (token, kv head).
 *
 * One warp per (token, kv head, K|V): the head's D values are one coalesced
 * read and one coalesced write, and the int8 scale (max |x| over the head)
 * is a warp reduction with no shared memory.
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "attention.h"
#include "attention_tile.cuh"
#include "kernels.h" /* dsq_cu_status */
#include "kv_quant.cuh"
#include "rope.cuh"

namespace dsq_attn {

template <int D, bool INT8>
__global__ void __launch_bounds__(128)
    kv_write_kernel(KvArgs a, const __nv_bfloat16 *k, int64_t k_stride, const __nv_bfloat16 *v,
                    int64_t v_stride, const int32_t *tok_seq, const int32_t *pos, int n_items)
{
    constexpr int E = D / 32; /* values per lane: 4 (D=128) or 2 (D=64) */
    const int lane = threadIdx.x & 31;
    const int item = blockIdx.x * 4 + (threadIdx.x >> 5);
    if (item >= n_items)
        return;
    /* item = (token * n_kv + head) * 2 + is_v */
    const int is_v = item & 1;
    const int th = item >> 1;
    const int t = th / a.n_kv, h = th % a.n_kv;
    const __nv_bfloat16 *src =
        (is_v ? v + (int64_t)t * v_stride : k + (int64_t)t * k_stride) + h * D + lane * E;
    float x[E];
    if (E == 4) {
        uint2 w = *(const uint2 *)src;
        float2 f0 = __bfloat1622float2(*reinterpret_cast<__nv_bfloat162 *>(&w.x));
        float2 f1 = __bfloat1622float2(*reinterpret_cast<__nv_bfloat162 *>(&w.y));
        x[0] = f0.x;
        x[1] = f0.y;
        x[E > 2 ? 2 : 0] = f1.x;
        x[E > 3 ? 3 : 0] = f1.y;
    } else {
        uint32_t w = *(const uint32_t *)src;
        float2 f0 = __bfloat1622float2(*reinterpret_cast<__nv_bfloat162 *>(&w));
        x[0] = f0.x;
        x[1] = f0.y;
    }
    const int64_t row = kv_row(a, tok_seq[t], pos[t]);
    const int64_t off = (row * a.n_kv + h) * D + lane * E;
    if (!INT8) {
        __half *dst = (__half *)(is_v ? a.v : a.k) + off;
        uint32_t o[E / 2];
#pragma unroll
        for (int i = 0; i < E / 2; i++) {
            __half2 h2 = __halves2half2(dsq_kv_f16(x[2 * i]), dsq_kv_f16(x[2 * i + 1]));
            o[i] = *reinterpret_cast<uint32_t *>(&h2);
        }
        if (E == 4)
            *(uint2 *)dst = make_uint2(o[0], o[E / 2 - 1]);
        else
            *(uint32_t *)dst = o[0];
    } else {
        float amax = 0.f;
        bool finite = true;
#pragma unroll
        for (int i = 0; i < E; i++) {
            amax = fmaxf(amax, fabsf(x[i]));
            finite = finite && isfinite(x[i]);
        }
#pragma unroll
        for (int s = 16; s > 0; s >>= 1)
            amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, s));
        finite = __all_sync(0xffffffffu, finite);
        const float scale = dsq_kv_i8_scale(amax, finite);
        uint32_t packed = 0;
#pragma unroll
        for (int i = 0; i < E; i++)
            packed |= (uint32_t)(dsq_kv_i8(x[i], scale) & 0xff) << (8 * i);
        int8_t *dst = (int8_t *)(is_v ? a.v : a.k) + off;
        if (E == 4)
            *(uint32_t *)dst = packed;
        else
            *(uint16_t *)dst = (uint16_t)packed;
        if (lane == 0)
            (is_v ? (float *)a.vs : (float *)a.ks)[row * a.n_kv + h] = scale;
    }
}

/* RoPE and the KV write in one launch (prefill and mixed passes; decode-only
 * passes do both inside the decode attention).  grid (T, ceil(heads /
 * HPB)), block (D/2, HPB): thread (i, y) rotates the pair (i, i + D/2) of
 * head blockIdx.y * HPB + y (q and k heads; v heads only converted), stores
 * the bf16 row as dsq_cu_rope does, and for k and v heads stores the
 * bf16-rounded values into the cache exactly as kv_write_kernel does (fp16,
 * or int8 with the head's max |x| / 127 as scale).  HPB heads per block
 * because one 64-thread block per (token, head) was bound by the block
 * scheduler, not by memory: 80 us per layer for a 4,096-token prompt on the
 * H200 (11 us for 512) for ~50 MB of traffic.  Every warp lies inside one
 * head (D/2 is 32 or 64), so the warp reductions never mix heads. */
template <int D, bool INT8, int HPB>
__global__ void __launch_bounds__(D / 2 * HPB)
    rope_kv_write_kernel(KvArgs a, const float *__restrict__ qkv, int64_t stride, const int32_t *__restrict__ pos,
                         const int32_t *__restrict__ tok_seq, int n_q, int heads, const float *__restrict__ inv_freq,
                         __nv_bfloat16 *__restrict__ out)
{
    constexpr int half = D / 2;
    dsq_pdl_wait();
    dsq_pdl_trigger();
    const int t = blockIdx.x, y = threadIdx.y, h = blockIdx.y * HPB + y, i = threadIdx.x;
    const bool live = h < heads;
    const int64_t base = (int64_t)t * stride + (int64_t)h * D;
    const int p = pos[t];
    float f0 = 0.f, f1 = 0.f;
    if (live) {
        float x0 = qkv[base + i], x1 = qkv[base + i + half];
        if (h < n_q + a.n_kv)
            dsq_rope_pair(x0, x1, p, inv_freq[i]);
        const __nv_bfloat16 b0 = __float2bfloat16_rn(x0), b1 = __float2bfloat16_rn(x1);
        out[base + i] = b0;
        out[base + i + half] = b1;
        f0 = __bfloat162float(b0);
        f1 = __bfloat162float(b1);
    }
    /* a k or v head: its values go into the cache */
    const bool cached = live && h >= n_q;
    const int is_v = h >= n_q + a.n_kv;
    const int kh = h - n_q - (is_v ? a.n_kv : 0);
    if (!INT8) {
        if (!cached)
            return;
        const int64_t off = (kv_row(a, tok_seq[t], p) * a.n_kv + kh) * D;
        __half *dst = (__half *)(is_v ? a.v : a.k) + off;
        dst[i] = dsq_kv_f16(f0);
        dst[i + half] = dsq_kv_f16(f1);
        return;
    }
    /* INT8: every thread reaches the barrier below (no return before it) */
    float amax = fmaxf(fabsf(f0), fabsf(f1));
    bool finite = isfinite(f0) && isfinite(f1);
#pragma unroll
    for (int s = 16; s > 0; s >>= 1)
        amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, s));
    finite = __all_sync(0xffffffffu, finite);
    if (half > 32) { /* two warps per head: combine through shared memory */
        __shared__ float wmax[HPB][2];
        __shared__ int wfin[HPB][2];
        if ((i & 31) == 0) {
            wmax[y][i >> 5] = amax;
            wfin[y][i >> 5] = finite;
        }
        __syncthreads();
        amax = fmaxf(wmax[y][0], wmax[y][1]);
        finite = wfin[y][0] && wfin[y][1];
    }
    if (!cached)
        return;
    const int64_t row = kv_row(a, tok_seq[t], p);
    const int64_t off = (row * a.n_kv + kh) * D;
    const float scale = dsq_kv_i8_scale(amax, finite);
    int8_t *dst = (int8_t *)(is_v ? a.v : a.k) + off;
    dst[i] = (int8_t)dsq_kv_i8(f0, scale);
    dst[i + half] = (int8_t)dsq_kv_i8(f1, scale);
    if (i == 0)
        (is_v ? (float *)a.vs : (float *)a.ks)[row * a.n_kv + kh] = scale;
}

} /* namespace dsq_attn */

using namespace dsq_attn;

extern "C" dsq_status dsq_attn_kv_write(const dsq_attn_kv *kv, const void *k, int64_t k_stride,
                                         const void *v, int64_t v_stride,
                                         const int32_t *tok_seq, const int32_t *pos,
                                         int32_t n_tokens, cudaStream_t stream)
{
    if (n_tokens < 0 || !kv_ok(kv))
        return dsq_fail(DSQ_ERR_INTERNAL, "KV write: %d tokens, or a cache description kv_ok() refuses", (int)n_tokens);
    if (n_tokens == 0)
        return DSQ_OK;
    const int D = kv->head_dim;
    /* each lane reads D/32 bf16 = 8 or 4 bytes */
    const uintptr_t need = D == 128 ? 7u : 3u;
    if (!k || !v || !tok_seq || !pos || ((uintptr_t)k & need) || ((uintptr_t)v & need) ||
        (k_stride * 2) % (int64_t)(need + 1) || (v_stride * 2) % (int64_t)(need + 1) ||
        k_stride < (int64_t)kv->n_kv_heads * D || v_stride < (int64_t)kv->n_kv_heads * D)
        return dsq_fail(DSQ_ERR_INTERNAL, "KV write: a NULL or misaligned pointer, or strides %lld / %lld below %d",
                        (long long)k_stride, (long long)v_stride, kv->n_kv_heads * D);
    const int64_t n_items = (int64_t)n_tokens * kv->n_kv_heads * 2;
    if (n_items > (int64_t)1 << 30)
        return dsq_fail(DSQ_ERR_INTERNAL, "KV write: %d tokens is too many for one launch", (int)n_tokens);
    KvArgs a = kv_args(kv);
    dim3 grid((unsigned)((n_items + 3) / 4)), block(128);
    const __nv_bfloat16 *kb = (const __nv_bfloat16 *)k, *vb = (const __nv_bfloat16 *)v;
    const bool i8 = kv->dtype == DSQ_ATTN_KV_INT8;
    if (D == 128) {
        if (i8)
            kv_write_kernel<128, true><<<grid, block, 0, stream>>>(a, kb, k_stride, vb, v_stride,
                                                                   tok_seq, pos, (int)n_items);
        else
            kv_write_kernel<128, false><<<grid, block, 0, stream>>>(a, kb, k_stride, vb, v_stride,
                                                                    tok_seq, pos, (int)n_items);
    } else {
        if (i8)
            kv_write_kernel<64, true><<<grid, block, 0, stream>>>(a, kb, k_stride, vb, v_stride,
                                                                  tok_seq, pos, (int)n_items);
        else
            kv_write_kernel<64, false><<<grid, block, 0, stream>>>(a, kb, k_stride, vb, v_stride,
                                                                   tok_seq, pos, (int)n_items);
    }
    return dsq_cu_status(cudaGetLastError(), "KV write kernel");
}

extern "C" dsq_status dsq_attn_rope_kv_write(const dsq_attn_kv *kv, const float *qkv, int64_t row_stride,
                                              const int32_t *pos, const int32_t *tok_seq, int32_t n_tokens,
                                              int32_t n_q_heads, const float *inv_freq, void *out,
                                              cudaStream_t stream)
{
    if (n_tokens < 0 || !kv_ok(kv) || n_q_heads < 0)
        return dsq_fail(DSQ_ERR_INTERNAL, "RoPE + KV write: %d tokens, %d q heads, or a cache description kv_ok() "
                        "refuses", (int)n_tokens, (int)n_q_heads);
    if (n_tokens == 0)
        return DSQ_OK;
    const int D = kv->head_dim;
    const int64_t heads = (int64_t)n_q_heads + 2 * kv->n_kv_heads;
    if (!qkv || !pos || !tok_seq || !inv_freq || !out || row_stride < heads * D || heads > 65535)
        return dsq_fail(DSQ_ERR_INTERNAL, "RoPE + KV write: a NULL pointer, row stride %lld below %lld, or %lld heads",
                        (long long)row_stride, (long long)(heads * D), (long long)heads);
    KvArgs a = kv_args(kv);
    constexpr int HPB = 8; /* heads per block */
    const dim3 grid((unsigned)n_tokens, (unsigned)((heads + HPB - 1) / HPB)), block((unsigned)(D / 2), HPB);
    __nv_bfloat16 *o = (__nv_bfloat16 *)out;
    const bool i8 = kv->dtype == DSQ_ATTN_KV_INT8;
    const int nq = (int)n_q_heads, nh = (int)heads;
    cudaError_t e;
    if (D == 128)
        e = i8 ? dsq_launch_pdl(rope_kv_write_kernel<128, true, HPB>, grid, block, 0, stream, a, qkv, row_stride,
                                pos, tok_seq, nq, nh, inv_freq, o)
               : dsq_launch_pdl(rope_kv_write_kernel<128, false, HPB>, grid, block, 0, stream, a, qkv, row_stride,
                                pos, tok_seq, nq, nh, inv_freq, o);
    else
        e = i8 ? dsq_launch_pdl(rope_kv_write_kernel<64, true, HPB>, grid, block, 0, stream, a, qkv, row_stride,
                                pos, tok_seq, nq, nh, inv_freq, o)
               : dsq_launch_pdl(rope_kv_write_kernel<64, false, HPB>, grid, block, 0, stream, a, qkv, row_stride,
                                pos, tok_seq, nq, nh, inv_freq, o);
    return dsq_cu_status(e, "RoPE + KV write kernel");
}
