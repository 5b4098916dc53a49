/* PLACEHOLDER until the loader lands (issue 2). */
#include "internal.h"
dsq_status dsq_weights_bind(const dsq_st_set *st, const dsq_config *cfg, dsq_weights *w) { return dsq_fail(DSQ_ERR_UNSUPPORTED, "weights not implemented yet"); }
void dsq_weights_release(dsq_weights *w) { (void)w; }
