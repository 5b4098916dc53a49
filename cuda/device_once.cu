/* device_once.cu - per-device one-time setup (kernel attributes), so a
 * context on a second GPU gets its own shared-memory opt-ins. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "pdl.cuh"

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

/* PDL (cuda/pdl.cuh): on for devices of compute capability 9.0 and later,
 * unless DSQ_CUDA_PDL=0 (a measurement knob).  Cached per device: 0 not yet
 * known, 1 off, 2 on. */
static int pdl_state[DSQ_CU_MAX_DEVICES];

extern "C" int dsq_pdl_enabled(void)
{
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= DSQ_CU_MAX_DEVICES)
        return 0;
    int st = __atomic_load_n(&pdl_state[dev], __ATOMIC_RELAXED);
    if (st == 0) {
        int major = 0;
        const char *env = getenv("DSQ_CUDA_PDL");
        if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) {
            (void)cudaGetLastError();
            major = 0;
        }
        st = major >= 9 && !(env && env[0] == '0') ? 2 : 1;
        __atomic_store_n(&pdl_state[dev], st, __ATOMIC_RELAXED);
    }
    return st == 2;
}

/* DSQ_CUDA_PDL_EARLY (pdl.cuh, "Early triggers"): which kernels let their
 * dependent launch before their own wait, a mask of DSQ_PDL_EARLY_*: "0"
 * none, "merge" (every merge), "long" (merges of many splits), "gemv",
 * "all" (GEMVs and every merge); unset or anything else: the default
 * (GEMVs and "long").  Read once per process. */
extern "C" int dsq_pdl_early(void)
{
    static int mask = -1; /* -1 not yet read */
    int v = __atomic_load_n(&mask, __ATOMIC_RELAXED);
    if (v < 0) {
        static const struct {
            const char *name;
            int mask;
        } names[] = {{"0", 0},
                     {"merge", DSQ_PDL_EARLY_MERGE},
                     {"long", DSQ_PDL_EARLY_MERGE_LONG},
                     {"gemv", DSQ_PDL_EARLY_GEMV},
                     {"all", DSQ_PDL_EARLY_MERGE | DSQ_PDL_EARLY_GEMV}};
        const char *e = getenv("DSQ_CUDA_PDL_EARLY");
        v = DSQ_PDL_EARLY_DEFAULT;
        for (size_t i = 0; e && i < sizeof names / sizeof names[0]; i++)
            if (!strcmp(e, names[i].name))
                v = names[i].mask;
        __atomic_store_n(&mask, v, __ATOMIC_RELAXED);
    }
    return v;
}
