/* kv_quant.cuh - how one (token, kv head) vector is stored in the cache
 * (attention.h, "INT8" and "F16"), shared by every kernel that writes the
 * cache (kv_write.cu; attention_decode.cu when it applies RoPE itself) so
 * they store the same bytes. */
#ifndef DSQ_CUDA_KV_QUANT_CUH
#define DSQ_CUDA_KV_QUANT_CUH

#include <cuda_fp16.h>

/* The INT8 scale from the vector's max |x| and whether all of it is finite:
 * fmaxf drops NaN, and an Inf would make the scale Inf, so a vector with any
 * NaN/Inf is stored as zeros with a NaN scale (as on the CPU) and reads back
 * as NaN.  IEEE division, as the CPU. */
__device__ __forceinline__ float dsq_kv_i8_scale(float amax, bool finite)
{
    return finite ? __fdiv_rn(amax, 127.0f) : __int_as_float(0x7fffffff);
}

/* One value quantized with that scale (0 for the NaN scale or a zero one). */
__device__ __forceinline__ int dsq_kv_i8(float x, float scale)
{
    if (!(scale > 0.f))
        return 0;
    return (int)fminf(fmaxf(rintf(__fdiv_rn(x, scale)), -127.f), 127.f);
}

/* F16: IEEE round to nearest, as the CPU's dsq_f32_to_f16 (beyond +-65504
 * is +-Inf, NaN stays NaN; a saturating clamp made NaN -65504). */
__device__ __forceinline__ __half dsq_kv_f16(float x) { return __float2half_rn(x); }

#endif
