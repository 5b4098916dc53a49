/*
 * wgmma.cuh - Hopper warpgroup tensor-core wrappers (sm_90a: wgmma.mma_async)
 * for the prefill attention kernel and the Hopper products of up to 64
 * rows (gemm_rows_wg.cu).  Compiled for other targets they trap; a probe
 * kernel at setup (attention_prefill.cu's prefill_init, gemm_rows_wg.cu's
 * wg_init) says whether the code the device runs has them, and only then
 * are the kernels that use them launched.
 *
 * A warpgroup (4 consecutive warps, 128 threads) computes D[64][N] (+)=
 * A[64][16] x B[16][N]: warp w holds rows 16w .. 16w + 15 of A and D, with
 * A in registers as mma.sync m16n8k16's A fragment and D as N/8 of its C
 * fragments (d[j][0..1]: row lane/4, columns 8j + 2 (lane % 4) + 0..1;
 * d[j][2..3]: row lane/4 + 8).  B is read from shared memory through a
 * descriptor (wgmma_desc_sw128).
 *
 * Ordering (the instructions are asynchronous): wgmma_fence() before the
 * first wgmma that reads registers other instructions wrote (A fragments,
 * a rescaled accumulator); wgmma_commit() then wgmma_wait0() before the
 * accumulators are read; wgmma_pin() after the wait keeps the compiler
 * from moving reads of them above it.  Shared memory written by threads
 * (st.shared, cp.async) is made visible to wgmma by fence_proxy_async()
 * before the barrier that publishes it.
 */
#ifndef DSQ_WGMMA_CUH
#define DSQ_WGMMA_CUH

#include <stdint.h>

namespace dsq_attn {

/* Descriptor of a 128-byte-swizzled operand (layout type 1) at shared
 * address `addr` (atoms of 8 rows x 128 bytes, 1024-byte aligned; a start
 * inside an atom row, e.g. +32 bytes for the second k-step of 16 halves,
 * is allowed).  K-major: lbo unused, sbo = bytes between groups of 8 rows.
 * N-major (transposed B): lbo = bytes between 64-element column blocks,
 * sbo = bytes between groups of 8 rows along K. */
__device__ __forceinline__ uint64_t wgmma_desc_sw128(uint32_t addr, uint32_t lbo, uint32_t sbo)
{
    return (uint64_t)((addr & 0x3FFFF) >> 4) | ((uint64_t)((lbo >> 4) & 0x3FFF) << 16) |
           ((uint64_t)((sbo >> 4) & 0x3FFF) << 32) | (1ull << 62);
}

__device__ __forceinline__ void wgmma_fence()
{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void wgmma_commit()
{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void wgmma_wait0()
{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
#endif
}
/* generic-proxy shared-memory writes -> visible to the async proxy */
__device__ __forceinline__ void fence_proxy_async()
{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

/* Accumulator registers d[n][4]: an empty asm that "writes" them, so no
 * read of them is scheduled above the wgmma_wait0() before it. */
template <int N> __device__ __forceinline__ void wgmma_pin(float (*d)[4])
{
#pragma unroll
    for (int i = 0; i < N; i++)
        asm volatile("" : "+f"(d[i][0]), "+f"(d[i][1]), "+f"(d[i][2]), "+f"(d[i][3])::"memory");
}

/* d[N/8][4] = (accumulate ? d : 0) + A x B, A in registers (a[4]: this
 * warp's m16n8k16 A fragment), B a 16 x N operand behind descriptor b; TB
 * 0: B K-major (each of the N columns holds its 16 k contiguous), 1:
 * N-major (transposed). */
template <int TB>
__device__ __forceinline__ void wgmma_m64n64k16_rs(float (*d)[4], const uint32_t a[4], uint64_t b, int accumulate)
{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {"
                 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
                 "}, {%32, %33, %34, %35}, %36, p, 1, 1, %38;\n}\n"
                 : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]),
                   "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),
                   "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
                   "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]),
                   "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]),
                   "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
                   "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]),
                   "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(accumulate), "n"(TB));
#else
    (void)d;
    (void)a;
    (void)b;
    (void)accumulate;
    __trap();
#endif
}

template <int TB>
__device__ __forceinline__ void wgmma_m64n128k16_rs(float (*d)[4], const uint32_t a[4], uint64_t b, int accumulate)
{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {"
                 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
                 "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
                 "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
                 "}, {%64, %65, %66, %67}, %68, p, 1, 1, %70;\n}\n"
                 : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]),
                   "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),
                   "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
                   "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]),
                   "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]),
                   "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
                   "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]),
                   "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]),
                   "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]),
                   "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]),
                   "+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]),
                   "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]),
                   "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]),
                   "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]),
                   "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]),
                   "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(accumulate), "n"(TB));
#else
    (void)d;
    (void)a;
    (void)b;
    (void)accumulate;
    __trap();
#endif
}

/* d[8][4] (+)= A x B with both operands in shared memory, bf16 inputs:
 * A a 64 x 16 K-major operand behind descriptor a (row m: 16 k
 * contiguous), B a 16 x 64 K-major operand behind b (column n likewise);
 * D as above (warp w: rows 16w ..).  accumulate 0: d = A x B. */
__device__ __forceinline__ void wgmma_m64n64k16_ss_bf16(float (*d)[4], uint64_t a, uint64_t b, int accumulate)
{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
                 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
                 "}, %32, %33, p, 1, 1, 0, 0;\n}\n"
                 : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]),
                   "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),
                   "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
                   "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]),
                   "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]),
                   "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
                   "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]),
                   "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])
                 : "l"(a), "l"(b), "r"(accumulate));
#else
    (void)d;
    (void)a;
    (void)b;
    (void)accumulate;
    __trap();
#endif
}

} /* namespace dsq_attn */

#endif /* DSQ_WGMMA_CUH */
