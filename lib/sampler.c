/* PLACEHOLDER until the sampler lands (issue 4). */
#include <string.h>
#include "internal.h"
dsq_sampler_params dsq_sampler_default_params(void) { dsq_sampler_params p; memset(&p, 0, sizeof p); p.struct_size = sizeof p; return p; }
dsq_status dsq_sampler_new(const dsq_sampler_params *params, dsq_sampler **out) { if (out) *out = NULL; return dsq_fail(DSQ_ERR_UNSUPPORTED, "sampler not implemented yet"); }
void dsq_sampler_free(dsq_sampler *s) { (void)s; }
dsq_status dsq_sampler_sample(dsq_sampler *s, const float *logits, int32_t n_vocab, int32_t *token_out) { return dsq_fail(DSQ_ERR_UNSUPPORTED, "sampler not implemented yet"); }
dsq_status dsq_sampler_accept(dsq_sampler *s, const int32_t *tokens, size_t n) { return dsq_fail(DSQ_ERR_UNSUPPORTED, "sampler not implemented yet"); }
void dsq_sampler_reset(dsq_sampler *s, uint64_t seed) { (void)s; }
