/* cublaslt_loader.h - cuBLASLt opened at run time (dlopen), so that one
 * libdsqwen.so built with CUDA still loads and runs on the CPU on machines
 * without the CUDA libraries.  The table is filled once per process
 * (pthread_once) and never unloaded; after that it is read-only and may be
 * used from any thread. */
#ifndef DSQ_CUDA_CUBLASLT_LOADER_H
#define DSQ_CUDA_CUBLASLT_LOADER_H

#include <cublasLt.h>

/* The cuBLASLt entry points libdsqwen uses.  The *Init functions of the
 * header are static inline wrappers around these *_internal symbols. */
typedef struct dsq_cublaslt {
    decltype(&cublasLtCreate) Create;
    decltype(&cublasLtDestroy) Destroy;
    decltype(&cublasLtGetStatusString) GetStatusString;
    decltype(&cublasLtGetVersion) GetVersion;
    decltype(&cublasLtMatmulDescInit_internal) MatmulDescInit_internal;
    decltype(&cublasLtMatmulDescSetAttribute) MatmulDescSetAttribute;
    decltype(&cublasLtMatrixLayoutInit_internal) MatrixLayoutInit_internal;
    decltype(&cublasLtMatmulPreferenceInit_internal) MatmulPreferenceInit_internal;
    decltype(&cublasLtMatmulPreferenceSetAttribute) MatmulPreferenceSetAttribute;
    decltype(&cublasLtMatmulAlgoGetHeuristic) MatmulAlgoGetHeuristic;
    decltype(&cublasLtMatmul) Matmul;
    /* GEMM tuning's split-K variants (gemm.cu) */
    decltype(&cublasLtMatmulAlgoCapGetAttribute) MatmulAlgoCapGetAttribute;
    decltype(&cublasLtMatmulAlgoConfigGetAttribute) MatmulAlgoConfigGetAttribute;
    decltype(&cublasLtMatmulAlgoConfigSetAttribute) MatmulAlgoConfigSetAttribute;
    decltype(&cublasLtMatmulAlgoCheck) MatmulAlgoCheck;
} dsq_cublaslt;

/* The loaded table, or NULL when cuBLASLt cannot be loaded; then
 * dsq_cublaslt_problem() (declared in internal.h) says why. */
extern "C" const dsq_cublaslt *dsq_cublaslt_get(void);

#endif
