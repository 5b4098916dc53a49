/* pdl.cuh - programmatic dependent launch (Hopper and later).
 *
 * A kernel launched with dsq_launch_pdl() may start while the kernel before
 * it on the stream is still finishing, so its launch, block scheduling and
 * any prologue that reads nothing the previous kernel writes (weights, for a
 * product) overlap that kernel's tail.  The rules that keep this correct:
 *
 *  - every block of a kernel launched with dsq_launch_pdl() executes
 *    dsq_pdl_wait() before it reads anything an earlier kernel of the stream
 *    wrote or writes anything an earlier kernel reads, and on every path,
 *    early exits included (griddepcontrol.wait returns once the previous
 *    grid has completed and its memory is visible; a kernel that skipped it
 *    could complete before its predecessor, and the next kernel, which waits
 *    only for its own predecessor, would race);
 *  - dsq_pdl_trigger() lets the next kernel launch; kernels call it after
 *    their wait, so at most one dependent grid waits at a time, except
 *    the early triggers below.
 *
 * One exception: the L2 prefetch kernel (l2_prefetch.cu) reads and writes
 * nothing and triggers before its wait, so that the kernel after it still
 * launches during the tail of the kernel before it.  Ordering holds (the
 * prefetch kernel completes only after its own wait, so the next kernel's
 * wait covers both), but the next kernel's pre-wait prologue may then run
 * beside the kernel two back: prologues read only constants (weights) or
 * data older than that kernel (decode attention reads the sequence
 * lengths, the block table and earlier K/V before its wait).
 *
 * On devices before sm_90, or with DSQ_CUDA_PDL=0 in the environment (a
 * measurement knob), the attribute is not set and both calls are no-ops. */
#ifndef DSQ_CUDA_PDL_CUH
#define DSQ_CUDA_PDL_CUH

#include <cuda_runtime.h>

__device__ __forceinline__ void dsq_pdl_wait()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void dsq_pdl_trigger()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

/* Whether launches on the current device get the PDL attribute (cuda/device_once.cu). */
extern "C" int dsq_pdl_enabled(void);

/* Early triggers.  A kernel may trigger *before* its wait when every kernel
 * that can follow it reads, before its own wait, only constants or data
 * older than the kernel before it (the rule above for prologues: weights;
 * decode attention's pass metadata and earlier steps' K/V); that dependent
 * then launches one kernel sooner: after the decode merge kernel comes the o_proj GEMV,
 * which can then stream its weights into registers while decode attention
 * (a few blocks at batch 1, the memory otherwise idle) still runs, instead
 * of after it.  Ordering still holds by induction: a grid completes only
 * after its wait returned, i.e. after its predecessor completed, so each
 * kernel's wait still covers every kernel before it; and a grid launches
 * only once every block of the one before has triggered (is resident), so
 * waiting blocks never keep an earlier grid's blocks from running.  The
 * cost is SM space held by waiting blocks.  dsq_pdl_early() says which
 * kernels do it (a mask of DSQ_PDL_EARLY_*; env DSQ_CUDA_PDL_EARLY). */
#define DSQ_PDL_EARLY_MERGE 1
#define DSQ_PDL_EARLY_GEMV 2
/* the merge kernel triggers early only for sequences that use at least
 * DSQ_PDL_EARLY_MERGE_SPLITS key splits (decided in the kernel from the
 * sequence's length: the launch's split count follows the context's
 * capacity, so a 32k-token context at 512 keys would otherwise take the
 * slow case below).  Measured on an H100 (batch 1,
 * ms/step, none / gemv / merge / both; docs/performance.md, stop 31):
 * 512 keys 1.63 / 1.61 / 1.76 / 1.73, 4,096 (65 splits) 1.73 / 1.73 /
 * 1.80 / 1.77, 8,192 (129 splits) 1.94 / 1.97 / 1.91 / 1.85, 32,768
 * 2.25 / 2.28 / 2.22 / 2.16 (bench contexts sized to the prompt, so the
 * launch's and the sequence's split counts were equal).  So the default:
 * GEMVs always, merges from 128 splits (batch 1 with 8,192+ keys on 132
 * SMs). */
#define DSQ_PDL_EARLY_MERGE_LONG 4
#define DSQ_PDL_EARLY_MERGE_SPLITS 128
#define DSQ_PDL_EARLY_DEFAULT (DSQ_PDL_EARLY_GEMV | DSQ_PDL_EARLY_MERGE_LONG)
extern "C" int dsq_pdl_early(void);

/* kern<<<grid, block, smem, s>>>(args...) with the programmatic-serialization
 * attribute where dsq_pdl_enabled(); returns the launch's error. */
template <typename... KArgs, typename... Args>
static inline cudaError_t dsq_launch_pdl(void (*kern)(KArgs...), dim3 grid, dim3 block, size_t smem,
                                         cudaStream_t s, Args... args)
{
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = s;
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = at;
    cfg.numAttrs = dsq_pdl_enabled() ? 1 : 0;
    return cudaLaunchKernelEx(&cfg, kern, static_cast<KArgs>(args)...);
}

#endif /* DSQ_CUDA_PDL_CUH */
