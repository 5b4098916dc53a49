/* cluster.cuh - thread-block clusters and distributed shared memory (sm_90
 * and later) for the kernels that combine their CTAs' partial results
 * through each other's shared memory (sampling.cu, attention_decode.cu).
 *
 * Below sm_90 DSQ_CLUSTER is 0 and the primitives compile to nothing (no
 * barrier, the CTA's own memory, rank 0): the host launches cluster
 * instances only where the device and the kernel's binary support them,
 * and a kernel that may run as a lone CTA uses __syncthreads() there. */
#ifndef DSQ_CUDA_CLUSTER_CUH
#define DSQ_CUDA_CLUSTER_CUH

#include <cooperative_groups.h>

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define DSQ_CLUSTER 1
#else
#define DSQ_CLUSTER 0
#endif

/* every thread of every CTA of the cluster: arrive.release + wait.acquire
 * (what a CTA wrote to its shared memory before it is visible to its peers
 * after it) */
static __device__ __forceinline__ void cl_sync()
{
#if DSQ_CLUSTER
    cooperative_groups::this_cluster().sync();
#endif
}

/* p (this CTA's shared memory) in CTA r of the cluster */
template <typename T> static __device__ __forceinline__ T *cl_peer(T *p, int r)
{
#if DSQ_CLUSTER
    return cooperative_groups::this_cluster().map_shared_rank(p, (unsigned)r);
#else
    (void)r;
    return p;
#endif
}

static __device__ __forceinline__ int cl_rank()
{
#if DSQ_CLUSTER
    return (int)cooperative_groups::this_cluster().block_rank();
#else
    return 0;
#endif
}

#endif /* DSQ_CUDA_CLUSTER_CUH */
