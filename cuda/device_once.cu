/* device_once.cu - per-device one-time setup (kernel attributes), so a
 * context on a second GPU gets its own shared-memory opt-ins. */
#include <pthread.h>

#include "kernels.h"

static pthread_mutex_t once_mutex = PTHREAD_MUTEX_INITIALIZER;

extern "C" cudaError_t dsq_cu_once_per_device(dsq_cu_once *o, cudaError_t (*fn)(int device), int *device)
{
    int dev = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e != cudaSuccess)
        return e;
    if (device)
        *device = dev;
    if (dev < 0 || dev >= DSQ_CU_MAX_DEVICES)
        return cudaErrorInvalidDevice;
    if (__atomic_load_n(&o->done[dev], __ATOMIC_ACQUIRE))
        return cudaSuccess;
    /* one lock for every table: setup runs a handful of times per process */
    pthread_mutex_lock(&once_mutex);
    if (!o->done[dev]) {
        e = fn(dev);
        if (e == cudaSuccess)
            __atomic_store_n(&o->done[dev], 1, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&once_mutex);
    return e;
}
