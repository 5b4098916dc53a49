/* dl_util.h - the one way libdsqwen opens an optional shared library at run
 * time (cuBLASLt, NCCL): the first of several names that loads. */
#ifndef DSQ_CUDA_DL_UTIL_H
#define DSQ_CUDA_DL_UTIL_H

#include <dlfcn.h>
#include <stddef.h>
#include <stdio.h>

/* dlopen(RTLD_NOW | RTLD_LOCAL) names[0..n) in order and return the first
 * handle; NULL when none loads, with every dlerror() joined by "; " into
 * problem[cap] (the loader's own search applies to each name: LD_LIBRARY_PATH,
 * RUNPATH, the ld.so cache, the system directories). */
static inline void *dsq_dlopen_first(const char *const *names, size_t n, char *problem, size_t cap)
{
    void *h = NULL;
    size_t used = 0;
    if (cap)
        problem[0] = '\0';
    for (size_t i = 0; i < n && !h; i++) {
        dlerror();
        h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
        if (!h && used < cap) {
            const char *e = dlerror();
            int k = snprintf(problem + used, cap - used, "%s%s", used ? "; " : "", e ? e : names[i]);
            used += k > 0 ? (size_t)k : 0;
        }
    }
    return h;
}

#endif
