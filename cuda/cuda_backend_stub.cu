/* PLACEHOLDER until the CUDA backend lands (issue 3). */
#include "internal.h"
extern "C" int dsq_cuda_available(void) { return 0; }
static dsq_status ml(dsq_model *m, const dsq_model_params *p) { return dsq_fail(DSQ_ERR_UNSUPPORTED, "cuda backend not implemented yet"); }
static void mf(dsq_model *m) { (void)m; }
static dsq_status ci(dsq_ctx *c) { return dsq_fail(DSQ_ERR_UNSUPPORTED, "cuda backend not implemented yet"); }
static void cf(dsq_ctx *c) { (void)c; }
static dsq_status fw(dsq_ctx *c, const dsq_batch *b, float *l) { return dsq_fail(DSQ_ERR_UNSUPPORTED, "cuda backend not implemented yet"); }
extern "C" const dsq_backend_ops dsq_cuda_backend = { "cuda", DSQ_BACKEND_CUDA, ml, mf, ci, cf, fw, NULL };
