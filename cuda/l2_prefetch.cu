/* l2_prefetch.cu - ask the L2 cache to fetch weight bytes that the coming
 * products will read, from a kernel placed where the memory system would
 * otherwise idle.
 *
 * Why: in a decode step of a few rows, the kernels between the qkv product
 * and the o product (decode attention and its merge) read kilobytes to a
 * few megabytes while they run for ~8 us per layer at 512 keys
 * (docs/performance.md, stop 19's batch-1 table): the HBM, which the step
 * is bound by, idles.  Prefetching the o weights and the first rows of the
 * gate/up weights (the rows the gate/up GEMV's first rounds read) into L2
 * then lets those products read part of their bytes from L2.
 *
 * A hint only: results never depend on it.  One thread per 32 KB chunk
 * issues one bulk prefetch (cp.async.bulk.prefetch.L2, sm_90) or one
 * prefetch per 128-byte line (older GPUs).  PDL: the kernel lets the next
 * kernel launch at once (it writes nothing anyone reads), issues its
 * prefetches, and waits for its predecessor before it completes, so that
 * the next kernel's own wait still covers everything before this one. */
#include "common.cuh"

namespace {

constexpr uint32_t CHUNK = 32768;
constexpr int NT = 128;

struct L2pArgs {
    const char *p[DSQ_L2P_MAX_RANGES];
    uint64_t bytes[DSQ_L2P_MAX_RANGES];
    int n;
};

__device__ __forceinline__ void prefetch_chunk(const char *src, uint32_t bytes)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(__cvta_generic_to_global(src)), "r"(bytes)
                 : "memory");
#else
    for (uint32_t o = 0; o < bytes; o += 128)
        asm volatile("prefetch.global.L2 [%0];\n" ::"l"(__cvta_generic_to_global(src + o)));
#endif
}

__global__ void __launch_bounds__(NT) l2_prefetch_kernel(L2pArgs a)
{
    dsq_pdl_trigger();
    uint64_t i = (uint64_t)blockIdx.x * NT + threadIdx.x; /* chunk over the ranges, in order */
    for (int r = 0; r < a.n; r++) {
        const uint64_t nch = (a.bytes[r] + CHUNK - 1) / CHUNK;
        if (i < nch) {
            const uint64_t left = a.bytes[r] - i * CHUNK;
            prefetch_chunk(a.p[r] + i * CHUNK, (uint32_t)(left < CHUNK ? left : CHUNK));
            break;
        }
        i -= nch;
    }
    dsq_pdl_wait();
}

} // namespace

extern "C" dsq_status dsq_cu_l2_prefetch(const dsq_l2p_range *ranges, int32_t n, cudaStream_t stream)
{
    if (n < 0 || n > DSQ_L2P_MAX_RANGES || (n > 0 && !ranges))
        return dsq_fail(DSQ_ERR_INTERNAL, "L2 prefetch: %d ranges (0..%d)", (int)n, DSQ_L2P_MAX_RANGES);
    L2pArgs a = {};
    uint64_t chunks = 0;
    for (int32_t r = 0; r < n; r++) {
        if (ranges[r].bytes == 0)
            continue;
        if (!ranges[r].p || ((uintptr_t)ranges[r].p & 15) != 0 || ranges[r].bytes % 16 != 0)
            return dsq_fail(DSQ_ERR_INTERNAL, "L2 prefetch: range %d (%p, %llu bytes) is not 16-byte aligned", (int)r,
                            ranges[r].p, (unsigned long long)ranges[r].bytes);
        a.p[a.n] = static_cast<const char *>(ranges[r].p);
        a.bytes[a.n] = ranges[r].bytes;
        a.n++;
        chunks += (ranges[r].bytes + CHUNK - 1) / CHUNK;
    }
    if (chunks == 0)
        return DSQ_OK;
    const unsigned blocks = (unsigned)((chunks + NT - 1) / NT);
    return dsq_cu_status(dsq_launch_pdl(l2_prefetch_kernel, dim3(blocks), dim3(NT), 0, stream, a), "L2 prefetch kernel");
}
