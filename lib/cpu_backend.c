/* PLACEHOLDER until the CPU backend lands (issue 2). */
#include "internal.h"
static dsq_status ml(dsq_model *m, const dsq_model_params *p) { return dsq_fail(DSQ_ERR_UNSUPPORTED, "cpu backend not implemented yet"); }
static void mf(dsq_model *m) { (void)m; }
static dsq_status ci(dsq_ctx *c) { return dsq_fail(DSQ_ERR_UNSUPPORTED, "cpu backend not implemented yet"); }
static void cf(dsq_ctx *c) { (void)c; }
static dsq_status fw(dsq_ctx *c, const dsq_batch *b, float *l) { return dsq_fail(DSQ_ERR_UNSUPPORTED, "cpu backend not implemented yet"); }
const dsq_backend_ops dsq_cpu_backend = { "cpu", DSQ_BACKEND_CPU, ml, mf, ci, cf, fw, NULL };
