/* finite_check.cu - flag NaN/Inf in weights already on the device: the GPU
 * side of the load-time check (the CPU backend scans the mapped files
 * instead).  Checking the uploaded copy rather than the files also catches
 * F32/F16 values that overflow to Inf when converted to bf16. */
#include "common.cuh"

/* Non-finite = every exponent bit set (MASK: the exponent field).  Region
 * [rows][cols] whose rows are `pitch` elements apart (pitch 2*cols reads one
 * of two interleaved tensors).  Grid-strided in both dimensions; a block
 * that sees a bad value sets *flag (several may: they all write 1). */
template <typename T, T MASK>
__global__ void k_flag_nonfinite(const T *__restrict__ p, int64_t rows, int64_t cols, int64_t pitch,
                                 uint32_t *flag)
{
    int bad = 0;
    for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
        const T *row = p + r * pitch;
        for (int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; c < cols;
             c += (int64_t)gridDim.x * blockDim.x)
            bad |= (row[c] & MASK) == MASK;
    }
    if (__syncthreads_or(bad) && threadIdx.x == 0)
        atomicOr(flag, 1u);
}

extern "C" dsq_status dsq_cu_flag_nonfinite(const void *p, int elem_bytes, int64_t rows, int64_t cols,
                                            int64_t pitch, uint32_t *flag, cudaStream_t stream)
{
    if (rows <= 0 || cols <= 0)
        return DSQ_OK;
    const int threads = 256;
    int64_t gx = (cols + threads - 1) / threads;
    dim3 grid((unsigned)(gx < 8 ? gx : 8), (unsigned)(rows < 4096 ? rows : 4096));
    if (elem_bytes == 2)
        k_flag_nonfinite<uint16_t, (uint16_t)0x7f80u><<<grid, threads, 0, stream>>>(
            (const uint16_t *)p, rows, cols, pitch, flag);
    else if (elem_bytes == 4)
        k_flag_nonfinite<uint32_t, 0x7f800000u><<<grid, threads, 0, stream>>>(
            (const uint32_t *)p, rows, cols, pitch, flag);
    else
        return dsq_fail(DSQ_ERR_INTERNAL, "dsq_cu_flag_nonfinite: element size %d", elem_bytes);
    return DSQ_CU_LAUNCHED("non-finite weight check");
}
