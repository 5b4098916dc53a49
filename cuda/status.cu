/* status.cu - CUDA runtime errors -> dsq_status with a message. */
#include "kernels.h"

extern "C" dsq_status dsq_cu_status(cudaError_t err, const char *what)
{
    if (err == cudaSuccess)
        return DSQ_OK;
    /* A non-sticky error stays recorded for the thread until read; clear it
     * so the next launch check does not report this failure again. */
    (void)cudaGetLastError();
    if (err == cudaErrorMemoryAllocation)
        return dsq_fail(DSQ_ERR_DEVICE_OOM, "%s: out of GPU memory (%s)", what,
                        cudaGetErrorString(err));
    return dsq_fail(DSQ_ERR_DEVICE, "%s: CUDA error %d (%s: %s)", what, (int)err,
                    cudaGetErrorName(err), cudaGetErrorString(err));
}
