/* rows_kernel.h - pick which kernel runs the up-to-64-row products
 * (dsq_cu_gemm_rows / _q8 / _q4) in the GPU tests: gemm_rows.cu's
 * mma.sync kernel or gemm_rows_wg.cu's Hopper kernel, through the knob the
 * library reads per call (DSQ_CUDA_ROWS_WG: 0 never, 2 every row count). */
#ifndef DSQ_TEST_ROWS_KERNEL_H
#define DSQ_TEST_ROWS_KERNEL_H

#include <stdio.h>
#include <stdlib.h>

#include "kernels.h"

static const char *const kRowsKernelName[2] = {"mma.sync kernel", "wgmma kernel"};

/* 1 if kernel wg (0 mma.sync, 1 wgmma) now runs every T; 0 (with a
 * visible SKIP line, not a pass) where this device has no sm_90a code. */
static inline int rows_kernel_select(int wg, const char *test)
{
    setenv("DSQ_CUDA_ROWS_WG", wg ? "2" : "0", 1);
    if (wg && !dsq_cu_gemm_rows_wg(1)) {
        printf("  SKIP %s with the %s: the device does not run this build's sm_90a code\n", test,
               kRowsKernelName[1]);
        setenv("DSQ_CUDA_ROWS_WG", "0", 1);
        return 0;
    }
    printf("  %s: %s\n", test, kRowsKernelName[wg]);
    return 1;
}

/* back to the library's default choice */
static inline void rows_kernel_reset(void) { unsetenv("DSQ_CUDA_ROWS_WG"); }

#endif /* DSQ_TEST_ROWS_KERNEL_H */
