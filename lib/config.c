/* PLACEHOLDER until the loader lands (issue 2). */
#include "internal.h"
dsq_status dsq_config_parse(const char *json, size_t len, dsq_config *cfg) { return dsq_fail(DSQ_ERR_UNSUPPORTED, "config not implemented yet"); }
dsq_status dsq_config_load(const char *path, dsq_config *cfg) { return dsq_fail(DSQ_ERR_UNSUPPORTED, "config not implemented yet"); }
