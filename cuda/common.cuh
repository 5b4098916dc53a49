/* common.cuh - small device helpers shared by the kernels in this folder
 * (bf16 unpacking, warp/block sums, the launch check).  Device code only. */
#ifndef DSQ_CUDA_COMMON_CUH
#define DSQ_CUDA_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "kernels.h"
#include "pdl.cuh"

/* bf16 -> fp32 is a shift: the two halves of a 32-bit word hold two bf16s,
 * the low half is the element with the lower index (little endian). */
__device__ __forceinline__ float dsq_bf16_lo(uint32_t u) { return __uint_as_float(u << 16); }
__device__ __forceinline__ float dsq_bf16_hi(uint32_t u) { return __uint_as_float(u & 0xffff0000u); }

/* Unpack 8 bf16s (one 16-byte load) into fp32. */
__device__ __forceinline__ void dsq_unpack8(uint4 v, float f[8])
{
    f[0] = dsq_bf16_lo(v.x); f[1] = dsq_bf16_hi(v.x);
    f[2] = dsq_bf16_lo(v.y); f[3] = dsq_bf16_hi(v.y);
    f[4] = dsq_bf16_lo(v.z); f[5] = dsq_bf16_hi(v.z);
    f[6] = dsq_bf16_lo(v.w); f[7] = dsq_bf16_hi(v.w);
}

/* fp32 -> bf16 bits, round to nearest even (what torch's .to(bfloat16) does). */
__device__ __forceinline__ uint16_t dsq_f2bf(float f)
{
    return __bfloat16_as_ushort(__float2bfloat16_rn(f));
}

/* c[4] += A (16 x 16 bf16, row) . B (16 x 8 bf16, col), fp32 accumulate:
 * mma.sync m16n8k16 with the PTX fragment layout (a0..a3: rows g / g+8,
 * k 2q.. / 2q+8..; b0, b1: k 2q.. / 2q+8.., column g; g = lane / 4, q =
 * lane % 4).  sm_80 and later; compiles to nothing before. */
__device__ __forceinline__ void dsq_mma_bf16(float c[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                             uint32_t b0, uint32_t b1)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#endif
}

__device__ __forceinline__ float dsq_warp_sum(float v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* Sum over the block (blockDim.x a multiple of 32, <= 1024); every thread
 * gets the result.  `red` is __shared__ float[32]. */
__device__ __forceinline__ float dsq_block_sum(float v, float *red)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int nwarps = blockDim.x >> 5;
    v = dsq_warp_sum(v);
    __syncthreads(); /* red may still be read by a previous call */
    if (lane == 0)
        red[warp] = v;
    __syncthreads();
    float s = lane < nwarps ? red[lane] : 0.0f;
    return dsq_warp_sum(s);
}

/* Host: blocks of kernel `func` resident at once on the current device
 * with nt threads and smem bytes of dynamic shared memory: blocks per SM x
 * SMs.  *cache (static storage, zero-initialised; one per kernel instance
 * and block size) remembers the blocks per SM of the last smem asked for,
 * packed as smem << 16 | blocks in one atomic word (the occupancy does not
 * depend on the SM count, which is read per call).  1 per SM where the
 * query fails. */
static inline unsigned dsq_cu_resident_blocks(const void *func, int nt, size_t smem, int64_t *cache)
{
    const int64_t c = __atomic_load_n(cache, __ATOMIC_RELAXED);
    int b = (int)(c & 0xffff);
    if (b <= 0 || (size_t)(c >> 16) != smem) {
        if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, func, nt, smem) != cudaSuccess || b <= 0) {
            (void)cudaGetLastError();
            b = 1;
        }
        __atomic_store_n(cache, (int64_t)smem << 16 | (b & 0xffff), __ATOMIC_RELAXED);
    }
    int dev = 0, sms = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) !=
                                                  cudaSuccess || sms <= 0) {
        (void)cudaGetLastError();
        sms = 1;
    }
    return (unsigned)b * (unsigned)sms;
}

/* After a launch: launch-configuration errors become a dsq_status. */
#define DSQ_CU_LAUNCHED(what) dsq_cu_status(cudaGetLastError(), what)

#endif /* DSQ_CUDA_COMMON_CUH */
