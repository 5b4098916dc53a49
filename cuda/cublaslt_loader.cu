/* cublaslt_loader.cu - open cuBLASLt with dlopen on first use.
 *
 * Linking libcublasLt.so directly would make the dynamic loader refuse to
 * load libdsqwen.so at all where the CUDA libraries are absent; opened here
 * on demand, their absence only means "no CUDA backend" (see
 * dsq_cuda_device_problem() in backend_out.cu).  The sonames tried follow the major
 * version of the toolkit we were compiled with, because the descriptor
 * layouts in cublasLt.h are only guaranteed within one major version. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "cublaslt_loader.h"
#include "dl_util.h"
#include "internal.h"

#define DSQ_STR2(x) #x
#define DSQ_STR(x) DSQ_STR2(x)
#define LT_SONAME "libcublasLt.so." DSQ_STR(CUBLAS_VER_MAJOR)

static pthread_once_t lt_once = PTHREAD_ONCE_INIT;
static dsq_cublaslt lt_table;
static const dsq_cublaslt *lt_loaded; /* &lt_table once complete, else NULL */
static char lt_problem[1024];         /* why lt_loaded is NULL; written once */

static void lt_load(void)
{
    /* The loader's usual search applies first: LD_LIBRARY_PATH, the
     * RUNPATH, the ld.so cache, the system directories.  The unversioned
     * name is the development symlink.  Last, the toolkit libdsqwen was
     * built against, for toolkits left out of the ld.so cache. */
    static const char *const names[] = { LT_SONAME, "libcublasLt.so",
#ifdef DSQ_CUDA_TOOLKIT_LIBDIR
                                         DSQ_CUDA_TOOLKIT_LIBDIR "/" LT_SONAME
#endif
    };
    void *h = dsq_dlopen_first(names, sizeof names / sizeof names[0], lt_problem, sizeof lt_problem);
    if (!h)
        return;
    int missing = 0;
#define LT_SYM(field, sym)                                                                             \
    do {                                                                                               \
        *(void **)&lt_table.field = dlsym(h, #sym);                                                    \
        if (!lt_table.field && !missing++)                                                             \
            snprintf(lt_problem, sizeof lt_problem, "%s lacks the symbol %s (cuBLASLt %d.x needed)",   \
                     LT_SONAME, #sym, (int)CUBLAS_VER_MAJOR);                                          \
    } while (0)
    LT_SYM(Create, cublasLtCreate);
    LT_SYM(Destroy, cublasLtDestroy);
    LT_SYM(GetStatusString, cublasLtGetStatusString);
    LT_SYM(GetVersion, cublasLtGetVersion);
    LT_SYM(MatmulDescInit_internal, cublasLtMatmulDescInit_internal);
    LT_SYM(MatmulDescSetAttribute, cublasLtMatmulDescSetAttribute);
    LT_SYM(MatrixLayoutInit_internal, cublasLtMatrixLayoutInit_internal);
    LT_SYM(MatmulPreferenceInit_internal, cublasLtMatmulPreferenceInit_internal);
    LT_SYM(MatmulPreferenceSetAttribute, cublasLtMatmulPreferenceSetAttribute);
    LT_SYM(MatmulAlgoGetHeuristic, cublasLtMatmulAlgoGetHeuristic);
    LT_SYM(Matmul, cublasLtMatmul);
    LT_SYM(MatmulAlgoCapGetAttribute, cublasLtMatmulAlgoCapGetAttribute);
    LT_SYM(MatmulAlgoConfigGetAttribute, cublasLtMatmulAlgoConfigGetAttribute);
    LT_SYM(MatmulAlgoConfigSetAttribute, cublasLtMatmulAlgoConfigSetAttribute);
    LT_SYM(MatmulAlgoCheck, cublasLtMatmulAlgoCheck);
#undef LT_SYM
    if (!missing && lt_table.GetVersion() / 10000 != CUBLAS_VER_MAJOR) {
        snprintf(lt_problem, sizeof lt_problem, "the cuBLASLt found is version %zu, libdsqwen needs %d.x",
                 lt_table.GetVersion(), (int)CUBLAS_VER_MAJOR);
        missing = 1;
    }
    if (missing) {
        dlclose(h);
        return;
    }
    lt_loaded = &lt_table;
}

extern "C" const dsq_cublaslt *dsq_cublaslt_get(void)
{
    pthread_once(&lt_once, lt_load);
    return lt_loaded;
}

extern "C" const char *dsq_cublaslt_problem(void)
{
    pthread_once(&lt_once, lt_load);
    return lt_loaded ? NULL : lt_problem;
}
