/* rows_kernel.h - pick which kernel runs the up-to-64-row products
 * (dsq_cu_gemm_rows / _q8 / _q4) in the GPU tests: gemm_rows.cu's
 * mma.sync kernel or gemm_rows_wg.cu's Hopper kernel (and its ring depth),
 * through the knobs the library reads per call (DSQ_CUDA_ROWS_WG: 0 never,
 * 2 every row count; DSQ_CUDA_ROWS_WG_SLOTS). */
#ifndef DSQ_TEST_ROWS_KERNEL_H
#define DSQ_TEST_ROWS_KERNEL_H

#include <stdio.h>
#include <stdlib.h>

#include "kernels.h"

/* the kernels (and, on the wgmma one, ring depths) the tests run */
#define ROWS_KERNELS 5
static const char *const kRowsKernelName[ROWS_KERNELS] = {"mma.sync kernel", "wgmma kernel",
                                                          "wgmma kernel, 2-slot ring", "wgmma kernel, 4-slot ring",
                                                          "wgmma kernel, 128-row tiles"};

/* 1 if kernel k (0 mma.sync, 1 wgmma at the depth it chooses, 2 / 3 wgmma
 * with DSQ_CUDA_ROWS_WG_SLOTS 2 / 4, 4 wgmma with 128-row tiles:
 * DSQ_CUDA_ROWS_WG_TILE=128) now runs every T; 0 (with a visible SKIP line, not a pass) where
 * this device has no sm_90a code. */
static inline int rows_kernel_select(int k, const char *test)
{
    setenv("DSQ_CUDA_ROWS_WG", k ? "2" : "0", 1);
    if (k == 2 || k == 3)
        setenv("DSQ_CUDA_ROWS_WG_SLOTS", k == 2 ? "2" : "4", 1);
    else
        unsetenv("DSQ_CUDA_ROWS_WG_SLOTS"); /* the library's choice of depth */
    if (k == 4)
        setenv("DSQ_CUDA_ROWS_WG_TILE", "128", 1);
    else
        unsetenv("DSQ_CUDA_ROWS_WG_TILE");
    if (k && !dsq_cu_gemm_rows_wg(1)) {
        printf("  SKIP %s with the %s: the device does not run this build's sm_90a code\n", test,
               kRowsKernelName[k]);
        setenv("DSQ_CUDA_ROWS_WG", "0", 1);
        return 0;
    }
    printf("  %s: %s\n", test, kRowsKernelName[k]);
    return 1;
}

/* back to the library's default choice */
static inline void rows_kernel_reset(void)
{
    unsetenv("DSQ_CUDA_ROWS_WG");
    unsetenv("DSQ_CUDA_ROWS_WG_SLOTS");
    unsetenv("DSQ_CUDA_ROWS_WG_TILE");
}

#endif /* DSQ_TEST_ROWS_KERNEL_H */
